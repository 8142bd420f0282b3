//! Phase 2 kernels: accumulate table entries for blocks of 64 rows (spec sections 2 and 5).
//!
//! Every backend implements [`LutKernel`]. [`select`] resolves a [`Backend`] request for a
//! [`Plan`] at run time (CPU features, formats and depths each kernel supports). The contract
//! every kernel satisfies (bitwise equality with [`scalar`], the fixed order of operations)
//! is written in `rust/msgemm/KERNELS.md`.
//!
//! Adding a SIMD backend: put it in `kernels/<name>.rs` as a `pub static` implementing
//! [`LutKernel`], declare the module below, and return it from [`registered`].

use std::ops::Range;

use maleki_common::{Error, Result};

use crate::format::Involution;
use crate::layout::{LayoutKind, TileLayout};
use crate::plan::{Plan, TablePrecision};
use crate::table::{self, BlockOut, TableData, TableSet};

#[cfg(target_arch = "x86_64")]
pub mod avx2;
#[cfg(target_arch = "x86_64")]
pub mod avx512;
#[cfg(target_arch = "aarch64")]
pub mod neon;
pub mod scalar;

/// Which kernel runs a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The fastest available kernel that supports the plan (SIMD first, scalar last).
    Auto,
    /// AVX-512 BW + VBMI byte-table kernels (Ice Lake, Sapphire Rapids, Zen 4+).
    Avx512,
    /// Intel AMX tiles: the dense `i16` path only (`table="i16"`; see [`crate::dense`]).
    Amx,
    /// AVX2 `vpshufb` kernels.
    Avx2,
    /// Arm64 NEON `tbl` kernels.
    Neon,
    /// The portable scalar kernel: every format, depth and precision; the oracle.
    Scalar,
    /// The instrumented copy of the scalar kernel that counts operations (`f32` tables only).
    Reference,
}

impl Backend {
    pub const ALL: [Backend; 7] = [
        Backend::Auto,
        Backend::Avx512,
        Backend::Amx,
        Backend::Avx2,
        Backend::Neon,
        Backend::Scalar,
        Backend::Reference,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Backend::Auto => "auto",
            Backend::Avx512 => "avx512",
            Backend::Amx => "amx",
            Backend::Avx2 => "avx2",
            Backend::Neon => "neon",
            Backend::Scalar => "scalar",
            Backend::Reference => "reference",
        }
    }

    pub fn from_name(name: &str) -> Result<Backend> {
        Backend::ALL.into_iter().find(|b| b.name() == name).ok_or_else(|| {
            Error::invalid(
                "backend",
                format!("must be one of 'auto', 'avx512', 'amx', 'avx2', 'neon', 'scalar', 'reference'; got {name:?}"),
            )
        })
    }
}

/// The effective zero points `z[m, g]` of a job.
#[derive(Debug, Clone, Copy)]
pub enum Zeros<'a> {
    /// No zero term.
    None,
    /// The same value for every row and group: weights without zero points read through a
    /// shifted codebook (`z = -shift`, mirror mode). Kept as one number instead of a tiled
    /// array of `M x groups` equal floats that every group would stream next to the indices.
    Uniform(f32),
    /// Tiled `[g][rb][64]` (padding rows 0).
    Tiled(Tiled<'a>),
}

impl Zeros<'_> {
    /// `z` at offset `i` of the tiled layout (`i = (g * row_blocks + rb) * 64 + lane`).
    #[inline(always)]
    pub fn at(&self, i: usize) -> f32 {
        match self {
            Zeros::None => 0.0,
            Zeros::Uniform(z) => *z,
            Zeros::Tiled(z) => z.at(i),
        }
    }

    /// The tiled array, if there is one (for prefetching).
    #[inline(always)]
    pub fn tiled(&self) -> Option<Tiled<'_>> {
        match self {
            Zeros::Tiled(z) => Some(*z),
            _ => None,
        }
    }
}

