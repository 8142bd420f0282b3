//! Baseline schedule generators (spec §6).
//!
//! Every generator emits per-device dispatch orders; [`crate::simulate::simulate`] times them
//! as soon as possible. The generators:
//!
//! | name | premise | orders |
//! |---|---|---|
//! | `gpipe` | any | per device: every forward job by (micro-batch, topological rank), then every backward job |
//! | `1f1b` | any | stage pipelines: Megatron's warm-up `min(S-s-1, N)`, alternate F/B, cool-down. Otherwise a list-scheduling greedy with backward priority and an in-flight cap `D-d` per device |
//! | `1f1b+` | pipeline + all-device blocks | 1F1B on the single-device blocks (nnScaler's step grid); each all-device block is a synchronous step before the micro-batch's next pipeline forward or after its pipeline backward |
//! | `chimera` | V pipeline or two mirrored pipelines | down and up pipelines (even micro-batches down, odd ones up), each 1F1B with cap `D/2`; parameters are held twice |
//! | `interleaved_1f1b` | `interleaved(D, v)` | Megatron's virtual-stage 1F1B, `N` a multiple of `D` |
//! | `zb_h1`, `zb_h2` | `zb_v` (B/W split) | Qi et al.'s handcrafted zero-bubble schedules: step x runs `F_x`, `B_{x-k(p-1-i)}`, `W_{x-k(p-1)}` with k = 1, 2 |
//! | `inference_pipe` | forward-only | micro-batch j enters stage d at `(j + d) f` |

use std::sync::Arc;

use maleki_common::progress::{NoProgress, Progress};
use maleki_common::{Error, Result};

use crate::model::{Block, Edge, Kind, Premise, Schedule};
use crate::simulate::{simulate, Orders};

/// The generator names (aliases: `1f1b_plus`, `interleaved`, `inference`, dashes for
/// underscores).
pub const BASELINES: &[&str] = &[
    "gpipe",
    "1f1b",
    "1f1b+",
    "chimera",
    "interleaved_1f1b",
    "zb_h1",
    "zb_h2",
    "inference_pipe",
];

/// Largest accepted `nmicros * nblocks` (keeps a typo from allocating gigabytes).
pub const MAX_JOBS: usize = 1 << 24;

/// A generated baseline.
#[derive(Clone, Debug)]
pub struct Baseline {
    /// The canonical generator name.
    pub name: &'static str,
    /// The ASAP-timed schedule. For Chimera its premise is the bidirectional form (two
    /// mirrored pipelines; each row of `starts` holds one down and one up micro-batch).
    pub schedule: Schedule,
    /// The per-device orders the schedule was timed from.
    pub orders: Orders,
    /// Copies of the model parameters each device holds (2 for Chimera, else 1).
    pub parameter_memory: i64,
}

/// Canonical name of a baseline, or an error listing the valid ones.
pub fn canonical(name: &str) -> Result<&'static str> {
    let s = name.trim().to_ascii_lowercase().replace('-', "_");
    Ok(match s.as_str() {
        "gpipe" => "gpipe",
        "1f1b" | "one_f_one_b" | "pipedream_flush" => "1f1b",
        "1f1b+" | "1f1b_plus" | "1f1bplus" => "1f1b+",
        "chimera" | "chimera_direct" => "chimera",
        "interleaved_1f1b" | "interleaved" | "1f1b_interleaved" => "interleaved_1f1b",
        "zb_h1" | "zbh1" | "zb1p" => "zb_h1",
        "zb_h2" | "zbh2" | "zb2p" => "zb_h2",
        "inference_pipe" | "inference" | "infer_pipe" => "inference_pipe",
        _ => {
            return Err(Error::invalid(
                "name",
                format!(
                    "unknown baseline {name:?}; the baselines are {}",
                    BASELINES.join(", ")
                ),
            ))
        }
    })
}

/// Generates baseline `name` for `nmicros` micro-batches of `premise` and times it.
pub fn baseline(name: &str, premise: Arc<Premise>, nmicros: usize) -> Result<Baseline> {
    baseline_with(name, premise, nmicros, &NoProgress)
}

/// [`baseline`], stopping with `Cancelled` when `progress` asks (the list-scheduling greedy
/// checks every 1024 decisions; at the largest sizes it runs for seconds).
pub fn baseline_with(
    name: &str,
    premise: Arc<Premise>,
    nmicros: usize,
    progress: &dyn Progress,
) -> Result<Baseline> {
    let name = canonical(name)?;
    if nmicros == 0 {
        return Err(Error::invalid("nmicros", "must be at least 1"));
    }
    if nmicros.saturating_mul(premise.nblocks()) > MAX_JOBS {
        return Err(Error::invalid(
            "nmicros",
            format!(
                "{nmicros} micro-batches x {} blocks exceeds {MAX_JOBS} jobs",
                premise.nblocks()
            ),
        ));
    }
    let (premise, nm, orders, params) = match name {
        "gpipe" => (
            premise.clone(),
            nmicros,
            gpipe(&premise, nmicros, progress)?,
            1,
        ),
        "1f1b" => (
            premise.clone(),
            nmicros,
            one_f_one_b(&premise, nmicros, progress)?,
            1,
        ),
        "1f1b+" => (
            premise.clone(),
            nmicros,
            one_f_one_b_plus(&premise, nmicros, progress)?,
            1,
        ),
        "chimera" => {
            let (q, nm, o) = chimera(&premise, nmicros)?;
            (q, nm, o, 2)
        }
        "interleaved_1f1b" => (
            premise.clone(),
            nmicros,
            interleaved_1f1b(&premise, nmicros)?,
            1,
        ),
        "zb_h1" => (
            premise.clone(),
            nmicros,
            zero_bubble(&premise, nmicros, 1)?,
            1,
        ),
        "zb_h2" => (
            premise.clone(),
            nmicros,
            zero_bubble(&premise, nmicros, 2)?,
            1,
        ),
        "inference_pipe" => (
            premise.clone(),
            nmicros,
            inference_pipe(&premise, nmicros)?,
            1,
        ),
        _ => unreachable!("canonical names only"),
    };
    progress.check()?;
    let schedule = simulate(premise, nm, &orders)?;
    progress.check()?;
    Ok(Baseline {
        name,
        schedule,
        orders,
        parameter_memory: params,
    })
}

