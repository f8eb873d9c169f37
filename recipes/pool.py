"""Run a pool of worker.py's workers, with faults on demand, and judge what it did to the jobs.

    python3 recipes/pool.py [--workers 5] [--jobs 30] [--faults] [--seed N] [--blind]

The coordinator (this process) spawns the workers and owns the clock, a multiprocessing.Value
they read.  A worker tells the coordinator of each step (a look, a call to the authority, a
write, a step of the work) on a pipe and waits for its answer: go on, or a fault.  The clock
moves one tick a round, once every busy worker has sent a message since the last, so a worker
the machine keeps waiting sees no time pass without it; when every worker waits, it moves to
the next expiry.  Every tenth job's work lasts twice the ttl.  A job is offered again only when
it is not done, no live lease holds it and no running worker has it in hand.  The pool stops
once every job is done and no lease is live, lets any stopped worker go on, and waits for each
worker to end.

--faults injects, at steps a draw from --seed picks (see `plan`): SIGKILL (a new worker takes
its place); SIGSTOP, with SIGCONT once its lease has expired, or once the job's next holder was
granted, wrote or finished it (one stop, always, is before a write and waits for a newer
holder's write); "database is locked", up to worker.TRIES times in a row; a call that commits
and then raises; the clock jumping forward.  --blind writes without the fence: the control.

The jobs file logs every stored change, in commit order, by trigger.  From that log, after the
run: a *lost update* is a change to a lower (epoch, sequence) than the one it replaced; a
*reverted done* a change away from "done"; an *unfinished* job one not "done" once every
worker has ended; *repeated work* a job's work runs after its first (counted: the work of a
holder that loses its lease may have run).  Exit 0 when none is lost, reverted or unfinished
and every worker ended of itself; 1 otherwise, naming the job or worker; 2 for a bad argument;
130 on Ctrl-C.  recipes/ and the folder above it (leases.py) go on sys.path.
"""

import argparse
import collections
import contextlib
import dataclasses
import multiprocessing
import multiprocessing.connection
import os
import pathlib
import random
import shutil
import signal
import sqlite3
import sys
import tempfile
from collections.abc import Callable
from multiprocessing import resource_tracker
from typing import IO, Any, cast

sys.path.insert(1, str(pathlib.Path(__file__).resolve().parent.parent))  # leases.py
import fence
import worker

from leases import Lease, LeaseAuthority, LeaseError, LeaseHeld

