"""Play every schedule of a small bound on the real library, count what happened, check it.

A bound is H holders that all run one program (acquire, renew, check, write, release, and
retry: the holder's last write sent again), at ticks 0 to T, with one ttl.  A schedule is an
order of the holders' steps and the tick of each.  Every step is played through
run_experiment.perform on the real LeaseAuthority and on each receiver of the run (the model's
fenced and unfenced receivers and AskingReceiver, a contrast; or a reader's own, --receiver),
and judged by the evidence's classes of write (run_experiment.CLASSES) and four of its own.

The one assumption: a call's answer rests on the file and the call.  So the search plays each
call once from each content of the file it meets (restoring that content with its own SQL),
and merges schedules that reach the same content, tick, holders' places and leases.  The
assumption is tested, not trusted: every failing schedule shown, and a seeded sample of
passing ones, is played again whole from a fresh start (a new process, a freshly imported
library, a new file, each holder with objects of its own), and every answer must be the
search's.  A difference is exit 1, naming the schedule and the call.

With --statements, statements.py interleaves the holders' calls at each SQL statement instead.
A call of the code under test that gives no answer within the bound's timeout is Hung, a
finding.  Every witness printed ends with the command that plays it again (--replay).

    python3 explorer/explore.py [--statements] [--holders N] [--program WORD ...]
        [--last-tick T] [--ttl N] [--resources N] [--first-epoch N] [--timeout S]
        [--receiver MODULE:NAME] [--sample N] [--replay WITNESS]
"""

import argparse
import contextlib
import dataclasses
import importlib
import inspect
import math
import multiprocessing
import os
import queue
import random
import re
import reprlib
import shlex
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing import resource_tracker
from typing import Any, NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
_PATHS = [os.path.abspath(path or ".") for path in sys.path]
if os.path.dirname(HERE) not in _PATHS:  # leases.py and run_experiment.py, one folder up,
    sys.path.insert(_PATHS.index(HERE) + 1 if HERE in _PATHS else 0,  # just after this one
                    os.path.dirname(HERE))

import leases
import run_experiment
from leases import Lease, LeaseAuthority, LeaseError, Outcome, Receiver
from run_experiment import (
    RESOURCE,
    Action,
    Step,
    StepResult,
    Write,
    judge,
    perform,
    write,
)

