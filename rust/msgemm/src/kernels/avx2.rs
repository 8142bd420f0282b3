//! AVX2 kernels (spec section 5): 16-entry tables in one `vpshufb`.
//!
//! Supported plans: tables of at most 16 entries (`plan.slot <= 16`), i.e. depth 1 of every
//! 4-bit or smaller format (the codebook-product tables of nf4 / fp4 / learned codebooks: no
//! multiplies and no float unpacking in the inner loop), int2 at depth 2 and ternary at depth
//! 2 (depth 3 with mirror: 14 stored entries, indices up to 26 on the plain layout); `i8` and
//! `f32` tables (any mirror) and `i16` tables (no mirror). Tables are built here
//! for all three (`V^d <= 16`).
//!
//! - `i8`: the 16-byte table is broadcast to both 128-bit lanes; 32 lookups per `vpshufb`.
//!   Mirrored lanes (`idx >= used`) map their index with a blend and negate the entry with
//!   `vpsignb`. Two tuples' entries are interleaved and summed pairwise into int16 with
//!   `vpmaddubsw` against the tuples' multipliers (exact), spilled to int32 every 64 tuples
//!   (`table::I8_CHUNK`).
//! - `i16`: each table split into a plane of low bytes and one of high bytes, one `vpshufb`
//!   per plane; the two tuples' bytes summed pairwise into int16 (`vpmaddubsw`), widened to
//!   int32 every 128 tuples as `lo + 256 hi` (exact). The AVX-512 backend runs these plans here
//!   too (measured faster than its 512-bit `i16` kernel on 4-bit indices).
//! - `f32`: 8 rows per `vpermps` (two and a blend for tables of more than 8 entries),
//!   sequential float adds per row.
//!
//! The bit-serial formulation (T-MAC style: one 16-entry table per bit plane) computes the
//! same exact integer sums only in `i16` mode; in `i8` and `f32` mode its roundings differ
//! from the scalar oracle's, so it is not used here (see the report in `KERNELS.md`).
//! The epilogue is the scalar one ([`crate::kernels::scalar::epilogue`]: the same IEEE operations,
//! on 8 rows per vector), so results are bitwise identical to the scalar kernel.

use std::arch::x86_64::*;

use crate::kernels::scalar::epilogue;
use crate::kernels::{
    mirror_consts, small_build, small_build_supported, small_f32_block, small_i16_block,
    small_i8_block, Backend, LutKernel, RowJob, SmallTables, Tiled, Zeros,
};
use crate::layout::{IndexData, LayoutKind, ROW_BLOCK};
use crate::plan::{Plan, TablePrecision};
use crate::table::{self, TableData, TableSet};

/// The AVX2 kernel.
pub struct Avx2;

/// The registered instance.
pub static AVX2: Avx2 = Avx2;

impl LutKernel for Avx2 {
    fn backend(&self) -> Backend {
        Backend::Avx2
    }

    fn available(&self) -> bool {
        // F16C widens float16 tiled scales (every AVX2 CPU has it).
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")
    }

    fn supports(&self, plan: &Plan) -> bool {
        match plan.precision {
            TablePrecision::I8 => plan.slot <= 16,
            TablePrecision::F32 => plan.slot <= 16,
            // Two byte planes per table; a mirrored entry would need its 16-bit negation.
            TablePrecision::I16 => plan.slot <= 16 && plan.mirror.is_none(),
        }
    }

    /// Integer-table plans read the paired layout where every index fits a nibble: half the
    /// bytes.
    fn layout_kind(&self, plan: &Plan) -> LayoutKind {
        if plan.precision != TablePrecision::F32
            && crate::layout::TileLayout::can_pair(plan.levels, plan.depth())
        {
            LayoutKind::Paired
        } else {
            LayoutKind::Plain
        }
    }

    fn build_tables(&self, plan: &Plan, xt: &[f32], set: &mut TableSet, parallel: bool) -> bool {
        if !small_build_supported(plan) || !self.available() {
            return false;
        }
        // SAFETY: AVX2 is available (checked above).
        unsafe { build(plan, xt, set, parallel) };
        true
    }

    fn accumulate(&self, job: &RowJob<'_>, y: &mut [f32]) {
        assert!(
            !job.layout.folded && (!job.layout.paired || job.plan.precision != TablePrecision::F32),
            "the AVX2 kernel reads plain layouts, and paired ones for integer tables"
        );
        let IndexData::U8(ix) = &job.layout.data else {
            unreachable!("tables of <= 16 entries have byte indices")
        };
        // SAFETY: called only when `available()`.
        unsafe {
            match &job.tables.data {
                TableData::I8(t) => run_i8(job, ix, t, y),
                TableData::F32(t) => run_f32(job, ix, t, y),
                TableData::I16(t) => run_i16(job, ix, t, y),
            }
        }
    }
}

/// The 16-byte table of tuple `t` (`slot <= 16` entries) broadcast to both lanes; a load past
/// the slot reads the next slot's bytes, which no index selects; near the buffer end the
/// table is copied first (never for 16-entry slots: one `vbroadcasti128` from memory).
#[inline(always)]
unsafe fn table16(tp: *const i8, t: usize, slot: usize, tab_end: usize) -> __m256i {
    unsafe {
        let o = t * slot;
        if slot == 16 || o + 16 <= tab_end {
            _mm256_broadcastsi128_si256(_mm_loadu_si128(tp.add(o) as *const __m128i))
        } else {
            let mut buf = [0i8; 16];
            std::ptr::copy_nonoverlapping(tp.add(o), buf.as_mut_ptr(), slot);
            _mm256_broadcastsi128_si256(_mm_loadu_si128(buf.as_ptr() as *const __m128i))
        }
    }
}

/// Mirror vectors of the regular tuples (`[0]`) and of a group's last tuple (`[1]`):
/// `h - 1` and the index-map constant, in every byte.
struct MirVec {
    hm1: [__m256i; 2],
    c: [__m256i; 2],
}

