//! Schedule completion (spec §4.3): from a template to a schedule of N micro-batches.
//!
//! 1. **Unroll**: `S(g, j) = a_g - min a + j P`; valid by the unrolling theorem (§2).
//! 2. **Compaction**: visit jobs by (start, topological rank) and start each at the latest of
//!    its predecessors' ends and its devices' last ends. Per-device orders, hence memory
//!    profiles, are unchanged; no job moves later.
//! 3. **Ramp search**: an anytime SGS branch-and-bound (§4.4) over a short instance of
//!    `N_s = 2 K + m` micro-batches, `K = ceil(L / P)`, in which the steady jobs
//!    (`K <= j < N_s - K`) keep their unrolled per-device order and the warm-up and cool-down
//!    jobs are free. Its per-device orders are then *transplanted* to N micro-batches: the
//!    prefix up to the last warm-up job of each device, the unrolled steady order in the
//!    middle, and the suffix from the first cool-down job (micro-batches shifted by
//!    `N - N_s`). Memory along every device sequence is that of the short solution in the
//!    ramps and of the unrolled template in the middle, so the caps hold; the result is timed
//!    ASAP and checked before it is used.

use std::time::Instant;

use maleki_common::progress::{NoProgress, Progress};
use maleki_common::Result;

use crate::check::check;
use crate::exact::{self, BranchOrder, ExactOptions, Forced};
use crate::model::{MemoryConvention, Premise};
use crate::template::Template;

/// How a completed schedule was obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Unrolled,
    Compacted,
    RampSearch,
    /// Tessel-style: warm-up, repetend windows, cool-down ([`crate::concat`]).
    Concatenated,
    Exact,
    /// A baseline generator's schedule (named), valid within the caps and shorter than every
    /// completion of the search's templates.
    Baseline(&'static str),
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Unrolled => "unrolled",
            Method::Compacted => "compacted",
            Method::RampSearch => "ramp_search",
            Method::Concatenated => "concatenated",
            Method::Exact => "exact",
            Method::Baseline(_) => "baseline",
        }
    }
}

/// A completed schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    pub starts: Vec<i64>,
    pub makespan: i64,
    pub method: Method,
}

fn makespan(p: &Premise, starts: &[i64]) -> i64 {
    let n = p.nblocks();
    (0..starts.len())
        .map(|k| starts[k] + p.span(k % n))
        .max()
        .unwrap_or(0)
}

/// Compaction: jobs in order of (start, topological rank), each at the latest of its
/// predecessors' ends (with lags) and its devices' last ends. `starts` must be valid.
pub fn compact(p: &Premise, nmicros: usize, starts: &[i64]) -> Vec<i64> {
    let n = p.nblocks();
    let rank = p.topo_rank();
    let mut jobs: Vec<usize> = (0..n * nmicros).collect();
    jobs.sort_unstable_by_key(|&k| (starts[k], rank[k % n], k / n));
    let mut out = vec![0i64; n * nmicros];
    let mut free = vec![0i64; p.ndevs()];
    for k in jobs {
        let (j, g) = (k / n, k % n);
        let mut t = 0;
        for &(f, lag) in p.preds(g) {
            t = t.max(out[j * n + f] + p.span(f) + lag);
        }
        for &d in &p.block(g).devices {
            t = t.max(free[d]);
        }
        out[k] = t;
        for &d in &p.block(g).devices {
            free[d] = t + p.span(g);
        }
    }
    out
}

