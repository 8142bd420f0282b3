//! Criterion benches of the msGeMM kernels (spec section 9): table build alone, GEMV and small
//! batches through the fastest kernel of this CPU and through the scalar one, on the library's
//! pool with 2 threads (`MALEKI_BENCH_THREADS` overrides). Anchors (numpy, ONNX Runtime) are
//! measured by `benches/msgemm_bench.py`, which writes BENCHMARKS.md.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use maleki_rs::common::{pool, rng};
use maleki_rs::msgemm::gemm::{plan, transpose_permute, XLayout};
use maleki_rs::msgemm::kernels::{self, Backend};
use maleki_rs::msgemm::table::TableSet;
use maleki_rs::msgemm::{
    gemm_into, quantize, Depth, Format, GemmOptions, PackedWeights, QuantizeOptions, TablePrecision,
};

fn gaussian(len: usize, seed: u64) -> Vec<f32> {
    let mut r = rng::stream(seed, 0);
    (0..len)
        .map(|_| {
            // Sum of 4 uniforms: a cheap bell-shaped distribution.
            let s: f64 = (0..4)
                .map(|_| rng::below(&mut r, 1 << 30) as f64 / (1u64 << 30) as f64)
                .sum();
            (s - 2.0) as f32
        })
        .collect()
}

fn weights(format: Format, m: usize, k: usize, g: usize, symmetric: bool) -> PackedWeights {
    let w = gaussian(m * k, 1);
    let opts = QuantizeOptions {
        group_size: Some(g),
        symmetric: Some(symmetric),
        ..QuantizeOptions::new(format)
    };
    quantize(&w, m, k, &opts).unwrap()
}

fn threads() -> usize {
    std::env::var("MALEKI_BENCH_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2)
}

fn bench_gemv(c: &mut Criterion) {
    pool::set_num_threads(threads()).unwrap();
    let (m, k) = (4096usize, 4096usize);
    let cases = [
        ("int4_g128", Format::Int4, 128, true, 2),
        ("uint4_zp_g128", Format::Uint4, 128, false, 2),
        ("int2_g64", Format::Int2, 64, true, 4),
        ("ternary_g128", Format::Ternary, 128, true, 5),
        ("nf4_g128", Format::Nf4, 128, true, 2),
    ];
    let mut group = c.benchmark_group("msgemm_gemv_4096x4096");
    group.sample_size(30);
    for (name, f, g, sym, d) in cases {
        let pw = weights(f, m, k, g, sym);
        let x = gaussian(k, 2);
        let mut y = vec![0f32; m];
        group.throughput(Throughput::Bytes(pw.nbytes() as u64));
        for backend in [Backend::Auto, Backend::Scalar] {
            let opts = GemmOptions {
                depth: Depth::Fixed(d),
                precision: TablePrecision::I8,
                backend,
                mirror: false,
            };
            // Warm the cached tile layout.
            gemm_into(&pw, &x, 1, XLayout::KbyN, &opts, &mut y).unwrap();
            group.bench_function(BenchmarkId::new(name, backend.name()), |b| {
                b.iter(|| {
                    pool::install(|| {
                        gemm_into(&pw, black_box(&x), 1, XLayout::KbyN, &opts, &mut y).unwrap()
                    })
                })
            });
        }
    }
    group.finish();
}

fn bench_tables(c: &mut Criterion) {
    pool::set_num_threads(threads()).unwrap();
    let pw = weights(Format::Int4, 64, 4096, 128, true);
    let x = gaussian(4096, 3);
    let opts = GemmOptions {
        depth: Depth::Fixed(2),
        precision: TablePrecision::I8,
        backend: Backend::Auto,
        mirror: false,
    };
    let p = plan(&pw, 1, &opts).unwrap();
    let xt = transpose_permute(&pw, &x, 1, XLayout::KbyN).unwrap();
    let mut group = c.benchmark_group("msgemm_tables_k4096_int4_d2_i8");
    for k in kernels::registered().into_iter().filter(|k| k.available()) {
        group.bench_function(k.backend().name(), |b| {
            b.iter(|| {
                let mut set = TableSet::zeroed(&p, 0..p.groups, 0..1);
                pool::install(|| {
                    if !k.build_tables(&p, &xt, &mut set, true) {
                        maleki_rs::msgemm::table::build_scalar(&p, &xt, &mut set, true);
                    }
                });
                black_box(set.tscale[0])
            })
        });
    }
    group.finish();
}

fn bench_batch(c: &mut Criterion) {
    pool::set_num_threads(threads()).unwrap();
    let (m, k) = (4096usize, 4096usize);
    let pw = weights(Format::Int4, m, k, 128, true);
    let mut group = c.benchmark_group("msgemm_batch_int4_g128_4096x4096");
    group.sample_size(10);
    for n in [4usize, 16, 64] {
        let x = gaussian(k * n, 4);
        let mut y = vec![0f32; m * n];
        let opts = GemmOptions {
            depth: Depth::Fixed(2),
            precision: TablePrecision::I8,
            backend: Backend::Auto,
            mirror: false,
        };
        gemm_into(&pw, &x, n, XLayout::KbyN, &opts, &mut y).unwrap();
        group.throughput(Throughput::Elements((m * k * n) as u64));
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| {
                pool::install(|| {
                    gemm_into(&pw, black_box(&x), n, XLayout::KbyN, &opts, &mut y).unwrap()
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_tables, bench_gemv, bench_batch);
criterion_main!(benches);
