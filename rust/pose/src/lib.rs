//! Total-least-squares pose estimation with fully populated per-point covariances.
//!
//! "TLS" here means *total* least squares (errors-in-variables): both point sets are noisy,
//! not *truncated* least squares as in TEASER++. After S. Maleki, Y. Cheng, J. Crassidis,
//! M. Schmid, "Total Least Squares for Optimal Pose Estimation" (arXiv 2106.11522).
//!
//! # Conventions
//! * `A ∈ SO(3)` maps reference-frame vectors into the body frame; `t` is in the body frame:
//!   `b = A r + t`. The body origin in the reference frame is `p = −Aᵀ t`.
//! * The noise of point `i` is `z_i = [Δb_i; Δr_i]` with 6x6 covariance
//!   `R_i = [[R_bb, R_br], [R_brᵀ, R_rr]]`, cross-covariance included.
//! * Pose errors are `x̃ = [θ; δt]` with `Â = exp([θ×]) A` (left perturbation) and
//!   `δt = t̂ − t`; every 6x6 covariance is `Cov(x̃)` in these coordinates.
//! * Quaternions are scalar-last `[x, y, z, w]` with `w >= 0` (scipy's convention).
//!
//! # Entry points
//! [`solve`] / [`solve_batch`] (the estimator), [`absolute_orientation`] (weighted Kabsch
//! baseline), [`crlb`] / [`crlb_batch`] (Cramér-Rao bound), [`cost_and_gradient`] (for tests).
//! There is no randomness in this crate: the Monte-Carlo generators live in Python.

// `!(x > 0.0)` is used on purpose throughout: unlike `x <= 0.0` it also rejects NaN.
#![allow(clippy::neg_cmp_op_on_partial_ord)]
// Small fixed-size linear algebra reads best with explicit indices.
#![allow(clippy::needless_range_loop)]

pub mod batch;
pub mod horn;
pub mod input;
pub mod lanes;
pub mod math;
pub mod solver;

pub use batch::{absolute_orientation_batch, crlb_batch, solve_batch, RigidPose};
pub use horn::absolute_orientation;
pub use input::{prepare, BatchBlock, BatchCov, BatchRef, Block, Cov, PerScan, Prepared, ScanRef};
pub use solver::{
    cost_and_gradient, crlb, evaluate_prepared, evaluate_scan, solve, solve_with, Eval, Init,
    Options, PoseEstimate, Workspace, RCOND_DEGENERATE,
};
