//! Batches of scans, solved in parallel on the caller's rayon pool.
//!
//! Scans are independent and each is solved by exactly the same code as a single call, so
//! results are bitwise identical to a loop of single solves and to any thread count. One bad
//! scan gives its own error (a status in Python) and never aborts the batch. Progress is
//! reported per chunk of scans and a cancellation request stops the batch with
//! [`Error::Cancelled`].

use std::ops::ControlFlow;

use maleki_common::progress::{Counter, Progress};
use maleki_common::{Error, Result};
use nalgebra::{Matrix3, Matrix6, Vector3};
use rayon::prelude::*;

use crate::horn::absolute_orientation;
use crate::input::{BatchCov, BatchRef, PerScan};
use crate::solver::{crlb_with, solve_with, Options, PoseEstimate, Workspace};

/// A rotation and a translation.
pub type RigidPose = (Matrix3<f64>, Vector3<f64>);

/// Runs `f(k, workspace)` for every scan `k` in parallel chunks, in order, with progress.
fn run_chunked<T: Send, W: Default + Send>(
    nb: usize,
    progress: &dyn Progress,
    f: impl Fn(usize, &mut W) -> T + Sync,
) -> Result<Vec<T>> {
    let threads = rayon::current_num_threads().max(1);
    // Small enough for load balance and prompt progress, large enough to amortise overhead.
    let chunk = (nb / (8 * threads)).clamp(1, 256);
    let counter = Counter::new(progress, nb as u64);
    let parts: Vec<Option<Vec<T>>> = (0..nb.div_ceil(chunk))
        .into_par_iter()
        .map_init(W::default, |ws, c| {
            if counter.cancelled() {
                return None;
            }
            let (lo, hi) = (c * chunk, ((c + 1) * chunk).min(nb));
            let out: Vec<T> = (lo..hi).map(|k| f(k, ws)).collect();
            match counter.tick((hi - lo) as u64) {
                ControlFlow::Continue(()) => Some(out),
                ControlFlow::Break(()) => None,
            }
        })
        .collect();
    let mut all = Vec::with_capacity(nb);
    for p in parts {
        all.extend(p.ok_or(Error::Cancelled)?);
    }
    Ok(all)
}

/// Solves every scan of `batch`. The outer `Err` is for the batch as a whole (bad offsets,
/// bad options, cancellation); each scan has its own `Result`.
pub fn solve_batch(
    batch: &BatchRef<'_>,
    opts: &Options,
    progress: &dyn Progress,
) -> Result<Vec<Result<PoseEstimate>>> {
    batch.check_offsets()?;
    opts.validate()?;
    run_chunked(batch.len(), progress, |k, ws: &mut Workspace| {
        batch.scan(k).and_then(|scan| solve_with(&scan, opts, ws))
    })
}

/// Weighted Kabsch/Horn for every scan of `batch` (the covariance of `batch` is ignored).
pub fn absolute_orientation_batch(
    offsets: &[usize],
    b: &[[f64; 3]],
    r: PerScan<'_, [f64; 3]>,
    weights: Option<PerScan<'_, f64>>,
    progress: &dyn Progress,
) -> Result<Vec<Result<RigidPose>>> {
    let batch = BatchRef {
        offsets,
        b,
        r,
        cov: BatchCov::Isotropic {
            sigma_b: 1.0,
            sigma_r: 0.0,
        },
        weights,
    };
    batch.check_offsets()?;
    run_chunked(batch.len(), progress, |k, _: &mut ()| {
        batch
            .scan(k)
            .and_then(|s| absolute_orientation(s.b, s.r, s.weights))
    })
}

/// The CRLB of every scan: scan `k` has the true reference points
/// `r[offsets[k]..offsets[k+1]]` (or the shared map), the noise model `cov`, and the true
/// rotation `rotations[k]` (row-major; a single entry is shared by all scans).
pub fn crlb_batch(
    offsets: &[usize],
    r: PerScan<'_, [f64; 3]>,
    cov: BatchCov<'_>,
    weights: Option<PerScan<'_, f64>>,
    rotations: &[[f64; 9]],
    progress: &dyn Progress,
) -> Result<Vec<Result<Matrix6<f64>>>> {
    // The body points play no part in the bound; stand-ins give the batch its row count.
    let total = offsets.last().copied().unwrap_or(0);
    let stand_in = vec![[0.0f64; 3]; total];
    let batch = BatchRef {
        offsets,
        b: &stand_in,
        r,
        cov,
        weights,
    };
    batch.check_offsets()?;
    let nb = batch.len();
    if rotations.len() != nb && rotations.len() != 1 {
        return Err(Error::invalid(
            "rotation",
            format!(
                "has {} matrices for {nb} scans (give one per scan or a single one)",
                rotations.len()
            ),
        ));
    }
    run_chunked(nb, progress, |k, ws: &mut Workspace| {
        let rot = Matrix3::from_row_slice(&rotations[if rotations.len() == 1 { 0 } else { k }]);
        batch
            .scan(k)
            .map(|mut scan| {
                scan.b = scan.r;
                scan
            })
            .and_then(|scan| crlb_with(&scan, &rot, ws))
    })
}
