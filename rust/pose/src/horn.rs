//! Weighted absolute orientation (Kabsch / Horn, no scale) by the Davenport q-method.
//!
//! Minimises `Σ w_i |b_i − A r_i − t|²`. With weighted centroids `b̄, r̄` and
//! `B = Σ w_i (b_i − b̄)(r_i − r̄)ᵀ`, the optimal `A` maximises `tr(Aᵀ B)`; its quaternion is
//! the eigenvector of the largest eigenvalue of Horn's symmetric 4x4 matrix built from `B`
//! (so `det A = +1` by construction, no reflection fix needed), and `t = b̄ − A r̄`.

use maleki_common::{Error, Result};
use nalgebra::{Matrix3, Matrix4, Vector3};

use crate::input::check_correspondences;
use crate::math::{jacobi_eigen4, rotation_from_wxyz};

/// The result of the q-method: rotation, translation, and the relative gap between the two
/// largest eigenvalues of Horn's matrix (0 when the rotation is not determined, e.g. for
/// collinear or coincident points).
#[derive(Debug, Clone, Copy)]
pub struct Horn {
    pub rotation: Matrix3<f64>,
    pub translation: Vector3<f64>,
    pub gap: f64,
}

/// Weighted Horn/Kabsch fit of `b ≈ A r + t` with weights `w(i)` (all positive).
pub fn horn_fit(b: &[[f64; 3]], r: &[[f64; 3]], w: impl Fn(usize) -> f64) -> Horn {
    horn_fit_by(b.len(), |i| (b[i], r[i], w(i)))
}

/// [`horn_fit`] reading point `i` as `(b_i, r_i, w_i)` through `pt`, so that callers with
/// another memory layout need not gather the points first.
pub fn horn_fit_by(n: usize, pt: impl Fn(usize) -> ([f64; 3], [f64; 3], f64)) -> Horn {
    // The rotation depends only on the direction of `m` below, so weights and deviations are
    // scaled to at most 1 before their products are summed: coordinates or weights near the
    // ends of the float64 range (1e±150 and beyond) neither overflow nor underflow there.
    let wmax = (0..n).fold(0.0f64, |acc, i| acc.max(pt(i).2));
    let wmax = if wmax > 0.0 && wmax.is_finite() {
        wmax
    } else {
        1.0
    };
    // Weighted centroids as running means (no sum of large coordinates).
    let mut sw = 0.0;
    let mut bc = [0.0; 3];
    let mut rc = [0.0; 3];
    for i in 0..n {
        let (bi, ri, wi) = pt(i);
        let wi = wi / wmax;
        if wi == 0.0 {
            continue;
        }
        sw += wi;
        let f = wi / sw;
        for k in 0..3 {
            bc[k] += f * (bi[k] - bc[k]);
            rc[k] += f * (ri[k] - rc[k]);
        }
    }
    let (mut sr, mut sb) = (0.0f64, 0.0f64);
    for i in 0..n {
        let (bi, ri, _) = pt(i);
        for k in 0..3 {
            sr = sr.max((ri[k] - rc[k]).abs());
            sb = sb.max((bi[k] - bc[k]).abs());
        }
    }
    let sr = if sr > 0.0 && sr.is_finite() { sr } else { 1.0 };
    let sb = if sb > 0.0 && sb.is_finite() { sb } else { 1.0 };
    // m[x][y] = Σ w (r − r̄)_x (b − b̄)_y / (wmax sr sb): Horn's S matrix (source r, target b).
    let mut m = [[0.0; 3]; 3];
    for i in 0..n {
        let (bi, ri, wi) = pt(i);
        let wi = wi / wmax;
        let dr = [
            (ri[0] - rc[0]) / sr,
            (ri[1] - rc[1]) / sr,
            (ri[2] - rc[2]) / sr,
        ];
        let db = [
            wi * ((bi[0] - bc[0]) / sb),
            wi * ((bi[1] - bc[1]) / sb),
            wi * ((bi[2] - bc[2]) / sb),
        ];
        for x in 0..3 {
            for y in 0..3 {
                m[x][y] += dr[x] * db[y];
            }
        }
    }
    let k = horn_matrix(m);
    let (q, gap) = match top_eigenvector_fast(&k) {
        Some(fast) => fast,
        None => {
            let scale = k.iter().fold(0.0f64, |acc, v| acc.max(v.abs()));
            let (vals, vecs) = jacobi_eigen4(&k);
            let mut order = [0usize, 1, 2, 3];
            order.sort_by(|&i, &j| vals[j].total_cmp(&vals[i]));
            let top = order[0];
            let q = vecs.column(top);
            let gap = if scale > 0.0 {
                (vals[top] - vals[order[1]]) / scale
            } else {
                0.0
            };
            ([q[0], q[1], q[2], q[3]], gap)
        }
    };
    let rotation = rotation_from_wxyz(q[0], q[1], q[2], q[3]);
    let bbar = Vector3::from(bc);
    let rbar = Vector3::from(rc);
    Horn {
        rotation,
        translation: bbar - rotation * rbar,
        gap,
    }
}

