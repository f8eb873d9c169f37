"""Check that README.md still says what the code does, so that CI fails in seconds on a drift.

Run it as `python3 .ci/check_contract.py`, from any folder; it reads the repository it sits in.
The checks, cheapest first:

1. diagrams: every scenario in results.json has exactly one ```mermaid sequence diagram in
   README.md, under its heading "### `name`: ...", in the same order, and each diagram is byte
   for byte the one `draw` makes from the scenario's events: every tick, epoch, expiry, outcome
   and stored (epoch, value), the receiver's fenced or unfenced label and every note come from
   results.json by a fixed rule, so no number in a diagram is written by hand.
2. prose: in the scenarios' section, every `field: value` under a scenario's heading is that scenario's
   verdict in results.json, every "tick N" and "epoch N" in its paragraphs is one of its own,
   the final value's writer is its own, and the common setup ("A acquires at tick 0 with ttl
   10 ...") is every scenario's first event.
3. tests: every `Class.test_name` that README.md cites is a method of that class in
   test_leases.py, every test there is cited at least once, every rule of the contract cites
   one, every concurrency test still forces its interleaving (calls `_try_to_overtake`), and
   wherever README.md says "N tests", N is the number of tests in the file.
4. exit codes: the codes under "exit codes:" in `run_experiment.py --help` and the rows of
   README.md's | exit code | meaning | table are the same, with the same meanings.
5. numbers: each value in STATED (a limit, a timeout) appears in README.md, every time, as
   the code has it, and every "exit N" is one of the code's exit codes.  The table of
   evidence fields names exactly the fields of results.json, the verdict's included.
6. examples: every ```python block of README.md runs as a script of its own, and exits 0.
7. exploration: the default bound README.md describes is the code's, and its table of that
   bound (schedules, states, transitions, each class at each receiver) is a fresh --explore's.
8. breakages: each row of README.md's | file | replace this | with this | caught by | table is
   applied alone to a scratch copy of the code, where the whole suite then runs: the text must
   occur exactly once, the suite must fail, and every test the row names must have failed.

One line is printed per check that passes and one per drift, and any drift exits 1.  The
breakage check takes seconds rather than milliseconds, so it runs only once the others pass.
Nothing is left behind: the scratch copies live in one temporary folder, removed at the end.
"""

import ast
import concurrent.futures
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = "README.md"
TESTS = "test_leases.py"
EVIDENCE = "results.json"
# The scenario and command-line tests spawn run_experiment.py from the test file's folder and
# compare its run with results.json there, so a scratch copy needs all four files.
SCRATCH_FILES = ("leases.py", "run_experiment.py", TESTS, EVIDENCE)
# A suite takes 2-4 s, broken or not, except that a deferred BEGIN sometimes kills a worker of
# the concurrent-acquisitions test while it holds the lease, and that test then waits out its
# own 30 s bound.  This only bounds a break that makes the tests hang.
SUITE_TIMEOUT = 60.0
# Each suite already runs several processes at once; two suites keep two cores busy.
PARALLEL_SUITES = 2

# README's sections: the scenarios (their prose is checked), and the contract (each rule cites).
SCENARIOS_SECTION = "1"
CONTRACT_SECTION = "2"
CITATION = re.compile(r"\b([A-Z]\w*)\.(test\w*)\b")
TEST_COUNT = re.compile(r"\b(\d+) tests\b")
SCENARIO_HEADING = re.compile(r"^###\s+`([^`]+)`")
HEADING = re.compile(r"^#{1,6}\s")
TABLE_DELIMITER = re.compile(r"^\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")
# unittest's report of a failed test: "FAIL: test_x (test_leases.Class.test_x)" from 3.11,
# "FAIL: test_x (test_leases.Class)" before; an ERROR looks the same.
FAILED_TEST = re.compile(r"^(?:FAIL|ERROR): (\w+) \(([\w.]+)\)", re.MULTILINE)


class Drift(Exception):
    """README.md and the code disagree; the message says where and how, in one line."""


# --- reading the README ---


@dataclasses.dataclass(frozen=True)
class Table:
    """A markdown table: its column names, lowercased, and each row with its line number."""

    line: int
    columns: tuple[str, ...]
    rows: tuple[tuple[int, dict[str, str]], ...]


def _cells(line: str) -> list[str]:
    # A pipe inside a cell, code spans included, is written \| in a table.
    inner = line.strip().removeprefix("|")
    if inner.endswith("|") and not inner.endswith("\\|"):
        inner = inner[:-1]
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", inner)]


