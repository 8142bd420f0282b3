//! `maleki_rs._core.pose`: bindings of the TLS pose estimator (`maleki-pose`).
//!
//! The public API is `maleki_rs.pose` (Python), which normalises every input into the one
//! canonical batch form these functions take: concatenated `(T, 3)` point arrays plus
//! `offsets (B+1,)`, and each per-point array tagged with a mode: `"concat"` (rows follow
//! the offsets), `"map"` (one row per point of a scan, shared by all scans) or `"shared"`
//! (one matrix for every point). Per-scan failures come back as status codes and messages
//! (0 ok, 1 not converged, 2 degenerate/numerical, 3 bad input) unless the caller asks for
//! the first one to be raised.

use maleki_common::progress::NoProgress;
use maleki_common::Error;
use maleki_pose::{
    BatchBlock, BatchCov, BatchRef, Init, Options, PerScan, PoseEstimate, ScanRef, Workspace,
};
use nalgebra::{Matrix3, Vector3};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::arrays::{slice, to_numpy, RoDyn};
use crate::errors::to_pyerr;
use crate::progress::{run_monitored, run_quick};

type Arr<'py> = RoDyn<'py, f64>;
type Array<'py> = Bound<'py, numpy::PyArrayDyn<f64>>;

/// Batches with fewer points than this run without the progress watcher (its 100 ms polling
/// thread costs more than the work).
const MONITOR_MIN_POINTS: usize = 200_000;

fn chunks<'a, const K: usize>(a: &'a Arr<'_>, name: &str) -> PyResult<&'a [[f64; K]]> {
    let s = slice(a, name)?;
    let (rows, rest) = s.as_chunks::<K>();
    if !rest.is_empty() {
        return Err(PyValueError::new_err(format!(
            "{name}: size {} is not a multiple of {K}",
            s.len()
        )));
    }
    Ok(rows)
}

fn per_scan<'a, const K: usize>(
    a: &'a Arr<'_>,
    mode: &str,
    name: &str,
) -> PyResult<PerScan<'a, [f64; K]>> {
    let rows = chunks::<K>(a, name)?;
    match mode {
        "concat" => Ok(PerScan::Concat(rows)),
        "map" => Ok(PerScan::Map(rows)),
        _ => Err(PyValueError::new_err(format!(
            "{name}: unknown layout {mode:?}"
        ))),
    }
}

fn block<'a>(spec: &'a Option<(Arr<'_>, String)>, name: &str) -> PyResult<Option<BatchBlock<'a>>> {
    let Some((a, mode)) = spec else {
        return Ok(None);
    };
    if mode == "shared" {
        let rows = chunks::<9>(a, name)?;
        return match rows {
            [m] => Ok(Some(BatchBlock::Shared(m))),
            _ => Err(PyValueError::new_err(format!(
                "{name}: a shared block must be one 3x3 matrix"
            ))),
        };
    }
    Ok(Some(BatchBlock::PerPoint(per_scan::<9>(a, mode, name)?)))
}

/// The noise model from the canonical arguments.
#[allow(clippy::too_many_arguments)]
fn batch_cov<'a>(
    cov: &'a Option<(Arr<'_>, String)>,
    cov_b: &'a Option<(Arr<'_>, String)>,
    cov_br: &'a Option<(Arr<'_>, String)>,
    cov_r: &'a Option<(Arr<'_>, String)>,
    sigma_b: Option<f64>,
    sigma_r: Option<f64>,
) -> PyResult<BatchCov<'a>> {
    if let Some((a, mode)) = cov {
        if mode == "shared" {
            let rows = chunks::<36>(a, "cov")?;
            return match rows {
                [m] => Ok(BatchCov::SharedFull(m)),
                _ => Err(PyValueError::new_err(
                    "cov: a shared covariance must be one 6x6 matrix",
                )),
            };
        }
        return Ok(BatchCov::Full(per_scan::<36>(a, mode, "cov")?));
    }
    if cov_b.is_none() && cov_br.is_none() && cov_r.is_none() {
        return Ok(BatchCov::Isotropic {
            sigma_b: sigma_b.unwrap_or(0.0),
            sigma_r: sigma_r.unwrap_or(0.0),
        });
    }
    Ok(BatchCov::Blocks {
        bb: block(cov_b, "cov_b")?,
        br: block(cov_br, "cov_br")?,
        rr: block(cov_r, "cov_r")?,
    })
}

