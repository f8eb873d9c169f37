"""The explorer's own tests: explore.py counts every schedule of a bound exactly, and each of
its checks fires under a breakage of the library made for it.

Run alone with `python3 test_explore.py`; `python3 -m unittest discover` runs it together with
test_leases.py.  Nothing here sleeps; a stop is simulated by noting it.
"""

import concurrent.futures
import contextlib
import dataclasses
import functools
import gc
import io
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import types
import unittest
from collections import Counter
from typing import Any
from unittest import mock

import explore
import leases
import run_experiment
from run_experiment import Action

NAMES = [cls.name for cls in run_experiment.CLASSES]  # the classes of a write, in order
HERE = os.path.dirname(os.path.realpath(__file__))
TIMEOUT = 60.0  # bounds a hung run; no test waits for it to pass

ACQUIRE, CHECK, WRITE = Action.ACQUIRE, Action.CHECK, Action.WRITE
RENEW, RELEASE, RETRY = Action.RENEW, Action.RELEASE, explore.RETRY
BOUNDS = {
    "takeover": explore.Bound(2, (ACQUIRE, WRITE), last_tick=1, ttl=1),
    "two writes, no expiry": explore.Bound(2, (ACQUIRE, WRITE, WRITE), last_tick=1, ttl=2),
    "renew, release": explore.Bound(2, (ACQUIRE, RENEW, WRITE, RELEASE), last_tick=1, ttl=1),
    "check, then write": explore.Bound(2, (ACQUIRE, CHECK, WRITE), last_tick=1, ttl=1),
    "one holder": explore.Bound(1, (ACQUIRE, WRITE, WRITE, CHECK, ACQUIRE, WRITE, RENEW, WRITE,
                                    RELEASE), last_tick=2, ttl=2),
    # README's bound in which three decisions reach a receiver: each holder writes twice.
    "three decisions": explore.Bound(2, (ACQUIRE, WRITE, WRITE), last_tick=1, ttl=1),
    "two resources": explore.Bound(2, (ACQUIRE, RENEW, WRITE), last_tick=1, ttl=1, resources=2),
    # README's bound with a retry of a holder's last write, as after an unknown outcome.
    "a retry": explore.Bound(2, (ACQUIRE, WRITE, RETRY), last_tick=1, ttl=1),
}


@functools.cache
def _tables() -> dict[str, dict[str, Any]]:
    """Every bound above, explored once for the whole module."""
    return {name: explore.explore(bound) for name, bound in BOUNDS.items()}


def _classes(name: str) -> dict[str, dict[str, int]]:
    classes: dict[str, dict[str, int]] = _tables()[name]["classes"]
    return classes


class CountingTests(unittest.TestCase):
    """Every schedule of small bounds, on the real code.  A schedule is an order of steps and
    their ticks, refused steps included; it counts in every class it shows."""

    def test_every_check_holds_in_every_schedule_of_every_bound_explored(self) -> None:
        for name, table in _tables().items():
            self.assertEqual(table["violations"], dict.fromkeys(explore.CHECKS, 0), name)

    def test_playing_every_schedule_whole_gives_the_table_that_counting_by_state_gives(
        self,
    ) -> None:
        for name, bound in BOUNDS.items():
            if name == "renew, release":  # 630 schedules whole
                continue  # take 2 s and 12 s, and show nothing more
            whole = explore.explore(bound, brute_force=True)
            for key in ("schedules", "classes", "violations", "witnesses", "failures"):
                self.assertEqual(_tables()[name][key], whole[key], (name, key))
        self.assertTrue(gc.isenabled(), "the collector is back on after an exploration")

    def test_the_fence_loses_no_update_and_refuses_exactly_where_unfenced_loses_one(
        self,
    ) -> None:
        for name in BOUNDS:
            classes = _classes(name)
            self.assertEqual(classes["fenced"]["lost update"], 0, name)
            self.assertEqual(classes["fenced"]["stale refused"],
                             classes["unfenced"]["lost update"], name)

    def test_acquire_and_write_ticks_0_to_1_ttl_1_gives_30_schedules_53_states_these_counts(
        self,
    ) -> None:
        table = _tables()["takeover"]
        self.assertEqual((table["schedules"], table["states"]), (30, 53))
        self.assertEqual(
            {receiver: [counts[name] for name in (*NAMES, "clean")]
             for receiver, counts in table["classes"].items()},
            {"fenced": [0, 2, 2, 2, 10, 8, 0, 0, 0, 18],
             "unfenced": [2, 0, 4, 2, 12, 8, 0, 0, 0, 18],
             "asking": [0, 4, 0, 0, 0, 0, 0, 0, 8, 18]},
        )
        self.assertEqual(set(table["kinds"].values()), {"harm", "protection", "neither"})

    def test_the_smallest_schedules_of_each_kind_are_the_three_scenarios_interleavings(
        self,
    ) -> None:
        witnesses = _tables()["takeover"]["witnesses"]
        by_name = {scenario.name: scenario for scenario in run_experiment.SCENARIOS}
        for witness, scenario, steps in [
            ("unfenced lost update", "unfenced_receiver", 4),
            ("fenced stale refused", "fenced_receiver", 4),
            ("fenced gap", "expiry_before_receiver_observation_gap", 3),  # up to A's write
        ]:
            self.assertEqual(
                [(e["actor"], e["action"]) for e in witnesses[witness]],
                [(s.actor, s.action.value) for s in by_name[scenario].steps][:steps],
                witness,
            )
        self.assertEqual([(e["epoch"], e["outcome"]) for e in witnesses["fenced stale refused"]],
                         [(1, "granted"), (2, "granted"), (2, "applied"), (1, "stale")])

    def test_each_class_of_a_write_is_what_its_rule_says(self) -> None:
        def answered(outcome: str, epoch: int, tick: int, *, newest: int, stored: int | None,
                     expires_at: int = 10) -> run_experiment.Write:
            event = run_experiment.Event("A", WRITE, tick, outcome, epoch, None, "v", None, None)
            return run_experiment.Write(event, newest, stored, expires_at)

        for write, names in [
            (answered("applied", 1, 11, newest=2, stored=2),
             {"lost update", "superseded applied", "late applied"}),
            (answered("stale", 1, 11, newest=2, stored=2), {"stale refused"}),
            (answered("applied", 1, 5, newest=2, stored=None), {"superseded applied", "gap"}),
            (answered("applied", 2, 10, newest=2, stored=1),
             {"late applied", "late, not superseded"}),
            (answered("replay", 2, 3, newest=2, stored=2), {"replay"}),
            (answered("conflict", 2, 12, newest=2, stored=2),
             {"conflict", "late refused, not superseded"}),
            (answered("not live", 2, 12, newest=2, stored=None),
             {"late refused, not superseded"}),
            (answered("applied", 2, 3, newest=2, stored=1), set()),
        ]:
            with self.subTest(write=write):
                found = run_experiment.classes(write)
                self.assertEqual({name for name, hit in zip(NAMES, found) if hit}, names)

    def test_two_writes_at_one_epoch_the_second_is_a_conflict_in_every_schedule(self) -> None:
        self.assertEqual(_classes("two writes, no expiry")["fenced"]["conflict"], 140)

    def test_three_decisions_reach_a_receiver_and_its_late_refusals_are_its_conflicts(
        self,
    ) -> None:
        table = _tables()["three decisions"]
        self.assertEqual((table["schedules"], table["states"]), (140, 177))
        fenced = table["classes"]["fenced"]
        self.assertEqual((fenced["conflict"], fenced["late refused, not superseded"],
                          fenced["stale refused"]), (140, 56, 18))
        self.assertEqual(max(len(run) for run in table["witnesses"].values()), 6)

    def test_a_holders_own_check_leaves_gap_schedules_a_takeover_between_check_and_write(
        self,
    ) -> None:
        self.assertEqual(_classes("check, then write")["fenced"]["gap"], 4)
        self.assertEqual(
            [(e["actor"], e["action"], e["outcome"])
             for e in _tables()["check, then write"]["witnesses"]["fenced gap"]],
            [("A", "acquire", "granted"), ("A", "check", "live"), ("B", "acquire", "granted"),
             ("A", "write", "applied")],
        )

    def test_the_asking_receiver_has_no_gap_and_no_lost_update_and_refuses_late_writes(
        self,
    ) -> None:
        for name in BOUNDS:
            classes = _classes(name)
            asking = classes["asking"]
            self.assertEqual([asking["lost update"], asking["gap"],
                              asking["late, not superseded"]], [0, 0, 0], name)
            self.assertEqual(asking["late refused, not superseded"],
                             classes["unfenced"]["late, not superseded"], name)
        self.assertEqual(_classes("check, then write")["asking"]["late refused, not superseded"],
                         34)

    def test_a_bound_in_which_no_lease_can_expire_says_so_and_has_no_takeover(self) -> None:
        self.assertEqual([name for name, table in _tables().items()
                          if not table["leases_can_expire"]], ["two writes, no expiry"])
        self.assertEqual(_classes("two writes, no expiry")["unfenced"]["clean"], 140)

    def test_holders_of_two_resources_never_supersede_each_other(
        self,
    ) -> None:
        table = _tables()["two resources"]
        for receiver, counts in table["classes"].items():
            for name in ("lost update", "stale refused", "superseded applied", "gap"):
                self.assertEqual(counts[name], 0, (receiver, name))
        self.assertEqual(table["bound"]["resources"], 2)

    def test_a_retry_of_a_holders_last_write_is_a_replay_at_the_fenced_receiver_in_each_schedule(
        self,
    ) -> None:
        table = _tables()["a retry"]
        self.assertEqual(table["schedules"], 140)
        classes = _classes("a retry")
        self.assertEqual([classes[receiver]["replay"] for receiver in explore.RECEIVERS],
                         [140, 0, 0], "the fenced receiver's replays, where unfenced applies")
        self.assertEqual(classes["fenced"]["conflict"], 0)
        with self.subTest("a program's retry needs a write before it"), self.assertRaisesRegex(
                ValueError, "a retry sends the holder's last write again: it needs a write"):
            explore.Bound(1, (ACQUIRE, RETRY, WRITE))

    def test_progress_is_said_every_2_s_with_how_far_the_search_is(self) -> None:
        now = [0.0]

        def monotonic() -> float:  # a clock that moves 0.5 s each time it is read
            now[0] += 0.5
            return now[0]

        said: list[tuple[float, str]] = []
        with mock.patch.object(explore, "time", mock.Mock(monotonic=monotonic)):
            explore.explore(explore.Bound(last_tick=2, ttl=1),
                            progress=lambda line: said.append((now[0], line)))
        self.assertGreater(len(said), 3)
        self.assertTrue(all(later - before >= 2 for (before, _), (later, _) in
                            zip([(0.0, "")] + said, said)), said)
        for _, line in said:
            self.assertRegex(line, r"^explore: step [1-8] of 8, [\d,]+ of [\d,]+ states taken a "
                             r"step further: [\d,]+ states so far \([\d,]+ a second\), "
                             r"[\d,]+ transitions$")


