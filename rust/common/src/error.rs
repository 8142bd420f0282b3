//! The error type shared by all cores.
//!
//! The Python bindings map each variant exactly once (see `rust/maleki-py/src/errors.rs`):
//! argument and shape errors become `ValueError`, dtype errors `TypeError`, and the domain
//! variants become the exceptions of `maleki_rs.exceptions`; a failed allocation is
//! `MemoryError`.

use std::fmt;

/// Result alias used by every core crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Every failure a core can report. User input must never cause a panic: it gives one of these.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// An argument is out of range or otherwise invalid (`ValueError`).
    #[error("{name}: {msg}")]
    InvalidArgument { name: String, msg: String },
    /// An array has the wrong shape (`ValueError`).
    #[error("{name}: expected shape {expected}, got {got}")]
    Shape {
        name: String,
        expected: String,
        got: String,
    },
    /// An array has the wrong element type (`TypeError`).
    #[error("{name}: expected dtype {expected}, got {got}")]
    DType {
        name: String,
        expected: String,
        got: String,
    },
    /// The problem is geometrically degenerate: the unknowns are not observable from the data
    /// (`maleki_rs.exceptions.DegenerateGeometryError`, a `ValueError`).
    #[error("degenerate geometry: {0}")]
    Degenerate(String),
    /// A numerical failure that is not the caller's fault in an obvious way, e.g. a matrix
    /// that should be positive definite is not (`maleki_rs.exceptions.NumericalError`).
    #[error("numerical failure: {0}")]
    Numerical(String),
    /// An iterative method stopped at its iteration limit (`ConvergenceError`).
    #[error("did not converge within {iters} iterations")]
    NotConverged { iters: usize },
    /// The constraints admit no solution, e.g. a memory cap below what any schedule needs
    /// (`maleki_rs.exceptions.InfeasibleError`, a `ValueError`).
    #[error("infeasible: {0}")]
    Infeasible(String),
    /// A set of per-resource orders that can never all make progress (`DeadlockError`).
    #[error("deadlock: {0}")]
    Deadlock(String),
    /// The operation is not available here, e.g. a SIMD backend on a CPU without it
    /// (`ValueError`).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The caller asked to stop (progress callback, Ctrl-C). Becomes `KeyboardInterrupt`
    /// or the exception raised by the progress callback.
    #[error("cancelled")]
    Cancelled,
    /// An allocation failed: the buffer named `what` needed `bytes` bytes (`MemoryError`).
    #[error("out of memory: could not allocate {bytes} bytes for {what}")]
    OutOfMemory { what: String, bytes: usize },
}

impl Error {
    /// `InvalidArgument` with a named argument.
    pub fn invalid(name: impl Into<String>, msg: impl fmt::Display) -> Self {
        Error::InvalidArgument {
            name: name.into(),
            msg: msg.to_string(),
        }
    }

    /// `Shape` error; `expected` and `got` are printed as given (e.g. `"(N, 3)"`).
    pub fn shape(
        name: impl Into<String>,
        expected: impl fmt::Display,
        got: impl fmt::Display,
    ) -> Self {
        Error::Shape {
            name: name.into(),
            expected: expected.to_string(),
            got: got.to_string(),
        }
    }
}

/// Checks that every value of `xs` is finite; names the argument and the first bad index.
pub fn check_finite(name: &str, xs: &[f64]) -> Result<()> {
    match xs.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(i) => Err(Error::invalid(
            name,
            format!("contains a non-finite value ({}) at flat index {i}", xs[i]),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_argument() {
        let e = Error::invalid("tol", "must be positive, got -1");
        assert_eq!(e.to_string(), "tol: must be positive, got -1");
        let e = Error::shape("b", "(N, 3)", "(4, 2)");
        assert_eq!(e.to_string(), "b: expected shape (N, 3), got (4, 2)");
        assert_eq!(
            Error::NotConverged { iters: 7 }.to_string(),
            "did not converge within 7 iterations"
        );
    }

    #[test]
    fn finite_check_names_first_bad_index() {
        assert!(check_finite("x", &[1.0, 2.0]).is_ok());
        let e = check_finite("x", &[1.0, f64::NAN, f64::INFINITY]).unwrap_err();
        assert!(e.to_string().contains("flat index 1"), "{e}");
    }
}
