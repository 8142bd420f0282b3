//! AVX-512 BW + VBMI kernels (spec section 5): byte tables held in zmm registers.
//!
//! Supported plans: byte indices (`V^d <= 256`); `i8`; `i16` without mirror; `f32` tables of
//! at most 32 entries.
//!
//! - `i8` tables: the table of a tuple (up to 256 bytes) sits in 1, 2 or 4 zmm registers;
//!   64 lookups (one per row of a 64-row block) are one `vpermb` (<= 64 entries), one
//!   `vpermi2b` (<= 128) or two `vpermi2b` plus a blend on the index MSB (<= 256). Mirrored
//!   tables (`used < slot`) map the index with one masked xor/sub and negate the entry with a
//!   masked `vpsubb`. The int8 entries of two tuples are interleaved (`vpunpck[lh]bw`) and
//!   summed pairwise into int16 with `vpmaddubsw` against ones, so one instruction widens and
//!   adds 64 lookups; int16 partial sums are spilled to int32 every 256 tuples (exact).
//!   Up to eight row blocks share each table load.
//! - `i16` tables: low and high byte planes (one `vpmovwb` each), looked up like `i8`; the
//!   low bytes are summed unsigned, the high bytes signed, and recombined `256*hi + lo` in
//!   int32 (exact). Mirrored `i16` plans are left to the scalar kernel.
//! - `f32` tables of at most 32 entries (depth 1, int2 / ternary depth 2, ...): 16 rows per
//!   lookup with `vpermps` (<= 16 entries) or `vpermt2ps` (<= 32); sequential float adds per
//!   row (one row per lane), as the contract requires. Larger f32 tables would need gathers,
//!   which measured slower than the scalar kernel: those plans are left to it.
//!
//! The epilogue follows `KERNELS.md` exactly (separate multiplies and adds, no FMA), so the
//! results are bitwise identical to the scalar kernel. The table build (`i8` and `f32`) is
//! vectorised too: the level-by-level build of `table.rs` with masked vector adds, and for
//! `i8` the block's `max |T|` is computed in closed form from the per-digit extreme products
//! (float rounding is monotonic, so the largest entry is the left-to-right sum of the largest
//! products), which makes the build a single pass.

use std::arch::x86_64::*;

use crate::format::Involution;
use crate::kernels::{Backend, LutKernel, RowJob, Tiled, Zeros};
use crate::layout::{IndexData, LayoutKind, TileLayout, ROW_BLOCK};
use crate::plan::{Plan, TablePrecision};
use crate::table::{self, map_blocks, BlockOut, TableData, TableSet};

/// The AVX-512 kernel.
pub struct Avx512;

/// The registered instance.
pub static AVX512: Avx512 = Avx512;

/// Row blocks that share one table load in the integer kernels.
const RB_TILE: usize = 8;
const PF_ON: bool = true;

fn cpu_ok() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vbmi")
}

/// `i16` plans of at most 16 entries per table (int4 / nf4 at depth 1, int2 at depth 2, ...):
/// the AVX2 kernel runs them (two 16-byte planes per `vpshufb`, on the paired layout: half the
/// index bytes of this kernel's plain layout), measured faster than the 512-bit `i16` kernel:
/// int4 4096 x 4096 at depth 1 on 2 threads 0.43 -> 0.31 ms.
fn small_i16(plan: &Plan) -> bool {
    plan.precision == TablePrecision::I16
        && plan.slot <= 16
        && plan.mirror.is_none()
        && super::avx2::AVX2.available()
}

/// True when every table of the plan fits a byte index (`V^d <= 256`).
pub(crate) fn byte_indices(plan: &Plan) -> bool {
    (plan.levels as u64)
        .checked_pow(plan.depth() as u32)
        .is_some_and(|e| e <= 256)
}

impl LutKernel for Avx512 {
    fn backend(&self) -> Backend {
        Backend::Avx512
    }

    fn available(&self) -> bool {
        cpu_ok()
    }

    fn supports(&self, plan: &Plan) -> bool {
        byte_indices(plan)
            && match plan.precision {
                TablePrecision::I8 => true,
                TablePrecision::I16 => plan.mirror.is_none(),
                // Tables of <= 32 floats live in two registers (vpermps / vpermt2ps); larger
                // ones would need gathers, which measured slower than the scalar kernel.
                TablePrecision::F32 => plan.slot <= 32,
            }
    }

    /// `i8` tables of 16-level codebooks at depth 2 and of 4-level ones at depth 4 (and the
    /// `i16` depths below, measured on the Intel VM of stop 16): a
    /// 256-entry table built in straight-line code (`table256`) and looked up through one
    /// folded `vpermi2b` per 64 rows. The table build costs about the same per tuple at every
    /// depth up to there, so fewer, larger tables win also where the operation-count model
    /// (which counts every table entry as an add) prefers smaller ones. Measured (Zen 4, 2
    /// threads, K = 4096, whole GEMV): depth 2 faster than the model's depth 1 for int4 at
    /// M = 64-1024 by 1.3-2.0x and for fp4 / uint4 / nf4 at M = 64 and 256 by 1.1-1.8x; int2
    /// depth 4 faster than the model's 2 or 3 at M = 64-512 by 1.1-1.9x (and the model's own
    /// choice from M = 1024). Other codebooks (ternary, int3) build their tables in
    /// the general path, whose cost grows with the entries: the model ranks their depths.
    fn preferred_depth(&self, levels: usize, precision: TablePrecision) -> Option<usize> {
        match (levels, precision) {
            (16, TablePrecision::I8) => Some(2),
            (4, TablePrecision::I8) => Some(4),
            // `i16` tables of at most 16 entries run on the AVX2 kernel with the AVX2 build
            // (`small_i16`); larger ones here with the scalar build. Measured (2 threads, K =
            // 4096): int4 depth 1 against 2 0.32 / 0.44 ms at M = 4096 and 0.030 / 0.157 ms at
            // M = 256; int2 depth 2 against 4 0.20 / 0.25 and 0.022 / 0.079 ms; ternary depth 2
            // against the model's 5 0.17 / 0.19 and 0.019 / 0.067 ms (depths 3-4: 0.15-0.16
            // and 0.05 ms).
            (16 | 4 | 3, TablePrecision::I16) if super::avx2::AVX2.available() => {
                Some(if levels == 16 { 1 } else { 2 })
            }
            _ => None,
        }
    }

    fn layout_kind(&self, plan: &Plan) -> LayoutKind {
        if small_i16(plan) {
            return super::avx2::AVX2.layout_kind(plan);
        }
        let fold = plan.precision == TablePrecision::I8
            && plan
                .mirror
                .is_some_and(|m| TileLayout::can_fold(plan.levels, plan.depth(), &m));
        if fold {
            LayoutKind::Folded
        } else {
            LayoutKind::Plain
        }
    }

    fn accumulate(&self, job: &RowJob<'_>, y: &mut [f32]) {
        if small_i16(job.plan) {
            return super::avx2::AVX2.accumulate(job, y);
        }
        assert!(
            !job.layout.folded || job.plan.precision == TablePrecision::I8,
            "folded layouts are read by the i8 kernel only"
        );
        assert!(
            !job.layout.paired,
            "paired layouts are read by the AVX2 kernel only"
        );
        let IndexData::U8(ix) = &job.layout.data else {
            unreachable!("supports() admits byte indices only")
        };
        // SAFETY: `accumulate` is only called when `available()` (the CPU has the features).
        unsafe {
            match &job.tables.data {
                TableData::I8(t) => run_i8(job, ix, t, y),
                TableData::I16(t) => run_i16(job, ix, t, y),
                TableData::F32(t) => run_f32(job, ix, t, y),
            }
        }
    }

    fn build_tables(&self, plan: &Plan, xt: &[f32], set: &mut TableSet, parallel: bool) -> bool {
        if small_i16(plan) {
            // The plans the AVX2 kernel runs (`accumulate`): its build (the same entries).
            // SAFETY: AVX2 is available (`small_i16` checks it).
            unsafe { super::avx2::build(plan, xt, set, parallel) };
            return true;
        }
        if plan.levels > 16 || plan.precision == TablePrecision::I16 || !cpu_ok() {
            return false;
        }
        build(plan, xt, set, parallel);
        true
    }
}

// ---------------------------------------------------------------------------------------------
// Mirror parameters
// ---------------------------------------------------------------------------------------------

const MIR_NONE: u8 = 0;
const MIR_XOR: u8 = 1;
const MIR_REV: u8 = 2;
/// Mirror-folded indices ([`TileLayout::fold`]): entry `T[idx & 0x7f]`, negated when the
/// top bit is set.
const MIR_FOLD: u8 = 3;

/// Per-tuple mirror constants: threshold `h = used_entries(r)` and the constant of the index
/// map (`xor` mask for sign-bit mirrors, `V^r - 1` for reversals), for the regular depth and
/// for the (possibly shorter) last tuple of a group.
#[derive(Clone, Copy)]
struct MirParams {
    kind: u8,
    h: [u32; 2],
    c: [u32; 2],
}

impl MirParams {
    fn new(plan: &Plan) -> MirParams {
        let tp = plan.tuples;
        match plan.mirror {
            None => MirParams {
                kind: MIR_NONE,
                h: [0; 2],
                c: [0; 2],
            },
            Some(mi) => {
                let cst = |r: usize| -> u32 {
                    match mi.involution {
                        Involution::SignBit => mi.index(0, r) as u32, // xor mask = mirror(0)
                        Involution::Reverse => (plan.levels.pow(r as u32) - 1) as u32,
                    }
                };
                let kind = match mi.involution {
                    Involution::SignBit => MIR_XOR,
                    Involution::Reverse => MIR_REV,
                };
                MirParams {
                    kind,
                    h: [
                        plan.used_entries(tp.depth) as u32,
                        plan.used_entries(tp.last_depth) as u32,
                    ],
                    c: [cst(tp.depth), cst(tp.last_depth)],
                }
            }
        }
    }
}

/// Number of zmm registers (64 bytes each) a byte table of `slot` entries needs: 1, 2 or 4.
fn zmm_count(slot: usize) -> usize {
    match slot {
        0..=64 => 1,
        65..=128 => 2,
        _ => 4,
    }
}

/// Byte masks of the 4 table registers for a table of `slot` bytes.
fn table_masks(slot: usize) -> [u64; 4] {
    let mut m = [0u64; 4];
    for (i, mi) in m.iter_mut().enumerate() {
        let n = slot.saturating_sub(64 * i).min(64);
        *mi = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
    }
    m
}

// ---------------------------------------------------------------------------------------------
// Byte lookups
// ---------------------------------------------------------------------------------------------

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn load_table<const NZ: usize>(p: *const u8, masks: &[u64; 4]) -> [__m512i; 4] {
    let mut t = [_mm512_setzero_si512(); 4];
    for (i, ti) in t.iter_mut().enumerate().take(NZ) {
        // SAFETY: masked-off bytes are not accessed; the rest lie inside the table slot.
        *ti = unsafe { _mm512_maskz_loadu_epi8(masks[i], p.add(64 * i) as *const i8) };
    }
    t
}

