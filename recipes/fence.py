"""The fence in your own store: SQLite (3.24 or later), one BEGIN IMMEDIATE transaction per write.

A write (resource, epoch, sequence, value) is stored when no row is, or when the stored value
is not "done" and (epoch, sequence) is above the stored pair: a holder numbers its writes under
one lease 1, 2, 3, and pairs compare as epochs do.  Otherwise nothing changes and the answer
says why: "replay" (this exact write is stored), "done" (a finished job stays finished),
"stale" (a higher pair is stored), or "conflict" (another value at this very pair).

    python3 recipes/fence.py    # a few writes, each with its answer

Copy it beside your code; it needs nothing but sqlite3.
"""

import sqlite3

__all__ = ["ANSWER", "TABLE", "WRITE", "fenced_write"]

TABLE = """CREATE TABLE IF NOT EXISTS fenced (resource TEXT PRIMARY KEY,
  epoch INTEGER NOT NULL, sequence INTEGER NOT NULL, value TEXT NOT NULL)"""
WRITE = """INSERT INTO fenced VALUES (:resource, :epoch, :sequence, :value)
  ON CONFLICT (resource) DO UPDATE SET
    epoch = excluded.epoch, sequence = excluded.sequence, value = excluded.value
  WHERE fenced.value <> 'done'
    AND (excluded.epoch, excluded.sequence) > (fenced.epoch, fenced.sequence)"""
ANSWER = """SELECT CASE WHEN changes() = 1 THEN 'applied'
  WHEN (epoch, sequence, value) = (:epoch, :sequence, :value) THEN 'replay'
  WHEN value = 'done' THEN 'done'
  WHEN (epoch, sequence) <> (:epoch, :sequence) THEN 'stale' ELSE 'conflict' END
  FROM fenced WHERE resource = :resource"""


def fenced_write(db: sqlite3.Connection, write: dict[str, object]) -> str:
    """The answer to one write {resource, epoch, sequence, value}, in a transaction of its own:
    `db` is opened with isolation_level=None and outside any transaction.  Whatever interrupts
    it, a Ctrl-C too, the transaction is rolled back: none is left open."""
    if db.in_transaction:  # never roll back, nor commit, a transaction of the caller's
        raise ValueError("fenced_write needs a connection outside any transaction")
    try:
        db.execute("BEGIN IMMEDIATE")  # the write lock before the first read
        db.execute(WRITE, write)
        [(answer,)] = db.execute(ANSWER, write).fetchall()
        db.execute("COMMIT")
    finally:
        if db.in_transaction:  # anything raised, at any point after BEGIN returned
            db.execute("ROLLBACK")
    return str(answer)


if __name__ == "__main__":
    db = sqlite3.connect(":memory:", isolation_level=None, timeout=30)
    db.execute(TABLE)
    db.execute("INSERT INTO fenced VALUES ('job-7', 0, 0, 'queued')")  # below every epoch
    for row in [("invoice-42", 2, 1, "paid by B"), ("invoice-42", 1, 1, "paid by A"),
                ("invoice-42", 2, 1, "paid by B"), ("invoice-42", 2, 1, "refunded"),
                ("job-7", 3, 2, "done"), ("job-7", 4, 1, "running")]:
        write = dict(zip(("resource", "epoch", "sequence", "value"), row))
        print(*row, "->", fenced_write(db, write))
