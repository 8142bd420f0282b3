//! The dense int8 path of the `i16` mode: dot-product instructions instead of tables.
//!
//! In `i16` mode every partial sum is the exact integer `P = sum_k ints[q_k] * xq_k` of the
//! group's int8 activations `xq` and the codebook's integer values (see [`crate::table`]):
//! the tables only change how `P` is summed, not its value. On AVX-512 VNNI one `vpdpbusd`
//! multiplies 64 unsigned bytes by 64 signed bytes and adds them by fours into 16 int32 lanes;
//! on AVX2 a `vpmaddubsw` and a `vpmaddwd` do the same for 32 bytes into 8 lanes (with
//! AVX-VNNI, one 256-bit `vpdpbusd`: [`Kind::AvxVnni`]); on Arm64
//! with the dot-product extension one `sdot` (by element) does it for 16 bytes into 4 lanes,
//! against 4 activations broadcast from a register. Summing `P`
//! densely from the 4-bit codes beats looking it up, for a GEMV and more so for batches,
//! where the `i16` tables' lookups cost as much per column as the first (int4 4096 x 4096 on
//! 2 threads, `examples/prof`: AVX-512 VNNI N = 1 0.44 -> 0.20 ms, N = 16 and 64 0.90 / 3.6
//! ms against 2.2 / 7.5 ms with `i8` tables; AVX2 N = 1 0.31 -> 0.23 ms, N = 16 4.8-5.3 ->
//! 1.7-1.9 ms, `i8` tables 3.6 ms; figures in BENCHMARKS.md). The result is the same integer
//! and then the same epilogue as every `i16` kernel (`KERNELS.md`), so the output is bitwise
//! the scalar kernel's.
//!
//! Applies to `i16` plans (mirror plans included), codebooks of at most 16 levels whose
//! integer values are affine in the code (`ints[c] = c0 + a c`: int4, uint4 with zero
//! points, int3, int2, ternary, and their mirror plans) or span at most
//! [`map_span`] (255 on AVX-512 VNNI and AMX, 127 with `sdot`, 64 on AVX2: fp4, whose
//! integers are twice its values, IQ4_NL's 16 integers, custom integer codebooks: see
//! [`Ints`]), group sizes that are multiples of 8
//! (GEMVs of 2-bit codebooks: on AVX-512 VNNI only, see [`two_bit`]; codebooks of 256
//! levels affine in the code, int8 and uint8, one byte per code, not on AMX tiles), on backends `auto`, `avx512` (CPUs with AVX-512 F, BW and
//! VNNI) and `avx2` (AVX2 and F16C) on x86-64, `auto` and `neon` on Arm64 CPUs with the
//! dot-product extension (FEAT_DotProd; its speed is not measured on Arm hardware, its bits
//! are tested under qemu-user). Then `P = a * sum_k u_k xq_k + c0 * sum_k xq_k`, with `u` (the
//! codes, or their looked-up values) as the unsigned operand and the activations as the
//! signed one (`sdot` multiplies signed by signed: codes of at most 15 are the same bytes
//! either way).
//!
//! Weights are read from their own tile layout ([`DenseLayout`], built on first use, as large
//! as the packed codes of 4-bit formats).

use std::ops::Range;

use rayon::prelude::*;

use maleki_common::{alloc, pool, Error, Result};

use crate::aligned::AlignedVec;
use crate::gemm::{check_plan_call, job_zeros, k_slices, GemmOptions, YLayout};
use crate::kernels::Backend;
use crate::kernels::{Tiled, Zeros};
use crate::layout::ROW_BLOCK;
use crate::packed::PackedWeights;
use crate::plan::{Plan, TablePrecision};
use crate::table;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) mod amx;

/// Inputs per 4-byte weight word: two 4-bit codes per byte.
pub const CHUNK: usize = 8;
/// Rows per vector of int32 sums.
pub const SUB: usize = 16;
/// Vectors of rows per 64-row block.
const SUBS: usize = ROW_BLOCK / SUB;

/// The codes of the weights for the dense kernel: `[rb][g][c][s][16 rows][4 bytes]` (`s`:
/// 16-row part of the 64-row block `rb`, `c`: word of group `g`), the four parts' words
/// interleaved, on CPUs with the AVX-512 VNNI kernels ([`interleave_here`]), whose GEMVs sum
/// all four parts at once: they then read one stream per row block rather than four 1 KiB
/// streams (Zen 4, int4 g128 4096 x 4096 on two threads, minima of alternating builds: 0.065
/// -> 0.061 ms warm (0.069 -> 0.060 in another run), 0.23-0.26 -> 0.13-0.19 ms over 9 weight
/// sets; uint4 g128 0.070 -> 0.064, int8 g32 0.162 -> 0.147; on Zen 5, at stops 38 and 43,
/// a probe read the single stream 1.2x faster and the kernel was level). Elsewhere
/// `[rb][g][s][c][16 rows][4 bytes]`, each part's words one after another. Part `s`'s words
/// are [`DenseLayout::word_stride`] bytes apart. Rows past M hold code 0 (never written out).
///
/// 4 bits per code (every dense call but 2-bit GEMVs): word `c` holds the chunk of
/// [`CHUNK`] inputs from `k0 = g G + 8 c`; byte `j` of a row's word the codes of inputs
/// `k0 + 2j` (low nibble) and `k0 + 2j + 1` (high nibble).
///
/// 2 bits per code ([`two_bit`] GEMVs), where the parts' words are not interleaved: word `c`
/// holds the 16 inputs from `k0 = g G + 16 c`; bits `2p, 2p + 1` of byte `j` the code of input
/// `k0 + ORDER16[4p + j]`, so that the codes of bit pair `p` meet the activations at bytes
/// `4p .. 4p + 4` of the chunk in the order that [`Acts`] stores them. Where they are
/// ([`DenseLayout::pairs`]), the four parts share each word instead, one bit pair each:
/// `[rb][g][c][16 rows][4 bytes]`, word `c` (`G / 4` per group) holds 4 inputs of all 64 rows,
/// bits `2s, 2s + 1` of byte `j` of row `r` the code of row `16 s + r` and input
/// `g G + 16 (c / 4) + ORDER16[4 (c % 4) + j]`, the input whose activation [`Acts`] stores at
/// byte `4c + j` of the group. A GEMV then masks out each part's codes in place and multiplies
/// them by the same 4 activations (one broadcast per 256 codes), and the shifts back that
/// undo the bit pairs' weights `4^s` come once per part and group (`vnni::pairs_sums`).
///
/// 8 bits per code (codebooks of more than 16 levels: int8, uint8): words `2c` and `2c + 1`
/// hold the chunk of 8 inputs from `k0 = g G + 8 c`, byte `j` of word `2c + h` the code of
/// input `k0 + ORDER16[4h + j]` (the even inputs, then the odd ones, as [`Acts`] stores
/// them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DenseLayout {
    pub data: AlignedVec<u8>,
    pub groups: usize,
    pub row_blocks: usize,
    /// Words per part and group: `G / 8` (4 bits per code), `G / 16` (2 bits) or `G / 4` (8
    /// bits, and 2 bits with the parts in bit pairs, [`DenseLayout::pairs`]).
    pub chunks: usize,
    /// Bits per code: 4, 2 or 8.
    pub bits: u32,
    /// Whether the four parts' words are interleaved (`[rb][g][c][s]`; with 2 bits per code,
    /// the parts in the bit pairs of each word), or each part's words follow one another
    /// (`[rb][g][s][c]`).
    pub interleaved: bool,
    /// Bytes from a word of a part to its next: [`WORD_STRIDE`] where the parts' words are
    /// interleaved, `SUB * 4` where each part's words follow one another or share them.
    pub word_stride: usize,
}

/// The inputs of a 16-input chunk in the order [`Acts`] stores their activations (each 8 as
/// `0, 2, 4, 6, 1, 3, 5, 7`).
const ORDER16: [usize; 16] = [0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15];

/// Bytes from one word of a part of [`DenseLayout`] to its next: the four parts' words of a
/// row block and group are interleaved.
pub const WORD_STRIDE: usize = SUBS * SUB * 4;

impl DenseLayout {
    /// Bytes of one 16-row part of one group (its words, `word_stride` bytes apart; with the
    /// parts in bit pairs, the words that all four share).
    #[inline]
    pub fn part_bytes(&self) -> usize {
        self.chunks * SUB * 4
    }

    /// Whether the four parts' words are interleaved (`[rb][g][c][s]`; 2-bit codes: the
    /// parts in bit pairs), or each part's words follow one another (`[rb][g][s][c]`).
    #[inline]
    pub fn interleaved(&self) -> bool {
        self.interleaved
    }

    /// Whether the four parts share each word, part `s` in bit pair `s` of every byte (2-bit
    /// codes, interleaved).
    #[inline]
    pub fn pairs(&self) -> bool {
        self.bits == 2 && self.interleaved
    }

    /// Bytes of the words of one row block and group (all four parts).
    #[inline]
    fn block_bytes(&self) -> usize {
        if self.pairs() {
            self.part_bytes()
        } else {
            SUBS * self.part_bytes()
        }
    }

    /// Offset of the first word of part `s` of row block `rb` of group `g` in `data` (with
    /// the parts in bit pairs, the same for every part).
    #[inline]
    pub fn part(&self, g: usize, rb: usize, s: usize) -> usize {
        let step = match (self.pairs(), self.interleaved) {
            (true, _) => 0,
            (false, true) => SUB * 4,
            (false, false) => self.part_bytes(),
        };
        (rb * self.groups + g) * self.block_bytes() + s * step
    }

    /// Offset of word `c` of part `s` of row block `rb` of group `g` in `data`.
    #[inline]
    pub fn word(&self, g: usize, rb: usize, s: usize, c: usize) -> usize {
        self.part(g, rb, s) + c * self.word_stride
    }

    /// Offset just past the words of row block `rb` of group `g` (all four parts).
    #[inline]
    pub fn block_end(&self, g: usize, rb: usize) -> usize {
        (rb * self.groups + g + 1) * self.block_bytes()
    }

    /// Builds the layout from unpacked codes `(M, K)` row-major at `bits` (4: every code <
    /// 16, `group_size` a multiple of [`CHUNK`]; 2: every code < 4, `group_size` a multiple of
    /// 16; 8: any code, `group_size` a multiple of [`CHUNK`]), its parts' words interleaved
    /// (2 bits: the parts in bit pairs) where this CPU has the AVX-512 VNNI kernels
    /// ([`interleave_here`]). Fails only when its buffer cannot be allocated.
    pub fn build(
        codes: &[u8],
        m: usize,
        k: usize,
        group_size: usize,
        bits: u32,
    ) -> Result<DenseLayout> {
        Self::build_with(codes, m, k, group_size, bits, interleave_here())
    }

    /// [`DenseLayout::build`] with the parts' words interleaved or not.
    pub fn build_with(
        codes: &[u8],
        m: usize,
        k: usize,
        group_size: usize,
        bits: u32,
        interleaved: bool,
    ) -> Result<DenseLayout> {
        assert!(bits == 4 || bits == 2 || bits == 8);
        let word_inputs = 32 / bits as usize;
        assert!(group_size.is_multiple_of(word_inputs.max(CHUNK)) && k.is_multiple_of(group_size));
        assert_eq!(codes.len(), m * k);
        let groups = k / group_size;
        let row_blocks = m.div_ceil(ROW_BLOCK);
        let pairs = bits == 2 && interleaved;
        // With the parts in bit pairs a word holds 4 inputs of 64 rows, else `word_inputs` of
        // 16.
        let chunks = group_size / if pairs { 4 } else { word_inputs };
        let bytes_per_row_group = group_size * bits as usize / 8;
        let mut lay = DenseLayout {
            data: AlignedVec::try_zeroed(
                groups * row_blocks * ROW_BLOCK * bytes_per_row_group,
                "the dense layout of the weights",
            )?,
            groups,
            row_blocks,
            chunks,
            bits,
            interleaved,
            word_stride: if interleaved && !pairs {
                WORD_STRIDE
            } else {
                SUB * 4
            },
        };
        // One row block per task: its 64 rows of every group, contiguous.
        let per_block = groups * ROW_BLOCK * bytes_per_row_group;
        if per_block > 0 && pairs {
            lay.data
                .par_chunks_mut(per_block)
                .enumerate()
                .for_each(|(rb, out)| {
                    // Words `[g][c]`, 64 rows of 4 inputs each, part `s` in bit pair `s`; the
                    // 4 words of each 16-input span filled from the 16 codes of each row.
                    const ZERO: [u8; 16] = [0; 16];
                    for (span, words) in out.chunks_exact_mut(4 * SUB * 4).enumerate() {
                        let k0 = span * 16; // `g G + 16 (c / 4)`: G is a multiple of 16
                        for r in 0..SUB {
                            let src: [&[u8]; SUBS] = std::array::from_fn(|s| {
                                let row = rb * ROW_BLOCK + s * SUB + r;
                                if row < m {
                                    &codes[row * k + k0..][..16]
                                } else {
                                    &ZERO[..]
                                }
                            });
                            for (q, word) in words.chunks_exact_mut(SUB * 4).enumerate() {
                                for (j, b) in word[4 * r..4 * r + 4].iter_mut().enumerate() {
                                    let i = ORDER16[4 * q + j];
                                    *b = src[0][i]
                                        | (src[1][i] << 2)
                                        | (src[2][i] << 4)
                                        | (src[3][i] << 6);
                                }
                            }
                        }
                    }
                });
        } else if per_block > 0 {
            lay.data
                .par_chunks_mut(per_block)
                .enumerate()
                .for_each(|(rb, out)| {
                    // Word `c` of part `s` of group `g`: `[g][c][s]` or `[g][s][c]`.
                    for (i, words) in out.chunks_exact_mut(SUB * 4).enumerate() {
                        let (g, c, s) = if interleaved {
                            (i / (chunks * SUBS), i / SUBS % chunks, i % SUBS)
                        } else {
                            (i / (chunks * SUBS), i % chunks, i / chunks % SUBS)
                        };
                        let row0 = rb * ROW_BLOCK + s * SUB;
                        // 8 bits: the chunk of words `c` and `c ^ 1`, half `c % 2`.
                        let k0 = match bits {
                            8 => g * group_size + (c / 2) * CHUNK,
                            _ => g * group_size + c * word_inputs,
                        };
                        let span = word_inputs.max(CHUNK);
                        for (r, word) in words.chunks_exact_mut(4).enumerate() {
                            let row = row0 + r;
                            if row >= m {
                                break;
                            }
                            let src = &codes[row * k + k0..row * k + k0 + span];
                            for (j, b) in word.iter_mut().enumerate() {
                                *b = match bits {
                                    4 => src[2 * j] | (src[2 * j + 1] << 4),
                                    2 => (0..4)
                                        .fold(0, |b, p| b | (src[ORDER16[4 * p + j]] << (2 * p))),
                                    _ => src[ORDER16[4 * (c % 2) + j]],
                                };
                            }
                        }
                    }
                });
        }
        Ok(lay)
    }
}

/// Whether [`DenseLayout::build`] interleaves the parts' words on this CPU: where it has the
/// AVX-512 VNNI kernels, whose GEMVs sum all four parts at once. The AVX2 and `sdot` kernels
/// sum one part (or half of one) at a time, which read the interleaved words more slowly (Zen
/// 4, backend `avx2`, int4 g128 4096 x 4096 on two threads: 0.131 against 0.156 ms; N = 4
/// 0.387 against 0.438), so on other CPUs each part's words follow one another.
pub fn interleave_here() -> bool {
    static HERE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HERE.get_or_init(|| Kind::Vnni512.available())
}

/// Largest span (`max - min`) of a non-affine codebook's integer values that the dense
/// kernels take: each code's value less the minimum, `u <= 255`, is an unsigned byte. Each
/// kernel takes less or as much ([`map_span`]).
pub const MAP_SPAN: i32 = 255;

/// Largest span of a non-affine codebook's integer values that the dense kernel `kind`
/// sums. `vpdpbusd` and AMX's `tdpbsud` multiply unsigned bytes by int8 activations into
/// int32: any byte (IQ4_NL's 16 integers span 240), and so does AVX-VNNI's. AVX2 adds four
/// products in int16 (`4 * 64 * 127 < 2^15`: at most 64); `sdot` reads the bytes as signed
/// (at most 127).
pub fn map_span(kind: Kind) -> i32 {
    match kind {
        Kind::Vnni512 | Kind::Amx | Kind::AvxVnni => MAP_SPAN,
        Kind::Sdot => 127,
        Kind::Avx2 => 64,
    }
}

/// The integers a dense call sums: `ints[c] = c0 + a u(c)` for every code `c` the weights may
/// hold, with `u(c) = c` (a codebook affine in its codes: int4, uint4, int3, int2, ternary
/// and their mirror plans; `map` None), or else, for an integer codebook whose values span at
/// most [`MAP_SPAN`] (fp4, IQ4_NL's integers, custom integer codebooks; each kernel's limit:
/// [`map_span`]), `a = 1`, `c0` the smallest value and
/// `u(c) = map[c] = ints[c] - c0`, which the kernels look up from the 4-bit code in
/// registers (`vpshufb`, Arm64 `tbl`: one more instruction per 64 (AVX-512), 32 (AVX2) or 16
/// (Arm64) codes, shared by every column).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ints {
    pub a: i32,
    pub c0: i32,
    pub map: Option<[u8; 16]>,
    /// The largest `u(c)`: the largest code, or of `map`.
    pub u_max: i64,
}