# Each check of the explorer, and a breakage of leases.py under which it fires: (the check,
# the edits, each what to replace and with what, the bound's command-line arguments, the first
# failing schedule as "actor action outcome" per step, and where it failed: the authority or a
# receiver).
BREAKAGES = [
    ("fence", [("epoch > stored[0]", "epoch >= stored[0]")],  # an equal epoch applied twice
     ["--program", "acquire", "write", "write", "--last-tick", "0", "--ttl", "2"],
     ["A acquire granted", "A write applied", "A write applied"], ["fenced"]),
    ("epochs increase", [('"UPDATE leases SET holder = NULL WHERE resource = ?"',
                          '"DELETE FROM leases WHERE resource = ?"')],  # a release forgets the epoch
     ["--program", "acquire", "release", "--last-tick", "0"],
     ["A acquire granted", "A release released", "B acquire granted"], ["authority"]),
    ("one live lease", [("raise LeaseHeld(held)", "pass")],  # a live lease granted again
     ["--program", "acquire", "--last-tick", "0"],
     ["A acquire granted", "B acquire granted"], ["authority"]),
    ("stored pair", [("return WriteResult(outcome, resource, epoch, value, *stored)",
                      "return WriteResult(outcome, resource, epoch, value, epoch, value)")],
     # says it holds it
     ["--program", "acquire", "write", "write", "--last-tick", "0", "--ttl", "2"],
     ["A acquire granted", "A write applied", "A write conflict"], ["fenced"]),
    ("model", [("return dataclasses.replace(lease, expires_at=expires_at)",
                "return dataclasses.replace(lease, expires_at=expires_at + 1)")],
     # renews one tick long
     ["--holders", "1", "--program", "acquire", "renew", "--last-tick", "0"],
     ["A acquire granted", "A renew renewed"], ["authority"]),
    ("model", [("lease.expires_at),\n            )\n        return lease\n",
                'lease.expires_at),\n            )\n        return dataclasses.replace(lease, holder="C")\n')],
     ["--holders", "1", "--program", "acquire", "--last-tick", "0"],  # a lease not as stored
     ["A acquire granted"], ["authority"]),
    ("stored pair", [("return WriteResult(outcome, resource, epoch, value, *stored)",
                      'return WriteResult(outcome, resource, epoch, value, *(stored if self.fenced else (0, "?")))')],
     ["--holders", "1", "--program", "acquire", "write", "--last-tick", "0"],  # unfenced alone
     ["A acquire granted", "A write applied"], ["unfenced"]),
    ("model", [("return Outcome.REPLAY if value == stored[1] else Outcome.CONFLICT",
                "return Outcome.CONFLICT")],  # a retry refused as a second write
     ["--program", "acquire", "write", "retry", "--last-tick", "1", "--ttl", "1"],
     ["A acquire granted", "A write applied", "A write conflict"], ["fenced"]),
]


# README's bounds that the breakages below need: the default (a release gives a lease back),
# and one in which three decisions reach a receiver (each holder writes twice).
DEFAULT: list[str] = []
THREE_DECISIONS = ["--program", "acquire", "write", "write", "--last-tick", "1", "--ttl", "1"]
# What a receiver decided on (its latest decision's stored pair) and where a library may keep
# it: the edits below each keep it somewhere other than the file's tables.
_LATEST = "            seq, stored = self._latest(connection, resource)\n"
_RESULT = "        return WriteResult(outcome, resource, epoch, value, *stored)\n"
_DECIDE = ("            outcome = _decide(stored, epoch, value) if self.fenced else "
           "Outcome.APPLIED\n")