/// Times per-device job orders as soon as possible (`seq[d]` lists job ids `j * n + g`; a
/// multi-device job appears in the list of each of its devices). None when the orders
/// contradict each other or the precedences (a deadlock) or miss a job, or when `stop()`
/// (asked every 65536 jobs: a stop request during a completion of 10^6 micro-batches) says so.
pub(crate) fn time_orders(
    p: &Premise,
    nmicros: usize,
    seq: &[Vec<usize>],
    stop: &dyn Fn() -> bool,
) -> Option<Vec<i64>> {
    let n = p.nblocks();
    let nj = n * nmicros;
    let mut indeg = vec![0usize; nj];
    let mut next_on: Vec<Vec<usize>> = vec![Vec::new(); nj];
    let mut seen = vec![0usize; nj];
    for s in seq {
        for w in s.windows(2) {
            next_on[w[0]].push(w[1]);
            indeg[w[1]] += 1;
        }
        for &k in s {
            if k >= nj {
                return None;
            }
            seen[k] += 1;
        }
    }
    for k in 0..nj {
        if seen[k] != p.block(k % n).devices.len() {
            return None;
        }
        indeg[k] += p.preds(k % n).len();
    }
    let mut ready: Vec<usize> = (0..nj).filter(|&k| indeg[k] == 0).collect();
    let mut start = vec![0i64; nj];
    let mut done = 0;
    while let Some(k) = ready.pop() {
        if done & 0xffff == 0 && stop() {
            return None;
        }
        done += 1;
        let (j, g) = (k / n, k % n);
        let end = start[k] + p.span(g);
        let mut release = |h: usize, t: i64, ready: &mut Vec<usize>| {
            start[h] = start[h].max(t);
            indeg[h] -= 1;
            if indeg[h] == 0 {
                ready.push(h);
            }
        };
        for &h in &next_on[k] {
            release(h, end, &mut ready);
        }
        for &(h, lag) in p.succs(g) {
            release(j * n + h, end + lag, &mut ready);
        }
    }
    (done == nj).then_some(start)
}

/// Per-device job sequences of a schedule (by start time).
fn device_sequences(p: &Premise, nmicros: usize, starts: &[i64]) -> Vec<Vec<usize>> {
    let n = p.nblocks();
    (0..p.ndevs())
        .map(|d| {
            let mut v: Vec<usize> = p
                .blocks_on(d)
                .iter()
                .flat_map(|&g| (0..nmicros).map(move |j| j * n + g))
                .collect();
            v.sort_unstable_by_key(|&k| (starts[k], k));
            v
        })
        .collect()
}

/// The steady jobs (`lo <= j < hi`) of each device in unrolled order.
fn steady_sequences(p: &Premise, t: &Template, lo: usize, hi: usize) -> Vec<Vec<usize>> {
    let n = p.nblocks();
    let rank = p.topo_rank();
    (0..p.ndevs())
        .map(|d| {
            let mut v: Vec<usize> = p
                .blocks_on(d)
                .iter()
                .flat_map(|&g| (lo..hi).map(move |j| j * n + g))
                .collect();
            v.sort_unstable_by_key(|&k| {
                (
                    t.starts[k % n] + (k / n) as i64 * t.period,
                    rank[k % n],
                    k / n,
                )
            });
            v
        })
        .collect()
}

/// Limits of the ramp search.
#[derive(Clone, Debug)]
pub struct RampOptions {
    /// Node budget of the search of short instances (`N <= 3 K + 1`, searched whole).
    pub node_budget: u64,
    /// Node budget of the search of longer ones (on `3 K + 1` micro-batches, transplanted);
    /// 0 turns it off. It is slow to pay off: about 2 million nodes take mshape D4 M4 from
    /// 7N+11 to 7N+8.
    pub transplant_budget: u64,
    pub deadline: Option<Instant>,
}

impl Default for RampOptions {
    fn default() -> Self {
        RampOptions {
            node_budget: 20_000,
            transplant_budget: 0,
            deadline: None,
        }
    }
}

