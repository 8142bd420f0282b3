//! Packed low-bit weights: canonical bytes, scales, zero points, and the cached tile layouts.

use std::sync::{Arc, OnceLock};

use maleki_common::{Error, Result};
use rayon::prelude::*;

use crate::aligned::AlignedVec;
use crate::dense::{self, DenseLayout};
use crate::format::{Codebook, Packing, MAX_DEPTH};
use crate::kernels::{Backend, Tiled};
use crate::layout::{tile_per_group, IndexData, LayoutKind, TileLayout};
use crate::plan::Plan;

/// A quantized weight matrix `Wd` of shape `(M, K)`:
/// `Wd[m, k] = s[m, g] * (v[q[m, k]] - z[m, g])`, `g = k / G` (in the packed column order;
/// see [`PackedWeights::k_perm`] for act-order weights).
///
/// Holds the canonical row-major packing (for `dequantize` and interop) and, built on first
/// use and cached, the kernel tile layout of each depth used and the tiled scales and zero
/// points (`[g][row_block][64]`). Immutable once built; `Send + Sync`.
#[derive(Debug)]
pub struct PackedWeights {
    codebook: Codebook,
    m: usize,
    k: usize,
    group_size: usize,
    // Shared, not copied, by `clone()` (which drops the caches below): a copy without caches
    // costs no second copy of the weights.
    packed: Arc<[u8]>,
    scales: Arc<[f32]>,
    zeros: Option<Arc<[f32]>>,
    k_perm: Option<Arc<[u32]>>,
    /// The tile layouts built so far, by variant ([`LayoutVariant`]) and depth.
    layouts: [[OnceLock<TileLayout>; MAX_DEPTH + 1]; LayoutVariant::COUNT],
    tiled_scales: OnceLock<FloatTiles>,
    tiled_zeros: OnceLock<Option<FloatTiles>>,
    tiled_mirror_zeros: OnceLock<FloatTiles>,
    used_codes: OnceLock<Vec<bool>>,
    /// The weights for the dense `i16` path ([`crate::dense`]).
    dense: OnceLock<DenseLayout>,
    /// The 2-bit dense layout ([`dense::two_bit`] GEMVs).
    dense2: OnceLock<DenseLayout>,
    /// Whether default-table calls run on the dense path, by backend, mirror and whether a
    /// GEMV ([`crate::gemm::auto_precision`]: the same for every N >= 2).
    dense_choice: [OnceLock<bool>; DENSE_CHOICE_KEYS],
}

/// Slots of [`PackedWeights::dense_choice`]: one per (backend, mirror, GEMV or batch).
const DENSE_CHOICE_KEYS: usize = 4 * (Backend::Reference as usize + 1);

impl Clone for PackedWeights {
    fn clone(&self) -> Self {
        PackedWeights {
            codebook: self.codebook.clone(),
            m: self.m,
            k: self.k,
            group_size: self.group_size,
            packed: self.packed.clone(),
            scales: self.scales.clone(),
            zeros: self.zeros.clone(),
            k_perm: self.k_perm.clone(),
            layouts: Default::default(),
            tiled_scales: OnceLock::new(),
            tiled_zeros: OnceLock::new(),
            tiled_mirror_zeros: OnceLock::new(),
            used_codes: OnceLock::new(),
            dense: OnceLock::new(),
            dense2: OnceLock::new(),
            dense_choice: Default::default(),
        }
    }
}

/// A tiled per-(row, group) array: float16 bits when every value is a float16 value
/// ([`Tiled`]).
#[derive(Debug)]
enum FloatTiles {
    F32(AlignedVec<f32>),
    F16(AlignedVec<u16>),
}

impl FloatTiles {
    /// `values` `(M, groups)` tiled `[g][row_block][64]`, as float16 when every value is one.
    fn new(values: &[f32], m: usize, groups: usize) -> Self {
        match values
            .iter()
            .map(|&v| exact_f16(v))
            .collect::<Option<Vec<u16>>>()
        {
            Some(bits) => FloatTiles::F16(tile_per_group(&bits, m, groups)),
            None => FloatTiles::F32(tile_per_group(values, m, groups)),
        }
    }

    fn view(&self) -> Tiled<'_> {
        match self {
            FloatTiles::F32(v) => Tiled::F32(v),
            FloatTiles::F16(v) => Tiled::F16(v),
        }
    }

    fn capacity_bytes(&self) -> usize {
        match self {
            FloatTiles::F32(v) => v.capacity_bytes(),
            FloatTiles::F16(v) => v.capacity_bytes(),
        }
    }
}

/// The float16 bits of `s` when `s` is a float16 value (finite, exactly representable).
fn exact_f16(s: f32) -> Option<u16> {
    let h = half::f16::from_f32(s);
    (h.is_finite() && h.to_f32() == s).then(|| h.to_bits())
}

