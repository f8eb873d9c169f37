"""Receivers of a reader's own, to point the explorer at: README's Python fence, correct fences
written otherwise (CORRECT), and broken copies of it.  Each is made as NAME(path), answers
write(resource, epoch, value) with an Outcome's text, and has read(resource) and close().

    python3 explorer/explore.py --receiver examples:ReadmeFence                 # passes
    python3 explorer/explore.py --receiver examples:GreaterOrEqual --program acquire write retry
    python3 explorer/explore.py --statements --receiver examples:ReadBeforeTransaction \\
        --last-tick 1
"""

import ctypes
import sqlite3

__all__ = ["ANSWER", "CORRECT", "UPSERT", "AutocommitGreaterOrEqual", "DecidesInPython", "GreaterOrEqual",
           "ImmediateIsolation", "NarrowEpoch", "NoOpCommit", "ReadBeforeTransaction", "ReadOnlyFastPath",
           "ReadmeFence", "SharedHighWater", "TextEpoch", "WithConnection", "fenced_write"]

# README's "Apply it to your own store", word for word.
UPSERT = """INSERT INTO fenced (resource, epoch, value) VALUES (:resource, :epoch, :value)
  ON CONFLICT (resource) DO UPDATE SET epoch = excluded.epoch, value = excluded.value
  WHERE excluded.epoch > fenced.epoch"""
ANSWER = """SELECT CASE WHEN changes() = 1 THEN 'applied'
  WHEN epoch = :epoch AND value = :value THEN 'replay'
  WHEN epoch = :epoch THEN 'conflict' ELSE 'stale' END
  FROM fenced WHERE resource = :resource"""


def fenced_write(connection: sqlite3.Connection, write: dict[str, object],
                 upsert: str = UPSERT, answer: str = ANSWER) -> str:
    connection.execute("BEGIN IMMEDIATE")  # the write lock first, waiting up to `timeout`
    try:
        connection.execute(upsert, write)
        outcome = connection.execute(answer, write).fetchone()[0]
        connection.execute("COMMIT")
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise
    return str(outcome)


class ReadmeFence:
    """An epoch-only fence (README's, before recipes/fence.py added the sequence), wrapped as
    the explorer asks: its table in the given file."""

    def __init__(self, path: str) -> None:
        self.connection = sqlite3.connect(path, isolation_level=None, timeout=10)
        self.connection.execute("CREATE TABLE IF NOT EXISTS fenced (resource TEXT PRIMARY KEY,"
                                " epoch INTEGER NOT NULL, value TEXT NOT NULL)")

    def write(self, resource: str, epoch: int, value: str) -> str:
        return fenced_write(self.connection, {"resource": resource, "epoch": epoch,
                                              "value": value}, *self.statements())

    def statements(self) -> tuple[str, str]:
        return UPSERT, ANSWER

    def read(self, resource: str) -> tuple[int, str] | None:
        """The stored (epoch, value): optional, it lets the statement mode check the file."""
        row = self.connection.execute("SELECT epoch, value FROM fenced WHERE resource = ?",
                                      (resource,)).fetchone()
        return None if row is None else (row[0], row[1])

    def close(self) -> None:
        self.connection.close()


# Correct fences written otherwise: each passes both modes (test_explore.py).


class NoOpCommit(ReadmeFence):
    """README's fence after a defensive commit(), which commits nothing: none is open."""

    def write(self, resource: str, epoch: int, value: str) -> str:
        self.connection.commit()
        return super().write(resource, epoch, value)


class ReadOnlyFastPath(ReadmeFence):
    """A read-only transaction first: a lower epoch than stored is stale, whatever comes
    after, since stored epochs only rise; else README's fence decides."""

    def write(self, resource: str, epoch: int, value: str) -> str:
        self.connection.execute("BEGIN")
        row = self.connection.execute("SELECT epoch FROM fenced WHERE resource = ?",
                                      (resource,)).fetchone()
        self.connection.execute("COMMIT")
        if row is not None and epoch < row[0]:
            return "stale"
        return super().write(resource, epoch, value)


class WithConnection(ReadmeFence):
    """Python's idiom: `with connection:` commits the block, or rolls it back."""

    def write(self, resource: str, epoch: int, value: str) -> str:
        write = {"resource": resource, "epoch": epoch, "value": value}
        with self.connection:
            self.connection.execute("BEGIN IMMEDIATE")
            self.connection.execute(UPSERT, write)
            return str(self.connection.execute(ANSWER, write).fetchone()[0])


