"""msGeMM on an NVIDIA GPU with CuPy (spec section 6): look-up-table GEMV for N <= 8 columns.

Import-guarded: importing this module never needs CuPy; the functions raise
:class:`maleki_rs.exceptions.GPUUnavailableError` without a usable device. Kernels live in
``cuda/msgemm/msgemm.cu`` and are compiled at first use with NVRTC (sm_90 is what CI checks).

Usage::

    from maleki_rs import msgemm as mg
    from maleki_rs.msgemm import cuda as mgc

    pw = mg.quantize(w, "int4", group_size=128)
    pwd = mgc.to_device(pw)             # or mgc.to_device(pw, depth=1): 4-bit table indices
    y = mgc.msgemm_cuda(pwd, x)         # cupy array, ~ pw.dequantize() @ x
    y_dense = mgc.dequant_gemv_cuda(pwd, x)   # dense dequantize+FMA comparator (4-bit formats)

Arithmetic: float32 tables built exactly as the host scalar build (no FMA contraction),
float32 sums per group, ``y += s * (P - z * S)`` per group; the K dimension is split across
thread blocks and the partial results are added in a fixed order (deterministic). On integer
data with power-of-two scales the result equals the float64 reference bit for bit.

Speed (H200, int4 g128, tables included; BENCHMARKS.md, section msgemm-gpu): (28672, 8192) at
N = 1 takes 107 µs, 1.14x cuBLAS fp16 on dequantized weights (which take 3.8x the memory); at
N = 4, 0.53x. The kernels are for decode-sized N; for batches, dequantize and use cupy.matmul.
Three variants are not yet timed on a device: 4-bit indices with 16-entry tables
(``to_device(pw, depth=1)`` for int4: no shared-memory bank conflicts), tables built inside
the LUT kernel (``fuse_tables=True``) and column-interleaved tables (``interleave_columns=True``:
2 or 4 columns per shared-memory load); ``benches/gpu_msgemm.py`` sweeps them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._gpu import require
from .._gpu.loader import get_module
from .._util.validate import check_bool, check_int
from ._api import PackedWeights

__all__ = ["DeviceWeights", "to_device", "msgemm_cuda", "dequant_gemv_cuda", "kernel_names", "MAX_COLUMNS",
           "COUNT_KINDS"]

_SRC = "msgemm/msgemm.cu"
#: Most columns of X one call takes (decode and small batches).
MAX_COLUMNS = 8
_ROWS = 256
_RPT = 2  # rows per thread of msgemm_gemv_lut (its template argument): a block covers 512 rows
_BLOCKS_PER_SM = 4  # default K splits: about this many blocks per SM
_PLAIN = ("msgemm_tables", "msgemm_group_sums", "msgemm_reduce_splits", "dequant_gemv_shfl")
#: Operation kinds of the counting build (``msgemm_cuda(..., count=True)``), in the order of
#: ``msgemm_counts`` in msgemm.cu.
COUNT_KINDS = ("table_mul", "table_add", "sum_add", "words", "staged", "lookups", "scale_mul", "zero_mul",
               "reduce_add")
_COUNT_OPTION = "-DMSGEMM_COUNT"


#: Bits per table index in the device layout: 4 where a table has at most 16 entries.
INDEX_BITS = (4, 8)


def _lut_name(n: int, rpt: int, bits: int, interleaved: bool) -> str:
    return f"msgemm_gemv_lut<{n}, {rpt}, {bits}, {'true' if interleaved else 'false'}>"


@functools.lru_cache(maxsize=8)
def kernel_names(rpt: int = _RPT) -> tuple[str, ...]:
    """Every kernel of msgemm.cu, as compiled into one module: the ``extern "C"`` ones and
    ``msgemm_gemv_lut`` for 1 to 8 columns, 4- and 8-bit indices and both table layouts (the
    compile check in CI instantiates the same)."""
    return _PLAIN + tuple(_lut_name(n, rpt, b, ci) for ci in (False, True) for b in INDEX_BITS
                          for n in range(1, MAX_COLUMNS + 1))


@dataclass
class DeviceWeights:
    """Weights on the device, laid out for the kernels (see ``cuda/msgemm/msgemm.cu``).

    Attributes
    ----------
    shape : (M, K)
    group_size, depth, levels : int
    bits : int
        Bits per table index: 4 where ``V^d <= 16`` and ``(G/d) % 8 == 0``, else 8.
    idx : cupy.ndarray, shape ((K/d)/(32/bits), M), uint32
        Table indices of ``32 / bits`` consecutive tuples per word (tuple ``j`` of a word in
        bits ``[bits j, bits (j+1))``), row = lane.
    values : cupy.ndarray, shape (V,), float32
        Codebook (non-finite fp8 codes read 0).
    scales_t : cupy.ndarray, shape (K/G, M), float32
        Scales, transposed (row = lane: coalesced loads).
    zeros_t : cupy.ndarray (K/G, M) float32 or None
        Zero points (value units), transposed.
    k_perm : cupy.ndarray (K,) int64 or None
        Act-order permutation: packed column j is input ``k_perm[j]``.
    packed : cupy.ndarray (M, K/2) uint8 or None
        Canonical 4-bit packing, for the dense comparator (4-bit formats only).
    nbytes : int
        Bytes of the packed weights on the host (codes + scales + zero points).
    """

    shape: tuple[int, int]
    group_size: int
    depth: int
    levels: int
    bits: int
    idx: Any
    values: Any
    scales_t: Any
    zeros_t: Any
    k_perm: Any
    packed: Any
    nbytes: int

    @property
    def slot(self) -> int:
        return self.levels**self.depth

    @property
    def tuples_per_group(self) -> int:
        return self.group_size // self.depth

    @property
    def tuples_per_word(self) -> int:
        return 32 // self.bits

    @property
    def scales(self) -> Any:
        """Scales, shape (M, K/G) (a transposed view of ``scales_t``)."""
        return self.scales_t.T

    @property
    def zeros(self) -> Any:
        """Zero points, shape (M, K/G), or None (a transposed view of ``zeros_t``)."""
        return None if self.zeros_t is None else self.zeros_t.T


def to_device(pw: PackedWeights, depth: int | None = None) -> DeviceWeights:
    """Copies ``pw`` to the current CUDA device in the kernels' layout.

    Parameters
    ----------
    pw : PackedWeights
    depth : int, optional
        Table depth ``d`` (default: the format's natural depth). Needs ``V^d <= 256``, ``d``
        dividing the group size and ``(G / d) % 4 == 0``. Where ``V^d <= 16`` and
        ``(G / d) % 8 == 0`` (int4 at ``d = 1``, int2 and ternary at ``d = 2``), the indices
        are stored 8 to a 32-bit word instead of 4: half the bytes, and tables of 16 entries
        that the lanes of a warp read without shared-memory bank conflicts.
    """
    if not isinstance(pw, PackedWeights):
        raise TypeError(f"pw: expected PackedWeights, got {type(pw).__name__}")
    m, k = pw.shape
    g = pw.group_size
    v = pw.levels
    d = pw.natural_depth if depth is None else check_int(depth, "depth", min=1, max=8)
    if v**d > 256:
        raise ValueError(f"depth: the GPU kernels need V^d <= 256 (byte indices); V={v}, d={d} gives {v**d}")
    if g % d or (g // d) % 4:
        raise ValueError(f"depth: the GPU kernels need d | G and (G/d) % 4 == 0; G={g}, d={d}")
    bits = 4 if v**d <= 16 and (g // d) % 8 == 0 else 8
    cp = require()
    codes = np.asarray(pw.codes, dtype=np.uint16).reshape(m, k // d, d)
    idx = np.zeros((m, k // d), np.uint16)
    for j in reversed(range(d)):
        idx = idx * v + codes[:, :, j]
    idx8 = idx.astype(np.uint8)
    if bits == 4:  # tuple 2i in the low nibble of byte i, 2i + 1 in the high one
        idx8 = idx8[:, 0::2] | (idx8[:, 1::2] << 4)
    words = np.ascontiguousarray(np.ascontiguousarray(idx8).view("<u4").T)  # ((K/d)/(32/bits), M)
    values = np.nan_to_num(np.asarray(pw.codebook, np.float32), nan=0.0, posinf=0.0, neginf=0.0)
    values = np.concatenate([values, np.zeros(max(0, 16 - v), np.float32)])  # shfl reads 16 lanes
    packed = None
    if pw.bits_per_weight == 4 and k % 8 == 0 and g % 8 == 0:
        packed = cp.asarray(np.ascontiguousarray(pw.packed))
    return DeviceWeights(
        shape=(m, k),
        group_size=g,
        depth=d,
        levels=v,
        bits=bits,
        idx=cp.asarray(words),
        values=cp.asarray(values),
        scales_t=cp.asarray(np.ascontiguousarray(np.asarray(pw.scales, dtype=np.float32).T)),
        zeros_t=None if pw.zeros is None else cp.asarray(np.ascontiguousarray(np.asarray(pw.zeros, np.float32).T)),
        k_perm=None if pw.k_perm is None else cp.asarray(np.asarray(pw.k_perm, dtype=np.int64)),
        packed=packed,
        nbytes=pw.nbytes,
    )


@functools.lru_cache(maxsize=16)
def _sm_count(device: int) -> int:
    cp = require()
    return int(cp.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"])


def _kernel(name: str, count: bool = False) -> Any:
    """A kernel of ``msgemm.cu`` on the current device (one module holds them all; the counting
    build is a second module)."""
    opts = (_COUNT_OPTION,) if count else ()
    return get_module(_SRC, kernel_names(_RPT), opts).get_function(name)


def _reset_counts() -> Any:
    """Zeroes the counting module's ``msgemm_counts`` and returns it as a cupy array."""
    cp = require()
    mod = get_module(_SRC, kernel_names(_RPT), (_COUNT_OPTION,))
    counts = cp.ndarray((len(COUNT_KINDS),), cp.uint64, mod.get_global("msgemm_counts"))
    counts.fill(0)
    return counts


def _xt(pwd: DeviceWeights, x: Any, check: bool = True) -> tuple[Any, bool]:
    """X as a (N, K) float32 C-contiguous device array in packed column order; vector flag."""
    cp = require()
    xa = cp.asarray(x)
    if xa.dtype.kind != "f":
        raise TypeError(f"x: expected a float array, got dtype {xa.dtype}")
    k = pwd.shape[1]
    if xa.ndim not in (1, 2) or xa.shape[0] != k:
        raise ValueError(f"x: expected shape ({k},) or ({k}, N), got {xa.shape}")
    vector = xa.ndim == 1
    xt = xa.reshape(1, k) if vector else xa.T
    if xt.shape[0] == 0 or xt.shape[0] > MAX_COLUMNS:
        raise ValueError(
            f"x: the GPU kernels take 1 to {MAX_COLUMNS} columns, got {xt.shape[0]} (each column is a pass of "
            "lookups: from 4 columns on, cupy.matmul on dequantized float16 weights is faster on an H200)"
        )
    if pwd.k_perm is not None:
        xt = xt[:, pwd.k_perm]
    xt = cp.ascontiguousarray(xt, dtype=cp.float32)
    # After the conversion: a finite float64 beyond float32's range becomes inf here.
    if check and not bool(cp.isfinite(xt).all()):
        raise ValueError("x: contains NaN, infinity, or a value beyond float32's range")
    return xt, vector


def _splits(pwd: DeviceWeights, sm_count: int) -> int:
    m = pwd.shape[0]
    groups = pwd.shape[1] // pwd.group_size
    tiles = -(-m // (_ROWS * _RPT))
    want = -(-_BLOCKS_PER_SM * sm_count // tiles)
    return max(1, min(groups, want))


def _piece_words(n: int, words_per_group: int) -> int:
    """Index words per staged piece: the largest power of two <= 8 / n dividing the group's
    words (a piece's tables then take at most 32 KiB of shared memory)."""
    pw = max(1, 8 // n)
    while words_per_group % pw:
        pw //= 2
    return pw


def msgemm_cuda(pwd: DeviceWeights, x: Any, *, splits: int | None = None, check: bool = True,
                count: bool = False, fuse_tables: bool = False, interleave_columns: bool = False) -> Any:
    """``Wd @ x`` through look-up tables on the device.

    Parameters
    ----------
    pwd : DeviceWeights
        From :func:`to_device`.
    x : array_like (numpy or cupy), shape (K,) or (K, N), N <= 8, float dtype
    splits : int, optional
        Number of K splits (blocks along K); default: about 4 blocks per SM.
    check : bool
        Check ``x`` for NaN/inf (one device reduction and a host sync; off for timing loops).
    count : bool
        Run the counting build of the kernels (slower; compiled with ``-DMSGEMM_COUNT``) and
        return ``(y, counts)``: ``counts`` maps each of :data:`COUNT_KINDS` to the operations
        the device ran (rows past M not counted): table multiplies and adds, group-sum adds,
        weight words loaded, table floats staged in shared memory, lookups (each with its add),
        scale and zero-point multiplies, and split-reduction adds.
    fuse_tables : bool
        Build each piece's tables in shared memory inside the LUT kernel, from ``x``, instead
        of in a kernel of their own through global memory. Every row tile (512 rows by
        default) then repeats the table arithmetic (``ceil(M / 512)`` times the table
        multiplies), which is cheap
        where tables are small (``V^d <= 16``); it saves a kernel and the tables' round trip.
        The same bits either way (one definition of a table entry).
    interleave_columns : bool
        Lay the tables out with the N columns of each entry side by side, so that one 8- or
        16-byte shared-memory load fetches 2 or 4 columns' entries (N even). The same bits.

    Returns
    -------
    cupy.ndarray, float32, shape (M,) or (M, N); with ``count=True``, ``(y, counts)``.
    """
    if not isinstance(pwd, DeviceWeights):
        raise TypeError(f"pwd: expected DeviceWeights (from to_device), got {type(pwd).__name__}")
    cp = require()
    count = check_bool(count, "count")
    fuse = check_bool(fuse_tables, "fuse_tables")
    ci = check_bool(interleave_columns, "interleave_columns")
    xt, vector = _xt(pwd, x, check_bool(check, "check"))
    n = xt.shape[0]
    m, k = pwd.shape
    g, d, v, slot, tpg = pwd.group_size, pwd.depth, pwd.levels, pwd.slot, pwd.tuples_per_group
    groups = k // g
    counts = _reset_counts() if count else None
    tables = np.uint64(0)  # a null pointer: the LUT kernel builds them
    if not fuse:
        tables = cp.empty((k // d) * n * slot, cp.float32)
        total = tables.size
        _kernel("msgemm_tables", count)(
            (min(-(-total // 256), 65535),), (256,),
            (xt, pwd.values, np.int32(v), np.int32(d), np.int64(k), np.int32(n), np.int32(slot), np.int32(ci), tables),
        )
    sums = cp.zeros(n * groups, cp.float32)
    if pwd.zeros_t is not None:
        _kernel("msgemm_group_sums", count)(
            (-(-(n * groups) // 256),), (256,), (xt, np.int64(k), np.int32(n), np.int32(g), sums)
        )
    sm = _sm_count(cp.cuda.Device().id)
    s = _splits(pwd, sm) if splits is None else check_int(splits, "splits", min=1, max=min(groups, 65535))
    per = -(-groups // s)
    s = -(-groups // per)
    tpw = pwd.tuples_per_word
    qpg = tpg // tpw
    pw = _piece_words(n, qpg)
    smem = pw * tpw * n * slot * 4  # <= 32 KiB: no opt-in to large shared memory needed
    partial = cp.empty((s, n, m), cp.float32)
    zeros = pwd.zeros_t if pwd.zeros_t is not None else np.uint64(0)  # a null pointer
    _kernel(_lut_name(n, _RPT, pwd.bits, ci), count)(
        (-(-m // (_ROWS * _RPT)), s), (_ROWS,),
        (pwd.idx, tables, xt, pwd.values, np.int32(v), np.int32(d), np.int64(k), pwd.scales_t, zeros, sums,
         np.int64(m), np.int32(groups), np.int32(qpg), np.int32(pw), np.int32(slot), np.int32(per), partial),
        shared_mem=smem,
    )
    y = cp.empty((m, n), cp.float32)
    _kernel("msgemm_reduce_splits", count)(
        (-(-(m * n) // 256),), (256,), (partial, np.int64(m), np.int32(n), np.int32(s), y)
    )
    y = y.reshape(m) if vector else y
    if count:
        return y, dict(zip(COUNT_KINDS, (int(c) for c in cp.asnumpy(counts)), strict=True))
    return y


def dequant_gemv_cuda(pwd: DeviceWeights, x: Any, *, check: bool = True) -> Any:
    """The dense comparator: dequantize in registers (``__shfl_sync`` codebook) and FMA.

    4-bit formats only (``pwd.packed`` present). Same shapes as :func:`msgemm_cuda`.
    """
    if not isinstance(pwd, DeviceWeights):
        raise TypeError(f"pwd: expected DeviceWeights (from to_device), got {type(pwd).__name__}")
    cp = require()
    if pwd.packed is None:
        raise ValueError("dequant_gemv_cuda: needs 4-bit codes with K and G multiples of 8")
    xt, vector = _xt(pwd, x, check_bool(check, "check"))
    n = xt.shape[0]
    m, k = pwd.shape
    y = cp.empty((m, n), cp.float32)
    zeros = pwd.zeros_t if pwd.zeros_t is not None else np.uint64(0)
    warps = 8
    _kernel("dequant_gemv_shfl")(
        (-(-m // warps),), (32 * warps,),
        (pwd.packed, pwd.values, pwd.scales_t, zeros, xt, np.int64(m), np.int64(k), np.int32(n),
         np.int32(pwd.group_size), y),
    )
    return y.reshape(m) if vector else y
