"""Measure `run_experiment.py --check` against its physical floor, in paired runs.

The floor is the least any run of the experiment must do: one interpreter spawns six children
at once; each imports leases.py, waits on one Event, commits one BEGIN IMMEDIATE transaction
(a receiver's write) and reports on a Queue.  Each pair runs the floor and the --check command
back to back, as whole commands, so that both meet the same machine load.

    python3 .ci/floor.py [PAIRS]

Prints each pair, then the medians and the median of the per-pair ratios.  Not run by CI: a
timing is a measurement of this machine, not a property of the code.
"""

import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _child(path: str, go: "multiprocessing.synchronize.Event", done: "multiprocessing.Queue[int]",
           number: int) -> None:
    import leases

    with leases.Receiver(path) as receiver:
        go.wait(60)
        receiver.write("floor", number + 1, "v")
    done.put(number)


def floor() -> None:
    """The floor itself, run as `python3 .ci/floor.py --floor`."""
    sys.path.insert(0, ROOT)
    import leases

    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "floor.sqlite3")
        leases.Receiver(path).close()
        go, done = context.Event(), context.Queue()
        children = [
            context.Process(target=_child, args=(path, go, done, number)) for number in range(6)
        ]
        for child in children:
            child.start()
        go.set()
        for _ in children:
            done.get(timeout=60)
        for child in children:
            child.join(60)


def _seconds(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=120)
    return time.perf_counter() - started


def main() -> None:
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    floors, checks = [], []
    for number in range(pairs):
        floors.append(_seconds([sys.executable, os.path.abspath(__file__), "--floor"]))
        checks.append(_seconds([sys.executable, "run_experiment.py", "--check", "results.json"]))
        print(f"pair {number + 1}: floor {floors[-1]:.3f} s, --check {checks[-1]:.3f} s, "
              f"ratio {checks[-1] / floors[-1]:.2f}")
    ratios = [check / low for check, low in zip(checks, floors)]
    print(f"median: floor {statistics.median(floors):.3f} s, --check "
          f"{statistics.median(checks):.3f} s, ratio {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    floor() if sys.argv[1:] == ["--floor"] else main()
