//! Input descriptions (borrowed, zero-copy) and their validation into per-point blocks.
//!
//! A scan is `N` correspondences `(b̃_i, r̃_i)` and a noise model for each point: the 6x6
//! covariance `R_i = [[R_bb, R_br], [R_brᵀ, R_rr]]` of `[Δb_i; Δr_i]`, given whole, as 3x3
//! blocks, or as isotropic standard deviations, each per point or shared by all points.
//! [`prepare`] validates a scan once and stores, per point, exactly what the Gauss-Newton
//! loop needs (`b`, `r`, `R_bb`, `R_rr`, `2 R_br`), so that the loop itself does no
//! validation, no branching on the input layout and no allocation.

use maleki_common::{Error, Result};
use nalgebra::Matrix6;

use crate::math::{ldexp, log2_floor, pow2, sym3_cofactors, Sym3};

/// A 3x3 block of the covariance: one per point or one shared by all points.
#[derive(Debug, Clone, Copy)]
pub enum Block<'a> {
    /// One row-major 3x3 matrix per point.
    PerPoint(&'a [[f64; 9]]),
    /// The same row-major 3x3 matrix for every point.
    Shared(&'a [f64; 9]),
}

/// The noise model of one scan.
#[derive(Debug, Clone, Copy)]
pub enum Cov<'a> {
    /// One row-major 6x6 covariance per point (`[Δb; Δr]` order).
    Full(&'a [[f64; 36]]),
    /// One row-major 6x6 covariance shared by all points.
    SharedFull(&'a [f64; 36]),
    /// Block form: `R_bb`, the optional cross block `R_br` (zero when `None`) and `R_rr`.
    /// A missing `R_bb` or `R_rr` (`None`) is zero: noise-free on that side.
    Blocks {
        bb: Option<Block<'a>>,
        br: Option<Block<'a>>,
        rr: Option<Block<'a>>,
    },
    /// `R_bb = σ_b² I`, `R_rr = σ_r² I`, no cross term.
    Isotropic { sigma_b: f64, sigma_r: f64 },
}

/// One scan: body-frame points `b`, reference-frame points `r`, the noise model and optional
/// per-point weights (a weight `w_i` divides the covariance of point `i`).
#[derive(Debug, Clone, Copy)]
pub struct ScanRef<'a> {
    pub b: &'a [[f64; 3]],
    pub r: &'a [[f64; 3]],
    pub cov: Cov<'a>,
    pub weights: Option<&'a [f64]>,
}

/// A per-point array of a batch: concatenated over the scans (indexed with the batch
/// offsets) or one array shared by every scan (a fixed map; every scan must then have its
/// length).
#[derive(Debug, Clone, Copy)]
pub enum PerScan<'a, T> {
    Concat(&'a [T]),
    Map(&'a [T]),
}

impl<'a, T> PerScan<'a, T> {
    fn get(&self, name: &str, lo: usize, hi: usize) -> Result<&'a [T]> {
        match *self {
            PerScan::Concat(s) => s.get(lo..hi).ok_or_else(|| {
                Error::invalid(name, format!("has {} rows, the offsets need {hi}", s.len()))
            }),
            PerScan::Map(s) => {
                if s.len() == hi - lo {
                    Ok(s)
                } else {
                    Err(Error::invalid(
                        name,
                        format!(
                            "is shared by all scans with {} rows, but this scan has {} points",
                            s.len(),
                            hi - lo
                        ),
                    ))
                }
            }
        }
    }
}

/// A covariance block of a batch.
#[derive(Debug, Clone, Copy)]
pub enum BatchBlock<'a> {
    PerPoint(PerScan<'a, [f64; 9]>),
    Shared(&'a [f64; 9]),
}

/// The noise model of a batch (see [`Cov`]).
#[derive(Debug, Clone, Copy)]
pub enum BatchCov<'a> {
    Full(PerScan<'a, [f64; 36]>),
    SharedFull(&'a [f64; 36]),
    Blocks {
        bb: Option<BatchBlock<'a>>,
        br: Option<BatchBlock<'a>>,
        rr: Option<BatchBlock<'a>>,
    },
    Isotropic {
        sigma_b: f64,
        sigma_r: f64,
    },
}

/// A batch of scans: scan `k` is rows `offsets[k]..offsets[k+1]` of `b` (and of every
/// concatenated per-point array).
#[derive(Debug, Clone, Copy)]
pub struct BatchRef<'a> {
    pub offsets: &'a [usize],
    pub b: &'a [[f64; 3]],
    pub r: PerScan<'a, [f64; 3]>,
    pub cov: BatchCov<'a>,
    pub weights: Option<PerScan<'a, f64>>,
}

impl<'a> BatchRef<'a> {
    /// Number of scans.
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// True when the batch has no scans.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks the offsets: `offsets[0] == 0`, non-decreasing, last == `b.len()`.
    pub fn check_offsets(&self) -> Result<()> {
        let o = self.offsets;
        if o.is_empty() {
            return Err(Error::invalid(
                "offsets",
                "must have at least one entry (B + 1 for B scans)",
            ));
        }
        if o[0] != 0 {
            return Err(Error::invalid(
                "offsets",
                format!("must start at 0, got {}", o[0]),
            ));
        }
        if let Some(k) = o.windows(2).position(|w| w[1] < w[0]) {
            return Err(Error::invalid(
                "offsets",
                format!(
                    "must be non-decreasing (offsets[{}] > offsets[{}])",
                    k,
                    k + 1
                ),
            ));
        }
        let last = *o.last().unwrap_or(&0);
        if last != self.b.len() {
            return Err(Error::invalid(
                "offsets",
                format!(
                    "last offset {last} differs from the number of points {}",
                    self.b.len()
                ),
            ));
        }
        Ok(())
    }

    /// The `k`-th scan (errors name the array whose shape does not fit).
    pub fn scan(&self, k: usize) -> Result<ScanRef<'a>> {
        let (lo, hi) = (self.offsets[k], self.offsets[k + 1]);
        let block = |name: &str, blk: Option<BatchBlock<'a>>| -> Result<Option<Block<'a>>> {
            Ok(match blk {
                None => None,
                Some(BatchBlock::Shared(m)) => Some(Block::Shared(m)),
                Some(BatchBlock::PerPoint(p)) => Some(Block::PerPoint(p.get(name, lo, hi)?)),
            })
        };
        let cov = match self.cov {
            BatchCov::Full(p) => Cov::Full(p.get("cov", lo, hi)?),
            BatchCov::SharedFull(m) => Cov::SharedFull(m),
            BatchCov::Blocks { bb, br, rr } => Cov::Blocks {
                bb: block("cov_b", bb)?,
                br: block("cov_br", br)?,
                rr: block("cov_r", rr)?,
            },
            BatchCov::Isotropic { sigma_b, sigma_r } => Cov::Isotropic { sigma_b, sigma_r },
        };
        Ok(ScanRef {
            b: &self.b[lo..hi],
            r: self.r.get("r", lo, hi)?,
            cov,
            weights: match self.weights {
                None => None,
                Some(w) => Some(w.get("weights", lo, hi)?),
            },
        })
    }
}

/// What the Gauss-Newton loop needs of one point, validated.
#[derive(Debug, Clone, Copy, Default)]
pub struct Point {
    pub b: [f64; 3],
    pub r: [f64; 3],
    /// `R_bb` (symmetric).
    pub bb: Sym3,
    /// `R_rr` (symmetric).
    pub rr: Sym3,
    /// `2 R_br`, row-major (zero when the scan has no cross term).
    pub br2: [f64; 9],
}

/// One correspondence and its scalar weight `3 / tr(R_bb + R_rr)` for the closed-form start.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pair {
    pub b: [f64; 3],
    pub r: [f64; 3],
    pub w: f64,
}

