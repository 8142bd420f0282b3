//! The fp8 path of `f32` mode: codes decoded in registers and multiplied into float32
//! accumulators, no tables.
//!
//! An fp8 codebook has 256 values and depth 1 only, so its tables hold 256 entries per input
//! and column (4 MiB per column at K = 4096), each built to be read about 16 times at M =
//! 4096, and no table kernel but the scalar one takes them (measured before this path, e4m3
//! g128 4096 x 4096 GEMV, 2 threads, Zen 5: 3.4 ms on `i8` tables, 6.5 ms on `f32` tables;
//! numpy on the float32 weights 1.1 ms). Here each weight is decoded where it is used, as the
//! fused GEMV of [`crate::fused`] does for 4-bit codes: every fp8 value is a float16 value,
//! which `vcvtph2ps` widens exactly. e5m2 is float16's upper byte (`h = b << 8`); e4m3 moved
//! into float16's fields (`h = (b & 0x80) << 8 | (b & 0x7f) << 7`) is its value times 2^-8
//! (exponent biases 7 and 15), subnormals included, so the vector kernels read the
//! activations times 2^8 (scaled once per call, exactly) and each product is `v x` exactly.
//! Inputs of magnitude 2^120 or more would overflow that scaling: such calls run on the
//! portable kernel, which reads the codebook's values directly (same bits).
//!
//! The arithmetic, which every kernel follows bit for bit: for row `r`, column `c` and 16
//! lanes `l`, for each group `g` in ascending order
//! - `p_l = +0`, then for the inputs `k` of the group with `(k - g G) mod 16 = l`, in
//!   ascending order, `p_l = fma(v[q_rk], x_ck, p_l)`;
//! - `t_l = fma(s_rg, p_l, t_l)` (from `t_l = +0`);
//!
//! then `y_rc` is the tree `u_l = t_l + t_(l+8)` (l < 8), `w_l = u_l + u_(l+4)` (l < 4),
//! `z_l = w_l + w_(l+2)` (l < 2), `y = z_0 + z_1` (the AVX-512 and AVX2 reductions' order).
//! Each product is exact and each step rounds once, so `|y - Wd @ x|` is at most about
//! `(G/16 + K/G + 5) 2^-24 (|Wd| @ |x|)`, inside the `f32` tables' bound
//! `2 (K + 4) 2^-24 (|Wd| @ |x|)`; the tests' oracle is that bound on the float64 product.
//!
//! Applies to `f32` calls of fp8 weights (e4m3, e5m2) without zero points on backends `auto`
//! and `avx512` (AVX-512 F, BW, VL; any group size) and `avx2` (AVX2, FMA, F16C; group
//! sizes that are multiples of 16) on x86-64, `auto` and `neon` on Arm64 (the portable
//! kernel, which the compiler vectorizes there: `f32::mul_add` is one instruction). The
//! Python default (`table=None`) takes it for every such call.

use std::borrow::Cow;

use rayon::prelude::*;

use maleki_common::{alloc, pool, Result};

use crate::format::Format;
use crate::gemm::{GemmOptions, YLayout};
use crate::kernels::Backend;
use crate::packed::PackedWeights;
use crate::plan::TablePrecision;

/// Lanes of the arithmetic (one zmm of float32).
pub const LANES: usize = 16;

/// Rows per parallel task.
const ROWS_PER_TASK: usize = 64;

/// Inputs of at least this magnitude, 2^120 exactly, overflow the e4m3 kernels' scaling by
/// 2^8 (below it, `x 2^8` is at most float32's largest value).
const E4M3_X_LIMIT: f32 = f32::from_bits((127 + 120) << 23);

/// A kernel of the fp8 path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// AVX-512 F, BW and VL: 16 codes per `vcvtph2ps`, any group size (masked tails).
    Avx512,
    /// AVX2, FMA and F16C: 16 codes as two halves, group sizes that are multiples of 16.
    Avx2,
    /// Plain Rust (`f32::mul_add`): the definition; vectorized by the compiler on Arm64.
    Portable,
}

