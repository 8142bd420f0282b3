//! The simulator and evaluator (spec §7).
//!
//! [`simulate`] times per-device dispatch orders *as soon as possible*: a job starts once it
//! heads the list of every one of its devices (a multi-device job appears in each of its
//! devices' lists) and its predecessors have ended (plus the edge lag). This is a longest path
//! in the graph of precedence edges and consecutive-in-a-list edges; when that graph has a
//! cycle (inconsistent relative orders of shared jobs, or an order against the data flow) no
//! job of the cycle can ever start and [`simulate`] returns `Error::Deadlock` naming it.
//!
//! [`metrics`] evaluates any schedule: makespan, bubble ratios, peak memory under both
//! conventions, idle time, memory timelines, in-flight micro-batches, the detected steady
//! period, the critical chain and the gap to the lower bound `LB(N)`.

use std::sync::Arc;

use maleki_common::{Error, Result};

use crate::model::{memory_levels, Edge, MemoryConvention, Premise, Schedule};
use crate::validate::{job_name, Job};

/// Per-device dispatch orders: `orders[d]` lists the jobs `(j, g)` device `d` runs, in order.
pub type Orders = Vec<Vec<Job>>;

/// How communication lags are set for a simulation.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum Lags {
    /// Keep the premise's own edge lags.
    #[default]
    Premise,
    /// This lag on every edge whose endpoints have different device sets, 0 elsewhere.
    Uniform(i64),
    /// One lag per edge, in the order of `premise.edges()`.
    PerEdge(Vec<i64>),
}

/// The premise with its edge lags replaced as `lags` says (the premise itself when
/// `Lags::Premise`). Errors on a negative lag or a wrong number of lags.
pub fn with_lags(premise: &Arc<Premise>, lags: &Lags) -> Result<Arc<Premise>> {
    let new: Vec<i64> = match lags {
        Lags::Premise => return Ok(premise.clone()),
        Lags::Uniform(c) => premise
            .edges()
            .iter()
            .map(|e| {
                if premise.block(e.from).devices != premise.block(e.to).devices {
                    *c
                } else {
                    0
                }
            })
            .collect(),
        Lags::PerEdge(v) => {
            if v.len() != premise.edges().len() {
                return Err(Error::shape(
                    "lags",
                    format!("{} values (one per edge)", premise.edges().len()),
                    v.len(),
                ));
            }
            v.clone()
        }
    };
    if let Some(c) = new.iter().find(|&&c| c < 0) {
        return Err(Error::invalid(
            "lags",
            format!("lags must be >= 0, got {c}"),
        ));
    }
    let edges: Vec<Edge> = premise
        .edges()
        .iter()
        .zip(&new)
        .map(|(e, &c)| Edge::with_lag(e.from, e.to, c))
        .collect();
    Ok(Arc::new(Premise::new(
        premise.ndevs(),
        premise.blocks().to_vec(),
        edges,
    )?))
}

/// Checks that `orders` lists every job of the instance exactly once on each of its devices
/// and nothing else.
pub fn check_orders(premise: &Premise, nmicros: usize, orders: &[Vec<Job>]) -> Result<()> {
    let (n, nd) = (premise.nblocks(), premise.ndevs());
    if nmicros.saturating_mul(n) > crate::baselines::MAX_JOBS {
        return Err(Error::invalid(
            "nmicros",
            format!(
                "{nmicros} micro-batches x {n} blocks exceeds {} jobs",
                crate::baselines::MAX_JOBS
            ),
        ));
    }
    if orders.len() != nd {
        return Err(Error::shape(
            "orders",
            format!("{nd} lists (one per device)"),
            orders.len(),
        ));
    }
    let mut seen = vec![false; nmicros * n];
    for (d, list) in orders.iter().enumerate() {
        seen.iter_mut().for_each(|x| *x = false);
        for (k, &(j, g)) in list.iter().enumerate() {
            if j >= nmicros || g >= n {
                return Err(Error::invalid(
                    "orders",
                    format!("device {d}, entry {k}: job (micro-batch {j}, block {g}) is out of range for {nmicros} micro-batches and {n} blocks"),
                ));
            }
            if !premise.block(g).on(d) {
                return Err(Error::invalid(
                    "orders",
                    format!("device {d}, entry {k}: {} does not run on device {d} (its devices are {:?})", job_name(premise, (j, g)), premise.block(g).devices),
                ));
            }
            if std::mem::replace(&mut seen[j * n + g], true) {
                return Err(Error::invalid(
                    "orders",
                    format!(
                        "device {d}, entry {k}: {} appears twice",
                        job_name(premise, (j, g))
                    ),
                ));
            }
        }
        let want = nmicros * premise.blocks_on(d).len();
        if list.len() != want {
            let missing = premise
                .blocks_on(d)
                .iter()
                .flat_map(|&g| (0..nmicros).map(move |j| (j, g)))
                .find(|&(j, g)| !seen[j * n + g])
                .expect("a job is missing");
            return Err(Error::invalid(
                "orders",
                format!(
                    "device {d} lists {} jobs, expected {want}; missing e.g. {}",
                    list.len(),
                    job_name(premise, missing)
                ),
            ));
        }
    }
    Ok(())
}

