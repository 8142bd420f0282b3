//! `maleki_rs._core.tessel`: premises, the simulator, the validator, baselines and formats.
//!
//! The public API is `maleki_rs.tessel` (Python), which validates arguments first. Every call
//! here releases the GIL (`run_quick`) around the core work.
//!
//! Other binding files reach a premise through [`premise_arg`] (it accepts the `Premise`
//! class below) and build a core schedule from Python values with [`schedule_from_args`].

use std::sync::Arc;

use maleki_tessel::baselines;
use maleki_tessel::formats::{self, Document};
use maleki_tessel::model::{
    memory_caps, Block, Edge, Kind, MemoryConvention, Premise, Schedule, UNLIMITED,
};
use maleki_tessel::premises::{self, Options};
use maleki_tessel::simulate::{self, Lags};
use maleki_tessel::svg::{self, SvgOptions};
use maleki_tessel::template::Template;
use maleki_tessel::validate::{self as rules, Report};
use numpy::{PyArrayDyn, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::arrays::{to_numpy, Ro2};
use crate::errors::to_pyerr;
use crate::progress::{run_monitored, run_quick};

/// Per-device orders as Python sees them: `[[(micro-batch, block), ...], ...]`.
type PyOrders = Vec<Vec<(usize, usize)>>;
/// A stage of a pipeline premise: `(device, forward, backward, weight)`.
type PyStage = (usize, usize, Option<usize>, Option<usize>);
/// A pair of int64 arrays.
type Arrays2<'py> = (Bound<'py, PyArrayDyn<i64>>, Bound<'py, PyArrayDyn<i64>>);

/// A validated premise (immutable). Build it with `Premise.builtin` or `Premise.from_parts`.
#[pyclass(name = "Premise", module = "maleki_rs._core.tessel", frozen)]
pub struct PyPremise {
    pub inner: Arc<Premise>,
}

impl PyPremise {
    pub fn new(inner: Arc<Premise>) -> Self {
        PyPremise { inner }
    }
}

/// The core premise behind a `maleki_rs._core.tessel.Premise` object.
pub fn premise_arg(obj: &Bound<'_, PyAny>) -> PyResult<Arc<Premise>> {
    match obj.cast::<PyPremise>() {
        Ok(p) => Ok(p.get().inner.clone()),
        Err(_) => Err(PyTypeError::new_err(format!(
            "premise: expected a maleki_rs premise, got {}",
            obj.get_type().name()?
        ))),
    }
}

fn usize_arg(v: i64, name: &str) -> PyResult<usize> {
    usize::try_from(v).map_err(|_| PyValueError::new_err(format!("{name}: must be >= 0, got {v}")))
}

fn opt_i64(d: &Bound<'_, PyDict>, key: &str) -> PyResult<Option<i64>> {
    match d.get_item(key)? {
        Some(v) if !v.is_none() => Ok(Some(v.extract()?)),
        _ => Ok(None),
    }
}

#[pymethods]
impl PyPremise {
    /// A built-in premise; `options` holds the keyword spans (see `maleki_rs.tessel.premise`).
    #[staticmethod]
    fn builtin(
        py: Python<'_>,
        name: String,
        ndevs: i64,
        options: &Bound<'_, PyDict>,
    ) -> PyResult<Self> {
        let ndevs = usize_arg(ndevs, "ndevs")?;
        let opts = Options {
            fwd: opt_i64(options, "fwd")?,
            bwd: opt_i64(options, "bwd")?,
            wgt: opt_i64(options, "wgt")?,
            tp_fwd: opt_i64(options, "tp_fwd")?,
            tp_bwd: opt_i64(options, "tp_bwd")?,
            act: opt_i64(options, "act")?,
            tp_mem: opt_i64(options, "tp_mem")?,
            chunks: opt_i64(options, "chunks")?
                .map(|c| usize_arg(c, "chunks"))
                .transpose()?,
            fwd_spans: options
                .get_item("fwd_spans")?
                .filter(|v| !v.is_none())
                .map(|v| v.extract())
                .transpose()?,
            bwd_spans: options
                .get_item("bwd_spans")?
                .filter(|v| !v.is_none())
                .map(|v| v.extract())
                .transpose()?,
            train: match options.get_item("train")? {
                Some(v) if !v.is_none() => v.extract()?,
                _ => true,
            },
        };
        let p = run_quick(py, || premises::builtin(&name, ndevs, &opts))?;
        Ok(PyPremise::new(Arc::new(p)))
    }

    /// A premise from its parts (validated: cycles, unbalanced memory, empty device sets...).
    #[staticmethod]
    #[allow(clippy::too_many_arguments)]
    fn from_parts(
        py: Python<'_>,
        ndevs: i64,
        names: Vec<String>,
        spans: Vec<i64>,
        devices: Vec<Vec<i64>>,
        memory: Vec<i64>,
        kinds: Vec<String>,
        edges: Vec<(i64, i64)>,
        lags: Vec<i64>,
    ) -> PyResult<Self> {
        let ndevs = usize_arg(ndevs, "ndevs")?;
        let n = names.len();
        if spans.len() != n || devices.len() != n || memory.len() != n || kinds.len() != n {
            return Err(PyValueError::new_err(
                "blocks: names, spans, devices, memory and kinds must have one entry per block",
            ));
        }
        if lags.len() != edges.len() {
            return Err(PyValueError::new_err(format!(
                "lags: {} values for {} edges",
                lags.len(),
                edges.len()
            )));
        }
        let mut blocks = Vec::with_capacity(n);
        for g in 0..n {
            let devs = devices[g]
                .iter()
                .map(|&d| usize_arg(d, "devices"))
                .collect::<PyResult<Vec<_>>>()?;
            let kind = Kind::parse(&kinds[g]).map_err(to_pyerr)?;
            blocks.push(Block::new(
                names[g].clone(),
                spans[g],
                devs,
                memory[g],
                kind,
            ));
        }
        let edges = edges
            .iter()
            .zip(&lags)
            .map(|(&(a, b), &c)| {
                Ok(Edge::with_lag(
                    usize_arg(a, "edges")?,
                    usize_arg(b, "edges")?,
                    c,
                ))
            })
            .collect::<PyResult<Vec<_>>>()?;
        let p = run_quick(py, || Premise::new(ndevs, blocks, edges))?;
        Ok(PyPremise::new(Arc::new(p)))
    }

    /// Reads `to_json`'s text.
    #[staticmethod]
    fn from_json(py: Python<'_>, text: String) -> PyResult<Self> {
        Ok(PyPremise::new(Arc::new(run_quick(py, || {
            formats::premise_from_json(&text)
        })?)))
    }

    fn to_json(&self) -> String {
        formats::premise_to_json(&self.inner)
    }

    #[getter]
    fn ndevs(&self) -> usize {
        self.inner.ndevs()
    }

    #[getter]
    fn nblocks(&self) -> usize {
        self.inner.nblocks()
    }

    /// `[(name, span, devices, memory, kind), ...]`.
    #[getter]
    fn blocks(&self) -> Vec<(String, i64, Vec<usize>, i64, &'static str)> {
        self.inner
            .blocks()
            .iter()
            .map(|b| {
                (
                    b.name.clone(),
                    b.span,
                    b.devices.clone(),
                    b.memory,
                    b.kind.as_str(),
                )
            })
            .collect()
    }

    /// `[(from, to, lag), ...]`.
    #[getter]
    fn edges(&self) -> Vec<(usize, usize, i64)> {
        self.inner
            .edges()
            .iter()
            .map(|e| (e.from, e.to, e.lag))
            .collect()
    }

    #[getter]
    fn work(&self) -> Vec<i64> {
        self.inner.work().to_vec()
    }

    #[getter]
    fn heads(&self) -> Vec<i64> {
        self.inner.heads().to_vec()
    }

    #[getter]
    fn tails(&self) -> Vec<i64> {
        self.inner.tails().to_vec()
    }

    #[getter]
    fn topo_order(&self) -> Vec<usize> {
        self.inner.topo_order().to_vec()
    }

    #[getter]
    fn critical_path(&self) -> i64 {
        self.inner.critical_path()
    }

    #[getter]
    fn period_lower_bound(&self) -> i64 {
        self.inner.period_lower_bound()
    }

    fn lower_bound(&self, nmicros: i64) -> PyResult<i128> {
        Ok(self
            .inner
            .makespan_lower_bound_wide(usize_arg(nmicros, "nmicros")? as u64))
    }

    /// The stages when the premise is a pipeline: `[(device, forward, backward, weight)]`.
    fn stages(&self, allow_multi: bool) -> Option<Vec<PyStage>> {
        baselines::pipeline_stages(&self.inner, allow_multi).map(|st| {
            st.iter()
                .map(|s| (s.device, s.forward, s.backward, s.weight))
                .collect()
        })
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyPremise>()
            .is_ok_and(|o| *o.get().inner == *self.inner)
    }

    fn __hash__(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.inner.ndevs().hash(&mut h);
        self.inner.blocks().hash(&mut h);
        self.inner.edges().hash(&mut h);
        h.finish()
    }
}

/// A core schedule from Python values: `starts` (nmicros, nblocks) int64 C-contiguous,
/// `memory` None / one cap / one per device (None entries = unlimited), the convention's
/// name, the FIFO flag and the optional periodic data.
#[allow(clippy::too_many_arguments)]
pub fn schedule_from_args(
    premise: &Bound<'_, PyAny>,
    starts: &Ro2<'_, i64>,
    memory: Option<Vec<Option<i64>>>,
    convention: &str,
    fifo: bool,
    period: Option<i64>,
    template: Option<Vec<i64>>,
    repetend: Option<(i64, i64)>,
) -> PyResult<Schedule> {
    let p = premise_arg(premise)?;
    let shape = starts.shape();
    if shape[1] != p.nblocks() {
        return Err(PyValueError::new_err(format!(
            "starts: expected shape (nmicros, {}), got ({}, {})",
            p.nblocks(),
            shape[0],
            shape[1]
        )));
    }
    let data = starts
        .as_slice()
        .map_err(|_| PyValueError::new_err("starts: array must be C-contiguous"))?
        .to_vec();
    let mut s = Schedule::new(p.clone(), shape[0], data).map_err(to_pyerr)?;
    if let Some(m) = memory {
        let caps: Vec<i64> = m.iter().map(|x| x.unwrap_or(UNLIMITED)).collect();
        s.memory = memory_caps(p.ndevs(), Some(&caps)).map_err(to_pyerr)?;
    }
    s.convention = MemoryConvention::parse(convention).map_err(to_pyerr)?;
    s.fifo = fifo;
    s.period = period;
    if let Some(t) = &template {
        // K-periodic schedules carry the template of the K-fold premise (K * nblocks values).
        if t.is_empty() || t.len() % p.nblocks() != 0 {
            return Err(PyValueError::new_err(format!(
                "template: expected a multiple of {} values (K * nblocks), got {}",
                p.nblocks(),
                t.len()
            )));
        }
    }
    s.template = template;
    s.repetend = repetend;
    Ok(s)
}

/// The Python-side fields of a core schedule, as a dict (for `Schedule.__init__`).
pub fn schedule_dict<'py>(
    py: Python<'py>,
    s: Schedule,
    name: Option<String>,
    parameter_memory: i64,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let n = s.premise.nblocks();
    d.set_item("premise", Py::new(py, PyPremise::new(s.premise.clone()))?)?;
    let mem: Vec<Option<i64>> = s
        .memory
        .iter()
        .map(|&m| (m != UNLIMITED).then_some(m))
        .collect();
    d.set_item(
        "memory",
        if mem.iter().all(Option::is_none) {
            None
        } else {
            Some(mem)
        },
    )?;
    d.set_item("memory_convention", s.convention.as_str())?;
    d.set_item("fifo", s.fifo)?;
    d.set_item("period", s.period)?;
    d.set_item("template", s.template.clone())?;
    d.set_item("repetend", s.repetend)?;
    d.set_item("name", name)?;
    d.set_item("parameter_memory", parameter_memory)?;
    let nm = s.nmicros;
    d.set_item("starts", to_numpy(py, s.starts, &[nm, n])?)?;
    Ok(d)
}

