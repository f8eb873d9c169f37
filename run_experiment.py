"""Replay the three lease scenarios with spawned processes, and write the evidence as JSON.

A scenario is data: a timeline of steps, each one actor's acquire, renew, check, write or
release at one tick.  The engine spawns a worker process per actor and gives every step an
Event of its own.  It sets one Event at a time; that step's worker performs the step on the
scenario's SQLite database and reports it on its Queue.  The engine releases the next step
only once the report is in and, after an actor's last step, its worker has exited with code
0.  The order comes from these handshakes alone; every wait is bounded; nothing sleeps.

    python3 run_experiment.py --check results.json --output reproduced.json
"""

import argparse
import contextlib
import enum
import json
import multiprocessing
import os
import queue
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from leases import (
    Lease,
    LeaseAuthority,
    LeaseHeld,
    LeaseLost,
    Outcome,
    Receiver,
    is_live,
)

if TYPE_CHECKING:  # annotations only: the spawn context makes the real objects
    from multiprocessing.process import BaseProcess
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Event as Released

__all__ = ["SCENARIOS", "Action", "ExperimentError", "Scenario", "Step", "main", "run_scenarios"]

RESOURCE = "quarterly-report"
DEFAULT_TIMEOUT = 60.0  # seconds: only bounds a hung step; no step waits for it to pass


# --- the model: steps and scenarios ---


class Action(str, enum.Enum):
    ACQUIRE = "acquire"  # ask the authority for a lease for `ttl` ticks
    RENEW = "renew"  # ask the authority to set the actor's lease to expire at `tick + ttl`
    WRITE = "write"  # send `value` to the receiver with the epoch of the actor's lease
    RELEASE = "release"  # give the lease back
    CHECK = "check"  # ask the authority whether the actor's lease is still live; drop it if not


@dataclass(frozen=True)
class Step:
    """One thing one actor does, at one tick of logical time."""

    actor: str
    action: Action
    tick: int
    ttl: int | None = None  # acquire and renew only
    value: str | None = None  # write only

    def __str__(self) -> str:
        return f"{self.actor} {self.action.value} at tick {self.tick}"


@dataclass(frozen=True)
class Scenario:
    """A named timeline, played one step at a time in this order, its ticks never going back.
    An actor's steps use the lease it last received."""

    name: str
    fenced: bool
    summary: str
    steps: tuple[Step, ...]

    @property
    def actors(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(step.actor for step in self.steps))


# A holds a lease until tick 10; B takes over at 10, the exact tick A's lease expires.
_TAKEOVER = (
    Step("A", Action.ACQUIRE, tick=0, ttl=10),
    Step("B", Action.ACQUIRE, tick=10, ttl=10),
)
_B_WRITES_THEN_A_LATE = (
    *_TAKEOVER,
    Step("B", Action.WRITE, tick=10, value="report by B"),
    Step("A", Action.WRITE, tick=11, value="report by A"),
)

SCENARIOS = (
    Scenario(
        name="unfenced_receiver",
        fenced=False,
        summary="A pauses holding epoch 1; B takes over with epoch 2 at A's expiry tick and "
        "writes; then A resumes late and writes with epoch 1. The receiver is unfenced.",
        steps=_B_WRITES_THEN_A_LATE,
    ),
    Scenario(
        name="fenced_receiver",
        fenced=True,
        summary="The same interleaving as unfenced_receiver, against a fenced receiver.",
        steps=_B_WRITES_THEN_A_LATE,
    ),
    Scenario(
        name="expiry_before_receiver_observation_gap",
        fenced=True,
        summary="B takes over with epoch 2 at A's expiry tick but pauses before writing; A "
        "resumes late and writes with epoch 1 to a fenced receiver that has not seen epoch 2; "
        "then B writes, then A retries the same write.",
        steps=(
            *_TAKEOVER,
            Step("A", Action.WRITE, tick=11, value="report by A"),
            Step("B", Action.WRITE, tick=12, value="report by B"),
            Step("A", Action.WRITE, tick=13, value="report by A"),
        ),
    ),
)


