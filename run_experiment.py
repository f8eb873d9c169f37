"""Replay the lease scenarios with spawned processes and write the evidence as canonical JSON.

A scenario is data: a timeline of steps, each saying which worker acquires or writes at which
tick.  The engine spawns one process per worker.  A worker does nothing until the engine sets the
Event of its next step; it then performs that one step against the shared SQLite database and
reports the result on a Queue.  The engine releases one step at a time and waits for its report,
so the order of events comes from these handshakes alone, never from timing.  The scenarios have
databases of their own and run concurrently; that changes no byte of the evidence.

Exit codes: 0 success (and, with --check, reproduced); 1 the evidence differs from --check;
2 bad arguments, or a file that cannot be read or written; 3 a scenario failed or hung;
130 interrupted.  A run that fails or is interrupted stops all its workers and writes nothing.
"""

import argparse
import concurrent.futures
import contextlib
import enum
import json
import multiprocessing
import os
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from leases import Lease, LeaseAuthority, Receiver, WriteResult

if TYPE_CHECKING:  # only for annotations: the spawn context makes the real objects
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Event

__all__ = [
    "DEFAULT_TIMEOUT",
    "SCENARIOS",
    "Action",
    "ExperimentError",
    "Scenario",
    "Step",
    "canonical_json",
    "differences",
    "main",
    "run_scenarios",
    "run_worker",
    "timeline",
]

EXIT_OK = 0
EXIT_DIFFERENT = 1
EXIT_USAGE = 2
EXIT_FAILED = 3
EXIT_INTERRUPTED = 130  # the shell's convention for Ctrl-C

# Only bounds a hung run; no step waits for it to pass.
DEFAULT_TIMEOUT = 60.0
# How often a waiting engine looks up to see whether the run was stopped or a worker died.
_SLICE_SECONDS = 0.1

RESOURCE = "quarterly-report"

# What a worker reports after each step: (step index, event, None), or (index, None, error).
_Report = tuple[int | None, dict[str, Any] | None, str | None]


class Action(str, enum.Enum):
    ACQUIRE = "acquire"  # ask the authority for a lease at `tick`, for `ttl` ticks
    WRITE = "write"  # send `value` to the receiver with the epoch of the worker's lease


@dataclass(frozen=True)
class Step:
    """One thing one worker does, at one tick of logical time."""

    actor: str
    action: Action
    tick: int
    ttl: int | None = None  # acquisitions only
    value: str | None = None  # writes only

    def __str__(self) -> str:
        return f"{self.actor} {self.action.value} at tick {self.tick}"


@dataclass(frozen=True)
class Scenario:
    """A named timeline: the engine releases its steps one at a time, in this order."""

    name: str
    fenced: bool
    summary: str
    steps: tuple[Step, ...]

    @property
    def actors(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(step.actor for step in self.steps))


# A holds a lease from tick 0 to tick 10; B takes over at tick 10, the exact tick A's lease
# expires.  A then resumes late, still believing it holds the lease.
_TAKEOVER = (
    Step("A", Action.ACQUIRE, tick=0, ttl=10),
    Step("B", Action.ACQUIRE, tick=10, ttl=10),
)
_A_VALUE = "report by A"
_B_VALUE = "report by B"
_B_WRITES_THEN_A_LATE = (
    *_TAKEOVER,
    Step("B", Action.WRITE, tick=10, value=_B_VALUE),
    Step("A", Action.WRITE, tick=11, value=_A_VALUE),
)

SCENARIOS = (
    Scenario(
        name="unfenced_receiver",
        fenced=False,
        summary="A pauses holding epoch 1; B takes over with epoch 2 at A's expiry tick and "
        "writes; then A resumes late and writes with epoch 1. The receiver is unfenced.",
        steps=_B_WRITES_THEN_A_LATE,
    ),
    Scenario(
        name="fenced_receiver",
        fenced=True,
        summary="The same interleaving as unfenced_receiver, against a fenced receiver.",
        steps=_B_WRITES_THEN_A_LATE,
    ),
    Scenario(
        name="expiry_before_receiver_observation_gap",
        fenced=True,
        summary="B takes over with epoch 2 at A's expiry tick but pauses before writing; A "
        "resumes late and writes with epoch 1 to a fenced receiver that has not seen epoch 2; "
        "then B writes, then A retries the same write.",
        steps=(
            *_TAKEOVER,
            Step("A", Action.WRITE, tick=11, value=_A_VALUE),
            Step("B", Action.WRITE, tick=12, value=_B_VALUE),
            Step("A", Action.WRITE, tick=13, value=_A_VALUE),
        ),
    ),
)


