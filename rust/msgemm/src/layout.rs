//! The kernel tile layout (spec section 5).
//!
//! Weights are stored as `[g][row_block][tuple in g][64]`: entry `r` of a 64-wide slot is the
//! table index of row `rb*64 + r` for that tuple, so one aligned 64-byte load feeds one table
//! lookup for 64 rows. Scales (and zero points) are stored as `[g][row_block][64]` float32, so
//! weights and scales stream contiguously in loop order. Rows past M in the last block hold
//! index 0, scale 0 and zero point 0 (they contribute exact zeros and are never written).
//!
//! Tuples never straddle a group: a group of G weights holds `ceil(G/d)` tuples, the last
//! one of depth `G - (ceil(G/d)-1)*d` when `d` does not divide `G` (its table has `V^r`
//! entries). Indices are `u8` when `V^d <= 256`, else `u16`.
//!
//! Two derived forms serve particular kernels ([`LayoutKind`]): the mirror-folded one
//! ([`TileLayout::fold`]) and, for tables of at most 16 entries, the paired one
//! ([`TileLayout::pair`]): the indices of tuples `2p` and `2p + 1` in the low and high nibble of
//! one byte, `[g][rb][p][64]`, so a kernel reads 4 bits per index instead of 8.

use rayon::prelude::*;

use maleki_common::Result;

use crate::aligned::AlignedVec;
use crate::format::Mirror;

/// The name of the tile layout's buffer in out-of-memory errors.
const WHAT: &str = "the tile layout of the weights";

/// Rows per block: one 64-byte vector of indices.
pub const ROW_BLOCK: usize = 64;

/// The tuple structure of one group for a depth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuples {
    /// Depth d of every tuple but possibly the last.
    pub depth: usize,
    /// Tuples per group: `ceil(G/d)`.
    pub per_group: usize,
    /// Depth of the last tuple of each group (`== depth` when `d` divides `G`).
    pub last_depth: usize,
}

impl Tuples {
    pub fn new(group_size: usize, depth: usize) -> Tuples {
        let per_group = group_size.div_ceil(depth);
        Tuples {
            depth,
            per_group,
            last_depth: group_size - (per_group - 1) * depth,
        }
    }

    /// Depth of tuple `t` of a group.
    #[inline]
    pub fn depth_of(&self, t: usize) -> usize {
        if t + 1 == self.per_group {
            self.last_depth
        } else {
            self.depth
        }
    }
}

/// Which form of a tile layout a kernel reads (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayoutKind {
    /// One index per byte (`u8`) or per `u16`.
    Plain,
    /// Mirror-folded byte indices ([`TileLayout::fold`]).
    Folded,
    /// Two 4-bit indices per byte ([`TileLayout::pair`]).
    Paired,
}

/// Index storage of a tile layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IndexData {
    /// `V^d <= 256`.
    U8(AlignedVec<u8>),
    /// `256 < V^d <= 65536` (e.g. int4 at depth 3 or 4).
    U16(AlignedVec<u16>),
}

/// Table indices of every (group, row block, tuple, row) for one depth.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TileLayout {
    pub tuples: Tuples,
    pub groups: usize,
    pub row_blocks: usize,
    /// `[g][rb][t][64]`, see the module docs.
    pub data: IndexData,
    /// Mirror-folded byte indices (see [`TileLayout::fold`]).
    pub folded: bool,
    /// Indices formed from sign-magnitude labels instead of codes.
    pub labeled: bool,
    /// Two tuples' indices per byte (see [`TileLayout::pair`]).
    pub paired: bool,
}

impl TileLayout {
    /// 64-wide slots per (group, row block): one per tuple, or one per pair of tuples
    /// (paired form).
    #[inline]
    pub fn slots_per_group(&self) -> usize {
        if self.paired {
            self.tuples.per_group.div_ceil(2)
        } else {
            self.tuples.per_group
        }
    }

    /// Offset of the 64-wide slot `s` of `(g, rb)` in `data` (`s` is the tuple, or in the
    /// paired form the pair).
    #[inline]
    pub fn slot(&self, g: usize, rb: usize, s: usize) -> usize {
        ((g * self.row_blocks + rb) * self.slots_per_group() + s) * ROW_BLOCK
    }

