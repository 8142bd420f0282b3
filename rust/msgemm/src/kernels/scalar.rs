//! The portable scalar kernel: every format, depth, precision and mirror setting.
//!
//! It is the oracle every SIMD kernel must match bit for bit. Per 64-row block, group and
//! column it keeps 64 accumulators (one per row, i.e. per SIMD lane), adds the tuples of
//! the group in ascending order, then applies the epilogue row by row.

use crate::kernels::{Backend, LutKernel, RowJob};
use crate::layout::{IndexData, ROW_BLOCK};
use crate::plan::{Plan, TablePrecision};
use crate::table::TableData;

/// The scalar kernel.
pub struct Scalar;

/// The registered instance.
pub static SCALAR: Scalar = Scalar;

impl LutKernel for Scalar {
    fn backend(&self) -> Backend {
        Backend::Scalar
    }
    fn available(&self) -> bool {
        true
    }
    fn supports(&self, _plan: &Plan) -> bool {
        true
    }
    fn accumulate(&self, job: &RowJob<'_>, y: &mut [f32]) {
        assert!(!job.layout.paired, "the scalar kernel reads plain layouts");
        match (&job.layout.data, &job.tables.data) {
            (IndexData::U8(ix), TableData::F32(t)) => run::<u8, f32>(job, ix, t, y),
            (IndexData::U8(ix), TableData::I16(t)) => run::<u8, i16>(job, ix, t, y),
            (IndexData::U8(ix), TableData::I8(t)) => run::<u8, i8>(job, ix, t, y),
            (IndexData::U16(ix), TableData::F32(t)) => run::<u16, f32>(job, ix, t, y),
            (IndexData::U16(ix), TableData::I16(t)) => run::<u16, i16>(job, ix, t, y),
            (IndexData::U16(ix), TableData::I8(t)) => run::<u16, i8>(job, ix, t, y),
        }
    }
}

/// A table entry type and its exact accumulator.
pub trait Entry: Copy + Send + Sync {
    type Acc: Copy;
    fn zero() -> Self::Acc;
    fn add(acc: Self::Acc, e: Self) -> Self::Acc;
    fn sub(acc: Self::Acc, e: Self) -> Self::Acc;
    fn to_f32(acc: Self::Acc) -> f32;
    /// `acc + m * e` (the `i8` tuple multipliers; `m = 1` for the other precisions).
    #[inline]
    fn add_m(acc: Self::Acc, e: Self, m: u8) -> Self::Acc {
        debug_assert!(m == 1);
        Self::add(acc, e)
    }
    /// `acc - m * e`.
    #[inline]
    fn sub_m(acc: Self::Acc, e: Self, m: u8) -> Self::Acc {
        debug_assert!(m == 1);
        Self::sub(acc, e)
    }
}

impl Entry for f32 {
    type Acc = f32;
    #[inline]
    fn zero() -> f32 {
        0.0
    }
    #[inline]
    fn add(acc: f32, e: f32) -> f32 {
        acc + e
    }
    #[inline]
    fn sub(acc: f32, e: f32) -> f32 {
        acc - e
    }
    #[inline]
    fn to_f32(acc: f32) -> f32 {
        acc
    }
}

impl Entry for i16 {
    type Acc = i32;
    #[inline]
    fn zero() -> i32 {
        0
    }
    #[inline]
    fn add(acc: i32, e: i16) -> i32 {
        acc + i32::from(e)
    }
    #[inline]
    fn sub(acc: i32, e: i16) -> i32 {
        acc - i32::from(e)
    }
    #[inline]
    fn to_f32(acc: i32) -> f32 {
        acc as f32
    }
}

impl Entry for i8 {
    type Acc = i32;
    #[inline]
    fn add_m(acc: i32, e: i8, m: u8) -> i32 {
        acc + i32::from(m) * i32::from(e)
    }
    #[inline]
    fn sub_m(acc: i32, e: i8, m: u8) -> i32 {
        acc - i32::from(m) * i32::from(e)
    }
    #[inline]
    fn zero() -> i32 {
        0
    }
    #[inline]
    fn add(acc: i32, e: i8) -> i32 {
        acc + i32::from(e)
    }
    #[inline]
    fn sub(acc: i32, e: i8) -> i32 {
        acc - i32::from(e)
    }
    #[inline]
    fn to_f32(acc: i32) -> f32 {
        acc as f32
    }
}

/// An index type of the tile layout.
pub trait Index: Copy + Send + Sync {
    /// One past the largest value.
    const RANGE: usize;
    fn get(self) -> usize;
}
impl Index for u8 {
    const RANGE: usize = 256;
    #[inline]
    fn get(self) -> usize {
        self as usize
    }
}
impl Index for u16 {
    const RANGE: usize = 65536;
    #[inline]
    fn get(self) -> usize {
        self as usize
    }
}

