//! Exact schedules for small instances by serial schedule generation (spec §4.4), and the
//! same engine with part of the jobs in a fixed per-device order (the ramp search of §4.3).
//!
//! A serial schedule-generation scheme (SGS) repeatedly dispatches an eligible job (its
//! predecessors dispatched, FIFO per block, memory allowed on every device) at the earliest
//! time after its predecessors' ends and its devices' free times. Every semi-active schedule
//! arises this way, and left shifts keep per-device orders (hence memory profiles), so an
//! optimum exists among them. Redundancy is removed twice:
//!
//! * jobs are dispatched in non-decreasing start time, ties by topological rank: every
//!   semi-active schedule has exactly one such dispatch order (jobs that start together share
//!   no device and no edge, so their order changes nothing);
//! * states with the same per-block dispatched counts (a prefix per block, by FIFO) keep a
//!   Pareto front of (last dispatch, makespan so far, device free times, the ends that later
//!   jobs still wait for); a state dominated componentwise is pruned.
//!
//! The bound is `max(makespan so far, max_d [free_d + remaining W_d + min remaining tail on d],
//! max_g [earliest next start of g + remaining copies x s_g + tail_g])`.
//! Branch order: earliest start, then [`BranchOrder`] (by default the longer tail first),
//! then lower micro-batch.

use std::collections::HashMap;
use std::time::Instant;

use maleki_common::progress::Progress;
use maleki_common::{Error, Result};

use crate::model::{Kind, MemoryConvention, Premise, UNLIMITED};

/// Which eligible job an SGS search tries first among those that start at the same time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BranchOrder {
    /// The longest tail first, the critical-path priority of list scheduling. It proves the
    /// optima of spec §9 with about 10x fewer nodes than `BackwardFirst` and finds short
    /// warm-ups and cool-downs sooner.
    #[default]
    LongestTail,
    /// Backward, then weight, then other blocks (spec §4.4's order): it frees memory first.
    /// The ramp search keeps it, as it finds the shorter schedules there within its budget.
    BackwardFirst,
}

/// Limits of an SGS search.
#[derive(Clone, Debug)]
pub struct ExactOptions {
    pub node_budget: u64,
    pub deadline: Option<Instant>,
    /// Most states kept for dominance checks.
    pub memo_limit: usize,
    pub order: BranchOrder,
}

impl Default for ExactOptions {
    fn default() -> Self {
        ExactOptions {
            node_budget: 50_000_000,
            deadline: None,
            memo_limit: 4_000_000,
            order: BranchOrder::LongestTail,
        }
    }
}

/// The result of an SGS search.
#[derive(Clone, Debug, PartialEq)]
pub struct ExactResult {
    /// Row-major `nmicros x nblocks` starts of the best schedule found.
    pub starts: Vec<i64>,
    pub makespan: i64,
    /// True when the search finished: no schedule is shorter.
    pub proved_optimal: bool,
    pub nodes: u64,
}

/// Jobs whose per-device order is fixed (steady jobs of the ramp search): `seq[d]` lists the
/// job ids (`j * nblocks + g`) of device `d` in the required order.
#[derive(Clone, Debug, Default)]
pub(crate) struct Forced {
    pub fixed: Vec<bool>,
    pub seq: Vec<Vec<usize>>,
}

/// Solves the instance `(premise, nmicros, memory)` exactly (FIFO on).
///
/// `incumbent` (a valid schedule's starts) seeds the bound; the result is never worse. With
/// no schedule within the memory caps the error is `Infeasible` (when proved); `None` means the
/// budget ran out before any schedule was found.
///
/// Both memory conventions give the same dispatch-time check: the jobs of a device run one
/// after another, so when a job starts every earlier job of its device has ended (and freed).
pub fn solve(
    premise: &Premise,
    nmicros: usize,
    memory: &[i64],
    convention: MemoryConvention,
    incumbent: Option<Vec<i64>>,
    opts: &ExactOptions,
    progress: &dyn Progress,
) -> Result<Option<ExactResult>> {
    if memory.len() != premise.ndevs() {
        return Err(Error::shape("memory", premise.ndevs(), memory.len()));
    }
    if nmicros == 0 {
        return Err(Error::invalid("nmicros", "must be at least 1"));
    }
    if nmicros > u16::MAX as usize {
        return Err(Error::invalid(
            "nmicros",
            format!("at most {} for the exact solver", u16::MAX),
        ));
    }
    crate::repetend::check_memory_caps(premise, memory)?;
    run(
        premise, nmicros, memory, convention, None, incumbent, opts, progress,
    )
}

