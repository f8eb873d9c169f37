"""Every interleaving of the holders' calls at each SQL statement, with a crash before each.

Each holder is a thread of its own.  While this mode runs, sqlite3.connect hands a holder's
thread a connection that stops before each statement it runs through execute, executemany,
executescript, commit, rollback or `with connection:`, and waits for no lock (a statement
run any other way is seen by SQLite's trace callback and stops the run: the explorer could
not have stopped there).
The scheduler lets one holder run at a time, to its next statement or the end of its call.  A
holder that holds SQLite's write lock runs on to COMMIT alone: in WAL mode no other connection
can see or change what it does before then.  Before any statement a holder may die: its
connections close with no COMMIT, as a killed process's do, and a new one (new objects) takes
the same step again later.  After a crash the rest is played one way.

Every interleaving starts fresh: a new file, new threads, new objects; the library's module
is the one import of this process, so a failing interleaving is played again whole in a new
process, and must fail again, before it is shown.  Three verdicts:

* safety: the answers, and what the file holds at the end, are those of some one-at-a-time
  order of the calls (a call that ended comes before any call begun after); a call whose
  holder died, or that raised, may be in it or not, unless it committed: a transaction of it
  that changed a row ended without a rollback (by COMMIT, or an autocommit statement);
* liveness: no holder waits for ever for a lock kept after a call;
* and a call that gives no answer within the bound's timeout is core.Hung: a finding.
* errors: no call raised (a lock error, say) where the contract answers.
"""

import contextlib
import os
import queue
import re
import sqlite3
import tempfile
import threading
import types
from collections import Counter
from collections.abc import Iterator
from typing import Any, Literal, NamedTuple

import calls
import core
from calls import Place, played
from core import HOLDERS, Bound, Record, Run, expected, recorded

from leases import Lease

__all__ = ["BOUND", "VERDICTS", "Call", "Interleaving", "explore_statements", "play", "replay",
           "replayed", "report"]

BOUND = Bound(2, ("acquire", "write"), last_tick=0, ttl=1)
VERDICTS = ("safety", "liveness", "errors")

# A statement that takes SQLite's write lock (or needs it, as a strict checkpoint does).
_WRITES = re.compile(r"\s*(BEGIN\s+(IMMEDIATE|EXCLUSIVE)|INSERT|UPDATE|DELETE|REPLACE|CREATE|"
                     r"DROP|ALTER|VACUUM|PRAGMA\s+\w*\s*wal_checkpoint\s*\(\s*\W?(FULL|RESTART|"
                     r"TRUNCATE))", re.IGNORECASE)
_CONNECT = sqlite3.connect  # the explorer's own, never stopped
UNKNOWN = core.UNREAD  # a stored pair the receiver cannot say: it has no read(resource)
ANSWER = "its answer is heard"  # where a holder may die after its last statement


# --- data ---


class Call(NamedTuple):
    """One call of an interleaving: its step and lease, its answer (None if its holder died
    in it), whether a COMMIT of it returned, and the choices it began and ended at."""

    h: int
    step: Any
    held: Lease | None
    run: Run | None
    committed: bool
    start: int
    end: int


class Interleaving(NamedTuple):
    """One interleaving played: the choices taken, how many were open at each, its calls, its
    transcript, its verdicts' failures, and what the file holds at the end."""

    choices: tuple[int, ...]
    tokens: tuple[str, ...]  # the choices as a witness prints them: A@0 (start), A (run), A!
    options: tuple[int, ...]
    calls: tuple[Call, ...]
    said: tuple[str, ...]
    failed: tuple[str, ...]
    crashed: str | None  # "acquire, committed: held": the call it died in, and its retry
    final: tuple[Any, ...] | None  # each resource's row and stored pair; None: a lock kept
    notes: tuple[tuple[int, str], ...] = ()  # replays: after a line of `said`, a write's pairs


# --- rules: the three verdicts of one interleaving ---


