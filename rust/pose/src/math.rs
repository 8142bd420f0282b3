//! Small fixed-size linear algebra used by the solver: skew matrices, the SO(3) exponential,
//! symmetric 3x3 inverses with an SPD check, a 4x4 symmetric Jacobi eigensolver (for the
//! Davenport/Horn q-method), re-orthonormalisation and quaternion conversion.
//!
//! Everything is stack-only. Symmetric 3x3 matrices are stored as their six upper entries
//! `[xx, xy, xz, yy, yz, zz]`.

use std::ops::{Add, Mul, Sub};

use nalgebra::{Matrix3, Matrix4, Matrix6, Rotation3, UnitQuaternion, Vector3, Vector6};

/// Symmetric 3x3 matrix as `[xx, xy, xz, yy, yz, zz]`.
pub type Sym3 = [f64; 6];

/// `[v×]`, the cross-product matrix: `[v×] w = v × w`.
#[inline]
pub fn skew(v: &Vector3<f64>) -> Matrix3<f64> {
    Matrix3::new(0.0, -v.z, v.y, v.z, 0.0, -v.x, -v.y, v.x, 0.0)
}

/// `exp([θ×])` by Rodrigues' formula, accurate for tiny and large angles alike.
pub fn exp_so3(theta: &Vector3<f64>) -> Matrix3<f64> {
    let angle2 = theta.norm_squared();
    let k = skew(theta);
    let (a, b) = if angle2 < 1e-8 {
        // Taylor series: sin x / x and (1 - cos x) / x^2, error below 1e-20 here.
        (
            1.0 - angle2 / 6.0 * (1.0 - angle2 / 20.0),
            0.5 - angle2 / 24.0 * (1.0 - angle2 / 30.0),
        )
    } else {
        let angle = angle2.sqrt();
        (angle.sin() / angle, (1.0 - angle.cos()) / angle2)
    };
    Matrix3::identity() + k * a + k * k * b
}

/// The rotation vector `θ` with `exp([θ×]) = m` (`|θ| <= π`), for a rotation matrix `m`.
pub fn log_so3(m: &Matrix3<f64>) -> Vector3<f64> {
    let q = UnitQuaternion::from_rotation_matrix(&Rotation3::from_matrix_unchecked(*m));
    q.scaled_axis()
}

/// The closest rotation (in Frobenius norm) to `m`: `U diag(1, 1, det(U Vᵀ)) Vᵀ`.
pub fn orthonormalize(m: &Matrix3<f64>) -> Matrix3<f64> {
    let svd = m.svd(true, true);
    let (u, vt) = match (svd.u, svd.v_t) {
        (Some(u), Some(vt)) => (u, vt),
        _ => return *m, // unreachable: both factors were requested
    };
    let d = (u * vt).determinant().signum();
    u * Matrix3::from_diagonal(&Vector3::new(1.0, 1.0, d)) * vt
}

/// Unit quaternion of a rotation matrix, scalar-last `[x, y, z, w]` with `w >= 0` (and, when
/// `w == 0`, the first non-zero of `x, y, z` positive: scipy's canonical form).
pub fn quaternion_xyzw(m: &Matrix3<f64>) -> [f64; 4] {
    let q = UnitQuaternion::from_rotation_matrix(&Rotation3::from_matrix_unchecked(*m));
    let c = q.coords; // nalgebra stores [i, j, k, w]
    let mut out = [c[0], c[1], c[2], c[3]];
    let first = out[..3].iter().copied().find(|v| *v != 0.0).unwrap_or(0.0);
    if out[3] < 0.0 || (out[3] == 0.0 && first < 0.0) {
        for v in &mut out {
            *v = -*v;
        }
    }
    out
}

/// `2^e` for `e` in `-1022..=1023` (a normal number, built from its bits).
pub fn pow2(e: i32) -> f64 {
    debug_assert!((-1022..=1023).contains(&e));
    f64::from_bits(((e + 1023) as u64) << 52)
}

/// `x · 2^e` for any `e`: exact unless the result leaves float64's range (then it is ±inf,
/// or rounded into the subnormals or to 0). Powers of two are how the scans' covariances are
/// rescaled, so that the rescaling itself never rounds.
pub fn ldexp(mut x: f64, e: i32) -> f64 {
    // Beyond ±2200 every finite x over- or underflows; the clamp bounds the loops.
    let mut e = e.clamp(-2200, 2200);
    while e > 1000 {
        x *= pow2(1000);
        e -= 1000;
    }
    while e < -1000 {
        x *= pow2(-1000);
        e += 1000;
    }
    x * pow2(e)
}

