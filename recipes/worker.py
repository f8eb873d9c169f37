"""The worker of a pool: it takes jobs one at a time under a lease, and writes each job's row
through the fence (fence.py), so that a holder whose lease was lost cannot undo a newer one's.

    work(queue, me, clock, do, leases, jobs)

- `queue`: the jobs offered to this worker, in order (an iterable of str); the coordinator may
  offer a job again;
- `me`: this holder's name, its own in the pool;
- `clock`: a callable returning the tick, the coordinator's: never a clock of the worker's own;
- `do(job, heartbeat)`: the work.  It calls `heartbeat()` between steps: True, the lease is
  held (renewed when half the ttl is gone); False, it is lost: stop, another holder may be
  doing the job;
- `leases`: the path of the LeaseAuthority's file; `jobs`: the path of the jobs file, with
  fence.TABLE and a row per job seeded at epoch 0 (value "queued").

Keyword-only, for a caller that injects faults or a control: `authority` (made from `leases`),
`connect` (opens `jobs`), `write` (fence.fenced_write).  It returns when `queue` ends; an
exception of the work's passes, once the lease is released.

The rules, each written once below:

1. Look before acquiring (a grant for a finished job burns an epoch), and again once granted
   (the job may have finished between the look and the grant).
2. Write "running" first (sequence 1): once stored, its epoch fences out every older holder.
3. "done" is final: a write answered "done" means the job is finished, so the worker moves on
   without doing the work.
4. The work calls the heartbeat; after the work, one more heartbeat, then "done" (sequence 2).
5. Release at the end, whatever happened.
6. Never die holding a live lease: a call that raises LeaseError (not LeaseHeld or LeaseLost,
   which are answers) or sqlite3.Error may have taken effect, so it is tried again, as the
   holder's guide says; after TRIES failures the worker leaves the job (its lease expires and
   the coordinator offers it again) and takes the next.

leases.py is imported as a top-level module: put this file beside it, or its folder on sys.path.
"""

import contextlib
import sqlite3
from collections.abc import Callable, Iterable
from typing import TypeVar

from fence import fenced_write

from leases import Lease, LeaseAuthority, LeaseError, LeaseHeld, LeaseLost

__all__ = ["TRIES", "TTL", "GaveUp", "look", "open_jobs", "work"]

TTL = 10  # ticks a grant or a renewal lasts
TRIES = 3  # attempts of a call whose error leaves its outcome unknown

Heartbeat = Callable[[], bool]
Work = Callable[[str, Heartbeat], None]
Write = Callable[[sqlite3.Connection, dict[str, object]], str]
T = TypeVar("T")


class GaveUp(Exception):
    """A call failed TRIES times with an unknown outcome: the worker leaves the job."""


def tried(call: Callable[[], T]) -> T:
    """`call()`, tried again after an error that leaves its outcome unknown (rule 6)."""
    for _ in range(TRIES):
        try:
            return call()
        except (LeaseHeld, LeaseLost):
            raise  # an answer, not an error
        except (LeaseError, sqlite3.Error) as error:
            failure = error
    raise GaveUp(f"failed {TRIES} times: {failure}") from failure


def open_jobs(path: str,
              factory: type[sqlite3.Connection] = sqlite3.Connection) -> sqlite3.Connection:
    """The jobs file, as the fence needs it: no transaction opened by sqlite3 itself."""
    return sqlite3.connect(path, isolation_level=None, timeout=30, factory=factory)


def look(db: sqlite3.Connection, job: str) -> str:
    """The job's stored value: "queued", "running" or "done"."""
    return str(tried(lambda: db.execute(
        "SELECT value FROM fenced WHERE resource = ?", (job,)).fetchone()[0]))


class Held:
    """The lease a worker holds on one job, renewed by its heartbeat until it is lost."""

    def __init__(self, authority: LeaseAuthority, lease: Lease, clock: Callable[[], int]) -> None:
        self.authority, self.lease, self.clock, self.lost = authority, lease, clock, False

    def heartbeat(self) -> bool:
        """Renew once half the ttl is gone; False from the first renewal that fails on."""
        if not self.lost and self.clock() >= self.lease.expires_at - TTL // 2:
            try:
                self.lease = tried(lambda: self.authority.renew(
                    self.lease, now=self.clock(), ttl=TTL))
            except (LeaseLost, GaveUp):
                self.lost = True
        return not self.lost

    def release(self) -> None:
        """Release the lease; if it is lost already, or the store fails, it expires instead."""
        with contextlib.suppress(LeaseLost, GaveUp):
            tried(lambda: self.authority.release(self.lease))


def take(authority: LeaseAuthority, job: str, me: str, clock: Callable[[], int]) -> Lease | None:
    """A lease on `job`, or None if another's lease is live.  A retried acquire whose first try
    committed meets the worker's own lease: adopted."""
    try:
        return tried(lambda: authority.acquire(job, me, now=clock(), ttl=TTL))
    except LeaseHeld as held:
        return held.lease if held.lease.holder == me else None


def run_job(authority: LeaseAuthority, db: sqlite3.Connection, job: str, me: str,
            clock: Callable[[], int], do: Work, write: Write) -> None:
    """One job, rules 1 to 5; GaveUp (rule 6) passes to the caller."""
    if look(db, job) == "done":  # else a grant burns an epoch
        return
    lease = take(authority, job, me, clock)
    if lease is None:
        return  # another's live lease
    held = Held(authority, lease, clock)
    try:
        if look(db, job) == "done":  # finished since the first look
            return
        row = {"resource": job, "epoch": lease.epoch}
        answer = tried(lambda: write(db, {**row, "sequence": 1, "value": "running"}))
        if answer not in ("applied", "replay"):
            return  # "done", or a newer holder has it
        do(job, held.heartbeat)
        if held.heartbeat():  # else another holder may be at it
            tried(lambda: write(db, {**row, "sequence": 2, "value": "done"}))
    finally:
        held.release()  # or, if that fails, it expires


def work(queue: Iterable[str], me: str, clock: Callable[[], int], do: Work, leases: str,
         jobs: str, *, authority: Callable[[str], LeaseAuthority] = LeaseAuthority,
         connect: Callable[[str], sqlite3.Connection] = open_jobs,
         write: Write = fenced_write) -> None:
    """Take each job of `queue` in turn, as the module's docstring says."""
    with authority(leases) as authority_, contextlib.closing(connect(jobs)) as db:
        for job in queue:
            with contextlib.suppress(GaveUp):  # the job is left to its lease's expiry
                run_job(authority_, db, job, me, clock, do, write)
