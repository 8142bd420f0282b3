"""msGeMM on an NVIDIA GPU with CuPy (spec section 6): look-up-table GEMV for N <= 8 columns,
and a tensor-core kernel for batches.

Import-guarded: importing this module never needs CuPy; the functions raise
:class:`maleki_rs.exceptions.GPUUnavailableError` without a usable device. Kernels live in
``cuda/msgemm/msgemm.cu`` and are compiled at first use with NVRTC (sm_90 is what CI checks).

Usage::

    from maleki_rs import msgemm as mg
    from maleki_rs.msgemm import cuda as mgc

    pw = mg.quantize(w, "int4", group_size=128)
    pwd = mgc.to_device(pw)             # int4: d = 1, 4-bit table indices, 16-entry tables
    y = mgc.msgemm_cuda(pwd, x)         # cupy array, ~ pw.dequantize() @ x
    y_dense = mgc.dequant_gemv_cuda(pwd, x)   # dense dequantize+FMA comparator (4-bit formats)

    pwd = mgc.to_device(pw, mma=True)   # also the tensor-core layout (formats of at most 16 levels)
    y = mgc.msgemm_cuda(pwd, xb)        # xb (K, N), any N: N <= 8 through tables, beyond on
                                        # tensor cores (kernel="mma" or dequant_mma_cuda: always)
    h = mgc.linear_cuda(acts, pwd)      # acts (..., K) -> (..., M), as nn.Linear

Arithmetic: float32 tables built exactly as the host scalar build (no FMA contraction),
float32 sums per group, ``y += s * (P - z * S)`` per group; the K dimension is split across
thread blocks and the partial results are added in a fixed order (deterministic). On integer
data with power-of-two scales the result equals the float64 reference bit for bit.

The tensor-core kernel: X scaled per column by a power of two and split into float16 hi + lo,
so its results are float32-accurate too, and bit for bit exact on the same integer data.

Speed (H200, int4 g128, tables included; BENCHMARKS.md, section msgemm-gpu): the LUT kernels
are for decode-sized N. A GEMV of (28672, 8192) takes 67 µs, 1.80x cuBLAS fp16 on dequantized
weights (which take 3.8x the memory); N = 4 about as fast as cuBLAS; N = 16 at 0.2x.
``dequant_mma_cuda`` is for those batches: it reads the same 4-bit codes and multiplies on
tensor cores. Its exactness is tested on the CPU simulator, but it has not yet been timed on a
GPU. ``benches/gpu_msgemm.py`` measures both, and sweeps their launch shapes and table depths.
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

__all__ = ["DeviceWeights", "to_device", "msgemm_cuda", "linear_cuda", "dequant_gemv_cuda", "dequant_mma_cuda",
           "kernel_names", "MAX_COLUMNS", "KERNELS", "COUNT_KINDS"]

_SRC = "msgemm/msgemm.cu"
#: Most columns of X one call of the LUT kernels takes (decode and small batches).
MAX_COLUMNS = 8
#: The kernels ``msgemm_cuda`` chooses from: ``"auto"``, the LUT kernels (``"lut"``) or the
#: tensor-core kernel (``"mma"``, :func:`dequant_mma_cuda`).
KERNELS = ("auto", "lut", "mma")
#: ``kernel="auto"`` takes the LUT kernels up to this many columns where the weights have their
#: layout, and the tensor-core kernel beyond (or where only its layout is there). MAX_COLUMNS is
#: the LUT kernels' limit, not a measured crossover: the tensor-core kernel has not been timed on
#: a GPU yet (``benches/gpu_msgemm.py`` times both at N = 1, 4, 16, 256).
_AUTO_LUT_MAX_N = MAX_COLUMNS
_ROWS = 256
# Launch shape of msgemm_gemv_lut, from the H200 sweep (BENCHMARKS.md, msgemm-gpu): 4 rows per
# thread and about 2 blocks per SM were fastest at N = 1 for int4 (28672, 8192) and
# (8192, 28672) (8 rows: 73-77 against 67-70 µs); from N = 4 on, 2 rows with twice the splits.
_RPT = 4  # rows per thread (its template argument) up to _RPT_MAX_N columns: a block covers 1024 rows
#: More columns than this run 2 rows per thread: their accumulators (2 x RPT x N floats) would
#: not fit the 128 registers of two blocks per SM with 4 (ptxas reports spills from N = 4 on).
_RPT_MAX_N = 3
#: Rows the LUT kernel's 32-bit word offsets (up to 7 M) allow, with room to spare.
_MAX_ROWS = 1 << 28
_BLOCKS_PER_SM = 2  # default K splits: about this many blocks per SM
#: Shared memory for one chunk of staged tables (no opt-in to large shared memory needed); 0
#: stages one batch of words' tables at a time (a barrier pair per batch).
_CHUNK_BYTES = 48 << 10
_PLAIN = ("msgemm_tables", "msgemm_group_sums", "msgemm_reduce_splits", "dequant_gemv_shfl", "msgemm_mma_x")
#: Operation kinds of the counting build (``msgemm_cuda(..., count=True)``), in the order of
#: ``msgemm_counts`` in msgemm.cu.
COUNT_KINDS = ("table_mul", "table_add", "sum_add", "words", "staged", "lookups", "scale_mul", "zero_mul",
               "reduce_add")
_COUNT_OPTION = "-DMSGEMM_COUNT"


#: Bits per table index in the device layout: 4 where a table has at most 16 entries.
INDEX_BITS = (4, 8)
#: Shapes of msgemm_mma: (row tiles, column tiles of 8) per warp, by column tiles in the call
#: (more than 4: blocks of 4 along N). MT x NT = 4 to 8 keeps the two accumulator sets (8 MT NT
#: floats) in registers; 8 column tiles (1, 8) spilled in the step loop. Beyond 32 columns each
#: block of 32 reads the weights again, but there the two float16 multiplies per weight and
#: column outlast the weight stream anyway.
_MMA_SHAPES = {1: (4, 1), 2: (4, 2), 4: (2, 4)}
_MMA_WARPS = 4
#: How msgemm_mma decodes codes (its FMT): v[c] = c + b; fp4 e2m1 (code = sign, exponent,
#: mantissa); any other codebook of at most 16 values, through a table of float16 hi + lo.
_MMA_AFFINE, _MMA_E2M1, _MMA_TABLE = 0, 1, 2
_E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
#: Default K splits: about this many 4-warp blocks per SM; None: as many as the kernel's
#: registers let one SM hold (``_mma_blocks_per_sm``; ptxas gives the shapes 116-174 registers
#: a thread, so 2-4 blocks). Untimed on a GPU so far: the bench sweeps it.
_MMA_BLOCKS_PER_SM: int | None = None
#: Whether msgemm_mma also asks for the weights MSGEMM_MMA_PREFETCH chunks beyond the next into
#: L2 (more bytes in flight than its registers hold). Untimed on a GPU so far: the bench
#: sweeps it.
_MMA_PREFETCH = True
_REGISTERS_PER_SM = 65536


def _lut_name(n: int, rpt: int, bits: int) -> str:
    return f"msgemm_gemv_lut<{n}, {rpt}, {bits}>"


@functools.lru_cache(maxsize=8)
def kernel_names(rpt: int = _RPT) -> tuple[str, ...]:
    """Every kernel of msgemm.cu, as compiled into one module: the ``extern "C"`` ones and
    ``msgemm_gemv_lut`` for 1 to 8 columns and 4- and 8-bit indices (the compile check in CI
    instantiates the same). ``rpt`` >= 2: a batch's tables then fit 32 KiB of shared memory."""
    if rpt < 2:
        raise ValueError(f"rpt: the LUT kernel needs at least 2 rows per thread, got {rpt}")
    return _PLAIN + tuple(_lut_name(n, _rows_per_thread(n, rpt), b) for b in INDEX_BITS
                          for n in range(1, MAX_COLUMNS + 1)) + tuple(
        _mma_name(*s, f, zp) for f in (_MMA_AFFINE, _MMA_E2M1, _MMA_TABLE) for zp in (False, True)
        for s in _MMA_SHAPES.values())


