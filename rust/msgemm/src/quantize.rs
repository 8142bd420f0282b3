//! Quantizers (spec section 3): round-to-nearest absmax (symmetric), min-max with zero points,
//! nearest codebook level (nf4, custom codebooks, fp8) and OCP MX power-of-two scales (fp4).
//!
//! Codes are always computed against the *stored* float32 scale, so `dequantize` reproduces
//! exactly the rounding the quantizer chose.

use maleki_common::{Error, Result};
use rayon::prelude::*;

use crate::format::{Codebook, Format};
use crate::packed::PackedWeights;

/// Options of [`quantize`].
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizeOptions {
    pub format: Format,
    /// Weights per scale along K (must divide K); `None`: one group per row (per channel).
    pub group_size: Option<usize>,
    /// Integer formats: `Some(true)` absmax symmetric, `Some(false)` min-max with zero points;
    /// `None` is the format's default (`int*` symmetric, `uint*` zero points).
    pub symmetric: Option<bool>,
    /// Values of a `Format::Codebook` (2..=16 distinct finite values).
    pub codebook: Option<Vec<f32>>,
    /// The precision of the stored scales.
    pub scale_dtype: ScaleDtype,
}

/// The precision of the scales [`quantize`] stores (always as float32 values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScaleDtype {
    /// The float32 nearest the computed scale.
    #[default]
    F32,
    /// The smallest float16 value at or above the computed scale (so the largest weight of a
    /// group still maps inside the code range), as GPTQ, AWQ and ONNX Runtime store scales; the
    /// kernels then read half the scale bytes. MX (fp4) scales are powers of two and must lie
    /// in float16's range, `2^-24 ..= 2^15`.
    F16,
}

impl ScaleDtype {
    /// The stored scale for a computed scale `x >= 0` (infinite when it overflows).
    fn fit(self, x: f64) -> f32 {
        match self {
            ScaleDtype::F32 => x as f32,
            ScaleDtype::F16 => {
                let h = half::f16::from_f64(x);
                // Round up: `from_f64` rounds to nearest. `x >= 0`, so the next float16 up is
                // the next bit pattern (65504 -> infinity).
                let h = if h.to_f64() < x {
                    half::f16::from_bits(h.to_bits() + 1)
                } else {
                    h
                };
                h.to_f32()
            }
        }
    }
}

impl QuantizeOptions {
    pub fn new(format: Format) -> Self {
        QuantizeOptions {
            format,
            group_size: Some(128),
            symmetric: None,
            codebook: None,
            scale_dtype: ScaleDtype::F32,
        }
    }
}

/// The scheme a format and `symmetric` resolve to.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Scheme {
    /// `s = maxabs / qmax`, `q = clamp(round(w/s), lo, qmax) + offset`, no zero point.
    Symmetric { bits: u32 },
    /// Unsigned codes with a fixed zero point `2^(b-1)` (GPTQ `sym=True`).
    UnsignedSymmetric { bits: u32 },
    /// `s = (hi - lo) / (2^b - 1)` over `[min(w, 0), max(w, 0)]`, integer zero point.
    MinMax { bits: u32 },
    /// Ternary absmax: `s = maxabs`, `t = clamp(round(w/s), -1, 1)`.
    Ternary,
    /// `s = maxabs / max|v|`, nearest level.
    Nearest,
    /// OCP MX: `s = 2^(floor(log2 maxabs) - 2)` (E8M0), nearest e2m1 level, saturating.
    Mx,
}

fn int_bits(f: Format) -> Option<u32> {
    match f {
        Format::Int8 | Format::Uint8 => Some(8),
        Format::Int4 | Format::Uint4 => Some(4),
        Format::Int3 | Format::Uint3 => Some(3),
        Format::Int2 | Format::Uint2 => Some(2),
        _ => None,
    }
}

fn unsigned_of(bits: u32) -> Format {
    match bits {
        8 => Format::Uint8,
        4 => Format::Uint4,
        3 => Format::Uint3,
        _ => Format::Uint2,
    }
}

