//! Weight formats: codebooks, mirror symmetries and the canonical bit packings (spec section 3).
//!
//! A format maps a code `q` in `0..V` to a value `v[q]` (the codebook). Groups of weights
//! share a scale `s` and optionally a zero point `z` (in value units):
//! `Wd = s * (v[q] - z)`. The canonical packing is a little-endian bit stream along K within
//! each row (rows are independent and start on a byte boundary); padding bits are zero.

use maleki_common::{Error, Result};

/// The largest table depth any kernel accepts: tables have `V^d <= 65536` entries, so a
/// tuple index always fits in a `u16`.
pub const MAX_DEPTH: usize = 16;
/// The most table entries a depth may give (`V^d`).
pub const MAX_TABLE_ENTRIES: usize = 1 << 16;

/// The weight formats of spec section 3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// Signed 4-bit integers `q - 8` in `-8..=7`.
    Int4,
    /// Unsigned 4-bit integers `q` in `0..=15`, normally with zero points (GPTQ/AWQ).
    Uint4,
    /// Signed 3-bit integers `q - 4` in `-4..=3`.
    Int3,
    /// Unsigned 3-bit integers `q` in `0..=7`, normally with zero points.
    Uint3,
    /// Signed 2-bit integers `q - 2` in `-2..=1`.
    Int2,
    /// Unsigned 2-bit integers `q` in `0..=3`, normally with zero points.
    Uint2,
    /// Ternary (1.58-bit) weights `t - 1` in `{-1, 0, 1}`, 5 trits per byte.
    Ternary,
    /// OCP MX FP4 E2M1: bit 3 sign, bits 2-1 exponent, bit 0 mantissa.
    Fp4,
    /// The 16 NormalFloat4 levels of bitsandbytes.
    Nf4,
    /// A user codebook of 2..=16 values, packed as 4-bit codes.
    Codebook,
    /// OCP FP8 E4M3 (the "fn" variant: no infinities, NaN = S.1111.111).
    Fp8E4m3,
    /// OCP FP8 E5M2 (IEEE-like, with infinities and NaNs).
    Fp8E5m2,
    /// Signed 8-bit integers `q - 128` in `-128..=127`, one byte per code (llama.cpp's Q8_0,
    /// and its 5- and 6-bit types, Q5_0 and Q6_K, whose integers are a subset).
    Int8,
    /// Unsigned 8-bit integers `q` in `0..=255`, normally with zero points (llama.cpp's Q5_1
    /// and Q5_K).
    Uint8,
}

impl Format {
    /// Every format, in documentation order.
    pub const ALL: [Format; 14] = [
        Format::Int4,
        Format::Uint4,
        Format::Int3,
        Format::Uint3,
        Format::Int2,
        Format::Uint2,
        Format::Ternary,
        Format::Fp4,
        Format::Nf4,
        Format::Codebook,
        Format::Fp8E4m3,
        Format::Fp8E5m2,
        Format::Int8,
        Format::Uint8,
    ];

    /// The name used by the Python API.
    pub fn name(self) -> &'static str {
        match self {
            Format::Int4 => "int4",
            Format::Uint4 => "uint4",
            Format::Int3 => "int3",
            Format::Uint3 => "uint3",
            Format::Int2 => "int2",
            Format::Uint2 => "uint2",
            Format::Ternary => "ternary",
            Format::Fp4 => "fp4",
            Format::Nf4 => "nf4",
            Format::Codebook => "codebook",
            Format::Fp8E4m3 => "fp8_e4m3",
            Format::Fp8E5m2 => "fp8_e5m2",
            Format::Int8 => "int8",
            Format::Uint8 => "uint8",
        }
    }

    /// Parses a Python-side name (`"int4"`, `"fp8_e4m3"`, ...).
    pub fn from_name(name: &str) -> Result<Format> {
        Format::ALL
            .into_iter()
            .find(|f| f.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = Format::ALL.iter().map(|f| f.name()).collect();
                Error::invalid(
                    "format",
                    format!(
                        "unknown format {name:?}; expected one of {}",
                        names.join(", ")
                    ),
                )
            })
    }

    /// The canonical packing of the format.
    pub fn packing(self) -> Packing {
        match self {
            Format::Int4 | Format::Uint4 | Format::Fp4 | Format::Nf4 | Format::Codebook => {
                Packing::Nibble
            }
            Format::Int3 | Format::Uint3 => Packing::Int3,
            Format::Int2 | Format::Uint2 => Packing::Crumb,
            Format::Ternary => Packing::Trit5,
            Format::Fp8E4m3 | Format::Fp8E5m2 | Format::Int8 | Format::Uint8 => Packing::Byte,
        }
    }

    /// True for the uniform integer formats (`int*`, `uint*`, ternary).
    pub fn is_integer(self) -> bool {
        matches!(
            self,
            Format::Int4
                | Format::Uint4
                | Format::Int3
                | Format::Uint3
                | Format::Int2
                | Format::Uint2
                | Format::Ternary
                | Format::Int8
                | Format::Uint8
        )
    }
}