_FENCED = "        self.fenced = fenced\n"
_GLOBAL = "_SQLITE_INT_MAX = 2**63 - 1\n"
# Each breakage with state outside the file's tables, as the outside review wrote them: (its
# name, the edits, the bound, the first check it fails, that check's first failing schedule,
# and where it failed).  Each is caught at one of README's bounds, and its witness is played
# again whole, from a new file, by explore.py itself before it is shown.
HIDDEN = [
    ("memory in an object: a list attribute changed in place", [
        (_FENCED, _FENCED + "        self.recent: list[Any] = []  # what this object stored\n"),
        (_LATEST, _LATEST + "            if self.recent:  # trusted, never checked\n"
                            "                stored = self.recent[-1]\n"),
        (_RESULT, "        self.recent.append(stored)\n" + _RESULT)],
     THREE_DECISIONS, "stored pair",
     ["A acquire granted", "A write applied", "B acquire granted", "B write applied",
      "A write conflict"], ["fenced"]),
    ("memory in a class: a counter of every receiver's writes", [
        ('    _KIND = "receiver"\n', '    _KIND = "receiver"\n    writes = 0\n'),
        (_DECIDE, ("            Receiver.writes += 1  # two decided, then trusted\n"
                  "            outcome = (_decide(stored, epoch, value)\n"
                  "                       if self.fenced and Receiver.writes <= 2\n"
                  "                       else Outcome.APPLIED)\n"))],
     THREE_DECISIONS, "fence",
     ["A acquire granted", "A write applied", "A write applied"], ["fenced"]),
    ("memory in a module: a dict of what was stored", [
        (_GLOBAL, _GLOBAL + "_STORED: dict[str, Any] = {}  # by resource\n"),
        (_LATEST, _LATEST + "            stored = _STORED.get(resource, stored)\n"),
        (_RESULT, "        _STORED[resource] = stored\n" + _RESULT)],
     THREE_DECISIONS, "stored pair",
     ["A acquire granted", "A write applied", "B acquire granted", "B write applied",
      "A write conflict"], ["fenced"]),
    ("a process's memory of its grants, applied without comparing", [
        (_GLOBAL, _GLOBAL + "_GRANTED: set[tuple[str, int]] = set()  # granted here\n"),
        ("        return lease\n\n    def renew",
         "        _GRANTED.add((resource, lease.epoch))\n        return lease\n\n    def renew"),
        (_DECIDE, _DECIDE + "            if (resource, epoch) in _GRANTED:  # surely current\n"
                            "                outcome = Outcome.APPLIED\n")],
     THREE_DECISIONS, "fence",
     ["A acquire granted", "A write applied", "A write applied"], ["fenced"]),
    ("the oldest decision row read as the latest", [
        ('" WHERE fenced = ? AND resource = ? ORDER BY seq DESC LIMIT 1"',
         '" WHERE fenced = ? AND resource = ? ORDER BY seq LIMIT 1"')],
     THREE_DECISIONS, "model",
     ["A acquire granted", "A write applied", "A write conflict", "B acquire granted",
      "B write raised"], ["fenced", "unfenced", "asking"]),
    ("a temporary-table mirror of what was stored", [
        (_LATEST, _LATEST + '            connection.execute("CREATE TEMP TABLE IF NOT EXISTS mirror'
                            ' (resource TEXT"\n'
                            '                               " PRIMARY KEY, epoch, value)")\n'
                            '            mirrored = connection.execute("SELECT epoch, value FROM'
                            ' mirror"\n'
                            '                                          " WHERE resource = ?",'
                            ' (resource,)).fetchone()\n'
                            "            stored = stored if mirrored is None else"
                            " tuple(mirrored)\n"),
        (_RESULT, '            connection.execute("INSERT OR REPLACE INTO mirror VALUES'
                  ' (?, ?, ?)",\n'
                  "                               (resource, *stored))\n" + _RESULT)],
     THREE_DECISIONS, "model", ["A acquire granted", "A write raised"],
     ["fenced", "unfenced", "asking"]),
    ("the clock: now and then a fast path", [
        (_DECIDE, _DECIDE + "            if time.monotonic_ns() % 2:\n"
                            "                outcome = Outcome.APPLIED\n")],
     THREE_DECISIONS, "model", ["A acquire granted", "A write applied", "A write raised"],
     ["fenced", "unfenced", "asking"]),
    ("a counter in the file's header, given back by a release", [
        (("            lease = Lease(resource, holder, 1 if row is None else row.epoch + 1,"
         " expires_at)\n"),
         ('            (counter,) = connection.execute("PRAGMA user_version").fetchone()\n'
         "            lease = Lease(resource, holder, counter + 1, expires_at)\n"
         '            connection.execute(f"PRAGMA user_version = {lease.epoch}")\n')),
        ("            self._current_or_lost(connection, lease, None)\n",
         ("            self._current_or_lost(connection, lease, None)\n"
         '            connection.execute(f"PRAGMA user_version = {lease.epoch - 1}")\n'))],
     DEFAULT, "epochs increase",
     ["A acquire granted", "A renew renewed", "A write applied", "A release released",
      "B acquire granted"], ["authority"]),
]
# README's bound with a second resource: A acquires the first, B the second.
TWO_RESOURCES = ["--resources", "2", "--last-tick", "2", "--ttl", "1"]
# Each breakage that mixes up resources: (its name, the edits, the first check it fails, that
# check's first failing schedule, and where it failed).
CROSS = [
    ("epochs counted across resources", [(
        ("            lease = Lease(resource, holder, 1 if row is None else row.epoch + 1,"
         " expires_at)\n"),
        ('            (top,) = connection.execute("SELECT coalesce(max(epoch), 0) FROM leases")'
         ".fetchone()\n"
         "            lease = Lease(resource, holder, top + 1, expires_at)\n"))],
     "model", ["A acquire granted", "B acquire granted"], ["authority"]),
    ("a receiver's latest decision of any resource", [
        ('" WHERE fenced = ? AND resource = ? ORDER BY seq DESC LIMIT 1"',
         '" WHERE fenced = ? AND ? != \'\' ORDER BY seq DESC LIMIT 1"')],
     "stored pair", ["A acquire granted", "A renew renewed", "A write applied",
                     "B acquire granted", "B renew renewed", "B write conflict"], ["fenced"]),
    ("a release clears every resource's holder", [
        ('"UPDATE leases SET holder = NULL WHERE resource = ?"',
         '"UPDATE leases SET holder = NULL WHERE ? != \'\'"')],
     "model", ["A acquire granted", "A renew renewed", "A write applied", "B acquire granted",
               "A release released", "B renew lost"], ["authority"]),
    ("a renewal sets every resource's expiry", [
        ('"UPDATE leases SET expires_at = ? WHERE resource = ?"',
         '"UPDATE leases SET expires_at = ? WHERE ? != \'\'"')],
     "model", ["A acquire granted", "A renew renewed", "B acquire granted", "B renew renewed",
               "A write applied"], ["asking"]),  # its expiry moved: not live there
]
# README's bound in which a holder acquires again.
ACQUIRE_AGAIN = ["--holders", "1", "--program", "acquire", "acquire", "--last-tick", "0"]
_GRANT = ("            lease = Lease(resource, holder, 1 if row is None else row.epoch + 1,"
          " expires_at)\n")
_HELD = "            held = None if row is None else row.live_lease(now)\n"
# Each breakage with hidden state that an outside verifier wrote against the walk, the clock
# and the cache, as HIDDEN's rows.
OUTSIDE = [
    ("state in a SQLite connection: a new one trusts nothing stored", [
        (_LATEST, _LATEST + "            if self._connection.total_changes == 0:\n"
                            "                stored = None\n")],
     THREE_DECISIONS, "model", ["A acquire granted", "A write applied", "A write raised"],
     ["fenced", "unfenced", "asking"]),
    ("a memo on an enum member, trusted for half a second", [
        ("    def _load(connection: \"_Bounded\", resource: str) -> _Row | None:\n",
         ("    def _load(connection: \"_Bounded\", resource: str) -> _Row | None:\n"
         '        memo = vars(Outcome.STALE).setdefault("_rows", {})\n'
         "        key, now = (id(connection._connection), resource), time.monotonic()\n"
         "        if key in memo and 0 < now - memo[key][0] < 0.5:\n"
         "            return memo[key][1]\n")),
        ("        return None if row is None else _Row(*row)\n",
         ("        memo[key] = (now, None if row is None else _Row(*row))\n"
         "        return memo[key][1]\n"))],
     ACQUIRE_AGAIN, "model", ["A acquire granted", "A acquire raised"], ["authority"]),
    ("a registry of the leases granted, by weak reference", [
        (_GLOBAL, _GLOBAL + "import weakref\n_REGISTER = {}.setdefault\n"),
        (_HELD, _HELD + "            ref = None if held is None else _REGISTER.__self__.get("
                        "(resource, held.epoch))\n"
                        "            if ref is not None and ref() is None:  # let go of\n"
                        "                held = None\n"),
        (_GRANT, _GRANT + "            _REGISTER((resource, lease.epoch), weakref.ref(lease))\n")],
     ACQUIRE_AGAIN, "model", ["A acquire granted", "A acquire granted"], ["authority"]),
    ("a file beside the database: epochs counted file-wide", [
        (_GRANT, _GRANT + '            side = f"{self.path}.last-grant"\n'
                          "            last = (open(side).read().split() if os.path.exists(side)"
                          " else [resource, \"0\"])\n"
                          "            if row is None and last[0] != resource:\n"
                          "                lease = dataclasses.replace(lease, epoch=int(last[1])"
                          " + 1)\n"
                          '            with open(side, "w") as file:\n'
                          '                file.write(f"{resource} {lease.epoch}")\n')],
     ACQUIRE_AGAIN, "model", ["A acquire raised"], ["authority"]),
    ("a generator of its own, seeded by the system: half the writes trust nothing stored", [
        (_GLOBAL, _GLOBAL + "import random\n_DRAWS = random.Random()\n"),
        (_LATEST, _LATEST + "            if _DRAWS.random() < 0.5:\n"
                            "                stored = None\n")],
     THREE_DECISIONS, "fence", ["A acquire granted", "A write applied", "A write applied"],
     ["fenced"]),
    ("the random module's own generator: half the writes trust nothing stored", [
        (_GLOBAL, _GLOBAL + "import random\n"),
        (_LATEST, _LATEST + "            if random.random() < 0.5:\n"
                            "                stored = None\n")],
     THREE_DECISIONS, "fence", ["A acquire granted", "A write applied", "A write applied"],
     ["fenced"]),
    ("memory in a bound method's dict", [
        (_GLOBAL, _GLOBAL + "_STORED = {}.setdefault  # by resource\n"),
        (_LATEST, _LATEST + "            stored = _STORED.__self__.get(resource, stored)\n"),
        (_RESULT, "        _STORED.__self__[resource] = stored\n" + _RESULT)],
     THREE_DECISIONS, "stored pair",
     ["A acquire granted", "A write applied", "B acquire granted", "B write applied",
      "A write conflict"], ["fenced"]),
]
# A correct cache: it keeps what it stored, and uses it only once the log says nothing came
# after it.
VALIDATED = [
    (_FENCED, _FENCED + "        self._cached: dict[str, Any] = {}  # resource: (seq, stored)\n"),
    (_LATEST, '            (newest,) = connection.execute("SELECT max(seq) FROM'
              ' receiver_decisions"\n'
              '                                           " WHERE fenced = ? AND resource = ?",\n'
              "                                           (self.fenced, resource)).fetchone()\n"
              "            cached = self._cached.get(resource)\n"
              "            if cached is not None and cached[0] == (newest or 0):  # checked\n"
              "                seq, stored = cached\n"
              "            else:\n    " + _LATEST),
    (_RESULT, "        self._cached[resource] = (seq + 1, stored)\n" + _RESULT),
]


