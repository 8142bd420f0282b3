//! The built-in premises (spec §5).
//!
//! Notation: `F_d`/`B_d` are single-device forward/backward blocks with memory `+act`/`-act`;
//! `T*` blocks span every device with memory `tp_mem` (0 by default). Defaults follow Tessel:
//! forward span 1, backward span 3, tensor-parallel spans 1, activation 1. The inference form
//! (`train = false`) keeps the forward blocks only and sets every memory delta to 0, as Tessel
//! does.
//!
//! | name | blocks (training form) |
//! |---|---|
//! | `vshape` | F_0..F_{D-1}, B_{D-1}..B_0 |
//! | `mshape` | T_f, F_0..F_{D-1}, B_{D-1}..B_0, T_b |
//! | `nnshape` | T1_f, F_0..F_{D/2-1}, T2_f, F_{D/2}..F_{D-1}, B_{D-1}..B_{D/2}, T2_b, B_{D/2-1}..B_0, T1_b |
//! | `nnshape_eager` | T1_f, F_0, T2_f, F_1..F_{D-1}, B_{D-1}..B_1, T2_b, B_0, T1_b |
//! | `mllm` | T1_f, F_0..F_{D-1}, T2_f, T2_b, B_{D-1}..B_0, T1_b |
//! | `kshape` | two branches (devices 0..D/2 and D/2..D) into M_f (+act), M_b (-act), then each branch's B |
//! | `xshape` | two independent V's, over 0..D-1 and over D-1..0 |
//! | `finetune` | T_f (memory 0), F_0..F_{D-1}, B_{D-1}..B_0 with backward span 2 |
//! | `alphafold` | three forward sweeps (memory 0, 0, +act), then B_{D-1}..B_0 with span 1 |
//! | `interleaved` | v chunks per device: F over (chunk, device), backward reversed |
//! | `zb_v` | the V with B (input gradient, memory 0) and W (weight gradient, -act, after B) |
//! | `wave` | 2w sweeps alternating down and up (Hanayo), backward reversed |
//! | `uneven` | the V with per-stage spans (heavier first and last stages by default) |

use maleki_common::{Error, Result};

use crate::model::{Block, Edge, Kind, Premise};

/// Names of the built-in premises, in the order of the spec.
pub const BUILTIN: &[&str] = &[
    "vshape",
    "mshape",
    "nnshape",
    "nnshape_eager",
    "mllm",
    "kshape",
    "xshape",
    "finetune",
    "alphafold",
    "interleaved",
    "zb_v",
    "wave",
    "uneven",
];

/// Keyword options of the built-in premises. `None` takes the premise's default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Span of a forward block (default 1; per chunk for `interleaved` and `wave`).
    pub fwd: Option<i64>,
    /// Span of a backward block (default 3; 2 for `finetune`, 1 for `alphafold` and `zb_v`).
    pub bwd: Option<i64>,
    /// Span of a weight-gradient block of `zb_v` (default 1).
    pub wgt: Option<i64>,
    /// Span of a forward tensor-parallel (all-device) block (default 1).
    pub tp_fwd: Option<i64>,
    /// Span of a backward tensor-parallel block (default 1).
    pub tp_bwd: Option<i64>,
    /// Activation memory allocated by a forward and freed by its backward (default 1).
    pub act: Option<i64>,
    /// Memory delta of the forward tensor-parallel blocks (default 0); their backward frees it.
    pub tp_mem: Option<i64>,
    /// Chunks per device of `interleaved` (v, default 2) and waves of `wave` (w, default 1).
    pub chunks: Option<usize>,
    /// Per-stage forward spans of `uneven` (length ndevs).
    pub fwd_spans: Option<Vec<i64>>,
    /// Per-stage backward spans of `uneven` (length ndevs).
    pub bwd_spans: Option<Vec<i64>>,
    /// Training form (default) or inference form (forward blocks only, memory 0).
    pub train: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            fwd: None,
            bwd: None,
            wgt: None,
            tp_fwd: None,
            tp_bwd: None,
            act: None,
            tp_mem: None,
            chunks: None,
            fwd_spans: None,
            bwd_spans: None,
            train: true,
        }
    }
}

