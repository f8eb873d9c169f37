"""The explorer's command line: every schedule of a small bound on the real library, or
(--statements) every interleaving of the holders' calls at each SQL statement, counted and
checked; or (--worker) every interleaving of the reader's worker; a witness played again
with --replay.  See explorer/README.md.

    python3 explorer/explore.py [--statements] [--holders N] [--program WORD ...]
        [--last-tick T] [--ttl N] [--resources N] [--first-epoch N] [--timeout S]
        [--receiver MODULE:NAME] [--sample N] [--replay WITNESS]
    python3 explorer/explore.py --worker MODULE:NAME [--workers N] [--jobs N] [--ttl N]
        [--preemptions N] [--jumps N] [--crashes N] [--errors N] [--timeout S]
        [--replay WITNESS]
"""

import argparse
import dataclasses
import os
import signal
import sqlite3
import sys
import time
from collections.abc import Callable, Sequence
from typing import NoReturn

import statements
import steps
from calls import places
from core import Bound, Different, Hung, Raised, Unsupported, command

from leases import LeaseError

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "main"]

# --- command line ---

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
_EPILOG = f"""\
exit codes:
  {EXIT_OK}    every check held
  {EXIT_FAILED}    a check failed, a call hung (--timeout), or an answer rests on more than the
       file and the call (the schedule and the call are named; a failure shown failed again
       from a fresh start), or the library or --receiver raised as it was made or closed
  {EXIT_USAGE}    bad arguments, or a receiver or file that cannot be used, in one line naming
       the object and method: a signature that does not fit, no write, an answer that is
       no Outcome, a read() that raises or gives no (epoch, value) pair, a module that
       raises or will not compile as it is imported
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C); 143: SIGTERM; 129: SIGHUP; each leaves no child
       process and no folder

examples:
  python3 explorer/explore.py --program acquire write
  python3 explorer/explore.py --program acquire check write   # a check leaves the gap
  python3 explorer/explore.py --holders 3 --resources 2 --last-tick 2 --ttl 1
  python3 explorer/explore.py --receiver examples:ReadmeFence
  python3 explorer/explore.py --receiver examples:TextEpoch --program acquire write \\
      --last-tick 1 --ttl 1 --first-epoch 9      # '10' < '9'
  python3 explorer/explore.py --statements --program acquire release --last-tick 1"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, as every other usage error
        self.exit(EXIT_USAGE, f"explore: {message} (see --help)\n")


# Options of the step and statement modes, and of --worker alone: each refused in the other.
_NOT_WORKERS = ("statements", "holders", "program", "last_tick", "resources", "first_epoch",
                "receiver", "sample", "seed")
_WORKERS = ("workers", "jobs", "preemptions", "jumps", "crashes", "errors")


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; its exit code."""
    parser = _Parser(
        prog="explorer/explore.py", epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Play every schedule of a small bound on the real library and count what\n"
        "happened at each receiver; with --statements, every interleaving of the calls\n"
        "at each SQL statement.  See explorer/README.md.")
    parser.add_argument("--statements", action="store_true",
                        help="interleave the calls at each SQL statement, with a crash before "
                        "each (default bound: 2 holders, acquire write, tick 0, ttl 1)")
    parser.add_argument("--holders", type=_within(1, 8), metavar="N",
                        help="holders A, B, ... (1 to 8; default 2)")
    parser.add_argument("--program", nargs="+", metavar="WORD",
                        help="each holder's steps, from: acquire renew check write release "
                        "retry (its last write again); default: acquire renew write release")
    parser.add_argument("--last-tick", type=_within(0, 99), metavar="T",
                        help="ticks 0 to T (default 5)")
    parser.add_argument("--ttl", type=_within(1, 99), metavar="N",
                        help="ticks a lease lasts (default 2)")
    parser.add_argument("--resources", type=_within(1, 2), metavar="N",
                        help="1 or 2: with 2, A acquires the first, B the second, C the first")
    parser.add_argument("--receiver", metavar="MODULE:NAME",
                        help="explore your receiver: NAME(path) with write(resource, epoch, "
                        "value) answering an Outcome, its text, or a result with .outcome; "
                        "close() and read(resource) if it has them")
    parser.add_argument("--first-epoch", type=int, metavar="N",
                        help="the epoch every party sees for the authority's first grant "
                        "(default 1): 9 shows an epoch kept as TEXT ('10' < '9')")
    parser.add_argument("--timeout", type=float, metavar="S",
                        help="a call not answered within S seconds is a hang, exit 1 "
                        "(default 10)")
    parser.add_argument("--replay", metavar="WITNESS",
                        help="play a witness again alone, in a fresh process, as printed after "
                        "'--replay' (with the same bound, mode and --receiver)")
    parser.add_argument("--sample", type=_within(0, 999_999), metavar="N",
                        help="step mode: passing schedules played again from a fresh start "
                        "(default 8)")
    parser.add_argument("--seed", type=int, help="the sample's seed (default 0)")
    worker = parser.add_argument_group(
        "your worker", "NAME(queue, me, clock, do, leases, jobs) of MODULE played as each\n"
        "worker (see explorer/README.md, 'Your own worker'); --ttl defaults to MODULE's\n"
        "TTL; --timeout and --replay as above")
    worker.add_argument("--worker", metavar="MODULE:NAME",
                        help="explore your worker, with the recipe's signature")
    for name, most, default, said in (
            ("workers", 8, 2, "workers"), ("jobs", 8, 1, "jobs"),
            ("preemptions", 9, 2, "switches away from a worker that could go on"),
            ("jumps", 2, 1, "moves of the clock by the ttl"),
            ("crashes", 1, 1, "a worker dies before a statement"),
            ("errors", 1, 0, "a statement fails 'database is locked'")):
        least = int(name in ("workers", "jobs"))
        worker.add_argument(f"--{name}", type=_within(least, most), metavar="N",
                            help=f"{said}: {least} to {most}{', at most' * (not least)} "
                            f"(default {default})")
    args = parser.parse_args(argv)
    refused = _refused(args)
    if refused is not None:
        print(f"explore: {refused}", file=sys.stderr)
        return EXIT_USAGE
    ended = {number: signal.signal(number, _interrupted) for number in _ENDING}
    try:
        return _main(args)
    except KeyboardInterrupt as exc:
        print(f"explore: {getattr(exc, 'said', 'interrupted')}", file=sys.stderr)
        return getattr(exc, "code", EXIT_INTERRUPTED)
    except (ValueError, TypeError, ImportError, Unsupported, OSError, sqlite3.Error,
            LeaseError) as exc:  # a library that cannot open a new file included
        print(f"explore: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        for number, handler in ended.items():
            signal.signal(number, handler)


def _within(least: int, most: int) -> Callable[[str], int]:
    """An option's type: a whole number from `least` to `most`."""
    def number(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"wants a whole number, got {text!r}") from None
        if not least <= value <= most:
            raise argparse.ArgumentTypeError(f"wants {least} to {most}, got {value}")
        return value
    return number


def _refused(args: argparse.Namespace) -> str | None:
    """What is wrong with options each fine alone, if anything."""
    for name in _NOT_WORKERS if args.worker is not None else _WORKERS:
        option = "--" + name.replace("_", "-")
        if getattr(args, name) is not None and getattr(args, name) is not False:  # 0 given too
            return (f"--worker takes no {option}" if args.worker is not None else
                    f"{option} is for --worker alone")
    if args.timeout is not None and not 0 < args.timeout < float("inf"):
        return f"--timeout wants a number of seconds above 0, got {args.timeout:g}"
    if args.replay is not None and not args.replay.split() and args.worker is None:
        # (--worker's witness of a worker that raised before any choice is '', and replays)
        return "--replay wants a witness, as printed after '--replay', got nothing"
    return None


# SIGTERM and SIGHUP end a run as Ctrl-C does: children stopped, folders removed, and the
# shell's code for the signal (128 + its number).
_ENDING = (signal.SIGTERM, signal.SIGHUP)


class _Ended(KeyboardInterrupt):
    def __init__(self, number: int) -> None:
        super().__init__(number)
        self.code, self.said = 128 + number, f"ended by {signal.Signals(number).name}"


def _interrupted(number: int, frame: object) -> None:
    raise _Ended(number)


def _main(args: argparse.Namespace) -> int:
    if args.worker is not None:
        return _worker(args)
    base = statements.BOUND if args.statements else Bound()
    given = {"holders": args.holders, "last_tick": args.last_tick, "ttl": args.ttl,
             "resources": args.resources, "first_epoch": args.first_epoch,
             "timeout": args.timeout,
             "program": tuple(args.program) if args.program else None}
    bound = dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})
    receivers = places(args.receiver)
    mode = "statements" if args.statements else "steps"
    started = time.monotonic()
    try:
        if args.replay is not None and args.statements:
            text, ok = statements.replay(bound, receivers[0], args.replay)
        elif args.replay is not None:
            text, ok = steps.replay_steps(bound, receivers, steps.parse(bound, args.replay))
        elif args.statements:
            found = statements.explore_statements(bound, receivers[0])
            text, ok = statements.report(found, time.monotonic() - started), found["ok"]
        else:
            result = steps.explore_steps(bound, receivers, sample=_given(args.sample, 8),
                                        seed=_given(args.seed, 0))
            text = steps.report(result, time.monotonic() - started)
            ok = not any(result["violations"].values())
    except Hung as hung:  # a finding: the call, and how to play it again
        witness = hung.witness
        text, ok = "\n".join([f"hang: {hung.said}", *hung.lines, *[
            "  again: " + command(bound, receivers, mode, witness)] * bool(witness)]), False
    except (Different, Raised) as exc:  # the code under test's failure, not the explorer's
        print(f"explore: {exc}", file=sys.stderr)
        return EXIT_FAILED
    try:
        print(text, flush=True)
    except BrokenPipeError:  # the reader closed stdout (`| head`): the verdict stands
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_OK if ok else EXIT_FAILED


