"""``maleki pose ...`` and the pose part of ``maleki tour``."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..cli import PLOT_SUFFIXES, int_arg, out_path, writing
from ._simulate import SCENARIOS
from ._validation import MonteCarlo, monte_carlo


def register(subparsers: argparse._SubParsersAction) -> None:
    pose = subparsers.add_parser("pose", help="total-least-squares pose estimation")
    sub = pose.add_subparsers(dest="pose_command", metavar="COMMAND")
    sim = sub.add_parser(
        "simulate",
        help="Monte-Carlo run of a scenario: ANEES, chi-square fit, RMS against Kabsch",
        # argparse %-formats a description only when it holds "%(prog)", so this one takes a
        # plain "%" (help strings, always %-formatted, need "%%").
        description="Simulates scans of a scenario, solves them in one batch and checks the estimator: "
        "ANEES against its 99% chi-square band, the chi-square fit statistic, and the RMS errors "
        "against the Kabsch/Horn baseline.",
    )
    sim.add_argument("--scenario", choices=sorted(SCENARIOS), default="S1", help="scenario (default S1)")
    sim.add_argument("--runs", type=int_arg(1), default=10_000,
                     help="number of scans (default 10000; S6: trajectory length)")
    sim.add_argument("--points", type=int_arg(3), default=None, help="points per scan, >= 3 (default: the scenario's)")
    sim.add_argument("--seed", type=int_arg(0, 2**64 - 1), default=0, help="random seed (default 0)")
    sim.add_argument("--plot", type=out_path(PLOT_SUFFIXES, plot=True), default=None, metavar="OUT.png",
                     help="write an error-vs-3-sigma plot as .png, .pdf or .svg (needs matplotlib)")
    sim.set_defaults(func=_simulate)
    pose.set_defaults(func=lambda _args: (pose.print_help(), 2)[1])


def _simulate(args: argparse.Namespace) -> int:
    mc = monte_carlo(args.scenario, runs=args.runs, seed=args.seed, n_points=args.points)
    if args.plot is not None:
        with writing(args.plot):  # before printing: a reader that stops early (| head) must not cost the file
            _plot(mc, args.plot)
    print(mc.report())
    if args.plot is not None:
        print(f"  plot                      {args.plot}")
    return 0


def _plot(mc: MonteCarlo, path: Path, max_runs: int = 500) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    k = min(max_runs, mc.errors.shape[0])
    x = np.arange(k)
    fig, axes = plt.subplots(6, 1, figsize=(9, 11), sharex=True)
    labels = ["θx [mrad]", "θy [mrad]", "θz [mrad]", "δtx", "δty", "δtz"]
    for j, ax in enumerate(axes):
        scale = 1e3 if j < 3 else 1.0
        e = mc.errors[:k, j] * scale
        s3 = 3 * mc.sigmas[:k, j] * scale
        ax.plot(x, e, ".", ms=3, color="C0", label="error")
        ax.plot(x, s3, "-", lw=0.8, color="C3", label="±3σ")
        ax.plot(x, -s3, "-", lw=0.8, color="C3")
        ax.set_ylabel(labels[j])
        inside = np.mean(np.abs(mc.errors[:, j]) <= 3 * mc.sigmas[:, j])
        ax.set_title(f"{100 * inside:.2f}% within 3σ", fontsize=8, loc="right")
    axes[0].legend(loc="upper left", fontsize=8)
    axes[-1].set_xlabel("scan" if mc.scenario == "S6" else "Monte-Carlo run")
    fig.suptitle(f"TLS pose errors vs ±3σ of the estimated covariance ({mc.scenario}, {mc.runs} run{'' if mc.runs == 1 else 's'}, "
                 f"ANEES {mc.anees:.3f})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def tour() -> None:
    """A short S1 run: 2,000 scans of 20 points with full cross-correlated covariances."""
    mc = monte_carlo("S1", runs=2_000, seed=2026)
    print("TLS pose (total least squares with full 6x6 per-point covariances), scenario S1:")
    print(mc.report())
    print(f"  TLS reduces the RMS error against Kabsch by {100 * (1 - mc.rms_rot_tls / mc.rms_rot_kabsch):.0f}% "
          f"(rotation) and {100 * (1 - mc.rms_pos_tls / mc.rms_pos_kabsch):.0f}% (position), "
          f"with a covariance that matches its errors (ANEES {mc.anees:.3f}).")