/// A validated scan: the correspondences, the per-point blocks packed by four for the
/// vectorised pass, and whether any cross-covariance is non-zero.
///
/// The stored covariances are the scan's (divided by the weights) times `2^-log2_scale`, a
/// power of two that centres the scan's variances on 1 (in log scale, see `scale_exponent`). Without it the
/// 3x3 determinants of the loop (cubes of variances) leave float64's range for variances
/// beyond about 1e±100. The cost, gradient and normal matrix of the stored scan are then the
/// scan's times `2^log2_scale`, exactly (powers of two do not round): [`Prepared::unscale`]
/// maps them back.
#[derive(Debug, Default)]
pub struct Prepared {
    pub pairs: Vec<Pair>,
    pub blocks: Vec<crate::lanes::Block4>,
    pub cross: bool,
    pub log2_scale: i32,
}

impl Prepared {
    /// `x` (a cost, gradient or normal matrix of the stored scan) in the scan's own units.
    pub fn unscale(&self, x: f64) -> f64 {
        ldexp(x, -self.log2_scale)
    }

    /// `c` (a covariance of the estimate, the inverse of a stored normal matrix) in the
    /// scan's own units.
    pub fn unscale_covariance(&self, c: f64) -> f64 {
        ldexp(c, self.log2_scale)
    }