__all__ = [
    "CHECKS", "CLASSES", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "HOLDERS",
    "OURS", "RESOURCES", "RETRY", "UNREAD", "AskingReceiver", "Bound", "Caller", "Different",
    "Fresh", "Hung", "Place", "Raised", "Record", "Run", "Unsupported", "Walked", "closed",
    "command", "compared", "expected", "explore_steps", "fits", "guarded", "lease_fields", "main",
    "opened", "parse", "places", "played", "recorded", "replay", "replay_steps", "shown_pair",
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


def _event(data: dict[str, Any]) -> StepResult:
    return StepResult(**{**data, "action": Action(data["action"])})


# --- data: a bound, the places answers come from, and the record of a schedule ---


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


@dataclass(frozen=True)
class Place:
    """A receiver of the run: its column's name, what it is, how to make one on a file, and
    the rules its answers are checked by: "fenced", "unfenced" or "asking"."""

    name: str
    says: str
    spec: str  # "fenced", "unfenced", "asking", or a reader's "MODULE:NAME"
    rules: str

    @property
    def who(self) -> str:
        """Who raised, if its code does: the library, or the reader's receiver."""
        return ("the library" if self.spec in ("fenced", "unfenced") else "AskingReceiver"
                if self.spec == "asking" else f"the receiver given with --receiver {self.spec!r}")

    def make(self, path: str, shift: int = 0) -> Any:
        """A receiver of this place on `path`; Raised, naming whose code, if making it raises."""
        if self.spec in ("fenced", "unfenced"):
            return guarded(self.who, "Receiver(path)", Receiver, path,
                            fenced=self.spec == "fenced")
        if self.spec == "asking":
            return guarded(self.who, "AskingReceiver(path)", AskingReceiver, path, shift)
        name = self.spec.rpartition(":")[2]
        receiver = guarded(self.who, f"{name}(path)", load(self.spec), path)
        try:
            return Yours(self.spec, receiver)
        except Unsupported:  # its interface: closed, then named
            with contextlib.suppress(Exception):
                receiver.close()
            raise


def places(receiver: str | None = None) -> tuple[Place, ...]:
    """The receivers of a run: the model's two and the contrast, or a reader's own alone."""
    if receiver is not None:
        load(receiver)  # a usage error now, not in a worker
        name = receiver.rpartition(":")[2]
        return (Place(name, f"{receiver}, checked as a fence", receiver, "fenced"),)
    return (Place("fenced", "the model's Receiver, fenced", "fenced", "fenced"),
            Place("unfenced", "the model's Receiver, unfenced", "unfenced", "unfenced"),
            Place("asking", "not the model's receiver: AskingReceiver, which asks the "
                  "authority inside its own write transaction", "asking", "asking"))


def load(spec: str) -> Callable[[str], Any]:
    """The class named by "MODULE:NAME", imported from the current folder or explorer/."""
    module, colon, name = spec.partition(":")
    if not (module and colon and name):
        raise ValueError(f"--receiver wants MODULE:NAME, got {spec!r}")
    for folder in (HERE, os.getcwd()):
        if folder not in sys.path:
            sys.path.append(folder)
    try:
        found = getattr(importlib.import_module(module), name, None)
    except Exception as exc:  # noqa: BLE001 - a module that raises, or will not compile
        raise Unsupported(f"--receiver {spec!r}: importing {module!r} raised "
                          f"{type(exc).__name__}: {exc}") from None
    if found is None:
        raise ImportError(f"--receiver {spec!r}: {module!r} has no class {name!r}")
    if not callable(found):
        raise TypeError(f"--receiver {spec!r}: {name!r} is not a class")
    fits(f"{name}(path)", found, "path")
    if isinstance(found, type) and not callable(getattr(found, "write", None)):
        raise Unsupported(f"--receiver {spec!r}: {name} has no method write(resource, "
                          "epoch, value)")
    return found  # type: ignore[no-any-return]


def fits(call: str, function: Callable[..., Any], *args: Any) -> None:
    """Unsupported, naming `call`, if `function` cannot take `args`: a wrong signature is the
    reader's interface, not a finding."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin may have none to read: called as it is
        return
    try:
        signature.bind(*args)
    except TypeError as exc:
        raise Unsupported(f"{call} cannot be called so: its signature is {signature}: "
                          f"{exc}") from None


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


def opened(path: str, receivers: Sequence[Place], first_epoch: int = 1) -> list[Any]:
    """A holder's objects on `path`: the authority, then a receiver of each place.  With a
    first epoch above 1 every party sees the authority's epochs shifted up (_Shifted)."""
    shift = first_epoch - 1
    objects = [guarded("the library", "LeaseAuthority(path)", LeaseAuthority, path)]
    try:
        objects += [place.make(path, shift) for place in receivers]
    except BaseException:
        for made in objects:
            made.close()
        raise
    return [_Shifted(objects[0], shift) if shift else objects[0], *objects[1:]]


def closed(objects: Sequence[Any], receivers: Sequence[Place]) -> None:
    """Close what `opened` gave."""
    for who, store in zip(("the library", *(place.who for place in receivers)), objects):
        guarded(who, "close()", store.close)


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


class State(NamedTuple):
    """What the search merges schedules by: two that reach equal states go on as one."""

    content: int
    tick: int
    positions: tuple[int, ...]
    leases: tuple[Any, ...]  # the lease each holder keeps, as fields, or None
    records: tuple[Record, ...]  # one per resource


Schedule = tuple[tuple[int, int], ...]  # (holder, tick) of each step


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
            write_ = Write(_event(_json(event)), record.newest,
                           None if pair is None else pair[0], held.expires_at)
            found += [(p, c) for c, hit in enumerate(classes(write_)) if hit]
    return found, failed, after


def lease_fields(lease: Lease | None) -> tuple[Any, ...] | None:
    return None if lease is None else (lease.resource, lease.holder, lease.epoch,
                                       lease.expires_at)


_KEYS = ("actor", "action", "tick", "outcome", "epoch", "expires_at", "value",
         "stored_epoch", "stored_value")


def _json(event: tuple[Any, ...]) -> dict[str, Any]:
    return dict(zip(_KEYS, event))


# --- receivers: the contrast, and a reader's own ---


class AskingReceiver:
    """NOT the model's receiver: a contrast that asks the authority.  In its own BEGIN
    IMMEDIATE transaction on the authority's file it applies a write only if its epoch is
    the lease live at the write's tick; else "stale" (a higher epoch was granted) or
    "not live".  It keeps the pair it stores in a table of its own."""

    def __init__(self, path: str, shift: int = 0) -> None:
        self.shift = shift  # added to the authority's epochs, as every party sees them
        self._connection = sqlite3.connect(path, isolation_level=None, timeout=30)
        self._connection.execute("CREATE TABLE IF NOT EXISTS asking (resource TEXT PRIMARY KEY,"
                                 " epoch INTEGER NOT NULL, value TEXT NOT NULL)")

    def close(self) -> None:
        self._connection.close()

    def read(self, resource: str) -> tuple[int, str] | None:
        row = self._connection.execute("SELECT epoch, value FROM asking WHERE resource = ?",
                                       (resource,)).fetchone()
        return None if row is None else (row[0], row[1])

    def write(self, resource: str, epoch: int, value: str, *, now: int) -> "_Result":
        """Decide on one write at tick `now`, and say the pair it stores after."""
        connection = self._connection
        connection.execute("BEGIN IMMEDIATE")
        try:
            row = connection.execute("SELECT holder, epoch, expires_at FROM leases"
                                     " WHERE resource = ?", (resource,)).fetchone()
            stored = connection.execute("SELECT epoch, value FROM asking WHERE resource = ?",
                                        (resource,)).fetchone()
            row = None if row is None else (row[0], row[1] + self.shift, row[2])
            if row is not None and row[0] is not None and epoch == row[1] and (
                    leases.is_live(row[2], now=now)):  # a receiver under study: the library's
                outcome, stored = "applied", (epoch, value)
                connection.execute("INSERT OR REPLACE INTO asking VALUES (?, ?, ?)",
                                   (resource, epoch, value))
            else:
                outcome = "stale" if row is not None and epoch < row[1] else "not live"
            connection.execute("COMMIT")
        except BaseException:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
        return _Result(outcome, resource, epoch, value, *(stored or (None, None)))


class Yours:
    """A reader's receiver, made as NAME(path), as the explorer asks it: its write's answer
    (an Outcome, its text, or a result with .outcome) as a result run_experiment.write reads,
    with no stored pair; its read(resource), if it has one, as (epoch, value) or None.  An
    answer of another kind, or a method that does not fit, is Unsupported: the interface,
    not a finding."""

    def __init__(self, name: str, receiver: Any) -> None:
        self.name, self.receiver = name, receiver
        if not callable(getattr(receiver, "write", None)):
            raise Unsupported(f"{name} has no method write(resource, epoch, value)")
        fits(f"{name}.write(resource, epoch, value)", receiver.write, RESOURCE, 1, "A1")
        if callable(getattr(receiver, "read", None)):
            fits(f"{name}.read(resource)", receiver.read, RESOURCE)
        if callable(getattr(receiver, "close", None)):
            fits(f"{name}.close()", receiver.close)

    def close(self) -> None:
        getattr(self.receiver, "close", lambda: None)()

    def write(self, resource: str, epoch: int, value: str) -> Any:
        said = self.receiver.write(resource, epoch, value)
        outcome = getattr(said, "outcome", said)  # a WriteResult, as the library's Receiver's
        if not isinstance(outcome, str) or outcome not in _OUTCOMES:
            raise Unsupported(
                f"{self.name}.write({resource!r}, {epoch!r}, {value!r}) answered "
                f"{reprlib.repr(said)}: not an Outcome, its text ({', '.join(_OUTCOMES)}), or "
                "a result with .outcome")
        return _Result(Outcome(outcome), resource, epoch, value, None, None)

    def __getattr__(self, name: str) -> Any:  # read(resource), if the receiver has one
        if name != "read" or not callable(getattr(self.receiver, "read", None)):
            raise AttributeError(name)
        return self._read

    def _read(self, resource: str) -> tuple[int, str] | None:
        call = f"{self.name}.read({resource!r})"
        try:
            pair = self.receiver.read(resource)
        except Exception as exc:  # noqa: BLE001 - the interface, in one line
            raise Unsupported(f"{call} raised {type(exc).__name__}: {exc}") from None
        if pair is None:
            return None
        if (not isinstance(pair, (tuple, list)) or len(pair) != 2
                or type(pair[0]) is not int or not isinstance(pair[1], str)):
            raise Unsupported(f"{call} returned {reprlib.repr(pair)}: not None or an (epoch, "
                              "value) pair of an int and a str")
        return pair[0], pair[1]


_OUTCOMES = tuple(outcome.value for outcome in Outcome)


class _Shifted:
    """The library's authority with every epoch it gives or takes shifted up by `shift`, so
    that the receivers see epochs from shift + 1 on (--first-epoch): its public calls only."""

    def __init__(self, authority: LeaseAuthority, shift: int) -> None:
        self.authority, self.shift = authority, shift

    def _out(self, lease: Lease | None, by: int = 1) -> Any:
        return None if lease is None else dataclasses.replace(
            lease, epoch=lease.epoch + by * self.shift)

    def acquire(self, resource: str, holder: str, *, now: int, ttl: int) -> Lease:
        try:
            lease: Lease = self._out(self.authority.acquire(resource, holder, now=now, ttl=ttl))
            return lease
        except leases.LeaseHeld as held:
            raise leases.LeaseHeld(self._out(held.lease)) from None

    def renew(self, lease: Lease, *, now: int, ttl: int) -> Lease:
        renewed: Lease = self._out(self._kept(self.authority.renew, self._out(lease, -1),
                                              now=now, ttl=ttl))
        return renewed

    def release(self, lease: Lease) -> None:
        self._kept(self.authority.release, self._out(lease, -1))

    def _kept(self, call: Callable[..., Any], lease: Lease, **kwargs: Any) -> Any:
        try:
            return call(lease, **kwargs)
        except leases.LeaseLost as lost:
            raise leases.LeaseLost(self._out(lost.lease), self._out(lost.current),
                                   lost.reason) from None

    def current(self, resource: str, *, now: int) -> Lease | None:
        return self._out(self.authority.current(resource, now=now))  # type: ignore[no-any-return]

    def close(self) -> None:
        self.authority.close()


class _Result(NamedTuple):
    outcome: str
    resource: str
    epoch: int
    value: str
    stored_epoch: int | None
    stored_value: str | None


class _AtTick:
    """AskingReceiver as run_experiment.write asks a receiver: the step's tick given."""

    def __init__(self, receiver: AskingReceiver, now: int) -> None:
        self.receiver, self.now = receiver, now

    def write(self, resource: str, epoch: int, value: str) -> _Result:
        return self.receiver.write(resource, epoch, value, now=self.now)


def played(step: Step, held: Lease | None, objects: Sequence[Any], path: str,
           resource: str) -> tuple[Lease | None, tuple[tuple[Any, ...], ...]]:
    """Play `step` for a holder keeping `held`, on its authority and places (`objects`),
    through run_experiment's perform and write: the lease it keeps, and each place's event.
    An exception is an answer too ("raised ..."), which no rule gives."""
    authority: Any = objects[0]
    receivers = [_AtTick(o, step.tick) if isinstance(o, AskingReceiver) else o
                 for o in objects[1:]]
    events: list[StepResult] = []
    kept = held
    try:
        kept, first = perform(step, held, authority, receivers[0], resource)
        events.append(first)
    except Unsupported:
        raise
    except Exception as exc:  # noqa: BLE001 - a broken library's answer, checked as one
        events.append(_raised(step, exc, path))
    raised = events[0].outcome.startswith("raised")
    if step.action is not Action.WRITE or held is None or raised:
        events *= len(receivers)
    else:
        for receiver in receivers[1:]:
            try:
                events.append(write(step, held, receiver))
            except Unsupported:
                raise
            except Exception as exc:  # noqa: BLE001 - as above
                events.append(_raised(step, exc, path))
    return kept, tuple(tuple(event.as_json().get(key) for key in _KEYS) for event in events)


def _raised(step: Step, exc: BaseException, path: str) -> StepResult:
    text = str(exc).replace(os.path.dirname(path) + os.sep, "")  # the same in every folder
    return StepResult.of(step, f"raised {type(exc).__name__}: {text}")


# --- the search: schedules counted by state, each call played once per content ---


class _File:
    """The search's one file and the objects on it, with a connection of the explorer's own
    that reads and sets everything the file's tables hold."""

    def __init__(self, folder: str, rules: tuple[Place, ...], bound: Bound) -> None:
        self.path, self.places, self.bound = os.path.join(folder, "leases.sqlite3"), rules, bound
        self.caller = Caller(bound.timeout)
        self.objects = self._open()
        self.raw = sqlite3.connect(self.path, isolation_level=None, timeout=0)
        self.raw.execute("PRAGMA synchronous = OFF")  # its own writes only: a crash loses a run
        self.contents: list[Any] = []
        self.ids: dict[Any, int] = {}
        self.here = self._intern(self._read())

    def _open(self) -> list[Any]:
        objects: list[Any] = self.caller.call("making the objects", opened, self.path,
                                              self.places, self.bound.first_epoch)
        return objects

    def close(self) -> None:
        self.raw.close()
        self.caller.stop(closed, self.objects, self.places)

    def play(self, at: int, step: Step, held: Lease | None, resource: str) -> tuple[Run, int]:
        """Play `step` from the content `at`: what it did, and the content it left."""
        if at != self.here:
            self._restore(self.contents[at])
        kept, events = self.caller.call(str(step), played, step, held, self.objects,
                                        self.path, resource)
        left = False
        try:
            content = self._read()
        except sqlite3.OperationalError:  # locked: a transaction left open
            left = True
            self.caller.call("closing the objects", closed, self.objects, self.places)
            self.objects = self._open()
            content = self._read()
        self.here = self._intern(content)
        return Run(lease_fields(kept), events, left), self.here

    def _intern(self, content: Any) -> int:
        if content not in self.ids:
            self.ids[content] = len(self.contents)
            self.contents.append(content)
        return self.ids[content]

    def _read(self) -> Any:
        """Every table's schema and rows (a rowid table's rowids too), under the write lock."""
        self.raw.execute("BEGIN IMMEDIATE")
        try:
            tables = self.raw.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'"
                                      " ORDER BY name").fetchall()
            return tuple((name, sql, tuple(self.raw.execute(self._select(name, sql))))
                         for name, sql in tables)
        finally:
            self.raw.execute("COMMIT")

    @staticmethod
    def _select(name: str, sql: str) -> str:
        if "WITHOUT ROWID" in sql.upper():
            return f'SELECT * FROM "{name}"'  # in key order
        return f'SELECT rowid, * FROM "{name}" ORDER BY rowid'

    def _restore(self, content: Any) -> None:
        """Make the tables hold `content` again, in one transaction of the explorer's own."""
        now = self.contents[self.here]
        if [table[:2] for table in content] != [table[:2] for table in now]:
            raise Unsupported("a call changed the tables themselves; the step mode restores "
                              "rows only")
        self.raw.execute("BEGIN IMMEDIATE")
        try:
            for (name, sql, rows), (_, _, rows_now) in zip(content, now):
                if rows != rows_now:
                    self.raw.execute(f'DELETE FROM "{name}"')
                    if rows:
                        self.raw.executemany(self._fill(name, sql, len(rows[0])), rows)
            self.raw.execute("COMMIT")
        except BaseException:
            if self.raw.in_transaction:
                self.raw.execute("ROLLBACK")
            raise
        self.here = self._intern(content)

    def _fill(self, name: str, sql: str, width: int) -> str:
        columns = [row[1] for row in self.raw.execute(f'PRAGMA table_info("{name}")')]
        if "WITHOUT ROWID" not in sql.upper():
            columns.insert(0, "rowid")
        names = ", ".join(f'"{c}"' for c in columns)
        return f'INSERT INTO "{name}" ({names}) VALUES ({", ".join("?" * width)})'


