//! Schedule formats (spec §8): our JSON, Tessel's JSON, the text grid and the CSV of
//! torch.distributed.pipelining.
//!
//! * **JSON** (`"format": "maleki_rs.tessel.schedule/1"`): the premise (blocks, edges, lags),
//!   the instance (`nmicros`, `memory_limit`, `memory_convention`, `fifo`), the optional
//!   periodic data (`period`, `template` with `K * nblocks` entries for a K-periodic
//!   schedule, `repetend`), `starts` (an N x n list), `metrics`
//!   (derived; ignored on reading), and the optional `name` and `parameter_memory`. Lossless.
//! * **Tessel JSON**: `{ndevs, repetend, blocks: [{mid, gid, span, memory, btype, step,
//!   device}]}` as the reference's `SchedPlan.save` writes it. It holds no edges, so reading
//!   it needs the premise (or builds a chain in gid order).
//! * **Text grid**, the reference's printout: one row per device, one token per time unit
//!   (`f3`, `b0`; a block spanning several units is joined: `b0-b0-b0`), `--` for idle and `|`
//!   at the repetend boundaries. When a device runs several blocks of one kind, tokens carry
//!   the block: `f3.5` is block 5 of micro-batch 3 (reading also accepts the reference's bare
//!   tokens and assigns them in topological order). `compact` prints per-device order lists.
//! * **CSV** (torch.distributed.pipelining `_load_csv(format="compute_only")`, torchtitan's
//!   `pipeline_parallel_schedule_csv`): one row per device (rank) of actions in dispatch order.
//!   Pipeline premises use torch's tokens `<stage><F|B|I|W><mb>` (`I` is the input-gradient
//!   half of a split backward); other premises `<block><F|B|W|O><mb>`.

use std::collections::HashMap;
use std::sync::Arc;

use maleki_common::{Error, Result};
use serde_json::{json, Map, Value};

use crate::baselines::{pipeline_stages, Stage};
use crate::model::{Block, Edge, Kind, MemoryConvention, Premise, Schedule, UNLIMITED};
use crate::simulate::{orders_of, Orders};
use crate::validate::Job;

/// The `format` tag of our JSON.
pub const FORMAT: &str = "maleki_rs.tessel.schedule/1";

/// Largest text grid written (time units x devices); beyond it use the compact form.
pub const MAX_GRID_CELLS: i64 = 20_000_000;

/// A schedule plus what our JSON carries besides it.
#[derive(Clone, Debug, PartialEq)]
pub struct Document {
    pub schedule: Schedule,
    /// The generator or search that made it (`"1f1b"`, `"tessel"`, ...).
    pub name: Option<String>,
    /// Copies of the parameters per device (2 for Chimera).
    pub parameter_memory: i64,
}

impl Document {
    pub fn new(schedule: Schedule) -> Document {
        Document {
            schedule,
            name: None,
            parameter_memory: 1,
        }
    }
}

fn bad(what: impl Into<String>) -> Error {
    Error::invalid("text", what.into())
}

fn field<'a>(o: &'a Map<String, Value>, key: &str, ctx: &str) -> Result<&'a Value> {
    o.get(key)
        .ok_or_else(|| bad(format!("{ctx}: missing field {key:?}")))
}

fn as_obj<'a>(v: &'a Value, ctx: &str) -> Result<&'a Map<String, Value>> {
    v.as_object()
        .ok_or_else(|| bad(format!("{ctx}: expected an object")))
}

fn as_arr<'a>(v: &'a Value, ctx: &str) -> Result<&'a Vec<Value>> {
    v.as_array()
        .ok_or_else(|| bad(format!("{ctx}: expected a list")))
}

/// An integer, also from an integral float (the reference writes memory as a float).
fn as_int(v: &Value, ctx: &str) -> Result<i64> {
    if let Some(i) = v.as_i64() {
        return Ok(i);
    }
    match v.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Ok(f as i64),
        Some(f) => Err(bad(format!("{ctx}: expected an integer, got {f}"))),
        None => Err(bad(format!("{ctx}: expected an integer, got {v}"))),
    }
}

fn as_index(v: &Value, ctx: &str) -> Result<usize> {
    let i = as_int(v, ctx)?;
    usize::try_from(i).map_err(|_| bad(format!("{ctx}: expected a non-negative integer, got {i}")))
}

fn as_str<'a>(v: &'a Value, ctx: &str) -> Result<&'a str> {
    v.as_str()
        .ok_or_else(|| bad(format!("{ctx}: expected a string")))
}

fn parse_json(text: &str) -> Result<Value> {
    serde_json::from_str(text).map_err(|e| bad(format!("invalid JSON: {e}")))
}

// ---------------------------------------------------------------------------------------
// Premises.

/// The premise as a JSON value: `{ndevs, blocks: [{gid, name, span, memory, kind, devices}],
/// edges: [[g, h], ...], lags: [...]}`.
pub fn premise_to_value(p: &Premise) -> Value {
    let blocks: Vec<Value> = p
        .blocks()
        .iter()
        .enumerate()
        .map(|(g, b)| {
            json!({"gid": g, "name": b.name, "span": b.span, "memory": b.memory,
                   "kind": b.kind.as_str(), "devices": b.devices})
        })
        .collect();
    let edges: Vec<Value> = p.edges().iter().map(|e| json!([e.from, e.to])).collect();
    let lags: Vec<i64> = p.edges().iter().map(|e| e.lag).collect();
    json!({"ndevs": p.ndevs(), "blocks": blocks, "edges": edges, "lags": lags})
}

