//! The `bf16` mode: weights dequantized to bfloat16, activations rounded to bfloat16,
//! products summed in float32. No tables.
//!
//! Codebooks with non-integer values (nf4, float custom codebooks) have no exact integer
//! form, so the dense `i16` path ([`crate::dense`]) does not apply to them, and their batches
//! on `i8` tables cost about one GEMV per column. Intel AMX has a bfloat16 dot product
//! (`tdpbf16ps`: 16 columns x 16 rows x 32 inputs per instruction, float32 sums): weights
//! decoded to bfloat16 tiles in cache as they are used, and never written out whole, make
//! such batches a dense GEMM at a small cost per weight. This is also the arithmetic of
//! bitsandbytes' nf4 layers (weights dequantized to bfloat16, bfloat16 matrix products).
//!
//! The arithmetic, which every kernel follows:
//! - weight `w = bf16((v[q] - z) * s)`: the float32 difference, times the float32 scale,
//!   rounded once to bfloat16 (round to nearest even); `z = 0` without zero points;
//! - activation `a = bf16(x)`;
//! - `y[r][c] = sum_k w[r][k] a[c][k]`, summed in float32 from `+0.0` (a product of two
//!   bfloat16 values is exact in float32).
//!
//! The scalar kernel ([`Kernel::Scalar`]) adds the products in ascending `k` (packed column
//! order), one rounding each; the AVX-512 and AVX2 kernels ([`avx512`], [`avx2`]) follow that
//! sequence with FMA, so the three give the same bits (unless a product falls below
//! `2^-126`). The AMX kernel ([`amx`]) sums a row's 32 inputs per step as the tile unit
//! does, and the AVX-512 BF16 kernel ([`dpbf16`], the `avx512` backend's on AMD CPUs) a pair
//! of inputs per instruction as `vdpbf16ps` does: not bit for bit that sequence (on this
//! project's Xeon (AMX-BF16) about two thirds of the outputs differ from it in the last
//! bits), treating subnormal inputs as zero and flushing subnormal sums. All stay within the
//! float32 bound `K 2^-24 sum_k |w a|` of the float64 sum of the same bfloat16 operands (the
//! tests' oracle), and each is deterministic for any number of threads. Against the exact
//! `Wd @ x`, each product adds at most `2^-8 + 2^-16` of its magnitude (two bfloat16
//! roundings).
//!
//! Applies to codebooks of at most 16 levels (every format but fp8), group sizes that are
//! multiples of [`CHUNK`] (8 inputs: the dense layout's chunk) and K a multiple of [`STEP`]
//! (32 inputs: the AMX and `vdpbf16ps` kernels' step, within which each chunk finds its
//! group's scale).

use half::bf16;
use rayon::prelude::*;

use maleki_common::{alloc, pool, Error, Result};

use crate::dense::{columns_to_rows, DenseLayout, CHUNK, SUB};
use crate::gemm::{check_inputs, check_result, GemmOptions, XLayout, YLayout};
use crate::kernels::{Backend, Tiled};
use crate::layout::ROW_BLOCK;
use crate::packed::PackedWeights;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod dpbf16;

/// Inputs per tile step: one row of an AMX activation tile (32 bfloat16, 64 bytes).
pub const STEP: usize = 32;

/// Columns per AMX tile (and per block of the activation tiles).
pub const COLS: usize = 16;

/// Default-table batches of at least this many columns run in `bf16` mode on the AMX kernel
/// where it applies ([`auto_applies`]): below, `i8` tables are faster (`bf16` decodes every
/// weight once per call).
pub const AUTO_MIN_N: usize = 6;

/// The same on the AVX-512 FMA kernel. On this project's Sapphire Rapids, nf4 g64
/// 4096 x 4096 on 2 threads runs as fast as the AVX-512 `i8` tables at N = 8 and faster from
/// there on (two runs: N = 7 1.78 / 1.75 ms against 1.81 / 1.87, N = 8 1.79 / 1.79 against
/// 1.83 / 1.76, N = 10 1.97 / 1.93 against 2.27 / 2.18, N = 64 9.0 / 8.6 against 13.1 /
/// 12.9), at a third of their error.
pub const AUTO_MIN_N_AVX512: usize = 8;

/// The same on the AVX-512 BF16 kernel (AMD CPUs). Measured on Zen 5 (nf4 4096 x 4096, 2
/// threads, from Python, minima of three alternations, ms, `i8` tables against `bf16`): g64
/// N = 6 0.51-0.54 / 0.53-0.55, N = 7 0.60-0.65 / 0.54-0.57, N = 8 0.68-0.69 / 0.58-0.63,
/// N = 12 0.99 / 0.78; g128 N = 7 0.56 / 0.54, N = 8 0.59 / 0.58. There `vdpbf16ps` runs
/// 1.6-2x faster than the FMA kernel (`examples/bf16_kernels`: N = 8 0.56 against 0.98 ms,
/// N = 64 3.2 against 6.5).
pub const AUTO_MIN_N_AVX512_BF16: usize = 8;

/// The same on the AVX2 kernel (FMA: measured on the same machine against the AVX2 `i8`
/// tables, even at N = 16 and 1.3x faster at N = 64).
pub const AUTO_MIN_N_AVX2: usize = 16;

