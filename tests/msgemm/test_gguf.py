"""``PackedWeights.from_gguf``: llama.cpp's block formats.

Oracle: the ``gguf`` package's own numpy dequantizers (``gguf.quants.dequantize``, written by
llama.cpp's authors against ggml's C code), on random blocks of every supported type (any
bytes are a valid block once the float16 fields are finite, except for TQ2_0's unused code 3
and NVFP4's sign bit) and on weights quantized by ``gguf.quants.quantize`` where it has a
quantizer; and a GGUF file written by ``gguf.GGUFWriter`` and read by ``gguf.GGUFReader``,
loaded as the docstring says. One hand-built Q4_0 block checks the layout without ``gguf``.
"""

from __future__ import annotations

import numpy as np
import pytest

from maleki_rs import msgemm as mg
from maleki_rs.msgemm._gguf import SUPPORTED, random_blocks

M, K = 37, 512  # 37 rows: not a multiple of the kernels' 64-row tiles

#: Types whose minimums become float32 zero points (one rounding off ggml's weights).
WITH_MINS = ("Q4_1", "Q2_K", "Q4_K", "Q5_1", "Q5_K")


def _gguf():
    return pytest.importorskip("gguf")


def _reference(data: np.ndarray, name: str) -> np.ndarray:
    gguf = _gguf()
    return gguf.quants.dequantize(data, gguf.GGMLQuantizationType[name]).astype(np.float64)


def _weights_bound(pw: mg.PackedWeights, name: str) -> np.ndarray:
    """Per weight, how far ``pw.dequantize()`` may lie from ggml's weights: 0, or for the types
    with minimums (z = mn / sc rounded to float32: half an ulp of z, times s, against ggml's
    float32 rounding of d q - m) 2^-23 of |d q| + |m|."""
    if name not in WITH_MINS:
        return np.zeros(pw.shape)
    s = np.repeat(pw.scales.astype(np.float64), pw.group_size, axis=1)
    z = np.repeat(pw.zeros.astype(np.float64), pw.group_size, axis=1)
    return 2.0**-23 * (np.abs(s * pw.codes) + np.abs(s * z)) + 1e-45


def _assert_weights(pw: mg.PackedWeights, ref: np.ndarray, name: str) -> None:
    wd = pw.dequantize()
    if name in WITH_MINS:
        bound = _weights_bound(pw, name)
        assert (np.abs(wd - ref) <= bound).all(), float((np.abs(wd - ref) / bound).max())
    else:
        assert np.array_equal(wd, ref)


@pytest.mark.parametrize("name", list(SUPPORTED))
def test_random_blocks_match_ggml(name: str) -> None:
    rng = np.random.default_rng(sum(map(ord, name)))
    data = random_blocks(name, M, K, rng)
    pw = mg.PackedWeights.from_gguf(data, name)
    assert pw.shape == (M, K)
    assert (pw.format, pw.group_size) == SUPPORTED[name][2:]
    ref = _reference(data, name)
    _assert_weights(pw, ref, name)
    # Products too, by every backend: f32 tables against the float64 product of ggml's weights
    # (test_bounds' f32 bound, zero-point term included, on top of the weights' own rounding
    # for the types with minimums).
    from .test_bounds import _f32_bound

    x = rng.standard_normal((K, 3))
    y_ref = ref @ x
    backends = [b for b in mg.available_backends() if mg.backend_supports(pw, b, n=3, table="f32")]
    assert "scalar" in backends
    for backend in backends:
        y = mg.msgemm(pw, x, table="f32", backend=backend)
        depth = mg.plan_info(pw, n=3, table="f32", backend=backend)["depth"]
        tol = _f32_bound(pw, x, depth, False) + _weights_bound(pw, name) @ np.abs(x) + 1e-30
        assert (np.abs(y - y_ref) <= tol).all(), backend


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "TQ1_0", "TQ2_0", "MXFP4", "Q8_0", "Q5_0", "Q5_1", "Q6_K",
                                  "Q5_K"])
