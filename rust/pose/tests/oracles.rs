//! Deterministic oracles of the estimator (pose.md §7), checked at the Rust level.

mod common;

use common::*;
use maleki_common::progress::NoProgress;
use maleki_common::Error;
use maleki_pose::math::exp_so3;
use maleki_pose::{
    absolute_orientation, cost_and_gradient, crlb, solve, solve_batch, BatchCov, BatchRef, Block,
    Cov, Options, PerScan, ScanRef,
};
use nalgebra::{Matrix3, Matrix6, Vector3};

fn full(s: &Scan) -> ScanRef<'_> {
    ScanRef {
        b: &s.b,
        r: &s.r,
        cov: Cov::Full(&s.cov),
        weights: None,
    }
}

#[test]
fn noise_free_data_is_recovered_exactly() {
    let mut rng = Rng::new(1);
    for &n in &[3usize, 4, 20, 10_000] {
        for rep in 0..4 {
            let mut s = scan(&mut rng, n, 0.05, 0.8, 0.0);
            if rep == 3 {
                // A rotation within 1e-7 rad of a half turn.
                let axis = rng.vec3(1.0).normalize();
                s.a = exp_so3(&(axis * (std::f64::consts::PI - 1e-7)));
                s.b = s
                    .r_true
                    .iter()
                    .map(|r| arr(&(s.a * Vector3::from(*r) + s.t)))
                    .collect();
            }
            let est = solve(&full(&s), &Options::default()).unwrap();
            assert!(est.converged, "n={n}");
            let da = (est.rotation - s.a).norm();
            let dt = (est.translation - s.t).norm();
            assert!(
                da < 1e-12 && dt < 1e-11,
                "n={n} rep={rep}: |dA|={da:e} |dt|={dt:e}"
            );
        }
    }
}

#[test]
fn isotropic_equals_kabsch_and_scalar_scales_equal_weighted_kabsch() {
    let mut rng = Rng::new(2);
    let s = scan(&mut rng, 25, 0.05, 0.0, 1.0);
    let iso = ScanRef {
        b: &s.b,
        r: &s.r,
        cov: Cov::Isotropic {
            sigma_b: 0.03,
            sigma_r: 0.04,
        },
        weights: None,
    };
    let est = solve(&iso, &Options::default()).unwrap();
    let (ak, tk) = absolute_orientation(&s.b, &s.r, None).unwrap();
    assert!((est.rotation - ak).norm() < 1e-12 && (est.translation - tk).norm() < 1e-12);
    assert_eq!(
        est.iterations, 1,
        "Horn is already optimal: the first step is below tol"
    );
    // Per-point scalar covariance s_i (σ_b² + σ_r²) I  ==  weighted Kabsch with weights 1/s_i.
    let scales: Vec<f64> = (0..25)
        .map(|i| 0.5 + (i as f64 * 0.37).sin().abs() * 3.0)
        .collect();
    let weights: Vec<f64> = scales.iter().map(|s| 1.0 / s).collect();
    let w_scan = ScanRef {
        weights: Some(&weights),
        ..iso
    };
    let est = solve(&w_scan, &Options::default()).unwrap();
    let (ak, tk) = absolute_orientation(&s.b, &s.r, Some(&weights)).unwrap();
    assert!((est.rotation - ak).norm() < 1e-12 && (est.translation - tk).norm() < 1e-12);
}

#[test]
fn role_swap_gives_the_inverse_pose() {
    let mut rng = Rng::new(3);
    let s = scan(&mut rng, 15, 0.05, 0.8, 1.0);
    let est = solve(&full(&s), &Options::default()).unwrap();
    // Swapped: noise vector [Δr; Δb], covariance [[R_rr, R_brᵀ], [R_br, R_bb]].
    let swapped: Vec<[f64; 36]> = s
        .cov
        .iter()
        .map(|c| {
            let m = Matrix6::from_row_slice(c);
            let p = Matrix6::from_fn(|i, j| m[((i + 3) % 6, (j + 3) % 6)]);
            rows(&p)
        })
        .collect();
    let inv = solve(
        &ScanRef {
            b: &s.r,
            r: &s.b,
            cov: Cov::Full(&swapped),
            weights: None,
        },
        &Options::default(),
    )
    .unwrap();
    assert!((inv.rotation - est.rotation.transpose()).norm() < 1e-10);
    assert!((inv.translation + est.rotation.transpose() * est.translation).norm() < 1e-9);
}

