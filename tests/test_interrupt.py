"""Long calls stop on Ctrl-C and when a progress callback raises (the foundation's
progress/cancel mechanism, exercised through a large pose batch)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from maleki_rs import pose

CHILD = r"""
import signal
import numpy as np
from maleki_rs import pose
# A shell that starts us in the background without job control hands down SIGINT ignored,
# and Python then keeps it ignored: install the usual handler (the test is about ours).
signal.signal(signal.SIGINT, signal.default_int_handler)
rng = np.random.default_rng(0)
B, N = 400_000, 20
r = rng.uniform(-10, 10, (N, 3))
q = np.linalg.qr(rng.standard_normal((6, 6)))[0]
cov = q @ np.diag([1.0, 2, 3, 4, 5, 6]) @ q.T * 1e-3
b = r[None] + rng.standard_normal((B, N, 3)) * 0.05
print("start", flush=True)
pose.estimate_pose_batch(b, r, cov)
print("finished", flush=True)
"""


def _interrupted(child: str) -> tuple[int, str, str]:
    """Runs ``child`` in a fresh interpreter, sends it SIGINT 0.3 s after it prints "start",
    and returns its exit status, stdout and stderr."""
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "start"
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)  # a hang guard, not a timing assertion
    finally:
        proc.kill()
    return proc.returncode, out, err


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_stops_a_long_batch():
    rc, out, err = _interrupted(CHILD)
    assert "finished" not in out, "the batch ran to the end: Ctrl-C was not seen"
    assert rc != 0
    assert "KeyboardInterrupt" in err


def test_exception_from_progress_callback_propagates():
    rng = np.random.default_rng(1)
    r = rng.uniform(-10, 10, (20, 3))
    b = r[None] + rng.standard_normal((200_000, 20, 3)) * 0.05
    calls = []

    class Stop(Exception):
        pass

    def progress(done, total):
        calls.append((done, total))
        raise Stop

    with pytest.raises(Stop):
        pose.estimate_pose_batch(b, r, sigma_b=0.05, sigma_r=0.05, progress=progress)
    assert calls and calls[0][1] == 200_000


BASELINE_CHILD = r"""
import signal
from maleki_rs import tessel
signal.signal(signal.SIGINT, signal.default_int_handler)
p = tessel.premise("mshape", 4)
print("start", flush=True)
tessel.baseline("1f1b", p, 1_600_000)  # the list-scheduling greedy: seconds
print("finished", flush=True)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_stops_a_long_baseline_without_a_panic():
    # Stop 34: the baseline ignored Ctrl-C, and the pending interrupt then made the numpy
    # conversion of its result panic (PanicException) instead of raising KeyboardInterrupt.
    rc, out, err = _interrupted(BASELINE_CHILD)
    assert rc != 0 and "finished" not in out, "the baseline ran to the end: Ctrl-C was not seen"
    assert "KeyboardInterrupt" in err and "panicked" not in err and "PanicException" not in err, err[-2000:]
