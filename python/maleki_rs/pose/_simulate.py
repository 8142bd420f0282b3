"""Monte-Carlo scenarios S1..S6 of the pose estimator (pure numpy, deterministic per seed).

All draws come from one :class:`numpy.random.Generator` seeded through
:class:`numpy.random.SeedSequence`, in a fixed order and fully vectorised, so that the same
``seed`` always gives the same scans and 10,000 scans take a few hundred milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._util.rng import resolve_seed
from .._util.validate import check_int

__all__ = ["Scans", "simulate_scans", "SCENARIOS"]

_BASE = {"noise": "anisotropic", "n_points": 20, "half_width": 10.0, "t_sigma": 5.0,
         "sigma": 0.05, "anisotropy": 10.0, "rho": 0.8}

#: The built-in scenarios (pose.md §7), read-only. Any of their keys can be overridden by
#: passing a dict ``{"base": "S1", "rho": 0.9, ...}`` as ``scenario``.
_SCENARIOS: dict[str, dict[str, Any]] = {
    # N = 20 landmarks uniform in a ±10 m cube, random attitude, t ~ N(0, 5² I); per point
    # R_bb, R_rr = Q diag(d) Qᵀ (random Q, 10:1 standard-deviation anisotropy, rms σ = 5 cm),
    # R_br = ρ R_bb^½ C R_rr^½ with a random orthogonal C and ρ = 0.8.
    "S1": dict(_BASE),
    # S1 without cross-covariance.
    "S2": {**_BASE, "rho": 0.0},
    # Isotropic, σ_b = σ_r = 5 cm.
    "S3": {**_BASE, "noise": "isotropic", "sigma_b": 0.05, "sigma_r": 0.05},
    # LiDAR-like: 30 points at ranges 5-50 m; body noise 2 cm along the ray and 0.1° across it;
    # map noise 3 cm isotropic; no cross term.
    "S4": {**_BASE, "noise": "lidar", "n_points": 30, "range": (5.0, 50.0), "sigma_range": 0.02,
           "sigma_angle_deg": 0.1, "sigma_map": 0.03},
    # S1 with σ = 0.5 m (5% of the scene size): checks the small-noise (first-order) claim.
    "S5": {**_BASE, "sigma": 0.5},
    # A trajectory of scans past a fixed map of 50 landmarks, 10-30 visible per scan (the
    # nearest ones), S1 noise on every point.
    "S6": {**_BASE, "noise": "anisotropic", "trajectory": True, "n_points": 50, "visible": (10, 30),
           "map_extent": (40.0, 15.0, 5.0)},
}
SCENARIOS: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {name: MappingProxyType(keys) for name, keys in _SCENARIOS.items()})


@dataclass(frozen=True, eq=False)
class Scans:
    """Simulated scans with their ground truth.

    Attributes
    ----------
    b, r : ndarray, shape (B, N, 3), or (total, 3) when ``offsets`` is set (S6)
        Noisy body-frame and reference-frame points.
    b_true, r_true : ndarray, same shapes
        The noise-free points, ``b_true = A r_true + t``.
    cov : ndarray, shape (B, N, 6, 6) or (total, 6, 6)
        Covariance of ``[Δb; Δr]`` of every point, the one the noise was drawn from.
    rotation : ndarray, shape (B, 3, 3)
        True attitudes ``A`` (reference → body).
    translation : ndarray, shape (B, 3)
        True translations ``t`` (body frame).
    offsets : ndarray of int64, shape (B + 1,), or None
        Ragged batches (S6): scan ``k`` is rows ``offsets[k]:offsets[k+1]``.
    landmark : ndarray of int64, shape (total,), or None
        For S6, the map landmark of each row.
    scenario : dict
        The resolved scenario parameters.
    seed : int
        The seed actually used.
    """

    b: NDArray[np.float64]
    r: NDArray[np.float64]
    b_true: NDArray[np.float64]
    r_true: NDArray[np.float64]
    cov: NDArray[np.float64]
    rotation: NDArray[np.float64]
    translation: NDArray[np.float64]
    offsets: NDArray[np.int64] | None
    scenario: dict[str, Any] = field(repr=False)
    seed: int = 0
    landmark: NDArray[np.int64] | None = None

    def __len__(self) -> int:
        return int(self.rotation.shape[0])

    def estimate(self, **kwargs: Any) -> Any:
        """:func:`~maleki_rs.pose.estimate_pose_batch` on these scans with their covariances."""
        from ._estimate import estimate_pose_batch

        return estimate_pose_batch(self.b, self.r, self.cov, offsets=self.offsets, **kwargs)

    def kabsch(self) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.int8]]:
        """:func:`~maleki_rs.pose.absolute_orientation_batch` on these scans (unweighted)."""
        from ._estimate import absolute_orientation_batch

        return absolute_orientation_batch(self.b, self.r, offsets=self.offsets)

    def crlb(self) -> NDArray[np.float64]:
        """The Cramér-Rao bound (B, 6, 6) of every scan at its true pose and points."""
        from ._estimate import crlb

        return crlb(self.rotation, self.translation, self.r_true, self.cov, offsets=self.offsets)


def _rotations(rng: np.random.Generator, shape: tuple[int, ...]) -> NDArray[np.float64]:
    """Uniform random rotations (normalised Gaussian quaternions)."""
    q = rng.standard_normal(shape + (4,))
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    x, y, z, w = np.moveaxis(q, -1, 0)
    return np.stack(
        [
            np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], -1),
            np.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], -1),
            np.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1),
        ],
        -2,
    )


def _rotation_components(rng: np.random.Generator, shape: tuple[int, ...]) -> list[list[NDArray[np.float64]]]:
    """Uniform random rotations as a 3x3 nested list of component arrays of ``shape``.

    Component form keeps the per-point 3x3 algebra below as plain elementwise array
    operations, which is several times faster than numpy's stacked ``matmul`` on 3x3 blocks.
    """
    q = rng.standard_normal((4,) + shape)
    q /= np.sqrt(np.sum(q * q, axis=0))
    x, y, z, w = q
    xx, yy, zz = x * x, y * y, z * z
    xy, xz, yz, wx, wy, wz = x * y, x * z, y * z, w * x, w * y, w * z
    return [
        [1 - 2 * (yy + zz), 2 * (xy - wz), 2 * (xz + wy)],
        [2 * (xy + wz), 1 - 2 * (xx + zz), 2 * (yz - wx)],
        [2 * (xz - wy), 2 * (yz + wx), 1 - 2 * (xx + yy)],
    ]


def _sym_from_eig(q: list[list[NDArray]], d: NDArray) -> list[list[NDArray]]:
    """``Q diag(d) Qᵀ`` in component form."""
    out: list[list[Any]] = [[None] * 3 for _ in range(3)]
    for i in range(3):
        for j in range(i, 3):
            out[i][j] = d[0] * q[i][0] * q[j][0] + d[1] * q[i][1] * q[j][1] + d[2] * q[i][2] * q[j][2]
            out[j][i] = out[i][j]
    return out


def _mm(a: list[list[Any]], b: list[list[Any]]) -> list[list[NDArray]]:
    return [[a[i][0] * b[0][j] + a[i][1] * b[1][j] + a[i][2] * b[2][j] for j in range(3)] for i in range(3)]


def _mv(a: list[list[Any]], v: NDArray) -> list[NDArray]:
    return [a[i][0] * v[0] + a[i][1] * v[1] + a[i][2] * v[2] for i in range(3)]


def _anisotropic_noise(rng: np.random.Generator, shape: tuple[int, ...], p: dict[str, Any]
                       ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Covariances (shape, 6, 6) and draws (shape, 6) of the S1-style noise model.

    ``R_bb = Q_b diag(s²) Q_bᵀ`` and ``R_rr = Q_r diag(s²) Q_rᵀ`` with random ``Q`` and standard
    deviations ``s ∝ (1, √κ, κ)`` scaled to rms ``σ``; ``R_br = ρ R_bb^½ C R_rr^½`` with ``C``
    Haar-random on O(3). The draw is ``z = [R_bb^½ x₁; R_rr^½ x₂]`` with ``x₁ ~ N(0, I)`` and
    ``x₂ = ρ Cᵀ x₁ + √(1 − ρ²) ξ``, so that ``Cov(x₁, x₂) = ρ C`` and ``Cov(z) = R``.
    """
    sigma, aniso, rho = float(p["sigma"]), float(p["anisotropy"]), float(p["rho"])
    if not 0.0 <= rho < 1.0:
        raise ValueError(f"scenario: rho must be in [0, 1), got {rho}")
    if aniso < 1.0 or sigma <= 0.0:
        raise ValueError("scenario: needs anisotropy >= 1 and sigma > 0")
    std = np.array([1.0, np.sqrt(aniso), aniso])
    std *= sigma / np.sqrt(np.mean(std**2))  # rms standard deviation = sigma
    qb = _rotation_components(rng, shape)
    qr = _rotation_components(rng, shape)
    c = _rotation_components(rng, shape)
    sign = rng.choice([-1.0, 1.0], size=shape)  # Haar on O(3): a random rotation times ±1
    c = [[sign * cij for cij in row] for row in c]
    hb = _sym_from_eig(qb, std)  # symmetric square roots R^½ = Q diag(s) Qᵀ
    hr = _sym_from_eig(qr, std)
    rbb = _sym_from_eig(qb, std**2)
    rrr = _sym_from_eig(qr, std**2)
    br = _mm(_mm(hb, c), hr)
    cov = np.empty(shape + (6, 6))
    for i in range(3):
        for j in range(3):
            cov[..., i, j] = rbb[i][j]
            cov[..., 3 + i, 3 + j] = rrr[i][j]
            cov[..., i, 3 + j] = rho * br[i][j]
            cov[..., 3 + j, i] = rho * br[i][j]
    xi = rng.standard_normal((2, 3) + shape)
    x1 = xi[0]
    ctx1 = [c[0][i] * x1[0] + c[1][i] * x1[1] + c[2][i] * x1[2] for i in range(3)]
    x2 = [rho * ctx1[i] + np.sqrt(1.0 - rho * rho) * xi[1][i] for i in range(3)]
    z = np.stack(_mv(hb, x1) + _mv(hr, x2), axis=-1)
    return cov, z


