"""--worker MODULE:NAME: the reader's worker, NAME(queue, me, clock, do, leases, jobs) as in
recipes/worker.py, played as each of W workers over J jobs, interleaved at every SQL statement,
clock read and call of the work, with a crash or a store error among them.

The explorer owns the clock (moved on by the ttl at most `jumps` times), the work (it records
each run), the queue (a job offered again when not done and no lease on it is live; once every
worker waits, once more, quiet), the leases file and the jobs file (every stored change and
grant logged by trigger: the verdicts rest on what was stored, never on what a worker says).
Each worker is an actor of engine.py.  The search is preemption bounding (CHESS), with the
reductions explorer/README.md gives ("Your own worker"), where each verdict is explained.
"""

import contextlib
import os
import re
import shlex
import sqlite3
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import core
import engine
from core import Hung, Unsupported
from engine import gate, interleave
from receivers import fits

RECIPES = os.path.join(os.path.dirname(core.HERE), "recipes")


def _forget_recipes() -> None:
    """The recipes' modules are the explorer's here (the jobs file's table, its log, the
    judge), imported from recipes/ first; a reader's fence.py or worker.py beside their worker,
    imported after, is the one their worker gets."""
    for name in ("fence", "pool", "worker"):
        sys.modules.pop(name, None)


sys.path.insert(0, RECIPES)
_forget_recipes()
import fence
from pool import HISTORY, judge

from leases import LeaseAuthority

_forget_recipes()

__all__ = ["VERDICTS", "Bound", "Played", "explore_workers", "installed", "load", "play",
           "replay", "report", "searched"]

VERDICTS = ("lost update", "done reverted", "unfinished", "exception", "unfenced work",
            "needless repeat")
GRANTS = """CREATE TABLE grants (resource TEXT, holder TEXT, epoch INTEGER);
CREATE TRIGGER granted AFTER INSERT ON leases BEGIN
  INSERT INTO grants VALUES (new.resource, new.holder, new.epoch); END;
CREATE TRIGGER regranted AFTER UPDATE ON leases WHEN new.epoch <> old.epoch BEGIN
  INSERT INTO grants VALUES (new.resource, new.holder, new.epoch); END;"""
# Beside pool.HISTORY's log of each UPDATE: a row stored by INSERT (after INSERT OR REPLACE, or
# a DELETE), logged over the row logged last, else the job's first.
INSERTS = """CREATE TRIGGER inserted AFTER INSERT ON fenced BEGIN INSERT INTO history
  SELECT new.resource, COALESCE(h.epoch, 0), COALESCE(h.sequence, 0), COALESCE(h.value,
  'queued'), new.epoch, new.sequence, new.value FROM (SELECT 1) LEFT JOIN (SELECT * FROM
  history WHERE resource = new.resource ORDER BY rowid DESC LIMIT 1) h; END;"""
_LETTERS = "ABCDEFGH"
CLOCK, NEXT, WORK = "the clock", "the next job", "the work on "  # the gates besides statements
_CONNECT = sqlite3.connect  # the explorer's own, never stopped
# A statement that takes SQLite's write lock: where a store error ("database is locked") is made.
_LOCKS = re.compile(r"\s*(BEGIN\s+(IMMEDIATE|EXCLUSIVE)|INSERT|UPDATE|DELETE|REPLACE)",
                    re.IGNORECASE)


@dataclass(frozen=True)
class Bound:
    """The reader's worker `spec` as W workers over J jobs, and how far the search goes."""

    spec: str
    workers: int = 2
    jobs: int = 1
    preemptions: int | None = 2  # None: every interleaving
    jumps: int = 1
    crashes: int = 1  # 0 or 1: a crash or a store error, at most one, the rest one way
    errors: int = 0
    ttl: int = 10
    timeout: float = 10.0
    steps: int = 400  # choices in one interleaving; more is a hang

    def said(self) -> str:
        k = "any number of" if self.preemptions is None else f"at most {self.preemptions}"
        return (f"{_many(self.workers, 'worker')}, {_many(self.jobs, 'job')}, ttl {self.ttl}; "
                f"{k} preemption{'s' * (self.preemptions != 1)}, "
                f"{_many(self.jumps, 'clock jump')}, {_many(self.crashes, 'crash', 'es')}, "
                f"{_many(self.errors, 'store error')}")

    def command(self, witness: str) -> str:
        words = ["python3", core.script(), "--worker", self.spec]
        for name in ("workers", "jobs", "preemptions", "jumps", "crashes", "errors", "ttl",
                     "timeout"):
            if getattr(self, name) != getattr(Bound, name) and getattr(self, name) is not None:
                words += [f"--{name}", f"{getattr(self, name):g}"]
        return shlex.join([*words, "--replay", witness])