    /// The form of this layout.
    pub fn kind(&self) -> LayoutKind {
        if self.folded {
            LayoutKind::Folded
        } else if self.paired {
            LayoutKind::Paired
        } else {
            LayoutKind::Plain
        }
    }

    /// Builds the layout from unpacked codes `(M, K)` row-major (`K = groups * G`), each code
    /// `c` read as `labels[c]` when labels are given (tables in label space, see
    /// [`crate::plan::Plan::labels`]). Fails only when its buffer cannot be allocated.
    pub fn build(
        codes: &[u8],
        m: usize,
        k: usize,
        group_size: usize,
        levels: usize,
        depth: usize,
        labels: Option<&[u8]>,
    ) -> Result<TileLayout> {
        let ident: Vec<u8> = (0..=255u8).collect();
        let label = labels.unwrap_or(&ident);
        let groups = k / group_size;
        let row_blocks = m.div_ceil(ROW_BLOCK);
        let tuples = Tuples::new(group_size, depth);
        let slot_len = row_blocks * tuples.per_group * ROW_BLOCK;
        let wide = levels.pow(depth as u32) > 256;
        let index = |row: usize, k0: usize, r: usize| -> usize {
            let mut idx = 0usize;
            for j in (0..r).rev() {
                idx = idx * levels + label[codes[row * k + k0 + j] as usize] as usize;
            }
            idx
        };
        // One group per task: each fills its own contiguous [rb][t][64] part (a generic
        // writer, inlined: a `dyn` call per index was most of the build).
        fn fill<T>(
            out: &mut [T],
            g: usize,
            (m, group_size, row_blocks, tuples): (usize, usize, usize, Tuples),
            index: &impl Fn(usize, usize, usize) -> usize,
            cast: impl Fn(usize) -> T,
        ) {
            for rb in 0..row_blocks {
                let rows = (m - rb * ROW_BLOCK).min(ROW_BLOCK);
                for t in 0..tuples.per_group {
                    let k0 = g * group_size + t * tuples.depth;
                    let r = tuples.depth_of(t);
                    let base = (rb * tuples.per_group + t) * ROW_BLOCK;
                    for lane in 0..rows {
                        out[base + lane] = cast(index(rb * ROW_BLOCK + lane, k0, r));
                    }
                }
            }
        }
        let shape = (m, group_size, row_blocks, tuples);
        let data = if wide {
            let mut v = AlignedVec::<u16>::try_zeroed(groups * slot_len, WHAT)?;
            v.par_chunks_mut(slot_len.max(1))
                .enumerate()
                .for_each(|(g, out)| fill(out, g, shape, &index, |i| i as u16));
            IndexData::U16(v)
        } else {
            let mut v = AlignedVec::<u8>::try_zeroed(groups * slot_len, WHAT)?;
            v.par_chunks_mut(slot_len.max(1))
                .enumerate()
                .for_each(|(g, out)| fill(out, g, shape, &index, |i| i as u8));
            IndexData::U8(v)
        };
        Ok(TileLayout {
            tuples,
            groups,
            row_blocks,
            data,
            folded: false,
            labeled: labels.is_some(),
            paired: false,
        })
    }

