//! Every search output passes the full validator (V1-V4 under its caps), is at least LB(N),
//! and round-trips through every format: the validator and the formats are the oracles here.

use std::sync::Arc;

use maleki_common::progress::NoProgress;
use maleki_tessel::formats::{self, Document};
use maleki_tessel::premises::{builtin, Options};
use maleki_tessel::search::{search, SearchOptions};
use maleki_tessel::simulate::simulate;
use maleki_tessel::validate::validate;
use maleki_tessel::UNLIMITED;

#[test]
fn search_outputs_are_valid_and_round_trip() {
    let cases: &[(&str, bool, i64, usize)] = &[
        ("vshape", true, 4, 8),
        ("mshape", true, 6, 8),
        ("kshape", true, 6, 6),
        ("xshape", true, 4, 5),
        ("nnshape", true, 6, 6),
        ("mshape", false, UNLIMITED, 6),
        ("kshape", false, UNLIMITED, 16),
    ];
    for &(name, train, mem, nm) in cases {
        let o = if train {
            Options::default()
        } else {
            Options::inference()
        };
        let p = builtin(name, 4, &o).unwrap();
        let mut opts = SearchOptions::new(vec![mem; 4], nm);
        opts.time_limit = Some(10.0);
        let r = search(&p, &opts, &NoProgress).unwrap();
        let s = &r.schedule;
        let rep = validate(s, 5);
        assert!(rep.is_valid(), "{name}: {:?}", rep.violations);
        assert!(
            s.memory.iter().all(|&m| m == mem),
            "{name}: the caps travel with the schedule"
        );
        assert!(s.makespan() >= p.makespan_lower_bound(nm));
        let doc = Document::new(s.clone());
        assert_eq!(
            formats::from_json(&formats::to_json(&doc))
                .unwrap()
                .schedule,
            *s
        );
        let back =
            formats::from_text(&formats::to_text(s, false).unwrap(), s.premise.clone()).unwrap();
        assert_eq!(back.starts, s.starts);
        let t = formats::from_tessel_json(&formats::to_tessel_json(s), Some(s.premise.clone()))
            .unwrap();
        assert_eq!(t.starts, s.starts);
        // The CSV keeps the orders; ASAP re-timing never makes the schedule longer.
        let (n2, orders) = formats::csv_to_orders(&formats::to_csv(s), &s.premise).unwrap();
        let mut re = simulate(Arc::clone(&s.premise), n2, &orders).unwrap();
        assert!(re.makespan() <= s.makespan());
        // Same per-device orders, so the same memory profile: still within the caps.
        re.memory = s.memory.clone();
        assert!(validate(&re, 1).is_valid(), "{name}");
    }
}
