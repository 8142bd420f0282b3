//! Phase 1: look-up tables of activation sums (spec sections 2 and 4).
//!
//! For column `n` and tuple `p` of depth `r` the table holds
//! `T[c_0 + c_1 V + ...] = sum_j v'[c_j] * x[p*d + j, n]`, with `v' = v - shift` the codebook
//! the plan builds from. It is built incrementally: the `r*V` products `v'[c]*x`, then level by
//! level, entry `i + c V^(j)` of level `j+1` = entry `i` of level `j` + product `(j, c)`
//! (level `j+1` costs `V^(j+1)` adds; with mirror the last level builds only its stored prefix).
//! Every table precision starts from this build; the order of operations is part of the
//! contract every backend follows (see `KERNELS.md`).

use std::ops::Range;

use rayon::prelude::*;

use crate::aligned::AlignedVec;
use crate::plan::{Plan, TablePrecision};

/// Table entries, laid out `[g - g0][n - n0][tuple][slot]`.
#[derive(Debug, Clone, PartialEq)]
pub enum TableData {
    F32(AlignedVec<f32>),
    I16(AlignedVec<i16>),
    I8(AlignedVec<i8>),
}

/// The tables of a range of groups and a range of columns of X.
///
/// For each `(g, n)`: `tscale[g][n]` converts table units to values (1 for `f32`,
/// `a * 2^-int_exp` for `i16`, the int8 table scale `t` for `i8`) and `zsum[g][n]` is the sum
/// of the group's activations in table units (only filled when `plan.zero_term`, else 0).
#[derive(Debug, Clone, PartialEq)]
pub struct TableSet {
    pub precision: TablePrecision,
    /// Groups covered (absolute indices).
    pub groups: Range<usize>,
    /// Columns of X covered (absolute indices).
    pub cols: Range<usize>,
    /// Tuples per group.
    pub per_group: usize,
    /// Entries per tuple slot (`plan.slot`).
    pub slot: usize,
    pub data: TableData,
    /// `[g - g0][n - n0]`.
    pub tscale: Vec<f32>,
    /// `[g - g0][n - n0]`.
    pub zsum: Vec<f32>,
    /// `i8` tables: the integer multiplier of every tuple, `[g - g0][n - n0][tuple]`
    /// (see [`i8_scaling`]); empty for the other precisions.
    pub mult: Vec<u8>,
    /// The table geometry of the plan the set was last made for ([`TableSet::reuse`]).
    geometry: [usize; 7],
}

/// `len` zero entries of `precision`.
fn zeroed_data(precision: TablePrecision, len: usize) -> TableData {
    match precision {
        TablePrecision::F32 => TableData::F32(AlignedVec::zeroed(len)),
        TablePrecision::I16 => TableData::I16(AlignedVec::zeroed(len)),
        TablePrecision::I8 => TableData::I8(AlignedVec::zeroed(len)),
    }
}

/// What decides which entries a build writes: precision, slot, tuples per group, depths
/// and the entries stored per depth.
fn geometry(plan: &Plan) -> [usize; 7] {
    let tp = plan.tuples;
    [
        plan.precision as usize,
        plan.slot,
        tp.per_group,
        tp.depth,
        tp.last_depth,
        plan.used_entries(tp.depth),
        plan.used_entries(tp.last_depth),
    ]
}

impl TableSet {
    /// A zeroed table set for `groups x cols` of `plan`.
    pub fn zeroed(plan: &Plan, groups: Range<usize>, cols: Range<usize>) -> TableSet {
        let ng = groups.len();
        let nc = cols.len();
        let len = ng * nc * plan.tuples.per_group * plan.slot;
        let data = zeroed_data(plan.precision, len);
        TableSet {
            precision: plan.precision,
            groups,
            cols,
            per_group: plan.tuples.per_group,
            slot: plan.slot,
            data,
            tscale: vec![0.0; ng * nc],
            zsum: vec![0.0; ng * nc],
            mult: if plan.precision == TablePrecision::I8 {
                vec![1; ng * nc * plan.tuples.per_group]
            } else {
                Vec::new()
            },
            geometry: geometry(plan),
        }
    }

