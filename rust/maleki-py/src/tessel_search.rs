//! `maleki_rs._core.tessel` (search half): the schedule search, the exact solver and the
//! repetend construction, added to the `tessel` submodule by [`register`].
//!
//! Arguments arrive validated by `maleki_rs.tessel.search`; the core re-checks them and every
//! call runs with the GIL released on the library pool, reporting progress and stopping on
//! Ctrl-C or when the progress callback raises (`run_monitored`).

use std::time::{Duration, Instant};

use maleki_tessel::complete::Method;
use maleki_tessel::exact::{self as core_exact, ExactOptions};
use maleki_tessel::model::{memory_caps, MemoryConvention, Schedule, UNLIMITED};
use maleki_tessel::repetend::{self, RepetendOptions};
use maleki_tessel::search::{self as core_search, SearchOptions};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::errors::to_pyerr;
use crate::progress::run_monitored;
use crate::tessel::{premise_arg, schedule_dict};

fn caps(ndevs: usize, memory: Option<Vec<Option<i64>>>) -> PyResult<Vec<i64>> {
    match memory {
        None => Ok(vec![UNLIMITED; ndevs]),
        Some(m) => {
            let v: Vec<i64> = m.iter().map(|x| x.unwrap_or(UNLIMITED)).collect();
            memory_caps(ndevs, Some(&v)).map_err(to_pyerr)
        }
    }
}

fn deadline(time_limit: Option<f64>) -> PyResult<Option<Instant>> {
    match time_limit {
        None => Ok(None),
        Some(t) if t.is_finite() && t > 0.0 && t < 1e9 => {
            Ok(Some(Instant::now() + Duration::from_secs_f64(t)))
        }
        Some(t) => Err(PyValueError::new_err(format!(
            "time_limit: must be a positive number of seconds, got {t}"
        ))),
    }
}

fn usize_arg(v: i64, name: &str) -> PyResult<usize> {
    usize::try_from(v).map_err(|_| PyValueError::new_err(format!("{name}: must be >= 0, got {v}")))
}

fn u64_arg(v: i64, name: &str) -> PyResult<u64> {
    u64::try_from(v).map_err(|_| PyValueError::new_err(format!("{name}: must be >= 0, got {v}")))
}

/// The whole search: a dict with `period`, `periodic_k`, `template`, `proved_optimal`,
/// `makespan_optimal`, `method`, `candidates`, `nodes`, `search_time` and `schedule` (the
/// fields of a `Schedule`).
#[pyfunction(name = "search")]
#[pyo3(signature = (premise, memory, nmicros, convention, delta_p, periodic_k, time_limit, node_budget, ramp_budget, transplant_budget, concat_budget, exact_jobs, progress=None))]
#[allow(clippy::too_many_arguments)]
fn search_py<'py>(
    py: Python<'py>,
    premise: &Bound<'py, PyAny>,
    memory: Option<Vec<Option<i64>>>,
    nmicros: i64,
    convention: &str,
    delta_p: i64,
    periodic_k: i64,
    time_limit: Option<f64>,
    node_budget: i64,
    ramp_budget: i64,
    transplant_budget: i64,
    concat_budget: i64,
    exact_jobs: i64,
    progress: Option<Py<PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let p = premise_arg(premise)?;
    let mut o = SearchOptions::new(caps(p.ndevs(), memory)?, usize_arg(nmicros, "nmicros")?);
    o.convention = MemoryConvention::parse(convention).map_err(to_pyerr)?;
    o.delta_p = delta_p;
    o.periodic_k = usize_arg(periodic_k, "periodic_k")?;
    deadline(time_limit)?;
    o.time_limit = time_limit;
    o.node_budget = u64_arg(node_budget, "node_budget")?;
    o.ramp_budget = u64_arg(ramp_budget, "ramp_budget")?;
    o.transplant_budget = u64_arg(transplant_budget, "transplant_budget")?;
    o.concat_budget = u64_arg(concat_budget, "concat_budget")?;
    o.exact_jobs = usize_arg(exact_jobs, "exact_jobs")?;
    let pc = p.clone();
    let r = run_monitored(py, progress, move |pr| core_search::search(&pc, &o, pr))?;
    let d = PyDict::new(py);
    d.set_item("period", r.period)?;
    d.set_item("periodic_k", r.periodic_k)?;
    d.set_item("template", r.template.starts.clone())?;
    d.set_item("proved_optimal", r.proved_optimal)?;
    d.set_item("makespan_optimal", r.makespan_optimal)?;
    d.set_item("method", r.method.as_str())?;
    let cands = PyList::empty(py);
    for c in &r.candidates {
        cands.append((c.period, c.length, c.makespan, c.method.as_str()))?;
    }
    d.set_item("candidates", cands)?;
    d.set_item("nodes", r.nodes)?;
    d.set_item("search_time", r.search_time)?;
    // A schedule taken from a baseline is named after it.
    let name = match r.method {
        Method::Baseline(b) => b,
        _ => "tessel",
    };
    d.set_item(
        "schedule",
        schedule_dict(py, r.schedule, Some(name.into()), 1)?,
    )?;
    Ok(d)
}