def explore_steps(bound: Bound, receivers: tuple[Place, ...] | None = None, *,
                  sample: int = 8, seed: int = 0) -> dict[str, Any]:
    """Every schedule of `bound`, counted by state; the table of what happened (see `table`).
    A failing witness and `sample` random schedules (drawn with `seed`) are played again
    whole from a fresh start, and must answer as in the search: else Different."""
    receivers = receivers or places()
    rules = tuple(place.rules for place in receivers)
    with contextlib.ExitStack() as cleanup:
        folder = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="explore-"))
        asked = [(schedule, Fresh(replay, (bound, receivers, schedule), cleanup))
                 for schedule in _drawn(bound, sample, seed)]  # played while the search runs
        bench = _File(folder, receivers, bound)
        cleanup.callback(bench.close)
        known: dict[Any, tuple[Run, int]] = {}  # (content, step, lease, resource): its run

        def searched(h: int, content: int, step: Step, held: Lease | None,
                     resource: str) -> tuple[Run, int]:
            """A call played once from each content: what it did, and the content after."""
            key = (content, step, lease_fields(held), resource)
            if key not in known:
                known[key] = bench.play(content, step, held, resource)
            return known[key]

        ends, smallest, states = _search(bound, searched, rules)
        found = {flag: _walk(bound, searched, rules, schedule)
                 for flag, schedule in smallest.items()}
        failing = {flag: Fresh(replay, (bound, receivers, smallest[flag]), cleanup)
                   for flag in smallest if flag[0] == "failed" or (
                       flag[0] == "class" and len(receivers) == 1 and receivers[0].spec not in
                       OURS and CLASSES[flag[2]].name in _SHOWN)}  # their pairs read
        for schedule, fresh in asked:
            _same(bound, schedule, _walk(bound, searched, rules, schedule), fresh.result())
        for flag, fresh in failing.items():  # shown as played afresh, stored pairs read
            found[flag] = fresh.result()
            _same(bound, smallest[flag], _walk(bound, searched, rules, smallest[flag]),
                  found[flag])
    return table(bound, receivers, ends, states, len(known), found, smallest)


