"""The ``maleki tessel`` command and the tour."""

from __future__ import annotations

import json

from maleki_rs import cli, tessel
from maleki_rs.tessel import _cli


def test_baseline_writes_every_format(tmp_path, capsys):
    outs = [tmp_path / f"s.{e}" for e in ("json", "tessel.json", "csv", "txt", "svg")]
    args = ["tessel", "baseline", "1f1b+", "--premise", "mshape", "--ndevs", "4", "--nmicros", "6", "--memory", "4"]
    for o in outs:
        args += ["--out", str(o)]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    ref = tessel.baseline("1f1b+", tessel.premise("mshape", 4), 6)
    assert f"makespan {ref.makespan}" in out and "valid" in out
    assert json.loads(outs[0].read_text())["metrics"]["makespan"] == ref.makespan
    assert outs[4].read_text().startswith("<svg")
    # The files read back.
    assert cli.main(["tessel", "validate", str(outs[0])]) == 0
    assert cli.main(["tessel", "simulate", str(outs[2]), "--premise", "mshape", "--ndevs", "4"]) == 0
    assert cli.main(["tessel", "validate", str(outs[3]), "--premise", "mshape", "--ndevs", "4"]) == 0
    assert cli.main(["tessel", "validate", str(outs[1]), "--premise", "mshape", "--ndevs", "4"]) == 0
    # Against a tighter cap the same schedule is invalid, and the command says why.
    assert cli.main(["tessel", "validate", str(outs[0]), "--memory", "2"]) == 1
    assert "V3" in capsys.readouterr().out


def test_errors_are_reported_not_raised(tmp_path, capsys):
    assert cli.main(["tessel", "baseline", "chimera", "--premise", "mshape"]) == 2
    assert "V pipeline" in capsys.readouterr().err
    bad = tmp_path / "x.csv"
    bad.write_text("0F0\n")
    assert cli.main(["tessel", "simulate", str(bad)]) == 2
    assert cli.main(["tessel", "premises"]) == 0
    assert "mshape" in capsys.readouterr().out


def test_tour_prints_baselines_against_the_bound(capsys):
    _cli.tour()
    out = capsys.readouterr().out
    assert "LB(N) = 76" in out and "1f1b" in out and "zb_h1" in out
    assert "NO" not in out.split("zb_v")[0]  # every baseline printed is valid
