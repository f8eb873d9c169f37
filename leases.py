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
import re
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator
from typing import Any, NamedTuple, TypeVar

__all__ = [
    "Lease", "LeaseAuthority", "LeaseError", "LeaseHeld", "LeaseLost", "Outcome", "Receiver",
    "WriteResult", "is_live",
]

# Only bounds how long a call waits for a lock, its object's or SQLite's; no rule depends on it.
BUSY_TIMEOUT_SECONDS = 30.0

# SQLite waits for a lock in C, where Ctrl-C cannot land; it is asked to wait this long at a
# time, and asked again until the bound above.
_TRY_SECONDS = 0.05

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
    """An acquisition met a live lease: `lease` says who holds it, at which epoch, until when."""

    def __init__(self, lease: Lease) -> None:
        super().__init__(
            f"resource {lease.resource!r} is held by {lease.holder!r} at epoch {lease.epoch} "
            f"until tick {lease.expires_at}"
        )
        self.lease = lease

    def __reduce__(self) -> tuple[Any, ...]:  # rebuilt from its attributes, not its message
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

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.lease, self.current, self.reason)


# --- the rules: when a lease is live, and what a fenced receiver applies ---


def is_live(expires_at: int, *, now: int) -> bool:
    """The one expiry rule: a lease is live before its expiry tick `expires_at`, and expired at
    it.  (A released lease, which has no holder, is live at no tick.)"""
    return now < expires_at


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
        return self.lease() if is_live(self.expires_at, now=now) else None


def _decide(stored: tuple[int, str] | None, epoch: int, value: str) -> Outcome:
    """The fence: compare a write with what the receiver has already stored."""
    if stored is None or epoch > stored[0]:
        return Outcome.APPLIED
    if epoch < stored[0]:
        return Outcome.STALE
    return Outcome.REPLAY if value == stored[1] else Outcome.CONFLICT


_D = TypeVar("_D", bound="_Database")


