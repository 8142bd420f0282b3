//! Independent oracles for the tests: a validity checker, a brute-force template search and
//! a brute-force schedule search, plus a generator of random well-formed premises.
#![allow(dead_code)]

use maleki_common::rng::{below, stream, StreamRng};
use maleki_tessel::{Block, Edge, Kind, MemoryConvention, Premise, UNLIMITED};

/// V1-V4 and the memory caps, written from the definitions in spec §1 (memory by scanning
/// every time step, not by events).
pub fn valid(
    p: &Premise,
    nm: usize,
    s: &[i64],
    caps: &[i64],
    conv: MemoryConvention,
) -> Result<(), String> {
    if caps.len() < p.ndevs() {
        return Err(format!("{} caps for {} devices", caps.len(), p.ndevs()));
    }
    let n = p.nblocks();
    assert_eq!(s.len(), n * nm);
    let at = |j: usize, g: usize| s[j * n + g];
    let end = (0..s.len())
        .map(|k| s[k] + p.span(k % n))
        .max()
        .unwrap_or(0);
    for j in 0..nm {
        for g in 0..n {
            if at(j, g) < 0 {
                return Err(format!("negative start ({g},{j})"));
            }
            for e in p.edges().iter().filter(|e| e.from == g) {
                if at(j, e.to) < at(j, g) + p.span(g) + e.lag {
                    return Err(format!("V1 ({g},{j}) -> ({},{j})", e.to));
                }
            }
            if j > 0 && at(j, g) <= at(j - 1, g) {
                return Err(format!("V4 block {g} micro-batch {j}"));
            }
        }
    }
    for (d, &cap) in caps.iter().enumerate().take(p.ndevs()) {
        let mut busy = vec![false; end.max(0) as usize];
        for g in (0..n).filter(|&g| p.block(g).devices.contains(&d)) {
            for j in 0..nm {
                for t in at(j, g)..at(j, g) + p.span(g) {
                    if busy[t as usize] {
                        return Err(format!("V2 device {d} time {t}"));
                    }
                    busy[t as usize] = true;
                }
            }
        }
        if cap == UNLIMITED {
            continue;
        }
        for t in 0..=end {
            let mut mem = 0;
            for g in (0..n).filter(|&g| p.block(g).devices.contains(&d)) {
                let mu = p.block(g).memory;
                for j in 0..nm {
                    let when = match conv {
                        MemoryConvention::AllocStartFreeEnd if mu < 0 => at(j, g) + p.span(g),
                        _ => at(j, g),
                    };
                    if when <= t {
                        mem += mu;
                    }
                }
            }
            if mem > cap {
                return Err(format!("V3 device {d} time {t}: {mem} > {cap}"));
            }
        }
    }
    Ok(())
}

pub fn makespan(p: &Premise, s: &[i64]) -> i64 {
    let n = p.nblocks();
    (0..s.len())
        .map(|k| s[k] + p.span(k % n))
        .max()
        .unwrap_or(0)
}

/// The minimum template length `L` at `period` over every template with `L <= l_max`, by
/// plain enumeration in topological order (no dominance rules); None when there is none.
pub fn brute_template(p: &Premise, period: i64, caps: &[i64], l_max: i64) -> Option<i64> {
    fn rec(
        p: &Premise,
        k: usize,
        a: &mut Vec<i64>,
        period: i64,
        caps: &[i64],
        l_max: i64,
        best: &mut Option<i64>,
    ) {
        let order = p.topo_order();
        if k == order.len() {
            if a.iter().copied().min() != Some(0) {
                return;
            }
            let t = maleki_tessel::Template::new(period, a.clone());
            if t.check(p, caps, MemoryConvention::Start).is_ok() {
                let l = t.length(p);
                if best.is_none_or(|b| l < b) {
                    *best = Some(l);
                }
            }
            return;
        }
        let g = order[k];
        let est = p
            .preds(g)
            .iter()
            .map(|&(f, c)| a[f] + p.span(f) + c)
            .max()
            .unwrap_or(0);
        for x in est..=l_max - p.span(g) - p.tails()[g] {
            // Residue overlap with placed blocks on shared devices.
            let clash = order[..k].iter().any(|&h| {
                p.block(h)
                    .devices
                    .iter()
                    .any(|d| p.block(g).devices.contains(d))
                    && (0..p.span(g))
                        .any(|u| (0..p.span(h)).any(|v| (x + u - a[h] - v).rem_euclid(period) == 0))
            });
            if clash {
                continue;
            }
            a[g] = x;
            rec(p, k + 1, a, period, caps, l_max, best);
        }
        a[g] = 0;
    }
    let mut best = None;
    let mut a = vec![0; p.nblocks()];
    rec(p, 0, &mut a, period, caps, l_max, &mut best);
    best
}

/// The minimum makespan over every dispatch order of a serial schedule generation (no
/// bounds, no dominance): the exact optimum of a tiny instance (FIFO on).
pub fn brute_schedule(p: &Premise, nm: usize, caps: &[i64]) -> Option<i64> {
    brute_range(p, nm, &vec![0; p.nblocks()], &vec![nm; p.nblocks()], caps)
}

