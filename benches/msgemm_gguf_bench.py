"""llama.cpp's block formats through ``PackedWeights.from_gguf``, against numpy, in one run.

Writes section "msgemm-gguf" of BENCHMARKS.md. For each ggml type we load: random blocks of a
4096 x 4096 tensor (``maleki_rs.msgemm._gguf.random_blocks``: the speed does not depend on the
values), the load time, and ``msgemm(pw, x)`` with the defaults for N = 1, 16 and 64 against
numpy float32 on the weights dequantized beforehand (A0, numpy's best case; a Python user
without llama.cpp would call ``gguf.quants.dequantize`` and then numpy). Our own int4 g128
(``quantize``) is timed in the same rounds for reference. Bits per weight: ggml's storage, and
the bytes a GEMV of ours reads (codes, and scales and zero points at the precision the kernels
read them in). llama.cpp itself is not an anchor here: it is not installable from a wheel.

Usage: ``python benches/msgemm_gguf_bench.py [--quick] [--threads 2] [--no-write]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _report  # noqa: E402
from msgemm_bench import fmt_ms, limit_blas, read_bytes, timeit_rounds  # noqa: E402

import maleki_rs  # noqa: E402
from maleki_rs import msgemm as mg  # noqa: E402
from maleki_rs.msgemm._gguf import SUPPORTED, random_blocks  # noqa: E402


NS = (1, 16, 64)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="three types, fewer repeats (smoke run)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = ap.parse_args()
    th = args.threads
    maleki_rs.set_num_threads(th)
    _limits = limit_blas(th)
    rng = np.random.default_rng(0)
    m = k = 4096
    names = ["Q4_0", "Q4_K", "TQ2_0"] if args.quick else list(SUPPORTED)
    rep = 5 if args.quick else 20

    pws: dict[str, mg.PackedWeights] = {}
    rows_meta = {}
    for name in names:
        data = random_blocks(name, m, k, rng)
        t0 = time.perf_counter()
        pws[name] = mg.PackedWeights.from_gguf(data, name)
        rows_meta[name] = (data.nbytes, time.perf_counter() - t0)
    native = "int4 g128 (quantize)"
    pws[native] = mg.quantize(rng.standard_normal((m, k), dtype=np.float32), format="int4", group_size=128)
    wd = pws["Q4_0" if "Q4_0" in pws else names[0]].dequantize(np.float32)

    results = {}
    for n in NS:
        x = rng.standard_normal(k if n == 1 else (k, n), dtype=np.float32)
        fns = {name: (lambda p=p, x=x: mg.msgemm(p, x)) for name, p in pws.items()}
        fns["a0"] = lambda x=x: wd @ x
        results[n] = timeit_rounds(fns, repeat=rep, number=3 if n == 1 else 1, rounds=4)
        print(f"N={n}", {key: fmt_ms(v) for key, v in results[n].items()}, flush=True)

    rows = []
    for name, pw in pws.items():
        fmt = f"{pw.format} g{pw.group_size}" + (" + zero points" if pw.zeros is not None else "")
        ggml_bits, load = ("—", "—")
        if name in rows_meta:
            ggml_bits = f"{rows_meta[name][0] * 8 / (m * k):.2f}"
            load = f"{rows_meta[name][1] * 1e3:.0f}"
        t1 = results[1][name]
        rb = read_bytes(pw)
        row = [name, fmt, ggml_bits, f"{rb * 8 / (m * k):.2f}", load, fmt_ms(t1), f"{rb / t1['min'] / 1e9:.1f}",
               f"{results[1]['a0']['min'] / t1['min']:.1f}x"]
        for n in NS[1:]:
            t = results[n][name]
            row += [f"{fmt_ms(t)} ({mg.plan_info(pw, n=n)['table']})", f"{results[n]['a0']['min'] / t['min']:.1f}x"]
        rows.append(row)

    # --- small groups in batches: the dense i16 path against bf16 mode (the AMX default's switch)
    grows = []
    w = rng.standard_normal((m, k), dtype=np.float32)
    small = {f"{f} g{g}": mg.quantize(w, f, group_size=g) for f, g in
             ([("int4", 32), ("fp4", 32)] if args.quick else
              [("int4", 32), ("uint4", 32), ("fp4", 32), ("uint2", 16), ("int3", 16), ("fp4", 16)])}
    wd_small = small["int4 g32"].dequantize(np.float32)
    for n in (8, 32) if args.quick else (8, 16, 32, 64):
        x = rng.standard_normal((k, n), dtype=np.float32)
        fns = {"a0": lambda x=x: wd_small @ x}
        for name, p in small.items():
            for table in ("i16", "bf16"):
                if mg.backend_supports(p, "auto", n=n, table=table):
                    fns[f"{name} {table}"] = lambda p=p, x=x, table=table: mg.msgemm(p, x, table=table)
        tt = timeit_rounds(fns, repeat=max(3, rep // 4), rounds=3)
        for name, p in small.items():
            a, b = tt.get(f"{name} i16"), tt.get(f"{name} bf16")
            if a is None or b is None:
                continue
            grows.append([name, n, fmt_ms(a), fmt_ms(b), f"{b['min'] / a['min']:.2f}x", mg.plan_info(p, n=n)["table"],
                          f"{tt['a0']['min'] / min(a['min'], b['min']):.1f}x"])
        print("small groups", n, {key: fmt_ms(v) for key, v in tt.items()}, flush=True)

    body = [
        "## msgemm: llama.cpp (GGUF) tensors",
        "",
        f"Command: `{_report.command_line()}`",
        f"Machine: {_report.machine_info()}",
        f"Threads: {th}. Shape 4096 x 4096, warm (the same weights repeatedly), tables included; "
        "times are min / median of 4 rounds in blocks (see the msgemm section), ms per call.",
        "",
        "A0 numpy float32 on pre-dequantized weights: "
        + ", ".join(f"N = {n} {fmt_ms(results[n]['a0'])} ms" for n in NS) + ".",
        "",
        _report.table(["ggml type", "loaded as", "ggml bits/weight", "bits/weight read", "load ms",
                       "N = 1 ms", "N = 1 GB/s", "N = 1 vs A0"]
                      + [h for n in NS[1:] for h in (f"N = {n} ms (table)", f"N = {n} vs A0")], rows),
        "",
        "Bits/weight read: what a GEMV's kernel reads (its layout, scales and zero points). The K-quants'"
        " two-level scales (a float16 per 256 weights times 4-, 6- or 8-bit integers per 16 or 32) are "
        "exact in float32 but not float16, and their minimums become float32 zero points: Q4_K reads 6 "
        "bits per weight where ggml stores 4.5, Q2_K 6 where ggml stores 2.6. The dense GEMVs read 3-bit "
        "codes at 4 bits (Q3_K: 6), ternary at 2 (TQ1_0 stores 1.6), and the 5-, 6- and 8-bit types at "
        "one byte per weight (Q6_K: 10 bits where ggml stores 6.6; Q8_0 what it stores). The single-level"
        " types (Q4_0, IQ4_NL, TQ2_0, MXFP4, Q8_0) keep float16 or power-of-two scales and read about "
        "what ggml stores. Load times are numpy decoding in Python, once per tensor.",
        "",
        f"### Small groups in batches: the dense `i16` path against `bf16` mode, {m}x{k}, {th} threads",
        "",
        _report.table(["weights", "N", "i16 ms", "bf16 ms", "bf16 / i16 (min)", "default runs", "faster of the two vs A0"], grows),
        "",
        "The dense path scales the integer sums of every group of every 16 rows by 16 columns in float32; "
        "for groups of 16 or 32 inputs that epilogue dominates, while `bf16` mode scales the weights as it "
        "decodes them. On CPUs with AMX-BF16 the default therefore takes `bf16` for groups of at most 16 "
        "inputs from N = 8 and of at most 32 from N = 32 (`bf16::dense_to_bf16_min_n`; on AMD CPUs with "
        "AVX-512 BF16 groups of at most 16 from N = 24 and of at most 32 from N = 48 (Zen 4: of at most 16 from N = 32); on other AVX-512 or "
        "AVX2 CPUs groups of at most 16 from N = 32). A0 is numpy on the int4 g32 weights dequantized "
        "beforehand, in the same rounds.",
    ]
    _report.publish("msgemm-gguf", body, not args.no_write)


if __name__ == "__main__":
    main()
