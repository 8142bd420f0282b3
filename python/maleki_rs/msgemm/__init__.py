"""msGeMM: low-bit GEMM through look-up tables (Maleki, arXiv:2310.06178).

``Y = Wd @ X`` for weights stored as 2- to 8-bit codes. Phase 1 builds, once per column of X
and tuple of ``d`` consecutive inputs, a table of all ``V^d`` partial sums
``sum_j v[c_j] x_j``; phase 2 adds, for every weight row, one table entry per tuple instead of
``d`` multiply-adds. The tables depend only on X and serve every row, which is where the
saving comes from: ``~d / (1 + A_d(V)/M)`` fewer instructions (:func:`op_counts`).

Quick start::

    import numpy as np
    from maleki_rs import msgemm as mg

    w = np.random.default_rng(0).standard_normal((4096, 4096), dtype=np.float32)
    pw = mg.quantize(w, "int4", group_size=128)   # PackedWeights
    x = np.ones(4096, np.float32)
    y = mg.msgemm(pw, x)                            # ~ pw.dequantize() @ x, float32
    y, counts = mg.msgemm(pw, x, count=True)        # instrumented: counted operations
    mg.op_counts(12288, 4608, format="int4", depth=3, group_size=None)["mac_ratio"]   # 2.22
    # (spec 2.5's d / (1 + A_d(V)/M) at M = 12288, V = 16, d = 3, exact where d divides the
    # group size; mirror=True: 2.53, the paper's ~2.5x)

Formats: :data:`FORMATS`; table precisions: :data:`TABLES`; kernels: :data:`BACKENDS`.
"""

from __future__ import annotations

from ._api import (
    BACKENDS,
    FORMATS,
    TABLES,
    PackedWeights,
    available_backends,
    backend_supports,
    best_depth,
    codebook,
    linear,
    model_ratio,
    msgemm,
    op_counts,
    plan_info,
    quantize,
)

__all__ = [
    "FORMATS",
    "TABLES",
    "BACKENDS",
    "PackedWeights",
    "quantize",
    "msgemm",
    "linear",
    "op_counts",
    "best_depth",
    "model_ratio",
    "available_backends",
    "backend_supports",
    "plan_info",
    "codebook",
]