/// The plan's [`Ints`], when its integer values are affine in the code (codebooks of up to 256
/// levels: codes up to 255, one unsigned byte) or, for at most 16 levels, span at most
/// [`MAP_SPAN`]. In label space ([`Plan::labels`]) code `c`'s integer is that of its label,
/// and the spare code (label `V/2`, which the weights never use: see
/// [`crate::format::SignMagnitude`]) is left out (mapped to 0).
pub fn ints(plan: &Plan) -> Option<Ints> {
    let ints = plan.int_values.as_deref()?;
    if plan.levels > 256 {
        return None;
    }
    let code_ints: Vec<Option<i32>> = match &plan.labels {
        None => ints.iter().map(|&v| Some(v)).collect(),
        Some(labels) => labels
            .iter()
            .map(|&l| (usize::from(l) != plan.levels / 2).then(|| ints[usize::from(l)]))
            .collect(),
    };
    if let Some((a, c0)) = affine(&code_ints) {
        return Some(Ints {
            a,
            c0,
            map: None,
            u_max: plan.levels as i64 - 1,
        });
    }
    if plan.levels > 16 {
        return None;
    }
    let known = code_ints.iter().flatten();
    let (lo, hi) = (*known.clone().min()?, *known.max()?);
    if i64::from(hi) - i64::from(lo) > i64::from(MAP_SPAN) {
        return None;
    }
    let mut map = [0u8; 16];
    for (m, v) in map.iter_mut().zip(&code_ints) {
        // In range: `0 <= v - lo <= MAP_SPAN`.
        *m = v.map_or(0, |v| (v - lo) as u8);
    }
    Some(Ints {
        a: 1,
        c0: lo,
        map: Some(map),
        u_max: i64::from(map.iter().copied().max().unwrap_or(0)),
    })
}

/// `(a, c0)` with `code_ints[c] = c0 + a c` for every code with a value (`None`: a code the
/// weights never hold), when there is such a line through integers.
fn affine(code_ints: &[Option<i32>]) -> Option<(i32, i32)> {
    let mut known = code_ints
        .iter()
        .enumerate()
        .filter_map(|(c, v)| v.map(|v| (c as i64, i64::from(v))));
    let (c_a, v_a) = known.next()?;
    let (a, c0) = match known.next() {
        // Two known codes fix the line; it must pass through integers at every code.
        Some((c_b, v_b)) => {
            let d = c_b - c_a;
            if (v_b - v_a) % d != 0 {
                return None;
            }
            let a = (v_b - v_a) / d;
            (a, v_a - a * c_a)
        }
        None => (0, v_a),
    };
    let fits = code_ints
        .iter()
        .enumerate()
        .all(|(c, v)| v.is_none_or(|v| i64::from(v) == c0 + a * c as i64));
    fits.then_some((i32::try_from(a).ok()?, i32::try_from(c0).ok()?))
}

/// Which instructions sum a dense call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// AVX-512 VNNI `vpdpbusd`: 16 rows per instruction.
    Vnni512,
    /// Intel AMX tiles (`tdpbsud`, Linux): 16 rows by 16 columns per instruction (the
    /// module [`amx`] docs).
    Amx,
    /// AVX2 `vpmaddubsw` + `vpmaddwd`: 8 rows per pair (CPUs without AVX-512 VNNI or
    /// AVX-VNNI).
    Avx2,
    /// AVX2 with AVX-VNNI's 256-bit `vpdpbusd`: 8 rows per instruction, no int16 step (CPUs
    /// with AVX-VNNI but not AVX-512 VNNI: Intel's Alder Lake and later client cores, the
    /// E-core Xeons; or any, on backend `avx2`). Backend name `avx2`.
    AvxVnni,
    /// Arm64 `sdot` (the dot-product extension, FEAT_DotProd: optional from Armv8.2, required
    /// from Armv8.4; every Apple M-series, Graviton 2 and later, Cortex-A55/A76 and later): 4
    /// rows per instruction.
    Sdot,
}

impl Kind {
    /// The backend name this kernel belongs to.
    pub fn backend_name(self) -> &'static str {
        match self {
            Kind::Vnni512 => "avx512",
            Kind::Amx => "amx",
            Kind::Avx2 | Kind::AvxVnni => "avx2",
            Kind::Sdot => "neon",
        }
    }

    /// The backend whose calls run on this kernel.
    pub fn backend(self) -> Backend {
        match self {
            Kind::Vnni512 => Backend::Avx512,
            Kind::Amx => Backend::Amx,
            Kind::Avx2 | Kind::AvxVnni => Backend::Avx2,
            Kind::Sdot => Backend::Neon,
        }
    }

    /// Whether this CPU has the kernel's instructions (AMX: and the OS granted the tiles).
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c");
            match self {
                Kind::Vnni512 => {
                    is_x86_feature_detected!("avx512f")
                        && is_x86_feature_detected!("avx512bw")
                        && is_x86_feature_detected!("avx512vnni")
                }
                Kind::Amx => amx_ready(),
                Kind::Avx2 => avx2,
                Kind::AvxVnni => avx2 && is_x86_feature_detected!("avxvnni"),
                Kind::Sdot => false,
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            self == Kind::Sdot && std::arch::is_aarch64_feature_detected!("dotprod")
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            false
        }
    }

    /// The kernel's name in `plan_info` (`dense_kernel`).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Vnni512 => "avx512-vnni",
            Kind::Amx => "amx",
            Kind::Avx2 => "avx2",
            Kind::AvxVnni => "avx2-vnni",
            Kind::Sdot => "neon-sdot",
        }
    }
}

/// The dense kernel that runs calls on `backend` on this CPU, if any: on x86-64 `auto` takes
/// AVX-512 VNNI where the CPU has it, else AVX2 (with AVX-VNNI where the CPU has it), and
/// `avx512` and `avx2` name theirs; on Arm64
/// `auto` and `neon` take `sdot` where the CPU has the dot-product extension (without it, the
/// NEON table kernels run the call).
pub fn kind_for(backend: Backend) -> Option<Kind> {
    let have = |k: Kind| k.available().then_some(k);
    match backend {
        Backend::Auto => have(Kind::Vnni512)
            .or_else(|| have(Kind::AvxVnni))
            .or_else(|| have(Kind::Avx2))
            .or_else(|| have(Kind::Sdot)),
        Backend::Avx512 => have(Kind::Vnni512),
        Backend::Avx2 => have(Kind::AvxVnni).or_else(|| have(Kind::Avx2)),
        Backend::Amx => have(Kind::Amx),
        Backend::Neon => have(Kind::Sdot),
        _ => None,
    }
}

/// Whether this CPU and OS run the AMX kernel (Linux on x86-64 only; see [`amx::ready`]).
pub fn amx_ready() -> bool {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        amx::ready()
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        false
    }
}

/// Columns from which `auto` runs a dense call on AMX tiles rather than on AVX-512 VNNI,
/// where both exist. Below, an activation tile is mostly empty rows and unpacking the codes
/// costs as much as the VNNI sums. Measured (`examples/prof`, int4 g128 4096 x 4096, 2
/// threads of a Xeon with AMX, minima, three alternations, ms, VNNI / AMX): N = 4 0.33-0.35 /
/// 0.32-0.36, N = 6 0.49-0.52 / 0.35-0.42, N = 8 0.43-0.49 / 0.39-0.45, N = 16 0.86-0.95 /
/// 0.47-0.55, N = 64 3.2-3.6 / 1.6-1.7.
pub const AMX_MIN_COLUMNS: usize = 6;

/// Columns from which `auto` takes AMX tiles for groups of a prime number of chunks above 8
/// (e.g. g = 136), whose steps are one chunk: 8 inputs, an eighth of a full tile. Measured as
/// above at K = 4352, g = 136, ms, VNNI / AMX: N = 8 0.52 / 0.72, N = 16 1.09 / 0.86; at
/// g = 16 (steps of two chunks) AMX was faster from N = 8 (1.79 / 1.33).
pub const AMX_MIN_COLUMNS_SHORT_STEPS: usize = 16;

/// The dense kernel that runs `plan` on `backend`: [`kind_for`], except that `auto` takes
/// AMX tiles where the CPU has them from [`AMX_MIN_COLUMNS`] columns on
/// ([`AMX_MIN_COLUMNS_SHORT_STEPS`] when the group's steps are one chunk), for codes of at most
/// 4 bits (the AMX kernel unpacks nibbles).
pub fn kind_for_call(backend: Backend, plan: &Plan) -> Option<Kind> {
    let kind = kind_for(backend)?;
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    if kind == Kind::Vnni512
        && backend == Backend::Auto
        && plan.n >= AMX_MIN_COLUMNS
        && plan.levels <= 16
    {
        let short = amx::step_chunks(plan.group_size / CHUNK) == 1;
        if (!short || plan.n >= AMX_MIN_COLUMNS_SHORT_STEPS) && amx_ready() {
            return Some(Kind::Amx);
        }
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    let _ = plan;
    Some(kind)
}

/// Whether a default-table GEMV (`n = 1`) of groups of `group_size` inputs on `backend` takes
/// the dense path (where it [`applies`]) instead of `i8` tables: AVX-512 VNNI on AMD CPUs, any
/// group size; AVX2 (with or without AVX-VNNI) on any CPU, groups of at least
/// [`AVX2_GEMV_MIN_GROUP`]. There it is
/// faster and, with int8 activations summed exactly, more accurate (relative L1 about 6.7e-3
/// against 9.1e-3 at g128). Measured on Zen 5 (4096 x 4096, 2 threads, minima, ms, dense
/// against tables): from Python, three alternations, int4 g16 0.089 against 0.127, g32 0.070
/// against 0.107, uint4 g32 0.084 against 0.111, fp4 g32 0.062 against 0.110, fp4 g16 0.078
/// against 0.156, int3 g32 0.067 against 0.101, int2 g16 0.076 against 0.101; `examples/prof`
/// int4 g8 0.139 against 0.189, g64 0.056-0.058 against 0.083-0.086, g128 (with the 2-bit
/// layout for int2 / ternary, [`two_bit`]) as in BENCHMARKS.md. (Before the AVX-512 activation
/// quantizer and the register epilogue of stop 38, groups of 32 and less were level or mixed
/// and kept the tables.) The AVX2 kernels on the same CPU (`examples/prof`, backend `avx2`,
/// minima of four alternations, int4): g128 0.092 ms with AVX-VNNI, 0.153 without, against
/// 0.209 on `i8` tables; g32 0.170-0.171 / 0.175-0.256 against 0.272-0.275; but g16 0.29-0.37
/// against 0.255 and g8 0.58-0.61 against 0.41 (8 rows per vector: the epilogue per group
/// weighs twice AVX-512's). CPUs with AVX2 but not AVX-512 were not timed; on Intel's,
/// `vpshufb` (the tables' lookups) issues on one port, the multiplies on two, so the tables
/// should not fare better there. On Intel's Sapphire Rapids a GEMV on the tables was faster (0.158
/// against 0.182 ms), measured before the dense kernel kept several accumulator chains in
/// flight, and not timed there since. A fixed rule, not a timing, so a machine's choice (and
/// its bits) never changes from run to run.
pub fn gemv_preferred(backend: Backend, group_size: usize) -> bool {
    match kind_for(backend) {
        Some(Kind::Vnni512) => crate::kernels::amd_cpu(),
        Some(Kind::AvxVnni | Kind::Avx2) => group_size >= AVX2_GEMV_MIN_GROUP,
        _ => false,
    }
}

/// The smallest group size whose GEMVs [`gemv_preferred`] takes densely on AVX2.
pub const AVX2_GEMV_MIN_GROUP: usize = 32;

/// Whether a dense call of `plan` on `backend` reads the 2-bit layout ([`DenseLayout`]): GEMVs
/// of codebooks of at most 4 levels affine in their codes (int2, uint2, ternary) on AVX-512
/// VNNI, or on AVX-VNNI where the CPU has no AVX-512 VNNI (AVX2 without it would saturate its
/// int16 pairs), groups a multiple of 16 and of at most 2^16 inputs (each lane of a sum adds
/// `G` products of at most `255 * 128` on AVX-512, the whole bytes of the parts in bit pairs:
/// inside int32). They read half the bytes of the 4-bit layout and mask the codes in place (3
/// `vpand` + 4 `vpdpbusd` per 256 codes on AVX-512, 4 + 4 with AVX-VNNI). Measured on Zen 5,
/// before the parts were put in bit pairs (4096 x 4096, 2 threads, Rust, minima, ms, dense
/// against the `i8` tables): int2 g64 0.037-0.038 against 0.050-0.052, ternary g128 0.031
/// against 0.040-0.044; on its AVX-VNNI (backend `avx2`, which since then takes the tables
/// on that CPU) int2 g64 0.108 against 0.154-0.160, ternary g128 0.081 against 0.149.
pub fn two_bit(plan: &Plan, backend: Backend) -> bool {
    plan.n == 1
        && plan.levels <= 4
        && plan.group_size.is_multiple_of(16)
        && plan.group_size <= 1 << 16
        // Codes below 4 (at most 4 levels), summed as they are (no map).
        && ints(plan).is_some_and(|i| i.map.is_none())
        && match kind_for_call(backend, plan) {
            Some(Kind::Vnni512) => true,
            // The AVX-VNNI kernels read the 2-bit layout whose parts keep to their own
            // words: on CPUs with AVX-512 VNNI too (backend `avx2` asked for), whose layout
            // has the parts in bit pairs, these GEMVs take the tables (`applies`).
            Some(Kind::AvxVnni) => !interleave_here(),
            _ => false,
        }
}

/// The dense layout a call of `plan` on `backend` reads (built on first use, then cached).
pub fn layout_of<'a>(
    pw: &'a PackedWeights,
    plan: &Plan,
    backend: Backend,
) -> Result<&'a DenseLayout> {
    if two_bit(plan, backend) {
        pw.dense_layout2()
    } else {
        pw.dense_layout()
    }
}

/// Whether a call with `opts` may take the dense path, before its plan is made (the driver
/// then decides with [`applies`]).
pub fn may_apply(opts: &GemmOptions) -> bool {
    opts.precision == TablePrecision::I16 && kind_for(opts.backend).is_some()
}

/// Whether a call of `plan` on `backend` runs on the dense path (see the module docs).
pub fn applies(plan: &Plan, backend: Backend) -> bool {
    // A mirror plan's integers are those of the shifted codebook (int4: `2 c - 15`), still
    // affine in the code, and its epilogue subtracts the uniform shift term; in label space
    // they are the codebook's own (see `affine`): the same sums and bits either way.
    plan.precision == TablePrecision::I16
        // A GEMV of 2-bit codes reads them from the paired table layout at 2 bits per weight;
        // the dense path reads them at 2 bits only on AVX-512 VNNI ([`two_bit`]), elsewhere at
        // 4: the tables measured faster there (int2 g64 4096 x 4096, 2 threads: 0.19 against
        // 0.23 ms); from 2 columns on, the dense sums are (N = 4: 0.43 against 0.80 ms).
        && (plan.n >= 2 || plan.levels > 4 || two_bit(plan, backend))
        && plan.group_size.is_multiple_of(CHUNK)
        && ints(plan).is_some_and(|i| {
            // The int32 sums: with every integer `|c0 + a u| <= vmax` and activations of at
            // most 127, `|P| <= vmax 127 G` and `|c0 S| <= vmax 127 G`, so `|a Q| = |P - c0 S|`
            // is at most twice that: below 2^30 here, all three stay inside int32. (Bounding
            // `|a| u_max + |c0|` instead cut int8 off at G = 22075: its rows' single scale at
            // K = 28672 fell to 256-entry tables, 80x slower.)
            let (c0, top) = (i64::from(i.c0), i64::from(i.c0) + i64::from(i.a) * i.u_max);
            let bound = c0.abs().max(top.abs()) * 127 * plan.group_size as i64;
            // Codes of 8 bits (more than 16 levels) are summed as they are on AVX-512 VNNI,
            // in nibbles on AVX2 and with `sdot`; not by the AMX kernel, which unpacks nibbles
            // into its tiles.
            bound < i64::from(i32::MAX) / 2
                && kind_for_call(backend, plan).is_some_and(|k| {
                    (i.map.is_none() || i.u_max <= i64::from(map_span(k)))
                        && (plan.levels <= 16 || k != Kind::Amx)
                })
        })
}

/// One column's outputs of [`Acts::new`]: `((((xq, x), tsc), zsum), corr), sums`.
type ColumnOut<'a> = (
    (
        (((&'a mut [i8], &'a [f32]), &'a mut [f32]), &'a mut [f32]),
        &'a mut [i32],
    ),
    &'a mut [i32],
);

