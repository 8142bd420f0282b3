"""``maleki tessel search`` and ``maleki tessel compare``, and the search part of the tour."""

from __future__ import annotations

import argparse
from typing import Any

from ..cli import int_arg, positive_float
from . import BASELINES, Schedule, premise
from ._cli import (
    NMICROS,
    add_output_args,
    add_premise_args,
    baseline_table,
    premise_from_args,
    summary,
    write_outputs,
)
from .search import SearchResult, search

__all__ = ["add_search_commands", "tour_search"]


def _search_args(p: argparse.ArgumentParser) -> None:
    add_premise_args(p)
    p.add_argument("--nmicros", type=NMICROS, default=16, help="micro-batches (default 16)")
    p.add_argument("--memory", type=int_arg(0), default=None, help="per-device memory cap (default: unlimited)")
    p.add_argument("--time-limit", type=positive_float, default=10.0, help="seconds (default 10)")
    p.add_argument("--periodic-k", type=int, default=1, choices=(1, 2, 3), help="micro-batches per repetend")
    p.add_argument("--progress", action="store_true",
                   help="show a progress bar on stderr while searching (needs tqdm)")
    p.add_argument("--memory-convention", default="start", choices=("start", "alloc_start_free_end"),
                   help="when a block's memory release takes effect: at its start (default, Tessel's) "
                   "or at its end")


def _run(args: argparse.Namespace) -> SearchResult:
    p = premise_from_args(args)
    return search(
        p,
        memory=args.memory,
        nmicros=args.nmicros,
        time_limit=args.time_limit,
        periodic_k=args.periodic_k,
        memory_convention=args.memory_convention,
        progress=args.progress,
    )


def _describe(r: SearchResult, time_limit: float | None = None) -> str:
    k = f", {r.periodic_k} micro-batches per period" if r.periodic_k > 1 else ""
    proof = "proved minimal" if r.proved_optimal else "not proved minimal"
    opt = ", makespan proved optimal" if r.makespan_optimal else ""
    text = f"search: period {r.period} ({proof}{k}), completed by {r.method}{opt}, {1e3 * r.search_time:.1f} ms"
    # Parts of the search get half of what is left (large premises, periodic_k > 1): past half
    # the limit some part may have been cut short, and then the result depends on the timing.
    if time_limit is not None and r.search_time >= 0.5 * time_limit:
        text += (f"\n  (it ran into its time limit of {time_limit:g} s: parts were cut short, so another run "
                 "or machine can give another schedule; raise --time-limit)")
    return text


def _cmd_search(args: argparse.Namespace) -> int:
    r = _run(args)
    write_outputs(r.schedule, args, f"{_describe(r, args.time_limit)}\n{summary(r.schedule)}")
    return 0


def _fits(s: Schedule, memory: int | None) -> str:
    if memory is None:
        return "-"
    return "yes" if max(s.peak_memory.tolist()) <= memory else "NO"


def compare_table(r: SearchResult, names: list[str], memory: int | None) -> list[str]:
    """Rows comparing the search result with every baseline that applies to its premise."""
    s0 = r.schedule
    p = s0.premise
    n = s0.nmicros
    lb = p.lower_bound(n)
    lines = [
        f"{'schedule':16} {'makespan':>8} {'vs LB':>7} {'bubble':>7} {'peak memory':>16} {'fits':>5} valid",
    ]

    def row(name: str, s: Schedule) -> str:
        return (
            f"{name:16} {s.makespan:>8} {100 * (s.makespan / lb - 1):>6.1f}% {100 * s.bubble_ratio:>6.1f}% "
            f"{str(s.peak_memory.tolist()):>16} {_fits(s, memory):>5} {'yes' if s.is_valid else 'NO'}"
        )

    lines.append(row("tessel (search)", s0))
    for name, s in baseline_table(names, p, n):
        if isinstance(s, str):
            lines.append(f"{name:16} (n/a: {s})")
        else:
            lines.append(row(name, s))
    return lines


def _cmd_compare(args: argparse.Namespace) -> int:
    r = _run(args)
    p = r.schedule.premise
    cap = "no memory cap" if args.memory is None else f"memory cap {args.memory}"
    lines = [
        f"{args.premise}, D={p.ndevs}, N={args.nmicros}, {cap}: LB(N) = {p.lower_bound(args.nmicros)}",
        _describe(r, args.time_limit),
        *("  " + line for line in compare_table(r, list(BASELINES), args.memory)),
    ]
    write_outputs(r.schedule, args, "\n".join(lines))
    return 0


def add_search_commands(sub: Any) -> None:
    """Adds ``search`` and ``compare`` to ``maleki tessel``."""
    s = sub.add_parser("search", help="search a schedule (repetend + completion) and report it")
    _search_args(s)
    add_output_args(s)
    s.set_defaults(func=_cmd_search)
    c = sub.add_parser("compare", help="the search against every baseline that applies, as a table")
    _search_args(c)
    add_output_args(c)
    c.set_defaults(func=_cmd_compare)


def tour_search() -> None:
    """The search on the paper's placements against the best baseline and the lower bound."""
    print("search (exact repetend + completion), N=32, against 1F1B and the lower bound:")
    print(f"  {'premise':10} {'M':>3} {'P':>3} {'makespan':>8} {'LB(N)':>6} {'1f1b':>6} {'time ms':>8}")
    for name, d, mem in (("vshape", 4, 4), ("mshape", 4, 6), ("nnshape", 4, 6), ("xshape", 4, 4), ("kshape", 4, 6)):
        p = premise(name, d)
        r = search(p, memory=mem, nmicros=32)
        one = [s for _, s in baseline_table(["1f1b"], p, 32) if not isinstance(s, str)]
        b = one[0].makespan if one else "-"
        print(
            f"  {name:10} {mem:>3} {r.period:>3} {r.schedule.makespan:>8} {p.lower_bound(32):>6} {b!s:>6} "
            f"{1e3 * r.search_time:>8.1f}"
        )