impl Options {
    /// The inference form with default spans.
    pub fn inference() -> Options {
        Options {
            train: false,
            ..Options::default()
        }
    }
}

/// The options premise `name` reads (its training form; the inference form reads the forward
/// ones and ignores the others), or `None` for an unknown name.
pub fn options_of(name: &str) -> Option<&'static [&'static str]> {
    const V: &[&str] = &["fwd", "bwd", "act"];
    const TP: &[&str] = &["fwd", "bwd", "act", "tp_fwd", "tp_bwd", "tp_mem"];
    Some(match name {
        "vshape" | "xshape" | "alphafold" => V,
        "mshape" | "nnshape" | "nnshape_eager" | "mllm" => TP,
        // The merge block holds an activation (`act`), not `tp_mem`.
        "kshape" => &["fwd", "bwd", "act", "tp_fwd", "tp_bwd"],
        // The frozen embedding has no backward and keeps nothing.
        "finetune" => &["fwd", "bwd", "act", "tp_fwd"],
        "interleaved" | "wave" => &["fwd", "bwd", "act", "chunks"],
        "zb_v" => &["fwd", "bwd", "act", "wgt"],
        "uneven" => &["fwd", "bwd", "act", "fwd_spans", "bwd_spans"],
        _ => return None,
    })
}

/// The options set in `opts`, by name.
fn options_set(opts: &Options) -> Vec<&'static str> {
    let named = [
        ("fwd", opts.fwd.is_some()),
        ("bwd", opts.bwd.is_some()),
        ("wgt", opts.wgt.is_some()),
        ("tp_fwd", opts.tp_fwd.is_some()),
        ("tp_bwd", opts.tp_bwd.is_some()),
        ("act", opts.act.is_some()),
        ("tp_mem", opts.tp_mem.is_some()),
        ("chunks", opts.chunks.is_some()),
        ("fwd_spans", opts.fwd_spans.is_some()),
        ("bwd_spans", opts.bwd_spans.is_some()),
    ];
    named
        .iter()
        .filter(|(_, set)| *set)
        .map(|(n, _)| *n)
        .collect()
}

/// Builds the built-in premise `name` on `ndevs` devices.
///
/// Errors when the name is unknown, `ndevs` does not suit the premise (`kshape` needs an even
/// count, the others at least 1, `nnshape`/`nnshape_eager`/`xshape` at least 2), an option is
/// out of range (spans `>= 1`, `act >= 0`), the premise has no such option (see
/// [`options_of`]: a `chunks` for `vshape` would otherwise be dropped silently), or `uneven`
/// gets a uniform span and the per-stage spans it would override.
pub fn builtin(name: &str, ndevs: usize, opts: &Options) -> Result<Premise> {
    if let Some(known) = options_of(name) {
        let set = options_set(opts);
        if let Some(&o) = set.iter().find(|o| !known.contains(o)) {
            return Err(Error::invalid(
                o,
                format!(
                    "premise {name:?} has no option {o} (its options: {})",
                    known.join(", ")
                ),
            ));
        }
        for (one, per_stage) in [("fwd", "fwd_spans"), ("bwd", "bwd_spans")] {
            // The inference form ignores the backward spans, both of them.
            if set.contains(&one) && set.contains(&per_stage) && (opts.train || one == "fwd") {
                return Err(Error::invalid(
                    one,
                    format!(
                        "give {one} or {per_stage}, not both: {per_stage} sets every stage's span"
                    ),
                ));
            }
        }
    }
    let b = Builder::new(ndevs, opts)?;
    let p = match name {
        "vshape" => b.vshape(),
        "mshape" => b.mshape(),
        "nnshape" => b.nnshape(),
        "nnshape_eager" => b.nnshape_eager(),
        "mllm" => b.mllm(),
        "kshape" => b.kshape(),
        "xshape" => b.xshape(),
        "finetune" => b.finetune(),
        "alphafold" => b.alphafold(),
        "interleaved" => b.interleaved(),
        "zb_v" => b.zb_v(),
        "wave" => b.wave(),
        "uneven" => b.uneven(),
        _ => {
            return Err(Error::invalid(
                "name",
                format!(
                    "unknown premise {name:?}; the built-in premises are {}",
                    BUILTIN.join(", ")
                ),
            ))
        }
    }?;
    Ok(if opts.train { p } else { p.without_memory() })
}

