"""The explorer's tests: its counts agree with a brute force of their own, each check fires
under a breakage of the library made for it in a scratch copy, and an answer that rests on
more than the file is named as such, never as the explorer's own failure.

Run from the repository's root: `python3 explorer/test_explore.py`.  The root's
`python3 -m unittest discover` does not find these (explorer/ is no package).
"""

import ast
import contextlib
import dataclasses
import functools
import graphlib
import io
import itertools
import os
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from collections import Counter
from typing import Any, NamedTuple
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import calls
import core
import engine
import examples
import explore
import statements
import steps
from core import Bound

from leases import LeaseAuthority
from run_experiment import Answer

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

CONNECT = sqlite3.connect  # as a module that imported it by name holds it
TIMEOUT = 120.0  # bounds a hung run; no test waits for it to pass
NAMES = [cls.name for cls in core.CLASSES]
SMALL = {
    "takeover": Bound(2, ("acquire", "write"), last_tick=1, ttl=1),
    "three decisions": Bound(2, ("acquire", "write", "write"), last_tick=1, ttl=1),
    "a retry": Bound(2, ("acquire", "write", "retry"), last_tick=1, ttl=1),
    "check, then write": Bound(2, ("acquire", "check", "write"), last_tick=1, ttl=1),
    "renew, release": Bound(2, ("acquire", "renew", "write", "release"), last_tick=0, ttl=1),
    "three holders, two resources": Bound(3, ("acquire", "write"), last_tick=0, ttl=1,
                                          resources=2),
}
_tables: dict[str, dict[str, Any]] = {}


def table(name: str) -> dict[str, Any]:
    """Each small bound explored once for the whole module (a sample of 2 replayed)."""
    if name not in _tables:
        _tables[name] = steps.explore_steps(SMALL[name], sample=2)
    return _tables[name]


# --- the brute force: every schedule whole, from a new file, judged from its events alone ---


def schedules(bound: Bound) -> list[tuple[tuple[int, int], ...]]:
    """Every schedule: each (holder, tick) order with ticks that never go back."""
    found: list[tuple[tuple[int, int], ...]] = []

    def extend(schedule: tuple[tuple[int, int], ...], left: list[int]) -> None:
        if not any(left):
            found.append(schedule)
        tick = schedule[-1][1] if schedule else 0
        for h, count in enumerate(left):
            for later in range(tick, bound.last_tick + 1) if count else ():
                extend((*schedule, (h, later)), [*left[:h], count - 1, *left[h + 1:]])

    extend((), [len(bound.program)] * bound.holders)
    return found


def brute_force(bound: Bound) -> tuple[dict[str, dict[str, int]], set[int]]:
    """Each place's schedules in each class, and every epoch granted: each schedule played
    whole on a new file, its writes judged from the events that came before them."""
    receivers = calls.places()
    counts = {place.name: Counter[str]() for place in receivers}
    epochs: set[int] = set()
    for schedule in schedules(bound):
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "brute.sqlite3")
            objects = [LeaseAuthority(path), *(place.make(path) for place in receivers)]
            try:
                seen = _played_whole(bound, schedule, objects, path, epochs)
            finally:
                for store in objects:
                    store.close()
        for place, names in zip(receivers, seen):
            counts[place.name].update(names or {"clean"})
    return {name: {n: found[n] for n in (*NAMES, "clean")} for name, found in counts.items()}, \
        epochs


def _played_whole(bound: Bound, schedule: tuple[tuple[int, int], ...], objects: list[Any],
                  path: str, epochs: set[int]) -> list[set[str]]:
    leases: list[Any] = [None] * bound.holders
    positions = [0] * bound.holders
    newest: Counter[str] = Counter()  # by resource
    stored: dict[tuple[int, str], int] = {}  # by place and resource
    expiry: dict[str, int] = {}
    seen: list[set[str]] = [set() for _ in objects[1:]]
    for h, tick in schedule:
        step, resource = bound.step(h, positions[h], tick), bound.resource(h)
        positions[h] += 1
        held = leases[h]
        leases[h], events = calls.played(step, held, objects, path, resource)
        outcome, epoch, expires_at = events[0][3], events[0][4], events[0][5]
        if outcome in (Answer.GRANTED, Answer.RENEWED):
            expiry[step.actor] = expires_at
        if outcome == Answer.GRANTED:
            newest[resource] = max(newest[resource], epoch)
            epochs.add(epoch)
        if step.action.value != "write" or held is None:
            continue
        for p, event in enumerate(events):
            outcome, epoch = event[3], event[4]
            before = stored.get((p, held.resource))
            applied, late = outcome == "applied", tick >= expiry[step.actor]
            superseded, below = epoch < newest[held.resource], before is not None and epoch < before
            refused = outcome in ("stale", "conflict", "not live")
            for name, hit in [
                ("lost update", applied and below), ("stale refused", outcome == "stale"),
                ("superseded applied", applied and superseded),
                ("gap", applied and superseded and not below), ("late applied", applied and late),
                ("late, not superseded", applied and late and not superseded),
                ("replay", outcome == "replay"), ("conflict", outcome == "conflict"),
                ("late refused, not superseded", refused and late and not superseded),
            ]:
                if hit:
                    seen[p].add(name)
            if applied:
                stored[p, held.resource] = epoch
    return seen


def one_at_a_time(bound: Bound, place: calls.Place, run: Any) -> bool:
    """Whether some order of an interleaving's calls (none ending before another began comes
    after it), played one at a time by the real code on a new file, gives every answer and
    the stored pairs the interleaving left: the statement mode's safety, found otherwise."""
    final = run.final[0][1]  # the stored pair the interleaving left
    for order in itertools.permutations(run.calls):
        if any(later.end < earlier.start for i, earlier in enumerate(order)
               for later in order[i + 1:]):
            continue
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "sequential.sqlite3")
            objects = [LeaseAuthority(path), place.make(path)]
            try:
                answers = [calls.played(call.step, call.held, objects, path,
                                          bound.resource(call.h)) for call in order]
                stored = objects[1].read(core.RESOURCES[0])
            finally:
                for store in objects:
                    store.close()
        if all(core.lease_fields(kept) == call.run.kept and events == call.run.events
               for (kept, events), call in zip(answers, order)) and stored == final:
            return True
    return False


