use maleki_tessel::premises::{builtin, Options};
use maleki_tessel::{search, SearchOptions};
use maleki_common::NoProgress;
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let d: usize = a[2].parse().unwrap();
    let m: i64 = a[3].parse().unwrap();
    let pmin: i64 = a[4].parse().unwrap();
    let budget: u64 = a[5].parse().unwrap();
    let p = builtin(&a[1], d, &Options::default()).unwrap();
    for n in [8usize, 32, 128] {
        let mut so = SearchOptions::new(vec![m; d], n);
        so.periodic_k = 2; so.min_period = pmin; so.delta_p = 1; so.node_budget = budget;
        let t = std::time::Instant::now();
        match search(&p, &so, &NoProgress) {
          Ok(r) => println!("N{n}: C={} P={} {:.1}ms nodes={} cands={:?}", r.schedule.makespan(), r.period, t.elapsed().as_secs_f64()*1e3, r.nodes, r.candidates.iter().map(|c| (c.period, c.length, c.makespan)).collect::<Vec<_>>()),
          Err(e) => println!("N{n}: err {e}") }
    }
}
