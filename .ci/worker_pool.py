"""Run README's worker recipe as a pool: 4 processes, one clock, two workers paused past their lease.

    python3 .ci/worker_pool.py [README]

README's `# fence.py` and `# worker.py` blocks are saved, with leases.py, in a temporary folder.
The coordinator (this process) owns the clock and an at-least-once queue: every job is put on it
twice.  Before each "done" write a worker asks the coordinator, which stops the first two
workers to ask (a handshake, no sleep): it moves its clock past their lease, offers the job again,
and lets a stopped worker go on only once another worker's "done" at a higher epoch is stored.
The pool's first grant commits but raises, as if its answer were lost, so that the retry meets
its own grant.  The pool
is run twice: with README's fence, then with a blind write in its place.  The fenced run must lose
no update, grant at most 2 epochs per job, and adopt a grant; the blind run must lose an update
(so that the check can fail).  Timeouts only catch a hang.
"""

import importlib
import multiprocessing
import os
import pathlib
import re
import shutil
import sqlite3
import sys
import tempfile
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
JOBS, WORKERS, PAUSES = 12, ("w1", "w2", "w3", "w4"), 2
BOUND = 120.0  # seconds: a hang, never an order


def blocks(readme: str) -> dict[str, str]:
    """README's python blocks whose first line is a comment naming a file, by that name."""
    found = re.findall(r"^```python\n(# (\w+\.py)\b.*?\n)```", readme, re.MULTILINE | re.DOTALL)
    return {name: text for text, name in found}


def child(folder: str, me: str, fenced: bool, tick: Any, deliveries: Any, reports: Any,
          go: Any, lose: Any) -> None:
    """One worker: README's work(), with handshakes before each "done" and a lost answer."""
    sys.path.insert(0, folder)
    worker: Any = importlib.import_module("worker")  # from README's blocks

    fenced_write, acquire = worker.fenced_write, worker.LeaseAuthority.acquire

    def write(db: sqlite3.Connection, step: dict[str, Any]) -> str:
        if step["value"] == "done":  # the coordinator may pause it here, before the write
            reports.put(("done?", me, step["resource"], step["epoch"]))
            go.get(timeout=BOUND)
        if fenced:
            answer = str(fenced_write(db, step))
        else:  # the blind write: whatever comes last stays
            db.execute("INSERT OR REPLACE INTO fenced VALUES (:resource, :epoch, :sequence, :value)",
                       step)
            answer = "applied"
        reports.put(("wrote", me, step["resource"], step["epoch"], step["sequence"], answer))
        return answer

    def acquire_once_lost(self: Any, job: str, holder: str, **kwargs: Any) -> Any:
        try:
            lease = acquire(self, job, holder, **kwargs)
        except worker.LeaseHeld as held:
            if held.lease.holder == holder:  # the retry meets its own grant
                reports.put(("adopted", me, job, held.lease.epoch))
            raise
        with lose.get_lock():  # the pool's first grant loses its answer, once committed
            if lose.value:
                lose.value = 0
                raise worker.LeaseError("the answer was lost after the COMMIT")
        return lease

    worker.fenced_write = write
    worker.LeaseAuthority.acquire = acquire_once_lost

    def queue_() -> Any:
        while (job := deliveries.get(timeout=BOUND)) is not None:
            yield job
            reports.put(("finished", me, job))

    worker.work(queue_(), me, lambda: tick.value, lambda job: None,
                os.path.join(folder, "leases.sqlite3"), os.path.join(folder, "jobs.sqlite3"))


