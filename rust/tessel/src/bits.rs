//! Fixed-size bit sets over the circle `Z_P` (residues modulo the period), used by the
//! repetend search. `K` 64-bit words hold up to `64 K` residues; bits at or above `P` are
//! always zero.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Bits<const K: usize>(pub [u64; K]);

impl<const K: usize> Bits<K> {
    pub const ZERO: Self = Bits([0; K]);

    /// The set `{0, .., p-1}`.
    pub fn full(p: usize) -> Self {
        let mut b = Self::ZERO;
        for i in 0..p {
            b.set(i);
        }
        b
    }

    #[inline]
    pub fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }

    #[inline]
    pub fn test(&self, i: usize) -> bool {
        self.0[i / 64] >> (i % 64) & 1 == 1
    }

    #[inline]
    pub fn and(self, o: Self) -> Self {
        let mut r = self;
        for k in 0..K {
            r.0[k] &= o.0[k];
        }
        r
    }

    #[inline]
    pub fn andnot(self, o: Self) -> Self {
        let mut r = self;
        for k in 0..K {
            r.0[k] &= !o.0[k];
        }
        r
    }

    #[inline]
    pub fn or(self, o: Self) -> Self {
        let mut r = self;
        for k in 0..K {
            r.0[k] |= o.0[k];
        }
        r
    }

    pub fn count(&self) -> u32 {
        self.0.iter().map(|w| w.count_ones()).sum()
    }

    fn shr(self, s: usize) -> Self {
        let mut r = Self::ZERO;
        let (w, b) = (s / 64, s % 64);
        for k in 0..K {
            if k + w < K {
                let mut v = self.0[k + w] >> b;
                if b > 0 && k + w + 1 < K {
                    v |= self.0[k + w + 1] << (64 - b);
                }
                r.0[k] = v;
            }
        }
        r
    }

    fn shl(self, s: usize) -> Self {
        let mut r = Self::ZERO;
        let (w, b) = (s / 64, s % 64);
        for k in (0..K).rev() {
            if k >= w {
                let mut v = self.0[k - w] << b;
                if b > 0 && k > w {
                    v |= self.0[k - w - 1] >> (64 - b);
                }
                r.0[k] = v;
            }
        }
        r
    }

    /// Rotation on the `p`-circle: bit `r` of the result is bit `(r + s) mod p` of `self`.
    pub fn rot(self, s: usize, p: usize) -> Self {
        let s = s % p;
        if s == 0 {
            return self;
        }
        self.shr(s).or(self.shl(p - s)).and(Self::full_cached(p))
    }

    fn full_cached(p: usize) -> Self {
        let mut b = Self::ZERO;
        for k in 0..K {
            let lo = k * 64;
            if p >= lo + 64 {
                b.0[k] = u64::MAX;
            } else if p > lo {
                b.0[k] = (1u64 << (p - lo)) - 1;
            }
        }
        b
    }

    /// The residues `r` whose arc `[r, r + len)` lies in `self` (on the `p`-circle), by
    /// doubling: O(K log len).
    pub fn arc_starts(self, len: usize, p: usize) -> Self {
        if len >= p {
            return if self.count() as usize == p && len == p {
                self
            } else {
                Self::ZERO
            };
        }
        let mut y = self;
        let mut have = 1;
        while have < len {
            let step = have.min(len - have);
            y = y.and(y.rot(step, p));
            have += step;
        }
        y
    }

    /// The arc `[r, r + len)` of the `p`-circle (`r < p`, `len <= p`), a word at a time: the
    /// repetend search makes one per placement, so its cost is `O(K)`, not `O(len)`.
    #[inline]
    pub fn arc(r: usize, len: usize, p: usize) -> Self {
        debug_assert!(r < p.max(1) && len <= p);
        let mut b = Self::ZERO;
        let end = r + len;
        if end <= p {
            b.set_range(r, end);
        } else {
            b.set_range(r, p);
            b.set_range(0, end - p);
        }
        b
    }

    /// Sets the bits `lo..hi` (`hi <= 64 K`).
    #[inline]
    fn set_range(&mut self, lo: usize, hi: usize) {
        if lo >= hi {
            return;
        }
        let (w0, w1) = (lo / 64, (hi - 1) / 64);
        for w in w0..=w1 {
            let a = if w == w0 { lo % 64 } else { 0 };
            let z = if w == w1 { (hi - 1) % 64 + 1 } else { 64 };
            let upto = if z == 64 { u64::MAX } else { (1u64 << z) - 1 };
            self.0[w] |= upto & (u64::MAX << a);
        }
    }

    /// The distance `k >= 0` from residue `r0` to the first set bit at `(r0 + k) mod p`.
    pub fn next_set(&self, r0: usize, p: usize) -> Option<usize> {
        // First set bit at or above r0, then wrap to the lowest set bit.
        let (w0, b0) = (r0 / 64, r0 % 64);
        let mut word = self.0[w0] & (u64::MAX << b0);
        let mut w = w0;
        loop {
            if word != 0 {
                let i = w * 64 + word.trailing_zeros() as usize;
                if i < p {
                    return Some(i - r0);
                }
                break;
            }
            w += 1;
            if w >= K || w * 64 >= p {
                break;
            }
            word = self.0[w];
        }
        for (w, &word) in self.0.iter().enumerate() {
            if word != 0 {
                let i = w * 64 + word.trailing_zeros() as usize;
                return if i < r0 { Some(i + p - r0) } else { None };
            }
        }
        None
    }

    /// The distance `k >= 0` from residue `r0` back to the first set bit at `(r0 - k) mod p`.
    pub fn prev_set(&self, r0: usize, p: usize) -> Option<usize> {
        let (w0, b0) = (r0 / 64, r0 % 64);
        let mask = if b0 == 63 {
            u64::MAX
        } else {
            (1u64 << (b0 + 1)) - 1
        };
        let mut word = self.0[w0] & mask;
        let mut w = w0;
        loop {
            if word != 0 {
                let i = w * 64 + 63 - word.leading_zeros() as usize;
                return Some(r0 - i);
            }
            if w == 0 {
                break;
            }
            w -= 1;
            word = self.0[w];
        }
        for w in (0..K).rev() {
            let word = self.0[w];
            if word != 0 {
                let i = w * 64 + 63 - word.leading_zeros() as usize;
                return if i > r0 && i < p {
                    Some(r0 + p - i)
                } else {
                    None
                };
            }
        }
        None
    }

    /// Lengths of the maximal runs of set bits on the `p`-circle (a full circle is one run of p).
    pub fn runs(&self, p: usize, out: &mut Vec<usize>) {
        out.clear();
        let n = self.count() as usize;
        if n == 0 {
            return;
        }
        if n == p {
            out.push(p);
            return;
        }
        // Start just after a zero bit so no run wraps the scan.
        let z = (0..p).find(|&i| !self.test(i)).expect("not full");
        let mut len = 0;
        for k in 1..=p {
            if self.test((z + k) % p) {
                len += 1;
            } else if len > 0 {
                out.push(len);
                len = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive_starts(b: &Bits<2>, len: usize, p: usize) -> Vec<usize> {
        (0..p)
            .filter(|&r| (0..len).all(|k| b.test((r + k) % p)))
            .collect()
    }

    #[test]
    fn arcs_and_rotations_agree_with_brute_force() {
        for p in [1usize, 5, 63, 64, 65, 100, 128] {
            let mut b = Bits::<2>::ZERO;
            for i in 0..p {
                if (i * 7 + 3) % 5 != 0 {
                    b.set(i);
                }
            }
            for s in 0..p {
                let r = b.rot(s, p);
                for i in 0..p {
                    assert_eq!(r.test(i), b.test((i + s) % p), "p={p} s={s} i={i}");
                }
            }
            for r in 0..p {
                for len in 0..=p {
                    let arc = Bits::<2>::arc(r, len, p);
                    for i in 0..128 {
                        let inside = i < p && (i + p - r) % p < len;
                        assert_eq!(arc.test(i), inside, "p={p} r={r} len={len} i={i}");
                    }
                }
            }
            for len in 1..=p.min(9) {
                let got: Vec<usize> = (0..p).filter(|&r| b.arc_starts(len, p).test(r)).collect();
                assert_eq!(got, naive_starts(&b, len, p), "p={p} len={len}");
            }
            for r0 in 0..p {
                let want = (0..p).find(|&k| b.test((r0 + k) % p));
                assert_eq!(b.next_set(r0, p), want, "p={p} r0={r0}");
                let back = (0..p).find(|&k| b.test((r0 + p - k) % p));
                assert_eq!(b.prev_set(r0, p), back, "p={p} r0={r0}");
            }
            let mut runs = Vec::new();
            b.runs(p, &mut runs);
            assert_eq!(runs.iter().sum::<usize>(), b.count() as usize);
        }
    }
}
