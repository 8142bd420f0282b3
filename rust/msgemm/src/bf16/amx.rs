//! The `bf16` kernel on Intel AMX tiles: `tdpbf16ps` multiplies 16 columns of 32 bfloat16
//! activations by 16 weight rows of as many bfloat16 weights and adds the products into a
//! 16 x 16 tile of float32 sums (in the unit's own order of roundings: see [`crate::bf16`]).
//!
//! Per row block (64 rows, four 16-row parts), the weights are decoded [`CHUNK_STEPS`] steps
//! of 32 inputs at a time into weight tiles (32 KiB, resident in L1 while every column block
//! reads them): from the dense layout's 4-bit codes ([`DenseLayout`]: a chunk of 8 inputs is
//! 16 rows x 4 bytes, byte `j` the codes of inputs `2j`, `2j + 1`), `vpermps` looks the values
//! up by code, `(v - z) * s` scales them per row, `vcvtne2ps2bf16` rounds them, and a `vpermw`
//! pairs inputs `2j` and `2j + 1` of each row into one dword, the tile layout `tdpbf16ps`
//! takes for its second operand (a row per input pair, a dword per weight row). The
//! activations are tiles too ([`tile_activations`]), 16 columns x 32 inputs, contiguous.
//!
//! Tiles: `tmm0..tmm3` the sums of the four parts for 16 columns (rows 64 floats apart in the
//! task's `[column][64 rows]` buffer, loaded and stored around each chunk of steps), `tmm4`
//! the activations of a step, `tmm5..tmm7` the weights.

use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

use half::bf16;
use rayon::prelude::*;

use super::{Job, Scratch, COLS, STEP};
use crate::aligned::AlignedVec;
use crate::dense::amx::{Config, Tiles};
use crate::dense::{CHUNK, SUB};
use crate::gemm::XLayout;
use crate::kernels::avx512::load16;
use crate::layout::ROW_BLOCK;

/// bfloat16 values in a 1 KiB tile (16 rows x 64 bytes).
const TILE_U16: usize = 512;
/// Parts (16-row tiles) of a row block.
const PARTS: usize = ROW_BLOCK / SUB;
/// bfloat16 values of one step's decoded weights: the four parts' tiles.
pub(in crate::bf16) const STEP_U16: usize = PARTS * TILE_U16;
/// Steps decoded at a time: 8 x 4 KiB.
pub(in crate::bf16) const CHUNK_STEPS: usize = 8;

/// Whether this CPU runs the kernel: the AMX tiles ready for use ([`crate::dense::amx::ready`],
/// with AVX-512 F and BW), AMX-BF16 (CPUID leaf 7 EDX bit 22) and AVX-512 BF16
/// (`vcvtne2ps2bf16`).
pub fn ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        crate::dense::amx::ready() && is_x86_feature_detected!("avx512bf16") && {
            #[allow(unused_unsafe)] // safe functions in newer Rust
            // SAFETY: leaf 7 exists (`dense::amx::ready` read it).
            let edx = unsafe { __cpuid_count(7, 0).edx };
            edx & (1 << 22) != 0
        }
    })
}

