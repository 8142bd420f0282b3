//! The Gauss-Newton pass over the points, four points at a time.
//!
//! Points are stored in blocks of four, structure-of-arrays ([`Block4`]), and every scalar
//! operation of the per-point algebra (see [`crate::solver`]) is done on `[f64; 4]` lanes
//! ([`F4`]). The compiler turns those into 256-bit vector instructions where the CPU has AVX2
//! (selected at run time) and into 128-bit SSE2 pairs otherwise. Lane arithmetic is plain
//! multiply and add (never fused), so both paths give bitwise identical results.
//!
//! A scan whose point count is not a multiple of four is padded with inert points: `S = I`,
//! and a zero mask on `W`, so they contribute exactly nothing.

use std::ops::{Add, Div, Mul, Sub};

use nalgebra::{Matrix3, Vector3, Vector6};

use crate::input::Point;
use crate::math::sym3_cofactors;
use crate::solver::Eval;

/// Four `f64` lanes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[repr(C, align(32))]
pub struct F4(pub [f64; 4]);

impl F4 {
    #[inline(always)]
    pub fn splat(x: f64) -> Self {
        F4([x; 4])
    }
    /// Lane-wise absolute value.
    #[inline(always)]
    pub fn abs(self) -> Self {
        let a = self.0;
        F4([a[0].abs(), a[1].abs(), a[2].abs(), a[3].abs()])
    }
    /// Lane-wise maximum (`self` where `o` is NaN).
    #[inline(always)]
    pub fn max(self, o: F4) -> Self {
        let m = |a: f64, b: f64| if b > a { b } else { a };
        F4([
            m(self.0[0], o.0[0]),
            m(self.0[1], o.0[1]),
            m(self.0[2], o.0[2]),
            m(self.0[3], o.0[3]),
        ])
    }
    #[inline(always)]
    fn sum(self) -> f64 {
        (self.0[0] + self.0[1]) + (self.0[2] + self.0[3])
    }
}

macro_rules! lanewise {
    ($tr:ident, $f:ident, $op:tt) => {
        impl $tr for F4 {
            type Output = F4;
            #[inline(always)]
            fn $f(self, o: F4) -> F4 {
                F4([self.0[0] $op o.0[0], self.0[1] $op o.0[1], self.0[2] $op o.0[2], self.0[3] $op o.0[3]])
            }
        }
    };
}
lanewise!(Add, add, +);
lanewise!(Sub, sub, -);
lanewise!(Mul, mul, *);
lanewise!(Div, div, /);

/// Four points in structure-of-arrays form (see [`Point`]); `mask` is 1 for real points
/// and 0 for padding.
#[derive(Debug, Clone, Copy, Default)]
pub struct Block4 {
    b: [F4; 3],
    r: [F4; 3],
    bb: [F4; 6],
    rr: [F4; 6],
    br2: [F4; 9],
    mask: F4,
}

impl Block4 {
    /// Four inert padding points (`S = R_bb = I`, mask 0).
    pub fn padding() -> Self {
        let mut blk = Block4::default();
        for k in [0, 3, 5] {
            blk.bb[k] = F4::splat(1.0);
        }
        blk
    }

    /// A block from its lanes (padding lanes must have `mask` 0 and a positive definite `S`).
    pub fn from_lanes(
        b: [F4; 3],
        r: [F4; 3],
        bb: [F4; 6],
        rr: [F4; 6],
        br2: [F4; 9],
        mask: F4,
    ) -> Self {
        Block4 {
            b,
            r,
            bb,
            rr,
            br2,
            mask,
        }
    }

    /// Stores a real point in lane `l` (0..4).
    #[inline]
    pub fn set_lane(&mut self, l: usize, p: &Point) {
        for k in 0..3 {
            self.b[k].0[l] = p.b[k];
            self.r[k].0[l] = p.r[k];
        }
        for k in 0..6 {
            self.bb[k].0[l] = p.bb[k];
            self.rr[k].0[l] = p.rr[k];
        }
        for k in 0..9 {
            self.br2[k].0[l] = p.br2[k];
        }
        self.mask.0[l] = 1.0;
    }

    fn lane(&self, l: usize) -> Point {
        Point {
            b: [self.b[0].0[l], self.b[1].0[l], self.b[2].0[l]],
            r: [self.r[0].0[l], self.r[1].0[l], self.r[2].0[l]],
            bb: std::array::from_fn(|k| self.bb[k].0[l]),
            rr: std::array::from_fn(|k| self.rr[k].0[l]),
            br2: std::array::from_fn(|k| self.br2[k].0[l]),
        }
    }
}

/// The first `n` points stored in `blocks` (for tests and diagnostics).
pub fn unpack(blocks: &[Block4], n: usize) -> Vec<Point> {
    (0..n).map(|i| blocks[i / 4].lane(i % 4)).collect()
}

