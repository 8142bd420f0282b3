"""Monte-Carlo statistical tests T1-T8 of pose.md §7 (fixed seeds: deterministic pass/fail).

The full 10,000-run S1 validation runs here, in the default suite: it takes well under a
second of solving. Thresholds come from scipy.stats.chi2 when scipy is installed, otherwise
from the numbers written in the spec.
"""

from __future__ import annotations

import numpy as np
import pytest

from maleki_rs.pose import estimate_pose_batch, nees, pose_error, simulate_scans

M = 10_000


def _chi2_band(dof, level=0.99, fallback=None):
    try:
        from scipy.stats import chi2
    except ImportError:
        return fallback
    a = (1 - level) / 2
    return chi2.ppf(a, dof), chi2.ppf(1 - a, dof)


def _anees_band(m, fallback):
    lo, hi = _chi2_band(6 * m, fallback=(fallback[0] * 6 * m, fallback[1] * 6 * m))
    return lo / (6 * m), hi / (6 * m)


def _position_error(rot_hat, t_hat, rot, t):
    return -np.einsum("kji,kj->ki", rot_hat, t_hat) + np.einsum("kji,kj->ki", rot, t)


def _rms(x):
    return float(np.sqrt(np.mean(np.sum(x * x, axis=-1))))


@pytest.fixture(scope="module")
def s1():
    """The 10,000-run S1 validation: scans, TLS estimates, Kabsch, errors, CRLBs."""
    s = simulate_scans(M, 20, scenario="S1", seed=20260101)
    est = s.estimate()
    rk, tk, sk = s.kabsch()
    assert np.all(est.status == 0) and np.all(sk == 0)
    err = pose_error(est.rotation, est.translation, s.rotation, s.translation)
    return {"scans": s, "est": est, "err": err, "crlb": s.crlb(), "kabsch": (rk, tk)}


def test_t1_anees_against_crlb(s1):
    anees = nees(s1["err"], s1["crlb"]).mean() / 6
    lo, hi = _anees_band(M, (0.9852, 1.0149))
    assert lo <= anees <= hi, anees


def test_t2_anees_against_own_covariance(s1):
    anees = nees(s1["err"], s1["est"].covariance).mean() / 6
    lo, hi = _anees_band(M, (0.9852, 1.0149))
    assert lo <= anees <= hi, anees
    # The estimate's covariance and the CRLB agree closely run by run (first-order equality).
    rel = np.abs(s1["est"].covariance - s1["crlb"]).max(axis=(1, 2)) / np.abs(s1["crlb"]).max(axis=(1, 2))
    assert np.median(rel) < 0.05


def test_t3_per_axis_variance_and_whitened_covariance(s1):
    p = s1["est"].covariance
    x = s1["err"]
    z = x / np.sqrt(np.diagonal(p, axis1=1, axis2=2))
    lo, hi = _chi2_band(M - 1, level=1 - 0.01 / 6, fallback=(0.956 * (M - 1), 1.045 * (M - 1)))
    ratio = z.var(axis=0, ddof=1)
    assert np.all((lo / (M - 1) <= ratio) & (ratio <= hi / (M - 1))), ratio
    # Whitened: y = L⁻¹ x̃ with P = L Lᵀ per run; the sample covariance is I ± 4/√M.
    y = np.linalg.solve(np.linalg.cholesky(p), x[..., None])[..., 0]
    cov = y.T @ y / M
    assert np.abs(cov - np.eye(6)).max() < 4 / np.sqrt(M), cov


def test_t4_no_bias(s1):
    p = s1["est"].covariance
    z = s1["err"] / np.sqrt(np.diagonal(p, axis1=1, axis2=2))
    stat = np.abs(z.mean(axis=0)) * np.sqrt(M)
    assert np.all(stat < 3.15), stat


