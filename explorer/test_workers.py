"""Tests of --worker: README's recipe passes, each breakage of it fails at the bound the page
gives (its witness failing again from a fresh start) or passes where a rule of the recipe
covers it, the search's counts equal an independent brute force's, and misuse is one line.

Run from the repository's root: `python3 explorer/test_workers.py`.  The root's
`python3 -m unittest discover` does not find these (explorer/ is no package).
"""

import contextlib
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import unittest
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, ROOT, os.path.join(ROOT, "recipes")]  # the explorer, leases.py, worker.py

import fence
import worker
import workers
from workers import Bound

from leases import LeaseAuthority

# SQLite's syncs to disk were most of these tests' time; no test is about durability, so their
# files (and those of the explorers they start) go in memory where the machine has a folder
# there, one of this run's own (made as the run starts, not in the processes it spawns,
# which import this module too): tearDownModule fails the run if a test left anything in it.
MEMORY: str | None = None


def in_memory() -> None:
    global MEMORY
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        MEMORY = tempfile.mkdtemp(prefix="explorer-tests-", dir="/dev/shm")
        tempfile.tempdir = os.environ["TMPDIR"] = MEMORY


def tearDownModule() -> None:
    if MEMORY is not None:
        left = os.listdir(MEMORY)
        shutil.rmtree(MEMORY)
        if left:
            raise AssertionError(f"left behind in the temporary folder: {left}")

RECIPE = Bound("worker:work", crashes=0)  # the default, less its crashes
# Each breakage, the bound the page gives for it, and the verdict that catches it.
BROKEN = {
    "DoneNotFinal": (RECIPE, "done reverted"),
    "BlindWrite": (RECIPE, "lost update"),
    "ReleaseBeforeDone": (RECIPE, "needless repeat"),
    "StaleIgnored": (RECIPE, "unfenced work"),
    "StoreErrorUnhandled": (replace(RECIPE, errors=1, preemptions=0), "exception"),
}
COVERED = ("NoSecondLook", "PlainBegin")  # a rule of the recipe covers each: README says which


def brute_force(bound: Bound) -> Counter[str]:
    """The interleavings of `bound` with no fault, counted by a plain recursion over the tree
    of every choice, each prefix played afresh, its preemptions counted here from the tokens
    (a switch away from the worker that ran last, while it could go on)."""
    counts: Counter[str] = Counter()

    def mover(token: str) -> str | None:  # the worker a choice runs: not an offer, not a kill
        return None if ">" in token or token.endswith("!") else token.lstrip("+")[0]

    def walk(prefix: tuple[str, ...], preempted: int) -> None:
        at = workers.play(bound, tokens=prefix, stop=len(prefix), bounded=False, faults=False)
        if at.open is None:
            counts[workers.kind(at)] += 1
            return
        ran = [m for m in map(mover, prefix) if m is not None]
        last = ran[-1] if ran else None
        for token in at.open:
            switch = mover(token) not in (None, last) and last is not None and any(
                mover(other) == last for other in at.open)
            if bound.preemptions is None or preempted + switch <= bound.preemptions:
                walk((*prefix, token), preempted + switch)

    with workers.installed(memory=True):
        walk((), 0)
    return counts


def idle(queue: Iterable[str], me: str, clock: object, do: object, leases: str,
         jobs: str) -> None:
    """A worker that takes each job offered and leaves it: "unfinished" is for it."""
    for _ in queue:
        pass


def raises(queue: Iterable[str], me: str, clock: object, do: object, leases: str,
           jobs: str) -> None:
    """A worker that raises before it looks at its queue: it is gone, and not replaced."""
    raise RuntimeError(f"{me} cannot start")


def gives_up(queue: Iterable[str], me: str, clock: Callable[[], int], do: object,
             leases: str, jobs: str) -> None:
    """A worker that reads the clock for its first job, then raises."""
    for job in queue:
        clock()
        raise RuntimeError(f"{me} gives up on {job}")


