"""Every interleaving of the holders' calls at each SQL statement, with a crash before each.

The holders' calls are a subject of engine.py: each holder is an actor that plays its calls
on objects of its own, stopped before each statement and before its answer is heard.  One
holder runs at a time; one that holds SQLite's write lock runs on to COMMIT alone (in WAL mode
no other connection can see or change what it does before then).  Before any statement a
holder may die: its connections close with no COMMIT, as a killed process's do, and a new one
(new objects) takes the same step again later.  After a crash the rest is played one way.

Every interleaving starts fresh: a new file, new threads, new objects; a failing one is played
again whole in a new process, and must fail again, before it is shown.  Three verdicts:

* safety: the answers, and what the file holds at the end, are those of some one-at-a-time
  order of the calls (a call that ended comes before any call begun after); a call whose
  holder died, or that raised, may be in it or not, unless it committed: a transaction of it
  that changed a row ended without a rollback (by COMMIT, or an autocommit statement);
* liveness: no holder waits for ever for a lock kept after a call;
* errors: no call raised (a lock error, say) where the contract answers.
A call that gives no answer within the bound's timeout is core.Hung: a finding.
"""
import contextlib
import functools
import os
import sqlite3
import tempfile
from collections import Counter
from collections.abc import Iterator
from typing import Any, NamedTuple

import calls
import core
import engine
from calls import Place, played
from core import HOLDERS, Bound, Record, Run, expected, recorded

from leases import Lease

__all__ = ["BOUND", "VERDICTS", "Call", "Interleaving", "explore_statements", "play", "replay",
           "replayed", "report"]

BOUND = Bound(2, ("acquire", "write"), last_tick=0, ttl=1)
VERDICTS = ("safety", "liveness", "errors")

UNKNOWN = core.UNREAD  # a stored pair the receiver cannot say: it has no read(resource)
ANSWER = "its answer is heard"  # where a holder may die after its last statement


# --- data ---


class Call(NamedTuple):
    """One call of an interleaving: its step and lease, its answer (None if its holder died
    in it), whether a COMMIT of it returned, and the choices it began and ended at."""

    h: int
    step: Any
    held: Lease | None
    run: Run | None
    committed: bool
    start: int
    end: int


class Interleaving(NamedTuple):
    """One interleaving played: the choices taken, how many were open at each, its calls, its
    transcript, its verdicts' failures, and what the file holds at the end."""

    choices: tuple[int, ...]
    tokens: tuple[str, ...]  # the choices as a witness prints them: A@0 (start), A (run), A!
    options: tuple[int, ...]
    calls: tuple[Call, ...]
    said: tuple[str, ...]
    failed: tuple[str, ...]
    crashed: str | None  # "acquire, committed: held": the call it died in, and its retry
    final: tuple[Any, ...] | None  # each resource's row and stored pair; None: a lock kept
    notes: tuple[tuple[int, str], ...] = ()  # replays: after a line of `said`, a write's pairs
    died: bool = False  # a holder was killed


# --- rules: the three verdicts of one interleaving ---


def safe(bound: Bound, rules: tuple[str, ...], calls: tuple[Call, ...],
         final: tuple[Any, ...]) -> bool:
    """Some one-at-a-time order of `calls` gives every answer heard and leaves `final` (each
    resource's authority row, and its stored pair, or UNKNOWN)."""
    answered = [c for c in calls if c.run is not None and not _raised(c.run)]
    optional = [c for c in calls if c not in answered and not c.committed]
    must = [c for c in calls if c not in answered and c.committed]
    every = (*answered, *must, *optional)

    @functools.cache
    def order(placed: frozenset[int], records: tuple[Record, ...]) -> bool:
        waiting = [i for i in range(len(every)) if i not in placed]
        known = [pair is not UNKNOWN for _, pair in final]
        if all(every[i] in optional for i in waiting) and final == _held(records, known):
            return True
        for i in waiting:
            call = every[i]
            if any(every[j].end < call.start for j in waiting if j != i and every[j] not in
                   optional):
                continue  # a call that ended before this one began comes first
            r = call.h % bound.resources
            resource = bound.resource(call.h)
            answers, kept = expected(records[r], call.step, call.held, rules, resource)
            run = Run(kept, tuple((call.step.actor, call.step.action.value, call.step.tick,
                                   *answer) for answer in answers), False)
            if call in answered:
                assert call.run is not None
                if call.run.kept != kept or any(core.compared(e, a) != a for e, a in zip(
                        call.run.events, answers)):
                    continue
            after = recorded(records[r], call.step, call.held, run)
            if order(placed | {i}, (*records[:r], after, *records[r + 1:])):
                return True
        return False

    return bool(order(frozenset(), (Record.empty(len(rules), bound.first_epoch),) *
                      bound.resources))


