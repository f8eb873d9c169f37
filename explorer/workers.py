"""--worker MODULE:NAME: the reader's worker, played as each of W workers over J jobs, at
every SQL statement, clock read and call of the work, with a crash or a store error among them.

NAME has the recipe's signature (recipes/worker.py):

    work(queue, me, clock, do, leases, jobs)

The explorer owns everything around the workers:
- the clock: a tick from 0, moved on by the ttl at any point, at most `jumps` times;
- the work: `do(job, heartbeat)` records the run, then calls heartbeat() once;
- the queue: job j is offered first to worker j % W, and again, at any point, to a worker
  waiting for its next job while the job is not done and no lease on it is live (each worker
  at most once per job); once every worker waits, a job not done is offered once more, quiet:
  the clock moved to its lease's expiry, nothing else happening, as the pool's coordinator does;
- the leases file, and the jobs file: fence.TABLE, a row per job at epoch 0 "queued", every
  stored change and every grant logged by trigger, so that the verdicts rest on what was
  stored, never on what a worker says.

Each worker is a thread whose connections stop before each statement; one runs at a time, and
one holding a write lock runs alone to its COMMIT (no other connection sees its work before).
A worker may die before any statement (its connections close with no COMMIT; a new worker,
with a new name, takes its queue), or a statement that takes the write lock may fail with
"database is locked".  The search is preemption bounding (CHESS): every interleaving with at
most `preemptions` switches away from a worker that could have gone on; a switch at a worker's
wait or end, a crash, a clock move and an offer are free.

Verdicts, per job: lost update, done reverted, unfinished, exception, unfenced work, needless
repeat (VERDICTS, explained in explorer/README.md); a call that never comes back is Hung.
"""

import contextlib
import os
import queue
import re
import shlex
import sqlite3
import sys
import tempfile
import threading
import types
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal, NamedTuple

import explore
from explore import Fresh, Hung, Unsupported

RECIPES = os.path.join(os.path.dirname(explore.HERE), "recipes")
if RECIPES not in sys.path:
    sys.path.append(RECIPES)
import fence
from pool import HISTORY, judge

from leases import LeaseAuthority

__all__ = ["VERDICTS", "Bound", "Played", "brute_force", "explore_workers", "load", "play",
           "replay", "report"]

VERDICTS = ("lost update", "done reverted", "unfinished", "exception", "unfenced work",
            "needless repeat")
GRANTS = """CREATE TABLE grants (resource TEXT, holder TEXT, epoch INTEGER);
CREATE TRIGGER granted AFTER INSERT ON leases BEGIN
  INSERT INTO grants VALUES (new.resource, new.holder, new.epoch); END;
CREATE TRIGGER regranted AFTER UPDATE ON leases WHEN new.epoch <> old.epoch BEGIN
  INSERT INTO grants VALUES (new.resource, new.holder, new.epoch); END;"""
# A statement that takes SQLite's write lock: it may fail "database is locked".
_LOCKS = re.compile(r"\s*(BEGIN\s+(IMMEDIATE|EXCLUSIVE)|INSERT|UPDATE|DELETE|REPLACE)",
                    re.IGNORECASE)
_CONNECT = sqlite3.connect
_LETTERS = "ABCDEFGH"
LOCKED = "database is locked (a store error made by the explorer)"


@dataclass(frozen=True)
class Bound:
    """The reader's worker `spec` as W workers over J jobs, and how far the search goes."""

    spec: str
    workers: int = 2
    jobs: int = 1
    preemptions: int | None = 2  # None: every interleaving
    jumps: int = 1
    crashes: int = 1
    errors: int = 1
    ttl: int = 10
    timeout: float = 10.0
    steps: int = 400  # choices in one interleaving; more is a hang

    def said(self) -> str:
        k = "any number of" if self.preemptions is None else f"at most {self.preemptions}"
        return (f"{self.workers} workers, {self.jobs} job{'s' * (self.jobs != 1)}, ttl "
                f"{self.ttl}; {k} preemptions, {self.jumps} clock jump, {self.crashes} crash, "
                f"{self.errors} store error")

    def command(self, witness: str) -> str:
        words = ["python3", "explorer/explore.py", "--worker", self.spec]
        for name in ("workers", "jobs", "preemptions", "jumps", "crashes", "errors", "ttl"):
            if getattr(self, name) != getattr(Bound, name) and getattr(self, name) is not None:
                words += [f"--{name}", str(getattr(self, name))]
        return shlex.join([*words, "--replay", witness])


