"""Stubs of ``maleki_rs._core.pose`` (private: use :mod:`maleki_rs.pose`).

Every function takes the canonical batch layout: concatenated ``(T, 3)`` float64 point arrays,
``offsets`` (uint64, ``B + 1``), and per-point arrays as ``(array, mode)`` pairs where mode is
``"concat"``, ``"map"`` or ``"shared"``.
"""

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

_Spec = tuple[NDArray[np.float64], str]

def solve_batch(
    offsets: NDArray[np.uint64],
    b: NDArray[np.float64],
    r: NDArray[np.float64],
    r_mode: str,
    *,
    cov: _Spec | None = None,
    cov_b: _Spec | None = None,
    cov_br: _Spec | None = None,
    cov_r: _Spec | None = None,
    sigma_b: float | None = None,
    sigma_r: float | None = None,
    weights: _Spec | None = None,
    max_iter: int = 100,
    tol: float = 1e-10,
    rotation0: NDArray[np.float64] | None = None,
    translation0: NDArray[np.float64] | None = None,
    compute_covariance: bool = True,
    variable_projection: bool = False,
    strict: bool = False,
    raise_errors: bool = False,
    progress: Callable[[int, int], Any] | None = None,
) -> dict[str, Any]: ...
def absolute_orientation_batch(
    offsets: NDArray[np.uint64],
    b: NDArray[np.float64],
    r: NDArray[np.float64],
    r_mode: str,
    weights: _Spec | None = None,
    raise_errors: bool = False,
    progress: Callable[[int, int], Any] | None = None,
) -> dict[str, Any]: ...
def crlb_batch(
    offsets: NDArray[np.uint64],
    r: NDArray[np.float64],
    r_mode: str,
    rotation: NDArray[np.float64],
    *,
    cov: _Spec | None = None,
    cov_b: _Spec | None = None,
    cov_br: _Spec | None = None,
    cov_r: _Spec | None = None,
    sigma_b: float | None = None,
    sigma_r: float | None = None,
    weights: _Spec | None = None,
    progress: Callable[[int, int], Any] | None = None,
) -> NDArray[np.float64]: ...
def evaluate(
    b: NDArray[np.float64],
    r: NDArray[np.float64],
    rotation: NDArray[np.float64],
    translation: NDArray[np.float64],
    *,
    cov: _Spec | None = None,
    cov_b: _Spec | None = None,
    cov_br: _Spec | None = None,
    cov_r: _Spec | None = None,
    sigma_b: float | None = None,
    sigma_r: float | None = None,
    weights: _Spec | None = None,
) -> tuple[float, NDArray[np.float64], NDArray[np.float64]]: ...