class OwnConnect(examples.ReadmeFence):
    """README's fence, connected by a sqlite3.connect of its own, out of the explorer's reach."""

    def __init__(self, path: str) -> None:
        self.connection = CONNECT(path, isolation_level=None, timeout=10)
        self.connection.execute("CREATE TABLE IF NOT EXISTS fenced (resource TEXT PRIMARY KEY,"
                                " epoch INTEGER NOT NULL, value TEXT NOT NULL)")


class InitRaises(examples.ReadmeFence):
    def __init__(self, path: str) -> None:
        raise RuntimeError("no fence today")


class CloseRaises(examples.ReadmeFence):
    def close(self) -> None:
        super().close()
        raise RuntimeError("cannot close")


# A reader's mistakes of interface: each exit 2 in one line naming the object and method.


class InitTwo(examples.ReadmeFence):
    def __init__(self, path: str, other: str) -> None:
        super().__init__(path)


class NoWrite:
    def __init__(self, path: str) -> None:
        self.path = path


class TwoArguments(examples.ReadmeFence):
    def write(self, resource: str, epoch: int) -> str:  # type: ignore[override]
        return "applied"


class AnswersNone(examples.ReadmeFence):
    def write(self, resource: str, epoch: int, value: str) -> Any:
        super().write(resource, epoch, value)
        return None


class Answers42(examples.ReadmeFence):
    def write(self, resource: str, epoch: int, value: str) -> Any:
        return 42


class AnswersInCapitals(examples.ReadmeFence):
    def write(self, resource: str, epoch: int, value: str) -> str:
        return super().write(resource, epoch, value).upper()


class ReadRaises(examples.ReadmeFence):
    def read(self, resource: str) -> tuple[int, str] | None:
        raise KeyError(resource)


class Reads42(examples.ReadmeFence):
    def read(self, resource: str) -> Any:
        return 42


MISUSES = {"InitTwo": "InitTwo(path)", "NoWrite": "NoWrite has no method write",
           "TwoArguments": "TwoArguments.write(resource, epoch, value) cannot be called so",
           "AnswersNone": "AnswersNone.write('quarterly-report', 1, 'A1') answered None",
           "Answers42": "Answers42.write('quarterly-report', 1, 'A1') answered 42",
           "AnswersInCapitals": "AnswersInCapitals.write('quarterly-report', 1, 'A1') answered "
                                "'APPLIED'",
           "ReadRaises": "ReadRaises.read('quarterly-report') raised KeyError",
           "Reads42": "Reads42.read('quarterly-report') returned 42"}


class HangsAtB(examples.ReadmeFence):
    """Its write for holder B never returns; it says so first on stdout, once per process."""

    def write(self, resource: str, epoch: int, value: str) -> str:
        if value.startswith("B"):
            print("B's write hangs", flush=True)
            threading.Event().wait()
        return super().write(resource, epoch, value)


# --- scratch copies: the library broken on purpose, the explorer run on it ---


