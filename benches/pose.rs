//! Criterion benches of the TLS pose core (pose.md §8: B1 latency vs N, B2 batch throughput,
//! B3 per-point-per-iteration cost). One thread unless stated: the batch benches run inside a
//! 1-thread rayon pool so that the figures are per core.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use maleki_rs::common::progress::NoProgress;
use maleki_rs::common::rng::{standard_normal, stream, uniform01, StreamRng};
use maleki_rs::pose::{
    absolute_orientation, absolute_orientation_batch, solve, solve_batch, BatchCov, BatchRef, Cov,
    Options, PerScan, ScanRef,
};
use nalgebra::{Cholesky, Matrix3, Matrix6, UnitQuaternion, Vector3, Vector6};
use std::hint::black_box;

struct Data {
    b: Vec<[f64; 3]>,
    r: Vec<[f64; 3]>,
    cov: Vec<[f64; 36]>,
}

fn rotation(rng: &mut StreamRng) -> Matrix3<f64> {
    let q = nalgebra::Quaternion::new(
        standard_normal(rng),
        standard_normal(rng),
        standard_normal(rng),
        standard_normal(rng),
    );
    UnitQuaternion::from_quaternion(q)
        .to_rotation_matrix()
        .into_inner()
}

/// S1-style scans: landmarks in a ±10 m cube, 10:1 anisotropic blocks with rms 5 cm, ρ = 0.8.
fn scans(seed: u64, n_scans: usize, n: usize) -> Data {
    let mut rng = stream(seed, 0);
    let mut d = Data {
        b: vec![],
        r: vec![],
        cov: vec![],
    };
    let std = {
        let s = [1.0, 10f64.sqrt(), 10.0];
        let rms = ((s[0] * s[0] + s[1] * s[1] + s[2] * s[2]) / 3.0).sqrt();
        Vector3::new(s[0], s[1], s[2]) * (0.05 / rms)
    };
    for _ in 0..n_scans {
        let a = rotation(&mut rng);
        let t = Vector3::new(
            standard_normal(&mut rng),
            standard_normal(&mut rng),
            standard_normal(&mut rng),
        ) * 5.0;
        for _ in 0..n {
            let r = Vector3::from_fn(|_, _| 20.0 * uniform01(&mut rng) - 10.0);
            let (qb, qr, c) = (rotation(&mut rng), rotation(&mut rng), rotation(&mut rng));
            let hb = qb * Matrix3::from_diagonal(&std) * qb.transpose();
            let hr = qr * Matrix3::from_diagonal(&std) * qr.transpose();
            let mut m = Matrix6::zeros();
            m.fixed_view_mut::<3, 3>(0, 0).copy_from(&(hb * hb));
            m.fixed_view_mut::<3, 3>(3, 3).copy_from(&(hr * hr));
            let br = hb * c * hr * 0.8;
            m.fixed_view_mut::<3, 3>(0, 3).copy_from(&br);
            m.fixed_view_mut::<3, 3>(3, 0).copy_from(&br.transpose());
            let z =
                Cholesky::new(m).unwrap().l() * Vector6::from_fn(|_, _| standard_normal(&mut rng));
            let b = a * r + t + z.fixed_rows::<3>(0);
            let rn = r + z.fixed_rows::<3>(3);
            d.b.push([b.x, b.y, b.z]);
            d.r.push([rn.x, rn.y, rn.z]);
            let mut c36 = [0.0; 36];
            for i in 0..6 {
                for j in 0..6 {
                    c36[6 * i + j] = m[(i, j)];
                }
            }
            d.cov.push(c36);
        }
    }
    d
}

fn one_thread<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap()
        .install(f)
}

fn b1_latency(c: &mut Criterion) {
    let mut g = c.benchmark_group("pose/B1 latency");
    let opts = Options::default();
    for &n in &[3usize, 10, 20, 100, 1000, 10_000] {
        let d = scans(1, 1, n);
        let scan = ScanRef {
            b: &d.b,
            r: &d.r,
            cov: Cov::Full(&d.cov),
            weights: None,
        };
        let iters = solve(&scan, &opts).unwrap().iterations;
        g.throughput(Throughput::Elements((n * iters) as u64)); // point-iterations (B3)
        g.bench_with_input(BenchmarkId::new("estimate_pose", n), &scan, |bch, s| {
            bch.iter(|| solve(black_box(s), &opts).unwrap())
        });
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::new("absolute_orientation", n), &d, |bch, d| {
            bch.iter(|| absolute_orientation(black_box(&d.b), black_box(&d.r), None).unwrap())
        });
    }
    g.finish();
}

fn b2_batch(c: &mut Criterion) {
    let mut g = c.benchmark_group("pose/B2 batch N=20, 1 thread");
    let n = 20;
    let nb = 2000;
    let d = scans(2, nb, n);
    let offsets: Vec<usize> = (0..=nb).map(|k| k * n).collect();
    let batch = BatchRef {
        offsets: &offsets,
        b: &d.b,
        r: PerScan::Concat(&d.r),
        cov: BatchCov::Full(PerScan::Concat(&d.cov)),
        weights: None,
    };
    let opts = Options::default();
    g.throughput(Throughput::Elements(nb as u64));
    g.bench_function("estimate_pose_batch", |bch| {
        bch.iter(|| one_thread(|| solve_batch(black_box(&batch), &opts, &NoProgress).unwrap()))
    });
    g.bench_function("absolute_orientation_batch", |bch| {
        bch.iter(|| {
            one_thread(|| {
                absolute_orientation_batch(
                    &offsets,
                    black_box(&d.b),
                    PerScan::Concat(&d.r),
                    None,
                    &NoProgress,
                )
                .unwrap()
            })
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = b1_latency, b2_batch
}
criterion_main!(benches);