    /// Stores one point whose blocks, times `s`, are what the loop uses.
    fn push(&mut self, b: [f64; 3], r: [f64; 3], blk: &Blocks, s: f64) {
        let p = point_of(b, r, blk, s);
        let i = self.pairs.len();
        if i.is_multiple_of(4) {
            self.blocks.push(crate::lanes::Block4::padding());
        }
        if let Some(last) = self.blocks.last_mut() {
            last.set_lane(i % 4, &p);
        }
        let tr = p.bb[0] + p.bb[3] + p.bb[5] + p.rr[0] + p.rr[3] + p.rr[5];
        self.pairs.push(Pair { b, r, w: 3.0 / tr });
        let mut nz = false;
        for v in &blk.br {
            nz |= *v != 0.0;
        }
        self.cross |= nz;
    }

    /// Validates and stores the full covariances of points `start..end` (at most four, `start`
    /// a multiple of 4) four at a time, in lanes. Returns false, storing nothing, unless every
    /// one is finite, symmetric and clearly positive definite: the caller then checks them one
    /// by one. Same checks and the same stored values as [`check_cov6`] + `push`.
    fn push_full4(
        &mut self,
        scan: &ScanRef<'_>,
        c: &[[f64; 36]],
        start: usize,
        end: usize,
    ) -> bool {
        use crate::lanes::F4;
        let m = end - start;
        // Transpose to lanes; missing lanes get identity matrices (valid, and discarded).
        // Plain loops: `std::array::from_fn` is not always inlined in this hot path.
        let mut v = [F4::splat(0.0); 36];
        for k in (0..36).step_by(7) {
            v[k] = F4::splat(1.0);
        }
        for l in 0..m {
            let cl = &c[start + l];
            for k in 0..36 {
                v[k].0[l] = cl[k];
            }
        }
        // Finite: Σ v·0 is NaN as soon as one entry is not finite.
        let zero = F4::splat(0.0);
        let mut finite = zero;
        for x in &v {
            finite = finite + *x * zero;
        }
        let mut scale = zero;
        for k in 0..6 {
            scale = scale.max(v[7 * k].abs());
        }
        let mut asym = zero;
        for i in 0..6 {
            for j in (i + 1)..6 {
                asym = asym.max((v[6 * i + j] - v[6 * j + i]).abs());
            }
        }
        let tol = F4::splat(1e-9) * scale;
        for l in 0..4 {
            if !(finite.0[l] == 0.0 && scale.0[l] > 0.0 && asym.0[l] <= tol.0[l]) {
                return false;
            }
        }
        let half = F4::splat(0.5);
        let sym = |i: usize, j: usize| half * (v[6 * i + j] + v[6 * j + i]);
        let bb = [v[0], sym(0, 1), sym(0, 2), v[7], sym(1, 2), v[14]];
        let br = [
            sym(0, 3),
            sym(0, 4),
            sym(0, 5),
            sym(1, 3),
            sym(1, 4),
            sym(1, 5),
            sym(2, 3),
            sym(2, 4),
            sym(2, 5),
        ];
        let rr = [v[21], sym(3, 4), sym(3, 5), v[28], sym(4, 5), v[35]];
        // Division-free definiteness test (as `positive_definite`), lane-wise.
        let b00 = bb[0];
        let ([a00, a01, a02, a11, a12, a22], det) = sym3_cofactors(&bb);
        let adj = [[a00, a01, a02], [a01, a11, a12], [a02, a12, a22]];
        let mut y = [[F4::splat(0.0); 3]; 3];
        for i in 0..3 {
            for j in 0..3 {
                y[i][j] = adj[i][0] * br[j] + adj[i][1] * br[3 + j] + adj[i][2] * br[6 + j];
            }
        }
        let t = |i: usize, j: usize, r: F4| {
            det * r - (br[i] * y[0][j] + br[3 + i] * y[1][j] + br[6 + i] * y[2][j])
        };
        let (t00, t01, t02) = (t(0, 0, rr[0]), t(0, 1, rr[1]), t(0, 2, rr[2]));
        let (t11, t12, t22) = (t(1, 1, rr[3]), t(1, 2, rr[4]), t(2, 2, rr[5]));
        let m22 = t00 * t11 - t01 * t01;
        let dt = t00 * (t11 * t22 - t12 * t12) - t01 * (t01 * t22 - t12 * t02)
            + t02 * (t01 * t12 - t11 * t02);
        for l in 0..4 {
            let pd = b00.0[l] > 0.0
                && a22.0[l] > 0.0
                && det.0[l] > 0.0
                && t00.0[l] > 0.0
                && m22.0[l] > 0.0
                && dt.0[l] > 0.0;
            if !pd {
                return false;
            }
        }
        // Store the four lanes directly (the same values `push` stores, point by point).
        debug_assert!(self.pairs.len().is_multiple_of(4));
        let mut sc = F4::splat(1.0);
        let mut mask = F4::splat(0.0);
        let mut pb = [F4::splat(0.0); 3];
        let mut pr = [F4::splat(0.0); 3];
        for l in 0..m {
            sc.0[l] = inv_scaled(scan.weights.map_or(1.0, |w| w[start + l]), self.log2_scale);
            mask.0[l] = 1.0;
            for k in 0..3 {
                pb[k].0[l] = scan.b[start + l][k];
                pr[k].0[l] = scan.r[start + l][k];
            }
        }
        let two_sc = F4::splat(2.0) * sc;
        let mut bbs = bb;
        let mut rrs = rr;
        for k in 0..6 {
            bbs[k] = bb[k] * sc;
            rrs[k] = rr[k] * sc;
        }
        let mut br2 = br;
        for k in 0..9 {
            br2[k] = two_sc * br[k] * mask;
        }
        let blk = crate::lanes::Block4::from_lanes(pb, pr, bbs, rrs, br2, mask);
        self.blocks.push(blk);
        let tr = bbs[0] + bbs[3] + bbs[5] + rrs[0] + rrs[3] + rrs[5];
        let mut nz = false;
        for x in &br2 {
            for l in 0..4 {
                nz |= x.0[l] != 0.0;
            }
        }
        self.cross |= nz;
        for l in 0..m {
            self.pairs.push(Pair {
                b: scan.b[start + l],
                r: scan.r[start + l],
                w: 3.0 / tr.0[l],
            });
        }
        true
    }

