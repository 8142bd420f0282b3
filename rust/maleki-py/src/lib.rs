//! `maleki_rs._core`: the compiled half of maleki_rs.
//!
//! This is the only crate that links Python. Each subsystem has one file here that converts
//! numpy arrays to slices, releases the GIL, runs its core crate on the library pool and
//! converts the result back; the public, documented API is the Python package around it.

use pyo3::prelude::*;

mod arrays;
mod errors;
mod msgemm;
mod pose;
mod progress;
pub mod tessel;
mod tessel_search;

/// Registers the fork hook: a forked child must not use the parent's pool threads.
fn register_fork_hook() {
    extern "C" fn child() {
        maleki_common::pool::mark_forked();
    }
    // SAFETY: pthread_atfork only stores the function pointer; `child` is async-signal safe
    // (it stores one atomic flag).
    unsafe {
        libc::pthread_atfork(None, None, Some(child));
    }
}

/// The compiled core of maleki_rs (private: use the `maleki_rs` package).
#[pymodule]
mod _core {
    use pyo3::prelude::*;
    use pyo3::types::PyDict;

    use crate::errors::to_pyerr;

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        crate::register_fork_hook();
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        let py = m.py();
        let msgemm = PyModule::new(py, "msgemm")?;
        crate::msgemm::register(&msgemm)?;
        m.add_submodule(&msgemm)?;
        let pose = PyModule::new(py, "pose")?;
        crate::pose::register(&pose)?;
        m.add_submodule(&pose)?;
        let tessel = PyModule::new(py, "tessel")?;
        crate::tessel::register(&tessel)?;
        crate::tessel_search::register(&tessel)?;
        m.add_submodule(&tessel)?;
        Ok(())
    }

    /// Sets the number of threads of the library's own rayon pool (n >= 1).
    #[pyfunction]
    fn set_num_threads(n: i64) -> PyResult<()> {
        let n = usize::try_from(n).unwrap_or(0);
        maleki_common::pool::set_num_threads(n).map_err(to_pyerr)
    }

    /// The number of threads of the library's pool.
    #[pyfunction]
    fn get_num_threads() -> usize {
        maleki_common::pool::num_threads()
    }

    /// Build and machine facts: version, profile, target, detected CPU features.
    #[pyfunction]
    fn build_info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("version", env!("CARGO_PKG_VERSION"))?;
        d.set_item("debug_assertions", cfg!(debug_assertions))?;
        d.set_item("target_arch", std::env::consts::ARCH)?;
        d.set_item("target_os", std::env::consts::OS)?;
        let mut feats: Vec<&str> = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                feats.push("avx2");
            }
            if std::arch::is_x86_feature_detected!("fma") {
                feats.push("fma");
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                feats.push("avx512f");
            }
            if std::arch::is_x86_feature_detected!("avx512bw") {
                feats.push("avx512bw");
            }
            if std::arch::is_x86_feature_detected!("avx512vbmi") {
                feats.push("avx512vbmi");
            }
            if std::arch::is_x86_feature_detected!("avx512vnni") {
                feats.push("avx512vnni");
            }
            // Picks msgemm's `bf16` kernel (`vdpbf16ps` on AMD).
            if std::arch::is_x86_feature_detected!("avx512bf16") {
                feats.push("avx512bf16");
            }
            // The AVX2 dense kernel's `vpdpbusd` (`dense::Kind::AvxVnni`).
            if std::arch::is_x86_feature_detected!("avxvnni") {
                feats.push("avxvnni");
            }
            // AMX tiles that this process may use (CPU and OS).
            if maleki_msgemm::dense::amx_ready() {
                feats.push("amx");
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            if std::arch::is_aarch64_feature_detected!("neon") {
                feats.push("neon");
            }
        }
        d.set_item("cpu_features", feats)?;
        Ok(d)
    }
}
