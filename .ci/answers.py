"""The fence's answers as leases.Receiver gives them: the check of the recipes' SQLite and
PostgreSQL fences, which store (epoch, sequence), against the library's one value per epoch.
The recipes add one rule of the job's: a stored "done" is final, so every write but its exact
replay answers "done"."""

import os
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import leases  # the library beside README

Write = tuple[str, int, int, str, str]  # resource, epoch, sequence, value, the answer given


def mismatch(writes: list[Write]) -> str | None:
    """The first write, in order, that leases.Receiver answers otherwise, or None.  A resource
    written at sequence 1 only goes to it as it is; any other as one number per (epoch,
    sequence), which orders as the pair does."""
    sequenced = {write[0] for write in writes if write[2] != 1}
    with tempfile.TemporaryDirectory() as folder, leases.Receiver(
            os.path.join(folder, "receiver.sqlite3")) as receiver:
        for resource, epoch, sequence, value, answer in writes:
            number = epoch << 32 | sequence if resource in sequenced else epoch
            stored = receiver.read(resource)
            if stored is not None and stored[1] == "done" and stored != (number, value):
                said = "done"
            else:
                said = receiver.write(resource, number, value).outcome.value
            if said != answer:
                return (f"({resource!r}, {epoch}, {sequence}, {value!r}) answers {answer!r}, "
                        f"leases.Receiver {said!r}")
    return None
