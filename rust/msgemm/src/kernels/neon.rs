//! NEON kernels for Arm64 (Apple M-series, AWS Graviton, Ampere; spec section 5): 16-entry
//! tables in one `tbl` (`vqtbl1q_s8`), 16 lookups per instruction.
//!
//! Supported plans: tables of at most 16 entries (`plan.slot <= 16`: depth 1 of every 4-bit or
//! smaller format, int2 and ternary at depth 2, ternary depth 3 with mirror), as the AVX2 kernel:
//! - `i8` (any mirror): per tuple and 16 rows one `tbl`; mirrored lanes (`idx >= used`) map
//!   their index with a select and negate the entry. Entries times the tuple's multiplier are
//!   summed in int16 (`smlal`-style widening multiply-adds by a scalar), exact within a chunk
//!   of `table::I8_CHUNK` tuples (`table::I8_BUDGET`), then widened to int32.
//! - `i16` (no mirror): each table split once per (group, column) into a plane of low and one
//!   of high bytes, two `tbl` per tuple and 16 rows, the bytes zipped back into int16 and
//!   summed in int32 (exact).
//!
//! - `f32` (any mirror): each tuple's 16 float entries held as 64 bytes in four registers; per
//!   4 rows one `tbl` over them with the byte indices `4 idx + k`; entries added in tuple order.
//!
//! All read the paired layout (two tuples' 4-bit indices per byte) and use the scalar
//! epilogue, so results are bitwise identical to the scalar kernel. `i8`, `i16` and `f32`
//! tables of at most 16 entries (`V^d <= 16`) are built in NEON (the AVX2 build's steps on 4
//! lanes: the same IEEE operations, so the same bits as the scalar build); other tables use the
//! scalar build.
//! NEON is part of every Arm64 CPU (baseline of the `aarch64` targets).

use std::arch::aarch64::*;

use crate::kernels::scalar::epilogue;
use crate::kernels::{
    mirror_consts, small_build, small_build_supported, small_f32_block, small_i16_block,
    small_i8_block, Backend, LutKernel, Mir, RowJob, SmallTables,
};
use crate::layout::{IndexData, LayoutKind, TileLayout, ROW_BLOCK};
use crate::plan::{Plan, TablePrecision};
use crate::table::{self, TableData, TableSet, I8_CHUNK};

/// The NEON kernel.
pub struct Neon;

/// The registered instance.
pub static NEON: Neon = Neon;

impl LutKernel for Neon {
    fn backend(&self) -> Backend {
        Backend::Neon
    }

    fn available(&self) -> bool {
        std::arch::is_aarch64_feature_detected!("neon")
    }

    fn supports(&self, plan: &Plan) -> bool {
        match plan.precision {
            TablePrecision::I8 => plan.slot <= 16,
            TablePrecision::I16 => plan.slot <= 16 && plan.mirror.is_none(),
            TablePrecision::F32 => plan.slot <= 16,
        }
    }

    /// Every plan it runs reads the paired layout where every index fits a nibble.
    fn layout_kind(&self, plan: &Plan) -> LayoutKind {
        if TileLayout::can_pair(plan.levels, plan.depth()) {
            LayoutKind::Paired
        } else {
            LayoutKind::Plain
        }
    }

    fn build_tables(&self, plan: &Plan, xt: &[f32], set: &mut TableSet, parallel: bool) -> bool {
        if !small_build_supported(plan) {
            return false;
        }
        // SAFETY: NEON is baseline on aarch64.
        unsafe { build(plan, xt, set, parallel) };
        true
    }

    fn accumulate(&self, job: &RowJob<'_>, y: &mut [f32]) {
        assert!(
            !job.layout.folded,
            "the NEON kernel reads plain and paired layouts"
        );
        let IndexData::U8(ix) = &job.layout.data else {
            unreachable!("tables of <= 16 entries have byte indices")
        };
        // SAFETY: NEON is baseline on aarch64; the pointers derive from the job's slices.
        unsafe {
            match (&job.tables.data, job.layout.paired) {
                (TableData::I8(t), paired) => match (mirror_consts(job.plan).kind, paired) {
                    (0, false) => run_i8::<0, false>(job, ix, t, y),
                    (1, false) => run_i8::<1, false>(job, ix, t, y),
                    (_, false) => run_i8::<2, false>(job, ix, t, y),
                    (0, true) => run_i8::<0, true>(job, ix, t, y),
                    (1, true) => run_i8::<1, true>(job, ix, t, y),
                    (_, true) => run_i8::<2, true>(job, ix, t, y),
                },
                (TableData::I16(t), false) => run_i16::<false>(job, ix, t, y),
                (TableData::I16(t), true) => run_i16::<true>(job, ix, t, y),
                (TableData::F32(t), paired) => match (mirror_consts(job.plan).kind, paired) {
                    (0, false) => run_f32::<0, false>(job, ix, t, y),
                    (1, false) => run_f32::<1, false>(job, ix, t, y),
                    (_, false) => run_f32::<2, false>(job, ix, t, y),
                    (0, true) => run_f32::<0, true>(job, ix, t, y),
                    (1, true) => run_f32::<1, true>(job, ix, t, y),
                    (_, true) => run_f32::<2, true>(job, ix, t, y),
                },
            }
        }
    }
}

