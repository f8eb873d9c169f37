"""Replay the lease scenarios with spawned processes and write the evidence as canonical JSON.

A scenario is data: a timeline of steps, each saying which worker acquires or writes at which
tick.  The engine spawns one process per worker, with a pipe of its own.  A worker does nothing
until the engine sends it its next step over that pipe; it then performs that one step against
the scenario's SQLite database and reports the result on the same pipe.  The engine releases
one step at a time and waits for its report (and, after a worker's last step, for the worker to
exit) before the next, so the order of events comes from these handshakes alone, never from
timing.  The scenarios have databases of their own and run concurrently, in one wait loop; that
changes no byte of the evidence.

Exit codes: EXIT_CODES below, which --help prints.  A run that fails or is stopped stops all
its workers and writes nothing.
"""

import signal

if __name__ == "__main__" and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    # Until main() takes over, Ctrl-C ends the script at once and silently, not with a
    # traceback from the imports below: nothing has started that would need stopping.
    signal.signal(signal.SIGINT, signal.SIG_DFL)

# argparse and json are imported where they are used: every worker process imports this module
# too, and needs neither.
import contextlib
import enum
import io
import multiprocessing
import multiprocessing.connection
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from leases import Lease, LeaseAuthority, Receiver, WriteResult

if TYPE_CHECKING:  # only for annotations: the spawn context makes the real objects
    import argparse
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

__all__ = [
    "DEFAULT_TIMEOUT",
    "EXIT_CODES",
    "MAX_TIMEOUT",
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
    "run_worker",
    "timeline",
]

EXIT_OK = 0
EXIT_DIFFERENT = 1
EXIT_USAGE = 2
EXIT_FAILED = 3
EXIT_CLOSED_STDOUT = 32  # EPIPE, as CPython's own `python3 -m json.tool` exits on a closed pipe
EXIT_SIGNALLED = 128  # plus the signal's number, the shell's convention: Ctrl-C is 130

# The signals that stop a run as Ctrl-C does, and how a user sends each.  Workers ignore all
# but SIGTERM: the engine stops them itself, so that a signal sent to the whole process group
# ends the run once.
_STOP_SIGNAL_SOURCES = {
    "SIGHUP": "the terminal closed",
    "SIGINT": "Ctrl-C",
    "SIGQUIT": "Ctrl-backslash",
    "SIGTERM": "kill, timeout, a CI runner cancelling a job",
}
_STOP_SIGNALS = tuple(
    getattr(signal, name) for name in _STOP_SIGNAL_SOURCES if hasattr(signal, name)
)

# A report of differences lists this many JSON paths, then says how many more there are.
_SHOWN_DIFFERENCES = 10

# Every exit code and its meaning, exactly as --help prints them and README section 7 lists
# them (.ci/check_contract.py compares the two).
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "success; with --check, the run reproduced EXPECTED"),
    (EXIT_DIFFERENT, (
        "only this: with --check, the run differs from EXPECTED; the first "
        f"{_SHOWN_DIFFERENCES} differing JSON paths are listed, and how many more"
    )),
    (EXIT_USAGE, (
        "bad arguments or files, found before anything runs, or a report that stdout would "
        "not take; one line on stderr, and nothing written"
    )),
    (EXIT_FAILED, (
        "a scenario failed or hung, or something unexpected happened inside a run; the "
        "scenario and the step are named"
    )),
    (EXIT_CLOSED_STDOUT, (
        "stdout was closed before the report was written (| head -1); quiet, as "
        "python3 -m json.tool is"
    )),
    *(
        (EXIT_SIGNALLED + number, (
            f"stopped by {signal.Signals(number).name} "
            f"({_STOP_SIGNAL_SOURCES[signal.Signals(number).name]}); every worker stopped, "
            "nothing written"
        ))
        for number in sorted(_STOP_SIGNALS)
    ),
)

# Only bounds a hung run; no step waits for it to pass.
DEFAULT_TIMEOUT = 60.0
# poll() takes a timeout in milliseconds as a C int, and Windows' waits a DWORD: 2**31 ms is
# about 24.8 days.  A bound below that, with room for a worker's longer backstop, fits both.
MAX_TIMEOUT = 1_000_000.0
# How long the engine waits for a worker to be gone once it ended or was killed.
_STOP_SECONDS = 5.0
# The largest --check file read; the evidence is a few kilobytes.
_MAX_EXPECTED_BYTES = 16 * 1024 * 1024

