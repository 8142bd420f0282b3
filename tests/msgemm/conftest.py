"""Shared helpers of the msgemm tests: integer test data and the backends of this machine."""

from __future__ import annotations

import re

import numpy as np
import pytest

from maleki_rs import msgemm as mg

#: Every backend usable here ("scalar", "reference", plus the SIMD ones the CPU supports).
BACKENDS = mg.available_backends()


def cpu_has(*names: str) -> bool:
    """Whether numpy's run-time CPU detection (CPUID on x86-64: under qemu-user the emulated
    CPU's, unlike /proc/cpuinfo) found all these features (numpy's names: "AVX512F",
    "AVX512BF16", "FMA3", ...): an oracle independent of the library's own detection."""
    from numpy._core._multiarray_umath import __cpu_features__

    return all(__cpu_features__.get(n, False) for n in names)


def _cpu_family() -> int:
    """The first "cpu family" of /proc/cpuinfo (AMD Zen 4: 25, Zen 5: 26), or 0."""
    m = re.search(r"^cpu family\s*:\s*(\d+)", _cpuinfo(), re.M)
    return int(m.group(1)) if m else 0


def _cpuinfo() -> str:
    """/proc/cpuinfo (Linux; the host's under qemu-user), or "" elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


def cpu_flags(*names: str) -> bool:
    """Whether /proc/cpuinfo lists all these flags."""
    info = _cpuinfo()
    return all(f" {n}" in info for n in names)


def _emulated() -> bool:
    """Whether numpy's CPUID detection and /proc/cpuinfo disagree on basic x86 features (under
    qemu-user, the emulated CPU's features against the host's)."""
    pairs = [("AVX2", "avx2"), ("AVX512F", "avx512f"), ("F16C", "f16c"), ("FMA3", "fma")]
    return any(cpu_has(n) != cpu_flags(f) for n, f in pairs)


def avx2_kernel() -> str | None:
    """The dense kernel backend ``avx2`` should run on this CPU (``plan_info``'s
    ``dense_kernel``): ``"avx2-vnni"`` with AVX-VNNI (from /proc/cpuinfo, which numpy does not
    detect; taken as absent under emulation, where /proc/cpuinfo is the host's), ``"avx2"``
    with AVX2 and F16C, else None."""
    if not cpu_has("AVX2", "F16C"):
        return None
    return "avx2-vnni" if cpu_flags("avx_vnni") and not _emulated() else "avx2"


def bf16_kernels() -> dict[str, str]:
    """The kernel each backend should run in ``bf16`` mode on this CPU (backend -> the
    ``bf16_kernel`` that :func:`maleki_rs.msgemm.plan_info` reports), by the documented rule:
    AMX where the tiles are granted (the dense AMX backend runs) with AMX-BF16 and AVX-512
    BF16; on AVX-512, ``vdpbf16ps`` on AMD CPUs with AVX-512 BF16, FMA elsewhere; FMA on
    AVX2."""
    out = {"scalar": "scalar"}
    if "amx" in BACKENDS and cpu_flags("amx_bf16", "avx512_bf16"):
        out["amx"] = "amx-tdpbf16ps"
    if cpu_has("AVX512F", "AVX512BW", "AVX512BF16") and "AuthenticAMD" in _cpuinfo():
        out["avx512"] = "avx512-vdpbf16ps"
    elif cpu_has("AVX512F", "F16C"):
        out["avx512"] = "avx512-fma"
    if cpu_has("AVX2", "FMA3", "F16C"):
        out["avx2"] = "avx2-fma"
    return out


def dense_to_bf16_min_n(kernel: str | None, g: int) -> int | None:
    """The documented columns (``bf16::dense_to_bf16_min_n``) from which a default batch that
    the dense ``i16`` path would run takes ``bf16`` mode on the ``bf16`` kernel ``kernel``
    instead, for group size ``g`` (None: never)."""
    if kernel == "amx-tdpbf16ps":
        return 8 if g <= 16 else 32 if g <= 32 else None
    if kernel == "avx512-vdpbf16ps":  # Zen 5 (family 0x1A) and later; Zen 4 below
        if _cpu_family() >= 0x1A:
            return 24 if g <= 16 else 48 if g <= 32 else None
        return 32 if g <= 16 else None
    return 32 if kernel in ("avx512-fma", "avx2-fma") and g <= 16 else None


def dense_gemv_default(pw: mg.PackedWeights, backend: str = "auto") -> bool:
    """Whether a default-table GEMV of ``pw`` on ``backend`` runs on the dense ``i16`` path,
    by the documented rule (``dense::gemv_preferred``): AVX-512 VNNI on AMD CPUs, AVX2 on
    any with groups of at least 32, weights whose ``i16`` GEMV the dense path runs (2-bit codes: on the 2-bit layout,
    groups a multiple of 16, AVX-512 VNNI or AVX-VNNI)."""
    if backend not in ("auto", "avx512", "avx2"):
        return False
    vnni512 = cpu_has("AVX512F", "AVX512BW", "AVX512VNNI")
    if backend == "avx2" or (backend == "auto" and not vnni512):
        if not cpu_has("AVX2", "F16C") or pw.group_size < 32:
            return False
    elif not (vnni512 and "AuthenticAMD" in _cpuinfo()):
        return False
    try:
        return mg.plan_info(pw, n=1, table="i16", backend=backend)["dense_int8"]
    except ValueError:  # no `i16` plan (float codebooks)
        return False


#: Formats with dyadic codebooks: exact on integer data. (format, depths to test)
EXACT_FORMATS = [
    ("int4", (1, 2, 3)),
    ("uint4", (2, 3)),
    ("int3", (1, 2, 3)),
    ("uint3", (2,)),
    ("int2", (2, 3, 4, 5)),
    ("uint2", (4,)),
    ("ternary", (3, 5, 6)),
    ("fp4", (1, 2, 3)),
    ("codebook", (2,)),
    ("fp8_e4m3", (1,)),
    ("fp8_e5m2", (1,)),
    ("int8", (1,)),
    ("uint8", (1,)),
]

#: A dyadic custom codebook of 12 values (symmetric: it has a mirror).
CUSTOM = np.array([-6, -4, -3, -2, -1, -0.5, 0.5, 1, 2, 3, 4, 6], dtype=np.float32)


def valid_codes(fmt: str, rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Random codes of ``fmt``; fp8 codes restricted to |v| in [1/8, 16] or 0 so that sums of
    products with |x| <= 8 stay exact in float32."""
    cb = CUSTOM if fmt == "codebook" else mg.codebook(fmt)
    vals = np.asarray(cb, dtype=np.float64)
    ok = np.isfinite(vals)
    if fmt.startswith("fp8"):
        ok &= (vals == 0) | ((np.abs(vals) >= 0.125) & (np.abs(vals) <= 16))
    allowed = np.flatnonzero(ok).astype(np.uint8)
    return rng.choice(allowed, size=shape)


def integer_weights(fmt: str, rng: np.random.Generator, m: int, k: int, g: int, *, zeros: bool,
                    perm: bool = False, f16_scales: bool = True) -> mg.PackedWeights:
    """Packed weights with power-of-two scales and integer zero points (exact arithmetic).

    The scales are float16 values, so the kernels read them as float16, unless ``f16_scales``
    is false: then row 0's scales are scaled by 2^-30 (still exact: the row's sums scale
    with them), below float16's range, and the kernels read float32 scales."""
    codes = valid_codes(fmt, rng, (m, k))
    scales = np.ldexp(1.0, rng.integers(-2, 2, size=(m, k // g))).astype(np.float32)
    scales *= rng.choice([-1.0, 1.0], size=scales.shape).astype(np.float32)
    if not f16_scales:
        scales[0] *= np.float32(2.0**-30)
    z = rng.integers(-2, 4, size=(m, k // g)).astype(np.float32) if zeros else None
    kp = rng.permutation(k).astype(np.uint32) if perm else None
    pw = mg.PackedWeights.from_arrays(codes, scales, z, format=fmt,
                                      codebook=CUSTOM if fmt == "codebook" else None, k_perm=kp)
    assert pw.scale_dtype == (np.float16 if f16_scales else np.float32)
    return pw


def integer_x(rng: np.random.Generator, k: int, n: int | None) -> np.ndarray:
    shape = (k,) if n is None else (k, n)
    return rng.integers(-8, 9, size=shape).astype(np.float32)


@pytest.fixture
def one_and_two_threads():
    """Restores the library's thread count after a test changes it."""
    import maleki_rs

    old = maleki_rs.get_num_threads()
    yield
    maleki_rs.set_num_threads(old)
