//! The dense int8 path on Intel AMX tiles (Sapphire Rapids and later Xeons): one `tdpbsud`
//! multiplies 16 columns of up to 64 int8 activations by 16 weight rows of as many unsigned
//! codes and adds the products by fours into a 16 x 16 tile of int32 sums: 16,384
//! multiply-adds per instruction against 64 for a `vpdpbusd` (module [`super::vnni`]).
//!
//! The sums are the exact integers `Q` that the VNNI kernel computes, and they go through
//! the same float operations in the same order ([`epilogue`], as
//! `super::vnni::parts_groups`), so the results are bitwise those of every `i16` kernel.
//! Per group, the codes of the row block's four 16-row parts are unpacked once into bytes
//! laid out as a weight tile wants them (`[input quad][16 rows][4 bytes]`: the low nibbles
//! of a chunk's words are one quad, inputs `0, 2, 4, 6`, the high nibbles the next, `1, 3,
//! 5, 7`, the order in which [`super::Acts`] stores the activations); the activations are
//! stored as tiles ([`tile_activations`]), each a contiguous 16 columns x one step of
//! inputs. (Read in place from `(N, K)` rows, a tile's 16 rows would lie `K` bytes apart:
//! for K = 4096 all in one set of a 12-way L1 cache.)
//!
//! Tiles: `tmm0..tmm3` the sums of the four parts (16 columns x 16 rows of int32 each),
//! `tmm4` the activations of one step of `s` chunks (16 x `8 s` bytes), `tmm5..tmm7` the codes
//! of a step (`2 s` quads x 64 bytes), `s` the largest divisor of the group's chunks up to 8.
//! The four parts' sums do not depend on each other, so their dot products overlap.

use std::arch::asm;
use std::arch::x86_64::*;
use std::ops::Range;
use std::sync::OnceLock;

use super::vnni::nibbles;
use super::{Job, CHUNK, SUB, SUBS};
use crate::aligned::AlignedVec;
use crate::kernels::avx512::{load16, zero_vec};
use crate::layout::ROW_BLOCK;

/// Columns per tile: the rows of the activation and sum tiles.
const COLS: usize = 16;
/// Bytes of unpacked codes per chunk: two input quads of 16 rows x 4 bytes.
const CHUNK_BYTES: usize = 128;

/// Whether this CPU has AMX tiles with int8 dot products (and AVX-512 F and BW, which the
/// unpacking and the epilogue use), and Linux lets this process use them: the tile data is
/// a dynamically enabled state component that a process asks for once
/// (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, Linux 5.16 and later; refused, for
/// instance, by older kernels, under a hypervisor that does not pass AMX on, or while a
/// thread's alternate signal stack is too small for the tile state: then the VNNI kernel
/// runs). Asked on first use, from whichever thread comes first: the grant is the process's.
pub fn ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        let cpu = is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") && {
            // CPUID leaf 7, sub-leaf 0: EDX bit 24 AMX-TILE, bit 25 AMX-INT8.
            #[allow(unused_unsafe)] // safe functions in newer Rust
            // SAFETY: CPUID exists on every x86-64 CPU; leaf 7 is read only where reported.
            let edx = unsafe {
                if __get_cpuid_max(0).0 >= 7 {
                    __cpuid_count(7, 0).edx
                } else {
                    0
                }
            };
            edx & (1 << 24) != 0 && edx & (1 << 25) != 0
        };
        cpu && {
            const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
            const XFEATURE_XTILEDATA: libc::c_long = 18;
            // SAFETY: a system call with integer arguments; it fails cleanly (EINVAL, ENOSPC)
            // where the kernel does not offer the tile data.
            unsafe {
                libc::syscall(
                    libc::SYS_arch_prctl,
                    ARCH_REQ_XCOMP_PERM,
                    XFEATURE_XTILEDATA,
                ) == 0
            }
        }
    })
}

