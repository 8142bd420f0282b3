//! The whole search (spec §4): repetend construction, completion, candidates.
//!
//! 1. Exact repetend construction over `P* ..= P* + delta_p` ([`crate::repetend`]); for a
//!    large premise (more than 40 blocks or 16 devices) at `P*` only, with a budget of
//!    [`LARGE_NODE_BUDGET`] nodes per period and half the time left. When it finds nothing,
//!    iterative modulo scheduling ([`crate::ims`]) provides the template, and when that
//!    breaks the memory caps, one micro-batch scheduled alone by the exact solver, repeated
//!    at the smallest valid period (`alone_template`).
//! 2. Candidate templates, per period: the shortest, the first found, and up to
//!    `enumerate` more of length at most the shortest + P. They are ranked by the compacted
//!    makespan of a short instance extrapolated to N, and the best `complete_top` are
//!    completed to N micro-batches ([`crate::complete`]): compaction and the ramp search.
//!    The first `concat_splits` distinct splits of the ranked templates also get the
//!    Tessel-style completion ([`crate::concat`]: optimal warm-up, repetend windows, optimal
//!    cool-down), which wins when it is shorter.
//! 3. For small instances (`N * n <= exact_jobs`) the exact solver ([`crate::exact`]) runs
//!    last, seeded with the best schedule, within the remaining time.
//!
//! The best makespan wins; ties go to the candidate ranked first (then to the earlier one in
//! search order), so the result does not depend on the thread count unless a time limit
//! cuts a search short.
//!
//! `periodic_k = K > 1` searches K-periodic repetends: the premise is replicated K times (copy
//! `i + 1` of each block after copy `i`, i.e. FIFO between copies) and the template of the
//! replica, period `K P`, schedules K micro-batches per period. A 1-periodic schedule is
//! K-periodic too, and the 1-periodic search completes its templates better (the ramp search,
//! the Tessel-style completion and the exact solver know no FIFO between copies): it runs
//! first, on half the time limit, and the shorter of the two schedules wins (ties to the
//! K-periodic one).

use std::sync::Arc;
use std::time::Instant;

use maleki_common::progress::Progress;
use maleki_common::{Error, Result};
use rayon::prelude::*;

use crate::complete::{complete, Method, RampOptions};
use crate::concat::{self, ConcatOptions};
use crate::exact::{self, ExactOptions};
use crate::ims::ims;
use crate::model::{Block, Edge, MemoryConvention, Premise, Schedule};
use crate::repetend::{construct, enumerate, RepetendOptions};
use crate::template::Template;

/// Nodes per period of the repetend search on a large premise. Measured (2 threads): the
/// minimum-period templates of mshape / nnshape / kshape with 17 to 64 devices came within
/// 20 000 nodes (0.01-0.24 s), where the default 5 million took the whole time limit; the
/// modulo-scheduling fallback used before gave periods 3-6x the minimum on them.
pub const LARGE_NODE_BUDGET: u64 = 20_000;

/// Options of [`search`].
#[derive(Clone, Debug)]
pub struct SearchOptions {
    /// Memory cap per device ([`crate::UNLIMITED`] for none).
    pub memory: Vec<i64>,
    pub nmicros: usize,
    pub convention: MemoryConvention,
    /// Periods searched above the smallest feasible one.
    pub delta_p: i64,
    /// Micro-batches per repetend, 1 to 3.
    pub periodic_k: usize,
    /// Wall-clock limit in seconds for the whole search.
    pub time_limit: Option<f64>,
    /// Node budget of the repetend search, per period.
    pub node_budget: u64,
    /// Node budget of the ramp search of short schedules (`N <= 3 ceil(L / P) + 1`).
    pub ramp_budget: u64,
    /// Node budget of the ramp search of longer schedules (transplanted; 0: off).
    pub transplant_budget: u64,
    /// Node budget of each warm-up and each cool-down solve of the Tessel-style completion
    /// ([`crate::concat`]; 0: off).
    pub concat_budget: u64,
    /// Distinct splits (warm-up / window / cool-down divisions) of the Tessel-style
    /// completion, taken from the templates in ranked order.
    pub concat_splits: usize,
    /// Run the exact solver when `nmicros * nblocks` is at most this.
    pub exact_jobs: usize,
    /// Templates enumerated per period (lengths up to the shortest + P) as extra candidates.
    pub enumerate: usize,
    /// Candidates completed in full (compaction and ramp search) after ranking.
    pub complete_top: usize,
    /// Smallest period searched (0: from `P_LB`). Internal use: the 2-periodic candidates.
    pub min_period: i64,
}

