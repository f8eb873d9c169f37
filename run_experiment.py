"""Replay the lease scenarios with spawned processes, and write the evidence as canonical JSON.

A scenario is data: a timeline of steps, each saying which worker acquires, renews, writes or
releases at which tick.  The engine spawns one worker process per actor and gives every step
an Event of its own.  A worker waits on its next step's Event, performs that one step against
the scenario's SQLite database, and puts its report on the scenario's Queue.  The engine sets
one Event at a time and waits for that step's report (and, after a worker's last step, for the
worker to exit) before it sets the next, so the order of events comes from these handshakes
alone, never from timing.  Every wait is bounded; nothing sleeps.

`--explore` plays every schedule of a small bound against the real code instead: see the
section "exploring every schedule".
"""

import contextlib
import enum
import functools
import json
import math
import multiprocessing
import os
import queue
import shutil
import signal
import sqlite3
import stat
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from leases import Lease, LeaseAuthority, LeaseError, LeaseHeld, LeaseLost, Receiver

if TYPE_CHECKING:  # only for annotations: the spawn context makes the real objects
    import argparse
    from multiprocessing.process import BaseProcess
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Event

__all__ = [
    "EXIT_CODES", "SCENARIOS", "Action", "Bound", "ExperimentError", "Scenario", "Step",
    "canonical_json", "differences", "explore", "judge", "main", "run_scenarios", "timeline",
]

RESOURCE = "quarterly-report"
DEFAULT_TIMEOUT = 60.0  # seconds: only bounds a hung step; no step waits for it to pass


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
        wants_ttl = self.action in (Action.ACQUIRE, Action.RENEW)
        if not isinstance(self.action, Action) or not isinstance(self.actor, str):
            raise TypeError(f"step {self!r}: actor must be a str and action an Action")
        if not self.actor or not _is_tick(self.tick):
            raise ValueError(f"step {self!r}: actor must not be empty, tick must be an int >= 0")
        if wants_ttl != (_is_tick(self.ttl) and self.ttl != 0):
            raise ValueError(f"step {self!r}: acquire and renew need a ttl (an int >= 1), "
                             "other actions none")
        if (self.action is Action.WRITE) != isinstance(self.value, str):
            raise ValueError(f"step {self!r}: a write needs a value (a str), other actions none")

    def __str__(self) -> str:
        return f"{self.actor} {self.action.value} at tick {self.tick}"


def _is_tick(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True)
class Scenario:
    """A named timeline: the engine releases its steps one at a time, in this order.  Its ticks
    never go back.  An actor's steps use the lease it last received: one that has none yet,
    or any more, is answered "no lease"."""

    name: str
    fenced: bool
    summary: str
    steps: tuple[Step, ...]

    def __post_init__(self) -> None:
        where = f"scenario {self.name!r}"
        if not isinstance(self.steps, tuple) or not all(isinstance(s, Step) for s in self.steps):
            raise TypeError(f"{where}: steps must be a tuple of Step, got {self.steps!r}")
        if not (isinstance(self.name, str) and self.name and self.steps):
            raise ValueError(f"{where}: name (a str) and steps must not be empty")
        for index, (before, step) in enumerate(zip(self.steps, self.steps[1:]), start=1):
            if step.tick < before.tick:
                raise ValueError(f"{where}, step {index} ({step}): tick {step.tick} comes after "
                                 f"tick {before.tick}")

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
    if step.action is Action.ACQUIRE:
        assert step.ttl is not None  # Step checked it
        try:
            lease = authority.acquire(RESOURCE, step.actor, now=step.tick, ttl=step.ttl)
        except LeaseHeld as held:
            return lease, _event(step, "held", held.lease.epoch, held.lease.expires_at)
        return lease, _event(step, "granted", lease.epoch, lease.expires_at)
    if lease is None:  # it never got one, lost it, or gave it back
        return None, _event(step, "no lease")
    if step.action is Action.WRITE:
        return lease, _write(step, lease, receiver)
    try:
        if step.action is Action.RENEW:
            assert step.ttl is not None  # Step checked it
            lease = authority.renew(lease, now=step.tick, ttl=step.ttl)
            return lease, _event(step, "renewed", lease.epoch, lease.expires_at)
        authority.release(lease)
        return None, _event(step, "released", lease.epoch)
    except LeaseLost:
        return None, _event(step, "lost", lease.epoch)


def _write(step: Step, lease: Lease, receiver: Receiver) -> dict[str, Any]:
    """Send the value of a write `step` to `receiver`, with the epoch of `lease`."""
    assert step.value is not None  # Step checked it
    result = receiver.write(RESOURCE, lease.epoch, step.value)
    stored = (result.stored_epoch, result.stored_value)
    return _event(step, result.outcome.value, result.epoch, None, result.value, stored)


