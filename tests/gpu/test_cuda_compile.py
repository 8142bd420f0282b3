"""Every CUDA source compiles for sm_90 through NVRTC from PyPI, with the runtime's options.

This runs without a GPU or driver (NVRTC is a pure compiler library), so a broken kernel
fails CI. Needs the ``cuda-check`` extra: nvidia-cuda-nvrtc, nvidia-cuda-runtime (headers)
and cuda-bindings.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from maleki_rs._gpu.options import CI_ARCH, NVRTC_OPTIONS, include_options

nvrtc = pytest.importorskip("cuda.bindings.nvrtc")
pathfinder = pytest.importorskip("cuda.pathfinder")

CUDA_ROOT = Path(__file__).resolve().parents[2] / "cuda"
SOURCES = sorted(CUDA_ROOT.rglob("*.cu"))


def _check(result):
    err, *rest = result
    return err, (rest[0] if len(rest) == 1 else rest)


def compile_cubin(path: Path, extra: tuple[str, ...] = (), names: tuple[str, ...] = ()) -> tuple[bool, str, int]:
    """Compiles one file, instantiating the kernels ``names`` as the runtime loader does (name
    expressions); returns (ok, log, cubin size)."""
    header_dir = pathfinder.find_nvidia_header_directory("cudart")
    src = path.read_bytes()
    err, prog = _check(nvrtc.nvrtcCreateProgram(src, str(path).encode(), 0, [], []))
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    for name in names:
        (err,) = nvrtc.nvrtcAddNameExpression(prog, name.encode())
        assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, name
    opts = [f"--gpu-architecture={CI_ARCH}", *NVRTC_OPTIONS, *include_options(str(CUDA_ROOT)),
            f"-I{header_dir}", *extra]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
    _, size = _check(nvrtc.nvrtcGetProgramLogSize(prog))
    log = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, log)
    ok = err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    cubin_size = 0
    if ok:
        _, cubin_size = _check(nvrtc.nvrtcGetCUBINSize(prog))
    nvrtc.nvrtcDestroyProgram(prog)
    return ok, log.decode(errors="replace").rstrip("\x00 "), cubin_size


def test_there_are_sources():
    assert SOURCES, f"no .cu files under {CUDA_ROOT}"


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(CUDA_ROOT)) for p in SOURCES])
def test_compiles_for_sm90(path):
    ok, log, size = compile_cubin(path)
    assert ok, f"{path.relative_to(CUDA_ROOT)} failed to compile for {CI_ARCH}:\n{log}"
    assert size > 0


@pytest.mark.parametrize("count", [False, True], ids=["plain", "counting"])
def test_msgemm_module_compiles_as_loaded(count):
    """The msgemm module as the runtime builds it: every template instantiation, in the plain
    and the counting build, without register spills (``ptxas -v`` reports them)."""
    from maleki_rs.msgemm import cuda as mgc

    extra = ("--ptxas-options=-v",) + (("-DMSGEMM_COUNT",) if count else ())
    ok, log, size = compile_cubin(CUDA_ROOT / "msgemm" / "msgemm.cu", extra, mgc.kernel_names())
    assert ok and size > 0, log
    if not count:
        spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
        assert spills and all(a == "0" and b == "0" for a, b in spills), log


def test_a_broken_kernel_is_reported_with_its_line(tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text('extern "C" __global__ void k(float* x) {\n  x[0] = undefined_name;\n}\n')
    ok, log, _ = compile_cubin(bad)
    assert not ok and "undefined_name" in log and "(2)" in log
