//! Validation of schedules (spec §1, V1-V4) and of templates (spec §2, T1-T3).
//!
//! Unlike a yes/no check, these functions report *every* violation, each naming the rule,
//! the jobs and the times involved, so that a user can see at once what is wrong with an
//! imported or hand-made schedule. Reports are capped (`limit`) to keep pathological inputs
//! (every job at time 0) from allocating without bound; the total count is always exact.

use std::fmt;

use crate::model::{Premise, Schedule, UNLIMITED};
use crate::template::{steady_peak, Template};
use crate::MemoryConvention;

/// A job: `(micro-batch j, block g)`.
pub type Job = (usize, usize);

/// The rule a violation breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rule {
    /// Starts are integers `>= 0`.
    V0,
    /// Precedence: `S(h, j) >= S(g, j) + s_g + c_gh`.
    V1,
    /// Exclusivity: the jobs of a device never overlap.
    V2,
    /// Memory: `mem_d(t) <= M_d` at all times.
    V3,
    /// FIFO per block: `S(g, j) < S(g, j + 1)`.
    V4,
    /// Template precedence: `a_h >= a_g + s_g + c_gh`.
    T1,
    /// Template exclusivity on the circle `Z_P`.
    T2,
    /// Template steady-state peak within the cap.
    T3,
}

impl Rule {
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::V0 => "V0",
            Rule::V1 => "V1",
            Rule::V2 => "V2",
            Rule::V3 => "V3",
            Rule::V4 => "V4",
            Rule::T1 => "T1",
            Rule::T2 => "T2",
            Rule::T3 => "T3",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One violation.
///
/// `jobs` lists the jobs involved (for template rules, `j` is 0 and `g` the block);
/// `times` the times that conflict (see each rule's message for their meaning);
/// `device` the device, for V2/V3/T2/T3.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub rule: Rule,
    pub device: Option<usize>,
    pub jobs: Vec<Job>,
    pub times: Vec<i64>,
    pub message: String,
}

/// Every violation found (up to `limit` of them kept) and the exact total.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub violations: Vec<Violation>,
    pub total: usize,
}

impl Report {
    /// True when nothing is violated.
    pub fn is_valid(&self) -> bool {
        self.total == 0
    }
    /// The number of violations of `rule` among the kept ones.
    pub fn count(&self, rule: Rule) -> usize {
        self.violations.iter().filter(|v| v.rule == rule).count()
    }
}

struct Collector {
    report: Report,
    limit: usize,
}

impl Collector {
    fn new(limit: usize) -> Self {
        Collector {
            report: Report::default(),
            limit,
        }
    }
    fn wants(&self) -> bool {
        self.report.violations.len() < self.limit
    }
    /// Counts a violation; builds it only when it will be kept.
    fn push(&mut self, make: impl FnOnce() -> Violation) {
        if self.wants() {
            self.report.violations.push(make());
        }
        self.report.total += 1;
    }
}

/// `"F3 (block 2) of micro-batch 5"`.
pub fn job_name(p: &Premise, (j, g): Job) -> String {
    format!("{} (block {g}) of micro-batch {j}", p.block(g).name)
}

