"""The library's calls: a holder's objects (the authority, and a receiver at each place of the
run), and one step played on them through run_experiment's perform and write.

The places: the model's fenced and unfenced receivers, AskingReceiver (a contrast that asks
the authority), or a reader's own (receivers.Yours).  With a first epoch above 1 every party
sees the authority's epochs shifted up (_Shifted), so a width bug shows at a small bound.
"""

import contextlib
import dataclasses
import os
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from core import KEYS, Unsupported, guarded
from receivers import Result, Yours, load

import leases
from leases import Lease, LeaseAuthority, Receiver
from run_experiment import Action, Step, StepResult, perform, write

__all__ = ["OURS", "AskingReceiver", "Place", "closed", "opened", "places", "played"]

OURS = ("fenced", "unfenced", "asking")  # the places of a run without --receiver


@dataclass(frozen=True)
class Place:
    """A receiver of the run: its column's name, what it is, how to make one on a file, and
    the rules its answers are checked by: "fenced", "unfenced" or "asking"."""

    name: str
    says: str
    spec: str  # "fenced", "unfenced", "asking", or a reader's "MODULE:NAME"
    rules: str

    @property
    def who(self) -> str:
        """Who raised, if its code does: the library, or the reader's receiver."""
        return ("the library" if self.spec in ("fenced", "unfenced") else "AskingReceiver"
                if self.spec == "asking" else f"the receiver given with --receiver {self.spec!r}")

    def make(self, path: str, shift: int = 0) -> Any:
        """A receiver of this place on `path`; Raised, naming whose code, if making it raises."""
        if self.spec in ("fenced", "unfenced"):
            return guarded(self.who, "Receiver(path)", Receiver, path,
                            fenced=self.spec == "fenced")
        if self.spec == "asking":
            return guarded(self.who, "AskingReceiver(path)", AskingReceiver, path, shift)
        name = self.spec.rpartition(":")[2]
        receiver = guarded(self.who, f"{name}(path)", load(self.spec), path)
        try:
            return Yours(self.spec, receiver)
        except Unsupported:  # its interface: closed, then named
            with contextlib.suppress(Exception):
                receiver.close()
            raise


def places(receiver: str | None = None) -> tuple[Place, ...]:
    """The receivers of a run: the model's two and the contrast, or a reader's own alone."""
    if receiver is not None:
        load(receiver)  # a usage error now, not in a worker
        name = receiver.rpartition(":")[2]
        return (Place(name, f"{receiver}, checked as a fence", receiver, "fenced"),)
    return (Place("fenced", "the model's Receiver, fenced", "fenced", "fenced"),
            Place("unfenced", "the model's Receiver, unfenced", "unfenced", "unfenced"),
            Place("asking", "not the model's receiver: AskingReceiver, which asks the "
                  "authority inside its own write transaction", "asking", "asking"))


def opened(path: str, receivers: Sequence[Place], first_epoch: int = 1) -> list[Any]:
    """A holder's objects on `path`: the authority, then a receiver of each place.  With a
    first epoch above 1 every party sees the authority's epochs shifted up (_Shifted)."""
    shift = first_epoch - 1
    objects = [guarded("the library", "LeaseAuthority(path)", LeaseAuthority, path)]
    try:
        objects += [place.make(path, shift) for place in receivers]
    except BaseException:
        for made in objects:
            made.close()
        raise
    return [_Shifted(objects[0], shift) if shift else objects[0], *objects[1:]]


def closed(objects: Sequence[Any], receivers: Sequence[Place]) -> None:
    """Close what `opened` gave."""
    for who, store in zip(("the library", *(place.who for place in receivers)), objects):
        guarded(who, "close()", store.close)


# --- receivers: the contrast, and a reader's own ---


