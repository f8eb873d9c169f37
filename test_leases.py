"""The contract of leases.py and run_experiment.py: seventeen tests, one rule each.

Each test arranges what it needs itself and fails if its rule is broken.  Child processes are
spawned and ordered by Event and Queue handshakes; no test sleeps, and every wait is bounded.
"""

import contextlib
import dis
import io
import itertools
import json
import multiprocessing
import os
import pathlib
import pickle
import signal
import sqlite3
import sys
import tempfile
import unittest
from collections.abc import Callable, Iterator
from typing import Any, TypeVar
from unittest import mock

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
)
from run_experiment import (
    SCENARIOS,
    Action,
    ExperimentError,
    Scenario,
    Step,
    run_scenarios,
)

HERE = os.path.dirname(os.path.abspath(__file__))
SPAWN = multiprocessing.get_context("spawn")
TIMEOUT = 60.0  # bounds a hung wait; no test waits for it to pass
RESOURCE = "invoice-42"


def new_path(test: unittest.TestCase, name: str = "leases.sqlite3") -> str:
    """A path in a temporary folder of the test's own, removed after it."""
    folder = tempfile.TemporaryDirectory()
    test.addCleanup(folder.cleanup)
    return os.path.join(folder.name, name)


Opened = TypeVar("Opened", LeaseAuthority, Receiver)


def opened(test: unittest.TestCase, database: Opened) -> Opened:
    test.addCleanup(database.close)
    return database


def connection_of(database: leases._Database) -> sqlite3.Connection:
    """Its SQLite connection: a test reaches inside to watch or steer the statements."""
    assert database._connection is not None, "closed"
    return database._connection


# --- what child processes run: each opens the file, says so, waits for its start, calls ---


def call(kind: str, path: str, args: tuple[Any, ...], opened: Any, start: Any,
         pause_at: str | None = None, reached: Any = None, resume: Any = None) -> Any:
    """In a child: open `path`, set `opened`, wait for `start`, then make the call `kind`.
    With `pause_at`, the first SQL statement that starts with it sets `reached` and waits for
    `resume` before it runs: the call is held there, at that point of its transaction."""
    database: Any = LeaseAuthority(path) if kind.startswith("acquire") else Receiver(path)
    with database:
        opened.set()
        if not start.wait(TIMEOUT):
            raise TimeoutError("never started")
        if pause_at is not None:
            def pause(statement: str) -> None:
                if statement.startswith(pause_at) and not reached.is_set():
                    reached.set()
                    resume.wait(TIMEOUT)
            connection_of(database).set_trace_callback(pause)
        if kind == "acquire":
            try:
                return "granted", database.acquire(*args, now=0, ttl=1).epoch
            except LeaseHeld as held:
                return "held", held.lease.epoch
        if kind == "acquire and release":  # `rounds` grants, each released
            epochs: list[int] = []
            while len(epochs) < args[1]:
                with contextlib.suppress(LeaseHeld):  # another process holds it: again
                    lease = database.acquire(RESOURCE, args[0], now=0, ttl=1)
                    database.release(lease)
                    epochs.append(lease.epoch)
            return epochs
        return [database.write(*write).outcome.value for write in args]


def child(number: int, results: Any, kind: str, *arguments: Any) -> None:
    try:
        results.put((number, True, call(kind, *arguments)))
    except Exception as exc:  # noqa: BLE001 - the parent fails the test, naming it
        results.put((number, False, f"{type(exc).__name__}: {exc}"))


def in_processes(test: unittest.TestCase, calls: list[tuple[Any, ...]],
                 between: Callable[[], None] = lambda: None) -> list[Any]:
    """Run each `calls` entry (kind, path, args, opened, start, ...) in a spawned process of
    its own; `between` runs while they do.  Their results, in order; a failure fails `test`."""
    results = SPAWN.Queue()
    processes = [SPAWN.Process(target=child, args=(n, results, *c)) for n, c in enumerate(calls)]
    for process in processes:
        process.start()
        test.addCleanup(process.join, TIMEOUT)
        test.addCleanup(process.kill)
    between()
    answers = sorted(results.get(timeout=TIMEOUT) for _ in processes)
    for number, ok, answer in answers:
        test.assertTrue(ok, f"child {number}: {answer}")
    return [answer for _, _, answer in answers]


