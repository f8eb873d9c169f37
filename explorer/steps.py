"""The step search: every schedule of a bound, each call played whole, counted by state.

A schedule is an order of the holders' steps and the tick of each.  Every step is played
through run_experiment.perform on the real LeaseAuthority and on each place of the run
(calls.py), and judged by core's checks and classes.

The one assumption: a call's answer rests on the file and the call.  So the search plays each
call once from each content of the file it meets (restoring that content with its own SQL),
and merges schedules that reach the same content, tick, holders' places and leases.  The
assumption is tested, not trusted: every failing schedule shown, and a seeded sample of
passing ones, is played again whole from a fresh start (a new process, a freshly imported
library, a new file, each holder with objects of its own), and every answer must be the
search's.  A difference is Different, naming the schedule and the call.
"""

import contextlib
import dataclasses
import os
import random
import re
import shlex
import sqlite3
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import core
from calls import OURS, Place, closed, opened, places, played
from core import Bound, Hung, Record, Run, Schedule

import run_experiment
from leases import Lease
from run_experiment import Action, Step, judge

__all__ = ["Walked", "explore_steps", "parse", "replay", "replay_steps", "report", "table"]


class State(NamedTuple):
    """What the search merges schedules by: two that reach equal states go on as one."""

    content: int
    tick: int
    positions: tuple[int, ...]
    leases: tuple[Any, ...]  # the lease each holder keeps, as fields, or None
    records: tuple[Record, ...]  # one per resource


# --- the search: schedules counted by state, each call played once per content ---


class _File:
    """The search's one file and the objects on it, with a connection of the explorer's own
    that reads and sets everything the file's tables hold."""

    def __init__(self, folder: str, rules: tuple[Place, ...], bound: Bound) -> None:
        self.path, self.places, self.bound = os.path.join(folder, "leases.sqlite3"), rules, bound
        self.caller = core.Caller(bound.timeout)
        self.objects = self._open()
        self.raw = sqlite3.connect(self.path, isolation_level=None, timeout=0)
        self.raw.execute("PRAGMA synchronous = OFF")  # its own writes only: a crash loses a run
        self.contents: list[Any] = []
        self.ids: dict[Any, int] = {}
        self.here = self._intern(self._read())

    def _open(self) -> list[Any]:
        objects: list[Any] = self.caller.call("making the objects", opened, self.path,
                                              self.places, self.bound.first_epoch)
        return objects

    def close(self) -> None:
        self.raw.close()
        self.caller.stop(closed, self.objects, self.places)

    def play(self, at: int, step: Step, held: Lease | None, resource: str) -> tuple[Run, int]:
        """Play `step` from the content `at`: what it did, and the content it left."""
        if at != self.here:
            self._restore(self.contents[at])
        kept, events = self.caller.call(str(step), played, step, held, self.objects,
                                        self.path, resource)
        left = False
        try:
            content = self._read()
        except sqlite3.OperationalError:  # locked: a transaction left open
            left = True
            self.caller.call("closing the objects", closed, self.objects, self.places)
            self.objects = self._open()
            content = self._read()
        self.here = self._intern(content)
        return Run(core.lease_fields(kept), events, left), self.here

    def _intern(self, content: Any) -> int:
        if content not in self.ids:
            self.ids[content] = len(self.contents)
            self.contents.append(content)
        return self.ids[content]

    def _read(self) -> Any:
        """Every table's schema and rows (a rowid table's rowids too), under the write lock."""
        self.raw.execute("BEGIN IMMEDIATE")
        try:
            tables = self.raw.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'"
                                      " ORDER BY name").fetchall()
            return tuple((name, sql, tuple(self.raw.execute(self._select(name, sql))))
                         for name, sql in tables)
        finally:
            self.raw.execute("COMMIT")

    @staticmethod
    def _select(name: str, sql: str) -> str:
        if "WITHOUT ROWID" in sql.upper():
            return f'SELECT * FROM "{name}"'  # in key order
        return f'SELECT rowid, * FROM "{name}" ORDER BY rowid'

    def _restore(self, content: Any) -> None:
        """Make the tables hold `content` again, in one transaction of the explorer's own."""
        now = self.contents[self.here]
        if [table[:2] for table in content] != [table[:2] for table in now]:
            raise core.Unsupported("a call changed the tables themselves; the step mode "
                                   "restores rows only")
        self.raw.execute("BEGIN IMMEDIATE")
        try:
            for (name, sql, rows), (_, _, rows_now) in zip(content, now):
                if rows != rows_now:
                    self.raw.execute(f'DELETE FROM "{name}"')
                    if rows:
                        self.raw.executemany(self._fill(name, sql, len(rows[0])), rows)
            self.raw.execute("COMMIT")
        except BaseException:
            if self.raw.in_transaction:
                self.raw.execute("ROLLBACK")
            raise
        self.here = self._intern(content)

    def _fill(self, name: str, sql: str, width: int) -> str:
        columns = [row[1] for row in self.raw.execute(f'PRAGMA table_info("{name}")')]
        if "WITHOUT ROWID" not in sql.upper():
            columns.insert(0, "rowid")
        names = ", ".join(f'"{c}"' for c in columns)
        return f'INSERT INTO "{name}" ({names}) VALUES ({", ".join("?" * width)})'