class Played(NamedTuple):
    """One interleaving: its choices (indices, and as a witness prints them), how many were
    open at each, its timeline, the verdicts failed (verdict, job or worker), the work runs
    per job, and whether a worker died or a store call failed in it."""

    choices: tuple[int, ...]
    tokens: tuple[str, ...]
    options: tuple[int, ...]
    lines: tuple[str, ...]
    failed: tuple[tuple[str, str], ...]
    runs: tuple[int, ...]
    died: bool
    erred: bool
    open: tuple[str, ...] = ()  # stopped early: the choices open there


def load(spec: str) -> Callable[..., None]:
    """The worker named by MODULE:NAME, from the current folder, explorer/ or recipes/."""
    module, colon, name = spec.partition(":")
    if not (module and colon and name):
        raise ValueError(f"--worker wants MODULE:NAME, got {spec!r}")
    for folder in (explore.HERE, RECIPES, os.getcwd()):
        if folder not in sys.path:
            sys.path.append(folder)
    try:
        found = getattr(__import__(module), name, None)
    except Exception as exc:  # noqa: BLE001 - a module that raises, or will not compile
        raise Unsupported(f"--worker {spec!r}: importing {module!r} raised "
                          f"{type(exc).__name__}: {exc}") from None
    if not callable(found):
        raise Unsupported(f"--worker {spec!r}: {module!r} has no function {name!r}")
    explore.fits(f"{name}(queue, me, clock, do, leases, jobs)", found, *"qmcdlj")
    return found  # type: ignore[no-any-return]


# --- the workers: a thread each, stopped before each statement, clock read and work ---


class _Died(BaseException):  # not an error: the worker's process is gone
    """A worker died: it runs no statement after, no COMMIT, no ROLLBACK."""


class _Gated(sqlite3.Connection):
    """A worker's connection: it stops before each statement until the scheduler lets it."""

    actor: "_Actor"

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        return self.actor.statement(self, sql, lambda: super(_Gated, self).execute(
            sql, parameters))

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
        return self.actor.statement(self, sql, lambda: super(_Gated, self).executemany(
            sql, parameters))

    def executescript(self, script: str, /) -> sqlite3.Cursor:
        return self.actor.statement(self, script, lambda: super(_Gated, self).executescript(
            script))

    def commit(self) -> None:
        if self.in_transaction:
            self.actor.statement(self, "COMMIT", super().commit)

    def rollback(self) -> None:
        if self.in_transaction:
            self.actor.statement(self, "ROLLBACK", super().rollback)

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: types.TracebackType | None) -> Literal[False]:
        self.commit() if kind is None else self.rollback()
        return False


_actors: dict[int, "_Actor"] = {}  # by thread id, while an interleaving plays


def _connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
    """sqlite3.connect while this mode runs: a worker's thread gets a stopped connection."""
    actor = _actors.get(threading.get_ident())
    if actor is None:
        return _CONNECT(*args, **kwargs)
    connection = _CONNECT(*args, **{**kwargs, "timeout": 0, "factory": _Gated})
    assert isinstance(connection, _Gated)
    connection.actor = actor
    actor.connections.append(connection)
    return connection