/// ASAP timing of per-device orders (see the module docs). Returns a schedule with the
/// default instance parameters (no memory cap, `start` convention, FIFO on); the caller sets
/// the others. Errors: malformed orders (`InvalidArgument`/`Shape`) or a deadlock
/// (`Deadlock`, naming a cycle).
pub fn simulate(premise: Arc<Premise>, nmicros: usize, orders: &[Vec<Job>]) -> Result<Schedule> {
    check_orders(&premise, nmicros, orders)?;
    let p = &*premise;
    let n = p.nblocks();
    let total = nmicros * n;
    // Successors in device lists (one entry per list) and in-degrees.
    let mut dev_next: Vec<Vec<u32>> = vec![Vec::new(); total];
    let mut indeg: Vec<u32> = vec![0; total];
    for list in orders {
        for w in list.windows(2) {
            let (a, b) = (w[0].0 * n + w[0].1, w[1].0 * n + w[1].1);
            dev_next[a].push(b as u32);
            indeg[b] += 1;
        }
    }
    for (k, deg) in indeg.iter_mut().enumerate() {
        *deg += p.preds(k % n).len() as u32;
    }
    let mut start = vec![0i64; total];
    let mut stack: Vec<usize> = (0..total).filter(|&k| indeg[k] == 0).collect();
    let mut done = 0usize;
    while let Some(k) = stack.pop() {
        done += 1;
        let (j, g) = (k / n, k % n);
        let end = start[k] + p.span(g);
        for &(h, lag) in p.succs(g) {
            let x = j * n + h;
            start[x] = start[x].max(end + lag);
            indeg[x] -= 1;
            if indeg[x] == 0 {
                stack.push(x);
            }
        }
        for &x in &dev_next[k] {
            let x = x as usize;
            start[x] = start[x].max(end);
            indeg[x] -= 1;
            if indeg[x] == 0 {
                stack.push(x);
            }
        }
    }
    if done < total {
        return Err(Error::Deadlock(describe_cycle(p, nmicros, orders, &indeg)));
    }
    Schedule::new(premise, nmicros, start)
}