// ---------------------------------------------------------------------------------------
// Structure of a premise.

/// One stage of a pipeline premise: its device and its forward, backward and weight blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stage {
    pub device: usize,
    pub forward: usize,
    pub backward: Option<usize>,
    pub weight: Option<usize>,
}

/// Reachability bit sets: `reach[g]` holds every block reachable from `g` (itself included).
fn reachability(p: &Premise) -> Vec<Vec<u64>> {
    let n = p.nblocks();
    let words = n.div_ceil(64);
    let mut reach = vec![vec![0u64; words]; n];
    for &g in p.topo_order().iter().rev() {
        let mut r = vec![0u64; words];
        r[g / 64] |= 1 << (g % 64);
        for &(h, _) in p.succs(g) {
            for (a, b) in r.iter_mut().zip(&reach[h]) {
                *a |= b;
            }
        }
        reach[g] = r;
    }
    reach
}

fn reaches(reach: &[Vec<u64>], g: usize, h: usize) -> bool {
    reach[g][h / 64] >> (h % 64) & 1 == 1
}

/// The stages of a pipeline premise, restricted to the blocks in `subset`.
///
/// The single-device forward blocks, in topological order, must form a chain (each reaches
/// the next); the single-device backward blocks, if any, one per stage in reverse order on the
/// same devices, also a chain after the last forward; weight blocks, if any, one per stage,
/// each right after its stage's backward on the same device. Multi-device blocks are allowed
/// only with `allow_multi` (1F1B+). `None` when the premise is not of this form.
pub fn pipeline_stages_in(p: &Premise, subset: &[bool], allow_multi: bool) -> Option<Vec<Stage>> {
    let reach = reachability(p);
    let (mut fwd, mut bwd, mut wgt) = (Vec::new(), Vec::new(), Vec::new());
    for &g in p.topo_order() {
        if !subset[g] {
            continue;
        }
        let b = p.block(g);
        if b.devices.len() > 1 {
            if !allow_multi {
                return None;
            }
            continue;
        }
        match b.kind {
            Kind::Forward => fwd.push(g),
            Kind::Backward => bwd.push(g),
            Kind::Weight => wgt.push(g),
            Kind::Other => return None,
        }
    }
    let s = fwd.len();
    if s == 0 || fwd.windows(2).any(|w| !reaches(&reach, w[0], w[1])) {
        return None;
    }
    let dev = |g: usize| p.block(g).devices[0];
    let mut stages: Vec<Stage> = fwd
        .iter()
        .map(|&g| Stage {
            device: dev(g),
            forward: g,
            backward: None,
            weight: None,
        })
        .collect();
    if !bwd.is_empty() {
        if bwd.len() != s
            || !reaches(&reach, fwd[s - 1], bwd[0])
            || bwd.windows(2).any(|w| !reaches(&reach, w[0], w[1]))
        {
            return None;
        }
        for (k, &g) in bwd.iter().enumerate() {
            let st = &mut stages[s - 1 - k];
            if dev(g) != st.device {
                return None;
            }
            st.backward = Some(g);
        }
    }
    if !wgt.is_empty() {
        if wgt.len() != s || bwd.is_empty() {
            return None;
        }
        for &w in &wgt {
            let &(b, _) = p
                .preds(w)
                .iter()
                .find(|&&(b, _)| p.block(b).kind == Kind::Backward)?;
            let st = stages.iter_mut().find(|st| st.backward == Some(b))?;
            if st.weight.is_some() || dev(w) != st.device {
                return None;
            }
            st.weight = Some(w);
        }
    }
    Some(stages)
}

/// [`pipeline_stages_in`] over every block.
pub fn pipeline_stages(p: &Premise, allow_multi: bool) -> Option<Vec<Stage>> {
    pipeline_stages_in(p, &vec![true; p.nblocks()], allow_multi)
}

/// True for blocks of the backward phase: backward or weight kind, or after one.
fn backward_phase(p: &Premise) -> Vec<bool> {
    let mut ph = vec![false; p.nblocks()];
    for &g in p.topo_order() {
        ph[g] = matches!(p.block(g).kind, Kind::Backward | Kind::Weight)
            || p.preds(g).iter().any(|&(q, _)| ph[q]);
    }
    ph
}

/// Per-device orders sorted by a global key (consistent across devices by construction).
fn orders_by_key<K: Ord>(p: &Premise, nm: usize, key: impl Fn(usize, usize) -> K) -> Orders {
    (0..p.ndevs())
        .map(|d| {
            let mut v: Vec<(K, usize, usize)> = p
                .blocks_on(d)
                .iter()
                .flat_map(|&g| (0..nm).map(move |j| (j, g)))
                .map(|(j, g)| (key(j, g), j, g))
                .collect();
            v.sort_by(|a, b| a.0.cmp(&b.0).then((a.1, a.2).cmp(&(b.1, b.2))));
            v.into_iter().map(|(_, j, g)| (j, g)).collect()
        })
        .collect()
}

