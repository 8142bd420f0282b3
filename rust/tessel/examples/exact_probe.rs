use maleki_tessel::premises::{builtin, Options};
use maleki_tessel::exact::{solve, ExactOptions};
use maleki_tessel::MemoryConvention;
use maleki_common::NoProgress;
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let d: usize = a[2].parse().unwrap();
    let m: i64 = a[3].parse().unwrap();
    let n: usize = a[4].parse().unwrap();
    let o = if a.get(5).is_some() { Options::inference() } else { Options::default() };
    let p = builtin(&a[1], d, &o).unwrap();
    let t = std::time::Instant::now();
    let r = solve(&p, n, &vec![m; d], MemoryConvention::Start, None, &ExactOptions::default(), &NoProgress);
    match r { Ok(Some(r)) => println!("{} D{d} M{m} N{n}: C={} proved={} nodes={} {:.1} ms", a[1], r.makespan, r.proved_optimal, r.nodes, t.elapsed().as_secs_f64()*1e3),
      other => println!("{:?}", other.map(|_| ())) }
}
