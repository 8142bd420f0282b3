//! The fused dequantize-and-multiply GEMV, the benchmark's anchor A2 (spec section 9): `y =
//! Wd @ x` with every weight decoded in registers and multiplied into float32 accumulators.
//! Per (row, group) a 16-entry table of the dequantized values `s * (v[c] - z)` (float64,
//! rounded once to float32: the numbers of `dequantize_f32`) sits in one zmm register; 16
//! codes are one `vpermps` and one FMA. It does everything the look-up-table method does except
//! share work between rows, so the ratio of the two measures what the tables are worth.
//!
//! 4-bit (nibble) packings without an input permutation: int4, uint4, nf4, fp4 and 16-value
//! codebooks. Not a public operation of the package (the binding is private to the benchmark).

use maleki_common::{pool, Error, Result};
use rayon::prelude::*;

use crate::format::Packing;
use crate::packed::PackedWeights;

/// Rows per parallel task.
const ROWS_PER_TASK: usize = 64;

/// `y = Wd @ x` for a vector `x` (`K` floats, finite) into `y` (`M` floats), on the library
/// pool. Errors: a packing other than 4-bit nibbles, an input permutation, wrong lengths, a
/// non-finite `x`.
pub fn fused_gemv(pw: &PackedWeights, x: &[f32], y: &mut [f32]) -> Result<()> {
    let (m, k) = (pw.m(), pw.k());
    if pw.codebook().packing() != Packing::Nibble || pw.codebook().values().len() > 16 {
        return Err(Error::Unsupported(
            "the fused dequantize GEMV reads 4-bit codes only (int4, uint4, nf4, fp4, codebooks of <= 16 values)"
                .into(),
        ));
    }
    if pw.k_perm().is_some() {
        return Err(Error::Unsupported(
            "the fused dequantize GEMV does not apply an input permutation".into(),
        ));
    }
    if x.len() != k {
        return Err(Error::shape(
            "x",
            format!("({k},)"),
            format!("({},)", x.len()),
        ));
    }
    if y.len() != m {
        return Err(Error::shape(
            "y",
            format!("({m},)"),
            format!("({},)", y.len()),
        ));
    }
    if let Some(i) = x.iter().position(|v| !v.is_finite()) {
        return Err(Error::invalid(
            "x",
            format!("non-finite value at index {i}"),
        ));
    }
    let simd = simd_ok() && pw.group_size().is_multiple_of(32);
    pool::install(|| {
        y.par_chunks_mut(ROWS_PER_TASK)
            .enumerate()
            .for_each(|(c, ys)| {
                for (i, yi) in ys.iter_mut().enumerate() {
                    let row = c * ROWS_PER_TASK + i;
                    *yi = if simd {
                        // SAFETY: AVX-512 F/BW/DQ checked by `simd_ok`; the group size is a
                        // multiple of 32 (16 packed bytes per step).
                        unsafe { row_avx512(pw, x, row) }
                    } else {
                        row_scalar(pw, x, row)
                    };
                }
            });
    });
    Ok(())
}

fn simd_ok() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512dq")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The 16 dequantized values `s * (v[c] - z)` of (row, group `gi`), in float64 rounded to
/// float32 (codes past the codebook: 0).
fn group_values(pw: &PackedWeights, row: usize, gi: usize) -> [f32; 16] {
    let at = row * pw.groups() + gi;
    let s = f64::from(pw.scales()[at]);
    let z = pw.zeros().map_or(0.0, |z| f64::from(z[at]));
    let mut t = [0f32; 16];
    for (ti, &v) in t.iter_mut().zip(pw.codebook().values()) {
        *ti = (s * (f64::from(v) - z)) as f32;
    }
    t
}

/// One row's dot product, scalar: float32 multiply-adds in input order.
fn row_scalar(pw: &PackedWeights, x: &[f32], row: usize) -> f32 {
    let g = pw.group_size();
    let rb = pw.row_bytes();
    let bytes = &pw.packed()[row * rb..(row + 1) * rb];
    let mut acc = 0f32;
    for gi in 0..pw.groups() {
        let t = group_values(pw, row, gi);
        for k in gi * g..(gi + 1) * g {
            let c = (bytes[k / 2] >> (4 * (k % 2))) & 15;
            acc += t[usize::from(c)] * x[k];
        }
    }
    acc
}