# --- one step, as a worker performs it ---


class Answer(str, enum.Enum):
    """What the authority, or the actor's own state, answered a step that is not a write."""

    GRANTED = "granted"  # acquire: a new lease, at the next epoch
    HELD = "held"  # acquire: refused, another lease is live (its epoch and expiry are given)
    RENEWED = "renewed"  # renew: the lease now expires at tick + ttl
    LIVE = "live"  # check: the actor's lease is the live one
    RELEASED = "released"  # release: given back
    LOST = "lost"  # renew, check or release: the lease is no longer the live one
    NO_LEASE = "no lease"  # the actor holds no lease, so the step is not sent at all


@dataclass(frozen=True)
class StepResult:
    """One step as the evidence records it: who did what at which tick, and the answer (an
    Answer, or the receiver's Outcome for a write).  Fields that do not apply are None:
    `expires_at` belongs to a lease's answer, `value` and the stored pair to a write's."""

    actor: str
    action: Action
    tick: int
    outcome: str
    epoch: int | None = None
    expires_at: int | None = None
    value: str | None = None
    stored_epoch: int | None = None
    stored_value: str | None = None

    @classmethod
    def of(cls, step: Step, outcome: str, epoch: int | None = None,
           expires_at: int | None = None) -> "StepResult":
        return cls(step.actor, step.action, step.tick, outcome, epoch, expires_at)

    def as_json(self) -> dict[str, Any]:
        """Every field present, null where it does not apply, action and outcome as text."""
        return {"actor": self.actor, "action": self.action.value, "tick": self.tick,
                "epoch": self.epoch, "expires_at": self.expires_at, "value": self.value,
                "outcome": getattr(self.outcome, "value", self.outcome),
                "stored_epoch": self.stored_epoch, "stored_value": self.stored_value}


def perform(step: Step, lease: Lease | None, authority: LeaseAuthority, receiver: Any,
            resource: str = RESOURCE) -> tuple[Lease | None, StepResult]:
    """Perform `step` for an actor holding `lease`: its lease afterwards, and the result.
    An actor knows only what it was told: a refused acquisition leaves its lease as it was; a
    lost renewal, a failed check or a release leaves it none; a write goes out with whatever
    lease it holds, expired or not.  Only a check asks the authority about the time."""
    if step.action is Action.ACQUIRE:
        assert step.ttl is not None, "acquire needs a ttl"
        try:
            lease = authority.acquire(resource, step.actor, now=step.tick, ttl=step.ttl)
        except LeaseHeld as held:
            return lease, StepResult.of(step, Answer.HELD, held.lease.epoch, held.lease.expires_at)
        return lease, StepResult.of(step, Answer.GRANTED, lease.epoch, lease.expires_at)
    if lease is None:  # it never got one, lost it, or gave it back
        return None, StepResult.of(step, Answer.NO_LEASE)
    if step.action is Action.WRITE:
        return lease, write(step, lease, receiver)
    if step.action is Action.CHECK:
        current = authority.current(lease.resource, now=step.tick)
        if current is None or (current.epoch, current.holder) != (lease.epoch, lease.holder):
            return None, StepResult.of(step, Answer.LOST, lease.epoch)
        return lease, StepResult.of(step, Answer.LIVE, lease.epoch, current.expires_at)
    try:
        if step.action is Action.RENEW:
            assert step.ttl is not None, "renew needs a ttl"
            lease = authority.renew(lease, now=step.tick, ttl=step.ttl)
            return lease, StepResult.of(step, Answer.RENEWED, lease.epoch, lease.expires_at)
        authority.release(lease)
        return None, StepResult.of(step, Answer.RELEASED, lease.epoch)
    except LeaseLost:
        return None, StepResult.of(step, Answer.LOST, lease.epoch)