def test_weights_quantized_by_gguf(name: str) -> None:
    """The path of a real model: float weights quantized by gguf-py's own quantizer."""
    gguf = _gguf()
    rng = np.random.default_rng(7)
    w = rng.standard_normal((M, K)).astype(np.float32)
    qtype = gguf.GGMLQuantizationType[name]
    try:
        data = gguf.quants.quantize(w, qtype)
    except NotImplementedError:
        from importlib.metadata import version

        pytest.skip(f"gguf {version('gguf')} has no {name} quantizer")
    pw = mg.PackedWeights.from_gguf(data, int(qtype))
    ref = gguf.quants.dequantize(data, qtype).astype(np.float64)
    _assert_weights(pw, ref, name)
    rel = np.linalg.norm(pw.dequantize() - w) / np.linalg.norm(w)
    assert rel < (0.05 if name[1] in "568" else 0.2 if name.startswith("Q4") or name == "MXFP4" else 0.9), rel  # ternary ~0.8


@pytest.mark.parametrize("name", WITH_MINS)
def test_flat_groups_with_a_minimum_stay_exact(name: str) -> None:
    """A group whose scale is 0 holds the constant ``-m``; ``s (q - z)`` with ``s = 0`` cannot
    say it, so the loader moves it into the zero point."""
    rng = np.random.default_rng(3)
    data = random_blocks(name, M, K, rng).reshape(M, -1, SUPPORTED[name][1])
    if name in ("Q4_1", "Q5_1"):
        data[:, ::3, 0:2] = 0  # d = +0: every third block is the constant m
    elif name in ("Q4_K", "Q5_K"):
        data[:, ::2, 0:2] = 0  # d = 0: all 8 sub-blocks constant
    else:
        data[:, ::2, 0:16] &= 0xF0  # Q2_K: sub-block scales 0, minimums kept
    data = data.reshape(M, -1)
    ref = _reference(data, name)
    pw = mg.PackedWeights.from_gguf(data, name)
    _assert_weights(pw, ref, name)
    assert (ref != 0).any() and np.isfinite(pw.dequantize()).all()


def test_gguf_file_round_trip(tmp_path) -> None:
    """A Q4_K and a TQ2_0 tensor written with GGUFWriter, read with GGUFReader, loaded with
    ``from_gguf(t.data, t.tensor_type)`` (the docstring's recipe)."""
    gguf = _gguf()
    rng = np.random.default_rng(11)
    path = tmp_path / "tiny.gguf"
    tensors = {"blk.0.ffn_down.weight": ("Q4_K", random_blocks("Q4_K", M, K, rng)),
               "blk.0.attn_q.weight": ("TQ2_0", random_blocks("TQ2_0", 8, 768, rng))}
    writer = gguf.GGUFWriter(str(path), "llama")
    for tname, (qname, data) in tensors.items():
        writer.add_tensor(tname, data, raw_dtype=gguf.GGMLQuantizationType[qname])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader = gguf.GGUFReader(str(path))
    assert len(reader.tensors) == 2
    for t in reader.tensors:
        qname, data = tensors[t.name]
        pw = mg.PackedWeights.from_gguf(t.data, t.tensor_type)
        assert pw.shape == (int(t.shape[1]), int(t.shape[0]))  # ggml's ne: (K, M)
        _assert_weights(pw, _reference(data, qname), qname)


def test_hand_built_q4_0_block() -> None:
    """ggml's Q4_0 without gguf: float16 d, then byte j = weight j (low nibble) and weight
    j + 16 (high nibble), value d (q - 8)."""
    q = np.arange(32) % 16
    block = np.concatenate([np.array([0.5], "<f2").view(np.uint8),
                            (q[:16] | q[16:] << 4).astype(np.uint8)])
    pw = mg.PackedWeights.from_gguf(block, "q4_0", shape=(1, 32))
    assert np.array_equal(pw.dequantize()[0], 0.5 * (q - 8))
    assert np.array_equal(mg.PackedWeights.from_gguf(block.tobytes(), 2, shape=(1, 32)).codes, pw.codes)


def test_ternary_codes_are_ggmls_trits() -> None:
    """TQ1_0's base-3 bytes without gguf: a byte b = ceil(256 * n / 243) holds the five trits of
    n (most significant first) as ((b * 3^i mod 256) * 3) >> 8; its 32 bytes give weights
    i * 32 + j."""
    rng = np.random.default_rng(5)
    trits = rng.integers(0, 3, 256)
    blk = np.zeros(54, np.uint8)

    def pack(t: np.ndarray) -> int:
        n = int(sum(int(d) * 3 ** (len(t) - 1 - i) for i, d in enumerate(t)) * 3 ** (5 - len(t)))
        return (n * 256 + 242) // 243

    for j in range(32):
        blk[j] = pack(trits[[i * 32 + j for i in range(5)]])
    for j in range(16):
        blk[32 + j] = pack(trits[[160 + i * 16 + j for i in range(5)]])
    for j in range(4):
        blk[48 + j] = pack(trits[[240 + i * 4 + j for i in range(4)]])
    blk[52:54] = np.array([2.0], "<f2").view(np.uint8)
    pw = mg.PackedWeights.from_gguf(blk, "TQ1_0", shape=(1, 256))
    assert np.array_equal(pw.dequantize()[0], 2.0 * (trits - 1))