/// 64 byte lookups of `idx` (each `< 64 * NZ`) into a table of `NZ` registers.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn lut<const NZ: usize>(t: &[__m512i; 4], idx: __m512i) -> __m512i {
    match NZ {
        1 => _mm512_permutexvar_epi8(idx, t[0]),
        2 => _mm512_permutex2var_epi8(t[0], idx, t[1]),
        _ => {
            let lo = _mm512_permutex2var_epi8(t[0], idx, t[1]);
            let hi = _mm512_permutex2var_epi8(t[2], idx, t[3]);
            _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), lo, hi)
        }
    }
}

/// The looked-up entry of each lane with the mirror applied: `T[idx]` if `idx < h`, else
/// `-T[mirror(idx)]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn lut_mirror<const NZ: usize, const MIR: u8>(
    t: &[__m512i; 4],
    idx: __m512i,
    h: __m512i,
    c: __m512i,
) -> __m512i {
    unsafe {
        if MIR == MIR_NONE {
            return lut::<NZ>(t, idx);
        }
        if MIR == MIR_FOLD {
            // `vpermb` / `vpermi2b` read the low 6 / 7 bits; the prefix (<= 128 entries)
            // leaves bit 6 clear for one-register tables.
            let e = lut::<NZ>(t, idx);
            return _mm512_mask_sub_epi8(e, _mm512_movepi8_mask(idx), _mm512_setzero_si512(), e);
        }
        let m = _mm512_cmpge_epu8_mask(idx, h);
        let idx2 = if MIR == MIR_XOR {
            _mm512_mask_mov_epi8(idx, m, _mm512_xor_si512(idx, c))
        } else {
            _mm512_mask_sub_epi8(idx, m, c, idx)
        };
        let e = lut::<NZ>(t, idx2);
        _mm512_mask_sub_epi8(e, m, _mm512_setzero_si512(), e)
    }
}

/// Word permutations that bring the pairwise sums of `vpunpck[lh]bw` + `vpmaddubsw` back to
/// row order: the "lo" accumulator holds rows `16L + j`, the "hi" one rows `16L + 8 + j`
/// (`L` = 128-bit lane, `j < 8`). Returns the indices for rows 0..32 and 32..64.
fn unpermute_indices() -> ([i16; 32], [i16; 32]) {
    let mut a = [0i16; 32];
    let mut b = [0i16; 32];
    for q in 0..64usize {
        let lane = q / 16;
        let j = q % 16;
        let src = if j < 8 {
            8 * lane + j
        } else {
            32 + 8 * lane + (j - 8)
        };
        if q < 32 {
            a[q] = src as i16;
        } else {
            b[q - 32] = src as i16;
        }
    }
    (a, b)
}

// ---------------------------------------------------------------------------------------------
// Epilogue (contract order: u = P; u -= z*zsum; u *= tscale; y += s*u)
// ---------------------------------------------------------------------------------------------

/// 16 values from offset `i` of a tiled array, widened exactly from float16 bits where they
/// are stored so.
#[inline(always)]
pub(crate) unsafe fn load16(t: Tiled<'_>, i: usize) -> __m512 {
    // SAFETY: the callers keep `i + 16` inside the array (64 values per group and row block).
    unsafe {
        match t {
            Tiled::F32(v) => _mm512_loadu_ps(v.as_ptr().add(i)),
            Tiled::F16(h) => {
                _mm512_cvtph_ps(_mm256_loadu_si256(h.as_ptr().add(i) as *const __m256i))
            }
        }
    }
}

/// 16 zero points from offset `i` of the tiled layout (`Zeros::None` is never read: the
/// callers test `plan.zero_term`).
#[inline(always)]
pub(crate) unsafe fn zero_vec(z: Zeros<'_>, i: usize) -> __m512 {
    // SAFETY: a tiled array holds 64 floats per (group, row block); `i + 16` stays inside.
    unsafe {
        match z {
            Zeros::Tiled(t) => load16(t, i),
            Zeros::Uniform(v) => _mm512_set1_ps(v),
            Zeros::None => _mm512_setzero_ps(),
        }
    }
}

/// Index bytes `[offset, offset + len)` of the layout to prefetch while a tile runs
/// (software prefetch one tile ahead: the streams of a tile are 4 KiB apart, which the
/// hardware prefetchers follow poorly from DRAM).
#[derive(Clone, Copy)]
struct Prefetch {
    offset: usize,
    len: usize,
}

/// Prefetches the lines `[from, to)` (bytes, clipped to the region) of the next tile.
#[inline(always)]
unsafe fn prefetch_lines(base: *const u8, pf: Prefetch, from: usize, to: usize) {
    let to = to.min(pf.len);
    let mut o = from;
    while o < to {
        // SAFETY: prefetches never fault; the address lies inside the layout anyway.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(base.add(pf.offset + o) as *const i8) };
        o += 64;
    }
}