def safe(bound: Bound, rules: tuple[str, ...], calls: tuple[Call, ...],
         final: tuple[Any, ...]) -> bool:
    """Some one-at-a-time order of `calls` gives every answer heard and leaves `final` (each
    resource's authority row, and its stored pair, or UNKNOWN)."""
    answered = [c for c in calls if c.run is not None and not _raised(c.run)]
    optional = [c for c in calls if c not in answered and not c.committed]
    must = [c for c in calls if c not in answered and c.committed]
    every = (*answered, *must, *optional)

    @_memo
    def order(placed: frozenset[int], records: tuple[Record, ...]) -> bool:
        waiting = [i for i in range(len(every)) if i not in placed]
        known = [pair is not UNKNOWN for _, pair in final]
        if all(every[i] in optional for i in waiting) and final == _held(records, known):
            return True
        for i in waiting:
            call = every[i]
            if any(every[j].end < call.start for j in waiting if j != i and every[j] not in
                   optional):
                continue  # a call that ended before this one began comes first
            r = call.h % bound.resources
            resource = bound.resource(call.h)
            answers, kept = expected(records[r], call.step, call.held, rules, resource)
            run = Run(kept, tuple((call.step.actor, call.step.action.value, call.step.tick,
                                   *answer) for answer in answers), False)
            if call in answered:
                assert call.run is not None
                if call.run.kept != kept or any(core.compared(e, a) != a for e, a in zip(
                        call.run.events, answers)):
                    continue
            after = recorded(records[r], call.step, call.held, run)
            if order(placed | {i}, (*records[:r], after, *records[r + 1:])):
                return True
        return False

    return bool(order(frozenset(), (Record.empty(len(rules), bound.first_epoch),) *
                      bound.resources))


def _memo(function: Any) -> Any:
    seen: dict[Any, bool] = {}

    def remembered(*args: Any) -> bool:
        if args not in seen:
            seen[args] = function(*args)
        return seen[args]

    return remembered


def _held(records: tuple[Record, ...], known: list[bool]) -> tuple[Any, ...]:
    """What the file must hold by the record: each resource's authority row and stored pair."""
    return tuple((record.row, record.stored[0] if read else UNKNOWN)
                 for record, read in zip(records, known))


def _token(choice: tuple[Any, ...]) -> str:
    """A choice as a witness prints it: A@0 starts A's next call at tick 0, A runs A's next
    statement (or lets its answer be heard), A! kills A there."""
    kind, h, *tick = choice
    return HOLDERS[h] + (f"@{tick[0]}" if kind == "start" else "!" if kind == "die" else "")


def _raised(run: Run) -> bool:
    return str(run.events[0][3]).startswith("raised")


# --- the holders: a thread each, stopped before each statement ---


class _Died(BaseException):  # not an error: the holder's process is gone
    """A holder died before a statement: it runs none after, no COMMIT, no ROLLBACK."""


class _Gated(sqlite3.Connection):
    """A holder's connection: it stops before each statement until the scheduler lets it."""

    worker: "_Worker"

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        cursor: sqlite3.Cursor = self.worker.run(
            self, sql, lambda: super(_Gated, self).execute(sql, parameters))
        return cursor

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
        cursor: sqlite3.Cursor = self.worker.run(
            self, sql, lambda: super(_Gated, self).executemany(sql, parameters))
        return cursor

    def executescript(self, script: str, /) -> sqlite3.Cursor:
        cursor: sqlite3.Cursor = self.worker.run(
            self, script, lambda: super(_Gated, self).executescript(script))
        return cursor

    def commit(self) -> None:
        if self.in_transaction:  # else sqlite3 runs no statement: nothing to stop before
            self.worker.run(self, "COMMIT", super().commit)

    def rollback(self) -> None:
        if self.in_transaction:
            self.worker.run(self, "ROLLBACK", super().rollback)

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            self.worker.connections.remove(self)
        super().close()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: types.TracebackType | None) -> Literal[False]:
        """`with connection:` commits or rolls back as sqlite3 does, stopped before it."""
        if kind is None:
            self.commit()
        else:
            self.rollback()
        return False


_workers: dict[int, "_Worker"] = {}  # by thread id, while an interleaving plays


def _connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
    """sqlite3.connect while this mode runs: a holder's thread gets a stopped connection."""
    worker = _workers.get(threading.get_ident())
    if worker is None:
        own: sqlite3.Connection = _CONNECT(*args, **kwargs)
        return own
    connection = _CONNECT(*args, **{**kwargs, "timeout": 0, "factory": _Gated})
    assert isinstance(connection, _Gated)
    connection.worker = worker
    connection.set_trace_callback(worker.traced)
    worker.connections.append(connection)
    return connection