/// 32 lookups with the mirror applied (`KIND` 0 none, 1 xor, 2 reverse): `T[idx]` for
/// `idx < h`, else `-T[mirror(idx)]`. `idx` holds indices below 16.
#[inline(always)]
unsafe fn look<const KIND: u8>(tb: __m256i, idx: __m256i, mv: &MirVec, w: usize) -> __m256i {
    unsafe {
        if KIND == 0 {
            return _mm256_shuffle_epi8(tb, idx);
        }
        let m = _mm256_cmpgt_epi8(idx, mv.hm1[w]);
        let mapped = if KIND == 1 {
            _mm256_xor_si256(idx, mv.c[w])
        } else {
            _mm256_sub_epi8(mv.c[w], idx)
        };
        let e = _mm256_shuffle_epi8(tb, _mm256_blendv_epi8(idx, mapped, m));
        _mm256_sign_epi8(e, _mm256_or_si256(m, _mm256_set1_epi8(1)))
    }
}

/// The indices of tuples `t` and `t + 1` for the 32 rows of half `h` of a row block whose slot
/// 0 is at `ip`: two loads from a plain layout, or the two nibbles of one load from a paired one
/// (`t` even). The second is 0 when `two` is false.
#[inline(always)]
unsafe fn indices<const PAIRED: bool>(
    ip: *const u8,
    t: usize,
    h: usize,
    two: bool,
) -> (__m256i, __m256i) {
    unsafe {
        if PAIRED {
            let v = _mm256_load_si256(ip.add((t / 2) * 64 + 32 * h) as *const __m256i);
            let lo4 = _mm256_set1_epi8(0x0f);
            (
                _mm256_and_si256(v, lo4),
                _mm256_and_si256(_mm256_srli_epi16::<4>(v), lo4),
            )
        } else {
            let i0 = _mm256_load_si256(ip.add(t * 64 + 32 * h) as *const __m256i);
            let i1 = if two {
                _mm256_load_si256(ip.add((t + 1) * 64 + 32 * h) as *const __m256i)
            } else {
                _mm256_setzero_si256()
            };
            (i0, i1)
        }
    }
}

/// Adds the int16 pair sums `(lo, hi)` of half `h` of a row block, times `2^SHIFT`, to
/// (`add`) or stores them into (`!add`) the block's int32 sums in row order. Word `w` of `lo`
/// is row `16 (w / 8) + w % 8` of the half, of `hi` row `16 (w / 8) + 8 + w % 8` (the unpacks
/// work within 128-bit lanes), so the lane halves of `lo` and `hi` interleave to row order.
#[inline(always)]
unsafe fn widen_half<const SHIFT: i32>(
    lo: __m256i,
    hi: __m256i,
    h: usize,
    add: bool,
    sums: &mut [i32; ROW_BLOCK],
) {
    unsafe {
        let nat = [
            _mm256_permute2x128_si256::<0x20>(lo, hi),
            _mm256_permute2x128_si256::<0x31>(lo, hi),
        ];
        for (j, v) in nat.into_iter().enumerate() {
            for (q, part) in [_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v)]
                .into_iter()
                .enumerate()
            {
                let p = sums.as_mut_ptr().add(32 * h + 16 * j + 8 * q) as *mut __m256i;
                let mut w = _mm256_cvtepi16_epi32(part);
                if SHIFT > 0 {
                    w = _mm256_slli_epi32::<SHIFT>(w);
                }
                if add {
                    w = _mm256_add_epi32(_mm256_loadu_si256(p), w);
                }
                _mm256_storeu_si256(p, w);
            }
        }
    }
}

#[target_feature(enable = "avx2,f16c")]
unsafe fn run_i8(job: &RowJob<'_>, ix: &[u8], tab: &[i8], y: &mut [f32]) {
    let paired = job.layout.paired;
    // SAFETY: the callee's contract is this function's.
    unsafe {
        match (mirror_consts(job.plan).kind, paired) {
            (0, false) => run_i8_k::<0, false>(job, ix, tab, y),
            (1, false) => run_i8_k::<1, false>(job, ix, tab, y),
            (_, false) => run_i8_k::<2, false>(job, ix, tab, y),
            (0, true) => run_i8_k::<0, true>(job, ix, tab, y),
            (1, true) => run_i8_k::<1, true>(job, ix, tab, y),
            (_, true) => run_i8_k::<2, true>(job, ix, tab, y),
        }
    }
}

/// The `i8` kernel for mirror kind `KIND` on a plain or (`PAIRED`) paired layout. Per group,
/// row block and column: tuples in pairs, 32 rows per vector; the two tuples' entries
/// interleaved and summed pairwise with their multipliers into int16 (`vpmaddubsw`), widened
/// to int32 every `I8_CHUNK` tuples (exact: see `table::I8_BUDGET`), then the epilogue on 8 rows
/// per vector in the scalar kernel's order of operations.
#[target_feature(enable = "avx2,f16c")]
unsafe fn run_i8_k<const KIND: u8, const PAIRED: bool>(
    job: &RowJob<'_>,
    ix: &[u8],
    tab: &[i8],
    y: &mut [f32],
) {
    // SAFETY: pointers stay inside the layout / table slices (offsets from the plan); the
    // layout's slots start on 64-byte boundaries (`AlignedVec`).
    unsafe {
        let plan = job.plan;
        let tabs = job.tables;
        let lay = job.layout;
        let pg = plan.tuples.per_group;
        let mir = mirror_consts(plan);
        let mv = MirVec {
            hm1: [
                _mm256_set1_epi8(mir.h[0] as i8 - 1),
                _mm256_set1_epi8(mir.h[1] as i8 - 1),
            ],
            c: [
                _mm256_set1_epi8(mir.c[0] as i8),
                _mm256_set1_epi8(mir.c[1] as i8),
            ],
        };
        let mut sums = [0i32; ROW_BLOCK];
        // Row blocks outside, columns inside: a row block's indices are read from memory once
        // and from L1 for the other columns. (Two row blocks per table load measured the same.)
        for g in tabs.groups.clone() {
            for b in job.row_blocks.clone() {
                let ip = ix.as_ptr().add(lay.slot(g, b, 0));
                for n in tabs.cols.clone() {
                    let tv = TupleTables {
                        tp: tab.as_ptr().add(tabs.offset(g, n, 0)),
                        tab_end: tab.len() - tabs.offset(g, n, 0),
                        slot: plan.slot,
                        mults: tabs.mults(g, n).as_ptr(),
                        per_group: pg,
                    };
                    tuple_sums::<KIND, PAIRED>(ip, &tv, &mv, &mut sums);
                    epilogue_rows(job, &sums, (g, b, n), y);
                }
            }
        }
    }
}