def stuck(queue: Iterable[str], me: str, clock: object, do: object, leases: str,
          jobs: str) -> None:
    """A worker whose first job never ends."""
    for _ in queue:
        threading.Event().wait()


def quits(queue: Iterable[str], me: str, clock: object, do: object, leases: str,
          jobs: str) -> None:
    """A worker that returns at once, its queue untouched: no one is left to do the job."""


def replacing_write(db: sqlite3.Connection, write: dict[str, Any]) -> str:
    """The recipe fence's rules, decided in Python inside BEGIN IMMEDIATE, stored by INSERT OR
    REPLACE (SQLite deletes the row, then inserts): correct, as the recipe's is."""
    new = (write["epoch"], write["sequence"], write["value"])
    db.execute("BEGIN IMMEDIATE")
    try:
        row = db.execute("SELECT epoch, sequence, value FROM fenced WHERE resource = ?",
                         (write["resource"],)).fetchone()
        if row is None or (row[2] != "done" and new[:2] > tuple(row[:2])):
            db.execute("INSERT OR REPLACE INTO fenced VALUES (?, ?, ?, ?)",
                       (write["resource"], *new))
            answer = "applied"
        else:
            answer = "replay" if tuple(row) == new else "done" if row[2] == "done" else \
                "stale" if tuple(row[:2]) != new[:2] else "conflict"
        db.execute("COMMIT")
    finally:
        if db.in_transaction:
            db.execute("ROLLBACK")
    return answer


def replacing(queue: Iterable[str], me: str, clock: Callable[[], int], do: worker.Work,
              leases: str, jobs: str) -> None:
    worker.work(queue, me, clock, do, leases, jobs, write=replacing_write)


def per_job(queue: Iterable[str], me: str, clock: Callable[[], int], do: worker.Work,
            leases: str, jobs: str) -> None:
    """The recipe's worker opening the authority anew for each job (its check of the file runs
    a pragma function: SQLite runs a statement inside the one stopped before)."""
    with contextlib.closing(worker.open_jobs(jobs)) as db:
        for job in queue:
            with LeaseAuthority(leases) as authority, contextlib.suppress(worker.GaveUp):
                worker.run_job(authority, db, job, me, clock, do, fence.fenced_write)


_started = [0]  # how many workers this process started: what `forgetful` rests on


def forgetful(queue: Iterable[str], me: str, clock: Callable[[], int], do: worker.Work,
              leases: str, jobs: str) -> None:
    """The recipe's worker, reading the clock once more in every third worker started in
    the process: its answers rest on more than the files and the calls."""
    _started[0] += 1
    extra = _started[0] % 3 == 0

    def read() -> int:
        if extra:
            clock()
        return clock()
    worker.work(queue, me, read, do, leases, jobs)


def explorer(*args: str, folder: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, os.path.join(HERE, "explore.py"), *args], text=True,
                          capture_output=True, timeout=120, check=False, cwd=folder)