/// Runs `f(g, n, rb0, nrb)` over the job's (group, column, row-block tile) in contract order,
/// then the epilogue of each row block from the `i32` partial sums it left in `acc`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn drive_int(
    job: &RowJob<'_>,
    y: &mut [f32],
    max_tile: usize,
    mut f: impl FnMut(usize, usize, usize, usize, Prefetch, &mut [[i32; 64]; RB_TILE]),
) {
    let plan = job.plan;
    let tabs = job.tables;
    let rb_stride = plan.tuples.per_group * ROW_BLOCK;
    let mut acc = [[0i32; 64]; RB_TILE];
    for g in tabs.groups.clone() {
        for n in tabs.cols.clone() {
            let mut rb = job.row_blocks.start;
            while rb < job.row_blocks.end {
                // Tiles of 8, 4, 2 or 1 row blocks (the instantiated tile widths).
                let left = (job.row_blocks.end - rb).min(max_tile);
                let nrb = 1usize << left.ilog2();
                for a in acc.iter_mut().take(nrb) {
                    a.fill(0);
                }
                // The index bytes the next tile (in loop order) will read, to prefetch.
                let lay = job.layout;
                let next = if rb + nrb < job.row_blocks.end {
                    Some((rb + nrb, g))
                } else if n + 1 < tabs.cols.end {
                    Some((job.row_blocks.start, g))
                } else if g + 1 < tabs.groups.end {
                    Some((job.row_blocks.start, g + 1))
                } else {
                    None
                };
                let pf_next = next.map_or(Prefetch { offset: 0, len: 0 }, |(b, gg)| Prefetch {
                    offset: lay.slot(gg, b, 0),
                    len: (job.row_blocks.end - b).min(max_tile) * rb_stride,
                });
                // The next tile's scales (and zero points): short strided streams that the
                // hardware prefetchers miss; without this the epilogue stalls on them.
                if let Some((b, gg)) = next {
                    let off = (gg * plan.row_blocks + b) * ROW_BLOCK;
                    prefetch_epilogue(job, off, (job.row_blocks.end - b).min(max_tile));
                }
                f(g, n, rb, nrb, pf_next, &mut acc);
                for (i, a) in acc.iter().enumerate().take(nrb) {
                    let epi = block_epi(job, g, n, rb + i, y);
                    // SAFETY: 64-element arrays, 16 lanes at offset 16q.
                    let sums = std::array::from_fn(|q| unsafe {
                        _mm512_loadu_si512(a.as_ptr().add(16 * q) as *const __m512i)
                    });
                    unsafe { epilogue_block_i32(&epi, 0, sums) };
                }
                rb += nrb;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// i8 tables
// ---------------------------------------------------------------------------------------------

/// Tuples whose weighted int16 pair sums are accumulated before they are widened to int32
/// (the chunk over which the build keeps `sum m_p <= 258`).
const I8_CHUNK: usize = table::I8_CHUNK;

/// 64 byte lookups into a table of `NZ` registers without mirror (256 entries: two
/// `vpermi2b` and a blend on the index MSB).
#[inline(always)]
unsafe fn lut_plain<const NZ: usize>(t: &[__m512i; 4], idx: __m512i) -> __m512i {
    // SAFETY: the callers run with AVX-512 BW + VBMI enabled.
    unsafe { lut::<NZ>(t, idx) }
}

/// The table of one tuple in `NZ` registers: plain loads where the register is full, a
/// masked load for a partial last one.
#[inline(always)]
unsafe fn load_table_fast<const NZ: usize>(p: *const u8, masks: &[u64; 4]) -> [__m512i; 4] {
    // SAFETY: full registers lie inside the slot; masked-off bytes are not accessed.
    unsafe {
        let mut t = [_mm512_setzero_si512(); 4];
        for (i, ti) in t.iter_mut().enumerate().take(NZ) {
            *ti = if i + 1 < NZ || masks[i] == u64::MAX {
                _mm512_loadu_si512(p.add(64 * i) as *const __m512i)
            } else {
                _mm512_maskz_loadu_epi8(masks[i], p.add(64 * i) as *const i8)
            };
        }
        t
    }
}

/// Mirror constants of one tuple (`w` = 1 for the last tuple of a group).
#[derive(Clone, Copy)]
struct MirVec {
    h: [__m512i; 2],
    c: [__m512i; 2],
}

/// The entries of one tuple for 64 rows (`idx` from `p`), with the mirror applied.
#[inline(always)]
unsafe fn lookup<const NZ: usize, const MIR: u8>(
    t: &[__m512i; 4],
    p: *const u8,
    mv: &MirVec,
    w: usize,
) -> __m512i {
    // SAFETY: `p` points at 64 index bytes of the layout; features enabled by the callers.
    unsafe {
        let idx = _mm512_loadu_si512(p as *const __m512i);
        if MIR == MIR_NONE {
            lut_plain::<NZ>(t, idx)
        } else {
            lut_mirror::<NZ, MIR>(t, idx, mv.h[w], mv.c[w])
        }
    }
}

/// Adds the weighted pairwise int16 sums `m0 e0 + m1 e1` of two tuples' entries of one row
/// block to `acc` (`mul` holds the multipliers `(m0, m1)` in the two bytes of every 16-bit
/// lane; `acc[0]`: rows `16L + j`, `acc[1]`: rows `16L + 8 + j`, `L` the 128-bit lane, `j < 8`).
#[inline(always)]
unsafe fn add_pair(acc: &mut [__m512i; 2], e0: __m512i, e1: __m512i, mul: __m512i) {
    // SAFETY: features enabled by the callers.
    unsafe {
        let lo = _mm512_unpacklo_epi8(e0, e1);
        let hi = _mm512_unpackhi_epi8(e0, e1);
        acc[0] = _mm512_add_epi16(acc[0], _mm512_maddubs_epi16(mul, lo));
        acc[1] = _mm512_add_epi16(acc[1], _mm512_maddubs_epi16(mul, hi));
    }
}

/// One pair of tuples for one row block, 256-entry tables without mirror, in inline
/// assembly: the same instructions as [`lookup`] + [`add_pair`] (`vpermi2b` of each table
/// half, a blend on the index MSB, `vpunpck[lh]bw`, `vpmaddubsw`, `vpaddw`), but with
/// the tables, multipliers and accumulators pinned in registers (the compiler otherwise
/// copies table registers for `vpermt2b`, recomputes the MSB mask with a compare, and
/// spills accumulators).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn pair256(
    ta: &[__m512i; 4],
    tb: &[__m512i; 4],
    mult: __m512i,
    p: *const u8,
    acc: &mut [__m512i; 2],
) {
    // SAFETY: `p` points at 128 readable index bytes (two tuples of one row block); the
    // callers run with AVX-512 BW + VBMI enabled.
    unsafe {
        std::arch::asm!(
            "vmovdqu64 {x0}, zmmword ptr [{p}]",
            "vmovdqu64 {x1}, zmmword ptr [{p} + 64]",
            "vpmovb2m {k0}, {x0}",
            "vpmovb2m {k1}, {x1}",
            "vmovdqa64 {y0}, {x0}",
            "vmovdqa64 {y1}, {x1}",
            "vpermi2b {x0}, {a0}, {a1}",
            "vpermi2b {y0}, {a2}, {a3}",
            "vpermi2b {x1}, {b0}, {b1}",
            "vpermi2b {y1}, {b2}, {b3}",
            "vmovdqu8 {x0} {{{k0}}}, {y0}",
            "vmovdqu8 {x1} {{{k1}}}, {y1}",
            "vpunpcklbw {y0}, {x0}, {x1}",
            "vpunpckhbw {y1}, {x0}, {x1}",
            "vpmaddubsw {y0}, {m}, {y0}",
            "vpmaddubsw {y1}, {m}, {y1}",
            "vpaddw {c0}, {c0}, {y0}",
            "vpaddw {c1}, {c1}, {y1}",
            p = in(reg) p,
            a0 = in(zmm_reg) ta[0],
            a1 = in(zmm_reg) ta[1],
            a2 = in(zmm_reg) ta[2],
            a3 = in(zmm_reg) ta[3],
            b0 = in(zmm_reg) tb[0],
            b1 = in(zmm_reg) tb[1],
            b2 = in(zmm_reg) tb[2],
            b3 = in(zmm_reg) tb[3],
            m = in(zmm_reg) mult,
            c0 = inout(zmm_reg) acc[0],
            c1 = inout(zmm_reg) acc[1],
            x0 = out(zmm_reg) _,
            x1 = out(zmm_reg) _,
            y0 = out(zmm_reg) _,
            y1 = out(zmm_reg) _,
            k0 = out(kreg) _,
            k1 = out(kreg) _,
            options(nostack, readonly, preserves_flags),
        );
    }
}

/// [`pair256`] for mirror-folded indices and 128-entry tables: one `vpermi2b` per tuple
/// (the low 7 bits), then the entries of lanes whose index has the top bit set negated
/// (`vpsubb` from zero under the `vpmovb2m` mask): 12 vector operations per pair instead of 16.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn pair128_folded(
    ta: &[__m512i; 4],
    tb: &[__m512i; 4],
    mult: __m512i,
    p: *const u8,
    acc: &mut [__m512i; 2],
) {
    // SAFETY: `p` points at 128 readable index bytes (two tuples of one row block); the
    // callers run with AVX-512 BW + VBMI enabled.
    unsafe {
        std::arch::asm!(
            "vmovdqu64 {x0}, zmmword ptr [{p}]",
            "vmovdqu64 {x1}, zmmword ptr [{p} + 64]",
            "vpmovb2m {k0}, {x0}",
            "vpmovb2m {k1}, {x1}",
            "vpermi2b {x0}, {a0}, {a1}",
            "vpermi2b {x1}, {b0}, {b1}",
            "vpsubb {x0} {{{k0}}}, {z}, {x0}",
            "vpsubb {x1} {{{k1}}}, {z}, {x1}",
            "vpunpcklbw {y0}, {x0}, {x1}",
            "vpunpckhbw {y1}, {x0}, {x1}",
            "vpmaddubsw {y0}, {m}, {y0}",
            "vpmaddubsw {y1}, {m}, {y1}",
            "vpaddw {c0}, {c0}, {y0}",
            "vpaddw {c1}, {c1}, {y1}",
            p = in(reg) p,
            a0 = in(zmm_reg) ta[0],
            a1 = in(zmm_reg) ta[1],
            b0 = in(zmm_reg) tb[0],
            b1 = in(zmm_reg) tb[1],
            z = in(zmm_reg) _mm512_setzero_si512(),
            m = in(zmm_reg) mult,
            c0 = inout(zmm_reg) acc[0],
            c1 = inout(zmm_reg) acc[1],
            x0 = out(zmm_reg) _,
            x1 = out(zmm_reg) _,
            y0 = out(zmm_reg) _,
            y1 = out(zmm_reg) _,
            k0 = out(kreg) _,
            k1 = out(kreg) _,
            options(nostack, readonly, preserves_flags),
        );
    }
}

/// One group of `R` row blocks against one column's tables: the exact integer sums of every
/// row (int16 over each `I8_CHUNK` of tuples, widened to int32), then the epilogue into `y`
/// (`epi`). Each table load feeds `R` lookups. A group of one chunk goes from the int16
/// registers straight to the epilogue (the int32 round trip through memory cost ~16% of the
/// lookups at group size 32).
///
/// `rows[r]`: indices of tuple 0 of the group for row block `r`; `tab`: table of tuple 0, `mults`:
/// the tuples' multipliers. While it runs, the index lines `[pf.offset, pf.offset + pf.len)` of the next
/// tile are prefetched into L2.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[allow(clippy::too_many_arguments)]
unsafe fn i8_tile<const NZ: usize, const MIR: u8, const R: usize>(
    rows: &[*const u8; R],
    tab: *const u8,
    mults: *const u8,
    slot: usize,
    per_group: usize,
    masks: &[u64; 4],
    mp: &MirParams,
    perm: &(__m512i, __m512i),
    ix_base: *const u8,
    pf: Prefetch,
    epi: &TileEpi<'_>,
    sums: &mut [[i32; 64]; RB_TILE],
) {
    unsafe {
        let zero = _mm512_setzero_si512();
        let mv = MirVec {
            h: [
                _mm512_set1_epi8(mp.h[0] as i8),
                _mm512_set1_epi8(mp.h[1] as i8),
            ],
            c: [
                _mm512_set1_epi8(mp.c[0] as i8),
                _mm512_set1_epi8(mp.c[1] as i8),
            ],
        };
        let last = per_group - 1;
        // Prefetch `2 R` lines of the next tile per pair of tuples: the next tile has as many
        // index bytes as this one (or fewer), so the stream keeps pace.
        let mut pfp = ix_base.wrapping_add(pf.offset);
        let pf_end = pfp.wrapping_add(pf.len);
        let mut t0 = 0;
        while t0 < per_group {
            let end = (t0 + I8_CHUNK).min(per_group);
            let mut acc = [[zero; 2]; R];
            // Full pairs that do not contain the last tuple of the group (whose mirror
            // constants may differ); the rest after.
            let full_end = if MIR == MIR_NONE || MIR == MIR_FOLD || end < per_group {
                end
            } else {
                last
            };
            let mut t = t0;
            while t + 1 < full_end {
                if PF_ON && pfp < pf_end {
                    for i in 0..2 * R {
                        _mm_prefetch::<_MM_HINT_T1>(pfp.wrapping_add(64 * i) as *const i8);
                    }
                    pfp = pfp.wrapping_add(128 * R);
                }
                let ta = load_table_fast::<NZ>(tab.add(t * slot), masks);
                let tb = load_table_fast::<NZ>(tab.add((t + 1) * slot), masks);
                // The two tuples' multipliers, one per byte of every 16-bit lane.
                let mp2 = (mults.add(t) as *const i16).read_unaligned();
                let mul = _mm512_set1_epi16(mp2);
                for r in 0..R {
                    if NZ == 4 && MIR == MIR_NONE {
                        pair256(&ta, &tb, mul, rows[r].add(64 * t), &mut acc[r]);
                    } else if NZ == 2 && MIR == MIR_FOLD {
                        pair128_folded(&ta, &tb, mul, rows[r].add(64 * t), &mut acc[r]);
                    } else {
                        let e0 = lookup::<NZ, MIR>(&ta, rows[r].add(64 * t), &mv, 0);
                        let e1 = lookup::<NZ, MIR>(&tb, rows[r].add(64 * t + 64), &mv, 0);
                        add_pair(&mut acc[r], e0, e1, mul);
                    }
                }
                t += 2;
            }
            // Remaining tuples of the chunk (0, 1 or 2; the group's last one may be among
            // them), one at a time paired with zeros.
            while t < end {
                let w = usize::from(t == last);
                let ta = load_table::<NZ>(tab.add(t * slot), masks);
                let mul = _mm512_set1_epi16(i16::from(*mults.add(t)));
                for r in 0..R {
                    let e0 = lookup::<NZ, MIR>(&ta, rows[r].add(64 * t), &mv, w);
                    add_pair(&mut acc[r], e0, zero, mul);
                }
                t += 1;
            }
            if t0 == 0 && end == per_group {
                // One chunk: the epilogue straight from the registers.
                if !full_tile_epilogue(epi, &acc, perm) {
                    for (r, a) in acc.iter().enumerate() {
                        epilogue_block_i32(epi, r, widen_rows(a[0], a[1], perm));
                    }
                }
            } else {
                for r in 0..R {
                    widen16(acc[r][0], acc[r][1], perm, false, t0 > 0, &mut sums[r]);
                }
                if end == per_group {
                    for (r, sum) in sums.iter().enumerate().take(R) {
                        let p = std::array::from_fn(|q| {
                            _mm512_loadu_si512(sum.as_ptr().add(16 * q) as *const __m512i)
                        });
                        epilogue_block_i32(epi, r, p);
                    }
                }
            }
            t0 = end;
        }
    }
}

/// Widens the int16 pair accumulators `(lo, hi)` of one row block to int32 in row order
/// (times 256 when `shift8`: the high byte plane), stored into (`add = false`) or added to
/// (`add = true`) `out`.
#[inline(always)]
unsafe fn widen16(
    lo: __m512i,
    hi: __m512i,
    perm: &(__m512i, __m512i),
    shift8: bool,
    add: bool,
    out: &mut [i32; 64],
) {
    // SAFETY: features enabled by the callers; 64-element arrays, 16 lanes at offset 16q.
    unsafe {
        for (q, mut w) in widen_rows(lo, hi, perm).into_iter().enumerate() {
            if shift8 {
                w = _mm512_slli_epi32::<8>(w);
            }
            let p = out.as_mut_ptr().add(16 * q) as *mut __m512i;
            if add {
                w = _mm512_add_epi32(_mm512_loadu_si512(p), w);
            }
            _mm512_storeu_si512(p, w);
        }
    }
}

/// The int16 pair accumulators `(lo, hi)` of one row block as int32, rows `16q .. 16q + 16`
/// in vector `q`.
#[inline(always)]
unsafe fn widen_rows(lo: __m512i, hi: __m512i, perm: &(__m512i, __m512i)) -> [__m512i; 4] {
    // SAFETY: features enabled by the callers.
    unsafe {
        let nat = [
            _mm512_permutex2var_epi16(lo, perm.0, hi),
            _mm512_permutex2var_epi16(lo, perm.1, hi),
        ];
        [
            _mm512_cvtepi16_epi32(_mm512_castsi512_si256(nat[0])),
            _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64::<1>(nat[0])),
            _mm512_cvtepi16_epi32(_mm512_castsi512_si256(nat[1])),
            _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64::<1>(nat[1])),
        ]
    }
}

/// Prefetches the tiled scales (and zero points) of `blocks` row blocks from tiled offset
/// `off`: short strided streams that the hardware prefetchers miss; without this the epilogue
/// stalls on them.
#[inline(always)]
fn prefetch_epilogue(job: &RowJob<'_>, off: usize, blocks: usize) {
    prefetch_tiled(job.scales, job.zeros, off, blocks);
}

