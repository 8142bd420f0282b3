"""Half tables (mirror symmetry) chosen by the library and asked for by the user.

Oracle: the plain plan's result computed by the scalar kernel (which never folds), bit for bit,
and the float64 dequantized product."""

from __future__ import annotations

import numpy as np
import pytest

from maleki_rs import msgemm as mg

from .conftest import BACKENDS, dense_gemv_default

# (format, group size, quantize kwargs): weights whose i8 tables the library may halve.
CASES = [
    ("int4", 128, {}),
    ("int4", 32, {}),
    ("int3", 64, {}),
    ("int2", 64, {}),
    ("fp4", 32, {}),
    ("uint4", 128, {"symmetric": False}),
    ("ternary", 60, {}),
]


def _weights(fmt: str, g: int, kw: dict, m: int = 200, seed: int = 0) -> mg.PackedWeights:
    rng = np.random.default_rng(seed)
    return mg.quantize(rng.standard_normal((m, 4 * g)), fmt, g, **kw)


@pytest.mark.parametrize("fmt,g,kw", CASES)
@pytest.mark.parametrize("n", [1, 5])
def test_default_call_gives_the_scalar_plain_bits(fmt, g, kw, n):
    # The default options with `i8` tables (what a default GEMV runs; default batches of
    # integer formats run densely, see test_bounds).
    pw = _weights(fmt, g, kw)
    x = np.random.default_rng(n).standard_normal((pw.shape[1], n)).astype(np.float32)
    info = mg.plan_info(pw, n=n, table="i8")
    d = info["depth"]  # the default call's (an "auto" depth may differ between backends)
    want = mg.msgemm(pw, x, depth=d, backend="scalar")
    assert not mg.plan_info(pw, n=n, depth=d, backend="scalar")["half_tables"]
    for bk in BACKENDS:
        if bk in ("reference", "scalar") or not mg.backend_supports(pw, bk, n=n, depth=d):
            continue
        np.testing.assert_array_equal(mg.msgemm(pw, x, depth=d, backend=bk), want, err_msg=bk)
    np.testing.assert_array_equal(mg.msgemm(pw, x, table="i8"), want)
    if n == 1 and not dense_gemv_default(pw):
        np.testing.assert_array_equal(mg.msgemm(pw, x), want)
    elif n == 1:  # AMD's AVX-512 VNNI GEMVs of large groups: the `i16` bits
        np.testing.assert_array_equal(mg.msgemm(pw, x), mg.msgemm(pw, x, table="i16", backend="scalar"))
    if "avx512" in BACKENDS and not (fmt == "ternary" and d == 5):
        # The AVX-512 kernel reads folded indices for these plans.
        assert info["half_tables"] and info["folded_indices"], info
        assert info["label_space"] == fmt.startswith("int"), info
        assert not info["mirror"]


@pytest.mark.parametrize("table", ["i8", "f32"])
def test_label_space_mirror_equals_the_plain_plan(table):
    # Symmetric int4 never uses -8: mirror=True builds the same table values over
    # sign-magnitude labels, so it gives the plain bits on every backend.
    pw = _weights("int4", 64, {}, m=130, seed=5)
    assert pw.codes.min() >= 1
    x = np.random.default_rng(6).standard_normal(pw.shape[1]).astype(np.float32)
    for bk in BACKENDS:
        if bk == "reference" and table != "f32":
            continue
        if not mg.backend_supports(pw, bk, depth=2, table=table, mirror=True):
            continue
        plain = mg.msgemm(pw, x, depth=2, backend=bk, table=table)
        info = mg.plan_info(pw, depth=2, backend=bk, table=table, mirror=True)
        assert info["label_space"] and not info["zero_term"] and info["table_entries"] == 128, info
        np.testing.assert_array_equal(mg.msgemm(pw, x, depth=2, backend=bk, table=table, mirror=True),
                                      plain, err_msg=bk)