RESOURCE = "quarterly-report"

# What a worker sends back on its pipe after each step: (step index, event, None), or, when it
# fails, (the step's index or None, None, what went wrong).
_Report = tuple[int | None, dict[str, Any] | None, str | None]


class Action(str, enum.Enum):
    ACQUIRE = "acquire"  # ask the authority for a lease at `tick`, for `ttl` ticks
    WRITE = "write"  # send `value` to the receiver with the epoch of the worker's lease


@dataclass(frozen=True)
class Step:
    """One thing one worker does, at one tick of logical time."""

    actor: str
    action: Action
    tick: int
    ttl: int | None = None  # acquisitions only
    value: str | None = None  # writes only

    def __post_init__(self) -> None:
        if not isinstance(self.actor, str) or not isinstance(self.action, Action):
            raise TypeError(f"step {self!r}: actor must be a str and action an Action")
        problem = _step_problem(self)
        if problem:
            raise ValueError(f"step {self!r}: {problem}")

    def __str__(self) -> str:
        return f"{self.actor} {self.action.value} at tick {self.tick}"


def _step_problem(step: Step) -> str:
    if not step.actor:
        return "actor must not be empty"
    if not _is_tick(step.tick):
        return "tick must be an int >= 0"
    if step.action is Action.ACQUIRE:
        if not _is_tick(step.ttl) or step.ttl == 0 or step.value is not None:
            return "an acquisition needs a ttl (an int >= 1) and no value"
    elif not isinstance(step.value, str) or step.ttl is not None:
        return "a write needs a value (a str) and no ttl"
    return ""