impl SearchOptions {
    pub fn new(memory: Vec<i64>, nmicros: usize) -> Self {
        SearchOptions {
            memory,
            nmicros,
            convention: MemoryConvention::Start,
            delta_p: 3,
            periodic_k: 1,
            time_limit: None,
            node_budget: 5_000_000,
            ramp_budget: 20_000,
            transplant_budget: 0,
            concat_budget: 1_000,
            concat_splits: 12,
            exact_jobs: 72,
            enumerate: 128,
            complete_top: 2,
            min_period: 0,
        }
    }
}

/// One completed candidate template.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub period: i64,
    pub length: i64,
    pub makespan: i64,
    pub method: Method,
}

/// The result of [`search`].
#[derive(Clone, Debug)]
pub struct SearchResult {
    /// Steady period per repetend (K micro-batches when `periodic_k = K`).
    pub period: i64,
    pub periodic_k: usize,
    /// The template the schedule comes from (of the K-fold premise when K > 1).
    pub template: Template,
    /// True when the period is proved optimal: every smaller period was proved to have no
    /// template, and the search at this period finished (so the shortest template there is
    /// known). The returned template may be a longer one when it completes to a shorter
    /// schedule.
    pub proved_optimal: bool,
    /// True when the exact solver proved the schedule's makespan optimal.
    pub makespan_optimal: bool,
    pub schedule: Schedule,
    pub method: Method,
    pub candidates: Vec<Candidate>,
    pub nodes: u64,
    /// Seconds.
    pub search_time: f64,
}

/// The last-resort template of [`search`]: one micro-batch of `kp` scheduled alone within the
/// caps by the exact solver (its shortest schedule, or the best one its budget finds), repeated
/// at the smallest period, from the lower bound up to that schedule's makespan, at which the
/// template is valid. At the makespan micro-batches do not overlap at all, which is valid
/// whenever one micro-batch fits and leaves its devices' memory as it found it; shorter
/// periods overlap them as far as the shape allows.
///
/// Why: modulo scheduling ignores memory until it checks the result, and tight caps can rule
/// out every template it builds near the lower bound (two pipelines sharing devices with one
/// activation of room each, `xshape` at `memory = 1`: the repetend search's periods
/// `P* ..= P* + delta_p` hold none either).
fn alone_template(
    kp: &Premise,
    opts: &SearchOptions,
    within: &dyn Fn(&Template) -> bool,
    deadline: Option<Instant>,
    progress: &dyn Progress,
) -> Result<Option<Template>> {
    // A fallback: within the user's node budget (at most 2 million nodes) and a modest
    // dominance memo, whatever the premise's size.
    let eo = ExactOptions {
        node_budget: opts.node_budget.clamp(1, 2_000_000),
        deadline,
        memo_limit: 1 << 18,
        ..Default::default()
    };
    let r = match exact::solve(kp, 1, &opts.memory, opts.convention, None, &eo, progress) {
        Ok(Some(r)) => r,
        Ok(None) | Err(Error::Infeasible(_)) => return Ok(None),
        Err(e) => return Err(e),
    };
    let lo = kp.period_lower_bound().max(1);
    let hi = r.makespan.max(lo);
    // At most 4096 periods below the makespan are tried (spans may be large numbers), while
    // time is left; the makespan always is.
    let step = ((hi - lo) as u64).div_ceil(4096).max(1) as usize;
    let valid = |p: i64| {
        let t = Template::new(p, r.starts.clone());
        (within(&t) && t.check(kp, &opts.memory, opts.convention).is_ok()).then(|| t.normalised())
    };
    for p in (lo..hi).step_by(step) {
        progress.check()?;
        if deadline.is_some_and(|dl| Instant::now() >= dl) {
            break;
        }
        if let Some(t) = valid(p) {
            return Ok(Some(t));
        }
    }
    Ok(valid(hi))
}

