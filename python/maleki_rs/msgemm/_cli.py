"""``maleki msgemm ...``: the counted reduction and the measured speed on this machine."""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .._util.validate import check_int
from ..cli import int_arg
from . import _api as mg


def _sig(x: float) -> str:
    """``x`` to 3 significant figures without an exponent (0.0123, 1.23, 123, 12345)."""
    decimals = max(0, 2 - math.floor(math.log10(abs(x)))) if x else 0
    return f"{x:.{decimals}f}"


def _bytes(n: float) -> str:
    # Decimal units, as the GB/s rates beside them.
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{_sig(n / size)} {unit}"
    return f"{n:.0f} B"


def _time(t: float) -> str:
    """Seconds as ms, or µs below a millisecond (3 significant figures, as ``_sig``)."""
    return f"{_sig(t * 1e3)} ms" if t >= 1e-3 else f"{_sig(t * 1e6)} us"


def _fewer(ratio: float) -> str:
    """``ratio`` = dense / msGeMM instructions, said the way round it is (0.4 -> "2.50x more")."""
    return f"{ratio:.2f}x fewer" if ratio >= 1 else f"{1 / ratio:.2f}x more"


def _times(fn: Callable[[], Any], repeat: int, warmup_s: float = 0.03) -> tuple[float, float]:
    """(min, median) seconds per call, after calls untimed for ``warmup_s`` seconds (at least
    one): on a VM the first calls after an idle pause run slow for any code while the cores
    and the library's worker wake up, which is not what a steady loop of calls sees."""
    t_end = time.perf_counter() + warmup_s
    fn()
    while time.perf_counter() < t_end:
        fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts), statistics.median(ts)


def _report_counts(m: int, k: int, n: int, fmt: str, depth: int, g: int | None, zero_points: bool,
                   mirror: bool, out: Callable[[str], None], ran: str | None = None) -> None:
    """One line: the operation counts of the table method (closed form) against the dense
    GEMM's. ``ran``: what the timed call ran instead of tables, if it did."""
    c = mg.op_counts(m, k, n, format=fmt, depth=depth, group_size=g, zero_points=zero_points, mirror=mirror)
    if c["depth"] == 1:
        # d = 1: one lookup-add per multiply-add, no table adds (the ratio is 1 by construction).
        gain = "at depth 1 the tables do not reduce the work" + (" (fp8: 256 levels allow no deeper tables)"
                                                                  if fmt.startswith("fp8") else "")
    else:
        gain = f"{_fewer(c['mac_ratio'])} instructions (all arithmetic: {_fewer(c['op_ratio'])})"
    out(f"  table method's count ({fmt}, M={m}, K={k}, N={n}, d={c['depth']}{', mirror' if mirror else ''}): "
        f"dense {c['dense_mul']:,} multiply-adds vs msGeMM {c['table_add']:,} table adds + "
        f"{c['lookup']:,} lookup-adds -> {gain}" + (f"; the run below used {ran}, not tables" if ran else ""))


def read_bytes(pw: mg.PackedWeights, x: np.ndarray | None = None, **call: Any) -> int:
    """Bytes a call ``msgemm(pw, x, **call)`` (``x`` None: a GEMV) reads from the weights: the
    layout its kernel reads and the scales and zero points in the form it reads them, i.e. what
    the caches that the call builds on a fresh copy hold (``cache_nbytes``). That is not always
    the packed size: the dense path reads ternary at 2 bits per code (packed: 1.6) and int3 at
    4 (packed: 3); scales are read as float16 when every one is a float16 value, zero points as
    ``z - shift``. Where a call builds no cache (kernels reading the packed codes): the packed
    codes, the scales and zero points at that precision; the fp8 path: the packed codes and
    float32 scales (it caches only which codes occur). Clears ``pw``'s caches, then runs the
    call once. (``benches/msgemm_bench.py`` counts its GB/s with it too.)"""
    x = np.zeros(pw.shape[1], np.float32) if x is None else x
    n = 1 if x.ndim == 1 else x.shape[1]
    opts = {key: v for key, v in call.items() if key in ("depth", "table", "backend", "mirror")}
    if mg.plan_info(pw, n=n, **opts)["fp8_kernel"]:
        return pw.packed.nbytes + 4 * pw.scales.size
    pw.clear_cache()
    mg.msgemm(pw, x, **call)
    if pw.cache_nbytes:
        return pw.cache_nbytes
    per_scale = 2 if pw.scale_dtype == np.float16 else 4
    z = pw.zeros
    per_zero = 2 if z is not None and np.array_equal(z.astype(np.float16).astype(np.float32), z) else 4
    return pw.packed.nbytes + per_scale * pw.scales.size + (0 if z is None else per_zero * z.size)