    /// Number of points.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// True when there are no points.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }
}

/// The validated blocks of one covariance: `R_bb`, `R_br` (row-major), `R_rr`.
#[derive(Debug, Clone, Copy)]
struct Blocks {
    bb: Sym3,
    br: [f64; 9],
    rr: Sym3,
}

/// Validates one row-major 6x6 covariance: symmetric to 1e-9 of its largest diagonal entry
/// and positive semi-definite. Returns its symmetrised blocks. `label` names the matrix in
/// errors (it is only called on failure, so the hot path formats nothing).
///
/// Positive *semi*-definite is accepted on purpose: noise-free reference points (`R_rr = 0`,
/// the Wahba setting) are a valid model. What the estimator needs, that `S_i(A) = R_bb − A R_brᵀ
/// − R_br Aᵀ + A R_rr Aᵀ` be positive definite, is checked where it is used.
fn check_cov6(c: &[f64; 36], label: impl Fn() -> String) -> Result<Blocks> {
    let mut scale = 0.0f64;
    for k in 0..6 {
        scale = scale.max(c[7 * k].abs());
    }
    if !c.iter().all(|v| v.is_finite()) {
        let v = c
            .iter()
            .find(|v| !v.is_finite())
            .copied()
            .unwrap_or(f64::NAN);
        return Err(Error::invalid(
            label(),
            format!("contains a non-finite value ({v})"),
        ));
    }
    if !(scale > 0.0) {
        return Err(Error::invalid(
            label(),
            "is zero: every point needs a noise model with a positive variance",
        ));
    }
    let mut asym = 0.0f64;
    for i in 0..6 {
        for j in (i + 1)..6 {
            asym = asym.max((c[6 * i + j] - c[6 * j + i]).abs());
        }
    }
    if asym > 1e-9 * scale {
        return Err(Error::invalid(
            label(),
            format!("is not symmetric (max |R - Rᵀ| = {asym:.3e})"),
        ));
    }
    let blk = symmetric_blocks(c);
    if !positive_definite(&blk) {
        // Not (clearly) positive definite: accept it only if positive semi-definite.
        let m = Matrix6::from_fn(|i, j| 0.5 * (c[6 * i + j] + c[6 * j + i]));
        let min = m.symmetric_eigenvalues().min();
        if min < -1e-12 * scale {
            return Err(Error::invalid(
                label(),
                format!("is not positive semi-definite (smallest eigenvalue {min:.3e})"),
            ));
        }
    }
    Ok(blk)
}

/// The blocks of a row-major 6x6 covariance, off-diagonal entries symmetrised
/// (`(c_ij + c_ji) / 2`).
fn symmetric_blocks(c: &[f64; 36]) -> Blocks {
    let sym = |i: usize, j: usize| 0.5 * (c[6 * i + j] + c[6 * j + i]);
    Blocks {
        bb: [c[0], sym(0, 1), sym(0, 2), c[7], sym(1, 2), c[14]],
        br: [
            sym(0, 3),
            sym(0, 4),
            sym(0, 5),
            sym(1, 3),
            sym(1, 4),
            sym(1, 5),
            sym(2, 3),
            sym(2, 4),
            sym(2, 5),
        ],
        rr: [c[21], sym(3, 4), sym(3, 5), c[28], sym(4, 5), c[35]],
    }
}

