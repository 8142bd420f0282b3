//! Closed forms of the baselines (spec §9) and invariants on every baseline output.

use std::sync::Arc;

use maleki_tessel::baselines::{baseline, BASELINES};
use maleki_tessel::premises::{builtin, Options, BUILTIN};
use maleki_tessel::simulate::metrics;
use maleki_tessel::validate::validate;
use maleki_tessel::Premise;

fn prem(name: &str, d: usize, o: Options) -> Arc<Premise> {
    Arc::new(builtin(name, d, &o).unwrap())
}

fn spans(f: i64, b: i64) -> Options {
    Options {
        fwd: Some(f),
        bwd: Some(b),
        ..Options::default()
    }
}

#[test]
fn gpipe_and_1f1b_on_the_v_meet_the_lower_bound() {
    for d in [1usize, 2, 3, 4, 6, 8] {
        for (f, b) in [(1, 1), (1, 2), (1, 3), (2, 3), (3, 5)] {
            let p = prem("vshape", d, spans(f, b));
            for nm in [1usize, 2, 4, 7, 16] {
                let want = (nm + d - 1) as i64 * (f + b);
                assert_eq!(p.makespan_lower_bound(nm), want);
                for name in ["gpipe", "1f1b"] {
                    let s = baseline(name, p.clone(), nm).unwrap().schedule;
                    assert_eq!(s.makespan(), want, "{name} D={d} N={nm} f={f} b={b}");
                }
                let s = baseline("1f1b", p.clone(), nm).unwrap().schedule;
                let peaks: Vec<i64> = (0..d).map(|k| (d - k).min(nm) as i64).collect();
                assert_eq!(s.peak_memory(), peaks);
                let g = baseline("gpipe", p.clone(), nm).unwrap().schedule;
                assert_eq!(g.peak_memory(), vec![nm as i64; d]);
            }
        }
    }
}

#[test]
fn inference_pipelining() {
    for d in [1usize, 2, 4, 8] {
        for f in [1, 2, 5] {
            let p = prem(
                "vshape",
                d,
                Options {
                    fwd: Some(f),
                    ..Options::inference()
                },
            );
            for nm in [1usize, 3, 16, 128] {
                let s = baseline("inference_pipe", p.clone(), nm).unwrap().schedule;
                assert_eq!(s.makespan(), (nm + d - 1) as i64 * f);
                // Micro-batch j enters stage d at (j + d) f.
                for j in 0..nm {
                    for k in 0..d {
                        assert_eq!(s.start(j, k), (j + k) as i64 * f);
                    }
                }
            }
        }
    }
}

#[test]
fn interleaved_1f1b_matches_megatron() {
    // C = N (f + b) + (D - 1)(f + b) / v with per-stage spans f, b (chunks of f/v, b/v).
    for d in [2usize, 4, 8] {
        for v in [2usize, 3, 4] {
            for (fc, bc) in [(1i64, 1i64), (1, 2), (1, 3), (2, 3)] {
                let o = Options {
                    fwd: Some(fc),
                    bwd: Some(bc),
                    chunks: Some(v),
                    ..Options::default()
                };
                let p = prem("interleaved", d, o);
                for nm in [d, 2 * d, 4 * d] {
                    let s = baseline("interleaved_1f1b", p.clone(), nm)
                        .unwrap()
                        .schedule;
                    let want = (nm * v) as i64 * (fc + bc) + (d as i64 - 1) * (fc + bc);
                    assert_eq!(s.makespan(), want, "D={d} v={v} N={nm} fc={fc} bc={bc}");
                }
            }
        }
    }
}

