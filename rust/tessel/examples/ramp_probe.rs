use maleki_tessel::premises::{builtin, Options};
use maleki_tessel::repetend::{construct, RepetendOptions};
use maleki_tessel::complete::{complete, RampOptions};
use maleki_tessel::MemoryConvention;
use maleki_common::NoProgress;
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let d: usize = a[2].parse().unwrap();
    let m: i64 = a[3].parse().unwrap();
    let budget: u64 = a[4].parse().unwrap();
    let p = builtin(&a[1], d, &Options::default()).unwrap();
    let r = construct(&p, &RepetendOptions::new(vec![m; d]), &NoProgress).unwrap();
    let t = r.periods[0].best.clone().unwrap();
    println!("P={} L={}", t.period, t.length(&p));
    for n in [6usize, 8, 9, 10, 11, 12, 14, 16, 32] {
        let ti = std::time::Instant::now();
        let c = complete(&p, &t, n, &vec![m; d], MemoryConvention::Start, Some(&RampOptions { node_budget: budget, deadline: None }), &NoProgress).unwrap();
        println!("N={n}: C={} = {}N{:+} {} {:.1}ms", c.makespan, t.period, c.makespan - t.period * n as i64, c.method.as_str(), ti.elapsed().as_secs_f64()*1e3);
    }
}