fn report_list<'py>(py: Python<'py>, r: Report) -> PyResult<(Bound<'py, PyList>, usize)> {
    let list = PyList::empty(py);
    for v in r.violations {
        let d = PyDict::new(py);
        d.set_item("rule", v.rule.as_str())?;
        d.set_item("message", v.message)?;
        d.set_item("device", v.device)?;
        d.set_item("jobs", v.jobs)?;
        d.set_item("times", v.times)?;
        list.append(d)?;
    }
    Ok((list, r.total))
}

/// Every violation of V0-V4: `([{rule, message, device, jobs, times}], total)`.
#[pyfunction]
#[pyo3(signature = (premise, starts, memory, convention, fifo, limit))]
fn validate<'py>(
    py: Python<'py>,
    premise: &Bound<'py, PyAny>,
    starts: Ro2<'py, i64>,
    memory: Option<Vec<Option<i64>>>,
    convention: &str,
    fifo: bool,
    limit: i64,
) -> PyResult<(Bound<'py, PyList>, usize)> {
    let s = schedule_from_args(premise, &starts, memory, convention, fifo, None, None, None)?;
    let limit = usize_arg(limit, "limit")?;
    let r = run_quick(py, || Ok(rules::validate(&s, limit)))?;
    report_list(py, r)
}

