"""Replay the lease scenarios with spawned processes, and write the evidence as canonical JSON.

A scenario is data: a timeline of steps, each saying which worker acquires, renews, writes or
releases at which tick.  The engine spawns one worker process per actor and gives every step
an Event of its own.  A worker waits on its next step's Event, performs that one step against
the scenario's SQLite database, and puts its report on the scenario's Queue.  The engine sets
one Event at a time and waits for that step's report (and, after a worker's last step, for the
worker to exit) before it sets the next, so the order of events comes from these handshakes
alone, never from timing.  Every wait is bounded; nothing sleeps.

`--explore` plays every schedule of a small configuration against the real code instead: see
the section "exploring every schedule" below.
"""

import contextlib
import enum
import json
import multiprocessing
import os
import queue
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from leases import Lease, LeaseAuthority, LeaseError, LeaseHeld, LeaseLost, Receiver

if TYPE_CHECKING:  # only for annotations: the spawn context makes the real objects
    import argparse
    from multiprocessing.process import BaseProcess
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Event

__all__ = [
    "DEFAULT_TIMEOUT",
    "EXIT_CODES",
    "SCENARIOS",
    "Action",
    "ExperimentError",
    "Scenario",
    "Step",
    "canonical_json",
    "differences",
    "judge",
    "main",
    "run_scenarios",
    "timeline",
]

RESOURCE = "quarterly-report"
# Only bounds a hung step; no step waits for it to pass.
DEFAULT_TIMEOUT = 60.0
MAX_TIMEOUT = 1_000_000.0  # a bound that every wait of the platform's can take


# --- the model: steps and scenarios ---


class Action(str, enum.Enum):
    ACQUIRE = "acquire"  # ask the authority for a lease for `ttl` ticks
    RENEW = "renew"  # ask the authority to extend the actor's lease to `tick + ttl`
    WRITE = "write"  # send `value` to the receiver with the epoch of the actor's lease
    RELEASE = "release"  # give the lease back


@dataclass(frozen=True)
class Step:
    """One thing one actor does, at one tick of logical time."""

    actor: str
    action: Action
    tick: int
    ttl: int | None = None  # acquire and renew only
    value: str | None = None  # write only

    def __post_init__(self) -> None:
        if not isinstance(self.action, Action):
            raise TypeError(f"step {self!r}: action must be an Action")
        wants_ttl = self.action in (Action.ACQUIRE, Action.RENEW)
        if not isinstance(self.actor, str) or not self.actor:
            problem = "actor must be a non-empty str"
        elif not _is_tick(self.tick):
            problem = "tick must be an int >= 0"
        elif wants_ttl != (_is_tick(self.ttl) and self.ttl != 0):
            problem = f"{'a' if wants_ttl else 'no'} ttl (an int >= 1) is needed"
        elif (self.action is Action.WRITE) != isinstance(self.value, str):
            problem = "a write needs a value (a str); nothing else takes one"
        else:
            return
        raise ValueError(f"step {self!r}: {problem}")

    def __str__(self) -> str:
        return f"{self.actor} {self.action.value} at tick {self.tick}"


def _is_tick(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True)
class Scenario:
    """A named timeline: the engine releases its steps one at a time, in this order.

    It is checked when it is built: ticks never go back, and each actor starts by acquiring,
    since every later step of its own uses the lease it last received.
    """

    name: str
    fenced: bool
    summary: str
    steps: tuple[Step, ...]

    def __post_init__(self) -> None:
        where = f"scenario {self.name!r}"
        if not isinstance(self.name, str) or not isinstance(self.summary, str):
            raise TypeError(f"{where}: name and summary must be str")
        if not isinstance(self.fenced, bool):
            raise TypeError(f"{where}: fenced must be a bool, got {self.fenced!r}")
        if not isinstance(self.steps, tuple) or not all(isinstance(s, Step) for s in self.steps):
            raise TypeError(f"{where}: steps must be a tuple of Step, got {self.steps!r}")
        if not self.name or not self.steps:
            raise ValueError(f"{where}: name and steps must not be empty")
        for index, step in enumerate(self.steps):
            if index and step.tick < self.steps[index - 1].tick:
                problem = f"tick {step.tick} comes after tick {self.steps[index - 1].tick}"
            elif step.action is not Action.ACQUIRE and not any(
                earlier.actor == step.actor and earlier.action is Action.ACQUIRE
                for earlier in self.steps[:index]
            ):
                problem = f"{step.actor} has not acquired yet"
            else:
                continue
            raise ValueError(f"{where}, step {index} ({step}): {problem}")

    @property
    def actors(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(step.actor for step in self.steps))


