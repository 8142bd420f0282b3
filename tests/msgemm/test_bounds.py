"""Oracle 2 (spec section 8.2): error bounds of the three table precisions on random data.

- ``f32``: elementwise ``2 (K/d + d + 3) u (|s v'| @ |x|) + 2 (G + K/G + 3) u (|s z'| @ |x|)``
  (u = 2^-24; without zero points this is the spec's ``2 (K/d + d + 3) u (|Wd| @ |x|)``).
- ``i8``: ``sum_g |s| * t[n, g] * sum_p m_p / 2`` (table rounding: tuple ``p`` is rounded on a
  grid of ``m_p * t``) plus the f32 bound, with the per-tuple multipliers ``m_p`` and the scale
  ``t`` replicated here in float32 (the scheme of ``table::i8_scaling``).
- ``i16``: replicated exactly: int8 activations, integer tables, an int64 reference of the
  partial sums, and the float32 epilogue evaluated in numpy must give the same bits.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maleki_rs import msgemm as mg

from .conftest import BACKENDS, bf16_kernels, cpu_flags, cpu_has, dense_gemv_default, dense_to_bf16_min_n

U = 2.0**-24


def _parts(pw: mg.PackedWeights, mirror: bool):
    """``(|s v'|, |s z'|, v' codebook, z' per (m, g))`` in float64, original input order."""
    m, k = pw.shape
    g = pw.group_size
    shift = pw.mirror[1] if mirror else 0.0
    cb = np.nan_to_num(pw.codebook.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0) - shift
    codes = pw.codes
    s = np.repeat(pw.scales.astype(np.float64), g, axis=1)
    z = (np.zeros((m, k // g)) if pw.zeros is None else pw.zeros.astype(np.float64)) - shift
    sv = np.abs(s * cb[codes])
    sz = np.abs(s * np.repeat(z, g, axis=1))
    if pw.k_perm is not None:
        inv = np.argsort(pw.k_perm)
        sv, sz = sv[:, inv], sz[:, inv]
    return sv, sz, cb, z


def _f32_bound(pw, x, depth, mirror):
    m, k = pw.shape
    g = pw.group_size
    sv, sz, _, _ = _parts(pw, mirror)
    ax = np.abs(x.astype(np.float64))
    return 2 * (k / depth + depth + 3) * U * (sv @ ax) + 2 * (g + k / g + 3) * U * (sz @ ax)


@pytest.mark.parametrize("fmt", ["int4", "uint4", "nf4", "fp4", "int3", "int2", "ternary", "fp8_e4m3"])
def test_f32_tables_within_the_elementwise_bound(fmt):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((150, 512))
    pw = mg.quantize(w, fmt, 128)
    x = rng.standard_normal((512, 4)).astype(np.float32)
    ref = pw.dequantize() @ x.astype(np.float64)
    for depth in sorted({1, pw.natural_depth}):
        for mirror in ([False, True] if pw.mirror is not None else [False]):
            bound = _f32_bound(pw, x, depth, mirror)
            for backend in BACKENDS:
                if not mg.backend_supports(pw, backend, n=4, depth=depth, table="f32", mirror=mirror):
                    continue
                y = mg.msgemm(pw, x, depth=depth, table="f32", backend=backend, mirror=mirror)
                err = np.abs(y - ref)
                assert (err <= bound).all(), (fmt, depth, mirror, backend, (err / bound).max())


def _ceil_127(v):
    """Smallest integer m >= 1 with 127 m >= v (float32 v), as in the Rust scaling."""
    f32 = np.float32
    m = np.maximum(np.ceil(v / f32(127)), f32(1)).astype(f32)
    down = (m > 1) & (f32(127) * (m - 1) >= v)
    up = ~down & (f32(127) * m < v)
    return (m - down + up).astype(np.int64)


def _i8_scaling(cb_used, xg, depth):
    """``(t, m_p)`` of one (column, group): per-tuple ``max|T|`` in closed form over the codes
    present (float32, left to right), then the largest ``M`` keeping ``sum m_p <= 258`` in
    every chunk of 64 tuples."""
    f32 = np.float32
    vmax, vmin = f32(cb_used.max()), f32(cb_used.min())
    g = xg.size
    amax = []
    for t0 in range(0, g, depth):
        hi = lo = None
        for x in xg[t0:t0 + depth].astype(f32):
            pmax, pmin = (vmax * x, vmin * x) if x >= 0 else (vmin * x, vmax * x)
            hi, lo = (pmax, pmin) if hi is None else (f32(hi + pmax), f32(lo + pmin))
        amax.append(max(abs(hi), abs(lo)))
    return _scaling_from_amax(np.array(amax, dtype=f32))


@pytest.mark.parametrize("fmt, depth, mirror", [("int4", 2, False), ("int4", 2, True), ("uint4", 2, False),
                                                ("nf4", 2, False), ("fp4", 2, False), ("int2", 4, False),
                                                ("ternary", 5, False), ("int4", 3, False)])
def test_i8_tables_within_the_deterministic_bound(fmt, depth, mirror):
    rng = np.random.default_rng(5)
    k, g = 256, 64
    w = rng.standard_normal((96, k))
    pw = mg.quantize(w, fmt, g)
    x = rng.standard_normal((k, 3)).astype(np.float32)
    ref = pw.dequantize() @ x.astype(np.float64)
    # The tables' codebook: the mirror's shift, or for zero points the centring shift.
    shift = pw.mirror[1] if (mirror or (pw.zeros is not None and pw.mirror is not None)) else 0.0
    cb = np.nan_to_num(pw.codebook.astype(np.float32), nan=0.0) - np.float32(shift)
    if mirror:
        # Mirrored tables: the stored half holds one entry of every mirror pair, so the same
        # largest magnitude as the whole table; scaled over every code.
        cb_used = cb
    else:
        cb_used = cb[np.unique(pw.codes)]
    xp = x.astype(np.float32)
    s = np.abs(pw.scales.astype(np.float64))  # (M, groups)
    tab_bound = np.zeros((96, 3))
    for gi in range(k // g):
        for n in range(3):
            xg = xp[gi * g:(gi + 1) * g, n]
            if mirror:
                # halves of the mirrored codebook for the last digit of every tuple
                t, m = _i8_scaling_mirror(cb, xg, depth)
            else:
                t, m = _i8_scaling(cb_used, xg, depth)
            tab_bound[:, n] += s[:, gi] * t * m.sum() / 2
    bound = tab_bound * 1.001 + _f32_bound(pw, x, depth, mirror) + 1e-30
    for backend in BACKENDS:
        if backend == "reference" or not mg.backend_supports(pw, backend, n=3, depth=depth, table="i8", mirror=mirror):
            continue
        y = mg.msgemm(pw, x, depth=depth, table="i8", backend=backend, mirror=mirror)
        err = np.abs(y - ref)
        assert (err <= bound).all(), (backend, (err / bound).max())
        # and the bound is not vacuous: the error is a visible fraction of it
        assert err.max() > 0.01 * bound.max()


def _i8_scaling_mirror(cb, xg, depth):
    """As :func:`_i8_scaling` for mirrored tables: the stored prefix holds one entry of every
    mirror pair (``|T[mirror(i)]| = |T[i]|``), so its largest magnitude is the whole table's;
    modelled with the last digit of each tuple over the lower half of the (shifted, symmetric)
    codebook, which holds one of every pair as well."""
    half = cb[: -(-cb.size // 2)]
    f32 = np.float32
    g = xg.size
    amax = []
    for t0 in range(0, g, depth):
        xs = xg[t0:t0 + depth].astype(f32)
        hi = lo = None
        for j, x in enumerate(xs):
            c = half if j == xs.size - 1 else cb
            vmax, vmin = f32(c.max()), f32(c.min())
            pmax, pmin = (vmax * x, vmin * x) if x >= 0 else (vmin * x, vmax * x)
            hi, lo = (pmax, pmin) if hi is None else (f32(hi + pmax), f32(lo + pmin))
        amax.append(max(abs(hi), abs(lo)))
    return _scaling_from_amax(np.array(amax, dtype=f32))


def _scaling_from_amax(amax):
    """``(t, m_p)`` from the per-tuple maxima (``table::i8_scaling``)."""
    f32 = np.float32
    a = amax.max()
    if a == 0:
        return 0.0, np.ones(amax.size, np.int64)
    q = (amax * (f32(127) / a)).astype(f32)

    def mults(mm):
        return _ceil_127((q * f32(mm)).astype(f32))

    lo_m, hi_m = 1, 128
    while hi_m - lo_m > 1:
        mid = (lo_m + hi_m) // 2
        m = mults(mid)
        ok = all(m[i:i + 64].sum() <= 258 for i in range(0, m.size, 64))
        lo_m, hi_m = (mid, hi_m) if ok else (lo_m, mid)
    return float(a / (f32(127) * f32(lo_m))), mults(lo_m)


def _i16_replica(pw: mg.PackedWeights, x: np.ndarray, mirror: bool) -> np.ndarray:
    """The i16 mode computed independently: numpy int64 partial sums, float32 epilogue."""
    f32 = np.float32
    m, k = pw.shape
    g = pw.group_size
    groups = k // g
    _, _, cb, zeff = _parts(pw, mirror)
    e = 0
    while not np.all(cb * 2.0**e == np.round(cb * 2.0**e)):
        e += 1
    cb_int = np.round(cb * 2.0**e).astype(np.int64)
    codes = pw.codes.astype(np.int64)
    xs = x if pw.k_perm is None else x[pw.k_perm.astype(np.int64)]
    n = xs.shape[1]
    zero_term = pw.zeros is not None or (mirror and pw.mirror[1] != 0)
    # Two K slices (the driver's `k_slices`): groups [0, h) and [h, groups), each accumulated
    # from zero, then added.
    h = -(-groups // 2)
    ys = [np.zeros((m, n), dtype=f32), np.zeros((m, n), dtype=f32)]
    for gi in range(groups):
        xg = xs[gi * g:(gi + 1) * g].astype(f32)  # (G, N)
        maxabs = np.abs(xg).max(axis=0)
        with np.errstate(divide="ignore"):
            rcp = np.where(maxabs > 0, f32(127) / maxabs, f32(0)).astype(f32)
        xq = np.clip(np.rint(xg * rcp), -127, 127).astype(np.int64)
        a = (maxabs / f32(127)).astype(f32)
        p_int = cb_int[codes[:, gi * g:(gi + 1) * g]] @ xq  # (M, N) exact int64
        assert np.abs(p_int).max() < 2**24
        tscale = (a / f32(2.0**e)).astype(f32)
        u = p_int.astype(f32)
        if zero_term:
            zsum = (xq.sum(axis=0).astype(f32) * f32(2.0**e)).astype(f32)
            u = (u - (zeff[:, gi].astype(f32)[:, None] * zsum[None, :]).astype(f32)).astype(f32)
        u = (u * tscale[None, :]).astype(f32)
        s = int(gi >= h)
        ys[s] = (ys[s] + (pw.scales[:, gi][:, None] * u).astype(f32)).astype(f32)
    return (ys[0] + ys[1]).astype(f32)


@pytest.mark.parametrize("fmt", ["int4", "uint4", "fp4", "int3", "int2", "ternary"])
@pytest.mark.parametrize("mirror", [False, True])
@pytest.mark.parametrize("k, g", [(256, 64), (512, 256)])
def test_i16_mode_is_the_exact_integer_computation(fmt, mirror, k, g):
    # Every depth up to the natural one (the AVX2 kernel runs tables of <= 16 entries: int4 at
    # depth 1, int2 / ternary at depth 2), and groups of 256 tuples at depth 1 (past the AVX2
    # kernel's int16 chunks of 128).
    rng = np.random.default_rng(9 + g)
    pw = mg.quantize(rng.standard_normal((80, k)), fmt, g)
    x = rng.standard_normal((k, 5)).astype(np.float32)
    x[:g, 1] = 0.0  # an all-zero group (a = 0)
    x[g:2 * g, 2] *= 1e3  # activations far from 1 (int8 scale, and entries past one byte)
    want = _i16_replica(pw, x, mirror)
    ran = 0
    for depth in sorted({1, 2, pw.natural_depth}):
        for backend in BACKENDS:
            if backend == "reference" or not mg.backend_supports(pw, backend, n=5, table="i16", mirror=mirror,
                                                                 depth=depth):
                continue
            y = mg.msgemm(pw, x, table="i16", backend=backend, mirror=mirror, depth=depth)
            assert y.view(np.uint32).tolist() == want.view(np.uint32).tolist(), (backend, depth)
            ran += 1
    assert ran >= 2


@pytest.mark.parametrize("fmt, g", [("int4", 128), ("uint4", 32), ("int2", 64), ("ternary", 40)])
def test_i16_batches_equal_the_replica_and_their_gemvs(fmt, g):
    # Batches of every column-chunk size (16, 8, 4, 2, 1 columns), act-order weights, (B, K)
    # activations through `linear`: on AVX-512 VNNI or AVX2 CPUs (Arm64: with the dot-product
    # extension) the dense int8 path, elsewhere the table kernels; the same bits as the replica
    # and as one GEMV per column either way.
    rng = np.random.default_rng(31)
    k = 8 * g
    w = rng.standard_normal((150, k))
    pw = mg.quantize(w, fmt, g)
    if fmt == "uint4":  # act-order: the same codes read in a shuffled input order
        pw = mg.PackedWeights.from_arrays(pw.codes, pw.scales, pw.zeros, format=fmt, k_perm=rng.permutation(k))
    for n in (1, 2, 7, 16, 31):
        x = rng.standard_normal((k, n)).astype(np.float32)
        want = _i16_replica(pw, x, False)
        y = mg.msgemm(pw, x, table="i16")
        assert y.view(np.uint32).tolist() == want.view(np.uint32).tolist(), n
        yl = mg.linear(np.ascontiguousarray(x.T), pw, table="i16")
        assert yl.view(np.uint32).tolist() == want.T.view(np.uint32).tolist(), n
        cols = np.stack([mg.msgemm(pw, x[:, c].copy(), table="i16") for c in range(n)], axis=1)
        assert cols.view(np.uint32).tolist() == want.view(np.uint32).tolist(), n
        # Each dense kernel by name: AVX-512 VNNI, AMX tiles, and what a CPU without
        # AVX-512 VNNI runs (AVX2).
        for b in ("avx512", "amx", "avx2"):
            # `amx` has no tables for the calls the dense path does not take (2-bit GEMVs).
            if b in BACKENDS and mg.backend_supports(pw, b, n=n, table="i16"):
                y2 = mg.msgemm(pw, x, table="i16", backend=b)
                assert y2.view(np.uint32).tolist() == want.view(np.uint32).tolist(), (b, n)
    info = mg.plan_info(pw, n=16, table="i16")
    assert isinstance(info["dense_int8"], bool)
    if info["dense_int8"]:
        assert info["backend"] in ("avx512", "amx", "avx2", "neon")
    if "amx" not in BACKENDS:  # a CPU or OS without AMX tiles names what is missing
        with pytest.raises(ValueError, match="needs Intel AMX tiles"):
            mg.msgemm(pw, x, table="i16", backend="amx")
    else:  # `auto` takes the tiles from 6 columns on, VNNI below
        assert info["backend"] == "amx"
        assert mg.plan_info(pw, n=5, table="i16")["backend"] == "avx512"
        # No tables on `amx`: its GEMVs are dense, except those of 2-bit codes (ternary too),
        # which it refuses.
        if mg.backend_supports(pw, "amx", n=1):
            gemv = mg.plan_info(pw, n=1, backend="amx")
            assert gemv["dense_int8"] and gemv["table"] == "i16" and gemv["backend"] == "amx"
            y1 = mg.msgemm(pw, x[:, 0], backend="amx")
            want1 = _i16_replica(pw, x[:, :1], False)[:, 0]
            assert y1.view(np.uint32).tolist() == want1.view(np.uint32).tolist()
        else:
            assert fmt in ("int2", "ternary")  # codebooks of at most 4 levels
            with pytest.raises(ValueError, match="backend 'amx' runs the dense int8 path only"):
                mg.msgemm(pw, x[:, 0], backend="amx")
    if "avx2" in BACKENDS:  # AVX2 CPUs sum densely too (vpmaddubsw + vpmaddwd)
        assert mg.plan_info(pw, n=16, table="i16", backend="avx2")["dense_int8"]
        assert mg.plan_info(pw, n=16, table="i16", backend="avx2")["backend"] == "avx2"
    # The default table runs batches densely wherever `i16` does (from 4 columns on, small
    # groups may take `bf16` instead: test_bf16); named depths keep the `i8` tables, and so
    # do GEMVs, except those of AMD's AVX-512 VNNI.
    assert mg.plan_info(pw, n=2)["dense_int8"] == info["dense_int8"]
    assert mg.plan_info(pw, n=2)["table"] == ("i16" if info["dense_int8"] else "i8")
    assert mg.plan_info(pw, n=1)["dense_int8"] == dense_gemv_default(pw)
    # The GEMV's choice is cached apart from the batches' (2-bit codes: GEMVs dense on
    # AVX-512 VNNI only).
    assert mg.plan_info(pw, n=1)["table"] == ("i16" if dense_gemv_default(pw) else "i8")
    assert not mg.plan_info(pw, n=16, depth=2)["dense_int8"]
    # Plans it never takes.
    assert not mg.plan_info(pw, n=16, table="i8")["dense_int8"]
    assert not mg.plan_info(pw, n=16, table="i16", backend="scalar")["dense_int8"]
    # Mirror plans sum the same integers densely too: the shifted codebook's, or in
    # sign-magnitude label space (symmetric int4 / int2 that never use the most negative code)
    # the codebook's own.
    mi = mg.plan_info(pw, n=16, table="i16", mirror=True)
    assert mi["mirror"]
    assert mi["dense_int8"] == info["dense_int8"]
    x = rng.standard_normal((pw.shape[1], 16)).astype(np.float32)
    y = mg.msgemm(pw, x, table="i16", mirror=True)
    assert y.view(np.uint32).tolist() == _i16_replica(pw, x, True).view(np.uint32).tolist()


@pytest.mark.parametrize("fmt, g", [("int4", 128), ("uint4", 64), ("int3", 32), ("int2", 64), ("ternary", 40),
                                    ("nf4", 64), ("fp4", 32), ("int4", 20)])
def test_default_table_is_i16_exactly_for_dense_batches(fmt, g):
    # table=None: `i8` tables, except batches at depth "auto" that the dense path runs, which
    # take `i16` (faster there, and more accurate). The choice depends on the weights, N and
    # the options only, not on what is cached: fresh weights (no used-code scan, no layout
    # yet) give the same bits on their first call as on later ones.
    rng = np.random.default_rng(41)
    k = 6 * g
    pw = mg.quantize(rng.standard_normal((70, k)), fmt, g)
    try:
        dense_possible = mg.plan_info(pw, n=16, table="i16")["dense_int8"]
    except ValueError:  # nf4: no integer codebook, no `i16` mode at all
        dense_possible = False
    if fmt == "nf4" or g % 8:  # a non-integer codebook, groups off the 8-input chunks
        assert not dense_possible
    # Other weights of at most 16 levels with groups of 32s: `bf16` for batches of 6 columns
    # or more where AMX runs it, of 8 or more where AVX-512 does, of 16 or more where AVX2
    # and FMA do (the documented thresholds). GEMVs: `i8` tables, except where AMD's AVX-512
    # VNNI takes them densely (conftest's dense_gemv_default).
    amx_bf16 = mg.backend_supports(pw, "amx", n=16, table="bf16")
    assert amx_bf16 == (g % 32 == 0 and "amx" in BACKENDS and cpu_flags("amx_bf16", "avx512_bf16"))
    avx512_bf16 = mg.backend_supports(pw, "avx512", n=16, table="bf16")
    assert avx512_bf16 == (g % 32 == 0 and cpu_has("AVX512F", "F16C"))
    avx2_bf16 = mg.backend_supports(pw, "avx2", n=16, table="bf16")
    assert avx2_bf16 == (g % 32 == 0 and "avx2" in BACKENDS)
    min_n = 6 if amx_bf16 else 8 if avx512_bf16 else 16 if avx2_bf16 else None
    # Small groups that the dense path takes switch to `bf16` from their own column counts.
    kernel = next((bf16_kernels()[b] for b in ("amx", "avx512", "avx2") if b in bf16_kernels()), None)
    small_min = dense_to_bf16_min_n(kernel, g) if g % 8 == 0 and k % 32 == 0 else None
    dense_gemv = dense_gemv_default(pw)
    assert not dense_gemv or dense_possible
    for n in (1, 2, 3, 5, 6, 7, 8, 11, 12, 15, 16):
        x = rng.standard_normal((k, n)).astype(np.float32)
        dense = dense_possible and (n >= 2 or dense_gemv)
        small = dense and small_min is not None and n >= small_min
        dense = dense and not small
        bf16 = small or (not dense and min_n is not None and n >= min_n)
        table = "i16" if dense else "bf16" if bf16 else "i8"
        info = mg.plan_info(pw, n=n)
        assert (info["table"], info["dense_int8"], info["dense_bf16"]) == (table, dense, bf16), (n, info)
        want = mg.msgemm(pw, x, table=table)
        fresh = pickle.loads(pickle.dumps(pw))
        for y in (mg.msgemm(fresh, x), mg.msgemm(fresh, x), mg.msgemm(pw, x),
                  mg.linear(np.ascontiguousarray(x.T), pickle.loads(pickle.dumps(pw))).T):
            assert y.view(np.uint32).tolist() == want.view(np.uint32).tolist(), n
        # A named depth asks for tables: `i8`, never the dense path.
        d = mg.plan_info(pw, n=n, table="i8")["depth"]
        y = mg.msgemm(pw, x, depth=d)
        assert y.view(np.uint32).tolist() == mg.msgemm(pw, x, depth=d, table="i8").view(np.uint32).tolist()
    # Against the float64 product, the default batch is within the `i16` mode's accuracy on
    # Gaussian data where it runs densely (about 6.5e-3 relative L1), the `i8` mode's elsewhere.
    x = rng.standard_normal((k, 16))
    ref = pw.dequantize() @ x
    rel = np.abs(mg.msgemm(pw, x) - ref).sum() / np.abs(ref).sum()
    assert rel < (1.2e-2 if dense_possible else 2e-2), rel


def test_prepare_builds_what_an_i16_call_reads():
    pw = mg.quantize(np.random.default_rng(2).standard_normal((256, 512)), "int4", 128)
    before = pw.cache_nbytes
    pw.prepare(table="i16")
    assert pw.cache_nbytes > before
    x = np.ones(512, dtype=np.float32)
    want = mg.msgemm(pw, x, table="i16", backend="scalar")
    assert mg.msgemm(pw, x, table="i16").tolist() == want.tolist()
    with pytest.raises(ValueError, match="table"):
        pw.prepare(table="i4")


@pytest.mark.parametrize("fmt", ["int4", "fp4", "nf4"])
def test_default_prepare_builds_what_default_calls_read(fmt):
    # prepare() with the default table: the GEMV's layout (the i8 tables', or the dense one
    # where GEMVs run densely: AMD's AVX-512 VNNI) and, where default batches run densely
    # (`i16`, or `bf16` from its kernel's threshold: 6, 8 or 16 columns), the dense layout;
    # the calls that follow build nothing more.
    w = np.random.default_rng(3).standard_normal((256, 512))
    pw, only_i8 = mg.quantize(w, fmt, 128), mg.quantize(w, fmt, 128)
    assert pw.prepare() is pw
    only_i8.prepare(table="i8")
    info = mg.plan_info(pw, n=16)
    dense = info["dense_int8"] or info["dense_bf16"]
    if dense_gemv_default(pw):
        # No tile layout: exactly what an `i16` GEMV reads (the dense layout, the scales).
        only_dense = mg.quantize(w, fmt, 128).prepare(table="i16")
        assert pw.cache_nbytes == only_dense.cache_nbytes
    else:
        assert (pw.cache_nbytes > only_i8.cache_nbytes) == dense
    built = pw.cache_nbytes
    mg.msgemm(pw, np.ones(512, dtype=np.float32))
    mg.msgemm(pw, np.ones((512, 5), dtype=np.float32))
    mg.msgemm(pw, np.ones((512, 8), dtype=np.float32))
    mg.msgemm(pw, np.ones((512, 16), dtype=np.float32))
    assert pw.cache_nbytes == built
    with pytest.raises(ValueError, match="table"):
        pw.prepare(table="auto")


def test_i16_rejects_non_dyadic_codebooks():
    pw = mg.quantize(np.random.default_rng(0).standard_normal((8, 64)), "nf4", 64)
    with pytest.raises(ValueError, match="i16"):
        mg.msgemm(pw, np.ones(64), table="i16")


def test_accuracy_of_the_precisions_on_gaussian_data():
    """Relative L1 errors against the float64 product (figures quoted in the docs)."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((512, 2048))
    pw = mg.quantize(w, "int4", 128)
    x = rng.standard_normal(2048).astype(np.float32)
    ref = pw.dequantize() @ x
    rel = {t: np.abs(mg.msgemm(pw, x, table=t, depth=2) - ref).sum() / np.abs(ref).sum() for t in mg.TABLES}
    assert rel["f32"] < 1e-6
    assert rel["i16"] < 1.2e-2
    assert rel["i8"] < 1.1e-2


