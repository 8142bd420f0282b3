//! Periodic schedules (spec §2): the template `a`, its steady-state checks, unrolling, and the
//! exact conversion to and from Tessel's repetend form.
//!
//! A 1-periodic schedule with period `P` starts job `(g, j)` at `a_g + j P`. Tessel writes the
//! same object as a *repetend*: a window of `P` time units in which every block appears once,
//! block `g` at in-window step `step_g` for micro-batch `mid_g` of the first window; window `k`
//! runs block `g` of micro-batch `mid_g + k`.

use maleki_common::{Error, Result};

use crate::model::{MemoryConvention, Premise, UNLIMITED};

/// A 1-periodic template: `S(g, j) = starts[g] + j * period`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Template {
    pub period: i64,
    pub starts: Vec<i64>,
}

/// Tessel's repetend form of a template (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TesselRepetend {
    pub period: i64,
    /// Micro-batch of each block inside the first repetend window (`>= 0`; later blocks of a
    /// chain have smaller or equal ids).
    pub mids: Vec<i64>,
    /// In-window start of each block, in `0..period`.
    pub steps: Vec<i64>,
}

impl Template {
    pub fn new(period: i64, starts: Vec<i64>) -> Template {
        Template { period, starts }
    }

    /// `L = max(a + s) - min a`: the span of one micro-batch in the template.
    pub fn length(&self, premise: &Premise) -> i64 {
        let lo = self.starts.iter().copied().min().unwrap_or(0);
        let hi = (0..self.starts.len())
            .map(|g| self.starts[g] + premise.span(g))
            .max()
            .unwrap_or(0);
        hi - lo
    }

    /// The same template translated so that `min a = 0`.
    pub fn normalised(&self) -> Template {
        let lo = self.starts.iter().copied().min().unwrap_or(0);
        Template {
            period: self.period,
            starts: self.starts.iter().map(|a| a - lo).collect(),
        }
    }

    /// The makespan of the plain unrolled schedule of `nmicros` micro-batches,
    /// `(N - 1) P + L` (the unrolling theorem; compaction can only shorten it).
    pub fn unrolled_makespan(&self, premise: &Premise, nmicros: usize) -> i64 {
        if nmicros == 0 {
            return 0;
        }
        (nmicros as i64 - 1) * self.period + self.length(premise)
    }

    /// The unrolled starts, row-major `nmicros x nblocks`: `S(g, j) = a_g - min a + j P`.
    pub fn unroll(&self, nmicros: usize) -> Vec<i64> {
        let lo = self.starts.iter().copied().min().unwrap_or(0);
        let mut s = Vec::with_capacity(nmicros * self.starts.len());
        for j in 0..nmicros as i64 {
            s.extend(self.starts.iter().map(|a| a - lo + j * self.period));
        }
        s
    }

    /// Steady-state peak memory per device (T3):
    /// `max_{t in [T, T+P)} sum_{g on d} mu_g (floor((t - e_g) / P) + 1)` for any `T >= max e`,
    /// where `e_g` is the time the delta of `g` takes effect under `convention`. At least 0.
    /// O(n log n) per device by sorting residues.
    pub fn steady_peak(&self, premise: &Premise, convention: MemoryConvention) -> Vec<i64> {
        steady_peak(premise, self.period, &self.starts, convention)
    }

    /// Checks T1 (precedence), T2 (no two blocks of a device overlap on the circle `Z_P`) and
    /// T3 (steady peak within `memory`, one cap per device). Returns the first violation.
    pub fn check(
        &self,
        premise: &Premise,
        memory: &[i64],
        convention: MemoryConvention,
    ) -> std::result::Result<(), String> {
        let n = premise.nblocks();
        let p = self.period;
        if self.starts.len() != n {
            return Err(format!(
                "template has {} starts for {n} blocks",
                self.starts.len()
            ));
        }
        if p < 1 {
            return Err(format!("period must be positive, got {p}"));
        }
        for e in premise.edges() {
            if self.starts[e.to] < self.starts[e.from] + premise.span(e.from) + e.lag {
                return Err(format!(
                    "T1: block {} starts before block {} ends",
                    e.to, e.from
                ));
            }
        }
        for d in 0..premise.ndevs() {
            let mut busy = vec![false; p as usize];
            let mut total = 0;
            for &g in premise.blocks_on(d) {
                total += premise.span(g);
                if total > p {
                    return Err(format!("T2: the work of device {d} exceeds the period {p}"));
                }
                for k in 0..premise.span(g) {
                    let r = (self.starts[g] + k).rem_euclid(p) as usize;
                    if busy[r] {
                        return Err(format!(
                            "T2: block {g} overlaps another block on device {d} at residue {r}"
                        ));
                    }
                    busy[r] = true;
                }
            }
        }
        let peaks = self.steady_peak(premise, convention);
        for (d, &peak) in peaks.iter().enumerate().take(premise.ndevs()) {
            let cap = memory.get(d).copied().unwrap_or(UNLIMITED);
            if peak > cap {
                return Err(format!(
                    "T3: steady peak {peak} on device {d} exceeds the cap {cap}"
                ));
            }
        }
        Ok(())
    }

    /// Tessel's repetend form: with `a_ref = min a`, `m_g = floor((a_g - a_ref) / P)`,
    /// `step_g = a_g - a_ref - m_g P` and `mid_g = max m - m_g`.
    pub fn to_tessel(&self) -> TesselRepetend {
        let p = self.period;
        let lo = self.starts.iter().copied().min().unwrap_or(0);
        let m: Vec<i64> = self.starts.iter().map(|a| (a - lo).div_euclid(p)).collect();
        let top = m.iter().copied().max().unwrap_or(0);
        TesselRepetend {
            period: p,
            mids: m.iter().map(|x| top - x).collect(),
            steps: self.starts.iter().map(|a| (a - lo).rem_euclid(p)).collect(),
        }
    }

