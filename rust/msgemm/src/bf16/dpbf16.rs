//! The `bf16` kernel on AVX-512 BF16 (`vdpbf16ps`: per float32 lane, the products of a pair
//! of bfloat16 weights and a pair of bfloat16 activations added to the lane's sum), which the
//! `avx512` backend runs on AMD CPUs (Zen 4 and later, where `vdpbf16ps` issues as often as
//! `vfmadd231ps` and does twice its multiplies), and the pieces the AMX kernel
//! ([`super::amx`]) shares with it: the activation tiles and the weight decode. (On Intel's
//! Sapphire Rapids it issues once per two cycles, and the FMA kernel, [`super::avx512`], is
//! 1.3-1.7x faster: see [`super::dpbf16_preferred`].)
//!
//! Per row block (64 rows, four 16-row parts), the weights are decoded [`CHUNK_STEPS`] steps
//! of 32 inputs at a time ([`decode`]: 32 KiB, resident in L1 while every column reads them)
//! from the dense layout's 4-bit codes ([`crate::dense::DenseLayout`]: a chunk of 8 inputs is
//! 16 rows x 4 bytes, byte `j` the codes of inputs `2j`, `2j + 1`): `vpermps` looks the values
//! up by code, `(v - z) * s` scales them per row, `vcvtne2ps2bf16` rounds them, and a `vpermw`
//! pairs inputs `2j` and `2j + 1` of each row into one dword. A step of a 16-row part is then
//! 16 vectors (one per input pair) of 16 dwords (one per row): AMX's weight tile, and
//! `vdpbf16ps`' first operand, with the column's activation pair broadcast as the second.
//! [`columns`] keeps the sums of four parts x up to four columns in registers through a chunk.

use std::arch::x86_64::*;
use std::sync::OnceLock;

use half::bf16;
use rayon::prelude::*;

use super::{Job, Scratch, COLS, STEP};
use crate::aligned::AlignedVec;
use crate::dense::{CHUNK, SUB};
use crate::gemm::XLayout;
use crate::kernels::avx512::load16;
use crate::layout::ROW_BLOCK;

/// bfloat16 values in a 1 KiB tile (16 rows x 64 bytes).
pub(in crate::bf16) const TILE_U16: usize = 512;
/// Parts (16-row tiles) of a row block.
const PARTS: usize = ROW_BLOCK / SUB;
/// bfloat16 values of one step's decoded weights: the four parts' tiles.
pub(in crate::bf16) const STEP_U16: usize = PARTS * TILE_U16;
/// Steps decoded at a time: 8 x 4 KiB.
pub(in crate::bf16) const CHUNK_STEPS: usize = 8;
/// Columns whose sums [`columns`] keeps in registers (with the four parts: 16 of 32 vector
/// registers, and four for the weights).
const COL_GROUP: usize = 4;

/// Whether this CPU runs the kernel (and the decode): AVX-512 F, BW and BF16.
pub fn ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512bf16")
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
) -> maleki_common::Result<AlignedVec<u16>> {
    let steps = k / STEP;
    let src = |j: usize| perm.map_or(j, |p| p[j] as usize);
    let mut out = AlignedVec::<u16>::try_zeroed(
        n.div_ceil(COLS) * steps * TILE_U16,
        "the bfloat16 activation tiles",
    )?;
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
    Ok(out)
}