@settings(max_examples=40, deadline=None)
@given(fmt=st.sampled_from(["int4", "uint4", "int3", "uint3", "int2", "uint2", "ternary", "fp4", "nf4"]),
       g=st.sampled_from([8, 16, 24, 40, 64]), m=st.integers(1, 150), groups=st.integers(1, 4),
       n=st.integers(1, 20), scale=st.sampled_from([1e-20, 1.0, 1e20]), seed=st.integers(0, 2**31 - 1))
def test_i16_any_path_gives_the_scalar_bits(fmt, g, m, groups, n, scale, seed):
    # Whichever path runs an i16 call (dense int8 sums, or tables), its bits are the scalar
    # kernel's; nf4 (no integer form) never goes dense, fp4 (integers not affine in the
    # code, looked up in registers) does where the CPU has a dense kernel.
    rng = np.random.default_rng(seed)
    k = g * groups
    pw = mg.quantize(rng.standard_normal((m, k)), fmt, g)
    x = (rng.standard_normal((k, n)) * scale).astype(np.float32)
    x[rng.random(k) < 0.2] = 0.0
    try:
        want = mg.msgemm(pw, x, table="i16", backend="scalar")
    except ValueError as e:  # nf4 has no integer form: both refuse
        with pytest.raises(ValueError, match="i16"):
            mg.msgemm(pw, x, table="i16")
        assert "i16" in str(e)
        return
    for _ in range(2):  # the first call may build the dense layout on the pool
        y = mg.msgemm(pw, x, table="i16")
        assert y.view(np.uint32).tolist() == want.view(np.uint32).tolist()
    if fmt == "fp4" and g % 8 == 0 and mg.plan_info(pw, n=2, table="i16", mirror=False)["dense_int8"]:
        assert mg.plan_info(pw, n=n, table="i16")["dense_int8"]  # any N, as int4