def _folder(test: unittest.TestCase) -> str:
    folder = tempfile.mkdtemp(prefix="explore-test-")
    test.addCleanup(shutil.rmtree, folder, ignore_errors=True)
    return folder


def _broken(
    test: unittest.TestCase, edits: list[tuple[str, str]], *command: str
) -> "subprocess.CompletedProcess[str]":
    """`python3 *command`, run in a scratch copy whose leases.py has each edit's old text
    replaced with its new."""
    folder = _folder(test)
    for name in ("leases.py", "run_experiment.py", "explore.py"):
        shutil.copy(os.path.join(HERE, name), folder)
    path = os.path.join(folder, "leases.py")
    with open(path, encoding="utf-8") as file:
        source = file.read()
    for old, new in edits:
        test.assertEqual(source.count(old), 1, f"{old!r} must occur once in leases.py")
        source = source.replace(old, new)
    with open(path, "w", encoding="utf-8") as file:
        file.write(source)
    return subprocess.run([sys.executable, *command], cwd=folder, capture_output=True,
                          text=True, timeout=TIMEOUT, check=False)


def _explore_broken(
    test: unittest.TestCase, edits: list[tuple[str, str]], arguments: list[str]
) -> "subprocess.CompletedProcess[str]":
    """explore.py, run as a user runs it, on a scratch copy of the library with `edits`."""
    return _broken(test, edits, "explore.py", *arguments)


def _schedule(report: str, title: str) -> list[str]:
    """The steps of the timeline under `title` in a report, as "actor action outcome"."""
    lines = report.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    steps = []
    for line in lines[start + 1 :]:
        if not line.startswith("  tick"):
            break
        words = line.split()
        steps.append(" ".join([words[2], words[3], words[6] if words[4] == "epoch" else words[4]]))
    return steps


