"""Oracle 1 (spec section 8.1): on integer data with dyadic codebooks, power-of-two scales and
integer zero points every partial sum is exact, so ``msgemm(..., table="f32")`` must equal the
float64 ``pw.dequantize() @ x`` bit for bit, for every format, depth, backend, group size,
column count and ragged M (rows not a multiple of 64), with scales read as float16 and as
float32."""

from __future__ import annotations

import numpy as np
import pytest

from maleki_rs import msgemm as mg

from .conftest import (BACKENDS, EXACT_FORMATS, avx2_kernel, cpu_has, dense_gemv_default, integer_weights,
                       integer_x)

M = 70  # one full 64-row block and a ragged tail
K = 384  # divisible by 32, 64, 128 (and by 3)


def _cases():
    for fmt, depths in EXACT_FORMATS:
        for d in depths:
            yield pytest.param(fmt, d, id=f"{fmt}-d{d}")


@pytest.mark.parametrize("fmt, depth", list(_cases()))
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_f32_tables_reproduce_the_float64_product_exactly(fmt, depth, group_size):
    rng = np.random.default_rng(hash((fmt, depth, group_size)) % 2**32)
    zeros = fmt.startswith("uint") or group_size == 64  # zero points on every format somewhere
    # Float32 scales (row 0 below float16's range) for g = 32, float16 ones otherwise.
    pw = integer_weights(fmt, rng, M, K, group_size, zeros=zeros, f16_scales=group_size != 32)
    wd = pw.dequantize()
    has_mirror = pw.mirror is not None
    for n in (None, 3, 17):
        x = integer_x(rng, K, n)
        want = wd @ x.astype(np.float64)
        assert np.array_equal(want.astype(np.float32).astype(np.float64), want), "test data must be exact"
        want32 = want.astype(np.float32)
        for backend in BACKENDS:
            for mirror in ([False, True] if has_mirror else [False]):
                if not mg.backend_supports(pw, backend, n=1 if n is None else n, depth=depth, table="f32",
                                           mirror=mirror):
                    continue
                y = mg.msgemm(pw, x, depth=depth, table="f32", backend=backend, mirror=mirror)
                assert y.dtype == np.float32 and y.shape == want32.shape
                np.testing.assert_array_equal(y, want32, err_msg=f"{backend} mirror={mirror} n={n}")


@pytest.mark.parametrize("fmt", ["int4", "uint4", "fp4", "int2"])
def test_act_order_weights_are_exact_too(fmt):
    rng = np.random.default_rng(7)
    pw = integer_weights(fmt, rng, 65, 256, 64, zeros=fmt == "uint4", perm=True)
    assert pw.k_perm is not None
    x = integer_x(rng, 256, 5)
    want = (pw.dequantize() @ x.astype(np.float64)).astype(np.float32)
    for backend in BACKENDS:
        if not mg.backend_supports(pw, backend, n=5, depth=pw.natural_depth, table="f32"):
            continue  # e.g. the AVX2 kernel implements tables of <= 16 entries only
        y = mg.msgemm(pw, x, depth=pw.natural_depth, table="f32", backend=backend)
        np.testing.assert_array_equal(y, want, err_msg=backend)
    # linear() takes (B, K) activations and returns (B, M)
    np.testing.assert_array_equal(mg.linear(x.T, pw, table="f32"), want.T)


def test_all_backends_agree_bitwise_in_every_precision_on_random_data():
    rng = np.random.default_rng(11)
    w = rng.standard_normal((200, 512)).astype(np.float32)
    x = rng.standard_normal((512, 6)).astype(np.float32)
    for fmt in ["int4", "uint4", "nf4", "fp4", "int2", "ternary"]:
        pw = mg.quantize(w, fmt, 128)
        for table in ["f32", "i16", "i8"]:
            for mirror in ([False, True] if pw.mirror is not None else [False]):
                try:
                    base = mg.msgemm(pw, x, table=table, backend="scalar", mirror=mirror, depth=pw.natural_depth)
                except ValueError as exc:  # i16 on a non-dyadic codebook
                    assert table == "i16" and fmt == "nf4", exc
                    continue
                for backend in BACKENDS:
                    if not mg.backend_supports(pw, backend, n=6, depth=pw.natural_depth, table=table, mirror=mirror):
                        continue
                    y = mg.msgemm(pw, x, table=table, backend=backend, mirror=mirror, depth=pw.natural_depth)
                    assert y.view(np.uint32).tolist() == base.view(np.uint32).tolist(), (fmt, table, backend)