/// Validates a schedule: every violation of V0 (negative start), V1, V2, V3 (under the
/// schedule's memory caps and convention) and V4 (when `s.fifo`). Keeps at most `limit`
/// violations in the report; `total` counts them all.
pub fn validate(s: &Schedule, limit: usize) -> Report {
    let mut c = Collector::new(limit);
    let p = &*s.premise;
    let n = p.nblocks();
    let nm = s.nmicros;
    // V0.
    for j in 0..nm {
        for g in 0..n {
            let t = s.start(j, g);
            if t < 0 {
                c.push(|| Violation {
                    rule: Rule::V0,
                    device: None,
                    jobs: vec![(j, g)],
                    times: vec![t],
                    message: format!("V0: {} starts at {t} < 0", job_name(p, (j, g))),
                });
            }
        }
    }
    // V1.
    for e in p.edges() {
        let sg = p.span(e.from);
        for j in 0..nm {
            let need = s.start(j, e.from) + sg + e.lag;
            let got = s.start(j, e.to);
            if got < need {
                c.push(|| Violation {
                    rule: Rule::V1,
                    device: None,
                    jobs: vec![(j, e.from), (j, e.to)],
                    times: vec![need, got],
                    message: format!(
                        "V1: {} starts at {got}, before {} ends{} at {need}",
                        job_name(p, (j, e.to)),
                        job_name(p, (j, e.from)),
                        if e.lag > 0 {
                            format!(" plus lag {}", e.lag)
                        } else {
                            String::new()
                        }
                    ),
                });
            }
        }
    }
    // V2: sweep each device's jobs by start, keeping the ones still running.
    let mut jobs: Vec<(i64, i64, usize, usize)> = Vec::new();
    let mut active: Vec<(i64, i64, usize, usize)> = Vec::new();
    for d in 0..p.ndevs() {
        jobs.clear();
        for &g in p.blocks_on(d) {
            for j in 0..nm {
                jobs.push((s.start(j, g), s.end(j, g), j, g));
            }
        }
        jobs.sort_unstable();
        active.clear();
        for &x in &jobs {
            active.retain(|a| a.1 > x.0);
            for &a in &active {
                c.push(|| Violation {
                    rule: Rule::V2,
                    device: Some(d),
                    jobs: vec![(a.2, a.3), (x.2, x.3)],
                    times: vec![a.0, a.1, x.0, x.1],
                    message: format!(
                        "V2: on device {d}, {} [{}, {}) overlaps {} [{}, {})",
                        job_name(p, (a.2, a.3)),
                        a.0,
                        a.1,
                        job_name(p, (x.2, x.3)),
                        x.0,
                        x.1
                    ),
                });
            }
            active.push(x);
        }
    }
    // V3: one violation per maximal interval above the cap.
    for d in 0..p.ndevs() {
        let cap = s.memory.get(d).copied().unwrap_or(UNLIMITED);
        if cap == UNLIMITED {
            continue;
        }
        let mut ev: Vec<(i64, i64, usize, usize)> = Vec::new();
        for &g in p.blocks_on(d) {
            let mu = p.block(g).memory;
            if mu == 0 {
                continue;
            }
            for j in 0..nm {
                ev.push((
                    s.convention.effect_time(s.start(j, g), p.span(g), mu),
                    mu,
                    j,
                    g,
                ));
            }
        }
        ev.sort_unstable();
        let mut level = 0i64;
        let mut k = 0;
        // (start time, peak, jobs that raised the level at the start)
        let mut open: Option<(i64, i64, Vec<Job>)> = None;
        while k < ev.len() {
            let t = ev[k].0;
            let first = k;
            while k < ev.len() && ev[k].0 == t {
                level += ev[k].1;
                k += 1;
            }
            match (&mut open, level > cap) {
                (None, true) => {
                    let raisers = ev[first..k]
                        .iter()
                        .filter(|e| e.1 > 0)
                        .map(|e| (e.2, e.3))
                        .collect();
                    open = Some((t, level, raisers));
                }
                (Some(o), true) => o.1 = o.1.max(level),
                (Some(_), false) => {
                    let (t0, peak, raisers) = open.take().expect("open interval");
                    push_memory(&mut c, p, d, cap, t0, t, peak, raisers);
                }
                (None, false) => {}
            }
        }
        if let Some((t0, peak, raisers)) = open.take() {
            // Only possible for an unbalanced count; report it as open-ended at the last event.
            let last = ev.last().map_or(t0, |e| e.0);
            push_memory(&mut c, p, d, cap, t0, last.max(t0), peak, raisers);
        }
    }
    // V4.
    if s.fifo {
        for g in 0..n {
            for j in 1..nm {
                let (a, b) = (s.start(j - 1, g), s.start(j, g));
                if b <= a {
                    c.push(|| Violation {
                        rule: Rule::V4,
                        device: None,
                        jobs: vec![(j - 1, g), (j, g)],
                        times: vec![a, b],
                        message: format!(
                            "V4: {} starts at {b}, not after {} at {a} (FIFO per block)",
                            job_name(p, (j, g)),
                            job_name(p, (j - 1, g))
                        ),
                    });
                }
            }
        }
    }
    c.report
}

