"""Fused dot product and squared norms on the GPU (the reduction adasum is built on).

``dot_norms(a, b, offsets)`` returns, for each segment ``t`` of the flat vectors ``a`` and
``b``, the float64 triple ``(a.b, |a|^2, |b|^2)`` in one pass over the data, with a fixed
reduction order (bitwise reproducible). :func:`dot_norms_reference` is the float64 NumPy
oracle it is tested against.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import require
from .loader import get_function

__all__ = ["dot_norms", "dot_norms_reference", "chunk_table"]

_SOURCE = "adasum/dot_norms.cu"
_THREADS = 256


def _check_offsets(offsets: Any, n: int) -> np.ndarray:
    from .._util.validate import as_int_array

    off = as_int_array(offsets, "offsets", ndim=1)
    if off.size < 2 or off[0] != 0 or off[-1] != n or np.any(np.diff(off) < 0):
        raise ValueError(f"offsets: expected a non-decreasing array from 0 to {n} with at least 2 entries")
    return off


def chunk_table(offsets: np.ndarray, chunk: int = 1 << 16) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Splits segments into chunks of at most ``chunk`` elements that never cross a segment.

    Returns ``(begin, end, first_chunk)``: chunk ranges and, per segment, the index of its first
    chunk (``first_chunk[t+1] - first_chunk[t]`` chunks; an empty segment has none).
    """
    begins, ends, first = [], [], [0]
    for lo, hi in zip(offsets[:-1], offsets[1:]):
        starts = np.arange(lo, hi, chunk, dtype=np.int64)
        begins.append(starts)
        ends.append(np.minimum(starts + chunk, hi))
        first.append(first[-1] + starts.size)
    cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64))
    return cat(begins), cat(ends), np.asarray(first, dtype=np.int64)


def dot_norms_reference(a: Any, b: Any, offsets: Any = None) -> np.ndarray:
    """Float64 NumPy oracle: (T, 3) array of ``(a.b, |a|^2, |b|^2)`` per segment."""
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"a and b: expected equal lengths, got {a.size} and {b.size}")
    off = np.array([0, a.size]) if offsets is None else _check_offsets(offsets, a.size)
    out = np.empty((off.size - 1, 3))
    for t, (lo, hi) in enumerate(zip(off[:-1], off[1:])):
        x, y = a[lo:hi], b[lo:hi]
        out[t] = (x @ y, x @ x, y @ y)
    return out


def dot_norms(a: Any, b: Any, offsets: Any = None, *, chunk: int = 1 << 16) -> Any:
    """Per-segment ``(a.b, |a|^2, |b|^2)`` of two device vectors, accumulated in float64.

    Parameters
    ----------
    a, b : cupy.ndarray, shape (n,), float32 or float64 (same dtype)
        Flat device vectors (any array CuPy accepts; they are made contiguous).
    offsets : array_like of int, shape (T+1,), optional
        Segment boundaries ``0 = o_0 <= ... <= o_T = n``; default one segment.
    chunk : int
        Elements per thread block (a tuning knob; does not change the result's definition).

    Returns
    -------
    cupy.ndarray, shape (T, 3), float64

    Raises
    ------
    GPUUnavailableError
        Without CuPy or a CUDA device.
    """
    cp = require()
    a = cp.ascontiguousarray(cp.asarray(a)).ravel()
    b = cp.ascontiguousarray(cp.asarray(b)).ravel()
    if a.dtype != b.dtype or a.dtype not in (np.float32, np.float64):
        raise TypeError(f"a and b: expected the same dtype, float32 or float64; got {a.dtype} and {b.dtype}")
    if a.size != b.size:
        raise ValueError(f"a and b: expected equal lengths, got {a.size} and {b.size}")
    off = np.array([0, a.size], dtype=np.int64) if offsets is None else _check_offsets(offsets, a.size)
    begin, end, first = chunk_table(off, int(chunk))
    nseg = off.size - 1
    out = cp.zeros((nseg, 3), dtype=cp.float64)
    if begin.size == 0:
        return out
    partials = cp.empty((begin.size, 3), dtype=cp.float64)
    ctype = "float" if a.dtype == np.float32 else "double"
    k1 = get_function(_SOURCE, f"dotnorm_chunks<{ctype}>")
    k1((begin.size,), (_THREADS,), (a, b, cp.asarray(begin), cp.asarray(end), partials))
    k2 = get_function(_SOURCE, "dotnorm_finalize")
    k2(((nseg + 127) // 128,), (128,), (partials, cp.asarray(first), np.int64(nseg), out))
    return out
