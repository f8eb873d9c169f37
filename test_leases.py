"""The contract of leases.py and run_experiment.py, one clause per test.

Each test names the rule it demonstrates and fails if that rule is broken.  Child processes
are spawned and ordered by Event and Queue handshakes; no test sleeps, and every wait is
bounded.
"""

import atexit
import concurrent.futures
import contextlib
import functools
import io
import json
import multiprocessing
import os
import pickle
import queue
import re
import select
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import unittest
from collections import Counter
from collections.abc import Callable, Iterator
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any, TypeVar
from unittest import mock

if TYPE_CHECKING:  # only for annotations: the context makes the real objects
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Event as MPEvent

import leases
import run_experiment
from leases import (
    Lease,
    LeaseAuthority,
    LeaseError,
    LeaseHeld,
    LeaseLost,
    Outcome,
    Receiver,
    WriteResult,
)
from run_experiment import (
    Action,
    Answer,
    Event,
    ExperimentError,
    Scenario,
    Step,
    judge,
    run_scenarios,
)

T = TypeVar("T")
HERE = os.path.dirname(os.path.realpath(__file__))
TIMEOUT = 30.0  # bounds a hung test; no test waits for it to pass
SPAWN = multiprocessing.get_context("spawn")
RESOURCE = "invoice-42"
STOP_SIGNALS = run_experiment.STOP_SIGNALS

# What a child puts on its results queue: (its number, whether it succeeded, its result or the
# traceback of its failure).  Children are numbered so that results can be told apart.
ChildResult = tuple[int, bool, Any]
# A pausing acquisition's outcome: ("granted" or "held", epoch).
Acquisition = tuple[str, int]


# --- the suite's own stopping and temporary files ---


def setUpModule() -> None:
    # Stopped by `timeout`, a CI runner cancelling the job, a closed terminal or Ctrl-\, the
    # suite stops as Ctrl-C stops it, and later stop signals are ignored, so that they cannot
    # cut its way out short.  A signal ignored from the start (nohup) stays ignored.
    for number in STOP_SIGNALS:
        if signal.getsignal(number) is not signal.SIG_IGN:
            unittest.addModuleCleanup(signal.signal, number, signal.signal(number, _stop_suite))
    # Every temporary file of the suite goes into one folder, removed with its children when
    # the interpreter exits, however the suite ended.  It is made with the stop signals held,
    # so that no stop can fall between making it and registering its removal.
    with run_experiment.holding_signals():
        folder = tempfile.mkdtemp(prefix="leases-tests-")
        atexit.register(_remove_at_exit, folder)
    run_experiment.start_resource_tracker()  # sent to the whole group, a stop spares it
    unittest.addModuleCleanup(setattr, tempfile, "tempdir", tempfile.tempdir)
    tempfile.tempdir = folder


def _stop_suite(number: int, frame: object) -> None:
    for each in STOP_SIGNALS:
        signal.signal(each, signal.SIG_IGN)
    raise KeyboardInterrupt(f"stopped by {signal.Signals(number).name}")


def _remove_at_exit(folder: str) -> None:
    with run_experiment.holding_signals():  # a stop now must not cut the removal short
        for child in multiprocessing.active_children():  # none must write there meanwhile
            child.kill()
            child.join(TIMEOUT)
        shutil.rmtree(folder, ignore_errors=True)


# --- helpers for arranging tests ---


def _database(test: unittest.TestCase) -> str:
    folder = tempfile.TemporaryDirectory(prefix="leases-test-")
    test.addCleanup(folder.cleanup)
    return os.path.join(folder.name, "leases.sqlite3")


def _authority(test: unittest.TestCase, path: str) -> LeaseAuthority:
    authority = LeaseAuthority(path)
    test.addCleanup(authority.close)
    return authority


def _receiver(test: unittest.TestCase, path: str, *, fenced: bool = True) -> Receiver:
    receiver = Receiver(path, fenced=fenced)
    test.addCleanup(receiver.close)
    return receiver


def _start(test: unittest.TestCase, target: Callable[..., Any], *args: Any) -> BaseProcess:
    # A daemon: should its cleanup never run, the interpreter's exit ends it.
    process = SPAWN.Process(target=target, args=args, daemon=True)

    def stop() -> None:  # also when the test failed half-way: no child outlives its test
        if process.is_alive():
            process.kill()
        process.join(TIMEOUT)

    test.addCleanup(stop)
    process.start()
    return process


def _get(test: unittest.TestCase, channel: "Queue[T]", what: str) -> T:
    try:
        return channel.get(timeout=TIMEOUT)
    except queue.Empty:
        raise test.failureException(f"no {what} within {TIMEOUT} s") from None


def _run_together(
    test: unittest.TestCase, function: Callable[..., Any], arguments: list[tuple[Any, ...]]
) -> list[Any]:
    """Run function(*args) in a child process per args, all released at once; their results."""
    ready: Queue[int] = SPAWN.Queue()
    results: Queue[ChildResult] = SPAWN.Queue()
    start = SPAWN.Event()
    processes = [
        _start(test, _job, number, function, args, ready, start, results)
        for number, args in enumerate(arguments)
    ]
    for _ in processes:
        _get(test, ready, "ready report from a child")
    start.set()  # every child is open and waiting: now they contend for real
    return _collect(test, results, processes)


def _try_to_overtake(
    test: unittest.TestCase,
    function: Callable[..., Any],
    first: tuple[Any, ...],
    second: tuple[Any, ...],
) -> list[Any]:
    """Pause `first` inside its transaction just before it writes, and run `second` meanwhile.

    `first` is let go only once `second` is about to BEGIN, so if the operation read its state
    outside the transaction, `second` would have read the same state as `first`.  Returns the
    results of both calls.
    """
    ready: Queue[int] = SPAWN.Queue()
    results: Queue[ChildResult] = SPAWN.Queue()
    go, resume_first = SPAWN.Event(), SPAWN.Event()
    go.set()
    first_inside, second_begins = SPAWN.Event(), SPAWN.Event()
    first_args = (*first, "INSERT", first_inside, resume_first)
    second_args = (*second, "BEGIN", second_begins, go)  # `go` is set: it only signals
    # Both start up at once; the second makes its call only once the first is inside.
    processes = [
        _start(test, _job, 0, function, first_args, ready, go, results),
        _start(test, _job, 1, function, second_args, ready, first_inside, results),
    ]
    test.assertTrue(first_inside.wait(TIMEOUT), "the first call never reached its write")
    test.assertTrue(second_begins.wait(TIMEOUT), "the second call never began")
    resume_first.set()
    return _collect(test, results, processes)


def _collect(
    test: unittest.TestCase, results: "Queue[ChildResult]", processes: list[BaseProcess]
) -> list[Any]:
    """Each child's result, in the order the children were numbered; fails if any child failed."""
    outcomes = sorted(_get(test, results, "result from a child") for _ in processes)
    for number, ok, detail in outcomes:
        test.assertTrue(ok, f"child {number} failed:\n{detail}")
    for process in processes:
        process.join(TIMEOUT)
        test.assertEqual(process.exitcode, 0)
    return [detail for _, _, detail in outcomes]


def _in_threads(
    test: unittest.TestCase, function: Callable[..., T], arguments: list[tuple[Any, ...]]
) -> list[T]:
    """function(*args) in a thread per args, all at once; their results, in order."""
    with concurrent.futures.ThreadPoolExecutor(len(arguments)) as pool:
        futures = [pool.submit(function, *args) for args in arguments]
        return [future.result(timeout=TIMEOUT) for future in futures]


def _by_the_rule(stored: tuple[int, str] | None, epoch: int, value: str) -> str:
    """The fenced receiver's rule as the README states it, to check a log decision by decision."""
    if stored is None or epoch > stored[0]:
        return "applied"
    if epoch == stored[0]:
        return "replay" if value == stored[1] else "conflict"
    return "stale"


@contextlib.contextmanager
def _raising(
    store: LeaseAuthority | Receiver, statement: str, error: BaseException, *, after: bool
) -> Iterator[None]:
    """Make `store`'s statements that start with `statement` raise `error`, before they run or,
    if `after`, once they have run (as Ctrl-C does, arriving as a busy wait for a lock ends)."""
    real = store._connection
    assert real is not None  # an open store

    class Raising:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def execute(self, sql: str, *args: Any) -> Any:
            assert real is not None
            ran = real.execute(sql, *args) if after or not sql.startswith(statement) else None
            if sql.startswith(statement):
                raise error
            return ran

    store._connection = Raising()  # type: ignore[assignment]
    try:
        yield
    finally:
        store._connection = real


def _bytes(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


def _snapshot(folder: str) -> dict[str, bytes]:
    """Every regular file in `folder` and its bytes, but the -shm and empty -wal that SQLite
    makes beside a WAL-mode database for any reader."""
    files = {name: _bytes(os.path.join(folder, name)) for name in os.listdir(folder)
             if os.path.isfile(os.path.join(folder, name)) and not name.endswith("-shm")}
    return {name: data for name, data in files.items() if data or not name.endswith("-wal")}


def _dump(path: str) -> list[str]:
    with contextlib.closing(sqlite3.connect(path)) as connection:
        return list(connection.iterdump())


@functools.cache
def _run() -> tuple["subprocess.CompletedProcess[str]", bytes]:
    """The README's --check command, run once, and the evidence it wrote (b"" if none): the
    scenario tests and the command-line test all read it."""
    with tempfile.TemporaryDirectory(prefix="leases-check-") as folder:
        output = os.path.join(folder, "reproduced.json")
        command = [sys.executable, os.path.join(HERE, "run_experiment.py"),
                   "--check", "results.json", "--output", output]
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              encoding="utf-8", cwd=HERE) as started:
            try:
                outputs = started.communicate(timeout=TIMEOUT)
            finally:
                started.terminate()  # as `kill` does, if it hung: it stops its workers
        written = _bytes(output) if os.path.exists(output) else b""
    return subprocess.CompletedProcess(command, started.returncode, *outputs), written


def _evidence() -> dict[str, dict[str, Any]]:
    process, written = _run()
    if not written:
        raise AssertionError(f"run_experiment.py wrote no evidence:\n{process.stderr}")
    return {record["name"]: record for record in json.loads(written)["scenarios"]}


def _acquired(actor: str, tick: int, epoch: int, expires_at: int) -> Event:
    return Event(actor, Action.ACQUIRE, tick, Answer.GRANTED, epoch, expires_at)


def _wrote(
    actor: str, tick: int, epoch: int, value: str, outcome: Outcome, stored: tuple[int, str]
) -> Event:
    return Event(actor, Action.WRITE, tick, outcome, epoch, None, value, *stored)