class AskingReceiver:
    """NOT the model's receiver: a contrast that asks the authority.  In its own BEGIN
    IMMEDIATE transaction on the authority's file it applies a write only if its epoch is
    the lease live at the write's tick; else "stale" (a higher epoch was granted) or
    "not live".  It keeps the pair it stores in a table of its own."""

    def __init__(self, path: str, shift: int = 0) -> None:
        self.shift = shift  # added to the authority's epochs, as every party sees them
        self._connection = sqlite3.connect(path, isolation_level=None, timeout=30)
        self._connection.execute("CREATE TABLE IF NOT EXISTS asking (resource TEXT PRIMARY KEY,"
                                 " epoch INTEGER NOT NULL, value TEXT NOT NULL)")

    def close(self) -> None:
        self._connection.close()

    def read(self, resource: str) -> tuple[int, str] | None:
        row = self._connection.execute("SELECT epoch, value FROM asking WHERE resource = ?",
                                       (resource,)).fetchone()
        return None if row is None else (row[0], row[1])

    def write(self, resource: str, epoch: int, value: str, *, now: int) -> "Result":
        """Decide on one write at tick `now`, and say the pair it stores after."""
        connection = self._connection
        connection.execute("BEGIN IMMEDIATE")
        try:
            row = connection.execute("SELECT holder, epoch, expires_at FROM leases"
                                     " WHERE resource = ?", (resource,)).fetchone()
            stored = connection.execute("SELECT epoch, value FROM asking WHERE resource = ?",
                                        (resource,)).fetchone()
            row = None if row is None else (row[0], row[1] + self.shift, row[2])
            if row is not None and row[0] is not None and epoch == row[1] and (
                    leases.is_live(row[2], now=now)):  # a receiver under study: the library's
                outcome, stored = "applied", (epoch, value)
                connection.execute("INSERT OR REPLACE INTO asking VALUES (?, ?, ?)",
                                   (resource, epoch, value))
            else:
                outcome = "stale" if row is not None and epoch < row[1] else "not live"
            connection.execute("COMMIT")
        except BaseException:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise
        return Result(outcome, resource, epoch, value, *(stored or (None, None)))


class _Shifted:
    """The library's authority with every epoch it gives or takes shifted up by `shift`, so
    that the receivers see epochs from shift + 1 on (--first-epoch): its public calls only."""

    def __init__(self, authority: LeaseAuthority, shift: int) -> None:
        self.authority, self.shift = authority, shift

    def _out(self, lease: Lease | None, by: int = 1) -> Any:
        return None if lease is None else dataclasses.replace(
            lease, epoch=lease.epoch + by * self.shift)

    def acquire(self, resource: str, holder: str, *, now: int, ttl: int) -> Lease:
        try:
            lease: Lease = self._out(self.authority.acquire(resource, holder, now=now, ttl=ttl))
            return lease
        except leases.LeaseHeld as held:
            raise leases.LeaseHeld(self._out(held.lease)) from None

    def renew(self, lease: Lease, *, now: int, ttl: int) -> Lease:
        renewed: Lease = self._out(self._kept(self.authority.renew, self._out(lease, -1),
                                              now=now, ttl=ttl))
        return renewed

    def release(self, lease: Lease) -> None:
        self._kept(self.authority.release, self._out(lease, -1))

    def _kept(self, call: Callable[..., Any], lease: Lease, **kwargs: Any) -> Any:
        try:
            return call(lease, **kwargs)
        except leases.LeaseLost as lost:
            raise leases.LeaseLost(self._out(lost.lease), self._out(lost.current),
                                   lost.reason) from None

    def current(self, resource: str, *, now: int) -> Lease | None:
        return self._out(self.authority.current(resource, now=now))  # type: ignore[no-any-return]

    def close(self) -> None:
        self.authority.close()


class _AtTick:
    """AskingReceiver as run_experiment.write asks a receiver: the step's tick given."""

    def __init__(self, receiver: AskingReceiver, now: int) -> None:
        self.receiver, self.now = receiver, now

    def write(self, resource: str, epoch: int, value: str) -> Result:
        return self.receiver.write(resource, epoch, value, now=self.now)


def played(step: Step, held: Lease | None, objects: Sequence[Any], path: str,
           resource: str) -> tuple[Lease | None, tuple[tuple[Any, ...], ...]]:
    """Play `step` for a holder keeping `held`, on its authority and places (`objects`),
    through run_experiment's perform and write: the lease it keeps, and each place's event.
    An exception is an answer too ("raised ..."), which no rule gives."""
    authority: Any = objects[0]
    receivers = [_AtTick(o, step.tick) if isinstance(o, AskingReceiver) else o
                 for o in objects[1:]]
    events: list[StepResult] = []
    kept = held
    try:
        kept, first = perform(step, held, authority, receivers[0], resource)
        events.append(first)
    except Unsupported:
        raise
    except Exception as exc:  # noqa: BLE001 - a broken library's answer, checked as one
        events.append(_raised(step, exc, path))
    raised = events[0].outcome.startswith("raised")
    if step.action is not Action.WRITE or held is None or raised:
        events *= len(receivers)
    else:
        for receiver in receivers[1:]:
            try:
                events.append(write(step, held, receiver))
            except Unsupported:
                raise
            except Exception as exc:  # noqa: BLE001 - as above
                events.append(_raised(step, exc, path))
    return kept, tuple(tuple(event.as_json().get(key) for key in KEYS) for event in events)


def _raised(step: Step, exc: BaseException, path: str) -> StepResult:
    text = str(exc).replace(os.path.dirname(path) + os.sep, "")  # the same in every folder
    return StepResult.of(step, f"raised {type(exc).__name__}: {text}")
