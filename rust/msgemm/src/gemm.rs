//! `Y = Wd @ X` through look-up tables: planning, dispatch and the parallel driver.
//!
//! Work is split into table sets (a chunk of groups for a chunk of columns, kept under a
//! memory budget) run in parallel on the current rayon pool (called off every pool, on the
//! library pool, `maleki_common::pool`; a GEMV on 1 or 2 threads then runs on the calling
//! thread and at most the helper thread, see [`gemv_here`]): with a column per thread or more, each task takes a range
//! of columns, all rows, and builds its own tables; otherwise (GEMV) the threads share each
//! table set and split its rows into contiguous chunks of 64-row blocks. Every `y[m, n]` is
//! accumulated over its groups in ascending order by exactly one task (a GEMV in two K slices,
//! see [`k_slices`]: each slice in ascending order, then the slices added in order), and
//! neither the tables nor the slices depend on the thread count, so results are bitwise
//! identical on any thread count.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use maleki_common::{alloc, pool, Error, Result};
use rayon::prelude::*;

use crate::count::{self, OpCounts};
use crate::dense;
use crate::float8;
use crate::kernels::{self, Backend, LutKernel, RowJob, Tiled, Zeros};
use crate::layout::{LayoutKind, ROW_BLOCK};
use crate::packed::PackedWeights;
use crate::plan::{Plan, TablePrecision};
use crate::table::{self, TableSet};

/// Table depth of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// The depth the chosen SIMD kernel is measured fastest at for this codebook and
    /// precision ([`LutKernel::preferred_depth`]: on AVX-512, `i8` tables of 16- and 4-level
    /// codebooks and `i16` tables of 16-, 4- and 3-level ones), else `argmax_d R(d)` of the operation-count model among the depths with
    /// byte indices (`V^d <= 256`) that the chosen backend implements.
    Auto,
    Fixed(usize),
}

/// Options of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmOptions {
    pub depth: Depth,
    pub precision: TablePrecision,
    pub backend: Backend,
    /// Build only half of each table using the codebook's mirror symmetry.
    pub mirror: bool,
}

impl Default for GemmOptions {
    fn default() -> Self {
        GemmOptions {
            depth: Depth::Auto,
            precision: TablePrecision::I8,
            backend: Backend::Auto,
            mirror: false,
        }
    }
}

/// How Y is laid out in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum YLayout {
    /// `(M, N)` row-major.
    #[default]
    MbyN,
    /// `(N, M)` row-major: Y transposed (the `(B, M)` outputs of a linear layer).
    NbyM,
}

/// How X is laid out in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum XLayout {
    /// `(K, N)` row-major (a numpy C-order `(K, N)` array).
    #[default]
    KbyN,
    /// `(N, K)` row-major: X transposed (a Fortran-order `(K, N)` array, or the `(B, K)`
    /// activations of a linear layer).
    NbyK,
}

/// Memory budget of one table set (bytes of entries). Every row task reads the whole set, so
/// it is sized to stay in a core's L2 cache (measured: with N = 16 int4 g128 tables, an 8 MiB
/// set made each task stream the tables from DRAM and cost 3-4x the lookups).
pub const TABLE_BUDGET: usize = 512 << 10;

fn plan_for(pw: &PackedWeights, n: usize, depth: usize, opts: &GemmOptions) -> Result<Plan> {
    Plan::new(
        pw.codebook(),
        pw.m(),
        pw.k(),
        n,
        pw.group_size(),
        pw.zeros().is_some(),
        depth,
        opts.precision,
        opts.mirror,
        Some(pw.used_codes()),
    )
}

/// The plan and kernel that run a call planned as `plan` on `backend`. An `i8` plan without
/// mirror runs as its mirror plan when that gives the same bits and the kernel reads folded
/// indices ([`LutKernel::layout_kind`] folded: half the tables to build, and one `vpermi2b` and a
/// masked negation per 64 lookups instead of two `vpermi2b` and a blend). The bits are the
/// same when the mirror plan's tables hold the same values: built in sign-magnitude label
/// space (int4 / int3 / int2 weights that never use the most negative code), or from a
/// codebook mirror with the shift the plain `i8` plan already uses (none: fp4, ternary; the
/// mirror's: weights with zero points). Its `i8` scales then cover the same entries (see
/// [`Plan::stored_used`]), so every entry, scale and sum is equal.
pub fn execution_plan(
    pw: &PackedWeights,
    plan: &Plan,
    backend: Backend,
) -> Result<(Plan, &'static dyn LutKernel)> {
    let kernel = kernels::select(backend, plan)?;
    if plan.precision != TablePrecision::I8 || plan.mirror.is_some() {
        return Ok((plan.clone(), kernel));
    }
    let mirrored = Plan::new(
        pw.codebook(),
        plan.m,
        plan.k,
        plan.n,
        plan.group_size,
        pw.zeros().is_some(),
        plan.depth(),
        plan.precision,
        true,
        Some(pw.used_codes()),
    );
    if let Ok(mp) = mirrored {
        if mp.labels.is_some() || mp.shift == plan.shift {
            if let Ok(k) = kernels::select(backend, &mp) {
                if k.layout_kind(&mp) == LayoutKind::Folded {
                    return Ok((mp, k));
                }
            }
        }
    }
    Ok((plan.clone(), kernel))
}

fn backend_accepts(pw: &PackedWeights, opts: &GemmOptions, plan: &Plan) -> bool {
    match opts.backend {
        Backend::Reference => plan.precision == TablePrecision::F32,
        Backend::Auto | Backend::Scalar => true,
        // The dense `i16` path runs any depth of the plans it takes, on its backends; the
        // fp8 path its depth 1.
        b => {
            dense::applies(plan, b)
                || float8::kernel_for(pw, opts).is_some()
                || kernels::select(b, plan).is_ok()
        }
    }
}

/// The plan of a call (validated; depth resolved, see [`Depth::Auto`]).
pub fn plan(pw: &PackedWeights, n: usize, opts: &GemmOptions) -> Result<Plan> {
    match opts.depth {
        Depth::Fixed(d) => plan_for(pw, n, d, opts),
        Depth::Auto => auto_plan(pw, n, opts),
    }
}

/// The plan of a call at automatic depth. Each depth's plan is built once (a plan costs
/// about 0.1-0.2 us: building one per depth and filter made the depth resolution a quarter
/// of a small GEMV's 3.3 us from Python).
fn auto_plan(pw: &PackedWeights, n: usize, opts: &GemmOptions) -> Result<Plan> {
    let cb = pw.codebook();
    let mut plans: Vec<Plan> = (1..=cb.max_byte_depth())
        .filter_map(|d| plan_for(pw, n, d, opts).ok())
        .filter(|p| backend_accepts(pw, opts, p))
        .collect();
    // With `auto`, prefer the depths a fast (SIMD) kernel implements on this machine.
    if opts.backend == Backend::Auto {
        let fast = |p: &Plan| {
            kernels::registered()
                .into_iter()
                .any(|k| k.backend() != Backend::Scalar && k.available() && k.supports(p))
        };
        if plans.iter().any(fast) {
            plans.retain(fast);
        }
    }
    // A SIMD kernel that is measured fastest at one depth for this codebook and precision
    // gets it (see `LutKernel::preferred_depth`): the model counts every table entry as an
    // add, while these kernels build a 256-entry table for about the cost of a 16-entry one.
    let preferred = kernels::registered()
        .into_iter()
        .filter(|k| {
            k.backend() != Backend::Scalar
                && k.available()
                && (opts.backend == Backend::Auto || opts.backend == k.backend())
        })
        .find_map(|k| {
            let d = k.preferred_depth(cb.levels(), opts.precision)?;
            plans.iter().position(|p| p.depth() == d && k.supports(p))
        });
    if let Some(i) = preferred {
        return Ok(plans.swap_remove(i));
    }
    let (m, v) = (pw.m() as u64, cb.levels() as u64);
    let mut best: Option<(usize, f64)> = None;
    for (i, p) in plans.iter().enumerate() {
        let r = count::model_ratio(m, v, p.depth() as u64, opts.mirror);
        if best.is_none_or(|(_, br)| r > br) {
            best = Some((i, r));
        }
    }
    match best {
        Some((i, _)) => Ok(plans.swap_remove(i)),
        // No candidate: report the error of the natural depth.
        None => {
            let d = cb.natural_depth().min(cb.max_depth());
            let p = plan_for(pw, n, d, opts)?;
            if opts.backend != Backend::Reference {
                kernels::select(opts.backend, &p)?;
            }
            Err(Error::Unsupported(format!(
                "no depth of backend '{}' fits this call",
                opts.backend.name()
            )))
        }
    }
}

