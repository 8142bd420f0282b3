//! The problem model (spec §1): premises, their derived quantities, and schedules.
//!
//! A [`Premise`] is the placement of one micro-batch: blocks (span, device set, memory delta,
//! kind, name) and precedence edges with optional lags. It is validated once, when built, and
//! then carries its derived quantities (topological order, `head`, `tail`, per-device work
//! `W_d`, critical path, lower bounds). A [`Schedule`] is an integer start for every job
//! `(micro-batch j, block g)` plus the instance parameters it was made for (memory caps,
//! memory convention, FIFO flag) and, when it came from a periodic template, the period,
//! the template and the repetend window.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;
use std::sync::Arc;

use maleki_common::{Error, Result};

/// Memory cap meaning "no limit" (per device).
pub const UNLIMITED: i64 = i64::MAX;

/// Largest accepted span, lag or |memory delta|. Keeps every sum the search forms far from
/// `i64` overflow (n blocks x N micro-batches x span stays below 2^62 for any sane instance).
pub const MAX_VALUE: i64 = 1 << 30;

/// Largest accepted number of devices.
pub const MAX_DEVICES: usize = 4096;

/// What a block computes. Only used for display, formats and baselines: the search treats
/// every kind alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Forward,
    Backward,
    /// Weight-gradient half of a split backward (zero-bubble pipelines).
    Weight,
    Other,
}

