"""The caches PackedWeights builds on first use: counted by ``cache_nbytes``, released by
``clear_cache`` without changing any result, also while other threads are calling (which
once deadlocked: concurrent first calls on the same weights, see ``packed::fill``)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from maleki_rs import msgemm as mg


def _weights(fmt: str = "int4", m: int = 200, k: int = 512, g: int = 128):
    rng = np.random.default_rng(7)
    pw = mg.quantize(rng.standard_normal((m, k), dtype=np.float32), fmt, g)
    x = rng.standard_normal(k, dtype=np.float32)
    return pw, x


def test_fresh_weights_hold_no_cache_and_a_call_builds_its_layout():
    pw, x = _weights()
    assert pw.cache_nbytes == 0
    mg.msgemm(pw, x)
    m, k = pw.shape
    # At least the kernel's index layout: one byte per row (padded to 64) and pair of inputs
    # for int4 at its natural depth, whichever kernel ran (folded or not).
    rows = -(-m // 64) * 64
    assert pw.cache_nbytes >= rows * k // 2


def test_pickling_leaves_no_copy_behind():
    import pickle

    pw, x = _weights()
    back = pickle.loads(pickle.dumps(pw))
    assert pw.cache_nbytes == 0 and back.cache_nbytes == 0
    assert mg.msgemm(back, x).tobytes() == mg.msgemm(pw, x).tobytes()


def test_clear_cache_without_caches_changes_nothing():
    pw, x = _weights()
    assert pw.clear_cache().cache_nbytes == 0
    same, _ = _weights()  # the same seed: the same weights, never cleared
    assert mg.msgemm(pw, x).tobytes() == mg.msgemm(same, x).tobytes()


def test_property_arrays_are_counted_and_released():
    pw, _ = _weights()
    packed = pw.packed
    assert pw.cache_nbytes == packed.nbytes
    pw.clear_cache()
    assert pw.cache_nbytes == 0
    # Arrays handed out before stay valid and equal to the weights' own.
    np.testing.assert_array_equal(packed, pw.packed)


@pytest.mark.parametrize("fmt, g, opts", [
    ("int4", 128, {}),
    ("uint4", 64, {"table": "i16"}),
    ("int2", 64, {"depth": 2, "table": "f32"}),
    ("ternary", 128, {"backend": "scalar"}),
])
def test_clear_cache_changes_no_result(fmt, g, opts):
    pw, x = _weights(fmt, g=g)
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((pw.shape[1], 3), dtype=np.float32)
    before = (mg.msgemm(pw, x, **opts), mg.msgemm(pw, xs, **opts), pw.dequantize())
    assert pw.cache_nbytes > 0
    assert pw.clear_cache() is pw
    assert pw.cache_nbytes == 0
    after = (mg.msgemm(pw, x, **opts), mg.msgemm(pw, xs, **opts), pw.dequantize())
    for a, b in zip(before, after):
        assert a.tobytes() == b.tobytes()


def test_clear_cache_while_other_threads_call():
    pw, x = _weights(m=1000, k=1024)
    want = mg.msgemm(pw, x).tobytes()
    errors: list[str] = []
    stop = threading.Event()

    def caller():
        try:
            while not stop.is_set():
                if mg.msgemm(pw, x).tobytes() != want:
                    errors.append("result changed")
                    return
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(repr(e))

    def reader():
        try:
            while not stop.is_set():
                # The arrays the properties cache, read while another thread clears them.
                if pw.scales.shape != (1000, 8) or pw.cache_nbytes < 0:
                    errors.append("bad property")
                    return
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(repr(e))

    # Daemon threads joined with a time limit: a hang fails the test instead of the run.
    threads = [threading.Thread(target=f, daemon=True) for f in (caller, caller, caller, reader)]
    for t in threads:
        t.start()
    try:
        for _ in range(300):
            pw.clear_cache()
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a call hung"
    assert not errors
    assert mg.msgemm(pw, x).tobytes() == want