/// `floor(log2 x)` for a positive finite `x` (subnormals included).
pub fn log2_floor(x: f64) -> i32 {
    debug_assert!(x > 0.0 && x.is_finite());
    let biased = ((x.to_bits() >> 52) & 0x7ff) as i32;
    if biased == 0 {
        // Subnormal: scale into the normals first.
        return log2_floor(x * pow2(64)) - 64;
    }
    biased - 1023
}

/// Cofactors of the symmetric 3x3 matrix `s` (its adjugate, upper entries, in [`Sym3`]
/// order) and its determinant by expansion along the first row. Generic over the element type
/// so that the scalar code and the four-lane code of [`crate::lanes`] share one formula (the
/// same operations in the same order, hence the same rounding).
#[inline(always)]
pub fn sym3_cofactors<T>(s: &[T; 6]) -> ([T; 6], T)
where
    T: Copy + Add<Output = T> + Sub<Output = T> + Mul<Output = T>,
{
    let [s00, s01, s02, s11, s12, s22] = *s;
    let c = [
        s11 * s22 - s12 * s12,
        s02 * s12 - s01 * s22,
        s01 * s12 - s02 * s11,
        s00 * s22 - s02 * s02,
        s01 * s02 - s00 * s12,
        s00 * s11 - s01 * s01,
    ];
    let det = s00 * c[0] + s01 * c[1] + s02 * c[2];
    (c, det)
}

/// Inverse of the symmetric 3x3 matrix `s` by cofactors, or `None` when `s` is not
/// (numerically) positive definite (Sylvester's criterion on the leading minors, with the
/// determinant also required to exceed `1e-14` of the diagonal product: the matrix would
/// otherwise have a condition number beyond ~1e14 and its inverse would be noise).
#[inline(always)]
pub fn sym3_inverse_spd(s: &Sym3) -> Option<Sym3> {
    let [s00, _, _, s11, _, s22] = *s;
    let ([c00, c01, c02, c11, c12, c22], det) = sym3_cofactors(s);
    // `!(x > 0)` also rejects NaN.
    if !(s00 > 0.0 && c22 > 0.0 && det > 1e-14 * (s00 * s11 * s22)) {
        return None;
    }
    let inv = 1.0 / det;
    Some([
        c00 * inv,
        c01 * inv,
        c02 * inv,
        c11 * inv,
        c12 * inv,
        c22 * inv,
    ])
}

/// `s v` for a symmetric `s`.
#[inline(always)]
pub fn sym3_mul(s: &Sym3, v: &[f64; 3]) -> [f64; 3] {
    [
        s[0] * v[0] + s[1] * v[1] + s[2] * v[2],
        s[1] * v[0] + s[3] * v[1] + s[4] * v[2],
        s[2] * v[0] + s[4] * v[1] + s[5] * v[2],
    ]
}

/// Full matrix of a [`Sym3`].
pub fn sym3_full(s: &Sym3) -> Matrix3<f64> {
    Matrix3::new(s[0], s[1], s[2], s[1], s[3], s[4], s[2], s[4], s[5])
}

/// Upper entries of a symmetric matrix (the lower triangle is ignored).
pub fn sym3_from(m: &Matrix3<f64>) -> Sym3 {
    [
        m[(0, 0)],
        m[(0, 1)],
        m[(0, 2)],
        m[(1, 1)],
        m[(1, 2)],
        m[(2, 2)],
    ]
}