def write(step: Step, lease: Lease, receiver: Any) -> StepResult:
    """Send a write `step`'s value with `lease`'s resource and epoch to `receiver` (a Receiver,
    or any object whose write(resource, epoch, value) answers as one does)."""
    assert step.value is not None, "a write needs a value"
    result = receiver.write(lease.resource, lease.epoch, step.value)
    return StepResult(step.actor, step.action, step.tick, result.outcome, result.epoch, None,
                      result.value, result.stored_epoch, result.stored_value)


# --- the judge: each class of write written once ---


class Write(NamedTuple):
    """A write as the judge sees it when it is answered: the event, and what came before."""

    event: StepResult
    newest: int  # the highest epoch the authority had granted
    stored: int | None  # the epoch the receiver had last applied, or None: nothing yet
    expires_at: int  # the expiry of the writer's lease, as the authority last answered it

    @property
    def applied(self) -> bool:
        return self.event.outcome == Outcome.APPLIED

    @property
    def superseded(self) -> bool:  # a higher epoch has been granted
        assert self.event.epoch is not None
        return self.event.epoch < self.newest

    @property
    def late(self) -> bool:  # the writer's lease had expired
        return not is_live(self.expires_at, now=self.event.tick)

    @property
    def below_stored(self) -> bool:  # the receiver had applied a higher epoch
        assert self.event.epoch is not None
        return self.stored is not None and self.event.epoch < self.stored


@dataclass(frozen=True)
class Class:
    """A class of write: its name, what it is in README's words, the verdict field of
    results.json that counts it, and its rule."""

    name: str
    says: str
    field: str
    rule: Callable[[Write], bool]


CLASSES = (
    Class("lost update", "a lower epoch applied over a higher one",
          "newer_write_overwritten_by_older_epoch", lambda w: w.applied and w.below_stored),
    Class("stale refused", "a lower epoch refused", "stale_writes_refused",
          lambda w: w.event.outcome == Outcome.STALE),
    Class("superseded applied", "applied below the newest grant",
          "write_with_superseded_epoch_applied", lambda w: w.applied and w.superseded),
    Class("late applied", "applied at or after its lease's expiry",
          "write_after_lease_expiry_applied", lambda w: w.applied and w.late),
    Class("conflict", "the same epoch, another value: refused",
          "conflicting_writes_refused", lambda w: w.event.outcome == Outcome.CONFLICT),
)
_COUNTED = ("stale_writes_refused", "conflicting_writes_refused")  # the rest: whether at all


def judge(events: Sequence[StepResult]) -> dict[str, Any]:
    """The verdict on a run, from its events alone: what went wrong, if anything, and who won.
    `because` holds, for each field, the indices of the events that made it what it is, so
    that every field can be checked by hand.  An applied write by an actor never granted a
    lease, or a lease without its epoch or expiry, is ValueError."""
    fields = [cls.field for cls in CLASSES]
    because: dict[str, list[int]] = {field: [] for field in (*fields, "final_value_written_by")}
    expires_at: dict[str, int] = {}  # each actor's latest lease
    newest, stored = 0, None  # the highest epoch granted; the epoch last applied
    for index, event in enumerate(events):
        if event.outcome in (Answer.GRANTED, Answer.RENEWED):
            if event.epoch is None or event.expires_at is None:
                raise ValueError(f"event {index} {event!r}: a lease without its epoch or expiry")
            expires_at[event.actor] = event.expires_at
            newest = max(newest, event.epoch)
        elif event.action is Action.WRITE and event.outcome != Answer.NO_LEASE:
            if event.actor not in expires_at:
                raise ValueError(f"event {index} {event!r}: a write by an actor with no lease")
            answered = Write(event, newest, stored, expires_at[event.actor])
            for cls in CLASSES:
                if cls.rule(answered):
                    because[cls.field].append(index)
            if answered.applied:
                stored, because["final_value_written_by"] = event.epoch, [index]
    final = because["final_value_written_by"]
    return {
        **{field: len(because[field]) if field in _COUNTED else bool(because[field])
           for field in fields},
        "final_value_written_by": events[final[0]].actor if final else None,
        "because": because,
    }