def _main(*argv: str) -> tuple[int, str, str]:
    """explore.main(argv) in this process: its exit code, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = explore.main(list(argv))
        except SystemExit as exit:  # argparse's way out, as for a user
            code = exit.code if isinstance(exit.code, int) else -1
    return code, out.getvalue(), err.getvalue()


class CheckTests(unittest.TestCase):
    """Every check of the explorer fires under a breakage of the library made for it."""

    def test_each_check_fires_under_its_breakage_with_exit_1_and_its_first_failing_schedule(
        self,
    ) -> None:
        self.assertEqual({check for check, *_ in BREAKAGES}, set(explore.CHECKS))
        for check, edits, arguments, steps, places in BREAKAGES:
            with self.subTest(check):
                self._fails(_explore_broken(self, edits, arguments), check, steps, places)

    def test_state_kept_outside_the_tables_fails_a_check_at_readmes_bounds_on_every_run(
        self,
    ) -> None:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:  # a process each, two cores
            runs = list(pool.map(lambda hidden: _explore_broken(self, *hidden[1:3]),
                                 HIDDEN + OUTSIDE))
        for (name, _, _, check, steps, places), run in zip(HIDDEN + OUTSIDE, runs):
            with self.subTest(name):
                self._fails(run, check, steps, places)

    def test_a_breakage_across_resources_fails_a_check_at_readmes_two_resource_bound(
        self,
    ) -> None:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            runs = list(pool.map(lambda cross: _explore_broken(self, cross[1], TWO_RESOURCES),
                                 CROSS))
        for (name, _, check, steps, places), run in zip(CROSS, runs):
            with self.subTest(name):
                self._fails(run, check, steps, places)

    def _fails(self, run: "subprocess.CompletedProcess[str]", check: str, steps: list[str],
               places: list[str]) -> None:
        """`run` exits 1, `check` first among the checks failed, with its first failing
        schedule `steps`, failing at `places` and nowhere else."""
        self.assertEqual(run.returncode, 1, run.stderr)
        failed = next(line for line in run.stdout.splitlines()
                      if line.startswith("  checks failed: "))
        self.assertEqual(failed.split(": ")[1].split(" (of")[0].split(", ")[0], check)
        self.assertEqual(_schedule(run.stdout, f"the first schedule failing {check!r}"), steps)
        self.assertEqual(re.findall(rf"^the first schedule failing {check!r} \((\w+)",
                                    run.stdout, re.MULTILINE), places,
                         "only where the check failed is named")


    def test_a_correct_validated_cache_passes_with_the_clean_tables_and_as_played_whole(
        self,
    ) -> None:
        output = os.path.join(_folder(self), "table.json")
        run = _explore_broken(self, VALIDATED, [*THREE_DECISIONS, "--output", output])
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        with open(output, encoding="utf-8") as file:
            table = json.load(file)
        clean = explore.explore(BOUNDS["three decisions"])
        for key in ("schedules", "classes", "violations", "witnesses"):
            self.assertEqual(table[key], clean[key], key)
        with self.subTest("counting by state, each holder's calls in it, as played whole"):
            run = _broken(self, VALIDATED, "-c", (
                "import explore\n"
                "bound = explore.Bound(2, (explore.Action.ACQUIRE, explore.Action.WRITE,"
                " explore.Action.WRITE), last_tick=1, ttl=2)\n"
                "by_state, whole = explore.explore(bound), explore.explore(bound,"
                " brute_force=True)\n"
                "print(all(by_state[key] == whole[key] for key in ('schedules', 'classes',"
                " 'violations', 'witnesses', 'failures')), by_state['states'])\n"))
            self.assertEqual(run.returncode, 0, run.stderr)
            same, states = run.stdout.split()
            self.assertEqual(same, "True")
            self.assertGreater(int(states), _tables()["two writes, no expiry"]["states"],
                               "what the receivers remember is in the state")
        counting = [(_GLOBAL, _GLOBAL + "_CHECKED: list[int] = []  # leases checked, by epoch\n"),
                    ("    _check_int(\"lease.epoch\", value.epoch, minimum=1)\n",
                     ("    _check_int(\"lease.epoch\", value.epoch, minimum=1)\n"
                     "    _CHECKED.append(value.epoch)\n"))]
        for name, edits in (("a cache", VALIDATED), ("a count in a global", counting)):
            with self.subTest(f"at each statement, {name}: a new process reads its lease anew"):
                run = _explore_broken(self, edits, ["--statements", "--holders", "1", "--program",
                                                    "acquire", "write", "release",
                                                    "--last-tick", "1", "--ttl", "1"])
                self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
                self.assertIn("release, not committed: released", run.stdout)

    def test_a_library_that_leaves_a_transaction_open_is_found_at_once_in_every_mode(
        self,
    ) -> None:
        def left_open(begin: str) -> list[tuple[str, str]]:
            start = "        with self._use(write=True) as connection:\n            row = self._load("
            return [
                ("BUSY_TIMEOUT_SECONDS = 30.0", "BUSY_TIMEOUT_SECONDS = 0.2"),  # not waited out
                ("        expires_at = _check_expiry(now, ttl)\n" + start,
                 "        expires_at = _check_expiry(now, ttl)\n"
                 "        assert self._connection is not None\n"
                 f"        self._connection.execute({begin!r})\n"
                 '        self._connection.execute("SELECT * FROM leases").fetchall()  # kept\n'
                 "        return Lease(resource, holder, 1, expires_at)\n" + start)]

        arguments = ["--program", "acquire", "write", "--last-tick", "1", "--ttl", "1"]
        for begin in ("BEGIN", "BEGIN IMMEDIATE"):  # a read kept open; the write lock kept
            with self.subTest(begin):
                output = os.path.join(_folder(self), "table.json")
                run = _explore_broken(self, left_open(begin), [*arguments, "--output", output])
                self.assertEqual(run.returncode, 1, run.stderr)
                with open(output, encoding="utf-8") as file:
                    table = json.load(file)
                self.assertEqual(table["failures"]["model"]["authority"][0]["outcome"],
                                 "raised RuntimeError: acquire left a transaction open")
        with self.subTest("played whole, the explorer's own connection finds the lock kept"):
            run = _broken(self, left_open("BEGIN IMMEDIATE"), "-c", (
                "import explore\n"
                "explore.explore(explore.Bound(2, (explore.Action.ACQUIRE, explore.Action.WRITE),"
                " last_tick=1, ttl=1), brute_force=True)\n"))
            self.assertNotEqual(run.returncode, 0)
            self.assertIn("sqlite3.OperationalError: database is locked", run.stderr)
        kept_after = [("                connection.checkpoint()  #",
                       ('                self._connection.execute("BEGIN")\n'
                       "                connection.checkpoint()  #"))]
        for mode in ([], ["--statements"]):  # by a holder's last call: nothing else shows it
            with self.subTest("a read left open after each call", mode=mode):
                run = _explore_broken(self, kept_after, [
                    *mode, "--holders", "1", "--program", "acquire", "--last-tick", "0"])
                self.assertEqual(run.returncode, 1, run.stderr)
                self.assertIn("raised RuntimeError: acquire left a transaction open", run.stdout)

    def test_the_asking_receiver_rolls_back_a_write_that_fails_and_stays_usable(self) -> None:
        path = os.path.join(_folder(self), "asking.sqlite3")
        leases.LeaseAuthority(path).close()  # its file, with the authority's table
        asking = explore.AskingReceiver(path)
        self.addCleanup(asking.close)
        with self.assertRaises(UnicodeEncodeError):
            asking.write("r", 1, "\ud800", now=0)  # fails as its decision is inserted
        self.assertEqual(asking.write("r", 1, "one", now=0), ("not live", None, None))


# The report of `explore.py --program acquire write --last-tick 1 --ttl 1`, its time cut out.
REPORT = [
    'every schedule of 2 holders, each: acquire write; ticks 0 to 1, ttl 1',
    '  30 schedules = multinomial(4; 2, 2) x C(4 + 1, 4) = 6 x 5',
    '  53 states, 64 transitions, 68 calls played on the real code, S s',
    '  a schedule is an order of steps and their ticks, refused steps included; it counts',
    '  in every class it shows at least once, so a column does not sum to the schedules',
    '  schedules with                kind              fenced    unfenced      asking',
    '  lost update                   harm                   0           2           0',
    '  stale refused                 protection             2           0           4',
    '  superseded applied            harm                   2           4           0',
    '  gap                           harm                   2           2           0',
    '  late applied                  neither               10          12           0',
    '  late, not superseded          neither                8           8           0',
    '  replay                        neither                0           0           0',
    '  conflict                      neither                0           0           0',
    '  late refused, not superseded  neither                0           0           8',
    '  clean                         neither               18          18          18',
    "  asking: not the model's receiver: explore.AskingReceiver, which asks the authority inside its own write transaction",
    '  checks failed: none (of: fence, epochs increase, one live lease, stored pair, model)',
    'the smallest unfenced lost update (unfenced receiver)',
    '  tick  0  A  acquire  epoch 1   granted   lease until tick 1',
    '  tick  1  B  acquire  epoch 2   granted   lease until tick 2',
    "  tick  1  B  write    epoch 2   applied   'B1' -> receiver holds epoch 2, 'B1'",
    "  tick  1  A  write    epoch 1   applied   'A1' -> receiver holds epoch 1, 'A1'",
    '  final value written by A; stale writes refused: 0, conflicting: 0',
    '  lost update: a lower epoch applied over a higher one (newer_write_overwritten_by_older_epoch)',
    '  superseded applied: applied below the newest grant (write_with_superseded_epoch_applied)',
    "  late applied: applied at or after its lease's expiry (write_after_lease_expiry_applied)",
    'the smallest fenced stale refused (fenced receiver)',
    '  tick  0  A  acquire  epoch 1   granted   lease until tick 1',
    '  tick  1  B  acquire  epoch 2   granted   lease until tick 2',
    "  tick  1  B  write    epoch 2   applied   'B1' -> receiver holds epoch 2, 'B1'",
    "  tick  1  A  write    epoch 1   stale     'A1' -> receiver holds epoch 2, 'B1'",
    '  final value written by B; stale writes refused: 1, conflicting: 0',
    'the smallest fenced gap (fenced receiver)',
    '  tick  0  A  acquire  epoch 1   granted   lease until tick 1',
    '  tick  1  B  acquire  epoch 2   granted   lease until tick 2',
    "  tick  1  A  write    epoch 1   applied   'A1' -> receiver holds epoch 1, 'A1'",
    '  final value written by A; stale writes refused: 0, conflicting: 0',
    '  superseded applied: applied below the newest grant (write_with_superseded_epoch_applied)',
    "  late applied: applied at or after its lease's expiry (write_after_lease_expiry_applied)",
]


# --- an independent brute force of the statement mode ---
#
# Every interleaving of the holders' SQL statements, and each with one crash before a
# statement, played whole from a copy of a file set up once, and counted as
# explore.explore(bound, statements=True) counts.  It shares with the search only what says
# what is played and how it is judged (Bound.step, perform, the library copy explore._library
# makes, explore._Call and explore._judged_statements); nothing of how the search stops a
# holder, schedules it, or enumerates: here each connection is a proxy (not a subclass), each
# process a new copy of the library (none reused), the handoffs one threading.Condition (not
# queues), and the enumeration replays a script of choice indices and turns it like an
# odometer, checking that each replay meets the same choices.


class _Gone(BaseException):
    """In a holder whose process is gone: none of its statements runs any more."""


_WRITERS = {"INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER"}


def _takes_lock(sql: str) -> bool:
    """Whether `sql` takes SQLite's write lock, if its connection does not hold it, or needs it
    for a moment: VACUUM, and a checkpoint that waits for writers."""
    words = [word for word in re.findall(r"\w+", sql.upper()) if word != "MAIN"][:3]
    return bool(words) and (words[0] in _WRITERS | {"VACUUM"} or words[:2] in (
        ["BEGIN", "IMMEDIATE"], ["BEGIN", "EXCLUSIVE"]) or words in (
        ["PRAGMA", "WAL_CHECKPOINT", mode] for mode in ("FULL", "RESTART", "TRUNCATE")))


class _ProxyConnection:
    """A connection of a brute-force holder's library: busy timeout 0, every statement through
    the holder's gate, and one that runs past it noted by SQLite's trace callback."""

    def __init__(self, holder: "_BruteHolder", *args: Any, **kwargs: Any) -> None:
        self.holder, self.changes = holder, 0
        self.real: sqlite3.Connection = sqlite3.connect(*args, **{**kwargs, "timeout": 0})
        self.real.set_trace_callback(holder.traced)
        holder.connections.append(self.real)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        holder, real = self.holder, self.real
        holder.gate(sql)
        began, holder.refused, holder.let = real.in_transaction, None, True
        if not began:
            self.changes = real.total_changes
        try:
            cursor = real.execute(sql, parameters)
        except sqlite3.OperationalError as exc:
            code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
            if ("database is locked" in str(exc)) if code is None else code & 0xFF == 5:
                holder.refused = sql  # SQLITE_BUSY: the lock refused it
            raise
        finally:
            holder.let = False
        now = real.in_transaction
        holder.writing = now and (holder.writing or _takes_lock(sql))
        holder.committed |= (began and not now and sql.strip().upper() in ("COMMIT", "END")
                             and real.total_changes != self.changes)  # a change committed
        return cursor


class _BruteHolder:
    """One holder in one brute-force run: a thread playing its steps through a library copy of
    its own, stopped before each statement of a step until told "run", "die" or "quit"."""

    def __init__(self, run: "_BruteRun", h: int) -> None:
        self.run, self.h, self.actor = run, h, "ABCDEFGH"[h]
        self.state = "opening"
        self.order: Any = None
        self.result: tuple[Any, Any] | None = None
        self.failure: BaseException | None = None
        self.let = self.writing = self.committed = self.gated = False
        self.refused: str | None = None  # its last statement, if SQLite's lock refused it
        self.sql = ""  # the statement it stopped before
        self.dead = ""  # why it runs no statement any more
        self.connections: list[sqlite3.Connection] = []
        self.thread = threading.Thread(target=self.main, daemon=True)
        self.thread.start()

    def traced(self, sql: str) -> None:
        if not self.let:
            self.run.strays.append(sql)

    def settle(self, state: str) -> Any:
        """Tell the scheduler this holder is `state`, and wait for its next order."""
        with self.run.cond:
            self.state = state
            self.run.cond.notify_all()
            if not self.run.cond.wait_for(lambda: self.order is not None, TIMEOUT):
                self.dead, self.failure = "hung", RuntimeError(f"{self.actor}: no order")
                raise _Gone
            order, self.order = self.order, None
            return order

    def gate(self, sql: str) -> None:
        self.sql = sql
        if not self.dead and self.gated and (order := self.settle("paused")) != "run":
            self.dead = order
        if self.dead:
            raise _Gone

    def open(self) -> None:
        """A new process: a new copy of the library, which opens the file ungated."""
        sqlite = types.SimpleNamespace(**vars(sqlite3))
        sqlite.connect = lambda *args, **kwargs: _ProxyConnection(self, *args, **kwargs)
        self.library = explore._library(explore._Clock(), sqlite)
        self.connections, self.dead, self.writing = [], "", False
        path = self.run.path
        self.objects = [self.library.LeaseAuthority(path), self.library.Receiver(path)]

    def close(self) -> None:
        """SQLite rolls back what was not committed, as for a process that died."""
        for connection in self.connections:
            connection.close()

    def main(self) -> None:
        resource = explore.RESOURCES[self.run.bound.resource(self.h)]
        try:
            self.open()
            while (order := self.settle("idle")) != "quit":
                step, held = order
                self.gated, self.committed = True, False
                try:  # a lease is data: a new process reads it into its own Lease class
                    lease = held and self.library.Lease(**dataclasses.asdict(held))
                    authority, receiver = self.objects
                    kept, event = run_experiment.perform(step, lease, authority, receiver,
                                                         resource)
                except _Gone:
                    if self.dead != "die":
                        return
                    self.gated = False
                    self.close()
                    self.open()
                    kept, event = held, None
                except Exception as exc:  # noqa: BLE001 - a broken library: an answer
                    kept, event = held, explore._raised(step, exc)
                self.gated, self.result = False, (kept, event)
        except BaseException as exc:  # noqa: BLE001 - the scheduler raises it
            self.failure = self.failure or exc
        finally:
            self.close()
            with self.run.cond:
                self.state = "gone"
                self.run.cond.notify_all()


class _BruteRun:
    """One interleaving: the holders, opened one at a time, and what the scheduler knows."""

    def __init__(self, bound: explore.Bound, path: str) -> None:
        self.bound, self.path, self.cond = bound, path, threading.Condition()
        self.strays: list[str] = []
        self.tick = self.taken = 0
        self.died = False
        self.refused: int | None = None  # the holder the lock refused
        self.calls: list[explore._Call] = []
        n = bound.holders
        self.blocked, self.position = [False] * n, [0] * n
        self.took, self.refusing = [False] * n, [False] * n
        self.held: list[Any] = [None] * n
        self.begun: list[Any] = [None] * n
        self.holders: list[_BruteHolder] = []
        for h in range(n):
            self.holders.append(_BruteHolder(self, h))
            self.wait(self.holders[h], "opening")

    def wait(self, holder: _BruteHolder, doing: str) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: holder.state in ("paused", "idle", "gone"),
                                      TIMEOUT):
                raise RuntimeError(f"holder {holder.actor} hung {doing}")
        if holder.state == "gone":
            raise RuntimeError(f"holder {holder.actor} failed {doing}") from holder.failure

    def choices(self) -> list[tuple[Any, ...]]:
        crash = [] if self.died or self.refused is not None else ["die"]
        paused = [h for h, holder in enumerate(self.holders) if holder.state == "paused"]
        if self.refused in paused and not self.blocked[self.refused]:  # it goes on first
            return [("run", self.refused)]
        for h in paused:  # what it does until COMMIT, no other holder sees
            if self.holders[h].writing and not self.blocked[h]:
                tries = [("try", other) for other in paused if self.took[h] and crash
                         and not self.blocked[other] and _takes_lock(self.holders[other].sql)]
                return [("run", h), *tries, *[(kind, h) for kind in crash]]
        found: list[tuple[Any, ...]] = []
        for h, holder in enumerate(self.holders):  # holder by holder, as the search lists them
            if h in paused:
                found += [(kind, h) for kind in ["run"] * (not self.blocked[h]) + crash]
            elif holder.state == "idle" and self.position[h] < len(self.bound.program):
                found += [("start", h, t) for t in range(self.tick, self.bound.last_tick + 1)]
        return found

    def take(self, choice: tuple[Any, ...]) -> None:
        kind, h, *tick = choice
        holder, order, self.taken = self.holders[h], kind, self.taken + 1
        if kind == "start":
            self.tick = tick[0]
            step = self.bound.step(h, self.position[h], self.tick)
            self.begun[h], order = (step, self.taken), (step, self.held[h])
            self.refusing[h] = False
        elif kind == "try":  # to take the lock another holds: SQLite refuses it
            self.refused, self.refusing[h], order = h, True, "run"
        elif kind == "die":
            self.died = True
        was = holder.writing
        with self.cond:
            holder.order, holder.state = order, "moving"
            self.cond.notify_all()
        self.wait(holder, f"at choice {self.taken}, {choice}")
        if holder.state == "paused":
            self.took[h] = holder.writing and not was  # it has just taken the lock
        refused = holder.state == "paused" and holder.sql == holder.refused  # to try it again
        if kind == "run" and not refused:  # a holder moved: each one refused may try again
            self.blocked = [False] * self.bound.holders
        self.blocked[h] = refused
        if holder.result is not None:
            (kept, event), holder.result = holder.result, None
            self.ended(h, event, kept)

    def ended(self, h: int, event: Any, kept: Any) -> None:
        step, start = self.begun[h]
        self.calls.append(explore._Call(h, step, self.held[h], event, kept,
                                        self.holders[h].committed, start, self.taken,
                                        self.refusing[h]))
        if event is not None:  # a holder that died takes the same step again
            self.position[h], self.held[h] = self.position[h] + 1, kept

    def close(self) -> None:
        with self.cond:
            for holder in self.holders:
                if holder.state in ("paused", "idle"):
                    holder.order, holder.state = "quit", "moving"
            self.cond.notify_all()
        for holder in self.holders:
            holder.thread.join(TIMEOUT)
            if holder.thread.is_alive():
                raise RuntimeError(f"holder {holder.actor} did not end after choice {self.taken}")


def _brute_play(bound: explore.Bound, path: str, script: list[tuple[int, int]]
                ) -> tuple[list[int], list[int], _BruteRun, list[int]]:
    """Take the choices `script` names (each an index, and how many there were), then the first
    at each point to the end: the index taken and the number of choices at each point, the run
    and the holders left waiting for a lock."""
    run, taken, widths = _BruteRun(bound, path), list[int](), list[int]()
    try:
        while choices := run.choices():
            width, k = 1 if run.died or run.refused is not None else len(choices), len(taken)
            i, known = script[k] if k < len(script) else (0, width)
            if known != width:
                raise RuntimeError(f"the replay of {script} differs at choice {k + 1}")
            taken.append(i)
            widths.append(width)
            run.take(choices[i])
        stuck = [h for h, holder in enumerate(run.holders) if holder.state == "paused"]
        for h in stuck:  # each dies there, its call heard with no answer
            run.ended(h, None, run.held[h])
    finally:
        run.close()
    if run.strays:
        raise RuntimeError(f"statements ran past the gate: {run.strays}")
    return taken, widths, run, stuck


def _statements_brute_force(bound: explore.Bound, folder: str) -> dict[str, Any]:
    """The statement mode's counts for `bound`, every interleaving played whole."""
    template, path = (os.path.join(folder, name) for name in ("template.sqlite3", "run.sqlite3"))
    for store in explore._opened(template):
        store.close()
    counts, saw, refused, violations = (Counter[str]() for _ in range(4))
    script: list[tuple[int, int]] | None = []
    while script is not None:
        shutil.copyfile(template, path)
        taken, widths, run, stuck = _brute_play(bound, path, script)
        for name in set(os.listdir(folder)) - {"template.sqlite3"}:
            os.remove(os.path.join(folder, name))
        counts["points"] += len(taken) - len(script) + 1  # the points this script found first
        counts["crash_schedules" if run.died else "interleavings" if run.refused is None else
               "refusal_schedules"] += 1
        violations.update(explore._judged_statements(bound, run.calls, stuck, saw,
                                                     refused).keys())
        turn = max((k for k, (i, width) in enumerate(zip(taken, widths)) if i + 1 < width),
                   default=None)  # the last point with a choice left
        script = None if turn is None else [*zip(taken[:turn], widths[:turn]),
                                             (taken[turn] + 1, widths[turn])]
    return {"interleavings": counts["interleavings"], "crash_schedules": counts["crash_schedules"],
            "refusal_schedules": counts["refusal_schedules"], "points": counts["points"],
            "after_a_crash": dict(sorted(saw.items())),
            "after_a_refusal": dict(sorted(refused.items())),
            "violations": {check: violations[check] for check in explore.STATEMENT_CHECKS}}


