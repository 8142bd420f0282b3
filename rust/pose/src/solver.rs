//! The total-least-squares estimator: Horn initialisation, then Gauss-Newton on SO(3)×R³
//! with the full gradient of the profile likelihood (Newton steps after [`NEWTON_AFTER`]
//! iterations, for scans whose large residuals make Gauss-Newton slow).
//!
//! Cost (nuisance true points eliminated in closed form, exact for Gaussian noise):
//!
//! ```text
//! J(A, t) = ½ Σ eᵢᵀ Wᵢ(A) eᵢ,   eᵢ = b̃ᵢ − A r̃ᵢ − t,   Wᵢ = Sᵢ⁻¹,
//! Sᵢ(A)   = R_bb − A R_brᵀ − R_br Aᵀ + A R_rr Aᵀ.
//! ```
//!
//! Perturbations are on the left, `A ← exp([θ×]) A`, `t ← t + δt`. With `aᵢ = A r̃ᵢ`,
//! `uᵢ = Wᵢ eᵢ` and `vᵢ = A (R_brᵀ − R_rr Aᵀ) uᵢ` (from `∂W/∂A`), the gradient is
//! `g_θ = Σ uᵢ × aᵢ + vᵢ × uᵢ`, `g_t = −Σ uᵢ`, and the Gauss-Newton normal matrix is
//! `F = Σ Hᵢᵀ Wᵢ Hᵢ` with `Hᵢ = [[aᵢ×], −I]`.
//!
//! The per-point work is fused: because `Sᵢ uᵢ = eᵢ`, `vᵢ = R_bb uᵢ − eᵢ − R_br Aᵀ uᵢ`, so
//! `uᵢ × aᵢ + vᵢ × uᵢ = uᵢ × (b̃ᵢ − t − R_bb uᵢ + R_br Aᵀ uᵢ)`, and `Sᵢ = R_bb + sym(Xᵢ Aᵀ)`
//! with `Xᵢ = A R_rr − 2 R_br`. About 200 multiplications per point and iteration, no
//! allocation: the loop reads the validated per-point blocks of [`crate::input::prepare`].

use maleki_common::{Error, Result};
use nalgebra::{Matrix3, Matrix6, Vector3, Vector6};

use crate::horn::horn_fit_by;
#[cfg(test)]
use crate::input::Point;
use crate::input::{prepare, Prepared, ScanRef};
use crate::math::{exp_so3, orthonormalize, quaternion_xyzw, rcond_equilibrated, skew, Chol6};
#[cfg(test)]
use crate::math::{sym3_inverse_spd, sym3_mul};

/// Geometry whose equilibrated normal matrix has a reciprocal condition number below this is
/// reported as degenerate (collinear or coincident points: a rotation is unobservable).
pub const RCOND_DEGENERATE: f64 = 1e-12;

/// Gauss-Newton iterations after which the solver takes Newton steps (Hessian from central
/// differences of the exact gradient; saddle-free where it is not positive definite). `F` is the
/// Hessian only where the residuals are small: with few, very noisy points (S5 at N = 3) it
/// is far from it and Gauss-Newton converges linearly at a slow rate (13% of such scans
/// were still unconverged after 100 iterations); Newton converges quadratically. Scans that
/// converge within this many iterations are not affected.
pub const NEWTON_AFTER: usize = 10;

/// Central-difference step of the Newton Hessian: in radians for the rotation, in units of the
/// scene radius for the translation (`cbrt(eps)`-sized: truncation and rounding errors
/// balanced, about 1e-10 relative).
const FD_STEP: f64 = 6e-6;

/// Iterations without a new minimum of the cost after which the solver stops, unconverged:
/// more than the step halvings and Levenberg-Marquardt increases of one failing step take
/// (10 and 15), so only iterates that wander within rounding are cut short.
const STALL_AFTER: usize = 50;

/// How the iteration starts.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Init {
    /// Weighted Horn/Kabsch with the scalar weights `3 / tr(R_bb + R_rr)` (closed form).
    #[default]
    Horn,
    /// A given rotation (projected onto SO(3)) and, optionally, translation (else the
    /// weighted-centroid translation for that rotation).
    Given {
        rotation: Matrix3<f64>,
        translation: Option<Vector3<f64>>,
    },
}

/// Solver options.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Options {
    /// Iteration limit (>= 1).
    pub max_iter: usize,
    /// Stop when the Gauss-Newton step `[δθ; δt/ρ]` (radians; translation relative to the
    /// RMS radius ρ of the body points) has a 2-norm below `tol`.
    pub tol: f64,
    pub init: Init,
    /// Compute `Cov(x̃) = F⁻¹` (else the covariance is NaN).
    pub compute_covariance: bool,
    /// After every rotation update, set `t` to its optimum `t*(A) = (Σ W)⁻¹ Σ W (b̃ − A r̃)`
    /// (one more pass over the points per iteration).
    pub variable_projection: bool,
    /// Return [`Error::NotConverged`] instead of an estimate with `converged == false`.
    pub strict: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_iter: 100,
            tol: 1e-10,
            init: Init::Horn,
            compute_covariance: true,
            variable_projection: false,
            strict: false,
        }
    }
}

