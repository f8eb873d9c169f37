"""Play every schedule of a small bound on the real code, and count what happened.

A bound is H holders that all run one program of steps (acquire, renew, check, write,
release), one ttl, and the ticks 0..T.  A schedule interleaves the holders' programs, each step
at a tick no earlier than the one before.  Every step is played through the scenario workers'
own code (run_experiment._perform) on the real authority and on a fenced and an unfenced
receiver, and checked; schedules are counted exactly, by state.

    python3 explore.py [--holders N] [--program ACTION ...] [--last-tick T] [--ttl N]
                       [--output PATH]
"""

import contextlib
import functools
import math
import os
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from leases import Lease, LeaseAuthority, Receiver
from run_experiment import (
    EXIT_DIFFERENT,
    EXIT_OK,
    RESOURCE,
    SHARED_EXIT_CODES,
    Action,
    Step,
    _event,
    _note,
    _output_target,
    _parser,
    _perform,
    _publish,
    _scratch,
    _stop_if_asked,
    _write,
    canonical_json,
    command,
    judge,
    timeline,
)

if TYPE_CHECKING:
    import argparse

__all__ = ["CHECKS", "CLASSES", "EXIT_CODES", "Bound", "explore", "main"]

# --- the bound and its states ---
#
# A bound is H holders that all run one program, one ttl, and the ticks 0..T.  A schedule
# interleaves the holders' programs, each step at a tick no earlier than the one before.
# Schedules are many but states are few: the explorer counts schedules layer by layer (one
# layer per step taken), by state, and plays each distinct (state, step) once on the real
# code.  It writes the state into the database, calls the library through _perform, and reads
# the state that is left back from the database, so that a broken library changes what is
# explored.  Each step is one transaction, so whole steps in every order are every order that
# processes could produce at this level; what happens inside a transaction is not explored.

CLASSES = ("lost update", "stale refused", "gap", "late, not superseded", "replay", "conflict")
CHECKS = ("fence", "epochs increase", "one live lease", "highest epoch stored", "model")
_FLAGS = (*(f"fenced {c}" for c in CLASSES), *(f"unfenced {c}" for c in CLASSES), *CHECKS)


@dataclass(frozen=True)
class Bound:
    """Holders A, B, ... that all run `program`, acquiring or renewing for `ttl` ticks."""

    holders: int = 2
    program: tuple[Action, ...] = (Action.ACQUIRE, Action.RENEW, Action.WRITE, Action.RELEASE)
    last_tick: int = 5
    ttl: int = 2

    @functools.cache  # noqa: B019 - a few bounds, a few steps each
    def step(self, h: int, position: int, tick: int) -> Step:
        """Holder h's step at `position`; its k-th write sends its name and k, as "A1"."""
        actor, action = "ABCDEFGH"[h], self.program[position]
        timed = action in (Action.ACQUIRE, Action.RENEW)
        k = self.program[: position + 1].count(Action.WRITE)
        value = f"{actor}{k}" if action is Action.WRITE else None
        return Step(actor, action, tick, self.ttl if timed else None, value)


@dataclass(frozen=True)
class _State:
    """All that the rest of a schedule depends on: the database, the time, each holder."""

    row: tuple[Any, ...] | None  # the authority's: holder (None once released), epoch, expiry
    stored: tuple[Any, ...]  # the fenced receiver's (epoch, value), the unfenced one's
    tick: int
    positions: tuple[int, ...]  # how many steps of the program each holder has taken
    leases: tuple[Any, ...]  # the (epoch, expires_at) each holder believes it holds, or None