/// Chunks per step: the largest divisor of `chunks` up to 8 (64 activation bytes a row).
pub(super) fn step_chunks(chunks: usize) -> usize {
    (1..=8.min(chunks))
        .rev()
        .find(|s| chunks.is_multiple_of(*s))
        .unwrap_or(1)
}

/// The activations `xq` (`[n][k]`, as [`super::Acts`] stores them) as tiles for steps of
/// [`step_chunks`]`(chunks)` chunks: tile `(b, t)` (columns `16 b ..`, inputs `8 s t ..`) at
/// offset `(b T + t) 128 s` (`T` steps over K), its 16 rows `8 s` bytes apart; zero rows past
/// column `n`.
pub(super) fn tile_activations(
    xq: &[i8],
    n: usize,
    k: usize,
    chunks: usize,
) -> maleki_common::Result<Vec<i8>> {
    let row = CHUNK * step_chunks(chunks);
    let steps = k / row;
    let mut out = maleki_common::alloc::zeroed_vec::<i8>(
        n.div_ceil(COLS) * steps * COLS * row,
        "the int8 activation tiles",
    )?;
    for (c, col) in xq[..n * k].chunks_exact(k).enumerate() {
        let (b, r) = (c / COLS, c % COLS);
        for (t, src) in col.chunks_exact(row).enumerate() {
            let o = ((b * steps + t) * COLS + r) * row;
            out[o..o + row].copy_from_slice(src);
        }
    }
    Ok(out)
}

/// A tile configuration (palette 1: the 64-byte operand of `ldtilecfg`).
#[repr(C, align(64))]
pub(crate) struct Config([u8; 64]);

impl Config {
    /// For steps of `step` chunks (see the module docs).
    fn new(step: usize) -> Config {
        let mut c = [0u8; 64];
        c[0] = 1;
        let mut set = |tile: usize, rows: usize, bytes: usize| {
            c[16 + 2 * tile..18 + 2 * tile].copy_from_slice(&(bytes as u16).to_le_bytes());
            c[48 + tile] = rows as u8;
        };
        for sums in 0..4 {
            set(sums, COLS, 64);
        }
        set(4, COLS, CHUNK * step);
        for codes in 5..8 {
            set(codes, 2 * step, 64);
        }
        Config(c)
    }

    /// Every tile 16 rows x 64 bytes (the `bf16` kernel: [`crate::bf16`]).
    pub(crate) fn full() -> Config {
        let mut c = [0u8; 64];
        c[0] = 1;
        for tile in 0..8 {
            c[16 + 2 * tile..18 + 2 * tile].copy_from_slice(&64u16.to_le_bytes());
            c[48 + tile] = 16;
        }
        Config(c)
    }
}

/// The four parts' sums of one group for 16 columns, into `out` (per part, a 64-byte row of
/// 16 int32 per column): `steps` steps, each the activation tile at `x` (rows `row_a` bytes
/// apart) times the codes of part `p` at `w + p part_bytes` (rows 64 bytes apart), `x` and
/// `w` then advancing by `stride` bytes. One asm block from the zeroing of the sum tiles to
/// their store, so no tile holds data across Rust code.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn group_sums(
    x: *const i8,
    row_a: usize,
    w: *const u8,
    part_bytes: usize,
    steps: usize,
    stride: usize,
    out: *mut Sums,
) {
    debug_assert!(steps >= 1);
    // SAFETY: the caller configured the tiles (`Config`) and keeps every row read inside
    // the activation tiles and the unpacked codes, and `out` is a whole `Sums`.
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "2:",
            "tileloadd tmm4, [{x} + {row_a}*1]",
            "tileloadd tmm5, [{w0} + {row_b}*1]",
            "tdpbsud tmm0, tmm4, tmm5",
            "tileloadd tmm6, [{w1} + {row_b}*1]",
            "tdpbsud tmm1, tmm4, tmm6",
            "tileloadd tmm7, [{w2} + {row_b}*1]",
            "tdpbsud tmm2, tmm4, tmm7",
            "tileloadd tmm5, [{w3} + {row_b}*1]",
            "tdpbsud tmm3, tmm4, tmm5",
            "add {x}, {stride}",
            "add {w0}, {stride}",
            "add {w1}, {stride}",
            "add {w2}, {stride}",
            "add {w3}, {stride}",
            "dec {steps}",
            "jnz 2b",
            "tilestored [{out} + {row_b}*1], tmm0",
            "tilestored [{out} + {row_b}*1 + 1024], tmm1",
            "tilestored [{out} + {row_b}*1 + 2048], tmm2",
            "tilestored [{out} + {row_b}*1 + 3072], tmm3",
            x = inout(reg) x => _,
            w0 = inout(reg) w => _,
            w1 = inout(reg) w.add(part_bytes) => _,
            w2 = inout(reg) w.add(2 * part_bytes) => _,
            w3 = inout(reg) w.add(3 * part_bytes) => _,
            steps = inout(reg) steps => _,
            row_a = in(reg) row_a,
            row_b = in(reg) 64usize,
            stride = in(reg) stride,
            out = in(reg) out,
            options(nostack),
        );
    }
}