/// How far ahead of their use the indices are prefetched, in bytes. The layout is read as one
/// stream, and without software prefetches the lookups waited on it: int4 4096 x 4096, one
/// thread 0.447 -> 0.375 ms, 2 threads 0.240-0.261 -> 0.214-0.219 ms (alternated, minima; 1.5-3
/// KiB measured alike).
const PF_DIST: usize = 2048;

/// The tables of one (group, column): tuple `t`'s `slot` entries at `tp + t * slot`
/// (`tab_end` bytes readable from `tp`), its multiplier at `mults + t`.
struct TupleTables {
    tp: *const i8,
    tab_end: usize,
    slot: usize,
    mults: *const u8,
    per_group: usize,
}

/// The exact int32 sums of the tuples of one (group, column) for the row block whose slot 0
/// is at `ip`, in row order: tuples in pairs, 32 rows per vector, the two tuples'
/// entries interleaved and summed pairwise with their multipliers into int16
/// (`vpmaddubsw`), widened to int32 every `I8_CHUNK` tuples (exact: `table::I8_BUDGET`).
#[inline(always)]
unsafe fn tuple_sums<const KIND: u8, const PAIRED: bool>(
    ip: *const u8,
    tv: &TupleTables,
    mv: &MirVec,
    sums: &mut [i32; ROW_BLOCK],
) {
    // SAFETY: the caller's: `ip`, `tv` point at the job's layout slots and tables.
    unsafe {
        let zero = _mm256_setzero_si256();
        let pg = tv.per_group;
        let mut t0 = 0;
        while t0 < pg {
            // Chunks over which the build keeps the multipliers' sum <= 258.
            let end = (t0 + crate::table::I8_CHUNK).min(pg);
            // Pair sums of the two 32-row halves: [half][lo, hi].
            let mut a = [[zero; 2]; 2];
            let mut t = t0;
            while t < end {
                let two = t + 1 < end;
                let tb0 = table16(tv.tp, t, tv.slot, tv.tab_end);
                let (tb1, mul) = if two {
                    (
                        table16(tv.tp, t + 1, tv.slot, tv.tab_end),
                        // The two tuples' multipliers, one per byte of every 16-bit lane.
                        _mm256_set1_epi16((tv.mults.add(t) as *const i16).read_unaligned()),
                    )
                } else {
                    (zero, _mm256_set1_epi16(i16::from(*tv.mults.add(t))))
                };
                // Mirror constants: the group's last tuple may have its own.
                let (w0, w1) = (usize::from(t + 1 == pg), usize::from(t + 2 == pg));
                // The indices `PF_DIST` bytes on (a later row block's), into L1 (paired: 64
                // bytes per pair; plain: two lines per pair, half the distance in pairs).
                let slot = if PAIRED { t / 2 } else { t };
                _mm_prefetch::<_MM_HINT_T0>(ip.wrapping_add(slot * 64 + PF_DIST) as *const i8);
                if !PAIRED {
                    _mm_prefetch::<_MM_HINT_T0>(ip.wrapping_add(t * 64 + 64 + PF_DIST) as *const i8);
                }
                for (h, ah) in a.iter_mut().enumerate() {
                    let (i0, i1) = indices::<PAIRED>(ip, t, h, two);
                    let e0 = look::<KIND>(tb0, i0, mv, w0);
                    let e1 = if two {
                        look::<KIND>(tb1, i1, mv, w1)
                    } else {
                        zero
                    };
                    ah[0] = _mm256_add_epi16(
                        ah[0],
                        _mm256_maddubs_epi16(mul, _mm256_unpacklo_epi8(e0, e1)),
                    );
                    ah[1] = _mm256_add_epi16(
                        ah[1],
                        _mm256_maddubs_epi16(mul, _mm256_unpackhi_epi8(e0, e1)),
                    );
                }
                t += 2;
            }
            for (h, ah) in a.iter().enumerate() {
                widen_half::<0>(ah[0], ah[1], h, t0 > 0, sums);
            }
            t0 = end;
        }
    }
}

/// 8 values from offset `i` of a tiled array (`i + 8` inside it), widened exactly from float16
/// bits where they are stored so.
#[target_feature(enable = "avx2,f16c")]
pub(crate) fn load_tiled8(t: Tiled<'_>, i: usize) -> __m256 {
    match t {
        Tiled::F32(v) => {
            let v = &v[i..i + 8];
            // SAFETY: 8 floats.
            unsafe { _mm256_loadu_ps(v.as_ptr()) }
        }
        Tiled::F16(h) => {
            let h = &h[i..i + 8];
            // SAFETY: 8 float16 values (16 bytes).
            _mm256_cvtph_ps(unsafe { _mm_loadu_si128(h.as_ptr() as *const __m128i) })
        }
    }
}

/// The epilogue of row block `b` (its rows below `plan.m`) of group `g` and column `n` from
/// their int32 sums, into the job's `y`: the scalar kernel's [`epilogue`] (`u = P; u -= z *
/// zsum; u *= tscale; y += s * u`, separate multiplies and adds) on 8 rows per vector, the
/// same IEEE operations lane by lane.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn epilogue_rows(
    job: &RowJob<'_>,
    sums: &[i32; ROW_BLOCK],
    (g, b, n): (usize, usize, usize),
    y: &mut [f32],
) {
    let plan = job.plan;
    let gn = job.tables.gn(g, n);
    let (tsc, zs) = (job.tables.tscale[gn], job.tables.zsum[gn]);
    let rows = (plan.m - b * ROW_BLOCK).min(ROW_BLOCK);
    // The block's offset in the tiled scales / zero points, and its rows of column `n`.
    let sz = (g * plan.row_blocks + b) * ROW_BLOCK;
    let y0 = job.y_index(b * ROW_BLOCK, n);
    let yb = &mut y[y0..y0 + rows];
    let full = rows / 8 * 8;
    // SAFETY: `sums`, the tiled arrays from `sz` (64 values per row block) and `yb` hold the
    // rows `0 .. full`.
    unsafe { vector_epilogue(job, sums, sz, (tsc, zs), yb.as_mut_ptr(), full) };
    for r in full..rows {
        yb[r] = epilogue(
            plan,
            sums[r] as f32,
            job.scales.at(sz + r),
            job.zeros.at(sz + r),
            tsc,
            zs,
            yb[r],
        );
    }
}