__all__ = ["Fault", "judge", "main", "names", "plan", "run_pool"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143
STOPS = {signal.SIGINT, signal.SIGTERM}  # Ctrl-C, and a SIGTERM taken as one
BOUND = 60.0  # seconds a worker may stay silent: a hang, never an order
LONG = 2 * worker.TTL  # steps of every tenth job's work
STORE_STEPS = ("look", "acquire", "write running", "renew", "write done", "release")
COMMITS = ("acquire", "write running", "renew", "write done", "release")
STEPS = (*STORE_STEPS, "work")
RESUMES = ("expired", "granted", "written", "done")  # when a stopped worker goes on
HISTORY = """CREATE TABLE history (resource TEXT, old_epoch INTEGER, old_sequence INTEGER,
  old_value TEXT, epoch INTEGER, sequence INTEGER, value TEXT);
CREATE TRIGGER log AFTER UPDATE ON fenced BEGIN INSERT INTO history VALUES (new.resource,
  old.epoch, old.sequence, old.value, new.epoch, new.sequence, new.value); END;"""
BLIND = fence.WRITE.split("\n  WHERE")[0]  # the fence's upsert without its condition


# --- the data ---


@dataclasses.dataclass
class Fault:
    """One fault: `kind` at the first `step` of `job` some worker reaches (`times` in a row
    for "locked"); a stop goes on as `resume` says, a jump moves the clock by `ticks`."""

    kind: str  # kill, stop, locked, lost (commits, then raises), jump
    job: str
    step: str
    resume: str = ""
    ticks: int = 0
    times: int = 1


def names(jobs: int) -> list[str]:
    """The jobs' names, job-1 to job-N, zero-padded to sort as they number."""
    return [f"job-{number:0{len(str(jobs))}}" for number in range(1, jobs + 1)]


def plan(jobs: list[str], seed: int) -> list[Fault]:
    """The faults of a run, drawn from `seed` alone: the same seed, the same faults."""
    draw = random.Random(seed)
    some = max(1, len(jobs) // 15)
    faults = [Fault("stop", draw.choice(jobs), draw.choice(("write running", "write done")),
                    resume="written")]
    faults += [Fault("stop", draw.choice(jobs), draw.choice(STEPS), resume=draw.choice(RESUMES))
               for _ in range(2 * some)]
    faults += [Fault("kill", draw.choice(jobs), draw.choice(STEPS)) for _ in range(some)]
    faults += [Fault("locked", draw.choice(jobs), draw.choice(STORE_STEPS),
                     times=draw.randint(1, worker.TRIES)) for _ in range(2 * some)]
    faults += [Fault("lost", draw.choice(jobs), draw.choice(COMMITS)) for _ in range(2 * some)]
    faults += [Fault("jump", draw.choice(jobs), draw.choice(STEPS),
                     ticks=draw.randint(1, 2 * worker.TTL)) for _ in range(some)]
    return faults


def judge(jobs_file: str) -> dict[str, tuple[int, int, str]]:
    """Per job, from the jobs file's log: (lost updates, reverted dones, the stored value)."""
    with contextlib.closing(sqlite3.connect(jobs_file)) as db:
        found = db.execute(
            "SELECT f.resource, COALESCE(SUM((h.epoch, h.sequence) < (h.old_epoch,"
            " h.old_sequence)), 0), COALESCE(SUM(h.old_value = 'done' AND h.value <> 'done'),"
            " 0), f.value FROM fenced f LEFT JOIN history h USING (resource)"
            " GROUP BY f.resource").fetchall()
    return {job: (lost, reverted, value) for job, lost, reverted, value in found}


# --- a worker process ---


class Link:
    """A worker's end of its pipe: each message waits for the coordinator's answer."""

    def __init__(self, pipe: multiprocessing.connection.Connection, me: str) -> None:
        self.pipe, self.me = pipe, me
        self.leases: dict[str, Lease] = {}  # the latest lease this worker was given, per job

    def ask(self, *message: object) -> Any:
        self.pipe.send(message)
        if not self.pipe.poll(BOUND):
            raise TimeoutError(f"the coordinator did not answer {message!r} in {BOUND:g} s")
        return self.pipe.recv()

    def at(self, step: str, job: str) -> str:
        """Tell the coordinator this worker is at `step` of `job`: "go", "locked" or "lost"."""
        lease = self.leases.get(job)
        return str(self.ask("at", step, job, lease.epoch if lease else 0,
                            lease.expires_at if lease else 0))

    def queue(self) -> Any:
        while (job := self.ask("next")) is not None:
            yield job

    def do(self, job: str, heartbeat: worker.Heartbeat) -> None:
        """The work: one step, or LONG for every tenth job, a heartbeat after each."""
        self.ask("work", job)
        for _ in range(LONG if job.endswith("0") else 1):
            self.at("work", job)
            if not heartbeat():
                return


class Authority(LeaseAuthority):
    """The library's authority, with the coordinator's faults before or after each call."""

    def __init__(self, path: str, link: Link) -> None:
        super().__init__(path)
        self.link = link

    def _call(self, step: str, job: str, call: Any) -> Any:
        fault = self.link.at(step, job)
        if fault == "locked":
            raise LeaseError(f"database {self.path!r}: database is locked (injected)")
        try:
            lease = call()
        except LeaseHeld as held:
            if held.lease.holder == self.link.me:  # a retry meets its own grant
                self.link.leases[job] = held.lease
            raise
        if isinstance(lease, Lease):
            self.link.leases[job] = lease
        if step == "acquire":
            self.link.ask("granted", job, lease.epoch)
        if fault == "lost":
            raise LeaseError(f"database {self.path!r}: the answer was lost after the COMMIT "
                             "(injected)")
        return lease

    def acquire(self, resource: str, holder: str, *, now: int, ttl: int) -> Lease:
        return self._call("acquire", resource,  # type: ignore[no-any-return]
                          lambda: super(Authority, self).acquire(resource, holder, now=now,
                                                                 ttl=ttl))

    def renew(self, lease: Lease, *, now: int, ttl: int) -> Lease:
        return self._call("renew", lease.resource,  # type: ignore[no-any-return]
                          lambda: super(Authority, self).renew(lease, now=now, ttl=ttl))

    def release(self, lease: Lease) -> None:
        self._call("release", lease.resource, lambda: super(Authority, self).release(lease))


class Jobs(sqlite3.Connection):
    """The jobs file, with the coordinator's faults before each look."""

    link: Link

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        if (not self.in_transaction and sql.startswith("SELECT value FROM fenced")
                and self.link.at("look", parameters[0]) == "locked"):
            raise sqlite3.OperationalError("database is locked (injected)")
        return super().execute(sql, parameters)


def blind_write(db: sqlite3.Connection, write: dict[str, object]) -> str:
    """The control: every write stored, whatever is stored already."""
    db.execute(BLIND, write)  # one statement, its own transaction
    return "applied"


def written(link: Link, blind: bool) -> worker.Write:
    def write(db: sqlite3.Connection, row: dict[str, object]) -> str:
        job, value = str(row["resource"]), str(row["value"])
        fault = link.at(f"write {value}", job)
        if fault == "locked":
            raise sqlite3.OperationalError("database is locked (injected)")
        answer = (blind_write if blind else fence.fenced_write)(db, row)
        link.ask("wrote", job, row["epoch"], row["sequence"], value, answer)
        if fault == "lost":
            raise sqlite3.OperationalError("disk I/O error (injected after the COMMIT)")
        return answer
    return write


def child(me: str, pipe: multiprocessing.connection.Connection, tick: Any, folder: str,
          blind: bool) -> None:
    """One worker process: worker.work with this pool's queue, clock, work and faults."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the coordinator's to handle
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    link = Link(pipe, me)

    def connect(path: str) -> sqlite3.Connection:
        db = cast(Jobs, worker.open_jobs(path, factory=Jobs))
        db.link = link
        return db

    try:
        worker.work(link.queue(), me, lambda: int(tick.value), link.do,
                    os.path.join(folder, "leases.sqlite3"), os.path.join(folder, "jobs.sqlite3"),
                    authority=lambda path: Authority(path, link), connect=connect,
                    write=written(link, blind))
    except BaseException as error:  # noqa: BLE001 - reported: the coordinator judges it
        with contextlib.suppress(OSError):  # the coordinator may be gone
            pipe.send(("ended", f"{type(error).__name__}: {error}"))
        raise SystemExit(1) from None
    pipe.send(("ended", None))


# --- the coordinator ---


class Stopped(Exception):
    """The run cannot go on: a worker ended by an exception, or none spoke for BOUND s."""


@dataclasses.dataclass
class Process:
    """The coordinator's view of one worker process."""

    name: str
    process: Any  # a spawn context's Process
    pipe: multiprocessing.connection.Connection
    job: str | None = None  # the job in hand: offered, and not yet given back
    idle: bool = False  # it asked for a job, and none was there to give
    started: bool = False  # it has sent a first message
    stopped: tuple[str, str, int, int] | None = None  # (job, resume, epoch, expires_at)
    ended: bool = False
    error: str | None = None  # how it ended, if not of itself

    def state(self) -> str:
        doing = ("ended" if self.ended else f"stopped at {self.stopped[0]}, waits for "
                 f"{self.stopped[1]}" if self.stopped else "idle" if self.idle else
                 f"busy with {self.job}" if self.started else "starting")
        return f"{self.name} {doing}"

    def running(self) -> bool:
        return not self.ended and self.stopped is None


class Pool:
    """One run: the workers, the clock, the queue, the faults; `run()` returns once every
    worker has ended."""

    def __init__(self, folder: str, workers: int, jobs: int, faults: list[Fault],
                 blind: bool, progress: IO[str] | None) -> None:
        self.folder, self.blind, self.faults, self.progress = folder, blind, faults, progress
        self.jobs = names(jobs)
        self.jobs_file = os.path.join(folder, "jobs.sqlite3")
        with contextlib.closing(sqlite3.connect(self.jobs_file, isolation_level=None)) as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(fence.TABLE)
            db.executescript(HISTORY)
            db.executemany("INSERT INTO fenced VALUES (?, 0, 0, 'queued')",
                           [(job,) for job in self.jobs])
        self.authority = LeaseAuthority(os.path.join(folder, "leases.sqlite3"))
        self.store = sqlite3.connect(self.jobs_file, isolation_level=None)
        self.context = multiprocessing.get_context("spawn")
        self.tick = self.context.Value("q", 0, lock=False)  # one writer: this process
        self.pending = collections.deque(self.jobs)
        self.processes: list[Process] = []
        self.draining = False
        self.grants: collections.Counter[str] = collections.Counter()
        self.runs: collections.Counter[str] = collections.Counter()
        self.answers: collections.Counter[str] = collections.Counter()
        self.injected: dict[str, list[str]] = collections.defaultdict(list)
        self.done: set[str] = set()
        self.heard: set[str] = set()  # the workers heard since the clock last moved
        self.stops: list[Process] = []  # the stopped workers, longest stopped first
        resource_tracker.ensure_running()  # now: starting it later unblocks Ctrl-C here
        for _ in range(workers):
            self.start()

    def say(self, text: str) -> None:
        if self.progress is not None:
            print(f"pool: tick {self.now()}: {text}", file=self.progress, flush=True)

    def now(self) -> int:
        return int(self.tick.value)

    def move_clock(self, to: int) -> None:
        """Set the clock to `to`, if later; a stopped worker waiting for its lease to expire
        goes on once it has."""
        self.tick.value = max(self.now(), to)
        for one in list(self.stops):
            if one.stopped and one.stopped[1] == "expired" and self.now() >= one.stopped[3]:
                self.go_on(one, f"its lease on {one.stopped[0]} expired")

    def start(self) -> None:
        name = f"w{len(self.processes) + 1}"
        parent, child_end = self.context.Pipe()
        process = self.context.Process(target=child, name=name, args=(
            name, child_end, self.tick, self.folder, self.blind))
        held = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)  # the child inherits it
        try:
            process.start()
            self.processes.append(Process(name, process, parent))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        child_end.close()

    def close(self) -> None:
        """Stop every worker still there, and close the files."""
        for one in self.processes:
            if one.process.is_alive():
                one.process.kill()  # a stopped process too
            one.process.join(BOUND)
            one.pipe.close()
        self.authority.close()
        self.store.close()

    def run(self) -> None:
        while not all(one.ended for one in self.processes):
            waiting = {one.pipe: one for one in self.processes if not one.ended}
            ready = multiprocessing.connection.wait(list(waiting), timeout=BOUND)
            if not ready:
                raise Stopped(f"no worker sent anything for {BOUND:g} s (tick {self.now()}, "
                           f"{len(self.done)} of {len(self.jobs)} jobs done; "
                           + ", ".join(one.state() for one in self.processes) + ")")
            for pipe in ready:
                one = waiting[pipe]  # type: ignore[index]
                if one.ended:
                    continue  # killed while this batch was read
                try:
                    message = one.pipe.recv()
                except EOFError:
                    self.ended(one, f"died with exit code {one.process.exitcode}")
                    continue
                one.started = True
                self.heard.add(one.name)
                self.handle(one, *message)
                self.round()
            self.settle()

    def round(self) -> None:
        """The clock moves one tick once every busy worker was heard since the last: a worker
        the machine leaves waiting for the processor does not see time pass without it."""
        busy = {one.name for one in self.processes if one.running() and one.started
                and not one.idle}
        if busy <= self.heard:
            self.heard.clear()
            self.move_clock(self.now() + 1)

    def handle(self, one: Process, kind: str, *detail: Any) -> None:
        if kind == "next":
            one.job = None
            if self.draining:
                one.pipe.send(None)
            else:
                one.idle = True
        elif kind == "at":
            self.at(one, *detail)
        elif kind == "ended":
            self.ended(one, detail[0])
        else:
            job = detail[0]
            if kind == "granted":
                self.grants[job] += 1
                self.resume(job, ("granted",), detail[1], one)
            elif kind == "wrote":
                epoch, _, value, answer = detail[1:]
                self.answers[answer] += 1
                if answer == "applied":
                    if value == "done":
                        self.done.add(job)
                    else:
                        self.done.discard(job)
                    self.resume(job, ("written", "done") if value == "done" else ("written",),
                                epoch, one)
            elif kind == "work":
                self.runs[job] += 1
            one.pipe.send("go")

    def at(self, one: Process, step: str, job: str, epoch: int, expires_at: int) -> None:
        """A worker at `step` of `job`: go on, or the first fault planned there."""
        fault = next((f for f in self.faults if (f.job, f.step) == (job, step) and f.times),
                     None)
        if fault is None or self.draining:
            one.pipe.send("go")
            return
        fault.times -= 1
        self.injected[job].append(f"{fault.kind} at {step}")
        self.say(f"{len(self.done)} of {len(self.jobs)} done: {fault.kind} {one.name} at {step} "
                 f"of {job}")
        if fault.kind == "kill":  # its lease expires as the others' time passes
            one.process.kill()
            one.process.join(BOUND)
            self.ended(one, None)
        elif fault.kind == "stop":
            os.kill(one.process.pid, signal.SIGSTOP)  # its answer waits until it goes on
            one.stopped = (job, fault.resume, epoch, expires_at)
            self.stops.append(one)
            self.move_clock(self.now())  # a lease expired already: it goes on at once
        elif fault.kind == "jump":
            self.move_clock(self.now() + fault.ticks)
            one.pipe.send("go")
        else:
            one.pipe.send(fault.kind)  # "locked" or "lost": the worker raises it

    def resume(self, job: str, resumes: tuple[str, ...], epoch: int, by: Process) -> None:
        """Let go on each worker stopped at `job` that waits for one of `resumes`, if `by` is
        another worker and `epoch` above the stopped one's."""
        for one in list(self.stops):
            if one.stopped and one is not by and one.stopped[1] in resumes and (
                    job == one.stopped[0] and epoch > one.stopped[2]):
                self.go_on(one, f"{one.stopped[0]} {one.stopped[1]} by another")

    def go_on(self, one: Process, why: str) -> None:
        self.say(f"{one.name} goes on ({why})")
        self.stops.remove(one)
        one.stopped = None
        one.pipe.send("go")  # read once it runs again
        os.kill(one.process.pid, signal.SIGCONT)

    def ended(self, one: Process, error: str | None) -> None:
        """`one` ended: of itself or killed by a fault (None), or by `error`."""
        if not one.ended:
            one.ended, one.job, one.idle, one.error = True, None, False, error
            if error is not None and not self.draining:
                raise Stopped(f"worker {one.name} ended by {error}")
            if not self.draining:
                self.start()  # killed by a fault: a new worker takes its place

    def offerable(self) -> list[str]:
        """The jobs to offer again: not done, no live lease, not in a running worker's hand."""
        stored = dict(self.store.execute("SELECT resource, value FROM fenced").fetchall())
        in_hand = {one.job for one in self.processes if one.running()}
        return [job for job in self.jobs if stored[job] != "done" and job not in self.pending
                and job not in in_hand and self.authority.current(job, now=self.now()) is None]

    def settle(self) -> None:
        """Give idle workers jobs; when none is left to give, resume, move the clock on or
        stop.  The queue is refilled only when a worker waits for a job."""
        while not self.draining:
            idle = [one for one in self.processes if one.running() and one.idle]
            if idle and not self.pending:
                self.pending.extend(self.offerable())
            for one in idle:
                if self.pending:
                    one.idle, one.job = False, self.pending.popleft()
                    one.pipe.send(one.job)
            if any(one.running() and not one.idle for one in self.processes):
                return  # a busy worker will say more, and time passes
            live = [lease for job in self.jobs
                    if (lease := self.authority.current(job, now=self.now()))]
            if live:  # every worker waits: time passes to the next expiry
                self.move_clock(min(lease.expires_at for lease in live))
                continue
            if self.stops:  # and none of the stopped has a live lease: the longest goes on
                self.go_on(self.stops[0], "no other worker is busy")
                return
            if self.offerable():
                continue
            self.drain()

    def drain(self) -> None:
        """Every job done, no lease live: no more faults, and every worker asked to end."""
        self.say("every job done and no lease live: the workers end")
        self.draining = True
        while self.stops:
            self.go_on(self.stops[0], "the pool ends")
        for one in self.processes:
            if one.idle and not one.ended:
                one.idle = False
                one.pipe.send(None)


def run_pool(workers: int, jobs: int, faults: list[Fault], blind: bool,
             progress: IO[str] | None = sys.stderr) -> dict[str, Any]:
    """One run in a temporary folder of its own; what it did, and the judge's findings."""
    planned = sum(fault.times for fault in faults)
    folder = tempfile.mkdtemp(prefix="pool-")
    pool = None
    try:
        pool = Pool(folder, workers, jobs, faults, blind, progress)
        pool.run()
        return {"jobs": pool.jobs, "grants": pool.grants, "runs": pool.runs,
                "answers": pool.answers, "injected": pool.injected, "tick": pool.now(),
                "judged": judge(pool.jobs_file), "planned": planned,
                "errors": {one.name: one.error for one in pool.processes if one.error}}
    finally:
        for stop in STOPS:  # the cleanup runs whole
            signal.signal(stop, signal.SIG_IGN)
        if pool is not None:
            pool.close()
        shutil.rmtree(folder, ignore_errors=True)


# --- the command line ---


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, not the usage
        self.exit(EXIT_USAGE, f"pool: {message}\n")


def counted(most: int) -> Callable[[str], int]:
    def count(text: str) -> int:
        if not (text.isascii() and text.isdigit() and 1 <= int(text) <= most):
            raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {most}, "
                                             f"got {text!r}")
        return int(text)
    return count