# A holds a lease from tick 0 to tick 10; B takes over at tick 10, the exact tick A's lease
# expires.  A then resumes late, still believing it holds the lease.
_TAKEOVER = (
    Step("A", Action.ACQUIRE, tick=0, ttl=10),
    Step("B", Action.ACQUIRE, tick=10, ttl=10),
)
_A_VALUE = "report by A"
_B_VALUE = "report by B"
_B_WRITES_THEN_A_LATE = (
    *_TAKEOVER,
    Step("B", Action.WRITE, tick=10, value=_B_VALUE),
    Step("A", Action.WRITE, tick=11, value=_A_VALUE),
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
            Step("A", Action.WRITE, tick=11, value=_A_VALUE),
            Step("B", Action.WRITE, tick=12, value=_B_VALUE),
            Step("A", Action.WRITE, tick=13, value=_A_VALUE),
        ),
    ),
)


# --- one step, as the engine's workers and the explorer perform it ---


def _perform(
    step: Step, lease: Lease | None, authority: LeaseAuthority, receiver: Receiver
) -> tuple[Lease | None, dict[str, Any]]:
    """Perform `step` for an actor holding `lease`; its lease afterwards, and the event.

    An actor knows only what it was told: a refused acquisition leaves its lease as it was, a
    lost renewal or a release leaves it none, and a write goes out with whatever lease it
    holds, expired or not, since nothing in the actor checks the time.
    """
    happened: dict[str, Any] = {}
    if step.action is Action.ACQUIRE:
        assert step.ttl is not None  # Step checked it
        try:
            got = authority.acquire(RESOURCE, step.actor, now=step.tick, ttl=step.ttl)
            lease, happened = got, {**_lease_json(got), "outcome": "granted"}
        except LeaseHeld as held:
            happened = {**_lease_json(held.lease), "outcome": "held"}
    elif lease is None:
        happened = {"outcome": "no lease"}  # it never got one, lost it, or gave it back
    elif step.action is Action.WRITE:
        return lease, _write(step, lease, receiver)
    else:
        try:
            if step.action is Action.RENEW:
                assert step.ttl is not None  # Step checked it
                lease = authority.renew(lease, now=step.tick, ttl=step.ttl)
                happened = {**_lease_json(lease), "outcome": "renewed"}
            else:
                authority.release(lease)
                happened, lease = {"epoch": lease.epoch, "outcome": "released"}, None
        except LeaseLost as lost:
            happened, lease = {"epoch": lost.lease.epoch, "outcome": "lost"}, None
    return lease, _event(step, happened)


def _write(step: Step, lease: Lease, receiver: Receiver) -> dict[str, Any]:
    """Send the value of a write `step` to `receiver`, with the epoch of `lease`."""
    assert step.value is not None  # Step checked it
    result = receiver.write(RESOURCE, lease.epoch, step.value)
    return _event(step, {
        "epoch": result.epoch,
        "value": result.value,
        "outcome": result.outcome.value,
        "stored_epoch": result.stored_epoch,
        "stored_value": result.stored_value,
    })


def _event(step: Step, happened: dict[str, Any]) -> dict[str, Any]:
    """One step as the evidence records it: every field present, null where it does not apply."""
    fields = ("epoch", "expires_at", "value", "outcome", "stored_epoch", "stored_value")
    return {
        "actor": step.actor,
        "action": step.action.value,
        "tick": step.tick,
        **{field: happened.get(field) for field in fields},
    }


def _lease_json(lease: Lease) -> dict[str, Any]:
    return {"holder": lease.holder, "epoch": lease.epoch, "expires_at": lease.expires_at}


