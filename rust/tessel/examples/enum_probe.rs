use maleki_tessel::premises::{builtin, Options};
use maleki_tessel::repetend::{enumerate, RepetendOptions};
use maleki_tessel::complete::complete_quick;
use maleki_tessel::MemoryConvention;
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let d: usize = a[2].parse().unwrap();
    let m: i64 = a[3].parse().unwrap();
    let period: i64 = a[4].parse().unwrap();
    let maxl: i64 = a[5].parse().unwrap();
    let p = builtin(&a[1], d, &Options::default()).unwrap();
    let t0 = std::time::Instant::now();
    let ts = enumerate(&p, period, &RepetendOptions::new(vec![m; d]), maxl, 100000).unwrap();
    println!("{} templates in {:.1} ms", ts.len(), t0.elapsed().as_secs_f64()*1e3);
    let mut best = (i64::MAX, 0);
    let mut hist = std::collections::BTreeMap::new();
    for (i, t) in ts.iter().enumerate() {
        let c = complete_quick(&p, t, 32, &vec![m; d], MemoryConvention::Start).makespan - 32 * period;
        *hist.entry((t.length(&p), c)).or_insert(0) += 1;
        if c < best.0 { best = (c, i); }
    }
    println!("best: {}N{:+} L={} a={:?}", period, best.0, ts[best.1].length(&p), ts[best.1].starts);
    println!("{:?}", hist);
    println!("total {:.1} ms", t0.elapsed().as_secs_f64()*1e3);
}