/// Assembles a premise block by block.
struct Builder<'a> {
    ndevs: usize,
    opts: &'a Options,
    blocks: Vec<Block>,
    edges: Vec<Edge>,
}

fn positive(name: &str, v: Option<i64>, default: i64) -> Result<i64> {
    let v = v.unwrap_or(default);
    if v < 1 {
        return Err(Error::invalid(name, format!("spans must be >= 1, got {v}")));
    }
    Ok(v)
}

impl<'a> Builder<'a> {
    fn new(ndevs: usize, opts: &'a Options) -> Result<Self> {
        if ndevs == 0 {
            return Err(Error::invalid("ndevs", "must be at least 1, got 0"));
        }
        if ndevs > crate::model::MAX_DEVICES {
            return Err(Error::invalid(
                "ndevs",
                format!("at most {}, got {ndevs}", crate::model::MAX_DEVICES),
            ));
        }
        if let Some(a) = opts.act {
            if a < 0 {
                return Err(Error::invalid("act", format!("must be >= 0, got {a}")));
            }
        }
        if let Some(a) = opts.tp_mem {
            if a < 0 {
                return Err(Error::invalid("tp_mem", format!("must be >= 0, got {a}")));
            }
        }
        Ok(Builder {
            ndevs,
            opts,
            blocks: Vec::new(),
            edges: Vec::new(),
        })
    }

    fn fwd(&self) -> Result<i64> {
        positive("fwd", self.opts.fwd, 1)
    }
    fn bwd(&self, default: i64) -> Result<i64> {
        positive("bwd", self.opts.bwd, default)
    }
    fn tp_fwd(&self) -> Result<i64> {
        positive("tp_fwd", self.opts.tp_fwd, 1)
    }
    fn tp_bwd(&self) -> Result<i64> {
        positive("tp_bwd", self.opts.tp_bwd, 1)
    }
    // The inference form keeps no activations.
    fn act(&self) -> i64 {
        if self.train() {
            self.opts.act.unwrap_or(1)
        } else {
            0
        }
    }
    fn tp_mem(&self) -> i64 {
        if self.train() {
            self.opts.tp_mem.unwrap_or(0)
        } else {
            0
        }
    }
    fn train(&self) -> bool {
        self.opts.train
    }
    fn all(&self) -> Vec<usize> {
        (0..self.ndevs).collect()
    }
    fn need(&self, min: usize, name: &str) -> Result<()> {
        if self.ndevs < min {
            return Err(Error::invalid(
                "ndevs",
                format!("{name} needs at least {min} devices, got {}", self.ndevs),
            ));
        }
        Ok(())
    }

    /// Adds a block and returns its index.
    fn add(
        &mut self,
        name: String,
        span: i64,
        devices: Vec<usize>,
        memory: i64,
        kind: Kind,
    ) -> usize {
        self.blocks
            .push(Block::new(name, span, devices, memory, kind));
        self.blocks.len() - 1
    }
    /// Chains the given blocks in order.
    fn link(&mut self, seq: &[usize]) {
        for w in seq.windows(2) {
            self.edges.push(Edge::new(w[0], w[1]));
        }
    }
    fn finish(self) -> Result<Premise> {
        Premise::new(self.ndevs, self.blocks, self.edges)
    }
    fn f(&mut self, d: usize, span: i64, mem: i64) -> usize {
        self.add(format!("F{d}"), span, vec![d], mem, Kind::Forward)
    }
    fn b(&mut self, d: usize, span: i64, mem: i64) -> usize {
        self.add(format!("B{d}"), span, vec![d], mem, Kind::Backward)
    }
    fn t(&mut self, name: &str, fwd: bool) -> Result<usize> {
        let (span, mem, kind) = if fwd {
            (self.tp_fwd()?, self.tp_mem(), Kind::Forward)
        } else {
            (self.tp_bwd()?, -self.tp_mem(), Kind::Backward)
        };
        let all = self.all();
        Ok(self.add(name.to_string(), span, all, mem, kind))
    }

