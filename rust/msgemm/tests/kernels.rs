//! Every registered kernel against the scalar oracle, bit for bit, on random (non-integer)
//! data for every plan it claims to support; the scalar kernel against the instrumented
//! reference; and thread-count independence of the driver.

use maleki_common::rng::{stream, uniform01};
use maleki_msgemm::gemm::{self, XLayout};
use maleki_msgemm::kernels::{self, Backend};
use maleki_msgemm::{
    quantize, Depth, Format, GemmOptions, PackedWeights, QuantizeOptions, TablePrecision,
};

fn gaussianish(n: usize, seed: u64) -> Vec<f32> {
    let mut r = stream(seed, 0);
    (0..n)
        .map(|_| ((uniform01(&mut r) + uniform01(&mut r) + uniform01(&mut r)) * 2.0 - 3.0) as f32)
        .collect()
}

fn weights(f: Format, m: usize, k: usize, g: usize, seed: u64) -> PackedWeights {
    let w = gaussianish(m * k, seed);
    quantize(
        &w,
        m,
        k,
        &QuantizeOptions {
            group_size: Some(g),
            ..QuantizeOptions::new(f)
        },
    )
    .unwrap()
}

const FORMATS: [Format; 9] = [
    Format::Int4,
    Format::Uint4,
    Format::Nf4,
    Format::Fp4,
    Format::Int3,
    Format::Int2,
    Format::Uint2,
    Format::Ternary,
    Format::Fp8E4m3,
];

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn registered_kernels_match_the_scalar_oracle_bitwise() {
    let (m, k, n) = (200, 640, 5);
    let x = gaussianish(k * n, 99);
    let mut compared = 0usize;
    for (i, f) in FORMATS.into_iter().enumerate() {
        for g in [64usize, 128] {
            if k % g != 0 {
                continue;
            }
            let pw = weights(f, m, k, g, i as u64);
            let cb = pw.codebook();
            for d in 1..=cb.max_byte_depth() {
                for precision in [TablePrecision::F32, TablePrecision::I16, TablePrecision::I8] {
                    for mirror in [false, true] {
                        if mirror && cb.mirror().is_none() {
                            continue;
                        }
                        let base = GemmOptions {
                            depth: Depth::Fixed(d),
                            precision,
                            backend: Backend::Scalar,
                            mirror,
                        };
                        let Ok(want) = gemm::gemm(&pw, &x, n, &base) else {
                            continue; // e.g. i16 on nf4: unsupported for every backend
                        };
                        let plan = gemm::plan(&pw, n, &base).unwrap();
                        for kernel in kernels::registered() {
                            if kernel.backend() == Backend::Scalar
                                || !kernel.available()
                                || !kernel.supports(&plan)
                            {
                                continue;
                            }
                            let got = gemm::gemm(
                                &pw,
                                &x,
                                n,
                                &GemmOptions {
                                    backend: kernel.backend(),
                                    ..base
                                },
                            )
                            .unwrap();
                            assert_eq!(
                                bits(&got),
                                bits(&want),
                                "{f:?} g={g} d={d} {precision:?} mirror={mirror} {:?}",
                                kernel.backend()
                            );
                            compared += 1;
                        }
                        if precision == TablePrecision::F32 {
                            let (r, _, _) = gemm::gemm_counted(
                                &pw,
                                &x,
                                n,
                                XLayout::KbyN,
                                &GemmOptions {
                                    backend: Backend::Reference,
                                    ..base
                                },
                            )
                            .unwrap();
                            assert_eq!(
                                bits(&r),
                                bits(&want),
                                "reference vs scalar {f:?} d={d} mirror={mirror}"
                            );
                        }
                    }
                }
            }
        }
    }
    eprintln!("{compared} (plan, SIMD kernel) pairs compared with the scalar oracle");
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let pw = weights(Format::Uint4, 333, 512, 128, 7);
    let x = gaussianish(512 * 9, 8);
    for precision in [TablePrecision::F32, TablePrecision::I16, TablePrecision::I8] {
        let opts = GemmOptions {
            precision,
            ..Default::default()
        };
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| gemm::gemm(&pw, &x, 9, &opts).unwrap())
        };
        let one = run(1);
        assert_eq!(bits(&one), bits(&run(2)), "{precision:?}");
        // 2 and 3 threads split the columns (unevenly, then evenly), 5 threads the rows.
        assert_eq!(bits(&one), bits(&run(3)), "{precision:?}");
        assert_eq!(bits(&one), bits(&run(5)), "{precision:?}");
    }
}