/// 8 consecutive float32 values of a tiled array (scales or zero points), or one value for
/// every row, with the variant fixed at compile time.
trait Rows8: Copy {
    /// Values `i .. i + 8` from the block's start.
    unsafe fn at(self, i: usize) -> __m256;
}

#[derive(Clone, Copy)]
struct RowsF32(*const f32);
#[derive(Clone, Copy)]
struct RowsF16(*const u16);
#[derive(Clone, Copy)]
struct RowsSplat(__m256);

impl Rows8 for RowsF32 {
    #[inline(always)]
    unsafe fn at(self, i: usize) -> __m256 {
        // SAFETY: the callers keep `i + 8` inside the block's rows.
        unsafe { _mm256_loadu_ps(self.0.add(i)) }
    }
}
impl Rows8 for RowsF16 {
    #[inline(always)]
    unsafe fn at(self, i: usize) -> __m256 {
        // SAFETY: as above; float16 bits widened exactly (F16C, enabled by the callers).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(self.0.add(i) as *const __m128i)) }
    }
}
impl Rows8 for RowsSplat {
    #[inline(always)]
    unsafe fn at(self, _: usize) -> __m256 {
        self.0
    }
}

/// The vector part of [`epilogue_rows`]: its first `full` rows (a multiple of 8), 8 rows per
/// vector, with the scale and zero-point variants fixed at compile time (no per-vector tests
/// of the variants or slice bounds checks).
#[inline(always)]
unsafe fn block_epilogue<const ZT: bool, S: Rows8, Z: Rows8>(
    sums: &[i32; ROW_BLOCK],
    sc: S,
    z: Z,
    (tsc, zs): (f32, f32),
    y: *mut f32,
    full: usize,
) {
    // SAFETY: `y` holds the block's first `full` rows and the tiled arrays 64 values (the
    // callers); features enabled by the callers.
    unsafe {
        let (tv, zv) = (_mm256_set1_ps(tsc), _mm256_set1_ps(zs));
        for r in (0..full).step_by(8) {
            let mut u =
                _mm256_cvtepi32_ps(_mm256_loadu_si256(sums.as_ptr().add(r) as *const __m256i));
            if ZT {
                u = _mm256_sub_ps(u, _mm256_mul_ps(z.at(r), zv));
            }
            u = _mm256_mul_ps(u, tv);
            let yp = y.add(r);
            _mm256_storeu_ps(
                yp,
                _mm256_add_ps(_mm256_loadu_ps(yp), _mm256_mul_ps(sc.at(r), u)),
            );
        }
    }
}

/// [`block_epilogue`] for the job's variants; `sz`: the block's offset in the tiled arrays.
#[inline(always)]
unsafe fn vector_epilogue(
    job: &RowJob<'_>,
    sums: &[i32; ROW_BLOCK],
    sz: usize,
    tz: (f32, f32),
    y: *mut f32,
    full: usize,
) {
    // SAFETY: the tiled arrays hold 64 values from `sz` (one per row of the block); the rest
    // as `block_epilogue`.
    unsafe {
        macro_rules! with_zeros {
            ($sc:expr) => {
                match (job.plan.zero_term, job.zeros) {
                    (false, _) | (true, Zeros::None) => block_epilogue::<false, _, _>(
                        sums,
                        $sc,
                        RowsSplat(_mm256_setzero_ps()),
                        tz,
                        y,
                        full,
                    ),
                    (true, Zeros::Uniform(v)) => block_epilogue::<true, _, _>(
                        sums,
                        $sc,
                        RowsSplat(_mm256_set1_ps(v)),
                        tz,
                        y,
                        full,
                    ),
                    (true, Zeros::Tiled(Tiled::F32(z))) => block_epilogue::<true, _, _>(
                        sums,
                        $sc,
                        RowsF32(z[sz..sz + 64].as_ptr()),
                        tz,
                        y,
                        full,
                    ),
                    (true, Zeros::Tiled(Tiled::F16(z))) => block_epilogue::<true, _, _>(
                        sums,
                        $sc,
                        RowsF16(z[sz..sz + 64].as_ptr()),
                        tz,
                        y,
                        full,
                    ),
                }
            };
        }
        match job.scales {
            Tiled::F32(s) => with_zeros!(RowsF32(s[sz..sz + 64].as_ptr())),
            Tiled::F16(s) => with_zeros!(RowsF16(s[sz..sz + 64].as_ptr())),
        }
    }
}

/// Tuples of a group whose `i16` byte-plane pair sums stay in int16 before widening: 64
/// pairs of low bytes, `64 * 510 < 2^15` (the high bytes' pairs lie in `[-256, 254]`).
const I16_CHUNK: usize = 128;

#[target_feature(enable = "avx2,f16c")]
unsafe fn run_i16(job: &RowJob<'_>, ix: &[u8], tab: &[i16], y: &mut [f32]) {
    // SAFETY: the callee's contract is this function's.
    unsafe {
        if job.layout.paired {
            run_i16_k::<true>(job, ix, tab, y)
        } else {
            run_i16_k::<false>(job, ix, tab, y)
        }
    }
}