impl Kind {
    /// The lower-case name: `forward`, `backward`, `weight` or `other`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Forward => "forward",
            Kind::Backward => "backward",
            Kind::Weight => "weight",
            Kind::Other => "other",
        }
    }

    /// The one-letter action code of torch.distributed.pipelining: F, B, W, or O.
    pub fn letter(self) -> char {
        match self {
            Kind::Forward => 'F',
            Kind::Backward => 'B',
            Kind::Weight => 'W',
            Kind::Other => 'O',
        }
    }

    /// Parses `forward`/`backward`/`weight`/`other` (also `f`, `b`, `w`, `o`, any case).
    pub fn parse(s: &str) -> Result<Kind> {
        match s.to_ascii_lowercase().as_str() {
            "forward" | "fwd" | "f" => Ok(Kind::Forward),
            "backward" | "bwd" | "b" => Ok(Kind::Backward),
            "weight" | "wgt" | "w" => Ok(Kind::Weight),
            "other" | "o" => Ok(Kind::Other),
            _ => Err(Error::invalid(
                "kind",
                format!("expected one of forward, backward, weight, other; got {s:?}"),
            )),
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One block of the premise (a stage, or a tensor-parallel block over several devices).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Block {
    /// Display name (need not be unique).
    pub name: String,
    /// Duration in time units, `1 ..= MAX_VALUE`.
    pub span: i64,
    /// The devices the block occupies, all at once. Non-empty; sorted and deduplicated by
    /// [`Premise::new`].
    pub devices: Vec<usize>,
    /// Memory delta applied on every device of `devices`: `+` allocates, `-` frees.
    pub memory: i64,
    pub kind: Kind,
}

impl Block {
    pub fn new(
        name: impl Into<String>,
        span: i64,
        devices: Vec<usize>,
        memory: i64,
        kind: Kind,
    ) -> Block {
        Block {
            name: name.into(),
            span,
            devices,
            memory,
            kind,
        }
    }

    /// True when the block occupies `d`.
    pub fn on(&self, d: usize) -> bool {
        self.devices.binary_search(&d).is_ok()
    }
}

/// A precedence edge `from -> to` inside one micro-batch: `S(to) >= S(from) + span(from) + lag`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Edge {
    pub from: usize,
    pub to: usize,
    /// Communication delay, `>= 0` (Tessel has none: 0).
    pub lag: i64,
}

impl Edge {
    pub fn new(from: usize, to: usize) -> Edge {
        Edge { from, to, lag: 0 }
    }
    pub fn with_lag(from: usize, to: usize, lag: i64) -> Edge {
        Edge { from, to, lag }
    }
}

/// A validated premise: the placement of one micro-batch, with its derived quantities.
///
/// Build it with [`Premise::new`] (any DAG) or [`Premise::chain`]; the built-in placements
/// of the paper are in [`crate::premises`]. Once built it is immutable.
#[derive(Clone, Debug)]
pub struct Premise {
    ndevs: usize,
    blocks: Vec<Block>,
    edges: Vec<Edge>,
    // Derived.
    topo: Vec<usize>,
    rank: Vec<usize>,
    preds: Vec<Vec<(usize, i64)>>,
    succs: Vec<Vec<(usize, i64)>>,
    head: Vec<i64>,
    tail: Vec<i64>,
    work: Vec<i64>,
    on_device: Vec<Vec<usize>>,
}

impl PartialEq for Premise {
    fn eq(&self, other: &Self) -> bool {
        self.ndevs == other.ndevs && self.blocks == other.blocks && self.edges == other.edges
    }
}
impl Eq for Premise {}

impl Premise {
    /// Validates and builds a premise.
    ///
    /// Errors (`InvalidArgument`, naming the offending block, edge or device) when:
    /// `ndevs` is 0 or above [`MAX_DEVICES`]; there are no blocks; a span is not in
    /// `1..=MAX_VALUE`; a device set is empty, has a duplicate or a device `>= ndevs`; an edge
    /// names a missing block, is a self-loop, is repeated or has a lag outside `0..=MAX_VALUE`;
    /// the edges contain a cycle (one is named); the memory deltas of a device do not sum to 0;
    /// or some set of blocks that can run first (closed under predecessors) frees more memory
    /// on a device than it allocates.
    pub fn new(ndevs: usize, mut blocks: Vec<Block>, edges: Vec<Edge>) -> Result<Premise> {
        if ndevs == 0 || ndevs > MAX_DEVICES {
            return Err(Error::invalid(
                "ndevs",
                format!("must be in 1..={MAX_DEVICES}, got {ndevs}"),
            ));
        }
        if blocks.is_empty() {
            return Err(Error::invalid(
                "blocks",
                "a premise needs at least one block",
            ));
        }
        let n = blocks.len();
        for (g, b) in blocks.iter_mut().enumerate() {
            let who = || format!("block {g} ({:?})", b.name);
            if !(1..=MAX_VALUE).contains(&b.span) {
                return Err(Error::invalid(
                    "blocks",
                    format!(
                        "{}: span must be an integer in 1..={MAX_VALUE}, got {}",
                        who(),
                        b.span
                    ),
                ));
            }
            if b.memory.abs() > MAX_VALUE {
                return Err(Error::invalid(
                    "blocks",
                    format!(
                        "{}: |memory| must be at most {MAX_VALUE}, got {}",
                        who(),
                        b.memory
                    ),
                ));
            }
            if b.devices.is_empty() {
                return Err(Error::invalid(
                    "blocks",
                    format!("{}: the device set is empty", who()),
                ));
            }
            if let Some(&d) = b.devices.iter().find(|&&d| d >= ndevs) {
                return Err(Error::invalid(
                    "blocks",
                    format!("{}: device {d} is out of range for ndevs={ndevs}", who()),
                ));
            }
            let mut devs = b.devices.clone();
            devs.sort_unstable();
            if let Some(w) = devs.windows(2).find(|w| w[0] == w[1]) {
                return Err(Error::invalid(
                    "blocks",
                    format!("{}: device {} appears twice in the device set", who(), w[0]),
                ));
            }
            b.devices = devs;
        }
        let mut preds = vec![Vec::new(); n];
        let mut succs = vec![Vec::new(); n];
        for (i, e) in edges.iter().enumerate() {
            if e.from >= n || e.to >= n {
                return Err(Error::invalid(
                    "edges",
                    format!(
                        "edge {i} ({} -> {}) names a block outside 0..{n}",
                        e.from, e.to
                    ),
                ));
            }
            if e.from == e.to {
                return Err(Error::invalid(
                    "edges",
                    format!("edge {i} is a self-loop on block {}", e.from),
                ));
            }
            if !(0..=MAX_VALUE).contains(&e.lag) {
                return Err(Error::invalid(
                    "edges",
                    format!(
                        "edge {i} ({} -> {}): lag must be in 0..={MAX_VALUE}, got {}",
                        e.from, e.to, e.lag
                    ),
                ));
            }
            if succs[e.from].iter().any(|&(h, _)| h == e.to) {
                return Err(Error::invalid(
                    "edges",
                    format!("edge {i} ({} -> {}) is repeated", e.from, e.to),
                ));
            }
            succs[e.from].push((e.to, e.lag));
            preds[e.to].push((e.from, e.lag));
        }
        for v in preds.iter_mut().chain(succs.iter_mut()) {
            v.sort_unstable();
        }
        let topo = topological_order(&blocks, &preds, &succs)?;
        let mut rank = vec![0; n];
        for (r, &g) in topo.iter().enumerate() {
            rank[g] = r;
        }
        let mut head = vec![0i64; n];
        for &g in &topo {
            head[g] = preds[g]
                .iter()
                .map(|&(p, c)| head[p] + blocks[p].span + c)
                .max()
                .unwrap_or(0);
        }
        let mut tail = vec![0i64; n];
        for &g in topo.iter().rev() {
            tail[g] = succs[g]
                .iter()
                .map(|&(h, c)| c + blocks[h].span + tail[h])
                .max()
                .unwrap_or(0);
        }
        let mut work = vec![0i64; ndevs];
        let mut on_device = vec![Vec::new(); ndevs];
        for &g in &topo {
            for &d in &blocks[g].devices {
                work[d] += blocks[g].span;
                on_device[d].push(g);
            }
        }
        let p = Premise {
            ndevs,
            blocks,
            edges,
            topo,
            rank,
            preds,
            succs,
            head,
            tail,
            work,
            on_device,
        };
        p.check_memory()?;
        Ok(p)
    }

    /// A chain premise: block `g` precedes block `g + 1`, no lags.
    pub fn chain(ndevs: usize, blocks: Vec<Block>) -> Result<Premise> {
        let edges = (1..blocks.len()).map(|g| Edge::new(g - 1, g)).collect();
        Premise::new(ndevs, blocks, edges)
    }

    /// Memory well-formedness (§1): per device the deltas sum to 0, and no set of blocks closed
    /// under predecessors (what may have started at some time) has a negative sum.
    fn check_memory(&self) -> Result<()> {
        for d in 0..self.ndevs {
            let total: i64 = self.on_device[d]
                .iter()
                .map(|&g| self.blocks[g].memory)
                .sum();
            if total != 0 {
                return Err(Error::invalid(
                    "blocks",
                    format!(
                        "unbalanced memory on device {d}: the deltas of its blocks sum to {total}, \
                         not 0 (each micro-batch must free what it allocates)"
                    ),
                ));
            }
            if self.on_device[d]
                .iter()
                .all(|&g| self.blocks[g].memory >= 0)
            {
                continue;
            }
            let weight: Vec<i64> = (0..self.nblocks())
                .map(|g| {
                    if self.blocks[g].on(d) {
                        self.blocks[g].memory
                    } else {
                        0
                    }
                })
                .collect();
            let (min_sum, ideal) = min_weight_ideal(&weight, &self.preds);
            if min_sum < 0 {
                let names: Vec<String> = ideal
                    .iter()
                    .filter(|&&g| self.blocks[g].on(d))
                    .map(|&g| self.describe(g))
                    .collect();
                return Err(Error::invalid(
                    "blocks",
                    format!(
                        "negative running memory on device {d}: the blocks {} can all run before the \
                         rest and together free {} more than they allocate",
                        names.join(", "),
                        -min_sum
                    ),
                ));
            }
        }
        Ok(())
    }

    /// `"g (name)"` for messages.
    pub fn describe(&self, g: usize) -> String {
        format!("{g} ({:?})", self.blocks[g].name)
    }

    pub fn ndevs(&self) -> usize {
        self.ndevs
    }
    pub fn nblocks(&self) -> usize {
        self.blocks.len()
    }
    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }
    pub fn block(&self, g: usize) -> &Block {
        &self.blocks[g]
    }
    pub fn span(&self, g: usize) -> i64 {
        self.blocks[g].span
    }
    pub fn edges(&self) -> &[Edge] {
        &self.edges
    }
    /// Predecessors of `g` as `(block, lag)`, sorted.
    pub fn preds(&self, g: usize) -> &[(usize, i64)] {
        &self.preds[g]
    }
    /// Successors of `g` as `(block, lag)`, sorted.
    pub fn succs(&self, g: usize) -> &[(usize, i64)] {
        &self.succs[g]
    }
    /// A topological order (Kahn's algorithm, smallest index first: deterministic).
    pub fn topo_order(&self) -> &[usize] {
        &self.topo
    }
    /// Position of each block in [`Premise::topo_order`].
    pub fn topo_rank(&self) -> &[usize] {
        &self.rank
    }
    /// `head_g`: the longest path (spans and lags) from a source to the start of `g`.
    pub fn heads(&self) -> &[i64] {
        &self.head
    }
    /// `tail_g`: the longest path from the end of `g` to the end of a sink.
    pub fn tails(&self) -> &[i64] {
        &self.tail
    }
    /// `W_d`: the total span of the blocks on each device.
    pub fn work(&self) -> &[i64] {
        &self.work
    }
    /// The blocks on device `d`, in topological order.
    pub fn blocks_on(&self, d: usize) -> &[usize] {
        &self.on_device[d]
    }
    /// `CP = max_g head_g + s_g + tail_g`: the latency of one micro-batch alone.
    pub fn critical_path(&self) -> i64 {
        (0..self.nblocks())
            .map(|g| self.head[g] + self.blocks[g].span + self.tail[g])
            .max()
            .unwrap_or(0)
    }
    /// `P_LB = max_d W_d`: no period (time per micro-batch in steady state) can be shorter.
    pub fn period_lower_bound(&self) -> i64 {
        self.work.iter().copied().max().unwrap_or(0)
    }
    /// True when every memory delta is 0 (an inference premise).
    pub fn is_inference(&self) -> bool {
        self.blocks.iter().all(|b| b.memory == 0)
    }

    /// `LB(N)`, a lower bound on the makespan of any valid schedule of `nmicros` micro-batches:
    /// `max( max_d [min_{g on d} head_g + N W_d + min_{g on d} tail_g],
    ///       max_g [head_g + N s_g + tail_g] )`.
    /// The second term holds because the N copies of a block share its devices.
    /// Saturates at `i64::MAX` (see [`Premise::makespan_lower_bound_wide`] for the exact value).
    pub fn makespan_lower_bound(&self, nmicros: usize) -> i64 {
        i64::try_from(self.makespan_lower_bound_wide(nmicros as u64)).unwrap_or(i64::MAX)
    }

    /// [`Premise::makespan_lower_bound`] in 128-bit arithmetic: exact for any `nmicros`.
    pub fn makespan_lower_bound_wide(&self, nmicros: u64) -> i128 {
        if nmicros == 0 {
            return 0;
        }
        let n = i128::from(nmicros);
        let mut lb = 0i128;
        for d in 0..self.ndevs {
            let on = &self.on_device[d];
            if on.is_empty() {
                continue;
            }
            let h = on.iter().map(|&g| self.head[g]).min().unwrap_or(0);
            let t = on.iter().map(|&g| self.tail[g]).min().unwrap_or(0);
            lb = lb.max(i128::from(h) + n * i128::from(self.work[d]) + i128::from(t));
        }
        for g in 0..self.nblocks() {
            lb = lb.max(
                i128::from(self.head[g])
                    + n * i128::from(self.blocks[g].span)
                    + i128::from(self.tail[g]),
            );
        }
        lb
    }

    /// The premise of inference: the same blocks with every memory delta set to 0.
    pub fn without_memory(&self) -> Premise {
        let blocks = self
            .blocks
            .iter()
            .map(|b| Block {
                memory: 0,
                ..b.clone()
            })
            .collect();
        Premise::new(self.ndevs, blocks, self.edges.clone())
            .expect("dropping memory keeps a premise valid")
    }
}