#[test]
fn body_frame_change_is_equivariant() {
    let mut rng = Rng::new(4);
    let s = scan(&mut rng, 12, 0.05, 0.8, 1.0);
    let est = solve(&full(&s), &Options::default()).unwrap();
    let c = rng.rotation();
    let d = rng.vec3(3.0);
    let b2: Vec<[f64; 3]> =
        s.b.iter()
            .map(|b| arr(&(c * Vector3::from(*b) + d)))
            .collect();
    let cov2: Vec<[f64; 36]> = s
        .cov
        .iter()
        .map(|m| {
            let mut t = Matrix6::identity();
            t.fixed_view_mut::<3, 3>(0, 0).copy_from(&c);
            rows(&(t * Matrix6::from_row_slice(m) * t.transpose()))
        })
        .collect();
    let e2 = solve(
        &ScanRef {
            b: &b2,
            r: &s.r,
            cov: Cov::Full(&cov2),
            weights: None,
        },
        &Options::default(),
    )
    .unwrap();
    assert!((e2.rotation - c * est.rotation).norm() < 1e-10);
    assert!((e2.translation - (c * est.translation + d)).norm() < 1e-9);
    let mut cc = Matrix6::zeros();
    cc.fixed_view_mut::<3, 3>(0, 0).copy_from(&c);
    cc.fixed_view_mut::<3, 3>(3, 3).copy_from(&c);
    let p = cc * est.covariance * cc.transpose();
    assert!((e2.covariance - p).norm() < 1e-8 * p.norm());
}

#[test]
fn gradient_matches_central_differences_and_vanishes_at_the_solution() {
    let mut rng = Rng::new(5);
    let s = scan(&mut rng, 10, 0.3, 0.8, 1.0);
    let sr = full(&s);
    let a = exp_so3(&rng.vec3(0.05)) * s.a;
    let t = s.t + rng.vec3(0.1);
    let (_, g) = cost_and_gradient(&sr, &a, &t).unwrap();
    let h = 1e-6;
    for k in 0..6 {
        let mut d = nalgebra::Vector6::zeros();
        d[k] = h;
        let shift = |d: &nalgebra::Vector6<f64>| {
            let ap = exp_so3(&d.fixed_rows::<3>(0).into_owned()) * a;
            cost_and_gradient(&sr, &ap, &(t + d.fixed_rows::<3>(3)))
                .unwrap()
                .0
        };
        let fd = (shift(&d) - shift(&-d)) / (2.0 * h);
        assert!(
            (fd - g[k]).abs() <= 1e-6 * g.norm(),
            "k={k}: fd {fd} vs {}",
            g[k]
        );
    }
    let est = solve(&sr, &Options::default()).unwrap();
    let (_, g0) = cost_and_gradient(&sr, &est.rotation, &est.translation).unwrap();
    assert!(
        g0.norm() < 1e-8 * g.norm(),
        "|g| at the solution {:e}",
        g0.norm()
    );
}

#[test]
fn rotation_only_crlb_is_the_wahba_bound() {
    let mut rng = Rng::new(6);
    let a = rng.rotation();
    let r: Vec<[f64; 3]> = (0..8).map(|_| arr(&rng.vec3(4.0))).collect();
    let sig: Vec<f64> = (0..8).map(|i| 0.01 * (1.0 + i as f64)).collect();
    let bb: Vec<[f64; 9]> = sig
        .iter()
        .map(|s| [s * s, 0.0, 0.0, 0.0, s * s, 0.0, 0.0, 0.0, s * s])
        .collect();
    let scan = ScanRef {
        b: &r,
        r: &r,
        cov: Cov::Blocks {
            bb: Some(Block::PerPoint(&bb)),
            br: None,
            rr: None,
        },
        weights: None,
    };
    let p = crlb(&scan, &a).unwrap();
    // With t known the rotation bound is the inverse of the θθ block of F; Wahba/QUEST:
    // P_θθ = (−Σ σ⁻² [A r×]²)⁻¹.
    let mut info = Matrix3::zeros();
    for (ri, s) in r.iter().zip(&sig) {
        let k = maleki_pose::math::skew(&(a * Vector3::from(*ri)));
        info -= k * k / (s * s);
    }
    let fisher = p.try_inverse().unwrap();
    let fqq = fisher.fixed_view::<3, 3>(0, 0).into_owned();
    assert!((fqq - info).norm() < 1e-9 * info.norm());
}

