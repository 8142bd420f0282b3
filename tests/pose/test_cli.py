"""``maleki pose simulate`` and the pose part of ``maleki tour``."""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys

import pytest

from maleki_rs import cli
from maleki_rs.pose import _cli
from maleki_rs.pose import simulate_scans
from maleki_rs.pose._validation import chi2_band, monte_carlo


def test_simulate_prints_the_figures(capsys):
    assert cli.main(["pose", "simulate", "--scenario", "S1", "--runs", "500", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    for text in ("scenario S1: 500 runs", "ANEES vs own covariance", "99% chi-square band", "RMS rotation error",
                 "RMS position error", "TLS/Kabsch", "iterations", "poses/s"):
        assert text in out, text


def test_simulate_is_deterministic(capsys):
    cli.main(["pose", "simulate", "--scenario", "S4", "--runs", "200", "--seed", "9"])
    first = capsys.readouterr().out.splitlines()[:6]
    cli.main(["pose", "simulate", "--scenario", "S4", "--runs", "200", "--seed", "9"])
    assert capsys.readouterr().out.splitlines()[:6] == first


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib not installed")
def test_plot_is_written(tmp_path, capsys):
    out = tmp_path / "errors.png"
    assert cli.main(["pose", "simulate", "--scenario", "S6", "--runs", "100", "--plot", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(out) in capsys.readouterr().out


def _parse_error(argv, capsys) -> str:
    """The one-line argparse error of ``maleki argv`` (exit status 2)."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch, tmp_path, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert "needs matplotlib" in _parse_error(["pose", "simulate", "--runs", "10", "--plot", str(tmp_path / "x.png")],
                                              capsys)


def test_bad_arguments(capsys):
    out = subprocess.run([sys.executable, "-m", "maleki_rs", "pose", "simulate", "--scenario", "S9"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "invalid choice" in out.stderr
    assert _parse_error(["pose", "simulate", "--runs", "0"], capsys).endswith("argument --runs: must be >= 1, got 0")
    # The flags are named, not the library's parameters (n_points, seed).
    line = _parse_error(["pose", "simulate", "--points", "2"], capsys)
    assert line.endswith("argument --points: must be >= 3, got 2")
    assert _parse_error(["pose", "simulate", "--seed", "-1"], capsys).endswith("argument --seed: must be >= 0, got -1")


@pytest.mark.parametrize("plot, why", [
    ("noext", "unknown extension"),  # matplotlib would write noext.png
    ("g.xyz", "unknown extension"),
    ("DIR", "is a directory"),  # matplotlib would write DIR.png
    ("missing/p.png", "does not exist"),
])
def test_plot_path_is_checked_before_running(plot, why, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "DIR").mkdir()
    monkeypatch.setattr(_cli, "monte_carlo", lambda *a, **k: pytest.fail("ran before checking --plot"))
    line = _parse_error(["pose", "simulate", "--runs", "50", "--plot", plot], capsys)
    assert line.startswith("maleki pose simulate: error: argument --plot:") and why in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["DIR"]  # nothing written


def test_report_counts_unconverged_scans_and_says_mean_points():
    mc = monte_carlo("S1", runs=20, seed=1)
    assert "converged 20 of 20 scans, 0 at the iteration limit, 0 failed" in mc.report()
    # One scan in 20000 at the iteration limit: a percentage would round it to 100.00%.
    odd = dataclasses.replace(mc, runs=20000, converged=19999 / 20000, at_limit=1, failed=0, points=34 / 3)
    text = odd.report()
    assert "converged 19999 of 20000 scans, 1 at the iteration limit, 0 failed" in text
    assert text.splitlines()[0] == "scenario S1: 20000 runs, mean 11.33 points per scan"
    one = dataclasses.replace(mc, runs=1, converged=0.0, at_limit=0, failed=1)
    assert one.report().splitlines()[0] == "scenario S1: 1 run, 20 points per scan"
    assert "converged 0 of 1 scan, 0 at the iteration limit, 1 failed" in one.report()
    # A real run counts its scans by status, as the batch estimate of the same scans does.
    few = monte_carlo("S5", runs=300, seed=0, n_points=3)
    status = simulate_scans(300, 3, scenario="S5", seed=0).estimate().status
    assert (few.at_limit, few.failed) == (int((status == 1).sum()), int((status >= 2).sum()))


def test_help_shows_one_percent_sign(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["pose", "simulate", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "99% chi-square band" in out and "%%" not in out


def test_tour(capsys):
    _cli.tour()
    out = capsys.readouterr().out
    assert "scenario S1: 2000 runs" in out and "TLS reduces the RMS error against Kabsch" in out


def test_chi2_band_matches_scipy(monkeypatch):
    stats = pytest.importorskip("scipy.stats")
    for dof in (60, 600, 60_000):
        exact = (stats.chi2.ppf(0.005, dof), stats.chi2.ppf(0.995, dof))
        assert chi2_band(dof) == pytest.approx(exact, rel=1e-5 if dof >= 1000 else 1e-12)
    monkeypatch.setitem(sys.modules, "scipy.stats", None)
    assert chi2_band(600) == pytest.approx((stats.chi2.ppf(0.005, 600), stats.chi2.ppf(0.995, 600)), rel=1e-4)