def _isotropic_noise(rng: np.random.Generator, shape: tuple[int, ...], p: dict[str, Any]
                     ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    sb, sr = float(p["sigma_b"]), float(p["sigma_r"])
    cov = np.zeros(shape + (6, 6))
    idx = np.arange(3)
    cov[..., idx, idx] = sb * sb
    cov[..., idx + 3, idx + 3] = sr * sr
    z = rng.standard_normal(shape + (6,)) * np.array([sb, sb, sb, sr, sr, sr])
    return cov, z


def _resolve(scenario: Any) -> dict[str, Any]:
    if isinstance(scenario, str):
        if scenario not in SCENARIOS:
            raise ValueError(f"scenario: must be one of {', '.join(SCENARIOS)} or a dict; got {scenario!r}")
        return {"name": scenario, **SCENARIOS[scenario]}
    if isinstance(scenario, dict):
        base = scenario.get("base", "S1")
        if not isinstance(base, str) or base not in SCENARIOS:
            raise ValueError(f"scenario: base must be one of {', '.join(SCENARIOS)}; got {base!r}")
        unknown = set(scenario) - set(SCENARIOS[base]) - {"base", "name"} - set(_ALL_KEYS)
        if unknown:
            raise ValueError(f"scenario: unknown keys {sorted(unknown)}")
        out = {"name": f"custom({base})", **SCENARIOS[base], **scenario}
        out.pop("base", None)
        if isinstance(out.get("trajectory"), (bool, np.bool_)) and out["trajectory"]:
            # A trajectory on a base without one takes S6's map and visibility unless given.
            for key in ("map_extent", "visible"):
                out.setdefault(key, SCENARIOS["S6"][key])
        _check_overrides(out, set(scenario) - {"base", "name"})
        return out
    raise TypeError(f"scenario: expected a scenario name or a dict, got {type(scenario).__name__}")


_ALL_KEYS = sorted({k for s in SCENARIOS.values() for k in s})

#: Largest length (metres) or ratio a scenario takes: squares and products of such values
#: (covariances, sums of squares) stay far inside float64.
_BIG = 1e100

#: Allowed ranges of the numeric scenario keys: (low, high, low inclusive).
_RANGES = {"half_width": (0.0, _BIG, False), "t_sigma": (0.0, _BIG, True), "sigma": (0.0, _BIG, False),
           "sigma_b": (0.0, _BIG, False), "sigma_r": (0.0, _BIG, False), "anisotropy": (1.0, _BIG, True),
           "rho": (-1.0, 1.0, True), "sigma_range": (0.0, _BIG, False), "sigma_angle_deg": (0.0, 180.0, False),
           "sigma_map": (0.0, _BIG, False)}


def _number(v: Any, key: str) -> float:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"scenario[{key!r}]: expected a number, got {type(v).__name__}")
    f = float(v)
    if not np.isfinite(f):
        raise ValueError(f"scenario[{key!r}]: must be finite, got {v!r}")
    return f