/// The `i16` kernel (no mirror) on a plain or (`PAIRED`) paired layout. Per group and column,
/// each tuple's table of at most 16 int16 entries is split once into a plane of low bytes
/// (unsigned) and one of high bytes (signed), `e = 256 hi + lo`; per row block, tuples in
/// pairs, 32 rows per vector: one `vpshufb` per plane and tuple, the two tuples' bytes summed
/// pairwise into int16 (`vpmaddubsw`), widened to int32 every `I16_CHUNK` tuples with the
/// high sums times 256. Exact integer sums, so the same bits as the scalar kernel, whose
/// epilogue follows on 8 rows per vector.
#[target_feature(enable = "avx2,f16c")]
unsafe fn run_i16_k<const PAIRED: bool>(job: &RowJob<'_>, ix: &[u8], tab: &[i16], y: &mut [f32]) {
    // SAFETY: pointers stay inside the layout / table slices (offsets from the plan); the
    // layout's slots start on 64-byte boundaries (`AlignedVec`).
    unsafe {
        let plan = job.plan;
        let tabs = job.tables;
        let lay = job.layout;
        let pg = plan.tuples.per_group;
        let mut planes = vec![0u8; pg * 32];
        let mut sums = [0i32; ROW_BLOCK];
        // Columns outside the row blocks: a (group, column)'s tables are split once.
        for g in tabs.groups.clone() {
            for n in tabs.cols.clone() {
                let o = tabs.offset(g, n, 0);
                split_planes(&tab[o..], plan.slot, pg, &mut planes);
                for b in job.row_blocks.clone() {
                    let ip = ix.as_ptr().add(lay.slot(g, b, 0));
                    i16_sums::<PAIRED>(ip, planes.as_ptr(), pg, &mut sums);
                    epilogue_rows(job, &sums, (g, b, n), y);
                }
            }
        }
    }
}

/// Splits the `pg` tables of `slot <= 16` int16 entries at the start of `tab` into byte
/// planes: tuple `t`'s low bytes at `planes[32 t ..][..16]`, its high bytes at
/// `planes[32 t + 16 ..][..16]` (lanes past the slot: the next tuple's entries or zeros,
/// which no index selects).
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn split_planes(tab: &[i16], slot: usize, pg: usize, planes: &mut [u8]) {
    // Per 128-bit lane: the even (low) bytes of its 8 entries, then the odd (high) ones.
    let even_odd = _mm256_setr_epi8(
        0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, //
        0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
    );
    for t in 0..pg {
        let o = t * slot;
        // SAFETY: 16 entries are read in place where readable, else copied; `planes` holds
        // `32 pg` bytes.
        unsafe {
            let v = if o + 16 <= tab.len() {
                _mm256_loadu_si256(tab.as_ptr().add(o) as *const __m256i)
            } else {
                let mut buf = [0i16; 16];
                buf[..slot].copy_from_slice(&tab[o..o + slot]);
                _mm256_loadu_si256(buf.as_ptr() as *const __m256i)
            };
            // [lo 0-7 | hi 0-7 | lo 8-15 | hi 8-15] -> [lo 0-15 | hi 0-15].
            let v = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(v, even_odd));
            _mm256_storeu_si256(planes.as_mut_ptr().add(32 * t) as *mut __m256i, v);
        }
    }
}

/// The exact int32 sums of one (group, column)'s `pg` tuples (byte planes at `planes`, see
/// [`split_planes`]) for the row block whose slot 0 is at `ip`, in row order.
#[inline(always)]
unsafe fn i16_sums<const PAIRED: bool>(
    ip: *const u8,
    planes: *const u8,
    pg: usize,
    sums: &mut [i32; ROW_BLOCK],
) {
    // SAFETY: the caller's: `ip` points at the row block's layout slots, `planes` at `32 pg`
    // bytes.
    unsafe {
        let zero = _mm256_setzero_si256();
        let ones = _mm256_set1_epi8(1);
        let plane = |t: usize, hi: usize| {
            _mm256_broadcastsi128_si256(_mm_loadu_si128(
                planes.add(32 * t + 16 * hi) as *const __m128i
            ))
        };
        let mut t0 = 0;
        while t0 < pg {
            let end = (t0 + I16_CHUNK).min(pg);
            // Pair sums of the two 32-row halves: [half][unpacklo, unpackhi], low and high
            // planes.
            let mut lo = [[zero; 2]; 2];
            let mut hi = [[zero; 2]; 2];
            let mut t = t0;
            while t < end {
                let two = t + 1 < end;
                let (l0, h0) = (plane(t, 0), plane(t, 1));
                // A missing second tuple looks up zeros.
                let (l1, h1) = if two {
                    (plane(t + 1, 0), plane(t + 1, 1))
                } else {
                    (zero, zero)
                };
                let slot = if PAIRED { t / 2 } else { t };
                _mm_prefetch::<_MM_HINT_T0>(ip.wrapping_add(slot * 64 + PF_DIST) as *const i8);
                if !PAIRED {
                    _mm_prefetch::<_MM_HINT_T0>(ip.wrapping_add(t * 64 + 64 + PF_DIST) as *const i8);
                }
                for h in 0..2 {
                    let (i0, i1) = indices::<PAIRED>(ip, t, h, two);
                    let (el0, el1) = (_mm256_shuffle_epi8(l0, i0), _mm256_shuffle_epi8(l1, i1));
                    let (eh0, eh1) = (_mm256_shuffle_epi8(h0, i0), _mm256_shuffle_epi8(h1, i1));
                    // Low bytes unsigned (first operand of `vpmaddubsw`), high bytes signed.
                    lo[h][0] = _mm256_add_epi16(
                        lo[h][0],
                        _mm256_maddubs_epi16(_mm256_unpacklo_epi8(el0, el1), ones),
                    );
                    lo[h][1] = _mm256_add_epi16(
                        lo[h][1],
                        _mm256_maddubs_epi16(_mm256_unpackhi_epi8(el0, el1), ones),
                    );
                    hi[h][0] = _mm256_add_epi16(
                        hi[h][0],
                        _mm256_maddubs_epi16(ones, _mm256_unpacklo_epi8(eh0, eh1)),
                    );
                    hi[h][1] = _mm256_add_epi16(
                        hi[h][1],
                        _mm256_maddubs_epi16(ones, _mm256_unpackhi_epi8(eh0, eh1)),
                    );
                }
                t += 2;
            }
            for h in 0..2 {
                widen_half::<0>(lo[h][0], lo[h][1], h, t0 > 0, sums);
                widen_half::<8>(hi[h][0], hi[h][1], h, true, sums);
            }
            t0 = end;
        }
    }
}

