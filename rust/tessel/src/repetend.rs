//! Repetend construction by exact branch-and-bound (spec §4.1).
//!
//! For a period `P`, find a template `a` (one start per block, `min a = 0`) satisfying T1-T3
//! that minimises `L = max(a + s)`. Blocks are assigned in a fixed topological order (ready
//! multi-device blocks first, then smaller `head`, then larger `tail`); values are tried in
//! ascending order, so the first leaf is a modulo list schedule and later leaves only improve.
//!
//! Domains and dominance rules (each keeps at least one optimal template, see the proofs in
//! the comments of [`Search::capped`]): a block `g` ranges over `[est_g, L* - 1 - s_g - tail_g]`
//! and, when lowering it by `P` can never hurt (it frees memory, memory is unlimited on its
//! devices, or the blocks after it are entered only through it), over at most one period
//! `[est_g, est_g + P - 1]`. Blocks without such a rule range up to `L_max = CP + n P`, the
//! window in which "proved optimal" holds for them.
//!
//! Pruning at each node, in O(D P / 64) or better: free residues on every device of the block
//! (bit sets), a common free arc for every unassigned multi-device block, wasted free arcs
//! against the device's slack, the period-average memory bound
//! `sum_g mu_g e_g >= -P M_d` (§2), and `a + s + tail < L*`. The exact steady peak (T3) is
//! checked as soon as the last block of a device is placed.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Instant;

use maleki_common::progress::Progress;
use maleki_common::{Error, Result};
use rayon::prelude::*;

use crate::bits::Bits;
use crate::model::{MemoryConvention, Premise, UNLIMITED};
use crate::template::{device_steady_peak, Template};

/// Largest period the bit-set search handles (64 words of 64 bits).
pub const MAX_PERIOD: i64 = 4096;

/// Expands `$run!(K)` with `K` the smallest bit-set width (in 64-bit words, one of 1, 2, 4,
/// 8, 16, 64) that holds the residues `0..$period`: the one table every monomorphised
/// [`Search`] is chosen from.
macro_rules! with_words {
    ($period:expr, $run:ident) => {
        match ($period as usize).div_ceil(64) {
            0 | 1 => $run!(1),
            2 => $run!(2),
            3 | 4 => $run!(4),
            5..=8 => $run!(8),
            9..=16 => $run!(16),
            _ => $run!(64),
        }
    };
}

/// Limits and parameters of the repetend search.
#[derive(Clone, Debug)]
pub struct RepetendOptions {
    /// Memory cap per device ([`UNLIMITED`] for none).
    pub memory: Vec<i64>,
    pub convention: MemoryConvention,
    /// Periods searched above the smallest feasible one, `P* ..= P* + delta_p`.
    pub delta_p: i64,
    /// Node budget per period.
    pub node_budget: u64,
    /// Wall-clock deadline.
    pub deadline: Option<Instant>,
    /// Pairs `(h, r)`: block `h` must start less than one period after block `r`
    /// (`a_h <= a_r + P - 1`; FIFO between the copies of a K-periodic replica).
    pub within_period: Vec<(usize, usize)>,
    /// Smallest period searched (the default 0 starts at `P_LB`).
    pub min_period: i64,
    /// Largest period searched (0: up to `sum(spans) + sum(lags)`).
    pub max_period: i64,
    /// The number of micro-batches the templates are for (default 1). A period `P` above a
    /// feasible `P'` is only of interest when `L(P) < L(P') - (N - 1)(P - P')`: its unrolled
    /// makespan `(N - 1) P + L` is then shorter. N = 1 keeps every period whose template is
    /// shorter than those of the smaller periods.
    pub nmicros: usize,
}

impl RepetendOptions {
    pub fn new(memory: Vec<i64>) -> Self {
        RepetendOptions {
            memory,
            convention: MemoryConvention::Start,
            delta_p: 3,
            node_budget: 20_000_000,
            deadline: None,
            within_period: Vec::new(),
            min_period: 0,
            max_period: 0,
            nmicros: 1,
        }
    }
}

/// What the search established for one period.
#[derive(Clone, Debug, PartialEq)]
pub struct PeriodOutcome {
    pub period: i64,
    /// The template of minimum `L` found (the first one in search order among equals).
    pub best: Option<Template>,
    /// The first template found (a modulo list schedule).
    pub first: Option<Template>,
    /// True when the search finished: `best` is optimal for this period, or no template
    /// exists (`best` is None).
    pub exhausted: bool,
    pub nodes: u64,
}

impl PeriodOutcome {
    pub fn length(&self, p: &Premise) -> Option<i64> {
        self.best.as_ref().map(|t| t.length(p))
    }
}

