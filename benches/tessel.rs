//! Criterion benches of the Tessel search on one thread: the whole search (repetend,
//! completion, candidates) for N = 128 micro-batches at 4, 6 and 8 devices, the exact
//! solver on the small instances of spec §9, and the list-scheduling baselines at N = 4000
//! (generation and timing). The side-by-side comparison with CP-SAT is
//! `benches/tessel_bench.py`.

use criterion::{criterion_group, criterion_main, Criterion};
use maleki_rs::common::NoProgress;
use maleki_rs::tessel::baselines::baseline;
use maleki_rs::tessel::exact::{solve, ExactOptions};
use maleki_rs::tessel::premises::{builtin, Options};
use maleki_rs::tessel::{search, MemoryConvention, SearchOptions, UNLIMITED};
use std::sync::Arc;

fn bench_search(c: &mut Criterion) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a pool of one thread");
    let mut g = c.benchmark_group("tessel_search_n128_1thread");
    g.sample_size(10);
    for (name, d, mem) in [
        ("vshape", 4, 4),
        ("xshape", 4, 4),
        ("mshape", 4, 6),
        ("nnshape", 4, 6),
        ("kshape", 4, 6),
        ("mshape", 6, 20),
        ("nnshape", 6, 20),
        ("mshape", 8, 20),
        ("nnshape", 8, 20),
        ("xshape", 8, 20),
    ] {
        let p = builtin(name, d, &Options::default()).expect("built-in premise");
        let o = SearchOptions::new(vec![mem; d], 128);
        g.bench_function(format!("{name}_D{d}_M{mem}"), |b| {
            b.iter(|| pool.install(|| search(&p, &o, &NoProgress).expect("search")))
        });
    }
    g.finish();
}

fn bench_exact(c: &mut Criterion) {
    let mut g = c.benchmark_group("tessel_exact");
    g.sample_size(10);
    for (name, mem, n) in [
        ("vshape", 4, 4),
        ("xshape", 4, 3),
        ("mshape", 6, 4),
        ("kshape", 6, 3),
    ] {
        let p = builtin(name, 4, &Options::default()).expect("built-in premise");
        let caps = vec![mem; 4];
        g.bench_function(format!("{name}_M{mem}_N{n}"), |b| {
            b.iter(|| {
                solve(
                    &p,
                    n,
                    &caps,
                    MemoryConvention::Start,
                    None,
                    &ExactOptions::default(),
                    &NoProgress,
                )
                .expect("exact")
            })
        });
    }
    let p = builtin("nnshape", 4, &Options::inference()).expect("built-in premise");
    g.bench_function("nnshape_inference_N6", |b| {
        b.iter(|| {
            solve(
                &p,
                6,
                &[UNLIMITED; 4],
                MemoryConvention::Start,
                None,
                &ExactOptions::default(),
                &NoProgress,
            )
        })
    });
    g.finish();
}

/// The baselines that run the list-scheduling greedy (premises with tensor-parallel blocks),
/// and a textbook one beside them, at N = 4000 micro-batches.
fn bench_baselines(c: &mut Criterion) {
    let mut g = c.benchmark_group("tessel_baselines_n4000");
    g.sample_size(10);
    for (name, b) in [
        ("mshape", "1f1b"),
        ("mshape", "gpipe"),
        ("nnshape", "1f1b"),
        ("vshape", "1f1b"),
    ] {
        let p = Arc::new(builtin(name, 4, &Options::default()).expect("built-in premise"));
        g.bench_function(format!("{name}_D4_{b}"), |bch| {
            bch.iter(|| baseline(b, p.clone(), 4000).expect("baseline"))
        });
    }
    g.finish();
}

criterion_group!(benches, bench_search, bench_exact, bench_baselines);
criterion_main!(benches);
