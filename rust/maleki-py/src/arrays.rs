//! numpy array helpers shared by the subsystem bindings.
//!
//! The Python wrappers pass arrays through `np.ascontiguousarray(x, dtype=...)`, so the Rust
//! side can insist on C-contiguous data of one dtype and read it as a slice without copying.
//! Results are built as `Vec`s and moved into numpy without a copy.

use std::ops::Deref;

use numpy::ndarray::{ArrayD, Dimension, Ix1, Ix2, Ix3, IxDyn};
use numpy::{
    BorrowError, Element, IntoPyArray, PyArray, PyArrayDyn, PyArrayMethods, PyReadonlyArray,
    PyReadwriteArray,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// A read-only borrow of a numpy array argument. Unlike `PyReadonlyArray` as an argument
/// (whose extraction panics), an array that another call is writing at the same time (an
/// `out=` of this call or of another thread's) gives a `ValueError`.
pub struct Ro<'py, T: Element, D: Dimension>(PyReadonlyArray<'py, T, D>);
pub type Ro1<'py, T> = Ro<'py, T, Ix1>;
pub type Ro2<'py, T> = Ro<'py, T, Ix2>;
pub type Ro3<'py, T> = Ro<'py, T, Ix3>;
pub type RoDyn<'py, T> = Ro<'py, T, IxDyn>;

impl<'py, T: Element, D: Dimension> Deref for Ro<'py, T, D> {
    type Target = PyReadonlyArray<'py, T, D>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl<'a, 'py, T: Element + 'a, D: Dimension + 'a> FromPyObject<'a, 'py> for Ro<'py, T, D> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let array = obj.cast::<PyArray<T, D>>()?;
        array
            .try_readonly()
            .map(Ro)
            .map_err(|e| borrow_error(e, "an input array"))
    }
}

/// A writable borrow of `out` for the duration of a call, or a `ValueError` (read-only
/// array, or one that is in use by this call's inputs or by another thread's call).
pub fn borrow_out<'py, T: Element, D: Dimension>(
    out: &Bound<'py, PyArray<T, D>>,
) -> PyResult<PyReadwriteArray<'py, T, D>> {
    out.try_readwrite().map_err(|e| borrow_error(e, "out"))
}

fn borrow_error(e: BorrowError, what: &str) -> PyErr {
    match e {
        BorrowError::NotWriteable => {
            PyValueError::new_err(format!("{what}: the array is read-only"))
        }
        _ => PyValueError::new_err(format!(
            "{what}: the array is in use by another call that writes it (an out= array of \
             this call or of a call running in another thread); pass a copy"
        )),
    }
}

/// The contiguous data of `a` as a slice, or a `ValueError` naming `name`.
pub fn slice<'a, T: Element, D: Dimension>(
    a: &'a PyReadonlyArray<'_, T, D>,
    name: &str,
) -> PyResult<&'a [T]> {
    a.as_slice().map_err(|_| {
        PyValueError::new_err(format!(
            "{name}: array must be C-contiguous and aligned (pass it through \
             np.require(a, requirements='CA'))"
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
