"""Bad input everywhere gives a clear exception or status naming the problem, never a panic."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from maleki_rs.exceptions import MalekiError
from maleki_rs.pose import (
    absolute_orientation,
    absolute_orientation_batch,
    crlb,
    estimate_pose,
    estimate_pose_batch,
    nees,
    pose_error,
    simulate_scans,
)

from ._helpers import random_cov6, random_rotation

ACCEPTED = (ValueError, TypeError, MalekiError)


def call_safely(fn, *args, **kwargs):
    """Runs ``fn``; a raised exception must be one of ACCEPTED (a pyo3 PanicException derives
    from BaseException, so it would escape any ``except Exception``)."""
    try:
        return fn(*args, **kwargs)
    except ACCEPTED as exc:
        assert str(exc), f"{type(exc).__name__} without a message"
        return exc
    except BaseException as exc:  # noqa: BLE001
        pytest.fail(f"{type(exc).__module__}.{type(exc).__name__} escaped: {exc}")


@pytest.fixture(scope="module")
def good():
    rng = np.random.default_rng(0)
    a = random_rotation(rng)
    r = rng.uniform(-5, 5, size=(6, 3))
    b = r @ a.T + 1.0
    cov = random_cov6(rng, 6)
    return b, r, cov, a


# Specific inputs with the message they must give --------------------------------------------

@pytest.mark.parametrize(
    "kwargs, exc, msg",
    [
        ({"b": np.zeros((6, 2))}, ValueError, r"b: expected shape \(\*, 3\)"),
        ({"r": np.zeros((5, 3))}, ValueError, "r: has 5 points but b has 6"),
        ({"b": np.zeros((2, 3)), "r": np.zeros((2, 3)), "cov": None}, ValueError, "at least 3"),
        ({"b": np.array([["a"] * 3] * 6)}, TypeError, "b: expected a real numeric array"),
        ({"b": np.full((6, 3), 1j)}, TypeError, "b: expected a real numeric array"),
        ({"b": None}, TypeError, "b: expected an array"),
        ({"b": np.full((6, 3), np.inf)}, ValueError, "b: contains a non-finite value"),
        ({"cov": np.zeros((6, 6, 5))}, ValueError, r"cov: expected trailing shape \(6, 6\)"),
        ({"cov": np.zeros((4, 6, 6))}, ValueError, r"cov: expected shape \(6, 6, 6\) or \(6, 6\)"),
        ({"cov": np.full((6, 6), np.nan)}, ValueError, "cov: contains a non-finite value"),
        ({"cov": -np.eye(6)}, ValueError, "cov: is not positive semi-definite"),
        ({"cov": np.zeros((6, 6))}, ValueError, "cov: is zero"),
        ({"cov": np.triu(np.ones((6, 6))) + 6 * np.eye(6)}, ValueError, "not symmetric"),
        ({"cov": None, "sigma_b": -1.0}, ValueError, "sigma_b: must be >= 0"),
        ({"cov": None, "sigma_b": 0.0, "sigma_r": 0.0}, ValueError, "at least one must be positive"),
        ({"cov": None, "sigma_b": "x"}, TypeError, "sigma_b: expected a real number"),
        ({"sigma_b": 0.1}, ValueError, "either the full covariance or blocks"),
        ({"cov": None, "cov_b": np.eye(3), "sigma_b": 0.1}, ValueError, "either cov_b or sigma_b"),
        ({"cov": None, "cov_b": np.eye(2)}, ValueError, r"cov_b: expected trailing shape \(3, 3\)"),
        ({"weights": np.ones(5)}, ValueError, r"weights: expected shape \(6,\)"),
        ({"weights": np.array([1, 1, 0, 1, 1, 1.0])}, ValueError, r"weights\[2\] = 0.0 must be positive"),
        ({"max_iter": 0}, ValueError, "max_iter: must be >= 1"),
        ({"max_iter": 2.5}, TypeError, "max_iter: expected an integer"),
        ({"tol": -1.0}, ValueError, "tol: must be > 0"),
        ({"tol": float("nan")}, ValueError, "tol: must be finite"),
        ({"strict": "yes"}, TypeError, "strict: expected True or False"),
        ({"init": "svd"}, ValueError, "init: must be 'horn'"),
        ({"init": 3}, TypeError, "init: expected 'horn'"),
        ({"rotation0": 2 * np.eye(3)}, ValueError, "rotation0: not a rotation matrix"),
        ({"rotation0": np.diag([1.0, 1, -1])}, ValueError, "rotation0: not a rotation matrix"),
        ({"translation0": np.zeros(3)}, ValueError, "translation0: needs rotation0"),
        ({"rotation0": np.eye(3), "translation0": np.zeros(2)}, ValueError, r"translation0: expected shape \(3,\)"),
    ],
)
def test_estimate_pose_rejects(good, kwargs, exc, msg):
    b, r, cov, _ = good
    args = {"b": b, "r": r, "cov": cov, **kwargs}
    with pytest.raises(exc, match=msg):
        estimate_pose(args.pop("b"), args.pop("r"), args.pop("cov"), **args)


def test_collinear_and_psd_models(good):
    b, r, cov, _ = good
    line = np.outer(np.arange(6.0), [1, 0, 0])
    with pytest.raises(MalekiError, match="collinear"):
        estimate_pose(line, line, cov)
    # An exact map (R_rr = 0) is fine; a model whose residual covariance S is singular is not.
    est = estimate_pose(b, r, cov_b=0.01 * np.eye(3))
    assert est.converged
    with pytest.raises(MalekiError, match="not positive definite"):
        estimate_pose(b, r, cov_b=np.diag([0.01, 0.01, 0.0]))


def test_batch_rejects_layout_errors_and_reports_scan_errors(good):
    b, r, cov, _ = good
    bb = np.stack([b, b])
    with pytest.raises(ValueError, match=r"b: expected shape \(B, N, 3\)"):
        estimate_pose_batch(b, r, cov)
    with pytest.raises(ValueError, match=r"r: expected shape"):
        estimate_pose_batch(bb, r[:4], cov)
    with pytest.raises(ValueError, match=r"cov: expected shape \(2, 6, 6, 6\) or \(6, 6, 6\)"):
        estimate_pose_batch(bb, r, np.zeros((3, 6, 6, 6)))
    with pytest.raises(ValueError, match="offsets"):
        estimate_pose_batch(b, r, cov, offsets=[0, 4, 3, 6])
    with pytest.raises(ValueError, match="offsets"):
        estimate_pose_batch(b, r, cov, offsets=[1, 6])
    with pytest.raises(ValueError, match="offsets"):
        estimate_pose_batch(b, r, cov, offsets=[0, 5])
    with pytest.raises(TypeError, match="offsets"):
        estimate_pose_batch(b, r, cov, offsets=["a", "b"])
    bad = bb.copy()
    bad[1, 0, 0] = np.nan
    res = estimate_pose_batch(bad, r, cov)
    assert res.status.tolist() == [0, 3] and "not finite" in res.messages[1]
    w = np.ones((2, 6))
    w[0, 2] = -1
    res = estimate_pose_batch(bb, r, cov, weights=w)
    assert res.status.tolist() == [3, 0] and "weights[2]" in res.messages[0]


def test_other_functions_reject(good):
    b, r, cov, a = good
    with pytest.raises(ValueError, match="at least 3"):
        absolute_orientation(b[:2], r[:2])
    with pytest.raises(ValueError, match="weights"):
        absolute_orientation(b, r, weights=np.zeros(6))
    with pytest.raises(ValueError, match=r"rotation: expected shape"):
        crlb(np.eye(4), np.zeros(3), r, cov)
    with pytest.raises(ValueError, match="not a rotation matrix"):
        crlb(2 * np.eye(3), np.zeros(3), r, cov)
    with pytest.raises(ValueError, match="translation"):
        crlb(a, np.zeros(2), r, cov)
    with pytest.raises(ValueError, match="rotation: has 3 matrices for 2 scans"):
        crlb(np.stack([a] * 3), np.zeros((3, 3)), np.stack([r, r]), cov)
    with pytest.raises(ValueError, match="rotation_hat"):
        pose_error(np.eye(2), np.zeros(3), np.eye(3), np.zeros(3))
    with pytest.raises(ValueError, match="errors"):
        nees(np.float64(1.0), np.eye(6))
    with pytest.raises(ValueError, match="positive definite"):
        nees(np.ones(6), np.zeros((6, 6)))
    with pytest.raises(ValueError, match="n_scans"):
        simulate_scans(0)
    with pytest.raises(ValueError, match="n_points"):
        simulate_scans(2, 2)
    with pytest.raises(TypeError, match="scenario"):
        simulate_scans(2, scenario=3)
    with pytest.raises(ValueError, match="rho"):
        simulate_scans(2, scenario={"rho": 1.5})
    _, _, st_ = absolute_orientation_batch(np.stack([b, np.full_like(b, np.nan)]), r)
    assert st_.tolist() == [0, 3]


# A randomised sweep ---------------------------------------------------------------------------

_dtypes = st.sampled_from([np.float64, np.float32, np.int64, np.int8, np.bool_, np.complex128, np.uint8])
_shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=7)
_values = st.one_of(
    st.just(np.nan), st.just(np.inf), st.just(-np.inf), st.floats(-1e300, 1e300), st.just(0.0)
)


@st.composite
def arrays(draw):
    dtype = draw(_dtypes)
    shape = draw(_shapes)
    if np.dtype(dtype).kind == "f":
        x = draw(hnp.arrays(np.float64, shape, elements=_values))
        with np.errstate(over="ignore"):
            return x.astype(dtype)
    return draw(hnp.arrays(dtype, shape))


_others = st.one_of(arrays(), st.none(), st.just("text"), st.integers(-3, 3), st.lists(st.floats(), max_size=4))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(slot=st.sampled_from(["b", "r", "cov", "cov_b", "cov_r", "cov_br", "weights", "rotation0", "offsets"]),
       value=_others, batch=st.booleans())
def test_sweep_estimators_never_panic(good, slot, value, batch):
    b, r, cov, _ = good
    args = {"b": b, "r": r, "cov": cov}
    if slot in ("cov_b", "cov_r", "cov_br"):
        args["cov"] = None
    args[slot] = value
    b_, r_, cov_ = args.pop("b"), args.pop("r"), args.pop("cov")
    if batch:
        if slot != "offsets" and not isinstance(b_, np.ndarray) or (isinstance(b_, np.ndarray) and b_.ndim == 2):
            b_ = np.asarray([b_, b_]) if isinstance(b_, np.ndarray) else b_
        out = call_safely(estimate_pose_batch, b_, r_, cov_, **args)
        if not isinstance(out, BaseException):
            assert set(out.status.tolist()) <= {0, 1, 2, 3}
            assert len(out.messages) == len(out)
    else:
        args.pop("offsets", None)
        call_safely(estimate_pose, b_, r_, cov_, **args)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.sampled_from(["ao", "aob", "crlb", "pose_error", "nees"]), value=_others, pos=st.integers(0, 3))
def test_sweep_other_functions_never_panic(good, which, value, pos):
    b, r, cov, a = good
    if which == "ao":
        args = [b, r, None]
        args[pos % 3] = value
        call_safely(absolute_orientation, *args)
    elif which == "aob":
        args = [np.stack([b, b]), r, None]
        args[pos % 3] = value
        call_safely(absolute_orientation_batch, *args)
    elif which == "crlb":
        args = [a, np.zeros(3), r, cov]
        args[pos] = value
        call_safely(crlb, *args)
    elif which == "pose_error":
        args = [a, np.zeros(3), a, np.zeros(3)]
        args[pos] = value
        call_safely(pose_error, *args)
    else:
        args = [np.ones(6), np.eye(6)]
        args[pos % 2] = value
        call_safely(nees, *args)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(3, 12), scale=st.floats(1e-6, 1e6))
def test_random_valid_problems_solve_or_report(seed, n, scale):
    """Random valid problems over many scales: a converged estimate, or a documented error."""
    rng = np.random.default_rng(seed)
    a = random_rotation(rng)
    r = rng.uniform(-1, 1, size=(n, 3)) * scale
    cov = random_cov6(rng, n, sigma=0.01 * scale, rho=0.5)
    b = r @ a.T + rng.standard_normal(3) * scale
    out = call_safely(estimate_pose, b, r, cov)
    if not isinstance(out, BaseException):
        assert out.converged
        np.testing.assert_allclose(out.rotation, a, atol=1e-8)
