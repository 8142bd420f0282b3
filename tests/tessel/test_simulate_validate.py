"""The simulator and the validator against independent oracles, including property tests."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import maleki_rs
from maleki_rs import tessel
from maleki_rs.exceptions import DeadlockError
from maleki_rs.tessel import Premise

from ._oracles import asap, lower_bound, peak_memory, random_orders, random_premise, violations


def test_deadlock_names_a_cycle():
    p = tessel.premise("vshape", 2)
    # Device 1 runs B1 of micro-batch 0 before F1 of micro-batch 0.
    with pytest.raises(DeadlockError, match="cycle") as ei:
        tessel.simulate(p, [[(0, 0), (0, 3)], [(0, 2), (0, 1)]])
    assert "F1" in str(ei.value) and "B1" in str(ei.value)
    assert isinstance(ei.value, ValueError)
    # Two all-device blocks in opposite orders on the two devices.
    q = Premise.from_blocks([{"span": 2, "devices": [0, 1]}, {"span": 1, "devices": [0, 1]}])
    with pytest.raises(DeadlockError, match="cycle of 2 jobs"):
        tessel.simulate(q, [[(0, 0), (0, 1)], [(0, 1), (0, 0)]])
    # FIFO inverted on one block across micro-batches is allowed by the simulator but V4 reports it.
    s = tessel.simulate(p, [[(1, 0), (0, 0), (0, 3), (1, 3)], [(0, 1), (0, 2), (1, 1), (1, 2)]])
    assert {v.rule for v in s.validate()} == {"V4"}


def test_malformed_orders():
    p = tessel.premise("vshape", 2)
    with pytest.raises(ValueError, match="missing"):
        tessel.simulate(p, [[(0, 0)], [(0, 1), (0, 2)]])
    with pytest.raises(ValueError, match="twice"):
        tessel.simulate(p, [[(0, 0), (0, 0), (0, 3)], [(0, 1), (0, 2)]])
    with pytest.raises(ValueError, match="does not run on device"):
        tessel.simulate(p, [[(0, 1), (0, 3)], [(0, 0), (0, 2)]])
    with pytest.raises(ValueError, match="2 lists"):
        tessel.simulate(p, [[(0, 0), (0, 3)]])
    with pytest.raises(ValueError, match="exactly one"):
        tessel.simulate(p)


def test_lags_and_explicit_starts():
    p = tessel.premise("vshape", 2)
    orders = [[(0, 0), (0, 3)], [(0, 1), (0, 2)]]
    s = tessel.simulate(p, orders, lag=2)
    assert s.starts.tolist() == [[0, 3, 4, 9]]
    assert s.premise.lags == (2, 0, 2)
    s = tessel.simulate(p, orders, lag=[1, 5, 0])
    assert s.starts.tolist() == [[0, 2, 8, 11]]
    e = tessel.simulate(p, starts=[[0, 1, 2, 5]])
    assert e.makespan == 8 and e.is_valid
    bad = tessel.simulate(p, starts=np.asfortranarray([[0, 0, 2, 5]]))
    [v] = bad.validate()
    assert v.rule == "V1" and v.jobs == ((0, 0), (0, 1)) and v.times == (1, 0)


def test_metrics_of_1f1b():
    p = tessel.premise("vshape", 4)
    s = tessel.baseline("1f1b", p, 12)
    m = s.metrics()
    assert m["makespan"] == m["lower_bound"] == (12 + 3) * 4 and m["gap"] == 0
    assert m["idle"] == [m["makespan"] - 12 * 4] * 4
    assert m["busy"] == [48] * 4
    assert m["peak_memory_start"] == [4, 3, 2, 1]
    # A device starts its next forward only after its backward ends: freeing at the end of the
    # backward changes nothing for 1F1B (GPipe's frees come after all forwards anyway).
    assert m["peak_memory_free_end"] == [4, 3, 2, 1]
    assert m["inflight"] == [4, 3, 2, 1]
    assert m["period"][0] == 4
    chain = m["critical_chain"]
    assert s.starts[chain[0]] == 0 and s.starts[chain[-1]] + p.blocks[chain[-1][1]].span == m["makespan"]
    assert all(m["slack"][j, g] == 0 for j, g in chain)
    t, lv = s.memory_timeline(0)
    assert lv.max() == 4 and lv[-1] == 0 and t.dtype == np.int64
    assert s.throughput == pytest.approx(12 / m["makespan"])


def _premise_from(data):
    ndevs, spans, devices, memory, kinds, edges = data
    blocks = [
        {"span": s, "devices": d, "memory": m, "kind": k} for s, d, m, k in zip(spans, devices, memory, kinds)
    ]
    return Premise.from_blocks(blocks, edges, ndevs=ndevs)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), nmicros=st.integers(1, 5))
def test_simulator_matches_oracle_on_random_premises(seed, nmicros):
    rnd = random.Random(seed)
    data = _premise_from(rnd_data := random_premise(rnd))
    ndevs, spans, devices, memory, _, edges = rnd_data
    lags = [0] * len(edges)
    orders = random_orders(spans, devices, edges, nmicros, ndevs, rnd)
    s = tessel.simulate(data, orders)
    want = asap(spans, devices, edges, lags, nmicros, orders)
    assert np.array_equal(s.starts, want)
    assert s.validate() == []
    assert s.orders() == orders
    assert s.makespan >= lower_bound(spans, [set(d) for d in devices], edges, lags, ndevs, nmicros)
    assert s.lower_bound == lower_bound(spans, [set(d) for d in devices], edges, lags, ndevs, nmicros)
    m = s.metrics()
    assert m["peak_memory_start"] == peak_memory(spans, devices, memory, want, ndevs)
    assert m["peak_memory_free_end"] == peak_memory(spans, devices, memory, want, ndevs, free_at_end=True)
    busy = nmicros * sum(spans[g] * len(devices[g]) for g in range(len(spans)))
    assert m["bubble_ratio"] == pytest.approx(1 - busy / (ndevs * m["makespan"]))
    # A cap at the peak is met, one below is not (when there is memory at all).
    peak = max(m["peak_memory_start"])
    assert s.with_memory(peak).is_valid
    if peak > 0:
        assert {v.rule for v in s.with_memory(peak - 1).validate()} == {"V3"}


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), nmicros=st.integers(1, 4), moves=st.integers(1, 4))
def test_validator_counts_match_oracle(seed, nmicros, moves):
    rnd = random.Random(seed)
    ndevs, spans, devices, memory, kinds, edges = data = random_premise(rnd)
    p = _premise_from(data)
    orders = random_orders(spans, devices, edges, nmicros, ndevs, rnd)
    starts = asap(spans, devices, edges, [0] * len(edges), nmicros, orders)
    for _ in range(moves):
        j, g = rnd.randrange(nmicros), rnd.randrange(len(spans))
        starts[j, g] += rnd.randint(-4, 2)
    caps = [rnd.randint(0, 3) for _ in range(ndevs)]
    want = violations(spans, [set(d) for d in devices], memory, edges, [0] * len(edges), starts, caps)
    s = tessel.simulate(p, starts=starts, memory=caps)
    got = {r: 0 for r in want}
    for v in s.validate(limit=None):
        got[v.rule] += 1
    assert got == want
    assert s.count_violations() == sum(want.values())
    assert len(s.validate(limit=1)) == min(1, sum(want.values()))


def test_same_results_on_one_and_two_threads():
    p = tessel.premise("xshape", 4)
    try:
        maleki_rs.set_num_threads(1)
        a = [tessel.baseline(b, p, 8).starts.copy() for b in ("gpipe", "1f1b", "chimera")]
        maleki_rs.set_num_threads(2)
        b = [tessel.baseline(b, p, 8).starts.copy() for b in ("gpipe", "1f1b", "chimera")]
    finally:
        maleki_rs.set_num_threads(2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_validate_template():
    p = tessel.premise("vshape", 4)
    ok = [0, 1, 2, 3, 4, 7, 10, 13]
    assert tessel.validate_template(p, ok, 4) == []
    [v] = tessel.validate_template(p, ok, 4, memory=3)
    assert v.rule == "T3" and v.device == 0 and v.times == (4, 3)
    vs = tessel.validate_template(p, [0, 1, 2, 3, 4, 7, 10, 12], 4)
    assert sorted(v.rule for v in vs) == ["T1", "T2"]
    assert any(v.rule == "T2" and "exceeds the period" in v.message for v in tessel.validate_template(p, ok, 3))