/// `Ok` when the pass wrote cost, gradient and (when requested) the normal matrix into its
/// output, else the index of a point whose `Sᵢ(A)` is not positive definite.
pub type Pass = std::result::Result<(), usize>;

#[inline(always)]
fn pass<const CROSS: bool, const NORMAL: bool>(
    blocks: &[Block4],
    a: &Matrix3<f64>,
    t: &Vector3<f64>,
    out: &mut Eval,
) -> Pass {
    let m = [
        [
            F4::splat(a[(0, 0)]),
            F4::splat(a[(0, 1)]),
            F4::splat(a[(0, 2)]),
        ],
        [
            F4::splat(a[(1, 0)]),
            F4::splat(a[(1, 1)]),
            F4::splat(a[(1, 2)]),
        ],
        [
            F4::splat(a[(2, 0)]),
            F4::splat(a[(2, 1)]),
            F4::splat(a[(2, 2)]),
        ],
    ];
    let (t0, t1, t2) = (F4::splat(t.x), F4::splat(t.y), F4::splat(t.z));
    let zero = F4::default();
    let half = F4::splat(0.5);
    let one = F4::splat(1.0);
    let tiny = F4::splat(1e-14);
    let mut cost = zero;
    let mut g = [zero; 6];
    let mut ftt = [zero; 6];
    let mut p = [zero; 9];
    let mut fqq = [zero; 6];
    for (bi, blk) in blocks.iter().enumerate() {
        let r = &blk.r;
        let av = [
            m[0][0] * r[0] + m[0][1] * r[1] + m[0][2] * r[2],
            m[1][0] * r[0] + m[1][1] * r[1] + m[1][2] * r[2],
            m[2][0] * r[0] + m[2][1] * r[1] + m[2][2] * r[2],
        ];
        let bt = [blk.b[0] - t0, blk.b[1] - t1, blk.b[2] - t2];
        let e = [bt[0] - av[0], bt[1] - av[1], bt[2] - av[2]];
        // X = A R_rr (− 2 R_br);  S = R_bb + sym(X Aᵀ).
        let rr = &blk.rr;
        let mut x = [[zero; 3]; 3];
        for j in 0..3 {
            x[j][0] = m[j][0] * rr[0] + m[j][1] * rr[1] + m[j][2] * rr[2];
            x[j][1] = m[j][0] * rr[1] + m[j][1] * rr[3] + m[j][2] * rr[4];
            x[j][2] = m[j][0] * rr[2] + m[j][1] * rr[4] + m[j][2] * rr[5];
            if CROSS {
                x[j][0] = x[j][0] - blk.br2[3 * j];
                x[j][1] = x[j][1] - blk.br2[3 * j + 1];
                x[j][2] = x[j][2] - blk.br2[3 * j + 2];
            }
        }
        let dot = |j: usize, k: usize| x[j][0] * m[k][0] + x[j][1] * m[k][1] + x[j][2] * m[k][2];
        let bb = &blk.bb;
        let s = if CROSS {
            [
                bb[0] + dot(0, 0),
                bb[1] + half * (dot(0, 1) + dot(1, 0)),
                bb[2] + half * (dot(0, 2) + dot(2, 0)),
                bb[3] + dot(1, 1),
                bb[4] + half * (dot(1, 2) + dot(2, 1)),
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
        // W = S⁻¹ by cofactors, with Sylvester's SPD check per lane.
        let [s00, _, _, s11, _, s22] = s;
        let ([c00, c01, c02, c11, c12, c22], det) = sym3_cofactors(&s);
        let bound = tiny * (s00 * s11 * s22);
        let mut bad = false;
        for l in 0..4 {
            // `!(x > 0)` also catches NaN.
            bad |= !(s00.0[l] > 0.0 && c22.0[l] > 0.0 && det.0[l] > bound.0[l]);
        }
        if bad {
            let l = (0..4)
                .find(|&l| !(s00.0[l] > 0.0 && c22.0[l] > 0.0 && det.0[l] > bound.0[l]))
                .unwrap_or(0);
            return Err(4 * bi + l);
        }
        let inv = blk.mask * (one / det);
        let w = [
            c00 * inv,
            c01 * inv,
            c02 * inv,
            c11 * inv,
            c12 * inv,
            c22 * inv,
        ];
        let u = [
            w[0] * e[0] + w[1] * e[1] + w[2] * e[2],
            w[1] * e[0] + w[3] * e[1] + w[4] * e[2],
            w[2] * e[0] + w[4] * e[1] + w[5] * e[2],
        ];
        cost = cost + (e[0] * u[0] + e[1] * u[1] + e[2] * u[2]);
        // c = b̃ − t − R_bb u (+ R_br Aᵀ u);  g_θ += u × c,  g_t −= u.
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
            let br = &blk.br2;
            for j in 0..3 {
                c[j] = c[j]
                    + half * (br[3 * j] * atu[0] + br[3 * j + 1] * atu[1] + br[3 * j + 2] * atu[2]);
            }
        }
        g[0] = g[0] + (u[1] * c[2] - u[2] * c[1]);
        g[1] = g[1] + (u[2] * c[0] - u[0] * c[2]);
        g[2] = g[2] + (u[0] * c[1] - u[1] * c[0]);
        g[3] = g[3] - u[0];
        g[4] = g[4] - u[1];
        g[5] = g[5] - u[2];
        if NORMAL {
            for k in 0..6 {
                ftt[k] = ftt[k] + w[k];
            }
            // P = W [a×], row-major: columns a2 W₁ − a1 W₂, a0 W₂ − a2 W₀, a1 W₀ − a0 W₁.
            let (a0, a1, a2) = (av[0], av[1], av[2]);
            let wc = [[w[0], w[1], w[2]], [w[1], w[3], w[4]], [w[2], w[4], w[5]]];
            let mut pp = [zero; 9];
            for row in 0..3 {
                pp[3 * row] = a2 * wc[1][row] - a1 * wc[2][row];
                pp[3 * row + 1] = a0 * wc[2][row] - a2 * wc[0][row];
                pp[3 * row + 2] = a1 * wc[0][row] - a0 * wc[1][row];
            }
            for k in 0..9 {
                p[k] = p[k] + pp[k];
            }
            // −[a×] P, upper triangle.
            fqq[0] = fqq[0] + (a2 * pp[3] - a1 * pp[6]);
            fqq[1] = fqq[1] + (a2 * pp[4] - a1 * pp[7]);
            fqq[2] = fqq[2] + (a2 * pp[5] - a1 * pp[8]);
            fqq[3] = fqq[3] + (a0 * pp[7] - a2 * pp[1]);
            fqq[4] = fqq[4] + (a0 * pp[8] - a2 * pp[2]);
            fqq[5] = fqq[5] + (a1 * pp[2] - a0 * pp[5]);
        }
    }
    // Written into the caller's buffer: the solver keeps two and flips between them, so no
    // 344-byte result is copied around per iteration.
    out.cost = 0.5 * cost.sum();
    out.gradient = Vector6::from_fn(|k, _| g[k].sum());
    if NORMAL {
        let normal = &mut out.normal;
        const IDX: [[usize; 3]; 3] = [[0, 1, 2], [1, 3, 4], [2, 4, 5]];
        for k in 0..3 {
            for l in 0..3 {
                normal[(k, l)] = fqq[IDX[k][l]].sum();
                normal[(k + 3, l + 3)] = ftt[IDX[k][l]].sum();
                // F_θt = Σ [a×] W = −Σ Pᵀ.
                let v = -p[3 * l + k].sum();
                normal[(k, l + 3)] = v;
                normal[(l + 3, k)] = v;
            }
        }
    }
    Ok(())
}

fn dispatch_generic(
    blocks: &[Block4],
    a: &Matrix3<f64>,
    t: &Vector3<f64>,
    cross: bool,
    normal: bool,
    out: &mut Eval,
) -> Pass {
    match (cross, normal) {
        (true, true) => pass::<true, true>(blocks, a, t, out),
        (true, false) => pass::<true, false>(blocks, a, t, out),
        (false, true) => pass::<false, true>(blocks, a, t, out),
        (false, false) => pass::<false, false>(blocks, a, t, out),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn dispatch_avx2(
    blocks: &[Block4],
    a: &Matrix3<f64>,
    t: &Vector3<f64>,
    cross: bool,
    normal: bool,
    out: &mut Eval,
) -> Pass {
    match (cross, normal) {
        (true, true) => pass::<true, true>(blocks, a, t, out),
        (true, false) => pass::<true, false>(blocks, a, t, out),
        (false, true) => pass::<false, true>(blocks, a, t, out),
        (false, false) => pass::<false, false>(blocks, a, t, out),
    }
}

/// One pass over the packed points at `(A, t)`: AVX2 code when the CPU has it.
pub fn evaluate_blocks(
    blocks: &[Block4],
    a: &Matrix3<f64>,
    t: &Vector3<f64>,
    cross: bool,
    normal: bool,
    out: &mut Eval,
) -> Pass {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { dispatch_avx2(blocks, a, t, cross, normal, out) };
        }
    }
    dispatch_generic(blocks, a, t, cross, normal, out)
}

/// The baseline (non-AVX2) code path, for the test that both paths agree bit for bit.
pub fn evaluate_blocks_baseline(
    blocks: &[Block4],
    a: &Matrix3<f64>,
    t: &Vector3<f64>,
    cross: bool,
    normal: bool,
    out: &mut Eval,
) -> Pass {
    dispatch_generic(blocks, a, t, cross, normal, out)
}