def _held(records: tuple[Record, ...], known: list[bool]) -> tuple[Any, ...]:
    """What the file must hold by the record: each resource's authority row and stored pair."""
    return tuple((record.row, record.stored[0] if read else UNKNOWN)
                 for record, read in zip(records, known))


def _raised(run: Run) -> bool:
    return str(run.events[0][3]).startswith("raised")


# --- the holders: a subject of the engine, each an actor playing its calls ---


def play(bound: Bound, place: Place, choices: tuple[int, ...], *, crashes: bool = True,
         tokens: tuple[str, ...] | None = None) -> Interleaving:
    """Play one interleaving from a fresh start: `choices` first (each an index into the
    choices open there), or the witness's `tokens`, then the first open choice at each
    point.  With `tokens` (a replay), each write's stored pair is read before and after."""
    with contextlib.ExitStack() as cleanup:
        folder = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="statements-"))
        scheduler = _Holders(bound, place, os.path.join(folder, "leases.sqlite3"), crashes,
                             cleanup)
        if tokens is not None:
            scheduler.observer = _Observer(place, scheduler.path, bound)
            cleanup.callback(scheduler.observer.close)
        return scheduler.played(choices, tokens)


class _Observer:
    """Reads what the receiver stores, on objects of its own out of the holders' turns."""

    def __init__(self, place: Place, path: str, bound: Bound) -> None:
        self.place, self.path, self.bound = place, path, bound
        self.reader: Any = None

    def close(self) -> None:
        if self.reader is not None:
            core.guarded(self.place.who, "close()", self.reader.close)

    def stored(self, resource: str) -> Any:
        """The stored pair, or UNKNOWN: no read(resource), or the file not yet made."""
        if self.reader is None:
            if not os.path.exists(self.path):
                return UNKNOWN
            self.reader = self.place.make(self.path, self.bound.first_epoch - 1)
        return self.reader.read(resource) if hasattr(self.reader, "read") else UNKNOWN