/// Per-device orders from starts (ties by micro-batch, then block), leaving out `skip` blocks.
fn orders_from_starts(p: &Premise, nm: usize, starts: &[i64], skip: &[bool]) -> Orders {
    let n = p.nblocks();
    orders_by_key(p, nm, |j, g| {
        (if skip[g] { i64::MAX } else { starts[j * n + g] }, j, g)
    })
}

// ---------------------------------------------------------------------------------------
// Generators.

/// GPipe: every device runs all its forward-phase jobs, then all its backward-phase jobs, each
/// in micro-batch order. On a pipeline this is the textbook order; when a device runs several
/// forward blocks (xshape, kshape, wave...), the order among them comes from the list-scheduling
/// greedy with that phase barrier (readiness decides, so independent chains interleave).
pub fn gpipe(p: &Premise, nm: usize, progress: &dyn Progress) -> Result<Orders> {
    let ph = backward_phase(p);
    let rank = p.topo_rank();
    let simple = (0..p.ndevs()).all(|d| {
        let on = p.blocks_on(d);
        on.iter().filter(|&&g| !ph[g]).count() <= 1 && on.iter().filter(|&&g| ph[g]).count() <= 1
    });
    if simple {
        return Ok(orders_by_key(p, nm, |j, g| (ph[g], j, rank[g])));
    }
    let skip = vec![false; p.nblocks()];
    let mut g = Greedy::new(p, nm, vec![usize::MAX; p.ndevs()], skip.clone(), progress);
    g.phase_barrier = true;
    Ok(match g.run()? {
        Some(starts) => orders_from_starts(p, nm, &starts, &skip),
        None => orders_by_key(p, nm, |j, g| (ph[g], j, rank[g])),
    })
}

/// The in-flight caps of the general 1F1B: `min(2 ceil(L_d / P_LB), D)` per device, where
/// `L_d` is how long one micro-batch holds memory on `d` when run alone (from the earliest
/// allocating to the latest freeing single-device block, by their `head`). `ceil(L_d / P_LB)`
/// micro-batches exactly cover that residence at the bottleneck period (on a V pipeline it is
/// `D - d`, the textbook count); the greedy is no perfect packer, so it gets twice that, but
/// never more than the `D` that 1F1B holds on its first stage. (The spec's literal `D - d` is
/// 3x slower on xshape and wave, whose last device starts a chain; measured, see the report.)
/// Devices without activation memory are not capped.
pub fn inflight_caps(p: &Premise) -> Vec<usize> {
    let per = p.period_lower_bound().max(1);
    (0..p.ndevs())
        .map(|d| {
            let single = |g: &&usize| p.block(**g).devices.len() == 1;
            let first = p
                .blocks_on(d)
                .iter()
                .filter(single)
                .filter(|&&g| p.block(g).memory > 0)
                .map(|&g| p.heads()[g])
                .min();
            let last = p
                .blocks_on(d)
                .iter()
                .filter(single)
                .filter(|&&g| p.block(g).memory < 0)
                .map(|&g| p.heads()[g])
                .max();
            let nd = p.ndevs();
            match (first, last) {
                (Some(a), Some(b)) if b > a => {
                    (2 * ((b - a + per - 1) / per).max(1) as usize).min(nd)
                }
                (Some(_), Some(_)) => 2.min(nd),
                _ => usize::MAX,
            }
        })
        .collect()
}

/// Inference pipelining: per device, jobs by (micro-batch, rank). Needs a forward-only premise.
pub fn inference_pipe(p: &Premise, nm: usize) -> Result<Orders> {
    let ph = backward_phase(p);
    if let Some(g) = (0..p.nblocks()).find(|&g| ph[g]) {
        return Err(Error::invalid(
            "premise",
            format!(
                "inference_pipe needs a forward-only premise, but block {} is a backward block \
                 (build the inference form, e.g. premise(..., train=False))",
                p.describe(g)
            ),
        ));
    }
    let rank = p.topo_rank();
    Ok(orders_by_key(p, nm, |j, g| (j, rank[g])))
}

/// Whether the stages sit one per device on distinct devices.
fn one_stage_per_device(stages: &[Stage]) -> bool {
    let mut devs: Vec<usize> = stages.iter().map(|s| s.device).collect();
    devs.sort_unstable();
    devs.windows(2).all(|w| w[0] != w[1])
}

/// Megatron's 1F1B on a stage pipeline (one stage per device): stage s runs
/// `min(S-s-1, N)` warm-up forwards, alternates forward and backward (a backward is followed
/// by its weight block, if split), then cools down.
fn textbook_1f1b(p: &Premise, nm: usize, stages: &[Stage]) -> Orders {
    let ns = stages.len();
    let mut orders: Orders = vec![Vec::new(); p.ndevs()];
    for (s, st) in stages.iter().enumerate() {
        let o = &mut orders[st.device];
        let Some(b) = st.backward else {
            o.extend((0..nm).map(|j| (j, st.forward)));
            continue;
        };
        let bw = |o: &mut Vec<(usize, usize)>, j: usize| {
            o.push((j, b));
            if let Some(w) = st.weight {
                o.push((j, w));
            }
        };
        let warm = (ns - s - 1).min(nm);
        o.extend((0..warm).map(|j| (j, st.forward)));
        for i in 0..nm - warm {
            o.push((warm + i, st.forward));
            bw(o, i);
        }
        for j in nm - warm..nm {
            bw(o, j);
        }
    }
    orders
}