# How a step is played: by holder h, from a content of the file, with the lease it holds;
# what it did, and the content it left.
Player = Callable[[int, int, Step, "Lease | None", str], tuple[Run, int]]


def _search(bound: Bound, play: Player, rules: tuple[str, ...]
            ) -> tuple[Counter[frozenset[Any]], dict[Any, Schedule], int]:
    """Count schedules by state, one layer per step.  Each state keeps the smallest schedule
    that reaches it and how many schedules reach it with each set of flags (the classes each
    place showed, the checks failed)."""
    layer: dict[State, tuple[Schedule, Counter[frozenset[Any]]]] = {
        _start(bound, rules): ((), Counter({frozenset(): 1}))}
    smallest: dict[Any, Schedule] = {}
    states = 1
    for _ in range(bound.holders * len(bound.program)):
        following: dict[State, tuple[Schedule, Counter[frozenset[Any]]]] = {}
        for state, (schedule, counts) in layer.items():
            for h, tick in _next(bound, state.tick, state.positions):
                reach = (*schedule, (h, tick))
                try:
                    flags, goes, _ = _stepped(bound, play, rules, state, h, tick)
                except Hung as hung:
                    raise Hung(hung.said, reach) from None
                for flag in flags:
                    if flag not in smallest or _order(reach) < _order(smallest[flag]):
                        smallest[flag] = reach
                before = following.get(goes)
                if before is None or _order(reach) < _order(before[0]):
                    following[goes] = (reach, before[1] if before else Counter())
                target = following[goes][1]
                for having, count in counts.items():
                    target[having | flags] += count
        layer, states = following, states + len(following)
    ends: Counter[frozenset[Any]] = Counter()
    for _, counts in layer.values():
        ends.update(counts)
    return ends, smallest, states


