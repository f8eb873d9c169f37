"""Leases with fencing epochs: one trusted authority and the receivers it protects, on SQLite.

The contract, in short:

* ``LeaseAuthority`` grants a lease on a resource to one holder at a time.  Every grant takes the
  next epoch for that resource (1, 2, 3, ...), inside one ``BEGIN IMMEDIATE`` transaction, so no
  epoch is ever handed out twice.  Time is logical: the caller passes the tick ``now``; a lease is
  live while it has a holder and ``now < expires_at``, so it is expired *at* its expiry tick.
* ``Receiver`` is the service a holder writes to.  It holds one (epoch, value) per resource.
  Fenced, it compares and writes atomically: a higher epoch is applied, the same epoch with the
  same value is a replay, the same epoch with another value a conflict, a lower epoch is stale.
  Unfenced, it applies every write blindly.  Every decision is appended to a durable log, in
  the same transaction; what the receiver holds is what its latest decision left stored.
* The receiver never asks the authority or any clock: a lower epoch is refused only once the
  receiver has itself stored a higher one.

This is a single-host executable model, not a lease service: see README.md for its limits.
"""

import contextlib
import dataclasses
import enum
import os
import sqlite3
import tempfile
from collections.abc import Iterator
from types import TracebackType
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # typing.Self exists from 3.11; only type checkers read this
    from typing import Self

__all__ = [
    "Lease",
    "LeaseAuthority",
    "LeaseError",
    "LeaseHeld",
    "LeaseLost",
    "Outcome",
    "Receiver",
    "WriteResult",
]

# Only bounds how long a transaction waits for SQLite's write lock; no rule depends on it.
BUSY_TIMEOUT_SECONDS = 30.0

_SQLITE_INT_MAX = 2**63 - 1


@dataclasses.dataclass(frozen=True)
class Lease:
    """A grant of `resource` to `holder`, fenced by `epoch`, live until tick `expires_at`."""

    resource: str
    holder: str
    epoch: int
    expires_at: int


class Outcome(str, enum.Enum):
    """What a receiver decided about one write."""

    APPLIED = "applied"  # stored: the first write, a higher epoch, or any write when unfenced
    REPLAY = "replay"  # same epoch and same value as stored: nothing to do
    CONFLICT = "conflict"  # same epoch, another value: refused, one value per epoch
    STALE = "stale"  # lower epoch than stored: refused


@dataclasses.dataclass(frozen=True)
class WriteResult:
    """A receiver's decision: what was attempted, and what it holds after the call."""

    outcome: Outcome
    resource: str
    epoch: int
    value: str
    stored_epoch: int
    stored_value: str


class LeaseError(Exception):
    """The lease authority refused an operation, or a database could not be used."""


class LeaseHeld(LeaseError):
    """An acquisition met a live lease; `lease` (and its fields) say who holds it until when."""

    def __init__(self, lease: Lease) -> None:
        super().__init__(
            f"resource {lease.resource!r} is held by {lease.holder!r} at epoch {lease.epoch} "
            f"until tick {lease.expires_at}"
        )
        self.lease = lease
        self.holder = lease.holder
        self.epoch = lease.epoch
        self.expires_at = lease.expires_at

    def __reduce__(self) -> tuple[type["LeaseHeld"], tuple[Lease]]:
        return type(self), (self.lease,)


class LeaseLost(LeaseError):
    """`lease` is no longer the current lease of its resource; `current` is, or None."""

    def __init__(self, lease: Lease, current: Lease | None, reason: str) -> None:
        super().__init__(
            f"lease on {lease.resource!r} held by {lease.holder!r} at epoch {lease.epoch} "
            f"is lost: {reason}"
        )
        self.lease = lease
        self.current = current
        self.reason = reason

    def __reduce__(self) -> tuple[type["LeaseLost"], tuple[Lease, Lease | None, str]]:
        return type(self), (self.lease, self.current, self.reason)


# --- validation: every check runs before a transaction starts, so bad input changes nothing ---