def test_t5_chi2_fit_statistic(s1):
    dof = 3 * 20 - 6
    est = s1["est"]
    assert np.all(est.dof == dof)
    ratio = est.chi2.mean() / dof
    lo, hi = _chi2_band(M * dof, fallback=(0.9950 * M * dof, 1.0050 * M * dof))
    assert lo / (M * dof) <= ratio <= hi / (M * dof), ratio


def test_t6_tls_beats_kabsch_and_no_cross_weighting_on_s1(s1):
    s, est, err = s1["scans"], s1["est"], s1["err"]
    rk, tk = s1["kabsch"]
    err_k = pose_error(rk, tk, s.rotation, s.translation)
    pos = _position_error(est.rotation, est.translation, s.rotation, s.translation)
    pos_k = _position_error(rk, tk, s.rotation, s.translation)
    assert _rms(err[:, :3]) <= 0.60 * _rms(err_k[:, :3])
    assert _rms(pos) <= 0.60 * _rms(pos_k)
    # GICP-style weighting: the same covariances with the cross blocks dropped.
    cov = s.cov.copy()
    cov[..., :3, 3:] = 0
    cov[..., 3:, :3] = 0
    g = estimate_pose_batch(s.b, s.r, cov)
    err_g = pose_error(g.rotation, g.translation, s.rotation, s.translation)
    pos_g = _position_error(g.rotation, g.translation, s.rotation, s.translation)
    assert _rms(err[:, :3]) <= 0.90 * _rms(err_g[:, :3])
    assert _rms(pos) <= 0.90 * _rms(pos_g)


def test_t6_lidar_s4_position_beats_kabsch():
    s = simulate_scans(M, scenario="S4", seed=404)
    est = s.estimate()
    rk, tk, _ = s.kabsch()
    pos = _position_error(est.rotation, est.translation, s.rotation, s.translation)
    pos_k = _position_error(rk, tk, s.rotation, s.translation)
    assert _rms(pos) <= 0.90 * _rms(pos_k)
    err = pose_error(est.rotation, est.translation, s.rotation, s.translation)
    anees = nees(err, est.covariance).mean() / 6
    lo, hi = _anees_band(M, (0.9852, 1.0149))
    assert lo <= anees <= hi, anees


def test_t6_isotropic_s3_equals_kabsch_per_run():
    s = simulate_scans(2_000, scenario="S3", seed=303)
    est = s.estimate()
    rk, tk, _ = s.kabsch()
    assert np.abs(est.rotation - rk).max() < 1e-12
    assert np.abs(est.translation - tk).max() < 1e-12


def test_t7_large_noise_s5():
    m = 2_000
    s = simulate_scans(m, scenario="S5", seed=505)
    est = s.estimate()
    assert np.all(est.converged)
    err = pose_error(est.rotation, est.translation, s.rotation, s.translation)
    anees = nees(err, est.covariance).mean() / 6
    lo, hi = _anees_band(m, (0.9667, 1.0333))
    assert lo <= anees <= hi, anees


def test_t8_convergence_on_s1(s1):
    est = s1["est"]
    assert np.all(est.converged)
    assert est.iterations.mean() <= 8, est.iterations.mean()


def test_s6_trajectory_three_sigma_coverage():
    """S6: per-scan errors against ±3√P̂_kk along a trajectory; coverage 99.73% within the
    binomial 99% tolerance."""
    s = simulate_scans(2_000, scenario="S6", seed=606)
    counts = np.diff(s.offsets)
    assert counts.min() >= 10 and counts.max() <= 30
    est = s.estimate()
    assert np.all(est.status == 0)
    err = pose_error(est.rotation, est.translation, s.rotation, s.translation)
    sig = np.sqrt(np.diagonal(est.covariance, axis1=1, axis2=2))
    inside = np.abs(err) <= 3 * sig
    n = inside.size
    p = 0.9973
    tol = 2.5758 * np.sqrt(p * (1 - p) / n)
    assert abs(inside.mean() - p) <= tol, inside.mean()