def _event(
    step: Step,
    outcome: str,
    epoch: int | None = None,
    expires_at: int | None = None,
    value: str | None = None,
    stored: tuple[int | None, str | None] = (None, None),
) -> dict[str, Any]:
    """One step as the evidence records it: every field present, null where it does not apply."""
    return {"actor": step.actor, "action": step.action.value, "tick": step.tick,
            "epoch": epoch, "expires_at": expires_at, "value": value, "outcome": outcome,
            "stored_epoch": stored[0], "stored_value": stored[1]}


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
        elif event["outcome"] == "applied":
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
        if event["stored_epoch"] is not None:
            stored_epoch = event["stored_epoch"]
    final = because["final_value_written_by"]
    return {
        **{field: bool(because[field]) for field in list(because)[:3]},
        **{field: len(because[field]) for field in refused.values()},
        "final_value_written_by": events[final[0]]["actor"] if final else None,
        "because": because,
    }


# --- the worker: a child process, told everything by its arguments ---

# A worker's report of one step: (its index, the event, None), or (index, None, the problem).
_Report = tuple[int, dict[str, Any] | None, str | None]


def _worker(
    db_path: str,
    fenced: bool,
    script: Sequence[tuple[int, Step]],
    released: Sequence["Event"],
    reports: "Queue[_Report]",
    backstop: float,
) -> None:
    """Perform each (index, step) of `script` once `released[index]` is set; report each.

    A failure is reported as text, since an arbitrary exception may not survive pickling.
    `backstop` bounds each wait only in case the engine is gone.  The worker owns nothing and
    removes nothing: the engine owns the scenario's folder.
    """
    # Stopping is the engine's: it kills its workers itself, so that Ctrl-C, sent to the whole
    # process group, ends the run once, in one line.  The engine started this process with the
    # stop signals held; a pending one is dropped here, but SIGTERM stays fatal.
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
    # All it leaves is what it committed, and the engine waits for it to be gone: once its
    # last report is flushed, it skips the interpreter's own exit, which takes longer.
    reports.close()
    reports.join_thread()
    os._exit(0)


# --- the engine ---


class ExperimentError(Exception):
    """A scenario failed or hung; `scenario` and `step` say where."""

    def __init__(self, scenario: str, step: str, problem: str) -> None:
        super().__init__(f"scenario {scenario!r}, {step}: {problem}")
        self.scenario = scenario
        self.step = step
        self.problem = problem


@dataclass(frozen=True)
class _Play:
    """A scenario ready to play: its database, one Event per step, its workers, their Queue."""

    scenario: Scenario
    db_path: str
    released: list["Event"]
    reports: "Queue[_Report]"
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
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        # A spawned worker, still starting, imports its caller's script: the flag is the one
        # multiprocessing checks before it refuses to start a process then.
        raise SystemExit("run_scenarios() ran while a worker imported your script: "
                         'call it under `if __name__ == "__main__":`')
    if not isinstance(timeout, (int, float)) or not 0 < timeout <= 1e6:
        raise ValueError(f"timeout must be a number of seconds from 0 to 1e6, got {timeout!r}")
    backstop = timeout * (sum(len(s.steps) + 1 for s in scenarios) + 1)
    context = multiprocessing.get_context("spawn")
    _start_resource_tracker()
    with contextlib.ExitStack() as cleanup:
        folder = _scratch(cleanup, "leases-experiment-")
        plays = []  # kept to the end: a worker still starting up needs its Events to exist
        for number, scenario in enumerate(scenarios):
            db_path = os.path.join(folder, f"{number}.sqlite3")  # its first worker makes it
            plays.append(_start(scenario, db_path, context, backstop, cleanup))
        return {"scenarios": [_play(play, timeout) for play in plays]}


def _start(
    scenario: Scenario,
    db_path: str,
    context: multiprocessing.context.SpawnContext,
    backstop: float,
    cleanup: contextlib.ExitStack,
) -> _Play:
    """Start the scenario's workers, each waiting for its first step."""
    # Workers start with the stop signals held, and keep them held until they ignore them.
    with _held():
        released = [context.Event() for _ in scenario.steps]
        reports: Queue[_Report] = context.Queue()
        workers: dict[str, BaseProcess] = {}
        for actor in scenario.actors:
            script = [(i, step) for i, step in enumerate(scenario.steps) if step.actor == actor]
            workers[actor] = context.Process(
                target=_worker,
                name=f"{scenario.name}:{actor}",
                args=(db_path, scenario.fenced, script, released, reports, backstop),
                daemon=True,  # should the clean-up never run, the interpreter's exit ends it
            )
            cleanup.callback(_stop, workers[actor])  # runs before the folder is removed
            workers[actor].start()  # inherits the hold; see _worker
    return _Play(scenario, db_path, released, reports, workers)


def _scratch(cleanup: contextlib.ExitStack, prefix: str) -> str:
    """A new temporary folder, removed by `cleanup`."""
    folder = tempfile.mkdtemp(prefix=prefix)
    cleanup.callback(shutil.rmtree, folder, ignore_errors=True)
    return folder


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
        reported, event, error = _report(play.reports, worker, timeout)
        if error is not None or event is None or reported != index:
            # Another worker may have failed first, a later step's waiting for its turn, say.
            steps = play.scenario.steps
            who = steps[reported].actor if 0 <= reported < len(steps) else step.actor
            problem = error or f"step {reported} reported"
            raise ExperimentError(play.scenario.name, where, f"worker {who}: {problem}")
        events.append(event)
        if all(later.actor != step.actor for later in play.scenario.steps[index + 1 :]):
            # Its last step: the next is released only once this worker has exited, so that
            # what it leaves behind is only what it committed.
            worker.join(timeout)
            if worker.exitcode != 0:
                problem = f"worker {step.actor} did not exit with 0: exit code {worker.exitcode}"
                raise ExperimentError(play.scenario.name, where, problem)
    try:
        return _record(play.scenario, play.db_path, events)
    except LeaseError as exc:
        raise ExperimentError(play.scenario.name, "recording", str(exc)) from exc