/// Runs the SGS branch-and-bound. Returns `Ok(None)` when no schedule better than the
/// incumbent (or none at all) was found; `proved_optimal` tells whether the search finished.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    premise: &Premise,
    nmicros: usize,
    memory: &[i64],
    convention: MemoryConvention,
    forced: Option<&Forced>,
    incumbent: Option<Vec<i64>>,
    opts: &ExactOptions,
    progress: &dyn Progress,
) -> Result<Option<ExactResult>> {
    let _ = convention;
    let mut s = Sgs::new(premise, nmicros, memory, forced, None, opts, progress);
    if let Some(st) = incumbent {
        if st.len() == s.njobs {
            let mk = (0..st.len())
                .map(|k| st[k] + premise.span(k % s.n))
                .max()
                .unwrap_or(0);
            s.best = mk;
            s.best_starts = Some(st);
        }
    }
    s.dfs(0);
    if s.cancelled {
        return Err(Error::Cancelled);
    }
    let proved = !s.stop;
    match s.best_starts {
        Some(starts) => Ok(Some(ExactResult {
            starts,
            makespan: s.best,
            proved_optimal: proved,
            nodes: s.nodes,
        })),
        None if proved => Err(Error::Infeasible(format!(
            "no schedule of {nmicros} micro-batches fits the memory caps {memory:?}"
        ))),
        None => Ok(None),
    }
}

/// The jobs `(g, j)` with `lo[g] <= j < hi[g]` of an instance of `nmicros` micro-batches, as a
/// sub-problem of their own (the warm-up and cool-down phases of a Tessel-style schedule):
/// every job `(g, j)` with `j < lo[g]` has ended by time 0, and the memory level of device `d`
/// at time 0 is `sum_g mu_g lo[g]` over its blocks. `lo` and `hi` must be closed under the
/// precedences (`lo[f] >= lo[g]` and `hi[f] >= hi[g]` for every edge `f -> g`).
///
/// Minimises the makespan of the sub-problem (from time 0). `incumbent` (starts of the
/// range's jobs in a row-major `nmicros x nblocks` array, other entries ignored) seeds the
/// bound. The result's starts are meaningful for the range's jobs only.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_range(
    premise: &Premise,
    nmicros: usize,
    lo: &[usize],
    hi: &[usize],
    memory: &[i64],
    incumbent: Option<Vec<i64>>,
    opts: &ExactOptions,
    progress: &dyn Progress,
) -> Result<Option<ExactResult>> {
    let n = premise.nblocks();
    debug_assert!(
        lo.len() == n && hi.len() == n && (0..n).all(|g| lo[g] <= hi[g] && hi[g] <= nmicros)
    );
    let mut s = Sgs::new(
        premise,
        nmicros,
        memory,
        None,
        Some((lo, hi)),
        opts,
        progress,
    );
    if let Some(st) = incumbent {
        if st.len() == n * nmicros {
            s.best = (0..n)
                .flat_map(|g| (lo[g]..hi[g]).map(move |j| (g, j)))
                .map(|(g, j)| st[j * n + g] + premise.span(g))
                .max()
                .unwrap_or(0);
            s.best_starts = Some(st);
        }
    }
    s.dfs(0);
    if s.cancelled {
        return Err(Error::Cancelled);
    }
    let proved = !s.stop;
    Ok(s.best_starts.map(|starts| ExactResult {
        starts,
        makespan: s.best,
        proved_optimal: proved,
        nodes: s.nodes,
    }))
}

/// The root lower bound of [`run_range`]'s search: no schedule of the range is shorter.
pub(crate) fn range_lower_bound(
    premise: &Premise,
    nmicros: usize,
    lo: &[usize],
    hi: &[usize],
) -> i64 {
    let opts = ExactOptions::default();
    let caps = vec![UNLIMITED; premise.ndevs()];
    let progress = maleki_common::progress::NoProgress;
    let mut s = Sgs::new(
        premise,
        nmicros,
        &caps,
        None,
        Some((lo, hi)),
        &opts,
        &progress,
    );
    s.bound()
}