# The statement mode's breakages: (the name, the edits, the checks the first failing
# interleaving fails, how its witness begins, and the interleavings and crash schedules played
# up to it, itself included).
_IMMEDIATE = 'connection.execute("BEGIN IMMEDIATE")'
_READ_IN = ("        with self._use(write=True) as connection:\n"
            "            row = self._load(connection, resource)\n"
            "            held = None if row is None else row.live_lease(now)\n")
NEVER_COMMITTED = [('                    connection.execute("COMMIT")  #',
                    "                    pass  #")]
RACES = [
    ("a deferred `BEGIN`", [(_IMMEDIATE, 'connection.execute("BEGIN")')], ["linearizable"],
     ["B acquire at tick 0:", "  B BEGIN", "  B SELECT"], (9, 0)),
    ("a read before the transaction", [(_READ_IN, (
        "        with self._use(write=False) as connection:\n"
        "            row = self._load(connection, resource)\n"
        "        with self._use(write=True) as connection:\n"
        "            held = None if row is None else row.live_lease(now)\n"))], ["linearizable"],
     ["B acquire at tick 0:", "  B SELECT"], (7, 0)),
    ("a read before the transaction, through a cursor", [
        ("                return self._connection.execute(sql, parameters)",
         "                return self._connection.cursor().execute(sql, parameters)"),
        (_READ_IN, (
            "        with self._use(write=False) as connection:\n"
            "            row = self._load(connection, resource)\n"
            "        with self._use(write=True) as connection:\n"
            "            held = None if row is None else row.live_lease(now)\n"))], ["linearizable"],
     ["B acquire at tick 0:", "  B SELECT"], (7, 0)),
    ("a stored pair written wrong, though answered right", [
        ("(self.fenced, resource, seq + 1, outcome.value, epoch, value, *stored),",
         '(self.fenced, resource, seq + 1, outcome.value, epoch, value, stored[0], "x"),')],
     ["linearizable"], ["A acquire at tick 0:"], (1, 0)),
    ("a replay answered as a conflict", [
        ("return Outcome.REPLAY if value == stored[1] else Outcome.CONFLICT",
         "return Outcome.CONFLICT")], ["linearizable"],
     ["A acquire at tick 0:", "B acquire at tick 0:"], (130, 1)),
    ("a lock's refusal of BEGIN not tried again", [(
        "again = sql == \"COMMIT\" or not self._connection.in_transaction",
        "again = sql == \"COMMIT\"")], ["linearizable"],
     ["A acquire at tick 0:", "  A BEGIN IMMEDIATE"], (130, 23)),
    ("a checkpoint that must copy everything, waiting for writers", [(
        """        with contextlib.suppress(sqlite3.OperationalError):
            self._connection.execute("PRAGMA wal_checkpoint(PASSIVE)")""",
        """        busy, _, _ = self._connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            raise sqlite3.OperationalError("database is locked: checkpoint incomplete")""")],
     ["linearizable"], ["A acquire at tick 0:"], (130, 11)),
    ("a refused BEGIN IMMEDIATE falling back to a deferred BEGIN", [(
        '                    connection.execute("BEGIN IMMEDIATE")\n',
        """                    try:
                        self._connection.execute("BEGIN IMMEDIATE")
                    except sqlite3.OperationalError as exc:
                        if not _busy(exc):
                            raise
                        connection.execute("BEGIN")
""")], ["linearizable"], ["A acquire at tick 0:"], (130, 23)),
    ("a transaction never committed", NEVER_COMMITTED, ["linearizable"],
     ["A acquire at tick 0:", "  A BEGIN IMMEDIATE", "  A SELECT", "  A INSERT", "  A PRAGMA",
      "  A raised RuntimeError: acquire left a transaction open"], (0, 1)),
]