def terminated(signum: int, _: object) -> None:  # SIGTERM: stopped as by Ctrl-C
    raise KeyboardInterrupt(signum)


def table(found: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The report's lines, and its failures, each naming its job or worker."""
    lines = [f"{'job':<8} {'grants':>6} {'runs':>4}  {'stored':<8} faults"]
    lost = reverted = unfinished = repeated = 0
    failures = []
    for job in found["jobs"]:
        job_lost, job_reverted, value = found["judged"][job]
        runs = found["runs"][job]
        lines.append(f"{job:<8} {found['grants'][job]:>6} {runs:>4}  {value:<8} "
                     f"{', '.join(found['injected'][job])}")
        lost, reverted = lost + job_lost, reverted + job_reverted
        unfinished += value != "done"
        repeated += max(0, runs - 1)
        failures += [f"{job} lost {job_lost} update(s)"] * bool(job_lost)
        failures += [f"{job} was set back from done {job_reverted} time(s)"] * bool(job_reverted)
        failures += [f"{job} is unfinished: {value!r}"] * (value != "done")
    failures += [f"worker {name} ended by {error}" for name, error in found["errors"].items()]
    injected = collections.Counter(kind.split(" at ")[0] for kinds in found["injected"].values()
                                   for kind in kinds)
    lines.append(f"faults: {sum(injected.values())} of {found['planned']} planned injected"
                 + "".join(f", {count} {kind}" for kind, count in sorted(injected.items())))
    lines.append("answers: " + ", ".join(f"{count} {answer}" for answer, count
                                          in sorted(found["answers"].items())))
    lines.append(f"lost updates {lost}, reverted done {reverted}, unfinished {unfinished}, "
                 f"repeated work {repeated} (in {sum(found['runs'].values())} runs, "
                 f"{sum(found['grants'].values())} grants, {found['tick']} ticks)")
    return lines, failures


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, terminated)
    try:
        return command(argv)
    except KeyboardInterrupt as stop:  # before the run, or during it: its cleanup is done
        return EXIT_TERMINATED if stop.args == (signal.SIGTERM,) else EXIT_INTERRUPTED


