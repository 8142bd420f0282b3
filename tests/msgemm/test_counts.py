"""Oracle 3 (spec section 8.3): the instrumented reference kernel counts exactly the closed-form
operations of section 2.5 on a grid of shapes and settings; the spot values 2.22 and 2.53; and
``best_depth`` agrees with a brute-force search over an independent implementation of R."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from maleki_rs import msgemm as mg

from .conftest import integer_weights, integer_x


def _A(v: int, d: int, mirror: bool = False) -> int:
    """Table adds of one depth-d table, from the definition (levels 2..d cost V^j adds; with
    mirror the last level builds its stored half, the ceil(V^d / 2) indices up to the centre)."""
    if d < 2:
        return 0
    last = -(-v**d // 2) if mirror else v**d
    return sum(v**j for j in range(2, d)) + last


def _formula(m, k, n, v, d, g, zp, mirror):
    """Spec section 2.5, written out independently (with ``ceil(G/d)`` tuples per group)."""
    t = -(-g // d)
    r = g - (t - 1) * d
    groups = k // g
    mng = m * n * groups
    return {
        "table_mul": n * k * v,
        "table_add": n * groups * ((t - 1) * _A(v, d, mirror) + _A(v, r, mirror)),
        "lookup": mng * t,
        "add": m * n * (groups * t - 1) + zp * (mng + n * groups * (g - 1)),
        "mul": mng + zp * mng,
        "dense_mul": m * n * k,
        "dense_add": m * n * (k - 1),
    }


GRID = [
    # fmt, M, K, N, G, depth, zeros, mirror
    ("int4", 70, 256, 1, 128, 2, False, False),
    ("int4", 70, 256, 3, 64, 3, False, False),
    ("int4", 64, 192, 2, 96, 3, False, True),
    ("uint4", 65, 256, 2, 32, 2, True, False),
    ("uint4", 33, 128, 1, 128, 2, True, True),
    ("int4", 20, 64, 1, 64, 4, False, False),
    ("int3", 40, 128, 2, 64, 2, False, False),
    ("int2", 130, 256, 1, 64, 4, False, False),
    ("int2", 50, 240, 2, 80, 5, True, True),
    ("ternary", 77, 250, 2, 50, 5, False, False),
    ("ternary", 77, 256, 1, 128, 5, False, True),
    ("fp4", 90, 256, 2, 32, 2, False, True),
    ("fp4", 90, 256, 1, 64, 1, True, False),
    ("fp8_e4m3", 30, 64, 2, 32, 1, False, False),
    ("codebook", 40, 128, 1, 64, 3, False, True),
]


@pytest.mark.parametrize("fmt, m, k, n, g, d, zeros, mirror", GRID)
def test_counted_equals_formula(fmt, m, k, n, g, d, zeros, mirror):
    rng = np.random.default_rng(m * k + d)
    pw = integer_weights(fmt, rng, m, k, g, zeros=zeros)
    x = integer_x(rng, k, n)
    y, counted = mg.msgemm(pw, x, depth=d, count=True, mirror=mirror)
    np.testing.assert_array_equal(y, (pw.dequantize() @ x).astype(np.float32))
    shift = pw.mirror[1] if mirror else 0.0
    zp = int(zeros or shift != 0.0)
    want = _formula(m, k, n, pw.levels, d, g, zp, mirror)
    assert {key: counted[key] for key in want} == want
    assert counted["zero_term"] == bool(zp)
    assert counted["mac_ratio"] == pytest.approx(m * n * k / (want["table_add"] + want["lookup"]))
    # op_counts (closed form through the API) agrees with the counted run
    fc = mg.op_counts(m, k, n, format=fmt, depth=d, group_size=g, zero_points=zeros, mirror=mirror,
                      codebook=pw.codebook if fmt == "codebook" else None)
    assert {key: fc[key] for key in want} == want


def test_spot_values_of_the_paper_setting():
    """V=16, d=3, M=12288: 2.22 (2.53 with mirror), counted on a real run with d | G."""
    assert round(mg.op_counts(12288, 4096, format="int4", depth=3, group_size=None)["model_ratio"], 2) == 2.22
    assert round(mg.op_counts(12288, 4096, format="int4", depth=3, group_size=None, mirror=True)["model_ratio"], 2) == 2.53
    rng = np.random.default_rng(0)
    pw = integer_weights("int4", rng, 12288, 96, 96, zeros=False)
    x = integer_x(rng, 96, None)
    _, c = mg.msgemm(pw, x, depth=3, count=True)
    assert round(c["mac_ratio"], 2) == 2.22
    _, c = mg.msgemm(pw, x, depth=3, count=True, mirror=True)
    assert round(c["mac_ratio"], 2) == 2.53
    # lower bit widths gain more (spec 2.5): int2 d=4 at M=4096 ~3.7x, ternary d=5 ~4.6x
    assert round(mg.model_ratio(4096, 4, 4), 1) == 3.7
    assert round(mg.model_ratio(4096, "ternary", 5), 1) == 4.6
    # fp8 gains nothing beyond depth 1
    assert mg.model_ratio(4096, 256, 2) < 0.13
    assert mg.best_depth(4096, "fp8_e4m3") == 1


@pytest.mark.parametrize("v", [2, 3, 4, 8, 16, 256])
def test_best_depth_is_the_brute_force_argmax(v):
    dmax = 1
    while v ** (dmax + 1) <= 65536:
        dmax += 1
    for m, mirror in itertools.product([1, 16, 64, 300, 1000, 4096, 12288, 28672, 49152, 10**6], [False, True]):
        ratios = [d / (1 + _A(v, d, mirror) / m) for d in range(1, dmax + 1)]
        want = 1 + int(np.argmax(ratios))  # first maximum: the smaller depth on ties
        assert mg.best_depth(m, v, mirror=mirror) == want, (m, v, mirror)


def test_op_counts_keys_and_dense_figures():
    c = mg.op_counts(4096, 4096, 1, format="int4", depth=2, group_size=128)
    for key in ["table_mul", "table_add", "lookup", "add", "mul", "dense_mul", "dense_add", "mac_ratio", "op_ratio"]:
        assert key in c
    assert c["dense_mul"] == 4096 * 4096
    assert c["mac_ratio"] == pytest.approx(2 / (1 + 256 / 4096))
    assert mg.op_counts(4096, 4096, format="int4", depth="auto")["depth"] == 2
    assert mg.op_counts(28672, 4096, format="int4", depth="auto")["depth"] == 3