@pytest.mark.skipif("avx2" not in BACKENDS, reason="the CPU has no AVX2")
@pytest.mark.parametrize("fmt,g,depth", [("int4", 128, 1), ("uint4", 64, 1), ("nf4", 33, 1), ("int2", 64, 2), ("int2", 30, 2), ("int3", 15, 1)])
@pytest.mark.parametrize("n", [1, 3])
def test_avx2_kernel_reads_paired_indices_with_the_scalar_bits(fmt, g, depth, n):
    # What an AVX2-only machine runs: two 4-bit indices per byte, its own table build.
    # Oracles: the scalar kernel bit for bit, and the float64 product within the i8 bound.
    rng = np.random.default_rng(g + n)
    kw = {"symmetric": False} if fmt == "uint4" else {}
    pw = mg.quantize(rng.standard_normal((150, 4 * g)), fmt, g, **kw)
    x = rng.standard_normal((pw.shape[1], n)).astype(np.float32)
    info = mg.plan_info(pw, n=n, depth=depth, backend="avx2")
    assert info["backend"] == "avx2" and info["paired_indices"] and not info["folded_indices"], info
    for mirror in [False, True] if pw.mirror is not None else [False]:
        want = mg.msgemm(pw, x, depth=depth, backend="scalar", mirror=mirror)
        got = mg.msgemm(pw, x, depth=depth, backend="avx2", mirror=mirror)
        assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist(), mirror
    ref = pw.dequantize() @ x.astype(np.float64)
    assert np.abs(got - ref).sum() <= 0.02 * np.abs(ref).sum()


@pytest.mark.skipif("avx2" not in BACKENDS, reason="the CPU has no AVX2")
@pytest.mark.parametrize("fmt,g,dense", [("int4", 128, True), ("int2", 64, True), ("ternary", 128, True),
                                         ("fp4", 32, True), ("int4", 20, False), ("codebook", 32, False)])
def test_i16_auto_runs_16_entry_tables_on_paired_indices(fmt, g, dense):
    # table="i16" with depth="auto" on an x86 CPU with AVX2 (AVX-512 or not) runs the dense
    # int8 path for integer codebooks (fp4's integers, twice its values, are not affine in the
    # code: the dense kernels look them up in registers), and otherwise the AVX2 i16 kernel
    # (tables of at most 16 entries, two 4-bit indices per byte): group sizes that are not
    # multiples of 8, integer codebooks spanning more than 64; the scalar kernel at that
    # depth gives the same bits.
    rng = np.random.default_rng(3)
    codebook = [-100.0, -3.0, 0.0, 1.0, 2.5, 7.0, 40.0, 90.0] if fmt == "codebook" else None
    pw = mg.quantize(rng.standard_normal((130, 4 * g)), fmt, g, codebook=codebook)
    x = rng.standard_normal((pw.shape[1], 3)).astype(np.float32)
    info = mg.plan_info(pw, n=3, table="i16")
    assert info["backend"] in ("avx512", "avx2") and info["table_entries"] <= 16, info
    assert info["dense_int8"] == dense, info
    assert info["paired_indices"] == (not dense), info
    got = mg.msgemm(pw, x, table="i16")
    want = mg.msgemm(pw, x, table="i16", depth=info["depth"], backend="scalar")
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()


