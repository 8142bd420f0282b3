//! AVX2 kernels (spec section 5): 16-entry tables in one `vpshufb`.
//!
//! Supported plans: tables of at most 16 entries (`plan.slot <= 16`), i.e. depth 1 of every
//! 4-bit or smaller format (the codebook-product tables of nf4 / fp4 / learned codebooks: no
//! multiplies and no float unpacking in the inner loop), int2 at depth 2 and ternary at depth
//! 2; `i8` tables (any mirror) and `f32` tables of at most 8 entries (`vpermps`).
//!
//! - `i8`: the 16-byte table is broadcast to both 128-bit lanes; 32 lookups per `vpshufb`.
//!   Mirrored lanes (`idx >= used`) map their index with a blend and negate the entry with
//!   `vpsignb`. Two tuples' entries are interleaved and summed pairwise into int16 with
//!   `vpmaddubsw` against ones (exact), spilled to int32 every 256 tuples.
//! - `f32`: 8 rows per `vpermps`, sequential float adds per row.
//!
//! The bit-serial formulation (T-MAC style: one 16-entry table per bit plane) computes the
//! same exact integer sums only in `i16` mode; in `i8` and `f32` mode its roundings differ
//! from the scalar oracle's, so it is not used here (see the report in `KERNELS.md`).
//! The epilogue is the scalar one ([`crate::kernels::scalar::epilogue`]), so results are
//! bitwise identical to the scalar kernel.

use std::arch::x86_64::*;

use crate::format::Involution;
use crate::kernels::scalar::epilogue;
use crate::kernels::{Backend, LutKernel, RowJob};
use crate::layout::{IndexData, ROW_BLOCK};
use crate::plan::{Plan, TablePrecision};
use crate::table::TableData;

/// The AVX2 kernel.
pub struct Avx2;

/// The registered instance.
pub static AVX2: Avx2 = Avx2;

impl LutKernel for Avx2 {
    fn backend(&self) -> Backend {
        Backend::Avx2
    }

    fn available(&self) -> bool {
        is_x86_feature_detected!("avx2")
    }

    fn supports(&self, plan: &Plan) -> bool {
        match plan.precision {
            TablePrecision::I8 => plan.slot <= 16,
            TablePrecision::F32 => plan.slot <= 8,
            TablePrecision::I16 => false,
        }
    }

    fn accumulate(&self, job: &RowJob<'_>, y: &mut [f32]) {
        let IndexData::U8(ix) = &job.layout.data else {
            unreachable!("tables of <= 16 entries have byte indices")
        };
        // SAFETY: called only when `available()`.
        unsafe {
            match &job.tables.data {
                TableData::I8(t) => run_i8(job, ix, t, y),
                TableData::F32(t) => run_f32(job, ix, t, y),
                TableData::I16(_) => unreachable!("supports() rejects i16 plans"),
            }
        }
    }
}

/// Mirror constants of the regular and of the last tuple of a group: threshold `h` and the
/// index-map constant (xor mask or `V^r - 1`); `kind` 0 none, 1 xor, 2 reverse.
struct Mir {
    kind: u8,
    h: [i32; 2],
    c: [i32; 2],
}

fn mirror_consts(plan: &Plan) -> Mir {
    let tp = plan.tuples;
    match plan.mirror {
        None => Mir {
            kind: 0,
            h: [0; 2],
            c: [0; 2],
        },
        Some(mi) => {
            let cst = |r: usize| match mi.involution {
                Involution::SignBit => mi.index(0, r) as i32,
                Involution::Reverse => plan.levels.pow(r as u32) as i32 - 1,
            };
            Mir {
                kind: if mi.involution == Involution::SignBit {
                    1
                } else {
                    2
                },
                h: [
                    plan.used_entries(tp.depth) as i32,
                    plan.used_entries(tp.last_depth) as i32,
                ],
                c: [cst(tp.depth), cst(tp.last_depth)],
            }
        }
    }
}

/// Row order of the pairwise int16 sums of one 32-row half: word `w` of the "lo" accumulator
/// is row `16 * (w / 8) + w % 8`, of the "hi" accumulator row `16 * (w / 8) + 8 + w % 8`.
#[inline(always)]
fn pair_row(hi: bool, w: usize) -> usize {
    16 * (w / 8) + usize::from(hi) * 8 + w % 8
}

