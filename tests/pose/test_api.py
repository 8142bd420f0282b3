"""The public API: layouts, result types, conversions, scenarios, progress, strictness."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import maleki_rs
from maleki_rs.exceptions import ConvergenceError
from maleki_rs.pose import (
    SCENARIOS,
    PoseEstimate,
    PoseEstimateBatch,
    absolute_orientation_batch,
    crlb,
    estimate_pose,
    estimate_pose_batch,
    matrix_from_quaternion,
    nees,
    pose_error,
    position_covariance,
    quaternion_from_matrix,
    reference_frame_covariance,
    reference_frame_errors,
    rotation_vector,
    simulate_scans,
)

from ._helpers import expm_so3, noisy_scan, random_rotation, skew


def test_import_does_not_pull_optional_dependencies():
    code = ("import sys, maleki_rs.pose as p; p.simulate_scans(2, seed=0).estimate(); "
            "print('scipy' in sys.modules, 'matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


def test_available_and_public_names():
    assert "pose" in maleki_rs.AVAILABLE
    for name in ("estimate_pose", "estimate_pose_batch", "absolute_orientation", "absolute_orientation_batch",
                 "crlb", "pose_error", "nees", "simulate_scans"):
        assert callable(getattr(maleki_rs.pose, name))


@pytest.fixture(scope="module")
def est():
    s = simulate_scans(1, scenario="S1", seed=11)
    return estimate_pose(s.b[0], s.r[0], s.cov[0]), s


class TestPoseEstimate:
    def test_fields(self, est):
        e, s = est
        assert isinstance(e, PoseEstimate)
        assert e.rotation.shape == (3, 3) and e.quaternion.shape == (4,) and e.covariance.shape == (6, 6)
        assert e.dof == 54 and e.chi2 == pytest.approx(2 * e.cost) and e.status == 0 and e.converged
        np.testing.assert_allclose(e.position, -e.rotation.T @ e.translation, atol=1e-14)
        np.testing.assert_allclose(e.covariance, e.covariance.T, atol=0)
        assert np.all(np.linalg.eigvalsh(e.covariance) > 0)
        with pytest.raises(ValueError):
            e.rotation[0, 0] = 1.0  # read-only
        with pytest.raises(AttributeError):
            e.cost = 0.0  # frozen
        assert "PoseEstimate(" in repr(e)

    def test_quaternion_matches_scipy(self, est):
        spatial = pytest.importorskip("scipy.spatial.transform")
        e, _ = est
        np.testing.assert_allclose(spatial.Rotation.from_quat(e.quaternion).as_matrix(), e.rotation, atol=1e-14)
        np.testing.assert_allclose(e.as_rotation().as_matrix(), e.rotation, atol=1e-14)
        assert e.quaternion[3] >= 0

    def test_as_matrix(self, est):
        e, s = est
        m = e.as_matrix()
        hom = np.c_[s.r[0], np.ones(20)] @ m.T
        np.testing.assert_allclose(hom[:, :3], s.r[0] @ e.rotation.T + e.translation, atol=1e-12)
        np.testing.assert_array_equal(m[3], [0, 0, 0, 1])

    def test_position_covariance_is_the_linearised_map(self, est):
        e, _ = est
        # p(x̃) = −(exp([θ×]) A)ᵀ (t + δt); its Jacobian J by central differences.
        def pos(x):
            return -(expm_so3(x[:3]) @ e.rotation).T @ (e.translation + x[3:])
        jac = np.column_stack([(pos(d) - pos(-d)) / 2e-6 for d in np.eye(6) * 1e-6])
        np.testing.assert_allclose(e.position_covariance(), jac @ e.covariance @ jac.T, rtol=1e-6)
        np.testing.assert_allclose(position_covariance(e.rotation, e.translation, e.covariance),
                                   e.position_covariance(), rtol=1e-14)


def test_conversion_helpers():
    rng = np.random.default_rng(1)
    rots = np.stack([random_rotation(rng) for _ in range(50)] + [np.diag([1.0, -1, -1]), np.eye(3)])
    q = quaternion_from_matrix(rots)
    assert np.all(q[:, 3] >= 0)
    np.testing.assert_allclose(matrix_from_quaternion(q), rots, atol=1e-14)
    th = rotation_vector(rots)
    for k in range(len(rots)):
        np.testing.assert_allclose(expm_so3(th[k]), rots[k], atol=1e-13)
    spatial = pytest.importorskip("scipy.spatial.transform")
    np.testing.assert_allclose(spatial.Rotation.from_matrix(rots[:50]).as_rotvec(), th[:50], atol=1e-12)
    # Reference-frame errors: φ = Aᵀθ, δp = −Aᵀ([t×]θ + δt).
    a, t = rots[0], rng.standard_normal(3)
    x = rng.standard_normal(6)
    ref = reference_frame_errors(a, t, x)
    np.testing.assert_allclose(ref[:3], a.T @ x[:3], atol=1e-14)
    np.testing.assert_allclose(ref[3:], -a.T @ (skew(t) @ x[:3] + x[3:]), atol=1e-14)
    p = np.cov(rng.standard_normal((6, 20)))
    c = reference_frame_covariance(a, t, p)
    np.testing.assert_allclose(c[3:, 3:], position_covariance(a, t, p), atol=1e-14)


def test_pose_error_and_nees():
    rng = np.random.default_rng(2)
    a = random_rotation(rng)
    theta = np.array([1e-3, -2e-3, 5e-4])
    ah = expm_so3(theta) @ a
    x = pose_error(ah, np.array([1.0, 2.0, 3.0]), a, np.array([0.5, 2.0, 2.0]))
    np.testing.assert_allclose(x, np.r_[theta, 0.5, 0.0, 1.0], atol=1e-15)
    # Broadcasting over leading axes.
    xs = pose_error(np.stack([ah, a]), np.zeros((2, 3)), a, np.zeros(3))
    np.testing.assert_allclose(xs[1], 0, atol=1e-15)
    p = np.diag([1.0, 2, 3, 4, 5, 6])
    assert nees(np.ones(6), p) == pytest.approx(sum(1 / np.arange(1, 7)))
    assert nees(np.ones((4, 6)), np.broadcast_to(p, (4, 6, 6))).shape == (4,)
    with pytest.raises(ValueError, match="covariances"):
        nees(np.ones(6), np.eye(5))


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    nb, n = 6, 9
    r_map = rng.uniform(-10, 10, size=(n, 3))
    cov_map = np.stack([np.diag(rng.uniform(0.001, 0.01, 6)) for _ in range(n)])
    rots = np.stack([random_rotation(rng) for _ in range(nb)])
    ts = rng.standard_normal((nb, 3))
    b = np.einsum("kij,nj->kni", rots, r_map) + ts[:, None] + rng.standard_normal((nb, n, 3)) * 0.05
    return b, r_map, cov_map


class TestBatchLayouts:
    """Every accepted layout gives, scan by scan, exactly the single-scan solve."""

    def check(self, batch, singles):
        assert isinstance(batch, PoseEstimateBatch) and len(batch) == len(singles)
        for k, e in enumerate(singles):
            np.testing.assert_array_equal(batch.rotation[k], e.rotation)
            np.testing.assert_array_equal(batch.covariance[k], e.covariance)

    def test_fixed_map(self, data):
        b, r_map, cov_map = data
        singles = [estimate_pose(bk, r_map, cov_map) for bk in b]
        self.check(estimate_pose_batch(b, r_map, cov_map), singles)
        self.check(estimate_pose_batch(b, np.broadcast_to(r_map, b.shape), np.broadcast_to(cov_map, b.shape[:2] + (6, 6))),
                   singles)
        # Ragged form of the same data.
        offs = np.arange(len(b) + 1) * b.shape[1]
        self.check(estimate_pose_batch(b.reshape(-1, 3), np.tile(r_map, (len(b), 1)), np.tile(cov_map, (len(b), 1, 1)),
                                       offsets=offs), singles)

    def test_blocks_sigmas_weights(self, data):
        b, r_map, cov_map = data
        cb, cr = cov_map[:, :3, :3], cov_map[:, 3:, 3:]
        singles = [estimate_pose(bk, r_map, cov_b=cb, cov_r=cr) for bk in b]
        self.check(estimate_pose_batch(b, r_map, cov_b=cb, cov_r=cr), singles)
        w = np.linspace(0.5, 2.0, b.shape[1])
        singles = [estimate_pose(bk, r_map, sigma_b=0.02, cov_r=cr, weights=w) for bk in b]
        self.check(estimate_pose_batch(b, r_map, sigma_b=0.02, cov_r=cr, weights=w), singles)
        self.check(estimate_pose_batch(b, r_map, sigma_b=0.02, cov_r=cr, weights=np.tile(w, (len(b), 1))), singles)
        # Blocks equal the full matrix they make up.
        full = estimate_pose(b[0], r_map, cov_map)
        blocks = estimate_pose(b[0], r_map, cov_b=cb, cov_r=cr, cov_br=np.zeros((3, 3)))
        np.testing.assert_allclose(blocks.rotation, full.rotation, atol=1e-14)

    def test_views_fortran_order_and_float32(self, data):
        b, r_map, cov_map = data
        ref = estimate_pose(b[0], r_map, cov_map)
        wide = np.zeros((b.shape[1], 6))
        wide[:, ::2] = b[0]
        for bb in (np.asfortranarray(b[0]), wide[:, ::2], b[0].tolist()):
            e = estimate_pose(bb, np.asfortranarray(r_map), np.asfortranarray(cov_map))
            np.testing.assert_array_equal(e.rotation, ref.rotation)
        e32 = estimate_pose(b[0].astype(np.float32), r_map.astype(np.float32), cov_map)
        np.testing.assert_allclose(e32.rotation, ref.rotation, atol=1e-5)
        fb = estimate_pose_batch(np.asfortranarray(b), r_map[::-1][::-1], cov_map)
        np.testing.assert_array_equal(fb.rotation[0], ref.rotation)

    def test_given_start(self, data):
        b, r_map, cov_map = data
        ref = estimate_pose(b[0], r_map, cov_map)
        e = estimate_pose(b[0], r_map, cov_map, init=(expm_so3([0.2, 0.1, -0.3]) @ ref.rotation, ref.translation))
        np.testing.assert_allclose(e.rotation, ref.rotation, atol=1e-10)
        e = estimate_pose(b[0], r_map, cov_map, rotation0=ref.rotation)
        np.testing.assert_allclose(e.rotation, ref.rotation, atol=1e-10)
        e = estimate_pose(b[0], r_map, cov_map, variable_projection=True)
        np.testing.assert_allclose(e.rotation, ref.rotation, atol=1e-10)
        e = estimate_pose(b[0], r_map, cov_map, compute_covariance=False)
        assert np.all(np.isnan(e.covariance)) and np.array_equal(e.rotation, ref.rotation)


def test_far_starts_reach_the_same_optimum():
    """Starts 1 rad away (large noise, S5): Gauss-Newton with its step-halving / LM safeguards
    converges to the optimum found from the Horn start, with the cost never increasing."""
    s = simulate_scans(20, scenario="S5", seed=3)
    rng = np.random.default_rng(0)
    for k in range(20):
        ref = estimate_pose(s.b[k], s.r[k], s.cov[k])
        axis = rng.standard_normal(3)
        axis /= np.linalg.norm(axis)
        a0 = expm_so3(axis * 1.0) @ s.rotation[k]
        e = estimate_pose(s.b[k], s.r[k], s.cov[k], rotation0=a0)
        assert e.converged
        np.testing.assert_allclose(e.rotation, ref.rotation, atol=1e-9)
        costs = [estimate_pose(s.b[k], s.r[k], s.cov[k], rotation0=a0, max_iter=m).cost for m in (1, 2, 3, 4)]
        assert all(b <= a * (1 + 1e-12) for a, b in zip(costs, costs[1:]))


def test_default_noise_model_is_unit_isotropic():
    rng = np.random.default_rng(4)
    _, _, _, b, r, _ = noisy_scan(rng, 10)
    a = estimate_pose(b, r)
    c = estimate_pose(b, r, sigma_b=1.0, sigma_r=1.0)
    np.testing.assert_array_equal(a.covariance, c.covariance)


def test_failed_scans_get_a_status_and_the_rest_is_unaffected():
    s = simulate_scans(8, 10, scenario="S1", seed=5)
    b, r, cov = s.b.copy(), s.r.copy(), s.cov.copy()
    b[1, 3, 0] = np.nan  # bad input
    cov[2, 4] = -np.eye(6)  # not PSD
    b[3] = np.outer(np.arange(10.0), [1, 1, 0])  # collinear
    r[3] = b[3] + 1
    res = estimate_pose_batch(b, r, cov)
    assert res.status.tolist() == [0, 3, 3, 2, 0, 0, 0, 0]
    assert "not finite" in res.messages[1] and "cov[4]" in res.messages[2] and "collinear" in res.messages[3]
    assert np.all(np.isnan(res.rotation[1:4]))
    good = estimate_pose(s.b[0], s.r[0], s.cov[0])
    np.testing.assert_array_equal(res.rotation[0], good.rotation)
    with pytest.raises(ValueError, match="scan 1"):
        res[1]
    with pytest.raises(ValueError, match="scan 1: b"):
        estimate_pose_batch(b, r, cov, strict=True)
    rk, tk, st = absolute_orientation_batch(b, r)
    assert st.tolist() == [0, 3, 0, 2, 0, 0, 0, 0]
    assert "PoseEstimateBatch(8 scans" in repr(res)


def test_ragged_too_short_scan_is_bad_input():
    s = simulate_scans(3, 6, scenario="S2", seed=6)
    # Scan 0 keeps only 2 of its points; scans 1 and 2 are whole.
    b, r, cov = (np.concatenate([x[0, :2], x[1], x[2]]) for x in (s.b, s.r, s.cov))
    res = estimate_pose_batch(b, r, cov, offsets=[0, 2, 8, 14])
    assert res.status.tolist() == [3, 0, 0]
    np.testing.assert_array_equal(res.rotation[2], estimate_pose(s.b[2], s.r[2], s.cov[2]).rotation)
    assert "at least 3" in res.messages[0]


def test_not_converged_and_strict():
    s = simulate_scans(3, scenario="S5", seed=7)
    e = estimate_pose(s.b[0], s.r[0], s.cov[0], max_iter=1)
    assert not e.converged and e.status == 1 and e.iterations == 1
    with pytest.raises(ConvergenceError, match="1 iterations"):
        estimate_pose(s.b[0], s.r[0], s.cov[0], max_iter=1, strict=True)
    res = estimate_pose_batch(s.b, s.r, s.cov, max_iter=1)
    assert res.status.tolist() == [1, 1, 1] and "did not converge" in res.messages[0]
    assert res[0].status == 1
    with pytest.raises(ConvergenceError, match="scan 0"):
        estimate_pose_batch(s.b, s.r, s.cov, max_iter=1, strict=True)


def test_progress_callback_and_cancellation():
    s = simulate_scans(3000, 20, scenario="S1", seed=8)
    seen = []
    res = estimate_pose_batch(s.b, s.r, s.cov, progress=lambda d, t: seen.append((d, t)))
    assert np.all(res.ok) and seen and seen[-1] == (3000, 3000)

    class Stop(Exception):
        pass

    def stop(done, total):
        raise Stop

    big = simulate_scans(20_000, 20, scenario="S1", seed=9)
    with pytest.raises(Stop):
        estimate_pose_batch(big.b, big.r, big.cov, progress=stop)


def test_crlb_layouts():
    s = simulate_scans(4, 8, scenario="S1", seed=10)
    p = crlb(s.rotation, s.translation, s.r_true, s.cov)
    assert p.shape == (4, 6, 6)
    p0 = crlb(s.rotation[0], s.translation[0], s.r_true[0], s.cov[0])
    np.testing.assert_array_equal(p[0], p0)
    # One map, many attitudes.
    pm = crlb(s.rotation, s.translation, s.r_true[0], s.cov[0])
    np.testing.assert_array_equal(pm[0], p0)


def test_simulate_scans_is_deterministic_and_correct():
    a = simulate_scans(50, scenario="S1", seed=123)
    b = simulate_scans(50, scenario="S1", seed=123)
    c = simulate_scans(50, scenario="S1", seed=124)
    np.testing.assert_array_equal(a.b, b.b)
    np.testing.assert_array_equal(a.cov, b.cov)
    assert not np.array_equal(a.b, c.b)
    assert a.seed == 123 and simulate_scans(2).seed >= 0
    for name in SCENARIOS:
        s = simulate_scans(20, scenario=name, seed=1)
        if s.offsets is None:
            pred = np.einsum("kij,knj->kni", s.rotation, s.r_true) + s.translation[:, None]
        else:
            k = np.repeat(np.arange(len(s)), np.diff(s.offsets))
            pred = np.einsum("kij,kj->ki", s.rotation[k], s.r_true) + s.translation[k]
        np.testing.assert_allclose(pred, s.b_true, atol=1e-12)
        assert np.all(np.linalg.eigvalsh(s.cov) > 0)
    custom = simulate_scans(5, scenario={"base": "S1", "rho": 0.0, "anisotropy": 1.0}, seed=1)
    assert np.abs(custom.cov[..., :3, 3:]).max() == 0
    with pytest.raises(ValueError, match="unknown keys"):
        simulate_scans(5, scenario={"rhoo": 0.1})
    with pytest.raises(ValueError, match="scenario"):
        simulate_scans(5, scenario="S9")


@pytest.mark.parametrize("name", ["S1", "S4", "S6"])
def test_simulated_noise_has_the_stated_covariance(name):
    """Whitened draws L⁻¹z (R = L Lᵀ per point) have identity sample covariance."""
    s = simulate_scans(3000, scenario=name, seed=77)
    z = np.concatenate([s.b - s.b_true, s.r - s.r_true], -1).reshape(-1, 6)
    chol = np.linalg.cholesky(s.cov.reshape(-1, 6, 6))
    y = np.linalg.solve(chol, z[..., None])[..., 0]
    m = len(y)
    assert np.abs(y.T @ y / m - np.eye(6)).max() < 5 / np.sqrt(m)
    assert np.abs(y.mean(0)).max() < 5 / np.sqrt(m)