/// Every violation of T1-T3 for a template.
#[pyfunction]
#[pyo3(signature = (premise, period, template, memory, convention, limit))]
fn validate_template<'py>(
    py: Python<'py>,
    premise: &Bound<'py, PyAny>,
    period: i64,
    template: Vec<i64>,
    memory: Option<Vec<Option<i64>>>,
    convention: &str,
    limit: i64,
) -> PyResult<(Bound<'py, PyList>, usize)> {
    let p = premise_arg(premise)?;
    let caps: Vec<i64> = match memory {
        Some(m) => memory_caps(
            p.ndevs(),
            Some(&m.iter().map(|x| x.unwrap_or(UNLIMITED)).collect::<Vec<_>>()),
        )
        .map_err(to_pyerr)?,
        None => vec![UNLIMITED; p.ndevs()],
    };
    let conv = MemoryConvention::parse(convention).map_err(to_pyerr)?;
    let limit = usize_arg(limit, "limit")?;
    let t = Template::new(period, template);
    let r = run_quick(py, || {
        Ok(rules::validate_template(&p, &t, &caps, conv, limit))
    })?;
    report_list(py, r)
}

/// Metrics of a schedule as a dict (see `maleki_tessel::simulate::Metrics`).
#[pyfunction]
#[pyo3(signature = (premise, starts, memory, convention))]
fn metrics<'py>(
    py: Python<'py>,
    premise: &Bound<'py, PyAny>,
    starts: Ro2<'py, i64>,
    memory: Option<Vec<Option<i64>>>,
    convention: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let s = schedule_from_args(premise, &starts, memory, convention, true, None, None, None)?;
    let (nm, n) = (s.nmicros, s.premise.nblocks());
    let m = run_quick(py, || Ok(simulate::metrics(&s)))?;
    let d = PyDict::new(py);
    d.set_item("makespan", m.makespan)?;
    d.set_item("bubble_ratio", m.bubble_ratio)?;
    d.set_item("bubble_per_device", m.bubble_per_device)?;
    d.set_item("busy", m.busy)?;
    d.set_item("idle", m.idle)?;
    d.set_item("peak_memory", m.peak_memory)?;
    d.set_item("peak_memory_start", m.peak_memory_start)?;
    d.set_item("peak_memory_free_end", m.peak_memory_free_end)?;
    d.set_item("inflight", m.inflight)?;
    d.set_item("period", m.period.map(|p| (p.period, p.first, p.last)))?;
    d.set_item("critical_chain", m.critical_chain)?;
    d.set_item("slack", to_numpy(py, m.slack, &[nm, n])?)?;
    d.set_item("lower_bound", m.lower_bound)?;
    d.set_item("gap", m.gap)?;
    Ok(d)
}