/// [`prefetch_epilogue`] for any kernel that reads these tiled scales and zero points.
#[inline(always)]
pub(crate) fn prefetch_tiled(scales: Tiled<'_>, zeros: Zeros<'_>, off: usize, blocks: usize) {
    let lines = |t: Tiled<'_>| {
        let per_line = 64 / t.elem_bytes();
        for i in 0..blocks * ROW_BLOCK / per_line {
            // SAFETY: prefetching never faults; SSE is part of x86-64.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(t.addr(off + per_line * i)) };
        }
    };
    lines(scales);
    if let Some(z) = zeros.tiled() {
        lines(z);
    }
}

/// The epilogue constants of one (group, column) for the rows of a tile.
pub(crate) struct TileEpi<'a> {
    pub plan: &'a Plan,
    pub scales: Tiled<'a>,
    pub zeros: Zeros<'a>,
    /// Offset of the tile's first row block in the tiled arrays.
    pub sz: usize,
    pub tsc: f32,
    pub zs: f32,
    /// `y` at the tile's first row (64 consecutive floats per row block).
    pub dst: *mut f32,
    /// Valid rows from the tile's first row on.
    pub rows: usize,
}

/// The epilogue of 16 rows (`lanes` of them valid) from their partial sums `u` (as floats),
/// in the contract's order: `u = P; u -= z*zsum; u *= tscale` (not for `f32` tables, whose
/// `tscale` is 1)`; y += s*u`. `i`: offset of the rows in the tiled arrays and in `dst`.
#[inline(always)]
pub(crate) unsafe fn epilogue16(e: &TileEpi<'_>, u: __m512, i: usize, lanes: usize) {
    // SAFETY: `e.scales` and the tiled zero points hold the rows `i .. i + lanes` (and 16
    // values from `i`); the rest as `epilogue16_with`.
    unsafe {
        let z = if e.plan.zero_term {
            zero_vec(e.zeros, e.sz + i)
        } else {
            _mm512_setzero_ps()
        };
        epilogue16_with(e, u, i, lanes, load16(e.scales, e.sz + i), z);
    }
}

/// [`epilogue16`] with the rows' scales `sc` and zero points `z` (read only with a zero
/// term) given: callers that run several columns against the same rows load them once.
#[inline(always)]
pub(crate) unsafe fn epilogue16_with(
    e: &TileEpi<'_>,
    u: __m512,
    i: usize,
    lanes: usize,
    sc: __m512,
    z: __m512,
) {
    // SAFETY: `e.dst` holds the rows `i .. i + lanes`; features enabled by the callers.
    unsafe {
        let su = scaled16(e.plan, e.zs, e.tsc, u, sc, z);
        let yp = e.dst.add(i);
        if lanes == 16 {
            _mm512_storeu_ps(yp, _mm512_add_ps(_mm512_loadu_ps(yp), su));
        } else {
            let m: __mmask16 = (1u16 << lanes) - 1;
            let yv = _mm512_maskz_loadu_ps(m, yp);
            _mm512_mask_storeu_ps(yp, m, _mm512_add_ps(yv, su));
        }
    }
}

/// The term `s*u` that [`epilogue16_with`] adds to 16 rows, in the contract's order: `u = P;
/// u -= z*zsum; u *= tscale` (not for `f32` tables)`; s*u`.
#[inline(always)]
pub(crate) unsafe fn scaled16(
    plan: &Plan,
    zs: f32,
    tsc: f32,
    mut u: __m512,
    sc: __m512,
    z: __m512,
) -> __m512 {
    // SAFETY: register operations; AVX-512 F enabled by the callers.
    unsafe {
        if plan.zero_term {
            u = _mm512_sub_ps(u, _mm512_mul_ps(z, _mm512_set1_ps(zs)));
        }
        if plan.precision != TablePrecision::F32 {
            u = _mm512_mul_ps(u, _mm512_set1_ps(tsc));
        }
        _mm512_mul_ps(sc, u)
    }
}

/// 16 consecutive float32 values of a tiled array (scales or zero points), or one value for
/// every row, with the variant fixed at compile time.
trait Rows16: Copy {
    /// Values `i .. i + 16` from the tile's start.
    unsafe fn at(self, i: usize) -> __m512;
}

#[derive(Clone, Copy)]
struct RowsF32(*const f32);
#[derive(Clone, Copy)]
struct RowsF16(*const u16);
#[derive(Clone, Copy)]
struct RowsSplat(__m512);

impl Rows16 for RowsF32 {
    #[inline(always)]
    unsafe fn at(self, i: usize) -> __m512 {
        // SAFETY: the callers keep `i + 16` inside the tile's rows.
        unsafe { _mm512_loadu_ps(self.0.add(i)) }
    }
}
impl Rows16 for RowsF16 {
    #[inline(always)]
    unsafe fn at(self, i: usize) -> __m512 {
        // SAFETY: as above; float16 bits widened exactly.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(self.0.add(i) as *const __m256i)) }
    }
}
impl Rows16 for RowsSplat {
    #[inline(always)]
    unsafe fn at(self, _: usize) -> __m512 {
        self.0
    }
}

/// The `i8` epilogue of `R` whole row blocks (every row below `M`) from their int16 pair
/// accumulators, with the scale and zero-point variants fixed at compile time: the
/// contract's operations of [`epilogue16_with`] (`u = P; u -= z*zsum; u *= tscale; y +=
/// s*u`, separate roundings), without its per-vector tests of the plan, the variants and the
/// valid lanes: with groups of 16 those took about a tenth of a one-thread GEMV (int4
/// 4096 x 4096: 452-460 -> 411-419 us; groups of 32 367-371 -> 344-347 us).
#[inline(always)]
unsafe fn epilogue_tile<const R: usize, const ZT: bool, S: Rows16, Z: Rows16>(
    e: &TileEpi<'_>,
    acc: &[[__m512i; 2]; R],
    perm: &(__m512i, __m512i),
    sc: S,
    z: Z,
) {
    // SAFETY: the caller checked that the tile's `64 R` rows are below `M`, so `e.dst` and the
    // tiled arrays hold them; features enabled by the callers.
    unsafe {
        let tsc = _mm512_set1_ps(e.tsc);
        let zs = _mm512_set1_ps(e.zs);
        for (r, a) in acc.iter().enumerate() {
            for (q, p) in widen_rows(a[0], a[1], perm).into_iter().enumerate() {
                let i = 64 * r + 16 * q;
                let mut u = _mm512_cvtepi32_ps(p);
                if ZT {
                    u = _mm512_sub_ps(u, _mm512_mul_ps(z.at(i), zs));
                }
                u = _mm512_mul_ps(u, tsc);
                let yp = e.dst.add(i);
                _mm512_storeu_ps(
                    yp,
                    _mm512_add_ps(_mm512_loadu_ps(yp), _mm512_mul_ps(sc.at(i), u)),
                );
            }
        }
    }
}

/// [`epilogue_tile`] for the tile's variants, when every row of the tile is below `M` and the
/// tables are `i8` (false otherwise: the caller runs the general epilogue).
#[inline(always)]
unsafe fn full_tile_epilogue<const R: usize>(
    e: &TileEpi<'_>,
    acc: &[[__m512i; 2]; R],
    perm: &(__m512i, __m512i),
) -> bool {
    if e.rows < 64 * R || e.plan.precision == TablePrecision::F32 {
        return false;
    }
    // SAFETY: every row of the tile is below `M` (checked above); the tiled arrays hold
    // `64 R` values from `e.sz`.
    unsafe {
        macro_rules! with_zeros {
            ($sc:expr) => {
                match (e.plan.zero_term, e.zeros) {
                    (false, _) | (true, Zeros::None) => epilogue_tile::<R, false, _, _>(
                        e,
                        acc,
                        perm,
                        $sc,
                        RowsSplat(_mm512_setzero_ps()),
                    ),
                    (true, Zeros::Uniform(v)) => epilogue_tile::<R, true, _, _>(
                        e,
                        acc,
                        perm,
                        $sc,
                        RowsSplat(_mm512_set1_ps(v)),
                    ),
                    (true, Zeros::Tiled(Tiled::F32(z))) => epilogue_tile::<R, true, _, _>(
                        e,
                        acc,
                        perm,
                        $sc,
                        RowsF32(z.as_ptr().add(e.sz)),
                    ),
                    (true, Zeros::Tiled(Tiled::F16(z))) => epilogue_tile::<R, true, _, _>(
                        e,
                        acc,
                        perm,
                        $sc,
                        RowsF16(z.as_ptr().add(e.sz)),
                    ),
                }
            };
        }
        match e.scales {
            Tiled::F32(s) => with_zeros!(RowsF32(s.as_ptr().add(e.sz))),
            Tiled::F16(s) => with_zeros!(RowsF16(s.as_ptr().add(e.sz))),
        }
    }
    true
}

/// The epilogue of row block `r` of a tile from its sums in row order (16 rows per vector).
#[inline(always)]
unsafe fn epilogue_block(e: &TileEpi<'_>, r: usize, sums: [__m512; 4]) {
    for (q, u) in sums.into_iter().enumerate() {
        let lanes = e.rows.saturating_sub(64 * r + 16 * q).min(16);
        if lanes == 0 {
            break;
        }
        // SAFETY: as `epilogue16`.
        unsafe { epilogue16(e, u, 64 * r + 16 * q, lanes) };
    }
}

/// `epilogue_block` from int32 sums.
#[inline(always)]
unsafe fn epilogue_block_i32(e: &TileEpi<'_>, r: usize, sums: [__m512i; 4]) {
    // SAFETY: as `epilogue16`.
    unsafe { epilogue_block(e, r, sums.map(|p| _mm512_cvtepi32_ps(p))) }
}

/// The epilogue constants of row block `b` of a job against one (group, column) block.
#[inline(always)]
fn block_epi<'a>(job: &RowJob<'a>, g: usize, n: usize, b: usize, y: &mut [f32]) -> TileEpi<'a> {
    let plan = job.plan;
    let gn = job.tables.gn(g, n);
    let sz = (g * plan.row_blocks + b) * ROW_BLOCK;
    let y0 = n * job.span() + b * ROW_BLOCK - job.row_blocks.start * ROW_BLOCK;
    TileEpi {
        plan,
        scales: job.scales,
        zeros: job.zeros,
        sz,
        tsc: job.tables.tscale[gn],
        zs: job.tables.zsum[gn],
        dst: y.as_mut_ptr().wrapping_add(y0),
        rows: plan.m - b * ROW_BLOCK,
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
fn perm_vectors() -> (__m512i, __m512i) {
    let (a, b) = unpermute_indices();
    // SAFETY: plain unaligned loads of 64-byte arrays (AVX-512F is checked by the caller).
    unsafe {
        (
            _mm512_loadu_si512(a.as_ptr() as *const __m512i),
            _mm512_loadu_si512(b.as_ptr() as *const __m512i),
        )
    }
}

macro_rules! dispatch_nz_mir {
    ($nz:expr, $mir:expr, $f:ident, $($args:expr),*) => {
        match ($nz, $mir) {
            (1, MIR_NONE) => $f::<1, MIR_NONE>($($args),*),
            (1, MIR_XOR) => $f::<1, MIR_XOR>($($args),*),
            (1, _) => $f::<1, MIR_REV>($($args),*),
            (2, MIR_NONE) => $f::<2, MIR_NONE>($($args),*),
            (2, MIR_XOR) => $f::<2, MIR_XOR>($($args),*),
            (2, _) => $f::<2, MIR_REV>($($args),*),
            (_, MIR_NONE) => $f::<4, MIR_NONE>($($args),*),
            (_, MIR_XOR) => $f::<4, MIR_XOR>($($args),*),
            (_, _) => $f::<4, MIR_REV>($($args),*),
        }
    };
}

#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn run_i8(job: &RowJob<'_>, ix: &[u8], tab: &[i8], y: &mut [f32]) {
    let plan = job.plan;
    let nz = zmm_count(plan.slot);
    let mp = MirParams::new(plan);
    if job.layout.folded {
        // SAFETY: as below; a folded layout has tables of at most 128 entries.
        return unsafe {
            match nz {
                1 => run_i8_t::<1, MIR_FOLD>(job, ix, tab, y, &mp),
                _ => run_i8_t::<2, MIR_FOLD>(job, ix, tab, y, &mp),
            }
        };
    }
    unsafe { dispatch_nz_mir!(nz, mp.kind, run_i8_t, job, ix, tab, y, &mp) }
}