/// The format of the result and its scheme.
fn resolve(opts: &QuantizeOptions) -> Result<(Format, Scheme)> {
    let f = opts.format;
    let sym = opts.symmetric;
    let signed = matches!(f, Format::Int8 | Format::Int4 | Format::Int3 | Format::Int2);
    if let Some(bits) = int_bits(f) {
        return Ok(match (signed, sym) {
            (true, None | Some(true)) => (f, Scheme::Symmetric { bits }),
            (true, Some(false)) | (false, None | Some(false)) => {
                (unsigned_of(bits), Scheme::MinMax { bits })
            }
            (false, Some(true)) => (f, Scheme::UnsignedSymmetric { bits }),
        });
    }
    if sym == Some(false) {
        return Err(Error::invalid(
            "symmetric",
            format!(
                "format {} has no zero points; symmetric=False applies to int*/uint* formats",
                f.name()
            ),
        ));
    }
    Ok(match f {
        Format::Ternary => (f, Scheme::Ternary),
        Format::Fp4 => (f, Scheme::Mx),
        _ => (f, Scheme::Nearest),
    })
}

/// Nearest-level search over a codebook: ties go to the even code (IEEE round-to-nearest-even
/// for fp4 and fp8), then to the smaller code.
struct Levels {
    /// `(value, code)` sorted by value, one code per distinct value (the smaller code).
    sorted: Vec<(f64, u8)>,
    /// The sorted values padded with +inf to 16, when there are at most 16: the levels below
    /// `x` are then counted without branches (a binary search mispredicts about every step).
    small: Option<[f64; 16]>,
    /// fp8 formats: rounded on their bits instead ([`Fp8Grid::nearest`], the same codes).
    fp8: Option<Fp8Grid>,
}

/// The grid of an fp8 format, for rounding to it directly instead of a binary search over its
/// 254 levels (e4m3 g128 4096 x 4096 on 2 threads: the quantization 229 -> 93-110 ms).
#[derive(Clone, Copy)]
struct Fp8Grid {
    /// Mantissa bits.
    mbits: i32,
    /// Exponent bias; the smallest normal exponent is `1 - bias`.
    bias: i32,
    /// The largest finite magnitude and its code.
    max: f64,
    max_code: u8,
}

impl Fp8Grid {
    /// The grid of `format`, if fp8, whose largest level is `top` (value, code).
    fn of(format: Format, top: (f64, u8)) -> Option<Fp8Grid> {
        let (mbits, bias) = match format {
            Format::Fp8E4m3 => (3, 7),
            Format::Fp8E5m2 => (2, 15),
            _ => return None,
        };
        Some(Fp8Grid {
            mbits,
            bias,
            max: top.0,
            max_code: top.1,
        })
    }

    /// The code [`Levels::nearest`] picks by search: `|x|` rounded to nearest on the grid of
    /// its binade (subnormals on the smallest normal binade's), ties to the even mantissa (the
    /// even code), saturating at the largest finite value; 0 (not `-0`'s 0x80) for zero.
    #[inline]
    fn nearest(&self, x: f64) -> u8 {
        let a = x.abs();
        let sign = if x < 0.0 { 0x80 } else { 0 };
        if a >= self.max {
            return sign | self.max_code;
        }
        // The binade's exponent (from the bits: exact), at least the smallest normal one.
        let e = (((a.to_bits() >> 52) & 0x7ff) as i32 - 1023).max(1 - self.bias);
        // `a / q` is exact (q a power of two, built on its bits: `powi` and `rint` were
        // libm calls, 40% of the quantization), so this is the nearest multiple of `q`:
        // adding and subtracting 2^52 rounds `0 <= y < 2^52` to an integer, ties to even.
        let q = f64::from_bits(((e - self.mbits + 1023) as u64) << 52);
        const TWO52: f64 = 4_503_599_627_370_496.0;
        let mut m = ((a / q + TWO52) - TWO52) as i32;
        if m == 0 {
            return 0;
        }
        let mut e = e;
        if m == 2 << self.mbits {
            // Rounded up into the next binade (below `max`, so still finite).
            m >>= 1;
            e += 1;
        }
        let code = if m < 1 << self.mbits {
            m // subnormal: exponent field 0
        } else {
            ((e + self.bias) << self.mbits) | (m - (1 << self.mbits))
        };
        sign | code as u8
    }
}

