"""The int4 GEMV with the caller busy between calls, against ONNX Runtime, in one run.

Writes section "msgemm-pauses" of BENCHMARKS.md. The main benchmark (``msgemm_bench.py``) times
calls back to back. A program that runs a model does other work between two layers' GEMVs
(Python code, numpy on the activations), and on a VM a thread that sleeps meanwhile costs
tens of microseconds to wake. Here each call follows a pause of ``gap`` microseconds in which
the calling thread spins (busy, as Python code would be); int4 g128, 4096 x 4096, 2 threads:
``msgemm(pw, x)`` with the defaults, and ONNX Runtime's MatMulNBits at accuracy level 4 (its
fastest int4 path) from the optional extra, in alternating blocks. Per call: min and median
of 3 rounds of 300 calls.

Usage: ``python benches/msgemm_pause_bench.py [--threads 2] [--no-write]``. The helper thread
of 2-thread GEMVs waits ``MALEKI_RS_SPIN_US`` (default 1000) between calls before it sleeps:
set it in the environment to measure another wait.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _report  # noqa: E402
from msgemm_bench import limit_blas, ort_run, ort_session  # noqa: E402

import maleki_rs  # noqa: E402
from maleki_rs import msgemm as mg  # noqa: E402

GAPS_US = (0, 30, 100, 300, 1000)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = ap.parse_args()
    th = args.threads
    maleki_rs.set_num_threads(th)
    _limits = limit_blas(th)
    rng = np.random.default_rng(0)
    m = k = 4096
    pw = mg.quantize(rng.standard_normal((m, k), dtype=np.float32), format="int4", group_size=128)
    x = rng.standard_normal(k, dtype=np.float32)
    fns = {"ours": lambda: mg.msgemm(pw, x)}
    sess = ort_session(pw, 4, 4, th)
    if sess is not None:
        fns["ort4"] = lambda: ort_run(sess, x)
    pc = time.perf_counter
    rows = []
    for gap in GAPS_US:
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(3):
            for name, f in fns.items():
                time.sleep(0.2)  # the other library's threads park
                t0 = pc()
                while pc() - t0 < 0.1:  # and this one's come up to speed
                    f()
                for _ in range(300):
                    g = pc()
                    while (pc() - g) * 1e6 < gap:
                        pass
                    t = pc()
                    f()
                    times[name].append(pc() - t)
        us = {name: np.array(v) * 1e6 for name, v in times.items()}
        row = [f"{gap}", f"{us['ours'].min():.1f} / {np.median(us['ours']):.1f}"]
        if "ort4" in us:
            row += [f"{us['ort4'].min():.1f} / {np.median(us['ort4']):.1f}",
                    f"{np.median(us['ort4']) / np.median(us['ours']):.2f}x"]
        else:
            row += ["—", "—"]
        rows.append(row)
        print(row, flush=True)
    spin = os.environ.get("MALEKI_RS_SPIN_US", "").strip() or "unset (1000)"
    body = [
        "## msgemm: the GEMV with the caller busy between calls",
        "",
        f"Command: `{_report.command_line()}`",
        f"Machine: {_report.machine_info()}",
        f"Threads: {th}. int4 g128 4096 x 4096, warm, defaults; MALEKI_RS_SPIN_US {spin}. Before each call "
        "the calling thread spins for the pause (as Python code between two layers would); us per call, "
        "min / median of 3 rounds of 300 calls, ours and ONNX Runtime level 4 in alternating blocks.",
        "",
        _report.table(["pause us", "ours us", "ORT level 4 us", "ours faster (medians)"], rows),
        "",
        "2-thread GEMVs run on the calling thread and one helper thread, which waits for the next "
        "call MALEKI_RS_SPIN_US microseconds before it sleeps (spinning, then yielding its core); "
        "ONNX Runtime's threads spin too. Past the wait, both pay a wake-up.",
    ]
    _report.publish("msgemm-pauses", body, not args.no_write)


if __name__ == "__main__":
    main()