/// How codes are laid out in bytes (little-endian bit streams along K within a row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packing {
    /// 2 codes per byte, k even in the low nibble.
    Nibble,
    /// 8 codes per 3 bytes: code j of the 8 at bits `3j..3j+3` of the 24-bit little-endian word
    /// (so codes `2i, 2i+1` form the six-bit index at bits `6i..6i+6`).
    Int3,
    /// 4 codes per byte, lowest bits first.
    Crumb,
    /// 5 trits per byte: `byte = sum_j t_j 3^j`.
    Trit5,
    /// 1 code per byte.
    Byte,
}

impl Packing {
    /// Bytes of one packed row of `k` codes.
    pub fn row_bytes(self, k: usize) -> usize {
        match self {
            Packing::Nibble => k.div_ceil(2),
            Packing::Int3 => k.div_ceil(8) * 3,
            Packing::Crumb => k.div_ceil(4),
            Packing::Trit5 => k.div_ceil(5),
            Packing::Byte => k,
        }
    }

    /// Storage bits per weight (for bandwidth figures): 4, 3, 2, 1.6 or 8.
    pub fn bits_per_code(self) -> f64 {
        match self {
            Packing::Nibble => 4.0,
            Packing::Int3 => 3.0,
            Packing::Crumb => 2.0,
            Packing::Trit5 => 8.0 / 5.0,
            Packing::Byte => 8.0,
        }
    }

    /// The largest code the packing can hold.
    pub fn max_code(self) -> u8 {
        match self {
            Packing::Nibble => 15,
            Packing::Int3 => 7,
            Packing::Crumb => 3,
            Packing::Trit5 => 2,
            Packing::Byte => 255,
        }
    }

    /// Packs one row. `codes.len()` is K; `out.len()` must be `row_bytes(K)`; codes must be
    /// `<= max_code()` (checked by the callers that take user input).
    pub fn pack_row(self, codes: &[u8], out: &mut [u8]) {
        debug_assert_eq!(out.len(), self.row_bytes(codes.len()));
        out.fill(0);
        match self {
            Packing::Nibble => {
                for (i, &c) in codes.iter().enumerate() {
                    out[i / 2] |= (c & 15) << (4 * (i % 2));
                }
            }
            Packing::Int3 => {
                for (chunk, o) in codes.chunks(8).zip(out.chunks_mut(3)) {
                    let mut word = 0u32;
                    for (j, &c) in chunk.iter().enumerate() {
                        word |= u32::from(c & 7) << (3 * j);
                    }
                    o.copy_from_slice(&word.to_le_bytes()[..3]);
                }
            }
            Packing::Crumb => {
                for (i, &c) in codes.iter().enumerate() {
                    out[i / 4] |= (c & 3) << (2 * (i % 4));
                }
            }
            Packing::Trit5 => {
                for (chunk, o) in codes.chunks(5).zip(out.iter_mut()) {
                    let mut b = 0u8;
                    for &c in chunk.iter().rev() {
                        b = b * 3 + c.min(2);
                    }
                    *o = b;
                }
            }
            Packing::Byte => out.copy_from_slice(codes),
        }
    }

