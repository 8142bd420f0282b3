//! Exact oracles of the core: on integer data every backend, depth and precision mode that is
//! exact reproduces the float64 dequantized product bit for bit (spec section 8.1).

use maleki_common::rng::{below, stream};
use maleki_msgemm::count::{compare, formula, CountParams};
use maleki_msgemm::kernels::{self, Backend};
use maleki_msgemm::{
    gemm, gemm_counted, Codebook, Depth, Format, GemmOptions, PackedWeights, TablePrecision,
};

fn random_weights(
    f: Format,
    m: usize,
    k: usize,
    g: usize,
    zeros: bool,
    seed: u64,
) -> PackedWeights {
    let cb = Codebook::new(f).unwrap();
    let mut r = stream(seed, 0);
    let codes: Vec<u8> = (0..m * k)
        .map(|_| loop {
            let c = below(&mut r, cb.levels() as u64) as u8;
            if cb.valid_code(c) {
                break c;
            }
        })
        .collect();
    let groups = k / g;
    // Power-of-two scales and integer zero points keep every partial sum exact.
    let scales: Vec<f32> = (0..m * groups)
        .map(|_| 2f32.powi(below(&mut r, 4) as i32 - 2))
        .collect();
    let z = zeros.then(|| {
        (0..m * groups)
            .map(|_| below(&mut r, 5) as f32 - 1.0)
            .collect()
    });
    PackedWeights::from_codes(cb, m, k, g, &codes, scales, z, None).unwrap()
}

fn int_x(k: usize, n: usize, seed: u64) -> Vec<f32> {
    let mut r = stream(seed, 1);
    (0..k * n).map(|_| below(&mut r, 17) as f32 - 8.0).collect()
}

fn reference(pw: &PackedWeights, x: &[f32], n: usize) -> Vec<f32> {
    let w = pw.dequantize();
    let (m, k) = (pw.m(), pw.k());
    let mut y = vec![0f32; m * n];
    for i in 0..m {
        for c in 0..n {
            let s: f64 = (0..k).map(|j| w[i * k + j] * f64::from(x[j * n + c])).sum();
            y[i * n + c] = s as f32;
            assert_eq!(s as f32 as f64, s, "test data must keep sums exact");
        }
    }
    y
}

#[test]
fn f32_tables_are_exact_on_integer_data_for_every_format_depth_and_kernel() {
    let cases = [
        (Format::Int4, vec![1, 2, 3]),
        (Format::Uint4, vec![2]),
        (Format::Int3, vec![1, 2, 3]),
        (Format::Int2, vec![2, 4, 5]),
        (Format::Ternary, vec![3, 5]),
        (Format::Fp4, vec![1, 2, 3]),
    ];
    let (m, k, g) = (70, 96, 32);
    for (i, (f, depths)) in cases.into_iter().enumerate() {
        for zeros in [false, true] {
            let pw = random_weights(f, m, k, g, zeros, i as u64);
            for n in [1usize, 3] {
                let x = int_x(k, n, i as u64 + 10);
                let want = reference(&pw, &x, n);
                for &d in &depths {
                    for mirror in [false, true] {
                        if mirror && pw.codebook().mirror().is_none() {
                            continue;
                        }
                        let opts = GemmOptions {
                            depth: Depth::Fixed(d),
                            precision: TablePrecision::F32,
                            backend: Backend::Scalar,
                            mirror,
                        };
                        let base = opts;
                        for k_impl in kernels::registered() {
                            let opts = GemmOptions {
                                backend: k_impl.backend(),
                                ..base
                            };
                            let plan = maleki_msgemm::gemm::plan(&pw, n, &opts).unwrap();
                            if !k_impl.available() || !k_impl.supports(&plan) {
                                continue;
                            }
                            let y = gemm(&pw, &x, n, &opts).unwrap();
                            assert_eq!(
                                y, want,
                                "{f:?} zeros={zeros} n={n} d={d} mirror={mirror} {:?}",
                                opts.backend
                            );
                        }
                        let (y, counts, plan) = gemm_counted(
                            &pw,
                            &x,
                            n,
                            maleki_msgemm::XLayout::KbyN,
                            &GemmOptions {
                                backend: Backend::Reference,
                                ..base
                            },
                        )
                        .unwrap();
                        assert_eq!(y, want, "reference {f:?} d={d}");
                        let p = CountParams {
                            m: m as u64,
                            k: k as u64,
                            n: n as u64,
                            levels: pw.codebook().levels() as u64,
                            depth: d as u64,
                            group_size: g as u64,
                            zero_term: plan.zero_term,
                            mirror,
                        };
                        assert_eq!(
                            counts,
                            formula(&p),
                            "{f:?} d={d} mirror={mirror} zeros={zeros}"
                        );
                        assert!(compare(&p, &counts).mac_ratio > 0.0);
                    }
                }
            }
        }
    }
}

