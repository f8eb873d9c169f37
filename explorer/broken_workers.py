"""Broken copies of the recipe's worker (recipes/worker.py), one rule broken in each, for
--worker and its tests: `python3 explorer/explore.py --worker broken_workers:BlindWrite`.

Each is the recipe's `work` with one of its own pieces swapped: the fence it writes through
(`write=`), or `run_job`'s rules (`job`, a copy of run_job with a switch per rule).
"""

import contextlib
import sqlite3
from collections.abc import Callable, Iterable
from typing import Any

import fence
import worker
from worker import Held, look, take, tried

from leases import LeaseAuthority

__all__ = ["BlindWrite", "DoneNotFinal", "NoSecondLook", "PlainBegin", "ReleaseBeforeDone",
           "StaleIgnored", "StoreErrorUnhandled", "job"]

TTL = worker.TTL


def job(authority: LeaseAuthority, db: sqlite3.Connection, job: str, me: str,
        clock: Callable[[], int], do: worker.Work, write: worker.Write, *,
        second_look: bool = True, release_first: bool = False, heeds_stale: bool = True,
        retried: Callable[[Callable[[], str]], str] = tried) -> None:
    """worker.run_job, each keyword breaking one of its rules."""
    if look(db, job) == "done":
        return
    lease = take(authority, job, me, clock)
    if lease is None:
        return
    held = Held(authority, lease, clock)
    try:
        if second_look and look(db, job) == "done":
            return
        row = {"resource": job, "epoch": lease.epoch}
        answer = retried(lambda: write(db, {**row, "sequence": 1, "value": "running"}))
        if answer not in ("applied", "replay", *["stale"] * (not heeds_stale)):
            return
        do(job, held.heartbeat)
        if held.heartbeat():
            if release_first:
                held.release()
            retried(lambda: write(db, {**row, "sequence": 2, "value": "done"}))
    finally:
        held.release()


def _worker(write: worker.Write = fence.fenced_write, **broken: Any) -> Callable[..., None]:
    """worker.work, its jobs run by `job` with `broken`'s rules and `write`'s fence."""
    def work(queue: Iterable[str], me: str, clock: Callable[[], int], do: worker.Work,
             leases: str, jobs: str) -> None:
        with LeaseAuthority(leases) as authority, \
                contextlib.closing(worker.open_jobs(jobs)) as db:
            for one in queue:
                with contextlib.suppress(worker.GaveUp):
                    job(authority, db, one, me, clock, do, write, **broken)
    return work


def _fence(write_sql: str, begin: str = "BEGIN IMMEDIATE") -> worker.Write:
    """fence.fenced_write with its WRITE or its BEGIN replaced."""
    def fenced(db: sqlite3.Connection, given: dict[str, object]) -> str:
        try:
            db.execute(begin)
            db.execute(write_sql, given)
            [(answer,)] = db.execute(fence.ANSWER, given).fetchall()
            db.execute("COMMIT")
        finally:
            if db.in_transaction:
                db.execute("ROLLBACK")
        return str(answer)
    return fenced


NoSecondLook = _worker(second_look=False)
ReleaseBeforeDone = _worker(release_first=True)
StaleIgnored = _worker(heeds_stale=False)
StoreErrorUnhandled = _worker(retried=lambda call: call())
DoneNotFinal = _worker(write=_fence(fence.WRITE.replace("fenced.value <> 'done'\n    AND ", "")))
BlindWrite = _worker(write=_fence(fence.WRITE.split("\n  WHERE")[0]))  # always "applied"
PlainBegin = _worker(write=_fence(fence.WRITE, begin="BEGIN"))