def _is_tick(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True)
class Scenario:
    """A named timeline: the engine releases its steps one at a time, in this order.

    It is checked when it is built: ticks never go back, and a worker writes only once it has
    acquired, since it writes with the epoch of the lease it last received.
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
        acquired: set[str] = set()
        tick = 0
        for index, step in enumerate(self.steps):
            if step.tick < tick:
                raise ValueError(
                    f"{where}, step {index} ({step}): tick {step.tick} comes after tick {tick}"
                )
            if step.action is Action.WRITE and step.actor not in acquired:
                raise ValueError(f"{where}, step {index} ({step}): {step.actor} has no lease yet")
            if step.action is Action.ACQUIRE:
                acquired.add(step.actor)
            tick = step.tick

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


class ExperimentError(Exception):
    """A scenario failed or hung; `scenario` and `step` say where."""

    def __init__(self, scenario: str, step: str, problem: str) -> None:
        super().__init__(f"scenario {scenario!r}, {step}: {problem}")
        self.scenario = scenario
        self.step = step
        self.problem = problem


# --- the worker: a child process, told what to do entirely by its arguments ---


def run_worker(
    db_path: str,
    fenced: bool,
    actor: str,
    script: Sequence[tuple[int, Step]],
    channel: "Connection",
    backstop: float,
) -> None:
    """Perform each (index, step) of `script` once the engine sends its index; report each.

    A failure is reported as text, since an arbitrary exception may not survive pickling, and
    the process exits with status 1.  If the engine is gone (its end of the pipe closed), there
    is no one to report to: the worker removes the scenario's folder and exits.  `backstop`
    bounds each wait only in case the engine hangs without closing the pipe.
    """
    _ignore_stop_signals()
    index = None
    try:
        with LeaseAuthority(db_path) as authority, Receiver(db_path, fenced=fenced) as receiver:
            lease = None
            for index, step in script:
                if not channel.poll(backstop):
                    raise TimeoutError(f"step {index} was not released within {backstop:g} s")
                released = channel.recv()
                if released != index:
                    raise RuntimeError(f"step {released} was released, step {index} expected")
                lease, event = _perform(step, lease, authority, receiver)
                report: _Report = (index, event, None)
                channel.send(report)
    except (EOFError, BrokenPipeError):
        shutil.rmtree(os.path.dirname(db_path), ignore_errors=True)
        sys.exit(1)
    except BaseException as exc:  # noqa: BLE001 - whatever it was, the engine must hear of it
        with contextlib.suppress(OSError):
            channel.send((index, None, f"worker {actor}: {type(exc).__name__}: {exc}"))
        sys.exit(1)


def _ignore_stop_signals() -> None:
    """Leave stopping to the engine; undo the block the engine started this process under.

    The engine starts workers with its stop signals blocked, so that one sent to the whole
    process group (Ctrl-C in a terminal) cannot cut a worker's interpreter start short.  A
    pending one is dropped here; SIGTERM stays fatal, as a worker has nothing to clean up.
    """
    for number in _STOP_SIGNALS:
        if number != signal.SIGTERM:
            signal.signal(number, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)


def _perform(
    step: Step, lease: Lease | None, authority: LeaseAuthority, receiver: Receiver
) -> tuple[Lease | None, dict[str, Any]]:
    if step.action is Action.ACQUIRE:
        assert step.ttl is not None  # Step checked it when it was built
        lease = authority.acquire(RESOURCE, step.actor, now=step.tick, ttl=step.ttl)
        granted = {"epoch": lease.epoch, "expires_at": lease.expires_at, "outcome": "granted"}
        return lease, _event(step, granted)
    assert lease is not None and step.value is not None  # Scenario checked it when it was built
    # The worker sends the epoch of the lease it last received: it has no other way to know.
    return lease, _event(step, _result_json(receiver.write(RESOURCE, lease.epoch, step.value)))


def _event(step: Step, happened: dict[str, Any]) -> dict[str, Any]:
    """One step as the evidence records it: every field present, null where it does not apply."""
    fields = ("epoch", "expires_at", "value", "outcome", "stored_epoch", "stored_value")
    return {
        "actor": step.actor,
        "action": step.action.value,
        "tick": step.tick,
        **{field: happened.get(field) for field in fields},
    }


# --- the engine ---


class _Stopped(BaseException):
    """A stop signal arrived (see main); raised once, wherever the run was, so that it unwinds."""

    def __init__(self, number: int) -> None:
        super().__init__(number)
        self.number = number


# Stop signals whose _Stopped was raised inside a finalizer, where CPython reports and drops
# exceptions: main() records them here, and the engine stops at its next wake-up instead.
_missed_stops: list[int] = []


class _Play:
    """One scenario being played: its workers, the step it waits on, and what has happened.

    It waits on one thing at a time: the report of the step it released last, or, after an
    actor's last step, that actor's exit.  `waitables()` says what, `advance()` takes what
    became ready, and `check_deadline()` fails the step that has waited too long.
    """

    def __init__(self, scenario: Scenario, folder: str, timeout: float) -> None:
        self.scenario = scenario
        self.db_path = os.path.join(folder, "scenario.sqlite3")
        self.timeout = timeout
        self.events: list[dict[str, Any]] = []
        self.index = 0  # the step released last, or to be released next
        self.exiting: str | None = None  # the actor whose exit is awaited, after its last step
        self.deadline = float("inf")
        self.workers: dict[str, tuple[BaseProcess, Connection]] = {}
        self.done = False

    def start(self, context: multiprocessing.context.SpawnContext) -> None:
        steps = self.scenario.steps
        backstop = min(self.timeout * (len(steps) + 1), MAX_TIMEOUT)
        for actor in self.scenario.actors:
            ours, theirs = context.Pipe()
            script = [(i, step) for i, step in enumerate(steps) if step.actor == actor]
            process = context.Process(
                target=run_worker,
                name=f"{self.scenario.name}:{actor}",
                args=(self.db_path, self.scenario.fenced, actor, script, theirs, backstop),
            )
            self.workers[actor] = (process, ours)
            process.start()
            theirs.close()  # the worker's end lives on in the worker only: its exit closes it
        self._release()

    def where(self) -> str:
        return f"step {self.index} ({self.scenario.steps[self.index]})"

    def fail(self, problem: str) -> NoReturn:
        raise ExperimentError(self.scenario.name, self.where(), problem)

    def waitables(self) -> list[Any]:
        if self.done:
            return []
        if self.exiting is not None:
            return [self.workers[self.exiting][0].sentinel]
        process, channel = self.workers[self.scenario.steps[self.index].actor]
        return [channel, process.sentinel]

    def advance(self, ready: list[Any]) -> None:
        if self.exiting is not None:
            process, _ = self.workers[self.exiting]
            process.join(_STOP_SECONDS)
            if process.exitcode != 0:
                self.fail(f"worker {process.name!r} exited with code {process.exitcode}")
            self.exiting = None
        else:
            actor = self._take_report(ready)
            if all(step.actor != actor for step in self.scenario.steps[self.index + 1 :]):
                # Its last step: the next is released only once this worker has exited, so
                # that what it leaves behind is only what it committed.
                self.exiting = actor
                self.deadline = time.monotonic() + self.timeout
                return
        self.index += 1
        self._release()

    def _take_report(self, ready: list[Any]) -> str:
        """Record the report of the step released last; the actor that made it."""
        actor = self.scenario.steps[self.index].actor
        process, channel = self.workers[actor]
        try:
            if channel not in ready:  # only the sentinel: the worker ended without a word
                raise EOFError
            report: _Report = channel.recv()
        except EOFError:
            process.join(_STOP_SECONDS)
            self.fail(f"worker {process.name!r} ended unreported, exit code {process.exitcode}")
        reported, event, error = report
        if error is not None:
            self.fail(error)
        if reported != self.index or event is None:
            self.fail(f"step {reported} reported out of turn")
        self.events.append(event)
        return actor

    def check_deadline(self, now: float) -> None:
        if not self.done and now >= self.deadline:
            if self.exiting is not None:
                self.fail(f"worker {self.exiting} did not exit within {self.timeout:g} s")
            self.fail(f"no report within {self.timeout:g} s")

    def _release(self) -> None:
        if self.index == len(self.scenario.steps):
            self.done = True
            return
        _, channel = self.workers[self.scenario.steps[self.index].actor]
        try:
            channel.send(self.index)
        except OSError as exc:
            self.fail(f"cannot release the step: {exc}")
        self.deadline = time.monotonic() + self.timeout

    def stop(self) -> None:
        """Make sure no worker outlives its scenario, however the scenario ended."""
        # SIGKILL, not SIGTERM: a worker still starting up holds SIGTERM back (see
        # _hold_stop_signals), and a worker has nothing to clean up; its folder goes with the play.
        for process, _ in self.workers.values():
            if process.pid is not None and process.exitcode is None:
                process.kill()
        for process, channel in self.workers.values():
            if process.pid is not None:
                process.join(_STOP_SECONDS)
            channel.close()

    def record(self) -> dict[str, Any]:
        with Receiver(self.db_path, fenced=self.scenario.fenced) as receiver:
            decisions = [_result_json(result) for result in receiver.decisions(RESOURCE)]
            final = receiver.read(RESOURCE)
        with LeaseAuthority(self.db_path) as authority:
            lease = authority.current(RESOURCE, now=self.scenario.steps[-1].tick)
        return {
            "name": self.scenario.name,
            "receiver": "fenced" if self.scenario.fenced else "unfenced",
            "summary": self.scenario.summary,
            "resource": RESOURCE,
            "events": self.events,
            "decisions": decisions,
            "final": None if final is None else {"epoch": final[0], "value": final[1]},
            "lease_at_end": None if lease is None else _lease_json(lease),
            "verdict": judge(self.events),
        }


def run_scenarios(
    scenarios: Sequence[Scenario] = SCENARIOS, *, timeout: float = DEFAULT_TIMEOUT
) -> dict[str, Any]:
    """Play `scenarios` concurrently and return the evidence document, in the given order.

    Every worker of every scenario has ended, and every scenario's folder is gone, before this
    returns or raises: when a scenario fails (ExperimentError), and when the run is interrupted
    by an exception such as KeyboardInterrupt, raised wherever the wait happens to be.
    """
    _check_timeout(timeout)
    if isinstance(scenarios, (str, bytes)) or not all(isinstance(s, Scenario) for s in scenarios):
        raise TypeError(f"scenarios must be a sequence of Scenario, got {scenarios!r}")
    names = [scenario.name for scenario in scenarios]
    if not names or len(set(names)) != len(names):
        raise ValueError(f"scenarios must be a non-empty sequence with distinct names: {names!r}")
    context = multiprocessing.get_context("spawn")
    with _signal_mask_kept(), contextlib.ExitStack() as stack:
        plays = []
        for scenario in scenarios:
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="leases-experiment-"))
            plays.append(_Play(scenario, folder, timeout))
            stack.callback(plays[-1].stop)  # runs before its folder is removed
        # Unwinding runs this first: a stop signal then waits until every worker is gone and
        # every folder removed, instead of cutting that short.
        stack.callback(_hold_stop_signals)
        with _stop_signals_held():
            _start_resource_tracker()
            _hold_stop_signals()  # starting the tracker let SIGINT and SIGTERM through again
            for play in plays:
                _guarded(play, play.start, context)
        while not all(play.done for play in plays):
            waiting = {item: play for play in plays for item in play.waitables()}
            wait = min(play.deadline for play in plays if not play.done) - time.monotonic()
            ready = multiprocessing.connection.wait(list(waiting), max(0.0, wait))
            if _missed_stops:
                raise _Stopped(_missed_stops[0])
            for play in plays:
                mine = [item for item in ready if waiting[item] is play]
                if mine:
                    _guarded(play, play.advance, mine)
            now = time.monotonic()
            for play in plays:
                play.check_deadline(now)
        return {"scenarios": [_guarded(play, play.record) for play in plays]}


def _guarded(play: _Play, action: Callable[..., Any], *args: Any) -> Any:
    """Run one engine action; anything unexpected fails the run naming the scenario and step."""
    try:
        return action(*args)
    except ExperimentError:
        raise
    except Exception as exc:
        where = "recording" if play.done else play.where()
        problem = f"unexpected {type(exc).__name__}: {exc}"
        raise ExperimentError(play.scenario.name, where, problem) from exc


def _hold_stop_signals() -> None:
    """Block the stop signals in this thread: one sent meanwhile waits, it is not lost.

    Workers started meanwhile inherit the block (see _ignore_stop_signals).
    """
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)


def _start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker now, rather than in the first spawn.

    Starting it unblocks SIGINT and SIGTERM again (the tracker ignores those two), so it must
    not happen while the workers start.  Started with the stop signals held back, the tracker
    keeps SIGHUP and SIGQUIT held too: sent to the whole group, they do not kill it.  It ends
    by itself once this process has.
    """
    if hasattr(signal, "pthread_sigmask"):
        from multiprocessing import resource_tracker

        _hold_stop_signals()
        resource_tracker.ensure_running()