/// Finds and describes a cycle among the jobs that never became ready.
fn describe_cycle(p: &Premise, nmicros: usize, orders: &[Vec<Job>], indeg: &[u32]) -> String {
    let n = p.nblocks();
    let total = nmicros * n;
    let left = |k: usize| indeg[k] > 0;
    // Predecessors among the left jobs, with the reason of each edge.
    let mut pred: Vec<Option<(usize, Option<usize>)>> = vec![None; total];
    for (d, list) in orders.iter().enumerate() {
        for w in list.windows(2) {
            let (a, b) = (w[0].0 * n + w[0].1, w[1].0 * n + w[1].1);
            if left(a) && left(b) && pred[b].is_none() {
                pred[b] = Some((a, Some(d)));
            }
        }
    }
    for (b, slot) in pred.iter_mut().enumerate() {
        if left(b) && slot.is_none() {
            let (j, h) = (b / n, b % n);
            if let Some(&(g, _)) = p.preds(h).iter().find(|&&(g, _)| left(j * n + g)) {
                *slot = Some((j * n + g, None));
            }
        }
    }
    let Some(mut k) = (0..total).find(|&k| left(k)) else {
        return "some jobs can never start".to_string();
    };
    let mut pos = vec![usize::MAX; total];
    let mut path: Vec<usize> = Vec::new();
    while pos[k] == usize::MAX {
        pos[k] = path.len();
        path.push(k);
        match pred[k] {
            Some((q, _)) => k = q,
            None => return "some jobs can never start".to_string(),
        }
    }
    let mut cycle: Vec<usize> = path[pos[k]..].to_vec();
    cycle.reverse(); // predecessor walk -> execution direction

    // Each step with the device whose order makes it (None: a data dependency). A run of data
    // dependencies is one item ("through k data dependencies"). A long cycle (one of 8000
    // jobs was 416 kB of text) shows 8 items: first the device orders that run a job before
    // one that precedes it naturally (a later micro-batch, or a later block of the same one),
    // the likely mistake, then the cycle's first items; "..." marks what is left out.
    const SHOWN: usize = 8;
    let rank = p.topo_rank();
    let name = |k: usize| job_name(p, (k / n, k % n));
    // (item text, an inverted device order).
    let mut items: Vec<(String, bool)> = Vec::new();
    let mut w = 0;
    while w < cycle.len() {
        let (a, b) = (cycle[w], cycle[(w + 1) % cycle.len()]);
        let step_device = |b: usize| pred[b].and_then(|(_, d)| d);
        match step_device(b) {
            Some(d) => {
                let inverted = (a / n, rank[a % n]) > (b / n, rank[b % n]);
                let text = format!(
                    "{} must precede {} (device {d} runs it first)",
                    name(a),
                    name(b)
                );
                items.push((text, inverted));
                w += 1;
            }
            None => {
                let run = (w..cycle.len())
                    .take_while(|&x| step_device(cycle[(x + 1) % cycle.len()]).is_none())
                    .count();
                let end = cycle[(w + run) % cycle.len()];
                let text = if run == 1 {
                    format!("{} must precede {} (data dependency)", name(a), name(end))
                } else {
                    format!(
                        "{} must precede {} (through {run} data dependencies)",
                        name(a),
                        name(end)
                    )
                };
                items.push((text, false));
                w += run;
            }
        }
    }
    let mut keep: Vec<usize> = (0..items.len())
        .filter(|&i| items[i].1)
        .take(SHOWN)
        .collect();
    let first: Vec<usize> = (0..items.len())
        .filter(|i| !keep.contains(i))
        .take(SHOWN.saturating_sub(keep.len()))
        .collect();
    keep.extend(first);
    keep.sort_unstable();
    let mut text = Vec::new();
    for (x, &i) in keep.iter().enumerate() {
        if (x == 0 && i > 0) || (x > 0 && i > keep[x - 1] + 1) {
            text.push("...".to_string());
        }
        text.push(items[i].0.clone());
    }
    let more = match items.len() - keep.len() {
        0 => String::new(),
        m => format!(" ({m} more not shown)"),
    };
    if keep.last().is_some_and(|&i| i + 1 < items.len()) {
        text.push("...".to_string());
    }
    format!(
        "the per-device orders and the dependencies form a cycle of {} jobs: {}{more}",
        cycle.len(),
        text.join("; ")
    )
}

/// Per-device orders of a schedule: each device's jobs sorted by (start, micro-batch, block).
pub fn orders_of(s: &Schedule) -> Orders {
    let p = &*s.premise;
    (0..p.ndevs())
        .map(|d| {
            let mut v: Vec<(i64, usize, usize)> = p
                .blocks_on(d)
                .iter()
                .flat_map(|&g| (0..s.nmicros).map(move |j| (s.start(j, g), j, g)))
                .collect();
            v.sort_unstable();
            v.into_iter().map(|(_, j, g)| (j, g)).collect()
        })
        .collect()
}

/// Memory level of device `d` over time: `(times, levels)` where `levels[k]` holds on
/// `[times[k], times[k+1])`; starts with `(0, 0)` (or the first event when earlier).
pub fn memory_timeline(
    s: &Schedule,
    d: usize,
    convention: MemoryConvention,
) -> (Vec<i64>, Vec<i64>) {
    let ev = s.memory_events(d, convention);
    let t0 = ev.first().map_or(0, |e| e.0.min(0));
    let (mut times, mut levels) = (vec![t0], vec![0i64]);
    for (t, level) in memory_levels(&ev) {
        if *times.last().expect("non-empty") == t {
            *levels.last_mut().expect("non-empty") = level;
        } else {
            times.push(t);
            levels.push(level);
        }
    }
    (times, levels)
}

/// A steady period detected in the middle of a schedule: micro-batches `first..=last` are
/// translates of one another by `period` (every block shifts by the same amount).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DetectedPeriod {
    pub period: i64,
    pub first: usize,
    pub last: usize,
}

