//! The dense int8 path of the `i16` mode (`maleki_msgemm::dense`: AVX-512 VNNI, AVX2, Arm64
//! `sdot`) against the
//! scalar table kernel, which sums the same exact integers through tables: equal bits for
//! every affine integer codebook, group size, ragged M, N (column-chunk tails), act-order,
//! both output layouts and thread count; its layout holds the codes; plans it must not take
//! stay on the tables. Skipped (with a note) on CPUs without a dense kernel (x86-64 without
//! AVX2, Arm64 without the dot-product extension).

use maleki_common::pool::sized_pool;
use maleki_common::rng::{below, stream};
use maleki_msgemm::dense::{self, DenseLayout, CHUNK, SUB};
use maleki_msgemm::gemm::plan as make_plan;
use maleki_msgemm::kernels::Tiled;
use maleki_msgemm::layout::ROW_BLOCK;
use maleki_msgemm::{
    gemm, gemm_into_layout, Backend, Codebook, Depth, Format, GemmOptions, PackedWeights, Plan,
    TablePrecision, XLayout, YLayout,
};

fn i16_opts(backend: Backend) -> GemmOptions {
    GemmOptions {
        depth: Depth::Auto,
        precision: TablePrecision::I16,
        backend,
        mirror: false,
    }
}

fn random_weights(
    cb: &Codebook,
    (m, k, g): (usize, usize, usize),
    zeros: bool,
    act_order: bool,
    seed: u64,
) -> PackedWeights {
    let mut r = stream(seed, 0);
    let codes: Vec<u8> = (0..m * k)
        .map(|_| below(&mut r, cb.levels() as u64) as u8)
        .collect();
    let groups = k / g;
    let unit = |r: &mut _| below(r, 1 << 20) as f32 / (1u32 << 20) as f32;
    let scales = (0..m * groups).map(|_| 0.01 + 0.2 * unit(&mut r)).collect();
    let z = zeros.then(|| (0..m * groups).map(|_| 9.0 * unit(&mut r) - 1.0).collect());
    let perm = act_order.then(|| {
        let mut p: Vec<u32> = (0..k as u32).collect();
        for i in (1..k).rev() {
            p.swap(i, below(&mut r, i as u64 + 1) as usize);
        }
        p
    });
    PackedWeights::from_codes(cb.clone(), m, k, g, &codes, scales, z, perm).unwrap()
}

fn activations(k: usize, n: usize, seed: u64) -> Vec<f32> {
    let mut r = stream(seed, 1);
    (0..k * n)
        .map(|i| {
            // zero stretches: groups whose int8 scale is 0
            if (i / n) % 89 < 9 {
                0.0
            } else {
                (below(&mut r, 1 << 20) as f32 / (1u32 << 19) as f32 - 1.0) * 3.0
            }
        })
        .collect()
}

/// Whether this CPU has a dense kernel (AVX-512 VNNI or AVX2; Arm64 `sdot`).
fn has_dense() -> bool {
    let ok = dense::kind_for(Backend::Auto).is_some();
    if !ok {
        eprintln!(
            "no AVX-512 VNNI nor AVX2 (x86-64), no dot-product extension (Arm64) on this CPU: \
             the dense path is not tested here"
        );
    }
    ok
}

