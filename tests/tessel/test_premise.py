"""Premises: built-ins, user graphs, derived quantities and clear errors."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from maleki_rs import tessel
from maleki_rs.tessel import Block, Premise

from ._oracles import heads_tails, lower_bound


def test_builtins_match_the_spec():
    v = tessel.premise("vshape", ndevs=4)
    assert v.nblocks == 8 and v.ndevs == 4
    assert [b.name for b in v.blocks] == ["F0", "F1", "F2", "F3", "B3", "B2", "B1", "B0"]
    assert v.work.tolist() == [4, 4, 4, 4] and v.work.dtype == np.int64
    assert v.edges == tuple((g, g + 1) for g in range(7))
    m = tessel.premise("mshape", ndevs=4, fwd=2, bwd=5, tp_fwd=3)
    assert m.blocks[0] == Block(span=3, devices=(0, 1, 2, 3), memory=0, kind="forward", name="T_f")
    assert m.work.tolist() == [2 + 5 + 3 + 1] * 4
    i = tessel.premise("kshape", ndevs=4, train=False)
    assert i.is_inference and all(b.kind == "forward" for b in i.blocks)
    for name in tessel.PREMISES:
        p = tessel.premise(name, ndevs=4)
        assert p.nblocks >= 8
        assert p.period_lower_bound == p.work.max()


def test_derived_quantities_match_an_independent_oracle():
    for name in tessel.PREMISES:
        p = tessel.premise(name, ndevs=4)
        spans = [b.span for b in p.blocks]
        devs = [set(b.devices) for b in p.blocks]
        head, tail = heads_tails(spans, p.edges, p.lags)
        assert p.heads.tolist() == head and p.tails.tolist() == tail
        assert p.critical_path == max(h + s + t for h, s, t in zip(head, spans, tail))
        for n in (1, 5, 32):
            assert p.lower_bound(n) == lower_bound(spans, devs, p.edges, p.lags, p.ndevs, n)


def test_from_blocks_round_trips_and_pickles():
    blocks = [
        {"span": 2, "devices": [0, 1], "memory": 0, "kind": "other", "name": "embed"},
        Block(span=1, devices=(0,), memory=2, kind="forward", name="f"),
        {"span": 3, "devices": 0, "memory": -2, "kind": "backward"},
    ]
    p = Premise.from_blocks(blocks, [(0, 1), (1, 2)], lags={(0, 1): 1})
    assert p.ndevs == 2 and p.lags == (1, 0)
    assert p.blocks[2].name == "g2" and p.blocks[2].devices == (0,)
    assert Premise.from_json(p.to_json()) == p
    assert pickle.loads(pickle.dumps(p)) == p
    assert hash(Premise.from_json(p.to_json())) == hash(p)
    assert p != tessel.premise("vshape", 2)
    assert p.to_dict()["edges"] == [[0, 1], [1, 2]]


@pytest.mark.parametrize(
    ("blocks", "edges", "kwargs", "exc", "match"),
    [
        ([{"span": 1, "devices": [0]}, {"span": 1, "devices": [0]}], [(0, 1), (1, 0)], {}, ValueError, "cycle"),
        ([{"span": 1, "devices": [0], "memory": 1}], [], {}, ValueError, "unbalanced memory"),
        ([{"span": 1, "devices": [0], "memory": 1}, {"span": 1, "devices": [0], "memory": -1}], [(1, 0)], {}, ValueError, "negative running memory"),
        ([{"span": 1, "devices": []}], [], {}, ValueError, "empty"),
        ([{"span": 0, "devices": [0]}], [], {}, ValueError, "span"),
        ([{"span": 1, "devices": [3]}], [], {"ndevs": 2}, ValueError, "out of range"),
        ([{"span": 1, "devices": [0]}], [(0, 5)], {}, ValueError, "outside"),
        ([{"span": 1, "devices": [0]}, {"span": 1, "devices": [0]}], [(0, 1), (0, 1)], {}, ValueError, "repeated"),
        ([{"span": 1, "devices": [0], "kind": "sideways"}], [], {}, ValueError, "kind"),
        ([{"span": 1, "devices": [0], "colour": "red"}], [], {}, ValueError, "unknown keys"),
        ([{"span": 1.5, "devices": [0]}], [], {}, TypeError, "span"),
        ([{"span": 1, "devices": [0]}, {"span": 1, "devices": [0]}], [(0, 1)], {"lags": [-1]}, ValueError, "lags"),
        ([], [], {}, ValueError, "at least one block"),
        ("abc", [], {}, TypeError, "blocks"),
    ],
)
def test_bad_premises_give_clear_errors(blocks, edges, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        Premise.from_blocks(blocks, edges, **kwargs)


def test_bad_builtin_arguments():
    with pytest.raises(ValueError, match="unknown premise"):
        tessel.premise("zshape")
    with pytest.raises(TypeError, match="unknown keyword"):
        tessel.premise("vshape", 4, forward=2)
    with pytest.raises(ValueError, match="fwd"):
        tessel.premise("vshape", 4, fwd=0)
    with pytest.raises(ValueError, match="even"):
        tessel.premise("kshape", 3)
    with pytest.raises(ValueError, match="ndevs"):
        tessel.premise("vshape", 0)
    with pytest.raises(TypeError):
        tessel.premise("vshape", 4.5)
    with pytest.raises(ValueError, match="fwd_spans"):
        tessel.premise("uneven", 4, fwd_spans=[1, 2])
    with pytest.raises(TypeError, match="Premise"):
        Premise(object())
