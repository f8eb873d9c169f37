"""Check that README.md says what the code does; prints "ok: ..." or "drift: ..." per check.

- Each scenario of results.json has a ```mermaid diagram, in order, under a heading naming it;
  its arrows and "tick N" notes are the scenario's events.
- README cites each test of test_leases.py and no other; "N tests" counts them.
- Each ```sh and ```python block runs in a copy of the repository; one whose first line is
  "# NAME.py" is saved there as NAME.py for the others.  A ```text block after a python block is
  its output; a "resource epoch sequence value -> answer" line is leases.Receiver's answer too.
  A python block whose first line is "# from PATH.py" is an excerpt: its lines are in that file
  word for word, in runs split by "..." lines; the file itself runs, if a text block follows.
  ```sql blocks are PostgreSQL's, run by .ci/postgres.py; the seed's two commands, by .ci/run
  (in a folder of the five files alone, and with each Python).
- Each | breakage | row of .ci/breakages.md, applied alone to a copy, fails the tests it names
  (of test_leases.py, or of recipes/test_recipes.py for a file in recipes/).
Timeouts only catch a hang (600 s): CI never fails because the machine is slow.
"""

import ast
import concurrent.futures
import functools
import itertools
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile

import answers  # beside this file: the fence's answers as leases.Receiver gives them

ROOT = pathlib.Path(__file__).resolve().parent.parent
HANG = 600.0  # seconds
CITATION = re.compile(r"\b[A-Z]\w*Tests\.test\w*\b")
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
SEED = ("python3 test_leases.py\n"
        "python3 run_experiment.py --check results.json --output reproduced.json\n")
NAMED = re.compile(r"# (\w+\.py)\b")
EXCERPT = re.compile(r"# from ([\w/]+\.py)\n")
ELIDED = re.compile(r"^[ \t]*\.\.\.\n", re.MULTILINE)
FAILED = re.compile(r"^(?:FAIL|ERROR): (\w+) \(([\w.]+)\)", re.MULTILINE)
QUOTED = r'"(?:[^"\\]|\\.)*"'
FIELDS = ("tick", "actor", "action", "epoch", "value", "outcome", "expires_at", "stored_epoch",
          "stored_value")


class Drift(Exception):
    """README.md and the code disagree: where and how, in one line."""


def scratch() -> pathlib.Path:
    """A new copy of the repository, without its dot-files, in the temporary folder."""
    return pathlib.Path(shutil.copytree(ROOT, os.path.join(tempfile.mkdtemp(), "repo"),
                                        ignore=shutil.ignore_patterns(".*", "__pycache__")))


def run(command: list[str], folder: pathlib.Path) -> tuple[int, str]:
    """Its exit code and output; -1 if it hung, stopped with all it started."""
    process = subprocess.Popen(command, cwd=folder, stdin=subprocess.DEVNULL, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env={**os.environ, "TMPDIR": tempfile.gettempdir()},
                               start_new_session=True)
    try:
        output = process.communicate(timeout=HANG)[0]
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return -1, f"hung for {HANG:g} s: {process.communicate()[0][-300:]}"
    return process.returncode, output


def check_diagrams(readme: str, found: list[tuple[int, str, str]]) -> str:
    records = json.loads((ROOT / "results.json").read_text(encoding="utf-8"))["scenarios"]
    names = [record["name"] for record in records]
    drawn = []  # (line, scenario, its events as the diagram shows them)
    for line, language, text in found:
        if language == "mermaid":
            heading = [row for row in readme.splitlines()[:line] if row.startswith("#")][-1]
            drawn += [(line, name, events(text, name))
                      for name in re.findall(r"`(\w+)`", heading) if name in names]
    if [name for _, name, _ in drawn] != names:
        raise Drift(f"README's diagrams draw {[name for _, name, _ in drawn]}, not {names}")
    for (line, name, shown), record in zip(drawn, records):
        wanted = [tuple(event[field] for field in FIELDS) for event in record["events"]]
        for index, (says, want) in enumerate(itertools.zip_longest(shown, wanted)):
            if says != want:
                raise Drift(f"README line {line}, `{name}`, event {index}: the diagram says "
                            f"{says}, results.json {want} (as {FIELDS})")
    return f"diagrams: {len(names)} scenarios, each arrow as results.json has it"