def scratch(test: unittest.TestCase, old: str = "", new: str = "") -> str:
    """A copy of leases.py, run_experiment.py and explorer/ in a new folder, with `old`
    replaced by `new` in leases.py (which must hold it): the folder."""
    folder = tempfile.mkdtemp(prefix="explore-test-")
    test.addCleanup(shutil.rmtree, folder)
    for name in ("leases.py", "run_experiment.py"):
        shutil.copy(os.path.join(ROOT, name), folder)
    shutil.copytree(HERE, os.path.join(folder, "explorer"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    library = os.path.join(folder, "leases.py")
    with open(library, encoding="utf-8") as file:
        text = file.read()
    test.assertIn(old, text, "the breakage must find what it breaks")
    with open(library, "w", encoding="utf-8") as file:
        file.write(text.replace(old, new))
    return folder


def scratch_replace(test: unittest.TestCase, folder: str, old: str, new: str) -> None:
    """Replace `old` by `new` in the scratch copy's leases.py, once more."""
    library = os.path.join(folder, "leases.py")
    with open(library, encoding="utf-8") as file:
        text = file.read()
    test.assertIn(old, text, "the breakage must find what it breaks")
    with open(library, "w", encoding="utf-8") as file:
        file.write(text.replace(old, new))


def run(folder: str, *args: str) -> subprocess.CompletedProcess[str]:
    """explorer/explore.py with `args`, run from `folder`; no sample of passing schedules
    is played again (each costs a process) unless `args` ask for one."""
    sample = [] if "--sample" in args else ["--sample", "0"]
    return subprocess.run([sys.executable, os.path.join("explorer", "explore.py"), *args,
                           *sample], cwd=folder, capture_output=True, text=True,
                          timeout=TIMEOUT, check=False)


# Every text of leases.py that a breakage replaces (the library's private text: when it
# changes, these are mended, and nothing else).
DEFERRED_BEGIN = ('connection.execute("BEGIN IMMEDIATE")', 'connection.execute("BEGIN")')
READ_BEFORE_GRANT = (
    ("        def grant(connection: sqlite3.Connection) -> Lease:\n"
     "            row = _load(connection, resource)\n"),
    ("        early = self._transaction(lambda c: _load(c, resource), write=False)\n"
     "        def grant(connection: sqlite3.Connection) -> Lease:\n"
     "            row = early\n"))
STALE_RELEASE = ("        self._transaction(clear)\n", "        self._transaction(clear, write=False)\n")
SAVEPOINT = ('connection.execute("BEGIN IMMEDIATE")', 'connection.execute("SAVEPOINT s")',
             'connection.execute("COMMIT")', 'connection.execute("RELEASE s")')
SPLIT_GRANT = (("            lease = Lease(resource, holder, row.epoch + 1 if row else 1, "
               "expires_at)\n"),
               ("            lease = Lease(resource, holder, row.epoch + 1 if row else 1, "
               "expires_at)\n"
               "            connection.execute('COMMIT')\n"
               "            connection.execute('BEGIN IMMEDIATE')\n"))
FENCE_GREATER_OR_EQUAL = ("if stored is None or epoch > stored[0]:",
                          "if stored is None or epoch >= stored[0]:")
LIVE_AT_EXPIRY = ('    return _check_int("now", now, least=0) < _check_int(',
                  '    return _check_int("now", now, least=0) <= _check_int(')
GRANT_OVER_A_LIVE_LEASE = ("            if held:\n                raise LeaseHeld(held)\n", "")
OBJECT_MEMO = ("        _check_text(\"resource\", resource)\n        _check_int(\"epoch\"",
               ("        memo = self.__dict__.setdefault('memo', {})\n"
               "        if (resource, epoch, value) in memo:\n"
               "            return memo[resource, epoch, value]\n"
               "        memo[resource, epoch, value] = self._write(resource, epoch, value)\n"
               "        return memo[resource, epoch, value]\n\n"
               "    def _write(self, resource: str, epoch: int, value: str) -> WriteResult:\n"
               "        _check_text(\"resource\", resource)\n        _check_int(\"epoch\""))
RELEASE_LEFT_OPEN = (  # a release's transaction neither committed nor rolled back
    ("                    if write:\n                        connection.execute(\"COMMIT\")\n",
     ("                    if write and not getattr(self, '_last', ''):\n"
      "                        connection.execute(\"COMMIT\")\n")),
    ("                    if connection.in_transaction:",
     "                    if connection.in_transaction and not getattr(self, '_last', ''):"),
    ("            connection.execute(\"UPDATE leases SET holder = NULL",
     ("            self._last = 'holder = NULL'\n"
      "            connection.execute(\"UPDATE leases SET holder = NULL")))
RAISES_WHEN_MADE = ("        self._lock = threading.Lock()\n",
                    "        self._lock = threading.Lock()\n        self.path.nothing\n")
CURSOR_STATEMENT = ("            row = _load(connection, resource)\n            held",
                    ("            connection.cursor().execute('SELECT 1')\n"
                     "            row = _load(connection, resource)\n            held"))
MODULE_CACHE = ("            row = _load(connection, resource)\n            held = row.lease",
                ("            row = _CACHE.get(resource) or _load(connection, resource)\n"
                "            _CACHE[resource] = row\n            held = row.lease"))


class CountingTests(unittest.TestCase):
    """Every schedule of a bound, counted by state on the real library."""

    def test_the_default_bound_keeps_readmes_counts_and_every_check_holds(self) -> None:
        found = steps.explore_steps(Bound(), sample=4)
        self.assertEqual(found["schedules"], 90_090)
        self.assertEqual(found["counted"], 90_090)
        fenced, unfenced, asking = (found["classes"][n] for n in ("fenced", "unfenced", "asking"))
        self.assertEqual((unfenced["lost update"], fenced["stale refused"]), (882, 882))
        self.assertEqual((fenced["gap"], unfenced["superseded applied"]), (2_238, 3_120))
        self.assertEqual((asking["stale refused"], fenced["late, not superseded"]),
                         (3_120, 22_770))
        self.assertEqual({place["clean"] for place in found["classes"].values()}, {64_550})
        self.assertEqual(set(found["violations"].values()), {0})

    def test_a_brute_force_playing_every_schedule_whole_gives_the_same_counts(self) -> None:
        for name, bound in SMALL.items():
            with self.subTest(name):
                counts, _ = brute_force(bound)
                self.assertEqual(table(name)["classes"], counts)
                self.assertEqual(table(name)["schedules"], len(schedules(bound)))

    def test_fencing_turns_every_lost_update_into_a_refusal_one_for_one(self) -> None:
        for name in SMALL:
            classes = table(name)["classes"]
            self.assertEqual(classes["fenced"]["lost update"], 0, name)
            self.assertEqual(classes["fenced"]["stale refused"],
                             classes["unfenced"]["lost update"], name)

    def test_acquire_and_write_at_ticks_0_to_1_counts_as_a_hand_count_says(self) -> None:
        self.assertEqual(
            {place: [counts[n] for n in (*NAMES, "clean")]
             for place, counts in table("takeover")["classes"].items()},
            {"fenced": [0, 2, 2, 2, 10, 8, 0, 0, 0, 18],
             "unfenced": [2, 0, 4, 2, 12, 8, 0, 0, 0, 18],
             "asking": [0, 4, 0, 0, 0, 0, 0, 0, 8, 18]})

    def test_a_holders_own_check_leaves_the_gap_a_takeover_between_check_and_write(self) -> None:
        found = table("check, then write")
        self.assertEqual(found["classes"]["fenced"]["gap"], 4)
        self.assertEqual([(e["actor"], e["action"], e["outcome"])
                          for e in found["witnesses"]["fenced gap"]],
                         [("A", "acquire", "granted"), ("A", "check", "live"),
                          ("B", "acquire", "granted"), ("A", "write", "applied")])

    def test_the_asking_receiver_has_no_gap_and_refuses_late_writes_nobody_superseded(
            self) -> None:
        for name in SMALL:
            classes = table(name)["classes"]
            self.assertEqual(classes["asking"]["gap"], 0, name)
            self.assertEqual(classes["asking"]["late refused, not superseded"],
                             classes["unfenced"]["late, not superseded"], name)

    def test_a_retry_is_a_replay_and_a_second_write_a_conflict_in_every_schedule(self) -> None:
        self.assertEqual(table("a retry")["classes"]["fenced"]["replay"], 140)
        self.assertEqual(table("three decisions")["classes"]["fenced"]["conflict"], 140)

    def test_two_holders_of_two_resources_grant_only_epoch_1_and_a_third_holder_grants_2(
            self) -> None:
        two = Bound(2, ("acquire", "write"), last_tick=2, ttl=1, resources=2)
        self.assertEqual(brute_force(two)[1], {1})
        self.assertEqual(brute_force(Bound(3, ("acquire",), 1, 1, resources=2))[1], {1, 2})

    def test_every_check_holds_in_every_schedule_of_every_small_bound(self) -> None:
        for name in SMALL:
            self.assertEqual(set(table(name)["violations"].values()), {0}, name)

    def test_a_schedule_sample_is_the_same_for_a_seed_and_another_for_another(self) -> None:
        bound = Bound()
        self.assertEqual(steps._drawn(bound, 3, 7), steps._drawn(bound, 3, 7))
        self.assertNotEqual(steps._drawn(bound, 3, 7), steps._drawn(bound, 3, 8))


class BreakageTests(unittest.TestCase):
    """Each check fires under a breakage of the library made for it; a failure shown has
    failed again played whole from a fresh start."""

    def test_a_grant_over_a_live_lease_fails_one_live_lease_where_two_acquire(self) -> None:
        done = run(scratch(self, *GRANT_OVER_A_LIVE_LEASE), "--program", "acquire", "write",
                   "--last-tick", "1")
        self.assertEqual(done.returncode, explore.EXIT_FAILED, done.stderr)
        self.assertIn("checks failed: one live lease, model", done.stdout)
        self.assertIn("failing again played whole from a fresh start", done.stdout)

    def test_a_lease_live_at_its_expiry_tick_fails_the_model_whose_rule_is_its_own(
            self) -> None:
        done = run(scratch(self, *LIVE_AT_EXPIRY), "--program", "acquire", "renew",
                   "--last-tick", "1", "--ttl", "1")
        self.assertEqual(done.returncode, explore.EXIT_FAILED, done.stderr)
        self.assertIn("checks failed: model", done.stdout)
        self.assertIn("tick  1  A  renew    epoch 1   renewed", done.stdout)

    def test_a_fence_that_applies_an_equal_epoch_fails_where_a_holder_retries(self) -> None:
        folder = scratch(self, *FENCE_GREATER_OR_EQUAL)
        self.assertEqual(run(folder, "--program", "acquire", "write", "--last-tick",
                             "2").returncode, explore.EXIT_OK, "one write per lease")
        done = run(folder, "--program", "acquire", "write", "retry", "--last-tick", "1")
        self.assertEqual(done.returncode, explore.EXIT_FAILED)
        self.assertIn("checks failed: fence, model", done.stdout)

    def test_a_per_object_memo_is_named_an_answer_resting_on_more_than_the_file(self) -> None:
        done = run(scratch(self, *OBJECT_MEMO), "--program", "acquire", "write", "write",
                   "--last-tick", "1", "--ttl", "1", "--sample", "8")
        self.assertEqual(done.returncode, explore.EXIT_FAILED, done.stderr)
        self.assertRegex(done.stderr, r"^explore: the schedule .*: step \d+ \(. write at tick "
                         r"\d\) answered .* rests on more than the file and the call\n$")
        self.assertEqual(done.stdout, "")

    def test_a_module_cache_is_named_so_in_the_statement_mode_not_the_explorers_failure(
            self) -> None:
        folder = scratch(self, *MODULE_CACHE)
        with open(os.path.join(folder, "leases.py"), "a", encoding="utf-8") as file:
            file.write("\n_CACHE: dict[str, Any] = {}\n")
        done = run(folder, "--statements")
        self.assertEqual(done.returncode, explore.EXIT_FAILED, done.stderr)
        self.assertIn("rests on more than the file and the call", done.stderr)

    def test_each_begin_immediate_mistake_gives_a_double_grant_or_only_a_lock_error(
            self) -> None:
        for mistake, breakage, verdicts in [
            ("a deferred BEGIN", DEFERRED_BEGIN, ("safety: held", "errors: FAILED")),
            ("a SAVEPOINT", SAVEPOINT, ("safety: held", "errors: FAILED")),
            ("a read before the grant's transaction", READ_BEFORE_GRANT,
             ("safety: FAILED", "errors: held")),
            ("a grant split over two commits", SPLIT_GRANT, ("safety: FAILED", "errors: held")),
        ]:
            with self.subTest(mistake):
                folder = scratch(self, *breakage[:2])
                if len(breakage) > 2:
                    scratch_replace(self, folder, *breakage[2:])
                done = run(folder, "--statements")
                self.assertEqual(done.returncode, explore.EXIT_FAILED, done.stderr)
                for verdict in verdicts:
                    self.assertIn(verdict, done.stdout)
                self.assertIn("failing again played whole in a new process", done.stdout)

    def test_a_release_in_autocommit_passes_the_step_mode_and_fails_the_statement_mode(
            self) -> None:
        folder = scratch(self, *STALE_RELEASE)
        self.assertEqual(run(folder, "--program", "acquire", "release").returncode,
                         explore.EXIT_OK)
        done = run(folder, "--statements", "--program", "acquire", "release",
                   "--last-tick", "1")
        self.assertEqual(done.returncode, explore.EXIT_FAILED, done.stderr)
        self.assertIn("safety: FAILED", done.stdout)

    def test_a_transaction_left_open_fails_liveness_and_the_step_modes_lock_check(
            self) -> None:
        folder = scratch(self, *RELEASE_LEFT_OPEN[0])
        for old, new in RELEASE_LEFT_OPEN[1:]:
            scratch_replace(self, folder, old, new)
        done = run(folder, "--statements", "--program", "acquire", "release", "acquire")
        self.assertEqual(done.returncode, explore.EXIT_FAILED, done.stderr)
        self.assertIn("liveness: FAILED", done.stdout)
        done = run(folder, "--program", "acquire", "release", "--last-tick", "1")
        self.assertIn("lock left", done.stdout.split("checks failed:")[1].splitlines()[0])


class OwnFenceTests(unittest.TestCase):
    """A reader's receiver, --receiver MODULE:NAME, in both modes."""

    def test_readmes_fence_passes_every_check_in_both_modes(self) -> None:
        yours = calls.places("examples:ReadmeFence")
        found = steps.explore_steps(Bound(), yours, sample=2)
        self.assertEqual(set(found["violations"].values()), {0})
        self.assertEqual(found["classes"]["ReadmeFence"]["stale refused"], 882)
        self.assertTrue(statements.explore_statements(statements.BOUND, yours[0])["ok"])

    def test_greater_or_equal_fails_where_a_holder_retries_and_at_the_statement_default(
            self) -> None:
        yours = calls.places("examples:GreaterOrEqual")
        found = steps.explore_steps(Bound(2, ("acquire", "write", "retry"), 1, 1), yours,
                                sample=0)
        self.assertGreater(found["violations"]["model"], 0)
        self.assertEqual([(e["action"], e["outcome"]) for e in found["failures"]["model"]
                          ["events"]], [("acquire", "granted"), ("write", "applied"),
                                        ("write", "applied")])
        table_ = statements.explore_statements(statements.BOUND, yours[0])
        self.assertEqual(table_["failed"]["safety"], 1)

    def test_the_librarys_own_receiver_answering_a_write_result_passes(self) -> None:
        yours = calls.places("leases:Receiver")
        found = steps.explore_steps(SMALL["takeover"], yours, sample=0)
        self.assertEqual(set(found["violations"].values()), {0})

    def test_a_library_or_receiver_raising_as_it_is_made_or_closed_is_exit_1_in_one_line(
            self) -> None:
        broken = scratch(self, *RAISES_WHEN_MADE)
        yours = "the receiver given with --receiver 'test_explore:{}' raised RuntimeError in {}"
        for folder, said, args in [
            (broken, "the library raised AttributeError in LeaseAuthority(path)", []),
            (ROOT, yours.format("InitRaises", "InitRaises(path): no fence today"),
             ["--receiver", "test_explore:InitRaises"]),
            (ROOT, yours.format("CloseRaises", "close(): cannot close"),
             ["--receiver", "test_explore:CloseRaises"]),
        ]:
            for mode in ([], ["--statements"]):
                with self.subTest(said=said, mode=mode):
                    done = run(folder, *mode, *args, "--program", "acquire", "write")
                    self.assertEqual((done.returncode, done.stdout), (explore.EXIT_FAILED, ""))
                    self.assertRegex(done.stderr, rf"^explore: {re.escape(said)}.*\n$")

    def test_a_read_before_the_transaction_passes_the_step_mode_and_fails_at_a_takeover(
            self) -> None:
        yours = calls.places("examples:ReadBeforeTransaction")
        self.assertEqual(set(steps.explore_steps(Bound(), yours, sample=0)["violations"].values()),
                         {0})
        witness = statements.explore_statements(Bound(2, ("acquire", "write"), 1, 1),
                                                yours[0])["witnesses"]["safety"]
        self.assertIn("  A SELECT epoch, value FROM fenced WHERE resource = ?", witness)

    def test_a_receiver_that_mixes_resources_up_passes_with_two_holders_fails_with_three(
            self) -> None:
        yours = calls.places("examples:SharedHighWater")
        two = steps.explore_steps(Bound(2, ("acquire", "write"), 2, 1, resources=2), yours,
                              sample=0)
        self.assertEqual(two["violations"]["model"], 0)
        three = steps.explore_steps(Bound(3, ("acquire", "write"), 2, 1, resources=2), yours,
                                sample=0)
        self.assertGreater(three["violations"]["model"], 0)


def explored(*args: str) -> tuple[int, str]:
    """explore.main(args) in this process: its exit code and what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = explore.main(args)
    return code, out.getvalue()


def again(output: str) -> list[tuple[list[str], list[str]]]:
    """Each witness a run printed: its steps' lines, and the command that plays it again (its
    arguments)."""
    found, lines = [], list[str]()
    for line in output.splitlines():
        if line.startswith("  again: "):
            found.append((lines, shlex.split(line.split("again: ", 1)[1])[2:]))
            lines = []
        elif re.match(r"  (tick|[A-H] )|    stored", line):
            lines.append(line)
    return found


class ReaderTests(unittest.TestCase):
    """What a reader checking their own fence meets: no false alarm, each misuse one line,
    each hang a finding, each witness played again as printed, and a signal leaves nothing."""

    def test_correct_fences_written_otherwise_pass_both_modes(self) -> None:
        # One holder is enough to die after a COMMIT that wrote nothing, or inside a
        # `with connection:`, and have its retry judged: the false alarms of before.
        crash = Bound(1, ("acquire", "write", "retry"), last_tick=0, ttl=1)
        for name in examples.CORRECT[1:]:
            with self.subTest(name):
                yours = calls.places(f"examples:{name}")
                found = steps.explore_steps(SMALL["a retry"], yours, sample=0)
                self.assertEqual(set(found["violations"].values()), {0})
                found = statements.explore_statements(crash, yours[0])
                self.assertTrue(found["ok"], found["witnesses"])
                self.assertGreater(found["crash_schedules"], 10)

    def test_a_call_whose_autocommit_write_committed_must_be_in_the_order(self) -> None:
        # A's upsert commits as it runs, A dies, and A's retry is applied again: only a
        # call counted as committed without a COMMIT shows that no order gives it.
        found = statements.explore_statements(Bound(1, ("acquire", "write"), 0, 1),
                                              calls.places("examples:AutocommitGreaterOrEqual")[0])
        self.assertEqual(found["failed"]["safety"], 1)

    def test_each_misuse_of_the_interface_is_exit_2_in_one_line_naming_it(self) -> None:
        for name, said in MISUSES.items():
            for mode in ([], ["--statements"]):
                with self.subTest(name, mode=mode):
                    out, err = io.StringIO(), io.StringIO()
                    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                        code = explore.main([*mode, "--receiver", f"test_explore:{name}",
                                             "--program", "acquire", "write",
                                             "--last-tick", "0", "--sample", "1"])
                    self.assertEqual((code, out.getvalue()), (explore.EXIT_USAGE, ""))
                    self.assertEqual(len(err.getvalue().splitlines()), 1, err.getvalue())
                    self.assertIn(said, err.getvalue())

    def test_a_hung_call_is_exit_1_naming_holder_and_call_in_both_modes_within_twice_the_bound(
            self) -> None:
        def watched(mode: list[str], seen: dict[str, Any]) -> None:
            """One run: its first line, the seconds from it (the hang begun) to its end."""
            done = subprocess.Popen(
                [sys.executable, os.path.join("explorer", "explore.py"), *mode, "--receiver",
                 "test_explore:HangsAtB", "--timeout", "1", "--program", "acquire", "write",
                 "--last-tick", "0", "--sample", "0"], cwd=ROOT, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True)
            try:
                assert done.stdout is not None
                seen["first"], hung = done.stdout.readline(), time.monotonic()
                seen["out"], seen["err"] = done.communicate(timeout=TIMEOUT)
                seen["seconds"], seen["code"] = time.monotonic() - hung, done.returncode
            finally:
                done.kill()

        runs = {mode: dict[str, Any]() for mode in ("", "--statements")}
        threads = [threading.Thread(target=watched, args=(mode.split(), seen))
                   for mode, seen in runs.items()]  # both at once: each waits on its own
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(TIMEOUT)
        for seen in runs.values():
            self.assertEqual(seen["first"], "B's write hangs\n")
            self.assertLess(seen["seconds"], 2.0, "twice the bound")
            self.assertEqual(seen["code"], explore.EXIT_FAILED, seen["err"])
            out = seen["out"]
            self.assertRegex(out, r"hang: (holder B's write|B write) at tick 0 gave no answer "
                             r"within 1 s")
            self.assertIn("--replay", out)

    def test_sigterm_and_sighup_end_it_as_ctrl_c_does_leaving_nothing(self) -> None:
        for mode, number in (([], signal.SIGTERM), (["--statements"], signal.SIGHUP)):
            with self.subTest(mode=mode, signal=number):
                folder = tempfile.mkdtemp(prefix="explore-test-")
                self.addCleanup(shutil.rmtree, folder)
                explorer = subprocess.Popen(
                    [sys.executable, os.path.join("explorer", "explore.py"), *mode,
                     "--receiver", "test_explore:HangsAtB", "--program", "acquire", "write",
                     "--last-tick", "0", "--timeout", str(TIMEOUT)], cwd=ROOT, text=True,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    env={**os.environ, "TMPDIR": folder})
                self.addCleanup(explorer.kill)
                self.assertEqual(explorer.stdout.readline() if explorer.stdout else "",
                                 "B's write hangs\n")  # then it waits on its own
                explorer.send_signal(number)
                _, err = explorer.communicate(timeout=TIMEOUT)
                self.assertEqual((explorer.returncode, err.strip()),
                                 (128 + number, f"explore: ended by {number.name}"))
                self.assertEqual(os.listdir(folder), [])
                self.assertEqual(_children_of(explorer.pid), [])

    def test_each_witness_printed_plays_again_alone_as_printed(self) -> None:
        for args in (["--receiver", "examples:GreaterOrEqual", "--program", "acquire", "write",
                      "retry", "--last-tick", "1", "--ttl", "1"],
                     ["--statements", "--receiver", "examples:GreaterOrEqual"],
                     ["--program", "acquire", "write", "--last-tick", "1", "--ttl", "1"]):
            with self.subTest(args=args):
                code, out = explored(*args, "--sample", "0")
                printed = again(out)
                self.assertTrue(printed, out)
                for lines, words in printed:  # each replay in a process of its own
                    code_again, out_again = explored(*words)
                    self.assertEqual(code_again, code, out_again)
                    for line in lines:
                        self.assertIn(line, out_again.splitlines())
        self.assertEqual(explored("--replay", "C@0")[0], explore.EXIT_USAGE)

    def test_a_high_first_epoch_shows_an_epoch_kept_as_text_or_in_32_bits_at_a_takeover(
            self) -> None:
        yours, bound = calls.places("examples:TextEpoch"), Bound(2, ("acquire", "write"), 1, 1)
        readme = calls.places("examples:ReadmeFence")
        self.assertEqual(set(steps.explore_steps(dataclasses.replace(
            bound, first_epoch=9), readme, sample=0)["violations"].values()), {0}, "no alarm")
        self.assertEqual(set(steps.explore_steps(bound, yours, sample=0)["violations"]
                             .values()), {0}, "epochs 1 and 2 compare alike as text")
        found = steps.explore_steps(dataclasses.replace(bound, first_epoch=9), yours,
                                      sample=0)
        self.assertEqual(found["failures"]["fence"]["events"][-1]["epoch"], 9)
        self.assertIn("stored (10, 'B1') -> (9, 'A1'); the contract: stale",
                      "\n".join(found["failures"]["fence"]["lines"]))
        self.assertFalse(statements.explore_statements(dataclasses.replace(
            statements.BOUND, last_tick=1, first_epoch=9), yours[0])["ok"])
        narrow = calls.places("examples:NarrowEpoch")
        self.assertEqual(set(steps.explore_steps(bound, narrow, sample=0)["violations"]
                             .values()), {0})
        self.assertGreater(steps.explore_steps(dataclasses.replace(
            bound, first_epoch=2**31 - 1), narrow, sample=0)["violations"]["fence"], 0)

    def test_with_two_resources_each_line_names_its_resource_and_each_is_judged_alone(
            self) -> None:
        # B writes its live lease on the second resource after C's grant of epoch 2 on the
        # first: judged with the first, B's write would be "superseded".
        bound = Bound(3, ("acquire", "write"), last_tick=2, ttl=2, resources=2)
        walked = steps.replay(bound, calls.places(), steps.parse(
            bound, "A@0 B@1 C@2 B@2"))
        lines = steps._lines(bound, walked, 0)
        self.assertIn("  tick  2  B  annual-report     write    epoch 1   applied   'B1': "
                      "stored nothing -> (1, 'B1'); the contract: applied", lines)
        self.assertIn("  annual-report: final value written by B; stale writes refused: 0, "
                      "conflicting: 0", lines)
        self.assertFalse([line for line in lines if "superseded" in line], lines)

    def test_a_closed_stdout_ends_quietly(self) -> None:
        explorer = subprocess.Popen(
            [sys.executable, os.path.join("explorer", "explore.py"), "--program", "acquire",
             "--last-tick", "0", "--sample", "0"], cwd=ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE)
        assert explorer.stdout is not None
        explorer.stdout.close()  # as `| head` does once it has its lines
        _, err = explorer.communicate(timeout=TIMEOUT)
        self.assertEqual((explorer.returncode, err), (explore.EXIT_OK, b""))


def _children_of(pid: int) -> list[int]:
    """Processes the explorer started that outlive it: their parent is it, or was."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/stat", "rb") as file:
                fields = file.read().rsplit(b")", 1)[1].split()
                if int(fields[1]) == pid or int(fields[2]) == pid:  # parent, or process group
                    found.append(int(entry))
    return found