def test_weights_using_the_spare_code_keep_the_shifted_mirror():
    # Codes 0 (-8) present: no label space; the shifted mirror still computes Wd @ x (f32
    # tables: within float32 rounding of the float64 product).
    rng = np.random.default_rng(7)
    codes = rng.integers(0, 16, size=(70, 128), dtype=np.uint8)
    codes[0, 0] = 0
    pw = mg.PackedWeights.from_arrays(codes, rng.uniform(0.1, 1.0, (70, 4)).astype(np.float32))
    info = mg.plan_info(pw, mirror=True)
    assert not info["label_space"] and info["zero_term"], info
    x = rng.standard_normal(128).astype(np.float32)
    ref = pw.dequantize() @ x.astype(np.float64)
    for bk in BACKENDS:
        if not mg.backend_supports(pw, bk, table="f32", mirror=True):
            continue
        y = mg.msgemm(pw, x, backend=bk, table="f32", mirror=True)
        bound = 1e-5 * (np.abs(pw.dequantize()) @ np.abs(x)).max()
        np.testing.assert_allclose(y, ref, rtol=0, atol=bound, err_msg=bk)
    # Without mirror the plain plan runs (the shifted mirror's tables hold other values).
    assert not mg.plan_info(pw, table="i8")["half_tables"]


def test_plan_info_validates():
    pw = _weights("int4", 32, {}, m=64)
    with pytest.raises(ValueError, match="n"):
        mg.plan_info(pw, n=0)
    with pytest.raises(ValueError, match="table"):
        mg.plan_info(pw, table="i4")
    with pytest.raises(ValueError, match="mirror"):
        mg.plan_info(mg.quantize(np.ones((64, 32)), "nf4", 32), mirror=True)


@pytest.mark.parametrize("fmt,g,m", [("int4", 128, 64), ("fp4", 32, 256), ("int2", 64, 128), ("ternary", 128, 64)])
def test_auto_depth_is_the_kernels_measured_one_or_the_model(fmt, g, m):
    rng = np.random.default_rng(3)
    pw = mg.quantize(rng.standard_normal((m, 256)), fmt, g)
    # The scalar kernel has no measured preference: the operation-count model decides.
    assert mg.plan_info(pw, n=1, backend="scalar")["depth"] == mg.best_depth(m, fmt, max_depth=MAX_BYTE_DEPTH[fmt])
    auto = mg.plan_info(pw, n=1, table="i8")  # the tables' depth (a default GEMV may be dense)
    if auto["backend"] == "avx512" and fmt in ("int4", "fp4", "int2"):
        # 256-entry tables built in straight-line code: fastest at every M (BENCHMARKS.md).
        assert auto["depth"] == {"int4": 2, "fp4": 2, "int2": 4}[fmt]
    else:
        # The model's best among the depths the SIMD kernel that runs the call implements
        # (AVX2 and NEON: tables of at most 16 entries), its smallest on a tie; all depths on
        # the scalar kernel.
        depths = range(1, MAX_BYTE_DEPTH[fmt] + 1)
        runs = [d for d in depths if mg.backend_supports(pw, auto["backend"], n=1, depth=d)]
        assert runs, auto
        want = max(runs, key=lambda d: mg.model_ratio(m, fmt, d))
        assert auto["depth"] == want
        if auto["backend"] == "scalar":
            assert want == mg.best_depth(m, fmt, max_depth=MAX_BYTE_DEPTH[fmt])
    x = rng.standard_normal(256).astype(np.float32)
    np.testing.assert_array_equal(mg.msgemm(pw, x, table="i8"), mg.msgemm(pw, x, depth=auto["depth"]))


# The deepest depth with byte indices (V^d <= 256), the candidates of depth="auto".
MAX_BYTE_DEPTH = {"int4": 2, "fp4": 2, "int2": 4, "ternary": 5}


@pytest.mark.parametrize("fmt,g", [("int4", 128), ("uint4", 64), ("ternary", 60), ("fp8_e4m3", 32)])
def test_prepare_builds_ahead_and_changes_no_result(fmt, g):
    rng = np.random.default_rng(11)
    w = rng.standard_normal((70, 4 * g))
    kw = {"symmetric": False} if fmt == "uint4" else {}
    cold, warm = mg.quantize(w, fmt, g, **kw), mg.quantize(w, fmt, g, **kw)
    assert warm.prepare() is warm
    x = rng.standard_normal(4 * g).astype(np.float32)
    np.testing.assert_array_equal(mg.msgemm(warm, x), mg.msgemm(cold, x))
    if fmt == "int4":
        # A depth no i8 kernel runs (4096-entry tables) still prepares its layout.
        warm.prepare(3)
        np.testing.assert_array_equal(mg.msgemm(warm, x, depth=3, table="f32"),
                                      mg.msgemm(cold, x, depth=3, table="f32"))
    with pytest.raises(ValueError):
        warm.prepare(0)