/// Kahn's algorithm with the smallest ready index first; names a cycle when there is one.
fn topological_order(
    blocks: &[Block],
    preds: &[Vec<(usize, i64)>],
    succs: &[Vec<(usize, i64)>],
) -> Result<Vec<usize>> {
    let n = blocks.len();
    let mut indeg: Vec<usize> = preds.iter().map(Vec::len).collect();
    let mut ready: BinaryHeap<Reverse<usize>> =
        (0..n).filter(|&g| indeg[g] == 0).map(Reverse).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(Reverse(g)) = ready.pop() {
        order.push(g);
        for &(h, _) in &succs[g] {
            indeg[h] -= 1;
            if indeg[h] == 0 {
                ready.push(Reverse(h));
            }
        }
    }
    if order.len() == n {
        return Ok(order);
    }
    // Every block left has a predecessor left: walk predecessors until one repeats.
    let left: Vec<bool> = (0..n).map(|g| indeg[g] > 0).collect();
    let start = (0..n).find(|&g| left[g]).expect("some block is left");
    let mut seen = vec![usize::MAX; n];
    let mut path = Vec::new();
    let mut g = start;
    while seen[g] == usize::MAX {
        seen[g] = path.len();
        path.push(g);
        g = preds[g]
            .iter()
            .map(|&(p, _)| p)
            .find(|&p| left[p])
            .expect("a left block has a left predecessor");
    }
    let mut cycle: Vec<usize> = path[seen[g]..].to_vec();
    cycle.reverse(); // predecessor walk -> edge direction
    let names: Vec<String> = cycle
        .iter()
        .chain(std::iter::once(&cycle[0]))
        .map(|&g| format!("{g} ({:?})", blocks[g].name))
        .collect();
    Err(Error::invalid(
        "edges",
        format!("the edges contain a cycle: {}", names.join(" -> ")),
    ))
}

