"""Oracle 4 (spec section 8.4): quantizer properties, packing bijectivity, the loaders against
hand-built GPTQ / AWQ / MatMulNBits tensors, and pickling."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from maleki_rs import msgemm as mg

from .conftest import CUSTOM, valid_codes

RTN = ["int4", "int3", "int2", "uint4", "uint3", "uint2", "ternary"]


def _expand(a, g):
    return np.repeat(a.astype(np.float64), g, axis=1)


@pytest.mark.parametrize("fmt", RTN)
@pytest.mark.parametrize("group_size", [32, 128, None])
def test_rtn_codes_in_range_and_error_at_most_half_a_step(fmt, group_size):
    rng = np.random.default_rng(2)
    w = rng.standard_normal((40, 256)) * rng.uniform(0.1, 10, size=(40, 1))
    pw = mg.quantize(w, fmt, group_size)
    g = pw.group_size
    assert g == (group_size or 256)
    assert pw.codes.max() < pw.levels
    s = _expand(np.abs(pw.scales), g)
    assert (np.abs(pw.dequantize() - w) <= s / 2 * (1 + 1e-6)).all()
    assert (pw.zeros is not None) == fmt.startswith("uint")
    if pw.zeros is not None:  # integer zero points within the code range
        assert np.array_equal(pw.zeros, np.round(pw.zeros))
        assert pw.zeros.min() >= 0 and pw.zeros.max() < pw.levels


def test_integer_codebooks_are_their_float_values():
    # llama.cpp's IQ4_NL codebook is 16 integers: a list of ints, or any integer array, is the
    # same codebook as its float32 values.
    from maleki_rs.msgemm._gguf import IQ4_VALUES

    w = np.random.default_rng(5).standard_normal((6, 64))
    want = mg.quantize(w, "codebook", 32, codebook=np.array(IQ4_VALUES, np.float32))
    for cb in ([int(v) for v in IQ4_VALUES], np.array(IQ4_VALUES, np.int16), np.array(IQ4_VALUES, np.int64)):
        got = mg.quantize(w, "codebook", 32, codebook=cb)
        np.testing.assert_array_equal(got.codebook, want.codebook)
        np.testing.assert_array_equal(got.codes, want.codes)
        np.testing.assert_array_equal(got.scales, want.scales)


def test_symmetric_switches():
    w = np.random.default_rng(0).standard_normal((4, 128))
    assert mg.quantize(w, "int4", symmetric=False).format == "uint4"
    pw = mg.quantize(w, "uint4", symmetric=True)  # GPTQ sym: zero point fixed at 8
    assert pw.format == "uint4" and np.all(pw.zeros == 8)
    with pytest.raises(ValueError, match="symmetric"):
        mg.quantize(w, "nf4", symmetric=False)


@pytest.mark.parametrize("fmt", ["nf4", "fp4", "codebook", "fp8_e4m3", "fp8_e5m2"])
def test_nearest_level(fmt):
    rng = np.random.default_rng(4)
    w = rng.standard_normal((16, 128)) * 3
    pw = mg.quantize(w, fmt, 32, codebook=CUSTOM if fmt == "codebook" else None)
    cb = pw.codebook.astype(np.float64)
    finite = np.isfinite(cb)
    s = _expand(pw.scales, 32)
    target = w / s
    if fmt == "fp4":  # MX: power-of-two scales, saturating at +-6
        e = np.log2(pw.scales)
        assert np.array_equal(e, np.round(e))
        amax = np.abs(w).reshape(16, 4, 32).max(axis=2)
        assert np.array_equal(pw.scales, (2.0 ** (np.floor(np.log2(amax)) - 2)).astype(np.float32))
        target = np.clip(target, -6, 6)
    chosen = cb[pw.codes]
    best = np.min(np.abs(target[..., None] - cb[finite][None, None, :]), axis=-1)
    assert np.allclose(np.abs(target - chosen), best, rtol=0, atol=1e-12)


def test_mx_block_scale_edge_cases():
    w = np.zeros((1, 64))
    w[0, :32] = 6.0  # exactly representable at scale 1
    w[0, 32:] = 7.99
    pw = mg.quantize(w, "fp4", 32)
    assert pw.scales.tolist() == [[1.0, 1.0]]
    np.testing.assert_array_equal(pw.dequantize()[0, 32:], 6.0)  # saturates


@settings(max_examples=60, deadline=None)
@given(fmt=st.sampled_from(mg.FORMATS), m=st.integers(1, 5), groups=st.integers(1, 3),
       g=st.sampled_from([1, 3, 5, 8, 32]), seed=st.integers(0, 2**32 - 1))
def test_pack_unpack_is_a_bijection(fmt, m, groups, g, seed):
    rng = np.random.default_rng(seed)
    k = g * groups
    codes = valid_codes(fmt, rng, (m, k))
    scales = rng.uniform(0.5, 2, size=(m, groups)).astype(np.float32)
    pw = mg.PackedWeights.from_arrays(codes, scales, format=fmt, codebook=CUSTOM if fmt == "codebook" else None)
    np.testing.assert_array_equal(pw.codes, codes)
    bits = {"int4": 4, "uint4": 4, "fp4": 4, "nf4": 4, "codebook": 4, "int3": 3, "uint3": 3,
            "int2": 2, "uint2": 2, "ternary": 1.6, "fp8_e4m3": 8, "fp8_e5m2": 8, "int8": 8, "uint8": 8}[fmt]
    row_bytes = {1.6: -(-k // 5), 3: -(-k // 8) * 3}.get(bits, -(-k * int(bits) // 8) if bits != 1.6 else 0)
    assert pw.packed.shape == (m, row_bytes)
    again = pickle.loads(pickle.dumps(pw))
    np.testing.assert_array_equal(again.packed, pw.packed)
    np.testing.assert_array_equal(again.dequantize(), pw.dequantize())


def test_natural_depth_index_is_the_stored_byte():
    rng = np.random.default_rng(0)
    for fmt, v, d in [("int4", 16, 2), ("int2", 4, 4), ("ternary", 3, 5)]:
        codes = rng.integers(0, v, size=(3, 40)).astype(np.uint8)
        pw = mg.PackedWeights.from_arrays(codes, np.ones((3, 1), np.float32), format=fmt)
        idx = sum(codes[:, j::d].astype(np.int64) * v**j for j in range(d))
        np.testing.assert_array_equal(pw.packed, idx)


def test_pickle_round_trip_all_attributes():
    rng = np.random.default_rng(1)
    pw = mg.quantize(rng.standard_normal((70, 128)), "uint4", 64)
    pw2 = pickle.loads(pickle.dumps(pw))
    assert repr(pw2) == repr(pw)
    for attr in ["packed", "scales", "zeros", "codebook", "codes"]:
        np.testing.assert_array_equal(getattr(pw2, attr), getattr(pw, attr))
    x = rng.standard_normal(128).astype(np.float32)
    np.testing.assert_array_equal(mg.msgemm(pw2, x), mg.msgemm(pw, x))
    custom = mg.quantize(rng.standard_normal((4, 32)), "codebook", 32, codebook=CUSTOM)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(custom)).codebook, CUSTOM)


# ---------------------------------------------------------------------------------- loaders
def _pack_along(values: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """Packs ``values`` into int32 words along ``axis``, low bits first, as GPTQ does:
    word i holds elements ``i*32/bits .. (i+1)*32/bits - 1`` (a continuous bit stream)."""
    v = np.moveaxis(values.astype(np.uint64), axis, 0)
    n = v.shape[0]
    words = np.zeros((n * bits // 32,) + v.shape[1:], dtype=np.uint64)
    for i in range(n):
        pos = i * bits
        w, off = divmod(pos, 32)
        words[w] |= (v[i] << np.uint64(off)) & np.uint64(0xFFFFFFFF)
        if off + bits > 32:
            words[w + 1] |= v[i] >> np.uint64(32 - off)
    return np.moveaxis(words.astype(np.uint32).view(np.int32), 0, axis)


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_loader(bits, act_order):
    rng = np.random.default_rng(bits)
    m, k, g = 64, 256, 32
    groups = k // g
    q = rng.integers(0, 2**bits, size=(k, m))  # (K, M): GPTQ stores W transposed
    # The classic GPTQ format stores z - 1 (so it cannot hold z = 0): draw z >= 1.
    z = rng.integers(1, 2**bits, size=(groups, m))
    s = rng.uniform(0.01, 0.1, size=(groups, m)).astype(np.float16)
    g_idx = (np.arange(k) // g).astype(np.int32)
    if act_order:
        g_idx = g_idx[rng.permutation(k)]
    qweight = _pack_along(q, bits, 0)
    qzeros = _pack_along(z - 1, bits, 1)
    pw = mg.PackedWeights.from_gptq(qweight, qzeros, s, g_idx if act_order else None, bits=bits, group_size=g)
    # gptq_v2 stores z itself
    pw2 = mg.PackedWeights.from_gptq(qweight, _pack_along(z, bits, 1), s, g_idx if act_order else None, bits=bits, group_size=g, zero_offset=0)
    np.testing.assert_array_equal(pw2.dequantize(), pw.dequantize())
    want = (s.astype(np.float64)[g_idx] * (q - z[g_idx])).T  # (M, K)
    np.testing.assert_array_equal(pw.dequantize(), want.astype(np.float32).astype(np.float64))
    assert (pw.k_perm is not None) == act_order
    x = rng.standard_normal((k, 2)).astype(np.float32)
    np.testing.assert_allclose(mg.msgemm(pw, x, table="f32"), pw.dequantize() @ x, rtol=1e-5, atol=1e-5)


def test_gptq_uint32_words_and_bad_gidx():
    rng = np.random.default_rng(0)
    q = rng.integers(0, 16, size=(64, 32))
    qweight = _pack_along(q, 4, 0).view(np.uint32)
    qzeros = _pack_along(np.full((1, 32), 7), 4, 1)
    s = np.ones((1, 32), np.float32)
    pw = mg.PackedWeights.from_gptq(qweight, qzeros, s)
    np.testing.assert_array_equal(pw.dequantize(), (q - 8).T)
    bad = np.zeros(64, np.int32)
    bad[0] = 1
    with pytest.raises(ValueError, match="g_idx"):
        mg.PackedWeights.from_gptq(qweight, _pack_along(np.full((2, 32), 7), 4, 1), np.ones((2, 32)), bad)


def test_awq_loader():
    rng = np.random.default_rng(5)
    m, k, g = 32, 128, 64
    q = rng.integers(0, 16, size=(k, m))
    z = rng.integers(0, 16, size=(k // g, m))
    s = rng.uniform(0.5, 1.5, size=(k // g, m)).astype(np.float32)
    order = [0, 2, 4, 6, 1, 3, 5, 7]

    def pack(a):  # AWQ: nibble i of word c holds feature 8c + order[i]
        out = np.zeros((a.shape[0], a.shape[1] // 8), dtype=np.uint32)
        for c in range(a.shape[1] // 8):
            for i, o in enumerate(order):
                out[:, c] |= a[:, 8 * c + o].astype(np.uint32) << np.uint32(4 * i)
        return out.view(np.int32)

    pw = mg.PackedWeights.from_awq(pack(q), pack(z), s, group_size=g)
    gi = np.arange(k) // g
    want = (s.astype(np.float64)[gi] * (q - z[gi])).T
    np.testing.assert_array_equal(pw.dequantize(), want)


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("zp", ["none", "packed", "float"])
def test_matmulnbits_loader_and_export(bits, zp):
    rng = np.random.default_rng(bits)
    n_out, k, bs = 24, 256, 64
    kb = k // bs
    q = rng.integers(0, 2**bits, size=(n_out, k))
    per = 8 // bits
    blob = np.zeros((n_out, k * bits // 8), dtype=np.uint8)
    for j in range(k):
        blob[:, j // per] |= (q[:, j] << (bits * (j % per))).astype(np.uint8)
    B = blob.reshape(n_out, kb, bs * bits // 8)
    scales = rng.uniform(0.1, 1, size=n_out * kb).astype(np.float32)
    zcodes = rng.integers(0, 2**bits, size=(n_out, kb))
    if zp == "none":
        zero_points, zval = None, np.full((n_out, kb), 2 ** (bits - 1))
    elif zp == "float":
        zero_points, zval = zcodes.astype(np.float32).reshape(-1), zcodes
    else:
        per_row = -(-kb * bits // 8)
        packed = np.zeros((n_out, per_row), dtype=np.uint8)
        for b in range(kb):
            packed[:, b // per] |= (zcodes[:, b] << (bits * (b % per))).astype(np.uint8)
        zero_points, zval = packed.reshape(-1), zcodes
    pw = mg.PackedWeights.from_matmulnbits(B, scales, zero_points, K=k, bits=bits, block_size=bs)
    want = scales.reshape(n_out, kb).repeat(bs, axis=1).astype(np.float64) * (q - zval.repeat(bs, axis=1))
    np.testing.assert_array_equal(pw.dequantize(), want)
    assert pw.format == ({2: "int2", 4: "int4"}[bits] if zp == "none" else {2: "uint2", 4: "uint4"}[bits])
    B2, s2, z2 = pw.to_matmulnbits()
    np.testing.assert_array_equal(B2, B)
    np.testing.assert_array_equal(s2, scales)
    if zp == "packed":
        np.testing.assert_array_equal(z2, zero_points)
    if zp == "none":
        assert z2 is None


def test_loader_errors_are_value_errors():
    with pytest.raises(ValueError, match="K"):
        mg.PackedWeights.from_matmulnbits(np.zeros((2, 1, 32), np.uint8), np.ones(2), K=100, block_size=64)
    with pytest.raises(ValueError):
        mg.PackedWeights.from_awq(np.zeros((64, 3), np.int32), np.zeros((1, 3), np.int32), np.ones((1, 24)),
                                  group_size=32)
    with pytest.raises(TypeError, match="integer"):
        mg.PackedWeights.from_gptq(np.zeros((8, 8)), np.zeros((1, 1), np.int32), np.ones((1, 8)))


@settings(max_examples=40, deadline=None)
@given(w=hnp.arrays(np.float64, st.tuples(st.integers(1, 6), st.sampled_from([8, 16, 24])),
                    elements=st.one_of(st.just(0.0), st.floats(1e-30, 1e6), st.floats(-1e6, -1e-30))),
       fmt=st.sampled_from(mg.FORMATS))
def test_quantize_any_finite_matrix(w, fmt):
    pw = mg.quantize(w, fmt, 8, codebook=CUSTOM if fmt == "codebook" else None)
    wd = pw.dequantize()
    assert np.isfinite(wd).all()
    assert pw.codes.max() < pw.levels
    if fmt in RTN:
        assert (np.abs(wd - w) <= _expand(np.abs(pw.scales), 8) / 2 * (1 + 1e-6)).all()


def test_weights_beyond_float32_range_are_rejected():
    with pytest.raises(ValueError, match="float32"):
        mg.quantize(np.full((2, 8), 1e300), "int4", 8)
    with pytest.raises(ValueError, match="float32"):
        mg.quantize(np.full((2, 8), 1e30), "codebook", 8, codebook=[1e-30, 2e-30])


@pytest.mark.parametrize("fmt, g", [("int4", 32), ("uint4", 64), ("int3", 64), ("int2", 32), ("ternary", 64),
                                    ("nf4", 64), ("fp4", 32), ("fp8_e4m3", 32), ("fp8_e5m2", 64)])
def test_float32_dequantize_is_the_float64_one_rounded(fmt, g):
    """The direct float32 path (table per row and group; per element for fp8 groups shorter
    than the codebook) gives the bits of the float64 result cast to float32, also with
    act-order permutations and zero points."""
    rng = np.random.default_rng(21)
    w = rng.standard_normal((37, 192)) * 3
    pw = mg.quantize(w, fmt, g)
    assert pw.dequantize(np.float32).dtype == np.float32
    np.testing.assert_array_equal(pw.dequantize(np.float32), pw.dequantize().astype(np.float32))
    if pw.levels <= 16:
        perm = rng.permutation(192)
        zeros = rng.uniform(-3, 3, size=pw.scales.shape) if pw.zeros is None else pw.zeros
        pp = mg.PackedWeights.from_arrays(pw.codes, pw.scales * 1.37, zeros, format=fmt, k_perm=perm)
        np.testing.assert_array_equal(pp.dequantize(np.float32), pp.dequantize().astype(np.float32))
        assert pp.dequantize(np.float16).dtype == np.float16
    buf = np.full(pw.shape, np.nan, np.float32)
    assert pw.dequantize(out=buf) is buf
    np.testing.assert_array_equal(buf, pw.dequantize(np.float32))
    buf64 = np.full(pw.shape, np.nan)
    np.testing.assert_array_equal(pw.dequantize(out=buf64), pw.dequantize())


def test_dequantize_out_is_validated():
    pw = mg.quantize(np.random.default_rng(0).standard_normal((8, 64)), "int4", 32)
    with pytest.raises(TypeError, match="out"):
        pw.dequantize(out=np.zeros((8, 64), np.float16))
    with pytest.raises(ValueError, match="shape"):
        pw.dequantize(out=np.zeros((8, 63), np.float32))
    with pytest.raises(ValueError, match="contiguous"):
        pw.dequantize(out=np.zeros((64, 8), np.float32).T)
    with pytest.raises(TypeError, match="out"):
        pw.dequantize(out=[[0.0] * 64] * 8)


# ------------------------------------------------------------------------- float16 scales
@pytest.mark.parametrize("fmt", RTN + ["nf4", "fp4"])
@pytest.mark.parametrize("group_size", [32, 128])
def test_float16_scales_are_the_float16_at_or_above_and_keep_the_half_step_bound(fmt, group_size):
    rng = np.random.default_rng(11)
    w = rng.standard_normal((40, 256)) * rng.uniform(0.01, 30, size=(40, 1))
    p32 = mg.quantize(w, fmt, group_size)
    p16 = mg.quantize(w, fmt, group_size, scale_dtype=np.float16)
    assert p16.scale_dtype == np.float16 and p16.scales.dtype == np.float32
    s16, s32 = p16.scales.astype(np.float64), p32.scales.astype(np.float64)
    np.testing.assert_array_equal(s16.astype(np.float16).astype(np.float64), s16)  # float16 values
    # The smallest float16 at or above the computed scale, whose float32 rounding is s32.
    assert (s16 >= s32).all()
    below = np.nextafter(s16.astype(np.float16), np.float16(0)).astype(np.float64)
    assert (below < s32 * (1 + 2.0**-23)).all()
    if fmt == "fp4":  # powers of two in float16's range: the same scales either way
        assert p32.scale_dtype == np.float16
        np.testing.assert_array_equal(s16, s32)
    if fmt in RTN:  # codes are rounded against the stored scale
        assert (np.abs(p16.dequantize() - w) <= _expand(s16, group_size) / 2 * (1 + 1e-6)).all()
    x = rng.standard_normal((256, 3)).astype(np.float32)
    np.testing.assert_allclose(mg.msgemm(p16, x, table="f32"), p16.dequantize() @ x, rtol=1e-4, atol=1e-3)
    p2 = pickle.loads(pickle.dumps(p16))
    assert p2.scale_dtype == np.float16 and "float16 scales" in repr(p2)


def test_scale_dtype_of_loaded_and_hand_built_weights():
    codes = np.zeros((4, 64), np.uint8)
    half = np.full((4, 2), 0.1, np.float16).astype(np.float32)  # float16 values, e.g. GPTQ's scales
    assert mg.PackedWeights.from_arrays(codes, half, format="int4").scale_dtype == np.float16
    assert mg.PackedWeights.from_arrays(codes, np.full((4, 2), 0.1, np.float32), format="int4").scale_dtype == np.float32
    assert mg.PackedWeights.from_arrays(codes, np.full((4, 2), 1e5, np.float32), format="int4").scale_dtype == np.float32


def test_float16_scale_errors():
    w = np.random.default_rng(0).standard_normal((3, 64))
    with pytest.raises(ValueError, match=r"row 1, group 0 \([0-9.]+e5\) overflows float16"):
        mg.quantize(w * np.array([[1.0], [1e6], [1.0]]), "int4", 32, scale_dtype=np.float16)
    with pytest.raises(ValueError, match="overflows float16"):  # MX scale 2^16
        mg.quantize(np.full((2, 32), 2.0**18), "fp4", 32, scale_dtype=np.float16)
    with pytest.raises(ValueError, match="beyond float32"):  # not float16's fault
        mg.quantize(np.full((2, 32), 1e300), "int4", 32, scale_dtype=np.float16)
    with pytest.raises(ValueError, match="below float16"):  # MX scale 2^-32
        mg.quantize(w * 2.0**-30, "fp4", 32, scale_dtype=np.float16)
    assert mg.quantize(w * 2.0**-30, "fp4", 32).scale_dtype == np.float32
    with pytest.raises(ValueError, match="scale_dtype"):
        mg.quantize(w, "int4", 32, scale_dtype=np.float64)
    for bad in ["half-ish", None, "f2,,", object()]:
        with pytest.raises(TypeError, match="scale_dtype"):
            mg.quantize(w, "int4", 32, scale_dtype=bad)