# --- the engine: each scenario played by spawned workers, step by step ---


class ExperimentError(Exception):
    """A scenario failed or hung; `scenario` and `step` say where, `problem` what."""

    def __init__(self, scenario: str, step: str, problem: str) -> None:
        super().__init__(f"scenario {scenario!r}, {step}: {problem}")
        self.scenario = scenario
        self.step = step
        self.problem = problem


class _Play(NamedTuple):
    """A scenario under way: its database, one Event per step, each actor's worker and Queue."""

    scenario: Scenario
    db_path: str
    released: list["Released"]
    workers: dict[str, "BaseProcess"]
    reports: dict[str, "Queue[tuple[StepResult | None, str | None]]"]


def run_scenarios(scenarios: Sequence[Scenario] = SCENARIOS, *,
                  timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
    """Play `scenarios` one after another and return the evidence document.  Every worker is
    started first, so that their interpreters start together.  However this ends (an error,
    Ctrl-C, SIGTERM), every worker is stopped and the temporary folder removed, and a Ctrl-C
    meanwhile waits until both are done."""
    context = multiprocessing.get_context("spawn")
    bound = timeout * (sum(len(s.steps) for s in scenarios) + 1)  # a worker's longest wait
    workers: list[BaseProcess] = []
    folder = None
    try:
        with _ctrl_c_held():  # made and named together: the cleanup below finds it
            folder = tempfile.mkdtemp(prefix="leases-experiment-")
        plays = [_start(scenario, os.path.join(folder, f"{number}.sqlite3"), context, bound,
                        workers) for number, scenario in enumerate(scenarios)]
        return {"scenarios": [_play(play, timeout) for play in plays]}
    finally:
        with _ctrl_c_held():
            for worker in workers:
                if worker.is_alive():
                    worker.kill()
                worker.join(DEFAULT_TIMEOUT)
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)


def _play(play: _Play, timeout: float) -> dict[str, Any]:
    """The handshake.  For each step in turn: set its Event, take its worker's report, and
    after the worker's last step wait for it to exit with code 0.  Only then the next step."""
    events = []
    for index, step in enumerate(play.scenario.steps):
        worker = play.workers[step.actor]
        play.released[index].set()
        event, problem = _report(play.reports[step.actor], worker, timeout)
        if event and all(later.actor != step.actor for later in play.scenario.steps[index + 1:]):
            worker.join(timeout)
            if worker.exitcode != 0:
                problem = f"did not exit with code 0 after its last step: {worker.exitcode}"
        if event is None or problem is not None:
            raise ExperimentError(play.scenario.name, f"step {index} ({step})",
                                  f"worker {step.actor}: {problem}")
        events.append(event)
    return _record(play, events)


def _report(reports: "Queue[tuple[StepResult | None, str | None]]", worker: "BaseProcess",
            timeout: float) -> tuple[StepResult | None, str | None]:
    """The worker's report of its step, or why none came within `timeout`.  The wait is cut
    into slices of 0.1 s to see a worker that died without a word."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return reports.get(timeout=0.1)
        except queue.Empty:
            if not worker.is_alive() and reports.empty():
                return None, f"ended without a report, exit code {worker.exitcode}"
            if time.monotonic() > deadline:
                return None, f"no report within {timeout:g} s"


def _start(scenario: Scenario, db_path: str, context: Any, bound: float,
           workers: list["BaseProcess"]) -> _Play:
    """Start a worker per actor, each waiting for its first step's Event."""
    released = [context.Event() for _ in scenario.steps]
    play = _Play(scenario, db_path, released, {}, {})
    for actor in scenario.actors:
        script = [(i, step) for i, step in enumerate(scenario.steps) if step.actor == actor]
        play.reports[actor] = context.Queue()
        worker = context.Process(target=_work, name=f"{scenario.name}:{actor}", args=(
            db_path, scenario.fenced, script, released, play.reports[actor], bound))
        # Started with Ctrl-C held, which it inherits, so none lands while it imports; then it
        # ignores Ctrl-C.  (The Events above started the resource tracker, which unblocks it.)
        with _ctrl_c_held():
            worker.start()
            workers.append(worker)
        play.workers[actor] = worker
    return play