def explore_steps(bound: Bound, receivers: tuple[Place, ...] | None = None, *,
                  sample: int = 8, seed: int = 0) -> dict[str, Any]:
    """Every schedule of `bound`, counted by state; the table of what happened (see `table`).
    A failing witness and `sample` random schedules (drawn with `seed`) are played again
    whole from a fresh start, and must answer as in the search: else Different."""
    receivers = receivers or places()
    rules = tuple(place.rules for place in receivers)
    with contextlib.ExitStack() as cleanup:
        folder = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="explore-"))
        asked = [(schedule, core.Fresh(replay, (bound, receivers, schedule), cleanup))
                 for schedule in _drawn(bound, sample, seed)]  # played while the search runs
        bench = _File(folder, receivers, bound)
        cleanup.callback(bench.close)
        known: dict[Any, tuple[Run, int]] = {}  # (content, step, lease, resource): its run

        def searched(h: int, content: int, step: Step, held: Lease | None,
                     resource: str) -> tuple[Run, int]:
            """A call played once from each content: what it did, and the content after."""
            key = (content, step, core.lease_fields(held), resource)
            if key not in known:
                known[key] = bench.play(content, step, held, resource)
            return known[key]

        ends, smallest, states = _search(bound, searched, rules)
        found = {flag: _walk(bound, searched, rules, schedule)
                 for flag, schedule in smallest.items()}
        failing = {flag: core.Fresh(replay, (bound, receivers, smallest[flag]), cleanup)
                   for flag in smallest if flag[0] == "failed" or (
                       flag[0] == "class" and len(receivers) == 1 and receivers[0].spec not in
                       OURS and core.CLASSES[flag[2]].name in _SHOWN)}  # their pairs read
        for schedule, fresh in asked:
            _same(bound, schedule, _walk(bound, searched, rules, schedule), fresh.result())
        for flag, fresh in failing.items():  # shown as played afresh, stored pairs read
            found[flag] = fresh.result()
            _same(bound, smallest[flag], _walk(bound, searched, rules, smallest[flag]),
                  found[flag])
    return table(bound, receivers, ends, states, len(known), found, smallest)


# How a step is played: by holder h, from a content of the file, with the lease it holds;
# what it did, and the content it left.
Player = Callable[[int, int, Step, "Lease | None", str], tuple[Run, int]]


def _search(bound: Bound, play: Player, rules: tuple[str, ...]
            ) -> tuple[Counter[frozenset[Any]], dict[Any, Schedule], int]:
    """Count schedules by state, one layer per step.  Each state keeps the smallest schedule
    that reaches it and how many schedules reach it with each set of flags (the classes each
    place showed, the checks failed)."""
    layer: dict[State, tuple[Schedule, Counter[frozenset[Any]]]] = {
        _start(bound, rules): ((), Counter({frozenset(): 1}))}
    smallest: dict[Any, Schedule] = {}
    states = 1
    for _ in range(bound.holders * len(bound.program)):
        following: dict[State, tuple[Schedule, Counter[frozenset[Any]]]] = {}
        for state, (schedule, counts) in layer.items():
            for h, tick in _next(bound, state.tick, state.positions):
                reach = (*schedule, (h, tick))
                try:
                    flags, goes, _ = _stepped(bound, play, rules, state, h, tick)
                except Hung as hung:
                    raise Hung(hung.said, witness=_said(reach)) from None
                for flag in flags:
                    if flag not in smallest or _order(reach) < _order(smallest[flag]):
                        smallest[flag] = reach
                before = following.get(goes)
                if before is None or _order(reach) < _order(before[0]):
                    following[goes] = (reach, before[1] if before else Counter())
                target = following[goes][1]
                for having, count in counts.items():
                    target[having | flags] += count
        layer, states = following, states + len(following)
    ends: Counter[frozenset[Any]] = Counter()
    for _, counts in layer.values():
        ends.update(counts)
    return ends, smallest, states


