"""Leases with fencing epochs: one trusted authority and the receivers it protects, on SQLite.

* ``LeaseAuthority`` grants a lease on a resource to one holder at a time.  Every grant takes
  the next epoch of its resource (1, 2, 3, ...) inside one ``BEGIN IMMEDIATE`` transaction, so
  no epoch is handed out twice.  Time is logical: the caller passes the tick ``now``.  A lease
  is live while ``now < expires_at``: it has expired *at* its expiry tick.
* ``Receiver`` is the service a holder writes to.  It stores one (epoch, value) per resource.
  Fenced, it compares and writes in one transaction: a higher epoch is applied, the same
  epoch with the same value is a replay, with another value a conflict, a lower epoch is
  stale.  Unfenced, it applies every write.  Each decision is logged in the same transaction.
* The receiver never asks the authority or a clock: it refuses a lower epoch only once it has
  itself stored a higher one.

A single-host executable model, not a lease service: README.md says what it does not cover.
"""

import contextlib
import dataclasses
import enum
import os
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

__all__ = [
    "Lease", "LeaseAuthority", "LeaseError", "LeaseHeld", "LeaseLost", "Outcome", "Receiver",
    "WriteResult", "is_live",
]

# How long a call waits for another connection's write lock: a bound, no rule depends on it.
BUSY_TIMEOUT_SECONDS = 30.0

_LARGEST = 2**63 - 1  # SQLite's largest integer: ticks and epochs stay within it


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
    REPLAY = "replay"  # the same epoch and value as stored: nothing to do
    CONFLICT = "conflict"  # the same epoch, another value: refused, one value per epoch
    STALE = "stale"  # a lower epoch than stored: refused


@dataclasses.dataclass(frozen=True)
class WriteResult:
    """A receiver's decision: what was attempted, and what it stores after the call."""

    outcome: Outcome
    resource: str
    epoch: int
    value: str
    stored_epoch: int
    stored_value: str


class LeaseError(Exception):
    """The authority refused a call, or the database could not be used."""


class LeaseHeld(LeaseError):
    """An acquisition met a live lease: `lease` says who holds it, at which epoch, until when."""

    def __init__(self, lease: Lease) -> None:
        super().__init__(f"resource {lease.resource!r} is held by {lease.holder!r} at epoch "
                         f"{lease.epoch} until tick {lease.expires_at}")
        self.lease = lease

    def __reduce__(self) -> tuple[Any, ...]:  # pickled by its attributes, not its message
        return type(self), (self.lease,)


class LeaseLost(LeaseError):
    """`lease` is no longer the live lease of its resource; `current` is the one that is, if any."""

    def __init__(self, lease: Lease, current: Lease | None, reason: str) -> None:
        super().__init__(f"lease on {lease.resource!r} held by {lease.holder!r} at epoch "
                         f"{lease.epoch} is lost: {reason}")
        self.lease = lease
        self.current = current
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.lease, self.current, self.reason)


# --- the two rules ---


def is_live(expires_at: int, *, now: int) -> bool:
    """The expiry rule: a lease is live before its expiry tick, and expired at it."""
    return _check_int("now", now, least=0) < _check_int("expires_at", expires_at, least=0)


def _decide(stored: tuple[int, str] | None, epoch: int, value: str) -> Outcome:
    """The fence: a write against the (epoch, value) the receiver has stored, if any."""
    if stored is None or epoch > stored[0]:
        return Outcome.APPLIED
    if epoch < stored[0]:
        return Outcome.STALE
    return Outcome.REPLAY if value == stored[1] else Outcome.CONFLICT


# --- the database both classes stand on ---

# The model's two tables, as SQLite keeps their CREATE statements.  Every database this
# library makes has both, so that an authority and its receivers can share one file.
_TABLES = {
    "leases": "CREATE TABLE leases ("
              " resource TEXT PRIMARY KEY, holder TEXT, epoch INTEGER NOT NULL,"
              " expires_at INTEGER NOT NULL) WITHOUT ROWID",
    "receiver_decisions": "CREATE TABLE receiver_decisions ("
                          " fenced INTEGER NOT NULL, resource TEXT NOT NULL, seq INTEGER NOT NULL,"
                          " outcome TEXT NOT NULL, epoch INTEGER NOT NULL, value TEXT NOT NULL,"
                          " stored_epoch INTEGER NOT NULL, stored_value TEXT NOT NULL,"
                          " PRIMARY KEY (fenced, resource, seq)) WITHOUT ROWID",
}