/// Per tuple depth (regular `[0]`, a group's last tuple `[1]`): `h - 1` and the index-map
/// constant (see [`Mir`](crate::kernels::Mir)), in every byte.
struct MirVec {
    hm1: [uint8x16_t; 2],
    c: [uint8x16_t; 2],
}

fn mirror_vectors(mir: &Mir) -> MirVec {
    let b = |v: i32| v as u8;
    // SAFETY: NEON is baseline on aarch64.
    unsafe {
        MirVec {
            hm1: [vdupq_n_u8(b(mir.h[0] - 1)), vdupq_n_u8(b(mir.h[1] - 1))],
            c: [vdupq_n_u8(b(mir.c[0])), vdupq_n_u8(b(mir.c[1]))],
        }
    }
}

/// 16 lookups with the mirror applied (`KIND` 0 none, 1 xor, 2 reverse): `T[idx]` for
/// `idx < used`, else `-T[mirror(idx)]`. The looked-up indices are below 16; `idx` itself may
/// be larger on a plain layout with mirror (ternary depth 3: up to 26), which the byte-wide
/// compare and map handle.
#[inline(always)]
unsafe fn look<const KIND: u8>(tb: int8x16_t, idx: uint8x16_t, mv: &MirVec, w: usize) -> int8x16_t {
    unsafe {
        if KIND == 0 {
            return vqtbl1q_s8(tb, idx);
        }
        let m = vcgtq_u8(idx, mv.hm1[w]);
        let mapped = if KIND == 1 {
            veorq_u8(idx, mv.c[w])
        } else {
            vsubq_u8(mv.c[w], idx)
        };
        let e = vqtbl1q_s8(tb, vbslq_u8(m, mapped, idx));
        // -e where m is all ones: (e ^ m) - m.
        let ms = vreinterpretq_s8_u8(m);
        vsubq_s8(veorq_s8(e, ms), ms)
    }
}

/// The indices of tuples `t` and `t + 1` for rows `16 q .. 16 q + 16` of the row block whose
/// slot 0 is at `ip`: two loads from a plain layout, or the two nibbles of one load from a
/// paired one (`t` even). The second is 0 when `two` is false on a plain layout.
#[inline(always)]
unsafe fn indices<const PAIRED: bool>(
    ip: *const u8,
    t: usize,
    q: usize,
    two: bool,
) -> (uint8x16_t, uint8x16_t) {
    unsafe {
        if PAIRED {
            let v = vld1q_u8(ip.add((t / 2) * 64 + 16 * q));
            (vandq_u8(v, vdupq_n_u8(0x0f)), vshrq_n_u8::<4>(v))
        } else {
            let i0 = vld1q_u8(ip.add(t * 64 + 16 * q));
            let i1 = if two {
                vld1q_u8(ip.add((t + 1) * 64 + 16 * q))
            } else {
                vdupq_n_u8(0)
            };
            (i0, i1)
        }
    }
}

/// The 16 bytes of the table of tuple `t` (`slot <= 16` entries at `tp + t * slot`, `tab_end`
/// bytes readable from `tp`); past the slot: the next slot's bytes (which no index selects),
/// copied near the buffer end.
#[inline(always)]
unsafe fn table16(tp: *const i8, t: usize, slot: usize, tab_end: usize) -> int8x16_t {
    unsafe {
        let o = t * slot;
        if o + 16 <= tab_end {
            vld1q_s8(tp.add(o))
        } else {
            let mut buf = [0i8; 16];
            std::ptr::copy_nonoverlapping(tp.add(o), buf.as_mut_ptr(), slot);
            vld1q_s8(buf.as_ptr())
        }
    }
}

