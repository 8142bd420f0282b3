"""The schedule search (spec §4, §9): validity, optima, parity, determinism, bad inputs.

Every schedule is checked with the pure-Python oracles of ``_oracles.py`` (no maleki_rs code
inside), and optima are compared with CP-SAT values recorded in the spec and with an
exhaustive Python search on tiny random premises.
"""

from __future__ import annotations

import math
import random
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import maleki_rs
from maleki_rs import tessel
from maleki_rs.exceptions import InfeasibleError, MalekiError

from . import _oracles as orc


def _data(p):
    blocks = p.blocks
    spans = [b.span for b in blocks]
    devices = [list(b.devices) for b in blocks]
    memory = [b.memory for b in blocks]
    edges = [tuple(e) for e in p.edges]
    lags = [0] * len(edges)
    return spans, devices, memory, edges, lags


def _check(p, s, caps):
    spans, devices, memory, edges, lags = _data(p)
    starts = np.asarray(s.starts)
    assert starts.dtype == np.int64 and starts.shape == (s.nmicros, p.nblocks)
    v = orc.violations(spans, devices, memory, edges, lags, starts, caps=caps)
    assert v == {"V0": 0, "V1": 0, "V2": 0, "V3": 0, "V4": 0}, v
    lb = orc.lower_bound(spans, devices, edges, lags, p.ndevs, s.nmicros)
    assert s.makespan >= lb


@pytest.mark.parametrize("name", tessel.PREMISES)
@pytest.mark.parametrize("train", [True, False])
def test_search_outputs_are_valid(name, train):
    p = tessel.premise(name, 4, train=train)
    mem = 10 if train else None
    for n in (1, 5, 16):
        r = tessel.search(p, memory=mem, nmicros=n)
        _check(p, r.schedule, None if mem is None else [mem] * 4)
        assert r.schedule.validate() == []
        assert r.period >= max(p.work.tolist())
        assert r.search_time >= 0
        assert r.method in ("compacted", "ramp_search", "concatenated", "exact", "unrolled", "baseline")
        # Never longer than a baseline that fits the caps (and then it is that baseline's).
        for b in tessel.BASELINES:
            try:
                s = tessel.baseline(b, p, n)
            except ValueError:
                continue
            if s.premise == p and s.parameter_memory == 1 and s.with_memory(mem).count_violations() == 0:
                assert r.schedule.makespan <= s.makespan, b
        if r.method == "baseline":
            assert r.schedule.name in tessel.BASELINES and r.schedule.template is None
        # The template satisfies T1-T3 (the other helper's template validator).
        assert tessel.validate_template(p, r.template, r.period, memory=mem) == []


# Spec §9, first table: optima proved by CP-SAT (FIFO on, convention "start").
OPTIMA = [
    ("vshape", 4, 4, True, 28),
    ("kshape", 6, 3, True, 22),
    ("xshape", 4, 3, True, 30),
    ("xshape", 4, 4, True, 38),
    ("mshape", 6, 4, True, 36),
    ("mshape", 4, 6, True, 48),
    ("mshape", 3, 6, True, 52),
    ("nnshape", 6, 4, True, 44),
    ("vshape", None, 4, False, 7),
    ("xshape", None, 3, False, 8),
    ("mshape", None, 6, False, 15),
    ("nnshape", None, 6, False, 21),
]


@pytest.mark.parametrize(("name", "mem", "n", "train", "opt"), OPTIMA)
def test_exact_reaches_the_cp_sat_optima(name, mem, n, train, opt):
    p = tessel.premise(name, 4, train=train)
    r = tessel.exact(p, n, mem)
    assert r.proved_optimal and r.makespan == opt
    _check(p, r.schedule, None if mem is None else [mem] * 4)


# Spec §9 parity table: (name, D, memory, train, P, reference constant): C <= P N + c.
PARITY = [
    ("vshape", 4, 4, True, 4, 16),
    ("xshape", 4, 4, True, 8, 14),
    ("mshape", 4, 6, True, 6, 12),
    ("nnshape", 4, 6, True, 8, 19),
    ("kshape", 4, 6, True, 6, 7),
    ("mshape", 4, 4, True, 7, 9),
    ("mshape", 6, 20, True, 6, 50),
    ("kshape", 8, None, False, 2, 4),
]