#[test]
fn transposed_input_layout_gives_the_same_bits() {
    let pw = weights(Format::Int4, 100, 256, 64, 3);
    let (k, n) = (256, 4);
    let x = gaussianish(k * n, 4);
    let mut xt = vec![0f32; k * n];
    for kk in 0..k {
        for c in 0..n {
            xt[c * k + kk] = x[kk * n + c];
        }
    }
    let opts = GemmOptions::default();
    let a = gemm::gemm(&pw, &x, n, &opts).unwrap();
    let mut b = vec![0f32; 100 * n];
    gemm::gemm_into(&pw, &xt, n, XLayout::NbyK, &opts, &mut b).unwrap();
    assert_eq!(bits(&a), bits(&b));
}

#[test]
fn table_sets_split_over_groups_and_columns_give_the_same_bits() {
    // A shape whose tables exceed the per-set budget forces several passes (table sets
    // reused, the next one built while the current one is looked up): the same bits as one
    // column at a time, on 1 and 2 threads.
    let pw = weights(Format::Int4, 70, 4096, 32, 5);
    let n = 64;
    let x = gaussianish(4096 * n, 6);
    for (precision, depth) in [(TablePrecision::F32, 3), (TablePrecision::I8, 2)] {
        let opts = GemmOptions {
            precision,
            depth: Depth::Fixed(depth),
            ..Default::default()
        };
        let plan = gemm::plan(&pw, n, &opts).unwrap();
        assert!(maleki_msgemm::table::block_bytes(&plan) * n * plan.groups > gemm::TABLE_BUDGET);
        let mut single = Vec::new();
        for c in 0..n {
            let xc: Vec<f32> = (0..4096).map(|kk| x[kk * n + c]).collect();
            single.push(gemm::gemm(&pw, &xc, 1, &opts).unwrap());
        }
        // 1 thread; 2 and 3 split the columns (evenly, unevenly); 9 threads split the rows.
        for threads in [1, 2, 3, 9] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let y = pool.install(|| gemm::gemm(&pw, &x, n, &opts).unwrap());
            // Y transposed, (N, M), as `linear` asks for it.
            let mut yt = vec![0f32; 70 * n];
            pool.install(|| {
                gemm::gemm_into_layout(
                    &pw,
                    &x,
                    n,
                    XLayout::KbyN,
                    gemm::YLayout::NbyM,
                    &opts,
                    &mut yt,
                )
                .unwrap()
            });
            for r in 0..70 {
                for c in 0..n {
                    let want = single[c][r].to_bits();
                    let what = format!("{precision:?} threads {threads} row {r} column {c}");
                    assert_eq!(y[r * n + c].to_bits(), want, "{what}");
                    assert_eq!(yt[c * 70 + r].to_bits(), want, "{what} (N, M)");
                }
            }
        }
    }
}

#[test]
fn results_do_not_depend_on_earlier_calls() {
    // Table sets are kept between calls and reused without clearing their entries when the
    // plan has the same table geometry (zeroed otherwise): a call's bits must not depend on
    // what ran before it. Mixed geometries (precision, slot, partial last tuples, mirror),
    // N = 1 (shared sets) and N = 6 (column tasks), on 1 and 2 threads.
    let cases: Vec<(PackedWeights, GemmOptions, usize)> = vec![
        (
            weights(Format::Int4, 130, 256, 128, 1),
            GemmOptions::default(),
            1,
        ),
        (
            weights(Format::Int4, 130, 256, 128, 2),
            GemmOptions::default(),
            6,
        ),
        (
            weights(Format::Int4, 70, 96, 32, 3),
            GemmOptions {
                depth: Depth::Fixed(3),
                precision: TablePrecision::F32,
                ..Default::default()
            },
            6,
        ),
        (
            weights(Format::Uint4, 70, 192, 64, 4),
            GemmOptions {
                precision: TablePrecision::I16,
                ..Default::default()
            },
            1,
        ),
        (
            weights(Format::Int3, 65, 96, 32, 5),
            GemmOptions {
                depth: Depth::Fixed(3),
                ..Default::default()
            },
            6,
        ),
        (
            weights(Format::Int4, 64, 128, 64, 6),
            GemmOptions {
                mirror: true,
                ..Default::default()
            },
            6,
        ),
    ];
    let run = |i: usize, threads: usize| {
        let (pw, opts, n) = &cases[i];
        let x = gaussianish(pw.k() * n, 100 + i as u64);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        bits(&pool.install(|| gemm::gemm(pw, &x, *n, opts).unwrap()))
    };
    let first: Vec<Vec<u32>> = (0..cases.len()).map(|i| run(i, 1)).collect();
    for threads in [1, 2] {
        for i in (0..cases.len()).rev() {
            assert_eq!(
                run(i, threads),
                first[i],
                "case {i}, {threads} threads, reversed"
            );
        }
        for i in [3, 0, 2, 5, 1, 4, 0, 2] {
            assert_eq!(
                run(i, threads),
                first[i],
                "case {i}, {threads} threads, mixed"
            );
        }
    }
}