/// The 16-byte table of tuple `t` (`slot <= 16` entries) broadcast to both lanes; a load past
/// the slot reads the next slot's bytes, which no index selects; near the buffer end the
/// table is copied first.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn table16(tp: *const i8, t: usize, slot: usize, tab_end: usize) -> __m256i {
    unsafe {
        let o = t * slot;
        let v = if o + 16 <= tab_end {
            _mm_loadu_si128(tp.add(o) as *const __m128i)
        } else {
            let mut buf = [0i8; 16];
            std::ptr::copy_nonoverlapping(tp.add(o), buf.as_mut_ptr(), slot);
            _mm_loadu_si128(buf.as_ptr() as *const __m128i)
        };
        _mm256_broadcastsi128_si256(v)
    }
}

/// 32 lookups with the mirror applied (`kind` 0 none, 1 xor, 2 reverse): `T[idx]` for
/// `idx < h`, else `-T[mirror(idx)]` (`hm1 = h - 1`).
#[inline]
#[target_feature(enable = "avx2")]
fn look(tb: __m256i, idx: __m256i, kind: u8, hm1: __m256i, c: __m256i, ones: __m256i) -> __m256i {
    match kind {
        0 => _mm256_shuffle_epi8(tb, idx),
        k => {
            let m = _mm256_cmpgt_epi8(idx, hm1);
            let mapped = if k == 1 {
                _mm256_xor_si256(idx, c)
            } else {
                _mm256_sub_epi8(c, idx)
            };
            let e = _mm256_shuffle_epi8(tb, _mm256_blendv_epi8(idx, mapped, m));
            _mm256_sign_epi8(e, _mm256_or_si256(m, ones))
        }
    }
}