/// The minimum of `sum(weight[g] for g in I)` over the ideals `I` (sets closed under
/// predecessors), and one minimising ideal (sorted). A maximum-weight closure problem, solved
/// as a minimum cut (Picard 1976) with Dinic's algorithm.
fn min_weight_ideal(weight: &[i64], preds: &[Vec<(usize, i64)>]) -> (i64, Vec<usize>) {
    // Maximise sum of w' = -weight over ideals: source -> g (w' > 0), g -> sink (w' < 0),
    // g -> p infinite for every predecessor p (choosing g forces p).
    let n = weight.len();
    let (s, t) = (n, n + 1);
    let mut net = FlowNet::new(n + 2);
    let mut positive = 0i64;
    for g in 0..n {
        let w = -weight[g];
        if w > 0 {
            net.add(s, g, w);
            positive += w;
        } else if w < 0 {
            net.add(g, t, -w);
        }
        for &(p, _) in &preds[g] {
            net.add(g, p, i64::MAX / 4);
        }
    }
    let flow = net.max_flow(s, t);
    let reach = net.reachable(s);
    let ideal: Vec<usize> = (0..n).filter(|&g| reach[g]).collect();
    (-(positive - flow), ideal)
}

/// A small Dinic max-flow network (used only for the memory well-formedness check).
struct FlowNet {
    adj: Vec<Vec<usize>>,
    to: Vec<usize>,
    cap: Vec<i64>,
}