def overtaking(test: unittest.TestCase, kind: str, path: str, first: tuple[Any, ...],
               second: tuple[Any, ...]) -> list[Any]:
    """`first` and `second` in two processes, the second overtaking the first: the first stops
    after its read, before its INSERT; the second starts; the first goes on once the second
    has sent its BEGIN.  A call that read outside its transaction read before the first wrote."""
    first_opened, second_opened = SPAWN.Event(), SPAWN.Event()  # each has its database open
    first_inside, first_goes_on = SPAWN.Event(), SPAWN.Event()
    second_begins, second_goes_on = SPAWN.Event(), SPAWN.Event()
    second_goes_on.set()  # the second is only watched at its BEGIN, never held there

    def let_the_first_go_on() -> None:
        test.assertTrue(second_begins.wait(TIMEOUT), "the second call never began")
        first_goes_on.set()

    return in_processes(test, [
        (kind, path, first, first_opened, second_opened, "INSERT", first_inside, first_goes_on),
        (kind, path, second, second_opened, first_inside, "BEGIN", second_begins, second_goes_on),
    ], let_the_first_go_on)


def evidence_of(test: unittest.TestCase, name: str) -> dict[str, Any]:
    """The named scenario, played on its own by the engine; its record in the evidence."""
    (scenario,) = [scenario for scenario in SCENARIOS if scenario.name == name]
    (record,) = run_scenarios([scenario])["scenarios"]
    with open(os.path.join(HERE, "results.json"), encoding="utf-8") as file:
        committed = [r for r in json.load(file)["scenarios"] if r["name"] == name]
    test.assertEqual([record], committed, "the run differs from results.json")
    return dict(record)