/// The options of a call of `n` columns whose table precision is left to the library (the
/// Python API's default): `opts` (`i8` tables), except for batches (`n >= 2`) at automatic
/// depth that the dense `i16` path runs on `opts.backend` ([`dense::applies`]: at most 16
/// integer levels, affine in the code or spanning at most [`dense::map_span`];
/// group sizes that are multiples of 8; a CPU with dot-product instructions).
/// There `i16` is both faster and more accurate than `i8` tables, because a table's lookups
/// grow with the columns while a dot-product instruction sums 4 weight-activation products
/// per lane. Measured from Python (int4 g128 4096 x 4096, 2 threads, AVX-512 VNNI, minima):
/// N = 2 0.35 against 0.66 ms, N = 4 0.39 against 0.97 ms, N = 16 1.09 against 2.03 ms;
/// relative L1 error 6.4e-3 against 9.1e-3. A GEMV keeps the `i8` tables (0.20 against
/// 0.23 ms) except where [`dense::gemv_preferred`] says otherwise. `opts` is returned
/// unchanged when its depth is fixed (tables were asked for) or its precision is not `i8`.
///
/// The choice depends only on the weights, `n` and `opts`, never on what is cached, so a call
/// gives the same bits whenever it runs. Off every pool it runs on the library pool (the
/// plan of fresh weights first finds the codes they use, in parallel).
pub fn auto_precision(pw: &PackedWeights, n: usize, opts: &GemmOptions) -> GemmOptions {
    // fp8 weights: `f32` mode's decoding kernels ([`float8`]), faster than any table and as
    // accurate as the float32 tables.
    if opts.depth == Depth::Auto && opts.precision == TablePrecision::I8 {
        let f32_opts = GemmOptions {
            precision: TablePrecision::F32,
            ..*opts
        };
        if float8::kernel_for(pw, &f32_opts).is_some() {
            return f32_opts;
        }
    }
    // Backend `amx` has no tables: its GEMVs are dense calls too; so are those that
    // `dense::gemv_preferred` picks, and those of 8-bit codes (int8, uint8), whose tables
    // have 256 entries per input (int8 g32 4096 x 4096, 2 threads, Zen 5: 2.0 ms on `i8`
    // tables, 0.13 ms dense; AVX2 and NEON have no such tables: the scalar kernel, 15 ms).
    let gemv = opts.backend == Backend::Amx
        || dense::gemv_preferred(opts.backend, pw.group_size())
        || pw.codebook().levels() > 16;
    let min_n = if gemv { 1 } else { 2 };
    if n < min_n || opts.depth != Depth::Auto || opts.precision != TablePrecision::I8 {
        return *opts;
    }
    let dense_opts = GemmOptions {
        precision: TablePrecision::I16,
        ..*opts
    };
    if !dense::may_apply(&dense_opts) {
        return *opts;
    }
    // Not a dense call, or no `i16` plan at all: the `i8` call reports its own errors. A plan
    // depends on N only through `n >= 2` here, so the decision is made once per weights,
    // backend, mirror and `n >= 2` (a plan costs microseconds: a large part of a small call).
    let decide =
        || matches!(plan(pw, n, &dense_opts), Ok(p) if dense::applies(&p, dense_opts.backend));
    let decide_here = || {
        if pool::on_a_pool() || pw.used_codes_ready() {
            decide()
        } else {
            pool::install(decide)
        }
    };
    // GEMVs and batches are cached apart: GEMVs of 2-bit codes run densely on AVX-512 VNNI
    // only (`dense::two_bit`).
    let dense = pw.dense_choice(opts.backend, opts.mirror, n == 1, decide_here);
    if dense {
        dense_opts
    } else {
        *opts
    }
}

pub(crate) fn check_inputs(
    pw: &PackedWeights,
    x: &[f32],
    n: usize,
    layout: XLayout,
    y_len: Option<usize>,
) -> Result<()> {
    if n == 0 {
        return Err(Error::invalid("x", "must have at least one column"));
    }
    if x.len() != pw.k() * n {
        let want = match layout {
            XLayout::KbyN => format!("({}, {n})", pw.k()),
            XLayout::NbyK => format!("({n}, {})", pw.k()),
        };
        return Err(Error::shape("x", want, format!("{} values", x.len())));
    }
    if let Some(len) = y_len {
        if len != pw.m() * n {
            return Err(Error::shape(
                "out",
                format!("({}, {n})", pw.m()),
                format!("{len} values"),
            ));
        }
    }
    if let Some(i) = first_non_finite(x) {
        let (input, col) = match layout {
            XLayout::KbyN => (i / n, i % n),
            XLayout::NbyK => (i % pw.k(), i / pw.k()),
        };
        return Err(Error::invalid(
            "x",
            format!(
                "contains a non-finite value ({}; NaN, inf, or beyond float32) at input {input} \
                 of column {col}",
                x[i]
            ),
        ));
    }
    Ok(())
}

/// The index of the first NaN or infinity in `v`. Blocks of 64 are tested with a
/// branch-free fold (vectorized: about 0.3 us for 4096 values, where `position` runs one
/// compare and branch per value) and only a block that holds one is searched.
pub fn first_non_finite(v: &[f32]) -> Option<usize> {
    const EXP: u32 = 0x7f80_0000;
    v.chunks(64)
        .position(|c| {
            c.iter()
                .fold(false, |bad, x| bad | (x.to_bits() & EXP == EXP))
        })
        .map(|b| b * 64 + v[b * 64..].iter().position(|x| !x.is_finite()).unwrap_or(0))
}

/// An error when a result is not finite: with finite weights and activations, float32
/// overflowed on the way (a table entry, a partial sum or an output beyond 3.4e38).
pub(crate) fn check_result(y: &[f32]) -> Result<()> {
    match first_non_finite(y) {
        None => Ok(()),
        Some(_) => Err(Error::invalid(
            "x",
            "the result overflows float32: a table entry (an activation times a codebook \
             value), a partial sum or an output exceeds 3.4e38 in magnitude; scale x down (the \
             result is linear in x)",
        )),
    }
}

/// X to `(N, K)` row-major in packed column order (no copy when X already is, e.g. N = 1 or
/// [`XLayout::NbyK`], without a permutation; an error only when the copy does not fit in
/// memory).
pub fn transpose_permute<'a>(
    pw: &PackedWeights,
    x: &'a [f32],
    n: usize,
    layout: XLayout,
) -> Result<Cow<'a, [f32]>> {
    const WHAT: &str = "the transposed activations";
    let k = pw.k();
    Ok(match (n, layout, pw.k_perm()) {
        (1, _, None) | (_, XLayout::NbyK, None) => Cow::Borrowed(x),
        (_, XLayout::NbyK, Some(perm)) => {
            let mut xt = alloc::zeroed_vec::<f32>(n * k, WHAT)?;
            xt.par_chunks_mut(k)
                .zip(x.par_chunks(k))
                .for_each(|(row, src)| {
                    for (o, &p) in row.iter_mut().zip(perm) {
                        *o = src[p as usize];
                    }
                });
            Cow::Owned(xt)
        }
        (_, XLayout::KbyN, perm) => {
            // Tiles of 16 inputs x 16 columns through a local buffer: contiguous reads of
            // X's rows and writes of XT's (a column at a time reads a cache line of X for
            // every value; 16 columns at a time write 16 rows `4 K` bytes apart, which share
            // one set of the L1 cache when K is a multiple of 1024).
            const T: usize = 16;
            let mut xt = alloc::zeroed_vec::<f32>(n * k, WHAT)?;
            xt.par_chunks_mut(T * k).enumerate().for_each(|(b, rows)| {
                let c0 = b * T;
                let width = rows.len() / k;
                let mut tile = [[0f32; T]; T];
                for j0 in (0..k).step_by(T) {
                    let depth = T.min(k - j0);
                    for (jj, line) in tile[..depth].iter_mut().enumerate() {
                        let src = perm.map_or(j0 + jj, |p| p[j0 + jj] as usize) * n + c0;
                        line[..width].copy_from_slice(&x[src..src + width]);
                    }
                    for t in 0..width {
                        let row = &mut rows[t * k + j0..t * k + j0 + depth];
                        for (jj, o) in row.iter_mut().enumerate() {
                            *o = tile[jj][t];
                        }
                    }
                }
            });
            Cow::Owned(xt)
        }
    })
}

/// Table sets of `ncols` columns `0..ncols`: `(group range, column range)` chunks under
/// [`TABLE_BUDGET`], in order (groups ascending within each column chunk).
fn table_chunks(
    plan: &Plan,
    ncols: usize,
    groups: Range<usize>,
) -> Vec<(Range<usize>, Range<usize>)> {
    let bb = table::block_bytes(plan).max(1);
    let cols_per = (TABLE_BUDGET / bb).clamp(1, ncols);
    let mut out = Vec::new();
    let mut c0 = 0;
    while c0 < ncols {
        let c1 = (c0 + cols_per).min(ncols);
        let groups_per = (TABLE_BUDGET / (bb * (c1 - c0))).clamp(1, groups.len().max(1));
        let mut g0 = groups.start;
        while g0 < groups.end {
            let g1 = (g0 + groups_per).min(groups.end);
            out.push((g0..g1, c0..c1));
            g0 = g1;
        }
        c0 = c1;
    }
    out
}