    /// [`TileLayout::build`] for the case where each stored byte is an index: packings whose
    /// byte holds `depth` codes as `sum_j c_j V^j` (int4 at depth 2, int2 at 4, ternary at 5,
    /// fp8 at 1), groups a whole number of bytes, no labels. Then the layout is the packed rows
    /// transposed in blocks of 64 rows, without unpacking a code. `packed` is `(M, row_bytes)`
    /// row-major.
    pub fn from_packed_bytes(
        packed: &[u8],
        row_bytes: usize,
        m: usize,
        k: usize,
        group_size: usize,
        depth: usize,
    ) -> Result<TileLayout> {
        assert!(group_size.is_multiple_of(depth) && k.is_multiple_of(group_size));
        assert!(row_bytes >= k / depth && packed.len() >= m * row_bytes);
        let groups = k / group_size;
        let row_blocks = m.div_ceil(ROW_BLOCK);
        let tuples = Tuples::new(group_size, depth);
        let pg = tuples.per_group;
        let slot_len = row_blocks * pg * ROW_BLOCK;
        let mut v = AlignedVec::<u8>::try_zeroed(groups * slot_len, WHAT)?;
        // One group per task; within it, each row's `pg` bytes go to lane `row % 64` of the
        // row block's `pg` slots (rows past M stay zero, as in `build`).
        v.par_chunks_mut(slot_len.max(1))
            .enumerate()
            .for_each(|(g, out)| {
                for (rb, block) in out.chunks_mut(pg * ROW_BLOCK).enumerate() {
                    let rows = (m - rb * ROW_BLOCK).min(ROW_BLOCK);
                    for lane in 0..rows {
                        let row = rb * ROW_BLOCK + lane;
                        let src = &packed[row * row_bytes + g * pg..][..pg];
                        for (t, &b) in src.iter().enumerate() {
                            block[t * ROW_BLOCK + lane] = b;
                        }
                    }
                }
            });
        Ok(TileLayout {
            tuples,
            groups,
            row_blocks,
            data: IndexData::U8(v),
            folded: false,
            labeled: false,
            paired: false,
        })
    }

    /// True when a layout of `levels` codes at `depth` can be paired: every index is below 16.
    pub fn can_pair(levels: usize, depth: usize) -> bool {
        levels.checked_pow(depth as u32).is_some_and(|e| e <= 16)
    }

    /// The paired form of a plain byte layout whose indices are below 16: byte `r` of slot `p`
    /// holds the index of tuple `2p` in its low nibble and of tuple `2p + 1` in its high
    /// nibble (0 when the group has no tuple `2p + 1`). Kernels of 16-entry tables then read
    /// half the bytes (`vpshufb` looks up the low nibble; the high one is a shift away).
    pub fn pair(&self) -> Result<TileLayout> {
        let IndexData::U8(v) = &self.data else {
            panic!("only byte layouts pair")
        };
        assert!(!self.folded && !self.paired);
        let pg = self.tuples.per_group;
        let pairs = pg.div_ceil(2);
        let (src_len, dst_len) = (pg * ROW_BLOCK, pairs * ROW_BLOCK);
        let blocks = self.groups * self.row_blocks;
        let mut out = AlignedVec::<u8>::try_zeroed(blocks * dst_len, WHAT)?;
        out.par_chunks_mut(dst_len.max(1))
            .zip(v.par_chunks(src_len.max(1)))
            .for_each(|(dst, src)| {
                for (p, d) in dst.chunks_mut(ROW_BLOCK).enumerate() {
                    let lo = &src[2 * p * ROW_BLOCK..][..ROW_BLOCK];
                    if 2 * p + 1 < pg {
                        let hi = &src[(2 * p + 1) * ROW_BLOCK..][..ROW_BLOCK];
                        for ((o, &a), &b) in d.iter_mut().zip(lo).zip(hi) {
                            *o = a | (b << 4);
                        }
                    } else {
                        d.copy_from_slice(lo);
                    }
                }
            });
        Ok(TileLayout {
            tuples: self.tuples,
            groups: self.groups,
            row_blocks: self.row_blocks,
            data: IndexData::U8(out),
            folded: false,
            labeled: self.labeled,
            paired: true,
        })
    }

    /// The paired layout of tuples of depth `depth` where a packed byte holds `2 depth` codes in
    /// base V with `V^depth = 16` (int4 and the other 16-level formats at depth 1, int2 at
    /// depth 2): the natural-depth layout of [`TileLayout::from_packed_bytes`], read as pairs.
    /// Needs `group_size` a multiple of `2 depth`.
    pub fn paired_from_packed_bytes(
        packed: &[u8],
        row_bytes: usize,
        m: usize,
        k: usize,
        group_size: usize,
        depth: usize,
    ) -> Result<TileLayout> {
        let mut lay =
            TileLayout::from_packed_bytes(packed, row_bytes, m, k, group_size, 2 * depth)?;
        lay.tuples = Tuples::new(group_size, depth);
        lay.paired = true;
        Ok(lay)
    }

    /// True when the byte indices of mirror tables can be folded: every stored prefix
    /// (`mirror.stored_entries(depth)`, the largest) fits in 7 bits.
    pub fn can_fold(levels: usize, depth: usize, mirror: &Mirror) -> bool {
        levels.checked_pow(depth as u32).is_some_and(|e| e <= 256)
            && mirror.stored_entries(depth) <= 128
    }