    /// Re-targets the set to `groups x cols` of `plan`, keeping its allocation.
    ///
    /// When the set was last made for a plan of the same table geometry (precision, slot,
    /// tuples and their depths), its entries are not cleared: every build writes each entry
    /// a lookup can reach (the same entries in every block of such a plan), and entries no
    /// index reaches never affect a result. Otherwise the entries are zeroed as in
    /// [`TableSet::zeroed`]. `tscale`, `zsum` and `mult` are always reset. Passes over large
    /// `N` (and successive calls, see `gemm`) reuse sets this way instead of zeroing fresh
    /// memory each time (a fresh set cost as much as the build itself, and the zeroing
    /// thread's cache lines then moved to the building threads).
    pub fn reuse(&mut self, plan: &Plan, groups: Range<usize>, cols: Range<usize>) {
        let blocks = groups.len() * cols.len();
        let len = blocks * plan.tuples.per_group * plan.slot;
        // Kept entries (same geometry) or zeros, `len` of them, in the same allocation.
        fn refit<T: bytemuck::Pod>(v: &mut AlignedVec<T>, len: usize, keep: bool) {
            if !keep {
                v.clear();
            }
            v.resize_zeroed(len);
        }
        let same = self.geometry == geometry(plan);
        match (&mut self.data, plan.precision) {
            (TableData::F32(v), TablePrecision::F32) => refit(v, len, same),
            (TableData::I16(v), TablePrecision::I16) => refit(v, len, same),
            (TableData::I8(v), TablePrecision::I8) => refit(v, len, same),
            (data, precision) => *data = zeroed_data(precision, len),
        }
        self.precision = plan.precision;
        self.per_group = plan.tuples.per_group;
        self.slot = plan.slot;
        self.geometry = geometry(plan);
        self.tscale.clear();
        self.tscale.resize(blocks, 0.0);
        self.zsum.clear();
        self.zsum.resize(blocks, 0.0);
        self.mult.clear();
        if self.precision == TablePrecision::I8 {
            self.mult.resize(blocks * plan.tuples.per_group, 1);
        }
        self.groups = groups;
        self.cols = cols;
    }

    /// Bytes held by the set's vectors (capacity, not length).
    pub fn capacity_bytes(&self) -> usize {
        let data = match &self.data {
            TableData::F32(v) => v.capacity_bytes(),
            TableData::I16(v) => v.capacity_bytes(),
            TableData::I8(v) => v.capacity_bytes(),
        };
        data + 4 * (self.tscale.capacity() + self.zsum.capacity()) + self.mult.capacity()
    }

    /// Entries of one `(group, column)` block: `per_group * slot`.
    #[inline]
    pub fn block_len(&self) -> usize {
        self.per_group * self.slot
    }

    /// Offset of the table of `(g, n, t)` (absolute g and n) in `data`.
    #[inline]
    pub fn offset(&self, g: usize, n: usize, t: usize) -> usize {
        let gi = g - self.groups.start;
        let ni = n - self.cols.start;
        ((gi * self.cols.len() + ni) * self.per_group + t) * self.slot
    }

    /// Index of `(g, n)` (absolute) in `tscale` / `zsum`.
    #[inline]
    pub fn gn(&self, g: usize, n: usize) -> usize {
        (g - self.groups.start) * self.cols.len() + (n - self.cols.start)
    }

    /// The `i8` multipliers of the tuples of `(g, n)` (absolute).
    #[inline]
    pub fn mults(&self, g: usize, n: usize) -> &[u8] {
        let o = self.gn(g, n) * self.per_group;
        &self.mult[o..o + self.per_group]
    }

    /// Bytes of table entries.
    pub fn nbytes(&self) -> usize {
        match &self.data {
            TableData::F32(v) => 4 * v.len(),
            TableData::I16(v) => 2 * v.len(),
            TableData::I8(v) => v.len(),
        }
    }
}

/// Bytes of the table entries of one `(group, column)` block.
pub fn block_bytes(plan: &Plan) -> usize {
    let elem = match plan.precision {
        TablePrecision::F32 => 4,
        TablePrecision::I16 => 2,
        TablePrecision::I8 => 1,
    };
    plan.tuples.per_group * plan.slot * elem
}

/// Builds one f32 table of depth `r` into `out` (at least `plan.used_entries(r)` long) from the
/// `r` activations `xs` and the products scratch (`r * V` long). Returns nothing; the order of
/// operations is the contract: products `v'[c] * x_j`, then level by level, and within a
/// level the entries with digit `c >= 1` first, then `c = 0` in place.
#[inline]
pub fn build_f32_table(plan: &Plan, xs: &[f32], prod: &mut [f32], out: &mut [f32]) {
    let v = plan.levels;
    let r = xs.len();
    for (j, &x) in xs.iter().enumerate() {
        for c in 0..v {
            prod[j * v + c] = plan.table_values[c] * x;
        }
    }
    let used = plan.used_entries(r);
    expand_levels(prod, out, v, r, used);
}

/// The level-by-level expansion shared by the float and integer builds: `out[..V]` gets the
/// products of digit 0, then entry `i + c V^j` of level `j + 1` = entry `i` of level `j` +
/// product `(j, c)`, up to `used` entries at the last level. `prod` is `r * V` long.
#[inline(always)]
fn expand_levels<T>(prod: &[T], out: &mut [T], v: usize, r: usize, used: usize)
where
    T: Copy + std::ops::Add<Output = T> + std::ops::AddAssign,
{
    let n1 = v.min(used);
    out[..n1].copy_from_slice(&prod[..n1]);
    let mut p = v; // entries of the previous level
    for j in 1..r {
        let lim = if j + 1 == r { used } else { p * v };
        let pj = &prod[j * v..(j + 1) * v];
        for (c, &add) in pj.iter().enumerate().skip(1) {
            let lo = c * p;
            if lo >= lim {
                break;
            }
            let hi = (lo + p).min(lim);
            let (src, dst) = out.split_at_mut(lo);
            for (o, &s) in dst[..hi - lo].iter_mut().zip(src[..hi - lo].iter()) {
                *o = s + add;
            }
        }
        let add = pj[0];
        for o in &mut out[..p.min(lim)] {
            *o += add;
        }
        p *= v;
    }
}

