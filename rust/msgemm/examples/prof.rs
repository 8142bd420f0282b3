//! Profiling harness: table build and accumulate timed apart (min of many repeats).
//! `cargo run --release --example prof -p maleki-msgemm -- THREADS N1,N2 FORMAT REPS`.
//! Environment: `M` rows and `K` inputs (default 4096), `G` group size, `D` depth; `TOTAL_ONLY=1` only the whole call, from this thread
//! and from inside the pool; `COLD=S` the GEMV warm and over a rotation of `S` weight sets;
//! `BACKEND=avx2` a named kernel; `TABLE=i16` a table precision; `MIRROR=1` half tables by the codebook's mirror symmetry; `BUILD_ONLY=1` the table build alone,
//! `SCALES=f16` scales rounded to float16 (the kernels read them as float16), `MEDIAN=1` median
//! times instead of minima,
//! on this thread. Whole calls are made from this thread, as the Python binding makes them.
use maleki_common::{pool, rng};
use maleki_msgemm::gemm::{plan, transpose_permute, XLayout};
use maleki_msgemm::kernels::{self, Backend, RowJob};
use maleki_msgemm::table::TableSet;
use maleki_msgemm::{
    gemm_into, quantize, Depth, Format, GemmOptions, QuantizeOptions, ScaleDtype, TablePrecision,
};
use std::time::Instant;

