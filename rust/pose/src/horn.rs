//! Weighted absolute orientation (Kabsch / Horn, no scale) by the Davenport q-method.
//!
//! Minimises `Σ w_i |b_i − A r_i − t|²`. With weighted centroids `b̄, r̄` and
//! `B = Σ w_i (b_i − b̄)(r_i − r̄)ᵀ`, the optimal `A` maximises `tr(Aᵀ B)`; its quaternion is
//! the eigenvector of the largest eigenvalue of Horn's symmetric 4x4 matrix built from `B`
//! (so `det A = +1` by construction, no reflection fix needed), and `t = b̄ − A r̄`.

use maleki_common::{Error, Result};
use nalgebra::{Matrix3, Matrix4, Vector3};

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
    let mut sw = 0.0;
    let mut bc = [0.0; 3];
    let mut rc = [0.0; 3];
    for i in 0..n {
        let (bi, ri, wi) = pt(i);
        sw += wi;
        for k in 0..3 {
            bc[k] += wi * bi[k];
            rc[k] += wi * ri[k];
        }
    }
    for k in 0..3 {
        bc[k] /= sw;
        rc[k] /= sw;
    }
    // m[x][y] = Σ w (r − r̄)_x (b − b̄)_y: Horn's S matrix (source r, target b).
    let mut m = [[0.0; 3]; 3];
    for i in 0..n {
        let (bi, ri, wi) = pt(i);
        let dr = [ri[0] - rc[0], ri[1] - rc[1], ri[2] - rc[2]];
        let db = [wi * (bi[0] - bc[0]), wi * (bi[1] - bc[1]), wi * (bi[2] - bc[2])];
        for x in 0..3 {
            for y in 0..3 {
                m[x][y] += dr[x] * db[y];
            }
        }
    }
    let [[sxx, sxy, sxz], [syx, syy, syz], [szx, szy, szz]] = m;
    // Horn (1987), eq. for N; quaternion order (w, x, y, z).
    let k = Matrix4::new(
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
    );
    let (vals, vecs) = jacobi_eigen4(&k);
    let mut order = [0usize, 1, 2, 3];
    order.sort_by(|&i, &j| vals[j].total_cmp(&vals[i]));
    let top = order[0];
    let q = vecs.column(top);
    let rotation = rotation_from_wxyz(q[0], q[1], q[2], q[3]);
    let scale = k.iter().fold(0.0f64, |acc, v| acc.max(v.abs()));
    let gap = if scale > 0.0 { (vals[top] - vals[order[1]]) / scale } else { 0.0 };
    let bbar = Vector3::from(bc);
    let rbar = Vector3::from(rc);
    Horn {
        rotation,
        translation: bbar - rotation * rbar,
        gap,
    }
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
    let n = b.len();
    if r.len() != n {
        return Err(Error::invalid("r", format!("has {} points but b has {n}", r.len())));
    }
    if n < 3 {
        return Err(Error::invalid("b", format!("needs at least 3 correspondences, got {n}")));
    }
    for (name, pts) in [("b", b), ("r", r)] {
        if let Some(i) = pts.iter().position(|p| !p.iter().all(|v| v.is_finite())) {
            return Err(Error::invalid(name, format!("point {i} is not finite: {:?}", pts[i])));
        }
    }
    if let Some(w) = weights {
        if w.len() != n {
            return Err(Error::invalid("weights", format!("has {} entries but there are {n} points", w.len())));
        }
        if let Some(i) = w.iter().position(|v| !(v.is_finite() && *v > 0.0)) {
            return Err(Error::invalid("weights", format!("weights[{i}] = {} must be positive and finite", w[i])));
        }
    }
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
        let bc: Vector3<f64> = b.iter().zip(w).map(|(p, wi)| Vector3::from(*p) * *wi).sum::<Vector3<f64>>() / sw;
        let rc: Vector3<f64> = r.iter().zip(w).map(|(p, wi)| Vector3::from(*p) * *wi).sum::<Vector3<f64>>() / sw;
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
        let r: Vec<[f64; 3]> = (0..7).map(|i| {
            let x = i as f64;
            [x.sin() * 3.0, (1.7 * x).cos() * 2.0, x * 0.3 - 1.0]
        }).collect();
        let b: Vec<[f64; 3]> = r.iter().enumerate().map(|(i, p)| {
            let v = a * Vector3::from(*p) + t + Vector3::new(0.01 * (i as f64).cos(), -0.02 * (3.0 * i as f64).sin(), 0.015);
            [v.x, v.y, v.z]
        }).collect();
        let w: Vec<f64> = (0..7).map(|i| 1.0 + i as f64).collect();
        let (ah, _) = absolute_orientation(&b, &r, Some(&w)).unwrap();
        assert!((ah - svd_kabsch(&b, &r, &w)).norm() < 1e-12);
    }

    #[test]
    fn exact_near_half_turn_and_collinear_degenerate() {
        let a = exp_so3(&Vector3::new(0.0, std::f64::consts::PI - 1e-9, 0.0));
        let t = Vector3::new(0.5, 0.5, -3.0);
        let r = [[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 3.0], [1.0, 1.0, 1.0]];
        let b: Vec<[f64; 3]> = r.iter().map(|p| {
            let v = a * Vector3::from(*p) + t;
            [v.x, v.y, v.z]
        }).collect();
        let (ah, th) = absolute_orientation(&b, &r, None).unwrap();
        assert!((ah - a).norm() < 1e-13 && (th - t).norm() < 1e-13);
        let line = [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [2.0, 2.0, 2.0]];
        assert!(matches!(absolute_orientation(&line, &line, None), Err(Error::Degenerate(_))));
    }
}