/// The result of repetend construction.
#[derive(Clone, Debug, Default)]
pub struct Repetends {
    /// The smallest period with a template (`P*`), if any was found.
    pub min_period: Option<i64>,
    /// True when every period below `min_period` was proved infeasible.
    pub min_period_proved: bool,
    /// Outcomes for the periods in `P* ..= P* + delta_p` that are not dominated (a period is
    /// dominated when a smaller one has a template at most as long).
    pub periods: Vec<PeriodOutcome>,
    pub nodes: u64,
}

/// Premises with more blocks skip the ancestor test of [`check_memory_caps`] (its ancestor
/// sets take `n^2` bits).
const FORCED_MEMORY_MAX_BLOCKS: usize = 4096;

/// Necessary conditions checked before any search, for any number of micro-batches: on each
/// device, the memory one micro-batch is forced to hold when one of its allocating blocks
/// starts fits the cap.
///
/// When allocating block `g` takes effect, every ancestor of `g` has taken effect and no
/// descendant has started (they start after `g` ends); blocks unrelated to `g` may or may
/// not have. So device `d` holds at least `mu_g + sum(mu of g's ancestors on d) + sum(mu of
/// the frees on d unrelated to g)` (leaving out the unrelated allocations only lowers the
/// sum), under either memory convention. Other micro-batches in flight hold `>= 0` each
/// (a well-formed premise never frees more than it holds, along any order), so no schedule
/// fits when that exceeds the cap. This catches, before any search (`O(edges n / 64)` for
/// the ancestor sets), caps the searches would otherwise take their whole budget to give up
/// on (kshape at `memory = 1`: the fused forward allocates on every device while each
/// stage's own forward still holds its activation).
pub fn check_memory_caps(premise: &Premise, memory: &[i64]) -> Result<()> {
    for (g, b) in premise.blocks().iter().enumerate() {
        for &d in &b.devices {
            if b.memory > memory[d] {
                return Err(Error::Infeasible(format!(
                    "block {} allocates {} on device {d}, above its memory cap {}",
                    premise.describe(g),
                    b.memory,
                    memory[d]
                )));
            }
        }
    }
    let n = premise.nblocks();
    if n > FORCED_MEMORY_MAX_BLOCKS || premise.blocks().iter().all(|b| b.memory == 0) {
        return Ok(());
    }
    // Ancestor sets (bit h of `anc[g]`: h precedes g), in topological order.
    let words = n.div_ceil(64);
    let mut anc = vec![vec![0u64; words]; n];
    for &g in premise.topo_order() {
        let mut a = vec![0u64; words];
        for &(h, _) in premise.preds(g) {
            a[h / 64] |= 1 << (h % 64);
            for (w, x) in a.iter_mut().zip(&anc[h]) {
                *w |= x;
            }
        }
        anc[g] = a;
    }
    let has = |set: &[u64], h: usize| set[h / 64] >> (h % 64) & 1 == 1;
    for (g, b) in premise.blocks().iter().enumerate() {
        if b.memory <= 0 {
            continue;
        }
        for &d in &b.devices {
            let mut forced = i128::from(b.memory);
            for &h in premise.blocks_on(d) {
                let mu = premise.block(h).memory;
                if h == g || mu == 0 {
                    continue;
                }
                if has(&anc[g], h) || (mu < 0 && !has(&anc[h], g)) {
                    forced += i128::from(mu);
                }
            }
            if forced > i128::from(memory[d]) {
                let held: Vec<String> = premise
                    .blocks_on(d)
                    .iter()
                    .filter(|&&h| has(&anc[g], h) && premise.block(h).memory > 0)
                    .map(|&h| premise.describe(h))
                    .collect();
                return Err(Error::Infeasible(format!(
                    "no schedule fits the memory caps: one micro-batch holds at least {forced} on device {d} \
                     when block {} starts (allocated before it by {}), above the cap {}",
                    premise.describe(g),
                    if held.is_empty() { "no other block".to_string() } else { held.join(", ") },
                    memory[d]
                )));
            }
        }
    }
    Ok(())
}

