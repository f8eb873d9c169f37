"""Play every schedule of a small bound on the real code, and count what happened.

A bound is H holders that all run one program of steps (acquire, renew, check, write,
release, and retry: its last write sent again), one ttl, the ticks 0..T, and one resource or
two (A acquires the first, B the second, C the first, ...).  A schedule is an order of the
holders' steps and the tick of each, refused steps included.  Each step is played through
the scenario workers' own code (run_experiment.perform) on the real authority and on three
receivers in its file: the model's fenced and unfenced receivers, and AskingReceiver, a
contrast that is NOT the model's receiver.

The contract:

* A state (`State`) is everything the database holds (its schema, every row of every table and
  the header's user_version and application_id, read back with the explorer's own SQL after
  each call), the tick, each holder's place and lease, and the explorer's record.  Every step
  starts from exactly that content, and two schedules merge only where all of it is identical.
  Each holder plays through a copy of leases of its own.  A call already played from the same
  content is answered as it was: exact while the library remembers nothing outside the file,
  which a deep walk of each holder's objects, classes and globals checks after every call
  played (once it remembers, each holder's calls so far are in the state too); every call is
  played again under a later clock and must answer the same, and one that leaves a transaction
  open or a temporary table fails the model check.  A failing schedule is played whole again,
  from a new file, before it is shown.
* Every check (`CHECKS`: a named function each) compares a step with the record (`Record`:
  what the authority and each receiver answered), never with the rows the code under test wrote.
* `explore(bound, brute_force=True)` plays every schedule whole, from an empty database,
  restoring nothing; the suite compares the two.
* A class counts the schedules in which it happens at least once: one schedule can fall in
  several.  A stop noted by run_experiment.command ends the run within one transition; a line
  on stderr every 2 s (states so far, and their rate) shows early a bound too large to finish.

With `--statements`, the holders' calls interleave at each SQL statement instead: each holder
plays in a thread of its own, through its own copy of the library, stopped before each
statement; SQLite waits for no lock, and a holder its lock refused waits until another has
moved.  Statements of a holder that holds the write lock are no interleaving points (in WAL
mode no other connection can see or change what it does before COMMIT), except that once, as
it takes the lock, another holder about to take it may try and be refused.  Before each
statement the holder may also die: its connections close with no COMMIT, as a process's do
when it is killed, and a new process takes the same step again.  After a crash or a refusal
the rest is played one way.  Each interleaving is played whole, from the file emptied; the
answers must be the model's in some one-at-a-time order of the calls (linearizable), with
every call whose change committed in it, whole: a call taken again after a crash answers as
the model says, a replay if its first try was applied.  A call that leaves a transaction open
fails, as in the step mode.

    python3 explore.py [--holders N] [--program ACTION ...] [--last-tick T] [--ttl N]
                       [--resources N] [--statements] [--output PATH]
"""

import argparse
import contextlib
import copy
import dataclasses
import enum
import functools
import gc
import importlib.util
import math
import os
import queue
import random
import re
import sqlite3
import sys
import tempfile
import threading
import time
import types
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import leases
from leases import (
    BUSY_TIMEOUT_SECONDS,
    Lease,
    Outcome,
    is_live,
)
from run_experiment import (
    CLASSES,
    EXIT_DIFFERENT,
    EXIT_OK,
    RESOURCE,
    SHARED_EXIT_CODES,
    Action,
    Answer,
    Event,
    Step,
    Write,
    canonical_json,
    classes,
    command,
    judge,
    make_parser,
    note,
    output_target,
    perform,
    publish,
    scratch,
    stop_if_asked,
    timeline,
    write,
)

__all__ = ["CHECKS", "EXIT_CODES", "PLACES", "RECEIVERS", "RESOURCES", "AskingReceiver", "Bound", "Move",
           "Record", "State",
           "explore", "main"]

# Each step writes to all three; "asking" is AskingReceiver, the contrast, not the model's.
RECEIVERS = ("fenced", "unfenced", "asking")
RESOURCES = (RESOURCE, "annual-report")
_FIELDS = ("outcome", "epoch", "expires_at", "value", "stored_epoch", "stored_value")


class Retry(str, enum.Enum):
    """A program's word of explore's own, beside run_experiment's actions."""

    RETRY = "retry"  # the holder's last write sent again, with the lease it holds now


RETRY = Retry.RETRY


@dataclass(frozen=True)
class Bound:
    """Holders A, B, ... that all run `program`, acquiring or renewing for `ttl` ticks; with
    two `resources`, holders take turns: A acquires the first, B the second, C the first."""

    holders: int = 2
    program: tuple[Action | Retry, ...] = (Action.ACQUIRE, Action.RENEW, Action.WRITE,
                                           Action.RELEASE)
    last_tick: int = 5
    ttl: int = 2
    resources: int = 1

    def __post_init__(self) -> None:
        if RETRY in self.program and Action.WRITE not in self.program[
                : self.program.index(RETRY)]:
            raise ValueError(f"a retry sends the holder's last write again: it needs a write "
                             f"before it, got {' '.join(word.value for word in self.program)!r}")

    def resource(self, h: int) -> int:
        """The index in RESOURCES of the resource holder h acquires."""
        return h % self.resources

    @functools.cache  # noqa: B019 - a few bounds, a few steps each
    def step(self, h: int, position: int, tick: int) -> Step:
        """Holder h's step at `position`; its k-th write sends its name and k, as "A1", and a
        retry after it sends "A1" again."""
        word = self.program[position]
        actor, action = "ABCDEFGH"[h], Action.WRITE if word is RETRY else Action(word)
        timed = action in (Action.ACQUIRE, Action.RENEW)
        k = self.program[: position + 1].count(Action.WRITE)
        value = f"{actor}{k}" if action is Action.WRITE else None
        return Step(actor, action, tick, self.ttl if timed else None, value)


class AskingReceiver:
    """NOT the model's receiver: explore.py's contrast, a receiver that asks the authority.

    Inside its own write transaction (BEGIN IMMEDIATE on the authority's file, so that no
    grant comes between its read and its write) it reads the authority's row, and applies a
    write only if its epoch is the lease live at the write's tick `now`.  It refuses the rest
    as "stale" (a higher epoch was granted) or "not live" (the write's lease expired or was
    released, and nobody took over).  This is possible only because both share one file.  Its
    decisions go to a table of its own, as the model's receivers' go to theirs.
    """

    def __init__(self, path: str) -> None:
        self._connection = sqlite3.connect(path, isolation_level=None,
                                           timeout=BUSY_TIMEOUT_SECONDS)
        self._connection.execute(
            "CREATE TABLE IF NOT EXISTS asking_decisions (resource TEXT NOT NULL, seq INTEGER"
            " NOT NULL, outcome TEXT NOT NULL, epoch INTEGER NOT NULL, value TEXT NOT NULL,"
            " stored_epoch INTEGER, stored_value TEXT, PRIMARY KEY (resource, seq)) WITHOUT ROWID")

    def close(self) -> None:
        self._connection.close()

    def write(self, resource: str, epoch: int, value: str, *, now: int) -> tuple[Any, ...]:
        """Decide on one write at tick `now`: its outcome, and the (epoch, value) held after."""
        connection = self._connection
        connection.execute("BEGIN IMMEDIATE")
        try:
            row = connection.execute("SELECT holder, epoch, expires_at FROM leases"
                                     " WHERE resource = ?", (resource,)).fetchone()
            seq, *stored = connection.execute(
                "SELECT seq, stored_epoch, stored_value FROM asking_decisions WHERE resource = ?"
                " ORDER BY seq DESC LIMIT 1", (resource,)).fetchone() or (0, None, None)
            if row is not None and row[0] is not None and is_live(row[2], now=now) and (
                    epoch == row[1]):
                outcome, stored = "applied", [epoch, value]
            else:
                outcome = "stale" if row is not None and epoch < row[1] else "not live"
            connection.execute("INSERT INTO asking_decisions VALUES (?, ?, ?, ?, ?, ?, ?)",
                               (resource, seq + 1, outcome, epoch, value, *stored))
            connection.execute("COMMIT")
        except BaseException:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
        return outcome, *stored


def _opened(path: str, library: types.ModuleType = leases) -> list[Any]:
    """The authority and the three receivers on the file `path`, made by `library`."""
    return [_made(path, library, role) for role in range(len(RECEIVERS) + 1)]


def _made(path: str, library: types.ModuleType, role: int) -> Any:
    """The authority (role 0) or one of RECEIVERS (role 1 on) on the file `path`."""
    if role == 0:
        return library.LeaseAuthority(path)
    return AskingReceiver(path) if role == 3 else library.Receiver(path, fenced=role == 1)


# The clock a holder's library reads (ns): a call's first reading, a reading's step, and how
# much later the second play of a call starts, which flips the parity of its seconds and ns.
_START, _STEP, _LATER = 1_767_225_600 * 10**9, 100_000_000, 1_000_000_001


class _Clock:
    """The time module as one holder's library sees it, the same in every play of a call: a
    call starts at _START (`later` ns after it in its second play), and each reading is _STEP
    after the one before, so that the library's own deadlines still pass, and a replay sees
    what the search saw."""

    _NAMES = ("time", "monotonic", "perf_counter", "process_time", "thread_time")

    def __init__(self) -> None:
        self.now = _START

    def start(self, later: int = 0) -> None:
        self.now = _START + later

    def _read(self) -> int:
        self.now += _STEP
        return self.now

    def __getattr__(self, name: str) -> Any:
        real = getattr(time, name)
        if name.removesuffix("_ns") not in self._NAMES:
            return real
        if name.endswith("_ns"):
            return self._read
        return lambda: self._read() / 1e9


def _library(clock: _Clock, sqlite: Any = sqlite3) -> types.ModuleType:
    """A copy of leases of one holder's own, as a process of its own imports it: its classes
    and its globals are no other holder's, and it reads `clock`.  Its exceptions are leases'
    own, so that run_experiment.perform, which catches them by class, catches them."""
    spec = leases.__spec__
    assert spec is not None
    library = importlib.util.module_from_spec(spec)
    assert spec.origin is not None
    exec(_compiled(spec.origin), vars(library))  # noqa: S102 - the library's code, as import runs it
    for name in ("LeaseError", "LeaseHeld", "LeaseLost"):
        setattr(library, name, getattr(leases, name))
    return _rebound(library, clock, sqlite)


