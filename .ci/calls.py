"""Measure acquire + release against a bare BEGIN IMMEDIATE / UPDATE / COMMIT pair on the same
file, interleaved in rounds so that both meet the same machine load.

    python3 .ci/calls.py [ROUNDS]

Prints the medians per pair of transactions and their ratio.  Not run by CI: a timing is a
measurement of this machine, not a property of the code.
"""

import os
import sqlite3
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import leases  # the repository's, found through the line above


def main() -> None:
    rounds, calls = int(sys.argv[1]) if len(sys.argv) > 1 else 21, 200
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "calls.sqlite3")
        authority = leases.LeaseAuthority(path)
        bare = sqlite3.connect(path, isolation_level=None)
        bare.execute("INSERT INTO leases VALUES ('bare', 'A', 1, 10)")
        library, baseline = [], []
        for _ in range(rounds):
            started = time.perf_counter()
            for _ in range(calls):
                authority.release(authority.acquire("library", "A", now=0, ttl=10))
            library.append((time.perf_counter() - started) / calls)
            started = time.perf_counter()
            for _ in range(calls):
                for _ in range(2):
                    bare.execute("BEGIN IMMEDIATE")
                    bare.execute("UPDATE leases SET epoch = epoch + 1 WHERE resource = 'bare'")
                    bare.execute("COMMIT")
            baseline.append((time.perf_counter() - started) / calls)
        authority.close()
        bare.close()
    mine, floor = statistics.median(library), statistics.median(baseline)
    print(f"acquire + release {mine * 1e6:.0f} us, bare pair {floor * 1e6:.0f} us, "
          f"ratio {mine / floor:.2f}")


if __name__ == "__main__":
    main()