/// The K slices of a call: two halves of the groups (`ceil(groups / 2)` first; one slice for a
/// single group). Every `y[m, n]` is the sum, in slice order, of its slices' partial results,
/// each accumulated over its groups in ascending order from `+0.0`.
///
/// Why: a GEMV on two threads runs one slice per thread, each thread building its slice's
/// tables and running all rows against them, so that no thread reads tables the other core
/// built and none waits for the other's build before its lookups (int4 4096x4096 on 2
/// threads: 0.150-0.159 -> 0.130-0.141 ms). The slices depend on the number of groups only
/// (never on N, the table budget or the thread count), so a column of a batch equals the GEMV
/// of that column bit for bit, on any pool. The reference kernel and the GPU kernels (two
/// K splits) add in the same way.
pub fn k_slices(plan: &Plan) -> Vec<Range<usize>> {
    let g = plan.groups;
    if g >= 2 {
        let h = g.div_ceil(2);
        vec![0..h, h..g]
    } else {
        std::iter::once(0..g).collect()
    }
}

/// Row blocks per parallel task: `tasks_per_thread` tasks per thread (of this call's share of
/// the pool, `share` calls running side by side), at least one block,
/// rounded up to whole kernel tiles of 8 row blocks when every thread still gets a task.
///
/// One table pass: one task per thread. A task sweeps each group's tables over all its row
/// tiles in a row, so they are reused from the core's caches; with smaller tasks each tile
/// re-reads every table after the others (half of them written by the other core). Measured
/// (int4 GEMV, 2 threads, minima): M = 4096 0.176 -> 0.167 ms, M = 11008 0.478 -> 0.417 ms,
/// medians as good. Several passes: about 4 tasks per thread, which the next pass's table
/// build (run alongside) needs to balance (N = 3: one task per thread was 10% slower).
fn blocks_per_task(plan: &Plan, tasks_per_thread: usize, share: usize) -> usize {
    let threads = rayon::current_num_threads().div_ceil(share).max(1);
    let per = plan.row_blocks.div_ceil(tasks_per_thread * threads).max(1);
    let whole = per.next_multiple_of(8);
    if plan.row_blocks.div_ceil(whole) >= threads {
        whole
    } else {
        per
    }
}

/// Columns per task when the columns are split between the threads, or `None` to split rows.
///
/// With a column per thread or more, each task takes its own columns and builds their tables
/// itself: no table set is shared, so the passes need no barrier between the threads (with
/// rows split, every pass waits for its slowest row task and its table build). Each task
/// reads all the indices once per pass, a small cost next to its lookups. Tasks are sized so
/// that their `y` block stays within [`TASK_Y_BUDGET`] (with the table set, in a core's L2),
/// and their number is rounded up to a multiple of the thread count, so that the threads get
/// about the same work; a column count that does not split evenly with few columns per thread
/// splits rows.
/// Measured (int4 4096x4096, 2 threads): N = 2..64 faster by 15-30% than the row split.
fn cols_per_task(plan: &Plan) -> Option<usize> {
    let threads = rayon::current_num_threads().max(1);
    let n = plan.n;
    if threads == 1 || n < threads || (!n.is_multiple_of(threads) && n < 4 * threads) {
        return None;
    }
    let y_col = plan.row_blocks * ROW_BLOCK * std::mem::size_of::<f32>();
    let cap = (TASK_Y_BUDGET / y_col).max(1);
    let tasks = n.div_ceil(cap).next_multiple_of(threads);
    Some(n.div_ceil(tasks))
}

/// Bytes of `y` per column task (measured at M = 4096: 16 columns, 256 KiB, 25% faster at
/// N = 64 than 32 columns, whose `y` and tables no longer fit together in a 1 MiB L2).
const TASK_Y_BUDGET: usize = 256 << 10;

/// Table sets kept between calls (at most [`KEPT_SETS`], each at most twice the budget, so at
/// most 4 MiB held for the life of the process): a GEMV otherwise spends about a tenth of its
/// time zeroing a fresh 512 KiB set.
static KEPT: Mutex<Vec<TableSet>> = Mutex::new(Vec::new());
const KEPT_SETS: usize = 4;