    /// Forward blocks over `devs` in order, then (training) backward blocks in reverse.
    fn v_parts(&mut self, devs: &[usize], bwd_default: i64) -> Result<(Vec<usize>, Vec<usize>)> {
        let (f, a) = (self.fwd()?, self.act());
        let fs: Vec<usize> = devs.iter().map(|&d| self.f(d, f, a)).collect();
        let mut bs = Vec::new();
        if self.train() {
            let b = self.bwd(bwd_default)?;
            bs = devs.iter().rev().map(|&d| self.b(d, b, -a)).collect();
        }
        Ok((fs, bs))
    }

    fn vshape(mut self) -> Result<Premise> {
        let devs: Vec<usize> = (0..self.ndevs).collect();
        let (fs, bs) = self.v_parts(&devs, 3)?;
        self.link(&[fs, bs].concat());
        self.finish()
    }

    fn mshape(mut self) -> Result<Premise> {
        let tf = self.t("T_f", true)?;
        let devs: Vec<usize> = (0..self.ndevs).collect();
        let (fs, bs) = self.v_parts(&devs, 3)?;
        let mut seq = [vec![tf], fs, bs].concat();
        if self.train() {
            seq.push(self.t("T_b", false)?);
        }
        self.link(&seq);
        self.finish()
    }

    /// T1_f, F_0..F_{k-1}, T2_f, F_k..F_{D-1}, B_{D-1}..B_k, T2_b, B_{k-1}..B_0, T1_b.
    fn nn_split(mut self, k: usize) -> Result<Premise> {
        let t1f = self.t("T1_f", true)?;
        let (f, a) = (self.fwd()?, self.act());
        let front: Vec<usize> = (0..k).map(|d| self.f(d, f, a)).collect();
        let t2f = self.t("T2_f", true)?;
        let back: Vec<usize> = (k..self.ndevs).map(|d| self.f(d, f, a)).collect();
        let mut seq = [vec![t1f], front, vec![t2f], back].concat();
        if self.train() {
            let b = self.bwd(3)?;
            seq.extend(
                (k..self.ndevs)
                    .rev()
                    .map(|d| self.b(d, b, -a))
                    .collect::<Vec<_>>(),
            );
            seq.push(self.t("T2_b", false)?);
            seq.extend((0..k).rev().map(|d| self.b(d, b, -a)).collect::<Vec<_>>());
            seq.push(self.t("T1_b", false)?);
        }
        self.link(&seq);
        self.finish()
    }

    fn nnshape(self) -> Result<Premise> {
        self.need(2, "nnshape")?;
        let k = self.ndevs / 2;
        self.nn_split(k)
    }

    fn nnshape_eager(self) -> Result<Premise> {
        self.need(2, "nnshape_eager")?;
        self.nn_split(1)
    }

    fn mllm(mut self) -> Result<Premise> {
        let t1f = self.t("T1_f", true)?;
        let (f, a) = (self.fwd()?, self.act());
        let mut seq: Vec<usize> = vec![t1f];
        seq.extend((0..self.ndevs).map(|d| self.f(d, f, a)).collect::<Vec<_>>());
        seq.push(self.t("T2_f", true)?);
        if self.train() {
            let b = self.bwd(3)?;
            seq.push(self.t("T2_b", false)?);
            seq.extend(
                (0..self.ndevs)
                    .rev()
                    .map(|d| self.b(d, b, -a))
                    .collect::<Vec<_>>(),
            );
            seq.push(self.t("T1_b", false)?);
        }
        self.link(&seq);
        self.finish()
    }

