//! Every SIMD backend equals the scalar kernel bit for bit (the contract of `KERNELS.md`) on
//! random, non-integer data: every format, depth with byte indices, table precision, mirror
//! setting, group size (including depths that do not divide it), zero points, ragged M and
//! several N. The SIMD table builds are compared with the scalar build entry by entry.

use maleki_common::rng::{below, stream};
use maleki_msgemm::gemm::{plan as make_plan, transpose_permute, XLayout};
use maleki_msgemm::kernels::{self, Backend, LutKernel};
use maleki_msgemm::layout::LayoutKind;
use maleki_msgemm::table::{build_scalar, TableData, TableSet};
use maleki_msgemm::{
    gemm, Codebook, Depth, Format, GemmOptions, PackedWeights, Plan, TablePrecision,
};

fn uniform(r: &mut maleki_common::rng::StreamRng, lo: f32, hi: f32) -> f32 {
    let u = below(r, 1 << 24) as f32 / (1u32 << 24) as f32;
    lo + (hi - lo) * u
}

fn weights(cb: &Codebook, m: usize, k: usize, g: usize, zeros: bool, seed: u64) -> PackedWeights {
    weights_from(cb, m, k, g, zeros, seed, 0)
}

/// Random weights using the valid codes `>= lowest` only (symmetric RTN int4 / int2 weights
/// never use code 0, the most negative value).
fn weights_from(
    cb: &Codebook,
    m: usize,
    k: usize,
    g: usize,
    zeros: bool,
    seed: u64,
    lowest: u8,
) -> PackedWeights {
    let mut r = stream(seed, 0);
    let codes: Vec<u8> = (0..m * k)
        .map(|_| loop {
            let c = below(&mut r, cb.levels() as u64) as u8;
            if cb.valid_code(c) && c >= lowest {
                break c;
            }
        })
        .collect();
    let groups = k / g;
    let scales: Vec<f32> = (0..m * groups)
        .map(|_| uniform(&mut r, 0.01, 0.2))
        .collect();
    let z = zeros.then(|| {
        (0..m * groups)
            .map(|_| uniform(&mut r, -2.0, 9.0))
            .collect()
    });
    PackedWeights::from_codes(cb.clone(), m, k, g, &codes, scales, z, None).unwrap()
}

/// `pw` with its scales rounded to float16 values and its zero points to multiples of 1/4
/// (float16 values, also after a codebook's mirror shift of a half).
fn with_f16_scales(pw: &PackedWeights) -> PackedWeights {
    let round =
        |v: &[f32]| -> Vec<f32> { v.iter().map(|&s| half::f16::from_f32(s).to_f32()).collect() };
    let quarters = |v: &[f32]| -> Vec<f32> { v.iter().map(|&z| (z * 4.0).round() / 4.0).collect() };
    PackedWeights::from_codes(
        pw.codebook().clone(),
        pw.m(),
        pw.k(),
        pw.group_size(),
        &pw.codes().unwrap(),
        round(pw.scales()),
        pw.zeros().map(quarters),
        None,
    )
    .unwrap()
}

/// Equal length and equal bits everywhere.
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

fn activations(k: usize, n: usize, seed: u64) -> Vec<f32> {
    let mut r = stream(seed, 1);
    (0..k * n)
        .map(|i| {
            // A few all-zero stretches exercise the maxabs = 0 path of the i8/i16 builds.
            if (i / n) % 97 < 3 {
                0.0
            } else {
                uniform(&mut r, -3.0, 3.0)
            }
        })
        .collect()
}

/// Table sets equal entry by entry, except the `i8` entries of codes absent from the weights
/// (never looked up; unspecified by the contract).
fn same_tables(plan: &Plan, a: &TableSet, b: &TableSet) -> bool {
    if a.tscale != b.tscale || a.zsum != b.zsum || a.mult != b.mult {
        return false;
    }
    match (&a.data, &b.data) {
        (TableData::I8(x), TableData::I8(y)) => {
            x.len() == y.len()
                && x.iter().zip(y).enumerate().all(|(i, (p, q))| {
                    let t = (i / plan.slot) % plan.tuples.per_group;
                    let idx = i % plan.slot;
                    p == q || !plan.stored_used(idx, plan.tuples.depth_of(t))
                })
        }
        _ => a == b,
    }
}