/// The premise replicated `k` times with copy `i` of every block before copy `i + 1`.
pub fn replicate(p: &Premise, k: usize) -> Result<Premise> {
    let n = p.nblocks();
    let mut blocks: Vec<Block> = Vec::with_capacity(n * k);
    let mut edges: Vec<Edge> = Vec::new();
    for c in 0..k {
        for b in p.blocks() {
            let mut b = b.clone();
            if k > 1 {
                b.name = format!("{}#{c}", b.name);
            }
            blocks.push(b);
        }
        for e in p.edges() {
            edges.push(Edge::with_lag(e.from + c * n, e.to + c * n, e.lag));
        }
        if c > 0 {
            for g in 0..n {
                edges.push(Edge::new(g + (c - 1) * n, g + c * n));
            }
        }
    }
    Premise::new(p.ndevs(), blocks, edges)
}

/// Maps the starts of `ceil(N / K)` replica micro-batches back to `N` micro-batches.
fn unreplicate(n: usize, k: usize, nmicros: usize, starts: &[i64]) -> Vec<i64> {
    let mut out = Vec::with_capacity(n * nmicros);
    for j in 0..nmicros {
        let (sj, c) = (j / k, j % k);
        let row = sj * n * k + c * n;
        out.extend_from_slice(&starts[row..row + n]);
    }
    out
}

/// Searches a schedule of `opts.nmicros` micro-batches (spec §4). Runs rayon iterators in the
/// caller's pool.
pub fn search(
    premise: &Premise,
    opts: &SearchOptions,
    progress: &dyn Progress,
) -> Result<SearchResult> {
    let t0 = Instant::now();
    check_options(premise, opts)?;
    let k = opts.periodic_k;
    if k == 1 {
        return search_k(premise, opts, progress);
    }
    // Caps below what one micro-batch needs, named in the user's blocks (the replica's
    // would say "F0#0").
    crate::repetend::check_memory_caps(premise, &opts.memory)?;
    // K > 1: the 1-periodic search first, on half the time limit (it usually takes
    // milliseconds), then the K-periodic one on what is left.
    let mut o1 = opts.clone();
    o1.periodic_k = 1;
    o1.time_limit = opts.time_limit.map(|tl| 0.5 * tl);
    let r1 = match search_k(premise, &o1, progress) {
        Ok(r) => Some(r),
        Err(Error::Infeasible(_)) => None,
        Err(e) => return Err(e),
    };
    let mut ok = opts.clone();
    ok.time_limit = opts
        .time_limit
        .map(|tl| (tl - t0.elapsed().as_secs_f64()).max(1e-3));
    let rk = match search_k(premise, &ok, progress) {
        Ok(r) => r,
        // The replica search can run out of budget or time where the 1-periodic one did not.
        Err(Error::Infeasible(_)) if r1.is_some() => {
            let r1 = r1.expect("checked");
            return Ok(as_k_periodic(r1, None, k, t0));
        }
        Err(e) => return Err(e),
    };
    Ok(match r1 {
        Some(r1) if r1.schedule.makespan() < rk.schedule.makespan() => {
            as_k_periodic(r1, Some(rk), k, t0)
        }
        Some(r1) => {
            // A tie with a 1-periodic makespan the exact solver proved optimal is optimal too.
            let proved_by_r1 =
                r1.makespan_optimal && r1.schedule.makespan() == rk.schedule.makespan();
            let mut candidates = rk.candidates.clone();
            candidates.extend(k_periodic_candidates(&r1, k));
            SearchResult {
                makespan_optimal: rk.makespan_optimal || proved_by_r1,
                nodes: rk.nodes + r1.nodes,
                search_time: t0.elapsed().as_secs_f64(),
                candidates,
                ..rk
            }
        }
        None => SearchResult {
            search_time: t0.elapsed().as_secs_f64(),
            ..rk
        },
    })
}

/// The candidates of a 1-periodic result as K-periodic ones: period `K P`, and the length of
/// the template repeated K times at its period.
fn k_periodic_candidates(r1: &SearchResult, k: usize) -> impl Iterator<Item = Candidate> + '_ {
    let kf = k as i64;
    r1.candidates.iter().map(move |c| Candidate {
        period: kf * c.period,
        length: c.length + (kf - 1) * c.period,
        ..c.clone()
    })
}