/// The fewest columns from which default batches that the dense `i16` path would run on
/// `backend` take `bf16` mode instead, by group size (`None`: never). The dense path scales
/// the integer sums of every group of every 16 rows by 16 columns in float32, an epilogue that
/// dominates for small groups; `bf16` mode applies the scales while decoding the weights.
/// - AMX kernel: groups of at most 16 inputs from 8 columns, of at most 32 from 32.
/// - AVX-512 BF16 kernel (AMD): on Zen 5 and later (CPU family 0x1A on) groups of at most 16
///   from 24 columns, of at most 32 from 48; on Zen 4 groups of at most 16 from 32.
/// - AVX-512 FMA and AVX2 kernels: groups of at most 16 from 32 columns.
/// - The portable kernel: never.
///
/// 4096 x 4096, 2 threads, minima, `bf16` against dense, ratios from the same rounds
/// (Sapphire Rapids, busy host). AMX, three runs: G = 16 (uint2, int3, fp4, int4) N = 8
/// 0.55-0.88x, N = 16 0.29-0.85x, N = 64 0.15-0.36x; G = 32 (int4, uint4 with zero points,
/// fp4) N = 16 0.61-1.57x (mixed), N = 32 0.44-0.84x, N = 64 0.21-0.65x; G = 64 and 128
/// 0.8-0.9x at N = 64 (within this host's noise) and slower below. AVX-512 FMA against VNNI:
/// G = 16 N = 8 0.85-1.71x, N = 16 0.81-1.01x, N = 32 0.63-0.75x, N = 64 0.50-0.91x; G = 32
/// 1.3-2x at N <= 32 and 0.9-1.45x at 64. AVX2 FMA against `vpmaddubsw`: G = 16 N = 16
/// 0.61-1.09x, N = 64 0.49-0.77x. AMD's `vdpbf16ps` against VNNI (Zen 5, from Python, minima
/// of three alternations, ms, dense / `bf16`): G = 16 N = 2 0.19 / 0.37, N = 4 0.47-0.52 /
/// 0.43-0.45, N = 8 0.95-1.07 / 0.65-0.90, N = 32 3.4 / 1.8; G = 32 N = 8 0.59 / 0.58,
/// N = 10 0.69 / 0.69, N = 12 0.79-0.87 / 0.76, N = 16 1.06-1.12 / 0.90-0.93, N = 64 4.6 /
/// 3.0; G = 64 N = 16 0.76 / 0.97, N = 64 3.2 / 3.0; G = 128 N = 64 2.2 / 2.8. `bf16` is
/// also the more accurate of the two (about 2e-3 relative L1 against 6e-3 for int8
/// activations). Since stop 42 the dense kernel keeps the rows' results in registers across
/// the groups at every width (`dense::vnni::parts_groups`) and the AMD thresholds moved from 4
/// and 12 columns to 24 and 48 (Zen 5, from Python, minima of five rounds in one process, ms,
/// dense / `bf16`):
/// G = 16 (int3, int4) N = 8 0.97-1.00 / 1.28, N = 12 1.47 / 1.79, N = 16 1.78-1.80 /
/// 2.02-2.11, N = 24 2.64 / 2.39, N = 32 3.3-3.6 / 2.5-3.0; G = 32 with zero points (uint4)
/// N = 24 1.86 / 1.93, N = 32 2.54 / 2.38, N = 48 3.38 / 3.20, N = 64 4.98 / 3.91, without
/// (int4) N = 32 2.17 / 2.42, N = 64 3.86 / 4.15; N = 128: G = 16 10.0 / 6.9, G = 32 6.1-6.3 /
/// 6.5 (near ties go to `bf16`, the more accurate). On Zen 4 (family 0x19, whose 512-bit
/// `vdpbf16ps` and `vpdpbusd` run at half width) groups of 32 stay dense: `bf16` took
/// 1.22-1.53x the dense path's time at every N from 16 to 128 (int4, uint4 with zero points,
/// fp4; from Python, minima of five rounds in one process); groups of 16 (int3, uint2, fp4)
/// N = 16 0.91-1.07x, N = 24 1.02-1.09x, N = 32 0.97-1.04x, N = 64 0.90-0.98x, N = 128
/// 0.80-0.94x.
pub fn dense_to_bf16_min_n(backend: Backend, group_size: usize) -> Option<usize> {
    match (kernel_of(backend)?, group_size) {
        (Kernel::Amx, 0..=16) => Some(8),
        (Kernel::Amx, 17..=32) => Some(32),
        (Kernel::Avx512Bf16, 0..=16) if zen5_on() => Some(24),
        (Kernel::Avx512Bf16, 17..=32) if zen5_on() => Some(48),
        (Kernel::Avx512Bf16, 0..=16) => Some(32),
        (Kernel::Avx512 | Kernel::Avx2, 0..=16) => Some(32),
        _ => None,
    }
}

/// Whether this AMD CPU is a Zen 5 or later (CPU family 0x1A on): full-width 512-bit units.
fn zen5_on() -> bool {
    crate::kernels::cpu_family() >= 0x1a
}

/// Inputs the portable kernel decodes at a time (64 rows x 64 inputs of float32, 16 KiB).
const PORTABLE_INPUTS: usize = 64;