impl Kernel {
    /// Its name in `plan_info` (`fp8_kernel`).
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Avx512 => "avx512",
            Kernel::Avx2 => "avx2",
            Kernel::Portable => "portable",
        }
    }

    /// The backend reported for calls that run on it.
    pub fn backend(self) -> Backend {
        match self {
            Kernel::Avx512 => Backend::Avx512,
            Kernel::Avx2 => Backend::Avx2,
            Kernel::Portable if cfg!(target_arch = "aarch64") => Backend::Neon,
            Kernel::Portable => Backend::Scalar,
        }
    }

    /// Whether this CPU runs it on weights of group size `g`.
    pub fn runs(self, g: usize) -> bool {
        match self {
            Kernel::Avx512 => avx512_ready(),
            Kernel::Avx2 => avx2_ready() && g.is_multiple_of(LANES),
            Kernel::Portable => true,
        }
    }
}

fn avx512_ready() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn avx2_ready() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the weights are fp8 codes (e4m3 or e5m2).
pub fn is_fp8(pw: &PackedWeights) -> bool {
    matches!(pw.codebook().format(), Format::Fp8E4m3 | Format::Fp8E5m2)
}

/// The kernel that runs a call with `opts` on these weights, or `None`: not an `f32` call of
/// fp8 weights without zero points, mirror or a fixed depth other than 1, or no kernel of
/// `opts.backend` for them on this CPU (the tables then run it).
pub fn kernel_for(pw: &PackedWeights, opts: &GemmOptions) -> Option<Kernel> {
    use crate::gemm::Depth;
    if !is_fp8(pw)
        || pw.zeros().is_some()
        || opts.precision != TablePrecision::F32
        || opts.mirror
        || !matches!(opts.depth, Depth::Auto | Depth::Fixed(1))
    {
        return None;
    }
    let g = pw.group_size();
    let arm = cfg!(target_arch = "aarch64");
    match opts.backend {
        Backend::Auto | Backend::Avx512 if Kernel::Avx512.runs(g) => Some(Kernel::Avx512),
        Backend::Auto | Backend::Avx2 if Kernel::Avx2.runs(g) => Some(Kernel::Avx2),
        Backend::Auto | Backend::Neon if arm => Some(Kernel::Portable),
        _ => None,
    }
}

/// What a kernel reads of the weights.
struct Weights<'a> {
    codes: &'a [u8],
    scales: &'a [f32],
    k: usize,
    g: usize,
    groups: usize,
    /// e4m3 (not e5m2) codes: which decode the x86-64 kernels run (Arm64 has only the
    /// portable kernel, which reads `values`).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    e4m3: bool,
    /// The codebook's values (invalid codes read 0): the portable kernel's decoder (empty for
    /// the others).
    values: Vec<f32>,
}

/// `y = Wd @ X` on `kernel` (from [`kernel_for`], or any kernel in tests), `xt` `(N, K)`
/// row-major in packed column order, finite; `y` (`M N` floats, `y_layout`) is overwritten.
/// `here`: `None` runs the row blocks in parallel on the current pool; `Some(two)` runs on the
/// calling thread, off every pool, with the helper thread taking half of the rows when `two`
/// ([`pool::join_here`]). Errors only when a copy does not fit in memory.
pub fn run(
    pw: &PackedWeights,
    kernel: Kernel,
    xt: &[f32],
    n: usize,
    y: &mut [f32],
    y_layout: YLayout,
    here: Option<bool>,
) -> Result<()> {
    let (m, k) = (pw.m(), pw.k());
    assert!(
        xt.len() == n * k && y.len() == m * n && kernel.runs(pw.group_size()),
        "float8::run: x or y of the wrong length, or a kernel this CPU does not run"
    );
    let e4m3 = pw.codebook().format() == Format::Fp8E4m3;
    // The vector kernels' e4m3 decode is `v 2^-8`: they read `x 2^8` (exact below 2^120).
    let (kernel, xs): (Kernel, Cow<'_, [f32]>) = if e4m3 && kernel != Kernel::Portable {
        if xt.iter().any(|v| v.abs() >= E4M3_X_LIMIT) {
            (Kernel::Portable, Cow::Borrowed(xt))
        } else {
            let mut s = alloc::zeroed_vec::<f32>(xt.len(), "the scaled activations")?;
            for (o, &v) in s.iter_mut().zip(xt) {
                *o = v * 256.0;
            }
            (kernel, Cow::Owned(s))
        }
    } else {
        (kernel, Cow::Borrowed(xt))
    };
    let w = Weights {
        codes: pw.packed(),
        scales: pw.scales(),
        k,
        g: pw.group_size(),
        groups: pw.groups(),
        e4m3,
        values: if kernel == Kernel::Portable {
            pw.codebook().table_values()
        } else {
            Vec::new()
        },
    };
    let xs = &xs[..];
    // Rows `r0 ..` into `out` (`(rows, N)` row-major).
    let rows = |r0: usize, out: &mut [f32]| block(&w, kernel, xs, n, r0, out);
    let mut tmp = Vec::new();
    let target: &mut [f32] = if n == 1 || y_layout == YLayout::MbyN {
        y
    } else {
        tmp = alloc::zeroed_vec::<f32>(m * n, "the output rows")?;
        &mut tmp
    };
    match here {
        None => target
            .par_chunks_mut(ROWS_PER_TASK * n)
            .enumerate()
            .for_each(|(i, out)| rows(i * ROWS_PER_TASK, out)),
        Some(two) => {
            let half = if two { m.div_ceil(2) } else { m };
            let (a, b) = target.split_at_mut(half * n);
            if b.is_empty() {
                rows(0, a);
            } else {
                pool::join_here(|| rows(0, a), || rows(half, b));
            }
        }
    }
    if !tmp.is_empty() {
        // `(M, N)` rows to the `(N, M)` output.
        let fill = |(c, col): (usize, &mut [f32])| {
            for (r, v) in col.iter_mut().enumerate() {
                *v = tmp[r * n + c];
            }
        };
        match here {
            None => y.par_chunks_mut(m).enumerate().for_each(fill),
            Some(_) => y.chunks_mut(m).enumerate().for_each(fill),
        }
    }
    Ok(())
}

