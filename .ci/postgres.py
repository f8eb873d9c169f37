"""Prove what README says of PostgreSQL on a real, throwaway PostgreSQL server.

    python3 .ci/postgres.py [--seed N]... [README]

recipes/fence.sql and README's ```sql blocks are PostgreSQL's.  A cluster is made in a temporary
folder (as the `postgres` user when run as root: PostgreSQL refuses root), reached by a Unix
socket only, stopped and removed at the end.  Then:
- fence.sql runs through psql, on its own table and on a reader's own (a nullable value, a
  numeric(12,2) value); each README block runs after it, and each `SELECT fenced_write(...);
  -- answer` in it prints that answer;
- each scenario of SCENARIOS, one claim each: psql sessions take its steps in order.  A step
  marked to wait for another session's row lock is seen waiting in pg_locks before the next
  step is sent (a handshake on the server's own state, never a sleep); any other step fails as
  soon as it waits, unless it is to end in a lock error (40P01, 55P03);
- at each seed, 4 psql processes at once send random writes under each isolation level, and as
  lone statements (statement pooling); each records its answer and a number drawn while it holds
  the row's lock.
Every answer must be the one its step names and leases.Receiver's (.ci/answers.py) after the
writes committed before it; every error the SQLSTATE its step names.  Exit 0 when all agree, 1
with the reason otherwise (the server's log when it cannot start), 2 for a bad argument, 130 on
Ctrl-C.  If initdb is missing, Debian's postgresql package is installed first.
"""

import argparse
import ast
import dataclasses
import decimal
import glob
import os
import pathlib
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import answers  # beside this file

ROOT = pathlib.Path(__file__).resolve().parent.parent
FENCE = ROOT / "recipes" / "fence.sql"
OK, FAILED, USAGE, INTERRUPTED = 0, 1, 2, 130
BOUND = 60.0  # seconds: only catches a hang
POLL = 0.02  # seconds a wait for a reply lasts before pg_locks is asked again; a reply ends it
SEEDS, PROCESSES, WRITES = (1, 2, 3), 4, 40
CALL = re.compile(r"^SELECT fenced_write\((.*)\);\s*-- (\w+)$", re.MULTILINE)
LOCK_ERRORS = ("40P01", "55P03")  # deadlock_detected, lock_not_available: each waits first
END = "--end-of-reply"  # what psql echoes after each statement, with the statement's SQLSTATE


class Failed(Exception):
    """Why this run fails, in one line."""


# --- the scenarios: data ---

Value = str | decimal.Decimal | None  # text, a numeric(12,2) column's, or NULL
Write = tuple[str, int, int, Value]  # resource, epoch, sequence, value


@dataclasses.dataclass(frozen=True)
class Step:
    session: str  # "A", "B", ...: one server session each, in the scenario's database
    send: str | Write  # a statement, or a write sent as `SELECT fenced_write(...)`
    expect: str = ""  # the answer or output; an error's SQLSTATE
    waits_for: str = ""  # the session whose lock this step waits for, until that one ends


@dataclasses.dataclass(frozen=True)
class Scenario:
    claim: str
    steps: tuple[Step, ...]
    database: str = "postgres"  # whose public.fenced: see TABLES


# Each database's table, made before fence.sql runs there (none: fence.sql's own).
TABLES = {
    "postgres": "",
    "nullable": "CREATE TABLE public.fenced (resource text PRIMARY KEY, epoch bigint NOT NULL,"
                " sequence bigint NOT NULL, value text)",
    "amounts": "CREATE TABLE public.fenced (resource text PRIMARY KEY, epoch bigint NOT NULL,"
               " sequence bigint NOT NULL, value numeric(12,2) NOT NULL)",
}
A, B = "A", "B"


def write(session: str, resource: str, epoch: int, sequence: int, value: Value, expect: str,
          waits_for: str = "") -> Step:
    return Step(session, (resource, epoch, sequence, value), expect, waits_for)


def sql(session: str, statement: str, expect: str = "", waits_for: str = "") -> Step:
    return Step(session, statement, expect, waits_for)