class _Holders(engine.Scheduler):
    """One interleaving of the holders' calls: each holder idle, paused before a statement,
    or done; its calls so far.  A choice is ("start", h, tick), ("run", h) or ("die", h)."""

    def __init__(self, bound: Bound, place: Place, path: str, crashes: bool,
                 cleanup: contextlib.ExitStack) -> None:
        super().__init__([f"holder {HOLDERS[h]}" for h in range(bound.holders)],
                         bound.timeout, crashes, cleanup)
        self.bound, self.place, self.path = bound, place, path
        self.positions, self.held = [0] * bound.holders, [None] * bound.holders
        self.begun: list[tuple[Any, int]] = [(None, 0)] * bound.holders  # each call's step
        self.tick, self.taken = 0, 0
        self.calls: list[Call] = []
        self.crashed: str | None = None
        self.retrying: dict[int, str] = {}  # the call each holder died in, to take again
        self.observer: _Observer | None = None  # a replay's: each write's pairs read
        self.notes: list[tuple[int, str]] = []
        self.before: dict[int, Any] = {}  # by holder: the pair stored as its write began
        self.answered = [Record.empty(1, bound.first_epoch)] * bound.resources  # calls one
        # at a time in the order they answered: what the contract answers a write there

    def enabled(self) -> list[tuple[Any, ...]]:
        writer = [h for h, actor in enumerate(self.actors) if actor.writing]
        writer += [h for h, sql in enumerate(self.waiting) if sql == ANSWER]
        if writer:  # it runs on to COMMIT (or its answer) alone, or dies: no one else sees
            h = writer[0]
            if self.waiting[h] is None:
                return []  # it kept the lock after its call: the others wait for ever
            return [("run", h), *([("die", h)] * self.may_die)]
        choices: list[tuple[Any, ...]] = []
        for h, sql in enumerate(self.waiting):
            if sql is not None:
                choices += [("run", h), *([("die", h)] * self.may_die)]
            elif self.positions[h] < len(self.bound.program):
                choices += [("start", h, t) for t in range(self.tick, self.bound.last_tick + 1)]
        return sorted(choices, key=lambda c: c[0] == "die")  # the first, a plain run

    def token(self, choice: tuple[Any, ...]) -> str:
        """A choice as a witness prints it: A@0 starts A's next call at tick 0, A runs A's
        next statement (or lets its answer be heard), A! kills A there."""
        kind, h, *tick = choice
        return HOLDERS[h] + (f"@{tick[0]}" if kind == "start" else "!" if kind == "die" else "")

    def played(self, given: tuple[int, ...],
               tokens: tuple[str, ...] | None = None) -> Interleaving:
        taken, options = self.chosen(given, tokens)
        final = None
        if not self.failed:  # else the witness went otherwise: nothing more to judge
            if any(p < len(self.bound.program) for p in self.positions) or any(
                    sql is not None for sql in self.waiting):
                self.failed.append("liveness")
                self.said.append("  the others wait for ever: the write lock is kept after "
                                 "a call")
            final = None if self.failed else self._final()  # a lock kept: it cannot be read
            if final is not None and not safe(self.bound, (self.place.rules,),
                                              tuple(self.calls), final):
                self.failed.append("safety")
                self.said.append("  no one-at-a-time order of these calls gives these answers "
                                 "and leaves what the file holds")
            if any(c.run is not None and _raised(c.run) for c in self.calls):
                self.failed.append("errors")
        return Interleaving(taken, tuple(self.tokens), options, tuple(self.calls),
                            tuple(self.said), tuple(self.failed), self.crashed, final,
                            tuple(self.notes), self.died)

    def take(self, choice: tuple[Any, ...]) -> None:
        kind, h, *rest = choice
        actor = HOLDERS[h]
        self.taken += 1
        if kind == "start":
            (self.tick,) = rest
            step = self.bound.step(h, self.positions[h], self.tick)
            self.begun[h] = step, self.taken
            resource = self.bound.resource(h)
            where = f" {resource}" * (self.bound.resources > 1)
            self.said.append(f"{actor} {step.action.value}{where} at tick {self.tick}:")
            held = core.lease_of(self.held[h])
            if self.observer and held and step.action.value == "write":
                self.before[h] = self.observer.stored(resource)
            told = self.start(h, self._call(h, step, held, resource),
                              f"{step.action.value} at tick {step.tick}", interleaved=False)
        elif kind == "run":
            if self.waiting[h] != ANSWER:
                self.said.append(f"  {actor} {self.waiting[h]}")
            told = self.go(h)
        else:
            self.said.append(f"  {actor} dies before {self.waiting[h]}")
            told = self.kill(h)
        self._heard(h, *told)

    def _call(self, h: int, step: Any, held: Lease | None, resource: str) -> Any:
        """Holder h's call, as its actor plays it: the objects of its process opened first
        (not interleaved), then the call, interleaved, stopped before its answer is heard."""
        actor = self.actors[h]

        def body() -> Run:
            if "objects" not in actor.kept:  # a new process opens the file
                objects = calls.opened(self.path, (self.place,), self.bound.first_epoch)
                if len(actor.connections) < len(objects):
                    calls.closed(objects, (self.place,))
                    raise core.Unsupported(
                        f"{self.place.spec!r} opened no connection through sqlite3.connect as "
                        "it was made, so its statements cannot be stopped")
                actor.kept["objects"] = objects
            engine.interleave()
            kept, events = played(step, held, actor.kept["objects"], self.path, resource)
            left = any(c.in_transaction for c in actor.connections)
            engine.gate(ANSWER)  # it may die before its answer is heard
            return Run(core.lease_fields(kept), events, left)

        return body

    def _heard(self, h: int, kind: str, run: Any) -> None:
        if kind == "paused":
            return
        actor, committed = HOLDERS[h], self.actors[h].committed
        step, start = self.begun[h]
        held = core.lease_of(self.held[h])
        if kind == "died":
            self.calls.append(Call(h, step, held, None, committed, start, self.taken))
            self.retrying[h] = f"{step.action.value}, {'not ' * (not committed)}committed"
            self._noted(h, None, committed)
            return
        if run.lock_left:
            self.failed.append("liveness")
            self.said.append(f"  {actor} returned with a transaction open")
        self.calls.append(Call(h, step, held, run, committed, start, self.taken))
        self.said.append(f"  {actor} {run.events[0][3]}" + f" epoch {run.events[0][4]}" * (
            run.events[0][3] in ("granted", "renewed")))
        if h in self.retrying:  # the step taken again by a new process
            self.crashed = f"{self.retrying.pop(h)}: {run.events[0][3]}"
        self._noted(h, run, committed)
        self.positions[h] += 1
        self.held[h] = run.kept

    def _noted(self, h: int, run: Run | None, committed: bool) -> None:
        """In a replay, a write's note: the pair stored before and after, and the contract's
        answer with the calls taken one at a time in the order they answered (a call whose
        holder died after its COMMIT among them, as the contract answers it)."""
        step, r, held = self.begun[h][0], h % self.bound.resources, core.lease_of(self.held[h])
        answers, kept = expected(self.answered[r], step, held, (self.place.rules,),
                                 self.bound.resource(h))
        if run is not None or committed:
            self.answered[r] = recorded(self.answered[r], step, held, run or Run(kept, tuple(
                (step.actor, step.action.value, step.tick, *answer) for answer in answers),
                False))
        if h not in self.before or self.observer is None:
            return
        after = self.observer.stored(self.bound.resource(h))
        said = (f"    stored {core.shown_pair(self.before.pop(h))} as it began -> "
                f"{core.shown_pair(after)}")
        if run is not None:
            said += f"; the contract, calls taken in the order they answered: {answers[0][0]}"
        self.notes.append((len(self.said) - 1, said))

    def _final(self) -> tuple[Any, ...]:
        """What the file holds: each resource's authority row, and the stored pair as the
        receiver's read(resource) gives it (UNKNOWN: a reader's receiver without one)."""
        connection = sqlite3.connect(self.path, isolation_level=None, timeout=0)
        reader = self.place.make(self.path, self.bound.first_epoch - 1)
        try:
            held = []
            for r in range(self.bound.resources):
                resource = core.RESOURCES[r]
                row = connection.execute("SELECT holder, epoch, expires_at FROM leases WHERE "
                                         "resource = ?", (resource,)).fetchone()
                if row is not None:  # as every party sees the epochs: from the first epoch
                    row = (row[0], row[1] + self.bound.first_epoch - 1, row[2])
                stored = reader.read(resource) if hasattr(reader, "read") else UNKNOWN
                held.append((row, stored))
            return tuple(held)
        finally:
            connection.close()
            core.guarded(self.place.who, "close()", reader.close)


