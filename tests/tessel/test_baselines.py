"""Baselines: V1-V4 on every output, and the closed forms of spec §9 (re-checked)."""

from __future__ import annotations

import pytest

from maleki_rs import tessel


@pytest.mark.parametrize("name", tessel.PREMISES)
@pytest.mark.parametrize("ndevs", [2, 4, 8])
def test_every_baseline_output_is_valid(name, ndevs):
    for train in (True, False):
        p = tessel.premise(name, ndevs, train=train)
        for n in (1, 4, 9):
            for b in tessel.BASELINES:
                try:
                    s = tessel.baseline(b, p, n)
                except ValueError:
                    continue  # not applicable (the message says why; see test_inapplicable)
                assert s.validate() == [], (b, name, ndevs, n)
                assert s.makespan >= s.premise.lower_bound(s.nmicros)
                assert s.name == tessel._schedule._t.canonical_baseline(b)


def test_inapplicable_baselines_say_why():
    m = tessel.premise("mshape", 4)
    for b, match in [
        ("chimera", "V pipeline"),
        ("interleaved_1f1b", "interleaved"),
        ("zb_h1", "split backward"),
        ("inference_pipe", "forward-only"),
    ]:
        with pytest.raises(ValueError, match=match):
            tessel.baseline(b, m, 4)
    with pytest.raises(ValueError, match="even number of micro-batches"):
        tessel.baseline("chimera", tessel.premise("vshape", 4), 5)
    with pytest.raises(ValueError, match="multiple of D"):
        tessel.baseline("interleaved_1f1b", tessel.premise("interleaved", 4), 6)
    with pytest.raises(ValueError, match="unknown baseline"):
        tessel.baseline("2f2b", m, 4)


@pytest.mark.parametrize("d", [2, 4, 8])
@pytest.mark.parametrize(("f", "b"), [(1, 1), (1, 2), (1, 3), (2, 5)])
def test_gpipe_and_1f1b_closed_forms(d, f, b):
    p = tessel.premise("vshape", d, fwd=f, bwd=b)
    for n in (1, 3, d, 4 * d):
        want = (n + d - 1) * (f + b)
        assert p.lower_bound(n) == want
        g = tessel.baseline("gpipe", p, n)
        o = tessel.baseline("1f1b", p, n)
        assert g.makespan == o.makespan == want
        assert o.peak_memory.tolist() == [min(d - k, n) for k in range(d)]
        assert g.peak_memory.tolist() == [n] * d


@pytest.mark.parametrize("d", [1, 2, 4, 8])
def test_inference_pipe(d):
    p = tessel.premise("vshape", d, train=False, fwd=3)
    for n in (1, 4, 128):
        s = tessel.baseline("inference_pipe", p, n)
        assert s.makespan == (n + d - 1) * 3
        assert s.starts[n - 1, d - 1] == (n - 1 + d - 1) * 3


@pytest.mark.parametrize("d", [2, 4])
@pytest.mark.parametrize("v", [2, 3])
def test_interleaved_1f1b(d, v):
    # Megatron-LM: C = N (f + b) + (D - 1)(f + b) / v, with f, b per whole stage (v chunks of
    # f/v and b/v here: chunk spans 1 and 3).
    p = tessel.premise("interleaved", d, chunks=v)
    f, b = v * 1, v * 3
    for n in (d, 3 * d):
        s = tessel.baseline("interleaved_1f1b", p, n)
        assert s.makespan * v == n * (f + b) * v + (d - 1) * (f + b)


@pytest.mark.parametrize("d", [2, 4, 6])
@pytest.mark.parametrize(("f", "b", "w"), [(1, 1, 1), (1, 2, 1), (2, 3, 1)])
def test_zero_bubble(d, f, b, w):
    p = tessel.premise("zb_v", d, fwd=f, bwd=b, wgt=w)
    for n in (d, 3 * d):
        busy = n * (f + b + w)
        h1 = tessel.baseline("zb_h1", p, n)
        # Qi et al.: ZB-H1's bubble is (p-1)(F + B - W) (W <= F, B), at 1F1B's peak memory.
        assert h1.makespan - busy == (d - 1) * (f + b - w)
        assert h1.peak_memory.tolist() == [d] * d
        # 1F1B with a whole backward of span b + w: the published (p-1)(F + B + W).
        v = tessel.premise("vshape", d, fwd=f, bwd=b + w)
        assert tessel.baseline("1f1b", v, n).makespan - busy == (d - 1) * (f + b + w)
    if f == b == w:
        h2 = tessel.baseline("zb_h2", p, 3 * d)
        assert h2.makespan - 3 * d * 3 * f == (d - 1) * f  # a parallelogram: only the skew
        assert h2.peak_memory.tolist() == [2 * d - 1] * d


@pytest.mark.parametrize("d", [2, 4, 6, 8])
def test_chimera(d):
    # Chimera's bubble ratio (D-2)/(2N+D-2) is derived with equal forward and backward slots.
    p = tessel.premise("vshape", d, fwd=2, bwd=2)
    for n in (d, 4 * d):
        s = tessel.baseline("chimera", p, n)
        assert s.parameter_memory == 2 and s.nmicros == n // 2
        assert s.bubble_ratio == pytest.approx((d - 2) / (2 * n + d - 2))
        assert s.makespan == (2 * n + d - 2) * 2
        assert all(d // 2 + 1 <= m <= d for m in s.peak_memory.tolist()) or d == 2
    # xshape is the same bidirectional premise: nmicros counts rows (down/up pairs). The formula
    # needs whole units of D micro-batches (direct concatenation of units).
    x = tessel.premise("xshape", d, fwd=1, bwd=1)
    assert tessel.baseline("chimera", x, d).makespan == 2 * (2 * d) + d - 2


def test_1f1b_plus_puts_tensor_parallel_blocks_in_synchronous_steps():
    p = tessel.premise("mshape", 4)
    s = tessel.baseline("1f1b+", p, 8)
    assert s.is_valid
    t_f, t_b = 0, 9
    f0, b0 = 1, 8
    # T_f of each micro-batch runs right before that micro-batch's first pipeline forward,
    # T_b right after its last pipeline backward, and nothing runs beside them.
    for j in range(8):
        assert s.starts[j, t_f] + 1 <= s.starts[j, f0]
        assert s.starts[j, t_b] >= s.starts[j, b0] + 3
    one = tessel.baseline("1f1b", p, 8)
    assert one.is_valid and one.peak_memory.max() <= 4