/// Entries `tb[idx]` of a table of at most 16 floats (`tb[0]` entries 0-7, `tb[1]` 8-15) for 8
/// indices below 16; only `tb[0]` when `!WIDE` (indices below 8).
#[inline(always)]
unsafe fn lookup16<const WIDE: bool>(tb: &[__m256; 2], idx: __m256i) -> __m256 {
    unsafe {
        let lo = _mm256_permutevar8x32_ps(tb[0], idx);
        if !WIDE {
            return lo;
        }
        let hi = _mm256_permutevar8x32_ps(tb[1], idx);
        let upper = _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(7));
        _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(upper))
    }
}

#[target_feature(enable = "avx2,f16c")]
unsafe fn run_f32(job: &RowJob<'_>, ix: &[u8], tab: &[f32], y: &mut [f32]) {
    // Tables of more than 8 entries: two `vpermps` and a blend on index bit 3.
    let wide = job.plan.slot > 8;
    // SAFETY: the callee's contract is this function's.
    unsafe {
        match (mirror_consts(job.plan).kind, wide) {
            (0, false) => run_f32_k::<0, false>(job, ix, tab, y),
            (1, false) => run_f32_k::<1, false>(job, ix, tab, y),
            (_, false) => run_f32_k::<2, false>(job, ix, tab, y),
            (0, true) => run_f32_k::<0, true>(job, ix, tab, y),
            (1, true) => run_f32_k::<1, true>(job, ix, tab, y),
            (_, true) => run_f32_k::<2, true>(job, ix, tab, y),
        }
    }
}

/// The `f32` kernel for mirror kind `KIND` and tables of up to 16 (`WIDE`) or 8 entries: 8 rows
/// per vector, the tuples' entries added in ascending order, then the epilogue.
#[target_feature(enable = "avx2,f16c")]
unsafe fn run_f32_k<const KIND: u8, const WIDE: bool>(
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
        let mir = mirror_consts(plan);
        let hv = [
            _mm256_set1_epi32(mir.h[0] - 1),
            _mm256_set1_epi32(mir.h[1] - 1),
        ];
        let cv = [_mm256_set1_epi32(mir.c[0]), _mm256_set1_epi32(mir.c[1])];
        let sign = _mm256_set1_epi32(i32::MIN);
        let mut sums = [0f32; ROW_BLOCK];
        for g in tabs.groups.clone() {
            for n in tabs.cols.clone() {
                let gn = tabs.gn(g, n);
                let o = tabs.offset(g, n, 0);
                let (tp, tab_end) = (tab.as_ptr().add(o), tab.len() - o);
                for b in job.row_blocks.clone() {
                    let ip = ix.as_ptr().add(lay.slot(g, b, 0));
                    let mut acc = [_mm256_setzero_ps(); 8];
                    for t in 0..pg {
                        let w = usize::from(t + 1 == pg);
                        // The tuple's entries 0-7 and 8-15, read in place where 16 floats are
                        // readable (past the slot: the next tuple's, which no index selects).
                        let at = t * slot;
                        let tb = if at + 16 <= tab_end {
                            [_mm256_loadu_ps(tp.add(at)), _mm256_loadu_ps(tp.add(at + 8))]
                        } else {
                            let mut buf = [0f32; 16];
                            std::ptr::copy_nonoverlapping(tp.add(at), buf.as_mut_ptr(), slot);
                            [
                                _mm256_loadu_ps(buf.as_ptr()),
                                _mm256_loadu_ps(buf.as_ptr().add(8)),
                            ]
                        };
                        for (q, a) in acc.iter_mut().enumerate() {
                            let bytes = _mm_loadl_epi64(ip.add(t * 64 + 8 * q) as *const __m128i);
                            let idx = _mm256_cvtepu8_epi32(bytes);
                            let e = if KIND == 0 {
                                lookup16::<WIDE>(&tb, idx)
                            } else {
                                let m = _mm256_cmpgt_epi32(idx, hv[w]);
                                let mapped = if KIND == 1 {
                                    _mm256_xor_si256(idx, cv[w])
                                } else {
                                    _mm256_sub_epi32(cv[w], idx)
                                };
                                let e = lookup16::<WIDE>(&tb, _mm256_blendv_epi8(idx, mapped, m));
                                _mm256_xor_ps(e, _mm256_castsi256_ps(_mm256_and_si256(m, sign)))
                            };
                            *a = _mm256_add_ps(*a, e);
                        }
                    }
                    for (q, a) in acc.iter().enumerate() {
                        _mm256_storeu_ps(sums.as_mut_ptr().add(8 * q), *a);
                    }
                    let rows = (plan.m - b * ROW_BLOCK).min(ROW_BLOCK);
                    let sz = (g * plan.row_blocks + b) * ROW_BLOCK;
                    for (lane, &pv) in sums.iter().enumerate().take(rows) {
                        let yi = job.y_index(b * ROW_BLOCK + lane, n);
                        let z = job.zeros.at(sz + lane);
                        y[yi] = epilogue(
                            plan,
                            pv,
                            job.scales.at(sz + lane),
                            z,
                            tabs.tscale[gn],
                            tabs.zsum[gn],
                            y[yi],
                        );
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Table build (i8, i16 and f32 tables of at most 16 entries)
// ---------------------------------------------------------------------------------------------

/// What every block of a build shares: [`SmallTables`], and for `V <= 8` the digit `j` of
/// entry `i` (`(i / V^j) % V`), `digits[j][i]`.
struct BuildConsts {
    s: SmallTables,
    digits: [[i32; 16]; 4],
}

impl BuildConsts {
    fn new(plan: &Plan) -> BuildConsts {
        let v = plan.levels;
        let digits =
            std::array::from_fn(|j| std::array::from_fn(|i| ((i / v.pow(j as u32)) % v) as i32));
        BuildConsts {
            s: SmallTables::new(plan),
            digits,
        }
    }
}

/// Builds `set` for a plan of [`small_build_supported`], bitwise equal to the scalar build.
///
/// # Safety
/// The CPU has AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn build(plan: &Plan, xt: &[f32], set: &mut TableSet, parallel: bool) {
    let c = BuildConsts::new(plan);
    // SAFETY (each block build): AVX2 and F16C are available (the caller's contract).
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

/// The f32 entries of tuple `t` (16 lanes in two vectors; lanes of entries not built are 0),
/// with the scalar build's operations: products `v'[c] * x_j`, then entry = (product of digit
/// 0 + product of digit 1) + ... in digit order.
#[inline(always)]
unsafe fn entries(plan: &Plan, c: &BuildConsts, xs: &[f32], w: usize) -> [__m256; 2] {
    unsafe {
        let vl = _mm256_loadu_ps(c.s.vals.as_ptr());
        let mut e = if plan.levels > 8 {
            // Depth 1 only (V^2 > 16): the products are the entries.
            let x = _mm256_set1_ps(xs[0]);
            [
                _mm256_mul_ps(vl, x),
                _mm256_mul_ps(_mm256_loadu_ps(c.s.vals.as_ptr().add(8)), x),
            ]
        } else {
            let dig = |j: usize, h: usize| {
                _mm256_loadu_si256(c.digits[j].as_ptr().add(8 * h) as *const __m256i)
            };
            let mut e = [_mm256_setzero_ps(); 2];
            for (j, &x) in xs.iter().enumerate() {
                let prod = _mm256_mul_ps(vl, _mm256_set1_ps(x));
                for (h, eh) in e.iter_mut().enumerate() {
                    let p = _mm256_permutevar8x32_ps(prod, dig(j, h));
                    *eh = if j == 0 { p } else { _mm256_add_ps(*eh, p) };
                }
            }
            e
        };
        for (h, eh) in e.iter_mut().enumerate() {
            let keep = _mm256_loadu_si256(c.s.built[w].as_ptr().add(8 * h) as *const __m256i);
            *eh = _mm256_and_ps(*eh, _mm256_castsi256_ps(keep));
        }
        e
    }
}

/// One `(group, column)` block of `i16` tables, equal to [`table::build_block`]
/// ([`small_i16_block`] on 8 lanes): the activations quantized (`cvtps2dq` rounds to nearest
/// even, as `round_small`; clamped to +-127.5 before and +-127 after), each tuple's entries
/// the exact integer sums of the products `int_values[c] * xq` of its digits (order-free).
#[target_feature(enable = "avx2,f16c")]
unsafe fn build_block_i16(plan: &Plan, c: &BuildConsts, xg: &[f32], out: &mut [i16]) -> (f32, f32) {
    let ints = plan
        .int_values
        .as_deref()
        .expect("i16 plan has integer values");
    let mut iv = [0i32; 16];
    iv[..plan.levels].copy_from_slice(ints);
    // SAFETY (closures): AVX2 is enabled (they inherit it); 8-lane loads and stores inside
    // `xg` / `xq`, 16-lane digit rows and masks.
    small_i16_block(
        plan,
        xg,
        out,
        |xg| unsafe { maxabs_nan(xg) },
        |xg, rcp, xq| unsafe {
            let (rv, lo, hi) = (
                _mm256_set1_ps(rcp),
                _mm256_set1_ps(-127.5),
                _mm256_set1_ps(127.5),
            );
            let (qlo, qhi) = (_mm256_set1_epi32(-127), _mm256_set1_epi32(127));
            let full = xg.len() / 8 * 8;
            for i in (0..full).step_by(8) {
                let v = _mm256_mul_ps(_mm256_loadu_ps(xg.as_ptr().add(i)), rv);
                let q = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, lo), hi));
                let q = _mm256_min_epi32(_mm256_max_epi32(q, qlo), qhi);
                _mm256_storeu_si256(xq.as_mut_ptr().add(i) as *mut __m256i, q);
            }
            full
        },
        |xs, w| unsafe {
            let vl = [
                _mm256_loadu_si256(iv.as_ptr() as *const __m256i),
                _mm256_loadu_si256(iv.as_ptr().add(8) as *const __m256i),
            ];
            let mut e = if plan.levels > 8 {
                // Depth 1 only (V^2 > 16): the products are the entries.
                let x = _mm256_set1_epi32(xs[0]);
                [_mm256_mullo_epi32(vl[0], x), _mm256_mullo_epi32(vl[1], x)]
            } else {
                let mut e = [_mm256_setzero_si256(); 2];
                for (j, &x) in xs.iter().enumerate() {
                    let prod = _mm256_mullo_epi32(vl[0], _mm256_set1_epi32(x));
                    for (h, eh) in e.iter_mut().enumerate() {
                        let dig =
                            _mm256_loadu_si256(c.digits[j].as_ptr().add(8 * h) as *const __m256i);
                        *eh = _mm256_add_epi32(*eh, _mm256_permutevar8x32_epi32(prod, dig));
                    }
                }
                e
            };
            for (h, eh) in e.iter_mut().enumerate() {
                let keep = _mm256_loadu_si256(c.s.built[w].as_ptr().add(8 * h) as *const __m256i);
                *eh = _mm256_and_si256(*eh, keep);
            }
            // Entries fit int16 (the plan checks `depth * max|v| * 127`): the saturating pack
            // is exact; its per-lane interleave undone by the qword permutation.
            let v = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(e[0], e[1]));
            let mut out = [0i16; 16];
            _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, v);
            out
        },
    )
}