/// Reads [`premise_to_value`]'s form (validated by [`Premise::new`]). `gid` fields, when
/// present, must be `0, 1, ...` in order; `lags` may be omitted.
pub fn premise_from_value(v: &Value) -> Result<Premise> {
    let o = as_obj(v, "premise")?;
    let ndevs = as_index(field(o, "ndevs", "premise")?, "premise.ndevs")?;
    let mut blocks = Vec::new();
    for (g, b) in as_arr(field(o, "blocks", "premise")?, "premise.blocks")?
        .iter()
        .enumerate()
    {
        let ctx = format!("premise.blocks[{g}]");
        let bo = as_obj(b, &ctx)?;
        if let Some(gid) = bo.get("gid") {
            if as_index(gid, &ctx)? != g {
                return Err(bad(format!("{ctx}: gid must equal the position {g}")));
            }
        }
        let devices = as_arr(field(bo, "devices", &ctx)?, &ctx)?
            .iter()
            .map(|d| as_index(d, &format!("{ctx}.devices")))
            .collect::<Result<Vec<_>>>()?;
        blocks.push(Block::new(
            bo.get("name")
                .map(|n| as_str(n, &ctx).map(str::to_string))
                .transpose()?
                .unwrap_or_else(|| format!("g{g}")),
            as_int(field(bo, "span", &ctx)?, &format!("{ctx}.span"))?,
            devices,
            as_int(field(bo, "memory", &ctx)?, &format!("{ctx}.memory"))?,
            Kind::parse(as_str(field(bo, "kind", &ctx)?, &ctx)?)?,
        ));
    }
    let edges_v = as_arr(field(o, "edges", "premise")?, "premise.edges")?;
    let lags: Vec<i64> = match o.get("lags") {
        Some(l) if !l.is_null() => as_arr(l, "premise.lags")?
            .iter()
            .map(|x| as_int(x, "premise.lags"))
            .collect::<Result<Vec<_>>>()?,
        _ => vec![0; edges_v.len()],
    };
    if lags.len() != edges_v.len() {
        return Err(bad(format!(
            "premise: {} lags for {} edges",
            lags.len(),
            edges_v.len()
        )));
    }
    let mut edges = Vec::new();
    for (k, e) in edges_v.iter().enumerate() {
        let pair = as_arr(e, "premise.edges")?;
        if pair.len() != 2 {
            return Err(bad(format!("premise.edges[{k}]: expected [from, to]")));
        }
        edges.push(Edge::with_lag(
            as_index(&pair[0], "premise.edges")?,
            as_index(&pair[1], "premise.edges")?,
            lags[k],
        ));
    }
    Premise::new(ndevs, blocks, edges)
}

/// The premise as JSON text.
pub fn premise_to_json(p: &Premise) -> String {
    premise_to_value(p).to_string()
}

/// Reads [`premise_to_json`].
pub fn premise_from_json(text: &str) -> Result<Premise> {
    premise_from_value(&parse_json(text)?)
}

// ---------------------------------------------------------------------------------------
// Our JSON.

/// Writes our JSON (compact, one line per micro-batch row of `starts`).
pub fn to_json(doc: &Document) -> String {
    let s = &doc.schedule;
    let n = s.premise.nblocks();
    let mem: Vec<Value> = s
        .memory
        .iter()
        .map(|&m| {
            if m == UNLIMITED {
                Value::Null
            } else {
                json!(m)
            }
        })
        .collect();
    let head = json!({
        "format": FORMAT,
        "name": doc.name,
        "parameter_memory": doc.parameter_memory,
        "premise": premise_to_value(&s.premise),
        "nmicros": s.nmicros,
        "memory_limit": mem,
        "memory_convention": s.convention.as_str(),
        "fifo": s.fifo,
        "period": s.period,
        "template": s.template,
        "repetend": s.repetend.map(|(a, b)| vec![a, b]),
        "metrics": {
            "makespan": s.makespan(),
            "bubble_ratio": s.bubble_ratio(),
            "peak_memory": s.peak_memory(),
            "lower_bound": s.premise.makespan_lower_bound(s.nmicros),
        },
    });
    // serde_json keeps keys sorted; write starts last, one row per line, for readability.
    let mut text = head.to_string();
    text.pop(); // the closing brace
    text.push_str(",\"starts\":[");
    for j in 0..s.nmicros {
        if j > 0 {
            text.push(',');
        }
        text.push_str("\n[");
        for g in 0..n {
            if g > 0 {
                text.push(',');
            }
            text.push_str(&s.start(j, g).to_string());
        }
        text.push(']');
    }
    text.push_str("\n]}\n");
    text
}

