//! Shared generators of the integration tests (deterministic, seeded).
#![allow(dead_code)]

use maleki_common::rng::{standard_normal, stream, uniform01, StreamRng};
use nalgebra::{Cholesky, Matrix3, Matrix6, Vector3, Vector6};

pub struct Rng(pub StreamRng);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(stream(seed, 0))
    }
    pub fn normal(&mut self) -> f64 {
        standard_normal(&mut self.0)
    }
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * uniform01(&mut self.0)
    }
    pub fn vec3(&mut self, s: f64) -> Vector3<f64> {
        Vector3::new(self.normal(), self.normal(), self.normal()) * s
    }
    /// A uniformly distributed rotation (normalised Gaussian quaternion).
    pub fn rotation(&mut self) -> Matrix3<f64> {
        let q =
            nalgebra::Quaternion::new(self.normal(), self.normal(), self.normal(), self.normal());
        nalgebra::UnitQuaternion::from_quaternion(q)
            .to_rotation_matrix()
            .into_inner()
    }
    /// A random SPD 6x6 covariance: anisotropic blocks (std ratio up to `aniso`) with rms
    /// standard deviation `sigma` and cross-correlation `rho` through a random rotation.
    pub fn covariance(&mut self, sigma: f64, aniso: f64, rho: f64) -> Matrix6<f64> {
        let half = |rng: &mut Self| {
            let q = rng.rotation();
            let s = [1.0, aniso.sqrt(), aniso];
            let rms = ((s[0] * s[0] + s[1] * s[1] + s[2] * s[2]) / 3.0).sqrt();
            let d = Vector3::new(s[0], s[1], s[2]) * (sigma / rms);
            q * Matrix3::from_diagonal(&d) * q.transpose() // symmetric square root
        };
        let hb = half(self);
        let hr = half(self);
        let c = self.rotation();
        let mut m = Matrix6::zeros();
        m.fixed_view_mut::<3, 3>(0, 0).copy_from(&(hb * hb));
        m.fixed_view_mut::<3, 3>(3, 3).copy_from(&(hr * hr));
        let br = hb * c * hr * rho;
        m.fixed_view_mut::<3, 3>(0, 3).copy_from(&br);
        m.fixed_view_mut::<3, 3>(3, 0).copy_from(&br.transpose());
        m
    }
    /// A draw from N(0, cov).
    pub fn sample(&mut self, cov: &Matrix6<f64>) -> Vector6<f64> {
        let l = Cholesky::new(*cov).expect("SPD").l();
        let z = Vector6::from_fn(|_, _| self.normal());
        l * z
    }
}

pub fn rows(m: &Matrix6<f64>) -> [f64; 36] {
    let mut out = [0.0; 36];
    for i in 0..6 {
        for j in 0..6 {
            out[6 * i + j] = m[(i, j)];
        }
    }
    out
}

pub fn arr(v: &Vector3<f64>) -> [f64; 3] {
    [v.x, v.y, v.z]
}

/// A scan of `n` landmarks in a ±10 cube with random pose and per-point covariances;
/// `noise` scales the noise actually added (0: noise-free data, same covariances).
pub struct Scan {
    pub a: Matrix3<f64>,
    pub t: Vector3<f64>,
    pub r_true: Vec<[f64; 3]>,
    pub b: Vec<[f64; 3]>,
    pub r: Vec<[f64; 3]>,
    pub cov: Vec<[f64; 36]>,
}

pub fn scan(rng: &mut Rng, n: usize, sigma: f64, rho: f64, noise: f64) -> Scan {
    let a = rng.rotation();
    let t = rng.vec3(5.0);
    let mut out = Scan {
        a,
        t,
        r_true: vec![],
        b: vec![],
        r: vec![],
        cov: vec![],
    };
    for _ in 0..n {
        let r = Vector3::new(
            rng.uniform(-10.0, 10.0),
            rng.uniform(-10.0, 10.0),
            rng.uniform(-10.0, 10.0),
        );
        let c = rng.covariance(sigma, 10.0, rho);
        let z = rng.sample(&c) * noise;
        let b = a * r + t;
        out.r_true.push(arr(&r));
        out.b.push(arr(&(b + z.fixed_rows::<3>(0))));
        out.r.push(arr(&(r + z.fixed_rows::<3>(3))));
        out.cov.push(rows(&c));
    }
    out
}

/// Rotation error vector θ with Â = exp([θ×]) A.
pub fn rot_err(ah: &Matrix3<f64>, a: &Matrix3<f64>) -> Vector3<f64> {
    maleki_pose::math::log_so3(&(ah * a.transpose()))
}