#[test]
fn zero_bubble_handcrafted_schedules() {
    for d in [2usize, 4, 6, 8] {
        for (f, b, w) in [
            (1i64, 1i64, 1i64),
            (1, 2, 1),
            (2, 3, 1),
            (1, 3, 1),
            (2, 2, 1),
        ] {
            let o = Options {
                fwd: Some(f),
                bwd: Some(b),
                wgt: Some(w),
                ..Options::default()
            };
            let p = prem("zb_v", d, o);
            let dd = d as i64;
            for nm in [d, 2 * d, 4 * d] {
                let busy = nm as i64 * (f + b + w);
                // ZB-H1 (Qi et al., ICLR 2024): bubble (p-1)(F + B - W), for W <= F, B; the same
                // peak on every stage as 1F1B's first stage.
                let h1 = baseline("zb_h1", p.clone(), nm).unwrap().schedule;
                assert_eq!(
                    h1.makespan() - busy,
                    (dd - 1) * (f + b - w),
                    "ZB-H1 D={d} N={nm} {f},{b},{w}"
                );
                assert_eq!(h1.peak_memory(), vec![dd; d]);
                // The same 1F1B orders with B and W split: W is off the critical path, so the
                // bubble is (p-1)(F + B); the published (p-1)(F + B + W) is 1F1B with a whole
                // backward (next test).
                let one = baseline("1f1b", p.clone(), nm).unwrap().schedule;
                assert_eq!(one.makespan() - busy, (dd - 1) * (f + b));
                // ZB-H2 with equal F, B, W: a parallelogram, (p-1) F of skew, peak 2p-1.
                if f == b && b == w && nm >= 2 * d {
                    let h2 = baseline("zb_h2", p.clone(), nm).unwrap().schedule;
                    assert_eq!(h2.makespan() - busy, (dd - 1) * f, "ZB-H2 D={d} N={nm}");
                    assert_eq!(h2.peak_memory(), vec![2 * dd - 1; d]);
                }
            }
            // 1F1B with a whole backward (B + W as one block): bubble (p-1)(F + B + W).
            let v = prem("vshape", d, spans(f, b + w));
            for nm in [d, 4 * d] {
                let s = baseline("1f1b", v.clone(), nm).unwrap().schedule;
                assert_eq!(
                    s.makespan() - nm as i64 * (f + b + w),
                    (dd - 1) * (f + b + w)
                );
            }
        }
    }
}

#[test]
fn chimera_direct_bubble_ratio() {
    // Chimera's (D-2)/(2N+D-2) holds for equal forward and backward spans (the paper's time
    // slots); parameters are held twice; activations between D/2 + 1 and D per device.
    for d in [2usize, 4, 6, 8] {
        for f in [1i64, 2] {
            let p = prem("vshape", d, spans(f, f));
            for nm in [d, 2 * d, 4 * d, 8 * d] {
                let b = baseline("chimera", p.clone(), nm).unwrap();
                let s = &b.schedule;
                assert_eq!(b.parameter_memory, 2);
                assert_eq!(s.nmicros, nm / 2);
                assert_eq!(s.makespan(), (2 * nm + d - 2) as i64 * f, "D={d} N={nm}");
                let want = (d as f64 - 2.0) / (2.0 * nm as f64 + d as f64 - 2.0);
                assert!((s.bubble_ratio() - want).abs() < 1e-12);
                let peaks = s.peak_memory();
                assert!(
                    peaks
                        .iter()
                        .all(|&m| m >= (d / 2 + 1).min(d) as i64 && m <= d as i64),
                    "{peaks:?}"
                );
            }
        }
    }
}

#[test]
fn every_baseline_output_is_valid_and_above_the_bound() {
    for &name in BUILTIN {
        for d in [2usize, 4, 6] {
            for train in [true, false] {
                let o = if train {
                    Options::default()
                } else {
                    Options::inference()
                };
                let Ok(p) = builtin(name, d, &o) else {
                    continue;
                };
                let p = Arc::new(p);
                for nm in [1usize, 3, 6, 12] {
                    for &b in BASELINES {
                        let Ok(r) = baseline(b, p.clone(), nm) else {
                            continue;
                        };
                        let s = &r.schedule;
                        let rep = validate(s, 3);
                        assert!(
                            rep.is_valid(),
                            "{b} on {name} D={d} N={nm}: {:?}",
                            rep.violations
                        );
                        let m = metrics(s);
                        assert!(m.makespan >= m.lower_bound, "{b} on {name}");
                        assert!(m.bubble_ratio >= 0.0 && m.bubble_ratio < 1.0);
                    }
                }
            }
        }
    }
}