class _Actor:
    """One worker's thread.  It tells the scheduler (self, "paused", what), (self, "waiting",
    None) or (self, "ended", an exception or None) and waits for its order."""

    def __init__(self, world: "_World", slot: int, name: str) -> None:
        self.world, self.slot, self.name = world, slot, name
        self.go: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.connections: list[sqlite3.Connection] = []
        self.locked: set[sqlite3.Connection] = set()  # holding SQLite's write lock
        self.gated = self.dead = False
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)

    def pause(self, what: tuple[str, ...]) -> str:
        if self.dead:
            raise _Died
        if not self.gated:
            return "go"
        self.world.told.put((self, "paused", what))
        order: str | None = self.go.get()
        if order is None or order == "die":
            self.dead = True
            raise _Died
        return order

    def statement(self, connection: sqlite3.Connection, sql: str, run: Callable[[], Any]) -> Any:
        if self.pause(("sql", " ".join(sql.split()))) == "fail":
            raise sqlite3.OperationalError(LOCKED)
        try:
            return run()
        finally:
            if connection.in_transaction and (connection in self.locked or _LOCKS.match(sql)):
                self.locked.add(connection)
            else:
                self.locked.discard(connection)

    def clock(self) -> int:
        self.pause(("clock",))
        return self.world.tick

    def do(self, job: str, heartbeat: Callable[[], bool]) -> None:
        self.pause(("work", job))
        self.world.ran(self, job)
        heartbeat()

    def queue(self) -> Iterator[str]:
        while True:
            self.gated = True  # its opening, before it first asks, is not interleaved
            if self.dead:
                raise _Died
            if self.world.pending[self.slot]:
                yield self.world.pending[self.slot].pop(0)
                continue
            self.world.told.put((self, "waiting", None))
            job = self.go.get()
            if self.dead or job is None:
                self.gated = False
                if self.dead:
                    raise _Died
                return
            yield job

    def _main(self) -> None:
        _actors[threading.get_ident()] = self
        ended: BaseException | None = None
        try:
            self.world.function(self.queue(), self.name, self.clock, self.do,
                                self.world.leases, self.world.jobs)
        except _Died:
            ended = None
        except BaseException as exc:  # noqa: BLE001 - an exception escaping the worker
            ended = exc
        finally:
            for connection in list(self.connections):  # SQLite rolls back what is open
                connection.close()
            _actors.pop(threading.get_ident(), None)
        self.world.told.put((self, "ended", ended))


# --- one interleaving ---


_made_once: dict[tuple[str, ...], tuple[bytes, bytes]] = {}


def _made(folder: str, names: list[str]) -> tuple[str, str]:
    """The leases file and the jobs file, fresh in `folder`: copies of ones made once."""
    if tuple(names) not in _made_once:
        with tempfile.TemporaryDirectory(prefix="workers-") as made:
            leases, jobs = os.path.join(made, "leases"), os.path.join(made, "jobs")
            LeaseAuthority(leases).close()
            with contextlib.closing(_CONNECT(leases, isolation_level=None)) as db:
                db.executescript(GRANTS)
            with contextlib.closing(_CONNECT(jobs, isolation_level=None)) as db:
                db.execute(fence.TABLE)
                db.executescript(HISTORY)
                db.executemany("INSERT INTO fenced VALUES (?, 0, 0, 'queued')",
                               [(job,) for job in names])
            _made_once[tuple(names)] = tuple(  # type: ignore[assignment]
                open(path, "rb").read() for path in (leases, jobs))
    paths = (os.path.join(folder, "leases.sqlite3"), os.path.join(folder, "jobs.sqlite3"))
    for path, content in zip(paths, _made_once[tuple(names)]):
        with open(path, "wb") as file:
            file.write(content)
    return paths