/// The kernel of a `bf16` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// Intel AMX `tdpbf16ps` (Linux on x86-64 CPUs with AMX-BF16 and AVX-512 BF16).
    Amx,
    /// AVX-512 F `vfmadd231ps` (x86-64 CPUs with AVX-512 but not [`Kernel::Avx512Bf16`]'s
    /// choice: Intel's from Skylake-X on): the scalar kernel's order of additions.
    Avx512,
    /// AVX-512 BF16 `vdpbf16ps`: the `avx512` backend's kernel on AMD CPUs with AVX-512 BF16
    /// (Zen 4 and later; see [`dpbf16_preferred`]).
    Avx512Bf16,
    /// AVX2 and FMA `vfmadd231ps` (x86-64 CPUs from Haswell and Zen 1 on): the scalar
    /// kernel's order of additions.
    Avx2,
    /// Portable float32 code in ascending input order.
    Scalar,
}

impl Kernel {
    /// Every kernel.
    pub const ALL: [Kernel; 5] = [
        Kernel::Amx,
        Kernel::Avx512Bf16,
        Kernel::Avx512,
        Kernel::Avx2,
        Kernel::Scalar,
    ];

    /// The backend that runs it (both AVX-512 kernels are the `avx512` backend's).
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Amx => "amx",
            Kernel::Avx512 | Kernel::Avx512Bf16 => "avx512",
            Kernel::Avx2 => "avx2",
            Kernel::Scalar => "scalar",
        }
    }

    /// The kernel itself: its backend and the instruction that does its multiplies.
    pub fn id(self) -> &'static str {
        match self {
            Kernel::Amx => "amx-tdpbf16ps",
            Kernel::Avx512 => "avx512-fma",
            Kernel::Avx512Bf16 => "avx512-vdpbf16ps",
            Kernel::Avx2 => "avx2-fma",
            Kernel::Scalar => "scalar",
        }
    }

    /// Whether it adds the products in the scalar kernel's order (the same bits as it, unless
    /// a product falls below `2^-126`).
    pub fn scalar_order(self) -> bool {
        matches!(self, Kernel::Avx512 | Kernel::Avx2 | Kernel::Scalar)
    }

    /// Whether this CPU (and OS) runs it.
    pub fn runs_here(self) -> bool {
        match self {
            Kernel::Amx => amx_ready(),
            Kernel::Avx512 => avx512_ready(),
            Kernel::Avx512Bf16 => dpbf16_ready(),
            Kernel::Avx2 => avx2_ready(),
            Kernel::Scalar => true,
        }
    }
}

/// Whether this CPU and OS run the AMX `bf16` kernel.
pub fn amx_ready() -> bool {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        amx::ready()
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        false
    }
}

/// Whether this CPU runs the AVX-512 FMA `bf16` kernel (AVX-512 F).
pub fn avx512_ready() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx512::ready()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU runs the AVX-512 BF16 `bf16` kernel (AVX-512 F, BW and BF16).
pub fn dpbf16_ready() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        dpbf16::ready()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the `avx512` backend runs the AVX-512 BF16 kernel rather than the FMA one: on AMD
/// CPUs that have AVX-512 BF16. There `vdpbf16ps` (two multiplies per lane) issues as often
/// as `vfmadd231ps` (one), by AMD's instruction tables for Zen 4 (not yet timed by this
/// project); on Intel's Sapphire Rapids it issues once per two cycles, a quarter of the FMA
/// rate, and the FMA kernel is faster (see [`avx512`]). A fixed rule, not a timing, so a
/// machine's choice (and its bits) never changes from run to run.
pub fn dpbf16_preferred() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        dpbf16_ready() && crate::kernels::amd_cpu()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU runs the AVX2 `bf16` kernel (AVX2, FMA and F16C).
pub fn avx2_ready() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx2::ready()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// An error when `bf16` mode does not apply to these weights (more than 16 levels, a group
/// size that is not a multiple of [`CHUNK`], or K not a multiple of [`STEP`]).
pub fn check_weights(pw: &PackedWeights) -> Result<()> {
    if pw.codebook().levels() > 16 {
        return Err(Error::invalid(
            "table",
            format!(
                "'bf16' takes codebooks of at most 16 levels; {} has {}",
                pw.codebook().format().name(),
                pw.codebook().levels()
            ),
        ));
    }
    // Groups of whole chunks of the dense layout; the AMX and `vdpbf16ps` kernels take K in
    // steps of 32 inputs (their decode finds each chunk's group, so groups of 8 or 16 inputs
    // may split a step).
    if !pw.group_size().is_multiple_of(CHUNK) || !pw.k().is_multiple_of(STEP) {
        return Err(Error::invalid(
            "table",
            format!(
                "'bf16' takes group sizes that are multiples of {CHUNK} and K a multiple of \
                 {STEP}; got group size {}, K = {}",
                pw.group_size(),
                pw.k()
            ),
        ));
    }
    Ok(())
}