def _rebound(library: types.ModuleType, clock: _Clock, sqlite: Any) -> types.ModuleType:
    """`library`, reading `clock` for time, using `sqlite` for sqlite3, and drawing from
    generators that a seed of 0 starts: the same numbers in every play, as the clock."""
    for name, value in list(vars(library).items()):
        if value is time or isinstance(value, _Clock):
            setattr(library, name, clock)
        elif value is sqlite3 or isinstance(value, _Gated):
            setattr(library, name, sqlite)
        elif value is random:
            setattr(library, name, _Seeded())
        elif isinstance(value, random.Random):  # made as it was imported
            value.seed(0)
    return library


class _Seeded(types.SimpleNamespace):
    """The random module as a holder's library sees it: its functions draw from a generator
    of the holder's own, seeded with 0 (a generator the library makes is its own affair)."""

    def __getattr__(self, name: str) -> Any:
        drawn = vars(self).setdefault("_random", random.Random(0))
        return getattr(drawn, name) if name in _DRAWING else getattr(random, name)


_DRAWING = frozenset(name for name in dir(random.Random) if not name.startswith("_")) - {
    "seed", "getstate", "setstate"}


# How many holders' objects tracing keeps, each with its connections open (four file
# descriptors): one not kept is made again by replaying its calls.
_KEPT = 64


@functools.cache
def _compiled(path: str) -> types.CodeType:
    """The library's code, compiled once: each holder's copy runs it afresh."""
    with open(path, encoding="utf-8") as file:
        return compile(file.read(), path, "exec")


class _Holder:
    """One holder: its own copy of the library, its own clock, its own objects on the file."""

    def __init__(self, path: str) -> None:
        self.path, self.clock = path, _Clock()
        self.library = _library(self.clock)
        self.objects = _opened(path, self.library)
        self.memory, self.connections = _memory(self.library, self.objects)

    def reopen(self) -> None:
        """New objects: closing rolls back whatever a call left open."""
        self.close()
        self.objects = _opened(self.path, self.library)
        self.memory, self.connections = _memory(self.library, self.objects)

    def close(self) -> None:
        for store in self.objects:
            store.close()


def _memory(library: types.ModuleType | None,
            objects: Sequence[Any]) -> tuple[Any, list[sqlite3.Connection]]:
    """What a holder's library can remember outside the file, as a value to compare (its
    `objects`, its classes and its module's globals, walked deeply; without `library`, the
    objects alone), and every connection met."""
    connections: list[sqlite3.Connection] = []
    seen: dict[int, Any] = {}  # kept, so that no id is another object's during the walk
    module = "" if library is None else library.__name__

    def walked(value: Any) -> Any:
        if value is None or type(value) in _PLAIN:
            return value
        if isinstance(value, sqlite3.Connection):
            connections.append(value)
            return "a connection"
        if isinstance(value, (types.ModuleType, _Clock, _Gated)):  # _Gated: sqlite3, gated
            return ("module", getattr(value, "__name__", "time"))
        if id(value) in seen:
            return ("again", type(value).__qualname__)
        seen[id(value)] = value
        if isinstance(value, (list, tuple)):
            return (type(value).__qualname__, *map(walked, value))
        if isinstance(value, (set, frozenset)):
            return ("set", *sorted(map(walked, value), key=repr))
        if isinstance(value, dict):
            return ("dict", *((walked(key), walked(item)) for key, item in value.items()))
        if isinstance(value, (staticmethod, classmethod)):
            return walked(value.__func__)
        if isinstance(value, property):
            return ("property", walked(value.fget), walked(value.fset), walked(value.fdel))
        if isinstance(value, enum.Enum):  # a member: its class is walked, and what it was given
            return ("member", repr(value), walked({name: item for name, item in vars(value).items()
                                                   if name != "__objclass__"}))
        if isinstance(value, random.Random):  # its state is not in its attributes
            return ("random", value.getstate())
        if isinstance(value, types.BuiltinMethodType):  # a bound method of a dict, a list ...
            return ("method", value.__name__, walked(value.__self__))
        if isinstance(value, types.FunctionType):
            if not (value.__defaults__ or value.__kwdefaults__ or value.__closure__
                    or vars(value)):
                return "function"  # nothing in it can change: most of a module
            cells = [cell.cell_contents for cell in value.__closure__ or ()
                     if cell.cell_contents is not value]
            return ("function", walked(value.__defaults__), walked(value.__kwdefaults__),
                    walked(cells), walked(vars(value)))
        if hasattr(value, "cache_info") and hasattr(value, "__wrapped__"):  # functools.cache
            return ("cached", str(value.cache_info()), walked(value.__wrapped__))
        if isinstance(value, type):
            if value.__module__ != module:
                return ("class", value.__qualname__)
            return ("class", value.__qualname__, walked(_own(vars(value))))
        if hasattr(value, "__dict__"):
            return (type(value).__qualname__, walked(vars(value)))
        return repr(value)

    ours = [store for store in objects if isinstance(store, AskingReceiver)]
    found = walked((_own(vars(library or types.ModuleType(""))),
                    [store for store in objects if store not in ours]))
    connections.extend(store._connection for store in ours)
    return found, connections


_PLAIN = (bool, int, float, complex, str, bytes)  # what the walk takes as it is


def _own(names: Any) -> dict[str, Any]:
    return {name: value for name, value in names.items() if not name.startswith("__")}


# --- one step, and what it tells: shared by the search and the brute force ---


def _played(step: Step, lease: Lease | None, objects: Sequence[Any],
            resource: str) -> tuple[Any, list[Any]]:
    """Play `step` for a holder with `lease`, acquiring `resource`, through the workers' own
    code: the lease it keeps, and the event at each receiver (one event three times, unless it
    writes)."""
    authority, fenced, unfenced, asking = objects
    try:
        kept, event = perform(step, lease, authority, fenced, resource)
    except Exception as exc:  # noqa: BLE001 - a broken library: an answer no model gives
        return lease, [_raised(step, exc)] * 3
    if step.action is not Action.WRITE or lease is None:
        return kept, [event] * 3
    held, value = lease, step.value

    def ask() -> Event:
        outcome, *stored = asking.write(held.resource, held.epoch, value, now=step.tick)
        return Event(step.actor, step.action, step.tick, outcome, held.epoch, None, value,
                     *stored)

    return kept, [event, _guarded(step, lambda: write(step, held, unfenced)), _guarded(step, ask)]


def _guarded(step: Step, call: Callable[[], Event]) -> Event:
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - as in _played
        return _raised(step, exc)


def _raised(step: Step, exc: Exception) -> Event:
    return Event.of(step, f"raised {type(exc).__name__}: {exc}")


class Record(NamedTuple):
    """The explorer's record of one schedule so far, from the answers alone, never the rows."""

    newest: int  # the highest epoch the authority has granted
    lease: tuple[str | None, int, int] | None  # the authority's lease as its answers leave it:
    # (holder, epoch, expiry), the holder None once released; None before any grant
    leases: tuple[tuple[int, int] | None, ...]  # the lease each holder was answered: (epoch,
    # expiry), None once lost or released
    stored: tuple[tuple[int, str] | None, ...]  # what each of RECEIVERS last applied
    highest_fenced: int  # the highest epoch the fenced receiver has applied

    @classmethod
    def empty(cls, holders: int) -> "Record":
        return cls(0, None, (None,) * holders, (None,) * len(RECEIVERS), 0)


class Move(NamedTuple):
    """One step of one holder, as a check sees it: the record before and after, the answers."""

    before: Record
    after: Record
    h: int
    step: Step
    held: Lease | None  # the lease the holder stepped with
    events: list[Event]  # the answer at each of RECEIVERS (one answer three times,
    # unless it writes)
    kept: Lease | None  # the lease the holder keeps
    resource: str  # the resource the holder acquires; `before` and `after` are its record


# Where a check can fail: at the authority (its answers, the same at every receiver), or at
# one of RECEIVERS.
PLACES = ("authority", *RECEIVERS)
_AUTHORITY = ("authority",)


def fence(move: Move) -> tuple[str, ...]:
    """The fenced receiver applied an epoch no higher than one it applied before."""
    first = move.events[0]
    failed = (_writes(move) and first.outcome == Outcome.APPLIED
              and first.epoch is not None and first.epoch <= move.before.highest_fenced)
    return ("fenced",) if failed else ()


def epochs_increase(move: Move) -> tuple[str, ...]:
    """A grant's epoch is no higher than one granted before."""
    first = move.events[0]
    failed = (first.outcome == Answer.GRANTED and first.epoch is not None
              and first.epoch <= move.before.newest)
    return _AUTHORITY if failed else ()


def one_live_lease(move: Move) -> tuple[str, ...]:
    """Two holders were answered leases live at this tick."""
    live = sum(lease is not None and is_live(lease[1], now=move.step.tick)
               for lease in move.after.leases)
    return _AUTHORITY if live > 1 else ()


def stored_pair(move: Move) -> tuple[str, ...]:
    """A receiver said it holds other than what it last applied, by the record."""
    if not _writes(move):
        return ()
    return tuple(receiver for receiver, event, now in zip(RECEIVERS, move.events,
                                                          move.after.stored)
                 if not event.outcome.startswith("raised")
                 and (event.stored_epoch, event.stored_value) != (now or (None, None)))


def model(move: Move) -> tuple[str, ...]:
    """An answer, or the lease the holder keeps, is not what the rules say from the record."""
    answers, kept = _model(move.before, move.step, move.held, move.resource)
    wrong = tuple(receiver for receiver, answer, event in zip(RECEIVERS, answers, move.events)
                  if answer != tuple(getattr(event, field) for field in _FIELDS))
    if kept != _fields(move.kept) or (wrong and not _writes(move)):
        return (*_AUTHORITY, *(wrong if _writes(move) else ()))
    return wrong


# Each check of every step, and where it failed: nowhere, or some of PLACES.
CHECKS: dict[str, Callable[[Move], tuple[str, ...]]] = {
    "fence": fence, "epochs increase": epochs_increase, "one live lease": one_live_lease,
    "stored pair": stored_pair, "model": model,
}
# Each flag a step can raise: a class at a receiver, or a check failed at a place.
_FLAGS = (*(f"{receiver} {cls.name}" for receiver in RECEIVERS for cls in CLASSES),
          *((check, place) for check in CHECKS for place in PLACES))
_CHECKED = len(CLASSES) * len(RECEIVERS)  # the first flag of a check failed


def _writes(move: Move) -> bool:
    return move.step.action is Action.WRITE and move.held is not None