/// Horn's symmetric 4x4 matrix `N` (Horn 1987) of `m[x][y] = Σ w (r − r̄)_x (b − b̄)_y`, in
/// quaternion order `(w, x, y, z)`: its top eigenvector is the optimal rotation.
fn horn_matrix(m: [[f64; 3]; 3]) -> Matrix4<f64> {
    let [[sxx, sxy, sxz], [syx, syy, syz], [szx, szy, szz]] = m;
    Matrix4::new(
        sxx + syy + szz,
        syz - szy,
        szx - sxz,
        sxy - syx,
        syz - szy,
        sxx - syy - szz,
        sxy + syx,
        szx + sxz,
        szx - sxz,
        sxy + syx,
        -sxx + syy - szz,
        syz + szy,
        sxy - syx,
        szx + sxz,
        syz + szy,
        -sxx - syy + szz,
    )
}

/// Determinant of a 4x4 matrix by Laplace expansion in 2x2 minors (no pivoting needed: only
/// the polynomial's constant term, which Newton's method tolerates to rounding).
fn det4(m: &Matrix4<f64>) -> f64 {
    let s0 = m[(0, 0)] * m[(1, 1)] - m[(1, 0)] * m[(0, 1)];
    let s1 = m[(0, 0)] * m[(1, 2)] - m[(1, 0)] * m[(0, 2)];
    let s2 = m[(0, 0)] * m[(1, 3)] - m[(1, 0)] * m[(0, 3)];
    let s3 = m[(0, 1)] * m[(1, 2)] - m[(1, 1)] * m[(0, 2)];
    let s4 = m[(0, 1)] * m[(1, 3)] - m[(1, 1)] * m[(0, 3)];
    let s5 = m[(0, 2)] * m[(1, 3)] - m[(1, 2)] * m[(0, 3)];
    let c5 = m[(2, 2)] * m[(3, 3)] - m[(3, 2)] * m[(2, 3)];
    let c4 = m[(2, 1)] * m[(3, 3)] - m[(3, 1)] * m[(2, 3)];
    let c3 = m[(2, 1)] * m[(3, 2)] - m[(3, 1)] * m[(2, 2)];
    let c2 = m[(2, 0)] * m[(3, 3)] - m[(3, 0)] * m[(2, 3)];
    let c1 = m[(2, 0)] * m[(3, 2)] - m[(3, 0)] * m[(2, 2)];
    let c0 = m[(2, 0)] * m[(3, 1)] - m[(3, 0)] * m[(2, 1)];
    s0 * c5 - s1 * c4 + s2 * c3 + s3 * c2 - s4 * c1 + s5 * c0
}

fn det3(m: [[f64; 3]; 3]) -> f64 {
    let [[a, b, c], [d, e, f], [g, h, i]] = m;
    a * (e * i - f * h) - b * (d * i - f * g) + c * (d * h - e * g)
}