/// The integer counterpart of [`build_f32_table`] (`i16` mode): same order, exact in i32.
#[inline]
pub fn build_int_table(plan: &Plan, xq: &[i32], prod: &mut [i32], out: &mut [i32]) {
    let ints = plan
        .int_values
        .as_deref()
        .expect("i16 plan has integer values");
    let v = plan.levels;
    let r = xq.len();
    for (j, &x) in xq.iter().enumerate() {
        for c in 0..v {
            prod[j * v + c] = ints[c] * x;
        }
    }
    let used = plan.used_entries(r);
    expand_levels(prod, out, v, r, used);
}

/// `round_ties_even(x)` for `|x| <= 2^22`, by the add-and-subtract of `1.5 * 2^23` (exact in
/// the default round-to-nearest-even mode). Baseline x86-64 has no `roundss`, so
/// `f32::round_ties_even` would be a library call per entry; this is two adds, and it is the
/// same value `cvtps2dq` gives in SIMD builds.
#[inline(always)]
pub fn round_small(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23

    // NaN passes through (0 * inf entries when 127 / maxabs overflows; they become 0 as i8).
    debug_assert!(x.is_nan() || x.abs() <= 4_194_304.0);
    (x + MAGIC) - MAGIC
}

/// Symmetric int8 quantization of one group of activations (`i16` mode):
/// `maxabs = max|x|`, `rcp = 127 / maxabs`, `xq = clamp(round_ties_even(x * rcp), -127, 127)`,
/// `a = maxabs / 127` (all float32; `maxabs = 0` gives `a = 0`, `xq = 0`). Returns `a`.
pub fn quantize_activations(xs: &[f32], xq: &mut [i32]) -> f32 {
    // The largest magnitude, in 16 lanes (a fold through one register is a chain of
    // dependent `max`es; `max` is exact and ignores NaN, so any order gives the same value).
    let mut lanes = [0f32; 16];
    let mut blocks = xs.chunks_exact(16);
    for b in &mut blocks {
        for (m, &x) in lanes.iter_mut().zip(b) {
            *m = m.max(x.abs());
        }
    }
    let maxabs = blocks
        .remainder()
        .iter()
        .chain(&lanes)
        .fold(0f32, |m, &x| m.max(x.abs()));
    if maxabs == 0.0 {
        xq.fill(0);
        return 0.0;
    }
    let rcp = 127.0f32 / maxabs;
    for (q, &x) in xq.iter_mut().zip(xs) {
        let v = round_small((x * rcp).clamp(-127.5, 127.5)).clamp(-127.0, 127.0);
        // What `v as i32` gives (NaN: 0), in a form that vectorizes (no saturation checks).
        // SAFETY: a value that is not NaN lies in [-127, 127].
        *q = if v.is_nan() {
            0
        } else {
            unsafe { v.to_int_unchecked::<i32>() }
        };
    }
    maxabs / 127.0
}

/// `(tscale, zsum)` of an `i8` block whose entries that can be looked up are all 0 (the
/// codes used have the value 0, or the group's activations are all 0): `tscale` 1 and the
/// plain sum of the activations, so that the epilogue still subtracts the zero term `z sum x`
/// (a `tscale` of 0 dropped it: fp8 weights with zero points whose codes were all 0 gave 0).
pub fn all_zero_block(plan: &Plan, xg: &[f32]) -> (f32, f32) {
    (1.0, if plan.zero_term { group_sum(xg) } else { 0.0 })
}

/// The sum of a group's activations for the zero-point term (`S[n, g]`): accumulated in float64
/// on 8 lanes (input `i` on lane `i % 8`), the lanes added pairwise in a fixed order, rounded
/// once to float32 (`G - 1` additions, as any sum of `G` terms). Within about one float32
/// rounding of the exact sum for any group a plan allows (float64 holds `G 2^-53` of drift).
/// Until stop 41 it was a float32 running sum `((x0 + x1) + x2) + ...`, which drifts by up to
/// `G 2^-24 sum |x|`: a uint4 per-channel GEMV of K = 2^20 (x all 0.8) came out 8.9e-3 off in
/// `i8` mode, past that mode's documented bound (found by helper-51).
pub fn group_sum(xs: &[f32]) -> f32 {
    let mut lanes = [0f64; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l += f64::from(x);
        }
    }
    for (l, &x) in lanes.iter_mut().zip(chunks.remainder()) {
        *l += f64::from(x);
    }
    let [a, b, c, d, e, f, g, h] = lanes;
    (((a + b) + (c + d)) + ((e + f) + (g + h))) as f32
}