/// Decodes steps `t0 .. t0 + steps` of row block `rb` into `out` (`steps` x [`STEP_U16`]):
/// per step, the weight tiles of the four parts (see the module docs).
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(in crate::bf16) unsafe fn decode(
    job: &Job<'_>,
    rb: usize,
    t0: usize,
    steps: usize,
    out: &mut [u16],
) {
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
        for s in 0..PARTS {
            let dst = &mut out[(t * PARTS + s) * TILE_U16..][..TILE_U16];
            // The step's chunks of 8 inputs, each in its group (groups of 8 or 16 inputs
            // split a step; larger ones hold it whole, and their scales are loaded once).
            let mut loaded = usize::MAX;
            let (mut sc, mut z) = (_mm512_setzero_ps(), None);
            for cc in 0..STEP / CHUNK {
                let input = j0 + cc * CHUNK;
                let (g, c) = (input / g_size, (input % g_size) / CHUNK);
                if g != loaded {
                    let ti = (g * lay.row_blocks + rb) * ROW_BLOCK + s * SUB;
                    // SAFETY: 64 tiled values per (group, row block).
                    (sc, z) = unsafe { (load16(job.scales, ti), job.zeros.map(|z| load16(z, ti))) };
                    loaded = g;
                }
                let word = &lay.data[lay.word(g, rb, s, c)..][..64];
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

/// Adds steps `0 .. steps` of columns `c0 .. c0 + C` to their sums in `ys`
/// (`[column][64 rows]`): weights from `w` (decoded steps, [`decode`]), activations from
/// `acts` (the call's tiles, [`tile_activations`], of `t_all` steps), steps `t0 ..`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn columns<const C: usize>(
    ys: &mut [f32],
    acts: &[u16],
    t_all: usize,
    t0: usize,
    c0: usize,
    w: &[u16],
    steps: usize,
) {
    assert!(w.len() >= steps * STEP_U16);
    assert!(ys.len() >= (c0 + C) * ROW_BLOCK);
    // Activation pair `j` of column `c` in step `t0 + t`: the dword at `col[c] + t 512 + 2j`.
    let col: [usize; C] = std::array::from_fn(|i| {
        let c = c0 + i;
        ((c / COLS) * t_all + t0) * TILE_U16 + (c % COLS) * STEP
    });
    assert!(col
        .iter()
        .all(|&o| o + (steps - 1) * TILE_U16 + STEP <= acts.len()));
    let (y, a, w) = (ys.as_mut_ptr(), acts.as_ptr(), w.as_ptr());
    let mut sum = [[_mm512_setzero_ps(); C]; PARTS];
    for (s, part) in sum.iter_mut().enumerate() {
        for (i, v) in part.iter_mut().enumerate() {
            // SAFETY: inside `ys` (asserted).
            *v = unsafe { _mm512_loadu_ps(y.add((c0 + i) * ROW_BLOCK + s * SUB)) };
        }
    }
    for t in 0..steps {
        for j in 0..STEP / 2 {
            // SAFETY: step `t` of the decoded weights, row `j` of each part's tile (asserted).
            let wv: [__m512bh; PARTS] = std::array::from_fn(|s| unsafe {
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                    w.add((t * PARTS + s) * TILE_U16 + j * 32) as *const __m512i,
                ))
            });
            for i in 0..C {
                // SAFETY: inside the activation tiles (asserted); a dword of two bfloat16.
                let pair = unsafe {
                    (a.add(col[i] + t * TILE_U16 + 2 * j) as *const i32).read_unaligned()
                };
                let x: __m512bh = unsafe { std::mem::transmute(_mm512_set1_epi32(pair)) };
                for s in 0..PARTS {
                    sum[s][i] = _mm512_dpbf16_ps(sum[s][i], wv[s], x);
                }
            }
        }
    }
    for (s, part) in sum.iter().enumerate() {
        for (i, v) in part.iter().enumerate() {
            // SAFETY: inside `ys` (asserted).
            unsafe { _mm512_storeu_ps(y.add((c0 + i) * ROW_BLOCK + s * SUB), *v) };
        }
    }
}

/// The sums of row block `rb` into `s.ys` (`[column][64 rows]`, columns padded to 16);
/// [`ready`] must be true and `tiles` the call's activation tiles.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(in crate::bf16) unsafe fn block(job: &Job<'_>, tiles: &[u16], rb: usize, s: &mut Scratch) {
    let (k, n) = (job.pw.k(), job.n);
    let steps = k / STEP;
    assert!(s.tiles.len() >= CHUNK_STEPS * STEP_U16);
    s.ys.fill(0.0);
    let mut t0 = 0;
    while t0 < steps {
        let st = (steps - t0).min(CHUNK_STEPS);
        // SAFETY: the features are enabled here; `s.tiles` holds `st` steps (asserted).
        unsafe { decode(job, rb, t0, st, &mut s.tiles) };
        let mut c0 = 0;
        while c0 < n {
            let (ys, w) = (&mut s.ys[..], &s.tiles[..]);
            // SAFETY: the features are enabled here; the bounds are asserted inside.
            unsafe {
                match n - c0 {
                    1 => columns::<1>(ys, tiles, steps, t0, c0, w, st),
                    2 => columns::<2>(ys, tiles, steps, t0, c0, w, st),
                    3 => columns::<3>(ys, tiles, steps, t0, c0, w, st),
                    _ => columns::<COL_GROUP>(ys, tiles, steps, t0, c0, w, st),
                }
            }
            c0 += COL_GROUP;
        }
        t0 += st;
    }
}
