"""The ``bf16`` mode against a float64 oracle of its documented arithmetic.

Oracle: the weights ``bf16(float32(v[q] - z) * s)`` and activations ``bf16(x)`` rounded in
numpy (round to nearest even on the float32 bits), their products summed in float64 in
packed column order. The kernels sum in float32, so they may differ from it by at most
``K 2^-24 sum |w a|`` (a rounding per addition), which is the bound checked here; against
the exact ``Wd @ x`` each product adds at most ``2^-8 + 2^-16`` relative (two roundings).
The AMX and AVX-512 BF16 kernels do not round as the scalar one does (each unit's own order
of additions), so each is held to the bound, not to its bits. The AVX-512 and AVX2 FMA kernels
add as the scalar one does (FMA, whose product of two bfloat16 values is exact), and are held
to its bits too where no product falls below float32's normal range.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import maleki_rs
import maleki_rs.msgemm as mg

from .conftest import CUSTOM, bf16_kernels, dense_to_bf16_min_n

#: The backends of the mode on this machine (AMX where the CPU has AMX-BF16, AVX-512 where
#: it has AVX-512 F, AVX2 where it has AVX2 and FMA).
PROBE = mg.quantize(np.ones((1, 32)), "nf4", 32)
KERNELS = [b for b in ("scalar", "amx", "avx512", "avx2") if mg.backend_supports(PROBE, b, n=2, table="bf16")]
#: The kernel each of them runs here (backend -> plan_info's ``bf16_kernel``), by the
#: documented rule, from numpy's CPU detection.
KERNEL_IDS = bf16_kernels()

#: The documented thresholds of default batches in ``bf16`` mode, per kernel.
MIN_N_OF = {"amx-tdpbf16ps": 6, "avx512-fma": 8, "avx512-vdpbf16ps": 8, "avx2-fma": 16}
#: The same per backend of this machine.
MIN_N = {b: MIN_N_OF[KERNEL_IDS[b]] for b in KERNELS if b != "scalar"}
#: The fewest columns of a default batch in ``bf16`` mode on backend "auto" (its kernel's
#: threshold), None where the default never takes it.
AUTO_MIN_N = next((MIN_N[b] for b in ("amx", "avx512", "avx2") if b in KERNELS), None)
#: The kernels that add in the scalar kernel's order.
SCALAR_ORDER = {"avx512-fma", "avx2-fma", "scalar"}


def bf16(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), as float32."""
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def oracle(pw: mg.PackedWeights, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float64 product of the bfloat16 operands, bound of the float32 sums); x (K, N)."""
    m, k = pw.shape
    g = pw.group_size
    vals = np.zeros(max(16, pw.levels), np.float32)
    vals[: pw.levels] = pw.codebook
    v = vals[pw.codes]
    s = np.repeat(pw.scales.astype(np.float32), g, axis=1)
    z = np.zeros_like(s) if pw.zeros is None else np.repeat(pw.zeros.astype(np.float32), g, axis=1)
    w = bf16((v - z) * s).astype(np.float64)  # float32 operations, then one rounding
    xp = x if pw.k_perm is None else x[pw.k_perm.astype(np.int64)]
    a = bf16(xp).astype(np.float64)
    return w @ a, k * 2.0**-24 * 1.01 * (np.abs(w) @ np.abs(a))


def weights(fmt: str, rng: np.random.Generator, m: int, k: int, g: int, *, perm: bool = False):
    w = rng.standard_normal((m, k))
    if fmt == "codebook":
        pw = mg.quantize(w, "codebook", g, codebook=CUSTOM)
    else:
        pw = mg.quantize(w, fmt, g)
    if perm:
        kp = rng.permutation(k)
        pw = mg.PackedWeights.from_arrays(pw.codes, pw.scales, zeros=pw.zeros, format=fmt,
                                          codebook=CUSTOM if fmt == "codebook" else None, k_perm=kp)
    return pw


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("fmt,m,k,g,n,perm", [
    ("nf4", 70, 256, 64, 5, False),
    ("nf4", 1, 64, 32, 1, False),
    ("nf4", 130, 192, 64, 17, True),
    ("fp4", 64, 128, 32, 16, False),
    ("uint4", 33, 256, 128, 3, False),     # zero points
    ("int4", 65, 128, 128, 33, False),
    ("codebook", 40, 96, 32, 2, False),
    ("int2", 20, 128, 64, 4, False),
    ("ternary", 9, 160, 32, 6, False),
    # Groups of 8 and 16 inputs split the AMX kernel's steps of 32 (GGUF's Q2_K, Q3_K, NVFP4).
    ("uint2", 50, 256, 16, 33, False),
    ("int3", 70, 128, 16, 7, True),
    ("fp4", 64, 64, 16, 16, False),
    ("nf4", 66, 96, 8, 3, False),
])
def test_matches_the_float64_oracle_within_the_float32_bound(kernel, fmt, m, k, g, n, perm):
    rng = np.random.default_rng(m * k + n)
    pw = weights(fmt, rng, m, k, g, perm=perm)
    x = rng.standard_normal((k, n)).astype(np.float32)
    want, bound = oracle(pw, x)
    got = mg.msgemm(pw, x, table="bf16", backend=kernel)
    assert got.dtype == np.float32 and got.shape == (m, n)
    assert np.all(np.abs(got - want) <= bound), np.max(np.abs(got - want) - bound)
    # Any order of x, the vector form and linear's (B, M) outputs: the same bits.
    np.testing.assert_array_equal(mg.msgemm(pw, np.asfortranarray(x), table="bf16", backend=kernel), got)
    np.testing.assert_array_equal(mg.linear(x.T, pw, table="bf16", backend=kernel), got.T)
    np.testing.assert_array_equal(mg.msgemm(pw, x[:, 0], table="bf16", backend=kernel), got[:, 0])


def test_is_more_accurate_than_i8_tables_on_gaussian_data():
    """Relative L1 errors against the exact float64 product (figures quoted in the docs)."""
    rng = np.random.default_rng(1)
    pw = mg.quantize(rng.standard_normal((512, 2048)), "nf4", 64)
    x = rng.standard_normal((2048, 4)).astype(np.float32)
    ref = pw.dequantize() @ x
    rel = {t: np.abs(mg.msgemm(pw, x, table=t) - ref).sum() / np.abs(ref).sum() for t in ("i8", "bf16")}
    assert rel["bf16"] < 3e-3
    assert rel["bf16"] < rel["i8"] / 2


@settings(max_examples=30, deadline=None)
@given(fmt=st.sampled_from(["nf4", "fp4", "uint4", "int3", "codebook"]), g=st.sampled_from([8, 16, 32, 64, 96]),
       m=st.integers(1, 140), groups=st.integers(1, 3), n=st.integers(1, 35),
       scale=st.sampled_from([1e-15, 1.0, 1e15]), seed=st.integers(0, 2**31 - 1))
def test_any_shape_and_scale(fmt, g, m, groups, n, scale, seed):
    rng = np.random.default_rng(seed)
    k = max(g, 32) * groups  # K a multiple of 32
    pw = weights(fmt, rng, m, k, g)
    x = (rng.standard_normal((k, n)) * scale).astype(np.float32)
    want, bound = oracle(pw, x)
    for kernel in KERNELS:
        got = mg.msgemm(pw, x, table="bf16", backend=kernel)
        assert np.all(np.abs(got - want) <= bound + 2.0**-120), kernel


def test_threads_do_not_change_the_bits(one_and_two_threads):
    rng = np.random.default_rng(2)
    pw = weights("nf4", rng, 300, 256, 64)
    x = rng.standard_normal((256, 21)).astype(np.float32)
    for kernel in KERNELS:
        maleki_rs.set_num_threads(1)
        a = mg.msgemm(pw, x, table="bf16", backend=kernel)
        maleki_rs.set_num_threads(2)
        b = mg.msgemm(pw, x, table="bf16", backend=kernel, threads=3)
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_default_batches_of_float_codebooks_take_it_where_a_fast_kernel_runs_it():
    pw = mg.quantize(np.random.default_rng(3).standard_normal((64, 256)), "nf4", 64)
    # As many columns as the highest threshold.
    x = np.random.default_rng(4).standard_normal((256, max(MIN_N_OF.values()))).astype(np.float32)
    for n in (2, 5, 6, 7, 8, 11, 12, 15, 16, 40):
        info = mg.plan_info(pw, n=n)
        assert info["dense_bf16"] == (AUTO_MIN_N is not None and n >= AUTO_MIN_N), n
    assert mg.plan_info(pw, n=1)["dense_bf16"] is False  # a GEMV stays on i8 tables
    assert mg.plan_info(pw, n=8, table="bf16")["table"] == "bf16"
    # Integer formats keep the exact dense i16 path ...
    pi = mg.quantize(np.random.default_rng(3).standard_normal((64, 256)), "int4", 64)
    assert mg.plan_info(pi, n=12)["dense_bf16"] is False
    assert mg.plan_info(pi, n=64)["dense_bf16"] is False
    # ... except small groups, whose per-group epilogue costs more than decoding to bfloat16
    # (documented at dense_to_bf16_min_n): on AMX groups of 16 from 8 columns and of 32 from
    # 32; on AMD's vdpbf16ps kernel groups of 16 from 24 and of 32 from 48 (Zen 4: of 16 from 32); on the AVX-512 FMA
    # and AVX2 kernels groups of 16 from 32.
    def rule(backend: str, g: int) -> int | None:
        if backend == "auto":
            backend = next((b for b in ("amx", "avx512", "avx2") if b in KERNELS), "scalar")
        kernel = KERNEL_IDS.get(backend) if backend in KERNELS else None
        return dense_to_bf16_min_n(kernel, g)

    for fmt, g in (("int4", 32), ("uint4", 32), ("fp4", 32), ("uint2", 16), ("int3", 16), ("fp4", 16)):
        small = mg.quantize(np.random.default_rng(5).standard_normal((64, 256)), fmt, g)
        for backend in ("auto", "avx512", "avx2"):
            if not mg.backend_supports(small, backend, n=2, table="i16"):
                continue
            min_n = rule(backend, g)
            for n in (2, 3, 4, 7, 8, 11, 12, 23, 24, 31, 32, 47, 48, 64):
                info = mg.plan_info(small, n=n, backend=backend)
                dense = mg.plan_info(small, n=n, backend=backend, table="i16")["dense_int8"]
                switch = dense and min_n is not None and n >= min_n
                assert info["dense_bf16"] == switch, (fmt, g, backend, n)
                assert info["dense_int8"] == (dense and not switch), (fmt, g, backend, n)
        if rule("auto", g) is not None:
            xs = np.random.default_rng(6).standard_normal((256, 64)).astype(np.float32)
            np.testing.assert_array_equal(mg.msgemm(small, xs), mg.msgemm(small, xs, table="bf16"))
    if AUTO_MIN_N is not None:
        np.testing.assert_array_equal(mg.msgemm(pw, x), mg.msgemm(pw, x, table="bf16"))
        np.testing.assert_array_equal(mg.linear(x.T, pw), mg.msgemm(pw, x, table="bf16").T)
    # Named backends: "amx" from 6 columns, "avx512" from 8, "avx2" from 16, on their own
    # kernels.
    for kernel, min_n in MIN_N.items():
        if kernel not in KERNELS:
            continue
        # Below, "amx" has no tables to run (its other mode is the dense int8 path).
        assert mg.backend_supports(pw, kernel, n=min_n - 1) == (kernel != "amx")
        for n in (min_n - 1, min_n)[kernel == "amx":]:
            info = mg.plan_info(pw, n=n, backend=kernel)
            assert info["dense_bf16"] == (n >= min_n) and info["backend"] == kernel, (kernel, n)
        y = mg.msgemm(pw, x, backend=kernel)
        np.testing.assert_array_equal(y, mg.msgemm(pw, x, table="bf16", backend=kernel))


@pytest.mark.parametrize("kernel", [b for b in KERNELS if KERNEL_IDS[b] in SCALAR_ORDER and b != "scalar"])
def test_the_fma_kernels_give_the_scalar_kernels_bits(kernel):
    rng = np.random.default_rng(12)
    for fmt, g, n in (("nf4", 64, 19), ("uint4", 32, 3), ("codebook", 96, 1), ("nf4", 32, 13), ("uint2", 16, 5)):
        pw = weights(fmt, rng, 77, 2 * g, g, perm=fmt == "nf4")
        x = rng.standard_normal((2 * g, n)).astype(np.float32)
        a = mg.msgemm(pw, x, table="bf16", backend=kernel)
        b = mg.msgemm(pw, x, table="bf16", backend="scalar")
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_refuses_what_it_does_not_run():
    rng = np.random.default_rng(6)
    with pytest.raises(ValueError, match="K a multiple of 32; got group size 16, K = 48"):
        mg.msgemm(mg.quantize(rng.standard_normal((4, 48)), "nf4", 16), np.ones(48), table="bf16")
    with pytest.raises(ValueError, match="multiples of 8 and K a multiple of 32; got group size 12"):
        mg.msgemm(mg.quantize(rng.standard_normal((4, 96)), "nf4", 12), np.ones(96), table="bf16")
    with pytest.raises(ValueError, match="at most 16 levels"):
        mg.msgemm(mg.quantize(rng.standard_normal((4, 64)), "fp8_e4m3", 32), np.ones(64), table="bf16")
    pw = mg.quantize(rng.standard_normal((4, 64)), "nf4", 32)
    with pytest.raises(ValueError, match="'auto', 'amx', 'avx512', 'avx2' and 'scalar'"):
        mg.msgemm(pw, np.ones(64), table="bf16", backend="neon")
    with pytest.raises(ValueError, match="reference"):
        mg.msgemm(pw, np.ones(64), table="bf16", backend="reference")
    with pytest.raises(ValueError, match="non-finite"):
        mg.msgemm(pw, np.full(64, np.nan), table="bf16")
    with pytest.raises(ValueError, match="overflows"):
        mg.msgemm(pw, np.full((64, 2), 3e38), table="bf16")
    if "amx" not in KERNELS:
        with pytest.raises(ValueError, match="AMX-BF16"):
            mg.msgemm(pw, np.ones(64), table="bf16", backend="amx")
    if "avx512" not in KERNELS:
        with pytest.raises(ValueError, match="AVX-512 F"):
            mg.msgemm(pw, np.ones(64), table="bf16", backend="avx512")
    if "avx2" not in KERNELS:
        with pytest.raises(ValueError, match="AVX2, FMA"):
            mg.msgemm(pw, np.ones(64), table="bf16", backend="avx2")


def test_prepare_builds_the_dense_layout_ahead():
    rng = np.random.default_rng(8)
    pw = mg.quantize(rng.standard_normal((96, 256)), "nf4", 64)
    x = rng.standard_normal((256, 7)).astype(np.float32)
    want = mg.msgemm(pw, x, table="bf16")
    pw.clear_cache()
    before = pw.cache_nbytes
    assert pw.prepare(table="bf16") is pw
    assert pw.cache_nbytes > before
    np.testing.assert_array_equal(mg.msgemm(pw, x, table="bf16"), want)


def test_plan_info_names_the_kernel_and_prepare_builds_what_the_default_batch_reads():
    rng = np.random.default_rng(9)
    pw = mg.quantize(rng.standard_normal((96, 256)), "nf4", 64)
    # Each backend's kernel is the documented rule's for this CPU, "auto" the first of them.
    assert set(KERNELS) == set(KERNEL_IDS)
    for kernel in KERNELS:
        info = mg.plan_info(pw, n=3, table="bf16", backend=kernel)
        assert (info["table"], info["backend"], info["dense_bf16"], info["dense_int8"]) == ("bf16", kernel, True, False)
        assert info["bf16_kernel"] == KERNEL_IDS[kernel]
        assert info["scalar_order"] == (KERNEL_IDS[kernel] in SCALAR_ORDER)
    first = next(b for b in ("amx", "avx512", "avx2", "scalar") if b in KERNELS)
    assert mg.plan_info(pw, n=3, table="bf16")["bf16_kernel"] == KERNEL_IDS[first]
    info = mg.plan_info(pw, n=3, table="i8")
    assert (info["bf16_kernel"], info["scalar_order"]) == (None, None)
    pw.prepare()
    built = pw.cache_nbytes
    mg.msgemm(pw, rng.standard_normal((256, 8)).astype(np.float32))
    mg.msgemm(pw, rng.standard_normal(256).astype(np.float32))
    assert pw.cache_nbytes == built