fn simd_kernels() -> Vec<&'static dyn LutKernel> {
    kernels::registered()
        .into_iter()
        .filter(|k| k.backend() != Backend::Scalar && k.available())
        .collect()
}

/// Runs `gemm` with the scalar kernel and with every available SIMD kernel that implements the
/// plan of `base` (skipped when `base` has no plan), and asserts equal bits; `then(kernel,
/// plan)` runs after each comparison. Returns the number of SIMD kernels compared.
fn each_simd_kernel(
    pw: &PackedWeights,
    x: &[f32],
    n: usize,
    base: GemmOptions,
    what: &str,
    mut then: impl FnMut(&dyn LutKernel, &Plan),
) -> usize {
    let Ok(plan) = make_plan(pw, n, &base) else {
        return 0;
    };
    let want = gemm(pw, x, n, &base).unwrap();
    let mut ran = 0;
    for k in simd_kernels() {
        if !k.supports(&plan) {
            continue;
        }
        let opts = GemmOptions {
            backend: k.backend(),
            ..base
        };
        let got = gemm(pw, x, n, &opts).unwrap();
        let bad = got
            .iter()
            .zip(&want)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        assert!(
            bad.is_none(),
            "{what} {:?} n={n} {base:?}: first mismatch at {:?}: {} vs {}",
            k.backend(),
            bad,
            got[bad.unwrap()],
            want[bad.unwrap()]
        );
        then(k, &plan);
        ran += 1;
    }
    ran
}

/// Compares every available SIMD kernel with the scalar one for one weight matrix.
fn check(pw: &PackedWeights, depths: &[usize], what: &str) -> usize {
    let mut ran = 0;
    for n in [1usize, 3, 17] {
        let x = activations(pw.k(), n, 7 + n as u64);
        for &d in depths {
            for precision in [TablePrecision::I8, TablePrecision::I16, TablePrecision::F32] {
                for mirror in [false, true] {
                    let base = GemmOptions {
                        depth: Depth::Fixed(d),
                        precision,
                        backend: Backend::Scalar,
                        mirror,
                    };
                    ran += each_simd_kernel(pw, &x, n, base, what, |k, plan| {
                        // The SIMD table build writes exactly the scalar entries.
                        let xt = transpose_permute(pw, &x, n, XLayout::KbyN).unwrap();
                        let mut a = TableSet::zeroed(plan, 0..plan.groups, 0..n);
                        let mut b = a.clone();
                        let mut c = a.clone();
                        if k.build_tables(plan, &xt, &mut a, true) {
                            // On the pool and on this thread alone: the same entries.
                            build_scalar(plan, &xt, &mut b, false);
                            assert!(k.build_tables(plan, &xt, &mut c, false));
                            assert!(
                                same_tables(plan, &a, &b) && same_tables(plan, &c, &b),
                                "{what} {:?} table build differs: n={n} d={d} {precision:?} mirror={mirror}",
                                k.backend()
                            );
                        }
                    });
                }
            }
        }
    }
    ran
}