/// A tiled per-(row, group) array of a job (`[g][rb][64]`, padding rows 0): the scales
/// `s[m, g]` or the effective zero points, as the kernels read them.
///
/// When every value is a float16 value (GPTQ, AWQ and ONNX Runtime store scales so, MX scales
/// are powers of two, integer zero points are, `quantize(..., scale_dtype=float16)` rounds
/// scales so) they are kept as float16 bits: the kernels read half the bytes and widen them to
/// the same float32 values, so results do not depend on the variant.
#[derive(Debug, Clone, Copy)]
pub enum Tiled<'a> {
    F32(&'a [f32]),
    /// IEEE binary16 bits.
    F16(&'a [u16]),
}

impl Tiled<'_> {
    /// The value at offset `i` of the tiled layout (`i = (g * row_blocks + rb) * 64 + lane`).
    #[inline(always)]
    pub fn at(&self, i: usize) -> f32 {
        match self {
            Tiled::F32(s) => s[i],
            Tiled::F16(h) => half::f16::from_bits(h[i]).to_f32(),
        }
    }

    /// Bytes per value (4 or 2).
    #[inline(always)]
    pub fn elem_bytes(&self) -> usize {
        match self {
            Tiled::F32(_) => 4,
            Tiled::F16(_) => 2,
        }
    }

    /// Address of the value at offset `i`, for prefetching (may point past the end).
    #[inline(always)]
    pub fn addr(&self, i: usize) -> *const i8 {
        match self {
            Tiled::F32(s) => s.as_ptr().wrapping_add(i) as *const i8,
            Tiled::F16(h) => h.as_ptr().wrapping_add(i) as *const i8,
        }
    }
}

/// Mirror constants of the 16-entry-table kernels (AVX2, NEON) for the regular tuples (`[0]`)
/// and a group's last tuple (`[1]`): threshold `h = used_entries(r)` (indices `>= h` are
/// mirrored) and the index-map constant (xor mask or `V^r - 1`); `kind` 0 none, 1 xor (sign
/// bit), 2 reverse.
#[allow(dead_code)] // used by the kernels of some target architectures only
pub(crate) struct Mir {
    pub kind: u8,
    pub h: [i32; 2],
    pub c: [i32; 2],
}

