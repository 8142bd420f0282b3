//! Tessel-style completion (spec §4.3 step 3): an optimal warm-up, the repetend repeated,
//! an optimal cool-down.
//!
//! This is how the reference composes a schedule (spec §3): a repetend is a window of `P`
//! time units in which every block runs once, block `g` for micro-batch `c_g` of the first
//! window (`c` is non-increasing along the edges); the warm-up holds the jobs `(g, j < c_g)`,
//! the cool-down the jobs after the last window; each phase is solved on its own for the
//! fewest steps and the three are concatenated. With `k = max c + 1` micro-batches touched
//! by one window, N micro-batches give `N - k + 1` windows and the makespan
//! `W + (N - k + 1) P + C`.
//!
//! Here the windows come from a template (§2): every residue `x` of `Z_P` that cuts no
//! block's arc starts a window `[x + r P, x + (r + 1) P)`, and the template's window indices
//! give the counts `c` ([`splits`]). The warm-up and the cool-down are sub-problems of the
//! SGS branch-and-bound of §4.4 ([`crate::exact`]): the warm-up starts empty; the cool-down
//! starts with every earlier job done and the memory it leaves. Both are seeded with the
//! template's own unrolled jobs, which solve them (in the unrolled template every warm-up job
//! starts before every other job, and every cool-down job after the last window), so a
//! solution always exists. The phases are then joined by their per-device orders (warm-up,
//! the windows, cool-down) and timed as soon as possible ([`assemble`]). That is never later
//! than the plain concatenation, and it keeps every device's sequence, hence its memory
//! profile: the warm-up's within the caps by its solve, the windows' equal to the unrolled
//! template's (at most its steady peak), the cool-down's within the caps by its solve.
//!
//! The sub-problems depend on the counts `c` only, so templates and cuts that share them
//! share one solve ([`best`]).

use std::collections::HashMap;
use std::time::Instant;

use maleki_common::progress::Progress;
use maleki_common::{Error, Result};
use rayon::prelude::*;

use crate::check::check;
use crate::complete::time_orders;
use crate::exact::{self, ExactOptions, ExactResult};
use crate::model::{MemoryConvention, Premise};
use crate::template::Template;

/// A template cut into repetend windows.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Split {
    /// Residue (mod P) at which every window starts; no block's arc crosses it.
    pub cut: i64,
    /// Jobs of each block in the warm-up: block `g` runs micro-batch `counts[g]` in the first
    /// window (Tessel's micro-batch index of the block in the repetend).
    pub counts: Vec<usize>,
}

impl Split {
    /// Micro-batches touched by one window (`max counts + 1`): the fewest N the split serves.
    pub fn window_micros(&self) -> usize {
        self.counts.iter().copied().max().unwrap_or(0) + 1
    }
}

/// The splits of a template, one per distinct cut, in increasing cut order. Cuts refer to
/// the normalised template (`min a = 0`). Only residues where a block starts are cuts: a
/// valid cut between two starts gives the same windows as the next start above it.
pub fn splits(p: &Premise, t: &Template) -> Vec<Split> {
    let t = t.normalised();
    let per = t.period;
    let mut res: Vec<i64> = t.starts.iter().map(|a| a.rem_euclid(per)).collect();
    res.sort_unstable();
    res.dedup();
    res.into_iter()
        .filter(|&x| {
            (0..t.starts.len()).all(|g| {
                let d = (x - t.starts[g]).rem_euclid(per);
                d == 0 || d >= p.span(g)
            })
        })
        .map(|cut| {
            let w: Vec<i64> = t.starts.iter().map(|a| (a - cut).div_euclid(per)).collect();
            let wmax = w.iter().copied().max().unwrap_or(0);
            Split {
                cut,
                counts: w.iter().map(|&x| (wmax - x) as usize).collect(),
            }
        })
        .collect()
}

/// The optimal (or best found) warm-up and cool-down of a split.
#[derive(Clone, Debug, PartialEq)]
pub struct Ramps {
    /// Starts of the jobs `(g, j < counts[g])` in an instance of `k` micro-batches, from 0.
    pub warmup: ExactResult,
    /// Starts of the jobs `(g, counts[g] < j < k)`, from 0 (the end of the last window).
    pub cooldown: ExactResult,
}

impl Ramps {
    /// `W + (N - k + 1) P + C`: the makespan of the plain concatenation.
    pub fn concatenated_makespan(&self, period: i64, k: usize, nmicros: usize) -> i64 {
        self.warmup.makespan + (nmicros as i64 - k as i64 + 1) * period + self.cooldown.makespan
    }
}