// Read by the x86-64 and Arm64 kernels only (the dense path does not apply elsewhere).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
/// The int8 activations of a call and the per-(column, group) constants of the epilogue.
struct Acts {
    /// `[n][K]` int8, each chunk of 8 inputs stored as inputs `0, 2, 4, 6, 1, 3, 5, 7` (the
    /// low then the high nibbles of a weight word), then [`CHUNK`] bytes of padding (the
    /// Arm64 kernel loads 16 bytes per chunk). For the AMX kernel, the same bytes in tiles
    /// instead (`amx::tile_activations`).
    xq: Vec<i8>,
    /// `[n][g]`: `tscale` (`a / 2^int_exp`) as [`table::build_block`] computes it.
    tsc: Vec<f32>,
    /// `[n][g]`: `zsum` as [`table::build_block`] computes it (0 without a zero term).
    zsum: Vec<f32>,
    /// `[n][g]`: `c0 * sum_k xq_k`, the constant part of `P`.
    corr: Vec<i32>,
    /// `[n][g]`: `sum_k xq_k` (the AVX2 kernel's 8-bit codes: see `avx2::half_sums`).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    sums: Vec<i32>,
}

impl Acts {
    /// From X transposed and permuted (`(N, K)` row-major), for the kernel `kind`: on the
    /// current pool when `parallel`, else on the calling thread without rayon.
    fn new(plan: &Plan, xt: &[f32], c0: i32, kind: Kind, parallel: bool) -> Result<Acts> {
        let (k, g_size, groups, n) = (plan.k, plan.group_size, plan.groups, plan.n);
        let mut xq = alloc::zeroed_vec::<i8>(n * k + CHUNK, "the int8 activations")?;
        let mut tsc = vec![0f32; n * groups];
        let mut zsum = vec![0f32; n * groups];
        let mut corr = vec![0i32; n * groups];
        let mut sums = vec![0i32; n * groups];
        let scale = 2f32.powi(plan.int_exp);
        let simd = simd_quantizer();
        let column = |(((((xq, x), tsc), zsum), corr), sums): ColumnOut<'_>| {
            let mut q = vec![
                0i32;
                if simd && g_size.is_multiple_of(16) {
                    0
                } else {
                    g_size
                }
            ];
            for g in 0..groups {
                let (a, sum) = quantize_interleaved(
                    &x[g * g_size..(g + 1) * g_size],
                    &mut xq[g * g_size..(g + 1) * g_size],
                    &mut q,
                    simd,
                );
                tsc[g] = a / scale;
                zsum[g] = if plan.zero_term {
                    sum as f32 * scale
                } else {
                    0.0
                };
                corr[g] = c0 * sum;
                sums[g] = sum;
            }
        };
        let cols = &mut xq[..n * k];
        if parallel {
            cols.par_chunks_mut(k)
                .zip(xt.par_chunks(k))
                .zip(tsc.par_chunks_mut(groups))
                .zip(zsum.par_chunks_mut(groups))
                .zip(corr.par_chunks_mut(groups))
                .zip(sums.par_chunks_mut(groups))
                .for_each(column);
        } else {
            cols.chunks_mut(k)
                .zip(xt.chunks(k))
                .zip(tsc.chunks_mut(groups))
                .zip(zsum.chunks_mut(groups))
                .zip(corr.chunks_mut(groups))
                .zip(sums.chunks_mut(groups))
                .for_each(column);
        }
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        if kind == Kind::Amx {
            xq = amx::tile_activations(&xq, n, k, plan.group_size / CHUNK)?;
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        let _ = kind;
        Ok(Acts {
            xq,
            tsc,
            zsum,
            corr,
            sums,
        })
    }
}

/// Whether [`quantize_interleaved`] may take its AVX-512 path on this CPU.
fn simd_quantizer() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// One group of activations `x` quantized to int8 as [`table::quantize_activations`] does,
/// into `out` (`x.len()` bytes) with each chunk of 8 inputs stored as `0, 2, 4, 6, 1, 3, 5, 7`
/// (the low then the high nibbles of a weight word). Returns `(a, sum of the int8 values)`.
/// With `simd` ([`simd_quantizer`]) and a length that is a multiple of 16 it runs in AVX-512
/// (the same bits: a 4096-input GEMV's activations took 3-4 us in scalar code, which every
/// thread of the call waits for); else `q` (`x.len()` entries) is its scratch.
fn quantize_interleaved(x: &[f32], out: &mut [i8], q: &mut [i32], simd: bool) -> (f32, i32) {
    assert_eq!(x.len(), out.len());
    #[cfg(target_arch = "x86_64")]
    if simd && x.len().is_multiple_of(16) {
        // SAFETY: `simd` is true only where AVX-512 F and BW were detected.
        return unsafe { quantize_avx512::group(x, out) };
    }
    let _ = simd;
    let q = &mut q[..x.len()];
    let a = table::quantize_activations(x, q);
    for (o, v) in out.chunks_exact_mut(CHUNK).zip(q.chunks_exact(CHUNK)) {
        for j in 0..CHUNK / 2 {
            o[j] = v[2 * j] as i8;
            o[CHUNK / 2 + j] = v[2 * j + 1] as i8;
        }
    }
    (a, q.iter().sum())
}

#[cfg(target_arch = "x86_64")]
mod quantize_avx512 {
    use std::arch::x86_64::*;

    /// [`super::quantize_interleaved`] for `x.len()` a multiple of 16.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn group(x: &[f32], out: &mut [i8]) -> (f32, i32) {
        assert!(x.len().is_multiple_of(16) && out.len() == x.len());
        let (xs, os) = (x.as_ptr(), out.as_mut_ptr());
        // SAFETY: every access is 16 floats / 16 bytes at a multiple of 16 below `x.len()`.
        unsafe {
            // `max(|x|, m)` returns `m` where `|x|` is NaN: NaN ignored, as `f32::max` does.
            let mut m = _mm512_setzero_ps();
            for i in (0..x.len()).step_by(16) {
                m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(xs.add(i))), m);
            }
            let maxabs = _mm512_reduce_max_ps(m);
            if maxabs == 0.0 {
                out.fill(0);
                return (0.0, 0);
            }
            let rcp = _mm512_set1_ps(127.0f32 / maxabs);
            let (lo, hi) = (_mm512_set1_ps(-127.5), _mm512_set1_ps(127.5));
            let (qlo, qhi) = (_mm512_set1_epi32(-127), _mm512_set1_epi32(127));
            // Within each 8 bytes: inputs 0, 2, 4, 6, then 1, 3, 5, 7.
            let order = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
            let mut sum = _mm512_setzero_si512();
            for i in (0..x.len()).step_by(16) {
                let v = _mm512_mul_ps(_mm512_loadu_ps(xs.add(i)), rcp);
                // NaN (0 * inf where 127 / maxabs overflows) becomes 0, as in scalar code.
                let ordered = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(v, v);
                let v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
                let q = _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                    v,
                );
                let q = _mm512_maskz_mov_epi32(
                    ordered,
                    _mm512_max_epi32(_mm512_min_epi32(q, qhi), qlo),
                );
                sum = _mm512_add_epi32(sum, q);
                let b = _mm_shuffle_epi8(_mm512_cvtepi32_epi8(q), order);
                _mm_storeu_si128(os.add(i) as *mut __m128i, b);
            }
            (maxabs / 127.0, _mm512_reduce_add_epi32(sum))
        }
    }
}

/// The constants of a dense call ([`Ints`], kernel) and the weights' dense layout, or an error
/// when the plan is not one for the dense path on `backend` ([`applies`]), is not a plan of
/// `pw` (the kernels read the layout through raw pointers at the plan's offsets), or `xt` /
/// `y` are not `N K` / `M N` long.
fn setup<'a>(
    pw: &'a PackedWeights,
    plan: &Plan,
    backend: Backend,
    xt: &[f32],
    y: &[f32],
) -> Result<(Ints, Kind, &'a DenseLayout)> {
    let (Some(ints), Some(kind), true) = (
        ints(plan),
        kind_for_call(backend, plan),
        applies(plan, backend),
    ) else {
        return Err(Error::Unsupported(
            "the dense i16 path does not apply to this plan on this backend and CPU".into(),
        ));
    };
    // A plan of `pw`'s shape and group size reads `pw`'s layout, built from that same
    // shape, within its bounds.
    check_plan_call(pw, plan, xt, y)?;
    Ok((ints, kind, layout_of(pw, plan, backend)?))
}

/// `y = Wd @ X` on the dense path into `y` (overwritten, laid out as `y_layout`), for a plan
/// that [`applies`]: per row and column, each K slice ([`k_slices`]) accumulated over its
/// groups in ascending order from `+0.0` with the `i16` epilogue, the slices added in order,
/// as [`crate::gemm::run_plan`] does. Runs on the current pool.
pub fn run(
    pw: &PackedWeights,
    plan: &Plan,
    backend: Backend,
    xt: &[f32],
    y: &mut [f32],
    y_layout: YLayout,
) -> Result<()> {
    let (ints, kind, lay) = setup(pw, plan, backend, xt, y)?;
    run_on(pw, plan, (ints, kind, lay), xt, y, y_layout)
}

/// [`run`] on the kernel `kind` instead of the one [`kind_for_call`] picks: for tests that
/// run each kernel this CPU has (AVX2 without AVX-VNNI on a CPU with it). Fails unless this
/// CPU has `kind` ([`Kind::available`]), the dense path applies to `plan` on `kind`'s backend
/// and `kind` sums its integers ([`map_span`]; AMX: codes of at most 4 bits).
#[doc(hidden)]
pub fn run_with_kind(
    pw: &PackedWeights,
    plan: &Plan,
    kind: Kind,
    xt: &[f32],
    y: &mut [f32],
    y_layout: YLayout,
) -> Result<()> {
    let backend = kind.backend();
    let (ints, _, lay) = setup(pw, plan, backend, xt, y)?;
    let fits = ints.map.is_none() || ints.u_max <= i64::from(map_span(kind));
    // The AVX-VNNI kernels read the 2-bit layout whose parts have words of their own.
    let two_bit_ok =
        lay.bits != 2 || kind == Kind::Vnni512 || (kind == Kind::AvxVnni && !lay.pairs());
    if !kind.available() || !fits || !two_bit_ok || (plan.levels > 16 && kind == Kind::Amx) {
        return Err(Error::Unsupported(format!(
            "the dense kernel {} does not run this plan on this CPU",
            kind.name()
        )));
    }
    run_on(pw, plan, (ints, kind, lay), xt, y, y_layout)
}

/// [`run`] once set up.
fn run_on(
    pw: &PackedWeights,
    plan: &Plan,
    (ints, kind, lay): (Ints, Kind, &DenseLayout),
    xt: &[f32],
    y: &mut [f32],
    y_layout: YLayout,
) -> Result<()> {
    let acts = Acts::new(plan, xt, ints.c0, kind, true)?;
    let blocks = Blocks::new(pw, plan, lay, &acts, (ints, kind));
    let n = plan.n;
    match y_layout {
        YLayout::MbyN => y.par_chunks_mut(ROW_BLOCK * n).enumerate().for_each_init(
            || blocks.scratch(),
            |ys, (rb, out)| blocks.rows(rb, out, ys),
        ),
        YLayout::NbyM => {
            let mut cols =
                alloc::zeroed_vec::<f32>(plan.row_blocks * ROW_BLOCK * n, "the output columns")?;
            cols.par_chunks_mut(ROW_BLOCK * n)
                .enumerate()
                .for_each_init(
                    || blocks.scratch(),
                    |ys, (rb, out)| blocks.columns(rb, out, ys),
                );
            y.par_chunks_mut(plan.m)
                .enumerate()
                .for_each(|(c, out)| columns_to_rows(&cols, n, c, out));
        }
    }
    Ok(())
}

/// [`run`] on the calling thread and, with `two` threads, the helper thread
/// ([`pool::join_here`]: the rows in two halves), without rayon: for callers off every pool
/// whose weights have everything the call reads built ([`PackedWeights::dense_ready`]), so
/// that a small call does not pay for waking the pool. The same bits as [`run`].
#[allow(clippy::too_many_arguments)]
pub fn run_here(
    pw: &PackedWeights,
    plan: &Plan,
    backend: Backend,
    xt: &[f32],
    y: &mut [f32],
    y_layout: YLayout,
    two: bool,
) -> Result<()> {
    let (ints, kind, lay) = setup(pw, plan, backend, xt, y)?;
    let acts = Acts::new(plan, xt, ints.c0, kind, false)?;
    let blocks = Blocks::new(pw, plan, lay, &acts, (ints, kind));
    let n = plan.n;
    let half = if two {
        plan.row_blocks.div_ceil(2)
    } else {
        plan.row_blocks
    };
    let sweep = |rb0: usize, out: &mut [f32], by_rows: bool| {
        let mut ys = blocks.scratch();
        for (i, chunk) in out.chunks_mut(ROW_BLOCK * n).enumerate() {
            if by_rows {
                blocks.rows(rb0 + i, chunk, &mut ys);
            } else {
                blocks.columns(rb0 + i, chunk, &mut ys);
            }
        }
    };
    let mut cols = Vec::new();
    let (target, by_rows): (&mut [f32], bool) = match y_layout {
        YLayout::MbyN => (y, true),
        YLayout::NbyM => {
            cols.resize(plan.row_blocks * ROW_BLOCK * n, 0.0);
            (&mut cols, false)
        }
    };
    let (first, second) = target.split_at_mut((half * ROW_BLOCK * n).min(target.len()));
    if second.is_empty() {
        sweep(0, first, by_rows);
    } else {
        pool::join_here(|| sweep(0, first, by_rows), || sweep(half, second, by_rows));
    }
    if y_layout == YLayout::NbyM {
        for (c, out) in y.chunks_mut(plan.m).enumerate() {
            columns_to_rows(&cols, n, c, out);
        }
    }
    Ok(())
}

/// Column `c` of `cols` (`[rb][n][64]`) into `out` (`M` floats).
pub(crate) fn columns_to_rows(cols: &[f32], n: usize, c: usize, out: &mut [f32]) {
    for (rb, dst) in out.chunks_mut(ROW_BLOCK).enumerate() {
        let src = &cols[(rb * n + c) * ROW_BLOCK..];
        dst.copy_from_slice(&src[..dst.len()]);
    }
}

// Read by the x86-64 and Arm64 kernels only (the dense path does not apply elsewhere).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
/// What the kernels read for every row block of a call.
struct Job<'a> {
    plan: &'a Plan,
    lay: &'a DenseLayout,
    acts: &'a Acts,
    /// The slope of the codebook's integer values (`P = a Q + c0 S`).
    a: i32,
    /// `u(c)` of the 16 codes, when not the code itself ([`Ints::map`]).
    map: Option<[u8; 16]>,
    scales: Tiled<'a>,
    zeros: Zeros<'a>,
}

/// A call's [`Job`], its kernel and K slices, and the two ways of writing a row block out.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
struct Blocks<'a> {
    job: Job<'a>,
    kind: Kind,
    slices: Vec<Range<usize>>,
}

impl<'a> Blocks<'a> {
    fn new(
        pw: &'a PackedWeights,
        plan: &'a Plan,
        lay: &'a DenseLayout,
        acts: &'a Acts,
        (ints, kind): (Ints, Kind),
    ) -> Blocks<'a> {
        let job = Job {
            plan,
            lay,
            acts,
            a: ints.a,
            map: ints.map,
            scales: pw.tiled_scales(),
            zeros: job_zeros(pw, plan),
        };
        Blocks {
            job,
            kind,
            slices: k_slices(plan),
        }
    }

    /// A scratch buffer for [`Blocks::sums`].
    fn scratch(&self) -> Vec<f32> {
        vec![0f32; self.slices.len() * ROW_BLOCK * self.job.plan.n]
    }

    /// The results of row block `rb` into `ys[..64 n]`, column-major (`[n][64]`).
    fn sums(&self, rb: usize, ys: &mut [f32]) {
        let n = self.job.plan.n;
        ys.fill(0.0);
        for (si, groups) in self.slices.iter().enumerate() {
            let ys = &mut ys[si * ROW_BLOCK * n..(si + 1) * ROW_BLOCK * n];
            block_sums(self, rb, groups.clone(), ys);
        }
        if self.slices.len() == 2 {
            let (first, second) = ys.split_at_mut(ROW_BLOCK * n);
            for (f, s) in first.iter_mut().zip(second.iter()) {
                *f += *s;
            }
        }
    }

    /// Row block `rb` into `out`, its rows of `(M, N)` row-major `y`.
    fn rows(&self, rb: usize, out: &mut [f32], ys: &mut [f32]) {
        self.sums(rb, ys);
        let n = self.job.plan.n;
        if n == 1 {
            // One column: rows and columns are the same 64 floats (a copy, not 64 scalar
            // moves with their bounds checks: 3.6% of a one-thread 4096 x 4096 GEMV).
            out.copy_from_slice(&ys[..out.len()]);
            return;
        }
        for (r, row) in out.chunks_exact_mut(n).enumerate() {
            for (c, o) in row.iter_mut().enumerate() {
                *o = ys[c * ROW_BLOCK + r];
            }
        }
    }

    /// Row block `rb` into `out` (`[n][64]`).
    fn columns(&self, rb: usize, out: &mut [f32], ys: &mut [f32]) {
        self.sums(rb, ys);
        out.copy_from_slice(&ys[..out.len()]);
    }
}