#[test]
fn degenerate_and_bad_inputs_give_errors() {
    let line: Vec<[f64; 3]> = (0..6)
        .map(|i| [i as f64, 2.0 * i as f64, -(i as f64)])
        .collect();
    let iso = Cov::Isotropic {
        sigma_b: 0.1,
        sigma_r: 0.1,
    };
    let e = solve(
        &ScanRef {
            b: &line,
            r: &line,
            cov: iso,
            weights: None,
        },
        &Options::default(),
    )
    .unwrap_err();
    assert!(matches!(e, Error::Degenerate(_)), "{e}");
    let same = vec![[1.0, 2.0, 3.0]; 5];
    let e = solve(
        &ScanRef {
            b: &same,
            r: &same,
            cov: iso,
            weights: None,
        },
        &Options::default(),
    )
    .unwrap_err();
    assert!(matches!(e, Error::Degenerate(_)), "{e}");
    let pts = [[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]];
    let e = solve(
        &ScanRef {
            b: &pts,
            r: &pts,
            cov: iso,
            weights: None,
        },
        &Options::default(),
    )
    .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }));
    let bad = Options {
        tol: 0.0,
        ..Options::default()
    };
    let mut rng = Rng::new(7);
    let s = scan(&mut rng, 5, 0.05, 0.5, 1.0);
    assert!(matches!(
        solve(&full(&s), &bad),
        Err(Error::InvalidArgument { .. })
    ));
    // Not converged: strict gives the error, otherwise a flagged estimate.
    let one = Options {
        max_iter: 1,
        ..Options::default()
    };
    let est = solve(&full(&s), &one).unwrap();
    assert!(!est.converged && est.iterations == 1);
    let strict = Options {
        strict: true,
        ..one
    };
    assert!(matches!(
        solve(&full(&s), &strict),
        Err(Error::NotConverged { iters: 1 })
    ));
}

#[test]
fn batch_equals_loop_bitwise_for_any_thread_count() {
    let mut rng = Rng::new(8);
    let scans: Vec<Scan> = (0..40)
        .map(|k| scan(&mut rng, 5 + k % 7, 0.05, 0.8, 1.0))
        .collect();
    let mut offsets = vec![0usize];
    let (mut b, mut r, mut cov) = (vec![], vec![], vec![]);
    for s in &scans {
        b.extend_from_slice(&s.b);
        r.extend_from_slice(&s.r);
        cov.extend_from_slice(&s.cov);
        offsets.push(b.len());
    }
    // One broken scan in the middle must not disturb the others.
    cov[offsets[17]] = [0.0; 36];
    let batch = BatchRef {
        offsets: &offsets,
        b: &b,
        r: PerScan::Concat(&r),
        cov: BatchCov::Full(PerScan::Concat(&cov)),
        weights: None,
    };
    let opts = Options::default();
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| solve_batch(&batch, &opts, &NoProgress).unwrap())
    };
    let one = run(1);
    let two = run(2);
    assert_eq!(one, two);
    for (k, res) in one.iter().enumerate() {
        let single = batch.scan(k).and_then(|s| solve(&s, &opts));
        assert_eq!(res, &single, "scan {k}");
        assert_eq!(res.is_err(), k == 17);
    }
}

#[test]
fn cancellation_stops_a_batch() {
    let mut rng = Rng::new(9);
    let s = scan(&mut rng, 10, 0.05, 0.8, 1.0);
    let offsets: Vec<usize> = (0..=50).map(|k| k * 10).collect();
    let b: Vec<[f64; 3]> = (0..50).flat_map(|_| s.b.clone()).collect();
    let batch = BatchRef {
        offsets: &offsets,
        b: &b,
        r: PerScan::Map(&s.r),
        cov: BatchCov::Full(PerScan::Map(&s.cov)),
        weights: None,
    };
    let flag = maleki_common::CancelFlag::new();
    flag.cancel();
    assert_eq!(
        solve_batch(&batch, &Options::default(), &flag).unwrap_err(),
        Error::Cancelled
    );
}

/// A small Monte-Carlo consistency check at the Rust level (the full T1-T8 run in pytest):
/// ANEES against the CRLB within its 99% chi-square band for M = 1000.
#[test]
fn monte_carlo_anees_matches_the_crlb() {
    let mut rng = Rng::new(10);
    let m = 1000;
    let mut sum = 0.0;
    for _ in 0..m {
        let s = scan(&mut rng, 20, 0.05, 0.8, 1.0);
        let est = solve(&full(&s), &Options::default()).unwrap();
        let truth = ScanRef {
            b: &s.r_true,
            r: &s.r_true,
            cov: Cov::Full(&s.cov),
            weights: None,
        };
        let p = crlb(&truth, &s.a).unwrap();
        let th = rot_err(&est.rotation, &s.a);
        let dt = est.translation - s.t;
        let x = nalgebra::Vector6::new(th.x, th.y, th.z, dt.x, dt.y, dt.z);
        sum += (x.transpose() * p.try_inverse().unwrap() * x)[0];
    }
    let anees = sum / (6.0 * m as f64);
    // chi2(6000) 99% band / 6000: [0.9536, 1.0475].
    assert!((0.9536..=1.0475).contains(&anees), "ANEES {anees}");
}