class _Worker:
    """One holder: a thread playing its calls on objects of its own, stopped before each
    statement.  It tells the scheduler ("paused", sql), ("ended", run), ("died", None)."""

    def __init__(self, h: int, path: str, place: Place, told: "queue.SimpleQueue[Any]",
                 first_epoch: int) -> None:
        self.h, self.path, self.place, self.told = h, path, place, told
        self.first_epoch, self.hung = first_epoch, False
        self.go: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.connections: list[sqlite3.Connection] = []
        self.changes: dict[sqlite3.Connection, int] = {}  # rows changed when it last began
        self.objects: list[Any] = []
        self.gated = self.dead = self.allowed = self.writing = self.committed = False
        self.stopping = False
        self.ungated: str | None = None
        self.thread = threading.Thread(target=self._main, name=f"holder {HOLDERS[h]}",
                                       daemon=True)

    def run(self, connection: sqlite3.Connection, sql: str, statement: Any) -> Any:
        """Run one statement once the scheduler says so; die there if it says so."""
        if self.dead:
            raise _Died
        if self.gated:
            self.told.put(("paused", sql))
            order = self.go.get()
            if order != "go":  # "die", or None: the interleaving is over
                self.dead, self.stopping = True, order is None
                raise _Died
        self.allowed = True
        if not connection.in_transaction:  # what a transaction begun by it finds changed
            self.changes[connection] = connection.total_changes
        try:
            result = statement()
        finally:
            self.allowed = False
            began = _WRITES.match(sql) is not None
            self.writing = connection.in_transaction and (self.writing or began)
        # A call is committed once a transaction of it that changed a row has ended without
        # a rollback: by COMMIT, or as an autocommit statement.  One that changed nothing (a
        # read, a refused write, a COMMIT with none open) leaves it as it was.
        if not connection.in_transaction and self.gated and not re.match(
                r"\s*ROLLBACK\b", sql, re.IGNORECASE):
            self.committed = self.committed or (
                connection.total_changes > self.changes.get(connection, 0))
        return result

    def traced(self, sql: str) -> None:
        if self.gated and not self.allowed and self.ungated is None:
            self.ungated = sql

    def _main(self) -> None:
        _workers[threading.get_ident()] = self
        try:
            while (order := self.go.get()) is not None:
                step, held, resource = order
                if not self.objects:  # a new process opens the file, not interleaved
                    self.objects = calls.opened(self.path, (self.place,),
                                                  self.first_epoch)
                    if len(self.connections) < len(self.objects):
                        calls.closed(self.objects, (self.place,))
                        raise core.Unsupported(
                            f"{self.place.spec!r} opened no connection through sqlite3.connect "
                            "as it was made, so its statements cannot be stopped")
                self.gated, self.committed = True, False
                try:
                    kept, events = played(step, held, self.objects, self.path, resource)
                except _Died:
                    self.gated = False
                    self._close()
                    if self.stopping:
                        return
                    self.told.put(("died", None))
                    continue
                finally:
                    self.gated = False
                left = any(c.in_transaction for c in self.connections)
                self.told.put(("paused", ANSWER))  # it may die before its answer is heard
                if (order := self.go.get()) != "go":
                    self._close()
                    if order is None:
                        return
                    self.told.put(("died", None))
                    continue
                self.told.put(("ended", (Run(core.lease_fields(kept), events, left),
                                         self.committed)))
        except BaseException as exc:  # noqa: BLE001 - told, and raised by the scheduler
            self.told.put(("broken", exc))
        finally:
            self._close()
            _workers.pop(threading.get_ident(), None)

    def _close(self) -> None:
        """Close every connection as it is: SQLite rolls back what was not committed."""
        for connection in list(self.connections):  # each removes itself as it closes
            connection.close()
        self.connections, self.objects, self.dead, self.writing = [], [], False, False
        self.changes = {}


# --- one interleaving, played by its choices ---


