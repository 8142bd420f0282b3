"""msGeMM on the CPU against its anchors, measured side by side in one run (spec section 9).

Writes section "msgemm" of BENCHMARKS.md. Anchors:

- A0: numpy float32 ``Wd @ x`` on weights dequantized beforehand (numpy's best case);
- A1: our dequantize-then-GEMM: ``pw.dequantize(np.float32) @ x`` (Rust dequantize, numpy
  sgemm), timed per call;
- A2: our fused dequantize-and-FMA GEMV (4-bit formats; AVX-512 F/BW/DQ when the CPU has it and
  the group size is a multiple of 32, else a scalar loop): the weights decoded in
  registers and multiplied in float32, i.e. everything but the tables' sharing across rows,
  which isolates what the look-up tables are worth;
- A3: ONNX Runtime ``com.microsoft.MatMulNBits`` (optional ``bench`` extra), accuracy levels 0
  (float) and 4 (int8 activations), built here with the ``onnx`` helper API from the same
  codes and scales (its output is checked against ours before timing).

Ours: ``msgemm(pw, x)`` with the defaults (i8 tables for a GEMV, except on AMD CPUs with
AVX-512 VNNI, which run GEMVs on the dense i16 path; depth "auto", the fastest
kernel of this CPU), tables included in every timing; batches name both table precisions (the
default runs ``i16`` where the dense int8 path exists, ``i8`` elsewhere). Warm: the same weights repeatedly; cold: a rotation of
weight sets totalling more than twice the L3 cache. GB/s are the bytes a call reads from the
weights (the layout its kernel reads, scales, zero points: ``read_bytes``) per second.

Usage: ``python benches/msgemm_bench.py [--quick] [--threads 2]``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _report  # noqa: E402

import maleki_rs  # noqa: E402
from maleki_rs import msgemm as mg  # noqa: E402
from maleki_rs.msgemm._cli import read_bytes  # noqa: E402  (the bytes a call reads: GB/s)


def blas_info() -> str:
    try:
        from threadpoolctl import threadpool_info

        infos = [
            f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')}, {i.get('num_threads')} threads)"
            for i in threadpool_info()
            if i.get("user_api") == "blas"
        ]
        return "; ".join(infos) or "unknown"
    except ImportError:
        return "unknown (threadpoolctl not installed)"


def limit_blas(threads: int):
    try:
        from threadpoolctl import threadpool_limits

        return threadpool_limits(limits=threads, user_api="blas")
    except ImportError:
        return None


# ---------------------------------------------------------------------------------------------
# A2: our fused dequantize-and-FMA GEMV (4-bit packings)
# ---------------------------------------------------------------------------------------------


def fused_ok(pw: mg.PackedWeights) -> bool:
    """Whether A2 runs ``pw`` (4-bit codes without an input permutation)."""
    return pw.format in ("int4", "uint4", "nf4", "fp4") and pw.k_perm is None


def fused_gemv(pw: mg.PackedWeights, x: np.ndarray) -> np.ndarray:
    """``Wd @ x`` by the fused dequantize GEMV (``rust/msgemm/src/fused.rs``): every weight
    decoded in registers from a 16-entry table of ``s * (v[c] - z)`` per (row, group) and
    multiplied into float32 accumulators; the table method without the sharing across rows."""
    return maleki_rs._core.msgemm.fused_gemv(pw._raw, x)


# ---------------------------------------------------------------------------------------------
# ONNX Runtime MatMulNBits
# ---------------------------------------------------------------------------------------------


def ort_session(pw: mg.PackedWeights, bits: int, level: int, threads: int):
    """A MatMulNBits session computing ``x @ Wd.T`` from ``pw``'s codes and scales, or None."""
    try:
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError:
        return None
    m, k = pw.shape
    g = pw.group_size
    codes = pw.codes.reshape(m, k // g, g).astype(np.uint8)
    per = 8 // bits
    blob = np.zeros((m, k // g, g // per), np.uint8)
    for j in range(per):
        blob |= (codes[:, :, j::per] << (bits * j)).astype(np.uint8)
    inits = [
        helper.make_tensor("B", TensorProto.UINT8, blob.shape, blob.tobytes(), raw=True),
        helper.make_tensor("scales", TensorProto.FLOAT, [m * (k // g)], pw.scales.astype(np.float32).ravel()),
    ]
    inputs = ["A", "B", "scales"]
    if pw.zeros is not None:
        return None  # zero points in value units do not map onto MatMulNBits' integer ones
    node = helper.make_node(
        "MatMulNBits", inputs, ["Y"], domain="com.microsoft", K=k, N=m, bits=bits, block_size=g, accuracy_level=level
    )
    graph = helper.make_graph(
        [node],
        "mnb",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["n", k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n", m])],
        inits,
    )
    # IR version 8 (the lowest opset 17 allows): onnx's default is the newest IR it knows, which
    # an older ONNX Runtime refuses to load (ORT 1.30 with onnx 1.23 did, on the GPU machine).
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=8)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as e:  # an ORT build without this bit width
        print(f"  ORT MatMulNBits bits={bits} level={level}: unavailable ({type(e).__name__}: {str(e)[:80]})")
        return None


def ort_run(sess, x: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(x.T if x.ndim == 2 else x[None, :], dtype=np.float32)
    return sess.run(None, {"A": a})[0]


# ---------------------------------------------------------------------------------------------


def timeit_rounds(fns: dict[str, Any], repeat: int, number: int = 1, rounds: int = 2) -> dict[str, dict[str, float]]:
    """Times several functions in blocks (``repeat`` timings of ``number`` calls each), in turn,
    for ``rounds`` rounds; returns ``{name: {"min", "median"}}`` seconds per call.

    Blocks rather than alternation: the thread pools of numpy, ONNX Runtime and ours spin for a
    while after each call, and on 2 vCPUs a pool spinning next to another one's run distorts
    both. A pause before each block lets the previous pool park (OpenBLAS's threads busy-wait
    for about 2^28 cycles, some 70-100 ms, after each call: with a 50 ms pause our GEMV right
    after numpy's measured 0.31 ms instead of 0.22 ms). After the pause each function runs
    untimed for at least 100 ms: on this VM the first dozen calls after an idle pause are slow
    for any code (a 4096 x 4096 int4 GEMV on one thread, no pool involved: 0.7-1.1 ms, then
    0.2-0.45 ms, against 0.12-0.23 ms in a steady loop), which spinning thread pools (ONNX
    Runtime's) hide and sleeping ones (ours, 1 ms after a call) do not. AMX tiles take longer to come up to speed
    than that: int4 4096 x 4096, N = 16, minima of 5 calls after the pause, run for 30 ms:
    0.63-1.05 ms; for 100-300 ms: 0.61-0.75 ms; a steady loop: 0.57-0.63 ms (VNNI 0.90-1.34,
    0.92-1.03 and 0.87-0.91 ms). Hence 100 ms. (Sustained load slows this host's cores, likely
    their turbo: the one-thread GEMV measures 0.40-0.50 ms after 30 ms, 0.45-0.49 after 100 ms.)
    """
    import statistics
    import time

    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            time.sleep(0.25)
            t_warm = time.perf_counter()
            f()
            while time.perf_counter() - t_warm < 0.1:
                f()
            for _ in range(repeat):
                t0 = time.perf_counter()
                for _ in range(number):
                    f()
                times[k].append((time.perf_counter() - t0) / number)
    return {k: {"min": min(v), "median": statistics.median(v)} for k, v in times.items()}


def fmt_ms(t: dict[str, float]) -> str:
    return f"{t['min'] * 1e3:.3f} / {t['median'] * 1e3:.3f}"


def gbs(nbytes: int, t: dict[str, float]) -> str:
    return f"{nbytes / t['min'] / 1e9:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer shapes and repeats (smoke run)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = ap.parse_args()
    th = args.threads
    maleki_rs.set_num_threads(th)
    _limits = limit_blas(th)
    rep = 7 if args.quick else 30
    rng = np.random.default_rng(0)
    (m, k) = (4096, 4096)
    lines: list[str] = []
    notes: list[str] = []

    # --- GEMV per format, warm -------------------------------------------------------------
    formats = [
        ("int4 g128", dict(format="int4", group_size=128), 4),
        ("uint4+zp g128", dict(format="uint4", group_size=128), 4),
        ("int2 g64", dict(format="int2", group_size=64), 2),
        ("ternary g128", dict(format="ternary", group_size=128), None),
        ("nf4 g128", dict(format="nf4", group_size=128), None),
        ("fp4 g32", dict(format="fp4", group_size=32), None),
        ("fp8_e4m3 g128", dict(format="fp8_e4m3", group_size=128), None),
    ]
    if args.quick:
        formats = formats[:1] + formats[2:4]
    w = rng.standard_normal((m, k), dtype=np.float32)
    x = rng.standard_normal(k, dtype=np.float32)
    rows = []
    int4_per_weight = None
    headline: dict[str, float] = {}
    # Ours for every format in the same rounds, so that weights/s compare like with like.
    pws = {name: mg.quantize(w, **kw) for name, kw, _ in formats}
    # 8 rounds: the host's load comes in bursts of seconds, and a minimum over rounds spread
    # over the run is what stays comparable between runs.
    t_all = timeit_rounds({name: (lambda p=p: mg.msgemm(p, x)) for name, p in pws.items()},
                          repeat=max(3, rep // 2), number=3, rounds=8)
    for name, kw, ort_bits in formats:
        pw = pws[name]
        wd = pw.dequantize(np.float32)
        y_ref = wd.astype(np.float64) @ x.astype(np.float64)
        y = mg.msgemm(pw, x)
        err = float(np.abs(y - y_ref).sum() / np.abs(y_ref).sum())
        sessions = {level: (ort_session(pw, ort_bits, level, th) if ort_bits else None) for level in (0, 4)}
        fns = {"ours": lambda: mg.msgemm(pw, x), "a0": lambda: wd @ x}
        info = mg.plan_info(pw)
        runs = f"{info['table']} " + ("dense" if info["dense_int8"] else
                                       "fp8 decode" if info["fp8_kernel"] else f"depth {info['depth']}")
        if info["table"] != "i8":  # the tables beside a default that does not use them
            fns["i8"] = lambda: mg.msgemm(pw, x, table="i8")
        if name == "int4 g128":  # the per-core rate (spec: T-MAC class, >= 25 GB/s per core)
            fns["ours 1 thread"] = lambda: mg.msgemm(pw, x, threads=1)
        if fused_ok(pw):
            fns["a2"] = lambda: fused_gemv(pw, x)
        for level, sess in sessions.items():
            if sess is not None:
                fns[f"ort{level}"] = lambda s=sess: ort_run(s, x)
        tt = timeit_rounds(fns, repeat=max(3, rep // 2), number=3, rounds=8)
        t_ours, t_a0 = tt["ours"], tt["a0"]
        t_same = t_all[name]  # ours, timed with the other formats (for weights/s across formats)
        t_a1 = _report.timeit(lambda: pw.dequantize(np.float32) @ x, repeat=max(3, rep // 5))
        ort_cells = []
        for level, sess in sessions.items():
            if sess is None:
                ort_cells.append("—")
                continue
            yo = ort_run(sess, x).ravel()
            o_err = float(np.abs(yo - y_ref).sum() / np.abs(y_ref).sum())
            t = tt[f"ort{level}"]
            ort_cells.append(f"{fmt_ms(t)} (rel L1 {o_err:.1e}; ours {t['min'] / t_ours['min']:.2f}x faster)")
            headline[f"{name} ort{level}"] = t["min"]
        if "a2" in tt:
            y2 = fused_gemv(pw, x)
            a2_err = float(np.abs(y2 - y_ref).sum() / np.abs(y_ref).sum())
            t2 = tt["a2"]
            a2_cell = f"{fmt_ms(t2)} (rel L1 {a2_err:.1e}; ours {t2['min'] / t_ours['min']:.1f}x faster)"
            headline[f"{name} a2"] = t2["min"]
        else:
            a2_cell = "—"
        per_weight = t_same["min"] / (m * k)
        nbytes = read_bytes(pw)  # rebuilds the caches once (timings done)
        if name == "int4 g128":
            int4_per_weight = per_weight
            headline["int4"] = t_ours["min"]
            headline["a0"] = t_a0["min"]
            headline["int4 bytes"] = nbytes
            headline["int4 1 thread"] = tt["ours 1 thread"]["min"]
        speed_vs_int4 = f"{int4_per_weight / per_weight:.2f}x" if int4_per_weight else "—"
        rows.append(
            [
                name,
                runs,
                fmt_ms(t_ours),
                gbs(nbytes, t_ours),
                f"{err:.1e}",
                fmt_ms(tt["i8"]) if "i8" in tt else "(the default)",
                fmt_ms(t_a0),
                f"{t_a0['min'] / t_ours['min']:.1f}x",
                fmt_ms(t_a1),
                f"{t_a1['min'] / t_ours['min']:.1f}x",
                a2_cell,
                ort_cells[0],
                ort_cells[1],
                speed_vs_int4,
            ]
        )
        print(name, rows[-1], flush=True)
    lines.append(f"### GEMV {m}x{k}, N = 1, {th} threads, warm (tables included)\n")
    lines.append(
        _report.table(
            [
                "format",
                "default runs",
                "ours ms (min / median)",
                "ours GB/s (bytes read)",
                "rel. L1 err",
                "i8 tables ms",
                "A0 numpy f32 ms",
                "ours vs A0",
                "A1 dequant+GEMM ms",
                "ours vs A1",
                "A2 fused dequant+FMA ms",
                "A3 ORT level 0 ms",
                "A3 ORT level 4 ms",
                "weights/s vs int4 (same rounds)",
            ],
            rows,
        )
    )

    # --- cold cache --------------------------------------------------------------------------
    sets = 4 if args.quick else 9
    cold_rows = []
    for name, kw in [("int4 g128", dict(format="int4", group_size=128)), ("int2 g64", dict(format="int2", group_size=64))]:
        pws = [mg.quantize(rng.standard_normal((m, k), dtype=np.float32), **kw) for _ in range(sets)]
        for p in pws:
            mg.msgemm(p, x)  # builds the cached tile layouts
        it = iter(range(10**9))

        def cold_call(pws=pws, it=it):
            mg.msgemm(pws[next(it) % len(pws)], x)

        t_cold = _report.timeit(cold_call, repeat=rep, number=len(pws))
        t_warm = _report.timeit(lambda p=pws[0]: mg.msgemm(p, x), repeat=rep, number=5)
        nb = read_bytes(pws[0])
        cold_rows.append([name, f"{sets} x {nb / 2**20:.1f} MiB = {sets * nb / 2**20:.0f} MiB", fmt_ms(t_warm), gbs(nb, t_warm), fmt_ms(t_cold), gbs(nb, t_cold)])
        print("cold", cold_rows[-1], flush=True)
        if name == "int4 g128":
            headline["int4 cold"] = t_cold["min"]
        del pws
    wds = [rng.standard_normal((m, k), dtype=np.float32) for _ in range(2 if args.quick else 3)]
    it0 = iter(range(10**9))
    t_a0_cold = _report.timeit(lambda: wds[next(it0) % len(wds)] @ x, repeat=rep, number=len(wds))
    del wds
    headline["a0 cold"] = t_a0_cold["min"]
    lines.append(f"\n### Cold cache: GEMV {m}x{k}, rotating weight sets larger than 2x L3\n")
    lines.append(
        _report.table(
            ["format", "rotation", "warm ms", "warm GB/s", "cold ms", "cold GB/s"],
            cold_rows + [["A0 numpy f32 (64 MiB per matrix)", "rotating", "—", "—", fmt_ms(t_a0_cold), gbs(m * k * 4, t_a0_cold)]],
        )
    )

    # --- float32 against float16 scales ------------------------------------------------------
    # The same weights quantized with float32 and with float16 scales (the smallest float16 at
    # or above each computed scale), timed in the same rounds: the kernels read float16 scales
    # as float16, half the scale bytes. fp4's MX scales are float16 values either way.
    srows = []
    scases = [("int4 g128", dict(format="int4", group_size=128)), ("uint4+zp g128", dict(format="uint4", group_size=128)),
              ("int2 g64", dict(format="int2", group_size=64)), ("ternary g128", dict(format="ternary", group_size=128)),
              ("nf4 g128", dict(format="nf4", group_size=128))]
    for name, kw in scases[: 2 if args.quick else len(scases)]:
        p32 = mg.quantize(w, **kw)
        p16 = mg.quantize(w, **kw, scale_dtype=np.float16)
        assert p32.scale_dtype == np.float32 and p16.scale_dtype == np.float16
        tt = timeit_rounds({"f32": lambda p=p32: mg.msgemm(p, x), "f16": lambda p=p16: mg.msgemm(p, x)},
                           repeat=max(3, rep // 2), number=3, rounds=8)
        qerr = [float(np.abs(p.dequantize() - w).sum() / np.abs(w).sum()) for p in (p32, p16)]
        b32, b16 = read_bytes(p32), read_bytes(p16)
        srows.append([name, f"{b32 / 2**20:.2f}", fmt_ms(tt["f32"]), gbs(b32, tt["f32"]),
                      f"{b16 / 2**20:.2f}", fmt_ms(tt["f16"]), gbs(b16, tt["f16"]),
                      f"{tt['f32']['min'] / tt['f16']['min']:.2f}x", f"{qerr[0]:.4e} / {qerr[1]:.4e}"])
        print("scales", srows[-1], flush=True)
    lines.append(f"\n### Float32 against float16 scales: GEMV {m}x{k}, {th} threads, warm (same rounds)\n")
    lines.append(
        _report.table(["format", "f32 scales: MiB read", "ms", "GB/s", "f16 scales: MiB read", "ms", "GB/s",
                       "f16 faster by", "quantization rel. L1 error f32 / f16"], srows)
    )

    # --- batches -----------------------------------------------------------------------------
    pw = mg.quantize(w, format="int4", group_size=128)
    wd = pw.dequantize(np.float32)
    brows = []
    sessions = {level: ort_session(pw, 4, level, th) for level in (0, 4)}  # any N
    has_avx2 = "avx2" in mg.available_backends()
    info16 = mg.plan_info(pw, n=16, table="i16")
    dense = info16["dense_int8"]
    dense_name = {"avx512": "AVX-512 VNNI", "amx": "AMX", "avx2": "AVX2", "neon": "Arm64 sdot"}.get(
        info16["backend"], info16["backend"])
    has_amx = "amx" in mg.available_backends()
    batch_err: dict[str, float] = {}
    for n in [1, 4, 16, 64] if not args.quick else [4, 16]:
        xb = rng.standard_normal((k, n), dtype=np.float32)
        # A1 in the same rounds as ours: the ratio that the goal is about then sees the same
        # bursts of load from the other tenants of this VM's host.
        fns = {
            "ours": lambda: mg.msgemm(pw, xb, table="i8"),
            "i16": lambda: mg.msgemm(pw, xb, table="i16"),
            "a0": lambda: wd @ xb,
            "a1": lambda: pw.dequantize(np.float32) @ xb,
        }
        # The same sums on AVX-512 VNNI, where the default runs them on AMX tiles (from 6
        # columns on); below, the default is the VNNI kernel itself.
        on_amx = has_amx and mg.plan_info(pw, n=n, table="i16")["backend"] == "amx"
        if on_amx:
            fns["i16 vnni"] = lambda: mg.msgemm(pw, xb, table="i16", backend="avx512")
        if has_avx2:  # what an AVX2-only CPU runs (dense int8 on AVX2)
            fns["i16 avx2"] = lambda: mg.msgemm(pw, xb, table="i16", backend="avx2")
            fns["i8 avx2"] = lambda: mg.msgemm(pw, xb, table="i8", backend="avx2")
        for level, sess in sessions.items():
            if sess is not None:
                fns[f"ort{level}"] = lambda s=sess: ort_run(s, xb)
        tt = timeit_rounds(fns, repeat=max(3, rep // 6), rounds=5)
        t_ours, t_16, t_a0, t_a1 = tt["ours"], tt["i16"], tt["a0"], tt["a1"]
        headline[f"batch{n} i8"], headline[f"batch{n} i16"] = t_ours["min"], t_16["min"]
        if sessions[4] is not None:
            headline[f"batch{n} ort4"] = tt["ort4"]["min"]
        if n == 16:
            ref = wd.astype(np.float64) @ xb.astype(np.float64)
            outs = {"i8": mg.msgemm(pw, xb, table="i8"), "i16": mg.msgemm(pw, xb, table="i16")}
            if sessions[4] is not None:
                outs["ORT level 4"] = ort_run(sessions[4], xb).T
            batch_err = {key: float(np.abs(v - ref).sum() / np.abs(ref).sum()) for key, v in outs.items()}
        cells = []
        for level, sess in sessions.items():
            if sess is None:
                cells.append("—")
                continue
            t = tt[f"ort{level}"]
            cells.append(f"{fmt_ms(t)} ({t['min'] / t_ours['min']:.2f}x / {t['min'] / t_16['min']:.2f}x)")
        tab16 = (f"{fmt_ms(tt['i16 avx2'])} ({tt['i8 avx2']['min'] / tt['i16 avx2']['min']:.2f}x)"
                 if has_avx2 else "—")
        vnni = ([f"{fmt_ms(tt['i16 vnni'])} ({tt['i16 vnni']['min'] / t_16['min']:.2f}x)"] if on_amx
                else ["(the default is VNNI)"] if has_amx else [])
        brows.append([n, fmt_ms(t_ours), fmt_ms(t_16), *vnni, tab16, fmt_ms(t_a0),
                      f"{t_a0['min'] / t_ours['min']:.2f}x / {t_a0['min'] / t_16['min']:.2f}x", fmt_ms(t_a1),
                      f"{t_a1['min'] / t_ours['min']:.2f}x / {t_a1['min'] / t_16['min']:.2f}x", *cells])
        print("batch", brows[-1], flush=True)
    lines.append(f"\n### Batches: int4 g128 {m}x{k}, {th} threads, warm\n")
    lines.append(
        _report.table(
            ["N", "ours i8 ms", "ours i16 ms" + (" (dense int8)" if dense else ""),
             *(["i16 on AVX-512 VNNI ms (the default faster by)"] if has_amx else []),
             "i16 on AVX2 ms (faster than i8 on AVX2 by)",
             "A0 numpy ms", "ours vs A0 (i8 / i16)", "A1 dequant+GEMM ms", "ours vs A1 (i8 / i16)",
             "ORT level 0 ms (ours faster by, i8 / i16)", "ORT level 4 ms (ours faster by, i8 / i16)"],
            brows,
        )
    )
    default16 = mg.plan_info(pw, n=16)["table"]
    para = (f"\nThe default call (no `table=`) runs `{default16}` for these batches on this CPU"
            + (f" (the dense path; `{mg.plan_info(pw, n=1)['table']}` for a GEMV)." if dense else "."))
    if batch_err:
        errs = ", ".join(f"{key} {v:.2e}" for key, v in batch_err.items())
        para += (f" Relative L1 error against float64 at N = 16: {errs}. The `i16` mode rounds activations "
                     "to int8 per (column, group) and sums exact integers, as ORT level 4 does"
                 + (f" (here on the dense {dense_name} path)." if dense else "."))
    if has_amx:
        para += (" On this CPU the default runs those sums on AMX tiles from 6 columns on and on "
                 "AVX-512 VNNI below; the VNNI column times the same calls with `backend='avx512'`.")
    lines.append(para)

    # --- batches by format: the goal of at least 2x A1 for N = 16..64 -----------------
    # The default call for each format (the dense `i16` path for integer codebooks, `bf16`
    # mode for float ones on AMX-BF16 CPUs, and for small groups of integer ones in larger
    # batches; else `i8` tables) in the same rounds as `i8` tables, A0 and A1.
    frows = []
    fcases = [("int4 g128", dict(format="int4", group_size=128)), ("fp4 g32", dict(format="fp4", group_size=32)),
              ("nf4 g64", dict(format="nf4", group_size=64)), ("nf4 g128", dict(format="nf4", group_size=128)),
              ("codebook g128 (16 float levels)", dict(format="codebook", group_size=128,
                                                        codebook=np.linspace(-1.0, 1.0, 16) ** 3))]
    for name, kw in fcases[: 3 if args.quick else len(fcases)]:
        pw = mg.quantize(w, **kw)
        wd = pw.dequantize(np.float32)
        for n in (16, 64):
            xb = rng.standard_normal((k, n), dtype=np.float32)
            fns = {"default": lambda: mg.msgemm(pw, xb), "i8": lambda: mg.msgemm(pw, xb, table="i8"),
                   "a0": lambda: wd @ xb, "a1": lambda: pw.dequantize(np.float32) @ xb}
            tt = timeit_rounds(fns, repeat=max(3, rep // 6), rounds=4)
            info = mg.plan_info(pw, n=n)
            ref = wd.astype(np.float64) @ xb.astype(np.float64)
            err = float(np.abs(mg.msgemm(pw, xb) - ref).sum() / np.abs(ref).sum())
            ratio = tt["a1"]["min"] / tt["default"]["min"]
            headline.setdefault("batch a1 ratios", []).append((name, n, ratio))
            frows.append([name, n, f"{info['table']} ({info['backend']})", fmt_ms(tt["default"]), f"{err:.1e}",
                          fmt_ms(tt["i8"]), fmt_ms(tt["a0"]), fmt_ms(tt["a1"]),
                          f"{tt['a0']['min'] / tt['default']['min']:.2f}x", f"{ratio:.2f}x"])
            print("formats", frows[-1], flush=True)
        del wd, pw
    lines.append(f"\n### Batches by format: {m}x{k}, {th} threads, warm (the default call)\n")
    lines.append(
        _report.table(["format", "N", "default runs (kernel)", "default ms", "default rel. L1 err", "i8 tables ms",
                       "A0 numpy ms", "A1 dequant+GEMM ms", "default vs A0", "default vs A1 (goal >= 2x)"], frows)
    )
    lines.append("\nThe default call runs the dense `i16` path for integer codebooks (int4, fp4) and `bf16` mode "
                 "for float ones (nf4, float custom codebooks: on CPUs with AMX-BF16 from N = 6, with AVX-512 from "
                 "N = 8, with AVX2 and FMA from N = 16; below, `i8` tables, about a GEMV per column), and for integer ones with small groups (on AMX groups of at most 16 "
                 "inputs from N = 8 and of at most 32 from N = 32; on AMD's AVX-512 BF16 groups of at most 16 from "
                 "N = 24 and of at most 32 from N = 48 (Zen 4: of at most 16 from N = 32); on other AVX-512 and AVX2 CPUs groups of at most 16 from "
                 "N = 32). Errors are relative L1 against the float64 product of the dequantized "
                 "weights.")

    # --- the bf16 kernels by batch size: where the defaults' thresholds come from -------------
    # nf4 g64: each `bf16` backend of this CPU against the `i8` tables (the default backend's and
    # those of the instruction set a CPU without AMX runs otherwise: AVX-512, AVX2 with FMA).
    # `examples/bf16_kernels` also times the AVX-512 BF16 kernel, which only AMD CPUs run.
    pw = mg.quantize(w, format="nf4", group_size=64)
    bk = [b for b in ("amx", "avx512", "avx2") if mg.backend_supports(pw, b, n=16, table="bf16")]
    kinds = ", ".join(f"`{b}` {mg.plan_info(pw, n=16, table='bf16', backend=b)['bf16_kernel']}" for b in bk)
    tb = [b for b in ("auto", "avx512", "avx2") if mg.backend_supports(pw, b, n=16, table="i8")]
    pw.prepare(table="bf16")
    brows = []
    for n in ((2, 16) if args.quick else (2, 4, 6, 8, 12, 16, 32, 64)):
        xb = rng.standard_normal((k, n), dtype=np.float32)
        fns = {f"bf16 {b}": (lambda b=b: mg.msgemm(pw, xb, table="bf16", backend=b)) for b in bk}
        fns.update({f"i8 {b}": (lambda b=b: mg.msgemm(pw, xb, table="i8", backend=b)) for b in tb})
        tt = timeit_rounds(fns, repeat=max(3, rep // 6), rounds=3)
        info = mg.plan_info(pw, n=n)
        brows.append([n] + [fmt_ms(tt[c]) for c in fns]
                     + [f"{info['table']} ({info['bf16_kernel'] or info['backend']})"])
        print("bf16 kernels", brows[-1], flush=True)
    del pw
    lines.append(f"\n### The bf16 kernels by batch size: nf4 g64 {m}x{k}, {th} threads, warm\n")
    lines.append(_report.table(["N"] + [f"{c} ms" for c in fns] + ["default runs (kernel)"], brows))
    lines.append(f"\nKernels here: {kinds}. The defaults take `bf16` mode from N = 6 on AMX, from N = 8 on "
                 "AVX-512 (FMA, or AMD's `vdpbf16ps`) and from N = 16 on AVX2 and FMA. `i8 avx512` "
                 "and `i8 avx2` are what such CPUs run below their thresholds.")

    # --- the LLaMA shapes of spec section 9: int4 g128, N = 1 and 16 ---------------------------
    shrows = []
    shapes = [(11008, 4096), (4096, 11008), (14336, 4096)]
    for sm, sk in shapes[: 1 if args.quick else len(shapes)]:
        ws = rng.standard_normal((sm, sk), dtype=np.float32)
        pw = mg.quantize(ws, format="int4", group_size=128)
        wd = pw.dequantize(np.float32)
        del ws
        sess = ort_session(pw, 4, 4, th)
        for n in (1, 16):
            xs = rng.standard_normal(sk if n == 1 else (sk, n), dtype=np.float32)
            fns = {"ours": lambda: mg.msgemm(pw, xs, table="i8"), "i16": lambda: mg.msgemm(pw, xs, table="i16"),
                   "a0": lambda: wd @ xs}
            if sess is not None:
                fns["ort4"] = lambda: ort_run(sess, xs)
            tt = timeit_rounds(fns, repeat=max(3, rep // 3), number=2 if n == 1 else 1, rounds=4)
            t_ours, t_16, t_a0 = tt["ours"], tt["i16"], tt["a0"]
            ort_cell = (f"{fmt_ms(tt['ort4'])} ({tt['ort4']['min'] / t_ours['min']:.2f}x / "
                        f"{tt['ort4']['min'] / t_16['min']:.2f}x)" if sess is not None else "—")
            shrows.append([f"{sm} x {sk}", n, fmt_ms(t_ours), gbs(read_bytes(pw, table="i8"), t_ours), fmt_ms(t_16), fmt_ms(t_a0),
                           f"{t_a0['min'] / t_ours['min']:.1f}x", ort_cell])
            print("shapes", shrows[-1], flush=True)
        del wd, pw, sess
    lines.append(f"\n### int4 g128 on the LLaMA shapes (M x K), {th} threads, warm\n")
    lines.append(
        _report.table(["M x K", "N", "ours i8 ms", "ours i8 GB/s", "ours i16 ms", "A0 numpy ms", "ours i8 vs A0",
                       "ORT level 4 ms (ours faster by, i8 / i16)"], shrows)
    )

    # --- the same GEMVs on each kernel of this CPU, in each table precision ---------------------
    # What a machine with only AVX2 (most laptops and AVX2-only servers) runs: the AVX2 kernel at
    # the depth it implements, timed here in the same rounds as the AVX-512 one, the scalar one and
    # numpy. (Its memory system is this machine's, not that of an AVX2-only one.) `i16` is the
    # exact-integer mode (int8 activations, as ONNX Runtime's level 4), `f32` the float32-exact one.
    kernels = [b for b in maleki_rs._core.msgemm.available_backends() if b in ("avx512", "avx2")] + ["scalar"]
    krows = []
    cases = [("int4 g128", dict(format="int4", group_size=128), "i8"), ("int4 g128", dict(format="int4", group_size=128), "i16"),
             ("int4 g128", dict(format="int4", group_size=128), "f32"), ("int2 g64", dict(format="int2", group_size=64), "i8"),
             ("int2 g64", dict(format="int2", group_size=64), "i16"), ("ternary g128", dict(format="ternary", group_size=128), "i8"),
             ("nf4 g128", dict(format="nf4", group_size=128), "i8")]
    packed = {}
    for name, kw, table in cases[: 1 if args.quick else len(cases)]:
        if name not in packed:
            pw = mg.quantize(w, **kw)
            packed[name] = (pw, pw.dequantize(np.float32))
        pw, wd = packed[name]
        fns = {"a0": lambda wd=wd: wd @ x}
        for b in kernels:
            if mg.backend_supports(pw, b, table=table):
                fns[b] = lambda b=b, pw=pw, table=table: mg.msgemm(pw, x, backend=b, table=table)
        tt = timeit_rounds(fns, repeat=max(3, rep // 2), number=3, rounds=5)
        cells = []
        for b in ("avx512", "avx2", "scalar"):
            if b in tt:
                depth = mg.plan_info(pw, backend=b, table=table)["depth"]
                cells += [f"{fmt_ms(tt[b])} (depth {depth})", f"{tt['a0']['min'] / tt[b]['min']:.1f}x"]
            else:
                cells += ["—", "—"]
        krows.append([name, table, fmt_ms(tt["a0"]), *cells])
        print("kernels", krows[-1], flush=True)
    lines.append(f"\n### GEMV {m}x{k} by kernel and table precision, {th} threads, warm (`backend=`, `table=`)\n")
    lines.append(
        _report.table(["format", "table", "A0 numpy f32 ms", "avx512 ms", "avx512 vs A0", "avx2 ms", "avx2 vs A0",
                       "scalar ms", "scalar vs A0"], krows)
    )

    # --- summary against the goals of spec section 11 -----------------------------------------
    goal = []
    if "int4" in headline:
        goal.append(f"- int4 g128 GEMV: {headline['int4'] * 1e3:.3f} ms, {headline['a0'] / headline['int4']:.1f}x numpy A0 "
                    f"(goal >= 15x: <= {headline['a0'] / 15 * 1e3:.3f} ms in this run).")
    if "int4" in headline:
        # Both GEMVs read their weights once per call: at numpy's own read rate (a BLAS GEMV
        # streams at about the machine's bandwidth when its matrix exceeds the private caches),
        # ours could take no less than its bytes over that rate.
        a0_rate = m * k * 4 / headline["a0"]
        ours_rate = headline["int4 bytes"] / headline["int4"]
        floor = headline["int4 bytes"] / a0_rate
        goal.append(f"- bandwidth: ours reads {headline['int4 bytes'] / 2**20:.1f} MiB at {ours_rate / 1e9:.1f} GB/s, "
                    f"numpy 64 MiB at {a0_rate / 1e9:.1f} GB/s; at numpy's rate ours would take {floor * 1e3:.3f} ms "
                    f"({headline['a0'] / floor:.1f}x numpy), so 15x needs the packed weights read "
                    f"{15 * floor / headline['a0']:.2f}x faster than numpy reads its own (here "
                    f"{ours_rate / a0_rate:.2f}x: more than that where ours fit the last-level cache and "
                    f"numpy's do not).")
    if "int4 g128 ort4" in headline:
        o = min(headline["int4 g128 ort4"], headline.get("int4 g128 ort0", 1e9))
        goal.append(f"- vs ONNX Runtime's fastest int4 path: {o / headline['int4']:.2f}x (goal >= 1.5x).")
    if "int4 g128 a2" in headline and "int4" in headline:
        goal.append(f"- vs A2, our fused dequantize+FMA GEMV (what the tables are worth): "
                    f"{headline['int4 g128 a2'] / headline['int4']:.1f}x.")
    for n in (16, 64):
        if f"batch{n} ort4" in headline:
            o = headline[f"batch{n} ort4"]
            default = headline[f"batch{n} i16"] if dense else headline[f"batch{n} i8"]
            goal.append(f"- batch N = {n} vs ONNX Runtime level 4 (goal >= 1x): default "
                        f"{o / default:.2f}x ({'i16, dense int8' if dense else 'i8 tables'}); i8 tables "
                        f"{o / headline[f'batch{n} i8']:.2f}x, i16 {o / headline[f'batch{n} i16']:.2f}x.")
    if "batch a1 ratios" in headline:
        worst = min(headline["batch a1 ratios"], key=lambda t: t[2])
        goal.append(f"- batches N = 16 and 64 vs A1 (our dequantize-then-GEMM; goal >= 2x), every format above: "
                    f"at least {worst[2]:.2f}x ({worst[0]}, N = {worst[1]}).")
    if "int4 1 thread" in headline:
        goal.append(f"- one thread: int4 g128 GEMV {headline['int4 1 thread'] * 1e3:.3f} ms, "
                    f"{headline['int4 bytes'] / headline['int4 1 thread'] / 1e9:.1f} GB/s of weights per core "
                    f"(goal, T-MAC class: >= 25 GB/s per core).")
    if "int4 cold" in headline:
        goal.append(f"- cold: {headline['a0 cold'] / headline['int4 cold']:.1f}x numpy A0 cold (goal >= 5x).")
    body = [
        "Measured by `" + _report.command_line() + "` on " + _report.machine_info() + ".",
        f"numpy BLAS: {blas_info()}; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}.",
        f"Kernels available: {', '.join(maleki_rs._core.msgemm.available_backends())}. "
        "Times are min / median of the repeats; ours includes the table build.",
        "",
        *goal,
        "",
        *lines,
        *notes,
        "",
        "Notes: A1 is `pw.dequantize(np.float32) @ x` as a user would write it: a fresh 64 MiB float32 "
        "array per call (its page faults are most of the dequantize time; into an existing buffer with "
        "`out=` it takes 3-7 ms), then numpy's GEMM, which alone is A0. A2 (4-bit formats) decodes every weight in registers (a 16-entry float table of "
        "`s * (v[c] - z)` per row and group, one `vpermps` and one FMA per 16 weights, on AVX-512 "
        "with group sizes that are multiples of 32; a scalar loop otherwise) and so does "
        "everything but share the tables across rows; its table setup is float64, as `dequantize`. "
        "GB/s count the bytes a call reads: the codes in the layout its kernel reads (the dense path's: "
        "4 bits per code, 2 for the GEMVs of 2-bit formats, ternary included, whose packed codes "
        "hold 1.6), scales and zero points as the kernels read them "
        "(scales: float16 for fp4, whose MX scales are float16 values, and with `scale_dtype=np.float16`, "
        "float32 otherwise; uint4's integer zero points: float16), as the caches one call builds hold them. "
        "ORT MatMulNBits has no int4 zero points in value units, ternary, nf4 "
        "or fp4, hence the dashes. Ours runs what the default call runs (the `default runs` column, "
        "rel. L1 errors above); `table='f32'` is the "
        "exact-to-float32 mode. This 2-vCPU VM is shared with other jobs: ours and the anchors are timed "
        "in blocks, in 3-8 rounds; medians vary by up to 2x between runs (bursts of load from other "
        "tenants of the host); minima are the most stable figures.",
    ]
    _report.publish("msgemm", body, not args.no_write)


if __name__ == "__main__":
    main()
