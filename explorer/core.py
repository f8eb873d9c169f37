"""The explorer's core: the bound, the model, the judge, fresh-start replay, the report's pieces.

A bound is H holders that all run one program (acquire, renew, check, write, release, and
retry: the holder's last write sent again), at ticks 0 to T, with one ttl.  The model is a
Record per resource, built from the answers alone, never the rows: `expected` says what the
contract answers a step from it, `recorded` what it becomes after, and CHECKS judge each step
(with the evidence's classes of write, run_experiment.CLASSES, and four of the explorer's own).
Fresh plays a failing run again whole in a new process; Caller bounds each call of the code
under test (Hung: a finding).  It imports no other module of the explorer.
"""

import contextlib
import math
import multiprocessing
import os
import queue
import shlex
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing import resource_tracker
from typing import Any, NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
_PATHS = [os.path.abspath(path or ".") for path in sys.path]
if os.path.dirname(HERE) not in _PATHS:  # leases.py and run_experiment.py, one folder up,
    sys.path.insert(_PATHS.index(HERE) + 1 if HERE in _PATHS else 0,  # just after this one
                    os.path.dirname(HERE))

import run_experiment
from leases import Lease, Outcome
from run_experiment import RESOURCE, Action, Step, StepResult, Write

__all__ = [
    "CHECKS", "CLASSES", "HOLDERS", "KEYS", "RESOURCES", "RETRY", "UNREAD", "Bound", "Caller",
    "Different", "Fresh", "Hung", "Move", "Raised", "Record", "Run", "Schedule", "Unsupported",
    "as_event", "as_json", "command", "compared", "expected", "guarded", "judged", "lease_fields",
    "lease_of", "recorded", "script", "shown_pair",
]

RETRY = "retry"  # a program's word beside run_experiment's actions: the last write again
HOLDERS = "ABCDEFGH"
_LARGEST = 2**63 - 1  # SQLite's largest integer
RESOURCES = (RESOURCE, "annual-report")


@dataclass(frozen=True)
class Column:
    """A class of write in the table: one of the evidence's (run_experiment.CLASSES), or one of
    the explorer's own, which set them apart.  `kind` is harm, protection or neither."""

    name: str
    says: str
    kind: str
    rule: Callable[[Write], bool]


_REFUSED = (Outcome.STALE, Outcome.CONFLICT, "not live")  # "not live": AskingReceiver's refusal
_KINDS = {"lost update": "harm", "stale refused": "protection", "superseded applied": "harm",
          "late applied": "neither", "conflict": "neither"}
_EVIDENCE = {cls.name: Column(cls.name, cls.says, _KINDS[cls.name], cls.rule)
             for cls in run_experiment.CLASSES}
CLASSES = (
    _EVIDENCE["lost update"],
    _EVIDENCE["stale refused"],
    _EVIDENCE["superseded applied"],
    Column("gap", "superseded applied, not a lost update", "harm",
           lambda w: w.applied and w.superseded and not w.below_stored),
    _EVIDENCE["late applied"],
    Column("late, not superseded", "late applied, no newer grant", "neither",
           lambda w: w.applied and w.late and not w.superseded),
    Column("replay", "the same epoch and value again", "neither",
           lambda w: w.event.outcome == Outcome.REPLAY),
    _EVIDENCE["conflict"],
    Column("late refused, not superseded", "refused after expiry, no newer grant", "neither",
           lambda w: w.event.outcome in _REFUSED and w.late and not w.superseded),
)


def classes(write: Write) -> list[bool]:
    """Whether `write` falls in each of CLASSES, in their order."""
    return [cls.rule(write) for cls in CLASSES]


def as_event(data: dict[str, Any]) -> StepResult:
    return StepResult(**{**data, "action": Action(data["action"])})