/// `(max |x|, whether x holds a NaN)` (a scalar fold with `f32::max`, which skips NaN, and a
/// NaN test per value did not vectorize: a fifth of the int4 build).
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn maxabs_nan(xs: &[f32]) -> (f32, bool) {
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
    let (mut m, mut bad) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        // SAFETY: an 8-float load of a chunk of 8.
        let v = _mm256_and_ps(unsafe { _mm256_loadu_ps(c.as_ptr()) }, abs);
        // `max_ps` returns its second operand when one is NaN: NaN is tracked apart.
        m = _mm256_max_ps(m, v);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
    }
    let mut lanes = [0f32; 8];
    // SAFETY: an 8-float store into `lanes`.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), m) };
    let mut nan = _mm256_movemask_ps(bad) != 0;
    let mut xmax = lanes.iter().fold(0f32, |a, &b| a.max(b));
    for &x in chunks.remainder() {
        xmax = xmax.max(x.abs());
        nan |= x.is_nan();
    }
    (xmax, nan)
}

/// One `(group, column)` block of `f32` tables: [`small_f32_block`] with [`entries`].
#[target_feature(enable = "avx2,f16c")]
unsafe fn build_block_f32(plan: &Plan, c: &BuildConsts, xg: &[f32], out: &mut [f32]) -> (f32, f32) {
    small_f32_block(plan, xg, out, |xs, w| {
        let mut buf = [0f32; 16];
        // SAFETY: AVX2 is enabled; 16 floats into `buf`.
        unsafe {
            let e = entries(plan, c, xs, w);
            _mm256_storeu_ps(buf.as_mut_ptr(), e[0]);
            _mm256_storeu_ps(buf.as_mut_ptr().add(8), e[1]);
        }
        buf
    })
}

