use maleki_tessel::premises::{builtin, Options};
use maleki_tessel::repetend::{construct, RepetendOptions};
use maleki_common::NoProgress;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let name = &args[1];
    let d: usize = args[2].parse().unwrap();
    let m: i64 = args.get(3).map(|s| s.parse().unwrap()).unwrap_or(i64::MAX);
    let infer = args.get(4).is_some();
    let o = if infer { Options::inference() } else { Options::default() };
    let p = builtin(name, d, &o).unwrap();
    let t = std::time::Instant::now();
    let mut ro = RepetendOptions::new(vec![m; d]); if let Ok(v) = std::env::var("DP") { ro.delta_p = v.parse().unwrap(); } let r = construct(&p, &ro, &NoProgress);
    println!("{name} D{d} M{m}: {:?} ms", t.elapsed().as_secs_f64()*1e3);
    match r { Ok(r) => { println!("P*={:?} proved={} nodes={}", r.min_period, r.min_period_proved, r.nodes);
      for o in &r.periods { println!("  P={} L={:?} first_L={:?} exh={} nodes={} a={:?}", o.period, o.best.as_ref().map(|t| t.length(&p)), o.first.as_ref().map(|t| t.length(&p)), o.exhausted, o.nodes, o.best.as_ref().map(|t| &t.starts)); } }
      Err(e) => println!("err {e}") }
}
