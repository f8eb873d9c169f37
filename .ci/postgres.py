"""Prove what README says of PostgreSQL on a real, throwaway PostgreSQL server.

    python3 .ci/postgres.py [--seed N]... [README]

recipes/fence.sql and README's ```sql blocks are PostgreSQL's.  A cluster is made in a temporary
folder (as the `postgres` user when run as root: PostgreSQL refuses root), reached by a Unix
socket only, stopped and removed at the end.  Then:
- fence.sql runs through psql, on its own table and on a reader's own (a nullable value, a
  numeric(12,2) value, a jsonb value, columns in another order beside a defaulted one); each
  README block runs after it, and each `SELECT fenced_write(...); -- answer` in it prints that
  answer;
- each scenario of SCENARIOS, one claim each: psql sessions take its steps in order.  A step
  marked to wait for another session's row lock is seen waiting in pg_locks before the next
  step is sent (a handshake on the server's own state, never a sleep); any other step fails as
  soon as it waits, unless it is to end in a lock error (40P01, 55P03);
- at each seed, 8 psql processes at once send random writes to the same rows, 2 under each
  isolation level and 2 as lone statements (statement pooling); each records its answer and a
  number drawn while it holds the row's lock.
Every answer must be the one its step names and leases.Receiver's (.ci/answers.py) after the
writes committed before it; every error the SQLSTATE its step names.  Exit 0 when all agree, 1
with the reason otherwise (the server's log when it cannot start), 2 for a bad argument, 130 on
Ctrl-C.  If initdb is missing, Debian's postgresql package is installed first.
"""

import argparse
import collections
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
from typing import NoReturn

import answers  # beside this file

ROOT = pathlib.Path(__file__).resolve().parent.parent
FENCE = ROOT / "recipes" / "fence.sql"
OK, FAILED, USAGE, INTERRUPTED = 0, 1, 2, 130
BOUND = 60.0  # seconds: only catches a hang
LOCK_BOUND = 5.0  # seconds a step to end in a lock error may wait: its timeouts are 1-10 ms
POLL = 0.02  # seconds a wait for a reply lasts before pg_locks is asked again; a reply ends it
SEEDS, SESSIONS, WRITES = (1, 2, 3), 8, 30
CALL = re.compile(r"^SELECT fenced_write\((.*)\);\s*-- (\w+)$", re.MULTILINE)
LOCK_ERRORS = ("40P01", "55P03")  # deadlock_detected, lock_not_available: each waits first
END = "--end-of-reply"  # what psql echoes after each statement, with the statement's SQLSTATE
PSQLS: "list[subprocess.Popen[str] | subprocess.Popen[bytes]]" = []  # each ended at exit


class Failed(Exception):
    """Why this run fails, in one line."""


# --- the scenarios: data ---

Value = str | decimal.Decimal | None  # text, a numeric(12,2) column's, or NULL
Write = tuple[str, int, int, Value]  # resource, epoch, sequence, value


@dataclasses.dataclass(frozen=True)
class Scenario:
    """Steps, one a line: `SESSION: STATEMENT  -- EXPECTED`.  A session is a server session of
    its own, in `database`.  `fenced_write(...)` is sent as `SELECT fenced_write(...)`.  What
    is expected: the answer or output (nothing, when none is written), an error's SQLSTATE, or
    `waits for SESSION, then ...`: the statement waits for that session's lock until it ends."""

    claim: str
    script: str
    database: str = "postgres"  # whose public.fenced: see TABLES


# Each database's table, made before fence.sql runs there (none: fence.sql's own).
TABLES = {
    "postgres": "",
    "nullable": "CREATE TABLE public.fenced (resource text PRIMARY KEY, epoch bigint NOT NULL,"
                " sequence bigint NOT NULL, value text)",
    "amounts": "CREATE TABLE public.fenced (resource text PRIMARY KEY, epoch bigint NOT NULL,"
               " sequence bigint NOT NULL, value numeric(12,2) NOT NULL)",
    "reordered": "CREATE TABLE public.fenced (note text NOT NULL DEFAULT 'kept', value text"
                 " NOT NULL, sequence bigint NOT NULL, epoch bigint NOT NULL, resource text"
                 " PRIMARY KEY)",
    "json": "CREATE TABLE public.fenced (resource text PRIMARY KEY, epoch bigint NOT NULL,"
            " sequence bigint NOT NULL, value jsonb NOT NULL)",
}