/// The i8 driver: for each group, the job's row blocks in tiles of `RB_TILE` (then 4, then
/// single blocks), each swept over the columns one after the other (the tile's indices stay in L1),
/// its integer sums then the epilogue into the job's column-major `y` (16 consecutive floats
/// per store); the float operations on every `y[m, n]` are the contract's, in group order.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn run_i8_t<const NZ: usize, const MIR: u8>(
    job: &RowJob<'_>,
    ix: &[u8],
    tab: &[i8],
    y: &mut [f32],
    mp: &MirParams,
) {
    let plan = job.plan;
    let tabs = job.tables;
    let lay = job.layout;
    let slot = plan.slot;
    let masks = table_masks(slot);
    let perm = perm_vectors();
    let pg = plan.tuples.per_group;
    let rb_stride = pg * ROW_BLOCK;
    let rbs = job.row_blocks.clone();
    let cols = tabs.cols.clone();
    // Int32 sums of the row blocks of a tile, for groups longer than one int16 chunk (every
    // chunk's widening writes them before they are read).
    let mut sums = [[0i32; 64]; RB_TILE];
    let ib = ix.as_ptr();
    let tb = tab.as_ptr() as *const u8;
    for g in tabs.groups.clone() {
        let mut rb = rbs.start;
        while rb < rbs.end {
            // Tiles of 8 row blocks, then 4, then single blocks.
            let left = rbs.end - rb;
            let nrb = if left >= RB_TILE {
                RB_TILE
            } else if left >= 4 {
                4
            } else {
                1
            };
            // The next tile (in loop order), to prefetch while the first column runs.
            let next = if rb + nrb < rbs.end {
                Some((rb + nrb, g))
            } else if g + 1 < tabs.groups.end {
                Some((rbs.start, g + 1))
            } else {
                None
            };
            let pf = next.map_or(Prefetch { offset: 0, len: 0 }, |(b, gg)| Prefetch {
                offset: lay.slot(gg, b, 0),
                len: (rbs.end - b).min(RB_TILE) * rb_stride,
            });
            if let Some((b, gg)) = next {
                // The next tile's scales and zero points: short strided streams that the
                // hardware prefetchers miss.
                let off = (gg * plan.row_blocks + b) * ROW_BLOCK;
                prefetch_epilogue(job, off, (rbs.end - b).min(RB_TILE));
            }
            let row_ptr = |r: usize| unsafe { ib.add(lay.slot(g, rb + r, 0)) };
            // Columns one after the other over the same row tile: its indices (`nrb` x 4 KiB
            // for int4 g128) are loaded from memory once and re-read from L1 for the other
            // columns; each column's tables stream from L2.
            for n in cols.clone() {
                let tab_ptr = unsafe { tb.add(tabs.offset(g, n, 0)) };
                let mult_ptr = tabs.mults(g, n).as_ptr();
                let pfn = if n == cols.start {
                    pf
                } else {
                    Prefetch { offset: 0, len: 0 }
                };
                let epi = block_epi(job, g, n, rb, y);
                macro_rules! tile {
                    ($r:literal) => {
                        unsafe {
                            i8_tile::<NZ, MIR, $r>(
                                &std::array::from_fn(row_ptr),
                                tab_ptr,
                                mult_ptr,
                                slot,
                                pg,
                                &masks,
                                mp,
                                &perm,
                                ib,
                                pfn,
                                &epi,
                                &mut sums,
                            )
                        }
                    };
                }
                match nrb {
                    RB_TILE => tile!(8),
                    4 => tile!(4),
                    _ => tile!(1),
                }
            }
            rb += nrb;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// i16 tables (byte planes)
// ---------------------------------------------------------------------------------------------

/// Splits the `per_group` i16 tables of one (group, column) into byte planes:
/// `planes[t*512 .. +256]` low bytes, `planes[t*512 + 256 .. +256]` high bytes (zero past
/// `slot`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn split_planes(tab: *const i16, slot: usize, per_group: usize, planes: &mut [u8]) {
    unsafe {
        for t in 0..per_group {
            let src = tab.add(t * slot);
            let dst = planes.as_mut_ptr().add(t * 512);
            for q in 0..8 {
                let n = slot.saturating_sub(32 * q).min(32);
                let m: __mmask32 = if n == 32 { u32::MAX } else { (1u32 << n) - 1 };
                let w = _mm512_maskz_loadu_epi16(m, src.add(32 * q));
                let lo = _mm512_cvtepi16_epi8(w);
                let hi = _mm512_cvtepi16_epi8(_mm512_srai_epi16::<8>(w));
                _mm256_storeu_si256(dst.add(32 * q) as *mut __m256i, lo);
                _mm256_storeu_si256(dst.add(256 + 32 * q) as *mut __m256i, hi);
            }
        }
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[allow(clippy::too_many_arguments)]
unsafe fn i16_tile<const NZ: usize, const R: usize>(
    ix_base: *const u8,
    pf: Prefetch,
    ix: *const u8,
    rb_stride: usize,
    planes: *const u8,
    per_group: usize,
    masks: &[u64; 4],
    perm: &(__m512i, __m512i),
    acc: &mut [[i32; 64]; RB_TILE],
) {
    unsafe {
        let ones = _mm512_set1_epi8(1);
        let zero = _mm512_setzero_si512();
        let mut t = 0;
        while t < per_group {
            // Low bytes: pair sums <= 510, so at most 64 pairs per int16 chunk.
            let end = (t + 128).min(per_group);
            let mut acc_l = [[zero; 2]; R];
            let mut acc_h = [[zero; 2]; R];
            while t < end {
                prefetch_lines(ix_base, pf, t * 64 * R, (t + 2) * 64 * R);
                let two = t + 1 < end;
                let mut el = [[zero; 2]; R];
                let mut eh = [[zero; 2]; R];
                for (k, tt) in [t, t + 1].into_iter().enumerate() {
                    if k == 1 && !two {
                        break;
                    }
                    let tl = load_table::<NZ>(planes.add(tt * 512), masks);
                    let th = load_table::<NZ>(planes.add(tt * 512 + 256), masks);
                    for r in 0..R {
                        let idx =
                            _mm512_loadu_si512(ix.add(r * rb_stride + tt * 64) as *const __m512i);
                        el[r][k] = lut::<NZ>(&tl, idx);
                        eh[r][k] = lut::<NZ>(&th, idx);
                    }
                }
                for r in 0..R {
                    let l0 = _mm512_unpacklo_epi8(el[r][0], el[r][1]);
                    let l1 = _mm512_unpackhi_epi8(el[r][0], el[r][1]);
                    acc_l[r][0] = _mm512_add_epi16(acc_l[r][0], _mm512_maddubs_epi16(l0, ones));
                    acc_l[r][1] = _mm512_add_epi16(acc_l[r][1], _mm512_maddubs_epi16(l1, ones));
                    let h0 = _mm512_unpacklo_epi8(eh[r][0], eh[r][1]);
                    let h1 = _mm512_unpackhi_epi8(eh[r][0], eh[r][1]);
                    acc_h[r][0] = _mm512_add_epi16(acc_h[r][0], _mm512_maddubs_epi16(ones, h0));
                    acc_h[r][1] = _mm512_add_epi16(acc_h[r][1], _mm512_maddubs_epi16(ones, h1));
                }
                t += 2;
            }
            t = end;
            for r in 0..R {
                widen16(acc_l[r][0], acc_l[r][1], perm, false, true, &mut acc[r]);
                widen16(acc_h[r][0], acc_h[r][1], perm, true, true, &mut acc[r]);
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn run_i16(job: &RowJob<'_>, ix: &[u8], tab: &[i16], y: &mut [f32]) {
    let plan = job.plan;
    match zmm_count(plan.slot) {
        1 => unsafe { run_i16_t::<1>(job, ix, tab, y) },
        2 => unsafe { run_i16_t::<2>(job, ix, tab, y) },
        _ => unsafe { run_i16_t::<4>(job, ix, tab, y) },
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn run_i16_t<const NZ: usize>(job: &RowJob<'_>, ix: &[u8], tab: &[i16], y: &mut [f32]) {
    let plan = job.plan;
    let tabs = job.tables;
    let lay = job.layout;
    let slot = plan.slot;
    let masks = table_masks(slot);
    let perm = perm_vectors();
    let pg = plan.tuples.per_group;
    let stride = pg * ROW_BLOCK;
    let mut planes = vec![0u8; pg * 512];
    let mut cur: Option<(usize, usize)> = None;
    unsafe {
        drive_int(job, y, 4, |g, n, rb, nrb, pf, acc| {
            let ib = ix.as_ptr();
            if cur != Some((g, n)) {
                split_planes(
                    tab.as_ptr().add(tabs.offset(g, n, 0)),
                    slot,
                    pg,
                    &mut planes,
                );
                cur = Some((g, n));
            }
            let ip = ix.as_ptr().add(lay.slot(g, rb, 0));
            let pp = planes.as_ptr();
            match nrb {
                4 => i16_tile::<NZ, 4>(ib, pf, ip, stride, pp, pg, &masks, &perm, acc),
                2 => i16_tile::<NZ, 2>(ib, pf, ip, stride, pp, pg, &masks, &perm, acc),
                _ => i16_tile::<NZ, 1>(ib, pf, ip, stride, pp, pg, &masks, &perm, acc),
            }
        });
    }
}

// ---------------------------------------------------------------------------------------------
// f32 tables
// ---------------------------------------------------------------------------------------------

const F32_PERM1: u8 = 0; // <= 16 entries: vpermps
const F32_PERM2: u8 = 1; // <= 32 entries: vpermt2ps

#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn run_f32(job: &RowJob<'_>, ix: &[u8], tab: &[f32], y: &mut [f32]) {
    let plan = job.plan;
    let mp = MirParams::new(plan);
    let kind = if plan.slot <= 16 {
        F32_PERM1
    } else {
        F32_PERM2
    };
    unsafe {
        match (kind, mp.kind) {
            (F32_PERM1, MIR_NONE) => run_f32_t::<F32_PERM1, MIR_NONE>(job, ix, tab, y, &mp),
            (F32_PERM1, MIR_XOR) => run_f32_t::<F32_PERM1, MIR_XOR>(job, ix, tab, y, &mp),
            (F32_PERM1, _) => run_f32_t::<F32_PERM1, MIR_REV>(job, ix, tab, y, &mp),
            (_, MIR_NONE) => run_f32_t::<F32_PERM2, MIR_NONE>(job, ix, tab, y, &mp),
            (_, MIR_XOR) => run_f32_t::<F32_PERM2, MIR_XOR>(job, ix, tab, y, &mp),
            (_, _) => run_f32_t::<F32_PERM2, MIR_REV>(job, ix, tab, y, &mp),
        }
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn run_f32_t<const KIND: u8, const MIR: u8>(
    job: &RowJob<'_>,
    ix: &[u8],
    tab: &[f32],
    y: &mut [f32],
    mp: &MirParams,
) {
    let plan = job.plan;
    let tabs = job.tables;
    let lay = job.layout;
    let slot = plan.slot;
    let pg = plan.tuples.per_group;
    let m0 = mask16(slot);
    let m1: __mmask16 = if slot >= 32 {
        0xffff
    } else if slot > 16 {
        (1u16 << (slot - 16)) - 1
    } else {
        0
    };
    unsafe {
        let sign = _mm512_set1_epi32(i32::MIN);
        let hv = [
            _mm512_set1_epi32(mp.h[0] as i32),
            _mm512_set1_epi32(mp.h[1] as i32),
        ];
        let cv = [
            _mm512_set1_epi32(mp.c[0] as i32),
            _mm512_set1_epi32(mp.c[1] as i32),
        ];
        for g in tabs.groups.clone() {
            for n in tabs.cols.clone() {
                let tp = tab.as_ptr().add(tabs.offset(g, n, 0));
                for b in job.row_blocks.clone() {
                    let ip = ix.as_ptr().add(lay.slot(g, b, 0));
                    let mut acc = [_mm512_setzero_ps(); 4];
                    for t in 0..pg {
                        let w = usize::from(t + 1 == pg);
                        let tt = tp.add(t * slot);
                        let t0 = _mm512_maskz_loadu_ps(m0, tt);
                        let t1 = if KIND == F32_PERM1 {
                            _mm512_setzero_ps()
                        } else {
                            _mm512_maskz_loadu_ps(m1, tt.add(16))
                        };
                        for (q, a) in acc.iter_mut().enumerate() {
                            let bytes = _mm_loadu_si128(ip.add(t * 64 + 16 * q) as *const __m128i);
                            let idx = _mm512_cvtepu8_epi32(bytes);
                            let (idx2, m) = match MIR {
                                MIR_NONE => (idx, 0),
                                MIR_XOR => {
                                    let m = _mm512_cmpge_epu32_mask(idx, hv[w]);
                                    (_mm512_mask_xor_epi32(idx, m, idx, cv[w]), m)
                                }
                                _ => {
                                    let m = _mm512_cmpge_epu32_mask(idx, hv[w]);
                                    (_mm512_mask_sub_epi32(idx, m, cv[w], idx), m)
                                }
                            };
                            let mut e = if KIND == F32_PERM1 {
                                _mm512_permutexvar_ps(idx2, t0)
                            } else {
                                _mm512_permutex2var_ps(t0, idx2, t1)
                            };
                            if MIR != MIR_NONE {
                                let ei = _mm512_castps_si512(e);
                                e = _mm512_castsi512_ps(_mm512_mask_xor_epi32(ei, m, ei, sign));
                            }
                            *a = _mm512_add_ps(*a, e);
                        }
                    }
                    epilogue_block(&block_epi(job, g, n, b, y), 0, acc);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Table build (f32 and i8; V <= 16)
// ---------------------------------------------------------------------------------------------

/// `(group, column)` blocks per parallel task of a table build (a block is a few
/// microseconds of work; one task each cost about as much again in scheduling).
const MIN_BLOCKS_PER_TASK: usize = 4;

fn build(plan: &Plan, xt: &[f32], set: &mut TableSet, parallel: bool) {
    let blen = set.block_len();
    let digits = digit_vectors(plan);
    let digits = &digits;
    let ext = code_extremes(plan);
    let xg = table::block_activations(plan, set, xt);
    let per_group = plan.tuples.per_group;
    let meta: Vec<(f32, f32)> = match &mut set.data {
        TableData::F32(d) => {
            map_blocks(d, blen, None, parallel, MIN_BLOCKS_PER_TASK, |i, out, _| {
                // SAFETY: `build_tables` checked the CPU features.
                unsafe { build_block_f32(plan, xg(i), out, digits) }
            })
        }
        TableData::I8(d) => map_blocks(
            d,
            blen,
            Some((&mut set.mult, per_group)),
            parallel,
            MIN_BLOCKS_PER_TASK,
            // SAFETY: as above.
            |i, out, mult| unsafe { build_block_i8(plan, xg(i), out, mult, digits, ext) },
        ),
        TableData::I16(_) => unreachable!("no SIMD build for i16 tables"),
    };
    set.set_meta(meta);
}

#[inline(always)]
fn mask16(n: usize) -> __mmask16 {
    if n >= 16 {
        0xffff
    } else {
        (1u16 << n) - 1
    }
}

/// `digits[j * len + i]` = digit `j` (base V) of table index `i`, `i < len = 64 * ceil(slot/64)`.
fn digit_vectors(plan: &Plan) -> Vec<u32> {
    let v = plan.levels as u32;
    let d = plan.depth();
    let len = plan.slot.div_ceil(64) * 64;
    let mut out = vec![0u32; d * len];
    // Counters instead of `(i / V^j) % V`: the two integer divisions per entry were most of
    // the time of a build call outside the blocks (~2 us per call).
    for (j, row) in out.chunks_exact_mut(len).enumerate() {
        let p = v.pow(j as u32);
        let (mut digit, mut run) = (0u32, 0u32);
        for o in row {
            *o = digit;
            run += 1;
            if run == p {
                run = 0;
                digit = if digit + 1 == v { 0 } else { digit + 1 };
            }
        }
    }
    out
}

/// Entries `16q .. 16q + 16` of a table over its first `nd` digits, summed left to right
/// (`vpermps` picks each digit's product from `prod`). With `nd` a constant the loop unrolls.
///
/// # Safety
/// AVX-512 F; `digits` holds `nd` rows of `dlen` entries with `16q + 16 <= dlen`, and
/// `nd <= prod.len()`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn digit_sum(prod: &[__m512], digits: &[u32], dlen: usize, q: usize, nd: usize) -> __m512 {
    // SAFETY: in bounds by the contract above.
    let dig = |j: usize| unsafe {
        _mm512_loadu_si512(digits.as_ptr().add(j * dlen + 16 * q) as *const __m512i)
    };
    let mut e = _mm512_permutexvar_ps(dig(0), prod[0]);
    // Index loops on purpose: iterator adaptors over vectors were not inlined here.
    #[allow(clippy::needless_range_loop)]
    for j in 1..nd {
        e = _mm512_add_ps(e, _mm512_permutexvar_ps(dig(j), prod[j]));
    }
    e
}

/// Packs four chunks of rounded entries (`q4`, 64 int32) to bytes and stores those of the
/// 64-entry block at `o` that lie below `used`.
///
/// # Safety
/// AVX-512 BW; `dst` is writable for `used` bytes and `o < used`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn store_block_i8(dst: *mut i8, o: usize, used: usize, q4: [__m512i; 4]) {
    let n = (used - o).min(64);
    let m = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
    // SAFETY: the masked store writes bytes `o .. o + n`, inside `used`.
    unsafe { _mm512_mask_storeu_epi8(dst.add(o), m, pack_i8(q4)) };
}

/// Calls `emit(q, e)` with the 16 f32 entries `16q .. 16q + 16` of the depth-`r` table of the
/// activations `xs` (`r = xs.len()`), for every `q < 4 * ceil(used/64)` (whole groups of four
/// chunks; lanes past `used` are garbage). Every entry is the left-to-right sum
/// `((v'[c0] x0 + v'[c1] x1) + ...)` of `table::build_f32_table`, computed in registers:
/// `vpermps` picks each digit's product.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn table_entries(
    plan: &Plan,
    vals: __m512,
    digits: &[u32],
    xs: &[f32],
    mut emit: impl FnMut(usize, __m512),
) {
    let r = xs.len();
    let used = plan.used_entries(r);
    let chunks = used.div_ceil(64) * 4;
    let dlen = plan.slot.div_ceil(64) * 64;
    let p0 = _mm512_mul_ps(vals, _mm512_set1_ps(xs[0]));
    if r == 1 {
        for q in 0..chunks {
            emit(q, p0);
        }
        return;
    }
    let mut prod = [p0; 8];
    for j in 1..r {
        prod[j] = _mm512_mul_ps(vals, _mm512_set1_ps(xs[j]));
    }
    // SAFETY: `digits` holds `depth * dlen` entries and `16q + 16 <= dlen`.
    let partial = |q: usize, nd: usize| unsafe { digit_sum(&prod, digits, dlen, q, nd) };
    let lower = plan.levels.pow(r as u32 - 1);
    if lower.is_multiple_of(16) {
        // The last digit is constant over each 16-entry chunk: entry `c * lower + i` =
        // (sum over the first r-1 digits at i) + v'[c] x_{r-1}, so the first r-1 digits are
        // built once (`lower / 16` vectors) and each chunk is one broadcast add.
        let nb = lower / 16;
        let mut base = [p0; 16];
        #[allow(clippy::needless_range_loop)]
        for q in 0..nb {
            base[q] = partial(q, r - 1);
        }
        // The last digit's products through memory, added with a broadcast operand (a load,
        // where a broadcast from a register is a shuffle; see `add_broadcast`).
        let mut lasts = [0f32; 16];
        // SAFETY: a 16-float store; `c < 16` indexes `lasts`.
        unsafe { _mm512_storeu_ps(lasts.as_mut_ptr(), prod[r - 1]) };
        for q in 0..chunks {
            // Digits past the codebook (chunks of unused entries) read a zero product.
            let c = (q / nb).min(15);
            emit(q, unsafe {
                add_broadcast(base[q % nb], lasts.as_ptr().add(c))
            });
        }
        return;
    }
    for q in 0..chunks {
        emit(q, partial(q, r));
    }
}

/// The full-depth tuples' entries of a table whose last digit is not constant over 16-entry
/// chunks (`V^(R-1)` not a multiple of 16: ternary depth 3-5, ...), rounded into `dst`: the
/// general path of [`table_entries`] with the depth `R` a constant, so that the digit loop
/// unrolls (with a run-time depth it kept a compare and branch per digit and per chunk, about
/// half of the ternary build). Same operations in the same order: the same bits.
///
/// # Safety
/// AVX-512 BW + VBMI; `digits` holds `R * dlen` entries, `dst` the tuple's `used` bytes, and
/// `R <= 8`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
#[allow(clippy::too_many_arguments)]
unsafe fn general_entries<const R: usize>(
    vals: __m512,
    xs: &[f32],
    digits: &[u32],
    dlen: usize,
    used: usize,
    rv: __m512,
    dst: *mut i8,
) {
    let prod: [__m512; R] = std::array::from_fn(|j| _mm512_mul_ps(vals, _mm512_set1_ps(xs[j])));
    for b in 0..used.div_ceil(64) {
        // SAFETY: the digit rows are padded to whole 64-entry blocks (`16q + 16 <= dlen`).
        let e = |c: usize| unsafe { digit_sum(&prod, digits, dlen, 4 * b + c, R) };
        // round-to-nearest-even (the MXCSR default), as `round_ties_even`.
        let r = |c: usize| _mm512_cvtps_epi32(_mm512_mul_ps(e(c), rv));
        let q4 = [r(0), r(1), r(2), r(3)];
        // SAFETY: `dst` holds the tuple's `used` bytes.
        unsafe { store_block_i8(dst, 64 * b, used, q4) };
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
fn codebook_vector(plan: &Plan) -> __m512 {
    let mut v = [0f32; 16];
    v[..plan.levels].copy_from_slice(&plan.table_values);
    // SAFETY: unaligned load of a 16-float array.
    unsafe { _mm512_loadu_ps(v.as_ptr()) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn build_block_f32(plan: &Plan, xg: &[f32], out: &mut [f32], digits: &[u32]) -> (f32, f32) {
    let tp = plan.tuples;
    let vals = codebook_vector(plan);
    for t in 0..tp.per_group {
        let r = tp.depth_of(t);
        let k0 = t * tp.depth;
        let used = plan.used_entries(r);
        let dst = unsafe { out.as_mut_ptr().add(t * plan.slot) };
        unsafe {
            table_entries(plan, vals, digits, &xg[k0..k0 + r], |q, e| {
                if 16 * q < used {
                    _mm512_mask_storeu_ps(dst.add(16 * q), mask16(used - 16 * q), e);
                }
            })
        };
    }
    (
        1.0,
        if plan.zero_term {
            table::group_sum(xg)
        } else {
            0.0
        },
    )
}

/// `(largest, smallest)` value of the codes that can be looked up (`plan.i8_used`; all codes
/// when `None`), for [`tuple_maxabs`]. With mirror too the extremes run over every code: the
/// largest entry of the stored half and its mirror is the largest of the whole table
/// (`|T[mirror(i)]| = |T[i]|`), and `plan.i8_used` restricts whole-table entries.
fn code_extremes(plan: &Plan) -> (f32, f32) {
    plan.table_values[..plan.levels]
        .iter()
        .enumerate()
        .filter(|&(c, _)| plan.i8_used.as_ref().is_none_or(|u| u[c]))
        .fold((f32::NEG_INFINITY, f32::INFINITY), |(a, b), (_, &v)| {
            (a.max(v), b.min(v))
        })
}

/// `max |T|` of every tuple's f32 table of one group (into `out`), in closed form (`ext`:
/// [`code_extremes`]): `fl(a + b)` and `fl(v * x)` are monotonic, so the largest (smallest)
/// entry of a tuple is the left-to-right sum of the largest (smallest) products of each digit.
/// False when a value is not finite (the scalar build then handles the block, including its
/// NaN conventions).
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
fn tuple_maxabs(plan: &Plan, ext: (f32, f32), xg: &[f32], out: &mut [f32]) -> bool {
    let (vmax, vmin) = ext;
    let tp = plan.tuples;
    // Full-depth tuples 16 at a time, the last few under a lane mask (the products' max / min
    // give the same `|hi|`, `|lo|` as the per-sign choice below: equal values differ at most
    // in the sign of zero). Only a shorter last tuple is left to the scalar loop.
    let full = if tp.last_depth == tp.depth {
        tp.per_group
    } else {
        tp.per_group - 1
    };
    // SAFETY: the SIMD builds run with AVX-512 F enabled (checked by `build_tables`); the
    // gathered indices `t * d + j < G` lie inside `xg`.
    unsafe {
        let d = tp.depth as i32;
        let base = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(d),
        );
        // AVX-512 F operations only (the float `or` / `andnot` need DQ, which these functions
        // do not enable: they compiled to out-of-line calls).
        let mut bad: __mmask16 = 0;
        for t0 in (0..full).step_by(16) {
            let lanes = mask16(full - t0);
            let (mut hi, mut lo) = (_mm512_setzero_ps(), _mm512_setzero_ps());
            for j in 0..tp.depth {
                let x = if lanes == 0xffff {
                    digit_lanes(xg, t0, tp.depth, j, base)
                } else {
                    // Masked-off lanes read nothing and hold 0.
                    let idx = _mm512_add_epi32(base, _mm512_set1_epi32((t0 * tp.depth + j) as i32));
                    _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), lanes, idx, xg.as_ptr())
                };
                let p1 = _mm512_mul_ps(_mm512_set1_ps(vmax), x);
                let p2 = _mm512_mul_ps(_mm512_set1_ps(vmin), x);
                let (pmax, pmin) = (_mm512_max_ps(p1, p2), _mm512_min_ps(p1, p2));
                if j == 0 {
                    hi = pmax;
                    lo = pmin;
                } else {
                    hi = _mm512_add_ps(hi, pmax);
                    lo = _mm512_add_ps(lo, pmin);
                }
            }
            // Non-finite sums (inf - inf gives NaN): `x - x` is NaN for both.
            bad |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(_mm512_sub_ps(hi, hi), _mm512_sub_ps(lo, lo));
            let m = _mm512_max_ps(_mm512_abs_ps(hi), _mm512_abs_ps(lo));
            _mm512_mask_storeu_ps(out.as_mut_ptr().add(t0), lanes, m);
        }
        if bad != 0 {
            return false;
        }
    }
    // (An index loop: `enumerate().take().skip()` compiled to an out-of-line `nth` per call,
    // 5% of the int4 build with no tuple left here.)
    #[allow(clippy::needless_range_loop)] // iterator adapters compiled to out-of-line `nth` calls
    for t in full..tp.per_group {
        let o = &mut out[t];
        let r = tp.depth_of(t);
        let k0 = t * tp.depth;
        let (mut hi, mut lo) = (0f32, 0f32);
        for j in 0..r {
            let x = xg[k0 + j];
            let (pmax, pmin) = if x >= 0.0 {
                (vmax * x, vmin * x)
            } else {
                (vmin * x, vmax * x)
            };
            if j == 0 {
                hi = pmax;
                lo = pmin;
            } else {
                hi += pmax;
                lo += pmin;
            }
        }
        if !hi.is_finite() || !lo.is_finite() {
            return false;
        }
        *o = hi.abs().max(lo.abs());
    }
    true
}

/// `xg[(t0 + i) d + j]` for the 16 tuples `i < 16` from `t0` (input `j` of each), from
/// contiguous loads and permutes for `d` = 1, 2 and 4 (the `vgatherdps` these replace took
/// ~10% of the int4 table build), else gathered at `base + t0 d + j` (`base[i] = i d`).
///
/// # Safety
/// `xg` holds at least `(t0 + 16) d` floats; AVX-512 F is enabled.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn digit_lanes(xg: &[f32], t0: usize, d: usize, j: usize, base: __m512i) -> __m512 {
    let p = unsafe { xg.as_ptr().add(t0 * d) };
    let ld = |o: usize| unsafe { _mm512_loadu_ps(p.add(o)) };
    // Lane i of the permutation picks float `i * step + j` of the two registers.
    let pick = |step: i32| {
        _mm512_add_epi32(
            _mm512_mullo_epi32(
                _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                _mm512_set1_epi32(step),
            ),
            _mm512_set1_epi32(j as i32),
        )
    };
    match d {
        1 => ld(0),
        2 => _mm512_permutex2var_ps(ld(0), pick(2), ld(16)),
        4 => {
            // Tuples 0..8 from the first 32 floats, 8..16 from the next 32 (lanes 0..8 of each).
            let lo = _mm512_permutex2var_ps(ld(0), pick(4), ld(16));
            let hi = _mm512_permutex2var_ps(ld(32), pick(4), ld(48));
            _mm512_shuffle_f32x4::<0x44>(lo, hi)
        }
        _ => {
            let idx = _mm512_add_epi32(base, _mm512_set1_epi32((t0 * d + j) as i32));
            unsafe { _mm512_i32gather_ps::<4>(idx, xg.as_ptr()) }
        }
    }
}

/// `a + broadcast(*p)` as one `vaddps` with a `{1to16}` memory operand. Written with
/// `_mm512_set1_ps`, the compiler forwarded the value just stored at `p` through registers
/// (an extract, a shuffle and a broadcast: three shuffles per add, which made the int4 table
/// build shuffle-bound).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn add_broadcast(a: __m512, p: *const f32) -> __m512 {
    let out: __m512;
    // SAFETY: `p` points at a readable f32 (callers); AVX-512 F is enabled by the callers.
    unsafe {
        std::arch::asm!(
            "vaddps {o}, {a}, dword ptr [{p}]{{1to16}}",
            o = lateout(zmm_reg) out,
            a = in(zmm_reg) a,
            p = in(reg) p,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    out
}

/// Four vectors of 16 int32 entries (`q[i]` = entries `16i .. 16i + 16`) as 64 bytes in entry
/// order, saturated to int8: `vpackssdw`, `vpacksswb` and a dword permutation undoing their
/// per-lane interleave.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
fn pack_i8(q: [__m512i; 4]) -> __m512i {
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    let a = _mm512_packs_epi32(q[0], q[1]);
    let b = _mm512_packs_epi32(q[2], q[3]);
    _mm512_permutexvar_epi32(order, _mm512_packs_epi16(a, b))
}

/// The first `64 Q` entries (`Q = 4`: a full 256-entry table; `Q = 2`: the 128 stored
/// entries of a mirror table) of an `i8` table of `V` levels and depth `R` (`V^R = 256`, V =
/// 16, 4 or 2) into `dst`, entries times `rv` rounded: the left-to-right sums of
/// `table::build_f32_table`.
/// The first `W = log_V 16` digits vary inside a 16-entry chunk (`vpermps` picks their
/// products, one vector for every chunk); each further digit is constant over a chunk and is
/// added as a broadcast memory operand (see `add_broadcast`). With `V` and `R` constants the
/// chunk loops unroll into straight-line code.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn table256<const V: usize, const R: usize, const Q: usize>(
    vals: __m512,
    xs: &[f32],
    digits: &[u32],
    dlen: usize,
    rv: __m512,
    dst: *mut i8,
) {
    let w = 16usize.ilog(V) as usize;
    let v_log = V.trailing_zeros();
    let mut pv = [[0f32; 16]; R];
    let mut prods = [_mm512_setzero_ps(); R];
    for j in 0..R {
        prods[j] = _mm512_mul_ps(vals, _mm512_set1_ps(xs[j]));
        if j >= w {
            // SAFETY: a 16-float store into `pv[j]`.
            unsafe { _mm512_storeu_ps(pv[j].as_mut_ptr(), prods[j]) };
        }
    }
    // `digits` rows are `dlen` entries long. With V = 16 the first digit of entry i < 16 is i:
    // the products as they are.
    let dig =
        |j: usize| unsafe { _mm512_loadu_si512(digits.as_ptr().add(j * dlen) as *const __m512i) };
    let mut inner = if w == 1 {
        prods[0]
    } else {
        _mm512_permutexvar_ps(dig(0), prods[0])
    };
    // Index loops: `enumerate().take().skip()` compiled to out-of-line `nth` calls per
    // tuple (~6% of the int4 build).
    #[allow(clippy::needless_range_loop)] // iterator adapters compiled to out-of-line `nth` calls
    for j in 1..w {
        inner = _mm512_add_ps(inner, _mm512_permutexvar_ps(dig(j), prods[j]));
    }
    for quad in 0..Q {
        let e = |c: usize| {
            // Chunk q: digit j >= w of entry 16q is bits (j - w) * log2 V.. of q.
            let q = 4 * quad + c;
            let mut row = inner;
            #[allow(clippy::needless_range_loop)]
            // iterator adapters compiled to out-of-line `nth` calls
            for j in w..R {
                let digit = (q >> ((j - w) as u32 * v_log)) & (V - 1);
                // SAFETY: `digit < V <= 16` indexes `pv[j]`.
                row = unsafe { add_broadcast(row, pv[j].as_ptr().add(digit)) };
            }
            _mm512_cvtps_epi32(_mm512_mul_ps(row, rv))
        };
        let bytes = pack_i8([e(0), e(1), e(2), e(3)]);
        // SAFETY: `dst` points at the tuple's 256-byte slot.
        unsafe { _mm512_storeu_si512(dst.add(64 * quad) as *mut __m512i, bytes) };
    }
}

/// `ceil_127` of `table` (the smallest integer `m >= 1` with `127 m >= v`, exact for
/// `0 <= v <= 2^17`) on 16 lanes, as float: the same steps as the scalar function.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
fn ceil_127_x16(v: __m512) -> __m512 {
    let one = _mm512_set1_ps(1.0);
    let c127 = _mm512_set1_ps(127.0);
    let magic = _mm512_set1_ps(12_582_912.0);
    let d = _mm512_mul_ps(v, _mm512_set1_ps(1.0 / 127.0));
    let r = _mm512_sub_ps(_mm512_add_ps(d, magic), magic);
    let mut m = _mm512_mask_add_ps(r, _mm512_cmp_ps_mask::<_CMP_LT_OQ>(r, d), r, one);
    m = _mm512_max_ps(m, one);
    let down = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(m, one)
        & _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_mul_ps(c127, _mm512_sub_ps(m, one)), v);
    m = _mm512_mask_sub_ps(m, down, m, one);
    let up = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(_mm512_mul_ps(c127, m), v);
    _mm512_mask_add_ps(m, up, m, one)
}

/// [`table::i8_scaling`] with its per-tuple loops on 16 lanes: the same search for `M`
/// ([`table::search_multiplier`]) and the same IEEE operations per tuple, so the same
/// multipliers, factors and scale (a test compares them). The scalar loops took about a quarter
/// of the int4 table build.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
fn i8_scaling(amax: &[f32], mult: &mut [u8], rm: &mut [f32]) -> f32 {
    let n = amax.len();
    let a = amax.iter().fold(0f32, |m, &x| m.max(x));
    let rcp = 127.0f32 / a;
    if a == 0.0 || !rcp.is_finite() {
        return table::i8_scaling(amax, mult, rm);
    }
    let mask = |i: usize| mask16(n - i);
    // q_p = amax_p * rcp, in `rm` (scratch until the end).
    for i in (0..n).step_by(16) {
        // SAFETY: masked loads / stores of the lanes below `n`.
        unsafe {
            let x = _mm512_maskz_loadu_ps(mask(i), amax.as_ptr().add(i));
            let q = _mm512_mul_ps(x, _mm512_set1_ps(rcp));
            _mm512_mask_storeu_ps(rm.as_mut_ptr().add(i), mask(i), q);
        }
    }
    let q = &*rm;
    // Sum of the multipliers `ceil_127(q_p * mf)` of each chunk.
    let chunk_sum = |c0: usize, c1: usize, mf: __m512| -> u32 {
        let mut s = _mm512_setzero_si512();
        for i in (c0..c1).step_by(16) {
            // SAFETY: masked load of the lanes below `c1 <= n`.
            unsafe {
                let k = mask16(c1 - i);
                let v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, q.as_ptr().add(i)), mf);
                s = _mm512_mask_add_epi32(s, k, s, _mm512_cvtps_epi32(ceil_127_x16(v)));
            }
        }
        _mm512_reduce_add_epi32(s) as u32
    };
    let feasible = |mm: u32| -> bool {
        let mf = mm as f32;
        (rcp * mf).is_finite()
            && (0..n).step_by(table::I8_CHUNK).all(|c0| {
                chunk_sum(c0, (c0 + table::I8_CHUNK).min(n), _mm512_set1_ps(mf)) <= table::I8_BUDGET
            })
    };
    // The search's start from 16-lane sums of each chunk's q_p.
    let m0 = table::start_multiplier((0..n).step_by(table::I8_CHUNK).map(|c0| {
        let c1 = (c0 + table::I8_CHUNK).min(n);
        let mut s = _mm512_setzero_ps();
        for i in (c0..c1).step_by(16) {
            // SAFETY: masked load of the lanes below `c1 <= n`.
            s = _mm512_add_ps(s, unsafe {
                _mm512_maskz_loadu_ps(mask16(c1 - i), q.as_ptr().add(i))
            });
        }
        (_mm512_reduce_add_ps(s), c1 - c0)
    }));
    let mm = table::search_multiplier(m0, feasible);
    let mf = mm as f32;
    let rcp_m = _mm512_set1_ps(rcp * mf);
    for i in (0..n).step_by(16) {
        // SAFETY: masked loads / stores of the lanes below `n`.
        unsafe {
            let k = mask(i);
            let qv = _mm512_maskz_loadu_ps(k, rm.as_ptr().add(i));
            let mp = ceil_127_x16(_mm512_mul_ps(qv, _mm512_set1_ps(mf)));
            _mm512_mask_cvtepi32_storeu_epi8(
                mult.as_mut_ptr().add(i) as *mut i8,
                k,
                _mm512_cvtps_epi32(mp),
            );
            _mm512_mask_storeu_ps(rm.as_mut_ptr().add(i), k, _mm512_div_ps(rcp_m, mp));
        }
    }
    a / (127.0 * mf)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn build_block_i8(
    plan: &Plan,
    xg: &[f32],
    out: &mut [i8],
    mult: &mut [u8],
    digits: &[u32],
    ext: (f32, f32),
) -> (f32, f32) {
    let tp = plan.tuples;
    let mut amax = [0f32; 256];
    let mut rms = [0f32; 256];
    if tp.per_group > amax.len() || !tuple_maxabs(plan, ext, xg, &mut amax[..tp.per_group]) {
        return table::build_block(plan, xg, BlockOut::I8(out, mult));
    }
    let tsc = i8_scaling(&amax[..tp.per_group], mult, &mut rms[..tp.per_group]);
    // A subnormal largest entry: `127 / A` overflows (and `tscale` may underflow to 0), and the
    // scalar build saturates the entries; checked before the all-zero case below.
    if !rms[0].is_finite() {
        return table::build_block(plan, xg, BlockOut::I8(out, mult));
    }
    if tsc == 0.0 {
        // All entries 0 (as the scalar build).
        out.fill(0);
        return table::all_zero_block(plan, xg);
    }
    let vals = codebook_vector(plan);
    // The full-depth tuples of 256-entry tables (int4 d = 2, int2 d = 4, binary d = 8) and of
    // their 128-entry mirror halves in straight-line code (`table256`), one loop per table
    // shape without per-tuple shape tests (~14% of the int4 build when they were per tuple):
    // tuples `0..first` here; the other shapes, and a shorter last tuple, through
    // `table_entries` below.
    let full = if tp.last_depth == tp.depth {
        tp.per_group
    } else {
        tp.per_group - 1
    };
    let (d, used_d, slot) = (tp.depth, plan.used_entries(tp.depth), plan.slot);
    let dlen = slot.div_ceil(64) * 64;
    let mut first = 0;
    if plan.levels.pow(d as u32) == 256 && (used_d == 256 || used_d == 128) {
        macro_rules! t256_loop {
            ($v:literal, $r:literal, $q:literal) => {
                for t in 0..full {
                    // SAFETY: `xg` holds the group's `per_group * d` (or more) activations and
                    // `out` its `per_group` slots of `slot` bytes.
                    unsafe {
                        table256::<$v, $r, $q>(
                            vals,
                            &xg[t * $r..t * $r + $r],
                            digits,
                            dlen,
                            _mm512_set1_ps(rms[t]),
                            out.as_mut_ptr().add(t * slot),
                        )
                    }
                }
            };
        }
        first = full;
        match (plan.levels, used_d) {
            (16, 256) => t256_loop!(16, 2, 4),
            (16, _) => t256_loop!(16, 2, 2),
            (4, 256) => t256_loop!(4, 4, 4),
            (4, _) => t256_loop!(4, 4, 2),
            (2, 256) => t256_loop!(2, 8, 4),
            (2, _) => t256_loop!(2, 8, 2),
            _ => first = 0,
        }
    }
    // Full-depth tuples of tables without a chunk-constant last digit, with the depth a
    // constant (`general_entries`).
    if first == 0 && d >= 2 && !plan.levels.pow(d as u32 - 1).is_multiple_of(16) {
        macro_rules! general_loop {
            ($r:literal) => {
                for t in 0..full {
                    // SAFETY: `xg` holds the group's activations, `out` its slots of `slot`
                    // bytes (`used_d <= slot`), `digits` `d` rows of `dlen`.
                    unsafe {
                        general_entries::<$r>(
                            vals,
                            &xg[t * $r..t * $r + $r],
                            digits,
                            dlen,
                            used_d,
                            _mm512_set1_ps(rms[t]),
                            out.as_mut_ptr().add(t * slot),
                        )
                    }
                }
            };
        }
        first = full;
        match d {
            2 => general_loop!(2),
            3 => general_loop!(3),
            4 => general_loop!(4),
            5 => general_loop!(5),
            _ => first = 0,
        }
    }
    #[allow(clippy::needless_range_loop)] // iterator adapters compiled to out-of-line `nth` calls
    for t in first..tp.per_group {
        let rm = rms[t];
        let r = tp.depth_of(t);
        let k0 = t * tp.depth;
        let used = plan.used_entries(r);
        let dst = unsafe { out.as_mut_ptr().add(t * plan.slot) };
        // Entries times the tuple's factor, rounded (|T * rm| <= 127 up to rounding for the
        // entries that can be looked up, so the saturating packs do not saturate them; the
        // entries of codes absent from the weights are unspecified).
        let rv = _mm512_set1_ps(rm);
        unsafe {
            // Four chunks of 16 rounded entries packed to 64 bytes per store.
            let mut q4 = [_mm512_setzero_si512(); 4];
            table_entries(plan, vals, digits, &xg[k0..k0 + r], |q, e| {
                // round-to-nearest-even (the MXCSR default), as `round_ties_even`.
                q4[q % 4] = _mm512_cvtps_epi32(_mm512_mul_ps(e, rv));
                if q % 4 == 3 {
                    store_block_i8(dst, 64 * (q / 4), used, q4);
                }
            })
        };
    }
    let zsum = if plan.zero_term {
        table::group_sum(xg) / tsc
    } else {
        0.0
    };
    (tsc, zsum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn i8_scaling_equals_the_scalar_scaling() {
        if cpu_ok() {
            // SAFETY: the CPU features were checked above.
            table::check_i8_scaling(7, |a, m, r| unsafe { i8_scaling(a, m, r) });
        }
    }
}