/// The cached forms of a tile layout: its [`LayoutKind`] and whether its indices are formed
/// from sign-magnitude labels. Whether a mirror plan of given weights uses labels depends on
/// the weights only, so folded layouts (mirror plans only) need one variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LayoutVariant {
    Plain,
    Labeled,
    Folded,
    Paired,
    PairedLabeled,
}

impl LayoutVariant {
    const COUNT: usize = 5;

    fn of(kind: LayoutKind, labeled: bool) -> LayoutVariant {
        match (kind, labeled) {
            (LayoutKind::Plain, false) => LayoutVariant::Plain,
            (LayoutKind::Plain, true) => LayoutVariant::Labeled,
            (LayoutKind::Folded, _) => LayoutVariant::Folded,
            (LayoutKind::Paired, false) => LayoutVariant::Paired,
            (LayoutKind::Paired, true) => LayoutVariant::PairedLabeled,
        }
    }
}

/// `cell`'s value, made by `make` when it has none. Unlike `OnceLock::get_or_init`, `make`
/// runs outside the cell's lock: the makers run rayon parallel loops, and a pool thread that
/// steals another call's job while it waits inside such a loop would block on the lock its
/// own loop must release first (two threads calling on fresh weights hung that way). Threads
/// that race both make the value; the first stored is kept (they are equal).
fn fill<T>(cell: &OnceLock<T>, make: impl FnOnce() -> T) -> &T {
    if let Some(v) = cell.get() {
        return v;
    }
    let _ = cell.set(make());
    cell.get().expect("the cell was set just above")
}

/// [`fill`] for a `make` that can fail (a cache too large for the memory left): its error is
/// returned and the cell stays empty.
fn try_fill<T>(cell: &OnceLock<T>, make: impl FnOnce() -> Result<T>) -> Result<&T> {
    if let Some(v) = cell.get() {
        return Ok(v);
    }
    let _ = cell.set(make()?);
    Ok(cell.get().expect("the cell was set just above"))
}

fn check_dims(m: usize, k: usize, group_size: usize) -> Result<()> {
    if m == 0 || k == 0 {
        return Err(Error::invalid(
            "w",
            format!("the weight matrix must be non-empty, got shape ({m}, {k})"),
        ));
    }
    if group_size == 0 || !k.is_multiple_of(group_size) {
        return Err(Error::invalid(
            "group_size",
            format!("must divide K = {k} (pad K with zero weights otherwise), got {group_size}"),
        ));
    }
    if m > u32::MAX as usize || k > u32::MAX as usize {
        return Err(Error::invalid(
            "w",
            format!("shape ({m}, {k}) is too large"),
        ));
    }
    Ok(())
}

fn check_per_group(name: &str, vals: &[f32], m: usize, groups: usize) -> Result<()> {
    if vals.len() != m * groups {
        return Err(Error::shape(
            name,
            format!("({m}, {groups})"),
            format!("{} values", vals.len()),
        ));
    }
    if let Some(i) = vals.iter().position(|v| !v.is_finite()) {
        return Err(Error::invalid(
            name,
            format!(
                "contains a non-finite value ({}) at index ({}, {})",
                vals[i],
                i / groups,
                i % groups
            ),
        ));
    }
    Ok(())
}

/// Refuses scales and zero points that let a weight `s * (v - z)` leave float32's range for
/// some code `v` of the codebook (the kernels compute in float32, and `dequantize` to float32
/// would give inf), as `quantize` refuses such weights.
fn check_weight_range(
    codebook: &Codebook,
    scales: &[f32],
    zeros: Option<&[f32]>,
    groups: usize,
) -> Result<()> {
    let valid = (0..codebook.levels()).filter(|&c| codebook.valid_code(c as u8));
    let (lo, hi) = valid
        .map(|c| f64::from(codebook.values()[c]))
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    for (i, &s) in scales.iter().enumerate() {
        let z = zeros.map_or(0.0, |z| f64::from(z[i]));
        let largest = f64::from(s).abs() * (hi - z).abs().max((lo - z).abs());
        if largest > f64::from(f32::MAX) {
            return Err(Error::invalid(
                if zeros.is_some() {
                    "scales / zeros"
                } else {
                    "scales"
                },
                format!(
                    "row {}, group {}: the weights s * (v - z) reach {largest:.3e}, beyond \
                     float32's 3.4e38",
                    i / groups,
                    i % groups
                ),
            ));
        }
    }
    Ok(())
}

fn check_perm(perm: &[u32], k: usize) -> Result<()> {
    if perm.len() != k {
        return Err(Error::shape(
            "k_perm",
            format!("({k},)"),
            format!("({},)", perm.len()),
        ));
    }
    let mut seen = vec![false; k];
    for &p in perm {
        let p = p as usize;
        if p >= k || seen[p] {
            return Err(Error::invalid("k_perm", "must be a permutation of 0..K"));
        }
        seen[p] = true;
    }
    Ok(())
}