/// Reads our JSON. Errors name the missing or malformed field.
pub fn from_json(text: &str) -> Result<Document> {
    let v = parse_json(text)?;
    let o = as_obj(&v, "schedule")?;
    match o.get("format").and_then(Value::as_str) {
        Some(FORMAT) => {}
        Some(f) => {
            return Err(bad(format!(
                "unsupported format {f:?}; expected {FORMAT:?}"
            )))
        }
        None => {
            return Err(bad(format!(
                "missing \"format\": {FORMAT:?} (for Tessel's JSON use from_tessel_json)"
            )))
        }
    }
    let premise = Arc::new(premise_from_value(field(o, "premise", "schedule")?)?);
    let n = premise.nblocks();
    let nmicros = as_index(field(o, "nmicros", "schedule")?, "nmicros")?;
    let rows = as_arr(field(o, "starts", "schedule")?, "starts")?;
    if rows.len() != nmicros {
        return Err(bad(format!(
            "starts: {} rows for nmicros={nmicros}",
            rows.len()
        )));
    }
    let mut starts = Vec::with_capacity(nmicros * n);
    for (j, r) in rows.iter().enumerate() {
        let r = as_arr(r, "starts")?;
        if r.len() != n {
            return Err(bad(format!(
                "starts[{j}]: {} values for {n} blocks",
                r.len()
            )));
        }
        for x in r {
            starts.push(as_int(x, &format!("starts[{j}]"))?);
        }
    }
    let mut s = Schedule::new(premise, nmicros, starts)?;
    if let Some(m) = o.get("memory_limit").filter(|m| !m.is_null()) {
        let m = as_arr(m, "memory_limit")?;
        let caps = m
            .iter()
            .map(|x| {
                if x.is_null() {
                    Ok(UNLIMITED)
                } else {
                    as_int(x, "memory_limit")
                }
            })
            .collect::<Result<Vec<_>>>()?;
        s.memory = crate::model::memory_caps(s.premise.ndevs(), Some(&caps))?;
    }
    if let Some(c) = o.get("memory_convention").filter(|c| !c.is_null()) {
        s.convention = MemoryConvention::parse(as_str(c, "memory_convention")?)?;
    }
    if let Some(f) = o.get("fifo").filter(|f| !f.is_null()) {
        s.fifo = f
            .as_bool()
            .ok_or_else(|| bad("fifo: expected true or false"))?;
    }
    if let Some(p) = o.get("period").filter(|p| !p.is_null()) {
        s.period = Some(as_int(p, "period")?);
    }
    if let Some(t) = o.get("template").filter(|t| !t.is_null()) {
        let t = as_arr(t, "template")?
            .iter()
            .map(|x| as_int(x, "template"))
            .collect::<Result<Vec<_>>>()?;
        // K * nblocks values for a K-periodic schedule (the template of the K-fold premise).
        if t.is_empty() || t.len() % n != 0 {
            return Err(bad(format!(
                "template: {} values, not a multiple of {n} blocks",
                t.len()
            )));
        }
        s.template = Some(t);
    }
    if let Some(r) = o.get("repetend").filter(|r| !r.is_null()) {
        let r = as_arr(r, "repetend")?;
        if r.len() != 2 {
            return Err(bad("repetend: expected [start, end]"));
        }
        s.repetend = Some((as_int(&r[0], "repetend")?, as_int(&r[1], "repetend")?));
    }
    let name = match o.get("name") {
        Some(Value::String(x)) => Some(x.clone()),
        Some(Value::Null) | None => None,
        Some(_) => return Err(bad("name: expected a string")),
    };
    let parameter_memory = match o.get("parameter_memory") {
        Some(x) if !x.is_null() => as_int(x, "parameter_memory")?,
        _ => 1,
    };
    Ok(Document {
        schedule: s,
        name,
        parameter_memory,
    })
}

// ---------------------------------------------------------------------------------------
// Tessel's JSON.

fn btype(k: Kind) -> &'static str {
    match k {
        Kind::Forward | Kind::Other => "forward",
        Kind::Backward | Kind::Weight => "backward",
    }
}

/// Writes the reference's `SchedPlan.save` format: one entry per job (sorted by step, then
/// block, then micro-batch), memory as integers, and the repetend window (or `null`).
pub fn to_tessel_json(s: &Schedule) -> String {
    let p = &*s.premise;
    let mut jobs: Vec<(i64, usize, usize)> = (0..s.nmicros)
        .flat_map(|j| (0..p.nblocks()).map(move |g| (j, g)))
        .map(|(j, g)| (s.start(j, g), g, j))
        .collect();
    jobs.sort_unstable();
    let blocks: Vec<Value> = jobs
        .iter()
        .map(|&(t, g, j)| {
            let b = p.block(g);
            json!({"mid": j, "span": b.span, "memory": b.memory, "btype": btype(b.kind),
                   "gid": g, "step": t, "device": b.devices})
        })
        .collect();
    json!({"ndevs": p.ndevs(), "blocks": blocks, "repetend": s.repetend.map(|(a, b)| vec![a, b])})
        .to_string()
}