SCENARIOS = [
    # A refused upsert still locks the row ...
    Scenario("a refused write (stale) holds its row until COMMIT", """
        A: fenced_write('r', 3, 1, 'x')  -- applied
        A: BEGIN
        A: fenced_write('r', 2, 1, 'y')  -- stale
        B: fenced_write('r', 4, 1, 'z')  -- waits for A, then applied
        A: COMMIT"""),
    Scenario("a refused write (replay) holds its row until ROLLBACK", """
        A: fenced_write('r', 3, 1, 'x')  -- applied
        A: BEGIN
        A: fenced_write('r', 3, 1, 'x')  -- replay
        B: fenced_write('r', 3, 1, 'x')  -- waits for A, then replay
        A: ROLLBACK"""),
    Scenario("a refused write (conflict) holds its row until COMMIT", """
        A: fenced_write('r', 3, 1, 'x')  -- applied
        A: BEGIN
        A: fenced_write('r', 3, 1, 'y')  -- conflict
        B: fenced_write('r', 2, 1, 'z')  -- waits for A, then stale
        A: COMMIT"""),
    Scenario("a refused write (done) holds its row until COMMIT", """
        A: fenced_write('r', 3, 1, 'x')  -- applied
        A: fenced_write('r', 3, 2, 'done')  -- applied
        A: BEGIN
        A: fenced_write('r', 4, 1, 'x')  -- done
        B: fenced_write('r', 3, 1, 'x')  -- waits for A, then done
        A: COMMIT"""),
    # ... and the next statement reads it as it stays.
    Scenario("a write that waited reads the row as committed", """
        A: fenced_write('r', 1, 1, 'x')  -- applied
        A: BEGIN
        A: fenced_write('r', 3, 1, 'z')  -- applied
        B: fenced_write('r', 2, 1, 'y')  -- waits for A, then stale
        A: COMMIT"""),
    Scenario("a write that waited reads the row as rolled back", """
        A: fenced_write('r', 1, 1, 'x')  -- applied
        A: BEGIN
        A: fenced_write('r', 3, 1, 'z')  -- applied
        B: fenced_write('r', 2, 1, 'y')  -- waits for A, then applied
        A: ROLLBACK"""),
    Scenario("a write that waited for a new row: committed", """
        A: BEGIN
        A: fenced_write('r', 1, 1, 'x')  -- applied
        B: fenced_write('r', 1, 1, 'x')  -- waits for A, then replay
        A: COMMIT"""),
    Scenario("a write that waited for a new row: rolled back", """
        A: BEGIN
        A: fenced_write('r', 1, 1, 'x')  -- applied
        B: fenced_write('r', 1, 1, 'y')  -- waits for A, then applied
        A: ROLLBACK"""),
    Scenario("a holder's own sequence 1 after its sequence 2: stale; after done: done", """
        A: fenced_write('r', 3, 1, 'running')  -- applied
        A: fenced_write('r', 3, 2, 'paid')  -- applied
        A: fenced_write('r', 3, 1, 'running')  -- stale
        A: fenced_write('r', 3, 3, 'done')  -- applied
        A: fenced_write('r', 3, 1, 'running')  -- done
        A: fenced_write('r', 3, 3, 'done')  -- replay"""),
    # Inside a larger transaction ...
    Scenario("applied is provisional: a later error in its transaction rolls it back", """
        A: BEGIN
        A: fenced_write('r', 1, 1, 'x')  -- applied
        A: SELECT 1 / 0  -- 22012
        A: COMMIT
        B: fenced_write('r', 1, 1, 'x')  -- applied"""),
    Scenario("lock_timeout ends a wait for a refused write's lock: 55P03", """
        A: fenced_write('r', 2, 1, 'x')  -- applied
        A: BEGIN
        A: fenced_write('r', 1, 1, 'y')  -- stale
        B: BEGIN
        B: SET LOCAL lock_timeout = '10ms'
        B: fenced_write('s', 1, 1, 'z')  -- applied
        B: fenced_write('r', 3, 1, 'z')  -- 55P03
        B: COMMIT
        A: COMMIT
        B: fenced_write('r', 3, 1, 'z')  -- applied
        B: fenced_write('s', 1, 1, 'y')  -- applied"""),
    Scenario("SET LOCAL lock_timeout alone (as a statement pooler sends it) does nothing", """
        A: fenced_write('r', 2, 1, 'x')  -- applied
        A: BEGIN
        A: fenced_write('r', 1, 1, 'y')  -- stale
        B: SET LOCAL lock_timeout = '10ms'  -- WARNING:  SET LOCAL can only be used in transaction blocks
        B: fenced_write('r', 3, 1, 'z')  -- waits for A, then applied
        A: COMMIT"""),
    Scenario("ALTER FUNCTION ... SET lock_timeout bounds every call, lone ones too: 55P03", """
        A: fenced_write('r', 2, 1, 'x')  -- applied
        A: ALTER FUNCTION public.fenced_write SET lock_timeout = '10ms'
        A: BEGIN
        A: fenced_write('r', 1, 1, 'y')  -- stale
        B: fenced_write('r', 3, 1, 'z')  -- 55P03
        A: COMMIT
        A: ALTER FUNCTION public.fenced_write RESET lock_timeout
        B: fenced_write('r', 3, 1, 'z')  -- applied"""),
    Scenario("two sessions writing two rows in one order do not deadlock", """
        A: fenced_write('r', 5, 1, 'x')  -- applied
        A: fenced_write('s', 5, 1, 'x')  -- applied
        A: BEGIN
        B: BEGIN
        A: fenced_write('r', 4, 1, 'a')  -- stale
        B: fenced_write('r', 6, 1, 'b')  -- waits for A, then applied
        A: fenced_write('s', 4, 1, 'a')  -- stale
        A: COMMIT
        B: fenced_write('s', 6, 1, 'b')  -- applied
        B: COMMIT"""),
    # Of two sessions waiting for each other, the first to look, a deadlock_timeout after it
    # began to wait, is rolled back: B here.
    Scenario("in opposite orders they deadlock, refused writes too: 40P01", """
        A: fenced_write('r', 5, 1, 'x')  -- applied
        A: fenced_write('s', 5, 1, 'x')  -- applied
        A: SET deadlock_timeout = '1min'
        B: SET deadlock_timeout = '1ms'
        A: BEGIN
        B: BEGIN
        B: fenced_write('t', 1, 1, 'b')  -- applied
        A: fenced_write('r', 4, 1, 'a')  -- stale
        B: fenced_write('s', 4, 1, 'b')  -- stale
        A: fenced_write('s', 4, 1, 'a')  -- waits for B, then stale
        B: fenced_write('r', 4, 1, 'b')  -- 40P01
        B: SELECT 1  -- 25P02
        B: ROLLBACK
        A: COMMIT
        A: fenced_write('t', 1, 1, 'a')  -- applied"""),
    # Use READ COMMITTED, the default ...
    Scenario("READ COMMITTED is the default", """
        A: SHOW transaction_isolation  -- read committed"""),
    # A nullable value, the columns' types, the table's schema.
    Scenario("a nullable value: NULL replays NULL, and is written over", """
        A: fenced_write('r', 1, 1, NULL)  -- applied
        B: fenced_write('r', 1, 1, NULL)  -- replay
        A: fenced_write('r', 1, 1, 'x')  -- conflict
        A: fenced_write('r', 2, 1, 'x')  -- applied
        A: fenced_write('r', 3, 1, NULL)  -- applied
        A: fenced_write('r', 2, 1, NULL)  -- stale
        A: fenced_write('r', 3, 2, 'done')  -- applied
        A: fenced_write('r', 4, 1, NULL)  -- done""", "nullable"),
    Scenario("numeric(12,2): the value is compared as stored, 10.005 as 10.01", """
        A: fenced_write('r', 1, 1, 10.005)  -- applied
        A: fenced_write('r', 1, 1, 10.005)  -- replay
        A: fenced_write('r', 1, 1, 10.004)  -- conflict
        A: fenced_write('r', 2, 1, 10.004)  -- applied
        A: fenced_write('r', 2, 1, 9.995)  -- replay
        A: SELECT 10.005::numeric(12,2)  -- 10.01""", "amounts"),
    Scenario("the table's own column order, and a column with a default", """
        A: fenced_write('r', 1, 1, 'x')  -- applied
        A: fenced_write('r', 1, 1, 'x')  -- replay
        A: fenced_write('r', 2, 1, 'done')  -- applied
        A: fenced_write('r', 3, 1, 'y')  -- done
        A: SELECT note || ' ' || value FROM public.fenced  -- kept done""", "reordered"),
    Scenario('jsonb: "done" is not done (its text form keeps the quotes)', """
        A: fenced_write('r', 1, 1, '"done"')  -- applied
        A: fenced_write('r', 2, 1, '"x"')  -- applied
        A: SELECT value::text = '"x"' FROM public.fenced  -- t""", "json"),
    Scenario("a temporary table named fenced takes no write", """
        B: fenced_write('r', 2, 1, 'x')  -- applied
        A: CREATE TEMPORARY TABLE fenced (LIKE public.fenced INCLUDING ALL)
        A: SELECT count(*) FROM fenced  -- 0
        A: fenced_write('r', 1, 1, 'y')  -- stale
        A: fenced_write('r', 3, 1, 'z')  -- applied
        A: SELECT count(*) FROM pg_temp.fenced  -- 0
        B: fenced_write('r', 3, 1, 'z')  -- replay"""),
    # Statement pooling: each session below plays the server session several clients share.
    Scenario("statement pooling: one SELECT fenced_write(...) is a transaction alone", """
        A: fenced_write('r', 2, 1, 'x')  -- applied
        B: fenced_write('r', 2, 1, 'x')  -- replay
        A: fenced_write('r', 1, 1, 'y')  -- stale
        B: fenced_write('r', 3, 1, 'y')  -- applied"""),
    Scenario("statement pooling: a setting one client left applies to the next", """
        A: SET default_transaction_isolation = 'repeatable read'
        B: BEGIN
        B: fenced_write('r', 1, 1, 'x')  -- applied
        A: fenced_write('r', 2, 1, 'y')  -- waits for B, then 40001
        B: COMMIT
        A: RESET default_transaction_isolation
        B: BEGIN
        B: fenced_write('r', 2, 1, 'x')  -- applied
        A: fenced_write('r', 3, 1, 'y')  -- waits for B, then applied
        B: COMMIT"""),
]