def _work(db_path: str, fenced: bool, script: list[tuple[int, Step]],
          released: list["Released"], reports: "Queue[tuple[StepResult | None, str | None]]",
          bound: float) -> None:
    """A worker: perform each of its steps once its Event is set, and report each.  It gives
    up when `bound` passes, or at once once the engine is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the engine's: it stops us
    engine = multiprocessing.parent_process()
    try:
        with LeaseAuthority(db_path) as authority, Receiver(db_path, fenced=fenced) as receiver:
            lease = None
            for index, step in script:
                deadline = time.monotonic() + bound
                while not released[index].wait(0.1):
                    if time.monotonic() > deadline or (engine and not engine.is_alive()):
                        raise TimeoutError(f"step {index} was not released in {bound:g} s")
                lease, event = perform(step, lease, authority, receiver)
                reports.put((event, None))
    except Exception as exc:  # noqa: BLE001 - whatever it was, the engine must hear of it
        reports.put((None, f"{type(exc).__name__}: {exc}"))
    # The engine waits for this exit: skip the interpreter's teardown, longer than a step.
    reports.close()
    reports.join_thread()
    os._exit(0)


@contextlib.contextmanager
def _ctrl_c_held() -> Iterator[None]:
    """A Ctrl-C (or SIGTERM) during the block waits until the block ends, then raises."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _record(play: _Play, events: list[StepResult]) -> dict[str, Any]:
    """A scenario's evidence: its events, the receiver's decisions and what it stores, the
    lease live at the last tick, and the verdict."""
    scenario = play.scenario
    with Receiver(play.db_path, fenced=scenario.fenced) as receiver:
        decisions = receiver.decisions(RESOURCE)
        final = receiver.read(RESOURCE)
    with LeaseAuthority(play.db_path) as authority:
        lease = authority.current(RESOURCE, now=scenario.steps[-1].tick)
    return {
        "name": scenario.name,
        "receiver": "fenced" if scenario.fenced else "unfenced",
        "summary": scenario.summary,
        "resource": RESOURCE,
        "events": [event.as_json() for event in events],
        "decisions": [{"outcome": d.outcome.value, "epoch": d.epoch, "value": d.value,
                       "stored_epoch": d.stored_epoch, "stored_value": d.stored_value}
                      for d in decisions],
        "final": None if final is None else {"epoch": final[0], "value": final[1]},
        "lease_at_end": None if lease is None else {
            "holder": lease.holder, "epoch": lease.epoch, "expires_at": lease.expires_at},
        "verdict": judge(events),
    }


# --- the evidence: canonical JSON, a timeline to read, and the differences ---


def canonical_json(document: object) -> str:
    return json.dumps(document, sort_keys=True, indent=2, ensure_ascii=True) + "\n"