def bench(m: int = 4096, k: int = 4096, n: int = 1, fmt: str = "int4", group_size: int | None = 128,
          table: str | None = None, depth: int | str = "auto", repeat: int = 20, count_limit: int = 1 << 26,
          out: Callable[[str], None] = print, seed: int = 0, scale_dtype: str = "float32") -> dict[str, Any]:
    """Counts and times one shape; prints a short report. Returns the figures.

    ``table=None`` and ``depth="auto"`` time what :func:`maleki_rs.msgemm.msgemm` runs by
    default (``i8`` tables, or the dense ``i16`` path or ``bf16`` mode where they run: batches,
    and on AMD CPUs with AVX-512 VNNI the GEMVs; fp8 weights: the fp8 path's ``f32`` sums).
    """
    repeat = check_int(repeat, "repeat", min=1)  # timings are the min and median of these
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((m, k), dtype=np.float32)
    pw = mg.quantize(w, fmt, group_size, scale_dtype=scale_dtype)
    x = rng.standard_normal((k,) if n == 1 else (k, n), dtype=np.float32)
    info = mg.plan_info(pw, n=n, depth=depth, table=table)
    d = int(info["depth"])
    pw.prepare(d, table=info["table"])
    cd = d  # the depth the table method is counted at
    ran = None  # what runs instead of tables, if something does
    if info["dense_int8"]:
        # No tables run (the plan's depth is moot): count the table method at its i8 depth.
        cd = int(mg.plan_info(pw, n=n, depth=depth, table="i8")["depth"])
        ran = ("the dense int8 path", "int8 dot products")
    elif info["fp8_kernel"]:
        ran = ("the fp8 path", "codes decoded in registers, float32 sums")
    elif info["dense_bf16"]:
        cd = int(mg.plan_info(pw, n=n, depth=depth, table="i8")["depth"])
        ran = ("bf16 mode", "bfloat16 dot products")
    if ran is None:
        how = f" (depth={d}{', half tables' if info['folded_indices'] else ''})"
    else:
        how = f": {ran[0]} ({ran[1]}, no tables)"
    out(f"msgemm {fmt} g{pw.group_size} ({m} x {k}) @ ({k} x {n}), table={info['table']}, "
        f"kernel={info['backend']}{how}, {pw.bits_per_weight:g} bits/weight, packed {_bytes(pw.nbytes)}"
        f"{', float16 scales' if pw.scale_dtype == np.float16 else ''}")
    # 1. the counted reduction (the instrumented kernel, when the shape is small enough)
    zero_points = pw.zeros is not None
    _report_counts(m, k, n, fmt, cd, pw.group_size, zero_points, False, out, ran and ran[0])
    counted = None
    if m * k * n <= count_limit:
        _, counted = mg.msgemm(pw, x, depth=cd, count=True)
        model = mg.op_counts(m, k, n, format=fmt, depth=cd, group_size=pw.group_size, zero_points=zero_points)
        same = all(counted[key] == model[key] for key in ("table_mul", "table_add", "lookup", "add", "mul"))
        gain = "no fewer" if cd == 1 else _fewer(counted["mac_ratio"])
        out(f"  counted by the instrumented kernel (tables, d={cd}): {counted['table_add']:,} table adds, "
            f"{counted['lookup']:,} lookups, {counted['mul']:,} multiplies -> {gain} "
            f"({'equals' if same else 'DIFFERS FROM'} the closed form)")
    # 2. the measured speed
    wd = pw.dequantize(np.float32)
    ours = _times(lambda: mg.msgemm(pw, x, depth=depth, table=table), repeat)
    dense = _times(lambda: wd @ x, repeat)
    deq = _times(lambda: pw.dequantize(np.float32) @ x, max(3, repeat // 5))
    ref = wd.astype(np.float64) @ x
    y = mg.msgemm(pw, x, depth=depth, table=table)
    rel = float(np.abs(y - ref).sum() / max(np.abs(ref).sum(), 1e-300))
    nread = read_bytes(pw, x, depth=depth, table=table)  # rebuilds the caches once (timings done)
    gbs = nread / ours[0] / 1e9
    out(f"  msgemm               {_time(ours[0]):>9} (median {_time(ours[1])}), {gbs:6.2f} GB/s of the "
        f"{_bytes(nread)} of weights it reads (codes, scales, zero points as read)")
    out(f"  rel. L1 error {rel:.1e} against the float64 product of the dequantized weights (float32 values)")
    out(f"  numpy fp32 W @ x     {_time(dense[0]):>9} (weights pre-dequantized: {_bytes(wd.nbytes)})"
        f"  -> msgemm {dense[0] / ours[0]:.2f}x")
    out(f"  dequantize + numpy   {_time(deq[0]):>9}  -> msgemm {deq[0] / ours[0]:.2f}x")
    # Both read their weights once per call. At numpy's read rate (about the machine's
    # bandwidth once the float32 matrix exceeds the private caches) the weights msgemm reads
    # take this long. It is an estimate from numpy's own timing, which includes its arithmetic
    # and its noise, and small weights stay in a cache: not a bound the measured msgemm obeys.
    numpy_rate = wd.nbytes / dense[0]
    floor = nread / numpy_rate
    out(f"  at numpy's read rate {_time(floor):>9}: msgemm's {_bytes(nread)} at the {numpy_rate / 1e9:.1f} GB/s "
        f"numpy read its {_bytes(wd.nbytes)} at (an estimate, not a bound)")
    return {"msgemm_s": ours[0], "numpy_s": dense[0], "dequant_numpy_s": deq[0], "rel_l1": rel,
            "read_floor_s": floor, "packed_bytes": pw.nbytes, "read_bytes": nread, "counted": counted, "depth": d, "kernel": info["backend"]}


def gguf_bench(path: str, *, names: list[str] | None = None, n: int = 1, repeat: int = 10,
               max_tensors: int | None = None, out: Callable[[str], None] = print, seed: int = 0) -> list[dict[str, Any]]:
    """Times ``msgemm`` on the tensors of a llama.cpp GGUF file against numpy on the same
    weights dequantized beforehand, and checks each product against ``gguf``'s own
    dequantization (the ``gguf`` package reads the file). One line per tensor; returns the
    figures. ``names``: substrings, a tensor is taken when its name holds one of them;
    3-D (experts) tensors are timed on their first expert; types ``from_gguf`` does not load
    are counted and listed, and a tensor it refuses (a malformed block) is named with the
    reason and skipped. Memory: about twice the float32 weights of the largest tensor timed
    (numpy's copy and the loaded one); ``names`` leaves out large ones such as embeddings.
    ``names`` that match no tensor raise ``ValueError`` (the command exits with status 2).
    """
    try:
        import gguf
    except ImportError:
        raise ValueError("maleki msgemm gguf reads the file with the gguf package: pip install gguf") from None
    from ._gguf import SUPPORTED

    n = check_int(n, "n", min=1)
    repeat = check_int(repeat, "repeat", min=1)
    try:
        reader = gguf.GGUFReader(path)
    except OSError:
        raise  # the file's own error (missing, unreadable), named by the command line
    except Exception as exc:  # whatever gguf raises for a file it cannot parse
        from importlib.metadata import version

        raise ValueError(f"{path}: not a GGUF file that gguf {version('gguf')} reads ({type(exc).__name__}: {exc}; "
                         "a tensor type newer than the package needs pip install -U gguf)") from exc
    rng = np.random.default_rng(seed)
    skipped: dict[str, int] = {}
    rows: list[dict[str, Any]] = []
    out(f"{path}: {len(reader.tensors)} tensors; msgemm against numpy float32 on weights dequantized beforehand, "
        f"N = {n}, min of {repeat} calls; rel. L1 error against the float64 product of gguf's dequantized weights")
    chosen = [t for t in reader.tensors if not names or any(s in t.name for s in names)]
    if names and not chosen:
        some = ", ".join(t.name for t in reader.tensors[:5]) + (", ..." if len(reader.tensors) > 5 else "")
        raise ValueError(f"names (--tensor): no tensor of {path} has a name holding {' or '.join(map(repr, names))} "
                         f"(its {len(reader.tensors)} tensors: {some or 'none'})")

    def label(t: Any) -> str:
        return t.name + (f" (expert 0 of {t.data.shape[0]})" if t.data.ndim == 3 else "")

    width = max((len(label(t)) for t in chosen), default=0)
    for t in chosen:
        if max_tensors is not None and len(rows) >= max_tensors:
            break
        qtype = gguf.GGMLQuantizationType(int(t.tensor_type))
        data = t.data
        if qtype.name not in SUPPORTED or data.ndim not in (2, 3):
            skipped[qtype.name] = skipped.get(qtype.name, 0) + 1
            continue
        data = data[0] if data.ndim == 3 else data
        t0 = time.perf_counter()
        try:
            pw = mg.PackedWeights.from_gguf(data, int(qtype))
        except ValueError as exc:  # a block it refuses: say which tensor, go on
            out(f"  {label(t):<{width}} {qtype.name:<6} not loaded: {exc}")
            continue
        load = time.perf_counter() - t0
        m, k = pw.shape
        x = rng.standard_normal((k,) if n == 1 else (k, n), dtype=np.float32)
        # gguf's dequantization and the float64 reference, in row chunks (bounded memory).
        wd = np.empty((m, k), np.float32)
        ref = np.empty((m,) + x.shape[1:], np.float64)
        step = max(1, (1 << 22) // k)
        for r in range(0, m, step):
            wd[r:r + step] = np.asarray(gguf.quants.dequantize(data[r:r + step], qtype)).reshape(-1, k)
            ref[r:r + step] = wd[r:r + step].astype(np.float64) @ x
        y = mg.msgemm(pw, x)
        rel = float(np.abs(y - ref).sum() / max(np.abs(ref).sum(), 1e-300))
        ours = _times(lambda: mg.msgemm(pw, x), repeat)
        dense = _times(lambda: wd @ x, repeat)
        kind = f"{pw.format} g{pw.group_size}{'+z' if pw.zeros is not None else ''}"
        rows.append({"name": t.name, "type": qtype.name, "shape": (m, k), "format": kind, "load_s": load,
                     "msgemm_s": ours[0], "numpy_s": dense[0], "rel_l1": rel})
        out(f"  {label(t):<{width}} {qtype.name:<6} {m:>6} x {k:<6} as {kind:<16} load {_time(load):>8}  "
            f"msgemm {_time(ours[0]):>8}  numpy {_time(dense[0]):>8}  {dense[0] / ours[0]:5.2f}x  "
            f"rel. L1 error {rel:.1e}")
    if rows:
        tm, tn = sum(r["msgemm_s"] for r in rows), sum(r["numpy_s"] for r in rows)
        out(f"  {len(rows)} tensor{'s' if len(rows) > 1 else ''} one after another: msgemm {_time(tm)}, numpy {_time(tn)} -> {tn / tm:.2f}x")
    else:
        out("  no tensor timed" + (" (no tensor matching --tensor is of a type msgemm loads)" if names else ""))
    if skipped:
        out("  not loaded (types msgemm has no format for, or not matrices): "
            + ", ".join(f"{v} {key}" for key, v in sorted(skipped.items())))
    return rows


def _depth(text: str) -> int | str:
    # The largest depth depends on the format (the library names it).
    return "auto" if text == "auto" else int_arg(1)(text)


def _group_size(text: str) -> int | None:
    """None (per channel) for -1, else a group size >= 1."""
    return None if text.strip() == "-1" else int_arg(1)(text)


def _bench_cmd(args: argparse.Namespace) -> int:
    bench(args.m, args.k, args.n, args.format, args.group_size, args.table, args.depth, args.repeat,
          scale_dtype=args.scale_dtype)
    return 0


def _gguf_cmd(args: argparse.Namespace) -> int:
    gguf_bench(args.file, names=args.tensor, n=args.n, repeat=args.repeat, max_tensors=args.max_tensors)
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("msgemm", help="low-bit GEMM through look-up tables (msGeMM)",
                              description="msGeMM, low-bit GEMM through look-up tables: the counted reduction "
                                          "and the measured speed against numpy (bench), or on a GGUF file's "
                                          "tensors (gguf).")
    sub = p.add_subparsers(dest="msgemm_command", metavar="COMMAND")
    b = sub.add_parser("bench", help="counted reduction and measured speed against numpy for one shape")
    b.add_argument("--m", type=int_arg(1), default=4096, help="output features M (default 4096)")
    b.add_argument("--k", type=int_arg(1), default=4096, help="input features K (default 4096)")
    b.add_argument("--n", type=int_arg(1), default=1, help="columns of X (default 1: GEMV)")
    b.add_argument("--format", default="int4", choices=[f for f in mg.FORMATS if f != "codebook"],
                   help="weight format (default int4)")
    b.add_argument("--group-size", type=_group_size, default=128,
                   help="inputs per scale, dividing K (default 128; -1: per channel)")
    b.add_argument("--table", default=None, choices=mg.TABLES,
                   help="table precision (default: the library's, i8 or, for batches on the dense paths, i16 or bf16)")
    b.add_argument("--depth", type=_depth, default="auto",
                   help="inputs per table: 'auto' (default) or an integer from 1 to the format's maximum")
    b.add_argument("--repeat", type=int_arg(1), default=20, help="timed calls per kernel (default 20; min and median)")
    b.add_argument("--scale-dtype", default="float32", choices=["float32", "float16"],
                   help="precision of the quantized scales (float16: as GPTQ/AWQ checkpoints)")
    b.set_defaults(func=_bench_cmd)
    g = sub.add_parser("gguf", help="msgemm on the tensors of a llama.cpp GGUF file against numpy (needs gguf)")
    g.add_argument("file", help="a .gguf file")
    g.add_argument("--tensor", action="append", metavar="SUBSTRING",
                   help="only tensors whose name holds this (repeatable; default: every tensor msgemm loads; "
                        "each takes about twice its float32 size in memory)")
    g.add_argument("--n", type=int_arg(1), default=1, help="columns of X (default 1: GEMV)")
    g.add_argument("--repeat", type=int_arg(1), default=10, help="timed calls per tensor (default 10; the min)")
    g.add_argument("--max-tensors", type=int_arg(1), default=None, help="stop after this many tensors")
    g.set_defaults(func=_gguf_cmd)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def tour() -> None:
    """The paper's claim counted, and the speed of the GEMV on this machine (a few seconds)."""
    print("The paper's setting, int4 weights (V=16) at depth 3, counted in closed form:")
    for m in (4096, 12288, 28672):
        _report_counts(m, 4608, 1, "int4", 3, None, False, False, print)
    _report_counts(12288, 4608, 1, "int4", 3, None, False, True, print)
    print("Lower bit widths gain more (ternary, depth 5):")
    _report_counts(4096, 4096, 1, "ternary", 5, None, False, False, print)
    print()
    bench(4096, 4096, 1, "int4", 128, None, "auto", repeat=10, count_limit=1 << 24)
