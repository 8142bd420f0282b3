"""Regressions found by an adversarial review of the public API (stop 9): each case compares
with an independent oracle (the result computed without the hazard, the exact model ratio in
rational arithmetic, the loaders' documented layouts) or checks that a clear ValueError names
the problem."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from maleki_rs import msgemm as mg

from .conftest import BACKENDS
from .test_quantize import _pack_along


@pytest.fixture(scope="module")
def pw():
    rng = np.random.default_rng(3)
    return mg.quantize(rng.standard_normal((64, 64)), "int4", 32)


def test_out_may_overlap_x(pw):
    rng = np.random.default_rng(4)
    buf = rng.standard_normal(128).astype(np.float32)
    want = mg.msgemm(pw, buf[:64].copy())
    same = buf[:64].copy()
    np.testing.assert_array_equal(mg.msgemm(pw, same, out=same), want)  # out is x
    part = buf.copy()
    got = mg.msgemm(pw, part[:64], out=part[10:74])  # out overlaps x partly
    np.testing.assert_array_equal(got, want)


def test_result_overflow_is_an_error_not_inf():
    # Wd = -1 everywhere, x[0] = 1e38: the exact result -1e38 is finite, but the table entry
    # v * x = -8e38 is not.
    codes = np.zeros((2, 64), np.uint8)
    p = mg.PackedWeights.from_arrays(codes, np.full((2, 2), 1 / 8, np.float32))
    x = np.zeros(64, np.float32)
    x[0] = 1e38
    assert np.isfinite(p.dequantize() @ x).all()
    for table in ["f32", "i16", "i8"]:
        with pytest.raises(ValueError, match="overflows float32"):
            mg.msgemm(p, x, table=table)
    with pytest.raises(ValueError, match="overflows float32"):
        mg.linear(x[None, :], p)
    # Scaled down, the same call is exact.
    np.testing.assert_array_equal(mg.msgemm(p, x / 2**20, table="f32"), (p.dequantize() @ (x / 2**20)))


def test_fp4_weights_beyond_float32_are_rejected():
    with pytest.raises(ValueError, match="float32"):
        mg.quantize(np.full((2, 64), 1e300), "fp4", 32)
    with pytest.raises(ValueError, match="float32"):
        mg.quantize(np.full((2, 64), 3.5e38), "fp4", 32)
    # The largest float32 still quantizes (scale 2^125, code 6 * 2^125 ~ 2.6e38).
    assert np.isfinite(mg.quantize(np.full((2, 64), 3.4e38), "fp4", 32).dequantize()).all()


def test_backend_supports_agrees_with_what_msgemm_runs():
    rng = np.random.default_rng(5)
    checked = 0
    for fmt, m in [("int4", 3000), ("nf4", 64), ("fp4", 130), ("ternary", 70), ("int2", 64)]:
        p = mg.quantize(rng.standard_normal((m, 64)), fmt, 32)
        x = np.ones(64)
        for backend in BACKENDS:
            for table in ["f32", "i16", "i8"]:
                try:
                    mg.msgemm(p, x, backend=backend, table=table)
                    runs = True
                except ValueError:
                    runs = False
                assert mg.backend_supports(p, backend, table=table) == runs, (fmt, m, backend, table)
                checked += 1
    assert checked >= 30


def _exact_best_depth(m: int, v: int, dmax: int) -> int:
    def ratio(d):
        adds = sum(v**j for j in range(2, d)) + v**d if d >= 2 else 0
        return Fraction(d) / (1 + Fraction(adds, m))
    return max(range(1, dmax + 1), key=lambda d: (ratio(d), -d))


def test_count_model_beyond_64_bits():
    assert mg.best_depth(2**62, 16, max_depth=20) == _exact_best_depth(2**62, 16, 20)
    exact = 17 / (1 + sum(16**j for j in range(2, 17)) / 4096 + 16**17 / 4096)
    assert mg.model_ratio(4096, 16, 17) == pytest.approx(exact, rel=1e-12)
    for m, k, n in [(2**62, 2**20, 2**10), (2**63 - 1, 2**63 - 1, 2**63 - 1)]:
        with pytest.raises(ValueError, match="64-bit"):
            mg.op_counts(m, k, n, group_size=None)


def test_unaligned_and_big_endian_inputs():
    rng = np.random.default_rng(6)
    p = mg.quantize(rng.standard_normal((16, 64)).astype(np.float32), "int4", 32)
    x = rng.standard_normal(64).astype(np.float32)
    buf = bytearray(1) + bytearray(x.tobytes())
    ux = np.frombuffer(buf, np.float32, count=64, offset=1)  # C-contiguous, unaligned
    assert not ux.flags.aligned
    np.testing.assert_array_equal(mg.msgemm(p, ux), mg.msgemm(p, x))
    np.testing.assert_array_equal(mg.msgemm(p, x.astype(">f4")), mg.msgemm(p, x))
    q = rng.integers(0, 16, size=(64, 32))
    qweight = _pack_along(q, 4, 0)
    qzeros = _pack_along(np.full((1, 32), 7), 4, 1)
    s = np.ones((1, 32), np.float32)
    native = mg.PackedWeights.from_gptq(qweight, qzeros, s)
    swapped = mg.PackedWeights.from_gptq(qweight.view(np.uint32).astype(">u4"), qzeros, s)
    np.testing.assert_array_equal(swapped.dequantize(), native.dequantize())


def test_non_finite_x_is_reported_at_the_users_index(pw):
    x = np.ones((64, 3), np.float32, order="F")
    x[5, 1] = np.nan
    with pytest.raises(ValueError, match=r"\(5, 1\)"):
        mg.msgemm(pw, x)
    v = np.ones(64, np.float32)
    v[7] = np.inf
    with pytest.raises(ValueError, match=r"\(7,\)"):
        mg.msgemm(pw, v)
    a = np.ones((2, 3, 64))
    a[1, 2, 9] = np.nan
    with pytest.raises(ValueError, match=r"\(1, 2, 9\)"):
        mg.linear(a, pw)


def test_loaders_check_every_shape():
    rng = np.random.default_rng(7)
    # AWQ, K = 64, M = 16, G = 32: scales (2, 16), qzeros (2, 2)
    qa = rng.integers(0, 2**31, size=(64, 2)).astype(np.int32)
    za = rng.integers(0, 2**31, size=(2, 2)).astype(np.int32)
    sa = np.ones((2, 16), np.float32)
    mg.PackedWeights.from_awq(qa, za, sa, group_size=32)
    with pytest.raises(ValueError, match="scales: expected shape \\(2, 16\\)"):
        mg.PackedWeights.from_awq(qa, za, np.ones((16, 2), np.float32), group_size=32)
    with pytest.raises(ValueError, match="qzeros"):
        mg.PackedWeights.from_awq(qa, za.reshape(4, 1), sa, group_size=32)
    # GPTQ, M = 64, K = 256, G = 64: qzeros (4, 8)
    qw = _pack_along(rng.integers(0, 16, size=(256, 64)), 4, 0)
    qz = _pack_along(rng.integers(0, 15, size=(4, 64)), 4, 1)
    sc = np.ones((4, 64), np.float32)
    mg.PackedWeights.from_gptq(qw, qz, sc, group_size=64)
    with pytest.raises(ValueError, match="qzeros: expected shape \\(4, 8\\)"):
        mg.PackedWeights.from_gptq(qw, qz.T.copy(), sc, group_size=64)
    with pytest.raises(ValueError, match="qzeros"):
        mg.PackedWeights.from_gptq(qw, qz.reshape(-1, 1), sc, group_size=64)
    g_idx = (np.arange(256) // 64).astype(np.int32)
    with pytest.raises(ValueError, match="group_size"):
        mg.PackedWeights.from_gptq(qw, qz, sc, g_idx, group_size=32)
    with pytest.raises(ValueError, match="bits"):
        mg.PackedWeights.from_gptq(qw[:-1], qz, sc, bits=3)
    # MatMulNBits, N = 4, K = 64, block 32: B (4, 2, 16), scales (8,) or (4, 2)
    B = rng.integers(0, 256, size=(4, 2, 16)).astype(np.uint8)
    s = rng.uniform(0.5, 1, size=(4, 2)).astype(np.float32)
    a = mg.PackedWeights.from_matmulnbits(B, s.reshape(-1), K=64, block_size=32)
    b = mg.PackedWeights.from_matmulnbits(B, s, K=64, block_size=32)
    np.testing.assert_array_equal(a.dequantize(), b.dequantize())
    with pytest.raises(ValueError, match="scales"):
        mg.PackedWeights.from_matmulnbits(B, s.T, K=64, block_size=32)
    with pytest.raises(ValueError, match="B: expected shape"):
        mg.PackedWeights.from_matmulnbits(B.reshape(4, 1, 32), s.reshape(-1), K=64, block_size=32)


# Found by the adversarial review of stop 32.


def test_linear_out_may_share_memory_with_bias(pw):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    for backend in [b for b in BACKENDS if mg.backend_supports(pw, b, n=1, table="f32")]:
        b = rng.standard_normal(64).astype(np.float32)
        want = mg.linear(x, pw, b.copy(), table="f32", backend=backend)
        got = mg.linear(x, pw, b, table="f32", backend=backend, out=b.reshape(1, 64))  # out is the bias
        np.testing.assert_array_equal(got, want)


def test_wide_batches_on_weights_of_one_group_are_exact():
    # One group (K = G = 8): the caller runs such batches a column at a time, or hands them
    # to the pool; either way each column is its GEMV. (Batches of thousands of columns used
    # to search their run length one count at a time: seconds per call.)
    rng = np.random.default_rng(9)
    p = mg.PackedWeights.from_arrays(rng.integers(0, 16, (8, 8)), np.ones((8, 1)))
    x = rng.integers(-8, 8, (8, 3000)).astype(np.float32)
    for _ in range(2):  # the second call runs with the weights' caches built
        np.testing.assert_array_equal(mg.msgemm(p, x, table="f32"), p.dequantize() @ x)


def test_float64_weights_beyond_float32_are_rejected():
    with pytest.raises(ValueError, match="beyond float32"):
        mg.quantize(np.full((2, 64), 1e39), "int4", 32)
    big = float(np.finfo(np.float32).max) * 1.5
    with pytest.raises(ValueError, match=r"beyond float32.*\(1, 5\)"):
        mg.quantize(np.where(np.arange(128).reshape(2, 64) == 69, big, 1.0), "nf4", 32)
    # Loaded scales whose weights s * v leave float32: refused by every loader.
    with pytest.raises(ValueError, match=r"scales: row 1, group 0: .* beyond float32"):
        mg.PackedWeights.from_arrays(np.zeros((2, 64), np.uint8), np.array([[1.0], [3e38]]), format="int4")
    with pytest.raises(ValueError, match="beyond float32"):
        mg.PackedWeights.from_arrays(np.zeros((1, 64), np.uint8), np.array([[3e38]]), np.array([[2.0]]),
                                     format="uint4")
    # At the edge: -8 * 4.2e37 = -3.4e38 still fits.
    edge = mg.PackedWeights.from_arrays(np.zeros((1, 64), np.uint8), np.array([[4.2e37]]), format="int4")
    assert np.isfinite(edge.dequantize(np.float32)).all()


def test_integers_beyond_64_bits_name_their_parameter(pw):
    with pytest.raises(ValueError, match="M: must be below 2\\*\\*63"):
        mg.op_counts(2**64, 128)
    with pytest.raises(ValueError, match="M: must be below"):
        mg.best_depth(2**63, 16)
    with pytest.raises(ValueError, match="n: must be below"):
        mg.plan_info(pw, n=2**64)
    with pytest.raises(TypeError, match="V: expected a level count"):
        mg.best_depth(64, True)
    with pytest.raises(TypeError, match="V: expected a level count"):
        mg.best_depth(64, 16.0)


def test_gptq_group_size_minus_one_is_per_channel():
    rng = np.random.default_rng(10)
    qw = _pack_along(rng.integers(0, 16, size=(128, 32)), 4, 0)
    qz = _pack_along(rng.integers(0, 15, size=(1, 32)), 4, 1)
    sc = rng.uniform(0.5, 1, size=(1, 32)).astype(np.float32)
    a = mg.PackedWeights.from_gptq(qw, qz, sc, group_size=-1)
    b = mg.PackedWeights.from_gptq(qw, qz, sc)
    assert a.group_size == b.group_size == 128
    np.testing.assert_array_equal(a.dequantize(), b.dequantize())


def test_dequantize_refuses_an_unaligned_out(pw):
    raw = np.zeros(64 * 64 * 4 + 1, np.uint8)
    out = raw[1:].view(np.float32).reshape(64, 64)
    assert not out.flags.aligned and out.flags.c_contiguous
    with pytest.raises(ValueError, match="aligned"):
        pw.dequantize(np.float32, out=out)