class _World:
    """The files, the clock, the queue and the workers of one interleaving, and its record."""

    def __init__(self, bound: Bound, folder: str, notes: bool) -> None:
        self.bound, self.notes, self.function = bound, notes, load(bound.spec)
        self.names = [f"job-{j + 1}" for j in range(bound.jobs)]
        self.leases, self.jobs = _made(folder, self.names)
        # The explorer's own connections, used in a worker's turn too (its work's record).
        self.grants = _CONNECT(self.leases, isolation_level=None, timeout=0,
                               check_same_thread=False)
        self.db = _CONNECT(self.jobs, isolation_level=None, timeout=0, check_same_thread=False)
        self.tick, self.told = 0, queue.SimpleQueue[Any]()
        self.pending = [[job for j, job in enumerate(self.names) if j % bound.workers == w]
                        for w in range(bound.workers)]
        self.offered = [{j % bound.workers} for j in range(bound.jobs)]
        self.quiet: list[str] = []
        self.at: list[Any] = [None] * bound.workers  # what each waits before: "waiting" too
        self.last: int | None = None
        self.preempted = self.jumped = self.crashed = self.erred = 0
        self.moved = False
        self.runs: list[tuple[str, str, int, int]] = []  # job, runner, history, grants seen
        self.exceptions: list[tuple[str, BaseException]] = []
        self.lines: list[str] = []
        self.born = [1] * bound.workers
        self.actors = [self._start(w, _LETTERS[w]) for w in range(bound.workers)]

    def _start(self, slot: int, name: str) -> _Actor:
        actor = _Actor(self, slot, name)
        actor.thread.start()
        self._heard(actor)
        return actor

    def close(self) -> None:
        for actor in self.actors:
            if actor.thread.is_alive():
                actor.dead = True
                actor.go.put(None)
                actor.thread.join(self.bound.timeout)
        self.db.close()
        self.grants.close()

    # the choices: ("run", w), ("fail", w), ("die", w), ("jump",), ("offer", j, w)

    def enabled(self, bounded: bool = True) -> list[tuple[Any, ...]]:
        """The choices open: ("run", w, jumped), ("fail", w), ("die", w), ("offer", j, w,
        jumped); `jumped`: the clock moves on by the ttl first."""
        paused = [w for w, at in enumerate(self.at) if at not in ("waiting", None)]
        calm = not self.quiet  # in the quiet offer nothing else happens
        jump = calm and self.jumped < self.bound.jumps
        for w in paused:  # it runs on alone: see _alone
            if self.actors[w].locked or self.at[w][0] in ("clock", "work"):
                return [("run", w, False), *[("run", w, True)] * (
                    jump and self.at[w][0] == "clock"), *[("die", w)] * (
                    calm and self.crashed < self.bound.crashes and self.at[w][0] == "work")]
        keep = self.last if self.last in paused else None
        choices: list[tuple[Any, ...]] = []
        for w in sorted(paused, key=lambda w: w != keep):
            if bounded and keep is not None and w != keep and self.bound.preemptions is not \
                    None and self.preempted >= self.bound.preemptions:
                continue
            choices.append(("run", w, False))
            choices += [("run", w, True)] * (jump and self.at[w][0] == "clock")
            choices += [("fail", w)] * (calm and self.erred < self.bound.errors and
                                        self._effect(w) == "sql")
        choices += [("die", w) for w in paused
                    if calm and self.crashed < self.bound.crashes and self._effect(w)]
        waiting = [w for w, at in enumerate(self.at) if at == "waiting"]
        for j, job in enumerate(self.names):
            if calm and any(w not in self.offered[j] for w in waiting):
                free = self._free(job, self.tick)
                if free or (jump and self._free(job, self.tick + self.bound.ttl)):
                    choices += [("offer", j, w, not free) for w in waiting
                                if w not in self.offered[j]]
        return choices

    def _effect(self, w: int) -> str | None:
        """What worker w is about to do that others may see: "sql", a statement taking the
        write lock (it may fail "database is locked"), or "work"; None: a read, a clock read,
        a statement inside its write transaction.  A crash anywhere else is the same as one
        before its next such step: SQLite rolls back what is not committed."""
        kind, what = self.at[w][0], self.at[w][-1]
        if kind == "sql" and _LOCKS.match(what) and not self.actors[w].locked:
            return "sql"
        return "work" if kind == "work" else None

    def _free(self, job: str, tick: int) -> bool:
        """Not done in the jobs file, and no lease on it live at `tick`."""
        done = self.db.execute("SELECT value = 'done' FROM fenced WHERE resource = ?",
                               (job,)).fetchone()[0]
        live = self.grants.execute("SELECT 1 FROM leases WHERE resource = ? AND holder IS NOT "
                                   "NULL AND expires_at > ?", (job, tick)).fetchone()
        return not done and live is None

    def token(self, choice: tuple[Any, ...]) -> str:
        """A choice as a witness prints it: A runs A's next step, A? fails its statement, A!
        kills A, job-1>B offers job-1 to B; a leading + moves the clock on by the ttl first."""
        kind, *rest = choice
        jumped = "+" * (kind in ("run", "offer") and rest[-1])
        if kind == "offer":
            return f"{jumped}{self.names[rest[0]]}>{_LETTERS[rest[1]]}"
        return jumped + _LETTERS[rest[0]] + {"run": "", "fail": "?", "die": "!"}[kind]

    def take(self, choice: tuple[Any, ...]) -> None:
        kind, *rest = choice
        if kind in ("run", "offer") and rest[-1]:
            self.jumped += 1
            self._moved_to(self.tick + self.bound.ttl)
        if kind == "offer":
            j, w, _ = rest
            self.offered[j].add(w)
            self.say(f"{self.names[j]} is offered to {self.actors[w].name}")
            self.actors[w].go.put(self.names[j])
            self._heard(self.actors[w])
            return
        w = rest[0]
        actor, at = self.actors[w], self.at[w]
        said = _short(at[1]) if at[0] == "sql" else "reads the clock" if at[0] == "clock" else \
            f"works on {at[1]} (run {1 + sum(r[0] == at[1] for r in self.runs)})"
        if kind == "die":
            self.crashed += 1
            self.say(f"{actor.name} dies before {said}")
            actor.go.put("die")
            self._heard(actor)
            return
        if self.last is not None and self.last != w and self.at[self.last] not in (
                "waiting", None):
            self.preempted += 1
        self.last = w
        if kind == "fail":
            self.erred += 1
            self.say(f"{actor.name} {said}: fails, {LOCKED}")
        else:
            self.say(f"{actor.name} {said}" + f": {self.tick}" * (at[0] == "clock"))
        seen = self._seen() if self.notes else None
        actor.go.put("fail" if kind == "fail" else "go")
        self._heard(actor)
        if seen is not None:
            self._noted(seen)

    def quiet_offer(self) -> bool:
        """Every worker waits: offer the first job not done once more, quiet (the clock at
        its lease's expiry); False if none is left."""
        for j, job in enumerate(self.names):
            done = self.db.execute("SELECT value = 'done' FROM fenced WHERE resource = ?",
                                   (job,)).fetchone()[0]
            if done or job in self.quiet:
                continue
            self.quiet.append(job)
            expiry = self.grants.execute("SELECT MAX(expires_at) FROM leases WHERE resource = ?"
                                         " AND holder IS NOT NULL", (job,)).fetchone()[0]
            if expiry is not None and expiry > self.tick:
                self._moved_to(expiry)
            w = next(w for w in range(self.bound.workers) if self.at[w] == "waiting")
            self.say(f"every worker waits: {job} is offered to {self.actors[w].name}, quiet")
            self.actors[w].go.put(job)
            self._heard(self.actors[w])
            return True
        return False

    def end(self) -> None:
        """Every queue ends: each worker returns, in turn, its closing not interleaved."""
        for actor in self.actors:
            if self.at[actor.slot] == "waiting":
                actor.gated = False
                actor.go.put(None)
                self._heard(actor)

    def say(self, line: str) -> None:
        self.lines.append(f"  tick {self.tick:>2}  {line}")

    def ran(self, actor: _Actor, job: str) -> None:  # in the worker's thread, its turn
        history = self.db.execute("SELECT COALESCE(MAX(rowid), 0) FROM history").fetchone()[0]
        grants = self.grants.execute("SELECT COALESCE(MAX(rowid), 0) FROM grants").fetchone()[0]
        self.runs.append((job, actor.name, history, grants))

    def _moved_to(self, tick: int) -> None:
        self.tick, self.moved = tick, True
        self.say(f"the clock moves on to tick {tick}")

    def _heard(self, actor: _Actor) -> None:
        try:
            who, kind, what = self.told.get(timeout=self.bound.timeout)
        except queue.Empty:
            raise Hung(f"worker {actor.name} gave no answer within {self.bound.timeout:g} s",
                       lines=self.lines) from None
        assert who is actor
        if kind == "paused":
            self.at[actor.slot] = what
        elif kind == "waiting":
            self.at[actor.slot] = "waiting"
        else:
            self.at[actor.slot] = None
            if what is not None:
                self.exceptions.append((actor.name, what))
                self.say(f"{actor.name} raised {type(what).__name__}: {what}")
            if actor.dead or what is not None:  # a new worker takes its queue
                if self.last == actor.slot:
                    self.last = None
                self.born[actor.slot] += 1
                name = f"{_LETTERS[actor.slot]}{self.born[actor.slot]}"
                self.say(f"{name} takes {actor.name}'s queue")
                self.actors[actor.slot] = self._start(actor.slot, name)

    def _seen(self) -> tuple[int, int]:
        return (self.db.execute("SELECT COALESCE(MAX(rowid), 0) FROM history").fetchone()[0],
                self.grants.execute("SELECT COALESCE(MAX(rowid), 0) FROM grants").fetchone()[0])

    def _noted(self, seen: tuple[int, int]) -> None:
        """In a replay, what a statement committed: each stored change and each grant."""
        for row in self.db.execute("SELECT * FROM history WHERE rowid > ?", (seen[0],)):
            self.lines.append(f"              stored {row[0]} ({row[1]}, {row[2]}, {row[3]!r}) "
                              f"-> ({row[4]}, {row[5]}, {row[6]!r})")
        for row in self.grants.execute("SELECT * FROM grants WHERE rowid > ?", (seen[1],)):
            self.lines.append(f"              granted {row[0]} to {row[1]}, epoch {row[2]}")

    def verdicts(self) -> list[tuple[str, str]]:
        """Each verdict failed, from what the files logged (see explorer/README.md)."""
        failed = []
        for job, (lost, reverted, value) in sorted(judge(self.jobs).items()):
            failed += [("lost update", job)] * bool(lost)
            failed += [("done reverted", job)] * bool(reverted)
            failed += [("unfinished", job)] * (value != "done" and job in self.quiet)
        failed += [("exception", name) for name, _ in self.exceptions]
        for job, name, history, grants in self.runs:
            epoch = self.grants.execute(
                "SELECT epoch FROM grants WHERE resource = ? AND holder = ? AND rowid <= ? "
                "ORDER BY rowid DESC", (job, name, grants)).fetchone()
            applied = epoch and self.db.execute(
                "SELECT 1 FROM history WHERE resource = ? AND epoch = ? AND sequence = 1 AND "
                "value = 'running' AND rowid <= ?", (job, epoch[0], history)).fetchone()
            if not applied and ("unfenced work", job) not in failed:
                failed.append(("unfenced work", job))
        if not (self.crashed or self.erred or self.moved):
            failed += [("needless repeat", job) for job in self.names
                       if sum(r[0] == job for r in self.runs) > 1]
        return failed


