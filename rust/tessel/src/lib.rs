//! Tessel (HPCA 2024): pipeline-schedule search for any operator placement.
//!
//! * [`model`]: the problem model: [`Premise`] (the placement of one micro-batch, validated,
//!   with its derived quantities) and [`Schedule`] (a start per job plus the instance).
//! * [`template`]: 1-periodic templates, their steady-state checks and unrolling, and the
//!   exact conversion to Tessel's repetend form.
//! * [`premises`]: the built-in placements of the paper and ours.

mod bits;
mod check;
pub mod complete;
pub mod exact;
pub mod ims;
pub mod model;
pub mod premises;
pub mod repetend;
pub mod search;
pub mod template;

pub use model::{Block, Edge, Kind, MemoryConvention, Premise, Schedule, UNLIMITED};
pub use search::{search, SearchOptions, SearchResult};
pub use template::{Template, TesselRepetend};