class ExperimentError(Exception):
    """A scenario failed or hung; `scenario` and `step` say where."""

    def __init__(self, scenario: str, step: str, problem: str) -> None:
        super().__init__(f"scenario {scenario!r}, {step}: {problem}")
        self.scenario = scenario
        self.step = step
        self.problem = problem


# --- the worker: a child process, told what to do entirely by its arguments ---


def run_worker(
    db_path: str,
    fenced: bool,
    actor: str,
    script: Sequence[tuple[int, Step, "Event"]],
    reports: "Queue[_Report]",
    timeout: float,
) -> None:
    """Perform each (index, step) of `script` once its Event is set, and report each result.

    A failure is reported as text, since an arbitrary exception may not survive pickling, and
    the process exits with status 1.
    """
    index = None
    try:
        with LeaseAuthority(db_path) as authority, Receiver(db_path, fenced=fenced) as receiver:
            lease = None
            for index, step, release in script:
                if not release.wait(timeout):
                    raise TimeoutError(f"step {index} was not released within {timeout} s")
                lease, event = _perform(step, lease, authority, receiver)
                reports.put((index, event, None))
    except BaseException as exc:  # noqa: BLE001 - whatever it was, the engine must hear of it
        reports.put((index, None, f"worker {actor}: {type(exc).__name__}: {exc}"))
        sys.exit(1)


def _perform(
    step: Step, lease: Lease | None, authority: LeaseAuthority, receiver: Receiver
) -> tuple[Lease | None, dict[str, Any]]:
    if step.action is Action.ACQUIRE:
        assert step.ttl is not None
        lease = authority.acquire(RESOURCE, step.actor, now=step.tick, ttl=step.ttl)
        granted = {"epoch": lease.epoch, "expires_at": lease.expires_at, "outcome": "granted"}
        return lease, _event(step, granted)
    if lease is None or step.value is None:
        raise ValueError(f"{step} needs a lease and a value")
    # The worker sends the epoch of the lease it last received: it has no other way to know.
    return lease, _event(step, _result_json(receiver.write(RESOURCE, lease.epoch, step.value)))


def _event(step: Step, happened: dict[str, Any]) -> dict[str, Any]:
    """One step as the evidence records it: every field present, null where it does not apply."""
    fields = ("epoch", "expires_at", "value", "outcome", "stored_epoch", "stored_value")
    return {
        "actor": step.actor,
        "action": step.action.value,
        "tick": step.tick,
        **{field: happened.get(field) for field in fields},
    }


# --- the engine ---


def _play(scenario: Scenario, timeout: float, stop: threading.Event) -> dict[str, Any]:
    """The engine: release each step in turn, and wait for its report before the next."""
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="leases-experiment-") as folder:
        db_path = os.path.join(folder, "scenario.sqlite3")
        reports: Queue[_Report] = context.Queue()
        releases = [context.Event() for _ in scenario.steps]
        workers = {
            actor: context.Process(
                target=run_worker,
                name=f"{scenario.name}:{actor}",
                args=(
                    db_path,
                    scenario.fenced,
                    actor,
                    [(i, s, releases[i]) for i, s in enumerate(scenario.steps) if s.actor == actor],
                    reports,
                    timeout,
                ),
            )
            for actor in scenario.actors
        }
        try:
            for worker in workers.values():
                worker.start()
            events = []
            for index, step in enumerate(scenario.steps):
                releases[index].set()
                where = f"step {index} ({step})"
                events.append(
                    _handshake(
                        scenario.name, where, index, reports, workers[step.actor], timeout, stop
                    )
                )
            for worker in workers.values():
                worker.join(timeout)
                if worker.exitcode != 0:
                    problem = (
                        "did not exit"
                        if worker.exitcode is None
                        else f"exit code {worker.exitcode}"
                    )
                    raise ExperimentError(scenario.name, f"ending worker {worker.name!r}", problem)
        finally:
            _stop(workers.values(), timeout)
            # Only the workers ever put on this queue, so closing it here waits for nothing.
            reports.close()
            reports.join_thread()
        return _record(scenario, events, db_path)


