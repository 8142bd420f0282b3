"""The schedule search of Tessel (spec §4): repetend construction and schedule completion.

:func:`search` finds a periodic schedule for any premise: an exact branch-and-bound over
1-periodic templates (the *repetend*; K-periodic with ``periodic_k``), then completion to N
micro-batches (unrolling, compaction, a budgeted search of the warm-up and cool-down) and,
for small instances, the exact solver. :func:`exact` is the exact solver alone (proves
optimal makespans of small instances); :func:`repetends` is the repetend construction alone.

Examples
--------
>>> from maleki_rs import tessel
>>> p = tessel.premise("vshape", ndevs=4)
>>> r = tessel.search(p, memory=4, nmicros=8)
>>> r.period, r.schedule.makespan, r.proved_optimal
(4, 44, True)
>>> tessel.exact(p, nmicros=4, memory=4).makespan
28
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._core import tessel as _t
from .._util.progress import reporter
from .._util.validate import check_choice, check_int
from ._premise import Premise
from ._schedule import CONVENTIONS, Schedule, _check_premise, _memory_arg

__all__ = ["search", "exact", "repetends", "SearchResult", "ExactResult", "Repetend"]

@dataclass(frozen=True)
class SearchResult:
    """What :func:`search` found.

    Attributes
    ----------
    period : int
        Steady period in time units per repetend (``periodic_k`` micro-batches per period):
        throughput is ``periodic_k / period`` micro-batches per time unit.
    periodic_k : int
        Micro-batches per repetend.
    template : ndarray of int64, shape (periodic_k * nblocks,)
        The template: block ``g`` of micro-batch ``j`` starts at ``template[g] + j * period``
        in the plain unrolled schedule (for K > 1, copy ``c`` of block ``g`` is entry
        ``c * nblocks + g`` and covers micro-batches ``j * K + c``).
    proved_optimal : bool
        The period is proved minimal (no smaller period has a template within the memory
        caps) and the search at that period finished.
    makespan_optimal : bool
        The exact solver proved the schedule's makespan optimal (small instances only).
    method : str
        How the schedule was completed: ``"compacted"``, ``"ramp_search"``,
        ``"concatenated"`` (Tessel-style: warm-up, repetend windows, cool-down) or ``"exact"``;
        ``"baseline"`` when a baseline generator's schedule (``schedule.name`` says which) fits
        the caps and is shorter than every completion (the search never returns a schedule
        longer than a valid baseline; ``period`` and ``template`` still describe the best
        template found, and the schedule carries none).
    search_time : float
        Wall-clock seconds.
    schedule : Schedule
        The schedule (valid: V0-V4 hold within the memory caps).
    candidates : tuple of (int, int, int, str)
        ``(period, template length L, makespan, method)`` of every template completed.
    nodes : int
        Branch-and-bound nodes of the repetend search.
    """

    period: int
    periodic_k: int
    template: NDArray[np.int64]
    proved_optimal: bool
    makespan_optimal: bool
    method: str
    search_time: float
    schedule: Schedule
    candidates: tuple[tuple[int, int, int, str], ...]
    nodes: int

    @property
    def throughput(self) -> float:
        """Micro-batches per time unit in the steady state, ``periodic_k / period``."""
        return self.periodic_k / self.period

    def __repr__(self) -> str:
        s = self.schedule
        return (
            f"SearchResult(period={self.period}, periodic_k={self.periodic_k}, makespan={s.makespan}, "
            f"nmicros={s.nmicros}, proved_optimal={self.proved_optimal}, method={self.method!r}, "
            f"search_time={self.search_time:.4f})"
        )


@dataclass(frozen=True)
class ExactResult:
    """What :func:`exact` found: the best schedule, its makespan, and whether it is proved optimal."""

    schedule: Schedule | None
    makespan: int | None
    proved_optimal: bool
    nodes: int
    search_time: float


@dataclass(frozen=True)
class Repetend:
    """One period of :func:`repetends`: the shortest template found and whether it is proved."""

    period: int
    length: int
    template: NDArray[np.int64]
    first_template: NDArray[np.int64] | None
    exhausted: bool
    nodes: int


def _time_limit(time_limit: Any) -> float | None:
    if time_limit is None:
        return None
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float, np.integer, np.floating)):
        raise TypeError(f"time_limit: expected a number of seconds or None, got {type(time_limit).__name__}")
    t = float(time_limit)
    if math.isinf(t) and t > 0:
        return None
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"time_limit: must be a positive number of seconds, got {time_limit!r}")
    return min(t, 1e8)


def _caps(memory: Any, ndevs: int) -> list[int | None] | None:
    caps = _memory_arg(memory, ndevs)
    return None if caps is None else list(caps)


def search(
    premise: Premise,
    *,
    memory: Any = None,
    nmicros: int,
    time_limit: float | None = 10.0,
    periodic_k: int = 1,
    delta_p: int = 3,
    memory_convention: str = "start",
    node_budget: int = 5_000_000,
    ramp_budget: int = 20_000,
    transplant_budget: int = 0,
    concat_budget: int = 1_000,
    exact_jobs: int = 72,
    progress: Any = False,
) -> SearchResult:
    """Searches a pipeline schedule of ``nmicros`` micro-batches for ``premise``.

    Parameters
    ----------
    premise : Premise
        The placement of one micro-batch (:func:`maleki_rs.tessel.premise`,
        :meth:`Premise.from_blocks`).
    memory : None, int or sequence of int/None
        Per-device memory cap, in the units of the blocks' memory deltas; None: unlimited.
    nmicros : int
        Number of micro-batches N (>= 1).
    time_limit : float or None
        Wall-clock limit in seconds (default 10). When it cuts a search short the best
        schedule found so far is returned with ``proved_optimal=False``. It bounds the
        searches; writing out the schedule of N micro-batches takes time of its own, about
        O(N log N) (some seconds for N = 10^6).
    periodic_k : {1, 2, 3}
        Micro-batches per repetend. K > 1 can beat every 1-periodic schedule when memory is
        tight (Tessel cannot express it). A 1-periodic schedule is K-periodic too: with K > 1
        the 1-periodic search runs first, on half the time limit, and the shorter schedule
        wins (then ``template`` is the 1-periodic one repeated K times, and ``schedule``
        describes its own 1-periodic repetend).
    delta_p : int
        Periods searched above the smallest feasible one (small N can prefer a larger period
        with a much shorter template).
    memory_convention : {"start", "alloc_start_free_end"}
        When a negative memory delta takes effect.
    node_budget : int
        Node budget of the repetend search, per period.
    ramp_budget, transplant_budget : int
        Node budgets of the warm-up/cool-down search: of short schedules (``nmicros`` up to
        about three template lengths, searched whole) and of longer ones (searched on a short
        instance and transplanted; off by default, as it is slow to pay off: about 2 million
        nodes take mshape D4 M4 from 7N+11 to 7N+8).
    concat_budget : int
        Node budget of each warm-up and each cool-down solve of the Tessel-style completion
        (an optimal warm-up, the repetend repeated, an optimal cool-down, as the reference
        composes its schedules; the better of it and the other completions wins; 0: off).
        The default takes mshape D4 M4 to 7N+7 in a few milliseconds.
    exact_jobs : int
        Also run the exact solver when ``nmicros * nblocks`` is at most this (0: never).
    progress : bool or callable
        ``True`` for a tqdm bar (when installed), or ``callback(done, total)``; raising in it
        (or Ctrl-C) stops the search.

    Returns
    -------
    SearchResult
        ``period``, ``template``, ``proved_optimal``, ``search_time`` and ``schedule`` (a
        :class:`Schedule`: ``starts`` int64 of shape (nmicros, nblocks), ``makespan``, ...).

    Raises
    ------
    maleki_rs.exceptions.InfeasibleError
        No schedule fits the memory caps, or none was found within the budgets (the message
        says which; a ``ValueError``). Caps below what one micro-batch must hold (an
        allocating block's ancestors on a device still holding their memory when it starts)
        are reported before any search. Where the repetend search finds no template near the
        period lower bound and modulo scheduling breaks the caps, one micro-batch scheduled
        alone (by the exact solver), repeated at the smallest valid period, is the template.
    """
    p = _check_premise(premise)
    nm = check_int(nmicros, "nmicros", min=1, max=1 << 20)
    caps = _caps(memory, p.ndevs)
    tl = _time_limit(time_limit)
    k = check_int(periodic_k, "periodic_k", min=1, max=3)
    dp = check_int(delta_p, "delta_p", min=0, max=64)
    if not isinstance(memory_convention, str):
        raise TypeError(f"memory_convention: expected a str, got {type(memory_convention).__name__}")
    conv = check_choice(memory_convention, "memory_convention", CONVENTIONS)
    nb = check_int(node_budget, "node_budget", min=1, max=1 << 62)
    rb = check_int(ramp_budget, "ramp_budget", min=0, max=1 << 62)
    tb = check_int(transplant_budget, "transplant_budget", min=0, max=1 << 62)
    cb = check_int(concat_budget, "concat_budget", min=0, max=1 << 62)
    ej = check_int(exact_jobs, "exact_jobs", min=0, max=10_000)
    with reporter(progress, "tessel search") as rep:
        d = _t.search(p._core, caps, nm, conv, dp, k, tl, nb, rb, tb, cb, ej, rep.callback)
    s = Schedule._from_core(d["schedule"])
    template = np.asarray(d["template"], dtype=np.int64)
    template.setflags(write=False)
    return SearchResult(
        period=int(d["period"]),
        periodic_k=int(d["periodic_k"]),
        template=template,
        proved_optimal=bool(d["proved_optimal"]),
        makespan_optimal=bool(d["makespan_optimal"]),
        method=str(d["method"]),
        search_time=float(d["search_time"]),
        schedule=s,
        candidates=tuple((int(a), int(b), int(c), str(m)) for a, b, c, m in d["candidates"]),
        nodes=int(d["nodes"]),
    )


def exact(
    premise: Premise,
    nmicros: int,
    memory: Any = None,
    *,
    time_limit: float | None = 60.0,
    memory_convention: str = "start",
    node_budget: int = 50_000_000,
    progress: Any = False,
) -> ExactResult:
    """The exact solver (spec §4.4): a makespan-optimal schedule of a small instance.

    A serial schedule-generation branch-and-bound with dominance between states; it proves
    the optima of instances up to about 72 jobs (``nmicros * nblocks``) in seconds. FIFO per
    block is always on.

    Parameters
    ----------
    premise : Premise
    nmicros : int
        Micro-batches (>= 1).
    memory : None, int or sequence of int/None
        Per-device memory caps.
    time_limit : float or None
        Seconds (default 60); the best schedule so far is returned when it runs out.
    memory_convention : {"start", "alloc_start_free_end"}
    node_budget : int
        Search nodes before giving up the proof.
    progress : bool or callable

    Returns
    -------
    ExactResult
        ``schedule`` (None only when nothing was found in time), ``makespan``,
        ``proved_optimal``, ``nodes``, ``search_time``.

    Raises
    ------
    maleki_rs.exceptions.InfeasibleError
        When no schedule fits the memory caps (proved).
    """
    p = _check_premise(premise)
    nm = check_int(nmicros, "nmicros", min=1, max=4096)
    caps = _caps(memory, p.ndevs)
    tl = _time_limit(time_limit)
    if not isinstance(memory_convention, str):
        raise TypeError(f"memory_convention: expected a str, got {type(memory_convention).__name__}")
    conv = check_choice(memory_convention, "memory_convention", CONVENTIONS)
    nb = check_int(node_budget, "node_budget", min=1, max=1 << 62)
    with reporter(progress, "tessel exact") as rep:
        d = _t.exact(p._core, nm, caps, conv, tl, nb, rep.callback)
    s = None if d["schedule"] is None else Schedule._from_core(d["schedule"])
    return ExactResult(
        schedule=s,
        makespan=None if d["makespan"] is None else int(d["makespan"]),
        proved_optimal=bool(d["proved_optimal"]),
        nodes=int(d["nodes"]),
        search_time=float(d["search_time"]),
    )


def repetends(
    premise: Premise,
    *,
    memory: Any = None,
    delta_p: int = 3,
    time_limit: float | None = 10.0,
    memory_convention: str = "start",
    node_budget: int = 5_000_000,
    progress: Any = False,
) -> tuple[int | None, bool, list[Repetend]]:
    """Repetend construction alone (spec §4.1): the shortest template per period.

    Returns
    -------
    (min_period, min_period_proved, periods)
        The smallest period with a template, whether every smaller one was proved to have
        none, and one :class:`Repetend` per period in ``min_period .. min_period + delta_p``
        that is not dominated by a smaller period.
    """
    p = _check_premise(premise)
    caps = _caps(memory, p.ndevs)
    tl = _time_limit(time_limit)
    dp = check_int(delta_p, "delta_p", min=0, max=64)
    if not isinstance(memory_convention, str):
        raise TypeError(f"memory_convention: expected a str, got {type(memory_convention).__name__}")
    conv = check_choice(memory_convention, "memory_convention", CONVENTIONS)
    nb = check_int(node_budget, "node_budget", min=1, max=1 << 62)
    with reporter(progress, "tessel repetends") as rep:
        ps, proved, rows = _t.repetends(p._core, caps, conv, dp, tl, nb, rep.callback)

    def arr(x: Any) -> NDArray[np.int64]:
        a = np.asarray(x, dtype=np.int64)
        a.setflags(write=False)
        return a

    out = [
        Repetend(int(q), int(l), arr(t), None if f is None else arr(f), bool(e), int(n))
        for q, l, t, f, e, n in rows
    ]
    return (None if ps is None else int(ps)), bool(proved), out