/// Releases the tile state when dropped (also when a panic unwinds past the kernel).
pub(crate) struct Tiles;

impl Tiles {
    /// Configures the tiles for this thread.
    pub(crate) fn configure(config: &Config) -> Tiles {
        // SAFETY: `ready` found the tiles and the permission to use them; `config` is a
        // valid palette-1 configuration.
        unsafe {
            asm!("ldtilecfg [{}]", in(reg) config.0.as_ptr(), options(nostack, readonly, preserves_flags))
        };
        Tiles
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: releases the state `configure` set up.
        unsafe { asm!("tilerelease", options(nostack, nomem, preserves_flags)) };
    }
}

/// Unpacks the `chunks` 64-byte words of a part (`w`, 64-byte aligned, the words `ws`
/// bytes apart) into `out`
/// ([`CHUNK_BYTES`] per chunk, 64-byte aligned): the low nibbles, then the high ones, each
/// code replaced by `map[code]` when there is a map.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn unpack(w: *const u8, chunks: usize, ws: usize, map: Option<__m512i>, out: *mut u8) {
    for ch in 0..chunks {
        // SAFETY: the part holds `chunks` aligned words; `out` `chunks * 128` aligned bytes.
        unsafe {
            let v = _mm512_load_si512(w.add(ch * ws) as *const __m512i);
            let (lo, hi) = match map {
                Some(m) => nibbles::<true>(v, m),
                None => nibbles::<false>(v, _mm512_setzero_si512()),
            };
            _mm512_store_si512(out.add(ch * CHUNK_BYTES) as *mut __m512i, lo);
            _mm512_store_si512(out.add(ch * CHUNK_BYTES + 64) as *mut __m512i, hi);
        }
    }
}

/// The four parts' sum tiles as stored: per part, a 64-byte row of 16 int32 per column.
#[repr(C, align(64))]
struct Sums([[[i32; 16]; COLS]; SUBS]);

