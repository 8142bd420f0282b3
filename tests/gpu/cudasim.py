"""Runs the project's CUDA kernels on the CPU (``cudasim.h``), behind a fake CuPy, so the device
oracles of ``tests/gpu`` also run on machines without a GPU (CI).

:func:`get_module` stands in for ``maleki_rs._gpu.loader.get_module``: it compiles the same
kernel file, with the same name expressions and options, as C++ with ``g++`` and the header
``cudasim.h`` included first, into a shared library cached by content. :data:`cupy` stands in
for the ``cupy`` module: device arrays are numpy arrays, and a kernel launch runs the kernel's
blocks one after another on this thread (see ``cudasim.h`` for what is and is not modelled).
"""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import os
import re
import shutil
import subprocess
import tempfile
import threading
import types
from pathlib import Path
from typing import Any

import numpy as np

from maleki_rs._gpu.loader import cuda_root, read_source

HEADER = Path(__file__).resolve().parent / "cudasim.h"
#: Multiprocessors the fake device reports (an H200 has 132): launch shapes follow from it.
SM_COUNT = 132

# `extern __shared__ T name[];` (dynamic shared memory) becomes a pointer to the launch's buffer.
_EXTERN_SHARED = re.compile(r"extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?([\w:]+)\s+(\w+)\s*\[\s*\]\s*;")
# `__shared__ T name[n]...;` (static shared memory) becomes a static refilled with 0xff by the
# first thread of each block to reach it (same line: compiler messages keep their line numbers).
_STATIC_SHARED = re.compile(r"__shared__\s+(?:__align__\(\d+\)\s+)?([\w:<>]+)\s+(\w+)\s*((?:\[[^\]]*\])*)\s*;")
# The simulator's state is per process: one launch at a time (ctypes releases the GIL).
_LAUNCH = threading.Lock()


def compiler() -> str | None:
    """The C++ compiler the simulator uses (``$CXX`` or ``g++``), or None."""
    return shutil.which(os.environ.get("CXX", "g++"))