def _start(bound: Bound, rules: tuple[str, ...]) -> State:
    return State(0, 0, (0,) * bound.holders, (None,) * bound.holders,
                 (Record.empty(len(rules), bound.first_epoch),) * bound.resources)


def _stepped(bound: Bound, play: Player, rules: tuple[str, ...], state: State, h: int,
             tick: int) -> tuple[frozenset[Any], State, Run]:
    """Holder h's next step at `tick` from `state`: the flags it raises, the state after,
    and what it did."""
    step = bound.step(h, state.positions[h], tick)
    resource, r = bound.resource(h), h % bound.resources
    belief = state.leases[h]
    held = None if belief is None else Lease(*belief)
    run, content = play(h, state.content, step, held, resource)
    others = tuple(lease for g, lease in enumerate(state.leases)
                   if g != h and lease is not None and lease[0] == resource)
    found, failed, after = judged(state.records[r], step, held, run, others, rules, resource)
    flags = frozenset([*(("class", p, c) for p, c in found),
                       *(("failed", check, place) for check, place in failed)])
    return flags, State(content, tick, _put(state.positions, h, state.positions[h] + 1),
                        _put(state.leases, h, run.kept), _put(state.records, r, after)), run


def _order(schedule: Schedule) -> tuple[Any, ...]:
    """Smaller first: by ticks, then by holders."""
    return tuple(t for _, t in schedule), tuple(h for h, _ in schedule)


def _next(bound: Bound, tick: int, positions: tuple[int, ...]) -> Iterator[tuple[int, int]]:
    """Every (holder, tick) that may come next: a holder not done, at any tick from now on."""
    for h, position in enumerate(positions):
        if position < len(bound.program):
            yield from ((h, later) for later in range(tick, bound.last_tick + 1))


def _put(items: tuple[Any, ...], index: int, item: Any) -> tuple[Any, ...]:
    return (*items[:index], item, *items[index + 1:])


class Walked(NamedTuple):
    """One step of a schedule played: what it did, the checks it failed (check, place), and
    at each place the contract's answer and the pair stored before, by the record."""

    step: Step
    resource: str
    run: Run
    failed: list[Any]
    expected: tuple[str, ...]
    stored: tuple[Any, ...]


def _walk(bound: Bound, play: Player, rules: tuple[str, ...],
          schedule: Schedule) -> list[Walked]:
    """One schedule played by `play`, step by step."""
    state, steps = _start(bound, rules), list[Walked]()
    for h, tick in schedule:
        step, r = bound.step(h, state.positions[h], tick), h % bound.resources
        held = None if state.leases[h] is None else Lease(*state.leases[h])
        answers, _ = expected(state.records[r], step, held, rules, bound.resource(h))
        stored = state.records[r].stored
        try:
            flags, state, run = _stepped(bound, play, rules, state, h, tick)
        except Hung as hung:
            raise Hung(hung.said, schedule[:len(steps) + 1]) from None
        steps.append(Walked(step, bound.resource(h), run, sorted(
            flag[1:] for flag in flags if flag[0] == "failed"), tuple(
                str(a[0]) for a in answers), stored))
    return steps


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


def replay(bound: Bound, receivers: tuple[Place, ...], schedule: Schedule) -> list[Walked]:
    """Play `schedule` whole from a fresh start: a new file, each holder with objects of its
    own.  Run in a new process, this library is freshly imported.  Each step's run, and the
    checks it failed, as the search's _walk gives them."""
    with tempfile.TemporaryDirectory(prefix="explore-replay-") as folder:
        whole = _Whole(os.path.join(folder, "leases.sqlite3"), bound, receivers)
        try:
            return _walk(bound, whole.play, tuple(p.rules for p in receivers), schedule)
        finally:
            whole.close()


class _Whole:
    """A file played on from its start, each holder on objects of its own; what each place
    stores is read (read(resource), if it has one) before and after each write."""

    def __init__(self, path: str, bound: Bound, receivers: tuple[Place, ...]) -> None:
        self.path, self.bound, self.receivers = path, bound, receivers
        self.caller = Caller(bound.timeout)
        self.objects = [self._open() for _ in range(bound.holders)]
        self.raw = sqlite3.connect(path, isolation_level=None, timeout=0)

    def _open(self) -> list[Any]:
        objects: list[Any] = self.caller.call("making the objects", opened, self.path,
                                              self.receivers, self.bound.first_epoch)
        return objects

    def play(self, h: int, content: int, step: Step, held: Lease | None,
             resource: str) -> tuple[Run, int]:
        kept, events, seen = self.caller.call(str(step), _observed, step, held,
                                              self.objects[h], self.path, resource)
        try:  # the write lock free again after the call
            self.raw.execute("BEGIN IMMEDIATE")
            self.raw.execute("COMMIT")
        except sqlite3.OperationalError:
            self.caller.call("closing the objects", closed, self.objects[h], self.receivers)
            self.objects[h] = self._open()
            return Run(lease_fields(kept), events, True, seen), content
        return Run(lease_fields(kept), events, False, seen), content

    def close(self) -> None:
        self.raw.close()
        self.caller.stop(_closed_all, self.objects, self.receivers)


def _closed_all(objects: Sequence[Sequence[Any]], receivers: Sequence[Place]) -> None:
    for own in objects:
        closed(own, receivers)


def _observed(step: Step, held: Lease | None, objects: Sequence[Any], path: str,
              resource: str) -> tuple[Any, ...]:
    """`played`, with each place's stored pair read before and after a write."""
    def stored() -> list[Any]:
        return [UNREAD if not hasattr(store, "read") else store.read(held.resource)
                for store in objects[1:]] if held and step.action is Action.WRITE else []

    before = stored()
    kept, events = played(step, held, objects, path, resource)
    return kept, events, tuple(zip(before, stored()))


UNREAD = "unread"  # a stored pair the receiver cannot say: it has no read(resource)


