"""llama.cpp GGUF tensors (ggml block formats) as msgemm codes, scales and zero points.

Every supported ggml type is a format of ours with a smaller group (the 5-, 6- and 8-bit ones:
``int8`` or ``uint8``, one byte per weight): the block (or sub-block) scales become our group
scales, exactly (products of a float16 and a small integer are exact in float32), and the
``d * q - m`` of the types with minimums becomes ``s * (q - z)`` with ``z = m / d`` rounded
once to float32. The layouts are ggml's
(``ggml-common.h``), read here with numpy; nothing of the ``gguf`` package is needed.

Reading a file is the ``gguf`` package's job (``gguf.GGUFReader``); its ``tensor.data`` and
``tensor.tensor_type`` are what :meth:`PackedWeights.from_gguf` takes.
"""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

import numpy as np

from .._util.validate import check_int

#: ggml type ids (``enum ggml_type``) by name: the ones we load and, for clear refusals, the
#: ones we do not.
GGML_TYPES: dict[str, int] = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q8_1": 9,
    "Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "Q8_K": 15, "IQ2_XXS": 16,
    "IQ2_XS": 17, "IQ3_XXS": 18, "IQ1_S": 19, "IQ4_NL": 20, "IQ3_S": 21, "IQ2_S": 22,
    "IQ4_XS": 23, "I8": 24, "I16": 25, "I32": 26, "I64": 27, "F64": 28, "IQ1_M": 29,
    "BF16": 30, "TQ1_0": 34, "TQ2_0": 35, "MXFP4": 39, "NVFP4": 40, "Q1_0": 41,
}
_NAMES = {v: k for k, v in GGML_TYPES.items()}

#: The types we load: name -> (weights per block, bytes per block, our format, group size).
SUPPORTED: dict[str, tuple[int, int, str, int]] = {
    "Q4_0": (32, 18, "int4", 32),
    "Q4_1": (32, 20, "uint4", 32),
    "Q2_K": (256, 84, "uint2", 16),
    "Q3_K": (256, 110, "int3", 16),
    "Q4_K": (256, 144, "uint4", 32),
    "IQ4_NL": (32, 18, "codebook", 32),
    "IQ4_XS": (256, 136, "codebook", 32),
    "TQ1_0": (256, 54, "ternary", 256),
    "TQ2_0": (256, 66, "ternary", 256),
    "MXFP4": (32, 17, "fp4", 32),
    "NVFP4": (64, 36, "fp4", 16),
    "Q8_0": (32, 34, "int8", 32),
    "Q6_K": (256, 210, "int8", 16),
    "Q5_0": (32, 22, "int8", 32),
    "Q5_1": (32, 24, "uint8", 32),
    "Q5_K": (256, 176, "uint8", 32),
}

#: The 16 values of IQ4_NL and IQ4_XS (llama.cpp's ``kvalues_iq4nl``).
IQ4_VALUES = (-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
              1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0)


class Decoded(NamedTuple):
    """What :meth:`PackedWeights.from_arrays` takes."""

    codes: np.ndarray  # (M, K) uint8
    scales: np.ndarray  # (M, K // G) float32
    zeros: np.ndarray | None  # (M, K // G) float32
    format: str
    codebook: tuple[float, ...] | None


def type_name(ggml_type: Any) -> str:
    """The ggml type's name from a name (any case) or an id (``gguf.GGMLQuantizationType`` is an
    int); ValueError naming the supported ones otherwise."""
    supported = ", ".join(SUPPORTED)
    if isinstance(ggml_type, str):
        name = ggml_type.strip().upper()
        if name not in GGML_TYPES:
            raise ValueError(f"ggml_type: unknown ggml type {ggml_type!r}; msgemm loads {supported}")
    elif isinstance(ggml_type, numbers.Integral) and not isinstance(ggml_type, (bool, np.bool_)):
        if int(ggml_type) not in _NAMES:
            raise ValueError(f"ggml_type: unknown ggml type id {int(ggml_type)}; msgemm loads {supported}")
        name = _NAMES[int(ggml_type)]
    else:
        raise TypeError(f"ggml_type: expected a ggml type name or id, got {type(ggml_type).__name__}")
    if name not in SUPPORTED:
        if name in ("F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"):
            why = "is not a block-quantized type (quantize it with maleki_rs.msgemm.quantize)"
        elif name in ("Q8_1", "Q8_K"):
            why = "is ggml's format for activations in its dot products, not for stored weights"
        elif name == "Q1_0":
            why = "is not supported (a 1-bit type newer than this loader)"
        else:
            why = "is not supported (its codes index a lattice of 8-weight vectors, not one weight each)"
        raise ValueError(f"ggml_type: {name} {why}; msgemm loads {supported}")
    return name