_D = TypeVar("_D", bound="_Database")
_T = TypeVar("_T")


class _Database:
    """One SQLite connection, on a database of this library's (made if the file is new).
    Threads take turns on one lock (a connection has one transaction); `close()` it, or use
    the object in a `with` block."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        name = os.fspath(path) if isinstance(path, os.PathLike) else path
        _check_text("path", name)  # a str, not empty
        # Processes share a file, not a memory; a NUL byte or a URI names no plain file.
        if name == ":memory:" or "\0" in name or name.startswith("file:"):
            raise ValueError(f"path must name a file, got {path!r}")
        self.path = name
        self._lock = threading.Lock()
        try:
            _check_header(name)
            connection = sqlite3.connect(name, timeout=BUSY_TIMEOUT_SECONDS,
                                         isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise LeaseError(f"cannot open database {name!r}: {exc}") from exc
        self._connection: sqlite3.Connection | None = connection  # the lock orders its calls
        try:
            found = self._transaction(_schema, write=False)
            if not found:  # a new file: the first of the openers racing makes the tables
                found = self._transaction(lambda c: _schema(c) or _make_tables(c))
            _check_tables(found, name)
            self._transaction(_ask_for_wal, write=False)
        except BaseException:
            connection.close()  # no other thread has this object yet: no turn to wait for
            raise

    def close(self) -> None:
        """Close the connection, once no other thread's call is using it; again does nothing."""
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def __enter__(self: _D) -> _D:  # noqa: PYI019 - typing.Self is Python 3.11+
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _transaction(self, body: Callable[[sqlite3.Connection], _T], *,
                     write: bool = True) -> _T:
        """`body(connection)` in one BEGIN IMMEDIATE transaction if `write` (the write lock
        before the first read): committed when it returns, else rolled back, a Ctrl-C at any
        bytecode too (`with` takes the C lock and promises its release in one step; BEGIN is
        inside the `try`).  SQLite's errors come out as LeaseError, the body's as they are."""
        with self._lock:
            connection = self._connection
            if connection is None:
                raise LeaseError(f"database {self.path!r} is closed")
            try:
                try:
                    if write:
                        connection.execute("BEGIN IMMEDIATE")
                    result = body(connection)
                    if write:
                        connection.execute("COMMIT")
                    return result
                finally:
                    if connection.in_transaction:  # not committed: SQLite's error, ours, Ctrl-C
                        connection.execute("ROLLBACK")
            except sqlite3.Error as exc:
                raise LeaseError(f"database {self.path!r}: {exc}") from exc


def _schema(connection: sqlite3.Connection) -> list[tuple[str, str]]:
    """What the database holds, of every kind, with the marks a program may set on a file
    (user_version, application_id): nothing in a new or empty file."""
    return connection.execute(
        "SELECT name, sql FROM sqlite_master"
        " UNION ALL SELECT 'user_version', user_version FROM pragma_user_version"
        " WHERE user_version != 0"
        " UNION ALL SELECT 'application_id', application_id FROM pragma_application_id"
        " WHERE application_id != 0").fetchall()


def _check_header(path: str) -> None:
    """A file neither empty nor SQLite's is refused before SQLite sees it: SQLite takes a
    file of 1 byte for an empty database, and would overwrite it."""
    if os.path.exists(path) and not os.path.isfile(path):  # a FIFO would block the open
        raise LeaseError(f"database {path!r} is not this library's: not a regular file")
    with contextlib.suppress(FileNotFoundError), open(path, "rb") as file:
        if file.read(16) not in (b"", b"SQLite format 3\0"):  # every SQLite file's start
            raise LeaseError(f"database {path!r} is not this library's: not SQLite's at all")


def _make_tables(connection: sqlite3.Connection) -> list[tuple[str, str]]:
    for statement in _TABLES.values():
        connection.execute(statement)
    return list(_TABLES.items())


def _check_tables(found: list[tuple[str, str]], path: str) -> None:
    """A file of anything but this library's tables, as it makes them, is LeaseError."""
    if not set(_TABLES.items()) <= set(found):
        raise LeaseError(f"database {path!r} is not this library's: it lacks its tables")