/// Whether `auto` sums 8-bit codes densely on this CPU: x86-64 with AVX-512 F, BW and VNNI,
/// or AVX2 and F16C; Arm64 with the dot-product extension.
fn eight_bit_dense_cpu() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        (is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vnni"))
            || (is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c"))
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("dotprod")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

/// Whether `auto` runs `pw`'s GEMVs of at most 4 levels densely, on the 2-bit layout: on
/// CPUs with AVX-512 VNNI or AVX2 with AVX-VNNI, groups a multiple of 16, codebooks in equal
/// steps (int2, uint2, ternary, and the integer ones of this file: the codes are summed as
/// they are).
fn two_bit_gemvs(pw: &PackedWeights) -> bool {
    let v = pw.codebook().values();
    let equal_steps = v.windows(2).all(|w| w[1] - w[0] == v[1] - v[0]);
    #[cfg(target_arch = "x86_64")]
    let vnni = (is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni"))
        || (is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("f16c")
            && is_x86_feature_detected!("avxvnni"));
    #[cfg(not(target_arch = "x86_64"))]
    let vnni = false;
    vnni && pw.group_size().is_multiple_of(16) && equal_steps
}

/// The backends that run dense kernels here: `auto` and each named one the CPU has (`amx`
/// too on a CPU with AMX tiles, where `auto` takes them from `AMX_MIN_COLUMNS` on).
fn dense_backends() -> Vec<Backend> {
    [
        Backend::Auto,
        Backend::Avx512,
        Backend::Amx,
        Backend::Avx2,
        Backend::Neon,
    ]
    .into_iter()
    .filter(|&b| dense::kind_for(b).is_some())
    .collect()
}

/// Whether backend `b` runs an `i16` call of `n` columns: `amx` has no table kernel to take
/// the calls the dense path does not (and says so).
fn runs(pw: &PackedWeights, n: usize, b: Backend) -> bool {
    let opts = i16_opts(b);
    // The dense path runs any depth: `auto`'s plan tells.
    let dense = dense::applies(&make_plan(pw, n, &i16_opts(Backend::Auto)).unwrap(), b);
    if b == Backend::Amx && !dense {
        let x = vec![0f32; pw.k() * n];
        let err = gemm(pw, &x, n, &opts).unwrap_err().to_string();
        assert!(
            err.contains("backend 'amx' runs the dense int8 path only"),
            "{err}"
        );
    }
    // A table kernel takes the rest, where it implements them (AVX2 and NEON: no `i16`
    // tables of 256 entries).
    let plan = make_plan(pw, n, &opts);
    dense
        || (b != Backend::Amx && plan.is_ok_and(|p| maleki_msgemm::kernels::select(b, &p).is_ok()))
}

#[test]
fn auto_takes_amx_tiles_for_batches_where_the_cpu_has_them() {
    // From 6 columns on (16 for groups whose steps are one chunk), VNNI below; `avx512`
    // always names VNNI.
    let pw = random_weights(
        &Codebook::new(Format::Int4).unwrap(),
        (64, 272, 136),
        false,
        true,
        5,
    );
    let g128 = random_weights(
        &Codebook::new(Format::Int4).unwrap(),
        (64, 256, 128),
        false,
        true,
        6,
    );
    let kind = |pw: &PackedWeights, n: usize, b: Backend| {
        dense::kind_for_call(b, &make_plan(pw, n, &i16_opts(Backend::Auto)).unwrap())
    };
    if dense::kind_for(Backend::Auto) != Some(dense::Kind::Vnni512) {
        return;
    }
    let tiles = if dense::amx_ready() {
        dense::Kind::Amx
    } else {
        eprintln!("no AMX tiles on this CPU or OS: auto stays on VNNI");
        dense::Kind::Vnni512
    };
    assert_eq!(kind(&g128, 5, Backend::Auto), Some(dense::Kind::Vnni512));
    assert_eq!(kind(&g128, 6, Backend::Auto), Some(tiles));
    assert_eq!(kind(&g128, 64, Backend::Avx512), Some(dense::Kind::Vnni512));
    assert_eq!(kind(&pw, 15, Backend::Auto), Some(dense::Kind::Vnni512));
    assert_eq!(kind(&pw, 16, Backend::Auto), Some(tiles));
}

fn first_mismatch(a: &[f32], b: &[f32]) -> Option<usize> {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .position(|(x, y)| x.to_bits() != y.to_bits())
}

/// The dense call and the scalar table call, `(M, N)` and `(N, M)` outputs, X as `(K, N)`
/// and `(N, K)`: equal bits.
fn check(pw: &PackedWeights, n: usize, what: &str) {
    let x = activations(pw.k(), n, 11 + n as u64);
    let plan = make_plan(pw, n, &i16_opts(Backend::Auto)).unwrap();
    // 2-bit GEMVs stay on the tables, except on AVX-512 VNNI (the 2-bit layout); 8-bit codes
    // run densely wherever a dense kernel does.
    let levels = pw.codebook().levels();
    let expect = if levels > 16 {
        eight_bit_dense_cpu()
    } else {
        n >= 2 || levels > 4 || two_bit_gemvs(pw)
    };
    assert_eq!(dense::applies(&plan, Backend::Auto), expect, "{what} n={n}");
    let want = gemm(pw, &x, n, &i16_opts(Backend::Scalar)).unwrap();
    // The first call builds the dense layout on the pool and runs there, the next ones run
    // on the caller and one worker (`gemm::dense_here`).
    for b in dense_backends().into_iter().filter(|&b| runs(pw, n, b)) {
        for call in 0..2 {
            let got = gemm(pw, &x, n, &i16_opts(b)).unwrap();
            if let Some(i) = first_mismatch(&got, &want) {
                panic!(
                    "{what} n={n} {b:?} call {call}: y[{i}] = {} vs scalar {}",
                    got[i], want[i]
                );
            }
        }
    }
    let m = pw.m();
    // X transposed in, Y transposed out.
    let xt: Vec<f32> = (0..n * pw.k())
        .map(|i| x[(i % pw.k()) * n + i / pw.k()])
        .collect();
    let want_t: Vec<f32> = (0..m * n).map(|i| want[(i % m) * n + i / m]).collect();
    for b in dense_backends().into_iter().filter(|&b| runs(pw, n, b)) {
        let mut yt = vec![0f32; m * n];
        let opts = i16_opts(b);
        gemm_into_layout(pw, &xt, n, XLayout::NbyK, YLayout::NbyM, &opts, &mut yt).unwrap();
        assert_eq!(
            first_mismatch(&yt, &want_t),
            None,
            "{what} n={n}: (N, M) output"
        );
    }
}

/// Calls `f(g, row, c, bytes)` with the 4 bytes of word `c` of every row (rows past M
/// included) and group of the layout, after checking that the word lies where it should:
/// `[rb][g][c][s]` (the four 16-row parts' words interleaved) or `[rb][g][s][c]`, 64 bytes
/// per word.
fn each_row_word(
    lay: &DenseLayout,
    interleaved: bool,
    mut f: impl FnMut(usize, usize, usize, &[u8]),
) {
    let parts = ROW_BLOCK / SUB;
    for g in 0..lay.groups {
        for rb in 0..lay.row_blocks {
            let blk = rb * lay.groups + g;
            for s in 0..parts {
                for c in 0..lay.chunks {
                    let word = if interleaved {
                        (blk * lay.chunks + c) * parts + s
                    } else {
                        (blk * parts + s) * lay.chunks + c
                    };
                    let at = word * SUB * 4;
                    assert_eq!(lay.word(g, rb, s, c), at, "g={g} rb={rb} s={s} c={c}");
                    for (r, bytes) in lay.data[at..][..SUB * 4].chunks_exact(4).enumerate() {
                        f(g, rb * ROW_BLOCK + s * SUB + r, c, bytes);
                    }
                }
            }
        }
    }
}

#[test]
fn dense_layout_holds_the_codes() {
    let cb = Codebook::new(Format::Uint4).unwrap();
    let (m, k, g) = (70, 48, 16);
    let pw = random_weights(&cb, (m, k, g), false, false, 3);
    let codes = pw.codes().unwrap();
    for interleaved in [true, false] {
        let lay = DenseLayout::build_with(&codes, m, k, g, 4, interleaved).unwrap();
        each_row_word(&lay, interleaved, |gi, row, c, word| {
            for j in 0..CHUNK {
                let nib = (word[j / 2] >> (4 * (j % 2))) & 15;
                let want = if row < m {
                    codes[row * k + gi * g + c * CHUNK + j]
                } else {
                    0
                };
                assert_eq!(nib, want, "g={gi} row={row} chunk={c} j={j}");
            }
        });
    }
}

#[test]
fn eight_bit_dense_layout_holds_the_codes() {
    // Byte `j` of word `2c + h` of a row holds input `ORDER[4 h + j]` of chunk `c` (the order
    // of the int8 activations: each 8 inputs as 0, 2, 4, 6, 1, 3, 5, 7).
    const ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];
    let cb = Codebook::new(Format::Uint8).unwrap();
    let (m, k, g) = (70, 96, 24);
    let pw = random_weights(&cb, (m, k, g), false, false, 9);
    let codes = pw.codes().unwrap();
    assert!(
        codes.iter().any(|&c| c > 127),
        "the test needs codes past 127"
    );
    for interleaved in [true, false] {
        let lay = DenseLayout::build_with(&codes, m, k, g, 8, interleaved).unwrap();
        assert_eq!((lay.bits, lay.chunks), (8, g / 4));
        assert_eq!(lay.data.len(), k / g * lay.row_blocks * ROW_BLOCK * g);
        if interleaved == dense::interleave_here() {
            assert_eq!(pw.dense_layout().unwrap(), &lay);
        }
        each_row_word(&lay, interleaved, |gi, row, w, word| {
            for (j, &byte) in word.iter().enumerate() {
                let input = gi * g + (w / 2) * CHUNK + ORDER[4 * (w % 2) + j];
                let want = if row < m { codes[row * k + input] } else { 0 };
                assert_eq!(byte, want, "g={gi} row={row} word={w} byte={j}");
            }
        });
    }
}

#[test]
fn two_bit_dense_layout_holds_the_codes() {
    // Each part's words of its own: bit pair `p` of byte `j` of a row's word holds input
    // `ORDER[4 p + j]` of its 16 (the order of the int8 activations: each 8 inputs as 0, 2,
    // 4, 6, 1, 3, 5, 7). The parts in bit pairs: word `c` holds 4 inputs of 64 rows, bit pair
    // `s` of byte `j` of row `r` the code of row `16 s + r` and input `16 (c / 4) + ORDER[4 (c
    // % 4) + j]` of the group (the activation at byte `4c + j`).
    const ORDER: [usize; 16] = [0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15];
    let cb = Codebook::new(Format::Int2).unwrap();
    let (m, k, g) = (70, 96, 32);
    let pw = random_weights(&cb, (m, k, g), false, false, 5);
    let codes = pw.codes().unwrap();
    let want = |row: usize, input: usize| if row < m { codes[row * k + input] } else { 0 };
    for interleaved in [true, false] {
        let lay = DenseLayout::build_with(&codes, m, k, g, 2, interleaved).unwrap();
        assert_eq!(lay.data.len(), k / g * lay.row_blocks * ROW_BLOCK * g / 4);
        assert_eq!(lay.pairs(), interleaved);
        if interleaved == dense::interleave_here() {
            assert_eq!(pw.dense_layout2().unwrap(), &lay);
        }
        if !interleaved {
            assert_eq!((lay.bits, lay.chunks), (2, g / 16));
            each_row_word(&lay, interleaved, |gi, row, c, word| {
                for (j, &byte) in word.iter().enumerate() {
                    for p in 0..4 {
                        let got = (byte >> (2 * p)) & 3;
                        let input = gi * g + c * 16 + ORDER[4 * p + j];
                        assert_eq!(got, want(row, input), "g={gi} row={row} word={c} byte={j}");
                    }
                }
            });
            continue;
        }
        assert_eq!((lay.bits, lay.chunks), (2, g / 4));
        for gi in 0..lay.groups {
            for rb in 0..lay.row_blocks {
                let blk = rb * lay.groups + gi;
                assert_eq!(lay.block_end(gi, rb), (blk + 1) * lay.chunks * SUB * 4);
                for c in 0..lay.chunks {
                    let at = (blk * lay.chunks + c) * SUB * 4;
                    let input = gi * g + 16 * (c / 4);
                    for s in 0..ROW_BLOCK / SUB {
                        assert_eq!(lay.word(gi, rb, s, c), at, "g={gi} rb={rb} s={s} c={c}");
                        for r in 0..SUB {
                            let row = rb * ROW_BLOCK + s * SUB + r;
                            for j in 0..4 {
                                let got = (lay.data[at + 4 * r + j] >> (2 * s)) & 3;
                                let input = input + ORDER[4 * (c % 4) + j];
                                assert_eq!(got, want(row, input), "g={gi} row={row} c={c} j={j}");
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn dense_path_equals_the_table_kernel_bitwise() {
    if !has_dense() {
        return;
    }
    let formats = [
        (Format::Int4, false),
        (Format::Uint4, true),
        (Format::Int3, false),
        (Format::Uint3, true),
        (Format::Int2, false),
        (Format::Uint2, true),
        (Format::Ternary, false),
        (Format::Fp4, false),
        (Format::Int8, false),
        (Format::Uint8, true),
    ];
    let mut ran = 0;
    for (i, &(f, zeros)) in formats.iter().enumerate() {
        let cb = Codebook::new(f).unwrap();
        for &(m, k, g) in &[(1, 64, 8), (63, 256, 32), (130, 272, 136), (200, 512, 128)] {
            let pw = random_weights(&cb, (m, k, g), zeros, i % 2 == 0, 100 + i as u64);
            for n in [1, 2, 3, 5, 16, 17, 31, 40, 70] {
                check(&pw, n, &format!("{f:?} M={m} K={k} G={g}"));
                ran += 1;
            }
        }
    }
    // Codebooks whose integer form has a slope other than 1 or needs a power of two, and
    // integer codebooks that are not affine (their codes looked up in registers).
    for values in [
        &[-6.0f32, -4.0, -2.0, 0.0, 2.0, 4.0, 6.0, 8.0][..],
        &[0.0, 0.5, 1.0, 1.5][..],
        &[-3.0, 0.0, 3.0][..],
        &[0.0, 1.0, 3.0, 7.0][..],
        &[-12.0, -1.0, 0.0, 2.0, 5.0, 30.0, 52.0][..],
        &[
            -2.0, -0.5, 0.25, 1.0, 3.0, 4.5, 6.0, 7.75, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 13.5,
            14.0,
        ][..],
    ] {
        let cb = Codebook::custom(values).unwrap();
        let pw = random_weights(&cb, (97, 256, 64), true, false, 7);
        for n in [1, 4, 19] {
            check(&pw, n, &format!("custom {values:?}"));
            ran += 1;
        }
    }
    assert_eq!(ran, 10 * 4 * 9 + 6 * 3);
}

#[test]
fn float16_scales_and_zero_points_give_the_same_bits() {
    if !has_dense() {
        return;
    }
    // Scales and zero points that are all float16 values are kept as float16 bits and widened
    // by the kernels (`Tiled::F16`): full 16-row parts take the vector epilogues, the last
    // part of M = 150 the scalar one.
    let mut r = stream(77, 0);
    for (f, zeros) in [
        (Format::Uint4, true),
        (Format::Int4, false),
        (Format::Int3, false),
        (Format::Uint2, true),
        (Format::Int2, false),
        (Format::Ternary, false),
    ] {
        let cb = Codebook::new(f).unwrap();
        let (m, k, g) = (150, 384, 64);
        let codes: Vec<u8> = (0..m * k)
            .map(|_| below(&mut r, cb.levels() as u64) as u8)
            .collect();
        let half = |v: f32| half::f16::from_f32(v).to_f32();
        let scales: Vec<f32> = (0..m * k / g)
            .map(|_| half(0.003 + below(&mut r, 1000) as f32 * 1e-4))
            .collect();
        let z = zeros.then(|| (0..m * k / g).map(|_| below(&mut r, 16) as f32).collect());
        let pw = PackedWeights::from_codes(cb, m, k, g, &codes, scales, z, None).unwrap();
        assert!(matches!(pw.tiled_scales(), Tiled::F16(_)), "{f:?}");
        if zeros {
            assert!(matches!(pw.tiled_zeros(), Some(Tiled::F16(_))), "{f:?}");
        }
        for n in [1, 2, 5, 16] {
            check(&pw, n, &format!("{f:?} float16 scales"));
        }
    }
}

#[test]
fn dense_sums_at_their_largest() {
    if !has_dense() {
        return;
    }
    // Every code at its extreme and every activation at +-127 after rounding, in long groups:
    // the int32 sums reach 15 * 127 * G (uint4), 8 * 127 * G (int4), 255 * 127 * G (uint8) and
    // 128 * 127 * G (int8: its codes' sums 0 and the correction -128 S).
    let (m, k) = (80, 8192);
    for (f, code) in [
        (Format::Uint4, 15u8),
        (Format::Int4, 0u8),
        (Format::Uint8, 255u8),
        (Format::Int8, 0u8),
    ] {
        let cb = Codebook::new(f).unwrap();
        for g in [k, 512] {
            let codes = vec![code; m * k];
            let pw = PackedWeights::from_codes(
                cb.clone(),
                m,
                k,
                g,
                &codes,
                vec![0.5; m * k / g],
                None,
                None,
            )
            .unwrap();
            // (K, 3): columns +-2 alternating, its negation, and +2 everywhere.
            let x: Vec<f32> = (0..k * 3)
                .map(|i| {
                    let sign = if (i / 3) % 2 == 0 { 2.0 } else { -2.0 };
                    [sign, -sign, 2.0][i % 3]
                })
                .collect();
            let want = gemm(&pw, &x, 3, &i16_opts(Backend::Scalar)).unwrap();
            for b in dense_backends().into_iter().filter(|&b| runs(&pw, 3, b)) {
                let got = gemm(&pw, &x, 3, &i16_opts(b)).unwrap();
                assert_eq!(first_mismatch(&got, &want), None, "{f:?} G={g} {b:?}");
                // The all-positive column: every weight times 2, summed exactly.
                let v = cb.values()[usize::from(code)] as f64;
                let exact = 0.5 * v * 2.0 * k as f64;
                assert!(
                    (f64::from(got[2]) - exact).abs() <= exact.abs() * 1e-6,
                    "{f:?} G={g} {b:?}: {} vs {exact}",
                    got[2]
                );
            }
        }
    }
}

#[test]
fn eight_bit_rows_of_one_scale_stay_dense() {
    // Long groups (one scale per row, as a large K's per-row quantization): int8's integers
    // are at most 128 in magnitude, so its int32 sums stay exact up to G = 66052; uint8's up
    // to 255, G = 33155. At those G, the largest sums: codes at the extreme value and the
    // activations at +-127.
    if !eight_bit_dense_cpu() {
        return;
    }
    let m = 20;
    for (f, code, g, dense_expected) in [
        (Format::Int8, 0u8, 65536, true),
        (Format::Uint8, 255u8, 32768, true),
        (Format::Uint8, 255u8, 65536, false),
    ] {
        let cb = Codebook::new(f).unwrap();
        let codes = vec![code; m * g];
        let pw = PackedWeights::from_codes(cb.clone(), m, g, g, &codes, vec![0.5; m], None, None)
            .unwrap();
        // Column 0 all +3 (the int8 sum at its largest: 128 * 127 * G), column 1 mixed.
        let x: Vec<f32> = (0..g * 2)
            .map(|i| {
                if i % 2 == 1 && (i / 2) % 3 == 0 {
                    -3.0
                } else {
                    3.0
                }
            })
            .collect();
        let plan = make_plan(&pw, 2, &i16_opts(Backend::Auto)).unwrap();
        assert_eq!(
            dense::applies(&plan, Backend::Auto),
            dense_expected,
            "{f:?} G={g}"
        );
        let want = gemm(&pw, &x, 2, &i16_opts(Backend::Scalar)).unwrap();
        for b in dense_backends().into_iter().filter(|&b| runs(&pw, 2, b)) {
            let got = gemm(&pw, &x, 2, &i16_opts(b)).unwrap();
            assert_eq!(first_mismatch(&got, &want), None, "{f:?} G={g} {b:?}");
        }
    }
}

#[test]
fn long_groups_stay_exact_in_gemvs() {
    // The GEMV kernels mask codes in place, so that their sums carry the codes' weights within
    // the byte (AVX-512: 4-bit high nibbles as `16 c`; 2-bit codes as `4^s c`, and the whole
    // bytes, up to 255): at the largest groups an `i16` plan takes (2^16 inputs, one tuple
    // each at depth 1), with every code at its extreme and every activation at +-127, the
    // sums must still equal the scalar kernel's. 80 rows: a whole row block and a ragged one.
    if !has_dense() {
        return;
    }
    let m = 80;
    for (f, code, g) in [
        (Format::Uint4, 15u8, 1 << 16),
        (Format::Int2, 3u8, 1 << 16),
        (Format::Int2, 0u8, 1 << 16),
    ] {
        let cb = Codebook::new(f).unwrap();
        let codes = vec![code; m * g];
        let pw = PackedWeights::from_codes(cb.clone(), m, g, g, &codes, vec![0.5; m], None, None)
            .unwrap();
        let plan = make_plan(&pw, 1, &i16_opts(Backend::Auto)).unwrap();
        if dense::kind_for(Backend::Auto) == Some(dense::Kind::Vnni512) {
            // The kernels this is about (elsewhere 2-bit GEMVs take the tables).
            assert!(dense::applies(&plan, Backend::Auto), "{f:?} G={g}");
            assert_eq!(dense::two_bit(&plan, Backend::Auto), f == Format::Int2);
        }
        // All +3 (every activation 127), then mixed signs.
        for mixed in [false, true] {
            let x: Vec<f32> = (0..g)
                .map(|i| if mixed && i % 3 == 0 { -3.0 } else { 3.0 })
                .collect();
            let want = gemm(&pw, &x, 1, &i16_opts(Backend::Scalar)).unwrap();
            for b in dense_backends().into_iter().filter(|&b| runs(&pw, 1, b)) {
                let got = gemm(&pw, &x, 1, &i16_opts(b)).unwrap();
                assert_eq!(
                    first_mismatch(&got, &want),
                    None,
                    "{f:?} G={g} {b:?} {mixed}"
                );
            }
        }
    }
}

#[test]
fn dense_results_do_not_depend_on_the_thread_count() {
    if !has_dense() {
        return;
    }
    let cb = Codebook::new(Format::Uint4).unwrap();
    let pw = random_weights(&cb, (1000, 1024, 128), true, true, 5);
    let x = activations(1024, 24, 9);
    for b in dense_backends() {
        let run = |t: usize| {
            sized_pool(t)
                .unwrap()
                .install(|| gemm(&pw, &x, 24, &i16_opts(b)).unwrap())
        };
        let one = run(1);
        for t in [2, 3, 4] {
            assert_eq!(first_mismatch(&run(t), &one), None, "{t} threads {b:?}");
        }
    }
}

#[test]
fn plans_the_dense_path_does_not_take() {
    let plan_of = |pw: &PackedWeights, opts: GemmOptions| make_plan(pw, 4, &opts).unwrap();
    let int4 = random_weights(
        &Codebook::new(Format::Int4).unwrap(),
        (64, 64, 16),
        false,
        false,
        1,
    );
    let base = i16_opts(Backend::Auto);
    let cpu = dense::kind_for(Backend::Auto).is_some();
    assert_eq!(dense::applies(&plan_of(&int4, base), Backend::Auto), cpu);
    // Other precisions stay on the tables.
    for opts in [
        GemmOptions {
            precision: TablePrecision::I8,
            ..base
        },
        GemmOptions {
            precision: TablePrecision::F32,
            ..base
        },
    ] {
        assert!(
            !dense::applies(&plan_of(&int4, opts), Backend::Auto),
            "{opts:?}"
        );
    }
    assert!(!dense::applies(&plan_of(&int4, base), Backend::Scalar));
    // Each named backend takes the dense path exactly where this CPU has its kernel, and
    // no other backend's: AVX-512 VNNI / AVX2 (with AVX-VNNI where the CPU has it) on x86-64,
    // `sdot` on Arm64.
    let avx_vnni = {
        #[cfg(target_arch = "x86_64")]
        {
            is_x86_feature_detected!("avxvnni")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    };
    for (b, kind) in [
        (Backend::Avx512, dense::Kind::Vnni512),
        (Backend::Amx, dense::Kind::Amx),
        (
            Backend::Avx2,
            if avx_vnni {
                dense::Kind::AvxVnni
            } else {
                dense::Kind::Avx2
            },
        ),
        (Backend::Neon, dense::Kind::Sdot),
    ] {
        let got = dense::kind_for(b);
        assert!(got.is_none() || got == Some(kind), "{b:?}: {got:?}");
        assert_eq!(
            dense::applies(&plan_of(&int4, base), b),
            got.is_some(),
            "{b:?}"
        );
    }
    // Group sizes that are not multiples of 8, and codebooks that are not affine integers.
    let g4 = random_weights(
        &Codebook::new(Format::Int4).unwrap(),
        (64, 64, 4),
        false,
        false,
        2,
    );
    assert!(!dense::applies(&plan_of(&g4, base), Backend::Auto));
    let bent = random_weights(
        &Codebook::custom(&[0.0, 1.0, 3.0, 256.0]).unwrap(),
        (64, 64, 16),
        false,
        false,
        3,
    );
    assert!(!dense::applies(&plan_of(&bent, base), Backend::Auto));
    // A codebook spanning 65 integers: past AVX2's int16 pairs, not past a byte.
    let wide = random_weights(
        &Codebook::custom(&[0.0, 1.0, 3.0, 65.0]).unwrap(),
        (64, 64, 16),
        false,
        false,
        3,
    );
    for b in dense_backends() {
        let kind = dense::kind_for_call(b, &plan_of(&wide, base)).unwrap();
        assert_eq!(
            dense::applies(&plan_of(&wide, base), b),
            kind != dense::Kind::Avx2,
            "{b:?}"
        );
    }
    // Called directly on such a plan, or with inputs of the wrong length: errors, no panic.
    let i8_plan = plan_of(
        &int4,
        GemmOptions {
            precision: TablePrecision::I8,
            ..base
        },
    );
    let (x4, mut y4) = (vec![0.5f32; 64 * 4], vec![0f32; 64 * 4]);
    assert!(dense::run(&int4, &i8_plan, Backend::Auto, &x4, &mut y4, YLayout::MbyN).is_err());
    if cpu {
        let p = plan_of(&int4, base);
        assert!(dense::run(&int4, &p, Backend::Auto, &x4[..10], &mut y4, YLayout::MbyN).is_err());
        assert!(dense::run(&int4, &p, Backend::Auto, &x4, &mut y4, YLayout::MbyN).is_ok());
        // A plan of other weights (one row more, a wider group): an error before any read of
        // the layout at the plan's offsets (the review's reproducer read past its end).
        let cb = Codebook::new(Format::Int4).unwrap();
        for (m, k, g) in [(65, 64, 16), (64, 64, 32), (64, 128, 16)] {
            let other =
                Plan::new(&cb, m, k, 4, g, false, 1, TablePrecision::I16, false, None).unwrap();
            let (x, mut y) = (vec![0.5f32; k * 4], vec![0f32; m * 4]);
            for b in dense_backends() {
                let r = dense::run(&int4, &other, b, &x, &mut y, YLayout::MbyN);
                assert!(r.is_err(), "({m}, {k}) g{g} {b:?}");
                let r = dense::run_here(&int4, &other, b, &x, &mut y, YLayout::MbyN, false);
                assert!(r.is_err(), "({m}, {k}) g{g} {b:?}");
            }
            // The table driver likewise.
            let k16 = maleki_msgemm::kernels::select(Backend::Scalar, &other).unwrap();
            let r = maleki_msgemm::gemm::run_plan(&int4, &other, k16, &x, &mut y, YLayout::MbyN);
            assert!(r.is_err(), "run_plan ({m}, {k}) g{g}");
        }
    }
    // ... and still give the scalar kernel's bits through the tables.
    let x = activations(64, 4, 4);
    for pw in [&g4, &bent] {
        let want = gemm(pw, &x, 4, &i16_opts(Backend::Scalar)).unwrap();
        assert_eq!(
            first_mismatch(&gemm(pw, &x, 4, &base).unwrap(), &want),
            None
        );
    }
}

#[test]
fn dense_runs_at_any_depth_on_every_dense_backend() {
    // The dense sums do not depend on the depth: a backend whose table kernel lacks a depth
    // (AVX2 tables of at most 16 entries; int4 depth 3 has 4096) still runs it densely, with
    // the scalar kernel's bits at that depth.
    if !has_dense() {
        return;
    }
    let cb = Codebook::new(Format::Uint4).unwrap();
    let pw = random_weights(&cb, (77, 384, 96), true, false, 12);
    for n in [1, 6] {
        let x = activations(pw.k(), n, 3);
        for d in [1, 2, 3] {
            let opts = |backend| GemmOptions {
                depth: Depth::Fixed(d),
                ..i16_opts(backend)
            };
            let want = gemm(&pw, &x, n, &opts(Backend::Scalar)).unwrap();
            for b in dense_backends() {
                let got = gemm(&pw, &x, n, &opts(b)).unwrap();
                assert_eq!(first_mismatch(&got, &want), None, "n={n} d={d} {b:?}");
            }
        }
    }
}

#[test]
fn mirror_plans_run_densely_in_label_space_too() {
    if !has_dense() {
        return;
    }
    let mirror = |b| GemmOptions {
        mirror: true,
        ..i16_opts(b)
    };
    // Integers of the shifted codebook (int4: 2 c - 15, with the uniform shift term in the
    // epilogue; uint4 with zero points; ternary, unshifted): the scalar mirror kernel's bits.
    for (f, zeros) in [
        (Format::Int4, false),
        (Format::Uint4, true),
        (Format::Int3, false),
        (Format::Ternary, false),
    ] {
        let pw = random_weights(&Codebook::new(f).unwrap(), (130, 256, 64), zeros, true, 21);
        for n in [1, 3, 16] {
            let plan = make_plan(&pw, n, &mirror(Backend::Auto)).unwrap();
            assert!(plan.mirror.is_some() && plan.labels.is_none(), "{f:?}");
            // (2-bit GEMVs as without mirror.)
            let dense_call = n >= 2 || pw.codebook().levels() > 4 || two_bit_gemvs(&pw);
            assert_eq!(
                dense::applies(&plan, Backend::Auto),
                dense_call,
                "{f:?} n={n}"
            );
            let x = activations(pw.k(), n, 5 + n as u64);
            let want = gemm(&pw, &x, n, &mirror(Backend::Scalar)).unwrap();
            // A named backend without an `i16` mirror table kernel runs only dense calls.
            let backends = if dense_call {
                // (2-bit GEMVs run densely on AVX-512 VNNI only.)
                dense_backends()
                    .into_iter()
                    .filter(|&b| n >= 2 || b == Backend::Auto || dense::applies(&plan, b))
                    .collect()
            } else {
                vec![Backend::Auto]
            };
            for b in backends {
                for call in 0..2 {
                    let got = gemm(&pw, &x, n, &mirror(b)).unwrap();
                    assert_eq!(
                        first_mismatch(&got, &want),
                        None,
                        "{f:?} n={n} {b:?} call {call}"
                    );
                }
            }
        }
    }
    // int4 / int3 weights that never use their most negative code get sign-magnitude labels:
    // the codes' integers are the codebook's own, the unused code left out.
    for f in [Format::Int4, Format::Int3] {
        let cb = Codebook::new(f).unwrap();
        let mut r = stream(9, 0);
        let (m, k) = (100, 128);
        let levels = cb.levels() as u64;
        let codes: Vec<u8> = (0..m * k)
            .map(|_| 1 + below(&mut r, levels - 1) as u8)
            .collect();
        let scales = (0..m * 4).map(|i| 0.05 + 0.01 * (i % 7) as f32).collect();
        let pw = PackedWeights::from_codes(cb, m, k, 32, &codes, scales, None, None).unwrap();
        for n in [1, 4, 17] {
            let plan = make_plan(&pw, n, &mirror(Backend::Auto)).unwrap();
            assert!(plan.labels.is_some(), "{f:?}");
            assert!(dense::applies(&plan, Backend::Auto), "{f:?} n={n}");
            let x = activations(k, n, 6);
            let want = gemm(&pw, &x, n, &mirror(Backend::Scalar)).unwrap();
            for b in dense_backends() {
                let got = gemm(&pw, &x, n, &mirror(b)).unwrap();
                assert_eq!(first_mismatch(&got, &want), None, "{f:?} n={n} {b:?}");
            }
        }
    }
    // Shifted codebooks whose integers keep slope 1 (`a = 1`): the register epilogue's uniform
    // zero point `-shift` (found untested by review: a mutation there passed).
    let mut uniform = 0;
    for values in [
        &[0.0f32, 1.0, 2.0][..],
        &[1.0, 2.0, 3.0, 4.0, 5.0],
        &[0.0, 0.5, 1.0],
    ] {
        let cb = Codebook::custom(values).unwrap();
        for &(m, k, g) in &[(63, 256, 32), (97, 256, 64), (130, 128, 16)] {
            let pw = random_weights(&cb, (m, k, g), false, false, 30 + m as u64);
            for n in [1, 2, 3, 5, 8, 13, 64, 65] {
                let plan = make_plan(&pw, n, &mirror(Backend::Auto)).unwrap();
                assert!(plan.mirror.is_some() && plan.shift != 0.0, "{values:?}");
                let x = activations(k, n, 8 + n as u64);
                let want = gemm(&pw, &x, n, &mirror(Backend::Scalar)).unwrap();
                for b in dense_backends() {
                    if dense::applies(&plan, b) {
                        let got = gemm(&pw, &x, n, &mirror(b)).unwrap();
                        let at = first_mismatch(&got, &want);
                        assert_eq!(at, None, "{values:?} M={m} G={g} n={n} {b:?}");
                        uniform += 1;
                    }
                }
            }
        }
    }
    // At least one dense backend per call of 2 columns or more (3-level GEMVs are dense on
    // AVX-512 VNNI only).
    assert!(uniform >= 66, "{uniform}");
}

/// Whether this CPU is AMD's with AVX-512 VNNI, read here from CPUID and the standard
/// library's feature detection (an oracle apart from the library's own `kernels::amd_cpu`).
/// Whether `auto` runs the AVX2 dense kernels here: AVX2 and F16C without AVX-512 VNNI.
fn avx2_without_avx512_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("f16c")
            && !(is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vnni"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn amd_with_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: CPUID leaf 0 exists on every x86-64 CPU.
        #[allow(unused_unsafe)]
        let id = unsafe { std::arch::x86_64::__cpuid(0) };
        let vendor: Vec<u8> = [id.ebx, id.edx, id.ecx]
            .iter()
            .flat_map(|r| r.to_le_bytes())
            .collect();
        vendor == b"AuthenticAMD"
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[test]
fn auto_precision_takes_the_dense_path_for_batches_and_amd_gemvs() {
    use maleki_msgemm::gemm::auto_precision;
    let int4 = random_weights(
        &Codebook::new(Format::Int4).unwrap(),
        (64, 128, 32),
        false,
        false,
        3,
    );
    let nf4 = random_weights(
        &Codebook::new(Format::Nf4).unwrap(),
        (64, 128, 32),
        false,
        false,
        3,
    );
    let i8_auto = GemmOptions::default();
    assert_eq!(i8_auto.precision, TablePrecision::I8);
    let cpu = dense::kind_for(Backend::Auto).is_some();
    for n in [2, 5, 64] {
        let got = auto_precision(&int4, n, &i8_auto);
        let want = if cpu {
            TablePrecision::I16
        } else {
            TablePrecision::I8
        };
        assert_eq!(got.precision, want, "n = {n}");
        assert_eq!(
            got,
            GemmOptions {
                precision: want,
                ..i8_auto
            }
        );
        // No dense path for a codebook without integers.
        assert_eq!(auto_precision(&nf4, n, &i8_auto), i8_auto);
        // Kept: the scalar backend (no dense kernel), a named depth (tables were asked for),
        // a named precision.
        let kept = [
            GemmOptions {
                backend: Backend::Scalar,
                ..i8_auto
            },
            GemmOptions {
                depth: Depth::Fixed(2),
                ..i8_auto
            },
            GemmOptions {
                precision: TablePrecision::F32,
                ..i8_auto
            },
        ];
        for opts in kept {
            assert_eq!(auto_precision(&int4, n, &opts), opts);
        }
    }
    // A GEMV keeps its tables, except where the documented rule (`dense::gemv_preferred`:
    // AVX-512 VNNI on AMD CPUs, any group size; AVX2 on any CPU, groups of 32 or more) takes
    // it densely.
    let gemv_dense = amd_with_vnni() || avx2_without_avx512_vnni();
    assert_eq!(dense::gemv_preferred(Backend::Auto, 128), gemv_dense);
    assert_eq!(dense::gemv_preferred(Backend::Auto, 16), amd_with_vnni());
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c") {
        for (g, want) in [(8, false), (16, false), (32, true), (128, true)] {
            assert_eq!(dense::gemv_preferred(Backend::Avx2, g), want, "g = {g}");
        }
    }
    assert_eq!(
        auto_precision(&int4, 1, &i8_auto).precision,
        if gemv_dense {
            TablePrecision::I16
        } else {
            TablePrecision::I8
        }
    );
    // Float codebooks have no dense GEMV.
    assert_eq!(auto_precision(&nf4, 1, &i8_auto), i8_auto);
    let g64 = random_weights(
        &Codebook::new(Format::Int4).unwrap(),
        (64, 128, 64),
        false,
        false,
        3,
    );
    assert_eq!(
        auto_precision(&g64, 1, &i8_auto).precision,
        if gemv_dense {
            TablePrecision::I16
        } else {
            TablePrecision::I8
        }
    );
    // The choice runs the batch densely: the same bits as naming `i16`.
    if cpu {
        let x = activations(128, 5, 4);
        let a = gemm(&int4, &x, 5, &auto_precision(&int4, 5, &i8_auto)).unwrap();
        let b = gemm(&int4, &x, 5, &i16_opts(Backend::Auto)).unwrap();
        assert_eq!(first_mismatch(&a, &b), None);
    }
}

#[test]
fn looked_up_codes_at_the_largest_span() {
    // A non-affine integer codebook spanning each dense kernel's largest span
    // (`dense::map_span`: 64 on AVX2, 127 with sdot, 255 on AVX-512 VNNI and AMX): every
    // weight at the largest value and every activation at the int8 maximum puts AVX2's int16
    // sums of four products at 4 * 64 * 127 = 32512, next to saturation, and the others'
    // bytes at their largest; the scalar kernel's bits. One more leaves that kernel's dense
    // path.
    if !has_dense() {
        return;
    }
    let (m, k, g) = (40, 256, 128);
    for b in dense_backends() {
        let kind = dense::kind_for(b).unwrap();
        let span = dense::map_span(kind);
        let cb = Codebook::custom(&[0.0, 1.0, span as f32]).unwrap();
        let codes = vec![2u8; m * k];
        let pw = PackedWeights::from_codes(cb, m, k, g, &codes, vec![1.0; m * k / g], None, None)
            .unwrap();
        for n in [1, 3, 16] {
            let x = vec![1.0f32; k * n];
            let plan = make_plan(&pw, n, &i16_opts(b)).unwrap();
            let ints = dense::ints(&plan).unwrap();
            assert_eq!(
                ints.map.map(|m| m[..3].to_vec()),
                Some(vec![0, 1, span as u8])
            );
            let want = gemm(&pw, &x, n, &i16_opts(Backend::Scalar)).unwrap();
            assert!(
                want.iter().all(|&v| v == (k as f32) * span as f32),
                "{:?}",
                &want[..4]
            );
            // A GEMV of 3 levels reads the tables' 2-bit layout (see `dense::applies`).
            assert_eq!(dense::applies(&plan, b), n >= 2, "{b:?} n={n}");
            if runs(&pw, n, b) {
                let got = gemm(&pw, &x, n, &i16_opts(b)).unwrap();
                assert_eq!(first_mismatch(&got, &want), None, "n={n} {b:?}");
            }
        }
        let wide = Codebook::custom(&[0.0, 1.0, span as f32 + 1.0]).unwrap();
        let pw = PackedWeights::from_codes(wide, 8, 64, 64, &[2u8; 512], vec![1.0; 8], None, None)
            .unwrap();
        let plan = make_plan(&pw, 4, &i16_opts(b)).unwrap();
        assert!(!dense::applies(&plan, b), "{b:?}");
    }
    // Past a byte, no kernel takes it.
    let cb = Codebook::custom(&[0.0, 1.0, 256.0]).unwrap();
    let pw =
        PackedWeights::from_codes(cb, 8, 64, 64, &[2u8; 512], vec![1.0; 8], None, None).unwrap();
    assert!(dense::ints(&make_plan(&pw, 4, &i16_opts(Backend::Auto)).unwrap()).is_none());
}

#[test]
fn every_kernel_this_cpu_has_gives_the_same_bits() {
    // Backend `avx2` runs the AVX-VNNI kernel where the CPU has AVX-VNNI, so the plain AVX2
    // one (`vpmaddubsw` + `vpmaddwd`) is run here by kind: each kernel this CPU has against the
    // scalar kernel, over GEMVs and narrow calls of full and ragged row blocks, zero points,
    // float32 and float16 scales (the latter widened by the kernels), 8-bit codes, looked-up
    // codes and slopes other than 1; a kernel is refused what it cannot sum (AVX2 without
    // AVX-VNNI: spans past 64 and the 2-bit layout).
    let kinds: Vec<dense::Kind> = [
        dense::Kind::Vnni512,
        dense::Kind::Amx,
        dense::Kind::Avx2,
        dense::Kind::AvxVnni,
        dense::Kind::Sdot,
    ]
    .into_iter()
    .filter(|k| k.available())
    .collect();
    let (mut ran, mut refused) = (0, 0);
    let codebooks = [
        (Codebook::new(Format::Int4).unwrap(), false),
        (Codebook::new(Format::Uint4).unwrap(), true),
        (Codebook::new(Format::Int3).unwrap(), false),
        (Codebook::new(Format::Int2).unwrap(), false),
        (Codebook::new(Format::Fp4).unwrap(), false),
        (Codebook::new(Format::Int8).unwrap(), false),
        (Codebook::new(Format::Uint8).unwrap(), true),
        (
            Codebook::custom(&[-6.0, -4.0, -2.0, 0.0, 2.0, 4.0, 6.0, 8.0]).unwrap(),
            true,
        ),
        (
            Codebook::custom(&[-12.0, -1.0, 0.0, 2.0, 52.0]).unwrap(),
            false,
        ),
        // A span of 255: AVX-VNNI's and AVX-512 VNNI's, past AVX2's int16 pairs.
        (
            Codebook::custom(&[-100.0, -3.0, 0.0, 5.0, 17.0, 155.0]).unwrap(),
            false,
        ),
    ];
    let mut r = stream(300, 0);
    for (i, (cb, zeros)) in codebooks.iter().enumerate() {
        for (j, &(m, k, g)) in [
            (64, 128, 8),
            (63, 256, 32),
            (130, 272, 136),
            (200, 512, 128),
        ]
        .iter()
        .enumerate()
        {
            // Float16 scales (kept as float16 bits) for every other shape.
            let f16 = (i + j) % 2 == 1;
            let codes: Vec<u8> = (0..m * k)
                .map(|_| below(&mut r, cb.levels() as u64) as u8)
                .collect();
            let scales: Vec<f32> = (0..m * k / g)
                .map(|_| {
                    let s = 0.003 + below(&mut r, 1000) as f32 * 1e-4;
                    if f16 {
                        half::f16::from_f32(s).to_f32()
                    } else {
                        s
                    }
                })
                .collect();
            let z = zeros.then(|| {
                (0..m * k / g)
                    .map(|_| below(&mut r, 16) as f32 - if f16 { 0.0 } else { 0.3 })
                    .collect()
            });
            let pw =
                PackedWeights::from_codes(cb.clone(), m, k, g, &codes, scales, z, None).unwrap();
            assert_eq!(matches!(pw.tiled_scales(), Tiled::F16(_)), f16);
            for n in [1, 2, 3, 5, 7, 9] {
                let x = activations(k, n, 40 + n as u64);
                let want = gemm(&pw, &x, n, &i16_opts(Backend::Scalar)).unwrap();
                // `run` reads X transposed, `(N, K)` (no act-order here: unpermuted).
                let xt: Vec<f32> = (0..n * k).map(|t| x[(t % k) * n + t / k]).collect();
                for &kind in &kinds {
                    let plan = make_plan(&pw, n, &i16_opts(kind.backend())).unwrap();
                    if !dense::applies(&plan, kind.backend()) {
                        continue;
                    }
                    let mut got = vec![0f32; m * n];
                    let res = dense::run_with_kind(&pw, &plan, kind, &xt, &mut got, YLayout::MbyN);
                    if kind == dense::Kind::Avx2 {
                        let ints = dense::ints(&plan).unwrap();
                        let wide = ints.map.is_some() && ints.u_max > 64;
                        if wide || dense::two_bit(&plan, Backend::Avx2) {
                            assert!(res.is_err(), "{cb:?} span {}", ints.u_max);
                            refused += 1;
                            continue;
                        }
                    }
                    res.unwrap();
                    if let Some(t) = first_mismatch(&got, &want) {
                        panic!(
                            "{kind:?} {cb:?} M={m} K={k} G={g} n={n} f16={f16}: y[{t}] = {} vs \
                             scalar {}",
                            got[t], want[t]
                        );
                    }
                    ran += 1;
                }
            }
        }
    }
    eprintln!("{ran} runs over the kernels {kinds:?}, {refused} refused");
    if kinds.contains(&dense::Kind::Avx2) {
        assert!(ran >= 100, "{ran}");
    }
    if kinds.contains(&dense::Kind::AvxVnni) {
        // The wide codebook's calls (and, on CPUs without AVX-512 VNNI, the 2-bit GEMVs) on
        // plain AVX2.
        assert!(refused >= 16, "{refused}");
    }
    // A kernel this CPU does not have is refused.
    #[cfg(target_arch = "x86_64")]
    {
        let pw = random_weights(&codebooks[0].0, (64, 128, 32), false, false, 1);
        let plan = make_plan(&pw, 1, &i16_opts(Backend::Auto)).unwrap();
        let mut y = vec![0f32; 64];
        let x = vec![0.5f32; 128];
        assert!(
            dense::run_with_kind(&pw, &plan, dense::Kind::Sdot, &x, &mut y, YLayout::MbyN).is_err()
        );
    }
}
