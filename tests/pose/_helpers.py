"""Independent numpy references for the pose tests (no maleki_rs code inside)."""

from __future__ import annotations

import numpy as np


def skew(v):
    v = np.asarray(v, dtype=float)
    return np.array([[0, -v[2], v[1]], [v[2], 0, -v[0]], [-v[1], v[0], 0]])


def expm_so3(theta):
    """exp([θ×]) by Rodrigues, written independently of the package."""
    theta = np.asarray(theta, dtype=float)
    a = np.linalg.norm(theta)
    k = skew(theta)
    if a < 1e-12:
        return np.eye(3) + k + k @ k / 2
    return np.eye(3) + np.sin(a) / a * k + (1 - np.cos(a)) / a**2 * k @ k


def random_rotation(rng):
    q = rng.standard_normal(4)
    q /= np.linalg.norm(q)
    x, y, z, w = q
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])


def random_cov6(rng, n, sigma=0.05, aniso=10.0, rho=0.8):
    """Random SPD 6x6 covariances: anisotropic blocks and cross-correlation ρ."""
    out = np.empty((n, 6, 6))
    std = np.array([1.0, np.sqrt(aniso), aniso])
    std *= sigma / np.sqrt(np.mean(std**2))
    for i in range(n):
        qb, qr, c = random_rotation(rng), random_rotation(rng), random_rotation(rng)
        hb = qb @ np.diag(std) @ qb.T
        hr = qr @ np.diag(std) @ qr.T
        out[i, :3, :3] = hb @ hb
        out[i, 3:, 3:] = hr @ hr
        out[i, :3, 3:] = rho * hb @ c @ hr
        out[i, 3:, :3] = out[i, :3, 3:].T
    return out


def kabsch_svd(b, r, w=None):
    """Weighted Kabsch/Umeyama (no scale) by numpy SVD: minimises Σ w |b − A r − t|²."""
    b = np.asarray(b, float)
    r = np.asarray(r, float)
    w = np.ones(len(b)) if w is None else np.asarray(w, float)
    bc = (w[:, None] * b).sum(0) / w.sum()
    rc = (w[:, None] * r).sum(0) / w.sum()
    m = ((b - bc) * w[:, None]).T @ (r - rc)
    u, _, vt = np.linalg.svd(m)
    d = np.sign(np.linalg.det(u @ vt))
    a = u @ np.diag([1, 1, d]) @ vt
    return a, bc - a @ rc


def noisy_scan(rng, n, sigma=0.05, rho=0.8, noise=1.0, aniso=10.0):
    """Random pose, landmarks in a ±10 cube, per-point covariances; noise scaled by `noise`."""
    a = random_rotation(rng)
    t = rng.standard_normal(3) * 5
    r_true = rng.uniform(-10, 10, size=(n, 3))
    cov = random_cov6(rng, n, sigma, aniso, rho)
    z = np.einsum("nij,nj->ni", np.linalg.cholesky(cov), rng.standard_normal((n, 6))) * noise
    b = r_true @ a.T + t + z[:, :3]
    r = r_true + z[:, 3:]
    return a, t, r_true, b, r, cov