#[test]
fn simd_equals_scalar_bitwise_on_every_format() {
    if simd_kernels().is_empty() {
        eprintln!("no SIMD kernel available on this CPU: nothing to compare");
        return;
    }
    let cases: Vec<(Codebook, Vec<usize>)> = vec![
        (Codebook::new(Format::Int4).unwrap(), vec![1, 2]),
        (Codebook::new(Format::Uint4).unwrap(), vec![1, 2]),
        (Codebook::new(Format::Int3).unwrap(), vec![1, 2]),
        (Codebook::new(Format::Uint3).unwrap(), vec![2]),
        (Codebook::new(Format::Int2).unwrap(), vec![1, 2, 3, 4]),
        (Codebook::new(Format::Uint2).unwrap(), vec![4]),
        (Codebook::new(Format::Ternary).unwrap(), vec![1, 2, 3, 4, 5]),
        (Codebook::new(Format::Fp4).unwrap(), vec![1, 2]),
        (Codebook::new(Format::Nf4).unwrap(), vec![1, 2]),
        (
            Codebook::custom(&[-1.5, -0.25, 0.5, 2.0, 3.25]).unwrap(),
            vec![1, 2, 3],
        ),
        (Codebook::new(Format::Fp8E4m3).unwrap(), vec![1]),
        // Two levels: 256-entry tables at depth 8 (four digits inside a 16-entry vector).
        (Codebook::custom(&[-1.25, 0.75]).unwrap(), vec![1, 4, 8]),
    ];
    let mut ran = 0;
    for (i, (cb, depths)) in cases.iter().enumerate() {
        for (m, k, g) in [
            (70usize, 128usize, 32usize),
            (200, 192, 64),
            (129, 256, 128),
        ] {
            for zeros in [false, true] {
                let pw = weights(cb, m, k, g, zeros, (i * 10 + m) as u64);
                ran += check(
                    &pw,
                    depths,
                    &format!("{} m={m} g={g} zeros={zeros}", cb.format().name()),
                );
                // The same with float16 scales and zero points (read as float16).
                let pw = with_f16_scales(&pw);
                assert!(pw.scales_are_f16());
                ran += check(
                    &pw,
                    depths,
                    &format!(
                        "{} m={m} g={g} zeros={zeros} f16 scales",
                        cb.format().name()
                    ),
                );
            }
        }
    }
    assert!(ran > 100, "only {ran} comparisons ran");
}

#[test]
fn long_groups_spill_int16_partial_sums() {
    if simd_kernels().is_empty() {
        return;
    }
    // Per-channel scales (G = K = 1536): 768 tuples at d = 2, well past the int16 chunks.
    // (Depth 2 of int4 and depths 4-5 of ternary are AVX-512 plans; an AVX2-only CPU checks
    // depth 1 of int4 and depth 2 of ternary.)
    let cb = Codebook::new(Format::Int4).unwrap();
    let pw = weights(&cb, 65, 1536, 1536, true, 3);
    assert!(check(&pw, &[1, 2], "per-channel") > 0);
    // Tuples that do not divide the group (G = 96, d = 5: last tuple of depth 1).
    let cb = Codebook::new(Format::Ternary).unwrap();
    let pw = weights(&cb, 64, 192, 96, false, 4);
    assert!(check(&pw, &[5, 4, 2], "ragged tuples") > 0);
}

#[test]
fn paired_layouts_with_odd_tuple_counts() {
    // The AVX2 kernel reads two tuples' 4-bit indices per byte; a group with an odd number of
    // tuples ends in a half-filled pair, and groups past one int16 chunk (64 tuples) in a
    // chunk of one tuple. Plain and sign-magnitude (mirror) layouts, the paired form built
    // from packed bytes (int4 d = 1, int2 d = 2 with even tuple counts) and by pairing.
    if simd_kernels().is_empty() {
        return;
    }
    let cases = [
        (Format::Int4, 33usize, 1usize, 132usize), // 33 tuples
        (Format::Int4, 129, 1, 258),               // chunks of 64, 64, 1
        (Format::Int4, 128, 1, 256),               // from packed bytes
        (Format::Nf4, 130, 1, 260),                // 130 tuples: 64, 64, 2
        (Format::Int2, 30, 2, 120),                // 15 tuples of depth 2
        (Format::Int2, 31, 2, 124),                // 16 tuples, the last of depth 1
        (Format::Int2, 64, 2, 128),                // from packed bytes
        (Format::Ternary, 10, 2, 40),              // 5 tuples of 9-entry tables
        (Format::Int3, 15, 1, 45),
    ];
    for (i, &(f, g, d, k)) in cases.iter().enumerate() {
        let cb = Codebook::new(f).unwrap();
        for zeros in [false, true] {
            let pw = weights_from(&cb, 77, k, g, zeros, 90 + i as u64, 1);
            let ran = check(&pw, &[d], &format!("{f:?} g={g} d={d} paired"));
            assert!(ran > 0, "{f:?} g={g}: no SIMD kernel ran");
        }
    }
}