    fn kshape(mut self) -> Result<Premise> {
        if self.ndevs < 2 || !self.ndevs.is_multiple_of(2) {
            return Err(Error::invalid(
                "ndevs",
                format!("kshape needs an even number of devices, got {}", self.ndevs),
            ));
        }
        let half = self.ndevs / 2;
        let (f, a) = (self.fwd()?, self.act());
        let fa: Vec<usize> = (0..half).map(|d| self.f(d, f, a)).collect();
        let fb: Vec<usize> = (half..self.ndevs).map(|d| self.f(d, f, a)).collect();
        let tf = self.tp_fwd()?;
        let all = self.all();
        let mf = self.add("M_f".into(), tf, all.clone(), a, Kind::Forward);
        self.link(&[fa.clone(), vec![mf]].concat());
        self.link(&[fb.clone(), vec![mf]].concat());
        if self.train() {
            let (tb, b) = (self.tp_bwd()?, self.bwd(3)?);
            let mb = self.add("M_b".into(), tb, all, -a, Kind::Backward);
            let ba: Vec<usize> = (0..half).rev().map(|d| self.b(d, b, -a)).collect();
            let bb: Vec<usize> = (half..self.ndevs).rev().map(|d| self.b(d, b, -a)).collect();
            self.link(&[vec![mf, mb], ba].concat());
            self.link(&[vec![mb], bb].concat());
        }
        self.finish()
    }

    fn xshape(mut self) -> Result<Premise> {
        self.need(2, "xshape")?;
        let down: Vec<usize> = (0..self.ndevs).collect();
        let up: Vec<usize> = (0..self.ndevs).rev().collect();
        // Two independent chains: the V down the devices, then the V up them.
        let (f1, b1) = self.v_parts(&down, 3)?;
        let (f2, b2) = self.v_parts(&up, 3)?;
        self.link(&[f1, b1].concat());
        self.link(&[f2, b2].concat());
        self.finish()
    }

    fn finetune(mut self) -> Result<Premise> {
        let tf = self.tp_fwd()?;
        let all = self.all();
        // The embedding is frozen: no activation kept, no backward block.
        let t = self.add("T_f".into(), tf, all, 0, Kind::Forward);
        let devs: Vec<usize> = (0..self.ndevs).collect();
        let (fs, bs) = self.v_parts(&devs, 2)?;
        self.link(&[vec![t], fs, bs].concat());
        self.finish()
    }

    fn alphafold(mut self) -> Result<Premise> {
        let (f, a) = (self.fwd()?, self.act());
        let mut seq = Vec::new();
        for (sweep, mem) in [(0, 0), (1, 0), (2, a)] {
            for d in 0..self.ndevs {
                let g = self.add(format!("F{d}.{sweep}"), f, vec![d], mem, Kind::Forward);
                seq.push(g);
            }
        }
        if self.train() {
            let b = self.bwd(1)?;
            for d in (0..self.ndevs).rev() {
                seq.push(self.b(d, b, -a));
            }
        }
        self.link(&seq);
        self.finish()
    }

    fn chunks(&self, default: usize) -> Result<usize> {
        let v = self.opts.chunks.unwrap_or(default);
        if !(1..=64).contains(&v) {
            return Err(Error::invalid(
                "chunks",
                format!("must be in 1..=64, got {v}"),
            ));
        }
        Ok(v)
    }

    /// Forward over `stages` (device of each stage, in order), then the backward in reverse.
    fn staged(mut self, stages: &[usize]) -> Result<Premise> {
        let (f, a) = (self.fwd()?, self.act());
        let mut seq = Vec::new();
        for (k, &d) in stages.iter().enumerate() {
            seq.push(self.add(format!("F{d}.{k}"), f, vec![d], a, Kind::Forward));
        }
        if self.train() {
            let b = self.bwd(3)?;
            for (k, &d) in stages.iter().enumerate().rev() {
                seq.push(self.add(format!("B{d}.{k}"), b, vec![d], -a, Kind::Backward));
            }
        }
        self.link(&seq);
        self.finish()
    }

    fn interleaved(self) -> Result<Premise> {
        let v = self.chunks(2)?;
        let stages: Vec<usize> = (0..v).flat_map(|_| 0..self.ndevs).collect();
        self.staged(&stages)
    }

    fn wave(self) -> Result<Premise> {
        let w = self.chunks(1)?;
        let d = self.ndevs;
        let stages: Vec<usize> = (0..2 * w)
            .flat_map(|s| (0..d).map(move |k| if s % 2 == 0 { k } else { d - 1 - k }))
            .collect();
        self.staged(&stages)
    }

