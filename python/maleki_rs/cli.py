"""The ``maleki`` command.

``maleki --version``, ``maleki tour`` (every available subsystem on built-in data) and one
sub-command per subsystem (``maleki pose simulate``, ``maleki tessel search``, ...).

A subsystem plugs in by shipping ``maleki_rs/<name>/_cli.py`` with two functions:
``register(subparsers)`` adds its sub-command, and ``tour()`` runs its part of the tour and
prints what it did.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Sequence
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="maleki",
        description="maleki_rs: research systems as a Python library with a Rust core.",
    )
    parser.add_argument("--version", action="version", version=f"maleki_rs {maleki_rs.__version__}")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="number of worker threads (default: MALEKI_RS_NUM_THREADS or all cores)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    tour = sub.add_parser("tour", help="run every available subsystem on built-in data")
    tour.add_argument("--only", nargs="+", metavar="SUBSYSTEM", help="run only these subsystems")
    tour.set_defaults(func=_tour)
    for _, cli in _subsystem_clis():
        cli.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
    except (ValueError, TypeError, maleki_rs.MalekiError) as exc:
        print(f"maleki: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file that cannot be read or written
        print(f"maleki: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