def _mma_name(mt: int, nt: int, fmt: int, zero_points: bool) -> str:
    return f"msgemm_mma<{mt}, {nt}, {fmt}, {'true' if zero_points else 'false'}>"


def _rows_per_thread(n: int, rpt: int | None = None) -> int:
    """Rows per thread of the LUT kernel for ``n`` columns (``rpt``: the module's setting)."""
    rpt = _RPT if rpt is None else rpt
    return rpt if n <= _RPT_MAX_N else min(rpt, 2)


@dataclass
class DeviceWeights:
    """Weights on the device, laid out for the kernels (see ``cuda/msgemm/msgemm.cu``).

    Attributes
    ----------
    shape : (M, K)
    group_size, depth, levels : int
    bits : int
        Bits per table index: 4 where ``V^d <= 16`` and ``(G/d) % 8 == 0``, else 8.
    idx : cupy.ndarray, shape ((K/d)/(32/bits), M), uint32, or None (``lut=False``)
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
    mma_words : cupy.ndarray or None
        With ``to_device(..., mma=True)``: the codes as tensor-core A fragments for
        :func:`dequant_mma_cuda`, 4 bits a code: (ceil(M/16), ceil(K/64), 32, 4) uint32,
        flattened, and 128 words of padding.
    mma_format : tuple[int, int, float]
        How ``mma_words`` decode, ``(kind, b, vscale)``: kind 0 for a codebook ``v[c] = c + b``,
        1 for fp4 e2m1, 2 through ``mma_codebook``; the kernel's weights are ``v vscale``.
    mma_codebook : cupy.ndarray (16,) uint32 or None
        Kind 2's table: the float16 bits of ``hi | lo << 16``, ``hi + lo = v[c] vscale``.
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
    mma_words: Any = None
    mma_format: tuple[int, int, float] = (0, 0, 1.0)
    mma_codebook: Any = None

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


def to_device(pw: PackedWeights, depth: int | None = None, *, mma: bool = False, lut: bool = True) -> DeviceWeights:
    """Copies ``pw`` to the current CUDA device in the kernels' layout.

    Parameters
    ----------
    pw : PackedWeights
    depth : int, optional
        Table depth ``d``. Needs ``V^d <= 256``, ``d`` dividing the group size and
        ``(G / d) % 4 == 0``. Where ``V^d <= 16`` and ``(G / d) % 8 == 0`` (int4, fp4, nf4 and
        int3 at ``d = 1``, int2 and ternary at ``d = 2``), the indices are stored 8 to a 32-bit
        word instead of 4: tables of at most 16 entries, which the lanes of a warp read without
        shared-memory bank conflicts. Default: the largest such ``d`` if it is at least half
        the format's natural depth (int4, fp4, nf4, int3 at 1, int2 at 2), else the natural
        depth (ternary at 5 where the group size allows it); chosen from H200 timings.
    mma : bool
        Also lay the codes out for :func:`dequant_mma_cuda` (batches on tensor cores; another
        half byte per weight on the device). Needs at most 16 levels (not fp8, int8, uint8) and a group
        size that is a multiple of 16.
    lut : bool
        Lay the codes out for the LUT kernels (:func:`msgemm_cuda`, and
        :func:`dequant_gemv_cuda` for 4-bit formats). ``lut=False, mma=True`` keeps only the
        tensor-core layout: half a byte per weight on the device instead of up to one and a half.
    """
    if not isinstance(pw, PackedWeights):
        raise TypeError(f"pw: expected PackedWeights, got {type(pw).__name__}")
    m, k = pw.shape
    g = pw.group_size
    v = pw.levels
    lut = check_bool(lut, "lut")
    if not (lut or check_bool(mma, "mma")):
        raise ValueError("to_device: lut=False needs mma=True (the weights would have no layout)")
    d = _default_depth(pw) if depth is None else check_int(depth, "depth", min=1, max=8)
    if lut and v**d > 256:
        raise ValueError(f"depth: the GPU kernels need V^d <= 256 (byte indices); V={v}, d={d} gives {v**d}")
    if lut and (g % d or (g // d) % 4):
        raise ValueError(f"depth: the GPU kernels need d | G and (G/d) % 4 == 0; G={g}, d={d}")
    if m >= _MAX_ROWS:  # the LUT kernel's word offsets are 32-bit
        raise ValueError(f"pw: the GPU kernels take fewer than {_MAX_ROWS} rows, got M={m}")
    bits = 4 if _nibble_depth_ok(v, g, d) else 8
    mma_format = _mma_format(pw) if check_bool(mma, "mma") else None
    cp = require()
    values = np.nan_to_num(np.asarray(pw.codebook, np.float32), nan=0.0, posinf=0.0, neginf=0.0)
    values = np.concatenate([values, np.zeros(max(0, 16 - v), np.float32)])  # shfl reads 16 lanes
    packed = None
    if lut and pw.bits_per_weight == 4 and k % 8 == 0 and g % 8 == 0:
        packed = cp.asarray(np.ascontiguousarray(pw.packed))
    return DeviceWeights(
        shape=(m, k),
        group_size=g,
        depth=d,
        levels=v,
        bits=bits,
        idx=cp.asarray(_lut_words(pw, d, bits)) if lut else None,
        values=cp.asarray(values),
        scales_t=cp.asarray(np.ascontiguousarray(np.asarray(pw.scales, dtype=np.float32).T)),
        zeros_t=None if pw.zeros is None else cp.asarray(np.ascontiguousarray(np.asarray(pw.zeros, np.float32).T)),
        k_perm=None if pw.k_perm is None else cp.asarray(np.asarray(pw.k_perm, dtype=np.int64)),
        packed=packed,
        nbytes=pw.nbytes,
        mma_words=None if mma_format is None else cp.asarray(_mma_words(np.asarray(pw.codes, np.uint8))),
        mma_format=(0, 0, 1.0) if mma_format is None else mma_format[:3],
        mma_codebook=None if mma_format is None or mma_format[3] is None else cp.asarray(mma_format[3]),
    )


def _lut_words(pw: PackedWeights, d: int, bits: int) -> np.ndarray:
    """The LUT kernels' table indices, ((K/d)/(32/bits), M) uint32 (layout: msgemm.cu)."""
    m, k = pw.shape
    codes = np.asarray(pw.codes, dtype=np.uint16).reshape(m, k // d, d)
    idx = np.zeros((m, k // d), np.uint16)
    for j in reversed(range(d)):
        idx = idx * pw.levels + codes[:, :, j]
    idx8 = idx.astype(np.uint8)
    if bits == 4:  # tuple 2i in the low nibble of byte i, 2i + 1 in the high one
        idx8 = idx8[:, 0::2] | (idx8[:, 1::2] << 4)
    return np.ascontiguousarray(np.ascontiguousarray(idx8).view("<u4").T)


def _mma_format(pw: PackedWeights) -> tuple[int, int, float, np.ndarray | None]:
    """How msgemm_mma decodes ``pw``'s codes: ``(kind, b, vscale, table)`` (see
    :class:`DeviceWeights`), checking what the tensor-core layout needs."""
    if pw.group_size % 16:
        raise ValueError(f"mma: the tensor-core kernel needs a group size that is a multiple of 16, "
                         f"got {pw.group_size}")
    values = np.asarray(pw.codebook, np.float64)
    if values.size > 16:
        raise ValueError(f"mma: the tensor-core kernel takes codebooks of at most 16 values; format {pw.format!r} "
                         f"has {values.size}")
    if np.array_equal(values, _E2M1):
        return (_MMA_E2M1, 0, 2.0**-13, None)  # decoded as v 2^-14, doubled
    b = values[0]
    if np.array_equal(values, np.arange(values.size) + b) and b == np.floor(b) and -1008 <= b <= 0:
        return (_MMA_AFFINE, int(b), 1.0, None)
    finite = np.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)  # as the LUT kernels read them
    vmax = float(np.abs(finite).max())
    shift = 14 - int(np.frexp(vmax)[1]) if vmax > 0 else 0
    if abs(shift) > 100:  # float16 could not hold them, nor float32 the scaled sums
        raise ValueError(f"mma: the tensor-core kernel takes codebooks whose largest |v| is in [2^-87, 2^114), "
                         f"got {vmax:g}")
    vscale = 2.0**shift
    v = np.zeros(16, np.float64)
    v[:values.size] = finite * vscale
    hi = v.astype(np.float16)
    lo = (v - hi.astype(np.float64)).astype(np.float16)
    table = hi.view(np.uint16).astype(np.uint32) | (lo.view(np.uint16).astype(np.uint32) << 16)
    return (_MMA_TABLE, 0, vscale, table)


def _mma_words(codes: np.ndarray) -> np.ndarray:
    """Codes (M, K) below 16 as msgemm_mma's A fragments: (ceil(M/16), ceil(K/64), 32, 4) uint32
    (layout: msgemm.cu, "Batches on tensor cores"), flattened, then one chunk (32 x 4 words) of
    zeros that the kernel reads ahead into after the last tile."""
    m, k = codes.shape
    mt, ch = -(-m // 16), -(-k // 64)
    c = np.zeros((16 * mt, 64 * ch), np.uint8)
    c[:m, :k] = codes
    # m = 16 tile + 8 half + g; k = 64 chunk + 16 j + 8 r + 2 t + e
    c = c.reshape(mt, 2, 8, ch, 4, 2, 4, 2)
    words = np.zeros((mt, 8, ch, 4, 4), np.uint32)  # (tile, g, chunk, j, t)
    for half in range(2):
        for r in range(2):
            for e in range(2):
                words |= c[:, half, :, :, :, r, :, e].astype(np.uint32) << np.uint32(4 * (half + 2 * r) + 16 * e)
    out = np.zeros(mt * ch * 128 + 128, np.uint32)
    out[:-128] = words.transpose(0, 2, 1, 4, 3).reshape(-1)
    return out


def _depth_ok(v: int, g: int, d: int) -> bool:
    """Whether the kernels take depth ``d``: ``V^d <= 256``, ``d | G`` and ``(G/d) % 4 == 0``."""
    return v**d <= 256 and g % d == 0 and (g // d) % 4 == 0


def _nibble_depth_ok(v: int, g: int, d: int) -> bool:
    """Whether depth ``d`` gives 4-bit table indices: ``V^d <= 16`` and ``(G/d) % 8 == 0``."""
    return v**d <= 16 and g % d == 0 and (g // d) % 8 == 0


def _default_depth(pw: PackedWeights) -> int:
    """The largest depth with 4-bit indices where it is at least half the natural depth, else
    the natural depth; where the group size rules both out, the largest depth with byte
    indices that it allows (int4 in groups of 4: d = 1).

    Measured on an H200 (BENCHMARKS.md, msgemm-gpu), L2-flushed, (28672, 8192): int4 at d = 1
    (4-bit) beat d = 2 (8-bit) at N = 1, 4 and 8 (67 against 89 µs at N = 1); int2 at d = 2
    beat d = 4 (51 against 66 µs at N = 1); ternary at d = 5 (8-bit) beat d = 2 at N = 1 (46
    against 56 µs; at N = 4, 154 against 101). A byte lookup of 256 entries costs about two
    16-entry ones (bank conflicts), so it wins where it covers more than twice the weights."""
    v, g, nat = pw.levels, pw.group_size, pw.natural_depth
    natural_ok = _depth_ok(v, g, nat)
    for d in range(nat, 0, -1):
        if _nibble_depth_ok(v, g, d) and (2 * d >= nat or not natural_ok):
            return d
    if natural_ok:
        return nat
    for d in range(nat, 0, -1):
        if _depth_ok(v, g, d):
            return d
    return nat  # to_device names what rules it out


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


def _xt(pwd: DeviceWeights, x: Any, check: bool = True, max_columns: int | None = MAX_COLUMNS) -> tuple[Any, bool]:
    """X as a (N, K) float32 C-contiguous device array in packed column order; vector flag.
    ``max_columns``: the most columns the caller's kernels take (None: any number)."""
    cp = require()
    xa = cp.asarray(x)
    if xa.dtype.kind != "f":
        raise TypeError(f"x: expected a float array, got dtype {xa.dtype}")
    k = pwd.shape[1]
    if xa.ndim not in (1, 2) or xa.shape[0] != k:
        raise ValueError(f"x: expected shape ({k},) or ({k}, N), got {xa.shape}")
    vector = xa.ndim == 1
    xt = xa.reshape(1, k) if vector else xa.T
    if xt.shape[0] == 0:
        raise ValueError("x: has no columns")
    if max_columns is not None and xt.shape[0] > max_columns:
        raise ValueError(
            f"x: the LUT kernels take 1 to {max_columns} columns, got {xt.shape[0]} (each column is a pass of "
            "lookups: for batches, copy the weights with to_device(pw, mma=True) and use kernel='mma' or "
            "dequant_mma_cuda, on tensor cores)"
        )
    if pwd.k_perm is not None:
        xt = xt[:, pwd.k_perm]
    xt = cp.ascontiguousarray(xt, dtype=cp.float32)
    # After the conversion: a finite float64 beyond float32's range becomes inf here.
    if check and not bool(cp.isfinite(xt).all()):
        raise ValueError("x: contains NaN, infinity, or a value beyond float32's range")
    return xt, vector


def _splits(pwd: DeviceWeights, sm_count: int, rpt: int) -> int:
    """K splits for about ``_BLOCKS_PER_SM`` blocks per SM at ``_RPT`` rows per thread; with fewer
    rows per thread (N > ``_RPT_MAX_N``), proportionally more blocks (H200 sweep, N = 8 at 2
    rows: 316 µs at 4 blocks per SM against 423 at 2)."""
    m = pwd.shape[0]
    groups = pwd.shape[1] // pwd.group_size
    tiles = -(-m // (_ROWS * rpt))
    want = -(-_BLOCKS_PER_SM * max(1, _RPT // rpt) * sm_count // tiles)
    return max(1, min(groups, want))


def _batch_words(n: int, rpt: int, words_per_group: int) -> int:
    """Index words per batch (per row, in registers): the kernel's PWMAX, ``16 / (rpt n)``
    clamped to [1, 8], halved until it divides the group's words (with ``rpt >= 2`` a batch's
    tables take at most 32 KiB of shared memory)."""
    pw = min(8, max(1, 16 // (rpt * n)))
    while words_per_group % pw:
        pw //= 2
    return pw


def _batches_per_chunk(batch_bytes: int, batches_per_split: int) -> int:
    """Batches whose tables are staged together: as many as fit :data:`_CHUNK_BYTES`, spread
    evenly over the split's chunks (at least one batch)."""
    most = max(1, _CHUNK_BYTES // batch_bytes)
    chunks = -(-batches_per_split // most)
    return -(-batches_per_split // chunks)


def msgemm_cuda(pwd: DeviceWeights, x: Any, *, kernel: str = "auto", splits: int | None = None,
                check: bool = True, count: bool = False) -> Any:
    """``Wd @ x`` on the device: through look-up tables, or on tensor cores for batches.

    Parameters
    ----------
    pwd : DeviceWeights
        From :func:`to_device` (``mma=True`` adds the tensor-core layout).
    x : array_like (numpy or cupy), shape (K,) or (K, N), float dtype
    kernel : {"auto", "lut", "mma"}
        ``"lut"``: the look-up-table kernels (table build, LUT GEMV, split reduction), N <= 8.
        ``"mma"``: :func:`dequant_mma_cuda`, any N. ``"auto"``: the LUT kernels up to 8 columns
        where the weights have their layout, else the tensor-core kernel.
    splits : int, optional
        Number of K splits (blocks along K) of the kernel that runs; default: about 2 blocks per
        SM (4 from N = 4) for the LUT kernels, one wave of blocks for the tensor-core kernel
        (whose splits are whole groups: at most K / group_size).
    check : bool
        Check ``x`` for NaN/inf (one device reduction and a host sync; off for timing loops).
    count : bool
        LUT kernels only. Run their counting build (slower; compiled with ``-DMSGEMM_COUNT``)
        and return ``(y, counts)``: ``counts`` maps each of :data:`COUNT_KINDS` to the
        operations the device ran (rows past M not counted): table multiplies and adds,
        group-sum adds, weight words loaded, table floats staged in shared memory, lookups
        (each with its add), scale and zero-point multiplies, and split-reduction adds.

    Returns
    -------
    cupy.ndarray, float32, shape (M,) or (M, N); with ``count=True``, ``(y, counts)``.
    """
    if not isinstance(pwd, DeviceWeights):
        raise TypeError(f"pwd: expected DeviceWeights (from to_device), got {type(pwd).__name__}")
    if not isinstance(kernel, str) or kernel not in KERNELS:
        raise ValueError(f"kernel: expected one of {KERNELS}, got {kernel!r}")
    count = check_bool(count, "count")
    if kernel == "auto":
        shape = x.shape if hasattr(x, "shape") else np.shape(x)
        n = shape[1] if len(shape) == 2 else 1  # the shape itself is checked below
        lut_fits = pwd.idx is not None and n <= _AUTO_LUT_MAX_N
        kernel = "lut" if count or lut_fits or pwd.mma_words is None else "mma"
    if kernel == "mma":
        if count:
            raise ValueError("count: only the LUT kernels count their operations (kernel='lut')")
        return dequant_mma_cuda(pwd, x, splits=splits, check=check)
    if pwd.idx is None:
        hint = "count needs the LUT layout" if count else "kernel='mma' takes them"
        raise ValueError(f"msgemm_cuda: the weights were copied without the LUT layout (to_device(..., lut=False)); "
                         f"{hint}")
    cp = require()
    xt, vector = _xt(pwd, x, check_bool(check, "check"))
    n = xt.shape[0]
    m, k = pwd.shape
    g, d, v, slot, tpg = pwd.group_size, pwd.depth, pwd.levels, pwd.slot, pwd.tuples_per_group
    groups = k // g
    counts = _reset_counts() if count else None
    stride = 1 << pwd.bits  # floats per table in the device layout (a power of two >= slot)
    tables = cp.empty((k // d) * n * stride, cp.float32)
    total = tables.size
    _kernel("msgemm_tables", count)(
        (min(-(-total // 256), 65535),), (256,),
        (xt, pwd.values, np.int32(v), np.int32(d), np.int64(k), np.int32(n), np.int32(slot), np.int32(stride),
         tables),
    )
    sums = cp.zeros(n * groups, cp.float32)
    if pwd.zeros_t is not None:
        _kernel("msgemm_group_sums", count)(
            (-(-(n * groups) // 256),), (256,), (xt, np.int64(k), np.int32(n), np.int32(g), sums)
        )
    sm = _sm_count(cp.cuda.Device().id)
    rpt = _rows_per_thread(n)
    s = _splits(pwd, sm, rpt) if splits is None else check_int(splits, "splits", min=1, max=min(groups, 65535))
    per = -(-groups // s)
    s = -(-groups // per)
    tpw = pwd.tuples_per_word
    qpg = tpg // tpw
    pw = _batch_words(n, rpt, qpg)
    batch_bytes = pw * tpw * n * stride * 4  # <= 32 KiB
    bpc = _batches_per_chunk(batch_bytes, per * (qpg // pw))
    partial = cp.empty((s, n, m), cp.float32)
    zeros = pwd.zeros_t if pwd.zeros_t is not None else np.uint64(0)  # a null pointer
    _kernel(_lut_name(n, rpt, pwd.bits), count)(
        (-(-m // (_ROWS * rpt)), s), (_ROWS,),
        (pwd.idx, tables, pwd.scales_t, zeros, sums, np.int64(m), np.int32(groups), np.int32(qpg), np.int32(pw),
         np.int32(bpc), np.int32(per), partial),
        shared_mem=bpc * batch_bytes,
    )
    y = cp.empty((m, n), cp.float32)
    _kernel("msgemm_reduce_splits", count)(
        (-(-(m * n) // 256),), (256,), (partial, np.int64(m), np.int32(n), np.int32(s), y)
    )
    y = y.reshape(m) if vector else y
    if count:
        return y, dict(zip(COUNT_KINDS, (int(c) for c in cp.asnumpy(counts)), strict=True))
    return y


def linear_cuda(x: Any, pwd: DeviceWeights, bias: Any = None, *, kernel: str = "auto",
                check: bool = True) -> Any:
    """A linear layer ``x @ Wd.T + bias`` on the device, for activations of shape ``(..., K)``.

    Parameters
    ----------
    x : array_like (numpy or cupy), shape (..., K), float dtype, not empty
    pwd : DeviceWeights
        Weights ``(M, K)`` (``nn.Linear.weight`` convention), from :func:`to_device`.
    bias : array_like (numpy or cupy), shape (M,), float dtype, optional
        Added to every output row in float32 after the product (checked finite with ``check``).
    kernel, check
        As in :func:`msgemm_cuda` (the rows of ``x`` are its columns: ``"auto"`` takes the
        tensor-core kernel beyond 8 rows where the weights have its layout).

    Returns
    -------
    cupy.ndarray, float32, shape (..., M), C-contiguous.
    """
    if not isinstance(pwd, DeviceWeights):
        raise TypeError(f"pwd: expected DeviceWeights (from to_device), got {type(pwd).__name__}")
    cp = require()
    xa = cp.asarray(x)
    m, k = pwd.shape
    if xa.ndim == 0 or xa.shape[-1] != k:
        raise ValueError(f"x: expected last dimension K = {k}, got shape {xa.shape}")
    if xa.size == 0:
        raise ValueError(f"x: expected a non-empty array, got shape {xa.shape}")
    b = None
    if bias is not None:
        b = cp.asarray(bias)
        if b.dtype.kind != "f":
            raise TypeError(f"bias: expected a floating-point array, got dtype {b.dtype}")
        if b.shape != (m,):
            raise ValueError(f"bias: expected shape ({m},) (M of the weights), got {b.shape}")
        b = b.astype(cp.float32, copy=False)
        if check_bool(check, "check") and not bool(cp.isfinite(b).all()):
            raise ValueError("bias: contains a non-finite value (NaN, inf, or beyond float32)")
    lead = xa.shape[:-1]
    xb = xa.reshape(-1, k)  # (B, K): X transposed, as the kernels read it (a view where it can be)
    y = msgemm_cuda(pwd, xb.T, kernel=kernel, check=check)  # (M, B)
    y = cp.ascontiguousarray(y.T)
    if b is not None:
        y += b
    return y.reshape(*lead, m)


def dequant_gemv_cuda(pwd: DeviceWeights, x: Any, *, check: bool = True) -> Any:
    """The dense comparator: dequantize in registers (``__shfl_sync`` codebook) and FMA.

    4-bit formats only (``pwd.packed`` present). Same shapes as :func:`msgemm_cuda`.
    """
    if not isinstance(pwd, DeviceWeights):
        raise TypeError(f"pwd: expected DeviceWeights (from to_device), got {type(pwd).__name__}")
    cp = require()
    if pwd.packed is None:
        raise ValueError("dequant_gemv_cuda: needs 4-bit codes with K and G multiples of 8, copied with "
                         "to_device(..., lut=True)")
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


def _mma_blocks_per_sm(kernel: Any) -> int:
    """Blocks of msgemm_mma that one SM holds, from the kernel's registers per thread (CuPy's
    ``num_regs``; allocated 8 at a time); 3 where the kernel does not say (the simulator)."""
    regs = getattr(kernel, "num_regs", None)
    if not regs:
        return 3
    return max(1, _REGISTERS_PER_SM // (-(-int(regs) // 8) * 8 * 32 * _MMA_WARPS))


def dequant_mma_cuda(pwd: DeviceWeights, x: Any, *, splits: int | None = None, check: bool = True) -> Any:
    """``Wd @ x`` for batches, on tensor cores: the 4-bit codes are decoded to float16 in
    registers and multiplied with ``mma.m16n8k16`` (float32 accumulators).

    X is scaled per column by a power of two and split into two float16 parts (``x = hi + lo``
    to about 22 significant bits), each multiplied, so the result is float32-accurate like the
    LUT kernel's (errors of about 1e-6 relative to the sum of |w x|), not float16-accurate; on
    integer data with power-of-two scales it equals the float64 reference bit for bit. Per
    group: ``y += s * (P - z * S)``; K splits added in a fixed order: deterministic.

    Parameters
    ----------
    pwd : DeviceWeights
        From ``to_device(pw, mma=True)`` (codebooks of at most 16 values; group sizes that are
        multiples of 16). int4, uint4, int3, uint3, int2, uint2, ternary and fp4 decode with a
        few bit operations; other codebooks (nf4, custom ones) through a table, as float16
        hi + lo, with a third multiply per weight and column.
    x : array_like (numpy or cupy), shape (K,) or (K, N), any N >= 1, float dtype
    splits : int, optional
        K splits (blocks along K, whole groups each); default: as many blocks as the SMs hold
        at once (from the kernel's registers).
    check : bool
        Check ``x`` for NaN/inf (one device reduction and a host sync; off for timing loops).

    Returns
    -------
    cupy.ndarray, float32, shape (M,) or (M, N).
    """
    if not isinstance(pwd, DeviceWeights):
        raise TypeError(f"pwd: expected DeviceWeights (from to_device), got {type(pwd).__name__}")
    if pwd.mma_words is None:
        raise ValueError("dequant_mma_cuda: the weights have no tensor-core layout; copy them with "
                         "to_device(pw, mma=True)")
    cp = require()
    xt, vector = _xt(pwd, x, check_bool(check, "check"), max_columns=None)
    n = xt.shape[0]
    m, k = pwd.shape
    g = pwd.group_size
    groups = k // g
    row_tiles, chunks = -(-m // 16), -(-k // 64)
    tiles = -(-n // 8)
    mt, nt = _MMA_SHAPES[1 if tiles == 1 else 2 if tiles == 2 else 4]
    n_pad = -(-n // (8 * nt)) * 8 * nt
    steps = g // 16  # k16 steps per group
    unit = 4 // np.gcd(4, steps)  # groups per split come in these units: a split starts on a chunk
    grid_x = -(-row_tiles // (_MMA_WARPS * mt))
    grid_z = n_pad // (8 * nt)
    if grid_z > 65535:  # CUDA's limit on gridDim.z: more columns than one launch takes
        raise ValueError(f"x: {n} columns; dequant_mma_cuda takes at most {65535 * 8 * nt} per call "
                         "(split the columns into several calls)")
    fmt, b, vscale = pwd.mma_format
    if fmt == _MMA_AFFINE and vscale != 1.0:  # the kernel leaves FMT 0's scales as they are
        raise ValueError(f"pwd.mma_format: integer codebooks decode unscaled (vscale 1), got {vscale}")
    offset2 = int(np.array([1024 - b] * 2, np.float16).view(np.uint32)[0])  # FMT 0: float16 1024 - b, twice
    table = pwd.mma_codebook if pwd.mma_codebook is not None else np.uint64(0)
    kernel = _kernel(_mma_name(mt, nt, fmt, pwd.zeros_t is not None))
    if splits is None:
        per_sm = _MMA_BLOCKS_PER_SM or _mma_blocks_per_sm(kernel)
        # At most one wave: one more split than fits would leave a second wave nearly empty.
        want = max(1, per_sm * _sm_count(cp.cuda.Device().id) // (grid_x * grid_z))
    else:
        want = check_int(splits, "splits", min=1, max=min(groups, 65535))
    per = -(-groups // max(1, want))  # groups per split,
    per = -(-per // unit) * unit  # in whole units
    s = -(-groups // per)
    inv = cp.empty(n, cp.float32)  # the columns' inverse scales
    xf = cp.empty((4 * chunks, n_pad // 8, 32, 4), cp.uint32)
    # Zero points need the group sums of the scaled X: the same kernel adds them up.
    sums = cp.empty(n * groups, cp.float32) if pwd.zeros_t is not None else np.uint64(0)  # or a null pointer
    # More than one split: partial results, and a counter per warp tile and block along N, which
    # msgemm_mma_x zeroes: the last warp of a tile's splits adds them up (one split: y directly).
    n_arrivals = grid_x * _MMA_WARPS * grid_z if s > 1 else 0
    partial = cp.empty((s, n, m), cp.float32) if s > 1 else np.uint64(0)
    arrivals = cp.empty(n_arrivals, cp.uint32) if s > 1 else np.uint64(0)
    _kernel("msgemm_mma_x")((n_pad,), (min(1024, 32 * -(-k // 256)),),  # 8+ loads a thread
                            (xt, np.int64(k), np.int32(n), np.int32(n_pad // 8), np.int32(4 * chunks), np.int32(g),
                             inv, xf, sums, arrivals, np.int32(n_arrivals)))
    y = cp.empty((m, n), cp.float32)
    zeros = pwd.zeros_t if pwd.zeros_t is not None else np.uint64(0)
    kernel(
        (grid_x, s, grid_z), (32 * _MMA_WARPS,),
        (pwd.mma_words, xf, pwd.scales_t, zeros, sums, table, np.uint32(offset2), np.float32(vscale), np.int64(m),
         np.int32(chunks), np.int32(n_pad // 8), np.int32(n), np.int32(groups), np.int32(steps), np.int32(per),
         np.int32(bool(_MMA_PREFETCH)), partial, inv, arrivals, y),
    )
    return y.reshape(m) if vector else y