@dataclass(frozen=True)
class Bound:
    """Holders A, B, ... that all run `program`; with two `resources`, A acquires the first,
    B the second, C the first, and so on."""

    holders: int = 2
    program: tuple[str, ...] = ("acquire", "renew", "write", "release")
    last_tick: int = 5
    ttl: int = 2
    resources: int = 1
    first_epoch: int = 1  # the epoch every party sees for the authority's first grant
    timeout: float = 10.0  # seconds: a call of the code under test not answered by then hangs

    def __post_init__(self) -> None:
        if not 1 <= self.first_epoch <= _LARGEST - 2 ** 20:
            raise ValueError(f"the first epoch must be 1 to 2**63 - 2**20, got {self.first_epoch}")
        if not 0 < self.timeout < math.inf:
            raise ValueError(f"the timeout must be a number of seconds above 0, got {self.timeout}")
        for position, word in enumerate(self.program):
            if word not in (*(a.value for a in Action), RETRY):
                raise ValueError(f"unknown step {word!r}")
            if word == RETRY and "write" not in self.program[:position]:
                raise ValueError(f"a retry sends the holder's last write again: it needs a "
                                 f"write before it, got {' '.join(self.program)!r}")

    def step(self, h: int, position: int, tick: int) -> Step:
        """Holder h's step at `position`: its k-th write sends "A1", "A2", ...; a retry, the
        last of them again."""
        word = self.program[position]
        action = Action.WRITE if word == RETRY else Action(word)
        value = f"{HOLDERS[h]}{self.program[:position + 1].count('write')}"
        timed = action in (Action.ACQUIRE, Action.RENEW)
        return Step(HOLDERS[h], action, tick, self.ttl if timed else None,
                    value if action is Action.WRITE else None)

    def resource(self, h: int) -> str:
        return RESOURCES[h % self.resources]

    def count(self) -> tuple[int, str]:
        """How many schedules the bound has, and the formula: the orders of the steps, times
        the ways to give n steps rising ticks from 0 to T."""
        n, size = self.holders * len(self.program), len(self.program)
        orders = math.factorial(n) // math.factorial(size) ** self.holders
        timings = math.comb(n + self.last_tick, n)
        return orders * timings, (f"multinomial({n}; {', '.join([str(size)] * self.holders)})"
                                  f" x C({n} + {self.last_tick}, {n}) = {orders} x {timings}")

    def said(self) -> str:
        return (f"{self.holders} holder{'s' * (self.holders != 1)}, each: "
                f"{' '.join(self.program)}; ticks 0 to {self.last_tick}, ttl {self.ttl}"
                f"{', 2 resources' * (self.resources == 2)}")


Schedule = tuple[tuple[int, int], ...]  # a step mode schedule: (holder, tick) of each step


class Record(NamedTuple):
    """One resource's record in a schedule so far, from the answers alone, never the rows."""

    row: tuple[str | None, int, int] | None  # the authority's (holder, epoch, expiry) as its
    # answers leave it, the holder None once released; None before any grant
    newest: int  # the highest epoch granted
    stored: tuple[tuple[int, str] | None, ...]  # what each place last applied
    first: int = 1  # the epoch of the first grant

    @classmethod
    def empty(cls, places: int, first: int = 1) -> "Record":
        return cls(None, 0, (None,) * places, first)


class Run(NamedTuple):
    """What a schedule's step did: the lease its holder keeps (as fields), its answer at each
    place (as JSON), and whether the call left the write lock held."""

    kept: tuple[Any, ...] | None
    events: tuple[tuple[Any, ...], ...]
    lock_left: bool
    seen: tuple[Any, ...] = ()  # replays only: each place's stored pair before and after


class Unsupported(Exception):
    """What the explorer cannot do with this library or receiver: a usage error, exit 2."""


class Raised(Exception):
    """The library, or a reader's receiver, raised where the contract has no error (making
    or closing an object): a check failed, exit 1."""