/// A kept set, if one is free. `try_lock`: a contended lock just means a fresh set, and a
/// lock held by a thread at the moment of a `fork()` (which the child never sees released)
/// cannot hang the child.
fn kept_set() -> Option<TableSet> {
    match KEPT.try_lock() {
        Ok(mut kept) => kept.pop(),
        Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner().pop(),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

fn keep_set(set: TableSet) {
    if set.capacity_bytes() <= 2 * TABLE_BUDGET {
        let mut kept = match KEPT.try_lock() {
            Ok(k) => k,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        if kept.len() < KEPT_SETS {
            kept.push(set);
        }
    }
}

/// Builds the tables of `(groups, cols)` into `spare`'s memory, or a kept set's, when there
/// is one.
fn build_set(
    plan: &Plan,
    kernel: &dyn LutKernel,
    xt: &[f32],
    spare: Option<TableSet>,
    (groups, cols): (Range<usize>, Range<usize>),
    parallel: bool,
) -> TableSet {
    let mut set = match spare.or_else(kept_set) {
        Some(mut s) => {
            s.reuse(plan, groups, cols);
            s
        }
        None => TableSet::zeroed(plan, groups, cols),
    };
    if !kernel.build_tables(plan, xt, &mut set, parallel) {
        table::build_scalar(plan, xt, &mut set, parallel);
    }
    set
}

/// The effective zero points of the jobs of `plan` (see [`Zeros`]).
pub fn job_zeros<'a>(pw: &'a PackedWeights, plan: &Plan) -> Zeros<'a> {
    if !plan.zero_term {
        Zeros::None
    } else if plan.shift == 0.0 {
        Zeros::Tiled(
            pw.tiled_zeros()
                .expect("zero_term without a shift means zero points"),
        )
    } else {
        match pw.tiled_mirror_zeros(plan.shift) {
            Some(z) => Zeros::Tiled(z),
            // No zero points: `z - shift` with z = 0 in every row.
            None => Zeros::Uniform(-plan.shift),
        }
    }
}

/// Checks that `plan` is a plan of `pw` (shape, group size, levels) and that `xt` and `y` hold
/// `N K` inputs and `M N` outputs: the kernels read the weights' layouts and these buffers
/// through raw pointers at offsets the plan gives.
pub(crate) fn check_plan_call(
    pw: &PackedWeights,
    plan: &Plan,
    xt: &[f32],
    y: &[f32],
) -> Result<()> {
    if (plan.m, plan.k, plan.group_size, plan.levels)
        != (pw.m(), pw.k(), pw.group_size(), pw.codebook().levels())
        || (plan.groups, plan.row_blocks) != (pw.k() / pw.group_size(), pw.m().div_ceil(ROW_BLOCK))
    {
        return Err(Error::invalid(
            "plan",
            format!(
                "a plan of ({}, {}) weights, group size {}, {} levels, given ({}, {}) weights, group size {}, {} levels",
                plan.m,
                plan.k,
                plan.group_size,
                plan.levels,
                pw.m(),
                pw.k(),
                pw.group_size(),
                pw.codebook().levels()
            ),
        ));
    }
    if xt.len() != plan.n * plan.k || y.len() != plan.m * plan.n {
        return Err(Error::invalid(
            "x",
            format!(
                "a call of ({}, {}) x ({}, {}) given {} inputs and {} outputs",
                plan.m,
                plan.k,
                plan.k,
                plan.n,
                xt.len(),
                y.len()
            ),
        ));
    }
    Ok(())
}

/// Runs the plan with `kernel` into `y` (overwritten), laid out as `y_layout`: the K slices
/// ([`k_slices`]) into `y` and a scratch buffer, added in slice order. An error when `plan` is
/// not a plan of `pw` or `xt` / `y` have the wrong length ([`check_plan_call`]).
pub fn run_plan(
    pw: &PackedWeights,
    plan: &Plan,
    kernel: &dyn LutKernel,
    xt: &[f32],
    y: &mut [f32],
    y_layout: YLayout,
) -> Result<()> {
    check_plan_call(pw, plan, xt, y)?;
    let slices = k_slices(plan);
    let (first, rest) = slices.split_first().expect("at least one slice");
    if plan.n == 1
        && rest.len() == 1
        && slices
            .iter()
            .all(|s| table_chunks(plan, 1, s.clone()).len() == 1)
    {
        // GEMV whose slices fit one table pass each: the two slices side by side.
        let mut other = vec![0f32; y.len()];
        let (a, b) = rayon::join(
            || run_groups(pw, plan, kernel, xt, y, y_layout, first.clone(), 2),
            || {
                run_groups(
                    pw,
                    plan,
                    kernel,
                    xt,
                    &mut other,
                    y_layout,
                    rest[0].clone(),
                    2,
                )
            },
        );
        a?;
        b?;
        add_into(y, &other);
        return Ok(());
    }
    run_groups(pw, plan, kernel, xt, y, y_layout, first.clone(), 1)?;
    if !rest.is_empty() {
        let mut other = alloc::zeroed_vec::<f32>(y.len(), "the partial outputs")?;
        for s in rest {
            run_groups(pw, plan, kernel, xt, &mut other, y_layout, s.clone(), 1)?;
            add_into(y, &other);
        }
    }
    Ok(())
}

/// `y += other`, elementwise (float32 adds), on the pool.
fn add_into(y: &mut [f32], other: &[f32]) {
    y.par_chunks_mut(1 << 14)
        .zip(other.par_chunks(1 << 14))
        .for_each(|(a, b)| {
            for (a, b) in a.iter_mut().zip(b) {
                *a += *b;
            }
        });
}

/// [`run_plan`] over the groups `groups` only, into `y` (overwritten). `share`: how many such
/// calls run side by side (each then splits its rows for its share of the threads).
///
/// Kernels accumulate into a column-major block per task (see [`RowJob::y_index`]); with
/// `N > 1` that block is a scratch buffer copied into `y` at the end.
#[allow(clippy::too_many_arguments)]
fn run_groups(
    pw: &PackedWeights,
    plan: &Plan,
    kernel: &dyn LutKernel,
    xt: &[f32],
    y: &mut [f32],
    y_layout: YLayout,
    groups: Range<usize>,
    share: usize,
) -> Result<()> {
    let layout = pw.layout_for(plan, kernel.layout_kind(plan))?;
    let scales = pw.tiled_scales();
    let zeros = job_zeros(pw, plan);
    let n = plan.n;
    let job = |set: &TableSet, row_blocks: Range<usize>, yk: &mut [f32]| {
        let job = RowJob {
            plan,
            layout,
            scales,
            zeros,
            tables: set,
            row_blocks,
        };
        kernel.accumulate(&job, yk);
    };
    let mut scratch: Vec<f32> = Vec::new();
    let per_task = if let Some(cols_per) = cols_per_task(plan) {
        // Columns split: one task per column range, all rows, tables of its own columns
        // (numbered from 0 within the task: the kernels index the job's `y` and X^T by the
        // table set's columns, and X^T rows of a column range are contiguous).
        let (k, span) = (plan.k, plan.row_blocks * ROW_BLOCK);
        scratch.resize(span * n, 0.0);
        scratch
            .par_chunks_mut(cols_per * span)
            .zip(xt.par_chunks(cols_per * k))
            .for_each(|(yk, xs)| {
                let mut spare: Option<TableSet> = None;
                for chunk in table_chunks(plan, xs.len() / k, groups.clone()) {
                    let set = build_set(plan, kernel, xs, spare.take(), chunk, true);
                    job(&set, 0..plan.row_blocks, yk);
                    spare = Some(set);
                }
                if let Some(s) = spare {
                    keep_set(s);
                }
            });
        plan.row_blocks
    } else {
        let chunks = table_chunks(plan, n, groups.clone());
        let per_task = blocks_per_task(plan, if chunks.len() == 1 { 1 } else { 4 }, share);
        let task_len = per_task * ROW_BLOCK * n;
        let yk: &mut [f32] = if n == 1 {
            y.fill(0.0);
            y
        } else {
            scratch.resize(plan.row_blocks * ROW_BLOCK * n, 0.0);
            &mut scratch
        };
        // Large N takes several passes (table chunks within the budget). The next chunk's
        // tables are built while the current chunk's lookups run (two sets, swapped), so that
        // the short parallel builds do not leave a thread idle between passes. Each pass adds
        // into every row of `yk` in pass order, so the result does not depend on the schedule.
        let mut chunks = chunks.into_iter();
        let mut current = chunks
            .next()
            .map(|c| build_set(plan, kernel, xt, None, c, true));
        let mut spare: Option<TableSet> = None;
        while let Some(set) = current.take() {
            let next_chunk = chunks.next();
            let (next, ()) = rayon::join(
                || next_chunk.map(|c| build_set(plan, kernel, xt, spare.take(), c, true)),
                || {
                    yk.par_chunks_mut(task_len)
                        .enumerate()
                        .for_each(|(i, ychunk)| {
                            let rb0 = i * per_task;
                            let rb1 = (rb0 + per_task).min(plan.row_blocks);
                            job(&set, rb0..rb1, ychunk);
                        })
                },
            );
            spare = Some(set);
            current = next;
        }
        if let Some(s) = spare {
            keep_set(s);
        }
        per_task
    };
    if n > 1 {
        // `scratch` is column-major per task of `per_task` row blocks.
        let m = plan.m;
        let rows_per_task = per_task * ROW_BLOCK;
        let task_len = rows_per_task * n;
        match y_layout {
            // In blocks of 64 rows (each inside one task), so that the copy runs on every
            // thread also when the columns were split (one task of all rows).
            YLayout::MbyN => y
                .par_chunks_mut(ROW_BLOCK * n)
                .enumerate()
                .for_each(|(b, out)| {
                    let (t, r0) = (b / per_task, (b % per_task) * ROW_BLOCK);
                    let src = &scratch[t * task_len..(t * task_len + task_len).min(scratch.len())];
                    let span = src.len() / n;
                    for (r, row) in out.chunks_exact_mut(n).enumerate() {
                        for (c, o) in row.iter_mut().enumerate() {
                            *o = src[c * span + r0 + r];
                        }
                    }
                }),
            YLayout::NbyM => y.par_chunks_mut(m).enumerate().for_each(|(c, out)| {
                for (t, dst) in out.chunks_mut(rows_per_task).enumerate() {
                    let src = &scratch[t * task_len..];
                    let span = (src.len().min(task_len)) / n;
                    dst.copy_from_slice(&src[c * span..c * span + dst.len()]);
                }
            }),
        }
    }
    Ok(())
}

/// `y = Wd @ X` for float32 X with `n` columns laid out as `layout`; `y` `(M, N)` row-major is
/// overwritten. Returns the plan used (depth, precision, ...). Errors (`InvalidArgument` on
/// `x`) when X holds a NaN or infinity, and when the result is not finite (float32 overflowed;
/// `y` then holds it).
pub fn gemm_into(
    pw: &PackedWeights,
    x: &[f32],
    n: usize,
    layout: XLayout,
    opts: &GemmOptions,
    y: &mut [f32],
) -> Result<Plan> {
    gemm_into_layout(pw, x, n, layout, YLayout::MbyN, opts, y)
}

/// [`gemm_into`] with the layout of `y` given: `(M, N)` or `(N, M)` row-major.
///
/// Runs on the current rayon pool; called off every pool, on the library pool
/// (`maleki_common::pool`), where a GEMV on 1 or 2 threads runs on the calling thread and at
/// most the helper thread ([`gemv_here`]).
pub fn gemm_into_layout(
    pw: &PackedWeights,
    x: &[f32],
    n: usize,
    layout: XLayout,
    y_layout: YLayout,
    opts: &GemmOptions,
    y: &mut [f32],
) -> Result<Plan> {
    if pool::on_a_pool() {
        return gemm_on_pool(pw, x, n, layout, y_layout, opts, y);
    }
    if let Some(kernel) = float8::kernel_for(pw, opts) {
        if let Some(plan) = float8_here(pw, x, n, (layout, y_layout), opts, kernel, y)? {
            return Ok(plan);
        }
        return pool::install(|| gemm_on_pool(pw, x, n, layout, y_layout, opts, y));
    }
    match dense_here(pw, x, n, layout, y_layout, opts, y)? {
        Here::Ran(plan) => return Ok(*plan),
        // A dense call the caller may not run now: the pool runs it.
        Here::NotReady => {}
        // The tables on the caller, when the call qualifies.
        Here::NotDense if n == 1 => {
            if let Some(plan) = gemv_here(pw, x, layout, opts, y)? {
                return Ok(plan);
            }
        }
        Here::NotDense => {
            let small = n <= CALLER_BATCH_MAX || pw.m() * pw.k() * n <= CALLER_MAX_WORK;
            if small && batch_here(pw, x, n, layout, y_layout, opts, y)? {
                return plan(pw, n, opts);
            }
        }
    }
    pool::install(|| gemm_on_pool(pw, x, n, layout, y_layout, opts, y))
}

/// Batches of at most this many columns called off the pool run on the caller
/// ([`batch_here`]), and larger ones of at most [`CALLER_MAX_WORK`] weight-columns (nf4 g128
/// 64 x 256 N = 8 / 16 / 32 32 / 46 / 103 -> 24 / 39 / 73 us, 256 x 1024 N = 8 141
/// -> 78 us, from Python). The pool path splits the columns between its threads (each task builds
/// full-K tables and reads all the weights) after waking them. Measured from Python (`linear`, int4
/// g128, minima of 7 x 20-200 calls, a noisy sitting, AMD EPYC), pool -> one GEMV per column: 4096 x 4096 N = 2
/// 0.41 -> 0.33 ms, N = 3 0.63 -> 0.53, N = 4 0.67 -> 0.56; 1024 x 4096 N = 3 / 4 0.30 / 0.39
/// -> 0.21 / 0.33 ms; 256 x 4096 N = 3 / 4 0.59 / 0.24 -> 0.12 / 0.14 ms. (N = 8 on the pool
/// was faster: 0.88 against 0.97 ms at 4096 x 4096.) Then one GEMV per column -> all columns in
/// one K-sliced run (`examples/prof`, 2 threads, Intel Xeon, whose GEMV streams its weights at
/// the bandwidth of the core, so each re-read of them costs a GEMV): 4096 x 4096 N = 2
/// 0.32-0.33 -> 0.29 ms, N = 3 0.51 -> 0.41, N = 4 0.64-0.68 -> 0.52-0.54.
const CALLER_BATCH_MAX: usize = 4;

/// A small batch on the caller: the columns in runs of [`caller_run`] as long as the tables of
/// a K slice fit one set (each run reads the weights once; single columns when K is one
/// group); false, with `y` untouched, when a column does not qualify (the pool path then
/// runs). A column of a batch equals the GEMV of that column bit for bit ([`k_slices`]), so
/// the result is the pool's.
#[allow(clippy::too_many_arguments)]
fn batch_here(
    pw: &PackedWeights,
    x: &[f32],
    n: usize,
    layout: XLayout,
    y_layout: YLayout,
    opts: &GemmOptions,
    y: &mut [f32],
) -> Result<bool> {
    let (m, k) = (pw.m(), pw.k());
    if !caller_may_run(pool::pool().current_num_threads(), pw, opts) {
        return Ok(false);
    }
    // The whole batch's checks first, so that errors name positions in `x` as the pool path's
    // do; the result is checked once at the end (every column written first, as there).
    check_inputs(pw, x, n, layout, Some(y.len()))?;
    let xt: Cow<'_, [f32]> = match layout {
        XLayout::NbyK => Cow::Borrowed(x),
        XLayout::KbyN => Cow::Owned(
            (0..n)
                .flat_map(|c| (0..k).map(move |i| x[i * n + c]))
                .collect(),
        ),
    };
    // The columns in runs of as many as one table set per K slice holds (all of them when
    // they fit): each run reads the weights once. Weights of a single group run a column at a
    // time, which only pays for a few columns (the pool then splits them between threads).
    let per_run = caller_columns(pw, opts)?;
    if per_run == 1 && n > CALLER_BATCH_MAX {
        return Ok(false);
    }
    let span = pw.m().div_ceil(crate::layout::ROW_BLOCK) * crate::layout::ROW_BLOCK;
    let mut ys = vec![0f32; n * span];
    let mut c0 = 0;
    while c0 < n {
        let c = per_run.min(n - c0);
        let ran = caller_run(
            pw,
            &xt[c0 * k..(c0 + c) * k],
            c,
            opts,
            &mut ys[c0 * span..(c0 + c) * span],
        )?;
        if ran.is_none() {
            return Ok(false);
        }
        c0 += c;
    }
    for (c, col) in ys.chunks_exact(span).enumerate() {
        match y_layout {
            YLayout::NbyM => y[c * m..(c + 1) * m].copy_from_slice(&col[..m]),
            YLayout::MbyN => {
                for (i, v) in col[..m].iter().enumerate() {
                    y[i * n + c] = *v;
                }
            }
        }
    }
    check_result(y)?;
    Ok(true)
}