    /// The mirror-folded form of a byte layout: an index past its tuple's stored prefix
    /// (`idx >= h_r`, `h_r = mirror.stored_entries(r)`) becomes `0x80 | mirror(idx)`, which is
    /// below `h_r`; indices in the prefix stay as they are. A kernel then finds the stored
    /// entry in the low 7 bits and the sign (`-T[mirror(idx)]`) in the top bit, with no
    /// per-lane compare or index arithmetic. Needs [`TileLayout::can_fold`].
    pub fn fold(mut self, mirror: &Mirror) -> TileLayout {
        let IndexData::U8(v) = &mut self.data else {
            panic!("only byte layouts fold")
        };
        assert!(!self.folded && !self.paired && mirror.stored_entries(self.tuples.depth) <= 128);
        // byte -> folded byte, for the regular depth and the group's last tuple.
        let map = |r: usize| -> [u8; 256] {
            let h = mirror.stored_entries(r);
            let e = mirror.levels.pow(r as u32);
            std::array::from_fn(|idx| {
                if idx < h || idx >= e {
                    idx as u8
                } else {
                    0x80 | mirror.index(idx, r) as u8
                }
            })
        };
        let maps = [map(self.tuples.depth), map(self.tuples.last_depth)];
        let tp = self.tuples;
        let slot_len = self.row_blocks * tp.per_group * ROW_BLOCK;
        v.par_chunks_mut(slot_len.max(1)).for_each(|grp| {
            for (i, tuple) in grp.chunks_mut(ROW_BLOCK).enumerate() {
                let m = &maps[usize::from(i % tp.per_group + 1 == tp.per_group)];
                for b in tuple {
                    *b = m[*b as usize];
                }
            }
        });
        self.folded = true;
        self
    }

    /// The index of `(g, row, t)` (for tests and the scalar kernel's tails; folded form for a
    /// folded layout).
    pub fn index(&self, g: usize, row: usize, t: usize) -> usize {
        let s = if self.paired { t / 2 } else { t };
        let i = self.slot(g, row / ROW_BLOCK, s) + row % ROW_BLOCK;
        let x = match &self.data {
            IndexData::U8(v) => v[i] as usize,
            IndexData::U16(v) => v[i] as usize,
        };
        if self.paired {
            (x >> (4 * (t % 2))) & 15
        } else {
            x
        }
    }
}