/// Tuples of a group whose int8 entries the kernels may sum in int16 before widening: the
/// multipliers of every chunk of `I8_CHUNK` consecutive tuples (from the start of the group)
/// add up to at most [`I8_BUDGET`], so `|sum m_p e_p| <= 127 * 258 < 2^15`.
pub const I8_CHUNK: usize = 64;
/// `floor(i16::MAX / 127)`.
pub const I8_BUDGET: u32 = 258;
/// Largest multiplier: a pair `127 (m_a + m_b)` must stay within `i16::MAX` (`vpmaddubsw`).
pub const I8_MULT_MAX: u32 = 127;

/// Smallest integer `m >= 1` with `127 m >= v` (exact for `0 <= v <= 2^17`): the ceiling of
/// an approximate quotient, corrected by one either way (its error is far below one).
#[inline(always)]
fn ceil_127(v: f32) -> u32 {
    // ceil without `ceilf` (a library call on baseline x86-64): round to nearest, then up
    // by one if that went down.
    let d = v * (1.0 / 127.0);
    let r = round_small(d);
    let mut m = (r + f32::from(u8::from(r < d))).max(1.0);
    // branch-free corrections (the loops below vectorize); 127 m is exact
    m -= f32::from(u8::from(m > 1.0 && 127.0 * (m - 1.0) >= v));
    m += f32::from(u8::from(127.0 * m < v));
    m as u32
}

/// Where [`search_multiplier`] starts: the bound `m_p < q_p M / 127 + 1` makes
/// `floor((258 - n_c) 127 / s_c)` feasible for a chunk of `n_c` tuples whose `q_p` sum to
/// `s_c` (with a margin for the float arithmetic); the smallest over the chunks, in
/// `1..=I8_MULT_MAX`. `chunks` yields `(s_c, n_c)`; how `s_c` is summed does not matter (the
/// search corrects a start that is off).
pub(crate) fn start_multiplier(chunks: impl Iterator<Item = (f32, usize)>) -> u32 {
    chunks
        .map(|(sq, len)| {
            let room = (I8_BUDGET as usize).saturating_sub(len) as f32;
            if sq > 0.0 {
                (room * 127.0 / sq * (1.0 - 1.0 / 65536.0)).floor()
            } else {
                f32::INFINITY
            }
        })
        .fold(f32::INFINITY, f32::min)
        .clamp(1.0, I8_MULT_MAX as f32) as u32
}

/// The largest `M` in `1..=I8_MULT_MAX` with `feasible(M)` (1 when none is), for feasible
/// values that form a prefix: from `m0` (best [`start_multiplier`]) it steps up to the first
/// infeasible value, or down to a feasible one; any start gives the same answer.
#[inline]
pub(crate) fn search_multiplier(m0: u32, feasible: impl Fn(u32) -> bool) -> u32 {
    let mut mm = m0;
    if feasible(mm) {
        while mm < I8_MULT_MAX && feasible(mm + 1) {
            mm += 1;
        }
    } else {
        while mm > 1 && !feasible(mm) {
            mm -= 1;
        }
    }
    mm
}

/// The int8 scaling of one `(group, column)` block of tables (spec section 4, `KERNELS.md`).
///
/// `amax[p]` is `max |entry|` of tuple `p`'s f32 table, `A = max_p amax[p]`. Tuple `p` gets the
/// integer multiplier `m_p = max(1, ceil(q_p M / 127))`, `q_p = amax[p] * (127 / A)`, so its
/// entries are rounded on the grid `m_p * tscale` with `tscale = A / (127 M)`: close to a
/// table of its own (`amax[p] / 127`), while the kernels still add exact integers
/// `m_p e_p` (the multiplier is the `vpmaddubsw` operand that was 1). `M` is the largest value
/// in `1..=127` with `sum m_p <= 258` over every chunk of [`I8_CHUNK`] tuples (int16 partial
/// sums). The sums grow with `M`, so the feasible `M` are a prefix: the search starts at
/// `M0 = floor((258 - n) 127 / sum q)` (feasible since `m_p < q_p M / 127 + 1`) and walks to
/// the first infeasible value (a step or two in practice). Writes `mult[p] = m_p` and
/// `rm[p]`, the factor the entries of tuple `p` are multiplied by before rounding; returns
/// `tscale`.
///
/// `A = 0`: multipliers 1, `rm = 0`, `tscale = 0`. A non-finite `127 / A` (subnormal `A`):
/// `M = 1`, `rm = 127 / A` (the entries then saturate; the kernels still agree).
///
/// The AVX-512 build runs the same search with its per-tuple loops on 16 lanes
/// (`kernels::avx512`, compared with this function bit for bit by a test).
pub fn i8_scaling(amax: &[f32], mult: &mut [u8], rm: &mut [f32]) -> f32 {
    i8_scaling_by(amax, mult, rm, |q, mf, out| match out {
        None => q.iter().map(|&v| ceil_127(v * mf)).sum(),
        Some(out) => q.iter().zip(out).fold(0, |s, (&v, o)| {
            let m = ceil_127(v * mf);
            *o = m as f32;
            s + m
        }),
    })
}

