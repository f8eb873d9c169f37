"""Run README's PostgreSQL fences with psql against a real, throwaway PostgreSQL server.

    python3 .ci/postgres.py [README]

README's ```sql blocks are PostgreSQL's.  A cluster is made in a temporary folder (as the
`postgres` user when run as root: PostgreSQL refuses root), reached by a Unix socket only,
stopped and removed at the end.  Then:
- each block runs whole through psql: each `SELECT fenced_write(...);  -- answer` prints that
  answer;
- pairs of writes to one row, the second sent once the first holds its transaction open (a
  handshake on pg_stat_activity, no sleep);
- 4 psql processes at once send 600 random writes, at sequence 1 only (one value per epoch) on
  two resources, at sequences 1 to 3 on two others; each records its answer and a number drawn
  while it holds the row's lock.
Every answer, in that order, must be leases.Receiver's (.ci/answers.py).  If initdb is missing,
Debian's postgresql package is installed first.  Exit 0 when all agree; 1 with the reason
(the server's log when it cannot start) otherwise.
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
import time

import answers  # beside this file

ROOT = pathlib.Path(__file__).resolve().parent.parent

PROCESSES, WRITES, BOUND = 4, 150, 300.0  # the bound only catches a hang
CALL = re.compile(r"^SELECT fenced_write\((.*)\);\s*-- (\w+)$", re.MULTILINE)


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


def agree(calls: list[answers.Write], where: str) -> int:
    wrong = answers.mismatch(calls)
    if wrong:
        raise Failed(f"{where}: {wrong}")
    return len(calls)


def wait_for(folder: str, query: str) -> None:
    """Ask `query` (a count) again until it is not 0: a handshake on the server's own state."""
    deadline = time.monotonic() + BOUND
    while run(folder, query).strip() == "0":
        if time.monotonic() > deadline:
            raise Failed(f"waited {BOUND:g} s for: {query}")


def overtaking(folder: str, first: str, second: str) -> list[str]:
    """The answers when `second` is sent while `first` holds its transaction open."""
    sessions = []
    for name, call in (("first", first), ("second", second)):
        session = subprocess.Popen(
            [tool("psql"), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-h", folder, "-U",
             "postgres", "-d", "postgres"], env={**os.environ, "PGAPPNAME": name},
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert session.stdin is not None
        session.stdin.write(f"BEGIN;\nSELECT fenced_write({call});\nCOMMIT;\n" if name ==
                            "second" else f"BEGIN;\nSELECT fenced_write({call});\n")
        session.stdin.flush()
        sessions.append(session)
        state = ("state = 'idle in transaction'" if name == "first" else  # its write made
                 "(wait_event_type = 'Lock' OR state = 'idle')")  # waits for the row, or is done
        wait_for(folder, f"SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                         f"'{name}' AND {state}")
    answers = []
    for session, end in zip(sessions, ("COMMIT;\n", "")):
        output = session.communicate(end, timeout=BOUND)[0]
        if session.returncode:
            raise Failed(f"psql exits {session.returncode}: {output.strip()[-300:]}")
        answers.append(output.strip())
    return answers


def races(folder: str) -> int:
    """Each pair of writes to one row, the second sent while the first holds its transaction."""
    calls = []
    for number, (first, second) in enumerate([
            ((1, 1, "x"), (1, 1, "x")), ((1, 1, "x"), (1, 1, "y")),  # a new row
            ((3, 1, "x"), (2, 1, "y")), ((3, 1, "x"), (3, 1, "y")), ((3, 1, "x"), (3, 1, "x")),
            ((4, 1, "x"), (5, 1, "y")), ((6, 2, "x"), (6, 1, "y"))]):
        resource = f"race-{min(number, 2)}"  # the first two on a new row, the rest on one
        given = [f"'{resource}', {epoch}, {sequence}, '{value}'"
                 for epoch, sequence, value in (first, second)]
        answers = overtaking(folder, *given)
        calls += [(resource, *write, answer) for write, answer in zip((first, second), answers)]
    return agree(calls, "a write sent while another holds the row")


def concurrent(folder: str) -> tuple[int, set[str]]:
    """4 psql processes at once; each write's answer and the order its row's lock gave it.
    Resources once-0 and once-1 are written at sequence 1 only (one value per epoch)."""
    run(folder, "CREATE SEQUENCE lock_order; CREATE TABLE decisions (n bigint, resource text,"
                " epoch bigint, sequence bigint, value text, answer text);")
    scripts = []
    for number in range(PROCESSES):
        chosen, lines = random.Random(number), []
        for _ in range(WRITES):
            resource = chosen.choice(["once-0", "once-1", "jobs-0", "jobs-1"])
            epoch, value = chosen.randrange(1, 5), chosen.choice(["a", "b"])
            sequence = 1 if resource.startswith("once") else chosen.randrange(1, 4)
            given = f"'{resource}', {epoch}, {sequence}, '{value}'"
            lines.append(f"BEGIN;\nSELECT fenced_write({given}) AS answer \\gset\n"
                         f"INSERT INTO decisions VALUES (nextval('lock_order'), {given}, "
                         ":'answer');\nCOMMIT;\n")
        scripts.append("".join(lines))
    processes = [psql(folder, script) for script in scripts]
    for process in processes:  # all started: they run at once
        output = process.communicate(timeout=BOUND)[0]
        if process.returncode:
            raise Failed(f"a concurrent psql exits {process.returncode}: {output.strip()[-300:]}")
    rows = run(folder, "SELECT resource, epoch, sequence, value, answer FROM decisions "
                       "ORDER BY n").split("\n")
    calls = [(resource, int(epoch), int(sequence), value, answer) for resource, epoch, sequence,
             value, answer in (row.split("|") for row in rows if row)]
    if len(calls) != PROCESSES * WRITES:
        raise Failed(f"{len(calls)} decisions recorded, not {PROCESSES * WRITES}")
    return agree(calls, "concurrent writes"), {call[4] for call in calls}


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
            calls = [(*ast.literal_eval(f"({arguments},)"), said)
                     for arguments, said in CALL.findall(block)]
            if answers != [call[4] for call in calls]:
                raise Failed(f"README's sql block {number} prints {answers}, "
                             f"not {[call[4] for call in calls]}")
            checked += agree(calls, f"README's sql block {number}")
        raced = races(folder)
        count, seen = concurrent(folder)
        print(f"postgres: README's sql block: {checked} answers as shown; {raced} writes sent "
              f"in pairs, the second while the first held the row; {count} writes from "
              f"{PROCESSES} psql processes at once ({', '.join(sorted(seen))}); each answer "
              f"leases.Receiver's")
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