class _Toy(engine.Scheduler):
    """The smallest subject of the engine: actors that each pass `gates` gates (the first a
    statement on a file of their own), told to go on, fail or die; the transcript in `said`."""

    def __init__(self, actors: int, gates: int, folder: str, crashes: bool,
                 cleanup: contextlib.ExitStack, fails: bool = False) -> None:
        super().__init__([f"actor {n}" for n in range(actors)], TIMEOUT, crashes, cleanup)
        self.gates, self.folder, self.fails = gates, folder, fails
        self.begun = [False] * actors

    def body(self, n: int) -> Any:
        def run() -> str:
            connection = sqlite3.connect(os.path.join(self.folder, f"{n}.sqlite3"))
            try:
                connection.execute("CREATE TABLE t (x)")
            except sqlite3.OperationalError as exc:
                return str(exc)
            return " ".join(str(engine.gate(f"gate {k}")) for k in range(1, self.gates))
        return run

    def enabled(self) -> list[Any]:
        return [*(("start", n) for n, begun in enumerate(self.begun) if not begun),
                *(choice for n, what in enumerate(self.waiting) if what is not None
                  for choice in [("run", n), *[("fail", n)] * (self.fails and what.startswith(
                      "CREATE")), *[("die", n)] * self.may_die])]

    def token(self, choice: Any) -> str:
        return f"{choice[0]} {choice[1]}"

    def take(self, choice: Any) -> None:
        kind, n = choice
        if kind == "start":
            self.begun[n] = True
            told = self.start(n, self.body(n), "run")
        else:
            told = {"run": lambda: self.go(n, f"v{n}"), "fail": lambda: self.fail(n),
                    "die": lambda: self.kill(n)}[kind]()
        self.said.append(f"{choice}: {told}")