fn offsets_of(o: &RoDyn<'_, u64>) -> PyResult<Vec<usize>> {
    let s = slice(o, "offsets")?;
    s.iter()
        .map(|&v| usize::try_from(v).map_err(|_| PyValueError::new_err("offsets: value too large")))
        .collect()
}

fn weights_of<'a>(w: &'a Option<(Arr<'_>, String)>) -> PyResult<Option<PerScan<'a, f64>>> {
    let Some((a, mode)) = w else { return Ok(None) };
    let s = slice(a, "weights")?;
    match mode.as_str() {
        "concat" => Ok(Some(PerScan::Concat(s))),
        "map" => Ok(Some(PerScan::Map(s))),
        _ => Err(PyValueError::new_err(format!(
            "weights: unknown layout {mode:?}"
        ))),
    }
}

/// Status code of a per-scan outcome.
fn status_of(e: &Error) -> i8 {
    match e {
        Error::NotConverged { .. } => 1,
        Error::Degenerate(_) | Error::Numerical(_) => 2,
        _ => 3,
    }
}

/// The same error, its message prefixed with the scan index (batches only).
fn in_scan(e: Error, k: usize, batch: bool) -> Error {
    if !batch {
        return e;
    }
    match e {
        Error::InvalidArgument { name, msg } => Error::InvalidArgument {
            name: format!("scan {k}: {name}"),
            msg,
        },
        Error::Degenerate(m) => Error::Degenerate(format!("scan {k}: {m}")),
        Error::Numerical(m) => Error::Numerical(format!("scan {k}: {m}")),
        Error::NotConverged { iters } => Error::Numerical(format!(
            "scan {k}: did not converge within {iters} iterations"
        )),
        other => other,
    }
}

fn raise_first(mut errors: impl Iterator<Item = (usize, Error)>, batch: bool) -> PyResult<()> {
    let Some((k, e)) = errors.next() else {
        return Ok(());
    };
    if let Error::NotConverged { iters } = e {
        let err = to_pyerr(Error::NotConverged { iters });
        if !batch {
            return Err(err);
        }
        // Same exception class, with the scan index in the message.
        return Err(Python::attach(|py| {
            PyErr::from_type(
                err.get_type(py),
                format!("scan {k}: did not converge within {iters} iterations"),
            )
        }));
    }
    Err(to_pyerr(in_scan(e, k, batch)))
}

/// Runs a per-scan batch job, with the progress watcher (Ctrl-C, callback) when the batch is
/// large or a callback is given.
fn run_batch<T: Send>(
    py: Python<'_>,
    total_points: usize,
    n_scans: usize,
    progress: Option<Py<PyAny>>,
    job: impl Fn(&dyn maleki_common::Progress) -> maleki_common::Result<T> + Send + Sync,
) -> PyResult<T> {
    if progress.is_none() && (total_points < MONITOR_MIN_POINTS || n_scans <= 1) {
        if n_scans <= 1 {
            // One scan: no parallel work, so skip the hand-off to the pool.
            return py.detach(|| job(&NoProgress)).map_err(to_pyerr);
        }
        return run_quick(py, || job(&NoProgress));
    }
    run_monitored(py, progress, job)
}

/// Solves a batch of scans (see the module docs for the canonical layout).
#[pyfunction]
#[pyo3(signature = (offsets, b, r, r_mode, *, cov=None, cov_b=None, cov_br=None, cov_r=None, sigma_b=None,
    sigma_r=None, weights=None, max_iter=100, tol=1e-10, rotation0=None, translation0=None,
    compute_covariance=true, variable_projection=false, strict=false, raise_errors=false, progress=None))]