class StatementTests(unittest.TestCase):
    """Every interleaving at each SQL statement, and a crash before each, on the real code."""

    def test_two_acquisitions_interleave_14_ways_and_crash_80_ways_and_every_check_holds(
        self,
    ) -> None:
        table = explore.explore(explore.Bound(2, (ACQUIRE,), last_tick=0, ttl=1), statements=True)
        self.assertEqual((table["interleavings"], table["crash_schedules"], table["points"]),
                         (14, 80, 701))
        self.assertEqual((table["refusal_schedules"], table["after_a_refusal"]),
                         (4, {"acquire: held": 4}), "B tried as A had just taken the lock")
        self.assertEqual(table["after_a_crash"], {
            "acquire, committed: held": 14,
            "acquire, not committed: granted": 12,
            "acquire, not committed: held": 54})
        self.assertEqual(table["violations"], {"linearizable": 0})

    def test_a_crash_in_a_write_then_its_retry_is_a_replay_if_it_committed_else_applied(
        self,
    ) -> None:
        bound = explore.Bound(1, (ACQUIRE, WRITE, RELEASE), last_tick=1, ttl=1)
        table = explore.explore(bound, statements=True)
        self.assertEqual((table["interleavings"], table["crash_schedules"]), (4, 45))
        seen = {what: count for what, count in table["after_a_crash"].items()
                if what.startswith("write")}
        self.assertEqual(seen, {"write, committed: replay": 3,
                                "write, not committed: applied": 12})
        self.assertEqual(table["violations"], {"linearizable": 0})

    def test_a_retry_in_the_program_is_a_replay_and_after_a_crash_in_it_still_one(self) -> None:
        table = explore.explore(explore.Bound(1, (ACQUIRE, WRITE, RETRY), last_tick=0, ttl=1),
                                statements=True)
        self.assertEqual(table["violations"], {"linearizable": 0})
        self.assertEqual({what: count for what, count in table["after_a_crash"].items()
                          if what.startswith("write")},
                         {"write, committed: replay": 2, "write, not committed: applied": 4,
                          "write, not committed: replay": 4})

    def test_each_race_and_wrong_retry_fails_at_readmes_bound_alike_on_every_run(self) -> None:
        for name, edits, checks, witness, played in RACES:
            with self.subTest(name):
                first, again = (_explore_broken(self, edits, ["--statements"]) for _ in range(2))
                self.assertEqual(first.returncode, 1, first.stderr)
                self.assertEqual(re.findall(r"([\d,]+) interleavings, and ([\d,]+) with a crash",
                                            first.stdout), [tuple(map(str, played))])
                failed = next(line for line in first.stdout.splitlines()
                              if line.startswith("  checks failed: "))
                self.assertEqual(failed.split(": ")[1].split(" (of")[0].split(", "), checks)
                shown = first.stdout.split(f"the first interleaving failing {checks[0]!r}:\n")[1]
                self.assertEqual([line[: len(want)] for line, want in
                                  zip(shown.splitlines(), witness)], witness)
                self.assertEqual(re.sub(r"[\d.]+ s\b", "", first.stdout),
                                 re.sub(r"[\d.]+ s\b", "", again.stdout), "the same every run")

    def test_a_brute_force_of_its_own_playing_each_interleaving_whole_gives_the_same_counts(
        self,
    ) -> None:
        for bound, counts in (
                (explore.Bound(2, (ACQUIRE,), last_tick=0, ttl=1), (14, 80, 4, 701)),
                (explore.Bound(1, (ACQUIRE, WRITE, RELEASE), last_tick=1, ttl=1), (4, 45, 0, 548)),
                (explore.STATEMENTS_BOUND, (130, 644, 24, 6583))):
            with self.subTest(bound=bound):
                whole = _statements_brute_force(bound, _folder(self))
                searched = explore.explore(bound, statements=True)
                self.assertEqual((whole["interleavings"], whole["crash_schedules"],
                                  whole["refusal_schedules"], whole["points"]), counts)
                self.assertEqual(whole, {key: searched[key] for key in whole})

    def test_a_holder_the_lock_refused_tries_again_once_another_moved_and_a_lock_kept_fails(
        self,
    ) -> None:
        run = _explore_broken(self, NEVER_COMMITTED, ["--statements"])
        self.assertEqual(run.returncode, 1, run.stderr)
        shown = run.stdout.split("the first interleaving failing 'linearizable':\n")[1]
        self.assertEqual(shown.splitlines()[-3:], [
            "  A raised RuntimeError: write left a transaction open",
            "  B BEGIN IMMEDIATE", "  B waits for a lock nobody will give back"])
        self.assertEqual(shown.splitlines().count("  B BEGIN IMMEDIATE"), 2,
                         "tried again once A moved, not while A too was only refused")

    def test_a_transaction_that_changed_nothing_committed_before_a_crash_asks_no_effect(
        self,
    ) -> None:
        empty_first = [(("        with self._use(write=True) as connection:\n"
                        "            row = self._load(connection, resource)\n"),
                        ("        with self._use(write=True):  # changes nothing\n"
                        "            pass\n"
                        "        with self._use(write=True) as connection:\n"
                        "            row = self._load(connection, resource)\n"))]
        run = _explore_broken(self, empty_first, ["--statements", "--holders", "1"])
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIn("acquire, not committed: granted", run.stdout, "A died after it")

    def test_a_committed_call_whose_holder_died_is_in_every_one_at_a_time_order(self) -> None:
        bound = explore.Bound(2, (ACQUIRE,), last_tick=0, ttl=1)
        a, b = (bound.step(h, 0, 0) for h in range(2))
        granted = run_experiment.Event("B", ACQUIRE, 0, "granted", 1, 1)
        died = explore._Call(0, a, None, None, None, True, 1, 2)
        after = explore._Call(1, b, None, granted, leases.Lease(run_experiment.RESOURCE, "B", 1, 1),
                              False, 3, 4)
        self.assertIsNone(explore._linearized(bound, [died, after]), "A's grant committed")
        self.assertIsNotNone(explore._linearized(bound, [died._replace(committed=False), after]),
                             "A's grant may never have happened")

    def test_the_order_found_must_leave_what_the_file_holds_not_only_give_the_answers(
        self,
    ) -> None:
        bound = explore.Bound(2, (WRITE,), last_tick=0, ttl=1)
        writes = []
        for h, epoch, start, end in ((0, 1, 1, 4), (1, 2, 2, 3)):  # overlapping
            step = bound.step(h, 0, 0)
            lease = leases.Lease(run_experiment.RESOURCE, step.actor, epoch, epoch)
            answer = run_experiment.Event(step.actor, WRITE, 0, "applied", epoch, None,
                                          step.value, epoch, step.value)
            writes.append(explore._Call(h, step, lease, answer, lease, True, start, end))
        self.assertIsNotNone(explore._linearized(bound, writes, (((2, "B1"), None),)),
                             "A's write, then B's")
        self.assertIsNone(explore._linearized(bound, writes, (((1, "A1"), None),)),
                          "no order of two applied writes leaves the lower epoch stored")

    def test_a_holder_that_died_runs_nothing_more_not_even_its_librarys_error_handler(
        self,
    ) -> None:
        committing = [('connection.execute("ROLLBACK")', 'connection.execute("COMMIT")')]
        run = _broken(self, committing, "-c", (
            "import explore, json\n"
            "bound = explore.Bound(2, (explore.Action.ACQUIRE,), last_tick=0, ttl=1)\n"
            "print(json.dumps(explore.explore(bound, statements=True)['after_a_crash']))\n"))
        self.assertEqual(run.returncode, 0, run.stderr)
        clean = explore.explore(explore.Bound(2, (ACQUIRE,), last_tick=0, ttl=1), statements=True)
        self.assertEqual(json.loads(run.stdout), clean["after_a_crash"])

    def test_a_release_renewal_or_check_split_in_two_fails_where_it_meets_a_takeover(
        self,
    ) -> None:
        checked = ('                raise LeaseLost(lease, None, f"it expired at tick '
                   '{row.expires_at}")\n')
        two_reads = ("""            row = self._load(connection, resource)
        return None if row is None else row.live_lease(now)""", """            found = connection.execute(
                "SELECT resource, holder, epoch FROM leases WHERE resource = ?", (resource,)
            ).fetchone()
            if found is None:
                return None
            (expires_at,) = connection.execute(
                "SELECT expires_at FROM leases WHERE resource = ?", (resource,)).fetchone()
        return _Row(*found, expires_at).live_lease(now)""")
        for action, split in (
                ("release", [("            self._current_or_lost(connection, lease, None)\n",
                              ("            self._current_or_lost(connection, lease, None)\n"
                              "        with self._use(write=True) as connection:\n"))]),
                ("renew", [(checked, checked + "        with self._use(write=True) as"
                                               " connection:\n")]),
                ("check", [two_reads])):  # a torn read
            with self.subTest(action):
                run = _explore_broken(self, split, ["--statements", "--program", "acquire",
                                                    action, "--last-tick", "1"])
                self.assertEqual(run.returncode, 1, run.stderr)
                self.assertIn("  checks failed: linearizable", run.stdout)

    def test_a_statement_run_where_the_explorer_cannot_stop_it_fails_the_run_naming_it(
        self,
    ) -> None:
        unstoppable = [("                return self._connection.execute(sql, parameters)",
                        "                return sqlite3.Cursor(self._connection).execute(sql, parameters)")]
        run = _explore_broken(self, unstoppable, ["--statements"])
        self.assertEqual(run.returncode, 70, run.stdout)
        self.assertIn("library ran 'BEGIN IMMEDIATE' where the explorer could not stop it",
                      run.stderr)

    def test_a_library_copy_is_taken_again_only_as_it_was_made(self) -> None:
        libraries = explore._Libraries()
        gated = explore._Gated(mock.Mock(connections=[]))
        library = libraries.take(gated)
        libraries.give_back(library)
        self.assertIs(libraries.take(gated), library, "given back as it was made")
        library.Receiver.remembered = {"quarterly-report": (2, "B1")}
        libraries.give_back(library)
        self.assertIsNot(libraries.take(gated), library, "one that remembers is not")