def _classes(move: Move) -> list[bool]:
    """Whether `move` falls in each of CLASSES, at each of RECEIVERS in turn: judged by the
    scenarios' own rules, on the record (the newest grant, what each receiver last applied,
    the holder's lease), never on the rows."""
    held = move.before.leases[move.h]
    if not _writes(move) or held is None:
        return [False] * (len(CLASSES) * len(RECEIVERS))
    return [found for event, pair in zip(move.events, move.before.stored)
            for found in classes(Write(event, move.before.newest,
                                       None if pair is None else pair[0], held[1]))]


def _recorded(record: Record, h: int, step: Step, held: Lease | None,
              events: list[Event]) -> Record:
    """The record after `step`: from the record and the answers, never from the database."""
    first, writes = events[0], step.action is Action.WRITE and held is not None
    outcome, epoch, expires = first.outcome, first.epoch or 0, first.expires_at or 0
    lease, leases = record.lease, record.leases
    if outcome in (Answer.GRANTED, Answer.RENEWED):
        lease, leases = (step.actor, epoch, expires), _put(leases, h, (epoch, expires))
    elif outcome in (Answer.RELEASED, Answer.LOST):
        leases = _put(leases, h, None)
        if outcome == Answer.RELEASED and lease is not None:
            lease = (None, *lease[1:])
    stored = tuple((event.epoch, event.value) if writes and event.outcome == Outcome.APPLIED
                   else pair for event, pair in zip(events, record.stored))
    fenced_applied = writes and outcome == Outcome.APPLIED
    return Record(max(record.newest, epoch) if outcome == Answer.GRANTED else record.newest,
                  lease, leases, stored,  # type: ignore[arg-type]  # an applied write has both
                  max(record.highest_fenced, epoch) if fenced_applied else record.highest_fenced)


def _judged(record: Record, h: int, step: Step, held: Lease | None,
            events: list[Event], kept: Lease | None, resource: str) -> tuple[int, Record]:
    """The flags a step raises (its classes at each receiver, then the checks it fails), and
    the record of `resource` after it."""
    after = _recorded(record, h, step, held, events)
    move = Move(record, after, h, step, held, events, kept, resource)
    failed = [check(move) for check in CHECKS.values()]
    raised = [*_classes(move), *(place in where for where in failed for place in PLACES)]
    return sum(1 << bit for bit, hit in enumerate(raised) if hit), after


def _model(record: Record, step: Step, held: Lease | None,
           resource: str) -> tuple[list[Any], Any]:
    """What the rules say `step` answers at each receiver, and the lease its holder keeps:
    from the record of `resource` alone."""
    row: Any = record.lease  # (holder, epoch, expiry), or None
    stored, action, tick = record.stored, step.action, step.tick
    live = row is not None and row[0] is not None and is_live(row[2], now=tick)
    mine = row is not None and held is not None and (row[0], row[1]) == (step.actor, held.epoch)
    keep, none = _fields(held), (None, None, None)
    if action is Action.ACQUIRE and live:
        return [("held", row[1], row[2], *none)] * 3, keep
    if action is Action.ACQUIRE or (action is Action.RENEW and mine and live):
        assert step.ttl is not None  # Step checked it
        epoch = held.epoch if held and action is Action.RENEW else row[1] + 1 if row else 1
        answer = "renewed" if action is Action.RENEW else "granted"
        return [(answer, epoch, tick + step.ttl, *none)] * 3, (resource, step.actor, epoch,
                                                              tick + step.ttl)
    if held is None:
        return [("no lease", None, None, *none)] * 3, None
    if action is Action.CHECK and mine and live:
        return [("live", held.epoch, row[2], *none)] * 3, keep
    if action is not Action.WRITE:
        answer = "released" if action is Action.RELEASE and mine else "lost"
        return [(answer, held.epoch, None, *none)] * 3, None
    epoch, value, answers = held.epoch, step.value, []
    for r, pair in enumerate(stored):  # fenced, unfenced, asking
        if r == 2:
            outcome = ("applied" if live and epoch == row[1] else
                       "stale" if row is not None and epoch < row[1] else "not live")
        elif r == 1 or pair is None or epoch > pair[0]:
            outcome = "applied"
        else:
            outcome = "stale" if epoch < pair[0] else "replay" if value == pair[1] else "conflict"
        after = (epoch, value) if outcome == "applied" else pair or (None, None)
        answers.append((outcome, epoch, None, value, *after))
    return answers, keep


def _fields(lease: Any) -> Any:
    return None if lease is None else (lease.resource, lease.holder, lease.epoch, lease.expires_at)


def _bits(flags: int) -> list[int]:
    return [bit for bit in range(len(_FLAGS)) if flags >> bit & 1] if flags else []


def _put(items: tuple[Any, ...], index: int, item: Any) -> tuple[Any, ...]:
    return (*items[:index], item, *items[index + 1 :])


def _next(bound: Bound, tick: int, positions: tuple[int, ...]) -> Iterator[tuple[int, int]]:
    """Every (holder, tick) that may come next: any holder not done, any tick from now on."""
    for h, position in enumerate(positions):
        if position < len(bound.program):
            yield from ((h, later) for later in range(tick, bound.last_tick + 1))


# --- the search: schedules counted by state, each (content, call) played once ---

# What a database holds: its schema (type, name, table, sql of each entry), each table's rows,
# and the header fields a library may write (user_version, application_id).
_Content = tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]]
_HEADER = ("user_version", "application_id")
# What the file holds that a restore does not set: one that changes is refused.
_FIXED = ("journal_mode", "page_size", "auto_vacuum", "encoding")


class _Remembers(BaseException):  # not an error: the search starts again
    """A call changed what its holder's library remembers outside the file."""


class _Bench:
    """Each holder's own objects on one file; a connection of the explorer's own that reads and
    sets the whole file; and every call played so far, by the content it met.

    With `tracing`, a holder's library may remember: a call is told apart also by its holder's
    calls so far (its trace), which decide what the holder's objects remember, and is played
    by objects that made exactly those calls.  With `whole`, nothing is answered again: every
    call is played, in order, from what the last one left.
    """

    def __init__(self, path: str, holders: int, *, tracing: bool = False,
                 whole: bool = False) -> None:
        self.path, self.tracing, self.whole = path, tracing, whole
        self.pool: dict[Any, _Holder] = {}  # each holder's objects, by (holder, trace)
        for h in range(holders):
            self.pool[h, ()] = _Holder(path)
        self.trace: list[tuple[Any, ...]] = [()] * holders
        # Its own connection only: it never waits for a lock (a lock held between calls is the
        # library's fault, found at once), nor syncs its own writes (a crash loses the run, no
        # more).  The library's connections keep their settings, so the cost compares.
        self.raw = sqlite3.connect(path, isolation_level=None, timeout=0)
        self.raw.execute("PRAGMA synchronous = OFF")
        self.ids: dict[_Content, int] = {}
        self.contents: list[_Content] = []
        self.statements: dict[Any, list[tuple[str, str, str]]] = {}
        self.calls: dict[Any, tuple[Any, Exception | None, int]] = {}
        self.here = self.at = self._intern(self._read())  # what the file holds; a step's start
        self.played = 0
        self.stand_ins = [[_StandIn(self, h, role) for role in range(len(RECEIVERS) + 1)]
                          for h in range(holders)]

    def close(self) -> None:
        for holder in self.pool.values():
            holder.close()
        self.raw.close()

    def call(self, h: int, role: int, name: str, *args: Any, **kwargs: Any) -> Any:
        """Holder h's object `role`, its method `name`, from the content `at`: played once,
        then answered."""
        trace = self.trace[h]
        key = (self.at, role, name, args, tuple(kwargs.items()))
        answer = None if self.whole else self.calls.get((h, trace, key))
        if answer is None:
            answer = self._play(h, trace, key, args, kwargs)
            if not self.whole:  # a copy: what the library gave is kept by nobody but its caller
                self.calls[h, trace, key] = (copy.copy(answer[0]), *answer[1:])
        if self.tracing:
            self.trace[h] = (*trace, key)
        result, error, self.at = answer
        if error is not None:
            raise error.with_traceback(None)  # raised again: no growing traceback
        return result

    def _holder(self, h: int, trace: tuple[Any, ...]) -> _Holder:
        """Objects of holder h that made exactly the calls `trace`: kept, or new ones made to."""
        holder = self.pool.pop((h, trace), None)
        if holder is None:
            holder = _Holder(self.path)
            for made, (at, role, name, args, kwargs) in enumerate(trace):
                self._restore(self.contents[at])
                with contextlib.suppress(Exception):  # answered as it was, when it was played
                    self._call(holder, role, name, args, dict(kwargs), made=made)
                self.here = self._intern(self._read())
        return holder

    def _call(self, holder: _Holder, role: int, name: str, args: Any, kwargs: Any,
              later: int = 0, made: int = 0, store: Any = None) -> Any:
        """Call the holder's object `role`; its clock starts `later` ns after the call's
        start, which is _STEP after each of the `made` calls its holder made before."""
        lease = holder.library.Lease  # the holder's own class, which its library checks for
        given = [lease(*dataclasses.astuple(arg)) if isinstance(arg, Lease) else arg
                 for arg in args]
        holder.clock.start(later + made * _STEP)
        return getattr(store or holder.objects[role], name)(*given, **kwargs)

    def _play(self, h: int, trace: tuple[Any, ...], key: Any, args: Any,
              kwargs: Any) -> tuple[Any, Any, int]:
        holder, (at, role, name) = self._holder(h, trace), key[:3]
        self.played += 1
        made = len(trace)
        result, error, here, memory = self._once(holder, at, role, name, args, kwargs, made)
        if memory != holder.memory:
            if not self.tracing:
                raise _Remembers
            holder.memory, holder.connections = memory, _memory(holder.library, holder.objects)[1]
        elif here is not None:  # the same call by a new object of its library, a clock later
            fresh = _made(self.path, holder.library, role)
            try:
                again = self._once(holder, at, role, name, args, kwargs, made, later=_LATER,
                                   store=fresh)
            finally:
                fresh.close()
            if (_said(result, error), here) != (_said(*again[:2]), again[2]):
                error = RuntimeError(f"{name} answered otherwise by a new object, under a "
                                     f"clock {_LATER:,} ns later: {_said(result, error)!r}, "
                                     f"then {_said(*again[:2])!r}")
        if here is None:  # left what no restore sets back: the holder was given new objects
            here = self.here
        if self.tracing:
            self.pool[h, (*trace, key)] = holder
            while len(self.pool) > _KEPT:  # the oldest kept objects, closed
                self.pool.pop(next(iter(self.pool))).close()
        else:
            self.pool[h, trace] = holder
        return result, error, here

    def _once(self, holder: _Holder, at: int, role: int, name: str, args: Any, kwargs: Any,
              made: int, *, later: int = 0,
              store: Any = None) -> tuple[Any, Exception | None, int | None, Any]:
        """Play one call from the content `at`: its answer, the content and memory it left
        (`later`, the second play, by `store`, a new object: the memory it found, which the
        first play has just compared).  The content is None if the call left what no restore
        of the file sets back; its error then says what."""
        if self.here != at:
            self._restore(self.contents[at])
        result, error = None, None
        try:
            result = self._call(holder, role, name, args, kwargs, later, made, store)
        except Exception as exc:  # noqa: BLE001 - answered again as it was raised
            error = exc
        memory, connections = ((holder.memory, [*holder.connections,
                                                *_memory(None, [store])[1]])
                               if later else _memory(holder.library, holder.objects))
        kept = _kept(connections) or _beside(self.path)
        content = None
        try:
            content = None if kept else self._read()
        except sqlite3.OperationalError as exc:  # a lock held by a connection not seen
            if "locked" not in str(exc):
                raise
            kept = "left a transaction open"
        if content is None:
            holder.reopen()
            self.here = self._intern(self._read())
            return None, RuntimeError(f"{name} {kept}"), None, holder.memory
        self.here = self._intern(content)
        return result, error, self.here, memory

    def _intern(self, content: _Content) -> int:
        found = self.ids.setdefault(content, len(self.contents))
        if found == len(self.contents):
            self.contents.append(content)
        return found

    def _read(self) -> _Content:
        """The schema, every row and the header, read under the write lock with the explorer's
        own SQL."""
        self.raw.execute("BEGIN IMMEDIATE")
        try:
            schema = tuple(self.raw.execute(
                "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"))
            header = tuple(self.raw.execute(f"PRAGMA {name}").fetchone()[0]
                           for name in (*_HEADER, *_FIXED))
            return schema, tuple(tuple(self.raw.execute(select))
                                 for select, _, _ in self._statements(schema)), header
        finally:
            self.raw.execute("COMMIT")

    def _statements(self, schema: tuple[Any, ...]) -> list[tuple[str, str, str]]:
        """For each table of `schema`: how to read its rows in order, clear it, and fill it."""
        if schema not in self.statements:
            found = self.statements[schema] = []
            for kind, name, _, _ in schema:
                if kind != "table":
                    continue
                table = '"' + name.replace('"', '""') + '"'
                columns = [c[0] for c in self.raw.execute(f"SELECT * FROM {table}").description]
                try:  # a rowid is part of what a table holds, unless it has none
                    self.raw.execute(f"SELECT rowid FROM {table} LIMIT 0")
                    select, columns = f"SELECT rowid, * FROM {table} ORDER BY rowid", [
                        "rowid", *columns]
                except sqlite3.OperationalError:
                    select = f"SELECT * FROM {table}"  # WITHOUT ROWID: in key order
                names = ", ".join('"' + c.replace('"', '""') + '"' for c in columns)
                fill = f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' * len(columns))})"
                found.append((select, f"DELETE FROM {table}", fill))
        return self.statements[schema]

    def _restore(self, content: _Content) -> None:
        """Make the file hold exactly `content`, in one transaction of the explorer's own."""
        (schema, rows, header), (now_schema, now_rows, now_header) = content, self.contents[
            self.here]
        if schema != now_schema:  # only a library that changes its tables gets here
            raise RuntimeError("the library changed the tables of its database: a state with "
                               "other tables cannot be restored")
        if header[len(_HEADER):] != now_header[len(_HEADER):]:
            raise RuntimeError(f"the library changed its file's {', '.join(_FIXED)}: "
                               f"{now_header[len(_HEADER):]!r}, not {header[len(_HEADER):]!r}, "
                               "which a restore does not set back")
        self.raw.execute("BEGIN IMMEDIATE")
        try:
            for (_, clear, fill), table_rows, now in zip(self._statements(schema), rows, now_rows):
                if table_rows != now:  # a table the last call left as it was stays
                    self.raw.execute(clear)
                    self.raw.executemany(fill, table_rows)
            for name, value in zip(_HEADER, header):
                self.raw.execute(f"PRAGMA {name} = {int(value)}")
            self.raw.execute("COMMIT")
        except BaseException:
            if self.raw.in_transaction:
                self.raw.execute("ROLLBACK")
            raise
        self.here = self._intern(content)