/// The kernel of a `bf16` call on `backend`, or an error: the weights do not qualify
/// ([`check_weights`]), the backend has no `bf16` kernel (only `auto`, `amx`, `avx512`,
/// `avx2` and `scalar` do), or `amx` / `avx512` / `avx2` on a CPU without AMX-BF16 / AVX-512
/// / AVX2 and FMA. `auto` takes the first this CPU runs of `amx`, `avx512`, `avx2`,
/// `scalar`; `avx512` the AVX-512 BF16 kernel where [`dpbf16_preferred`], else the FMA one.
pub fn kernel_for(pw: &PackedWeights, backend: Backend) -> Result<Kernel> {
    check_weights(pw)?;
    if let Some(kernel) = kernel_of(backend) {
        return Ok(kernel);
    }
    match backend {
        Backend::Amx => Err(Error::Unsupported(
            "backend 'amx' with table 'bf16' needs a CPU with AMX-BF16 and AVX-512 BF16 (and \
             Linux's permission to use the tiles)"
                .into(),
        )),
        Backend::Avx512 => Err(Error::Unsupported(
            "backend 'avx512' with table 'bf16' needs a CPU with AVX-512 F".into(),
        )),
        Backend::Avx2 => Err(Error::Unsupported(
            "backend 'avx2' with table 'bf16' needs a CPU with AVX2, FMA and F16C".into(),
        )),
        other => Err(Error::invalid(
            "backend",
            format!(
                "table 'bf16' runs on backends 'auto', 'amx', 'avx512', 'avx2' and 'scalar'; got {:?}",
                other.name()
            ),
        )),
    }
}

/// The fewest columns from which default-table batches on `backend` run in `bf16` mode on
/// this CPU ([`AUTO_MIN_N`] on the AMX kernel, [`AUTO_MIN_N_AVX512`] on the AVX-512 FMA
/// one, [`AUTO_MIN_N_AVX512_BF16`] on the AVX-512 BF16 one, [`AUTO_MIN_N_AVX2`] on the AVX2
/// one), or `None` where they never do (the portable kernel is no match for the tables).
pub fn auto_min_n(backend: Backend) -> Option<usize> {
    match kernel_of(backend)? {
        Kernel::Amx => Some(AUTO_MIN_N),
        Kernel::Avx512 => Some(AUTO_MIN_N_AVX512),
        Kernel::Avx512Bf16 => Some(AUTO_MIN_N_AVX512_BF16),
        Kernel::Avx2 => Some(AUTO_MIN_N_AVX2),
        Kernel::Scalar => None,
    }
}

/// The kernel `backend` names or picks on this CPU, if any.
fn kernel_of(backend: Backend) -> Option<Kernel> {
    match backend {
        Backend::Auto | Backend::Amx if amx_ready() => Some(Kernel::Amx),
        Backend::Auto | Backend::Avx512 if dpbf16_preferred() => Some(Kernel::Avx512Bf16),
        Backend::Auto | Backend::Avx512 if avx512_ready() => Some(Kernel::Avx512),
        Backend::Auto | Backend::Avx2 if avx2_ready() => Some(Kernel::Avx2),
        Backend::Auto | Backend::Scalar => Some(Kernel::Scalar),
        _ => None,
    }
}

/// Whether a default-table call of `n` columns whose options resolved to `opts`
/// ([`crate::gemm::auto_precision`]) runs in `bf16` mode instead, at depth `auto`, without
/// mirror tables, for weights it applies to:
/// - still `i8` (not a dense call): a batch of at least [`auto_min_n`] columns on backend
///   `auto`, `amx`, `avx512` or `avx2` of a CPU that runs that backend's `bf16` kernel.
///   Faster and more accurate than `i8` tables there (see the Python docs).
/// - dense `i16`: small groups, from [`dense_to_bf16_min_n`] columns on.
pub fn auto_applies(pw: &PackedWeights, n: usize, opts: &GemmOptions) -> bool {
    use crate::plan::TablePrecision;
    let size = match opts.precision {
        TablePrecision::I8 => auto_min_n(opts.backend).is_some_and(|min| n >= min),
        TablePrecision::I16 => {
            dense_to_bf16_min_n(opts.backend, pw.group_size()).is_some_and(|min| n >= min)
        }
        _ => false,
    };
    size && opts.depth == crate::gemm::Depth::Auto && !opts.mirror && check_weights(pw).is_ok()
}

/// Builds what a `bf16` call reads from `pw` (the dense code layout, tiled scales and zero
/// points). Runs on the current pool.
pub fn prepare(pw: &PackedWeights) -> Result<()> {
    check_weights(pw)?;
    pw.dense_layout()?;
    pw.tiled_scales();
    pw.tiled_zeros();
    Ok(())
}