/// `(times, levels)` of device `device`'s memory.
#[pyfunction]
fn memory_timeline<'py>(
    py: Python<'py>,
    premise: &Bound<'py, PyAny>,
    starts: Ro2<'py, i64>,
    device: i64,
    convention: &str,
) -> PyResult<Arrays2<'py>> {
    let s = schedule_from_args(premise, &starts, None, convention, true, None, None, None)?;
    let d = usize_arg(device, "device")?;
    if d >= s.premise.ndevs() {
        return Err(PyValueError::new_err(format!(
            "device: must be < {}, got {d}",
            s.premise.ndevs()
        )));
    }
    let (t, l) = run_quick(py, || Ok(simulate::memory_timeline(&s, d, s.convention)))?;
    let k = t.len();
    Ok((to_numpy(py, t, &[k])?, to_numpy(py, l, &[k])?))
}

/// Per-device orders of a schedule (by start).
#[pyfunction]
fn orders(premise: &Bound<'_, PyAny>, starts: Ro2<'_, i64>) -> PyResult<PyOrders> {
    let s = schedule_from_args(premise, &starts, None, "start", true, None, None, None)?;
    Ok(simulate::orders_of(&s))
}

/// ASAP timing of per-device orders. `lag` is None (keep the premise's), an int (uniform on
/// edges between different device sets) or a list (one per edge). Returns the schedule dict
/// (its premise carries the lags).
#[pyfunction]
#[pyo3(signature = (premise, nmicros, orders, lag))]
fn simulate_orders<'py>(
    py: Python<'py>,
    premise: &Bound<'py, PyAny>,
    nmicros: i64,
    orders: Vec<Vec<(i64, i64)>>,
    lag: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    let p = premise_arg(premise)?;
    let nm = usize_arg(nmicros, "nmicros")?;
    let lags = if lag.is_none() {
        Lags::Premise
    } else if let Ok(c) = lag.extract::<i64>() {
        Lags::Uniform(c)
    } else {
        Lags::PerEdge(lag.extract::<Vec<i64>>()?)
    };
    let orders = orders
        .iter()
        .map(|o| {
            o.iter()
                .map(|&(j, g)| Ok((usize_arg(j, "orders")?, usize_arg(g, "orders")?)))
                .collect::<PyResult<Vec<_>>>()
        })
        .collect::<PyResult<Vec<_>>>()?;
    let s = run_quick(py, || {
        let q = simulate::with_lags(&p, &lags)?;
        simulate::simulate(q, nm, &orders)
    })?;
    schedule_dict(py, s, None, 1)
}