    /// The template of a Tessel repetend, normalised to `min a = 0`:
    /// `a_g = step_g + (max mid - mid_g) P`. The inverse of [`Template::to_tessel`] on
    /// normalised templates.
    pub fn from_tessel(rep: &TesselRepetend) -> Result<Template> {
        let p = rep.period;
        if p < 1 {
            return Err(Error::invalid(
                "period",
                format!("must be positive, got {p}"),
            ));
        }
        if rep.mids.len() != rep.steps.len() {
            return Err(Error::shape(
                "steps",
                format!("{} values (one per block)", rep.mids.len()),
                rep.steps.len(),
            ));
        }
        if let Some(s) = rep.steps.iter().find(|&&s| !(0..p).contains(&s)) {
            return Err(Error::invalid(
                "steps",
                format!("in-window steps must be in 0..{p}, got {s}"),
            ));
        }
        if let Some(m) = rep.mids.iter().find(|&&m| m < 0) {
            return Err(Error::invalid(
                "mids",
                format!("micro-batch ids must be >= 0, got {m}"),
            ));
        }
        let top = rep.mids.iter().copied().max().unwrap_or(0);
        let t = Template {
            period: p,
            starts: rep
                .mids
                .iter()
                .zip(&rep.steps)
                .map(|(m, s)| s + (top - m) * p)
                .collect(),
        };
        Ok(t.normalised())
    }
}

/// See [`Template::steady_peak`].
pub fn steady_peak(
    premise: &Premise,
    period: i64,
    a: &[i64],
    convention: MemoryConvention,
) -> Vec<i64> {
    (0..premise.ndevs())
        .map(|d| device_steady_peak(premise, d, period, a, convention))
        .collect()
}

/// The steady peak of device `d` alone (see [`Template::steady_peak`]); the repetend search
/// calls it on every leaf.
pub(crate) fn device_steady_peak(
    p: &Premise,
    d: usize,
    period: i64,
    a: &[i64],
    conv: MemoryConvention,
) -> i64 {
    let mut ev: Vec<(i64, i64)> = Vec::with_capacity(p.blocks_on(d).len());
    for &g in p.blocks_on(d) {
        let mu = p.block(g).memory;
        if mu != 0 {
            ev.push((conv.effect_time(a[g], p.span(g), mu), mu));
        }
    }
    if ev.is_empty() {
        return 0;
    }
    // Level at T = t0 (every term has started), then the jumps over (T, T + P).
    let t0 = ev.iter().map(|e| e.0).max().unwrap_or(0);
    let mut level: i64 = ev
        .iter()
        .map(|&(e, mu)| mu * ((t0 - e).div_euclid(period) + 1))
        .sum();
    for e in ev.iter_mut() {
        e.0 = (e.0 - t0).rem_euclid(period);
    }
    ev.sort_unstable();
    let mut best = level;
    let mut k = 0;
    while k < ev.len() {
        let r = ev[k].0;
        while k < ev.len() && ev[k].0 == r {
            if r > 0 {
                level += ev[k].1;
            }
            k += 1;
        }
        best = best.max(level);
    }
    best.max(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::vshape;
    use crate::model::Schedule;

    // The 1F1B template of the V with P = 4: F_d at d, B_d at 16 - 4 - 3 d... (ASAP chain).
    fn one_f_one_b() -> Template {
        Template::new(4, vec![0, 1, 2, 3, 4, 7, 10, 13])
    }

    #[test]
    fn template_checks_and_peaks() {
        let p = vshape(4);
        let t = one_f_one_b();
        assert_eq!(
            t.check(&p, &[UNLIMITED; 4], MemoryConvention::Start),
            Ok(())
        );
        // Device 0: F at 0, B at 13: 13/4 -> 4 micro-batches in flight at the peak.
        assert_eq!(t.steady_peak(&p, MemoryConvention::Start), vec![4, 3, 2, 1]);
        assert!(t
            .check(&p, &[3; 4], MemoryConvention::Start)
            .unwrap_err()
            .starts_with("T3"));
        assert_eq!(t.length(&p), 16);
        assert_eq!(t.unrolled_makespan(&p, 4), 28);
        let bad = Template::new(4, vec![0, 1, 2, 3, 4, 7, 10, 16]);
        assert!(bad
            .check(&p, &[UNLIMITED; 4], MemoryConvention::Start)
            .unwrap_err()
            .starts_with("T2"));
    }

    #[test]
    fn steady_peak_matches_brute_force_on_unrolled_schedule() {
        let p = vshape(4);
        let t = one_f_one_b();
        for conv in [MemoryConvention::Start, MemoryConvention::AllocStartFreeEnd] {
            let mut s = Schedule::new(p.clone(), 20, t.unroll(20)).unwrap();
            s.convention = conv;
            assert_eq!(s.peak_memory(), t.steady_peak(&p, conv), "{conv:?}");
        }
    }

    #[test]
    fn tessel_form_round_trips() {
        let t = one_f_one_b();
        let r = t.to_tessel();
        assert_eq!(r.steps, vec![0, 1, 2, 3, 0, 3, 2, 1]);
        assert_eq!(r.mids, vec![3, 3, 3, 3, 2, 2, 1, 0]);
        assert_eq!(Template::from_tessel(&r).unwrap(), t);
        assert!(Template::from_tessel(&TesselRepetend {
            period: 4,
            mids: vec![0],
            steps: vec![4]
        })
        .is_err());
    }
}