def _report(reports: "Queue[_Report]", worker: "BaseProcess", timeout: float) -> _Report:
    """The next report, or one saying why none came: within `timeout`, or from a dead worker.

    The wait is cut into slices of 0.1 s to notice, that soon, a stop that main() has noted,
    or a worker that died without a word (killed, or one that could not even start).
    """
    deadline = time.monotonic() + timeout
    while True:
        _stop_if_asked()
        try:
            return reports.get(timeout=min(0.1, timeout))
        except queue.Empty:
            if not worker.is_alive() and reports.empty():
                return -1, None, f"ended without a report, exit code {worker.exitcode}"
            if time.monotonic() >= deadline:
                return -1, None, f"no report within {timeout:g} s"


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
        "lease_at_end": None if lease is None else {
            "holder": lease.holder, "epoch": lease.epoch, "expires_at": lease.expires_at},
        "verdict": judge(events),
    }


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
        elif event["outcome"] == "held":
            detail = f"by epoch {event['epoch']}, live until tick {event['expires_at']}"
        elif event["expires_at"] is not None:
            detail = f"lease until tick {event['expires_at']}"
        else:
            detail = ""
        shown = event["epoch"] is not None and event["outcome"] != "held"
        epoch = f"epoch {event['epoch']}" if shown else ""
        lines.append(f"  tick {event['tick']:>2}  {event['actor']}  {event['action']:<7}  "
                     f"{epoch:<8}  {event['outcome']:<8}  {detail}".rstrip())
    verdict = record["verdict"]
    lines.append(
        f"  final value written by {verdict['final_value_written_by']}; stale writes refused: "
        f"{verdict['stale_writes_refused']}, conflicting: {verdict['conflicting_writes_refused']}"
    )
    lines.extend(f"  true: {field}" for field, value in verdict.items() if value is True)
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
#
# A bound is H holders that all run one program, one ttl, and the ticks 0..T.  A schedule
# interleaves the holders' programs, each step at a tick no earlier than the one before.
# Schedules are many but states are few: the explorer counts schedules layer by layer (one
# layer per step taken), by state, and plays each distinct (state, step) once on the real
# code.  It writes the state into the database, calls the library through _perform, and reads
# the state that is left back from the database, so that a broken library changes what is
# explored.  Each step is one transaction, so whole steps in every order are every order that
# processes could produce at this level; what happens inside a transaction is not explored.

CLASSES = ("lost update", "stale refused", "gap", "late, not superseded", "replay", "conflict")
CHECKS = ("fence", "epochs increase", "one live lease", "highest epoch stored", "model")
_FLAGS = (*(f"fenced {c}" for c in CLASSES), *(f"unfenced {c}" for c in CLASSES), *CHECKS)


@dataclass(frozen=True)
class Bound:
    """Holders A, B, ... that all run `program`, acquiring or renewing for `ttl` ticks."""

    holders: int = 2
    program: tuple[Action, ...] = (Action.ACQUIRE, Action.RENEW, Action.WRITE, Action.RELEASE)
    last_tick: int = 5
    ttl: int = 2

    @functools.cache  # noqa: B019 - a few bounds, a few steps each
    def step(self, h: int, position: int, tick: int) -> Step:
        """Holder h's step at `position`; its k-th write sends its name and k, as "A1"."""
        actor, action = "ABCDEFGH"[h], self.program[position]
        timed = action in (Action.ACQUIRE, Action.RENEW)
        k = self.program[: position + 1].count(Action.WRITE)
        value = f"{actor}{k}" if action is Action.WRITE else None
        return Step(actor, action, tick, self.ttl if timed else None, value)


@dataclass(frozen=True)
class _State:
    """All that the rest of a schedule depends on: the database, the time, each holder."""

    row: tuple[Any, ...] | None  # the authority's: holder (None once released), epoch, expiry
    stored: tuple[Any, ...]  # the fenced receiver's (epoch, value), the unfenced one's
    tick: int
    positions: tuple[int, ...]  # how many steps of the program each holder has taken
    leases: tuple[Any, ...]  # the (epoch, expires_at) each holder believes it holds, or None