def play(bound: Bound, place: Place, choices: tuple[int, ...], *, crashes: bool = True,
         tokens: tuple[str, ...] | None = None) -> Interleaving:
    """Play one interleaving from a fresh start: `choices` first (each an index into the
    choices open there), or the witness's `tokens`, then the first open choice at each
    point.  With `tokens` (a replay), each write's stored pair is read before and after."""
    with contextlib.ExitStack() as cleanup:
        folder = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="statements-"))
        path = os.path.join(folder, "leases.sqlite3")
        told: queue.SimpleQueue[Any] = queue.SimpleQueue()
        workers = [_Worker(h, path, place, told, bound.first_epoch)
                   for h in range(bound.holders)]
        for worker in workers:
            worker.thread.start()
            cleanup.callback(_stop, worker, bound.timeout)
        scheduler = _Scheduler(bound, place, workers, told, path, crashes)
        if tokens is not None:
            scheduler.observer = _Observer(place, path, bound)
            cleanup.callback(scheduler.observer.close)
        try:
            return scheduler.played(choices, tokens)
        except BaseException:  # a holder may be in a call that never ends: none is waited for
            for worker in workers:
                worker.hung = True
            raise


def _stop(worker: "_Worker", seconds: float) -> None:
    worker.go.put(None)
    if not worker.hung:  # a hung holder's thread is left to its call
        worker.thread.join(seconds)


class _Observer:
    """Reads what the receiver stores, on objects of its own out of the holders' turns."""

    def __init__(self, place: Place, path: str, bound: Bound) -> None:
        self.place, self.path, self.bound = place, path, bound
        self.reader: Any = None

    def close(self) -> None:
        if self.reader is not None:
            core.guarded(self.place.who, "close()", self.reader.close)

    def stored(self, resource: str) -> Any:
        """The stored pair, or UNKNOWN: no read(resource), or the file not yet made."""
        if self.reader is None:
            if not os.path.exists(self.path):
                return UNKNOWN
            self.reader = self.place.make(self.path, self.bound.first_epoch - 1)
        return self.reader.read(resource) if hasattr(self.reader, "read") else UNKNOWN