def held() -> list[Scenario]:
    """A refused write holds its row until its transaction ends; a write that waited for it then
    reads the row as that transaction left it (READ COMMITTED)."""
    return [Scenario(claim, (*seeded, sql(A, "BEGIN"), write(A, *first), write(B, *second, A),
                             sql(A, end)))
            for claim, seeded, first, second, end in [
        ("a refused write (stale) holds the row until COMMIT",
         [write(A, "r", 3, 1, "x", "applied")], ("r", 2, 1, "y", "stale"),
         ("r", 4, 1, "z", "applied"), "COMMIT"),
        ("a refused write (replay) holds the row until ROLLBACK",
         [write(A, "r", 3, 1, "x", "applied")], ("r", 3, 1, "x", "replay"),
         ("r", 3, 1, "x", "replay"), "ROLLBACK"),
        ("a refused write (conflict) holds the row until COMMIT",
         [write(A, "r", 3, 1, "x", "applied")], ("r", 3, 1, "y", "conflict"),
         ("r", 2, 1, "z", "stale"), "COMMIT"),
        ("a refused write (done) holds the row until COMMIT",
         [write(A, "r", 3, 1, "x", "applied"), write(A, "r", 3, 2, "done", "applied")],
         ("r", 4, 1, "x", "done"), ("r", 3, 2, "done", "replay"), "COMMIT"),
        ("a write that waited reads the row as committed", [write(A, "r", 1, 1, "x", "applied")],
         ("r", 3, 1, "z", "applied"), ("r", 2, 1, "y", "stale"), "COMMIT"),
        ("a write that waited reads the row as rolled back", [write(A, "r", 1, 1, "x", "applied")],
         ("r", 3, 1, "z", "applied"), ("r", 2, 1, "y", "applied"), "ROLLBACK"),
        ("a new row, committed, replays", [], ("r", 1, 1, "x", "applied"),
         ("r", 1, 1, "x", "replay"), "COMMIT"),
        ("a new row, committed, conflicts", [], ("r", 1, 1, "x", "applied"),
         ("r", 1, 1, "y", "conflict"), "COMMIT"),
        ("a new row, rolled back, is not there", [], ("r", 1, 1, "x", "applied"),
         ("r", 1, 1, "y", "applied"), "ROLLBACK"),
        ("done, committed, is final", [write(A, "r", 1, 1, "x", "applied")],
         ("r", 1, 2, "done", "applied"), ("r", 2, 1, "y", "done"), "COMMIT")]]


def larger_transactions() -> list[Scenario]:
    return [
        Scenario("applied is provisional: a later error rolls it back", (
            sql(A, "BEGIN"), write(A, "r", 1, 1, "x", "applied"),
            sql(A, "SELECT 1 / 0", "22012"),  # division_by_zero: the transaction is aborted
            sql(A, "COMMIT"), write(B, "r", 1, 1, "x", "applied"))),
        Scenario("lock_timeout ends a wait for a refused write's lock", (
            write(A, "r", 2, 1, "x", "applied"), sql(A, "BEGIN"), write(A, "r", 1, 1, "y", "stale"),
            sql(B, "BEGIN"), sql(B, "SET LOCAL lock_timeout = '10ms'"),
            write(B, "r", 3, 1, "z", "55P03"), sql(B, "ROLLBACK"), sql(A, "COMMIT"),
            write(B, "r", 3, 1, "z", "applied"))),
        Scenario("two rows written in one order by two sessions do not deadlock", (
            write(A, "r", 5, 1, "x", "applied"), write(A, "s", 5, 1, "x", "applied"),
            sql(A, "BEGIN"), sql(B, "BEGIN"), write(A, "r", 4, 1, "a", "stale"),
            write(B, "r", 6, 1, "b", "applied", A), write(A, "s", 4, 1, "a", "stale"),
            sql(A, "COMMIT"), write(B, "s", 6, 1, "b", "applied"), sql(B, "COMMIT"))),
        # Of two sessions waiting for each other, the first to look (deadlock_timeout) is
        # rolled back: B, at once.
        Scenario("in opposite orders they deadlock (40P01), refused writes too", (
            write(A, "r", 5, 1, "x", "applied"), write(A, "s", 5, 1, "x", "applied"),
            sql(A, "BEGIN"), sql(A, "SET LOCAL deadlock_timeout = '1min'"), sql(B, "BEGIN"),
            sql(B, "SET LOCAL deadlock_timeout = '1ms'"), write(A, "r", 4, 1, "a", "stale"),
            write(B, "s", 4, 1, "b", "stale"), write(A, "s", 4, 1, "a", "stale", B),
            write(B, "r", 4, 1, "b", "40P01"), sql(B, "ROLLBACK"), sql(A, "COMMIT")))]