def guarded(who: str, call: str, function: Callable[..., Any], *args: Any,
            **kwargs: Any) -> Any:
    """function(*args, **kwargs), its exception Raised, naming `who` raised it in `call`."""
    try:
        return function(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the code under test's failure, in one line
        raise Raised(f"{who} raised {type(exc).__name__} in {call}: {exc}") from None


class Different(Exception):
    """A call answered otherwise played whole from a fresh start than in the search: its
    answer rests on more than the file and the call."""


# --- rules: what the contract answers, and the checks of each step ---


def _live(expires_at: int, now: int) -> bool:
    """The contract's expiry rule, stated here, not borrowed from the code under test: a
    lease is live before its expiry tick, and expired at it."""
    return now < expires_at


def expected(record: Record, step: Step, held: Lease | None, rules: Sequence[str],
             resource: str) -> tuple[list[tuple[Any, ...]], tuple[Any, ...] | None]:
    """What the contract says `step` answers at each place (outcome, epoch, expires_at,
    value, stored pair), and the lease its holder keeps: from the record alone."""
    row, tick, action = record.row, step.tick, step.action
    live = row is not None and row[0] is not None and _live(row[2], tick)
    mine = row is not None and held is not None and (row[0], row[1]) == (step.actor, held.epoch)
    keep, none = lease_fields(held), (None, None, None)
    if action is Action.ACQUIRE and live:
        assert row is not None
        return [("held", row[1], row[2], *none)] * len(rules), keep
    if action is Action.ACQUIRE or (action is Action.RENEW and mine and live):
        assert step.ttl is not None
        epoch = (held.epoch if held and action is Action.RENEW else row[1] + 1 if row else
                 record.first)
        answer = "renewed" if action is Action.RENEW else "granted"
        lease = (resource, step.actor, epoch, tick + step.ttl)
        return [(answer, epoch, tick + step.ttl, *none)] * len(rules), lease
    if held is None:
        return [("no lease", None, None, *none)] * len(rules), None
    if action is Action.CHECK and mine and live:
        assert row is not None
        return [("live", held.epoch, row[2], *none)] * len(rules), keep
    if action is not Action.WRITE:
        answer = "released" if action is Action.RELEASE and mine else "lost"
        return [(answer, held.epoch, None, *none)] * len(rules), None
    epoch, value, answers = held.epoch, step.value, []
    for kind, pair in zip(rules, record.stored):
        if kind == "asking":
            outcome = ("applied" if live and row is not None and epoch == row[1] else
                       "stale" if row is not None and epoch < row[1] else "not live")
        elif kind == "unfenced" or pair is None or epoch > pair[0]:
            outcome = "applied"
        else:
            outcome = "stale" if epoch < pair[0] else "replay" if value == pair[1] else "conflict"
        after = (epoch, value) if outcome == "applied" else pair or (None, None)
        answers.append((outcome, epoch, None, value, *after))
    return answers, keep


class Move(NamedTuple):
    """One step as a check sees it: the record before and after, the step and its answers."""

    before: Record
    after: Record
    step: Step
    held: Lease | None
    run: Run
    others: tuple[Any, ...]  # the leases the other holders of this resource keep
    rules: tuple[str, ...]
    resource: str


def epochs_increase(move: Move) -> list[str]:
    """A grant's epoch is no higher than one granted before."""
    first = move.run.events[0]
    return ["authority"] if first[3] == "granted" and first[4] <= move.before.newest else []


def one_live_lease(move: Move) -> list[str]:
    """Two holders keep leases live at this tick."""
    leases = [lease for lease in (move.run.kept, *move.others) if lease is not None]
    return ["authority"] if sum(_live(lease[3], move.step.tick)
                                for lease in leases) > 1 else []


def fence(move: Move) -> list[str]:
    """A fenced place applied an epoch no higher than one it had stored."""
    if not _writes(move):
        return []
    return [str(p) for p, (kind, event, pair) in enumerate(
        zip(move.rules, move.run.events, move.before.stored))
        if kind == "fenced" and event[3] == "applied" and pair is not None
        and event[4] <= pair[0]]


def model(move: Move) -> list[str]:
    """An answer, or the lease its holder keeps, is not the contract's from the record."""
    answers, kept = expected(move.before, move.step, move.held, move.rules, move.resource)
    wrong = [str(p) for p, (answer, event) in enumerate(zip(answers, move.run.events))
             if answer != compared(event, answer)]
    if kept != move.run.kept or (wrong and not _writes(move)):
        return ["authority", *(wrong if _writes(move) else [])]
    return wrong


def lock_left(move: Move) -> list[str]:
    """The call returned with the file's write lock still held: a transaction left open."""
    return ["authority"] if move.run.lock_left else []


# Each check of every step, and the places (authority, or a place's index) where it failed.
CHECKS: dict[str, Callable[[Move], list[str]]] = {
    "epochs increase": epochs_increase, "one live lease": one_live_lease, "fence": fence,
    "model": model, "lock left": lock_left,
}


def compared(event: tuple[Any, ...], answer: tuple[Any, ...]) -> tuple[Any, ...]:
    """An event's (outcome, epoch, expires_at, value, stored pair) beside the contract's
    `answer`; where it says no stored pair (a reader's receiver does not), the answer's."""
    said = event[3:9]
    return said if said[4] is not None else (*said[:4], *answer[4:])


def _writes(move: Move) -> bool:
    return move.step.action is Action.WRITE and move.held is not None


def recorded(record: Record, step: Step, held: Lease | None, run: Run) -> Record:
    """The record after a step: from its answers, never from the file."""
    outcome, epoch, expires = run.events[0][3], run.events[0][4], run.events[0][5]
    row, newest = record.row, record.newest
    if outcome in ("granted", "renewed") and isinstance(epoch, int):
        row = (step.actor, epoch, expires)
        newest = max(newest, epoch) if outcome == "granted" else newest
    elif outcome == "released" and row is not None:
        row = (None, row[1], row[2])
    stored = record.stored
    if step.action is Action.WRITE and held is not None:
        stored = tuple((event[4], event[6]) if event[3] == "applied" else pair
                       for event, pair in zip(run.events, stored))
    return Record(row, newest, stored, record.first)


def judged(record: Record, step: Step, held: Lease | None, run: Run,
           others: tuple[Any, ...], rules: tuple[str, ...],
           resource: str) -> tuple[list[tuple[int, int]], list[tuple[str, str]], Record]:
    """A step's classes (place, class index), the checks it fails (check, place), and the
    record after it."""
    after = recorded(record, step, held, run)
    move = Move(record, after, step, held, run, others, rules, resource)
    failed = [(name, place) for name, check in CHECKS.items() for place in check(move)]
    found = []
    if _writes(move) and held is not None:
        for p, (event, pair) in enumerate(zip(run.events, record.stored)):
            write_ = Write(as_event(as_json(event)), record.newest,
                           None if pair is None else pair[0], held.expires_at)
            found += [(p, c) for c, hit in enumerate(classes(write_)) if hit]
    return found, failed, after


def lease_fields(lease: Lease | None) -> tuple[Any, ...] | None:
    return None if lease is None else (lease.resource, lease.holder, lease.epoch,
                                       lease.expires_at)


def lease_of(fields: tuple[Any, ...] | None) -> Lease | None:
    """The lease of lease_fields' fields."""
    return None if fields is None else Lease(*fields)


KEYS = ("actor", "action", "tick", "outcome", "epoch", "expires_at", "value",
         "stored_epoch", "stored_value")


def as_json(event: tuple[Any, ...]) -> dict[str, Any]:
    return dict(zip(KEYS, event))


class Fresh:
    """A schedule played whole in a new process of its own (spawned: it imports the library
    afresh), started at once; `result()` waits for its steps, or raises what it raised.  Its
    files are in a folder of the caller's, removed once the process is stopped."""

    def __init__(self, function: Callable[..., Any], args: tuple[Any, ...],
                 cleanup: contextlib.ExitStack) -> None:
        folder = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="explore-replay-"))
        context = multiprocessing.get_context("spawn")
        self.answers, sender = context.Pipe(duplex=False)
        self.process = context.Process(target=_answered, args=(
            sender, folder, function, *args), daemon=True)
        # Started with Ctrl-C blocked, which the child inherits, so that none lands while it
        # imports.  multiprocessing's resource tracker unblocks Ctrl-C when it starts, on the
        # first spawn: started first.
        resource_tracker.ensure_running()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            self.process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        sender.close()
        cleanup.callback(self._stop)  # before the folder is removed

    def result(self) -> Any:
        if not self.answers.poll(REPLAY_SECONDS):  # bounds a hang; no answer waits for it
            raise Unsupported(f"a replay gave no answer in {REPLAY_SECONDS:.0f} s")
        try:
            steps = self.answers.recv()
        except EOFError:
            self.process.join(REPLAY_SECONDS)
            raise Unsupported(f"a replay's process ended (exit code {self.process.exitcode}) "
                              "before it answered; its error is above") from None
        if isinstance(steps, Exception):
            raise steps
        return steps

    def _stop(self) -> None:
        self.answers.close()
        if self.process.is_alive():
            self.process.kill()
        self.process.join()