impl FlowNet {
    fn new(n: usize) -> Self {
        FlowNet {
            adj: vec![Vec::new(); n],
            to: Vec::new(),
            cap: Vec::new(),
        }
    }
    fn add(&mut self, u: usize, v: usize, c: i64) {
        self.adj[u].push(self.to.len());
        self.to.push(v);
        self.cap.push(c);
        self.adj[v].push(self.to.len());
        self.to.push(u);
        self.cap.push(0);
    }
    fn levels(&self, s: usize) -> Vec<i64> {
        let mut level = vec![-1; self.adj.len()];
        let mut queue = std::collections::VecDeque::from([s]);
        level[s] = 0;
        while let Some(u) = queue.pop_front() {
            for &e in &self.adj[u] {
                if self.cap[e] > 0 && level[self.to[e]] < 0 {
                    level[self.to[e]] = level[u] + 1;
                    queue.push_back(self.to[e]);
                }
            }
        }
        level
    }
    fn push(&mut self, u: usize, t: usize, f: i64, level: &[i64], it: &mut [usize]) -> i64 {
        if u == t {
            return f;
        }
        while it[u] < self.adj[u].len() {
            let e = self.adj[u][it[u]];
            let v = self.to[e];
            if self.cap[e] > 0 && level[v] == level[u] + 1 {
                let d = self.push(v, t, f.min(self.cap[e]), level, it);
                if d > 0 {
                    self.cap[e] -= d;
                    self.cap[e ^ 1] += d;
                    return d;
                }
            }
            it[u] += 1;
        }
        0
    }
    fn max_flow(&mut self, s: usize, t: usize) -> i64 {
        let mut flow = 0;
        loop {
            let level = self.levels(s);
            if level[t] < 0 {
                return flow;
            }
            let mut it = vec![0; self.adj.len()];
            loop {
                let f = self.push(s, t, i64::MAX, &level, &mut it);
                if f == 0 {
                    break;
                }
                flow += f;
            }
        }
    }
    fn reachable(&self, s: usize) -> Vec<bool> {
        self.levels(s).iter().map(|&l| l >= 0).collect()
    }
}