/// Completes `template` to `nmicros` micro-batches: the best of compaction and the ramp
/// search (when it finds something shorter within its budget). The result is always valid.
pub fn complete(
    p: &Premise,
    t: &Template,
    nmicros: usize,
    memory: &[i64],
    conv: MemoryConvention,
    ramp: Option<&RampOptions>,
    progress: &dyn Progress,
) -> Result<Completion> {
    // Each step takes about a second at N = 10^6: a stop request is honoured between them.
    progress.check()?;
    let unrolled = t.unroll(nmicros);
    let compacted = compact(p, nmicros, &unrolled);
    progress.check()?;
    let mut best = Completion {
        makespan: makespan(p, &compacted),
        starts: compacted,
        method: Method::Compacted,
    };
    if let Some(ro) = ramp {
        if let Some(s) = ramp_search(p, t, nmicros, memory, conv, ro, progress)? {
            let c = makespan(p, &s);
            if c < best.makespan && check(p, nmicros, &s, memory, conv, true).is_ok() {
                best = Completion {
                    starts: s,
                    makespan: c,
                    method: Method::RampSearch,
                };
            }
        }
    }
    Ok(best)
}

/// The forced per-device orders of the jobs of micro-batches `lo..hi` (template order).
fn forced_range(p: &Premise, t: &Template, nm: usize, lo: usize, hi: usize) -> Option<Forced> {
    if hi <= lo {
        return None;
    }
    let seq = steady_sequences(p, t, lo, hi);
    let mut fixed = vec![false; p.nblocks() * nm];
    for s in &seq {
        for &x in s {
            fixed[x] = true;
        }
    }
    Some(Forced { fixed, seq })
}

/// Runs the SGS with the given forced jobs; the starts of a schedule shorter than the
/// compacted unrolled one, if found.
#[allow(clippy::too_many_arguments)]
fn improve(
    p: &Premise,
    t: &Template,
    nm: usize,
    memory: &[i64],
    conv: MemoryConvention,
    forced: Option<&Forced>,
    opts: &ExactOptions,
    progress: &dyn Progress,
) -> Result<Option<Vec<i64>>> {
    let inc = compact(p, nm, &t.unroll(nm));
    let base = makespan(p, &inc);
    match exact::run(p, nm, memory, conv, forced, Some(inc), opts, progress) {
        Ok(Some(r)) if r.makespan < base => Ok(Some(r.starts)),
        Ok(_) => Ok(None),
        Err(maleki_common::Error::Cancelled) => Err(maleki_common::Error::Cancelled),
        Err(_) => Ok(None),
    }
}

/// The ramp search (see the module docs). None when it finds nothing shorter than
/// compaction or the transplant does not apply.
///
/// Short instances (`N <= 3 K + 1`) are searched whole, with the jobs of micro-batches
/// `K..N-K` in template order. Longer ones are searched on `3 K + 1` micro-batches and
/// transplanted (module docs).
pub fn ramp_search(
    p: &Premise,
    t: &Template,
    nmicros: usize,
    memory: &[i64],
    conv: MemoryConvention,
    ro: &RampOptions,
    progress: &dyn Progress,
) -> Result<Option<Vec<i64>>> {
    let n = p.nblocks();
    let l = t.length(p);
    let k = ((l + t.period - 1) / t.period).max(1) as usize;
    let opts = ExactOptions {
        node_budget: ro.node_budget,
        deadline: ro.deadline,
        memo_limit: 1 << 20,
        order: BranchOrder::BackwardFirst,
    };
    if nmicros <= 3 * k + 1 {
        if nmicros * n > 4096 {
            return Ok(None);
        }
        let forced = forced_range(p, t, nmicros, k, nmicros.saturating_sub(k));
        return improve(
            p,
            t,
            nmicros,
            memory,
            conv,
            forced.as_ref(),
            &opts,
            progress,
        );
    }
    // Both ramps at once on a short instance, then transplanted to N.
    let ns = 3 * k + 1;
    if ns * n > 4096 || ro.transplant_budget == 0 {
        return Ok(None);
    }
    let opts = ExactOptions {
        node_budget: ro.transplant_budget,
        ..opts
    };
    let forced = forced_range(p, t, ns, k, ns - k);
    let Some(small) = improve(p, t, ns, memory, conv, forced.as_ref(), &opts, progress)? else {
        return Ok(None);
    };
    Ok(transplant(p, t, k, ns, nmicros, &small))
}