/// The q-method's eigenvector by the closed form (as in QUEST): the largest root of the
/// characteristic polynomial by Newton's method from an upper bound, then the largest column
/// of `adj(K − λ I)`, which is `Π_{j≠1} (λ₁ − λⱼ) q qᵀ`. Returns the quaternion `(w, x, y, z)`
/// and a lower bound of the relative eigenvalue gap, or `None` when the top eigenvalue is not
/// well separated (then the caller uses the Jacobi solver, which is robust there).
fn top_eigenvector_fast(k: &Matrix4<f64>) -> Option<([f64; 4], f64)> {
    let k2 = k * k;
    let p2 = k2.trace();
    if !(p2 > 0.0) || !p2.is_finite() {
        return None;
    }
    let p3 = (k2 * k).trace();
    let det = det4(k);
    // det(λI − K) = λ⁴ − (p2/2) λ² − (p3/3) λ + det K  (tr K = 0 for Horn's matrix).
    let (c2, c1, c0) = (-0.5 * p2, -p3 / 3.0, det);
    let norm = p2.sqrt(); // ‖K‖_F >= λ_max: Newton from here decreases monotonically.
    let mut lam = norm;
    let mut converged = false;
    for _ in 0..40 {
        let f = ((lam * lam + c2) * lam + c1) * lam + c0;
        let df = (4.0 * lam * lam + 2.0 * c2) * lam + c1;
        if !(df > 0.0) {
            break;
        }
        let step = f / df;
        lam -= step;
        if step.abs() <= 1e-15 * norm {
            converged = true;
            break;
        }
    }
    if !converged {
        return None;
    }
    let m = k - Matrix4::identity() * lam;
    // Columns of the adjugate (symmetric): adj[i][j] = (-1)^(i+j) det(minor(j, i)).
    let minor = |r: usize, c: usize| {
        let rows: [usize; 3] = match r {
            0 => [1, 2, 3],
            1 => [0, 2, 3],
            2 => [0, 1, 3],
            _ => [0, 1, 2],
        };
        let cols: [usize; 3] = match c {
            0 => [1, 2, 3],
            1 => [0, 2, 3],
            2 => [0, 1, 3],
            _ => [0, 1, 2],
        };
        let e = |a: usize, b: usize| m[(rows[a], cols[b])];
        det3([
            [e(0, 0), e(0, 1), e(0, 2)],
            [e(1, 0), e(1, 1), e(1, 2)],
            [e(2, 0), e(2, 1), e(2, 2)],
        ])
    };
    // The diagonal of adj tells which column is largest: adj[j][j] = Π (λ₁−λⱼ) q_j².
    let diag = [minor(0, 0), minor(1, 1), minor(2, 2), minor(3, 3)];
    let j = (0..4)
        .max_by(|&a, &b| diag[a].abs().total_cmp(&diag[b].abs()))
        .unwrap_or(0);
    let mut col = [0.0; 4];
    for (i, ci) in col.iter_mut().enumerate() {
        let sign = if (i + j) % 2 == 0 { 1.0 } else { -1.0 };
        *ci = sign * minor(j, i);
    }
    let cn = (col.iter().map(|v| v * v).sum::<f64>()).sqrt();
    // |Π (λ₁ − λⱼ)| >= cn; demand a well separated top eigenvalue, so that rounding in
    // K − λI (about eps ‖K‖³ in the adjugate) stays below 1e-12 of the result.
    if !(cn >= 1e-3 * norm * norm * norm) {
        return None;
    }
    let scale = k.iter().fold(0.0f64, |acc, v| acc.max(v.abs()));
    // λ₁ − λⱼ <= 2‖K‖_F for every j, so the smallest gap is at least cn / (2‖K‖_F)².
    let gap = cn / (4.0 * p2) / scale;
    Some(([col[0] / cn, col[1] / cn, col[2] / cn, col[3] / cn], gap))
}

/// Relative eigenvalue gap below which the absolute-orientation rotation is declared
/// undetermined (collinear or coincident points).
pub const GAP_DEGENERATE: f64 = 1e-11;