def _short(sql: str) -> str:
    words = sql.split()
    return " ".join(words[:7]) + " ..." * (len(words) > 7)


def play(bound: Bound, given: tuple[int, ...] = (), *, tokens: tuple[str, ...] | None = None,
         stop: int | None = None, bounded: bool = True) -> Played:
    """Play one interleaving from a fresh start: the choices `given` (indices), or a witness's
    `tokens` (then each statement's stored changes noted), then the first open at each point;
    with `stop`, only that many choices, the choices open there returned."""
    with tempfile.TemporaryDirectory(prefix="workers-", dir=_base) as folder:
        world = _World(bound, folder, notes=tokens is not None)
        try:
            return _played(world, given, tokens, stop, bounded)
        finally:
            world.close()


def _played(world: _World, given: tuple[int, ...], tokens: tuple[str, ...] | None,
            stop: int | None, bounded: bool) -> Played:
    taken: list[int] = []
    options: list[int] = []
    said: list[str] = []
    while True:
        choices = world.enabled(bounded)
        if not choices:
            if world.quiet_offer():
                continue
            break
        named = [world.token(choice) for choice in choices]
        if stop is not None and len(taken) == stop:
            return Played(tuple(taken), tuple(said), (), tuple(world.lines), (), (), False,
                          False, tuple(named))
        if len(taken) >= world.bound.steps:
            raise Hung(f"the workers made more than {world.bound.steps} choices",
                       lines=world.lines, witness=" ".join(said))
        if tokens is not None and len(taken) < len(tokens):
            if tokens[len(taken)] not in named:
                raise ValueError(f"the witness's choice {len(taken) + 1}, "
                                 f"{tokens[len(taken)]!r}, is not open here (open: "
                                 f"{' '.join(named)})")
            index = named.index(tokens[len(taken)])
        else:
            index = given[len(taken)] if len(taken) < len(given) else 0
        taken.append(index)
        options.append(len(choices))
        said.append(named[index])
        world.take(choices[index])
    world.end()
    runs = tuple(sum(r[0] == job for r in world.runs) for job in world.names)
    return Played(tuple(taken), tuple(said), tuple(options), tuple(world.lines),
                  tuple(world.verdicts()), runs, bool(world.crashed), bool(world.erred))


