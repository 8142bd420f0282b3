"""The fused dot/norm reduction: CPU parts always, the kernel against float64 NumPy on a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from maleki_rs import _gpu
from maleki_rs._gpu.reductions import chunk_table, dot_norms, dot_norms_reference
from maleki_rs.exceptions import GPUUnavailableError


def test_chunk_table_covers_each_segment_exactly():
    off = np.array([0, 5, 5, 12, 40])
    begin, end, first = chunk_table(off, chunk=4)
    for t in range(off.size - 1):
        cs = range(first[t], first[t + 1])
        covered = np.concatenate([np.arange(begin[c], end[c]) for c in cs]) if len(cs) else np.zeros(0)
        np.testing.assert_array_equal(covered, np.arange(off[t], off[t + 1]))
        assert all(end[c] - begin[c] <= 4 for c in cs)


def test_reference_matches_closed_form():
    a = np.array([1.0, 2.0, 2.0, 0.0])
    b = np.array([0.0, 1.0, 0.0, 3.0])
    np.testing.assert_array_equal(dot_norms_reference(a, b, [0, 3, 4]), [[2.0, 9.0, 1.0], [0.0, 0.0, 9.0]])
    with pytest.raises(ValueError, match="offsets"):
        dot_norms_reference(a, b, [0, 5])


def test_without_gpu_raises_clear_error():
    if _gpu.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(GPUUnavailableError):
        dot_norms(np.zeros(3), np.zeros(3))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernel_matches_float64_reference(cp, rng, dtype):
    n = 1_000_003
    a = rng.standard_normal(n).astype(dtype)
    b = rng.standard_normal(n).astype(dtype)
    off = np.array([0, 17, 17, 70_000, 500_001, n])
    got = cp.asnumpy(dot_norms(cp.asarray(a), cp.asarray(b), off, chunk=4096))
    want = dot_norms_reference(a, b, off)
    # Both sum exact float64 products of the inputs; only the summation order differs.
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9)
    again = cp.asnumpy(dot_norms(cp.asarray(a), cp.asarray(b), off, chunk=4096))
    np.testing.assert_array_equal(got, again)
