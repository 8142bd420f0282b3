"""The public estimator functions: input normalisation and calls into ``_core.pose``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .. import _core
from .._util.progress import reporter
from .._util.validate import as_float_array, as_int_array, check_bool, check_float, check_int, shape_str
from ._results import PoseEstimate, PoseEstimateBatch

__all__ = [
    "estimate_pose",
    "estimate_pose_batch",
    "absolute_orientation",
    "absolute_orientation_batch",
    "crlb",
]

_core_pose = _core.pose


@dataclass(frozen=True)
class _Layout:
    """How the points of a call are laid out: ``B`` scans, ``N`` points each (``None`` when
    ragged), ``T`` points in all, and the ``offsets (B+1,)`` handed to the core."""

    n_scans: int
    n: int | None
    total: int
    offsets: NDArray[np.uint64]
    batch: bool


def _single_points(b: Any, r: Any, names: tuple[str, str] = ("b", "r")) -> tuple[NDArray, NDArray, _Layout]:
    bb = as_float_array(b, names[0], shape=(None, 3))
    rr = as_float_array(r, names[1], shape=(None, 3))
    if rr.shape[0] != bb.shape[0]:
        raise ValueError(f"{names[1]}: has {rr.shape[0]} points but {names[0]} has {bb.shape[0]}")
    n = bb.shape[0]
    if n < 3:
        raise ValueError(f"{names[0]}: needs at least 3 correspondences, got {n}")
    offsets = np.array([0, n], dtype=np.uint64)
    return bb, rr, _Layout(1, n, n, offsets, batch=False)


def _batch_points(b: Any, r: Any, offsets: Any) -> tuple[NDArray, NDArray, str, _Layout]:
    """``b``/``r`` as concatenated ``(T, 3)`` arrays; ``r`` may be a shared map (``"map"``).

    Non-finite values are left for the core, which reports them per scan (status 3).
    """
    if offsets is None:
        bb = as_float_array(b, "b", finite=False)
        if bb.ndim != 3 or bb.shape[2] != 3:
            raise ValueError(f"b: expected shape (B, N, 3) (or (total, 3) with offsets), got {shape_str(bb.shape)}")
        nb, n = bb.shape[:2]
        rr = as_float_array(r, "r", finite=False)
        if rr.shape == (n, 3):
            mode = "map"
        elif rr.shape == bb.shape:
            mode = "concat"
            rr = rr.reshape(nb * n, 3)
        else:
            raise ValueError(f"r: expected shape {shape_str((nb, n, 3))} or {shape_str((n, 3))} (a shared map), "
                             f"got {shape_str(rr.shape)}")
        offs = np.arange(nb + 1, dtype=np.uint64) * np.uint64(n)
        return bb.reshape(nb * n, 3), rr, mode, _Layout(nb, n, nb * n, offs, batch=True)
    offs = as_int_array(offsets, "offsets", ndim=1, dtype=np.int64)
    bb = as_float_array(b, "b", shape=(None, 3), finite=False, allow_empty=True)
    rr = as_float_array(r, "r", shape=(None, 3), finite=False, allow_empty=True)
    if offs[0] != 0 or np.any(np.diff(offs) < 0) or offs[-1] != bb.shape[0]:
        raise ValueError(f"offsets: must start at 0, be non-decreasing and end at the number of points "
                         f"({bb.shape[0]}); got {offs[:3].tolist()}...{offs[-1:].tolist()}")
    if rr.shape[0] != bb.shape[0]:
        raise ValueError(f"r: has {rr.shape[0]} points but b has {bb.shape[0]} (ragged batches need r of shape (total, 3))")
    nb = offs.shape[0] - 1
    return bb, rr, "concat", _Layout(nb, None, bb.shape[0], offs.astype(np.uint64), batch=True)


def _per_point(x: Any, name: str, tail: tuple[int, ...], layout: _Layout, *, allow_shared: bool = True
               ) -> tuple[NDArray, str]:
    """A per-point array (trailing shape ``tail``) in the canonical layout: ``"shared"`` (one
    for all points), ``"map"`` (one per point of a scan, for every scan) or ``"concat"``."""
    arr = as_float_array(x, name, finite=not layout.batch)
    k = len(tail)
    lead = arr.shape[: arr.ndim - k]
    if arr.ndim < k or arr.shape[arr.ndim - k:] != tail:
        raise ValueError(f"{name}: expected trailing shape {shape_str(tail)}, got {shape_str(arr.shape)}")
    if allow_shared and lead == ():
        return arr, "shared"
    if not layout.batch:
        if lead == (layout.n,):
            return arr, "concat"
        want = [(layout.n, *tail)] + ([tail] if allow_shared else [])
    elif layout.n is None:
        if lead == (layout.total,):
            return arr, "concat"
        want = [(layout.total, *tail)] + ([tail] if allow_shared else [])
    else:
        if lead == (layout.n_scans, layout.n):
            return arr.reshape((layout.total, *tail)), "concat"
        if lead == (layout.n,):
            return arr, "map"
        want = [(layout.n_scans, layout.n, *tail), (layout.n, *tail)] + ([tail] if allow_shared else [])
    raise ValueError(f"{name}: expected shape {' or '.join(shape_str(w) for w in want)}, got {shape_str(arr.shape)}")


def _noise_model(layout: _Layout, cov: Any, cov_b: Any, cov_r: Any, cov_br: Any, sigma_b: Any, sigma_r: Any,
                 weights: Any) -> dict[str, Any]:
    """Keyword arguments describing the noise model for the core."""
    kw: dict[str, Any] = {}
    blocks = {"cov_b": cov_b, "cov_r": cov_r, "cov_br": cov_br}
    if cov is not None:
        given = [n for n, v in {**blocks, "sigma_b": sigma_b, "sigma_r": sigma_r}.items() if v is not None]
        if given:
            raise ValueError(f"cov: give either the full covariance or blocks/sigmas, not both (also got {', '.join(given)})")
        kw["cov"] = _per_point(cov, "cov", (6, 6), layout)
    else:
        sig = {}
        for name, s in (("sigma_b", sigma_b), ("sigma_r", sigma_r)):
            if s is not None:
                sig[name] = check_float(s, name, min=0.0)
        if cov_b is not None and "sigma_b" in sig:
            raise ValueError("sigma_b: give either cov_b or sigma_b, not both")
        if cov_r is not None and "sigma_r" in sig:
            raise ValueError("sigma_r: give either cov_r or sigma_r, not both")
        if all(v is None for v in blocks.values()):
            if not sig:
                # No noise model: unit isotropic noise on both sides (then the estimate is the
                # Kabsch solution and the covariance is relative to unit variances).
                sig = {"sigma_b": 1.0, "sigma_r": 1.0}
            if sig.get("sigma_b", 0.0) == 0.0 and sig.get("sigma_r", 0.0) == 0.0:
                raise ValueError("sigma_b, sigma_r: at least one must be positive")
            kw.update(sig)
        else:
            for name, v in blocks.items():
                if v is not None:
                    kw[name] = _per_point(v, name, (3, 3), layout)
            for side, name in (("b", "sigma_b"), ("r", "sigma_r")):
                if name in sig:
                    kw[f"cov_{side}"] = (np.eye(3) * sig[name] ** 2, "shared")
    if weights is not None:
        w, mode = _per_point(weights, "weights", (), layout, allow_shared=False)
        if not layout.batch and not (np.all(w > 0)):
            i = int(np.argmax(~(w > 0)))
            raise ValueError(f"weights: weights[{i}] = {w[i]} must be positive")
        kw["weights"] = (w, mode)
    return kw


def _options(max_iter: Any, tol: Any, init: Any, rotation0: Any, translation0: Any, compute_covariance: Any,
             variable_projection: Any, strict: Any) -> dict[str, Any]:
    kw: dict[str, Any] = {
        "max_iter": check_int(max_iter, "max_iter", min=1, max=10**9),
        "tol": check_float(tol, "tol", min=0.0, min_exclusive=True),
        "compute_covariance": check_bool(compute_covariance, "compute_covariance"),
        "variable_projection": check_bool(variable_projection, "variable_projection"),
        "strict": check_bool(strict, "strict"),
    }
    if isinstance(init, str):
        if init != "horn":
            raise ValueError(f"init: must be 'horn' or a (rotation0, translation0) pair; got {init!r}")
    elif isinstance(init, (tuple, list)) and len(init) == 2:
        if rotation0 is not None or translation0 is not None:
            raise ValueError("init: give the start either as init=(rotation0, translation0) or as rotation0=/translation0=")
        rotation0, translation0 = init
    else:
        raise TypeError(f"init: expected 'horn' or a (rotation0, translation0) pair, got {type(init).__name__}")
    if translation0 is not None and rotation0 is None:
        raise ValueError("translation0: needs rotation0 as well")
    if rotation0 is not None:
        a0 = as_float_array(rotation0, "rotation0", shape=(3, 3))
        err = float(np.abs(a0.T @ a0 - np.eye(3)).max())
        if err > 1e-6 or np.linalg.det(a0) <= 0:
            raise ValueError(f"rotation0: not a rotation matrix (max |AᵀA − I| = {err:.2e}, det = {np.linalg.det(a0):.4f})")
        kw["rotation0"] = a0
        if translation0 is not None:
            kw["translation0"] = as_float_array(translation0, "translation0", shape=(3,))
    return kw


def _batch_result(d: dict[str, Any]) -> PoseEstimateBatch:
    cost = d["cost"]
    return PoseEstimateBatch(
        rotation=d["rotation"],
        quaternion=d["quaternion"],
        translation=d["translation"],
        position=d["position"],
        covariance=d["covariance"],
        cost=cost,
        chi2=2.0 * cost,
        dof=d["dof"],
        iterations=d["iterations"],
        converged=d["converged"],
        status=d["status"],
        messages=tuple(d["messages"]),
    )


def estimate_pose(
    b: Any,
    r: Any,
    cov: Any = None,
    *,
    cov_b: Any = None,
    cov_r: Any = None,
    cov_br: Any = None,
    sigma_b: float | None = None,
    sigma_r: float | None = None,
    weights: Any = None,
    init: Any = "horn",
    rotation0: Any = None,
    translation0: Any = None,
    max_iter: int = 100,
    tol: float = 1e-10,
    compute_covariance: bool = True,
    variable_projection: bool = False,
    strict: bool = False,
) -> PoseEstimate:
    """Maximum-likelihood pose from noisy point correspondences (total least squares).

    Finds ``A ∈ SO(3)`` and ``t`` with ``b = A r + t`` when *both* point sets are noisy: the
    noise ``[Δbᵢ; Δrᵢ]`` of each correspondence is Gaussian with a full 6x6 covariance,
    body/reference cross-correlation included. The true points are eliminated exactly, which
    leaves ``J(A, t) = ½ Σ eᵢᵀ Sᵢ(A)⁻¹ eᵢ`` with ``eᵢ = b̃ᵢ − A r̃ᵢ − t`` and
    ``Sᵢ(A) = R_bb − A R_brᵀ − R_br Aᵀ + A R_rr Aᵀ``; it is minimised by Gauss-Newton on
    SO(3)×R³ from a weighted Horn/Kabsch start. A scan still unconverged after 10 iterations
    (large residuals: few, very noisy points, where Gauss-Newton converges slowly) takes
    Newton steps (Hessian from central differences of the exact gradient; where it is not
    positive definite, its negative curvature is flipped: saddle-free Newton). ("TLS" is
    *total* least squares here, not the *truncated* least squares of TEASER++; outliers are
    not handled, but ``chi2`` and the per-point residuals allow χ² gating.)

    Parameters
    ----------
    b : array_like, shape (N, 3)
        Body-frame (sensor) points, ``N >= 3``. Any real dtype, C or Fortran order, views;
        converted to C-contiguous float64 (a copy only when needed; float32 is upcast).
    r : array_like, shape (N, 3)
        Corresponding reference-frame (map) points.
    cov : array_like, shape (N, 6, 6) or (6, 6), optional
        Covariance of ``[Δbᵢ; Δrᵢ]`` (body first), per point or shared. Symmetric positive
        semi-definite; ``Sᵢ(A)`` must be positive definite.
    cov_b, cov_r, cov_br : array_like, shape (N, 3, 3) or (3, 3), optional
        The blocks ``R_bb``, ``R_rr`` and ``R_br = E[Δb Δrᵀ]`` instead of ``cov``. A missing block
        is zero (``cov_br`` zero: independent errors; ``cov_r`` zero: an exact map).
    sigma_b, sigma_r : float, optional
        Isotropic standard deviations (``σ² I`` blocks) instead of ``cov_b`` / ``cov_r``. With no
        noise model at all, ``sigma_b = sigma_r = 1`` is assumed: the estimate is then the
        Kabsch solution and the covariance is relative to unit variances.
    weights : array_like, shape (N,), optional
        Positive weights; ``wᵢ`` divides the covariance of point ``i``.
    init : "horn" or (rotation0, translation0)
        Start: weighted Horn/Kabsch (weights ``3 / tr(R_bb + R_rr)``), or a given pose.
    rotation0, translation0 : array_like, shape (3, 3) and (3,), optional
        A given start (the translation defaults to the weighted-centroid one). The cost is not
        convex in the rotation: a start far from the optimum (beyond about a radian) may end
        in another stationary point; the Horn start is within the basin for ordinary noise.
    max_iter : int
        Iteration limit (default 100).
    tol : float
        Convergence when the Gauss-Newton step ``[δθ; δt/ρ]`` has norm below ``tol`` (radians;
        ``ρ`` the RMS radius of the body points). Default ``1e-10``.
    compute_covariance : bool
        Return ``Cov([θ; δt])`` (default True; NaN otherwise).
    variable_projection : bool
        Re-solve ``t`` exactly after each rotation update (one more pass per iteration).
    strict : bool
        Raise :class:`~maleki_rs.exceptions.ConvergenceError` instead of returning an estimate
        with ``converged=False``.

    Returns
    -------
    PoseEstimate
        ``rotation``, ``quaternion`` (``[x, y, z, w]``, ``w >= 0``, scipy's convention),
        ``translation``, ``position`` (``−Aᵀ t``), ``covariance`` (6x6, of ``[θ; δt]`` with
        ``Â = exp([θ×]) A``), ``cost``, ``chi2 = 2 J ~ χ²(3N − 6)``, ``dof``, ``iterations``,
        ``converged``, ``status``.

    Raises
    ------
    ValueError
        Bad shapes, non-finite values, ``N < 3``, a covariance that is not symmetric positive
        semi-definite, bad options.
    TypeError
        Non-numeric input.
    maleki_rs.exceptions.DegenerateGeometryError
        Collinear or coincident points (a rotation is unobservable).
    maleki_rs.exceptions.NumericalError
        Some ``Sᵢ(A)`` is singular (a covariance that leaves a residual noise-free).
    maleki_rs.exceptions.ConvergenceError
        With ``strict=True``, when ``max_iter`` is reached.

    Notes
    -----
    For scipy users: ``Rotation.align_vectors(a, b)`` fits ``a ≈ C b``; ours corresponds to
    ``C = A`` with ``a = b̃ − b̄`` and ``b = r̃ − r̄``. Error conversions to the reference frame:
    ``φ = Aᵀθ`` and ``δp = −Aᵀ([t×]θ + δt)`` (see :func:`position_covariance`).

    Examples
    --------
    >>> import numpy as np
    >>> from maleki_rs.pose import estimate_pose, simulate_scans
    >>> s = simulate_scans(1, 20, scenario="S1", seed=0)
    >>> est = estimate_pose(s.b[0], s.r[0], s.cov[0])
    >>> bool(est.converged), est.dof
    (True, 54)
    """
    bb, rr, layout = _single_points(b, r)
    kw = _noise_model(layout, cov, cov_b, cov_r, cov_br, sigma_b, sigma_r, weights)
    kw.update(_options(max_iter, tol, init, rotation0, translation0, compute_covariance, variable_projection, strict))
    d = _core_pose.solve_batch(layout.offsets, bb, rr, "concat", raise_errors=True, **kw)
    cost = float(d["cost"][0])
    return PoseEstimate(
        rotation=d["rotation"][0],
        quaternion=d["quaternion"][0],
        translation=d["translation"][0],
        position=d["position"][0],
        covariance=d["covariance"][0],
        cost=cost,
        chi2=2.0 * cost,
        dof=int(d["dof"][0]),
        iterations=int(d["iterations"][0]),
        converged=bool(d["converged"][0]),
        status=int(d["status"][0]),
    )


def estimate_pose_batch(
    b: Any,
    r: Any,
    cov: Any = None,
    *,
    cov_b: Any = None,
    cov_r: Any = None,
    cov_br: Any = None,
    sigma_b: float | None = None,
    sigma_r: float | None = None,
    weights: Any = None,
    offsets: Any = None,
    init: Any = "horn",
    rotation0: Any = None,
    translation0: Any = None,
    max_iter: int = 100,
    tol: float = 1e-10,
    compute_covariance: bool = True,
    variable_projection: bool = False,
    strict: bool = False,
    progress: Any = False,
) -> PoseEstimateBatch:
    """:func:`estimate_pose` for many scans at once, in parallel on maleki_rs's thread pool.

    Each scan is solved exactly as by :func:`estimate_pose` (results are bitwise identical to
    a loop, for any thread count). A failed scan gets a ``status`` code and a message instead of
    aborting the batch, unless ``strict=True``.

    Parameters
    ----------
    b : array_like, shape (B, N, 3), or (total, 3) with ``offsets``
        Body-frame points of every scan.
    r : array_like, shape (B, N, 3) or (N, 3), or (total, 3) with ``offsets``
        Reference points; ``(N, 3)`` is a fixed map shared by all scans.
    cov : array_like, shape (B, N, 6, 6), (N, 6, 6), (6, 6), or (total, 6, 6) with ``offsets``
        Per point and scan, per map point (shared by the scans), or one for everything.
    cov_b, cov_r, cov_br : array_like, optional
        Blocks in the same layouts with trailing shape (3, 3).
    sigma_b, sigma_r : float, optional
        Isotropic standard deviations.
    weights : array_like, shape (B, N), (N,), or (total,) with ``offsets``, optional
    offsets : array_like of int, shape (B + 1,), optional
        Ragged batches: scan ``k`` is rows ``offsets[k]:offsets[k+1]`` of the concatenated arrays.
    init, rotation0, translation0, max_iter, tol, compute_covariance, variable_projection
        As for :func:`estimate_pose`; a given start applies to every scan.
    strict : bool
        Raise for the first scan that failed or did not converge (its index in the message).
    progress : bool or callable
        ``True`` shows a tqdm bar (when installed); a callable gets ``(done, total)``. Ctrl-C
        or an exception from the callback stops the batch.

    Returns
    -------
    PoseEstimateBatch
        Arrays with a leading ``B``; ``status`` per scan: 0 ok, 1 not converged, 2 degenerate
        (or a numerical failure), 3 bad input (NaN, ``N < 3``, a non-SPD covariance...), with
        ``messages`` saying why.

    Examples
    --------
    >>> from maleki_rs.pose import estimate_pose_batch, simulate_scans
    >>> s = simulate_scans(100, 20, scenario="S1", seed=1)
    >>> res = estimate_pose_batch(s.b, s.r, s.cov)
    >>> int(res.ok.sum())
    100
    """
    bb, rr, r_mode, layout = _batch_points(b, r, offsets)
    kw = _noise_model(layout, cov, cov_b, cov_r, cov_br, sigma_b, sigma_r, weights)
    kw.update(_options(max_iter, tol, init, rotation0, translation0, compute_covariance, variable_projection, strict))
    with reporter(progress, "pose") as rep:
        d = _core_pose.solve_batch(layout.offsets, bb, rr, r_mode, raise_errors=kw["strict"],
                                   progress=rep.callback, **kw)
    return _batch_result(d)


def absolute_orientation(b: Any, r: Any, weights: Any = None) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Weighted Kabsch/Horn (no scale): the ``(A, t)`` minimising ``Σ wᵢ |bᵢ − A rᵢ − t|²``.

    The baseline that ignores the noise structure: the q-method eigenvector of Horn's 4x4
    matrix (``det A = +1`` always).

    Parameters
    ----------
    b, r : array_like, shape (N, 3)
        Body and reference points, ``N >= 3``.
    weights : array_like, shape (N,), optional
        Positive weights (default 1).

    Returns
    -------
    rotation : ndarray, shape (3, 3)
    translation : ndarray, shape (3,)

    Raises
    ------
    ValueError
        Bad input.
    maleki_rs.exceptions.DegenerateGeometryError
        Collinear or coincident points.
    """
    bb, rr, layout = _single_points(b, r)
    kw = {}
    if weights is not None:
        kw["weights"] = _per_point(weights, "weights", (), layout, allow_shared=False)
    d = _core_pose.absolute_orientation_batch(layout.offsets, bb, rr, "concat", raise_errors=True, **kw)
    return d["rotation"][0], d["translation"][0]


def absolute_orientation_batch(
    b: Any, r: Any, weights: Any = None, *, offsets: Any = None, strict: bool = False
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.int8]]:
    """:func:`absolute_orientation` for a batch (layouts as in :func:`estimate_pose_batch`).

    Returns
    -------
    rotation : ndarray, shape (B, 3, 3)
    translation : ndarray, shape (B, 3)
    status : ndarray of int8, shape (B,)
        0 ok, 2 degenerate, 3 bad input (NaN rows for the failed scans); ``strict=True``
        raises for the first failed scan instead.
    """
    bb, rr, r_mode, layout = _batch_points(b, r, offsets)
    kw = {}
    if weights is not None:
        kw["weights"] = _per_point(weights, "weights", (), layout, allow_shared=False)
    d = _core_pose.absolute_orientation_batch(layout.offsets, bb, rr, r_mode,
                                              raise_errors=check_bool(strict, "strict"), **kw)
    return d["rotation"], d["translation"], d["status"]