impl Options {
    /// Checks the numeric options.
    pub fn validate(&self) -> Result<()> {
        if self.max_iter == 0 {
            return Err(Error::invalid("max_iter", "must be at least 1"));
        }
        if !(self.tol.is_finite() && self.tol > 0.0) {
            return Err(Error::invalid(
                "tol",
                format!("must be positive and finite, got {}", self.tol),
            ));
        }
        if let Init::Given {
            rotation,
            translation,
        } = self.init
        {
            if !rotation.iter().all(|v| v.is_finite()) {
                return Err(Error::invalid("rotation0", "contains a non-finite value"));
            }
            let err = (rotation.transpose() * rotation - Matrix3::identity())
                .abs()
                .max();
            if err > 1e-6 || rotation.determinant() <= 0.0 {
                return Err(Error::invalid(
                    "rotation0",
                    format!(
                        "is not a rotation matrix (|AᵀA − I| = {err:.2e}, det = {:.4})",
                        rotation.determinant()
                    ),
                ));
            }
            if let Some(t) = translation {
                if !t.iter().all(|v| v.is_finite()) {
                    return Err(Error::invalid(
                        "translation0",
                        "contains a non-finite value",
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The estimate for one scan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PoseEstimate {
    /// `A`, mapping reference-frame vectors into the body frame (`b = A r + t`).
    pub rotation: Matrix3<f64>,
    /// `t`, in the body frame.
    pub translation: Vector3<f64>,
    /// `Cov([θ; δt])` with `Â = exp([θ×]) A` (NaN when not computed). Evaluated at the last
    /// linearisation point, which is within `tol` of the estimate.
    pub covariance: Matrix6<f64>,
    /// `J` at the optimum: `chi2 = 2 J ~ χ²(3N − 6)` when the noise model is right.
    pub cost: f64,
    /// Gauss-Newton steps taken (rejected trial steps included).
    pub iterations: usize,
    pub converged: bool,
    /// Number of correspondences.
    pub n_points: usize,
    /// Reciprocal condition number of the equilibrated normal matrix at the start.
    pub rcond: f64,
}

impl PoseEstimate {
    /// `2 J`, the goodness-of-fit statistic.
    pub fn chi2(&self) -> f64 {
        2.0 * self.cost
    }
    /// Degrees of freedom of `chi2`: `3N − 6`.
    pub fn dof(&self) -> usize {
        (3 * self.n_points).saturating_sub(6)
    }
    /// Scalar-last unit quaternion `[x, y, z, w]`, `w >= 0` (scipy convention).
    pub fn quaternion(&self) -> [f64; 4] {
        quaternion_xyzw(&self.rotation)
    }
    /// The body origin in the reference frame, `p = −Aᵀ t`.
    pub fn position(&self) -> Vector3<f64> {
        -(self.rotation.transpose() * self.translation)
    }
}

/// Cost, gradient and normal matrix at one point `(A, t)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Eval {
    pub cost: f64,
    /// `[g_θ; g_t]`.
    pub gradient: Vector6<f64>,
    /// `F = Σ Hᵢᵀ Wᵢ Hᵢ` (only when requested).
    pub normal: Matrix6<f64>,
}

impl Default for Eval {
    fn default() -> Self {
        Eval {
            cost: 0.0,
            gradient: Vector6::zeros(),
            normal: Matrix6::zeros(),
        }
    }
}

/// The per-point algebra written one point at a time: the reference the vectorised pass of
/// [`crate::lanes`] is tested against. `CROSS`: some `R_br ≠ 0`; `NORMAL`: accumulate `F`.
/// Returns the index of a point whose `Sᵢ(A)` is not positive definite as the error.
#[cfg(test)]
pub(crate) fn accumulate<const CROSS: bool, const NORMAL: bool>(
    pts: &[Point],
    a: &Matrix3<f64>,
    t: &Vector3<f64>,
) -> std::result::Result<Eval, usize> {
    let m = [
        [a[(0, 0)], a[(0, 1)], a[(0, 2)]],
        [a[(1, 0)], a[(1, 1)], a[(1, 2)]],
        [a[(2, 0)], a[(2, 1)], a[(2, 2)]],
    ];
    let (t0, t1, t2) = (t.x, t.y, t.z);
    let mut cost = 0.0;
    let mut g = [0.0f64; 6];
    // Σ W (upper), Σ W[a×] (full), Σ −[a×]W[a×] (upper).
    let mut ftt = [0.0f64; 6];
    let mut p = [0.0f64; 9];
    let mut fqq = [0.0f64; 6];
    for (i, pt) in pts.iter().enumerate() {
        let r = pt.r;
        let av = [
            m[0][0] * r[0] + m[0][1] * r[1] + m[0][2] * r[2],
            m[1][0] * r[0] + m[1][1] * r[1] + m[1][2] * r[2],
            m[2][0] * r[0] + m[2][1] * r[1] + m[2][2] * r[2],
        ];
        let bt = [pt.b[0] - t0, pt.b[1] - t1, pt.b[2] - t2];
        let e = [bt[0] - av[0], bt[1] - av[1], bt[2] - av[2]];
        // X = A R_rr (− 2 R_br).
        let rr = &pt.rr;
        let mut x = [[0.0f64; 3]; 3];
        for j in 0..3 {
            x[j][0] = m[j][0] * rr[0] + m[j][1] * rr[1] + m[j][2] * rr[2];
            x[j][1] = m[j][0] * rr[1] + m[j][1] * rr[3] + m[j][2] * rr[4];
            x[j][2] = m[j][0] * rr[2] + m[j][1] * rr[4] + m[j][2] * rr[5];
            if CROSS {
                x[j][0] -= pt.br2[3 * j];
                x[j][1] -= pt.br2[3 * j + 1];
                x[j][2] -= pt.br2[3 * j + 2];
            }
        }
        let dot = |j: usize, k: usize| x[j][0] * m[k][0] + x[j][1] * m[k][1] + x[j][2] * m[k][2];
        let bb = &pt.bb;
        let s = if CROSS {
            [
                bb[0] + dot(0, 0),
                bb[1] + 0.5 * (dot(0, 1) + dot(1, 0)),
                bb[2] + 0.5 * (dot(0, 2) + dot(2, 0)),
                bb[3] + dot(1, 1),
                bb[4] + 0.5 * (dot(1, 2) + dot(2, 1)),
                bb[5] + dot(2, 2),
            ]
        } else {
            [
                bb[0] + dot(0, 0),
                bb[1] + dot(0, 1),
                bb[2] + dot(0, 2),
                bb[3] + dot(1, 1),
                bb[4] + dot(1, 2),
                bb[5] + dot(2, 2),
            ]
        };
        // W = S⁻¹, with Sylvester's SPD check.
        let w = sym3_inverse_spd(&s).ok_or(i)?;
        let u = sym3_mul(&w, &e);
        cost += e[0] * u[0] + e[1] * u[1] + e[2] * u[2];
        // c = b̃ − t − R_bb u (+ R_br Aᵀ u);  g_θ += u × c.
        let mut c = [
            bt[0] - (bb[0] * u[0] + bb[1] * u[1] + bb[2] * u[2]),
            bt[1] - (bb[1] * u[0] + bb[3] * u[1] + bb[4] * u[2]),
            bt[2] - (bb[2] * u[0] + bb[4] * u[1] + bb[5] * u[2]),
        ];
        if CROSS {
            let atu = [
                m[0][0] * u[0] + m[1][0] * u[1] + m[2][0] * u[2],
                m[0][1] * u[0] + m[1][1] * u[1] + m[2][1] * u[2],
                m[0][2] * u[0] + m[1][2] * u[1] + m[2][2] * u[2],
            ];
            let br = &pt.br2;
            for j in 0..3 {
                c[j] +=
                    0.5 * (br[3 * j] * atu[0] + br[3 * j + 1] * atu[1] + br[3 * j + 2] * atu[2]);
            }
        }
        g[0] += u[1] * c[2] - u[2] * c[1];
        g[1] += u[2] * c[0] - u[0] * c[2];
        g[2] += u[0] * c[1] - u[1] * c[0];
        g[3] -= u[0];
        g[4] -= u[1];
        g[5] -= u[2];
        if NORMAL {
            for k in 0..6 {
                ftt[k] += w[k];
            }
            // P = W [a×]: columns a2 W₁ − a1 W₂, a0 W₂ − a2 W₀, a1 W₀ − a0 W₁ (Wₖ = column k).
            let (a0, a1, a2) = (av[0], av[1], av[2]);
            let wc = [[w[0], w[1], w[2]], [w[1], w[3], w[4]], [w[2], w[4], w[5]]];
            let mut pp = [0.0f64; 9]; // row-major
            for row in 0..3 {
                pp[3 * row] = a2 * wc[1][row] - a1 * wc[2][row];
                pp[3 * row + 1] = a0 * wc[2][row] - a2 * wc[0][row];
                pp[3 * row + 2] = a1 * wc[0][row] - a0 * wc[1][row];
            }
            for k in 0..9 {
                p[k] += pp[k];
            }
            // −[a×] P, upper triangle: rows (a2 P₁ − a1 P₂), (a0 P₂ − a2 P₀), (a1 P₀ − a0 P₁).
            fqq[0] += a2 * pp[3] - a1 * pp[6];
            fqq[1] += a2 * pp[4] - a1 * pp[7];
            fqq[2] += a2 * pp[5] - a1 * pp[8];
            fqq[3] += a0 * pp[7] - a2 * pp[1];
            fqq[4] += a0 * pp[8] - a2 * pp[2];
            fqq[5] += a1 * pp[2] - a0 * pp[5];
        }
    }
    let mut normal = Matrix6::zeros();
    if NORMAL {
        let sym = |v: &[f64; 6], k: usize, l: usize| {
            let (k, l) = if k <= l { (k, l) } else { (l, k) };
            v[[0, 1, 2, 3, 4, 5][[[0, 1, 2], [1, 3, 4], [2, 4, 5]][k][l]]]
        };
        for k in 0..3 {
            for l in 0..3 {
                normal[(k, l)] = sym(&fqq, k, l);
                normal[(k + 3, l + 3)] = sym(&ftt, k, l);
                // F_θt = Σ [a×] W = −Σ Pᵀ.
                normal[(k, l + 3)] = -p[3 * l + k];
                normal[(l + 3, k)] = -p[3 * l + k];
            }
        }
    }
    Ok(Eval {
        cost: 0.5 * cost,
        gradient: Vector6::from(g),
        normal,
    })
}

/// Cost, gradient and (when `normal`) normal matrix in the scan's own units (the loop works
/// on covariances rescaled by a power of two, see [`Prepared`]).
fn evaluate(prep: &Prepared, a: &Matrix3<f64>, t: &Vector3<f64>, normal: bool) -> Result<Eval> {
    let mut out = Eval::default();
    evaluate_into(prep, a, t, normal, &mut out)?;
    Ok(Eval {
        cost: prep.unscale(out.cost),
        gradient: out.gradient.map(|v| prep.unscale(v)),
        normal: out.normal.map(|v| prep.unscale(v)),
    })
}

fn evaluate_into(
    prep: &Prepared,
    a: &Matrix3<f64>,
    t: &Vector3<f64>,
    normal: bool,
    out: &mut Eval,
) -> Result<()> {
    crate::lanes::evaluate_blocks(&prep.blocks, a, t, prep.cross, normal, out).map_err(|i| {
        Error::Numerical(format!(
            "S_{i}(A) = R_bb − A R_brᵀ − R_br Aᵀ + A R_rr Aᵀ of point {i} is not positive definite \
             (its covariance leaves the residual without noise)"
        ))
    })
}

/// Cost, gradient and normal matrix of an already prepared scan: one Gauss-Newton pass over
/// the points (the hook of the per-point-per-iteration benchmark).
pub fn evaluate_prepared(prep: &Prepared, a: &Matrix3<f64>, t: &Vector3<f64>) -> Result<Eval> {
    evaluate(prep, a, t, true)
}

/// Cost `J` and gradient `[g_θ; g_t]` of a validated scan at `(A, t)` (exposed for tests).
pub fn cost_and_gradient(
    scan: &ScanRef<'_>,
    a: &Matrix3<f64>,
    t: &Vector3<f64>,
) -> Result<(f64, Vector6<f64>)> {
    let mut prep = Prepared::default();
    prepare(scan, &mut prep)?;
    let e = evaluate(&prep, a, t, false)?;
    Ok((e.cost, e.gradient))
}

/// Cost, gradient and Gauss-Newton normal matrix `F` at `(A, t)`.
pub fn evaluate_scan(scan: &ScanRef<'_>, a: &Matrix3<f64>, t: &Vector3<f64>) -> Result<Eval> {
    let mut prep = Prepared::default();
    prepare(scan, &mut prep)?;
    evaluate(&prep, a, t, true)
}

/// Reusable per-thread memory of the solver (the centred and validated points of the
/// current scan).
#[derive(Debug, Default)]
pub struct Workspace {
    prep: Prepared,
    b: Vec<[f64; 3]>,
    r: Vec<[f64; 3]>,
}

/// Estimates the pose of one scan (allocates a fresh [`Workspace`]).
pub fn solve(scan: &ScanRef<'_>, opts: &Options) -> Result<PoseEstimate> {
    solve_with(scan, opts, &mut Workspace::default())
}

/// Estimates the pose of one scan, reusing `ws`.
///
/// The solver works on points centred on their means `b̄`, `r̄` (`b − b̄ = A (r − r̄) + t'`),
/// then maps back: `t = t' + b̄ − A r̄`, and `δt = δt' + [(A r̄)×] θ` for the covariance.
/// The estimate is the same (the cost is invariant under the shift), but the normal matrix of
/// points far from the origin (map or UTM coordinates) is conditioned like the scene's
/// extent, not like its distance from the origin squared.
pub fn solve_with(scan: &ScanRef<'_>, opts: &Options, ws: &mut Workspace) -> Result<PoseEstimate> {
    opts.validate()?;
    let Workspace { prep, b, r } = ws;
    let (bbar, rbar) = (centre_into(scan.b, b), centre_into(scan.r, r));
    let centred = ScanRef {
        b,
        r,
        cov: scan.cov,
        weights: scan.weights,
    };
    prepare(&centred, prep)?;
    // A given start translation, in the centred frame: t' = t + A r̄ − b̄.
    let mut opts = *opts;
    if let Init::Given {
        rotation,
        translation: Some(t0),
    } = opts.init
    {
        opts.init = Init::Given {
            rotation,
            translation: Some(t0 + orthonormalize(&rotation) * rbar - bbar),
        };
    }
    let mut est = refine(prep, &opts)?;
    let v = est.rotation * rbar;
    est.translation += bbar - v;
    // Uncentred on the rescaled covariance, then mapped back: a covariance beyond float64's
    // range becomes ±inf entry by entry (mapping back first would give inf − inf = NaN).
    est.covariance = uncentre_covariance(&est.covariance, &v).map(|c| prep.unscale_covariance(c));
    Ok(est)
}

/// `pts − mean(pts)` into `out`; returns the mean (0 for an empty or non-finite set, which
/// `prepare` then reports).
fn centre_into(pts: &[[f64; 3]], out: &mut Vec<[f64; 3]>) -> Vector3<f64> {
    let mut c = [0.0; 3];
    for (i, p) in pts.iter().enumerate() {
        let f = 1.0 / (i + 1) as f64;
        for k in 0..3 {
            c[k] += f * (p[k] - c[k]);
        }
    }
    if !c.iter().all(|v| v.is_finite()) {
        c = [0.0; 3];
    }
    out.clear();
    out.extend(pts.iter().map(|p| [p[0] - c[0], p[1] - c[1], p[2] - c[2]]));
    Vector3::from(c)
}

/// `J C Jᵀ` with `J = [[I, 0], [[v×], I]]`: the covariance of `[θ; δt]` from that of
/// `[θ; δt']` when `t = t' − A r̄ + b̄` and `v = A r̄`.
fn uncentre_covariance(c: &Matrix6<f64>, v: &Vector3<f64>) -> Matrix6<f64> {
    let mut j = Matrix6::identity();
    j.fixed_view_mut::<3, 3>(3, 0).copy_from(&skew(v));
    j * c * j.transpose()
}

/// The Cholesky solve of `F δ = −g`, with optional Levenberg-Marquardt damping `λ diag(F)`.
fn gn_step(f: &Matrix6<f64>, g: &Vector6<f64>, lambda: f64) -> Option<Vector6<f64>> {
    let mut fd = *f;
    if lambda > 0.0 {
        for k in 0..6 {
            fd[(k, k)] *= 1.0 + lambda;
        }
    }
    Chol6::new(&fd).map(|ch| -ch.solve(g))
}

/// The Newton step `−H⁻¹ g` at `(a, t)`, `H` the symmetrized central-difference Jacobian of
/// the exact gradient in the solver's coordinates (12 gradient evaluations, no normal matrix),
/// with negative curvature flipped where `H` is not positive definite (saddle-free Newton), or
/// `None` when a probe point cannot be evaluated. Off the stationary point
/// `H` differs from the Hessian of the left-perturbed cost by terms proportional to `g`
/// (perturbations do not commute on SO(3)), which vanish at the solution: the convergence
/// stays quadratic.
fn newton_step(
    prep: &Prepared,
    a: &Matrix3<f64>,
    t: &Vector3<f64>,
    g: &Vector6<f64>,
    rho: f64,
    scratch: &mut Eval,
) -> Option<Vector6<f64>> {
    let mut h = Matrix6::zeros();
    for j in 0..6 {
        let step = if j < 3 { FD_STEP } else { FD_STEP * rho };
        let mut column = Vector6::zeros();
        for sign in [1.0, -1.0] {
            let mut d = Vector6::zeros();
            d[j] = sign * step;
            let a2 = exp_so3(&d.fixed_rows::<3>(0).into_owned()) * a;
            let t2 = t + d.fixed_rows::<3>(3);
            // A probe point is never a candidate pose: one that cannot be evaluated (some
            // `S_i` not positive definite) only means no Newton step here.
            evaluate_into(prep, &a2, &t2, false, scratch).ok()?;
            column += scratch.gradient * sign;
        }
        h.set_column(j, &(column / (2.0 * step)));
    }
    let h = (h + h.transpose()) * 0.5;
    if !h.iter().all(|v| v.is_finite()) {
        return None;
    }
    if let Some(ch) = Chol6::new(&h) {
        return Some(-ch.solve(g));
    }
    // Not positive definite (a saddle region, or a flat valley): the saddle-free step
    // `−|H|⁻¹ g`, negative curvature turned into positive, so the step still descends and
    // moves away from saddles. Eigenvalues are floored at 1e-8 of the largest. (Plain
    // Gauss-Newton there left 0.2% of S5 N = 3 scans unconverged after 1000 iterations.)
    let e = h.symmetric_eigen();
    let top = e.eigenvalues.iter().fold(0f64, |m, v| m.max(v.abs()));
    if !(top > 0.0) {
        return None;
    }
    let mut d = Vector6::zeros();
    let gq = e.eigenvectors.transpose() * g;
    for k in 0..6 {
        let l = e.eigenvalues[k].abs().max(1e-8 * top);
        d[k] = -gq[k] / l;
    }
    Some(e.eigenvectors * d)
}

fn degenerate() -> Error {
    Error::Degenerate(
        "the normal matrix is singular: the points are collinear or coincident, so a rotation is not observable".into(),
    )
}

/// The estimate of the prepared scan; its covariance is in the rescaled units (the caller
/// uncentres it and maps it back).
fn refine(prep: &Prepared, opts: &Options) -> Result<PoseEstimate> {
    let pts = &prep.pairs;
    let n = pts.len();
    // The closed-form start uses the scalar weights 3 / tr(R_bb + R_rr).
    let h_pt = |i: usize| (pts[i].b, pts[i].r, pts[i].w);
    let (mut a, mut t) = match opts.init {
        Init::Horn => {
            let h = horn_fit_by(n, h_pt);
            (h.rotation, h.translation)
        }
        Init::Given {
            rotation,
            translation,
        } => {
            let a0 = orthonormalize(&rotation);
            let t0 = translation.unwrap_or_else(|| {
                // The weighted-centroid translation for this rotation.
                let (mut sw, mut bc, mut rc) = (0.0, Vector3::zeros(), Vector3::zeros());
                for i in 0..n {
                    let (bi, ri, w) = h_pt(i);
                    sw += w;
                    bc += Vector3::from(bi) * w;
                    rc += Vector3::from(ri) * w;
                }
                (bc - a0 * rc) / sw
            });
            (a0, t0)
        }
    };
    // Scene radius for the relative translation tolerance.
    let mut bc = Vector3::zeros();
    for p in pts {
        bc += Vector3::from(p.b);
    }
    bc /= n as f64;
    let rho = (pts
        .iter()
        .map(|p| (Vector3::from(p.b) - bc).norm_squared())
        .sum::<f64>()
        / n as f64)
        .sqrt();
    if !(rho > 0.0) {
        return Err(degenerate());
    }
    let scaled_norm = |d: &Vector6<f64>| {
        (d[0] * d[0]
            + d[1] * d[1]
            + d[2] * d[2]
            + (d[3] * d[3] + d[4] * d[4] + d[5] * d[5]) / (rho * rho))
            .sqrt()
    };

    // Two evaluation buffers: `ev[c]` at the accepted point, `ev[1 - c]` for the trial.
    let mut ev = [Eval::default(), Eval::default()];
    let mut c = 0usize;
    evaluate_into(prep, &a, &t, true, &mut ev[0])?;
    let rcond = rcond_equilibrated(&ev[0].normal);
    if !(rcond >= RCOND_DEGENERATE) {
        return Err(degenerate());
    }
    if opts.variable_projection {
        t = project_translation(prep, &a, t, &mut ev, &mut c)?;
    }

    let mut iterations = 0;
    let mut converged = false;
    let mut shrink = 1.0;
    let mut halvings = 0;
    let mut lambda = 0.0;
    let mut accepted = 0usize;
    let mut scratch = Eval::default();
    // Iterations since the cost last reached a new minimum: past STALL_AFTER the iterates
    // move within rounding only, and a `tol` below that floor (say 1e-300) would otherwise
    // run all `max_iter` iterations (up to 10**9).
    let mut best_cost = ev[c].cost;
    let mut stalled = 0usize;
    while iterations < opts.max_iter {
        iterations += 1;
        let gn = gn_step(&ev[c].normal, &ev[c].gradient, lambda).ok_or_else(degenerate)?;
        // Convergence is judged on the Gauss-Newton step (`F` is exact, the Newton Hessian a
        // difference quotient); past NEWTON_AFTER the update itself is the Newton step.
        if lambda == 0.0 && scaled_norm(&gn) < opts.tol {
            a = exp_so3(&gn.fixed_rows::<3>(0).into_owned()) * a;
            t += gn.fixed_rows::<3>(3);
            converged = true;
            break;
        }
        let delta = if iterations > NEWTON_AFTER && lambda == 0.0 {
            newton_step(prep, &a, &t, &ev[c].gradient, rho, &mut scratch).unwrap_or(gn)
        } else {
            gn
        };
        let step = delta * shrink;
        let trial_a = exp_so3(&step.fixed_rows::<3>(0).into_owned()) * a;
        let trial_t = t + step.fixed_rows::<3>(3);
        evaluate_into(prep, &trial_a, &trial_t, true, &mut ev[1 - c])?;
        if ev[1 - c].cost < best_cost {
            best_cost = ev[1 - c].cost;
            stalled = 0;
        } else {
            stalled += 1;
            if stalled > STALL_AFTER {
                // No new minimum in that many tries: stop, honestly unconverged.
                break;
            }
        }
        // Accept unless the cost went up by more than rounding.
        if ev[1 - c].cost <= ev[c].cost + 1e-12 * ev[c].cost.abs() {
            // A step that did not lower the cost overshot along some direction (F only
            // approximates the Hessian: with few noisy points F⁻¹H can exceed 2, and full
            // steps then grow that component by |1 − λ| > 1 each time, a cycle the rounding
            // allowance above would accept forever): halve the next steps. A real decrease
            // lets them grow back, by 2 per step.
            let decreased = ev[1 - c].cost < ev[c].cost;
            a = trial_a;
            t = trial_t;
            c = 1 - c;
            accepted += 1;
            if accepted.is_multiple_of(20) {
                // Exponential-map updates stay on SO(3) up to rounding; remove the drift.
                a = orthonormalize(&a);
            }
            if opts.variable_projection {
                t = project_translation(prep, &a, t, &mut ev, &mut c)?;
            }
            if lambda > 0.0 {
                // Damped steps converge: once λ is negligible go back to plain Gauss-Newton.
                lambda *= 0.1;
                if lambda < 1e-9 {
                    lambda = 0.0;
                }
            }
            shrink = if decreased {
                (2.0 * shrink).min(1.0)
            } else {
                (0.5 * shrink).max(1.0 / 1024.0)
            };
            halvings = 0;
            if lambda > 0.0 && scaled_norm(&step) < opts.tol {
                converged = true;
                break;
            }
        } else if lambda == 0.0 {
            // Safeguard 1: halve the step, up to 10 times.
            halvings += 1;
            shrink *= 0.5;
            if halvings > 10 {
                // Safeguard 2: Levenberg-Marquardt damping F + λ diag(F).
                shrink = 1.0;
                lambda = 1e-3;
            }
        } else {
            lambda *= 10.0;
            if lambda > 1e12 {
                // No step decreases the cost any more: stop, honestly unconverged.
                break;
            }
        }
    }
    if !converged && opts.strict {
        return Err(Error::NotConverged { iters: iterations });
    }
    // The loop's cost and normal matrix are those of the rescaled covariances: the cost is
    // mapped back here, the covariance (of the rescaled scan) by the caller, after uncentring.
    let covariance = if opts.compute_covariance {
        Chol6::new(&ev[c].normal).ok_or_else(degenerate)?.inverse()
    } else {
        Matrix6::from_element(f64::NAN)
    };
    Ok(PoseEstimate {
        rotation: a,
        translation: t,
        covariance,
        cost: prep.unscale(ev[c].cost),
        iterations,
        converged,
        n_points: n,
        rcond,
    })
}

/// `t*(A)`: the exact minimiser over `t` for fixed `A` (the cost is quadratic in `t`). The
/// evaluation there goes into the spare buffer, which becomes the current one.
fn project_translation(
    prep: &Prepared,
    a: &Matrix3<f64>,
    t: Vector3<f64>,
    ev: &mut [Eval; 2],
    c: &mut usize,
) -> Result<Vector3<f64>> {
    let ftt = ev[*c].normal.fixed_view::<3, 3>(3, 3).into_owned();
    let gt = ev[*c].gradient.fixed_rows::<3>(3).into_owned();
    let dt = -ftt.cholesky().ok_or_else(degenerate)?.solve(&gt);
    let t2 = t + dt;
    evaluate_into(prep, a, &t2, true, &mut ev[1 - *c])?;
    *c = 1 - *c;
    Ok(t2)
}

/// Cramér-Rao lower bound of `[θ; δt]`: `(Σ Hᵢᵀ Wᵢ(A) Hᵢ)⁻¹` at the true rotation and true
/// reference points (`scan.r`; `scan.b` is not used). The translation does not enter.
pub fn crlb(scan: &ScanRef<'_>, rotation: &Matrix3<f64>) -> Result<Matrix6<f64>> {
    crlb_with(scan, rotation, &mut Workspace::default())
}

/// [`crlb`] reusing `ws`; computed for points centred on `r̄` (as [`solve_with`]) and mapped
/// back with `v = A r̄`.
pub fn crlb_with(
    scan: &ScanRef<'_>,
    rotation: &Matrix3<f64>,
    ws: &mut Workspace,
) -> Result<Matrix6<f64>> {
    let Workspace { prep, b, r } = ws;
    let rbar = centre_into(scan.r, r);
    centre_into(scan.b, b); // b does not enter the bound
    let centred = ScanRef {
        b,
        r,
        cov: scan.cov,
        weights: scan.weights,
    };
    prepare(&centred, prep)?;
    let c = crlb_prepared(prep, rotation)?;
    // Mapped back after uncentring, as in `solve_with`.
    Ok(uncentre_covariance(&c, &(rotation * rbar)).map(|v| prep.unscale_covariance(v)))
}

/// The bound of the prepared (centred, rescaled) scan: in the rescaled units.
pub(crate) fn crlb_prepared(prep: &Prepared, rotation: &Matrix3<f64>) -> Result<Matrix6<f64>> {
    check_rotation("rotation", rotation)?;
    // F depends on A and the points only, not on t or the residuals: evaluate at t = 0 (on
    // the rescaled covariances, whose F is within float64's range).
    let mut e = Eval::default();
    evaluate_into(prep, rotation, &Vector3::zeros(), true, &mut e)?;
    let rc = rcond_equilibrated(&e.normal);
    if !(rc >= RCOND_DEGENERATE) {
        return Err(degenerate());
    }
    // The bound of the rescaled scan: `crlb_with` maps it back.
    Ok(Chol6::new(&e.normal).ok_or_else(degenerate)?.inverse())
}

/// Checks that `m` is a rotation matrix to 1e-6.
pub fn check_rotation(name: &str, m: &Matrix3<f64>) -> Result<()> {
    if !m.iter().all(|v| v.is_finite()) {
        return Err(Error::invalid(name, "contains a non-finite value"));
    }
    let err = (m.transpose() * m - Matrix3::identity()).abs().max();
    if err > 1e-6 || m.determinant() <= 0.0 {
        return Err(Error::invalid(
            name,
            format!(
                "is not a rotation matrix (|AᵀA − I| = {err:.2e}, det = {:.4})",
                m.determinant()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::{Cov, ScanRef};
    use crate::lanes::{evaluate_blocks, evaluate_blocks_baseline};
    use crate::math::exp_so3;

    #[test]
    fn vectorised_pass_matches_the_scalar_reference() {
        for n in [3usize, 4, 5, 8, 13] {
            let b: Vec<[f64; 3]> = (0..n)
                .map(|i| {
                    [
                        (i as f64).sin() * 5.0,
                        (2.0 * i as f64).cos() * 3.0,
                        i as f64 * 0.5,
                    ]
                })
                .collect();
            let r: Vec<[f64; 3]> = (0..n)
                .map(|i| {
                    [
                        (1.3 * i as f64).cos() * 4.0,
                        (i as f64).sin(),
                        2.0 - i as f64 * 0.3,
                    ]
                })
                .collect();
            let cov: Vec<[f64; 36]> = (0..n)
                .map(|i| {
                    let l = Matrix6::from_fn(|a, c| {
                        if a >= c {
                            ((a * 6 + c + i) as f64).sin() * 0.1 + if a == c { 0.3 } else { 0.0 }
                        } else {
                            0.0
                        }
                    });
                    let m = l * l.transpose();
                    let mut o = [0.0; 36];
                    for a in 0..6 {
                        for c in 0..6 {
                            o[6 * a + c] = m[(a, c)];
                        }
                    }
                    o
                })
                .collect();
            let scan = ScanRef {
                b: &b,
                r: &r,
                cov: Cov::Full(&cov),
                weights: None,
            };
            let mut prep = Prepared::default();
            prepare(&scan, &mut prep).unwrap();
            assert!(prep.cross);
            let a = exp_so3(&Vector3::new(0.3, -0.7, 1.1));
            let t = Vector3::new(0.5, -1.0, 2.0);
            let points = crate::lanes::unpack(&prep.blocks, n);
            let reference = accumulate::<true, true>(&points, &a, &t).unwrap();
            let mut out = Eval::default();
            evaluate_blocks(&prep.blocks, &a, &t, true, true, &mut out).unwrap();
            let (cost, g, f) = (out.cost, out.gradient, out.normal);
            assert!((cost - reference.cost).abs() <= 1e-12 * reference.cost.abs());
            assert!((g - reference.gradient).norm() <= 1e-12 * reference.gradient.norm());
            assert!((f - reference.normal).norm() <= 1e-12 * reference.normal.norm());
            // The AVX2 and baseline code paths agree bit for bit (no fused multiply-add).
            let mut base = Eval::default();
            evaluate_blocks_baseline(&prep.blocks, &a, &t, true, true, &mut base).unwrap();
            assert_eq!(base, out);
            let no_cross = accumulate::<false, true>(&points, &a, &t).unwrap();
            let mut nc = Eval::default();
            evaluate_blocks(&prep.blocks, &a, &t, false, true, &mut nc).unwrap();
            let (c2, g2, f2) = (nc.cost, nc.gradient, nc.normal);
            assert!((c2 - no_cross.cost).abs() <= 1e-12 * no_cross.cost.abs());
            assert!((g2 - no_cross.gradient).norm() <= 1e-12 * no_cross.gradient.norm());
            assert!((f2 - no_cross.normal).norm() <= 1e-12 * no_cross.normal.norm());
        }
    }
}