class _Scheduler:
    """The scheduler's view of one interleaving: each holder idle, paused before a statement,
    or done; its calls so far.  A choice is ("start", h, tick), ("run", h) or ("die", h)."""

    def __init__(self, bound: Bound, place: Place, workers: list[_Worker],
                 told: "queue.SimpleQueue[Any]", path: str, crashes: bool) -> None:
        self.bound, self.place, self.workers, self.told, self.path = (bound, place, workers,
                                                                      told, path)
        self.sql: list[str | None] = [None] * bound.holders  # paused before it, or None: idle
        self.positions, self.held = [0] * bound.holders, [None] * bound.holders
        self.begun: list[tuple[Any, int]] = [(None, 0)] * bound.holders  # each call's step
        self.tick, self.taken, self.died = 0, 0, False
        self.crashes = crashes  # whether a holder may die (once; the rest is then one way)
        self.calls: list[Call] = []
        self.said: list[str] = []
        self.failed: list[str] = []
        self.crashed: str | None = None
        self.retrying: dict[int, str] = {}  # the call each holder died in, to take again
        self.tokens: list[str] = []
        self.observer: _Observer | None = None  # a replay's: each write's pairs read
        self.notes: list[tuple[int, str]] = []
        self.before: dict[int, Any] = {}  # by holder: the pair stored as its write began
        self.answered = [Record.empty(1, bound.first_epoch)] * bound.resources  # calls one
        # at a time in the order they answered: what the contract answers a write there

    def enabled(self) -> list[tuple[Any, ...]]:
        writer = [h for h, worker in enumerate(self.workers) if worker.writing]
        writer += [h for h, sql in enumerate(self.sql) if sql == ANSWER]
        if writer:  # it runs on to COMMIT (or its answer) alone, or dies: no one else sees
            h = writer[0]
            if self.sql[h] is None:
                return []  # it kept the lock after its call: the others wait for ever
            return [("run", h), *([("die", h)] * self.may_die)]
        choices: list[tuple[Any, ...]] = []
        for h, sql in enumerate(self.sql):
            if sql is not None:
                choices += [("run", h), *([("die", h)] * self.may_die)]
            elif self.positions[h] < len(self.bound.program):
                choices += [("start", h, t) for t in range(self.tick, self.bound.last_tick + 1)]
        return sorted(choices, key=lambda c: c[0] == "die")  # the first, a plain run

    @property
    def may_die(self) -> bool:
        return self.crashes and not self.died

    def played(self, given: tuple[int, ...],
               tokens: tuple[str, ...] | None = None) -> Interleaving:
        taken: list[int] = []
        options: list[int] = []
        while choices := self.enabled():
            named = [_token(choice) for choice in choices]
            if tokens is not None and len(taken) < len(tokens):
                if tokens[len(taken)] not in named:  # another bound's, or another answer
                    self.said.append(f"  the witness's choice {len(taken) + 1}, "
                                     f"{tokens[len(taken)]!r}, is not open here (open: "
                                     f"{' '.join(named)})")
                    self.failed.append("witness")
                    break
                index = named.index(tokens[len(taken)])
            else:
                index = given[len(taken)] if len(taken) < len(given) else 0
            taken.append(index)
            self.tokens.append(named[index])
            options.append(1 if self.died and len(taken) > len(given) else len(choices))
            self.take(choices[index])
        if self.failed:  # the witness went otherwise: nothing more to judge
            return Interleaving(tuple(taken), tuple(self.tokens), tuple(options),
                                tuple(self.calls), tuple(self.said), tuple(self.failed),
                                self.crashed, None, tuple(self.notes))
        if any(p < len(self.bound.program) for p in self.positions) or any(
                sql is not None for sql in self.sql):
            self.failed.append("liveness")
            self.said.append("  the others wait for ever: the write lock is kept after a call")
        final = None if self.failed else self._final()  # a lock kept: it cannot be read
        if final is not None and not safe(self.bound, (self.place.rules,), tuple(self.calls),
                                          final):
            self.failed.append("safety")
            self.said.append("  no one-at-a-time order of these calls gives these answers and "
                             "leaves what the file holds")
        if any(c.run is not None and _raised(c.run) for c in self.calls):
            self.failed.append("errors")
        return Interleaving(tuple(taken), tuple(self.tokens), tuple(options),
                            tuple(self.calls), tuple(self.said), tuple(self.failed),
                            self.crashed, final, tuple(self.notes))

    def take(self, choice: tuple[Any, ...]) -> None:
        kind, h, *rest = choice
        worker, actor = self.workers[h], HOLDERS[h]
        self.taken += 1
        if kind == "start":
            (self.tick,) = rest
            step = self.bound.step(h, self.positions[h], self.tick)
            self.begun[h] = step, self.taken
            resource = self.bound.resource(h)
            where = f" {resource}" * (self.bound.resources > 1)
            self.said.append(f"{actor} {step.action.value}{where} at tick {self.tick}:")
            held = None if self.held[h] is None else Lease(*self.held[h])
            if self.observer and held and step.action.value == "write":
                self.before[h] = self.observer.stored(resource)
            worker.go.put((step, held, self.bound.resource(h)))
        elif kind == "run":
            if self.sql[h] != ANSWER:
                self.said.append(f"  {actor} {self.sql[h]}")
            worker.go.put("go")
        else:
            self.died = True
            self.said.append(f"  {actor} dies before {self.sql[h]}")
            worker.go.put("die")
        self._heard(h)

    def _heard(self, h: int) -> None:
        worker, actor = self.workers[h], HOLDERS[h]
        try:
            kind, what = self.told.get(timeout=self.bound.timeout)
        except queue.Empty:
            worker.hung = True
            step = self.begun[h][0]
            raise core.Hung(
                f"holder {actor}'s {step.action.value} at tick {step.tick} gave no answer "
                f"within {self.bound.timeout:g} s", lines=self.said,
                witness=" ".join(self.tokens)) from None
        if kind == "broken":
            raise what
        if worker.ungated is not None:
            raise core.Unsupported(f"holder {actor} ran {worker.ungated!r} where the "
                                      "explorer cannot stop it: run each statement through a "
                                      "connection's execute, executemany or executescript")
        if kind == "paused":
            self.sql[h] = " ".join(what.split())  # one line, as a witness shows it
            return
        self.sql[h] = None
        step, start = self.begun[h]
        belief = self.held[h]
        held = None if belief is None else Lease(*belief)
        if kind == "died":
            self.calls.append(Call(h, step, held, None, worker.committed, start, self.taken))
            self.retrying[h] = f"{step.action.value}, {'not ' * (not worker.committed)}committed"
            self._noted(h, None, worker.committed)
            return
        run, committed = what
        if run.lock_left:
            self.failed.append("liveness")
            self.said.append(f"  {actor} returned with a transaction open")
        self.calls.append(Call(h, step, held, run, committed, start, self.taken))
        self.said.append(f"  {actor} {run.events[0][3]}" + f" epoch {run.events[0][4]}" * (
            run.events[0][3] in ("granted", "renewed")))
        if h in self.retrying:  # the step taken again by a new process
            self.crashed = f"{self.retrying.pop(h)}: {run.events[0][3]}"
        self._noted(h, run, committed)
        self.positions[h] += 1
        self.held[h] = run.kept

    def _noted(self, h: int, run: Run | None, committed: bool) -> None:
        """In a replay, a write's note: the pair stored before and after, and the contract's
        answer with the calls taken one at a time in the order they answered (a call whose
        holder died after its COMMIT among them, as the contract answers it)."""
        step, r, belief = self.begun[h][0], h % self.bound.resources, self.held[h]
        held = None if belief is None else Lease(*belief)
        answers, kept = expected(self.answered[r], step, held, (self.place.rules,),
                                 self.bound.resource(h))
        if run is not None or committed:
            self.answered[r] = recorded(self.answered[r], step, held, run or Run(kept, tuple(
                (step.actor, step.action.value, step.tick, *answer) for answer in answers),
                False))
        if h not in self.before or self.observer is None:
            return
        after = self.observer.stored(self.bound.resource(h))
        said = (f"    stored {core.shown_pair(self.before.pop(h))} as it began -> "
                f"{core.shown_pair(after)}")
        if run is not None:
            said += f"; the contract, calls taken in the order they answered: {answers[0][0]}"
        self.notes.append((len(self.said) - 1, said))
    def _final(self) -> tuple[Any, ...]:
        """What the file holds: each resource's authority row, and the stored pair as the
        receiver's read(resource) gives it (UNKNOWN: a reader's receiver without one)."""
        connection = _CONNECT(self.path, isolation_level=None, timeout=0)
        reader = self.place.make(self.path, self.bound.first_epoch - 1)
        try:
            held = []
            for r in range(self.bound.resources):
                resource = core.RESOURCES[r]
                row = connection.execute("SELECT holder, epoch, expires_at FROM leases WHERE "
                                         "resource = ?", (resource,)).fetchone()
                if row is not None:  # as every party sees the epochs: from the first epoch
                    row = (row[0], row[1] + self.bound.first_epoch - 1, row[2])
                stored = reader.read(resource) if hasattr(reader, "read") else UNKNOWN
                held.append((row, stored))
            return tuple(held)
        finally:
            connection.close()
            core.guarded(self.place.who, "close()", reader.close)


