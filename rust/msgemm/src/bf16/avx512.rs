//! The `bf16` kernel on AVX-512 F: `vfmadd231ps` on 16 lanes, in the scalar kernel's order
//! of additions, as the AVX2 kernel ([`super::avx2`]) does on 8 lanes, so the three give the
//! same bits wherever no product is below `2^-126` in magnitude. The `avx512` backend's
//! `bf16` kernel on every AVX-512 CPU but AMD's with AVX-512 BF16 ([`super::dpbf16`]).
//!
//! Per row block (64 rows, four 16-row parts: a vector's lanes are rows), the weights are
//! decoded [`DECODE_INPUTS`] inputs at a time into float32 (16 KiB, resident in L1 while
//! every column reads them) from the dense layout's 4-bit codes
//! ([`crate::dense::DenseLayout`]: a chunk of 8 inputs is 16 rows x 4 bytes, input `i` in
//! bits `4i .. 4i + 4` of a row's dword): one `vpermps` looks 16 rows' values up by code,
//! `(v - z) * s` scales them per row, and an integer round to nearest even keeps bfloat16's
//! 8 bits. [`columns`] then keeps four parts x up to six columns of sums in registers (24 of
//! the 32), reading the activations (bfloat16 values as float32, `(K, N)` row-major) by
//! broadcast.
//!
//! Why FMA and not `vdpbf16ps`, which does two multiplies per lane: on this project's
//! Sapphire Rapids, `vdpbf16ps` issues once per two cycles and `vfmadd231ps` twice per cycle,
//! so this kernel does twice the multiplies per cycle (`examples/bf16_kernels`: nf4 g64
//! 4096 x 4096, 2 threads, N = 64 8.0-8.6 ms against 13.3-13.6).

use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::{Job, Scratch};
use crate::dense::{CHUNK, SUB};
use crate::kernels::avx512::load16;
use crate::layout::ROW_BLOCK;

/// Inputs decoded at a time: 64 rows x 64 inputs of float32, 16 KiB.
pub(in crate::bf16) const DECODE_INPUTS: usize = 64;
/// Parts (16-row vectors) of a row block.
const PARTS: usize = ROW_BLOCK / SUB;
/// Columns whose sums [`columns`] keeps in registers (with the four parts).
const COL_GROUP: usize = 6;

/// Whether this CPU runs the kernel: AVX-512 F (and F16C, for float16 scales, which every
/// AVX-512 CPU has).
pub fn ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("f16c"))
}

/// float32 values rounded to the nearest bfloat16 (ties to even), as float32 (see
/// [`super::avx2`]'s `round_bf16`).
#[inline]
#[target_feature(enable = "avx512f")]
fn round_bf16(v: __m512) -> __m512 {
    let b = _mm512_castps_si512(v);
    let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
    let r = _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)), lsb);
    _mm512_castsi512_ps(_mm512_and_si512(
        r,
        _mm512_set1_epi32(0xffff_0000_u32 as i32),
    ))
}

/// Decodes inputs `j0 .. j0 + len` (`len` a multiple of 8) of row block `rb` into `out`:
/// input `j0 + j`, part `s` at `(j PARTS + s) 16`, its 16 rows' weights `bf16((v[q] - z) s)`.
#[inline(never)]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn decode(job: &Job<'_>, rb: usize, j0: usize, len: usize, out: &mut [f32]) {
    let (lay, g_size) = (job.lay, job.pw.group_size());
    assert!(out.len() >= len * ROW_BLOCK && len.is_multiple_of(CHUNK));
    // SAFETY: 16 floats.
    let table = unsafe { _mm512_loadu_ps(job.values.as_ptr()) };
    for cc in 0..len / CHUNK {
        let j = j0 + cc * CHUNK;
        let (g, c0) = (j / g_size, (j % g_size) / CHUNK);
        for s in 0..PARTS {
            let ti = (g * lay.row_blocks + rb) * ROW_BLOCK + s * SUB;
            // SAFETY: 64 tiled values per (group, row block).
            let (sc, z) = unsafe { (load16(job.scales, ti), job.zeros.map(|z| load16(z, ti))) };
            let word = &lay.data[lay.word(g, rb, s, c0)..][..SUB * 4];
            // SAFETY: 64 bytes, aligned (the layout's chunks are 64-byte words).
            let v = unsafe { _mm512_load_si512(word.as_ptr() as *const __m512i) };
            for i in 0..CHUNK {
                // `vpermps` reads the low 4 bits of each dword: input `i`'s code.
                let idx = _mm512_srlv_epi32(v, _mm512_set1_epi32(4 * i as i32));
                let val = _mm512_permutexvar_ps(idx, table);
                let val = z.map_or(val, |z| _mm512_sub_ps(val, z));
                let w = round_bf16(_mm512_mul_ps(val, sc));
                let at = ((cc * CHUNK + i) * PARTS + s) * SUB;
                // SAFETY: 16 floats inside `out` (asserted).
                unsafe { _mm512_storeu_ps(out[at..at + SUB].as_mut_ptr(), w) };
            }
        }
    }
}