/// Adds (`add`) or stores the int16 sums `acc` (rows `16 q .. 16 q + 8` in `acc[q][0]`, `+ 8 ..
/// + 16` in `acc[q][1]`) into the row block's int32 sums.
#[inline(always)]
unsafe fn widen(acc: &[[int16x8_t; 2]; 4], add: bool, sums: &mut [i32; ROW_BLOCK]) {
    unsafe {
        for (q, aq) in acc.iter().enumerate() {
            for (h, &a) in aq.iter().enumerate() {
                let p = sums.as_mut_ptr().add(16 * q + 8 * h);
                let (lo, hi) = (vmovl_s16(vget_low_s16(a)), vmovl_high_s16(a));
                if add {
                    vst1q_s32(p, vaddq_s32(vld1q_s32(p), lo));
                    vst1q_s32(p.add(4), vaddq_s32(vld1q_s32(p.add(4)), hi));
                } else {
                    vst1q_s32(p, lo);
                    vst1q_s32(p.add(4), hi);
                }
            }
        }
    }
}

/// The epilogue of the first `rows` rows of row block `b`, group `g`, column `n` from their
/// int32 (`i8`, `i16` tables) or float32 sums: the scalar kernel's, row by row.
#[inline(always)]
fn epilogue_rows<S: Copy + PartialSum>(
    job: &RowJob<'_>,
    sums: &[S; ROW_BLOCK],
    g: usize,
    b: usize,
    n: usize,
    y: &mut [f32],
) {
    let plan = job.plan;
    let tabs = job.tables;
    let gn = tabs.gn(g, n);
    let rows = (plan.m - b * ROW_BLOCK).min(ROW_BLOCK);
    let sz = (g * plan.row_blocks + b) * ROW_BLOCK;
    let y0 = job.y_index(b * ROW_BLOCK, n);
    for (r, yr) in y[y0..y0 + rows].iter_mut().enumerate() {
        *yr = epilogue(
            plan,
            sums[r].to_f32(),
            job.scales.at(sz + r),
            job.zeros.at(sz + r),
            tabs.tscale[gn],
            tabs.zsum[gn],
            *yr,
        );
    }
}

/// A row's partial sum `P` as the epilogue takes it (`u = P as f32`).
trait PartialSum {
    fn to_f32(self) -> f32;
}

impl PartialSum for i32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
}

impl PartialSum for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

/// The `i8` kernel for mirror kind `KIND` on a plain or (`PAIRED`) paired layout. Per group,
/// row block and column: tuples in pairs, 16 rows per vector; each entry widened to int16 and
/// multiply-added with its tuple's multiplier (exact within a chunk of `I8_CHUNK` tuples),
/// widened to int32 per chunk.
unsafe fn run_i8<const KIND: u8, const PAIRED: bool>(
    job: &RowJob<'_>,
    ix: &[u8],
    tab: &[i8],
    y: &mut [f32],
) {
    // SAFETY: pointers stay inside the layout / table slices (offsets from the plan).
    unsafe {
        let plan = job.plan;
        let tabs = job.tables;
        let lay = job.layout;
        let pg = plan.tuples.per_group;
        let mv = mirror_vectors(&mirror_consts(plan));
        let mut sums = [0i32; ROW_BLOCK];
        // Row blocks outside, columns inside: a row block's indices are read from memory once
        // and from L1 for the other columns.
        for g in tabs.groups.clone() {
            for b in job.row_blocks.clone() {
                let ip = ix.as_ptr().add(lay.slot(g, b, 0));
                for n in tabs.cols.clone() {
                    let o = tabs.offset(g, n, 0);
                    let (tp, tab_end) = (tab.as_ptr().add(o), tab.len() - o);
                    let mults = tabs.mults(g, n);
                    let mut t0 = 0;
                    while t0 < pg {
                        let end = (t0 + I8_CHUNK).min(pg);
                        let mut acc = [[vdupq_n_s16(0); 2]; 4];
                        let mut t = t0;
                        while t < end {
                            let two = t + 1 < end;
                            let tb0 = table16(tp, t, plan.slot, tab_end);
                            let m0 = i16::from(mults[t]);
                            let (tb1, m1) = if two {
                                (
                                    table16(tp, t + 1, plan.slot, tab_end),
                                    i16::from(mults[t + 1]),
                                )
                            } else {
                                (vdupq_n_s8(0), 0)
                            };
                            // Mirror constants: the group's last tuple may have its own.
                            let (w0, w1) = (usize::from(t + 1 == pg), usize::from(t + 2 == pg));
                            for (q, aq) in acc.iter_mut().enumerate() {
                                let (i0, i1) = indices::<PAIRED>(ip, t, q, two);
                                let e0 = look::<KIND>(tb0, i0, &mv, w0);
                                aq[0] = vmlaq_n_s16(aq[0], vmovl_s8(vget_low_s8(e0)), m0);
                                aq[1] = vmlaq_n_s16(aq[1], vmovl_high_s8(e0), m0);
                                if two {
                                    let e1 = look::<KIND>(tb1, i1, &mv, w1);
                                    aq[0] = vmlaq_n_s16(aq[0], vmovl_s8(vget_low_s8(e1)), m1);
                                    aq[1] = vmlaq_n_s16(aq[1], vmovl_high_s8(e1), m1);
                                }
                            }
                            t += 2;
                        }
                        widen(&acc, t0 > 0, &mut sums);
                        t0 = end;
                    }
                    epilogue_rows(job, &sums, g, b, n, y);
                }
            }
        }
    }
}