def _cache_dir() -> Path:
    d = Path(os.environ.get("MALEKI_RS_CUDASIM_CACHE", Path(tempfile.gettempdir()) / "maleki_rs_cudasim"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def _translation_unit(source: str, names: tuple[str, ...]) -> str:
    src = _EXTERN_SHARED.sub(r"\1* \2 = static_cast<\1*>(cudasim::dynamic_smem());", source)
    src = _STATIC_SHARED.sub(
        r"static \1 \2\3; static cudasim::SharedVar \2_cudasim_; cudasim::shared_poison(\2_cudasim_, &\2, sizeof(\2));",
        src)
    reg = ",\n    ".join(f"cudasim::make(&{n})" for n in names)
    return (
        '#include "cudasim.h"\n'
        + src
        + '\n#line 1 "cudasim-registry"\n'
        + f"static cudasim::KernelBase* const sim_kernels[] = {{\n    {reg}\n}};\n"
        + 'extern "C" int sim_params(int k) { return sim_kernels[k]->params(); }\n'
        + 'extern "C" unsigned long long sim_param_size(int k, int i) { return sim_kernels[k]->param_size(i); }\n'
        + 'extern "C" int sim_launch(int k, const unsigned* grid, const unsigned* block, unsigned long long smem,\n'
        + "                          void** args, const unsigned long long* guards, const int* guard_args,\n"
        + "                          unsigned long long nguards, char* err, unsigned long long errlen) {\n"
        + "    return cudasim::guarded_launch(sim_kernels[k], grid, block, smem, args, guards, guard_args, nguards,\n"
        + "                                   err, errlen);\n"
        + "}\n"
    )


_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mmap.restype = ctypes.c_void_p
_LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_LIBC.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_PAGE = mmap.PAGESIZE


class _Guarded:
    """A copy of a contiguous array whose end (16-byte aligned, so at most 15 bytes short) meets
    a page that cannot be read or written: a kernel's access past the array's end faults there,
    and cudasim.h turns the fault into an error."""

    def __init__(self, a: np.ndarray):
        self.array = a
        self.size = -(-a.nbytes // _PAGE) * _PAGE + 2 * _PAGE  # room for the alignment, and the guard
        addr = _LIBC.mmap(None, self.size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                          -1, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "cudasim: mmap failed")
        self.addr = addr
        self.guard = addr + self.size - _PAGE
        if _LIBC.mprotect(self.guard, _PAGE, 0) != 0:  # PROT_NONE
            _LIBC.munmap(addr, self.size)
            raise OSError(ctypes.get_errno(), "cudasim: mprotect failed")
        self.data = (self.guard - a.nbytes) & ~15
        self.view = np.frombuffer((ctypes.c_char * a.nbytes).from_address(self.data), a.dtype).reshape(a.shape)
        self.view[...] = a

    def close(self) -> None:
        """Copies the kernel's writes back and frees the mapping."""
        if self.array.flags.writeable:
            self.array[...] = self.view
        self.view = None
        _LIBC.munmap(self.addr, self.size)


def _guardable(args: tuple[Any, ...]) -> list[int]:
    """Indices of the arrays that can be given a guarded copy: C-contiguous and sharing no
    memory with another argument (a copy would split an alias)."""
    arrays = [i for i, a in enumerate(args) if isinstance(a, np.ndarray)]
    out = []
    for i in arrays:
        if not args[i].flags.c_contiguous:
            continue
        if any(j != i and np.shares_memory(args[i], args[j]) for j in arrays):
            continue
        out.append(i)
    return out


class SimFunction:
    """One kernel; called as CuPy's ``RawKernel``: ``f(grid, block, args, shared_mem=0)``."""

    def __init__(self, lib: ctypes.CDLL, index: int, name: str):
        self._lib, self._index, self.name = lib, index, name
        self._sizes = [lib.sim_param_size(index, i) for i in range(lib.sim_params(index))]

    def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...],
                 shared_mem: int = 0) -> None:
        if len(args) != len(self._sizes):
            raise TypeError(f"{self.name}: takes {len(self._sizes)} arguments, got {len(args)}")
        keep = []
        ptrs = (ctypes.c_void_p * max(1, len(args)))()
        guarded = {i: None for i in _guardable(args)}
        try:  # the guarded copies are freed (and written back) whatever happens
            for i, (a, size) in enumerate(zip(args, self._sizes, strict=True)):
                if isinstance(a, np.ndarray):
                    if i in guarded:
                        guarded[i] = _Guarded(a)
                    buf = ctypes.c_void_p(guarded[i].data if i in guarded else a.ctypes.data)
                    got = ctypes.sizeof(buf)
                elif isinstance(a, np.generic):
                    raw = np.asarray(a).tobytes()
                    buf = ctypes.create_string_buffer(raw, len(raw))
                    got = len(raw)
                else:  # CuPy takes numpy scalars and arrays; our callers pass nothing else
                    raise TypeError(f"{self.name}: argument {i} is a {type(a).__name__}, not a numpy array or scalar")
                if got != size:
                    raise TypeError(f"{self.name}: argument {i} has {got} bytes, the kernel's parameter {size}")
                keep.append(buf)
                ptrs[i] = ctypes.addressof(buf)
            dims = [tuple(int(v) for v in d) + (1,) * (3 - len(d)) for d in (grid, block)]
            err = ctypes.create_string_buffer(512)
            n = len(guarded)
            pages = (ctypes.c_ulonglong * max(1, n))(*[g.guard for g in guarded.values()])
            which = (ctypes.c_int * max(1, n))(*guarded)
            with _LAUNCH:
                rc = self._lib.sim_launch(self._index, (ctypes.c_uint * 3)(*dims[0]), (ctypes.c_uint * 3)(*dims[1]),
                                          ctypes.c_ulonglong(int(shared_mem)), ptrs, pages, which,
                                          ctypes.c_ulonglong(n), err, ctypes.c_ulonglong(len(err)))
        finally:
            for g in guarded.values():
                if g is not None:
                    g.close()
        if rc != 0:
            raise RuntimeError(f"{self.name}: {err.value.decode()}")


class SimModule:
    """What ``cupy.RawModule`` gives: kernels by name and ``__device__`` globals."""

    def __init__(self, path: Path, names: tuple[str, ...]):
        self._lib = ctypes.CDLL(str(path))
        self._lib.sim_param_size.restype = ctypes.c_ulonglong
        self._names = names

    def get_function(self, name: str) -> SimFunction:
        if name not in self._names:
            raise KeyError(f"{name!r} is not among the module's kernels {self._names}")
        return SimFunction(self._lib, self._names.index(name), name)

    def get_global(self, name: str) -> int:
        """The address of a global (what :func:`ndarray` takes as ``memptr``)."""
        return ctypes.cast(getattr(self._lib, name), ctypes.c_void_p).value


_modules: dict[Path, SimModule] = {}


def get_module(relpath: str, name_expressions: tuple[str, ...] = (), options: tuple[str, ...] = ()) -> SimModule:
    """The simulated module of one kernel file (compiled once per content and options)."""
    return module_from_source(read_source(relpath), name_expressions, options, stem=Path(relpath).stem)


def module_from_source(source: str, name_expressions: tuple[str, ...], options: tuple[str, ...] = (),
                       stem: str = "kernels") -> SimModule:
    """The simulated module of CUDA source text (kernels ``name_expressions``)."""
    names = tuple(name_expressions)
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("cudasim needs a C++ compiler (g++ or $CXX)")
    tu = _translation_unit(source, names)
    flags = ["-std=c++17", "-O1", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math", "-fno-strict-aliasing",
             "-Wno-unknown-pragmas",
             f"-I{HEADER.parent}", f"-I{cuda_root()}", f"-I{cuda_root() / 'include'}", *options]
    # Every header the source may include is part of the key (a cached build of an edited
    # header would test the old code).
    headers = [p.read_text() for p in sorted(cuda_root().rglob("*")) if p.suffix in (".cu", ".cuh", ".h")]
    digest = hashlib.sha256("\0".join([tu, HEADER.read_text(), *headers, cxx, *flags]).encode()).hexdigest()[:24]
    out = _cache_dir() / f"{stem}-{digest}.so"
    if out in _modules:
        return _modules[out]
    if not out.exists():
        # Per-process source and output files: concurrent builds of one key never share a file.
        src = out.with_suffix(f".{os.getpid()}.cpp")
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        src.write_text(tu)
        try:
            r = subprocess.run([cxx, *flags, str(src), "-o", str(tmp)], capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"cudasim: compiling {stem} failed:\n{r.stderr[-4000:]}")
            os.replace(tmp, out)
        finally:
            src.unlink(missing_ok=True)
            tmp.unlink(missing_ok=True)
    _modules[out] = SimModule(out, names)
    return _modules[out]


def get_function(relpath: str, name: str, options: tuple[str, ...] = ()) -> SimFunction:
    """As ``maleki_rs._gpu.loader.get_function``."""
    return get_module(relpath, (name,), options).get_function(name)


def ndarray(shape: Any, dtype: Any, memptr: int) -> np.ndarray:
    """A numpy view of ``shape`` elements of ``dtype`` at address ``memptr`` (a module global)."""
    dt = np.dtype(dtype)
    count = int(np.prod(shape))
    buf = (ctypes.c_char * (count * dt.itemsize)).from_address(memptr)
    return np.frombuffer(buf, dtype=dt, count=count).reshape(shape)


def _empty(shape: Any, dtype: Any = float) -> np.ndarray:
    # Device memory is not zeroed: 0xff bytes (NaN floats), so an output a kernel forgets to
    # write shows up.
    a = np.empty(shape, dtype)
    a.view(np.uint8).fill(0xFF)
    return a


def _ascontiguousarray(a: Any, dtype: Any = None) -> np.ndarray:
    # A device cast overflows to inf silently (numpy warns).
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(a, dtype=dtype)


class _Device:
    id = 0


def _properties(device: int) -> dict[str, Any]:
    return {"multiProcessorCount": SM_COUNT, "name": "cudasim", "major": 9, "minor": 0}


#: The fake ``cupy``: numpy for arrays, plus what the kernel drivers use.
cupy = types.SimpleNamespace(
    asarray=np.asarray, asnumpy=np.asarray, ascontiguousarray=_ascontiguousarray, empty=_empty,
    zeros=np.zeros, isfinite=np.isfinite, ndarray=ndarray, matmul=np.matmul, concatenate=np.concatenate,
    abs=np.abs, float16=np.float16, float32=np.float32, float64=np.float64, uint8=np.uint8, int32=np.int32,
    int64=np.int64, uint32=np.uint32, uint64=np.uint64, __version__="cudasim",
    cuda=types.SimpleNamespace(Device=_Device, runtime=types.SimpleNamespace(getDeviceProperties=_properties)),
    __name__="cudasim",
)