def timeline(record: dict[str, Any]) -> str:
    """A few lines to read at a glance: who did what at which tick, and the verdict."""
    lines = [f"{record['name']} ({record['receiver']} receiver)"]
    for event in record["events"]:
        if event["stored_epoch"] is not None:
            detail = (f"{event['value']!r} -> receiver holds epoch {event['stored_epoch']}, "
                      f"{event['stored_value']!r}")
        elif event["outcome"] == "held":
            detail = f"by epoch {event['epoch']}, live until tick {event['expires_at']}"
        elif event["expires_at"] is not None:
            detail = f"lease until tick {event['expires_at']}"
        else:
            detail = ""
        epoch = f"epoch {event['epoch']}" if event["epoch"] and event["outcome"] != "held" else ""
        lines.append(f"  tick {event['tick']:>2}  {event['actor']}  {event['action']:<7}  "
                     f"{epoch:<8}  {event['outcome']:<8}  {detail}".rstrip())
    verdict = record["verdict"]
    lines.append(f"  final value written by {verdict['final_value_written_by']}; stale writes "
                 f"refused: {verdict['stale_writes_refused']}, conflicting: "
                 f"{verdict['conflicting_writes_refused']}")
    lines.extend(f"  {cls.name}: {cls.says} ({cls.field})" for cls in CLASSES
                 if verdict[cls.field] is True)
    return "\n".join(lines)


_MISSING = object()


def differences(expected: object, actual: object,
                path: str = "$") -> Iterator[tuple[str, Any, Any]]:
    """Yield (JSON path, expected, actual) wherever two parsed JSON documents differ."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(expected.keys() | actual.keys()):
            yield from differences(expected.get(key, _MISSING), actual.get(key, _MISSING),
                                   f"{path}.{key}")
    elif isinstance(expected, list) and isinstance(actual, list):
        for i in range(max(len(expected), len(actual))):
            yield from differences(expected[i] if i < len(expected) else _MISSING,
                                   actual[i] if i < len(actual) else _MISSING, f"{path}[{i}]")
    elif type(expected) is not type(actual) or expected != actual:  # in JSON, true is not 1
        yield path, expected, actual


def _verdicts_first(difference: tuple[str, Any, Any]) -> int:
    """What a run concluded comes first in the report, then how it got there."""
    path = difference[0]
    return 0 if any(f".{key}" in path for key in ("verdict", "final", "lease_at_end")) else 1


def _shown(value: object, limit: int = 70) -> str:
    text = "(missing)" if value is _MISSING else json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- the command line ---

EXIT_OK, EXIT_DIFFERENT, EXIT_USAGE, EXIT_FAILED = 0, 1, 2, 3
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143  # as a shell reports SIGINT and SIGTERM
_SHOWN = 10  # differences listed at most

_EXIT_CODES = f"""exit codes:
  0    the run reproduced EXPECTED, or there was nothing to compare
  1    the run differs from EXPECTED: the first {_SHOWN} differing JSON paths, verdicts first
       (--output is still written)
  2    bad arguments, a file that cannot be read or written (--output must be a regular
       file, or none yet), or a machine that cannot run it (processes, files): one line
  3    a scenario failed or hung: the scenario and the step are named
  130  stopped by Ctrl-C: every worker stopped, the temporary folder removed, --output
       untouched (once the run is over, Ctrl-C is ignored: its result stands)
  143  stopped by SIGTERM, as by Ctrl-C

