"""A reader's own receiver (--receiver MODULE:NAME): loaded, fitted, and asked as the explorer
asks one.  A signature, a method or an answer that does not fit is Unsupported (exit 2: the
interface, not a finding).
"""

import importlib
import inspect
import os
import reprlib
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

from core import HERE, Unsupported

from leases import Outcome
from run_experiment import RESOURCE

__all__ = ["Result", "Yours", "fits", "load"]


def load(spec: str) -> Callable[[str], Any]:
    """The class named by "MODULE:NAME", imported from the current folder or explorer/."""
    module, colon, name = spec.partition(":")
    if not (module and colon and name):
        raise ValueError(f"--receiver wants MODULE:NAME, got {spec!r}")
    for folder in (HERE, os.getcwd()):
        if folder not in sys.path:
            sys.path.append(folder)
    try:
        found = getattr(importlib.import_module(module), name, None)
    except Exception as exc:  # noqa: BLE001 - a module that raises, or will not compile
        raise Unsupported(f"--receiver {spec!r}: importing {module!r} raised "
                          f"{type(exc).__name__}: {exc}") from None
    if found is None:
        raise ImportError(f"--receiver {spec!r}: {module!r} has no class {name!r}")
    if not callable(found):
        raise TypeError(f"--receiver {spec!r}: {name!r} is not a class")
    fits(f"{name}(path)", found, "path")
    if isinstance(found, type) and not callable(getattr(found, "write", None)):
        raise Unsupported(f"--receiver {spec!r}: {name} has no method write(resource, "
                          "epoch, value)")
    return found  # type: ignore[no-any-return]


def fits(call: str, function: Callable[..., Any], *args: Any) -> None:
    """Unsupported, naming `call`, if `function` cannot take `args`: a wrong signature is the
    reader's interface, not a finding."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin may have none to read: called as it is
        return
    try:
        signature.bind(*args)
    except TypeError as exc:
        raise Unsupported(f"{call} cannot be called so: its signature is {signature}: "
                          f"{exc}") from None


class Yours:
    """A reader's receiver, made as NAME(path), as the explorer asks it: its write's answer
    (an Outcome, its text, or a result with .outcome) as a result run_experiment.write reads,
    with no stored pair; its read(resource), if it has one, as (epoch, value) or None.  An
    answer of another kind, or a method that does not fit, is Unsupported: the interface,
    not a finding."""

    def __init__(self, name: str, receiver: Any) -> None:
        self.name, self.receiver = name, receiver
        if not callable(getattr(receiver, "write", None)):
            raise Unsupported(f"{name} has no method write(resource, epoch, value)")
        fits(f"{name}.write(resource, epoch, value)", receiver.write, RESOURCE, 1, "A1")
        if callable(getattr(receiver, "read", None)):
            fits(f"{name}.read(resource)", receiver.read, RESOURCE)
        if callable(getattr(receiver, "close", None)):
            fits(f"{name}.close()", receiver.close)

    def close(self) -> None:
        getattr(self.receiver, "close", lambda: None)()

    def write(self, resource: str, epoch: int, value: str) -> Any:
        said = self.receiver.write(resource, epoch, value)
        outcome = getattr(said, "outcome", said)  # a WriteResult, as the library's Receiver's
        if not isinstance(outcome, str) or outcome not in _OUTCOMES:
            raise Unsupported(
                f"{self.name}.write({resource!r}, {epoch!r}, {value!r}) answered "
                f"{reprlib.repr(said)}: not an Outcome, its text ({', '.join(_OUTCOMES)}), or "
                "a result with .outcome")
        return Result(Outcome(outcome), resource, epoch, value, None, None)

    def __getattr__(self, name: str) -> Any:  # read(resource), if the receiver has one
        if name != "read" or not callable(getattr(self.receiver, "read", None)):
            raise AttributeError(name)
        return self._read

    def _read(self, resource: str) -> tuple[int, str] | None:
        call = f"{self.name}.read({resource!r})"
        try:
            pair = self.receiver.read(resource)
        except Exception as exc:  # noqa: BLE001 - the interface, in one line
            raise Unsupported(f"{call} raised {type(exc).__name__}: {exc}") from None
        if pair is None:
            return None
        if (not isinstance(pair, (tuple, list)) or len(pair) != 2
                or type(pair[0]) is not int or not isinstance(pair[1], str)):
            raise Unsupported(f"{call} returned {reprlib.repr(pair)}: not None or an (epoch, "
                              "value) pair of an int and a str")
        return pair[0], pair[1]


_OUTCOMES = tuple(outcome.value for outcome in Outcome)


class Result(NamedTuple):
    """A write's answer as run_experiment.write reads it."""

    outcome: str
    resource: str
    epoch: int
    value: str
    stored_epoch: int | None
    stored_value: str | None