/// The job graph of precedences (with lags), FIFO per block and forced device orders, in
/// topological order.
fn job_graph(p: &Premise, nm: usize, fx: &Forced) -> (Vec<usize>, Vec<Vec<(usize, i64)>>) {
    let n = p.nblocks();
    let nj = n * nm;
    let mut inc: Vec<Vec<(usize, i64)>> = vec![Vec::new(); nj];
    for j in 0..nm {
        for g in 0..n {
            let x = j * n + g;
            for &(f, lag) in p.preds(g) {
                inc[x].push((j * n + f, p.span(f) + lag));
            }
            if j > 0 {
                inc[x].push(((j - 1) * n + g, p.span(g)));
            }
        }
    }
    for s in &fx.seq {
        for w in s.windows(2) {
            inc[w[1]].push((w[0], p.span(w[0] % n)));
        }
    }
    let mut indeg: Vec<usize> = inc.iter().map(Vec::len).collect();
    let mut out: Vec<Vec<usize>> = vec![Vec::new(); nj];
    for (x, v) in inc.iter().enumerate() {
        for &(y, _) in v {
            out[y].push(x);
        }
    }
    let mut ready: Vec<usize> = (0..nj).filter(|&x| indeg[x] == 0).collect();
    ready.reverse();
    let mut order = Vec::with_capacity(nj);
    while let Some(x) = ready.pop() {
        order.push(x);
        for &y in &out[x] {
            indeg[y] -= 1;
            if indeg[y] == 0 {
                ready.push(y);
            }
        }
    }
    if order.len() != nj {
        // Forced orders that contradict the precedences: no bound from the graph.
        return (Vec::new(), Vec::new());
    }
    (order, inc)
}

struct Sgs<'a> {
    p: &'a Premise,
    n: usize,
    /// Jobs `(g, j)` with `j < hi[g]` are scheduled (those below the initial counts are done).
    hi: Vec<usize>,
    njobs: usize,
    caps: Vec<i64>,
    topo: Vec<usize>,
    rank: Vec<usize>,
    /// Longest path from the end of the last job of each block to the end of the range:
    /// through the successors with the same `hi` only (the premise's tails for a whole
    /// instance). A lower bound on the tail of every job of the block.
    tails: Vec<i64>,
    forced: Option<&'a Forced>,
    /// With forced jobs: all jobs in a topological order of the graph of precedences, FIFO
    /// and forced device orders, with their incoming edges `(job, weight)`.
    job_topo: Vec<usize>,
    job_in: Vec<Vec<(usize, i64)>>,
    val: Vec<i64>,
    // State.
    c: Vec<usize>,
    start: Vec<i64>,
    free: Vec<i64>,
    level: Vec<i64>,
    ptr: Vec<usize>,
    rem_work: Vec<i64>,
    last: (i64, usize),
    mk: i64,
    // Scratch.
    est: Vec<i64>,
    // Search.
    best: i64,
    best_starts: Option<Vec<i64>>,
    memo: HashMap<Vec<u16>, Vec<Vec<i64>>>,
    memo_size: usize,
    memo_limit: usize,
    order: BranchOrder,
    nodes: u64,
    budget: u64,
    deadline: Option<Instant>,
    progress: &'a dyn Progress,
    stop: bool,
    cancelled: bool,
}