/// The bfloat16 value nearest `x` (ties to even), as float32.
#[inline]
pub fn round(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// [`round`] for values that are not NaN (what the decoders produce), on the bits: the
/// rounding increment `0x7fff + lsb`, then the low 16 bits cleared (the vector kernels' way;
/// infinities stay infinite, and the largest values round up to infinity as in [`round`]).
#[inline(always)]
fn round_finite(x: f32) -> f32 {
    let b = x.to_bits();
    f32::from_bits(b.wrapping_add(0x7fff + ((b >> 16) & 1)) & 0xffff_0000)
}

/// `y = Wd @ X` in `bf16` mode into `y` (overwritten; `(M, N)` or `(N, M)` row-major as
/// `y_layout`), `x` `(K, N)` or `(N, K)` row-major as `layout` in the original column order.
/// Runs on the library pool (or the current one). Errors: the weights do not qualify, the
/// backend has no `bf16` kernel, `x` / `y` of the wrong size, a non-finite `x`, or a result
/// beyond float32.
pub fn gemm_into_layout(
    pw: &PackedWeights,
    x: &[f32],
    n: usize,
    layout: XLayout,
    y_layout: YLayout,
    backend: Backend,
    y: &mut [f32],
) -> Result<Kernel> {
    let kernel = kernel_for(pw, backend)?;
    gemm_with_kernel(pw, x, n, layout, y_layout, kernel, y)?;
    Ok(kernel)
}

/// [`gemm_into_layout`] on a kernel named directly, for tests and benchmarks (an
/// `Unsupported` error where this CPU does not run it).
pub fn gemm_with_kernel(
    pw: &PackedWeights,
    x: &[f32],
    n: usize,
    layout: XLayout,
    y_layout: YLayout,
    kernel: Kernel,
    y: &mut [f32],
) -> Result<()> {
    check_weights(pw)?;
    if !kernel.runs_here() {
        return Err(Error::Unsupported(format!(
            "this CPU does not run the bf16 kernel {}",
            kernel.id()
        )));
    }
    check_inputs(pw, x, n, layout, Some(y.len()))?;
    let run = |y: &mut [f32]| -> Result<()> {
        let job = Job::new(pw, x, n, layout, kernel)?;
        job.run(y, y_layout)
    };
    if pool::on_a_pool() {
        run(y)?;
    } else {
        pool::install(|| run(y))?;
    }
    check_result(y)
}

/// What the kernels read for every row block of a call.
struct Job<'a> {
    pw: &'a PackedWeights,
    lay: &'a DenseLayout,
    n: usize,
    kernel: Kernel,
    /// The codebook's values, padded to 16 with zeros.
    values: [f32; 16],
    scales: Tiled<'a>,
    zeros: Option<Tiled<'a>>,
    /// The activations rounded to bfloat16, in packed column order: for the AMX and AVX-512
    /// BF16 kernels as tiles ([`dpbf16::tile_activations`], bits), for the others `(K, N)`
    /// row-major (values).
    acts: Acts,
}

enum Acts {
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Tiles(crate::aligned::AlignedVec<u16>),
    KbyN(Vec<f32>),
}

