//! Running a core with progress, Ctrl-C and the GIL released.
//!
//! `run_monitored` releases the GIL, runs the job on the library pool and, from the calling
//! thread, every 100 ms: checks for Ctrl-C (`py.check_signals()`, which only works on the
//! main thread, hence the calling thread watches rather than the workers) and calls the
//! optional Python callback with `(done, total)`. An exception from either asks the core to
//! stop; the core returns `Cancelled` and that exception is re-raised as is.

use std::ops::ControlFlow;
use std::time::Duration;

use maleki_common::pool;
use maleki_common::progress::Progress;
use pyo3::prelude::*;

use crate::errors::to_pyerr;

const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Runs `job` with the GIL released on the library pool; no progress, no cancellation.
/// For calls that are short by construction.
///
/// A Ctrl-C that arrived meanwhile is raised here, before the caller converts the result:
/// left pending, it would surface inside the first Python call of that conversion (numpy's
/// API lookup, which then panics instead of raising).
pub fn run_quick<T: Send>(
    py: Python<'_>,
    job: impl FnOnce() -> maleki_common::Result<T> + Send,
) -> PyResult<T> {
    let out = py.detach(|| pool::install(job)).map_err(to_pyerr);
    py.check_signals()?;
    out
}

/// Runs `job` with the GIL released, reporting to `callback(done, total)` (when given) and
/// stopping on Ctrl-C or when the callback raises.
pub fn run_monitored<T: Send>(
    py: Python<'_>,
    callback: Option<Py<PyAny>>,
    job: impl FnOnce(&dyn Progress) -> maleki_common::Result<T> + Send,
) -> PyResult<T> {
    let mut raised: Option<PyErr> = None;
    let mut last: Option<(u64, u64)> = None;
    let out = py.detach(|| {
        pool::run_monitored(
            |monitor| job(monitor),
            |done, total| {
                if raised.is_some() {
                    return ControlFlow::Break(());
                }
                Python::attach(|py| {
                    if let Err(e) = py.check_signals() {
                        raised = Some(e);
                        return ControlFlow::Break(());
                    }
                    if let Some(cb) = &callback {
                        // A budget checked every few thousand steps can overshoot its total:
                        // the callback never sees more than 100%.
                        let done = done.min(total);
                        if total > 0 && last != Some((done, total)) {
                            last = Some((done, total));
                            if let Err(e) = cb.call1(py, (done, total)) {
                                raised = Some(e);
                                return ControlFlow::Break(());
                            }
                        }
                    }
                    ControlFlow::Continue(())
                })
            },
            POLL_INTERVAL,
        )
    });
    match (out, raised) {
        (_, Some(e)) => Err(e),
        // A Ctrl-C after the last poll: raised now, as in `run_quick`.
        (Ok(v), None) => py.check_signals().map(|_| v),
        (Err(e), None) => Err(to_pyerr(e)),
    }
}