LEVELS = ("REPEATABLE READ", "SERIALIZABLE")
# What the row holds, before and after another session's write, and a write of this session's
# that would answer `answer` if its transaction's snapshot came after the other's write.
WRITTEN_AFTER: list[tuple[str, Write | None, Write, Write]] = [
    ("applied", ("r", 2, 1, "x"), ("r", 3, 1, "y"), ("r", 4, 1, "a")),
    ("stale", ("r", 2, 1, "x"), ("r", 3, 1, "y"), ("r", 2, 1, "b")),
    ("replay", ("r", 2, 1, "x"), ("r", 3, 1, "y"), ("r", 3, 1, "y")),
    ("conflict", ("r", 2, 1, "x"), ("r", 3, 1, "y"), ("r", 3, 1, "z")),
    ("done", ("r", 2, 1, "x"), ("r", 3, 1, "done"), ("r", 4, 1, "a")),
    ("replay", None, ("r", 1, 1, "y"), ("r", 1, 1, "y"))]  # a row new to the snapshot


def isolation() -> list[Scenario]:
    """Under REPEATABLE READ and SERIALIZABLE, a write to a row another transaction wrote after
    the snapshot (its first statement's) fails with 40001 (serialization_failure), whatever it
    would answer; with the snapshot after, it answers as at READ COMMITTED."""
    scenarios = [Scenario("READ COMMITTED is the default",
                          (sql(A, "SHOW transaction_isolation", "read committed"),))]
    for level in LEVELS:
        for answer, before, other, mine in WRITTEN_AFTER:
            seeded = [write(B, *before, "applied")] if before else []
            row = "a new row" if before is None else "its row"
            scenarios += [
                Scenario(f"{level}: {answer} once {row} is written after a SELECT 1: 40001", (
                    *seeded, sql(A, f"BEGIN ISOLATION LEVEL {level}"), sql(A, "SELECT 1", "1"),
                    write(B, *other, "applied"), write(A, *mine, "40001"), sql(A, "ROLLBACK"))),
                Scenario(f"{level}: {answer} once {row} is written before the snapshot", (
                    *seeded, sql(A, f"BEGIN ISOLATION LEVEL {level}"),
                    write(B, *other, "applied"), write(A, *mine, answer), sql(A, "COMMIT")))]
        scenarios += [
            Scenario(f"{level}: a write waiting for a writer that commits: 40001", (
                write(B, "r", 1, 1, "x", "applied"), sql(A, f"BEGIN ISOLATION LEVEL {level}"),
                sql(A, "SELECT 1", "1"), sql(B, "BEGIN"), write(B, "r", 2, 1, "y", "applied"),
                write(A, "r", 1, 1, "x", "40001", B), sql(B, "COMMIT"), sql(A, "ROLLBACK"))),
            Scenario(f"{level}: a write waiting for a writer that rolls back: as stored", (
                write(B, "r", 1, 1, "x", "applied"), sql(A, f"BEGIN ISOLATION LEVEL {level}"),
                sql(A, "SELECT 1", "1"), sql(B, "BEGIN"), write(B, "r", 2, 1, "y", "applied"),
                write(A, "r", 1, 1, "x", "replay", B), sql(B, "ROLLBACK"), sql(A, "COMMIT"))),
            Scenario(f"{level}: a refused write after the snapshot writes nothing: no 40001", (
                write(B, "r", 2, 1, "x", "applied"), sql(A, f"BEGIN ISOLATION LEVEL {level}"),
                sql(A, "SELECT 1", "1"), write(B, "r", 1, 1, "y", "stale"),
                write(A, "r", 3, 1, "z", "applied"), sql(A, "COMMIT")))]
    return scenarios