/// The epilogue of one `(row, column, group)`, the contract of `KERNELS.md`:
/// `u = P; u = u - z * zsum (zero term); u = u * tscale (integer tables); y = y + s * u`.
#[inline]
pub fn epilogue(plan: &Plan, p: f32, s: f32, z: f32, tscale: f32, zsum: f32, y: f32) -> f32 {
    let mut u = p;
    if plan.zero_term {
        u -= z * zsum;
    }
    if plan.precision != TablePrecision::F32 {
        u *= tscale;
    }
    y + s * u
}

fn run<I: Index, E: Entry>(job: &RowJob<'_>, ix: &[I], tab: &[E], y: &mut [f32]) {
    let plan = job.plan;
    let tabs = job.tables;
    let lay = job.layout;
    let tp = plan.tuples;
    // Mirror thresholds and index maps for the two tuple depths of a group.
    let half = |r: usize| plan.used_entries(r);
    let (half_d, half_last) = (half(tp.depth), half(tp.last_depth));
    let mut acc = [E::zero(); ROW_BLOCK];
    let ones = vec![1u8; tp.per_group];
    for rb in job.row_blocks.clone() {
        let rows = (plan.m - rb * ROW_BLOCK).min(ROW_BLOCK);
        for g in tabs.groups.clone() {
            let sz = (g * plan.row_blocks + rb) * ROW_BLOCK;
            let scales: [f32; ROW_BLOCK] = std::array::from_fn(|i| job.scales.at(sz + i));
            for n in tabs.cols.clone() {
                acc.fill(E::zero());
                // `i8` tables: the per-tuple multipliers (1 for the other precisions).
                let mults: &[u8] = if tabs.mult.is_empty() {
                    &ones
                } else {
                    tabs.mults(g, n)
                };
                if plan.mirror.is_none() && I::RANGE == 256 && tabs.slot >= 256 {
                    // Byte indices into >= 256-entry tables: one row at a time with its sum in a
                    // register, tuples in ascending order (the same order as below).
                    let i0 = lay.slot(g, rb, 0);
                    let idx = &ix[i0..i0 + tp.per_group * ROW_BLOCK];
                    let t0 = tabs.offset(g, n, 0);
                    let block = &tab[t0..t0 + tp.per_group * tabs.slot];
                    for (lane, a) in acc.iter_mut().enumerate().take(rows) {
                        let mut sum = E::zero();
                        for ((tt, ii), &m) in block
                            .chunks_exact(tabs.slot)
                            .zip(idx.chunks_exact(ROW_BLOCK))
                            .zip(mults)
                        {
                            if let Some(t256) = tt.first_chunk::<256>() {
                                sum = E::add_m(sum, t256[ii[lane].get() & 255], m);
                            }
                        }
                        *a = sum;
                    }
                } else {
                    for t in 0..tp.per_group {
                        let slot = &ix[lay.slot(g, rb, t)..lay.slot(g, rb, t) + ROW_BLOCK];
                        let table = &tab[tabs.offset(g, n, t)..tabs.offset(g, n, t) + tabs.slot];
                        let m = mults[t];
                        match plan.mirror {
                            None => match table.first_chunk::<256>() {
                                // Byte indices into a 256-entry table: no bounds checks needed.
                                Some(t256) if I::RANGE == 256 => {
                                    for (a, i) in acc.iter_mut().zip(slot) {
                                        *a = E::add_m(*a, t256[i.get() & 255], m);
                                    }
                                }
                                _ => {
                                    for (a, i) in acc.iter_mut().zip(slot) {
                                        *a = E::add_m(*a, table[i.get()], m);
                                    }
                                }
                            },
                            Some(mi) => {
                                let r = tp.depth_of(t);
                                let h = if t + 1 == tp.per_group {
                                    half_last
                                } else {
                                    half_d
                                };
                                for (a, i) in acc.iter_mut().zip(slot) {
                                    let i = i.get();
                                    *a = if i < h {
                                        E::add_m(*a, table[i], m)
                                    } else {
                                        E::sub_m(*a, table[mi.index(i, r)], m)
                                    };
                                }
                            }
                        }
                    }
                }
                let gn = tabs.gn(g, n);
                let (tsc, zs) = (tabs.tscale[gn], tabs.zsum[gn]);
                for lane in 0..rows {
                    let yi = job.y_index(rb * ROW_BLOCK + lane, n);
                    let z = job.zeros.at(sz + lane);
                    y[yi] = epilogue(plan, E::to_f32(acc[lane]), scales[lane], z, tsc, zs, y[yi]);
                }
            }
        }
    }
}