/// The activations rounded to bfloat16 (`x` `(K, N)` or `(N, K)` row-major as `layout`;
/// packed input `j` is original input `perm[j]`) as tiles: tile `(b, t)` (columns `16 b ..`,
/// inputs `32 t ..`) at `(b T + t) 512` (`T = K / 32` steps), row `r` (column `16 b + r`)
/// its 32 inputs; zero rows past column `n`. Read in the order `x` is laid out in.
pub(in crate::bf16) fn tile_activations(
    x: &[f32],
    n: usize,
    k: usize,
    layout: XLayout,
    perm: Option<&[u32]>,
) -> AlignedVec<u16> {
    let steps = k / STEP;
    let src = |j: usize| perm.map_or(j, |p| p[j] as usize);
    let mut out = AlignedVec::<u16>::zeroed(n.div_ceil(COLS) * steps * TILE_U16);
    let at = |j: usize, r: usize| ((j / STEP) * COLS + r) * STEP + j % STEP;
    out.par_chunks_mut(steps * TILE_U16)
        .enumerate()
        .for_each(|(b, block)| {
            let cols = COLS.min(n - b * COLS);
            match layout {
                XLayout::KbyN => {
                    for j in 0..k {
                        let row = &x[src(j) * n + b * COLS..][..cols];
                        for (r, v) in row.iter().enumerate() {
                            block[at(j, r)] = bf16::from_f32(*v).to_bits();
                        }
                    }
                }
                XLayout::NbyK => {
                    for r in 0..cols {
                        let col = &x[(b * COLS + r) * k..][..k];
                        for j in 0..k {
                            block[at(j, r)] = bf16::from_f32(col[src(j)]).to_bits();
                        }
                    }
                }
            }
        });
    out
}

/// Decodes steps `t0 .. t0 + steps` of row block `rb` into `out` (`steps` x [`STEP_U16`]):
/// per step, the weight tiles of the four parts (see the module docs).
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn decode(job: &Job<'_>, rb: usize, t0: usize, steps: usize, out: &mut [u16]) {
    let (lay, g_size) = (job.lay, job.pw.group_size());
    assert!(out.len() >= steps * STEP_U16);
    // SAFETY: 16 floats.
    let table = unsafe { _mm512_loadu_ps(job.values.as_ptr()) };
    // Word 2r of the result is word r (input 2j of row r), word 2r + 1 is word 16 + r.
    let pair = _mm512_set_epi16(
        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4,
        19, 3, 18, 2, 17, 1, 16, 0,
    );
    let shift = |bits: u32| _mm512_set1_epi32(bits as i32);
    for t in 0..steps {
        let j0 = (t0 + t) * STEP;
        let g = j0 / g_size;
        let c0 = (j0 % g_size) / CHUNK;
        for s in 0..PARTS {
            let ti = (g * lay.row_blocks + rb) * ROW_BLOCK + s * SUB;
            // SAFETY: 64 tiled values per (group, row block).
            let (sc, z) = unsafe { (load16(job.scales, ti), job.zeros.map(|z| load16(z, ti))) };
            let words = &lay.data[lay.part(g, rb, s) + c0 * SUB * 4..][..STEP / CHUNK * 64];
            let dst = &mut out[(t * PARTS + s) * TILE_U16..][..TILE_U16];
            for (cc, word) in words.chunks_exact(64).enumerate() {
                // SAFETY: 64 bytes, aligned (the layout's chunks are 64-byte words).
                let v = unsafe { _mm512_load_si512(word.as_ptr() as *const __m512i) };
                for j in 0..4u32 {
                    // `vpermps` reads the low 4 bits of each dword: the low nibble of byte
                    // `j`, then (shifted 4 more) its high nibble.
                    let lo = _mm512_permutexvar_ps(_mm512_srlv_epi32(v, shift(8 * j)), table);
                    let hi = _mm512_permutexvar_ps(_mm512_srlv_epi32(v, shift(8 * j + 4)), table);
                    let (lo, hi) = match z {
                        Some(z) => (_mm512_sub_ps(lo, z), _mm512_sub_ps(hi, z)),
                        None => (lo, hi),
                    };
                    let (lo, hi) = (_mm512_mul_ps(lo, sc), _mm512_mul_ps(hi, sc));
                    // SAFETY: 32 bfloat16 bits reinterpreted as 16-bit integers (same size).
                    let b: __m512i = unsafe { std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo)) };
                    let row = _mm512_permutexvar_epi16(pair, b);
                    let o = (cc * 4 + j as usize) * 32;
                    // SAFETY: 32 values of the tile's row `4 cc + j`.
                    unsafe {
                        _mm512_storeu_si512(dst[o..o + 32].as_mut_ptr() as *mut __m512i, row)
                    };
                }
            }
        }
    }
}