def _many(n: int, thing: str, plural: str = "s") -> str:
    return f"{n} {thing}{plural * (n != 1)}"


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
    died: bool  # a crash or a store error
    crashed: bool
    erred: bool
    open: tuple[str, ...] | None = None  # stopped early: the choices open there


def load(spec: str) -> Callable[..., None]:
    """The worker named by MODULE:NAME, from the current folder, explorer/ or recipes/."""
    module, colon, name = spec.partition(":")
    if not (module and colon and name):
        raise ValueError(f"--worker wants MODULE:NAME, got {spec!r}")
    for folder in (RECIPES, core.HERE, os.getcwd()):  # the current folder first
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)
        sys.path.insert(0, folder)
    try:
        found = getattr(__import__(module), name, None)
    except Exception as exc:  # noqa: BLE001 - a module that raises, or will not compile
        raise Unsupported(f"--worker {spec!r}: importing {module!r} raised "
                          f"{type(exc).__name__}: {exc}") from None
    if not callable(found):
        raise Unsupported(f"--worker {spec!r}: {module!r} has no function {name!r}")
    fits(f"--worker {spec!r}: {name}(queue, me, clock, do, leases, jobs)", found, *"qmcdlj")
    return found  # type: ignore[no-any-return]


# --- one interleaving: the files, the clock, the queue and the workers ---


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
                db.executescript(INSERTS)
            with open(leases, "rb") as made_leases, open(jobs, "rb") as made_jobs:
                _made_once[tuple(names)] = (made_leases.read(), made_jobs.read())
    paths = (os.path.join(folder, "leases.sqlite3"), os.path.join(folder, "jobs.sqlite3"))
    for path, content in zip(paths, _made_once[tuple(names)]):
        with open(path, "wb") as file:
            file.write(content)
    return paths


