"""Side-by-side benchmarks of maleki_rs.pose against scipy and numpy (pose.md §8).

Measures, in one run on this machine, and writes the "pose" section of BENCHMARKS.md:

* B2 batch throughput at N = 20 on ONE core: ``estimate_pose_batch`` (full 6x6 per-point
  covariances, translation and 6x6 covariance returned) and ``absolute_orientation_batch``
  against a Python loop over ``scipy.spatial.transform.Rotation.align_vectors`` (rotation
  only, on centred inputs prepared outside the timed loop); also on all cores and with a
  fixed map.
* B4 the 10,000-run S1 validation end to end on one core: noise generation, solving, errors,
  CRLB and ANEES.
* B1/B3 single-scan latency against N, and the cost per point and iteration.
* Mean iterations per scenario.

Usage: ``cargo bench --bench pose`` (optional: its criterion figures are included when present),
then ``python benches/pose_bench.py [--quick]`` (needs scipy: ``pip install .[bench]``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import maleki_rs  # noqa: E402
from _report import command_line, machine_info, table, timeit, update_section  # noqa: E402,F401
from maleki_rs.pose import (  # noqa: E402
    absolute_orientation,
    absolute_orientation_batch,
    estimate_pose,
    estimate_pose_batch,
    nees,
    pose_error,
    simulate_scans,
)


def cpu_timeit(fn, *, repeat=7, number=1, warmup=1):
    """Like ``_report.timeit`` but in process CPU time: on a shared machine the wall clock also
    counts the time spent waiting for a core, CPU time only the work. Used for every
    one-thread measurement (ours and the anchors alike); the multi-thread rows use wall time."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        for _ in range(number):
            fn()
        times.append((time.process_time() - t0) / number)
    return {"min": min(times), "median": sorted(times)[len(times) // 2]}


def criterion_results() -> list[list[str]]:
    """Mean times of the criterion benches of ``cargo bench --bench pose`` (when run before)."""
    import json
    import os

    target = Path(os.environ.get("CARGO_TARGET_DIR", Path(__file__).resolve().parent.parent / "target"))
    rows = []
    for meta in sorted((target / "criterion").glob("pose_*/**/new/benchmark.json")):
        try:
            full_id = json.loads(meta.read_text())["full_id"]
            est = json.loads((meta.parent / "estimates.json").read_text())
        except (OSError, KeyError, ValueError):
            continue
        mean = est["mean"]["point_estimate"] * 1e-3  # ns -> µs
        rows.append([f"`{full_id}`", f"{mean:,.2f}"])

    def key(row):
        parts = row[0].strip("`").split("/")
        return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts]

    return sorted(rows, key=key)


def numpy_kabsch(b, r):
    bc, rc = b.mean(0), r.mean(0)
    u, _, vt = np.linalg.svd((b - bc).T @ (r - rc))
    d = np.sign(np.linalg.det(u @ vt))
    a = u @ np.diag([1.0, 1.0, d]) @ vt
    return a, bc - a @ rc


def fmt_rate(x):
    return f"{x:,.0f}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = ap.parse_args()
    from scipy.spatial.transform import Rotation

    rep = 3 if args.quick else 7
    threads_all = maleki_rs.get_num_threads()
    out: list[str] = []
    summary: list[list[str]] = []

    # ---- B2: batch throughput, N = 20, one core ------------------------------------------
    maleki_rs.set_num_threads(1)
    nb = 10_000
    s = simulate_scans(nb, 20, scenario="S1", seed=1)
    n_loop = 1000 if args.quick else 3000
    bc = s.b[:n_loop] - s.b[:n_loop].mean(axis=1, keepdims=True)
    rc = s.r[:n_loop] - s.r[:n_loop].mean(axis=1, keepdims=True)

    def scipy_loop():
        for k in range(n_loop):
            Rotation.align_vectors(bc[k], rc[k])

    t_scipy = cpu_timeit(scipy_loop, repeat=max(3, rep // 2))["min"] / n_loop
    t_tls = cpu_timeit(lambda: estimate_pose_batch(s.b, s.r, s.cov), repeat=rep)["min"] / nb
    t_ao = cpu_timeit(lambda: absolute_orientation_batch(s.b, s.r), repeat=rep)["min"] / nb
    r_map = s.r[0]
    b_map = np.einsum("kij,nj->kni", s.rotation, s.r_true[0]) + s.translation[:, None] + (s.b - s.b_true)
    t_map = cpu_timeit(lambda: estimate_pose_batch(b_map, r_map, s.cov[0]), repeat=rep)["min"] / nb
    maleki_rs.set_num_threads(threads_all)
    t_tls_all = timeit(lambda: estimate_pose_batch(s.b, s.r, s.cov), repeat=rep)["min"] / nb
    t_ao_all = timeit(lambda: absolute_orientation_batch(s.b, s.r), repeat=rep)["min"] / nb
    est = estimate_pose_batch(s.b, s.r, s.cov)
    iters_s1 = est.iterations.mean()
    rows = [
        ["scipy `Rotation.align_vectors`, Python loop (rotation only)", "1", f"{t_scipy * 1e6:.1f}",
         fmt_rate(1 / t_scipy), "1.0x"],
        ["`estimate_pose_batch` (S1: full 6x6 cov., + translation + 6x6 covariance)", "1",
         f"{t_tls * 1e6:.2f}", fmt_rate(1 / t_tls), f"**{t_scipy / t_tls:.1f}x**"],
        ["`estimate_pose_batch`, fixed map `r (N,3)`, shared per-point cov `(N,6,6)`", "1",
         f"{t_map * 1e6:.2f}", fmt_rate(1 / t_map), f"{t_scipy / t_map:.1f}x"],
        ["`absolute_orientation_batch` (rotation + translation)", "1", f"{t_ao * 1e6:.3f}", fmt_rate(1 / t_ao),
         f"**{t_scipy / t_ao:.0f}x**"],
        ["`estimate_pose_batch`", str(threads_all), f"{t_tls_all * 1e6:.2f}", fmt_rate(1 / t_tls_all),
         f"{t_scipy / t_tls_all:.1f}x"],
        ["`absolute_orientation_batch`", str(threads_all), f"{t_ao_all * 1e6:.3f}", fmt_rate(1 / t_ao_all),
         f"{t_scipy / t_ao_all:.0f}x"],
    ]
    out.append(f"### B2: batch throughput, N = 20, B = {nb:,} (S1 data, mean {iters_s1:.2f} Gauss-Newton iterations)\n")
    out.append(table(["method", "threads", "µs / pose", "poses / s", "vs scipy loop"], rows))
    summary.append(["batch `estimate_pose_batch`, N=20, 1 core, vs scipy `align_vectors` loop", ">= 10x",
                    f"{t_scipy / t_tls:.1f}x", "met" if t_scipy / t_tls >= 10 else "NOT met"])
    summary.append(["`absolute_orientation_batch`, N=20, 1 core, vs scipy loop", ">= 50x",
                    f"{t_scipy / t_ao:.0f}x", "met" if t_scipy / t_ao >= 50 else "NOT met"])

    # ---- B4: the 10,000-run S1 validation, end to end, one core ----------------------------
    maleki_rs.set_num_threads(1)

    def validation():
        sc = simulate_scans(10_000, 20, scenario="S1", seed=7)
        e = estimate_pose_batch(sc.b, sc.r, sc.cov)
        x = pose_error(e.rotation, e.translation, sc.rotation, sc.translation)
        return nees(x, e.covariance).mean() / 6, nees(x, sc.crlb()).mean() / 6

    parts = {}
    t0 = time.process_time()
    sc = simulate_scans(10_000, 20, scenario="S1", seed=7)
    parts["simulate (numpy)"] = time.process_time() - t0
    t0 = time.process_time()
    e = estimate_pose_batch(sc.b, sc.r, sc.cov)
    parts["estimate_pose_batch"] = time.process_time() - t0
    t0 = time.process_time()
    x = pose_error(e.rotation, e.translation, sc.rotation, sc.translation)
    p_crlb = sc.crlb()
    anees = nees(x, e.covariance).mean() / 6
    anees_c = nees(x, p_crlb).mean() / 6
    parts["errors + CRLB + NEES"] = time.process_time() - t0
    t_val = cpu_timeit(validation, repeat=max(3, rep // 2), warmup=0)["min"]
    maleki_rs.set_num_threads(threads_all)
    out.append("\n### B4: the 10,000-run S1 Monte-Carlo validation, end to end, 1 core (CPU seconds)\n")
    out.append(table(["step", "seconds"], [[k, f"{v:.3f}"] for k, v in parts.items()]
                     + [["**total** (best of repeats)", f"**{t_val:.3f}**"]]))
    out.append(f"\nANEES {anees:.4f} against the estimated covariance, {anees_c:.4f} against the CRLB "
               "(99% band [0.9852, 1.0149]).")
    summary.append(["10,000-run S1 validation incl. noise generation, 1 core", "< 2 s", f"{t_val:.2f} s",
                    "met" if t_val < 2 else "NOT met"])

    # ---- B1 / B3: single-scan latency against N --------------------------------------------
    maleki_rs.set_num_threads(1)
    rows = []
    per_point = []
    for n in (3, 10, 20, 100, 1000, 10_000):
        sn = simulate_scans(1, n, scenario="S1", seed=100 + n)
        b, r, cov = sn.b[0], sn.r[0], sn.cov[0]
        number = max(1, 2000 // n)
        t_est = cpu_timeit(lambda: estimate_pose(b, r, cov), repeat=rep, number=number)["min"]
        iters = estimate_pose(b, r, cov).iterations
        t_aoo = cpu_timeit(lambda: absolute_orientation(b, r), repeat=rep, number=number)["min"]
        bcn, rcn = b - b.mean(0), r - r.mean(0)
        t_sp = cpu_timeit(lambda: Rotation.align_vectors(bcn, rcn), repeat=rep, number=number)["min"]
        t_np = cpu_timeit(lambda: numpy_kabsch(b, r), repeat=rep, number=number)["min"]
        rows.append([str(n), f"{t_est * 1e6:.1f}", str(iters), f"{t_aoo * 1e6:.1f}", f"{t_sp * 1e6:.1f}",
                     f"{t_np * 1e6:.1f}"])
        if n >= 1000:
            per_point.append((n, t_est / (n * iters)))
    maleki_rs.set_num_threads(threads_all)
    out.append("\n### B1: single-scan latency (CPU µs per call from Python, 1 thread)\n")
    out.append(table(["N", "`estimate_pose`", "iterations", "`absolute_orientation`",
                      "scipy `align_vectors` (centred)", "numpy SVD Kabsch"], rows))
    pp = ", ".join(f"N={n}: {v * 1e6:.3f} µs" for n, v in per_point)
    out.append(f"\nB3, cost per point and Gauss-Newton iteration (whole solve / (N · iterations), so "
               f"validation and set-up are included): {pp} (target <= 0.15 µs).")
    worst = max(v for _, v in per_point)
    summary.append(["cost per point and iteration (B3)", "<= 0.15 µs", f"{worst * 1e6:.3f} µs",
                    "met" if worst <= 0.15e-6 else "NOT met"])

    # ---- iterations per scenario ----------------------------------------------------------
    rows = []
    for name in ("S1", "S2", "S3", "S4", "S5", "S6"):
        sn = simulate_scans(2000, scenario=name, seed=11)
        en = sn.estimate()
        rows.append([name, f"{en.iterations.mean():.2f}", str(int(en.iterations.max())),
                     f"{100 * en.converged.mean():.1f}%"])
    out.append("\n### Gauss-Newton iterations per scenario (2,000 scans each, tol 1e-10)\n")
    out.append(table(["scenario", "mean", "max", "converged"], rows))

    crit = criterion_results()
    if crit:
        out.append("\n### Criterion benches of the Rust core (`cargo bench --bench pose`, no Python; wall time)\n")
        out.append(table(["bench", "mean µs"], crit))
        out.append("\nB1 estimate_pose/N is one solve of an S1-style scan of N points; B2 rows are 2,000 scans "
                   "on a 1-thread pool.")

    import os

    import scipy

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    head = [
        f"Command: `{command_line()}`  ",
        f"Machine: {machine_info()}, scipy {scipy.__version__}; "
        f"threads: 1 unless stated ({threads_all} = all cores). One-thread timings are process CPU time "
        f"(the machine is shared with other jobs: CPU time leaves out the waits for a core), best of {rep} "
        "repeats; the rows on all cores are wall time. Ours and the anchors are timed the same way in the "
        f"same run, so the ratios are the figures to read. Load average during the run: {load} (2 cores "
        "shared with other jobs), which is why the all-core rows (wall time) can be slower than one core.",
        "",
        table(["target (pose.md §8)", "target", "measured", "status"], summary),
        "",
    ]
    body = "## pose: total-least-squares pose estimation\n\n" + "\n".join(head + out)
    print(body)
    if not args.no_write:
        update_section("pose", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