class _Bench:
    """The real authority and receivers on one file, and a plain connection to set and read it."""

    def __init__(self, path: str) -> None:
        self.authority = LeaseAuthority(path)
        self.receivers = Receiver(path, fenced=True), Receiver(path, fenced=False)
        self.raw = sqlite3.connect(path, isolation_level=None)
        self.now: tuple[Any, ...] = (None, (None, None))  # what the database holds

    def close(self) -> None:
        for store in (self.authority, *self.receivers, self.raw):
            store.close()

    def play(self, state: _State, h: int, step: Step) -> tuple[_State, list[dict[str, Any]]]:
        """Set the database to `state`, play holder h's `step`; the state left, its events."""
        if self.now != (state.row, state.stored):
            decisions = [(fenced, RESOURCE, *pair, *pair)
                         for fenced, pair in zip((True, False), state.stored) if pair]
            self.raw.executescript("BEGIN IMMEDIATE; DELETE FROM leases;"
                                   " DELETE FROM receiver_decisions;")
            self.raw.executemany("INSERT INTO leases VALUES (?, ?, ?, ?)",
                                 [(RESOURCE, *state.row)] if state.row else [])
            self.raw.executemany("INSERT INTO receiver_decisions VALUES"
                                 " (?, ?, 1, 'applied', ?, ?, ?, ?)", decisions)
            self.raw.execute("COMMIT")
        held = state.leases[h]
        lease = None if held is None else Lease(RESOURCE, step.actor, *held)
        try:
            lease, event = _perform(step, lease, self.authority, self.receivers[0])
            wrote = step.action is Action.WRITE and lease is not None
            events = [event, _write(step, lease, self.receivers[1]) if wrote and lease else event]
        except Exception as exc:  # noqa: BLE001 - a broken library: an answer no model gives
            events = [_event(step, f"raised {type(exc).__name__}: {exc}")] * 2
        row = self.raw.execute("SELECT holder, epoch, expires_at FROM leases").fetchone()
        stored = tuple(self.raw.execute(
            "SELECT stored_epoch, stored_value FROM receiver_decisions WHERE fenced = ?"
            " ORDER BY seq DESC LIMIT 1", (fenced,)).fetchone() for fenced in (True, False))
        self.now = row, stored
        held = None if lease is None else (lease.epoch, lease.expires_at)
        return _State(row, stored, step.tick, _put(state.positions, h, state.positions[h] + 1),
                      _put(state.leases, h, held)), events


def _put(items: tuple[Any, ...], index: int, item: Any) -> tuple[Any, ...]:
    return (*items[:index], item, *items[index + 1 :])


def _model(state: _State, h: int, step: Step) -> tuple[_State, list[tuple[Any, ...]]]:
    """What the rules say `step` answers, at each receiver, and leaves: from `state` alone."""
    row, stored, held = state.row, list(state.stored), state.leases[h]
    live = row is not None and row[0] is not None and step.tick < row[2]
    mine = row is not None and held is not None and tuple(row[:2]) == (step.actor, held[0])
    if step.action is Action.ACQUIRE and live:
        answers = [("held", row[1], row[2], None, None)] * 2  # type: ignore[index]
    elif step.action is Action.ACQUIRE or (step.action is Action.RENEW and mine and live):
        epoch = held[0] if step.action is Action.RENEW else 1 if row is None else row[1] + 1
        held = (epoch, step.tick + (step.ttl or 0))
        row = (step.actor, *held)
        answers = [("renewed" if step.action is Action.RENEW else "granted", *held, None, None)] * 2
    elif held is None:
        answers = [("no lease", None, None, None, None)] * 2
    elif step.action is not Action.WRITE:
        released = step.action is Action.RELEASE and mine
        answers = [("released" if released else "lost", held[0], None, None, None)] * 2
        row = (None, *row[1:]) if released and row else row
        held = None
    else:
        answers = []
        for r, pair in enumerate(stored):  # the fenced receiver, then the unfenced one
            if r or pair is None or held[0] > pair[0]:
                outcome, stored[r] = "applied", (held[0], step.value)
            elif held[0] < pair[0]:
                outcome = "stale"
            else:
                outcome = "replay" if step.value == pair[1] else "conflict"
            answers.append((outcome, held[0], None, *stored[r]))
    positions = _put(state.positions, h, state.positions[h] + 1)
    return _State(row, tuple(stored), step.tick, positions, _put(state.leases, h, held)), answers


def _flags(state: _State, h: int, step: Step, after: _State, events: list[Any]) -> int:
    """The flags a step raises: its write's classes at each receiver, then the checks it fails."""
    current = 0 if state.row is None else state.row[1]  # the authority's newest epoch
    held, fenced, first = state.leases[h], state.stored[0], events[0]
    raised = []
    for event, pair in zip(events, state.stored):
        applied, epoch = event["outcome"] == "applied", event["epoch"]
        lost = applied and pair is not None and epoch < pair[0]
        raised += [
            lost,
            event["outcome"] == "stale",
            applied and not lost and epoch < current,  # the gap: superseded, not fenced out
            applied and epoch == current and held is not None and step.tick >= held[1],
            event["outcome"] == "replay",
            event["outcome"] == "conflict",
        ]
    fields = ("outcome", "epoch", "expires_at", "stored_epoch", "stored_value")
    highest = max(0 if fenced is None else fenced[0], first["epoch"] or 0)
    raised += [
        first["outcome"] == "applied" and fenced is not None and first["epoch"] <= fenced[0],
        first["outcome"] == "granted" and first["epoch"] <= current,
        sum(lease is not None and step.tick < lease[1] for lease in after.leases) > 1,
        first["stored_epoch"] is not None and first["stored_epoch"] != highest,
        _model(state, h, step) != (after, [tuple(e[f] for f in fields) for e in events]),
    ]
    return sum(1 << bit for bit, hit in enumerate(raised) if hit)