def command(argv: list[str] | None) -> int:
    parser = Parser(prog="pool.py", description=__doc__.split("\n\n")[0],
                    epilog="exit 0: no update lost, no done reverted, no job unfinished; 1: "
                    "otherwise, each named on stderr; 2: a bad argument; 130: Ctrl-C; 143: SIGTERM")
    parser.add_argument("--workers", type=counted(64), default=5,
                        help="worker processes (5; at most 64)")
    parser.add_argument("--jobs", type=counted(10_000), default=30, help="jobs (30; at most 10,000)")
    parser.add_argument("--faults", action="store_true", help="inject faults drawn from --seed")
    parser.add_argument("--seed", type=int, default=0, help="the draw of faults (0)")
    parser.add_argument("--blind", action="store_true", help="write without the fence")
    args = parser.parse_args(argv)
    faults = plan(names(args.jobs), args.seed) if args.faults else []
    try:
        found = run_pool(args.workers, args.jobs, faults, args.blind)
    except (Stopped, LeaseError, sqlite3.Error, OSError) as error:
        print(f"pool: {error}", file=sys.stderr)
        return EXIT_FAILED
    lines, failures = table(found)
    try:
        print(f"pool: {args.workers} workers, {args.jobs} jobs, "
              f"{f'faults of seed {args.seed}' if args.faults else 'no faults'}, "
              f"{'blind' if args.blind else 'fenced'}")
        print("\n".join(lines), flush=True)
    except BrokenPipeError:  # | head: the rest is not wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    for failure in failures:
        print(f"pool: {failure}", file=sys.stderr)
    return EXIT_FAILED if failures else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