#: Integer codebooks by the span of their values: IQ4_NL's 16 integers (llama.cpp's
#: ``kvalues_iq4nl``, span 240), one of span 100, one of span 64.
SPANS = {
    240: [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
    100: [-50, -31, -17, -8, -3, 0, 2, 5, 9, 14, 22, 30, 37, 41, 46, 50],
    64: [-32, -20, -11, -5, -1, 0, 1, 3, 6, 10, 15, 21, 24, 27, 30, 32],
}


@pytest.mark.parametrize("span", sorted(SPANS))
@pytest.mark.parametrize("n", [None, 3])
def test_dense_integer_codebooks_by_span(span, n):
    # The dense kernels look a non-affine codebook's integers up as unsigned bytes
    # `v - min`: AVX-512 VNNI (and AMX) multiply any byte, and so does AVX2 with AVX-VNNI;
    # AVX2 without it sums four products in int16 (span at most 64), Arm64's sdot reads
    # them as signed bytes (at most 127). Where one
    # runs, its bits are the scalar i16 kernel's (the same exact integer sums), and both are
    # within the int8-activation error of float64.
    rng = np.random.default_rng(span)
    pw = mg.quantize(rng.standard_normal((70, 256)), "codebook", 32, codebook=np.array(SPANS[span], np.float32))
    x = rng.standard_normal(256 if n is None else (256, n)).astype(np.float32)
    ref = pw.dequantize() @ x.astype(np.float64)
    vnni = cpu_has("AVX512F", "AVX512BW", "AVX512VNNI")
    expect = {"avx512": vnni, "avx2": span <= 64 or avx2_kernel() == "avx2-vnni",
              "neon": span <= 127 and cpu_has("ASIMDDP")}
    for backend in [b for b in expect if b in BACKENDS]:
        info = mg.plan_info(pw, n=1 if n is None else n, table="i16", backend=backend)
        assert info["dense_int8"] == expect[backend], (backend, info)
        got = mg.msgemm(pw, x, table="i16", backend=backend)
        want = mg.msgemm(pw, x, table="i16", depth=info["depth"], backend="scalar")
        assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist(), backend
        assert np.abs(got - ref).sum() <= 0.02 * np.abs(ref).sum(), backend
    # The default GEMV on AMD's AVX-512 VNNI is the dense one, for this codebook too.
    if n is None and dense_gemv_default(pw):
        got = mg.msgemm(pw, x)
        want = mg.msgemm(pw, x, table="i16", backend="scalar")
        assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()


@pytest.mark.parametrize("fmt", ["int8", "uint8"])
@pytest.mark.parametrize("m, g, n", [(1, 8, None), (65, 16, 3), (130, 24, 1), (70, 32, 17), (63, 128, 64)])
def test_one_byte_formats_run_densely_by_default(fmt, m, g, n):
    # int8 / uint8 (llama.cpp's Q8_0, Q6_K, Q5_*): every call, GEMV or batch, of the default
    # table runs the dense i16 path wherever a dense kernel exists (AVX-512 VNNI, AVX2 + F16C
    # on x86-64, the dot-product extension on Arm64: numpy's CPU detection, an independent
    # oracle), since their tables would hold 256 entries per input; its bits are the scalar
    # i16 kernel's, and within the int8-activation error of float64.
    rng = np.random.default_rng(m * g)
    scale_dtype = np.float16 if g == 16 else np.float32
    pw = mg.quantize(rng.standard_normal((m, 3 * g)), fmt, g, scale_dtype=scale_dtype)
    assert (pw.zeros is None) == (fmt == "int8")
    x = rng.standard_normal(3 * g if n is None else (3 * g, n)).astype(np.float32)
    dense = (cpu_has("AVX512F", "AVX512BW", "AVX512VNNI") or cpu_has("AVX2", "F16C") or cpu_has("ASIMDDP"))
    info = mg.plan_info(pw, n=1 if n is None else n)
    assert (info["dense_int8"], info["table"]) == ((True, "i16") if dense else (False, "i8")), info
    got = mg.msgemm(pw, x)
    ref = pw.dequantize() @ x.astype(np.float64)
    if dense:
        want = mg.msgemm(pw, x, table="i16", backend="scalar")
        assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()
    assert np.abs(got - ref).sum() <= 0.02 * np.abs(ref).sum()
