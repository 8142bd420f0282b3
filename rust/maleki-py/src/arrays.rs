//! numpy array helpers shared by the subsystem bindings.
//!
//! The Python wrappers pass arrays through `np.ascontiguousarray(x, dtype=...)`, so the Rust
//! side can insist on C-contiguous data of one dtype and read it as a slice without copying.
//! Results are built as `Vec`s and moved into numpy without a copy.

use numpy::ndarray::{ArrayD, Dimension, IxDyn};
use numpy::{Element, IntoPyArray, PyArrayDyn, PyReadonlyArray};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// The contiguous data of `a` as a slice, or a `ValueError` naming `name`.
pub fn slice<'a, T: Element, D: Dimension>(
    a: &'a PyReadonlyArray<'_, T, D>,
    name: &str,
) -> PyResult<&'a [T]> {
    a.as_slice().map_err(|_| {
        PyValueError::new_err(format!(
            "{name}: array must be C-contiguous (pass it through np.ascontiguousarray)"
        ))
    })
}

/// Moves `data` into a new numpy array of the given shape (no copy).
pub fn to_numpy<'py, T: Element>(
    py: Python<'py>,
    data: Vec<T>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
    let arr = ArrayD::from_shape_vec(IxDyn(shape), data)
        .map_err(|e| PyValueError::new_err(format!("internal shape error: {e}")))?;
    Ok(arr.into_pyarray(py))
}