_SHOWN = 30  # the lines of a hang's timeline shown, at most


def _given(value: int | None, default: int) -> int:
    return default if value is None else value


def _worker(args: argparse.Namespace) -> int:
    """--worker: every interleaving of the reader's worker at the bound, or a witness."""
    import workers  # here, not above: it needs recipes/, which the other modes do not
    bound = workers.bound_from(args)
    started = time.monotonic()
    try:
        if args.replay is not None:
            text, ok = workers.replay(bound, args.replay)
        else:
            found = workers.explore_workers(bound)
            text, ok = workers.report(found, time.monotonic() - started), not found["failed"]
    except Hung as hung:  # a finding: where, and how to play it again
        lines = list(hung.lines)
        if len(lines) > _SHOWN + 10:  # a loop: its last turns say enough (the witness is whole)
            lines[:-_SHOWN] = [f"  ... {len(lines) - _SHOWN} lines before"]
        text, ok = "\n".join([f"hang: {hung.said}", *lines,
                              "  again: " + bound.command(hung.witness)]), False
    except Different as exc:  # the explorer's own failure, named
        print(f"explore: {exc}", file=sys.stderr)
        return EXIT_FAILED
    try:
        print(text, flush=True)
    except BrokenPipeError:  # the reader closed stdout (`| head`): the verdict stands
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_OK if ok else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