def _check_overrides(p: dict[str, Any], keys: set[str]) -> None:
    """Validates the keys a scenario dict overrides (the built-in values are valid)."""
    for key in sorted(keys):
        v = p[key]
        if key in _RANGES:
            lo, hi, closed = _RANGES[key]
            f = _number(v, key)
            if f > hi or f < lo or (f == lo and not closed):
                raise ValueError(f"scenario[{key!r}]: must be in {'[' if closed else '('}{lo}, {hi}], got {v!r}")
        elif key == "n_points":
            p[key] = check_int(v, "scenario['n_points']", min=3, max=10**7)
        elif key == "noise":
            if v not in ("anisotropic", "isotropic", "lidar"):
                raise ValueError(f"scenario['noise']: must be 'anisotropic', 'isotropic' or 'lidar', got {v!r}")
        elif key == "range":
            lo, hi = (_number(x, key) for x in _pair(v, key))
            if not 0.0 < lo < hi <= _BIG:
                raise ValueError(f"scenario['range']: needs 0 < low < high <= {_BIG:g}, got {v!r}")
        elif key == "visible":
            lo, hi = (check_int(x, "scenario['visible']", min=3) for x in _pair(v, key))
            if lo > hi:
                raise ValueError(f"scenario['visible']: needs low <= high, got {v!r}")
        elif key == "map_extent":
            ext = [_number(x, key) for x in v] if isinstance(v, (tuple, list)) else []
            if len(ext) != 3 or min(ext) <= 0 or max(ext) > _BIG:
                raise ValueError(f"scenario['map_extent']: needs 3 positive lengths up to {_BIG:g}, got {v!r}")
        elif key == "trajectory" and not isinstance(v, (bool, np.bool_)):
            raise TypeError(f"scenario['trajectory']: expected a bool, got {type(v).__name__}")