def _handshake(
    scenario: str,
    where: str,
    index: int,
    reports: "Queue[_Report]",
    worker: multiprocessing.process.BaseProcess,
    timeout: float,
    stop: threading.Event,
) -> dict[str, Any]:
    """Wait for the report of the one step just released: the only way the engine moves on.

    The wait is cut into short slices only to notice, between them, that the run was stopped
    or that the worker died without reporting; it never decides the order of anything.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            wait = min(_SLICE_SECONDS, max(0.0, deadline - time.monotonic()))
            reported, event, error = reports.get(timeout=wait)
            break
        except queue.Empty:
            pass
        if stop.is_set():
            raise ExperimentError(scenario, where, "stopped: another scenario failed, or Ctrl-C")
        if worker.exitcode is not None and reports.empty():
            problem = f"worker {worker.name!r} ended with exit code {worker.exitcode}, unreported"
            raise ExperimentError(scenario, where, problem)
        if time.monotonic() >= deadline:
            raise ExperimentError(scenario, where, f"no report within {timeout} s")
    if error is not None:
        raise ExperimentError(scenario, where, error)
    if reported != index or event is None:
        raise ExperimentError(scenario, where, f"step {reported} reported out of turn")
    return event


def _stop(workers: Iterable[multiprocessing.process.BaseProcess], timeout: float) -> None:
    """Make sure no worker outlives its scenario, however the scenario ended."""
    for worker in workers:
        if worker.pid is None:  # never started
            continue
        if worker.is_alive():
            worker.terminate()
        worker.join(timeout)
        if worker.is_alive():
            worker.kill()
            worker.join()


def _record(scenario: Scenario, events: list[dict[str, Any]], db_path: str) -> dict[str, Any]:
    with Receiver(db_path, fenced=scenario.fenced) as receiver:
        decisions = [_result_json(result) for result in receiver.decisions(RESOURCE)]
        final = receiver.read(RESOURCE)
    with LeaseAuthority(db_path) as authority:
        lease = authority.current(RESOURCE, now=scenario.steps[-1].tick)
    assert final is not None
    return {
        "name": scenario.name,
        "receiver": "fenced" if scenario.fenced else "unfenced",
        "summary": scenario.summary,
        "resource": RESOURCE,
        "events": events,
        "decisions": decisions,
        "final": {"epoch": final[0], "value": final[1]},
        "lease_at_end": None if lease is None else _lease_json(lease),
        "verdict": _verdict(events, final),
    }


def _lease_json(lease: Lease) -> dict[str, Any]:
    return {"holder": lease.holder, "epoch": lease.epoch, "expires_at": lease.expires_at}


def _result_json(result: WriteResult) -> dict[str, Any]:
    return {
        "outcome": result.outcome.value,
        "epoch": result.epoch,
        "value": result.value,
        "stored_epoch": result.stored_epoch,
        "stored_value": result.stored_value,
    }


def _verdict(events: list[dict[str, Any]], final: tuple[int, str]) -> dict[str, Any]:
    """Judge the run from its events alone: what went wrong, if anything, and who won."""
    expires_at: dict[str, int] = {}  # each actor's latest lease
    newest_epoch = 0  # the highest epoch the authority has granted so far
    stored_epoch = None  # what the receiver held before the write at hand
    superseded = expired = overwritten = False
    for event in events:
        if event["action"] == Action.ACQUIRE.value:
            expires_at[event["actor"]] = event["expires_at"]
            newest_epoch = max(newest_epoch, event["epoch"])
            continue
        if event["outcome"] == "applied":
            superseded |= event["epoch"] < newest_epoch
            expired |= event["tick"] >= expires_at[event["actor"]]
            overwritten |= stored_epoch is not None and event["epoch"] < stored_epoch
        stored_epoch = event["stored_epoch"]
    writers = {event["value"]: event["actor"] for event in events if event["value"] is not None}
    return {
        "write_with_superseded_epoch_applied": superseded,
        "write_after_lease_expiry_applied": expired,
        "newer_write_overwritten_by_older_epoch": overwritten,
        "stale_writes_refused": sum(event["outcome"] == "stale" for event in events),
        "final_value_written_by": writers.get(final[1]),
    }


def run_scenarios(
    scenarios: Sequence[Scenario] = SCENARIOS, *, timeout: float = DEFAULT_TIMEOUT
) -> dict[str, Any]:
    """Run `scenarios` concurrently and return the evidence document, in the given order.

    If one scenario fails, or the run is interrupted, the others are told to stop, so that
    every worker of every scenario has ended before this returns or raises.
    """
    stop = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(scenarios)) as pool:
        running = [pool.submit(_play, scenario, timeout, stop) for scenario in scenarios]
        try:
            records = [future.result() for future in running]
        except BaseException:
            stop.set()
            raise
    return {"scenarios": records}


# --- evidence: rendering and comparing ---


def canonical_json(document: object) -> str:
    return json.dumps(document, sort_keys=True, indent=2, ensure_ascii=True) + "\n"


def timeline(record: dict[str, Any]) -> str:
    """A few lines a person can read at a glance: who did what at which tick, and the result."""
    lines = [f"{record['name']} ({record['receiver']} receiver)"]
    for event in record["events"]:
        if event["action"] == Action.ACQUIRE.value:
            detail = f"lease until tick {event['expires_at']}"
        else:
            held = f"epoch {event['stored_epoch']}, {event['stored_value']!r}"
            detail = f"{event['value']!r} -> receiver holds {held}"
        lines.append(
            f"  tick {event['tick']:>2}  {event['actor']}  {event['action']:<7}  "
            f"epoch {event['epoch']}  {event['outcome']:<8}  {detail}"
        )
    verdict = record["verdict"]
    lines.append(
        f"  final value written by {verdict['final_value_written_by']}; "
        f"write with superseded epoch applied: {verdict['write_with_superseded_epoch_applied']}"
    )
    return "\n".join(lines)


_MISSING = object()


def differences(
    expected: object, actual: object, path: str = "$"
) -> Iterator[tuple[str, Any, Any]]:
    """Yield (JSON path, expected, actual) wherever two parsed JSON documents differ."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(expected.keys() | actual.keys()):
            step = f".{key}" if key.isidentifier() else f"[{json.dumps(key)}]"
            yield from differences(
                expected.get(key, _MISSING), actual.get(key, _MISSING), path + step
            )
    elif isinstance(expected, list) and isinstance(actual, list):
        for i in range(max(len(expected), len(actual))):
            yield from differences(
                expected[i] if i < len(expected) else _MISSING,
                actual[i] if i < len(actual) else _MISSING,
                f"{path}[{i}]",
            )
    # type() as well as ==, because in Python true == 1 and 1 == 1.0, but not in the evidence.
    elif type(expected) is not type(actual) or expected != actual:
        yield path, expected, actual