@pytest.mark.parametrize(("name", "d", "mem", "train", "per", "c"), PARITY)
def test_parity_with_the_reference(name, d, mem, train, per, c):
    p = tessel.premise(name, d, train=train)
    for n in (8, 32, 128):
        r = tessel.search(p, memory=mem, nmicros=n)
        assert r.period == per
        assert r.schedule.makespan <= per * n + c


def test_tessel_style_completion_on_memory_tight_mshape():
    # The reference composes warm-up | repetend | cool-down and reaches 7N+9 here; compaction
    # alone gives 7N+11 (concat_budget=0 turns the Tessel-style completion off).
    p = tessel.premise("mshape", 4)
    for n in (8, 32):
        r = tessel.search(p, memory=4, nmicros=n)
        assert r.period == 7 and r.method == "concatenated"
        assert r.schedule.makespan <= 7 * n + 7
        _check(p, r.schedule, [4] * 4)
        assert any(m == "concatenated" for *_, m in r.candidates)
        off = tessel.search(p, memory=4, nmicros=n, concat_budget=0, ramp_budget=0)
        assert off.method == "compacted" and off.schedule.makespan == 7 * n + 11
        _check(p, off.schedule, [4] * 4)


def test_tight_memory_where_modulo_scheduling_fails_still_gets_a_schedule():
    # Two pipelines crossing the same 4 devices with room for one activation per device: the
    # repetend search's periods near the lower bound hold no template and modulo scheduling
    # (memory-blind until its final check) breaks the cap; one micro-batch scheduled alone,
    # repeated at the smallest valid period, is the template. It used to raise InfeasibleError.
    p = tessel.premise("xshape", 4)
    spans = np.array([b.span for b in p.blocks])
    for n in (2, 4, 40):
        s = tessel.search(p, memory=1, nmicros=n, time_limit=1, node_budget=20_000)
        _check(p, s.schedule, [1] * 4)
        assert s.proved_optimal is False
        # The template, unrolled every `period`, is itself a valid schedule within the caps
        # (the oracle's check), and the completion is never longer.
        t = np.asarray(s.template)
        unrolled = t[None, :] + s.period * np.arange(n)[:, None]
        unrolled -= unrolled.min()
        v = orc.violations(*_data(p), unrolled, caps=[1] * 4)
        assert v == {"V0": 0, "V1": 0, "V2": 0, "V3": 0, "V4": 0}, v
        assert s.schedule.makespan <= (unrolled + spans[None, :]).max()
    # With time left, search()'s exact pass proves its schedule optimal (n = 2: 55, as
    # tessel.exact finds).
    s = tessel.search(p, memory=1, nmicros=2, time_limit=60, node_budget=20_000)
    assert s.makespan_optimal and s.schedule.makespan == 55


def test_infeasible_memory_raises_infeasible_error():
    p = tessel.premise("vshape", 4)
    with pytest.raises(InfeasibleError):
        tessel.search(p, memory=0, nmicros=4)
    with pytest.raises(ValueError):  # InfeasibleError is a ValueError
        tessel.exact(p, 3, 0)


def test_memory_forced_by_precedence_is_infeasible_before_any_search():
    # kshape at memory 1: the fused forward M_f allocates on every device while each stage's
    # own forward (its ancestor) still holds its activation, so one micro-batch needs 2 units.
    # search, exact and the repetend construction say so at once (they used to spend their
    # whole time limit and then report that nothing was found, without proof).
    p = tessel.premise("kshape", 4)
    for run in (
        lambda: tessel.search(p, memory=1, nmicros=8, time_limit=None),
        lambda: tessel.exact(p, 1, 1),
    ):
        with pytest.raises(InfeasibleError, match="holds at least 2 on device 0 when block 4"):
            run()
    # With one more unit the schedule exists: tessel.exact proves the optimum of N = 1, the
    # critical path F0 -> F1 -> M_f -> M_b -> B1 -> B0.
    s = tessel.exact(p, 1, 2)
    assert s.proved_optimal and s.makespan == 1 + 1 + 1 + 1 + 3 + 3