/// When a negative memory delta takes effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum MemoryConvention {
    /// Every delta applies when its block starts (Tessel's convention; the default).
    #[default]
    Start,
    /// Allocations apply at the start, frees at the end of the block.
    AllocStartFreeEnd,
}

impl MemoryConvention {
    pub fn as_str(self) -> &'static str {
        match self {
            MemoryConvention::Start => "start",
            MemoryConvention::AllocStartFreeEnd => "alloc_start_free_end",
        }
    }
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "start" => Ok(MemoryConvention::Start),
            "alloc_start_free_end" => Ok(MemoryConvention::AllocStartFreeEnd),
            _ => Err(Error::invalid(
                "memory_convention",
                format!("expected 'start' or 'alloc_start_free_end', got {s:?}"),
            )),
        }
    }
    /// The time at which the delta of a block starting at `start` takes effect.
    #[inline]
    pub fn effect_time(self, start: i64, span: i64, memory: i64) -> i64 {
        match self {
            MemoryConvention::AllocStartFreeEnd if memory < 0 => start + span,
            _ => start,
        }
    }
}

/// Normalises a memory cap argument: `None` is unlimited everywhere, one value is shared by
/// every device, otherwise one value per device. Caps must be `>= 0`.
pub fn memory_caps(ndevs: usize, caps: Option<&[i64]>) -> Result<Vec<i64>> {
    let v = match caps {
        None => vec![UNLIMITED; ndevs],
        Some([m]) => vec![*m; ndevs],
        Some(c) if c.len() == ndevs => c.to_vec(),
        Some(c) => {
            return Err(Error::shape(
                "memory",
                format!("1 or ndevs={ndevs} values"),
                c.len(),
            ));
        }
    };
    if let Some((d, m)) = v.iter().enumerate().find(|(_, &m)| m < 0) {
        return Err(Error::invalid(
            "memory",
            format!("the cap of device {d} is negative ({m})"),
        ));
    }
    Ok(v)
}

/// A schedule: an integer start for every job `(j, g)` of an instance `(premise, N, M)`.
///
/// `starts` is row-major `nmicros x nblocks`: `starts[j * nblocks + g]` is `S(g, j)`.
/// Nothing here checks validity (V1-V4): a schedule read from a file may be invalid, and
/// the validator reports how.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    pub premise: Arc<Premise>,
    pub nmicros: usize,
    pub starts: Vec<i64>,
    /// Memory cap per device ([`UNLIMITED`] for none).
    pub memory: Vec<i64>,
    pub convention: MemoryConvention,
    /// Whether V4 (FIFO per block) is part of validity.
    pub fifo: bool,
    /// The steady period `P`, when the schedule is periodic in its middle.
    pub period: Option<i64>,
    /// The 1-periodic template `a` (length nblocks) the schedule was unrolled from.
    pub template: Option<Vec<i64>>,
    /// The repetend window `[start, end)` in time units.
    pub repetend: Option<(i64, i64)>,
}