/// Fast positive-definiteness test of `[[R_bb, R_br], [R_brᵀ, R_rr]]` without divisions:
/// `R_bb` positive definite (leading minors) and its Schur complement, scaled by
/// `det R_bb > 0`, `det(R_bb) R_rr − R_brᵀ adj(R_bb) R_br`, positive definite. A `false` is
/// confirmed (or overruled, for semi-definite matrices) by an eigenvalue computation.
fn positive_definite(k: &Blocks) -> bool {
    let b00 = k.bb[0];
    let ([a00, a01, a02, a11, a12, a22], det) = sym3_cofactors(&k.bb);
    if !(b00 > 0.0 && a22 > 0.0 && det > 0.0) {
        return false;
    }
    let adj = [[a00, a01, a02], [a01, a11, a12], [a02, a12, a22]];
    let x = &k.br; // row-major R_br
                   // Y = adj(R_bb) R_br.
    let mut y = [[0.0f64; 3]; 3];
    for i in 0..3 {
        for j in 0..3 {
            y[i][j] = adj[i][0] * x[j] + adj[i][1] * x[3 + j] + adj[i][2] * x[6 + j];
        }
    }
    // T = det R_rr − R_brᵀ Y (symmetric, upper entries).
    let t = |i: usize, j: usize, rr: f64| {
        det * rr - (x[i] * y[0][j] + x[3 + i] * y[1][j] + x[6 + i] * y[2][j])
    };
    let [r00, r01, r02, r11, r12, r22] = k.rr;
    let (t00, t01, t02, t11, t12, t22) = (
        t(0, 0, r00),
        t(0, 1, r01),
        t(0, 2, r02),
        t(1, 1, r11),
        t(1, 2, r12),
        t(2, 2, r22),
    );
    let m22 = t00 * t11 - t01 * t01;
    let dt = t00 * (t11 * t22 - t12 * t12) - t01 * (t01 * t22 - t12 * t02)
        + t02 * (t01 * t12 - t11 * t02);
    t00 > 0.0 && m22 > 0.0 && dt > 0.0
}

fn blocks_of(
    bb: &[f64; 9],
    br: &[f64; 9],
    rr: &[f64; 9],
    label: impl Fn() -> String,
) -> Result<Blocks> {
    let mut c = [0.0f64; 36];
    for i in 0..3 {
        for j in 0..3 {
            c[6 * i + j] = bb[3 * i + j];
            c[6 * i + j + 3] = br[3 * i + j];
            c[6 * (j + 3) + i] = br[3 * i + j];
            c[6 * (i + 3) + j + 3] = rr[3 * i + j];
        }
    }
    check_cov6(&c, label)
}

/// The point with its blocks times `s`.
fn point_of(b: [f64; 3], r: [f64; 3], blk: &Blocks, s: f64) -> Point {
    let mut br2 = [0.0; 9];
    for (o, v) in br2.iter_mut().zip(&blk.br) {
        *o = 2.0 * s * v;
    }
    Point {
        b,
        r,
        bb: blk.bb.map(|v| v * s),
        rr: blk.rr.map(|v| v * s),
        br2,
    }
}

/// Checks correspondences: `r` as long as `b`, at least 3 points, every coordinate finite,
/// and the optional weights one positive finite value per point. Errors name the argument and
/// the index of the offending point.
pub(crate) fn check_correspondences(
    b: &[[f64; 3]],
    r: &[[f64; 3]],
    weights: Option<&[f64]>,
) -> Result<()> {
    let n = b.len();
    if r.len() != n {
        return Err(Error::invalid(
            "r",
            format!("has {} points but b has {n}", r.len()),
        ));
    }
    if n < 3 {
        return Err(Error::invalid(
            "b",
            format!("needs at least 3 correspondences, got {n}"),
        ));
    }
    for (name, pts) in [("b", b), ("r", r)] {
        // Σ v·0 is NaN as soon as one value is not finite: one branch for the common case.
        let mut probe = 0.0f64;
        for p in pts {
            probe += p[0] * 0.0 + p[1] * 0.0 + p[2] * 0.0;
        }
        if probe != 0.0 {
            let i = pts
                .iter()
                .position(|p| !p.iter().all(|v| v.is_finite()))
                .unwrap_or(0);
            return Err(Error::invalid(
                name,
                format!("point {i} is not finite: {:?}", pts[i]),
            ));
        }
    }
    if let Some(w) = weights {
        if w.len() != n {
            return Err(Error::invalid(
                "weights",
                format!("has {} entries but there are {n} points", w.len()),
            ));
        }
        if let Some(i) = w.iter().position(|v| !(v.is_finite() && *v > 0.0)) {
            return Err(Error::invalid(
                "weights",
                format!("weights[{i}] = {} must be positive and finite", w[i]),
            ));
        }
    }
    Ok(())
}