def _tables(lines: Sequence[str]) -> Iterator[Table]:
    index = 0
    while index + 1 < len(lines):
        header, delimiter = lines[index], lines[index + 1]
        if not (header.lstrip().startswith("|") and TABLE_DELIMITER.match(delimiter)):
            index += 1
            continue
        columns = tuple(cell.lower() for cell in _cells(header))
        rows = []
        index += 2
        while index < len(lines) and lines[index].lstrip().startswith("|"):
            rows.append((index + 1, dict(zip(columns, _cells(lines[index])))))
            index += 1
        yield Table(index - len(rows) - 1, columns, tuple(rows))


def _table(lines: Sequence[str], *columns: str) -> Table:
    """The one table in README.md that has all of `columns`."""
    found = [table for table in _tables(lines) if set(columns) <= set(table.columns)]
    wanted = " | ".join(columns)
    if not found:
        raise Drift(f"{README} has no table with the columns | {wanted} |")
    if len(found) > 1:
        lines_at = ", ".join(str(table.line) for table in found)
        raise Drift(f"{README} has {len(found)} tables with the columns | {wanted} |, at lines "
                    f"{lines_at}; keep one")
    return found[0]


def _code(cell: str, line: int, column: str) -> str:
    """The text of a cell that is one `code span`; in it, \\n stands for a line break."""
    match = re.fullmatch(r"(`+)(.+?)\1", cell, re.DOTALL)
    if match is None or match.group(1) in match.group(2):
        raise Drift(f"{README} line {line}: the {column!r} cell {cell!r} is not one `code span`")
    text = match.group(2)
    if text.startswith(" ") and text.endswith(" ") and text.strip():  # as markdown reads it
        text = text[1:-1]
    return text.replace("\\n", "\n")


def _read(name: str) -> str:
    try:
        with open(os.path.join(ROOT, name), encoding="utf-8") as file:
            return file.read()
    except OSError as exc:
        raise Drift(f"cannot read {name}: {exc.strerror or exc}") from None


# --- check 1: the diagrams are drawn from results.json ---


def draw(record: dict[str, Any]) -> str:
    """The sequence diagram of one scenario, every number and every note taken from its events.

    The participants are the first worker, the authority, the other workers, the receiver.  A
    note marks each new tick; it says whose lease expires at that tick, or that a worker
    resumes after its lease expired, or that it retries a write it already sent.  A worker that
    goes quiet right after an acquisition gets a note saying so.
    """
    events = record["events"]
    for number, event in enumerate(events):
        if event["action"] not in ("acquire", "write"):
            raise Drift(f"{EVIDENCE}: scenario `{record['name']}`, event {number}, has an action "
                        f"{event['action']!r} that .ci/check_contract.py cannot draw yet")
    actors = list(dict.fromkeys(event["actor"] for event in events))
    first = actors[0]
    lines = [
        "sequenceDiagram",
        f"    participant {first} as worker {first}",
        "    participant Au as authority",
        *(f"    participant {actor} as worker {actor}" for actor in actors[1:]),
        f"    participant R as receiver ({record['receiver']})",
    ]
    expires: dict[str, int] = {}  # each actor's latest expiry tick
    latest: dict[str, int] = {}  # the index of each actor's latest event
    sent: dict[str, set[tuple[int, str]]] = {actor: set() for actor in actors}
    for index, event in enumerate(events):
        actor, tick = event["actor"], event["tick"]
        if index == 0 or tick != events[index - 1]["tick"]:
            notes = [f"{other}'s lease expires" for other in actors if expires.get(other) == tick]
            paused = actor in latest and latest[actor] != index - 1
            expired = actor in expires and tick >= expires[actor]
            if event["action"] == "write" and (event["epoch"], event["value"]) in sent[actor]:
                notes.append(f"{actor} retries the same write")
            elif paused and expired:
                notes.append(f"{actor} resumes late")
            said = f"tick {tick}: {'; '.join(notes)}" if notes else f"tick {tick}"
            lines.append(f"    Note over {first},R: {said}")
        lines += _messages(event)
        if event["action"] == "acquire":
            expires[actor] = event["expires_at"]
            lines += _pause_note(events, index)
        else:
            sent[actor].add((event["epoch"], event["value"]))
        latest[actor] = index
    return "\n".join(lines)


