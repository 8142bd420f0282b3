"""fp8 weights in ``f32`` mode: codes decoded in registers, no tables (``rust/msgemm/src/float8.rs``).

Oracles: the documented arithmetic replayed in numpy (per row, column and 16 lanes, group
sums ``p = fma(v, x, p)`` in ascending input order, group totals ``t = fma(s, p, t)``, then the
fixed tree of the 16 lanes), where each fused multiply-add is evaluated in float64 and rounded
once to float32: the products (fp8 times float32, float32 times float32) are exact in float64,
and so is the sum wherever its bits span at most 53 (elsewhere the two roundings could differ
from one only where the float64 sum lands exactly halfway between two float32 values; these
seeded data never do: a review replayed them with a correctly rounded fma, same bits), so the
kernels must give its bits; and the float64 product of the dequantized weights, within the bound
``(G/16 + K/G + 5) 2^-24 (|Wd| @ |x|)``.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import maleki_rs.msgemm as mg

FORMATS = ["fp8_e4m3", "fp8_e5m2"]
#: Whether this machine has a kernel for default fp8 calls (AVX-512 or AVX2 on x86-64, any
#: Arm64 CPU): group size 32, which every such kernel takes.
PROBE = mg.quantize(np.ones((1, 32)), "fp8_e4m3", 32)
HAS_PATH = mg.plan_info(PROBE)["fp8_kernel"] is not None
needs_path = pytest.mark.skipif(not HAS_PATH, reason="no fp8 kernel on this CPU")


def weights(fmt: str, m: int, k: int, g: int, seed: int) -> mg.PackedWeights:
    """Gaussian weights over a few binades (subnormal codes occur too), quantized."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((m, k)) * np.array([1.0, 1e-3, 30.0])[np.arange(k) % 3]
    return mg.quantize(w, fmt, g)