/// Eigen-decomposition of a symmetric 4x4 matrix by cyclic Jacobi rotations.
///
/// Returns the eigenvalues (unsorted) and the orthogonal matrix whose columns are the
/// eigenvectors. Jacobi is used rather than a QR method because it is short, branch-light
/// and gives eigenvectors orthogonal to machine precision even for clustered eigenvalues.
pub fn jacobi_eigen4(m: &Matrix4<f64>) -> ([f64; 4], Matrix4<f64>) {
    let mut a = *m;
    let mut v = Matrix4::<f64>::identity();
    let scale = a.iter().fold(0.0f64, |acc, x| acc.max(x.abs()));
    if scale == 0.0 || !scale.is_finite() {
        return ([a[(0, 0)], a[(1, 1)], a[(2, 2)], a[(3, 3)]], v);
    }
    for _sweep in 0..30 {
        let mut off = 0.0;
        for p in 0..3 {
            for q in (p + 1)..4 {
                off += a[(p, q)] * a[(p, q)];
            }
        }
        if off <= (1e-18 * scale) * (1e-18 * scale) {
            break;
        }
        for p in 0..3 {
            for q in (p + 1)..4 {
                let apq = a[(p, q)];
                if apq == 0.0 {
                    continue;
                }
                // Rotation angle that zeroes a[p][q] (Golub & Van Loan, Alg. 8.5.1).
                let tau = (a[(q, q)] - a[(p, p)]) / (2.0 * apq);
                let t = tau.signum() / (tau.abs() + (1.0 + tau * tau).sqrt());
                let t = if tau == 0.0 { 1.0 } else { t };
                let c = 1.0 / (1.0 + t * t).sqrt();
                let s = t * c;
                for k in 0..4 {
                    let akp = a[(k, p)];
                    let akq = a[(k, q)];
                    a[(k, p)] = c * akp - s * akq;
                    a[(k, q)] = s * akp + c * akq;
                }
                for k in 0..4 {
                    let apk = a[(p, k)];
                    let aqk = a[(q, k)];
                    a[(p, k)] = c * apk - s * aqk;
                    a[(q, k)] = s * apk + c * aqk;
                }
                for k in 0..4 {
                    let vkp = v[(k, p)];
                    let vkq = v[(k, q)];
                    v[(k, p)] = c * vkp - s * vkq;
                    v[(k, q)] = s * vkp + c * vkq;
                }
            }
        }
    }
    ([a[(0, 0)], a[(1, 1)], a[(2, 2)], a[(3, 3)]], v)
}

/// Rotation matrix of a unit quaternion given as `(w, x, y, z)` (Hamilton convention, the
/// same as scipy's `Rotation.from_quat([x, y, z, w]).as_matrix()`).
pub fn rotation_from_wxyz(w: f64, x: f64, y: f64, z: f64) -> Matrix3<f64> {
    let n = (w * w + x * x + y * y + z * z).sqrt();
    let (w, x, y, z) = (w / n, x / n, y / n, z / n);
    Matrix3::new(
        1.0 - 2.0 * (y * y + z * z),
        2.0 * (x * y - w * z),
        2.0 * (x * z + w * y),
        2.0 * (x * y + w * z),
        1.0 - 2.0 * (x * x + z * z),
        2.0 * (y * z - w * x),
        2.0 * (x * z - w * y),
        2.0 * (y * z + w * x),
        1.0 - 2.0 * (x * x + y * y),
    )
}

/// Cholesky factorisation `M = L Lᵀ` of a 6x6 symmetric positive definite matrix, hand-
/// written for the solver's three uses per scan (the step, the condition check, the
/// covariance): fixed-size loops the compiler unrolls, no allocation, no generic dispatch.
#[derive(Debug, Clone, Copy)]
pub struct Chol6 {
    l: [[f64; 6]; 6],
    inv_diag: [f64; 6],
}

impl Chol6 {
    /// Factorises `m` (its lower triangle is read); `None` unless positive definite.
    #[inline]
    pub fn new(m: &Matrix6<f64>) -> Option<Self> {
        let mut l = [[0.0f64; 6]; 6];
        let mut inv_diag = [0.0f64; 6];
        for j in 0..6 {
            let mut d = m[(j, j)];
            for k in 0..j {
                d -= l[j][k] * l[j][k];
            }
            if !(d > 0.0) {
                return None;
            }
            let ljj = d.sqrt();
            l[j][j] = ljj;
            let inv = 1.0 / ljj;
            inv_diag[j] = inv;
            for i in (j + 1)..6 {
                let mut v = m[(i, j)];
                for k in 0..j {
                    v -= l[i][k] * l[j][k];
                }
                l[i][j] = v * inv;
            }
        }
        Some(Chol6 { l, inv_diag })
    }

    /// `M⁻¹ b`.
    #[inline]
    pub fn solve(&self, b: &Vector6<f64>) -> Vector6<f64> {
        let mut y = [0.0f64; 6];
        for i in 0..6 {
            let mut v = b[i];
            for k in 0..i {
                v -= self.l[i][k] * y[k];
            }
            y[i] = v * self.inv_diag[i];
        }
        let mut x = [0.0f64; 6];
        for i in (0..6).rev() {
            let mut v = y[i];
            for k in (i + 1)..6 {
                v -= self.l[k][i] * x[k];
            }
            x[i] = v * self.inv_diag[i];
        }
        Vector6::from(x)
    }