#[allow(clippy::too_many_arguments)]
fn solve_batch<'py>(
    py: Python<'py>,
    offsets: RoDyn<'py, u64>,
    b: Arr<'py>,
    r: Arr<'py>,
    r_mode: &str,
    cov: Option<(Arr<'py>, String)>,
    cov_b: Option<(Arr<'py>, String)>,
    cov_br: Option<(Arr<'py>, String)>,
    cov_r: Option<(Arr<'py>, String)>,
    sigma_b: Option<f64>,
    sigma_r: Option<f64>,
    weights: Option<(Arr<'py>, String)>,
    max_iter: usize,
    tol: f64,
    rotation0: Option<Arr<'py>>,
    translation0: Option<Arr<'py>>,
    compute_covariance: bool,
    variable_projection: bool,
    strict: bool,
    raise_errors: bool,
    progress: Option<Py<PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let offsets = offsets_of(&offsets)?;
    let b_rows = chunks::<3>(&b, "b")?;
    let batch = BatchRef {
        offsets: &offsets,
        b: b_rows,
        r: per_scan::<3>(&r, r_mode, "r")?,
        cov: batch_cov(&cov, &cov_b, &cov_br, &cov_r, sigma_b, sigma_r)?,
        weights: weights_of(&weights)?,
    };
    let init = match rotation0 {
        None => Init::Horn,
        Some(a) => {
            let m = chunks::<9>(&a, "rotation0")?;
            let [m] = m else {
                return Err(PyValueError::new_err("rotation0: expected one 3x3 matrix"));
            };
            let t = match &translation0 {
                None => None,
                Some(t) => match chunks::<3>(t, "translation0")? {
                    [v] => Some(Vector3::from(*v)),
                    _ => return Err(PyValueError::new_err("translation0: expected one 3-vector")),
                },
            };
            Init::Given {
                rotation: Matrix3::from_row_slice(m),
                translation: t,
            }
        }
    };
    // Run unstrict: non-converged scans keep their estimate; `strict` is applied below.
    let opts = Options {
        max_iter,
        tol,
        init,
        compute_covariance,
        variable_projection,
        strict: false,
    };
    let nb = batch.len();
    let results = if nb == 1 {
        batch.check_offsets().map_err(to_pyerr)?;
        opts.validate().map_err(to_pyerr)?;
        let single = run_batch(py, b_rows.len(), 1, progress, |_| {
            Ok(batch
                .scan(0)
                .and_then(|s| maleki_pose::solve_with(&s, &opts, &mut Workspace::default())))
        })?;
        vec![single]
    } else {
        run_batch(py, b_rows.len(), nb, progress, |p| {
            maleki_pose::solve_batch(&batch, &opts, p)
        })?
    };
    if raise_errors || strict {
        let errs = results.iter().enumerate().filter_map(|(k, res)| match res {
            Err(e) => Some((k, e.clone())),
            Ok(est) if strict && !est.converged => Some((
                k,
                Error::NotConverged {
                    iters: est.iterations,
                },
            )),
            Ok(_) => None,
        });
        raise_first(errs, nb != 1)?;
    }
    estimates_to_dict(py, &results)
}

fn estimates_to_dict<'py>(
    py: Python<'py>,
    results: &[maleki_common::Result<PoseEstimate>],
) -> PyResult<Bound<'py, PyDict>> {
    let nb = results.len();
    let mut rot = Vec::with_capacity(nb * 9);
    let mut quat = Vec::with_capacity(nb * 4);
    let mut trans = Vec::with_capacity(nb * 3);
    let mut pos = Vec::with_capacity(nb * 3);
    let mut covs = Vec::with_capacity(nb * 36);
    let mut cost = Vec::with_capacity(nb);
    let mut dof = Vec::with_capacity(nb);
    let mut iters = Vec::with_capacity(nb);
    let mut conv = Vec::with_capacity(nb);
    let mut status = Vec::with_capacity(nb);
    let mut messages: Vec<String> = Vec::with_capacity(nb);
    for res in results {
        match res {
            Ok(e) => {
                for i in 0..3 {
                    for j in 0..3 {
                        rot.push(e.rotation[(i, j)]);
                    }
                }
                quat.extend_from_slice(&e.quaternion());
                trans.extend(e.translation.iter());
                pos.extend(e.position().iter());
                for i in 0..6 {
                    for j in 0..6 {
                        covs.push(e.covariance[(i, j)]);
                    }
                }
                cost.push(e.cost);
                dof.push(e.dof() as i64);
                iters.push(e.iterations as i64);
                conv.push(e.converged);
                status.push(if e.converged { 0i8 } else { 1 });
                messages.push(if e.converged {
                    String::new()
                } else {
                    format!("did not converge within {} iterations", e.iterations)
                });
            }
            Err(err) => {
                rot.extend([f64::NAN; 9]);
                quat.extend([f64::NAN; 4]);
                trans.extend([f64::NAN; 3]);
                pos.extend([f64::NAN; 3]);
                covs.extend([f64::NAN; 36]);
                cost.push(f64::NAN);
                dof.push(-1);
                iters.push(0);
                conv.push(false);
                status.push(status_of(err));
                messages.push(err.to_string());
            }
        }
    }
    let d = PyDict::new(py);
    d.set_item("rotation", to_numpy(py, rot, &[nb, 3, 3])?)?;
    d.set_item("quaternion", to_numpy(py, quat, &[nb, 4])?)?;
    d.set_item("translation", to_numpy(py, trans, &[nb, 3])?)?;
    d.set_item("position", to_numpy(py, pos, &[nb, 3])?)?;
    d.set_item("covariance", to_numpy(py, covs, &[nb, 6, 6])?)?;
    d.set_item("cost", to_numpy(py, cost, &[nb])?)?;
    d.set_item("dof", to_numpy(py, dof, &[nb])?)?;
    d.set_item("iterations", to_numpy(py, iters, &[nb])?)?;
    d.set_item("converged", to_numpy(py, conv, &[nb])?)?;
    d.set_item("status", to_numpy(py, status, &[nb])?)?;
    d.set_item("messages", messages)?;
    Ok(d)
}

/// Weighted Kabsch/Horn for a batch: returns rotation (B,3,3), translation (B,3), status,
/// messages.
#[pyfunction]
#[pyo3(signature = (offsets, b, r, r_mode, weights=None, raise_errors=false, progress=None))]
#[allow(clippy::too_many_arguments)]
fn absolute_orientation_batch<'py>(
    py: Python<'py>,
    offsets: RoDyn<'py, u64>,
    b: Arr<'py>,
    r: Arr<'py>,
    r_mode: &str,
    weights: Option<(Arr<'py>, String)>,
    raise_errors: bool,
    progress: Option<Py<PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let offsets = offsets_of(&offsets)?;
    let b_rows = chunks::<3>(&b, "b")?;
    let r = per_scan::<3>(&r, r_mode, "r")?;
    let w = weights_of(&weights)?;
    let nb = offsets.len().saturating_sub(1);
    let results = run_batch(py, b_rows.len(), nb, progress, |p| {
        maleki_pose::absolute_orientation_batch(&offsets, b_rows, r, w, p)
    })?;
    if raise_errors {
        raise_first(
            results
                .iter()
                .enumerate()
                .filter_map(|(k, r)| r.as_ref().err().map(|e| (k, e.clone()))),
            nb != 1,
        )?;
    }
    let mut rot = Vec::with_capacity(nb * 9);
    let mut trans = Vec::with_capacity(nb * 3);
    let mut status = Vec::with_capacity(nb);
    let mut messages = Vec::with_capacity(nb);
    for res in &results {
        match res {
            Ok((a, t)) => {
                for i in 0..3 {
                    for j in 0..3 {
                        rot.push(a[(i, j)]);
                    }
                }
                trans.extend(t.iter());
                status.push(0i8);
                messages.push(String::new());
            }
            Err(e) => {
                rot.extend([f64::NAN; 9]);
                trans.extend([f64::NAN; 3]);
                status.push(status_of(e));
                messages.push(e.to_string());
            }
        }
    }
    let d = PyDict::new(py);
    d.set_item("rotation", to_numpy(py, rot, &[nb, 3, 3])?)?;
    d.set_item("translation", to_numpy(py, trans, &[nb, 3])?)?;
    d.set_item("status", to_numpy(py, status, &[nb])?)?;
    d.set_item("messages", messages)?;
    Ok(d)
}

/// The CRLB of each scan at its true rotation and reference points; raises on the first bad
/// scan.
#[pyfunction]
#[pyo3(signature = (offsets, r, r_mode, rotation, *, cov=None, cov_b=None, cov_br=None, cov_r=None,
    sigma_b=None, sigma_r=None, weights=None, progress=None))]
