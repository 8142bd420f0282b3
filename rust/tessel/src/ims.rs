//! Iterative modulo scheduling (Rau 1994), the heuristic fallback of spec §4.2.
//!
//! For each period from `P_LB` up: blocks are taken by decreasing height (`s + tail`) among
//! those whose predecessors are placed, and go to the earliest `x >= est` whose residues are
//! free on all their devices. When no `x` in `[est, est + P)` fits, the block takes `est`
//! and evicts the blocks it collides with (and, transitively, successors it now starts too
//! late for), within a budget of `3 n` evictions. A failed budget or a steady memory peak
//! above the caps moves to `P + 1`.

use std::time::Instant;

use maleki_common::{Progress, Result};

use crate::model::{MemoryConvention, Premise, UNLIMITED};
use crate::template::{steady_peak, Template};

/// The first template IMS finds at a period in `p_lo ..= p_hi`, if any: `None` also when the
/// deadline passes first; `Err(Cancelled)` on a cancel (both checked once per period).
pub fn ims(
    p: &Premise,
    memory: &[i64],
    conv: MemoryConvention,
    (p_lo, p_hi): (i64, i64),
    deadline: Option<Instant>,
    progress: &dyn Progress,
) -> Result<Option<Template>> {
    for period in p_lo.max(p.period_lower_bound()).max(1)..=p_hi {
        progress.check()?;
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
        if let Some(t) = at_period(p, memory, conv, period) {
            return Ok(Some(t));
        }
    }
    Ok(None)
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
        // The earliest x in [est, est + P) whose residues x .. x + s are free on every device
        // of g. An occupied residue x + k rules out every start in x ..= x + k (each covers
        // it), so the scan goes on from x + k + 1: O(P) steps rather than O(P s).
        let first_fit = |occ: &Vec<Vec<usize>>| -> Option<i64> {
            let mut x = est;
            'starts: while x < est + period {
                for &d in &p.block(g).devices {
                    for k in 0..p.span(g) {
                        if occ[d][(x + k).rem_euclid(period) as usize] != usize::MAX {
                            x += k + 1;
                            continue 'starts;
                        }
                    }
                }
                return Some(x);
            }
            None
        };
        let x = match first_fit(&occ) {
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