class _Played(NamedTuple):
    choices: tuple[int, ...]
    options: tuple[int, ...]
    died: bool
    said: tuple[str, ...]


def toy(actors: int, gates: int, fails: bool = False) -> Any:
    """play(given, crashes) for engine.every over the toy subject."""
    def play(given: tuple[int, ...], crashes: bool) -> _Played:
        with contextlib.ExitStack() as cleanup:
            folder = cleanup.enter_context(tempfile.TemporaryDirectory())
            scheduler = _Toy(actors, gates, folder, crashes, cleanup, fails)
            choices, options = scheduler.chosen(given)
            return _Played(choices, options, scheduler.died, tuple(scheduler.said))
    return play


def toy_count(actors: int, gates: int) -> tuple[int, int]:
    """Interleavings without a crash and with one, counted by hand's rule: each actor's start
    and gates in order, and after a death every other actor alone, in one order."""
    @functools.cache
    def count(left: tuple[int, ...], crashed: bool) -> tuple[int, int]:
        if crashed or not any(left):
            return (0, 1) if crashed else (1, 0)
        clean = crash = 0
        for n, steps_left in enumerate(left):
            if steps_left:
                after = count((*left[:n], steps_left - 1, *left[n + 1:]), False)
                clean, crash = clean + after[0], crash + after[1]
                if steps_left <= gates:  # paused at a gate: it may die there
                    crash += count((), True)[1]
        return clean, crash
    return count((gates + 1,) * actors, False)