class WorkerTests(unittest.TestCase):
    def test_readmes_recipe_passes_and_the_table_counts_its_work_runs(self) -> None:
        found = workers.explore_workers(Bound("worker:work"))  # the default, as CI's
        self.assertEqual(found["failed"], ())
        self.assertEqual(found["counts"], {"plain": 390, "crash": 1712})
        self.assertEqual(found["runs"][0], {1: 628, 2: 1240, 3: 234})  # explorer/README's table
        with self.subTest("a store error before each statement that takes the write lock"):
            found = workers.explore_workers(replace(RECIPE, preemptions=0, errors=1))
            self.assertEqual((found["failed"], found["counts"]),
                             ((), {"plain": 23, "store error": 118}))

    def test_each_breakage_fails_at_its_bound_and_its_witness_fails_again_played_afresh(
            self) -> None:
        for name, (bound, verdict) in BROKEN.items():
            with self.subTest(breakage=name):
                bound = replace(bound, spec=f"broken_workers:{name}")
                found = workers.explore_workers(bound)
                self.assertIn(verdict, [v for v, _ in found["failed"]])
                again = re.search(r"--replay (.+)$", found["witness"][-1])
                assert again is not None
                text, ok = workers.replay(bound, shlex.split(again.group(1))[0])
                self.assertFalse(ok)
                self.assertIn(f"  {verdict}: FAILED", text)

    def test_a_worker_that_leaves_its_jobs_fails_unfinished_after_the_quiet_offer(self) -> None:
        found = workers.explore_workers(Bound("test_workers:idle", crashes=0, jumps=0))
        self.assertEqual(found["failed"], (("unfinished", "job-1"),))
        self.assertIn("every worker waits: job-1 is offered to A, quiet", "\n".join(
            found["witness"]))

    def test_breakages_a_rule_of_the_recipe_covers_pass_at_the_same_bound(self) -> None:
        # NoSecondLook: a stored "done" is final, so the grant's write of "running" is answered
        # "done" and the work is not run.  PlainBegin: the fence's first statement is its
        # conditional write, so a deferred BEGIN takes the write lock before reading anything.
        for name in COVERED:
            with self.subTest(breakage=name):
                found = workers.explore_workers(replace(RECIPE, spec=f"broken_workers:{name}"))
                self.assertEqual(found["failed"], ())

    def test_the_search_counts_every_interleaving_a_plain_recursion_counts(self) -> None:
        bound = Bound("worker:work", preemptions=None, jumps=0, crashes=0)
        with workers.installed(memory=True):
            searched = sum(1 for _ in workers.searched(bound))
        self.assertEqual((searched, brute_force(bound)), (73, {"plain": 73}))
        bounded = replace(bound, preemptions=1)
        with workers.installed(memory=True):
            searched = sum(1 for _ in workers.searched(bounded))
        self.assertEqual((searched, brute_force(bounded)), (19, {"plain": 19}))

    def test_misuse_is_one_line_and_exit_2(self) -> None:
        for args in (["--worker", "worker"], ["--worker", "nowhere:work"],
                     ["--worker", "worker:nothing"], ["--worker", "worker:look"],
                     ["--worker", "worker:work", "--workers", "0"],
                     ["--worker", "worker:work", "--jobs", "0"],
                     ["--worker", "worker:work", "--timeout", "0"],
                     ["--worker", "worker:work", "--holders", "2"],
                     ["--worker", "worker:work", "--statements"],
                     ["--worker", "worker:work", "--replay", "B? job-9>Z"],
                     ["--worker", "worker:work", "--replay", " ".join(["A"] * 60)],
                     ["--jobs", "2"], ["--crashes", "0"], ["--statements", "--replay", " "],
                     ["--ttl", "1000"], ["--no-such"]):
            with self.subTest(args=args):
                done = explorer(*args)
                self.assertEqual(done.returncode, 2, done.stderr)
                self.assertRegex(done.stderr, r"^explore: [^\n]+\n$")

    def test_a_worker_that_raises_is_a_verdict_and_is_not_replaced(self) -> None:
        for name, witness in (("raises", ""), ("gives_up", "A job-1>B B")):
            with self.subTest(worker=name):
                found = workers.explore_workers(Bound(f"test_workers:{name}"))
                self.assertEqual(found["failed"], (("unfinished", "job-1"), ("exception", "A"),
                                                   ("exception", "B")))
                self.assertTrue(found["witness"][-1].endswith(
                    f"--replay {shlex.quote(witness)}"), found["witness"])
                self.assertFalse(workers.replay(Bound(f"test_workers:{name}"), witness)[1])

    def test_a_worker_that_returns_at_once_fails_unfinished(self) -> None:
        found = workers.explore_workers(Bound("test_workers:quits", crashes=0, jumps=0))
        self.assertEqual(found["failed"], (("unfinished", "job-1"),))

    def test_correct_workers_written_otherwise_pass(self) -> None:
        for name in ("replacing", "per_job"):
            with self.subTest(worker=name):
                found = workers.explore_workers(Bound(f"test_workers:{name}", preemptions=0))
                self.assertEqual(found["failed"], ())

    def test_your_fence_beside_your_worker_is_the_one_it_imports_and_its_ttl_is_checked(
            self) -> None:
        folder = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, folder)
        recipes = os.path.join(ROOT, "recipes")
        shutil.copy(os.path.join(recipes, "worker.py"), os.path.join(folder, "mine.py"))
        with open(os.path.join(recipes, "fence.py"), encoding="utf-8") as file:
            blind = file.read().replace("\n  WHERE fenced.value <> 'done'\n    AND (excluded.epoch,"
                                        " excluded.sequence) > (fenced.epoch, fenced.sequence)",
                                        "")
        self.assertNotIn("WHERE fenced", blind)
        with open(os.path.join(folder, "fence.py"), "w", encoding="utf-8") as file:
            file.write(blind)
        done = explorer("--worker", "mine:work", "--crashes", "0", folder=folder)
        self.assertEqual(done.returncode, 1, done.stderr)
        self.assertIn("lost update: FAILED, job-1", done.stdout)
        with open(os.path.join(folder, "big.py"), "w", encoding="utf-8") as file:
            file.write("from mine import work\nTTL = 1000\n")
        done = explorer("--worker", "big:work", folder=folder)
        self.assertEqual(done.returncode, 2, done.stderr)
        self.assertRegex(done.stderr, r"^explore: .*TTL is 1000, [^\n]+\n$")

    def test_a_worker_whose_answers_rest_on_more_than_its_files_is_one_line_and_exit_1(
            self) -> None:
        done = explorer("--worker", "test_workers:forgetful")
        self.assertEqual((done.returncode, done.stdout), (1, ""), done.stderr)
        self.assertRegex(done.stderr, r"^explore: [^\n]+ an answer rests on more than the "
                         r"files and the calls\n$")

    def test_a_hang_names_the_worker_and_its_step_and_replays_from_any_folder(self) -> None:
        folder = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, folder)
        done = explorer("--worker", "test_workers:stuck", "--timeout", "0.5", folder=folder)
        self.assertEqual(done.returncode, 1, done.stderr)
        self.assertEqual(done.stdout.splitlines()[0],
                         "hang: A's start on job-1 gave no answer within 0.5 s")
        again = shlex.split(done.stdout.splitlines()[-1].split("again: ", 1)[1])
        self.assertEqual(again[1], os.path.join(HERE, "explore.py"))  # as reached from there
        replayed = subprocess.run([sys.executable, *again[1:]], text=True, capture_output=True,
                                  timeout=120, check=False, cwd=folder)
        self.assertEqual(replayed.stdout.splitlines()[0], done.stdout.splitlines()[0])

    def test_the_command_line_shows_a_witness_that_replays_to_the_same_failure(self) -> None:
        done = explorer("--worker", "broken_workers:BlindWrite", "--crashes", "0")
        self.assertEqual(done.returncode, 1, done.stderr)
        self.assertIn("lost update: FAILED, job-1", done.stdout)
        again = shlex.split(done.stdout.splitlines()[-1].split("again: ", 1)[1])
        replayed = explorer(*again[2:])
        self.assertEqual(replayed.returncode, 1, replayed.stderr)
        self.assertIn("lost update: FAILED, job-1", replayed.stdout)
        # A transaction that took the write lock is one choice, yet each statement is shown,
        # and under its COMMIT, what it stored.
        self.assertRegex(replayed.stdout, r"\n  tick +\d+  A INSERT INTO fenced .*\n(.*\n)*"
                         r"  tick +\d+  A COMMIT\n +stored job-1 ")


if __name__ == "__main__":
    in_memory()
    with contextlib.suppress(KeyboardInterrupt):
        unittest.main()
