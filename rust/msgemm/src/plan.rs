//! The per-call plan: everything a table builder and a kernel need to know about one call.

use maleki_common::{Error, Result};

use crate::format::{integer_form, Codebook, Mirror};
use crate::layout::{Tuples, ROW_BLOCK};
use crate::table::{I8_BUDGET, I8_CHUNK};

/// The most tuples per group on `i8` tables: the kernels sum each chunk of [`I8_CHUNK`]
/// tuples' products `m_p e_p` (at most `127 * I8_BUDGET` in all, an int16) and add the chunks
/// in int32, which holds `floor(i32::MAX / (127 * I8_BUDGET)) = 65540` of them. (The bound
/// was one entry of 127 per tuple, 16,909,320 tuples, before stop 41: per-channel groups of
/// 6 M inputs at depth 1, or 16.8 M at depth 2, wrapped around and gave wrong sums.)
pub const I8_MAX_TUPLES: usize = (i32::MAX as usize / (127 * I8_BUDGET as usize)) * I8_CHUNK;

/// Precision of the look-up tables (spec section 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TablePrecision {
    /// Float32 tables and float32 accumulation: the accurate mode.
    F32,
    /// Exact integer tables: activations quantized to int8 per (column, group), integer (or
    /// power-of-two scaled dyadic) codebooks, int16 entries, exact int32 partial sums.
    I16,
    /// Fast mode: float tables rounded to int8 with one scale per (column, group) and an
    /// integer multiplier per tuple (`table::i8_scaling`), exact
    /// integer partial sums.
    I8,
}

impl TablePrecision {
    pub fn name(self) -> &'static str {
        match self {
            TablePrecision::F32 => "f32",
            TablePrecision::I16 => "i16",
            TablePrecision::I8 => "i8",
        }
    }

    pub fn from_name(name: &str) -> Result<TablePrecision> {
        match name {
            "f32" => Ok(TablePrecision::F32),
            "i16" => Ok(TablePrecision::I16),
            "i8" => Ok(TablePrecision::I8),
            _ => Err(Error::invalid(
                "table",
                format!("must be one of 'i8', 'i16', 'f32'; got {name:?}"),
            )),
        }
    }
}

/// Everything that fixes the arithmetic of one call. Two backends given the same plan and
/// inputs must produce bitwise identical outputs (see `KERNELS.md`).
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Rows of W (output features).
    pub m: usize,
    /// Inputs (reduction length).
    pub k: usize,
    /// Columns of X.
    pub n: usize,
    /// Codebook levels V.
    pub levels: usize,
    pub group_size: usize,
    /// Groups per row, `K / G`.
    pub groups: usize,
    /// Row blocks of 64, `ceil(M / 64)`.
    pub row_blocks: usize,
    /// The tuple structure of a group (depth, tuples per group, depth of the last tuple).
    pub tuples: Tuples,
    /// Entries per table slot: `V^d`, or the stored prefix `ceil(V^d / 2)` with mirror.
    /// A tuple of smaller depth `r` (the last of a group) uses only its first `V^r` (mirror:
    /// `ceil(V^r / 2)`) entries; the rest of its slot is zero.
    pub slot: usize,
    pub precision: TablePrecision,
    /// The mirror symmetry used, if enabled.
    pub mirror: Option<Mirror>,
    /// True when the kernel applies the zero-point term `- z * zsum` (zero points present, or
    /// mirror with a non-zero shift).
    pub zero_term: bool,
    /// The shift of the table codebook: the mirror's, or the centring of `i8` tables with zero
    /// points (see [`Plan::new`]); 0 otherwise. The effective zero points are `z - shift`.
    pub shift: f32,
    /// The codebook the tables are built from: `v - shift` (shift 0 without mirror); invalid
    /// fp8 codes read 0.
    pub table_values: Vec<f32>,
    /// `i16` mode: `(v - shift) * 2^int_exp` as integers.
    pub int_values: Option<Vec<i32>>,
    /// `i16` mode: the power of two that makes the codebook integer.
    pub int_exp: i32,
    /// `i8` mode: the codes (labels, with [`Plan::labels`]) that occur in the weights
    /// (`None`: all). The int8 scale of each table covers only the entries whose digits are
    /// all such codes, or (mirror) whose mirror's digits are; the others are never looked up
    /// (they saturate at +-127).
    pub i8_used: Option<Vec<bool>>,
    /// The sign-magnitude label of every code ([`crate::format::SignMagnitude`]) when the
    /// tables are built in label space: mirror requested, no zero points, a codebook whose
    /// own mirror needs a shift (int4, int3, int2) and weights that never use its spare code.
    /// Table indices are then formed from labels, and `mirror` is the shift-free
    /// [`crate::format::Involution::SignBit`] of label space.
    pub labels: Option<Vec<u8>>,
}