/// Runs the exact search over periods in parallel (rayon, in the caller's pool) and returns
/// the outcomes for `P* ..= P* + delta_p`.
///
/// Periods are searched in batches from `P_LB = max_d W_d` upwards until a feasible one is
/// found, up to `sum(spans) + sum(lags)` (beyond it nothing changes: one micro-batch at a
/// time). Each task reads the best `L` of the smaller periods (a shared atomic) and prunes
/// templates that could not beat it; the reported outcomes do not depend on the thread count
/// unless a budget or the deadline cuts a search short.
pub fn construct(
    premise: &Premise,
    opts: &RepetendOptions,
    progress: &dyn Progress,
) -> Result<Repetends> {
    if opts.memory.len() != premise.ndevs() {
        return Err(Error::shape("memory", premise.ndevs(), opts.memory.len()));
    }
    if opts.delta_p < 0 {
        return Err(Error::invalid(
            "delta_p",
            format!("must be >= 0, got {}", opts.delta_p),
        ));
    }
    check_memory_caps(premise, &opts.memory)?;
    let p_lb = premise.period_lower_bound().max(1).max(opts.min_period);
    let serial: i64 = premise.blocks().iter().map(|b| b.span).sum::<i64>()
        + premise.edges().iter().map(|e| e.lag).sum::<i64>();
    let mut p_hi = serial.max(p_lb).min(MAX_PERIOD);
    if opts.max_period > 0 {
        p_hi = p_hi.min(opts.max_period);
        if p_hi < p_lb {
            return Ok(Repetends::default());
        }
    }
    if p_lb > MAX_PERIOD {
        return Err(Error::Unsupported(format!(
            "the period lower bound {p_lb} exceeds {MAX_PERIOD} time units; quantise the spans more coarsely"
        )));
    }
    let batch = (opts.delta_p + 1).max(rayon::current_num_threads() as i64);
    let nodes = AtomicU64::new(0);
    let mut results: Vec<PeriodOutcome> = Vec::new();
    let mut lo = p_lb;
    let mut min_period: Option<i64> = None;
    while lo <= p_hi {
        let hi = match min_period {
            Some(ps) => (ps + opts.delta_p).min(MAX_PERIOD),
            None => (lo + batch - 1).min(p_hi),
        };
        if hi < lo {
            break;
        }
        let bounds: Vec<AtomicI64> = (lo..=hi).map(|_| AtomicI64::new(i64::MAX)).collect();
        // Smaller periods already searched bound every task of this batch.
        let prior: Vec<(i64, i64)> = results
            .iter()
            .filter_map(|r| Some((r.period, r.length(premise)?)))
            .collect();
        let out: Vec<Result<PeriodOutcome>> = (lo..=hi)
            .into_par_iter()
            .map(|p| {
                let idx = (p - lo) as usize;
                let r = search_period(premise, p, opts, &bounds, lo, &prior, &nodes, progress)?;
                if let Some(t) = &r.best {
                    bounds[idx].fetch_min(t.length(premise), Ordering::Relaxed);
                }
                Ok(r)
            })
            .collect();
        for r in out {
            results.push(r?);
        }
        progress.check()?;
        if min_period.is_none() {
            min_period = results.iter().find(|r| r.best.is_some()).map(|r| r.period);
        }
        match min_period {
            Some(ps) if hi >= (ps + opts.delta_p).min(MAX_PERIOD) => break,
            None if hi >= p_hi => break,
            _ => lo = hi + 1,
        }
    }
    let nodes = nodes.load(Ordering::Relaxed);
    let Some(ps) = min_period else {
        // Proved only when the periods searched reach the serial one (beyond it nothing
        // changes), not when MAX_PERIOD cut the range short.
        if results.iter().all(|r| r.exhausted) && opts.max_period == 0 && serial <= MAX_PERIOD {
            return Err(Error::Infeasible(format!(
                "no periodic schedule fits the memory caps {:?} (every period up to {p_hi} was searched exhaustively)",
                opts.memory
            )));
        }
        return Ok(Repetends {
            min_period: None,
            min_period_proved: false,
            periods: Vec::new(),
            nodes,
        });
    };
    let min_period_proved = results
        .iter()
        .filter(|r| r.period < ps)
        .all(|r| r.exhausted)
        && p_lb == premise.period_lower_bound().max(1);
    // Keep the periods of the window that beat every smaller period (the rule of
    // `RepetendOptions::nmicros`); a period beaten this way keeps only its first template.
    let nm1 = opts.nmicros.saturating_sub(1).min(1 << 20) as i64;
    let mut periods: Vec<PeriodOutcome> = Vec::new();
    for mut r in results
        .into_iter()
        .filter(|r| r.period >= ps && r.period <= ps + opts.delta_p)
    {
        let Some(l) = r.length(premise) else { continue };
        let beaten = periods.iter().any(|o| {
            o.best.is_some()
                && l >= o.length(premise).unwrap_or(i64::MAX) - nm1 * (r.period - o.period)
        });
        if beaten {
            if r.period == ps {
                continue;
            }
            r.best = None;
        }
        periods.push(r);
    }
    periods.retain(|o| o.best.is_some() || o.first.is_some());
    Ok(Repetends {
        min_period: Some(ps),
        min_period_proved,
        periods,
        nodes,
    })
}

/// Every template of period `period` with `L <= max_length` (up to `limit` of them, in
/// search order), within the dominance rules of the exact search.
pub fn enumerate(
    premise: &Premise,
    period: i64,
    opts: &RepetendOptions,
    max_length: i64,
    limit: usize,
) -> Result<Vec<Template>> {
    if opts.memory.len() != premise.ndevs() {
        return Err(Error::shape("memory", premise.ndevs(), opts.memory.len()));
    }
    if !(1..=MAX_PERIOD).contains(&period) || limit == 0 {
        return Ok(Vec::new());
    }
    let bounds = [AtomicI64::new(i64::MAX)];
    let nodes = AtomicU64::new(0);
    let progress = maleki_common::NoProgress;
    macro_rules! run {
        ($k:literal) => {{
            let mut s = Search::<$k>::new(
                premise,
                period,
                opts,
                &bounds,
                period,
                &[],
                &nodes,
                &progress,
            );
            s.collect = limit;
            // Completion may prefer templates outside the dominance domains.
            s.capped.iter_mut().for_each(|c| *c = false);
            s.l_cap = max_length + 1;
            s.root = i64::MIN;
            if premise.work().iter().all(|&w| w <= period) {
                s.reserve(0);
            }
            s.pool
        }};
    }
    let pool = with_words!(period, run);
    Ok(pool.into_iter().map(|a| Template::new(period, a)).collect())
}

