"""Tessel (HPCA 2024): pipeline schedules for any operator placement.

A *premise* places one micro-batch: blocks (span, devices, memory delta, kind) and edges.
A *schedule* starts every block of every micro-batch. This package builds premises
(:func:`premise`, :meth:`Premise.from_blocks`), generates baseline schedules
(:func:`baseline`: GPipe, 1F1B, 1F1B+, Chimera, interleaved 1F1B, ZB-H1/H2, inference
pipelining), times per-device orders (:func:`simulate`), checks schedules (``validate``),
measures them (``metrics``: makespan, bubble ratio, peak memory, period, critical chain,
lower bound), and reads and writes them (our JSON, Tessel's JSON, the text grid, the CSV
torch.distributed.pipelining loads, SVG; :mod:`maleki_rs.tessel.plot` draws Gantt charts).

Examples
--------
>>> from maleki_rs import tessel
>>> p = tessel.premise("vshape", ndevs=4)
>>> s = tessel.baseline("1f1b", p, nmicros=8)
>>> s.makespan, p.lower_bound(8), s.peak_memory.tolist()
(44, 44, [4, 3, 2, 1])
>>> s.validate()
[]
"""

from __future__ import annotations

from importlib.util import find_spec as _find_spec

from . import plot
from ._premise import KINDS, PREMISES, Block, Premise, premise
from ._schedule import (
    BASELINES,
    CONVENTIONS,
    FORMAT,
    Schedule,
    Violation,
    baseline,
    simulate,
    validate_template,
)

__all__ = [
    "Block",
    "Premise",
    "premise",
    "Schedule",
    "Violation",
    "baseline",
    "simulate",
    "validate_template",
    "plot",
    "PREMISES",
    "BASELINES",
    "KINDS",
    "CONVENTIONS",
    "FORMAT",
]

# The schedule search lives in .search (its own module); export its public names when present.
if _find_spec(f"{__name__}.search") is not None:
    from . import search as _search

    for _name in getattr(_search, "__all__", ()):
        globals()[_name] = getattr(_search, _name)
        __all__.append(_name)