examples:
  python3 run_experiment.py --check results.json --output reproduced.json
  python3 run_experiment.py --output results.json   # regenerate the evidence
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, not the usage too
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns its exit code."""
    parser = _Parser(
        prog="run_experiment.py", epilog=_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Replay the three lease scenarios (unfenced receiver, fenced receiver, and "
        "the gap between a lease's expiry and the receiver's observation of a newer epoch) with "
        "spawned processes, and write the evidence as canonical JSON. A timeline to read goes "
        "to stderr.")
    parser.add_argument("--check", metavar="EXPECTED", help="compare the run with this "
                        "evidence file; key order and whitespace do not matter")
    parser.add_argument("--output", metavar="PATH", help="write the evidence to this file, "
                        "whole or not at all (default: stdout, unless --check is given)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminated)
    try:
        expected = None if args.check is None else _read_json(args.check)
        output = None if args.output is None else _output_file(args.output)
        document = run_scenarios()
        # The run is over: its result stands, so this process ignores Ctrl-C from now on.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return _conclude(document, expected, args.check, output)
    except (_Unusable, OSError, MemoryError) as exc:  # the last two: no process, file or memory
        print(f"run_experiment.py: error: {_why(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except ExperimentError as exc:
        print(f"run_experiment.py: failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt as stop:
        by = "SIGTERM" if stop.args == (signal.SIGTERM,) else "Ctrl-C"
        print(f"run_experiment.py: stopped by {by}; every worker stopped, the temporary folder "
              "removed, --output untouched", file=sys.stderr)
        return EXIT_TERMINATED if by == "SIGTERM" else EXIT_INTERRUPTED


def _terminated(signum: int, _: object) -> None:  # SIGTERM: stopped as by Ctrl-C
    raise KeyboardInterrupt(signum)


def _conclude(document: dict[str, Any], expected: object, check: str | None,
              output: str | None) -> int:
    """Write the evidence, show each scenario's timeline, and compare: the exit code.  A
    stdout closed early (`| head`) ends the saying quietly, not the exit code."""
    text, scenarios = canonical_json(document), document["scenarios"]
    if output is not None:
        _write_whole(output, text)
    for record in scenarios:
        print(timeline(record), file=sys.stderr)
    found = sorted(differences(expected, json.loads(text)), key=_verdicts_first) if check else []
    try:
        if check is None and output is None:
            sys.stdout.write(text)
        elif check is not None and not found:
            print(f"reproduced: this run matches {check!r} ({len(scenarios)} scenarios)")
        elif found:
            print(f"differs: this run does not match {check!r} at {len(found)} JSON path(s):")
            for path, want, got in found[:_SHOWN]:
                print(f"  {path}: expected {_shown(want)}, got {_shown(got)}")
            if len(found) > _SHOWN:
                print(f"  ... and {len(found) - _SHOWN} more")
        sys.stdout.flush()
    except BrokenPipeError:  # and none at exit, when Python flushes stdout once more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_DIFFERENT if found else EXIT_OK


class _Unusable(Exception):
    """A file that cannot be read or written: exit 2, in one line."""


def _why(exc: Exception) -> str:  # "No such file or directory", "embedded null byte"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def _read_json(path: str, most: int = 2**24) -> object:
    try:
        with open(path, "rb") as file:
            data = file.read(most)  # the evidence is a few kilobytes; /dev/zero never ends
    except (OSError, ValueError) as exc:
        raise _Unusable(f"cannot read {path!r}: {_why(exc)}") from None
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, nested too deep
        raise _Unusable(f"{path!r} is not JSON: {exc}") from None


def _output_file(path: str) -> str:
    """The file --output names, through symbolic links, checked before the run: a regular
    file or none yet, in a folder this user can write to."""
    try:
        target = os.path.realpath(path)
    except ValueError as exc:  # a NUL byte
        raise _Unusable(f"cannot write {path!r}: {exc}") from None
    if os.path.exists(target) and not os.path.isfile(target):
        raise _Unusable(f"cannot write {path!r}: not a regular file")
    folder = os.path.dirname(target)
    if not (os.path.isdir(folder) and os.access(folder, os.W_OK)):
        raise _Unusable(f"cannot write {path!r}: {folder!r} is not a folder this user can "
                        "write to")
    return target


def _write_whole(path: str, text: str) -> None:
    """Write `text` to a new file beside `path`, then rename it over `path` in one step."""
    staged = os.path.join(os.path.dirname(path), f".run_experiment.{os.getpid()}.tmp")
    try:
        with open(staged, "x", encoding="ascii") as file:
            file.write(text)
        os.replace(staged, path)
    except BaseException as exc:
        with contextlib.suppress(OSError, ValueError):
            os.unlink(staged)
        if isinstance(exc, (OSError, ValueError)):
            raise _Unusable(f"cannot write {path!r}: {_why(exc)}") from None
        raise


if __name__ == "__main__":
    sys.exit(main())