/// Reads the reference's JSON. With `premise`, every entry must match it (span, memory,
/// devices, forward/backward); without, the premise is a chain of the blocks in gid order
/// (kinds from `btype`, names `F<gid>`/`B<gid>`), which must itself be well-formed. Every
/// (mid, gid) must appear exactly once.
pub fn from_tessel_json(text: &str, premise: Option<Arc<Premise>>) -> Result<Schedule> {
    let v = parse_json(text)?;
    let o = as_obj(&v, "tessel schedule")?;
    let ndevs = as_index(field(o, "ndevs", "tessel schedule")?, "ndevs")?;
    struct Entry {
        mid: usize,
        gid: usize,
        span: i64,
        memory: i64,
        backward: bool,
        step: i64,
        devices: Vec<usize>,
    }
    let mut entries = Vec::new();
    for (k, b) in as_arr(field(o, "blocks", "tessel schedule")?, "blocks")?
        .iter()
        .enumerate()
    {
        let ctx = format!("blocks[{k}]");
        let bo = as_obj(b, &ctx)?;
        let bt = as_str(field(bo, "btype", &ctx)?, &ctx)?;
        if bt != "forward" && bt != "backward" {
            return Err(bad(format!(
                "{ctx}: btype must be \"forward\" or \"backward\", got {bt:?}"
            )));
        }
        let devices = match field(bo, "device", &ctx)? {
            Value::Array(a) => a
                .iter()
                .map(|d| as_index(d, &ctx))
                .collect::<Result<Vec<_>>>()?,
            x => vec![as_index(x, &ctx)?],
        };
        let gid = bo
            .get("gid")
            .filter(|g| !g.is_null())
            .ok_or_else(|| bad(format!("{ctx}: missing gid")))?;
        entries.push(Entry {
            mid: as_index(field(bo, "mid", &ctx)?, &ctx)?,
            gid: as_index(gid, &ctx)?,
            span: as_int(field(bo, "span", &ctx)?, &ctx)?,
            memory: as_int(field(bo, "memory", &ctx)?, &format!("{ctx}.memory"))?,
            backward: bt == "backward",
            step: as_int(field(bo, "step", &ctx)?, &ctx)?,
            devices,
        });
    }
    if entries.is_empty() {
        return Err(bad("tessel schedule: no blocks"));
    }
    let premise = match premise {
        Some(p) => p,
        None => {
            let n = entries.iter().map(|e| e.gid).max().expect("non-empty") + 1;
            // Gids are 0..n, each in at least one entry: a larger one leaves a gap (checked
            // before the table of n blocks is allocated).
            if n > entries.len() {
                return Err(bad(format!(
                    "gid {} is out of range: gids must be 0..n, each used, and there are {} entries",
                    n - 1,
                    entries.len()
                )));
            }
            let mut blocks: Vec<Option<Block>> = vec![None; n];
            for e in &entries {
                let kind = if e.backward {
                    Kind::Backward
                } else {
                    Kind::Forward
                };
                let name = format!("{}{}", if e.backward { 'B' } else { 'F' }, e.gid);
                let mut devs = e.devices.clone();
                devs.sort_unstable();
                let b = Block::new(name, e.span, devs, e.memory, kind);
                match &blocks[e.gid] {
                    None => blocks[e.gid] = Some(b),
                    Some(x) if *x == b => {}
                    Some(_) => {
                        return Err(bad(format!(
                            "gid {}: entries disagree on span, memory, type or devices",
                            e.gid
                        )))
                    }
                }
            }
            let blocks = blocks
                .into_iter()
                .enumerate()
                .map(|(g, b)| {
                    b.ok_or_else(|| bad(format!("gid {g} never appears (gids must be 0..n)")))
                })
                .collect::<Result<Vec<_>>>()?;
            Arc::new(Premise::chain(ndevs, blocks)?)
        }
    };
    if premise.ndevs() != ndevs {
        return Err(bad(format!(
            "ndevs {ndevs} does not match the premise's {}",
            premise.ndevs()
        )));
    }
    let n = premise.nblocks();
    let nmicros = entries.iter().map(|e| e.mid).max().expect("non-empty") + 1;
    if nmicros.saturating_mul(n) != entries.len() {
        return Err(bad(format!(
            "{} entries for {nmicros} micro-batches x {n} blocks: every (mid, gid) must appear exactly once",
            entries.len()
        )));
    }
    let mut starts = vec![i64::MIN; nmicros * n];
    for e in &entries {
        if e.gid >= n {
            return Err(bad(format!("gid {} is out of range for {n} blocks", e.gid)));
        }
        let b = premise.block(e.gid);
        let mut devs = e.devices.clone();
        devs.sort_unstable();
        if b.span != e.span
            || b.memory != e.memory
            || devs != b.devices
            || (btype(b.kind) == "backward") != e.backward
        {
            return Err(bad(format!(
                "gid {} (mid {}): span {}, memory {}, devices {:?} do not match the premise's block {}",
                e.gid,
                e.mid,
                e.span,
                e.memory,
                e.devices,
                premise.describe(e.gid)
            )));
        }
        let k = e.mid * n + e.gid;
        if starts[k] != i64::MIN {
            return Err(bad(format!("(mid {}, gid {}) appears twice", e.mid, e.gid)));
        }
        starts[k] = e.step;
    }
    let mut s = Schedule::new(premise, nmicros, starts)?;
    if let Some(r) = o.get("repetend").filter(|r| !r.is_null()) {
        let r = as_arr(r, "repetend")?;
        if r.len() != 2 {
            return Err(bad("repetend: expected [start, end]"));
        }
        s.repetend = Some((as_int(&r[0], "repetend")?, as_int(&r[1], "repetend")?));
    }
    Ok(s)
}