class EngineTests(unittest.TestCase):
    """The engine alone, on the smallest subject."""

    def setUp(self) -> None:
        gated = engine.gated()
        gated.__enter__()
        self.addCleanup(gated.__exit__, None, None, None)

    def test_every_plays_each_interleaving_once_and_each_with_one_crash(self) -> None:
        for actors, gates in ((1, 1), (2, 1), (2, 2), (3, 1)):
            with self.subTest(actors=actors, gates=gates):
                runs = list(engine.every(toy(actors, gates)))
                played = Counter(run.died for run in runs)
                self.assertEqual((played[False], played[True]), toy_count(actors, gates))
                self.assertEqual(len({run.said for run in runs}), len(runs))

    def test_a_gate_answers_the_value_gone_on_with_and_a_failed_statement_raises_locked(
            self) -> None:
        said = [run.said for run in engine.every(toy(1, 3, fails=True), (False,))]
        self.assertIn(("('start', 0): ('paused', 'CREATE TABLE t (x)')",
                       "('run', 0): ('paused', 'gate 1')", "('run', 0): ('paused', 'gate 2')",
                       "('run', 0): ('ended', 'v0 v0')"), said)
        self.assertIn(("('start', 0): ('paused', 'CREATE TABLE t (x)')",
                       f"('fail', 0): ('ended', '{engine.LOCKED}')"), said)

    def test_a_body_started_unstopped_runs_to_interleave_then_holds_the_write_lock(
            self) -> None:
        with contextlib.ExitStack() as cleanup:
            folder = cleanup.enter_context(tempfile.TemporaryDirectory())
            scheduler = _Toy(1, 1, folder, False, cleanup)

            def body() -> Any:
                connection = sqlite3.connect(os.path.join(folder, "own.sqlite3"))
                connection.execute("CREATE TABLE t (x)")  # its opening: not stopped
                engine.interleave()
                connection.execute("INSERT INTO t VALUES (1)")  # sqlite3 begins first
                return engine.gate("its end")

            self.assertEqual(scheduler.start(0, body, "run", interleaved=False),
                             ("paused", "INSERT INTO t VALUES (1)"))
            self.assertFalse(scheduler.actors[0].writing)
            self.assertEqual(scheduler.go(0), ("paused", "its end"))
            self.assertTrue(scheduler.actors[0].writing)
            self.assertFalse(scheduler.actors[0].committed)
            self.assertEqual(scheduler.go(0, 7), ("ended", 7))

    def test_a_killed_actor_dies_in_its_thread_and_a_silent_one_is_hung(self) -> None:
        with contextlib.ExitStack() as cleanup:
            scheduler = _Toy(1, 2, cleanup.enter_context(tempfile.TemporaryDirectory()), True,
                             cleanup)
            scheduler.take(("start", 0))
            self.assertEqual(scheduler.kill(0), ("died", None))
            self.assertEqual(scheduler.actors[0].connections, [])
            scheduler.seconds = 0.05
            with self.assertRaises(core.Hung) as hung:
                scheduler.heard(0)  # told nothing: it waits for its next body
            self.assertIn("actor 0's run gave no answer", hung.exception.said)


