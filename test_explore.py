"""The explorer's own tests: explore.py counts every schedule of a bound exactly, and each of
its checks fires under a breakage of the library made for it.

Run alone with `python3 test_explore.py`; `python3 -m unittest discover` runs it together with
test_leases.py.  Nothing here sleeps; a stop is simulated by noting it.
"""

import functools
import signal
import unittest
from typing import Any
from unittest import mock

import explore
import run_experiment
from run_experiment import Action

ACQUIRE, CHECK, WRITE = Action.ACQUIRE, Action.CHECK, Action.WRITE
RENEW, RELEASE = Action.RENEW, Action.RELEASE
BOUNDS = {
    "takeover": explore.Bound(2, (ACQUIRE, WRITE), last_tick=1, ttl=1),
    "two writes, no expiry": explore.Bound(2, (ACQUIRE, WRITE, WRITE), last_tick=1, ttl=2),
    "renew, release": explore.Bound(2, (ACQUIRE, RENEW, WRITE, RELEASE), last_tick=1, ttl=1),
    "check, then write": explore.Bound(2, (ACQUIRE, CHECK, WRITE), last_tick=1, ttl=1),
    "one holder": explore.Bound(1, (ACQUIRE, WRITE, WRITE, CHECK, ACQUIRE, WRITE, RENEW, WRITE,
                                    RELEASE), last_tick=2, ttl=2),
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
        for bound in (BOUNDS["takeover"],
                      explore.Bound(1, BOUNDS["one holder"].program, last_tick=1, ttl=1)):
            table, whole = (explore.explore(bound, brute_force=brute) for brute in (False, True))
            for key in ("schedules", "classes", "violations", "witnesses", "failures"):
                self.assertEqual(table[key], whole[key], (bound, key))

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
            {receiver: [counts[name] for name in (*explore.CLASSES, "clean")]
             for receiver, counts in table["classes"].items()},
            {"fenced": [0, 2, 2, 8, 0, 0, 0, 18], "unfenced": [2, 0, 2, 8, 0, 0, 0, 18],
             "asking": [0, 4, 0, 0, 0, 0, 8, 18]},
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

    def test_two_writes_at_one_epoch_the_second_is_a_conflict_in_every_schedule(self) -> None:
        self.assertEqual(_classes("two writes, no expiry")["fenced"]["conflict"], 140)

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
        self.assertEqual([table["leases_can_expire"] for table in _tables().values()],
                         [True, False, True, True, True])
        self.assertEqual(_classes("two writes, no expiry")["unfenced"]["clean"], 140)

    def test_a_noted_stop_ends_an_exploration_at_its_next_transition(self) -> None:
        with mock.patch.object(run_experiment, "_STOPPED", [signal.SIGINT]), \
                self.assertRaises(KeyboardInterrupt):
            explore.explore(BOUNDS["takeover"])


if __name__ == "__main__":
    unittest.main()
