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

from ..cli import PLOT_SUFFIXES, int_arg, out_path, writing
from . import BASELINES, PREMISES, Premise, Schedule, baseline, premise, simulate

#: ``--nmicros`` bounds: the schedules' own (at most 2**24 micro-batches).
NMICROS = int_arg(1, 1 << 24)

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
#: Memory options may be 0 (a block that allocates nothing); spans and chunks are >= 1.
_ZERO_OK = ("act", "tp_mem")
#: ``--ndevs`` bounds: the premises' own (they refuse more than 4096 devices).
_NDEVS = int_arg(1, 4096)
_OUT_SUFFIXES = (".json", ".tessel.json", ".csv", ".txt", ".svg")


def add_premise_args(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    """``--premise NAME --ndevs D [--inference] [--fwd F --bwd B ...]``."""
    p.add_argument("--premise", required=required, choices=PREMISES, help="built-in premise")
    # Without a required premise (a file may hold its own), None tells a --ndevs given from the default.
    p.add_argument("--ndevs", type=_NDEVS, default=4 if required else None, help="number of devices (default 4)")
    p.add_argument("--inference", action="store_true", help="the inference form (forward blocks, no memory)")
    for flag in _SPAN_FLAGS:
        p.add_argument(f"--{flag.replace('_', '-')}", dest=flag, type=int_arg(0 if flag in _ZERO_OK else 1),
                       default=None, metavar="N", help=f"option {flag} of the premise")


def premise_flags_given(args: argparse.Namespace) -> list[str]:
    """The :func:`add_premise_args` flags given on the command line."""
    given = [f"--{k.replace('_', '-')}" for k in ("premise", "ndevs", *_SPAN_FLAGS) if getattr(args, k) is not None]
    return given + (["--inference"] if args.inference else [])


def premise_from_args(args: argparse.Namespace) -> Premise:
    """The premise the :func:`add_premise_args` flags describe."""
    spans = {k: getattr(args, k) for k in _SPAN_FLAGS if getattr(args, k, None) is not None}
    ndevs = 4 if args.ndevs is None else args.ndevs
    return premise(args.premise, ndevs, train=not args.inference, **spans)


def add_output_args(p: argparse.ArgumentParser) -> None:
    """``--out PATH`` (format from the extension), ``--plot PATH``, ``--grid``."""
    # Checked while parsing (extension, directory): a wrong name fails before the work, not after.
    p.add_argument("--out", type=out_path(_OUT_SUFFIXES), action="append", default=[], metavar="PATH",
                   help="write the schedule: .json (ours), .tessel.json, .csv (torch), .txt (grid), .svg; repeatable")
    p.add_argument("--plot", type=out_path(PLOT_SUFFIXES, plot=True), default=None, metavar="PATH",
                   help="Gantt chart as .png/.pdf/.svg (matplotlib; .svg also works without it via --out)")
    p.add_argument("--grid", action="store_true", help="print the text grid")


def _write_file(s: Schedule, path: Path) -> None:
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
    else:  # add_output_args lets only these through
        raise ValueError(f"--out {path}: unknown extension (use {', '.join(_OUT_SUFFIXES)})")


def write_outputs(s: Schedule, args: argparse.Namespace, report: str | None = None) -> None:
    """Writes every ``--out`` file and the ``--plot`` picture, then prints ``report``, what
    was written and the grid if asked.

    The files come first: a reader that stops early (``| head -1``) closes stdout, and the
    files must not depend on it.
    """
    written = []
    for path in [*args.out, *([args.plot] if args.plot is not None else [])]:
        with writing(path):
            if path is args.plot:
                from .plot import gantt

                gantt(s, path=path)
            else:
                _write_file(s, path)
        written.append(path)
    if report is not None:
        print(report)
    for path in written:
        print(f"wrote {path}")
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
    lines.append("  valid (V0-V4 hold)" if n == 0 else f"  INVALID: {n} violation(s), e.g. {s.validate(3)[0]}")
    return "\n".join(lines)


def _memory(args: argparse.Namespace) -> Any:
    return None if args.memory is None else args.memory


def _cmd_premises(args: argparse.Namespace) -> int:
    # --ndevs is within every premise's bounds (the argparse type); a premise that cannot have
    # this many devices (an odd number for kshape, say) says why in its row.
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
    write_outputs(s, args, summary(s))
    return 0


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not a text file (byte {exc.start} is not UTF-8)") from None


def _load(path: Path, args: argparse.Namespace) -> Schedule:
    """The schedule in ``path`` as stored, with the premise the flags give (a CSV, a text grid,
    Tessel's JSON) or its own (our JSON)."""
    given = premise_flags_given(args)
    text = _read(path)
    name = path.name.lower()
    ours = not name.endswith((".csv", ".txt")) and '"maleki_rs.tessel.schedule/' in text
    if ours and given:
        raise ValueError(f"{path}: the file holds its own premise; drop {', '.join(given)}")
    if given and not args.premise:
        raise ValueError(f"{', '.join(given)}: give --premise too")
    p = premise_from_args(args) if args.premise else None
    if p is None and name.endswith((".csv", ".txt")):
        kind = "CSV" if name.endswith(".csv") else "text grid"
        raise ValueError(f"{path}: a {kind} holds no premise: give --premise")
    try:
        if name.endswith(".csv"):
            return Schedule.from_csv(text, p, memory=_memory(args))
        if name.endswith(".txt"):
            return Schedule.from_text(text, p).with_memory(_memory(args))
        if ours:
            s = Schedule.from_json(text)
            return s if args.memory is None else s.with_memory(args.memory)
        return Schedule.from_tessel_json(text, p).with_memory(_memory(args))
    except ValueError as exc:
        # The readers name their argument ("text: ..."); the command names the file.
        msg = str(exc)
        raise ValueError(f"{path}: {msg.removeprefix('text: ')}") from None


def _cmd_simulate(args: argparse.Namespace) -> int:
    s = _load(args.file, args)
    # "simulate" times the file's per-device orders as soon as possible (a CSV holds nothing
    # else); the starts a JSON file or a grid stores are replaced, as `validate` checks them.
    timed = simulate(s.premise, s.orders(), nmicros=s.nmicros, memory=s.memory,
                     memory_convention=s.memory_convention, fifo=s.fifo, lag=args.lag, name=s.name)
    # Chimera's schedules hold their parameters twice: the file says so, the timing keeps it.
    timed = timed._replace(parameter_memory=s.parameter_memory)
    write_outputs(timed, args, summary(timed))
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    s = _load(args.file, args)
    vs = s.validate(limit=args.limit)
    total = s.count_violations()
    if total == 0:
        print(f"valid: V0-V4 hold for {s.nmicros} micro-batches on {s.ndevs} devices (makespan {s.makespan})")
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
    pr.add_argument("--ndevs", type=_NDEVS, default=4, help="number of devices (default 4)")
    pr.set_defaults(func=_cmd_premises)

    b = sub.add_parser("baseline", help="generate a baseline schedule and report it")
    b.add_argument("name", choices=BASELINES, help="the generator")
    add_premise_args(b)
    b.add_argument("--nmicros", type=NMICROS, default=16, help="micro-batches (default 16)")
    b.add_argument("--memory", type=int_arg(0), default=None, help="per-device memory cap to validate against")
    add_output_args(b)
    b.set_defaults(func=_cmd_baseline)

    for cmd, helptext, fn in (
        ("simulate", "time the per-device orders of a schedule file (CSV orders, text grid, JSON) as soon "
         "as possible and report it (the starts a grid or JSON stores are replaced: validate checks those)",
         _cmd_simulate),
        ("validate", "list every violation of V0-V4 in a schedule file, as stored", _cmd_validate),
    ):
        c = sub.add_parser(cmd, help=helptext, description=helptext[0].upper() + helptext[1:] + ".")
        c.add_argument("file", type=Path, help=".csv (torch), .txt (grid), .json (ours or Tessel's)")
        add_premise_args(c, required=False)
        c.add_argument("--memory", type=int_arg(0), default=None,
                       help="per-device memory cap (default: the file's, if it holds one)")
        if cmd == "simulate":
            c.add_argument("--lag", type=int_arg(0, 1 << 30), default=None,
                           help="communication lag on every edge between devices (default: the premise's own)")
            add_output_args(c)
        else:
            c.add_argument("--limit", type=int_arg(0), default=50, help="violations to print (default 50)")
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