def test_user_graph_and_periodic_k():
    # Two towers into a fusion block over both devices (a small K shape), with a lag.
    p = tessel.Premise.from_blocks(
        [
            {"span": 1, "devices": 0, "memory": 1, "name": "a"},
            {"span": 2, "devices": 1, "memory": 1, "name": "b"},
            {"span": 1, "devices": [0, 1], "memory": 0, "name": "fuse"},
            {"span": 2, "devices": 0, "memory": -1, "kind": "backward", "name": "a'"},
            {"span": 3, "devices": 1, "memory": -1, "kind": "backward", "name": "b'"},
        ],
        [(0, 2), (1, 2), (2, 3), (2, 4)],
        lags={(0, 2): 1},
    )
    for k in (1, 2, 3):
        r = tessel.search(p, memory=3, nmicros=7, periodic_k=k)
        assert r.periodic_k == k
        assert r.schedule.validate() == []
        spans, devices, memory, edges, _ = _data(p)
        lags = [1 if e == (0, 2) else 0 for e in edges]
        v = orc.violations(spans, devices, memory, edges, lags, np.asarray(r.schedule.starts), caps=[3, 3])
        assert sum(v.values()) == 0


def test_identical_on_one_and_two_threads():
    before = maleki_rs.get_num_threads()
    try:
        out = []
        for t in (1, 2):
            maleki_rs.set_num_threads(t)
            rs = [tessel.search(tessel.premise(nm, 4), memory=6, nmicros=12) for nm in ("mshape", "nnshape", "xshape")]
            rs.append(tessel.search(tessel.premise("mshape", 4), memory=4, nmicros=32))
            out.append([(r.period, r.template.tolist(), r.schedule.starts.tolist()) for r in rs])
        assert out[0] == out[1]
    finally:
        maleki_rs.set_num_threads(before)


def test_progress_is_reported_and_can_stop_the_search():
    p = tessel.premise("nnshape", 4)
    calls = []

    class Stop(Exception):
        pass

    def cb(done, total):
        calls.append((done, total))
        raise Stop

    # nnshape N=6 takes seconds to prove: the first progress report (every 100 ms) stops it.
    with pytest.raises(Stop):
        tessel.exact(p, 6, 6, progress=cb)
    assert calls
    # The repetend search reports too: the 2-periodic replica of the memory-tight M-shape takes
    # seconds (periods below 2 P* are proved infeasible node by node).
    seen = []

    def cb2(done, total):
        seen.append((done, total))
        raise Stop

    with pytest.raises(Stop):
        tessel.search(tessel.premise("mshape", 4), memory=4, nmicros=8, periodic_k=2, progress=cb2)
    assert seen and seen[0][1] > 0
    # A budget ends the proof without an error.
    r = tessel.exact(p, 6, 6, node_budget=2000)
    assert not r.proved_optimal and r.schedule is not None
    _check(p, r.schedule, [6] * 4)


def test_repetends_match_the_search():
    p = tessel.premise("mshape", 4)
    ps, proved, rows = tessel.repetends(p, memory=4)
    assert ps == 7 and proved
    assert rows[0].period == 7 and rows[0].exhausted
    assert rows[0].length >= p.critical_path
    # Shorter templates at larger periods only (otherwise they would be dominated).
    assert all(a.length > b.length for a, b in zip(rows, rows[1:]))


def _brute_optimum(ndevs, spans, devices, memory, edges, nmicros, cap):
    """Exhaustive serial schedule generation (every dispatch order), FIFO on."""
    n = len(spans)
    preds = [[a for a, b in edges if b == g] for g in range(n)]

    @lru_cache(maxsize=None)
    def rec(counts, ends, free, level):
        if all(c == nmicros for c in counts):
            return 0
        best = math.inf
        for g in range(n):
            j = counts[g]
            if j >= nmicros or any(counts[f] <= j for f in preds[g]):
                continue
            if memory[g] > 0 and any(level[d] + memory[g] > cap for d in devices[g]):
                continue
            t = max([ends[j * n + f] for f in preds[g]] + [free[d] for d in devices[g]] + [0])
            e = t + spans[g]
            nc = counts[:g] + (j + 1,) + counts[g + 1 :]
            ne = ends[: j * n + g] + (e,) + ends[j * n + g + 1 :]
            nf = tuple(e if d in devices[g] else free[d] for d in range(ndevs))
            nl = tuple(level[d] + (memory[g] if d in devices[g] else 0) for d in range(ndevs))
            best = min(best, max(e, rec(nc, ne, nf, nl)))
        return best

    return rec((0,) * n, (0,) * (n * nmicros), (0,) * ndevs, (0,) * ndevs)