impl Plan {
    /// Builds and validates the plan of a call. `used`: which codes occur in the weights (see
    /// [`Plan::i8_used`] and [`Plan::labels`]); `None` when unknown.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        codebook: &Codebook,
        m: usize,
        k: usize,
        n: usize,
        group_size: usize,
        has_zeros: bool,
        depth: usize,
        precision: TablePrecision,
        mirror: bool,
        used: Option<&[bool]>,
    ) -> Result<Plan> {
        codebook.check_depth(depth)?;
        if n == 0 {
            return Err(Error::invalid("x", "must have at least one column"));
        }
        let levels = codebook.levels();
        let used = used.filter(|u| u.len() == levels);
        // Label space when the codebook's own mirror would need a shift (a zero-point term and
        // a coarser int8 grid) and the weights allow it.
        let sm = if mirror && !has_zeros && codebook.mirror().is_none_or(|mi| mi.shift != 0.0) {
            codebook
                .sign_magnitude()
                .filter(|sm| used.is_some_and(|u| !u[sm.spare]))
        } else {
            None
        };
        let mirror = if let Some(sm) = &sm {
            Some(sm.mirror())
        } else if mirror {
            Some(codebook.mirror().ok_or_else(|| {
                Error::Unsupported(format!(
                    "mirror=True needs a codebook symmetric under an involution of its codes; {} is not",
                    codebook.format().name()
                ))
            })?)
        } else {
            None
        };
        // Mirror: tables of `v - shift`. `i8` tables of weights with zero points are centred the
        // same way (the zero points absorb the shift, so the zero-point term is free): their
        // entries then span `+-(V-1)/2 sum|x|` instead of up to `(V-1) sum|x|`, a finer int8 grid.
        let shift = match mirror {
            Some(m) => m.shift,
            None if precision == TablePrecision::I8 && has_zeros => {
                codebook.mirror().map_or(0.0, |m| m.shift)
            }
            None => 0.0,
        };
        let tuples = Tuples::new(group_size, depth);
        let slot = match mirror {
            Some(mi) => mi.stored_entries(depth),
            None => levels.pow(depth as u32),
        };
        let base_values = match &sm {
            Some(sm) => sm.values.clone(),
            None => codebook.table_values(),
        };
        let table_values: Vec<f32> = base_values.iter().map(|&v| v - shift).collect();
        let (int_values, int_exp) = if precision == TablePrecision::I16 {
            let (ints, e) = integer_form(&base_values, shift).ok_or_else(|| {
                Error::Unsupported(format!(
                    "table='i16' needs an integer codebook, or one that is integer after scaling by at most 2^8; {} is not: use table='i8' or 'f32'",
                    codebook.format().name()
                ))
            })?;
            let vmax = ints
                .iter()
                .map(|v| v.unsigned_abs() as u64)
                .max()
                .unwrap_or(0);
            if depth as u64 * vmax * 127 > i16::MAX as u64 {
                return Err(Error::Unsupported(format!(
                    "table='i16': depth {depth} with integer codebook magnitude {vmax} overflows int16 entries \
                     (needs depth * max|v| * 127 <= 32767)"
                )));
            }
            if (tuples.per_group as u64) * (i16::MAX as u64) > i32::MAX as u64 {
                return Err(Error::Unsupported(format!(
                    "table='i16': {} tuples per group could overflow the int32 partial sums",
                    tuples.per_group
                )));
            }
            (Some(ints), e)
        } else {
            (None, 0)
        };
        if precision == TablePrecision::I8 && tuples.per_group > I8_MAX_TUPLES {
            return Err(Error::Unsupported(format!(
                "table='i8': group too long for int32 partial sums ({} tuples, at most {I8_MAX_TUPLES})",
                tuples.per_group
            )));
        }
        Ok(Plan {
            m,
            k,
            n,
            levels,
            group_size,
            groups: k / group_size,
            row_blocks: m.div_ceil(ROW_BLOCK),
            tuples,
            slot,
            precision,
            mirror,
            zero_term: has_zeros || shift != 0.0,
            shift,
            table_values,
            int_values,
            int_exp,
            // The `i8` scales cover only the codes that occur (when some, but not all, do).
            i8_used: used
                .filter(|u| {
                    precision == TablePrecision::I8 && u.iter().any(|&x| x) && !u.iter().all(|&x| x)
                })
                .map(|u| match &sm {
                    Some(sm) => {
                        let mut l = vec![false; levels];
                        for (c, &x) in u.iter().enumerate() {
                            l[sm.labels[c] as usize] = x;
                        }
                        l
                    }
                    None => u.to_vec(),
                }),
            labels: sm.map(|sm| sm.labels),
        })
    }

    /// True when stored entry `idx` of a depth-`r` table can be looked up: it lies in the
    /// stored prefix, and its digits are all codes that occur, or (mirror) those of
    /// `mirror(idx)` are.
    #[inline]
    pub fn stored_used(&self, idx: usize, r: usize) -> bool {
        idx < self.used_entries(r)
            && (self.entry_used(idx, r)
                || self
                    .mirror
                    .is_some_and(|mi| self.entry_used(mi.index(idx, r), r)))
    }

    /// True when every digit of table index `idx` (depth `r`) is a code that occurs in the
    /// weights (always true without [`Plan::i8_used`]).
    #[inline]
    pub fn entry_used(&self, mut idx: usize, r: usize) -> bool {
        match &self.i8_used {
            None => true,
            Some(u) => (0..r).all(|_| {
                let c = idx % self.levels;
                idx /= self.levels;
                u[c]
            }),
        }
    }

    /// Depth d.
    pub fn depth(&self) -> usize {
        self.tuples.depth
    }

    /// Entries of the table of a tuple of depth `r` that are built and may be read.
    #[inline]
    pub fn used_entries(&self, r: usize) -> usize {
        match self.mirror {
            Some(mi) => mi.stored_entries(r),
            None => self.levels.pow(r as u32),
        }
    }
}