def shown(record: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Each event as (actor, action, tick, epoch, outcome, stored epoch)."""
    return [(e["actor"], e["action"], e["tick"], e["epoch"], e["outcome"], e["stored_epoch"])
            for e in record["events"]]


def interrupting(call: Callable[[int], object]) -> Iterator[int]:
    """`call(n)` for n = 1, 2, ... with a Ctrl-C at the n-th point where CPython takes one (as a
    call returns); yield each n so interrupted, until a call runs through."""
    calls = {name for name in dis.opname if name.startswith("CALL")}
    left, before = [0], dict[Any, str]()  # points to pass; each frame's last instruction

    def trace(frame: Any, event: str, _: object) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            left[0] -= before.get(frame, "") in calls
            if left[0] == 0:
                raise KeyboardInterrupt
            before[frame] = dis.opname[frame.f_code.co_code[frame.f_lasti]]
        return trace
    for n in itertools.count(1):
        left[0] = n
        before.clear()
        sys._getframe().f_trace_opcodes = True  # else 3.12 sends no opcode event at first
        sys.settrace(trace)
        try:
            call(n)
            return  # it ran through: every point was interrupted once
        except KeyboardInterrupt:
            yield n  # the trace that raised it is unset already
        finally:
            sys.settrace(None)


def refusing_one_commit() -> Callable[..., int]:
    """An SQLite authorizer that refuses the first COMMIT it is asked about."""
    refused: list[str] = []

    def authorize(action: int, operation: str | None, *_: object) -> int:
        if action == sqlite3.SQLITE_TRANSACTION and operation == "COMMIT" and not refused:
            refused.append(operation)
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK
    return authorize


# --- the authority ---


class AuthorityTests(unittest.TestCase):
    def test_epochs_start_at_1_and_rise_by_1_per_grant_of_each_resource(self) -> None:
        authority = opened(self, LeaseAuthority(new_path(self)))
        first = authority.acquire("a", "A", now=0, ttl=5)
        other = authority.acquire("b", "B", now=0, ttl=5)  # each resource counts its own
        after_expiry = authority.acquire("a", "C", now=5, ttl=5)
        authority.release(after_expiry)
        after_release = authority.acquire("a", "A", now=6, ttl=5)
        self.assertEqual([first.epoch, after_expiry.epoch, after_release.epoch], [1, 2, 3])
        self.assertEqual(other.epoch, 1)

    def test_a_lease_is_held_before_its_expiry_tick_and_free_at_it(self) -> None:
        authority = opened(self, LeaseAuthority(new_path(self)))
        lease = authority.acquire(RESOURCE, "A", now=0, ttl=10)
        self.assertEqual(lease, Lease(RESOURCE, "A", 1, 10))
        with self.assertRaises(LeaseHeld) as held:
            authority.acquire(RESOURCE, "B", now=9, ttl=10)
        self.assertEqual(held.exception.lease, lease)
        self.assertEqual(authority.current(RESOURCE, now=9), lease)
        self.assertIsNone(authority.current(RESOURCE, now=10))
        self.assertEqual(authority.acquire(RESOURCE, "B", now=10, ttl=10).epoch, 2)

    def test_renew_sets_the_expiry_to_now_plus_ttl(self) -> None:
        authority = opened(self, LeaseAuthority(new_path(self)))
        lease = authority.acquire(RESOURCE, "A", now=0, ttl=10)
        later = authority.renew(lease, now=5, ttl=10)
        self.assertEqual(later, Lease(RESOURCE, "A", 1, 15))
        sooner = authority.renew(later, now=6, ttl=1)  # renewal replaces, so it can shorten
        self.assertEqual(authority.current(RESOURCE, now=6), sooner)
        self.assertEqual(sooner.expires_at, 7)
        self.assertEqual(authority.acquire(RESOURCE, "B", now=7, ttl=1).epoch, 2)

    def test_only_the_current_holder_may_renew_or_release(self) -> None:
        authority = opened(self, LeaseAuthority(new_path(self)))
        old = authority.acquire(RESOURCE, "A", now=0, ttl=10)
        with self.assertRaises(LeaseLost) as expired:
            authority.renew(old, now=10, ttl=10)
        self.assertEqual(expired.exception.reason, "it expired at tick 10")
        new = authority.acquire(RESOURCE, "A", now=10, ttl=10)  # A again: the holder, not the epoch
        impostor = Lease(RESOURCE, "C", new.epoch, new.expires_at)  # the epoch, not the holder
        for lease in (old, impostor):
            for attempt in (lambda lease: authority.renew(lease, now=11, ttl=1), authority.release):
                with self.subTest(lease=lease, attempt=attempt), self.assertRaises(LeaseLost) as lost:
                    attempt(lease)
                self.assertEqual(lost.exception.current, new)
        self.assertEqual(authority.current(RESOURCE, now=11), new)  # untouched
        authority.release(new)
        with self.assertRaises(LeaseLost):
            authority.release(new)

    def test_racing_acquisitions_never_share_an_epoch(self) -> None:
        path = new_path(self)  # no file yet: the processes also race to make it
        with self.subTest("3 processes, 10 grants each"):
            go = SPAWN.Event()
            per_process = in_processes(
                self, [("acquire and release", path, (f"P{n}", 10), SPAWN.Event(), go)
                       for n in range(3)], go.set)
            self.assertEqual(sorted(epoch for epochs in per_process for epoch in epochs), list(range(1, 31)))
        with self.subTest("the second asks while the first is between its read and its write"):
            answers = overtaking(self, "acquire", path, (RESOURCE, "X"), (RESOURCE, "Y"))
            self.assertEqual(answers, [("granted", 31), ("held", 31)])
        with self.subTest("a thread's call holds the object's lock through its transaction"):
            authority, real_load, held = opened(self, LeaseAuthority(path)), leases._load, []

            def load(connection: sqlite3.Connection, resource: str) -> Any:
                held.append(authority._lock.locked())  # so another thread's call waits
                return real_load(connection, resource)
            with mock.patch.object(leases, "_load", load):
                authority.acquire(RESOURCE, "Z", now=100, ttl=1)
            self.assertEqual(held, [True])


# --- the receiver ---


class ReceiverTests(unittest.TestCase):
    def test_fenced_receiver_decides_each_write_by_epoch_then_value(self) -> None:
        receiver = opened(self, Receiver(new_path(self)))
        cases = [  # (epoch, value) -> what the receiver answers, and what it stores after
            (2, "b", Outcome.APPLIED, (2, "b")),  # the first write
            (2, "b", Outcome.REPLAY, (2, "b")),  # same epoch, same value
            (2, "c", Outcome.CONFLICT, (2, "b")),  # same epoch, another value
            (1, "a", Outcome.STALE, (2, "b")),  # lower epoch, once a higher one is stored
            (3, "c", Outcome.APPLIED, (3, "c")),  # higher epoch
        ]
        results = []
        for epoch, value, outcome, stored in cases:
            with self.subTest(epoch=epoch, value=value):
                result = receiver.write(RESOURCE, epoch, value)
                self.assertEqual((result.outcome, (result.stored_epoch, result.stored_value)),
                                 (outcome, stored))
                self.assertEqual(receiver.read(RESOURCE), stored)
                results.append(result)
        self.assertEqual(receiver.decisions(RESOURCE), results)  # the log is the record
        self.assertEqual(receiver.write("other", 1, "x").outcome, Outcome.APPLIED)

    def test_unfenced_receiver_applies_every_write(self) -> None:
        path = new_path(self)
        unfenced = opened(self, Receiver(path, fenced=False))
        results = [unfenced.write(RESOURCE, e, v) for e, v in [(5, "five"), (1, "one"), (1, "uno")]]
        self.assertEqual([r.outcome for r in results], [Outcome.APPLIED] * 3)
        self.assertEqual(unfenced.read(RESOURCE), (1, "uno"))
        fenced = opened(self, Receiver(path))  # another service, in the same file
        self.assertIsNone(fenced.read(RESOURCE))

    def test_racing_writes_behave_as_if_made_one_at_a_time(self) -> None:
        path = opened(self, Receiver(new_path(self))).path
        with self.subTest("3 processes, epochs 1 to 10 each"):
            go = SPAWN.Event()
            writes = [tuple((RESOURCE, epoch, f"P{n}") for epoch in range(1, 11)) for n in range(3)]
            in_processes(self, [("write", path, w, SPAWN.Event(), go) for w in writes], go.set)
            stored = None
            for decision in opened(self, Receiver(path)).decisions(RESOURCE):  # as if alone
                expected = leases._decide(stored, decision.epoch, decision.value)
                self.assertEqual(decision.outcome, expected, f"{decision} after {stored}")
                stored = (decision.stored_epoch, decision.stored_value)
            self.assertEqual(stored and stored[0], 10)
        with self.subTest("the second writes while the first is between its read and its write"):
            answers = overtaking(self, "write", path, ((RESOURCE, 11, "X"),), ((RESOURCE, 11, "Y"),))
            self.assertEqual(answers, [["applied"], ["conflict"]])


# --- the database under both ---


class StorageTests(unittest.TestCase):
    def test_a_call_that_fails_changes_nothing(self) -> None:
        path = new_path(self)  # the receiver's file apart: a transaction left open shows at once
        authority, receiver = opened(self, LeaseAuthority(path)), opened(self, Receiver(path + "-r"))
        authority.acquire(RESOURCE, "A", now=0, ttl=1)
        # A Ctrl-C wherever CPython takes one in a call, BEGIN's return too, leaves nothing.
        for database, call in [(authority, lambda n: authority.acquire(f"r{n}", "B", now=0, ttl=1)),
                               (receiver, lambda n: receiver.write(f"r{n}", 1, "v"))]:
            for point in interrupting(call):
                held = connection_of(database).in_transaction or database._lock.locked()
                self.assertFalse(held, f"{type(database).__name__} left locked at {point}")
        # A COMMIT that fails after each call's write, as on a full disk: SQLite refuses it once.
        for database in (authority, receiver):
            connection_of(database).set_authorizer(refusing_one_commit())
        with self.assertRaises(LeaseError):
            authority.acquire(RESOURCE, "B", now=1, ttl=1)
        with self.assertRaises(LeaseError):
            receiver.write(RESOURCE, 1, "lost")
        # Nothing was kept, and no transaction was left open: both go on as if the failed
        # calls had never been made, and so does another connection after them.
        self.assertIsNone(receiver.read(RESOURCE))
        self.assertEqual(receiver.write(RESOURCE, 1, "kept").outcome, Outcome.APPLIED)
        self.assertEqual(authority.acquire(RESOURCE, "C", now=1, ttl=1).epoch, 2)
        with LeaseAuthority(path) as other:
            self.assertEqual(other.acquire(RESOURCE, "D", now=2, ttl=1).epoch, 3)

    def test_bad_input_is_refused_before_any_transaction(self) -> None:
        path = new_path(self)
        # Any: the calls below break the types on purpose.
        authority: Any = opened(self, LeaseAuthority(path))
        receiver: Any = opened(self, Receiver(path))
        statements: list[str] = []
        for database in (authority, receiver):
            connection_of(database).set_trace_callback(statements.append)
        lease = Lease(RESOURCE, "A", 1, 10)
        cases: list[tuple[Callable[[], object], type[Exception], str]] = [
            (lambda: authority.acquire(7, "A", now=0, ttl=1), TypeError, "resource"),
            (lambda: authority.acquire("", "A", now=0, ttl=1), ValueError, "resource"),
            (lambda: authority.acquire(RESOURCE, "", now=0, ttl=1), ValueError, "holder"),
            (lambda: authority.acquire(RESOURCE, "\udfff", now=0, ttl=1), ValueError, "holder"),
            (lambda: authority.acquire(RESOURCE, "A", now=-1, ttl=1), ValueError, "now"),
            (lambda: authority.acquire(RESOURCE, "A", now=0, ttl=0), ValueError, "ttl"),
            (lambda: authority.acquire(RESOURCE, "A", now=True, ttl=1), TypeError, "now"),
            (lambda: authority.acquire(RESOURCE, "A", now=2**63 - 1, ttl=1), ValueError, "now + ttl"),
            (lambda: authority.renew("lease", now=0, ttl=1), TypeError, "lease"),
            (lambda: authority.release(Lease(RESOURCE, "A", 0, 10)), ValueError, "lease.epoch"),
            (lambda: authority.release(Lease(RESOURCE, "", 1, 10)), ValueError, "lease.holder"),
            (lambda: authority.renew(Lease(RESOURCE, "A", 1, "9"), now=0, ttl=1),  # type: ignore[arg-type]
             TypeError, "lease.expires_at"),
            (lambda: authority.current(RESOURCE, now=1.5), TypeError, "now"),
            (lambda: receiver.write(RESOURCE, 0, "v"), ValueError, "epoch"),
            (lambda: receiver.write(RESOURCE, 1, None), TypeError, "value"),
            (lambda: receiver.write("\ud800", 1, "v"), ValueError, "resource"),
            (lambda: receiver.write("", 1, "v"), ValueError, "resource"),
            (lambda: authority.renew(lease, now=1, ttl=2**63 - 1), ValueError, "now + ttl"),
            (lambda: Receiver(path, fenced="yes"), TypeError, "fenced"),  # type: ignore[arg-type]
            (lambda: LeaseAuthority(""), ValueError, "path"),
            (lambda: Receiver("file::memory:"), ValueError, "path"),  # a memory, not a file
            (lambda: LeaseAuthority(3), TypeError, "path"),  # type: ignore[arg-type]
            (lambda: Receiver("\udfff"), ValueError, "path"),
            (lambda: leases.is_live(float("nan"), now=1), TypeError, "expires_at"),  # type: ignore[arg-type]
            (lambda: leases.is_live(1, now=True), TypeError, "now"),
        ]
        for number, (bad_call, error, name) in enumerate(cases):
            with self.subTest(case=number, name=name):
                with self.assertRaises(error) as raised:
                    bad_call()
                self.assertTrue(str(raised.exception).startswith(name), raised.exception)
        self.assertEqual(statements, [])
        self.assertEqual(authority.acquire("edge", "A", now=2**63 - 2, ttl=1).expires_at, 2**63 - 1)

    def test_a_file_that_is_not_this_librarys_database_is_left_as_it_was(self) -> None:
        def sqlite(create: str) -> Callable[[str], None]:
            def make(path: str) -> None:
                with contextlib.closing(sqlite3.connect(path)) as connection:
                    connection.executescript(create)
            return make

        def holding(data: bytes) -> Callable[[str], object]:
            return lambda path: pathlib.Path(path).write_bytes(data)

        for name, make in [*[(f"a file holding {data!r}", holding(data))
                             for data in (b"not a database\n", b"x", b"\n", b"0", b"\0")],
                           ("another program's database", sqlite("CREATE TABLE t (x)")),
                           ("a database of views alone", sqlite("CREATE VIEW v AS SELECT 1")),
                           ("a database marked as another's", sqlite("PRAGMA user_version = 7")),
                           ("a FIFO, which would block a reader", os.mkfifo),
                           ("our tables, made otherwise",
                            sqlite("CREATE TABLE leases (x); CREATE TABLE receiver_decisions (x)"))]:
            for kind in (LeaseAuthority, Receiver):
                with self.subTest(name, kind=kind.__name__):
                    path = new_path(self)
                    make(path)
                    as_it_is = pathlib.Path(path).read_bytes() if os.path.isfile(path) else None
                    with self.assertRaises(LeaseError):
                        kind(path)
                    self.assertEqual(pathlib.Path(path).read_bytes() if os.path.isfile(path)
                                     else None, as_it_is)
                    self.assertEqual(os.listdir(os.path.dirname(path)), ["leases.sqlite3"])

    def test_state_survives_closing_and_reopening(self) -> None:
        path = new_path(self)
        with LeaseAuthority(path) as authority, Receiver(path) as receiver:
            authority.release(authority.acquire(RESOURCE, "A", now=0, ttl=1))
            receiver.write(RESOURCE, 1, "first")
        authority.close()  # again: nothing to do
        with self.assertRaises(LeaseError):
            authority.current(RESOURCE, now=0)
        go = SPAWN.Event()  # a new process, on the file alone
        answers = in_processes(self, [("acquire", path, (RESOURCE, "B"), SPAWN.Event(), go),
                                      ("write", path, ((RESOURCE, 1, "other"),), SPAWN.Event(),
                                       go)], go.set)
        self.assertEqual(answers, [("granted", 2), ["conflict"]])
        # Opened while another connection is about to write: SQLite refuses WAL mode then,
        # at once.  The open goes on; a later opener asks again.
        busy = new_path(self, "busy.sqlite3")
        with contextlib.closing(sqlite3.connect(busy, isolation_level=None)) as writer:
            for statement in leases._TABLES.values():
                writer.execute(statement)
            writer.execute("BEGIN IMMEDIATE")  # the write lock, until the block ends
            opened(self, LeaseAuthority(busy))
        with LeaseAuthority(busy) as authority, contextlib.closing(sqlite3.connect(busy)) as peek:
            self.assertEqual(peek.execute("PRAGMA journal_mode").fetchone(), ("wal",))

    def test_errors_are_lease_errors_that_pickle(self) -> None:
        path = new_path(self)
        with self.assertRaises(LeaseError):  # SQLite cannot open a folder
            LeaseAuthority(os.path.dirname(path))
        receiver = opened(self, Receiver(path))
        with contextlib.closing(sqlite3.connect(path)) as connection:
            connection.execute("DROP TABLE receiver_decisions")
        with self.assertRaises(LeaseError) as raised:  # SQLite's "no such table", as ours
            receiver.write(RESOURCE, 1, "v")
        self.assertIsInstance(raised.exception.__cause__, sqlite3.Error)
        lease, current = Lease(RESOURCE, "A", 1, 10), Lease(RESOURCE, "B", 2, 20)
        cases: list[tuple[Exception, dict[str, object]]] = [
            (LeaseHeld(lease), {"lease": lease}),
            (LeaseLost(lease, current, "superseded"),
             {"lease": lease, "current": current, "reason": "superseded"}),
        ]
        for error, attributes in cases:
            with self.subTest(type(error).__name__):
                copy = pickle.loads(pickle.dumps(error))
                self.assertEqual((type(copy), str(copy)), (type(error), str(error)))
                self.assertEqual({name: getattr(copy, name) for name in attributes}, attributes)


# --- the three scenarios, played by spawned processes ---


class ScenarioTests(unittest.TestCase):
    def test_unfenced_receiver(self) -> None:
        record = evidence_of(self, "unfenced_receiver")
        self.assertEqual(shown(record), [
            ("A", "acquire", 0, 1, "granted", None),
            ("B", "acquire", 10, 2, "granted", None),  # at the tick A's lease expires
            ("B", "write", 10, 2, "applied", 2),
            ("A", "write", 11, 1, "applied", 1),  # A resumes late and overwrites B
        ])
        self.assertEqual(record["final"], {"epoch": 1, "value": "report by A"})
        self.assertTrue(record["verdict"]["newer_write_overwritten_by_older_epoch"])
        self.assertEqual(record["verdict"]["final_value_written_by"], "A")

    def test_fenced_receiver(self) -> None:
        record = evidence_of(self, "fenced_receiver")
        self.assertEqual(shown(record), [
            ("A", "acquire", 0, 1, "granted", None),
            ("B", "acquire", 10, 2, "granted", None),
            ("B", "write", 10, 2, "applied", 2),
            ("A", "write", 11, 1, "stale", 2),  # the receiver has stored epoch 2
        ])
        self.assertEqual(record["final"], {"epoch": 2, "value": "report by B"})
        self.assertFalse(record["verdict"]["newer_write_overwritten_by_older_epoch"])
        self.assertEqual(record["verdict"]["stale_writes_refused"], 1)

    def test_expiry_before_receiver_observation_gap(self) -> None:
        record = evidence_of(self, "expiry_before_receiver_observation_gap")
        self.assertEqual(shown(record), [
            ("A", "acquire", 0, 1, "granted", None),
            ("B", "acquire", 10, 2, "granted", None),
            ("A", "write", 11, 1, "applied", 1),  # expired and superseded, yet applied:
            ("B", "write", 12, 2, "applied", 2),  # the receiver had not seen epoch 2
            ("A", "write", 13, 1, "stale", 2),  # now it has
        ])
        self.assertTrue(record["verdict"]["write_with_superseded_epoch_applied"])
        self.assertTrue(record["verdict"]["write_after_lease_expiry_applied"])
        self.assertEqual(record["verdict"]["final_value_written_by"], "B")


# --- the command line ---


def command_line(*argv: str) -> tuple[int, str, str]:
    """run_experiment's command line, in this process: its exit code, stdout and stderr."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = run_experiment.main(list(argv))
        except SystemExit as stop:  # argparse's way out
            code = stop.code  # type: ignore[assignment]
    return code, stdout.getvalue(), stderr.getvalue()


class CommandLineTests(unittest.TestCase):
    def test_check_reproduces_the_evidence_and_names_each_failure(self) -> None:
        for stop in (signal.SIGINT, signal.SIGTERM):  # main() takes them, and ignores them
            self.addCleanup(signal.signal, stop, signal.getsignal(stop))  # once a run is over
        folder, longest = os.path.dirname(new_path(self)), "o" * 250 + ".json"  # the longest name
        results, output = os.path.join(HERE, "results.json"), os.path.join(folder, longest)
        evidence = json.loads(pathlib.Path(results).read_text(encoding="utf-8"))
        conclude = run_experiment._conclude
        pathlib.Path(folder, "deep.json").write_text("[" * 10**5, encoding="ascii")

        def interrupted(*args: Any) -> int:  # a Ctrl-C once the run is over changes nothing
            os.kill(os.getpid(), signal.SIGINT)
            return conclude(*args)

        with self.subTest("0: reproduced, and --output is the evidence byte for byte"), \
                mock.patch.object(run_experiment, "_conclude", interrupted):
            code, stdout, _ = command_line("--check", results, "--output", output)
            self.assertEqual((code, stdout.split(":")[0]), (0, "reproduced"))
            self.assertEqual(pathlib.Path(output).read_bytes(), pathlib.Path(results).read_bytes())
        with self.subTest("1: each difference named by its JSON path, conclusions first"):
            changed = json.loads(json.dumps(evidence))
            changed["scenarios"][0]["events"][0]["tick"] = 5
            changed["scenarios"][0]["verdict"]["newer_write_overwritten_by_older_epoch"] = 1
            changed["scenarios"][1]["final"]["epoch"] = 1  # and JSON's 1 is not true, above
            pathlib.Path(output).write_text(json.dumps(changed), encoding="utf-8")
            code, stdout, _ = command_line("--check", output)
            self.assertEqual((code, stdout.splitlines()[1:]), (1, [
                ("  $.scenarios[0].verdict.newer_write_overwritten_by_older_epoch: expected 1, "
                 "got true"),
                "  $.scenarios[1].final.epoch: expected 1, got 2",
                "  $.scenarios[0].events[0].tick: expected 5, got 0"]))
        for name, argv in [("a missing file", ("--check", os.path.join(folder, "none.json"))),
                           ("a file that is not JSON", ("--check", __file__)),
                           ("a JSON nested too deep", ("--check", f"{folder}/deep.json")),
                           ("a file without end", ("--check", "/dev/zero")),
                           ("no folder to write to", ("--output", os.path.join(folder, "no", "x"))),
                           ("a folder as --output", ("--output", folder)),
                           ("an unknown option", ("--chek", results))]:
            with self.subTest(f"2: {name}, in one line"):
                code, stdout, stderr = command_line(*argv)
                self.assertEqual((code, stdout, stderr.count("\n")), (2, "", 1), stderr)
        with self.subTest("2: a write that fails leaves --output as it was"), \
                mock.patch.object(run_experiment, "run_scenarios", return_value=evidence), \
                mock.patch.object(os, "replace", side_effect=OSError(28, "No space left")):
            self.assertEqual(command_line("--output", output)[0], 2)
            self.assertEqual(json.loads(pathlib.Path(output).read_text("utf-8")), changed)
            self.assertEqual(sorted(os.listdir(folder)), ["deep.json", longest])
        with self.subTest("3: a scenario that fails, named with its step"):
            broken = Scenario("broken", True, "no tick after the last",
                              (Step("A", Action.ACQUIRE, tick=2**63 - 1, ttl=1),))
            with self.assertRaises(ExperimentError) as failed:
                run_scenarios([broken])
            self.assertEqual((failed.exception.scenario, failed.exception.step),
                             ("broken", "step 0 (A acquire at tick 9223372036854775807)"))
            with mock.patch.object(run_experiment, "run_scenarios", side_effect=failed.exception):
                self.assertEqual(command_line("--check", results)[0], 3)
        self.each_stop_stops_the_workers_and_removes_the_folder(folder)

    def each_stop_stops_the_workers_and_removes_the_folder(self, folder: str) -> None:
        kept = sorted(os.listdir(folder))
        for exit_code, moment, where, effect in [
                (130, "Ctrl-C awaiting a report", (run_experiment, "_report"), KeyboardInterrupt),
                (130, "Ctrl-C starting a worker", (SPAWN.Process, "start"), KeyboardInterrupt),
                (143, "SIGTERM awaiting a report", (run_experiment, "_report"),
                 lambda *_: os.kill(os.getpid(), signal.SIGTERM)),
                (2, "no process to be had", (SPAWN.Process, "start"), BlockingIOError(11, "no"))]:
            with self.subTest(f"{exit_code}: {moment}, in one line"), \
                    mock.patch.object(*where, side_effect=effect), \
                    mock.patch.object(tempfile, "tempdir", folder):
                code, _, stderr = command_line("--output", os.path.join(folder, "x.json"))
                self.assertEqual((code, stderr.count("\n")), (exit_code, 1))
                self.assertEqual(multiprocessing.active_children(), [])
                self.assertEqual(sorted(os.listdir(folder)), kept)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1] + sys.argv[1:])