/// The plan of a call of `n` columns that runs on the dense `i16` path
/// ([`crate::dense::applies`]), or `None`: not such a call, or weights whose used codes are not
/// known yet (a plan needs them; then the table paths on the caller decline the call too).
fn dense_plan(pw: &PackedWeights, n: usize, opts: &GemmOptions) -> Result<Option<Plan>> {
    if !dense::may_apply(opts) || !pw.used_codes_ready() {
        return Ok(None);
    }
    let plan = plan(pw, n, opts)?;
    Ok(dense::applies(&plan, opts.backend).then_some(plan))
}

/// What [`dense_here`] did.
enum Here {
    /// It ran the call.
    Ran(Box<Plan>),
    /// The call is not one for the dense path (the table GEMV on the caller may take it).
    NotDense,
    /// The call is for the dense path but may not run here now (the pool runs it).
    NotReady,
}

/// A call on the dense `i16` path ([`crate::dense`]) run on the caller (and the helper thread), as
/// [`gemv_here`] runs table GEMVs and for the same reason (waking the pool costs tens of
/// microseconds, a large part of a small call). It runs when the pool has 1 or 2 threads, the
/// weights' dense layout and tiles are built (a first call builds them, on the pool), the
/// caller slot is free, and the call is a GEMV or a batch of at most [`CALLER_MAX_WORK`]
/// weight-columns.
fn dense_here(
    pw: &PackedWeights,
    x: &[f32],
    n: usize,
    layout: XLayout,
    y_layout: YLayout,
    opts: &GemmOptions,
    y: &mut [f32],
) -> Result<Here> {
    let Some(plan) = dense_plan(pw, n, opts)? else {
        return Ok(Here::NotDense);
    };
    let threads = pool::pool().current_num_threads();
    let small = n == 1 || pw.m() * pw.k() * n <= CALLER_MAX_WORK;
    if !small
        || !caller_may_run(threads, pw, opts)
        || !pw.dense_ready(&plan, dense::two_bit(&plan, opts.backend))
    {
        return Ok(Here::NotReady);
    }
    check_inputs(pw, x, n, layout, Some(y.len()))?;
    let Some(_slot) = CallerSlot::take() else {
        return Ok(Here::NotReady);
    };
    let xt = packed_columns_here(pw, x, n, layout);
    dense::run_here(pw, &plan, opts.backend, &xt, y, y_layout, threads == 2)?;
    check_result(y)?;
    Ok(Here::Ran(Box::new(plan)))
}

/// X as `(N, K)` row-major in packed column order, on this thread (no rayon: off the pool).
fn packed_columns_here<'a>(
    pw: &PackedWeights,
    x: &'a [f32],
    n: usize,
    layout: XLayout,
) -> Cow<'a, [f32]> {
    let k = pw.k();
    match (n, layout, pw.k_perm()) {
        (1, _, None) | (_, XLayout::NbyK, None) => Cow::Borrowed(x),
        (_, _, perm) => {
            let src = |j: usize| perm.map_or(j, |p| p[j] as usize);
            Cow::Owned(match layout {
                XLayout::KbyN => (0..n)
                    .flat_map(|c| (0..k).map(move |j| x[src(j) * n + c]))
                    .collect(),
                XLayout::NbyK => (0..n)
                    .flat_map(|c| (0..k).map(move |j| x[c * k + src(j)]))
                    .collect(),
            })
        }
    }
}

/// A call on the fp8 path ([`float8`]) run on the caller (and the helper thread), as [`dense_here`]
/// runs dense calls, or `None` (nothing written) when it may not run here now: more than 2
/// threads, a batch of more than [`CALLER_MAX_WORK`] weight-columns, the codes used not found
/// yet (the plan needs them: a first call finds them, on the pool), or the caller slot taken.
fn float8_here(
    pw: &PackedWeights,
    x: &[f32],
    n: usize,
    (layout, y_layout): (XLayout, YLayout),
    opts: &GemmOptions,
    kernel: float8::Kernel,
    y: &mut [f32],
) -> Result<Option<Plan>> {
    let threads = pool::pool().current_num_threads();
    let small = n == 1 || pw.m() * pw.k() * n <= CALLER_MAX_WORK;
    if !small || !caller_may_run(threads, pw, opts) {
        return Ok(None);
    }
    check_inputs(pw, x, n, layout, Some(y.len()))?;
    let plan = plan(pw, n, opts)?;
    let Some(_slot) = CallerSlot::take() else {
        return Ok(None);
    };
    let xt = packed_columns_here(pw, x, n, layout);
    float8::run(pw, kernel, &xt, n, y, y_layout, Some(threads == 2))?;
    check_result(y)?;
    Ok(Some(plan))
}

/// Batches of at most this many weight-columns (`M K N`) run on the caller: on the dense
/// path ([`dense_here`]), or on the tables ([`batch_here`], which also takes any batch of at
/// most [`CALLER_BATCH_MAX`] columns); larger ones on the pool. Measured from Python (int4 g128, 2
/// threads, default table, minima), pool -> caller: 64 x 256 N = 2 / 4 / 16 30 / 41 / 80 ->
/// 7 / 10 / 25 us, 256 x 1024 N = 2 75 -> 20 us, N = 4 31 -> 28 us; from about 2^22 on the
/// caller was slower (1024 x 1024 N = 4 46-50 against 55 us, 1024 x 4096 N = 4 108-118 against
/// 192 us): its two halves of the rows wait for one another, the pool balances blocks.
const CALLER_MAX_WORK: usize = 1 << 21;

/// Builds everything a GEMV with `opts` reads from `pw` (the codes used, the tile layout of the
/// plan it runs, tiled scales and zero points), so that even the first such call qualifies for
/// [`gemv_here`]. Runs on the current pool (off every pool: on the library pool). Returns the
/// plan of the call.
pub fn prepare(pw: &PackedWeights, opts: &GemmOptions) -> Result<Plan> {
    let build = || {
        let plan = plan(pw, 1, opts)?;
        if opts.backend != Backend::Reference && float8::kernel_for(pw, opts).is_none() {
            if dense::applies(&plan, opts.backend) {
                dense::layout_of(pw, &plan, opts.backend)?;
                job_zeros(pw, &plan);
            } else {
                let (run, kernel) = execution_plan(pw, &plan, opts.backend)?;
                pw.layout_for(&run, kernel.layout_kind(&run))?;
                job_zeros(pw, &run);
            }
        }
        pw.tiled_scales();
        pw.tiled_zeros();
        Ok(plan)
    };
    if pool::on_a_pool() {
        build()
    } else {
        pool::install(build)
    }
}