def definition(pw: mg.PackedWeights, x: np.ndarray) -> np.ndarray:
    """The documented arithmetic, ``x`` (K, N) float32 -> (M, N) float32 (no input permutation)."""
    m, k = pw.shape
    g = pw.group_size
    v = pw.codebook[pw.codes].astype(np.float64)  # (M, K), the exact fp8 values
    s = pw.scales.astype(np.float32).astype(np.float64)  # (M, K/G)
    xd = x.astype(np.float64)
    n = x.shape[1]

    def fma(a, b, c):
        return (a * b + c).astype(np.float32).astype(np.float64)

    t = np.zeros((m, n, 16))
    for gi in range(k // g):
        p = np.zeros((m, n, 16))
        for i in range(g):
            j = gi * g + i
            p[:, :, i % 16] = fma(v[:, j, None], xd[None, j, :], p[:, :, i % 16])
        t = fma(s[:, gi, None, None], p, t)
    t = t.astype(np.float32)
    u = t[..., :8] + t[..., 8:]
    w = u[..., :4] + u[..., 4:]
    return (w[..., 0] + w[..., 2]) + (w[..., 1] + w[..., 3])


def bound(pw: mg.PackedWeights, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float64 ``Wd @ x``, the error bound of the arithmetic)."""
    m, k = pw.shape
    wd = pw.dequantize().astype(np.float64)
    xd = x.astype(np.float64)
    u = (pw.group_size / 16 + k / pw.group_size + 5) * 2.0**-24
    return wd @ xd, u * (np.abs(wd) @ np.abs(xd))


@needs_path
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("g,n", [(32, 1), (128, 3), (16, 5), (64, 9)])
def test_default_calls_give_the_definitions_bits(fmt, g, n):
    pw = weights(fmt, 45, 256, g, g + n)
    x = np.random.default_rng(n).standard_normal((256, n)).astype(np.float32)
    info = mg.plan_info(pw, n=n)
    assert info["table"] == "f32" and info["fp8_kernel"] is not None
    y = mg.msgemm(pw, x)
    np.testing.assert_array_equal(y.view(np.uint32), definition(pw, x).view(np.uint32))
    exact, b = bound(pw, x)
    assert np.all(np.abs(y - exact) <= b)


@needs_path
@pytest.mark.parametrize("fmt", FORMATS)
def test_accuracy_is_float32s_not_the_tables(fmt):
    """Relative L1 error on Gaussian 512 x 2048: float32 rounding (about 1e-7), where the
    default ``i8`` tables gave about 7e-3."""
    pw = weights(fmt, 512, 2048, 128, 1)
    x = np.random.default_rng(2).standard_normal(2048).astype(np.float32)
    exact = pw.dequantize().astype(np.float64) @ x.astype(np.float64)
    rel = lambda y: np.abs(y - exact).sum() / np.abs(exact).sum()  # noqa: E731
    assert rel(mg.msgemm(pw, x)) < 1e-6
    assert rel(mg.msgemm(pw, x, table="i8")) > 1e-4
    assert mg.plan_info(pw, table="i8")["fp8_kernel"] is None


@needs_path
def test_every_backend_and_entry_point_gives_the_same_bits():
    pw = weights("fp8_e4m3", 130, 512, 64, 3)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((512, 6)).astype(np.float32)
    want = mg.msgemm(pw, x)
    backends = [b for b in ("avx512", "avx2", "neon") if mg.backend_supports(pw, b, n=6, table="f32")]
    assert backends
    for b in backends:
        assert mg.plan_info(pw, n=6, table="f32", backend=b)["fp8_kernel"] is not None
        np.testing.assert_array_equal(mg.msgemm(pw, x, table="f32", backend=b), want)
    for threads in (1, 2, 3):
        np.testing.assert_array_equal(mg.msgemm(pw, x, threads=threads), want)
    np.testing.assert_array_equal(mg.msgemm(pw, np.asfortranarray(x)), want)
    np.testing.assert_array_equal(mg.linear(x.T.reshape(2, 3, 512), pw).reshape(6, 130).T, want)
    for c in range(6):
        np.testing.assert_array_equal(mg.msgemm(pw, x[:, c]), want[:, c])
    # A view with a stride: the same values.
    wide = np.zeros((512, 12), np.float32)
    wide[:, ::2] = x
    np.testing.assert_array_equal(mg.msgemm(pw, wide[:, ::2]), want)


@needs_path
def test_odd_group_sizes_run_where_a_kernel_takes_them():
    """AVX-512 takes any group size (masked tails); elsewhere ``f32`` calls of groups that are
    not multiples of 16 run on the float32 tables. Either way within the tables' bound."""
    pw = weights("fp8_e5m2", 33, 120, 24, 5)
    x = np.random.default_rng(6).standard_normal((120, 2)).astype(np.float32)
    y = mg.msgemm(pw, x, table="f32")
    if mg.plan_info(pw, n=2, table="f32")["fp8_kernel"] is not None:
        np.testing.assert_array_equal(y, definition(pw, x))
    exact = pw.dequantize().astype(np.float64) @ x.astype(np.float64)
    tables_bound = 2 * (120 + 4) * 2.0**-24 * (np.abs(pw.dequantize()) @ np.abs(x))
    assert np.all(np.abs(y - exact) <= tables_bound)


@pytest.mark.parametrize("fmt,zero_code", [("fp8_e4m3", 0), ("nf4", 7), ("uint4", 0)])
def test_zero_points_of_weights_whose_codes_are_all_zero(fmt, zero_code):
    """fp8 weights with zero points stay on the tables. Every table kernel keeps the zero term
    of a group whose looked-up entries are all 0 (codes of value 0 only): ``i8`` tables once
    dropped it there (fp8 and nf4 gave 0 instead of ``-z s sum x``)."""
    codes = np.full((2, 32), zero_code, np.uint8)
    pw = mg.PackedWeights.from_arrays(codes, np.ones((2, 2)), np.full((2, 2), 0.5), format=fmt)
    assert fmt != "fp8_e4m3" or mg.plan_info(pw)["fp8_kernel"] is None
    x = np.arange(32, dtype=np.float32) - 5
    want = pw.dequantize().astype(np.float64) @ x
    runs = 0
    for table in ("i8", "f32"):
        for b in mg.available_backends():
            if mg.backend_supports(pw, b, table=table):
                runs += 1
                # (``i8`` tables round uint4's shifted entries: within 1%.)
                rtol = 1e-2 if table == "i8" else 1e-6
                np.testing.assert_allclose(mg.msgemm(pw, x, table=table, backend=b), want, rtol=rtol)
    assert runs >= 3


@pytest.mark.parametrize("fmt,table", [("nf4", None), ("uint4", "i8")])
def test_subnormal_table_entries_with_zero_points_stay_finite(fmt, table):
    """A group whose largest table entry is subnormal (one subnormal activation) gets an int8
    scale that underflows to 0; its block adds 0 (zero term included, as small as the entry),
    not NaN: a regression of the all-zero fix, found in review."""
    rng = np.random.default_rng(0)
    codes = mg.quantize(rng.standard_normal((64, 256)), fmt, 64).codes
    pw = mg.PackedWeights.from_arrays(codes, np.ones((64, 4)), np.full((64, 4), 0.25), format=fmt)
    x = rng.standard_normal(256).astype(np.float32)
    x[64:128] = 0
    x[70] = 1e-45
    y = mg.msgemm(pw, x, table=table)
    exact = pw.dequantize().astype(np.float64) @ x.astype(np.float64)
    np.testing.assert_allclose(y, exact, rtol=0.02, atol=0.05 * np.abs(exact).max())


@needs_path
def test_inputs_beyond_two_to_the_120_keep_the_bits():
    """The e4m3 kernels read ``x 2^8``; larger inputs run on the portable kernel (the same
    arithmetic), and the result stays finite where the products are."""
    cb = mg.codebook("fp8_e4m3")
    small = np.flatnonzero(np.isfinite(cb) & (np.abs(cb) <= 1)).astype(np.uint8)
    codes = small[(np.arange(16 * 64) * 37) % small.size].reshape(16, 64)
    pw = mg.PackedWeights.from_arrays(codes, np.ones((16, 2)), format="fp8_e4m3")
    x = np.random.default_rng(7).standard_normal(64).astype(np.float32)
    x[3], x[9], x[11] = 1.5e36, -2e36, 2.0**120
    y = mg.msgemm(pw, x)
    assert np.all(np.isfinite(y))
    np.testing.assert_array_equal(y, definition(pw, x[:, None])[:, 0])


@needs_path
@settings(max_examples=25, deadline=None)
@given(
    fmt=st.sampled_from(FORMATS),
    m=st.integers(1, 20),
    groups=st.integers(1, 4),
    g=st.sampled_from([16, 32, 48]),
    n=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_random_shapes_give_the_definitions_bits(fmt, m, groups, g, n, seed):
    k = groups * g
    pw = weights(fmt, m, k, g, seed)
    x = np.random.default_rng(seed + 1).standard_normal((k, n)).astype(np.float32)
    y = mg.msgemm(pw, x)
    np.testing.assert_array_equal(y, definition(pw, x))


ml_dtypes = pytest.importorskip("ml_dtypes")


@pytest.mark.parametrize("dtype,fmt", [("float8_e4m3fn", "fp8_e4m3"), ("float8_e5m2", "fp8_e5m2")])
def test_codebooks_are_ml_dtypes_values(dtype, fmt):
    """The codebook of each fp8 format is ml_dtypes' value of every byte (NaN / inf encodings
    read NaN here: they are not weights)."""
    ours = mg.codebook(fmt)
    theirs = np.arange(256, dtype=np.uint8).view(getattr(ml_dtypes, dtype)).astype(np.float32)
    finite = np.isfinite(theirs)
    np.testing.assert_array_equal(np.isfinite(ours), finite)
    np.testing.assert_array_equal(ours[finite], theirs[finite])


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_from_fp8_block_scales(dtype):
    """DeepSeek-V3's layout: fp8 weights and one scale per block of 128 x 128 (M not a
    multiple of the block's rows); the dequantized weights are ``weight * scale`` exactly."""
    rng = np.random.default_rng(3)
    m, k = 300, 256
    w = (rng.standard_normal((m, k)) * 40).astype(getattr(ml_dtypes, dtype))
    s = rng.uniform(1e-4, 1e-2, (3, 2)).astype(np.float32)
    pw = mg.PackedWeights.from_fp8(w, s, block=(128, 128))
    full = np.repeat(np.repeat(s, 128, axis=0)[:m], 128, axis=1).astype(np.float64)
    want = w.astype(np.float64) * full
    np.testing.assert_array_equal(pw.dequantize(), want)
    assert pw.group_size == 128 and pw.format == {"float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}[dtype]
    x = rng.standard_normal(k).astype(np.float32)
    exact = want @ x.astype(np.float64)
    tol = (128 / 16 + 2 + 5) * 2.0**-24 * (np.abs(want) @ np.abs(x.astype(np.float64)))
    assert np.all(np.abs(mg.msgemm(pw, x, table="f32") - exact) <= tol)


def test_from_fp8_scale_shapes_and_bytes():
    rng = np.random.default_rng(4)
    m, k = 6, 64
    w = (rng.standard_normal((m, k)) * 10).astype(ml_dtypes.float8_e4m3fn)
    b = w.view(np.uint8)
    v = w.astype(np.float64)
    per_row = rng.uniform(0.5, 2, m).astype(np.float32)
    groups = rng.uniform(0.5, 2, (m, 4)).astype(np.float32)
    cases = [
        (mg.PackedWeights.from_fp8(w, 0.25), v * 0.25),
        (mg.PackedWeights.from_fp8(w, np.float32(0.25)), v * 0.25),
        (mg.PackedWeights.from_fp8(b, [0.25], format="fp8_e4m3"), v * 0.25),
        (mg.PackedWeights.from_fp8(w, per_row), v * per_row[:, None].astype(np.float64)),
        (mg.PackedWeights.from_fp8(w, per_row[:, None]), v * per_row[:, None].astype(np.float64)),
        (mg.PackedWeights.from_fp8(b.view(np.int8), groups, format="fp8_e4m3"),
         v * np.repeat(groups, 16, axis=1).astype(np.float64)),
    ]
    for pw, want in cases:
        np.testing.assert_array_equal(pw.dequantize(), want)


@pytest.mark.parametrize("call,err", [
    (lambda w, b: mg.PackedWeights.from_fp8(b, 1.0), ValueError),                       # bytes need a format
    (lambda w, b: mg.PackedWeights.from_fp8(w, 1.0, format="fp8_e5m2"), ValueError),    # dtype mismatch
    (lambda w, b: mg.PackedWeights.from_fp8(w.astype(np.float32), 1.0), TypeError),     # not fp8
    (lambda w, b: mg.PackedWeights.from_fp8(b.astype(ml_dtypes.float8_e4m3fnuz), 1.0), TypeError),
    (lambda w, b: mg.PackedWeights.from_fp8(w, np.ones(5)), ValueError),                 # 5 rows of 4
    (lambda w, b: mg.PackedWeights.from_fp8(w, np.ones((4, 3))), ValueError),            # 3 does not divide 64
    (lambda w, b: mg.PackedWeights.from_fp8(w, np.ones((1, 1)), block=(4, 48)), ValueError),   # 48 does not divide 64
    (lambda w, b: mg.PackedWeights.from_fp8(w, np.ones((2, 2)), block=(4, 32)), ValueError),   # wants (1, 2)
    (lambda w, b: mg.PackedWeights.from_fp8(w, np.ones((1, 2)), block=(0, 32)), ValueError),
    (lambda w, b: mg.PackedWeights.from_fp8(w, np.ones((1, 2)), block=4), TypeError),
    (lambda w, b: mg.PackedWeights.from_fp8(w, np.array([1, 2, 3, 4])), TypeError),      # integer scales
    (lambda w, b: mg.PackedWeights.from_fp8(w, np.nan), ValueError),
    (lambda w, b: mg.PackedWeights.from_fp8(np.where(np.arange(64) == 5, np.uint8(0x7F), b), 1.0,
                                            format="fp8_e4m3"), ValueError),           # a NaN encoding
    (lambda w, b: mg.PackedWeights.from_fp8(b[:, :0], 1.0, format="fp8_e4m3"), ValueError),
    (lambda w, b: mg.PackedWeights.from_fp8(b[0], 1.0, format="fp8_e4m3"), ValueError),
])
def test_from_fp8_rejects_bad_input(call, err):
    w = np.ones((4, 64), np.float32).astype(ml_dtypes.float8_e4m3fn)
    with pytest.raises(err):
        call(w, w.view(np.uint8))