def explore(
    bound: Bound, *, brute_force: bool = False, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Play every schedule of `bound` on the real code; the table of what happened.

    Each distinct (state, step) is played once, and schedules are counted by state.  With
    `brute_force`, no two schedules share a state: every schedule is played, step by step.
    """
    started, played, states = time.monotonic(), 0, 1
    smallest: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    start = _State(None, (None, None), 0, (0,) * bound.holders, (None,) * bound.holders)
    # Each state of a layer: the smallest schedule that reaches it (its ticks, then its
    # holders), and how many schedules reach it with each set of flags.
    layer: dict[Any, Any] = {(start, ()) if brute_force else start: (((), ()), Counter({0: 1}))}
    with contextlib.ExitStack() as cleanup:
        bench = _Bench(os.path.join(_scratch(cleanup, "leases-explore-"), "explore.sqlite3"))
        cleanup.callback(bench.close)
        for _ in range(bound.holders * len(bound.program)):
            following: dict[Any, Any] = {}
            for key in sorted(layer, key=repr):  # a reproducible order, one row's states together
                _stop_if_asked()
                state, ((ticks, holders), counts) = key[0] if brute_force else key, layer[key]
                for h, tick in _next(bound, state):
                    step = bound.step(h, state.positions[h], tick)  # cached: steps are few
                    after, events = bench.play(state, h, step)
                    raised, played = _flags(state, h, step, after, events), played + 1
                    prefix = ((*ticks, tick), (*holders, h))
                    for bit in (bit for bit in range(len(_FLAGS)) if raised >> bit & 1):
                        smallest[bit] = min(smallest.get(bit, prefix), prefix)
                    goes = (after, prefix) if brute_force else after
                    least, reached = following.get(goes, (prefix, Counter()))
                    following[goes] = min(least, prefix), reached
                    for flags, schedules in counts.items():
                        reached[flags | raised] += schedules
            layer, states = following, states + len(following)
            if progress is not None and time.monotonic() - started > 2:
                progress(f"explore: {played:,} transitions played, {states:,} states so far")
        ends: Counter[int] = Counter()
        for _, counts in layer.values():
            ends.update(counts)
        witnesses = {_FLAGS[bit]: _replay(bench, bound, start, *prefix)
                     for bit, prefix in sorted(smallest.items())}
    return _table(bound, ends, states, played, witnesses)


def _next(bound: Bound, state: _State) -> Iterator[tuple[int, int]]:
    """Every (holder, tick) that may come next: any holder not done, any tick from now on."""
    for h, position in enumerate(state.positions):
        if position < len(bound.program):
            yield from ((h, tick) for tick in range(state.tick, bound.last_tick + 1))


def _replay(
    bench: _Bench, bound: Bound, state: _State, ticks: tuple[int, ...], holders: tuple[int, ...]
) -> list[list[dict[str, Any]]]:
    """The events of one schedule played again from the start: at the fenced receiver, then
    at the unfenced one."""
    runs: list[list[dict[str, Any]]] = [[], []]
    for tick, h in zip(ticks, holders):
        state, events = bench.play(state, h, bound.step(h, state.positions[h], tick))
        runs[0].append(events[0])
        runs[1].append(events[1])
    return runs


def _table(
    bound: Bound, ends: Counter[int], states: int, played: int, witnesses: dict[str, Any]
) -> dict[str, Any]:
    """What an exploration found, as JSON: schedules, by class at each receiver, and checks."""
    n, size = bound.holders * len(bound.program), len(bound.program)
    orders, ticks = math.factorial(n) // math.factorial(size) ** bound.holders, bound.last_tick

    def having(*bits: int) -> int:
        return sum(count for flags, count in ends.items() if any(flags >> b & 1 for b in bits))

    width, schedules = len(CLASSES), sum(ends.values())
    return {
        "bound": {"holders": bound.holders, "program": [a.value for a in bound.program],
                  "last_tick": ticks, "ttl": bound.ttl},
        "schedules": schedules,
        "formula": f"multinomial({n}; {', '.join([str(size)] * bound.holders)}) x "
                   f"C({n} + {ticks}, {n}) = {orders} x {math.comb(n + ticks, n)}",
        "states": states,
        "transitions": played,
        "classes": {
            receiver: {**{name: having(r * width + c) for c, name in enumerate(CLASSES)},
                       "clean": schedules - having(*range(r * width, (r + 1) * width))}
            for r, receiver in enumerate(("fenced", "unfenced"))
        },
        "violations": {name: having(2 * width + c) for c, name in enumerate(CHECKS)},
        "witnesses": {name: runs[name.startswith("unfenced")]
                      for name, runs in witnesses.items() if name not in CHECKS},
        "failures": {name: {"fenced": runs[0], "unfenced": runs[1]}
                     for name, runs in witnesses.items() if name in CHECKS},
    }


# --- command line ---

EXIT_OK = 0
EXIT_DIFFERENT = 1
EXIT_USAGE = 2
EXIT_FAILED = 3
EXIT_CLOSED_STDOUT = 32  # EPIPE, as CPython's own `python3 -m json.tool` exits on a closed pipe
EXIT_SIGNALLED = 128  # plus the signal's number, the shell's convention: Ctrl-C is 130

# The signals that stop a run as Ctrl-C does: a closed terminal, Ctrl-C, Ctrl-\, kill.
_STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM")
                      if hasattr(signal, name))
_MASKABLE = hasattr(signal, "pthread_sigmask")
_SHOWN_DIFFERENCES = 10
_MAX_EXPECTED_BYTES = 16 * 1024 * 1024  # the evidence is a few kilobytes

# Every exit code and its meaning, exactly as --help prints them and README lists them.
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "success: --check reproduced EXPECTED, or every --explore check held"),
    (EXIT_DIFFERENT, (
        f"--check differs from EXPECTED: the first {_SHOWN_DIFFERENCES} differing JSON paths, "
        "verdicts first (--output is still written); or an --explore check failed: the first "
        "failing schedule")),
    (EXIT_USAGE, (
        "bad arguments, or a file or stdout that cannot be read or written: one line on "
        "stderr, nothing written")),
    (EXIT_FAILED, "a scenario failed or hung; the scenario and the step are named"),
    (EXIT_CLOSED_STDOUT, "stdout was closed before the report was written (| true); quiet"),
    *((EXIT_SIGNALLED + number, (
        f"stopped by {signal.Signals(number).name}: workers stopped, temporary folders "
        "removed, nothing written")) for number in _STOP_SIGNALS),
)


class _UsageError(Exception):
    """Bad arguments or files: exit 2 with one line."""


# main() notes each stop signal here, and the run stops at its next wait, so that a stop
# never lands in the middle of making or removing something, nor inside a finalizer.
_STOPPED: list[int] = []


def _stop_if_asked() -> None:
    """End the run here, as Ctrl-C does, if main() has noted a stop signal."""
    if _STOPPED:
        raise KeyboardInterrupt


@contextlib.contextmanager
def _held() -> Iterator[None]:
    """Hold the stop signals back while the block runs; one sent meanwhile arrives after it.

    Processes started in the block inherit the hold (see _worker).
    """
    before = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS) if _MASKABLE else None
    try:
        yield
    finally:
        if before is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker, which removes the semaphores behind Events
    and Queues, with the stop signals held: it keeps the hold, so a stop sent to the whole
    process group spares it.  (Started by the first Event instead, it would also let SIGINT
    and SIGTERM through again in the middle of a held block.)"""
    if _MASKABLE:
        from multiprocessing import resource_tracker

        with _held():
            resource_tracker.ensure_running()


def _hold_for_good() -> None:
    """Hold the stop signals back from now on, the interpreter's exit included."""
    if _MASKABLE:
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)