/// One `(group, column)` block of `i8` tables, bitwise equal to [`table::build_block`]
/// ([`small_i8_block`] on 8 lanes): the f32 entries of every tuple, their largest magnitude
/// over the entries that can be looked up, the int8 scaling ([`i8_scaling`]), then the entries
/// recomputed and rounded (`cvtps2dq` rounds to nearest even, the MXCSR default, as
/// `round_ties_even`; clamping to +-127 before rounding gives the scalar
/// `clamp(round(clamp(v, +-127.5)), +-127)`).
#[target_feature(enable = "avx2,f16c")]
unsafe fn build_block_i8(
    plan: &Plan,
    c: &BuildConsts,
    xg: &[f32],
    out: &mut [i8],
    mult: &mut [u8],
) -> (f32, f32) {
    // SAFETY (closures): AVX2 is enabled (they inherit it); the masks are 16 lanes.
    small_i8_block(
        plan,
        xg,
        out,
        mult,
        c.s.vmax,
        |xg| unsafe { maxabs_nan(xg) },
        |xs, w| unsafe {
            let abs = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
            let e = entries(plan, c, xs, w);
            let mut m = _mm256_setzero_ps();
            for (h, &eh) in e.iter().enumerate() {
                let keep = _mm256_loadu_si256(c.s.counted[w].as_ptr().add(8 * h) as *const __m256i);
                m = _mm256_max_ps(
                    m,
                    _mm256_and_ps(_mm256_and_ps(eh, abs), _mm256_castsi256_ps(keep)),
                );
            }
            let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2)))
        },
        |a, m, r| unsafe { i8_scaling(a, m, r) },
        |xs, w, rm| unsafe {
            let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
            let rv = _mm256_set1_ps(rm);
            let q = entries(plan, c, xs, w).map(|eh| {
                _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(eh, rv), lo), hi))
            });
            let half = |v: __m256i| {
                _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v))
            };
            let mut bytes = [0i8; 16];
            _mm_storeu_si128(
                bytes.as_mut_ptr() as *mut __m128i,
                _mm_packs_epi16(half(q[0]), half(q[1])),
            );
            bytes
        },
    )
}

/// Lanes `i .. i + 8` of `v` below `n` (0 past it).
#[inline(always)]
unsafe fn load8(v: &[f32], i: usize, n: usize) -> __m256 {
    unsafe {
        if i + 8 <= n {
            _mm256_loadu_ps(v.as_ptr().add(i))
        } else {
            let mut buf = [0f32; 8];
            buf[..n - i].copy_from_slice(&v[i..n]);
            _mm256_loadu_ps(buf.as_ptr())
        }
    }
}

/// `table::ceil_127` on 8 lanes (the smallest integer `m >= 1` with `127 m >= v`, exact for
/// `0 <= v <= 2^17`), as float: the same IEEE steps.
#[inline(always)]
unsafe fn ceil_127_x8(v: __m256) -> __m256 {
    unsafe {
        let one = _mm256_set1_ps(1.0);
        let c127 = _mm256_set1_ps(127.0);
        let magic = _mm256_set1_ps(12_582_912.0);
        let d = _mm256_mul_ps(v, _mm256_set1_ps(1.0 / 127.0));
        let r = _mm256_sub_ps(_mm256_add_ps(d, magic), magic);
        let mut m = _mm256_add_ps(r, _mm256_and_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(r, d), one));
        m = _mm256_max_ps(m, one);
        let down = _mm256_and_ps(
            _mm256_cmp_ps::<_CMP_GT_OQ>(m, one),
            _mm256_cmp_ps::<_CMP_GE_OQ>(_mm256_mul_ps(c127, _mm256_sub_ps(m, one)), v),
        );
        m = _mm256_sub_ps(m, _mm256_and_ps(down, one));
        let up = _mm256_cmp_ps::<_CMP_LT_OQ>(_mm256_mul_ps(c127, m), v);
        _mm256_add_ps(m, _mm256_and_ps(up, one))
    }
}

/// Horizontal sum of 8 int32 lanes.
#[inline(always)]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    unsafe {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s)))
    }
}

/// [`table::i8_scaling`] with its per-tuple loops on 8 lanes ([`table::i8_scaling_by`]): the
/// same multipliers, factors and scale (a test compares them). The scalar loops were two
/// thirds of the build.
#[target_feature(enable = "avx2,f16c")]
unsafe fn i8_scaling(amax: &[f32], mult: &mut [u8], rm: &mut [f32]) -> f32 {
    table::i8_scaling_by(amax, mult, rm, |q, mf, mut out| {
        // SAFETY: AVX2 is enabled (the closure inherits it); `load8` reads lanes below
        // `q.len()` only.
        unsafe {
            let n = q.len();
            let mfv = _mm256_set1_ps(mf);
            let mut s = _mm256_setzero_si256();
            for i in (0..n).step_by(8) {
                let lanes = _mm256_cmpgt_epi32(
                    _mm256_set1_epi32((n - i) as i32),
                    _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                );
                let mp = ceil_127_x8(_mm256_mul_ps(load8(q, i, n), mfv));
                s = _mm256_add_epi32(s, _mm256_and_si256(_mm256_cvtps_epi32(mp), lanes));
                if let Some(o) = out.as_deref_mut() {
                    let mut buf = [0f32; 8];
                    _mm256_storeu_ps(buf.as_mut_ptr(), mp);
                    let len = (n - i).min(8);
                    o[i..i + len].copy_from_slice(&buf[..len]);
                }
            }
            hsum_epi32(s) as u32
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn i8_scaling_equals_the_scalar_scaling() {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c") {
            // SAFETY: AVX2 and F16C were checked above.
            table::check_i8_scaling(8, |a, m, r| unsafe { i8_scaling(a, m, r) });
        }
    }
}