    /// Unpacks one row of `out.len()` codes from `bytes` (`row_bytes(out.len())` long).
    /// Trit bytes above 242 (not produced by `pack_row`) decode digit by digit modulo 3.
    pub fn unpack_row(self, bytes: &[u8], out: &mut [u8]) {
        debug_assert_eq!(bytes.len(), self.row_bytes(out.len()));
        match self {
            // Byte by byte (a division per code kept the compiler from vectorising).
            Packing::Nibble => {
                let last_byte = out.len() / 2;
                let mut pairs = out.chunks_exact_mut(2);
                for (o, &b) in (&mut pairs).zip(bytes) {
                    o[0] = b & 15;
                    o[1] = b >> 4;
                }
                if let [last] = pairs.into_remainder() {
                    *last = bytes[last_byte] & 15;
                }
            }
            Packing::Int3 => {
                for (chunk, b) in out.chunks_mut(8).zip(bytes.chunks(3)) {
                    let word = u32::from(b[0]) | (u32::from(b[1]) << 8) | (u32::from(b[2]) << 16);
                    for (j, o) in chunk.iter_mut().enumerate() {
                        *o = ((word >> (3 * j)) & 7) as u8;
                    }
                }
            }
            Packing::Crumb => {
                for (o, &b) in out.chunks_mut(4).zip(bytes) {
                    for (j, c) in o.iter_mut().enumerate() {
                        *c = (b >> (2 * j)) & 3;
                    }
                }
            }
            Packing::Trit5 => {
                for (chunk, &b) in out.chunks_mut(5).zip(bytes.iter()) {
                    let mut v = b;
                    for o in chunk.iter_mut() {
                        *o = v % 3;
                        v /= 3;
                    }
                }
            }
            Packing::Byte => out.copy_from_slice(bytes),
        }
    }
}

/// The involution on codes under which a codebook is (affinely) antisymmetric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Involution {
    /// `c -> V - 1 - c` (uniform integers, ternary, sorted symmetric codebooks).
    Reverse,
    /// `c -> c ^ (V / 2)` (sign-magnitude codes: fp4 e2m1, V a power of two).
    SignBit,
}

/// A mirror symmetry of a codebook: `v[inv(c)] - shift = -(v[c] - shift)` for every code.
///
/// With the shifted codebook `v' = v - shift` a table satisfies `T[mirror(idx)] = -T[idx]`,
/// so only a prefix holding one entry of every mirror pair is built ([`Mirror::stored_entries`]:
/// `ceil(V^r / 2)`); the zero point absorbs the shift: `v - z = v' - (z - shift)` (spec section 2, "Mirror").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mirror {
    pub involution: Involution,
    /// Added back through the zero-point term (`z_eff = z - shift`); 0 for fp4 and ternary,
    /// -0.5 for int4 (`q - 8`), 7.5 for uint4.
    pub shift: f32,
    /// Number of levels V.
    pub levels: usize,
}

impl Mirror {
    /// The mirrored code of `c`.
    #[inline]
    pub fn code(&self, c: usize) -> usize {
        match self.involution {
            Involution::Reverse => self.levels - 1 - c,
            Involution::SignBit => c ^ (self.levels / 2),
        }
    }

    /// Entries stored for a table of depth `r`: the prefix `ceil(V^r / 2)`, the smallest that
    /// holds every index or its mirror (`idx >= ceil(V^r/2)` mirrors below it). For even `V`
    /// that is "digit `r-1` below `V/2`" (`V^(r-1) * V/2`); for odd `V` (ternary, `Reverse`)
    /// it is smaller than those whose top digit is at most the centre (`V^(r-1) * ceil(V/2)`):
    /// ternary depth 5 stores 122 entries, not 162, and so fits 7-bit (folded) indices.
    #[inline]
    pub fn stored_entries(&self, r: usize) -> usize {
        self.levels.pow(r as u32).div_ceil(2)
    }

    /// The mirrored index of a depth-`r` index (every digit mirrored).
    #[inline]
    pub fn index(&self, idx: usize, r: usize) -> usize {
        match self.involution {
            Involution::Reverse => self.levels.pow(r as u32) - 1 - idx,
            Involution::SignBit => {
                let half = self.levels / 2;
                let mut mask = 0usize;
                let mut p = 1usize;
                for _ in 0..r {
                    mask += half * p;
                    p *= self.levels;
                }
                idx ^ mask
            }
        }
    }
}