class ImmediateIsolation(ReadmeFence):
    """sqlite3 opens the transaction itself (isolation_level "IMMEDIATE": BEGIN IMMEDIATE
    before the upsert); the fence commits."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.connection.close()
        self.connection = sqlite3.connect(path, isolation_level="IMMEDIATE", timeout=10)

    def write(self, resource: str, epoch: int, value: str) -> str:
        write = {"resource": resource, "epoch": epoch, "value": value}
        try:
            self.connection.execute(UPSERT, write)
            outcome = str(self.connection.execute(ANSWER, write).fetchone()[0])
            self.connection.commit()
        except BaseException:
            self.connection.rollback()
            raise
        return outcome


class DecidesInPython(ReadmeFence):
    """Reads the stored pair and decides in Python, all inside one BEGIN IMMEDIATE."""

    def write(self, resource: str, epoch: int, value: str) -> str:
        connection = self.connection
        connection.execute("BEGIN IMMEDIATE")
        try:
            row = connection.execute("SELECT epoch, value FROM fenced WHERE resource = ?",
                                     (resource,)).fetchone()
            if row is None or epoch > row[0]:
                connection.execute("INSERT OR REPLACE INTO fenced VALUES (?, ?, ?)",
                                   (resource, epoch, value))
                outcome = "applied"
            else:
                outcome = "stale" if epoch < row[0] else "replay" if value == row[1] else \
                    "conflict"
            connection.execute("COMMIT")
        except BaseException:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
        return outcome


CORRECT = ("ReadmeFence", "NoOpCommit", "ReadOnlyFastPath", "WithConnection",
           "ImmediateIsolation", "DecidesInPython")

# Broken copies.


class GreaterOrEqual(ReadmeFence):
    """Broken: `>=` for `>`, so the same epoch is applied again, never a replay or conflict."""

    def statements(self) -> tuple[str, str]:
        return UPSERT.replace("excluded.epoch > fenced.epoch",
                              "excluded.epoch >= fenced.epoch"), ANSWER


class AutocommitGreaterOrEqual(GreaterOrEqual):
    """Broken: `>=` for `>`, with no transaction: each statement commits as it runs."""

    def write(self, resource: str, epoch: int, value: str) -> str:
        write = {"resource": resource, "epoch": epoch, "value": value}
        upsert, answer = self.statements()
        self.connection.execute(upsert, write)
        return str(self.connection.execute(answer, write).fetchone()[0])


class ReadBeforeTransaction(ReadmeFence):
    """Broken: it reads the stored epoch before its transaction, and decides on that read."""

    def write(self, resource: str, epoch: int, value: str) -> str:
        row = self.connection.execute("SELECT epoch, value FROM fenced WHERE resource = ?",
                                      (resource,)).fetchone()
        if row is not None and epoch < row[0]:
            return "stale"
        if row is not None and epoch == row[0]:
            return "replay" if value == row[1] else "conflict"
        self.connection.execute("BEGIN IMMEDIATE")
        try:
            self.connection.execute("INSERT OR REPLACE INTO fenced VALUES (?, ?, ?)",
                                    (resource, epoch, value))
            self.connection.execute("COMMIT")
        except BaseException:
            if self.connection.in_transaction:
                self.connection.execute("ROLLBACK")
            raise
        return "applied"


class TextEpoch(ReadmeFence):
    """Broken at epoch 10: its epoch column is TEXT, so epochs compare as text ('10' < '9').
    Caught at once from a first epoch of 9: --first-epoch 9."""

    def __init__(self, path: str) -> None:
        self.connection = sqlite3.connect(path, isolation_level=None, timeout=10)
        self.connection.execute("CREATE TABLE IF NOT EXISTS fenced (resource TEXT PRIMARY KEY,"
                                " epoch TEXT NOT NULL, value TEXT NOT NULL)")

    def read(self, resource: str) -> tuple[int, str] | None:
        pair = super().read(resource)
        return None if pair is None else (int(pair[0]), pair[1])


class NarrowEpoch(ReadmeFence):
    """Broken past 2**31 - 1: it keeps the epoch as a 32-bit int, and 2**31 wraps negative.
    Caught at once from the largest such epoch: --first-epoch 2147483647."""

    def write(self, resource: str, epoch: int, value: str) -> str:
        return super().write(resource, ctypes.c_int32(epoch).value, value)


class SharedHighWater(ReadmeFence):
    """Broken across resources: it refuses as stale an epoch below the highest it has stored
    for ANY resource.  With two holders of two resources each resource only ever gets epoch 1,
    so it passes there; a third holder gives the first resource epoch 2 and shows it."""

    def write(self, resource: str, epoch: int, value: str) -> str:
        (highest,) = self.connection.execute("SELECT max(epoch) FROM fenced").fetchone()
        if highest is not None and epoch < highest:
            return "stale"
        return super().write(resource, epoch, value)