/// One row's dot product: per group the value table in a register, 32 codes (16 packed bytes)
/// per step as two `vpermps` and two FMAs into two accumulators.
///
/// # Safety
/// AVX-512 F, BW and DQ must be available and the group size a multiple of 32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq")]
unsafe fn row_avx512(pw: &PackedWeights, x: &[f32], row: usize) -> f32 {
    use std::arch::x86_64::*;
    let g = pw.group_size();
    let rb = pw.row_bytes();
    let bytes = &pw.packed()[row * rb..(row + 1) * rb];
    let nib = _mm_set1_epi8(15);
    let mut acc0 = _mm512_setzero_ps();
    let mut acc1 = _mm512_setzero_ps();
    // The codebook in float64 (zero past its end: codes there never occur).
    let mut v = [0f64; 16];
    for (vi, &c) in v.iter_mut().zip(pw.codebook().values()) {
        *vi = f64::from(c);
    }
    // SAFETY: a 16-double array.
    let (vlo, vhi) = unsafe {
        (
            _mm512_loadu_pd(v.as_ptr()),
            _mm512_loadu_pd(v.as_ptr().add(8)),
        )
    };
    let at = row * pw.groups();
    for gi in 0..pw.groups() {
        // `group_values` on 16 lanes: `s * (v - z)` in float64, rounded to float32.
        let s = _mm512_set1_pd(f64::from(pw.scales()[at + gi]));
        let z = _mm512_set1_pd(pw.zeros().map_or(0.0, |z| f64::from(z[at + gi])));
        let lo = _mm512_cvtpd_ps(_mm512_mul_pd(s, _mm512_sub_pd(vlo, z)));
        let hi = _mm512_cvtpd_ps(_mm512_mul_pd(s, _mm512_sub_pd(vhi, z)));
        let t = _mm512_insertf32x8::<1>(_mm512_castps256_ps512(lo), hi);
        for k in (gi * g..(gi + 1) * g).step_by(32) {
            // SAFETY: `k + 32 <= K` (groups are multiples of 32), so the 16 bytes at `k / 2`
            // and the 32 floats at `k` are in bounds.
            unsafe {
                let b = _mm_loadu_si128(bytes.as_ptr().add(k / 2) as *const __m128i);
                let lo = _mm_and_si128(b, nib);
                let hi = _mm_and_si128(_mm_srli_epi16::<4>(b), nib);
                // Low nibble first: codes k, k + 1, ... in order.
                let c0 = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
                let c1 = _mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi));
                let xp = x.as_ptr().add(k);
                acc0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(c0, t), _mm512_loadu_ps(xp), acc0);
                acc1 = _mm512_fmadd_ps(
                    _mm512_permutexvar_ps(c1, t),
                    _mm512_loadu_ps(xp.add(16)),
                    acc1,
                );
            }
        }
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1))
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn row_avx512(pw: &PackedWeights, x: &[f32], row: usize) -> f32 {
    row_scalar(pw, x, row)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{quantize, Format, QuantizeOptions};
    use maleki_common::rng;

    /// `len` standard normal float32 values of stream `seed` (also the fp8 path's tests').
    pub(crate) fn gaussian(len: usize, seed: u64) -> Vec<f32> {
        let mut r = rng::stream(seed, 0);
        (0..len)
            .map(|_| rng::standard_normal(&mut r) as f32)
            .collect()
    }

    /// Against the float64 product of the float32-dequantized weights: within float32
    /// accumulation error of `|Wd| @ |x|`, on both paths, for every 4-bit format.
    #[test]
    fn matches_the_dequantized_product() {
        let (m, k) = (70, 256);
        for (fi, f) in [Format::Int4, Format::Uint4, Format::Nf4, Format::Fp4]
            .into_iter()
            .enumerate()
        {
            for g in [32, 64, 128] {
                let mut o = QuantizeOptions::new(f);
                o.group_size = Some(g);
                let pw = quantize(&gaussian(m * k, 3 + fi as u64), m, k, &o).unwrap();
                let x = gaussian(k, 9);
                let wd = pw.dequantize_f32();
                let mut y = vec![0f32; m];
                fused_gemv(&pw, &x, &mut y).unwrap();
                for r in 0..m {
                    let w = &wd[r * k..(r + 1) * k];
                    let exact: f64 = w
                        .iter()
                        .zip(&x)
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum();
                    let mag: f64 = w
                        .iter()
                        .zip(&x)
                        .map(|(&a, &b)| f64::from(a.abs() * b.abs()))
                        .sum();
                    let tol = 1e-5 * mag + 1e-30;
                    let s = row_scalar(&pw, &x, r);
                    assert!((f64::from(y[r]) - exact).abs() <= tol, "{f:?} g{g} row {r}");
                    assert!(
                        (f64::from(s) - exact).abs() <= tol,
                        "{f:?} g{g} row {r} scalar"
                    );
                }
            }
        }
    }

    #[test]
    fn rejects_what_it_cannot_run() {
        let (m, k) = (8, 64);
        let mut o = QuantizeOptions::new(Format::Int4);
        o.group_size = Some(32);
        let pw = quantize(&gaussian(m * k, 1), m, k, &o).unwrap();
        let mut y = vec![0f32; m];
        assert!(fused_gemv(&pw, &vec![0.0; k - 1], &mut y).is_err());
        assert!(fused_gemv(&pw, &vec![0.0; k], &mut y[..m - 1]).is_err());
        let mut x = vec![0.0; k];
        x[5] = f32::NAN;
        assert!(fused_gemv(&pw, &x, &mut y).is_err());
        let mut o2 = QuantizeOptions::new(Format::Int2);
        o2.group_size = Some(32);
        let p2 = quantize(&gaussian(m * k, 1), m, k, &o2).unwrap();
        assert!(matches!(
            fused_gemv(&p2, &vec![0.0; k], &mut y),
            Err(Error::Unsupported(_))
        ));
    }
}