/// Extends a short schedule of `ns` micro-batches (ramps free, micro-batches `k..ns-k` in
/// template order) to `nmicros`: per device, the prefix up to the last warm-up job, the
/// template order of the full middle, and the suffix from the first cool-down job with its
/// micro-batches shifted by `nmicros - ns`.
fn transplant(
    p: &Premise,
    t: &Template,
    k: usize,
    ns: usize,
    nmicros: usize,
    small: &[i64],
) -> Option<Vec<i64>> {
    let n = p.nblocks();
    let shift = nmicros - ns;
    let seq_small = device_sequences(p, ns, small);
    let steady_small = steady_sequences(p, t, k, ns - k);
    let steady_full = steady_sequences(p, t, k, nmicros - k);
    let mb = |x: usize| x / n;
    let remap = |x: usize| {
        if mb(x) >= k {
            (mb(x) + shift) * n + x % n
        } else {
            x
        }
    };
    let mut seq = Vec::with_capacity(p.ndevs());
    for d in 0..p.ndevs() {
        let s = &seq_small[d];
        let cut = s.iter().rposition(|&x| mb(x) < k).map_or(0, |i| i + 1);
        let first_cool = s.iter().position(|&x| mb(x) >= ns - k).unwrap_or(s.len());
        if cut > first_cool {
            return None;
        }
        let steady = |x: &&usize| (k..ns - k).contains(&mb(**x));
        let w = s[..cut].iter().filter(steady).count();
        let c = s[first_cool..].iter().filter(steady).count();
        let (ls, lf) = (steady_small[d].len(), steady_full[d].len());
        if w + c > ls || w > lf || c > lf || steady_small[d][..w] != steady_full[d][..w] {
            return None;
        }
        if !steady_small[d][ls - c..]
            .iter()
            .zip(&steady_full[d][lf - c..])
            .all(|(&a, &b)| remap(a) == b)
        {
            return None;
        }
        let mut v: Vec<usize> = s[..cut].to_vec();
        v.extend_from_slice(&steady_full[d][w..lf - c]);
        v.extend(s[first_cool..].iter().map(|&x| remap(x)));
        seq.push(v);
    }
    time_orders(p, nmicros, &seq, &|| false)
}

/// Completion without a ramp search and without progress (tests, quick callers).
pub fn complete_quick(
    p: &Premise,
    t: &Template,
    nmicros: usize,
    memory: &[i64],
    conv: MemoryConvention,
) -> Completion {
    complete(p, t, nmicros, memory, conv, None, &NoProgress).expect("compaction cannot fail")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::premises::{builtin, Options};
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn time_orders_gives_up_when_asked_and_not_otherwise() {
        // The compacted schedule's own device orders, timed again: the same starts (ASAP on
        // those orders), unless `stop` says to give up.
        let p = builtin("mshape", 4, &Options::default()).unwrap();
        let nm = 40_000;
        // A serial order that respects the precedences (micro-batch, then topological rank).
        let (n, rank) = (p.nblocks(), p.topo_rank());
        let serial: Vec<i64> = (0..n * nm)
            .map(|k| ((k / n) * n + rank[k % n]) as i64)
            .collect();
        let starts = compact(&p, nm, &serial);
        let seq = device_sequences(&p, nm, &starts);
        let asked = AtomicUsize::new(0);
        let again = time_orders(&p, nm, &seq, &|| {
            asked.fetch_add(1, Ordering::Relaxed);
            false
        })
        .expect("valid orders");
        assert_eq!(compact(&p, nm, &again), compact(&p, nm, &starts));
        assert!(asked.load(Ordering::Relaxed) >= p.nblocks() * nm / 65536);
        assert!(time_orders(&p, nm, &seq, &|| true).is_none());
    }
}