/// [`brute_schedule`] of the jobs `(g, j)` with `lo[g] <= j < hi[g]` alone: the jobs below
/// `lo` have ended by time 0 and their memory is held (a warm-up or cool-down phase).
pub fn brute_range(
    p: &Premise,
    nm: usize,
    lo: &[usize],
    hi: &[usize],
    caps: &[i64],
) -> Option<i64> {
    struct S<'a> {
        p: &'a Premise,
        hi: &'a [usize],
        caps: &'a [i64],
        c: Vec<usize>,
        start: Vec<i64>,
        free: Vec<i64>,
        level: Vec<i64>,
        best: Option<i64>,
    }
    fn rec(s: &mut S, left: usize, mk: i64) {
        let n = s.p.nblocks();
        if left == 0 {
            if s.best.is_none_or(|b| mk < b) {
                s.best = Some(mk);
            }
            return;
        }
        for g in 0..n {
            let j = s.c[g];
            if j >= s.hi[g] || s.p.preds(g).iter().any(|&(f, _)| s.c[f] <= j) {
                continue;
            }
            let b = s.p.block(g).clone();
            if b.devices.iter().any(|&d| {
                b.memory > 0 && s.caps[d] != UNLIMITED && s.level[d] + b.memory > s.caps[d]
            }) {
                continue;
            }
            let mut t =
                s.p.preds(g)
                    .iter()
                    .map(|&(f, lag)| s.start[j * n + f] + s.p.span(f) + lag)
                    .max()
                    .unwrap_or(0);
            for &d in &b.devices {
                t = t.max(s.free[d]);
            }
            let saved: Vec<i64> = b.devices.iter().map(|&d| s.free[d]).collect();
            s.start[j * n + g] = t;
            s.c[g] += 1;
            for &d in &b.devices {
                s.free[d] = t + b.span;
                s.level[d] += b.memory;
            }
            rec(s, left - 1, mk.max(t + b.span));
            for (i, &d) in b.devices.iter().enumerate() {
                s.free[d] = saved[i];
                s.level[d] -= b.memory;
            }
            s.c[g] -= 1;
        }
    }
    let n = p.nblocks();
    let mut start = vec![0; n * nm];
    let mut level = vec![0; p.ndevs()];
    for g in 0..n {
        for j in 0..lo[g] {
            // Ended by time 0 (a predecessor's lag still counts from 0).
            start[j * n + g] = -p.span(g);
        }
        for &d in &p.block(g).devices {
            level[d] += lo[g] as i64 * p.block(g).memory;
        }
    }
    let left = (0..n).map(|g| hi[g] - lo[g]).sum();
    let mut s = S {
        p,
        hi,
        caps,
        c: lo.to_vec(),
        start,
        free: vec![0; p.ndevs()],
        level,
        best: None,
    };
    rec(&mut s, left, 0);
    s.best
}

/// A random well-formed premise: `ndevs` devices, about `nb` blocks; every allocation has a
/// matching free on the same devices among its descendants.
pub fn random_premise(seed: u64, ndevs: usize, nb: usize) -> Premise {
    let mut r: StreamRng = stream(seed, 0);
    let mut rnd = |n: u64| below(&mut r, n) as usize;
    let mut blocks: Vec<Block> = Vec::new();
    let mut edges: Vec<Edge> = Vec::new();
    let npairs = 1 + rnd(nb as u64 / 2);
    // Forward blocks first, then their frees in reverse: a V-like skeleton with random devices.
    let mut fwd = Vec::new();
    for i in 0..npairs {
        let devs = if rnd(4) == 0 && ndevs > 1 {
            (0..ndevs).collect()
        } else {
            vec![rnd(ndevs as u64)]
        };
        let span = 1 + rnd(2) as i64;
        blocks.push(Block::new(format!("F{i}"), span, devs, 1, Kind::Forward));
        fwd.push(blocks.len() - 1);
    }
    // Some zero-memory blocks.
    let extra = nb.saturating_sub(2 * npairs);
    for i in 0..extra {
        let devs = vec![rnd(ndevs as u64)];
        blocks.push(Block::new(
            format!("T{i}"),
            1 + rnd(3) as i64,
            devs,
            0,
            Kind::Other,
        ));
    }
    for (i, &f) in fwd.iter().enumerate().rev() {
        let devs = blocks[f].devices.clone();
        blocks.push(Block::new(
            format!("B{i}"),
            1 + rnd(3) as i64,
            devs,
            -1,
            Kind::Backward,
        ));
        let b = blocks.len() - 1;
        edges.push(Edge::new(f, b));
    }
    // Random extra edges forward in index order (a DAG).
    let n = blocks.len();
    for i in 0..n {
        for j in i + 1..n {
            if rnd(4) == 0 && !edges.iter().any(|e| e.from == i && e.to == j) {
                edges.push(Edge::new(i, j));
            }
        }
    }
    Premise::new(ndevs, blocks, edges).expect("the generator builds well-formed premises")
}

/// Two private rayon pools, of one and of two threads, to check that results do not depend
/// on the thread count.
pub fn pools_of_one_and_two_threads() -> [rayon::ThreadPool; 2] {
    [1, 2].map(|t| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build()
            .unwrap()
    })
}