impl<'a> Job<'a> {
    fn new(
        pw: &'a PackedWeights,
        x: &[f32],
        n: usize,
        layout: XLayout,
        kernel: Kernel,
    ) -> Result<Job<'a>> {
        let k = pw.k();
        // Input j of the packed order is original input perm[j].
        let src = |j: usize| pw.k_perm().map_or(j, |p| p[j] as usize);
        let at = |c: usize, j: usize| match layout {
            XLayout::KbyN => x[src(j) * n + c],
            XLayout::NbyK => x[c * k + src(j)],
        };
        let acts = match kernel {
            Kernel::Scalar | Kernel::Avx512 | Kernel::Avx2 => {
                let mut a = alloc::zeroed_vec::<f32>(k * n, "the rounded activations")?;
                a.par_chunks_mut(n).enumerate().for_each(|(j, row)| {
                    for (c, v) in row.iter_mut().enumerate() {
                        *v = round(at(c, j));
                    }
                });
                Acts::KbyN(a)
            }
            Kernel::Amx | Kernel::Avx512Bf16 => {
                #[cfg(target_arch = "x86_64")]
                {
                    Acts::Tiles(dpbf16::tile_activations(x, n, k, layout, pw.k_perm())?)
                }
                #[cfg(not(target_arch = "x86_64"))]
                {
                    unreachable!("no AMX or AVX-512 kernel off x86-64")
                }
            }
        };
        let mut values = [0f32; 16];
        values[..pw.codebook().levels()].copy_from_slice(pw.codebook().values());
        Ok(Job {
            pw,
            lay: pw.dense_layout()?,
            n,
            kernel,
            values,
            scales: pw.tiled_scales(),
            zeros: pw.tiled_zeros(),
            acts,
        })
    }

    /// The whole product into `y`, row blocks in parallel (an error only when the output
    /// columns of `NbyM` do not fit in memory).
    fn run(&self, y: &mut [f32], y_layout: YLayout) -> Result<()> {
        let (m, n) = (self.pw.m(), self.n);
        let scratch = || Scratch::new(self);
        match y_layout {
            YLayout::MbyN => y.par_chunks_mut(ROW_BLOCK * n).enumerate().for_each_init(
                scratch,
                |s, (rb, out)| {
                    self.block(rb, s);
                    for (r, row) in out.chunks_exact_mut(n).enumerate() {
                        for (c, v) in row.iter_mut().enumerate() {
                            *v = s.ys[c * ROW_BLOCK + r];
                        }
                    }
                },
            ),
            YLayout::NbyM => {
                let rbs = m.div_ceil(ROW_BLOCK);
                let mut cols = alloc::zeroed_vec::<f32>(rbs * ROW_BLOCK * n, "the output columns")?;
                cols.par_chunks_mut(ROW_BLOCK * n)
                    .enumerate()
                    .for_each_init(scratch, |s, (rb, out)| {
                        self.block(rb, s);
                        out.copy_from_slice(&s.ys[..ROW_BLOCK * n]);
                    });
                y.par_chunks_mut(m)
                    .enumerate()
                    .for_each(|(c, out)| columns_to_rows(&cols, n, c, out));
            }
        }
        Ok(())
    }

    /// The sums of row block `rb` into `s.ys` (`[column][64 rows]`).
    fn block(&self, rb: usize, s: &mut Scratch) {
        match (self.kernel, &self.acts) {
            #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
            (Kernel::Amx, Acts::Tiles(tiles)) => {
                // SAFETY: `ready` (through `runs_here`) found AMX-BF16 and AVX-512 BF16; the
                // tiles hold every column block of the call, the layout every row block.
                unsafe { amx::block(self, tiles, rb, s) }
            }
            #[cfg(target_arch = "x86_64")]
            (Kernel::Avx512Bf16, Acts::Tiles(tiles)) => {
                // SAFETY: `ready` (through `runs_here`) found AVX-512 F, BW and BF16; the
                // tiles hold every column of the call, the layout every row block.
                unsafe { dpbf16::block(self, tiles, rb, s) }
            }
            #[cfg(target_arch = "x86_64")]
            (Kernel::Avx512, Acts::KbyN(a)) => {
                // SAFETY: `ready` (through `runs_here`) found AVX-512 F and F16C; the
                // activations hold every column of the call, the layout every row block.
                unsafe { avx512::block(self, a, rb, s) }
            }
            #[cfg(target_arch = "x86_64")]
            (Kernel::Avx2, Acts::KbyN(a)) => {
                // SAFETY: `ready` (through `runs_here`) found AVX2, FMA and F16C; the
                // activations hold every column of the call, the layout every row block.
                unsafe { avx2::block(self, a, rb, s) }
            }
            (Kernel::Scalar, Acts::KbyN(a)) => self.scalar_block(a, rb, s),
            _ => unreachable!("activations prepared for the call's kernel"),
        }
    }

    /// The weights of row `row` (of the whole matrix) in packed column order, as float32
    /// (bfloat16 values), from the dense layout: `bf16((v[q] - z) * s)` (the tests' oracle).
    #[cfg(test)]
    fn row_weights(&self, row: usize, out: &mut [f32]) {
        let (g_size, lay) = (self.pw.group_size(), self.lay);
        let (rb, rr) = (row / ROW_BLOCK, row % ROW_BLOCK);
        let (sub, r) = (rr / SUB, rr % SUB);
        for (g, wg) in out.chunks_exact_mut(g_size).enumerate() {
            let t = (g * lay.row_blocks + rb) * ROW_BLOCK + rr;
            let z = self.zeros.map_or(0.0, |z| z.at(t));
            let s = self.scales.at(t);
            for (c, w8) in wg.chunks_exact_mut(CHUNK).enumerate() {
                let word = &lay.data[lay.word(g, rb, sub, c) + r * 4..][..4];
                for (i, w) in w8.iter_mut().enumerate() {
                    let b = word[i / 2];
                    let q = usize::from(if i % 2 == 0 { b & 15 } else { b >> 4 });
                    *w = round((self.values[q] - z) * s);
                }
            }
        }
    }

    /// Decodes inputs `j0 .. j0 + len` (`len` a multiple of 8) of row block `rb` into `out`:
    /// input `j0 + j` of row `r` at `j 64 + r` (rows past `M` hold the layout's padding).
    fn decode_block(&self, rb: usize, j0: usize, len: usize, out: &mut [f32]) {
        let (g_size, lay) = (self.pw.group_size(), self.lay);
        for cc in 0..len / CHUNK {
            let j = j0 + cc * CHUNK;
            let (g, c0) = (j / g_size, (j % g_size) / CHUNK);
            let out = &mut out[cc * CHUNK * ROW_BLOCK..][..CHUNK * ROW_BLOCK];
            for sub in 0..ROW_BLOCK / SUB {
                let words = &lay.data[lay.word(g, rb, sub, c0)..][..SUB * 4];
                for (r, word) in words.chunks_exact(4).enumerate() {
                    let rr = sub * SUB + r;
                    let t = (g * lay.row_blocks + rb) * ROW_BLOCK + rr;
                    let z = self.zeros.map_or(0.0, |z| z.at(t));
                    let s = self.scales.at(t);
                    let codes = u32::from_le_bytes(word.try_into().expect("4 bytes"));
                    for i in 0..CHUNK {
                        let q = (codes >> (4 * i)) as usize & 15;
                        out[i * ROW_BLOCK + rr] = round_finite((self.values[q] - z) * s);
                    }
                }
            }
        }
    }

    /// The portable kernel: per row block, the weights decoded [`PORTABLE_INPUTS`] inputs at
    /// a time ([`Self::decode_block`]), then per column and input the 64 rows' sums in one
    /// loop that the compiler vectorizes (SSE2, NEON), each row's sum still adding its
    /// products in ascending input order, one rounding each (Rust never fuses the multiply
    /// and the add).
    fn scalar_block(&self, a: &[f32], rb: usize, s: &mut Scratch) {
        let (k, n) = (self.pw.k(), self.n);
        s.ys.fill(0.0);
        let mut j0 = 0;
        while j0 < k {
            let len = (k - j0).min(PORTABLE_INPUTS);
            self.decode_block(rb, j0, len, &mut s.w);
            for (c, ys) in s.ys.chunks_exact_mut(ROW_BLOCK).take(n).enumerate() {
                let mut sum: [f32; ROW_BLOCK] = ys.try_into().expect("64 rows");
                for (j, w) in s.w.chunks_exact(ROW_BLOCK).take(len).enumerate() {
                    let x = a[(j0 + j) * n + c];
                    for (y, w) in sum.iter_mut().zip(w) {
                        *y += w * x;
                    }
                }
                ys.copy_from_slice(&sum);
            }
            j0 += len;
        }
    }
}

