"""The statement engine: actors stopped before each SQL statement and at named gates, the
scheduler's handshake with them, and every interleaving searched depth first.

A subject (the holders' calls, a reader's worker) supplies:
* the bodies: any callable, run by Scheduler.start in an actor's thread.  While `gated()` is
  on, sqlite3.connect in an actor's thread gives a connection that stops before each
  statement (execute, executemany, executescript, commit, rollback, `with connection:`; a
  statement run any other way is Unsupported), and gate(what) stops it anywhere else, and
  answers the value the scheduler goes on with (go(i, value): a job offered, say); a body
  started with interleaved=False runs unstopped until it calls interleave();
* a Scheduler subclass: enabled() (the choices open now), token(choice) (as a witness prints
  it) and take(choice), which calls start, go, fail (the statement raises "database is
  locked", as SQLite does when the write lock is taken) or kill;
* play(given, crashes): one interleaving from a fresh start, answering .choices, .options and
  .died (whether an actor was killed), for every(play).
The engine gives each Actor's .writing (it holds SQLite's write lock: it runs alone to
COMMIT; with .alone set by the subject, its statements there are not stopped at all, only
kept in .passed), .committed (a transaction of the current body that changed a row ended
without a rollback), .connections and .kept (what the subject keeps in the actor's process: emptied
when it dies); a kill (Died raised in the actor's thread, its connections closed with no
COMMIT); every wait bounded by the timeout (Hung, naming the actor and what it was doing).
A failing interleaving is played again by core.Fresh in a new process.
"""

import contextlib
import queue
import re
import sqlite3
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any, Literal, Protocol

from core import Different, Hung, Unsupported

__all__ = ["LOCKED", "Actor", "Died", "Played", "Scheduler", "every", "gate", "gated",
           "interleave"]

# A statement that takes SQLite's write lock (or needs it, as a strict checkpoint does).
_WRITES = re.compile(r"\s*(BEGIN\s+(IMMEDIATE|EXCLUSIVE)|INSERT|UPDATE|DELETE|REPLACE|CREATE|"
                     r"DROP|ALTER|VACUUM|PRAGMA\s+\w*\s*wal_checkpoint\s*\(\s*\W?(FULL|RESTART|"
                     r"TRUNCATE))", re.IGNORECASE)
_CONNECT = sqlite3.connect  # the explorer's own, never stopped
GRACE = 1.0  # seconds an actor is waited for after an error
LOCKED = "database is locked"  # what a statement failed by Scheduler.fail raises


class Died(BaseException):  # not an error: the actor's process is gone
    """An actor was killed before a gate: it runs no statement after, no COMMIT, no ROLLBACK."""


class Played(Protocol):
    """What every() reads of an interleaving played."""

    @property
    def choices(self) -> tuple[int, ...]: ...  # the index taken at each point
    @property
    def options(self) -> tuple[int, ...]: ...  # how many were open there
    @property
    def died(self) -> bool: ...


# --- the actors: a thread each, stopped before each statement and at each gate ---


def gate(what: str) -> Any:
    """Stop the calling actor before `what` until the scheduler lets it go: the value it goes
    on with (Died if it kills it).  Outside an actor's thread, or before it is interleaved, None."""
    actor = _actors.get(threading.get_ident())
    return actor.pause(what) if actor is not None and actor.gated else None


def interleave() -> None:
    """From here on the calling actor's body is stopped at its gates (started with
    interleaved=False, it ran unstopped: a new process opening its files, say)."""
    actor = _actors.get(threading.get_ident())
    if actor is not None:
        actor.gated = True


@contextlib.contextmanager
def gated() -> Iterator[None]:
    """sqlite3.connect gives each actor's thread a stopped connection, within it."""
    sqlite3.connect = _connect  # type: ignore[assignment]
    try:
        yield
    finally:
        sqlite3.connect = _CONNECT


class _Gated(sqlite3.Connection):
    """An actor's connection: it stops before each statement until the scheduler lets it."""

    actor: "Actor"

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        cursor: sqlite3.Cursor = self.actor.run(
            self, sql, lambda: super(_Gated, self).execute(sql, parameters))
        return cursor

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
        cursor: sqlite3.Cursor = self.actor.run(
            self, sql, lambda: super(_Gated, self).executemany(sql, parameters))
        return cursor

    def executescript(self, script: str, /) -> sqlite3.Cursor:
        cursor: sqlite3.Cursor = self.actor.run(
            self, script, lambda: super(_Gated, self).executescript(script))
        return cursor

    def commit(self) -> None:
        if self.in_transaction:  # else sqlite3 runs no statement: nothing to stop before
            self.actor.run(self, "COMMIT", super().commit)

    def rollback(self) -> None:
        if self.in_transaction:
            self.actor.run(self, "ROLLBACK", super().rollback)

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            self.actor.connections.remove(self)
        super().close()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: types.TracebackType | None) -> Literal[False]:
        """`with connection:` commits or rolls back as sqlite3 does, stopped before it."""
        if kind is None:
            self.commit()
        else:
            self.rollback()
        return False