def _show_pair(expected: object, actual: object, limit: int = 70) -> tuple[str, str]:
    """Both values as short JSON; two long strings are shown from just before they part."""
    skip = 0
    if isinstance(expected, str) and isinstance(actual, str):
        skip = max(0, len(os.path.commonprefix([expected, actual])) - 20)

    def show(value: object) -> str:
        if value is _MISSING:
            return "(missing)"
        if skip and isinstance(value, str):
            text = '"...' + json.dumps(value[skip:])[1:]
        else:
            text = json.dumps(value, sort_keys=True)
        return text if len(text) <= limit else text[: limit - 3] + "..."

    return show(expected), show(actual)


# --- command line ---


class _UsageError(Exception):
    """Bad arguments or files: exit 2 with one line, before or instead of a run."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line and no usage block, so that scripts can show the reason as it is.
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="run_experiment.py",
        description="Replay the lease scenarios (unfenced receiver, fenced receiver, and the gap\n"
        "between a lease's expiry and the receiver's observation of a newer epoch) with\n"
        "spawned processes, and write the evidence as canonical JSON to stdout or PATH.\n"
        "A timeline a person can read goes to stderr.",
        epilog="exit codes:\n"
        "  0  success; with --check, the run reproduced EXPECTED\n"
        "  1  with --check, the run differs from EXPECTED (the differing JSON paths are listed)\n"
        "  2  bad arguments; EXPECTED missing, unreadable, empty or not JSON; PATH not writable\n"
        "  3  a scenario failed or hung (the scenario and step are named)\n"
        "  130  interrupted (Ctrl-C); every worker is stopped first\n"
        "\n"
        "examples:\n"
        "  python3 run_experiment.py --check results.json --output reproduced.json\n"
        "  python3 run_experiment.py --output results.json   # regenerate the evidence",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--check",
        metavar="EXPECTED",
        help="compare the run with this evidence file; key order and whitespace do not matter",
    )
    parser.add_argument(
        "--output",
        metavar="PATH",
        help="write the evidence here, replacing the file whole (default: stdout, unless --check)",
    )
    parser.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=_positive_seconds,
        default=DEFAULT_TIMEOUT,
        help=f"give up on a step that hangs this long; it never orders anything "
        f"(default: {DEFAULT_TIMEOUT:g})",
    )
    return parser


def _positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return seconds


def _read_expected(path: str) -> object:
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as exc:
        raise _UsageError(
            f"cannot read expected evidence {path!r}: {exc.strerror or exc}"
        ) from None
    if not data.strip():
        raise _UsageError(f"expected evidence {path!r} is empty")
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # JSON and UTF-8 errors are ValueErrors
        raise _UsageError(f"expected evidence {path!r} is not JSON: {exc}") from None


def _check_writable(path: str, expected_path: str | None) -> None:
    """Fail before the run, not after it, if PATH cannot be written."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise _UsageError(f"cannot write {path!r}: folder {folder!r} does not exist")
    if os.path.isdir(path):
        raise _UsageError(f"cannot write {path!r}: it is a folder")
    if expected_path is not None and os.path.abspath(path) == os.path.abspath(expected_path):
        raise _UsageError(f"--output {path!r} would overwrite the --check file it is compared with")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise _UsageError(f"cannot write {path!r}: {exc.strerror or exc}") from None