/// The epilogue of group `g` for the columns `c0 .. c0 + nc` of row block `rb` from their
/// sums `Q` (`sums`: per part, a row per column), into `ys` (`[n][64]`): per 16 rows,
/// `P = a Q + c0 S` and then the `i16` epilogue in the contract's order (`u = P; u -= z
/// zsum; u *= tscale; y += s u`, as `epilogue16_with`: the same bits), with each column's
/// constants and each part's scales and zero points loaded once.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn epilogue<const SLOPE: bool>(
    job: &Job<'_>,
    rb: usize,
    g: usize,
    c0: usize,
    nc: usize,
    sums: &Sums,
    ys: &mut [f32],
) {
    let (plan, acts) = (job.plan, job.acts);
    let rows = plan.m - rb * ROW_BLOCK;
    let parts = rows.div_ceil(SUB).min(SUBS);
    // Valid lanes of the last part (rows past M are never written).
    let last: __mmask16 = match rows - (parts - 1) * SUB {
        16.. => 0xffff,
        l => (1u16 << l) - 1,
    };
    let sz = (g * plan.row_blocks + rb) * ROW_BLOCK;
    // SAFETY: 64 tiled values per (group, row block).
    let (sc, z): ([__m512; SUBS], [__m512; SUBS]) = unsafe {
        (
            std::array::from_fn(|s| load16(job.scales, sz + s * SUB)),
            std::array::from_fn(|s| {
                if plan.zero_term {
                    zero_vec(job.zeros, sz + s * SUB)
                } else {
                    _mm512_setzero_ps()
                }
            }),
        )
    };
    let a = _mm512_set1_epi32(job.a);
    assert!(ys.len() >= (c0 + nc) * ROW_BLOCK);
    for c in 0..nc {
        let gn = (c0 + c) * plan.groups + g;
        let corr = _mm512_set1_epi32(acts.corr[gn]);
        let tsc = _mm512_set1_ps(acts.tsc[gn]);
        let zs = _mm512_set1_ps(acts.zsum[gn]);
        let dst = ys[(c0 + c) * ROW_BLOCK..].as_mut_ptr();
        for s in 0..parts {
            // SAFETY: `sums` rows are aligned; `dst` holds 64 floats (asserted above).
            unsafe {
                let q = _mm512_load_si512(sums.0[s][c].as_ptr() as *const __m512i);
                let p = if SLOPE { _mm512_mullo_epi32(q, a) } else { q };
                let mut u = _mm512_cvtepi32_ps(_mm512_add_epi32(p, corr));
                if plan.zero_term {
                    u = _mm512_sub_ps(u, _mm512_mul_ps(z[s], zs));
                }
                u = _mm512_mul_ps(u, tsc);
                let su = _mm512_mul_ps(sc[s], u);
                let yp = dst.add(s * SUB);
                if s + 1 < parts || last == 0xffff {
                    _mm512_storeu_ps(yp, _mm512_add_ps(_mm512_loadu_ps(yp), su));
                } else {
                    let yv = _mm512_maskz_loadu_ps(last, yp);
                    _mm512_mask_storeu_ps(yp, last, _mm512_add_ps(yv, su));
                }
            }
        }
    }
}