def _parser() -> "argparse.ArgumentParser":
    import argparse
    import textwrap

    class Parser(argparse.ArgumentParser):
        def print_help(self, file: Any = None) -> None:
            _say(self.format_help().rstrip("\n"))  # argparse drops a write that fails

        def error(self, message: str) -> Any:  # one line, for scripts to show as it is
            self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")

    exit_codes = "".join(
        textwrap.fill(meaning, 88, initial_indent=f"  {code:<5}", subsequent_indent=" " * 7)
        + "\n" for code, meaning in EXIT_CODES
    )
    parser = Parser(
        prog="run_experiment.py",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Replay the lease scenarios (unfenced receiver, fenced receiver, and the gap\n"
        "between a lease's expiry and the receiver's observation of a newer epoch) with\n"
        "spawned processes, and write the evidence as canonical JSON to stdout or PATH.\n"
        "A timeline a person can read goes to stderr.",
        epilog=f"exit codes:\n{exit_codes}\nexamples:\n"
        "  python3 run_experiment.py --check results.json --output reproduced.json\n"
        "  python3 run_experiment.py --output results.json   # regenerate the evidence\n"
        "  python3 run_experiment.py --explore --holders 3 --last-tick 4",
    )
    parser.add_argument("--check", metavar="EXPECTED", help="compare the run with this "
                        f"evidence file (a regular file of at most {_MAX_EXPECTED_BYTES >> 20} "
                        "MiB); key order and whitespace do not matter")
    parser.add_argument("--output", metavar="PATH", help="write the evidence, or the table of "
                        "--explore, as JSON to this regular file, replacing it whole, or creating "
                        "it; a symlink's target is replaced and the link kept (default: the "
                        "evidence to stdout; --explore prints its report there instead)")
    explore = parser.add_argument_group(
        "exploring every schedule", "instead of the scenarios, play every schedule of a bound "
        "on the real code, in this process, and count what happened")
    explore.add_argument("--explore", action="store_true", help="explore the bound below")
    explore.add_argument("--holders", type=int, choices=range(1, 9), metavar="N",
                         help=f"holders A, B, ... (1 to 8, default: {Bound.holders})")
    explore.add_argument("--program", nargs="+", choices=[a.value for a in Action],
                         metavar="ACTION", help="what each holder does, in order (default: "
                         f"{' '.join(a.value for a in Bound.program)})")
    explore.add_argument("--last-tick", type=int, choices=range(100), metavar="T",
                         help=f"ticks 0 to T (0 to 99, default: {Bound.last_tick})")
    explore.add_argument("--ttl", type=int, choices=range(1, 100), metavar="N",
                         help=f"ticks a lease lasts (1 to 99, default: {Bound.ttl})")
    return parser


def _read_expected(path: str) -> object:
    """The parsed --check file: a bounded regular file of JSON, no key repeated in an object."""
    # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _UsageError(f"expected evidence {path!r} is not a regular file")
        with open(fd, "rb", closefd=False) as file:
            data = file.read(_MAX_EXPECTED_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > _MAX_EXPECTED_BYTES:
        raise _UsageError(f"expected evidence {path!r} is more than {_MAX_EXPECTED_BYTES} bytes")

    def no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for key, value in pairs:
            if key in found:
                raise _UsageError(f"expected evidence {path!r} has the key {key!r} twice")
            found[key] = value
        return found

    def not_json(constant: str) -> NoReturn:
        raise ValueError(f"{constant} is not JSON")

    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=no_repeats,
                          parse_constant=not_json)
    except (ValueError, RecursionError) as exc:  # JSON and UTF-8 errors are ValueErrors
        raise _UsageError(f"expected evidence {path!r} is not JSON: {exc}") from None


def _output_target(path: str, check: str | None) -> str:
    """The regular file that --output PATH will replace (a symlink's target), checked now."""
    if not path or path.endswith((os.sep, os.altsep or os.sep)):
        raise _UsageError(f"--output must name a file, got {path!r}")
    target = os.path.realpath(path)  # the link stays; what it points to gets the evidence
    if os.path.islink(target):  # resolving it went round in a loop
        raise _UsageError(f"cannot write {path!r}: its symbolic links go round in a loop")
    try:
        status: os.stat_result | None = os.stat(target)  # os.path.exists would hide errors
    except FileNotFoundError:
        status = None
    if status is not None:
        if not stat.S_ISREG(status.st_mode):
            raise _UsageError(f"cannot write {path!r}: it is not a regular file")
        if check is not None and os.path.samestat(status, os.stat(check)):
            raise _UsageError(f"--output {path!r} is the --check file it is compared with")
        for fd, name in ((1, "stdout"), (2, "stderr")):  # /dev/stdout, say
            with contextlib.suppress(OSError):  # closed
                if os.path.samestat(status, os.fstat(fd)):
                    raise _UsageError(f"--output {path!r} is {name}, where this program writes")
        if not os.access(target, os.W_OK):  # a rename would replace it all the same
            raise _UsageError(f"cannot write {path!r}: permission denied")
    return target


def _stage(target: str, cleanup: contextlib.ExitStack) -> tuple[str, str]:
    """`target`, and an empty file beside it, made before the run, so that a folder that cannot
    take the output is refused then; removed at the end, unless it was renamed into place."""
    try:
        fd, staged = tempfile.mkstemp(dir=os.path.dirname(target), suffix=".tmp")
    except OSError as exc:  # named by the file the user gave, not by a temporary one
        raise OSError(exc.errno, exc.strerror, target) from None
    os.close(fd)
    cleanup.callback(_remove, staged)
    return target, staged


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):  # gone already once renamed
        os.unlink(path)


