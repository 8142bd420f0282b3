"""The ``cp`` fixture: every device oracle runs twice, on a CUDA device through CuPy (marked
``gpu``: skipped without one) and on the CPU simulator of ``cudasim.h`` (skipped without a C++
compiler), which runs the same kernel sources through a fake CuPy."""

from __future__ import annotations

import pytest

from maleki_rs._gpu import reductions
from maleki_rs.msgemm import cuda as mgc

from . import cudasim


@pytest.fixture(params=[pytest.param("device", marks=pytest.mark.gpu), "sim"])
def cp(request, monkeypatch):
    """The ``cupy`` module the kernel drivers see: the real one, or the simulator's."""
    if request.param == "device":
        from maleki_rs import _gpu

        return _gpu.require()
    if cudasim.compiler() is None:
        pytest.skip("cudasim needs a C++ compiler (g++ or $CXX)")
    for mod in (mgc, reductions):
        monkeypatch.setattr(mod, "require", lambda: cudasim.cupy)
    monkeypatch.setattr(mgc, "get_module", cudasim.get_module)
    monkeypatch.setattr(reductions, "get_function", cudasim.get_function)
    mgc._sm_count.cache_clear()
    yield cudasim.cupy
    mgc._sm_count.cache_clear()