class _Bench:
    """The real authority and receivers on one file, and a plain connection to set and read it."""

    def __init__(self, path: str) -> None:
        self.authority = LeaseAuthority(path)
        self.receivers = Receiver(path, fenced=True), Receiver(path, fenced=False)
        self.raw = sqlite3.connect(path, isolation_level=None)
        self.now: tuple[Any, ...] = (None, (None, None))  # what the database holds

    def close(self) -> None:
        for store in (self.authority, *self.receivers, self.raw):
            store.close()

    def play(self, state: _State, h: int, step: Step) -> tuple[_State, list[dict[str, Any]]]:
        """Set the database to `state`, play holder h's `step`; the state left, its events."""
        if self.now != (state.row, state.stored):
            decisions = [(fenced, RESOURCE, *pair, *pair)
                         for fenced, pair in zip((True, False), state.stored) if pair]
            self.raw.executescript("BEGIN IMMEDIATE; DELETE FROM leases;"
                                   " DELETE FROM receiver_decisions;")
            self.raw.executemany("INSERT INTO leases VALUES (?, ?, ?, ?)",
                                 [(RESOURCE, *state.row)] if state.row else [])
            self.raw.executemany("INSERT INTO receiver_decisions VALUES"
                                 " (?, ?, 1, 'applied', ?, ?, ?, ?)", decisions)
            self.raw.execute("COMMIT")
        held = state.leases[h]
        lease = None if held is None else Lease(RESOURCE, step.actor, *held)
        try:
            lease, event = _perform(step, lease, self.authority, self.receivers[0])
            wrote = step.action is Action.WRITE and lease is not None
            events = [event, _write(step, lease, self.receivers[1]) if wrote and lease else event]
        except Exception as exc:  # noqa: BLE001 - a broken library: an answer no model gives
            events = [_event(step, f"raised {type(exc).__name__}: {exc}")] * 2
        row = self.raw.execute("SELECT holder, epoch, expires_at FROM leases").fetchone()
        stored = tuple(self.raw.execute(
            "SELECT stored_epoch, stored_value FROM receiver_decisions WHERE fenced = ?"
            " ORDER BY seq DESC LIMIT 1", (fenced,)).fetchone() for fenced in (True, False))
        self.now = row, stored
        held = None if lease is None else (lease.epoch, lease.expires_at)
        return _State(row, stored, step.tick, _put(state.positions, h, state.positions[h] + 1),
                      _put(state.leases, h, held)), events


def _put(items: tuple[Any, ...], index: int, item: Any) -> tuple[Any, ...]:
    return (*items[:index], item, *items[index + 1 :])


def _model(state: _State, h: int, step: Step) -> tuple[_State, list[tuple[Any, ...]]]:
    """What the rules say `step` answers, at each receiver, and leaves: from `state` alone."""
    row, stored, held = state.row, list(state.stored), state.leases[h]
    live = row is not None and row[0] is not None and step.tick < row[2]
    mine = row is not None and held is not None and tuple(row[:2]) == (step.actor, held[0])
    if step.action is Action.ACQUIRE and live:
        answers = [("held", row[1], row[2], None, None)] * 2  # type: ignore[index]
    elif step.action is Action.ACQUIRE or (step.action is Action.RENEW and mine and live):
        epoch = held[0] if step.action is Action.RENEW else 1 if row is None else row[1] + 1
        held = (epoch, step.tick + (step.ttl or 0))
        row = (step.actor, *held)
        answers = [("renewed" if step.action is Action.RENEW else "granted", *held, None, None)] * 2
    elif held is None:
        answers = [("no lease", None, None, None, None)] * 2
    elif step.action is not Action.WRITE:
        released = step.action is Action.RELEASE and mine
        answers = [("released" if released else "lost", held[0], None, None, None)] * 2
        row = (None, *row[1:]) if released and row else row
        held = None
    else:
        answers = []
        for r, pair in enumerate(stored):  # the fenced receiver, then the unfenced one
            if r or pair is None or held[0] > pair[0]:
                outcome, stored[r] = "applied", (held[0], step.value)
            elif held[0] < pair[0]:
                outcome = "stale"
            else:
                outcome = "replay" if step.value == pair[1] else "conflict"
            answers.append((outcome, held[0], None, *stored[r]))
    positions = _put(state.positions, h, state.positions[h] + 1)
    return _State(row, tuple(stored), step.tick, positions, _put(state.leases, h, held)), answers


def _flags(state: _State, h: int, step: Step, after: _State, events: list[Any]) -> int:
    """The flags a step raises: its write's classes at each receiver, then the checks it fails."""
    current = 0 if state.row is None else state.row[1]  # the authority's newest epoch
    held, fenced, first = state.leases[h], state.stored[0], events[0]
    raised = []
    for event, pair in zip(events, state.stored):
        applied, epoch = event["outcome"] == "applied", event["epoch"]
        lost = applied and pair is not None and epoch < pair[0]
        raised += [
            lost,
            event["outcome"] == "stale",
            applied and not lost and epoch < current,  # the gap: superseded, not fenced out
            applied and epoch == current and held is not None and step.tick >= held[1],
            event["outcome"] == "replay",
            event["outcome"] == "conflict",
        ]
    fields = ("outcome", "epoch", "expires_at", "stored_epoch", "stored_value")
    highest = max(0 if fenced is None else fenced[0], first["epoch"] or 0)
    raised += [
        first["outcome"] == "applied" and fenced is not None and first["epoch"] <= fenced[0],
        first["outcome"] == "granted" and first["epoch"] <= current,
        sum(lease is not None and step.tick < lease[1] for lease in after.leases) > 1,
        first["stored_epoch"] is not None and first["stored_epoch"] != highest,
        _model(state, h, step) != (after, [tuple(e[f] for f in fields) for e in events]),
    ]
    return sum(1 << bit for bit, hit in enumerate(raised) if hit)