#[allow(dead_code)] // used by the kernels of some target architectures only
pub(crate) fn mirror_consts(plan: &Plan) -> Mir {
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

/// What every block of a build of tables of at most 16 entries shares (the AVX2 and NEON
/// builds): the codebook, which entries each tuple depth builds and which count for the int8
/// scale, and a bound on the entries.
#[allow(dead_code)] // used by the kernels of some target architectures only
pub(crate) struct SmallTables {
    /// `v'` (the plan's table values), 16 lanes, zero past `V`.
    pub vals: [f32; 16],
    /// Per tuple depth (regular `[0]`, a group's last tuple `[1]`): all ones in the lanes of
    /// entries that are built (`i < plan.used_entries(r)`), else 0.
    pub built: [[u32; 16]; 2],
    /// Per tuple depth: all ones in the lanes whose entries count for the int8 scale
    /// (`plan.stored_used(i, r)`).
    pub counted: [[u32; 16]; 2],
    /// `max |v'|`: with `max |x|` a bound on every entry.
    pub vmax: f32,
}

#[allow(dead_code)] // used by the kernels of some target architectures only
impl SmallTables {
    pub fn new(plan: &Plan) -> SmallTables {
        let v = plan.levels;
        let tp = plan.tuples;
        let mut vals = [0f32; 16];
        vals[..v.min(16)].copy_from_slice(&plan.table_values[..v.min(16)]);
        let depths = [tp.depth, tp.last_depth];
        let mask = |on: bool| if on { u32::MAX } else { 0 };
        let built = depths.map(|r| std::array::from_fn(|i| mask(i < plan.used_entries(r))));
        let counted = depths.map(|r| std::array::from_fn(|i| mask(plan.stored_used(i, r))));
        let vmax = plan.table_values.iter().fold(0f32, |m, &x| m.max(x.abs()));
        SmallTables {
            vals,
            built,
            counted,
            vmax,
        }
    }
}

/// Tuples per group the 16-entry `i8` builds keep on the stack (longer groups: the scalar
/// build).
#[allow(dead_code)] // used by the kernels of some target architectures only
pub(crate) const SMALL_MAX_TUPLES: usize = 256;

/// One `(group, column)` block of `i8` tables of at most 16 entries, bitwise equal to
/// [`table::build_block`]: the steps the AVX2 and NEON builds share, their lanes doing the
/// work. `maxabs_nan(xg)`: `(max |x|, whether x holds a NaN)`; `amax(xs, w)`: the largest
/// magnitude of the f32 entries of the tuple with activations `xs` (`w`: 1 for a shorter last
/// tuple) over those that count for the scale (`SmallTables::counted`); `scaling`:
/// [`table::i8_scaling`]'s result; `round(xs, w, rm)`: the tuple's entries times `rm`,
/// rounded to nearest even and clamped to +-127 (0 past its built entries).
///
/// Entries that could overflow (and give infinities or NaN, which the scalar build's
/// `f32::max` skips) and a subnormal largest entry (`127 / A` overflows, and the scalar build
/// saturates the entries) take the scalar build.
#[inline(always)]
#[allow(dead_code)] // used by the kernels of some target architectures only
#[allow(clippy::too_many_arguments)]
pub(crate) fn small_i8_block(
    plan: &Plan,
    xg: &[f32],
    out: &mut [i8],
    mult: &mut [u8],
    vmax: f32,
    maxabs_nan: impl FnOnce(&[f32]) -> (f32, bool),
    amax: impl Fn(&[f32], usize) -> f32,
    scaling: impl FnOnce(&[f32], &mut [u8], &mut [f32]) -> f32,
    round: impl Fn(&[f32], usize, f32) -> [i8; 16],
) -> (f32, f32) {
    let tp = plan.tuples;
    let (slot, n) = (plan.slot, tp.per_group);
    assert!(n <= SMALL_MAX_TUPLES && slot <= 16);
    let (xmax, nan) = maxabs_nan(xg);
    let bound = xmax * vmax * 16.0;
    if nan || bound.is_nan() || bound >= 1e37 {
        return table::build_block(plan, xg, BlockOut::I8(out, mult));
    }
    let xs = |t: usize| &xg[t * tp.depth..t * tp.depth + tp.depth_of(t)];
    let w = |t: usize| usize::from(t + 1 == n && tp.last_depth != tp.depth);
    let mut am = [0f32; SMALL_MAX_TUPLES];
    let mut rms = [0f32; SMALL_MAX_TUPLES];
    for (t, a) in am[..n].iter_mut().enumerate() {
        *a = amax(xs(t), w(t));
    }
    let tsc = scaling(&am[..n], mult, &mut rms[..n]);
    if !rms[0].is_finite() {
        return table::build_block(plan, xg, BlockOut::I8(out, mult));
    }
    if tsc == 0.0 {
        // All entries 0 (as the scalar build).
        out.fill(0);
        return table::all_zero_block(plan, xg);
    }
    for (t, &rm) in rms[..n].iter().enumerate() {
        let bytes = round(xs(t), w(t), rm);
        let o = t * slot;
        if o + 16 <= out.len() {
            // Past the slot: entries of the next tuple, which it then overwrites.
            // SAFETY: bytes `o .. o + 16` lie inside `out`.
            unsafe { std::ptr::write_unaligned(out.as_mut_ptr().add(o) as *mut [i8; 16], bytes) };
        } else {
            out[o..o + slot].copy_from_slice(&bytes[..slot]);
        }
    }
    let zsum = if plan.zero_term {
        table::group_sum(xg) / tsc
    } else {
        0.0
    };
    (tsc, zsum)
}

/// Plans whose every table has at most 16 entries (`V^d <= 16`; mirror plans store a prefix
/// of them; `i8`: groups of at most [`SMALL_MAX_TUPLES`] tuples, kept on the stack; `i16`:
/// without mirror): the AVX2 and NEON builds ([`small_build`]). Others: the scalar build.
#[allow(dead_code)] // used by the kernels of some target architectures only
pub(crate) fn small_build_supported(plan: &Plan) -> bool {
    let small = plan
        .levels
        .checked_pow(plan.depth() as u32)
        .is_some_and(|e| e <= 16);
    match plan.precision {
        TablePrecision::I8 => small && plan.tuples.per_group <= SMALL_MAX_TUPLES,
        TablePrecision::F32 => small,
        TablePrecision::I16 => small && plan.mirror.is_none(),
    }
}

/// Builds `set` for a plan of [`small_build_supported`] with a kernel's block builds (each
/// bitwise equal to the scalar build of its `(group, column)` block: activations `xg`, the
/// block's entries, for `i8` its per-tuple multipliers; returns `(tscale, zsum)`), over the
/// blocks in parallel when `parallel` (a block is about a microsecond: 8 per task).
#[allow(dead_code)] // used by the kernels of some target architectures only
pub(crate) fn small_build(
    plan: &Plan,
    xt: &[f32],
    set: &mut TableSet,
    parallel: bool,
    i8_block: impl Fn(&[f32], &mut [i8], &mut [u8]) -> (f32, f32) + Sync + Send,
    i16_block: impl Fn(&[f32], &mut [i16]) -> (f32, f32) + Sync + Send,
    f32_block: impl Fn(&[f32], &mut [f32]) -> (f32, f32) + Sync + Send,
) {
    const MIN_BLOCKS_PER_TASK: usize = 8;
    let blen = set.block_len();
    let xg = table::block_activations(plan, set, xt);
    let per_group = plan.tuples.per_group;
    let meta: Vec<(f32, f32)> = match &mut set.data {
        TableData::I8(d) => table::map_blocks(
            d,
            blen,
            Some((&mut set.mult, per_group)),
            parallel,
            MIN_BLOCKS_PER_TASK,
            |i, out, mult| i8_block(xg(i), out, mult),
        ),
        TableData::I16(d) => {
            table::map_blocks(d, blen, None, parallel, MIN_BLOCKS_PER_TASK, |i, out, _| {
                i16_block(xg(i), out)
            })
        }
        TableData::F32(d) => {
            table::map_blocks(d, blen, None, parallel, MIN_BLOCKS_PER_TASK, |i, out, _| {
                f32_block(xg(i), out)
            })
        }
    };
    set.set_meta(meta);
}

/// One `(group, column)` block of `f32` tables of at most 16 entries, bitwise equal to
/// [`table::build_block`]: each tuple's entries (`entries(xs, w)`: the f32 entries of a tuple
/// with activations `xs`, `w` = 1 for a group's shorter last tuple, entries not built 0),
/// `tscale` 1, `zsum` the sequential sum of the group's activations when the plan has a zero
/// term. The AVX2 and NEON builds bring `entries`.
#[allow(dead_code)] // used by the kernels of some target architectures only
#[inline(always)]
pub(crate) fn small_f32_block(
    plan: &Plan,
    xg: &[f32],
    out: &mut [f32],
    entries: impl Fn(&[f32], usize) -> [f32; 16],
) -> (f32, f32) {
    let tp = plan.tuples;
    let slot = plan.slot;
    for t in 0..tp.per_group {
        let xs = &xg[t * tp.depth..t * tp.depth + tp.depth_of(t)];
        let w = usize::from(t + 1 == tp.per_group && tp.last_depth != tp.depth);
        out[t * slot..(t + 1) * slot].copy_from_slice(&entries(xs, w)[..slot]);
    }
    let zsum = if plan.zero_term {
        table::group_sum(xg)
    } else {
        0.0
    };
    (1.0, zsum)
}

/// One `(group, column)` block of `i16` tables of at most 16 entries, equal to
/// [`table::build_block`]: the steps the AVX2 and NEON builds share, their lanes doing the
/// work. The activations are quantized to int8 as [`table::quantize_activations`]:
/// `quantize(xg, rcp, xq)` writes `clamp(round_ties_even(x * rcp), -127, 127)` for a prefix of
/// `xg` and returns its length (the rest here); `entries(xq, w)` gives the exact integer
/// entries of the tuple with quantized activations `xq` (`w`: 1 for a shorter last tuple; 0
/// past its built entries). Non-finite activations or a subnormal maximum (`127 / maxabs`
/// overflows, and the scalar quantization's NaN products become 0) take the scalar build.
#[inline(always)]
#[allow(dead_code)] // used by the kernels of some target architectures only
pub(crate) fn small_i16_block(
    plan: &Plan,
    xg: &[f32],
    out: &mut [i16],
    maxabs_nan: impl FnOnce(&[f32]) -> (f32, bool),
    quantize: impl FnOnce(&[f32], f32, &mut [i32]) -> usize,
    entries: impl Fn(&[i32], usize) -> [i16; 16],
) -> (f32, f32) {
    let tp = plan.tuples;
    let slot = plan.slot;
    assert!(slot <= 16);
    let (maxabs, nan) = maxabs_nan(xg);
    let rcp = 127.0f32 / maxabs;
    if nan || !maxabs.is_finite() || (maxabs != 0.0 && !rcp.is_finite()) {
        return table::build_block(plan, xg, BlockOut::I16(out));
    }
    let mut xq = vec![0i32; xg.len()];
    if maxabs != 0.0 {
        let done = quantize(xg, rcp, &mut xq);
        for (q, &x) in xq[done..].iter_mut().zip(&xg[done..]) {
            *q = table::round_small((x * rcp).clamp(-127.5, 127.5)).clamp(-127.0, 127.0) as i32;
        }
    }
    for t in 0..tp.per_group {
        let w = usize::from(t + 1 == tp.per_group && tp.last_depth != tp.depth);
        let e = entries(&xq[t * tp.depth..t * tp.depth + tp.depth_of(t)], w);
        let o = t * slot;
        if o + 16 <= out.len() {
            // Past the slot: entries of the next tuple, which it then overwrites.
            // SAFETY: entries `o .. o + 16` lie inside `out`.
            unsafe { std::ptr::write_unaligned(out.as_mut_ptr().add(o) as *mut [i16; 16], e) };
        } else {
            out[o..o + slot].copy_from_slice(&e[..slot]);
        }
    }
    let scale = 2f32.powi(plan.int_exp);
    let zsum = if plan.zero_term {
        xq.iter().sum::<i32>() as f32 * scale
    } else {
        0.0
    };
    (maxabs / 127.0 / scale, zsum)
}

/// One unit of phase-2 work: a range of row blocks against one table set.
///
/// The kernel adds, for every row `m` of the row blocks (rows past `plan.m` excluded), every
/// column `n` of `tables.cols` and every group `g` of `tables.groups` in ascending order:
/// `y[m, n] += s[m,g] * (tscale[g,n] * (P[m,n,g] - z[m,g] * zsum[g,n]))` with the exact
/// operation order of `KERNELS.md`.
pub struct RowJob<'a> {
    pub plan: &'a Plan,
    /// Indices `[g][rb][t][64]` for `plan.tuples.depth`, in the form the kernel asked for
    /// ([`LutKernel::layout_kind`]: mirror-folded or paired) or plain.
    pub layout: &'a TileLayout,
    /// Scales tiled `[g][rb][64]`.
    pub scales: Tiled<'a>,
    /// Effective zero points in units of `plan.table_values`; `Zeros::None` exactly when
    /// `!plan.zero_term`.
    pub zeros: Zeros<'a>,
    pub tables: &'a TableSet,
    /// Absolute row-block range.
    pub row_blocks: Range<usize>,
}