/// How many GEMVs run on their callers now: [`gemv_here`] runs one at a time (with several
/// calling threads the others go to the pool), so the library keeps to about its thread
/// count: the pool's threads and one caller.
static CALLERS_RUNNING: AtomicUsize = AtomicUsize::new(0);

/// Holds the one caller slot of [`CALLERS_RUNNING`] while alive.
struct CallerSlot;

impl CallerSlot {
    fn take() -> Option<CallerSlot> {
        CALLERS_RUNNING
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| CallerSlot)
    }
}

impl Drop for CallerSlot {
    fn drop(&mut self) {
        CALLERS_RUNNING.store(0, Ordering::Release);
    }
}

/// A GEMV called off the pool, run without handing the whole call to the pool, or `None`
/// when it does not qualify (then nothing was written).
///
/// Handing a call to the pool costs a wake-up of a sleeping worker, another one when that
/// worker splits the work with a second, and a third when it wakes the caller; on a VM each
/// costs tens of microseconds, comparable to a whole 4096 x 4096 int4 GEMV (~120 us). So on a
/// pool of 2 threads the calling thread runs the first K slice itself and the helper thread
/// the second ([`pool::join_here`]: the helper, spinning between calls, takes it at once and
/// the caller spins for it; when the helper has not started the second slice by the time the
/// first is done, the caller runs it), and on 1 thread the caller runs both; a single group (one slice) is built on the caller and, on 2
/// threads, its row blocks are split in two halves the same way (through the pool that cost
/// 20-35 us more per call: int4 64x128 from Python 34 -> 7 us, 4096x128 38 -> 19 us). It
/// qualifies when each slice takes one table pass, everything it reads from the weights is
/// built (a first call builds it, on the pool), and no other GEMV runs on its caller
/// ([`CALLERS_RUNNING`]). The slices, their tables and their order are those of
/// [`run_plan`], so the bits are the same.
fn gemv_here(
    pw: &PackedWeights,
    x: &[f32],
    x_layout: XLayout,
    opts: &GemmOptions,
    y: &mut [f32],
) -> Result<Option<Plan>> {
    if !caller_may_run(pool::pool().current_num_threads(), pw, opts) {
        return Ok(None);
    }
    check_inputs(pw, x, 1, x_layout, Some(y.len()))?;
    let plan = caller_run(pw, x, 1, opts, y)?;
    if plan.is_some() {
        check_result(y)?;
    }
    Ok(plan)
}

/// Whether [`gemv_here`] may take a call on this pool with these options and weights at all
/// (it may still decline one: caches of another depth, the caller slot taken, ...).
fn caller_may_run(threads: usize, pw: &PackedWeights, opts: &GemmOptions) -> bool {
    threads <= 2 && opts.backend != Backend::Reference && pw.used_codes_ready()
}

/// The most columns one [`caller_run`] takes: as many as one table set holds for the longer K
/// slice (computed, not searched: trying every count from `N` down cost a plan per try, which
/// made batches of thousands of columns on small weights take seconds); 1 for weights of a
/// single group, whose runs take one column. At least 1 (a column that exceeds a set is
/// declined by [`caller_run`] itself).
fn caller_columns(pw: &PackedWeights, opts: &GemmOptions) -> Result<usize> {
    let plan = plan(pw, 1, opts)?;
    let (run, _) = execution_plan(pw, &plan, opts.backend)?;
    let slices = k_slices(&run);
    if slices.len() < 2 {
        return Ok(1);
    }
    let longest = slices.iter().map(|s| s.len()).max().unwrap_or(1).max(1);
    let bytes = table::block_bytes(&run).max(1) * longest;
    Ok((TABLE_BUDGET / bytes).max(1))
}

/// The K-sliced run of [`gemv_here`] for `n` columns at once (inputs checked by the caller):
/// `xt` holds the columns one after another (`n * K` values, in the weights' input order),
/// and `y` receives them column-major, `span` floats per column (`span` = the row blocks
/// times 64 when `n > 1`; `M` is enough for one column). Each slice's tables cover all `n`
/// columns, so each thread reads its half of the weights once for the whole batch. `None`
/// (nothing written) when the call does not qualify, e.g. when a slice's tables for `n`
/// columns exceed one table set.
fn caller_run(
    pw: &PackedWeights,
    x: &[f32],
    n: usize,
    opts: &GemmOptions,
    y: &mut [f32],
) -> Result<Option<Plan>> {
    let threads = pool::pool().current_num_threads();
    let k = pw.k();
    // The kernels write `y` through raw pointers: its length is checked here, once.
    let span = pw.m().div_ceil(crate::layout::ROW_BLOCK) * crate::layout::ROW_BLOCK;
    assert!(
        x.len() == n * k && y.len() >= if n == 1 { pw.m() } else { n * span },
        "caller_run: x or y of the wrong length"
    );
    // The plan of one column: a column of a batch equals its GEMV bit for bit.
    let plan = plan(pw, 1, opts)?;
    let (run, kernel) = execution_plan(pw, &plan, opts.backend)?;
    let kind = kernel.layout_kind(&run);
    let slices = k_slices(&run);
    if !pw.ready_for(&run, kind)
        || (n > 1 && slices.len() < 2)
        || slices
            .iter()
            .any(|s| table_chunks(&run, n, s.clone()).len() != 1)
    {
        return Ok(None);
    }
    let Some(_slot) = CallerSlot::take() else {
        return Ok(None);
    };
    let layout = pw.layout_for(&run, kind)?;
    let (scales, zeros) = (pw.tiled_scales(), job_zeros(pw, &run));
    let xt: Cow<'_, [f32]> = match pw.k_perm() {
        None => Cow::Borrowed(x),
        Some(perm) => Cow::Owned(
            x.chunks_exact(k)
                .flat_map(|col| perm.iter().map(|&p| col[p as usize]))
                .collect(),
        ),
    };
    let (run, xt) = (&run, &xt[..]);
    let set_for = |groups: Range<usize>| build_set(run, kernel, xt, None, (groups, 0..n), false);
    fn job<'a>(
        run: &'a Plan,
        layout: &'a crate::layout::TileLayout,
        (scales, zeros): (Tiled<'a>, Zeros<'a>),
        tables: &'a TableSet,
        row_blocks: Range<usize>,
    ) -> RowJob<'a> {
        RowJob {
            plan: run,
            layout,
            scales,
            zeros,
            tables,
            row_blocks,
        }
    }
    if let [first, second] = &slices[..] {
        // One K slice into `ys` (overwritten), all rows, on the calling thread, without rayon.
        let slice = |groups: Range<usize>, ys: &mut [f32]| {
            let set = set_for(groups);
            ys.fill(0.0);
            kernel.accumulate(
                &job(run, layout, (scales, zeros), &set, 0..run.row_blocks),
                ys,
            );
            keep_set(set);
        };
        let mut other = vec![0f32; y.len()];
        if threads == 2 {
            pool::join_here(
                || slice(first.clone(), y),
                || slice(second.clone(), &mut other),
            );
        } else {
            slice(first.clone(), y);
            slice(second.clone(), &mut other);
        }
        for (a, b) in y.iter_mut().zip(&other) {
            *a += *b;
        }
    } else {
        // A single group: one table set, built here; on 2 threads the rows are split in two
        // halves of whole row blocks (the pool path would split them too, at the cost of
        // waking its workers). Rows never change a result.
        let set = set_for(slices[0].clone());
        y.fill(0.0);
        let blocks = run.row_blocks;
        if threads == 2 && blocks >= 2 {
            let h = blocks.div_ceil(2);
            let (ya, yb) = y.split_at_mut(h * crate::layout::ROW_BLOCK);
            let ja = job(run, layout, (scales, zeros), &set, 0..h);
            let jb = job(run, layout, (scales, zeros), &set, h..blocks);
            pool::join_here(|| kernel.accumulate(&ja, ya), || kernel.accumulate(&jb, yb));
        } else {
            kernel.accumulate(&job(run, layout, (scales, zeros), &set, 0..blocks), y);
        }
        keep_set(set);
    }
    Ok(Some(plan))
}

/// [`gemm_into_layout`] on the current pool.
fn gemm_on_pool(
    pw: &PackedWeights,
    x: &[f32],
    n: usize,
    layout: XLayout,
    y_layout: YLayout,
    opts: &GemmOptions,
    y: &mut [f32],
) -> Result<Plan> {
    check_inputs(pw, x, n, layout, Some(y.len()))?;
    let plan = plan(pw, n, opts)?;
    let xt = transpose_permute(pw, x, n, layout)?;
    if opts.backend == Backend::Reference {
        let (out, _) = count::reference_gemm(pw, &plan, &xt)?;
        match y_layout {
            YLayout::MbyN => y.copy_from_slice(&out),
            YLayout::NbyM => {
                for (i, row) in out.chunks_exact(n).enumerate() {
                    for (c, &v) in row.iter().enumerate() {
                        y[c * pw.m() + i] = v;
                    }
                }
            }
        }
        check_result(y)?;
        return Ok(plan);
    }
    // The dense path sums the plan's exact integers at any depth: it needs no table kernel
    // for it (an `i16` plan is also its execution plan); nor does the fp8 path.
    if let Some(kernel) = float8::kernel_for(pw, opts) {
        float8::run(pw, kernel, &xt, n, y, y_layout, None)?;
    } else if dense::applies(&plan, opts.backend) {
        dense::run(pw, &plan, opts.backend, &xt, y, y_layout)?;
    } else {
        let (run, kernel) = execution_plan(pw, &plan, opts.backend)?;
        run_plan(pw, &run, kernel, &xt, y, y_layout)?;
    }
    check_result(y)?;
    Ok(plan)
}