def test_bad_inputs() -> None:
    rng = np.random.default_rng(0)
    q4 = random_blocks("Q4_0", 2, 64, rng)
    for bad, msg in [("Q8_K", "activations in its dot products"), ("F16", "not a block-quantized"),
                     ("IQ2_XXS", "not supported"), ("Q9_9", "unknown ggml type"), (99, "unknown ggml type id")]:
        with pytest.raises(ValueError, match=msg):
            mg.PackedWeights.from_gguf(q4, bad)
    with pytest.raises(TypeError, match="ggml_type"):
        mg.PackedWeights.from_gguf(q4, 2.0)
    with pytest.raises(TypeError, match="uint8"):
        mg.PackedWeights.from_gguf(q4.astype(np.int16), "Q4_0")
    with pytest.raises(ValueError, match="empty"):
        mg.PackedWeights.from_gguf(np.zeros((0, 18), np.uint8), "Q4_0")
    with pytest.raises(ValueError, match="whole Q4_0 blocks"):
        mg.PackedWeights.from_gguf(q4[:, :-1], "Q4_0")
    with pytest.raises(ValueError, match="shape: needed"):
        mg.PackedWeights.from_gguf(q4.ravel(), "Q4_0")
    with pytest.raises(ValueError, match="72 bytes"):
        mg.PackedWeights.from_gguf(q4.ravel(), "Q4_0", shape=(3, 64))
    with pytest.raises(ValueError, match="multiple of Q4_0's block"):
        mg.PackedWeights.from_gguf(q4.ravel(), "Q4_0", shape=(4, 36))
    nan = q4.copy().reshape(2, 2, 18)
    nan[1, 1, 0:2] = np.array([np.nan], "<f2").view(np.uint8)
    with pytest.raises(ValueError, match="row 1, block 1 has a non-finite"):
        mg.PackedWeights.from_gguf(nan.reshape(2, -1), "Q4_0")
    tq = random_blocks("TQ2_0", 1, 256, rng)
    tq[0, 5] |= 3
    with pytest.raises(ValueError, match="code 3"):
        mg.PackedWeights.from_gguf(tq, "TQ2_0")
    mx = random_blocks("MXFP4", 1, 32, rng)
    mx[0, 0] = 255
    with pytest.raises(ValueError, match="exponent 0xff"):
        mg.PackedWeights.from_gguf(mx, "MXFP4")
    nv = random_blocks("NVFP4", 1, 64, rng)
    nv[0, 2] = 0x90
    with pytest.raises(ValueError, match="bit 7"):
        mg.PackedWeights.from_gguf(nv, "NVFP4")


def test_review_shape_and_bytes() -> None:
    """Review (helper-40): ``shape`` is checked against 2-D data (ggml's reversed ``ne`` would
    silently reshape the rows), its entries must be integers, and a memoryview keeps its own
    dtype."""
    rng = np.random.default_rng(1)
    d = random_blocks("Q4_K", 256, 512, rng)
    assert mg.PackedWeights.from_gguf(d, "Q4_K", shape=(256, 512)).shape == (256, 512)
    with pytest.raises(ValueError, match="ne reversed"):
        mg.PackedWeights.from_gguf(d, "Q4_K", shape=(512, 256))
    q4 = random_blocks("Q4_0", 2, 64, rng)
    for bad in [(2.5, 64), ("2", "64"), (True, 64), (2, float("inf"))]:
        with pytest.raises((TypeError, ValueError), match="shape"):
            mg.PackedWeights.from_gguf(q4.ravel(), "Q4_0", shape=bad)
    with pytest.raises(ValueError, match="shape: expected"):
        mg.PackedWeights.from_gguf(q4.ravel(), "Q4_0", shape={2: 0, 64: 0})
    with pytest.raises(TypeError, match="uint8"):
        mg.PackedWeights.from_gguf(memoryview(np.ones(18, np.float32)), "Q4_0", shape=(2, 64))
    pw = mg.PackedWeights.from_gguf(memoryview(q4), " q4_0 ")
    assert np.array_equal(pw.codes, mg.PackedWeights.from_gguf(bytearray(q4.tobytes()), 2, shape=(2, 64)).codes)
    mx = random_blocks("MXFP4", 1, 64, rng)
    mx[0, 17] = 252  # the largest exponent whose weights stay finite
    assert np.isfinite(mg.PackedWeights.from_gguf(mx, "MXFP4").dequantize()).all()
    mx[0, 17] = 253
    with pytest.raises(ValueError, match="row 0, block 1 has the E8M0 exponent 0xfd"):
        mg.PackedWeights.from_gguf(mx, "MXFP4")
    q41 = random_blocks("Q4_1", 1, 32, rng)
    q41[0, 2:4] = np.array([np.inf], "<f2").view(np.uint8)
    with pytest.raises(ValueError, match="non-finite float16 m"):
        mg.PackedWeights.from_gguf(q41, "Q4_1")
    with pytest.raises(ValueError, match="1-bit"):
        mg.PackedWeights.from_gguf(q4, "Q1_0")