/// A relabelling of the codes under which a codebook that is symmetric about 0 except for
/// one extreme code (the two's-complement integers: int4 `-8..7`) has a mirror with no
/// shift: label `0` is the code of value 0, labels `1..V/2` the positive values in ascending
/// order, label `V/2 + i` the negation of label `i`. Label `V/2` ("-0") stands for the spare
/// code (int4: -8), which has no negation in the codebook: the relabelling is exact only for
/// weights that never use it (symmetric round-to-nearest quantization never does). In label
/// space the codebook is antisymmetric under `L -> L ^ V/2` (a [`Involution::SignBit`]
/// mirror with shift 0), so half tables need no zero-point term and have the same int8 grid
/// as full tables.
#[derive(Debug, Clone, PartialEq)]
pub struct SignMagnitude {
    /// The label of every code.
    pub labels: Vec<u8>,
    /// The value of every label (`-0.0` for label `V/2`).
    pub values: Vec<f32>,
    /// The code without a negation (label `V/2`).
    pub spare: usize,
}

impl SignMagnitude {
    /// The shift-free mirror of label space.
    pub fn mirror(&self) -> Mirror {
        Mirror {
            involution: Involution::SignBit,
            shift: 0.0,
            levels: self.values.len(),
        }
    }
}

/// The 16 NormalFloat4 levels (bitsandbytes' `NF4` quantile construction), as float32.
pub const NF4_VALUES: [f32; 16] = [
    -1.0,
    -0.696_192_8,
    -0.525_073_05,
    -0.394_917_5,
    -0.284_441_38,
    -0.184_773_43,
    -0.091_050_036,
    0.0,
    0.079_580_3,
    0.160_930_2,
    0.246_112_3,
    0.337_915_24,
    0.440_709_83,
    0.562_617,
    0.722_956_84,
    1.0,
];

/// The FP4 E2M1 magnitudes of codes 0..8 (sign in bit 3).
pub const FP4_MAGNITUDES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

fn fp8_e4m3(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let e = i32::from((b >> 3) & 15);
    let m = f32::from(b & 7);
    if e == 15 && m == 7.0 {
        return f32::NAN;
    }
    let mag = if e == 0 {
        m / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + m / 8.0) * 2f32.powi(e - 7)
    };
    sign * mag
}

fn fp8_e5m2(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let e = i32::from((b >> 2) & 31);
    let m = f32::from(b & 3);
    if e == 31 {
        return if m == 0.0 {
            sign * f32::INFINITY
        } else {
            f32::NAN
        };
    }
    let mag = if e == 0 {
        m / 4.0 * 2f32.powi(-14)
    } else {
        (1.0 + m / 4.0) * 2f32.powi(e - 15)
    };
    sign * mag
}

/// A format with its codebook values.
#[derive(Debug, Clone, PartialEq)]
pub struct Codebook {
    format: Format,
    values: Vec<f32>,
}

impl Codebook {
    /// The codebook of a built-in format (`Format::Codebook` needs [`Codebook::custom`]).
    pub fn new(format: Format) -> Result<Codebook> {
        let values: Vec<f32> = match format {
            Format::Int4 => (0..16).map(|q| (q - 8) as f32).collect(),
            Format::Uint4 => (0..16).map(|q| q as f32).collect(),
            Format::Int3 => (0..8).map(|q| (q - 4) as f32).collect(),
            Format::Uint3 => (0..8).map(|q| q as f32).collect(),
            Format::Int2 => (0..4).map(|q| (q - 2) as f32).collect(),
            Format::Uint2 => (0..4).map(|q| q as f32).collect(),
            Format::Ternary => vec![-1.0, 0.0, 1.0],
            Format::Fp4 => (0..16)
                .map(|c| {
                    if c & 8 != 0 {
                        -FP4_MAGNITUDES[c & 7]
                    } else {
                        FP4_MAGNITUDES[c & 7]
                    }
                })
                .collect(),
            Format::Nf4 => NF4_VALUES.to_vec(),
            Format::Fp8E4m3 => (0..=255u8).map(fp8_e4m3).collect(),
            Format::Fp8E5m2 => (0..=255u8).map(fp8_e5m2).collect(),
            Format::Int8 => (0..256).map(|q| (q - 128) as f32).collect(),
            Format::Uint8 => (0..256).map(|q| q as f32).collect(),
            Format::Codebook => {
                return Err(Error::invalid(
                    "codebook",
                    "format 'codebook' needs the codebook values",
                ));
            }
        };
        Ok(Codebook { format, values })
    }