// ---------------------------------------------------------------------------------------
// Text grid.

fn letter(k: Kind) -> char {
    k.letter().to_ascii_lowercase()
}

/// Whether device `d` runs several blocks of `kind` (tokens then carry the block).
fn ambiguous(p: &Premise, d: usize, kind: Kind) -> bool {
    p.blocks_on(d)
        .iter()
        .filter(|&&g| p.block(g).kind == kind)
        .count()
        > 1
}

fn token(p: &Premise, d: usize, (j, g): Job) -> String {
    let k = p.block(g).kind;
    if ambiguous(p, d, k) {
        format!("{}{j}.{g}", letter(k))
    } else {
        format!("{}{j}", letter(k))
    }
}

/// The text grid (see the module docs); `compact` prints `d<k>: tok tok ...` order lists.
/// The full grid needs non-negative starts, no overlaps on a device, and at most
/// [`MAX_GRID_CELLS`] cells.
pub fn to_text(s: &Schedule, compact: bool) -> Result<String> {
    let p = &*s.premise;
    let orders = orders_of(s);
    if compact {
        let mut out = String::new();
        for (d, o) in orders.iter().enumerate() {
            out.push_str(&format!("d{d}:"));
            for &x in o {
                out.push(' ');
                out.push_str(&token(p, d, x));
            }
            out.push('\n');
        }
        return Ok(out);
    }
    let c = s.makespan();
    if s.starts.iter().any(|&t| t < 0) {
        return Err(Error::invalid(
            "schedule",
            "the text grid needs starts >= 0",
        ));
    }
    if c.saturating_mul(p.ndevs() as i64) > MAX_GRID_CELLS {
        return Err(Error::invalid(
            "schedule",
            format!(
                "the grid would have {c} x {} cells; use compact=True",
                p.ndevs()
            ),
        ));
    }
    let bounds: Vec<i64> = match s.repetend {
        Some((a, b)) if a == b => vec![a],
        Some((a, b)) => vec![a.min(b), a.max(b)],
        None => vec![],
    };
    if bounds.iter().any(|&x| x < 0 || x > c) {
        return Err(Error::invalid(
            "schedule",
            format!(
                "the repetend window [{}, {}) lies outside [0, {c}]",
                bounds[0],
                bounds[bounds.len() - 1]
            ),
        ));
    }
    let mut out = String::new();
    for (d, o) in orders.iter().enumerate() {
        let mut items: Vec<String> = Vec::new();
        let (mut t, mut k) = (0i64, 0usize);
        loop {
            if bounds.contains(&t) {
                items.push("|".into());
            }
            if t >= c {
                break;
            }
            let next = o.get(k).map(|&(j, g)| s.start(j, g));
            if next.is_some_and(|x| x < t) {
                return Err(Error::invalid(
                    "schedule",
                    format!("jobs overlap on device {d} at time {t}: the text grid needs a schedule without V2 violations"),
                ));
            }
            if next != Some(t) {
                items.push("--".into());
                t += 1;
                continue;
            }
            let (j, g) = o[k];
            let end = s.end(j, g);
            let tok = token(p, d, (j, g));
            let run = |a: i64, b: i64| vec![tok.as_str(); (b - a) as usize].join("-");
            // Split the job's units at boundaries strictly inside it.
            let mut a = t;
            for &x in bounds.iter().filter(|&&x| t < x && x < end) {
                items.push(run(a, x));
                items.push("|".into());
                a = x;
            }
            items.push(run(a, end));
            t = end;
            k += 1;
        }
        for it in items {
            out.push(' ');
            out.push_str(&it);
        }
        out.push('\n');
    }
    Ok(out)
}

