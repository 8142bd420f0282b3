"""Shared helpers of the side-by-side Python benchmarks.

Each subsystem's benchmark script measures ours against its anchor in the same run and
writes one section of BENCHMARKS.md between ``<!-- BEGIN name -->`` and ``<!-- END name -->``
(with the command, the machine and the figures), leaving the other sections untouched.
"""

from __future__ import annotations

import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "BENCHMARKS.md"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> str:
    """One line describing the machine and the software versions."""
    import numpy as np

    import maleki_rs

    feats = ", ".join(maleki_rs._core.build_info()["cpu_features"])
    return (
        f"{cpu_model()}, {os.cpu_count()} logical cores ({feats}); "
        f"Python {platform.python_version()}, numpy {np.__version__}, maleki_rs {maleki_rs.__version__}"
    )


def command_line() -> str:
    return "python " + " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]])


def timeit(fn: Callable[[], Any], *, repeat: int = 7, number: int = 1, warmup: int = 1) -> dict[str, float]:
    """Runs ``fn`` ``warmup`` times, then ``repeat`` timings of ``number`` calls each.

    Returns seconds per call: ``min`` and ``median``.
    """
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t0) / number)
    return {"min": min(times), "median": statistics.median(times)}


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table."""
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def update_section(name: str, body: str) -> None:
    """Replaces (or appends) the section ``name`` of BENCHMARKS.md with ``body``."""
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    text = BENCHMARKS.read_text() if BENCHMARKS.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    BENCHMARKS.write_text(text)


def publish(name: str, lines: list[str], write: bool) -> None:
    """Prints the section ``name`` (its lines) and, if ``write``, puts it in BENCHMARKS.md."""
    text = "\n".join(lines)
    print(text)
    if write:
        update_section(name, text)