# Under REPEATABLE READ and SERIALIZABLE, whatever a write would answer (the row as B leaves
# it), and whether B wrote the row after A's snapshot (the first statement, here SELECT 1) or
# before it.
WOULD_ANSWER = [  # answer; the row before, B's write, A's write: fenced_write('r', ...)
    ("applied", "2, 1, 'x'", "3, 1, 'y'", "4, 1, 'a'"),
    ("stale", "2, 1, 'x'", "3, 1, 'y'", "2, 1, 'b'"),
    ("replay", "2, 1, 'x'", "3, 1, 'y'", "3, 1, 'y'"),
    ("conflict", "2, 1, 'x'", "3, 1, 'y'", "3, 1, 'z'"),
    ("done", "2, 1, 'x'", "3, 1, 'done'", "4, 1, 'a'"),
    ("replay", "", "1, 1, 'y'", "1, 1, 'y'")]  # a new row

for level in ("REPEATABLE READ", "SERIALIZABLE"):
    for answer, before, other, mine in WOULD_ANSWER:
        seeded = f"B: fenced_write('r', {before})  -- applied" if before else ""
        SCENARIOS += [
            Scenario(f"{level}: {answer}, the row written after SELECT 1: 40001", f"""
                {seeded}
                A: BEGIN ISOLATION LEVEL {level}
                A: SELECT 1  -- 1
                B: fenced_write('r', {other})  -- applied
                A: fenced_write('r', {mine})  -- 40001
                A: ROLLBACK"""),
            Scenario(f"{level}: {answer}, the row written after SET LOCAL, which takes no "
                     "snapshot", f"""
                {seeded}
                A: BEGIN ISOLATION LEVEL {level}
                A: SET LOCAL lock_timeout = '2s'
                B: fenced_write('r', {other})  -- applied
                A: fenced_write('r', {mine})  -- {answer}
                A: COMMIT"""),
            Scenario(f"{level}: {answer}, the row written before the first statement", f"""
                {seeded}
                A: BEGIN ISOLATION LEVEL {level}
                B: fenced_write('r', {other})  -- applied
                A: fenced_write('r', {mine})  -- {answer}
                A: COMMIT""")]
    SCENARIOS += [
        Scenario(f"{level}: waiting for a writer that commits: 40001, the whole transaction "
                 "rolled back", f"""
            B: fenced_write('r', 1, 1, 'x')  -- applied
            A: BEGIN ISOLATION LEVEL {level}
            A: fenced_write('s', 1, 1, 'x')  -- applied
            B: BEGIN
            B: fenced_write('r', 2, 1, 'y')  -- applied
            A: fenced_write('r', 1, 1, 'x')  -- waits for B, then 40001
            B: COMMIT
            A: SELECT 1  -- 25P02
            A: ROLLBACK
            B: fenced_write('s', 1, 1, 'y')  -- applied"""),
        Scenario(f"{level}: waiting for a writer that rolls back: the row as it stays", f"""
            B: fenced_write('r', 1, 1, 'x')  -- applied
            A: BEGIN ISOLATION LEVEL {level}
            A: SELECT 1  -- 1
            B: BEGIN
            B: fenced_write('r', 2, 1, 'y')  -- applied
            A: fenced_write('r', 1, 1, 'x')  -- waits for B, then replay
            B: ROLLBACK
            A: COMMIT"""),
        Scenario(f"{level}: a refused write after the snapshot wrote nothing: no 40001", f"""
            B: fenced_write('r', 2, 1, 'x')  -- applied
            A: BEGIN ISOLATION LEVEL {level}
            A: SELECT 1  -- 1
            B: fenced_write('r', 1, 1, 'y')  -- stale
            A: fenced_write('r', 3, 1, 'z')  -- applied
            A: COMMIT""")]

