use maleki_common::{pool, rng};
use maleki_msgemm::gemm::{plan, transpose_permute, XLayout};
use maleki_msgemm::kernels::{self, Backend};
use maleki_msgemm::table::TableSet;
use maleki_msgemm::{gemm_into, quantize, Depth, Format, GemmOptions, QuantizeOptions, TablePrecision};
fn cpu() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap();
    let f: Vec<&str> = s.rsplit(')').next().unwrap().split_whitespace().collect();
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
}
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let what = a[1].as_str();
    let reps: usize = a[2].parse().unwrap();
    let th: usize = a.get(3).map(|s| s.parse().unwrap()).unwrap_or(1);
    let fmt = a.get(4).map(|s| Format::from_name(s).unwrap()).unwrap_or(Format::Int4);
    let d: usize = a.get(5).map(|s| s.parse().unwrap()).unwrap_or(2);
    let n: usize = a.get(6).map(|s| s.parse().unwrap()).unwrap_or(1);
    pool::set_num_threads(th).unwrap();
    let m: usize = std::env::var("M").map(|s| s.parse().unwrap()).unwrap_or(4096); let k = 4096;
    let mut r = rng::stream(1, 0);
    let w: Vec<f32> = (0..m * k).map(|_| rng::below(&mut r, 1000) as f32 / 500.0 - 1.0).collect();
    let pw = quantize(&w, m, k, &QuantizeOptions { group_size: Some(std::env::var("G").map(|s| s.parse().unwrap()).unwrap_or(if fmt == Format::Int2 {64} else {128})), ..QuantizeOptions::new(fmt) }).unwrap();
    let x: Vec<f32> = (0..k * n).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let opts = GemmOptions { depth: Depth::Fixed(d), precision: TablePrecision::I8, backend: Backend::Auto, mirror: false };
    let mut y = vec![0f32; m * n];
    gemm_into(&pw, &x, n, XLayout::KbyN, &opts, &mut y).unwrap();
    let t0 = std::time::Instant::now(); let c0 = cpu();
    match what {
        "tables" => {
            let p = plan(&pw, n, &opts).unwrap();
            let xt = transpose_permute(&pw, &x, n, XLayout::KbyN);
            let kk = kernels::select(Backend::Auto, &p).unwrap();
            let mut set = TableSet::zeroed(&p, 0..p.groups, 0..n);
            for _ in 0..reps { pool::install(|| kk.build_tables(&p, &xt, &mut set)); }
        }
        "cold" => {
            let sets: Vec<_> = (0..9u64).map(|sd| {
                let mut r = rng::stream(10 + sd, 0);
                let w: Vec<f32> = (0..m * k).map(|_| rng::below(&mut r, 1000) as f32 / 500.0 - 1.0).collect();
                let p = quantize(&w, m, k, &QuantizeOptions { group_size: Some(128), ..QuantizeOptions::new(fmt) }).unwrap();
                gemm_into(&p, &x, n, XLayout::KbyN, &opts, &mut y).unwrap();
                p
            }).collect();
            let t1 = std::time::Instant::now(); let c1 = cpu();
            for i in 0..reps { pool::install(|| gemm_into(&sets[i % 9], &x, n, XLayout::KbyN, &opts, &mut y).unwrap()); }
            println!("cold: {:.1} us/iter (wall) {:.1} us/iter cpu", t1.elapsed().as_secs_f64() * 1e6 / reps as f64, (cpu() - c1) * 1e6 / reps as f64);
        }
        _ => for _ in 0..reps { pool::install(|| gemm_into(&pw, &x, n, XLayout::KbyN, &opts, &mut y).unwrap()); },
    }
    println!("{what}: {:.1} us/iter (wall) {:.1} us/iter cpu", t0.elapsed().as_secs_f64() * 1e6 / reps as f64, (cpu() - c0) * 1e6 / reps as f64);
}