# --- the search: every interleaving, by its choices ---


def explore_statements(bound: Bound, place: Place | None = None) -> dict[str, Any]:
    """Every interleaving of `bound` at each statement, and each with one crash; the table.
    A failing one is played again whole in a new process: it must fail again, else
    core.Different."""
    place = place or calls.places()[0]
    found = []
    with engine.gated():
        for run in _every(bound, place):  # up to the first failing
            found.append(run)
            if run.failed:
                break
    crashed = Counter(run.crashed for run in found if run.crashed)
    failing = {verdict: next((run for run in found if verdict in run.failed), None)
               for verdict in VERDICTS}
    shown = {}
    with contextlib.ExitStack() as cleanup:
        for verdict, failed in failing.items():
            if failed is not None:
                run = failed
                again = core.Fresh(replayed, (bound, place, run.tokens), cleanup).result()
                if verdict not in again.failed or again.said != run.said:
                    raise core.Different(_differs(verdict, run, again))
                shown[verdict] = [*_lines(again), "  again: " + core.command(
                    bound, (place,) * (place.spec not in calls.OURS), "statements",
                    " ".join(again.tokens))]
    return {
        "bound": bound, "receiver": place.name,
        "interleavings": sum(not run.died for run in found),
        "crash_schedules": sum(run.died for run in found),
        "after_a_crash": dict(sorted(crashed.items())),
        "failed": {verdict: sum(verdict in run.failed for run in found) for verdict in VERDICTS},
        "witnesses": shown,
        "ok": not any(failing.values()),
    }


