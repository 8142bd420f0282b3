"""Monte-Carlo validation of the estimator: ANEES, χ² statistics and RMS against Kabsch.

Used by ``maleki pose simulate``, ``maleki tour`` and the benchmarks.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ._estimate import absolute_orientation_batch
from ._geometry import nees, pose_error
from ._results import PoseEstimateBatch
from ._simulate import Scans, simulate_scans

__all__ = ["chi2_band", "MonteCarlo", "monte_carlo"]

_Z = {0.99: 2.5758293035489004, 0.95: 1.959963984540054, 0.9973: 3.0}


def _wilson_hilferty(dof: float, z: float) -> tuple[float, float]:
    k = float(dof)
    c = 2 / (9 * k)
    return k * (1 - c - z * math.sqrt(c)) ** 3, k * (1 - c + z * math.sqrt(c)) ** 3


def chi2_band(dof: float, level: float = 0.99) -> tuple[float, float]:
    """Two-sided ``level`` interval of ``χ²(dof)``.

    For ``dof >= 1000`` the Wilson-Hilferty approximation is used (relative error below 1e-5
    there, and it spares the CLI scipy's one-second import); otherwise scipy when installed,
    else Wilson-Hilferty (relative error below 4e-4 for dof >= 100).
    """
    z = _Z.get(level)
    if z is not None and dof >= 1000:
        return _wilson_hilferty(dof, z)
    try:
        from scipy.stats import chi2
    except ImportError:
        if z is None:
            raise ValueError(f"level {level} needs scipy") from None
        return _wilson_hilferty(dof, z)
    a = (1 - level) / 2
    return float(chi2.ppf(a, dof)), float(chi2.ppf(1 - a, dof))


@dataclass(frozen=True)
class MonteCarlo:
    """Figures of one Monte-Carlo run (see :func:`monte_carlo`)."""

    scenario: str
    #: Number of scans.
    runs: int
    points: float
    anees: float
    anees_crlb: float
    anees_band: tuple[float, float]
    chi2_ratio: float
    chi2_band: tuple[float, float]
    rms_rot_tls: float
    rms_rot_kabsch: float
    rms_pos_tls: float
    rms_pos_kabsch: float
    mean_iterations: float
    max_iterations: int
    #: Fraction of the scans that converged.
    converged: float
    #: Scans stopped unconverged at the iteration limit (status 1).
    at_limit: int
    #: Scans that failed (status >= 2).
    failed: int
    coverage_3sigma: float
    t_simulate: float
    t_solve: float
    t_kabsch: float
    errors: NDArray[np.float64]
    sigmas: NDArray[np.float64]

    def report(self) -> str:
        lo, hi = self.anees_band
        clo, chi = self.chi2_band
        ok = "inside" if lo <= self.anees <= hi else "OUTSIDE"
        runs = f"{self.runs} run{'' if self.runs == 1 else 's'}"
        # S6's scans differ in size: its figure is a mean.
        pts = f"{self.points:g}" if self.points == int(self.points) else f"mean {self.points:.4g}"
        lines = [
            f"scenario {self.scenario}: {runs}, {pts} points per scan",
            f"  ANEES vs own covariance   {self.anees:.4f}   99% chi-square band [{lo:.4f}, {hi:.4f}] ({ok})",
            f"  ANEES vs CRLB             {self.anees_crlb:.4f}",
            f"  mean chi2 / dof           {self.chi2_ratio:.4f}   99% band [{clo:.4f}, {chi:.4f}]",
            f"  3-sigma coverage          {100 * self.coverage_3sigma:.2f}% (expected 99.73%)",
            f"  RMS rotation error        TLS {np.degrees(self.rms_rot_tls):.5f} deg, Kabsch "
            f"{np.degrees(self.rms_rot_kabsch):.5f} deg  (TLS/Kabsch {self.rms_rot_tls / self.rms_rot_kabsch:.3f})",
            f"  RMS position error        TLS {self.rms_pos_tls:.5f}, Kabsch {self.rms_pos_kabsch:.5f}  "
            f"(TLS/Kabsch {self.rms_pos_tls / self.rms_pos_kabsch:.3f})",
            # Counts, not a percentage: 1 unconverged scan in 20,000 would round to 100.00%.
            f"  iterations                mean {self.mean_iterations:.2f}, max {self.max_iterations}; "
            f"converged {self.runs - self.at_limit - self.failed} of {runs.replace('run', 'scan')}, "
            f"{self.at_limit} at the iteration limit, {self.failed} failed",
            f"  time                      simulate {self.t_simulate * 1e3:.0f} ms, TLS solve {self.t_solve * 1e3:.0f} ms "
            f"({self.runs / self.t_solve:,.0f} poses/s), Kabsch {self.t_kabsch * 1e3:.0f} ms",
        ]
        return "\n".join(lines)


def _position_errors(rot_hat: NDArray, t_hat: NDArray, rot: NDArray, t: NDArray) -> NDArray:
    p_hat = -np.einsum("kji,kj->ki", rot_hat, t_hat)
    p = -np.einsum("kji,kj->ki", rot, t)
    return p_hat - p


def monte_carlo(scenario: Any = "S1", runs: int = 10_000, seed: int = 0, n_points: int | None = None,
                scans: Scans | None = None) -> MonteCarlo:
    """Simulates ``runs`` scans, solves them in one batch and compares with the CRLB and Kabsch."""
    t0 = time.perf_counter()
    s = scans if scans is not None else simulate_scans(runs, n_points, scenario=scenario, seed=seed)
    t1 = time.perf_counter()
    est: PoseEstimateBatch = s.estimate()
    t2 = time.perf_counter()
    rk, tk, sk = absolute_orientation_batch(s.b, s.r, offsets=s.offsets)
    t3 = time.perf_counter()
    ok = est.ok & (sk == 0)
    err = pose_error(est.rotation[ok], est.translation[ok], s.rotation[ok], s.translation[ok])
    err_k = pose_error(rk[ok], tk[ok], s.rotation[ok], s.translation[ok])
    p_crlb = s.crlb()[ok]
    eps = nees(err, est.covariance[ok])
    eps_c = nees(err, p_crlb)
    m = int(ok.sum())
    band = tuple(v / (6 * m) for v in chi2_band(6 * m))
    if s.offsets is None:
        n = np.full(len(s), s.b.shape[1])
    else:
        n = np.diff(s.offsets)
    dof = 3 * n[ok] - 6
    cb = chi2_band(float(dof.sum()))
    sig = np.sqrt(np.diagonal(est.covariance[ok], axis1=-2, axis2=-1))
    pos = _position_errors(est.rotation[ok], est.translation[ok], s.rotation[ok], s.translation[ok])
    pos_k = _position_errors(rk[ok], tk[ok], s.rotation[ok], s.translation[ok])
    rms = lambda x: float(np.sqrt(np.mean(np.sum(x * x, axis=-1))))  # noqa: E731
    name = scenario if isinstance(scenario, str) else s.scenario.get("name", "custom")
    return MonteCarlo(
        scenario=str(name),
        runs=len(s),
        points=float(np.mean(n)),
        anees=float(eps.mean() / 6),
        anees_crlb=float(eps_c.mean() / 6),
        anees_band=(float(band[0]), float(band[1])),
        chi2_ratio=float(est.chi2[ok].sum() / dof.sum()),
        chi2_band=(cb[0] / dof.sum(), cb[1] / dof.sum()),
        rms_rot_tls=rms(err[:, :3]),
        rms_rot_kabsch=rms(err_k[:, :3]),
        rms_pos_tls=rms(pos),
        rms_pos_kabsch=rms(pos_k),
        mean_iterations=float(est.iterations[est.ok].mean()) if est.ok.any() else float("nan"),
        max_iterations=int(est.iterations.max()),
        converged=float(est.converged.mean()),
        at_limit=int((est.status == 1).sum()),
        failed=int((est.status >= 2).sum()),
        coverage_3sigma=float(np.mean(np.abs(err) <= 3 * sig)),
        t_simulate=t1 - t0,
        t_solve=t2 - t1,
        t_kabsch=t3 - t2,
        errors=err,
        sigmas=sig,
    )