def _said(result: Any, error: Exception | None) -> Any:
    return result if error is None else (type(error).__name__, str(error))


def _alone(folder: str, name: str) -> str:
    """A database path in a new folder of its own inside `folder`."""
    os.mkdir(os.path.join(folder, name))
    return os.path.join(folder, name, "leases.sqlite3")


def _beside(path: str) -> str | None:
    """What a library keeps in files beside the database, in a folder that is the bench's own."""
    name = os.path.basename(path)
    others = set(os.listdir(os.path.dirname(path))) - {name, *(f"{name}-{suffix}" for suffix in
                                                              ("wal", "shm", "journal"))}
    return f"left a file beside the database, {min(others)!r}" if others else None


def _kept(connections: list[sqlite3.Connection]) -> str | None:
    """What a library's connections keep that the file does not: an open transaction, or a
    temporary table or an attached database (its connection's own, beside the file)."""
    for connection in connections:
        try:
            if connection.in_transaction:
                return "left a transaction open"
            (temporary,) = connection.execute("SELECT count(*) FROM temp.sqlite_master").fetchone()
            attached = {row[1] for row in connection.execute("PRAGMA database_list")}
            if temporary or attached - {"main", "temp"}:
                return "kept a temporary table or an attached database, which the file does not hold"
        except sqlite3.ProgrammingError:  # closed: it keeps nothing
            continue
    return None


class _StandIn:
    """One of a holder's objects as the step code is handed it: each call goes to the bench."""

    def __init__(self, bench: _Bench, h: int, role: int) -> None:
        self.bench, self.h, self.role = bench, h, role

    def __getattr__(self, name: str) -> Callable[..., Any]:
        return functools.partial(self.bench.call, self.h, self.role, name)