/// A 1-periodic result `r1` as a K-periodic one: its template repeated K times at its period
/// (period `K P`), its schedule as it is, the candidates of both searches. The period is
/// proved minimal only where the K-periodic search `rk` proved its own, and it is `K P`.
fn as_k_periodic(
    r1: SearchResult,
    rk: Option<SearchResult>,
    k: usize,
    t0: Instant,
) -> SearchResult {
    let kf = k as i64;
    let t1 = &r1.template;
    let starts = (0..kf)
        .flat_map(|c| t1.starts.iter().map(move |a| a + c * t1.period))
        .collect();
    let template = Template::new(kf * t1.period, starts);
    let (mut candidates, proved, nodes) = match &rk {
        Some(rk) => (
            rk.candidates.clone(),
            rk.proved_optimal && rk.period == template.period,
            rk.nodes,
        ),
        None => (Vec::new(), false, 0),
    };
    candidates.extend(k_periodic_candidates(&r1, k));
    SearchResult {
        period: template.period,
        periodic_k: k,
        template,
        proved_optimal: proved,
        makespan_optimal: r1.makespan_optimal,
        schedule: r1.schedule,
        method: r1.method,
        candidates,
        nodes: nodes + r1.nodes,
        search_time: t0.elapsed().as_secs_f64(),
    }
}

/// Checks the options against the premise (errors name the option).
fn check_options(premise: &Premise, opts: &SearchOptions) -> Result<()> {
    let d = premise.ndevs();
    if opts.memory.len() != d {
        return Err(Error::shape(
            "memory",
            format!("({d},)"),
            format!("({},)", opts.memory.len()),
        ));
    }
    if opts.nmicros == 0 {
        return Err(Error::invalid("nmicros", "must be at least 1"));
    }
    if opts.nmicros > 1 << 20 {
        return Err(Error::invalid(
            "nmicros",
            format!("at most {}, got {}", 1 << 20, opts.nmicros),
        ));
    }
    if !(1..=3).contains(&opts.periodic_k) {
        return Err(Error::invalid(
            "periodic_k",
            format!("must be 1, 2 or 3, got {}", opts.periodic_k),
        ));
    }
    if let Some(tl) = opts.time_limit {
        if !(tl.is_finite() && tl > 0.0) {
            return Err(Error::invalid(
                "time_limit",
                format!("must be a positive number of seconds, got {tl}"),
            ));
        }
    }
    if let Some((i, m)) = opts.memory.iter().enumerate().find(|(_, &m)| m < 0) {
        return Err(Error::invalid(
            "memory",
            format!("the cap of device {i} is negative ({m})"),
        ));
    }
    Ok(())
}

