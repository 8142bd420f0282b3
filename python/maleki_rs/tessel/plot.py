"""Gantt charts with matplotlib (optional dependency, imported only when drawing).

For a picture without matplotlib use :meth:`Schedule.to_svg`, which the Rust core writes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from .._util.validate import check_bool, check_int
from ._schedule import Schedule

__all__ = ["gantt", "KIND_COLOURS"]

#: Colours by block kind (the SVG writer uses the same).
KIND_COLOURS = {"forward": "#1f77b4", "backward": "#ff7f0e", "weight": "#2ca02c", "other": "#7f7f7f"}

_SAVE_FORMATS = (".png", ".svg", ".pdf")


def _pyplot() -> Any:
    try:
        import matplotlib

        if os.environ.get("MPLBACKEND") is None and "matplotlib.pyplot" not in __import__("sys").modules:
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "tessel.plot.gantt needs matplotlib (pip install 'maleki_rs[plot]'); "
            "Schedule.to_svg() draws the same chart without it"
        ) from exc
    return plt


def gantt(
    schedule: Schedule,
    ax: Any = None,
    *,
    memory: bool | Any = True,
    repetend: bool = True,
    title: str | None = None,
    path: str | os.PathLike[str] | None = None,
    labels: bool = True,
    dpi: int = 150,
) -> Any:
    """Draws a schedule as a Gantt chart.

    Parameters
    ----------
    schedule : Schedule
    ax : matplotlib Axes, optional
        Where to draw the Gantt; a new figure when None.
    memory : bool or Axes
        Add the memory panel (memory over time per device and the capacity line) below the
        Gantt. With ``ax`` given, pass the Axes for the panel instead of True.
    repetend : bool
        Red vertical lines at the repetend window, when the schedule has one.
    title : str, optional
        Text before the makespan, bubble ratio and period in the title.
    path : str or path, optional
        Save the figure there; ``.png``, ``.svg`` or ``.pdf``.
    labels : bool
        Label each job with its micro-batch (fonts shrink with the block width; labels that
        would not fit are left out).
    dpi : int
        Resolution of a saved PNG.

    Returns
    -------
    matplotlib.figure.Figure
    """
    if not isinstance(schedule, Schedule):
        raise TypeError(f"schedule: expected a Schedule, got {type(schedule).__name__}")
    check_bool(repetend, "repetend")
    check_bool(labels, "labels")
    dpi = check_int(dpi, "dpi", min=10, max=2400)
    if path is not None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path: expected a str or path, got {type(path).__name__}")
        if Path(path).suffix.lower() not in _SAVE_FORMATS:
            raise ValueError(f"path: the file must end in {', '.join(_SAVE_FORMATS)}, got {Path(path).name!r}")
    plt = _pyplot()
    from matplotlib.axes import Axes
    from matplotlib.patches import Patch

    mem_ax = None
    if ax is None:
        want_mem = bool(memory) if isinstance(memory, (bool, np.bool_)) else False
        d = schedule.ndevs
        h_gantt = 0.45 * d + 1.2
        if want_mem:
            fig, (ax, mem_ax) = plt.subplots(
                2, 1, figsize=(12, h_gantt + 2.4), sharex=True, gridspec_kw={"height_ratios": [h_gantt, 2.2]}
            )
        else:
            fig, ax = plt.subplots(figsize=(12, h_gantt))
    else:
        if not isinstance(ax, Axes):
            raise TypeError(f"ax: expected a matplotlib Axes, got {type(ax).__name__}")
        fig = ax.figure
        if isinstance(memory, Axes):
            mem_ax = memory
        elif not isinstance(memory, (bool, np.bool_)):
            raise TypeError(f"memory: expected a bool or a matplotlib Axes, got {type(memory).__name__}")

    p = schedule.premise
    blocks = p.blocks
    starts = schedule.starts
    c = schedule.makespan
    # Width of one time unit in points, to size the labels.
    bbox = ax.get_window_extent().transformed(fig.dpi_scale_trans.inverted())
    pts_per_unit = bbox.width * 72.0 / max(c, 1)
    row_pts = bbox.height * 72.0 / max(p.ndevs, 1)
    for g, b in enumerate(blocks):
        colour = KIND_COLOURS[b.kind]
        hatch = "///" if len(b.devices) > 1 else None
        spans = [(int(starts[j, g]), b.span) for j in range(schedule.nmicros)]
        for dev in b.devices:
            ax.broken_barh(spans, (dev - 0.4, 0.8), facecolors=colour, edgecolor="white", linewidth=0.4, hatch=hatch)
            if labels:
                for j, (t, s) in enumerate(spans):
                    label = str(j)
                    size = min(9.0, 0.8 * s * pts_per_unit / (0.62 * len(label) + 0.4), 0.55 * row_pts)
                    if size >= 4.0:
                        ax.text(t + s / 2, dev, label, ha="center", va="center", fontsize=size, color="white")
    ax.set_ylim(p.ndevs - 0.5, -0.5)
    ax.set_yticks(range(p.ndevs))
    ax.set_yticklabels([f"dev {d}" for d in range(p.ndevs)])
    ax.set_xlim(min(0, int(starts.min(initial=0))), c)
    kinds = sorted({b.kind for b in blocks}, key=list(KIND_COLOURS).index)
    handles = [Patch(facecolor=KIND_COLOURS[k], label=k) for k in kinds]
    if any(len(b.devices) > 1 for b in blocks):
        handles.append(Patch(facecolor="#bbbbbb", hatch="///", label="multi-device"))
    ax.legend(handles=handles, loc="upper right", fontsize=8, ncol=len(handles), frameon=False, bbox_to_anchor=(1.0, 1.12))
    rep = schedule.repetend if repetend else None
    if rep is not None:
        for x in rep:
            ax.axvline(x, color="red", linewidth=1.4)
    ax.set_title(schedule.title(title), loc="left", fontsize=11)
    if mem_ax is not None:
        caps = schedule.memory
        for dev in range(p.ndevs):
            t, lv = schedule.memory_timeline(dev)
            mem_ax.step(np.append(t, c), np.append(lv, lv[-1]), where="post", linewidth=1.2, label=f"dev {dev}")
        if caps is not None:
            for cap in sorted({m for m in caps if m is not None}):
                mem_ax.axhline(cap, color="#d62728", linestyle="--", linewidth=1.0)
                mem_ax.text(c, cap, f" cap {cap}", color="#d62728", va="bottom", ha="right", fontsize=8)
        if rep is not None:
            for x in rep:
                mem_ax.axvline(x, color="red", linewidth=1.4)
        mem_ax.set_ylabel("memory")
        mem_ax.set_xlabel("time")
        if p.ndevs <= 16:
            mem_ax.legend(fontsize=7, ncol=min(p.ndevs, 8), loc="upper left", frameon=False)
    else:
        ax.set_xlabel("time")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=dpi)
    return fig
