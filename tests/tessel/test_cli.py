"""The ``maleki tessel`` command and the tour."""

from __future__ import annotations

import json
import os

import pytest

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


def _parse_error(argv, capsys) -> str:
    """The one-line argparse error of ``maleki argv`` (exit status 2)."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("ndevs", ["0", "-2", "1000000", "two"])
def test_premises_rejects_a_bad_device_count_once(ndevs, capsys):
    line = _parse_error(["tessel", "premises", "--ndevs", ndevs], capsys)
    assert line.startswith("maleki tessel premises: error: argument --ndevs:")
    assert capsys.readouterr().out == ""  # no table of per-premise errors


@pytest.mark.parametrize("flags, why", [
    (["--out", "x.xml"], "argument --out: x.xml: unknown extension"),
    (["--out", "missing/m.json"], "argument --out: missing/m.json: directory 'missing' does not exist"),
    (["--plot", "g.xyz"], "argument --plot: g.xyz: unknown extension"),
    (["--plot", "gantt"], "argument --plot: gantt: unknown extension"),
    (["--out", "m.json", "--out", "m.bogus"], "argument --out: m.bogus: unknown extension"),
    (["--out", "DIR"], "argument --out: DIR: is a directory"),
])
def test_output_paths_are_checked_before_running(flags, why, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "DIR").mkdir()
    monkeypatch.setattr(_cli, "baseline", lambda *a, **k: pytest.fail("ran before checking the outputs"))
    line = _parse_error(["tessel", "baseline", "1f1b", "--premise", "vshape", *flags], capsys)
    assert f"error: {why}" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["DIR"]  # m.json not written either


def test_simulate_times_the_orders_whatever_the_file_stores(tmp_path, capsys):
    p = tessel.premise("vshape", 4)
    ref = tessel.baseline("1f1b", p, 4)  # ASAP already: re-timing its orders gives it back
    data = json.loads(ref.to_json())
    data["starts"][0][0] = -5  # stored starts that break V0
    path = tmp_path / "m.json"
    path.write_text(json.dumps(data))
    assert cli.main(["tessel", "validate", str(path)]) == 1
    assert "V0" in capsys.readouterr().out
    assert cli.main(["tessel", "simulate", str(path)]) == 0
    plain = capsys.readouterr().out
    assert cli.main(["tessel", "simulate", str(path), "--lag", "0"]) == 0
    assert capsys.readouterr().out == plain  # vshape's own lags are 0
    assert plain.startswith(f"1f1b: D=4 N=4  makespan {ref.makespan} ") and "valid (V0-V4 hold)" in plain
    # A lag keeps the schedule's name and times it anew.
    assert cli.main(["tessel", "simulate", str(path), "--lag", "2"]) == 0
    lagged = tessel.simulate(p, ref.orders(), lag=2)
    assert capsys.readouterr().out.startswith(f"1f1b: D=4 N=4  makespan {lagged.makespan} ")


def test_premise_flags_a_file_would_ignore_are_errors(tmp_path, capsys):
    path = tmp_path / "m.json"
    tessel.baseline("1f1b", tessel.premise("vshape", 4), 4).to_json(path)
    assert cli.main(["tessel", "simulate", str(path), "--premise", "vshape", "--ndevs", "2", "--fwd", "5"]) == 2
    assert capsys.readouterr().err == (f"maleki: error: {path}: the file holds its own premise; "
                                       "drop --premise, --ndevs, --fwd\n")
    csv = tmp_path / "o.csv"
    tessel.baseline("1f1b", tessel.premise("vshape", 2), 4).to_csv(csv)
    assert cli.main(["tessel", "simulate", str(csv), "--ndevs", "2"]) == 2
    assert capsys.readouterr().err == "maleki: error: --ndevs: give --premise too\n"


def test_file_errors_name_the_file(tmp_path, capsys):
    bad = tmp_path / "x.csv"
    bad.write_text("0F0\n")
    assert cli.main(["tessel", "simulate", str(bad), "--premise", "vshape"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"maleki: error: {bad}: ") and "text:" not in err and err.count("\n") == 1
    binary = tmp_path / "b.json"
    binary.write_bytes(bytes([0x96, 0xFF, 0x00]))
    assert cli.main(["tessel", "validate", str(binary)]) == 2
    assert capsys.readouterr().err == f"maleki: error: {binary}: not a text file (byte 0 is not UTF-8)\n"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_failed_write_names_the_file(tmp_path, capsys):
    full = tmp_path / "full.csv"
    full.symlink_to("/dev/full")  # every write fails with ENOSPC, as on a full disk
    assert cli.main(["tessel", "baseline", "1f1b", "--premise", "vshape", "--out", str(full)]) == 1
    assert capsys.readouterr().err == f"maleki: error: [Errno 28] No space left on device: '{full}'\n"


def test_compare_says_no_cap_and_prints_whole_reasons(capsys):
    assert cli.main(["tessel", "compare", "--premise", "mshape", "--nmicros", "8", "--time-limit", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("mshape, D=4, N=8, no memory cap: LB(N) = ") and "None" not in out
    with pytest.raises(ValueError) as exc:
        tessel.baseline("inference_pipe", tessel.premise("mshape", 4), 8)
    reason = str(exc.value).split(":", 1)[-1].strip()
    assert len(reason) > 70 and f"(n/a: {reason})" in out


def test_simulate_keeps_chimeras_doubled_parameters_and_flags_are_refused_once(tmp_path, capsys):
    # Review of stop 34: re-timing dropped parameter_memory (Chimera holds its parameters
    # twice), and a flag on our JSON asked for --premise, then to drop it.
    path = tmp_path / "ch.json"
    assert cli.main(["tessel", "baseline", "chimera", "--premise", "vshape", "--nmicros", "8", "--out", str(path)]) == 0
    out = tmp_path / "again.json"
    capsys.readouterr()
    assert cli.main(["tessel", "simulate", str(path), "--out", str(out)]) == 0
    assert "(x2 parameters)" in capsys.readouterr().out
    assert tessel.Schedule.from_json(out.read_text()).parameter_memory == 2
    assert cli.main(["tessel", "validate", str(path), "--inference"]) == 2
    assert capsys.readouterr().err.strip().endswith("the file holds its own premise; drop --inference")


def test_search_progress_flag_reaches_the_search(monkeypatch, capsys):
    from maleki_rs.tessel import _search_cli

    seen = []
    real = _search_cli.search

    def recording(*args, **kwargs):
        seen.append(kwargs.get("progress"))
        return real(*args, **kwargs)

    monkeypatch.setattr(_search_cli, "search", recording)
    base = ["tessel", "search", "--premise", "vshape", "--nmicros", "4", "--memory", "4"]
    assert cli.main(base) == 0 and cli.main([*base, "--progress"]) == 0
    assert seen == [False, True]