    fn zb_v(mut self) -> Result<Premise> {
        let devs: Vec<usize> = (0..self.ndevs).collect();
        let (f, a) = (self.fwd()?, self.act());
        let fs: Vec<usize> = devs.iter().map(|&d| self.f(d, f, a)).collect();
        self.link(&fs);
        if self.train() {
            let b = self.bwd(1)?;
            let w = positive("wgt", self.opts.wgt, 1)?;
            let mut prev = *fs.last().expect("ndevs >= 1");
            for &d in devs.iter().rev() {
                let gb = self.b(d, b, 0);
                let gw = self.add(format!("W{d}"), w, vec![d], -a, Kind::Weight);
                self.edges.push(Edge::new(prev, gb));
                self.edges.push(Edge::new(gb, gw));
                prev = gb;
            }
        }
        self.finish()
    }

    fn uneven(mut self) -> Result<Premise> {
        let d = self.ndevs;
        let (f, a) = (self.fwd()?, self.act());
        let b = self.bwd(3)?;
        let heavy = |base: i64, k: usize| {
            if d > 1 && (k == 0 || k == d - 1) {
                2 * base
            } else {
                base
            }
        };
        let fsp = match &self.opts.fwd_spans {
            Some(v) => v.clone(),
            None => (0..d).map(|k| heavy(f, k)).collect(),
        };
        let bsp = match &self.opts.bwd_spans {
            Some(v) => v.clone(),
            None => (0..d).map(|k| heavy(b, k)).collect(),
        };
        for (name, v) in [("fwd_spans", &fsp), ("bwd_spans", &bsp)] {
            if v.len() != d {
                return Err(Error::shape(
                    name,
                    format!("({d},)"),
                    format!("({},)", v.len()),
                ));
            }
            if let Some(s) = v.iter().find(|&&s| s < 1) {
                return Err(Error::invalid(name, format!("spans must be >= 1, got {s}")));
            }
        }
        let mut seq: Vec<usize> = (0..d).map(|k| self.f(k, fsp[k], a)).collect();
        if self.train() {
            for k in (0..d).rev() {
                seq.push(self.b(k, bsp[k], -a));
            }
        }
        self.link(&seq);
        self.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(name: &str, d: usize) -> Premise {
        builtin(name, d, &Options::default()).unwrap()
    }

    #[test]
    fn every_builtin_builds_in_both_forms() {
        for &name in BUILTIN {
            for d in [2, 4, 6, 8] {
                let t = p(name, d);
                let i = builtin(name, d, &Options::inference()).unwrap();
                assert!(i.is_inference());
                assert!(i.nblocks() < t.nblocks(), "{name} {d}");
                assert!(t.period_lower_bound() > 0);
            }
        }
    }

    #[test]
    fn shapes_match_the_spec() {
        let v = p("vshape", 4);
        assert_eq!(v.nblocks(), 8);
        assert_eq!(v.work(), &[4, 4, 4, 4]);
        let m = p("mshape", 4);
        assert_eq!(m.nblocks(), 10);
        assert_eq!(m.work(), &[6, 6, 6, 6]);
        assert_eq!(m.critical_path(), 18);
        let nn = p("nnshape", 4);
        let names: Vec<&str> = nn.blocks().iter().map(|b| b.name.as_str()).collect();
        assert_eq!(
            names,
            ["T1_f", "F0", "F1", "T2_f", "F2", "F3", "B3", "B2", "T2_b", "B1", "B0", "T1_b"]
        );
        assert_eq!(nn.work(), &[8, 8, 8, 8]);
        let e = p("nnshape_eager", 4);
        let names: Vec<&str> = e.blocks().iter().map(|b| b.name.as_str()).collect();
        assert_eq!(
            names,
            ["T1_f", "F0", "T2_f", "F1", "F2", "F3", "B3", "B2", "B1", "T2_b", "B0", "T1_b"]
        );
        let ml = p("mllm", 2);
        let names: Vec<&str> = ml.blocks().iter().map(|b| b.name.as_str()).collect();
        assert_eq!(
            names,
            ["T1_f", "F0", "F1", "T2_f", "T2_b", "B1", "B0", "T1_b"]
        );
        let k = p("kshape", 4);
        assert_eq!(k.work(), &[6, 6, 6, 6]);
        assert_eq!(k.critical_path(), 2 + 1 + 1 + 6);
        assert_eq!(k.makespan_lower_bound(3), 22);
        let x = p("xshape", 4);
        assert_eq!(x.work(), &[8, 8, 8, 8]);
        assert_eq!(x.critical_path(), 16);
        assert_eq!(p("finetune", 4).work(), &[4, 4, 4, 4]);
        assert_eq!(p("alphafold", 4).work(), &[4, 4, 4, 4]);
        let il = p("interleaved", 4);
        assert_eq!(il.nblocks(), 16);
        assert_eq!(il.work(), &[8, 8, 8, 8]);
        let z = p("zb_v", 4);
        assert_eq!(z.nblocks(), 12);
        assert_eq!(z.work(), &[3, 3, 3, 3]);
        assert_eq!(p("wave", 4).nblocks(), 16);
        assert_eq!(p("uneven", 4).work(), &[8, 4, 4, 8]);
        // Inference kshape: the branches and the fusion block.
        let ki = builtin("kshape", 8, &Options::inference()).unwrap();
        assert_eq!(ki.nblocks(), 9);
        assert_eq!(ki.period_lower_bound(), 2);
        assert_eq!(ki.critical_path(), 5);
    }

    #[test]
    fn bad_options_are_rejected() {
        assert!(builtin("nope", 4, &Options::default())
            .unwrap_err()
            .to_string()
            .contains("unknown premise"));
        assert!(builtin("kshape", 3, &Options::default()).is_err());
        assert!(builtin("vshape", 0, &Options::default()).is_err());
        let o = Options {
            fwd: Some(0),
            ..Options::default()
        };
        assert!(builtin("vshape", 4, &o)
            .unwrap_err()
            .to_string()
            .contains("fwd"));
        let o = Options {
            fwd_spans: Some(vec![1, 2]),
            ..Options::default()
        };
        assert!(builtin("uneven", 4, &o).is_err());
        let o = Options {
            act: Some(-1),
            ..Options::default()
        };
        assert!(builtin("vshape", 4, &o).is_err());
        let o = Options {
            chunks: Some(3),
            ..Options::default()
        };
        let e = builtin("vshape", 4, &o).unwrap_err().to_string();
        assert!(e.contains("has no option chunks"), "{e}");
        let o = Options {
            fwd: Some(2),
            fwd_spans: Some(vec![1; 4]),
            ..Options::default()
        };
        let e = builtin("uneven", 4, &o).unwrap_err().to_string();
        assert!(e.contains("not both"), "{e}");
    }

    #[test]
    fn every_listed_option_changes_its_premise() {
        // The table of options_of against the builders: each listed option, set to a
        // non-default value, changes the training form of its premise.
        for &name in BUILTIN {
            let base = p(name, 4);
            for &o in options_of(name).unwrap() {
                let mut opts = Options::default();
                match o {
                    "fwd" => opts.fwd = Some(5),
                    "bwd" => opts.bwd = Some(7),
                    "wgt" => opts.wgt = Some(5),
                    "tp_fwd" => opts.tp_fwd = Some(5),
                    "tp_bwd" => opts.tp_bwd = Some(5),
                    "act" => opts.act = Some(4),
                    "tp_mem" => opts.tp_mem = Some(4),
                    "chunks" => opts.chunks = Some(3),
                    "fwd_spans" => opts.fwd_spans = Some(vec![5; 4]),
                    "bwd_spans" => opts.bwd_spans = Some(vec![5; 4]),
                    _ => panic!("{name}: unknown option {o}"),
                }
                let changed = builtin(name, 4, &opts).unwrap();
                assert!(
                    format!("{changed:?}") != format!("{base:?}"),
                    "{name}: {o} changes nothing"
                );
            }
        }
    }
}