/// Searches one period; dispatches on the number of 64-bit words a residue set needs.
#[allow(clippy::too_many_arguments)]
fn search_period(
    premise: &Premise,
    period: i64,
    opts: &RepetendOptions,
    bounds: &[AtomicI64],
    lo: i64,
    prior: &[(i64, i64)],
    nodes: &AtomicU64,
    progress: &dyn Progress,
) -> Result<PeriodOutcome> {
    // Each period's search takes its own setup (O(blocks^2)) before its first node: checked
    // here too, so that a range of periods each refuted in a few nodes still stops at the
    // deadline or on a cancel.
    progress.check()?;
    if opts.deadline.is_some_and(|d| Instant::now() >= d) {
        return Ok(PeriodOutcome {
            period,
            best: None,
            first: None,
            exhausted: false,
            nodes: 0,
        });
    }
    macro_rules! run {
        ($k:literal) => {
            Search::<$k>::new(premise, period, opts, bounds, lo, prior, nodes, progress).run()
        };
    }
    with_words!(period, run)
}

/// The decision order: topological; among ready blocks, multi-device first, then smaller
/// head, then larger tail, then smaller index.
pub(crate) fn decision_order(p: &Premise) -> Vec<usize> {
    let n = p.nblocks();
    let mut indeg: Vec<usize> = (0..n).map(|g| p.preds(g).len()).collect();
    let mut ready: Vec<usize> = (0..n).filter(|&g| indeg[g] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while !ready.is_empty() {
        let key = |g: usize| {
            (
                p.block(g).devices.len() == 1,
                p.heads()[g],
                -p.tails()[g],
                g,
            )
        };
        let (k, _) = ready
            .iter()
            .enumerate()
            .min_by_key(|&(_, &g)| key(g))
            .expect("non-empty");
        let g = ready.swap_remove(k);
        order.push(g);
        for &(h, _) in p.succs(g) {
            indeg[h] -= 1;
            if indeg[h] == 0 {
                ready.push(h);
            }
        }
    }
    order
}

/// Twin classes: blocks with equal span, devices, memory, predecessors and successors are
/// interchangeable; `twin_prev[g]` is the previous twin of `g` in decision order.
fn twins(p: &Premise, pos: &[usize]) -> Vec<Option<usize>> {
    let n = p.nblocks();
    let mut prev = vec![None; n];
    for g in 0..n {
        for h in 0..n {
            let (bg, bh) = (p.block(g), p.block(h));
            if pos[h] < pos[g]
                && bg.span == bh.span
                && bg.devices == bh.devices
                && bg.memory == bh.memory
                && p.preds(g) == p.preds(h)
                && p.succs(g) == p.succs(h)
                && prev[g].is_none_or(|k: usize| pos[k] < pos[h])
            {
                prev[g] = Some(h);
            }
        }
    }
    prev
}

struct Search<'a, const K: usize> {
    p: &'a Premise,
    period: i64,
    pu: usize,
    n: usize,
    order: Vec<usize>,
    capped: Vec<bool>,
    twin_prev: Vec<Option<usize>>,
    within: Vec<Option<usize>>,
    /// Multi-device blocks, in decision order: their residues are chosen first (phase 1).
    multi: Vec<usize>,
    /// The residue reserved for each multi-device block in phase 1.
    fixed: Vec<Option<usize>>,
    /// Single-device blocks with the same device and span share their feasible starts.
    class_of: Vec<usize>,
    class_key: Vec<(usize, usize)>,
    /// `active[k]`: the classes of the single-device blocks at positions `>= k`.
    active: Vec<Vec<usize>>,
    caps: Vec<i64>,
    conv: MemoryConvention,
    /// Devices with a finite cap and some non-zero memory delta.
    mem_devs: Vec<usize>,
    /// For each position: the devices whose last block sits there.
    closes: Vec<Vec<usize>>,
    /// `min_span[d][k]`: smallest span among the single-device blocks on `d` at positions `>= k`.
    min_span: Vec<Vec<i64>>,
    /// `rem_work[d][k]`: total span of the single-device blocks on `d` at positions `>= k`.
    rem_work: Vec<Vec<i64>>,
    last_source: usize,
    sole_source: Option<usize>,
    sources: Vec<usize>,
    root: i64,
    l_cap: i64,
    // Shared bounds.
    bounds: &'a [AtomicI64],
    /// Period of `bounds[0]`; `bounds[period - lo]` is this task's.
    lo: i64,
    prior: &'a [(i64, i64)],
    /// `N - 1` of the period-dominance rule (see [`RepetendOptions::nmicros`]).
    nm1: i64,
    ext: i64,
    global_nodes: &'a AtomicU64,
    progress: &'a dyn Progress,
    budget: u64,
    deadline: Option<Instant>,
    // State.
    a: Vec<i64>,
    assigned: Vec<bool>,
    free: Vec<Bits<K>>,
    /// Earliest and latest feasible starts of each unassigned block (filled by `propagate`).
    e: Vec<i64>,
    l: Vec<i64>,
    starts: Vec<Bits<K>>,
    runs: Vec<usize>,
    best_l: i64,
    best: Option<Vec<i64>>,
    first: Option<Vec<i64>>,
    /// Enumeration mode (`collect > 0`): every leaf is kept, up to `collect` of them.
    collect: usize,
    pool: Vec<Vec<i64>>,
    nodes: u64,
    stop: bool,
    cancelled: bool,
}

