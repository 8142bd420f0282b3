//! Tessel (HPCA 2024): pipeline-schedule search for any operator placement.
//!
//! * [`model`]: the problem model: [`Premise`] (the placement of one micro-batch, validated,
//!   with its derived quantities) and [`Schedule`] (a start per job plus the instance).
//! * [`template`]: 1-periodic templates, their steady-state checks and unrolling, and the
//!   exact conversion to Tessel's repetend form.
//! * [`premises`]: the built-in placements of the paper and ours.
//! * [`validate`]: every violation of V1-V4 (schedules) and T1-T3 (templates).
//! * [`simulate`]: ASAP timing of per-device orders, deadlock detection, and metrics.
//! * [`concat`]: Tessel-style completion (optimal warm-up, repetend windows, optimal cool-down).
//! * [`baselines`]: GPipe, 1F1B, 1F1B+, Chimera, interleaved 1F1B, ZB-H1/H2, inference pipelining.
//! * [`formats`]: our JSON, Tessel's JSON, the text grid and torch's CSV; [`svg`]: Gantt charts.

pub mod baselines;
mod bits;
mod check;
pub mod complete;
pub mod concat;
pub mod exact;
pub mod formats;
pub mod ims;
pub mod model;
pub mod premises;
pub mod repetend;
pub mod search;
pub mod simulate;
pub mod svg;
pub mod template;
pub mod validate;

pub use model::{Block, Edge, Kind, MemoryConvention, Premise, Schedule, UNLIMITED};
pub use search::{search, SearchOptions, SearchResult};
pub use template::{Template, TesselRepetend};
