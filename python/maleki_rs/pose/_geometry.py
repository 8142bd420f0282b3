"""Rotation and error-coordinate helpers (pure numpy, vectorised over leading axes).

Conventions (see :mod:`maleki_rs.pose`): ``A`` maps reference-frame vectors into the body
frame, ``b = A r + t``; pose errors are ``x̃ = [θ; δt]`` with ``Â = exp([θ×]) A`` (a left,
body-frame perturbation) and ``δt = t̂ − t``; quaternions are scalar-last ``[x, y, z, w]``
with ``w >= 0``, the convention of :class:`scipy.spatial.transform.Rotation`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._util.validate import as_float_array

__all__ = [
    "quaternion_from_matrix",
    "matrix_from_quaternion",
    "rotation_vector",
    "pose_error",
    "nees",
    "position_covariance",
    "reference_frame_errors",
    "reference_frame_covariance",
]


def _trailing(x: Any, name: str, tail: tuple[int, ...]) -> NDArray[np.float64]:
    arr = as_float_array(x, name)
    if arr.ndim < len(tail) or arr.shape[arr.ndim - len(tail):] != tail:
        want = "(..., " + ", ".join(map(str, tail)) + ")"
        raise ValueError(f"{name}: expected shape {want}, got {arr.shape}")
    return arr


#: Largest |R Rᵀ − I| entry accepted as a rotation matrix (float32-rounded rotations pass).
_ORTHO_TOL = 1e-5


def _rotation(x: Any, name: str) -> NDArray[np.float64]:
    """Rotation matrices ``(..., 3, 3)``: orthonormal within ``_ORTHO_TOL`` with ``det = +1``."""
    m = _trailing(x, name, (3, 3))
    err = np.abs(m @ np.swapaxes(m, -1, -2) - np.eye(3)).max(axis=(-2, -1))
    bad = (err > _ORTHO_TOL) | (np.linalg.det(m) <= 0)
    if np.any(bad):
        where = np.argwhere(np.atleast_1d(bad))[0]
        at = f" at index {tuple(int(i) for i in where)}" if m.ndim > 2 else ""
        raise ValueError(f"{name}: not a rotation matrix{at} (needs R Rᵀ = I and det R = +1; "
                         f"max |R Rᵀ − I| = {float(np.atleast_1d(err)[tuple(where)]):.2g})")
    return m


def _skew(v: NDArray[np.float64]) -> NDArray[np.float64]:
    out = np.zeros(v.shape[:-1] + (3, 3))
    out[..., 0, 1], out[..., 0, 2] = -v[..., 2], v[..., 1]
    out[..., 1, 0], out[..., 1, 2] = v[..., 2], -v[..., 0]
    out[..., 2, 0], out[..., 2, 1] = -v[..., 1], v[..., 0]
    return out


def quaternion_from_matrix(rotation: Any) -> NDArray[np.float64]:
    """Unit quaternions ``[x, y, z, w]`` (``w >= 0``) of rotation matrices.

    Parameters
    ----------
    rotation : array_like, shape (..., 3, 3)
        Rotation matrices.

    Returns
    -------
    ndarray, shape (..., 4), float64
        Scalar-last quaternions with ``scipy.spatial.transform.Rotation.from_quat(q).as_matrix()``
        equal to ``rotation``. Shepperd's method: exact near half turns too.
    """
    m = _rotation(rotation, "rotation")
    m00, m01, m02 = m[..., 0, 0], m[..., 0, 1], m[..., 0, 2]
    m10, m11, m12 = m[..., 1, 0], m[..., 1, 1], m[..., 1, 2]
    m20, m21, m22 = m[..., 2, 0], m[..., 2, 1], m[..., 2, 2]
    cand = np.stack([m00 + m11 + m22, m00, m11, m22], axis=-1)
    k = np.argmax(cand, axis=-1)
    q = np.empty(m.shape[:-2] + (4,))
    with np.errstate(invalid="ignore", divide="ignore"):
        # k = 0: w largest.
        w = 0.5 * np.sqrt(np.maximum(1.0 + m00 + m11 + m22, 0.0))
        q0 = np.stack([(m21 - m12) / (4 * w), (m02 - m20) / (4 * w), (m10 - m01) / (4 * w), w], -1)
        x = 0.5 * np.sqrt(np.maximum(1.0 + m00 - m11 - m22, 0.0))
        q1 = np.stack([x, (m01 + m10) / (4 * x), (m02 + m20) / (4 * x), (m21 - m12) / (4 * x)], -1)
        y = 0.5 * np.sqrt(np.maximum(1.0 - m00 + m11 - m22, 0.0))
        q2 = np.stack([(m01 + m10) / (4 * y), y, (m12 + m21) / (4 * y), (m02 - m20) / (4 * y)], -1)
        z = 0.5 * np.sqrt(np.maximum(1.0 - m00 - m11 + m22, 0.0))
        q3 = np.stack([(m02 + m20) / (4 * z), (m12 + m21) / (4 * z), z, (m10 - m01) / (4 * z)], -1)
    for j, qj in enumerate((q0, q1, q2, q3)):
        sel = k == j
        q[sel] = qj[sel]
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    first = np.take_along_axis(q[..., :3], np.argmax(q[..., :3] != 0, axis=-1)[..., None], -1)[..., 0]
    flip = (q[..., 3] < 0) | ((q[..., 3] == 0) & (first < 0))
    q[flip] *= -1
    return q


def matrix_from_quaternion(quaternion: Any) -> NDArray[np.float64]:
    """Rotation matrices of scalar-last quaternions ``[x, y, z, w]`` (normalised first).

    Parameters
    ----------
    quaternion : array_like, shape (..., 4)

    Returns
    -------
    ndarray, shape (..., 3, 3), float64
    """
    q = _trailing(quaternion, "quaternion", (4,))
    n = np.linalg.norm(q, axis=-1, keepdims=True)
    if np.any(n == 0):
        raise ValueError("quaternion: zero-norm quaternion")
    x, y, z, w = np.moveaxis(q / n, -1, 0)
    return np.stack(
        [
            np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], -1),
            np.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], -1),
            np.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1),
        ],
        -2,
    )


def rotation_vector(rotation: Any) -> NDArray[np.float64]:
    """``θ`` with ``exp([θ×]) = rotation`` and ``|θ| <= π`` (the SO(3) logarithm).

    Parameters
    ----------
    rotation : array_like, shape (..., 3, 3)

    Returns
    -------
    ndarray, shape (..., 3), float64, radians
    """
    q = quaternion_from_matrix(rotation)
    v, w = q[..., :3], q[..., 3]
    nv = np.linalg.norm(v, axis=-1)
    angle = 2.0 * np.arctan2(nv, w)
    with np.errstate(invalid="ignore", divide="ignore"):
        scale = np.where(nv > 1e-300, angle / np.where(nv > 0, nv, 1.0), 2.0 / w)
    return v * scale[..., None]


def pose_error(rotation_hat: Any, t_hat: Any, rotation_true: Any, t_true: Any) -> NDArray[np.float64]:
    """Pose errors ``x̃ = [θ; δt]`` with ``Â = exp([θ×]) A`` and ``δt = t̂ − t``.

    Parameters
    ----------
    rotation_hat, rotation_true : array_like, shape (..., 3, 3)
        Estimated and true attitude matrices (broadcast against each other).
    t_hat, t_true : array_like, shape (..., 3)
        Estimated and true translations, in the body frame.

    Returns
    -------
    ndarray, shape (..., 6), float64
        ``θ`` (radians, body frame) then ``δt`` (length units).
    """
    ah = _rotation(rotation_hat, "rotation_hat")
    at = _rotation(rotation_true, "rotation_true")
    th = _trailing(t_hat, "t_hat", (3,))
    tt = _trailing(t_true, "t_true", (3,))
    try:
        theta = rotation_vector(ah @ np.swapaxes(at, -1, -2))
        dt = th - tt
        theta, dt = np.broadcast_arrays(theta, dt)
    except ValueError as exc:
        if "not a rotation" in str(exc):
            raise
        raise ValueError(f"rotation_hat, rotation_true, t_hat, t_true: leading shapes {ah.shape[:-2]}, "
                         f"{at.shape[:-2]}, {th.shape[:-1]}, {tt.shape[:-1]} do not broadcast") from None
    return np.concatenate([theta, dt], axis=-1)


def nees(errors: Any, covariances: Any) -> NDArray[np.float64]:
    """Normalised estimation error squared ``ε = x̃ᵀ P⁻¹ x̃``.

    Parameters
    ----------
    errors : array_like, shape (..., d)
    covariances : array_like, shape (..., d, d)
        Symmetric positive definite.

    Returns
    -------
    ndarray, shape (...,), float64
        Under a consistent estimator ``ε ~ χ²(d)``; the ANEES of ``M`` runs is
        ``mean(ε) / d`` and ``M d ANEES ~ χ²(M d)``.
    """
    x = as_float_array(errors, "errors")
    p = as_float_array(covariances, "covariances")
    if x.ndim < 1:
        raise ValueError(f"errors: expected shape (..., d), got {x.shape}")
    d = x.shape[-1]
    if p.ndim < 2 or p.shape[-2:] != (d, d):
        raise ValueError(f"covariances: expected shape (..., {d}, {d}) to match errors, got {p.shape}")
    scale = np.abs(p).max(axis=(-2, -1), keepdims=True)
    if np.any(np.abs(p - np.swapaxes(p, -1, -2)) > 1e-9 * scale):
        raise ValueError("covariances: not symmetric")
    try:
        chol = np.linalg.cholesky(p)
    except np.linalg.LinAlgError:
        raise ValueError("covariances: a matrix is not positive definite") from None
    try:
        z = np.linalg.solve(chol, x[..., None])[..., 0]  # L z = x, so ε = |z|²
    except ValueError:
        raise ValueError(f"errors, covariances: leading shapes {x.shape[:-1]} and {p.shape[:-2]} do not "
                         "broadcast") from None
    return np.einsum("...i,...i->...", z, z)


def _check_broadcast(**arrays: tuple[NDArray[np.float64], int]) -> None:
    """Raises a ValueError naming the arguments when their leading shapes (all but the last
    ``ndim`` axes of each) do not broadcast."""
    shapes = {name: a.shape[: a.ndim - nd] for name, (a, nd) in arrays.items()}
    try:
        np.broadcast_shapes(*shapes.values())
    except ValueError:
        listed = ", ".join(f"{n} {s}" for n, s in shapes.items())
        raise ValueError(f"{', '.join(shapes)}: leading shapes do not broadcast ({listed})") from None


def _jac_reference(rotation: NDArray[np.float64], translation: NDArray[np.float64]) -> NDArray[np.float64]:
    """``T`` with ``[φ; δp] = T [θ; δt]``: ``φ = Aᵀθ``, ``δp = −Aᵀ([t×]θ + δt)``."""
    at = np.swapaxes(rotation, -1, -2)
    shape = np.broadcast_shapes(at.shape[:-2], translation.shape[:-1])
    t = np.zeros(shape + (6, 6))
    t[..., :3, :3] = at
    t[..., 3:, :3] = -at @ _skew(translation)
    t[..., 3:, 3:] = -at
    return t


def position_covariance(rotation: Any, translation: Any, covariance: Any) -> NDArray[np.float64]:
    """Covariance of the body origin in the reference frame, ``p = −Aᵀ t``.

    ``P_p = J P Jᵀ`` with ``J = −Aᵀ [[t×], I₃]``.

    Parameters
    ----------
    rotation : array_like, shape (..., 3, 3)
    translation : array_like, shape (..., 3)
    covariance : array_like, shape (..., 6, 6)
        ``Cov([θ; δt])`` as returned by the estimator.

    Returns
    -------
    ndarray, shape (..., 3, 3), float64
    """
    full = reference_frame_covariance(rotation, translation, covariance)
    return full[..., 3:, 3:]


def reference_frame_errors(rotation: Any, translation: Any, errors: Any) -> NDArray[np.float64]:
    """Errors ``[θ; δt]`` expressed in the reference frame: ``[φ; δp]``.

    ``φ = Aᵀ θ`` (attitude error in the reference frame) and ``δp = −Aᵀ([t×] θ + δt)`` (error
    of the body position ``p = −Aᵀ t``), to first order.

    Returns
    -------
    ndarray, shape (..., 6), float64
    """
    a = _rotation(rotation, "rotation")
    t = _trailing(translation, "translation", (3,))
    x = _trailing(errors, "errors", (6,))
    _check_broadcast(rotation=(a, 2), translation=(t, 1), errors=(x, 1))
    return (_jac_reference(a, t) @ x[..., None])[..., 0]


def reference_frame_covariance(rotation: Any, translation: Any, covariance: Any) -> NDArray[np.float64]:
    """``Cov([φ; δp]) = T P Tᵀ`` for the reference-frame errors of :func:`reference_frame_errors`.

    Returns
    -------
    ndarray, shape (..., 6, 6), float64
    """
    a = _rotation(rotation, "rotation")
    t = _trailing(translation, "translation", (3,))
    p = _trailing(covariance, "covariance", (6, 6))
    _check_broadcast(rotation=(a, 2), translation=(t, 1), covariance=(p, 2))
    j = _jac_reference(a, t)
    return j @ p @ np.swapaxes(j, -1, -2)
