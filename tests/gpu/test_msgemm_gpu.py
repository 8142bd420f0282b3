"""msGeMM CUDA kernels (spec sections 6 and 8.6): exact oracle on integer data against the
float64 host reference, the float32 bound on random data, determinism; clear errors without a
device. The device tests run on a GPU (skipped without CuPy or one) and on the CPU simulator of
``cudasim.h`` (``cp`` fixture, conftest.py)."""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maleki_rs import _gpu
from maleki_rs import msgemm as mg
from maleki_rs.exceptions import GPUUnavailableError
from maleki_rs.msgemm import cuda as mgc

CUSTOM = np.array([-3.0, -1.0, 0.0, 0.5, 2.0, 4.0], np.float32)


def _codes(fmt: str, rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    if fmt.startswith("fp8"):
        # |v| in [1/8, 16] or 0: sums of products with |x| <= 8 stay exact in float32.
        vals = np.asarray(mg.codebook(fmt), np.float64)
        ok = np.flatnonzero(np.isfinite(vals) & ((vals == 0) | ((np.abs(vals) >= 0.125) & (np.abs(vals) <= 16))))
        return ok[rng.integers(0, ok.size, size=shape)].astype(np.uint8)
    levels = {"int2": 4, "uint2": 4, "int3": 8, "uint3": 8, "ternary": 3, "codebook": len(CUSTOM)}.get(fmt, 16)
    return rng.integers(0, levels, size=shape).astype(np.uint8)


def integer_weights(fmt, rng, m, k, g, *, zeros=False, perm=False):
    """Power-of-two scales, integer zero points: every partial sum is an exact integer."""
    scales = np.ldexp(1.0, rng.integers(-2, 2, size=(m, k // g))).astype(np.float32)
    z = rng.integers(-2, 4, size=(m, k // g)).astype(np.float32) if zeros else None
    kp = rng.permutation(k).astype(np.uint32) if perm else None
    return mg.PackedWeights.from_arrays(_codes(fmt, rng, (m, k)), scales, z, format=fmt,
                                        codebook=CUSTOM if fmt == "codebook" else None, k_perm=kp)


def test_validation_runs_without_a_device(monkeypatch):
    pw = mg.quantize(np.ones((8, 64), np.float32), "int4", 32)
    with monkeypatch.context() as mp:  # the 32-bit word offsets' limit, scaled down
        mp.setattr(mgc, "_MAX_ROWS", 8)
        with pytest.raises(ValueError, match="fewer than 8 rows"):
            mgc.to_device(pw)
    with pytest.raises(ValueError, match="at least 2 rows per thread"):
        mgc.kernel_names(1)
    with pytest.raises(ValueError, match="V\\^d <= 256"):
        mgc.to_device(pw, depth=3)
    with pytest.raises(TypeError, match="PackedWeights"):
        mgc.to_device(np.zeros((8, 64)))
    tern = mg.quantize(np.ones((8, 60), np.float32), "ternary", 30)
    with pytest.raises(ValueError, match="G/d"):
        mgc.to_device(tern, depth=5)


def test_device_weights_show_scales_in_the_host_layout():
    st = np.arange(6.0).reshape(2, 3)  # (K/G, M) as the kernels read them
    pwd = mgc.DeviceWeights(shape=(3, 64), group_size=32, depth=2, levels=16, bits=8, idx=None, values=None,
                            scales_t=st, zeros_t=-st, k_perm=None, packed=None, nbytes=0)
    np.testing.assert_array_equal(pwd.scales, st.T)
    np.testing.assert_array_equal(pwd.zeros, -st.T)
    pwd.zeros_t = None
    assert pwd.zeros is None and pwd.slot == 256 and pwd.tuples_per_group == 16 and pwd.tuples_per_word == 4


def test_indices_are_nibbles_exactly_where_tables_have_16_entries_or_fewer(cp):
    """The device layout: 8 four-bit indices per word where V^d <= 16 and (G/d) % 8 == 0,
    else 4 bytes; decoded here word by word against the codes."""
    rng = np.random.default_rng(11)
    m, k = 20, 192
    for fmt, d, g, bits in [("int4", 1, 64, 4), ("int4", 2, 64, 8), ("int2", 2, 64, 4), ("int2", 4, 64, 8),
                            ("ternary", 2, 48, 4), ("int3", 1, 64, 4), ("uint4", 1, 4, 8), ("fp8_e4m3", 1, 64, 8)]:
        pw = integer_weights(fmt, rng, m, k, g)
        pwd = mgc.to_device(pw, depth=d)
        assert pwd.bits == bits, (fmt, d, g)
        words = cp.asnumpy(pwd.idx)
        per = 32 // bits
        assert words.shape == (k // d // per, m) and words.dtype == np.uint32
        shifts = bits * np.arange(per, dtype=np.uint32)
        got = ((words.T[:, :, None] >> shifts) & ((1 << bits) - 1)).reshape(m, k // d)
        c = np.asarray(pw.codes, np.int64).reshape(m, k // d, d)
        want = sum(c[:, :, j] * pwd.levels**j for j in range(d))
        np.testing.assert_array_equal(got, want, err_msg=f"{fmt} d={d} g={g}")


def test_default_depth_prefers_4_bit_indices_unless_bytes_cover_over_twice_the_weights(cp):
    """int4, fp4, nf4 and int3 at d = 1, int2 at d = 2 (16 entries); ternary at its natural
    d = 5 (8-bit), or at d = 2 (9 entries) where the group size rules d = 5 out; fp8 and groups
    that no 4-bit depth divides keep the natural depth with byte indices, or the largest byte
    depth the group size allows where it rules the natural one out too."""
    rng = np.random.default_rng(12)
    for fmt, g, depth, bits in [("int4", 128, 1, 4), ("fp4", 32, 1, 4), ("nf4", 64, 1, 4), ("int3", 64, 1, 4),
                                ("int2", 64, 2, 4), ("uint2", 64, 2, 4), ("ternary", 80, 5, 8),
                                ("ternary", 128, 2, 4), ("fp8_e4m3", 128, 1, 8), ("ternary", 20, 5, 8),
                                ("uint4", 4, 1, 8), ("int2", 12, 3, 8)]:
        pw = integer_weights(fmt, rng, 4, 2 * g, g)
        pwd = mgc.to_device(pw)
        assert (pwd.depth, pwd.bits) == (depth, bits), (fmt, g)
        nat = pw.natural_depth
        if bits == 8 and g % nat == 0 and (g // nat) % 4 == 0:
            assert depth == nat


def test_without_gpu_raises_clear_error():
    if _gpu.is_available():
        pytest.skip("a GPU is present")
    pw = mg.quantize(np.ones((8, 64), np.float32), "int4", 32)
    with pytest.raises(GPUUnavailableError):
        mgc.to_device(pw)
    with pytest.raises(GPUUnavailableError):
        pw.to_device()


# Integer or dyadic codebooks only (nf4's levels are not dyadic: covered by the bound test).
# 4-bit indices (V^d <= 16): int4, fp4 and int3 at d = 1, int2 and ternary at d = 2; uint4 with
# groups of 4 at d = 1 keeps bytes ((G/d) % 8 != 0).
EXACT = [("int4", 2, 128, False), ("uint4", 2, 64, True), ("fp4", 2, 32, False), ("int2", 4, 64, False),
         ("uint2", 4, 64, True), ("int3", 2, 64, False), ("codebook", 2, 32, True), ("fp8_e4m3", 1, 128, False),
         ("int4", 1, 64, True), ("ternary", 5, 80, False), ("fp4", 1, 32, False), ("int3", 1, 64, True),
         ("int2", 2, 64, False), ("ternary", 2, 80, True), ("uint4", 1, 4, True)]


# Table chunks (mgc._CHUNK_BYTES): the default; 0, one batch of words per chunk; 9000 bytes, 2-5
# batches of 16-entry tables per chunk (one of 256-entry ones), so that splits end in a shorter
# chunk and chunks span groups.
RUNS = [(None, None), (1, None), (3, None), (None, 0), (3, 0), (None, 9000), (3, 9000)]


@pytest.mark.parametrize("fmt, depth, g, zeros", EXACT)
def test_lut_gemv_equals_float64_reference_exactly(cp, monkeypatch, fmt, depth, g, zeros):
    rng = np.random.default_rng(zlib.crc32(f"{fmt}/{depth}/{g}".encode()))  # same seed in every process
    m, k = 300, (640 if fmt == "ternary" else 512)  # M not a multiple of the 256-row tile
    pw = integer_weights(fmt, rng, m, k, g, zeros=zeros, perm=fmt == "int4")
    pwd = mgc.to_device(pw, depth=depth)
    wd = pw.dequantize()
    for n in [None, 2, 3, 5, 8]:  # every column count has its own kernel instantiation
        x = rng.integers(-8, 9, size=(k,) if n is None else (k, n)).astype(np.float32)
        want = (wd @ x.astype(np.float64)).astype(np.float32)
        for splits, chunk in RUNS:
            with monkeypatch.context() as mp:
                if chunk is not None:
                    mp.setattr(mgc, "_CHUNK_BYTES", chunk)
                y = cp.asnumpy(mgc.msgemm_cuda(pwd, x, splits=splits))
            np.testing.assert_array_equal(y, want, err_msg=f"{fmt} d={depth} n={n} splits={splits} chunk={chunk}")
        if pwd.packed is not None:
            np.testing.assert_array_equal(cp.asnumpy(mgc.dequant_gemv_cuda(pwd, x)), want)


COUNTED = [("int4", 2, 128, False, 1), ("uint4", 2, 64, True, 3), ("ternary", 5, 80, False, 8),
           ("fp8_e4m3", 1, 128, False, 2), ("int2", 4, 64, True, 4), ("int4", 1, 128, False, 1),
           ("ternary", 2, 80, True, 5)]


@pytest.mark.parametrize("chunk", [None, 0])
@pytest.mark.parametrize("fmt, depth, g, zeros, n", COUNTED)
def test_device_counts_equal_the_formulas(cp, monkeypatch, fmt, depth, g, zeros, n, chunk):
    """The counting build's per-kind totals against closed forms (lookups: the host's
    ``op_counts``): every weight word loaded once whatever N, every table built once and staged
    once per row tile (by chunks of batches, or a batch at a time), one lookup per row, tuple
    and column; and the same result as the plain build."""
    if chunk is not None:
        monkeypatch.setattr(mgc, "_CHUNK_BYTES", chunk)
    rng = np.random.default_rng(zlib.crc32(f"count/{fmt}/{n}".encode()))
    m, k = 1500, (640 if fmt == "ternary" else 512)  # two row tiles of 1024, the second ragged
    pw = integer_weights(fmt, rng, m, k, g, zeros=zeros)
    pwd = mgc.to_device(pw, depth=depth)
    x = rng.integers(-8, 9, size=(k, n)).astype(np.float32)
    opts = {"splits": 3}
    y, got = mgc.msgemm_cuda(pwd, x, count=True, **opts)
    np.testing.assert_array_equal(cp.asnumpy(y), cp.asnumpy(mgc.msgemm_cuda(pwd, x, **opts)))
    np.testing.assert_array_equal(cp.asnumpy(y), (pw.dequantize() @ x.astype(np.float64)).astype(np.float32))
    slot, tuples, groups = pwd.levels**depth, k // depth, k // g
    per = -(-groups // 3)
    splits = -(-groups // per)
    tiles = -(-m // (mgc._ROWS * mgc._rows_per_thread(n)))
    host = mg.op_counts(m, k, n, format=fmt, depth=depth, group_size=g, zero_points=zeros)
    want = {
        "table_mul": depth * tuples * n * slot,
        "table_add": (depth - 1) * tuples * n * slot,
        "sum_add": n * groups * (g - 1) if zeros else 0,
        "words": m * tuples // pwd.tuples_per_word,
        "staged": tiles * tuples * n * (1 << pwd.bits),  # tables 2^bits floats apart
        "lookups": host["lookup"],
        "scale_mul": m * n * groups,
        "zero_mul": m * n * groups if zeros else 0,
        "reduce_add": m * n * splits,
    }
    assert got == want


def test_random_data_within_the_f32_bound_and_deterministic(cp):
    rng = np.random.default_rng(5)
    m, k, g = 1000, 2048, 128
    w = rng.standard_normal((m, k)).astype(np.float32)
    # The default, d = 1 (4-bit indices), and d = 2 (8-bit indices) of every 4-bit format.
    for fmt, depth in [(f, d) for f in ["int4", "uint4", "nf4", "fp4"] for d in (None, 2)]:
        pw = mg.quantize(w, fmt, g)
        pwd = mgc.to_device(pw, depth=depth)
        d = pwd.depth
        x = rng.standard_normal((k, 4)).astype(np.float32)
        wd = pw.dequantize()
        want = wd @ x.astype(np.float64)
        # |s| * (|v| + |z|) bounds every term of the float32 evaluation.
        vmax = np.abs(pw.codebook).max()
        zabs = np.zeros_like(pw.scales) if pw.zeros is None else np.abs(pw.zeros)
        mag = np.repeat(np.abs(pw.scales) * (vmax + zabs), g, axis=1) @ np.abs(x.astype(np.float64))
        bound = 2 * (k / d + d + 3 + k / g) * 2.0**-24 * mag
        y = mgc.msgemm_cuda(pwd, x)
        assert np.all(np.abs(cp.asnumpy(y) - want) <= bound), (fmt, d)
        assert cp.asnumpy(mgc.msgemm_cuda(pwd, x)).tobytes() == cp.asnumpy(y).tobytes()
        # Two splits add the groups as the host driver's two K slices do (each half in order,
        # then the halves), with the same roundings (no FMA contraction on the device): the
        # host's f32 result bit for bit.
        host = mg.msgemm(pw, x, depth=pwd.depth, table="f32", mirror=False)
        np.testing.assert_array_equal(cp.asnumpy(mgc.msgemm_cuda(pwd, x, splits=2)), host, err_msg=f"{fmt} d={d}")


def test_bad_inputs_give_clear_errors(cp):
    rng = np.random.default_rng(6)
    pw = mg.quantize(rng.standard_normal((64, 256)).astype(np.float32), "int4", 64)
    pwd = mgc.to_device(pw)
    with pytest.raises(ValueError, match="shape"):
        mgc.msgemm_cuda(pwd, np.zeros(100, np.float32))
    with pytest.raises(ValueError, match="columns"):
        mgc.msgemm_cuda(pwd, np.zeros((256, 9), np.float32))
    with pytest.raises(ValueError, match="NaN"):
        mgc.msgemm_cuda(pwd, np.full(256, np.nan, np.float32))
    with pytest.raises(ValueError, match="beyond float32"):
        mgc.msgemm_cuda(pwd, np.full(256, 1e300, np.float64))
    with pytest.raises(TypeError, match="DeviceWeights"):
        mgc.msgemm_cuda(None, np.zeros(256, np.float32))
    with pytest.raises(TypeError, match="float"):
        mgc.msgemm_cuda(pwd, np.zeros(256, np.int32))
    for knob in ("count", "check"):
        with pytest.raises(TypeError, match=knob):
            mgc.msgemm_cuda(pwd, np.zeros(256, np.float32), **{knob: "yes"})
    with pytest.raises(ValueError, match="splits"):
        mgc.msgemm_cuda(pwd, np.zeros(256, np.float32), splits=0)


# The tensor-core kernel (dequant_mma_cuda): its three decodes (integer codebooks v[c] = c + b, fp4
# e2m1, a table for any other codebook of at most 16 values).
MMA_EXACT = [("int4", 128, False), ("uint4", 64, True), ("int3", 32, False), ("uint3", 48, True),
             ("int2", 16, False), ("uint2", 32, True), ("ternary", 80, False), ("fp4", 32, False), ("fp4", 64, True),
             ("codebook", 32, True), ("codebook", 128, False)]


def test_mma_words_hold_each_lane_s_fragment_as_the_ptx_isa_lays_it_out():
    """Word j of lane (g, t) in chunk c of row tile T holds the A fragment of k16 step 4 c + j:
    register r has rows g + 8 (r % 2), columns 2 t + 8 (r // 2) + e (PTX ISA, mma.m16n8k16,
    floating point A), element e at nibble 4 r + 16 e. Decoded here lane by lane."""
    rng = np.random.default_rng(21)
    m, k = 37, 200  # ragged in both: padded to 48 rows and 256 columns with code 0
    codes = rng.integers(0, 16, size=(m, k)).astype(np.uint8)
    flat = mgc._mma_words(codes)
    assert flat.shape == (3 * 4 * 128 + 128,) and flat.dtype == np.uint32
    assert not flat[-128:].any()  # the chunk the kernel reads ahead into after the last tile
    words = flat[:-128].reshape(3, 4, 32, 4)
    got = np.full((48, 256), 99, np.int64)
    for tile, chunk, lane, j in np.ndindex(words.shape):
        g, t = divmod(lane, 4)
        for r in range(4):
            for e in range(2):
                row = 16 * tile + g + 8 * (r % 2)
                col = 64 * chunk + 16 * j + 2 * t + 8 * (r // 2) + e
                got[row, col] = (int(words[tile, chunk, lane, j]) >> (4 * r + 16 * e)) & 15
    want = np.zeros((48, 256), np.int64)
    want[:m, :k] = codes
    np.testing.assert_array_equal(got, want)


def test_mma_x_fragments_are_the_scaled_float16_split_of_x(cp):
    """msgemm_mma_x against numpy: per column a power of two putting the largest |x| in
    [2^13, 2^14) (clamped to 2^+-125), hi = float16(x s), lo = float16(x s - hi), in the
    B-fragment order of the PTX ISA (register 2 part + r of lane 4 g + t: rows 2 t + 8 r,
    2 t + 8 r + 1 of column 8 tile + g); zeros past K and N (the padding columns' blocks);
    with zero points, the group sums of x s (float32 sums: within their bound)."""
    rng = np.random.default_rng(24)
    n, k, chunks, tiles = 11, 150, 3, 2
    xt = rng.standard_normal((n, k)).astype(np.float32)
    xt[1] *= np.float32(3e37)
    xt[2] *= np.float32(1e-40)  # subnormal
    xt[3] = 0.0
    xt[4, 7] = -65504.0 * 4
    g = 50  # 3 groups, of more than a warp's 32 and not a multiple of it
    xfs = []
    for with_sums in (False, True):
        inv = cp.empty(n, cp.float32)
        xf = cp.empty((4 * chunks, tiles, 32, 4), cp.uint32)  # the simulator's is 0xff bytes: all must be written
        sums = cp.empty(n * (k // g), cp.float32) if with_sums else np.uint64(0)
        arrivals = cp.empty(100, cp.uint32) if with_sums else np.uint64(0)  # the split counters, zeroed
        mgc._kernel("msgemm_mma_x")((8 * tiles,), (64,),  # two warps: 3 loads and 3 words a thread
                                    (xt, np.int64(k), np.int32(n), np.int32(tiles), np.int32(4 * chunks),
                                     np.int32(g), inv, xf, sums, arrivals, np.int32(100 if with_sums else 0)))
        xfs.append(cp.asnumpy(xf))
    assert not cp.asnumpy(arrivals).any()
    np.testing.assert_array_equal(xfs[0], xfs[1])
    inv = cp.asnumpy(inv)
    scale = np.float32(1) / inv  # exact: powers of two
    xs = xt.astype(np.float64) * scale[:, None]
    want_sums = xs.reshape(n, k // g, g).sum(axis=2)
    bound = g * 2.0**-24 * np.abs(xs).reshape(n, k // g, g).sum(axis=2)
    got_sums = cp.asnumpy(sums).reshape(n, k // g)
    assert np.all(np.abs(got_sums - want_sums) <= bound)
    mx = np.abs(xt).max(axis=1)
    a = np.clip(14 - np.frexp(mx)[1], -125, 125)
    np.testing.assert_array_equal(scale, np.ldexp(np.float32(1), a))
    np.testing.assert_array_equal(inv, np.ldexp(np.float32(1), -a))
    ok = mx > 1e-30
    assert np.all((mx * scale)[ok] >= 2.0**13) and np.all((mx * scale)[ok] < 2.0**14)
    full = np.zeros((8 * tiles, 64 * chunks), np.float32)
    full[:n, :k] = xt * scale[:, None]
    hi = full.astype(np.float16)
    lo = (full - hi.astype(np.float32)).astype(np.float16)
    want = np.zeros(xf.shape, np.uint32)
    for step, tile, lane, reg in np.ndindex(xf.shape):
        g, t = divmod(lane, 4)
        part, r = divmod(reg, 2)
        row = 16 * step + 2 * t + 8 * r
        h = (hi, lo)[part][8 * tile + g, row:row + 2].view(np.uint16).astype(np.uint32)
        want[step, tile, lane, reg] = h[0] | (h[1] << 16)
    np.testing.assert_array_equal(cp.asnumpy(xf), want)


@pytest.mark.parametrize("fmt, g, zeros", MMA_EXACT)
def test_mma_equals_float64_reference_exactly(cp, fmt, g, zeros):
    """Integer data with power-of-two scales: every product and partial sum is an exact integer
    (float16 holds the codes and the inputs exactly), so the tensor-core result equals the
    float64 reference bit for bit, for every kernel shape (N up to 8, 16, 32, 64 columns a
    block; 70 takes two blocks along N), ragged M, K splits and act order."""
    rng = np.random.default_rng(zlib.crc32(f"mma/{fmt}/{g}".encode()))
    m, k = 75, 4 * g if g != 80 else 320  # M not a multiple of 16; K not of 64 for g = 48 and 80
    pw = integer_weights(fmt, rng, m, k, g, zeros=zeros, perm=fmt == "int4")
    pwd = mgc.to_device(pw, mma=True)
    wd = pw.dequantize()
    for n in [None, 3, 12, 30, 70]:
        x = rng.integers(-8, 9, size=(k,) if n is None else (k, n)).astype(np.float32)
        x *= np.float32(2.0) ** rng.integers(-3, 4, size=x.shape[1:] if n else ())  # per-column scale
        want = (wd @ x.astype(np.float64)).astype(np.float32)
        for splits in (None, 1, 3):
            y = cp.asnumpy(mgc.dequant_mma_cuda(pwd, x, splits=splits))
            assert y.shape == want.shape
            np.testing.assert_array_equal(y, want, err_msg=f"{fmt} g={g} n={n} splits={splits}")


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])  # sim_cp: a patch
@given(fmt=st.sampled_from(["int4", "uint4", "int2", "ternary", "fp4", "codebook"]),
       # M up to 70: one block along x; 257 to 300: two (a block holds 256 rows at N <= 16,
       # 128 beyond; review, helper-42).
       m=st.one_of(st.integers(1, 70), st.integers(257, 300)),
       groups=st.integers(1, 5), g=st.sampled_from([16, 32, 48, 64, 128]), n=st.integers(1, 40),
       splits=st.integers(1, 5), order=st.sampled_from(["C", "F", "view"]), seed=st.integers(0, 2**16))
def test_mma_any_shape_equals_float64_reference_exactly(sim_cp, fmt, m, groups, g, n, splits, order, seed):
    """Ragged shapes on the simulator: M from 1, K = groups x G (not a multiple of 64 for most),
    any N, any K splits the groups allow, X in C or Fortran order or a strided view."""
    rng = np.random.default_rng(seed)
    k = groups * g
    pw = integer_weights(fmt, rng, m, k, g, zeros=fmt in ("uint4", "codebook"))
    wd = pw.dequantize()
    xs = rng.integers(-8, 9, size=(k, 2 * n)).astype(np.float32)
    x = {"C": np.ascontiguousarray(xs[:, :n]), "F": np.asfortranarray(xs[:, :n]), "view": xs[:, ::2]}[order]
    y = mgc.dequant_mma_cuda(mgc.to_device(pw, mma=True), x, splits=min(splits, groups))
    np.testing.assert_array_equal(y, (wd @ x.astype(np.float64)).astype(np.float32))


def test_mma_random_data_is_float32_accurate_and_deterministic(cp):
    """Random data: the hi + lo float16 split of X keeps about 22 bits, so the error stays at
    float32 level relative to sum |w x| (not float16's 1e-3), also for columns whose scales
    differ by 10^60 and whose values overflow float16 (1e30)."""
    rng = np.random.default_rng(22)
    m, k, g = 200, 1024, 128
    w = rng.standard_normal((m, k)).astype(np.float32)
    x = rng.standard_normal((k, 20)).astype(np.float32)
    x[:, 1] *= np.float32(1e30)
    x[:, 2] *= np.float32(1e-30)
    x[::7, 3] = 0.0
    x[:, 4] = 0.0  # an all-zero column
    for fmt in ["int4", "uint4", "int2", "fp4", "nf4"]:
        pw = mg.quantize(w, fmt, g)
        pwd = mgc.to_device(pw, mma=True)
        wd = pw.dequantize()
        want = wd @ x.astype(np.float64)
        mag = np.abs(wd) @ np.abs(x.astype(np.float64))
        y = cp.asnumpy(mgc.dequant_mma_cuda(pwd, x))
        # x = hi + lo to 2^-22; float32 accumulation over 2 k / 16 mma steps, k / g groups
        # and the splits (rounding or, on tensor cores, truncation: a factor 2 more).
        bound = (2.0**-21 + 2 * (2 * k / 16 + 3 * k / g + 16) * 2.0**-23) * mag
        assert np.all(np.abs(y - want) <= bound), fmt
        assert np.all(y[:, 4] == 0.0)
        rel = np.abs(y - want).max(axis=0) / np.maximum(mag.max(axis=0), 1e-300)
        assert rel.max() < 1e-5, (fmt, rel)
        assert cp.asnumpy(mgc.dequant_mma_cuda(pwd, x)).tobytes() == y.tobytes()


def test_mma_l2_prefetch_changes_no_bit_and_stays_in_the_split(cp, monkeypatch):
    """The weights' L2 prefetch (MSGEMM_MMA_PREFETCH chunks beyond the next) is a hint: the
    same bits with it on and off. On the simulator a prefetch reads its byte, so one past the
    weights' end (the last split's last tile) would fault: it stops at the split's end."""
    rng = np.random.default_rng(25)
    m, k, g = 75, 1024, 64  # 16 chunks: prefetches from the first chunk of a split on
    pw = integer_weights("int4", rng, m, k, g, zeros=False, perm=False)
    pwd = mgc.to_device(pw, mma=True, lut=False)
    for n in (None, 12):
        x = rng.integers(-8, 9, size=(k,) if n is None else (k, n)).astype(np.float32)
        want = (pw.dequantize() @ x.astype(np.float64)).astype(np.float32)
        for splits in (1, 3):
            got = []
            for on in (False, True):
                monkeypatch.setattr(mgc, "_MMA_PREFETCH", on)
                got.append(cp.asnumpy(mgc.dequant_mma_cuda(pwd, x, splits=splits)))
            np.testing.assert_array_equal(got[0], want)
            np.testing.assert_array_equal(got[1], want)


def test_mma_default_splits_fill_the_sms_the_registers_allow():
    """65536 registers an SM, allocated 8 a thread at a time, 128 threads a block."""
    blocks = mgc._mma_blocks_per_sm
    assert [blocks(type("K", (), {"num_regs": r})()) for r in (116, 128, 129, 168, 174, 255)] == [4, 4, 3, 3, 2, 2]
    assert blocks(object()) == 3  # the simulator's kernels do not say


def test_mma_bad_inputs_give_clear_errors(cp):
    rng = np.random.default_rng(23)
    w = rng.standard_normal((32, 256)).astype(np.float32)
    with pytest.raises(ValueError, match="at most 16 values"):
        mgc.to_device(mg.quantize(w, "fp8_e4m3", 64), mma=True)
    huge = mg.quantize(w, "codebook", 64, codebook=np.array([-1e36, 0.0, 1e36], np.float32))
    with pytest.raises(ValueError, match="largest \\|v\\|"):
        mgc.to_device(huge, mma=True)
    with pytest.raises(ValueError, match="multiple of 16"):
        mgc.to_device(mg.quantize(w, "int4", 8), mma=True)
    with pytest.raises(TypeError, match="mma"):
        mgc.to_device(mg.quantize(w, "int4", 64), mma="yes")
    pw = mg.quantize(w, "int4", 64)
    with pytest.raises(ValueError, match="mma=True"):
        mgc.dequant_mma_cuda(mgc.to_device(pw), np.zeros(256, np.float32))
    pwd = mgc.to_device(pw, mma=True)
    only = mgc.to_device(pw, mma=True, lut=False)  # the tensor-core layout alone
    assert only.idx is None and only.packed is None and only.mma_words is not None
    np.testing.assert_array_equal(cp.asnumpy(mgc.dequant_mma_cuda(only, np.ones(256, np.float32))),
                                  cp.asnumpy(mgc.dequant_mma_cuda(pwd, np.ones(256, np.float32))))
    with pytest.raises(ValueError, match="lut=False"):
        mgc.msgemm_cuda(only, np.zeros(256, np.float32), kernel="lut")
    with pytest.raises(ValueError, match="lut=True"):
        mgc.dequant_gemv_cuda(only, np.zeros(256, np.float32))
    with pytest.raises(ValueError, match="needs mma=True"):
        mgc.to_device(pw, lut=False)
    mgc.to_device(mg.quantize(w[:, :240], "int4", 48), depth=3, mma=True, lut=False)  # no LUT depth check
    with pytest.raises(ValueError, match="shape"):
        mgc.dequant_mma_cuda(pwd, np.zeros((100, 2), np.float32))
    with pytest.raises(ValueError, match="no columns"):
        mgc.dequant_mma_cuda(pwd, np.zeros((256, 0), np.float32))
    with pytest.raises(ValueError, match="NaN"):
        mgc.dequant_mma_cuda(pwd, np.full((256, 3), np.inf, np.float32))
    with pytest.raises(ValueError, match="splits"):
        mgc.dequant_mma_cuda(pwd, np.zeros(256, np.float32), splits=5)  # 4 groups
    with pytest.raises(TypeError, match="DeviceWeights"):
        mgc.dequant_mma_cuda(pw, np.zeros(256, np.float32))
    with pytest.raises(ValueError, match="kernel='mma'"):  # the LUT kernels point to it for batches
        mgc.msgemm_cuda(pwd, np.zeros((256, 9), np.float32), kernel="lut")
    with pytest.raises(ValueError, match="count"):
        mgc.msgemm_cuda(pwd, np.zeros(256, np.float32), kernel="mma", count=True)
    with pytest.raises(ValueError, match="count needs the LUT layout"):
        mgc.msgemm_cuda(only, np.zeros(256, np.float32), count=True)
    with pytest.raises(ValueError, match="vscale"):  # a hand-made format the kernel would misread
        mgc.dequant_mma_cuda(dataclasses.replace(pwd, mma_format=(0, -8, 2.0)), np.zeros(256, np.float32))
    for bad in ("tensor", None, 1):
        with pytest.raises(ValueError, match="kernel"):
            mgc.msgemm_cuda(pwd, np.zeros(256, np.float32), kernel=bad)


def test_msgemm_cuda_chooses_by_columns_and_layouts(cp, monkeypatch):
    """kernel="auto": the LUT kernels up to 8 columns where the weights have their layout, the
    tensor-core kernel beyond or where it alone is there; "lut" and "mma" as asked. Each choice
    is seen through which driver ran, and its result is the float64 reference's (integer data)."""
    rng = np.random.default_rng(26)
    pw = integer_weights("int4", rng, 40, 256, 64)
    both, lut_only, mma_only = (mgc.to_device(pw, mma=True), mgc.to_device(pw),
                                mgc.to_device(pw, mma=True, lut=False))
    ran = []
    real_mma = mgc.dequant_mma_cuda
    monkeypatch.setattr(mgc, "dequant_mma_cuda", lambda *a, **k: ran.append("mma") or real_mma(*a, **k))
    for pwd, n, kernel, want_kernel in [(both, None, "auto", "lut"), (both, 8, "auto", "lut"),
                                        (both, 9, "auto", "mma"), (both, 1, "mma", "mma"),
                                        (both, 3, "lut", "lut"), (lut_only, 8, "auto", "lut"),
                                        (mma_only, 2, "auto", "mma"), (mma_only, 40, "auto", "mma")]:
        ran.clear()
        x = rng.integers(-8, 9, size=(256,) if n is None else (256, n)).astype(np.float32)
        y = cp.asnumpy(mgc.msgemm_cuda(pwd, x, kernel=kernel))
        np.testing.assert_array_equal(y, (pw.dequantize() @ x.astype(np.float64)).astype(np.float32))
        assert ran == ([] if want_kernel == "lut" else ["mma"]), (n, kernel)
    with pytest.raises(ValueError, match="lut=False"):
        mgc.msgemm_cuda(mma_only, np.zeros(256, np.float32), kernel="lut")
    with pytest.raises(ValueError, match="columns"):  # no tensor-core layout: the LUT kernels' limit
        mgc.msgemm_cuda(lut_only, np.zeros((256, 9), np.float32))


def test_linear_cuda_is_a_linear_layer(cp):
    """x (..., K) -> x @ Wd.T (..., M), C-contiguous float32, for any leading shape and memory
    order, through either kernel; bad inputs give clear errors."""
    rng = np.random.default_rng(27)
    pw = integer_weights("uint4", rng, 36, 128, 32, zeros=True)
    pwd = mgc.to_device(pw, mma=True)
    wd = pw.dequantize()
    for shape in [(128,), (3, 128), (2, 5, 128), (12, 128)]:
        x = rng.integers(-4, 5, size=shape).astype(np.float32)
        want = (x.astype(np.float64) @ wd.T).astype(np.float32)
        for xin in (x, np.asfortranarray(x)):
            for kernel in ("auto", "lut", "mma"):
                if kernel == "lut" and x.size // 128 > 8:
                    continue
                y = cp.asnumpy(mgc.linear_cuda(xin, pwd, kernel=kernel))
                assert y.shape == shape[:-1] + (36,) and y.dtype == np.float32 and y.flags.c_contiguous
                np.testing.assert_array_equal(y, want, err_msg=f"{shape} {kernel}")
    # The bias, added in float32 after the product: integer values keep every sum exact.
    bias = rng.integers(-50, 51, size=36).astype(np.float64)
    x = rng.integers(-4, 5, size=(2, 5, 128)).astype(np.float32)
    want = (x.astype(np.float64) @ wd.T + bias).astype(np.float32)
    for b in (bias, cp.asarray(bias, dtype=cp.float32)):
        np.testing.assert_array_equal(cp.asnumpy(mgc.linear_cuda(x, pwd, b)), want)
    with pytest.raises(ValueError, match="bias: expected shape"):
        mgc.linear_cuda(x, pwd, np.zeros(35))
    with pytest.raises(TypeError, match="bias"):
        mgc.linear_cuda(x, pwd, np.zeros(36, np.int32))
    with pytest.raises(ValueError, match="bias: contains"):
        mgc.linear_cuda(x, pwd, np.full(36, np.inf))
    with pytest.raises(ValueError, match="last dimension"):
        mgc.linear_cuda(np.zeros((2, 100), np.float32), pwd)
    with pytest.raises(ValueError, match="non-empty"):
        mgc.linear_cuda(np.zeros((0, 128), np.float32), pwd)
    with pytest.raises(TypeError, match="DeviceWeights"):
        mgc.linear_cuda(np.zeros(128, np.float32), pw)
    with pytest.raises(ValueError, match="NaN"):
        mgc.linear_cuda(np.full((2, 128), np.nan, np.float32), pwd)