/// The longest run of consecutive micro-batches whose starts differ by one constant vector
/// `(P, ..., P)`, when it spans at least three micro-batches (two equal shifts) and covers the
/// middle micro-batch. `None` otherwise.
pub fn detect_period(s: &Schedule) -> Option<DetectedPeriod> {
    let n = s.premise.nblocks();
    let nm = s.nmicros;
    if nm < 3 {
        return None;
    }
    let shift = |j: usize| -> Option<i64> {
        let d = s.start(j + 1, 0) - s.start(j, 0);
        (1..n)
            .all(|g| s.start(j + 1, g) - s.start(j, g) == d)
            .then_some(d)
    };
    let mut best: Option<DetectedPeriod> = None;
    let mut j = 0;
    while j + 1 < nm {
        let Some(d) = shift(j) else {
            j += 1;
            continue;
        };
        let mut k = j;
        while k + 1 < nm && shift(k) == Some(d) {
            k += 1;
        }
        // Micro-batches j..=k are translates by d.
        if d > 0 && k - j >= 2 && best.is_none_or(|b| k - j > b.last - b.first) {
            best = Some(DetectedPeriod {
                period: d,
                first: j,
                last: k,
            });
        }
        j = k.max(j + 1);
    }
    let mid = (nm - 1) / 2;
    best.filter(|b| b.first <= mid && mid <= b.last)
}

/// Every metric of spec §7 for one schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct Metrics {
    pub makespan: i64,
    /// `1 - N sum_d W_d / (D C)`.
    pub bubble_ratio: f64,
    /// `1 - N W_d / C` per device.
    pub bubble_per_device: Vec<f64>,
    /// `N W_d` per device.
    pub busy: Vec<i64>,
    /// `C - N W_d` per device: the idle time inside `[0, C)`.
    pub idle: Vec<i64>,
    /// Peak memory per device under the `start` convention.
    pub peak_memory_start: Vec<i64>,
    /// Peak memory per device under the `alloc_start_free_end` convention.
    pub peak_memory_free_end: Vec<i64>,
    /// Peak memory per device under the schedule's own convention.
    pub peak_memory: Vec<i64>,
    /// The most micro-batches in flight at once per device (a micro-batch is in flight on `d`
    /// from the start of its first job on `d` to the end of its last one).
    pub inflight: Vec<i64>,
    /// The steady period detected in the middle, if any.
    pub period: Option<DetectedPeriod>,
    /// The critical chain, in time order: each job starts exactly when the previous one
    /// ends (plus lag), via a dependency or the device order, from a job at time 0 (or after
    /// an idle gap) to a job ending at `C`.
    pub critical_chain: Vec<Job>,
    /// Slack of every job for fixed per-device orders: how much it can be delayed without
    /// growing `C` (row-major `nmicros x nblocks`). Zero on the critical jobs.
    pub slack: Vec<i64>,
    /// `LB(N)` of spec §2 and the gap `C / LB(N) - 1`.
    pub lower_bound: i64,
    pub gap: f64,
}

/// Computes [`Metrics`] for `s` (which need not be valid).
pub fn metrics(s: &Schedule) -> Metrics {
    let p = &*s.premise;
    let (nm, nd) = (s.nmicros, p.ndevs());
    let c = s.makespan();
    let busy: Vec<i64> = p.work().iter().map(|w| w * nm as i64).collect();
    let idle: Vec<i64> = busy.iter().map(|b| c - b).collect();
    let per_dev = |b: i64| {
        if c > 0 {
            1.0 - b as f64 / c as f64
        } else {
            0.0
        }
    };
    let inflight = (0..nd)
        .map(|d| {
            let mut ev: Vec<(i64, i64)> = Vec::new();
            for j in 0..nm {
                let on = p.blocks_on(d);
                if on.is_empty() {
                    continue;
                }
                let a = on.iter().map(|&g| s.start(j, g)).min().expect("non-empty");
                let b = on.iter().map(|&g| s.end(j, g)).max().expect("non-empty");
                ev.push((a, 1));
                ev.push((b, -1));
            }
            // Ends before starts at equal times: [a, b) intervals.
            ev.sort_unstable();
            let mut level = 0;
            let mut best = 0;
            for (_, x) in ev {
                level += x;
                best = best.max(level);
            }
            best
        })
        .collect();
    let (slack, chain) = critical(s);
    let lb = p.makespan_lower_bound(nm);
    Metrics {
        makespan: c,
        bubble_ratio: s.bubble_ratio(),
        bubble_per_device: busy.iter().map(|&b| per_dev(b)).collect(),
        busy,
        idle,
        peak_memory_start: s.peak_memory_under(MemoryConvention::Start),
        peak_memory_free_end: s.peak_memory_under(MemoryConvention::AllocStartFreeEnd),
        peak_memory: s.peak_memory(),
        inflight,
        period: detect_period(s),
        critical_chain: chain,
        slack,
        lower_bound: lb,
        gap: if lb > 0 {
            c as f64 / lb as f64 - 1.0
        } else {
            0.0
        },
    }
}