#[target_feature(enable = "avx2")]
unsafe fn run_i8(job: &RowJob<'_>, ix: &[u8], tab: &[i8], y: &mut [f32]) {
    // SAFETY: pointers stay inside the layout / table slices (offsets from the plan).
    unsafe {
        let plan = job.plan;
        let tabs = job.tables;
        let lay = job.layout;
        let pg = plan.tuples.per_group;
        let mir = mirror_consts(plan);
        let ones = _mm256_set1_epi8(1);
        let zero = _mm256_setzero_si256();
        let hv = [
            _mm256_set1_epi8(mir.h[0] as i8 - 1),
            _mm256_set1_epi8(mir.h[1] as i8 - 1),
        ];
        let cv = [
            _mm256_set1_epi8(mir.c[0] as i8),
            _mm256_set1_epi8(mir.c[1] as i8),
        ];
        let mut words = [0i16; 16];
        let mut acc = [0i32; ROW_BLOCK];
        // Row blocks outside, columns inside: a row block's indices are read from memory once
        // and from L1 for the other columns.
        for g in tabs.groups.clone() {
            for b in job.row_blocks.clone() {
                let ip = ix.as_ptr().add(lay.slot(g, b, 0));
                for n in tabs.cols.clone() {
                    let gn = tabs.gn(g, n);
                    let (tsc, zs) = (tabs.tscale[gn], tabs.zsum[gn]);
                    let tp = tab.as_ptr().add(tabs.offset(g, n, 0));
                    // Bytes readable from `tp` (16-byte table loads must stay inside the buffer).
                    let tab_end = tab.len() - tabs.offset(g, n, 0);
                    acc.fill(0);
                    let mut t = 0;
                    let mults = tabs.mults(g, n);
                    while t < pg {
                        // Chunks over which the build keeps the multipliers' sum <= 258.
                        let end = (t + crate::table::I8_CHUNK).min(pg);
                        // Pair sums of the two 32-row halves: [half][lo, hi].
                        let mut a = [[zero; 2]; 2];
                        while t < end {
                            let two = t + 1 < end;
                            let tb0 = table16(tp, t, plan.slot, tab_end);
                            let tb1 = if two {
                                table16(tp, t + 1, plan.slot, tab_end)
                            } else {
                                zero
                            };
                            let (w0, w1) = (usize::from(t + 1 == pg), usize::from(t + 2 == pg));
                            // The tuples' multipliers in the two bytes of every 16-bit lane.
                            let m1 = if two { mults[t + 1] } else { 0 };
                            let mul = _mm256_set1_epi16(i16::from_le_bytes([mults[t], m1]));
                            for (h, ah) in a.iter_mut().enumerate() {
                                let i0 =
                                    _mm256_loadu_si256(ip.add(t * 64 + 32 * h) as *const __m256i);
                                let e0 = look(tb0, i0, mir.kind, hv[w0], cv[w0], ones);
                                let e1 = if two {
                                    let i1 = _mm256_loadu_si256(
                                        ip.add((t + 1) * 64 + 32 * h) as *const __m256i
                                    );
                                    look(tb1, i1, mir.kind, hv[w1], cv[w1], ones)
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
                            t += if two { 2 } else { 1 };
                        }
                        for (h, ah) in a.iter().enumerate() {
                            for (hi, v) in [(false, ah[0]), (true, ah[1])] {
                                _mm256_storeu_si256(words.as_mut_ptr() as *mut __m256i, v);
                                for (w, &x) in words.iter().enumerate() {
                                    acc[32 * h + pair_row(hi, w)] += i32::from(x);
                                }
                            }
                        }
                    }
                    let rows = (plan.m - b * ROW_BLOCK).min(ROW_BLOCK);
                    let sz = (g * plan.row_blocks + b) * ROW_BLOCK;
                    for (lane, &p) in acc.iter().enumerate().take(rows) {
                        let yi = job.y_index(b * ROW_BLOCK + lane, n);
                        let z = job.zeros.at(sz + lane);
                        y[yi] = epilogue(plan, p as f32, job.scales[sz + lane], z, tsc, zs, y[yi]);
                    }
                }
            }
        }
    }
}

#[target_feature(enable = "avx2")]
unsafe fn run_f32(job: &RowJob<'_>, ix: &[u8], tab: &[f32], y: &mut [f32]) {
    // SAFETY: pointers stay inside the layout / table slices (offsets from the plan).
    unsafe {
        let plan = job.plan;
        let tabs = job.tables;
        let lay = job.layout;
        let pg = plan.tuples.per_group;
        let mir = mirror_consts(plan);
        let hv = [
            _mm256_set1_epi32(mir.h[0] - 1),
            _mm256_set1_epi32(mir.h[1] - 1),
        ];
        let cv = [_mm256_set1_epi32(mir.c[0]), _mm256_set1_epi32(mir.c[1])];
        let sign = _mm256_set1_epi32(i32::MIN);
        let mut p = [0f32; ROW_BLOCK];
        for g in tabs.groups.clone() {
            for n in tabs.cols.clone() {
                let gn = tabs.gn(g, n);
                let (tsc, zs) = (tabs.tscale[gn], tabs.zsum[gn]);
                let tp = tab.as_ptr().add(tabs.offset(g, n, 0));
                for b in job.row_blocks.clone() {
                    let ip = ix.as_ptr().add(lay.slot(g, b, 0));
                    let mut acc = [_mm256_setzero_ps(); 8];
                    for t in 0..pg {
                        let w = usize::from(t + 1 == pg);
                        let mut buf = [0f32; 8];
                        std::ptr::copy_nonoverlapping(
                            tp.add(t * plan.slot),
                            buf.as_mut_ptr(),
                            plan.slot,
                        );
                        let tb = _mm256_loadu_ps(buf.as_ptr());
                        for (q, a) in acc.iter_mut().enumerate() {
                            let bytes = _mm_loadl_epi64(ip.add(t * 64 + 8 * q) as *const __m128i);
                            let idx = _mm256_cvtepu8_epi32(bytes);
                            let e = match mir.kind {
                                0 => _mm256_permutevar8x32_ps(tb, idx),
                                k => {
                                    let m = _mm256_cmpgt_epi32(idx, hv[w]);
                                    let mapped = if k == 1 {
                                        _mm256_xor_si256(idx, cv[w])
                                    } else {
                                        _mm256_sub_epi32(cv[w], idx)
                                    };
                                    let e = _mm256_permutevar8x32_ps(
                                        tb,
                                        _mm256_blendv_epi8(idx, mapped, m),
                                    );
                                    _mm256_xor_ps(e, _mm256_castsi256_ps(_mm256_and_si256(m, sign)))
                                }
                            };
                            *a = _mm256_add_ps(*a, e);
                        }
                    }
                    for (q, a) in acc.iter().enumerate() {
                        _mm256_storeu_ps(p.as_mut_ptr().add(8 * q), *a);
                    }
                    let rows = (plan.m - b * ROW_BLOCK).min(ROW_BLOCK);
                    let sz = (g * plan.row_blocks + b) * ROW_BLOCK;
                    for (lane, &pv) in p.iter().enumerate().take(rows) {
                        let yi = job.y_index(b * ROW_BLOCK + lane, n);
                        let z = job.zeros.at(sz + lane);
                        y[yi] = epilogue(plan, pv, job.scales[sz + lane], z, tsc, zs, y[yi]);
                    }
                }
            }
        }
    }
}