#[test]
fn simd_builds_match_the_scalar_build_on_subnormal_and_nan_groups() {
    // Found in review: a group whose largest entry is a few subnormal ulps (`127 / A`
    // overflows, `tscale` underflows to 0) has saturated entries in the scalar build, and a NaN
    // activation (which `gemm` rejects before any build, but `build_tables` is public) gives 0
    // entries there. Every SIMD build must write the same entries, even ones never looked up.
    let cb = Codebook::new(Format::Int4).unwrap();
    let codes: Vec<u8> = (0..64 * 32).map(|i| (i % 16) as u8).collect();
    let pw = PackedWeights::from_codes(cb, 64, 32, 32, &codes, vec![0.1; 64], None, None).unwrap();
    let mut nan: Vec<f32> = (0..32).map(|i| i as f32 * 0.1 - 1.0).collect();
    nan[3] = f32::NAN;
    for xt in [
        vec![f32::from_bits(1); 32],
        vec![f32::from_bits(3); 32],
        nan,
    ] {
        for d in [1usize, 2] {
            let opts = GemmOptions {
                depth: Depth::Fixed(d),
                precision: TablePrecision::I8,
                backend: Backend::Scalar,
                mirror: false,
            };
            let plan = make_plan(&pw, 1, &opts).unwrap();
            let mut want = TableSet::zeroed(&plan, 0..1, 0..1);
            build_scalar(&plan, &xt, &mut want, false);
            for k in simd_kernels() {
                let mut got = TableSet::zeroed(&plan, 0..1, 0..1);
                if !k.supports(&plan) || !k.build_tables(&plan, &xt, &mut got, false) {
                    continue;
                }
                assert_eq!(got.data, want.data, "{:?} d={d} x0={}", k.backend(), xt[0]);
                assert_eq!(got.mult, want.mult);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got.tscale), bits(&want.tscale));
            }
        }
    }
}

#[test]
fn extreme_activations_fall_back_consistently() {
    if simd_kernels().is_empty() {
        return;
    }
    let cb = Codebook::new(Format::Int4).unwrap();
    let pw = weights(&cb, 64, 64, 32, false, 5);
    // Tiny (subnormal) and huge activations: the i8 build must still match the scalar one.
    for scale in [1e-39f32, 1e-30, 1e30, 3e37] {
        let x: Vec<f32> = activations(64, 1, 9).iter().map(|v| v * scale).collect();
        for (precision, d) in [
            (TablePrecision::I8, 1),
            (TablePrecision::I8, 2),
            (TablePrecision::F32, 1),
            (TablePrecision::F32, 2),
        ] {
            let base = GemmOptions {
                depth: Depth::Fixed(d),
                precision,
                backend: Backend::Scalar,
                mirror: false,
            };
            // A result that overflows float32 is an error, from every kernel alike.
            let want = gemm(&pw, &x, 1, &base);
            let plan = make_plan(&pw, 1, &base).unwrap();
            for k in simd_kernels() {
                if !k.supports(&plan) {
                    continue;
                }
                let got = gemm(
                    &pw,
                    &x,
                    1,
                    &GemmOptions {
                        backend: k.backend(),
                        ..base
                    },
                );
                let (got, want) = match (got, &want) {
                    (Ok(g), Ok(w)) => (g, w),
                    (Err(g), Err(w)) => {
                        assert!(g.to_string().contains("overflows float32"), "{g}");
                        assert_eq!(g.to_string(), w.to_string());
                        continue;
                    }
                    (g, w) => panic!(
                        "scale {scale}: {:?} vs scalar {:?}",
                        g.err(),
                        w.as_ref().err()
                    ),
                };
                for (a, b) in got.iter().zip(want) {
                    assert!(
                        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                        "scale {scale}: {a} vs {b}"
                    );
                }
            }
        }
    }
}

