"""Replay the lease scenarios with spawned processes, and write the evidence as canonical JSON.

A scenario is data: a timeline of steps, each saying which worker acquires, renews, checks,
writes or releases at which tick.  The engine spawns one worker process per actor and gives
every step an Event of its own.  A worker waits on its next step's Event, performs that one
step against the scenario's SQLite database, and puts its report on its Queue.  The engine
sets one Event at a time and waits for that step's report (and, after a worker's last step,
for the worker to exit with code 0) before it sets the next, so the order of events comes
from these handshakes alone, never from timing (see _play).  Every wait is bounded; nothing
sleeps.
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
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

from leases import (
    Lease,
    LeaseAuthority,
    LeaseHeld,
    LeaseLost,
    Outcome,
    Receiver,
    is_live,
)

if TYPE_CHECKING:  # only for annotations: the spawn context makes the real objects
    import argparse
    from multiprocessing.process import BaseProcess
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Event as MPEvent

__all__ = [  # noqa: RUF022 - grouped by who uses them, sorted within
    # the model, the evidence and the command line
    "CLASSES", "EXIT_CODES", "SCENARIOS", "Action", "Answer", "Class", "Event", "ExperimentError",
    "Scenario", "Step", "Write", "canonical_json", "classes", "differences", "judge", "main",
    "run_scenarios", "timeline",
    # what explore.py shares: one step, and the command line's plumbing
    "EXIT_DIFFERENT", "EXIT_OK", "MISSING", "RESOURCE", "SHARED_EXIT_CODES", "STOP_SIGNALS",
    "command", "make_parser", "note", "output_target", "perform", "publish", "scratch",
    "stop_if_asked", "write",
    # seams of the engine, public for the suite, which breaks and watches each of them
    "Orders", "Play", "Report", "exit_problem", "holding_signals", "noted_stops", "release_step", "run_worker",
    "serve", "start_resource_tracker", "take_report",
]

RESOURCE = "quarterly-report"
DEFAULT_TIMEOUT = 60.0  # seconds: only bounds a hung step; no step waits for it to pass


# --- the model: steps and scenarios ---



class Action(str, enum.Enum):
    ACQUIRE = "acquire"  # ask the authority for a lease for `ttl` ticks
    RENEW = "renew"  # ask the authority to extend the actor's lease to `tick + ttl`
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

    def __post_init__(self) -> None:
        wants_ttl = self.action in (Action.ACQUIRE, Action.RENEW)
        if not isinstance(self.action, Action) or not isinstance(self.actor, str):
            raise TypeError(f"step {self!r}: actor must be a str and action an Action")
        if not self.actor or not _is_tick(self.tick):
            raise ValueError(f"step {self!r}: actor must not be empty, tick must be an int "
                             "from 0 to 2**63 - 1")
        if wants_ttl != (_is_tick(self.ttl) and self.ttl != 0):
            raise ValueError(f"step {self!r}: acquire and renew need a ttl (an int from 1 to "
                             "2**63 - 1), other actions none")
        if (self.action is Action.WRITE) != isinstance(self.value, str):
            raise ValueError(f"step {self!r}: a write needs a value (a str), other actions none")

    def __str__(self) -> str:
        return f"{self.actor} {self.action.value} at tick {self.tick}"


_TOP_TICK = 2**63 - 1  # SQLite's largest integer


def _is_tick(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _TOP_TICK


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
                raise ValueError(f"{where}, step {index} ({step}): tick {step.tick} comes before "
                                 f"tick {before.tick} of the step before it; ticks never go back")

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


# --- one step, as the engine's workers and explore.py perform it ---


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
class Event:
    """One step as the evidence records it: what the actor did, at which tick, and the answer.

    `outcome` is an Answer, the receiver's Outcome for a write, or (explore.py only) another
    receiver's answer.  The fields that do not apply are None: `expires_at` belongs to a
    lease's answer, `value` and the stored pair to a write's.
    """

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
           expires_at: int | None = None) -> "Event":
        """The event of `step`, answered `outcome`, about the lease at `epoch`."""
        return cls(step.actor, step.action, step.tick, outcome, epoch, expires_at)

    def as_json(self) -> dict[str, Any]:
        """The event as results.json holds it: every field present, null where it does not
        apply, and the action and outcome as their text."""
        return {"actor": self.actor, "action": self.action.value, "tick": self.tick,
                "epoch": self.epoch, "expires_at": self.expires_at, "value": self.value,
                "outcome": getattr(self.outcome, "value", self.outcome),
                "stored_epoch": self.stored_epoch, "stored_value": self.stored_value}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Event":
        return cls(**{**data, "action": Action(data["action"])})


def perform(
    step: Step, lease: Lease | None, authority: LeaseAuthority, receiver: Receiver,
    resource: str = RESOURCE,
) -> tuple[Lease | None, Event]:
    """Perform `step` for an actor holding `lease`; its lease afterwards, and the event.
    The workers perform every step through this, and so does explore.py.  An acquisition is
    of `resource`; every other step acts on the resource of the lease it holds.

    An actor knows only what it was told: a refused acquisition leaves its lease as it was, a
    lost renewal, a failed check or a release leaves it none, and a write goes out with
    whatever lease it holds, expired or not: only a check asks the authority about the time.
    """
    if step.action is Action.ACQUIRE:
        assert step.ttl is not None  # Step checked it
        try:
            lease = authority.acquire(resource, step.actor, now=step.tick, ttl=step.ttl)
        except LeaseHeld as held:
            return lease, Event.of(step, Answer.HELD, held.lease.epoch, held.lease.expires_at)
        return lease, Event.of(step, Answer.GRANTED, lease.epoch, lease.expires_at)
    if lease is None:  # it never got one, lost it, or gave it back
        return None, Event.of(step, Answer.NO_LEASE)
    if step.action is Action.WRITE:
        return lease, write(step, lease, receiver)
    if step.action is Action.CHECK:  # a transaction of its own: a takeover may follow at once
        current = authority.current(lease.resource, now=step.tick)
        if current is None or (current.epoch, current.holder) != (lease.epoch, lease.holder):
            return None, Event.of(step, Answer.LOST, lease.epoch)
        return lease, Event.of(step, Answer.LIVE, lease.epoch, current.expires_at)
    try:
        if step.action is Action.RENEW:
            assert step.ttl is not None  # Step checked it
            lease = authority.renew(lease, now=step.tick, ttl=step.ttl)
            return lease, Event.of(step, Answer.RENEWED, lease.epoch, lease.expires_at)
        authority.release(lease)
        return None, Event.of(step, Answer.RELEASED, lease.epoch)
    except LeaseLost:
        return None, Event.of(step, Answer.LOST, lease.epoch)


def write(step: Step, lease: Lease, receiver: Any) -> Event:
    """Send the value of a write `step` to `receiver` (a Receiver, or any object whose
    `write(resource, epoch, value)` answers as one does), with the resource and epoch of
    `lease`."""
    assert step.value is not None  # Step checked it
    result = receiver.write(lease.resource, lease.epoch, step.value)
    return Event(step.actor, step.action, step.tick, result.outcome, result.epoch, None,
                 result.value, result.stored_epoch, result.stored_value)


# --- the judge: each class of a write, written once, for the scenarios and explore.py ---


class Write(NamedTuple):
    """A write as the judge sees it when it is answered: the event, and what came before."""

    event: Event
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
    """A class of write: its name (explore.py's column), what it is in README's words, whether
    it is harm, protection or neither, the verdict field of results.json that counts it (None:
    the explorer's only), and its rule.  Each is written here once; the scenarios' verdict and
    the explorer use them."""

    name: str
    says: str
    kind: str
    field: str | None
    rule: Callable[[Write], bool]


# Refused at explore.AskingReceiver too: "not live" is its answer to a late write.
_REFUSED = (Outcome.STALE, Outcome.CONFLICT, "not live")

CLASSES = (
    Class("lost update", "a lower epoch applied over a higher one", "harm",
          "newer_write_overwritten_by_older_epoch", lambda w: w.applied and w.below_stored),
    Class("stale refused", "a lower epoch refused", "protection", "stale_writes_refused",
          lambda w: w.event.outcome == Outcome.STALE),
    Class("superseded applied", "applied below the newest grant", "harm",
          "write_with_superseded_epoch_applied", lambda w: w.applied and w.superseded),
    Class("gap", "superseded applied, not a lost update", "harm", None,
          lambda w: w.applied and w.superseded and not w.below_stored),
    Class("late applied", "applied at or after its lease's expiry", "neither",
          "write_after_lease_expiry_applied", lambda w: w.applied and w.late),
    Class("late, not superseded", "late applied, no newer grant", "neither", None,
          lambda w: w.applied and w.late and not w.superseded),
    Class("replay", "the same epoch and value again", "neither", None,
          lambda w: w.event.outcome == Outcome.REPLAY),
    Class("conflict", "the same epoch, another value: refused", "neither",
          "conflicting_writes_refused", lambda w: w.event.outcome == Outcome.CONFLICT),
    Class("late refused, not superseded", "refused after expiry, no newer grant", "neither",
          None, lambda w: w.event.outcome in _REFUSED and w.late and not w.superseded),
)
# The verdict's counted fields; the others say whether it happened at all.
_COUNTED = ("stale_writes_refused", "conflicting_writes_refused")


def classes(write: Write) -> list[bool]:
    """Whether `write` falls in each of CLASSES, in their order."""
    return [cls.rule(write) for cls in CLASSES]


def judge(events: Sequence[Event]) -> dict[str, Any]:
    """The verdict on a run, from its events alone: what went wrong, if anything, and who won.

    `because` holds, for each field, the indices (into `events`) of the events that made it
    what it is, so that every field can be checked against the events by hand.  An applied
    write whose actor was never granted a lease, or a lease without its epoch or expiry, is
    malformed: ValueError names it.
    """
    fields = [cls.field for cls in CLASSES if cls.field is not None]
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
            for cls, found in zip(CLASSES, classes(answered)):
                if found and cls.field is not None:
                    because[cls.field].append(index)
            if answered.applied:  # only an applied write changes what is stored
                stored, because["final_value_written_by"] = event.epoch, [index]
    final = because["final_value_written_by"]
    return {
        **{field: len(because[field]) if field in _COUNTED else bool(because[field])
           for field in fields},
        "final_value_written_by": events[final[0]].actor if final else None,
        "because": because,
    }


# --- the engine: scenarios played by spawned workers ---


class ExperimentError(Exception):
    """A scenario failed or hung; `scenario` and `step` say where."""

    def __init__(self, scenario: str, step: str, problem: str) -> None:
        super().__init__(f"scenario {scenario!r}, {step}: {problem}")
        self.scenario = scenario
        self.step = step
        self.problem = problem

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.scenario, self.step, self.problem)


# A worker's report of one step: (its actor, the event, None), or (actor, None, the problem).
Report = tuple[str, Event | None, str | None]


@dataclass(frozen=True)
class Play:
    """A scenario ready to play: its database, one Event per step, and for each actor its
    worker and the Queue it reports on."""

    scenario: Scenario
    db_path: str
    released: list["MPEvent"]
    reports: dict[str, "Queue[Report]"]
    workers: dict[str, "BaseProcess"]


def run_scenarios(
    scenarios: Sequence[Scenario] = SCENARIOS, *, timeout: float = DEFAULT_TIMEOUT
) -> dict[str, Any]:
    """Play `scenarios`, one after another, and return the evidence document.

    Every worker of every scenario is started first, so that their interpreters start
    together.  Every worker has ended and every scenario's folder is gone before this returns
    or raises: when a scenario fails (ExperimentError), and when the run is interrupted.
    """
    backstop = timeout * (sum(len(s.steps) + 1 for s in scenarios) + 1)
    context = multiprocessing.get_context("spawn")
    start_resource_tracker()
    with contextlib.ExitStack() as cleanup:
        folder = scratch(cleanup, "leases-experiment-")
        plays = [  # kept to the end: a worker still starting up needs its Events to exist
            _start(scenario, os.path.join(folder, f"{number}.sqlite3"), context, backstop, cleanup)
            for number, scenario in enumerate(scenarios)
        ]
        return {"scenarios": [_play(play, timeout) for play in plays]}


# --- the handshake: the engine's side, then the worker's ---


def _play(play: Play, timeout: float) -> dict[str, Any]:
    """The choreography.  For each step in turn: set its Event, which releases it to its
    worker; take the worker's report of it; and after the worker's last step, require that
    it has exited with code 0, so that what it leaves behind is only what it committed.  The
    next step is released only then.  Each wait is bounded by `timeout`."""
    events = []
    for index, step in enumerate(play.scenario.steps):
        worker = play.workers[step.actor]
        event, problem = None, release_step(play.released[index], worker, timeout)
        if problem is None:
            _, event, problem = take_report(play, step.actor, timeout)
        if problem is None and all(later.actor != step.actor
                                   for later in play.scenario.steps[index + 1 :]):
            problem = exit_problem(worker, timeout)
        if event is None or problem is not None:  # it failed, hung or died
            raise ExperimentError(play.scenario.name, f"step {index} ({step})",
                                  f"worker {step.actor}: {problem}")
        events.append(event)
    return _record(play.scenario, play.db_path, events)


def release_step(released: "MPEvent", worker: "BaseProcess", timeout: float) -> str | None:
    """Set `released`: None, or why that did not happen within `timeout`.

    Setting a multiprocessing Event waits until every process asleep on it has woken, and a
    worker killed in its sleep never wakes.  So a thread of its own sets it, and the engine
    waits for that thread in slices of 0.1 s, to notice, that soon, a stop that main() has
    noted, or the worker dead.  A thread left waiting ends with the process.
    """
    setter = threading.Thread(target=released.set, daemon=True)
    setter.start()
    deadline = time.monotonic() + timeout
    while True:
        stop_if_asked()
        setter.join(min(0.1, timeout))
        if not setter.is_alive():
            return None
        if not worker.is_alive():
            return f"ended without a report, exit code {worker.exitcode}"
        if time.monotonic() >= deadline:
            return f"its step could not be released within {timeout:g} s"


def take_report(play: Play, actor: str, timeout: float) -> Report:
    """The next report, or one saying why none came: within `timeout`, or from a dead worker.

    The wait is cut into slices of 0.1 s to notice, that soon, a stop that main() has noted,
    or that `actor`'s worker died without a word (killed, or it could not even start).
    """
    worker, deadline = play.workers[actor], time.monotonic() + timeout
    while True:
        stop_if_asked()
        try:
            return play.reports[actor].get(timeout=min(0.1, timeout))
        except queue.Empty:
            if not worker.is_alive() and play.reports[actor].empty():
                return actor, None, f"ended without a report, exit code {worker.exitcode}"
            if time.monotonic() >= deadline:
                return actor, None, f"no report within {timeout:g} s"


def exit_problem(worker: "BaseProcess", timeout: float) -> str | None:
    """None once `worker` has exited with code 0; else, within `timeout`, why it did not.

    The wait is cut into slices of 0.1 s, as take_report's is, to notice a noted stop that soon.
    """
    deadline = time.monotonic() + timeout
    while worker.exitcode is None:
        stop_if_asked()
        worker.join(min(0.1, timeout))
        if worker.exitcode is None and time.monotonic() >= deadline:
            return f"did not exit within {timeout:g} s of its last report"
    if worker.exitcode != 0:
        return f"exited with code {worker.exitcode} after its last report"
    return None


@dataclass(frozen=True)
class Orders:
    """All a worker is told, in its one argument: its scenario's database and receiver, its
    actor and the (index, step) of each of its steps, the Event of every step of the scenario,
    its Queue to report on, the bound of each wait, and the process id of its engine."""

    db_path: str
    fenced: bool
    actor: str
    script: Sequence[tuple[int, Step]]
    released: Sequence["MPEvent"]
    reports: "Queue[Report]"
    backstop: float
    engine: int


def run_worker(orders: Orders) -> None:
    """A worker process: perform each step of its script once that step's Event is set, and
    report each.

    A failure is reported as text, since an arbitrary exception may not survive pickling.
    `backstop` bounds each wait, in case the engine hangs; the engine's process gone, the
    worker ends at once.  The worker removes nothing: the engine owns the scenario's folder.
    """
    # Stopping is the engine's: it kills its workers itself, so that Ctrl-C, sent to the whole
    # process group, ends the run once, in one line.  The engine started this process with the
    # stop signals held; one pending is dropped here.  SIGTERM stays fatal, but as an exit that
    # unwinds, a transaction under way rolled back and the database closed.
    for number in STOP_SIGNALS:
        signal.signal(number, _exit_on_sigterm if number == signal.SIGTERM else signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    serve(orders)
    # After a worker's last step, the engine waits for it to be gone before it releases the
    # next: once the reports are flushed, skip the interpreter's own exit, which takes longer
    # than the step.
    os._exit(0)


def serve(orders: Orders) -> None:
    """The worker's work, up to its exit: each step of its script performed and reported."""
    reports = orders.reports
    try:
        with LeaseAuthority(orders.db_path) as authority, \
                Receiver(orders.db_path, fenced=orders.fenced) as receiver:
            lease = None
            for index, step in orders.script:
                _wait_for_release(orders.released[index], orders.backstop, orders.engine)
                lease, event = perform(step, lease, authority, receiver)
                reports.put((orders.actor, event, None))
    except Exception as exc:  # noqa: BLE001 - whatever it was, the engine must hear of it
        reports.put((orders.actor, None, f"{type(exc).__name__}: {exc}"))
    reports.close()
    reports.join_thread()


def _wait_for_release(released: "MPEvent", backstop: float, engine: int) -> None:
    """Wait until the engine sets `released`; TimeoutError after `backstop` seconds.

    The wait is cut into slices of 0.1 s to notice, that soon, that the engine is gone (killed
    outright, as by the OOM killer): this process then has a new parent, and ends at once, so
    that it does not keep the caller's pipes open (`| cat` would wait for it).
    """
    deadline = time.monotonic() + backstop
    while not released.wait(0.1):
        if os.getppid() != engine:
            os._exit(EXIT_FAILED)  # nobody is left to read a report
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not released within {backstop:g} s")


def _exit_on_sigterm(number: int, frame: object) -> NoReturn:
    raise SystemExit(EXIT_SIGNALLED + number)


def _start(
    scenario: Scenario,
    db_path: str,
    context: multiprocessing.context.SpawnContext,
    backstop: float,
    cleanup: contextlib.ExitStack,
) -> Play:
    """Start the scenario's workers, each waiting for its first step; its first makes the file."""
    # Workers start with the stop signals held, and keep them held until they ignore them.
    with holding_signals():
        released = [context.Event() for _ in scenario.steps]
        # Each worker reports on a Queue of its own: one killed as it wrote a report would
        # hold a shared Queue's lock, and the next worker's report would never come.
        reports: dict[str, Queue[Report]] = {actor: context.Queue() for actor in scenario.actors}
        workers: dict[str, BaseProcess] = {}
        for actor in scenario.actors:
            script = [(i, step) for i, step in enumerate(scenario.steps) if step.actor == actor]
            workers[actor] = context.Process(
                target=run_worker,
                name=f"{scenario.name}:{actor}",
                args=(Orders(db_path, scenario.fenced, actor, script, released, reports[actor],
                             backstop, os.getpid()),),
            )
            cleanup.callback(_stop, workers[actor])  # runs before the folder is removed
            workers[actor].start()  # inherits the hold; see run_worker
    return Play(scenario, db_path, released, reports, workers)


def scratch(cleanup: contextlib.ExitStack, prefix: str) -> str:
    """A new temporary folder, removed by `cleanup`."""
    folder = tempfile.mkdtemp(prefix=prefix)
    cleanup.callback(shutil.rmtree, folder, ignore_errors=True)
    return folder


def _stop(process: "BaseProcess") -> None:
    """Make sure a worker is gone, however its scenario ended: it has nothing to clean up."""
    if process.pid is not None:
        process.kill()
        process.join(5.0)


def _record(scenario: Scenario, db_path: str, events: list[Event]) -> dict[str, Any]:
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
        "events": [event.as_json() for event in events],
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


def timeline(record: dict[str, Any], where: str | None = None) -> str:
    """A few lines a person can read at a glance: who did what at which tick, and the result.
    `where` says whose answers they are (by default, the record's receiver's)."""
    lines = [f"{record['name']} ({where or record['receiver'] + ' receiver'})"]
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
    lines.extend(f"  {cls.name}: {cls.says} ({cls.field})" for cls in CLASSES
                 if cls.field is not None and verdict.get(cls.field) is True)
    return "\n".join(lines)


MISSING = object()


def differences(
    expected: object, actual: object, path: str = "$"
) -> Iterator[tuple[str, Any, Any]]:
    """Yield (JSON path, expected, actual) wherever two parsed JSON documents differ."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(expected.keys() | actual.keys()):
            step = f".{key}" if key.isidentifier() else f"[{json.dumps(key)}]"
            yield from differences(
                expected.get(key, MISSING), actual.get(key, MISSING), path + step
            )
    elif isinstance(expected, list) and isinstance(actual, list):
        for i in range(max(len(expected), len(actual))):
            yield from differences(
                expected[i] if i < len(expected) else MISSING,
                actual[i] if i < len(actual) else MISSING,
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
    try:
        text = "(missing)" if value is MISSING else json.dumps(value, sort_keys=True)
    except RecursionError:  # parsed at the parser's limit, it is too deep for the encoder
        text = "[...]" if isinstance(value, list) else "{...}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- command line: shared with explore.py ---

EXIT_OK = 0
EXIT_DIFFERENT = 1
EXIT_USAGE = 2
EXIT_FAILED = 3
EXIT_CLOSED_STDOUT = 32  # EPIPE, as CPython's own `python3 -m json.tool` exits on a closed pipe
EXIT_UNEXPECTED = 70  # EX_SOFTWARE of sysexits.h: not 1, which says what the run found
EXIT_SIGNALLED = 128  # plus the signal's number, the shell's convention: Ctrl-C is 130

# The signals that stop a run as Ctrl-C does: a closed terminal, Ctrl-C, kill.
STOP_SIGNALS: tuple[int, ...] = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)
_SHOWN_DIFFERENCES = 10

# The exit codes every command of this project shares, after its own 0, 1 and 3.
SHARED_EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_USAGE, ("bad arguments, or a file or stdout that cannot be read or written: one line "
                  "on stderr")),
    (EXIT_CLOSED_STDOUT, "stdout was closed by its reader (| true); quiet"),
    (EXIT_UNEXPECTED, ("an unexpected error (a bug, or a starved machine): one line on stderr "
                       "naming it")),
    *((EXIT_SIGNALLED + number, (f"stopped by {signal.Signals(number).name}: nothing left "
                                 "behind, --output untouched"))
      for number in STOP_SIGNALS),
)
# Every exit code and its meaning, exactly as --help prints them and README lists them.
EXIT_CODES: tuple[tuple[int, str], ...] = tuple(sorted((
    (EXIT_OK, "success: the run reproduced EXPECTED, or there was nothing to compare"),
    (EXIT_DIFFERENT, (f"the run differs from EXPECTED: the first {_SHOWN_DIFFERENCES} "
                      "differing JSON paths, verdicts first (--output is still written)")),
    (EXIT_FAILED, "a scenario failed or hung; the scenario and the step are named"),
    *SHARED_EXIT_CODES,
)))


class _UsageError(Exception):
    """Bad arguments or files: exit 2 with one line."""


# command() notes each stop signal here, and the run stops at its next wait (stop_if_asked),
# so that a stop never lands in the middle of making or removing something.
_STOPPED: list[int] = []


def noted_stops() -> tuple[int, ...]:
    """The stop signals command() has noted in this run, in order: public, so that a program
    that calls main() in its own process (the test suite) can heed a Ctrl-C noted there."""
    return tuple(_STOPPED)


def stop_if_asked() -> None:
    """End the run here, as Ctrl-C does, if a stop signal has been noted."""
    if _STOPPED:
        raise KeyboardInterrupt


@contextlib.contextmanager
def holding_signals() -> Iterator[None]:
    """Hold the stop signals back while the block runs; processes started in it inherit the hold."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker, which removes the semaphores behind Events
    and Queues, with the stop signals held: it keeps the hold, so that a stop sent to the whole
    process group spares it.  (Started by the first Event instead, it would let SIGINT and
    SIGTERM through again in the middle of a held block, to the workers started next.)"""
    from multiprocessing import resource_tracker

    with holding_signals():
        resource_tracker.ensure_running()


def command(prog: str, run: Callable[[], int]) -> int:
    """Run a command's body `run` as a program, and return its exit code.

    The stop signals are only noted (a signal ignored from the start stays ignored, as in a
    background job): the first ends the run at its next wait, once what it made is removed,
    with one line and 128 plus its number.  One noted after the run changes nothing.
    """
    _STOPPED.clear()
    for number in STOP_SIGNALS:
        if signal.getsignal(number) is not signal.SIG_IGN:
            signal.signal(number, lambda number, frame: _STOPPED.append(number))
    try:
        return run()
    except KeyboardInterrupt:
        number = _STOPPED[0] if _STOPPED else signal.SIGINT
        note(f"{prog}: stopped by {signal.Signals(number).name}; every worker was stopped, "
              "every temporary folder removed, and --output left untouched")
        return EXIT_SIGNALLED + number
    except BrokenPipeError:  # the reader has gone (| true): end quietly, as json.tool does
        return EXIT_CLOSED_STDOUT
    except (OSError, _UsageError) as exc:  # a file, a folder, or stdout
        where = getattr(exc, "filename", None)
        where = f"{os.fsdecode(where)!r}: " if isinstance(where, (str, bytes)) else ""
        note(f"{prog}: error: {where}{getattr(exc, 'strerror', None) or exc}")
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - one line, and a code that claims no verdict
        note(f"{prog}: unexpected error: {type(exc).__name__}: {exc}")
        return EXIT_UNEXPECTED


def output_target(path: str, check: str | None = None) -> str:
    """The regular file that --output PATH will replace (a symlink's target), checked now."""
    if not path or path.endswith(os.sep):
        raise _UsageError(f"--output must name a file, got {path!r}")
    target = os.path.realpath(path)  # the link stays; what it points to gets the output
    try:
        status = os.stat(target)
    except FileNotFoundError:
        return target
    if not stat.S_ISREG(status.st_mode):
        raise _UsageError(f"cannot write {path!r}: it is not a regular file")
    if check is not None and os.path.samestat(status, os.stat(check)):
        raise _UsageError(f"--output {path!r} is the --check file it is compared with")
    return target


def publish(target: str | None, text: str, report: str) -> None:
    """Put `text` in the file `target`, then say `report` on stdout; with neither, say `text`."""
    if target is not None:
        _replace(target, text)
    if report or target is None:
        _say(report or text.rstrip("\n"))


def _replace(target: str, text: str) -> None:
    """Replace `target` with `text`, whole or not at all: a file beside it, renamed over it."""
    umask = os.umask(0o077)  # reading the umask means setting it: put it straight back
    os.umask(umask)
    try:  # an existing file keeps its mode; a new one gets what the umask allows
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~umask
    try:
        fd, staged = tempfile.mkstemp(dir=os.path.dirname(target), suffix=".tmp")
        try:
            with open(fd, "w", encoding="ascii", newline="\n") as file:
                os.chmod(file.fileno(), mode)
                file.write(text)
            os.replace(staged, target)
        except OSError:
            os.unlink(staged)
            raise
    except OSError as exc:  # named by the file the user gave, not by a temporary one
        raise OSError(exc.errno, exc.strerror, target) from None


def _say(text: str) -> None:
    """Write a line to stdout; OSError if it will not take it (BrokenPipeError if closed).

    After a failure, stdout is dropped: what it still buffers would fail again in the
    interpreter's last flush, which then prints a traceback and exits 120.
    """
    if sys.stdout is None:  # started with stdout closed (>&-)
        raise OSError("cannot write to stdout: it is closed")
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        sys.stdout = None
        raise
    except (OSError, ValueError) as exc:  # full, or cannot encode
        sys.stdout = None
        raise OSError(f"cannot write to stdout: {exc}") from None


def note(text: str) -> None:
    """Write a line to stderr, if it takes it: a diagnostic never changes the exit code."""
    with contextlib.suppress(AttributeError, OSError, ValueError):  # closed or full
        sys.stderr.write(text + "\n")  # stderr writes out each line as it ends


def make_parser(
    prog: str, description: str, exit_codes: Sequence[tuple[int, str]], examples: str
) -> "argparse.ArgumentParser":
    """An argument parser whose errors are one line, exit 2, and whose --help lists exit codes."""
    import argparse
    import textwrap

    class Parser(argparse.ArgumentParser):
        def print_help(self, file: Any = None) -> None:
            _say(self.format_help().rstrip("\n"))  # argparse drops a write that fails

        def error(self, message: str) -> Any:  # one line, for scripts to show as it is
            note(f"{self.prog}: error: {message} (see --help)")
            raise SystemExit(EXIT_USAGE)

    codes = "".join(
        textwrap.fill(meaning, 88, initial_indent=f"  {code:<5}", subsequent_indent=" " * 7)
        + "\n" for code, meaning in exit_codes
    )
    return Parser(prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter,
                  description=description, epilog=f"exit codes:\n{codes}\nexamples:\n{examples}")


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: the exit code, one of EXIT_CODES."""
    parser = make_parser(
        "run_experiment.py",
        "Replay the lease scenarios (unfenced receiver, fenced receiver, and the gap\n"
        "between a lease's expiry and the receiver's observation of a newer epoch) with\n"
        "spawned processes, and write the evidence as canonical JSON to stdout or PATH.\n"
        "A timeline a person can read goes to stderr.",
        EXIT_CODES,
        "  python3 run_experiment.py --check results.json --output reproduced.json\n"
        "  python3 run_experiment.py --output results.json   # regenerate the evidence",
    )
    parser.add_argument("--check", metavar="EXPECTED", help="compare the run with this "
                        "evidence file; key order and whitespace do not matter")
    parser.add_argument("--output", metavar="PATH", help="write the evidence to this file, "
                        "replacing it whole, or creating it; a symlink's target is replaced and "
                        "the link kept (default: stdout)")
    return command("run_experiment.py", lambda: _main(parser.parse_args(argv)))


def _main(args: "argparse.Namespace") -> int:
    check, output = args.check, args.output
    expected = None if check is None else _read_expected(check)
    target = None if output is None else output_target(output, check)
    try:
        document = run_scenarios()
    except ExperimentError as exc:
        stop_if_asked()  # a stop sent to the whole group may have ended a worker first
        note(f"run_experiment.py: failed: {exc}")
        return EXIT_FAILED
    stop_if_asked()  # the last moment a stop ends the run
    code, report = _compared(expected, document, check)
    publish(target, canonical_json(document), report)
    for record in document["scenarios"]:
        note(timeline(record))
    return code


def _read_expected(path: str) -> object:
    """The parsed --check file: any file that can be read (a pipe too), holding JSON."""
    with open(path, "rb") as file:
        data = file.read()
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # JSON's and UTF-8's errors, or too deep
        raise _UsageError(f"expected evidence {path!r} is not JSON: {exc}") from None


def _compared(expected: object, document: dict[str, Any], check: str | None) -> tuple[int, str]:
    """The exit code and the report of comparing `document` with the --check file's: ASCII,
    whatever the path, for an ASCII-only stdout (LC_ALL=C on 3.10) takes nothing else."""
    if check is None:
        return EXIT_OK, ""
    found = sorted(differences(expected, json.loads(canonical_json(document))),
                   key=lambda difference: _meaning_first(difference[0]))
    if not found:
        scenarios = len(document["scenarios"])
        return EXIT_OK, f"reproduced: this run matches {check!a} ({scenarios} scenarios)"
    more = len(found) - _SHOWN_DIFFERENCES
    return EXIT_DIFFERENT, "\n".join([
        f"differs: this run does not match {check!a} at {len(found)} JSON path(s):",
        *(f"  {path}: expected {_shown(want)}, got {_shown(got)}"
          for path, want, got in found[:_SHOWN_DIFFERENCES]),
        *([f"  ... and {more} more"] if more > 0 else []),
    ])


if __name__ == "__main__":
    sys.exit(main())