def _ask_for_wal(connection: sqlite3.Connection) -> None:
    """Put the file in WAL mode if it is not yet; SQLite refuses while another connection
    uses it, and a later opener asks again.  No rule depends on the journal mode."""
    if connection.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        with contextlib.suppress(sqlite3.OperationalError):  # "database is locked"
            connection.execute("PRAGMA journal_mode=WAL")


# --- the authority ---


class _Row(NamedTuple):
    """A resource's row at the authority: its latest lease, or its epoch alone once released."""

    resource: str
    holder: str | None  # None once released; the epoch stays, so it is never granted again
    epoch: int
    expires_at: int

    def lease(self, now: int | None = None) -> Lease | None:
        """Its lease, if it has a holder and (given a tick) is live at `now`."""
        if self.holder is None or (now is not None and not is_live(self.expires_at, now=now)):
            return None
        return Lease(self.resource, self.holder, self.epoch, self.expires_at)


class LeaseAuthority(_Database):
    """The single trusted source of leases and their epochs."""

    def acquire(self, resource: str, holder: str, *, now: int, ttl: int) -> Lease:
        """Grant `resource` to `holder` at the next epoch until `now + ttl`; LeaseHeld if
        a lease on it is live at `now` (the caller's own too: a retried acquisition whose
        first try committed finds its own lease there)."""
        _check_text("resource", resource)
        _check_text("holder", holder)
        expires_at = _check_expiry(now, ttl)
        def grant(connection: sqlite3.Connection) -> Lease:
            row = _load(connection, resource)
            held = row.lease(now) if row else None
            if held:
                raise LeaseHeld(held)
            lease = Lease(resource, holder, row.epoch + 1 if row else 1, expires_at)
            connection.execute(
                "INSERT INTO leases (resource, holder, epoch, expires_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (resource) DO UPDATE SET holder = excluded.holder,"
                " epoch = excluded.epoch, expires_at = excluded.expires_at",
                (lease.resource, lease.holder, lease.epoch, lease.expires_at))
            return lease
        return self._transaction(grant)

    def renew(self, lease: Lease, *, now: int, ttl: int) -> Lease:
        """Set the expiry of `lease` to `now + ttl` (sooner or later than it was), if it is
        the resource's lease and live at `now`; else LeaseLost."""
        _check_lease(lease)
        expires_at = _check_expiry(now, ttl)
        def extend(connection: sqlite3.Connection) -> Lease:
            row = _current(connection, lease, now)
            if not is_live(row.expires_at, now=now):
                raise LeaseLost(lease, None, f"it expired at tick {row.expires_at}")
            connection.execute("UPDATE leases SET expires_at = ? WHERE resource = ?",
                               (expires_at, lease.resource))
            return dataclasses.replace(lease, expires_at=expires_at)
        return self._transaction(extend)

    def release(self, lease: Lease) -> None:
        """Clear the holder of `lease` if it is still the resource's lease, expired or not;
        else LeaseLost.  The epoch stays, so the next holder gets a higher one."""
        _check_lease(lease)
        def clear(connection: sqlite3.Connection) -> None:
            _current(connection, lease, None)
            connection.execute("UPDATE leases SET holder = NULL WHERE resource = ?",
                               (lease.resource,))
        self._transaction(clear)

    def current(self, resource: str, *, now: int) -> Lease | None:
        """The lease on `resource` that is live at tick `now`, or None."""
        _check_text("resource", resource)
        _check_int("now", now, least=0)
        row = self._transaction(lambda connection: _load(connection, resource), write=False)
        return row.lease(now) if row else None


def _load(connection: sqlite3.Connection, resource: str) -> _Row | None:
    row = connection.execute("SELECT resource, holder, epoch, expires_at FROM leases"
                             " WHERE resource = ?", (resource,)).fetchone()
    return _Row(*row) if row else None


def _current(connection: sqlite3.Connection, lease: Lease, now: int | None) -> _Row:
    """The resource's row, if `lease` is still its lease (live or not); else LeaseLost, whose
    `current` is the lease live at `now` (with no tick: the stored one, live or not)."""
    row = _load(connection, lease.resource)
    if row is None or row.holder is None:
        raise LeaseLost(lease, None, "the resource has no holder")
    if (row.epoch, row.holder) != (lease.epoch, lease.holder):
        raise LeaseLost(lease, row.lease(now),
                        f"the current lease is epoch {row.epoch} held by {row.holder!r}")
    return row