/// Weighted Kabsch/Horn baseline: the `(A, t)` minimising `Σ w_i |b_i − A r_i − t|²`.
///
/// `weights` default to 1. Errors: fewer than 3 points, mismatched lengths, non-finite
/// values, non-positive weights ([`Error::InvalidArgument`]); collinear or coincident points
/// ([`Error::Degenerate`]).
pub fn absolute_orientation(
    b: &[[f64; 3]],
    r: &[[f64; 3]],
    weights: Option<&[f64]>,
) -> Result<(Matrix3<f64>, Vector3<f64>)> {
    check_correspondences(b, r, weights)?;
    let h = match weights {
        Some(w) => horn_fit(b, r, |i| w[i]),
        None => horn_fit(b, r, |_| 1.0),
    };
    if !(h.gap > GAP_DEGENERATE) {
        return Err(Error::Degenerate(
            "the points are collinear or coincident: the rotation about their line is not determined".into(),
        ));
    }
    Ok((h.rotation, h.translation))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::math::exp_so3;

    fn svd_kabsch(b: &[[f64; 3]], r: &[[f64; 3]], w: &[f64]) -> Matrix3<f64> {
        let sw: f64 = w.iter().sum();
        let bc: Vector3<f64> = b
            .iter()
            .zip(w)
            .map(|(p, wi)| Vector3::from(*p) * *wi)
            .sum::<Vector3<f64>>()
            / sw;
        let rc: Vector3<f64> = r
            .iter()
            .zip(w)
            .map(|(p, wi)| Vector3::from(*p) * *wi)
            .sum::<Vector3<f64>>()
            / sw;
        let mut m = Matrix3::zeros();
        for i in 0..b.len() {
            m += (Vector3::from(b[i]) - bc) * (Vector3::from(r[i]) - rc).transpose() * w[i];
        }
        let svd = m.svd(true, true);
        let (u, vt) = (svd.u.unwrap(), svd.v_t.unwrap());
        let d = (u * vt).determinant().signum();
        u * Matrix3::from_diagonal(&Vector3::new(1.0, 1.0, d)) * vt
    }

    #[test]
    fn matches_svd_kabsch_on_noisy_data() {
        let a = exp_so3(&Vector3::new(0.3, -2.0, 1.1));
        let t = Vector3::new(1.0, -2.0, 0.5);
        let r: Vec<[f64; 3]> = (0..7)
            .map(|i| {
                let x = i as f64;
                [x.sin() * 3.0, (1.7 * x).cos() * 2.0, x * 0.3 - 1.0]
            })
            .collect();
        let b: Vec<[f64; 3]> = r
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let v = a * Vector3::from(*p)
                    + t
                    + Vector3::new(
                        0.01 * (i as f64).cos(),
                        -0.02 * (3.0 * i as f64).sin(),
                        0.015,
                    );
                [v.x, v.y, v.z]
            })
            .collect();
        let w: Vec<f64> = (0..7).map(|i| 1.0 + i as f64).collect();
        let (ah, _) = absolute_orientation(&b, &r, Some(&w)).unwrap();
        assert!((ah - svd_kabsch(&b, &r, &w)).norm() < 1e-12);
    }

    #[test]
    fn det4_matches_lu() {
        let m = Matrix4::from_fn(|i, j| {
            ((i * 5 + j * 3) as f64).sin() + if i == j { 2.0 } else { 0.0 }
        });
        assert!((det4(&m) - m.determinant()).abs() < 1e-12 * m.determinant().abs());
    }

    #[test]
    fn fast_eigenvector_agrees_with_jacobi() {
        let mut taken = 0;
        for s in 0..200 {
            let x = s as f64;
            let m = [
                [(1.1 * x).sin(), (2.3 * x).cos(), (0.7 * x).sin() * 0.1],
                [(3.1 * x).cos() * 0.5, (0.3 * x).sin(), (1.9 * x).cos()],
                [(0.9 * x).sin(), (1.3 * x).cos() * 0.01, (2.9 * x).sin()],
            ];
            let k = horn_matrix(m);
            let (vals, vecs) = jacobi_eigen4(&k);
            let top = (0..4).max_by(|&a, &b| vals[a].total_cmp(&vals[b])).unwrap();
            if let Some((q, gap)) = top_eigenvector_fast(&k) {
                taken += 1;
                let dot: f64 = (0..4).map(|i| q[i] * vecs[(i, top)]).sum();
                assert!(
                    (dot.abs() - 1.0).abs() < 1e-13,
                    "case {s}: |q·v| = {}",
                    dot.abs()
                );
                assert!(gap > GAP_DEGENERATE);
            }
        }
        assert!(
            taken > 150,
            "the fast path should handle typical matrices ({taken}/200)"
        );
    }

    #[test]
    fn exact_near_half_turn_and_collinear_degenerate() {
        let a = exp_so3(&Vector3::new(0.0, std::f64::consts::PI - 1e-9, 0.0));
        let t = Vector3::new(0.5, 0.5, -3.0);
        let r = [
            [1.0, 0.0, 0.0],
            [0.0, 2.0, 0.0],
            [0.0, 0.0, 3.0],
            [1.0, 1.0, 1.0],
        ];
        let b: Vec<[f64; 3]> = r
            .iter()
            .map(|p| {
                let v = a * Vector3::from(*p) + t;
                [v.x, v.y, v.z]
            })
            .collect();
        let (ah, th) = absolute_orientation(&b, &r, None).unwrap();
        assert!((ah - a).norm() < 1e-13 && (th - t).norm() < 1e-13);
        let line = [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [2.0, 2.0, 2.0]];
        assert!(matches!(
            absolute_orientation(&line, &line, None),
            Err(Error::Degenerate(_))
        ));
    }
}