# --- the search, and an independent brute force to check its counts ---


_base: str | None = None  # where each interleaving's folder is made


@contextlib.contextmanager
def _installed(memory: bool = False) -> Iterator[None]:
    """sqlite3.connect stopping workers' statements; with `memory`, the files in a folder
    in memory (/dev/shm) where there is one: a commit's fsync costs nothing there."""
    global _base
    with contextlib.ExitStack() as cleanup:
        if memory and os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
            _base = cleanup.enter_context(tempfile.TemporaryDirectory(
                prefix="workers-", dir="/dev/shm"))
        sqlite3.connect = _connect  # type: ignore[assignment]
        try:
            yield
        finally:
            sqlite3.connect, _base = _CONNECT, None


def _every(bound: Bound) -> Iterator[Played]:
    """Every interleaving of the bound, depth first: after each, every other choice open at
    each point of it."""
    pending: list[tuple[int, ...]] = [()]
    while pending:
        given = pending.pop()
        run = play(bound, given)
        yield run
        for depth in range(len(run.options) - 1, len(given) - 1, -1):
            pending += [(*run.choices[:depth], other)
                        for other in range(run.options[depth] - 1, 0, -1)]


def _kind(run: Played) -> str:
    return "crash" if run.died else "store error" if run.erred else "plain"