def own_store() -> list[Scenario]:
    return [
        Scenario("a nullable value: NULL replays NULL, and is written over", (
            write(A, "r", 1, 1, None, "applied"), write(B, "r", 1, 1, None, "replay"),
            write(A, "r", 1, 1, "x", "conflict"), write(A, "r", 2, 1, "x", "applied"),
            write(A, "r", 3, 1, None, "applied"), write(A, "r", 2, 1, None, "stale"),
            write(A, "r", 3, 2, "done", "applied"), write(A, "r", 4, 1, None, "done")),
            "nullable"),
        Scenario("numeric(12,2): what is stored is compared, 10.005 as 10.01", (
            write(A, "r", 1, 1, decimal.Decimal("10.005"), "applied"),
            write(A, "r", 1, 1, decimal.Decimal("10.005"), "replay"),
            write(A, "r", 1, 1, decimal.Decimal("10.004"), "conflict"),
            write(A, "r", 2, 1, decimal.Decimal("10.004"), "applied"),
            write(A, "r", 2, 1, decimal.Decimal("9.995"), "replay")), "amounts"),
        Scenario("a temporary table named fenced does not take the writes", (
            write(B, "r", 2, 1, "x", "applied"),
            sql(A, "CREATE TEMPORARY TABLE fenced (LIKE public.fenced INCLUDING ALL)"),
            write(A, "r", 1, 1, "y", "stale"), write(A, "r", 3, 1, "z", "applied"),
            sql(A, "SELECT count(*) FROM pg_temp.fenced", "0"),
            write(B, "r", 3, 1, "z", "replay"))),
        Scenario("statement pooling: one SELECT fenced_write(...) is a transaction alone", (
            write(A, "r", 2, 1, "x", "applied"), write(B, "r", 2, 1, "x", "replay"),
            write(A, "r", 1, 1, "y", "stale"), write(B, "r", 3, 1, "y", "applied"))),
        Scenario("statement pooling: a setting one client left is the next one's", (
            sql(A, "SET default_transaction_isolation = 'repeatable read'"),
            write(B, "r", 1, 1, "x", "applied"), sql(B, "BEGIN"),
            write(B, "r", 2, 1, "y", "applied"), write(A, "r", 3, 1, "z", "40001", B),
            sql(B, "COMMIT"), sql(A, "RESET default_transaction_isolation"),
            write(A, "r", 3, 1, "z", "applied")))]


SCENARIOS = held() + larger_transactions() + isolation() + own_store()

# At each seed, every write in the transaction its mode sends it in.
MODES = {  # mode: the statements before the write, and after it
    "read committed": ("BEGIN;", "COMMIT;"),
    "repeatable read": ("BEGIN ISOLATION LEVEL REPEATABLE READ;", "COMMIT;"),
    "serializable": ("BEGIN ISOLATION LEVEL SERIALIZABLE;", "COMMIT;"),
    "statement": ("", ""),  # each statement a transaction of its own, as a statement pooler's
}

# --- the rules: what a write is, in SQL and in the model ---


def literal(value: Value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, decimal.Decimal):
        return str(value)
    return "'" + value.replace("'", "''") + "'"


def call(write: Write) -> str:
    resource, epoch, sequence, value = write
    return f"SELECT fenced_write({literal(resource)}, {epoch}, {sequence}, {literal(value)})"


def modelled(write: Write, answer: str) -> answers.Write:
    """The write as leases.Receiver takes it: its value as the column stores it (numeric(12,2)
    rounds half away from zero), NULL as a value no other write has."""
    resource, epoch, sequence, value = write
    if isinstance(value, decimal.Decimal):
        value = str(value.quantize(decimal.Decimal("0.01"), decimal.ROUND_HALF_UP))
    return resource, epoch, sequence, "\0NULL" if value is None else value, answer


def agree(calls: list[answers.Write], where: str) -> int:
    wrong = answers.mismatch(calls)
    if wrong:
        raise Failed(f"{where}: {wrong}")
    return len(calls)


# --- the engine ---