def judge(events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The verdict on a run, from its events alone: what went wrong, if anything, and who won.

    `because` holds, for each field, the indices (into `events`) of the events that made it
    what it is, so that every field can be checked against the events by hand.  An applied
    write whose actor was never granted a lease is malformed: ValueError names it.
    """
    because: dict[str, list[int]] = {
        "write_with_superseded_epoch_applied": [],  # applied below the newest granted epoch
        "write_after_lease_expiry_applied": [],  # applied at or after its writer's expiry tick
        "newer_write_overwritten_by_older_epoch": [],  # applied below the stored epoch
        "stale_writes_refused": [],
        "conflicting_writes_refused": [],
        "final_value_written_by": [],  # the applied write that left the final value stored
    }
    refused = {"stale": "stale_writes_refused", "conflict": "conflicting_writes_refused"}
    expires_at: dict[str, int] = {}  # each actor's latest lease
    newest_epoch = 0  # the highest epoch the authority has granted so far
    stored_epoch = None  # what the receiver held before the write at hand
    for index, event in enumerate(events):
        if event["outcome"] in ("granted", "renewed"):
            expires_at[event["actor"]] = event["expires_at"]
            newest_epoch = max(newest_epoch, event["epoch"])
        if event["action"] != Action.WRITE.value or event["outcome"] == "no lease":
            continue
        if event["outcome"] == "applied":
            if event["actor"] not in expires_at:
                raise ValueError(f"event {index} {event!r}: a write by an actor with no lease")
            if event["epoch"] < newest_epoch:
                because["write_with_superseded_epoch_applied"].append(index)
            if event["tick"] >= expires_at[event["actor"]]:
                because["write_after_lease_expiry_applied"].append(index)
            if stored_epoch is not None and event["epoch"] < stored_epoch:
                because["newer_write_overwritten_by_older_epoch"].append(index)
            # Only an applied write changes what is stored, so the latest one left it there.
            because["final_value_written_by"] = [index]
        elif event["outcome"] in refused:
            because[refused[event["outcome"]]].append(index)
        stored_epoch = event["stored_epoch"]
    final = because["final_value_written_by"]
    return {
        **{field: bool(because[field]) for field in list(because)[:3]},
        **{field: len(because[field]) for field in refused.values()},
        "final_value_written_by": events[final[0]]["actor"] if final else None,
        "because": because,
    }


class ExperimentError(Exception):
    """A scenario failed or hung; `scenario` and `step` say where."""

    def __init__(self, scenario: str, step: str, problem: str) -> None:
        super().__init__(f"scenario {scenario!r}, {step}: {problem}")
        self.scenario = scenario
        self.step = step
        self.problem = problem


# --- the worker: a child process, told everything by its arguments ---


def _worker(
    db_path: str,
    fenced: bool,
    script: Sequence[tuple[int, Step]],
    released: Sequence["Event"],
    reports: "Queue[tuple[int, dict[str, Any] | None, str | None]]",
    backstop: float,
) -> None:
    """Perform each (index, step) of `script` once `released[index]` is set; report each.

    A report is (index, event, None), or (index, None, what went wrong): an arbitrary
    exception may not survive pickling.  `backstop` bounds each wait only in case the engine
    is gone.  The worker owns nothing and removes nothing: the engine owns the folder.
    """
    # Stopping is the engine's: it kills its workers itself, so that Ctrl-C, sent to the whole
    # process group, ends the run once and prints one line.  The engine started this process
    # with the stop signals held; a pending one is dropped here, but SIGTERM stays fatal.
    for number in _STOP_SIGNALS:
        if number != signal.SIGTERM:
            signal.signal(number, signal.SIG_IGN)
    if _MASKABLE:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    index = script[0][0]
    try:
        with LeaseAuthority(db_path) as authority, Receiver(db_path, fenced=fenced) as receiver:
            lease = None
            for index, step in script:
                if not released[index].wait(backstop):
                    raise TimeoutError(f"not released within {backstop:g} s")
                lease, event = _perform(step, lease, authority, receiver)
                reports.put((index, event, None))
    except Exception as exc:  # noqa: BLE001 - whatever it was, the engine must hear of it
        reports.put((index, None, f"{type(exc).__name__}: {exc}"))
        sys.exit(1)


# --- the engine ---


@dataclass(frozen=True)
class _Play:
    """A scenario ready to play: its database, one Event per step, its workers, their Queue."""

    scenario: Scenario
    db_path: str
    released: list["Event"]
    reports: "Queue[tuple[int, dict[str, Any] | None, str | None]]"
    workers: dict[str, "BaseProcess"]


def run_scenarios(
    scenarios: Sequence[Scenario] = SCENARIOS, *, timeout: float = DEFAULT_TIMEOUT
) -> dict[str, Any]:
    """Play `scenarios`, one after another, and return the evidence document.

    Every worker of every scenario is started first, so that their interpreters start
    together.  Every worker has ended and every scenario's folder is gone before this returns
    or raises: when a scenario fails (ExperimentError), and when the run is interrupted, by
    KeyboardInterrupt or any other exception, wherever the wait happens to be.
    """
    _check_timeout(timeout)
    if isinstance(scenarios, (str, bytes)) or not all(isinstance(s, Scenario) for s in scenarios):
        raise TypeError(f"scenarios must be a sequence of Scenario, got {scenarios!r}")
    names = [scenario.name for scenario in scenarios]
    if not names or len(set(names)) != len(names):
        raise ValueError(f"scenarios must be a non-empty sequence with distinct names: {names!r}")
    backstop = min(timeout * (sum(len(s.steps) + 1 for s in scenarios) + 1), MAX_TIMEOUT)
    context = multiprocessing.get_context("spawn")
    with _CleanUp() as cleanup:
        plays = []  # kept to the end: a worker still starting up needs its Events to exist
        for scenario in scenarios:
            plays.append(_start(scenario, context, backstop, cleanup))
        return {"scenarios": [_play(play, timeout) for play in plays]}


class _CleanUp(contextlib.ExitStack):
    """An ExitStack that runs its callbacks with the stop signals held.

    A stop signal sent meanwhile cannot cut the clean-up short: it arrives once all is clean.
    """

    def __exit__(self, *exc_info: Any) -> None:  # None: it never swallows an exception
        with _held():
            super().__exit__(*exc_info)


def _start(
    scenario: Scenario,
    context: multiprocessing.context.SpawnContext,
    backstop: float,
    cleanup: _CleanUp,
) -> _Play:
    """Make the scenario's folder and database, and start its workers, waiting for step 0."""
    # Everything is made with the stop signals held and its clean-up registered before they
    # are let through, so that a stop at any moment leaves nothing behind.
    with _held():
        try:
            folder = tempfile.mkdtemp(prefix="leases-experiment-")
            cleanup.callback(shutil.rmtree, folder, ignore_errors=True)
            db_path = os.path.join(folder, "scenario.sqlite3")
            with LeaseAuthority(db_path), Receiver(db_path):  # the workers only open it
                pass
        except (LeaseError, OSError) as exc:
            raise ExperimentError(scenario.name, "start", str(exc)) from exc
        released = [context.Event() for _ in scenario.steps]
        reports: Queue[tuple[int, dict[str, Any] | None, str | None]] = context.Queue()
    workers: dict[str, BaseProcess] = {}
    for actor in scenario.actors:
        script = [(i, step) for i, step in enumerate(scenario.steps) if step.actor == actor]
        workers[actor] = context.Process(
            target=_worker,
            name=f"{scenario.name}:{actor}",
            args=(db_path, scenario.fenced, script, released, reports, backstop),
            daemon=True,  # should the clean-up never run, the interpreter's exit ends it
        )
        # Held again: the first Event above may have started multiprocessing's resource
        # tracker, which lets SIGINT and SIGTERM through; the worker inherits the hold.
        with _held():
            cleanup.callback(_stop, workers[actor])  # runs before the folder is removed
            workers[actor].start()
    return _Play(scenario, db_path, released, reports, workers)


def _stop(process: "BaseProcess") -> None:
    """Make sure a worker is gone, however its scenario ended: it has nothing to clean up."""
    if process.pid is not None:
        process.kill()
        process.join(5.0)


def _play(play: _Play, timeout: float) -> dict[str, Any]:
    """Release the scenario's steps one at a time; the record of what happened."""
    events = []
    for index, step in enumerate(play.scenario.steps):
        where, worker = f"step {index} ({step})", play.workers[step.actor]
        play.released[index].set()
        reported, event, error = _report(play, worker, timeout, where)
        if error is not None or event is None or reported != index:
            problem = error or f"step {reported} reported out of turn"
            raise ExperimentError(play.scenario.name, where, f"worker {step.actor}: {problem}")
        events.append(event)
        if all(later.actor != step.actor for later in play.scenario.steps[index + 1 :]):
            # Its last step: the next is released only once this worker has exited, so that
            # what it leaves behind is only what it committed.
            worker.join(timeout)
            if worker.exitcode != 0:
                raise ExperimentError(play.scenario.name, where, (
                    f"worker {step.actor} did not exit with 0 within {timeout:g} s: "
                    f"exit code {worker.exitcode}"
                ))
    try:
        return _record(play.scenario, play.db_path, events)
    except Exception as exc:
        raise ExperimentError(play.scenario.name, "recording", f"{exc!r}") from exc


def _report(
    play: _Play, worker: "BaseProcess", timeout: float, where: str
) -> tuple[int, dict[str, Any] | None, str | None]:
    """The next report of `play`; ExperimentError if none comes in time or `worker` died.

    The wait is cut into slices of 0.1 s only to notice a worker that died without a word
    (killed, say) within 0.1 s rather than at `timeout`; a report ends the wait at once.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            return play.reports.get(timeout=max(0.0, min(0.1, deadline - time.monotonic())))
        except queue.Empty:
            pass
        if not worker.is_alive() and play.reports.empty():
            problem = f"worker {worker.name!r} ended unreported, exit code {worker.exitcode}"
        elif time.monotonic() >= deadline:
            problem = f"no report within {timeout:g} s"
        else:
            continue
        raise ExperimentError(play.scenario.name, where, problem)


def _record(scenario: Scenario, db_path: str, events: list[dict[str, Any]]) -> dict[str, Any]:
    with Receiver(db_path, fenced=scenario.fenced) as receiver:
        decisions = receiver.decisions(RESOURCE)
        final = receiver.read(RESOURCE)
    with LeaseAuthority(db_path) as authority:
        lease = authority.current(RESOURCE, now=scenario.steps[-1].tick)
    return {
        "name": scenario.name,
        "receiver": "fenced" if scenario.fenced else "unfenced",
        "summary": scenario.summary,
        "resource": RESOURCE,
        "events": events,
        "decisions": [
            {"outcome": d.outcome.value, "epoch": d.epoch, "value": d.value,
             "stored_epoch": d.stored_epoch, "stored_value": d.stored_value}
            for d in decisions
        ],
        "final": None if final is None else {"epoch": final[0], "value": final[1]},
        "lease_at_end": None if lease is None else _lease_json(lease),
        "verdict": judge(events),
    }


def _check_timeout(timeout: object) -> float:
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool):
        raise TypeError(f"timeout must be a number of seconds, got {timeout!r}")
    if not 0 < timeout <= MAX_TIMEOUT:
        raise ValueError(f"timeout must be above 0 and at most {MAX_TIMEOUT:g} s, got {timeout!r}")
    return float(timeout)


# --- evidence: rendering and comparing ---


def canonical_json(document: object) -> str:
    return json.dumps(document, sort_keys=True, indent=2, ensure_ascii=True) + "\n"


def timeline(record: dict[str, Any]) -> str:
    """A few lines a person can read at a glance: who did what at which tick, and the result."""
    lines = [f"{record['name']} ({record['receiver']} receiver)"]
    for event in record["events"]:
        if event["stored_epoch"] is not None:
            held = f"epoch {event['stored_epoch']}, {event['stored_value']!r}"
            detail = f"{event['value']!r} -> receiver holds {held}"
        elif event["expires_at"] is not None:
            whose = "a live lease" if event["outcome"] == "held" else "lease"
            detail = f"{whose} until tick {event['expires_at']}"
        else:
            detail = ""
        epoch = "" if event["epoch"] is None else f"epoch {event['epoch']}"
        lines.append(
            f"  tick {event['tick']:>2}  {event['actor']}  {event['action']:<7}  "
            f"{epoch:<8}  {event['outcome']:<8}  {detail}".rstrip()
        )
    verdict = record["verdict"]
    lines.append(
        f"  final value written by {verdict['final_value_written_by']}; stale writes refused: "
        f"{verdict['stale_writes_refused']}, conflicting: {verdict['conflicting_writes_refused']}"
    )
    flags = [field for field, value in verdict.items() if value is True]
    lines.extend(f"  true: {flag}" for flag in flags)
    return "\n".join(lines)


_MISSING = object()


def differences(
    expected: object, actual: object, path: str = "$"
) -> Iterator[tuple[str, Any, Any]]:
    """Yield (JSON path, expected, actual) wherever two parsed JSON documents differ."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(expected.keys() | actual.keys()):
            step = f".{key}" if key.isidentifier() else f"[{json.dumps(key)}]"
            yield from differences(
                expected.get(key, _MISSING), actual.get(key, _MISSING), path + step
            )
    elif isinstance(expected, list) and isinstance(actual, list):
        for i in range(max(len(expected), len(actual))):
            yield from differences(
                expected[i] if i < len(expected) else _MISSING,
                actual[i] if i < len(actual) else _MISSING,
                f"{path}[{i}]",
            )
    # type() as well as ==, because in Python true == 1 and 1 == 1.0, but not in the evidence.
    elif type(expected) is not type(actual) or expected != actual:
        yield path, expected, actual


def _meaning_first(path: str) -> int:
    """A differing path's place in the report: what a run concluded, then how it got there."""
    if any(f".{field}" in path for field in ("verdict", "final", "lease_at_end")):
        return 0
    return 2 if ".decisions" in path else 1


def _shown(value: object, limit: int = 70) -> str:
    text = "(missing)" if value is _MISSING else json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- exploring every schedule ---

# (the explorer goes here)


# --- command line ---

EXIT_OK = 0
EXIT_DIFFERENT = 1
EXIT_USAGE = 2
EXIT_FAILED = 3
EXIT_CLOSED_STDOUT = 32  # EPIPE, as CPython's own `python3 -m json.tool` exits on a closed pipe
EXIT_SIGNALLED = 128  # plus the signal's number, the shell's convention: Ctrl-C is 130

# The signals that stop a run as Ctrl-C does, and how a user sends each.
_STOP_SIGNAL_SOURCES = {
    "SIGHUP": "the terminal closed",
    "SIGINT": "Ctrl-C",
    "SIGQUIT": "Ctrl-backslash",
    "SIGTERM": "kill, timeout, a CI runner cancelling a job",
}
_STOP_SIGNALS = tuple(sorted(
    getattr(signal, name) for name in _STOP_SIGNAL_SOURCES if hasattr(signal, name)
))
_MASKABLE = hasattr(signal, "pthread_sigmask")
_SHOWN_DIFFERENCES = 10
_MAX_EXPECTED_BYTES = 16 * 1024 * 1024  # the evidence is a few kilobytes

# Every exit code and its meaning, exactly as --help prints them and README lists them.
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "success; with --check, the run reproduced EXPECTED"),
    (EXIT_DIFFERENT, (
        "with --check, the run differs from EXPECTED; the first "
        f"{_SHOWN_DIFFERENCES} differing JSON paths are listed, verdicts first, and how many "
        "more; --output is still written"
    )),
    (EXIT_USAGE, (
        "bad arguments, or a file or stdout that cannot be read or written; one line on "
        "stderr, and nothing written"
    )),
    (EXIT_FAILED, "a scenario failed or hung; the scenario and the step are named"),
    (EXIT_CLOSED_STDOUT, (
        "stdout was closed before the report was written (| true); quiet, as "
        "python3 -m json.tool is"
    )),
    *(
        (EXIT_SIGNALLED + number, (
            f"stopped by {signal.Signals(number).name} "
            f"({_STOP_SIGNAL_SOURCES[signal.Signals(number).name]}); every worker stopped, "
            "every temporary folder removed, nothing written"
        ))
        for number in _STOP_SIGNALS
    ),
)