impl PackedWeights {
    /// Builds packed weights from unpacked codes `(M, K)` row-major.
    ///
    /// `scales` and `zeros` are `(M, K/G)` row-major; `zeros` are in value units
    /// (`Wd = s * (v[q] - z)`). `k_perm` (act-order): packed column `j` holds original
    /// column `k_perm[j]`.
    #[allow(clippy::too_many_arguments)]
    pub fn from_codes(
        codebook: Codebook,
        m: usize,
        k: usize,
        group_size: usize,
        codes: &[u8],
        scales: Vec<f32>,
        zeros: Option<Vec<f32>>,
        k_perm: Option<Vec<u32>>,
    ) -> Result<PackedWeights> {
        check_dims(m, k, group_size)?;
        if codes.len() != m * k {
            return Err(Error::shape(
                "codes",
                format!("({m}, {k})"),
                format!("{} codes", codes.len()),
            ));
        }
        if let Some(i) = codes.iter().position(|&c| !codebook.valid_code(c)) {
            return Err(Error::invalid(
                "codes",
                format!(
                    "code {} at index ({}, {}) is not a valid {} code (0 to {}{})",
                    codes[i],
                    i / k,
                    i % k,
                    codebook.format().name(),
                    codebook.levels() - 1,
                    if codebook.levels() == 256 {
                        ", finite values only"
                    } else {
                        ""
                    }
                ),
            ));
        }
        let packing = codebook.packing();
        let rb = packing.row_bytes(k);
        let mut packed = maleki_common::alloc::zeroed_vec::<u8>(m * rb, "the packed weights")?;
        packed
            .par_chunks_mut(rb)
            .zip(codes.par_chunks(k))
            .for_each(|(out, row)| packing.pack_row(row, out));
        Self::assemble(codebook, m, k, group_size, packed, scales, zeros, k_perm)
    }

    /// Builds packed weights from canonical packed bytes `(M, row_bytes(K))`.
    #[allow(clippy::too_many_arguments)]
    pub fn from_packed(
        codebook: Codebook,
        m: usize,
        k: usize,
        group_size: usize,
        packed: Vec<u8>,
        scales: Vec<f32>,
        zeros: Option<Vec<f32>>,
        k_perm: Option<Vec<u32>>,
    ) -> Result<PackedWeights> {
        check_dims(m, k, group_size)?;
        let rb = codebook.packing().row_bytes(k);
        if packed.len() != m * rb {
            return Err(Error::shape(
                "packed",
                format!("({m}, {rb})"),
                format!("{} bytes", packed.len()),
            ));
        }
        let pw = Self::assemble(codebook, m, k, group_size, packed, scales, zeros, k_perm)?;
        // Validate the codes (invalid trits, fp8 NaN encodings, codes >= V of small codebooks).
        let bad = pw
            .packed
            .par_chunks(rb)
            .enumerate()
            .find_map_first(|(row, bytes)| {
                let mut codes = vec![0u8; k];
                pw.codebook.packing().unpack_row(bytes, &mut codes);
                let trit_ok = pw.codebook.packing() != crate::format::Packing::Trit5
                    || bytes.iter().all(|&b| b < 243);
                codes
                    .iter()
                    .position(|&c| !pw.codebook.valid_code(c))
                    .map(|i| (row, i))
                    .or((!trit_ok).then_some((row, 0)))
            });
        if let Some((row, col)) = bad {
            return Err(Error::invalid(
                "packed",
                format!("row {row} holds an invalid code near column {col}"),
            ));
        }
        Ok(pw)
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        codebook: Codebook,
        m: usize,
        k: usize,
        group_size: usize,
        packed: Vec<u8>,
        scales: Vec<f32>,
        zeros: Option<Vec<f32>>,
        k_perm: Option<Vec<u32>>,
    ) -> Result<PackedWeights> {
        let groups = k / group_size;
        check_per_group("scales", &scales, m, groups)?;
        if let Some(z) = &zeros {
            check_per_group("zeros", z, m, groups)?;
        }
        if let Some(p) = &k_perm {
            check_perm(p, k)?;
        }
        check_weight_range(&codebook, &scales, zeros.as_deref(), groups)?;
        // An identity permutation is no permutation.
        let k_perm = k_perm.filter(|p| p.iter().enumerate().any(|(i, &j)| i as u32 != j));
        Ok(PackedWeights {
            codebook,
            m,
            k,
            group_size,
            packed: packed.into(),
            scales: scales.into(),
            zeros: zeros.map(Into::into),
            k_perm: k_perm.map(Into::into),
            layouts: Default::default(),
            tiled_scales: OnceLock::new(),
            tiled_zeros: OnceLock::new(),
            tiled_mirror_zeros: OnceLock::new(),
            used_codes: OnceLock::new(),
            dense: OnceLock::new(),
            dense2: OnceLock::new(),
            dense_choice: Default::default(),
        })
    }