/// 1F1B: textbook on stage pipelines with one stage per device, the greedy otherwise.
pub fn one_f_one_b(p: &Premise, nm: usize, progress: &dyn Progress) -> Result<Orders> {
    if let Some(stages) = pipeline_stages(p, false).filter(|s| one_stage_per_device(s)) {
        return Ok(textbook_1f1b(p, nm, &stages));
    }
    one_f_one_b_greedy(p, nm, progress)
}

/// The general 1F1B: list scheduling with backward priority and the in-flight caps of
/// [`inflight_caps`] (`D - d` on a V pipeline).
pub fn one_f_one_b_greedy(p: &Premise, nm: usize, progress: &dyn Progress) -> Result<Orders> {
    one_f_one_b_with_caps(p, nm, inflight_caps(p), progress)
}

/// The list-scheduling 1F1B with explicit per-device in-flight caps.
pub fn one_f_one_b_with_caps(
    p: &Premise,
    nm: usize,
    caps: Vec<usize>,
    progress: &dyn Progress,
) -> Result<Orders> {
    match Greedy::new(p, nm, caps, vec![false; p.nblocks()], progress).run()? {
        Some(starts) => Ok(orders_from_starts(
            p,
            nm,
            &starts,
            &vec![false; p.nblocks()],
        )),
        // Never expected (the greedy always progresses); GPipe is a safe fallback.
        None => gpipe(p, nm, progress),
    }
}

/// 1F1B+ (nnScaler): 1F1B on the single-device blocks; each multi-device block becomes a
/// synchronous step placed just before the micro-batch's next pipeline job (forward blocks)
/// or right after its previous pipeline job (backward blocks).
pub fn one_f_one_b_plus(p: &Premise, nm: usize, progress: &dyn Progress) -> Result<Orders> {
    let n = p.nblocks();
    let multi: Vec<bool> = (0..n).map(|g| p.block(g).devices.len() > 1).collect();
    if multi.iter().all(|&m| !m) {
        return one_f_one_b(p, nm, progress);
    }
    if multi.iter().all(|&m| m) {
        return Err(Error::invalid(
            "premise",
            "1f1b+ needs single-device pipeline blocks; every block here spans several devices",
        ));
    }
    // (start, end) of each single-device job on a common time axis.
    let mut t0 = vec![0i64; nm * n];
    let mut t1 = vec![0i64; nm * n];
    match pipeline_stages(p, true).filter(|s| one_stage_per_device(s)) {
        Some(stages) => {
            // nnScaler's grid: stage s runs F(j) at step s + 2j and B(j) at step 2j + 2S - 1 - s.
            // Each step spans two time units here, so that a split backward fits B then W.
            let ns = stages.len() as i64;
            for (s, st) in stages.iter().enumerate() {
                let s = s as i64;
                for j in 0..nm {
                    let ji = j as i64;
                    let f = j * n + st.forward;
                    t0[f] = 2 * (s + 2 * ji);
                    t1[f] = t0[f] + 2;
                    let step = 2 * ji + 2 * ns - 1 - s;
                    match (st.backward, st.weight) {
                        (Some(b), Some(w)) => {
                            (t0[j * n + b], t1[j * n + b]) = (2 * step, 2 * step + 1);
                            (t0[j * n + w], t1[j * n + w]) = (2 * step + 1, 2 * step + 2);
                        }
                        (Some(b), None) => {
                            (t0[j * n + b], t1[j * n + b]) = (2 * step, 2 * step + 2)
                        }
                        _ => {}
                    }
                }
            }
        }
        None => {
            let caps = inflight_caps(p);
            let starts = Greedy::new(p, nm, caps, multi.clone(), progress)
                .run()?
                .ok_or_else(greedy_stalled)?;
            for k in 0..nm * n {
                t0[k] = starts[k];
                t1[k] = starts[k] + if multi[k % n] { 0 } else { p.span(k % n) };
            }
        }
    }
    // Anchor times of the multi-device jobs.
    let reach = reachability(p);
    let ph = backward_phase(p);
    let rank = p.topo_rank();
    let mut anchor = vec![0i64; nm * n];
    for j in 0..nm {
        for &v in p.topo_order() {
            if !multi[v] {
                continue;
            }
            let desc = (0..n)
                .filter(|&w| !multi[w] && w != v && reaches(&reach, v, w))
                .map(|w| t0[j * n + w])
                .min();
            let anc = (0..n)
                .filter(|&u| !multi[u] && u != v && reaches(&reach, u, v))
                .map(|u| t1[j * n + u])
                .max();
            let mut a = if !ph[v] { desc.or(anc) } else { anc.or(desc) }.unwrap_or(0);
            // Monotone along edges so that orders never contradict the data flow.
            for &(q, _) in p.preds(v) {
                a = a.max(if multi[q] {
                    anchor[j * n + q]
                } else {
                    t1[j * n + q]
                });
            }
            anchor[j * n + v] = a;
        }
    }
    Ok(orders_by_key(p, nm, |j, g| {
        if multi[g] {
            (anchor[j * n + g], 0, rank[g], j)
        } else {
            (t0[j * n + g], 1, 0, 0)
        }
    }))
}