/// A baseline's schedule dict.
#[pyfunction]
fn baseline<'py>(
    py: Python<'py>,
    name: String,
    premise: &Bound<'py, PyAny>,
    nmicros: i64,
) -> PyResult<Bound<'py, PyDict>> {
    let p = premise_arg(premise)?;
    let nm = usize_arg(nmicros, "nmicros")?;
    // Monitored: the list-scheduling greedy runs for seconds at the largest sizes.
    let b = run_monitored(py, None, |pr| baselines::baseline_with(&name, p, nm, pr))?;
    // The orders are not returned: the schedule's own (`Schedule.orders()`) are the same, and
    // as Python tuples they took seconds and gigabytes at the largest sizes.
    schedule_dict(py, b.schedule, Some(b.name.to_string()), b.parameter_memory)
}

/// Our JSON.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (premise, starts, memory, convention, fifo, period, template, repetend, name, parameter_memory))]
fn to_json(
    py: Python<'_>,
    premise: &Bound<'_, PyAny>,
    starts: Ro2<'_, i64>,
    memory: Option<Vec<Option<i64>>>,
    convention: &str,
    fifo: bool,
    period: Option<i64>,
    template: Option<Vec<i64>>,
    repetend: Option<(i64, i64)>,
    name: Option<String>,
    parameter_memory: i64,
) -> PyResult<String> {
    let s = schedule_from_args(
        premise, &starts, memory, convention, fifo, period, template, repetend,
    )?;
    let doc = Document {
        schedule: s,
        name,
        parameter_memory,
    };
    run_quick(py, || Ok(formats::to_json(&doc)))
}

#[pyfunction]
fn from_json<'py>(py: Python<'py>, text: String) -> PyResult<Bound<'py, PyDict>> {
    let doc = run_quick(py, || formats::from_json(&text))?;
    schedule_dict(py, doc.schedule, doc.name, doc.parameter_memory)
}

#[pyfunction]
#[pyo3(signature = (premise, starts, repetend))]
fn to_tessel_json(
    py: Python<'_>,
    premise: &Bound<'_, PyAny>,
    starts: Ro2<'_, i64>,
    repetend: Option<(i64, i64)>,
) -> PyResult<String> {
    let s = schedule_from_args(premise, &starts, None, "start", true, None, None, repetend)?;
    run_quick(py, || Ok(formats::to_tessel_json(&s)))
}

#[pyfunction]
#[pyo3(signature = (text, premise))]
fn from_tessel_json<'py>(
    py: Python<'py>,
    text: String,
    premise: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let p = premise.map(premise_arg).transpose()?;
    let s = run_quick(py, || formats::from_tessel_json(&text, p))?;
    schedule_dict(py, s, None, 1)
}

#[pyfunction]
#[pyo3(signature = (premise, starts, repetend, compact))]
fn to_text(
    py: Python<'_>,
    premise: &Bound<'_, PyAny>,
    starts: Ro2<'_, i64>,
    repetend: Option<(i64, i64)>,
    compact: bool,
) -> PyResult<String> {
    let s = schedule_from_args(premise, &starts, None, "start", true, None, None, repetend)?;
    run_quick(py, || formats::to_text(&s, compact))
}