def events(text: str, name: str) -> list[tuple[object, ...]]:
    """The events as scenario `name` plays them (of each alt/else, the branch it names): each
    arrow with the answer on the next line, as FIELDS, at the last "tick N" note before it."""
    rows, keep = [], True
    for row in text.splitlines():
        words = row.split()
        if words[:1] in (["alt"], ["else"], ["end"]):
            keep = words[0] == "end" or words[1:2] == [name]
        elif keep:
            rows.append(row)
    found: list[tuple[object, ...]] = []
    tick = None
    for row, reply in zip(rows, [*rows[1:], ""]):
        if note := re.match(r"\s*Note [^:]*: tick (\d+)", row):
            tick = int(note[1])
        elif arrow := re.match(r"\s*(\w+)->>\w+:\s*(\w+)(.*)", row):
            said, reply = arrow[3], reply.split(":", 1)[-1].strip()
            epoch = re.search(r"\bepoch (\d+)", f"{said} {reply}")
            value, expires = re.search(QUOTED, said), re.search(r"expires at tick (\d+)", reply)
            stored = re.search(rf"holds \((\d+), ({QUOTED})\)", reply)
            found.append((tick, arrow[1], arrow[2], epoch and int(epoch[1]),
                          value and json.loads(value[0]),
                          "granted" if reply.startswith("epoch") else reply.split(",")[0],
                          expires and int(expires[1]), stored and int(stored[1]),
                          stored and json.loads(stored[2])))
    return found


def check_tests(readme: str) -> str:
    tree = ast.parse((ROOT / "test_leases.py").read_text(encoding="utf-8"))
    tests = {f"{node.name}.{item.name}" for node in tree.body if isinstance(node, ast.ClassDef)
             for item in node.body
             if isinstance(item, ast.FunctionDef) and item.name.startswith("test")}
    cited = set(CITATION.findall(readme))
    problems = [f"says {count} tests" for count in re.findall(r"\b(\d+) tests\b", readme)
                if int(count) != len(tests)] + [f"cites {name}, not a test" for name in sorted(
                    cited - tests)] + [f"never cites {name}" for name in sorted(tests - cited)]
    if problems:
        raise Drift(f"README, against test_leases.py's {len(tests)} tests: {'; '.join(problems)}")
    return f"tests: README cites all {len(tests)}, and only those"


def check_block(line: int, language: str, text: str, output: str | None,
                named: dict[str, str]) -> str:
    where = f"README line {line}, {language} block"
    if language not in ("sh", "python"):
        raise Drift(f"{where}: make it python, sh, sql (PostgreSQL's), text or mermaid")
    if text == SEED:
        return f"{where}: the seed's two commands, run by .ci/run alone and with each Python"
    if excerpt := EXCERPT.match(text):
        script, source = excerpt[1], (ROOT / excerpt[1]).read_text(encoding="utf-8")
        missing = [part for part in ELIDED.split(text[excerpt.end():]) if part not in source]
        if missing:
            raise Drift(f"{where}: not in {script} word for word: {missing[0][:200]!r}")
        if output is None:
            return f"{where}: in {script} word for word"
    folder = scratch()
    for saved, code in named.items():
        (folder / saved).write_text(code, encoding="utf-8")
    if not excerpt:
        script = name[1] if (name := NAMED.match(text)) else "readme_example.py"
        (folder / script).write_text(text, encoding="utf-8")
    status, said = run(["bash", "-ec", text] if language == "sh" else [sys.executable, script],
                       folder)
    if status:
        raise Drift(f"{where} exits {status}: {said.strip()[-300:]}")
    if output is None:
        return f"{where}: runs, exiting 0"
    if said.splitlines() != output.splitlines():
        raise Drift(f"{where} prints {said.splitlines()}, not the text block after it")
    wrong = answers.mismatch([(row[0], int(row[1]), int(row[2]), " ".join(row[3:-2]), row[-1])
                              for row in map(str.split, output.splitlines()) if "->" in row])
    if wrong:
        raise Drift(f"{where}: {wrong}")
    return f"{where}: prints the text block after it, each answer as leases.Receiver's"