impl<'a, const K: usize> Search<'a, K> {
    #[allow(clippy::too_many_arguments)]
    fn new(
        p: &'a Premise,
        period: i64,
        opts: &RepetendOptions,
        bounds: &'a [AtomicI64],
        lo: i64,
        prior: &'a [(i64, i64)],
        global_nodes: &'a AtomicU64,
        progress: &'a dyn Progress,
    ) -> Self {
        let n = p.nblocks();
        let pu = period as usize;
        let order = decision_order(p);
        let mut pos = vec![0; n];
        for (k, &g) in order.iter().enumerate() {
            pos[g] = k;
        }
        let caps = opts.memory.clone();
        let capped = Self::capped(p, &caps);
        let twin_prev = twins(p, &pos);
        let single = |g: usize| p.block(g).devices.len() == 1;
        let multi: Vec<usize> = order.iter().copied().filter(|&g| !single(g)).collect();
        let mut class_key: Vec<(usize, usize)> = Vec::new();
        let class_of: Vec<usize> = (0..n)
            .map(|g| {
                if !single(g) {
                    return usize::MAX;
                }
                let key = (p.block(g).devices[0], p.span(g) as usize);
                match class_key.iter().position(|k| *k == key) {
                    Some(c) => c,
                    None => {
                        class_key.push(key);
                        class_key.len() - 1
                    }
                }
            })
            .collect();
        let mut active = vec![Vec::new(); n + 1];
        for k in (0..n).rev() {
            let mut v = active[k + 1].clone();
            let c = class_of[order[k]];
            if c != usize::MAX && !v.contains(&c) {
                v.push(c);
            }
            active[k] = v;
        }
        let mem_devs: Vec<usize> = (0..p.ndevs())
            .filter(|&d| {
                caps[d] != UNLIMITED && p.blocks_on(d).iter().any(|&g| p.block(g).memory != 0)
            })
            .collect();
        let mut closes = vec![Vec::new(); n];
        let mut min_span = vec![vec![i64::MAX; n + 1]; p.ndevs()];
        let mut rem_work = vec![vec![0; n + 1]; p.ndevs()];
        for d in 0..p.ndevs() {
            if let Some(&g) = p.blocks_on(d).iter().max_by_key(|&&g| pos[g]) {
                closes[pos[g]].push(d);
            }
            for k in (0..n).rev() {
                let g = order[k];
                let on = single(g) && p.block(g).on(d);
                min_span[d][k] = if on {
                    min_span[d][k + 1].min(p.span(g))
                } else {
                    min_span[d][k + 1]
                };
                rem_work[d][k] = rem_work[d][k + 1] + if on { p.span(g) } else { 0 };
            }
        }
        let sources: Vec<usize> = (0..n).filter(|&g| p.preds(g).is_empty()).collect();
        let last_source = sources.iter().map(|&g| pos[g]).max().unwrap_or(0);
        let sole_source = if sources.len() == 1 {
            Some(sources[0])
        } else {
            None
        };
        let cp = p.critical_path();
        let mut within = vec![None; n];
        for &(h, r) in &opts.within_period {
            if h < n && r < n && pos[r] < pos[h] {
                within[h] = Some(r);
            }
        }
        Search {
            p,
            period,
            pu,
            n,
            order,
            capped,
            twin_prev,
            within,
            multi,
            fixed: vec![None; n],
            starts: vec![Bits::ZERO; class_key.len()],
            class_of,
            class_key,
            active,
            caps,
            conv: opts.convention,
            mem_devs,
            closes,
            min_span,
            rem_work,
            last_source,
            sole_source,
            sources,
            root: cp,
            l_cap: cp + n as i64 * period + 1,
            bounds,
            lo,
            prior,
            nm1: opts.nmicros.saturating_sub(1).min(1 << 20) as i64,
            ext: i64::MAX,
            global_nodes,
            progress,
            budget: opts.node_budget,
            deadline: opts.deadline,
            a: vec![0; n],
            assigned: vec![false; n],
            free: vec![Bits::full(pu); p.ndevs()],
            e: vec![0; n],
            l: vec![0; n],
            runs: Vec::new(),
            best_l: i64::MAX,
            best: None,
            first: None,
            collect: 0,
            pool: Vec::new(),
            nodes: 0,
            stop: false,
            cancelled: false,
        }
    }