SCENARIOS.append(Scenario(
    "SERIALIZABLE: another row's read, changed by a write that committed: 40001 at COMMIT", """
    A: BEGIN ISOLATION LEVEL SERIALIZABLE
    A: SELECT count(*) FROM public.fenced WHERE resource = '@a'  -- 0
    B: BEGIN ISOLATION LEVEL SERIALIZABLE
    B: SELECT count(*) FROM public.fenced WHERE resource = '@b'  -- 0
    A: fenced_write('b', 2, 1, 'b2')  -- applied
    B: fenced_write('a', 2, 1, 'a2')  -- applied
    A: COMMIT
    B: COMMIT  -- 40001
    B: fenced_write('a', 2, 1, 'a2')  -- applied"""))
SCENARIOS.append(Scenario(
    "SERIALIZABLE: the same, the write after the other's COMMIT: 40001 at the write", """
    A: BEGIN ISOLATION LEVEL SERIALIZABLE
    A: SELECT count(*) FROM public.fenced WHERE resource = '@a'  -- 0
    B: BEGIN ISOLATION LEVEL SERIALIZABLE
    B: SELECT count(*) FROM public.fenced WHERE resource = '@b'  -- 0
    A: fenced_write('b', 2, 1, 'b2')  -- applied
    A: COMMIT
    B: fenced_write('a', 2, 1, 'a2')  -- 40001
    B: ROLLBACK
    B: fenced_write('a', 2, 1, 'a2')  -- applied"""))