def crlb(
    rotation: Any,
    translation: Any,
    r_true: Any,
    cov: Any = None,
    *,
    cov_b: Any = None,
    cov_r: Any = None,
    cov_br: Any = None,
    sigma_b: float | None = None,
    sigma_r: float | None = None,
    weights: Any = None,
    offsets: Any = None,
) -> NDArray[np.float64]:
    """Cramér-Rao lower bound on ``Cov([θ; δt])``.

    ``P = (Σ Hᵢᵀ Sᵢ(A)⁻¹ Hᵢ)⁻¹`` with ``Hᵢ = [[A rᵢ ×], −I]`` at the true rotation and true
    reference points: the Schur complement on the pose of the Fisher information of all
    unknowns (pose and true points). The TLS estimate attains it to first order.

    Parameters
    ----------
    rotation : array_like, shape (3, 3) or (B, 3, 3)
        True attitude(s).
    translation : array_like, shape (3,) or (B, 3)
        True translation(s); checked but not used (the bound does not depend on it).
    r_true : array_like, shape (N, 3), (B, N, 3), or (total, 3) with ``offsets``
        True reference points.
    cov, cov_b, cov_r, cov_br, sigma_b, sigma_r, weights
        Noise model, as for :func:`estimate_pose` / :func:`estimate_pose_batch`.
    offsets : array_like of int, shape (B + 1,), optional
        Ragged batches.

    Returns
    -------
    ndarray, shape (6, 6) or (B, 6, 6)
        One bound per scan (a single one when ``rotation`` is (3, 3) and ``r_true`` (N, 3)).

    Raises
    ------
    ValueError, maleki_rs.exceptions.DegenerateGeometryError
        Bad input or an unobservable pose (for the first bad scan).
    """
    rot = as_float_array(rotation, "rotation")
    if rot.shape[-2:] != (3, 3) or rot.ndim not in (2, 3):
        raise ValueError(f"rotation: expected shape (3, 3) or (B, 3, 3), got {shape_str(rot.shape)}")
    tr = as_float_array(translation, "translation")
    if tr.shape != rot.shape[:-2] + (3,):
        raise ValueError(f"translation: expected shape {shape_str(rot.shape[:-2] + (3,))}, got {shape_str(tr.shape)}")
    rt = as_float_array(r_true, "r_true")
    single = rot.ndim == 2 and rt.ndim == 2 and offsets is None
    if single:
        _, rt, layout = _single_points(rt, rt, names=("r_true", "r_true"))
        r_mode = "concat"
    else:
        _, rt, r_mode, layout = _batch_points(rt if offsets is not None else
                                              (rt if rt.ndim == 3 else np.broadcast_to(rt, (len(rot),) + rt.shape)),
                                              rt, offsets)
        if rot.ndim == 3 and rot.shape[0] != layout.n_scans:
            raise ValueError(f"rotation: has {rot.shape[0]} matrices for {layout.n_scans} scans")
        if not np.isfinite(rt).all():
            raise ValueError("r_true: contains a non-finite value")
        counts = np.diff(layout.offsets.astype(np.int64))
        if (counts < 3).any():
            k = int(np.argmax(counts < 3))
            raise ValueError(f"scan {k}: r_true: needs at least 3 correspondences, got {int(counts[k])}")
    kw = _noise_model(layout, cov, cov_b, cov_r, cov_br, sigma_b, sigma_r, weights)
    out = _core_pose.crlb_batch(layout.offsets, rt, r_mode, rot.reshape(-1, 3, 3), **kw)
    return out[0] if single else out