def _check_text(name: str, value: object, *, empty_ok: bool = False) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {value!r}")
    if not value and not empty_ok:
        raise ValueError(f"{name} must be a non-empty str, got {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{name} must be encodable as UTF-8, got {value!r}") from None
    return value


def _check_int(name: str, value: object, *, minimum: int) -> int:
    # bool is an int subclass, but True is not a tick, a duration or an epoch.
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if not minimum <= value <= _SQLITE_INT_MAX:
        raise ValueError(
            f"{name} must be an int from {minimum} to {_SQLITE_INT_MAX}, got {value!r}"
        )
    return value


def _check_expiry(now: object, ttl: object) -> int:
    expires_at = _check_int("now", now, minimum=0) + _check_int("ttl", ttl, minimum=1)
    if expires_at > _SQLITE_INT_MAX:
        raise ValueError(f"now + ttl must not exceed {_SQLITE_INT_MAX}, got {now!r} + {ttl!r}")
    return expires_at


def _check_lease(value: object) -> Lease:
    if not isinstance(value, Lease):
        raise TypeError(f"lease must be a Lease, got {value!r}")
    _check_text("lease.resource", value.resource)
    _check_text("lease.holder", value.holder)
    _check_int("lease.epoch", value.epoch, minimum=1)
    return value


# --- storage: one way to open a database, one way to run a transaction ---


def _connect(
    path: str | os.PathLike[str], schema: tuple[tuple[str, str], ...]
) -> sqlite3.Connection:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {path!r}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise LeaseError(
            f"cannot open database {os.fspath(path)!r}: folder {folder!r} does not exist"
        )
    try:
        if not os.path.exists(path):
            _create(path, folder)
        # isolation_level=None: the sqlite3 module starts no transaction of its own; we do.
        connection = sqlite3.connect(path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None)
    except (OSError, sqlite3.Error) as exc:
        raise LeaseError(f"cannot open database {os.fspath(path)!r}: {exc}") from exc
    try:
        connection.execute("PRAGMA journal_mode=WAL")  # a no-op once the file is in WAL mode
        tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master")}
        # Only a new database needs the write lock here: opening must not wait for a writer.
        if not tables.issuperset(table for table, _ in schema):
            with _transaction(connection):
                for _, statement in schema:
                    connection.execute(statement)
    except sqlite3.Error as exc:
        connection.close()
        raise LeaseError(f"cannot use database {os.fspath(path)!r}: {exc}") from exc
    return connection


def _create(path: str | os.PathLike[str], folder: str) -> None:
    """Put an empty WAL database at `path` in one atomic step, unless another process did.

    Switching a file to WAL needs the file to itself, so processes that open one new file at
    the same moment can see "database is locked".  Here the switch happens on a private draft
    that is then linked into place: `path` is always either absent or already in WAL mode.
    """
    descriptor, draft = tempfile.mkstemp(dir=folder, prefix=".leases-", suffix=".draft")
    os.close(descriptor)
    try:
        with contextlib.closing(sqlite3.connect(draft)) as connection:
            connection.execute("PRAGMA journal_mode=WAL")
        with contextlib.suppress(FileExistsError):  # another process was first: use its file
            os.link(draft, path)
    finally:
        os.unlink(draft)