/// Solves the warm-up and cool-down of `split` of template `t` (module docs).
pub fn ramps(
    p: &Premise,
    t: &Template,
    split: &Split,
    memory: &[i64],
    opts: &ExactOptions,
    progress: &dyn Progress,
) -> Result<Option<Ramps>> {
    let n = p.nblocks();
    let t = t.normalised();
    let k = split.window_micros();
    let c = &split.counts;
    let unrolled = t.unroll(k);
    // Window index of the first window in which every block appears.
    let wmax = (t.starts[0] - split.cut).div_euclid(t.period) + c[0] as i64;
    let zeros = vec![0usize; n];
    let warm = exact::run_range(
        p,
        k,
        &zeros,
        c,
        memory,
        Some(unrolled.clone()),
        opts,
        progress,
    )?;
    let lo: Vec<usize> = c.iter().map(|&x| x + 1).collect();
    let hi = vec![k; n];
    let t_cool = split.cut + (wmax + 1) * t.period;
    let cool_inc: Vec<i64> = unrolled.iter().map(|s| s - t_cool).collect();
    let cool = exact::run_range(p, k, &lo, &hi, memory, Some(cool_inc), opts, progress)?;
    Ok(match (warm, cool) {
        (Some(warmup), Some(cooldown)) => Some(Ramps { warmup, cooldown }),
        _ => None,
    })
}

/// Lower bounds on the makespans of the warm-up and the cool-down of `split`.
pub fn ramp_lower_bounds(p: &Premise, split: &Split) -> (i64, i64) {
    let n = p.nblocks();
    let k = split.window_micros();
    let c = &split.counts;
    let lo: Vec<usize> = c.iter().map(|&x| x + 1).collect();
    (
        exact::range_lower_bound(p, k, &vec![0; n], c),
        exact::range_lower_bound(p, k, &lo, &vec![k; n]),
    )
}

/// Joins warm-up, `nmicros - k + 1` windows and cool-down by their per-device orders and
/// times them as soon as possible. None when `nmicros < k` (or the orders deadlock, which a
/// valid template and valid ramps rule out).
pub fn assemble(
    p: &Premise,
    t: &Template,
    split: &Split,
    ramps: &Ramps,
    nmicros: usize,
) -> Option<Vec<i64>> {
    assemble_until(p, t, split, ramps, nmicros, &|| false)
}

/// [`assemble`], giving up (None) when `stop()` says so (asked per device and every 65536
/// jobs timed: one assembly of 10^6 micro-batches takes seconds).
fn assemble_until(
    p: &Premise,
    t: &Template,
    split: &Split,
    ramps: &Ramps,
    nmicros: usize,
    stop: &dyn Fn() -> bool,
) -> Option<Vec<i64>> {
    let n = p.nblocks();
    let k = split.window_micros();
    if nmicros < k {
        return None;
    }
    let c = &split.counts;
    let t = t.normalised();
    let per = t.period;
    let offset = |g: usize| (t.starts[g] - split.cut).rem_euclid(per);
    let shift = nmicros - k;
    let (ws, cs) = (&ramps.warmup.starts, &ramps.cooldown.starts);
    let mut seq = Vec::with_capacity(p.ndevs());
    for d in 0..p.ndevs() {
        if stop() {
            return None;
        }
        let on = p.blocks_on(d);
        let mut v: Vec<usize> = on
            .iter()
            .flat_map(|&g| (0..c[g]).map(move |j| j * n + g))
            .collect();
        v.sort_unstable_by_key(|&x| (ws[x], x));
        let mut window: Vec<usize> = on.to_vec();
        window.sort_unstable_by_key(|&g| (offset(g), g));
        v.reserve(window.len() * (shift + 1));
        for r in 0..=shift {
            v.extend(window.iter().map(|&g| (c[g] + r) * n + g));
        }
        let mut cool: Vec<usize> = on
            .iter()
            .flat_map(|&g| (c[g] + 1..k).map(move |j| j * n + g))
            .collect();
        cool.sort_unstable_by_key(|&x| (cs[x], x));
        v.extend(cool.iter().map(|&x| x + shift * n));
        seq.push(v);
    }
    time_orders(p, nmicros, &seq, stop)
}