def _start(bound: Bound, rules: tuple[str, ...]) -> State:
    return State(0, 0, (0,) * bound.holders, (None,) * bound.holders,
                 (Record.empty(len(rules), bound.first_epoch),) * bound.resources)


def _stepped(bound: Bound, play: Player, rules: tuple[str, ...], state: State, h: int,
             tick: int) -> tuple[frozenset[Any], State, Run]:
    """Holder h's next step at `tick` from `state`: the flags it raises, the state after,
    and what it did."""
    step = bound.step(h, state.positions[h], tick)
    resource, r = bound.resource(h), h % bound.resources
    held = core.lease_of(state.leases[h])
    run, content = play(h, state.content, step, held, resource)
    others = tuple(lease for g, lease in enumerate(state.leases)
                   if g != h and lease is not None and lease[0] == resource)
    found, failed, after = core.judged(state.records[r], step, held, run, others, rules, resource)
    flags = frozenset([*(("class", p, c) for p, c in found),
                       *(("failed", check, place) for check, place in failed)])
    return flags, State(content, tick, _put(state.positions, h, state.positions[h] + 1),
                        _put(state.leases, h, run.kept), _put(state.records, r, after)), run


def _order(schedule: Schedule) -> tuple[Any, ...]:
    """Smaller first: by ticks, then by holders."""
    return tuple(t for _, t in schedule), tuple(h for h, _ in schedule)


def _next(bound: Bound, tick: int, positions: tuple[int, ...]) -> Iterator[tuple[int, int]]:
    """Every (holder, tick) that may come next: a holder not done, at any tick from now on."""
    for h, position in enumerate(positions):
        if position < len(bound.program):
            yield from ((h, later) for later in range(tick, bound.last_tick + 1))


def _put(items: tuple[Any, ...], index: int, item: Any) -> tuple[Any, ...]:
    return (*items[:index], item, *items[index + 1:])


class Walked(NamedTuple):
    """One step of a schedule played: what it did, the checks it failed (check, place), and
    at each place the contract's answer and the pair stored before, by the record."""

    step: Step
    resource: str
    run: Run
    failed: list[Any]
    expected: tuple[str, ...]
    stored: tuple[Any, ...]


def _walk(bound: Bound, play: Player, rules: tuple[str, ...],
          schedule: Schedule) -> list[Walked]:
    """One schedule played by `play`, step by step."""
    state, steps = _start(bound, rules), list[Walked]()
    for h, tick in schedule:
        step, r = bound.step(h, state.positions[h], tick), h % bound.resources
        held = core.lease_of(state.leases[h])
        answers, _ = core.expected(state.records[r], step, held, rules, bound.resource(h))
        stored = state.records[r].stored
        try:
            flags, state, run = _stepped(bound, play, rules, state, h, tick)
        except Hung as hung:
            raise Hung(hung.said, witness=_said(schedule[:len(steps) + 1])) from None
        steps.append(Walked(step, bound.resource(h), run, sorted(
            flag[1:] for flag in flags if flag[0] == "failed"), tuple(
                str(a[0]) for a in answers), stored))
    return steps


def replay(bound: Bound, receivers: tuple[Place, ...], schedule: Schedule) -> list[Walked]:
    """Play `schedule` whole from a fresh start: a new file, each holder with objects of its
    own.  Run in a new process, this library is freshly imported.  Each step's run, and the
    checks it failed, as the search's _walk gives them."""
    with tempfile.TemporaryDirectory(prefix="explore-replay-") as folder:
        whole = _Whole(os.path.join(folder, "leases.sqlite3"), bound, receivers)
        try:
            return _walk(bound, whole.play, tuple(p.rules for p in receivers), schedule)
        finally:
            whole.close()