def play(number: int, scenario: Scenario, sessions: "Sessions") -> int:
    """Take the scenario's steps in order; the number of answers checked.  Its resources are
    its own: each name is prefixed with the scenario's number."""
    committed: list[answers.Write] = []  # in the order they took their rows' locks
    opened: dict[str, list[answers.Write] | None] = {}  # by session; None once an error aborted
    waiting: dict[str, tuple[int, Step]] = {}  # by session: its step that waits for a lock
    checked = 0

    def session(name: str) -> "Session":
        return sessions.get(scenario.database, name)

    def settle(index: int, step: Step, output: str, sqlstate: str) -> None:
        nonlocal checked
        where = f"{scenario.claim!r}, step {index + 1} ({step.session}: {shown(step.send)})"
        said = output if sqlstate == "00000" else sqlstate
        if said != step.expect:
            raise Failed(f"{where} gives {said!r}, not {step.expect!r}")
        mine = opened.get(step.session)
        if sqlstate != "00000":
            if step.session in opened:
                opened[step.session] = None
        elif isinstance(step.send, tuple):
            done = modelled(step.send, said)
            agree([*committed, *(mine or []), done], where)
            checked += 1
            (committed if mine is None else mine).append(done)
        if step.send in ("COMMIT", "ROLLBACK"):
            del opened[step.session]
            if step.send == "COMMIT":
                committed.extend(mine or [])
            for other, (pending, waited) in list(waiting.items()):
                if waited.waits_for == step.session:  # now it goes on
                    del waiting[other]
                    settle(pending, waited, *reply(session(other), waited, sessions))
        elif isinstance(step.send, str) and step.send.startswith("BEGIN"):
            opened[step.session] = []

    for index, step in enumerate(prefixed(number, scenario.steps)):
        if step.session in waiting:
            raise Failed(f"{scenario.claim!r}, step {index + 1}: {step.session} still waits")
        session(step.session).send(call(step.send) if isinstance(step.send, tuple) else
                                   step.send)
        if step.waits_for:
            wait(session(step.session), session(step.waits_for), sessions, step)
            waiting[step.session] = index, step
        else:
            settle(index, step, *reply(session(step.session), step, sessions))
    if opened or waiting:
        raise Failed(f"{scenario.claim!r} ends with {sorted({*opened, *waiting})} in a "
                     "transaction")
    sessions.reset(scenario.database)
    return checked


def prefixed(number: int, steps: tuple[Step, ...]) -> list[Step]:
    return [dataclasses.replace(step, send=(f"{number}-{step.send[0]}", *step.send[1:]))
            if isinstance(step.send, tuple) else step for step in steps]


def shown(send: str | Write) -> str:
    return call(send) if isinstance(send, tuple) else send


def reply(session: "Session", step: Step, sessions: "Sessions") -> tuple[str, str]:
    """The step's output and SQLSTATE.  A step that waits for a lock fails at once, unless it is
    to end in a lock error."""
    deadline = time.monotonic() + BOUND
    while not session.arrived(POLL):
        holders = sessions.blocking(session)
        if holders and step.expect not in LOCK_ERRORS:
            raise Failed(f"{shown(step.send)!r} waits for the lock of {', '.join(holders)}")
        if time.monotonic() > deadline:
            raise Failed(f"{shown(step.send)!r}: no reply in {BOUND:g} s")
    return session.reply()


def wait(session: "Session", holder: "Session", sessions: "Sessions", step: Step) -> None:
    """Return once `session` waits for `holder`'s lock, as pg_locks shows it."""
    deadline = time.monotonic() + BOUND
    while holder.name not in sessions.blocking(session):
        if session.arrived(POLL):
            raise Failed(f"{shown(step.send)!r} gives {session.reply()} without waiting for "
                         f"{holder.name}")
        if time.monotonic() > deadline:
            raise Failed(f"{shown(step.send)!r}: not seen waiting for {holder.name} in "
                         f"{BOUND:g} s")


def at_once(folder: str, seed: int, mode: str) -> tuple[int, int, set[str]]:
    """PROCESSES psql processes at once, each sending WRITES random writes in `mode`: the writes
    answered, those refused with 40001, and the answers seen.  Resources once-* are written at
    sequence 1 only (one value per epoch)."""
    before, after = MODES[mode]
    prefix = f"{seed}-{mode.replace(' ', '-')}"
    scripts = []
    for number in range(PROCESSES):
        chosen, lines = random.Random(f"{seed} {mode} {number}"), ["\\set n 0\n\\set answer ''\n"]
        for _ in range(WRITES):
            resource = chosen.choice(["once-0", "once-1", "jobs-0", "jobs-1"])
            sequence = 1 if resource.startswith("once") else chosen.randrange(1, 4)
            given: Write = (f"{prefix}-{resource}", chosen.randrange(1, 5), sequence,
                            chosen.choices(["a", "b", "done"], [5, 5, 1])[0])
            snapshot = "SELECT 1 AS snapshot \\gset\n" if before and chosen.random() < .5 else ""
            # nextval while the write holds its row's lock: the order the rows' locks gave
            lines.append(f"{before}\n{snapshot}{call(given)} AS answer, nextval('lock_order') AS n"
                         f" \\gset\nINSERT INTO decisions VALUES (:n, {call(given)[20:-1]}, :'answer');\n"
                         f"{after}\n")
        scripts.append("".join(lines))
    processes = [psql(folder, "postgres", script, "-v", "VERBOSITY=sqlstate")
                 for script in scripts]
    errors = []
    for process in processes:  # all started: they run at once
        output = process.communicate(timeout=BOUND)[0]
        errors += re.findall(r"ERROR:  (\w{5})$", output, re.MULTILINE)
        if process.returncode:
            raise Failed(f"{mode}: a psql exits {process.returncode}: {output.strip()[-300:]}")
    allowed = {"40001", "25P02"} if mode in ("repeatable read", "serializable") else set()
    if set(errors) - allowed:  # 25P02: the statements after a 40001, in its transaction
        raise Failed(f"{mode}: errors {sorted(set(errors) - allowed)}")
    rows = run(folder, "postgres", "SELECT resource, epoch, sequence, value, answer FROM "
               f"decisions WHERE resource LIKE '{prefix}-%' ORDER BY n").split("\n")
    calls = [(resource, int(epoch), int(sequence), value, answer) for resource, epoch,
             sequence, value, answer in (row.split("|") for row in rows if row)]
    if len(calls) + errors.count("40001") != PROCESSES * WRITES:
        raise Failed(f"{mode}: {len(calls)} answers and {errors.count('40001')} refusals, not "
                     f"{PROCESSES * WRITES} writes")
    return agree(calls, f"seed {seed}, {mode}"), errors.count("40001"), {c[4] for c in calls}