# --- the search: every interleaving, by its choices ---


def explore_statements(bound: Bound, place: Place | None = None) -> dict[str, Any]:
    """Every interleaving of `bound` at each statement, and each with one crash; the table.
    A failing one is played again whole in a new process: it must fail again, else
    core.Different."""
    place = place or calls.places()[0]
    sqlite3.connect = _connect  # type: ignore[assignment]
    found = []
    try:
        for run in _every(bound, place):  # up to the first failing
            found.append(run)
            if run.failed:
                break
    finally:
        sqlite3.connect = _CONNECT
    crashed = Counter(run.crashed for run in found if run.crashed)
    failing = {verdict: next((run for run in found if verdict in run.failed), None)
               for verdict in VERDICTS}
    shown = {}
    with contextlib.ExitStack() as cleanup:
        for verdict, failed in failing.items():
            if failed is not None:
                run = failed
                again = core.Fresh(replayed, (bound, place, run.tokens), cleanup).result()
                if verdict not in again.failed or again.said != run.said:
                    raise core.Different(_differs(verdict, run, again))
                shown[verdict] = [*_lines(again), "  again: " + core.command(
                    bound, (place,) * (place.spec not in calls.OURS), "statements",
                    " ".join(again.tokens))]
    return {
        "bound": bound, "receiver": place.name,
        "interleavings": sum(not _died(run) for run in found),
        "crash_schedules": sum(_died(run) for run in found),
        "after_a_crash": dict(sorted(crashed.items())),
        "failed": {verdict: sum(verdict in run.failed for run in found) for verdict in VERDICTS},
        "witnesses": shown,
        "ok": not any(failing.values()),
    }