#[test]
fn shared_and_block_inputs_agree_with_full() {
    let mut rng = Rng::new(11);
    let s = scan(&mut rng, 9, 0.05, 0.8, 1.0);
    let m = Matrix6::from_row_slice(&s.cov[0]);
    let shared = rows(&m);
    let blk = |i: usize, j: usize| {
        let v = m.fixed_view::<3, 3>(i, j);
        let mut o = [0.0; 9];
        for a in 0..3 {
            for b in 0..3 {
                o[3 * a + b] = v[(a, b)];
            }
        }
        o
    };
    let (bb, br, rr) = (blk(0, 0), blk(0, 3), blk(3, 3));
    let e1 = solve(
        &ScanRef {
            b: &s.b,
            r: &s.r,
            cov: Cov::SharedFull(&shared),
            weights: None,
        },
        &Options::default(),
    )
    .unwrap();
    let copies = vec![shared; 9];
    let e2 = solve(
        &ScanRef {
            b: &s.b,
            r: &s.r,
            cov: Cov::Full(&copies),
            weights: None,
        },
        &Options::default(),
    )
    .unwrap();
    let e3 = solve(
        &ScanRef {
            b: &s.b,
            r: &s.r,
            cov: Cov::Blocks {
                bb: Some(Block::Shared(&bb)),
                br: Some(Block::Shared(&br)),
                rr: Some(Block::Shared(&rr)),
            },
            weights: None,
        },
        &Options::default(),
    )
    .unwrap();
    assert_eq!(e1, e2);
    assert!(
        (e1.rotation - e3.rotation).norm() < 1e-14
            && (e1.translation - e3.translation).norm() < 1e-13
    );
    // Variable projection converges to the same optimum.
    let vp = Options {
        variable_projection: true,
        ..Options::default()
    };
    let e4 = solve(
        &ScanRef {
            b: &s.b,
            r: &s.r,
            cov: Cov::Full(&s.cov),
            weights: None,
        },
        &vp,
    )
    .unwrap();
    let e5 = solve(&full(&s), &Options::default()).unwrap();
    assert!(
        (e4.rotation - e5.rotation).norm() < 1e-10
            && (e4.translation - e5.translation).norm() < 1e-9
    );
    // A given start converges to the same optimum.
    let given = Options {
        init: maleki_pose::Init::Given {
            rotation: exp_so3(&Vector3::new(0.3, 0.2, -0.1)) * s.a,
            translation: None,
        },
        ..Options::default()
    };
    let e6 = solve(&full(&s), &given).unwrap();
    assert!(
        (e6.rotation - e5.rotation).norm() < 1e-10,
        "{}",
        (e6.rotation - e5.rotation).norm()
    );
}

#[test]
fn few_very_noisy_points_converge_to_a_minimum() {
    // S5-like scans of 3 points (σ = 0.5 on a ±10 cube, 10:1 anisotropy, ρ = 0.8): the
    // residuals are large, so F is far from the Hessian and Gauss-Newton alone converged
    // linearly and slowly (13% of such scans unconverged after 100 iterations). Newton steps
    // after `NEWTON_AFTER` iterations (saddle-free where the Hessian is indefinite) converge,
    // and to a minimum of the cost.
    let mut rng = Rng::new(21);
    let total = 400;
    let mut converged = 0;
    for _ in 0..total {
        let s = scan(&mut rng, 3, 0.5, 0.8, 1.0);
        let sr = full(&s);
        let Ok(est) = solve(&sr, &Options::default()) else {
            continue;
        };
        if !est.converged {
            continue;
        }
        converged += 1;
        let (_, g0) = cost_and_gradient(&sr, &est.rotation, &est.translation).unwrap();
        let off = exp_so3(&Vector3::new(0.01, -0.01, 0.01)) * est.rotation;
        let (_, g1) = cost_and_gradient(&sr, &off, &est.translation).unwrap();
        assert!(
            g0.norm() < 1e-6 * g1.norm(),
            "|g| {:e} at a converged estimate ({:e} 0.017 rad away)",
            g0.norm(),
            g1.norm()
        );
        // A minimum, not a saddle: the Hessian (central differences of the gradient) has
        // no negative curvature beyond its rounding.
        let grad = |d: &nalgebra::Vector6<f64>| {
            let ap = exp_so3(&d.fixed_rows::<3>(0).into_owned()) * est.rotation;
            cost_and_gradient(&sr, &ap, &(est.translation + d.fixed_rows::<3>(3)))
                .unwrap()
                .1
        };
        let mut hess = Matrix6::zeros();
        for j in 0..6 {
            let mut d = nalgebra::Vector6::zeros();
            d[j] = 1e-5;
            hess.set_column(j, &((grad(&d) - grad(&-d)) / 2e-5));
        }
        let ev = ((hess + hess.transpose()) * 0.5).symmetric_eigenvalues();
        let top = ev.iter().fold(0f64, |m, v| m.max(v.abs()));
        assert!(ev.min() > -1e-6 * top, "a saddle: eigenvalues {ev:?}");
    }
    assert_eq!(converged, total, "{converged} of {total} converged");
}