/// Per-(row, group) values `(M, groups)` row-major, re-laid out as `[g][rb][64]` with zero
/// padding past M.
pub fn tile_per_group<T: bytemuck::Pod>(values: &[T], m: usize, groups: usize) -> AlignedVec<T> {
    let row_blocks = m.div_ceil(ROW_BLOCK);
    let mut out = AlignedVec::<T>::zeroed(groups * row_blocks * ROW_BLOCK);
    for (row, vals) in values.chunks(groups.max(1)).enumerate().take(m) {
        for (g, &v) in vals.iter().enumerate() {
            out[(g * row_blocks + row / ROW_BLOCK) * ROW_BLOCK + row % ROW_BLOCK] = v;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tuples_cover_groups_exactly() {
        for g in [32usize, 64, 96, 128, 130] {
            for d in 1..=6 {
                let t = Tuples::new(g, d);
                let total: usize = (0..t.per_group).map(|i| t.depth_of(i)).sum();
                assert_eq!(total, g);
                assert!(t.last_depth >= 1 && t.last_depth <= d);
            }
        }
        assert_eq!(
            Tuples::new(128, 3),
            Tuples {
                depth: 3,
                per_group: 43,
                last_depth: 2
            }
        );
    }

    #[test]
    fn layout_holds_first_digit_least_significant_indices() {
        let (m, k, g, v) = (70usize, 12usize, 6usize, 16usize);
        let codes: Vec<u8> = (0..m * k).map(|i| ((i * 11 + 5) % v) as u8).collect();
        for d in [1usize, 2, 3, 4] {
            let lay = TileLayout::build(&codes, m, k, g, v, d, None).unwrap();
            assert_eq!(matches!(lay.data, IndexData::U16(_)), d >= 3);
            for row in 0..m {
                for grp in 0..k / g {
                    for t in 0..lay.tuples.per_group {
                        let k0 = grp * g + t * d;
                        let r = lay.tuples.depth_of(t);
                        let want: usize = (0..r)
                            .map(|j| codes[row * k + k0 + j] as usize * v.pow(j as u32))
                            .sum();
                        assert_eq!(lay.index(grp, row, t), want);
                    }
                }
            }
        }
    }

    #[test]
    fn folding_keeps_the_prefix_and_marks_mirrored_indices() {
        use crate::format::{Codebook, Format};
        let (m, k) = (70usize, 24usize);
        for (f, g, d) in [
            (Format::Int4, 6usize, 2usize),
            (Format::Fp4, 6, 2),
            (Format::Int2, 6, 4),
            (Format::Ternary, 8, 3),
            (Format::Int3, 6, 2),
        ] {
            let cb = Codebook::new(f).unwrap();
            let (v, mir) = (cb.levels(), cb.mirror().unwrap());
            assert!(TileLayout::can_fold(v, d, &mir));
            let codes: Vec<u8> = (0..m * k).map(|i| ((i * 7 + 3) % v) as u8).collect();
            let plain = TileLayout::build(&codes, m, k, g, v, d, None).unwrap();
            let folded = plain.clone().fold(&mir);
            assert!(folded.folded);
            for row in 0..m {
                for grp in 0..k / g {
                    for t in 0..plain.tuples.per_group {
                        let r = plain.tuples.depth_of(t);
                        let (idx, b) = (plain.index(grp, row, t), folded.index(grp, row, t));
                        let h = mir.stored_entries(r);
                        if idx < h {
                            assert_eq!(b, idx, "{f:?}");
                        } else {
                            assert!(b & 0x80 != 0 && (b & 0x7f) < h, "{f:?}");
                            assert_eq!(mir.index(b & 0x7f, r), idx, "{f:?}");
                        }
                    }
                }
            }
        }
        // Ternary at depth 5 stores 122 entries (indices up to the all-centre one): 7 bits.
        let cb = Codebook::new(Format::Ternary).unwrap();
        assert!(TileLayout::can_fold(3, 5, &cb.mirror().unwrap()));
        assert_eq!(cb.mirror().unwrap().stored_entries(5), 122);
    }

    #[test]
    fn pairing_keeps_every_index() {
        // Odd and even tuple counts per group, ragged rows, depths 1 and 2.
        let (m, k) = (70usize, 30usize);
        for (v, d, g) in [
            (16usize, 1usize, 6usize),
            (16, 1, 5),
            (8, 1, 15),
            (4, 2, 6),
            (3, 2, 10),
            (4, 2, 5),
        ] {
            let codes: Vec<u8> = (0..m * k).map(|i| ((i * 7 + 3) % v) as u8).collect();
            let plain = TileLayout::build(&codes, m, k, g, v, d, None).unwrap();
            assert!(TileLayout::can_pair(v, d));
            let paired = plain.pair().unwrap();
            assert_eq!(paired.kind(), LayoutKind::Paired);
            assert_eq!(paired.slots_per_group(), plain.tuples.per_group.div_ceil(2));
            for row in 0..m {
                for grp in 0..k / g {
                    for t in 0..plain.tuples.per_group {
                        assert_eq!(
                            paired.index(grp, row, t),
                            plain.index(grp, row, t),
                            "v={v} d={d} g={g}"
                        );
                    }
                }
            }
        }
        assert!(!TileLayout::can_pair(3, 3) && !TileLayout::can_pair(16, 2));
    }

    #[test]
    fn per_group_tiling_pads_with_zeros() {
        let (m, groups) = (65usize, 3usize);
        let vals: Vec<f32> = (0..m * groups).map(|i| i as f32 + 1.0).collect();
        let t = tile_per_group(&vals, m, groups);
        assert_eq!(t.len(), groups * 2 * 64);
        assert_eq!(t[(2 * 2 + 1) * 64], vals[64 * groups + 2]);
        assert_eq!(t[(2 * 2 + 1) * 64 + 1], 0.0);
    }
}