    /// A user codebook of 2..=16 finite, distinct values (packed as 4-bit codes).
    pub fn custom(values: &[f32]) -> Result<Codebook> {
        if !(2..=16).contains(&values.len()) {
            return Err(Error::invalid(
                "codebook",
                format!("needs 2 to 16 values, got {}", values.len()),
            ));
        }
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(Error::invalid(
                "codebook",
                format!("value {i} is not finite ({})", values[i]),
            ));
        }
        for i in 0..values.len() {
            for j in 0..i {
                if values[i] == values[j] {
                    return Err(Error::invalid(
                        "codebook",
                        format!("values {j} and {i} are equal ({})", values[i]),
                    ));
                }
            }
        }
        Ok(Codebook {
            format: Format::Codebook,
            values: values.to_vec(),
        })
    }

    /// A codebook for `format`, taking `values` only for `Format::Codebook`.
    pub fn for_format(format: Format, values: Option<&[f32]>) -> Result<Codebook> {
        match (format, values) {
            (Format::Codebook, Some(v)) => Codebook::custom(v),
            (Format::Codebook, None) => Codebook::new(format),
            (_, None) => Codebook::new(format),
            (f, Some(_)) => Err(Error::invalid(
                "codebook",
                format!(
                    "a codebook is only accepted with format='codebook', not {:?}",
                    f.name()
                ),
            )),
        }
    }

    pub fn format(&self) -> Format {
        self.format
    }

    /// The values `v[0..V]` (fp8: NaN/inf at the codes that encode them).
    pub fn values(&self) -> &[f32] {
        &self.values
    }

    /// Number of levels V.
    pub fn levels(&self) -> usize {
        self.values.len()
    }

    pub fn packing(&self) -> Packing {
        self.format.packing()
    }

    /// True when code `c` may appear in weights: below V and (fp8) not a NaN/inf encoding.
    pub fn valid_code(&self, c: u8) -> bool {
        (c as usize) < self.values.len() && self.values[c as usize].is_finite()
    }

    /// The values used to build tables: invalid fp8 codes (never present in weights) read 0.
    pub fn table_values(&self) -> Vec<f32> {
        self.values
            .iter()
            .map(|&v| if v.is_finite() { v } else { 0.0 })
            .collect()
    }

    /// The natural depth: the one whose index is the stored byte (spec section 3).
    pub fn natural_depth(&self) -> usize {
        match self.format.packing() {
            Packing::Nibble | Packing::Int3 => 2,
            Packing::Crumb => 4,
            Packing::Trit5 => 5,
            Packing::Byte => 1,
        }
    }

    /// The largest depth accepted: `V^d <= 65536` (fp8: depth 1 only, see spec section 2.5).
    pub fn max_depth(&self) -> usize {
        if self.format.packing() == Packing::Byte {
            return 1;
        }
        let v = self.levels();
        let mut d = 1;
        while d < MAX_DEPTH && v.pow(d as u32 + 1) <= MAX_TABLE_ENTRIES {
            d += 1;
        }
        d
    }

    /// The largest depth whose index fits one byte (`V^d <= 256`), used by `depth="auto"`.
    pub fn max_byte_depth(&self) -> usize {
        let v = self.levels();
        let mut d = 1;
        while v.pow(d as u32 + 1) <= 256 {
            d += 1;
        }
        d.min(self.max_depth())
    }

    /// Checks `1 <= depth <= max_depth()`.
    pub fn check_depth(&self, depth: usize) -> Result<()> {
        let max = self.max_depth();
        if depth == 0 || depth > max {
            return Err(Error::invalid(
                "depth",
                format!(
                    "format {} (V={}) supports depths 1..={max} (tables of at most {MAX_TABLE_ENTRIES} entries), got {depth}",
                    self.format.name(),
                    self.levels()
                ),
            ));
        }
        Ok(())
    }

    /// The mirror symmetry of the codebook, if it has one (fp8: none, its tables are depth 1).
    pub fn mirror(&self) -> Option<Mirror> {
        if self.format.packing() == Packing::Byte {
            return None;
        }
        let v: Vec<f64> = self.values.iter().map(|&x| f64::from(x)).collect();
        let n = v.len();
        let try_inv = |inv: Involution| -> Option<Mirror> {
            let m = Mirror {
                involution: inv,
                shift: 0.0,
                levels: n,
            };
            if inv == Involution::SignBit && !n.is_power_of_two() {
                return None;
            }
            let shift = (v[0] + v[m.code(0)]) / 2.0;
            if shift as f32 as f64 != shift {
                return None;
            }
            let ok = (0..n).all(|c| {
                let a = v[c] - shift;
                let b = v[m.code(c)] - shift;
                a == -b && (a as f32) as f64 == a
            });
            ok.then_some(Mirror {
                involution: inv,
                shift: shift as f32,
                levels: n,
            })
        };
        try_inv(Involution::Reverse).or_else(|| try_inv(Involution::SignBit))
    }

    /// The sign-magnitude relabelling of the codebook ([`SignMagnitude`]), if it has one:
    /// `V` a power of two `>= 4`, one code of value 0, `V/2 - 1` positive values each with its
    /// exact negation, and one spare code (of either sign).
    pub fn sign_magnitude(&self) -> Option<SignMagnitude> {
        let v = &self.values;
        let n = v.len();
        if self.format.packing() == Packing::Byte || n < 4 || !n.is_power_of_two() {
            return None;
        }
        let negation = |c: usize| (0..n).find(|&d| v[d] == -v[c]);
        let zeros: Vec<usize> = (0..n).filter(|&c| v[c] == 0.0).collect();
        // Positive values whose negation is in the codebook (values are distinct).
        let mut pos: Vec<usize> = (0..n)
            .filter(|&c| v[c] > 0.0 && negation(c).is_some())
            .collect();
        if zeros.len() != 1 || pos.len() != n / 2 - 1 {
            return None;
        }
        pos.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
        let mut labels = vec![u8::MAX; n];
        let mut values = vec![0f32; n];
        labels[zeros[0]] = 0;
        values[n / 2] = -0.0;
        for (i, &c) in pos.iter().enumerate() {
            let neg = [negation(c)?];
            labels[c] = (i + 1) as u8;
            labels[neg[0]] = (n / 2 + i + 1) as u8;
            values[i + 1] = v[c];
            values[n / 2 + i + 1] = -v[c];
        }
        let spare: Vec<usize> = (0..n).filter(|&c| labels[c] == u8::MAX).collect();
        if spare.len() != 1 {
            return None;
        }
        labels[spare[0]] = (n / 2) as u8;
        Some(SignMagnitude {
            labels,
            values,
            spare: spare[0],
        })
    }

    /// Integer form of `values - shift` for exact integer tables (`i16` mode): the smallest
    /// `e` in `0..=8` such that every `(v - shift) * 2^e` is an integer of magnitude
    /// `<= 2^15`; returns those integers and `e`. `None` for non-dyadic codebooks (nf4).
    pub fn integer_values(&self, shift: f32) -> Option<(Vec<i32>, i32)> {
        integer_form(&self.table_values(), shift)
    }
}