/// [`i8_scaling`] with its per-tuple work done by `ceil_m` (the AVX2 and NEON builds run it
/// on their SIMD lanes): the same search for `M` and the same IEEE operations per tuple, so
/// the same multipliers, factors and scale (their tests compare them). `ceil_m(q, mf, out)`
/// returns `sum_i ceil_127(q[i] * mf)` over a slice of at most [`I8_CHUNK`] values, and when
/// `out` is given also writes each `ceil_127(q[i] * mf)` (as float) into it.
#[inline(always)]
pub(crate) fn i8_scaling_by(
    amax: &[f32],
    mult: &mut [u8],
    rm: &mut [f32],
    ceil_m: impl Fn(&[f32], f32, Option<&mut [f32]>) -> u32,
) -> f32 {
    let a = amax.iter().fold(0f32, |m, &x| m.max(x));
    if a == 0.0 {
        mult.fill(1);
        rm.fill(0.0);
        return 0.0;
    }
    let rcp = 127.0f32 / a;
    if !rcp.is_finite() {
        mult.fill(1);
        rm.fill(rcp);
        return a / 127.0;
    }
    // q_p = amax_p * rcp, in `rm` (scratch until the end).
    for (q, &x) in rm.iter_mut().zip(amax) {
        *q = x * rcp;
    }
    let q = &*rm;
    let feasible = |mm: u32| -> bool {
        let mf = mm as f32;
        (rcp * mf).is_finite() && q.chunks(I8_CHUNK).all(|c| ceil_m(c, mf, None) <= I8_BUDGET)
    };
    let m0 = start_multiplier(q.chunks(I8_CHUNK).map(|c| (c.iter().sum(), c.len())));
    let mm = search_multiplier(m0, feasible);
    let mf = mm as f32;
    let rcp_m = rcp * mf;
    let mut mp = [0f32; I8_CHUNK];
    for (ms, rs) in mult.chunks_mut(I8_CHUNK).zip(rm.chunks_mut(I8_CHUNK)) {
        let mp = &mut mp[..rs.len()];
        ceil_m(rs, mf, Some(mp));
        for ((m, r), &p) in ms.iter_mut().zip(rs.iter_mut()).zip(mp.iter()) {
            *m = p as u8;
            *r = rcp_m / p;
        }
    }
    a / (127.0 * mf)
}

/// Rounds one table to int8 with the factor `rm`: `clamp(round_ties_even(T * rm), -127, 127)`.
#[inline]
pub fn round_table_i8(table: &[f32], rm: f32, out: &mut [i8]) {
    for (q, &x) in out.iter_mut().zip(table) {
        *q = round_small((x * rm).clamp(-127.5, 127.5)).clamp(-127.0, 127.0) as i8;
    }
}

/// Builds the tables of one `(group g, column n)` block (scalar reference build).
///
/// `xg` are the group's G activations of column n (already permuted). Writes the block's
/// entries into `out` (`per_group * slot` long, pre-zeroed) and returns `(tscale, zsum)`.
pub fn build_block(plan: &Plan, xg: &[f32], out: BlockOut<'_>) -> (f32, f32) {
    let tp = plan.tuples;
    let v = plan.levels;
    let slot = plan.slot;
    match out {
        BlockOut::F32(out) => {
            let mut prod = vec![0f32; tp.depth * v];
            for t in 0..tp.per_group {
                let r = tp.depth_of(t);
                let k0 = t * tp.depth;
                build_f32_table(
                    plan,
                    &xg[k0..k0 + r],
                    &mut prod,
                    &mut out[t * slot..(t + 1) * slot],
                );
            }
            let zsum = if plan.zero_term { group_sum(xg) } else { 0.0 };
            (1.0, zsum)
        }
        BlockOut::I8(out, mult) => {
            let mut f = vec![0f32; tp.per_group * slot];
            let mut prod = vec![0f32; tp.depth * v];
            for t in 0..tp.per_group {
                let r = tp.depth_of(t);
                let k0 = t * tp.depth;
                build_f32_table(
                    plan,
                    &xg[k0..k0 + r],
                    &mut prod,
                    &mut f[t * slot..(t + 1) * slot],
                );
            }
            // max |entry| of each tuple over the entries that can be looked up (which entries
            // those are depends only on the tuple's depth: one mask per depth, not a digit
            // decomposition per entry and tuple)
            let used =
                |r: usize| -> Vec<bool> { (0..slot).map(|i| plan.stored_used(i, r)).collect() };
            let (full, last) = (used(tp.depth), used(tp.last_depth));
            let amax: Vec<f32> = f
                .chunks_exact(slot)
                .enumerate()
                .map(|(t, tab)| {
                    let mask = if tp.depth_of(t) == tp.depth {
                        &full
                    } else {
                        &last
                    };
                    tab.iter()
                        .zip(mask)
                        .filter(|&(_, &u)| u)
                        .fold(0f32, |m, (&x, _)| m.max(x.abs()))
                })
                .collect();
            let mut rm = vec![0f32; tp.per_group];
            let tsc = i8_scaling(&amax, mult, &mut rm);
            for ((o, tab), &r) in out
                .chunks_exact_mut(slot)
                .zip(f.chunks_exact(slot))
                .zip(&rm)
            {
                round_table_i8(tab, r, o);
            }
            // (Not `tsc == 0`: a subnormal `A` may give a `tscale` of 0 with saturated entries;
            // that block adds 0, its zero term included, which is as small as `A`.)
            if amax.iter().all(|&a| a == 0.0) {
                return all_zero_block(plan, xg);
            }
            let zsum = if plan.zero_term && tsc != 0.0 {
                group_sum(xg) / tsc
            } else {
                0.0
            };
            (tsc, zsum)
        }
        BlockOut::I16(out) => {
            let mut xq = vec![0i32; xg.len()];
            let a = quantize_activations(xg, &mut xq);
            let mut prod = vec![0i32; tp.depth * v];
            let mut tab = vec![0i32; slot];
            for t in 0..tp.per_group {
                let r = tp.depth_of(t);
                let k0 = t * tp.depth;
                tab.fill(0);
                build_int_table(plan, &xq[k0..k0 + r], &mut prod, &mut tab);
                for (o, &e) in out[t * slot..(t + 1) * slot].iter_mut().zip(&tab) {
                    *o = e as i16;
                }
            }
            let scale = 2f32.powi(plan.int_exp);
            let tsc = a / scale;
            let zsum = if plan.zero_term {
                xq.iter().sum::<i32>() as f32 * scale
            } else {
                0.0
            };
            (tsc, zsum)
        }
    }
}