/// Validates `scan` into `out` (reusing its allocation). Errors name the argument and the
/// index of the offending point.
pub fn prepare(scan: &ScanRef<'_>, out: &mut Prepared) -> Result<()> {
    let n = scan.b.len();
    out.pairs.clear();
    out.blocks.clear();
    out.cross = false;
    check_correspondences(scan.b, scan.r, scan.weights)?;
    let e = scale_exponent(scan);
    out.log2_scale = e;
    // What point i's blocks are multiplied by: 2^-e / w_i (the isotropic case takes part of
    // 2^-e into its standard deviations instead).
    let scaled = |i: usize, e: i32| inv_scaled(scan.weights.map_or(1.0, |w| w[i]), e);
    let weight = |i: usize| scaled(i, e);
    out.pairs.reserve(n);
    out.blocks.reserve(n.div_ceil(4));
    match scan.cov {
        Cov::Full(c) => {
            if c.len() != n {
                return Err(Error::invalid(
                    "cov",
                    format!("has {} matrices but there are {n} points", c.len()),
                ));
            }
            for start in (0..n).step_by(4) {
                let end = (start + 4).min(n);
                if !out.push_full4(scan, c, start, end) {
                    // Some matrix of these four is not clearly valid: the scalar check names
                    // the first bad one (or accepts a semi-definite one).
                    for i in start..end {
                        let blk = check_cov6(&c[i], || format!("cov[{i}]"))?;
                        out.push(scan.b[i], scan.r[i], &blk, weight(i));
                    }
                }
            }
        }
        Cov::SharedFull(c) => {
            let blk = check_cov6(c, || "cov".to_string())?;
            for i in 0..n {
                out.push(scan.b[i], scan.r[i], &blk, weight(i));
            }
        }
        Cov::Isotropic { sigma_b, sigma_r } => {
            for (name, s) in [("sigma_b", sigma_b), ("sigma_r", sigma_r)] {
                if !(s.is_finite() && s >= 0.0) {
                    return Err(Error::invalid(
                        name,
                        format!("must be finite and >= 0, got {s}"),
                    ));
                }
            }
            if sigma_b == 0.0 && sigma_r == 0.0 {
                return Err(Error::invalid(
                    "sigma_b",
                    "sigma_b and sigma_r cannot both be zero",
                ));
            }
            // σ² itself may leave float64's range (σ = 1e-200): square σ 2^-h instead and
            // leave the rest of 2^-e, 2^-(e - 2h), to the per-point factor.
            let h = e.div_euclid(2);
            let (sb, sr) = (ldexp(sigma_b, -h), ldexp(sigma_r, -h));
            let (vb, vr) = (sb * sb, sr * sr);
            let blk = Blocks {
                bb: [vb, 0.0, 0.0, vb, 0.0, vb],
                br: [0.0; 9],
                rr: [vr, 0.0, 0.0, vr, 0.0, vr],
            };
            for i in 0..n {
                out.push(scan.b[i], scan.r[i], &blk, scaled(i, e - 2 * h));
            }
        }
        Cov::Blocks { bb, br, rr } => {
            let blocks = [("cov_b", bb), ("cov_br", br), ("cov_r", rr)];
            for (name, blk) in blocks {
                if let Some(Block::PerPoint(p)) = blk {
                    if p.len() != n {
                        return Err(Error::invalid(
                            name,
                            format!("has {} matrices but there are {n} points", p.len()),
                        ));
                    }
                }
            }
            let all_shared = blocks
                .iter()
                .all(|(_, b)| !matches!(b, Some(Block::PerPoint(_))));
            let get = |blk: Option<Block<'_>>, i: usize| -> [f64; 9] {
                match blk {
                    None => [0.0; 9],
                    Some(Block::Shared(m)) => *m,
                    Some(Block::PerPoint(p)) => p[i],
                }
            };
            let mut shared: Option<Blocks> = None;
            for i in 0..n {
                let blk = match shared {
                    Some(s) => s,
                    None => {
                        let (mb, mbr, mr) = (get(bb, i), get(br, i), get(rr, i));
                        for (name, m) in [("cov_b", &mb), ("cov_br", &mbr), ("cov_r", &mr)] {
                            check_finite_mat(name, i, m)?;
                        }
                        let v = blocks_of(&mb, &mbr, &mr, || {
                            if all_shared {
                                "cov_b/cov_br/cov_r".to_string()
                            } else {
                                format!(
                                    "point {i}: the covariance [[cov_b, cov_br], [cov_brᵀ, cov_r]]"
                                )
                            }
                        })?;
                        if all_shared {
                            shared = Some(v);
                        }
                        v
                    }
                };
                out.push(scan.b[i], scan.r[i], &blk, weight(i));
            }
        }
    }
    Ok(())
}