/// Reads a text grid for `premise`. Block tokens are `<f|b|w|o><mb>` or `<f|b|w|o><mb>.<gid>`;
/// a bare token on a device with several blocks of its kind goes to the first of them (in
/// topological order) not yet placed for that micro-batch. `|` marks give the repetend.
pub fn from_text(text: &str, premise: Arc<Premise>) -> Result<Schedule> {
    let p = &*premise;
    let n = p.nblocks();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.len() != p.ndevs() {
        return Err(bad(format!(
            "{} rows for {} devices (one row per device)",
            lines.len(),
            p.ndevs()
        )));
    }
    // (j, g) -> start, as seen per device.
    let mut seen: HashMap<Job, i64> = HashMap::new();
    let mut bounds: Vec<Vec<i64>> = Vec::new();
    for (d, line) in lines.iter().enumerate() {
        let mut t = 0i64;
        let mut here: Vec<i64> = Vec::new();
        let mut placed: HashMap<(usize, Kind), usize> = HashMap::new();
        let mut on_this: std::collections::HashSet<Job> = Default::default();
        // The job whose units are being read, and the units left.
        let mut cur: Option<(Job, i64)> = None;
        for item in line.split_whitespace() {
            if item == "|" {
                here.push(t);
                continue;
            }
            if item == "--" {
                if let Some((job, left)) = cur.filter(|c| c.1 > 0) {
                    return Err(bad(format!(
                        "device {d}: {} is cut short at time {t} ({left} units missing)",
                        job_name(p, job)
                    )));
                }
                t += 1;
                continue;
            }
            for unit in item.split('-') {
                let (kind, j, gid) = parse_token(unit)
                    .ok_or_else(|| bad(format!("device {d}: bad token {unit:?} at time {t}")))?;
                // A continuation of the current job?
                if let Some(((cj, cg), left)) = cur {
                    if left > 0 {
                        let same =
                            cj == j && p.block(cg).kind == kind && gid.is_none_or(|x| x == cg);
                        if !same {
                            return Err(bad(format!(
                                "device {d}: {} is cut short at time {t}",
                                job_name(p, (cj, cg))
                            )));
                        }
                        cur = Some(((cj, cg), left - 1));
                        t += 1;
                        continue;
                    }
                }
                let g = match gid {
                    Some(g) => {
                        if g >= n || !p.block(g).on(d) || p.block(g).kind != kind {
                            return Err(bad(format!(
                                "device {d}: token {unit:?} names no {kind} block of this device"
                            )));
                        }
                        g
                    }
                    None => {
                        let cands: Vec<usize> = p
                            .blocks_on(d)
                            .iter()
                            .copied()
                            .filter(|&g| p.block(g).kind == kind)
                            .collect();
                        let used = placed.entry((j, kind)).or_insert(0);
                        let g = *cands.get(*used).ok_or_else(|| {
                            bad(format!("device {d}: token {unit:?} at time {t}: no {kind} block left for micro-batch {j}"))
                        })?;
                        *used += 1;
                        g
                    }
                };
                if !on_this.insert((j, g)) {
                    return Err(bad(format!(
                        "device {d}: {} appears twice",
                        job_name(p, (j, g))
                    )));
                }
                if let Some(&t0) = seen.get(&(j, g)) {
                    if t0 != t {
                        return Err(bad(format!(
                            "device {d}: {} starts at {t} here but at {t0} on another device",
                            job_name(p, (j, g))
                        )));
                    }
                }
                seen.insert((j, g), t);
                cur = Some(((j, g), p.span(g) - 1));
                t += 1;
            }
        }
        if let Some((job, left)) = cur.filter(|c| c.1 > 0) {
            return Err(bad(format!(
                "device {d}: {} is cut short at the end ({left} units missing)",
                job_name(p, job)
            )));
        }
        bounds.push(here);
    }
    let nmicros = seen.keys().map(|&(j, _)| j).max().map_or(0, |j| j + 1);
    if nmicros.saturating_mul(n) != seen.len() {
        return Err(bad(format!(
            "{} jobs read for {nmicros} micro-batches x {n} blocks: every job must appear",
            seen.len()
        )));
    }
    let mut starts = vec![0i64; nmicros * n];
    for j in 0..nmicros {
        for g in 0..n {
            starts[j * n + g] = *seen
                .get(&(j, g))
                .ok_or_else(|| bad(format!("{} never appears", job_name(p, (j, g)))))?;
        }
    }
    // Every device must list each of its jobs (checked through the per-device counts).
    for (d, line) in lines.iter().enumerate() {
        let want = nmicros * p.blocks_on(d).len();
        let got = line
            .split_whitespace()
            .filter(|x| *x != "|" && *x != "--")
            .flat_map(|x| x.split('-'))
            .count() as i64;
        let units: i64 = p.blocks_on(d).iter().map(|&g| p.span(g)).sum::<i64>() * nmicros as i64;
        if got != units {
            return Err(bad(format!(
                "device {d}: {got} busy units, expected {units} for its {want} jobs"
            )));
        }
    }
    let mut s = Schedule::new(premise.clone(), nmicros, starts)?;
    let mut all: Vec<i64> = bounds.iter().flatten().copied().collect();
    all.sort_unstable();
    all.dedup();
    s.repetend = match all.as_slice() {
        [] => None,
        [a] => Some((*a, *a)),
        [a, b] => Some((*a, *b)),
        _ => {
            return Err(bad(format!(
                "repetend marks at more than two times: {all:?}"
            )))
        }
    };
    Ok(s)
}

fn job_name(p: &Premise, job: Job) -> String {
    crate::validate::job_name(p, job)
}

/// `f3` -> (Forward, 3, None); `b0.5` -> (Backward, 0, Some(5)).
fn parse_token(tok: &str) -> Option<(Kind, usize, Option<usize>)> {
    let mut chars = tok.chars();
    let kind = match chars.next()? {
        'f' => Kind::Forward,
        'b' => Kind::Backward,
        'w' => Kind::Weight,
        'o' => Kind::Other,
        _ => return None,
    };
    let rest = chars.as_str();
    let (mb, gid) = match rest.split_once('.') {
        Some((a, b)) => (a, Some(b)),
        None => (rest, None),
    };
    let num = |s: &str| {
        (!s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()))
            .then(|| s.parse::<usize>().ok())
            .flatten()
    };
    Some((
        kind,
        num(mb)?,
        match gid {
            Some(g) => Some(num(g)?),
            None => None,
        },
    ))
}

