//! The `bf16` kernel on Intel AMX tiles: `tdpbf16ps` multiplies 16 columns of 32 bfloat16
//! activations by 16 weight rows of as many bfloat16 weights and adds the products into a
//! 16 x 16 tile of float32 sums (in the unit's own order of roundings: see [`crate::bf16`]).
//!
//! Per row block (64 rows, four 16-row parts), the weights are decoded [`CHUNK_STEPS`] steps
//! of 32 inputs at a time into weight tiles ([`decode`]: 32 KiB, resident in L1 while every
//! column block reads them), the layout `tdpbf16ps` takes for its second operand (a row per
//! input pair, a dword per weight row). The activations are tiles too
//! ([`super::dpbf16::tile_activations`]), 16 columns x 32 inputs, contiguous.
//!
//! Tiles: `tmm0..tmm3` the sums of the four parts for 16 columns (rows 64 floats apart in the
//! task's `[column][64 rows]` buffer, loaded and stored around each chunk of steps), `tmm4`
//! the activations of a step, `tmm5..tmm7` the weights.

use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::dpbf16::{decode, CHUNK_STEPS, STEP_U16, TILE_U16};
use super::{Job, Scratch, COLS, STEP};
use crate::dense::amx::{Config, Tiles};
use crate::layout::ROW_BLOCK;

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