#[allow(clippy::too_many_arguments)]
fn push_memory(
    c: &mut Collector,
    p: &Premise,
    d: usize,
    cap: i64,
    t0: i64,
    t1: i64,
    peak: i64,
    raisers: Vec<Job>,
) {
    c.push(|| {
        let who: Vec<String> = raisers.iter().map(|&x| job_name(p, x)).collect();
        Violation {
            rule: Rule::V3,
            device: Some(d),
            message: format!(
                "V3: on device {d}, memory exceeds the cap {cap} during [{t0}, {t1}) (peak {peak}); \
                 it rose above the cap when {} started",
                if who.is_empty() { "no allocation".to_string() } else { who.join(", ") }
            ),
            jobs: raisers,
            times: vec![t0, t1, peak],
        }
    });
}

/// Validates a 1-periodic template: every violation of T1 (precedence), T2 (the blocks of a
/// device overlap on the circle `Z_P`, or its work exceeds `P`) and T3 (the exact steady
/// peak of §2 exceeds the cap), against per-device caps `memory` ([`UNLIMITED`] for none).
/// Errors in shape (wrong number of starts, non-positive period) are reported as T1.
pub fn validate_template(
    premise: &Premise,
    template: &Template,
    memory: &[i64],
    convention: MemoryConvention,
    limit: usize,
) -> Report {
    let mut c = Collector::new(limit);
    let n = premise.nblocks();
    let per = template.period;
    let a = &template.starts;
    if a.len() != n || per < 1 {
        c.push(|| Violation {
            rule: Rule::T1,
            device: None,
            jobs: vec![],
            times: vec![per],
            message: format!(
                "template: expected {n} starts and a positive period, got {} starts and period {per}",
                a.len()
            ),
        });
        return c.report;
    }
    for e in premise.edges() {
        let need = a[e.from] + premise.span(e.from) + e.lag;
        if a[e.to] < need {
            c.push(|| Violation {
                rule: Rule::T1,
                device: None,
                jobs: vec![(0, e.from), (0, e.to)],
                times: vec![need, a[e.to]],
                message: format!(
                    "T1: block {} starts at {}, before block {} ends at {need}",
                    premise.describe(e.to),
                    a[e.to],
                    premise.describe(e.from)
                ),
            });
        }
    }
    for d in 0..premise.ndevs() {
        let on = premise.blocks_on(d);
        let w = premise.work()[d];
        if w > per {
            c.push(|| Violation {
                rule: Rule::T2,
                device: Some(d),
                jobs: on.iter().map(|&g| (0, g)).collect(),
                times: vec![w, per],
                message: format!("T2: the work {w} of device {d} exceeds the period {per}"),
            });
        }
        for (x, &g) in on.iter().enumerate() {
            for &h in &on[x + 1..] {
                let (rg, rh) = (a[g].rem_euclid(per), a[h].rem_euclid(per));
                // Arcs [rg, rg + s_g) and [rh, rh + s_h) of the circle intersect iff one
                // starts inside the other.
                let overlap = (rh - rg).rem_euclid(per) < premise.span(g)
                    || (rg - rh).rem_euclid(per) < premise.span(h);
                if overlap {
                    c.push(|| Violation {
                        rule: Rule::T2,
                        device: Some(d),
                        jobs: vec![(0, g), (0, h)],
                        times: vec![a[g], a[h]],
                        message: format!(
                            "T2: on device {d}, block {} (residue {rg}, span {}) overlaps block {} \
                             (residue {rh}, span {}) modulo P={per}",
                            premise.describe(g),
                            premise.span(g),
                            premise.describe(h),
                            premise.span(h)
                        ),
                    });
                }
            }
        }
    }
    let peaks = steady_peak(premise, per, a, convention);
    for (d, &peak) in peaks.iter().enumerate() {
        let cap = memory.get(d).copied().unwrap_or(UNLIMITED);
        if peak > cap {
            c.push(|| Violation {
                rule: Rule::T3,
                device: Some(d),
                jobs: premise.blocks_on(d).iter().map(|&g| (0, g)).collect(),
                times: vec![peak, cap],
                message: format!(
                    "T3: the steady-state peak {peak} on device {d} exceeds the cap {cap}"
                ),
            });
        }
    }
    c.report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::vshape;

    #[test]
    fn reports_every_violation() {
        let p = vshape(2);
        // One micro-batch, valid: F0 0, F1 1, B1 2, B0 5.
        let ok = Schedule::new(p.clone(), 1, vec![0, 1, 2, 5]).unwrap();
        assert!(validate(&ok, 100).is_valid());
        // Two micro-batches all at the same starts: V2 on both devices, V4 for each block.
        let bad = Schedule::new(p.clone(), 2, vec![0, 1, 2, 5, 0, 1, 2, 5]).unwrap();
        let r = validate(&bad, 100);
        assert_eq!(r.count(Rule::V4), 4);
        // Device 0: F0/F0 overlap, B0/B0 overlap; device 1 the same.
        assert_eq!(r.count(Rule::V2), 4);
        assert_eq!(r.total, 8);
        // Precedence broken for one job; V1 names both jobs and times.
        let bad = Schedule::new(p.clone(), 1, vec![0, 0, 2, 5]).unwrap();
        let r = validate(&bad, 100);
        assert_eq!(r.count(Rule::V1), 1);
        let v = &r.violations[0];
        assert_eq!(v.jobs, vec![(0, 0), (0, 1)]);
        assert_eq!(v.times, vec![1, 0]);
        assert!(v.message.contains("F1"), "{}", v.message);
        // Negative start.
        let bad = Schedule::new(p.clone(), 1, vec![-1, 1, 2, 5]).unwrap();
        assert_eq!(validate(&bad, 100).count(Rule::V0), 1);
        // The limit keeps the count exact.
        let bad = Schedule::new(p, 3, vec![0; 12]).unwrap();
        let r = validate(&bad, 2);
        assert_eq!(r.violations.len(), 2);
        assert!(r.total > 2);
    }

    #[test]
    fn memory_intervals() {
        let p = vshape(1);
        // F at 0,1,2 then B at 3,6,9: memory 1,2,3 then down.
        let mut s = Schedule::new(p, 3, vec![0, 3, 1, 6, 2, 9]).unwrap();
        assert!(validate(&s, 10).is_valid());
        s.memory = vec![2];
        let r = validate(&s, 10);
        assert_eq!(r.total, 1);
        let v = &r.violations[0];
        assert_eq!(v.rule, Rule::V3);
        assert_eq!(v.times, vec![2, 3, 3]);
        assert_eq!(v.jobs, vec![(2, 0)]);
        s.convention = MemoryConvention::AllocStartFreeEnd;
        // Frees at 6, 9, 12: above 2 during [2, 6).
        let r = validate(&s, 10);
        assert_eq!(r.violations[0].times, vec![2, 6, 3]);
    }

    #[test]
    fn template_rules() {
        let p = vshape(4);
        let t = Template::new(4, vec![0, 1, 2, 3, 4, 7, 10, 13]);
        assert!(validate_template(&p, &t, &[UNLIMITED; 4], MemoryConvention::Start, 10).is_valid());
        let r = validate_template(&p, &t, &[3; 4], MemoryConvention::Start, 10);
        assert_eq!(r.total, 1);
        assert_eq!(r.violations[0].rule, Rule::T3);
        // Break precedence and exclusivity at once: B0 at 12 overlaps F0 (residue 0).
        let t = Template::new(4, vec![0, 1, 2, 3, 4, 7, 10, 12]);
        let r = validate_template(&p, &t, &[UNLIMITED; 4], MemoryConvention::Start, 10);
        assert_eq!(r.count(Rule::T1), 1);
        assert_eq!(r.count(Rule::T2), 1);
        let r = validate_template(
            &p,
            &Template::new(3, vec![0; 8]),
            &[UNLIMITED; 4],
            MemoryConvention::Start,
            100,
        );
        assert!(r.count(Rule::T2) >= 4);
    }
}
