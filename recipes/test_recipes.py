"""Tests of the recipes: the fence, the worker's rules, and the pool.

    python3 recipes/test_recipes.py

recipes/ has no __init__.py, so the root's `python3 -m unittest discover` leaves these out.
"""

import contextlib
import os
import pathlib
import sqlite3
import subprocess
import sys
import tempfile
import types
import unittest
from collections.abc import Callable
from typing import Any, ClassVar

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(1, str(HERE.parent))  # leases.py
import fence
import pool
import worker

from leases import Lease, LeaseAuthority, LeaseError


def write(resource: str, epoch: int, sequence: int, value: str) -> dict[str, object]:
    return {"resource": resource, "epoch": epoch, "sequence": sequence, "value": value}


class Files(unittest.TestCase):
    """Each test's own folder, jobs file (one row per job, seeded at epoch 0) and clock."""

    def setUp(self) -> None:
        folder = tempfile.TemporaryDirectory()
        self.addCleanup(folder.cleanup)
        self.leases = os.path.join(folder.name, "leases.sqlite3")
        self.jobs = os.path.join(folder.name, "jobs.sqlite3")
        self.db = self.connect()
        self.db.execute(fence.TABLE)
        self.db.executemany("INSERT INTO fenced VALUES (?, 0, 0, 'queued')",
                            [("job-1",), ("job-2",)])
        self.tick = 0
        self.runs: list[str] = []

    def connect(self) -> sqlite3.Connection:
        db = worker.open_jobs(self.jobs)
        self.addCleanup(db.close)
        return db

    def clock(self) -> int:
        return self.tick

    def authority(self) -> LeaseAuthority:
        authority = LeaseAuthority(self.leases)
        self.addCleanup(authority.close)
        return authority

    def stored(self, job: str = "job-1") -> tuple[int, int, str]:
        row = self.db.execute("SELECT epoch, sequence, value FROM fenced WHERE resource = ?",
                              (job,)).fetchone()
        return (row[0], row[1], row[2])

    def work(self, job: str, heartbeat: worker.Heartbeat) -> None:
        self.runs.append(job)

    def run_worker(self, jobs: list[str], **hooks: Any) -> None:
        worker.work(jobs, "A", self.clock, hooks.pop("do", self.work), self.leases, self.jobs,
                    **hooks)


class FenceTests(Files):
    def test_each_write_is_answered_as_the_contract_says_and_done_is_final(self) -> None:
        for given, answer, stored in [
            (write("job-1", 2, 1, "running"), "applied", (2, 1, "running")),
            (write("job-1", 1, 1, "running"), "stale", (2, 1, "running")),
            (write("job-1", 2, 1, "running"), "replay", (2, 1, "running")),
            (write("job-1", 2, 1, "paused"), "conflict", (2, 1, "running")),
            (write("job-1", 2, 2, "done"), "applied", (2, 2, "done")),
            (write("job-1", 2, 2, "done"), "replay", (2, 2, "done")),
            (write("job-1", 3, 1, "running"), "done", (2, 2, "done")),
            (write("job-1", 1, 2, "done"), "done", (2, 2, "done")),
            (write("job-3", 1, 1, "running"), "applied", (1, 1, "running")),
        ]:
            with self.subTest(write=given):
                self.assertEqual(fence.fenced_write(self.db, given), answer)
                self.assertEqual(self.stored(str(given["resource"])), stored)

    def test_a_connection_inside_a_transaction_is_refused_and_its_transaction_kept(
            self) -> None:
        self.db.execute("BEGIN")
        self.db.execute("UPDATE fenced SET value = 'mine' WHERE resource = 'job-2'")
        with self.assertRaisesRegex(ValueError, "outside any transaction"):
            fence.fenced_write(self.db, write("job-1", 1, 1, "running"))
        self.assertTrue(self.db.in_transaction)
        self.assertEqual(self.stored("job-2"), (0, 0, "mine"))
        self.db.execute("ROLLBACK")

    def test_a_ctrl_c_at_any_bytecode_of_a_write_leaves_no_transaction_open(self) -> None:
        def interrupted(at: int) -> int:
            """Events of one write, raising KeyboardInterrupt at event `at` (0: none)."""
            seen = 0

            def trace(frame: types.FrameType, event: str, arg: object) -> Any:
                nonlocal seen
                if frame.f_code is not fence.fenced_write.__code__:
                    return None
                frame.f_trace_opcodes = True
                seen += 1
                if seen == at:
                    raise KeyboardInterrupt
                return trace

            # CPython 3.12 sends opcode events only if a frame asked for them before settrace.
            sys._getframe().f_trace_opcodes = True
            sys.settrace(trace)
            try:
                fence.fenced_write(self.db, write("job-1", 1 + at, 1, "running"))
            except KeyboardInterrupt:
                pass
            finally:
                sys.settrace(None)
            return seen

        other = self.connect()
        other.execute("PRAGMA busy_timeout = 0")
        events = interrupted(0)
        self.assertGreater(events, 20)
        for at in range(1, events + 1):
            with self.subTest(at=at):
                try:
                    self.assertEqual(interrupted(at), at)
                    self.assertFalse(self.db.in_transaction)
                    other.execute("BEGIN IMMEDIATE")  # the write lock is free
                    other.execute("ROLLBACK")
                finally:
                    if self.db.in_transaction:  # so that each event fails alone
                        self.db.execute("ROLLBACK")
        self.assertEqual(self.stored()[2], "running")  # and the fence still writes


