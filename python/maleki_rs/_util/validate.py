"""Input validation shared by every public function.

Each helper names the argument, the expectation and what it got, and raises ``TypeError``
for a wrong kind of value and ``ValueError`` for a wrong value, so that no bad input ever
reaches the Rust core (where it could only become a less helpful error).
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "as_float_array",
    "as_int_array",
    "check_int",
    "check_float",
    "check_choice",
    "check_bool",
    "shape_str",
]


def shape_str(shape: Sequence[Any]) -> str:
    """``(N, 3)``-style text for an expected or actual shape (``None`` prints as ``*``)."""
    items = ["*" if s is None else str(s) for s in shape]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _reject_non_numeric(x: np.ndarray, name: str, kinds: str) -> None:
    if x.dtype.kind not in kinds:
        raise TypeError(f"{name}: expected a real numeric array, got dtype {x.dtype}")


def as_float_array(
    x: Any,
    name: str,
    *,
    shape: Sequence[int | None] | None = None,
    ndim: int | Sequence[int] | None = None,
    dtype: Any = np.float64,
    finite: bool = True,
    allow_empty: bool = False,
) -> np.ndarray:
    """Converts ``x`` to a C-contiguous, aligned float array (no copy when it already is one).

    Parameters
    ----------
    x : array_like
        Anything numpy accepts: lists, any dtype of real numbers, C or Fortran order, views.
    name : str
        The argument's name, used in error messages.
    shape : sequence of int or None, optional
        Expected shape; ``None`` entries match any length.
    ndim : int or sequence of int, optional
        Allowed numbers of dimensions (when ``shape`` is not given).
    dtype : numpy dtype
        Target float dtype (``float64`` by default; ints and smaller floats are upcast).
    finite : bool
        Reject NaN and infinity.
    allow_empty : bool
        Accept arrays with a zero-length axis.

    Raises
    ------
    TypeError
        Non-numeric, boolean or complex input.
    ValueError
        Wrong shape, empty, or non-finite values.
    """
    if x is None:
        raise TypeError(f"{name}: expected an array, got None")
    arr = np.asarray(x)
    if arr.dtype == object:
        try:
            arr = arr.astype(np.float64)
        except OverflowError:  # Python ints beyond float64's range
            raise ValueError(f"{name}: contains a value beyond float64's range") from None
        except (TypeError, ValueError):
            raise TypeError(f"{name}: expected a real numeric array, got objects") from None
    _reject_non_numeric(arr, name, "iuf")
    if shape is not None:
        ok = arr.ndim == len(shape) and all(s is None or s == g for s, g in zip(shape, arr.shape))
        if not ok:
            raise ValueError(f"{name}: expected shape {shape_str(shape)}, got {shape_str(arr.shape)}")
    elif ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if arr.ndim not in allowed:
            want = " or ".join(str(a) for a in allowed)
            raise ValueError(f"{name}: expected a {want}-dimensional array, got shape {shape_str(arr.shape)}")
    if not allow_empty and arr.size == 0:
        raise ValueError(f"{name}: expected a non-empty array, got shape {shape_str(arr.shape)}")
    out = np.require(arr, dtype, "CA")  # C order, aligned, native byte order; keeps 0-d arrays 0-d
    if finite and out.size and not np.isfinite(out).all():
        bad = np.argwhere(~np.isfinite(out))[0]
        raise ValueError(f"{name}: contains a non-finite value at index {tuple(int(i) for i in bad)}")
    return out


def as_int_array(
    x: Any,
    name: str,
    *,
    shape: Sequence[int | None] | None = None,
    ndim: int | Sequence[int] | None = None,
    dtype: Any = np.int64,
    allow_empty: bool = False,
) -> np.ndarray:
    """Converts ``x`` to a C-contiguous integer array; floats must hold integral values."""
    if x is None:
        raise TypeError(f"{name}: expected an integer array, got None")
    arr = np.asarray(x)
    if arr.dtype.kind == "f":
        if arr.size and not (np.isfinite(arr).all() and (arr == np.round(arr)).all()):
            raise ValueError(f"{name}: expected integer values")
    elif arr.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected an integer array, got dtype {arr.dtype}")
    if shape is not None:
        ok = arr.ndim == len(shape) and all(s is None or s == g for s, g in zip(shape, arr.shape))
        if not ok:
            raise ValueError(f"{name}: expected shape {shape_str(shape)}, got {shape_str(arr.shape)}")
    elif ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if arr.ndim not in allowed:
            want = " or ".join(str(a) for a in allowed)
            raise ValueError(f"{name}: expected a {want}-dimensional array, got shape {shape_str(arr.shape)}")
    if not allow_empty and arr.size == 0:
        raise ValueError(f"{name}: expected a non-empty array")
    info = np.iinfo(dtype)
    if arr.size and (arr.min() < info.min or arr.max() > info.max):
        raise ValueError(f"{name}: values must lie in [{info.min}, {info.max}]")
    return np.require(arr, dtype, "CA")


def check_int(value: Any, name: str, *, min: int | None = None, max: int | None = None) -> int:
    """Returns ``value`` as a Python int; rejects bools, floats and out-of-range values
    (without ``max`` / ``min``, values beyond 64-bit signed integers, which the core takes)."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected an integer, got bool {value!r}")
    if not isinstance(value, numbers.Integral):
        try:
            value = operator.index(value)
        except TypeError:
            raise TypeError(f"{name}: expected an integer, got {type(value).__name__} {value!r}") from None
    value = int(value)
    if min is not None and value < min:
        raise ValueError(f"{name}: must be >= {min}, got {value}")
    if max is not None and value > max:
        raise ValueError(f"{name}: must be <= {max}, got {value}")
    if max is None and value > _INT_MAX:
        raise ValueError(f"{name}: must be below 2**63, got {value}")
    if min is None and value < -_INT_MAX - 1:
        raise ValueError(f"{name}: must be >= -2**63, got {value}")
    return value


_INT_MAX = 2**63 - 1


def check_float(
    value: Any,
    name: str,
    *,
    min: float | None = None,
    max: float | None = None,
    min_exclusive: bool = False,
) -> float:
    """Returns ``value`` as a finite Python float within the given bounds."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {type(value).__name__} {value!r}")
    try:
        value = float(value)
    except OverflowError:  # an int (or Fraction) beyond float64's range
        raise ValueError(f"{name}: must be finite, got a value beyond float64's range") from None
    if not np.isfinite(value):
        raise ValueError(f"{name}: must be finite, got {value}")
    if min is not None and (value <= min if min_exclusive else value < min):
        raise ValueError(f"{name}: must be {'>' if min_exclusive else '>='} {min}, got {value}")
    if max is not None and value > max:
        raise ValueError(f"{name}: must be <= {max}, got {value}")
    return value


def check_choice(value: Any, name: str, choices: Sequence[Any]) -> Any:
    """Returns ``value`` when it is one of ``choices``; otherwise lists them in a ValueError."""
    if value not in choices:
        raise ValueError(f"{name}: must be one of {', '.join(repr(c) for c in choices)}; got {value!r}")
    return value


def check_bool(value: Any, name: str) -> bool:
    """Returns ``value`` when it is a bool (numpy bools included)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected True or False, got {type(value).__name__} {value!r}")
    return bool(value)