def _messages(event: dict[str, Any]) -> list[str]:
    """A request and its reply."""
    actor, outcome = event["actor"], event["outcome"]
    if event["action"] == "acquire":
        granted = f"epoch {event['epoch']}, expires at tick {event['expires_at']}"
        return [
            f"    {actor}->>Au: acquire, ttl {event['expires_at'] - event['tick']}",
            f"    Au-->>{actor}: " + (granted if outcome == "granted" else f"{outcome}, {granted}"),
        ]
    holds = "holds" if outcome == "applied" else "still holds"
    stored = f"({event['stored_epoch']}, {_quoted(event['stored_value'])})"
    return [
        f"    {actor}->>R: write epoch {event['epoch']}, {_quoted(event['value'])}",
        f"    R-->>{actor}: {outcome}, {holds} {stored}",
    ]


def _quoted(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def _pause_note(events: list[dict[str, Any]], index: int) -> list[str]:
    """A note if the actor of the acquisition at `index` acts again, but not next."""
    actor = events[index]["actor"]
    later = [i for i in range(index + 1, len(events)) if events[i]["actor"] == actor]
    if not later or later[0] == index + 1:
        return []
    resumes = events[later[0]]
    if resumes["tick"] >= events[index]["expires_at"]:  # its lease ran out while it paused
        return [f"    Note over {actor}: pauses, still holding epoch {events[index]['epoch']}"]
    doing = {"acquire": "acquiring", "write": "writing"}[resumes["action"]]
    return [f"    Note over {actor}: pauses before {doing}"]


def _diagrams(lines: Sequence[str]) -> Iterator[tuple[int, str | None, str]]:
    """Each mermaid sequence diagram: its first line, the scenario heading it sits under, text."""
    scenario = None
    index = 0
    while index < len(lines):
        line = lines[index]
        if HEADING.match(line):
            heading = SCENARIO_HEADING.match(line)
            scenario = heading.group(1) if heading else None
        if line.strip() == "```mermaid":
            end = index + 1
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            text = "\n".join(lines[index + 1 : end])
            # Front matter or an %%{init}%% line may come first; other kinds are not evidence.
            if "sequenceDiagram" in text:
                yield index + 2, scenario, text
            index = end
        index += 1


def _records() -> list[dict[str, Any]]:
    """The scenarios of results.json."""
    try:
        records: list[dict[str, Any]] = json.loads(_read(EVIDENCE))["scenarios"]
    except (ValueError, KeyError, TypeError) as exc:
        raise Drift(f"{EVIDENCE} is not an evidence document: {exc}") from None
    return records


def check_diagrams(readme: Sequence[str]) -> str:
    records = _records()
    names = [record["name"] for record in records]
    diagrams = list(_diagrams(readme))
    for line, scenario, _ in diagrams:
        if scenario is None:
            raise Drift(f"{README} line {line}: a sequence diagram under no '### `scenario`' "
                        f"heading")
        if scenario not in names:
            raise Drift(f"{README} line {line} draws scenario `{scenario}`, which {EVIDENCE} "
                        f"does not have")
    drawn = [scenario for _, scenario, _ in diagrams]
    for name in names:
        if drawn.count(name) != 1:
            raise Drift(f"{README} has {drawn.count(name)} diagrams of scenario `{name}`; "
                        f"{EVIDENCE} needs exactly one")
    if drawn != names:
        raise Drift(f"{README} draws the scenarios in the order {', '.join(map(str, drawn))}, "
                    f"but {EVIDENCE} has {', '.join(names)}")
    for (line, scenario, text), record in zip(diagrams, records):
        try:
            drawn_text = draw(record)
        except (KeyError, TypeError) as exc:  # an event without a field, or with a null one
            raise Drift(f"{EVIDENCE}: cannot draw scenario `{scenario}`: "
                        f"{type(exc).__name__}: {exc}") from None
        _compare(line, scenario, text.split("\n"), drawn_text.split("\n"))
    return f"diagrams: {len(names)} scenarios, each drawn exactly as {EVIDENCE} has it"


def _compare(line: int, scenario: str | None, shown: list[str], wanted: list[str]) -> None:
    """A Drift naming the first line where the README's diagram and the drawn one part."""
    ended = "(the diagram ends)"
    for offset in range(max(len(shown), len(wanted))):
        has = shown[offset] if offset < len(shown) else ended
        gives = wanted[offset] if offset < len(wanted) else ended
        if has != gives:
            raise Drift(f"{README} line {line + offset}, diagram of `{scenario}`: it has "
                        f"{has.strip()!r}, but {EVIDENCE} gives {gives.strip()!r}")


# --- check 2: cited tests exist, and every test is cited ---


def _test_methods() -> dict[str, dict[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Each class in test_leases.py and its test methods, as unittest would find them."""
    tree = ast.parse(_read(TESTS), TESTS)
    return {
        node.name: {
            item.name: item
            for item in node.body
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
            and item.name.startswith("test")  # unittest's testMethodPrefix
        }
        for node in tree.body
        if isinstance(node, ast.ClassDef)
    }


def check_tests(readme: Sequence[str]) -> str:
    classes = _test_methods()
    cited: set[str] = set()
    for number, line in enumerate(readme, start=1):
        for match in CITATION.finditer(line):
            name, method = match.groups()
            if name not in classes:
                raise Drift(f"{README} line {number} cites {match.group()}, but {TESTS} has "
                            f"no class {name}")
            if method not in classes[name]:
                raise Drift(f"{README} line {number} cites {match.group()}, but class {name} "
                            f"in {TESTS} has no method {method}")
            cited.add(match.group())
    tests = [f"{name}.{method}" for name, methods in classes.items() for method in methods]
    uncited = [test for test in tests if test not in cited]
    if uncited:
        raise Drift(f"{README} never cites {', '.join(uncited)} from {TESTS}")
    for number, line in enumerate(readme, start=1):
        for match in TEST_COUNT.finditer(line):
            if int(match.group(1)) != len(tests):
                raise Drift(f"{README} line {number} says {match.group()}, but {TESTS} has "
                            f"{len(tests)}")
    # Section 4: "Each guarantee names the test ... that demonstrates it".
    guarantee: tuple[int, str] | None = None
    for number, line in [*_section(readme, CONTRACT_SECTION), (0, "")]:
        start = re.match(r"(\d+)\. ", line)
        if start or not line.strip():
            if guarantee is not None and not CITATION.search(guarantee[1]):
                raise Drift(f"{README} line {guarantee[0]}: rule {guarantee[1].split('.')[0]}"
                            f" of section {CONTRACT_SECTION} names no test")
            guarantee = (number, line) if start else None
        elif guarantee is not None:
            guarantee = (guarantee[0], guarantee[1] + " " + line)
    # The breakages are caught "every time, since each concurrency test forces its
    # interleaving".
    for name, methods in classes.items():
        for method, node in methods.items():
            if "concurrent" in method and not _calls(node, "_try_to_overtake"):
                raise Drift(f"{name}.{method} no longer forces an interleaving "
                            f"(_try_to_overtake), as {README} says each concurrency test does")
    return f"tests: all {len(tests)} in {TESTS} cited, each guarantee names one"


def _calls(node: ast.AST, function: str) -> bool:
    """Whether the code under `node` calls `function` by name."""
    return any(
        isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == function
        for call in ast.walk(node)
    )


# --- check 3: the exit codes of --help are the README's ---


def _help_exit_codes() -> dict[int, str]:
    """Each exit code under "exit codes:" in `run_experiment.py --help`, and its meaning."""
    run = subprocess.run(
        [sys.executable, "run_experiment.py", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if run.returncode != 0:
        raise Drift(f"run_experiment.py --help exited {run.returncode}: "
                    f"{(run.stderr.strip().splitlines() or [''])[-1]}")
    lines = run.stdout.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip().lower() == "exit codes:"]
    codes: dict[int, str] = {}
    code = None
    for line in lines[starts[0] + 1 :] if starts else []:
        if not line.strip():  # the section ends at a blank line
            break
        # "  130  meaning ...": a code, then its meaning; a line with no code continues it.
        match = re.match(r"\s*(\d+)\s+(.*)", line)
        if match:
            code = int(match.group(1))
            codes[code] = match.group(2).strip()
        elif code is not None:
            codes[code] += " " + line.strip()
    if not codes:
        raise Drift("run_experiment.py --help lists no exit codes under 'exit codes:'")
    return codes


def check_exit_codes(readme: Sequence[str]) -> str:
    """README's exit-code table says what --help says: the same codes, the same meanings."""
    helped = _help_exit_codes()
    table = _table(readme, "exit code", "meaning")
    documented: dict[int, tuple[int, str]] = {}
    for line, row in table.rows:
        cell = row.get("exit code", "").strip("`")
        if not cell.isdigit():
            raise Drift(f"{README} line {line}: exit code {cell!r} is not one number")
        documented[int(cell)] = (line, " ".join(row.get("meaning", "").split()))

    def listed(codes: set[int]) -> str:
        names = ", ".join(map(str, sorted(codes)))
        return f"exit code {names} is" if len(codes) == 1 else f"exit codes {names} are"

    if helped.keys() - documented.keys():
        raise Drift(f"{listed(helped.keys() - documented.keys())} in run_experiment.py --help "
                    f"but not in {README}'s exit-code table (line {table.line})")
    if documented.keys() - helped.keys():
        raise Drift(f"{listed(documented.keys() - helped.keys())} in {README}'s exit-code table "
                    f"(line {table.line}) but not in run_experiment.py --help")
    for code, (line, meaning) in sorted(documented.items()):
        if meaning != helped[code]:
            raise Drift(f"{README} line {line}: exit code {code} means {meaning!r}, but "
                        f"run_experiment.py --help says {helped[code]!r}")
    return (f"exit codes: --help and {README} give {', '.join(map(str, sorted(helped)))} the "
            f"same meanings")


# --- check 4: the numbers README states are the code's ---


def _constants() -> dict[str, Any]:
    """The modules' named values, imported from ROOT (importing them starts nothing)."""
    sys.path.insert(0, ROOT)
    try:
        import leases
        import run_experiment
    finally:
        sys.path.remove(ROOT)
    return {
        **{f"leases.{name}": value for name, value in vars(leases).items()},
        **{f"run_experiment.{name}": value for name, value in vars(run_experiment).items()},
    }


# Each named value, and the pattern by which README states it (its one group, read by the
# function, must give the value): a change to one must change the other, everywhere.
STATED: tuple[tuple[str, str, Callable[[str], object]], ...] = (
    ("leases.BUSY_TIMEOUT_SECONDS", r"busy timeout of (\d+) s", float),
    ("run_experiment.DEFAULT_TIMEOUT", r"given up after (\d+) s", float),
    ("run_experiment._MAX_EXPECTED_BYTES", r"at most (\d+) MiB", lambda text: int(text) * 2**20),
    ("run_experiment._SHOWN_DIFFERENCES", r"first (\d+) differing", int),
    ("run_experiment.EXIT_SIGNALLED", r"exit (\d+) plus", int),
)


def check_numbers(readme: Sequence[str]) -> str:
    """Every number README states about the code (STATED, and each "exit N") is the code's."""
    text = " ".join(" ".join(readme).split())
    values = _constants()
    stated = 0
    for name, pattern, read in STATED:
        if name not in values:
            raise Drift(f"{name}, which {README} states, is gone from the code")
        found = re.findall(pattern, text)
        if not found:
            raise Drift(f"{README} no longer states {name} ({values[name]!r}) as /{pattern}/")
        for said in found:
            if read(said) != values[name]:
                raise Drift(f"{README} says {said} where /{pattern}/ states {name}, which is "
                            f"{values[name]!r}")
        stated += len(found)
    codes = {code for code, _ in values["run_experiment.EXIT_CODES"]}
    for said in re.findall(r"\bexits? (\d+)\b(?! plus)", text):
        if int(said) not in codes:
            raise Drift(f"{README} speaks of exit {said}, which run_experiment.EXIT_CODES lacks")
        stated += 1
    return f"numbers: {stated} stated in {README}, each the code's own"


def check_fields(readme: Sequence[str]) -> str:
    """The | field | meaning | table names exactly the fields of a scenario's record,
    and its verdict row names every field of the verdict."""
    table = _table(readme, "field", "meaning")
    named = {row.get("field", "").strip("`"): (line, row.get("meaning", "")) for line, row in
             table.rows}
    for record in _records():
        if set(named) != set(record):
            raise Drift(f"{README} line {table.line}: the evidence table names "
                        f"{sorted(set(named) - set(record)) or 'no extra field'} and misses "
                        f"{sorted(set(record) - set(named)) or 'none'} of `{record['name']}`")
        line, meaning = named["verdict"]
        missing = [field for field in record["verdict"] if f"`{field}`" not in meaning]
        if missing:
            raise Drift(f"{README} line {line}: the verdict's meaning leaves out "
                        f"{', '.join(missing)}")
    return f"fields: the evidence table names every field of {EVIDENCE}, and no other"


# --- check 5: the prose of the scenarios' section says what results.json says ---


def check_prose(readme: Sequence[str]) -> str:
    """The scenarios' paragraphs: the common setup, and what each says of its own scenario."""
    records = {record["name"]: record for record in _records()}
    claims = 0
    for number, paragraph, under in _paragraphs(_section(readme, SCENARIOS_SECTION)):
        claims += _check_setup(number, paragraph, records)
        for field, value in re.findall(r"`(\w+): ([^`]+)`", paragraph):
            if under not in records:
                raise Drift(f"{README} line {number} states `{field}: {value}` under no "
                            f"scenario of {EVIDENCE}")
            verdict = records[under]["verdict"]
            if field not in verdict or json.dumps(verdict[field]) != value:
                raise Drift(f"{README} line {number} says `{field}: {value}` of `{under}`, "
                            f"but {EVIDENCE} has {json.dumps(verdict.get(field))}")
            claims += 1
        if under in records:  # about one scenario: its ticks, epochs and final writer
            claims += _check_sentence(number, paragraph, records[under])
    if not claims:
        raise Drift(f"{README} section {SCENARIOS_SECTION} states nothing this check can compare")
    return f"prose: {claims} statements in section {SCENARIOS_SECTION} agree with {EVIDENCE}"


def _check_setup(number: int, paragraph: str, records: dict[str, dict[str, Any]]) -> int:
    """1 if the paragraph states the setup common to all scenarios, which must be each one's."""
    setup = re.search(r"A acquires at tick (\d+) with ttl (\d+), so its lease expires at "
                      r"tick (\d+)", paragraph)
    if not setup:
        return 0
    said = tuple(map(int, setup.groups()))
    for name, record in records.items():
        first = record["events"][0]
        actual = (first["tick"], first["expires_at"] - first["tick"], first["expires_at"])
        if (first["actor"], first["action"]) != ("A", "acquire") or actual != said:
            raise Drift(f"{README} line {number} says A acquires at tick {said[0]} with ttl "
                        f"{said[1]}, expiring at tick {said[2]}, but in scenario `{name}` "
                        f"{EVIDENCE} has {first['actor']} {first['action']} at tick "
                        f"{actual[0]}, expiring at tick {actual[2]}")
    return 1


def _paragraphs(lines: Sequence[tuple[int, str]]) -> Iterator[tuple[int, str, str | None]]:
    """Each paragraph of prose (not code), joined: its first line, its text, its scenario."""
    scenario, start, fenced = None, 0, False
    text: list[str] = []
    for number, line in [*lines, (0, "")]:
        if line.strip().startswith("```"):
            fenced = not fenced
        heading = SCENARIO_HEADING.match(line)
        if fenced or not line.strip() or heading or line.strip().startswith("```"):
            if text:
                yield start, " ".join(text), scenario
            text = []
            scenario = heading.group(1) if heading else scenario
        elif not line.startswith("    "):  # an indented block is code too
            start, text = (start if text else number), [*text, line.strip()]


def _check_sentence(number: int, line: str, record: dict[str, Any]) -> int:
    """How many facts of `record` the line states; a Drift if one of them is not the JSON's."""
    events = record["events"]
    known = {
        "tick": {event["tick"] for event in events} | {event["expires_at"] for event in events},
        "epoch": {event["epoch"] for event in events},
    }
    claims = 0
    for kind, value in re.findall(r"\b(tick|epoch)[ -](\d+)\b", line, re.IGNORECASE):
        if int(value) not in known[kind.lower()]:
            raise Drift(f"{README} line {number} speaks of {kind} {value} in `{record['name']}`, "
                        f"which {EVIDENCE} has nowhere among its {kind.lower()}s")
        claims += 1
    writer = record["verdict"]["final_value_written_by"]
    for said in re.findall(r"final value is (\w+)'s|(\w+)'s value final", line):
        actor = said[0] or said[1]
        if actor != writer:
            raise Drift(f"{README} line {number} says the final value of `{record['name']}` is "
                        f"{actor}'s, but {EVIDENCE} has it written by {writer}")
        claims += 1
    return claims


def _section(readme: Sequence[str], number: str) -> list[tuple[int, str]]:
    """The numbered lines of README's section `number` ("## 3. ..."), up to the next one."""
    lines: list[tuple[int, str]] = []
    inside = False
    for index, line in enumerate(readme, start=1):
        if line.startswith("## "):
            inside = line.startswith(f"## {number}.")
        elif inside:
            lines.append((index, line))
    if not lines:
        raise Drift(f"{README} has no section '## {number}.'")
    return lines


# --- check 6: every listed breakage is caught by the tests README names ---


@dataclasses.dataclass(frozen=True)
class Breakage:
    """One row of the table: put `new` in place of `old` in `file`; `caught_by` must fail."""

    line: int
    label: str
    file: str
    old: str
    new: str
    caught_by: tuple[str, ...]

    def __str__(self) -> str:
        return f"breakage {self.label!r} ({README} line {self.line})"


def _breakages(readme: Sequence[str]) -> list[Breakage]:
    table = _table(readme, "file", "replace this", "with this", "caught by")
    if not table.rows:
        raise Drift(f"{README} line {table.line}: the breakage table has no rows")
    breakages = []
    for line, row in table.rows:
        file = _code(row.get("file", ""), line, "file")
        if file not in SCRATCH_FILES:
            raise Drift(f"{README} line {line}: breakage in {file!r}, which is not one of the "
                        f"files a scratch copy holds ({', '.join(SCRATCH_FILES)})")
        caught_by = tuple(match.group() for match in CITATION.finditer(row.get("caught by", "")))
        if not caught_by:
            raise Drift(f"{README} line {line}: the breakage names no test that catches it")
        label = row.get("breakage", "").replace("`", "") or f"{file} at line {line}"
        old = _code(row.get("replace this", ""), line, "replace this")
        new = _code(row.get("with this", ""), line, "with this")
        breakages.append(Breakage(line, label, file, old, new, caught_by))
    return breakages


def _failed_tests(breakage: Breakage, folder: str) -> list[str]:
    """The tests that fail once `breakage` is applied to a fresh copy of the code in `folder`.

    A Drift if its text is not there exactly once, or if the suite passes or hangs.
    """
    os.mkdir(folder)
    for name in SCRATCH_FILES:
        shutil.copyfile(os.path.join(ROOT, name), os.path.join(folder, name))
    target = os.path.join(folder, breakage.file)
    with open(target, encoding="utf-8") as file:
        source = file.read()
    if source.count(breakage.old) != 1:
        raise Drift(f"{breakage}: its 'replace this' text occurs {source.count(breakage.old)} "
                    f"times in {breakage.file}, not exactly once")
    with open(target, "w", encoding="utf-8") as file:
        file.write(source.replace(breakage.old, breakage.new))
    # The tests' own temporary files go to the copy, so that leftovers vanish with it.
    scratch_tmp = os.path.join(folder, "tmp")
    os.mkdir(scratch_tmp)
    returncode, output = _run_suite(folder, {**os.environ, "TMPDIR": scratch_tmp})
    if returncode is None:
        raise Drift(f"{breakage}: the tests did not finish within {SUITE_TIMEOUT:g} s")
    failed = []
    for method, where in FAILED_TEST.findall(output):
        test = f"{where.removesuffix('.' + method).rsplit('.', 1)[-1]}.{method}"
        if test not in failed:  # a test with failed subtests is reported once per subtest
            failed.append(test)
    if returncode == 0 or not failed:
        raise Drift(f"{breakage}: the tests {'pass' if returncode == 0 else 'fail to run'} with "
                    f"it in place")
    return failed


def _run_suite(folder: str, env: dict[str, str]) -> tuple[int | None, str]:
    """Run the whole suite in `folder`: its exit code (None if it hung) and its report."""
    # A session of its own, so that a hung suite is stopped with every process it spawned.
    suite = subprocess.Popen(
        [sys.executable, "-m", "unittest", "-v", "test_leases"],
        cwd=folder,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, report = suite.communicate(timeout=SUITE_TIMEOUT)
    except subprocess.TimeoutExpired:
        if sys.platform == "win32":
            suite.kill()
        else:
            os.killpg(suite.pid, signal.SIGKILL)
        suite.communicate()
        return None, ""
    return suite.returncode, report


def check_breakages(readme: Sequence[str]) -> Iterator[tuple[bool, str]]:
    """(passed, line) per breakage, in the README's order; the suites run two at a time."""
    breakages = _breakages(readme)
    with tempfile.TemporaryDirectory(prefix="check-contract-") as folder, \
            concurrent.futures.ThreadPoolExecutor(PARALLEL_SUITES) as pool:
        runs = [
            pool.submit(_failed_tests, breakage, os.path.join(folder, f"break-{number}"))
            for number, breakage in enumerate(breakages, start=1)
        ]
        for breakage, run in zip(breakages, runs):
            try:
                failed = run.result()
            except Drift as drift:
                yield False, str(drift)
                continue
            missed = [test for test in breakage.caught_by if test not in failed]
            if missed:
                yield False, (f"{breakage}: {README} lists {', '.join(missed)} as catching "
                              f"it, but {'it' if len(missed) == 1 else 'they'} did not fail; "
                              f"the tests that failed: {', '.join(failed)}")
            else:
                extra = len(failed) - len(set(breakage.caught_by))
                also = f", and {extra} more" if extra else ""
                yield True, (f"{breakage} caught by {', '.join(failed)} (as listed{also})")


# --- check 7: README's examples run, and its table of the default exploration is a fresh one ---


def _blocks(readme: Sequence[str], language: str) -> Iterator[tuple[int, str]]:
    """Each fenced code block of `language`: its first line's number, and its text."""
    start = None
    for number, line in enumerate(readme, start=1):
        if start is None and line.strip() == f"```{language}":
            start, text = number + 1, []
        elif start is not None and line.strip() == "```":
            yield start, "\n".join(text) + "\n"
            start = None
        elif start is not None:
            text.append(line)


def check_examples(readme: Sequence[str]) -> str:
    """Every ```python block of README runs as a script of its own and exits 0."""
    blocks = list(_blocks(readme, "python"))
    if not blocks:
        raise Drift(f"{README} has no python example")
    with tempfile.TemporaryDirectory(prefix="check-examples-") as folder:
        for number, (line, text) in enumerate(blocks, start=1):
            script = os.path.join(folder, f"example_{number}.py")
            with open(script, "w", encoding="utf-8") as file:
                file.write(text)
            run = subprocess.run([sys.executable, script], cwd=folder, capture_output=True,
                                 text=True, timeout=120, check=False,
                                 env={**os.environ, "PYTHONPATH": ROOT})
            if run.returncode != 0:
                last = (run.stderr.strip().splitlines() or ["(no output)"])[-1]
                raise Drift(f"{README} line {line}: the example exits {run.returncode}: {last}")
    return f"examples: the {len(blocks)} python examples of {README} run"


def check_exploration(readme: Sequence[str]) -> str:
    """The default bound README describes, and its table, are what --explore gives now."""
    text = " ".join(" ".join(readme).split())
    said = re.search(r"The default bound, (\d+) holders × \(([a-z, ]+)\), ticks 0 to (\d+), "
                     r"ttl (\d+)", text)
    numbers = re.search(r"([\d,]+) schedules = multinomial.*? through ([\d,]+) states and "
                        r"([\d,]+) transitions", text)
    if said is None or numbers is None:
        raise Drift(f"{README} no longer describes the default bound of --explore")
    bound = _constants()["run_experiment.Bound"]()
    described = (int(said.group(1)), said.group(2), int(said.group(3)), int(said.group(4)))
    actual = (bound.holders, ", ".join(a.value for a in bound.program), bound.last_tick,
              bound.ttl)
    if described != actual:
        raise Drift(f"{README} describes the default bound as {described}, the code has {actual}")
    with tempfile.TemporaryDirectory(prefix="check-explore-") as folder:
        output = os.path.join(folder, "table.json")
        subprocess.run([sys.executable, "run_experiment.py", "--explore", "--output", output],
                       cwd=ROOT, capture_output=True, timeout=300, check=True)
        with open(output, encoding="utf-8") as file:
            table = json.load(file)
    stated = [int(n.replace(",", "")) for n in numbers.groups()]
    if stated != [table["schedules"], table["states"], table["transitions"]]:
        raise Drift(f"{README} says {stated} schedules, states and transitions; --explore gives "
                    f"{[table['schedules'], table['states'], table['transitions']]}")
    rows = _table(readme, "schedules with", "fenced", "unfenced").rows
    for line, row in rows:
        name = row["schedules with"].split(" (")[0]
        for receiver in ("fenced", "unfenced"):
            count = table["classes"][receiver].get(name)
            if count is None or int(row[receiver].replace(",", "")) != count:
                raise Drift(f"{README} line {line}: {receiver} {name!r} is {row[receiver]}, "
                            f"but --explore counts {count}")
    if {row["schedules with"].split(" (")[0] for _, row in rows} != set(table["classes"]["fenced"]):
        raise Drift(f"{README}'s exploration table does not have one row per class")
    if any(table["violations"].values()):
        raise Drift(f"--explore finds a failing check: {table['violations']}")
    return f"exploration: {README}'s table of the default bound is a fresh run's"


# --- running the checks ---


def main() -> int:
    started = time.monotonic()
    drifts = 0

    def report(passed: bool, line: str) -> None:
        nonlocal drifts
        drifts += not passed
        print(f"contract: {'' if passed else 'drift: '}{line}",
              file=sys.stdout if passed else sys.stderr, flush=True)

    try:
        readme = _read(README).splitlines()
        quick: list[Callable[[Sequence[str]], str]] = [
            check_diagrams, check_prose, check_fields, check_tests, check_exit_codes,
            check_numbers, check_examples, check_exploration,
        ]
        for check in quick:
            try:
                report(True, check(readme))
            except Drift as drift:
                report(False, str(drift))
        # The slow check waits for the quick ones: a drift there fails CI in a second.
        if not drifts:
            for passed, line in check_breakages(readme):
                report(passed, line)
        else:
            print("contract: breakages not replayed until the drift above is fixed",
                  file=sys.stderr, flush=True)
    except Drift as drift:
        report(False, str(drift))
    elapsed = time.monotonic() - started
    if drifts:
        print(f"contract: {drifts} drift(s), {elapsed:.1f} s", file=sys.stderr, flush=True)
        return 1
    print(f"contract: README.md agrees with the code, {elapsed:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