def _story(record: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [
        (e["actor"], e["action"], e["tick"], e["epoch"], e["outcome"], e["stored_epoch"])
        for e in record["events"]
    ]


class ScenarioTests(unittest.TestCase):
    """The three scenarios, as one run of `run_experiment.py --check` played them."""

    def assertScenario(
        self, name: str, story: list[tuple[Any, ...]], final: tuple[int, str], **verdict: Any
    ) -> None:
        """The steps happened as `story` says, leaving `final` stored, and judged as `verdict`."""
        record = _evidence()[name]
        self.assertEqual(_story(record), story)
        self.assertEqual(record["final"], {"epoch": final[0], "value": final[1]})
        self.assertEqual({key: record["verdict"][key] for key in verdict}, verdict)
        # The receiver's own log agrees with what the workers were told.
        writes = [e for e in record["events"] if e["action"] == "write"]
        self.assertEqual(
            [(d["epoch"], d["value"], d["outcome"]) for d in record["decisions"]],
            [(w["epoch"], w["value"], w["outcome"]) for w in writes],
        )
        # Whatever the receiver did, the authority ends with B holding epoch 2.
        self.assertEqual(record["lease_at_end"], {"holder": "B", "epoch": 2, "expires_at": 20})

    def test_unfenced_receiver_applies_late_epoch_1_write_over_epoch_2_losing_b_update(
        self,
    ) -> None:
        self.assertScenario(
            "unfenced_receiver",
            [
                ("A", "acquire", 0, 1, "granted", None),
                ("B", "acquire", 10, 2, "granted", None),  # at the exact tick A's lease expires
                ("B", "write", 10, 2, "applied", 2),
                ("A", "write", 11, 1, "applied", 1),  # A resumes late and overwrites B
            ],
            final=(1, "report by A"),
            newer_write_overwritten_by_older_epoch=True,
            write_with_superseded_epoch_applied=True,
            final_value_written_by="A",
        )

    def test_fenced_receiver_rejects_late_epoch_1_write_as_stale_and_keeps_b_value(self) -> None:
        self.assertScenario(
            "fenced_receiver",
            [
                ("A", "acquire", 0, 1, "granted", None),
                ("B", "acquire", 10, 2, "granted", None),
                ("B", "write", 10, 2, "applied", 2),
                ("A", "write", 11, 1, "stale", 2),
            ],
            final=(2, "report by B"),
            newer_write_overwritten_by_older_epoch=False,
            write_with_superseded_epoch_applied=False,
            final_value_written_by="B",
        )
        # A reader's own fenced schedule, played by the engine: a replay, a conflict and two
        # stale writes refused; a release, and an epoch that keeps growing after it; and a
        # lease that expires before the last step, so that none is live at the end.
        steps = (
            Step("A", Action.ACQUIRE, 0, ttl=2),
            Step("B", Action.ACQUIRE, 2, ttl=2),
            Step("B", Action.WRITE, 2, value="by B"),
            Step("B", Action.WRITE, 2, value="by B"),
            Step("B", Action.WRITE, 3, value="other"),
            Step("A", Action.WRITE, 3, value="by A"),
            Step("A", Action.WRITE, 3, value="by A"),
            Step("B", Action.RELEASE, 3),
            Step("A", Action.ACQUIRE, 3, ttl=1),
            Step("A", Action.CHECK, 5),
        )
        live = (Step("A", Action.ACQUIRE, 0, ttl=10), Step("A", Action.CHECK, 9))
        record, live_at_end = run_scenarios(
            [Scenario("own", True, "", steps), Scenario("live", True, "", live)],
            timeout=TIMEOUT)["scenarios"]
        with self.subTest("each step of the reader's schedule is answered by the rules"):
            self.assertEqual(_story(record), [
                ("A", "acquire", 0, 1, "granted", None),
                ("B", "acquire", 2, 2, "granted", None),
                ("B", "write", 2, 2, "applied", 2),
                ("B", "write", 2, 2, "replay", 2),  # the same epoch and value changes nothing
                ("B", "write", 3, 2, "conflict", 2),
                ("A", "write", 3, 1, "stale", 2),
                ("A", "write", 3, 1, "stale", 2),
                ("B", "release", 3, 2, "released", None),
                ("A", "acquire", 3, 3, "granted", None),  # a release never gives an epoch back
                ("A", "check", 5, 3, "lost", None),
            ])
            self.assertEqual(record["final"], {"epoch": 2, "value": "by B"})
        with self.subTest("the lease at the end is the one live at the last tick: none, or "
                          "one that expires at the next"):
            self.assertIsNone(record["lease_at_end"])
            self.assertEqual(live_at_end["lease_at_end"],
                             {"holder": "A", "epoch": 1, "expires_at": 10})
        with self.subTest("the timeline counts the refusals by their kind"):
            self.assertEqual(run_experiment.timeline(record).split("\n")[-1],
                             "  final value written by B; stale writes refused: 2, conflicting: 1")

    def test_expiry_before_receiver_observation_gap_applies_expired_epoch_1_until_epoch_2_is_stored(
        self,
    ) -> None:
        self.assertScenario(
            "expiry_before_receiver_observation_gap",
            [
                ("A", "acquire", 0, 1, "granted", None),
                ("B", "acquire", 10, 2, "granted", None),
                ("A", "write", 11, 1, "applied", 1),  # expired, superseded, and still applied
                ("B", "write", 12, 2, "applied", 2),
                ("A", "write", 13, 1, "stale", 2),  # the same write, once epoch 2 is stored
            ],
            final=(2, "report by B"),
            write_after_lease_expiry_applied=True,
            write_with_superseded_epoch_applied=True,
            final_value_written_by="B",
        )
        # Above, expiry and takeover come together.  The verdict judges each on its own: every
        # field, true and false, on small event lists, with the events that made it so.
        a1, b2 = _acquired("A", 0, 1, 10), _acquired("B", 5, 2, 15)
        renewed = Event("A", Action.RENEW, 9, Answer.RENEWED, 1, 19)
        cases = {
            "expiry without takeover": (
                [a1, _wrote("A", 10, 1, "x", Outcome.APPLIED, (1, "x"))],
                {"write_after_lease_expiry_applied": [1], "final_value_written_by": [1]},
            ),
            "a renewal moves the expiry": (
                [a1, renewed, _wrote("A", 10, 1, "x", Outcome.APPLIED, (1, "x"))],
                {"final_value_written_by": [2]},
            ),
            "takeover without expiry of the writer (A released early)": (
                [a1, b2, _wrote("A", 6, 1, "x", Outcome.APPLIED, (1, "x"))],
                {"write_with_superseded_epoch_applied": [2], "final_value_written_by": [2]},
            ),
            "the same value from two actors: the applied one is final": (
                [a1, b2, _wrote("B", 6, 2, "x", Outcome.APPLIED, (2, "x")),
                 _wrote("A", 7, 1, "x", Outcome.STALE, (2, "x"))],
                {"stale_writes_refused": [3], "final_value_written_by": [2]},
            ),
            "a newer write overwritten by an older epoch": (
                [a1, b2, _wrote("B", 6, 2, "y", Outcome.APPLIED, (2, "y")),
                 _wrote("A", 7, 1, "x", Outcome.APPLIED, (1, "x"))],
                {"write_with_superseded_epoch_applied": [3],
                 "newer_write_overwritten_by_older_epoch": [3], "final_value_written_by": [3]},
            ),
            "a conflict and a replay": (
                [a1, _wrote("A", 1, 1, "x", Outcome.APPLIED, (1, "x")),
                 _wrote("A", 2, 1, "y", Outcome.CONFLICT, (1, "x")),
                 _wrote("A", 3, 1, "x", Outcome.REPLAY, (1, "x"))],
                {"conflicting_writes_refused": [2], "final_value_written_by": [1]},
            ),
            "the same epoch rewritten, unfenced: no older epoch overwrote a newer one": (
                [a1, _wrote("A", 1, 1, "x", Outcome.APPLIED, (1, "x")),
                 _wrote("A", 2, 1, "y", Outcome.APPLIED, (1, "y"))],
                {"final_value_written_by": [2]},
            ),
            "a write before a later takeover was not superseded yet": (
                [a1, _wrote("A", 4, 1, "x", Outcome.APPLIED, (1, "x")), b2],
                {"final_value_written_by": [1]},
            ),
            "an actor that acquires again is judged by its latest lease": (
                [a1, _acquired("A", 10, 2, 20), _wrote("A", 15, 2, "x", Outcome.APPLIED, (2, "x"))],
                {"final_value_written_by": [2]},
            ),
            "nothing applied": ([a1], {}),
        }
        for case, (events, because) in cases.items():
            with self.subTest(case=case):
                self.assertEqual(judge(events)["because"], {**judge([])["because"], **because})
        with self.assertRaisesRegex(ValueError, r"event 0 .* a write by an actor with no lease"):
            judge([_wrote("C", 1, 1, "x", Outcome.APPLIED, (1, "x"))])
        with self.assertRaisesRegex(ValueError, r"event 0 .* a lease without its epoch"):
            judge([Event("C", Action.ACQUIRE, 1, Answer.GRANTED, 1, None)])


class AuthorityTests(unittest.TestCase):
    def setUp(self) -> None:
        self.path = _database(self)
        self.authority = _authority(self, self.path)

    def test_epochs_start_at_1_and_grow_by_1_per_acquisition_of_each_resource(self) -> None:
        # Quotes, SQL, non-ASCII and long names must round-trip exactly: SQL is parameterised.
        resources = ['it\'s "quoted"; DROP TABLE leases; --', "ünïcødé ✓ 🚀", "r" * 10_000]
        granted: dict[str, list[int]] = {r: [] for r in resources}
        for _ in range(3):
            for resource in resources:
                lease = self.authority.acquire(resource, "worker", now=0, ttl=5)
                self.assertEqual(self.authority.current(resource, now=0), lease)
                granted[resource].append(lease.epoch)
                self.authority.release(lease)
        self.assertEqual(granted, {r: [1, 2, 3] for r in resources})

    def test_a_live_lease_blocks_every_acquisition_until_its_expiry_tick(self) -> None:
        held = self.authority.acquire(RESOURCE, "A", now=0, ttl=10)
        for now in range(10):  # up to and including tick 9, one tick before expiry
            for holder in ("A", "B"):  # the holder too: extending is what renew is for
                with self.assertRaises(LeaseHeld) as caught:
                    self.authority.acquire(RESOURCE, holder, now=now, ttl=10)
                self.assertEqual(caught.exception.lease, held)
        self.assertEqual(self.authority.current(RESOURCE, now=9), held)

    def test_acquisition_at_exactly_the_expiry_tick_succeeds_with_the_next_epoch(self) -> None:
        self.authority.acquire(RESOURCE, "A", now=0, ttl=10)
        self.assertIsNone(self.authority.current(RESOURCE, now=10))
        self.assertEqual(
            self.authority.acquire(RESOURCE, "B", now=10, ttl=10), Lease(RESOURCE, "B", 2, 20)
        )
        with self.subTest("a holder that acquires again after its expiry gets the next epoch"):
            self.assertEqual(self.authority.acquire(RESOURCE, "B", now=20, ttl=10).epoch, 3)

    def test_renew_sets_expiry_to_now_plus_ttl_only_for_the_current_holders_live_lease(
        self,
    ) -> None:
        lease = self.authority.acquire(RESOURCE, "A", now=0, ttl=10)
        other = self.authority.acquire("other", "A", now=0, ttl=10)
        renewed = self.authority.renew(lease, now=9, ttl=10)
        self.assertEqual(renewed, Lease(RESOURCE, "A", 1, 19))
        self.assertEqual(self.authority.current(RESOURCE, now=18), renewed)
        with self.subTest("renewing one resource leaves another's lease as it was"):
            self.assertEqual(self.authority.current("other", now=9), other)
            self.assertIsNone(self.authority.current("other", now=10))
        shortened = self.authority.renew(renewed, now=10, ttl=1)  # now + ttl, even if sooner
        self.assertEqual(shortened, Lease(RESOURCE, "A", 1, 11))
        self.assertIsNone(self.authority.current(RESOURCE, now=11))
        with self.assertRaises(LeaseLost):  # same epoch, another holder: not the holder's lease
            self.authority.renew(Lease(RESOURCE, "B", 1, 11), now=10, ttl=10)
        with self.assertRaises(LeaseLost) as caught:  # expired at its expiry tick
            self.authority.renew(shortened, now=11, ttl=10)
        self.assertIsNone(caught.exception.current)  # as current() says at that tick
        taken = self.authority.acquire(RESOURCE, "B", now=11, ttl=10)
        for now, current in ((12, taken), (21, None)):  # taken over; then that lease expired
            with self.assertRaises(LeaseLost) as caught:
                self.authority.renew(shortened, now=now, ttl=10)
            self.assertEqual(caught.exception.current, current)
            self.assertEqual(self.authority.current(RESOURCE, now=now), current)
        # The holder of the current lease, with an older epoch of its own, holds nothing.
        again = self.authority.acquire(RESOURCE, "A", now=21, ttl=10)
        with self.assertRaises(LeaseLost):
            self.authority.renew(shortened, now=22, ttl=10)
        with self.assertRaises(LeaseLost):
            self.authority.release(shortened)
        self.assertEqual(self.authority.current(RESOURCE, now=22), again)

    def test_release_frees_the_resource_but_never_reuses_its_epoch(self) -> None:
        first = self.authority.acquire(RESOURCE, "A", now=0, ttl=10)
        other = self.authority.acquire("other", "A", now=0, ttl=10)
        self.authority.release(first)
        self.assertIsNone(self.authority.current(RESOURCE, now=1))
        with self.subTest("releasing one resource leaves another's lease as it was"):
            self.assertEqual(self.authority.current("other", now=1), other)
        second = self.authority.acquire(RESOURCE, "B", now=1, ttl=10)
        self.assertEqual(second.epoch, 2)
        with self.assertRaises(LeaseLost) as caught:  # taken over since
            self.authority.release(first)
        self.assertEqual(caught.exception.current, second)  # release knows no tick: as stored
        self.authority.release(second)
        with self.assertRaises(LeaseLost):  # released twice
            self.authority.release(second)
        with self.assertRaises(LeaseLost):  # a released lease cannot be renewed either
            self.authority.renew(second, now=2, ttl=10)
        # Release takes no tick: an expired lease that nobody took over is still released,
        # harmlessly, since its epoch stays.
        third = self.authority.acquire(RESOURCE, "C", now=2, ttl=1)
        self.authority.release(third)
        self.assertEqual(self.authority.acquire(RESOURCE, "D", now=2, ttl=1).epoch, 4)

    def test_concurrent_acquisitions_from_processes_never_share_an_epoch_or_skip_one(self) -> None:
        # A database file no one has opened yet: the six processes also race to create it.
        path, rounds = _database(self), 15
        per_process = _run_together(
            self, _acquire_and_release, [(path, f"worker-{i}", rounds) for i in range(6)]
        )
        granted = sorted(epoch for epochs in per_process for epoch in epochs)
        self.assertEqual(granted, list(range(1, 6 * rounds + 1)))
        # Contention above is left to chance; here the unlucky interleaving is forced.
        first, second = _try_to_overtake(self, _acquire_pausing, (path, "X", 100), (path, "Y", 100))
        self.assertEqual((first, second), (("granted", 6 * rounds + 1), ("held", 6 * rounds + 1)))
        with self.subTest("4 threads sharing one authority never share an epoch or skip one"):
            shared = self.authority

            def take_turns(holder: str) -> list[int]:  # 300 acquisitions, some met by a holder
                epochs = []
                for _ in range(300):
                    with contextlib.suppress(LeaseHeld):
                        epochs.append(shared.acquire(RESOURCE, holder, now=0, ttl=1).epoch)
                        shared.release(Lease(RESOURCE, holder, epochs[-1], 1))
                return epochs

            per_thread = _in_threads(self, take_turns, [(f"thread-{i}",) for i in range(4)])
            granted = sorted(epoch for epochs in per_thread for epoch in epochs)
            self.assertEqual(granted, list(range(1, len(granted) + 1)))


class ReceiverTests(unittest.TestCase):
    def setUp(self) -> None:
        self.path = _database(self)
        self.receiver = _receiver(self, self.path)

    def assertWrite(
        self, epoch: int, value: str, outcome: Outcome, stored: tuple[int, str]
    ) -> None:
        result = self.receiver.write(RESOURCE, epoch, value)
        self.assertEqual(result, WriteResult(outcome, RESOURCE, epoch, value, *stored))
        self.assertEqual(self.receiver.read(RESOURCE), stored)
        self.assertEqual(self.receiver.decisions(RESOURCE)[-1], result)

    def test_higher_epoch_is_applied_and_lower_epoch_is_stale_once_higher_is_stored(self) -> None:
        self.assertWrite(1, "one", Outcome.APPLIED, (1, "one"))
        self.assertWrite(3, "three", Outcome.APPLIED, (3, "three"))
        self.assertWrite(2, "two", Outcome.STALE, (3, "three"))
        self.assertWrite(1, "one", Outcome.STALE, (3, "three"))
        with self.subTest("a lower epoch carrying the stored value is stale, not a replay"):
            self.assertWrite(2, "three", Outcome.STALE, (3, "three"))
        with self.subTest("each resource has its own stored epoch"):
            self.assertEqual(self.receiver.write("other", 1, "one").outcome, Outcome.APPLIED)
            self.assertEqual(self.receiver.read("other"), (1, "one"))
            self.assertWrite(2, "two", Outcome.STALE, (3, "three"))
            self.assertEqual([d.epoch for d in self.receiver.decisions("other")], [1])

    def test_same_epoch_and_same_value_is_a_replay_that_changes_nothing(self) -> None:
        self.assertWrite(2, "two", Outcome.APPLIED, (2, "two"))
        self.assertWrite(2, "two", Outcome.REPLAY, (2, "two"))
        self.assertEqual(
            [d.outcome for d in self.receiver.decisions(RESOURCE)], ["applied", "replay"]
        )

    def test_same_epoch_and_another_value_is_a_conflict_that_changes_nothing(self) -> None:
        self.assertWrite(2, "two", Outcome.APPLIED, (2, "two"))
        self.assertWrite(2, "deux", Outcome.CONFLICT, (2, "two"))
        self.assertWrite(2, "", Outcome.CONFLICT, (2, "two"))

    def test_unfenced_receiver_overwrites_whatever_the_epoch_and_keeps_its_own_record(self) -> None:
        unfenced = _receiver(self, self.path, fenced=False)
        results = [unfenced.write(RESOURCE, e, v) for e, v in [(5, "five"), (1, "one"), (1, "uno")]]
        self.assertEqual([r.outcome for r in results], [Outcome.APPLIED] * 3)
        self.assertEqual(unfenced.read(RESOURCE), (1, "uno"))
        self.assertEqual(unfenced.decisions(RESOURCE), results)
        # A different service: the fenced receiver on the same file has seen none of it.
        self.assertIsNone(self.receiver.read(RESOURCE))
        self.assertEqual(self.receiver.decisions(RESOURCE), [])

    def test_concurrent_writes_from_processes_behave_as_if_made_one_at_a_time(self) -> None:
        path, receiver = self.path, self.receiver
        writers = [f"writer-{i}" for i in range(6)]
        per_writer = _run_together(self, _write_epochs, [(path, w, range(1, 11)) for w in writers])
        log = receiver.decisions(RESOURCE)
        self.assertEqual(len(log), 6 * 10)
        # Replay the log one write at a time against the rule: each decision must be the one a
        # receiver alone would have made, given everything decided before it.
        stored = None
        for d in log:
            self.assertEqual(
                d.outcome, _by_the_rule(stored, d.epoch, d.value), f"{d} after {stored}"
            )
            stored = (d.stored_epoch, d.stored_value)
        stored_epochs = [d.stored_epoch for d in log]
        self.assertEqual(stored_epochs, sorted(stored_epochs), "the stored epoch went down")
        applied = Counter(d.epoch for d in log if d.outcome is Outcome.APPLIED)
        self.assertEqual(max(applied.values()), 1, "two values were applied for one epoch")
        # Each writer's own calls appear in the log in the order it made them, as it saw them.
        for writer, seen in zip(writers, per_writer):
            self.assertEqual([(d.epoch, d.outcome.value) for d in log if d.value == writer], seen)
        # Contention above is left to chance; here the unlucky interleaving is forced.
        first, second = _try_to_overtake(self, _write_pausing, (path, 11, "X"), (path, 11, "Y"))
        self.assertEqual((first.outcome, second.outcome), (Outcome.APPLIED, Outcome.CONFLICT))
        self.assertEqual(receiver.read(RESOURCE), (11, "X"))
        with self.subTest("4 threads sharing one receiver behave as if one at a time"):
            def write_epochs(value: str) -> None:  # 100 writes, epochs 1 to 100
                for epoch in range(1, 101):
                    receiver.write("shared", epoch, value)

            _in_threads(self, write_epochs, [(f"thread-{i}",) for i in range(4)])
            stored = None
            for d in receiver.decisions("shared"):
                self.assertEqual(d.outcome, _by_the_rule(stored, d.epoch, d.value))
                stored = (d.stored_epoch, d.stored_value)
            self.assertEqual(len(receiver.decisions("shared")), 4 * 100)


class DurabilityAndInputTests(unittest.TestCase):
    def test_state_survives_reopening_and_processes_including_one_killed_just_before_commit(
        self,
    ) -> None:
        self.keeps_what_committed_when_a_process_is_killed_just_before_commit()
        self.rolls_back_a_failed_commit_and_works_on_another_programs_database()
        self.waits_for_a_lock_within_its_bound_and_heeds_ctrl_c_at_once()
        self.refuses_every_call_once_its_file_is_renamed_or_given_another_name()

    def keeps_what_committed_when_a_process_is_killed_just_before_commit(self) -> None:
        self.path = _database(self)
        with LeaseAuthority(self.path) as authority, Receiver(self.path) as receiver:
            first = authority.acquire(RESOURCE, "parent", now=0, ttl=5)
            receiver.write(RESOURCE, first.epoch, "from the parent")
        # Two children start up at once.  One takes over and writes; once it is done, the other
        # makes a real acquisition, is stopped just before its COMMIT and is killed there.
        ready: Queue[int] = SPAWN.Queue()
        results: Queue[ChildResult] = SPAWN.Queue()
        go, taken_over, inside, never = (SPAWN.Event() for _ in range(4))
        go.set()
        doomed_args = (self.path, "doomed", 1000, "COMMIT", inside, never)
        child = _start(self, _job, 0, _take_over_and_write, (self.path, 5), ready, go, results)
        doomed = _start(self, _job, 1, _acquire_pausing, doomed_args, ready, taken_over, results)
        [taken] = _collect(self, results, [child])
        self.assertEqual(taken, Lease(RESOURCE, "child", 2, 15))
        taken_over.set()
        self.assertTrue(inside.wait(TIMEOUT), "the child never reached its COMMIT")
        doomed.kill()
        doomed.join(TIMEOUT)

        authority, receiver = _authority(self, self.path), _receiver(self, self.path)
        self.assertEqual(authority.current(RESOURCE, now=14), taken, "the killed grant leaked")
        self.assertEqual(authority.acquire(RESOURCE, "parent", now=1000, ttl=5).epoch, 3)
        self.assertEqual(receiver.read(RESOURCE), (2, "from the child"))
        self.assertEqual(receiver.write(RESOURCE, 1, "from the parent").outcome, Outcome.STALE)
        self.assertEqual(
            [(d.epoch, d.outcome) for d in receiver.decisions(RESOURCE)],
            [(1, Outcome.APPLIED), (2, Outcome.APPLIED), (1, Outcome.STALE)],
        )

        # A COMMIT that fails is rolled back, and the same object works afterwards.  In

    def rolls_back_a_failed_commit_and_works_on_another_programs_database(self) -> None:
        self.addCleanup(setattr, leases, "BUSY_TIMEOUT_SECONDS", leases.BUSY_TIMEOUT_SECONDS)
        leases.BUSY_TIMEOUT_SECONDS = 0.01
        self.journal = os.path.join(os.path.dirname(self.path), "journal.sqlite3")
        with contextlib.closing(sqlite3.connect(self.journal)) as connection:
            connection.executescript(";".join(leases._TABLES.values()))
        writer = _receiver(self, self.journal)
        with contextlib.closing(sqlite3.connect(self.journal, isolation_level=None)) as reader:
            reader.execute("BEGIN")
            reader.execute("SELECT * FROM receiver_decisions").fetchall()
            with self.assertRaisesRegex(LeaseError, "database is locked"):
                writer.write(RESOURCE, 1, "one")
            reader.execute("ROLLBACK")
        self.assertIsNone(writer.read(RESOURCE))
        self.assertEqual(writer.write(RESOURCE, 1, "one").outcome, Outcome.APPLIED)

        # Other processes write on, opening that database, made by another program, at once:
        # it stays in the journal mode it has.
        written = _run_together(self, _write_epochs, [(self.journal, f"w{i}", range(2, 4)) for i in
                                                      range(4)])
        outcomes = Counter(outcome for run in written for _, outcome in run)
        self.assertEqual((outcomes["applied"], sum(outcomes.values())), (2, 8))  # epochs 2, 3
        with contextlib.closing(sqlite3.connect(self.journal)) as connection:
            self.assertEqual(connection.execute("PRAGMA journal_mode").fetchone(), ("delete",))
        with self.subTest("Ctrl-C as BEGIN returns leaves the object usable and the lock free"):
            # A KeyboardInterrupt raised while BEGIN waits for the lock arrives once it returns.
            with _raising(writer, "BEGIN", KeyboardInterrupt(), after=True), \
                    self.assertRaises(KeyboardInterrupt):
                writer.write(RESOURCE, 5, "five")
            with contextlib.closing(sqlite3.connect(self.journal, timeout=0)) as other:
                other.execute("BEGIN IMMEDIATE")  # "database is locked" if it were still held
            self.assertEqual(writer.write(RESOURCE, 5, "five").outcome, Outcome.APPLIED)

    def waits_for_a_lock_within_its_bound_and_heeds_ctrl_c_at_once(self) -> None:
        holding = sqlite3.connect(self.path, isolation_level=None, timeout=0)  # another process's
        self.addCleanup(holding.close)
        waiting = _authority(self, self.path)
        with self.subTest("Ctrl-C while a call waits for another's lock lands at once"):
            leases.BUSY_TIMEOUT_SECONDS = 5.0  # ended by the interrupt, long before
            holding.execute("BEGIN IMMEDIATE")
            began, sent = threading.Event(), []
            assert waiting._connection is not None

            def note_begin(sql: str) -> None:
                if sql == "BEGIN IMMEDIATE":
                    began.set()

            waiting._connection.set_trace_callback(note_begin)

            def interrupt(main: int) -> None:  # as Ctrl-C does, once the call waits
                if began.wait(TIMEOUT):
                    sent.append(time.monotonic())
                    signal.pthread_kill(main, signal.SIGINT)

            self.addCleanup(signal.signal, signal.SIGINT,
                            signal.signal(signal.SIGINT, signal.default_int_handler))
            interrupter = threading.Thread(target=interrupt, args=(threading.get_ident(),))
            interrupter.start()
            with self.assertRaises(KeyboardInterrupt):
                waiting.acquire("waited", "A", now=0, ttl=1)
            landed = time.monotonic()
            interrupter.join(TIMEOUT)
            self.assertLess(landed - sent[0], 1.0, "Ctrl-C waited for the lock")
            waiting._connection.set_trace_callback(None)
            holding.execute("ROLLBACK")
            self.assertEqual(waiting.acquire("waited", "A", now=0, ttl=1).epoch, 1)
            holding.execute("BEGIN IMMEDIATE")  # "database is locked" if it were still held
            holding.execute("ROLLBACK")
        with self.subTest("a call waits for another's lock until the bound, then says so"):
            leases.BUSY_TIMEOUT_SECONDS = 0.3
            holding.execute("BEGIN IMMEDIATE")
            started = time.monotonic()
            with self.assertRaisesRegex(LeaseError, "database is locked"):
                waiting.acquire("waited", "A", now=1, ttl=1)
            self.assertGreaterEqual(time.monotonic() - started, 0.3)
            holding.execute("ROLLBACK")
            with concurrent.futures.ThreadPoolExecutor(1) as pool, waiting._lock:
                call = pool.submit(waiting.acquire, "waited", "A", now=1, ttl=1)
                with self.assertRaisesRegex(LeaseError, "another thread's call kept it busy"):
                    call.result(TIMEOUT)
        with self.subTest("a call that Ctrl-C cut short, holding its object's lock, leaves the "
                          "object usable by its thread"):
            waiting._lock.acquire()  # as a KeyboardInterrupt just after the lock was taken
            self.addCleanup(waiting._lock.release)
            self.assertEqual(waiting.acquire("cut short", "A", now=1, ttl=1).epoch, 1)
        leases.BUSY_TIMEOUT_SECONDS = TIMEOUT
        with self.subTest("a COMMIT that waits for a reader to finish tries again"):
            store = _receiver(self, self.journal)
            reader = sqlite3.connect(self.journal, isolation_level=None)
            self.addCleanup(reader.close)
            reader.execute("BEGIN")
            reader.execute("SELECT * FROM receiver_decisions").fetchall()
            tries: list[str] = []

            def finish_reading(sql: str) -> None:  # once the COMMIT was found busy
                tries.append(sql)
                if tries.count("COMMIT") == 2:
                    reader.execute("ROLLBACK")

            assert store._connection is not None
            store._connection.set_trace_callback(finish_reading)
            self.assertEqual(store.write("waited", 1, "one").outcome, Outcome.APPLIED)
            self.assertEqual(tries.count("COMMIT"), 2)
        with self.subTest("a reader of an older snapshot neither fails nor holds up a call; the "
                          "change goes into the file itself by a later call"):
            store = _receiver(self, self.path)
            reader = sqlite3.connect(self.path, isolation_level=None)
            self.addCleanup(reader.close)
            reader.execute("BEGIN")
            reader.execute("SELECT * FROM receiver_decisions").fetchall()
            started = time.monotonic()
            self.assertEqual(store.write("read", 1, "one").outcome, Outcome.APPLIED)
            self.assertLess(time.monotonic() - started, TIMEOUT / 2)
            reader.execute("ROLLBACK")
            self.assertEqual(store.write("read", 2, "two").outcome, Outcome.APPLIED)
            alone = os.path.join(os.path.dirname(self.path), "file-alone.sqlite3")
            subprocess.run(["cp", self.path, alone], check=True)  # the file, without its log
            with contextlib.closing(sqlite3.connect(alone)) as copy:
                self.assertEqual(copy.execute("SELECT epoch FROM receiver_decisions WHERE"
                                              " resource = 'read' ORDER BY seq").fetchall(),
                                 [(1,), (2,)])

    def refuses_every_call_once_its_file_is_renamed_or_given_another_name(self) -> None:
        for how in ("renamed", "linked by a new name, the old one removed", "renamed mid-call"):
            with self.subTest("a file moved while open refuses every later call, and the new "
                              "name's opener carries on the epochs", moved=how):
                folder = tempfile.mkdtemp(dir=os.path.dirname(self.path))
                old, new = os.path.join(folder, "old.sqlite3"), os.path.join(folder, "new.sqlite3")
                moved = _authority(self, old)
                given = []
                for _ in range(2):  # their grants are still in the log of the old name
                    given.append(moved.acquire(RESOURCE, "A", now=0, ttl=1))
                    moved.release(given[-1])
                if how == "renamed mid-call":
                    assert moved._connection is not None

                    def rename_at_commit(sql: str, old: str = old, new: str = new) -> None:
                        if sql == "COMMIT":
                            os.rename(old, new)

                    moved._connection.set_trace_callback(rename_at_commit)
                elif how == "renamed":
                    os.rename(old, new)
                else:
                    os.link(old, new)
                    with self.assertRaisesRegex(LeaseError, re.escape(repr(old))):
                        moved.current(RESOURCE, now=0)
                    os.unlink(old)
                refused = f"{re.escape(repr(old))}.* renamed"
                with self.assertRaisesRegex(LeaseError, refused):
                    moved.acquire(RESOURCE, "A", now=0, ttl=1)
                with self.assertRaisesRegex(LeaseError, refused):
                    moved.current(RESOURCE, now=0)
                [taken] = _run_together(self, _take_over_and_write, [(new, 1000)])
                self.assertNotIn(taken.epoch, [lease.epoch for lease in given])
                # Mid-call, epoch 3 was granted, but given to no one.
                self.assertEqual(taken.epoch, 4 if how == "renamed mid-call" else 3)
                os.rename(new, old)  # back under the old name, with a log and a cache out of date
                with self.assertRaisesRegex(LeaseError, "renamed"):
                    moved.current(RESOURCE, now=0)

    def test_invalid_input_raises_naming_the_parameter_and_changes_nothing(self) -> None:
        self.refuses_each_bad_argument_by_name_and_changes_nothing()
        self.refuses_a_path_that_is_not_a_plain_file_name()
        self.refuses_a_file_that_is_not_its_database_and_leaves_it_as_it_was()
        self.makes_a_new_database_whole_under_one_name()
        self.refuses_a_closed_store_naming_its_file()

    def refuses_each_bad_argument_by_name_and_changes_nothing(self) -> None:
        self.path = _database(self)
        self.folder = os.path.dirname(self.path)
        authority, receiver = _authority(self, self.path), _receiver(self, self.path)
        lease = authority.acquire(RESOURCE, "A", now=0, ttl=10)
        receiver.write(RESOURCE, 1, "one")
        before = _dump(self.path)
        big, top = 2**63, 2**63 - 1

        def acquire(parameter: str) -> Callable[[Any], Lease]:  # one good argument made `bad`
            good = {"resource": RESOURCE, "holder": "B", "now": 20, "ttl": 1}
            return lambda bad: authority.acquire(**{**good, parameter: bad})

        cases: list[tuple[type[Exception], str, Any, Callable[[Any], object]]] = [
            (TypeError, "resource", 7, acquire("resource")),
            (ValueError, "resource", "", acquire("resource")),
            (ValueError, "resource", "\ud800", acquire("resource")),  # not encodable as UTF-8
            (TypeError, "holder", None, acquire("holder")),
            (TypeError, "now", True, acquire("now")),
            (ValueError, "now", -1, acquire("now")),
            (ValueError, "now", big, acquire("now")),
            (ValueError, "ttl", 0, acquire("ttl")),
            (TypeError, "ttl", 1.5, acquire("ttl")),
            (ValueError, "now + ttl", big - 1, acquire("now")),
            (TypeError, "lease", "A", lambda bad: authority.renew(bad, now=1, ttl=10)),
            (ValueError, "lease.epoch", 0, lambda bad: authority.release(Lease("r", "A", bad, 9))),
            (ValueError, "now", -5, lambda bad: authority.current(RESOURCE, now=bad)),
            (ValueError, "epoch", 0, lambda bad: receiver.write(RESOURCE, bad, "zero")),
            (TypeError, "epoch", True, lambda bad: receiver.write(RESOURCE, bad, "true")),
            (ValueError, "epoch", big, lambda bad: receiver.write(RESOURCE, bad, "huge")),
            (TypeError, "value", b"bytes", lambda bad: receiver.write(RESOURCE, 2, bad)),
            (TypeError, "fenced", "yes", lambda bad: Receiver(self.path, fenced=bad)),
            (TypeError, "path", None, LeaseAuthority),
        ]
        for error, name, bad, call in cases:
            with self.subTest("bad input is refused naming the parameter", parameter=name,
                              value=bad):
                with self.assertRaises(error) as caught:
                    call(bad)
                self.assertIn(name, str(caught.exception))
                self.assertIn(repr(bad), str(caught.exception))
        with self.subTest("a text too long for SQLite is a LeaseError, whatever its size"):
            # What SQLite's binding raises for a str over 2 GiB, without making one.
            too_long = OverflowError("string longer than INT_MAX bytes")
            with _raising(receiver, "INSERT", too_long, after=False), \
                    self.assertRaisesRegex(LeaseError, "string longer than INT_MAX bytes"):
                receiver.write("r", 2, "four")
        self.assertEqual(_dump(self.path), before)
        self.assertEqual(authority.current(RESOURCE, now=0), lease)

        with self.subTest("the largest value of each integer is accepted"):
            authority.acquire("edge-now", "A", now=top - 1, ttl=1)  # now + ttl == top
            authority.acquire("edge-ttl", "A", now=0, ttl=top)
            authority.current(RESOURCE, now=top)
            receiver.write("edge-epoch", top, "top")
        with self.subTest("a resource past its last epoch is a LeaseError, and nothing changes"):
            with contextlib.closing(sqlite3.connect(self.path)) as editor, editor:
                editor.execute("UPDATE leases SET epoch = ?, holder = NULL", (top,))
            with self.assertRaisesRegex(LeaseError, f"used its last epoch, {top}"):
                authority.acquire(RESOURCE, "B", now=20, ttl=1)

        with self.subTest("LeaseHeld, LeaseLost and ExperimentError survive pickling, as a process "
                          "pool sends them"):
            held = LeaseHeld(lease)
            lost = LeaseLost(lease, Lease(RESOURCE, "B", 2, 20), "taken over")
            for refusal in (held, lost, ExperimentError("s", "step 0 (A write at tick 1)", "hung")):
                copy = pickle.loads(pickle.dumps(refusal))
                self.assertEqual((type(copy), str(copy), vars(copy)),
                                 (type(refusal), str(refusal), vars(refusal)))

        with self.subTest("from another thread, operations and close work"):
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                self.assertEqual(pool.submit(receiver.read, RESOURCE).result(), (1, "one"))
                pool.submit(receiver.close).result()
            with self.assertRaisesRegex(LeaseError, "is closed"):
                receiver.read(RESOURCE)

    def refuses_a_path_that_is_not_a_plain_file_name(self) -> None:
        paths: list[tuple[type[Exception], Any]] = [
            (ValueError, ":memory:"),  # the model is processes sharing a file
            (ValueError, "file:leases.sqlite3?mode=memory"),
            (ValueError, "leases\0.sqlite3"),
            (ValueError, ""),
            (ValueError, os.path.join(self.folder, "new") + os.sep),  # a folder's name, not a file's
            (TypeError, b"leases.sqlite3"),
            (LeaseError, os.path.join(self.folder, "missing", "leases.sqlite3")),
            (LeaseError, self.folder),
            (ValueError, "\ud800.sqlite3"),  # no file name can hold it
        ]
        for error, bad in paths:
            with self.subTest("a path that cannot be a database is refused", path=bad):
                with self.assertRaises(error) as caught:
                    Receiver(bad)
                named = os.path.abspath(bad) if error is LeaseError else bad
                self.assertIn(repr(named), str(caught.exception))
        self.assertFalse(os.path.exists(os.path.join(self.folder, "new")))

    def refuses_a_file_that_is_not_its_database_and_leaves_it_as_it_was(self) -> None:
        unusable: list[str] = []
        for size in (0, 1, 2, 511, 512, 4000):  # SQLite takes a file under 512 bytes for empty
            unusable.append(os.path.join(self.folder, f"notes-{size}.txt"))
            with open(unusable[-1], "wb") as file:
                file.write((b"not a database\n" * (1 + size // 15))[:size])
        tables = ";".join(leases._TABLES.values())
        for number, statement in enumerate([
            "CREATE TABLE unrelated (name TEXT)",  # an SQLite database, but not the model's
            "CREATE TABLE leases (name TEXT)",  # the model's name, another shape
            "CREATE TABLE LEASES (name TEXT)",  # SQLite's names ignore case
            "CREATE VIEW receiver_decisions AS SELECT 1",  # views share the tables' names
            leases._TABLES["leases"],  # one of the model's tables, without the other
            # The model's own tables, with a trigger that would quietly drop every grant, or an
            # index that would refuse a holder's second grant.
            (f"{tables}; CREATE TRIGGER drop_grants BEFORE INSERT ON Leases"
             " BEGIN SELECT RAISE(IGNORE); END"),
            f"{tables}; CREATE UNIQUE INDEX one_grant ON leases (holder)",
        ]):
            unusable.append(os.path.join(self.folder, f"foreign-{number}.sqlite3"))
            with contextlib.closing(sqlite3.connect(unusable[-1])) as connection:
                connection.executescript(statement)
        # One left by another program in WAL mode, with a trigger only in its log, not yet
        # folded into the file: the program ended without closing it, as a killed one does.
        unusable.append(os.path.join(self.folder, "live.sqlite3"))
        trigger = "CREATE TRIGGER t BEFORE INSERT ON leases BEGIN SELECT RAISE(IGNORE); END"
        program = _start(self, _leave_open_in_wal_mode, unusable[-1], trigger)
        program.join(TIMEOUT)
        self.assertEqual(program.exitcode, 0)
        unusable.append(os.path.join(self.folder, "fifo"))  # reading it would wait for a writer
        os.mkfifo(unusable[-1])
        unusable.append(os.path.join(self.folder, "second-name.sqlite3"))  # two names, two logs
        Receiver(os.path.join(self.folder, "first-name.sqlite3")).close()
        os.link(os.path.join(self.folder, "first-name.sqlite3"), unusable[-1])
        untouched = _snapshot(self.folder)
        for name in unusable:
            for open_it in (LeaseAuthority, Receiver):
                with self.subTest("a file that is not one of ours is refused and left as it was",
                                  file=os.path.basename(name), opened_by=open_it.__name__):
                    with self.assertRaisesRegex(LeaseError, re.escape(repr(name))):
                        open_it(name)
                    self.assertEqual(_snapshot(self.folder), untouched)
        for name, reason in [
            ("notes-1.txt", "its tables are not exactly the model's"),
            ("notes-512.txt", "file is not a database"),
            ("fifo", "it is not a regular file"),
            ("second-name.sqlite3", "the file has another name"),
        ]:
            with self.subTest("the refusal says why", file=name), \
                    self.assertRaisesRegex(LeaseError, reason):
                Receiver(os.path.join(self.folder, name))
        with self.subTest("a file mounted over another name (a bind mount) is refused there"):
            mountinfo = os.path.join(self.folder, "mountinfo")
            with open(mountinfo, "w", encoding="utf-8") as file:
                file.write("22 1 254:0 / / rw - ext4 /dev/vda rw\n"
                           "42 27 254:0 /a/db /tmp/my\\040db rw - ext4 /dev/vda rw\n")
            self.assertEqual(leases._mount_points(mountinfo), {"/", "/tmp/my db"})
            self.assertEqual(leases._mount_points(os.path.join(self.folder, "none")), set())
            mounted = os.path.join(self.folder, "mounted.sqlite3")
            Receiver(os.path.join(self.folder, "source.sqlite3")).close()
            with open(mounted, "w", encoding="utf-8"):
                pass
            bind = subprocess.run(["mount", "--bind", os.path.join(self.folder, "source.sqlite3"),
                                   mounted], capture_output=True, check=False)
            if bind.returncode != 0:  # not root, or no mount here: the same path, said mounted
                self.addCleanup(setattr, leases, "_mount_points", leases._mount_points)
                leases._mount_points = lambda mountinfo="": {mounted}
            else:
                self.addCleanup(subprocess.run, ["umount", mounted], check=True)
            with self.assertRaisesRegex(LeaseError, r"mounted.sqlite3.*a bind mount"):
                LeaseAuthority(mounted)

    def makes_a_new_database_whole_under_one_name(self) -> None:
        with self.subTest("a new database is read only once it has one name, its draft's gone"):
            # Another process makes a new database as a draft, links it into place, and
            # removes the draft, keeping the file locked meanwhile: an opener then reading it
            # must count its names only once it could read it.
            os.unlink(os.path.join(self.folder, "second-name.sqlite3"))
            draft = os.path.join(self.folder, ".leases-0123456789abcdef.draft")
            os.link(os.path.join(self.folder, "first-name.sqlite3"), draft)
            creator = sqlite3.connect(draft, isolation_level=None)
            self.addCleanup(creator.close)
            creator.execute("PRAGMA locking_mode=EXCLUSIVE")
            creator.executescript("BEGIN EXCLUSIVE; COMMIT")
            reading, ready, results, go = SPAWN.Event(), SPAWN.Queue(), SPAWN.Queue(), _set()
            first = os.path.join(self.folder, "first-name.sqlite3")
            opener = _start(self, _job, 0, _open_while_created, (first, reading), ready, go,
                            results)
            self.assertTrue(reading.wait(TIMEOUT), "the opener never came to read the file")
            os.unlink(draft)
            creator.close()
            self.assertEqual(_collect(self, results, [opener]), ["opened"])
        with self.subTest("a new database is linked into place locked, until its draft is gone"):
            locked = os.path.join(self.folder, "locked.sqlite3")
            looked: list[str] = []
            real_link, real_unlink = os.link, os.unlink

            def look() -> None:  # as another opener would, at that moment
                with contextlib.closing(sqlite3.connect(f"file:{locked}?mode=ro", uri=True,
                                                        timeout=0)) as other:
                    try:
                        other.execute("SELECT * FROM sqlite_master").fetchall()
                        looked.append("read")
                    except sqlite3.OperationalError as exc:
                        looked.append(str(exc))

            def link(draft: str, name: str) -> None:
                real_link(draft, name)
                look()

            def unlink(name: str) -> None:
                if name.endswith(".draft") and os.path.exists(name):
                    look()
                real_unlink(name)

            with mock.patch.object(os, "link", link), mock.patch.object(os, "unlink", unlink):
                Receiver(locked).close()
            self.assertEqual(looked, ["database is locked"] * 2)
        with self.subTest("a new file gets the mode the umask allows, as any file the user makes"):
            previous = os.umask(0o027)
            try:
                Receiver(os.path.join(self.folder, "private.sqlite3")).close()
            finally:
                os.umask(previous)
            mode = stat.S_IMODE(os.stat(os.path.join(self.folder, "private.sqlite3")).st_mode)
            self.assertEqual(mode, 0o640)

    def refuses_a_closed_store_naming_its_file(self) -> None:
        with self.subTest("a closed store raises LeaseError naming the file"):
            closed_authority, closed_receiver = LeaseAuthority(self.path), Receiver(self.path)
            closed_authority.close()
            closed_receiver.close()
            closed_calls: list[Callable[[], object]] = [
                lambda: closed_authority.acquire(RESOURCE, "B", now=20, ttl=1),
                lambda: closed_authority.current(RESOURCE, now=0),
                lambda: closed_receiver.write(RESOURCE, 2, "two"),
                lambda: closed_receiver.decisions(RESOURCE),
            ]
            for closed_call in closed_calls:
                with self.assertRaisesRegex(LeaseError,
                                            f"{re.escape(repr(self.path))} is closed"):
                    closed_call()


class CommandLineTests(unittest.TestCase):
    def setUp(self) -> None:
        folder = tempfile.TemporaryDirectory(prefix="leases-cli-")
        self.addCleanup(folder.cleanup)
        self.folder = folder.name
        self.never = os.path.join(self.folder, "never.json")
        self.results = os.path.join(HERE, "results.json")
        self.process, self.written = _run()
        self.expected = json.loads(self.written)

    def evidence(self) -> Any:
        """What a run gives, without playing it again."""
        return json.loads(self.written)

    def write_json(self, name: str, document: object) -> str:
        with open(os.path.join(self.folder, name), "w", encoding="utf-8") as file:
            json.dump(document, file)
        return file.name

    def test_command_line_reproduces_the_evidence_and_reports_a_difference_or_a_hang(self) -> None:
        self.reproduces_results_json_byte_for_byte_with_a_timeline_per_scenario()
        self.names_a_step_that_hangs_and_a_worker_that_does_not_exit()
        self.names_a_worker_killed_or_signalled_and_ends_with_its_leader()
        self.stops_at_its_next_wait_on_a_stop_signal_leaving_output_untouched()
        self.reports_each_difference_from_the_check_file_verdicts_first()
        self.meets_streams_and_files_as_a_users_shell_gives_them()
        self.checks_a_scenario_or_step_when_it_is_built()
        self.plays_a_readers_own_schedule_with_every_action_through_the_engine()

    def reproduces_results_json_byte_for_byte_with_a_timeline_per_scenario(self) -> None:
        with self.subTest("the README's command reproduces results.json byte for byte"):
            self.assertEqual(self.process.returncode, 0, self.process.stderr)
            self.assertEqual(self.process.stdout,
                             "reproduced: this run matches 'results.json' (3 scenarios)\n")
            self.assertEqual(self.written, _bytes(self.results))
        with self.subTest("stderr shows each scenario's timeline"):
            self.assertCountEqual(self.process.stderr.splitlines(), "\n".join(
                run_experiment.timeline(record)
                for record in self.expected["scenarios"]).split("\n"))

        with self.subTest("a timeline shows every kind of step at a glance"):
            a, b = Step("A", Action.ACQUIRE, 0, ttl=10), Step("B", Action.ACQUIRE, 5, ttl=10)
            late = Step("A", Action.WRITE, 10, value="x")
            shown = [Event.of(a, Answer.GRANTED, 1, 10), Event.of(b, Answer.HELD, 1, 10),
                     _wrote("A", late.tick, 1, "x", Outcome.APPLIED, (1, "x")),
                     Event.of(Step("A", Action.RELEASE, 11), Answer.RELEASED, 1),
                     Event.of(Step("A", Action.CHECK, 12), Answer.NO_LEASE)]
            record = {"name": "own", "receiver": "fenced",
                      "events": [event.as_json() for event in shown], "verdict": judge(shown)}
            self.assertEqual(run_experiment.timeline(record).split("\n"), [
                "own (fenced receiver)",
                "  tick  0  A  acquire  epoch 1   granted   lease until tick 10",
                "  tick  5  B  acquire            held      by epoch 1, live until tick 10",
                "  tick 10  A  write    epoch 1   applied   'x' -> receiver holds epoch 1, 'x'",
                "  tick 11  A  release  epoch 1   released",
                "  tick 12  A  check              no lease",
                "  final value written by A; stale writes refused: 0, conflicting: 0",
                ("  late applied: applied at or after its lease's expiry "
                 "(write_after_lease_expiry_applied)"),
            ])

    def names_a_step_that_hangs_and_a_worker_that_does_not_exit(self) -> None:
        with self.subTest("a hung step is named, and leaves no worker and no folder"):
            # Scenarios play in order, and no spawned interpreter starts within a millisecond,
            # so the first step is the one named; which worker gives up first (A on its
            # report, or B waiting for its turn) is left to chance.
            with self.assertRaisesRegex(ExperimentError, r"scenario 'unfenced_receiver', step 0 "
                                        r"\(A acquire at tick 0\): worker [AB]: .*within 0\.0"):
                run_scenarios(timeout=0.001)
            self.assertEqual(multiprocessing.active_children(), [])
            self.assertEqual(os.listdir(tempfile.gettempdir()), [os.path.basename(self.folder)])
        with self.subTest("a step that does not report in time is named, its worker alive"):
            step = Step("A", Action.ACQUIRE, 0, ttl=1)
            # Kept to the end of the test: a worker still starting up needs its Event to exist.
            slow_orders = run_experiment.Orders(
                os.path.join(self.folder, "slow.sqlite3"), True, "A", [(0, step)],
                [SPAWN.Event()], SPAWN.Queue(), TIMEOUT, os.getpid())
            worker = _start(self, run_experiment.run_worker, slow_orders)
            slow = run_experiment.Play(Scenario("slow", True, "", (step,)), slow_orders.db_path,
                                       [], {"A": slow_orders.reports}, {"A": worker})
            self.assertEqual(run_experiment.take_report(slow, "A", 0.001),
                             ("A", None, "no report within 0.001 s"))
        with self.subTest("a worker that does not exit after its last report is named"):
            self.assertEqual(run_experiment.exit_problem(worker, 0.001),
                             "did not exit within 0.001 s of its last report")
            worker.kill()
            worker.join(TIMEOUT)
        with self.subTest("a worker whose engine is gone gives up within its bound"):
            reports: Queue[Any] = SPAWN.Queue()
            step = Step("A", Action.ACQUIRE, 0, ttl=1)
            db_path = os.path.join(self.folder, "alone.sqlite3")
            orders = run_experiment.Orders(db_path, True, "A", [(0, step)], [SPAWN.Event()],
                                           reports, 0.001, os.getpid())
            worker = _start(self, run_experiment.run_worker, orders)
            worker.join(TIMEOUT)

            class Late:  # its report came just as the engine's wait for it timed out
                empty, waits = reports.empty, [queue.Empty()]

                def get(self, timeout: float) -> Any:
                    if self.waits:
                        raise self.waits.pop()
                    return reports.get(timeout=timeout)

            alone = run_experiment.Play(Scenario("alone", True, "", (step,)), db_path, [],
                                         {"A": Late()}, {"A": worker})  # type: ignore[dict-item]
            self.assertEqual(run_experiment.take_report(alone, "A", TIMEOUT),
                             ("A", None, "TimeoutError: not released within 0.001 s"))

    def names_a_worker_killed_or_signalled_and_ends_with_its_leader(self) -> None:
        with self.subTest("workers ignore Ctrl-C and SIGHUP sent to the group, even starting up"):
            code, out, err = _run_signalling_workers(self, signal.SIGINT, signal.SIGHUP)
            self.assertEqual((code, out, err), (0, self.process.stdout, self.process.stderr))
        with self.subTest("SIGTERM ends a worker, and the engine names the step it waited for"):
            code, out, err = _run_signalling_workers(self, signal.SIGTERM)
            self.assertEqual((code, out), (3, ""), err)
            self.assertEqual(err, "run_experiment.py: failed: scenario 'unfenced_receiver', step "
                             "0 (A acquire at tick 0): worker A: ended without a report, exit "
                             "code 143\n")
        kills = [  # (scenario, the step whose report the engine waits for, victim, named)
            (2, 2, "B", "'expiry_before_receiver_observation_gap', step 3 (B write at tick 12)"),
            (0, 1, "A", "'unfenced_receiver', step 3 (A write at tick 11)"),
            (1, 0, "B", "'fenced_receiver', step 1 (B acquire at tick 10)"),  # B may be starting
        ]
        with concurrent.futures.ThreadPoolExecutor() as pool:  # each run is a process of its own
            killed = list(pool.map(lambda kill: _run_killing(self, *kill[:3]), kills))
        for (_, _, victim, named), (code, out, err) in zip(kills, killed):
            with self.subTest("a worker SIGKILLed while it waits ends the run, exit 3, the step "
                              "named", victim=victim, named=named):
                self.assertEqual((code, out), (3, ""), err)
                self.assertEqual(err, f"run_experiment.py: failed: scenario {named}: worker "
                                 f"{victim}: ended without a report, exit code -9\n")
        with self.subTest("the leader SIGKILLed while its workers wait: they, and the resource "
                          "tracker, are gone within 10 s"):
            program = [sys.executable, "-c", "import test_leases; test_leases._leading()"]
            # Its stderr is the tracker's, which says what semaphores it removed.  Killed, it
            # leaves its temporary folder, in this test's.
            leader = subprocess.Popen(program, cwd=HERE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True,
                                      env={**os.environ, "TMPDIR": self.folder})
            self.addCleanup(leader.wait, TIMEOUT)
            self.addCleanup(leader.kill)
            assert leader.stdout is not None
            self.addCleanup(leader.stdout.close)
            pids = json.loads(leader.stdout.readline())
            self.assertEqual(len(pids), 7)  # six workers and the tracker
            leader.kill()
            self.assertEqual(_gone_within(pids, 10.0), [])
        for code in (5, -signal.SIGKILL):
            with self.subTest("a worker that exits nonzero, or is killed, after its last report "
                              "fails the run at that step, before the next is released",
                              code=code), \
                    mock.patch.object(run_experiment, "run_worker",
                                      functools.partial(_serving_then, code)):
                two = Scenario("two", True, "", (Step("A", Action.ACQUIRE, 0, ttl=1),
                                                 Step("B", Action.ACQUIRE, 1, ttl=1)))
                with self.assertRaises(ExperimentError) as caught:
                    run_scenarios([two], timeout=TIMEOUT)
                self.assertEqual(str(caught.exception), "scenario 'two', step 0 (A acquire at "
                                 f"tick 0): worker A: exited with code {code} after its last "
                                 "report")

    def stops_at_its_next_wait_on_a_stop_signal_leaving_output_untouched(self) -> None:
        real_report, ended_at_the_wait = run_experiment.take_report, []

        def stopped_while_waiting(play: Any, actor: str, timeout: float) -> Any:
            signal.raise_signal(signal.SIGTERM)
            try:
                return real_report(play, actor, timeout)
            except KeyboardInterrupt:
                ended_at_the_wait.append(actor)
                raise

        with self.subTest("a stop while waiting for a report ends the run there, in one line"), \
                mock.patch.object(run_experiment, "take_report", stopped_while_waiting):
            code, out, err = _main("--output", self.never, heed=signal.SIGTERM,
                                   play=run_experiment.run_scenarios)
            self.assertEqual((code, out, ended_at_the_wait), (143, "", ["A"]), err)
            self.assertEqual(err, "run_experiment.py: stopped by SIGTERM; every worker was "
                             "stopped, every temporary folder removed, and --output left "
                             "untouched\n")
            self.assertFalse(os.path.exists(self.never))
            self.assertEqual(multiprocessing.active_children(), [])
            self.assertEqual(os.listdir(tempfile.gettempdir()), [os.path.basename(self.folder)])
        with self.subTest("a stop signal ignored from the start stays ignored, as in a "
                          "background job"):
            def hung_up() -> Any:
                signal.raise_signal(signal.SIGHUP)
                return self.evidence()

            ignored = signal.signal(signal.SIGHUP, signal.SIG_IGN)
            try:
                code, out, err = _main("--output", self.never, play=hung_up)
            finally:
                signal.signal(signal.SIGHUP, ignored)
            self.assertEqual((code, out, _bytes(self.never)), (0, "", self.written))
            os.unlink(self.never)
        for number in STOP_SIGNALS:
            def stop_then(outcome: Callable[[], Any], number: int = number) -> Any:
                signal.raise_signal(number)
                return outcome()

            def failed() -> Any:
                raise ExperimentError("s", "step 0", "worker A: ended without a report")

            for outcome in (self.evidence, failed):
                with self.subTest("a stop during the run is 128 + n, and --output left untouched",
                                  signal=signal.Signals(number).name, run=outcome.__name__):
                    code, out, err = _main("--output", self.never, heed=number,
                                           play=functools.partial(stop_then, outcome))
                    self.assertEqual((code, out, len(err.splitlines())), (128 + number, "", 1))
                    self.assertIn(f"stopped by {signal.Signals(number).name}", err)
                    self.assertFalse(os.path.exists(self.never))

        with self.subTest("two stops: the first one noted is the one reported"):
            def two_stops() -> Any:
                signal.raise_signal(signal.SIGTERM)
                signal.raise_signal(signal.SIGHUP)
                return self.evidence()

            code, out, err = _main("--output", self.never, heed=(signal.SIGTERM, signal.SIGHUP),
                                   play=two_stops)
            self.assertEqual((code, out), (128 + signal.SIGTERM, ""))
            self.assertIn("stopped by SIGTERM", err)

    def reports_each_difference_from_the_check_file_verdicts_first(self) -> None:
        with self.subTest("--check reports the differing JSON paths, verdicts first; exit 1, "
                          "and --output is still written"):
            document = self.evidence()
            document["scenarios"][0]["events"][3]["outcome"] = "stale"
            document["scenarios"][1]["verdict"]["stale_writes_refused"] = True  # 1 == True
            document["scenarios"][2]["lease_at_end"]["epoch"] = 3
            self.tampered = self.write_json("tampered.json", document)
            self.tampered_document = document
            code, out, err = _main("--check", self.tampered, "--output", self.never,
                                   play=self.evidence)
            self.assertEqual(code, 1, err)
            self.assertEqual(out.splitlines()[1:], [  # what the runs concluded, first
                "  $.scenarios[1].verdict.stale_writes_refused: expected true, got 1",
                "  $.scenarios[2].lease_at_end.epoch: expected 3, got 2",
                '  $.scenarios[0].events[3].outcome: expected "stale", got "applied"',
            ])
            self.assertEqual(_bytes(self.never), self.written)
            os.unlink(self.never)
        for where, change, said in [
            ("a verdict", ("final", "value"),
             '$.scenarios[2].final.value: expected "x", got "report by B"'),
            ("an event", ("events", 0, "tick"),
             '$.scenarios[2].events[0].tick: expected "x", got 0'),
            ("the receiver's log", ("decisions", 0, "value"),
             '$.scenarios[2].decisions[0].value: expected "x", got "report by A"'),
        ]:
            with self.subTest("one differing path is exit 1, and the path is named", where=where):
                one = self.evidence()
                *into, last = change
                functools.reduce(lambda item, key: item[key], into, one["scenarios"][2])[
                    last] = "x"
                code, out, err = _main("--check", self.write_json("one.json", one),
                                       play=self.evidence)
                self.assertEqual((code, out.splitlines()[1:]), (1, [f"  {said}"]), err)
        with self.subTest("a long value is cut to 70 characters in the report"):
            long = self.evidence()
            long["scenarios"][2]["final"]["value"] = "x" * 300
            code, out, err = _main("--check", self.write_json("long.json", long),
                                   play=self.evidence)
            self.assertEqual(out.splitlines()[1], f'  $.scenarios[2].final.value: expected '
                             f'"{"x" * 66}..., got "report by B"')  # 70 in all
        with self.subTest("with neither --check nor --output, stdout is the evidence"):
            self.assertEqual(_main(play=self.evidence)[:2], (0, self.written.decode("ascii")))
        with self.subTest("an unexpected error exits 70, not 1, in one line naming it"):
            def starved() -> Any:
                raise MemoryError("out of memory")

            said = "run_experiment.py: unexpected error: MemoryError: out of memory\n"
            self.assertEqual(_main(play=starved), (70, "", said))
        with self.subTest("the report is ASCII whatever the --check path, for an ASCII stdout"):
            accented = os.path.join(self.folder, "r\u00e9sultats.json")
            shutil.copyfile(self.results, accented)
            code, out, err = _main("--check", accented, play=self.evidence)
            said = f"reproduced: this run matches {accented!a} (3 scenarios)\n"
            self.assertEqual((code, out), (0, said), err)
            self.assertTrue(out.isascii())
        for depth in range(900, 1101):
            with self.subTest("a --check nested at any depth is exit 1, or exit 2 in one line, "
                              "and --output is written exactly when it is 1", depth=depth):
                nested = os.path.join(self.folder, "nested.json")
                with open(nested, "w", encoding="ascii") as file:
                    file.write("[" * depth + "]" * depth)
                code, out, err = _main("--check", nested, "--output", self.never,
                                       play=self.evidence)
                self.assertIn(code, (1, 2), err)
                self.assertEqual(os.path.exists(self.never), code == 1)
                if code == 1:
                    self.assertTrue(out.splitlines()[1].startswith("  $: expected ["), out)
                    os.unlink(self.never)
                else:
                    self.assertEqual((out, len(err.splitlines())), ("", 1))
        with self.subTest("twelve differences: the first ten are shown, and how many more"):
            twelve = self.evidence()
            for record in twelve["scenarios"]:
                for event in record["events"][:4]:
                    event["tick"] += 100
            code, out, err = _main("--check", self.write_json("twelve.json", twelve),
                                   play=self.evidence)
            self.assertEqual((code, len(out.splitlines())), (1, 12), out)
            self.assertIn("at 12 JSON path", out)
            self.assertTrue(out.endswith("  ... and 2 more\n"), out)
        missing = run_experiment.MISSING
        for want, got, found in [
            ({"a": [1, 2]}, {"a": [1, 2]}, []),
            ([1, 2], [1], [("$[1]", 2, missing)]),  # an event missing
            ([1], [1, {"b": 2}], [("$[1]", missing, {"b": 2})]),  # one extra
            ({"a": 1}, {"b": 1}, [("$.a", 1, missing), ("$.b", missing, 1)]),
            ({"a": []}, {"a": {}}, [("$.a", [], {})]),  # a list where an object should be
            ({"a": {}}, {"a": []}, [("$.a", {}, [])]),
            ([{"x": 1}], [[1]], [("$[0]", {"x": 1}, [1])]),
            ([True, 1, 1.0], [1, True, 1], [("$[0]", True, 1), ("$[1]", 1, True),
                                             ("$[2]", 1.0, 1)]),
        ]:
            with self.subTest("differences() finds every kind of difference", want=want, got=got):
                self.assertEqual(list(run_experiment.differences(want, got)), found)

    def meets_streams_and_files_as_a_users_shell_gives_them(self) -> None:
        with self.subTest("--check reads a pipe, as <(git show HEAD:results.json) gives it"):
            read, write = os.pipe()
            with open(write, "wb") as pipe:
                pipe.write(self.written)
            self.addCleanup(os.close, read)
            code, out, err = _main("--check", f"/dev/fd/{read}", play=self.evidence)
            said = f"reproduced: this run matches '/dev/fd/{read}' (3 scenarios)\n"
            self.assertEqual((code, out), (0, said), err)

        with self.subTest("stdout closed by its reader (| true): exit 32, quietly, the output "
                          "in place first"):
            code, out, err = _main("--check", self.results, "--output", self.never,
                                   play=self.evidence,
                                   stdout=_Closed())
            self.assertEqual((code, err), (32, ""))
            self.assertEqual(_bytes(self.never), self.written)
            self.assertEqual(_main("--help", stdout=_Closed())[0], 32)
            full_disk = "cannot write to stdout: [Errno 28] No space left on device"
            self.assertEqual(_main("--help", stdout=_Full())[::2],
                             (2, f"run_experiment.py: error: {full_disk}\n"))
        with self.subTest("no stdout at all (>&-) is one clear line and exit 2"):
            said = "run_experiment.py: error: cannot write to stdout: it is closed\n"
            self.assertEqual(_main("--help", closed_stdout=True), (2, "", said))
        # As in a user's terminal: buffered, what a failed write left would fail again in the
        # interpreter's last flush, with a traceback and exit 120.
        buffered = {name: value for name, value in os.environ.items()
                    if name != "PYTHONUNBUFFERED"}
        with self.subTest("a full stdout is one line and exit 2; a full stderr changes "
                          "nothing; never exit 120"), open("/dev/full", "w") as full:
            program = [sys.executable, os.path.join(HERE, "run_experiment.py")]
            done = subprocess.run([*program, "--help"], stdout=full, stderr=subprocess.PIPE,
                                  timeout=TIMEOUT, check=False, text=True, env=buffered)
            said = "run_experiment.py: error: cannot write to stdout: [Errno 28] No space left"
            self.assertEqual((done.returncode, done.stderr), (2, f"{said} on device\n"))
            done = subprocess.run([*program, "--check", "missing.json"], stderr=full,
                                  timeout=TIMEOUT, check=False, text=True)
            self.assertEqual(done.returncode, 2)
        with self.subTest("a pipe closed by its reader is exit 32 for a real process too"):
            read, write = os.pipe()
            os.close(read)
            with open(write, "wb") as closed:
                done = subprocess.run([*program, "--help"], stdout=closed, timeout=TIMEOUT,
                                      stderr=subprocess.PIPE, check=False, text=True,
                                      env=buffered)
            self.assertEqual((done.returncode, done.stderr), (32, ""))
        with self.subTest("an --output that cannot be put in place is left as it was, with no "
                          "success line"), mock.patch.object(
                os, "replace", side_effect=OSError(28, "No space left on device")):
            code, out, err = _main("--check", self.results, "--output", self.never,
                                   play=self.evidence)
            said = f"run_experiment.py: error: {self.never!r}: No space left on device\n"
            self.assertEqual((code, out, err), (2, "", said))
            self.assertEqual((_bytes(self.never), os.listdir(self.folder).count("never.json")),
                             (self.written, 1))
            self.assertFalse([name for name in os.listdir(self.folder) if name.endswith(".tmp")])

        # Files that are not what they seem: each refused before the run with exit 2 and one
        # line, nothing replaced.  The --check file must never be overwritten, whatever name
        # reaches it.
        fifo, loop = os.path.join(self.folder, "fifo"), os.path.join(self.folder, "loop")
        deep = os.path.join(self.folder, "deep.json")
        with open(deep, "w", encoding="ascii") as file:
            file.write("[" * 100_000 + "]" * 100_000)
        os.mkfifo(fifo)
        os.symlink(loop, loop)
        link, hard = os.path.join(self.folder, "link.json"), os.path.join(self.folder, "hard.json")
        os.symlink(self.tampered, link)
        os.link(self.tampered, hard)
        for arguments, reason in [
            (("--check", os.path.join(self.folder, "missing.json")), "missing.json"),
            (("--check", self.folder), "Is a directory"),
            (("--check", os.path.join(HERE, "leases.py")), "is not JSON"),
            (("--check", deep), "is not JSON: maximum recursion depth"),
            (("--output", fifo), "is not a regular file"),
            (("--output", loop), "Too many levels of symbolic links"),
            (("--check", self.tampered, "--output", link), "is the --check file"),
            (("--check", self.tampered, "--output", hard), "is the --check file"),
            (("--output", self.folder + os.sep), "must name a file"),
            (("--output=",), "--output must name a file, got ''"),
            (("--bogus",), "unrecognized arguments: --bogus"),
        ]:
            with self.subTest("a file or argument that cannot be used is one line, exit 2",
                              args=arguments):
                code, out, err = _main(*arguments)
                self.assertEqual((code, out, len(err.splitlines())), (2, "", 1), err)
                self.assertIn(reason, err)
        self.assertTrue(stat.S_ISFIFO(os.stat(fifo).st_mode))
        self.assertEqual(json.loads(_bytes(self.tampered)), self.tampered_document)
        with self.subTest("a new --output file gets the mode the umask allows, and the umask "
                          "stays"):
            os.unlink(self.never)
            previous = os.umask(0o027)
            try:
                _main("--output", self.never, play=self.evidence)
            finally:
                left = os.umask(previous)  # reading the umask means setting it: put back
            self.assertEqual((stat.S_IMODE(os.stat(self.never).st_mode), left), (0o640, 0o027))
        with self.subTest("through a symlink, the target is replaced whole, its mode kept"):
            os.symlink("never.json", os.path.join(self.folder, "evidence"))
            os.chmod(self.never, 0o640)
            _main("--output", os.path.join(self.folder, "evidence"), play=self.evidence)
            self.assertEqual((os.readlink(os.path.join(self.folder, "evidence")),
                              stat.S_IMODE(os.stat(self.never).st_mode), _bytes(self.never)),
                             ("never.json", 0o640, self.written))

    def checks_a_scenario_or_step_when_it_is_built(self) -> None:
        builds: list[tuple[Callable[[], object], str]] = [
            (lambda: Scenario("back", True, "", (Step("A", Action.ACQUIRE, 10, ttl=1),
                                                 Step("A", Action.ACQUIRE, 5, ttl=1))),
             (r"step 1 \(A acquire at tick 5\): tick 5 comes before tick 10 of the step before "
              r"it; ticks never go back")),
            (lambda: Step("A", Action.ACQUIRE, True, ttl=1), r"tick must be an int from 0"),
            (lambda: Step("A", Action.CHECK, 2**63), r"tick must be an int from 0 to 2\*\*63 - 1"),
            (lambda: Step("A", Action.ACQUIRE, 0, ttl=2**63), r"a ttl \(an int from 1 to 2\*\*63"),
            (lambda: Step("A", Action.ACQUIRE, 0), "acquire and renew need a ttl"),
            (lambda: Step("A", Action.RENEW, 0, ttl=0), "acquire and renew need a ttl"),
            (lambda: Step("A", Action.WRITE, 0), "a write needs a value"),
            (lambda: Step("", Action.CHECK, 0), "actor must not be empty"),
            (lambda: Scenario("none", True, "", ()), "steps must not be empty"),
            (lambda: Step("A", "acquire", 0, ttl=1), "action an Action"),  # type: ignore[arg-type]
            (lambda: Scenario("list", True, "", [Step("A", Action.CHECK, 0)]),  # type: ignore
             "steps must be a tuple"),
        ]
        for make, reason in builds:
            with self.subTest("a scenario or step is checked when it is built", reason=reason), \
                    self.assertRaisesRegex((TypeError, ValueError), reason):
                make()

    def plays_a_readers_own_schedule_with_every_action_through_the_engine(self) -> None:

        # A reader's own schedule, with every action: A renews at tick 9, so B is refused at
        # tick 10; A checks, writes and releases; B takes over, writes, finds its lease
        # expired at tick 23, and is done.  Then A's next acquisition overflows the tick: the
        # engine released that step only once B had exited, and names it when it fails.
        top = 2**63 - 1
        own = Scenario("own", True, "", (
            Step("A", Action.ACQUIRE, 0, ttl=10),
            Step("A", Action.RENEW, 9, ttl=10),
            Step("B", Action.ACQUIRE, 10, ttl=10),
            Step("A", Action.CHECK, 11),
            Step("A", Action.WRITE, 12, value="by A"),
            Step("A", Action.RELEASE, 13),
            Step("B", Action.ACQUIRE, 13, ttl=10),
            Step("B", Action.WRITE, 14, value="by B"),
            Step("B", Action.CHECK, 23),
            Step("A", Action.ACQUIRE, top, ttl=1),
        ))
        events: list[list[Any]] = []  # (epoch, expires_at, outcome) of each step reported
        exit_codes: list[dict[str, int | None]] = []  # the workers', as each step is released
        play = run_experiment.Play

        class Watch:  # in the engine's hands, a step's Event, or a worker's Queue of reports
            def __init__(self, real: Any, workers: dict[str, BaseProcess]) -> None:
                self.real, self.workers = real, workers

            def __getattr__(self, name: str) -> Any:  # the rest, as the real one does
                return getattr(self.real, name)

            def set(self) -> None:
                exit_codes.append({actor: p.exitcode for actor, p in self.workers.items()})
                self.real.set()

            def get(self, timeout: float) -> Any:
                reported = self.real.get(timeout=timeout)
                if reported[1] is not None:
                    event = reported[1]
                    events.append([event.epoch, event.expires_at, event.outcome])
                return reported

        def watched(scenario: Scenario, path: str, released: Any, reports: Any,
                    workers: Any) -> Any:
            watched_released: Any = [Watch(event, workers) for event in released]
            watched_reports: Any = {actor: Watch(queue, workers)
                                    for actor, queue in reports.items()}
            return play(scenario, path, watched_released, watched_reports, workers)

        with mock.patch.object(run_experiment, "Play", watched), \
                self.assertRaises(ExperimentError) as caught:
            run_scenarios([own], timeout=TIMEOUT)
        self.assertEqual(
            (caught.exception.scenario, caught.exception.step),
            ("own", f"step 9 (A acquire at tick {top})"),
        )
        self.assertIn("now + ttl must not exceed", caught.exception.problem)
        self.assertEqual(events[:9], [
            [1, 10, "granted"], [1, 19, "renewed"], [1, 19, "held"], [1, 19, "live"],
            [1, None, "applied"], [1, None, "released"], [2, 23, "granted"], [2, None, "applied"],
            [2, None, "lost"],
        ])
        self.assertEqual(exit_codes[9], {"A": None, "B": 0})


# --- plumbing, after the tests: child process targets, top level and told everything by their
#     arguments; then the command-line harness ---


def _job(
    number: int,
    function: Callable[..., Any],
    args: tuple[Any, ...],
    ready: "Queue[int]",
    start: "MPEvent",
    results: "Queue[ChildResult]",
) -> None:
    """Report ready, wait for the common start, run `function(*args)` and report its result."""
    try:
        ready.put(number)
        if not start.wait(TIMEOUT):
            raise TimeoutError("start was never given")
        results.put((number, True, function(*args)))
    except BaseException:
        results.put((number, False, traceback.format_exc()))
        raise


def _acquire_and_release(db_path: str, holder: str, rounds: int) -> list[int]:
    """Take the resource `rounds` times, retrying while another process holds it."""
    epochs: list[int] = []
    with LeaseAuthority(db_path) as authority:
        while len(epochs) < rounds:
            try:
                lease = authority.acquire(RESOURCE, holder, now=0, ttl=1)
            except LeaseHeld:
                continue
            epochs.append(lease.epoch)
            authority.release(lease)
    return epochs


def _write_epochs(db_path: str, writer: str, epochs: range) -> list[tuple[int, str]]:
    with Receiver(db_path) as receiver:
        return [(e, receiver.write(RESOURCE, e, writer).outcome.value) for e in epochs]


def _take_over_and_write(db_path: str, now: int) -> Lease:
    with LeaseAuthority(db_path) as authority, Receiver(db_path) as receiver:
        lease = authority.acquire(RESOURCE, "child", now=now, ttl=10)
        receiver.write(RESOURCE, lease.epoch, "from the child")
        return lease


def _pause_before(
    store: LeaseAuthority | Receiver, statement: str, reached: "MPEvent", resume: "MPEvent"
) -> None:
    """Stop `store`'s next statement that starts with `statement`: set `reached`, await `resume`.

    This reaches inside a real operation, between its SQL statements, so that a test can
    decide exactly what another process does at that moment.
    """

    def trap(sql: str) -> None:
        if sql.startswith(statement):
            reached.set()
            resume.wait(TIMEOUT)

    assert store._connection is not None  # an open store
    store._connection.set_trace_callback(trap)


def _acquire_pausing(
    db_path: str, holder: str, now: int, statement: str, reached: "MPEvent", resume: "MPEvent"
) -> Acquisition:
    with LeaseAuthority(db_path) as authority:
        _pause_before(authority, statement, reached, resume)
        try:
            return ("granted", authority.acquire(RESOURCE, holder, now=now, ttl=10).epoch)
        except LeaseHeld as held:
            return ("held", held.lease.epoch)


def _write_pausing(
    db_path: str, epoch: int, value: str, statement: str, reached: "MPEvent", resume: "MPEvent"
) -> WriteResult:
    with Receiver(db_path) as receiver:
        _pause_before(receiver, statement, reached, resume)
        return receiver.write(RESOURCE, epoch, value)


def _set() -> "MPEvent":
    event = SPAWN.Event()
    event.set()
    return event


def _open_while_created(path: str, reading: "MPEvent") -> str:
    """Open a Receiver on `path`, saying when it comes to read the file."""
    real = leases._check_tables

    def check_tables(connection: "leases._Bounded", path: str) -> None:
        reading.set()
        real(connection, path)

    with mock.patch.object(leases, "_check_tables", check_tables):
        Receiver(path).close()
    return "opened"


def _leave_open_in_wal_mode(db_path: str, statements: str) -> None:
    """Make the model's tables, then run `statements` in WAL mode, and end without closing the
    database, as a killed program does: what they did stays in the WAL log only."""
    connection = sqlite3.connect(db_path, isolation_level=None)
    connection.executescript(";".join(leases._TABLES.values()))
    connection.execute("PRAGMA journal_mode=WAL")
    connection.executescript(statements)
    os._exit(0)


class _Closed(io.StringIO):
    """A stdout whose reader has gone, as after `| head -1`."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


class _Full(io.StringIO):
    """A stdout on a full disk, which takes each write into its buffer and fails to flush."""

    def flush(self) -> None:
        raise OSError(28, "No space left on device")


def _main(
    *args: str, play: Callable[[], Any] | None = None, stdout: io.StringIO | None = None,
    heed: int | tuple[int, ...] = (), closed_stdout: bool = False,
) -> tuple[int, str, str]:
    """run_experiment.main(args) in this process: its exit code, stdout and stderr.  `play`
    stands in for playing the scenarios, which the suite does once, in _run(); without it,
    main() must not start a run.

    main() is a program: it takes the stop signals over.  The suite's own handlers are put
    back afterwards.  `closed_stdout` starts it as `>&-` does, with no sys.stdout at all.
    `heed` is a signal, or signals, that the caller sends itself, to be heeded even where the
    suite runs with it ignored (a script's background job ignores SIGINT); a stop main()
    reports for any other came from outside, and stops the suite.
    """
    handlers = {number: signal.getsignal(number) for number in STOP_SIGNALS}
    heeded = heed if isinstance(heed, tuple) else (heed,)
    for number in heeded:
        signal.signal(number, signal.default_int_handler)
    out, err = None if closed_stdout else stdout or io.StringIO(), io.StringIO()

    def no_run() -> Any:
        raise AssertionError("the command line started a run")

    played = mock.patch.object(run_experiment, "run_scenarios", play or no_run)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), played:
            code = run_experiment.main(list(args))
    except SystemExit as exit:  # argparse's own refusals
        code = int(exit.code or 0)
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    if any(number not in heeded for number in run_experiment.noted_stops()):  # whatever code
        raise KeyboardInterrupt(err.getvalue().strip())
    return code, "" if out is None else out.getvalue(), err.getvalue()


def _run_signalling_workers(test: unittest.TestCase, *numbers: int) -> tuple[int, str, str]:
    """The README's --check command, in a fresh interpreter, with `numbers` sent to every
    worker, and to multiprocessing's resource tracker, just as the engine first waits for a
    report, while most workers are still starting up."""
    program = ("import sys, test_leases; "
               f"sys.exit(test_leases._signalling_workers({[int(n) for n in numbers]!r}))")
    done = subprocess.run([sys.executable, "-c", program], cwd=HERE, timeout=TIMEOUT,
                          check=False, capture_output=True, text=True)
    return done.returncode, done.stdout, done.stderr


def _signalling_workers(numbers: list[int]) -> int:
    real, sent = run_experiment.take_report, [False]

    def report(*args: Any) -> Any:
        tracker = multiprocessing.resource_tracker._resource_tracker._pid  # type: ignore
        pids = [child.pid for child in multiprocessing.active_children()] + [tracker]
        for pid in pids if not sent[-1] else ():
            for number in numbers:
                os.kill(pid, number)
        sent.append(True)
        return real(*args)

    with tempfile.TemporaryDirectory() as folder, \
            mock.patch.object(run_experiment, "take_report", report):
        return run_experiment.main(["--check", "results.json",
                                    "--output", os.path.join(folder, "out.json")])


def _run_killing(test: unittest.TestCase, scenario: int, step: int, victim: str) -> tuple[
        int, str, str]:
    """The README's --check command, in a fresh interpreter, SIGKILLing `victim`'s worker in
    scenario number `scenario` while the engine waits for the report of its step `step`: by
    then the victim waits for a later step.  A hang is TimeoutExpired, after TIMEOUT."""
    program = ("import sys, test_leases; "
               f"sys.exit(test_leases._killing({scenario}, {step}, {victim!r}))")
    done = subprocess.run([sys.executable, "-c", program], cwd=HERE, timeout=TIMEOUT,
                          check=False, capture_output=True, text=True)
    return done.returncode, done.stdout, done.stderr


def _killing(scenario: int, step: int, victim: str) -> int:
    real, reports = run_experiment.take_report, Counter[str]()

    def report(play: Any, actor: str, timeout: float) -> Any:
        name = play.scenario.name
        if name == run_experiment.SCENARIOS[scenario].name and reports[name] == step:
            worker = play.workers[victim]
            # Killed at the worst moment, as it wrote a report: its Queue's lock stays held.
            play.reports[victim]._wlock.acquire()
            worker.kill()
            worker.join(TIMEOUT)  # dead before anything is released to it
        reports[name] += 1
        return real(play, actor, timeout)

    with mock.patch.object(run_experiment, "take_report", report):
        return run_experiment.main(["--check", "results.json"])


def _leading() -> None:
    """Run the README's command; once the first step is reported, when its worker waits for
    its next and the others wait or start, print the PIDs of the workers and the resource
    tracker, and hang."""
    real = run_experiment.take_report

    def report(play: Any, actor: str, timeout: float) -> Any:
        reported = real(play, actor, timeout)
        tracker = multiprocessing.resource_tracker._resource_tracker._pid  # type: ignore
        pids = [child.pid for child in multiprocessing.active_children()] + [tracker]
        print(json.dumps(pids), flush=True)
        threading.Event().wait(TIMEOUT)  # until the test kills this process
        return reported

    with mock.patch.object(run_experiment, "take_report", report):
        run_experiment.main(["--check", "results.json"])


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    """The processes of `pids` still alive after `seconds`, waited for on their pidfds."""
    deadline, alive = time.monotonic() + seconds, []
    for pid in pids:
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:  # a pidfd is readable once its process has exited
            if not select.select([pidfd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                alive.append(pid)
        finally:
            os.close(pidfd)
    return alive


def _serving_then(exit_code: int, orders: run_experiment.Orders) -> None:
    """A worker that does its steps, reports them, then exits with `exit_code`, or is killed
    by signal -`exit_code`.  A seam: what a spawned worker does after its last report cannot be
    changed by a patch in this process, and the real worker always exits 0."""
    run_experiment.serve(orders)
    if exit_code < 0:
        os.kill(os.getpid(), -exit_code)
    os._exit(exit_code)


if __name__ == "__main__":
    unittest.main()