def _pair(v: Any, key: str) -> tuple[Any, Any]:
    if not isinstance(v, (tuple, list)) or len(v) != 2:
        raise ValueError(f"scenario[{key!r}]: expected a pair (low, high), got {v!r}")
    return v[0], v[1]


def simulate_scans(n_scans: int, n_points: int | None = None, *, scenario: str | dict[str, Any] = "S1",
                   seed: int | None = None) -> Scans:
    """Simulated scans of a scenario (pure numpy; deterministic given ``seed``).

    Parameters
    ----------
    n_scans : int
        Number of scans ``B`` (independent Monte-Carlo runs, or trajectory poses for S6).
    n_points : int, optional
        Correspondences per scan (S6: landmarks in the map). Default: the scenario's (20 for
        S1-S3 and S5, 30 for S4, 50 for S6).
    scenario : {"S1", "S2", "S3", "S4", "S5", "S6"} or dict
        A built-in scenario (see :data:`SCENARIOS`) or a dict overriding some of its keys,
        e.g. ``{"base": "S1", "rho": 0.9, "anisotropy": 100.0}``.
    seed : int, optional
        Seed (``None``: fresh entropy, stored on the result).

    Returns
    -------
    Scans
        Noisy points, ground truth, the per-point covariances and the true poses. S6 is ragged
        (``offsets``); its map-point noise is drawn afresh for every scan.
    """
    nb = check_int(n_scans, "n_scans", min=1, max=10**8)
    p = _resolve(scenario)
    if n_points is not None:
        p["n_points"] = check_int(n_points, "n_points", min=3, max=10**7)
    n = int(p["n_points"])
    s = resolve_seed(seed)
    rng = np.random.default_rng(np.random.SeedSequence(s))
    if p.get("trajectory"):
        return _trajectory(rng, nb, n, p, s)
    rot = _rotations(rng, (nb,))
    t = rng.standard_normal((nb, 3)) * float(p["t_sigma"])
    kind = p["noise"]
    if kind == "lidar":
        lo, hi = p["range"]
        u = rng.standard_normal((nb, n, 3))
        u /= np.linalg.norm(u, axis=-1, keepdims=True)
        rng_ = rng.uniform(lo, hi, size=(nb, n))
        b_true = u * rng_[..., None]
        r_true = np.einsum("kji,knj->kni", rot, b_true - t[:, None, :])
        sa = np.deg2rad(float(p["sigma_angle_deg"])) * rng_
        uu = u[..., :, None] * u[..., None, :]
        cov = np.zeros((nb, n, 6, 6))
        cov[..., :3, :3] = float(p["sigma_range"]) ** 2 * uu + (sa**2)[..., None, None] * (np.eye(3) - uu)
        idx = np.arange(3, 6)
        cov[..., idx, idx] = float(p["sigma_map"]) ** 2
        # Draws: along the ray, two across it (an orthonormal frame per point), then the map.
        xi = rng.standard_normal((nb, n, 6))
        e1 = np.cross(u, np.where(np.abs(u[..., :1]) < 0.9, [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]))
        e1 /= np.linalg.norm(e1, axis=-1, keepdims=True)
        e2 = np.cross(u, e1)
        zb = (float(p["sigma_range"]) * xi[..., 0:1] * u + sa[..., None] * (xi[..., 1:2] * e1 + xi[..., 2:3] * e2))
        z = np.concatenate([zb, float(p["sigma_map"]) * xi[..., 3:]], -1)
    else:
        w = float(p["half_width"])
        r_true = rng.uniform(-w, w, size=(nb, n, 3))
        b_true = np.einsum("kij,knj->kni", rot, r_true) + t[:, None, :]
        if kind == "anisotropic":
            cov, z = _anisotropic_noise(rng, (nb, n), p)
        elif kind == "isotropic":
            cov, z = _isotropic_noise(rng, (nb, n), p)
        else:
            raise ValueError(f"scenario: unknown noise model {kind!r}")
    return Scans(b=b_true + z[..., :3], r=r_true + z[..., 3:], b_true=b_true, r_true=r_true, cov=cov,
                 rotation=rot, translation=t, offsets=None, scenario=p, seed=s)