// ---------------------------------------------------------------------------------------
// CSV (torch.distributed.pipelining).

/// Token mapping for the CSV: torch's `<stage><F|B|I|W><mb>` when the premise is a pipeline,
/// `<gid><F|B|W|O><mb>` otherwise.
enum CsvTokens {
    Stages {
        of_block: Vec<(usize, char)>,
        by_action: HashMap<(usize, char), usize>,
    },
    Blocks,
}

fn csv_tokens(p: &Premise) -> CsvTokens {
    let Some(stages) = pipeline_stages(p, false) else {
        return CsvTokens::Blocks;
    };
    let mut of_block = vec![(0usize, 'F'); p.nblocks()];
    let mut by_action = HashMap::new();
    for (
        s,
        Stage {
            forward,
            backward,
            weight,
            ..
        },
    ) in stages.iter().enumerate()
    {
        let mut put = |g: usize, c: char| {
            of_block[g] = (s, c);
            by_action.insert((s, c), g);
        };
        put(*forward, 'F');
        if let Some(b) = backward {
            put(*b, if weight.is_some() { 'I' } else { 'B' });
        }
        if let Some(w) = weight {
            put(*w, 'W');
        }
    }
    CsvTokens::Stages {
        of_block,
        by_action,
    }
}

/// Writes per-device orders as torch's compute-only CSV.
pub fn orders_to_csv(p: &Premise, orders: &[Vec<Job>]) -> String {
    let tokens = csv_tokens(p);
    let mut out = String::new();
    for o in orders {
        let row: Vec<String> = o
            .iter()
            .map(|&(j, g)| match &tokens {
                CsvTokens::Stages { of_block, .. } => {
                    format!("{}{}{j}", of_block[g].0, of_block[g].1)
                }
                CsvTokens::Blocks => format!("{g}{}{j}", p.block(g).kind.letter()),
            })
            .collect();
        out.push_str(&row.join(","));
        out.push('\n');
    }
    out
}

/// The schedule's per-device orders (by start) as torch's compute-only CSV.
pub fn to_csv(s: &Schedule) -> String {
    orders_to_csv(&s.premise, &orders_of(s))
}

/// Reads a compute-only CSV into per-device orders for `premise`; returns the number of
/// micro-batches (largest index + 1) and the orders. Empty cells (idle steps) are skipped;
/// communication actions (`SEND_F`, ...) are rejected.
pub fn csv_to_orders(text: &str, premise: &Premise) -> Result<(usize, Orders)> {
    let tokens = csv_tokens(premise);
    let rows: Vec<&str> = text.lines().collect();
    let rows: Vec<&str> = {
        let mut r = rows;
        // Trailing blank lines beyond one row per device (a device without blocks has an
        // empty row, which must stay).
        while r.len() > premise.ndevs() && r.last().is_some_and(|l| l.trim().is_empty()) {
            r.pop();
        }
        r
    };
    if rows.len() != premise.ndevs() {
        return Err(bad(format!(
            "{} rows for {} devices (one row per rank)",
            rows.len(),
            premise.ndevs()
        )));
    }
    let mut orders: Orders = Vec::new();
    let mut nmicros = 0usize;
    for (d, row) in rows.iter().enumerate() {
        let mut o = Vec::new();
        for cell in row.split(',') {
            let cell = cell.trim();
            if cell.is_empty() {
                continue;
            }
            let (a, act, mb) = split_action(cell).ok_or_else(|| {
                bad(format!("rank {d}: cannot read action {cell:?} (expected <stage><F|B|I|W><microbatch>, e.g. 2F0)"))
            })?;
            let g = match &tokens {
                CsvTokens::Stages { by_action, .. } => *by_action.get(&(a, act)).ok_or_else(|| {
                    bad(format!("rank {d}: action {cell:?} names no stage/action of this pipeline premise"))
                })?,
                CsvTokens::Blocks => {
                    if a >= premise.nblocks() || premise.block(a).kind.letter() != act {
                        return Err(bad(format!("rank {d}: action {cell:?} names no block of this premise (<block><F|B|W|O><mb>)")));
                    }
                    a
                }
            };
            nmicros = nmicros.max(mb + 1);
            o.push((mb, g));
        }
        orders.push(o);
    }
    Ok((nmicros, orders))
}