class StatementTests(unittest.TestCase):
    """Every interleaving at each statement, with a crash before each."""

    def test_the_default_bound_holds_safety_liveness_and_errors_with_crashes_retried(
            self) -> None:
        found = statements.explore_statements(statements.BOUND)
        self.assertTrue(found["ok"])
        self.assertEqual(found["failed"], dict.fromkeys(statements.VERDICTS, 0))
        self.assertGreater(found["crash_schedules"], found["interleavings"])
        self.assertEqual(sum(found["after_a_crash"].values()), found["crash_schedules"],
                         "each crash's step is taken again, and counted")
        self.assertEqual(found["after_a_crash"]["write, committed: replay"] > 0, True)
        self.assertIn("acquire, committed: held", found["after_a_crash"])

    def test_a_brute_force_of_one_at_a_time_orders_agrees_with_safety_on_hand_made_calls(
            self) -> None:
        bound, rules = statements.BOUND, ("fenced",)
        acquire_a, acquire_b = bound.step(0, 0, 0), bound.step(1, 0, 0)
        granted = core.Run(("quarterly-report", "A", 1, 1),
                              (("A", "acquire", 0, "granted", 1, 1, None, None, None),), False)
        twice = core.Run(("quarterly-report", "B", 1, 1),
                            (("B", "acquire", 0, "granted", 1, 1, None, None, None),), False)
        held = core.Run(None, (("B", "acquire", 0, "held", 1, 1, None, None, None),), False)
        a = statements.Call(0, acquire_a, None, granted, True, 1, 4)
        final = ((("A", 1, 1), None),)
        self.assertTrue(statements.safe(bound, rules, (a, statements.Call(
            1, acquire_b, None, held, False, 2, 6)), final))
        self.assertFalse(statements.safe(bound, rules, (a, statements.Call(
            1, acquire_b, None, twice, True, 2, 6)), final), "a double grant")
        self.assertFalse(statements.safe(bound, rules, (a,), ((("B", 1, 1), None),)),
                         "the file must hold what the order leaves")
        early = statements.Call(1, acquire_b, None, held, False, 1, 2)
        self.assertFalse(statements.safe(bound, rules, (early, a._replace(start=3, end=4)),
                                         final), "held by a lease granted after it ended")
        self.assertTrue(statements.safe(bound, rules, (early, a._replace(start=1, end=4)),
                                        final), "held by a lease granted while it ran")
        died = statements.Call(1, acquire_b, None, None, False, 2, 3)
        self.assertTrue(statements.safe(bound, rules, (a, died), final), "its effect unknown")
        nothing = ((None, None),)
        self.assertTrue(statements.safe(bound, rules, (died,), nothing), "no effect")
        self.assertFalse(statements.safe(bound, rules, (died._replace(committed=True),),
                                         nothing), "a committed call is in the order")

    def test_a_brute_force_of_sequential_runs_of_the_real_code_agrees_with_safety(
            self) -> None:
        gated = engine.gated()
        gated.__enter__()
        self.addCleanup(gated.__exit__, None, None, None)
        for bound, spec, fails in [(statements.BOUND, None, False),
                                   (Bound(2, ("acquire", "write"), 1, 1),
                                    "examples:ReadBeforeTransaction", True)]:
            place = calls.places(spec)[0]
            every = statements._every(bound, place, (False,))  # no crash: each call answers
            runs = [next(r for r in every if r.failed)] if fails else list(every)
            for run in runs:
                with self.subTest(spec=spec, choices=run.choices):
                    self.assertEqual(one_at_a_time(bound, place, run), not run.failed)
            self.assertGreater(len(runs), 40 * (not fails))

    def test_a_receiver_whose_connection_the_explorer_cannot_stop_is_refused(self) -> None:
        with self.assertRaisesRegex(core.Unsupported, "opened no connection through "
                                    "sqlite3.connect as it was made"):
            statements.explore_statements(statements.BOUND,
                                          calls.places("test_explore:OwnConnect")[0])

    def test_a_statement_run_where_the_explorer_cannot_stop_it_is_a_usage_error(self) -> None:
        folder = scratch(self, *CURSOR_STATEMENT)
        done = run(folder, "--statements")
        self.assertEqual(done.returncode, explore.EXIT_USAGE)
        self.assertIn("where the explorer cannot stop it", done.stderr)