def blocks_of(data: Any, name: str, shape: Any) -> tuple[np.ndarray, int, int]:
    """``data`` as ``(M, K // block, bytes per block)`` uint8 blocks, with M and K."""
    bs, ts = SUPPORTED[name][:2]
    # bytes and bytearray are raw bytes; a memoryview keeps its own format and shape.
    arr = np.frombuffer(data, np.uint8) if isinstance(data, (bytes, bytearray)) else np.asarray(data)
    if arr.dtype != np.uint8:
        raise TypeError(f"data: expected the tensor's raw bytes as uint8 (gguf's tensor.data), got {arr.dtype}")
    if arr.size == 0:
        raise ValueError("data: empty")
    if shape is None:
        if arr.ndim == 3:
            raise ValueError(f"data: a 3-D (experts) tensor of shape {arr.shape}: load one expert at a time, "
                             "from_gguf(tensor.data[e], ...) for expert e (each is (M, bytes per row))")
        if arr.ndim != 2:
            raise ValueError(f"shape: needed for {arr.ndim}-D data (2-D data is (M, bytes per row)); "
                             "pass shape=(M, K)")
        if arr.shape[1] % ts:
            raise ValueError(f"data: rows of {arr.shape[1]} bytes are not whole {name} blocks of {ts} bytes; "
                             "is the type right?")
        m, k = arr.shape[0], arr.shape[1] // ts * bs
    else:
        # Any sequence of two: a tuple, a list, or gguf's (reversed) shape array.
        if isinstance(shape, (str, bytes)) or np.ndim(shape) != 1 or len(shape) != 2:
            raise ValueError(f"shape: expected (M, K), got {shape!r}")
        m = check_int(shape[0], "shape[0] (M)", min=1)
        k = check_int(shape[1], "shape[1] (K)", min=1)
        if k % bs:
            raise ValueError(f"shape: K = {k} is not a multiple of {name}'s block of {bs} weights")
        row = k // bs * ts
        if arr.ndim >= 2 and (arr.shape[-1] != row or (arr.ndim == 2 and arr.shape[0] != m)):
            raise ValueError(f"shape: ({m}, {k}) is {m} rows of {row} bytes, but data is {arr.shape} "
                             "(shape is (M, K) in numpy's order: ggml's ne reversed)")
        if arr.size != m * row:
            raise ValueError(f"data: {arr.size} bytes, but {name} weights of shape ({m}, {k}) take {m * row}")
    return np.ascontiguousarray(arr).reshape(m, k // bs, ts), m, k


def _f16(blocks: np.ndarray, at: int, field: str = "d") -> np.ndarray:
    """The little-endian float16 ``field`` at byte ``at`` of every block, as float32, checked
    finite."""
    v = np.ascontiguousarray(blocks[..., at:at + 2]).view("<f2")[..., 0].astype(np.float32)
    if not np.isfinite(v).all():
        r, b = np.argwhere(~np.isfinite(v))[0]
        raise ValueError(f"data: row {r}, block {b} has a non-finite float16 {field} ({v[r, b]})")
    return v


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Bytes ``(..., n)`` -> codes ``(..., 2n)``: the low nibbles, then the high ones (ggml's
    order within a run of bytes)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _crumbs(qs: np.ndarray) -> np.ndarray:
    """Bytes ``(..., 32 c)`` -> 2-bit codes ``(..., 128 c)``: each run of 32 bytes gives 128
    codes, the bits 0-1 of the 32 bytes first, then bits 2-3, 4-5, 6-7."""
    runs = qs.reshape(*qs.shape[:-1], -1, 1, 32)
    shifts = np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)
    return ((runs >> shifts) & 3).reshape(*qs.shape[:-1], -1)