/// Adds inputs `j0 .. j0 + len` of columns `c0 .. c0 + C` to their sums in `ys`
/// (`[column][64 rows]`): weights from `w` ([`decode`]), activations from `a` (`(K, n)`
/// row-major). The sums of the four parts stay in registers.
#[inline(never)]
#[target_feature(enable = "avx512f")]
unsafe fn columns<const C: usize>(
    ys: &mut [f32],
    a: &[f32],
    n: usize,
    j0: usize,
    len: usize,
    c0: usize,
    w: &[f32],
) {
    assert!(w.len() >= len * ROW_BLOCK && ys.len() >= (c0 + C) * ROW_BLOCK);
    assert!(c0 + C <= n && (j0 + len) * n <= a.len() && len >= 1);
    let (y, a, w) = (ys.as_mut_ptr(), a.as_ptr(), w.as_ptr());
    let at = |i: usize, s: usize| (c0 + i) * ROW_BLOCK + s * SUB;
    // SAFETY (loads and stores of the sums): inside `ys` (asserted).
    let mut s0: [__m512; C] = std::array::from_fn(|i| unsafe { _mm512_loadu_ps(y.add(at(i, 0))) });
    let mut s1: [__m512; C] = std::array::from_fn(|i| unsafe { _mm512_loadu_ps(y.add(at(i, 1))) });
    let mut s2: [__m512; C] = std::array::from_fn(|i| unsafe { _mm512_loadu_ps(y.add(at(i, 2))) });
    let mut s3: [__m512; C] = std::array::from_fn(|i| unsafe { _mm512_loadu_ps(y.add(at(i, 3))) });
    for j in 0..len {
        // SAFETY: input `j` of the decoded weights; row `j0 + j` of the activations,
        // columns `c0 ..` (asserted).
        unsafe {
            let wp = w.add(j * ROW_BLOCK);
            let w0 = _mm512_loadu_ps(wp);
            let w1 = _mm512_loadu_ps(wp.add(SUB));
            let w2 = _mm512_loadu_ps(wp.add(2 * SUB));
            let w3 = _mm512_loadu_ps(wp.add(3 * SUB));
            let ap = a.add((j0 + j) * n + c0);
            for i in 0..C {
                let x = _mm512_set1_ps(*ap.add(i));
                s0[i] = _mm512_fmadd_ps(w0, x, s0[i]);
                s1[i] = _mm512_fmadd_ps(w1, x, s1[i]);
                s2[i] = _mm512_fmadd_ps(w2, x, s2[i]);
                s3[i] = _mm512_fmadd_ps(w3, x, s3[i]);
            }
        }
    }
    for i in 0..C {
        // SAFETY: inside `ys` (asserted).
        unsafe {
            _mm512_storeu_ps(y.add(at(i, 0)), s0[i]);
            _mm512_storeu_ps(y.add(at(i, 1)), s1[i]);
            _mm512_storeu_ps(y.add(at(i, 2)), s2[i]);
            _mm512_storeu_ps(y.add(at(i, 3)), s3[i]);
        }
    }
}

/// The sums of row block `rb` into `s.ys` (`[column][64 rows]`); [`ready`] must be true and
/// `a` the call's activations (`(K, N)` row-major, bfloat16 values).
#[target_feature(enable = "avx512f,f16c")]
pub(in crate::bf16) unsafe fn block(job: &Job<'_>, a: &[f32], rb: usize, s: &mut Scratch) {
    let (k, n) = (job.pw.k(), job.n);
    s.ys.fill(0.0);
    let mut j0 = 0;
    while j0 < k {
        let len = (k - j0).min(DECODE_INPUTS);
        // SAFETY: the features are enabled here; the bounds are asserted inside.
        unsafe { decode(job, rb, j0, len, &mut s.w) };
        let mut c0 = 0;
        while c0 < n {
            let (ys, w) = (&mut s.ys[..], &s.w[..]);
            // SAFETY: the features are enabled here; the bounds are asserted inside.
            unsafe {
                match n - c0 {
                    1 => columns::<1>(ys, a, n, j0, len, c0, w),
                    2 => columns::<2>(ys, a, n, j0, len, c0, w),
                    3 => columns::<3>(ys, a, n, j0, len, c0, w),
                    4 => columns::<4>(ys, a, n, j0, len, c0, w),
                    5 => columns::<5>(ys, a, n, j0, len, c0, w),
                    _ => columns::<COL_GROUP>(ys, a, n, j0, len, c0, w),
                }
            }
            c0 += COL_GROUP;
        }
        j0 += len;
    }
}
