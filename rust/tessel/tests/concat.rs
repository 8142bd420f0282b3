//! Oracles of the Tessel-style completion (spec §4.3 step 3, §3): the splits cut no block,
//! the warm-up and cool-down solves are optimal (brute force on tiny premises), the literal
//! concatenation warm-up | windows | cool-down is a valid schedule (the argument of the module
//! docs) of makespan `W + (N - k + 1) P + C`, and the as-soon-as-possible assembly is valid
//! and never longer. Plus the reference's own repetend on mshape D4 M4.

mod common;

use common::{brute_range, makespan, pools_of_one_and_two_threads, random_premise, valid};
use maleki_common::NoProgress;
use maleki_tessel::concat::{assemble, best, ramps, splits, ConcatOptions, Ramps, Split};
use maleki_tessel::exact::ExactOptions;
use maleki_tessel::premises::{builtin, Options};
use maleki_tessel::repetend::{construct, enumerate, RepetendOptions};
use maleki_tessel::{MemoryConvention, Premise, Template, TesselRepetend, UNLIMITED};

const START: MemoryConvention = MemoryConvention::Start;

/// A few templates of the premise: the shortest and first found at P* and P* + 1, and some
/// enumerated at P*. None when no template fits the caps.
fn templates(p: &Premise, caps: &[i64], extra: usize) -> Vec<Template> {
    let mut ro = RepetendOptions::new(caps.to_vec());
    ro.delta_p = 1;
    let Ok(r) = construct(p, &ro, &NoProgress) else {
        return Vec::new();
    };
    let mut out: Vec<Template> = Vec::new();
    for o in &r.periods {
        for t in [&o.best, &o.first].into_iter().flatten() {
            if !out.contains(t) {
                out.push(t.clone());
            }
        }
    }
    let o = &r.periods[0];
    if let Some(l) = o.length(p) {
        for t in enumerate(p, o.period, &ro, l + o.period, extra).unwrap() {
            if !out.contains(&t) {
                out.push(t);
            }
        }
    }
    out
}

/// The reference's composition, written out: the warm-up's starts, then `N - k + 1` windows
/// of `P` (block `g` of window `r` runs micro-batch `counts[g] + r` at its in-window offset),
/// then the cool-down's starts after the last window.
fn literal(p: &Premise, t: &Template, s: &Split, r: &Ramps, nm: usize) -> Vec<i64> {
    let n = p.nblocks();
    let t = t.normalised();
    let per = t.period;
    let k = s.counts.iter().max().unwrap() + 1;
    let w = r.warmup.makespan;
    let mut starts = vec![-1; n * nm];
    for g in 0..n {
        let c = s.counts[g];
        for j in 0..c {
            starts[j * n + g] = r.warmup.starts[j * n + g];
        }
        let offset = (t.starts[g] - s.cut).rem_euclid(per);
        for win in 0..=(nm - k) {
            starts[(c + win) * n + g] = w + win as i64 * per + offset;
        }
        for j in c + 1..k {
            starts[(j + nm - k) * n + g] =
                w + (nm - k + 1) as i64 * per + r.cooldown.starts[j * n + g];
        }
    }
    assert!(starts.iter().all(|&x| x >= 0), "every job placed once");
    starts
}

fn builtin_cases() -> Vec<(Premise, Vec<i64>)> {
    let mut out = Vec::new();
    for (name, d, mem) in [
        ("vshape", 4, 4),
        ("mshape", 4, 4),
        ("mshape", 4, 6),
        ("xshape", 4, 4),
        ("kshape", 4, 6),
        ("nnshape", 4, 6),
        ("alphafold", 4, 6),
        ("zb_v", 4, 6),
        ("mshape", 2, 3),
        ("vshape", 4, UNLIMITED),
    ] {
        let o = if mem == UNLIMITED {
            Options::inference()
        } else {
            Options::default()
        };
        out.push((builtin(name, d, &o).unwrap(), vec![mem; d]));
    }
    out
}

#[test]
fn splits_cut_no_block_and_name_the_window_jobs() {
    for (p, caps) in builtin_cases() {
        let n = p.nblocks();
        for t in templates(&p, &caps, 8) {
            let per = t.period;
            let tn = t.normalised();
            for s in splits(&p, &t) {
                let k = s.window_micros();
                assert_eq!(k, s.counts.iter().max().unwrap() + 1);
                assert_eq!(*s.counts.iter().min().unwrap(), 0);
                for e in p.edges() {
                    assert!(
                        s.counts[e.from] >= s.counts[e.to],
                        "counts fall along the edges"
                    );
                }
                // In the unrolled template no job straddles a window boundary x + m P.
                let u = tn.unroll(k + 2);
                for (x, &st) in u.iter().enumerate() {
                    let end = st + p.span(x % n);
                    let first = (st - s.cut).div_euclid(per) + 1;
                    assert!(
                        s.cut + first * per >= end,
                        "a job crosses a window boundary"
                    );
                }
                // The jobs (g, counts[g]) share one window [X, X + P), X = cut (mod P).
                let x0 = s.cut + (u[s.counts[0] * n] - s.cut).div_euclid(per) * per;
                for g in 0..n {
                    let st = u[s.counts[g] * n + g];
                    assert!(
                        x0 <= st && st + p.span(g) <= x0 + per,
                        "block {g} outside the window"
                    );
                }
            }
        }
    }
}