_actors: dict[int, "Actor"] = {}  # by thread id, while an interleaving plays


def _connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
    """sqlite3.connect while gated: an actor's thread gets a stopped connection that waits
    for no lock."""
    actor = _actors.get(threading.get_ident())
    if actor is None:
        own: sqlite3.Connection = _CONNECT(*args, **kwargs)
        return own
    connection = _CONNECT(*args, **{**kwargs, "timeout": 0, "factory": _Gated})
    assert isinstance(connection, _Gated)
    connection.actor = actor
    connection.set_trace_callback(actor.traced)
    actor.connections.append(connection)
    return connection


class Actor:
    """One thread playing bodies one at a time, stopped at each gate.  It tells the scheduler
    ("paused", what), ("ended", result), ("died", None) or ("broken", exception)."""

    def __init__(self, name: str, told: "queue.SimpleQueue[Any]") -> None:
        self.name, self.told = name, told
        self.doing = ""  # what its body does, as a hang names it: "write at tick 0"
        self.go: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.connections: list[sqlite3.Connection] = []
        self.kept: dict[str, Any] = {}  # the subject's, in this actor's process
        self.changes: dict[sqlite3.Connection, int] = {}  # rows changed when it last began
        self.gated = self.dead = self.allowed = self.writing = self.committed = False
        self.stopping = self.hung = False
        # Set by the subject: while it holds the write lock it runs alone to its COMMIT, its
        # statements not stopped (no other choice is open there), only kept in .passed.
        self.alone = False
        self.passed: list[str] = []
        self.ungated: str | None = None
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)

    def pause(self, what: str) -> Any:
        if self.dead:
            raise Died
        self.told.put(("paused", what))
        order = self.go.get()
        if order is None or order[0] == "die":  # None: the interleaving is over
            self.dead, self.stopping = True, order is None
            raise Died
        if order[0] == "fail":
            raise sqlite3.OperationalError(LOCKED)
        return order[1]

    def run(self, connection: sqlite3.Connection, sql: str, statement: Any) -> Any:
        """Run one statement once the scheduler says so; die there if it says so."""
        if self.dead:
            raise Died
        if self.gated and self.writing and self.alone:
            self.passed.append(sql)
        elif self.gated:
            self.pause(sql)
        self.allowed = True
        if not connection.in_transaction:  # what a transaction begun by it finds changed
            self.changes[connection] = connection.total_changes
        try:
            result = statement()
        finally:
            self.allowed = False
            began = _WRITES.match(sql) is not None
            self.writing = connection.in_transaction and (self.writing or began)
        # A body has committed once a transaction of it that changed a row has ended without
        # a rollback: by COMMIT, or as an autocommit statement.  One that changed nothing (a
        # read, a refused write, a COMMIT with none open) leaves it as it was.
        if not connection.in_transaction and self.gated and not re.match(
                r"\s*ROLLBACK\b", sql, re.IGNORECASE):
            self.committed = self.committed or (
                connection.total_changes > self.changes.get(connection, 0))
        return result

    def traced(self, sql: str) -> None:
        # "-- ...": a statement SQLite runs inside one already stopped before (a trigger's, a
        # pragma function's), as late as a fetch of its rows.
        if self.gated and not self.allowed and self.ungated is None and \
                not sql.startswith("--"):
            self.ungated = sql

    def _main(self) -> None:
        _actors[threading.get_ident()] = self
        try:
            while (order := self.go.get()) is not None:
                body, self.gated, self.committed = order
                try:
                    result = body()
                except Died:
                    self.close()
                    if self.stopping:
                        return
                    self.told.put(("died", None))
                    continue
                finally:
                    self.gated = False
                self.told.put(("ended", result))
        except BaseException as exc:  # noqa: BLE001 - told, and raised by the scheduler
            self.told.put(("broken", exc))
        finally:
            self.close()
            _actors.pop(threading.get_ident(), None)

    def close(self) -> None:
        """Close every connection as it is: SQLite rolls back what was not committed; what
        the subject kept in this process is gone with it."""
        for connection in list(self.connections):  # each removes itself as it closes
            connection.close()
        self.connections, self.dead, self.writing, self.changes = [], False, False, {}
        self.kept = {}


# --- the scheduler: one interleaving, by its choices ---


