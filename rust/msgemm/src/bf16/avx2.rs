//! The `bf16` kernel on AVX2 and FMA, for x86-64 CPUs without AVX-512 (Intel's desktop and
//! laptop CPUs from Haswell on, AMD Zen 1 to 3); AVX-512 CPUs run the same design on 16 lanes
//! ([`super::avx512`]). It adds the products in the scalar kernel's order
//! (ascending input, one rounding per addition) with `vfmadd231ps`; a product of two
//! bfloat16 values is exact in float32 unless it falls below the normal range, so its sums
//! are the scalar kernel's, bit for bit, wherever no product is below `2^-126` in magnitude.
//!
//! Per row block (64 rows, eight octets of 8 rows: a vector's lanes are rows), the weights
//! are decoded [`DECODE_INPUTS`] inputs at a time into float32 (16 KiB, resident in L1 while
//! every column reads them) from the dense layout's 4-bit codes
//! ([`crate::dense::DenseLayout`]: a chunk of 8 inputs is 16 rows x 4 bytes, input `i` in
//! bits `4i .. 4i + 4` of a row's dword): two `vpermps` and a `vblendvps` on code bit 3 look
//! the values up, `(v - z) * s` scales them per row, and an integer round to nearest even
//! keeps bfloat16's 8 bits. [`columns`] then keeps two octets x up to five columns of sums
//! in registers (10 of the 16), reading the activations (bfloat16 values as float32, `(K, N)`
//! row-major) by broadcast.

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::{Job, Scratch};
use crate::dense::{CHUNK, SUB};
use crate::kernels::avx2::load_tiled8;
use crate::layout::ROW_BLOCK;

/// Inputs decoded at a time: 64 rows x 64 inputs of float32, 16 KiB.
pub(in crate::bf16) const DECODE_INPUTS: usize = 64;
/// Rows per vector.
const OCT: usize = 8;
/// Octets of a row block.
const OCTS: usize = ROW_BLOCK / OCT;
/// Columns whose sums [`columns`] keeps in registers (with two octets).
const COL_GROUP: usize = 5;

/// Whether this CPU runs the kernel: AVX2, FMA and F16C (float16 scales).
pub fn ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    })
}

/// float32 values rounded to the nearest bfloat16 (ties to even), as float32: the rounding
/// increment `0x7fff + lsb` on the bits, then the low 16 bits cleared (finite values round
/// as `half::bf16::from_f32` does, overflowing to infinity).
#[target_feature(enable = "avx2")]
fn round_bf16(v: __m256) -> __m256 {
    let b = _mm256_castps_si256(v);
    let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(b), _mm256_set1_epi32(1));
    let r = _mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)), lsb);
    _mm256_castsi256_ps(_mm256_and_si256(
        r,
        _mm256_set1_epi32(0xffff_0000_u32 as i32),
    ))
}

/// Decodes inputs `j0 .. j0 + len` (`len` a multiple of 8) of row block `rb` into `out`:
/// input `j0 + j`, octet `o` at `(j OCTS + o) 8`, its 8 rows' weights `bf16((v[q] - z) * s)`.
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode(job: &Job<'_>, rb: usize, j0: usize, len: usize, out: &mut [f32]) {
    let (lay, g_size) = (job.lay, job.pw.group_size());
    assert!(out.len() >= len * ROW_BLOCK && len.is_multiple_of(CHUNK));
    // SAFETY: 16 floats.
    let (tab_lo, tab_hi) = unsafe {
        (
            _mm256_loadu_ps(job.values.as_ptr()),
            _mm256_loadu_ps(job.values.as_ptr().add(8)),
        )
    };
    for cc in 0..len / CHUNK {
        let j = j0 + cc * CHUNK;
        let (g, c0) = (j / g_size, (j % g_size) / CHUNK);
        for s in 0..ROW_BLOCK / SUB {
            let ti = (g * lay.row_blocks + rb) * ROW_BLOCK + s * SUB;
            let word = &lay.data[lay.word(g, rb, s, c0)..][..SUB * 4];
            for h in 0..SUB / OCT {
                let sc = load_tiled8(job.scales, ti + h * OCT);
                let z = job.zeros.map(|z| load_tiled8(z, ti + h * OCT));
                // SAFETY: 32 bytes: the dwords of rows `8h .. 8h + 8`.
                let v = unsafe { _mm256_loadu_si256(word[h * 32..].as_ptr() as *const __m256i) };
                let o = s * (SUB / OCT) + h;
                for i in 0..CHUNK {
                    // Input `i`'s code in the low 4 bits; `vpermps` reads 3 of them, bit 3
                    // (moved to the sign) picks the table half.
                    let idx = _mm256_srlv_epi32(v, _mm256_set1_epi32(4 * i as i32));
                    let lo = _mm256_permutevar8x32_ps(tab_lo, idx);
                    let hi = _mm256_permutevar8x32_ps(tab_hi, idx);
                    let val =
                        _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32::<28>(idx)));
                    let val = z.map_or(val, |z| _mm256_sub_ps(val, z));
                    let w = round_bf16(_mm256_mul_ps(val, sc));
                    let at = ((cc * CHUNK + i) * OCTS + o) * OCT;
                    // SAFETY: 8 floats inside `out` (asserted).
                    unsafe { _mm256_storeu_ps(out[at..at + OCT].as_mut_ptr(), w) };
                }
            }
        }
    }
}