def _after(prefix: tuple[str, ...], letter: str) -> bool:
    """Whether worker `letter` ran after its last death in `prefix` (or never died)."""
    ran = [i for i, t in enumerate(prefix) if ">" not in t and "!" not in t and
           t.lstrip("+")[0] == letter]
    died = [i for i, t in enumerate(prefix) if t == letter + "!"]
    return not died or ran[-1] > died[-1]


def brute_force(bound: Bound) -> Counter[str]:
    """The interleavings of `bound` counted by a plain recursion over the tree of every
    choice, each prefix played afresh, its preemptions counted here from the tokens."""
    counts: Counter[str] = Counter()

    def walk(prefix: tuple[str, ...], preempted: int) -> None:
        at = play(bound, tokens=prefix, stop=len(prefix), bounded=False)
        if not at.open:
            counts[_kind(at)] += 1
            return
        for token in at.open:
            runs = [t.lstrip("+")[0] for t in prefix if ">" not in t and "!" not in t]
            dead = [t[0] for t in prefix if t.endswith("!")]
            last = runs[-1] if runs and (not dead or _after(prefix, runs[-1])) else None
            mover = token.lstrip("+")[0] if ">" not in token and "!" not in token else None
            switch = mover is not None and last is not None and mover != last and (
                last in at.open or "+" + last in at.open)
            if bound.preemptions is None or preempted + switch <= bound.preemptions:
                walk((*prefix, token), preempted + switch)

    with _installed(memory=True):
        walk((), 0)
    return counts