class _UsageError(Exception):
    """Bad arguments or files: exit 2 with one line."""


class _Stopped(BaseException):
    """A stop signal arrived; raised once, wherever the run was, so that it unwinds."""

    def __init__(self, number: int) -> None:
        super().__init__(number)
        self.number = number


@contextlib.contextmanager
def _held() -> Iterator[None]:
    """Hold the stop signals back while the block runs; one sent meanwhile arrives after it.

    Processes started in the block inherit the hold (see _worker).
    """
    if not _MASKABLE:
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _parser() -> "argparse.ArgumentParser":
    import argparse
    import textwrap

    class Parser(argparse.ArgumentParser):
        def print_help(self, file: Any = None) -> None:
            _say(self.format_help().rstrip("\n"))  # a closed stdout is exit 32, not 0

        def error(self, message: str) -> NoReturn:
            self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")

    parser = Parser(
        prog="run_experiment.py",
        description="Replay the lease scenarios (unfenced receiver, fenced receiver, and the gap\n"
        "between a lease's expiry and the receiver's observation of a newer epoch) with\n"
        "spawned processes, and write the evidence as canonical JSON to stdout or PATH.\n"
        "A timeline a person can read goes to stderr.",
        epilog="exit codes:\n"
        + "".join(
            textwrap.fill(meaning, 88, initial_indent=f"  {code:<5}", subsequent_indent=" " * 7)
            + "\n"
            for code, meaning in EXIT_CODES
        )
        + "\nexamples:\n"
        "  python3 run_experiment.py --check results.json --output reproduced.json\n"
        "  python3 run_experiment.py --output results.json   # regenerate the evidence",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--check",
        metavar="EXPECTED",
        help="compare the run with this evidence file (a regular file of at most "
        f"{_MAX_EXPECTED_BYTES // 2**20} MiB); key order and whitespace do not matter",
    )
    parser.add_argument(
        "--output",
        metavar="PATH",
        help="write the evidence to this regular file, replacing it whole, or creating it; a "
        "symlink's target is replaced and the link kept (default: stdout, unless --check)",
    )
    parser.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=_seconds,
        default=DEFAULT_TIMEOUT,
        help=f"give up on a step that hangs this long, at most {MAX_TIMEOUT:g}; it never "
        f"orders anything (default: {DEFAULT_TIMEOUT:g})",
    )
    return parser