@contextlib.contextmanager
def _stop_signals_held() -> Iterator[None]:
    """Hold the stop signals back while the block runs; one sent meanwhile arrives after it."""
    with _signal_mask_kept():
        _hold_stop_signals()
        yield


@contextlib.contextmanager
def _signal_mask_kept() -> Iterator[None]:
    """Restore the signal mask on the way out: a stop signal held meanwhile arrives then."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _check_timeout(timeout: object) -> float:
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool):
        raise TypeError(f"timeout must be a number of seconds, got {timeout!r}")
    if not 0 < timeout <= MAX_TIMEOUT:
        raise ValueError(
            f"timeout must be more than 0 and at most {MAX_TIMEOUT:g} s, got {timeout!r}"
        )
    return float(timeout)


def _lease_json(lease: Lease) -> dict[str, Any]:
    return {"holder": lease.holder, "epoch": lease.epoch, "expires_at": lease.expires_at}


def _result_json(result: WriteResult) -> dict[str, Any]:
    return {
        "outcome": result.outcome.value,
        "epoch": result.epoch,
        "value": result.value,
        "stored_epoch": result.stored_epoch,
        "stored_value": result.stored_value,
    }


def judge(events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The verdict on a run, from its events alone: what went wrong, if anything, and who won.

    `because` holds, for each field, the indices (into `events`) of the events that made it
    what it is, so that every field can be checked against the events by hand.
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
        if event["action"] == Action.ACQUIRE.value:
            expires_at[event["actor"]] = event["expires_at"]
            newest_epoch = max(newest_epoch, event["epoch"])
            continue
        if event["outcome"] == "applied":
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


# --- evidence: rendering and comparing ---


def canonical_json(document: object) -> str:
    import json

    return json.dumps(document, sort_keys=True, indent=2, ensure_ascii=True) + "\n"


def timeline(record: dict[str, Any]) -> str:
    """A few lines a person can read at a glance: who did what at which tick, and the result."""
    lines = [f"{record['name']} ({record['receiver']} receiver)"]
    for event in record["events"]:
        if event["action"] == Action.ACQUIRE.value:
            detail = f"lease until tick {event['expires_at']}"
        else:
            held = f"epoch {event['stored_epoch']}, {event['stored_value']!r}"
            detail = f"{event['value']!r} -> receiver holds {held}"
        lines.append(
            f"  tick {event['tick']:>2}  {event['actor']}  {event['action']:<7}  "
            f"epoch {event['epoch']}  {event['outcome']:<8}  {detail}"
        )
    verdict = record["verdict"]
    lines.append(
        f"  final value written by {verdict['final_value_written_by']}; "
        f"write with superseded epoch applied: {verdict['write_with_superseded_epoch_applied']}"
    )
    return "\n".join(lines)


_MISSING = object()


def differences(
    expected: object, actual: object, path: str = "$"
) -> Iterator[tuple[str, Any, Any]]:
    """Yield (JSON path, expected, actual) wherever two parsed JSON documents differ."""
    import json

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


def _show_pair(expected: object, actual: object, limit: int = 70) -> tuple[str, str]:
    """Both values as short JSON; two long strings are shown from just before they part."""
    import json

    skip = 0
    if isinstance(expected, str) and isinstance(actual, str):
        skip = max(0, len(os.path.commonprefix([expected, actual])) - 20)

    def show(value: object) -> str:
        if value is _MISSING:
            return "(missing)"
        if skip and isinstance(value, str):
            text = '"...' + json.dumps(value[skip:])[1:]
        else:
            text = json.dumps(value, sort_keys=True)
        return text if len(text) <= limit else text[: limit - 3] + "..."

    return show(expected), show(actual)


# --- command line ---


class _UsageError(Exception):
    """Bad arguments or files: exit 2 with one line, before or instead of a run."""


class _ReportFailed(Exception):
    """stdout would not take the report."""


def _parser() -> "argparse.ArgumentParser":
    import argparse
    import textwrap

    class Parser(argparse.ArgumentParser):
        def print_help(self, file: Any = None) -> None:
            # Through _say: a --help that stdout will not take is exit 2 (or 32), not 0.
            _say(self.format_help().rstrip("\n"))

        def error(self, message: str) -> NoReturn:
            # One line and no usage block, so that scripts can show the reason as it is.
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
        + "\n"
        "examples:\n"
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


def _shown(path: str) -> str:
    """`path` as a person can read it: escaped if it holds anything unprintable."""
    return path if path.isprintable() else ascii(path)


def _read_expected(path: str) -> object:
    """The parsed --check file; it must be a regular file, and proper JSON without repeats."""
    import json

    shown = _shown(path)
    try:
        # O_NONBLOCK: if a FIFO is swapped in after any check, opening it must not hang.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with open(fd, "rb") as file:
            status = os.fstat(file.fileno())
            if not stat.S_ISREG(status.st_mode):
                raise _UsageError(f"expected evidence {shown} is not a regular file")
            if status.st_size > _MAX_EXPECTED_BYTES:
                raise _UsageError(
                    f"expected evidence {shown} is {status.st_size} bytes, more than the "
                    f"{_MAX_EXPECTED_BYTES} read"
                )
            data = file.read(_MAX_EXPECTED_BYTES + 1)
    except OSError as exc:
        raise _UsageError(
            f"cannot read expected evidence {shown}: {exc.strerror or exc}"
        ) from None
    if not data.strip():
        raise _UsageError(f"expected evidence {shown} is empty")

    def no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for key, value in pairs:
            if key in found:
                raise _UsageError(f"expected evidence {shown} has the key {key!r} twice")
            found[key] = value
        return found

    def no_constant(name: str) -> NoReturn:
        raise _UsageError(f"expected evidence {shown} is not JSON: it holds {name}")

    def finite(text: str) -> float:
        number = float(text)
        if number in (float("inf"), float("-inf")):
            raise _UsageError(f"expected evidence {shown} holds {text}, too large for a float")
        return number

    try:
        return json.loads(
            data.decode("utf-8"),
            object_pairs_hook=no_repeats,
            parse_constant=no_constant,
            parse_float=finite,
        )
    except (ValueError, RecursionError) as exc:  # JSON and UTF-8 errors are ValueErrors
        raise _UsageError(f"expected evidence {shown} is not JSON: {exc}") from None


def _output_target(path: str, expected_path: str | None) -> str:
    """The file that --output PATH will replace (a symlink's target); fail before the run."""
    shown = _shown(path)
    if not path:
        raise _UsageError("--output must name a file, got ''")
    if path.endswith((os.sep, os.altsep or os.sep)):
        raise _UsageError(f"cannot write {shown}: it names a folder; --output names a file")
    target = os.path.realpath(path)  # the link stays; what it points to gets the evidence
    folder, name = os.path.split(target)
    try:
        status = _status(target)
    except OSError as exc:  # a loop of links, a file used as a folder, no permission, ...
        raise _UsageError(f"cannot write {shown}: {exc.strerror or exc}") from None
    if status is not None and not stat.S_ISREG(status.st_mode):
        kind = "a folder" if stat.S_ISDIR(status.st_mode) else "not a regular file"
        raise _UsageError(f"cannot write {shown}: it is {kind}; --output replaces regular files")
    if status is not None and expected_path is not None:
        with contextlib.suppress(OSError):  # an unreadable --check file has failed already
            if os.path.samestat(status, os.stat(expected_path)):
                raise _UsageError(
                    f"--output {shown} is the --check file it is compared with"
                )
    if not os.path.isdir(folder):
        raise _UsageError(f"cannot write {shown}: folder {_shown(folder)} does not exist")
    with contextlib.suppress(OSError, ValueError):
        if len(os.fsencode(name)) > os.pathconf(folder, "PC_NAME_MAX"):
            raise _UsageError(f"cannot write {shown}: the file name is too long")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
        # In a sticky folder (/tmp) only a file's or the folder's owner may replace the file.
        sticky = os.stat(folder)
        if status is not None and sticky.st_mode & stat.S_ISVTX:
            user = os.geteuid() if hasattr(os, "geteuid") else 0
            if user not in (0, sticky.st_uid, status.st_uid):
                raise _UsageError(f"cannot write {shown}: another user's file in a sticky folder")
    except OSError as exc:
        raise _UsageError(f"cannot write {shown}: {exc.strerror or exc}") from None
    return target


def _status(path: str) -> os.stat_result | None:
    """os.stat(path), or None if nothing is there."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def _staged(target: str | None, text: str) -> Iterator[Callable[[], None]]:
    """Write `text` beside `target` and yield the function that renames it into place.

    If the block ends without calling it, the staged file is removed: never a half-written
    file, and nothing at all unless the run got that far.  An existing file keeps its mode
    (and, where allowed, its owner); a new one gets the mode the umask allows, as any file
    the user creates.  With no target, there is nothing to stage.
    """
    if target is None:
        yield lambda: None
        return
    status = _status(target)  # again: the run took a while
    fd, temporary = tempfile.mkstemp(dir=os.path.dirname(target), suffix=".tmp")
    try:
        if status is None:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(fd, 0o666 & ~umask)
        else:
            with contextlib.suppress(OSError):  # first: a change of owner clears set-id bits
                os.chown(fd, status.st_uid, status.st_gid)
            os.chmod(fd, stat.S_IMODE(status.st_mode))
        with os.fdopen(fd, "w", encoding="ascii", newline="\n") as file:
            file.write(text)
        yield lambda: os.replace(temporary, target)
    finally:
        with contextlib.suppress(OSError):  # gone already once renamed
            os.unlink(temporary)


@contextlib.contextmanager
def _stop_signals_raise() -> Iterator[Callable[[], None]]:
    """While the block runs, the first stop signal raises _Stopped; later ones are ignored.

    Only the first raises, so that unwinding (stopping workers, removing folders) cannot itself
    be cut short by a second Ctrl-C.  The block calls the function it is given once the run
    has succeeded: from then on a stop signal is too late, and is held back for good, since
    even the interpreter's shutdown, which puts back the default handlers, must not deliver it.
    """
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield lambda: None  # only the main thread may set handlers; the caller's apply
        return
    stopped: list[int] = []

    def handler(number: int, frame: object) -> None:
        if not stopped:
            stopped.append(number)
            raise _Stopped(number)

    def unraisable(report: "sys.UnraisableHookArgs") -> None:
        if isinstance(report.exc_value, _Stopped):  # raised in a finalizer, and dropped
            _missed_stops.append(report.exc_value.number)
        else:
            previous_hook(report)

    # A signal ignored from the start (nohup, or a shell's background job) stays ignored.  The
    # handlers are set with the stop signals held, so that none arrives half-way through.
    holding = hasattr(signal, "pthread_sigmask")
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS) if holding else set()
    previous = {
        number: signal.signal(number, handler)
        for number in _STOP_SIGNALS
        if signal.getsignal(number) is not signal.SIG_IGN
    }
    previous_hook, sys.unraisablehook = sys.unraisablehook, unraisable
    try:
        if holding:  # one held during the setup arrives now, and raises here
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        yield _hold_stop_signals
    finally:
        sys.unraisablehook = previous_hook
        _missed_stops.clear()
        # Run as a script, the process ends right after main().  Called from other code, the
        # caller gets its handlers and its mask back: a signal held meanwhile arrives now.
        if __name__ != "__main__":
            for number, action in previous.items():
                signal.signal(number, action)
            if holding:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _say(text: str) -> None:
    """Write a line of the report to stdout; if stdout will not take it, _ReportFailed.

    A reader that has gone (| head -1) raises BrokenPipeError, which main() ends quietly.
    """
    if sys.stdout is None:  # its file descriptor was closed before Python started
        raise _ReportFailed("stdout is closed")
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as exc:  # ValueError: the stream was closed
        raise _ReportFailed(f"cannot write the report to stdout: {exc}") from None


def _note(text: str) -> None:
    """Write a line to stderr, if it takes it: a diagnostic never changes the exit code."""
    with contextlib.suppress(AttributeError, OSError, ValueError):  # None, full, closed
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def _silence_stdout() -> None:
    """Point a failed stdout at the null device, so that the exit's final flush is quiet."""
    with contextlib.suppress(AttributeError, OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):  # any name or value can be shown, escaped
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    try:
        with _stop_signals_raise() as too_late:
            return _main(argv, too_late)
    except _Stopped as stop:
        _note(f"run_experiment.py: stopped by {signal.Signals(stop.number).name}; every "
              "worker was stopped and nothing was written")
        return EXIT_SIGNALLED + stop.number
    except KeyboardInterrupt:  # only when called off the main thread, without our handler
        return EXIT_SIGNALLED + signal.SIGINT
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_CLOSED_STDOUT
    except _ReportFailed as exc:
        _silence_stdout()
        _note(f"run_experiment.py: error: {exc}")
        return EXIT_USAGE


def _main(argv: Sequence[str] | None, too_late: Callable[[], None]) -> int:
    args = _parser().parse_args(argv)
    try:
        expected = None if args.check is None else _read_expected(args.check)
        target = None if args.output is None else _output_target(args.output, args.check)
        if sys.stdout is None and (args.check is not None or target is None):
            raise _UsageError("stdout is closed, and the report or the evidence goes there")
    except _UsageError as exc:
        _note(f"run_experiment.py: error: {exc}")
        return EXIT_USAGE

    try:
        document = run_scenarios(timeout=args.timeout)
    except ExperimentError as exc:
        _note(f"run_experiment.py: failed: {exc}")
        return EXIT_FAILED
    if _missed_stops:  # a stop signal dropped in a finalizer, after the engine's last wake-up
        raise _Stopped(_missed_stops[0])
    # Every worker is gone and the evidence is ready: what is left takes milliseconds, and a
    # stop signal now could only leave the --output file written with a "stopped" exit code.
    too_late()
    for record in document["scenarios"]:
        _note(timeline(record))

    text = canonical_json(document)
    if args.check is None:
        code, report = EXIT_OK, text.rstrip("\n") if target is None else ""
    else:
        code, report = _comparison(expected, text, args.check, len(document["scenarios"]))
    try:
        with _staged(target, text) as put_in_place:
            # The report first: if stdout will not take it, the evidence is not put in place.
            if report:
                _say(report)
            put_in_place()
    except BrokenPipeError:
        raise  # a reader that has gone: main() ends quietly
    except OSError as exc:
        _note(f"run_experiment.py: error: cannot write {_shown(args.output)}: "
              f"{exc.strerror or exc}")
        return EXIT_USAGE
    return code


def _comparison(expected: object, text: str, check: str, scenarios: int) -> tuple[int, str]:
    """The exit code and the report of comparing the evidence `text` with --check's."""
    import json

    found = list(differences(expected, json.loads(text)))
    if not found:
        return EXIT_OK, f"reproduced: this run matches {_shown(check)} ({scenarios} scenarios)"
    lines = [f"differs: this run does not match {_shown(check)} at {len(found)} JSON path(s):"]
    for path, want, got in found[:_SHOWN_DIFFERENCES]:
        shown_want, shown_got = _show_pair(want, got)
        lines.append(f"  {path}: expected {shown_want}, got {shown_got}")
    if len(found) > _SHOWN_DIFFERENCES:
        lines.append(f"  ... and {len(found) - _SHOWN_DIFFERENCES} more")
    return EXIT_DIFFERENT, "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