impl Levels {
    fn new(cb: &Codebook) -> Levels {
        let mut sorted: Vec<(f64, u8)> = cb
            .values()
            .iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite())
            .map(|(c, &v)| (f64::from(v), c as u8))
            .collect();
        sorted.sort_by(|a, b| {
            a.0.partial_cmp(&b.0)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(a.1.cmp(&b.1))
        });
        // +0 and -0 (fp formats) are one level: keep the smaller code.
        sorted.dedup_by(|b, a| a.0 == b.0);
        let small = (sorted.len() <= 16)
            .then(|| std::array::from_fn(|i| sorted.get(i).map_or(f64::INFINITY, |l| l.0)));
        let top = sorted[sorted.len() - 1];
        Levels {
            fp8: Fp8Grid::of(cb.format(), top),
            sorted,
            small,
        }
    }

    fn max_abs(&self) -> f64 {
        self.sorted.iter().fold(0.0, |m, &(v, _)| m.max(v.abs()))
    }

    #[inline]
    fn nearest(&self, x: f64) -> u8 {
        match self.fp8 {
            Some(grid) => grid.nearest(x),
            None => self.search(x),
        }
    }

    /// The nearest level by search (every codebook; the fp8 grids' oracle in the tests).
    #[inline]
    fn search(&self, x: f64) -> u8 {
        let s = &self.sorted;
        let i = match &self.small {
            Some(v) => v.iter().map(|&v| usize::from(v < x)).sum(),
            None => s.partition_point(|&(v, _)| v < x),
        };
        if i == 0 {
            return s[0].1;
        }
        if i == s.len() {
            return s[s.len() - 1].1;
        }
        let (lo, hi) = (s[i - 1], s[i]);
        let (dl, dh) = (x - lo.0, hi.0 - x);
        if dl != dh {
            // Selected by index, not by a branch: which side is nearer is a coin toss on
            // weights, and a mispredicted branch per weight was most of this function.
            return [lo.1, hi.1][usize::from(dh < dl)];
        }
        if lo.1 % 2 == 0 {
            lo.1
        } else if hi.1 % 2 == 0 {
            hi.1
        } else {
            lo.1.min(hi.1)
        }
    }
}

/// The E8M0 scale of an MX block: `2^(floor(log2 maxabs) - 2)` (emax of e2m1 is 2),
/// exponent clamped below at E8M0's `-127`; 1 for an all-zero block; infinite for a block beyond
/// the float32 range (the caller reports it).
pub fn mx_scale(maxabs: f64) -> f32 {
    if maxabs == 0.0 || !maxabs.is_finite() {
        return 1.0;
    }
    if maxabs > f64::from(f32::MAX) {
        return f32::INFINITY;
    }
    let e = maxabs.log2().floor() as i32;
    // log2 may round across an integer for values just below a power of two: fix up exactly.
    let e = if 2f64.powi(e) > maxabs {
        e - 1
    } else if 2f64.powi(e + 1) <= maxabs {
        e + 1
    } else {
        e
    };
    2f32.powi((e - 2).clamp(-127, 127))
}

/// `x.round_ties_even()`, inlined: the baseline x86-64 target compiles that to a call of libm's
/// `rint` (a third of `quantize`'s time). Adding and subtracting 2^52 rounds a non-negative
/// value below 2^52 to an integer in the default rounding mode (to nearest, ties to even);
/// the sign goes back on after, so that `-0.3 -> -0.0` as with `round_ties_even`. Values of
/// magnitude 2^52 and more are integers already (or infinite, or NaN) and pass through.
#[inline]
fn round_even(x: f64) -> f64 {
    const TWO52: f64 = 4_503_599_627_370_496.0;
    let a = x.abs();
    if a < TWO52 {
        ((a + TWO52) - TWO52).copysign(x)
    } else {
        x
    }
}