def pool(folder: str, *, fenced: bool) -> dict[str, int]:
    """One run of the pool; its counts."""
    for name in ("leases.sqlite3", "jobs.sqlite3"):
        pathlib.Path(folder, name).unlink(missing_ok=True)
    sys.path.insert(0, folder)
    fence, leases, worker = map(importlib.import_module, ("fence", "leases", "worker"))

    jobs = [f"job-{number}" for number in range(JOBS)]
    store = sqlite3.connect(os.path.join(folder, "jobs.sqlite3"), isolation_level=None)
    store.execute(fence.TABLE)
    store.executemany("INSERT INTO fenced VALUES (?, 0, 0, 'queued')", [(job,) for job in jobs])
    context = multiprocessing.get_context("spawn")
    tick, lose = context.Value("q", 0), context.Value("b", 1)
    deliveries, reports = context.Queue(), context.Queue()
    go = {me: context.Queue() for me in WORKERS}
    workers = [context.Process(target=child, name=me, args=(
        folder, me, fenced, tick, deliveries, reports, go[me], lose)) for me in WORKERS]
    for process in workers:
        process.start()
    highest: dict[str, tuple[int, int]] = {}  # each job's highest (epoch, sequence) applied
    paused: list[tuple[str, str, int]] = []  # (job, worker, epoch) stopped before "done"
    counts = {"pauses": 0, "adopted": 0, "stale": 0}
    outstanding = 0
    for job in jobs + jobs:  # at least once: each job twice
        deliveries.put(job)
        outstanding += 1
    try:
        while True:
            kind, me, job, *rest = reports.get(timeout=BOUND)
            if kind == "finished":
                outstanding -= 1
            elif kind == "done?" and counts["pauses"] < PAUSES and me not in {
                    who for _, who, _ in paused}:
                counts["pauses"] += 1
                paused.append((job, me, rest[0]))
                with tick.get_lock():
                    tick.value += worker.TTL + 1  # past the paused worker's lease
                deliveries.put(job)
                outstanding += 1
            elif kind == "done?":
                go[me].put("go")
            elif kind == "adopted":
                counts["adopted"] += 1
            elif kind == "wrote":
                epoch, sequence, answer = rest
                counts["stale"] += answer == "stale"
                if answer == "applied":
                    highest[job] = max(highest.get(job, (0, 0)), (epoch, sequence))
                for stopped in [one for one in paused if one[0] == job and one[2] < epoch
                                and sequence == 2 and answer == "applied"]:
                    paused.remove(stopped)  # a newer "done" is stored: it goes on
                    go[stopped[1]].put("go")
            if outstanding == 0 and not paused:
                left = [job for job, in store.execute("SELECT resource FROM fenced WHERE value != 'done'")]
                if not left:
                    break
                for job in left:  # leases lost to the clock: offered again
                    deliveries.put(job)
                    outstanding += 1
        for _ in workers:
            deliveries.put(None)
        for process in workers:
            process.join(BOUND)
            if process.exitcode != 0:
                raise SystemExit(f"worker {process.name} exited {process.exitcode}")
    finally:
        for process in workers:
            if process.is_alive():
                process.kill()
                process.join()
    stored = {job: (epoch, sequence) for job, epoch, sequence
              in store.execute("SELECT resource, epoch, sequence FROM fenced")}
    store.close()
    counts["lost updates"] = sum(stored[job] < pair for job, pair in highest.items())
    with leases.LeaseAuthority(os.path.join(folder, "leases.sqlite3")) as authority:
        counts["grants"] = sum(authority.acquire(job, "census", now=tick.value + 100, ttl=1).epoch
                               - 1 for job in jobs)
    counts["jobs"] = JOBS
    return counts


def main() -> int:
    readme = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "README.md")
    found = blocks(readme.read_text(encoding="utf-8"))
    missing = {"fence.py", "worker.py"} - found.keys()
    if missing:
        print(f"worker pool: {readme} has no python block starting '# {min(missing)}'")
        return 1
    folder = tempfile.mkdtemp(prefix="worker-pool-")
    try:
        for name, text in found.items():
            pathlib.Path(folder, name).write_text(text, encoding="utf-8")
        shutil.copy(ROOT / "leases.py", folder)
        fenced, blind = pool(folder, fenced=True), pool(folder, fenced=False)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"worker pool, {len(WORKERS)} processes, README's fence: {fenced}")
    print(f"worker pool, the same with a blind write: {blind}")
    problems = [f"{fenced['lost updates']} lost updates"] if fenced["lost updates"] else []
    problems += [f"{fenced['grants']} grants for {JOBS} jobs"] if fenced["grants"] > 2 * JOBS else []
    problems += ["no paused worker"] if fenced["pauses"] != PAUSES else []
    problems += ["no grant adopted"] if not fenced["adopted"] else []
    problems += ["the blind write lost no update"] if not blind["lost updates"] else []
    print(f"worker pool: {'; '.join(problems) or 'ok'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