class _Whole:
    """A file played on from its start, each holder on objects of its own; what each place
    stores is read (read(resource), if it has one) before and after each write."""

    def __init__(self, path: str, bound: Bound, receivers: tuple[Place, ...]) -> None:
        self.path, self.bound, self.receivers = path, bound, receivers
        self.caller = core.Caller(bound.timeout)
        self.objects = [self._open() for _ in range(bound.holders)]
        self.raw = sqlite3.connect(path, isolation_level=None, timeout=0)

    def _open(self) -> list[Any]:
        objects: list[Any] = self.caller.call("making the objects", opened, self.path,
                                              self.receivers, self.bound.first_epoch)
        return objects

    def play(self, h: int, content: int, step: Step, held: Lease | None,
             resource: str) -> tuple[Run, int]:
        kept, events, seen = self.caller.call(str(step), _observed, step, held,
                                              self.objects[h], self.path, resource)
        try:  # the write lock free again after the call
            self.raw.execute("BEGIN IMMEDIATE")
            self.raw.execute("COMMIT")
        except sqlite3.OperationalError:
            self.caller.call("closing the objects", closed, self.objects[h], self.receivers)
            self.objects[h] = self._open()
            return Run(core.lease_fields(kept), events, True, seen), content
        return Run(core.lease_fields(kept), events, False, seen), content

    def close(self) -> None:
        self.raw.close()
        self.caller.stop(_closed_all, self.objects, self.receivers)


def _closed_all(objects: Sequence[Sequence[Any]], receivers: Sequence[Place]) -> None:
    for own in objects:
        closed(own, receivers)


def _observed(step: Step, held: Lease | None, objects: Sequence[Any], path: str,
              resource: str) -> tuple[Any, ...]:
    """`played`, with each place's stored pair read before and after a write."""
    def stored() -> list[Any]:
        return [core.UNREAD if not hasattr(store, "read") else store.read(held.resource)
                for store in objects[1:]] if held and step.action is Action.WRITE else []

    before = stored()
    kept, events = played(step, held, objects, path, resource)
    return kept, events, tuple(zip(before, stored()))


def _same(bound: Bound, schedule: Schedule, searched: list[Walked],
          fresh: list[Walked]) -> None:
    """Different, naming the schedule and the first call answered otherwise from a fresh
    start; a failure found in the search must be found again."""
    for index, (walked, walked_again) in enumerate(zip(searched, fresh)):
        run, failed, again, failed_again = (walked.run, walked.failed, walked_again.run,
                                            walked_again.failed)
        if run[:2] != again[:2] or failed != failed_again:
            step = bound.step(schedule[index][0], sum(
                h == schedule[index][0] for h, _ in schedule[:index]), schedule[index][1])
            raise core.Different(
                f"the schedule {_said(schedule)}: step {index + 1} ({step}) answered "
                f"{_answers(run)!r} in the search but {_answers(again)!r} played whole from "
                "a fresh start: its answer rests on more than the file and the call")


def _answers(run: Run) -> list[Any]:
    return [event[3] if event[3] != "applied" else f"applied {event[4]}" for event in
            run.events] + ([] if run.kept is None else [f"keeps epoch {run.kept[2]}"])


def _said(schedule: Schedule) -> str:
    return " ".join(f"{core.HOLDERS[h]}@{tick}" for h, tick in schedule)


def _drawn(bound: Bound, sample: int, seed: int) -> list[Schedule]:
    """`sample` schedules, each a random walk of the bound drawn with `seed`."""
    chance, drawn = random.Random(seed), []
    for _ in range(sample):
        tick, positions, schedule = 0, [0] * bound.holders, list[tuple[int, int]]()
        while len(schedule) < bound.holders * len(bound.program):
            h, tick = chance.choice(list(_next(bound, tick, tuple(positions))))
            positions[h] += 1
            schedule.append((h, tick))
        drawn.append(tuple(schedule))
    return drawn


# --- the table ---