# At each seed, every write in the transaction its mode sends it in.
MODES = {  # mode: the statements before the write, and after it
    "read committed": ("BEGIN;", "COMMIT;"),
    "repeatable read": ("BEGIN ISOLATION LEVEL REPEATABLE READ;", "COMMIT;"),
    "serializable": ("BEGIN ISOLATION LEVEL SERIALIZABLE;", "COMMIT;"),
    "statement": ("", ""),  # each statement a transaction of its own, as a statement pooler's
}

# --- the rules: a step, and a write in SQL and in the model ---

STEP = re.compile(r"(\w+): (.+?)(?:  -- (?:waits for (\w+), then )?(.*))?")
WRITE = re.compile(r"fenced_write\((.*)\)")
LITERAL = re.compile(r"'(?:[^']|'')*'|NULL|\d+(?:\.\d+)?")


@dataclasses.dataclass(frozen=True)
class Step:
    session: str
    statement: str
    write: Write | None  # the statement's write, if it is one
    expect: str
    waits_for: str


def steps(scenario: Scenario, number: int) -> list[Step]:
    """The scenario's steps; each resource's name prefixed with `number`, to be its own (in a
    statement other than a write, a resource is written '@name')."""
    found = []
    for line in filter(None, map(str.strip, scenario.script.splitlines())):
        step = STEP.fullmatch(line)
        if not step:
            raise Failed(f"{scenario.claim!r}: not a step: {line!r}")
        session, statement, waits_for, expect = step.groups()
        write: Write | None = None
        if called := WRITE.fullmatch(statement):
            resource, epoch, sequence, value = arguments(called[1])
            write = (f"{number}-{resource}", epoch, sequence, value)
            statement = call(write)
        statement = statement.replace("'@", f"'{number}-")  # a resource named in a read
        found.append(Step(session, statement, write, expect or "", waits_for or ""))
    return found