/// A task's buffers.
struct Scratch {
    /// Sums of a row block, `[column][64 rows]` (the AMX kernel's columns padded to 16;
    /// aligned, as tile loads and stores that split cache lines cost about twice as much).
    ys: crate::aligned::AlignedVec<f32>,
    /// Portable, AVX-512 and AVX2 kernels: the decoded weights of a run of inputs.
    w: Vec<f32>,
    /// AMX and AVX-512 BF16 kernels: the decoded weights of one chunk of steps.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    tiles: crate::aligned::AlignedVec<u16>,
}

impl Scratch {
    fn new(job: &Job<'_>) -> Scratch {
        let n = job.n;
        match job.kernel {
            Kernel::Scalar => Scratch {
                ys: crate::aligned::AlignedVec::zeroed(n * ROW_BLOCK),
                w: vec![0f32; PORTABLE_INPUTS * ROW_BLOCK],
                tiles: crate::aligned::AlignedVec::zeroed(0),
            },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => Scratch {
                ys: crate::aligned::AlignedVec::zeroed(n * ROW_BLOCK),
                w: vec![0f32; avx2::DECODE_INPUTS * ROW_BLOCK],
                tiles: crate::aligned::AlignedVec::zeroed(0),
            },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => Scratch {
                ys: crate::aligned::AlignedVec::zeroed(n * ROW_BLOCK),
                w: vec![0f32; avx512::DECODE_INPUTS * ROW_BLOCK],
                tiles: crate::aligned::AlignedVec::zeroed(0),
            },
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::Avx512 | Kernel::Avx2 => unreachable!("no AVX2 or AVX-512 kernel off x86-64"),
            Kernel::Amx | Kernel::Avx512Bf16 => Scratch {
                ys: crate::aligned::AlignedVec::zeroed(n.next_multiple_of(COLS) * ROW_BLOCK),
                w: Vec::new(),
                #[cfg(target_arch = "x86_64")]
                tiles: crate::aligned::AlignedVec::zeroed(dpbf16::CHUNK_STEPS * dpbf16::STEP_U16),
                #[cfg(not(target_arch = "x86_64"))]
                tiles: crate::aligned::AlignedVec::zeroed(0),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quantize::{quantize, QuantizeOptions};
    use crate::Format;

    fn weights(fmt: Format, m: usize, k: usize, g: usize, seed: u64) -> PackedWeights {
        let mut state = seed;
        let w: Vec<f64> = (0..m * k)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
            })
            .collect();
        let opts = QuantizeOptions {
            group_size: Some(g),
            ..QuantizeOptions::new(fmt)
        };
        quantize(&w, m, k, &opts).expect("quantize")
    }

    /// `len` activations in [-3, 3], spread by `step`.
    fn activations(len: usize, step: usize) -> Vec<f32> {
        (0..len)
            .map(|i| ((i * step % 101) as f32 - 50.0) / 17.0)
            .collect()
    }

    /// The float64 sum of the bfloat16 operands, and the bound of the float32 sums.
    fn oracle(pw: &PackedWeights, x: &[f32], n: usize) -> (Vec<f64>, Vec<f64>) {
        let (m, k) = (pw.m(), pw.k());
        let job = Job::new(pw, x, n, XLayout::KbyN, Kernel::Scalar).unwrap();
        let Acts::KbyN(a) = &job.acts else {
            unreachable!()
        };
        let (mut y, mut bound) = (vec![0f64; m * n], vec![0f64; m * n]);
        let mut row = vec![0f32; k];
        for r in 0..m {
            job.row_weights(r, &mut row);
            for j in 0..k {
                let w = f64::from(row[j]);
                for c in 0..n {
                    let p = w * f64::from(a[j * n + c]);
                    y[r * n + c] += p;
                    bound[r * n + c] += p.abs();
                }
            }
        }
        let gamma = k as f64 * 2f64.powi(-24) * 1.01;
        (y, bound.iter().map(|b| gamma * b).collect())
    }

    #[test]
    fn kernels_sum_the_bf16_operands_within_the_float32_bound() {
        for (fmt, m, k, g, n) in [
            (Format::Nf4, 70, 128, 64, 3),
            (Format::Nf4, 64, 96, 32, 17),
            (Format::Uint4, 33, 64, 32, 1),
            (Format::Fp4, 130, 256, 128, 20),
            // Groups of 16 and 8 inputs: a step of 32 spans several.
            (Format::Uint2, 70, 128, 16, 18),
            (Format::Int3, 65, 64, 8, 5),
        ] {
            let pw = weights(fmt, m, k, g, 7);
            let x = activations(k * n, 37);
            let (want, bound) = oracle(&pw, &x, n);
            // Every kernel this CPU runs (on a Xeon with AMX, all five).
            for kernel in Kernel::ALL.into_iter().filter(|k| k.runs_here()) {
                for y_layout in [YLayout::MbyN, YLayout::NbyM] {
                    let mut y = vec![0f32; m * n];
                    gemm_with_kernel(&pw, &x, n, XLayout::KbyN, y_layout, kernel, &mut y).unwrap();
                    for r in 0..m {
                        for c in 0..n {
                            let got = match y_layout {
                                YLayout::MbyN => y[r * n + c],
                                YLayout::NbyM => y[c * m + r],
                            };
                            let i = r * n + c;
                            assert!(
                                (f64::from(got) - want[i]).abs() <= bound[i],
                                "{fmt:?} {kernel:?} {y_layout:?} ({r}, {c}): {got} vs {}",
                                want[i]
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_fma_kernels_add_as_the_scalar_one() {
        for (fmt, m, k, g, n) in [
            (Format::Nf4, 70, 192, 64, 7),
            (Format::Uint4, 129, 96, 32, 12),
            (Format::Fp4, 64, 256, 128, 1),
            (Format::Nf4, 64, 64, 32, 13),
        ] {
            let pw = weights(fmt, m, k, g, 3);
            let x = activations(k * n, 53);
            let run = |kernel| {
                let mut y = vec![0f32; m * n];
                gemm_with_kernel(&pw, &x, n, XLayout::KbyN, YLayout::MbyN, kernel, &mut y).unwrap();
                y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            };
            let want = run(Kernel::Scalar);
            for kernel in [Kernel::Avx512, Kernel::Avx2] {
                if kernel.runs_here() {
                    assert_eq!(run(kernel), want, "{fmt:?} {kernel:?}");
                }
            }
        }
    }

    #[test]
    fn the_avx512_backend_picks_by_vendor_and_kernels_not_here_are_refused() {
        let pw = weights(Format::Nf4, 64, 64, 32, 1);
        match kernel_for(&pw, Backend::Avx512) {
            Ok(k) => assert_eq!(
                k,
                if dpbf16_preferred() {
                    Kernel::Avx512Bf16
                } else {
                    Kernel::Avx512
                }
            ),
            Err(e) => assert!(!avx512_ready(), "{e}"),
        }
        for kernel in Kernel::ALL.into_iter().filter(|k| !k.runs_here()) {
            let mut y = vec![0f32; 64];
            let err = gemm_with_kernel(
                &pw,
                &[1.0; 64],
                1,
                XLayout::KbyN,
                YLayout::MbyN,
                kernel,
                &mut y,
            )
            .unwrap_err();
            assert!(err.to_string().contains(kernel.id()), "{err}");
        }
    }

    #[test]
    fn small_groups_leave_the_dense_path_for_bf16() {
        use crate::gemm::auto_precision;
        let auto = GemmOptions::default();
        let g64 = weights(Format::Int4, 64, 128, 64, 1);
        for backend in [
            Backend::Auto,
            Backend::Amx,
            Backend::Avx512,
            Backend::Avx2,
            Backend::Scalar,
        ] {
            let opts = GemmOptions { backend, ..auto };
            // The documented rule, by the kernel the backend runs here.
            let rule = |g: usize| match kernel_of(backend) {
                Some(Kernel::Amx) => Some(if g <= 16 { 8 } else { 32 }),
                // Zen 5 on (family 0x1A); Zen 4 keeps groups of 32 dense.
                Some(Kernel::Avx512Bf16) if crate::kernels::cpu_family() >= 0x1a => {
                    Some(if g <= 16 { 24 } else { 48 })
                }
                Some(Kernel::Avx512Bf16) if g <= 16 => Some(32),
                Some(Kernel::Avx512 | Kernel::Avx2) if g <= 16 => Some(32),
                _ => None,
            };
            for g in [8, 16, 32] {
                assert_eq!(
                    dense_to_bf16_min_n(backend, g),
                    rule(g),
                    "{backend:?} g = {g}"
                );
            }
            assert_eq!(dense_to_bf16_min_n(backend, 64), None);
            for n in [2, 3, 4, 7, 8, 11, 12, 23, 24, 31, 32, 47, 48, 64] {
                for g in [16, 32] {
                    let small = weights(Format::Int4, 64, 128, g, 1);
                    let resolved = auto_precision(&small, n, &opts);
                    let dense = resolved.precision == crate::plan::TablePrecision::I16;
                    assert_eq!(
                        auto_applies(&small, n, &resolved),
                        dense && rule(g).is_some_and(|min| n >= min),
                        "{backend:?} g = {g} n = {n}"
                    );
                    // A named depth is not the library's choice.
                    let fixed = GemmOptions {
                        depth: crate::gemm::Depth::Fixed(1),
                        ..resolved
                    };
                    assert!(!auto_applies(&small, n, &fixed));
                }
                // Larger groups stay on the dense path.
                let resolved = auto_precision(&g64, n, &opts);
                if resolved.precision == crate::plan::TablePrecision::I16 {
                    assert!(!auto_applies(&g64, n, &resolved), "{backend:?} n = {n}");
                }
            }
        }
    }

    #[test]
    fn weights_that_do_not_qualify_are_refused() {
        let pw = weights(Format::Nf4, 8, 48, 16, 1);
        let mut y = vec![0f32; 8];
        let err = gemm_into_layout(
            &pw,
            &[1.0; 48],
            1,
            XLayout::KbyN,
            YLayout::MbyN,
            Backend::Auto,
            &mut y,
        )
        .unwrap_err();
        assert!(err.to_string().contains("K a multiple of 32"), "{err}");
        let pw = weights(Format::Nf4, 8, 64, 32, 1);
        let err = kernel_for(&pw, Backend::Neon).unwrap_err();
        assert!(
            err.to_string()
                .contains("'auto', 'amx', 'avx512', 'avx2' and 'scalar'"),
            "{err}"
        );
    }
}