def _differs(verdict: str, run: Interleaving, again: Interleaving) -> str:
    """Why a failing interleaving is not shown: it went otherwise played whole afresh."""
    said = [line for line, other in zip(run.said, again.said) if line != other]
    where = (f"; first, in the search {said[0].strip()!r}, afresh "
             f"{again.said[run.said.index(said[0])].strip()!r}" if said else "")
    return (f"an interleaving failed {verdict} in the search but, played whole in a new "
            f"process, {'failed ' + ', '.join(again.failed) if again.failed else 'passed'}"
            f"{where}: an answer rests on more than the file and the call; the search's:\n"
            + "\n".join(run.said))


def _died(run: Interleaving) -> bool:
    return any(" dies before " in line for line in run.said)


def replayed(bound: Bound, place: Place, tokens: tuple[str, ...]) -> Interleaving:
    """One interleaving played by its witness in a new process: the library imported afresh,
    each write's stored pairs read."""
    sqlite3.connect = _connect  # type: ignore[assignment]
    return play(bound, place, (), tokens=tokens)


def replay(bound: Bound, place: Place, witness: str) -> tuple[str, bool]:
    """A printed witness played again alone, in a new process: its transcript and verdicts."""
    with contextlib.ExitStack() as cleanup:
        again = core.Fresh(replayed, (bound, place, tuple(witness.split())),
                              cleanup).result()
    if "witness" in again.failed:  # not one of this bound's, or an answer went otherwise
        raise ValueError(f"the witness {witness!r}: {again.said[-1].strip()}")
    return "\n".join([
        (f"the interleaving {witness} of {bound.said()}, receiver {place.name}, played again "
         "whole in a new process, stored pairs as read"), *_lines(again),
        *(f"  {verdict}: {'FAILED' if verdict in again.failed else 'held'}"
          for verdict in VERDICTS)]), not again.failed


def _lines(run: Interleaving) -> list[str]:
    """An interleaving's transcript, each write's note after its answer."""
    notes = dict(run.notes)
    return [line for i, said in enumerate(run.said)
            for line in (said, *([notes[i]] if i in notes else []))]


def _every(bound: Bound, place: Place,
           crashes_or_not: tuple[bool, ...] = (False, True)) -> Iterator[Interleaving]:
    """Each interleaving with no crash, then each with one, depth first: after each, every
    other choice open at each point."""
    for crashes in crashes_or_not:
        pending: list[tuple[int, ...]] = [()]
        while pending:
            given = pending.pop()
            run = play(bound, place, given, crashes=crashes)
            if crashes == _died(run):
                yield run
            for depth in range(len(run.options) - 1, len(given) - 1, -1):
                pending += [(*run.choices[:depth], other) for other in
                            range(run.options[depth] - 1, 0, -1)]


def report(table: dict[str, Any], seconds: float) -> str:
    bound: Bound = table["bound"]
    lines = [
        (f"every interleaving at each SQL statement of {bound.said()}, receiver "
        f"{table['receiver']}"),
        (f"  {table['interleavings']:,} interleavings, and {table['crash_schedules']:,} with a "
        "crash: a holder dies before a statement, and a new process takes the step again "
        f"(the rest played one way){', up to the first failing' * (not table['ok'])}; "
        f"{seconds:.1f} s"),
        *["  a crash in, and the step taken again:"] * bool(table["after_a_crash"]),
        *(f"    {seen:<40}{count:>8,}" for seen, count in table["after_a_crash"].items()),
        *(f"  {verdict}: {'held' if not count else f'FAILED in {count:,}'}"
          for verdict, count in table["failed"].items()),
    ]
    for verdict, said in table["witnesses"].items():
        lines += [(f"the first interleaving failing {verdict}, failing again played whole in a "
                  "new process:"), *said]
    return "\n".join(lines)