#[test]
fn full_row_tiles_and_many_columns() {
    if simd_kernels().is_empty() {
        return;
    }
    // 1000 rows = 15 full row blocks + a tail: full kernel tiles, single-block tails and
    // several row tasks; N up to 9 exercises the column loop over shared index tiles.
    for (f, d, g) in [
        (Format::Int4, 2, 128),
        (Format::Int2, 4, 64),
        (Format::Ternary, 5, 128),
        (Format::Int3, 2, 64),
    ] {
        let cb = Codebook::new(f).unwrap();
        // Int4 / int2 without their most negative code (the i8 scales then cover only the
        // codes present), the others with every code.
        let lowest = u8::from(matches!(f, Format::Int4 | Format::Int2));
        let pw = weights_from(&cb, 1000, 256, g, f == Format::Int2, 11, lowest);
        let plan = make_plan(
            &pw,
            1,
            &GemmOptions {
                depth: Depth::Fixed(d),
                precision: TablePrecision::I8,
                backend: Backend::Scalar,
                mirror: false,
            },
        )
        .unwrap();
        assert_eq!(plan.i8_used.is_some(), lowest == 1, "{f:?}");
        for n in [1usize, 2, 5, 9] {
            let x = activations(256, n, 40 + n as u64);
            for mirror in [false, true] {
                let base = GemmOptions {
                    depth: Depth::Fixed(d),
                    precision: TablePrecision::I8,
                    backend: Backend::Scalar,
                    mirror,
                };
                let Ok(plan) = make_plan(&pw, n, &base) else {
                    continue;
                };
                let want = gemm(&pw, &x, n, &base).unwrap();
                for k in simd_kernels() {
                    if !k.supports(&plan) {
                        continue;
                    }
                    let got = gemm(
                        &pw,
                        &x,
                        n,
                        &GemmOptions {
                            backend: k.backend(),
                            ..base
                        },
                    )
                    .unwrap();
                    let xt = transpose_permute(&pw, &x, n, XLayout::KbyN).unwrap();
                    let mut a = TableSet::zeroed(&plan, 0..plan.groups, 0..n);
                    let mut b = a.clone();
                    if k.build_tables(&plan, &xt, &mut a, true) {
                        build_scalar(&plan, &xt, &mut b, true);
                        assert!(
                            same_tables(&plan, &a, &b),
                            "{f:?} {:?} n={n} tables",
                            k.backend()
                        );
                    }
                    assert!(
                        same_bits(&got, &want),
                        "{f:?} {:?} n={n} mirror={mirror}",
                        k.backend()
                    );
                }
            }
        }
    }
}

