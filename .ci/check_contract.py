"""Check that README.md says what the code does; prints "ok: ..." or "drift: ..." per check.

Each scenario in results.json has one ```mermaid sequence diagram, in order, under a heading that
names it in backticks; its arrows and "tick N" notes carry the events.  Each cited test exists,
each test is cited, "N tests" counts them.  | exit code | is EXIT_CODES, | field | the fields of
results.json, | schedules with | a fresh exploration, | a crash in | a fresh statement mode's.  Python, sql and sh blocks run (the others
are text or mermaid), and each | breakage | row, applied alone, fails the tests it names.  A sql
or python block followed by a text block of "resource epoch [sequence] value -> answer" lines
answers each as that line says, and as this library's fenced receiver does.
"""

import ast
import concurrent.futures
import functools
import importlib
import itertools
import json
import os
import pathlib
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
README, TESTS, EVIDENCE = "README.md", "test_leases.py", "results.json"
BREAKAGES = ".ci/breakages.md"  # its | breakage | rows: changes the named tests must catch
TIMEOUT = 60.0  # per command: a named test takes 0.01 to 1.2 s, the whole suite 4 s
CITATION = re.compile(r"\b[A-Z]\w*\.test\w*\b")
HEADING = re.compile(r"^#{1,6}\s")
FENCED = re.compile(r"^[ \t]*```([^\n]*)\n(.*?)^[ \t]*```[ \t]*$", re.MULTILINE | re.DOTALL)
# "FAIL: test_x (test_leases.Class.test_x)" from 3.11, "... (test_leases.Class)" before; ERROR too
FAILED_TEST = re.compile(r"^(?:FAIL|ERROR): (\w+) \(([\w.]+)\)", re.MULTILINE)
QUOTED = r'"(?:[^"\\]|\\.)*"'
TICK = re.compile(r"^\s*Note [^:]*:\s*tick (\d+)\b", re.MULTILINE)
# "A->>Au: acquire, ttl 10", then its answer: "epoch 1, ..." (a grant) or "<outcome>, ..."
ARROWS = re.compile(r"^\s*(\w+)->>\w+:\s*(\w+)(.*)\n\s*\w+-->>\w+:\s*(.*?)[ \t]*$", re.MULTILINE)
EVENT_FIELDS = ("tick", "actor", "action", "epoch", "value", "outcome", "expires_at",
                "stored_epoch", "stored_value")


class Drift(Exception):
    """README.md and the code disagree; the message says where and how, in one line."""


class Readme:
    """README.md's text, its code blocks (first line, language, text), and its prose."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.blocks = [(text.count("\n", 0, block.start()) + 2, block[1].strip(), block[2])
                       for block in FENCED.finditer(text)]
        # The code blanked, line for line, so that no "# comment" in a block is a heading.
        self.prose = FENCED.sub(lambda block: "\n" * block[0].count("\n"), text).splitlines()

    def table(self, first: str) -> tuple[int, list[str], list[tuple[int, dict[str, str]]]]:
        """The one table whose first column is `first`: its line, its columns and its rows."""
        starts = [index for index, line in enumerate(self.prose)
                  if line.startswith("|") and _cells(line)[0].lower() == first]
        if len(starts) != 1:
            raise Drift(f"{README} has {len(starts)} tables whose first column is {first!r}, not 1")
        columns = [cell.lower() for cell in _cells(self.prose[starts[0]])]
        below = enumerate(self.prose[starts[0] + 2 :], start=starts[0] + 2)  # past the |---|
        rows = [(index + 1, dict(zip(columns, _cells(line))))
                for index, line in itertools.takewhile(lambda row: row[1].startswith("|"), below)]
        return starts[0] + 1, columns, rows


def _cells(line: str) -> list[str]:
    """A table row's cells, from | to |; a pipe inside a cell is written \\|."""
    cells = re.split(r"(?<!\\)\|", line.strip()[1:-1])
    return [cell.strip().replace("\\|", "|") for cell in cells]


def _explorer() -> Any:
    """explore, the module beside run_experiment.py, or run_experiment while there is none."""
    name = "explore" if (ROOT / "explore.py").exists() else "run_experiment"
    return importlib.import_module(name)


def _copy() -> str:
    """A new scratch copy of the repository, but its dot-files, in the temporary folder."""
    folder = os.path.join(tempfile.mkdtemp(), "repo")
    return shutil.copytree(ROOT, folder, ignore=shutil.ignore_patterns(".*", "__pycache__"))