class CommandLineTests(unittest.TestCase):
    def test_help_says_every_exit_code(self) -> None:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), self.assertRaises(SystemExit):
            explore.main(["--help"])
        for code in (0, 1, 2, 130):
            self.assertRegex(out.getvalue(), rf"\n  {code} +\w")
        self.assertIn("143: SIGTERM; 129: SIGHUP", out.getvalue())

    def test_a_bad_program_or_receiver_is_exit_2_in_one_line(self) -> None:
        for args in (["--program", "acquire", "retry"], ["--receiver", "nowhere:Fence"],
                     ["--first-epoch", "0"], ["--timeout", "0"], ["--replay", "A@0 A@1 Z@2"],
                     ["--receiver", "examples"], ["--receiver", "examples:Nothing"]):
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                self.assertEqual(explore.main(args), explore.EXIT_USAGE, args)
            self.assertEqual(len(err.getvalue().splitlines()), 1, err.getvalue())

    def test_ctrl_c_is_exit_130(self) -> None:
        with mock.patch.object(steps, "explore_steps", side_effect=KeyboardInterrupt), \
                contextlib.redirect_stderr(io.StringIO()):
            self.assertEqual(explore.main([]), explore.EXIT_INTERRUPTED)

    def test_the_roots_discovery_finds_none_of_these_tests(self) -> None:
        listed = subprocess.run(
            [sys.executable, "-c", ("import unittest\n"
             "def ids(suite):\n"
             "    for test in suite:\n"
             "        yield from ids(test) if isinstance(test, unittest.TestSuite) else [test.id()]\n"
             "print(*ids(unittest.defaultTestLoader.discover('.')), sep='\\n')")],
            cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT, check=True)
        self.assertFalse([name for name in listed.stdout.split() if "explore" in name])

    def test_a_clean_run_from_the_root_exits_0_with_its_table(self) -> None:
        done = subprocess.run([sys.executable, os.path.join("explorer", "explore.py"),
                               "--program", "acquire", "write", "--last-tick", "1"],
                              cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
                              check=False)
        self.assertEqual(done.returncode, explore.EXIT_OK, done.stderr)
        self.assertIn("schedules with", done.stdout)


class LayoutTests(unittest.TestCase):
    """The explorer's modules stay readable: no import cycle, none too long, the CLI apart."""

    def test_no_module_imports_one_that_imports_it_and_none_is_over_600_lines(self) -> None:
        self.assertEqual(layout_faults(HERE), [])

    def test_the_layout_check_sees_a_cycle_a_long_module_and_an_import_of_the_cli(
            self) -> None:
        folder = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, folder)
        for name, text in {"a.py": "import b\n", "b.py": "from c import x\n",
                           "c.py": "import a\nx = 1\n" + "\n" * 600,
                           "d.py": "import explore\n", "explore.py": ""}.items():
            with open(os.path.join(folder, name), "w", encoding="utf-8") as file:
                file.write(text)
        faults = layout_faults(folder)
        self.assertIn("c.py: 602 lines", faults)
        self.assertIn("d.py imports explore.py, the command line", faults)
        self.assertTrue(any(fault.startswith("an import cycle") for fault in faults), faults)


def layout_faults(folder: str) -> list[str]:
    """What breaks the layout in `folder`'s modules (test files aside): a module over 600
    lines, an import cycle among them, direct or not, or an import of the command line."""
    texts = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py") and not name.startswith("test_"):
            with open(os.path.join(folder, name), encoding="utf-8") as file:
                texts[name[:-3]] = file.read()
    faults = [f"{name}.py: {len(text.splitlines())} lines" for name, text in texts.items()
              if len(text.splitlines()) > 600]
    graph = {}
    for name, text in texts.items():
        imported = set()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                imported |= {alias.name.partition(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.partition(".")[0])
        graph[name] = imported & texts.keys()
        faults += [f"{name}.py imports explore.py, the command line"] * ("explore" in imported)
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as cycle:
        faults.append(f"an import cycle: {' -> '.join(cycle.args[1])}")
    return faults


if __name__ == "__main__":
    in_memory()
    sqlite3.enable_callback_tracebacks(False)
    unittest.main()
