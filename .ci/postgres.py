"""Run README's PostgreSQL fences with psql against a real, throwaway PostgreSQL server.

    python3 .ci/postgres.py [README]

README's ```sql blocks are PostgreSQL.  A cluster is made in a temporary folder (as the
`postgres` user when run as root: PostgreSQL refuses root), reached by a Unix socket only,
stopped and removed at the end.  Each block runs whole through psql: each `SELECT ...;  -- answer`
line must print that answer, as leases.Receiver answers the same writes.  Then 4 psql processes
at once send random writes to both fences; each write's answer, in the order the row's lock gave
(a number drawn while the row is locked), must be leases.Receiver's (an (epoch, sequence) pair
goes to it as one number that orders the same).  If initdb is missing, it installs Debian's
postgresql package first.  Exit 0 when all agree; 1 with the reason otherwise.
"""

import ast
import glob
import os
import pathlib
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import leases

PROCESSES, WRITES, BOUND = 4, 150, 300.0  # the bound only catches a hang
CALL = re.compile(r"^SELECT (fenced_write|sequenced_write)\((.*)\);\s*-- (\w+)$", re.MULTILINE)


class Failed(Exception):
    """Why this run fails, in one line."""


def tool(name: str) -> str:
    """PostgreSQL's program `name`, from PATH or Debian's folder; installs it if missing."""
    for attempt in range(2):
        found = shutil.which(name) or next(iter(sorted(
            glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
        if found:
            return found
        if attempt == 0:
            print(f"postgres: no {name}: apt-get install -y postgresql", flush=True)
            for command in (["apt-get", "update"], ["apt-get", "install", "-y", "postgresql"]):
                if subprocess.run(command, check=False, stdout=subprocess.DEVNULL).returncode:
                    raise Failed(f"`{' '.join(command)}` failed: cannot install PostgreSQL")
    raise Failed(f"no {name} on PATH or in /usr/lib/postgresql/*/bin")


def as_owner(command: list[str]) -> list[str]:
    """The command as the `postgres` user when this is root (PostgreSQL refuses root)."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def psql(folder: str, script: str) -> subprocess.Popen[str]:
    """psql running `script`, from a file: started, not waited for."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql", dir=folder, delete=False) as file:
        file.write(script)
    return subprocess.Popen(
        [tool("psql"), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-h", folder, "-U",
         "postgres", "-d", "postgres", "-f", file.name], stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run(folder: str, script: str) -> str:
    process = psql(folder, script)
    output = process.communicate(timeout=BOUND)[0]
    if process.returncode:
        raise Failed(f"psql exits {process.returncode}: {output.strip()[-300:]}")
    return output


def agree(calls: list[tuple[str, str, tuple[Any, ...], str]], where: str) -> int:
    """Each (function, resource, arguments, answer) as leases.Receiver answers it, in order."""
    with tempfile.TemporaryDirectory() as scratch, leases.Receiver(
            os.path.join(scratch, "r.sqlite3")) as receiver:
        for function, resource, arguments, answer in calls:
            epoch = arguments[0] if len(arguments) == 2 else arguments[0] << 32 | arguments[1]
            said = receiver.write(f"{function}/{resource}", epoch, arguments[-1]).outcome.value
            if said != answer:
                raise Failed(f"{where}: {function}({resource!r}, {arguments}) answers "
                             f"{answer!r}, leases.Receiver {said!r}")
    return len(calls)


def concurrent(folder: str) -> tuple[int, set[str]]:
    """4 psql processes at once; each write's answer and the order its row's lock gave it."""
    run(folder, "CREATE SEQUENCE lock_order; CREATE TABLE decisions (n bigint, call text,"
                " resource text, epoch bigint, sequence bigint, value text, answer text);")
    scripts = []
    for number in range(PROCESSES):
        chosen, lines = random.Random(number), []
        for _ in range(WRITES):
            resource, epoch = f"r-{chosen.randrange(3)}", chosen.randrange(1, 5)
            sequence, value = chosen.randrange(1, 4), chosen.choice(["a", "b"])
            call, given = chosen.choice([("fenced_write", f"{epoch}, '{value}'"), (
                "sequenced_write", f"{epoch}, {sequence}, '{value}'")])
            lines.append(f"BEGIN;\nSELECT {call}('{resource}', {given}) AS answer \\gset\n"
                         f"INSERT INTO decisions VALUES (nextval('lock_order'), '{call}', "
                         f"'{resource}', {epoch}, {sequence}, '{value}', :'answer');\nCOMMIT;\n")
        scripts.append("".join(lines))
    processes = [psql(folder, script) for script in scripts]
    for process in processes:  # all started: they run at once
        output = process.communicate(timeout=BOUND)[0]
        if process.returncode:
            raise Failed(f"a concurrent psql exits {process.returncode}: {output.strip()[-300:]}")
    rows = run(folder, "SELECT call, resource, epoch, sequence, value, answer FROM decisions "
                       "ORDER BY n").split("\n")
    calls = []
    for row in filter(None, rows):
        call, resource, *numbers, value, answer = row.split("|")
        pair = [int(number) for number in numbers]
        arguments = (pair[0], value) if call == "fenced_write" else (*pair, value)
        calls.append((call, resource, arguments, answer))
    if len(calls) != PROCESSES * WRITES:
        raise Failed(f"{len(calls)} decisions recorded, not {PROCESSES * WRITES}")
    return agree(calls, "concurrent writes"), {call[3] for call in calls}


def main() -> int:
    readme = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "README.md")
    blocks = re.findall(r"^```sql\n(.*?)^```", readme.read_text(encoding="utf-8"),
                        re.MULTILINE | re.DOTALL)
    # as root, in /tmp: the server runs as `postgres`, which may not enter a private TMPDIR
    folder = tempfile.mkdtemp(prefix="postgres-", dir="/tmp" if os.geteuid() == 0 else None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` cleans up
    data, started = os.path.join(folder, "data"), False
    try:
        if not blocks:
            raise Failed(f"{readme} has no ```sql block")
        if os.geteuid() == 0:
            shutil.chown(folder, "postgres")
        for command in (
                [tool("initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8",
                 "--no-sync"],
                [tool("pg_ctl"), "-D", data, "-l", os.path.join(folder, "log"), "-w", "-t",
                 "60", "-o", f"-c listen_addresses='' -k {folder} -c fsync=off", "start"]):
            done = subprocess.run(as_owner(command), capture_output=True, text=True, check=False)
            started = started or command[-1] == "start"
            if done.returncode:
                log = pathlib.Path(folder, "log")
                why = (log.read_text() if log.exists() else "") + done.stderr + done.stdout
                raise Failed(f"the server cannot start: `{os.path.basename(command[0])}` exits "
                             f"{done.returncode}: {why.strip()[-500:]}")
        checked = 0
        for number, block in enumerate(blocks, 1):
            answers = run(folder, block).split()
            calls = [(function, str(ast.literal_eval(f"({arguments},)")[0]),
                      ast.literal_eval(f"({arguments},)")[1:], said)
                     for function, arguments, said in CALL.findall(block)]
            if answers != [call[3] for call in calls]:
                raise Failed(f"README's sql block {number} prints {answers}, "
                             f"not {[call[3] for call in calls]}")
            checked += agree(calls, f"README's sql block {number}")
        count, seen = concurrent(folder)
        print(f"postgres: {len(blocks)} README blocks, {checked} answers as shown; "
              f"{count} writes from {PROCESSES} concurrent psql processes ({', '.join(sorted(seen))}),"
              f" 0 mismatches with leases.Receiver")
        return 0
    except (Failed, subprocess.TimeoutExpired) as failure:
        print(f"postgres: FAILED: {failure}", flush=True)
        return 1
    finally:
        if started:
            subprocess.run(as_owner([tool("pg_ctl"), "-D", data, "-m", "immediate", "-w",
                                     "stop"]), capture_output=True, check=False)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
