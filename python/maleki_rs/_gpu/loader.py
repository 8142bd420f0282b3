"""Finds and compiles the CUDA sources of maleki_rs with ``cupy.RawModule``.

Sources are looked up, in order, in ``$MALEKI_RS_CUDA_DIR``, the repository's ``cuda/`` when
running from a checkout (always the fresh sources), and the ``maleki_rs/_cuda/`` copy that
ships in the wheel. Compilation is lazy (at the first ``get_function``) and cached per
(file, names, options, device); CuPy's disk cache keys on the source text, so edited
kernels are never served stale.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from . import require
from .options import NVRTC_OPTIONS, include_options

__all__ = ["cuda_root", "source_path", "read_source", "get_module", "get_function"]

_PACKAGE = Path(__file__).resolve().parent.parent


def cuda_root() -> Path:
    """The directory holding the kernel tree (``msgemm/``, ``adasum/``, ``include/``)."""
    env = os.environ.get("MALEKI_RS_CUDA_DIR")
    candidates = [Path(env)] if env else []
    candidates += [_PACKAGE.parent.parent / "cuda", _PACKAGE / "_cuda"]
    for c in candidates:
        # A kernel tree has the shared headers; this rules out unrelated folders named cuda/.
        if (c / "include" / "maleki").is_dir():
            return c
    raise FileNotFoundError(
        "maleki_rs CUDA sources not found (looked in: " + ", ".join(str(c) for c in candidates) + ")"
    )


def source_path(relpath: str) -> Path:
    """Absolute path of a kernel file, e.g. ``source_path("adasum/dot_norms.cu")``."""
    path = cuda_root() / relpath
    if not path.is_file():
        raise FileNotFoundError(f"CUDA source {relpath!r} not found under {cuda_root()}")
    return path


def read_source(relpath: str) -> str:
    """The kernel source with a ``#line`` directive so compiler errors name the real file."""
    path = source_path(relpath)
    return f'#line 1 "{path}"\n' + path.read_text()


@functools.lru_cache(maxsize=64)
def _module(relpath: str, name_expressions: tuple[str, ...], options: tuple[str, ...], device: int) -> Any:
    cupy = require()
    root = str(cuda_root())
    return cupy.RawModule(
        code=read_source(relpath),
        options=NVRTC_OPTIONS + include_options(root) + options,
        name_expressions=list(name_expressions) or None,
        backend="nvrtc",
    )


def get_module(relpath: str, name_expressions: tuple[str, ...] = (), options: tuple[str, ...] = ()) -> Any:
    """The (cached) ``cupy.RawModule`` of one kernel file on the current device."""
    cupy = require()
    return _module(relpath, tuple(name_expressions), tuple(options), cupy.cuda.Device().id)


def get_function(relpath: str, name: str, options: tuple[str, ...] = ()) -> Any:
    """A kernel of ``relpath``: ``extern "C"`` names as is, template instantiations by expression."""
    is_template = "<" in name
    mod = get_module(relpath, (name,) if is_template else (), options)
    return mod.get_function(name)