class Hung(Exception):
    """A call of the code under test gave no answer within the bound: a finding, exit 1.
    `said` names the call; `schedule`, where known, the steps up to it."""

    def __init__(self, said: str, schedule: Schedule = (), lines: Sequence[str] = (),
                 witness: str = "") -> None:
        super().__init__(said)
        self.said, self.schedule, self.lines, self.witness = said, schedule, lines, witness

    def __reduce__(self) -> tuple[Any, ...]:  # it crosses from a replay's process
        return type(self), (self.said, self.schedule, self.lines, self.witness)


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


def _same(bound: Bound, schedule: Schedule, searched: list[Walked],
          fresh: list[Walked]) -> None:
    """Different, naming the schedule and the first call answered otherwise from a fresh
    start; a failure found in the search must be found again."""
    for index, (walked, walked_again) in enumerate(zip(searched, fresh)):
        run, failed, again, failed_again = (walked.run, walked.failed, walked_again.run,
                                            walked_again.failed)
        if run[:2] != again[:2] or failed != failed_again:
            step = bound.step(schedule[index][0], sum(
                h == schedule[index][0] for h, _ in schedule[:index]), schedule[index][1])
            raise Different(
                f"the schedule {_said(schedule)}: step {index + 1} ({step}) answered "
                f"{_answers(run)!r} in the search but {_answers(again)!r} played whole from "
                "a fresh start: its answer rests on more than the file and the call")


def _answers(run: Run) -> list[Any]:
    return [event[3] if event[3] != "applied" else f"applied {event[4]}" for event in
            run.events] + ([] if run.kept is None else [f"keeps epoch {run.kept[2]}"])


def _said(schedule: Schedule) -> str:
    return " ".join(f"{HOLDERS[h]}@{tick}" for h, tick in schedule)


def _drawn(bound: Bound, sample: int, seed: int) -> list[Schedule]:
    """`sample` schedules, each a random walk of the bound drawn with `seed`."""
    chance, drawn = random.Random(seed), []
    for _ in range(sample):
        tick, positions, schedule = 0, [0] * bound.holders, list[tuple[int, int]]()
        while len(schedule) < bound.holders * len(bound.program):
            h, tick = chance.choice(list(_next(bound, tick, tuple(positions))))
            positions[h] += 1
            schedule.append((h, tick))
        drawn.append(tuple(schedule))
    return drawn


# --- the table ---


def table(bound: Bound, receivers: tuple[Place, ...], ends: Counter[frozenset[Any]],
          states: int, calls: int, found: dict[Any, list[Walked]],
          smallest: dict[Any, Schedule]) -> dict[str, Any]:
    """What the search found, as JSON: the schedules in each class at each place (a schedule
    counts in every class it shows), the schedules failing each check, and witnesses."""
    schedules, formula = bound.count()

    def having(*start: Any) -> int:
        """The schedules with a flag that begins with `start`."""
        return sum(count for flags, count in ends.items()
                   if any(f[:len(start)] == start for f in flags))

    names = [place.name for place in receivers]
    witnesses = {f"{names[f[1]]} {CLASSES[f[2]].name}": [_json(w.run.events[f[1]])
                                                       for w in steps]
                 for f, steps in found.items() if f[0] == "class"}
    shown = {f"{names[f[1]]} {CLASSES[f[2]].name}": (_said(smallest[f]), _lines(
        bound, steps, f[1])) for f, steps in found.items() if f[0] == "class"}
    failures = {}
    for (_, check, place), steps in sorted(found.items(), key=lambda item: (  # the library
            str(item[0][:2]), item[0][2] != "authority", str(item[0]))):  # first, if it failed
        if _ != "failed" or check in failures:
            continue
        column = 0 if place == "authority" else int(place)
        where = "authority" if place == "authority" else names[int(place)]
        failures[check] = {"at": where,
                           "events": [_json(w.run.events[column]) for w in steps],
                           "schedule": _said(smallest[_, check, place]),
                           "lines": _lines(bound, steps, column)}
    return {
        "bound": dataclasses.asdict(bound),
        "schedules": schedules, "formula": formula, "counted": sum(ends.values()),
        "states": states, "calls_played": calls,
        "leases_can_expire": bound.ttl <= bound.last_tick,
        "receivers": {place.name: place.says for place in receivers},
        "kinds": {**{cls.name: cls.kind for cls in CLASSES}, "clean": "neither"},
        "classes": {name: {**{cls.name: having("class", p, c)
                              for c, cls in enumerate(CLASSES)},
                           "clean": schedules - having("class", p)}
                    for p, name in enumerate(names)},
        "violations": {check: having("failed", check)
                       for check in CHECKS},
        "witnesses": dict(sorted(witnesses.items())),
        "shown": shown,
        "failures": failures,
        "replay": command(bound, receivers, "steps", "SCHEDULE"),
    }


def _lines(bound: Bound, steps: list[Walked], p: int) -> list[str]:
    """A witness at place p as a reader sees it: each step's answer, and for a write the
    pair stored before and after (as read, in a replay; else as the receiver said) and the
    contract's answer; each step's failed checks; then each resource's verdict, alone."""
    lines = []
    for w in steps:
        e = _json(w.run.events[p])
        where = f"  {w.resource:<16}" if bound.resources > 1 else ""
        epoch = f"epoch {e['epoch']}" if e["epoch"] is not None and e["outcome"] != "held" \
            else ""
        if e["action"] == "write" and e["value"] is not None:
            before, after = w.run.seen[p] if w.run.seen else (
                w.stored[p], None if e["stored_epoch"] is None else (e["stored_epoch"],
                                                                     e["stored_value"]))
            detail = (f"{e['value']!r}: stored {shown_pair(before)} -> {shown_pair(after)}; the "
                      f"contract: {w.expected[p]}")
        elif e["outcome"] == "held":
            detail = f"by epoch {e['epoch']}, live until tick {e['expires_at']}"
        elif e["expires_at"] is not None:
            detail = f"lease until tick {e['expires_at']}"
        else:
            detail = ""
        lines.append(f"  tick {e['tick']:>2}  {e['actor']}{where}  {e['action']:<7}  "
                     f"{epoch:<8}  {e['outcome']:<8}  {detail}".rstrip())
        failed = [check for check, place in w.failed if place in ("authority", str(p))]
        if failed:
            lines.append(f"      failed: {', '.join(dict.fromkeys(failed))}")
    for resource in dict.fromkeys(w.resource for w in steps):  # each judged alone
        events = [_event(_json(w.run.events[p])) for w in steps if w.resource == resource]
        try:
            verdict = judge([e for e in events if not str(e.outcome).startswith("raised")])
        except ValueError:  # a broken library's events need not make a verdict
            continue
        name = f"{resource}: " if bound.resources > 1 else ""
        lines.append(f"  {name}final value written by {verdict['final_value_written_by']}; "
                     f"stale writes refused: {verdict['stale_writes_refused']}, conflicting: "
                     f"{verdict['conflicting_writes_refused']}")
        lines += [f"  {name}{cls.name}: {cls.says}" for cls in run_experiment.CLASSES
                  if verdict[cls.field] is True]
    return lines