/// The exact solver (FIFO on): a dict with `schedule`, `makespan`, `proved_optimal`,
/// `nodes`; `schedule` is None when the budget ran out before any schedule was found.
#[pyfunction(name = "exact")]
#[pyo3(signature = (premise, nmicros, memory, convention, time_limit, node_budget, progress=None))]
#[allow(clippy::too_many_arguments)]
fn exact_py<'py>(
    py: Python<'py>,
    premise: &Bound<'py, PyAny>,
    nmicros: i64,
    memory: Option<Vec<Option<i64>>>,
    convention: &str,
    time_limit: Option<f64>,
    node_budget: i64,
    progress: Option<Py<PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let p = premise_arg(premise)?;
    let nm = usize_arg(nmicros, "nmicros")?;
    let caps = caps(p.ndevs(), memory)?;
    let conv = MemoryConvention::parse(convention).map_err(to_pyerr)?;
    let opts = ExactOptions {
        node_budget: u64_arg(node_budget, "node_budget")?,
        deadline: deadline(time_limit)?,
        ..Default::default()
    };
    let t0 = Instant::now();
    let (pc, cc) = (p.clone(), caps.clone());
    // Seed the bound with the periodic search (fast, valid, usually close).
    let r = run_monitored(py, progress, move |pr| {
        let mut so = SearchOptions::new(cc.clone(), nm);
        so.convention = conv;
        so.exact_jobs = 0;
        // The seed gets a quarter of the time (5 s without a deadline): the rest is the exact
        // search's, which the seed only helps prune.
        so.time_limit = Some(opts.deadline.map_or(SEED_SECONDS, |d| {
            (d.saturating_duration_since(Instant::now()).as_secs_f64() / 4.0).max(1e-3)
        }));
        let seed = match core_search::search(&pc, &so, pr) {
            Ok(s) => Some(s.schedule.starts),
            Err(maleki_common::Error::Cancelled) => return Err(maleki_common::Error::Cancelled),
            Err(_) => None,
        };
        core_exact::solve(&pc, nm, &cc, conv, seed, &opts, pr)
    })?;
    let d = PyDict::new(py);
    match r {
        Some(r) => {
            let mut s = Schedule::new(p.clone(), nm, r.starts).map_err(to_pyerr)?;
            s.memory = caps;
            s.convention = conv;
            d.set_item("schedule", schedule_dict(py, s, Some("exact".into()), 1)?)?;
            d.set_item("makespan", r.makespan)?;
            d.set_item("proved_optimal", r.proved_optimal)?;
            d.set_item("nodes", r.nodes)?;
        }
        None => {
            d.set_item("schedule", py.None())?;
            d.set_item("makespan", py.None())?;
            d.set_item("proved_optimal", false)?;
            d.set_item("nodes", 0)?;
        }
    }
    d.set_item("search_time", t0.elapsed().as_secs_f64())?;
    Ok(d)
}

/// Longest seeding search of `exact` without a deadline, in seconds.
const SEED_SECONDS: f64 = 5.0;

/// Repetend construction alone: `(min_period, min_period_proved, [(period, length,
/// template, first_template, exhausted, nodes)])`.
#[pyfunction]
#[pyo3(signature = (premise, memory, convention, delta_p, time_limit, node_budget, progress=None))]
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn repetends(
    py: Python<'_>,
    premise: &Bound<'_, PyAny>,
    memory: Option<Vec<Option<i64>>>,
    convention: &str,
    delta_p: i64,
    time_limit: Option<f64>,
    node_budget: i64,
    progress: Option<Py<PyAny>>,
) -> PyResult<(
    Option<i64>,
    bool,
    Vec<(i64, i64, Vec<i64>, Option<Vec<i64>>, bool, u64)>,
)> {
    let p = premise_arg(premise)?;
    let mut o = RepetendOptions::new(caps(p.ndevs(), memory)?);
    o.convention = MemoryConvention::parse(convention).map_err(to_pyerr)?;
    o.delta_p = delta_p;
    o.node_budget = u64_arg(node_budget, "node_budget")?;
    o.deadline = deadline(time_limit)?;
    let pc = p.clone();
    let r = run_monitored(py, progress, move |pr| repetend::construct(&pc, &o, pr))?;
    let rows = r
        .periods
        .iter()
        .filter_map(|o| {
            let b = o.best.as_ref()?;
            Some((
                o.period,
                b.length(&p),
                b.starts.clone(),
                o.first.as_ref().map(|t| t.starts.clone()),
                o.exhausted,
                o.nodes,
            ))
        })
        .collect();
    Ok((r.min_period, r.min_period_proved, rows))
}

/// Adds the search functions to the `tessel` submodule.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(search_py, m)?)?;
    m.add_function(wrap_pyfunction!(exact_py, m)?)?;
    m.add_function(wrap_pyfunction!(repetends, m)?)?;
    Ok(())
}