#[test]
fn ramps_are_optimal_on_random_premises() {
    let mut checked = 0;
    for seed in 0..200u64 {
        let d = 1 + (seed % 3) as usize;
        let p = random_premise(seed, d, 4 + (seed % 3) as usize);
        let caps = vec![if seed % 2 == 0 { UNLIMITED } else { 2 }; d];
        let Ok(r) = construct(&p, &RepetendOptions::new(caps.clone()), &NoProgress) else {
            continue;
        };
        let Some(t) = r.periods[0].best.clone() else {
            continue;
        };
        let n = p.nblocks();
        for s in splits(&p, &t) {
            let k = s.window_micros();
            let warm_jobs: usize = s.counts.iter().sum();
            let cool_jobs: usize = s.counts.iter().map(|&c| k - 1 - c).sum();
            if warm_jobs > 8 || cool_jobs > 8 {
                continue;
            }
            let rr = ramps(&p, &t, &s, &caps, &ExactOptions::default(), &NoProgress)
                .unwrap()
                .unwrap();
            assert!(rr.warmup.proved_optimal && rr.cooldown.proved_optimal);
            let lo: Vec<usize> = s.counts.iter().map(|&c| c + 1).collect();
            let w = brute_range(&p, k, &vec![0; n], &s.counts, &caps);
            let c = brute_range(&p, k, &lo, &vec![k; n], &caps);
            assert_eq!(
                Some(rr.warmup.makespan),
                w,
                "seed {seed} warm-up {:?}",
                s.counts
            );
            assert_eq!(
                Some(rr.cooldown.makespan),
                c,
                "seed {seed} cool-down {:?}",
                s.counts
            );
            checked += 1;
        }
    }
    assert!(checked > 100, "only {checked} splits checked");
}

#[test]
fn concatenations_are_valid_and_assembly_is_never_longer() {
    let mut cases = builtin_cases();
    for seed in 0..40u64 {
        let d = 1 + (seed % 4) as usize;
        cases.push((
            random_premise(seed, d, 6),
            vec![if seed % 2 == 0 { 3 } else { UNLIMITED }; d],
        ));
    }
    let eo = ExactOptions {
        node_budget: 20_000,
        ..Default::default()
    };
    for (p, caps) in cases {
        for t in templates(&p, &caps, 4).iter().take(4) {
            for s in splits(&p, t) {
                let k = s.window_micros();
                let r = ramps(&p, t, &s, &caps, &eo, &NoProgress)
                    .unwrap()
                    .expect("seeded by the template");
                assert!(assemble(&p, t, &s, &r, k - 1).is_none() || k == 1);
                for nm in [k, k + 1, k + 5, 40.max(k)] {
                    let lit = literal(&p, t, &s, &r, nm);
                    valid(&p, nm, &lit, &caps, START)
                        .unwrap_or_else(|e| panic!("literal concatenation: {e}"));
                    // Equal with a cool-down; without one the last window may end early.
                    let plain = r.concatenated_makespan(t.period, k, nm);
                    if k > 1 {
                        assert_eq!(makespan(&p, &lit), plain);
                    } else {
                        assert!(makespan(&p, &lit) <= plain);
                    }
                    let a = assemble(&p, t, &s, &r, nm).expect("valid orders");
                    valid(&p, nm, &a, &caps, START).unwrap_or_else(|e| panic!("assembly: {e}"));
                    assert!(makespan(&p, &a) <= makespan(&p, &lit));
                }
            }
        }
    }
}

/// The reference's lazy search on mshape D4 M4 (k = 6) returns this repetend, a 20-step
/// warm-up and a 24-step cool-down: 7N+9 (run by hand, z3 5.4.1). Given the same repetend,
/// the warm-up and cool-down solves find the same step counts, so the completion is never
/// worse than the reference's.
#[test]
fn the_references_repetend_on_mshape_m4() {
    let p = builtin("mshape", 4, &Options::default()).unwrap();
    let caps = [4; 4];
    let rep = TesselRepetend {
        period: 7,
        mids: vec![5, 4, 4, 3, 3, 3, 2, 1, 0, 0],
        steps: vec![0, 4, 5, 1, 2, 3, 3, 2, 1, 6],
    };
    let t = Template::from_tessel(&rep).unwrap();
    assert_eq!(t.check(&p, &caps, START), Ok(()));
    let s = splits(&p, &t)
        .into_iter()
        .find(|s| s.counts == [5, 4, 4, 3, 3, 3, 2, 1, 0, 0])
        .expect("the reference's cut");
    let r = ramps(&p, &t, &s, &caps, &ExactOptions::default(), &NoProgress)
        .unwrap()
        .unwrap();
    assert!(r.warmup.proved_optimal && r.cooldown.proved_optimal);
    assert_eq!((r.warmup.makespan, r.cooldown.makespan), (20, 24));
    for nm in [8usize, 32, 128] {
        assert_eq!(r.concatenated_makespan(7, 6, nm), 7 * nm as i64 + 9);
        let a = assemble(&p, &t, &s, &r, nm).unwrap();
        valid(&p, nm, &a, &caps, START).unwrap();
        assert!(makespan(&p, &a) <= 7 * nm as i64 + 9);
    }
}

#[test]
fn best_is_identical_on_one_and_two_threads() {
    let pools = pools_of_one_and_two_threads();
    for (name, mem) in [("mshape", 4), ("xshape", 4), ("nnshape", 6)] {
        let p = builtin(name, 4, &Options::default()).unwrap();
        let caps = vec![mem; 4];
        let ts = templates(&p, &caps, 32);
        let out: Vec<_> = pools
            .iter()
            .map(|pool| {
                pool.install(|| {
                    best(
                        &p,
                        &ts,
                        32,
                        &caps,
                        START,
                        &ConcatOptions::default(),
                        &NoProgress,
                    )
                    .unwrap()
                })
            })
            .collect();
        assert_eq!(out[0], out[1], "{name}");
        let c = out[0].as_ref().expect("a concatenation");
        valid(&p, 32, &c.starts, &caps, START).unwrap();
        assert!(c.makespan <= c.concatenated);
    }
}
