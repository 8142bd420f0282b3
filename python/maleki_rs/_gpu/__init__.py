"""GPU plumbing shared by the subsystems with CUDA kernels (msgemm, adasum).

CuPy is optional (extra ``gpu``) and is never imported when ``maleki_rs`` is imported:
:func:`is_available` imports it on first call only. GPU entry points call :func:`require`,
which raises :class:`maleki_rs.exceptions.GPUUnavailableError` with the reason.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

from ..exceptions import GPUUnavailableError

__all__ = ["is_available", "require", "describe", "unavailable_reason"]


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """``None`` when CuPy and a CUDA device are usable, else why not (cached)."""
    if importlib.util.find_spec("cupy") is None:
        return "CuPy is not installed (pip install 'maleki_rs[gpu]')"
    try:
        import cupy

        if not cupy.cuda.is_available():
            return "CuPy found no CUDA device"
        cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # any driver/runtime failure means "no GPU here"
        return f"CUDA is not usable: {type(exc).__name__}: {exc}"
    return None


def is_available() -> bool:
    """True when CuPy imports and a CUDA device is present (cached)."""
    return unavailable_reason() is None


def require() -> Any:
    """Returns the ``cupy`` module, or raises :class:`GPUUnavailableError`."""
    reason = unavailable_reason()
    if reason is not None:
        raise GPUUnavailableError(reason)
    import cupy

    return cupy


def describe() -> str:
    """One line: the device name, or why there is none. Never raises."""
    reason = unavailable_reason()
    if reason is not None:
        return f"not available ({reason})"
    import cupy

    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    return f"{name} (sm_{props['major']}{props['minor']}, cupy {cupy.__version__})"