fn quantize_group<T: Copy + Into<f64>>(
    w: &[T],
    scheme: Scheme,
    levels: &Levels,
    cb: &Codebook,
    fit: ScaleDtype,
    codes: &mut [u8],
) -> (f32, Option<f32>) {
    let maxabs = w.iter().fold(0f64, |m, &x| m.max(x.into().abs()));
    let round = round_even;
    match scheme {
        Scheme::Symmetric { bits } | Scheme::UnsignedSymmetric { bits } => {
            let half = 1i32 << (bits - 1);
            let qmax = half - 1;
            let s = fit.fit(maxabs / f64::from(qmax));
            for (c, &x) in codes.iter_mut().zip(w) {
                let q = if s == 0.0 {
                    0
                } else {
                    round(x.into() / f64::from(s)).clamp(-f64::from(half), f64::from(qmax)) as i32
                };
                *c = (q + half) as u8;
            }
            let z = matches!(scheme, Scheme::UnsignedSymmetric { .. }).then_some(half as f32);
            (s, z)
        }
        Scheme::MinMax { bits } => {
            let top = f64::from((1u32 << bits) - 1);
            let lo = w.iter().fold(0f64, |m, &x| m.min(x.into()));
            let hi = w.iter().fold(0f64, |m, &x| m.max(x.into()));
            let s = fit.fit((hi - lo) / top);
            if s == 0.0 {
                codes.fill(0);
                return (0.0, Some(0.0));
            }
            let s64 = f64::from(s);
            let z = round(-lo / s64).clamp(0.0, top);
            for (c, &x) in codes.iter_mut().zip(w) {
                *c = (round(x.into() / s64) + z).clamp(0.0, top) as u8;
            }
            (s, Some(z as f32))
        }
        Scheme::Ternary => {
            let s = fit.fit(maxabs);
            for (c, &x) in codes.iter_mut().zip(w) {
                let t = if s == 0.0 {
                    0.0
                } else {
                    round(x.into() / f64::from(s)).clamp(-1.0, 1.0)
                };
                *c = (t + 1.0) as u8;
            }
            (s, None)
        }
        Scheme::Nearest => {
            let vmax = levels.max_abs();
            let s = fit.fit(maxabs / vmax);
            for (c, &x) in codes.iter_mut().zip(w) {
                *c = if s == 0.0 {
                    levels.nearest(0.0)
                } else {
                    levels.nearest(x.into() / f64::from(s))
                };
            }
            debug_assert!(codes.iter().all(|&c| cb.valid_code(c)));
            (s, None)
        }
        Scheme::Mx => {
            let s = mx_scale(maxabs);
            for (c, &x) in codes.iter_mut().zip(w) {
                *c = levels.nearest(x.into() / f64::from(s));
            }
            (s, None)
        }
    }
}

