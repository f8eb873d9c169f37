"""Ctrl-C at random moments against acquire, write and release: none may leave a transaction
open, a lock held, or a hang.

    python3 .ci/interrupts.py [COUNT] [SEED]

A timer raises KeyboardInterrupt (as a Ctrl-C does) at a random moment, COUNT times (1,000 by
default), while the library's objects are opened in a `with` block, as README shows, and used
in a loop.  After each interrupt: neither object is inside a transaction or holds its lock, and
another connection takes the file's write lock at once.  The run is in a process of its own,
bounded: a hang is a failure.  Exit 0 when all hold; 1 naming the first that did not.
"""

import os
import pathlib
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import leases  # the library beside README

BOUND = 60.0  # seconds: a hang (a run takes about 5 s), never an order


def left_open(databases: list[leases._Database], path: str) -> str | None:
    """What an interrupted call left behind, if anything."""
    for database in databases:
        if database._lock.locked():
            return f"{type(database).__name__}'s lock is held"
        if database._connection is not None and database._connection.in_transaction:
            return f"{type(database).__name__} is inside a transaction"
    with sqlite3.connect(path, timeout=0, isolation_level=None) as other:
        other.execute("BEGIN IMMEDIATE")  # "database is locked" if a transaction is left
        other.execute("ROLLBACK")
    return None


def interrupted(count: int, seed: int) -> int:
    """In this process: `count` interrupts; the exit code."""
    chosen = random.Random(seed)
    signal.signal(signal.SIGALRM, signal.default_int_handler)  # the timer's Ctrl-C
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "leases.sqlite3")
        opened: list[leases._Database] = []
        for number in range(count):
            try:
                signal.setitimer(signal.ITIMER_REAL, chosen.uniform(0.0001, 0.004))
                while True:  # until the timer's Ctrl-C lands
                    with leases.LeaseAuthority(path) as authority, leases.Receiver(path) as receiver:
                        opened[:] = [authority, receiver]
                        for tick in range(number * 1000, number * 1000 + 1000):
                            lease = authority.acquire("job", "A", now=tick, ttl=1)
                            receiver.write("job", lease.epoch, "done")
                            authority.release(lease)
            except KeyboardInterrupt:
                pass
            problem = left_open(opened, path)
            if problem:
                print(f"interrupts: interrupt {number} (seed {seed}): {problem}")
                return 1
            for database in opened:
                database.close()
    print(f"interrupts: {count} Ctrl-Cs at random moments (seed {seed}): no transaction left "
          "open, no lock held, no hang")
    return 0


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else random.randrange(10**6)
    if os.environ.get("INTERRUPTS_CHILD"):
        return interrupted(count, seed)
    try:
        return subprocess.run([sys.executable, __file__, str(count), str(seed)], timeout=BOUND,
                              env={**os.environ, "INTERRUPTS_CHILD": "1"}, check=False).returncode
    except subprocess.TimeoutExpired:
        print(f"interrupts: hung past {BOUND:g} s (seed {seed})")
        return 1


if __name__ == "__main__":
    sys.exit(main())