/// Interleaved 1F1B (Megatron virtual stages) on a pipeline whose stage k sits on device
/// `k mod D` (the `interleaved(D, v)` premise), for `N` a multiple of `D`.
pub fn interleaved_1f1b(p: &Premise, nm: usize) -> Result<Orders> {
    let nd = p.ndevs();
    let stages = pipeline_stages(p, false)
        .filter(|st| st.len() % nd == 0 && st.iter().enumerate().all(|(k, s)| s.device == k % nd))
        .ok_or_else(|| {
            Error::invalid(
                "premise",
                "interleaved_1f1b needs the interleaved(D, v) premise: a pipeline whose stage k runs on device k mod D",
            )
        })?;
    let v = stages.len() / nd;
    if stages
        .iter()
        .any(|s| s.backward.is_none() || s.weight.is_some())
    {
        return Err(Error::invalid(
            "premise",
            "interleaved_1f1b needs a training premise with whole backward blocks",
        ));
    }
    if v == 1 {
        return Ok(textbook_1f1b(p, nm, &stages));
    }
    if !nm.is_multiple_of(nd) {
        return Err(Error::invalid(
            "nmicros",
            format!("interleaved_1f1b needs a number of micro-batches that is a multiple of D={nd}, got {nm}"),
        ));
    }
    let total = nm * v;
    let mut orders: Orders = vec![Vec::new(); nd];
    for (d, o) in orders.iter_mut().enumerate() {
        let mb = |k: usize| (k / (nd * v)) * nd + k % nd;
        let f = |k: usize| (mb(k), stages[((k / nd) % v) * nd + d].forward);
        let b = |k: usize| {
            (
                mb(k),
                stages[(v - 1 - (k / nd) % v) * nd + d]
                    .backward
                    .expect("checked"),
            )
        };
        let warm = ((nd - d - 1) * 2 + (v - 1) * nd).min(total);
        o.extend((0..warm).map(f));
        for i in 0..total - warm {
            o.push(f(warm + i));
            o.push(b(i));
        }
        o.extend((total - warm..total).map(b));
    }
    Ok(orders)
}

/// ZB-H1 (`k = 1`) and ZB-H2 (`k = 2`) of Qi et al. (ICLR 2024) on a B/W-split pipeline:
/// stage i runs, at step x, `F_x`, then `B_{x-k(p-1-i)}`, then `W_{x-k(p-1)}` (those that exist).
pub fn zero_bubble(p: &Premise, nm: usize, k: usize) -> Result<Orders> {
    let stages = pipeline_stages(p, false)
        .filter(|st| one_stage_per_device(st) && st.iter().all(|s| s.backward.is_some() && s.weight.is_some()))
        .ok_or_else(|| {
            Error::invalid(
                "premise",
                format!(
                    "zb_h{k} needs a pipeline with split backward (B, then W per stage, one stage per device), \
                     such as the zb_v premise"
                ),
            )
        })?;
    let np = stages.len() as i64;
    let nmi = nm as i64;
    let k = k as i64;
    let mut orders: Orders = vec![Vec::new(); p.ndevs()];
    for (i, st) in stages.iter().enumerate() {
        let i = i as i64;
        let o = &mut orders[st.device];
        let (b, w) = (st.backward.expect("checked"), st.weight.expect("checked"));
        for x in 0..nmi + 2 * k * np {
            let mut put = |j: i64, g: usize| {
                if (0..nmi).contains(&j) {
                    o.push((j as usize, g));
                }
            };
            put(x, st.forward);
            put(x - k * (np - 1 - i), b);
            put(x - k * (np - 1), w);
        }
    }
    Ok(orders)
}

/// The bidirectional premise of Chimera built from a V pipeline: the pipeline itself ("down",
/// stage s on its device) and its mirror ("up", stage s on the device of stage S-1-s).
pub fn bidirectional(p: &Premise) -> Result<Premise> {
    let stages = pipeline_stages(p, false)
        .filter(|st| one_stage_per_device(st) && st.iter().all(|s| s.backward.is_some() && s.weight.is_none()))
        .ok_or_else(|| {
            Error::invalid("premise", "chimera needs a V pipeline (one forward and one backward stage per device), such as vshape")
        })?;
    let ns = stages.len();
    let mut blocks: Vec<Block> = Vec::new();
    let mut edges: Vec<Edge> = Vec::new();
    for (tag, mirror) in [("down", false), ("up", true)] {
        let dev = |s: usize| {
            if mirror {
                stages[ns - 1 - s].device
            } else {
                stages[s].device
            }
        };
        // Forwards down the stages, then backwards up: one chain per direction.
        let forwards = (0..ns).map(|s| (s, stages[s].forward));
        let backwards = (0..ns)
            .rev()
            .map(|s| (s, stages[s].backward.expect("checked")));
        let first = blocks.len();
        blocks.extend(forwards.chain(backwards).map(|(s, g)| {
            let b = p.block(g);
            Block::new(
                format!("{}/{tag}", b.name),
                b.span,
                vec![dev(s)],
                b.memory,
                b.kind,
            )
        }));
        edges.extend((first + 1..blocks.len()).map(|k| Edge::new(k - 1, k)));
    }
    Premise::new(p.ndevs(), blocks, edges)
}

/// Weakly connected components of the premise (each a sorted block list), in order of their
/// smallest block.
fn components(p: &Premise) -> Vec<Vec<usize>> {
    let n = p.nblocks();
    let mut comp = vec![usize::MAX; n];
    let mut out = Vec::new();
    for s in 0..n {
        if comp[s] != usize::MAX {
            continue;
        }
        let id = out.len();
        let mut stack = vec![s];
        let mut members = Vec::new();
        comp[s] = id;
        while let Some(g) = stack.pop() {
            members.push(g);
            for &(h, _) in p.preds(g).iter().chain(p.succs(g)) {
                if comp[h] == usize::MAX {
                    comp[h] = id;
                    stack.push(h);
                }
            }
        }
        members.sort_unstable();
        out.push(members);
    }
    out
}