class CommandLineTests(unittest.TestCase):
    """explore.py's exit codes: 0, 1 (above), 2 and 128 + n, and what --output holds."""

    def test_a_clean_run_exits_0_with_its_report_and_writes_its_table_to_output(self) -> None:
        output = os.path.join(_folder(self), "table.json")
        code, out, _ = _main("--program", "acquire", "write", "--last-tick", "1", "--ttl", "1",
                             "--output", output)
        self.assertEqual(code, 0)
        self.assertEqual(re.sub(r", \d+\.\d s$", ", S s", out, flags=re.MULTILINE).splitlines(),
                         REPORT)
        with open(output, encoding="utf-8") as file:
            table = json.load(file)
        self.assertEqual((table["schedules"], table["states"], table["transitions"],
                          table["calls_played"]), (30, 53, 64, 68))
        with self.subTest("a bound in which no lease can expire says so"):
            out = _main("--program", "acquire", "write", "--last-tick", "1", "--ttl", "2")[1]
            self.assertIn("\n  no lease can expire by tick 1 (ttl 2), so no write can be late: "
                          "no gap or lost update can happen in this bound, whatever the code\n",
                          out)
        with self.subTest("each limit --help gives is accepted, and one past it refused"):
            for argv, code in [(["--holders", "1", "--program", "acquire", "--last-tick", "99",
                                 "--ttl", "99"], 0),
                               (["--last-tick", "100"], 2), (["--ttl", "100"], 2),
                               (["--ttl", "0"], 2), (["--holders", "9"], 2)]:
                self.assertEqual(_main(*argv)[0], code, argv)

    def test_bad_arguments_and_an_output_that_cannot_be_written_exit_2_before_exploring(
        self,
    ) -> None:
        missing = os.path.join(_folder(self), "missing", "table.json")
        for argv in (["--holders", "0"], ["--program"], ["--program", "acquire", "retry"],
                     ["--output", missing],
                     ["--output", _folder(self)]):
            with self.subTest(argv=argv), mock.patch.object(explore, "explore") as explored:
                code, out, err = _main(*argv)
                self.assertEqual((code, out), (2, ""))
                self.assertEqual(len(err.splitlines()), 1, err)
                explored.assert_not_called()

    def test_a_stop_ends_the_run_with_128_plus_its_number_and_writes_nothing(self) -> None:
        output = os.path.join(_folder(self), "table.json")
        arguments = ("--program", "acquire", "write", "--last-tick", "1", "--ttl", "1",
                     "--output", output)
        real_explore, real_played = explore.explore, explore._played
        played = []

        def stopped_at_first_call(*args: Any) -> Any:
            played.append(args)
            if len(played) == 1:
                os.kill(os.getpid(), signal.SIGTERM)  # noted by the command, not fatal
            return real_played(*args)

        def stopped_at_the_end(*args: Any, **kwargs: Any) -> Any:
            table = real_explore(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGTERM)  # SIGHUP would be ignored under nohup
            return table

        with self.subTest("a stop during the search ends it at the next transition"), \
                mock.patch.object(explore, "_played", stopped_at_first_call):
            code, out, err = _main(*arguments)
            self.assertEqual((code, out, len(played)), (128 + signal.SIGTERM, "", 1))
            self.assertIn("stopped by SIGTERM", err)
        with self.subTest("a stop noted as the search ends: nothing written, no success"), \
                mock.patch.object(explore, "explore", stopped_at_the_end):
            code, out, err = _main(*arguments)
            self.assertEqual((code, out), (128 + signal.SIGTERM, ""))
        self.assertFalse(os.path.exists(output))
        real_take, noted = explore._Run.take, list[float]()

        def stopped_at_a_choice(run: Any, choice: Any) -> None:
            if len(noted) == 20:  # in the middle of an interleaving
                noted.append(time.monotonic())
                os.kill(os.getpid(), signal.SIGTERM)
            noted.append(0.0)
            real_take(run, choice)

        with self.subTest("a stop in the statement mode ends it within 0.2 s, its holders too"), \
                mock.patch.object(explore._Run, "take", stopped_at_a_choice):
            threads = threading.active_count()
            code, out, err = _main("--statements", "--output", output)
            self.assertLess(time.monotonic() - noted[20], 0.2)
            self.assertEqual((code, out), (128 + signal.SIGTERM, ""))
            self.assertEqual(threading.active_count(), threads, "every holder's thread ended")
        self.assertFalse(os.path.exists(output))


if __name__ == "__main__":
    unittest.main()