class _World(engine.Scheduler):
    """One interleaving: the files, the clock, the queue, and a worker on each actor.  A
    choice is ("run", w, jumped), ("fail", w), ("die", w) or ("offer", j, w, jumped);
    `jumped`: the clock moves on by the ttl first."""

    def __init__(self, bound: Bound, folder: str, faults: bool, notes: bool,
                 cleanup: contextlib.ExitStack) -> None:
        self.names = [f"job-{j + 1}" for j in range(bound.jobs)]
        self.leases, self.jobs = _made(folder, self.names)
        # The explorer's own connections, used in a worker's turn too (its work's record):
        # closed once the actors, made next, are stopped.
        self.grants = _CONNECT(self.leases, isolation_level=None, timeout=0,
                               check_same_thread=False)
        self.db = _CONNECT(self.jobs, isolation_level=None, timeout=0, check_same_thread=False)
        cleanup.callback(self.grants.close)
        cleanup.callback(self.db.close)
        super().__init__(list(_LETTERS[:bound.workers]), bound.timeout, faults, cleanup)
        for actor in self.actors:  # a writer runs alone to its COMMIT: see README
            actor.alone = True
        self.bound, self.notes, self.function = bound, notes, load(bound.spec)
        self.faults, self.bounded = faults, True
        self.stop: int | None = None  # the brute force's: the choices open after so many
        self.open: tuple[str, ...] | None = None
        self.tick = 0
        self.pending = [[job for j, job in enumerate(self.names) if j % bound.workers == w]
                        for w in range(bound.workers)]
        self.offered = [{j % bound.workers} for j in range(bound.jobs)]
        for w, queued in enumerate(self.pending):
            self.said += [f"  tick  0  {job} is queued for {_LETTERS[w]}" for job in queued]
        self.quiet: list[str] = []
        self.last: int | None = None
        self.preempted = self.jumped = 0
        self.crashed = self.erred = self.moved = False
        self.runs: list[tuple[str, str, int, int]] = []  # job, runner, history, grants seen
        self.exceptions: list[tuple[str, BaseException]] = []
        self.born = [1] * bound.workers
        for w in range(bound.workers):
            self._begin(w, _LETTERS[w])

    def _begin(self, w: int, name: str) -> None:
        """A new worker named `name` on actor w: its opening not interleaved, up to its
        first look at the queue."""
        def clock() -> int:
            gate(CLOCK)
            return self.tick

        def do(job: str, heartbeat: Callable[[], bool]) -> None:
            gate(WORK + job)
            self.runs.append((job, name, *self._seen()))
            heartbeat()

        def jobs() -> Iterator[str]:
            interleave()
            while True:
                job = self.pending[w].pop(0) if self.pending[w] else gate(NEXT)
                if job is None:
                    return
                self.actors[w].doing = f"start on {job}"
                yield job

        def body() -> BaseException | None:
            try:
                self.function(jobs(), name, clock, do, self.leases, self.jobs)
            except Exception as exc:  # noqa: BLE001 - an exception escaping the worker
                return exc
            return None

        self.actors[w].name = name
        self._after(w, *self.start(w, body, "opening", interleaved=False))

    def _after(self, w: int, kind: str, what: Any) -> None:
        """Worker w told `kind`: an exception it raised is a verdict, and the worker is gone
        (another that raised as it began would raise again, for ever); once it died, a new
        worker, with a new name, takes its queue."""
        if kind == "ended" and what is not None:
            self.exceptions.append((self.actors[w].name, what))
            self.say(f"{self.actors[w].name} raised {type(what).__name__}: {what}")
        if kind == "died":
            self.last = None if self.last == w else self.last
            self.born[w] += 1
            name = f"{_LETTERS[w]}{self.born[w]}"
            self.say(f"{name} takes worker {_LETTERS[w]}'s queue")
            self._begin(w, name)

    def enabled(self) -> list[tuple[Any, ...]]:
        if len(self.tokens) > self.bound.steps:
            raise Hung(f"the workers made more than {self.bound.steps} choices",
                       lines=self.said, witness=" ".join(self.tokens))
        choices = self._enabled()
        while not choices and self.quiet_offer():
            choices = self._enabled()
        if choices and self.stop is not None and len(self.tokens) == self.stop:
            self.open = tuple(self.token(choice) for choice in choices)
            return []
        return choices

    def _enabled(self) -> list[tuple[Any, ...]]:
        paused = [w for w, at in enumerate(self.waiting) if at not in (None, NEXT)]
        calm = not self.quiet  # in the quiet offer nothing else happens
        jump = calm and self.jumped < self.bound.jumps
        fault = calm and self.faults and not self.died
        for w in paused:  # it runs on alone: see README, "the reduction"
            at = self.waiting[w] or ""
            if self.actors[w].writing or at == CLOCK or at.startswith(WORK):
                return [("run", w, False), *[("run", w, True)] * (jump and at == CLOCK),
                        *[("die", w)] * (fault and self.bound.crashes > 0 and
                                         at.startswith(WORK))]
        keep = self.last if self.last in paused else None
        choices: list[tuple[Any, ...]] = []
        for w in sorted(paused, key=lambda w: w != keep):
            if self.bounded and keep is not None and w != keep and \
                    self.bound.preemptions is not None and \
                    self.preempted >= self.bound.preemptions:
                continue
            choices.append(("run", w, False))
            choices += [("fail", w)] * (fault and self.bound.errors > 0 and self._locks(w))
        # A worker paused since before the last run is killed as well where it paused.
        choices += [("die", w) for w in paused if fault and self.bound.crashes > 0 and
                    self._locks(w) and keep in (None, w)]
        idle = [w for w, at in enumerate(self.waiting) if at == NEXT]
        for j, job in enumerate(self.names):
            if calm and any(w not in self.offered[j] for w in idle):
                free = self._free(job, self.tick)
                if free or (jump and self._free(job, self.tick + self.bound.ttl)):
                    choices += [("offer", j, w, not free) for w in idle
                                if w not in self.offered[j]]
        return choices

    def _locks(self, w: int) -> bool:
        """Whether worker w is before a statement that takes the write lock, holding none:
        where a store error or a crash is placed.  A crash anywhere else is the same as one
        there: SQLite rolls back what is not committed, and a read changes nothing."""
        return bool(_LOCKS.match(self.waiting[w] or "")) and not self.actors[w].writing

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
        w = rest[-2] if kind == "offer" else rest[0]
        if kind in ("run", "offer") and rest[-1]:
            self.jumped += 1
            self._moved_to(self.tick + self.bound.ttl)
        if kind == "offer":
            self.offered[rest[0]].add(w)
            self.say(f"{self.names[rest[0]]} is offered to {self.actors[w].name}")
            self._after(w, *self.go(w, self.names[rest[0]]))
            return
        name, at = self.actors[w].name, self.waiting[w] or ""
        job, run = at[len(WORK):], 1 + sum(r[0] == at[len(WORK):] for r in self.runs)
        # What the step is, as a hang names it ("A's clock read gave no answer"), and as the
        # timeline shows it.
        step, said = ("clock read", "reads the clock") if at == CLOCK else (
            f"work on {job} (run {run})", f"works on {job} (run {run})") if at.startswith(
            WORK) else (f"statement {_short(at)!r}", _short(at))
        self.actors[w].doing = step
        if kind == "die":
            self.crashed = True
            self.say(f"{name} dies before its {step}")
            self._after(w, *self.kill(w))
            return
        if self.last is not None and self.last != w and self.waiting[self.last] not in (
                None, NEXT):
            self.preempted += 1
        self.last = w
        seen = self._seen() if self.notes else None
        if kind == "fail":
            self.erred = self.died = True
            self.say(f"{name} {said}: fails, {engine.LOCKED} (made by the explorer)")
            self._after(w, *self.fail(w))
        else:
            self.say(f"{name} {said}" + f": {self.tick}" * (at == CLOCK))
            told = self.go(w)
            self.said += [f"  tick {self.tick:>2}  {name} {_short(sql)}"
                          for sql in self.actors[w].passed]
            self.actors[w].passed.clear()
            self._after(w, *told)
        if seen is not None:
            self._noted(seen)

    def quiet_offer(self) -> bool:
        """Every worker waits: offer the first job not done once more, quiet (the clock at
        its lease's expiry); False if none is left."""
        for j, job in enumerate(self.names):
            done = self.db.execute("SELECT value = 'done' FROM fenced WHERE resource = ?",
                                   (job,)).fetchone()[0]
            w = next((w for w in sorted(range(self.bound.workers), key=lambda w: w != j %
                                        self.bound.workers) if self.waiting[w] == NEXT), None)
            if done or job in self.quiet or w is None:  # None: every worker raised, gone
                continue
            self.quiet.append(job)
            expiry = self.grants.execute("SELECT MAX(expires_at) FROM leases WHERE resource = ?"
                                         " AND holder IS NOT NULL", (job,)).fetchone()[0]
            if expiry is not None and expiry > self.tick:
                self._moved_to(expiry)
            self.say(f"every worker waits: {job} is offered to {self.actors[w].name}, quiet")
            self._after(w, *self.go(w, job))
            return True
        return False

    def end(self) -> None:
        """Every queue ends: each worker returns, in turn."""
        for w in range(self.bound.workers):
            if self.waiting[w] == NEXT:
                self.actors[w].doing = "return from an ended queue"
                self._after(w, *self.go(w, None))

    def say(self, line: str) -> None:
        self.said.append(f"  tick {self.tick:>2}  {line}")

    def _moved_to(self, tick: int) -> None:
        self.tick, self.moved = tick, True
        self.say(f"the clock moves on to tick {tick}")

    def _seen(self) -> tuple[int, int]:
        return (self.db.execute("SELECT COALESCE(MAX(rowid), 0) FROM history").fetchone()[0],
                self.grants.execute("SELECT COALESCE(MAX(rowid), 0) FROM grants").fetchone()[0])

    def _noted(self, seen: tuple[int, int]) -> None:
        """In a replay, what a statement committed: each stored change and each grant."""
        for row in self.db.execute("SELECT * FROM history WHERE rowid > ?", (seen[0],)):
            self.said.append(f"              stored {row[0]} ({row[1]}, {row[2]}, {row[3]!r}) "
                             f"-> ({row[4]}, {row[5]}, {row[6]!r})")
        for row in self.grants.execute("SELECT * FROM grants WHERE rowid > ?", (seen[1],)):
            self.said.append(f"              granted {row[0]} to {row[1]}, epoch {row[2]}")

    def verdicts(self) -> list[tuple[str, str]]:
        """Each verdict failed, from what the files logged (see explorer/README.md)."""
        failed = []
        for job, (lost, reverted, value) in sorted(judge(self.jobs).items()):
            failed += [("lost update", job)] * bool(lost)
            failed += [("done reverted", job)] * bool(reverted)
            failed += [("unfinished", job)] * (value != "done")  # (after the quiet offer)
        failed += [("exception", name) for name, _ in self.exceptions]
        for job, name, history, grants in self.runs:
            epoch = self.grants.execute(
                "SELECT epoch FROM grants WHERE resource = ? AND holder = ? AND rowid <= ? "
                "ORDER BY rowid DESC", (job, name, grants)).fetchone()
            applied = epoch and self.db.execute(
                "SELECT 1 FROM history WHERE resource = ? AND epoch = ? AND rowid <= ?",
                (job, epoch[0], history)).fetchone()
            if not applied and ("unfenced work", job) not in failed:
                failed.append(("unfenced work", job))
        if not (self.died or self.moved):
            failed += [("needless repeat", job) for job in self.names
                       if sum(r[0] == job for r in self.runs) > 1]
        return failed