/// `Wd @ X` for X `(K, N)` row-major, as a new `(M, N)` row-major vector.
pub fn gemm(pw: &PackedWeights, x: &[f32], n: usize, opts: &GemmOptions) -> Result<Vec<f32>> {
    let mut y = alloc::zeroed_vec::<f32>(pw.m() * n, "the output")?;
    gemm_into(pw, x, n, XLayout::KbyN, opts, &mut y)?;
    Ok(y)
}

/// The instrumented reference run (`backend = reference`, `f32` tables): `(y, counts, plan)`.
pub fn gemm_counted(
    pw: &PackedWeights,
    x: &[f32],
    n: usize,
    layout: XLayout,
    opts: &GemmOptions,
) -> Result<(Vec<f32>, OpCounts, Plan)> {
    if opts.backend != Backend::Reference {
        return Err(Error::invalid(
            "count",
            "count=True needs backend='reference'",
        ));
    }
    check_inputs(pw, x, n, layout, None)?;
    let plan = plan(pw, n, opts)?;
    let xt = transpose_permute(pw, x, n, layout)?;
    let (y, c) = count::reference_gemm(pw, &plan, &xt)?;
    check_result(&y)?;
    Ok((y, c, plan))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{quantize, Format, QuantizeOptions};

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Deterministic non-integer weights `(m, k)` in [-2, 2) and activations `(k, n)`.
    fn fixture(m: usize, k: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
        let w = (0..m * k)
            .map(|i| ((i * 7919 + 13) % 1000) as f32 / 250.0 - 2.0)
            .collect();
        let x = (0..k * n)
            .map(|i| ((i * 31 % 97) as f32 - 48.0) / 17.0)
            .collect();
        (w, x)
    }

    /// Weights of every kind the caller paths treat apart: int4, uint4 (zero points), int2,
    /// ternary, fp4, one group (K = group size), and act-order int4 (the K order reversed).
    fn caller_cases(m: usize, k: usize) -> Vec<(&'static str, PackedWeights)> {
        let w = fixture(m, k, 1).0;
        let mut cases: Vec<(&str, PackedWeights)> = Vec::new();
        for (name, f, g) in [
            ("int4", Format::Int4, 128),
            ("uint4", Format::Uint4, 64),
            ("int2", Format::Int2, 64),
            ("ternary", Format::Ternary, 128),
            ("fp4", Format::Fp4, 32),
            ("one group", Format::Int4, k),
        ] {
            let qo = QuantizeOptions {
                group_size: Some(g),
                symmetric: Some(f != Format::Uint4),
                ..QuantizeOptions::new(f)
            };
            cases.push((name, quantize(&w, m, k, &qo).unwrap()));
        }
        let base = &cases[0].1;
        let permuted = PackedWeights::from_codes(
            crate::format::Codebook::new(Format::Int4).unwrap(),
            m,
            k,
            128,
            &base.codes().unwrap(),
            base.scales().to_vec(),
            None,
            Some((0..k as u32).rev().collect()),
        )
        .unwrap();
        cases.push(("k_perm", permuted));
        cases
    }

    /// The table precisions and depths the caller-path tests run.
    fn caller_options() -> Vec<GemmOptions> {
        [
            (TablePrecision::I8, Depth::Auto),
            (TablePrecision::I8, Depth::Fixed(1)),
            (TablePrecision::I16, Depth::Auto),
            (TablePrecision::F32, Depth::Fixed(1)),
        ]
        .into_iter()
        .map(|(precision, depth)| GemmOptions {
            depth,
            precision,
            ..GemmOptions::default()
        })
        .collect()
    }

    #[test]
    fn concurrent_first_calls_on_fresh_weights_do_not_hang() {
        // Threads calling on weights whose caches are not built yet, in GEMVs and batches: the
        // caches' parallel builds used to run inside their cells' locks, and a pool thread that
        // stole another call's job while waiting inside such a build blocked on that lock for
        // good (seen from Python with 3 threads and `clear_cache`).
        let (m, k) = (512, 1024);
        let (w, x) = fixture(m, k, 8);
        let qo = QuantizeOptions {
            group_size: Some(128),
            ..QuantizeOptions::new(Format::Int4)
        };
        let pw = quantize(&w, m, k, &qo).unwrap();
        let opts = GemmOptions::default();
        let want: Vec<Vec<f32>> = [1, 3, 8]
            .iter()
            .map(|&n| gemm(&pw, &x[..k * n], n, &opts).unwrap())
            .collect();
        // Rounds of fresh weights shared by all callers, which start together.
        let callers = 4;
        for round in 0..30 {
            let fresh = std::sync::Arc::new(pw.clone());
            let start = std::sync::Arc::new(std::sync::Barrier::new(callers));
            let (tx, rx) = std::sync::mpsc::channel();
            for t in 0..callers {
                let (pw, x, want, tx) = (fresh.clone(), x.clone(), want.clone(), tx.clone());
                let start = start.clone();
                std::thread::spawn(move || {
                    let c = (t + round) % 3;
                    let n = [1, 3, 8][c];
                    start.wait();
                    let y = gemm(&pw, &x[..k * n], n, &GemmOptions::default()).unwrap();
                    assert_eq!(bits(&y), bits(&want[c]), "caller {t}, round {round}");
                    tx.send(()).unwrap();
                });
            }
            for _ in 0..callers {
                rx.recv_timeout(std::time::Duration::from_secs(60))
                    .expect("a caller failed or hung");
            }
        }
    }

    #[test]
    fn caller_columns_is_the_longest_run_of_one_table_set() {
        // The old search, by brute force: the largest column count whose tables for every K
        // slice form a single chunk (1 for weights of a single slice).
        for k in [128, 512, 4096] {
            for (name, pw) in caller_cases(64, k) {
                for opts in caller_options() {
                    let Ok(plan) = plan(&pw, 1, &opts) else {
                        continue;
                    };
                    let (run, _) = execution_plan(&pw, &plan, opts.backend).unwrap();
                    let slices = k_slices(&run);
                    let fits = |c: usize| {
                        slices
                            .iter()
                            .all(|s| table_chunks(&run, c, s.clone()).len() == 1)
                    };
                    let want = if slices.len() < 2 {
                        1
                    } else {
                        (1..=4096).rev().find(|&c| fits(c)).unwrap_or(1)
                    };
                    let got = caller_columns(&pw, &opts).unwrap();
                    assert_eq!(got, want, "{name} K={k} {opts:?}");
                }
            }
        }
    }

    #[test]
    fn small_batches_from_the_caller_give_the_pool_bits() {
        // N = 2..4 (<= CALLER_BATCH_MAX; more when M K N <= CALLER_MAX_WORK) called off
        // the pool runs on the caller
        // (`batch_here`): all columns in one K-sliced run, or runs of fewer columns when the
        // batch's tables exceed a set per slice (int4 g128 at K = 4352, N = 4: 3 + 1), or one
        // GEMV per column when K is one group. Either gives the pool's bits, in every layout, on 1 and 2 threads, for every
        // kind of weights of `caller_cases` and every table precision, with the weights
        // prepared (else the pool runs it).
        let mut cases = caller_cases(200, 640);
        let qo = QuantizeOptions {
            group_size: Some(128),
            ..QuantizeOptions::new(Format::Int4)
        };
        let (m, k) = (64, 4352);
        cases.push((
            "tables over budget",
            quantize(&fixture(m, k, 1).0, m, k, &qo).unwrap(),
        ));
        let before = pool::num_threads();
        let mut compared = 0;
        for (name, pw) in &cases {
            let (m, k) = (pw.m(), pw.k());
            for opts in caller_options() {
                prepare(pw, &opts).unwrap();
                let (precision, depth) = (opts.precision, opts.depth);
                // Up to CALLER_BATCH_MAX columns, and more while the batch is small.
                for n in [2, 3, 4, 7, 16] {
                    let x = fixture(1, k, n).1;
                    for threads in [1, 2] {
                        pool::set_num_threads(threads).unwrap();
                        for layout in [XLayout::KbyN, XLayout::NbyK] {
                            for y_layout in [YLayout::MbyN, YLayout::NbyM] {
                                let case = format!(
                                    "{name} {precision:?} {depth:?} n{n} {layout:?} {y_layout:?} t{threads}"
                                );
                                let mut want = vec![0f32; m * n];
                                pool::install(|| {
                                    gemm_into_layout(pw, &x, n, layout, y_layout, &opts, &mut want)
                                })
                                .unwrap();
                                let mut got = vec![f32::NAN; m * n];
                                let ran = batch_here(pw, &x, n, layout, y_layout, &opts, &mut got);
                                // Another test's GEMV may hold the one caller slot for a moment.
                                if ran.unwrap() {
                                    compared += 1;
                                    assert_eq!(bits(&got), bits(&want), "{case}");
                                }
                                let mut via = vec![f32::NAN; m * n];
                                gemm_into_layout(pw, &x, n, layout, y_layout, &opts, &mut via)
                                    .unwrap();
                                assert_eq!(bits(&via), bits(&want), "{case}");
                            }
                        }
                    }
                }
            }
        }
        pool::set_num_threads(before).unwrap();
        assert!(
            compared > 100,
            "only {compared} batches ran on their caller"
        );
    }

    #[test]
    fn dense_batches_from_the_caller_give_the_pool_bits() {
        // Batches on the dense path of at most CALLER_MAX_WORK weight-columns called off
        // the pool run on the caller and the helper thread (`dense_here`), with X transposed and
        // permuted there (act-order weights, both X layouts) and Y in both layouts: the pool's
        // bits on 1 and 2 threads; larger batches are left to the pool.
        let cases = caller_cases(200, 640);
        let opts = GemmOptions {
            precision: TablePrecision::I16,
            ..GemmOptions::default()
        };
        if dense::kind_for(opts.backend).is_none() {
            return; // no dense kernel on this CPU
        }
        let before = pool::num_threads();
        let mut compared = 0;
        for (name, pw) in &cases {
            let (m, k) = (pw.m(), pw.k());
            prepare(pw, &opts).unwrap();
            for n in [2, 3, 5, 16] {
                let x = fixture(1, k, n).1;
                // The first batch call builds what a batch reads (on the pool).
                let mut y = vec![0f32; m * n];
                gemm_into_layout(pw, &x, n, XLayout::KbyN, YLayout::MbyN, &opts, &mut y).unwrap();
                for threads in [1, 2] {
                    pool::set_num_threads(threads).unwrap();
                    for layout in [XLayout::KbyN, XLayout::NbyK] {
                        for y_layout in [YLayout::MbyN, YLayout::NbyM] {
                            let case = format!("{name} n{n} {layout:?} {y_layout:?} t{threads}");
                            let mut want = vec![0f32; m * n];
                            pool::install(|| {
                                gemm_into_layout(pw, &x, n, layout, y_layout, &opts, &mut want)
                            })
                            .unwrap();
                            let mut got = vec![f32::NAN; m * n];
                            match dense_here(pw, &x, n, layout, y_layout, &opts, &mut got).unwrap()
                            {
                                Here::Ran(_) => {
                                    compared += 1;
                                    assert_eq!(bits(&got), bits(&want), "{case}");
                                }
                                // Another test's call may hold the one caller slot.
                                Here::NotReady => {}
                                Here::NotDense => {
                                    assert!(dense_plan(pw, n, &opts).unwrap().is_none(), "{case}")
                                }
                            }
                        }
                    }
                }
            }
        }
        // Too large for the caller: left to the pool.
        let (m, k) = (2048, 1024);
        let big = quantize(
            &fixture(m, k, 1).0,
            m,
            k,
            &QuantizeOptions {
                group_size: Some(128),
                ..QuantizeOptions::new(Format::Int4)
            },
        )
        .unwrap();
        prepare(&big, &opts).unwrap();
        let x = fixture(1, k, 2).1;
        let mut y = vec![0f32; m * 2];
        gemm_into_layout(&big, &x, 2, XLayout::KbyN, YLayout::MbyN, &opts, &mut y).unwrap();
        assert!(matches!(
            dense_here(&big, &x, 2, XLayout::KbyN, YLayout::MbyN, &opts, &mut y).unwrap(),
            Here::NotReady
        ));
        pool::set_num_threads(before).unwrap();
        assert!(
            compared > 100,
            "only {compared} dense batches ran on their caller"
        );
    }

    /// A GEMV on the caller, on the dense path or the tables (as `gemm_into_layout` picks):
    /// whether it ran there.
    fn here(pw: &PackedWeights, x: &[f32], opts: &GemmOptions, y: &mut [f32]) -> bool {
        match dense_here(pw, x, 1, XLayout::KbyN, YLayout::MbyN, opts, y).unwrap() {
            Here::Ran(_) => true,
            Here::NotReady => false,
            Here::NotDense => gemv_here(pw, x, XLayout::KbyN, opts, y).unwrap().is_some(),
        }
    }

    #[test]
    fn gemv_from_the_caller_gives_the_pool_bits() {
        // A GEMV called off the pool on 1 or 2 threads runs on the caller (and the helper thread;
        // a single group: its rows split in two, 200 rows = 4 blocks): the same bits as on
        // the pool, once the first call has built the weights' caches.
        // (Other tests may run meanwhile: the pool size never changes a result.)
        let (m, k) = (200, 640);
        let x = fixture(m, k, 1).1;
        let cases = caller_cases(m, k);
        let before = pool::num_threads();
        for threads in [1, 2] {
            pool::set_num_threads(threads).unwrap();
            for (name, pw) in &cases {
                for opts in caller_options() {
                    let (precision, depth) = (opts.precision, opts.depth);
                    let mut want = vec![0f32; m];
                    pool::install(|| gemm_into(pw, &x, 1, XLayout::KbyN, &opts, &mut want))
                        .unwrap();
                    // The first call off the pool may build caches (on the pool); the next
                    // one runs here.
                    let first = gemm(pw, &x, 1, &opts).unwrap();
                    // Fresh weights, prepared: their first call qualifies already.
                    let fresh = pw.clone();
                    let mut y0 = vec![0f32; m];
                    assert!(!here(&fresh, &x, &opts, &mut y0));
                    prepare(&fresh, &opts).unwrap();
                    let ready = (0..1000).any(|_| {
                        here(&fresh, &x, &opts, &mut y0) || {
                            std::thread::sleep(std::time::Duration::from_millis(1));
                            false
                        }
                    });
                    assert!(ready, "{name}: prepare() left a cache unbuilt");
                    let what = format!("{name} {precision:?} {depth:?} threads={threads}");
                    assert_eq!(bits(&first), bits(&want), "{what}");
                    // Another test's GEMV may hold the one caller slot for a moment.
                    let mut y_here = vec![0f32; m];
                    let ran = (0..1000).any(|_| {
                        here(pw, &x, &opts, &mut y_here) || {
                            std::thread::sleep(std::time::Duration::from_millis(1));
                            false
                        }
                    });
                    assert!(ran, "{what}: not run on the caller");
                    assert_eq!(bits(&y_here), bits(&want), "{what}");
                }
            }
        }
        pool::set_num_threads(before).unwrap();
    }

    #[test]
    fn first_non_finite_finds_the_first_bad_value_in_any_block() {
        let mut v = vec![1.5f32; 300];
        assert_eq!(first_non_finite(&v), None);
        assert_eq!(first_non_finite(&[]), None);
        for (i, bad) in [
            (0, f32::NAN),
            (63, f32::INFINITY),
            (64, -f32::INFINITY),
            (299, f32::NAN),
        ] {
            v[i] = bad;
            v[(i + 5).min(299)] = f32::NAN; // a later one must not be reported
            assert_eq!(first_non_finite(&v), Some(i.min((i + 5).min(299))));
            v.fill(1.5);
        }
        // Largest finite values and subnormals are finite.
        assert_eq!(
            first_non_finite(&[f32::MAX, -f32::MAX, 1e-45, 0.0, -0.0]),
            None
        );
    }

    #[test]
    fn non_finite_x_and_overflowing_results_are_errors() {
        let (m, k) = (4, 64);
        let w: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
        let qo = QuantizeOptions {
            group_size: Some(32),
            ..QuantizeOptions::new(Format::Int4)
        };
        let pw = quantize(&w, m, k, &qo).unwrap();
        let opts = GemmOptions::default();
        let mut x = vec![1f32; k * 2];
        x[2 * 5 + 1] = f32::NAN; // input 5 of column 1, (K, N) layout
        let e = gemm(&pw, &x, 2, &opts).unwrap_err().to_string();
        assert!(
            e.contains("non-finite") && e.contains("input 5 of column 1"),
            "{e}"
        );
        let mut y = vec![0f32; m * 2];
        let e = gemm_into(&pw, &x, 2, XLayout::NbyK, &opts, &mut y)
            .unwrap_err()
            .to_string();
        // The same flat position read as (N, K): input 11 of column 0.
        assert!(e.contains("input 11 of column 0"), "{e}");
        let runs = [
            (Backend::Auto, TablePrecision::I8),
            (Backend::Scalar, TablePrecision::I16),
            (Backend::Reference, TablePrecision::F32),
        ];
        for (backend, precision) in runs {
            let opts = GemmOptions {
                backend,
                precision,
                ..GemmOptions::default()
            };
            let e = gemm(&pw, &vec![3e38f32; k], 1, &opts)
                .unwrap_err()
                .to_string();
            assert!(e.contains("overflows float32"), "{backend:?}: {e}");
        }
        let counted = GemmOptions {
            backend: Backend::Reference,
            precision: TablePrecision::F32,
            ..GemmOptions::default()
        };
        let e = gemm_counted(&pw, &vec![3e38f32; k], 1, XLayout::KbyN, &counted).unwrap_err();
        assert!(e.to_string().contains("overflows float32"), "{e}");
    }
}
