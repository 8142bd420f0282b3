"""Total-least-squares pose estimation with full per-point covariances.

Estimates the rigid transform ``b = A r + t`` between body-frame (sensor) points ``b`` and
reference-frame (map) points ``r`` when *both* are noisy, each correspondence with its own
6x6 covariance of ``[Δb; Δr]``, cross-correlation included (Maleki, Cheng, Crassidis,
Schmid, "Total Least Squares for Optimal Pose Estimation", arXiv 2106.11522). The estimate
attains the Cramér-Rao bound to first order and comes with a calibrated 6x6 covariance and a
χ² goodness-of-fit statistic.

"TLS" means *total* least squares (errors-in-variables) here, not the *truncated* least
squares of TEASER++: outliers are not rejected; use ``chi2`` for gating.

Conventions
-----------
* ``A`` (3x3) maps reference-frame vectors into the body frame; ``t`` is in the body frame;
  the body origin in the reference frame is ``p = −Aᵀ t``.
* Quaternions are scalar-last ``[x, y, z, w]`` with ``w >= 0``, so that
  ``scipy.spatial.transform.Rotation.from_quat(q).as_matrix() == A``. (The Shuster/Markley
  attitude convention uses the conjugate quaternion for the same matrix.)
* Covariances of points are of ``[Δb; Δr]`` (body first). Pose errors are ``[θ; δt]`` with
  ``Â = exp([θ×]) A`` (body-frame angles) and ``δt = t̂ − t``. Reference-frame versions:
  ``φ = Aᵀθ`` and ``δp = −Aᵀ([t×]θ + δt)`` (:func:`reference_frame_errors`,
  :func:`reference_frame_covariance`, :func:`position_covariance`).

Functions
---------
estimate_pose, estimate_pose_batch
    The TLS estimator (one scan; many scans in parallel).
absolute_orientation, absolute_orientation_batch
    Weighted Kabsch/Horn baseline.
crlb
    Cramér-Rao bound at the true pose.
pose_error, nees
    Error coordinates and normalised estimation error squared.
simulate_scans
    Monte-Carlo scenarios S1-S6.
"""

from ._estimate import absolute_orientation, absolute_orientation_batch, crlb, estimate_pose, estimate_pose_batch
from ._geometry import (
    matrix_from_quaternion,
    nees,
    pose_error,
    position_covariance,
    quaternion_from_matrix,
    reference_frame_covariance,
    reference_frame_errors,
    rotation_vector,
)
from ._results import STATUS, PoseEstimate, PoseEstimateBatch
from ._simulate import SCENARIOS, Scans, simulate_scans

__all__ = [
    "estimate_pose",
    "estimate_pose_batch",
    "absolute_orientation",
    "absolute_orientation_batch",
    "crlb",
    "pose_error",
    "nees",
    "simulate_scans",
    "PoseEstimate",
    "PoseEstimateBatch",
    "Scans",
    "SCENARIOS",
    "STATUS",
    "quaternion_from_matrix",
    "matrix_from_quaternion",
    "rotation_vector",
    "position_covariance",
    "reference_frame_errors",
    "reference_frame_covariance",
]