# --- the receiver ---


class Receiver(_Database):
    """A service that holders write to; fenced, it refuses an epoch lower than it has stored.

    Its table is its decision log: what it stores for a resource is what its latest decision
    left stored, so the stored pair and the log cannot disagree.  A fenced and an unfenced
    receiver keep separate logs, even in one file: they model two services.
    """

    def __init__(self, path: str | os.PathLike[str], *, fenced: bool = True) -> None:
        if not isinstance(fenced, bool):
            raise TypeError(f"fenced must be a bool, got {fenced!r}")
        super().__init__(path)
        self.fenced = fenced

    def write(self, resource: str, epoch: int, value: str) -> WriteResult:
        """Decide on one write, store it if applied, and log the decision: one transaction."""
        _check_text("resource", resource)
        _check_int("epoch", epoch, least=1)
        _check_text("value", value, empty=True)
        def decide(connection: sqlite3.Connection) -> WriteResult:
            seq, stored = self._latest(connection, resource)
            outcome = _decide(stored, epoch, value) if self.fenced else Outcome.APPLIED
            if outcome is Outcome.APPLIED:
                stored = (epoch, value)
            assert stored is not None  # only an applied write finds nothing stored
            connection.execute(
                "INSERT INTO receiver_decisions (fenced, resource, seq, outcome, epoch, value,"
                " stored_epoch, stored_value) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (self.fenced, resource, seq + 1, outcome.value, epoch, value, *stored))
            return WriteResult(outcome, resource, epoch, value, *stored)
        return self._transaction(decide)

    def read(self, resource: str) -> tuple[int, str] | None:
        """The stored (epoch, value) of `resource`, or None if no write was ever applied."""
        _check_text("resource", resource)
        return self._transaction(lambda connection: self._latest(connection, resource)[1],
                                 write=False)

    def decisions(self, resource: str) -> list[WriteResult]:
        """Every decision this receiver made about `resource`, oldest first."""
        _check_text("resource", resource)
        rows = self._transaction(lambda connection: connection.execute(
            "SELECT outcome, resource, epoch, value, stored_epoch, stored_value"
            " FROM receiver_decisions WHERE fenced = ? AND resource = ? ORDER BY seq",
            (self.fenced, resource)).fetchall(), write=False)
        return [WriteResult(Outcome(outcome), *rest) for outcome, *rest in rows]

    def _latest(self, connection: sqlite3.Connection,
                resource: str) -> tuple[int, tuple[int, str] | None]:
        """How many decisions were made so far, and the pair the latest one left stored."""
        row = connection.execute(
            "SELECT seq, stored_epoch, stored_value FROM receiver_decisions"
            " WHERE fenced = ? AND resource = ? ORDER BY seq DESC LIMIT 1",
            (self.fenced, resource)).fetchone()
        return (row[0], (row[1], row[2])) if row else (0, None)


# --- input checks: each runs before any transaction, so bad input changes nothing ---


def _check_text(name: str, value: object, *, empty: bool = False) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {value!r}")
    if not value and not empty:
        raise ValueError(f"{name} must not be empty")
    try:
        value.encode("utf-8")  # a lone surrogate cannot be stored
    except UnicodeEncodeError:
        raise ValueError(f"{name} must be encodable as UTF-8, got {value!r}") from None


def _check_int(name: str, value: object, *, least: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):  # True is no tick or epoch
        raise TypeError(f"{name} must be an int, got {value!r}")
    if not least <= value <= _LARGEST:
        raise ValueError(f"{name} must be an int from {least} to {_LARGEST}, got {value!r}")
    return value


def _check_expiry(now: object, ttl: object) -> int:
    expires_at = _check_int("now", now, least=0) + _check_int("ttl", ttl, least=1)
    if expires_at > _LARGEST:
        raise ValueError(f"now + ttl must not exceed {_LARGEST}, got {now!r} + {ttl!r}")
    return expires_at


def _check_lease(lease: object) -> None:
    if not isinstance(lease, Lease):
        raise TypeError(f"lease must be a Lease, got {lease!r}")
    _check_text("lease.resource", lease.resource)
    _check_text("lease.holder", lease.holder)
    _check_int("lease.epoch", lease.epoch, least=1)
    _check_int("lease.expires_at", lease.expires_at, least=1)
