//! The one mapping from core errors to Python exceptions.
//!
//! Argument and shape errors are `ValueError`, dtype errors `TypeError`; domain errors are the
//! classes of `maleki_rs.exceptions` (defined in Python so that each can subclass both
//! `MalekiError` and the matching builtin). `Cancelled` becomes `KeyboardInterrupt` unless the
//! caller has a more precise Python exception to raise (see `progress.rs`); `OutOfMemory` is
//! `MemoryError`.

use maleki_common::Error;
use pyo3::exceptions::{
    PyKeyboardInterrupt, PyMemoryError, PyRuntimeError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

fn domain(cell: &'static PyOnceLock<Py<PyType>>, name: &str, msg: String) -> PyErr {
    Python::attach(|py| match cell.import(py, "maleki_rs.exceptions", name) {
        Ok(ty) => PyErr::from_type(ty.clone(), msg),
        // The package is always importable when _core is; fall back rather than lose the message.
        Err(_) => PyRuntimeError::new_err(msg),
    })
}

/// Converts a core error into the Python exception documented for it.
pub fn to_pyerr(e: Error) -> PyErr {
    static DEGENERATE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    static NUMERICAL: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    static CONVERGENCE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    static INFEASIBLE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    static DEADLOCK: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    let msg = e.to_string();
    match e {
        Error::InvalidArgument { .. } | Error::Shape { .. } | Error::Unsupported(_) => {
            PyValueError::new_err(msg)
        }
        Error::DType { .. } => PyTypeError::new_err(msg),
        Error::Degenerate(_) => domain(&DEGENERATE, "DegenerateGeometryError", msg),
        Error::Numerical(_) => domain(&NUMERICAL, "NumericalError", msg),
        Error::NotConverged { .. } => domain(&CONVERGENCE, "ConvergenceError", msg),
        Error::Infeasible(_) => domain(&INFEASIBLE, "InfeasibleError", msg),
        Error::Deadlock(_) => domain(&DEADLOCK, "DeadlockError", msg),
        Error::Cancelled => PyKeyboardInterrupt::new_err("cancelled"),
        Error::OutOfMemory { .. } => PyMemoryError::new_err(msg),
    }
}