/// Chimera (Li & Hoefler, SC'21) with direct concatenation.
///
/// On a V pipeline, `nmicros` (even) counts micro-batches and the schedule runs on
/// [`bidirectional`] with `nmicros / 2` rows (row j holds micro-batch 2j, which runs down, and
/// 2j+1, which runs up); on a premise that already is two mirrored pipelines (xshape),
/// `nmicros` counts rows. Each direction runs 1F1B on nnScaler's step grid (stage s: F(i) at
/// step s + 2i, B(i) at step 2i + 2D - 1 - s) over units of D/2 micro-batches; unit u is
/// shifted by 2D u steps. With D even the merged grid is conflict-free (the paper's argument)
/// and units tile perfectly, so with equal forward and backward spans the schedule spans
/// `2N + D - 2` steps: bubble ratio `(D-2)/(2N+D-2)`, as published. Per-device orders follow
/// the grid; the simulator times them.
pub fn chimera(p: &Arc<Premise>, nmicros: usize) -> Result<(Arc<Premise>, usize, Orders)> {
    let nd = p.ndevs();
    if nd < 2 || !nd.is_multiple_of(2) {
        return Err(Error::invalid(
            "premise",
            format!("chimera needs an even number of devices, got {nd}"),
        ));
    }
    let n = p.nblocks();
    let comps = components(p);
    let pipes: Option<Vec<Vec<Stage>>> = if comps.len() == 2 {
        comps
            .iter()
            .map(|c| {
                let mut mask = vec![false; n];
                c.iter().for_each(|&g| mask[g] = true);
                pipeline_stages_in(p, &mask, false).filter(|st| {
                    st.len() == nd
                        && one_stage_per_device(st)
                        && st
                            .iter()
                            .all(|s| s.backward.is_some() && s.weight.is_none())
                })
            })
            .collect()
    } else {
        None
    };
    let (q, nm, pipes) = match pipes {
        Some(pipes) => (p.clone(), nmicros, pipes),
        None => {
            if !nmicros.is_multiple_of(2) {
                return Err(Error::invalid(
                    "nmicros",
                    format!("chimera needs an even number of micro-batches (half run down, half up), got {nmicros}"),
                ));
            }
            let q = Arc::new(bidirectional(p)?);
            let n = q.nblocks();
            let pipes = components(&q)
                .iter()
                .map(|c| {
                    let mut mask = vec![false; n];
                    c.iter().for_each(|&g| mask[g] = true);
                    pipeline_stages_in(&q, &mask, false)
                        .expect("bidirectional() builds two pipelines")
                })
                .collect();
            (q, nmicros / 2, pipes)
        }
    };
    let n = q.nblocks();
    let (d, half) = (nd as i64, nd / 2);
    let mut step = vec![0i64; nm * n];
    for j in 0..nm {
        let (u, i) = ((j / half) as i64, (j % half) as i64);
        for stages in &pipes {
            for (s, st) in stages.iter().enumerate() {
                let s = s as i64;
                step[j * n + st.forward] = 2 * d * u + s + 2 * i;
                step[j * n + st.backward.expect("checked")] = 2 * d * u + 2 * i + 2 * d - 1 - s;
            }
        }
    }
    let orders = orders_by_key(&q, nm, |j, g| step[j * n + g]);
    Ok((q, nm, orders))
}

// ---------------------------------------------------------------------------------------
// The list-scheduling greedy.

fn greedy_stalled() -> Error {
    Error::Numerical(
        "internal: the list-scheduling greedy made no progress (please report this premise)".into(),
    )
}

/// Event-driven list scheduling: at each decision time, the eligible jobs (predecessors
/// ended, previous micro-batch of the block dispatched) are tried in priority order:
/// multi-device jobs first, then the backward phase, then lower micro-batch, then topological
/// rank. A job starts when all
/// its devices are free and not reserved by a higher-priority job waiting for a busy device,
/// and when it would not open a new micro-batch beyond the in-flight cap of a device (a
/// micro-batch is in flight on `d` while it holds memory there through single-device blocks). If nothing runs and only the caps block progress, the first
/// capped job starts anyway, so the greedy never stalls. `skip` blocks take no time and no
/// device (used to time the pipeline part of 1F1B+).
struct Greedy<'a> {
    p: &'a Premise,
    nm: usize,
    caps: Vec<usize>,
    skip: Vec<bool>,
    /// GPipe: a backward-phase job waits until its devices have dispatched every forward job.
    phase_barrier: bool,
    /// Asked every 1024 decisions whether to stop.
    progress: &'a dyn Progress,
}

impl<'a> Greedy<'a> {
    fn new(
        p: &'a Premise,
        nm: usize,
        caps: Vec<usize>,
        skip: Vec<bool>,
        progress: &'a dyn Progress,
    ) -> Self {
        Greedy {
            p,
            nm,
            caps,
            skip,
            phase_barrier: false,
            progress,
        }
    }