/// [`search`] for exactly `opts.periodic_k` micro-batches per repetend (the options checked).
fn search_k(
    premise: &Premise,
    opts: &SearchOptions,
    progress: &dyn Progress,
) -> Result<SearchResult> {
    let t0 = Instant::now();
    let d = premise.ndevs();
    let deadline = opts
        .time_limit
        .map(|s| t0 + std::time::Duration::from_secs_f64(s));
    let k = opts.periodic_k;
    let kp = if k == 1 {
        premise.clone()
    } else {
        replicate(premise, k)?
    };
    let nk = opts.nmicros.div_ceil(k);
    let n = premise.nblocks();

    let mut ropts = RepetendOptions::new(opts.memory.clone());
    ropts.within_period = (1..k)
        .flat_map(|c| (0..n).map(move |g| (g + c * n, g)))
        .collect();
    ropts.convention = opts.convention;
    ropts.delta_p = opts.delta_p;
    ropts.node_budget = opts.node_budget;
    ropts.deadline = deadline;
    ropts.min_period = opts.min_period;
    ropts.nmicros = opts.nmicros.div_ceil(k);
    let is_large = |p: &Premise| p.nblocks() > 40 || d > 16;
    let large = is_large(&kp);
    let mut templates: Vec<Template> = Vec::new();
    if k > 1 {
        // The 1-periodic optimum, replicated, is a K-periodic template at K times its period:
        // a fallback when the replica search finds nothing shorter within its budget.
        let mut r1 = RepetendOptions::new(opts.memory.clone());
        r1.convention = opts.convention;
        r1.delta_p = 0;
        r1.node_budget = if is_large(premise) {
            opts.node_budget.min(LARGE_NODE_BUDGET)
        } else {
            opts.node_budget
        };
        r1.deadline = deadline;
        if let Ok(r) = construct(premise, &r1, progress) {
            if let Some(t) = r.periods.first().and_then(|o| o.best.as_ref()) {
                let starts = (0..k)
                    .flat_map(|c| t.starts.iter().map(move |a| a + c as i64 * t.period))
                    .collect();
                templates.push(Template::new(k as i64 * t.period, starts));
                // The replica search looks up to this period (where it has more freedom than
                // the replicated template), with a smaller budget per period: the periods
                // below K P* are often infeasible and slow to prove so.
                ropts.max_period = k as i64 * t.period;
                ropts.node_budget = (opts.node_budget / 25).max(1);
            }
        }
    }
    if large {
        // The minimum period only, a small budget per period, and half the time left: the
        // fallbacks below need the rest when this finds nothing.
        ropts.delta_p = 0;
        ropts.node_budget = ropts.node_budget.min(LARGE_NODE_BUDGET);
        ropts.deadline = deadline.map(|dl| {
            let now = Instant::now();
            now + dl.saturating_duration_since(now) / 2
        });
    }
    let mut proved = false;
    let mut nodes = 0;
    if ropts.max_period == 0 || ropts.max_period >= kp.period_lower_bound().max(ropts.min_period) {
        let r = match construct(&kp, &ropts, progress) {
            Ok(r) => r,
            // The replica search may fail where the replicated 1-periodic template exists.
            Err(Error::Infeasible(_)) if !templates.is_empty() => Default::default(),
            Err(e) => return Err(e),
        };
        nodes = r.nodes;
        for o in &r.periods {
            for t in [&o.best, &o.first].into_iter().flatten() {
                if !templates.contains(t) {
                    templates.push(t.clone());
                }
            }
            // Templates a little longer than the shortest often complete to shorter schedules
            // (not enumerated for large premises: too slow there).
            if let Some(l) = o.length(&kp).filter(|_| !large) {
                for t in enumerate(&kp, o.period, &ropts, l + o.period, opts.enumerate)? {
                    if !templates.contains(&t) {
                        templates.push(t);
                    }
                }
            }
        }
        proved = r.min_period_proved && r.periods.first().is_some_and(|o| o.exhausted);
    }
    if templates.is_empty() {
        crate::repetend::check_memory_caps(&kp, &opts.memory)?;
        let hi = kp.blocks().iter().map(|b| b.span).sum::<i64>()
            + kp.edges().iter().map(|e| e.lag).sum::<i64>();
        let within = |t: &Template| {
            ropts
                .within_period
                .iter()
                .all(|&(h, r)| t.starts[h] < t.starts[r] + t.period)
        };
        let t = match ims(
            &kp,
            &opts.memory,
            opts.convention,
            (kp.period_lower_bound(), hi.max(1)),
            deadline,
            progress,
        )? {
            Some(t) if within(&t) => Some(t),
            _ => alone_template(&kp, opts, &within, deadline, progress)?,
        };
        match t {
            Some(t) => templates.push(t),
            None => {
                return Err(Error::Infeasible(
                    "no periodic schedule found within the memory caps (the repetend search ran out of budget \
                     or time, and neither modulo scheduling nor one micro-batch scheduled alone by the exact \
                     solver, within the node budget and time limit, gave a template); this does not prove \
                     that no schedule exists: tessel.exact() searches every schedule of small instances"
                        .into(),
                ))
            }
        }
    }
    progress.check()?;
    // Rank the templates by the compacted makespan of a short instance extrapolated to N
    // (exact once the middle is periodic), and complete the best few in full.
    let est: Vec<i64> = templates
        .par_iter()
        .map(|t| {
            let kr = ((t.length(&kp) + t.period - 1) / t.period) as usize;
            let ns = nk.min(2 * kr + 3);
            let c = crate::complete::compact(&kp, ns, &t.unroll(ns));
            let mk = (0..c.len())
                .map(|x| c[x] + kp.span(x % kp.nblocks()))
                .max()
                .unwrap_or(0);
            mk + (nk - ns) as i64 * t.period
        })
        .collect();
    let mut order: Vec<usize> = (0..templates.len()).collect();
    order.sort_by_key(|&i| (est[i], i));
    // The Tessel-style completion takes its splits from the templates in this order.
    let concat_templates: Vec<Template> = order.iter().map(|&i| templates[i].clone()).collect();
    order.truncate(opts.complete_top.max(1));
    let templates: Vec<Template> = order.iter().map(|&i| templates[i].clone()).collect();
    // Complete every candidate; the best makespan wins, ties to the earlier candidate.
    let ramp = RampOptions {
        node_budget: opts.ramp_budget,
        transplant_budget: opts.transplant_budget,
        deadline,
    };
    let complete_one = |i: usize, t: &Template| -> Result<(Vec<i64>, i64, Method)> {
        // The ramp search runs on the best-ranked template only. It does not know FIFO
        // between replica copies, so K > 1 uses compaction.
        let ramp = if k == 1 && i == 0 { Some(&ramp) } else { None };
        let c = complete(&kp, t, nk, &opts.memory, opts.convention, ramp, progress)?;
        let starts = if k == 1 {
            c.starts
        } else {
            unreplicate(n, k, opts.nmicros, &c.starts)
        };
        let mk = (0..starts.len())
            .map(|x| starts[x] + premise.span(x % n))
            .max()
            .unwrap_or(0);
        Ok((starts, mk, c.method))
    };
    // The best-ranked template first; the others only while time is left (completing many
    // micro-batches takes O(N) time per template, which the time limit must bound too).
    let mut done = vec![complete_one(0, &templates[0])?];
    progress.check()?;
    if templates.len() > 1 && deadline.is_none_or(|dl| Instant::now() < dl) {
        let rest: Vec<Result<(Vec<i64>, i64, Method)>> = templates[1..]
            .par_iter()
            .enumerate()
            .map(|(i, t)| complete_one(i + 1, t))
            .collect();
        for r in rest {
            done.push(r?);
        }
    }
    progress.check()?;
    let mut candidates: Vec<Candidate> = templates
        .iter()
        .zip(&done)
        .map(|(t, c)| Candidate {
            period: t.period,
            length: t.length(&kp),
            makespan: c.1,
            method: c.2,
        })
        .collect();
    let best = (0..done.len())
        .min_by_key(|&i| (done[i].1, i))
        .expect("at least one template");
    let mut template = templates[best].clone();
    let (mut starts, mut mk, mut method) = done.swap_remove(best);
    // The Tessel-style completion (spec §4.3 step 3) of the ranked templates, kept when
    // shorter. Like the ramp search it does not know FIFO between replica copies: K = 1 only.
    if k == 1 && opts.concat_budget > 0 {
        let co = ConcatOptions {
            node_budget: opts.concat_budget,
            max_splits: opts.concat_splits,
            deadline,
            ..Default::default()
        };
        if let Some(c) = concat::best(
            &kp,
            &concat_templates,
            nk,
            &opts.memory,
            opts.convention,
            &co,
            progress,
        )? {
            let t = &concat_templates[c.template];
            candidates.push(Candidate {
                period: t.period,
                length: t.length(&kp),
                makespan: c.makespan,
                method: Method::Concatenated,
            });
            if c.makespan < mk {
                (template, starts, mk, method) =
                    (t.clone(), c.starts, c.makespan, Method::Concatenated);
            }
        }
    }
    progress.check()?;
    // The known schedules that fit the caps bound the result: a search that loses to one
    // (nnshape D16, cap 16, N = 32: 404 against 1F1B+'s 378) returns it instead. K > 1 gets
    // them through its 1-periodic search. Before the exact solver, which they then seed.
    // They take milliseconds up to a million jobs: past the deadline too, up to there.
    if k == 1 && (n * opts.nmicros <= 1 << 20 || deadline.is_none_or(|dl| Instant::now() < dl)) {
        let mk = (0..starts.len())
            .map(|x| starts[x] + premise.span(x % n))
            .max()
            .unwrap_or(0);
        if let Some((name, s)) = best_valid_baseline(premise, opts, mk, progress)? {
            (starts, method) = (s, Method::Baseline(name));
        }
    }
    progress.check()?;
    let mut makespan_optimal = false;
    if k == 1
        && n * opts.nmicros <= opts.exact_jobs
        && deadline.is_none_or(|dl| Instant::now() < dl)
    {
        let eo = ExactOptions {
            node_budget: 20_000_000,
            deadline,
            ..Default::default()
        };
        match exact::solve(
            premise,
            opts.nmicros,
            &opts.memory,
            opts.convention,
            Some(starts.clone()),
            &eo,
            progress,
        ) {
            Ok(Some(r)) => {
                makespan_optimal = r.proved_optimal;
                if r.makespan < mk {
                    (starts, method) = (r.starts, Method::Exact);
                }
            }
            Ok(None) => {}
            Err(Error::Cancelled) => return Err(Error::Cancelled),
            Err(e) => return Err(e),
        }
    }
    progress.check()?;
    if let Err(msg) = crate::check::check(
        premise,
        opts.nmicros,
        &starts,
        &opts.memory,
        opts.convention,
        true,
    ) {
        return Err(Error::Numerical(format!(
            "internal error: the search produced an invalid schedule ({msg})"
        )));
    }
    let mut schedule = Schedule::new(Arc::new(premise.clone()), opts.nmicros, starts)?;
    schedule.memory = opts.memory.clone();
    schedule.convention = opts.convention;
    // A baseline's schedule does not come from the template: it carries none.
    if !matches!(method, Method::Baseline(_)) {
        schedule.period = Some(template.period);
        schedule.repetend = repetend_window(premise, &schedule, &template, k);
        // A schedule's template is 1-periodic (one start per block); the K-fold one stays in
        // the result.
        schedule.template = (k == 1).then(|| template.starts.clone());
    }
    Ok(SearchResult {
        period: template.period,
        periodic_k: k,
        template,
        proved_optimal: proved,
        makespan_optimal,
        schedule,
        method,
        candidates,
        nodes,
        search_time: t0.elapsed().as_secs_f64(),
    })
}

