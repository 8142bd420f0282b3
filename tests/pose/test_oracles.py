"""Deterministic oracles of the TLS pose estimator (pose.md §7, items 1-8)."""

from __future__ import annotations

import numpy as np
import pytest

import maleki_rs
from maleki_rs import _core
from maleki_rs.exceptions import DegenerateGeometryError
from maleki_rs.pose import (
    absolute_orientation,
    crlb,
    estimate_pose,
    estimate_pose_batch,
    simulate_scans,
)

from ._helpers import expm_so3, kabsch_svd, noisy_scan, random_cov6, random_rotation, skew


# 1. Noise-free data ------------------------------------------------------------------------

@pytest.mark.parametrize("n", [3, 4, 20, 10_000])
def test_noise_free_data_recovered_exactly(n):
    rng = np.random.default_rng(100 + n)
    for rep in range(3 if n < 10_000 else 1):
        a, t, r_true, b, r, cov = noisy_scan(rng, n, noise=0.0, rho=0.8)
        est = estimate_pose(b, r, cov)
        assert est.converged and est.status == 0
        np.testing.assert_allclose(est.rotation, a, rtol=0, atol=1e-12)
        np.testing.assert_allclose(est.translation, t, rtol=0, atol=1e-11)
        assert est.chi2 < 1e-15


@pytest.mark.parametrize("n", [3, 20])
def test_noise_free_rotations_near_half_turn(n):
    rng = np.random.default_rng(7)
    for eps in (0.0, 1e-9, 1e-5, 1e-2):
        axis = rng.standard_normal(3)
        axis /= np.linalg.norm(axis)
        a = expm_so3(axis * (np.pi - eps))
        t = rng.standard_normal(3)
        r = rng.uniform(-10, 10, size=(n, 3))
        b = r @ a.T + t
        est = estimate_pose(b, r, random_cov6(rng, n))
        np.testing.assert_allclose(est.rotation, a, rtol=0, atol=1e-12)
        np.testing.assert_allclose(est.translation, t, rtol=0, atol=1e-11)
        assert est.quaternion[3] >= 0


# 2. Kabsch equivalence -----------------------------------------------------------------------

def test_isotropic_identical_covariances_equal_kabsch():
    rng = np.random.default_rng(1)
    _, _, _, b, r, _ = noisy_scan(rng, 30)
    est = estimate_pose(b, r, sigma_b=0.05, sigma_r=0.03)
    a_ours, t_ours = absolute_orientation(b, r)
    a_ref, t_ref = kabsch_svd(b, r)
    for a, t in ((a_ours, t_ours), (a_ref, t_ref)):
        np.testing.assert_allclose(est.rotation, a, rtol=0, atol=1e-12)
        np.testing.assert_allclose(est.translation, t, rtol=0, atol=1e-12)
    # The same with the full-matrix input of that isotropic model.
    cov = np.diag([0.05**2] * 3 + [0.03**2] * 3)
    est2 = estimate_pose(b, r, cov)
    np.testing.assert_allclose(est2.rotation, a_ref, rtol=0, atol=1e-12)