def arguments(text: str) -> Write:
    """The write of `fenced_write(text)`."""
    match [parsed(token) for token in LITERAL.findall(text)]:
        case [str(resource), int(epoch), int(sequence),
              (str() | decimal.Decimal() | None) as value]:
            return resource, epoch, sequence, value
    raise Failed(f"not a write: fenced_write({text})")


def parsed(token: str) -> object:
    """An SQL literal's value: 'quoted' is text, 10.005 numeric, NULL None."""
    if token == "NULL":
        return None
    if token.startswith("'"):
        return token[1:-1].replace("''", "'")
    return decimal.Decimal(token) if "." in token else int(token)


def literal(value: Value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, decimal.Decimal):
        return str(value)
    return "'" + value.replace("'", "''") + "'"


def listed(write: Write) -> str:
    resource, epoch, sequence, value = write
    return f"{literal(resource)}, {epoch}, {sequence}, {literal(value)}"


def call(write: Write) -> str:
    return f"SELECT fenced_write({listed(write)})"


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


def play(number: int, scenario: Scenario, sessions: "Sessions") -> list[answers.Write]:
    """Take the scenario's steps in order, each giving what it expects.  Its answered writes,
    for the model: those committed, in the order their rows' locks gave them; then each
    transaction rolled back, after what was committed before it, under names of its own."""
    committed: list[answers.Write] = []
    rolled_back: list[answers.Write] = []
    opened: dict[str, list[answers.Write]] = {}  # by session: its open transaction's writes
    aborted: set[str] = set()  # sessions whose open transaction an error ended
    waiting: dict[str, tuple[int, Step]] = {}  # by session: its step that waits for a lock

    def session(name: str) -> "Session":
        return sessions.get(scenario.database, name)

    def where(index: int, step: Step) -> str:
        return f"{scenario.claim!r}, step {index + 1} ({step.session}: {step.statement})"

    def settle(index: int, step: Step, output: str, sqlstate: str) -> None:
        said = output if sqlstate == "00000" else sqlstate
        if said != step.expect:
            raise Failed(f"{where(index, step)} gives {said!r}, not {step.expect!r}")
        if sqlstate != "00000":
            if step.session in opened:
                aborted.add(step.session)
        elif step.write:
            opened.get(step.session, committed).append(modelled(step.write, said))
        if step.statement in ("COMMIT", "ROLLBACK"):
            kept = opened.pop(step.session)
            if step.statement == "COMMIT" and step.session not in aborted:
                committed.extend(kept)
            else:
                names = {write[0] for write in kept}
                rolled_back.extend((f"{write[0]}, rolled back at step {index + 1}", *write[1:])
                                   for write in [*committed, *kept] if write[0] in names)
            aborted.discard(step.session)
            for other, (pending, waited) in list(waiting.items()):
                if waited.waits_for == step.session:  # now it goes on
                    del waiting[other]
                    settle(pending, waited, *reply(session(other), waited, sessions,
                                                   where(pending, waited)))
        elif step.statement.startswith("BEGIN"):
            opened[step.session] = []

    for index, step in enumerate(steps(scenario, number)):
        if step.session in waiting:
            raise Failed(f"{scenario.claim!r}, step {index + 1}: {step.session} still waits")
        session(step.session).send(step.statement)
        if step.waits_for:
            wait(session(step.session), session(step.waits_for), sessions, where(index, step))
            waiting[step.session] = index, step
        else:
            settle(index, step, *reply(session(step.session), step, sessions,
                                       where(index, step)))
    if opened or waiting:
        raise Failed(f"{scenario.claim!r} ends with {sorted({*opened, *waiting})} in a "
                     "transaction")
    sessions.reset(scenario.database)
    return committed + rolled_back