class Faulty(LeaseAuthority):
    """An authority whose calls fail as `faults` say, by call name: a list of "before" (raise,
    nothing done) and "after" (done, then raise), one used per call."""

    faults: ClassVar[dict[str, list[str]]] = {}

    def call(self, name: str, call: Callable[[], Any]) -> Any:
        fault = self.faults.get(name, []).pop(0) if self.faults.get(name) else None
        if fault == "before":
            raise LeaseError("database is locked")
        result = call()
        if fault == "after":
            raise LeaseError("the answer was lost")
        return result

    def acquire(self, resource: str, holder: str, *, now: int, ttl: int) -> Lease:
        return self.call(  # type: ignore[no-any-return]
            "acquire", lambda: super(Faulty, self).acquire(resource, holder, now=now, ttl=ttl))

    def renew(self, lease: Lease, *, now: int, ttl: int) -> Lease:
        return self.call(  # type: ignore[no-any-return]
            "renew", lambda: super(Faulty, self).renew(lease, now=now, ttl=ttl))

    def release(self, lease: Lease) -> None:
        self.call("release", lambda: super(Faulty, self).release(lease))


class WorkerTests(Files):
    def faulty(self, **faults: list[str]) -> Callable[[str], LeaseAuthority]:
        kind = type("Faulty", (Faulty,), {"faults": faults})
        return lambda path: kind(path)

    def test_a_worker_does_each_job_once_writing_running_first_and_done_then_releasing(
            self) -> None:
        seen: list[tuple[object, ...]] = []

        def recorded(db: sqlite3.Connection, given: dict[str, object]) -> str:
            seen.append((given["sequence"], given["value"]))
            return fence.fenced_write(db, given)

        def work(job: str, heartbeat: worker.Heartbeat) -> None:
            seen.append((job, self.stored(job)))

        class Recorded(LeaseAuthority):
            def release(self, lease: Lease) -> None:
                seen.append(("release",))
                super().release(lease)

        self.run_worker(["job-1", "job-2", "job-1"], write=recorded, do=work,
                        authority=Recorded)
        self.assertEqual(seen, [
            (1, "running"), ("job-1", (1, 1, "running")), (2, "done"), ("release",),
            (1, "running"), ("job-2", (1, 1, "running")), (2, "done"), ("release",)])
        self.assertEqual(self.authority().acquire("job-1", "probe", now=0, ttl=1).epoch, 2)

    def test_done_is_final_a_worker_refused_with_done_moves_on_without_the_work(self) -> None:
        # An older holder's "done" lands in the gap; or (the same rule for "stale") a newer
        # holder's "running" does: either way the work is not this worker's to do.
        for first in (write("job-1", 0, 2, "done"), write("job-1", 5, 1, "running")):
            with self.subTest(first=first["value"]):
                self.db.execute("UPDATE fenced SET epoch = 0, sequence = 0, value = 'queued'")

                def landed_first(db: sqlite3.Connection, given: dict[str, object]) -> str:
                    if given["value"] == "running" and given["epoch"] != 5:
                        fence.fenced_write(db, first)  # noqa: B023 - used within the loop
                    return fence.fenced_write(db, given)

                self.run_worker(["job-1"], write=landed_first)
                self.assertEqual((self.runs, self.stored()),
                                 ([], (first["epoch"], first["sequence"], first["value"])))
                self.assertIsNone(self.authority().current("job-1", now=0))  # released

    def test_a_worker_looks_before_acquiring_and_again_once_granted(self) -> None:
        fence.fenced_write(self.db, write("job-1", 1, 2, "done"))
        finished = self.faulty()

        def finished_meanwhile(path: str) -> LeaseAuthority:
            authority = finished(path)
            acquire = authority.acquire

            def acquired(resource: str, holder: str, *, now: int, ttl: int) -> Lease:
                fence.fenced_write(self.db, write(resource, 1, 2, "done"))
                return acquire(resource, holder, now=now, ttl=ttl)
            authority.acquire = acquired  # type: ignore[method-assign]
            return authority

        writes: list[object] = []

        def recorded(db: sqlite3.Connection, given: dict[str, object]) -> str:
            writes.append(given)
            return "applied"

        self.run_worker(["job-1", "job-2"], authority=finished_meanwhile, write=recorded)
        self.assertEqual((writes, self.runs), ([], []))
        authority = self.authority()
        self.assertEqual(authority.acquire("job-1", "probe", now=0, ttl=1).epoch, 1)  # no grant
        self.assertEqual(authority.acquire("job-2", "probe", now=0, ttl=1).epoch, 2)  # released

    def test_store_errors_are_tried_again_and_a_grant_whose_answer_was_lost_adopted(
            self) -> None:
        failing = {"n": 0}

        def locked_twice(db: sqlite3.Connection, given: dict[str, object]) -> str:
            failing["n"] += 1
            if failing["n"] == 1:
                raise sqlite3.OperationalError("database is locked")
            answer = fence.fenced_write(db, given)
            if failing["n"] == 2:
                raise sqlite3.OperationalError("disk I/O error")  # after the COMMIT
            return answer

        self.run_worker(["job-1"], write=locked_twice,
                        authority=self.faulty(acquire=["after"], release=["before", "after"]))
        self.assertEqual((self.runs, self.stored()), (["job-1"], (1, 2, "done")))
        self.assertIsNone(self.authority().current("job-1", now=0))

    def test_a_worker_whose_store_keeps_failing_leaves_the_job_and_takes_the_next(
            self) -> None:
        def done_never_stored(db: sqlite3.Connection, given: dict[str, object]) -> str:
            if given == write("job-1", 1, 2, "done"):
                raise sqlite3.OperationalError("database is locked")
            return fence.fenced_write(db, given)

        self.run_worker(["job-1", "job-2"], write=done_never_stored,
                        authority=self.faulty(release=["before"] * worker.TRIES))
        self.assertEqual((self.stored("job-1"), self.stored("job-2")),
                         ((1, 1, "running"), (1, 2, "done")))
        lease = self.authority().current("job-1", now=0)  # left to expire at its tick
        self.assertEqual((lease and lease.holder, lease and lease.expires_at), ("A", worker.TTL))

    def test_the_heartbeat_renews_so_a_job_longer_than_the_ttl_completes(self) -> None:
        def long(job: str, heartbeat: worker.Heartbeat) -> None:
            for _ in range(3 * worker.TTL):
                self.tick += 1
                self.assertTrue(heartbeat())

        self.run_worker(["job-1"], do=long)
        self.assertEqual(self.stored(), (1, 2, "done"))

    def test_the_heartbeat_says_stop_once_the_lease_is_lost_and_done_is_not_written(
            self) -> None:
        said: list[bool] = []

        def overtaken(job: str, heartbeat: worker.Heartbeat) -> None:
            self.tick += worker.TTL  # paused past its lease; another holder takes the job
            self.authority().acquire(job, "B", now=self.tick, ttl=worker.TTL)
            said.append(heartbeat())

        self.run_worker(["job-1"], do=overtaken)
        self.assertEqual((said, self.stored()), ([False], (1, 1, "running")))