def _differs(verdict: str, run: Interleaving, again: Interleaving) -> str:
    """Why a failing interleaving is not shown: it went otherwise played whole afresh."""
    said = [line for line, other in zip(run.said, again.said) if line != other]
    where = (f"; first, in the search {said[0].strip()!r}, afresh "
             f"{again.said[run.said.index(said[0])].strip()!r}" if said else "")
    return (f"an interleaving failed {verdict} in the search but, played whole in a new "
            f"process, {'failed ' + ', '.join(again.failed) if again.failed else 'passed'}"
            f"{where}: an answer rests on more than the file and the call; the search's:\n"
            + "\n".join(run.said))


def replayed(bound: Bound, place: Place, tokens: tuple[str, ...]) -> Interleaving:
    """One interleaving played by its witness in a new process: the library imported afresh,
    each write's stored pairs read."""
    with engine.gated():
        return play(bound, place, (), tokens=tokens)


def replay(bound: Bound, place: Place, witness: str) -> tuple[str, bool]:
    """A printed witness played again alone, in a new process: its transcript and verdicts."""
    with contextlib.ExitStack() as cleanup:
        again = core.Fresh(replayed, (bound, place, tuple(witness.split())),
                              cleanup).result()
    if "witness" in again.failed:  # not one of this bound's, or an answer went otherwise
        raise ValueError(f"the witness {witness!r}: {again.said[-1].strip()}")
    return "\n".join([
        (f"the interleaving {witness} of {bound.said()}, receiver {place.name}, played again "
         "whole in a new process, stored pairs as read"), *_lines(again),
        *(f"  {verdict}: {'FAILED' if verdict in again.failed else 'held'}"
          for verdict in VERDICTS)]), not again.failed


def _lines(run: Interleaving) -> list[str]:
    """An interleaving's transcript, each write's note after its answer."""
    notes = dict(run.notes)
    return [line for i, said in enumerate(run.said)
            for line in (said, *([notes[i]] if i in notes else []))]


def _every(bound: Bound, place: Place,
           crashes_or_not: tuple[bool, ...] = (False, True)) -> Iterator[Interleaving]:
    """Each interleaving of `bound` with no crash, then each with one (engine.every)."""
    return engine.every(lambda given, crashes: play(bound, place, given, crashes=crashes),
                        crashes_or_not)


def report(table: dict[str, Any], seconds: float) -> str:
    bound: Bound = table["bound"]
    lines = [
        (f"every interleaving at each SQL statement of {bound.said()}, receiver "
        f"{table['receiver']}"),
        (f"  {table['interleavings']:,} interleavings, and {table['crash_schedules']:,} with a "
        "crash: a holder dies before a statement, and a new process takes the step again "
        f"(the rest played one way){', up to the first failing' * (not table['ok'])}; "
        f"{seconds:.1f} s"),
        *["  a crash in, and the step taken again:"] * bool(table["after_a_crash"]),
        *(f"    {seen:<40}{count:>8,}" for seen, count in table["after_a_crash"].items()),
        *(f"  {verdict}: {'held' if not count else f'FAILED in {count:,}'}"
          for verdict, count in table["failed"].items()),
    ]
    for verdict, said in table["witnesses"].items():
        lines += [(f"the first interleaving failing {verdict}, failing again played whole in a "
                  "new process:"), *said]
    return "\n".join(lines)