/// Limits of [`best`].
#[derive(Clone, Debug)]
pub struct ConcatOptions {
    /// Node budget of each warm-up and each cool-down solve.
    pub node_budget: u64,
    /// Most distinct splits (counts) solved.
    pub max_splits: usize,
    /// Most splits assembled to N micro-batches, best concatenated makespan first.
    pub assemble: usize,
    pub deadline: Option<Instant>,
}

impl Default for ConcatOptions {
    fn default() -> Self {
        ConcatOptions {
            node_budget: 1_000,
            max_splits: 12,
            assemble: 4,
            deadline: None,
        }
    }
}

/// A Tessel-style completion.
#[derive(Clone, Debug, PartialEq)]
pub struct Concatenation {
    /// Index of the template it comes from.
    pub template: usize,
    pub split: Split,
    pub starts: Vec<i64>,
    pub makespan: i64,
    /// `W + (N - k + 1) P + C`, before the as-soon-as-possible timing.
    pub concatenated: i64,
}

/// The best Tessel-style completion of any of `templates` (in order of preference: their
/// splits are taken in this order up to `max_splits` distinct counts). The `assemble` splits
/// with the shortest plain concatenations are assembled; ties go to the shorter plain
/// concatenation, then to the earlier template and cut, so the result does not depend on the
/// thread count (unless a deadline cuts a solve short). Runs rayon iterators in the caller's
/// pool.
#[allow(clippy::too_many_arguments)]
pub fn best(
    p: &Premise,
    templates: &[Template],
    nmicros: usize,
    memory: &[i64],
    conv: MemoryConvention,
    opts: &ConcatOptions,
    progress: &dyn Progress,
) -> Result<Option<Concatenation>> {
    // Every (template, split) that fits N, and the distinct counts among them.
    let mut pairs: Vec<(usize, Split, usize)> = Vec::new();
    let mut first_of: HashMap<Vec<usize>, usize> = HashMap::new();
    let mut solves: Vec<(usize, Split)> = Vec::new();
    for (i, t) in templates.iter().enumerate() {
        for s in splits(p, t) {
            if s.window_micros() > nmicros {
                continue;
            }
            let id = match first_of.get(&s.counts) {
                Some(&id) => id,
                None if solves.len() < opts.max_splits => {
                    first_of.insert(s.counts.clone(), solves.len());
                    solves.push((i, s.clone()));
                    solves.len() - 1
                }
                None => continue,
            };
            pairs.push((i, s, id));
        }
    }
    if pairs.is_empty() {
        return Ok(None);
    }
    let eo = ExactOptions {
        node_budget: opts.node_budget,
        deadline: opts.deadline,
        memo_limit: 1 << 18,
        ..Default::default()
    };
    let solved: Vec<Result<Option<Ramps>>> = solves
        .par_iter()
        .map(|(i, s)| ramps(p, &templates[*i], s, memory, &eo, progress))
        .collect();
    let solved: Vec<Option<Ramps>> = solved
        .into_iter()
        .map(|r| match r {
            Err(Error::Cancelled) => Err(Error::Cancelled),
            Err(_) => Ok(None),
            Ok(r) => Ok(r),
        })
        .collect::<Result<_>>()?;
    let mut ranked: Vec<(i64, usize)> = pairs
        .iter()
        .enumerate()
        .filter_map(|(q, (i, s, id))| {
            let r = solved[*id].as_ref()?;
            Some((
                r.concatenated_makespan(templates[*i].period, s.window_micros(), nmicros),
                q,
            ))
        })
        .collect();
    ranked.sort_unstable();
    ranked.truncate(opts.assemble.max(1));
    // Assembling and checking one takes about a second at N = 10^6: stop requests are
    // honoured before each.
    progress.check()?;
    let built: Vec<Option<Concatenation>> = ranked
        .par_iter()
        .map(|&(concatenated, q)| {
            progress.check().ok()?;
            let (i, s, id) = &pairs[q];
            let r = solved[*id].as_ref()?;
            let stop = || progress.check().is_err();
            let starts = assemble_until(p, &templates[*i], s, r, nmicros, &stop)?;
            if stop() {
                return None;
            }
            check(p, nmicros, &starts, memory, conv, true).ok()?;
            let n = p.nblocks();
            let makespan = (0..starts.len())
                .map(|x| starts[x] + p.span(x % n))
                .max()
                .unwrap_or(0);
            Some(Concatenation {
                template: *i,
                split: s.clone(),
                starts,
                makespan,
                concatenated,
            })
        })
        .collect();
    progress.check()?;
    Ok(built.into_iter().flatten().min_by_key(|c| c.makespan))
}