/// [`Codebook::integer_values`] of any list of values (a codebook in label space).
pub fn integer_form(vals: &[f32], shift: f32) -> Option<(Vec<i32>, i32)> {
    {
        for e in 0..=8 {
            let f = 2f64.powi(e);
            let ints: Option<Vec<i32>> = vals
                .iter()
                .map(|&v| {
                    let x = (f64::from(v) - f64::from(shift)) * f;
                    (x == x.round() && x.abs() <= 32768.0).then_some(x as i32)
                })
                .collect();
            if let Some(ints) = ints {
                return Some((ints, e));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codebooks_have_the_documented_values() {
        let i4 = Codebook::new(Format::Int4).unwrap();
        assert_eq!(i4.values()[0], -8.0);
        assert_eq!(i4.values()[15], 7.0);
        let fp4 = Codebook::new(Format::Fp4).unwrap();
        assert_eq!(fp4.values()[7], 6.0);
        assert_eq!(fp4.values()[15], -6.0);
        assert_eq!(fp4.values()[9], -0.5);
        let e4 = Codebook::new(Format::Fp8E4m3).unwrap();
        assert_eq!(e4.values()[0x7e], 448.0);
        assert!(e4.values()[0x7f].is_nan());
        assert_eq!(e4.values()[0x01], 2f32.powi(-9));
        assert_eq!(e4.values()[0x38], 1.0);
        let e5 = Codebook::new(Format::Fp8E5m2).unwrap();
        assert_eq!(e5.values()[0x7b], 57344.0);
        assert_eq!(e5.values()[0x7c], f32::INFINITY);
        assert!(!e5.valid_code(0x7c));
        assert_eq!(e5.values()[0x3c], 1.0);
        assert_eq!(e5.values()[0x01], 2f32.powi(-16));
    }

    #[test]
    fn mirrors_are_found_where_the_spec_says() {
        let m = Codebook::new(Format::Int4).unwrap().mirror().unwrap();
        assert_eq!((m.involution, m.shift), (Involution::Reverse, -0.5));
        let m = Codebook::new(Format::Uint4).unwrap().mirror().unwrap();
        assert_eq!(m.shift, 7.5);
        let m = Codebook::new(Format::Fp4).unwrap().mirror().unwrap();
        assert_eq!((m.involution, m.shift), (Involution::SignBit, 0.0));
        let m = Codebook::new(Format::Ternary).unwrap().mirror().unwrap();
        assert_eq!((m.involution, m.shift), (Involution::Reverse, 0.0));
        assert!(Codebook::new(Format::Nf4).unwrap().mirror().is_none());
        assert!(Codebook::new(Format::Fp8E4m3).unwrap().mirror().is_none());
        assert!(Codebook::custom(&[-2.0, -1.0, 1.0, 2.0])
            .unwrap()
            .mirror()
            .is_some());
        assert!(Codebook::custom(&[-2.0, -1.0, 1.0, 3.0])
            .unwrap()
            .mirror()
            .is_none());
    }

    #[test]
    fn sign_magnitude_labels_the_twos_complement_integers() {
        for (f, v) in [
            (Format::Int4, 16usize),
            (Format::Int3, 8),
            (Format::Int2, 4),
        ] {
            let cb = Codebook::new(f).unwrap();
            let sm = cb.sign_magnitude().unwrap();
            assert_eq!(sm.spare, 0, "{f:?}: the most negative code");
            let mi = sm.mirror();
            for c in 0..v {
                let l = sm.labels[c] as usize;
                if c != sm.spare {
                    assert_eq!(sm.values[l], cb.values()[c], "{f:?} code {c}");
                }
                // Antisymmetric in label space, the spare label included.
                assert_eq!(sm.values[mi.code(l)], -sm.values[l]);
            }
            let mut seen = sm.labels.clone();
            seen.sort();
            assert_eq!(seen, (0..v as u8).collect::<Vec<_>>());
        }
        for f in [
            Format::Uint4,
            Format::Fp4,
            Format::Nf4,
            Format::Ternary,
            Format::Fp8E4m3,
        ] {
            assert!(
                Codebook::new(f).unwrap().sign_magnitude().is_none(),
                "{f:?}"
            );
        }
        let cb = Codebook::custom(&[-3.0, -1.0, 0.0, 1.0, 3.0, 5.0, -2.0, 2.0]).unwrap();
        let sm = cb.sign_magnitude().unwrap();
        assert_eq!(sm.spare, 5);
        assert_eq!(sm.values, vec![0.0, 1.0, 2.0, 3.0, -0.0, -1.0, -2.0, -3.0]);
    }

    #[test]
    fn mirror_index_mirrors_every_digit() {
        for f in [Format::Int4, Format::Fp4, Format::Ternary, Format::Int2] {
            let cb = Codebook::new(f).unwrap();
            let m = cb.mirror().unwrap();
            let v = cb.levels();
            for r in 1..=3usize {
                for idx in 0..v.pow(r as u32) {
                    let mut want = 0;
                    let mut p = 1;
                    let mut rest = idx;
                    for _ in 0..r {
                        want += m.code(rest % v) * p;
                        rest /= v;
                        p *= v;
                    }
                    assert_eq!(m.index(idx, r), want, "{f:?} r={r} idx={idx}");
                }
                // The stored prefix is the smallest that holds every index or its mirror: an
                // index past it mirrors into it, and its last entry is one whose mirror is not
                // below it (so no shorter prefix would do).
                let stored = m.stored_entries(r);
                for idx in 0..v.pow(r as u32) {
                    if idx >= stored {
                        assert!(m.index(idx, r) < stored);
                    }
                }
                assert!(m.index(stored - 1, r) >= stored - 1, "{f:?} r={r}");
                if v.is_multiple_of(2) {
                    // Even V: exactly the indices whose top digit is in the lower half.
                    for idx in 0..v.pow(r as u32) {
                        let top = idx / v.pow(r as u32 - 1);
                        assert_eq!(idx < stored, top < v / 2);
                    }
                }
            }
        }
    }

    #[test]
    fn pack_unpack_round_trip_every_packing() {
        for f in [
            Format::Int4,
            Format::Int3,
            Format::Int2,
            Format::Ternary,
            Format::Fp8E5m2,
        ] {
            let p = f.packing();
            for k in [1usize, 2, 3, 5, 7, 8, 9, 17, 40, 63] {
                let codes: Vec<u8> = (0..k)
                    .map(|i| ((i * 7 + 3) % (p.max_code() as usize + 1)) as u8)
                    .collect();
                let mut bytes = vec![0u8; p.row_bytes(k)];
                p.pack_row(&codes, &mut bytes);
                let mut back = vec![0u8; k];
                p.unpack_row(&bytes, &mut back);
                assert_eq!(back, codes, "{f:?} k={k}");
            }
        }
    }

    #[test]
    fn natural_depth_index_is_the_stored_byte() {
        // int4: byte = lo nibble (k even) + 16 * hi nibble; int2: sum c_j 4^j; ternary: sum t_j 3^j.
        for f in [Format::Int4, Format::Int2, Format::Ternary] {
            let cb = Codebook::new(f).unwrap();
            let d = cb.natural_depth();
            let v = cb.levels();
            let codes: Vec<u8> = (0..d).map(|j| ((j * 5 + 1) % v) as u8).collect();
            let mut byte = [0u8];
            cb.packing().pack_row(&codes, &mut byte);
            let idx: usize = codes
                .iter()
                .enumerate()
                .map(|(j, &c)| c as usize * v.pow(j as u32))
                .sum();
            assert_eq!(byte[0] as usize, idx, "{f:?}");
        }
        // int3: the six-bit index of codes (2i, 2i+1) sits at bits 6i..6i+6.
        let codes = [1u8, 2, 3, 4, 5, 6, 7, 0];
        let mut b = [0u8; 3];
        Packing::Int3.pack_row(&codes, &mut b);
        let word = u32::from(b[0]) | u32::from(b[1]) << 8 | u32::from(b[2]) << 16;
        for i in 0..4 {
            assert_eq!(
                (word >> (6 * i)) & 63,
                u32::from(codes[2 * i]) + 8 * u32::from(codes[2 * i + 1])
            );
        }
    }

    #[test]
    fn depth_limits() {
        assert_eq!(Codebook::new(Format::Int4).unwrap().max_depth(), 4);
        assert_eq!(Codebook::new(Format::Int4).unwrap().max_byte_depth(), 2);
        assert_eq!(Codebook::new(Format::Int2).unwrap().max_depth(), 8);
        assert_eq!(Codebook::new(Format::Ternary).unwrap().max_depth(), 10);
        assert_eq!(Codebook::new(Format::Ternary).unwrap().max_byte_depth(), 5);
        assert_eq!(Codebook::new(Format::Fp8E4m3).unwrap().max_depth(), 1);
        assert!(Codebook::new(Format::Int3).unwrap().check_depth(6).is_err());
    }

    #[test]
    fn integer_values_of_dyadic_codebooks() {
        let fp4 = Codebook::new(Format::Fp4).unwrap();
        let (ints, e) = fp4.integer_values(0.0).unwrap();
        assert_eq!(e, 1);
        assert_eq!(ints[7], 12);
        let i4 = Codebook::new(Format::Int4).unwrap();
        assert_eq!(
            i4.integer_values(-0.5).unwrap(),
            ((0..16).map(|q| 2 * q - 15).collect(), 1)
        );
        assert!(Codebook::new(Format::Nf4)
            .unwrap()
            .integer_values(0.0)
            .is_none());
    }
}