impl RowJob<'_> {
    /// Floats per column of the job's `y` (column-major): `row_blocks.len() * 64`.
    #[inline]
    pub fn span(&self) -> usize {
        self.row_blocks.len() * crate::layout::ROW_BLOCK
    }

    /// Index in the job's `y` of row `m` (absolute) and column `n`.
    #[inline]
    pub fn y_index(&self, m: usize, n: usize) -> usize {
        n * self.span() + m - self.row_blocks.start * crate::layout::ROW_BLOCK
    }
}

/// A phase-2 kernel (and optionally a phase-1 table builder).
pub trait LutKernel: Sync {
    /// The backend this kernel implements.
    fn backend(&self) -> Backend;

    /// True when the CPU running this process has the instructions the kernel needs.
    fn available(&self) -> bool;

    /// True when the kernel implements this plan (format/levels, depth, precision, mirror).
    fn supports(&self, plan: &Plan) -> bool;

    /// Adds the job's groups into `y`: rows `job.row_blocks.start*64 ..
    /// min(job.row_blocks.end*64, plan.m)`, columns `0..job.tables.cols.end`, column-major with
    /// [`RowJob::span`] floats per column (row `m`, column `n` at
    /// `y[n * span + m - row_blocks.start*64]`); only the columns `job.tables.cols` and rows
    /// `< plan.m` are touched. Called only when `available()` and `supports(plan)` are true.
    fn accumulate(&self, job: &RowJob<'_>, y: &mut [f32]);

    /// The form of the tile layout the kernel reads fastest for this plan: the mirror-folded
    /// ([`TileLayout::fold`]) or paired ([`TileLayout::pair`]) one, or the plain one; the
    /// driver hands it that form (`PackedWeights::layout_for`). A kernel must still accept the
    /// plain layout (it reads `job.layout.kind()`).
    fn layout_kind(&self, _plan: &Plan) -> LayoutKind {
        LayoutKind::Plain
    }

    /// The depth at which this kernel is fastest for every shape, for codebooks of `levels`
    /// levels in `precision` tables (measured), or `None`: then `depth="auto"` ranks the depths
    /// by the operation-count model ([`crate::count::model_ratio`]).
    fn preferred_depth(&self, _levels: usize, _precision: TablePrecision) -> Option<usize> {
        None
    }

    /// Builds `set` (allocated with [`TableSet::zeroed`]) from `xt` (X transposed and
    /// permuted, `(N, K)` row-major), bitwise identical to [`crate::table::build_scalar`]: on
    /// the current pool when `parallel`, else on the calling thread without rayon.
    /// Returns false when this kernel has no table build for the plan (the scalar build runs).
    fn build_tables(
        &self,
        _plan: &Plan,
        _xt: &[f32],
        _set: &mut TableSet,
        _parallel: bool,
    ) -> bool {
        false
    }
}

/// The kernels compiled into this build, fastest first (the scalar kernel is always last).
#[allow(clippy::vec_init_then_push)] // the pushes depend on the target architecture
pub fn registered() -> Vec<&'static dyn LutKernel> {
    let mut list: Vec<&'static dyn LutKernel> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    list.push(&avx512::AVX512);
    #[cfg(target_arch = "x86_64")]
    list.push(&avx2::AVX2);
    #[cfg(target_arch = "aarch64")]
    list.push(&neon::NEON);
    list.push(&scalar::SCALAR);
    list
}