def _k_scales_mins(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit scales and 8 six-bit minimums of a Q4_K / Q5_K block from its 12 bytes
    ``(..., 12)``: sub-blocks 0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7 (minimums),
    4-7 in the nibbles of bytes 8-11 with their top 2 bits in the top bits of bytes 0-7."""
    b = b.astype(np.int32)
    lo = b[..., 0:4], b[..., 4:8], b[..., 8:12]
    sc = np.concatenate([lo[0] & 63, (lo[2] & 0x0F) | ((lo[0] >> 6) << 4)], axis=-1)
    mn = np.concatenate([lo[1] & 63, (lo[2] >> 4) | ((lo[1] >> 6) << 4)], axis=-1)
    return sc, mn


def _affine(codes: np.ndarray, d: np.ndarray, mins: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes, scales and zero points of ``value = d * q - mins`` per group (``d``, ``mins``:
    ``(M, groups)``; ``codes``: any shape holding ``M * groups * G`` codes in group order):
    ``s = d``, ``z = mins / d``.

    A group with ``d = 0`` is the constant ``-mins``: its codes become 0 with ``s = |mins|``
    and ``z = sign(mins)`` (``s * (0 - z) = -mins``), so that it stays exact.
    """
    d64, m64 = d.astype(np.float64), mins.astype(np.float64)
    flat = d64 == 0
    z = np.divide(m64, d64, out=np.zeros_like(d64), where=~flat)
    grouped = np.array(codes, dtype=np.uint8).reshape(*d.shape, -1)
    if flat.any():
        grouped[flat] = 0
        d64 = np.where(flat, np.abs(m64), d64)
        z = np.where(flat, np.sign(m64), z)
    return grouped, d64.astype(np.float32), z.astype(np.float32)


def decode(data: Any, ggml_type: Any, shape: Any = None) -> Decoded:
    """Codes, scales and zero points of a GGUF tensor (see :meth:`PackedWeights.from_gguf`)."""
    name = type_name(ggml_type)
    blocks, m, k = blocks_of(data, name, shape)
    nb = blocks.shape[1]
    fmt, group = SUPPORTED[name][2:]
    zeros = None
    codebook = None
    if name in ("Q4_0", "IQ4_NL"):  # d f16, 16 bytes of nibbles: q (Q4_0: value d (q - 8))
        scales = _f16(blocks, 0)
        codes = _nibbles(blocks[..., 2:18])
        codebook = IQ4_VALUES if name == "IQ4_NL" else None
    elif name == "Q4_1":  # d, m f16, nibbles: value d q + m
        codes = _nibbles(blocks[..., 4:20])
        codes, scales, zeros = _affine(codes, _f16(blocks, 0), -_f16(blocks, 2, "m"))
    elif name == "MXFP4":  # E8M0 exponent e, nibbles of e2m1: value 2^(e - 127) v[q]
        e = blocks[..., 0]
        if (e >= 253).any():  # 2^(e - 127) * 6 beyond float32 (0xFF is NaN in OCP MX)
            r, b = np.argwhere(e >= 253)[0]
            raise ValueError(f"data: row {r}, block {b} has the E8M0 exponent {e[r, b]:#04x}: weights up to "
                             f"6 * 2^{int(e[r, b]) - 127} exceed float32 (msgemm keeps weights finite)")
        scales = np.ldexp(np.float32(1.0), e.astype(np.int32) - 127).astype(np.float32)
        codes = _nibbles(blocks[..., 1:17])
    elif name == "NVFP4":  # 4 unsigned E4M3 scales (one per 16 weights), then 4 x 8 bytes of nibbles
        sb = blocks[..., 0:4]
        if (sb & 0x80).any():
            r, b = np.argwhere((sb & 0x80).any(axis=-1))[0]
            raise ValueError(f"data: row {r}, block {b} has a scale byte with bit 7 set (not unsigned E4M3)")
        exp = (sb >> 3).astype(np.int32)
        man = (sb & 7).astype(np.float64)
        val = np.where(exp == 0, man * 2.0**-9, (1.0 + man / 8.0) * np.ldexp(1.0, exp - 7))
        scales = np.where(sb == 0x7F, 0.0, val).astype(np.float32).reshape(m, nb * 4)  # 0x7F: ggml reads 0
        codes = _nibbles(blocks[..., 4:36].reshape(m, nb, 4, 8))
    elif name == "TQ2_0":  # 64 bytes of 2-bit trits (t = v + 1), d f16
        codes = _crumbs(blocks[..., 0:64])
        if (codes == 3).any():
            r, c = np.argwhere((codes == 3).any(axis=-1))[0]
            raise ValueError(f"data: row {r}, block {c} holds the 2-bit code 3, which TQ2_0 does not use")
        scales = _f16(blocks, 64)
    elif name == "TQ1_0":  # 48 bytes of 5 trits, 4 bytes of 4 trits (base 3, fixed point), d f16
        # A byte b holds trits t_i = ((b * 3^i mod 256) * 3) >> 8, i = 0.. (ggml's fixed-point
        # base-3 digits, most significant first); byte j of a run of n bytes gives weight i n + j.
        def trits(qs: np.ndarray, count: int) -> np.ndarray:
            powers = np.array([1, 3, 9, 27, 81][:count], np.uint8).reshape(count, 1)
            digits = (qs[..., None, :] * powers).astype(np.uint16) * 3 >> 8
            return digits.astype(np.uint8).reshape(*qs.shape[:-1], -1)

        codes = np.concatenate(
            [trits(blocks[..., 0:32], 5), trits(blocks[..., 32:48], 5), trits(blocks[..., 48:52], 4)], axis=-1)
        scales = _f16(blocks, 52)
    elif name == "Q8_0":  # d f16, 32 int8 q: value d q (our int8 code: q + 128)
        scales = _f16(blocks, 0)
        codes = blocks[..., 2:34] ^ 0x80
    elif name in ("Q5_0", "Q5_1"):  # d (Q5_1: and m) f16, 32 high bits, 16 bytes of nibbles
        at = 2 if name == "Q5_0" else 4
        high = (blocks[..., at:at + 4, None] >> np.arange(8, dtype=np.uint8)) & 1  # bit j of a u32
        q = _nibbles(blocks[..., at + 4:at + 20]) + 16 * high.reshape(m, nb, 32)  # 0..31
        if name == "Q5_0":  # value d (q - 16)
            scales, codes = _f16(blocks, 0), q + 112
        else:  # value d q + m
            codes, scales, zeros = _affine(q, _f16(blocks, 0), -_f16(blocks, 2, "m"))
    elif name == "Q6_K":  # 128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 scales, d f16
        # Per half block of 128 weights: 64 low-nibble bytes and 32 high-bit bytes; weight
        # 32 t + l (t = 0..3) takes nibble t // 2 of byte l + 32 (t % 2) and bits 2t, 2t + 1 of
        # high byte l. Value d sc (q - 32), one int8 sc per 16 weights.
        ql = blocks[..., 0:128].reshape(m, nb, 2, 64)
        qh = blocks[..., 128:192].reshape(m, nb, 2, 32)
        low = np.concatenate([ql[..., 0:32] & 0x0F, ql[..., 32:64] & 0x0F, ql[..., 0:32] >> 4, ql[..., 32:64] >> 4],
                             axis=-1)
        high = (qh[..., None, :] >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)) & 3
        codes = low + 16 * high.reshape(m, nb, 2, 128) + 96  # our int8 code: q - 32 + 128
        sc = np.ascontiguousarray(blocks[..., 192:208]).view(np.int8).astype(np.float32)
        scales = (_f16(blocks, 208)[..., None] * sc).reshape(m, nb * 16)
    elif name == "Q5_K":  # d, dmin f16, 12 bytes of 6-bit scales and mins (as Q4_K), 32 of high bits, nibbles
        sc, mn = _k_scales_mins(blocks[..., 4:16])
        # Weight 32 h + l (h = 0..7, l = 0..31): its nibble as Q4_K's, plus 16 times bit h
        # of high byte l.
        high = (blocks[..., 16:48][..., None, :] >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1
        q = _nibbles(blocks[..., 48:176].reshape(m, nb, 4, 32)).reshape(m, nb, 256) + 16 * high.reshape(m, nb, 256)
        d = _f16(blocks, 0)[..., None] * sc
        mins = _f16(blocks, 2, "dmin")[..., None] * mn
        codes, scales, zeros = _affine(q, d.reshape(m, nb * 8), mins.reshape(m, nb * 8))
    elif name == "Q2_K":  # 16 bytes of (min << 4 | scale), 64 bytes of crumbs, d, dmin f16
        sm = blocks[..., 0:16]
        d = _f16(blocks, 80)[..., None] * (sm & 0x0F)
        mins = _f16(blocks, 82, "dmin")[..., None] * (sm >> 4)
        codes = _crumbs(blocks[..., 16:80])
        codes, scales, zeros = _affine(codes, d.reshape(m, nb * 16), mins.reshape(m, nb * 16))
    elif name == "Q3_K":  # 32 bytes of high bits, 64 of crumbs, 12 of 6-bit scales, d f16
        low = _crumbs(blocks[..., 32:96])
        hmask = blocks[..., 0:32]
        high = (hmask[..., None, :] >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1
        codes = low + 4 * high.reshape(m, nb, 256)  # value q - 4: a clear high bit subtracts 4
        sc = blocks[..., 96:108].astype(np.int32)
        i = np.arange(16)
        six = ((sc[..., i % 8] >> (4 * (i // 8))) & 0x0F) | (((sc[..., 8 + i % 4] >> (2 * (i // 4))) & 3) << 4)
        scales = (_f16(blocks, 108)[..., None] * (six - 32)).reshape(m, nb * 16).astype(np.float32)
    elif name == "Q4_K":  # d, dmin f16, 12 bytes of 6-bit scales and mins, 4 x 32 bytes of nibbles
        sc, mn = _k_scales_mins(blocks[..., 4:16])
        d = _f16(blocks, 0)[..., None] * sc
        mins = _f16(blocks, 2, "dmin")[..., None] * mn
        codes = _nibbles(blocks[..., 16:144].reshape(m, nb, 4, 32))
        codes, scales, zeros = _affine(codes, d.reshape(m, nb * 8), mins.reshape(m, nb * 8))
    else:  # IQ4_XS: d f16, 16 bits of high scale bits, 4 bytes of low ones, 8 x 16 bytes of nibbles
        hi = np.ascontiguousarray(blocks[..., 2:4]).view("<u2")[..., 0].astype(np.int32)
        lo4 = blocks[..., 4:8].astype(np.int32)
        i = np.arange(8)
        six = ((lo4[..., i // 2] >> (4 * (i % 2))) & 0x0F) | (((hi[..., None] >> (2 * i)) & 3) << 4)
        scales = (_f16(blocks, 0)[..., None] * (six - 32)).reshape(m, nb * 8).astype(np.float32)
        codes = _nibbles(blocks[..., 8:136].reshape(m, nb, 8, 16))
        codebook = IQ4_VALUES
    codes = np.ascontiguousarray(codes, dtype=np.uint8).reshape(m, k)
    scales = np.ascontiguousarray(scales, dtype=np.float32).reshape(m, k // group)
    if zeros is not None:
        zeros = np.ascontiguousarray(zeros, dtype=np.float32).reshape(m, k // group)
    return Decoded(codes, scales, zeros, fmt, codebook)


#: Byte offsets of each supported type's float16 fields within a block.
F16_FIELDS = {"Q4_0": (0,), "IQ4_NL": (0,), "Q4_1": (0, 2), "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2),
              "IQ4_XS": (0,), "TQ1_0": (52,), "TQ2_0": (64,), "MXFP4": (), "NVFP4": (), "Q8_0": (0,),
              "Q6_K": (208,), "Q5_0": (0,), "Q5_1": (0, 2), "Q5_K": (0, 2)}


def random_blocks(name: str, m: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """``(m, bytes per row)`` uint8 of random ``name`` blocks (test and benchmark data): random
    bytes with float16 fields in +-[0.01, 2], TQ2_0 codes in 0..2, MXFP4 exponents 110..134 and
    NVFP4 scale bytes below 0x80 (0x7F, which ggml reads as 0, included)."""
    bs, ts = SUPPORTED[name][:2]
    nb = k // bs
    b = rng.integers(0, 256, (m, nb, ts), dtype=np.uint8)
    for at in F16_FIELDS[name]:
        v = (rng.uniform(0.01, 2.0, (m, nb)) * rng.choice([-1.0, 1.0], (m, nb))).astype("<f2")
        b[..., at:at + 2] = v.view(np.uint8).reshape(m, nb, 2)
    if name == "TQ2_0":
        t = rng.integers(0, 3, (m, nb, 64, 4), dtype=np.uint8)
        b[..., 0:64] = t[..., 0] | t[..., 1] << 2 | t[..., 2] << 4 | t[..., 3] << 6
    elif name == "MXFP4":  # scales 2^-17 .. 2^7, as in models (and float16 values)
        b[..., 0] = rng.integers(110, 135, (m, nb))
    elif name == "NVFP4":
        b[..., 0:4] = rng.integers(0, 0x80, (m, nb, 4))
    return b.reshape(m, nb * ts)