/// The shortest baseline (of those that apply to the premise and hold its parameters once)
/// that is valid within the caps and shorter than `makespan`, with its name.
fn best_valid_baseline(
    premise: &Premise,
    opts: &SearchOptions,
    makespan: i64,
    progress: &dyn Progress,
) -> Result<Option<(&'static str, Vec<i64>)>> {
    let p = Arc::new(premise.clone());
    let mut best: Option<(&'static str, Vec<i64>, i64)> = None;
    for &name in crate::baselines::BASELINES {
        let b = match crate::baselines::baseline_with(name, p.clone(), opts.nmicros, progress) {
            Ok(b) => b,
            Err(Error::Cancelled) => return Err(Error::Cancelled),
            Err(_) => continue, // does not apply to this premise
        };
        let mk = b.schedule.makespan();
        let shorter = mk < best.as_ref().map_or(makespan, |x| x.2);
        if b.parameter_memory == 1
            && shorter
            && b.schedule.premise.nblocks() == premise.nblocks()
            && crate::check::check(
                premise,
                opts.nmicros,
                &b.schedule.starts,
                &opts.memory,
                opts.convention,
                true,
            )
            .is_ok()
        {
            best = Some((b.name, b.schedule.starts, mk));
        }
    }
    Ok(best.map(|(name, starts, _)| (name, starts)))
}

/// A window `[x, x + P)` in the middle of the schedule where every block of the template
/// appears once and the schedule repeats with period P around it; None when there is none.
fn repetend_window(p: &Premise, s: &Schedule, t: &Template, k: usize) -> Option<(i64, i64)> {
    let n = p.nblocks();
    let nm = s.nmicros;
    let per = t.period;
    // Micro-batch steps of the steady state: j -> j + k shifts every start by P.
    let periodic =
        |j: usize| j + k < nm && (0..n).all(|g| s.start(j + k, g) - s.start(j, g) == per);
    let span = t.length(&replicate(p, k).ok()?);
    let kr = ((span + per - 1) / per) as usize * k;
    let mid = nm / 2;
    let j0 = mid.saturating_sub(kr / 2).max(kr.min(nm));
    if j0 + kr + k >= nm || !(j0..j0 + kr).all(periodic) {
        return None;
    }
    // The template's first block of micro-batch j0 + kr - k starts the window.
    let ref_block = (0..t.starts.len()).min_by_key(|&g| t.starts[g])?;
    let (c, g) = (ref_block / n, ref_block % n);
    let x = s.start(j0 + kr - k + c, g);
    Some((x, x + per))
}