#[allow(clippy::too_many_arguments)]
fn crlb_batch<'py>(
    py: Python<'py>,
    offsets: RoDyn<'py, u64>,
    r: Arr<'py>,
    r_mode: &str,
    rotation: Arr<'py>,
    cov: Option<(Arr<'py>, String)>,
    cov_b: Option<(Arr<'py>, String)>,
    cov_br: Option<(Arr<'py>, String)>,
    cov_r: Option<(Arr<'py>, String)>,
    sigma_b: Option<f64>,
    sigma_r: Option<f64>,
    weights: Option<(Arr<'py>, String)>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Bound<'py, numpy::PyArrayDyn<f64>>> {
    let offsets = offsets_of(&offsets)?;
    let r = per_scan::<3>(&r, r_mode, "r_true")?;
    let covm = batch_cov(&cov, &cov_b, &cov_br, &cov_r, sigma_b, sigma_r)?;
    let w = weights_of(&weights)?;
    let rots = chunks::<9>(&rotation, "rotation")?;
    let nb = offsets.len().saturating_sub(1);
    let total = offsets.last().copied().unwrap_or(0);
    let results = run_batch(py, total, nb, progress, |p| {
        maleki_pose::crlb_batch(&offsets, r, covm, w, rots, p)
    })?;
    raise_first(
        results
            .iter()
            .enumerate()
            .filter_map(|(k, r)| r.as_ref().err().map(|e| (k, e.clone()))),
        nb != 1,
    )?;
    let mut out = Vec::with_capacity(nb * 36);
    for m in results.into_iter().flatten() {
        for i in 0..6 {
            for j in 0..6 {
                out.push(m[(i, j)]);
            }
        }
    }
    to_numpy(py, out, &[nb, 6, 6])
}

/// Cost `J`, gradient `[g_θ; g_t]` and Gauss-Newton normal matrix `F` of one scan at
/// `(rotation, translation)` (for tests).
#[pyfunction]
#[pyo3(signature = (b, r, rotation, translation, *, cov=None, cov_b=None, cov_br=None, cov_r=None,
    sigma_b=None, sigma_r=None, weights=None))]
#[allow(clippy::too_many_arguments)]
fn evaluate<'py>(
    py: Python<'py>,
    b: Arr<'py>,
    r: Arr<'py>,
    rotation: Arr<'py>,
    translation: Arr<'py>,
    cov: Option<(Arr<'py>, String)>,
    cov_b: Option<(Arr<'py>, String)>,
    cov_br: Option<(Arr<'py>, String)>,
    cov_r: Option<(Arr<'py>, String)>,
    sigma_b: Option<f64>,
    sigma_r: Option<f64>,
    weights: Option<(Arr<'py>, String)>,
) -> PyResult<(f64, Array<'py>, Array<'py>)> {
    let b_rows = chunks::<3>(&b, "b")?;
    let n = b_rows.len();
    let offsets = [0, n];
    let batch = BatchRef {
        offsets: &offsets,
        b: b_rows,
        r: per_scan::<3>(&r, "concat", "r")?,
        cov: batch_cov(&cov, &cov_b, &cov_br, &cov_r, sigma_b, sigma_r)?,
        weights: weights_of(&weights)?,
    };
    batch.check_offsets().map_err(to_pyerr)?;
    let scan: ScanRef<'_> = batch.scan(0).map_err(to_pyerr)?;
    let rot = match chunks::<9>(&rotation, "rotation")? {
        [m] => Matrix3::from_row_slice(m),
        _ => return Err(PyValueError::new_err("rotation: expected one 3x3 matrix")),
    };
    let t = match chunks::<3>(&translation, "translation")? {
        [v] => Vector3::from(*v),
        _ => return Err(PyValueError::new_err("translation: expected one 3-vector")),
    };
    let ev = py
        .detach(|| maleki_pose::evaluate_scan(&scan, &rot, &t))
        .map_err(to_pyerr)?;
    let g: Vec<f64> = ev.gradient.iter().copied().collect();
    let mut f = Vec::with_capacity(36);
    for i in 0..6 {
        for j in 0..6 {
            f.push(ev.normal[(i, j)]);
        }
    }
    Ok((ev.cost, to_numpy(py, g, &[6])?, to_numpy(py, f, &[6, 6])?))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(solve_batch, m)?)?;
    m.add_function(wrap_pyfunction!(absolute_orientation_batch, m)?)?;
    m.add_function(wrap_pyfunction!(crlb_batch, m)?)?;
    m.add_function(wrap_pyfunction!(evaluate, m)?)?;
    Ok(())
}