#[test]
fn auto_depth_and_default_options_run() {
    let pw = random_weights(Format::Int4, 130, 256, 128, false, 5);
    let x = int_x(256, 2, 6);
    let y = gemm(
        &pw,
        &x,
        2,
        &GemmOptions {
            precision: TablePrecision::F32,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(y, reference(&pw, &x, 2));
    // The operation-count model (scalar kernel): M = 130 is too small for depth 2 to pay
    // (R(1) = 1 > R(2) = 0.67).
    let scalar = GemmOptions {
        backend: maleki_msgemm::Backend::Scalar,
        ..Default::default()
    };
    let p = maleki_msgemm::gemm::plan(&pw, 1, &scalar).unwrap();
    assert_eq!(p.depth(), 1);
    // The AVX-512 kernel is measured fastest at depth 2 for int4 at every M.
    let avx512 = maleki_msgemm::kernels::registered()
        .into_iter()
        .any(|k| k.backend() == maleki_msgemm::Backend::Avx512 && k.available());
    let p = maleki_msgemm::gemm::plan(&pw, 1, &GemmOptions::default()).unwrap();
    assert_eq!(p.depth(), if avx512 { 2 } else { 1 });
}

#[test]
fn i8_tables_refuse_groups_whose_int32_sums_could_wrap() {
    // One row of per-channel int4 weights, every code 0 (value -8), x all ones: every tuple's
    // entry is -127 and the multipliers fill each chunk's budget, the largest sums the i8
    // tables make. At the largest group the plan allows the GEMV is -8 K within the i8
    // rounding; a group past it is refused (before stop 41 the bound let groups of 6 M
    // inputs through, whose int32 sums wrapped: +1.96e7 for -4.8e7).
    use maleki_msgemm::plan::I8_MAX_TUPLES;
    let cb = Codebook::new(Format::Int4).unwrap();
    let opts = |depth| GemmOptions {
        depth: Depth::Fixed(depth),
        precision: TablePrecision::I8,
        backend: Backend::Auto,
        mirror: false,
    };
    let k = I8_MAX_TUPLES;
    let pw = PackedWeights::from_codes(cb.clone(), 1, k, k, &vec![0u8; k], vec![1.0], None, None)
        .unwrap();
    let y = gemm(&pw, &vec![1.0f32; k], 1, &opts(1)).unwrap();
    let want = -8.0 * k as f64;
    assert!(
        (f64::from(y[0]) - want).abs() <= 1e-3 * want.abs(),
        "{} vs {want}",
        y[0]
    );
    let k = I8_MAX_TUPLES + 2;
    let pw = PackedWeights::from_codes(cb, 1, k, k, &vec![0u8; k], vec![1.0], None, None).unwrap();
    let x = vec![1.0f32; k];
    let err = gemm(&pw, &x, 1, &opts(1)).unwrap_err().to_string();
    assert!(
        err.contains("group too long for int32 partial sums"),
        "{err}"
    );
    // At depth 2 the same group is half as many tuples.
    assert!(gemm(&pw, &x, 1, &opts(2)).is_ok());
}
