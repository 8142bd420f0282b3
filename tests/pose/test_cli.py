"""``maleki pose simulate`` and the pose part of ``maleki tour``."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from maleki_rs import cli
from maleki_rs.pose import _cli
from maleki_rs.pose._validation import chi2_band


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


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch, tmp_path, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert cli.main(["pose", "simulate", "--runs", "10", "--plot", str(tmp_path / "x.png")]) == 2
    assert "needs matplotlib" in capsys.readouterr().err


def test_bad_arguments():
    out = subprocess.run([sys.executable, "-m", "maleki_rs", "pose", "simulate", "--scenario", "S9"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "invalid choice" in out.stderr
    assert cli.main(["pose", "simulate", "--runs", "0"]) == 2


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
