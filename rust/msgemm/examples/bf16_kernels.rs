//! Times every `bf16` kernel this CPU runs on the same call, one after another per round, so
//! that the ratios come from the same minutes of a noisy machine.
//! `cargo run --release --example bf16_kernels -p maleki-msgemm -- THREADS N1,N2,.. ROUNDS`
//! (defaults 2, `1,4,8,12,16,64`, 5). Environment: `M` rows and `K` inputs (default 4096),
//! `G` group size (default 64); the weights are nf4. Prints per kernel and N the minimum over
//! the rounds (each round the minimum of 10 calls) in ms.
use maleki_common::{pool, rng};
use maleki_msgemm::bf16::{gemm_with_kernel, prepare, Kernel};
use maleki_msgemm::gemm::{XLayout, YLayout};
use maleki_msgemm::{quantize, Format, QuantizeOptions};
use std::time::Instant;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(2);
    let ns: Vec<usize> = args
        .get(2)
        .map(|s| s.split(',').map(|v| v.parse().unwrap()).collect())
        .unwrap_or(vec![1, 4, 8, 12, 16, 64]);
    let rounds: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(5);
    let (m, k, g) = (env("M", 4096), env("K", 4096), env("G", 64));
    pool::set_num_threads(threads).unwrap();
    let mut r = rng::stream(1, 0);
    let w: Vec<f64> = (0..m * k).map(|_| rng::standard_normal(&mut r)).collect();
    let opts = QuantizeOptions {
        group_size: Some(g),
        ..QuantizeOptions::new(Format::Nf4)
    };
    let pw = quantize(&w, m, k, &opts).unwrap();
    pool::install(|| prepare(&pw)).unwrap();
    let kernels: Vec<Kernel> = Kernel::ALL.into_iter().filter(|k| k.runs_here()).collect();
    println!("nf4 g{g} {m} x {k}, {threads} threads, minima of {rounds} rounds (ms)");
    println!(
        "{:>4} {}",
        "N",
        kernels
            .iter()
            .map(|k| format!("{:>18}", k.id()))
            .collect::<String>()
    );
    for &n in &ns {
        let x: Vec<f32> = (0..k * n)
            .map(|_| rng::standard_normal(&mut r) as f32)
            .collect();
        let mut y = vec![0f32; m * n];
        let mut best = vec![f64::MAX; kernels.len()];
        for _ in 0..rounds {
            for (i, &kernel) in kernels.iter().enumerate() {
                let mut call = || {
                    gemm_with_kernel(&pw, &x, n, XLayout::KbyN, YLayout::MbyN, kernel, &mut y)
                        .unwrap()
                };
                call();
                for _ in 0..10 {
                    let t = Instant::now();
                    call();
                    best[i] = best[i].min(t.elapsed().as_secs_f64() * 1e3);
                }
            }
        }
        println!(
            "{n:>4} {}",
            best.iter()
                .map(|b| format!("{b:>18.3}"))
                .collect::<String>()
        );
    }
}