impl<'a> Sgs<'a> {
    fn new(
        p: &'a Premise,
        nm: usize,
        memory: &[i64],
        forced: Option<&'a Forced>,
        range: Option<(&[usize], &[usize])>,
        opts: &ExactOptions,
        progress: &'a dyn Progress,
    ) -> Self {
        let n = p.nblocks();
        let (lo, hi) = match range {
            Some((lo, hi)) => (lo.to_vec(), hi.to_vec()),
            None => (vec![0; n], vec![nm; n]),
        };
        let (job_topo, job_in) = match forced {
            Some(fx) => job_graph(p, nm, fx),
            None => (Vec::new(), Vec::new()),
        };
        // The jobs before the range have ended by time 0: start them at -span.
        let mut start = vec![0; n * nm];
        let mut rem_work = vec![0; p.ndevs()];
        let mut level = vec![0; p.ndevs()];
        for g in 0..n {
            for j in 0..lo[g] {
                start[j * n + g] = -p.span(g);
            }
            for &d in &p.block(g).devices {
                rem_work[d] += (hi[g] - lo[g]) as i64 * p.span(g);
                level[d] += lo[g] as i64 * p.block(g).memory;
            }
        }
        let njobs = (0..n).map(|g| hi[g] - lo[g]).sum();
        let mut tails = vec![0i64; n];
        for &g in p.topo_order().iter().rev() {
            for &(h, lag) in p.succs(g) {
                if hi[h] == hi[g] {
                    tails[g] = tails[g].max(lag + p.span(h) + tails[h]);
                }
            }
        }
        debug_assert!(range.is_some() || tails == p.tails());
        Sgs {
            p,
            n,
            njobs,
            caps: memory.to_vec(),
            topo: p.topo_order().to_vec(),
            rank: p.topo_rank().to_vec(),
            tails,
            forced,
            val: vec![0; job_topo.len()],
            job_topo,
            job_in,
            c: lo,
            hi,
            start,
            free: vec![0; p.ndevs()],
            level,
            ptr: vec![0; p.ndevs()],
            rem_work,
            last: (i64::MIN, 0),
            mk: 0,
            est: vec![0; n],
            best: i64::MAX,
            best_starts: None,
            memo: HashMap::new(),
            memo_size: 0,
            memo_limit: opts.memo_limit,
            order: opts.order,
            nodes: 0,
            budget: opts.node_budget,
            deadline: opts.deadline,
            progress,
            stop: false,
            cancelled: false,
        }
    }

    #[inline]
    fn end(&self, g: usize, j: usize) -> i64 {
        self.start[j * self.n + g] + self.p.span(g)
    }

    /// The start of the next job of `g` if it is eligible now, else None.
    fn eligible(&self, g: usize) -> Option<i64> {
        let p = self.p;
        let j = self.c[g];
        if j >= self.hi[g] {
            return None;
        }
        let mut t = 0;
        for &(f, lag) in p.preds(g) {
            if self.c[f] <= j {
                return None;
            }
            t = t.max(self.end(f, j) + lag);
        }
        let b = p.block(g);
        if let Some(fx) = self.forced {
            let id = j * self.n + g;
            if fx.fixed[id]
                && !b
                    .devices
                    .iter()
                    .all(|&d| fx.seq[d].get(self.ptr[d]) == Some(&id))
            {
                return None;
            }
        }
        for &d in &b.devices {
            if b.memory > 0 && self.caps[d] != UNLIMITED && self.level[d] + b.memory > self.caps[d]
            {
                return None;
            }
            t = t.max(self.free[d]);
        }
        Some(t)
    }

    /// Lower bound on the makespan of any completion of the current state.
    fn bound(&mut self) -> i64 {
        let p = self.p;
        let mut lb = self.mk;
        let floor = self.last.0.max(0);
        for k in 0..self.n {
            let g = self.topo[k];
            let j = self.c[g];
            if j >= self.hi[g] {
                continue;
            }
            let mut e = floor;
            for &d in &p.block(g).devices {
                e = e.max(self.free[d]);
            }
            for &(f, lag) in p.preds(g) {
                let t = if self.c[f] > j {
                    self.end(f, j)
                } else {
                    self.est[f] + p.span(f)
                };
                e = e.max(t + lag);
            }
            self.est[g] = e;
            lb = lb.max(e + (self.hi[g] - j) as i64 * p.span(g) + self.tails[g]);
        }
        for d in 0..p.ndevs() {
            if self.rem_work[d] == 0 {
                continue;
            }
            let mut first = i64::MAX;
            let mut tail = i64::MAX;
            for &g in p.blocks_on(d) {
                if self.c[g] < self.hi[g] {
                    first = first.min(self.est[g]);
                    tail = tail.min(self.tails[g]);
                }
            }
            lb = lb.max(first.max(self.free[d]) + self.rem_work[d] + tail);
        }
        // With forced orders, the longest path through the remaining jobs of the graph of
        // precedences, FIFO and forced device orders: it sees the steady rate of the middle.
        for &x in &self.job_topo {
            let (j, g) = (x / self.n, x % self.n);
            if j < self.c[g] {
                self.val[x] = self.start[x];
                continue;
            }
            let mut e = floor;
            for &d in &p.block(g).devices {
                e = e.max(self.free[d]);
            }
            for &(y, w) in &self.job_in[x] {
                e = e.max(self.val[y] + w);
            }
            self.val[x] = e;
            lb = lb.max(e + p.span(g));
        }
        lb
    }