#[pyfunction]
fn from_text<'py>(
    py: Python<'py>,
    text: String,
    premise: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    let p = premise_arg(premise)?;
    let s = run_quick(py, || formats::from_text(&text, p))?;
    schedule_dict(py, s, None, 1)
}

#[pyfunction]
fn to_csv(py: Python<'_>, premise: &Bound<'_, PyAny>, starts: Ro2<'_, i64>) -> PyResult<String> {
    let s = schedule_from_args(premise, &starts, None, "start", true, None, None, None)?;
    run_quick(py, || Ok(formats::to_csv(&s)))
}

/// Per-device orders as torch's CSV.
#[pyfunction]
fn orders_to_csv(premise: &Bound<'_, PyAny>, orders: PyOrders) -> PyResult<String> {
    let p = premise_arg(premise)?;
    simulate::check_orders(
        &p,
        orders.iter().flatten().map(|x| x.0 + 1).max().unwrap_or(0),
        &orders,
    )
    .map_err(to_pyerr)?;
    Ok(formats::orders_to_csv(&p, &orders))
}

/// `(nmicros, orders)` from torch's CSV.
#[pyfunction]
fn csv_to_orders(
    py: Python<'_>,
    text: String,
    premise: &Bound<'_, PyAny>,
) -> PyResult<(usize, PyOrders)> {
    let p = premise_arg(premise)?;
    run_quick(py, || formats::csv_to_orders(&text, &p))
}

#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (premise, starts, memory, convention, period, repetend, show_memory, show_repetend, title, width))]
fn to_svg(
    py: Python<'_>,
    premise: &Bound<'_, PyAny>,
    starts: Ro2<'_, i64>,
    memory: Option<Vec<Option<i64>>>,
    convention: &str,
    period: Option<i64>,
    repetend: Option<(i64, i64)>,
    show_memory: bool,
    show_repetend: bool,
    title: Option<String>,
    width: f64,
) -> PyResult<String> {
    let s = schedule_from_args(
        premise, &starts, memory, convention, true, period, None, repetend,
    )?;
    let o = SvgOptions {
        memory: show_memory,
        repetend: show_repetend,
        title,
        width,
    };
    run_quick(py, || svg::to_svg(&s, &o))
}

/// The title line the Gantt charts use.
#[pyfunction]
#[pyo3(signature = (premise, starts, period, title))]
fn title_line(
    premise: &Bound<'_, PyAny>,
    starts: Ro2<'_, i64>,
    period: Option<i64>,
    title: Option<String>,
) -> PyResult<String> {
    let s = schedule_from_args(premise, &starts, None, "start", true, period, None, None)?;
    Ok(svg::title_line(&s, title.as_deref()))
}

#[pyfunction]
fn canonical_baseline(name: &str) -> PyResult<&'static str> {
    baselines::canonical(name).map_err(to_pyerr)
}

/// Registers the `tessel` submodule.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPremise>()?;
    m.add("PREMISES", premises::BUILTIN.to_vec())?;
    m.add("BASELINES", baselines::BASELINES.to_vec())?;
    m.add("FORMAT", formats::FORMAT)?;
    m.add_function(wrap_pyfunction!(validate, m)?)?;
    m.add_function(wrap_pyfunction!(validate_template, m)?)?;
    m.add_function(wrap_pyfunction!(metrics, m)?)?;
    m.add_function(wrap_pyfunction!(memory_timeline, m)?)?;
    m.add_function(wrap_pyfunction!(orders, m)?)?;
    m.add_function(wrap_pyfunction!(simulate_orders, m)?)?;
    m.add_function(wrap_pyfunction!(baseline, m)?)?;
    m.add_function(wrap_pyfunction!(to_json, m)?)?;
    m.add_function(wrap_pyfunction!(from_json, m)?)?;
    m.add_function(wrap_pyfunction!(to_tessel_json, m)?)?;
    m.add_function(wrap_pyfunction!(from_tessel_json, m)?)?;
    m.add_function(wrap_pyfunction!(to_text, m)?)?;
    m.add_function(wrap_pyfunction!(from_text, m)?)?;
    m.add_function(wrap_pyfunction!(to_csv, m)?)?;
    m.add_function(wrap_pyfunction!(orders_to_csv, m)?)?;
    m.add_function(wrap_pyfunction!(csv_to_orders, m)?)?;
    m.add_function(wrap_pyfunction!(to_svg, m)?)?;
    m.add_function(wrap_pyfunction!(title_line, m)?)?;
    m.add_function(wrap_pyfunction!(canonical_baseline, m)?)?;
    Ok(())
}