# --- plumbing ---


class Session:
    """A psql process holding one server session: a statement is sent, its reply read later."""

    def __init__(self, folder: str, database: str, name: str) -> None:
        self.name = name
        self.process = subprocess.Popen(
            [tool("psql"), "-X", "-q", "-At", "-h", folder, "-U", "postgres", "-d", database],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.buffered = b""
        self.send("SELECT pg_backend_pid()")
        self.pid = self.reply()[0]

    def send(self, statement: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{statement};\n\\echo {END} :SQLSTATE\n".encode())
        self.process.stdin.flush()

    def arrived(self, timeout: float) -> bool:
        """Whether the reply is here, waiting up to `timeout` seconds for it."""
        assert self.process.stdout is not None
        if f"{END} ".encode() not in self.buffered and select.select(
                [self.process.stdout], [], [], timeout)[0]:
            chunk = os.read(self.process.stdout.fileno(), 1 << 16)
            if not chunk:
                raise Failed(f"session {self.name}: psql ended: {self.buffered.decode()[-300:]}")
            self.buffered += chunk
        return f"{END} ".encode() in self.buffered

    def reply(self) -> tuple[str, str]:
        """The last statement's output (the error's message, if any) and SQLSTATE."""
        deadline = time.monotonic() + BOUND
        while not self.arrived(max(0.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                raise Failed(f"session {self.name}: no reply in {BOUND:g} s")
        output, _, rest = self.buffered.decode().partition(f"{END} ")
        sqlstate, _, rest = rest.partition("\n")
        self.buffered = rest.encode()
        return output.strip(), sqlstate

    def close(self) -> None:
        self.process.kill()
        self.process.communicate()


class Sessions:
    """Sessions by database and name, kept from one scenario to the next, and an observer."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.open: dict[tuple[str, str], Session] = {}
        self.observer = self.get("postgres", "observer")

    def get(self, database: str, name: str) -> Session:
        if (database, name) not in self.open:
            self.open[database, name] = Session(self.folder, database, name)
        return self.open[database, name]

    def blocking(self, session: Session) -> list[str]:
        """The names of the sessions whose locks `session` waits for."""
        self.observer.send(f"SELECT unnest(pg_blocking_pids({session.pid}))")
        pids = self.observer.reply()[0].split()
        return sorted(name for (_, name), other in self.open.items() if other.pid in pids)

    def reset(self, database: str) -> None:
        """Each session of `database` as new: outside a transaction, no setting or table left."""
        for (where, name), session in self.open.items():
            if where == database:
                session.send("DISCARD ALL")
                if session.reply()[1] != "00000":
                    raise Failed(f"session {name}: DISCARD ALL fails: still in a transaction")

    def close(self) -> None:
        for session in self.open.values():
            session.close()


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


def psql(folder: str, database: str, script: str, *options: str) -> "subprocess.Popen[str]":
    """psql running `script`, from a file: started, not waited for."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql", dir=folder, delete=False) as file:
        file.write(script)
    return subprocess.Popen(
        [tool("psql"), "-X", "-q", "-At", *options, "-h", folder, "-U", "postgres", "-d",
         database, "-f", file.name], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)


def run(folder: str, database: str, script: str) -> str:
    """The output of `script`, which must run without an error."""
    process = psql(folder, database, script, "-v", "ON_ERROR_STOP=1")
    output = process.communicate(timeout=BOUND)[0]
    if process.returncode:
        raise Failed(f"psql exits {process.returncode}: {output.strip()[-300:]}")
    return output


def start(folder: str) -> None:
    """A new cluster in `folder`, started; it listens on a Unix socket there only."""
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
    data = os.path.join(folder, "data")
    for command in (
            [tool("initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8",
             "--no-sync"],
            [tool("pg_ctl"), "-D", data, "-l", os.path.join(folder, "log"), "-w", "-t", "60",
             "-o", f"-c listen_addresses='' -k {folder} -c fsync=off", "start"]):
        done = subprocess.run(as_owner(command), capture_output=True, text=True, check=False)
        if done.returncode:
            log = pathlib.Path(folder, "log")
            why = (log.read_text() if log.exists() else "") + done.stderr + done.stdout
            raise Failed(f"the server cannot start: `{os.path.basename(command[0])}` exits "
                         f"{done.returncode}: {why.strip()[-500:]}")


def stop(folder: str) -> None:
    data = os.path.join(folder, "data")
    if os.path.exists(os.path.join(data, "postmaster.pid")):
        subprocess.run(as_owner([tool("pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop"]),
                       capture_output=True, check=False)


def say(line: str) -> None:
    """Print a line; a closed stdout (`| head`) is ignored."""
    try:
        print(f"postgres: {line}", flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def check(folder: str, readme: pathlib.Path, seeds: list[int]) -> None:
    blocks = re.findall(r"^```sql\n(.*?)^```", readme.read_text(encoding="utf-8"),
                        re.MULTILINE | re.DOTALL)
    fence = FENCE.read_text(encoding="utf-8")
    start(folder)
    for database, table in TABLES.items():
        if database != "postgres":
            run(folder, "postgres", f"CREATE DATABASE {database}")
        run(folder, database, f"{table};\n{fence}" if table else fence)
    shown = 0
    for number, block in enumerate(blocks, 1):
        said = run(folder, "postgres", block).split()
        calls = [(*ast.literal_eval(f"({arguments},)"), answer)
                 for arguments, answer in CALL.findall(block)]
        if said != [call[4] for call in calls]:
            raise Failed(f"README's sql block {number} prints {said}, not "
                         f"{[call[4] for call in calls]}")
        shown += agree(calls, f"README's sql block {number}")
    say(f"recipes/fence.sql runs on 3 tables; README's {len(blocks)} sql block(s): {shown} "
        "answers as shown")
    sessions = Sessions(folder)
    try:
        for number, scenario in enumerate(SCENARIOS, 1):
            checked = play(number, scenario, sessions)
            say(f"{scenario.claim}: {len(scenario.steps)} steps, {checked} answers")
    finally:
        sessions.close()
    run(folder, "postgres", "CREATE SEQUENCE lock_order; CREATE TABLE decisions (n bigint, "
                            "resource text, epoch bigint, sequence bigint, value text, answer text)")
    for seed in seeds:
        results = []
        for mode in MODES:
            count, refused, seen = at_once(folder, seed, mode)
            results.append(f"{mode} {count} answers ({', '.join(sorted(seen))})" +
                           (f" and {refused} 40001" if refused else ""))
        say(f"seed {seed}: {PROCESSES} sessions at once, {'; '.join(results)}: each answer "
            "leases.Receiver's")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("readme", nargs="?", type=pathlib.Path, default=ROOT / "README.md")
    parser.add_argument("--seed", type=int, action="append", help="a seed of the random writes "
                        f"(again for more; default: {', '.join(map(str, SEEDS))})")
    arguments = parser.parse_args(argv)
    # as root, in /tmp: the server runs as `postgres`, which may not enter a private TMPDIR
    folder = tempfile.mkdtemp(prefix="postgres-", dir="/tmp" if os.geteuid() == 0 else None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` cleans up
    try:
        check(folder, arguments.readme, arguments.seed or list(SEEDS))
        return OK
    except (Failed, OSError, subprocess.TimeoutExpired) as failure:
        say(f"FAILED: {failure}")
        return FAILED
    except KeyboardInterrupt:
        return INTERRUPTED
    finally:
        stop(folder)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