_SHOWN = ("lost update", "stale refused", "gap")  # the witnesses shown when no check fails
OURS = ("fenced", "unfenced", "asking")  # the places of a run without --receiver


def shown_pair(pair: Any) -> str:
    """A stored pair as a witness shows it."""
    if pair == UNREAD:
        return "? (no read())"
    return "nothing" if pair is None else f"({pair[0]}, {pair[1]!r})"


def command(bound: Bound, receivers: Sequence[Place], mode: str, witness: str) -> str:
    """The command line that plays `witness` again alone, in a fresh process."""
    words = ["python3", "explorer/explore.py", *["--statements"] * (mode == "statements"),
             "--holders", str(bound.holders), "--program", *bound.program,
             "--last-tick", str(bound.last_tick), "--ttl", str(bound.ttl)]
    words += ["--resources", str(bound.resources)] * (bound.resources != 1)
    words += ["--first-epoch", str(bound.first_epoch)] * (bound.first_epoch != 1)
    words += ["--timeout", f"{bound.timeout:g}"] * (bound.timeout != Bound.timeout)
    if len(receivers) == 1:
        words += ["--receiver", receivers[0].spec]
    return shlex.join([*words, "--replay", witness])


def report(table_: dict[str, Any], seconds: float) -> str:
    """The table as a reader sees it, with the smallest schedule of each harm, or of the
    first check failed."""
    bound, counts = Bound(**{**table_["bound"], "program": tuple(table_["bound"]["program"])}), \
        table_["classes"]
    failed = [name for name, count in table_["violations"].items() if count]
    lines = [
        f"every schedule of {bound.said()}",
        f"  {table_['schedules']:,} schedules = {table_['formula']}",
        f"  {table_['states']:,} states, {table_['calls_played']:,} calls played, {seconds:.1f} s",
        "  a schedule counts in every class it shows at least once",
        f"  {'schedules with':<30}{'kind':<12}{''.join(f'{r:>12}' for r in counts)}",
        *(f"  {name:<30}{kind:<12}{''.join(f'{c[name]:>12,}' for c in counts.values())}"
          for name, kind in table_["kinds"].items()),
        *(f"  {name}: {says}" for name, says in table_["receivers"].items()),
        f"  checks failed: {', '.join(failed) or 'none'} (of: {', '.join(CHECKS)})",
    ]
    if not table_["leases_can_expire"]:
        lines.append(f"  no lease can expire by tick {bound.last_tick} (ttl {bound.ttl}): "
                     "no write can be late, so no gap or lost update, whatever the code")
    replay = table_["replay"]
    if failed:
        failure = table_["failures"][failed[0]]
        shown = [((f"the smallest schedule failing {failed[0]!r} (at {failure['at']}), failing "
                   "again played whole from a fresh start, stored pairs as read"),
                  failure["schedule"], failure["lines"])]
    else:
        names = list(table_["receivers"])
        yours = names[0] if len(names) == 1 else None
        wanted = ([f"{yours} {name}" for name in _SHOWN] if yours
                  else ["unfenced lost update", "fenced stale refused", "fenced gap"])
        shown = [(f"the smallest {name}", *table_["shown"][name]) for name in wanted
                 if name in table_["shown"]]
    for title, schedule, said in shown:
        lines += [title, *said, f"  again: {replay.replace('SCHEDULE', shlex.quote(schedule))}"]
    return "\n".join(lines)


