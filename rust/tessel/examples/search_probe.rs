use maleki_tessel::premises::{builtin, Options};
use maleki_tessel::{search, SearchOptions};
use maleki_common::NoProgress;
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let d: usize = a[2].parse().unwrap();
    let m: i64 = a[3].parse().unwrap();
    let k: usize = std::env::var("K").map(|v| v.parse().unwrap()).unwrap_or(1);
    let o = if a.get(4).is_some() { Options::inference() } else { Options::default() };
    let p = builtin(&a[1], d, &o).unwrap();
    let mut line = format!("{} D{d} M{m} K{k}:", a[1]);
    for n in [8usize, 32, 128] {
        let mut so = SearchOptions::new(vec![m; d], n);
        so.periodic_k = k;
        let r = search(&p, &so, &NoProgress).unwrap();
        line += &format!(" N{n}: C={} ({}N{:+}) P={} {} {:.1}ms |", r.schedule.makespan(), r.period, r.schedule.makespan() - r.period * n as i64 / k as i64, r.period, r.method.as_str(), r.search_time*1e3);
    }
    println!("{line}");
}