def _seconds(text: str) -> float:
    import argparse

    try:
        return _check_timeout(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds above 0 and at most {MAX_TIMEOUT:g}, got {text!r}"
        ) from None


def _shown_path(path: str) -> str:
    """`path` as a person can read it: escaped if it holds anything unprintable."""
    return path if path.isprintable() else ascii(path)


def _read_expected(path: str) -> object:
    """The parsed --check file: a bounded regular file of JSON, no key repeated in an object."""
    shown = _shown_path(path)
    # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
    with open(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as file:
        status = os.fstat(file.fileno())
        if not stat.S_ISREG(status.st_mode):
            raise _UsageError(f"expected evidence {shown} is not a regular file")
        data = file.read(_MAX_EXPECTED_BYTES + 1)
    if len(data) > _MAX_EXPECTED_BYTES:
        raise _UsageError(f"expected evidence {shown} is more than {_MAX_EXPECTED_BYTES} bytes")

    def no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in pairs]
        for key in keys:
            if keys.count(key) > 1:
                raise _UsageError(f"expected evidence {shown} has the key {key!r} twice")
        return dict(pairs)

    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=no_repeats)
    except (ValueError, RecursionError) as exc:  # JSON and UTF-8 errors are ValueErrors
        raise _UsageError(f"expected evidence {shown} is not JSON: {exc}") from None