def reply(session: "Session", step: Step, sessions: "Sessions", where: str) -> tuple[str, str]:
    """The step's output and SQLSTATE.  A step that waits for a lock fails at once, unless it is
    to end in a lock error, which must come within LOCK_BOUND."""
    bound = LOCK_BOUND if step.expect in LOCK_ERRORS else BOUND
    deadline = time.monotonic() + bound
    while not session.arrived(POLL):
        holders = sessions.blocking(session)
        if holders and step.expect not in LOCK_ERRORS:
            raise Failed(f"{where} waits for the lock of {', '.join(holders)}")
        if time.monotonic() > deadline:
            raise Failed(f"{where}: no reply in {bound:g} s")
    return session.reply()


def wait(session: "Session", holder: "Session", sessions: "Sessions", where: str) -> None:
    """Return once `session` waits for `holder`'s lock, as pg_locks shows it."""
    deadline = time.monotonic() + BOUND
    while holder.name not in sessions.blocking(session):
        if session.arrived(POLL):
            said, sqlstate = session.reply()
            raise Failed(f"{where} gives {said or sqlstate!r} without waiting for {holder.name}")
        if time.monotonic() > deadline:
            raise Failed(f"{where}: not seen waiting for {holder.name} in {BOUND:g} s")


def at_once(folder: str, seed: int) -> str:
    """SESSIONS psql processes at once, as many in each mode, each sending WRITES random writes
    to the same rows: what they gave.  Resources once-* are written at sequence 1 only (one
    value per epoch)."""
    scripts = []
    for number in range(SESSIONS):
        mode = list(MODES)[number % len(MODES)]
        before, after = MODES[mode]
        chosen = random.Random(f"{seed} {number}")
        lines = ["\\set n 0\n\\set answer ''\n"]  # set even before a first write fails
        for index in range(WRITES):
            resource = chosen.choice(["once-0", "once-1", "jobs-0", "jobs-1"])
            sequence = 1 if resource.startswith("once") else chosen.randrange(1, 4)
            epoch = index // 10 + chosen.randrange(1, 3)  # rising, as the sessions go on
            value = "done" if sequence == 3 and chosen.random() < .2 else chosen.choice("ab")
            given: Write = (f"{seed}-{resource}", epoch, sequence, value)
            snapshot = "SELECT 1 AS snapshot \\gset\n" if before and chosen.random() < .5 else ""
            # nextval while the write holds its row's lock: the order the rows' locks gave
            lines.append(f"{before}\n{snapshot}{call(given)} AS answer, nextval('lock_order')"
                         f" AS n \\gset\nINSERT INTO decisions VALUES (:n, {listed(given)}, "
                         f":'answer');\n{after}\n")
        scripts.append((mode, "".join(lines)))
    processes = [(mode, psql(folder, "postgres", script, "-v", "VERBOSITY=sqlstate"))
                 for mode, script in scripts]
    refused = []
    for mode, process in processes:  # all started: they run at once
        output = process.communicate(timeout=BOUND)[0]
        errors = re.findall(r"ERROR:  (\w{5})$", output, re.MULTILINE)
        allowed = {"40001", "25P02"} if mode in ("repeatable read", "serializable") else set()
        if process.returncode or set(errors) - allowed:  # 25P02: the rest of a 40001's
            raise Failed(f"seed {seed}, {mode}: psql exits {process.returncode}, errors "
                         f"{sorted(set(errors))}: {output.strip()[-300:]}")
        refused += [mode] * errors.count("40001")
    rows = run(folder, "postgres", "SELECT resource, epoch, sequence, value, answer FROM "
               f"decisions WHERE resource LIKE '{seed}-%' ORDER BY n").split("\n")
    calls = [(resource, int(epoch), int(sequence), value, answer) for resource, epoch,
             sequence, value, answer in (row.split("|") for row in rows if row)]
    if len(calls) + len(refused) != SESSIONS * WRITES:
        raise Failed(f"seed {seed}: {len(calls)} answers and {len(refused)} 40001, not "
                     f"{SESSIONS * WRITES} writes")
    agree(calls, f"seed {seed}")
    counted = collections.Counter(answer for *_, answer in calls)
    return (f"{', '.join(f'{count} {answer}' for answer, count in sorted(counted.items()))}; "
            f"40001 {len(refused)} times ({', '.join(sorted(set(refused))) or 'none'})")


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
        calls = [modelled(arguments(given), answer) for given, answer in CALL.findall(block)]
        if said != [call[4] for call in calls]:
            raise Failed(f"README's sql block {number} prints {said}, not "
                         f"{[call[4] for call in calls]}")
        shown += agree(calls, f"README's sql block {number}")
    say(f"recipes/fence.sql runs on {len(TABLES)} tables; README's {len(blocks)} sql block(s): "
        f"{shown} answers as shown")
    sessions, answered = Sessions(folder), []
    for number, scenario in enumerate(SCENARIOS, 1):
        answered += play(number, scenario, sessions)
        say(f"{number}. {scenario.claim}")
    agree(answered, "the scenarios")
    say(f"the {len(SCENARIOS)} scenarios: each step as expected, each answer leases.Receiver's")
    run(folder, "postgres", "CREATE SEQUENCE lock_order; CREATE TABLE decisions (n bigint,"
        " resource text, epoch bigint, sequence bigint, value text, answer text)")
    for seed in seeds:
        say(f"seed {seed}: {SESSIONS} sessions at once, {SESSIONS // len(MODES)} in each mode: "
            f"{at_once(folder, seed)}; each answer leases.Receiver's")


