//! NEON kernels for Arm64 (Apple M-series, AWS Graviton, Ampere; spec section 5): 16-entry
//! tables in one `tbl` (`vqtbl1q_s8`), 16 lookups per instruction.
//!
//! Supported plans: tables of at most 16 entries (`plan.slot <= 16`: depth 1 of every 4-bit or
//! smaller format, int2 and ternary at depth 2), as the AVX2 kernel:
//! - `i8` (any mirror): per tuple and 16 rows one `tbl`; mirrored lanes (`idx >= used`) map
//!   their index with a select and negate the entry. Entries times the tuple's multiplier are
//!   summed in int16 (`smlal`-style widening multiply-adds by a scalar), exact within a chunk
//!   of `table::I8_CHUNK` tuples (`table::I8_BUDGET`), then widened to int32.
//! - `i16` (no mirror): each table split once per (group, column) into a plane of low and one
//!   of high bytes, two `tbl` per tuple and 16 rows, the bytes zipped back into int16 and
//!   summed in int32 (exact).
//!
//! Both read the paired layout (two tuples' 4-bit indices per byte) and use the scalar build
//! and the scalar epilogue, so results are bitwise identical to the scalar kernel.
//! NEON is part of every Arm64 CPU (baseline of the `aarch64` targets).

use std::arch::aarch64::*;

use crate::kernels::scalar::epilogue;
use crate::kernels::{mirror_consts, Backend, LutKernel, Mir, RowJob};
use crate::layout::{IndexData, LayoutKind, TileLayout, ROW_BLOCK};
use crate::plan::{Plan, TablePrecision};
use crate::table::{TableData, I8_CHUNK};

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
            TablePrecision::F32 => false,
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
                (TableData::F32(_), _) => unreachable!("supports() rejects f32 plans"),
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
/// `idx < used`, else `-T[mirror(idx)]`. `idx` holds indices below 16.
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
/// int32 sums: the scalar kernel's, row by row.
#[inline(always)]
fn epilogue_rows(
    job: &RowJob<'_>,
    sums: &[i32; ROW_BLOCK],
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
            sums[r] as f32,
            job.scales[sz + r],
            job.zeros.at(sz + r),
            tabs.tscale[gn],
            tabs.zsum[gn],
            *yr,
        );
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