def explore(
    bound: Bound, *, brute_force: bool = False, statements: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Play every schedule of `bound` on the real code; the table of what happened.

    By state (see the module's contract), or with `brute_force` every schedule whole, from an
    empty database of its own: the same table, the states aside.  With `statements`, every
    interleaving of the holders' calls at each SQL statement, with a crash at each, or a
    refusal by the lock: the table of the statement mode.
    """
    with contextlib.ExitStack() as cleanup:
        folder = scratch(cleanup, "leases-explore-")
        if statements:
            return _statements(bound, folder, _Progress(progress))
        if gc.isenabled():  # what the search keeps only grows: collecting it is wasted time
            gc.disable()
            cleanup.callback(gc.enable)
        found = (_brute_force if brute_force else _search)(bound, folder, _Progress(progress))
    return _table(bound, *found)


class _Progress:
    """A line on stderr every 2 s: how far the search is, the states so far and their rate.
    A bound too large to finish in minutes shows it in its first seconds."""

    def __init__(self, say: Callable[[str], None] | None) -> None:
        self.say, self.started = say, time.monotonic()
        self.due = self.started + 2

    def is_due(self) -> bool:
        return self.say is not None and time.monotonic() >= self.due

    def __call__(self, far: str, states: int, transitions: int,
                 names: tuple[str, str] = ("states", "transitions")) -> None:
        """Say `far`, how far the search is, with the counts so far, by their `names`; due or
        not."""
        now = time.monotonic()
        self.due, rate = now + 2, states / (now - self.started)
        if self.say is not None:
            self.say(f"explore: {far}: {states:,} {names[0]} so far ({rate:,.0f} a second), "
                     f"{transitions:,} {names[1]}")


# What a search found: how many schedules end with each set of flags; states, transitions and
# calls played; and for each flag raised, its smallest schedule and the events of it at each
# receiver.
_Witness = tuple[tuple[tuple[int, ...], tuple[int, ...]], list[list[Any]]]
_Found = tuple[Counter[int], int, int, int, dict[int, _Witness]]


class State(NamedTuple):
    """What the search merges schedules by: two that reach equal states go on as one."""

    content: int  # what the database file holds: the bench's number for its schema and rows
    tick: int  # the tick of the last step
    positions: tuple[int, ...]  # how many steps of the program each holder has taken
    beliefs: tuple[Any, ...]  # the lease each holder holds, as its fields, or None
    records: tuple[Record, ...]  # of each resource: what the authority and the receivers
    # have answered about it so far
    memory: tuple[Any, ...]  # each holder's calls so far, from which what its objects remember
    # follows; all () while the library remembers nothing outside the file


def _search(bound: Bound, folder: str, progress: _Progress) -> _Found:
    """Count schedules by state; again, each holder's calls in its state, once a call is seen
    to change what a holder's library remembers outside the file."""
    try:
        return _searched(bound, folder, progress, tracing=False)
    except _Remembers:
        return _searched(bound, folder, progress, tracing=True)


def _searched(bound: Bound, folder: str, progress: _Progress, *, tracing: bool) -> _Found:
    """Count schedules by state, one layer per step taken; each state keeps the smallest
    schedule that reaches it (its ticks, then its holders), and how many schedules reach it
    with each set of flags."""
    bench = _Bench(_alone(folder, f"explore-{tracing}"), bound.holders,
                   tracing=tracing)
    steps = bound.holders * len(bound.program)
    try:
        start = State(bench.here, 0, (0,) * bound.holders, (None,) * bound.holders,
                      (Record.empty(bound.holders),) * bound.resources, ((),) * bound.holders)
        layer: dict[State, list[Any]] = {start: [((), ()), {0: 1}]}
        smallest: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        states, transitions = 1, 0
        for depth in range(1, steps + 1):
            following: dict[State, list[Any]] = {}
            # A step's outcome depends only on the content, the step, its holder's lease and
            # calls so far, and the record, so each such move of a layer is played and judged
            # once.
            known: dict[Any, tuple[Any, int, Record, int, Any]] = {}
            for done, (state, ((ticks, holders), counts)) in enumerate(layer.items()):
                content, tick, positions, beliefs, records, memory = state
                for h, later in _next(bound, tick, positions):
                    stop_if_asked()
                    r = bound.resource(h)
                    move = (content, h, positions[h], later, beliefs[h], records[r], memory[h])
                    if move not in known:
                        bench.at, bench.trace[h] = content, memory[h]
                        step = bound.step(h, positions[h], later)
                        held = None if beliefs[h] is None else Lease(*beliefs[h])
                        kept, events = _played(step, held, bench.stand_ins[h], RESOURCES[r])
                        known[move] = (_fields(kept), *_judged(records[r], h, step, held, events,
                                                               kept, RESOURCES[r]),
                                       bench.at, bench.trace[h])
                    kept, raised, after, at, trace = known[move]
                    reach, transitions = ((*ticks, later), (*holders, h)), transitions + 1
                    for bit in _bits(raised):
                        smallest[bit] = min(smallest.get(bit, reach), reach)
                    goes = State(at, later, _put(positions, h, positions[h] + 1),
                                 _put(beliefs, h, kept), _put(records, r, after),
                                 _put(memory, h, trace))
                    target = following.get(goes)
                    if target is None:
                        target = following[goes] = [reach, {}]
                    elif reach < target[0]:
                        target[0] = reach
                    reached = target[1]
                    for flags, schedules in counts.items():
                        reached[flags | raised] = reached.get(flags | raised, 0) + schedules
                    if not transitions & 63 and progress.is_due():  # a clock read is cheap
                        progress(f"step {depth} of {steps}, {done:,} of {len(layer):,} states "
                                 "taken a step further", states + len(following), transitions)
            layer, states = following, states + len(following)
        ends: Counter[int] = Counter()
        for _, counts in layer.values():
            stop_if_asked()
            ends.update(counts)
        witnesses = {}
        for bit, (ticks, holders) in smallest.items():  # each played again, from the start
            if bit >= _CHECKED:  # a failure: played whole, from a new file, by new objects
                runs = _replayed(bound, folder, bit, ticks, holders)
            else:
                bench.at, bench.trace[:] = start.content, start.memory
                steps_events = [events for _, events in
                                _walk(bound, bench.stand_ins, ticks, holders)]
                runs = [[event.as_json() for event in run] for run in zip(*steps_events)]
            witnesses[bit] = (ticks, holders), runs
        return ends, states, transitions, bench.played, witnesses
    finally:
        bench.close()


def _replayed(bound: Bound, folder: str, bit: int, ticks: tuple[int, ...],
              holders: tuple[int, ...]) -> list[list[Any]]:
    """The events of a failing schedule played whole, from a new, empty file, by new objects
    of new copies of the library; RuntimeError, the explorer's own failure, unless it fails
    the same check at the same place again."""
    path = _alone(folder, f"replay-{bit}")
    bench, flags = _Bench(path, bound.holders, tracing=True, whole=True), 0
    try:
        steps_events = []
        for raised, events in _walk(bound, bench.stand_ins, ticks, holders):
            flags |= raised
            steps_events.append(events)
    finally:
        bench.close()
    if not flags >> bit & 1:
        check, place = _FLAGS[bit]
        schedule = ", ".join(f"{'ABCDEFGH'[h]}@{tick}" for tick, h in zip(ticks, holders))
        raise RuntimeError(f"explore.py failed: the schedule {schedule} failed {check!r} at "
                           f"{place} in the search, but not when played whole from an empty "
                           "file")
    return [[event.as_json() for event in run] for run in zip(*steps_events)]


def _walk(bound: Bound, objects: Sequence[Sequence[Any]], ticks: tuple[int, ...],
          holders: tuple[int, ...]) -> Iterator[tuple[int, list[Any]]]:
    """Play one schedule from its start, each holder on its `objects`: the flags and the events
    of each step."""
    positions, beliefs = [0] * bound.holders, list[Lease | None]([None] * bound.holders)
    records = [Record.empty(bound.holders)] * bound.resources
    for tick, h in zip(ticks, holders):
        stop_if_asked()
        step, held, r = bound.step(h, positions[h], tick), beliefs[h], bound.resource(h)
        kept, events = _played(step, held, objects[h], RESOURCES[r])
        raised, records[r] = _judged(records[r], h, step, held, events, kept, RESOURCES[r])
        # It keeps a copy, as the search keeps the fields: the library's own object is nobody's
        # once the step is done, as for a worker told its lease through a queue.
        beliefs[h] = copy.copy(kept)
        del kept
        positions[h] += 1
        yield raised, events


# --- the brute force: every schedule whole, sharing no database handling with the search ---


def _brute_force(bound: Bound, folder: str, progress: _Progress) -> _Found:
    """Play every schedule whole, from an emptied database, with new objects each time: each
    holder's own, made by a copy of the library of its own."""
    path = os.path.join(folder, "brute.sqlite3")
    for store in _opened(path):  # the file, as the library and AskingReceiver make it
        store.close()
    # Nothing is restored: before each schedule, every row of every table is deleted and the
    # header fields set to 0 (the same file, in this process, not a new one).  This
    # connection stays open, so that closing a schedule's objects never checkpoints the log,
    # which would cost more than the schedule itself.  It waits for no lock: one still held
    # after a step is a library's transaction left open.
    keeper = sqlite3.connect(path, isolation_level=None, timeout=0)
    ends: Counter[int] = Counter()
    smallest: dict[int, tuple[Any, list[list[Any]]]] = {}
    prefixes: set[tuple[tuple[int, ...], tuple[int, ...]]] = {((), ())}
    steps = bound.holders * len(bound.program)
    libraries = [_library(_Clock()) for _ in range(bound.holders)]
    try:
        for ticks, holders in _schedules(bound):
            tables = keeper.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            keeper.executescript("BEGIN IMMEDIATE;" + "".join(
                f' DELETE FROM "{name}";' for (name,) in tables.fetchall()) + "".join(
                f" PRAGMA {name} = 0;" for name in _HEADER) + " COMMIT")
            objects, flags = [_opened(path, library) for library in libraries], 0
            runs: list[list[Any]] = [[] for _ in RECEIVERS]
            try:
                for index, (raised, events) in enumerate(_walk(bound, objects, ticks, holders)):
                    keeper.executescript("BEGIN IMMEDIATE; COMMIT")  # not the busy timeout
                    for run, event in zip(runs, events):
                        run.append(event)
                    reach = (ticks[: index + 1], holders[: index + 1])
                    prefixes.add(reach)
                    for bit in _bits(raised):
                        if bit not in smallest or reach < smallest[bit][0]:
                            smallest[bit] = reach, [[event.as_json() for event in run]
                                                    for run in runs]
                    flags |= raised
            finally:
                for store in (store for own in objects for store in own):
                    store.close()
            ends[flags] += 1
            if progress.is_due():
                progress(f"{sum(ends.values()):,} of {_count(bound)[0]:,} schedules played whole",
                         len(prefixes), sum(ends.values()) * steps)
    finally:
        keeper.close()
    witnesses = dict(smallest)
    played = sum(ends.values()) * steps  # every step of every schedule, every call played
    return ends, len(prefixes), played, played, witnesses


def _schedules(bound: Bound) -> Iterator[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every schedule of `bound`: its ticks, and the holder of each step."""
    pending: list[tuple[tuple[int, ...], tuple[int, ...], int, tuple[int, ...]]] = [
        ((), (), 0, (0,) * bound.holders)]
    while pending:
        ticks, holders, tick, positions = pending.pop()
        if len(ticks) == bound.holders * len(bound.program):
            yield ticks, holders
        pending.extend(((*ticks, later), (*holders, h), later,
                        _put(positions, h, positions[h] + 1))
                       for h, later in _next(bound, tick, positions))


# --- statements: every interleaving of the holders' SQL statements, and a crash at each ---

# Seconds a handoff may take before the holder is given up as hung: a bound, not a duration.
_HANDOFF_SECONDS = 60.0


# A statement that takes SQLite's write lock, if it was not held, or (a checkpoint that
# waits for writers, VACUUM) needs it for a moment.
_WRITES = re.compile(r"\s*(BEGIN\s+(IMMEDIATE|EXCLUSIVE)|INSERT|UPDATE|DELETE|REPLACE|CREATE|DROP|"
                     r"ALTER|VACUUM|PRAGMA\s+(\w+\.)?wal_checkpoint\s*\(\s*[\"']?(FULL|RESTART|"
                     r"TRUNCATE))\b", re.IGNORECASE)


class _Died(BaseException):  # not an error: the holder's process is gone
    """A holder died just before a statement: it runs none after, no COMMIT, no ROLLBACK."""


def _text(outcome: str) -> str:
    return str(getattr(outcome, "value", outcome))


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+; before, only the message
    return "database is locked" in str(exc) if code is None else code & 0xFF == 5


class _Gated:
    """sqlite3 as one holder's library sees it in the statement mode: each connection waits
    for no lock (SQLite's busy timeout 0) and stops before each statement it is given, by any
    of its methods or its cursors'.  A statement run otherwise is noted by SQLite's trace
    callback, and the search fails: it could not have stopped there."""

    def __init__(self, worker: "_Worker") -> None:
        class Cursor(sqlite3.Cursor):
            def execute(self, sql: str, parameters: Any = (), /) -> Any:
                return _stepped(worker, self.connection, sql,
                                lambda: super(Cursor, self).execute(sql, parameters))

            def executemany(self, sql: str, parameters: Any, /) -> Any:
                return _stepped(worker, self.connection, sql,
                                lambda: super(Cursor, self).executemany(sql, parameters))

            def executescript(self, script: str, /) -> Any:
                return _stepped(worker, self.connection, script,
                                lambda: super(Cursor, self).executescript(script))

        class Connection(sqlite3.Connection):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **{**kwargs, "timeout": 0})
                worker.connections.append(self)
                self.set_trace_callback(worker.traced)

            def cursor(self, factory: Any = Cursor) -> Any:
                return super().cursor(factory)

            def execute(self, sql: str, parameters: Any = (), /) -> Any:
                return self.cursor().execute(sql, parameters)

            def executemany(self, sql: str, parameters: Any, /) -> Any:
                return self.cursor().executemany(sql, parameters)

            def executescript(self, script: str, /) -> Any:
                return self.cursor().executescript(script)

            def commit(self) -> None:
                _stepped(worker, self, "COMMIT", super().commit)

            def rollback(self) -> None:
                _stepped(worker, self, "ROLLBACK", super().rollback)

        self._connection = Connection

    __name__ = "sqlite3"

    def connect(self, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        return sqlite3.connect(*args, **kwargs, factory=self._connection)

    def __getattr__(self, name: str) -> Any:
        return getattr(sqlite3, name)


def _stepped(worker: "_Worker", connection: sqlite3.Connection, sql: str,
             run: Callable[[], Any]) -> Any:
    """Run one statement (or a script, as one) of a holder's, once the scheduler lets it, and
    note what it did to SQLite's locks."""
    worker.before(sql)
    began, worker.allowed = connection.in_transaction, True
    if not began:  # what the file had from this connection, before any transaction it begins
        worker.changes[connection] = connection.total_changes
    try:
        result = run()
    except sqlite3.OperationalError as exc:
        worker.busy = sql if _is_busy(exc) else None
        raise
    finally:
        worker.allowed = False
    # The write lock taken: by BEGIN IMMEDIATE or EXCLUSIVE, or by a write.
    worker.writing = connection.in_transaction and (worker.writing or _WRITES.match(sql)
                                                    is not None)
    # A COMMIT of a change returned (a transaction that changed nothing leaves no effect).
    worker.committed |= began and not connection.in_transaction and sql.strip().upper() in (
        "COMMIT", "END") and connection.total_changes != worker.changes[connection]
    return result


class _Libraries:
    """Copies of the library for the statement mode's holders, each as a new process imports
    it: made anew, or given back by a run that left its memory (walked as the step mode walks
    it) as it was made.  Making a copy costs more than the rest of a run."""

    def __init__(self) -> None:
        self.free: list[types.ModuleType] = []
        self.made = _memory(_library(_Clock()), [])[0]

    def take(self, sqlite: "_Gated") -> types.ModuleType:
        if self.free:
            return _rebound(self.free.pop(), _Clock(), sqlite)
        return _library(_Clock(), sqlite)

    def give_back(self, library: types.ModuleType) -> None:
        if _memory(library, [])[0] == self.made:
            self.free.append(library)


class _Worker:
    """One holder: a thread of its own, playing its steps through a copy of the library of its
    own on its own connections, stopped before each SQL statement until the scheduler lets it
    go on.  It dies there if told to, and comes back as a new process: a new copy of the
    library, new connections.  It lives for the whole search, as a worker process lives for
    many calls; the file is emptied between interleavings."""

    def __init__(self, path: str, told: "queue.SimpleQueue[tuple[Any, ...]]", h: int,
                 resource: str, libraries: _Libraries) -> None:
        self.path, self.told, self.h, self.resource = path, told, h, resource
        self.libraries = libraries
        self.library: types.ModuleType | None = None
        self.go: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.connections: list[sqlite3.Connection] = []
        self.objects: list[Any] = []
        self.gated = self.dead = self.committed = self.stopped = False
        self.busy: str | None = None  # the statement SQLite's lock last refused
        self.allowed = False  # a statement it stopped before is running
        self.ungated: str | None = None  # a statement that ran without stopping first
        self.writing = False  # it holds SQLite's write lock
        self.changes: dict[sqlite3.Connection, int] = {}  # each one's total_changes at BEGIN
        self.thread = threading.Thread(target=self._main, name=f"holder {'ABCDEFGH'[h]}",
                                       daemon=True)
        self.thread.start()

    def before(self, sql: str) -> None:
        """Stop before `sql` until told to go on, or to die."""
        if self.dead:
            raise _Died
        if not self.gated:
            return
        blocked = sql == self.busy  # tried again: SQLite refused it, and may again
        self.told.put(("paused", self.h, (sql, blocked, self.writing)))
        self.busy = None
        order = self.go.get()
        if order != "go":  # "die", or None: the search is stopping
            self.dead, self.stopped = True, order is None
            raise _Died

    def traced(self, sql: str) -> None:
        """SQLite's trace callback: every statement a connection runs, as it starts."""
        if self.gated and not self.allowed and self.ungated is None:
            self.ungated = sql

    def _open(self) -> None:
        self.library = library = self.libraries.take(_Gated(self))
        self.connections, self.dead, self.writing, self.changes = [], False, False, {}
        self.objects = [library.LeaseAuthority(self.path), library.Receiver(self.path)]

    def _close(self) -> None:
        """Close every connection as it is: SQLite rolls back what was not committed, as it
        does for a process that died."""
        for connection in self.connections:
            connection.close()
        if self.library is not None:
            self.libraries.give_back(self.library)
            self.library = None

    def _main(self) -> None:
        try:
            self._open()
            self.told.put(("idle", self.h, None))
            while (order := self.go.get()) is not None:
                step, held = order
                if held is not None and self.library is not None:  # a new process reads its
                    held = self.library.Lease(*dataclasses.astuple(held))  # lease anew
                self.gated, self.committed = True, False
                try:
                    authority, receiver = self.objects
                    kept, event = perform(step, held, authority, receiver, self.resource)
                    self.gated = False
                    if left := _kept(self.connections):  # as the step mode's model check says
                        event = _raised(step, RuntimeError(f"{step.action.value} {left}"))
                except _Died:  # a new process: it opens the file as the library does
                    self.gated = False
                    self._close()
                    if self.stopped:
                        return
                    self._open()
                    kept, event = held, None
                except Exception as exc:  # noqa: BLE001 - a broken library: an answer
                    kept, event = held, _raised(step, exc)
                self.gated = False
                self.told.put(("ended", self.h, (kept, event, self.committed)))
        except BaseException as exc:  # noqa: BLE001 - the explorer's own failure, reported
            self.told.put(("broken", self.h, exc))
        finally:
            self._close()


class _Call(NamedTuple):
    """One call of one holder in an interleaving: what it was, what it answered, and when."""

    h: int
    step: Step
    held: Lease | None  # the lease it was made with
    event: Event | None  # its answer; None if its holder died in it and heard none
    kept: Lease | None  # the lease its holder kept
    committed: bool  # a COMMIT of a change of it returned: it must have taken effect, whole
    start: int  # the number of the choice that began it
    end: int  # the number of the choice after which it ended
    refused: bool = False  # SQLite's lock refused it once, and it went on


class _Run:
    """One interleaving being played: a worker per holder, and the scheduler's view of them.

    A choice is ("start", h, tick): holder h begins its next step at `tick`; ("run", h): it
    runs the statement it stopped before, up to the next; ("die", h): it dies there;
    ("try", h): it tries to take the write lock another holds, and is refused.  A holder that
    SQLite's lock refused is not enabled again until another has moved.  After a crash or a
    refusal, there is no other, and the rest is played one way: after a refusal, the refused
    holder first, as far as the lock lets it (what it reads meanwhile is the last commit's).
    """

    def __init__(self, bound: Bound, workers: list[_Worker]) -> None:
        self.bound, self.workers = bound, workers
        self.told, self.path = workers[0].told, workers[0].path
        self.status = ["idle"] * bound.holders
        self.sql: list[str | None] = [None] * bound.holders
        self.blocked = [False] * bound.holders
        self.writing = [False] * bound.holders  # holds the write lock
        self.took = [False] * bound.holders  # took it at its last statement
        self.positions, self.held = [0] * bound.holders, [None] * bound.holders
        self.begun: list[tuple[Step, int] | None] = [None] * bound.holders
        self.tick, self.taken, self.died = 0, 0, False
        self.refused: int | None = None  # the holder the lock refused
        self.refused_at = 0  # the number of the choice it was refused at
        self.calls: list[_Call] = []
        self.said: list[str] = []  # each choice, as a witness shows it

    def enabled(self) -> list[tuple[Any, ...]]:
        bound, choices = self.bound, list[tuple[Any, ...]]()
        r = self.refused
        if r is not None and self.status[r] == "paused" and not self.blocked[r]:
            return [("run", r)]
        for h, writing in enumerate(self.writing):
            if writing and self.status[h] == "paused" and not self.blocked[h]:
                # What it does until COMMIT no other holder can see or change: in WAL mode
                # they read only what is committed, and cannot write.  It runs on, or dies.
                # Once, as it has just taken the lock, a holder about to take it may try, and
                # be refused: anywhere before COMMIT, a refusal is the same.
                if not self.may_deviate:
                    return [("run", h)]
                tries = [("try", other) for other, status in enumerate(self.status)
                         if self.took[h] and status == "paused" and not self.blocked[other]
                         and _WRITES.match(self.sql[other] or "")]
                return [("run", h), *tries, ("die", h)]
        for h, status in enumerate(self.status):
            if status == "paused":
                if not self.blocked[h]:
                    choices.append(("run", h))
                if self.may_deviate:
                    choices.append(("die", h))
            elif status == "idle" and self.positions[h] < len(bound.program):
                choices.extend(("start", h, tick)
                               for tick in range(self.tick, bound.last_tick + 1))
        return choices

    @property
    def may_deviate(self) -> bool:
        """A crash or a refusal may still come: none has."""
        return not self.died and self.refused is None

    def take(self, choice: tuple[Any, ...]) -> None:
        kind, h, *rest = choice
        actor, worker = "ABCDEFGH"[h], self.workers[h]
        self.taken += 1
        if kind == "start":
            (self.tick,) = rest
            step = self.bound.step(h, self.positions[h], self.tick)
            self.begun[h] = step, self.taken
            self.said.append(f"{actor} {step.action.value} at tick {self.tick}:")
            worker.go.put((step, self.held[h]))
        elif kind in ("run", "try"):
            self.said.append(f"  {actor} {self.sql[h]}" + ", refused by the lock" * (kind == "try"))
            if kind == "try":
                self.refused, self.refused_at = h, self.taken
            worker.go.put("go")
        else:
            self.died = True
            self.said.append(f"  {actor} dies before {self.sql[h]}")
            worker.go.put("die")
        self._heard(h)
        if kind == "run" and not self.blocked[h]:  # it has moved, not only been refused again:
            self.blocked = [False] * self.bound.holders  # each holder refused may try again

    def _heard(self, h: int) -> None:
        try:
            kind, _, what = self.told.get(timeout=_HANDOFF_SECONDS)
        except queue.Empty:
            raise RuntimeError(f"explore.py --statements: holder {'ABCDEFGH'[h]} hung after "
                               f"{self.said[-1:] or 'opening'}") from None
        if kind == "broken":
            raise what
        ungated, self.workers[h].ungated = self.workers[h].ungated, None
        if ungated is not None:
            raise RuntimeError(f"explore.py --statements: holder {'ABCDEFGH'[h]}'s library ran "
                               f"{ungated!r} where the explorer could not stop it: not through "
                               "a connection's or a cursor's methods")
        if kind == "paused":
            was = self.writing[h]
            self.status[h], (self.sql[h], self.blocked[h], self.writing[h]) = "paused", what
            self.took[h] = self.writing[h] and not was
            return
        self.status[h] = "idle"
        if kind == "ended":
            kept, event, committed = what
            if event is not None and type(event.outcome) is str:  # an error's text: the
                event = dataclasses.replace(event, outcome=event.outcome.replace(  # file by its
                    os.path.dirname(self.path) + os.sep, ""))  # name alone, the same every run
            begun = self.begun[h]
            assert begun is not None
            step, start = begun
            self.calls.append(_Call(h, step, self.held[h], event, kept, committed, start,
                                    self.taken, self.refused == h and self.refused_at > start))
            if event is not None:  # a holder that died takes the same step again, as new
                self.positions[h] += 1
                self.held[h] = kept
                self.said.append(f"  {'ABCDEFGH'[h]} {_text(event.outcome)}")

    def end(self) -> None:
        """Let every holder still stopped before a statement die there: each is idle."""
        for h, worker in enumerate(self.workers):
            if self.status[h] == "paused":
                worker.go.put("die")
                self._heard(h)


def _linearized(bound: Bound, calls: list[_Call],
                final: Any = None) -> list[tuple[_Call, Event]] | None:
    """An order of `calls`, one at a time, that gives each answer they gave, with the answer
    of each, and leaves what the file holds at the end (`final`, if given: each resource's
    stored pair at the fenced receiver and the authority's row): a call comes after every
    call that ended before it began; a call whose holder died in it is in the order if a
    change of it committed, and may be if not (its effect is unknown).  None if there is no
    such order."""
    records = (Record.empty(bound.holders),) * bound.resources

    def order(placed: frozenset[int], records: tuple[Record, ...]
              ) -> list[tuple[_Call, Event]] | None:
        waiting = [i for i in range(len(calls)) if i not in placed]
        if not waiting:
            held = tuple((record.stored[0], record.lease) for record in records)
            return [] if final is None or held == final else None
        for i in waiting:
            call = calls[i]
            if any(calls[j].end < call.start for j in waiting if j != i):
                continue
            r = bound.resource(call.h)
            answers, kept = _model(records[r], call.step, call.held, RESOURCES[r])
            event = call.event or Event(call.step.actor, call.step.action, call.step.tick,
                                        *answers[0])
            if call.event is not None and (
                    tuple(getattr(event, field) for field in _FIELDS) != answers[0]
                    or _fields(call.kept) != kept):
                continue
            after = _recorded(records[r], call.h, call.step, call.held, [event] * 3)
            rest = order(placed | {i}, _put(records, r, after))
            if rest is not None:
                return [(call, event), *rest]
        uncommitted = [i for i in waiting if calls[i].event is None and not calls[i].committed]
        for i in uncommitted:  # its effect never happened
            rest = order(placed | {i}, records)
            if rest is not None:
                return rest
        return None

    return order(frozenset(), records)


# The statement mode's default bound: README's.
STATEMENTS_BOUND = Bound(2, (Action.ACQUIRE, Action.WRITE), last_tick=0, ttl=1)
# The check of the statement mode, "linearizable": the answers are the model's in some
# one-at-a-time order of the calls (so every check of CHECKS holds along it, and a retry after
# a crash is the model's replay, never a conflict of its own), and no holder waits for a lock
# forever.
STATEMENT_CHECKS = ("linearizable",)


def _statements(bound: Bound, folder: str, progress: _Progress) -> dict[str, Any]:
    """Play every interleaving of `bound` at each SQL statement, and each with one crash at
    each statement, or one refusal by the lock: each from the file emptied, by one worker per
    holder for the whole search, choosing in turn every choice the last one left open."""
    path = os.path.join(folder, "statements.sqlite3")
    told: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
    libraries, workers = _Libraries(), list[_Worker]()
    try:
        for h in range(bound.holders):  # one at a time: SQLite's first opener sets the file up
            workers.append(_Worker(path, told, h, RESOURCES[bound.resource(h)], libraries))
            kind, _, what = told.get(timeout=_HANDOFF_SECONDS)
            if kind == "broken":
                raise what
        with contextlib.closing(sqlite3.connect(path, isolation_level=None, timeout=0)) as keeper:
            return _searched_statements(bound, workers, keeper, progress)
    finally:
        for worker in workers:
            worker.go.put(None)
        for worker in workers:
            worker.thread.join(_HANDOFF_SECONDS)


def _searched_statements(bound: Bound, workers: list[_Worker], keeper: sqlite3.Connection,
                         progress: _Progress) -> dict[str, Any]:
    # The interleavings still to play, by how many times each takes a holder off in the middle
    # of a call (fewest first, as CHESS orders them, so that a race shows early), then the
    # crashes and refusals still to play.
    pending: dict[int, list[tuple[tuple[Any, ...], ...]]] = {0: [()]}
    crashing: list[tuple[tuple[Any, ...], ...]] = []
    counts: Counter[str] = Counter()
    saw: Counter[str] = Counter()  # what a holder's retry answered, after its crash
    refused: Counter[str] = Counter()  # what a call answered after the lock refused it
    violations: Counter[str] = Counter()
    failures: dict[str, list[str]] = {}
    while pending or crashing:
        stop_if_asked()
        if pending:
            switches = min(pending)
            prefix = pending[switches].pop()
            if not pending[switches]:
                del pending[switches]
        else:
            prefix, switches = crashing.pop(), 0
        _emptied(keeper)
        run = _Run(bound, workers)
        try:
            choices = list(prefix)
            for choice in prefix:
                run.take(choice)
            counts["points"] += 1
            while enabled := run.enabled():
                stop_if_asked()
                taken = next((choice for choice in enabled if choice[0] in ("start", "run")),
                             enabled[0])
                going = choices[-1][1] if choices and ("run", choices[-1][1]) in enabled else None
                if run.may_deviate:  # after a crash or a refusal, one way on
                    for other in reversed(enabled):
                        if other == taken:  # a crash may be the only choice left
                            continue
                        if other[0] in ("die", "try"):
                            crashing.append((*choices, other))
                        else:
                            more = switches + (going is not None and other[1] != going)
                            pending.setdefault(more, []).append((*choices, other))
                switches += going is not None and taken[1] != going
                choices.append(taken)
                run.take(taken)
                counts["points"] += 1
            stuck = [h for h, status in enumerate(run.status) if status == "paused"]
        finally:
            run.end()
        counts["played"] += 1
        counts["crash schedules" if run.died else "interleavings" if run.may_deviate else
               "refusal schedules"] += 1
        failed = _judged_statements(bound, run.calls, stuck, saw, refused, _held(bound, keeper))
        for check in failed:
            violations[check] += 1
            failures.setdefault(check, [*run.said, *failed[check]])
        if failed:  # the first failing interleaving is shown; what comes after is not played
            break
        if progress.is_due():
            still_open = sum(map(len, pending.values())) + len(crashing)
            progress(f"{still_open:,} choices still open", counts["points"], counts["played"],
                     ("choice points", "interleavings played"))
    return {
        "bound": _bound_json(bound),
        "interleavings": counts["interleavings"],
        "crash_schedules": counts["crash schedules"],
        "refusal_schedules": counts["refusal schedules"],
        "points": counts["points"],
        "after_a_crash": dict(sorted(saw.items())),
        "after_a_refusal": dict(sorted(refused.items())),
        "violations": {check: violations[check] for check in STATEMENT_CHECKS},
        "failures": failures,
    }


def _emptied(keeper: sqlite3.Connection) -> None:
    """Every row of every table deleted, and the header's fields 0: the file as new."""
    tables = [name for (name,) in keeper.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()]
    keeper.execute("BEGIN IMMEDIATE")
    try:
        for name in tables:
            keeper.execute(f'DELETE FROM "{name}"')
        for name in _HEADER:
            keeper.execute(f"PRAGMA {name} = 0")
        keeper.execute("COMMIT")
    except BaseException:
        if keeper.in_transaction:
            keeper.execute("ROLLBACK")
        raise


def _held(bound: Bound, keeper: sqlite3.Connection) -> Any:
    """What the file holds at the end, read with the explorer's own SQL: each resource's pair
    at the fenced receiver, and the authority's row, as the record keeps them."""
    try:
        return tuple((keeper.execute(
            "SELECT stored_epoch, stored_value FROM receiver_decisions WHERE fenced = 1 AND"
            " resource = ? ORDER BY seq DESC LIMIT 1", (resource,)).fetchone(), keeper.execute(
            "SELECT holder, epoch, expires_at FROM leases WHERE resource = ?",
            (resource,)).fetchone()) for resource in RESOURCES[: bound.resources])
    except sqlite3.Error as exc:  # the tables are not as the library makes them
        return ("unreadable", str(exc))


def _judged_statements(bound: Bound, calls: list[_Call], stuck: list[int], saw: Counter[str],
                       refused: Counter[str], final: Any = None) -> dict[str, list[str]]:
    """The checks one played interleaving fails, each with why; and what each retry after a
    crash answered, counted in `saw`, and each call the lock refused, in `refused`."""
    failed: dict[str, list[str]] = {}
    for i, call in enumerate(calls):
        if call.refused and call.event is not None:
            refused[f"{call.step.action.value}: {_text(call.event.outcome)}"] += 1
        if call.event is None:
            retry = next((later for later in calls[i + 1 :] if later.h == call.h), None)
            answer = "not taken again" if retry is None else (
                _text(retry.event.outcome) if retry.event is not None else "died")
            saw[f"{call.step.action.value}, {'committed' if call.committed else 'not committed'}"
                f": {answer}"] += 1
    if stuck:
        failed["linearizable"] = [f"  {'ABCDEFGH'[h]} waits for a lock nobody will give back"
                                  for h in stuck]
        return failed
    if _linearized(bound, calls, final) is None:
        failed["linearizable"] = [("  no one-at-a-time order of these calls gives these answers,"
                                  " and leaves what the file holds")]
    return failed


# --- the table ---


def _count(bound: Bound) -> tuple[int, str]:
    """How many schedules `bound` has, and the formula that says so: the orders of the holders'
    steps, times the ways to give n steps rising ticks from 0 to T."""
    n, size, ticks = bound.holders * len(bound.program), len(bound.program), bound.last_tick
    orders, timings = math.factorial(n) // math.factorial(size) ** bound.holders, math.comb(
        n + ticks, n)
    return orders * timings, (f"multinomial({n}; {', '.join([str(size)] * bound.holders)}) x "
                              f"C({n} + {ticks}, {n}) = {orders} x {timings}")


def _table(bound: Bound, ends: Counter[int], states: int, played: int, calls: int,
           witnesses: dict[int, _Witness]) -> dict[str, Any]:
    """What an exploration found, as JSON: schedules, by class at each receiver, and checks."""
    ticks, (_, formula) = bound.last_tick, _count(bound)

    def having(*bits: int) -> int:
        return sum(count for flags, count in ends.items() if any(flags >> b & 1 for b in bits))

    width, schedules = len(CLASSES), sum(ends.values())
    classes = {str(_FLAGS[bit]): runs for bit, (_, runs) in witnesses.items()
               if bit < width * len(RECEIVERS)}
    checks = {check: [bit for bit, flag in enumerate(_FLAGS) if flag[0] == check]
              for check in CHECKS}
    failures = {}
    for check, bits in checks.items():  # its smallest failing schedule, and where it failed
        found = {PLACES[index]: witnesses[bit] for index, bit in enumerate(bits)
                 if bit in witnesses}
        if found:
            first = min(reach for reach, _ in found.values())
            failures[check] = {place: runs[0 if place == "authority" else RECEIVERS.index(place)]
                               for place, (reach, runs) in found.items() if reach == first}
    return {
        "bound": _bound_json(bound),
        "schedules": schedules,
        "formula": formula,
        "states": states,
        "transitions": played,
        "calls_played": calls,
        "leases_can_expire": bound.ttl <= ticks,
        "receivers": {
            "fenced": "the model's Receiver, fenced",
            "unfenced": "the model's Receiver, unfenced",
            "asking": "not the model's receiver: explore.AskingReceiver, which asks the "
                      "authority inside its own write transaction",
        },
        "kinds": {**{cls.name: cls.kind for cls in CLASSES}, "clean": "neither"},
        "classes": {
            receiver: {**{cls.name: having(r * width + c) for c, cls in enumerate(CLASSES)},
                       "clean": schedules - having(*range(r * width, (r + 1) * width))}
            for r, receiver in enumerate(RECEIVERS)
        },
        "violations": {check: having(*bits) for check, bits in checks.items()},
        "witnesses": {name: runs[RECEIVERS.index(name.split()[0])]
                      for name, runs in sorted(classes.items())},
        "failures": failures,
    }


# --- command line ---

EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "success: every check held in every schedule"),
    (EXIT_DIFFERENT, "a check failed: the first failing schedule is shown"),
    *SHARED_EXIT_CODES,
)


_DESCRIPTION = """\
Play every schedule of a bound on the real authority, the model's fenced and
unfenced receivers and a contrast receiver that asks the authority (not the
model's), count the schedules of each kind, and check every step.  The report goes
to stdout; --output also writes the table as JSON."""
_EXAMPLES = """\
  python3 explore.py --program acquire write
  python3 explore.py --program acquire check write   # a check leaves the gap
  python3 explore.py --holders 3 --last-tick 4
  python3 explore.py --resources 2 --last-tick 2 --ttl 1   # A and B apart
  python3 explore.py --statements                         # each statement, crash, refusal"""


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: the exit code, one of EXIT_CODES."""
    parser = make_parser("explore.py", _DESCRIPTION, EXIT_CODES, _EXAMPLES)
    parser.add_argument("--holders", type=int, choices=range(1, 9), metavar="N",
                        help=f"holders A, B, ... (1 to 8, default: {Bound.holders})")
    parser.add_argument("--program", nargs="+", choices=[a.value for a in (*Action, RETRY)],
                        metavar="ACTION", help="what each holder does, in order, from: "
                        f"{', '.join(a.value for a in Action)}, and retry: its last write "
                        "again (default: "
                        f"{' '.join(a.value for a in Bound.program)})")
    parser.add_argument("--last-tick", type=int, choices=range(100), metavar="T",
                        help=f"ticks 0 to T (0 to 99, default: {Bound.last_tick})")
    parser.add_argument("--ttl", type=int, choices=range(1, 100), metavar="N",
                        help=f"ticks a lease lasts (1 to 99, default: {Bound.ttl})")
    parser.add_argument("--resources", type=int, choices=range(1, 3), metavar="N",
                        help="resources, 1 or 2; with 2, A acquires the first, B the second, C "
                        f"the first, ... (default: {Bound.resources})")
    parser.add_argument("--statements", action="store_true", help="every interleaving of the "
                        "holders' calls at each SQL statement, a crash before each, and a "
                        "refusal by SQLite's lock "
                        f"(default bound: {_said_bound(_bound_json(STATEMENTS_BOUND))})")
    parser.add_argument("--output", metavar="PATH", help="also write the table as JSON to this "
                        "file, replacing it whole, or creating it")

    def run() -> int:
        args = parser.parse_args(argv)
        given = {"holders": args.holders, "last_tick": args.last_tick, "ttl": args.ttl,
                 "resources": args.resources, "program": args.program and tuple(
                     RETRY if word == RETRY else Action(word) for word in args.program)}
        try:
            bound = dataclasses.replace(STATEMENTS_BOUND if args.statements else Bound(), **{
                name: value for name, value in given.items() if value is not None})
        except ValueError as exc:  # a retry with no write before it
            parser.error(str(exc))
        return _main(args, bound)

    return command("explore.py", run)


def _main(args: argparse.Namespace, bound: Bound) -> int:
    target = None if args.output is None else output_target(args.output)
    if target is not None:  # found now, not once the whole exploration is lost
        _check_writable(target)
    started = time.monotonic()
    table = explore(bound, statements=args.statements, progress=note)
    stop_if_asked()
    code, report = (_interleaved if args.statements else _explored)(
        table, time.monotonic() - started)
    publish(target, canonical_json(table), report)
    return code


def _said_bound(bound: dict[str, Any]) -> str:
    """A bound as a report says it, from its JSON."""
    return (f"{bound['holders']} holder{'s' * (bound['holders'] != 1)}, each: "
            f"{' '.join(bound['program'])}; ticks 0 to {bound['last_tick']}, ttl {bound['ttl']}"
            f"{', 2 resources' * (bound['resources'] == 2)}")


def _bound_json(bound: Bound) -> dict[str, Any]:
    return {"holders": bound.holders, "program": [a.value for a in bound.program],
            "last_tick": bound.last_tick, "ttl": bound.ttl, "resources": bound.resources}


def _interleaved(table: dict[str, Any], seconds: float) -> tuple[int, str]:
    """The exit code and the report of the statement mode."""
    failed = [name for name, count in table["violations"].items() if count]
    lines = [
        f"every interleaving at each SQL statement of {_said_bound(table['bound'])}",
        (f"  {table['interleavings']:,} interleavings, and {table['crash_schedules']:,} with a "
         "crash: a holder dies before a statement,"),
        "  then, as a new process, takes the same step again (the rest played one way);",
        (f"  and {table['refusal_schedules']:,} with a refusal: SQLite's lock refuses a holder "
         "once, just as another took it"),
        f"  {table['points']:,} choice points, {seconds:.1f} s",
        "  a crash in, and the step taken again:",
        *(f"    {seen:<48}{count:>8,}" for seen, count in table["after_a_crash"].items()),
        "  a call the lock refused, and what it answered:",
        *(f"    {seen:<48}{count:>8,}" for seen, count in table["after_a_refusal"].items()),
        f"  checks failed: {', '.join(failed) or 'none'} (of: {', '.join(STATEMENT_CHECKS)})",
    ]
    if failed:
        lines += [f"the first interleaving failing {failed[0]!r}:", *table["failures"][failed[0]]]
    return (EXIT_DIFFERENT if failed else EXIT_OK), "\n".join(lines)


def _check_writable(target: str) -> None:
    """OSError naming `target` unless a file can be made in its folder, as --output will be."""
    try:
        with tempfile.TemporaryFile(dir=os.path.dirname(target)):
            pass
    except OSError as exc:
        raise OSError(exc.errno, f"cannot write --output there: {exc.strerror}", target) from None


def _explored(table: dict[str, Any], seconds: float) -> tuple[int, str]:
    """The exit code and the report of an exploration: its table, and its smallest schedules."""
    bound, classes = table["bound"], table["classes"]
    failed = [name for name, count in table["violations"].items() if count]
    lines = [
        f"every schedule of {_said_bound(bound)}",
        f"  {table['schedules']:,} schedules = {table['formula']}",
        (f"  {table['states']:,} states, {table['transitions']:,} transitions, "
         f"{table['calls_played']:,} calls played on the real code, {seconds:.1f} s"),
        "  a schedule is an order of steps and their ticks, refused steps included; it counts",
        "  in every class it shows at least once, so a column does not sum to the schedules",
        f"  {'schedules with':<30}{'kind':<12}{''.join(f'{r:>12}' for r in RECEIVERS)}",
        *(f"  {name:<30}{kind:<12}{''.join(f'{classes[r][name]:>12,}' for r in RECEIVERS)}"
          for name, kind in table["kinds"].items()),
        f"  asking: {table['receivers']['asking']}",
        f"  checks failed: {', '.join(failed) or 'none'} (of: {', '.join(CHECKS)})",
    ]
    if not table["leases_can_expire"]:
        lines.append(f"  no lease can expire by tick {bound['last_tick']} (ttl {bound['ttl']}), "
                     "so no write can be late: no gap or lost update can happen in this bound, "
                     "whatever the code")
    shown = [(f"the smallest {name}", name.split()[0], table["witnesses"][name])
             for name in ("unfenced lost update", "fenced stale refused", "fenced gap")
             if name in table["witnesses"]]
    if failed:  # the smallest schedule that fails the first check, where it failed
        shown = [(f"the first schedule failing {failed[0]!r}", place, events)
                 for place, events in table["failures"][failed[0]].items()]
    for title, receiver, events in shown:
        verdict = judge([Event.from_json(e) for e in events
                         if not e["outcome"].startswith("raised")])
        lines.append(timeline({"name": title, "receiver": receiver, "events": events,
                               "verdict": verdict}))
    return (EXIT_DIFFERENT if failed else EXIT_OK), "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