    /// Blocks that may be limited to one period above their earliest start.
    ///
    /// Take an optimal template and walk the blocks in decision order. If block `g` starts
    /// at `est_g + P` or later, lower it by `P` when (a) `mu_g <= 0`: residues are unchanged
    /// (T2), predecessors still end in time and successors only gain slack (T1), and the steady
    /// memory changes by `mu_g <= 0` everywhere (T3); or (b) every device of `g` is unlimited;
    /// or (c) every edge into a descendant of `g` comes from `g` or another descendant: then
    /// lower `g` with all its descendants, which keeps T1 and T2, and changes the memory of
    /// each device by the sum of `mu` over an up-closed set, which is `<= 0` for a well-formed
    /// premise. None of these raises `L` or moves a block below 0, and only blocks after `g`
    /// in the order move, so the walk ends with a template inside the capped domains.
    fn capped(p: &Premise, caps: &[i64]) -> Vec<bool> {
        let n = p.nblocks();
        let mut desc = vec![vec![false; n]; n];
        for &g in p.topo_order().iter().rev() {
            desc[g][g] = true;
            for &(h, _) in p.succs(g) {
                let dh = desc[h].clone();
                for k in 0..n {
                    desc[g][k] |= dh[k];
                }
            }
        }
        (0..n)
            .map(|g| {
                let b = p.block(g);
                if b.memory <= 0 || b.devices.iter().all(|&d| caps[d] == UNLIMITED) {
                    return true;
                }
                (0..n)
                    .filter(|&h| h != g && desc[g][h])
                    .all(|h| p.preds(h).iter().all(|&(f, _)| desc[g][f]))
            })
            .collect()
    }

    fn run(mut self) -> Result<PeriodOutcome> {
        // A device whose work exceeds the period has no template.
        if self.p.work().iter().all(|&w| w <= self.period) {
            self.reserve(0);
        }
        self.global_nodes
            .fetch_add(self.nodes % 4096, Ordering::Relaxed);
        if self.cancelled {
            return Err(Error::Cancelled);
        }
        let period = self.period;
        let mk = |a: Vec<i64>| Template::new(period, a);
        Ok(PeriodOutcome {
            period,
            best: self.best.map(mk),
            first: self.first.map(mk),
            exhausted: !self.stop || self.best_l <= self.root,
            nodes: self.nodes,
        })
    }

    /// The current strict upper bound on `L`.
    #[inline]
    fn incumbent(&self) -> i64 {
        let mut b = self.best_l.min(self.l_cap);
        // Bounds from smaller periods only after the first leaf, so that the first leaf does
        // not depend on the timing of other tasks.
        if self.first.is_some() {
            b = b.min(self.ext);
        }
        b
    }

    /// The residues block `g` occupies when it starts at residue `r` (none when it is longer
    /// than the period, which the search rules out elsewhere).
    #[inline]
    fn arc(&self, g: usize, r: usize) -> Bits<K> {
        let s = self.p.span(g) as usize;
        if s <= self.pu {
            Bits::arc(r, s, self.pu)
        } else {
            Bits::ZERO
        }
    }

    fn tick(&mut self) {
        self.nodes += 1;
        // The clock and a cancel every 64 nodes: a node of a large premise (replicas of 48
        // blocks) can take a millisecond, and 4096 of them ran seconds past a time limit.
        if self.nodes.is_multiple_of(64)
            && (self.progress.cancelled() || self.deadline.is_some_and(|d| Instant::now() >= d))
        {
            self.cancelled = self.progress.cancelled();
            self.stop = true;
        }
        if self.nodes.is_multiple_of(4096) {
            let total = self.global_nodes.fetch_add(4096, Ordering::Relaxed) + 4096;
            // Progress in nodes against the budgets of the periods searched together.
            let _ = self
                .progress
                .update(total, self.budget.saturating_mul(self.bounds.len() as u64));
            if self.progress.cancelled() {
                self.cancelled = true;
                self.stop = true;
            }
            // The budget where it always was (a multiple of 4096 nodes): the same templates.
            if self.nodes >= self.budget {
                self.stop = true;
            }
            self.ext = self.external_bound();
        }
    }