/// The output block of [`build_block`].
pub enum BlockOut<'a> {
    F32(&'a mut [f32]),
    I16(&'a mut [i16]),
    /// Entries and the per-tuple multipliers.
    I8(&'a mut [i8], &'a mut [u8]),
}

/// `f(i, block, mults)` for the `(g, n)` blocks of a table set in order (`data` in blocks of
/// `blen`, with `mult` the multipliers in blocks of `mlen` for `i8` sets), collected: on the
/// current pool (`parallel`, at least `min_len` blocks per task) or on the calling thread
/// without rayon (a GEMV half run by the caller, see `gemm`). Blocks are independent, so the
/// result is the same either way.
pub(crate) fn map_blocks<T: Send, R: Send>(
    data: &mut [T],
    blen: usize,
    mult: Option<(&mut [u8], usize)>,
    parallel: bool,
    min_len: usize,
    f: impl Fn(usize, &mut [T], &mut [u8]) -> R + Sync + Send,
) -> Vec<R> {
    match (mult, parallel) {
        (None, true) => data
            .par_chunks_mut(blen)
            .with_min_len(min_len)
            .enumerate()
            .map(|(i, d)| f(i, d, &mut []))
            .collect(),
        (None, false) => data
            .chunks_mut(blen)
            .enumerate()
            .map(|(i, d)| f(i, d, &mut []))
            .collect(),
        (Some((m, mlen)), true) => data
            .par_chunks_mut(blen)
            .zip(m.par_chunks_mut(mlen))
            .with_min_len(min_len)
            .enumerate()
            .map(|(i, (d, m))| f(i, d, m))
            .collect(),
        (Some((m, mlen)), false) => data
            .chunks_mut(blen)
            .zip(m.chunks_mut(mlen))
            .enumerate()
            .map(|(i, (d, m))| f(i, d, m))
            .collect(),
    }
}

/// The activations of block `i` of `set` (blocks in `(group, column)` order): the group's `G`
/// values of column `n` of `xt` (X transposed and permuted, `(N, K)` row-major).
pub(crate) fn block_activations<'a>(
    plan: &Plan,
    set: &TableSet,
    xt: &'a [f32],
) -> impl Fn(usize) -> &'a [f32] + Sync + use<'a> {
    let (g_size, k) = (plan.group_size, plan.k);
    let (groups, cols) = (set.groups.clone(), set.cols.clone());
    let nc = cols.len();
    move |i: usize| {
        let (g, n) = (groups.start + i / nc, cols.start + i % nc);
        &xt[n * k + g * g_size..n * k + (g + 1) * g_size]
    }
}

impl TableSet {
    /// Stores the `(tscale, zsum)` of every block, in block order (what the builds return).
    pub(crate) fn set_meta(&mut self, meta: Vec<(f32, f32)>) {
        for (i, (tsc, zs)) in meta.into_iter().enumerate() {
            self.tscale[i] = tsc;
            self.zsum[i] = zs;
        }
    }
}