/// The `i16` kernel (no mirror) on a plain or (`PAIRED`) paired layout: per group and column
/// each tuple's table split into a plane of low and one of high bytes, then per row block two
/// `tbl` per tuple and 16 rows, the bytes zipped back into int16 (little-endian: low byte
/// first) and summed in int32.
unsafe fn run_i16<const PAIRED: bool>(job: &RowJob<'_>, ix: &[u8], tab: &[i16], y: &mut [f32]) {
    // SAFETY: pointers stay inside the layout / table slices (offsets from the plan).
    unsafe {
        let plan = job.plan;
        let tabs = job.tables;
        let lay = job.layout;
        let pg = plan.tuples.per_group;
        let slot = plan.slot;
        // planes[t] = (low bytes, high bytes) of tuple t's 16 entries (0 past the slot).
        let mut planes = vec![(vdupq_n_u8(0), vdupq_n_u8(0)); pg];
        let mut sums = [0i32; ROW_BLOCK];
        for g in tabs.groups.clone() {
            for n in tabs.cols.clone() {
                let o = tabs.offset(g, n, 0);
                for (t, pl) in planes.iter_mut().enumerate() {
                    let mut e = [0i16; 16];
                    e[..slot].copy_from_slice(&tab[o + t * slot..o + (t + 1) * slot]);
                    // De-interleave the little-endian int16 entries into low / high bytes.
                    let v = vld2q_u8(e.as_ptr() as *const u8);
                    *pl = (v.0, v.1);
                }
                for b in job.row_blocks.clone() {
                    let ip = ix.as_ptr().add(lay.slot(g, b, 0));
                    let mut acc = [vdupq_n_s32(0); 16];
                    let mut t = 0;
                    while t < pg {
                        let two = t + 1 < pg;
                        for q in 0..4 {
                            let (i0, i1) = indices::<PAIRED>(ip, t, q, two);
                            for (k, idx) in [(t, i0), (t + 1, i1)] {
                                if k == t + 1 && !two {
                                    break;
                                }
                                let (pl, ph) = planes[k];
                                let (lo, hi) = (vqtbl1q_u8(pl, idx), vqtbl1q_u8(ph, idx));
                                let e0 = vreinterpretq_s16_u8(vzip1q_u8(lo, hi));
                                let e1 = vreinterpretq_s16_u8(vzip2q_u8(lo, hi));
                                let a = &mut acc[4 * q..4 * q + 4];
                                a[0] = vaddw_s16(a[0], vget_low_s16(e0));
                                a[1] = vaddw_high_s16(a[1], e0);
                                a[2] = vaddw_s16(a[2], vget_low_s16(e1));
                                a[3] = vaddw_high_s16(a[3], e1);
                            }
                        }
                        t += 2;
                    }
                    for (i, &a) in acc.iter().enumerate() {
                        vst1q_s32(sums.as_mut_ptr().add(4 * i), a);
                    }
                    epilogue_rows(job, &sums, g, b, n, y);
                }
            }
        }
    }
}