# --- plumbing ---


class Session:
    """A psql process holding one server session: a statement is sent, its reply read later."""

    def __init__(self, folder: str, database: str, name: str) -> None:
        self.name = name
        self.process = subprocess.Popen(
            [tool("psql"), "-X", "-q", "-At", "-h", folder, "-U", "postgres", "-d", database],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        PSQLS.append(self.process)
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
    process = subprocess.Popen(
        [tool("psql"), "-X", "-q", "-At", *options, "-h", folder, "-U", "postgres", "-d",
         database, "-f", file.name], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    PSQLS.append(process)
    return process


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


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not the usage too
        self.exit(USAGE, f"{self.prog}: error: {message} (see --help)\n")


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument("readme", nargs="?", type=pathlib.Path, default=ROOT / "README.md")
    parser.add_argument("--seed", type=int, action="append", help="a seed of the random writes "
                        f"(again for more; default: {', '.join(map(str, SEEDS))})")
    options = parser.parse_args(argv)
    if not options.readme.is_file():
        parser.error(f"no file {str(options.readme)!r}")
    # as root, in /tmp: the server runs as `postgres`, which may not enter a private TMPDIR
    folder = tempfile.mkdtemp(prefix="postgres-", dir="/tmp" if os.geteuid() == 0 else None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` cleans up
    try:
        check(folder, options.readme, options.seed or list(SEEDS))
        return OK
    except (Failed, OSError, subprocess.TimeoutExpired) as failure:
        say(f"FAILED: {failure}")
        return FAILED
    except KeyboardInterrupt:
        return INTERRUPTED
    finally:
        for process in PSQLS:
            process.kill()
            process.wait()
        stop(folder)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