/// `2^-e / w` for a positive finite `w`, without the overflow of `1 / w` for subnormal `w`.
fn inv_scaled(w: f64, e: i32) -> f64 {
    // The common case in one division (the same bits: scaling by 2^-e does not round while
    // the result is a normal number).
    if (-1023..=1022).contains(&e) {
        let q = pow2(-e) / w;
        if q.is_normal() {
            return q;
        }
    }
    let k = log2_floor(w);
    ldexp(1.0 / ldexp(w, -k), -e - k)
}

/// The power of two of [`Prepared::log2_scale`]: the middle of the range of
/// `floor(log2 d_i) − floor(log2 w_i)` over the points, `d_i` the largest variance of point `i`
/// (the diagonal of its covariance) and `w_i` its weight. Centring the range (rather than
/// bringing the largest variance to 1) keeps scans whose variances span up to about 1e200
/// within float64 (cubes of variances, in the 3x3 determinants, span 1e±300). Values that are
/// not finite and positive are skipped (validation reports them); 0 when none is left.
fn scale_exponent(scan: &ScanRef<'_>) -> i32 {
    let lg = |x: f64| (x.is_finite() && x > 0.0).then(|| log2_floor(x));
    let diag_max = |m: &[f64; 9]| m[0].abs().max(m[4].abs()).max(m[8].abs());
    let full_max = |c: &[f64; 36]| (0..6).fold(0.0, |m: f64, k| m.max(c[7 * k].abs()));
    let block = |blk: Option<Block<'_>>, i: usize| match blk {
        None => 0.0,
        Some(Block::Shared(m)) => diag_max(m),
        Some(Block::PerPoint(p)) => p.get(i).map_or(0.0, diag_max),
    };
    // floor(log2 d_i) of point i (for σ: 2 floor(log2 σ), within 2 of it).
    let lg_d = |i: usize| match scan.cov {
        Cov::Full(c) => lg(c.get(i).map_or(0.0, full_max)),
        Cov::SharedFull(c) => lg(full_max(c)),
        Cov::Isotropic { sigma_b, sigma_r } => lg(sigma_b.abs().max(sigma_r.abs())).map(|s| 2 * s),
        Cov::Blocks { bb, br: _, rr } => lg(block(bb, i).max(block(rr, i))),
    };
    let lg_w = |i: usize| scan.weights.map_or(Some(0), |w| lg(w[i]));
    let (lo, hi) = (0..scan.b.len())
        .filter_map(|i| Some(lg_d(i)? - lg_w(i)?))
        .fold((i32::MAX, i32::MIN), |(lo, hi), e| (lo.min(e), hi.max(e)));
    if lo > hi {
        return 0;
    }
    // i64: the sum of two exponents near ±2100 fits an i32, but say so in the types.
    ((lo as i64 + hi as i64).div_euclid(2)) as i32
}