def _output_target(path: str, check: str | None) -> str:
    """The regular file that --output PATH will replace (a symlink's target), checked now."""
    shown = _shown_path(path)
    if not path or path.endswith((os.sep, os.altsep or os.sep)):
        raise _UsageError(f"--output must name a file, got {shown}")
    target = os.path.realpath(path)  # the link stays; what it points to gets the evidence
    status = _status(target)
    if status is not None and not stat.S_ISREG(status.st_mode):
        raise _UsageError(f"cannot write {shown}: it is not a regular file")
    if status is not None and check is not None and os.path.samestat(status, os.stat(check)):
        raise _UsageError(f"--output {shown} is the --check file it is compared with")
    with tempfile.TemporaryFile(dir=os.path.dirname(target)):  # can a file be made there?
        pass
    return target


def _status(path: str) -> os.stat_result | None:
    """os.stat(path), or None if nothing is there."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


def _replace(target: str, text: str) -> None:
    """Write `text` to a new file beside `target`, then rename it into place: whole or not at all.

    An existing file keeps its mode; a new one gets what the umask allows, as any new file.
    """
    status = _status(target)
    mode = 0o666 & ~_umask() if status is None else stat.S_IMODE(status.st_mode)
    fd, staged = tempfile.mkstemp(dir=os.path.dirname(target), suffix=".tmp")
    try:
        os.chmod(fd, mode)
        with os.fdopen(fd, "w", encoding="ascii", newline="\n") as file:
            file.write(text)
        os.replace(staged, target)
    finally:
        with contextlib.suppress(FileNotFoundError):  # gone already once renamed
            os.unlink(staged)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _say(text: str) -> None:
    """Write a line of the report to stdout; OSError if it will not take it."""
    if sys.stdout is None:  # its file descriptor was closed before Python started
        raise OSError("stdout is closed")
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except ValueError as exc:  # the stream was closed
        raise OSError(f"stdout is closed: {exc}") from None


def _note(text: str) -> None:
    """Write a line to stderr, if it takes it: a diagnostic never changes the exit code."""
    with contextlib.suppress(AttributeError, OSError, ValueError):  # None, full, closed
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: the exit code, one of EXIT_CODES.

    main() is the program: it takes the stop signals over, and holds them for good on its
    way out, so that a signal then can neither cut the clean-up short nor change the exit
    status.  The first stop signal ends the run; later ones are ignored.
    """
    for stream in (sys.stdout, sys.stderr):  # any name or value can be shown, escaped
        with contextlib.suppress(AttributeError):
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
    stopped: list[int] = []

    def stop(number: int, frame: object) -> None:
        if not stopped:
            stopped.append(number)
            raise _Stopped(number)

    for number in _STOP_SIGNALS:
        if signal.getsignal(number) is not signal.SIG_IGN:  # nohup, a script's background job
            signal.signal(number, stop)
    try:
        return _main(argv)
    except _Stopped as exc:
        name = signal.Signals(exc.number).name
        _note(f"run_experiment.py: stopped by {name}; every worker was stopped, every "
              "temporary folder removed, and nothing was written")
        return EXIT_SIGNALLED + exc.number
    except BrokenPipeError:  # the reader has gone (| head): end quietly, as json.tool does
        with contextlib.suppress(AttributeError, OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_CLOSED_STDOUT
    except OSError as exc:  # a file, a folder, or stdout
        where = "" if exc.filename is None else f"{_shown_path(os.fsdecode(exc.filename))}: "
        _note(f"run_experiment.py: error: {where}{exc.strerror or exc}")
        return EXIT_USAGE
    except _UsageError as exc:
        _note(f"run_experiment.py: error: {exc}")
        return EXIT_USAGE
    finally:
        _hold_for_good()


def _hold_for_good() -> None:
    """Hold the stop signals back from now on, the interpreter's exit included."""
    if _MASKABLE:
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    with _held():  # a stop now arrives once the checks are done: they leave nothing behind
        expected = None if args.check is None else _read_expected(args.check)
        target = None if args.output is None else _output_target(args.output, args.check)
    try:
        document = run_scenarios(timeout=args.timeout)
    except ExperimentError as exc:
        _note(f"run_experiment.py: failed: {exc}")
        return EXIT_FAILED
    _hold_for_good()  # every worker is gone: what is left takes milliseconds, and a stop
    # now could only leave the evidence written with a "stopped" exit code
    for record in document["scenarios"]:
        _note(timeline(record))
    text = canonical_json(document)
    code, report = EXIT_OK, (text.rstrip("\n") if target is None else "")
    if expected is not None:
        found = sorted(differences(expected, json.loads(text)), key=lambda d: _meaning_first(d[0]))
        if found:
            code = EXIT_DIFFERENT
            report = "\n".join([
                (f"differs: this run does not match {_shown_path(args.check)} at "
                 f"{len(found)} JSON path(s):"),
                *(f"  {path}: expected {_shown(want)}, got {_shown(got)}"
                  for path, want, got in found[:_SHOWN_DIFFERENCES]),
                *([f"  ... and {len(found) - _SHOWN_DIFFERENCES} more"]
                  if len(found) > _SHOWN_DIFFERENCES else []),
            ])
        else:
            report = (f"reproduced: this run matches {_shown_path(args.check)} "
                      f"({len(document['scenarios'])} scenarios)")
    # The report first: if stdout will not take it, the evidence is not put in place.
    if report:
        _say(report)
    if target is not None:
        _replace(target, text)
    return code


if __name__ == "__main__":
    sys.exit(main())
