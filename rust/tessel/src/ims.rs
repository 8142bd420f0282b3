//! Iterative modulo scheduling (Rau 1994), the heuristic fallback of spec §4.2.
//!
//! For each period from `P_LB` up: blocks are taken by decreasing height (`s + tail`) among
//! those whose predecessors are placed, and go to the earliest `x >= est` whose residues are
//! free on all their devices. When no `x` in `[est, est + P)` fits, the block takes `est`
//! and evicts the blocks it collides with (and, transitively, successors it now starts too
//! late for), within a budget of `3 n` evictions. A failed budget or a steady memory peak
//! above the caps moves to `P + 1`.

use crate::model::{MemoryConvention, Premise, UNLIMITED};
use crate::template::{steady_peak, Template};

/// The first template IMS finds at a period in `p_lo ..= p_hi`, if any.
pub fn ims(
    p: &Premise,
    memory: &[i64],
    conv: MemoryConvention,
    p_lo: i64,
    p_hi: i64,
) -> Option<Template> {
    (p_lo.max(p.period_lower_bound()).max(1)..=p_hi)
        .find_map(|period| at_period(p, memory, conv, period))
}

fn at_period(p: &Premise, memory: &[i64], conv: MemoryConvention, period: i64) -> Option<Template> {
    let n = p.nblocks();
    let pu = period as usize;
    if p.work().iter().any(|&w| w > period) {
        return None;
    }
    // occ[d][r]: block occupying residue r of device d.
    let mut occ = vec![vec![usize::MAX; pu]; p.ndevs()];
    let mut a: Vec<Option<i64>> = vec![None; n];
    let height: Vec<i64> = (0..n).map(|g| p.span(g) + p.tails()[g]).collect();
    let mut budget = 3 * n;
    // Each round takes the highest block whose predecessors are all placed.
    while let Some(g) = (0..n)
        .filter(|&g| a[g].is_none() && p.preds(g).iter().all(|&(f, _)| a[f].is_some()))
        .max_by_key(|&g| (height[g], std::cmp::Reverse(g)))
    {
        let est = p
            .preds(g)
            .iter()
            .map(|&(f, c)| a[f].unwrap_or(0) + p.span(f) + c)
            .max()
            .unwrap_or(0);
        let fits = |x: i64, occ: &Vec<Vec<usize>>| {
            p.block(g).devices.iter().all(|&d| {
                (0..p.span(g)).all(|k| occ[d][(x + k).rem_euclid(period) as usize] == usize::MAX)
            })
        };
        let x = match (est..est + period).find(|&x| fits(x, &occ)) {
            Some(x) => x,
            None => {
                if budget == 0 {
                    return None;
                }
                // Evict whatever occupies [est, est + s) on the block's devices.
                let mut evict: Vec<usize> = Vec::new();
                for &d in &p.block(g).devices {
                    for k in 0..p.span(g) {
                        let h = occ[d][(est + k).rem_euclid(period) as usize];
                        if h != usize::MAX && !evict.contains(&h) {
                            evict.push(h);
                        }
                    }
                }
                // Successors placed too early for the new position go too (transitively).
                let mut k = 0;
                while k < evict.len() {
                    let h = evict[k];
                    for &(s, _) in p.succs(h) {
                        if a[s].is_some() && !evict.contains(&s) {
                            evict.push(s);
                        }
                    }
                    k += 1;
                }
                if evict
                    .iter()
                    .any(|&h| p.preds(g).iter().any(|&(f, _)| f == h))
                {
                    return None;
                }
                budget = budget.saturating_sub(evict.len());
                for &h in &evict {
                    remove(p, &mut occ, &mut a, h, period);
                }
                est
            }
        };
        a[g] = Some(x);
        for &d in &p.block(g).devices {
            for k in 0..p.span(g) {
                occ[d][(x + k).rem_euclid(period) as usize] = g;
            }
        }
    }
    let a: Vec<i64> = a
        .into_iter()
        .map(|x| x.expect("every block placed"))
        .collect();
    let t = Template::new(period, a).normalised();
    let peaks = steady_peak(p, period, &t.starts, conv);
    if peaks
        .iter()
        .zip(memory)
        .any(|(&pk, &m)| m != UNLIMITED && pk > m)
    {
        return None;
    }
    // Evictions can leave an earlier-placed successor too early: keep only valid templates.
    t.check(p, memory, conv).ok().map(|_| t)
}

fn remove(p: &Premise, occ: &mut [Vec<usize>], a: &mut [Option<i64>], h: usize, period: i64) {
    if let Some(x) = a[h].take() {
        for &d in &p.block(h).devices {
            for k in 0..p.span(h) {
                occ[d][(x + k).rem_euclid(period) as usize] = usize::MAX;
            }
        }
    }
}
