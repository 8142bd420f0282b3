"""``maleki tessel ...``: premises, baselines, simulation and validation from the shell.

Sub-commands: ``premises``, ``baseline``, ``simulate``, ``validate``. Other parts of the
subsystem add theirs (``search``, ``compare``) through :func:`register` using the helpers
here: :func:`add_premise_args`, :func:`premise_from_args`, :func:`add_output_args`,
:func:`write_outputs` and :func:`summary`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import BASELINES, PREMISES, Premise, Schedule, baseline, premise, simulate

__all__ = [
    "register",
    "tour",
    "add_premise_args",
    "premise_from_args",
    "add_output_args",
    "write_outputs",
    "summary",
    "SUBCOMMANDS",
]

#: Extra sub-command registrars: ``fn(subparsers) -> None``, called by :func:`register`.
SUBCOMMANDS: list[Callable[[Any], None]] = []

_SPAN_FLAGS = ("fwd", "bwd", "wgt", "tp_fwd", "tp_bwd", "act", "tp_mem", "chunks")


def add_premise_args(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    """``--premise NAME --ndevs D [--inference] [--fwd F --bwd B ...]``."""
    p.add_argument("--premise", required=required, choices=PREMISES, help="built-in premise")
    p.add_argument("--ndevs", type=int, default=4, help="number of devices (default 4)")
    p.add_argument("--inference", action="store_true", help="the inference form (forward blocks, no memory)")
    for flag in _SPAN_FLAGS:
        p.add_argument(f"--{flag.replace('_', '-')}", dest=flag, type=int, default=None, metavar="N",
                       help=f"option {flag} of the premise")


def premise_from_args(args: argparse.Namespace) -> Premise:
    """The premise the :func:`add_premise_args` flags describe."""
    spans = {k: getattr(args, k) for k in _SPAN_FLAGS if getattr(args, k, None) is not None}
    return premise(args.premise, args.ndevs, train=not args.inference, **spans)


def add_output_args(p: argparse.ArgumentParser) -> None:
    """``--out PATH`` (format from the extension), ``--plot PATH``, ``--grid``."""
    p.add_argument("--out", type=Path, action="append", default=[], metavar="PATH",
                   help="write the schedule: .json (ours), .tessel.json, .csv (torch), .txt (grid), .svg; repeatable")
    p.add_argument("--plot", type=Path, default=None, metavar="PATH",
                   help="Gantt chart as .png/.pdf/.svg (matplotlib; .svg also works without it via --out)")
    p.add_argument("--grid", action="store_true", help="print the text grid")


def write_outputs(s: Schedule, args: argparse.Namespace) -> None:
    """Writes every ``--out`` file, the ``--plot`` picture, and prints the grid if asked."""
    for path in args.out:
        name = path.name.lower()
        if name.endswith(".tessel.json"):
            s.to_tessel_json(path)
        elif name.endswith(".json"):
            s.to_json(path)
        elif name.endswith(".csv"):
            s.to_csv(path)
        elif name.endswith(".txt"):
            path.write_text(s.to_text())
        elif name.endswith(".svg"):
            s.to_svg(path)
        else:
            raise ValueError(f"--out {path}: unknown extension (use .json, .tessel.json, .csv, .txt or .svg)")
        print(f"wrote {path}")
    if args.plot is not None:
        from .plot import gantt

        gantt(s, path=args.plot)
        print(f"wrote {args.plot}")
    if args.grid:
        print(s.to_text() if s.makespan * s.ndevs <= 200_000 else s.to_text(compact=True))


def summary(s: Schedule) -> str:
    """A one-paragraph report: makespan against LB(N), bubble ratio, peak memory, validity."""
    m = s.metrics()
    per = m["period"]
    lines = [
        f"{s.name or 'schedule'}: D={s.ndevs} N={s.nmicros}  makespan {m['makespan']}  "
        f"(LB(N) {m['lower_bound']}, gap {100 * m['gap']:.1f}%)  bubble ratio {100 * m['bubble_ratio']:.1f}%",
        f"  peak memory per device {list(m['peak_memory'])}"
        + (f" (x{s.parameter_memory} parameters)" if s.parameter_memory > 1 else ""),
        f"  steady period {per[0]} over micro-batches {per[1]}..{per[2]}" if per else "  no steady period detected",
    ]
    n = s.count_violations()
    lines.append("  valid (V1-V4 hold)" if n == 0 else f"  INVALID: {n} violation(s), e.g. {s.validate(3)[0]}")
    return "\n".join(lines)


def _memory(args: argparse.Namespace) -> Any:
    return None if args.memory is None else args.memory


def _cmd_premises(args: argparse.Namespace) -> int:
    print(f"{'premise':14} {'blocks':>6} {'work W_d':>12} {'CP':>4}   (D={args.ndevs}, training form)")
    for name in PREMISES:
        try:
            p = premise(name, args.ndevs)
        except ValueError as exc:
            print(f"{name:14} -- {exc}")
            continue
        print(f"{name:14} {p.nblocks:>6} {str(p.work.tolist()):>12} {p.critical_path:>4}")
    return 0


def _cmd_baseline(args: argparse.Namespace) -> int:
    p = premise_from_args(args)
    s = baseline(args.name, p, args.nmicros, memory=_memory(args))
    print(summary(s))
    write_outputs(s, args)
    return 0


def _load(path: Path, p: Premise | None, args: argparse.Namespace) -> Schedule:
    text = path.read_text()
    name = path.name.lower()
    if name.endswith(".csv"):
        if p is None:
            raise ValueError("a CSV holds no premise: give --premise")
        return Schedule.from_csv(text, p, memory=_memory(args))
    if name.endswith(".txt"):
        if p is None:
            raise ValueError("a text grid holds no premise: give --premise")
        return Schedule.from_text(text, p).with_memory(_memory(args))
    if '"maleki_rs.tessel.schedule/' in text:
        s = Schedule.from_json(text)
        return s if args.memory is None else s.with_memory(args.memory)
    return Schedule.from_tessel_json(text, p).with_memory(_memory(args))


def _cmd_simulate(args: argparse.Namespace) -> int:
    p = premise_from_args(args) if args.premise else None
    s = _load(args.file, p, args)
    if args.lag is not None:
        s = simulate(s.premise, s.orders(), nmicros=s.nmicros, memory=_memory(args), lag=args.lag)
    print(summary(s))
    write_outputs(s, args)
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    p = premise_from_args(args) if args.premise else None
    s = _load(args.file, p, args)
    vs = s.validate(limit=args.limit)
    total = s.count_violations()
    if total == 0:
        print(f"valid: V1-V4 hold for {s.nmicros} micro-batches on {s.ndevs} devices (makespan {s.makespan})")
        return 0
    for v in vs:
        print(v)
    if total > len(vs):
        print(f"... and {total - len(vs)} more")
    print(f"INVALID: {total} violation(s)")
    return 1


def register(subparsers: Any) -> None:
    """Adds ``maleki tessel`` and its sub-commands."""
    top = subparsers.add_parser("tessel", help="pipeline schedules (Tessel): baselines, simulation, validation")
    sub = top.add_subparsers(dest="tessel_command", metavar="COMMAND")
    top.set_defaults(func=lambda _a: (top.print_help(), 2)[1])

    pr = sub.add_parser("premises", help="list the built-in premises")
    pr.add_argument("--ndevs", type=int, default=4)
    pr.set_defaults(func=_cmd_premises)

    b = sub.add_parser("baseline", help="generate a baseline schedule and report it")
    b.add_argument("name", choices=BASELINES, help="the generator")
    add_premise_args(b)
    b.add_argument("--nmicros", type=int, default=16, help="micro-batches (default 16)")
    b.add_argument("--memory", type=int, default=None, help="per-device memory cap to validate against")
    add_output_args(b)
    b.set_defaults(func=_cmd_baseline)

    for cmd, helptext, fn in (
        ("simulate", "time a schedule file (CSV orders, text grid, JSON) and report it", _cmd_simulate),
        ("validate", "list every violation of V1-V4 in a schedule file", _cmd_validate),
    ):
        c = sub.add_parser(cmd, help=helptext)
        c.add_argument("file", type=Path, help=".csv (torch), .txt (grid), .json (ours or Tessel's)")
        add_premise_args(c, required=False)
        c.add_argument("--memory", type=int, default=None, help="per-device memory cap")
        if cmd == "simulate":
            c.add_argument("--lag", type=int, default=None, help="communication lag between devices")
            add_output_args(c)
        else:
            c.add_argument("--limit", type=int, default=50, help="violations to print (default 50)")
        c.set_defaults(func=fn)

    for extra in SUBCOMMANDS:
        extra(sub)


def baseline_table(names: list[str], p: Premise, nmicros: int) -> list[tuple[str, Schedule | str]]:
    """Each baseline on ``p`` (or the reason it does not apply)."""
    rows: list[tuple[str, Schedule | str]] = []
    for name in names:
        try:
            rows.append((name, baseline(name, p, nmicros)))
        except ValueError as exc:
            rows.append((name, str(exc).split(":", 1)[-1].strip()))
    return rows


def tour() -> None:
    """Baselines on the V and the M-shape against the lower bound, and a small grid."""
    n = 16
    for label, p in (("vshape", premise("vshape", 4)), ("mshape", premise("mshape", 4))):
        lb = p.lower_bound(n)
        print(f"{label}, D=4, N={n}: work per device {p.work.tolist()}, LB(N) = {lb}")
        print(f"  {'baseline':16} {'makespan':>8} {'gap':>7} {'bubble':>7} {'peak mem':>12} valid")
        for name, s in baseline_table(["gpipe", "1f1b", "1f1b+", "chimera"], p, n):
            if isinstance(s, str):
                print(f"  {name:16} (n/a: {s.split(' (')[0].split(',')[0]})")
                continue
            ok = "yes" if s.is_valid else "NO"
            print(
                f"  {name:16} {s.makespan:>8} {100 * (s.makespan / lb - 1):>6.1f}% {100 * s.bubble_ratio:>6.1f}% "
                f"{str(s.peak_memory.tolist()):>12} {ok}"
            )
    z = premise("zb_v", 4)
    print("zb_v, D=4, N=16 (B/W split, f=b=w=1): bubble per device (time units)")
    for name in ("1f1b", "zb_h1", "zb_h2"):
        s = baseline(name, z, n)
        print(f"  {name:6} makespan {s.makespan}  idle {s.makespan - n * 3}  peak {s.peak_memory.tolist()}")
    s = baseline("1f1b", premise("vshape", 4), 4)
    print("1F1B on the V, D=4, N=4 (text grid as the reference prints it):")
    sys.stdout.write(s.to_text())
    from ._search_cli import tour_search

    tour_search()


# The search's sub-commands (``search``, ``compare``) live with the search.
from ._search_cli import add_search_commands as _add_search_commands  # noqa: E402

SUBCOMMANDS.append(_add_search_commands)