/// The kernel for `backend` and `plan`.
///
/// `Auto` takes the first registered kernel that is available and supports the plan.
/// A named SIMD backend that is not compiled in, not supported by the CPU, or does not
/// implement the plan gives `Error::Unsupported` naming the reason. `Reference` is not a
/// [`LutKernel`] (see [`crate::count`]) and is rejected here.
pub fn select(backend: Backend, plan: &Plan) -> Result<&'static dyn LutKernel> {
    let kernels = registered();
    match backend {
        Backend::Reference => Err(Error::invalid(
            "backend",
            "'reference' runs through the counting path",
        )),
        Backend::Auto => Ok(kernels
            .into_iter()
            .find(|k| k.available() && k.supports(plan))
            .unwrap_or(&scalar::SCALAR)),
        // No table kernel: the dense path takes the calls it applies to before this.
        Backend::Amx if !crate::dense::amx_ready() => Err(Error::Unsupported(
            "backend 'amx' needs Intel AMX tiles (AMX-INT8, Linux), which this machine lacks or does not enable".into(),
        )),
        Backend::Amx => Err(Error::Unsupported(format!(
            "backend 'amx' runs the dense int8 path only: table='i16', codebooks of at most 16 integer levels, group sizes that are multiples of 8 (and 2-bit codes in batches only); this call has V={} table='{}' g={} (use backend='auto' or 'avx512')",
            plan.levels,
            plan.precision.name(),
            plan.group_size
        ))),
        b => {
            let k = kernels
                .into_iter()
                .find(|k| k.backend() == b)
                .ok_or_else(|| {
                    Error::Unsupported(format!(
                        "backend '{}' is not built into this version of maleki_rs",
                        b.name()
                    ))
                })?;
            if !k.available() {
                return Err(Error::Unsupported(format!(
                    "backend '{}' needs CPU instructions this machine lacks",
                    b.name()
                )));
            }
            if !k.supports(plan) {
                return Err(Error::Unsupported(format!(
                    "backend '{}' does not implement V={} depth={} table='{}'{} (use backend='auto' or 'scalar')",
                    b.name(),
                    plan.levels,
                    plan.depth(),
                    plan.precision.name(),
                    if plan.mirror.is_some() { " with mirror" } else { "" }
                )));
            }
            Ok(k)
        }
    }
}