fn check_finite_mat(name: &str, i: usize, m: &[f64]) -> Result<()> {
    if m.iter().all(|v| v.is_finite()) {
        Ok(())
    } else {
        Err(Error::invalid(
            name,
            format!("matrix {i} contains a non-finite value"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pts(n: usize) -> Vec<[f64; 3]> {
        (0..n).map(|i| [i as f64, (i * i) as f64, 1.0]).collect()
    }

    #[test]
    fn rejects_bad_scans_with_named_errors() {
        let b = pts(4);
        let mut out = Prepared::default();
        let iso = Cov::Isotropic {
            sigma_b: 0.1,
            sigma_r: 0.1,
        };
        let few = ScanRef {
            b: &b[..2],
            r: &b[..2],
            cov: iso,
            weights: None,
        };
        assert!(prepare(&few, &mut out)
            .unwrap_err()
            .to_string()
            .contains("at least 3"));
        let mut bad = b.clone();
        bad[2][1] = f64::NAN;
        let nan = ScanRef {
            b: &bad,
            r: &b,
            cov: iso,
            weights: None,
        };
        assert!(prepare(&nan, &mut out)
            .unwrap_err()
            .to_string()
            .contains("point 2"));
        let w = [1.0, 0.0, 1.0, 1.0];
        let zw = ScanRef {
            b: &b,
            r: &b,
            cov: iso,
            weights: Some(&w),
        };
        assert!(prepare(&zw, &mut out)
            .unwrap_err()
            .to_string()
            .contains("weights[1]"));
        let mut c = [0.0; 36];
        for k in 0..6 {
            c[7 * k] = 1.0;
        }
        c[1] = 2.0;
        c[6] = 2.0; // symmetric, indefinite
        let covs = vec![[0.0; 36], c, c, c];
        let mut covs_ok = covs.clone();
        covs_ok[0] = {
            let mut d = [0.0; 36];
            for k in 0..6 {
                d[7 * k] = 1.0;
            }
            d
        };
        let ind = ScanRef {
            b: &b,
            r: &b,
            cov: Cov::Full(&covs_ok),
            weights: None,
        };
        let e = prepare(&ind, &mut out).unwrap_err().to_string();
        assert!(e.contains("cov[1]") && e.contains("semi-definite"), "{e}");
        let zero = ScanRef {
            b: &b,
            r: &b,
            cov: Cov::Full(&covs),
            weights: None,
        };
        assert!(prepare(&zero, &mut out)
            .unwrap_err()
            .to_string()
            .contains("cov[0]"));
    }

    #[test]
    fn fast_definiteness_test_agrees_with_cholesky() {
        let mut agree = 0;
        for k in 0..500 {
            let x = k as f64;
            // Symmetric matrices with eigenvalues of both signs near the boundary.
            let a = Matrix6::from_fn(|i, j| ((i * 6 + j) as f64 * 0.37 + x).sin());
            let shift = (x * 0.011).sin() * 2.0 + 1.0;
            let m = a * a.transpose() * 0.1 - Matrix6::identity() * (0.2 - shift * 0.1);
            let mut c = [0.0; 36];
            for i in 0..6 {
                for j in 0..6 {
                    c[6 * i + j] = m[(i, j)];
                }
            }
            // `m` is symmetric: the symmetrised blocks are its blocks.
            let blk = symmetric_blocks(&c);
            let ours = positive_definite(&blk);
            let min = m.symmetric_eigenvalues().min();
            if min.abs() > 1e-9 {
                assert_eq!(ours, min > 0.0, "case {k}: smallest eigenvalue {min}");
                agree += 1;
            }
        }
        assert!(agree > 400);
    }

    #[test]
    fn psd_with_noise_free_reference_is_accepted() {
        let b = pts(4);
        let bb = [0.01, 0.0, 0.0, 0.0, 0.01, 0.0, 0.0, 0.0, 0.01];
        let scan = ScanRef {
            b: &b,
            r: &b,
            cov: Cov::Blocks {
                bb: Some(Block::Shared(&bb)),
                br: None,
                rr: None,
            },
            weights: None,
        };
        let mut out = Prepared::default();
        prepare(&scan, &mut out).unwrap();
        assert_eq!(out.len(), 4);
        assert!(!out.cross);
        // Stored times 2^7, which brings 0.01 to [1, 2).
        assert_eq!(out.log2_scale, -7);
        assert_eq!(
            crate::lanes::unpack(&out.blocks, 4)[3].bb,
            [1.28, 0.0, 0.0, 1.28, 0.0, 1.28]
        );
    }

    #[test]
    fn the_stored_covariances_are_rescaled_by_a_power_of_two() {
        // Every form, variances from 1e-300 to 1e300, weights too: the stored blocks are the
        // input's / w times 2^-log2_scale exactly, the points' variances centred on 1.
        let b = pts(5);
        let w = [1.0, 2.0, 0.5, 4.0, 1e-3];
        for lg in [-996, -400, -7, 0, 9, 400, 996] {
            let v = crate::math::ldexp(1.3, lg);
            let mut full = [0.0; 36];
            for k in 0..6 {
                full[7 * k] = v * (1.0 + k as f64 * 0.1);
            }
            let bb = [v, 0.0, 0.0, 0.0, v, 0.0, 0.0, 0.0, v];
            let sigma = v.sqrt();
            let forms = [
                Cov::SharedFull(&full),
                Cov::Blocks {
                    bb: Some(Block::Shared(&bb)),
                    br: None,
                    rr: Some(Block::Shared(&bb)),
                },
                Cov::Isotropic {
                    sigma_b: sigma,
                    sigma_r: sigma,
                },
            ];
            for cov in forms {
                for weights in [None, Some(&w[..])] {
                    let scan = ScanRef {
                        b: &b,
                        r: &b,
                        cov,
                        weights,
                    };
                    let mut out = Prepared::default();
                    prepare(&scan, &mut out).unwrap();
                    let pts = crate::lanes::unpack(&out.blocks, 5);
                    // The points' largest variances, centred on 1 in log scale.
                    let d: Vec<f64> = pts
                        .iter()
                        .map(|p| p.bb.iter().chain(&p.rr).fold(0.0f64, |m, x| m.max(*x)))
                        .collect();
                    let (lo, hi) = d
                        .iter()
                        .fold((f64::MAX, 0.0f64), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
                    assert!(
                        (1.0 / 16.0..=16.0).contains(&(lo * hi)),
                        "{lg} {cov:?}: {lo} {hi}"
                    );
                    for (i, p) in pts.iter().enumerate() {
                        let wi = weights.map_or(1.0, |w| w[i]);
                        let back = out.unscale_covariance(p.bb[0]) * wi;
                        assert!((back / v - 1.0).abs() < 1e-15, "{lg} {cov:?} {i}: {back}");
                    }
                }
            }
        }
    }
}