/// Rows `r0 .. r0 + out.len() / n`, every column, into `out` on `kernel`.
fn block(w: &Weights, kernel: Kernel, xs: &[f32], n: usize, r0: usize, out: &mut [f32]) {
    let rows = out.len() / n;
    match kernel {
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => {
            // SAFETY: `run` checked `kernel.runs` (AVX-512 F, BW, VL); `xs` holds N columns of
            // K, `out` the rows' N outputs, and the rows are rows of the weights.
            unsafe {
                if w.e4m3 {
                    avx512::block::<true>(w, xs, n, r0, out)
                } else {
                    avx512::block::<false>(w, xs, n, r0, out)
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => {
            // SAFETY: `run` checked `kernel.runs` (AVX2, FMA, F16C, G a multiple of 16); the
            // lengths as above.
            unsafe {
                if w.e4m3 {
                    avx2::block::<true>(w, xs, n, r0, out)
                } else {
                    avx2::block::<false>(w, xs, n, r0, out)
                }
            }
        }
        _ => {
            for r in 0..rows {
                for c in 0..n {
                    out[r * n + c] = portable(w, &xs[c * w.k..(c + 1) * w.k], r0 + r);
                }
            }
        }
    }
}

/// The definition (module docs) for one row and column, on the codebook's values.
fn portable(w: &Weights, x: &[f32], row: usize) -> f32 {
    let codes = &w.codes[row * w.k..(row + 1) * w.k];
    let mut t = [0f32; LANES];
    for gi in 0..w.groups {
        let mut p = [0f32; LANES];
        let span = gi * w.g..(gi + 1) * w.g;
        for (i, (&q, &xv)) in codes[span.clone()].iter().zip(&x[span]).enumerate() {
            let l = i % LANES;
            p[l] = w.values[usize::from(q)].mul_add(xv, p[l]);
        }
        let s = w.scales[row * w.groups + gi];
        for (tl, &pl) in t.iter_mut().zip(&p) {
            *tl = s.mul_add(pl, *tl);
        }
    }
    reduce(t)
}

/// The lanes' fixed summation tree (module docs).
fn reduce(t: [f32; LANES]) -> f32 {
    let u: [f32; 8] = std::array::from_fn(|l| t[l] + t[l + 8]);
    let v: [f32; 4] = std::array::from_fn(|l| u[l] + u[l + 4]);
    (v[0] + v[2]) + (v[1] + v[3])
}

/// 16 fp8 codes as float16 bits (e4m3: the value times 2^-8; e5m2: the value): e5m2 is
/// float16's upper byte; e4m3 sign-extended and shifted left 7 has its sign at bits 15 and
/// 14 and exponent and mantissa at 13..7, and bit 14 is cleared.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
fn half_bits<const E4M3: bool>(b: std::arch::x86_64::__m128i) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    if E4M3 {
        _mm256_and_si256(
            _mm256_slli_epi16::<7>(_mm256_cvtepi8_epi16(b)),
            _mm256_set1_epi16(0xbfffu16 as i16),
        )
    } else {
        _mm256_slli_epi16::<8>(_mm256_cvtepu8_epi16(b))
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{reduce, Weights, LANES};

    /// 16 codes widened to float32: e4m3 as `v 2^-8`, e5m2 as `v`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    fn decode<const E4M3: bool>(b: __m128i) -> __m512 {
        _mm512_cvtph_ps(super::half_bits::<E4M3>(b))
    }

    /// 32 codes widened to float32, as [`decode`] (the same bits on 32 lanes of 16 bits):
    /// inputs 0-15 and 16-31.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    fn decode32<const E4M3: bool>(b: __m256i) -> (__m512, __m512) {
        let h = if E4M3 {
            _mm512_and_si512(
                _mm512_slli_epi16::<7>(_mm512_cvtepi8_epi16(b)),
                _mm512_set1_epi16(0xbfffu16 as i16),
            )
        } else {
            _mm512_slli_epi16::<8>(_mm512_cvtepu8_epi16(b))
        };
        (
            _mm512_cvtph_ps(_mm512_castsi512_si256(h)),
            _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(h)),
        )
    }

    /// Sums the lanes in the order of [`reduce`].
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn hsum(t: __m512) -> f32 {
        unsafe {
            let mut a = [0f32; LANES];
            _mm512_storeu_ps(a.as_mut_ptr(), t);
            reduce(a)
        }
    }

    /// Rows `r0 .. r0 + R`, columns `c0 .. c0 + C` into `out[r][c]` (stride `n`): per 16
    /// inputs, `R` decodes and `R C` FMAs into independent accumulators.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn tile<const R: usize, const C: usize, const E4M3: bool>(
        w: &Weights,
        xs: &[f32],
        n: usize,
        (r0, rl): (usize, usize),
        c0: usize,
        out: &mut [f32],
    ) {
        unsafe {
            let codes: [*const u8; R] =
                std::array::from_fn(|i| w.codes.as_ptr().add((r0 + i) * w.k));
            let xp: [*const f32; C] = std::array::from_fn(|j| xs.as_ptr().add((c0 + j) * w.k));
            let mut t = [[_mm512_setzero_ps(); C]; R];
            for gi in 0..w.groups {
                let mut p = [[_mm512_setzero_ps(); C]; R];
                let (mut k, end) = (gi * w.g, (gi + 1) * w.g);
                // 32 inputs per step: one widening of 32 codes, two conversions, and the
                // two halves' FMAs into the same lanes, in input order.
                while k + 2 * LANES <= end {
                    let xa: [__m512; C] = std::array::from_fn(|j| _mm512_loadu_ps(xp[j].add(k)));
                    let xb: [__m512; C] =
                        std::array::from_fn(|j| _mm512_loadu_ps(xp[j].add(k + LANES)));
                    for i in 0..R {
                        let (wa, wb) =
                            decode32::<E4M3>(_mm256_loadu_si256(codes[i].add(k) as *const __m256i));
                        for j in 0..C {
                            p[i][j] = _mm512_fmadd_ps(wa, xa[j], p[i][j]);
                            p[i][j] = _mm512_fmadd_ps(wb, xb[j], p[i][j]);
                        }
                    }
                    k += 2 * LANES;
                }
                while k < end {
                    // A full step, or the group's masked tail (masked lanes read code 0 and
                    // input 0: a `+0` product, which leaves a sum that is never `-0` unchanged).
                    let mask: u16 = if end - k >= LANES {
                        u16::MAX
                    } else {
                        (1u16 << (end - k)) - 1
                    };
                    let xv: [__m512; C] =
                        std::array::from_fn(|j| _mm512_maskz_loadu_ps(mask, xp[j].add(k)));
                    for i in 0..R {
                        let wv = decode::<E4M3>(_mm_maskz_loadu_epi8(
                            mask,
                            codes[i].add(k) as *const i8,
                        ));
                        for j in 0..C {
                            p[i][j] = _mm512_fmadd_ps(wv, xv[j], p[i][j]);
                        }
                    }
                    k += LANES;
                }
                for i in 0..R {
                    let s = _mm512_set1_ps(*w.scales.get_unchecked((r0 + i) * w.groups + gi));
                    for j in 0..C {
                        t[i][j] = _mm512_fmadd_ps(s, p[i][j], t[i][j]);
                    }
                }
            }
            for i in 0..R {
                for j in 0..C {
                    out[(rl + i) * n + c0 + j] = hsum(t[i][j]);
                }
            }
        }
    }

    /// Rows `r0 ..` of [`super::block`], in tiles of rows x columns.
    ///
    /// # Safety
    /// AVX-512 F, BW and VL; `xs` holds `N` columns of `K`, `out` whole rows of `N` outputs
    /// of rows of the weights.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn block<const E4M3: bool>(
        w: &Weights,
        xs: &[f32],
        n: usize,
        r0: usize,
        out: &mut [f32],
    ) {
        unsafe {
            let rows = out.len() / n;
            // Row x column tiles within the 32 registers: 4 x 4 (16 sums and their 16 group
            // totals, 8 activation vectors), 4 x 2, 2 x 3 for three columns, 4 x 1 for a GEMV.
            let rb = if n == 3 { 2 } else { 4 };
            let mut r = 0;
            while r < rows {
                let rt = if rows - r >= rb { rb } else { 1 };
                let mut c = 0;
                while c < n {
                    let at = (r0 + r, r);
                    let step = match (rt, n - c) {
                        (4, 4..) => {
                            tile::<4, 4, E4M3>(w, xs, n, at, c, out);
                            4
                        }
                        (4, 2 | 3) => {
                            tile::<4, 2, E4M3>(w, xs, n, at, c, out);
                            2
                        }
                        (4, _) => {
                            tile::<4, 1, E4M3>(w, xs, n, at, c, out);
                            1
                        }
                        (2, 3..) => {
                            tile::<2, 3, E4M3>(w, xs, n, at, c, out);
                            3
                        }
                        (2, _) => {
                            tile::<2, 1, E4M3>(w, xs, n, at, c, out);
                            1
                        }
                        (_, 4..) => {
                            tile::<1, 4, E4M3>(w, xs, n, at, c, out);
                            4
                        }
                        (_, 3) => {
                            tile::<1, 3, E4M3>(w, xs, n, at, c, out);
                            3
                        }
                        (_, 2) => {
                            tile::<1, 2, E4M3>(w, xs, n, at, c, out);
                            2
                        }
                        _ => {
                            tile::<1, 1, E4M3>(w, xs, n, at, c, out);
                            1
                        }
                    };
                    c += step;
                }
                r += rt;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{reduce, Weights, LANES};

    /// 16 codes widened to float32 as two halves (lanes 0-7, 8-15), as the AVX-512 decode.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn decode<const E4M3: bool>(b: __m128i) -> (__m256, __m256) {
        let h = super::half_bits::<E4M3>(b);
        (
            _mm256_cvtph_ps(_mm256_castsi256_si128(h)),
            _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h)),
        )
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hsum(lo: __m256, hi: __m256) -> f32 {
        unsafe {
            let mut a = [0f32; LANES];
            _mm256_storeu_ps(a.as_mut_ptr(), lo);
            _mm256_storeu_ps(a.as_mut_ptr().add(8), hi);
            reduce(a)
        }
    }

    /// Rows `r0 .. r0 + R`, columns `c0 .. c0 + C` into `out[r][c]` (stride `n`): each
    /// accumulator a pair of registers (lanes 0-7, 8-15).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<const R: usize, const C: usize, const E4M3: bool>(
        w: &Weights,
        xs: &[f32],
        n: usize,
        (r0, rl): (usize, usize),
        c0: usize,
        out: &mut [f32],
    ) {
        unsafe {
            let codes: [*const u8; R] =
                std::array::from_fn(|i| w.codes.as_ptr().add((r0 + i) * w.k));
            let xp: [*const f32; C] = std::array::from_fn(|j| xs.as_ptr().add((c0 + j) * w.k));
            let zero = _mm256_setzero_ps();
            let mut t = [[(zero, zero); C]; R];
            for gi in 0..w.groups {
                let mut p = [[(zero, zero); C]; R];
                for k in (gi * w.g..(gi + 1) * w.g).step_by(LANES) {
                    let xv: [(__m256, __m256); C] = std::array::from_fn(|j| {
                        (
                            _mm256_loadu_ps(xp[j].add(k)),
                            _mm256_loadu_ps(xp[j].add(k + 8)),
                        )
                    });
                    for i in 0..R {
                        let (w0, w1) =
                            decode::<E4M3>(_mm_loadu_si128(codes[i].add(k) as *const __m128i));
                        for j in 0..C {
                            p[i][j] = (
                                _mm256_fmadd_ps(w0, xv[j].0, p[i][j].0),
                                _mm256_fmadd_ps(w1, xv[j].1, p[i][j].1),
                            );
                        }
                    }
                }
                for i in 0..R {
                    let s = _mm256_set1_ps(*w.scales.get_unchecked((r0 + i) * w.groups + gi));
                    for j in 0..C {
                        t[i][j] = (
                            _mm256_fmadd_ps(s, p[i][j].0, t[i][j].0),
                            _mm256_fmadd_ps(s, p[i][j].1, t[i][j].1),
                        );
                    }
                }
            }
            for i in 0..R {
                for j in 0..C {
                    out[(rl + i) * n + c0 + j] = hsum(t[i][j].0, t[i][j].1);
                }
            }
        }
    }

    /// Rows `r0 ..` of [`super::block`]: GEMVs 2 rows at a time; batches a row by 2 columns
    /// (the 16 registers hold 4 sums, 4 group totals, 4 activation and 2 weight vectors).
    ///
    /// # Safety
    /// AVX2, FMA and F16C; the group size a multiple of 16; `xs` and `out` as for AVX-512.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn block<const E4M3: bool>(
        w: &Weights,
        xs: &[f32],
        n: usize,
        r0: usize,
        out: &mut [f32],
    ) {
        unsafe {
            let rows = out.len() / n;
            if n == 1 {
                let mut r = 0;
                while r < rows {
                    if rows - r >= 2 {
                        tile::<2, 1, E4M3>(w, xs, n, (r0 + r, r), 0, out);
                        r += 2;
                    } else {
                        tile::<1, 1, E4M3>(w, xs, n, (r0 + r, r), 0, out);
                        r += 1;
                    }
                }
                return;
            }
            for r in 0..rows {
                let mut c = 0;
                while c + 2 <= n {
                    tile::<1, 2, E4M3>(w, xs, n, (r0 + r, r), c, out);
                    c += 2;
                }
                if c < n {
                    tile::<1, 1, E4M3>(w, xs, n, (r0 + r, r), c, out);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fused::tests::gaussian;
    use crate::gemm::{gemm_into_layout, Depth, XLayout};
    use crate::{quantize, Codebook, QuantizeOptions};
    use maleki_common::rng;

    fn weights(f: Format, m: usize, k: usize, g: usize, seed: u64) -> PackedWeights {
        let mut o = QuantizeOptions::new(f);
        o.group_size = Some(g);
        // Magnitudes spread over a few binades, so that subnormal codes occur too.
        let w: Vec<f32> = gaussian(m * k, seed)
            .iter()
            .enumerate()
            .map(|(i, v)| v * [1.0, 1e-3, 30.0][i % 3])
            .collect();
        quantize(&w, m, k, &o).unwrap()
    }

    fn f32_opts(backend: Backend) -> GemmOptions {
        GemmOptions {
            depth: Depth::Auto,
            precision: TablePrecision::F32,
            backend,
            mirror: false,
        }
    }

    /// `(N, K)` activations in packed order -> `y` `(M, N)` on `kernel`.
    fn on(pw: &PackedWeights, kernel: Kernel, xt: &[f32], n: usize) -> Vec<f32> {
        let mut y = vec![0f32; pw.m() * n];
        pool::install(|| run(pw, kernel, xt, n, &mut y, YLayout::MbyN, None)).unwrap();
        y
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// The vector kernels give the portable kernel's bits (the module's definition): both
    /// fp8 formats, group sizes with and without a masked tail, every row and column tile.
    #[test]
    fn vector_kernels_give_the_definitions_bits() {
        for f in [Format::Fp8E4m3, Format::Fp8E5m2] {
            for (g, k) in [(16, 64), (32, 96), (128, 256), (8, 40), (24, 72), (40, 80)] {
                let pw = weights(f, 37, k, g, 5 + g as u64);
                for n in [1, 2, 3, 4, 5, 7, 9] {
                    let xt = gaussian(n * k, 11 + n as u64);
                    let want = bits(&on(&pw, Kernel::Portable, &xt, n));
                    for kernel in [Kernel::Avx512, Kernel::Avx2] {
                        if kernel.runs(g) {
                            let got = bits(&on(&pw, kernel, &xt, n));
                            assert_eq!(got, want, "{f:?} g{g} k{k} n{n} {kernel:?}");
                        }
                    }
                }
            }
        }
    }

    /// Against the float64 product of the dequantized weights, within the error bound of the
    /// module's arithmetic `(G/16 + K/G + 5) 2^-24 (|Wd| @ |x|)`, on the default call.
    #[test]
    fn default_calls_are_within_the_float32_bound() {
        for f in [Format::Fp8E4m3, Format::Fp8E5m2] {
            let (m, k, g, n) = (70, 512, 64, 3);
            let pw = weights(f, m, k, g, 3);
            let x = gaussian(k * n, 4);
            let wd = pw.dequantize();
            let mut y = vec![0f32; m * n];
            gemm_into_layout(
                &pw,
                &x,
                n,
                XLayout::KbyN,
                YLayout::MbyN,
                &f32_opts(Backend::Auto),
                &mut y,
            )
            .unwrap();
            let u = (g as f64 / 16.0 + (k / g) as f64 + 5.0) * 2f64.powi(-24);
            for r in 0..m {
                for c in 0..n {
                    let (mut exact, mut mag) = (0f64, 0f64);
                    for j in 0..k {
                        let p = wd[r * k + j] * f64::from(x[j * n + c]);
                        exact += p;
                        mag += p.abs();
                    }
                    let err = (f64::from(y[r * n + c]) - exact).abs();
                    assert!(err <= u * mag, "{f:?} ({r}, {c}): {err} > {}", u * mag);
                }
            }
        }
    }

    /// Inputs too large for the e4m3 kernels' scaling by 2^8 run on the portable kernel: the
    /// same bits, finite.
    #[test]
    fn huge_inputs_keep_the_definitions_bits() {
        let (m, k, g) = (9, 64, 32);
        // Codes of magnitude at most 1, so that `v x` stays finite.
        let cb = Codebook::new(Format::Fp8E4m3).unwrap();
        let small: Vec<u8> = (0..=255u8)
            .filter(|&c| cb.values()[usize::from(c)].abs() <= 1.0)
            .collect();
        let codes: Vec<u8> = (0..m * k).map(|i| small[(i * 37) % small.len()]).collect();
        let scales = gaussian(m * (k / g), 8);
        let pw = PackedWeights::from_codes(cb, m, k, g, &codes, scales, None, None).unwrap();
        let mut xt = gaussian(k, 9);
        xt[5] = 1.5e36;
        xt[6] = -2e36;
        xt[7] = E4M3_X_LIMIT; // 2^120: `x 2^8` would be 2^128, beyond float32
        let want = bits(&on(&pw, Kernel::Portable, &xt, 1));
        for kernel in [Kernel::Avx512, Kernel::Avx2] {
            if kernel.runs(g) {
                let y = on(&pw, kernel, &xt, 1);
                assert!(y.iter().all(|v| v.is_finite()));
                assert_eq!(bits(&y), want, "{kernel:?}");
            }
        }
    }

    /// Every layout and entry point gives the same bits: `(N, K)` and `(K, N)` activations,
    /// `(M, N)` and `(N, M)` outputs, the caller and the pool, 1 and 2 threads, a batch's
    /// columns and their GEMVs.
    #[test]
    fn layouts_threads_and_columns_agree() {
        let (m, k, g, n) = (150, 256, 32, 6);
        let pw = weights(Format::Fp8E4m3, m, k, g, 12);
        let x = gaussian(k * n, 13);
        let opts = f32_opts(Backend::Auto);
        let call = |threads: usize, layout: XLayout, y_layout: YLayout, inside: bool| {
            let xs: Vec<f32> = match layout {
                XLayout::KbyN => x.clone(),
                XLayout::NbyK => (0..n)
                    .flat_map(|c| (0..k).map(move |j| (c, j)))
                    .map(|(c, j)| x[j * n + c])
                    .collect(),
            };
            let mut y = vec![0f32; m * n];
            let p = pool::sized_pool(threads).unwrap();
            pool::with_pool(p, || {
                let f = |y: &mut [f32]| {
                    gemm_into_layout(&pw, &xs, n, layout, y_layout, &opts, y).unwrap();
                };
                if inside {
                    pool::install(|| f(&mut y));
                } else {
                    f(&mut y);
                }
            });
            match y_layout {
                YLayout::MbyN => y,
                YLayout::NbyM => (0..m)
                    .flat_map(|r| (0..n).map(move |c| (r, c)))
                    .map(|(r, c)| y[c * m + r])
                    .collect(),
            }
        };
        let want = bits(&call(2, XLayout::KbyN, YLayout::MbyN, true));
        for threads in [1, 2, 3] {
            for layout in [XLayout::KbyN, XLayout::NbyK] {
                for y_layout in [YLayout::MbyN, YLayout::NbyM] {
                    for inside in [false, true] {
                        let got = bits(&call(threads, layout, y_layout, inside));
                        assert_eq!(got, want, "{threads} {layout:?} {y_layout:?} {inside}");
                    }
                }
            }
        }
        for c in 0..n {
            let col: Vec<f32> = (0..k).map(|j| x[j * n + c]).collect();
            let mut y = vec![0f32; m];
            gemm_into_layout(&pw, &col, 1, XLayout::KbyN, YLayout::MbyN, &opts, &mut y).unwrap();
            let of_batch: Vec<u32> = (0..m).map(|r| want[r * n + c]).collect();
            assert_eq!(bits(&y), of_batch, "column {c}");
        }
    }

    /// Act-order weights: the activations are permuted into packed order.
    #[test]
    fn input_permutations_are_applied() {
        let (m, k, g) = (20, 64, 16);
        let cb = Codebook::new(Format::Fp8E5m2).unwrap();
        let mut r = rng::stream(21, 0);
        let codes: Vec<u8> = (0..m * k)
            .map(|_| {
                // Small integers (codes of e5m2's exact integers 0..8 and their negatives).
                let v = (rng::standard_normal(&mut r) * 3.0)
                    .round()
                    .clamp(-8.0, 8.0) as f32;
                (0..=255u8)
                    .find(|&c| cb.values()[usize::from(c)] == v)
                    .unwrap()
            })
            .collect();
        let perm: Vec<u32> = (0..k as u32).rev().collect();
        let scales = vec![1.0; m * (k / g)];
        let pw = PackedWeights::from_codes(cb, m, k, g, &codes, scales, None, Some(perm)).unwrap();
        let x: Vec<f32> = (0..k).map(|j| (j % 7) as f32 - 3.0).collect();
        let wd = pw.dequantize();
        let mut y = vec![0f32; m];
        let opts = f32_opts(Backend::Auto);
        gemm_into_layout(&pw, &x, 1, XLayout::KbyN, YLayout::MbyN, &opts, &mut y).unwrap();
        for (row, &yr) in y.iter().enumerate() {
            let exact: f64 = (0..k).map(|j| wd[row * k + j] * f64::from(x[j])).sum();
            assert_eq!(f64::from(yr), exact, "row {row}");
        }
    }

    #[test]
    fn applies_to_f32_calls_of_fp8_weights_only() {
        let fp8 = weights(Format::Fp8E4m3, 4, 64, 32, 1);
        let int4 = weights(Format::Int4, 4, 64, 32, 1);
        let mut o = QuantizeOptions::new(Format::Fp8E4m3);
        o.group_size = Some(32);
        let cb = Codebook::new(Format::Fp8E4m3).unwrap();
        let zeros =
            PackedWeights::from_codes(cb, 1, 32, 32, &[0; 32], vec![1.0], Some(vec![0.5]), None)
                .unwrap();
        let f32_auto = f32_opts(Backend::Auto);
        let expect =
            Kernel::Avx512.runs(32) || Kernel::Avx2.runs(32) || cfg!(target_arch = "aarch64");
        assert_eq!(kernel_for(&fp8, &f32_auto).is_some(), expect);
        assert!(kernel_for(&int4, &f32_auto).is_none());
        assert!(kernel_for(&zeros, &f32_auto).is_none());
        for opts in [
            GemmOptions {
                precision: TablePrecision::I8,
                ..f32_auto
            },
            GemmOptions {
                backend: Backend::Scalar,
                ..f32_auto
            },
            GemmOptions {
                backend: Backend::Reference,
                ..f32_auto
            },
            GemmOptions {
                depth: Depth::Fixed(2),
                ..f32_auto
            },
        ] {
            assert!(kernel_for(&fp8, &opts).is_none(), "{opts:?}");
        }
        // The default precision of an fp8 call resolves to `f32` where a kernel exists.
        let resolved = crate::gemm::auto_precision(&fp8, 1, &GemmOptions::default());
        assert_eq!(resolved.precision == TablePrecision::F32, expect);
    }
}