def table(bound: Bound, receivers: tuple[Place, ...], ends: Counter[frozenset[Any]],
          states: int, calls: int, found: dict[Any, list[Walked]],
          smallest: dict[Any, Schedule]) -> dict[str, Any]:
    """What the search found, as JSON: the schedules in each class at each place (a schedule
    counts in every class it shows), the schedules failing each check, and witnesses."""
    schedules, formula = bound.count()

    def having(*start: Any) -> int:
        """The schedules with a flag that begins with `start`."""
        return sum(count for flags, count in ends.items()
                   if any(f[:len(start)] == start for f in flags))

    names = [place.name for place in receivers]
    witnesses = {f"{names[f[1]]} {core.CLASSES[f[2]].name}": [
        core.as_json(w.run.events[f[1]]) for w in steps]
        for f, steps in found.items() if f[0] == "class"}
    shown = {f"{names[f[1]]} {core.CLASSES[f[2]].name}": (_said(smallest[f]), _lines(
        bound, steps, f[1])) for f, steps in found.items() if f[0] == "class"}
    failures = {}
    for (_, check, place), steps in sorted(found.items(), key=lambda item: (  # the library
            str(item[0][:2]), item[0][2] != "authority", str(item[0]))):  # first, if it failed
        if _ != "failed" or check in failures:
            continue
        column = 0 if place == "authority" else int(place)
        where = "authority" if place == "authority" else names[int(place)]
        failures[check] = {"at": where,
                           "events": [core.as_json(w.run.events[column]) for w in steps],
                           "schedule": _said(smallest[_, check, place]),
                           "lines": _lines(bound, steps, column)}
    return {
        "bound": dataclasses.asdict(bound),
        "schedules": schedules, "formula": formula, "counted": sum(ends.values()),
        "states": states, "calls_played": calls,
        "leases_can_expire": bound.ttl <= bound.last_tick,
        "receivers": {place.name: place.says for place in receivers},
        "kinds": {**{cls.name: cls.kind for cls in core.CLASSES}, "clean": "neither"},
        "classes": {name: {**{cls.name: having("class", p, c)
                              for c, cls in enumerate(core.CLASSES)},
                           "clean": schedules - having("class", p)}
                    for p, name in enumerate(names)},
        "violations": {check: having("failed", check)
                       for check in core.CHECKS},
        "witnesses": dict(sorted(witnesses.items())),
        "shown": shown,
        "failures": failures,
        "replay": core.command(bound, receivers, "steps", "SCHEDULE"),
    }


def _lines(bound: Bound, steps: list[Walked], p: int) -> list[str]:
    """A witness at place p as a reader sees it: each step's answer, and for a write the
    pair stored before and after (as read, in a replay; else as the receiver said) and the
    contract's answer; each step's failed checks; then each resource's verdict, alone."""
    lines = []
    for w in steps:
        e = core.as_json(w.run.events[p])
        where = f"  {w.resource:<16}" if bound.resources > 1 else ""
        epoch = f"epoch {e['epoch']}" if e["epoch"] is not None and e["outcome"] != "held" \
            else ""
        if e["action"] == "write" and e["value"] is not None:
            before, after = w.run.seen[p] if w.run.seen else (
                w.stored[p], None if e["stored_epoch"] is None else (e["stored_epoch"],
                                                                     e["stored_value"]))
            detail = (f"{e['value']!r}: stored {core.shown_pair(before)} -> "
                      f"{core.shown_pair(after)}; the contract: {w.expected[p]}")
        elif e["outcome"] == "held":
            detail = f"by epoch {e['epoch']}, live until tick {e['expires_at']}"
        elif e["expires_at"] is not None:
            detail = f"lease until tick {e['expires_at']}"
        else:
            detail = ""
        lines.append(f"  tick {e['tick']:>2}  {e['actor']}{where}  {e['action']:<7}  "
                     f"{epoch:<8}  {e['outcome']:<8}  {detail}".rstrip())
        failed = [check for check, place in w.failed if place in ("authority", str(p))]
        if failed:
            lines.append(f"      failed: {', '.join(dict.fromkeys(failed))}")
    for resource in dict.fromkeys(w.resource for w in steps):  # each judged alone
        events = [core.as_event(core.as_json(w.run.events[p])) for w in steps
                  if w.resource == resource]
        try:
            verdict = judge([e for e in events if not str(e.outcome).startswith("raised")])
        except ValueError:  # a broken library's events need not make a verdict
            continue
        name = f"{resource}: " if bound.resources > 1 else ""
        lines.append(f"  {name}final value written by {verdict['final_value_written_by']}; "
                     f"stale writes refused: {verdict['stale_writes_refused']}, conflicting: "
                     f"{verdict['conflicting_writes_refused']}")
        lines += [f"  {name}{cls.name}: {cls.says}" for cls in run_experiment.CLASSES
                  if verdict[cls.field] is True]
    return lines