fn gaussian(len: usize, seed: u64) -> Vec<f32> {
    let mut r = rng::stream(seed, 0);
    (0..len)
        .map(|_| rng::standard_normal(&mut r) as f32)
        .collect()
}
fn tmin(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        f();
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    // `MEDIAN=1`: the median call instead of the fastest (what a loop of calls averages).
    let pick = if std::env::var("MEDIAN").is_ok_and(|v| v == "1") {
        times[times.len() / 2]
    } else {
        times[0]
    };
    pick * 1e3
}
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1);
    let ns: Vec<usize> = args
        .get(2)
        .map(|s| s.split(',').map(|v| v.parse().unwrap()).collect())
        .unwrap_or(vec![1]);
    let fmt = args.get(3).map(|s| s.as_str()).unwrap_or("int4");
    let reps: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(300);
    pool::set_num_threads(threads).unwrap();
    let m: usize = std::env::var("M")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4096);
    let k: usize = std::env::var("K")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4096);
    let (f, g, d) = match fmt {
        "int2" => (Format::Int2, 64, 4),
        "ternary" => (Format::Ternary, 128, 5),
        "uint4" => (Format::Uint4, 128, 2),
        "nf4" => (Format::Nf4, 128, 2),
        "fp4" => (Format::Fp4, 32, 2),
        "int8" => (Format::Int8, 32, 1),
        "fp8" => (Format::Fp8E4m3, 128, 1),
        "fp8_e5m2" => (Format::Fp8E5m2, 128, 1),
        _ => (Format::Int4, 128, 2),
    };
    // `G` overrides the group size.
    let g: usize = std::env::var("G")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(g);
    // `D` overrides the depth.
    let d: usize = std::env::var("D")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(d);
    // `BACKEND` names the kernel (default auto).
    let backend = std::env::var("BACKEND")
        .map(|b| Backend::from_name(&b).unwrap())
        .unwrap_or(Backend::Auto);
    // `TABLE` names the table precision (default i8).
    let precision = std::env::var("TABLE")
        .map(|t| TablePrecision::from_name(&t).unwrap())
        .unwrap_or(TablePrecision::I8);
    let w = gaussian(m * k, 1);
    let qo = QuantizeOptions {
        group_size: Some(g),
        symmetric: Some(fmt != "uint4"),
        scale_dtype: match std::env::var("SCALES").as_deref() {
            Ok("f16") => ScaleDtype::F16,
            _ => ScaleDtype::F32,
        },
        ..QuantizeOptions::new(f)
    };
    let pw = quantize(&w, m, k, &qo).unwrap();
    if let Ok(sets) = std::env::var("COLD").map(|s| s.parse::<usize>().unwrap()) {
        // A rotation of `sets` weight sets (more than 2x L3 in all): each call reads its
        // weights from DRAM. Time per call, min over rounds of whole rotations.
        let pws: Vec<_> = (0..sets)
            .map(|i| quantize(&gaussian(m * k, 10 + i as u64), m, k, &qo).unwrap())
            .collect();
        let x = gaussian(k, 2);
        let mut y = vec![0f32; m];
        let opts = GemmOptions {
            depth: Depth::Fixed(d),
            precision,
            backend,
            mirror: std::env::var("MIRROR").is_ok_and(|v| v == "1"),
        };
        let warm = tmin(reps, || {
            gemm_into(&pw, &x, 1, XLayout::KbyN, &opts, &mut y).unwrap();
        });
        let cold = tmin(reps / sets + 3, || {
            for p in &pws {
                gemm_into(p, &x, 1, XLayout::KbyN, &opts, &mut y).unwrap();
            }
        }) / sets as f64;
        println!("{fmt} threads={threads} warm {warm:.3} ms cold {cold:.3} ms");
        return;
    }
    for &n in &ns {
        let x = gaussian(k * n, 2);
        let mut y = vec![0f32; m * n];
        let opts = GemmOptions {
            depth: Depth::Fixed(d),
            precision,
            backend,
            mirror: std::env::var("MIRROR").is_ok_and(|v| v == "1"),
        };
        let r = if n > 4 { reps / 10 + 3 } else { reps };
        // From this thread, as the Python binding calls it (a GEMV on 1-2 threads then runs
        // here and on at most one worker).
        let total = tmin(r, || {
            gemm_into(&pw, &x, n, XLayout::KbyN, &opts, &mut y).unwrap();
        });
        if std::env::var("TOTAL_ONLY").is_ok() {
            // The same calls from inside the pool (no hand-off from this thread to a worker).
            let inside = pool::install(|| {
                tmin(r, || {
                    gemm_into(&pw, &x, n, XLayout::KbyN, &opts, &mut y).unwrap();
                })
            });
            println!("{fmt} threads={threads} n={n} total {total:.4} ms (called from a worker {inside:.4} ms)");
            continue;
        }
        let p = plan(&pw, n, &opts).unwrap();
        // The plan and kernel a call runs (the mirror plan where it gives the same bits).
        let (p, kern) = maleki_msgemm::gemm::execution_plan(&pw, &p, backend).unwrap();
        let xt = transpose_permute(&pw, &x, n, XLayout::KbyN)
            .unwrap()
            .into_owned();
        let mut set = TableSet::zeroed(&p, 0..p.groups, 0..n);
        if std::env::var("BUILD_ONLY").is_ok() {
            // Only the table build, on this thread (for a sampling profiler).
            let b = tmin(reps, || {
                if !kern.build_tables(&p, &xt, &mut set, false) {
                    maleki_msgemm::table::build_scalar(&p, &xt, &mut set, false);
                }
            });
            println!(
                "{fmt} n={n} build {b:.4} ms, {:.0} ns per group",
                b * 1e6 / (p.groups * n) as f64
            );
            continue;
        }
        let build = tmin(r, || {
            pool::install(|| {
                if !kern.build_tables(&p, &xt, &mut set, true) {
                    maleki_msgemm::table::build_scalar(&p, &xt, &mut set, true);
                }
            })
        });
        let layout = pw.layout_for(&p, kern.layout_kind(&p)).unwrap();
        let job = |row_blocks: std::ops::Range<usize>| RowJob {
            plan: &p,
            layout,
            scales: pw.tiled_scales(),
            zeros: maleki_msgemm::gemm::job_zeros(&pw, &p),
            tables: &set,
            row_blocks,
        };
        let mut y2 = maleki_msgemm::aligned::AlignedVec::<f32>::zeroed(m * n);
        let acc = if set.nbytes() <= maleki_msgemm::gemm::TABLE_BUDGET {
            tmin(r, || kern.accumulate(&job(0..p.row_blocks), &mut y2))
        } else {
            f64::NAN
        };
        let alloc = tmin(r, || {
            std::hint::black_box(TableSet::zeroed(&p, 0..p.groups, 0..n));
        });
        let par = if set.nbytes() <= maleki_msgemm::gemm::TABLE_BUDGET {
            use rayon::prelude::*;
            let rb: usize = std::env::var("RB")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(8);
            tmin(r, || {
                pool::install(|| {
                    y2.par_chunks_mut(rb * 64 * n)
                        .enumerate()
                        .for_each(|(i, yc)| {
                            kern.accumulate(&job(i * rb..((i + 1) * rb).min(p.row_blocks)), yc)
                        })
                })
            })
        } else {
            f64::NAN
        };
        let tplan = tmin(r, || {
            std::hint::black_box(plan(&pw, n, &opts).unwrap());
        });
        let ttr = tmin(r, || {
            std::hint::black_box(
                transpose_permute(&pw, &x, n, XLayout::KbyN)
                    .unwrap()
                    .into_owned(),
            );
        });
        let tsel = tmin(r, || {
            std::hint::black_box(kernels::select(backend, &p).unwrap());
        });
        println!("  plan {tplan:.4} transpose {ttr:.4} select {tsel:.4}");
        println!("  alloc {alloc:.3} ms  parallel accumulate {par:.3} ms");
        println!("{fmt} threads={threads} n={n} backend={} total {total:.3} ms  build {build:.3} ms  accumulate(1 thread, all rows) {acc:.3} ms", kern.backend().name());
    }
}
