"""GPU fixtures. ``cp``: every device oracle runs twice, on a CUDA device through CuPy (marked
``gpu``: skipped without one) and on the CPU simulator of ``cudasim.h`` (skipped without a C++
compiler), which runs the same kernel sources through a fake CuPy. ``sim_cp``: the simulator
only."""

from __future__ import annotations

import pytest

from maleki_rs._gpu import reductions
from maleki_rs.msgemm import cuda as mgc

from . import cudasim


def _use_simulator(monkeypatch):
    if cudasim.compiler() is None:
        pytest.skip("cudasim needs a C++ compiler (g++ or $CXX)")
    for mod in (mgc, reductions):
        monkeypatch.setattr(mod, "require", lambda: cudasim.cupy)
    monkeypatch.setattr(mgc, "get_module", cudasim.get_module)
    monkeypatch.setattr(reductions, "get_function", cudasim.get_function)
    mgc._sm_count.cache_clear()  # the fake device's count, not a real one's
    return cudasim.cupy


@pytest.fixture(params=[pytest.param("device", marks=pytest.mark.gpu), "sim"])
def cp(request, monkeypatch):
    """The ``cupy`` module the kernel drivers see: the real one, or the simulator's."""
    if request.param == "device":
        from maleki_rs import _gpu

        yield _gpu.require()  # a generator fixture: `return value` would give pytest nothing
        return
    yield _use_simulator(monkeypatch)
    mgc._sm_count.cache_clear()


@pytest.fixture
def sim_cp(monkeypatch):
    """The simulator's fake ``cupy``, patched into the kernel drivers."""
    yield _use_simulator(monkeypatch)
    mgc._sm_count.cache_clear()