/// `2F10` -> (2, 'F', 10).
fn split_action(cell: &str) -> Option<(usize, char, usize)> {
    let digits_end = cell.find(|c: char| !c.is_ascii_digit())?;
    let (a, rest) = cell.split_at(digits_end);
    let mut chars = rest.chars();
    let act = chars.next()?;
    let mb = chars.as_str();
    if a.is_empty()
        || mb.is_empty()
        || !mb.bytes().all(|c| c.is_ascii_digit())
        || !"FBIWO".contains(act)
    {
        return None;
    }
    Some((a.parse().ok()?, act, mb.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::baselines::baseline;
    use crate::premises::{builtin, Options};
    use crate::simulate::simulate;

    fn prem(name: &str, d: usize) -> Arc<Premise> {
        Arc::new(builtin(name, d, &Options::default()).unwrap())
    }

    #[test]
    fn json_round_trip() {
        let mut s = baseline("1f1b", prem("mshape", 4), 6).unwrap().schedule;
        s.memory = vec![6, UNLIMITED, 4, 5];
        s.convention = MemoryConvention::AllocStartFreeEnd;
        s.fifo = false;
        s.period = Some(6);
        s.template = Some((0..10).collect());
        s.repetend = Some((3, 9));
        let doc = Document {
            schedule: s,
            name: Some("1f1b".into()),
            parameter_memory: 2,
        };
        let text = to_json(&doc);
        assert_eq!(from_json(&text).unwrap(), doc);
        assert!(from_json("{}").unwrap_err().to_string().contains("format"));
        assert!(from_json(&text.replace("\"nmicros\":6", "\"nmicros\":5")).is_err());
    }

    #[test]
    fn tessel_json_round_trip() {
        let mut s = baseline("1f1b", prem("vshape", 4), 5).unwrap().schedule;
        s.repetend = Some((4, 20));
        let text = to_tessel_json(&s);
        let back = from_tessel_json(&text, Some(s.premise.clone())).unwrap();
        assert_eq!(back.starts, s.starts);
        assert_eq!(back.repetend, s.repetend);
        // Without the premise: the V is a chain in gid order.
        let chain = from_tessel_json(&text, None).unwrap();
        assert_eq!(chain.starts, s.starts);
        assert_eq!(chain.premise.work(), s.premise.work());
        // A mismatching premise is refused.
        assert!(from_tessel_json(&text, Some(prem("vshape", 2))).is_err());
    }

    #[test]
    fn text_round_trip_with_repetend_inside_blocks() {
        for (name, d) in [
            ("vshape", 4),
            ("mshape", 4),
            ("xshape", 4),
            ("kshape", 4),
            ("zb_v", 3),
        ] {
            let mut s = baseline("gpipe", prem(name, d), 4).unwrap().schedule;
            for rep in [None, Some((2, 11)), Some((5, 5)), Some((0, s.makespan()))] {
                s.repetend = rep;
                let text = to_text(&s, false).unwrap();
                let back = from_text(&text, s.premise.clone()).unwrap();
                assert_eq!(back.starts, s.starts, "{name} {rep:?}\n{text}");
                assert_eq!(back.repetend, rep, "{name}\n{text}");
            }
        }
    }

    #[test]
    fn text_grid_matches_reference_layout() {
        let p = prem("vshape", 2);
        let s = simulate(p.clone(), 1, &[vec![(0, 0), (0, 3)], vec![(0, 1), (0, 2)]]).unwrap();
        let text = to_text(&s, false).unwrap();
        assert_eq!(text, " f0 -- -- -- -- b0-b0-b0\n -- f0 b0-b0-b0 -- -- --\n");
        assert_eq!(to_text(&s, true).unwrap(), "d0: f0 b0\nd1: f0 b0\n");
        // Bare tokens on a device with two forward blocks (mshape's T_f and F_0).
        let m = prem("mshape", 2);
        let s = baseline("gpipe", m.clone(), 2).unwrap().schedule;
        let strip = |t: &str| {
            t.split('-')
                .map(|u| u.split('.').next().unwrap())
                .collect::<Vec<_>>()
                .join("-")
        };
        let full = to_text(&s, false).unwrap();
        assert!(full.contains(".0") && full.contains(".1"), "{full}");
        let bare: String = full
            .lines()
            .map(|l| l.split(' ').map(strip).collect::<Vec<_>>().join(" ") + "\n")
            .collect();
        assert_eq!(from_text(&bare, m).unwrap().starts, s.starts);
    }

    #[test]
    fn csv_round_trip_and_torch_tokens() {
        let s = baseline("zb_h1", prem("zb_v", 4), 8).unwrap().schedule;
        let csv = to_csv(&s);
        assert!(
            csv.starts_with("0F0,0F1,0F2,0F3,0I0,0W0,0F4,0I1,0W1"),
            "{csv}"
        );
        assert!(csv.contains("3I0") && csv.contains("2W1"));
        let (nm, orders) = csv_to_orders(&csv, &s.premise).unwrap();
        assert_eq!(nm, 8);
        assert_eq!(
            simulate(s.premise.clone(), nm, &orders).unwrap().starts,
            s.starts
        );
        // General premises use block tokens.
        let k = baseline("1f1b", prem("kshape", 4), 3).unwrap().schedule;
        let csv = to_csv(&k);
        let (nm, orders) = csv_to_orders(&csv, &k.premise).unwrap();
        assert_eq!(
            simulate(k.premise.clone(), nm, &orders).unwrap().starts,
            k.starts
        );
        assert!(csv_to_orders("0SEND_F0\n", &prem("vshape", 1)).is_err());
        assert!(csv_to_orders("0F0,0B0\n", &prem("vshape", 2)).is_err());
    }
}