    /// Starts of every job (`None` only if the greedy stalled, which its fallback rule
    /// prevents; kept as a guard against hangs), or `Cancelled`.
    fn run(&self) -> Result<Option<Vec<i64>>> {
        let p = self.p;
        let (n, nm, nd) = (p.nblocks(), self.nm, p.ndevs());
        let total = n * nm;
        let ph = backward_phase(p);
        let rank = p.topo_rank();
        // Multi-device jobs first (a device that is free must not be taken from a job that
        // needs several at once, or such jobs wait until everything drains), then backward
        // phase, then micro-batch, then rank.
        let multi: Vec<bool> = (0..n).map(|g| p.block(g).devices.len() > 1).collect();
        let key = |k: usize| (!multi[k % n], !ph[k % n], k / n, rank[k % n]);
        let mut start = vec![i64::MIN; total];
        let mut ready = vec![0i64; total];
        let mut npred: Vec<usize> = (0..total).map(|k| p.preds(k % n).len()).collect();
        // Eligible: predecessors done (set by `release`). A job can start only when it is also
        // the next of its block (FIFO: micro-batch j after j - 1), so the candidates are the
        // eligible heads `next[g] * n + g`, at most one per block: each decision looks at n
        // jobs, not at every eligible one (thousands of backward jobs wait behind GPipe's
        // phase barrier, which made long runs quadratic in N).
        let mut eligible = vec![false; total];
        let mut next = vec![0usize; n];
        let head = |g: usize, next: &[usize]| (next[g] < nm).then(|| next[g] * n + g);
        let mut busy_until = vec![i64::MIN; nd];
        let mut held = vec![0i64; nd * nm];
        let mut inflight = vec![0usize; nd];
        // Running jobs as (end, job); completions release successors.
        let mut running: std::collections::BinaryHeap<std::cmp::Reverse<(i64, usize)>> =
            Default::default();
        // Forward-phase jobs not yet dispatched, per device (for the phase barrier).
        let mut fwd_left: Vec<usize> = (0..nd)
            .map(|d| {
                p.blocks_on(d)
                    .iter()
                    .filter(|&&g| !ph[g] && !self.skip[g])
                    .count()
                    * nm
            })
            .collect();
        let mut left = total;
        for (k, &np) in npred.iter().enumerate().take(n) {
            if np == 0 {
                eligible[k] = true;
            }
        }
        let mut t = 0i64;
        let mut cands: Vec<usize> = Vec::new();
        let mut rounds = 0usize;
        while left > 0 {
            rounds += 1;
            if rounds > 4 * total + 16 {
                return Ok(None);
            }
            if rounds.is_multiple_of(1024) {
                self.progress.check()?;
            }
            // Completions up to t.
            while let Some(&std::cmp::Reverse((e, k))) = running.peek() {
                if e > t {
                    break;
                }
                running.pop();
                self.release(k, e, &mut npred, &mut ready, &mut eligible);
            }
            // Zero-time (skipped) blocks pass through at once.
            let mut progressed = true;
            while progressed {
                progressed = false;
                for g in (0..n).filter(|&g| self.skip[g]) {
                    while let Some(k) = head(g, &next).filter(|&k| eligible[k] && ready[k] <= t) {
                        start[k] = ready[k].max(if k >= n { start[k - n] } else { i64::MIN });
                        next[g] += 1;
                        left -= 1;
                        self.release(k, start[k], &mut npred, &mut ready, &mut eligible);
                        progressed = true;
                    }
                }
            }
            cands.clear();
            cands.extend(
                (0..n)
                    .filter_map(|g| head(g, &next))
                    .filter(|&k| eligible[k] && ready[k] <= t),
            );
            cands.sort_by_key(|&k| key(k));
            let mut reserved = vec![false; nd];
            let mut capped: Option<usize> = None;
            let mut started_any = false;
            for &k in &cands {
                let g = k % n;
                let devs = &p.block(g).devices;
                if self.phase_barrier && ph[g] && devs.iter().any(|&d| fwd_left[d] > 0) {
                    continue;
                }
                let free = devs.iter().all(|&d| busy_until[d] <= t && !reserved[d]);
                // Only single-device blocks count towards the in-flight cap (the cap is about
                // stage activations; a tensor-parallel block's memory is held by everyone).
                let opens: Vec<usize> = if p.block(g).memory > 0 && !multi[g] {
                    devs.iter()
                        .copied()
                        .filter(|&d| held[d * nm + k / n] <= 0)
                        .collect()
                } else {
                    Vec::new()
                };
                let cap_ok = opens.iter().all(|&d| inflight[d] < self.caps[d]);
                if !cap_ok {
                    if free && capped.is_none() {
                        capped = Some(k);
                    }
                    continue;
                }
                if !free {
                    for &d in devs {
                        reserved[d] = true;
                    }
                    continue;
                }
                self.dispatch(k, t, &mut start, &mut busy_until, &mut held, &mut inflight);
                next[g] += 1;
                left -= 1;
                if !ph[g] {
                    devs.iter().for_each(|&d| fwd_left[d] -= 1);
                }
                running.push(std::cmp::Reverse((t + p.span(g), k)));
                started_any = true;
            }
            if !started_any && running.is_empty() {
                if let Some(k) = capped {
                    // Only the caps block progress: let the best capped job through.
                    self.dispatch(k, t, &mut start, &mut busy_until, &mut held, &mut inflight);
                    next[k % n] += 1;
                    left -= 1;
                    if !ph[k % n] {
                        p.block(k % n)
                            .devices
                            .iter()
                            .for_each(|&d| fwd_left[d] -= 1);
                    }
                    running.push(std::cmp::Reverse((t + p.span(k % n), k)));
                    continue;
                }
            }
            if left == 0 {
                break;
            }
            // Next decision time: the next completion or the next ready time after t.
            let next_end = running.peek().map(|r| r.0 .0);
            let next_ready = (0..n)
                .filter_map(|g| head(g, &next))
                .filter(|&k| eligible[k])
                .map(|k| ready[k])
                .filter(|&r| r > t)
                .min();
            t = match (next_end, next_ready) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) => a,
                (None, Some(b)) => b,
                (None, None) => t + 1, // FIFO-blocked skip chains resolve on the next pass
            };
        }
        Ok(start.iter().all(|&s| s != i64::MIN).then_some(start))
    }

    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        &self,
        k: usize,
        t: i64,
        start: &mut [i64],
        busy_until: &mut [i64],
        held: &mut [i64],
        inflight: &mut [usize],
    ) {
        let p = self.p;
        let n = p.nblocks();
        let g = k % n;
        start[k] = t;
        let mu = p.block(g).memory;
        for &d in &p.block(g).devices {
            busy_until[d] = t + p.span(g);
            if mu != 0 && p.block(g).devices.len() == 1 {
                let s = d * self.nm + k / n;
                let before = held[s] > 0;
                held[s] += mu;
                let after = held[s] > 0;
                if !before && after {
                    inflight[d] += 1;
                } else if before && !after {
                    inflight[d] -= 1;
                }
            }
        }
    }

    /// Job `k` ended at `e`: its successors in the same micro-batch may become eligible.
    fn release(
        &self,
        k: usize,
        e: i64,
        npred: &mut [usize],
        ready: &mut [i64],
        eligible: &mut [bool],
    ) {
        let p = self.p;
        let n = p.nblocks();
        let (j, g) = (k / n, k % n);
        for &(h, lag) in p.succs(g) {
            let x = j * n + h;
            ready[x] = ready[x].max(e + lag);
            npred[x] -= 1;
            if npred[x] == 0 {
                eligible[x] = true;
            }
        }
        // Sources of the next micro-batches become eligible once seen (their readiness is 0);
        // add them lazily: when job k is a source of micro-batch j, enqueue the same source of
        // micro-batch j + 1.
        if p.preds(g).is_empty() && j + 1 < self.nm {
            eligible[(j + 1) * n + g] = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::premises::{builtin, Options};
    use crate::validate::validate;

    fn prem(name: &str, d: usize) -> Arc<Premise> {
        Arc::new(builtin(name, d, &Options::default()).unwrap())
    }

    #[test]
    fn closed_forms_on_the_v() {
        for d in [1, 2, 3, 4, 6] {
            for nm in [1, 2, 3, 5, 8, 12] {
                let p = prem("vshape", d);
                for name in ["gpipe", "1f1b"] {
                    let b = baseline(name, p.clone(), nm).unwrap();
                    assert!(validate(&b.schedule, 10).is_valid(), "{name} D={d} N={nm}");
                    assert_eq!(
                        b.schedule.makespan(),
                        ((nm + d - 1) * 4) as i64,
                        "{name} D={d} N={nm}"
                    );
                }
                let b = baseline("1f1b", p.clone(), nm).unwrap();
                let want: Vec<i64> = (0..d).map(|k| (d - k).min(nm) as i64).collect();
                assert_eq!(b.schedule.peak_memory(), want, "D={d} N={nm}");
                // The greedy with caps D - d reproduces the textbook 1F1B exactly on the V.
                let caps = (0..d).map(|k| d - k).collect();
                let greedy = simulate(
                    p.clone(),
                    nm,
                    &one_f_one_b_with_caps(&p, nm, caps, &NoProgress).unwrap(),
                )
                .unwrap();
                assert_eq!(greedy.starts, b.schedule.starts, "D={d} N={nm}");
                let inf = Arc::new(builtin("vshape", d, &Options::inference()).unwrap());
                let b = baseline("inference_pipe", inf, nm).unwrap();
                assert_eq!(b.schedule.makespan(), (nm + d - 1) as i64);
            }
        }
    }

    #[test]
    fn inflight_caps_generalise_d_minus_d() {
        // ceil(L_d / P) = D - d on the V; doubled (at most D) for the greedy.
        let p = prem("vshape", 6);
        assert_eq!(inflight_caps(&p), vec![6, 6, 6, 6, 4, 2]);
        // Inference: no activation memory, no cap.
        let i = Arc::new(builtin("vshape", 4, &Options::inference()).unwrap());
        assert!(inflight_caps(&i).iter().all(|&c| c == usize::MAX));
    }

    #[test]
    fn every_baseline_is_valid_where_it_applies() {
        for d in [2, 4] {
            for nm in [2, 4, 8] {
                for name in [
                    "vshape",
                    "mshape",
                    "nnshape",
                    "kshape",
                    "xshape",
                    "mllm",
                    "finetune",
                    "alphafold",
                    "zb_v",
                    "interleaved",
                    "wave",
                ] {
                    let p = prem(name, d);
                    for b in [
                        "gpipe",
                        "1f1b",
                        "1f1b+",
                        "chimera",
                        "interleaved_1f1b",
                        "zb_h1",
                        "zb_h2",
                    ] {
                        match baseline(b, p.clone(), nm) {
                            Ok(r) => {
                                let rep = validate(&r.schedule, 5);
                                assert!(
                                    rep.is_valid(),
                                    "{b} on {name} D={d} N={nm}: {:?}",
                                    rep.violations
                                );
                                assert!(
                                    r.schedule.makespan()
                                        >= r.schedule
                                            .premise
                                            .makespan_lower_bound(r.schedule.nmicros)
                                );
                            }
                            Err(e) => assert!(
                                matches!(e, Error::InvalidArgument { .. }),
                                "{b} on {name}: {e}"
                            ),
                        }
                    }
                }
            }
        }
    }
}