/// Adds the groups `groups` of row block `rb` into `ys` (`[n][64]`, column-major).
fn block_sums(b: &Blocks<'_>, rb: usize, groups: Range<usize>, ys: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `kind_for` (or `run_with_kind`: `Kind::available`) checked the CPU features;
        // `ys` holds `n * 64` floats.
        match b.kind {
            Kind::Vnni512 => unsafe { vnni::block_sums(&b.job, rb, groups, ys) },
            #[cfg(target_os = "linux")]
            Kind::Amx => unsafe { amx::block_sums(&b.job, rb, groups, ys) },
            #[cfg(not(target_os = "linux"))]
            Kind::Amx => unreachable!("AMX runs on Linux only"),
            Kind::Avx2 => unsafe { avx2::block_sums(&b.job, rb, groups, ys) },
            Kind::AvxVnni => unsafe { avx2::block_sums_vnni(&b.job, rb, groups, ys) },
            Kind::Sdot => unreachable!("no Arm64 kernel on x86-64"),
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: `kind_for` checked the dot-product extension; `ys` holds `n * 64` floats.
        match b.kind {
            Kind::Sdot => unsafe { sdot::block_sums(&b.job, rb, groups, ys) },
            Kind::Vnni512 | Kind::Amx | Kind::Avx2 | Kind::AvxVnni => {
                unreachable!("no x86-64 kernel on Arm64")
            }
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = (b, rb, groups, ys);
        unreachable!("dense::applies is false off x86-64 and Arm64")
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::{Job, CHUNK, SUB, SUBS, WORD_STRIDE};
    use crate::kernels::avx512::{load16, prefetch_tiled, scaled16, zero_vec};
    use crate::kernels::{Tiled, Zeros};
    use crate::layout::ROW_BLOCK;
    use crate::plan::TablePrecision;

    /// The low and the high nibbles of a 64-byte word of codes, as bytes; with `MAP`, each
    /// code `c` replaced by `map[c]` (the 16 bytes of `map` in every 128-bit lane).
    #[inline(always)]
    pub(super) unsafe fn nibbles<const MAP: bool>(v: __m512i, map: __m512i) -> (__m512i, __m512i) {
        // SAFETY: inlined into callers that enable AVX-512 F and BW.
        unsafe {
            let low = _mm512_set1_epi8(0x0f);
            let lo = _mm512_and_si512(v, low);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low);
            if MAP {
                (_mm512_shuffle_epi8(map, lo), _mm512_shuffle_epi8(map, hi))
            } else {
                (lo, hi)
            }
        }
    }

    /// How far ahead of their use the weights are prefetched, in bytes: a page. The hardware
    /// prefetchers stop at page boundaries, and from DRAM each new page then started with
    /// misses (int4 4096 x 4096 GEMV over 9 weight sets, Zen 5: one thread 0.56-0.64 -> 0.32
    /// ms, two 0.29-0.35 -> 0.21-0.24 ms; 2 KiB did not help, 8 KiB about as much as 4).
    const PF_DIST: usize = 4096;

    /// Prefetches the words [`PF_DIST`] ahead of `at`, the first of a row of the four parts'
    /// interleaved words: one line per row of four (the hardware prefetchers fetch the rest
    /// of a page once it has started), into L2 (`T1`). Zen 4, int4 g128 4096 x 4096 GEMV on
    /// two threads, one alternating run, minima, warm / over 9 weight sets, ms: no prefetch
    /// 0.058 / 0.21, one per page 0.059 / 0.20, this 0.059 / 0.19; (the layout before, a
    /// prefetch per line 0.065 / 0.25). Into L1 (`T0`), on the layout before, the weights came
    /// from DRAM at 2/3 the rate (0.39-0.48 against 0.24-0.30 ms).
    #[inline(always)]
    fn prefetch_row(at: *const u8) {
        // SAFETY: prefetching never faults (past the layout's end near its last page: never
        // dereferenced).
        unsafe { _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(PF_DIST) as *const i8) };
    }

    /// The sums `Q = sum_k q_k xq_k` of `P` consecutive 16-row parts and one group for `NC`
    /// columns: `w` the first part's first word (the interleaved layout: each part `chunks`
    /// words of 64 bytes, [`WORD_STRIDE`] apart), `x` the first column's activations of the
    /// group, `stride` bytes between columns. With `MAP`, each 4-bit code `c` is replaced by
    /// `map[c]` (the 16 bytes of `map`, in every 128-bit lane) before it is multiplied.
    ///
    /// Why several parts at once: each accumulator is a chain of dependent `vpdpbusd`s (4-5
    /// cycles each), so one part of one column (a GEMV) waited on that latency, not on the
    /// issue rate. `P * NC` accumulators, and below 8 of them a second set for the high
    /// nibbles (added at the end: integers, so the same sums), keep 8 or more chains in flight.
    ///
    /// With `B8` the codes are bytes (the 8-bit layout: `chunks` words per part, two per
    /// chunk, the even inputs' then the odd ones'), summed as they are in place of the low and
    /// high nibbles.
    ///
    /// With a second set and codes summed as they are, the high nibbles are masked in place
    /// (`16 c`, at most 240) rather than shifted down, their sums shifted back once at the end
    /// (exact: sums of multiples of 16), where groups of at most [`HI16_MAX_GROUP`] inputs keep
    /// them inside int32: one `vpand` per word instead of a shift and a `vpand` (Zen 4, int4
    /// g128, one thread, minima of alternating builds: 512 x 2048 in L2 8.0 -> 7.3 us).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn parts_sums<const P: usize, const NC: usize, const MAP: bool, const B8: bool>(
        w: *const u8,
        chunks: usize,
        x: *const i8,
        stride: usize,
        map: __m512i,
    ) -> [[__m512i; NC]; P] {
        // SAFETY: as `parts_sums_with`; the features are enabled here.
        unsafe {
            if P * NC < 8 && !MAP && !B8 && chunks * CHUNK <= HI16_MAX_GROUP {
                parts_sums_with::<P, NC, MAP, B8, true>(w, chunks, x, stride, map)
            } else {
                parts_sums_with::<P, NC, MAP, B8, false>(w, chunks, x, stride, map)
            }
        }
    }

    /// The largest group whose high nibbles [`parts_sums`] masks in place: each lane of their
    /// sum adds `G / 2` products of at most `240 * 128`, below 2^31 for `G <= 2^17`.
    const HI16_MAX_GROUP: usize = 1 << 17;

    /// [`parts_sums`], with `HI16` the high nibbles masked in place (a second set only).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn parts_sums_with<
        const P: usize,
        const NC: usize,
        const MAP: bool,
        const B8: bool,
        const HI16: bool,
    >(
        w: *const u8,
        chunks: usize,
        x: *const i8,
        stride: usize,
        map: __m512i,
    ) -> [[__m512i; NC]; P] {
        let split = P * NC < 8;
        let mut acc = [[_mm512_setzero_si512(); NC]; P];
        let mut acc_hi = [[_mm512_setzero_si512(); NC]; P];
        let words = if B8 { 2 } else { 1 };
        for ch in 0..chunks / words {
            // SAFETY: the parts hold `chunks` words of 64 bytes each; each column holds the
            // group's `8 chunks` activations.
            unsafe {
                let mut xs = [(_mm512_setzero_si512(), _mm512_setzero_si512()); NC];
                for (c, x2) in xs.iter_mut().enumerate() {
                    let p = x.add(c * stride + ch * CHUNK) as *const i32;
                    *x2 = (
                        _mm512_set1_epi32(p.read_unaligned()),
                        _mm512_set1_epi32(p.add(1).read_unaligned()),
                    );
                }
                for (pi, (acc, acc_hi)) in acc.iter_mut().zip(acc_hi.iter_mut()).enumerate() {
                    let at = w.add(words * ch * WORD_STRIDE + pi * 64);
                    if pi == 0 {
                        prefetch_row(at);
                        if B8 {
                            prefetch_row(at.add(WORD_STRIDE));
                        }
                    }
                    let (lo, hi) = if B8 {
                        (
                            _mm512_load_si512(at as *const __m512i),
                            _mm512_load_si512(at.add(WORD_STRIDE) as *const __m512i),
                        )
                    } else if HI16 {
                        let v = _mm512_load_si512(at as *const __m512i);
                        (
                            _mm512_and_si512(v, _mm512_set1_epi8(0x0f)),
                            _mm512_and_si512(v, _mm512_set1_epi8(0xf0u8 as i8)),
                        )
                    } else {
                        nibbles::<MAP>(_mm512_load_si512(at as *const __m512i), map)
                    };
                    for (c, &(even, odd)) in xs.iter().enumerate() {
                        acc[c] = _mm512_dpbusd_epi32(acc[c], lo, even);
                        if split {
                            acc_hi[c] = _mm512_dpbusd_epi32(acc_hi[c], hi, odd);
                        } else {
                            acc[c] = _mm512_dpbusd_epi32(acc[c], hi, odd);
                        }
                    }
                }
            }
        }
        if split {
            for (acc, acc_hi) in acc.iter_mut().zip(acc_hi.iter()) {
                for (a, &h) in acc.iter_mut().zip(acc_hi.iter()) {
                    let h = if HI16 { _mm512_srai_epi32::<4>(h) } else { h };
                    *a = _mm512_add_epi32(*a, h);
                }
            }
        }
        acc
    }

    /// [`parts_sums`] of the four parts of a row block for one column on the 2-bit layout
    /// with the parts in bit pairs ([`super::DenseLayout::pairs`]): each of the `words` words
    /// holds 4 inputs of the 64 rows, part `s` in bit pair `s`, and meets the next 4
    /// activation bytes, broadcast once. Parts 0-2 are masked in place (`c 4^s`, at most 48),
    /// the whole bytes (at most 255, unsigned) summed as they are, each into an
    /// accumulator of its own; at the end part 3's sum is the whole less the other three, and
    /// each part's is shifted back (exact: sums of multiples of `4^s`; `two_bit` keeps `G <=
    /// 2^16`, so every lane stays inside int32: `255 * 127 * G < 2^31`). Two accumulators per
    /// sum (even and odd words): 8 chains of `vpdpbusd` in flight.
    ///
    /// 3 `vpand` and 4 `vpdpbusd` per 256 codes, and per row block and group 3 shifts and 7
    /// additions. The layout before (each word 16 inputs of one part, bit pair `p` the inputs
    /// of activation bytes `4p .. 4p + 4`) took 4 `vpand` per 256 codes and 24 operations per
    /// row block and group to shift back and add each part's four sums; on Zen 4, whose
    /// 512-bit `vpand` takes the vector pipes that `vpdpbusd` needs, int2 g64 4096 x 4096 on
    /// two threads 0.0634 -> 0.0532 ms, ternary g128 0.0538 -> 0.0478, 1024 x 2048 in L2 on
    /// one 16.0 -> 13.5 us (minima of 5 alternating rounds; the parts in bit pairs with 4
    /// masks: 15.2 us).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn pairs_sums(w: *const u8, words: usize, x: *const i8) -> [__m512i; SUBS] {
        let masks = [0x03u8, 0x0c, 0x30].map(|m| _mm512_set1_epi8(m as i8));
        // Per set: parts 0-2 masked, then the whole bytes (all four parts).
        let mut acc = [[_mm512_setzero_si512(); SUBS]; 2];
        // Four words (256 bytes, 16 inputs) per step: one prefetch each.
        for st in 0..words / 4 {
            // SAFETY: the row block holds `words` words of 64 bytes (a multiple of 4: `G` is
            // a multiple of 16); the column holds the group's `4 words` activations.
            unsafe {
                let at = w.add(st * 256);
                prefetch_row(at);
                for h in 0..4 {
                    let v = _mm512_load_si512(at.add(64 * h) as *const __m512i);
                    let xv =
                        _mm512_set1_epi32((x.add(16 * st + 4 * h) as *const i32).read_unaligned());
                    let a = &mut acc[h % 2];
                    for (a, &m) in a.iter_mut().zip(masks.iter()) {
                        *a = _mm512_dpbusd_epi32(*a, _mm512_and_si512(v, m), xv);
                    }
                    a[3] = _mm512_dpbusd_epi32(a[3], v, xv);
                }
            }
        }
        let [e, o] = acc;
        let a: [__m512i; SUBS] = std::array::from_fn(|s| _mm512_add_epi32(e[s], o[s]));
        let a3 = _mm512_sub_epi32(a[3], _mm512_add_epi32(_mm512_add_epi32(a[0], a[1]), a[2]));
        [
            a[0],
            _mm512_srai_epi32::<2>(a[1]),
            _mm512_srai_epi32::<4>(a[2]),
            _mm512_srai_epi32::<6>(a3),
        ]
    }

    /// The `P` 16-row parts' values of a tiled array from offset `i0` (`i0 + 16 P` inside it),
    /// widened from float16 where stored so.
    #[inline(always)]
    unsafe fn parts16<const P: usize>(t: Tiled<'_>, i0: usize) -> [__m512; P] {
        // SAFETY: in bounds (asserted); AVX-512 F enabled by the callers.
        unsafe {
            match t {
                Tiled::F32(v) => {
                    assert!(i0 + P * SUB <= v.len());
                    std::array::from_fn(|pi| _mm512_loadu_ps(v.as_ptr().add(i0 + pi * SUB)))
                }
                Tiled::F16(h) => {
                    assert!(i0 + P * SUB <= h.len());
                    std::array::from_fn(|pi| {
                        let at = h.as_ptr().add(i0 + pi * SUB) as *const __m256i;
                        _mm512_cvtph_ps(_mm256_loadu_si256(at))
                    })
                }
            }
        }
    }

    /// The 16-row parts `s0 .. s0 + P` of row block `rb`, columns `c0 .. c0 + NC` (at most 4
    /// at a time: `P * NC <= 8`), over the groups `groups` one after another: the sums, then
    /// the `i16` epilogue (`u = P; u -= z zsum; u *= tscale; y += s u`, as `scaled16`), with
    /// the rows' results kept in registers between the groups (loaded from `ys` at the start,
    /// stored at the end). Every call runs here. Until stop 42 only calls of 1 or 2 columns did;
    /// wider ones took the groups one at a time, 8 columns at a time, loading and storing the
    /// rows' results and branching on the variants per group and 16 rows, which weighed the
    /// more the smaller the groups (Zen 5, 4096 x 4096, two threads, from Python, ms, before /
    /// now: int4 g128 N = 4 0.171 / 0.138, N = 8 0.31-0.43 / 0.27, N = 64 2.3-2.9 / 1.9-2.6;
    /// uint4 g32 with zero points N = 4 0.36-0.39 / 0.22-0.26, N = 12 0.90-1.22 / 0.60-0.74,
    /// N = 32 2.7-3.8 / 2.1-2.4, N = 128 10.0 / 6.0, N = 512 40.7 / 24.2; int4 g128 N = 128
    /// 4.7 / 3.7, N = 512 19.4 / 16.0; int3 g16 N = 8 1.2-1.4 / 0.62-0.82, N = 64 8.1-10.5 /
    /// 4.6-5.5).
    ///
    /// With `B2` the weights are on the 2-bit layout ([`pairs_sums`]; one column, all four
    /// parts, `P = 4` and `s0 = 0`): the last, ragged row block and codebooks of slope other
    /// than 1 ([`gemv`] runs the others).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn parts_groups<const P: usize, const NC: usize, const B2: bool>(
        job: &Job<'_>,
        rb: usize,
        groups: Range<usize>,
        s0: usize,
        c0: usize,
        ys: &mut [f32],
    ) {
        let (plan, lay, acts) = (job.plan, job.lay, job.acts);
        let (k, ng) = (plan.k, plan.groups);
        let rows = plan.m - rb * ROW_BLOCK;
        assert!(ys.len() >= (c0 + NC) * ROW_BLOCK && s0 + P <= SUBS);
        let map = match &job.map {
            // SAFETY: 16 bytes.
            Some(m) => unsafe {
                _mm512_broadcast_i32x4(_mm_loadu_si128(m.as_ptr() as *const __m128i))
            },
            None => _mm512_setzero_si512(),
        };
        let a = _mm512_set1_epi32(job.a);
        // The common cases' epilogue in a few register operations (`a = 1`: int4, uint4, int2,
        // ternary, with or without zero points): the general one below, kept in a loop of
        // loads and branches, was ~19% of a GEMV's samples without zero points, and with them
        // (GPTQ / AWQ uint4, Q4_K) uint4 g32 GEMVs took 1.10-1.17x the time they take now,
        // calls of 2 columns 1.4-1.6x.
        let plain = (job.a == 1 && plan.precision == TablePrecision::I16).then_some(job.scales);
        let zt = plan.zero_term;
        let mask = |pi: usize| -> __mmask16 {
            let lanes = rows.saturating_sub((s0 + pi) * SUB).min(SUB);
            if lanes == SUB {
                !0
            } else {
                (1u16 << lanes) - 1
            }
        };
        // The rows' values so far (each group's epilogue adds to them).
        let mut y = [[_mm512_setzero_ps(); NC]; P];
        for (pi, y) in y.iter_mut().enumerate() {
            for (c, y) in y.iter_mut().enumerate() {
                let at = (c0 + c) * ROW_BLOCK + (s0 + pi) * SUB;
                // SAFETY: 64 floats per column of `ys` (asserted above).
                *y = unsafe { _mm512_maskz_loadu_ps(mask(pi), ys.as_ptr().add(at)) };
            }
        }
        for g in groups {
            prefetch_next_scales(job, g, rb);
            let w = lay.data[lay.part(g, rb, s0)..].as_ptr();
            let x = acts.xq[c0 * k + g * plan.group_size..].as_ptr();
            // SAFETY: as `parts`.
            let q = unsafe {
                if B2 {
                    // One column (`two_bit`), the four parts: `[_; 4]` as `[[_; NC]; P]`.
                    assert!(P == SUBS && s0 == 0);
                    let q = pairs_sums(w, lay.chunks, x);
                    std::array::from_fn(|pi| std::array::from_fn(|_| q[pi]))
                } else if job.map.is_some() {
                    parts_sums::<P, NC, true, false>(w, lay.chunks, x, k, map)
                } else if lay.bits == 8 {
                    parts_sums::<P, NC, false, true>(w, lay.chunks, x, k, map)
                } else {
                    parts_sums::<P, NC, false, false>(w, lay.chunks, x, k, map)
                }
            };
            let sz = (g * plan.row_blocks + rb) * ROW_BLOCK;
            if let Some(scales) = plain {
                // `scaled16` with `a = 1`: `P = Q + c0 S`, then `u = P - z zsum` (with a zero
                // term), `s (u tsc)`.
                let mut cst = [(
                    _mm512_setzero_si512(),
                    _mm512_setzero_ps(),
                    _mm512_setzero_ps(),
                ); NC];
                for (c, cst) in cst.iter_mut().enumerate() {
                    let gn = (c0 + c) * ng + g;
                    *cst = (
                        _mm512_set1_epi32(acts.corr[gn]),
                        _mm512_set1_ps(acts.tsc[gn]),
                        _mm512_set1_ps(acts.zsum[gn]),
                    );
                }
                // The parts' scales and zero points, loaded before the loop (one branch on
                // their types per group, none inside it).
                let i0 = sz + s0 * SUB;
                // SAFETY: in bounds (asserted in `parts16`; a zero term means zero points).
                let (scs, zs) = unsafe {
                    let zs: [__m512; P] = match job.zeros {
                        Zeros::Tiled(t) if zt => parts16(t, i0),
                        Zeros::Uniform(v) => [_mm512_set1_ps(v); P],
                        _ => [_mm512_setzero_ps(); P],
                    };
                    (parts16::<P>(scales, i0), zs)
                };
                for (((q, y), &sc), &z) in q.iter().zip(y.iter_mut()).zip(scs.iter()).zip(zs.iter())
                {
                    for ((&q, y), &(corr, tsc, zsum)) in q.iter().zip(y.iter_mut()).zip(cst.iter())
                    {
                        let mut u = _mm512_cvtepi32_ps(_mm512_add_epi32(q, corr));
                        if zt {
                            u = _mm512_sub_ps(u, _mm512_mul_ps(z, zsum));
                        }
                        *y = _mm512_add_ps(*y, _mm512_mul_ps(sc, _mm512_mul_ps(u, tsc)));
                    }
                }
                continue;
            }
            for (pi, (q, y)) in q.iter().zip(y.iter_mut()).enumerate() {
                let i = sz + (s0 + pi) * SUB;
                // SAFETY: 64 tiled values per (group, row block).
                let (sc, z) = unsafe {
                    let z = if plan.zero_term {
                        zero_vec(job.zeros, i)
                    } else {
                        _mm512_setzero_ps()
                    };
                    (load16(job.scales, i), z)
                };
                for (c, (&q, y)) in q.iter().zip(y.iter_mut()).enumerate() {
                    let gn = (c0 + c) * ng + g;
                    let p = if job.a == 1 {
                        q
                    } else {
                        _mm512_mullo_epi32(q, a)
                    };
                    let p = _mm512_add_epi32(p, _mm512_set1_epi32(acts.corr[gn]));
                    let (zs, tsc) = (acts.zsum[gn], acts.tsc[gn]);
                    // SAFETY: register operations.
                    let su = unsafe { scaled16(plan, zs, tsc, _mm512_cvtepi32_ps(p), sc, z) };
                    *y = _mm512_add_ps(*y, su);
                }
            }
        }
        for (pi, y) in y.iter().enumerate() {
            for (c, &y) in y.iter().enumerate() {
                let at = (c0 + c) * ROW_BLOCK + (s0 + pi) * SUB;
                // SAFETY: as the loads above.
                unsafe { _mm512_mask_storeu_ps(ys.as_mut_ptr().add(at), mask(pi), y) };
            }
        }
    }

    /// Per-row values of the epilogue (scales, zero points) read 16 rows at a time from offset
    /// `i` of their tiled layout (`[g][rb][64]`): as float32, as float16, or one value for
    /// every row (`Zeros::Uniform`). [`gemv`] is compiled for each, so that its loop over the
    /// groups has no branch on them.
    trait Rows16: Copy {
        /// Values in the tiled array (`usize::MAX` for one value): [`gemv`] asserts its reads
        /// against it.
        fn len(self) -> usize;
        /// The 16 values from offset `i`, as floats.
        ///
        /// # Safety
        /// `i + 16 <= len`; AVX-512 F enabled.
        unsafe fn get(self, i: usize) -> __m512;
        /// Prefetches the 64 values (one row block) from offset `i` (never faults).
        fn prefetch(self, i: usize);
    }

    impl Rows16 for &[f32] {
        fn len(self) -> usize {
            <[f32]>::len(self)
        }
        #[inline(always)]
        unsafe fn get(self, i: usize) -> __m512 {
            // SAFETY: the caller's.
            unsafe { _mm512_loadu_ps(self.as_ptr().add(i)) }
        }
        #[inline(always)]
        fn prefetch(self, i: usize) {
            for l in 0..4 {
                // SAFETY: prefetching never faults.
                unsafe {
                    _mm_prefetch::<_MM_HINT_T0>(self.as_ptr().wrapping_add(i + 16 * l) as *const i8)
                };
            }
        }
    }

    /// IEEE binary16 bits.
    impl Rows16 for &[u16] {
        fn len(self) -> usize {
            <[u16]>::len(self)
        }
        #[inline(always)]
        unsafe fn get(self, i: usize) -> __m512 {
            // SAFETY: the caller's.
            unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(self.as_ptr().add(i) as *const __m256i)) }
        }
        #[inline(always)]
        fn prefetch(self, i: usize) {
            for l in 0..2 {
                // SAFETY: prefetching never faults.
                unsafe {
                    _mm_prefetch::<_MM_HINT_T0>(self.as_ptr().wrapping_add(i + 32 * l) as *const i8)
                };
            }
        }
    }

    impl Rows16 for f32 {
        fn len(self) -> usize {
            usize::MAX
        }
        #[inline(always)]
        unsafe fn get(self, _i: usize) -> __m512 {
            // SAFETY: AVX-512 F enabled by the caller.
            unsafe { _mm512_set1_ps(self) }
        }
        #[inline(always)]
        fn prefetch(self, _i: usize) {}
    }

    /// [`gemv`] for this call's layout and types of scales and zero points; `false` when it
    /// does not apply (a ragged row block, codebooks of slope other than 1 or whose codes are
    /// looked up, codes of 8 bits), for `parts_groups`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn gemv_typed(job: &Job<'_>, rb: usize, groups: Range<usize>, ys: &mut [f32]) -> bool {
        let (plan, bits) = (job.plan, job.lay.bits);
        if (rb + 1) * ROW_BLOCK > plan.m
            || job.a != 1
            || plan.precision != TablePrecision::I16
            || job.map.is_some()
            || bits == 8
        {
            return false;
        }
        /// The layout and the scales' type, then `gemv`.
        macro_rules! scales {
            ($zt:literal, $z:expr) => {
                // SAFETY: `gemv` asserts its bounds; AVX-512 VNNI enabled here.
                unsafe {
                    match (bits == 2, job.scales) {
                        (true, Tiled::F32(s)) => {
                            gemv::<_, _, $zt, true>(job, rb, groups, ys, s, $z)
                        }
                        (true, Tiled::F16(s)) => {
                            gemv::<_, _, $zt, true>(job, rb, groups, ys, s, $z)
                        }
                        (false, Tiled::F32(s)) => {
                            gemv::<_, _, $zt, false>(job, rb, groups, ys, s, $z)
                        }
                        (false, Tiled::F16(s)) => {
                            gemv::<_, _, $zt, false>(job, rb, groups, ys, s, $z)
                        }
                    }
                }
            };
        }
        match (plan.zero_term, job.zeros) {
            (false, _) => scales!(false, 0f32),
            (true, Zeros::Uniform(z)) => scales!(true, z),
            (true, Zeros::Tiled(Tiled::F32(z))) => scales!(true, z),
            (true, Zeros::Tiled(Tiled::F16(z))) => scales!(true, z),
            (true, Zeros::None) => return false,
        }
        true
    }

    /// The GEMV of the 4 parts of a whole row block with the `a = 1` epilogue, on the 2-bit
    /// layout ([`pairs_sums`], `B2`) or the 4-bit one: what `parts_groups::<4, 1, B2>`
    /// computes (the same operations in the same order, so the same bits), with the types of
    /// the scales and zero points fixed at compile time and no bounds checks in the loop over
    /// the groups. Its branches on them per group, its bounds checks and its prefetch loop were
    /// about as many instructions as the dot products of a 2-bit group of 64 inputs (Zen 5,
    /// minima of alternating builds, 4096 x 4096 on two threads / 1024 x 2048 in L2 on one:
    /// int2 g64 0.039-0.040 -> 0.035-0.037 ms / 9.0-9.3 -> 8.1-8.3 us, ternary g128 7.5-7.7
    /// -> 7.1-7.3 us in L2; int4 g128 0.0566-0.0568 -> 0.0534-0.0545 ms / 11.4-11.9 ->
    /// 10.3-10.5 us, uint4 g32 with zero points 0.074-0.077 -> 0.072-0.075 ms (float16 ones
    /// 0.0725 -> 0.0688) / 18.1-21.3 -> 17.4-17.8 us).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn gemv<S: Rows16, Z: Rows16, const ZT: bool, const B2: bool>(
        job: &Job<'_>,
        rb: usize,
        groups: Range<usize>,
        ys: &mut [f32],
        scales: S,
        zeros: Z,
    ) {
        let (plan, lay, acts) = (job.plan, job.lay, job.acts);
        let stride = plan.row_blocks * ROW_BLOCK;
        let end = groups.end;
        assert!(ys.len() >= ROW_BLOCK && (rb + 1) * ROW_BLOCK <= plan.m && end <= plan.groups);
        assert!(
            scales.len() >= plan.groups * stride && (!ZT || zeros.len() >= plan.groups * stride)
        );
        assert!(acts.corr.len() >= end && acts.tsc.len() >= end && acts.zsum.len() >= end);
        assert!(acts.xq.len() >= end * plan.group_size);
        assert!(groups.is_empty() || lay.block_end(end - 1, rb) <= lay.data.len());
        // SAFETY: 64 floats in `ys`; every offset below is inside its array (asserted above).
        unsafe {
            let mut y: [__m512; SUBS] =
                std::array::from_fn(|s| _mm512_loadu_ps(ys.as_ptr().add(s * SUB)));
            for g in groups {
                let t = g * stride + rb * ROW_BLOCK;
                // `prefetch_next_scales`.
                if rb + 1 < plan.row_blocks {
                    scales.prefetch(t + ROW_BLOCK);
                    if ZT {
                        zeros.prefetch(t + ROW_BLOCK);
                    }
                }
                let w = lay.data.as_ptr().add(lay.part(g, rb, 0));
                let x = acts.xq.as_ptr().add(g * plan.group_size);
                let q = if B2 {
                    pairs_sums(w, lay.chunks, x).map(|q| [q])
                } else {
                    parts_sums::<SUBS, 1, false, false>(w, lay.chunks, x, 0, _mm512_setzero_si512())
                };
                let corr = _mm512_set1_epi32(*acts.corr.get_unchecked(g));
                let tsc = _mm512_set1_ps(*acts.tsc.get_unchecked(g));
                let zsum = _mm512_set1_ps(*acts.zsum.get_unchecked(g));
                for (s, (y, q)) in y.iter_mut().zip(q.iter()).enumerate() {
                    // As `parts_groups`' `a = 1` epilogue.
                    let mut u = _mm512_cvtepi32_ps(_mm512_add_epi32(q[0], corr));
                    if ZT {
                        u = _mm512_sub_ps(u, _mm512_mul_ps(zeros.get(t + s * SUB), zsum));
                    }
                    let su = _mm512_mul_ps(scales.get(t + s * SUB), _mm512_mul_ps(u, tsc));
                    *y = _mm512_add_ps(*y, su);
                }
            }
            for (s, y) in y.iter().enumerate() {
                _mm512_storeu_ps(ys.as_mut_ptr().add(s * SUB), *y);
            }
        }
    }

    /// Prefetches the scales and zero points of group `g` of the next row block, a row
    /// block's sweep ahead of their use: strided lines that the hardware prefetchers miss.
    /// (Int4 4096 x 4096 GEMV over 9 weight sets, two threads, ms, g128 / g32: no prefetch
    /// 0.22-0.26 / 0.36-0.58, the next group's 0.20-0.24 / 0.27-0.34, 2048 inputs ahead
    /// 0.20-0.25 / 0.31-0.47, this 0.21-0.23 / 0.24-0.26.)
    #[inline(always)]
    fn prefetch_next_scales(job: &Job<'_>, g: usize, rb: usize) {
        let plan = job.plan;
        if rb + 1 < plan.row_blocks {
            let next = (g * plan.row_blocks + rb + 1) * ROW_BLOCK;
            prefetch_tiled(job.scales, job.zeros, next, 1);
        }
    }

    /// [`super::block_sums`] on this CPU.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn block_sums(
        job: &Job<'_>,
        rb: usize,
        groups: Range<usize>,
        ys: &mut [f32],
    ) {
        let (plan, n) = (job.plan, job.plan.n);
        assert!(ys.len() >= n * ROW_BLOCK);
        // The parts' words interleaved (`interleave_here`, on every CPU with these kernels).
        assert!(job.lay.interleaved());
        let rows = plan.m - rb * ROW_BLOCK;
        let nparts = rows.div_ceil(SUB).min(SUBS);
        // SAFETY: AVX-512 VNNI enabled here; `gemv` asserts its bounds.
        if n == 1 && unsafe { gemv_typed(job, rb, groups.clone(), ys) } {
            return;
        }
        if job.lay.bits == 2 {
            // A GEMV on the 2-bit layout (`two_bit`), the parts in bit pairs: all four at
            // once (rows past M hold code 0, their lanes masked).
            assert!(n == 1 && job.lay.pairs());
            // SAFETY: as `parts_groups`.
            unsafe { parts_groups::<4, 1, true>(job, rb, groups, 0, 0, ys) };
            return;
        }
        // All groups per part, the rows' results in registers; columns 4, 2 or 1 at a time
        // (8 at a time spilled registers).
        let mut c0 = 0;
        while c0 < n {
            let nc = match n - c0 {
                4.. => 4,
                2.. => 2,
                _ => 1,
            };
            let mut s = 0;
            while s < nparts {
                let g = groups.clone();
                // SAFETY: as `parts_groups`: `s + P <= nparts <= SUBS`.
                unsafe {
                    s += match (nc, nparts - s) {
                        (4, 2..) => {
                            parts_groups::<2, 4, false>(job, rb, g, s, c0, ys);
                            2
                        }
                        (4, _) => {
                            parts_groups::<1, 4, false>(job, rb, g, s, c0, ys);
                            1
                        }
                        (2, 4..) => {
                            parts_groups::<4, 2, false>(job, rb, g, s, c0, ys);
                            4
                        }
                        (2, _) => {
                            parts_groups::<1, 2, false>(job, rb, g, s, c0, ys);
                            1
                        }
                        (_, 4..) => {
                            parts_groups::<4, 1, false>(job, rb, g, s, c0, ys);
                            4
                        }
                        _ => {
                            parts_groups::<1, 1, false>(job, rb, g, s, c0, ys);
                            1
                        }
                    }
                }
            }
            c0 += nc;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::{Job, CHUNK, SUB, SUBS};
    use crate::kernels::avx2::load_tiled8;
    use crate::kernels::scalar::epilogue;
    use crate::kernels::{Tiled, Zeros};
    use crate::layout::ROW_BLOCK;

    /// The low and the high nibbles of 32 bytes, as bytes.
    #[inline(always)]
    unsafe fn nibbles(v: __m256i) -> (__m256i, __m256i) {
        // SAFETY: inlined into callers that enable AVX2.
        unsafe {
            let low = _mm256_set1_epi8(0x0f);
            (
                _mm256_and_si256(v, low),
                _mm256_and_si256(_mm256_srli_epi16::<4>(v), low),
            )
        }
    }

    /// `Q` of 8 rows (half `h` of a 16-row part) and one group for `NC` columns, as
    /// `vnni::part_sums`: each 4-byte word's products summed by `vpmaddubsw` (codes times
    /// int8 activations, pairs in int16: at most `2 * 15 * 127`, the
    /// low and high nibbles' pairs added at most `4 * 15 * 127 = 7620`: no saturation) and
    /// `vpmaddwd` against ones (int32).
    /// With `MAP`, codes are looked up in `map` first, as in `vnni::part_sums` (values at
    /// most 64, [`super::map_span`]: the four products of a lane at most `4 * 64 * 127`).
    ///
    /// With `B8` the codes are bytes (the 8-bit layout: two words per chunk, the even inputs'
    /// then the odd ones'), summed as `u - 128` (see the loop): the sums are `Q - 128 S`,
    /// which [`half_q`] corrects.
    /// `ws`: bytes from a word of the part to its next ([`super::DenseLayout::word_stride`]).
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn half_sums<const NC: usize, const MAP: bool, const B8: bool>(
        w: *const u8,
        chunks: usize,
        ws: usize,
        x: *const i8,
        stride: usize,
        map: __m256i,
    ) -> [__m256i; NC] {
        let mut acc = [_mm256_setzero_si256(); NC];
        let ones = _mm256_set1_epi16(1);
        if B8 {
            // Each code `u` as the signed byte `u - 128` (its top bit flipped): `vpmaddubsw`
            // of `|u - 128|` (unsigned, at most 128) and the activation with the code's sign
            // (`vpsignb`) gives `(u - 128) xq` in pairs of at most `2 * 128 * 127` (no int16
            // saturation), so `Q - 128 S` (`S = sum_k xq_k`), which `half_q` corrects. (It
            // split each byte into nibbles before: 20 instructions per 64 codes of a GEMV
            // against 16; int8 g32 4096 x 4096 on Zen 5's AVX2, `examples/prof`, minima of
            // five alternations, ms: one thread N = 1 0.498 -> 0.480, N = 16 6.25 -> 5.71; two
            // threads N = 1 0.245 -> 0.233, N = 4 0.903 -> 0.887, N = 16 3.08 -> 2.90.)
            let flip = _mm256_set1_epi8(i8::MIN);
            for ch in 0..chunks / 2 {
                // SAFETY: as below; words `2 ch` and `2 ch + 1` of the part.
                unsafe {
                    let se = _mm256_xor_si256(
                        _mm256_load_si256(w.add(2 * ch * ws) as *const __m256i),
                        flip,
                    );
                    let so = _mm256_xor_si256(
                        _mm256_load_si256(w.add((2 * ch + 1) * ws) as *const __m256i),
                        flip,
                    );
                    let (ae, ao) = (_mm256_abs_epi8(se), _mm256_abs_epi8(so));
                    for (c, s) in acc.iter_mut().enumerate() {
                        let p = x.add(c * stride + ch * CHUNK) as *const i32;
                        let even = _mm256_set1_epi32(p.read_unaligned());
                        let odd = _mm256_set1_epi32(p.add(1).read_unaligned());
                        let pe = _mm256_maddubs_epi16(ae, _mm256_sign_epi8(even, se));
                        let po = _mm256_maddubs_epi16(ao, _mm256_sign_epi8(odd, so));
                        *s = _mm256_add_epi32(
                            *s,
                            _mm256_add_epi32(
                                _mm256_madd_epi16(pe, ones),
                                _mm256_madd_epi16(po, ones),
                            ),
                        );
                    }
                }
            }
            return acc;
        }
        for ch in 0..chunks {
            // SAFETY: as `vnni::part_sums` (32 of each 64-byte word vector; 32-byte aligned).
            unsafe {
                let (mut lo, mut hi) = nibbles(_mm256_load_si256(w.add(ch * ws) as *const __m256i));
                if MAP {
                    lo = _mm256_shuffle_epi8(map, lo);
                    hi = _mm256_shuffle_epi8(map, hi);
                }
                for (c, s) in acc.iter_mut().enumerate() {
                    let p = x.add(c * stride + ch * CHUNK) as *const i32;
                    let even = _mm256_set1_epi32(p.read_unaligned());
                    let odd = _mm256_set1_epi32(p.add(1).read_unaligned());
                    let pairs = _mm256_add_epi16(
                        _mm256_maddubs_epi16(lo, even),
                        _mm256_maddubs_epi16(hi, odd),
                    );
                    *s = _mm256_add_epi32(*s, _mm256_madd_epi16(pairs, ones));
                }
            }
        }
        acc
    }

    /// [`half_sums`] on AVX-VNNI: `vpdpbusd` adds each word's four products (codes or bytes,
    /// unsigned, times int8 activations) into int32 lanes, as `vnni::parts_sums` does at
    /// 512 bits. Each accumulator is a chain of dependent `vpdpbusd`s (several cycles each):
    /// for one or two columns the low and the high nibbles (or the even and the odd words)
    /// of even and of odd chunks sum into chains of their own, added at the end (integers:
    /// the same sums); more columns are chains enough, within AVX2's 16 registers. No int16
    /// step, so bytes up to 255 (codebook maps up to [`super::MAP_SPAN`]).
    /// `ws`: bytes from a word of the part to its next ([`super::DenseLayout::word_stride`]).
    #[inline]
    #[target_feature(enable = "avx2,f16c,avxvnni")]
    unsafe fn vnni_sums<const NC: usize, const MAP: bool, const B8: bool>(
        w: *const u8,
        chunks: usize,
        ws: usize,
        x: *const i8,
        stride: usize,
        map: __m256i,
    ) -> [__m256i; NC] {
        let steps = chunks / if B8 { 2 } else { 1 };
        let zero = [_mm256_setzero_si256(); NC];
        let (mut lo, mut hi) = (zero, zero);
        // Every `vnni_step` below: a step below `steps`, inside the part and the activations
        // (as `half_sums`), with AVX-VNNI enabled here.
        if NC <= 2 {
            let (mut lo2, mut hi2) = (zero, zero);
            for st in 0..steps / 2 {
                // SAFETY: see above.
                unsafe {
                    vnni_step::<NC, MAP, B8, false>(
                        w,
                        2 * st,
                        ws,
                        x,
                        stride,
                        map,
                        &mut lo,
                        &mut hi,
                    );
                    vnni_step::<NC, MAP, B8, false>(
                        w,
                        2 * st + 1,
                        ws,
                        x,
                        stride,
                        map,
                        &mut lo2,
                        &mut hi2,
                    );
                }
            }
            if steps % 2 == 1 {
                // SAFETY: see above.
                unsafe {
                    vnni_step::<NC, MAP, B8, false>(
                        w,
                        steps - 1,
                        ws,
                        x,
                        stride,
                        map,
                        &mut lo,
                        &mut hi,
                    )
                };
            }
            for c in 0..NC {
                lo[c] = _mm256_add_epi32(lo[c], lo2[c]);
                hi[c] = _mm256_add_epi32(hi[c], hi2[c]);
            }
        } else {
            for st in 0..steps {
                // SAFETY: see above.
                unsafe {
                    vnni_step::<NC, MAP, B8, true>(w, st, ws, x, stride, map, &mut lo, &mut hi)
                };
            }
        }
        std::array::from_fn(|c| _mm256_add_epi32(lo[c], hi[c]))
    }

    /// [`vnni_sums`] of both 8-row halves of a part for one column, codes of 4 bits summed as
    /// they are: 8 accumulator chains (the low and the high nibbles of even and of odd steps,
    /// per half) instead of one half's 4, whose chains of dependent `vpdpbusd`s left a GEMV
    /// waiting on their latency. The same integer sums, so the same bits. Zen 5, backend
    /// `avx2` (AVX-VNNI), minima of alternating builds, before / after: int4 g128 4096 x 4096,
    /// two threads, 0.104 / 0.086 ms (N = 3: 0.273 / 0.251), 1024 x 2048 in L2, one thread,
    /// 26.3 / 22.2 us; uint4 g32 with zero points 0.222 / 0.216 ms.
    /// `ws`: bytes from a word of the part to its next ([`super::DenseLayout::word_stride`]).
    #[inline]
    #[target_feature(enable = "avx2,f16c,avxvnni")]
    unsafe fn vnni_sums_part(w: *const u8, chunks: usize, ws: usize, x: *const i8) -> [__m256i; 2] {
        let zero = [_mm256_setzero_si256(); 2];
        // `[half]`: even steps' low and high nibbles, odd steps' low and high nibbles.
        let (mut lo, mut hi, mut lo2, mut hi2) = (zero, zero, zero, zero);
        let step = |st: usize, lo: &mut [__m256i; 2], hi: &mut [__m256i; 2]| {
            // SAFETY: a step below `chunks`: the part holds `chunks` words of 64 bytes (32
            // per half, 32-byte aligned), the column the group's `8 chunks` activations;
            // AVX-VNNI enabled here.
            unsafe {
                let p = x.add(st * CHUNK) as *const i32;
                let even = _mm256_set1_epi32(p.read_unaligned());
                let odd = _mm256_set1_epi32(p.add(1).read_unaligned());
                for h in 0..2 {
                    let (l, u) =
                        nibbles(_mm256_load_si256(w.add(st * ws + 32 * h) as *const __m256i));
                    lo[h] = _mm256_dpbusd_avx_epi32(lo[h], l, even);
                    hi[h] = _mm256_dpbusd_avx_epi32(hi[h], u, odd);
                }
            }
        };
        for st in 0..chunks / 2 {
            step(2 * st, &mut lo, &mut hi);
            step(2 * st + 1, &mut lo2, &mut hi2);
        }
        if chunks % 2 == 1 {
            step(chunks - 1, &mut lo, &mut hi);
        }
        std::array::from_fn(|h| {
            _mm256_add_epi32(
                _mm256_add_epi32(lo[h], lo2[h]),
                _mm256_add_epi32(hi[h], hi2[h]),
            )
        })
    }

    /// The sums of one 8-row half and one column on the 2-bit layout whose parts have words
    /// of their own (the AVX-512 kernels' until stop 45), on AVX-VNNI:
    /// each word's 32 bytes of the half hold 16 inputs of 8 rows, bit pair `p` of its bytes
    /// meeting activation bytes `4p .. 4p + 4` of the chunk; each pair masked in place (`c
    /// 4^p`, at most 192) into a sum of its own, shifted back at the end (exact: sums of
    /// multiples of `4^p`; `two_bit` keeps `G <= 2^16`, inside int32).
    ///
    /// `H` halves from `w` (each 32 bytes after the last): with both halves of a part, 8
    /// accumulator chains instead of 4 (as [`vnni_sums_part`]; Zen 5, backend `avx2`, minima
    /// of alternating builds in a noisy hour, before / after: 4096 x 4096 on two threads,
    /// ternary g128 0.101-0.136 / 0.078-0.105 ms, int2 g64 0.133 / 0.110; 1024 x 2048 in L2
    /// on one, ternary 25.2 / 18.5 us, int2 33.3 / 28.1 us).
    /// `ws`: bytes from a word of the part to its next ([`super::DenseLayout::word_stride`]).
    #[inline]
    #[target_feature(enable = "avx2,f16c,avxvnni")]
    unsafe fn vnni_sums2<const H: usize>(
        w: *const u8,
        chunks: usize,
        ws: usize,
        x: *const i8,
    ) -> [__m256i; H] {
        let masks = [0x03u8, 0x0c, 0x30, 0xc0].map(|m| _mm256_set1_epi8(m as i8));
        let mut acc = [[_mm256_setzero_si256(); 4]; H];
        for ch in 0..chunks {
            // SAFETY: the part holds `chunks` words of 64 bytes (32 of them each half's,
            // 32-byte aligned); the column holds the group's `16 chunks` activations.
            unsafe {
                let xp = x.add(ch * 16) as *const i32;
                let xs: [__m256i; 4] =
                    std::array::from_fn(|p| _mm256_set1_epi32(xp.add(p).read_unaligned()));
                for (h, acc) in acc.iter_mut().enumerate() {
                    let v = _mm256_load_si256(w.add(ch * ws + 32 * h) as *const __m256i);
                    for ((a, &m), &xv) in acc.iter_mut().zip(masks.iter()).zip(xs.iter()) {
                        *a = _mm256_dpbusd_avx_epi32(*a, _mm256_and_si256(v, m), xv);
                    }
                }
            }
        }
        acc.map(|[a0, a1, a2, a3]| {
            let hi = _mm256_add_epi32(_mm256_srai_epi32::<4>(a2), _mm256_srai_epi32::<6>(a3));
            _mm256_add_epi32(_mm256_add_epi32(a0, _mm256_srai_epi32::<2>(a1)), hi)
        })
    }

    /// Step `st` of [`vnni_sums`] (a word, or with `B8` a pair of words: 8 inputs): its low
    /// nibbles (`B8`: even word) times each column's first 4 activations into `lo`, its high
    /// nibbles (odd word) times the next 4 into `hi` (with `ONE` into `lo` too: one chain per
    /// column). Inlined into `vnni_sums`, which enables AVX-VNNI.
    /// `ws`: bytes from a word of the part to its next ([`super::DenseLayout::word_stride`]).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn vnni_step<const NC: usize, const MAP: bool, const B8: bool, const ONE: bool>(
        w: *const u8,
        st: usize,
        ws: usize,
        x: *const i8,
        stride: usize,
        map: __m256i,
        lo: &mut [__m256i; NC],
        hi: &mut [__m256i; NC],
    ) {
        // SAFETY: the caller's (see `vnni_sums`).
        unsafe {
            let at = w.add(st * if B8 { 2 * ws } else { ws });
            let (u_lo, u_hi) = if B8 {
                (
                    _mm256_load_si256(at as *const __m256i),
                    _mm256_load_si256(at.add(ws) as *const __m256i),
                )
            } else {
                let (l, h) = nibbles(_mm256_load_si256(at as *const __m256i));
                if MAP {
                    (_mm256_shuffle_epi8(map, l), _mm256_shuffle_epi8(map, h))
                } else {
                    (l, h)
                }
            };
            for c in 0..NC {
                let p = x.add(c * stride + st * CHUNK) as *const i32;
                let even = _mm256_set1_epi32(p.read_unaligned());
                let odd = _mm256_set1_epi32(p.add(1).read_unaligned());
                lo[c] = _mm256_dpbusd_avx_epi32(lo[c], u_lo, even);
                if ONE {
                    lo[c] = _mm256_dpbusd_avx_epi32(lo[c], u_hi, odd);
                } else {
                    hi[c] = _mm256_dpbusd_avx_epi32(hi[c], u_hi, odd);
                }
            }
        }
    }

    /// Half `h` of part `s` of row block `rb`, group `g`, columns `c0 .. c0 + NC`: [`half_q`]
    /// and [`half_epilogue`].
    #[inline(always)]
    unsafe fn half<const NC: usize, const VNNI: bool>(
        job: &Job<'_>,
        at: (usize, usize, usize, usize),
        c0: usize,
        ys: &mut [f32],
    ) {
        // SAFETY: the caller's (see `half_q`).
        unsafe {
            let q = half_q::<NC, VNNI>(job, at, c0);
            half_epilogue::<NC>(job, at, c0, q, ys);
        }
    }

    /// The sums `Q` of half `h` of part `s` of row block `rb`, group `g`, columns
    /// `c0 .. c0 + NC` ([`vnni_sums`] with `VNNI`, else [`half_sums`]). Inlined into
    /// [`block_sums`] / [`block_sums_vnni`], so that each sum function is inlined into the
    /// one whose target features it has.
    #[inline(always)]
    unsafe fn half_q<const NC: usize, const VNNI: bool>(
        job: &Job<'_>,
        (rb, g, s, h): (usize, usize, usize, usize),
        c0: usize,
    ) -> [__m256i; NC] {
        let (plan, lay, acts) = (job.plan, job.lay, job.acts);
        let k = plan.k;
        let w = lay.data[lay.part(g, rb, s) + 32 * h..].as_ptr();
        let x = acts.xq[c0 * k + g * plan.group_size..].as_ptr();
        let (c, ws) = (lay.chunks, lay.word_stride);
        // SAFETY: offsets inside the layout and the activations; the caller enables AVX2 and
        // F16C, and AVX-VNNI with `VNNI`.
        unsafe {
            match &job.map {
                None if lay.bits == 2 => {
                    // GEMVs on the 2-bit layout: AVX-VNNI only, each part in words of its
                    // own (`two_bit`).
                    assert!(VNNI && NC == 1 && !lay.pairs());
                    let [q] = vnni_sums2::<1>(w, c, ws, x);
                    std::array::from_fn(|_| q)
                }
                None if lay.bits == 8 && VNNI => {
                    vnni_sums::<NC, false, true>(w, c, ws, x, k, _mm256_setzero_si256())
                }
                None if lay.bits == 8 => {
                    // `Q - 128 S` per column: add `128 S` back.
                    let q = half_sums::<NC, false, true>(w, c, ws, x, k, _mm256_setzero_si256());
                    std::array::from_fn(|i| {
                        let s = acts.sums[(c0 + i) * plan.groups + g];
                        _mm256_add_epi32(q[i], _mm256_set1_epi32(128 * s))
                    })
                }
                None if VNNI => {
                    vnni_sums::<NC, false, false>(w, c, ws, x, k, _mm256_setzero_si256())
                }
                None => half_sums::<NC, false, false>(w, c, ws, x, k, _mm256_setzero_si256()),
                Some(m) => {
                    let t =
                        _mm256_broadcastsi128_si256(_mm_loadu_si128(m.as_ptr() as *const __m128i));
                    if VNNI {
                        vnni_sums::<NC, true, false>(w, c, ws, x, k, t)
                    } else {
                        half_sums::<NC, true, false>(w, c, ws, x, k, t)
                    }
                }
            }
        }
    }

    /// Row block `rb` (all 64 rows of it rows of the weights) for the groups `groups` and the
    /// columns `c0 .. c0 + NC` (NC <= 2): per group, the sums of each 8-row half and
    /// [`half_epilogue`]'s operations in the same order (so the same bits), with each
    /// column's constants read once per group instead of once per half and no partial-half
    /// branches. For GEMVs, whose few sums per group left that epilogue most of the work
    /// (int8 g32 4096 x 4096, one thread: 54% of the samples). Since stop 43 only for
    /// codebooks of slope other than 1: [`narrow_typed`] runs the others.
    #[inline(always)]
    unsafe fn narrow<const NC: usize, const VNNI: bool>(
        job: &Job<'_>,
        rb: usize,
        groups: Range<usize>,
        c0: usize,
        ys: &mut [f32],
    ) {
        let (plan, acts, ng) = (job.plan, job.acts, job.plan.groups);
        assert!(c0 + NC <= plan.n && ys.len() >= plan.n * ROW_BLOCK);
        assert!(plan.m - rb * ROW_BLOCK >= ROW_BLOCK);
        let yp = ys.as_mut_ptr();
        // SAFETY: 64 floats of `ys` per column (asserted); the caller enables AVX2 and F16C
        // (AVX-VNNI with `VNNI`); the tiled arrays hold 64 values per (group, row block).
        unsafe {
            let a = _mm256_set1_epi32(job.a);
            for g in groups {
                // Per column: `corr`, `zsum` and `tsc`.
                let cst: [(__m256i, __m256, __m256); NC] = std::array::from_fn(|c| {
                    let gn = (c0 + c) * ng + g;
                    (
                        _mm256_set1_epi32(acts.corr[gn]),
                        _mm256_set1_ps(acts.zsum[gn]),
                        _mm256_set1_ps(acts.tsc[gn]),
                    )
                });
                for hh in 0..2 * SUBS {
                    let q = half_q::<NC, VNNI>(job, (rb, g, hh / 2, hh % 2), c0);
                    let sz = (g * plan.row_blocks + rb) * ROW_BLOCK + 8 * hh;
                    let z8 = match job.zeros {
                        _ if !plan.zero_term => _mm256_setzero_ps(),
                        Zeros::None => _mm256_setzero_ps(),
                        Zeros::Uniform(z) => _mm256_set1_ps(z),
                        Zeros::Tiled(t) => load_tiled8(t, sz),
                    };
                    let sc8 = load_tiled8(job.scales, sz);
                    for (c, (&q, &(corr, zs, tsc))) in q.iter().zip(cst.iter()).enumerate() {
                        let p = if job.a == 1 {
                            q
                        } else {
                            _mm256_mullo_epi32(q, a)
                        };
                        let mut u = _mm256_cvtepi32_ps(_mm256_add_epi32(p, corr));
                        if plan.zero_term {
                            u = _mm256_sub_ps(u, _mm256_mul_ps(z8, zs));
                        }
                        u = _mm256_mul_ps(u, tsc);
                        let y = yp.add((c0 + c) * ROW_BLOCK + 8 * hh);
                        _mm256_storeu_ps(
                            y,
                            _mm256_add_ps(_mm256_loadu_ps(y), _mm256_mul_ps(sc8, u)),
                        );
                    }
                }
            }
        }
    }

    /// Per-row values of the epilogue (scales, zero points) read 8 rows at a time from offset
    /// `i` of their tiled layout: as float32, as float16, or one value for every row
    /// (`Zeros::Uniform`); [`narrow_typed`] is compiled for each.
    trait Rows8: Copy {
        /// Values in the tiled array (`usize::MAX` for one value): [`narrow_typed`] asserts
        /// its reads against it.
        fn len(self) -> usize;
        /// The 8 values from offset `i`, as floats.
        ///
        /// # Safety
        /// `i + 8 <= len`; AVX2 and F16C enabled.
        unsafe fn get(self, i: usize) -> __m256;
    }

    impl Rows8 for &[f32] {
        fn len(self) -> usize {
            <[f32]>::len(self)
        }
        #[inline(always)]
        unsafe fn get(self, i: usize) -> __m256 {
            // SAFETY: the caller's.
            unsafe { _mm256_loadu_ps(self.as_ptr().add(i)) }
        }
    }

    /// IEEE binary16 bits.
    impl Rows8 for &[u16] {
        fn len(self) -> usize {
            <[u16]>::len(self)
        }
        #[inline(always)]
        unsafe fn get(self, i: usize) -> __m256 {
            // SAFETY: the caller's.
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(self.as_ptr().add(i) as *const __m128i)) }
        }
    }

    impl Rows8 for f32 {
        fn len(self) -> usize {
            usize::MAX
        }
        #[inline(always)]
        unsafe fn get(self, _i: usize) -> __m256 {
            // SAFETY: AVX enabled by the caller.
            unsafe { _mm256_set1_ps(self) }
        }
    }

    /// [`narrow_typed`] for this call's types of scales and zero points; `false` when it does
    /// not apply (codebooks of slope other than 1), for [`narrow`].
    #[inline(always)]
    unsafe fn typed_narrow<const NC: usize, const VNNI: bool>(
        job: &Job<'_>,
        rb: usize,
        groups: Range<usize>,
        c0: usize,
        ys: &mut [f32],
    ) -> bool {
        if job.a != 1 {
            return false;
        }
        /// The scales' type, then `narrow_typed`.
        macro_rules! scales {
            ($zt:literal, $z:expr) => {
                // SAFETY: the caller's (`narrow`'s); `narrow_typed` asserts its bounds.
                unsafe {
                    match job.scales {
                        Tiled::F32(s) => {
                            narrow_typed::<NC, VNNI, _, _, $zt>(job, rb, groups, c0, ys, s, $z)
                        }
                        Tiled::F16(s) => {
                            narrow_typed::<NC, VNNI, _, _, $zt>(job, rb, groups, c0, ys, s, $z)
                        }
                    }
                }
            };
        }
        match (job.plan.zero_term, job.zeros) {
            (false, _) => scales!(false, 0f32),
            (true, Zeros::Uniform(z)) => scales!(true, z),
            (true, Zeros::Tiled(Tiled::F32(z))) => scales!(true, z),
            (true, Zeros::Tiled(Tiled::F16(z))) => scales!(true, z),
            (true, Zeros::None) => return false,
        }
        true
    }

    /// [`narrow`] with `a = 1`: the same operations in the same order (so the same bits), with
    /// the types of the scales and zero points fixed at compile time and no bounds checks in
    /// the loop over the groups and halves: its branches on them per half, and
    /// `load_tiled8`'s bounds checks, weighed the more the smaller the groups. Zen 5, backend
    /// `avx2`, 4096 x 4096, two threads, minima of alternating builds in a noisy hour, ms,
    /// before / after, one column, with AVX-VNNI: int4 g128 0.089 / 0.082, uint4 g32 with
    /// zero points 0.214 / 0.130, int8 g32 0.248 / 0.188, ternary g128 0.104 / 0.075; the
    /// plain AVX2 kernel (AVX-VNNI masked off in a local build, not committed): int4 g128
    /// 0.119 / 0.096, uint4 g32 0.242 / 0.169, int8 g32 0.273 / 0.197. Two columns, with
    /// AVX-VNNI / without: uint4 g32 N = 2 0.363 / 0.234 and 0.380 / 0.232, int8 g32 N = 2
    /// 0.378 / 0.242 and 0.459 / 0.318; int4 g128 N = 3 0.252 / 0.224 and 0.299 / 0.272.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn narrow_typed<
        const NC: usize,
        const VNNI: bool,
        S: Rows8,
        Z: Rows8,
        const ZT: bool,
    >(
        job: &Job<'_>,
        rb: usize,
        groups: Range<usize>,
        c0: usize,
        ys: &mut [f32],
        scales: S,
        zeros: Z,
    ) {
        let (plan, lay, acts, ng) = (job.plan, job.lay, job.acts, job.plan.groups);
        let end = groups.end;
        let tiled = ng * plan.row_blocks * ROW_BLOCK;
        assert!(c0 + NC <= plan.n && ys.len() >= plan.n * ROW_BLOCK && end <= ng);
        assert!(plan.m - rb * ROW_BLOCK >= ROW_BLOCK);
        assert!(scales.len() >= tiled && (!ZT || zeros.len() >= tiled));
        let gn_end = (c0 + NC - 1) * ng + end;
        assert!(acts.corr.len() >= gn_end && acts.tsc.len() >= gn_end && acts.zsum.len() >= gn_end);
        assert!(acts.xq.len() >= (c0 + NC - 1) * plan.k + end * plan.group_size);
        assert!(end == 0 || lay.block_end(end - 1, rb) <= lay.data.len());
        // One column with AVX-VNNI: both halves of a part at once (as `narrow`).
        let pair = VNNI && NC == 1 && job.map.is_none() && lay.bits != 8;
        let yp = ys.as_mut_ptr().wrapping_add(c0 * ROW_BLOCK);
        // SAFETY: 64 floats of `ys` per column from `yp`; every offset below is inside its
        // array (asserted above); the caller enables AVX2 and F16C (AVX-VNNI with `VNNI`).
        unsafe {
            for g in groups {
                // Per column: `corr`, `zsum` and `tsc` (a loop, not a closure: see below).
                let mut cst = [(
                    _mm256_setzero_si256(),
                    _mm256_setzero_ps(),
                    _mm256_setzero_ps(),
                ); NC];
                for (c, cst) in cst.iter_mut().enumerate() {
                    let gn = (c0 + c) * ng + g;
                    *cst = (
                        _mm256_set1_epi32(*acts.corr.get_unchecked(gn)),
                        _mm256_set1_ps(*acts.zsum.get_unchecked(gn)),
                        _mm256_set1_ps(*acts.tsc.get_unchecked(gn)),
                    );
                }
                for s in 0..SUBS {
                    let q: [[__m256i; NC]; 2] = if pair {
                        let w = lay.data.as_ptr().add(lay.part(g, rb, s));
                        let x = acts.xq.as_ptr().add(c0 * plan.k + g * plan.group_size);
                        let [q0, q1] = if lay.bits == 2 {
                            // Each part in words of its own (`two_bit`).
                            assert!(!lay.pairs());
                            vnni_sums2::<2>(w, lay.chunks, lay.word_stride, x)
                        } else {
                            vnni_sums_part(w, lay.chunks, lay.word_stride, x)
                        };
                        [[q0; NC], [q1; NC]]
                    } else {
                        // Not in a closure: `half_q`'s sum functions are inlined only into
                        // a function with their target features.
                        let q0 = half_q::<NC, VNNI>(job, (rb, g, s, 0), c0);
                        let q1 = half_q::<NC, VNNI>(job, (rb, g, s, 1), c0);
                        [q0, q1]
                    };
                    for (h, q) in q.iter().enumerate() {
                        let hh = 2 * s + h;
                        let sz = (g * plan.row_blocks + rb) * ROW_BLOCK + 8 * hh;
                        let (z8, sc8) = (
                            if ZT {
                                zeros.get(sz)
                            } else {
                                _mm256_setzero_ps()
                            },
                            scales.get(sz),
                        );
                        for (c, (&q, &(corr, zs, tsc))) in q.iter().zip(cst.iter()).enumerate() {
                            // As `narrow` with `a = 1`.
                            let mut u = _mm256_cvtepi32_ps(_mm256_add_epi32(q, corr));
                            if ZT {
                                u = _mm256_sub_ps(u, _mm256_mul_ps(z8, zs));
                            }
                            u = _mm256_mul_ps(u, tsc);
                            let y = yp.add(c * ROW_BLOCK + 8 * hh);
                            _mm256_storeu_ps(
                                y,
                                _mm256_add_ps(_mm256_loadu_ps(y), _mm256_mul_ps(sc8, u)),
                            );
                        }
                    }
                }
            }
        }
    }

    /// The epilogue of [`half`]: its sums `q` into `ys` (`[n][64]`), 8 rows per vector with
    /// the scalar epilogue's operations (rows past M: not written). Inlined into the callers
    /// of `half` (as a function of its own with AVX2's features, it was called per half,
    /// not inlined, into `block_sums_vnni`).
    #[inline(always)]
    unsafe fn half_epilogue<const NC: usize>(
        job: &Job<'_>,
        (rb, g, s, h): (usize, usize, usize, usize),
        c0: usize,
        q: [__m256i; NC],
        ys: &mut [f32],
    ) {
        let (plan, acts, groups) = (job.plan, job.acts, job.plan.groups);
        let r0 = s * SUB + 8 * h; // first row within the block
        let lanes = (plan.m - rb * ROW_BLOCK).saturating_sub(r0).min(8);
        let sz = (g * plan.row_blocks + rb) * ROW_BLOCK + r0;
        // SAFETY: the caller enables AVX2 and F16C; memory accesses as commented.
        unsafe {
            let a = _mm256_set1_epi32(job.a);
            // The half's scales and zero points, shared by its columns (full halves; the
            // tiled arrays hold 64 values per (group, row block), so the 8 from `sz` are
            // there).
            let z8 = match job.zeros {
                _ if !plan.zero_term => _mm256_setzero_ps(),
                Zeros::None => _mm256_setzero_ps(),
                Zeros::Uniform(z) => _mm256_set1_ps(z),
                Zeros::Tiled(t) => load_tiled8(t, sz),
            };
            let sc8 = load_tiled8(job.scales, sz);
            for (c, q) in q.into_iter().enumerate() {
                let gn = (c0 + c) * groups + g;
                let p = if job.a == 1 {
                    q
                } else {
                    _mm256_mullo_epi32(q, a)
                };
                let p = _mm256_add_epi32(p, _mm256_set1_epi32(acts.corr[gn]));
                let (tsc, zs) = (acts.tsc[gn], acts.zsum[gn]);
                let yb = &mut ys[(c0 + c) * ROW_BLOCK + r0..(c0 + c) * ROW_BLOCK + r0 + lanes];
                if lanes == 8 {
                    // 8 rows of `yb`, 8 tiled values from `sz` (64 per row block).
                    let mut u = _mm256_cvtepi32_ps(p);
                    if plan.zero_term {
                        u = _mm256_sub_ps(u, _mm256_mul_ps(z8, _mm256_set1_ps(zs)));
                    }
                    u = _mm256_mul_ps(u, _mm256_set1_ps(tsc));
                    let yp = yb.as_mut_ptr();
                    let su = _mm256_mul_ps(sc8, u);
                    _mm256_storeu_ps(yp, _mm256_add_ps(_mm256_loadu_ps(yp), su));
                } else {
                    let mut sums = [0i32; 8];
                    // 8 int32 into an 8-int array.
                    _mm256_storeu_si256(sums.as_mut_ptr() as *mut __m256i, p);
                    for (r, y) in yb.iter_mut().enumerate() {
                        let (sc, z) = (job.scales.at(sz + r), job.zeros.at(sz + r));
                        *y = epilogue(plan, sums[r] as f32, sc, z, tsc, zs, *y);
                    }
                }
            }
        }
    }

    /// `vnni::block_sums` on AVX2.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn block_sums(
        job: &Job<'_>,
        rb: usize,
        groups: Range<usize>,
        ys: &mut [f32],
    ) {
        // SAFETY: the caller's (AVX2 and F16C found on this CPU).
        unsafe { sums::<false>(job, rb, groups, ys) }
    }

    /// `vnni::block_sums` on AVX2 with AVX-VNNI.
    #[target_feature(enable = "avx2,f16c,avxvnni")]
    pub(super) unsafe fn block_sums_vnni(
        job: &Job<'_>,
        rb: usize,
        groups: Range<usize>,
        ys: &mut [f32],
    ) {
        // SAFETY: the caller's (AVX2, F16C and AVX-VNNI found on this CPU).
        unsafe { sums::<true>(job, rb, groups, ys) }
    }

    /// The widest call that [`sums`] runs through [`narrow`] (8 columns ran faster as they
    /// were: the weights unpacked once for all 8, `half::<8>`). Zen 5, 4096 x 4096, two
    /// threads, backend `avx2`, from Python, alternating builds, ms, before / after, with
    /// AVX-VNNI: int4 g128 N = 3 0.35 / 0.28, N = 6 0.56 / 0.49; uint4 g32 with zero points
    /// N = 3 0.83 / 0.56, N = 6 1.26 / 0.99; int8 g32 N = 3 0.88 / 0.65; without (the plain
    /// AVX2 kernel): uint4 g32 N = 3 0.83 / 0.57, N = 5 1.02 / 0.86, int8 g32 N = 3 0.93 /
    /// 0.73, N = 6 1.50 / 1.28.
    const NARROW_MAX: usize = 7;

    /// [`block_sums`] (`VNNI`: [`block_sums_vnni`]), inlined into each.
    #[inline(always)]
    unsafe fn sums<const VNNI: bool>(
        job: &Job<'_>,
        rb: usize,
        groups: Range<usize>,
        ys: &mut [f32],
    ) {
        let (plan, n) = (job.plan, job.plan.n);
        assert!(ys.len() >= n * ROW_BLOCK);
        let rows = plan.m - rb * ROW_BLOCK;
        let halves = rows.div_ceil(8).min(2 * SUBS);
        // Calls of up to `NARROW_MAX` columns on full row blocks: `narrow`, 2 columns at a
        // time.
        if n <= NARROW_MAX && rows >= ROW_BLOCK {
            let mut c0 = 0;
            while c0 < n {
                // SAFETY: as `narrow`.
                unsafe {
                    if n - c0 >= 2 {
                        if !typed_narrow::<2, VNNI>(job, rb, groups.clone(), c0, ys) {
                            narrow::<2, VNNI>(job, rb, groups.clone(), c0, ys);
                        }
                    } else if !typed_narrow::<1, VNNI>(job, rb, groups.clone(), c0, ys) {
                        narrow::<1, VNNI>(job, rb, groups.clone(), c0, ys);
                    }
                }
                c0 += 2;
            }
            return;
        }
        for g in groups {
            for hh in 0..halves {
                let at = (rb, g, hh / 2, hh % 2);
                let mut c0 = 0;
                while c0 < n {
                    // SAFETY: as `half`.
                    unsafe {
                        c0 += match n - c0 {
                            8.. => {
                                half::<8, VNNI>(job, at, c0, ys);
                                8
                            }
                            4.. => {
                                half::<4, VNNI>(job, at, c0, ys);
                                4
                            }
                            2.. => {
                                half::<2, VNNI>(job, at, c0, ys);
                                2
                            }
                            _ => {
                                half::<1, VNNI>(job, at, c0, ys);
                                1
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod sdot {
    use std::arch::aarch64::*;
    use std::arch::asm;
    use std::ops::Range;

    use super::{Job, CHUNK, SUB, SUBS};
    use crate::kernels::scalar::epilogue;
    use crate::kernels::{Tiled, Zeros};
    use crate::layout::ROW_BLOCK;

    /// `acc + (w . x[L])`: each int32 lane of `acc` plus the dot product of its 4 bytes of `w`
    /// with the 4 bytes of lane `L` of `x` (`sdot` by element). Inline assembly: Rust's
    /// `vdotq_laneq_s32` is not stable; the caller enables `dotprod`.
    #[inline(always)]
    unsafe fn sdot_lane<const L: i32>(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
        let mut acc = acc;
        // SAFETY: a register-only instruction of the dot-product extension, which `kind_for`
        // found on this CPU before any caller runs (this function is inlined into
        // `part_sums`, which enables `dotprod`).
        unsafe {
            asm!(
                "sdot {acc:v}.4s, {w:v}.16b, {x:v}.4b[{lane}]",
                acc = inout(vreg) acc,
                w = in(vreg) w,
                x = in(vreg) x,
                lane = const L,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
        acc
    }

    /// `Q = sum_k q_k xq_k` of one 16-row part and one group for `NC` columns, as
    /// `vnni::part_sums`, in 4 vectors of 4 rows: `w` the part's words (`chunks` of 64 bytes),
    /// `x` the first column's activations of the group, `stride` bytes between columns. The
    /// codes (0..15) are the signed operand too: `sdot` multiplies signed by signed. With
    /// `MAP`, each code `c` is replaced by `map[c]` first (`tbl`; values at most
    /// 127, [`super::map_span`]: the same bytes signed).
    /// `ws`: bytes from a word of the part to its next ([`super::DenseLayout::word_stride`]).
    #[inline]
    #[target_feature(enable = "dotprod")]
    unsafe fn part_sums<const NC: usize, const MAP: bool, const B8: bool>(
        w: *const u8,
        chunks: usize,
        ws: usize,
        x: *const i8,
        stride: usize,
        map: uint8x16_t,
    ) -> [[int32x4_t; 4]; NC] {
        let mut acc = [[vdupq_n_s32(0); 4]; NC];
        let low = vdupq_n_u8(0x0f);
        if B8 {
            // Bytes (the 8-bit layout: words `2 ch` and `2 ch + 1`, the chunk's even then odd
            // inputs), each split into nibbles `u = 16 hi + lo` (0..15: the same bytes signed),
            // the high nibbles summed apart and shifted back at the end.
            let mut acc_hi = [[vdupq_n_s32(0); 4]; NC];
            for ch in 0..chunks / 2 {
                // SAFETY: as below, two words per chunk.
                unsafe {
                    let word = |h: usize| -> [uint8x16_t; 4] {
                        std::array::from_fn(|i| vld1q_u8(w.add((2 * ch + h) * ws + 16 * i)))
                    };
                    let (ve, vo) = (word(0), word(1));
                    let lo_e = ve.map(|v| vreinterpretq_s8_u8(vandq_u8(v, low)));
                    let hi_e = ve.map(|v| vreinterpretq_s8_u8(vshrq_n_u8::<4>(v)));
                    let lo_o = vo.map(|v| vreinterpretq_s8_u8(vandq_u8(v, low)));
                    let hi_o = vo.map(|v| vreinterpretq_s8_u8(vshrq_n_u8::<4>(v)));
                    for (c, (s, sh)) in acc.iter_mut().zip(acc_hi.iter_mut()).enumerate() {
                        let xs = vld1q_s8(x.add(c * stride + ch * CHUNK));
                        for i in 0..4 {
                            s[i] = sdot_lane::<0>(s[i], lo_e[i], xs);
                            s[i] = sdot_lane::<1>(s[i], lo_o[i], xs);
                            sh[i] = sdot_lane::<0>(sh[i], hi_e[i], xs);
                            sh[i] = sdot_lane::<1>(sh[i], hi_o[i], xs);
                        }
                    }
                }
            }
            for (s, sh) in acc.iter_mut().zip(acc_hi.iter()) {
                for (a, &h) in s.iter_mut().zip(sh.iter()) {
                    *a = vaddq_s32(*a, vshlq_n_s32::<4>(h));
                }
            }
            return acc;
        }
        for ch in 0..chunks {
            // SAFETY: the part holds `chunks` words of 64 bytes; each column's activations
            // hold the group's `8 chunks` bytes, and 8 bytes follow the last column's (the
            // padding of `Acts::xq`), so a 16-byte load at a chunk stays inside.
            unsafe {
                let v: [uint8x16_t; 4] = std::array::from_fn(|i| vld1q_u8(w.add(ch * ws + 16 * i)));
                let look = |c: uint8x16_t| if MAP { vqtbl1q_u8(map, c) } else { c };
                let lo = v.map(|v| vreinterpretq_s8_u8(look(vandq_u8(v, low))));
                let hi = v.map(|v| vreinterpretq_s8_u8(look(vshrq_n_u8::<4>(v))));
                for (c, s) in acc.iter_mut().enumerate() {
                    // Lane 0: the chunk's even inputs (low nibbles), lane 1: the odd ones.
                    let xs = vld1q_s8(x.add(c * stride + ch * CHUNK));
                    for i in 0..4 {
                        s[i] = sdot_lane::<0>(s[i], lo[i], xs);
                        s[i] = sdot_lane::<1>(s[i], hi[i], xs);
                    }
                }
            }
        }
        acc
    }

    /// `fcvtl`: 4 float16 bits widened exactly to float32 (base Armv8 SIMD; Rust's
    /// `vcvt_f32_f16` needs the unstable `f16` type).
    #[inline(always)]
    unsafe fn widen_f16(h: uint16x4_t) -> float32x4_t {
        let out: float32x4_t;
        // SAFETY: a register-only instruction of the base Arm64 SIMD set.
        unsafe {
            asm!(
                "fcvtl {out:v}.4s, {h:v}.4h",
                out = lateout(vreg) out,
                h = in(vreg) h,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
        out
    }

    /// The 16 values of a tiled array (`[g][rb][64]`) from offset `i` (a 16-row part, inside
    /// its row block's 64), as 4 vectors of 4 rows, widened from float16 where stored so.
    #[inline(always)]
    fn tiled16(t: Tiled<'_>, i: usize) -> [float32x4_t; 4] {
        // SAFETY: 4 loads of 4 values inside the bounds-checked 16-value slices.
        match t {
            Tiled::F32(v) => {
                let v = &v[i..i + SUB];
                std::array::from_fn(|j| unsafe { vld1q_f32(v[4 * j..].as_ptr()) })
            }
            Tiled::F16(h) => {
                let h = &h[i..i + SUB];
                std::array::from_fn(|j| unsafe { widen_f16(vld1_u16(h[4 * j..].as_ptr())) })
            }
        }
    }

    /// One 16-row part `s` of row block `rb`, group `g`, columns `c0 .. c0 + NC`: sums, then
    /// the epilogue into `ys` (`[n][64]`; rows past M: not written). A full part runs the
    /// scalar epilogue's operations on 4 rows per vector (`scvtf` rounds as `as f32` does;
    /// separate multiplies and adds, no fused ones: the same bits); a part with fewer rows
    /// runs the scalar epilogue.
    #[inline]
    #[target_feature(enable = "dotprod")]
    unsafe fn part<const NC: usize>(
        job: &Job<'_>,
        rb: usize,
        g: usize,
        s: usize,
        c0: usize,
        ys: &mut [f32],
    ) {
        let (plan, lay, acts) = (job.plan, job.lay, job.acts);
        let (k, groups) = (plan.k, plan.groups);
        let w = lay.data[lay.part(g, rb, s)..].as_ptr();
        let x = acts.xq[c0 * k + g * plan.group_size..].as_ptr();
        // SAFETY: offsets inside the layout and the activations (see `part_sums`).
        let q = unsafe {
            match &job.map {
                None if lay.bits == 8 => part_sums::<NC, false, true>(
                    w,
                    lay.chunks,
                    lay.word_stride,
                    x,
                    k,
                    vdupq_n_u8(0),
                ),
                None => part_sums::<NC, false, false>(
                    w,
                    lay.chunks,
                    lay.word_stride,
                    x,
                    k,
                    vdupq_n_u8(0),
                ),
                Some(m) => part_sums::<NC, true, false>(
                    w,
                    lay.chunks,
                    lay.word_stride,
                    x,
                    k,
                    vld1q_u8(m.as_ptr()),
                ),
            }
        };
        let r0 = s * SUB;
        let lanes = (plan.m - rb * ROW_BLOCK).saturating_sub(r0).min(SUB);
        let sz = (g * plan.row_blocks + rb) * ROW_BLOCK + r0;
        // The part's scales and zero points, shared by its columns.
        let full = lanes == SUB;
        let (sc, z) = if full {
            let z = match job.zeros {
                _ if !plan.zero_term => [vdupq_n_f32(0.0); 4],
                Zeros::None => [vdupq_n_f32(0.0); 4],
                Zeros::Uniform(z) => [vdupq_n_f32(z); 4],
                Zeros::Tiled(t) => tiled16(t, sz),
            };
            (tiled16(job.scales, sz), z)
        } else {
            ([vdupq_n_f32(0.0); 4], [vdupq_n_f32(0.0); 4])
        };
        for (c, q) in q.into_iter().enumerate() {
            let gn = (c0 + c) * groups + g;
            let corr = vdupq_n_s32(acts.corr[gn]);
            let p = q.map(|q| {
                let aq = if job.a == 1 { q } else { vmulq_n_s32(q, job.a) };
                vaddq_s32(aq, corr)
            });
            let (tsc, zs) = (acts.tsc[gn], acts.zsum[gn]);
            let yb = &mut ys[(c0 + c) * ROW_BLOCK + r0..(c0 + c) * ROW_BLOCK + r0 + lanes];
            if full {
                let (tscv, zsv) = (vdupq_n_f32(tsc), vdupq_n_f32(zs));
                for (i, y4) in yb.chunks_exact_mut(4).enumerate() {
                    // u = P; u -= z zsum; u *= tscale; y += s u (`scalar::epilogue`).
                    let mut u = vcvtq_f32_s32(p[i]);
                    if plan.zero_term {
                        u = vsubq_f32(u, vmulq_f32(z[i], zsv));
                    }
                    u = vmulq_f32(u, tscv);
                    // SAFETY: 4 floats of `y4`.
                    unsafe {
                        let y = vld1q_f32(y4.as_ptr());
                        vst1q_f32(y4.as_mut_ptr(), vaddq_f32(y, vmulq_f32(sc[i], u)));
                    }
                }
            } else {
                let mut sums = [0i32; SUB];
                for (i, p) in p.into_iter().enumerate() {
                    // SAFETY: 4 int32 into `sums[4 i..]`.
                    unsafe { vst1q_s32(sums[4 * i..].as_mut_ptr(), p) };
                }
                for (r, y) in yb.iter_mut().enumerate() {
                    let (sc, z) = (job.scales.at(sz + r), job.zeros.at(sz + r));
                    *y = epilogue(plan, sums[r] as f32, sc, z, tsc, zs, *y);
                }
            }
        }
    }

    /// `vnni::block_sums` on Arm64 with the dot-product extension.
    #[target_feature(enable = "dotprod")]
    pub(super) unsafe fn block_sums(
        job: &Job<'_>,
        rb: usize,
        groups: Range<usize>,
        ys: &mut [f32],
    ) {
        let (plan, n) = (job.plan, job.plan.n);
        assert!(ys.len() >= n * ROW_BLOCK);
        let rows = plan.m - rb * ROW_BLOCK;
        let parts = rows.div_ceil(SUB).min(SUBS);
        for g in groups {
            for s in 0..parts {
                let mut c0 = 0;
                while c0 < n {
                    // SAFETY: as `part`.
                    unsafe {
                        c0 += match n - c0 {
                            4.. => {
                                part::<4>(job, rb, g, s, c0, ys);
                                4
                            }
                            2.. => {
                                part::<2>(job, rb, g, s, c0, ys);
                                2
                            }
                            _ => {
                                part::<1>(job, rb, g, s, c0, ys);
                                1
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use maleki_common::rng;

    /// The int8 codes of [`table::quantize_activations`], interleaved by hand.
    fn expected(x: &[f32]) -> (f32, i32, Vec<i8>) {
        let mut q = vec![0i32; x.len()];
        let a = table::quantize_activations(x, &mut q);
        let order = [0, 2, 4, 6, 1, 3, 5, 7];
        let out = (0..x.len())
            .map(|i| q[i / CHUNK * CHUNK + order[i % CHUNK]] as i8)
            .collect();
        (a, q.iter().sum(), out)
    }

    #[test]
    fn quantize_interleaved_matches_the_scalar_definition() {
        let mut r = rng::stream(7, 0);
        let mut cases: Vec<Vec<f32>> = Vec::new();
        for &len in &[8usize, 16, 32, 48, 128, 256] {
            cases.push(
                (0..len)
                    .map(|_| rng::standard_normal(&mut r) as f32 * 3.0)
                    .collect(),
            );
            cases.push(vec![0.0; len]);
            // Ties: maxabs 127, so rcp = 1 and x * rcp lands on k + 0.5 (the largest magnitude
            // last, then first and negative).
            for (at, m) in [(len - 1, 127.0f32), (0, -127.0)] {
                let mut t: Vec<f32> = (0..len).map(|i| (i % 128) as f32 - 63.5).collect();
                t[at] = m;
                cases.push(t);
            }
            // A lone subnormal: 127 / maxabs overflows and 0 * inf is NaN (stored as 0).
            let mut s = vec![0.0f32; len];
            s[len / 2] = -1e-45;
            cases.push(s);
            let mut m = vec![0.5f32; len];
            m[1] = f32::MAX;
            cases.push(m);
        }
        for x in &cases {
            let (a, sum, out) = expected(x);
            for simd in [false, simd_quantizer()] {
                let mut got = vec![0i8; x.len()];
                let mut q = vec![0i32; x.len()];
                let (ga, gs) = quantize_interleaved(x, &mut got, &mut q, simd);
                assert_eq!((ga.to_bits(), gs), (a.to_bits(), sum), "simd {simd}, {x:?}");
                assert_eq!(got, out, "simd {simd}, {x:?}");
            }
        }
    }
}