/// Builds the tables of `groups x cols` with the scalar build, over `(g, n)` blocks on the
/// current pool (`parallel`) or on the calling thread (each block is independent, so the
/// result does not depend on the thread count).
///
/// `xt` is X transposed and permuted: `(N, K)` row-major, row n = column n of X.
pub fn build_scalar(plan: &Plan, xt: &[f32], set: &mut TableSet, parallel: bool) {
    let blen = set.block_len();
    let xg = block_activations(plan, set, xt);
    let per_group = plan.tuples.per_group;
    let meta: Vec<(f32, f32)> = match &mut set.data {
        TableData::F32(d) => map_blocks(d, blen, None, parallel, 1, |i, out, _| {
            build_block(plan, xg(i), BlockOut::F32(out))
        }),
        TableData::I16(d) => map_blocks(d, blen, None, parallel, 1, |i, out, _| {
            build_block(plan, xg(i), BlockOut::I16(out))
        }),
        TableData::I8(d) => map_blocks(
            d,
            blen,
            Some((&mut set.mult, per_group)),
            parallel,
            1,
            |i, out, mult| build_block(plan, xg(i), BlockOut::I8(out, mult)),
        ),
    };
    set.set_meta(meta);
}

/// Compares an `i8_scaling` implementation with [`i8_scaling`] bit for bit over lengths
/// 1..=256 and six kinds of maxima (spread, nearly equal, a few large, subnormal, near the float
/// range, zeros among them); for the SIMD kernels' tests.
#[cfg(all(test, any(target_arch = "x86_64", target_arch = "aarch64")))] // the SIMD scalings
pub(crate) fn check_i8_scaling(seed: u64, f: impl Fn(&[f32], &mut [u8], &mut [f32]) -> f32) {
    use maleki_common::rng::{below, stream};
    let mut r = stream(seed, 0);
    let mut cases = 0;
    for len in (1..=256).step_by(7).chain([8, 16, 63, 64, 65, 128, 256]) {
        for kind in 0..6 {
            let amax: Vec<f32> = (0..len)
                .map(|_| {
                    let u = below(&mut r, 1 << 24) as f32 / (1u32 << 24) as f32;
                    match kind {
                        0 => u,                             // spread over [0, 1)
                        1 => 1.0 + 1e-3 * u,                // nearly equal: large sums
                        2 => u * u * u * u,                 // a few large, many tiny
                        3 => u * 1e-38,                     // subnormal maxima
                        4 => u * 3e38,                      // near the float range
                        _ => (below(&mut r, 3) as f32) * u, // zeros among them
                    }
                })
                .collect();
            let (mut m1, mut m2) = (vec![0u8; len], vec![0u8; len]);
            let (mut r1, mut r2) = (vec![0f32; len], vec![0f32; len]);
            let t1 = i8_scaling(&amax, &mut m1, &mut r1);
            let t2 = f(&amax, &mut m2, &mut r2);
            assert_eq!(t1.to_bits(), t2.to_bits(), "len {len} kind {kind}");
            assert_eq!(m1, m2, "len {len} kind {kind}");
            assert!(
                r1.iter().zip(&r2).all(|(a, b)| a.to_bits() == b.to_bits()),
                "len {len} kind {kind}"
            );
            cases += 1;
        }
    }
    assert!(cases > 200);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{Codebook, Format};

    fn plan(f: Format, d: usize, g: usize, prec: TablePrecision, mirror: bool) -> Plan {
        Plan::new(
            &Codebook::new(f).unwrap(),
            5,
            g,
            1,
            g,
            false,
            d,
            prec,
            mirror,
            None,
        )
        .unwrap()
    }

    #[test]
    fn tables_hold_the_tuple_sums() {
        for (f, d) in [
            (Format::Int4, 1),
            (Format::Int4, 2),
            (Format::Int4, 3),
            (Format::Int2, 4),
            (Format::Ternary, 5),
        ] {
            for mirror in [false, true] {
                let p = plan(f, d, 30, TablePrecision::F32, mirror);
                let v = p.levels;
                let xs: Vec<f32> = (0..d).map(|j| (j as f32) * 1.5 - 2.0).collect();
                let mut prod = vec![0.0; d * v];
                let mut out = vec![0.0; p.slot];
                build_f32_table(&p, &xs, &mut prod, &mut out);
                for (idx, &got) in out.iter().enumerate().take(p.used_entries(d)) {
                    let mut rest = idx;
                    let mut want = 0f64;
                    for &x in &xs {
                        want += f64::from(p.table_values[rest % v]) * f64::from(x);
                        rest /= v;
                    }
                    assert_eq!(f64::from(got), want, "{f:?} d={d} idx={idx}");
                }
            }
        }
    }

    #[test]
    fn mirrored_tables_are_antisymmetric_prefixes() {
        let full = plan(Format::Int4, 2, 8, TablePrecision::F32, false);
        let mir = plan(Format::Int4, 2, 8, TablePrecision::F32, true);
        assert_eq!(mir.slot, 128);
        let xs = [3.0f32, -5.0];
        let mut prod = vec![0.0; 32];
        let mut t_full = vec![0.0; 256];
        build_f32_table(&full, &xs, &mut prod, &mut t_full);
        let mut t_mir = vec![0.0; 128];
        build_f32_table(&mir, &xs, &mut prod, &mut t_mir);
        let mi = mir.mirror.unwrap();
        for idx in 0..256 {
            // v' = v + 0.5: T'[idx] = T[idx] + 0.5 * (x0 + x1)
            let want = t_full[idx] + 0.5 * (xs[0] + xs[1]);
            let got = if idx < 128 {
                t_mir[idx]
            } else {
                -t_mir[mi.index(idx, 2)]
            };
            assert_eq!(got, want, "idx {idx}");
        }
    }

    #[test]
    fn i8_multipliers_respect_the_int16_budget() {
        // 64 tuples of similar size: M near 258 / 64 * 127 / q_avg; a chunk may never exceed
        // the budget and M is the largest such value.
        let amax: Vec<f32> = (0..150)
            .map(|i| 1.0 + ((i * 37) % 11) as f32 * 0.3)
            .collect();
        let mut mult = vec![0u8; 150];
        let mut rm = vec![0f32; 150];
        let t = i8_scaling(&amax, &mut mult, &mut rm);
        let a = amax.iter().fold(0f32, |m, &x| m.max(x));
        let mm = (a / 127.0 / t).round() as u32;
        for c in mult.chunks(I8_CHUNK) {
            assert!(c.iter().map(|&m| u32::from(m)).sum::<u32>() <= I8_BUDGET);
        }
        let q: Vec<f32> = amax.iter().map(|&x| x * (127.0 / a)).collect();
        let next: Vec<u32> = q.iter().map(|&v| ceil_127(v * (mm + 1) as f32)).collect();
        assert!(
            next.chunks(I8_CHUNK)
                .any(|c| c.iter().sum::<u32>() > I8_BUDGET),
            "M not maximal"
        );
        // entries of each tuple stay within +-127 after scaling
        for (&x, &r) in amax.iter().zip(&rm) {
            assert!(x * r <= 127.0 + 1e-3);
        }
        assert!(ceil_127(127.0) == 1 && ceil_127(127.5) == 2 && ceil_127(0.0) == 1);
        for m in 1..1000u32 {
            let v = 127.0 * m as f32;
            assert_eq!(ceil_127(v), m);
            assert_eq!(ceil_127(v + v * f32::EPSILON), m + 1);
            assert_eq!(ceil_127(v - v * f32::EPSILON), m);
        }
    }

    #[test]
    fn round_small_is_round_ties_even() {
        for i in -2000..=2000 {
            let x = i as f32 * 0.25 + 0.001 * (i % 7) as f32;
            assert_eq!(round_small(x), x.round_ties_even(), "{x}");
            let h = i as f32 + 0.5;
            assert_eq!(round_small(h), h.round_ties_even(), "{h}");
        }
    }

    #[test]
    fn i8_and_i16_blocks() {
        let p8 = plan(Format::Int4, 2, 8, TablePrecision::I8, false);
        let xg = [1.0f32, -2.0, 0.5, 4.0, 0.0, 3.0, -1.0, 2.0];
        let mut out = vec![0i8; 4 * 256];
        let mut mult = vec![0u8; 4];
        let (t, _) = build_block(&p8, &xg, BlockOut::I8(&mut out, &mut mult));
        assert!(out.iter().any(|&q| q.abs() == 127));
        // maxabs of the group's tables: tuple 1, x = (0.5, 4), codes (-8, -8): |-4 - 32| = 36;
        // the others 23, 24, 23; m_p = ceil(127 amax_p / 36 * M / 127) must add up to at most
        // 258: M = 87 gives 56 + 87 + 58 + 56 = 257 (M = 88: 57 + 88 + 59 + 57 = 261).
        assert_eq!(mult, vec![56, 87, 58, 56]);
        assert_eq!(t, 36.0 / (127.0 * 87.0));
        // every entry is on its tuple's grid: |T - e m t| <= m t / 2
        let mut f = vec![0f32; 256];
        let mut prod = vec![0f32; 32];
        for tt in 0..4 {
            build_f32_table(&p8, &xg[2 * tt..2 * tt + 2], &mut prod, &mut f);
            let step = f64::from(mult[tt]) * f64::from(t);
            for (i, &e) in out[256 * tt..256 * (tt + 1)].iter().enumerate() {
                let err = (f64::from(f[i]) - f64::from(e) * step).abs();
                assert!(err <= step / 2.0 * (1.0 + 1e-5), "tuple {tt} entry {i}");
            }
        }
        let p16 = plan(Format::Int4, 2, 8, TablePrecision::I16, false);
        let mut out = vec![0i16; 4 * 256];
        let (a, _) = build_block(&p16, &xg, BlockOut::I16(&mut out));
        assert_eq!(a, 4.0 / 127.0);
        // xq = round(x * 127/4): tuple 1 = (16, 127); entry (c0, c1) = (c0-8)*16 + (c1-8)*127
        assert_eq!(out[256 + 3 + 16 * 10], (3 - 8) * 16 + (10 - 8) * 127);
    }
}