def test_per_point_scalar_covariances_equal_weighted_kabsch():
    rng = np.random.default_rng(2)
    _, _, _, b, r, _ = noisy_scan(rng, 25)
    s = rng.uniform(0.2, 5.0, size=25)
    cov = s[:, None, None] * np.diag([0.04**2] * 3 + [0.02**2] * 3)
    est = estimate_pose(b, r, cov)
    a_ref, t_ref = kabsch_svd(b, r, 1 / s)
    np.testing.assert_allclose(est.rotation, a_ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(est.translation, t_ref, rtol=0, atol=1e-12)
    # `weights` divide the covariance: the same problem.
    est_w = estimate_pose(b, r, np.diag([0.04**2] * 3 + [0.02**2] * 3), weights=1 / s)
    np.testing.assert_allclose(est_w.rotation, a_ref, rtol=0, atol=1e-12)
    a_w, t_w = absolute_orientation(b, r, weights=1 / s)
    np.testing.assert_allclose(a_w, a_ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(t_w, t_ref, rtol=0, atol=1e-12)


def test_kabsch_matches_scipy_align_vectors():
    spatial = pytest.importorskip("scipy.spatial.transform")
    rng = np.random.default_rng(3)
    for _ in range(5):
        _, _, _, b, r, _ = noisy_scan(rng, 15)
        w = rng.uniform(0.5, 2.0, size=15)
        a, t = absolute_orientation(b, r, weights=w)
        bc = (w[:, None] * b).sum(0) / w.sum()
        rc = (w[:, None] * r).sum(0) / w.sum()
        # align_vectors(a, b) fits a ≈ C b: a = b̃ − b̄, b = r̃ − r̄.
        rot, _ = spatial.Rotation.align_vectors(b - bc, r - rc, weights=w)
        np.testing.assert_allclose(a, rot.as_matrix(), rtol=0, atol=1e-12)
        est = estimate_pose(b, r, sigma_b=0.1, sigma_r=0.1, weights=w)
        np.testing.assert_allclose(est.rotation, rot.as_matrix(), rtol=0, atol=1e-12)


# 3. Role swap --------------------------------------------------------------------------------

def test_role_swap_gives_inverse_pose():
    rng = np.random.default_rng(4)
    _, _, _, b, r, cov = noisy_scan(rng, 12, rho=0.8)
    est = estimate_pose(b, r, cov)
    perm = np.r_[3:6, 0:3]
    swapped = cov[:, perm][:, :, perm]  # [[R_rr, R_brᵀ], [R_br, R_bb]]
    inv = estimate_pose(r, b, swapped)
    np.testing.assert_allclose(inv.rotation, est.rotation.T, rtol=0, atol=1e-10)
    np.testing.assert_allclose(inv.translation, -est.rotation.T @ est.translation, rtol=0, atol=1e-9)
    np.testing.assert_allclose(inv.position, est.translation, rtol=0, atol=1e-9)


# 4. Equivariance -----------------------------------------------------------------------------

def test_body_frame_change():
    rng = np.random.default_rng(5)
    _, _, _, b, r, cov = noisy_scan(rng, 10, rho=0.8)
    est = estimate_pose(b, r, cov)
    c, d = random_rotation(rng), rng.standard_normal(3) * 3
    tb = np.eye(6)
    tb[:3, :3] = c  # R_bb → C R_bb Cᵀ, R_br → C R_br
    est2 = estimate_pose(b @ c.T + d, r, tb @ cov @ tb.T)
    np.testing.assert_allclose(est2.rotation, c @ est.rotation, rtol=0, atol=1e-10)
    np.testing.assert_allclose(est2.translation, c @ est.translation + d, rtol=0, atol=1e-9)
    cc = np.kron(np.eye(2), c)
    np.testing.assert_allclose(est2.covariance, cc @ est.covariance @ cc.T, rtol=1e-7, atol=1e-14)


def test_reference_frame_change():
    rng = np.random.default_rng(6)
    _, _, _, b, r, cov = noisy_scan(rng, 10, rho=0.8)
    est = estimate_pose(b, r, cov)
    c, d = random_rotation(rng), rng.standard_normal(3) * 3
    tr = np.eye(6)
    tr[3:, 3:] = c  # R_rr → C R_rr Cᵀ, R_br → R_br Cᵀ
    est2 = estimate_pose(b, r @ c.T + d, tr @ cov @ tr.T)
    a2 = est.rotation @ c.T
    np.testing.assert_allclose(est2.rotation, a2, rtol=0, atol=1e-10)
    np.testing.assert_allclose(est2.translation, est.translation - a2 @ d, rtol=0, atol=1e-9)
    # θ is a body-frame angle (unchanged); δt' = δt + [w×]θ with w = A Cᵀ d.
    tm = np.eye(6)
    tm[3:, :3] = skew(a2 @ d)
    np.testing.assert_allclose(est2.covariance, tm @ est.covariance @ tm.T, rtol=1e-7, atol=1e-14)


# 5. Gradient ---------------------------------------------------------------------------------

def _cost(b, r, cov, a, t):
    return _core.pose.evaluate(b, r, a, t, cov=(cov, "concat"))


def test_gradient_matches_central_differences_and_vanishes_at_optimum():
    rng = np.random.default_rng(8)
    a_true, t_true, _, b, r, cov = noisy_scan(rng, 10, sigma=0.3, rho=0.8)
    a = expm_so3(rng.standard_normal(3) * 0.05) @ a_true
    t = t_true + rng.standard_normal(3) * 0.1
    _, g, _ = _cost(b, r, cov, a, t)
    h = 1e-6
    for k in range(6):
        d = np.zeros(6)
        d[k] = h
        jp = _cost(b, r, cov, expm_so3(d[:3]) @ a, t + d[3:])[0]
        jm = _cost(b, r, cov, expm_so3(-d[:3]) @ a, t - d[3:])[0]
        assert abs((jp - jm) / (2 * h) - g[k]) <= 1e-6 * np.linalg.norm(g)
    est = estimate_pose(b, r, cov)
    _, g0, _ = _cost(b, r, cov, est.rotation, est.translation)
    assert np.linalg.norm(g0) < 1e-8 * np.linalg.norm(g)


def test_cost_is_the_profile_likelihood():
    """J(A, t) equals ½ Σ min_z zᵀR⁻¹z subject to G z = e, solved here by a dense KKT system."""
    rng = np.random.default_rng(9)
    a, t, _, b, r, cov = noisy_scan(rng, 6, sigma=0.2, rho=0.7)
    j = _cost(b, r, cov, a, t)[0]
    g = np.hstack([np.eye(3), -a])
    ref = 0.0
    for i in range(6):
        e = b[i] - a @ r[i] - t
        kkt = np.block([[np.linalg.inv(cov[i]), g.T], [g, np.zeros((3, 3))]])
        z = np.linalg.solve(kkt, np.r_[np.zeros(6), e])[:6]
        ref += 0.5 * z @ np.linalg.solve(cov[i], z)
    assert j == pytest.approx(ref, rel=1e-10)


# 6. CRLB -------------------------------------------------------------------------------------

def _brute_force_crlb(a, r_true, cov, h=1e-6):
    """Schur complement on (θ, t) of the Fisher matrix of all unknowns (θ, t, r_1..r_N) of
    z = [b̃_1; r̃_1; ...], built from a central finite-difference Jacobian of the mean."""
    n = len(r_true)
    x0 = np.r_[np.zeros(6), r_true.ravel()]

    def mean(x):
        rot = expm_so3(x[:3]) @ a
        rr = x[6:].reshape(n, 3)
        bb = rr @ rot.T + x[3:6]
        return np.hstack([bb, rr]).ravel()

    jac = np.empty((6 * n, len(x0)))
    for k in range(len(x0)):
        d = np.zeros(len(x0))
        d[k] = h
        jac[:, k] = (mean(x0 + d) - mean(x0 - d)) / (2 * h)
    sinv = np.zeros((6 * n, 6 * n))
    for i in range(n):
        sinv[6 * i:6 * i + 6, 6 * i:6 * i + 6] = np.linalg.inv(cov[i])
    fisher = jac.T @ sinv @ jac
    fpp, fpr, frr = fisher[:6, :6], fisher[:6, 6:], fisher[6:, 6:]
    return np.linalg.inv(fpp - fpr @ np.linalg.solve(frr, fpr.T))


def test_crlb_equals_brute_force_fisher():
    rng = np.random.default_rng(10)
    for n in (3, 8):
        a, t, r_true, _, _, cov = noisy_scan(rng, n, rho=0.8)
        ours = crlb(a, t, r_true, cov)
        ref = _brute_force_crlb(a, r_true, cov)
        np.testing.assert_allclose(ours, ref, rtol=1e-7, atol=1e-7 * np.abs(ref).max())


def test_crlb_rotation_only_is_the_wahba_quest_bound():
    rng = np.random.default_rng(11)
    a = random_rotation(rng)
    r = rng.standard_normal((8, 3)) * 4
    sig = rng.uniform(0.01, 0.1, size=8)
    cov_b = sig[:, None, None] ** 2 * np.eye(3)
    p = crlb(a, np.zeros(3), r, cov_b=cov_b)  # R_rr = 0, R_br = 0
    # t known: the rotation bound is the inverse of the θθ block of the Fisher matrix.
    info = np.linalg.inv(p)[:3, :3]
    wahba = np.linalg.inv(-sum(skew(a @ ri) @ skew(a @ ri) / s**2 for ri, s in zip(r, sig)))
    np.testing.assert_allclose(np.linalg.inv(info), wahba, rtol=1e-10)


def test_crlb_batch_and_scans_helper():
    s = simulate_scans(5, 6, scenario="S1", seed=3)
    p = s.crlb()
    assert p.shape == (5, 6, 6)
    for k in range(5):
        np.testing.assert_array_equal(p[k], crlb(s.rotation[k], s.translation[k], s.r_true[k], s.cov[k]))


# 7. Degenerate inputs ------------------------------------------------------------------------

def test_collinear_and_coincident_points_are_degenerate():
    line = np.outer(np.arange(6.0), [1.0, 2.0, -1.0])
    with pytest.raises(DegenerateGeometryError, match="collinear"):
        estimate_pose(line, line + 1, sigma_b=0.1, sigma_r=0.1)
    with pytest.raises(DegenerateGeometryError):
        estimate_pose(np.ones((5, 3)), np.ones((5, 3)), sigma_b=0.1, sigma_r=0.1)
    with pytest.raises(DegenerateGeometryError):
        absolute_orientation(line, line)
    rng = np.random.default_rng(12)
    with pytest.raises(DegenerateGeometryError):
        crlb(random_rotation(rng), np.zeros(3), line, random_cov6(rng, 6))


def test_bad_problems_are_named():
    rng = np.random.default_rng(13)
    _, _, _, b, r, cov = noisy_scan(rng, 5)
    with pytest.raises(ValueError, match="at least 3"):
        estimate_pose(b[:2], r[:2], cov[:2])
    bad = cov.copy()
    bad[3] = -np.eye(6)
    with pytest.raises(ValueError, match=r"cov\[3\].*positive semi-definite"):
        estimate_pose(b, r, bad)
    asym = cov.copy()
    asym[1, 0, 4] += 1.0
    with pytest.raises(ValueError, match=r"cov\[1\].*symmetric"):
        estimate_pose(b, r, asym)
    nan = b.copy()
    nan[2, 1] = np.nan
    with pytest.raises(ValueError, match="b: contains a non-finite value"):
        estimate_pose(nan, r, cov)


# 8. Batch == loop, threads -------------------------------------------------------------------

def _fields(x):
    return [x.rotation, x.quaternion, x.translation, x.position, x.covariance, x.cost, x.iterations]


def test_batch_equals_loop_bitwise():
    s = simulate_scans(50, 12, scenario="S1", seed=4)
    batch = estimate_pose_batch(s.b, s.r, s.cov)
    for k in range(50):
        single = estimate_pose(s.b[k], s.r[k], s.cov[k])
        for x, y in zip(_fields(batch[k]), _fields(single)):
            np.testing.assert_array_equal(x, y)
    rk, tk, _ = maleki_rs.pose.absolute_orientation_batch(s.b, s.r)
    for k in range(50):
        a, t = absolute_orientation(s.b[k], s.r[k])
        np.testing.assert_array_equal(rk[k], a)
        np.testing.assert_array_equal(tk[k], t)


def test_one_and_two_threads_bitwise():
    s = simulate_scans(400, 20, scenario="S5", seed=5)
    old = maleki_rs.get_num_threads()
    try:
        maleki_rs.set_num_threads(1)
        one = estimate_pose_batch(s.b, s.r, s.cov)
        p1 = s.crlb()
        maleki_rs.set_num_threads(2)
        two = estimate_pose_batch(s.b, s.r, s.cov)
        p2 = s.crlb()
    finally:
        maleki_rs.set_num_threads(old)
    for name in ("rotation", "translation", "covariance", "cost", "iterations", "status"):
        np.testing.assert_array_equal(getattr(one, name), getattr(two, name))
    np.testing.assert_array_equal(p1, p2)