@contextlib.contextmanager
def _transaction(connection: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """Run the block as one write transaction, rolled back if it raises.

    IMMEDIATE takes the write lock before the first read, so a read-decide-write block cannot
    interleave with another writer; a deferred BEGIN would read, then fail to upgrade.
    """
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield connection
    except BaseException:
        if connection.in_transaction:  # SQLite may have rolled back already, on some errors
            connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")


class _Database:
    """A connection of this process's own, closed by `close()` or at the end of a `with`."""

    _SCHEMA: tuple[tuple[str, str], ...] = ()  # (table, its CREATE TABLE IF NOT EXISTS)

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._connection = _connect(path, self._SCHEMA)

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> "Self":
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


# --- the authority ---


class _Row(NamedTuple):
    """A resource's row at the authority: its latest lease, or just its epoch once released."""

    resource: str
    holder: str | None  # None once released; the epoch stays, so it is never granted again
    epoch: int
    expires_at: int

    def lease(self) -> Lease | None:
        if self.holder is None:
            return None
        return Lease(self.resource, self.holder, self.epoch, self.expires_at)

    def live_lease(self, now: int) -> Lease | None:
        # The one expiry rule: a lease is live before its expiry tick, and expired at it.
        return self.lease() if now < self.expires_at else None


class LeaseAuthority(_Database):
    """The single trusted source of leases and epochs."""

    _SCHEMA = (
        (
            "leases",
            (
                "CREATE TABLE IF NOT EXISTS leases ("
                " resource TEXT PRIMARY KEY, holder TEXT, epoch INTEGER NOT NULL,"
                " expires_at INTEGER NOT NULL) WITHOUT ROWID"
            ),
        ),
    )

    def acquire(self, resource: str, holder: str, *, now: int, ttl: int) -> Lease:
        """Grant `resource` to `holder` with the next epoch, or raise LeaseHeld if it is live."""
        _check_text("resource", resource)
        _check_text("holder", holder)
        expires_at = _check_expiry(now, ttl)
        with _transaction(self._connection) as connection:
            row = self._load(connection, resource)
            held = None if row is None else row.live_lease(now)
            if held is not None:
                raise LeaseHeld(held)
            lease = Lease(resource, holder, 1 if row is None else row.epoch + 1, expires_at)
            connection.execute(
                "INSERT INTO leases (resource, holder, epoch, expires_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (resource) DO UPDATE SET holder = excluded.holder,"
                " epoch = excluded.epoch, expires_at = excluded.expires_at",
                (lease.resource, lease.holder, lease.epoch, lease.expires_at),
            )
        return lease

    def renew(self, lease: Lease, *, now: int, ttl: int) -> Lease:
        """Extend `lease` to `now + ttl` if it is still the current, unexpired lease."""
        _check_lease(lease)
        expires_at = _check_expiry(now, ttl)
        with _transaction(self._connection) as connection:
            row = self._current_or_lost(connection, lease)
            if row.live_lease(now) is None:
                raise LeaseLost(lease, row.lease(), f"it expired at tick {row.expires_at}")
            connection.execute(
                "UPDATE leases SET expires_at = ? WHERE resource = ?", (expires_at, lease.resource)
            )
        return dataclasses.replace(lease, expires_at=expires_at)

    def release(self, lease: Lease) -> None:
        """Give up `lease` early; its epoch stays, so the next holder gets a higher one."""
        _check_lease(lease)
        with _transaction(self._connection) as connection:
            self._current_or_lost(connection, lease)
            connection.execute(
                "UPDATE leases SET holder = NULL WHERE resource = ?", (lease.resource,)
            )

    def current(self, resource: str, *, now: int) -> Lease | None:
        """The lease on `resource` that is live at tick `now`, or None."""
        _check_text("resource", resource)
        _check_int("now", now, minimum=0)
        row = self._load(self._connection, resource)
        return None if row is None else row.live_lease(now)

    @staticmethod
    def _load(connection: sqlite3.Connection, resource: str) -> _Row | None:
        row = connection.execute(
            "SELECT resource, holder, epoch, expires_at FROM leases WHERE resource = ?",
            (resource,),
        ).fetchone()
        return None if row is None else _Row(*row)

    def _current_or_lost(self, connection: sqlite3.Connection, lease: Lease) -> _Row:
        """The stored row, if `lease` is still its lease (live or not); otherwise LeaseLost."""
        row = self._load(connection, lease.resource)
        if row is None or row.holder is None:
            raise LeaseLost(lease, None, "the resource has no holder")
        if (row.epoch, row.holder) != (lease.epoch, lease.holder):
            raise LeaseLost(
                lease,
                row.lease(),
                f"the current lease is epoch {row.epoch} held by {row.holder!r}",
            )
        return row


# --- the receiver ---


def _decide(stored: tuple[int, str] | None, epoch: int, value: str) -> Outcome:
    """The fence: compare a write with what the receiver has already stored."""
    if stored is None or epoch > stored[0]:
        return Outcome.APPLIED
    if epoch < stored[0]:
        return Outcome.STALE
    return Outcome.REPLAY if value == stored[1] else Outcome.CONFLICT


class Receiver(_Database):
    """A service that holders write to; fenced, it refuses epochs older than it has stored.

    Its one table is its decision log.  What it holds for a resource is what its latest
    decision left stored, so the record and the log cannot disagree, and one row appended per
    write is the whole cost of remembering.  A fenced and an unfenced receiver keep separate
    logs, even in one database file: they model two different services.  Neither asks the
    authority or a clock anything.
    """

    _SCHEMA = (
        (
            "receiver_decisions",
            (
                "CREATE TABLE IF NOT EXISTS receiver_decisions ("
                " fenced INTEGER NOT NULL, resource TEXT NOT NULL, seq INTEGER NOT NULL,"
                " outcome TEXT NOT NULL, epoch INTEGER NOT NULL, value TEXT NOT NULL,"
                " stored_epoch INTEGER NOT NULL, stored_value TEXT NOT NULL,"
                " PRIMARY KEY (fenced, resource, seq)) WITHOUT ROWID"
            ),
        ),
    )

    def __init__(self, path: str | os.PathLike[str], *, fenced: bool = True) -> None:
        if not isinstance(fenced, bool):
            raise TypeError(f"fenced must be a bool, got {fenced!r}")
        super().__init__(path)
        self.fenced = fenced

    def write(self, resource: str, epoch: int, value: str) -> WriteResult:
        """Decide on one write and log the decision, in one transaction; the log is the record."""
        _check_text("resource", resource)
        _check_int("epoch", epoch, minimum=1)
        _check_text("value", value, empty_ok=True)
        with _transaction(self._connection) as connection:
            seq, stored = self._latest(connection, resource)
            outcome = _decide(stored, epoch, value) if self.fenced else Outcome.APPLIED
            if outcome is Outcome.APPLIED:
                stored = (epoch, value)
            assert stored is not None  # only an applied write can find the record empty
            connection.execute(
                "INSERT INTO receiver_decisions (fenced, resource, seq, outcome, epoch, value,"
                " stored_epoch, stored_value) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (self.fenced, resource, seq + 1, outcome.value, epoch, value, *stored),
            )
        return WriteResult(outcome, resource, epoch, value, *stored)

    def read(self, resource: str) -> tuple[int, str] | None:
        """The stored (epoch, value) of `resource`, or None if nothing was ever applied."""
        _check_text("resource", resource)
        return self._latest(self._connection, resource)[1]

    def decisions(self, resource: str) -> list[WriteResult]:
        """Every decision this receiver made about `resource`, oldest first."""
        _check_text("resource", resource)
        rows = self._connection.execute(
            "SELECT outcome, resource, epoch, value, stored_epoch, stored_value"
            " FROM receiver_decisions WHERE fenced = ? AND resource = ? ORDER BY seq",
            (self.fenced, resource),
        )
        return [WriteResult(Outcome(outcome), *rest) for outcome, *rest in rows]

    def _latest(
        self, connection: sqlite3.Connection, resource: str
    ) -> tuple[int, tuple[int, str] | None]:
        """The number of decisions so far, and the (epoch, value) the latest one left stored."""
        row = connection.execute(
            "SELECT seq, stored_epoch, stored_value FROM receiver_decisions"
            " WHERE fenced = ? AND resource = ? ORDER BY seq DESC LIMIT 1",
            (self.fenced, resource),
        ).fetchone()
        return (0, None) if row is None else (row[0], (row[1], row[2]))