def _replace(target: str, staged: str, text: str) -> None:
    """Write `text` to `staged`, then rename it over `target`: the output whole or not at all.

    An existing file keeps its mode; a new one gets what the umask allows, as any new file.
    """
    umask = os.umask(0o077)  # reading the umask means setting it: put it straight back
    os.umask(umask)
    mode = stat.S_IMODE(os.stat(target).st_mode) if os.path.exists(target) else 0o666 & ~umask
    try:
        with open(staged, "w", encoding="ascii", newline="\n") as file:
            os.chmod(file.fileno(), mode)
            file.write(text)
        os.replace(staged, target)
    except OSError as exc:  # named by the file the user gave, not by a temporary one
        raise OSError(exc.errno, exc.strerror, target) from None


def _say(text: str) -> None:
    """Write a line of the report to stdout; OSError if it will not take it."""
    if sys.stdout is None:  # its file descriptor was closed before Python started
        raise OSError("stdout is closed")
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as exc:  # full, closed meanwhile, or it cannot encode the text
        raise OSError(f"cannot write to stdout: {exc}") from None


def _note(text: str) -> None:
    """Write a line to stderr, if it takes it: a diagnostic never changes the exit code."""
    with contextlib.suppress(AttributeError, OSError, ValueError):  # None, full, closed
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: the exit code, one of EXIT_CODES.

    main() is the program.  It notes the stop signals rather than be interrupted by them: the
    first ends the run at its next wait (see _stop_if_asked), once what it made is removed.
    On its way out it holds them for good, so that a late one cannot change the exit status.
    """
    _STOPPED.clear()
    for number in _STOP_SIGNALS:
        if signal.getsignal(number) is not signal.SIG_IGN:  # nohup, a script's background job
            signal.signal(number, lambda number, frame: _STOPPED.append(number))
    try:
        return _main(argv)
    except KeyboardInterrupt:
        number = _STOPPED[0] if _STOPPED else signal.SIGINT
        _note(f"run_experiment.py: stopped by {signal.Signals(number).name}; every worker was "
              "stopped, every temporary folder removed, and nothing was written")
        return EXIT_SIGNALLED + number
    except BrokenPipeError:  # the reader has gone (| true): end quietly, as json.tool does
        with contextlib.suppress(AttributeError, OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_CLOSED_STDOUT
    except (OSError, _UsageError) as exc:  # a file, a folder, or stdout
        where = getattr(exc, "filename", None)
        where = f"{os.fsdecode(where)!r}: " if isinstance(where, (str, bytes)) else ""
        _note(f"run_experiment.py: error: {where}{getattr(exc, 'strerror', None) or exc}")
        return EXIT_USAGE
    finally:
        _hold_for_good()


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    bound = {"holders": args.holders, "last_tick": args.last_tick, "ttl": args.ttl,
             "program": args.program and tuple(map(Action, args.program))}
    bound = {name: value for name, value in bound.items() if value is not None}
    if bound and not args.explore:
        raise _UsageError("--holders, --program, --last-tick and --ttl go with --explore")
    if args.explore and args.check is not None:
        raise _UsageError("--explore has nothing to compare with --check")
    try:
        os.getcwd()  # the workers start there, and relative paths are read from it
    except OSError:
        raise _UsageError("the working folder no longer exists: change to one that does") from None
    expected = None if args.check is None else _read_expected(args.check)
    timelines: list[str] = []  # the scenarios', for stderr
    with contextlib.ExitStack() as cleanup:
        output = None  # the file --output replaces, and the one staged beside it
        if args.output is not None:
            output = _stage(_output_target(args.output, args.check), cleanup)
        if args.explore:
            started = time.monotonic()
            document = explore(Bound(**bound), progress=_note)
            code, report = _explored(document, time.monotonic() - started)
        else:
            try:
                document = run_scenarios()
            except ExperimentError as exc:
                _stop_if_asked()  # a stop sent to the whole group may have ended a worker: the
                # engine reports it as a failure, but it was a stop
                _note(f"run_experiment.py: failed: {exc}")
                return EXIT_FAILED
            code, report = _compared(expected, document, args.check)
            timelines = [timeline(record) for record in document["scenarios"]]
        _stop_if_asked()  # the last moment a stop ends the run
        # From here on the stop signals are held: a write to a slow stdout is neither cut
        # short (Python drops the rest of an interrupted unbuffered write) nor interrupted.
        _hold_for_good()
        text = canonical_json(document)
        # The report first: if stdout will not take it, the output is not put in place.
        if report or output is None:
            _say(report or text.rstrip("\n"))
        if output is not None:
            _replace(*output, text)
    for lines in timelines:  # last: a failure to write above is then one line alone
        _note(lines)
    return code


def _compared(expected: object, document: dict[str, Any], check: str | None) -> tuple[int, str]:
    """The exit code and the report of comparing `document` with the --check file's."""
    if check is None:
        return EXIT_OK, ""
    found = sorted(differences(expected, json.loads(canonical_json(document))),
                   key=lambda difference: _meaning_first(difference[0]))
    if not found:
        scenarios = len(document["scenarios"])
        return EXIT_OK, f"reproduced: this run matches {check!r} ({scenarios} scenarios)"
    more = len(found) - _SHOWN_DIFFERENCES
    return EXIT_DIFFERENT, "\n".join([
        f"differs: this run does not match {check!r} at {len(found)} JSON path(s):",
        *(f"  {path}: expected {_shown(want)}, got {_shown(got)}"
          for path, want, got in found[:_SHOWN_DIFFERENCES]),
        *([f"  ... and {more} more"] if more > 0 else []),
    ])