def explore_workers(bound: Bound) -> dict[str, Any]:
    """Every interleaving of `bound`, up to the first failing; its table, and the failing
    one played again whole in a new process (it must fail again, else explore.Different)."""
    load(bound.spec)  # a usage error now, not in a worker
    counts: Counter[str] = Counter()
    runs: list[Counter[int]] = [Counter() for _ in range(bound.jobs)]
    failing = None
    with _installed(memory=True):
        for run in _every(bound):
            counts[_kind(run)] += 1
            for j, n in enumerate(run.runs):
                runs[j][n] += 1
            if run.failed:
                failing = run
                break
    shown: list[str] = []
    if failing is not None:
        with contextlib.ExitStack() as cleanup:
            again = Fresh(replayed, (bound, failing.tokens), cleanup).result()
        if again.failed != failing.failed:
            raise explore.Different(
                f"the interleaving {' '.join(failing.tokens)} failed {failing.failed} in the "
                f"search but {again.failed or 'passed'} played whole in a new process: an "
                "answer rests on more than the files and the calls")
        shown = [*again.lines, "  again: " + bound.command(" ".join(again.tokens))]
    return {"bound": bound, "counts": dict(counts), "runs": [dict(sorted(c.items()))
            for c in runs], "failed": failing.failed if failing else (), "witness": shown}


def replayed(bound: Bound, tokens: tuple[str, ...]) -> Played:
    """One interleaving played by its witness (in a new process: the worker imported
    afresh), each statement's stored changes noted."""
    with _installed():
        return play(bound, tokens=tokens)


def replay(bound: Bound, witness: str) -> tuple[str, bool]:
    """A printed witness played again alone, in a new process: its timeline and verdicts."""
    load(bound.spec)
    with contextlib.ExitStack() as cleanup:
        again = Fresh(replayed, (bound, tuple(witness.split())), cleanup).result()
    return "\n".join([
        f"the interleaving {witness} of {bound.spec} ({bound.said()}), played again whole in "
        "a new process", *again.lines,
        *(f"  {verdict}: FAILED, {what}" for verdict, what in again.failed),
        *["  every verdict held"] * (not again.failed)]), not again.failed


def report(table: dict[str, Any], seconds: float) -> str:
    bound: Bound = table["bound"]
    counts = table["counts"]
    lines = [f"every interleaving of {bound.spec}: {bound.said()}",
             f"  {counts.get('plain', 0):,} interleavings, {counts.get('crash', 0):,} crash "
             f"schedules, {counts.get('store error', 0):,} with a store error"
             f"{', up to the first failing' * bool(table['failed'])}; {seconds:.1f} s"]
    for j, runs in enumerate(table["runs"]):
        lines.append(f"  job-{j + 1}, its work run: " + ", ".join(
            f"{n} times in {count:,}" for n, count in runs.items()))
    lines += [f"  {verdict}: " + ("FAILED, " + ", ".join(
        what for v, what in table["failed"] if v == verdict) if any(
        v == verdict for v, _ in table["failed"]) else "held") for verdict in VERDICTS]
    if table["witness"]:
        lines += ["the first interleaving failing, failing again played whole in a new "
                  "process:", *table["witness"]]
    return "\n".join(lines)


def bound_from(args: Any) -> Bound:
    """The bound the command line asks for (explore.py's --worker and its options)."""
    given = {name: getattr(args, name, None) for name in (
        "workers", "jobs", "preemptions", "jumps", "crashes", "errors", "ttl", "timeout")}
    module = load(args.worker)
    ttl = getattr(sys.modules[module.__module__], "TTL", None)
    bound = Bound(args.worker, **({"ttl": ttl} if isinstance(ttl, int) else {}))
    return replace(bound, **{k: v for k, v in given.items() if v is not None})