def _short(sql: str) -> str:
    words = sql.split()
    return " ".join(words[:7]) + " ..." * (len(words) > 7)


def play(bound: Bound, given: tuple[int, ...] = (), *, faults: bool = True,
         tokens: tuple[str, ...] | None = None, stop: int | None = None,
         bounded: bool = True) -> Played:
    """Play one interleaving from a fresh start: the choices `given` (indices), or a witness's
    `tokens` (then each statement's stored changes noted), then the first open at each point;
    with `stop`, only that many choices (the choices open there in .lines)."""
    with contextlib.ExitStack() as cleanup:
        folder = cleanup.enter_context(tempfile.TemporaryDirectory(
            prefix="workers-", dir=_base, ignore_cleanup_errors=True))  # (see engine.grace)
        world = _World(bound, folder, faults, tokens is not None and stop is None, cleanup)
        world.stop, world.bounded = stop, bounded
        taken, options = world.chosen(given, tokens)
        if "witness" in world.failed:
            raise ValueError(f"the witness {' '.join(tokens or ())!r}: {world.said[-1].strip()}")
        if world.open is not None:
            return Played(taken, tuple(world.tokens), (), (), (), (), world.died,
                          world.crashed, world.erred, world.open)
        world.end()
        runs = tuple(sum(r[0] == job for r in world.runs) for job in world.names)
        return Played(taken, tuple(world.tokens), options, tuple(world.said),
                      tuple(world.verdicts()), runs, world.died, world.crashed, world.erred)


