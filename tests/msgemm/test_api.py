"""Oracle 5 (spec section 8.5): determinism across thread counts, input handling (dtypes,
orders, views, out=), and validation: bad inputs give ValueError/TypeError naming the
problem, never a Rust panic."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import maleki_rs
from maleki_rs import msgemm as mg

from .conftest import BACKENDS, dense_gemv_default, integer_weights, integer_x


@pytest.fixture(scope="module")
def pw():
    rng = np.random.default_rng(0)
    return mg.quantize(rng.standard_normal((300, 512)), "int4", 128)


def test_one_and_two_threads_give_identical_bits(pw, one_and_two_threads):
    # A batch and a GEMV (which runs on its caller on 1-2 threads, `threads=` given or not).
    rng = np.random.default_rng(1)
    for x in (rng.standard_normal((512, 7)).astype(np.float32), rng.standard_normal(512).astype(np.float32)):
        n = 1 if x.ndim == 1 else x.shape[1]
        for table in (None, *mg.TABLES):  # None: the library's choice (a batch: `i16` where it runs densely)
            for backend in [b for b in BACKENDS if b != "reference"]:
                if not mg.backend_supports(pw, backend, n=n, table=table):
                    continue  # a SIMD kernel need not implement every precision (KERNELS.md)
                maleki_rs.set_num_threads(1)
                ys = [mg.msgemm(pw, x, table=table, backend=backend)]
                maleki_rs.set_num_threads(2)
                ys.append(mg.msgemm(pw, x, table=table, backend=backend))
                ys += [mg.msgemm(pw, x, table=table, backend=backend, threads=t) for t in (1, 2, 3)]
                bits = [y.view(np.uint32).tolist() for y in ys]
                assert all(b == bits[0] for b in bits), (n, table, backend)


def test_quantize_is_thread_independent(one_and_two_threads):
    w = np.random.default_rng(2).standard_normal((130, 256))
    maleki_rs.set_num_threads(1)
    a = mg.quantize(w, "nf4", 64)
    maleki_rs.set_num_threads(2)
    b = mg.quantize(w, "nf4", 64)
    np.testing.assert_array_equal(a.packed, b.packed)
    np.testing.assert_array_equal(a.scales, b.scales)


def test_any_float_dtype_order_and_view(pw):
    rng = np.random.default_rng(3)
    base = rng.standard_normal((512, 12))
    want = mg.msgemm(pw, np.ascontiguousarray(base[:, ::3], dtype=np.float32), table="f32")
    variants = [
        base[:, ::3],                                   # strided view, float64
        np.asfortranarray(base[:, ::3]).astype(np.float32),  # Fortran order (read without a copy)
        np.asfortranarray(base[:, ::3]),                # Fortran float64
        base[:, ::3].astype(np.float16).astype(np.float64),
    ]
    for x in variants[:3]:
        np.testing.assert_array_equal(mg.msgemm(pw, x, table="f32"), want)
    y16 = mg.msgemm(pw, base[:, ::3].astype(np.float16), table="f32")
    np.testing.assert_array_equal(y16, mg.msgemm(pw, variants[3], table="f32"))
    # vectors and 1-column matrices agree
    v = base[:, 0]
    np.testing.assert_array_equal(mg.msgemm(pw, v, table="f32"), mg.msgemm(pw, v[:, None], table="f32")[:, 0])
    # the weights may come in any order/dtype too
    w = rng.standard_normal((64, 128))
    a = mg.quantize(np.asfortranarray(w), "int4", 32)
    b = mg.quantize(w.astype(np.float32), "int4", 32)
    np.testing.assert_array_equal(a.packed, b.packed)


def test_bfloat16_activations_and_weights():
    # ml_dtypes' bfloat16 (JAX, LLM checkpoints): widened exactly to float32, so the results
    # are those of the float32 copies.
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(4)
    w = rng.standard_normal((96, 256)).astype(ml_dtypes.bfloat16)
    x = rng.standard_normal((3, 256)).astype(ml_dtypes.bfloat16)
    pw = mg.quantize(w, "int4", 64)
    ref = mg.quantize(w.astype(np.float32), "int4", 64)
    np.testing.assert_array_equal(pw.packed, ref.packed)
    np.testing.assert_array_equal(pw.scales, ref.scales)
    want = mg.linear(x.astype(np.float32), pw)
    np.testing.assert_array_equal(mg.linear(x, pw), want)
    np.testing.assert_array_equal(mg.msgemm(pw, x.T), want.T)
    x[1, 7] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        mg.linear(x, pw)
    with pytest.raises(TypeError, match="bfloat16"):
        mg.msgemm(pw, np.zeros(256, ml_dtypes.float8_e4m3fn))


def test_out_and_linear(pw):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((512, 3)).astype(np.float32)
    out = np.full((300, 3), np.nan, dtype=np.float32)
    r = mg.msgemm(pw, x, out=out)
    assert r is out
    np.testing.assert_array_equal(out, mg.msgemm(pw, x))
    o1 = np.empty(300, np.float32)
    mg.msgemm(pw, x[:, 0], out=o1)
    np.testing.assert_array_equal(o1, mg.msgemm(pw, x[:, 0]))
    xb = rng.standard_normal((2, 5, 512))
    y = mg.linear(xb, pw, table="f32")
    assert y.shape == (2, 5, 300) and y.dtype == np.float32
    np.testing.assert_allclose(y, xb @ pw.dequantize().T, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(mg.linear(xb[0, 0], pw, table="f32"), y[0, 0])


def test_linear_adds_a_bias_and_writes_into_out():
    """``linear(x, pw, bias, out=)`` equals the float64 ``x @ Wd.T + bias`` exactly on integer
    data (every sum and the bias addition exact in float32), for every backend, in place in
    ``out`` where given; bad biases and outs raise errors naming them."""
    rng = np.random.default_rng(41)
    pw = integer_weights("int4", rng, 70, 256, 64, zeros=True)
    wd = pw.dequantize()
    bias = rng.integers(-100, 101, size=70).astype(np.float64)
    for shape in [(256,), (3, 256), (2, 4, 256)]:
        x = integer_x(rng, 256, None) if len(shape) == 1 else rng.integers(-8, 9, size=shape).astype(np.float32)
        want = (x.astype(np.float64) @ wd.T + bias).astype(np.float32)
        for backend in BACKENDS:
            if not mg.backend_supports(pw, backend, n=max(1, x.size // 256), table="f32"):
                continue
            got = mg.linear(x, pw, bias, table="f32", backend=backend)
            np.testing.assert_array_equal(got, want, err_msg=f"{shape} {backend}")
            out = np.full(shape[:-1] + (70,), np.nan, np.float32)
            r = mg.linear(x, pw, bias.astype(np.float16), table="f32", backend=backend, out=out)
            assert r is out
            np.testing.assert_array_equal(out, want, err_msg=f"out {shape} {backend}")
        # The default precision, with and without the bias: the bias is one float32 addition.
        plain = mg.linear(x, pw)
        np.testing.assert_array_equal(mg.linear(x, pw, bias=bias), plain + bias.astype(np.float32))
    # out sharing memory with x: x is read before out is written.
    buf = rng.integers(-8, 9, size=(4, 256)).astype(np.float32)
    pw_sq = integer_weights("int4", rng, 256, 256, 64, zeros=False)
    want = (buf.astype(np.float64) @ pw_sq.dequantize().T).astype(np.float32)
    np.testing.assert_array_equal(mg.linear(buf, pw_sq, table="f32", out=buf), want)
    x = np.ones((2, 256), np.float32)
    with pytest.raises(ValueError, match=r"bias: expected shape \(70,\)"):
        mg.linear(x, pw, np.zeros(69))
    with pytest.raises(ValueError, match="bias: expected a 1-D"):
        mg.linear(x, pw, np.zeros((1, 70)))
    with pytest.raises(TypeError, match="bias"):
        mg.linear(x, pw, np.zeros(70, complex))
    with pytest.raises(TypeError, match="bias: .*booleans"):
        mg.linear(x, pw, np.zeros(70, bool))
    with pytest.raises(ValueError, match="bias: contains a non-finite"):
        mg.linear(x, pw, np.full(70, np.nan))
    big = np.full((1, 256), 1e30, np.float32)  # outputs of about 1e31 to 1e33: finite
    y = mg.linear(big, pw, table="f32")[0]
    assert np.isfinite(y).all() and (np.abs(y) > 2.0**104).any()
    edge = np.where(np.abs(y) > 2.0**104, np.sign(y) * np.finfo(np.float32).max, 0).astype(np.float32)
    with pytest.raises(ValueError, match="overflows float32"):
        mg.linear(big, pw, edge, table="f32")
    with pytest.raises(ValueError, match="out: expected shape"):
        mg.linear(x, pw, out=np.zeros((70, 2), np.float32))
    with pytest.raises(TypeError, match="out: expected dtype float32"):
        mg.linear(x, pw, out=np.zeros((2, 70)))
    with pytest.raises(ValueError, match="C-contiguous"):
        mg.linear(x, pw, out=np.zeros((70, 2), np.float32).T)


def test_properties_and_dequantize_dtype(pw):
    assert pw.shape == (300, 512) and pw.format == "int4" and pw.group_size == 128
    assert pw.codebook.dtype == np.float32 and pw.codebook.shape == (16,)
    assert pw.codes.shape == (300, 512) and pw.codes.dtype == np.uint8
    assert pw.scales.shape == (300, 4) and pw.zeros is None
    assert pw.nbytes == 300 * 256 + 300 * 4 * 4
    assert pw.dequantize(np.float32).dtype == np.float32
    with pytest.raises(ValueError):
        pw.scales[0, 0] = 1.0  # read-only views of an immutable object
    with pytest.raises(TypeError):
        pw.dequantize(np.int32)


def test_auto_depth_follows_the_model():
    rng = np.random.default_rng(5)
    small = mg.quantize(rng.standard_normal((64, 128)), "int4", 64)
    _, c = mg.msgemm(small, np.ones(128), count=True)
    assert c["depth"] == 1  # R(1) = 1 > R(2) = 0.4 at M = 64
    big = mg.quantize(rng.standard_normal((4096, 64)), "int4", 64)
    _, c = mg.msgemm(big, np.ones(64), count=True)
    assert c["depth"] == 2
    t = mg.quantize(rng.standard_normal((4096, 60)), "ternary", 60)
    _, c = mg.msgemm(t, np.ones(60), count=True)
    assert c["depth"] == 5


BAD_CALLS = [
    (lambda pw: mg.msgemm(pw, np.ones(511)), ValueError, "x: expected 512"),
    (lambda pw: mg.msgemm(pw, np.ones((0, 3))), ValueError, "x: expected 512 rows"),
    (lambda pw: mg.msgemm(pw, np.ones((512, 0)), count=True), ValueError, "count: an empty batch"),
    (lambda pw: mg.msgemm(pw, np.ones((511, 0))), ValueError, "x: expected 512 rows"),
    (lambda pw: mg.msgemm(pw, np.ones((512, 0)), out=np.empty((300, 1), np.float32)), ValueError, "out"),
    (lambda pw: mg.msgemm(pw, np.ones((512, 0), complex)), TypeError, "floating-point"),
    (lambda pw: mg.linear(np.ones((0, 511)), pw), ValueError, "last dimension"),
    (lambda pw: mg.linear(np.ones((0, 512)), pw, np.zeros(299)), ValueError, "bias: expected shape"),
    (lambda pw: mg.linear(np.ones((0, 512)), pw, out=np.empty((1, 300), np.float32)), ValueError, "out"),
    (lambda pw: mg.linear(np.ones((0, 512)), pw, depth=9), ValueError, "depth"),
    (lambda pw: mg.msgemm(pw, np.full(512, np.nan)), ValueError, "non-finite"),
    (lambda pw: mg.msgemm(pw, np.full(512, 1e39)), ValueError, "non-finite"),
    (lambda pw: mg.msgemm(pw, np.ones(512, dtype=bool)), TypeError, "booleans"),
    (lambda pw: mg.msgemm(pw, np.array(["a"] * 512)), TypeError, "floating-point"),
    (lambda pw: mg.msgemm(pw, np.array([object()] * 512)), TypeError, "floating-point"),
    (lambda pw: mg.msgemm(pw, np.ones(512, dtype=complex)), TypeError, "floating-point"),
    (lambda pw: mg.msgemm(pw, np.ones((512, 2, 2))), ValueError, "1-D or 2-D"),
    (lambda pw: mg.msgemm(pw, None), TypeError, "got None"),
    (lambda pw: mg.msgemm("w", np.ones(512)), TypeError, "PackedWeights"),
    (lambda pw: mg.msgemm(pw, np.ones(512), depth=0), ValueError, "depth"),
    (lambda pw: mg.msgemm(pw, np.ones(512), depth=5), ValueError, "depth"),
    (lambda pw: mg.msgemm(pw, np.ones(512), depth="deep"), ValueError, "depth"),
    (lambda pw: mg.msgemm(pw, np.ones(512), table="i4"), ValueError, "table"),
    (lambda pw: mg.msgemm(pw, np.ones(512), table="auto"), ValueError, "table"),
    (lambda pw: mg.linear(np.ones((2, 512)), pw, table=8), TypeError, "table"),
    (lambda pw: mg.backend_supports(pw, "auto", table=1), TypeError, "table"),
    (lambda pw: mg.msgemm(pw, np.ones(512), backend="cuda"), ValueError, "backend"),
    (lambda pw: mg.msgemm(pw, np.ones(512), backend="reference", table="i8"), ValueError, "f32"),
    (lambda pw: mg.msgemm(pw, np.ones(512), backend="scalar", count=True), ValueError, "count"),
    (lambda pw: mg.msgemm(pw, np.ones(512), threads=0), ValueError, "threads"),
    (lambda pw: mg.msgemm(pw, np.ones(512), out=np.empty(300)), TypeError, "float32"),
    (lambda pw: mg.msgemm(pw, np.ones(512), out=np.empty(299, np.float32)), ValueError, "out"),
    (lambda pw: mg.msgemm(pw, np.ones((512, 2)), out=np.empty((2, 300), np.float32).T), ValueError, "C-contiguous"),
    (lambda pw: mg.msgemm(pw, np.ones(512), mirror="yes"), TypeError, "mirror"),
    (lambda pw: mg.linear(np.ones((3, 500)), pw), ValueError, "last dimension"),
    (lambda pw: mg.quantize(np.ones((4, 100)), "int4", 64), ValueError, "group_size: must divide"),
    (lambda pw: mg.quantize(np.ones((4, 128)), "int5"), ValueError, "format"),
    (lambda pw: mg.quantize(np.ones((4, 128)), "int4", 0), ValueError, "group_size"),
    (lambda pw: mg.quantize(np.ones((4, 128)), "int4", 1.5), TypeError, "group_size"),
    (lambda pw: mg.quantize(np.ones(128), "int4"), ValueError, "2-D"),
    (lambda pw: mg.quantize(np.ones((4, 128), dtype=np.int32), "int4"), TypeError, "floating-point"),
    (lambda pw: mg.quantize(np.full((4, 128), np.inf), "int4"), ValueError, "non-finite"),
    (lambda pw: mg.quantize(np.ones((4, 128)), "codebook"), ValueError, "codebook"),
    (lambda pw: mg.quantize(np.ones((4, 128)), "codebook", codebook=[1.0]), ValueError, "2 to 16"),
    (lambda pw: mg.quantize(np.ones((4, 128)), "codebook", codebook=[1.0, 1.0]), ValueError, "distinct"),
    (lambda pw: mg.quantize(np.ones((4, 128)), "codebook", codebook=[True, False]), TypeError, "numbers"),
    (lambda pw: mg.quantize(np.ones((4, 128)), "codebook", codebook=["a", "b"]), TypeError, "numbers"),
    (lambda pw: mg.quantize(np.ones((4, 128)), "codebook", codebook=[0, 2**25]), ValueError, "2\\^24"),
    (lambda pw: mg.quantize(np.ones((4, 128)), "int4", codebook=[1.0, 2.0]), ValueError, "codebook"),
    (lambda pw: mg.PackedWeights.from_arrays(np.full((2, 4), 16), np.ones((2, 1))), ValueError, "code 16"),
    (lambda pw: mg.PackedWeights.from_arrays(np.zeros((2, 4)), np.ones((2, 1))), TypeError, "integer"),
    (lambda pw: mg.PackedWeights.from_arrays(np.zeros((2, 4), int), np.ones((2, 3))), ValueError, "scales"),
    (lambda pw: mg.PackedWeights.from_arrays(np.zeros((2, 4), int), np.ones((2, 1)), np.ones((2, 2))),
     ValueError, "zeros"),
    (lambda pw: mg.PackedWeights.from_arrays(np.full((1, 2), 0x7F), np.ones((1, 1)), format="fp8_e4m3"),
     ValueError, "not a valid"),
    (lambda pw: mg.PackedWeights.from_arrays(np.zeros((1, 4), int), np.ones((1, 1)), k_perm=[0, 0, 1, 2]),
     ValueError, "permutation"),
    (lambda pw: mg.PackedWeights.from_arrays(np.zeros((1, 4), int), np.full((1, 1), np.nan)), ValueError,
     "non-finite"),
    (lambda pw: mg.PackedWeights(None), TypeError, "built by"),
    (lambda pw: mg.op_counts(0, 128), ValueError, "M"),
    (lambda pw: mg.op_counts(64, 100, group_size=64), ValueError, "group_size"),
    (lambda pw: mg.op_counts(64, 128, format="nf4", mirror=True), ValueError, "mirror"),
    (lambda pw: mg.best_depth(64, 1), ValueError, "V: must be >= 2"),
    (lambda pw: mg.best_depth(64, "codebook"), ValueError, "no fixed number of levels"),
    (lambda pw: mg.msgemm(mg.quantize(np.ones((4, 64)), "nf4", 64), np.ones(64), mirror=True), ValueError,
     "mirror"),
]


@pytest.mark.parametrize("call, exc, msg", BAD_CALLS)
def test_bad_inputs_raise_clear_errors(pw, call, exc, msg):
    with pytest.raises(exc, match=msg):
        call(pw)


def _no_panic(fn):
    try:
        fn()
    except (ValueError, TypeError, OverflowError):
        pass
    except BaseException as exc:  # a PanicException derives from BaseException
        raise AssertionError(f"unexpected {type(exc).__name__}: {exc}") from exc


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(-1, 70), k=st.integers(-1, 70), groups=st.integers(-1, 5), n=st.integers(-1, 4),
    fmt=st.sampled_from(list(mg.FORMATS) + ["bogus"]), depth=st.one_of(st.integers(-2, 12), st.just("auto")),
    table=st.sampled_from([None, "i8", "i16", "f32", "bf16", "x", "auto"]), backend=st.sampled_from(list(mg.BACKENDS) + ["gpu"]),
    mirror=st.booleans(), code=st.integers(-2, 300), value=st.sampled_from([0.0, 1.0, -3.5, np.nan, np.inf, 1e39]),
)
def test_no_input_reaches_a_panic(m, k, groups, n, fmt, depth, table, backend, mirror, code, value):
    def build():
        codes = np.full((max(m, 0), max(k, 0)), code)
        scales = np.full((max(m, 0), max(groups, 0)), 1.0)
        scales.flat[:1] = value
        return mg.PackedWeights.from_arrays(codes, scales, format=fmt,
                                            codebook=[-1.0, 0.5, 2.0] if fmt == "codebook" else None)

    _no_panic(build)
    try:
        w = build()
    except (ValueError, TypeError, OverflowError):
        w = mg.quantize(np.ones((3, 16)), "int4", 16)
    x = np.full((max(k, 0),) if n < 0 else (max(k, 0), n), value)
    _no_panic(lambda: mg.msgemm(w, x, depth=depth, table=table, backend=backend, mirror=mirror))
    _no_panic(lambda: mg.msgemm(w, x, depth=depth, mirror=mirror, count=True))
    _no_panic(lambda: mg.quantize(np.full((max(m, 0), max(k, 0)), value), fmt, groups if groups > 0 else None))
    _no_panic(lambda: mg.op_counts(m, k, max(n, 0), format=fmt, depth=depth, group_size=groups, mirror=mirror))


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_threads_argument_survives_fork(pw):
    import multiprocessing as mp
    import sys

    if sys.platform != "linux":
        pytest.skip("fork start method is Linux-only here")
    x = np.ones(512, np.float32)
    want = mg.msgemm(pw, x, threads=2)
    ctx = mp.get_context("fork")
    with ctx.Pool(1) as p:
        got = p.apply_async(_child_call, (pw, x)).get(timeout=60)
    np.testing.assert_array_equal(got, want)


def _child_call(pw, x):
    return mg.msgemm(pw, x, threads=2)


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
@pytest.mark.parametrize("threads", [1, 2])
def test_default_gemv_survives_fork(pw, threads):
    # A GEMV on 1-2 threads runs on the calling thread and the helper thread. In the child (pw
    # arrives pickled) the first call builds its caches on a pool rebuilt there, the next
    # ones run on the caller and a helper thread started there.
    import multiprocessing as mp
    import sys

    if sys.platform != "linux":
        pytest.skip("fork start method is Linux-only here")
    before = maleki_rs.get_num_threads()
    maleki_rs.set_num_threads(threads)
    try:
        x = np.linspace(-1, 1, 512, dtype=np.float32)
        # The scalar kernel at the depth and table precision the default call resolves to
        # (AVX2 and NEON kernels take other depths than the model's; AMD's AVX-512 GEMVs of
        # large groups run `i16`, whose bits are the same at every depth).
        info = mg.plan_info(pw)
        want = mg.msgemm(pw, x, backend="scalar", depth=info["depth"], table=info["table"])
        np.testing.assert_array_equal(mg.msgemm(pw, x), want)
        ctx = mp.get_context("fork")
        with ctx.Pool(1) as p:
            got = p.apply_async(_child_default_calls, (pw, x)).get(timeout=60)
        for g in got:
            np.testing.assert_array_equal(g, want)
    finally:
        maleki_rs.set_num_threads(before)


def _child_default_calls(pw, x):
    return [mg.msgemm(pw, x) for _ in range(3)]


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
@pytest.mark.parametrize("spin_us", ["0", "100000"])
def test_gemvs_give_the_same_bits_whatever_the_helper_thread_waits(spin_us):
    # The helper thread that takes the second half of 2-thread GEMVs either sleeps after each
    # (0: every call wakes it, or runs both halves on the caller when it is late) or spins
    # through the pauses between calls: the bits are those of the scalar kernel either way.
    # In a forked child (the helper reads MALEKI_RS_SPIN_US when it starts, there: a new
    # process would not run under qemu-user, where the Arm64 tests run).
    import multiprocessing as mp
    import sys

    if sys.platform != "linux":
        pytest.skip("fork start method is Linux-only here")
    with mp.get_context("fork").Pool(1) as p:
        assert p.apply_async(_child_spin_calls, (spin_us,)).get(timeout=120) == []


def _child_spin_calls(spin_us):
    import time

    os.environ["MALEKI_RS_SPIN_US"] = spin_us
    maleki_rs.set_num_threads(2)
    rng = np.random.default_rng(3)
    pw = mg.quantize(rng.standard_normal((700, 512)).astype(np.float32), format="int4", group_size=64)
    x = rng.standard_normal(512).astype(np.float32)
    want = mg.msgemm(pw, x, table="i16", backend="scalar")
    wrong = []
    for i in range(60):
        if i % 3 == 0:
            time.sleep(0.002)
        if not np.array_equal(mg.msgemm(pw, x, table="i16"), want):
            wrong.append(i)
    return wrong


def test_concurrent_gemvs_from_python_threads_give_the_same_bits(pw):
    # One GEMV at a time runs on its calling thread, the others go to the pool: every call
    # gives the bits of a lone call.
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(7)
    xs = [rng.standard_normal(512).astype(np.float32) for _ in range(6)]
    want = [mg.msgemm(pw, x) for x in xs]
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda i: mg.msgemm(pw, xs[i % 6]), range(120)))
    for i, g in enumerate(got):
        np.testing.assert_array_equal(g, want[i % 6])


def test_default_options_fast_path_matches_checked_defaults():
    # msgemm / linear skip the option checks when every option is its default; the values
    # they use must be what the checks return, and explicit defaults must give the same bits.
    from maleki_rs.msgemm import _api

    rng = np.random.default_rng(5)
    x = rng.standard_normal(256).astype(np.float32)
    for fmt in ("int4", "uint4", "int2", "fp4", "nf4"):
        pw = mg.quantize(rng.standard_normal((40, 256)).astype(np.float32), format=fmt, group_size=64)
        assert _api._check_opts(pw, "auto", None, "auto", None, False, False) == _api._DEFAULTS
        y = mg.msgemm(pw, x)
        np.testing.assert_array_equal(y, mg.msgemm(pw, x, depth="auto", table=None, backend="auto", mirror=False))
        # What the default GEMV runs: `i8` tables, or the dense `i16` path by the rule.
        table = "i16" if dense_gemv_default(pw) else "i8"
        np.testing.assert_array_equal(y, mg.msgemm(pw, x, table=table))
        np.testing.assert_array_equal(mg.linear(x[None], pw)[0], y)


def test_fused_dequantize_gemv_anchor():
    # The benchmark's A2 anchor (a private binding): the float32-dequantized product, within
    # float32 accumulation error; 4-bit packings only; bad x rejected.
    fused = maleki_rs._core.msgemm.fused_gemv
    rng = np.random.default_rng(11)
    x = rng.standard_normal(256).astype(np.float32)
    for fmt, g in (("int4", 128), ("uint4", 64), ("nf4", 32), ("fp4", 32)):
        pw = mg.quantize(rng.standard_normal((50, 256)).astype(np.float32), format=fmt, group_size=g)
        wd = pw.dequantize(np.float32).astype(np.float64)
        ref = wd @ x.astype(np.float64)
        tol = 1e-5 * (np.abs(wd) @ np.abs(x.astype(np.float64)))
        assert np.all(np.abs(fused(pw._raw, x) - ref) <= tol), fmt
    with pytest.raises(ValueError, match="4-bit codes only"):
        fused(mg.quantize(np.ones((4, 64), np.float32), format="int2", group_size=32)._raw, x[:64])
    pw = mg.quantize(np.ones((4, 64), np.float32), format="int4", group_size=32)
    with pytest.raises(ValueError, match="x"):
        fused(pw._raw, x[:63])
    with pytest.raises(ValueError, match="non-finite"):
        fused(pw._raw, np.full(64, np.nan, np.float32))
    with pytest.raises(TypeError):
        fused(pw._raw, np.ones(64, np.float64))