/// The `f32` kernel for mirror kind `KIND` on a plain or (`PAIRED`) paired layout. Per group
/// and column each tuple's 16 float entries are held as 64 table bytes (four registers, 0 past
/// the slot); per row block and 16 rows, the indices (mirror applied as in [`look`]) are
/// spread into the byte indices `4 idx + k` of four rows at a time, and one `tbl` over the 64
/// bytes gathers those rows' entries. Entries are added in ascending tuple order (a mirrored
/// one with its sign flipped: `P + (-e)`), then the scalar epilogue: the scalar kernel's bits.
unsafe fn run_f32<const KIND: u8, const PAIRED: bool>(
    job: &RowJob<'_>,
    ix: &[u8],
    tab: &[f32],
    y: &mut [f32],
) {
    // SAFETY: pointers stay inside the layout / table slices (offsets from the plan).
    unsafe {
        let plan = job.plan;
        let tabs = job.tables;
        let lay = job.layout;
        let pg = plan.tuples.per_group;
        let slot = plan.slot;
        let mv = mirror_vectors(&mirror_consts(plan));
        // spread[r]: byte j takes index byte 4r + j/4 (row 4r + j/4 of the 16); `+ k` below.
        let spread: [uint8x16_t; 4] = std::array::from_fn(|r| {
            let b: [u8; 16] = std::array::from_fn(|j| (4 * r + j / 4) as u8);
            vld1q_u8(b.as_ptr())
        });
        let byte_of_entry = {
            let b: [u8; 16] = std::array::from_fn(|j| (j % 4) as u8);
            vld1q_u8(b.as_ptr())
        };
        let sign = vdupq_n_u8(0x80);
        // Sign-bit positions of the four little-endian floats (byte 3 of each).
        let top_byte = {
            let b: [u8; 16] = std::array::from_fn(|j| if j % 4 == 3 { 0xff } else { 0 });
            vld1q_u8(b.as_ptr())
        };
        let zero = uint8x16x4_t(vdupq_n_u8(0), vdupq_n_u8(0), vdupq_n_u8(0), vdupq_n_u8(0));
        let mut tables = vec![zero; pg];
        let mut sums = [0f32; ROW_BLOCK];
        for g in tabs.groups.clone() {
            for n in tabs.cols.clone() {
                let o = tabs.offset(g, n, 0);
                for (t, tb) in tables.iter_mut().enumerate() {
                    let mut e = [0f32; 16];
                    e[..slot].copy_from_slice(&tab[o + t * slot..o + (t + 1) * slot]);
                    *tb = vld1q_u8_x4(e.as_ptr() as *const u8);
                }
                for b in job.row_blocks.clone() {
                    let ip = ix.as_ptr().add(lay.slot(g, b, 0));
                    let mut acc = [vdupq_n_f32(0.0); 16];
                    let mut t = 0;
                    while t < pg {
                        let two = t + 1 < pg;
                        for q in 0..4 {
                            let (i0, i1) = indices::<PAIRED>(ip, t, q, two);
                            for (k, idx) in [(t, i0), (t + 1, i1)] {
                                if k == t + 1 && !two {
                                    break;
                                }
                                // Mirror: indices past the stored prefix read their mirror,
                                // negated (the sign bit of the float flipped).
                                let (idx, flip) = if KIND == 0 {
                                    (idx, vdupq_n_u8(0))
                                } else {
                                    let w = usize::from(k + 1 == pg);
                                    let m = vcgtq_u8(idx, mv.hm1[w]);
                                    let mapped = if KIND == 1 {
                                        veorq_u8(idx, mv.c[w])
                                    } else {
                                        vsubq_u8(mv.c[w], idx)
                                    };
                                    (vbslq_u8(m, mapped, idx), vandq_u8(m, sign))
                                };
                                let i4 = vshlq_n_u8::<2>(idx);
                                for (r, sp) in spread.iter().enumerate() {
                                    let bi = vorrq_u8(vqtbl1q_u8(i4, *sp), byte_of_entry);
                                    let mut e = vqtbl4q_u8(tables[k], bi);
                                    if KIND != 0 {
                                        let f = vandq_u8(vqtbl1q_u8(flip, *sp), top_byte);
                                        e = veorq_u8(e, f);
                                    }
                                    let a = &mut acc[4 * q + r];
                                    *a = vaddq_f32(*a, vreinterpretq_f32_u8(e));
                                }
                            }
                        }
                        t += 2;
                    }
                    for (i, &a) in acc.iter().enumerate() {
                        vst1q_f32(sums.as_mut_ptr().add(4 * i), a);
                    }
                    epilogue_rows(job, &sums, g, b, n, y);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Table build (i8, i16 and f32 tables of at most 16 entries)
// ---------------------------------------------------------------------------------------------

/// What every block of a build shares: [`SmallTables`], and for `V <= 8` the byte indices of
/// `vqtbl2q_u8` into the first 8 products (32 bytes) that move the product of entry `i`'s
/// digit `j` into lane `i`: `pick[j][4i + k] = 4 digit_j(i) + k`.
struct BuildConsts {
    s: SmallTables,
    pick: [[u8; 64]; 4],
}

impl BuildConsts {
    fn new(plan: &Plan) -> BuildConsts {
        let v = plan.levels;
        let pick = std::array::from_fn(|j| {
            std::array::from_fn(|b| (4 * ((b / 4 / v.pow(j as u32)) % v) + b % 4) as u8)
        });
        BuildConsts {
            s: SmallTables::new(plan),
            pick,
        }
    }
}

/// Builds `set` for a plan of [`small_build_supported`], bitwise equal to the scalar build.
///
/// # Safety
/// NEON (baseline on aarch64).
unsafe fn build(plan: &Plan, xt: &[f32], set: &mut TableSet, parallel: bool) {
    let c = BuildConsts::new(plan);
    // SAFETY (each block build): NEON is baseline on aarch64.
    small_build(
        plan,
        xt,
        set,
        parallel,
        |xg, out, mult| unsafe { build_block_i8(plan, &c, xg, out, mult) },
        |xg, out| unsafe { build_block_i16(plan, &c, xg, out) },
        |xg, out| unsafe { build_block_f32(plan, &c, xg, out) },
    );
}

/// The f32 entries of a tuple with activations `xs` (16 lanes in four vectors; lanes of
/// entries not built are 0), with the scalar build's operations: products `v'[c] * x_j`, then
/// entry = (product of digit 0 + product of digit 1) + ... in digit order.
#[inline(always)]
unsafe fn entries(plan: &Plan, c: &BuildConsts, xs: &[f32], w: usize) -> [float32x4_t; 4] {
    unsafe {
        let vl: [float32x4_t; 4] = std::array::from_fn(|h| vld1q_f32(c.s.vals.as_ptr().add(4 * h)));
        let mut e = if plan.levels > 8 {
            // Depth 1 only (V^2 > 16): the products are the entries.
            let x = vdupq_n_f32(xs[0]);
            vl.map(|v| vmulq_f32(v, x))
        } else {
            let mut e = [vdupq_n_f32(0.0); 4];
            for (j, &x) in xs.iter().enumerate() {
                let x = vdupq_n_f32(x);
                let prod = uint8x16x2_t(
                    vreinterpretq_u8_f32(vmulq_f32(vl[0], x)),
                    vreinterpretq_u8_f32(vmulq_f32(vl[1], x)),
                );
                for (h, eh) in e.iter_mut().enumerate() {
                    let idx = vld1q_u8(c.pick[j].as_ptr().add(16 * h));
                    let p = vreinterpretq_f32_u8(vqtbl2q_u8(prod, idx));
                    *eh = if j == 0 { p } else { vaddq_f32(*eh, p) };
                }
            }
            e
        };
        for (h, eh) in e.iter_mut().enumerate() {
            let keep = vld1q_u32(c.s.built[w].as_ptr().add(4 * h));
            *eh = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(*eh), keep));
        }
        e
    }
}

/// One `(group, column)` block of `f32` tables: [`small_f32_block`] with [`entries`].
unsafe fn build_block_f32(plan: &Plan, c: &BuildConsts, xg: &[f32], out: &mut [f32]) -> (f32, f32) {
    small_f32_block(plan, xg, out, |xs, w| {
        let mut buf = [0f32; 16];
        // SAFETY: NEON is baseline; 16 floats into `buf`.
        unsafe {
            for (h, eh) in entries(plan, c, xs, w).iter().enumerate() {
                vst1q_f32(buf.as_mut_ptr().add(4 * h), *eh);
            }
        }
        buf
    })
}

/// One `(group, column)` block of `i16` tables, equal to [`table::build_block`]
/// ([`small_i16_block`] on 4 lanes): the activations quantized (`vcvtnq` rounds to nearest
/// even, as `round_small`; clamped to +-127.5 before and +-127 after), each tuple's entries the
/// exact integer sums of the products `int_values[c] * xq` of its digits (order-free).
unsafe fn build_block_i16(plan: &Plan, c: &BuildConsts, xg: &[f32], out: &mut [i16]) -> (f32, f32) {
    let ints = plan
        .int_values
        .as_deref()
        .expect("i16 plan has integer values");
    let mut iv = [0i32; 16];
    iv[..plan.levels].copy_from_slice(ints);
    // SAFETY (closures): NEON is baseline; 4-lane loads and stores inside `xg` / `xq`, 16-lane
    // masks.
    small_i16_block(
        plan,
        xg,
        out,
        |xg| unsafe { maxabs_nan(xg) },
        |xg, rcp, xq| unsafe {
            let (rv, lo, hi) = (vdupq_n_f32(rcp), vdupq_n_f32(-127.5), vdupq_n_f32(127.5));
            let (qlo, qhi) = (vdupq_n_s32(-127), vdupq_n_s32(127));
            let full = xg.len() / 4 * 4;
            for i in (0..full).step_by(4) {
                let v = vmulq_f32(vld1q_f32(xg.as_ptr().add(i)), rv);
                let q = vcvtnq_s32_f32(vminq_f32(vmaxq_f32(v, lo), hi));
                vst1q_s32(xq.as_mut_ptr().add(i), vminq_s32(vmaxq_s32(q, qlo), qhi));
            }
            full
        },
        |xs, w| unsafe {
            let vl: [int32x4_t; 4] = std::array::from_fn(|h| vld1q_s32(iv.as_ptr().add(4 * h)));
            let mut e = if plan.levels > 8 {
                // Depth 1 only (V^2 > 16): the products are the entries.
                let x = vdupq_n_s32(xs[0]);
                vl.map(|v| vmulq_s32(v, x))
            } else {
                let mut e = [vdupq_n_s32(0); 4];
                for (j, &x) in xs.iter().enumerate() {
                    let x = vdupq_n_s32(x);
                    let prod = uint8x16x2_t(
                        vreinterpretq_u8_s32(vmulq_s32(vl[0], x)),
                        vreinterpretq_u8_s32(vmulq_s32(vl[1], x)),
                    );
                    for (h, eh) in e.iter_mut().enumerate() {
                        let idx = vld1q_u8(c.pick[j].as_ptr().add(16 * h));
                        *eh = vaddq_s32(*eh, vreinterpretq_s32_u8(vqtbl2q_u8(prod, idx)));
                    }
                }
                e
            };
            for (h, eh) in e.iter_mut().enumerate() {
                let keep = vreinterpretq_s32_u32(vld1q_u32(c.s.built[w].as_ptr().add(4 * h)));
                *eh = vandq_s32(*eh, keep);
            }
            // Entries fit int16 (the plan checks `depth * max|v| * 127`): the saturating
            // narrowing is exact.
            let mut out = [0i16; 16];
            vst1q_s16(
                out.as_mut_ptr(),
                vcombine_s16(vqmovn_s32(e[0]), vqmovn_s32(e[1])),
            );
            vst1q_s16(
                out.as_mut_ptr().add(8),
                vcombine_s16(vqmovn_s32(e[2]), vqmovn_s32(e[3])),
            );
            out
        },
    )
}

/// `(max |x|, whether x holds a NaN)`.
#[inline]
unsafe fn maxabs_nan(xs: &[f32]) -> (f32, bool) {
    unsafe {
        let (mut m, mut bad) = (vdupq_n_f32(0.0), vdupq_n_u32(0));
        let mut chunks = xs.chunks_exact(4);
        for c in &mut chunks {
            let v = vabsq_f32(vld1q_f32(c.as_ptr()));
            // NaN is tracked apart (`vmaxq_f32` would propagate it).
            bad = vorrq_u32(bad, vmvnq_u32(vceqq_f32(v, v)));
            m = vmaxq_f32(m, v);
        }
        let mut nan = vmaxvq_u32(bad) != 0;
        let mut xmax = vmaxvq_f32(m);
        for &x in chunks.remainder() {
            xmax = xmax.max(x.abs());
            nan |= x.is_nan();
        }
        (xmax, nan)
    }
}

/// One `(group, column)` block of `i8` tables, bitwise equal to [`table::build_block`]
/// ([`small_i8_block`] on 4 lanes): the f32 entries of every tuple, their largest magnitude
/// over the entries that can be looked up, the int8 scaling ([`i8_scaling`]), then the entries
/// recomputed and rounded (`vcvtnq` rounds to nearest even, as `round_ties_even`; clamping to
/// +-127 before rounding gives the scalar `clamp(round(clamp(v, +-127.5)), +-127)`).
unsafe fn build_block_i8(
    plan: &Plan,
    c: &BuildConsts,
    xg: &[f32],
    out: &mut [i8],
    mult: &mut [u8],
) -> (f32, f32) {
    // SAFETY (closures): NEON is baseline; the masks are 16 lanes.
    small_i8_block(
        plan,
        xg,
        out,
        mult,
        c.s.vmax,
        |xg| unsafe { maxabs_nan(xg) },
        |xs, w| unsafe {
            let e = entries(plan, c, xs, w);
            let mut m = vdupq_n_f32(0.0);
            for (h, &eh) in e.iter().enumerate() {
                let keep = vld1q_u32(c.s.counted[w].as_ptr().add(4 * h));
                let v = vreinterpretq_u32_f32(vabsq_f32(eh));
                m = vmaxq_f32(m, vreinterpretq_f32_u32(vandq_u32(v, keep)));
            }
            vmaxvq_f32(m)
        },
        |a, m, r| unsafe { i8_scaling(a, m, r) },
        |xs, w, rm| unsafe {
            let (lo, hi) = (vdupq_n_f32(-127.0), vdupq_n_f32(127.0));
            let rv = vdupq_n_f32(rm);
            let q = entries(plan, c, xs, w)
                .map(|eh| vcvtnq_s32_f32(vminq_f32(vmaxq_f32(vmulq_f32(eh, rv), lo), hi)));
            let s01 = vcombine_s16(vqmovn_s32(q[0]), vqmovn_s32(q[1]));
            let s23 = vcombine_s16(vqmovn_s32(q[2]), vqmovn_s32(q[3]));
            let mut bytes = [0i8; 16];
            vst1q_s8(
                bytes.as_mut_ptr(),
                vcombine_s8(vqmovn_s16(s01), vqmovn_s16(s23)),
            );
            bytes
        },
    )
}

/// `table::ceil_127` on 4 lanes (the smallest integer `m >= 1` with `127 m >= v`, exact for
/// `0 <= v <= 2^17`), as float: the same IEEE steps.
#[inline(always)]
unsafe fn ceil_127_x4(v: float32x4_t) -> float32x4_t {
    unsafe {
        let one = vdupq_n_f32(1.0);
        let c127 = vdupq_n_f32(127.0);
        let magic = vdupq_n_f32(12_582_912.0);
        let and1 = |m: uint32x4_t| vreinterpretq_f32_u32(vandq_u32(m, vreinterpretq_u32_f32(one)));
        let d = vmulq_f32(v, vdupq_n_f32(1.0 / 127.0));
        let r = vsubq_f32(vaddq_f32(d, magic), magic);
        let mut m = vmaxq_f32(vaddq_f32(r, and1(vcltq_f32(r, d))), one);
        let down = vandq_u32(
            vcgtq_f32(m, one),
            vcgeq_f32(vmulq_f32(c127, vsubq_f32(m, one)), v),
        );
        m = vsubq_f32(m, and1(down));
        let up = vcltq_f32(vmulq_f32(c127, m), v);
        vaddq_f32(m, and1(up))
    }
}

/// Lanes `i .. i + 4` of `v` below `n` (0 past it).
#[inline(always)]
unsafe fn load4(v: &[f32], i: usize, n: usize) -> float32x4_t {
    unsafe {
        if i + 4 <= n {
            vld1q_f32(v.as_ptr().add(i))
        } else {
            let mut buf = [0f32; 4];
            buf[..n - i].copy_from_slice(&v[i..n]);
            vld1q_f32(buf.as_ptr())
        }
    }
}

/// [`table::i8_scaling`] with its per-tuple loops on 4 lanes ([`table::i8_scaling_by`]): the
/// same multipliers, factors and scale (a test compares them).
unsafe fn i8_scaling(amax: &[f32], mult: &mut [u8], rm: &mut [f32]) -> f32 {
    let lane = [0u32, 1, 2, 3];
    table::i8_scaling_by(amax, mult, rm, |q, mf, mut out| {
        // SAFETY: NEON is baseline; `load4` reads lanes below `q.len()` only.
        unsafe {
            let n = q.len();
            let mfv = vdupq_n_f32(mf);
            let mut s = vdupq_n_u32(0);
            for i in (0..n).step_by(4) {
                let lanes = vcltq_u32(vld1q_u32(lane.as_ptr()), vdupq_n_u32((n - i) as u32));
                let mp = ceil_127_x4(vmulq_f32(load4(q, i, n), mfv));
                s = vaddq_u32(s, vandq_u32(vcvtq_u32_f32(mp), lanes));
                if let Some(o) = out.as_deref_mut() {
                    let mut buf = [0f32; 4];
                    vst1q_f32(buf.as_mut_ptr(), mp);
                    let len = (n - i).min(4);
                    o[i..i + len].copy_from_slice(&buf[..len]);
                }
            }
            vaddvq_u32(s)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn i8_scaling_equals_the_scalar_scaling() {
        // SAFETY: NEON is baseline on aarch64.
        table::check_i8_scaling(9, |a, m, r| unsafe { i8_scaling(a, m, r) });
    }
}
