"""Result types of the pose estimator: frozen dataclasses of read-only numpy arrays."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ._geometry import position_covariance

__all__ = ["PoseEstimate", "PoseEstimateBatch", "STATUS"]

#: Meaning of the per-scan ``status`` codes.
STATUS: dict[int, str] = {0: "ok", 1: "not converged", 2: "degenerate", 3: "bad input"}


_ARRAY_FIELDS = ("rotation", "quaternion", "translation", "position", "covariance")
_BATCH_ARRAY_FIELDS = _ARRAY_FIELDS + ("cost", "chi2", "dof", "iterations", "converged", "status")


def _freeze(obj: Any, names: tuple[str, ...]) -> None:
    """Makes the array fields read-only (the dataclass itself is frozen)."""
    for name in names:
        getattr(obj, name).flags.writeable = False


def _homogeneous(rotation: NDArray[np.float64], translation: NDArray[np.float64]) -> NDArray[np.float64]:
    out = np.zeros(rotation.shape[:-2] + (4, 4))
    out[..., :3, :3] = rotation
    out[..., :3, 3] = translation
    out[..., 3, 3] = 1.0
    return out


def _scipy_rotation(quaternion: NDArray[np.float64]) -> Any:
    try:
        from scipy.spatial.transform import Rotation
    except ImportError:  # pragma: no cover - exercised only without scipy
        raise ImportError("as_rotation() needs scipy (pip install scipy)") from None
    return Rotation.from_quat(quaternion)


@dataclass(frozen=True, eq=False)
class PoseEstimate:
    """The total-least-squares pose of one scan.

    Attributes
    ----------
    rotation : ndarray, shape (3, 3)
        ``A``, mapping reference-frame vectors into the body frame: ``b = A r + t``.
    quaternion : ndarray, shape (4,)
        ``A`` as a scalar-last unit quaternion ``[x, y, z, w]``, ``w >= 0`` (scipy convention).
    translation : ndarray, shape (3,)
        ``t``, in the body frame.
    position : ndarray, shape (3,)
        The body origin in the reference frame, ``p = −Aᵀ t``.
    covariance : ndarray, shape (6, 6)
        ``Cov([θ; δt])`` with ``Â = exp([θ×]) A`` (radians, body frame) and ``δt = t̂ − t``:
        the inverse Gauss-Newton normal matrix at the optimum, which attains the Cramér-Rao
        bound to first order. NaN when ``compute_covariance=False``.
    cost : float
        ``J = ½ Σ eᵢᵀ Wᵢ eᵢ`` at the optimum.
    chi2 : float
        ``2 J``; ``~ χ²(dof)`` when the covariance model is right.
    dof : int
        ``3 N − 6``.
    iterations : int
        Gauss-Newton steps taken.
    converged : bool
        Whether the step fell below ``tol`` within ``max_iter`` iterations.
    status : int
        0 ok, 1 not converged.
    """

    rotation: NDArray[np.float64]
    quaternion: NDArray[np.float64]
    translation: NDArray[np.float64]
    position: NDArray[np.float64]
    covariance: NDArray[np.float64]
    cost: float
    chi2: float
    dof: int
    iterations: int
    converged: bool
    status: int

    def __post_init__(self) -> None:
        _freeze(self, _ARRAY_FIELDS)

    def position_covariance(self) -> NDArray[np.float64]:
        """Covariance (3, 3) of :attr:`position`, ``J P Jᵀ`` with ``J = −Aᵀ [[t×], I]``."""
        if np.isnan(self.covariance).all():
            raise ValueError("position_covariance: this estimate has no covariance (compute_covariance=False)")
        return position_covariance(self.rotation, self.translation, self.covariance)

    def as_matrix(self) -> NDArray[np.float64]:
        """The 4x4 homogeneous transform ``[[A, t], [0, 1]]`` (reference → body)."""
        return _homogeneous(self.rotation, self.translation)

    def as_rotation(self) -> Any:
        """The attitude as a :class:`scipy.spatial.transform.Rotation` (needs scipy)."""
        return _scipy_rotation(self.quaternion)

    def __repr__(self) -> str:
        q = np.array2string(self.quaternion, precision=6, separator=", ")
        t = np.array2string(self.translation, precision=6, separator=", ")
        return (
            f"PoseEstimate(quaternion={q}, translation={t}, chi2={self.chi2:.4g}, dof={self.dof}, "
            f"iterations={self.iterations}, converged={self.converged})"
        )


@dataclass(frozen=True, eq=False)
class PoseEstimateBatch:
    """The poses of a batch of scans: the fields of :class:`PoseEstimate` with a leading
    axis ``B``, plus a message per scan.

    A scan that failed has ``status`` 2 (degenerate geometry or numerical failure) or 3
    (bad input), NaN estimates and its reason in ``messages``; the other scans are
    unaffected. ``status`` 1 marks an estimate that did not converge (its values are the last
    iterate). ``len(batch)`` is ``B`` and ``batch[k]`` is the :class:`PoseEstimate` of scan
    ``k`` (an error for a failed scan).
    """

    rotation: NDArray[np.float64]
    quaternion: NDArray[np.float64]
    translation: NDArray[np.float64]
    position: NDArray[np.float64]
    covariance: NDArray[np.float64]
    cost: NDArray[np.float64]
    chi2: NDArray[np.float64]
    dof: NDArray[np.int64]
    iterations: NDArray[np.int64]
    converged: NDArray[np.bool_]
    status: NDArray[np.int8]
    messages: tuple[str, ...]

    def __post_init__(self) -> None:
        _freeze(self, _BATCH_ARRAY_FIELDS)

    def __len__(self) -> int:
        return int(self.status.shape[0])

    @property
    def ok(self) -> NDArray[np.bool_]:
        """Mask of the scans with ``status == 0``."""
        return self.status == 0

    def __getitem__(self, k: int) -> PoseEstimate:
        if isinstance(k, (bool, np.bool_)):
            raise TypeError(f"scan index: expected an integer, got {type(k).__name__} {k!r}")
        try:
            k = operator.index(k)
        except TypeError:
            raise TypeError(f"scan index: expected an integer, got {type(k).__name__} {k!r} (for several scans, "
                            "index the arrays, e.g. batch.rotation[1:3])") from None
        if not -len(self) <= k < len(self):
            raise IndexError(f"scan index {k} out of range for {len(self)} scans")
        k %= len(self)
        if self.status[k] >= 2:
            raise ValueError(f"scan {k} has no estimate ({STATUS[int(self.status[k])]}): {self.messages[k]}")
        return PoseEstimate(
            rotation=self.rotation[k].copy(),
            quaternion=self.quaternion[k].copy(),
            translation=self.translation[k].copy(),
            position=self.position[k].copy(),
            covariance=self.covariance[k].copy(),
            cost=float(self.cost[k]),
            chi2=float(self.chi2[k]),
            dof=int(self.dof[k]),
            iterations=int(self.iterations[k]),
            converged=bool(self.converged[k]),
            status=int(self.status[k]),
        )

    def position_covariance(self) -> NDArray[np.float64]:
        """Covariances (B, 3, 3) of :attr:`position`; NaN for the scans without an estimate
        (status >= 2), as in the other per-scan arrays."""
        has = (self.status < 2) & ~np.isnan(self.covariance).any(axis=(1, 2))
        if len(self) and not has.any() and (self.status < 2).any():
            raise ValueError("position_covariance: these estimates have no covariance (compute_covariance=False)")
        out = np.full((len(self), 3, 3), np.nan)
        if has.any():
            out[has] = position_covariance(self.rotation[has], self.translation[has], self.covariance[has])
        return out

    def as_matrix(self) -> NDArray[np.float64]:
        """The 4x4 homogeneous transforms (B, 4, 4)."""
        return _homogeneous(self.rotation, self.translation)

    def as_rotation(self) -> Any:
        """All attitudes as one :class:`scipy.spatial.transform.Rotation` (needs scipy; failed
        scans must be removed first, e.g. ``batch.quaternion[batch.ok]``)."""
        if not np.all(self.status < 2):
            raise ValueError("some scans failed (status >= 2); select batch.quaternion[batch.ok] instead")
        return _scipy_rotation(self.quaternion)

    def __repr__(self) -> str:
        counts = ", ".join(f"{STATUS[s]}: {int(np.sum(self.status == s))}" for s in STATUS if np.any(self.status == s))
        return f"PoseEstimateBatch({len(self)} scans; {counts or 'empty'})"