def test_random_premises_against_exhaustive_search():
    rnd = random.Random(7)
    checked = 0
    while checked < 25:
        ndevs, spans, devices, memory, kinds, edges = orc.random_premise(rnd, max_devs=3, max_blocks=4)
        p = tessel.Premise.from_blocks(
            [{"span": s, "devices": d, "memory": m, "kind": k} for s, d, m, k in zip(spans, devices, memory, kinds)],
            edges,
            ndevs=ndevs,
        )
        for n in (1, 2):
            cap = 2
            opt = _brute_optimum(ndevs, spans, devices, memory, edges, n, cap)
            if opt == math.inf:
                with pytest.raises(InfeasibleError):
                    tessel.exact(p, n, cap)
                continue
            r = tessel.exact(p, n, cap)
            assert r.proved_optimal and r.makespan == opt
            s = tessel.search(p, memory=cap, nmicros=n, exact_jobs=0)
            _check(p, s.schedule, [cap] * ndevs)
            assert s.schedule.makespan >= opt
        checked += 1


SEARCH_ARGS = st.fixed_dictionaries(
    {},
    optional={
        "memory": st.one_of(st.none(), st.integers(-3, 50), st.lists(st.integers(-1, 9), max_size=5), st.just(math.nan)),
        "nmicros": st.one_of(st.integers(-2, 40), st.just(2**70), st.floats(), st.text(alphabet=st.characters(codec="ascii"), max_size=2)),
        "time_limit": st.one_of(st.none(), st.floats(allow_nan=True), st.integers(-1, 3)),
        "periodic_k": st.one_of(st.integers(-1, 5), st.none()),
        "delta_p": st.integers(-2, 100),
        "memory_convention": st.one_of(st.sampled_from(["start", "alloc_start_free_end", "x"]), st.integers()),
        "node_budget": st.integers(-5, 10**6),
        "concat_budget": st.one_of(st.integers(-5, 10**4), st.floats(), st.none()),
        "exact_jobs": st.integers(-1, 20),
    },
)


@settings(max_examples=120, deadline=None)
@given(args=SEARCH_ARGS, name=st.sampled_from(["vshape", "mshape", "kshape"]))
def test_bad_arguments_never_panic(args, name):
    p = tessel.premise(name, 4)
    args.setdefault("nmicros", 4)
    try:
        r = tessel.search(p, **args)
    except (ValueError, TypeError, MalekiError):
        return
    except BaseException as exc:  # noqa: BLE001 - a PanicException derives from BaseException
        pytest.fail(f"search({args}) raised {type(exc).__module__}.{type(exc).__name__}: {exc}")
    assert r.schedule.validate() == []


@pytest.mark.parametrize("bad", [None, 3, "vshape", object(), np.zeros(3)])
def test_premise_argument_is_checked(bad):
    for fn in (lambda: tessel.search(bad, nmicros=4), lambda: tessel.exact(bad, 4), lambda: tessel.repetends(bad)):
        with pytest.raises(TypeError):
            fn()


def test_cli_search_and_compare(tmp_path, capsys):
    from maleki_rs.cli import main

    out = tmp_path / "s.json"
    assert main(["tessel", "search", "--premise", "mshape", "--ndevs", "4", "--nmicros", "32", "--memory", "6",
                 "--out", str(out)]) == 0
    s = tessel.Schedule.from_json(out.read_text())
    assert s.makespan == 6 * 32 + 12 and s.validate() == []
    assert main(["tessel", "compare", "--premise", "vshape", "--ndevs", "4", "--nmicros", "8", "--memory", "4"]) == 0
    text = capsys.readouterr().out
    assert "tessel (search)" in text and "1f1b" in text


@pytest.mark.slow
def test_cp_sat_cross_check():
    """Optional: CP-SAT (ortools) proves the same optima on a full model of each instance."""
    pytest.importorskip("ortools")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benches"))
    from tessel_bench import cpsat_full

    for name, mem, n, train, opt in OPTIMA[:4]:
        p = tessel.premise(name, 4, train=train)
        value, proved, _ = cpsat_full(p, n, mem, time_limit=60)
        assert proved and value == opt