#[test]
fn every_row_range_of_a_job() {
    if simd_kernels().is_empty() {
        return;
    }
    // Jobs of 1..=13 row blocks from several starts: the kernels split a job into tiles of
    // 8 and 4 row blocks and single blocks; each split must give the scalar kernel's bits.
    // 13 row blocks, the last one ragged.
    let cb = Codebook::new(Format::Int4).unwrap();
    let m = 13 * 64 - 5;
    let pw = weights_from(&cb, m, 256, 128, false, 21, 1);
    for (n, mirror) in [(1usize, false), (3, false), (1, true)] {
        let opts = GemmOptions {
            depth: Depth::Fixed(2),
            precision: TablePrecision::I8,
            backend: Backend::Scalar,
            mirror,
        };
        let plan = make_plan(&pw, n, &opts).unwrap();
        let x = activations(256, n, 60 + n as u64);
        let xt = transpose_permute(&pw, &x, n, XLayout::KbyN).unwrap();
        let mut set = TableSet::zeroed(&plan, 0..plan.groups, 0..n);
        build_scalar(&plan, &xt, &mut set, true);
        let layout = pw.layout_for(&plan, LayoutKind::Plain).unwrap();
        let zeros = maleki_msgemm::gemm::job_zeros(&pw, &plan);
        let scalar = kernels::select(Backend::Scalar, &plan).unwrap();
        for start in [0usize, 1, 3] {
            for end in start + 1..=plan.row_blocks {
                let job = kernels::RowJob {
                    plan: &plan,
                    layout,
                    scales: pw.tiled_scales(),
                    zeros,
                    tables: &set,
                    row_blocks: start..end,
                };
                let mut want = vec![0f32; job.span() * n];
                scalar.accumulate(&job, &mut want);
                for k in simd_kernels() {
                    if !k.supports(&plan) {
                        continue;
                    }
                    // The plain layout, and the kernel's own form where it asks for another.
                    let mut layouts = vec![layout];
                    let kind = k.layout_kind(&plan);
                    if kind != LayoutKind::Plain {
                        layouts.push(pw.layout_for(&plan, kind).unwrap());
                    }
                    for lay in layouts {
                        let job = kernels::RowJob {
                            layout: lay,
                            row_blocks: start..end,
                            ..job
                        };
                        let mut got = vec![0f32; job.span() * n];
                        k.accumulate(&job, &mut got);
                        assert!(
                            same_bits(&got, &want),
                            "{:?} rows {start}..{end} n={n} mirror={mirror} layout={:?}",
                            k.backend(),
                            lay.kind()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn plain_i8_plans_run_on_half_tables_with_the_same_bits() {
    // `gemm::execution_plan`: an i8 plan without mirror runs as its mirror plan on folded
    // indices when that gives the same bits. The scalar kernel runs the plain plan (the
    // oracle); the AVX-512 kernel the mirror plan.
    let Some(avx) = simd_kernels()
        .into_iter()
        .find(|k| k.backend() == Backend::Avx512)
    else {
        return;
    };
    // (format, group, depth, zero points, lowest code used, label space expected)
    let cases = [
        (Format::Int4, 128usize, 2usize, false, 1u8, true),
        (Format::Int4, 32, 2, false, 1, true),
        (Format::Int4, 64, 2, true, 0, false),
        (Format::Int3, 64, 2, false, 1, true),
        (Format::Int2, 64, 4, false, 1, true),
        (Format::Int2, 30, 4, false, 1, true), // last tuple of depth 2
        (Format::Int2, 60, 3, false, 1, true),
        (Format::Fp4, 32, 2, false, 0, false),
        (Format::Uint4, 128, 2, true, 0, false),
        (Format::Ternary, 60, 3, false, 0, false),
        // Depth 5 (the packed bytes): 122 stored entries fold; the last tuple of depth 3.
        (Format::Ternary, 128, 5, false, 0, false),
        (Format::Ternary, 50, 5, false, 0, false),
        (Format::Ternary, 64, 4, false, 0, false),
    ];
    for (i, &(f, g, d, zeros, lowest, labeled)) in cases.iter().enumerate() {
        let cb = Codebook::new(f).unwrap();
        let (m, k) = (200usize, 4 * g);
        let pw = weights_from(&cb, m, k, g, zeros, 40 + i as u64, lowest);
        for n in [1usize, 5] {
            let x = activations(k, n, 80 + n as u64);
            let base = GemmOptions {
                depth: Depth::Fixed(d),
                precision: TablePrecision::I8,
                backend: Backend::Scalar,
                mirror: false,
            };
            let want = gemm(&pw, &x, n, &base).unwrap();
            let opts = GemmOptions {
                backend: Backend::Avx512,
                ..base
            };
            let plan = make_plan(&pw, n, &opts).unwrap();
            let (run, kern) =
                maleki_msgemm::gemm::execution_plan(&pw, &plan, Backend::Avx512).unwrap();
            assert!(
                run.mirror.is_some()
                    && kern.layout_kind(&run) == LayoutKind::Folded
                    && std::ptr::addr_eq(kern, avx),
                "{f:?} g={g} d={d}: expected the folded mirror plan"
            );
            assert_eq!(run.labels.is_some(), labeled, "{f:?} g={g} d={d}");
            let got = gemm(&pw, &x, n, &opts).unwrap();
            assert!(same_bits(&got, &want), "{f:?} g={g} d={d} n={n}");
        }
    }
    // Weights that use int4's -8 have no label space: the codebook mirror would need a shift
    // (other table values), so the plain plan runs.
    let cb = Codebook::new(Format::Int4).unwrap();
    let pw = weights_from(&cb, 64, 256, 128, false, 9, 0);
    let opts = GemmOptions {
        depth: Depth::Fixed(2),
        precision: TablePrecision::I8,
        backend: Backend::Avx512,
        mirror: false,
    };
    let plan = make_plan(&pw, 1, &opts).unwrap();
    let (run, _) = maleki_msgemm::gemm::execution_plan(&pw, &plan, Backend::Avx512).unwrap();
    assert!(run.mirror.is_none());
    // Asked for explicitly, the mirror of those weights is the shifted codebook mirror; of
    // weights without -8, label space.
    let mplan = make_plan(
        &pw,
        1,
        &GemmOptions {
            mirror: true,
            ..opts
        },
    )
    .unwrap();
    assert!(mplan.labels.is_none() && mplan.shift == -0.5);
    let pw1 = weights_from(&cb, 64, 256, 128, false, 9, 1);
    let mplan = make_plan(
        &pw1,
        1,
        &GemmOptions {
            mirror: true,
            ..opts
        },
    )
    .unwrap();
    assert!(mplan.labels.is_some() && mplan.shift == 0.0 && !mplan.zero_term);
}

#[test]
fn int16_partial_sums_at_their_worst_case() {
    // The kernels sum int8 entries (times the tuples' multipliers) and i16 byte planes in int16
    // over chunks of tuples; random data stays far from the bounds those chunks are sized for.
    // Here every weight has the same code and every activation the same value, so every
    // tuple's entry is its table's largest (i8: +-127 times multipliers that fill the chunk
    // budget) or, for some codes, has a low byte near 255 (i16: 2 x 127 = 254). Groups of 1024
    // inputs (512-1024 tuples) span many chunks.
    if simd_kernels().is_empty() {
        return;
    }
    let cb = Codebook::new(Format::Int4).unwrap();
    let (m, k) = (64usize, 1024usize);
    let mut ran = 0;
    for code in (0..cb.levels() as u8).filter(|&c| cb.valid_code(c)) {
        let codes = vec![code; m * k];
        let pw = PackedWeights::from_codes(cb.clone(), m, k, k, &codes, vec![0.5; m], None, None)
            .unwrap();
        for xv in [1.0f32, -0.75] {
            let x = vec![xv; k];
            for precision in [TablePrecision::I8, TablePrecision::I16] {
                for d in [1, 2] {
                    for mirror in [false, true] {
                        let base = GemmOptions {
                            depth: Depth::Fixed(d),
                            precision,
                            backend: Backend::Scalar,
                            mirror,
                        };
                        let what = format!("code {code} x {xv}");
                        ran += each_simd_kernel(&pw, &x, 1, base, &what, |_, _| {});
                    }
                }
            }
        }
    }
    assert!(ran > 0);
}

#[test]
fn float16_tiled_scales_give_the_float32_bits() {
    // Weights whose scales and zero points are float16 values are tiled as float16; every
    // kernel (the scalar one included) must give the bits of the scalar kernel on float32
    // tiles of the same values.
    let cases = [
        (Format::Int4, 2usize, false, false),
        (Format::Uint4, 1, true, false),
        (Format::Int4, 2, true, true),
        (Format::Int2, 4, false, true),
        (Format::Ternary, 5, false, true),
        (Format::Fp4, 2, false, false),
    ];
    let mut ran = 0;
    for (i, &(f, d, zeros, mirror)) in cases.iter().enumerate() {
        let cb = Codebook::new(f).unwrap();
        let pw = with_f16_scales(&weights(&cb, 5 * 64 - 3, 256, 64, zeros, 90 + i as u64));
        assert!(pw.scales_are_f16());
        let f32_tiles = maleki_msgemm::layout::tile_per_group(pw.scales(), pw.m(), pw.groups());
        let tile = |v: &[f32]| maleki_msgemm::layout::tile_per_group(v, pw.m(), pw.groups());
        for (n, precision) in [
            (1usize, TablePrecision::I8),
            (3, TablePrecision::I8),
            (2, TablePrecision::I16),
            (1, TablePrecision::F32),
        ] {
            let opts = GemmOptions {
                depth: Depth::Fixed(d),
                precision,
                backend: Backend::Scalar,
                mirror,
            };
            let Ok(plan) = make_plan(&pw, n, &opts) else {
                continue;
            };
            let x = activations(256, n, 70 + n as u64);
            let xt = transpose_permute(&pw, &x, n, XLayout::KbyN).unwrap();
            let mut set = TableSet::zeroed(&plan, 0..plan.groups, 0..n);
            build_scalar(&plan, &xt, &mut set, true);
            let layout = pw.layout_for(&plan, LayoutKind::Plain).unwrap();
            // The zero points of `job_zeros` (`z - shift`), tiled as float32.
            let zeros = maleki_msgemm::gemm::job_zeros(&pw, &plan);
            let f32_zeros = zeros.tiled().map(|t| {
                assert!(matches!(t, kernels::Tiled::F16(_)));
                let z: Vec<f32> = pw
                    .zeros()
                    .unwrap()
                    .iter()
                    .map(|&z| z - plan.shift)
                    .collect();
                tile(&z)
            });
            let job = kernels::RowJob {
                plan: &plan,
                layout,
                scales: kernels::Tiled::F32(&f32_tiles),
                zeros: match &f32_zeros {
                    Some(z) => kernels::Zeros::Tiled(kernels::Tiled::F32(z)),
                    None => zeros,
                },
                tables: &set,
                row_blocks: 0..plan.row_blocks,
            };
            let mut want = vec![0f32; job.span() * n];
            kernels::select(Backend::Scalar, &plan)
                .unwrap()
                .accumulate(&job, &mut want);
            let all = kernels::registered().into_iter().filter(|k| k.available());
            for k in all.filter(|k| k.backend() != Backend::Reference && k.supports(&plan)) {
                let lay = pw.layout_for(&plan, k.layout_kind(&plan)).unwrap();
                let job = kernels::RowJob {
                    layout: lay,
                    scales: pw.tiled_scales(),
                    zeros,
                    row_blocks: 0..plan.row_blocks,
                    ..job
                };
                assert!(matches!(job.scales, kernels::Tiled::F16(_)));
                let mut got = vec![0f32; job.span() * n];
                k.accumulate(&job, &mut got);
                assert!(
                    same_bits(&got, &want),
                    "{f:?} d={d} {precision:?} n={n} {:?}",
                    k.backend()
                );
                ran += 1;
            }
        }
    }
    assert!(ran >= 18, "only {ran} comparisons ran");
}

#[test]
fn whole_tile_epilogues_of_every_scale_and_zero_variant() {
    // 842 rows: kernel tiles of 8, 4 and 1 row blocks whose rows are all below M (the
    // specialised epilogues of the AVX-512 `i8` kernel and of the AVX2 kernels' whole row
    // blocks) and a last block of 10 rows (the general ones), with groups of one int16 chunk; scales float32 or float16, zero points none, tiled
    // float32, tiled float16, or one shifted value for every row (int4 with every code, read
    // through its mirror).
    let (m, k) = (842, 256);
    let int4 = Codebook::new(Format::Int4).unwrap();
    let uint4 = Codebook::new(Format::Uint4).unwrap();
    let cases = [
        (
            "int4 labels",
            weights_from(&int4, m, k, 32, false, 501, 1),
            false,
        ),
        (
            "int4 labels, f16 scales",
            with_f16_scales(&weights_from(&int4, m, k, 32, false, 502, 1)),
            false,
        ),
        (
            "int4 shifted mirror",
            weights(&int4, m, k, 32, false, 503),
            true,
        ),
        ("uint4 zeros", weights(&uint4, m, k, 16, true, 504), false),
        (
            "uint4 f16 scales and zeros",
            with_f16_scales(&weights(&uint4, m, k, 16, true, 505)),
            true,
        ),
    ];
    let mut ran = 0;
    for (what, pw, mirror) in &cases {
        for n in [1usize, 3] {
            let x = activations(k, n, 600 + n as u64);
            // Depth 2: the AVX-512 kernel; depth 1: also the AVX2 one (16-entry tables), in
            // both table precisions whose epilogue it shares.
            for (d, precision) in [
                (2, TablePrecision::I8),
                (1, TablePrecision::I8),
                (1, TablePrecision::I16),
            ] {
                let base = GemmOptions {
                    depth: Depth::Fixed(d),
                    precision,
                    backend: Backend::Scalar,
                    mirror: *mirror,
                };
                // On a pool of one thread the calling thread takes every row block, so the
                // kernel's tiles of 8 and 4 blocks occur whatever this machine's core count
                // (a larger pool cuts the rows into smaller tasks); then on the default pool.
                let one = maleki_common::pool::sized_pool(1).unwrap();
                ran += maleki_common::pool::with_pool(one, || {
                    each_simd_kernel(pw, &x, n, base, what, |_, _| {})
                });
                ran += each_simd_kernel(pw, &x, n, base, what, |_, _| {});
            }
        }
    }
    assert!(simd_kernels().is_empty() || ran > 0);
}