    /// The best `L` of the smaller periods, shifted by the period-dominance rule.
    fn external_bound(&self) -> i64 {
        let shift = |q: i64, l: i64| {
            if l == i64::MAX {
                i64::MAX
            } else {
                l - self.nm1 * (self.period - q)
            }
        };
        let mut b = i64::MAX;
        for &(q, l) in self.prior {
            if q < self.period {
                b = b.min(shift(q, l));
            }
        }
        for (j, x) in self.bounds.iter().enumerate() {
            let q = self.lo + j as i64;
            if q < self.period {
                b = b.min(shift(q, x.load(Ordering::Relaxed)));
            }
        }
        b
    }

    /// Phase 1: a residue for every multi-device block (the most constrained ones), reserved
    /// on all its devices before any single-device block is placed. A sole source starts at 0.
    fn reserve(&mut self, k: usize) {
        self.tick();
        if self.stop {
            return;
        }
        if k == self.multi.len() {
            if self.propagate(0) {
                self.dfs(0);
            }
            return;
        }
        let p = self.p;
        let g = self.multi[k];
        let devs = &p.block(g).devices;
        let mut f = self.free[devs[0]];
        for &d in &devs[1..] {
            f = f.and(self.free[d]);
        }
        let starts = f.arc_starts(p.span(g) as usize, self.pu);
        for r in 0..self.pu {
            if self.stop {
                break;
            }
            if !starts.test(r) || (self.sole_source == Some(g) && r != 0) {
                continue;
            }
            for &d in &p.block(g).devices {
                self.free[d] = self.free[d].andnot(self.arc(g, r));
            }
            self.fixed[g] = Some(r);
            if p.block(g).devices.iter().all(|&d| self.fits(d, 0)) {
                self.reserve(k + 1);
            }
            self.fixed[g] = None;
            for &d in &p.block(g).devices {
                self.free[d] = self.free[d].or(self.arc(g, r));
            }
        }
    }

    /// Whether the single-device blocks of `d` at positions `>= from` can still fit: free arcs
    /// shorter than every remaining span are wasted, and the waste must fit in the slack.
    fn fits(&mut self, d: usize, from: usize) -> bool {
        let m = self.min_span[d][from];
        if m == i64::MAX {
            return true;
        }
        let slack = self.free[d].count() as i64 - self.rem_work[d][from];
        if slack < 0 {
            return false;
        }
        self.free[d].runs(self.pu, &mut self.runs);
        let waste: i64 = self.runs.iter().map(|&l| l as i64).filter(|&l| l < m).sum();
        waste <= slack
    }

    /// Phase 2: start times in decision order.
    fn dfs(&mut self, depth: usize) {
        self.tick();
        if self.stop {
            return;
        }
        if depth == self.n {
            self.leaf();
            return;
        }
        let p = self.p;
        let g = self.order[depth];
        let s = p.span(g);
        let tail = p.tails()[g];
        let mut est = 0;
        for &(f, c) in p.preds(g) {
            est = est.max(self.a[f] + p.span(f) + c);
        }
        // `e`/`l` were set by the parent's propagation.
        let mut lo = est.max(self.e[g]);
        if let Some(t) = self.twin_prev[g] {
            lo = lo.max(self.a[t] + 1);
        }
        let mut hi = (self.incumbent() - 1 - s - tail).min(self.l[g]);
        if let Some(r) = self.within[g] {
            hi = hi.min(self.a[r] + self.period - 1);
        }
        if self.capped[g] {
            hi = hi.min(est + self.period - 1);
        }
        if lo > hi {
            return;
        }
        let starts = match self.fixed[g] {
            Some(r) => {
                let mut b = Bits::<K>::ZERO;
                b.set(r);
                b
            }
            None => self.free[p.block(g).devices[0]].arc_starts(s as usize, self.pu),
        };
        let mut x = lo;
        while x <= hi {
            if self.stop || x + s + tail >= self.incumbent() {
                break;
            }
            let r = x.rem_euclid(self.period) as usize;
            if starts.test(r) {
                self.assign(g, x, r);
                if self.node_ok(g, depth) {
                    self.dfs(depth + 1);
                }
                self.unassign(g, r);
            }
            x += 1;
        }
    }

    fn assign(&mut self, g: usize, x: i64, r: usize) {
        self.a[g] = x;
        self.assigned[g] = true;
        if self.fixed[g].is_none() {
            for &d in &self.p.block(g).devices {
                self.free[d] = self.free[d].andnot(self.arc(g, r));
            }
        }
    }

    fn unassign(&mut self, g: usize, r: usize) {
        if self.fixed[g].is_none() {
            for &d in &self.p.block(g).devices {
                self.free[d] = self.free[d].or(self.arc(g, r));
            }
        }
        self.assigned[g] = false;
    }