# --- the search, and an independent brute force to check its counts ---


_base: str | None = None  # where each interleaving's folder is made


@contextlib.contextmanager
def installed(memory: bool = False) -> Iterator[None]:
    """Workers' statements stopped; with `memory`, the files in a folder in memory
    (/dev/shm) where there is one: a commit's sync to disk costs nothing there."""
    global _base
    with contextlib.ExitStack() as cleanup:
        if memory and os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
            _base = cleanup.enter_context(tempfile.TemporaryDirectory(
                prefix="workers-", dir="/dev/shm", ignore_cleanup_errors=True))
        cleanup.enter_context(engine.gated())
        try:
            yield
        finally:
            _base = None


def kind(run: Played) -> str:
    return "crash" if run.crashed else "store error" if run.erred else "plain"


def searched(bound: Bound) -> Iterator[Played]:
    """Every interleaving, a fault open among the choices (at most one; after it, the rest
    played one way), in one pass of engine.every: each run is yielded as it comes (the pass
    "with a crash" keeps only runs whose `died` is set, so it is set on each)."""
    faults = bool(bound.crashes or bound.errors)
    return engine.every(lambda given, _: play(bound, given, faults=faults)._replace(died=True),
                        (True,))


def explore_workers(bound: Bound) -> dict[str, Any]:
    """Every interleaving of `bound`, up to the first failing; its table, and the failing
    one played again whole in a new process (it must fail again, else core.Different)."""
    load(bound.spec)  # a usage error now, not in a worker
    counts: Counter[str] = Counter()
    runs: list[Counter[int]] = [Counter() for _ in range(bound.jobs)]
    failing = None
    with installed(memory=True), _named(bound):
        for run in searched(bound):
            counts[kind(run)] += 1
            for j, n in enumerate(run.runs):
                runs[j][n] += 1
            if run.failed:
                failing = run
                break
    shown: list[str] = []
    if failing is not None:
        with contextlib.ExitStack() as cleanup:
            again = core.Fresh(replayed, (bound, failing.tokens), cleanup).result()
        if again.failed != failing.failed:
            raise core.Different(
                f"the interleaving {' '.join(failing.tokens)} failed {failing.failed} in the "
                f"search but {again.failed or 'passed'} played whole in a new process: an "
                "answer rests on more than the files and the calls")
        shown = [*again.lines, "  again: " + bound.command(" ".join(again.tokens))]
    return {"bound": bound, "counts": dict(counts), "runs": [dict(sorted(c.items()))
            for c in runs], "failed": failing.failed if failing else (), "witness": shown}