/// Slack of each job (for the schedule's per-device orders) and one critical chain.
fn critical(s: &Schedule) -> (Vec<i64>, Vec<Job>) {
    let p = &*s.premise;
    let n = p.nblocks();
    let total = s.nmicros * n;
    if total == 0 {
        return (Vec::new(), Vec::new());
    }
    let c = s.makespan();
    let orders = orders_of(s);
    let mut dev_next: Vec<Vec<usize>> = vec![Vec::new(); total];
    let mut dev_prev: Vec<Vec<usize>> = vec![Vec::new(); total];
    for list in &orders {
        for w in list.windows(2) {
            let (a, b) = (w[0].0 * n + w[0].1, w[1].0 * n + w[1].1);
            dev_next[a].push(b);
            dev_prev[b].push(a);
        }
    }
    // Latest starts: process jobs by decreasing start (a valid reverse topological order
    // when the schedule is valid; for invalid ones the slack is only indicative).
    let mut by_start: Vec<usize> = (0..total).collect();
    by_start.sort_unstable_by_key(|&k| (std::cmp::Reverse(s.starts[k]), std::cmp::Reverse(k)));
    let mut latest = vec![i64::MAX; total];
    for &k in &by_start {
        let (j, g) = (k / n, k % n);
        let mut ls = c - p.span(g);
        for &(h, lag) in p.succs(g) {
            let x = j * n + h;
            if latest[x] != i64::MAX {
                ls = ls.min(latest[x] - lag - p.span(g));
            }
        }
        for &x in &dev_next[k] {
            if latest[x] != i64::MAX {
                ls = ls.min(latest[x] - p.span(g));
            }
        }
        latest[k] = ls;
    }
    let slack: Vec<i64> = (0..total)
        .map(|k| (latest[k] - s.starts[k]).max(0))
        .collect();
    // Walk back from a job ending at C through tight predecessors.
    let last = (0..total)
        .filter(|&k| s.starts[k] + p.span(k % n) == c)
        .min_by_key(|&k| (k % n, k / n))
        .expect("a job ends at the makespan");
    let mut chain = vec![last];
    let mut k = last;
    loop {
        let (j, g) = (k / n, k % n);
        let t = s.starts[k];
        let tight_pred = p
            .preds(g)
            .iter()
            .map(|&(q, lag)| (j * n + q, lag))
            .find(|&(x, lag)| s.starts[x] + p.span(x % n) + lag == t)
            .map(|(x, _)| x)
            .or_else(|| {
                dev_prev[k]
                    .iter()
                    .copied()
                    .find(|&x| s.starts[x] + p.span(x % n) == t)
            });
        match tight_pred {
            Some(x) if t > 0 && chain.len() <= total => {
                chain.push(x);
                k = x;
            }
            _ => break,
        }
    }
    chain.reverse();
    (slack, chain.into_iter().map(|k| (k / n, k % n)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::vshape;
    use crate::model::{Block, Kind};

    /// GPipe orders on the V: all forwards then all backwards, per device.
    fn gpipe(d: usize, nm: usize) -> Orders {
        (0..d)
            .map(|k| {
                let (f, b) = (k, 2 * d - 1 - k);
                (0..nm)
                    .map(|j| (j, f))
                    .chain((0..nm).map(|j| (j, b)))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn asap_timing_matches_closed_form() {
        for d in 1..5 {
            for nm in 1..6 {
                let s = simulate(vshape(d), nm, &gpipe(d, nm)).unwrap();
                assert_eq!(s.makespan(), ((nm + d - 1) * 4) as i64, "D={d} N={nm}");
                let m = metrics(&s);
                assert_eq!(m.makespan, m.lower_bound);
                assert_eq!(m.peak_memory_start[0], nm as i64);
                assert!(crate::validate::validate(&s, 10).is_valid());
                assert_eq!(orders_of(&s), gpipe(d, nm));
                // The chain ends at C and is tight.
                let last = *m.critical_chain.last().unwrap();
                assert_eq!(s.end(last.0, last.1), m.makespan);
                assert_eq!(s.start(m.critical_chain[0].0, m.critical_chain[0].1), 0);
                for &(j, g) in &m.critical_chain {
                    assert_eq!(m.slack[j * 2 * d + g], 0);
                }
            }
        }
    }

    #[test]
    fn deadlock_names_a_cycle() {
        let p = vshape(2);
        // Device 1 runs B1 of micro-batch 0 before F1 of micro-batch 0.
        let orders = vec![vec![(0, 0), (0, 3)], vec![(0, 2), (0, 1)]];
        let e = simulate(p.clone(), 1, &orders).unwrap_err();
        assert!(matches!(e, Error::Deadlock(_)), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("F1") && msg.contains("B1"), "{msg}");
        // Malformed orders are argument errors.
        assert!(matches!(
            simulate(p.clone(), 1, &[vec![(0, 0)], vec![]]).unwrap_err(),
            Error::InvalidArgument { .. }
        ));
        assert!(simulate(
            p.clone(),
            1,
            &[vec![(0, 0), (0, 0), (0, 3)], vec![(0, 1), (0, 2)]]
        )
        .is_err());
        assert!(simulate(p.clone(), 1, &[vec![(0, 1), (0, 3)], vec![(0, 0), (0, 2)]]).is_err());
        assert!(simulate(p, 1, &[vec![(0, 0), (0, 3)]]).is_err());
    }

    #[test]
    fn multi_device_jobs_need_consistent_orders() {
        // Two all-device blocks A -> B? No: two independent all-device blocks X and Y.
        let blocks = vec![
            Block::new("X", 2, vec![0, 1], 0, Kind::Other),
            Block::new("Y", 1, vec![0, 1], 0, Kind::Other),
        ];
        let p = Arc::new(Premise::new(2, blocks, vec![]).unwrap());
        let ok = vec![vec![(0, 0), (0, 1)], vec![(0, 0), (0, 1)]];
        let s = simulate(p.clone(), 1, &ok).unwrap();
        assert_eq!(s.starts, vec![0, 2]);
        let bad = vec![vec![(0, 0), (0, 1)], vec![(0, 1), (0, 0)]];
        let e = simulate(p, 1, &bad).unwrap_err().to_string();
        assert!(e.contains("cycle of 2 jobs"), "{e}");
    }

    #[test]
    fn lags_delay_cross_device_edges() {
        let p = vshape(2);
        let q = with_lags(&p, &Lags::Uniform(2)).unwrap();
        // F0 -> F1 -> B1 -> B0: edges 0->1 (cross), 1->2 (same device 1), 2->3 (cross).
        assert_eq!(
            q.edges().iter().map(|e| e.lag).collect::<Vec<_>>(),
            vec![2, 0, 2]
        );
        let s = simulate(q, 1, &gpipe(2, 1)).unwrap();
        assert_eq!(s.starts, vec![0, 3, 4, 9]);
        assert!(with_lags(&p, &Lags::PerEdge(vec![1])).is_err());
        assert!(with_lags(&p, &Lags::Uniform(-1)).is_err());
    }

    #[test]
    fn period_detection() {
        let p = vshape(4);
        let t = crate::template::Template::new(4, vec![0, 1, 2, 3, 4, 7, 10, 13]);
        let s = Schedule::new(p.clone(), 10, t.unroll(10)).unwrap();
        assert_eq!(
            detect_period(&s),
            Some(DetectedPeriod {
                period: 4,
                first: 0,
                last: 9
            })
        );
        let s = simulate(p, 10, &gpipe(4, 10)).unwrap();
        // GPipe: forward rows shift by 1, backward rows by 3: not periodic.
        assert_eq!(detect_period(&s), None);
    }

    #[test]
    fn memory_timeline_steps() {
        let p = vshape(1);
        let s = Schedule::new(p, 2, vec![0, 2, 1, 5]).unwrap();
        assert_eq!(
            memory_timeline(&s, 0, MemoryConvention::Start),
            (vec![0, 1, 2, 5], vec![1, 2, 1, 0])
        );
        assert_eq!(
            memory_timeline(&s, 0, MemoryConvention::AllocStartFreeEnd),
            (vec![0, 1, 5, 8], vec![1, 2, 1, 0])
        );
    }
}