def _run(command: list[str], cwd: str) -> tuple[int | None, str]:
    """Its exit code (None if it hung, and was stopped with all it spawned) and its output."""
    process = subprocess.Popen(
        command, cwd=cwd, env={**os.environ, "TMPDIR": tempfile.gettempdir()},
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        output = process.communicate(timeout=TIMEOUT)[0]
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # not yet reaped, so its group is there
        process.communicate()
        return None, ""
    return process.returncode, output


def check_diagrams(readme: Readme) -> str:
    records = json.loads((ROOT / EVIDENCE).read_text(encoding="utf-8"))["scenarios"]
    names = [record["name"] for record in records]
    diagrams = [(line, text) for line, language, text in readme.blocks
                if language == "mermaid" and "sequenceDiagram" in text]
    drawn, plays = [], []
    for line, text in diagrams:  # the scenarios named in backticks in the heading above
        heading = next((row for row in reversed(readme.prose[:line]) if HEADING.match(row)), "")
        spans = [name for name in re.findall(r"`([^`]+)`", heading) if name in names]
        drawn += spans or [f"(none, line {line})"]
        plays += [(line, _branch(text, name)) for name in spans]
    if drawn != names:
        raise Drift(f"{README}'s sequence diagrams sit under headings naming {drawn}; "
                    f"{EVIDENCE} needs one each of {names}, in that order")
    for (line, text), record in zip(plays, records):
        wanted = [tuple(event.get(field) for field in EVENT_FIELDS) for event in record["events"]]
        for index, (shown, want) in enumerate(itertools.zip_longest(_arrows(line, text), wanted)):
            number, says = shown or (line, (None,) * len(EVENT_FIELDS))
            wrong = [f"{field} {said!r} ({EVIDENCE}: {value!r})" for field, said, value
                     in zip(EVENT_FIELDS, says, want or says) if said != value]
            if wrong or want is None:
                raise Drift(f"{README} line {number}, diagram of `{record['name']}`, event "
                            f"{index}: {', '.join(wrong) or f'not in {EVIDENCE}'}")
    return f"diagrams: {len(names)} scenarios, each arrow as {EVIDENCE} has it"


def _branch(text: str, name: str) -> str:
    """The diagram as scenario `name` plays it: of each alt/else block, only the branch whose
    label is `name`, the other lines blanked (so that line numbers stay)."""
    kept, keep = [], True
    for row in text.split("\n"):
        words = row.split()
        if words[:1] in (["alt"], ["else"], ["end"]):
            keep = words[:1] == ["end"] or words[1:2] == [name]
            row = ""
        kept.append(row if keep else "")
    return "\n".join(kept)


def _arrows(line: int, text: str) -> list[tuple[int, tuple[Any, ...]]]:
    """Each request and the answer on the next line, as EVENT_FIELDS, with the answer's line."""
    ticks = [(note.start(), int(note[1])) for note in TICK.finditer(text)]
    events = []
    for arrow in ARROWS.finditer(text):
        actor, action, said, reply = arrow.groups()
        tick = max([note for note in ticks if note[0] < arrow.start()], default=(0, None))[1]
        epoch = re.search(r"\bepoch (\d+)", f"{said} {reply}")
        value = re.search(QUOTED, said)
        expires = re.search(r"expires at tick (\d+)", reply)
        stored = re.search(rf"holds \((\d+), ({QUOTED})\)", reply)
        outcome = "granted" if reply.startswith("epoch") else reply.split(",")[0]
        events.append((line + text.count("\n", 0, arrow.end()), (
            tick, actor, action, epoch and int(epoch[1]), value and json.loads(value[0]), outcome,
            expires and int(expires[1]), stored and int(stored[1]),
            stored and json.loads(stored[2]))))
    return events


def check_tests(readme: Readme) -> str:
    tree = ast.parse((ROOT / TESTS).read_text(encoding="utf-8"))
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    tests = {f"{node.name}.{item.name}" for node in classes for item in node.body
             if isinstance(item, ast.FunctionDef) and item.name.startswith("test")}
    cited = set(CITATION.findall(readme.text))
    problems = [f"it says {count} tests" for count in re.findall(r"\b(\d+) tests\b", readme.text)
                if int(count) != len(tests)]
    problems += [f"it cites {name}" for name in sorted(cited - tests)]
    problems += [f"{name} is never cited" for name in sorted(tests - cited)]
    if problems:
        raise Drift(f"{README} against the {len(tests)} tests of {TESTS}: {'; '.join(problems)}")
    return f"tests: all {len(tests)} in {TESTS} exist, are cited, and are counted right"


def check_exit_codes(readme: Readme) -> str:
    codes = dict(importlib.import_module("run_experiment").EXIT_CODES)
    shown = {int(row["exit code"].strip("`")): " ".join(row["meaning"].split())
             for _, row in readme.table("exit code")[2]}
    wrong = sorted(code for code in codes | shown if shown.get(code) != codes.get(code))
    if wrong:
        raise Drift(f"{README}'s exit codes {wrong} are not run_experiment.EXIT_CODES'; first, "
                    f"{README} says {shown.get(wrong[0])!r}, the code {codes.get(wrong[0])!r}")
    # explore.py shares every code but its own 0 and 1, and has no scenario to fail (3).
    shared = dict(getattr(_explorer(), "EXIT_CODES", codes))
    if shared.keys() - {0, 1} != codes.keys() - {0, 1, 3} or any(
            shared[code] != codes[code] for code in shared.keys() - {0, 1}):
        raise Drift(f"explore.EXIT_CODES {sorted(shared)} are not run_experiment's but 3, "
                    "with the same meanings from 2 on")
    return f"exit codes: {README}'s table is EXIT_CODES ({', '.join(map(str, sorted(codes)))})"


def check_fields(readme: Readme) -> str:
    line, _, rows = readme.table("field")
    named = {name.strip("`") for _, row in rows for name in row["field"].split(", ")}
    for record in json.loads((ROOT / EVIDENCE).read_text(encoding="utf-8"))["scenarios"]:
        if named != set(record):
            raise Drift(f"{README} line {line}: the fields table has {sorted(named - set(record))}"
                        f" too many, {sorted(set(record) - named)} missing for `{record['name']}`")
    return f"fields: {README}'s table names exactly the {len(named)} fields of each scenario"


def check_exploration(readme: Readme) -> str:
    module = _explorer()
    fresh = module.explore(module.Bound())
    line, columns, rows = readme.table("schedules with")
    for receiver in [column for column in columns if column in fresh["classes"]] or ["(none)"]:
        counts = fresh["classes"].get(receiver, {})
        shown = {row[columns[0]].split(" (")[0]: row.get(receiver, "").replace(",", "")
                 for _, row in rows}
        wrong = [f"{name!r} {shown.get(name, 'no row')} (fresh: {counts.get(name)})" for name in
                 sorted(counts | shown) if shown.get(name) != str(counts.get(name))]
        if wrong:
            raise Drift(f"{README} line {line}, receiver {receiver}: {', '.join(wrong)}")
    # The "N schedules" and "N states" nearest the table, before or after it.
    text = "\n".join(readme.prose)
    top = len("\n".join(readme.prose[: line - 1]))
    bottom = len("\n".join(readme.prose[: line + len(rows) + 1]))
    for word in ("schedules", "states"):
        found = sorted(re.finditer(rf"(\d[\d,]*)\s+{word}\b", text),
                       key=lambda match: max(top - match.start(), match.start() - bottom))
        said = found[0][1] if found else "no number of"
        if said.replace(",", "") != str(fresh[word]):
            raise Drift(f"{README} near line {line}: {said} {word}, fresh: {fresh[word]:,}")
    return f"exploration: {README}'s table and numbers are a fresh {module.__name__}.explore's"


def check_statements(readme: Readme) -> str:
    """The statement mode's table, and its counts in the prose just before it, are a fresh
    run's at its default bound."""
    module = _explorer()
    if not hasattr(module, "STATEMENTS_BOUND"):  # no statement mode: nothing to check
        return "statements: no statement mode"
    fresh = module.explore(module.STATEMENTS_BOUND, statements=True)
    for first, key in (("a crash in, and the step taken again", "after_a_crash"),
                       ("a call the lock refused, and its answer", "after_a_refusal")):
        line, columns, rows = readme.table(first)
        shown = {row[columns[0]]: int(row["schedules"].replace(",", "")) for _, row in rows}
        if shown != fresh[key]:
            raise Drift(f"{README} line {line}: the table {first!r} says {shown}, fresh: "
                        f"{fresh[key]}")
    line = readme.table("a crash in, and the step taken again")[0]
    before = " ".join(readme.prose[max(line - 6, 0) : line - 1])
    for word, key in (("interleavings", "interleavings"), ("crash schedules", "crash_schedules"),
                      ("refusal schedules", "refusal_schedules")):
        said = re.search(rf"(\d[\d,]*)\s+{word}\b", before)
        if said is None or int(said[1].replace(",", "")) != fresh[key]:
            raise Drift(f"{README} near line {line}: {said and said[1]} {word}, fresh: "
                        f"{fresh[key]:,}")
    if any(fresh["violations"].values()):
        raise Drift(f"{README} line {line}: a check failed in a fresh run: {fresh['violations']}")
    return f"statements: {README}'s two tables and counts are a fresh explore --statements'"


def run_example(line: int, language: str, text: str, after: str = "") -> str:
    where = f"{README} line {line}, {language!r} block"
    if language not in ("python", "sql", "sh"):
        raise Drift(f"{where}: neither run nor checked; make it python, sql, sh, text or mermaid")
    if language == "sql":
        return run_sql(where, text, after)
    folder = _copy()
    commands = [[sys.executable, "readme_example.py"]]
    if language == "python":
        pathlib.Path(folder, "readme_example.py").write_text(text, encoding="utf-8")
    else:  # each line a command, but for comments; a trailing backslash joins the next line
        commands = [["bash", "-c", command] for command in text.replace("\\\n", "").splitlines()
                    if command.strip() and not command.lstrip().startswith("#")]
    if language == "python" and after:
        return run_python(where, folder, after)
    for command in commands:
        returncode, output = _run(command, folder)
        if returncode != 0:
            ended = f"exits {returncode}" if returncode is not None else f"runs over {TIMEOUT:g} s"
            last = (output.strip().splitlines() or ["no output"])[-1]
            raise Drift(f"{where}: `{command[-1]}` {ended}: {last}")
    return f"{where} runs, each command exiting 0"


def run_sql(where: str, script: str, attempts: str) -> str:
    """Run `script` on SQLite; with `attempts` (the text block after it), once per line with
    its :parameters in one BEGIN IMMEDIATE transaction, its last row the answer."""
    if not attempts:
        sqlite3.connect(":memory:").executescript(script)  # an error is a drift
        return f"{where} runs on SQLite"
    statements, pending = [], ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            statements.append(pending)
            pending = ""
    database = sqlite3.connect(":memory:", isolation_level=None)
    answers, tried = [], _attempts(attempts, sequenced=":sequence" in script)
    for _, names, _ in tried:
        database.execute("BEGIN IMMEDIATE")
        rows = [database.execute(statement, names).fetchall() for statement in statements]
        database.execute("COMMIT")
        answers.append((rows[-1] or [[None]])[0][0])
    _agree(where, tried, answers, "the SQL")
    return f"{where} answers as README and the library's receiver do, {len(statements)} statements"


def run_python(where: str, folder: str, attempts: str) -> str:
    """Run the block; its output must be `attempts`, line for line, each answered as the
    library's receiver answers it."""
    returncode, output = _run([sys.executable, "readme_example.py"], folder)
    if returncode != 0:
        last = (output.strip().splitlines() or ["no output"])[-1]
        raise Drift(f"{where} exits {returncode}: {last}")
    lines = output.strip().splitlines()
    if lines != attempts.strip().splitlines():
        raise Drift(f"{where} prints {lines!r}, not the text block after it")
    answers = [line.rsplit(" -> ", 1)[1] for line in lines]
    _agree(where, _attempts(attempts, sequenced=False), answers, "the code")
    return f"{where} prints the text block after it, as the library's receiver answers"


def _attempts(text: str, *, sequenced: bool) -> list[tuple[str, dict[str, Any], str]]:
    """Each "resource epoch [sequence] value -> answer" line: the attempt, its :parameters
    and the answer README gives."""
    attempts = []
    for line in text.strip().splitlines():
        attempt, said = line.rsplit(" -> ", 1)
        fields = attempt.split(" ", 3 if sequenced else 2)
        names: dict[str, Any] = {"resource": fields[0], "epoch": int(fields[1]),
                                 "value": fields[-1]}
        if sequenced:
            names["sequence"] = int(fields[2])
        attempts.append((attempt, names, said))
    return attempts


def _agree(where: str, tried: list[tuple[str, dict[str, Any], str]], answers: list[Any],
           shown: str) -> None:
    """Drift unless each answer is README's and the library's fenced receiver's.  A pair
    (epoch, sequence) goes to the receiver as one number that orders as the pair does."""
    receiver = importlib.import_module("leases").Receiver(os.path.join(_copy(), "r.sqlite3"))
    try:
        for (attempt, names, said), answer in zip(tried, answers):
            epoch = names["epoch"] << 32 | names.get("sequence", 0)
            library = receiver.write(names["resource"], epoch, names["value"]).outcome.value
            if answer != said or library != said:
                raise Drift(f"{where}, for {attempt!r}: README says {said!r}, {shown} "
                            f"{answer!r}, the library's receiver {library!r}")
    finally:
        receiver.close()


def check_breakage(line: int, row: dict[str, str]) -> str:
    label = f"breakage {row['breakage']!r} ({BREAKAGES} line {line})"
    # Each a `code span`, where \n stands for a line break.
    spans = [re.fullmatch(r"(`+) ?(.+?) ?\1", row[column], re.DOTALL)
             for column in ("file", "replace this", "with this")]
    tests = CITATION.findall(row["caught by"])
    if not all(spans) or not tests:
        raise Drift(f"{label}: needs one `code span` per file, replace and with cell, and a test")
    name, old, new = (span[2].replace("\\n", "\n") for span in spans if span)
    path = pathlib.Path(_copy(), name)
    source = path.read_text(encoding="utf-8")
    if source.count(old) != 1:
        raise Drift(f"{label}: 'replace this' occurs {source.count(old)} times in {name}, not once")
    path.write_text(source.replace(old, new), encoding="utf-8")
    returncode, output = _run([sys.executable, "-m", "unittest",
                               *(f"{TESTS[:-3]}.{test}" for test in tests)], str(path.parent))
    failed = {f"{where.removesuffix('.' + method).rsplit('.', 1)[-1]}.{method}"
              for method, where in FAILED_TEST.findall(output)}
    if returncode is None:
        raise Drift(f"{label}: its tests ran over {TIMEOUT:g} s")
    if set(tests) - failed:
        raise Drift(f"{label}: did not fail: {', '.join(sorted(set(tests) - failed))}")
    return f"{label}: caught, each test it names fails"


def _outcome(job: "functools.partial[str] | Drift") -> str:
    if isinstance(job, Drift):
        return f"drift: {job}"
    try:
        return f"ok: {job()}"
    except Drift as drift:
        return f"drift: {drift}"
    except Exception as exc:  # noqa: BLE001 - a bad table or example, a module not importing
        at = f" ({README} line {job.args[0]})" if isinstance(job.args[0], int) else ""
        return f"drift: {job.func.__name__}{at}: {type(exc).__name__}: {exc}"


def main() -> int:
    sys.path.insert(0, str(ROOT))
    folder = tempfile.mkdtemp(prefix="check-contract-")
    tempfile.tempdir = folder  # what this check, and all it runs, makes in a temporary folder
    drifts = 0
    try:
        readme = Readme((ROOT / README).read_text(encoding="utf-8"))
        checks = (check_diagrams, check_tests, check_exit_codes, check_fields, check_exploration,
                  check_statements)
        jobs: list[functools.partial[str] | Drift] = [functools.partial(c, readme) for c in checks]
        following = [*readme.blocks[1:], (0, "", "")]
        jobs += [functools.partial(run_example, line, language, text,
                                   after[2] if after[1] == "text" else "")
                 for (line, language, text), after in zip(readme.blocks, following)
                 if language not in ("text", "mermaid")]
        try:
            breakages = Readme((ROOT / BREAKAGES).read_text(encoding="utf-8"))
            jobs += [functools.partial(check_breakage, *row)
                     for row in breakages.table("breakage")[2]]
        except Drift as drift:
            jobs.append(drift)
        # Two at a time: the breakages' tests spawn processes of their own, on two cores.
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            for line in pool.map(_outcome, jobs):
                drifts += line.startswith("drift")
                print(line, flush=True)
    except OSError as exc:
        print(f"drift: {exc}", flush=True)
        drifts += 1
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 1 if drifts else 0


if __name__ == "__main__":
    sys.exit(main())