def _write_whole(path: str, text: str) -> None:
    """Write `text` to a temporary file beside `path`, then rename: never a half-written file."""
    fd, temporary = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="ascii", newline="\n") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        expected = None if args.check is None else _read_expected(args.check)
        if args.output is not None:
            _check_writable(args.output, args.check)
    except _UsageError as exc:
        print(f"run_experiment.py: error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    try:
        document = run_scenarios(timeout=args.timeout)
    except ExperimentError as exc:
        print(f"run_experiment.py: failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("run_experiment.py: interrupted; every worker was stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    for record in document["scenarios"]:
        print(timeline(record), file=sys.stderr)

    text = canonical_json(document)
    if args.output is not None:
        try:
            _write_whole(args.output, text)
        except OSError as exc:
            print(f"run_experiment.py: error: cannot write {args.output!r}: {exc}", file=sys.stderr)
            return EXIT_USAGE
    elif args.check is None:
        sys.stdout.write(text)
    if args.check is None:
        return EXIT_OK

    found = list(differences(expected, json.loads(text)))
    if not found:
        print(f"reproduced: this run matches {args.check} ({len(document['scenarios'])} scenarios)")
        return EXIT_OK
    print(f"differs: this run does not match {args.check} at {len(found)} JSON path(s):")
    for path, want, got in found[:10]:
        shown_want, shown_got = _show_pair(want, got)
        print(f"  {path}: expected {shown_want}, got {shown_got}")
    if len(found) > 10:
        print(f"  ... and {len(found) - 10} more")
    return EXIT_DIFFERENT


if __name__ == "__main__":
    sys.exit(main())