    fn node_ok(&mut self, g: usize, depth: usize) -> bool {
        let p = self.p;
        // Canonical translation: once every source is placed, one of them starts at 0.
        if depth == self.last_source && self.sources.iter().all(|&s| self.a[s] > 0) {
            return false;
        }
        if !self.propagate(depth + 1) {
            return false;
        }
        if self.fixed[g].is_none() {
            let d = p.block(g).devices[0];
            if !self.fits(d, depth + 1) {
                return false;
            }
        }
        // Period-average memory: sum over blocks of -mu * e <= P * M.
        if !self.mem_devs.is_empty() {
            let inc = self.incumbent();
            for &d in &self.mem_devs {
                let mut v: i64 = 0;
                for &h in p.blocks_on(d) {
                    let mu = p.block(h).memory;
                    if mu == 0 {
                        continue;
                    }
                    let sh = p.span(h);
                    let e = if self.assigned[h] {
                        self.conv.effect_time(self.a[h], sh, mu)
                    } else if mu < 0 {
                        self.conv.effect_time(self.e[h], sh, mu)
                    } else {
                        (inc - 1 - sh - p.tails()[h]).min(self.l[h])
                    };
                    v -= mu * e;
                }
                // In 128 bits: caps up to 2^62 times the period overflow 64.
                if i128::from(v) > i128::from(self.period) * i128::from(self.caps[d]) {
                    return false;
                }
            }
        }
        // Exact steady peak of the devices that are now complete.
        for &d in &self.closes[depth] {
            if self.caps[d] == UNLIMITED {
                continue;
            }
            if device_steady_peak(p, d, self.period, &self.a, self.conv) > self.caps[d] {
                return false;
            }
        }
        true
    }

    /// Bounds the unassigned blocks (positions `>= from`) from both sides.
    ///
    /// Forward, in decision order: the earliest start after the predecessors (placed, or at
    /// their own earliest start) on a residue whose arc is still free on the block's device
    /// (or on the residue reserved for a multi-device block). Backward: the latest start that
    /// lets the block and its successors end before the incumbent, snapped down to such a
    /// residue. Free sets only shrink deeper in the tree, so both are valid bounds there; an
    /// empty interval prunes the node.
    fn propagate(&mut self, from: usize) -> bool {
        let p = self.p;
        let pu = self.pu;
        for &c in &self.active[from] {
            let (d, span) = self.class_key[c];
            self.starts[c] = self.free[d].arc_starts(span, pu);
        }
        let inc = self.incumbent();
        for k in from..self.n {
            let h = self.order[k];
            let mut est = 0;
            for &(f, c) in p.preds(h) {
                let t = if self.assigned[f] {
                    self.a[f]
                } else {
                    self.e[f]
                };
                est = est.max(t + p.span(f) + c);
            }
            if let Some(t) = self.twin_prev[h] {
                est = est.max(
                    if self.assigned[t] {
                        self.a[t]
                    } else {
                        self.e[t]
                    } + 1,
                );
            }
            let r0 = est.rem_euclid(self.period) as usize;
            let delta = match self.fixed[h] {
                Some(r) => (r + pu - r0) % pu,
                None => match self.starts[self.class_of[h]].next_set(r0, pu) {
                    Some(dl) => dl,
                    None => return false,
                },
            };
            let x = est + delta as i64;
            if x + p.span(h) + p.tails()[h] >= inc {
                return false;
            }
            self.e[h] = x;
        }
        for k in (from..self.n).rev() {
            let h = self.order[k];
            let s = p.span(h);
            let mut lst = inc - 1 - s;
            for &(g, c) in p.succs(h) {
                let t = if self.assigned[g] {
                    self.a[g]
                } else {
                    self.l[g]
                };
                lst = lst.min(t - c - s);
            }
            if let Some(r) = self.within[h] {
                if self.assigned[r] {
                    lst = lst.min(self.a[r] + self.period - 1);
                }
            }
            if lst < self.e[h] {
                return false;
            }
            let r0 = lst.rem_euclid(self.period) as usize;
            let back = match self.fixed[h] {
                Some(r) => (r0 + pu - r) % pu,
                None => self.starts[self.class_of[h]]
                    .prev_set(r0, pu)
                    .expect("the forward pass found a free residue"),
            };
            let y = lst - back as i64;
            if y < self.e[h] {
                return false;
            }
            self.l[h] = y;
        }
        true
    }

    fn leaf(&mut self) {
        let p = self.p;
        let l = (0..self.n)
            .map(|g| self.a[g] + p.span(g))
            .max()
            .unwrap_or(0);
        debug_assert!(self.a.iter().all(|&x| x >= 0));
        if self.collect > 0 {
            self.pool.push(self.a.clone());
            if self.pool.len() >= self.collect {
                self.stop = true;
            }
            return;
        }
        if self.first.is_none() {
            self.first = Some(self.a.clone());
        }
        if l < self.best_l {
            self.best_l = l;
            self.best = Some(self.a.clone());
            self.bounds[(self.period - self.lo) as usize].fetch_min(l, Ordering::Relaxed);
            if l <= self.root {
                self.stop = true;
            }
        }
    }
}
