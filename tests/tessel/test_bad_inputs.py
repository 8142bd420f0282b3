"""Bad inputs give ValueError/TypeError (or a domain error), never a Rust panic."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maleki_rs import tessel
from maleki_rs.exceptions import MalekiError
from maleki_rs.tessel import Premise, Schedule

EXPECTED = (ValueError, TypeError, MalekiError, OSError)

BAD_VALUES = [
    None, -1, 0, 1, 2**40, -(2**63), 2**64, 1.5, math.nan, math.inf, "x", "", b"x", [], [[]], [-1], [1.5],
    {"a": 1}, (1, 2, 3), np.array([1, 2]), np.zeros((2, 2)), np.full((1, 8), -5), object(), True,
]


def _call(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except EXPECTED:
        pass
    except BaseException as exc:  # noqa: BLE001 - a PanicException derives from BaseException
        pytest.fail(f"{fn.__name__}{args!r} raised {type(exc).__module__}.{type(exc).__name__}: {exc}")


def test_sweep_every_entry_point():
    p = tessel.premise("vshape", 4)
    s = tessel.baseline("1f1b", p, 4)
    for v in BAD_VALUES:
        _call(tessel.premise, v)
        _call(tessel.premise, "vshape", v)
        _call(tessel.premise, "uneven", 4, fwd_spans=v)
        for k in ("fwd", "bwd", "wgt", "tp_fwd", "tp_bwd", "act", "tp_mem", "chunks"):
            _call(tessel.premise, "mshape", 4, **{k: v})
        _call(Premise.from_blocks, v)
        _call(Premise.from_blocks, [{"span": 1, "devices": v}])
        _call(Premise.from_blocks, [{"span": v, "devices": [0]}])
        _call(Premise.from_blocks, [{"span": 1, "devices": [0], "memory": v}])
        _call(Premise.from_blocks, [{"span": 1, "devices": [0]}], v)
        _call(Premise.from_blocks, [{"span": 1, "devices": [0]}], ndevs=v)
        _call(Premise.from_blocks, [{"span": 1, "devices": [0]}, {"span": 1, "devices": [0]}], [(0, 1)], lags=v)
        _call(Premise.from_json, v)
        _call(tessel.baseline, v, p, 4)
        _call(tessel.baseline, "1f1b", v, 4)
        _call(tessel.baseline, "1f1b", p, v)
        _call(tessel.simulate, p, v)
        _call(tessel.simulate, p, [v, [], [], []])
        _call(tessel.simulate, p, [[v], [], [], []])
        _call(tessel.simulate, p, starts=v)
        _call(tessel.simulate, p, s.orders(), lag=v)
        _call(tessel.simulate, p, s.orders(), nmicros=v)
        _call(tessel.simulate, p, s.orders(), memory=v)
        _call(Schedule, p, v)
        _call(Schedule, p, s.starts, memory=v)
        _call(Schedule, p, s.starts, memory_convention=v)
        _call(Schedule, p, s.starts, period=v)
        _call(Schedule, p, s.starts, template=v)
        _call(Schedule, p, s.starts, repetend=v)
        _call(Schedule, p, s.starts, repetend=(0, v))
        _call(Schedule, p, s.starts, name=v)
        _call(Schedule, p, s.starts, parameter_memory=v)
        _call(s.validate, v)
        _call(s.memory_timeline, v)
        _call(s.to_text, v)
        _call(s.to_svg, None, width=v)
        _call(s.to_svg, None, title=v)
        _call(Schedule.from_json, v)
        _call(Schedule.from_tessel_json, v)
        _call(Schedule.from_tessel_json, "{}", v)
        _call(Schedule.from_text, v, p)
        _call(Schedule.from_csv, v, p)
        _call(Schedule.from_csv, "0F0\n", v)
        _call(tessel.validate_template, p, v, 4)
        _call(tessel.validate_template, p, [0] * 8, v)
        _call(tessel.validate_template, p, [0] * 8, 4, memory=v)


def test_adversarial_schedules_and_files():
    p = tessel.premise("mshape", 4)
    n = p.nblocks
    for starts in (np.full((3, n), 2**50), np.full((3, n), -(2**50)), np.zeros((1, n)), np.arange(3 * n).reshape(3, n) * 10**9):
        s = Schedule(p, starts, memory=0)
        for fn in (s.validate, s.metrics, s.to_json, s.to_tessel_json, s.to_csv, s.orders, s.count_violations):
            _call(fn)
        _call(s.to_text)
        _call(s.to_text, True)
        _call(s.to_svg)
        _call(lambda: s.makespan)
    good = tessel.baseline("1f1b+", p, 3)
    texts = [good.to_json(), good.to_tessel_json(), good.to_text(), good.to_csv()]
    for t in texts:
        for cut in (0, 1, len(t) // 3, len(t) // 2, len(t) - 2):
            for fn in (Schedule.from_json, lambda x: Schedule.from_tessel_json(x, p), lambda x: Schedule.from_text(x, p), lambda x: Schedule.from_csv(x, p)):
                _call(fn, t[:cut])
                _call(fn, t[:cut] + "9" + t[cut + 1 :])
                _call(fn, t.replace("3", "-3"))
                _call(fn, t.replace("1", "99999999999999999999"))


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(alphabet="fbwo0123456789.-| \n,FBIW{}[]\":", max_size=80),
)
def test_random_text_never_panics(text):
    p = tessel.premise("vshape", 2)
    for fn in (Schedule.from_json, lambda x: Schedule.from_tessel_json(x, p), lambda x: Schedule.from_tessel_json(x),
               lambda x: Schedule.from_text(x, p), lambda x: Schedule.from_csv(x, p), Premise.from_json):
        _call(fn, text)


@settings(max_examples=100, deadline=None)
@given(
    orders=st.lists(st.lists(st.tuples(st.integers(-2, 4), st.integers(-2, 9)), max_size=8), min_size=0, max_size=3),
    lag=st.one_of(st.none(), st.integers(-2, 3), st.lists(st.integers(-1, 3), max_size=4)),
)
def test_random_orders_never_panic(orders, lag):
    p = tessel.premise("vshape", 2)
    _call(tessel.simulate, p, orders, lag=lag)


def test_infeasible_memory_is_reported_not_hidden():
    s = tessel.baseline("gpipe", tessel.premise("vshape", 4), 8).with_memory(2)
    vs = s.validate()
    assert vs and {v.rule for v in vs} == {"V3"}
    assert all(v.device is not None for v in vs)
