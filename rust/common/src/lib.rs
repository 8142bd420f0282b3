//! Shared foundation of the maleki_rs cores.
//!
//! Every core crate (pose, tessel, msgemm, ...) depends on this crate and on nothing
//! Python-related. It holds the four conventions every subsystem shares:
//!
//! * [`error`]: the one error enum ([`Error`]) returned by every core function;
//! * [`rng`]: seeded random streams keyed by `(seed, item)`, so results never depend
//!   on the number of threads;
//! * [`progress`]: the progress/cancel trait long-running cores report through;
//! * [`pool`]: the library-owned rayon thread pool (never rayon's global pool);
//!
//! and [`alloc`], allocation of data-sized buffers that fails with an error, not an abort.

pub mod alloc;
pub mod error;
pub mod pool;
pub mod progress;
pub mod rng;

pub use error::{Error, Result};
pub use progress::{CancelFlag, NoProgress, Progress};