    /// `M⁻¹` (symmetric).
    pub fn inverse(&self) -> Matrix6<f64> {
        // L⁻¹ (lower triangular), then M⁻¹ = L⁻ᵀ L⁻¹.
        let mut li = [[0.0f64; 6]; 6];
        for j in 0..6 {
            li[j][j] = self.inv_diag[j];
            for i in (j + 1)..6 {
                let mut v = 0.0;
                for k in j..i {
                    v -= self.l[i][k] * li[k][j];
                }
                li[i][j] = v * self.inv_diag[i];
            }
        }
        let mut out = Matrix6::zeros();
        for i in 0..6 {
            for j in i..6 {
                let mut v = 0.0;
                for k in j..6 {
                    v += li[k][i] * li[k][j];
                }
                out[(i, j)] = v;
                out[(j, i)] = v;
            }
        }
        out
    }
}

/// Reciprocal 1-norm condition number of an SPD 6x6 matrix after symmetric diagonal
/// (Jacobi) equilibration, `1 / (‖D F D‖₁ ‖(D F D)⁻¹‖₁)` with `D = diag(F)^{-1/2}`.
/// Equilibration makes the number independent of units (radians vs metres) and of the
/// overall noise scale. Returns 0 when the matrix is not positive definite.
pub fn rcond_equilibrated(f: &Matrix6<f64>) -> f64 {
    let mut d = [0.0; 6];
    for (k, dk) in d.iter_mut().enumerate() {
        let fkk = f[(k, k)];
        if !(fkk > 0.0) || !fkk.is_finite() {
            return 0.0;
        }
        *dk = 1.0 / fkk.sqrt();
    }
    let fs = Matrix6::from_fn(|i, j| f[(i, j)] * d[i] * d[j]);
    let Some(ch) = Chol6::new(&fs) else {
        return 0.0;
    };
    let inv = ch.inverse();
    let norm1 = |m: &Matrix6<f64>| {
        (0..6)
            .map(|j| m.column(j).abs().sum())
            .fold(0.0f64, f64::max)
    };
    let r = 1.0 / (norm1(&fs) * norm1(&inv));
    if r.is_finite() {
        r
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ldexp_and_log2_floor_cover_the_whole_range() {
        use super::{ldexp, log2_floor};
        for &(x, e) in &[
            (1.5, 0),
            (1.5, 1023),
            (0.75, -1074),
            (1.0, -1075),
            (3.0, 2000),
        ] {
            let want = x * 2f64.powi(e.clamp(-1000, 1000)) * 2f64.powi(e - e.clamp(-1000, 1000));
            assert_eq!(ldexp(x, e), want, "{x} * 2^{e}");
        }
        assert_eq!(ldexp(1.0, -1074), f64::from_bits(1));
        assert_eq!(ldexp(1.0, i32::MAX), f64::INFINITY);
        assert_eq!(ldexp(1.0, i32::MIN), 0.0);
        assert_eq!(ldexp(ldexp(1.25, -1060), 1060), 1.25);
        for &(x, want) in &[(1.0, 0), (1.999, 0), (2.0, 1), (0.3, -2), (f64::MAX, 1023)] {
            assert_eq!(log2_floor(x), want, "{x}");
        }
        assert_eq!(log2_floor(f64::from_bits(1)), -1074);
        assert_eq!(log2_floor(f64::MIN_POSITIVE), -1022);
        assert_eq!(log2_floor(f64::MIN_POSITIVE / 3.0), -1024);
    }

    use super::*;

    #[test]
    fn exp_and_log_are_inverse() {
        for theta in [
            Vector3::new(1e-9, -2e-9, 3e-10),
            Vector3::new(0.3, -0.2, 0.1),
            Vector3::new(0.0, 0.0, std::f64::consts::PI - 1e-7),
            Vector3::new(1.2, 1.3, -1.0),
        ] {
            let r = exp_so3(&theta);
            assert!((r.transpose() * r - Matrix3::identity()).norm() < 1e-14);
            assert!((r.determinant() - 1.0).abs() < 1e-14);
            assert!((log_so3(&r) - theta).norm() < 1e-12, "{theta:?}");
        }
    }

    #[test]
    fn exp_matches_nalgebra() {
        let theta = Vector3::new(0.4, -1.1, 0.7);
        let ours = exp_so3(&theta);
        let theirs = Rotation3::new(theta).into_inner();
        assert!((ours - theirs).norm() < 1e-14);
    }

    #[test]
    fn sym_inverse() {
        let m = Matrix3::new(4.0, 1.0, 0.5, 1.0, 3.0, -0.2, 0.5, -0.2, 2.0);
        let inv = sym3_full(&sym3_inverse_spd(&sym3_from(&m)).unwrap());
        assert!((inv * m - Matrix3::identity()).norm() < 1e-14);
        // Indefinite and singular matrices are rejected.
        assert!(sym3_inverse_spd(&[1.0, 2.0, 0.0, 1.0, 0.0, 1.0]).is_none());
        assert!(sym3_inverse_spd(&[1.0, 1.0, 0.0, 1.0, 0.0, 1.0]).is_none());
        assert!(sym3_inverse_spd(&[f64::NAN, 0.0, 0.0, 1.0, 0.0, 1.0]).is_none());
    }

    #[test]
    fn jacobi_diagonalises() {
        let m = Matrix4::new(
            2.0, 1.0, 0.3, -0.5, 1.0, -1.0, 0.7, 0.2, 0.3, 0.7, 0.5, 0.1, -0.5, 0.2, 0.1, 3.0,
        );
        let (vals, vecs) = jacobi_eigen4(&m);
        assert!((vecs.transpose() * vecs - Matrix4::identity()).norm() < 1e-14);
        let recon =
            vecs * Matrix4::from_diagonal(&nalgebra::Vector4::from(vals)) * vecs.transpose();
        assert!((recon - m).norm() < 1e-13);
        // Repeated eigenvalues.
        let (vals, vecs) = jacobi_eigen4(&Matrix4::from_diagonal(&nalgebra::Vector4::new(
            1.0, 1.0, 2.0, 2.0,
        )));
        assert_eq!(vals, [1.0, 1.0, 2.0, 2.0]);
        assert_eq!(vecs, Matrix4::identity());
    }

    #[test]
    fn quaternion_convention_is_scipy_scalar_last() {
        // 90 degrees about z: scipy gives [0, 0, sin 45, cos 45].
        let m = exp_so3(&Vector3::new(0.0, 0.0, std::f64::consts::FRAC_PI_2));
        let q = quaternion_xyzw(&m);
        let h = std::f64::consts::FRAC_1_SQRT_2;
        assert!((q[2] - h).abs() < 1e-15 && (q[3] - h).abs() < 1e-15 && q[0].abs() < 1e-15);
        let back = rotation_from_wxyz(q[3], q[0], q[1], q[2]);
        assert!((back - m).norm() < 1e-15);
        // Exact half turn about x: w == 0 exactly, the first non-zero component positive.
        let m = Matrix3::from_diagonal(&Vector3::new(1.0, -1.0, -1.0));
        assert_eq!(quaternion_xyzw(&m), [1.0, 0.0, 0.0, 0.0]);
        // Random rotations: w >= 0 and the matrix round-trips.
        for k in 0..50 {
            let x = k as f64;
            let m = exp_so3(&Vector3::new(
                (1.3 * x).sin() * 3.0,
                (0.7 * x).cos() * 2.0,
                x.sin(),
            ));
            let q = quaternion_xyzw(&m);
            assert!(q[3] >= 0.0);
            assert!((rotation_from_wxyz(q[3], q[0], q[1], q[2]) - m).norm() < 1e-14);
        }
    }

    #[test]
    fn orthonormalize_projects_onto_so3() {
        let r = exp_so3(&Vector3::new(0.2, 0.5, -0.3));
        let noisy = r + Matrix3::from_fn(|i, j| 1e-6 * ((i * 3 + j) as f64).sin());
        let o = orthonormalize(&noisy);
        assert!((o.transpose() * o - Matrix3::identity()).norm() < 1e-14);
        assert!((o - r).norm() < 1e-5);
    }

    #[test]
    fn chol6_matches_nalgebra() {
        let a = Matrix6::from_fn(|i, j| ((i * 7 + j * 3) as f64).sin());
        let m = a * a.transpose() + Matrix6::identity() * 0.1;
        let ours = Chol6::new(&m).unwrap();
        let b = Vector6::new(1.0, -2.0, 0.5, 3.0, 0.0, 1.5);
        assert!((m * ours.solve(&b) - b).norm() < 1e-10);
        assert!((ours.inverse() * m - Matrix6::identity()).norm() < 1e-10);
        assert!(Chol6::new(&(-m)).is_none());
    }

    #[test]
    fn rcond_flags_singular() {
        let mut f = Matrix6::<f64>::identity();
        assert!((rcond_equilibrated(&f) - 1.0).abs() < 1e-15);
        f[(0, 0)] = 1e6; // scaling alone is removed by equilibration
        assert!((rcond_equilibrated(&f) - 1.0).abs() < 1e-15);
        let v = nalgebra::Vector6::new(1.0, 2.0, 3.0, 4.0, 5.0, 6.0);
        let singular = v * v.transpose() + Matrix6::from_diagonal_element(1e-20);
        assert!(rcond_equilibrated(&singular) < 1e-12);
    }
}