class _Database:
    """A connection of this process's own, closed by `close()` or at the end of a `with`.

    Its calls, from any threads, run one at a time: each holds the object's lock for its whole
    transaction, since one SQLite connection has one transaction.
    """

    _KIND = "database"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = _check_path(path)
        # Reentrant: Ctrl-C landing just as a call takes or gives back the lock can leave it
        # held by this thread, whose later calls then still go through.
        self._lock = threading.RLock()
        self._connection: sqlite3.Connection | None
        self._connection, self._identity = _connect(self.path)
        self._moved = False

    def close(self) -> None:
        """Close the connection, once no other thread's call is using it; again does nothing."""
        with self._locked(time.monotonic() + BUSY_TIMEOUT_SECONDS):
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    @contextlib.contextmanager
    def _locked(self, deadline: float) -> Iterator[None]:
        if not self._lock.acquire(timeout=max(deadline - time.monotonic(), 0)):
            raise LeaseError(f"{self._KIND} on {self.path!r} failed: another thread's call "
                             f"kept it busy for {BUSY_TIMEOUT_SECONDS} s")
        try:
            yield
        finally:
            self._lock.release()

    @contextlib.contextmanager
    def _use(self, *, write: bool) -> Iterator["_Bounded"]:
        """The connection; if `write`, in one write transaction, rolled back if the block raises.

        IMMEDIATE takes the write lock before the first read, so no other writer can come
        between the block's read and its write.  SQLite's errors come out as LeaseError;
        LeaseHeld and LeaseLost raised in the block pass through as they are.
        """
        deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
        with self._locked(deadline):
            if self._connection is None:
                raise LeaseError(f"{self._KIND} on {self.path!r} is closed")
            connection = _Bounded(self._connection, deadline)
            try:
                if not write:
                    yield connection
                    self._check_name()  # what was read may be another name's
                    return
                try:  # BEGIN too: Ctrl-C in its wait for the lock may land just as it returns
                    connection.execute("BEGIN IMMEDIATE")
                    self._check_name()  # before anything is written to a file renamed
                    yield connection
                    connection.execute("COMMIT")  # a COMMIT that fails (disk full) rolls back
                except BaseException:
                    if connection.in_transaction:  # SQLite may have rolled back already
                        connection.execute("ROLLBACK")
                    raise
                # A -wal log belongs to a name: an opener of the file by a new name would not
                # see this change in the old name's log.  In the file itself, it sees it.
                connection.checkpoint()  # the change is committed, whatever this does
                self._check_name()  # renamed during the call: its result is not given
            except (sqlite3.Error, OverflowError) as exc:  # OverflowError: a str over 2 GiB
                raise LeaseError(f"{self._KIND} on {self.path!r} failed: {_reason(exc)}") from exc

    def _check_name(self) -> None:
        """LeaseError, now and at every later call, unless `path` still names the file opened,
        and by that one name: a file renamed or replaced under an open connection, or given a
        second name, has two logs and two caches, which no transaction of SQLite spans."""
        try:
            found = os.stat(self.path)
            self._moved |= (found.st_dev, found.st_ino) != self._identity or found.st_nlink > 1
        except OSError:
            self._moved = True
        if self._moved:
            raise LeaseError(f"{self._KIND} on {self.path!r} failed: the file was renamed, "
                             "replaced or given another name while open; open it anew")

    def __enter__(self: _D) -> _D:  # noqa: PYI019 - typing.Self is 3.11+, we support 3.10
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _Bounded:
    """A connection whose waits for SQLite's locks end at `deadline`, in tries of _TRY_SECONDS."""

    def __init__(self, connection: sqlite3.Connection, deadline: float) -> None:
        self._connection = connection
        self._deadline = deadline

    @property
    def in_transaction(self) -> bool:
        return self._connection.in_transaction

    def execute(self, sql: str, parameters: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        # Inside a transaction only COMMIT may be tried again: after any other statement
        # SQLite found busy, the transaction must be rolled back.
        again = sql == "COMMIT" or not self._connection.in_transaction
        while True:
            try:
                return self._connection.execute(sql, parameters)
            except sqlite3.OperationalError as exc:
                if not (again and _busy(exc) and time.monotonic() < self._deadline):
                    raise

    def checkpoint(self) -> None:
        """Copy the -wal log into the database file (a file in another mode has none), as far
        as readers of older snapshots let it, without waiting for them: a reader left open (a
        user's `sqlite3` shell) holds the copy back, and the next call copies the rest.  A
        committed change stays committed: a checkpoint that fails changes nothing."""
        with contextlib.suppress(sqlite3.OperationalError):
            self._connection.execute("PRAGMA wal_checkpoint(PASSIVE)")


def _busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+; before, only the message
    return str(exc) == "database is locked" if code is None else code & 0xFF == 5  # SQLITE_BUSY


# --- the authority ---


class LeaseAuthority(_Database):
    """The single trusted source of leases and epochs."""

    _KIND = "lease authority"

    def acquire(self, resource: str, holder: str, *, now: int, ttl: int) -> Lease:
        """Grant `resource` to `holder` with the next epoch, or raise LeaseHeld if it is live."""
        _check_text("resource", resource)
        _check_text("holder", holder)
        expires_at = _check_expiry(now, ttl)
        with self._use(write=True) as connection:
            row = self._load(connection, resource)
            held = None if row is None else row.live_lease(now)
            if held is not None:
                raise LeaseHeld(held)
            if row is not None and row.epoch >= _SQLITE_INT_MAX:
                raise LeaseError(f"resource {resource!r} has used its last epoch, {row.epoch}")
            lease = Lease(resource, holder, 1 if row is None else row.epoch + 1, expires_at)
            connection.execute(
                "INSERT INTO leases (resource, holder, epoch, expires_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (resource) DO UPDATE SET holder = excluded.holder,"
                " epoch = excluded.epoch, expires_at = excluded.expires_at",
                (lease.resource, lease.holder, lease.epoch, lease.expires_at),
            )
        return lease

    def renew(self, lease: Lease, *, now: int, ttl: int) -> Lease:
        """Set the expiry of `lease` to exactly `now + ttl`, if it is current and live at `now`.

        This can shorten a lease as well as lengthen it: the new expiry replaces the old one.
        The authority trusts `now`, as it trusts every tick it is given.
        """
        _check_lease(lease)
        expires_at = _check_expiry(now, ttl)
        with self._use(write=True) as connection:
            row = self._current_or_lost(connection, lease, now)
            if row.live_lease(now) is None:
                raise LeaseLost(lease, None, f"it expired at tick {row.expires_at}")
            connection.execute(
                "UPDATE leases SET expires_at = ? WHERE resource = ?", (expires_at, lease.resource)
            )
        return dataclasses.replace(lease, expires_at=expires_at)

    def release(self, lease: Lease) -> None:
        """Clear the holder of `lease` if it is still the stored lease, expired or not.

        Release takes no tick, so it cannot tell whether the lease expired; it does not need to:
        the epoch stays either way, so the next holder gets a higher one.
        """
        _check_lease(lease)
        with self._use(write=True) as connection:
            self._current_or_lost(connection, lease, None)
            connection.execute(
                "UPDATE leases SET holder = NULL WHERE resource = ?", (lease.resource,)
            )

    def current(self, resource: str, *, now: int) -> Lease | None:
        """The lease on `resource` that is live at tick `now`, or None."""
        _check_text("resource", resource)
        _check_int("now", now, minimum=0)
        with self._use(write=False) as connection:
            row = self._load(connection, resource)
        return None if row is None else row.live_lease(now)

    @staticmethod
    def _load(connection: "_Bounded", resource: str) -> _Row | None:
        row = connection.execute(
            "SELECT resource, holder, epoch, expires_at FROM leases WHERE resource = ?",
            (resource,),
        ).fetchone()
        return None if row is None else _Row(*row)

    def _current_or_lost(
        self, connection: "_Bounded", lease: Lease, now: int | None
    ) -> _Row:
        """The stored row, if `lease` is still its lease (live or not); otherwise LeaseLost.

        LeaseLost.current is what `current(resource, now=now)` would say; with no tick (release)
        it is the stored lease, live or not.
        """
        row = self._load(connection, lease.resource)
        if row is None or row.holder is None:
            raise LeaseLost(lease, None, "the resource has no holder")
        if (row.epoch, row.holder) != (lease.epoch, lease.holder):
            raise LeaseLost(
                lease,
                row.lease() if now is None else row.live_lease(now),
                f"the current lease is epoch {row.epoch} held by {row.holder!r}",
            )
        return row


# --- the receiver ---


class Receiver(_Database):
    """A service that holders write to; fenced, it refuses epochs older than it has stored.

    Its one table is its decision log.  What it holds for a resource is what its latest
    decision left stored, so the record and the log cannot disagree, and one row appended per
    write is the whole cost of remembering.  A fenced and an unfenced receiver keep separate
    logs, even in one database file: they model two different services.  Neither asks the
    authority or a clock anything.
    """

    _KIND = "receiver"

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
        with self._use(write=True) as connection:
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
        with self._use(write=False) as connection:
            return self._latest(connection, resource)[1]

    def decisions(self, resource: str) -> list[WriteResult]:
        """Every decision this receiver made about `resource`, oldest first."""
        _check_text("resource", resource)
        with self._use(write=False) as connection:
            rows = connection.execute(
                "SELECT outcome, resource, epoch, value, stored_epoch, stored_value"
                " FROM receiver_decisions WHERE fenced = ? AND resource = ? ORDER BY seq",
                (self.fenced, resource),
            ).fetchall()
        return [WriteResult(Outcome(outcome), *rest) for outcome, *rest in rows]

    def _latest(
        self, connection: "_Bounded", resource: str
    ) -> tuple[int, tuple[int, str] | None]:
        """The number of decisions so far, and the (epoch, value) the latest one left stored."""
        row = connection.execute(
            "SELECT seq, stored_epoch, stored_value FROM receiver_decisions"
            " WHERE fenced = ? AND resource = ? ORDER BY seq DESC LIMIT 1",
            (self.fenced, resource),
        ).fetchone()
        return (0, None) if row is None else (row[0], (row[1], row[2]))


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


# --- storage: one way to open a database, one way to use it ---

# Every table of the model, as SQLite keeps its CREATE statement.  A database this library
# makes has both, so that the authority and the receiver can share one file.
_TABLES = {
    "leases": (
        "CREATE TABLE leases ("
        " resource TEXT PRIMARY KEY, holder TEXT, epoch INTEGER NOT NULL,"
        " expires_at INTEGER NOT NULL) WITHOUT ROWID"
    ),
    "receiver_decisions": (
        "CREATE TABLE receiver_decisions ("
        " fenced INTEGER NOT NULL, resource TEXT NOT NULL, seq INTEGER NOT NULL,"
        " outcome TEXT NOT NULL, epoch INTEGER NOT NULL, value TEXT NOT NULL,"
        " stored_epoch INTEGER NOT NULL, stored_value TEXT NOT NULL,"
        " PRIMARY KEY (fenced, resource, seq)) WITHOUT ROWID"
    ),
}


def _check_path(path: object) -> str:
    """The absolute path of a database file, or TypeError/ValueError naming `path`."""
    name = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    if not isinstance(name, str):
        raise TypeError(f"path must be a str or os.PathLike of a str, got {path!r}")
    # The model is processes sharing one file: SQLite's in-memory and URI names share none.
    if not name or "\x00" in name or name == ":memory:" or name.startswith("file:"):
        raise ValueError(f"path must be a plain file name, non-empty, without NUL: {path!r}")
    if name.endswith(os.sep):
        raise ValueError(f"path must name a file, not a folder: {path!r}")
    try:
        os.fsencode(name)
        return os.path.abspath(name)
    except UnicodeEncodeError:
        raise ValueError(f"path must be encodable as a file name, got {path!r}") from None
    except OSError as exc:  # a relative name, and the working folder is gone
        raise LeaseError(f"cannot open database path {path!r}: {_reason(exc)}") from exc


def _connect(path: str) -> tuple[sqlite3.Connection, tuple[int, int]]:
    """Open the database at `path` (absolute), making it if nothing is there; else LeaseError.
    Returns the connection and the file's identity, (device, inode), as it was just before.

    A file already there must be a database as this library makes them.  It is checked through
    a read-only connection before SQLite may change it: one that could write would fold a
    refused database's log (in WAL mode) into the file as it closed.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
    try:
        if not os.path.lexists(path):
            _create(path)
        # Only stat()ed, never opened: closing any descriptor of a file drops every POSIX lock
        # this process holds on it, the locks of its open SQLite connections included.
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block; a link is followed
            raise LeaseError(f"cannot open database path {path!r}: it is not a regular file")
        checked = sqlite3.connect(_uri(path, "ro"), uri=True, timeout=_TRY_SECONDS)
        with contextlib.closing(checked):
            _check_tables(_Bounded(checked, deadline), path)
        # Counted only once the file could be read: a new one is read only once its draft name
        # is gone (see _create).  Each name gets its own -wal and -shm: two logs, two authorities.
        found = os.stat(path)  # before connecting: a file put there since is refused at its use
        if found.st_nlink > 1:
            raise LeaseError(f"cannot open database path {path!r}: the file has another name "
                             "(a hard link); open it by one name only")
        if path in _mount_points():  # a file bind-mounted here: one inode, two names, two logs
            raise LeaseError(f"cannot open database path {path!r}: a file is mounted there "
                             "(a bind mount); open it by its own name")
        # mode=rw: SQLite must never create a file of its own, whatever happens meanwhile.
        connection = sqlite3.connect(
            _uri(path, "rw"),
            uri=True,
            timeout=_TRY_SECONDS,
            isolation_level=None,  # the sqlite3 module starts no transaction of its own; we do
            check_same_thread=False,  # any thread may use it: the object's lock orders calls
        )
        return connection, (found.st_dev, found.st_ino)
    except (OSError, sqlite3.Error) as exc:
        raise LeaseError(f"cannot open database path {path!r}: {_reason(exc)}") from exc


def _mount_points(mountinfo: str = "/proc/self/mountinfo") -> set[str]:
    """Every mount point of this process, from Linux's `mountinfo` (none elsewhere)."""
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as file:
            lines = file.read().splitlines()
    except OSError:
        return set()
    # The fifth field; a space, tab, newline or backslash in it is written as an octal escape.
    return {re.sub(r"\\([0-7]{3})", lambda octal: chr(int(octal[1], 8)), line.split()[4])
            for line in lines if len(line.split()) > 4}


def _check_tables(connection: _Bounded, path: str) -> None:
    """LeaseError unless the model's tables are there exactly as this library makes them, and
    nothing else goes by their names: no view, and no index or trigger that would change what
    their statements do.  (SQLite's names ignore case.)  Other tables are no concern of ours."""
    found = connection.execute(
        "SELECT type, name, sql FROM sqlite_master"
        " WHERE lower(name) IN (?, ?) OR lower(tbl_name) IN (?, ?)",
        (*_TABLES, *_TABLES),
    ).fetchall()
    if sorted(found) != sorted(("table", name, sql) for name, sql in _TABLES.items()):
        raise LeaseError(
            f"cannot use database {path!r}: its tables are not exactly the model's "
            f"{' and '.join(_TABLES)}; it was left as it is"
        )


def _uri(path: str, mode: str) -> str:
    """An SQLite URI (the only way to forbid SQLite to create a file) for the file `path`,
    escaped byte by byte, so that a name that is not valid UTF-8 is carried too."""
    safe = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/-_.~"
    name = "".join(chr(b) if b in safe else f"%{b:02X}" for b in os.fsencode(path))
    return f"file:{name}?mode={mode}"


def _reason(exc: BaseException) -> str:
    return str(exc.strerror if isinstance(exc, OSError) and exc.strerror else exc)


def _create(path: str) -> None:
    """Put a whole new WAL database with the model's tables at `path`, unless one is there.

    It is made as a draft, with the mode the umask allows, and linked into place in one step:
    processes that open one new file at once never see it half made, and a draft that cannot
    be finished (a full disk) is removed, leaving nothing at `path`.  Until its draft name is
    removed, the file stays locked, so that no process reads it while it has two names.
    """
    draft = os.path.join(os.path.dirname(path), f".leases-{os.urandom(8).hex()}.draft")
    os.close(os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        connection = sqlite3.connect(_uri(draft, "rw"), uri=True, isolation_level=None)
        with contextlib.closing(connection):
            for statement in _TABLES.values():
                connection.execute(statement)
            (mode,) = connection.execute("PRAGMA journal_mode=WAL").fetchone()
            if mode != "wal":
                raise sqlite3.OperationalError(f"the new database stayed in {mode!r} mode")
            connection.execute("PRAGMA locking_mode=EXCLUSIVE")  # held until closed
            connection.executescript("BEGIN EXCLUSIVE; COMMIT")
            with contextlib.suppress(FileExistsError):  # another process was first: use its file
                os.link(draft, path)
            os.unlink(draft)
    finally:
        for name in (draft, f"{draft}-wal", f"{draft}-shm", f"{draft}-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)
