"""The ``maleki`` command.

``maleki --version``, ``maleki tour`` (every available subsystem on built-in data) and one
sub-command per subsystem (``maleki pose simulate``, ``maleki tessel search``, ...).

A subsystem plugs in by shipping ``maleki_rs/<name>/_cli.py`` with two functions:
``register(subparsers)`` adds its sub-command, and ``tour()`` runs its part of the tour and
prints what it did.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType

import maleki_rs


def _subsystem_clis() -> list[tuple[str, ModuleType]]:
    found = []
    for name in maleki_rs.AVAILABLE:
        try:
            found.append((name, importlib.import_module(f"maleki_rs.{name}._cli")))
        except ModuleNotFoundError as exc:
            if exc.name != f"maleki_rs.{name}._cli":
                raise
    return found


def _tour(args: argparse.Namespace) -> int:
    clis = _subsystem_clis()
    wanted = args.only or [name for name, _ in clis]
    unknown = sorted(set(wanted) - {name for name, _ in clis})
    if unknown:
        print(f"maleki tour: not available: {', '.join(unknown)}", file=sys.stderr)
        return 2
    maleki_rs.show_config()
    for name, cli in clis:
        if name not in wanted:
            continue
        print(f"\n== {name} " + "=" * max(0, 66 - len(name)))
        t0 = time.perf_counter()
        cli.tour()
        print(f"-- {name}: {time.perf_counter() - t0:.2f} s")
    return 0


# -- argparse types shared by the sub-commands --------------------------------------------------
# Checking flags while parsing reports them by their flag name ("argument --m: ...") before any
# work starts, where the library would name its Python parameter after the work has begun.


def int_arg(lo: int = 1, hi: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: an integer in ``[lo, hi]``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {value}")
        if hi is not None and value > hi:
            raise argparse.ArgumentTypeError(f"must be <= {hi}, got {value}")
        return value

    return parse


def positive_float(text: str) -> float:
    """An argparse ``type``: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


#: What ``savefig`` writes for the ``--plot`` flags: it picks the format from the extension and
#: appends ``.png`` to a name without one, so any other name would not be the file written.
PLOT_SUFFIXES = (".png", ".pdf", ".svg")


def out_path(suffixes: Sequence[str], *, plot: bool = False) -> Callable[[str], Path]:
    """An argparse ``type``: a file to write, ending in one of ``suffixes``, in a directory
    that exists; with ``plot``, matplotlib must be installed too."""

    def parse(text: str) -> Path:
        path = Path(text)
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{text}: is a directory")
        if not path.name.lower().endswith(tuple(suffixes)):
            raise argparse.ArgumentTypeError(f"{text}: unknown extension (use {', '.join(suffixes)})")
        if not path.parent.is_dir():
            raise argparse.ArgumentTypeError(f"{text}: directory {str(path.parent)!r} does not exist")
        if plot and importlib.util.find_spec("matplotlib") is None:
            raise argparse.ArgumentTypeError("needs matplotlib (pip install matplotlib, or maleki_rs[plot])")
        return path

    return parse


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Adds ``path`` to an OSError raised inside that names no file: a full disk fails a
    write, not the open, and Python's message then says only "No space left on device"."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="maleki",
        description="maleki_rs: research systems as a Python library with a Rust core.",
    )
    parser.add_argument("--version", action="version", version=f"maleki_rs {maleki_rs.__version__}")
    parser.add_argument("--threads", type=int_arg(1, 4096), default=None, metavar="N",
                        help="number of worker threads (default: MALEKI_RS_NUM_THREADS or all cores)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    tour = sub.add_parser("tour", help="run every available subsystem on built-in data",
                          description="Runs every available subsystem (or those of --only) on built-in data "
                                      "and prints what each did; a few seconds each.")
    tour.add_argument("--only", nargs="+", metavar="SUBSYSTEM", help="run only these subsystems")
    tour.set_defaults(func=_tour)
    for _, cli in _subsystem_clis():
        cli.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = _main(argv)
        # Flushed here so that a reader gone by now (``| head``) is handled below, not by
        # the interpreter's shutdown (which would print an ignored-exception message).
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader closed the pipe (``maleki ... | head -1``): stop quietly, as POSIX tools
        # killed by SIGPIPE do, with their exit status 128 + 13 = 141. Python would flush
        # stdout again at exit and fail anew, so what is left goes to /dev/null.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (AttributeError, OSError, ValueError):  # stdout replaced (e.g. captured by a test)
            pass
        return 141


def _main(argv: Sequence[str] | None) -> int:
    try:
        # Parsing imports the subsystems (numpy...), the slow part of a start: Ctrl-C there
        # is an interruption too, not a traceback.
        parser = build_parser()
        args = parser.parse_args(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    if args.threads is not None:
        try:
            maleki_rs.set_num_threads(args.threads)
        except ValueError as exc:
            parser.error(str(exc))
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except MemoryError as exc:
        # numpy's message ("Unable to allocate 745. GiB for an array ...") or the core's,
        # which already begins with "out of memory".
        msg = str(exc) or "could not allocate memory"
        print(f"maleki: error: {msg if msg.startswith('out of memory') else 'out of memory: ' + msg}",
              file=sys.stderr)
        return 1
    except (ValueError, TypeError, maleki_rs.MalekiError) as exc:
        print(f"maleki: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        raise  # main() handles it (it is an OSError, but not a file's)
    except OSError as exc:  # a file that cannot be read or written
        print(f"maleki: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