def _integer_codebook(draw_kind: int, levels: int, rng: np.random.Generator) -> np.ndarray:
    """An integer codebook of ``levels`` values: sign-magnitude with a spare value that may lie
    far from the rest (0), symmetric about a centre (1), or arbitrary (2)."""
    if draw_kind == 0:
        half = rng.choice(np.arange(1, 300), levels // 2 - 1, replace=False)
        others = np.concatenate([-half, [0], half])
        spare = rng.choice(np.setdiff1d(np.arange(-400, 401), others))
        return np.sort(np.concatenate([others, [spare]])).astype(np.float64)
    if draw_kind == 1:
        half = rng.choice(np.arange(1, 200), levels // 2, replace=False)
        c = rng.integers(-50, 50)
        return np.sort(np.concatenate([c - half, c + half])).astype(np.float64)
    return np.sort(rng.choice(np.arange(-300, 300), levels, replace=False)).astype(np.float64)


@settings(max_examples=60, deadline=None)
@given(kind=st.integers(0, 2), levels=st.sampled_from([4, 8, 16]), omit=st.integers(-1, 15),
       n=st.sampled_from([1, 4]), mirror=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_i16_auto_depth_runs_whenever_a_fixed_depth_does(kind, levels, omit, n, mirror, seed):
    """``table="i16"`` at ``depth="auto"`` never fails where a named depth works (a review at
    stop 22 reported such a case for far-spare sign-magnitude codebooks; this searches for one),
    and gives the same bits as each of them."""
    rng = np.random.default_rng(seed)
    cb = _integer_codebook(kind, levels, rng)
    m, k, g = 24, 128, 64
    allowed = [c for c in range(levels) if c != omit] or [0]  # weights that skip one code
    codes = rng.choice(allowed, (m, k)).astype(np.uint8)
    pw = mg.PackedWeights.from_arrays(codes, rng.uniform(0.5, 2, (m, k // g)), format="codebook", codebook=cb)
    if mirror and pw.mirror is None:
        mirror = False
    x = rng.standard_normal((k, n)).astype(np.float32)
    works = []
    for d in range(1, 5):
        try:
            works.append((d, mg.msgemm(pw, x, table="i16", depth=d, mirror=mirror)))
        except ValueError:
            pass
    if not works:
        with pytest.raises(ValueError):
            mg.msgemm(pw, x, table="i16", mirror=mirror)
        return
    # i16 sums exact integers, so every depth (and the dense path) gives the same bits.
    y = mg.msgemm(pw, x, table="i16", mirror=mirror)
    for d, yd in works:
        np.testing.assert_array_equal(y, yd, err_msg=f"depth {d}")