/// Quantizes `w` `(M, K)` row-major (float32 or float64 values) to packed weights.
///
/// Runs in parallel over rows on the current rayon pool; results do not depend on it.
pub fn quantize<T: Copy + Into<f64> + Sync>(
    w: &[T],
    m: usize,
    k: usize,
    opts: &QuantizeOptions,
) -> Result<PackedWeights> {
    if m == 0 || k == 0 {
        return Err(Error::invalid(
            "w",
            format!("must be a non-empty 2-D array, got shape ({m}, {k})"),
        ));
    }
    if w.len() != m * k {
        return Err(Error::shape(
            "w",
            format!("({m}, {k})"),
            format!("{} values", w.len()),
        ));
    }
    // Float64 weights past float32's range are refused as float32 ones are (those arrive as
    // inf): the kernels compute in float32, and `dequantize` to float32 would give inf.
    let beyond = |v: f64| !v.is_finite() || v.abs() > f64::from(f32::MAX);
    if let Some(i) = w.iter().position(|&x| beyond(x.into())) {
        return Err(Error::invalid(
            "w",
            format!(
                "contains a non-finite value (NaN, inf, or beyond float32's 3.4e38) at index ({}, {})",
                i / k,
                i % k
            ),
        ));
    }
    let g = opts.group_size.unwrap_or(k);
    if g == 0 || !k.is_multiple_of(g) {
        return Err(Error::invalid(
            "group_size",
            format!("must divide K = {k} (pad K with zero weights otherwise), got {g}"),
        ));
    }
    let (format, scheme) = resolve(opts)?;
    let cb = Codebook::for_format(format, opts.codebook.as_deref())?;
    let levels = Levels::new(&cb);
    let groups = k / g;
    let mut codes = maleki_common::alloc::zeroed_vec::<u8>(m * k, "the codes")?;
    let mut scales = vec![0f32; m * groups];
    let mut zeros = vec![0f32; m * groups];
    codes
        .par_chunks_mut(k)
        .zip(scales.par_chunks_mut(groups))
        .zip(zeros.par_chunks_mut(groups))
        .enumerate()
        .for_each(|(row, ((c, s), z))| {
            for gi in 0..groups {
                let range = row * k + gi * g..row * k + (gi + 1) * g;
                let (sc, zp) = quantize_group(
                    &w[range],
                    scheme,
                    &levels,
                    &cb,
                    opts.scale_dtype,
                    &mut c[gi * g..(gi + 1) * g],
                );
                s[gi] = sc;
                z[gi] = zp.unwrap_or(0.0);
            }
        });
    if let Some(i) = scales.iter().position(|s| !s.is_finite()) {
        let (row, group) = (i / groups, i % groups);
        // With float16 scales: was it float16's range or float32's? The group's float32
        // scale says.
        let range = &w[row * k + group * g..row * k + (group + 1) * g];
        let f32_scale = quantize_group(
            range,
            scheme,
            &levels,
            &cb,
            ScaleDtype::F32,
            &mut vec![0; g],
        )
        .0;
        if f32_scale.is_finite() {
            return Err(Error::invalid(
                "scale_dtype",
                format!(
                    "the scale of row {row}, group {group} ({f32_scale:e}) overflows float16 \
                     (largest value 65504): use float32 scales"
                ),
            ));
        }
        return Err(Error::invalid(
            "w",
            format!(
                "the scale of row {row}, group {group} overflows float32: weights must stay within \
                 float32 range relative to the codebook"
            ),
        ));
    }
    if opts.scale_dtype == ScaleDtype::F16 {
        // Finite scales that are not float16 values: MX powers of two out of its range.
        let f16_value = |s: f32| half::f16::from_f32(s).to_f32() == s;
        if let Some(i) = scales.iter().position(|&s| !f16_value(s)) {
            let (row, group, s) = (i / groups, i % groups, scales[i]);
            let why = if s.abs() > 65504.0 {
                "overflows float16 (largest value 65504)"
            } else {
                "is below float16's range (MX scales down to 2^-24)"
            };
            return Err(Error::invalid(
                "scale_dtype",
                format!("the scale of row {row}, group {group} ({s:e}) {why}: use float32 scales"),
            ));
        }
    }
    let has_zeros = matches!(
        scheme,
        Scheme::MinMax { .. } | Scheme::UnsignedSymmetric { .. }
    );
    PackedWeights::from_codes(
        cb,
        m,
        k,
        g,
        &codes,
        scales,
        has_zeros.then_some(zeros),
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_even_is_round_ties_even_bit_for_bit() {
        let two52 = 2f64.powi(52);
        let mut xs = vec![
            0.0,
            -0.0,
            0.5,
            1.5,
            2.5,
            -0.5,
            -2.5,
            0.49999999999999994,
            -0.3,
            7.5,
            -8.5,
            255.5,
            f64::MIN_POSITIVE,
            -5e-324,
            two52 - 0.5,
            two52 - 1.5,
            -(two52 - 0.5),
            two52,
            two52 + 1.0,
            1e300,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ];
        let mut r = maleki_common::rng::stream(5, 0);
        for i in 0..100_000 {
            let u = maleki_common::rng::standard_normal(&mut r);
            xs.push(u * 10f64.powi(i % 18 - 3));
            xs.push((u * 64.0).trunc() + 0.5);
        }
        for x in xs {
            assert_eq!(
                round_even(x).to_bits(),
                x.round_ties_even().to_bits(),
                "{x:e}"
            );
        }
        assert!(round_even(f64::NAN).is_nan());
    }

    fn data(m: usize, k: usize) -> Vec<f64> {
        (0..m * k)
            .map(|i| ((i * 7919 % 1000) as f64 / 500.0 - 1.0) * (1.0 + (i % 5) as f64))
            .collect()
    }

    #[test]
    fn rtn_error_is_at_most_half_a_step() {
        let (m, k) = (8, 64);
        let w = data(m, k);
        for f in [
            Format::Int4,
            Format::Int3,
            Format::Int2,
            Format::Uint4,
            Format::Ternary,
        ] {
            for (sym, dt) in [None, Some(false)]
                .into_iter()
                .flat_map(|s| [(s, ScaleDtype::F32), (s, ScaleDtype::F16)])
            {
                if f == Format::Ternary && sym == Some(false) {
                    continue;
                }
                let opts = QuantizeOptions {
                    format: f,
                    group_size: Some(32),
                    symmetric: sym,
                    codebook: None,
                    scale_dtype: dt,
                };
                let pw = quantize(&w, m, k, &opts).unwrap();
                assert_eq!(pw.scales_are_f16(), dt == ScaleDtype::F16, "{f:?} {sym:?}");
                let wd = pw.dequantize();
                for i in 0..m * k {
                    let s = f64::from(pw.scales()[(i / k) * 2 + (i % k) / 32]);
                    assert!(
                        (wd[i] - w[i]).abs() <= s / 2.0 * (1.0 + 1e-12),
                        "{f:?} {sym:?} {dt:?} i={i}"
                    );
                }
            }
        }
    }

    #[test]
    fn float16_scales_are_the_float16_at_or_above_the_computed_scale() {
        let f16 = ScaleDtype::F16;
        assert_eq!(f16.fit(1.0), 1.0);
        assert_eq!(f16.fit(0.0), 0.0);
        // 1 + 2^-11 lies between the float16 values 1 and 1 + 2^-10: up, not to nearest.
        assert_eq!(f16.fit(1.0 + 2f64.powi(-11)), 1.0 + 2f32.powi(-10));
        assert_eq!(f16.fit(1.0 + 2f64.powi(-20)), 1.0 + 2f32.powi(-10));
        assert_eq!(f16.fit(65504.0), 65504.0);
        assert_eq!(f16.fit(65504.5), f32::INFINITY);
        // Subnormal float16 values are kept (exact, coarser steps).
        assert_eq!(f16.fit(1e-8), 2f32.powi(-24));
        for i in 1..2000 {
            let x = f64::from(i) * 0.0137 + 1e-4;
            let s = f16.fit(x);
            let h = half::f16::from_f32(s);
            assert_eq!(h.to_f32(), s);
            assert!(
                f64::from(s) >= x
                    && h.to_bits() == half::f16::from_f64(x).to_bits().max(h.to_bits())
            );
            assert!(half::f16::from_bits(h.to_bits() - 1).to_f64() < x, "{x}");
        }
    }

    #[test]
    fn float16_scales_out_of_range_are_reported() {
        let (m, k) = (2, 32);
        let mut w = vec![0.5f64; m * k];
        w[40] = 1e6; // row 1, group 0: int4 scale 1e6 / 7 > 65504
        let opts = QuantizeOptions {
            group_size: Some(32),
            scale_dtype: ScaleDtype::F16,
            ..QuantizeOptions::new(Format::Int4)
        };
        let e = quantize(&w, m, k, &opts).unwrap_err().to_string();
        assert!(
            e.contains("scale_dtype") && e.contains("row 1, group 0"),
            "{e}"
        );
        // An MX scale above float16's range (2^16), and weights beyond float32's.
        let big = vec![2f64.powi(18); m * k];
        let opts16 = QuantizeOptions {
            group_size: Some(32),
            scale_dtype: ScaleDtype::F16,
            ..QuantizeOptions::new(Format::Fp4)
        };
        let e = quantize(&big, m, k, &opts16).unwrap_err().to_string();
        assert!(e.contains("overflows float16"), "{e}");
        let huge = vec![1e300f64; m * k];
        let e = quantize(&huge, m, k, &opts16).unwrap_err().to_string();
        assert!(e.contains("beyond float32") && e.contains("(0, 0)"), "{e}");
        // An MX scale below float16's range: 2^-30.
        let w = vec![2f64.powi(-28); m * k];
        let opts = QuantizeOptions {
            scale_dtype: ScaleDtype::F16,
            group_size: Some(32),
            ..QuantizeOptions::new(Format::Fp4)
        };
        assert!(quantize(&w, m, k, &opts).is_err());
        let opts = QuantizeOptions {
            scale_dtype: ScaleDtype::F32,
            ..opts
        };
        let pw = quantize(&w, m, k, &opts).unwrap();
        assert!(!pw.scales_are_f16());
    }

    #[test]
    fn nearest_and_mx() {
        let cb = Codebook::new(Format::Fp4).unwrap();
        let l = Levels::new(&cb);
        assert_eq!(l.nearest(2.5), 4); // 2 (code 4) vs 3 (code 5): even code
        assert_eq!(l.nearest(5.0), 6);
        assert_eq!(l.nearest(100.0), 7);
        assert_eq!(l.nearest(-0.1), 0);
        assert_eq!(l.nearest(-0.3), 9);
        assert_eq!(mx_scale(6.0), 1.0);
        assert_eq!(mx_scale(7.99), 1.0);
        assert_eq!(mx_scale(8.0), 2.0);
        assert_eq!(mx_scale(0.0), 1.0);
        let e4 = Codebook::new(Format::Fp8E4m3).unwrap();
        let l = Levels::new(&e4);
        assert_eq!(e4.values()[l.nearest(1.0625) as usize], 1.0); // halfway 1 and 1.125: even mantissa
        assert_eq!(e4.values()[l.nearest(1000.0) as usize], 448.0);
    }

    /// The fp8 grids give the search's code for every level, every midpoint between adjacent
    /// levels and the float64 values next to them, zeros, values past the largest, and a
    /// million values spread over every binade.
    #[test]
    fn fp8_grids_round_as_the_search() {
        for f in [Format::Fp8E4m3, Format::Fp8E5m2] {
            let l = Levels::new(&Codebook::new(f).unwrap());
            let grid = l.fp8.expect("an fp8 grid");
            let mut xs = vec![
                0.0, -0.0, 1e300, -1e300, 5e-324, -5e-324, grid.max, -grid.max,
            ];
            for w in l.sorted.windows(2) {
                let mid = (w[0].0 + w[1].0) / 2.0;
                for v in [w[0].0, mid, w[1].0] {
                    xs.extend([v, v.next_up(), v.next_down()]);
                }
            }
            let mut r = maleki_common::rng::stream(17, 0);
            for i in 0..1_000_000 {
                let scale = 2f64.powi((i % 48) - 30);
                xs.push(maleki_common::rng::standard_normal(&mut r) * scale);
            }
            for &x in xs.iter().filter(|x| x.is_finite()) {
                assert_eq!(grid.nearest(x), l.search(x), "{f:?} x = {x:e}");
            }
        }
    }
}