_SHOWN = ("lost update", "stale refused", "gap")  # the witnesses shown when no check fails

def report(table_: dict[str, Any], seconds: float) -> str:
    """The table as a reader sees it, with the smallest schedule of each harm, or of the
    first check failed."""
    bound, counts = Bound(**{**table_["bound"], "program": tuple(table_["bound"]["program"])}), \
        table_["classes"]
    failed = [name for name, count in table_["violations"].items() if count]
    lines = [
        f"every schedule of {bound.said()}",
        f"  {table_['schedules']:,} schedules = {table_['formula']}",
        f"  {table_['states']:,} states, {table_['calls_played']:,} calls played, {seconds:.1f} s",
        "  a schedule counts in every class it shows at least once",
        f"  {'schedules with':<30}{'kind':<12}{''.join(f'{r:>12}' for r in counts)}",
        *(f"  {name:<30}{kind:<12}{''.join(f'{c[name]:>12,}' for c in counts.values())}"
          for name, kind in table_["kinds"].items()),
        *(f"  {name}: {says}" for name, says in table_["receivers"].items()),
        f"  checks failed: {', '.join(failed) or 'none'} (of: {', '.join(core.CHECKS)})",
    ]
    if not table_["leases_can_expire"]:
        lines.append(f"  no lease can expire by tick {bound.last_tick} (ttl {bound.ttl}): "
                     "no write can be late, so no gap or lost update, whatever the code")
    replay = table_["replay"]
    if failed:
        failure = table_["failures"][failed[0]]
        shown = [((f"the smallest schedule failing {failed[0]!r} (at {failure['at']}), failing "
                   "again played whole from a fresh start, stored pairs as read"),
                  failure["schedule"], failure["lines"])]
    else:
        names = list(table_["receivers"])
        yours = names[0] if len(names) == 1 else None
        wanted = ([f"{yours} {name}" for name in _SHOWN] if yours
                  else ["unfenced lost update", "fenced stale refused", "fenced gap"])
        shown = [(f"the smallest {name}", *table_["shown"][name]) for name in wanted
                 if name in table_["shown"]]
    for title, schedule, said in shown:
        lines += [title, *said, f"  again: {replay.replace('SCHEDULE', shlex.quote(schedule))}"]
    return "\n".join(lines)


def parse(bound: Bound, witness: str) -> Schedule:
    """A step mode witness as printed ("A@0 A@0 B@1"): ValueError naming what does not fit
    the bound."""
    schedule, counts, tick = [], Counter[int](), 0
    for token in witness.replace(",", " ").split():
        found = re.fullmatch(r"([A-H])@(\d+)", token)
        h = core.HOLDERS.index(found.group(1)) if found else bound.holders
        if not found or h >= bound.holders or not tick <= int(found.group(2)) <= \
                bound.last_tick or counts[h] == len(bound.program):
            raise ValueError(f"the witness {witness!r}: {token!r} is no step of this bound "
                             f"({bound.said()}): a holder, @, a tick that never goes back")
        tick, counts[h] = int(found.group(2)), counts[h] + 1
        schedule.append((h, tick))
    return tuple(schedule)


def replay_steps(bound: Bound, receivers: tuple[Place, ...],
                 schedule: Schedule) -> tuple[str, bool]:
    """A step mode witness played again alone, in a fresh process: each place's timeline."""
    with contextlib.ExitStack() as cleanup:
        steps = core.Fresh(replay, (bound, receivers, schedule), cleanup).result()
    failed = sorted({check for w in steps for check, _ in w.failed})
    lines = [(f"the schedule {_said(schedule)} of {bound.said()}, played again whole in a "
              "new process, stored pairs as read")]
    for p, place in enumerate(receivers):
        lines += [f"at {place.name} ({place.says}):", *_lines(bound, steps, p)]
    lines.append(f"  checks failed: {', '.join(failed) or 'none'} (of: {', '.join(core.CHECKS)})")
    return "\n".join(lines), not failed