impl Schedule {
    /// A schedule with no memory cap, the `start` convention, FIFO on and no periodic data.
    /// Errors when `starts` does not have `nmicros * nblocks` entries.
    pub fn new(premise: Arc<Premise>, nmicros: usize, starts: Vec<i64>) -> Result<Schedule> {
        let n = premise.nblocks();
        if nmicros.checked_mul(n) != Some(starts.len()) {
            return Err(Error::shape(
                "starts",
                format!("({nmicros}, {n})"),
                format!("{} values", starts.len()),
            ));
        }
        let ndevs = premise.ndevs();
        Ok(Schedule {
            premise,
            nmicros,
            starts,
            memory: vec![UNLIMITED; ndevs],
            convention: MemoryConvention::Start,
            fifo: true,
            period: None,
            template: None,
            repetend: None,
        })
    }

    /// `S(g, j)`.
    #[inline]
    pub fn start(&self, j: usize, g: usize) -> i64 {
        self.starts[j * self.premise.nblocks() + g]
    }

    /// `S(g, j) + s_g`.
    #[inline]
    pub fn end(&self, j: usize, g: usize) -> i64 {
        self.start(j, g) + self.premise.span(g)
    }

    /// Makespan `C = max S + s` (0 for an empty schedule).
    pub fn makespan(&self) -> i64 {
        let n = self.premise.nblocks();
        (0..self.starts.len())
            .map(|k| self.starts[k] + self.premise.span(k % n))
            .max()
            .unwrap_or(0)
    }

    /// Bubble ratio `1 - N sum_d W_d / (D C)` (0 for an empty schedule).
    pub fn bubble_ratio(&self) -> f64 {
        let c = self.makespan();
        if c <= 0 {
            return 0.0;
        }
        let busy: i64 = self.premise.work().iter().sum::<i64>() * self.nmicros as i64;
        1.0 - busy as f64 / (self.premise.ndevs() as f64 * c as f64)
    }

    /// Peak memory per device, `max(0, max_t mem_d(t))`, under the schedule's convention.
    pub fn peak_memory(&self) -> Vec<i64> {
        self.peak_memory_under(self.convention)
    }

    /// [`Schedule::peak_memory`] under `convention` instead of the schedule's own.
    pub fn peak_memory_under(&self, convention: MemoryConvention) -> Vec<i64> {
        (0..self.premise.ndevs())
            .map(|d| {
                memory_levels(&self.memory_events(d, convention))
                    .map(|(_, level)| level)
                    .fold(0, i64::max)
            })
            .collect()
    }

    /// The memory deltas of device `d` as `(effect time, delta)` under `convention`, sorted;
    /// blocks without memory are left out.
    pub(crate) fn memory_events(&self, d: usize, convention: MemoryConvention) -> Vec<(i64, i64)> {
        let p = &self.premise;
        let mut ev: Vec<(i64, i64)> = Vec::new();
        for &g in p.blocks_on(d) {
            let (s, mu) = (p.span(g), p.block(g).memory);
            if mu == 0 {
                continue;
            }
            for j in 0..self.nmicros {
                ev.push((convention.effect_time(self.start(j, g), s, mu), mu));
            }
        }
        ev.sort_unstable();
        ev
    }
}