def check_breakage(line: int, cells: list[str]) -> str:
    label = f"breakage {cells[0]!r} (.ci/breakages.md line {line})"
    spans = [re.fullmatch(r"(`+) ?(.+?) ?\1", cell, re.DOTALL) for cell in cells[1:4]]
    tests = CITATION.findall(cells[4])
    if not all(spans) or not tests:
        raise Drift(f"{label}: needs a `code span` in each of file, replace and with, and a test")
    name, old, new = (span[2].replace("\\n", "\n") for span in spans if span)
    path = scratch() / name
    source = path.read_text(encoding="utf-8")
    if source.count(old) != 1:
        raise Drift(f"{label}: 'replace this' is {source.count(old)} times in {name}, not once")
    path.write_text(source.replace(old, new), encoding="utf-8")
    module = "test_recipes" if name.startswith("recipes/") else "test_leases"
    status, said = run([sys.executable, "-m", "unittest", *(f"{module}.{t}" for t in tests)],
                       path.parent)
    # "FAIL: test_x (test_leases.Class.test_x)" from Python 3.11, "(test_leases.Class)" before
    failed = {f"{where.split('.')[1]}.{method}" for method, where in FAILED.findall(said)}
    if status == -1 or set(tests) - failed:
        raise Drift(f"{label}: not caught by {', '.join(sorted(set(tests) - failed)) or said}")
    return f"{label}: caught by each test it names"


def outcome(job: "functools.partial[str]") -> str:
    try:
        return f"ok: {job()}"
    except Exception as error:  # noqa: BLE001 - a bad table or block is a drift too
        said = "" if isinstance(error, Drift) else f"{job.func.__name__}: {type(error).__name__}: "
        return f"drift: {said}{error}"


def main() -> int:
    tempfile.tempdir = tempfile.mkdtemp(prefix="check-contract-")
    try:
        readme = (ROOT / "README.md").read_text(encoding="utf-8")
        found = [(readme.count("\n", 0, block.start()) + 1, block[1], block[2])
                 for block in BLOCK.finditer(readme)]  # (first line, language, text)
        named = {match[1]: text for _, language, text in found
                 if language == "python" and (match := NAMED.match(text))}
        jobs = [functools.partial(check_diagrams, readme, found),
                functools.partial(check_tests, readme)]
        for (line, language, text), after in zip(found, [*found[1:], (0, "", "")]):
            if language not in ("text", "mermaid", "sql"):  # sql: .ci/postgres.py runs it
                jobs.append(functools.partial(check_block, line, language, text,
                                              after[2] if after[1] == "text" else None, named))
        rows = (ROOT / ".ci/breakages.md").read_text(encoding="utf-8").splitlines()
        jobs += [functools.partial(check_breakage, number, [
            cell.strip() for cell in re.split(r"(?<!\\)\|", row.strip()[1:-1])])
            for number, row in enumerate(rows, 1) if row.startswith("|") and "`" in row]
        with concurrent.futures.ThreadPoolExecutor(2) as pool:  # two at a time: two cores here
            lines = [print(line, flush=True) or line for line in pool.map(outcome, jobs)]
    finally:
        shutil.rmtree(tempfile.tempdir, ignore_errors=True)
    return 1 if any(line.startswith("drift") for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