@contextlib.contextmanager
def _named(bound: Bound) -> Iterator[None]:
    """core.Different, naming the worker."""
    try:
        yield
    except core.Different as exc:
        raise core.Different(f"--worker {bound.spec!r}: {exc}") from None


def replayed(bound: Bound, tokens: tuple[str, ...]) -> Played:
    """One interleaving played by its witness (in a new process: the worker imported
    afresh), each statement's stored changes noted."""
    with installed():
        try:
            return play(bound, tokens=tokens, faults=True, bounded=False)
        except ValueError as exc:  # a witness of another bound, or not a witness
            raise Unsupported(str(exc)) from None


def replay(bound: Bound, witness: str) -> tuple[str, bool]:
    """A printed witness played again alone, in a new process: its timeline and verdicts."""
    load(bound.spec)
    with contextlib.ExitStack() as cleanup:
        again = core.Fresh(replayed, (bound, tuple(witness.split())), cleanup).result()
    return "\n".join([
        (f"the interleaving {shlex.quote(witness)} of {bound.spec} ({bound.said()}), played again whole in "
        "a new process"), *again.lines,
        *(f"  {verdict}: FAILED, {what}" for verdict, what in again.failed),
        *["  every verdict held"] * (not again.failed)]), not again.failed


_TIMES = {0: "never", 1: "once", 2: "twice"}


def report(table: dict[str, Any], seconds: float) -> str:
    bound: Bound = table["bound"]
    counts = table["counts"]
    lines = [f"every interleaving of {bound.spec}: {bound.said()}",
             (f"  {counts.get('plain', 0):,} interleavings, {counts.get('crash', 0):,} crash "
             f"schedules, {counts.get('store error', 0):,} with a store error"
             f"{', up to the first failing' * bool(table['failed'])}; {seconds:.1f} s")]
    for j, runs in enumerate(table["runs"]):
        lines.append(f"  job-{j + 1}, its work run: " + ", ".join(
            f"{_TIMES.get(n, f'{n} times')} in {count:,}" for n, count in runs.items()))
    lines += [f"  {verdict}: " + ("FAILED, " + ", ".join(
        what for v, what in table["failed"] if v == verdict) if any(
        v == verdict for v, _ in table["failed"]) else "held") for verdict in VERDICTS]
    if table["witness"]:
        lines += [("the first interleaving failing, failing again played whole in a new "
                  "process:"), *table["witness"]]
    return "\n".join(lines)


def bound_from(args: Any) -> Bound:
    """The bound the command line asks for (explore.py's --worker and its options)."""
    given = {name: getattr(args, name, None) for name in (
        "workers", "jobs", "preemptions", "jumps", "crashes", "errors", "ttl", "timeout")}
    load(args.worker)
    ttl = getattr(sys.modules[args.worker.partition(":")[0]], "TTL", Bound.ttl)
    if given["ttl"] is None and (type(ttl) is not int or not 1 <= ttl <= 99):
        raise Unsupported(f"--worker {args.worker!r}: its module's TTL is {ttl!r}, not a whole "
                          "number of ticks from 1 to 99: give --ttl")
    return replace(Bound(args.worker, ttl=ttl), **{k: v for k, v in given.items()
                                                   if v is not None})