# --- command line ---

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
_EPILOG = f"""\
exit codes:
  {EXIT_OK}    every check held
  {EXIT_FAILED}    a check failed, a call hung (--timeout), or an answer rests on more than the
       file and the call (the schedule and the call are named; a failure shown failed again
       from a fresh start), or the library or --receiver raised as it was made or closed
  {EXIT_USAGE}    bad arguments, or a receiver or file that cannot be used, in one line naming
       the object and method: a signature that does not fit, no write, an answer that is
       no Outcome, a read() that raises or gives no (epoch, value) pair, a module that
       raises or will not compile as it is imported
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C); 143: SIGTERM; 129: SIGHUP; each leaves no child
       process and no folder

examples:
  python3 explorer/explore.py --program acquire write
  python3 explorer/explore.py --program acquire check write   # a check leaves the gap
  python3 explorer/explore.py --holders 3 --resources 2 --last-tick 2 --ttl 1
  python3 explorer/explore.py --receiver examples:ReadmeFence
  python3 explorer/explore.py --receiver examples:TextEpoch --program acquire write \\
      --last-tick 1 --ttl 1 --first-epoch 9      # '10' < '9'
  python3 explorer/explore.py --statements --program acquire release --last-tick 1"""


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; its exit code."""
    parser = argparse.ArgumentParser(
        prog="explorer/explore.py", epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Play every schedule of a small bound on the real library and count what\n"
        "happened at each receiver; with --statements, every interleaving of the calls\n"
        "at each SQL statement.  See explorer/README.md.")
    parser.add_argument("--statements", action="store_true",
                        help="interleave the calls at each SQL statement, with a crash before "
                        "each (default bound: 2 holders, acquire write, tick 0, ttl 1)")
    parser.add_argument("--holders", type=int, choices=range(1, 9), metavar="N",
                        help="holders A, B, ... (1 to 8; default 2)")
    parser.add_argument("--program", nargs="+", metavar="WORD",
                        help="each holder's steps, from: acquire renew check write release "
                        "retry (its last write again); default: acquire renew write release")
    parser.add_argument("--last-tick", type=int, choices=range(100), metavar="T",
                        help="ticks 0 to T (default 5)")
    parser.add_argument("--ttl", type=int, choices=range(1, 100), metavar="N",
                        help="ticks a lease lasts (default 2)")
    parser.add_argument("--resources", type=int, choices=(1, 2), metavar="N",
                        help="1 or 2: with 2, A acquires the first, B the second, C the first")
    parser.add_argument("--receiver", metavar="MODULE:NAME",
                        help="explore your receiver: NAME(path) with write(resource, epoch, "
                        "value) answering an Outcome, its text, or a result with .outcome; "
                        "close() and read(resource) if it has them")
    parser.add_argument("--first-epoch", type=int, metavar="N",
                        help="the epoch every party sees for the authority's first grant "
                        "(default 1): 9 shows an epoch kept as TEXT ('10' < '9')")
    parser.add_argument("--timeout", type=float, metavar="S",
                        help="a call not answered within S seconds is a hang, exit 1 "
                        "(default 10)")
    parser.add_argument("--replay", metavar="WITNESS",
                        help="play a witness again alone, in a fresh process, as printed after "
                        "'--replay' (with the same bound, mode and --receiver)")
    parser.add_argument("--sample", type=int, default=8, metavar="N",
                        help="step mode: passing schedules played again from a fresh start "
                        "(default 8)")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    args = parser.parse_args(argv)
    ended = {number: signal.signal(number, _interrupted) for number in _ENDING}
    try:
        return _main(args)
    except KeyboardInterrupt as exc:
        print(f"explore: {getattr(exc, 'said', 'interrupted')}", file=sys.stderr)
        return getattr(exc, "code", EXIT_INTERRUPTED)
    except (ValueError, TypeError, ImportError, Unsupported, OSError, sqlite3.Error,
            LeaseError) as exc:  # a library that cannot open a new file included
        print(f"explore: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        for number, handler in ended.items():
            signal.signal(number, handler)


# SIGTERM and SIGHUP end a run as Ctrl-C does: children stopped, folders removed, and the
# shell's code for the signal (128 + its number).
_ENDING = (signal.SIGTERM, signal.SIGHUP)


class _Ended(KeyboardInterrupt):
    def __init__(self, number: int) -> None:
        super().__init__(number)
        self.code, self.said = 128 + number, f"ended by {signal.Signals(number).name}"


def _interrupted(number: int, frame: object) -> None:
    raise _Ended(number)


def _main(args: argparse.Namespace) -> int:
    import statements

    base = statements.BOUND if args.statements else Bound()
    given = {"holders": args.holders, "last_tick": args.last_tick, "ttl": args.ttl,
             "resources": args.resources, "first_epoch": args.first_epoch,
             "timeout": args.timeout,
             "program": tuple(args.program) if args.program else None}
    bound = dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})
    receivers = places(args.receiver)
    mode = "statements" if args.statements else "steps"
    started = time.monotonic()
    try:
        if args.replay is not None and args.statements:
            text, ok = statements.replay(bound, receivers[0], args.replay)
        elif args.replay is not None:
            text, ok = replay_steps(bound, receivers, parse(bound, args.replay))
        elif args.statements:
            found = statements.explore_statements(bound, receivers[0])
            text, ok = statements.report(found, time.monotonic() - started), found["ok"]
        else:
            result = explore_steps(bound, receivers, sample=args.sample, seed=args.seed)
            text = report(result, time.monotonic() - started)
            ok = not any(result["violations"].values())
    except Hung as hung:  # a finding: the call, and how to play it again
        witness = hung.witness or _said(hung.schedule)
        text, ok = "\n".join([f"hang: {hung.said}", *hung.lines, *[
            "  again: " + command(bound, receivers, mode, witness)] * bool(witness)]), False
    except (Different, Raised) as exc:  # the code under test's failure, not the explorer's
        print(f"explore: {exc}", file=sys.stderr)
        return EXIT_FAILED
    try:
        print(text, flush=True)
    except BrokenPipeError:  # the reader closed stdout (`| head`): the verdict stands
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_OK if ok else EXIT_FAILED


def parse(bound: Bound, witness: str) -> Schedule:
    """A step mode witness as printed ("A@0 A@0 B@1"): ValueError naming what does not fit
    the bound."""
    schedule, counts, tick = [], Counter[int](), 0
    for token in witness.replace(",", " ").split():
        found = re.fullmatch(r"([A-H])@(\d+)", token)
        h = HOLDERS.index(found.group(1)) if found else bound.holders
        if not found or h >= bound.holders or not tick <= int(found.group(2)) <= \
                bound.last_tick or counts[h] == len(bound.program):
            raise ValueError(f"the witness {witness!r}: {token!r} is no step of this bound "
                             f"({bound.said()}): a holder, @, a tick that never goes back")
        tick, counts[h] = int(found.group(2)), counts[h] + 1
        schedule.append((h, tick))
    return tuple(schedule)


def replay_steps(bound: Bound, receivers: tuple[Place, ...],
                 schedule: Schedule) -> tuple[str, bool]:
    """A step mode witness played again alone, in a fresh process: each place's timeline."""
    with contextlib.ExitStack() as cleanup:
        steps = Fresh(replay, (bound, receivers, schedule), cleanup).result()
    failed = sorted({check for w in steps for check, _ in w.failed})
    lines = [(f"the schedule {_said(schedule)} of {bound.said()}, played again whole in a "
              "new process, stored pairs as read")]
    for p, place in enumerate(receivers):
        lines += [f"at {place.name} ({place.says}):", *_lines(bound, steps, p)]
    lines.append(f"  checks failed: {', '.join(failed) or 'none'} (of: {', '.join(CHECKS)})")
    return "\n".join(lines), not failed


if __name__ == "__main__":  # run as the module `explore`, which statements.py imports
    import explore

    sys.exit(explore.main())