def _trajectory(rng: np.random.Generator, nb: int, n_map: int, p: dict[str, Any], seed: int) -> Scans:
    """S6: a vehicle drives along x past a fixed map; each scan sees its nearest landmarks."""
    ex, ey, ez = (float(v) for v in p["map_extent"])
    lo, hi = (int(v) for v in p["visible"])
    hi = min(hi, n_map)
    lo = min(lo, hi)
    if lo < 3:
        raise ValueError("scenario: at least 3 landmarks must be visible per scan")
    landmarks = rng.uniform([-ex, -ey, -ez], [ex, ey, ez], size=(n_map, 3))
    s = np.linspace(0.0, 1.0, nb)
    # Position along a gentle S-curve; the heading follows the path, with small pitch/roll.
    px = -ex + 2 * ex * s
    py = 0.3 * ey * np.sin(2 * np.pi * s)
    heading = np.arctan2(np.gradient(py) if nb > 1 else np.zeros(1), np.gradient(px) if nb > 1 else np.ones(1))
    pos = np.stack([px, py, np.zeros(nb)], -1)
    roll = 0.05 * np.sin(6 * np.pi * s)
    pitch = 0.03 * np.cos(4 * np.pi * s)

    def rz(a: NDArray) -> NDArray:
        c, sn = np.cos(a), np.sin(a)
        m = np.zeros(a.shape + (3, 3))
        m[..., 0, 0], m[..., 0, 1], m[..., 1, 0], m[..., 1, 1], m[..., 2, 2] = c, -sn, sn, c, 1.0
        return m

    def ry(a: NDArray) -> NDArray:
        c, sn = np.cos(a), np.sin(a)
        m = np.zeros(a.shape + (3, 3))
        m[..., 0, 0], m[..., 0, 2], m[..., 2, 0], m[..., 2, 2], m[..., 1, 1] = c, sn, -sn, c, 1.0
        return m

    def rx(a: NDArray) -> NDArray:
        c, sn = np.cos(a), np.sin(a)
        m = np.zeros(a.shape + (3, 3))
        m[..., 1, 1], m[..., 1, 2], m[..., 2, 1], m[..., 2, 2], m[..., 0, 0] = c, -sn, sn, c, 1.0
        return m

    body_to_ref = rz(heading) @ ry(pitch) @ rx(roll)
    rot = np.swapaxes(body_to_ref, -1, -2)  # A maps reference -> body
    t = -np.einsum("kij,kj->ki", rot, pos)
    k_vis = rng.integers(lo, hi + 1, size=nb)
    dist = np.linalg.norm(landmarks[None, :, :] - pos[:, None, :], axis=-1)
    order = np.argsort(dist, axis=1, kind="stable")
    offsets = np.zeros(nb + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(k_vis)
    scan_of = np.repeat(np.arange(nb), k_vis)
    rank = np.arange(offsets[-1]) - offsets[scan_of]
    landmark = order[scan_of, rank]
    r_true = landmarks[landmark]
    b_true = np.einsum("kij,kj->ki", rot[scan_of], r_true) + t[scan_of]
    cov, z = _anisotropic_noise(rng, (int(offsets[-1]),), p)
    return Scans(b=b_true + z[:, :3], r=r_true + z[:, 3:], b_true=b_true, r_true=r_true, cov=cov,
                 rotation=rot, translation=t, offsets=offsets, scenario=p, seed=seed, landmark=landmark)
