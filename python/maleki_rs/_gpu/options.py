"""NVRTC options shared by the runtime loader and the CI compile check.

The compile check (``tests/gpu/test_cuda_compile.py``) compiles every ``cuda/**/*.cu`` with
exactly these options for ``sm_90`` through NVRTC from PyPI, so a kernel that breaks here
breaks CI, even on machines without a GPU.
"""

from __future__ import annotations

#: Options every kernel is compiled with (besides ``-I`` paths and the architecture).
NVRTC_OPTIONS: tuple[str, ...] = ("-std=c++17",)

#: The architecture CI compiles for (Hopper: H100/H200).
CI_ARCH = "sm_90"


def include_options(cuda_root: str) -> tuple[str, ...]:
    """``-I`` options for a kernel tree rooted at ``cuda_root`` (its ``include/`` too)."""
    return (f"-I{cuda_root}", f"-I{cuda_root}/include")