def _explored(table: dict[str, Any], seconds: float) -> tuple[int, str]:
    """The exit code and the report of an exploration: its table, and its smallest schedules."""
    bound, classes = table["bound"], table["classes"]
    failed = [name for name, count in table["violations"].items() if count]
    lines = [
        (f"every schedule of {bound['holders']} holders, each: {' '.join(bound['program'])}; "
         f"ticks 0 to {bound['last_tick']}, ttl {bound['ttl']}"),
        f"  {table['schedules']:,} schedules = {table['formula']}",
        (f"  {table['states']:,} states, {table['transitions']:,} transitions played on the "
         f"real code, {seconds:.1f} s"),
        f"  {'schedules with':<22}{'fenced':>12}{'unfenced':>12}",
        *(f"  {name:<22}{classes['fenced'][name]:>12,}{classes['unfenced'][name]:>12,}"
          for name in classes["fenced"]),
        f"  checks failed: {', '.join(failed) or 'none'} (of: {', '.join(CHECKS)})",
    ]
    shown = [(f"the smallest {name}", name.split()[0], table["witnesses"][name])
             for name in ("unfenced lost update", "fenced stale refused", "fenced gap")
             if name in table["witnesses"]]
    if failed:  # the smallest schedule that fails the first check, at both receivers
        failure = table["failures"][failed[0]]
        shown = [(f"the first schedule failing {failed[0]!r}", receiver, failure[receiver])
                 for receiver in ("fenced", "unfenced")]
    for title, receiver, events in shown:
        verdict = judge([e for e in events if not e["outcome"].startswith("raised")])
        lines.append(timeline({"name": title, "receiver": receiver, "events": events,
                               "verdict": verdict}))
    return (EXIT_DIFFERENT if failed else EXIT_OK), "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