/// The memory level after each distinct time of `events` (`(time, delta)` sorted by time):
/// `(time, level)`, the level summing every delta at or before `time`.
pub(crate) fn memory_levels(events: &[(i64, i64)]) -> impl Iterator<Item = (i64, i64)> + '_ {
    events.chunk_by(|x, y| x.0 == y.0).scan(0i64, |level, at| {
        *level += at.iter().map(|e| e.1).sum::<i64>();
        Some((at[0].0, *level))
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The blocks of the V (`F0..F{D-1}` span 1 memory +1, then `B{D-1}..B0` span 3 memory
    /// -1), the unit tests' common premise.
    fn fb(ndevs: usize) -> Vec<Block> {
        let mut v: Vec<Block> = (0..ndevs)
            .map(|d| Block::new(format!("F{d}"), 1, vec![d], 1, Kind::Forward))
            .collect();
        v.extend(
            (0..ndevs)
                .rev()
                .map(|d| Block::new(format!("B{d}"), 3, vec![d], -1, Kind::Backward)),
        );
        v
    }

    /// The V on `d` devices.
    pub(crate) fn vshape(d: usize) -> Arc<Premise> {
        Arc::new(Premise::chain(d, fb(d)).unwrap())
    }

    #[test]
    fn vshape_derived_quantities() {
        let p = Premise::chain(4, fb(4)).unwrap();
        assert_eq!(p.work(), &[4, 4, 4, 4]);
        assert_eq!(p.critical_path(), 16);
        assert_eq!(p.period_lower_bound(), 4);
        assert_eq!(p.heads()[0], 0);
        assert_eq!(p.heads()[4], 4);
        assert_eq!(p.tails()[0], 15);
        // (N + D - 1)(f + b) for the V: LB(4) = 0 + 16 + 12 = 28.
        assert_eq!(p.makespan_lower_bound(4), 28);
        assert_eq!(p.makespan_lower_bound(1), 16);
    }

    #[test]
    fn errors_name_the_problem() {
        let e = Premise::new(2, vec![], vec![]).unwrap_err().to_string();
        assert!(e.contains("at least one block"), "{e}");
        let mut b = fb(2);
        b[1].span = 0;
        assert!(Premise::chain(2, b)
            .unwrap_err()
            .to_string()
            .contains("span"));
        let mut b = fb(2);
        b[0].devices = vec![];
        assert!(Premise::chain(2, b)
            .unwrap_err()
            .to_string()
            .contains("empty"));
        let mut b = fb(2);
        b[0].devices = vec![5];
        assert!(Premise::chain(2, b)
            .unwrap_err()
            .to_string()
            .contains("out of range"));
        let mut b = fb(2);
        b[0].memory = 2;
        assert!(Premise::chain(2, b)
            .unwrap_err()
            .to_string()
            .contains("unbalanced"));
        // A cycle.
        let e = Premise::new(
            2,
            fb(2),
            vec![Edge::new(0, 1), Edge::new(1, 2), Edge::new(2, 0)],
        )
        .unwrap_err();
        assert!(e.to_string().contains("cycle"), "{e}");
        // A free that can run before its allocation: B0 alone is an ideal.
        let e = Premise::new(2, fb(2), vec![Edge::new(0, 1), Edge::new(1, 2)]).unwrap_err();
        assert!(
            e.to_string()
                .contains("negative running memory on device 0"),
            "{e}"
        );
        assert!(e.to_string().contains("B0"), "{e}");
        // Lags and duplicates.
        assert!(Premise::new(2, fb(2), vec![Edge::with_lag(0, 1, -1)]).is_err());
        assert!(Premise::new(2, fb(2), vec![Edge::new(0, 1), Edge::new(0, 1)]).is_err());
    }

    #[test]
    fn peak_memory_under_both_conventions() {
        let p = Arc::new(Premise::chain(1, fb(1)).unwrap());
        // F at 0, B at 1 (ends 4); F of j=1 at 1.
        let mut s = Schedule::new(p, 2, vec![0, 1, 1, 4]).unwrap();
        // start: t=0 +1, t=1 (+1 -1) -> 1, t=4 -1 -> 0; peak 1.
        assert_eq!(s.peak_memory(), vec![1]);
        s.convention = MemoryConvention::AllocStartFreeEnd;
        // free of j=0 at 4: t=1 holds 2.
        assert_eq!(s.peak_memory(), vec![2]);
        assert_eq!(s.makespan(), 7);
    }
}