/// Whether this is an AMD CPU (the CPUID vendor string "AuthenticAMD"): the fixed rules that
/// pick a kernel by vendor ([`crate::bf16::dpbf16_preferred`],
/// [`crate::dense::gemv_preferred`]) read it, so a machine's choice never changes between runs.
pub fn amd_cpu() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AMD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AMD.get_or_init(|| {
            #[allow(unused_unsafe)] // safe functions in newer Rust
            // SAFETY: CPUID leaf 0 exists on every x86-64 CPU.
            let id = unsafe { std::arch::x86_64::__cpuid(0) };
            // The vendor string, "AuthenticAMD", in EBX, EDX, ECX.
            (id.ebx, id.edx, id.ecx) == (0x6874_7541, 0x6974_6e65, 0x444d_4163)
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The CPU's family as CPUID leaf 1 gives it (the base family, plus the extended one where the
/// base is 15): AMD Zen 3 and Zen 4 0x19, Zen 5 0x1A; 0 off x86-64. Like [`amd_cpu`], for
/// fixed rules ([`crate::bf16::dense_to_bf16_min_n`]).
pub fn cpu_family() -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        static FAMILY: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
        *FAMILY.get_or_init(|| {
            #[allow(unused_unsafe)] // safe functions in newer Rust
            // SAFETY: CPUID leaf 1 exists on every x86-64 CPU.
            let eax = unsafe { std::arch::x86_64::__cpuid(1) }.eax;
            let base = (eax >> 8) & 0xf;
            if base == 0xf {
                base + ((eax >> 20) & 0xff)
            } else {
                base
            }
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}

/// Backends usable on this machine (compiled in and supported by the CPU), by name, plus
/// `"reference"`.
pub fn available_backends() -> Vec<Backend> {
    let mut out: Vec<Backend> = registered()
        .into_iter()
        .filter(|k| k.available())
        .map(|k| k.backend())
        .collect();
    if crate::dense::amx_ready() {
        out.insert(1, Backend::Amx);
    }
    out.push(Backend::Reference);
    out
}

#[cfg(test)]
mod tests {
    /// `cpu_family` agrees with the kernel's reading of CPUID ("cpu family" in /proc/cpuinfo,
    /// in decimal), where there is one to read.
    #[test]
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    fn cpu_family_is_the_one_linux_reports() {
        let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
            return;
        };
        let reported = info
            .lines()
            .find(|l| l.starts_with("cpu family"))
            .and_then(|l| l.split(':').nth(1))
            .and_then(|v| v.trim().parse::<u32>().ok());
        if let Some(family) = reported {
            assert_eq!(super::cpu_family(), family);
        }
    }
}