/// Adds inputs `j0 .. j0 + len` of columns `c0 .. c0 + C` to their sums in `ys`
/// (`[column][64 rows]`): weights from `w` ([`decode`]), activations from `a` (`(K, n)`
/// row-major). Per 16-row part, the sums of its two octets stay in registers.
// Not inlined: in `block`, the decode's constants would hold registers the sums need.
#[inline(never)]
#[target_feature(enable = "avx2,fma")]
unsafe fn columns<const C: usize>(
    ys: &mut [f32],
    a: &[f32],
    n: usize,
    j0: usize,
    len: usize,
    c0: usize,
    w: &[f32],
) {
    assert!(w.len() >= len * ROW_BLOCK && ys.len() >= (c0 + C) * ROW_BLOCK);
    assert!(c0 + C <= n && (j0 + len) * n <= a.len() && len >= 1);
    let (y, a, w) = (ys.as_mut_ptr(), a.as_ptr(), w.as_ptr());
    for s in 0..ROW_BLOCK / SUB {
        // The sums of octets `2s` and `2s + 1` (two arrays, not one nested: LLVM keeps these
        // in registers).
        let at = |i: usize, h: usize| (c0 + i) * ROW_BLOCK + s * SUB + h * OCT;
        // SAFETY (loads and stores of the sums): inside `ys` (asserted).
        let mut s0: [__m256; C] =
            std::array::from_fn(|i| unsafe { _mm256_loadu_ps(y.add(at(i, 0))) });
        let mut s1: [__m256; C] =
            std::array::from_fn(|i| unsafe { _mm256_loadu_ps(y.add(at(i, 1))) });
        for j in 0..len {
            // SAFETY: input `j` of the decoded weights, octets `2s`, `2s + 1`; row `j0 + j`
            // of the activations, columns `c0 ..` (asserted).
            unsafe {
                let wp = w.add((j * OCTS + 2 * s) * OCT);
                let (w0, w1) = (_mm256_loadu_ps(wp), _mm256_loadu_ps(wp.add(OCT)));
                let ap = a.add((j0 + j) * n + c0);
                for i in 0..C {
                    let x = _mm256_broadcast_ss(&*ap.add(i));
                    s0[i] = _mm256_fmadd_ps(w0, x, s0[i]);
                    s1[i] = _mm256_fmadd_ps(w1, x, s1[i]);
                }
            }
        }
        for i in 0..C {
            // SAFETY: inside `ys` (asserted).
            unsafe {
                _mm256_storeu_ps(y.add(at(i, 0)), s0[i]);
                _mm256_storeu_ps(y.add(at(i, 1)), s1[i]);
            }
        }
    }
}

/// The sums of row block `rb` into `s.ys` (`[column][64 rows]`); [`ready`] must be true and
/// `a` the call's activations (`(K, N)` row-major, bfloat16 values).
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::bf16) unsafe fn block(job: &Job<'_>, a: &[f32], rb: usize, s: &mut Scratch) {
    let (k, n) = (job.pw.k(), job.n);
    s.ys.fill(0.0);
    let mut j0 = 0;
    while j0 < k {
        let len = (k - j0).min(DECODE_INPUTS);
        // SAFETY: the features are enabled here; the bounds are asserted inside.
        unsafe { decode(job, rb, j0, len, &mut s.w) };
        let mut c0 = 0;
        while c0 < n {
            let (ys, w) = (&mut s.ys[..], &s.w[..]);
            // SAFETY: the features are enabled here; the bounds are asserted inside.
            unsafe {
                match n - c0 {
                    1 => columns::<1>(ys, a, n, j0, len, c0, w),
                    2 => columns::<2>(ys, a, n, j0, len, c0, w),
                    3 => columns::<3>(ys, a, n, j0, len, c0, w),
                    4 => columns::<4>(ys, a, n, j0, len, c0, w),
                    _ => columns::<COL_GROUP>(ys, a, n, j0, len, c0, w),
                }
            }
            c0 += COL_GROUP;
        }
        j0 += len;
    }
}