REPLAY_SECONDS = 120.0


def _answered(sender: Any, folder: str, function: Callable[..., Any], *args: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the explorer's: it stops us
    tempfile.tempdir = folder  # the parent's folder: it removes what a killed child leaves
    try:
        answer = function(*args)
    except (Raised, Unsupported, Different, Hung) as exc:  # raised by the parent
        answer = exc
    sender.send(answer)
    sender.close()


UNREAD = "unread"  # a stored pair the receiver cannot say: it has no read(resource)


class Hung(Exception):
    """A call of the code under test gave no answer within the bound: a finding, exit 1.
    `said` names the call; `lines`, the run up to it; `witness`, where known, the run as
    --replay takes it."""

    def __init__(self, said: str, lines: Sequence[str] = (), witness: str = "") -> None:
        super().__init__(said)
        self.said, self.lines, self.witness = said, lines, witness

    def __reduce__(self) -> tuple[Any, ...]:  # it crosses from a replay's process
        return type(self), (self.said, self.lines, self.witness)


class Caller:
    """A thread of its own that makes, calls and closes the code under test, each call waited
    for `seconds` at most: one not answered by then is Hung, and the thread is left to it."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.hung = seconds, False  # once hung, no call waits on it again
        self.orders: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.answers: queue.SimpleQueue[Any] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="caller", daemon=True).start()

    def call(self, said: str, function: Callable[..., Any], *args: Any) -> Any:
        if self.hung:
            raise Hung(f"{said}: a call before it hung")
        self.orders.put((function, args))
        try:
            ok, answer = self.answers.get(timeout=self.seconds)
        except queue.Empty:
            self.hung = True
            raise Hung(f"{said} gave no answer within {self.seconds:g} s") from None
        except BaseException:  # Ctrl-C, SIGTERM: the call may go on; no one waits for it
            self.hung = True
            raise
        if not ok:
            raise answer
        return answer

    def stop(self, *last: Any) -> None:
        """Call `last` (a function and its arguments), if any, and end the thread: unless a
        call hung in it, which it is left to."""
        if not self.hung:
            try:
                if last:
                    self.call("closing the objects", *last)
            finally:
                self.orders.put(None)

    def _serve(self) -> None:
        while (order := self.orders.get()) is not None:
            function, args = order
            try:
                self.answers.put((True, function(*args)))
            except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
                self.answers.put((False, exc))


def shown_pair(pair: Any) -> str:
    """A stored pair as a witness shows it."""
    if pair == UNREAD:
        return "? (no read())"
    return "nothing" if pair is None else f"({pair[0]}, {pair[1]!r})"


def script() -> str:
    """explore.py as the current folder reaches it: the start of a command that plays a
    witness again, wherever the reader ran the explorer from."""
    path = os.path.join(HERE, "explore.py")
    near = os.path.relpath(path)
    return path if near.startswith(os.pardir) else near


def command(bound: Bound, receivers: Sequence[Any], mode: str, witness: str) -> str:
    """The command line that plays `witness` again alone, in a fresh process."""
    words = ["python3", script(), *["--statements"] * (mode == "statements"),
             "--holders", str(bound.holders), "--program", *bound.program,
             "--last-tick", str(bound.last_tick), "--ttl", str(bound.ttl)]
    words += ["--resources", str(bound.resources)] * (bound.resources != 1)
    words += ["--first-epoch", str(bound.first_epoch)] * (bound.first_epoch != 1)
    words += ["--timeout", f"{bound.timeout:g}"] * (bound.timeout != Bound.timeout)
    if len(receivers) == 1:
        words += ["--receiver", receivers[0].spec]
    return shlex.join([*words, "--replay", witness])