/// Adds `steps` steps of one column block to its four sum tiles at `ys` (rows 256 bytes
/// apart, part `s` at byte `64 s`): activation tiles from `x` and weight tiles from `w`
/// (both advancing a step at a time). One asm block from the load of the sums to their
/// store, so no tile holds data across Rust code.
#[inline(always)]
unsafe fn column_block(ys: *mut f32, x: *const u16, w: *const u16, steps: usize) {
    debug_assert!(steps >= 1);
    // SAFETY: the caller configured the tiles ([`Config::full`]), `ys` holds 16 columns of
    // 64 floats, `x` `steps` activation tiles and `w` `steps` steps of four weight tiles.
    unsafe {
        asm!(
            "tileloadd tmm0, [{y} + {ystride}*1]",
            "tileloadd tmm1, [{y} + {ystride}*1 + 64]",
            "tileloadd tmm2, [{y} + {ystride}*1 + 128]",
            "tileloadd tmm3, [{y} + {ystride}*1 + 192]",
            "2:",
            "tileloadd tmm4, [{x} + {row}*1]",
            "tileloadd tmm5, [{w} + {row}*1]",
            "tdpbf16ps tmm0, tmm4, tmm5",
            "tileloadd tmm6, [{w} + {row}*1 + 1024]",
            "tdpbf16ps tmm1, tmm4, tmm6",
            "tileloadd tmm7, [{w} + {row}*1 + 2048]",
            "tdpbf16ps tmm2, tmm4, tmm7",
            "tileloadd tmm5, [{w} + {row}*1 + 3072]",
            "tdpbf16ps tmm3, tmm4, tmm5",
            "add {x}, 1024",
            "add {w}, 4096",
            "dec {steps}",
            "jnz 2b",
            "tilestored [{y} + {ystride}*1], tmm0",
            "tilestored [{y} + {ystride}*1 + 64], tmm1",
            "tilestored [{y} + {ystride}*1 + 128], tmm2",
            "tilestored [{y} + {ystride}*1 + 192], tmm3",
            y = in(reg) ys,
            x = inout(reg) x => _,
            w = inout(reg) w => _,
            steps = inout(reg) steps => _,
            ystride = in(reg) 4 * ROW_BLOCK,
            row = in(reg) 64usize,
            options(nostack),
        );
    }
}

/// The sums of row block `rb` into `s.ys` (`[column][64 rows]`, columns padded to 16);
/// [`ready`] must be true and `tiles` the call's activation tiles.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(in crate::bf16) unsafe fn block(job: &Job<'_>, tiles: &[u16], rb: usize, s: &mut Scratch) {
    let (k, n) = (job.pw.k(), job.n);
    let steps = k / STEP;
    let blocks = n.div_ceil(COLS);
    assert!(tiles.len() >= blocks * steps * TILE_U16);
    assert!(s.ys.len() >= blocks * COLS * ROW_BLOCK);
    assert!(s.tiles.len() >= CHUNK_STEPS * STEP_U16);
    s.ys.fill(0.0);
    let _tiles = Tiles::configure(&Config::full());
    let mut t0 = 0;
    while t0 < steps {
        let st = (steps - t0).min(CHUNK_STEPS);
        // SAFETY: the features are enabled here; `s.tiles` holds `st` steps (asserted).
        unsafe { decode(job, rb, t0, st, &mut s.tiles) };
        for b in 0..blocks {
            // SAFETY: the tiles are configured; `ys` holds the block's 16 columns, the
            // activation tiles `(b, t0 ..)` and the decoded steps exist (asserted above).
            unsafe {
                column_block(
                    s.ys.as_mut_ptr().add(b * COLS * ROW_BLOCK),
                    tiles.as_ptr().add((b * steps + t0) * TILE_U16),
                    s.tiles.as_ptr(),
                    st,
                )
            };
        }
        t0 += st;
    }
}
