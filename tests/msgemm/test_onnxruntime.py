"""Interop with ONNX Runtime's ``MatMulNBits`` (the `onnxruntime` package, in the test extra).

Two directions, each against ONNX Runtime itself as the independent implementation:
weights quantized by ONNX Runtime's own quantizer (``MatMulNBitsQuantizer``) load with
``PackedWeights.from_matmulnbits`` and give the outputs ONNX Runtime computes from the same
tensors; weights exported by ``to_matmulnbits`` run in an ONNX Runtime session and give the
outputs of our float64 reference. Accuracy level 0 (float32 activations), so the only
differences are float32 rounding: a wrong nibble order, zero-point packing or scale layout
would be off by the size of the weights.
"""

from __future__ import annotations

import numpy as np
import pytest

from maleki_rs import msgemm as mg

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

K, M = 256, 96  # M not a multiple of 64: the kernels' row tails


def _matmul_model(w: np.ndarray) -> onnx.ModelProto:
    """``Y = A @ W`` with ``W`` (K, M) float32 as an initializer (the graph ORT's quantizer rewrites)."""
    k, m = w.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["A", "W"], ["Y"])],
        "matmul",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["n", k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n", m])],
        [numpy_helper.from_array(w, "W")],
    )
    # IR 8 (what opset 17 needs): older ONNX Runtimes refuse onnx's newest IR.
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _matmulnbits_model(b: np.ndarray, scales: np.ndarray, zp: np.ndarray | None, *, k: int, bits: int,
                       block_size: int) -> onnx.ModelProto:
    """A one-node ``MatMulNBits`` graph (``Y = A @ Wd.T``) over the given tensors."""
    n = b.shape[0]
    inits = [numpy_helper.from_array(b, "B"), numpy_helper.from_array(scales, "scales")]
    inputs = ["A", "B", "scales"]
    if zp is not None:
        inits.append(numpy_helper.from_array(zp, "zero_points"))
        inputs.append("zero_points")
    node = helper.make_node("MatMulNBits", inputs, ["Y"], domain="com.microsoft", K=k, N=n, bits=bits,
                            block_size=block_size, accuracy_level=0)
    graph = helper.make_graph(
        [node],
        "mnb",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["n", k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n", n])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=8)


def _session(model: onnx.ModelProto, bits: int):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    try:
        return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as e:  # an ONNX Runtime built without this bit width
        pytest.skip(f"ONNX Runtime {ort.__version__} runs no {bits}-bit MatMulNBits here: {str(e)[:100]}")


def _assert_float32_close(y: np.ndarray, ref: np.ndarray, abs_ref: np.ndarray, what: str) -> None:
    """``y`` within a float32 dot product's rounding of the float64 ``ref``: ``K * 2^-23`` times
    ``|Wd| @ |x|`` (any summation order), far below one weight's size."""
    bound = K * 2.0**-23 * abs_ref + 1e-30
    err = np.abs(y.astype(np.float64) - ref)
    assert (err <= bound).all(), f"{what}: worst error {float((err / bound).max()):.3g} x the float32 bound"


@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("block_size", [16, 32, 128])
def test_loads_onnxruntime_quantizer_output(bits: int, symmetric: bool, block_size: int) -> None:
    mq = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")
    rng = np.random.default_rng(bits * 1000 + block_size * 2 + symmetric)
    w = rng.standard_normal((K, M)).astype(np.float32)
    cfg = mq.DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=symmetric, bits=bits,
                                          accuracy_level=0)
    quantizer = mq.MatMulNBitsQuantizer(_matmul_model(w), algo_config=cfg)
    quantizer.process()
    model = quantizer.model.model
    (node,) = [nd for nd in model.graph.node if nd.op_type == "MatMulNBits"]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert (attrs["K"], attrs["N"], attrs["bits"], attrs["block_size"]) == (K, M, bits, block_size)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    tensors = [inits[name] for name in node.input[1:] if name]
    assert len(tensors) == (2 if symmetric else 3)

    pw = mg.PackedWeights.from_matmulnbits(*tensors, K=K, bits=bits, block_size=block_size)
    assert pw.shape == (M, K) and pw.group_size == block_size
    assert pw.format == (f"int{bits}" if symmetric else f"uint{bits}")
    # The loaded weights are ORT's rounding of the originals (relative error of a 4- or 2-bit grid).
    rel = np.linalg.norm(pw.dequantize() - w.T) / np.linalg.norm(w)
    assert rel < (0.15 if bits == 4 else 0.7), rel

    a = rng.standard_normal((5, K)).astype(np.float32)
    y_ort = _session(model, bits).run(None, {"A": a})[0]
    wd = pw.dequantize()
    ref = wd @ a.T.astype(np.float64)
    abs_ref = np.abs(wd) @ np.abs(a.T.astype(np.float64))
    _assert_float32_close(y_ort.T, ref, abs_ref, "ONNX Runtime on its own tensors vs our dequantized weights")
    for table in ("f32", "i8"):
        y = mg.msgemm(pw, a.T, table=table)
        if table == "f32":
            _assert_float32_close(y, ref, abs_ref, "msgemm (f32 tables)")
        else:  # the i8 tables' relative L1 error (section 4): 6e-3 to 1e-2 on such data
            assert np.abs(y - y_ort.T).sum() <= 2e-2 * np.abs(y_ort).sum()


@pytest.mark.parametrize("fmt,bits", [("int4", 4), ("uint4", 4), ("int2", 2), ("uint2", 2)])
@pytest.mark.parametrize("group_size", [16, 64])
def test_exported_tensors_run_in_onnxruntime(fmt: str, bits: int, group_size: int) -> None:
    rng = np.random.default_rng(group_size + bits)
    w = rng.standard_normal((M, K))
    pw = mg.quantize(w, format=fmt, group_size=group_size)
    b, scales, zp = pw.to_matmulnbits()
    assert (zp is None) == fmt.startswith("int")
    # Back through our loader: the same weights, bit for bit.
    again = mg.PackedWeights.from_matmulnbits(b, scales, zp, K=K, bits=bits, block_size=group_size)
    assert np.array_equal(again.dequantize(), pw.dequantize())

    sess = _session(_matmulnbits_model(b, scales, zp, k=K, bits=bits, block_size=group_size), bits)
    a = rng.standard_normal((3, K)).astype(np.float32)
    y_ort = sess.run(None, {"A": a})[0]
    wd = pw.dequantize()
    _assert_float32_close(y_ort.T, wd @ a.T.astype(np.float64), np.abs(wd) @ np.abs(a.T.astype(np.float64)),
                          f"ONNX Runtime on our exported {fmt} g{group_size}")