def _model_file(path) -> None:
    """A small GGUF file: three types msgemm loads, an expert tensor, and two it does not."""
    gguf = _gguf()
    rng = np.random.default_rng(21)
    t = gguf.GGMLQuantizationType
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("blk.0.attn_q.weight", random_blocks("Q4_K", 256, 512, rng), raw_dtype=t.Q4_K)
    writer.add_tensor("blk.0.ffn_down.weight", random_blocks("TQ2_0", 96, 768, rng), raw_dtype=t.TQ2_0)
    writer.add_tensor("blk.0.attn_v.weight",
                      gguf.quants.quantize(rng.standard_normal((64, 256)).astype(np.float32), t.Q8_0), raw_dtype=t.Q8_0)
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(512, np.float32))
    writer.add_tensor("blk.0.attn_k.weight", rng.integers(0, 256, (64, 66), dtype=np.uint8), raw_dtype=t.IQ2_XXS)
    writer.add_tensor("blk.0.ffn_gate_exps.weight",
                      np.stack([random_blocks("Q4_0", 128, 256, rng) for _ in range(3)]), raw_dtype=t.Q4_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_cli_times_a_files_tensors(tmp_path, capsys) -> None:
    from maleki_rs import cli
    from maleki_rs.msgemm import _cli

    path = tmp_path / "model.gguf"
    _model_file(path)
    assert cli.main(["msgemm", "gguf", str(path), "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "blk.0.attn_q.weight" in out and "Q4_K" in out and "as uint4 g32+z" in out
    assert "blk.0.ffn_gate_exps.weight (expert 0 of 3)" in out and "as int4 g32" in out
    assert "blk.0.attn_v.weight" in out and "as int8 g32" in out  # Q8_0
    assert "4 tensors one after another" in out
    assert "not loaded (types msgemm has no format for, or not matrices): 1 F32, 1 IQ2_XXS" in out
    # The figures, and products checked against gguf's own dequantization.
    rows = _cli.gguf_bench(str(path), names=["ffn"], n=5, repeat=1, out=lambda line: None)
    assert [r["type"] for r in rows] == ["TQ2_0", "Q4_0"]
    assert all(r["rel_l1"] < 2e-2 and r["msgemm_s"] > 0 and r["numpy_s"] > 0 for r in rows)
    assert len(_cli.gguf_bench(str(path), max_tensors=1, repeat=1, out=lambda line: None)) == 1
    # A --tensor that matches nothing is an error (status 2) naming it and some tensors.
    assert cli.main(["msgemm", "gguf", str(path), "--tensor", "nomatch"]) == 2
    err = capsys.readouterr().err
    assert "'nomatch'" in err and "blk.0.attn_q.weight" in err and "its 6 tensors" in err


def test_cli_errors(tmp_path, capsys, monkeypatch) -> None:
    from maleki_rs import cli

    _gguf()  # the first two need the package (CI's Arm64 run has none)
    bad = tmp_path / "not.gguf"
    bad.write_bytes(b"not a gguf file at all")
    assert cli.main(["msgemm", "gguf", str(bad)]) == 2
    assert "not a GGUF file that gguf" in capsys.readouterr().err
    assert cli.main(["msgemm", "gguf", str(tmp_path / "missing.gguf")]) == 1
    assert "No such file" in capsys.readouterr().err
    monkeypatch.setitem(__import__("sys").modules, "gguf", None)  # not installed
    assert cli.main(["msgemm", "gguf", str(bad)]) == 2
    assert "pip install gguf" in capsys.readouterr().err


def test_cli_names_a_refused_tensor_and_goes_on(tmp_path, capsys) -> None:
    """Review (helper-41): a malformed block stopped the whole run without naming the tensor."""
    from maleki_rs.msgemm import _cli

    gguf = _gguf()
    rng = np.random.default_rng(4)
    t = gguf.GGMLQuantizationType
    bad = random_blocks("NVFP4", 8, 128, rng)
    bad[3, 0] = 0x80
    path = tmp_path / "bad.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("blk.0.a.weight", random_blocks("Q2_K", 16, 256, rng), raw_dtype=t.Q2_K)
    writer.add_tensor("blk.0.b.weight", bad, raw_dtype=t.NVFP4)
    writer.add_tensor("blk.0.c.weight", random_blocks("MXFP4", 16, 64, rng), raw_dtype=t.MXFP4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    lines: list[str] = []
    rows = _cli.gguf_bench(str(path), repeat=1, out=lines.append)
    assert [r["name"] for r in rows] == ["blk.0.a.weight", "blk.0.c.weight"]
    assert any("blk.0.b.weight" in line and "not loaded: data: row 3, block 0" in line for line in lines)
    # gguf's reversed shape array is accepted as shape (M, K).
    reader = gguf.GGUFReader(str(path))
    ta = reader.tensors[0]
    assert mg.PackedWeights.from_gguf(ta.data.ravel(), ta.tensor_type, shape=ta.shape[::-1]).shape == (16, 256)


def _fuzz_case():
    from hypothesis import strategies as st

    @st.composite
    def case(draw):
        name = draw(st.sampled_from(sorted(SUPPORTED)))
        bs, ts = SUPPORTED[name][:2]
        m = draw(st.integers(1, 3))
        nb = draw(st.integers(1, 2))
        raw = draw(st.binary(min_size=m * nb * ts, max_size=m * nb * ts))
        return name, m, nb * bs, np.frombuffer(raw, np.uint8).reshape(m, nb * ts).copy()

    return case()


#: A Q4_1 block whose weights nearly cancel (d = 6.398, m = -31.98, every code 5: d q + m is
#: about 0), then a block of zeros: the zero points' float32 rounding dominates the error
#: (review, helper-43; a bound on |w| |x| alone is 69x too tight here).
_CANCELLING_Q4_1 = ("Q4_1", 1, 64, np.frombuffer(bytes.fromhex("6646ffcf" + "55" * 16) + bytes(20),
                                                  np.uint8).reshape(1, 40).copy())


def test_fuzzed_blocks_load_exactly_or_are_refused() -> None:
    """Any bytes (a corrupted or hand-edited file): ``from_gguf`` either refuses them with a
    ValueError naming the row and block, or loads weights equal to gguf's own dequantization
    (within one float32 rounding for the types with minimums) whose ``table="f32"`` products
    are finite and within the f32 bound of ``test_bounds`` (zero-point term included) plus
    those weights' own rounding, of the float64 product of gguf's weights."""
    import re

    from .test_bounds import _f32_bound

    _gguf()
    hyp = pytest.importorskip("hypothesis")

    @hyp.settings(max_examples=300, deadline=None, derandomize=True)
    @hyp.given(_fuzz_case())
    @hyp.example(_CANCELLING_Q4_1)
    def run(c):
        name, m, k, data = c
        try:
            pw = mg.PackedWeights.from_gguf(data, name)
        except ValueError as e:
            assert re.match(r"data: row \d+, block \d+ ", str(e)), str(e)
            return
        assert pw.shape == (m, k)
        with np.errstate(over="ignore", invalid="ignore"):
            ref = _reference(data, name)
        assert np.isfinite(ref).all()
        _assert_weights(pw, ref, name)
        x = np.linspace(-1.0, 1.0, k)
        y = mg.msgemm(pw, x, table="f32")
        depth = mg.plan_info(pw, table="f32")["depth"]
        tol = _f32_bound(pw, x, depth, False) + _weights_bound(pw, name) @ np.abs(x) + 1e-30
        assert np.isfinite(y).all()
        err = np.abs(y - ref @ x)
        assert (err <= tol).all(), (name, float((err / tol).max()))

    run()