def explore(
    bound: Bound, *, brute_force: bool = False, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Play every schedule of `bound` on the real code; the table of what happened.

    Each distinct (state, step) is played once, and schedules are counted by state.  With
    `brute_force`, no two schedules share a state: every schedule is played, step by step.
    """
    started, played, states = time.monotonic(), 0, 1
    smallest: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    start = _State(None, (None, None), 0, (0,) * bound.holders, (None,) * bound.holders)
    # Each state of a layer: the smallest schedule that reaches it (its ticks, then its
    # holders), and how many schedules reach it with each set of flags.
    layer: dict[Any, Any] = {(start, ()) if brute_force else start: (((), ()), Counter({0: 1}))}
    with contextlib.ExitStack() as cleanup:
        bench = _Bench(os.path.join(_scratch(cleanup, "leases-explore-"), "explore.sqlite3"))
        cleanup.callback(bench.close)
        for _ in range(bound.holders * len(bound.program)):
            following: dict[Any, Any] = {}
            for key in sorted(layer, key=repr):  # a reproducible order, one row's states together
                _stop_if_asked()
                state, ((ticks, holders), counts) = key[0] if brute_force else key, layer[key]
                for h, tick in _next(bound, state):
                    step = bound.step(h, state.positions[h], tick)  # cached: steps are few
                    after, events = bench.play(state, h, step)
                    raised, played = _flags(state, h, step, after, events), played + 1
                    prefix = ((*ticks, tick), (*holders, h))
                    for bit in (bit for bit in range(len(_FLAGS)) if raised >> bit & 1):
                        smallest[bit] = min(smallest.get(bit, prefix), prefix)
                    goes = (after, prefix) if brute_force else after
                    least, reached = following.get(goes, (prefix, Counter()))
                    following[goes] = min(least, prefix), reached
                    for flags, schedules in counts.items():
                        reached[flags | raised] += schedules
            layer, states = following, states + len(following)
            if progress is not None and time.monotonic() - started > 2:
                progress(f"explore: {played:,} transitions played, {states:,} states so far")
        ends: Counter[int] = Counter()
        for _, counts in layer.values():
            ends.update(counts)
        witnesses = {_FLAGS[bit]: _replay(bench, bound, start, *prefix)
                     for bit, prefix in sorted(smallest.items())}
    return _table(bound, ends, states, played, witnesses)


def _next(bound: Bound, state: _State) -> Iterator[tuple[int, int]]:
    """Every (holder, tick) that may come next: any holder not done, any tick from now on."""
    for h, position in enumerate(state.positions):
        if position < len(bound.program):
            yield from ((h, tick) for tick in range(state.tick, bound.last_tick + 1))


def _replay(
    bench: _Bench, bound: Bound, state: _State, ticks: tuple[int, ...], holders: tuple[int, ...]
) -> list[list[dict[str, Any]]]:
    """The events of one schedule played again from the start: at the fenced receiver, then
    at the unfenced one."""
    runs: list[list[dict[str, Any]]] = [[], []]
    for tick, h in zip(ticks, holders):
        state, events = bench.play(state, h, bound.step(h, state.positions[h], tick))
        runs[0].append(events[0])
        runs[1].append(events[1])
    return runs


def _table(
    bound: Bound, ends: Counter[int], states: int, played: int, witnesses: dict[str, Any]
) -> dict[str, Any]:
    """What an exploration found, as JSON: schedules, by class at each receiver, and checks."""
    n, size = bound.holders * len(bound.program), len(bound.program)
    orders, ticks = math.factorial(n) // math.factorial(size) ** bound.holders, bound.last_tick

    def having(*bits: int) -> int:
        return sum(count for flags, count in ends.items() if any(flags >> b & 1 for b in bits))

    width, schedules = len(CLASSES), sum(ends.values())
    return {
        "bound": {"holders": bound.holders, "program": [a.value for a in bound.program],
                  "last_tick": ticks, "ttl": bound.ttl},
        "schedules": schedules,
        "formula": f"multinomial({n}; {', '.join([str(size)] * bound.holders)}) x "
                   f"C({n} + {ticks}, {n}) = {orders} x {math.comb(n + ticks, n)}",
        "states": states,
        "transitions": played,
        "classes": {
            receiver: {**{name: having(r * width + c) for c, name in enumerate(CLASSES)},
                       "clean": schedules - having(*range(r * width, (r + 1) * width))}
            for r, receiver in enumerate(("fenced", "unfenced"))
        },
        "violations": {name: having(2 * width + c) for c, name in enumerate(CHECKS)},
        "witnesses": {name: runs[name.startswith("unfenced")]
                      for name, runs in witnesses.items() if name not in CHECKS},
        "failures": {name: {"fenced": runs[0], "unfenced": runs[1]}
                     for name, runs in witnesses.items() if name in CHECKS},
    }


# --- command line ---

EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "success: every check held in every schedule"),
    (EXIT_DIFFERENT, "a check failed: the first failing schedule is shown"),
    *SHARED_EXIT_CODES,
)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: the exit code, one of EXIT_CODES."""
    parser = _parser(
        "explore.py",
        "Play every schedule of a bound on the real authority and receivers, count the\n"
        "schedules of each kind, and check every step.  The report goes to stdout; --output\n"
        "also writes the table as JSON.",
        EXIT_CODES,
        "  python3 explore.py --program acquire write\n"
        "  python3 explore.py --holders 3 --last-tick 4",
    )
    parser.add_argument("--holders", type=int, choices=range(1, 9), metavar="N",
                        help=f"holders A, B, ... (1 to 8, default: {Bound.holders})")
    parser.add_argument("--program", nargs="+", choices=[a.value for a in Action],
                        metavar="ACTION", help="what each holder does, in order, from: "
                        f"{', '.join(a.value for a in Action)} (default: "
                        f"{' '.join(a.value for a in Bound.program)})")
    parser.add_argument("--last-tick", type=int, choices=range(100), metavar="T",
                        help=f"ticks 0 to T (0 to 99, default: {Bound.last_tick})")
    parser.add_argument("--ttl", type=int, choices=range(1, 100), metavar="N",
                        help=f"ticks a lease lasts (1 to 99, default: {Bound.ttl})")
    parser.add_argument("--output", metavar="PATH", help="also write the table as JSON to this "
                        "file, replacing it whole, or creating it")
    return command("explore.py", lambda: _main(parser.parse_args(argv)))


def _main(args: "argparse.Namespace") -> int:
    given = {"holders": args.holders, "last_tick": args.last_tick, "ttl": args.ttl,
             "program": args.program and tuple(map(Action, args.program))}
    bound = Bound(**{name: value for name, value in given.items() if value is not None})
    target = None if args.output is None else _output_target(args.output)
    started = time.monotonic()
    table = explore(bound, progress=_note)
    _stop_if_asked()
    code, report = _explored(table, time.monotonic() - started)
    _publish(target, canonical_json(table), report)
    return code


def _explored(table: dict[str, Any], seconds: float) -> tuple[int, str]:
    """The exit code and the report of an exploration: its table, and its smallest schedules."""
    bound, classes = table["bound"], table["classes"]
    failed = [name for name, count in table["violations"].items() if count]
    lines = [
        (f"every schedule of {bound['holders']} holders, each: {' '.join(bound['program'])}; "
         f"ticks 0 to {bound['last_tick']}, ttl {bound['ttl']}"),
        f"  {table['schedules']:,} schedules = {table['formula']}",
        (f"  {table['states']:,} states, {table['transitions']:,} transitions played on the "
         f"real code, {seconds:.1f} s"),
        f"  {'schedules with':<22}{'fenced':>12}{'unfenced':>12}",
        *(f"  {name:<22}{classes['fenced'][name]:>12,}{classes['unfenced'][name]:>12,}"
          for name in classes["fenced"]),
        f"  checks failed: {', '.join(failed) or 'none'} (of: {', '.join(CHECKS)})",
    ]
    shown = [(f"the smallest {name}", name.split()[0], table["witnesses"][name])
             for name in ("unfenced lost update", "fenced stale refused", "fenced gap")
             if name in table["witnesses"]]
    if failed:  # the smallest schedule that fails the first check, at both receivers
        failure = table["failures"][failed[0]]
        shown = [(f"the first schedule failing {failed[0]!r}", receiver, failure[receiver])
                 for receiver in ("fenced", "unfenced")]
    for title, receiver, events in shown:
        verdict = judge([e for e in events if not e["outcome"].startswith("raised")])
        lines.append(timeline({"name": title, "receiver": receiver, "events": events,
                               "verdict": verdict}))
    return (EXIT_DIFFERENT if failed else EXIT_OK), "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