    fn tick(&mut self) {
        self.nodes += 1;
        if self.nodes >= self.budget {
            self.stop = true;
        }
        if self.nodes.is_multiple_of(4096) {
            if self.progress.update(self.nodes, self.budget).is_break() || self.progress.cancelled()
            {
                self.cancelled = true;
                self.stop = true;
            }
            if self.deadline.is_some_and(|d| Instant::now() >= d) {
                self.stop = true;
            }
        }
    }

    /// True when a state with the same counts and componentwise no-later times was explored.
    fn dominated(&mut self) -> bool {
        let p = self.p;
        let key: Vec<u16> = self.c.iter().map(|&c| c as u16).collect();
        // Every later job starts at or after the last dispatch, so earlier times are
        // equivalent to it: clamp them (this is what makes different pasts comparable).
        let t0 = self.last.0;
        let mut v = Vec::with_capacity(2 + p.ndevs() + self.n);
        v.push(t0);
        v.push(self.mk);
        v.extend(self.free.iter().map(|&f| f.max(t0)));
        for g in 0..self.n {
            for &(f, _) in p.preds(g) {
                for j in self.c[g]..self.c[f] {
                    v.push(self.end(f, j).max(t0));
                }
            }
        }
        let front = self.memo.entry(key).or_default();
        if front.iter().any(|w| w.iter().zip(&v).all(|(a, b)| a <= b)) {
            return true;
        }
        let before = front.len();
        front.retain(|w| !w.iter().zip(&v).all(|(a, b)| b <= a));
        self.memo_size -= before - front.len();
        if self.memo_size < self.memo_limit {
            front.push(v);
            self.memo_size += 1;
        }
        false
    }

    fn dfs(&mut self, done: usize) {
        self.tick();
        if self.stop {
            return;
        }
        if done == self.njobs {
            if self.mk < self.best {
                self.best = self.mk;
                self.best_starts = Some(self.start.clone());
            }
            return;
        }
        if self.bound() >= self.best {
            return;
        }
        if done > 0 && self.dominated() {
            return;
        }
        let p = self.p;
        let mut cand: Vec<(i64, i64, usize, usize)> = Vec::new();
        for g in 0..self.n {
            if let Some(t) = self.eligible(g) {
                let prio = match self.order {
                    BranchOrder::LongestTail => -self.tails[g],
                    BranchOrder::BackwardFirst => match p.block(g).kind {
                        Kind::Backward => 0,
                        Kind::Weight => 1,
                        _ => 2,
                    },
                };
                cand.push((t.max(self.last.0), prio, self.c[g], g));
            }
        }
        cand.sort_unstable();
        for (t, _, j, g) in cand {
            if self.stop {
                return;
            }
            if t + p.span(g) + self.tails[g] >= self.best {
                continue;
            }
            // Dispatch.
            let b = p.block(g);
            let id = j * self.n + g;
            let saved_free: Vec<i64> = b.devices.iter().map(|&d| self.free[d]).collect();
            let (saved_last, saved_mk) = (self.last, self.mk);
            self.start[id] = t;
            self.c[g] += 1;
            for &d in &b.devices {
                self.free[d] = t + b.span;
                self.level[d] += b.memory;
                self.rem_work[d] -= b.span;
                if self.forced.is_some_and(|fx| fx.fixed[id]) {
                    self.ptr[d] += 1;
                }
            }
            self.last = (t, self.rank[g]);
            self.mk = self.mk.max(t + b.span);
            self.dfs(done + 1);
            // Undo.
            self.mk = saved_mk;
            self.last = saved_last;
            for (k, &d) in b.devices.iter().enumerate() {
                self.free[d] = saved_free[k];
                self.level[d] -= b.memory;
                self.rem_work[d] += b.span;
                if self.forced.is_some_and(|fx| fx.fixed[id]) {
                    self.ptr[d] -= 1;
                }
            }
            self.c[g] -= 1;
        }
    }
}