class Scheduler:
    """One interleaving's actors and its transcript.  A subclass gives enabled(), token() and
    take(); `waiting[i]` is what actor i is paused before, or None (idle or done)."""

    def __init__(self, names: list[str], seconds: float, crashes: bool,
                 cleanup: contextlib.ExitStack) -> None:
        self.grace = seconds  # how long an actor is waited for as the interleaving ends
        self.told: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.actors = [Actor(name, self.told) for name in names]
        self.seconds, self.crashes, self.died = seconds, crashes, False
        self.waiting: list[str | None] = [None] * len(names)
        self.said: list[str] = []  # the transcript, as a witness shows it
        self.tokens: list[str] = []  # the choices taken, as --replay takes them
        self.failed: list[str] = []
        for actor in self.actors:
            actor.thread.start()
            cleanup.callback(self._stop, actor)
        cleanup.push(self._abandon)  # run first: on an error, waited for less

    def enabled(self) -> list[Any]:
        raise NotImplementedError

    def token(self, choice: Any) -> str:
        raise NotImplementedError

    def take(self, choice: Any) -> None:
        raise NotImplementedError

    @property
    def may_die(self) -> bool:
        """Whether an actor may be killed now: at most once in an interleaving."""
        return self.crashes and not self.died

    def chosen(self, given: tuple[int, ...],
               tokens: tuple[str, ...] | None = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Take `given` (each an index into the choices open there), or the witness's
        `tokens`, then the first open choice at each point, until none is open: the indices
        taken and how many were open at each (after a crash, 1: the rest is played one way).
        A witness's choice not open is failed "witness", and ends it."""
        taken: list[int] = []
        options: list[int] = []
        while choices := self.enabled():
            named = [self.token(choice) for choice in choices]
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
                if index >= len(choices):  # the search saw more open here, played before
                    raise Different(f"the choice {len(taken) + 1} after "
                                    f"{' '.join(self.tokens) or 'the start'!r} had "
                                    f"{len(choices)} open, fewer than when played before: an "
                                    "answer rests on more than the files and the calls")
            taken.append(index)
            self.tokens.append(named[index])
            options.append(1 if self.died and len(taken) > len(given) else len(choices))
            self.take(choices[index])
        if tokens is not None and len(taken) < len(tokens) and "witness" not in self.failed:
            self.said.append(f"  the witness's choice {len(taken) + 1}, "
                             f"{tokens[len(taken)]!r}, is past the end: nothing is open here")
            self.failed.append("witness")
        return tuple(taken), tuple(options)

    def start(self, i: int, body: Callable[[], Any], doing: str, *,
              interleaved: bool = True) -> tuple[str, Any]:
        """Actor i runs `body` to its first gate, or its end: what it told."""
        self.actors[i].doing = doing
        self.actors[i].go.put((body, interleaved, False))
        return self.heard(i)

    def go(self, i: int, value: Any = None) -> tuple[str, Any]:
        """Actor i runs what it is paused before (its gate answering `value`), to its next
        gate or its end."""
        self.actors[i].go.put(("go", value))
        return self.heard(i)

    def fail(self, i: int) -> tuple[str, Any]:
        """The statement actor i is paused before raises sqlite3.OperationalError(LOCKED)."""
        self.actors[i].go.put(("fail", None))
        return self.heard(i)

    def kill(self, i: int) -> tuple[str, Any]:
        """Actor i dies where it is paused: Died in its thread, its connections closed."""
        self.died = True
        self.actors[i].go.put(("die", None))
        return self.heard(i)

    def heard(self, i: int) -> tuple[str, Any]:
        """What actor i told, within the bound's seconds: else Hung."""
        actor = self.actors[i]
        try:
            kind, what = self.told.get(timeout=self.seconds)
        except queue.Empty:
            actor.hung = True
            raise Hung(f"{actor.name}'s {actor.doing} gave no answer within {self.seconds:g} s",
                       lines=self.said, witness=" ".join(self.tokens)) from None
        if kind == "broken":
            raise what
        if actor.ungated is not None:
            raise Unsupported(f"{actor.name} ran {actor.ungated!r} where the explorer cannot "
                              "stop it: run each statement through a connection's execute, "
                              "executemany or executescript")
        self.waiting[i] = " ".join(what.split()) if kind == "paused" else None
        return kind, what

    def _stop(self, actor: Actor) -> None:
        actor.go.put(None)
        if not actor.hung:  # a hung actor's thread is left to its call
            actor.thread.join(self.grace)

    def _abandon(self, kind: Any, *_: Any) -> Literal[False]:
        """On an error (a Ctrl-C too), each actor not hung gets a second at most to end its
        step and close its connections: one may be in a call that never ends, and one left
        running SQLite as Python exits may crash it (a segmentation fault was seen)."""
        if kind is not None:
            self.grace = min(self.seconds, GRACE)
        return False


# --- the search: every interleaving, by its choices ---


def every(play: Callable[[tuple[int, ...], bool], Played],
          crashes_or_not: tuple[bool, ...] = (False, True)) -> Iterator[Any]:
    """Each interleaving with no crash, then each with one, depth first: after each, every
    other choice open at each point.  `play(given, crashes)` plays the choices `given`, then
    the first open at each point."""
    for crashes in crashes_or_not:
        pending: list[tuple[int, ...]] = [()]
        while pending:
            given = pending.pop()
            run = play(given, crashes)
            if crashes == run.died:
                yield run
            for depth in range(len(run.options) - 1, len(given) - 1, -1):
                pending += [(*run.choices[:depth], other) for other in
                            range(run.options[depth] - 1, 0, -1)]
