"""The public API of :mod:`maleki_rs.msgemm` (see the package docstring)."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import _core
from .._util.validate import check_bool, check_choice, check_int

__all__ = [
    "FORMATS",
    "TABLES",
    "BACKENDS",
    "PackedWeights",
    "quantize",
    "msgemm",
    "linear",
    "op_counts",
    "best_depth",
    "model_ratio",
    "available_backends",
    "backend_supports",
    "plan_info",
    "codebook",
]

_m = _core.msgemm

#: Every weight format (spec section 3).
FORMATS: tuple[str, ...] = tuple(_m.FORMATS)
#: Table precisions: ``"i8"`` (fast), ``"i16"`` (exact integer), ``"f32"`` (float32), and
#: ``"bf16"`` (no tables: bfloat16 weights and activations, float32 sums; see :func:`msgemm`).
TABLES: tuple[str, ...] = ("i8", "i16", "f32", "bf16")
#: Kernel choices.
BACKENDS: tuple[str, ...] = ("auto", "avx512", "amx", "avx2", "neon", "scalar", "reference")


def _float_array(x: Any, name: str, ndims: tuple[int, ...], *, integers: bool = False,
                 allow_empty: bool = False) -> np.ndarray:
    """``x`` as a float ndarray (any float dtype, any order), checked for ndim and emptiness.

    ``integers``: integer arrays (and lists of ints) are taken too, as their float32 values
    (exact for ``|v| <= 2^24``, rounded to the nearest float32 beyond); booleans are refused,
    as :func:`maleki_rs._util.validate.as_float_array` refuses them. ``allow_empty``: arrays
    with a zero-length axis are returned (the caller checks which axis may be empty)."""
    if x is None:
        raise TypeError(f"{name}: expected a float array, got None")
    arr = np.asarray(x)
    if arr.dtype.kind != "f":
        if integers and arr.dtype.kind in "iu":
            arr = arr.astype(np.float32)
        elif arr.dtype.name == "bfloat16":
            # bfloat16 (ml_dtypes, as JAX and LLM checkpoints use it): every value is a float32 one.
            arr = arr.astype(np.float32)
        else:
            kinds = "float16/32/64, ml_dtypes bfloat16 or integers" if integers else \
                "float16/32/64 or ml_dtypes bfloat16"
            hint = " (booleans are refused: pass x.astype(np.float32))" if arr.dtype.kind == "b" else ""
            raise TypeError(f"{name}: expected a floating-point array ({kinds}), got dtype {arr.dtype}{hint}")
    if arr.ndim not in ndims:
        want = (f"{ndims[0]}-D to {ndims[-1]}-D" if len(ndims) > 2 and ndims == tuple(range(ndims[0], ndims[-1] + 1))
                else " or ".join(f"{d}-D" for d in ndims))
        raise ValueError(f"{name}: expected a {want} array, got shape {arr.shape}")
    if arr.size == 0 and not allow_empty:
        raise ValueError(f"{name}: expected a non-empty array, got shape {arr.shape}")
    return arr


def _non_finite(arr: np.ndarray, name: str) -> ValueError | None:
    """The error naming the first NaN / inf of ``arr`` (its index in ``arr``), or None."""
    if np.isfinite(arr).all():
        return None
    bad = tuple(int(i) for i in np.argwhere(~np.isfinite(arr))[0])
    return ValueError(f"{name}: contains a non-finite value (NaN, inf, or beyond float32) at index {bad}")


def _check_finite32(arr: np.ndarray, name: str) -> None:
    err = _non_finite(arr, name)
    if err is not None:
        raise err


def _to_f32(arr: np.ndarray) -> np.ndarray:
    """``arr`` as float32, C order, aligned, native byte order (values beyond float32 become
    inf); no copy when it already is."""
    if arr.dtype == np.float32 and arr.flags.c_contiguous and arr.flags.aligned and arr.dtype.isnative:
        return arr  # the common case, without np.require's and np.errstate's ~1.5 us per call
    with np.errstate(over="ignore"):
        return np.require(arr, np.float32, "CA")


#: The most tuples per group whose int32 partial sums cannot overflow, by table precision (the
#: core's plan): ``i8``: chunks of 64 tuples summing to at most ``127 * 258`` each
#: (``maleki_msgemm::plan::I8_MAX_TUPLES``); ``i16``: one entry of at most 32767 per tuple.
_TUPLE_LIMITS: dict[str, int] = {"i8": (2**31 - 1) // (127 * 258) * 64, "i16": (2**31 - 1) // 32767}


def _group_limit_error(e: ValueError, pw: PackedWeights, depth: int | None) -> ValueError | None:
    """The error to raise for the core's refusal of a group too long for the int32 partial
    sums of its ``i8`` or ``i16`` tables (its message names the table), or None for another
    error. The core raises a plain ValueError, so its message is what tells them apart."""
    msg = str(e)
    if "table='i8': group too long for int32 partial sums" in msg:
        tbl = "i8"
    elif "table='i16':" in msg and "tuples per group could overflow the int32 partial sums" in msg:
        tbl = "i16"
    else:
        return None
    limit = _TUPLE_LIMITS[tbl]
    if depth is not None:
        at = f"at depth {depth}: at most {limit * depth:,} inputs per group"
    else:
        at = (f"at depth d: at most {limit:,} x d inputs per group, {limit * pw.max_depth:,} at {pw.format}'s "
              f"largest depth {pw.max_depth}")
    return ValueError(f"pw: groups of {pw.group_size:,} inputs are too long for table={tbl!r}, whose int32 partial "
                      f"sums take at most {limit:,} tuples of d inputs per group ({at}): use table='f32', or "
                      "quantize with a smaller group_size")


def _checked_by_core(x32: np.ndarray, pw: PackedWeights, depth: int | None, f: Any, *args: Any) -> Any:
    """``f(*args)``: a core call that checks ``x`` itself (for NaN / inf, with the GIL released:
    ~6 us per GEMV less than numpy's ``isfinite`` here) and its result (float32 overflow). A
    non-finite ``x`` is re-raised naming its index in the user's array ``x32``; a group too
    long for the tables' int32 sums (``pw`` at ``depth``, None: auto) says the limit."""
    try:
        return f(*args)
    except ValueError as e:
        err = _non_finite(x32, "x") if "non-finite" in str(e) else _group_limit_error(e, pw, depth)
        if err is None:
            raise
    raise err from None


def _check_out(out: Any, want: tuple[int, ...]) -> None:
    """Checks a user's ``out`` array: float32, shape ``want``, writeable, aligned, C order."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out: expected a numpy array, got {type(out).__name__}")
    if out.dtype != np.float32:
        raise TypeError(f"out: expected dtype float32, got {out.dtype}")
    if out.shape != want:
        raise ValueError(f"out: expected shape {want}, got {out.shape}")
    if not out.flags.c_contiguous or not out.flags.writeable or not out.flags.aligned:
        raise ValueError("out: must be a writeable, aligned, C-contiguous array")


def _as_f32(arr: np.ndarray, name: str) -> np.ndarray:
    out = _to_f32(arr)
    _check_finite32(out, name)
    return out


def _opt_f32_2d(x: Any, name: str, shape: tuple[int, int]) -> np.ndarray | None:
    if x is None:
        return None
    arr = _float_array(x, name, (2,))
    if arr.shape != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {arr.shape}")
    return _as_f32(arr, name)


def _int_array(x: Any, name: str, ndims: tuple[int, ...], dtype: Any) -> np.ndarray:
    if x is None:
        raise TypeError(f"{name}: expected an integer array, got None")
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected an integer array, got dtype {arr.dtype}")
    if arr.ndim not in ndims:
        raise ValueError(f"{name}: expected a {' or '.join(f'{d}-D' for d in ndims)} array, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name}: expected a non-empty array")
    info = np.iinfo(dtype)
    if arr.min() < info.min or arr.max() > info.max:
        # int32 tensors holding uint32 bit patterns are the norm for GPTQ/AWQ: reinterpret.
        if np.dtype(dtype) == np.int32 and arr.dtype.kind == "u" and arr.dtype.itemsize == 4:
            return np.require(arr, np.uint32, "CA").view(np.int32)
        raise ValueError(f"{name}: values must lie in [{info.min}, {info.max}]")
    if np.dtype(dtype) == np.int32 and arr.dtype.kind == "u" and arr.dtype.itemsize == 4:
        return np.require(arr, np.uint32, "CA").view(np.int32)
    return np.require(arr, dtype, "CA")


def _check_format(format: Any, codebook: Any) -> tuple[str, list[float] | None]:
    if not isinstance(format, str):
        raise TypeError(f"format: expected a string, got {type(format).__name__}")
    check_choice(format, "format", FORMATS)
    if format == "codebook":
        if codebook is None:
            raise ValueError("codebook: format='codebook' needs codebook=<2 to 16 values>")
        raw = np.asarray(codebook)
        if raw.dtype.kind in "iu":
            # Integer values (llama.cpp's IQ4_NL codebook is 16 integers): exact in float32
            # up to 2^24.
            if raw.size and np.abs(raw.astype(np.float64)).max() > 2**24:
                raise ValueError("codebook: integer values beyond 2^24 are not exact in float32")
            raw = raw.astype(np.float32)
        elif raw.dtype.kind != "f" and raw.dtype.name != "bfloat16":
            raise TypeError(f"codebook: expected numbers (a float or integer array), got dtype {raw.dtype}")
        cb = _float_array(raw, "codebook", (1,))
        if not (2 <= cb.size <= 16):
            raise ValueError(f"codebook: needs 2 to 16 values, got {cb.size}")
        cb32 = _as_f32(cb, "codebook")
        if len(np.unique(cb32)) != cb32.size:
            raise ValueError("codebook: values must be distinct (after rounding to float32)")
        return format, [float(v) for v in cb32]
    if codebook is not None:
        raise ValueError(f"codebook: only accepted with format='codebook', not {format!r}")
    return format, None


def _check_group_size(group_size: Any, k: int) -> int | None:
    if group_size is None or (isinstance(group_size, numbers.Integral) and not isinstance(group_size, bool)
                              and int(group_size) == -1):
        return None
    g = check_int(group_size, "group_size", min=1)
    if k % g != 0:
        raise ValueError(f"group_size: must divide K = {k} (pad K with zero weights otherwise), got {g}")
    return g


class PackedWeights:
    """Low-bit weights ``Wd`` of shape ``(M, K)``: ``Wd[m, k] = s[m, g] * (v[q[m, k]] - z[m, g])``.

    Built by :func:`quantize` or the loaders (:meth:`from_arrays`, :meth:`from_gptq`,
    :meth:`from_awq`, :meth:`from_matmulnbits`, :meth:`from_fp8`, :meth:`from_gguf`);
    immutable; picklable.
    Holds the canonical packed bytes (little-endian bit streams along K, one byte-aligned row
    per output feature) plus, built on first use and cached, the kernel tile layout of each
    depth used.

    Attributes
    ----------
    shape : tuple of int
        ``(M, K)``: output features, input features.
    format : str
        One of :data:`FORMATS`.
    group_size : int
        Inputs per scale ``G`` (``K`` for per-channel scales).
    codebook : ndarray, shape (V,), float32
        Value of each code (fp8: NaN/inf at the codes that encode them; never present).
    scales : ndarray, shape (M, K // G), float32
    scale_dtype : numpy dtype
        ``float16`` when every scale is a float16 value (the kernels then read them as
        float16, with the same results), else ``float32``.
    zeros : ndarray, shape (M, K // G), float32, or None
        Zero points in value units (read as float16 where every one is a float16 value, as
        integer zero points are).
    k_perm : ndarray, shape (K,), uint32, or None
        Act-order weights: packed column ``j`` is input ``k_perm[j]`` (handled internally:
        ``dequantize`` and :func:`msgemm` use the original input order).
    nbytes : int
        Bytes of packed codes + scales + zero points (4 bytes per scale and zero point, the
        canonical float32 form).
    cache_nbytes : int
        Bytes held on top of ``nbytes`` by caches built on first use (see
        :meth:`clear_cache`).
    """

    __slots__ = ("_raw", "_cache", "_shape", "__weakref__")

    def __init__(self, raw: Any) -> None:
        if not isinstance(raw, _m.Packed):
            raise TypeError("PackedWeights is built by quantize() or PackedWeights.from_* constructors")
        self._raw = raw
        self._cache: dict[str, Any] = {}
        # Kept as a tuple: every call reads it, and two reads from the core cost ~0.3 us.
        self._shape = (int(raw.m), int(raw.k))

    def _cached(self, key: str, make: Any) -> Any:
        # The local value is returned, not a second look-up: another thread may clear the
        # cache in between (clear_cache).
        try:
            return self._cache[key]
        except KeyError:
            value = make()
            if isinstance(value, np.ndarray):
                value.flags.writeable = False
            self._cache[key] = value
            return value

    # -- properties ---------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        return self._shape

    @property
    def format(self) -> str:
        return str(self._raw.format)

    @property
    def group_size(self) -> int:
        return int(self._raw.group_size)

    @property
    def levels(self) -> int:
        """Number of codebook levels V."""
        return int(self._raw.levels)

    @property
    def natural_depth(self) -> int:
        """The depth whose table index is the stored byte (int4 2, int2 4, ternary 5; fp8, int8,
        uint8 1)."""
        return int(self._raw.natural_depth)

    @property
    def max_depth(self) -> int:
        """The deepest tables accepted (``V^d <= 65536``; fp8, int8, uint8: 1)."""
        return int(self._raw.max_depth)

    @property
    def bits_per_weight(self) -> float:
        """Storage bits per code (4, 3, 2, 1.6 or 8), scales excluded."""
        return float(self._raw.bits_per_weight)

    @property
    def codebook(self) -> npt.NDArray[np.float32]:
        return self._cached("codebook", self._raw.codebook)

    @property
    def scales(self) -> npt.NDArray[np.float32]:
        """Scales, shape ``(M, K // group_size)`` float32."""
        return self._cached("scales", self._raw.scales)

    @property
    def scale_dtype(self) -> np.dtype:
        """``float16`` when every scale is a float16 value (GPTQ, AWQ and ONNX Runtime
        scales, MX scales in float16's range, ``quantize(..., scale_dtype=np.float16)``): the
        kernels then read the scales as float16, half the bytes, with the same results.
        ``float32`` otherwise. :attr:`scales` is float32 either way."""
        return np.dtype(np.float16 if self._cached("scales_are_f16", lambda: self._raw.scales_are_f16) else np.float32)

    @property
    def zeros(self) -> npt.NDArray[np.float32] | None:
        return self._cached("zeros", self._raw.zeros)

    @property
    def k_perm(self) -> npt.NDArray[np.uint32] | None:
        return self._cached("k_perm", self._raw.k_perm)

    @property
    def packed(self) -> npt.NDArray[np.uint8]:
        """Canonical packed codes, shape ``(M, row_bytes)`` uint8 (packed column order)."""
        return self._cached("packed", self._raw.packed)

    @property
    def codes(self) -> npt.NDArray[np.uint8]:
        """Unpacked codes, shape ``(M, K)`` uint8, in packed column order (a new copy)."""
        return self._raw.codes()

    @property
    def nbytes(self) -> int:
        return int(self._raw.nbytes)

    @property
    def cache_nbytes(self) -> int:
        """Bytes held on top of :attr:`nbytes` by caches built on first use: the kernels' tile
        layouts of the depths and kernels used (a 4-bit format at its natural depth: about as
        many bytes as its packed codes; the dense ``i16`` path's layout likewise), tiled scales and
        zero points, and the read-only arrays
        that the properties above return. :meth:`clear_cache` releases them."""
        arrays = sum(v.nbytes for v in list(self._cache.values()) if isinstance(v, np.ndarray))
        return int(self._raw.cache_bytes) + arrays

    def clear_cache(self) -> PackedWeights:
        """Releases what :attr:`cache_nbytes` counts, e.g. for weights used once in a while in
        a process short of memory (the packed weights themselves are not copied). Results do
        not change; the next call rebuilds what it reads, as the first call did
        (:meth:`prepare` does it ahead of time). Calls running in other threads keep the
        caches they started with until they return. Returns ``self``."""
        self._cache.clear()
        self._raw.clear_cache()
        return self

    @property
    def mirror(self) -> tuple[str, float] | None:
        """``(involution, shift)`` of the codebook's mirror symmetry, or None."""
        return self._raw.mirror

    # -- methods --------------------------------------------------------------------------
    def to_device(self, depth: int | None = None, *, mma: bool = False, lut: bool = True) -> Any:
        """These weights on the current CUDA device, for :func:`maleki_rs.msgemm.cuda.msgemm_cuda`
        (and with ``mma=True`` for :func:`maleki_rs.msgemm.cuda.dequant_mma_cuda`; ``lut=False``
        leaves out the LUT layout; same as
        :func:`maleki_rs.msgemm.cuda.to_device`; needs CuPy and a GPU)."""
        from .cuda import to_device

        return to_device(self, depth, mma=mma, lut=lut)

    def dequantize(self, dtype: npt.DTypeLike = np.float64, *, out: np.ndarray | None = None) -> np.ndarray:
        """The dense weight ``Wd``, shape ``(M, K)``, in the original input order.

        Evaluated in float64 (``s * (v[q] - z)``) and rounded once to ``dtype`` (a float
        dtype). Rows are dequantized in parallel with one float64 table of the ``V`` values
        per row and group; ``float32`` is written directly (the same bits as the float64
        result cast to float32, half the memory traffic). ml_dtypes ``bfloat16``: the float64
        result rounded once to bfloat16 by ml_dtypes' cast (to nearest, ties to even; not
        through float32, which would round twice), so it holds 8 bytes per weight while it
        runs. float16 and bfloat16 results are inf where a weight is beyond their range
        (float16: 65504; bfloat16: from ``2^128 - 2^119``, about 3.3961e38).

        Parameters
        ----------
        dtype : float dtype or ml_dtypes bfloat16
            Result dtype (default float64).
        out : ndarray, optional
            A writeable C-contiguous float32 or float64 array of shape ``(M, K)`` to write
            into (then ``dtype`` is ignored); saves the allocation when dequantizing repeatedly.
        """
        if out is not None:
            if not isinstance(out, np.ndarray):
                raise TypeError(f"out: expected a numpy array, got {type(out).__name__}")
            if out.dtype not in (np.float32, np.float64):
                raise TypeError(f"out: expected dtype float32 or float64, got {out.dtype}")
            if out.shape != self.shape:
                raise ValueError(f"out: expected shape {self.shape}, got {out.shape}")
            if not out.flags.c_contiguous or not out.flags.writeable or not out.flags.aligned:
                raise ValueError("out: must be a writeable, aligned, C-contiguous array")
            (self._raw.dequantize_into_f32 if out.dtype == np.float32 else self._raw.dequantize_into_f64)(out)
            return out
        try:
            dt = np.dtype(dtype)
        except TypeError as e:
            raise TypeError(f"dtype: expected a float dtype, got {dtype!r}") from e
        if dt.kind != "f" and dt.name != "bfloat16":
            raise TypeError(f"dtype: expected a float dtype (float16/32/64 or ml_dtypes bfloat16), got {dt}")
        # numpy allocates the output (large arrays get huge pages: fewer page faults).
        w = np.empty(self.shape, np.float32 if dt == np.float32 else np.float64)
        if dt == np.float32:
            self._raw.dequantize_into_f32(w)
            return w
        self._raw.dequantize_into_f64(w)
        return w if dt == np.float64 else w.astype(dt)

    def prepare(self, depth: int | None = None, *, table: str | None = None) -> PackedWeights:
        """Builds what a ``msgemm`` call with ``table`` (default backend) reads (kernel tile
        layout of ``depth``, or the dense ``i16`` layout, tiled scales and zero points, the
        codes used) ahead of the first call. ``depth`` defaults to the depth a GEMV with that
        ``table`` resolves to (:func:`plan_info`). ``table=None``: what calls with the default
        table read, the GEMV's (the ``i8`` tables' layout, or the dense layout where GEMVs run
        on the dense ``i16`` path) and, where batches run on the dense ``i16`` path or in
        ``bf16`` mode (see :func:`msgemm`'s ``table``), the dense layout too.
        ``table="bf16"``: the dense layout only. Returns ``self``."""
        d = None if depth is None else check_int(depth, "depth", min=1, max=self.max_depth)
        if table is not None and (not isinstance(table, str) or table not in TABLES):
            raise ValueError(f"table: must be one of 'i8', 'i16', 'f32', 'bf16'; got {table!r}")
        try:
            self._raw.prepare(d, "auto" if table is None else table)
        except ValueError as e:
            err = _group_limit_error(e, self, d)
            if err is None:
                raise
            raise err from None
        return self

    def to_matmulnbits(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """ONNX Runtime ``MatMulNBits`` tensors ``(B, scales, zero_points or None)``.

        ``B`` is ``(M, K // G, G * bits // 8)`` uint8, ``scales`` ``(M * K // G,)`` float32,
        ``zero_points`` packed uint8 (absent for int4/int2 without zero points). For
        int4/uint4/int2/uint2 weights with integer zero points.
        """
        b, s, z = self._raw.to_matmulnbits()
        return b, s, z

    def __repr__(self) -> str:
        m, k = self.shape
        zp = ", zero points" if self.zeros is not None else ""
        zp += ", float16 scales" if self.scale_dtype == np.float16 else ""
        perm = ", act-order" if self.k_perm is not None else ""
        return (f"PackedWeights(shape=({m}, {k}), format={self.format!r}, group_size={self.group_size}"
                f"{zp}{perm}, nbytes={self.nbytes})")

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        codebook = self.codebook.tolist() if self.format == "codebook" else None
        # Fresh arrays from the core, not the cached ones: pickling leaves no copy behind.
        raw = self._raw
        return (_restore, (self.format, codebook, self.shape[1], raw.packed(), raw.scales(),
                           raw.zeros(), raw.k_perm()))

    # -- constructors ---------------------------------------------------------------------
    @classmethod
    def from_arrays(
        cls,
        codes: npt.ArrayLike,
        scales: npt.ArrayLike,
        zeros: npt.ArrayLike | None = None,
        *,
        format: str = "int4",
        codebook: npt.ArrayLike | None = None,
        k_perm: npt.ArrayLike | None = None,
    ) -> PackedWeights:
        """Packs given codes.

        Parameters
        ----------
        codes : array_like, shape (M, K), integer
            Codes in ``0..V-1`` (fp8: finite encodings only).
        scales : array_like, shape (M, K // G), float
            One scale per group of ``G`` consecutive inputs.
        zeros : array_like, shape (M, K // G), float, optional
            Zero points in value units (``Wd = s * (v[q] - z)``).
        format : str
            One of :data:`FORMATS`.
        codebook : array_like, shape (V,), optional
            The values of ``format='codebook'`` (2 to 16 distinct values).
        k_perm : array_like, shape (K,), optional
            Act-order: column ``j`` of ``codes`` is input ``k_perm[j]``.
        """
        fmt, cb = _check_format(format, codebook)
        c = _int_array(codes, "codes", (2,), np.uint8)
        m, k = c.shape
        sc = _float_array(scales, "scales", (2,))
        if sc.shape[0] != m or sc.shape[1] == 0 or k % sc.shape[1] != 0:
            raise ValueError(f"scales: expected shape ({m}, K // G) with K // G dividing K = {k}, got {sc.shape}")
        sc32 = _as_f32(sc, "scales")
        z = _opt_f32_2d(zeros, "zeros", sc.shape)
        p = None if k_perm is None else _int_array(k_perm, "k_perm", (1,), np.uint32)
        return cls(_m.Packed.from_codes(c, sc32, z, fmt, cb, p))

    @classmethod
    def from_gptq(
        cls,
        qweight: npt.ArrayLike,
        qzeros: npt.ArrayLike,
        scales: npt.ArrayLike,
        g_idx: npt.ArrayLike | None = None,
        *,
        bits: int = 4,
        group_size: int | None = None,
        zero_offset: int = 1,
    ) -> PackedWeights:
        """Loads GPTQ tensors (AutoGPTQ / transformers / optimum layout).

        Parameters
        ----------
        qweight : array_like, shape (K * bits // 32, M), int32
            Codes packed along K, low bits first (3 bits: a continuous bit stream).
        qzeros : array_like, shape (groups, M * bits // 32), int32
            Zero points packed along M.
        scales : array_like, shape (groups, M), float16/float32
        g_idx : array_like, shape (K,), optional
            Group of every input (act-order checkpoints); the inputs are permuted into group
            order once, here, and :func:`msgemm` permutes ``x`` to match.
        bits : {2, 3, 4}
        group_size : int, optional
            Needed without ``g_idx`` when ``groups > 1`` (default ``K // groups``). With ``g_idx``
            it is checked: every group must then hold ``group_size`` inputs. ``-1`` (the
            per-channel setting of GPTQ configs) is the same as the default.
        zero_offset : int
            Added to the stored zero points: 1 for the classic GPTQ format (stores ``z - 1``),
            0 for ``gptq_v2`` checkpoints.
        """
        b = check_int(bits, "bits", min=2, max=4)
        qw = _int_array(qweight, "qweight", (2,), np.int32)
        qz = _int_array(qzeros, "qzeros", (2,), np.int32)
        sc = _as_f32(_float_array(scales, "scales", (2,)), "scales")
        gi = None if g_idx is None else _int_array(g_idx, "g_idx", (1,), np.int32)
        if (qw.shape[0] * 32) % b:
            raise ValueError(f"qweight: {qw.shape[0]} rows of 32-bit words do not hold a whole number of "
                             f"{b}-bit codes per column (expected K * {b} / 32 rows); is bits={b} right?")
        k = qw.shape[0] * 32 // b
        m = qw.shape[1]
        if sc.shape[1] != m:
            raise ValueError(f"scales: expected shape (groups, {m}) (M = qweight.shape[1]), got {sc.shape}")
        if (m * b) % 32 == 0 and qz.shape != (sc.shape[0], m * b // 32):
            raise ValueError(f"qzeros: expected shape ({sc.shape[0]}, {m * b // 32}) (groups, M * bits / 32), "
                             f"got {qz.shape}")
        # -1: GPTQ configs' per-channel setting, one group per row (as None derives it).
        per_channel = isinstance(group_size, numbers.Integral) and not isinstance(group_size, bool) and group_size == -1
        g = None if group_size is None or per_channel else check_int(group_size, "group_size", min=1)
        if g is None and gi is None:
            g = k // sc.shape[0] if sc.shape[0] and k % sc.shape[0] == 0 else None
        if g is not None and gi is not None and gi.size == k and gi.min() >= 0:
            sizes = np.bincount(gi)
            if not (sizes == g).all():
                raise ValueError(f"group_size: g_idx puts {sizes.min()} to {sizes.max()} inputs in a group, "
                                 f"not group_size = {g}")
        zo = check_int(zero_offset, "zero_offset", min=-16, max=16)
        return cls(_m.Packed.from_gptq(qw, qz, sc, gi, b, g, zo))

    @classmethod
    def from_awq(cls, qweight: npt.ArrayLike, qzeros: npt.ArrayLike, scales: npt.ArrayLike, *,
                 group_size: int) -> PackedWeights:
        """Loads AutoAWQ GEMM tensors (4 bits).

        ``qweight`` ``(K, M // 8)`` int32 and ``qzeros`` ``(K // G, M // 8)`` int32 pack 8
        output features per word in AWQ's order ``[0, 2, 4, 6, 1, 3, 5, 7]``; ``scales`` is
        ``(K // G, M)``.
        """
        qw = _int_array(qweight, "qweight", (2,), np.int32)
        qz = _int_array(qzeros, "qzeros", (2,), np.int32)
        sc = _as_f32(_float_array(scales, "scales", (2,)), "scales")
        g = check_int(group_size, "group_size", min=1)
        k, mw = qw.shape
        if k % g:
            raise ValueError(f"group_size: K = {k} (qweight.shape[0]) is not a multiple of group_size = {g}")
        if qz.shape != (k // g, mw):
            raise ValueError(f"qzeros: expected shape ({k // g}, {mw}) (K / group_size, M / 8), got {qz.shape}")
        if sc.shape != (k // g, 8 * mw):
            raise ValueError(f"scales: expected shape ({k // g}, {8 * mw}) (K / group_size, M), got {sc.shape}")
        return cls(_m.Packed.from_awq(qw, qz, sc, g))

    @classmethod
    def from_matmulnbits(
        cls,
        B: npt.ArrayLike,
        scales: npt.ArrayLike,
        zero_points: npt.ArrayLike | None = None,
        *,
        K: int,
        bits: int = 4,
        block_size: int,
    ) -> PackedWeights:
        """Loads an ONNX Runtime ``MatMulNBits`` weight (``com.microsoft`` domain).

        Parameters
        ----------
        B : array_like, shape (N, k_blocks, block_size * bits // 8), uint8
            Codes along K, low bits first (``N`` = output features = our ``M``).
        scales : array_like, shape (N * k_blocks,), float16/float32
        zero_points : array_like, optional
            uint8 ``(N * ceil(k_blocks * bits / 8),)`` packed codes, or float ``(N * k_blocks,)``;
            absent: ``2^(bits-1)`` (then the weights are int4/int2).
        K : int
            Input features (``k_blocks * block_size``; padded tail blocks are not supported).
        bits : {2, 4}
        block_size : int
            Power of two >= 16.
        """
        b = _int_array(B, "B", (3,), np.uint8)
        k = check_int(K, "K", min=1)
        nb = check_int(bits, "bits", min=2, max=4)
        bs = check_int(block_size, "block_size", min=1)
        n = b.shape[0]
        kb = k // bs
        if k % bs == 0 and nb in (2, 4) and (bs * nb) % 8 == 0 and b.shape != (n, kb, bs * nb // 8):
            raise ValueError(f"B: expected shape ({n}, {kb}, {bs * nb // 8}) (N, K / block_size, "
                             f"block_size * bits / 8), got {b.shape}")

        def flat(a: np.ndarray, name: str, per_row: int) -> np.ndarray:
            # ONNX Runtime stores these 1-D; some exporters keep them (N, per_row).
            if a.shape not in ((n * per_row,), (n, per_row)):
                raise ValueError(f"{name}: expected shape ({n * per_row},) or ({n}, {per_row}), got {a.shape}")
            return a.reshape(-1)

        sc = _as_f32(flat(_float_array(scales, "scales", (1, 2)), "scales", kb), "scales")
        zp_u8 = zp_f = None
        if zero_points is not None:
            zarr = np.asarray(zero_points)
            if zarr.dtype.kind == "f" or zarr.dtype.name == "bfloat16":
                zp_f = _as_f32(flat(_float_array(zarr, "zero_points", (1, 2)), "zero_points", kb), "zero_points")
            else:
                zarr = _int_array(zarr, "zero_points", (1, 2), np.uint8)
                zp_u8 = flat(zarr, "zero_points", -(-kb * nb // 8))
        return cls(_m.Packed.from_matmulnbits(b, sc, k, nb, bs, zp_u8, zp_f))

    @classmethod
    def from_fp8(cls, weight: npt.ArrayLike, scale: npt.ArrayLike, *, format: str | None = None,
                 block: tuple[int, int] | None = None) -> PackedWeights:
        """Loads an fp8 checkpoint tensor and its scales (``Wd = weight * scale``).

        Parameters
        ----------
        weight : array_like, shape (M, K)
            ml_dtypes ``float8_e4m3fn`` (OCP E4M3, the checkpoints' ``torch.float8_e4m3fn``)
            or ``float8_e5m2``, or their bytes (uint8 / int8, e.g. ``t.view(torch.uint8)``)
            with ``format`` given. NaN encodings are refused.
        scale : array_like, float
            What the weights are multiplied by (DeepSeek-V3's ``weight_scale_inv``,
            compressed-tensors' ``weight_scale``): a scalar (per tensor), shape (M,) or (M, 1)
            (per row), (M, K // G) (groups of G inputs), or with ``block=(bm, bk)`` one per
            block of ``bm`` rows and ``bk`` inputs, shape (ceil(M / bm), K // bk).
        format : {"fp8_e4m3", "fp8_e5m2"}, optional
            Needed for bytes; checked against an ml_dtypes array.
        block : (int, int), optional
            The block shape of 2-D block scales (DeepSeek-V3: (128, 128)); ``bk`` must divide
            K. Stored as groups of ``bk`` inputs, each row with its block's scale.

        Calls on such weights run on the fp8 path (:func:`msgemm`'s ``table``: float32 sums,
        no tables) where the CPU has it.
        """
        fp8 = {"float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}
        if format is not None:
            check_choice(format, "format", tuple(fp8.values()))
        w = np.asarray(weight)
        if w.dtype.name in fp8:
            if format is not None and format != fp8[w.dtype.name]:
                raise ValueError(f"format: {format!r} does not match the weights' dtype {w.dtype.name}")
            fmt = fp8[w.dtype.name]
            w = np.ascontiguousarray(w).view(np.uint8)
        elif w.dtype in (np.uint8, np.int8):
            if format is None:
                raise ValueError("format: needed for fp8 weights given as bytes ('fp8_e4m3' or 'fp8_e5m2')")
            fmt = format
            w = np.ascontiguousarray(w).view(np.uint8)
        else:
            raise TypeError(f"weight: expected ml_dtypes float8_e4m3fn / float8_e5m2 or their bytes (uint8), "
                            f"got dtype {w.dtype}")
        if w.ndim != 2 or w.size == 0:
            raise ValueError(f"weight: expected a non-empty 2-D array, got shape {w.shape}")
        m, k = w.shape
        sc = np.asarray(scale)
        if sc.dtype.kind != "f" and sc.dtype.name != "bfloat16":
            raise TypeError(f"scale: expected a float array or scalar, got dtype {sc.dtype}")
        sc = sc.astype(np.float32)
        if block is not None:
            if not isinstance(block, (tuple, list)) or len(block) != 2:
                raise TypeError(f"block: expected a pair (rows, inputs), got {block!r}")
            bm = check_int(block[0], "block[0]", min=1)
            bk = check_int(block[1], "block[1]", min=1)
            if k % bk:
                raise ValueError(f"block: {bk} inputs per block must divide K = {k} (groups cannot be ragged)")
            want = (-(-m // bm), k // bk)
            if sc.shape != want:
                raise ValueError(f"scale: expected shape {want} for blocks of {(bm, bk)} and weights of shape "
                                 f"{(m, k)}, got {sc.shape}")
            sc = np.repeat(sc, bm, axis=0)[:m]
        elif sc.ndim == 0 or sc.size == 1:
            sc = np.full((m, 1), sc.reshape(()), np.float32)
        elif sc.shape in ((m,), (m, 1)):
            sc = sc.reshape(m, 1)
        elif sc.ndim != 2 or sc.shape[0] != m or k % sc.shape[1]:
            raise ValueError(f"scale: expected a scalar, shape ({m},), ({m}, 1) or ({m}, K // G) with K // G "
                             f"dividing K = {k} (or pass block=), got {sc.shape}")
        return cls.from_arrays(w, sc, format=fmt)

    @classmethod
    def from_gguf(cls, data: Any, ggml_type: Any, *, shape: tuple[int, int] | None = None) -> PackedWeights:
        """Loads a llama.cpp GGUF tensor (ggml's block formats, little-endian).

        ======== ============================== ========================================
        type     weights                        here
        ======== ============================== ========================================
        Q4_0     ``d (q - 8)``, 32 per block    ``int4``, G = 32
        Q4_1     ``d q + m``                    ``uint4``, G = 32, zero points
        Q4_K     ``d sc q - dmin mn``, 8 x 32   ``uint4``, G = 32, zero points
        Q3_K     ``d (sc - 32) q3``, 16 x 16    ``int3``, G = 16
        Q2_K     ``d sc q - dmin mn``, 16 x 16  ``uint2``, G = 16, zero points
        IQ4_NL   ``d kvalues[q]``               ``codebook`` (the 16 ``kvalues_iq4nl``), G = 32
        IQ4_XS   ``d (sc - 32) kvalues[q]``     ``codebook``, G = 32
        TQ1_0    ``d t``, t in {-1, 0, 1}       ``ternary``, G = 256
        TQ2_0    ``d t``                        ``ternary``, G = 256
        MXFP4    ``2^(e - 127) e2m1[q]``        ``fp4``, G = 32
        NVFP4    ``ue4m3 e2m1[q]``, 4 x 16      ``fp4``, G = 16 (scale byte 0x7F reads 0, as ggml)
        Q8_0     ``d q``, q int8, 32 per block  ``int8``, G = 32
        Q6_K     ``d sc (q - 32)``, 16 x 16     ``int8``, G = 16
        Q5_0     ``d (q - 16)``, 32 per block   ``int8``, G = 32
        Q5_1     ``d q + m``                    ``uint8``, G = 32, zero points
        Q5_K     ``d sc q - dmin mn``, 8 x 32   ``uint8``, G = 32, zero points
        ======== ============================== ========================================

        With Q6_K beside Q4_K and Q5_K, every tensor of llama.cpp's ``Q4_K_M`` and ``Q5_K_M``
        models loads; the 5-, 6- and 8-bit types take one byte per weight here (the dense
        ``i16`` path sums them with dot-product instructions on x86-64 and Arm64 with the
        dot-product extension; elsewhere their tables of 256 entries per input are slow). Scales are exact (a float16 times a small integer). The minimums of
        Q4_1 and Q5_1 (``-m``), Q4_K, Q5_K and Q2_K (``dmin mn``) become zero points
        ``z = min / scale`` rounded once to
        float32, so those weights match ggml's to about one float32 rounding. A group whose
        scale is 0 but whose minimum is not holds one constant: it is stored exactly as codes
        0, scale ``|min|`` and zero point ``sign(min)``, so ``codes``, ``scales`` and
        ``zeros`` differ from the file's there. Other types (Q8_1 and Q8_K, ggml's activation
        formats, the IQ1/IQ2/IQ3 lattice
        types, float tensors) are refused, naming the type; so are blocks with a non-finite
        float16 field, TQ2_0's unused code 3, NVFP4 scale bytes with bit 7 set and MXFP4
        exponents from 253 (weights beyond float32).

        Parameters
        ----------
        data : ndarray of uint8, bytes or bytearray
            The tensor's bytes: ``(M, bytes per row)`` as ``gguf.GGUFReader``'s
            ``tensor.data`` gives them (shape derived), or flat with ``shape``. A 3-D
            (experts) tensor is loaded one expert at a time: ``tensor.data[e]``.
        ggml_type : str or int
            A type name (``"Q4_K"``, any case) or ggml type id (``tensor.tensor_type``).
        shape : (M, K), optional
            Output and input features in numpy's order (ggml's ``ne[1]``, ``ne[0]``: the
            reverse of ``tensor.shape``); needed for flat data, checked against 2-D data.

        Examples
        --------
        ::

            from gguf import GGUFReader  # pip install gguf
            reader = GGUFReader("model.gguf")
            t = next(t for t in reader.tensors if t.name == "blk.0.ffn_down.weight")
            pw = PackedWeights.from_gguf(t.data, t.tensor_type)   # y = msgemm(pw, x)
        """
        from ._gguf import decode

        dec = decode(data, ggml_type, shape)
        return cls.from_arrays(dec.codes, dec.scales, dec.zeros, format=dec.format, codebook=dec.codebook)


def _restore(format: str, codebook: list[float] | None, k: int, packed: np.ndarray, scales: np.ndarray,
             zeros: np.ndarray | None, k_perm: np.ndarray | None) -> PackedWeights:
    return PackedWeights(_m.Packed.from_packed(np.ascontiguousarray(packed, dtype=np.uint8), int(k),
                                               np.ascontiguousarray(scales, dtype=np.float32),
                                               None if zeros is None else np.ascontiguousarray(zeros, dtype=np.float32),
                                               format, codebook,
                                               None if k_perm is None else np.ascontiguousarray(k_perm, dtype=np.uint32)))


def quantize(
    w: npt.ArrayLike,
    format: str = "int4",
    group_size: int | None = 128,
    *,
    symmetric: bool | None = None,
    codebook: npt.ArrayLike | None = None,
    scale_dtype: npt.DTypeLike = np.float32,
) -> PackedWeights:
    """Quantizes a weight matrix.

    Parameters
    ----------
    w : array_like, shape (M, K), float16/float32/float64 or ml_dtypes bfloat16
        Rows are output features (the ``nn.Linear.weight`` convention). Any memory order.
    format : str
        ``int4``, ``int3``, ``int2`` (round-to-nearest, absmax scale ``max|w| / (2^(b-1)-1)``),
        ``uint4``, ``uint3``, ``uint2`` (min-max over ``[min(w,0), max(w,0)]`` with integer zero
        points), ``ternary`` (absmax, ``{-1, 0, 1}``), ``fp4`` (OCP MX E2M1 with E8M0
        power-of-two scales ``2^(floor(log2 max|w|) - 2)``, saturating), ``nf4`` (absmax,
        nearest NormalFloat level), ``codebook`` (absmax onto ``max|codebook|``, nearest level),
        ``fp8_e4m3`` / ``fp8_e5m2`` (absmax onto the largest finite value, round to nearest
        even), ``int8`` / ``uint8`` (as ``int4`` / ``uint4`` at 8 bits: one byte per weight;
        llama.cpp's Q8_0, Q6_K, Q5_0 and Q5_1, Q5_K load as these).
    group_size : int or None
        Inputs per scale; must divide K. ``None`` (or -1): one scale per row.
    symmetric : bool, optional
        Integer formats only. ``False`` with ``int*`` gives ``uint*`` with zero points;
        ``True`` with ``uint*`` fixes the zero point at ``2^(b-1)`` (GPTQ ``sym=True``).
    codebook : array_like, shape (V,), optional
        The 2 to 16 values of ``format='codebook'`` (floats, or integers up to 2^24).
    scale_dtype : ``np.float32`` (default) or ``np.float16``
        Precision of the scales. ``float16`` stores the smallest float16 value at or above
        each computed scale (as GPTQ, AWQ and ONNX Runtime keep scales): the kernels then read
        half the scale bytes, worth most for small groups (int2 g64, fp4 g32). Scales must fit
        float16 (at most 65504; MX scales at least 2^-24), else ``ValueError``. MX (fp4) scales
        are powers of two: float16 values already whenever they lie in that range.

    Returns
    -------
    PackedWeights

    Raises
    ------
    ValueError
        Besides bad arguments: ``w`` beyond float32's range, a group whose quantized weights
        ``s * (v - z)`` would exceed it (int4's code -8 at the scale ``max|w| / 7``, say), and
        a group whose weights are not all zero but whose scale is 0 or below float32's
        normal range (``2^-126``; int4: groups with ``max|w|`` below about ``8e-38``, fp8_e4m3
        below ``448 * 2^-126``). Such weights (float64 ones below float32's range, or barely
        above it) would dequantize to zeros, or against a scale of a few significant bits
        that breaks the bound below; set them to 0 or scale ``w`` up. Subnormal scales given
        to :meth:`PackedWeights.from_arrays` are taken as they are.

    Notes
    -----
    Codes are rounded against the stored scale, so for the RTN formats
    ``|dequantize() - w| <= scale / 2`` elementwise.
    """
    fmt, cb = _check_format(format, codebook)
    arr = _float_array(w, "w", (2,))
    sym = None if symmetric is None else check_bool(symmetric, "symmetric")
    g = _check_group_size(group_size, arr.shape[1])
    sdt = _check_scale_dtype(scale_dtype)
    if arr.dtype == np.float64:
        wc = np.require(arr, np.float64, "CA")
        if not np.isfinite(wc).all():
            _check_finite32(wc, "w")
        quantize_c = _m.Packed.quantize_f64
    else:
        wc = _as_f32(arr, "w")
        quantize_c = _m.Packed.quantize_f32
    try:
        raw = quantize_c(wc, fmt, g, sym, cb, sdt)
    except ValueError as e:
        # The core checks the packed weights' values s * (v - z) and names its own argument,
        # the scales; here they come from w.
        msg = str(e)
        if not msg.startswith("scales: "):
            raise
        raise ValueError(f"w: quantized to {fmt}, {msg.removeprefix('scales: ')} (scale w down)") from None
    _check_tiny_scales(raw, wc, fmt)
    return PackedWeights(raw)


#: float32's smallest normal value, 2^-126.
_F32_TINY = float(np.finfo(np.float32).tiny)


def _check_tiny_scales(raw: Any, w: np.ndarray, fmt: str) -> None:
    """Refuses a group whose weights are not all zero but whose scale is 0 or below float32's
    normal range (``2^-126``): its codes then dequantize to zeros, or to a few bits of a
    subnormal scale, while ``w`` held more. Only groups with such a scale are looked at."""
    sc = raw.scales()
    tiny = sc < _F32_TINY  # scales are >= 0; all-zero groups get 0 (or 1: MX)
    if not tiny.any():
        return
    m, groups = sc.shape
    maxabs = np.abs(w.reshape(m, groups, -1)).max(axis=2)
    bad = tiny & (maxabs > 0)
    if bad.any():
        r, gi = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"w: row {r}, group {gi} has weights up to {maxabs[r, gi]:.3g} in magnitude, too small "
                         f"for {fmt}: their scale ({sc[r, gi]:.3g}) is below float32's smallest normal value "
                         f"({_F32_TINY:.3g}), so they would dequantize to zeros or lose their precision; "
                         "set such weights to 0 or scale w up")


def _check_scale_dtype(scale_dtype: Any) -> str:
    """``'float32'`` or ``'float16'`` from a dtype-like."""
    if scale_dtype is None:  # np.dtype(None) is float64
        raise TypeError("scale_dtype: expected np.float32 or np.float16, got None")
    try:
        dt = np.dtype(scale_dtype)
    except Exception as e:  # numpy raises TypeError, ValueError or SyntaxError by input
        raise TypeError(f"scale_dtype: expected np.float32 or np.float16, got {scale_dtype!r}") from e
    if dt not in (np.dtype(np.float32), np.dtype(np.float16)):
        raise ValueError(f"scale_dtype: must be float32 or float16, got {dt}")
    return dt.name


def _check_pw(pw: Any) -> PackedWeights:
    if not isinstance(pw, PackedWeights):
        raise TypeError(f"pw: expected PackedWeights (from quantize or PackedWeights.from_*), got {type(pw).__name__}")
    return pw


#: What :func:`_check_opts` returns for the default options.
_DEFAULTS: tuple[int | None, str, str, int | None, bool] = (None, "auto", "auto", None, False)


def _defaults(depth: Any, table: Any, backend: Any, threads: Any, mirror: Any) -> bool:
    """True when the options are the defaults of :func:`msgemm` / :func:`linear`."""
    return (table is None and threads is None and mirror is False and isinstance(depth, str) and depth == "auto"
            and isinstance(backend, str) and backend == "auto")


def _check_opts(pw: PackedWeights, depth: Any, table: Any, backend: Any, threads: Any, mirror: Any,
                count: bool) -> tuple[int | None, str, str, int | None, bool]:
    if isinstance(depth, str):
        if depth != "auto":
            raise ValueError(f"depth: must be 'auto' or an integer in 1..{pw.max_depth}, got {depth!r}")
        d = None
    else:
        d = check_int(depth, "depth", min=1, max=pw.max_depth)
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a string, got {type(backend).__name__}")
    check_choice(backend, "backend", BACKENDS)
    if count:
        if backend not in ("auto", "reference"):
            raise ValueError(f"count: count=True runs the instrumented reference kernel; backend={backend!r} cannot count")
        backend = "reference"
    if table is None:
        # "auto": the core's choice per call (`i8`, or `i16` for batches it runs densely).
        table = "f32" if backend == "reference" else "auto"
    else:
        if not isinstance(table, str):
            raise TypeError(f"table: expected a string, got {type(table).__name__}")
        check_choice(table, "table", TABLES)
    if backend == "reference" and table != "f32":
        raise ValueError("table: backend='reference' (the counting kernel) runs float32 tables only: use table='f32'")
    t = None if threads is None else check_int(threads, "threads", min=1, max=4096)
    mir = check_bool(mirror, "mirror")
    if mir and pw.mirror is None:
        raise ValueError(f"mirror: format {pw.format!r} has no mirror symmetry (int2-int4, uint2-uint4, ternary, "
                         "fp4 and symmetric codebooks do)")
    return d, table, backend, t, mir


def msgemm(
    pw: PackedWeights,
    x: npt.ArrayLike,
    *,
    depth: int | str = "auto",
    table: str | None = None,
    backend: str = "auto",
    threads: int | None = None,
    out: np.ndarray | None = None,
    count: bool = False,
    mirror: bool = False,
) -> Any:
    """``pw.dequantize() @ x`` through look-up tables (msGeMM).

    Parameters
    ----------
    pw : PackedWeights
        Weights of shape (M, K).
    x : array_like, shape (K,) or (K, N), float16/float32/float64, ml_dtypes bfloat16 or integer
        Activations; any memory order (a Fortran-order ``x`` is read without a copy).
        Computed in float32: integers (and lists of ints) are taken as their float32 values,
        exact for ``|v| <= 2^24`` and rounded to the nearest float32 beyond; booleans,
        complex numbers, objects and strings raise ``TypeError``. An empty batch, ``N = 0``,
        gives zeros of shape ``(M, 0)`` (``out``, of that shape, is returned untouched) once
        the other arguments are checked; ``count=True`` refuses it (nothing runs).
    depth : int or "auto"
        Inputs per table index ``d``: tables have ``V^d`` entries. ``"auto"``: the depth the
        SIMD kernel is measured fastest at for the codebook (AVX-512 ``i8`` tables: 2 for
        16-level formats, 4 for int2, at every M: it builds a 256-entry table for about the
        cost of a 16-entry one), else the operation-count model's best depth
        (``argmax_d d / (1 + A_d(V)/M)``, :func:`best_depth`) among the depths with byte
        indices the backend implements. Deeper tables (int4 ``d=3``: 4096 entries,
        the paper's headline setting) on request. ``d`` need not divide the group size: the
        last tuple of a group is then shorter.
    table : {"i8", "i16", "f32", "bf16"}, optional
        Table precision. Default: the fast mode for the call, ``"i8"``, except for batches
        (``N >= 2``) at ``depth="auto"``, and for GEMVs on AMD CPUs with AVX-512 VNNI (Zen 4
        and later) and on CPUs with AVX2 but not AVX-512 VNNI (groups of 32 or more) of the
        weights below, which run
        on the dense ``i16`` path (measured on Zen 5, 4096 x 4096, 2 threads: int4 g128 0.059
        ms against 0.085 warm, and faster from DRAM; int4 g32 0.070 against 0.107, fp4 g32
        0.062 against 0.110; its AVX2 kernels: int4 g128 0.092 ms with AVX-VNNI, 0.153 without,
        against 0.209), and for every call
        of int8 / uint8 weights where the dense path exists (256-entry tables otherwise: int8
        g32 GEMV 0.13 against 2.0 ms), and for every call at ``depth="auto"`` of fp8 weights
        (e4m3, e5m2) without zero points, which run in ``"f32"`` mode on the fp8 path where it
        exists (below):

        - weights of at most 16 integer levels, group sizes that are multiples of 8, on a CPU
          with dot-product instructions run on the dense ``i16`` path described below, both
          faster and more accurate (int4 g128 4096 x 4096, 2 threads: N = 2 0.35 against
          0.66 ms, N = 16 1.1 against 2.0 ms); except that small groups run in ``"bf16"``
          mode (without ``mirror``, K a multiple of 32) where the dense path's per-group
          scaling costs more than decoding the weights to bfloat16: on CPUs with AMX-BF16
          groups of at most 16 inputs (GGUF's Q2_K, Q3_K, NVFP4) from 8 columns on and of at
          most 32 (Q4_0, Q4_K, MXFP4) from 32 on (4096 x 4096, N = 64, three runs: 0.15-0.36x
          the dense path's time at G = 16, 0.21-0.65x at G = 32); on AMD CPUs with AVX-512
          BF16 groups of at most 16 from 24 columns on and of at most 32 from 48 (Zen 5, N = 32:
          0.76-0.85x at G = 16; N = 64 0.79x at G = 32 with zero points; on Zen 4, where
          groups of 32 took 1.2-1.5x the dense time, groups of at most 16 from 32); on other CPUs with
          AVX-512 or AVX2 and FMA groups of at most 16 from 32 columns on (0.5-0.9x at N = 64);
        - other weights of at most 16 levels (nf4, float custom codebooks) with group sizes
          that are multiples of 8 and K a multiple of 32, in batches without ``mirror`` of 6 columns or more on a
          CPU with AMX-BF16, of 8 or more on other CPUs with AVX-512, of 16 or more on other
          CPUs with AVX2 and FMA, run in ``"bf16"``
          mode, also faster and more accurate (nf4 g64
          4096 x 4096, 2 threads, in one benchmark run: N = 16 1.3 against 3.5 ms on ``i8``
          tables, N = 64 3.0 against 13.8 ms; numpy on pre-dequantized float32 weights 5.1 and
          13.9 ms. The AVX-512 and AVX2 kernels, measured on a Sapphire Rapids against the
          ``i8`` tables of the same instruction set: even at N = 8 and 16 respectively, 1.6x
          and 1.3x faster at N = 64; ``backend="avx512"`` and ``"avx2"`` name them).

        :func:`plan_info` with ``n=`` reports the choice (``dense_int8``, ``dense_bf16``). So
        column ``j`` of such a batch can differ (within the bounds below) from the GEMV of
        column ``j``; name the table to get the same arithmetic at every N.
        ``"reference"`` backend: ``"f32"``.
        ``"i8"`` (fast): float tables rounded to int8 with one scale
        ``t`` per (column, group) and an integer multiplier ``m_p`` per tuple (tuple ``p`` is
        rounded on a grid of ``m_p * t``, close to a scale of its own, at no extra cost in the
        kernels), scaled to the codes present in the weights (weights with zero points: to the
        centred codebook); error per output at most ``sum_g |s| * t * sum_p m_p / 2``.
        ``"i16"``: activations rounded to int8 per (column, group), integer codebooks, exact
        integer partial sums (ONNX Runtime ``MatMulNBits`` accuracy level 4's arithmetic). On
        x86-64 (AVX-512 VNNI or AVX2) and on Arm64 CPUs with the dot-product extension,
        ``"i16"`` calls on weights of at most 16 integer levels (int4, uint4, int3, int2,
        ternary, fp4, and integer codebooks whose values span at most 255 on AVX-512 VNNI and
        AVX-VNNI, e.g. llama.cpp's IQ4_NL; at most 127 with ``sdot``, 64 on AVX2 without
        AVX-VNNI) or of one byte per
        code (int8, uint8; not on AMX tiles)
        with group sizes that are multiples of 8 sum those same integers with
        dot-product instructions (``vpdpbusd``, on AVX2 without AVX-VNNI ``vpmaddubsw``,
        ``sdot`` on Arm64) instead of tables (bitwise the same result, at any ``depth``; GEMVs
        of 2-bit formats on AVX-512 VNNI and AVX-VNNI only, from a layout of 2 bits per code
        with groups that are multiples of 16, elsewhere their tables read fewer bytes): there
        ``"i16"`` is the fastest
        mode for batches (int4 4096 x 4096, N = 16: about 2x the ``i8`` tables) and close to
        ``i8`` for a GEMV (:func:`plan_info` reports ``dense_int8`` and ``dense_kernel``). ``"f32"``: float32 tables, error within
        ``2 (K/d + d + 3) 2^-24 (|Wd| @ |x|)`` (plus the zero-point term). Relative L1 errors measured on Gaussian int4 g128 GEMV
        (4096 x 4096, depth 2): ``i8`` 9.2e-3, ``i16`` 6.6e-3, ``f32`` 2.2e-7 (uint4 with zero
        points: ``i8`` 8.5e-3; int2 g64: 6.9e-3).
        fp8 weights without zero points: ``"f32"`` calls decode the codes in registers instead
        of building tables (256 entries per input), on AVX-512 (any group size), AVX2 with F16C
        (group sizes that are multiples of 16) and Arm64; :func:`plan_info` names the kernel
        (``fp8_kernel``). Every fp8 value is a float16 value, widened exactly
        (``vcvtph2ps``); per row, column and 16 lanes, the group sums
        ``p = fma(v[q], x, p)`` in ascending input order, the totals ``t = fma(s, p, t)``,
        then a fixed tree of the lanes: the same bits on every kernel, thread count and column
        count (backend ``"scalar"`` runs the ``f32`` tables instead, whose sums differ in the
        last bits), within ``(G/16 + K/G + 5) 2^-24 (|Wd| @ |x|)`` of the exact product (e4m3 g128
        4096 x 4096 GEMV, 2 threads, Zen 5: 0.24-0.27 ms, 3.9-4.4x numpy, against 1.5-3.4 ms
        on ``i8`` tables and 6.5 ms on ``f32`` tables; relative L1 error 1.3e-7, ``i8``
        7.1e-3).
        ``"bf16"``: no tables. The weights are dequantized to bfloat16 as they are used,
        ``wb = bf16((v[q] - z) * s)`` (float32 arithmetic, one rounding to nearest even), the
        activations rounded to ``xb = bf16(x)``, and the products summed in float32: the
        arithmetic of bitsandbytes' nf4 layers. Each product is within ``2^-8 + 2^-16`` of its
        exact value, relative, and the sums within ``K 2^-24 (|wb| @ |xb|)`` of the exact sum
        of those products (relative L1 error on Gaussian nf4 g64, 512 x 2048, N = 4: 2.2e-3,
        ``i8`` 7.8e-3).
        Any format of at most 16 levels (not fp8, int8, uint8), group sizes that are multiples of 8 and K
        a multiple of 32.
        Kernels: Intel AMX (``tdpbf16ps``, backend ``"amx"``), AVX-512 (``"avx512"``: FMA,
        ``vfmadd231ps``; on AMD CPUs with AVX-512 BF16 (Zen 4 and later) ``vdpbf16ps``, which
        does twice the multiplies per instruction there, against a quarter of the FMA rate on
        Intel's), AVX2 and FMA (``"avx2"``), and a portable one (``"scalar"``, which the
        compiler vectorizes: nf4 g64 4096 x 4096, N = 16, 2 threads, 17 ms against 2.7 on
        AVX-512); ``"auto"`` takes the first of them the CPU has (:func:`plan_info` names it:
        ``bf16_kernel``). The FMA kernels give the scalar
        kernel's bits, so the same result on every such CPU, wherever no product of a weight
        and an activation is below ``2^-126`` in magnitude (FMA does not round such products,
        which the scalar kernel does; ``scalar_order``). AMX and ``vdpbf16ps`` add in their
        units' own orders, so they differ from the others in the last bits (all within the
        bound). Each gives the same bits for any number of threads.
    backend : {"auto", "avx512", "amx", "avx2", "neon", "scalar", "reference"}
        Kernel. ``"auto"`` picks the fastest one available for the call; a named backend the
        CPU or build lacks raises ValueError. ``"reference"`` is the instrumented scalar kernel.
        ``"amx"`` (Intel AMX tiles, Sapphire Rapids and later Xeons, on Linux) runs only the
        dense ``"i16"`` sums (``tdpbsud``: 16 columns x 16 rows x 64 inputs per instruction),
        bitwise the same as every other backend, and ``"bf16"`` mode (``tdpbf16ps``); ``"auto"`` takes it for dense batches of 6
        columns or more (int4 4096 x 4096 on 2 threads, N = 16: 1.5-1.8x the AVX-512 VNNI
        sums, which ``"avx512"`` names; N = 64: about 2x), and its GEMVs use ``"i16"`` by
        default.
    threads : int, optional
        Run on a pool of this many threads (default: the library pool, see
        :func:`maleki_rs.set_num_threads`). Results are identical for any thread count. As
        with the library pool, a GEMV or small batch on 1 or 2 threads runs on the calling
        thread (and at most one helper thread, which waits 1 ms for the next call before it
        sleeps: environment variable ``MALEKI_RS_SPIN_US``), which saves waking a sleeping
        worker.
    out : ndarray, optional
        float32 C-contiguous array of the result's shape to write into.
    count : bool
        Return ``(y, counts)``: the operations counted by the instrumented reference kernel
        (keys ``table_mul, table_add, lookup, add, mul, dense_mul, dense_add, dequant_mul,
        mac_ratio, op_ratio, model_ratio, depth``).
    mirror : bool
        Build half-size tables using the codebook's mirror symmetry (int2-int4, uint2-uint4,
        ternary, fp4, symmetric codebooks; not the one-byte formats fp8, int8, uint8). For int4 / int3 / int2 weights without zero points that
        never use the most negative code (symmetric quantization) the tables are built over
        sign-magnitude labels: the same values, so the same int8 grid and no zero-point term;
        otherwise int* / uint* tables are shifted by half a step (``i8``: a slightly coarser
        grid). Even with ``mirror=False``, an ``i8`` call runs on half tables whenever that gives
        the same bits (those int weights, fp4, ternary, weights with zero points) and the
        kernel reads mirror-folded indices (AVX-512: one ``vpermi2b`` and a masked negation per
        64 lookups instead of two and a blend, and half the table build); :func:`plan_info` reports
        it as ``half_tables``. ``i16`` calls that run densely (see ``table``) sum the same
        integers with or without mirror, at the same speed.

    Returns
    -------
    y : ndarray, shape (M,) or (M, N), float32
        (``out`` when given.) With ``count=True``: ``(y, counts)``.

    Raises
    ------
    ValueError
        Besides bad arguments: a group too long for the int32 partial sums of the ``i8``
        tables (at most 4,194,560 tuples of ``d`` inputs per group) or the ``i16`` tables
        (65,538 tuples) that the call runs on; ``table="f32"`` or a smaller ``group_size``
        avoids it.
    """
    pw = _check_pw(pw)
    if _defaults(depth, table, backend, threads, mirror) and count is False:
        d, tbl, bk, t, mir = _DEFAULTS  # already valid: 0.6 us less per call (a 64 x 256 GEMV: ~6 us)
    else:
        count = check_bool(count, "count")
        d, tbl, bk, t, mir = _check_opts(pw, depth, table, backend, threads, mirror, count)
    m, k = pw.shape
    arr = _float_array(x, "x", (1, 2), integers=True, allow_empty=True)
    if arr.shape[0] != k:
        raise ValueError(f"x: expected {k} rows (K of the weights), got shape {arr.shape}")
    vector = arr.ndim == 1
    n = 1 if vector else arr.shape[1]
    if n == 0:  # an empty batch (an expert that no token was routed to): nothing to compute
        if count:
            raise ValueError("count: an empty batch (x of shape (K, 0)) runs no operations to count")
        if out is None:
            return np.zeros((m, 0), np.float32)
        _check_out(out, (m, 0))
        return out
    # x is checked for NaN / inf by the core (values beyond float32 are inf by then).
    if (not vector and arr.flags.f_contiguous and not arr.flags.c_contiguous and arr.flags.aligned
            and arr.dtype == np.float32):
        x32 = arr
        xs, transposed = arr.T, True  # (N, K) C-contiguous view: no copy
    else:
        x32 = _to_f32(arr)
        xs, transposed = x32.reshape(k, n), False
    if count:
        if out is not None:
            raise ValueError("out: not supported with count=True")
        y, counts = _checked_by_core(x32, pw, d, _m.gemm_counted, pw._raw, xs, transposed, d, tbl, mir)
        return (y.reshape(m) if vector else y), counts
    if out is not None:
        _check_out(out, (m,) if vector else (m, n))
        if np.may_share_memory(out, xs):
            xs = xs.copy()  # the kernels read x while they write out
        _checked_by_core(x32, pw, d, _m.gemm, pw._raw, xs, transposed, d, tbl, bk, mir, t, out.reshape(m, n))
        return out
    y = _checked_by_core(x32, pw, d, _m.gemm, pw._raw, xs, transposed, d, tbl, bk, mir, t)
    return y.reshape(m) if vector else y


def linear(
    x: npt.ArrayLike,
    pw: PackedWeights,
    bias: npt.ArrayLike | None = None,
    *,
    depth: int | str = "auto",
    table: str | None = None,
    backend: str = "auto",
    threads: int | None = None,
    mirror: bool = False,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """A linear layer ``x @ Wd.T + bias`` for activations of shape ``(..., K)``.

    The argument order of ``torch.nn.functional.linear(input, weight, bias)``.

    Parameters
    ----------
    x : array_like, shape (..., K), float16/float32/float64, ml_dtypes bfloat16 or integer
        Computed in float32 (integers as in :func:`msgemm`). Up to 32 dimensions. An empty
        batch, a zero in the leading dimensions ``...``, gives an empty result of shape
        ``(..., M)`` (zeros; a bias broadcast to it is empty too) once the other arguments
        are checked.
    pw : PackedWeights
        Weights ``(M, K)`` (``nn.Linear.weight`` convention: rows are output features).
    bias : array_like, shape (M,), optional
        Added to every output row, in float32, after the product (float16/32/64, ml_dtypes
        bfloat16 or integers as ``x``; finite). Costs two passes over the ``(..., M)`` result
        (the addition, and a check that it did not overflow float32).
    depth, table, backend, threads, mirror
        As in :func:`msgemm`.
    out : ndarray, shape (..., M), optional
        float32 C-contiguous array to write the result into (returned).

    Returns
    -------
    ndarray, shape (..., M), float32
        (``out`` when given; untouched for an empty batch.)
    """
    pw = _check_pw(pw)
    if _defaults(depth, table, backend, threads, mirror):
        d, tbl, bk, t, mir = _DEFAULTS
    else:
        d, tbl, bk, t, mir = _check_opts(pw, depth, table, backend, threads, mirror, False)
    m, k = pw.shape
    arr = _float_array(x, "x", tuple(range(1, 33)), integers=True, allow_empty=True)
    if arr.shape[-1] != k:
        raise ValueError(f"x: expected last dimension K = {k}, got shape {arr.shape}")
    b32 = None
    if bias is not None:
        barr = _float_array(bias, "bias", (1,), integers=True)
        if barr.shape != (m,):
            raise ValueError(f"bias: expected shape ({m},) (M of the weights), got {barr.shape}")
        b32 = _as_f32(barr, "bias")
    lead = arr.shape[:-1]
    if out is not None:
        _check_out(out, (*lead, m))
        if b32 is not None and np.may_share_memory(out, b32):
            b32 = b32.copy()  # the product overwrites out before the bias is added
    if arr.size == 0:  # an empty batch (a zero leading dimension): the bias broadcast to nothing
        return out if out is not None else np.zeros((*lead, m), np.float32)
    x32 = _to_f32(arr)
    x2 = x32.reshape(-1, k)  # (B, K): X transposed, as the kernel wants it
    if bk == "reference":
        ym, _ = _checked_by_core(x32, pw, d, _m.gemm_counted, pw._raw, x2, True, d, tbl, mir)  # (M, B)
        y = out.reshape(-1, m) if out is not None else np.empty((ym.shape[1], m), np.float32)
        y[...] = ym.T  # out is C-contiguous: its reshape is a view
    elif out is not None:
        if np.may_share_memory(out, x2):
            x2 = x2.copy()  # the kernels read x while they write out
        # Y comes out (B, M) directly from the driver's column-major blocks.
        y = out.reshape(-1, m)
        _checked_by_core(x32, pw, d, _m.gemm, pw._raw, x2, True, d, tbl, bk, mir, t, y, True)
    else:
        y = _checked_by_core(x32, pw, d, _m.gemm, pw._raw, x2, True, d, tbl, bk, mir, t, None, True)
    if b32 is not None:
        with np.errstate(over="ignore"):
            y += b32
        if not np.isfinite(y).all():
            raise ValueError("the result overflows float32: an output plus its bias is beyond 3.4e38")
    return out if out is not None else y.reshape(*lead, m)


def _levels_of(format: Any, codebook: Any, name: str = "format") -> tuple[int, float | None, int]:
    """``(V, mirror shift or None, max depth)`` of a format name or a level count."""
    if isinstance(format, numbers.Integral) and not isinstance(format, bool):
        v = check_int(format, name, min=2, max=1 << 16)
        dmax = 1
        while v ** (dmax + 1) <= 65536:
            dmax += 1
        return v, 0.0, dmax
    if not isinstance(format, str):
        raise TypeError(f"{name}: expected a level count (int) or a format name, got {type(format).__name__} {format!r}")
    fmt, cb = _check_format(format, codebook)
    v, _, dmax, _, shift = _m.format_info(fmt, cb)
    return int(v), shift, int(dmax)


def op_counts(
    M: int,
    K: int,
    N: int = 1,
    *,
    format: str | int = "int4",
    depth: int | str = 2,
    group_size: int | None = 128,
    zero_points: bool = False,
    mirror: bool = False,
    codebook: npt.ArrayLike | None = None,
) -> dict[str, Any]:
    """Closed-form operation counts of msGeMM and of the dense GEMM (spec section 2.5).

    Parameters
    ----------
    M, K, N : int
        Rows of W (output features), inputs, columns of X.
    format : str or int
        A format name, or the number of levels V.
    depth : int or "auto"
        Table depth d (``"auto"``: :func:`best_depth`).
    group_size : int or None
        Group size G (must divide K; None: per channel).
    zero_points : bool
        Weights carry zero points.
    mirror : bool
        Half tables by mirror symmetry (for int*/uint* this also turns on the zero-point term
        that carries the codebook's half-step shift). A call on int4 weights that never use
        code 0 (-8) runs in label space instead, without that term (``plan_info`` says so);
        these counts, which do not see the weights, count the shifted mirror.
    codebook : array_like, optional
        Values of ``format='codebook'``.

    Returns
    -------
    dict
        ``table_mul``, ``table_add``, ``lookup``, ``add``, ``mul`` (msGeMM), ``dense_mul``,
        ``dense_add``, ``dequant_mul`` (dense GEMM on dequantized weights, and the
        dequantization), ``mac_ratio = M N K / (table_add + lookup)`` (the paper's
        instruction ratio, ``d / (1 + A_d(V)/M)`` when d divides G), ``op_ratio`` (all
        arithmetic), ``model_ratio``, ``depth``, ``zero_term``, ``mirror``.
    """
    m = check_int(M, "M", min=1)
    k = check_int(K, "K", min=1)
    n = check_int(N, "N", min=1)
    v, shift, dmax = _levels_of(format, codebook)
    mir = check_bool(mirror, "mirror")
    if mir and shift is None:
        raise ValueError(f"mirror: format {format!r} has no mirror symmetry")
    if isinstance(depth, str):
        if depth != "auto":
            raise ValueError(f"depth: must be 'auto' or an integer, got {depth!r}")
        d = best_depth(m, v, max_depth=dmax, mirror=mir)
    else:
        d = check_int(depth, "depth", min=1, max=dmax)
    g = _check_group_size(group_size, k) or k
    zp = check_bool(zero_points, "zero_points") or (mir and bool(shift))
    return dict(_m.op_counts(m, k, n, v, d, g, zp, mir))


def best_depth(M: int, V: int | str, *, max_depth: int | None = None, mirror: bool = False) -> int:
    """The table depth that minimizes table adds + lookups: ``argmax_d d / (1 + A_d(V)/M)``.

    The paper's operation-count model (section 2.5). ``msgemm(depth="auto")`` uses it unless
    the SIMD kernel is measured fastest at a depth of its own for the codebook (see
    :func:`msgemm`; :func:`plan_info` tells the depth a call resolves to).

    Parameters
    ----------
    M : int
        Rows sharing each table (output features).
    V : int or str
        Codebook levels, or a format name.
    max_depth : int, optional
        Largest depth considered (default: the largest with ``V^d <= 65536``; fp8: 1).
    mirror : bool
        Count half tables (``A_d^mir``).
    """
    m = check_int(M, "M", min=1)
    if isinstance(V, str) and V == "codebook":
        raise ValueError("V: a custom codebook has no fixed number of levels; pass it as an integer")
    v, _, dmax = _levels_of(V, None, "V")
    dm = dmax if max_depth is None else check_int(max_depth, "max_depth", min=1, max=64)
    return int(_m.best_depth(m, v, dm, check_bool(mirror, "mirror")))


def model_ratio(M: int, V: int | str, depth: int, *, mirror: bool = False) -> float:
    """The model ratio ``R = d / (1 + A_d(V)/M)`` of dense multiply-adds to table adds + lookups."""
    m = check_int(M, "M", min=1)
    if isinstance(V, str) and V == "codebook":
        raise ValueError("V: a custom codebook has no fixed number of levels; pass it as an integer")
    v, _, _ = _levels_of(V, None, "V")
    d = check_int(depth, "depth", min=1, max=64)
    return float(_m.model_ratio(m, v, d, check_bool(mirror, "mirror")))


def codebook(format: str) -> npt.NDArray[np.float32]:
    """The values ``v[0..V)`` of a built-in format's codes (fp8: NaN/inf at those encodings)."""
    if not isinstance(format, str):
        raise TypeError(f"format: expected a string, got {type(format).__name__}")
    check_choice(format, "format", tuple(f for f in FORMATS if f != "codebook"))
    return _m.codebook_values(format)


def available_backends() -> list[str]:
    """Backends usable on this machine (compiled in, supported by the CPU), plus "reference"."""
    return list(_m.available_backends())


def backend_supports(pw: PackedWeights, backend: str, *, n: int = 1, depth: int | str = "auto",
                     table: str | None = None, mirror: bool = False) -> bool:
    """Whether ``backend`` runs this call on this machine (False instead of an error)."""
    pw = _check_pw(pw)
    check_choice(backend, "backend", BACKENDS)
    if table is None:
        table = "f32" if backend == "reference" else "auto"
    else:
        if not isinstance(table, str):
            raise TypeError(f"table: expected a string, got {type(table).__name__}")
        check_choice(table, "table", TABLES)
    d = None if depth == "auto" else check_int(depth, "depth", min=1, max=pw.max_depth)
    return bool(_m.backend_supports(pw._raw, check_int(n, "n", min=1), d, table, backend,
                                    check_bool(mirror, "mirror")))


def plan_info(pw: PackedWeights, *, n: int = 1, depth: int | str = "auto", table: str | None = None,
              backend: str = "auto", mirror: bool = False) -> dict[str, Any]:
    """How :func:`msgemm` would run a call with these options on ``n`` columns.

    Returns a dict: ``depth``, ``backend`` (the kernel), ``table``, ``levels``,
    ``tuples_per_group``, ``last_depth``, ``table_entries`` (per table, as planned),
    ``zero_term``, ``mirror`` (as asked), ``int_exp`` (``i16``), and what runs: ``half_tables``
    (mirror tables, asked for or chosen because they give the same bits), ``folded_indices``
    (the kernel reads mirror-folded indices), ``paired_indices`` (it reads two 4-bit indices per
    byte), ``label_space`` (int tables over
    sign-magnitude labels, see :func:`msgemm`'s ``mirror``), ``dense_int8`` (an ``i16`` call
    that sums its exact integers with dot-product instructions instead of tables: no table
    is built, ``depth`` and the table fields do not apply; see :func:`msgemm`'s ``table``; its
    kernel in ``dense_kernel``: ``"avx512-vnni"``, ``"amx"``, ``"avx2-vnni"`` (AVX2 with
    AVX-VNNI), ``"avx2"`` or ``"neon-sdot"``, else None) and
    ``dense_bf16`` (a ``bf16`` call: no tables either; ``backend`` is ``"amx"``,
    ``"avx512"``, ``"avx2"`` or ``"scalar"``), and for ``bf16`` calls (else None)
    ``bf16_kernel`` (``"amx-tdpbf16ps"``, ``"avx512-fma"``, ``"avx512-vdpbf16ps"``,
    ``"avx2-fma"`` or ``"scalar"``) and ``scalar_order`` (whether it adds the products in the
    scalar kernel's order, so gives its bits), and ``fp8_kernel`` (``"avx512"``, ``"avx2"`` or
    ``"portable"`` for ``f32`` calls of fp8 weights on the fp8 path, no tables either; else
    None).
    """
    pw = _check_pw(pw)
    d, tbl, bk, _, mir = _check_opts(pw, depth, table, backend, None, mirror, False)
    n = check_int(n, "n", min=1)
    try:
        return dict(_m.plan_info(pw._raw, n, d, tbl, bk, mir))
    except ValueError as e:
        err = _group_limit_error(e, pw, d)
        if err is None:
            raise
    raise err from None