class PoolTests(unittest.TestCase):
    def test_with_faults_the_fenced_pool_loses_nothing_and_the_blind_one_does(self) -> None:
        jobs = pool.names(12)
        for blind in (False, True):
            with self.subTest(blind=blind):
                found = pool.run_pool(3, len(jobs), pool.plan(jobs, 7), blind, progress=None)
                lost, reverted = (sum(judged[i] for judged in found["judged"].values())
                                  for i in (0, 1))
                unfinished = [job for job, judged in found["judged"].items()
                              if judged[2] != "done"]
                self.assertEqual(found["errors"], {})
                self.assertEqual((lost + reverted > 0, unfinished), (blind, []))

    def test_the_command_line_names_each_failure_and_refuses_a_bad_argument_in_one_line(
            self) -> None:
        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, str(HERE / "pool.py"), *args], text=True,
                                  capture_output=True, timeout=120, check=False)

        for args in (["--workers", "0"], ["--jobs", "x"], ["--seed"], ["--speed", "2"]):
            with self.subTest(args=args):
                done = run(*args)
                self.assertEqual(done.returncode, pool.EXIT_USAGE)
                self.assertRegex(done.stderr, r"^pool: [^\n]+\n$")
        done = run("--workers", "2", "--jobs", "6", "--faults", "--seed", "1", "--blind")
        self.assertEqual(done.returncode, pool.EXIT_FAILED, done.stderr)
        self.assertRegex(done.stderr, r"pool: job-\d (lost \d update|was set back from done)")
        self.assertRegex(done.stdout, r"\nlost updates \d+, reverted done \d+, unfinished 0")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        unittest.main()