/// [`super::block_sums`] on AMX tiles; [`ready`] must be true, and the activations tiled
/// ([`tile_activations`]).
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn block_sums(job: &Job<'_>, rb: usize, groups: Range<usize>, ys: &mut [f32]) {
    let (plan, lay, acts) = (job.plan, job.lay, job.acts);
    let (n, k) = (plan.n, plan.k);
    assert!(ys.len() >= n * ROW_BLOCK);
    assert!(acts.xq.len() >= n.next_multiple_of(COLS) * k);
    let chunks = lay.chunks;
    let step_len = step_chunks(chunks);
    // Steps per group and over K, and the bytes of a step's activation tile (16 columns x
    // `8 s` inputs), which are also those of its unpacked codes of a part (`s` chunks x 128).
    let group_steps = chunks / step_len;
    let steps = k / (CHUNK * step_len);
    let tile_bytes = COLS * CHUNK * step_len;
    debug_assert_eq!(tile_bytes, step_len * CHUNK_BYTES);
    let config = Config::new(step_len);
    let part_bytes = chunks * CHUNK_BYTES;
    let mut codes = AlignedVec::<u8>::zeroed(SUBS * part_bytes);
    let mut sums = Sums([[[0; 16]; COLS]; SUBS]);
    let map = job
        .map
        // SAFETY: 16 bytes read from the map.
        .map(|m| unsafe { _mm512_broadcast_i32x4(_mm_loadu_si128(m.as_ptr() as *const __m128i)) });
    let _tiles = Tiles::configure(&config);
    for g in groups {
        // Every part of the block is in the layout (rows past M hold code 0).
        for s in 0..SUBS {
            let w = lay.data[lay.part(g, rb, s)..].as_ptr();
            // SAFETY: the part's words lie inside the layout (aligned, see `DenseLayout`).
            unsafe {
                unpack(
                    w,
                    chunks,
                    lay.word_stride,
                    map,
                    codes[s * part_bytes..].as_mut_ptr(),
                )
            };
        }
        let mut c0 = 0;
        while c0 < n {
            // This block's tile of group `g`'s first step (see `tile_activations`).
            let tile0 = ((c0 / COLS) * steps + g * group_steps) * tile_bytes;
            let x = acts.xq[tile0..].as_ptr();
            // SAFETY: the tiles are configured; the reads stay inside the activation tiles
            // (`group_steps` tiles of block `c0 / 16` from group `g`'s first) and `codes`.
            unsafe {
                group_sums(
                    x,
                    CHUNK * step_len,
                    codes.as_ptr(),
                    part_bytes,
                    group_steps,
                    tile_bytes,
                    &raw mut sums,
                )
            };
            let nc = (n - c0).min(COLS);
            // SAFETY: `ys` holds 64 floats per column; 64 tiled values per (group, block).
            unsafe {
                if job.a == 1 {
                    epilogue::<false>(job, rb, g, c0, nc, &sums, ys)
                } else {
                    epilogue::<true>(job, rb, g, c0, nc, &sums, ys)
                }
            };
            c0 += nc;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_the_largest_divisor_up_to_eight() {
        for chunks in 1..=64usize {
            let s = step_chunks(chunks);
            assert!((1..=8).contains(&s) && chunks % s == 0, "{chunks}: {s}");
            assert!(
                (s + 1..=8).all(|d| chunks % d != 0),
                "{chunks}: a larger divisor than {s}"
            );
        }
        assert_eq!([16, 4, 17, 12, 5, 1].map(step_chunks), [8, 4, 1, 6, 5, 1]);
    }

    #[test]
    fn configurations_meet_the_tile_constraints() {
        for s in 1..=8 {
            let c = Config::new(s).0;
            let colsb = |t: usize| usize::from(u16::from_le_bytes([c[16 + 2 * t], c[17 + 2 * t]]));
            let rows = |t: usize| usize::from(c[48 + t]);
            assert_eq!((c[0], c[1]), (1, 0), "palette 1, start row 0");
            assert!(c[2..16]
                .iter()
                .chain(&c[32..48])
                .chain(&c[56..])
                .all(|&b| b == 0));
            for t in 0..8 {
                assert!(
                    rows(t) <= 16 && colsb(t) <= 64 && colsb(t) % 4 == 0,
                    "tmm{t}"
                );
            }
            // tdpbsud C, A (tmm4), B: C rows = A rows, C bytes = B bytes, A bytes = 4 B rows.
            for (cc, b) in [(0, 5), (1, 6), (2, 7), (3, 5)] {
                assert_eq!(
                    (rows(cc), colsb(cc)),
                    (rows(4), colsb(b)),
                    "s={s} tmm{cc} tmm{b}"
                );
                assert_eq!(colsb(4), 4 * rows(b), "s={s} tmm{b}");
            }
            assert_eq!((rows(4), colsb(4)), (COLS, CHUNK * s));
        }
    }

    #[test]
    fn activation_tiles_hold_every_value_once() {
        // n = 21 columns (a second, partial block), k = 96 with groups of 48 (6 chunks:
        // steps of 6, rows of 48 bytes).
        let (n, k, chunks) = (21, 96, 6);
        let xq: Vec<i8> = (0..n * k).map(|i| (i % 251) as i8).collect();
        let t = tile_activations(&xq, n, k, chunks).unwrap();
        let row = CHUNK * step_chunks(chunks);
        let steps = k / row;
        assert_eq!(row, 48);
        assert_eq!(t.len(), 2 * steps * COLS * row);
        for b in 0..2 {
            for st in 0..steps {
                for r in 0..COLS {
                    for j in 0..row {
                        let got = t[((b * steps + st) * COLS + r) * row + j];
                        let c = b * COLS + r;
                        let want = if c < n { xq[c * k + st * row + j] } else { 0 };
                        assert_eq!(got, want, "block {b} step {st} row {r} byte {j}");
                    }
                }
            }
        }
    }
}