    pub fn codebook(&self) -> &Codebook {
        &self.codebook
    }
    /// Output features M.
    pub fn m(&self) -> usize {
        self.m
    }
    /// Input features K.
    pub fn k(&self) -> usize {
        self.k
    }
    pub fn group_size(&self) -> usize {
        self.group_size
    }
    /// Groups per row, `K / G`.
    pub fn groups(&self) -> usize {
        self.k / self.group_size
    }
    /// Canonical packed bytes `(M, row_bytes)`.
    pub fn packed(&self) -> &[u8] {
        &self.packed
    }
    /// Bytes per packed row.
    pub fn row_bytes(&self) -> usize {
        self.codebook.packing().row_bytes(self.k)
    }
    /// Scales `(M, K/G)` row-major.
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }
    /// Zero points `(M, K/G)` in value units.
    pub fn zeros(&self) -> Option<&[f32]> {
        self.zeros.as_deref()
    }
    /// Act-order permutation: packed column `j` is original column `k_perm[j]`.
    pub fn k_perm(&self) -> Option<&[u32]> {
        self.k_perm.as_deref()
    }

    /// Bytes of the canonical representation (packed codes + scales + zero points).
    pub fn nbytes(&self) -> usize {
        self.packed.len() + 4 * self.scales.len() + self.zeros.as_ref().map_or(0, |z| 4 * z.len())
    }

    /// Bytes held by the caches built on first use (the kernels' tile layouts of the depths
    /// used, tiled scales and zero points), on top of [`PackedWeights::nbytes`]. A clone has
    /// none and shares the packed data: `clone()` is how a caller releases them.
    pub fn cache_bytes(&self) -> usize {
        let layout = |l: &TileLayout| match &l.data {
            IndexData::U8(d) => d.capacity_bytes(),
            IndexData::U16(d) => d.capacity_bytes(),
        };
        let layouts: usize = self
            .layouts
            .iter()
            .flat_map(|set| set.iter())
            .filter_map(|c| c.get().map(layout))
            .sum();
        let floats = self
            .tiled_scales
            .get()
            .map_or(0, FloatTiles::capacity_bytes)
            + self
                .tiled_mirror_zeros
                .get()
                .map_or(0, FloatTiles::capacity_bytes)
            + self
                .tiled_zeros
                .get()
                .and_then(|z| z.as_ref().map(|v| v.capacity_bytes()))
                .unwrap_or(0);
        let used = self.used_codes.get().map_or(0, |u| u.capacity());
        let dense = [&self.dense, &self.dense2]
            .iter()
            .map(|d| d.get().map_or(0, |d| d.data.capacity_bytes()))
            .sum::<usize>();
        layouts + floats + used + dense
    }

    /// Unpacked codes `(M, K)` row-major, in packed column order (fails only when they do not
    /// fit in memory).
    pub fn codes(&self) -> Result<Vec<u8>> {
        let (k, rb) = (self.k, self.row_bytes());
        let mut out = maleki_common::alloc::zeroed_vec::<u8>(self.m * k, "the unpacked codes")?;
        out.par_chunks_mut(k)
            .zip(self.packed.par_chunks(rb))
            .for_each(|(row, bytes)| self.codebook.packing().unpack_row(bytes, row));
        Ok(out)
    }

    /// The dequantized matrix `(M, K)` in float64, in the original column order:
    /// `s * (v[q] - z)` evaluated in float64.
    pub fn dequantize(&self) -> Vec<f64> {
        let mut out = vec![0f64; self.m * self.k];
        self.dequantize_into(&mut out);
        out
    }

    /// [`PackedWeights::dequantize`] into `out` (`M * K` values, every one written).
    pub fn dequantize_into(&self, out: &mut [f64]) {
        self.dequantize_with(out, |v| v)
    }

    /// [`PackedWeights::dequantize_f32`] into `out` (`M * K` values, every one written).
    pub fn dequantize_f32_into(&self, out: &mut [f32]) {
        self.dequantize_with(out, |v| v as f32)
    }

    /// The dequantized matrix `(M, K)` in float32, in the original column order: the float64
    /// value `s * (v[q] - z)` rounded once to float32 (the same numbers as
    /// `dequantize()` cast to float32, at half the memory traffic).
    pub fn dequantize_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.m * self.k];
        self.dequantize_f32_into(&mut out);
        out
    }

    /// Row-parallel dequantization: per (row, group), the `V` values `s * (v[c] - z)` are
    /// computed once in float64 and converted with `conv`, then every code is a table look-up
    /// (a per-element evaluation when the group is shorter than the codebook, as for fp8).
    fn dequantize_with<T: Copy + Default + Send + Sync>(
        &self,
        out: &mut [T],
        conv: impl Fn(f64) -> T + Sync,
    ) {
        let (k, g, groups, rb) = (self.k, self.group_size, self.groups(), self.row_bytes());
        assert_eq!(
            out.len(),
            self.m * k,
            "dequantize: output of the wrong size"
        );
        let vals: Vec<f64> = self
            .codebook
            .values()
            .iter()
            .map(|&v| f64::from(v))
            .collect();
        let levels = vals.len();
        let nibbles = self.codebook.packing() == crate::format::Packing::Nibble
            && self.k_perm.is_none()
            && g.is_multiple_of(2)
            && levels <= 16;
        out.par_chunks_mut(k).enumerate().for_each_init(
            || (vec![0u8; k], vec![T::default(); levels]),
            |(codes, tab), (row, o)| {
                let bytes = &self.packed[row * rb..(row + 1) * rb];
                if nibbles {
                    // 4-bit codes straight from the packed bytes (low nibble first) through a
                    // 16-entry table per group.
                    let mut t16 = [T::default(); 16];
                    for (gi, (og, bg)) in o
                        .chunks_exact_mut(g)
                        .zip(bytes.chunks_exact(g / 2))
                        .enumerate()
                    {
                        let s = f64::from(self.scales[row * groups + gi]);
                        let z = self
                            .zeros
                            .as_ref()
                            .map_or(0.0, |z| f64::from(z[row * groups + gi]));
                        for (t, &v) in t16.iter_mut().zip(&vals) {
                            *t = conv(s * (v - z));
                        }
                        for (pair, &b) in og.chunks_exact_mut(2).zip(bg) {
                            pair[0] = t16[usize::from(b & 15)];
                            pair[1] = t16[usize::from(b >> 4)];
                        }
                    }
                    return;
                }
                self.codebook.packing().unpack_row(bytes, codes);
                for (gi, cg) in codes.chunks_exact(g).enumerate() {
                    let s = f64::from(self.scales[row * groups + gi]);
                    let z = self
                        .zeros
                        .as_ref()
                        .map_or(0.0, |z| f64::from(z[row * groups + gi]));
                    let value = |c: u8| conv(s * (vals[c as usize] - z));
                    let j0 = gi * g;
                    match (&self.k_perm, levels <= g) {
                        (None, true) => {
                            for (t, &v) in tab.iter_mut().zip(&vals) {
                                *t = conv(s * (v - z));
                            }
                            for (d, &c) in o[j0..j0 + g].iter_mut().zip(cg) {
                                *d = tab[c as usize];
                            }
                        }
                        (None, false) => {
                            for (d, &c) in o[j0..j0 + g].iter_mut().zip(cg) {
                                *d = value(c);
                            }
                        }
                        (Some(p), _) => {
                            for (j, &c) in cg.iter().enumerate() {
                                o[p[j0 + j] as usize] = value(c);
                            }
                        }
                    }
                }
            },
        );
    }

    /// A fresh tile layout of `depth`, indices from codes or (given) their labels.
    fn build_layout(&self, depth: usize, labels: Option<&[u8]>) -> Result<TileLayout> {
        // The stored bytes are the indices of the natural depth when a byte holds its codes
        // in base V (not for int3, whose 6-bit indices straddle bytes, nor for codebooks of
        // fewer levels than their packing holds): the packed rows transposed, no code unpacked.
        let levels = self.codebook.levels();
        let base_v = match self.codebook.packing() {
            Packing::Nibble => levels == 16,
            Packing::Crumb => levels == 4,
            Packing::Trit5 => levels == 3,
            Packing::Byte => true,
            Packing::Int3 => false,
        };
        let byte_indices =
            base_v && depth == self.natural_depth() && self.group_size.is_multiple_of(depth);
        if byte_indices && labels.is_none() {
            return TileLayout::from_packed_bytes(
                &self.packed,
                self.row_bytes(),
                self.m,
                self.k,
                self.group_size,
                depth,
            );
        }
        TileLayout::build(
            &self.codes()?,
            self.m,
            self.k,
            self.group_size,
            self.codebook.levels(),
            depth,
            labels,
        )
    }

    /// The tile layout for `depth` (built on first use, then cached).
    pub fn layout(&self, depth: usize) -> Result<&TileLayout> {
        self.codebook.check_depth(depth)?;
        try_fill(&self.layouts[LayoutVariant::Plain as usize][depth], || {
            self.build_layout(depth, None)
        })
    }

    /// The tile layout a kernel reads for `plan` (built on first use, then cached), in the
    /// form the kernel asks for ([`crate::kernels::LutKernel::layout_kind`]): plain, mirror-folded
    /// ([`TileLayout::fold`]) or paired ([`TileLayout::pair`]), its indices formed from labels
    /// for plans with [`Plan::labels`].
    pub fn layout_for(&self, plan: &Plan, kind: LayoutKind) -> Result<&TileLayout> {
        let depth = plan.depth();
        let labels = plan.labels.as_deref();
        if kind == LayoutKind::Plain && labels.is_none() {
            return self.layout(depth);
        }
        self.codebook.check_depth(depth)?;
        let cell = &self.layouts[LayoutVariant::of(kind, labels.is_some()) as usize][depth];
        let lay = match kind {
            LayoutKind::Plain => try_fill(cell, || {
                let mut l = self.build_layout(depth, labels)?;
                l.labeled = true;
                Ok(l)
            })?,
            LayoutKind::Folded => {
                let mirror = plan
                    .mirror
                    .filter(|m| TileLayout::can_fold(plan.levels, depth, m))
                    .ok_or_else(|| {
                        Error::Unsupported(format!(
                            "no folded layout for {} at depth {depth}",
                            self.codebook.format().name()
                        ))
                    })?;
                try_fill(cell, || {
                    let mut l = self.build_layout(depth, labels)?.fold(&mirror);
                    l.labeled = labels.is_some();
                    Ok(l)
                })?
            }
            LayoutKind::Paired => {
                if !TileLayout::can_pair(plan.levels, depth) {
                    return Err(Error::Unsupported(format!(
                        "no paired layout for {} at depth {depth}",
                        self.codebook.format().name()
                    )));
                }
                try_fill(cell, || self.build_paired(depth, labels))?
            }
        };
        if lay.labeled != labels.is_some() {
            return Err(Error::Unsupported(
                "internal: a cached layout does not match the plan's labels".into(),
            ));
        }
        Ok(lay)
    }

    /// A fresh paired layout of `depth`: straight from the packed bytes where a byte holds two
    /// tuples' codes in base V (16-level formats at depth 1, int2 at depth 2), else by pairing
    /// the plain layout.
    fn build_paired(&self, depth: usize, labels: Option<&[u8]>) -> Result<TileLayout> {
        let levels = self.codebook.levels();
        let direct = labels.is_none()
            && levels.pow(depth as u32) == 16
            && 2 * depth == self.natural_depth()
            && matches!(self.codebook.packing(), Packing::Nibble | Packing::Crumb)
            && self.group_size.is_multiple_of(2 * depth);
        if direct {
            return TileLayout::paired_from_packed_bytes(
                &self.packed,
                self.row_bytes(),
                self.m,
                self.k,
                self.group_size,
                depth,
            );
        }
        let mut l = self.build_layout(depth, labels)?.pair()?;
        l.labeled = labels.is_some();
        Ok(l)
    }

    /// Whether [`used_codes`](Self::used_codes) (which [`crate::gemm::plan`] reads) is
    /// computed already.
    pub fn used_codes_ready(&self) -> bool {
        self.used_codes.get().is_some()
    }

    /// Whether everything a run of `plan` reads from these weights (the tile layout of
    /// [`layout_for`](Self::layout_for), tiled scales and zero points) is built already: then
    /// reading them does no work (their builds run on the pool, so a caller off the pool runs
    /// them there first).
    pub fn ready_for(&self, plan: &Plan, kind: LayoutKind) -> bool {
        let depth = plan.depth();
        if depth > MAX_DEPTH {
            return false;
        }
        let variant = LayoutVariant::of(kind, plan.labels.is_some());
        let layout = &self.layouts[variant as usize][depth];
        layout.get().is_some() && self.tiles_ready(plan)
    }

    /// [`ready_for`](Self::ready_for) for the dense `i16` path ([`crate::dense`]).
    pub fn dense_ready(&self, plan: &Plan, two_bit: bool) -> bool {
        let lay = if two_bit { &self.dense2 } else { &self.dense };
        lay.get().is_some() && self.tiles_ready(plan)
    }

    /// Whether the tiled scales and the zero points a run of `plan` reads are built.
    fn tiles_ready(&self, plan: &Plan) -> bool {
        let zeros = !plan.zero_term
            || if plan.shift == 0.0 {
                self.tiled_zeros.get().is_some()
            } else {
                self.zeros.is_none() || self.tiled_mirror_zeros.get().is_some()
            };
        self.tiled_scales.get().is_some() && zeros
    }

    /// Scales tiled `[g][row_block][64]`: as float16 bits when every scale is a float16
    /// value (the kernels then read half the bytes for the same results), float32 otherwise.
    pub fn tiled_scales(&self) -> Tiled<'_> {
        fill(&self.tiled_scales, || {
            FloatTiles::new(&self.scales, self.m, self.groups())
        })
        .view()
    }

    /// Whether every scale is a float16 value, so that the kernels read them as float16.
    pub fn scales_are_f16(&self) -> bool {
        match self.tiled_scales.get() {
            Some(t) => matches!(t, FloatTiles::F16(_)),
            None => self.scales.iter().all(|&s| exact_f16(s).is_some()),
        }
    }

    /// Zero points tiled `[g][row_block][64]` (value units of the plain codebook), as float16
    /// when every zero point is a float16 value (integer zero points are).
    pub fn tiled_zeros(&self) -> Option<Tiled<'_>> {
        fill(&self.tiled_zeros, || {
            self.zeros
                .as_ref()
                .map(|z| FloatTiles::new(z, self.m, self.groups()))
        })
        .as_ref()
        .map(FloatTiles::view)
    }

    /// Effective zero points of the shifted codebook `v - shift`: `z - shift`, tiled
    /// `[g][row_block][64]` (padding rows 0; float16 when every one is a float16 value);
    /// `None` without zero points (then every row's is `-shift`, which the kernels take as one
    /// number). The shift is always the codebook's mirror shift (mirrored tables, or centred
    /// `i8` tables), so one cached copy serves every call.
    pub fn tiled_mirror_zeros(&self, shift: f32) -> Option<Tiled<'_>> {
        debug_assert!(self.codebook.mirror().is_some_and(|m| m.shift == shift));
        let z = self.zeros.as_ref()?;
        let tiled = fill(&self.tiled_mirror_zeros, || {
            let eff: Vec<f32> = z.iter().map(|&z| z - shift).collect();
            FloatTiles::new(&eff, self.m, self.groups())
        });
        Some(tiled.view())
    }

    /// The code layout of the dense `i16` path ([`crate::dense`]; built on first use, then
    /// cached): 4 bits per code for codebooks of at most 16 levels, 8 for larger ones (int8,
    /// uint8); group sizes that are multiples of 8.
    pub fn dense_layout(&self) -> Result<&DenseLayout> {
        self.dense_layout_at(if self.codebook.levels() > 16 { 8 } else { 4 })
    }

    /// The 2-bit code layout of the dense `i16` path's GEMVs of 2-bit codes
    /// ([`dense::two_bit`]; built on first use, then cached): codebooks of at most 4 levels,
    /// group sizes that are multiples of 16.
    pub fn dense_layout2(&self) -> Result<&DenseLayout> {
        self.dense_layout_at(2)
    }

    /// The dense layout of `bits` (4, 2 or 8) bits per code: codebooks of at most `2^bits`
    /// levels, group sizes that are multiples of the inputs of a word, and of [`dense::CHUNK`].
    /// The 4- and 8-bit layouts share one cache: a codebook has one of them.
    fn dense_layout_at(&self, bits: u32) -> Result<&DenseLayout> {
        let (cell, word_inputs) = if bits == 2 {
            (&self.dense2, 16)
        } else {
            (&self.dense, dense::CHUNK)
        };
        if self.codebook.levels() > 1 << bits || !self.group_size.is_multiple_of(word_inputs) {
            return Err(Error::Unsupported(format!(
                "no {bits}-bit dense layout for {} with group size {}",
                self.codebook.format().name(),
                self.group_size
            )));
        }
        try_fill(cell, || {
            DenseLayout::build(&self.codes()?, self.m, self.k, self.group_size, bits)
        })
    }

    /// The cached decision of [`crate::gemm::auto_precision`] for GEMVs (`gemv`) or batches
    /// on `backend` with `mirror`, made by `decide` on first use.
    pub(crate) fn dense_choice(
        &self,
        backend: Backend,
        mirror: bool,
        gemv: bool,
        decide: impl FnOnce() -> bool,
    ) -> bool {
        let slot = 4 * backend as usize + 2 * usize::from(mirror) + usize::from(gemv);
        *self.dense_choice[slot].get_or_init(decide)
    }

    /// Which codes occur in the weights (`levels()` flags; built on first use, then cached).
    /// The `i8` tables are scaled to the values that can be looked up (e.g. symmetric int4
    /// weights never use code 0 = -8).
    pub fn used_codes(&self) -> &[bool] {
        let used: &Vec<bool> = fill(&self.used_codes, || {
            let (k, rb) = (self.k, self.row_bytes());
            let packing = self.codebook.packing();
            let seen = self
                .packed
                .par_chunks(rb)
                .fold(
                    || (vec![0u8; k], [false; 256]),
                    |(mut codes, mut seen), bytes| {
                        packing.unpack_row(bytes, &mut codes);
                        for &c in &codes {
                            seen[c as usize] = true;
                        }
                        (codes, seen)
                    },
                )
                .map(|(_, seen)| seen)
                .reduce(
                    || [false; 256],
                    |mut a, b| {
                        for (x, y) in a.iter_mut().zip(b) {
                            *x |= y;
                        }
                        a
                    },
                );
            seen[..self.codebook.levels()].to_vec()
        });
        used
    }

    /// The codebook's natural depth (the one whose index is the stored byte).
    pub fn natural_depth(&self) -> usize {
        self.codebook.natural_depth()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Format;

    #[test]
    fn layouts_from_packed_bytes_equal_the_general_build() {
        // Natural-depth layouts are transposed packed bytes where the bytes are indices; the
        // general build from unpacked codes is the oracle, for every format (those whose bytes
        // are not indices take the general path: int3, a 5-value codebook in nibbles), odd M
        // and group sizes that are and are not multiples of the depth.
        let mut books: Vec<Codebook> = Format::ALL
            .into_iter()
            .filter(|&f| f != Format::Codebook)
            .map(|f| Codebook::new(f).unwrap())
            .collect();
        books.push(Codebook::custom(&[-1.0, -0.3, 0.0, 0.4, 1.2]).unwrap());
        books.push(
            Codebook::custom(&(0..16).map(|i| i as f32 * 0.5 - 4.0).collect::<Vec<_>>()).unwrap(),
        );
        let mut fast = 0;
        for cb in books {
            let levels = cb.levels();
            let d = cb.natural_depth();
            for (m, g, groups) in [(1, 40, 2), (65, 40, 3), (130, 64, 2), (63, 30, 2)] {
                let k = g * groups;
                // (fp8's NaN and infinity codes are not weights.)
                let codes: Vec<u8> = (0..m * k)
                    .map(|i| ((i * 7 + i / k) % levels) as u8)
                    .map(|c| if cb.valid_code(c) { c } else { 0 })
                    .collect();
                let scales = vec![1.0f32; m * groups];
                let pw = PackedWeights::from_codes(cb.clone(), m, k, g, &codes, scales, None, None)
                    .unwrap();
                let want = TileLayout::build(&codes, m, k, g, levels, d, None).unwrap();
                assert_eq!(pw.layout(d).unwrap(), &want, "{:?} m{m} g{g}", cb.format());
                fast += usize::from(g % d == 0 && cb.packing() != Packing::Int3);
            }
        }
        assert!(fast > 20, "{fast}");
    }

    #[test]
    fn cache_bytes_count_what_a_call_builds_and_a_clone_drops() {
        let (m, k) = (100, 256);
        let w: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let qo = crate::QuantizeOptions {
            group_size: Some(128),
            ..crate::QuantizeOptions::new(Format::Int4)
        };
        let pw = crate::quantize(&w, m, k, &qo).unwrap();
        assert_eq!(pw.cache_bytes(), 0);
        let x: Vec<f32> = (0..k).map(|i| (i % 13) as f32 - 6.0).collect();
        let y = crate::gemm(&pw, &x, 1, &crate::GemmOptions::default()).unwrap();
        // The int4 depth-2 byte layout (rows padded to 64, one byte per pair of inputs) and the
        // tiled scales (one float per padded row and group), at least.
        let rows = m.div_ceil(64) * 64;
        assert!(
            pw.cache_bytes() >= rows * k / 2 + rows * 2 * 4,
            "{}",
            pw.cache_bytes()
        );
        let fresh = pw.clone();
        assert_eq!(fresh.cache_bytes(), 0);
        assert_eq!(
            crate::gemm(&fresh, &x, 1, &crate::GemmOptions::default()).unwrap(),
            y
        );
    }

    #[test]
    fn dequantize_applies_scale_zero_and_permutation() {
        let cb = Codebook::new(Format::Uint4).unwrap();
        let codes = vec![1u8, 2, 3, 4, 5, 6, 7, 8];
        let pw = PackedWeights::from_codes(
            cb,
            2,
            4,
            2,
            &codes,
            vec![1.0, 2.0, 0.5, 4.0],
            Some(vec![1.0, 0.0, 2.0, 8.0]),
            Some(vec![3, 2, 1, 0]),
        )
        .unwrap();
        let w = pw.dequantize();
        // row 0: packed columns (1-1)*1, (2-1)*1, (3-0)*2, (4-0)*2 -> original columns 3,2,1,0
        assert_eq!(&w[..4], &[8.0, 6.0, 1.0, 0.0]);
        assert_eq!(&w[4..], &[0.0, -4.0, 2.0, 1.5]);
        let w32 = pw.dequantize_f32();
        assert!(w.iter().zip(&w32).all(|(&a, &b)| a as f32 == b));
        assert_eq!(pw.codes().unwrap(), codes);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let cb = || Codebook::new(Format::Int4).unwrap();
        assert!(PackedWeights::from_codes(cb(), 1, 4, 3, &[0; 4], vec![1.0], None, None).is_err());
        assert!(
            PackedWeights::from_codes(cb(), 1, 4, 4, &[16, 0, 0, 0], vec![1.0], None, None)
                .is_err()
        );
        assert!(
            PackedWeights::from_codes(cb(), 1, 4, 4, &[0; 4], vec![f32::NAN], None, None).is_err()
        );
        assert!(PackedWeights::from_codes(
            cb(),
            1,
            4,
            4,
            &[0; 4],
            vec![1.0],
            None,
            Some(vec![0, 0, 1, 2])
        )
        .is_err());
        let e4 = Codebook::new(Format::Fp8E4m3).unwrap();
        assert!(PackedWeights::from_codes(e4, 1, 2, 2, &[0x7f, 0], vec![1.0], None, None).is_err());
        let t = Codebook::new(Format::Ternary).unwrap();
        assert!(PackedWeights::from_packed(t, 1, 5, 5, vec![250], vec![1.0], None, None).is_err());
    }
}
