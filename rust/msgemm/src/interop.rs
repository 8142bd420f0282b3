//! Loaders from the tensors other tools write (no extra dependencies): GPTQ and AWQ
//! (`qweight`, `qzeros`, `scales`, act-order `g_idx`) and ONNX Runtime `MatMulNBits` blobs.
//!
//! In all of them the logical weight is `(M, K)` = (output features, input features) and
//! `Wd[m, k] = scale * (q - zero)`; the loaders produce `uint*` weights with zero points
//! (or `int4`/`int2` without them, MatMulNBits' default zero point `2^(b-1)`).

use maleki_common::{Error, Result};

use crate::format::{Codebook, Format};
use crate::packed::PackedWeights;

fn uint_format(bits: u32) -> Result<Format> {
    match bits {
        2 => Ok(Format::Uint2),
        3 => Ok(Format::Uint3),
        4 => Ok(Format::Uint4),
        _ => Err(Error::invalid(
            "bits",
            format!("must be 2, 3 or 4, got {bits}"),
        )),
    }
}

/// Bit `pos` .. `pos + bits` of a little-endian stream of 32-bit words.
#[inline]
fn stream_bits(words: &[i32], pos: usize, bits: u32) -> u8 {
    let w = pos / 32;
    let off = pos % 32;
    let lo = u64::from(words[w] as u32);
    let hi = words.get(w + 1).map_or(0u64, |&x| u64::from(x as u32));
    (((lo | (hi << 32)) >> off) & ((1u64 << bits) - 1)) as u8
}

/// Act-order: groups from `g_idx` (K,) and the permutation putting K in group order.
/// Returns `(group_size, k_perm or None when g_idx is the plain k / G)`.
fn groups_from_gidx(g_idx: &[i32], k: usize, groups: usize) -> Result<(usize, Option<Vec<u32>>)> {
    if g_idx.len() != k {
        return Err(Error::shape(
            "g_idx",
            format!("({k},)"),
            format!("({},)", g_idx.len()),
        ));
    }
    if groups == 0 || !k.is_multiple_of(groups) {
        return Err(Error::invalid(
            "g_idx",
            format!("{groups} groups do not divide K = {k}"),
        ));
    }
    let g = k / groups;
    let mut count = vec![0usize; groups];
    for (i, &gi) in g_idx.iter().enumerate() {
        if gi < 0 || gi as usize >= groups {
            return Err(Error::invalid(
                "g_idx",
                format!("entry {i} = {gi} is not a group index in 0..{groups}"),
            ));
        }
        count[gi as usize] += 1;
    }
    if let Some(bad) = count.iter().position(|&c| c != g) {
        return Err(Error::invalid(
            "g_idx",
            format!(
                "group {bad} has {} members; every group needs K / groups = {g}",
                count[bad]
            ),
        ));
    }
    if g_idx
        .iter()
        .enumerate()
        .all(|(i, &gi)| gi as usize == i / g)
    {
        return Ok((g, None));
    }
    let mut perm: Vec<u32> = (0..k as u32).collect();
    perm.sort_by_key(|&i| g_idx[i as usize]); // stable: keeps K order within a group
    Ok((g, Some(perm)))
}

/// Loads GPTQ tensors (AutoGPTQ / transformers layout).
///
/// - `qweight`: `(K * bits / 32, M)` int32, codes packed along K, low bits first (for 3 bits
///   a continuous little-endian bit stream of 32 codes per 3 words);
/// - `qzeros`: `(groups, M * bits / 32)` int32, zero points packed along M the same way;
/// - `scales`: `(groups, M)`; `g_idx`: `(K,)` group of each input (act-order) or `None`
///   (then `group_size` gives `g = k / G`);
/// - `zero_offset`: added to the stored zero points (1 for the AutoGPTQ v1 format that stores
///   `z - 1`, 0 for `gptq_v2`).
#[allow(clippy::too_many_arguments)]
pub fn from_gptq(
    qweight: &[i32],
    qzeros: &[i32],
    scales: &[f32],
    g_idx: Option<&[i32]>,
    m: usize,
    k: usize,
    bits: u32,
    group_size: Option<usize>,
    zero_offset: i32,
) -> Result<PackedWeights> {
    let format = uint_format(bits)?;
    let b = bits as usize;
    if m == 0 || k == 0 {
        return Err(Error::invalid("qweight", "must be non-empty"));
    }
    if !(k * b).is_multiple_of(32) || !(m * b).is_multiple_of(32) {
        return Err(Error::invalid(
            "qweight",
            format!("K*bits and M*bits must be multiples of 32 (K={k}, M={m})"),
        ));
    }
    let kw = k * b / 32;
    if qweight.len() != kw * m {
        return Err(Error::shape(
            "qweight",
            format!("({kw}, {m})"),
            format!("{} values", qweight.len()),
        ));
    }
    if scales.is_empty() || !scales.len().is_multiple_of(m) {
        return Err(Error::shape(
            "scales",
            format!("(groups, {m})"),
            format!("{} values", scales.len()),
        ));
    }
    let groups = scales.len() / m;
    let mw = m * b / 32;
    if qzeros.len() != groups * mw {
        return Err(Error::shape(
            "qzeros",
            format!("({groups}, {mw})"),
            format!("{} values", qzeros.len()),
        ));
    }
    let (g, perm) = match g_idx {
        Some(gi) => groups_from_gidx(gi, k, groups)?,
        None => {
            let g = group_size.unwrap_or(k);
            if g == 0 || !k.is_multiple_of(g) || k / g != groups {
                return Err(Error::invalid(
                    "group_size",
                    format!(
                        "K = {k} with {groups} groups of scales needs group_size = {}, got {g}",
                        k / groups
                    ),
                ));
            }
            (g, None)
        }
    };
    // Codes (M, K) in packed (group) order.
    let mut codes = maleki_common::alloc::zeroed_vec::<u8>(m * k, "the codes")?;
    let mut col = vec![0i32; kw];
    for row in 0..m {
        for (w, c) in col.iter_mut().enumerate() {
            *c = qweight[w * m + row];
        }
        for j in 0..k {
            let src = perm.as_ref().map_or(j, |p| p[j] as usize);
            codes[row * k + j] = stream_bits(&col, src * b, bits);
        }
    }
    let mut s = vec![0f32; m * groups];
    let mut z = vec![0f32; m * groups];
    for gi in 0..groups {
        let zrow = &qzeros[gi * mw..(gi + 1) * mw];
        for row in 0..m {
            s[row * groups + gi] = scales[gi * m + row];
            z[row * groups + gi] =
                (i32::from(stream_bits(zrow, row * b, bits)) + zero_offset) as f32;
        }
    }
    PackedWeights::from_codes(
        Codebook::new(format)?,
        m,
        k,
        g,
        &codes,
        s,
        Some(z),
        perm.map(|p| p.to_vec()),
    )
}

/// AWQ's nibble order inside an int32 (GEMM layout): nibble `i` holds feature `8c + ORDER[i]`.
pub const AWQ_ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

/// Loads AutoAWQ GEMM tensors (4 bits): `qweight` `(K, M/8)` int32 packed along M in
/// [`AWQ_ORDER`], `qzeros` `(groups, M/8)` likewise, `scales` `(groups, M)`.
pub fn from_awq(
    qweight: &[i32],
    qzeros: &[i32],
    scales: &[f32],
    m: usize,
    k: usize,
    group_size: usize,
) -> Result<PackedWeights> {
    if m == 0 || k == 0 || !m.is_multiple_of(8) {
        return Err(Error::invalid(
            "qweight",
            format!("M must be a positive multiple of 8, got M={m}, K={k}"),
        ));
    }
    if group_size == 0 || !k.is_multiple_of(group_size) {
        return Err(Error::invalid(
            "group_size",
            format!("must divide K = {k}, got {group_size}"),
        ));
    }
    let groups = k / group_size;
    let mw = m / 8;
    if qweight.len() != k * mw {
        return Err(Error::shape(
            "qweight",
            format!("({k}, {mw})"),
            format!("{} values", qweight.len()),
        ));
    }
    if qzeros.len() != groups * mw {
        return Err(Error::shape(
            "qzeros",
            format!("({groups}, {mw})"),
            format!("{} values", qzeros.len()),
        ));
    }
    if scales.len() != groups * m {
        return Err(Error::shape(
            "scales",
            format!("({groups}, {m})"),
            format!("{} values", scales.len()),
        ));
    }
    let unpack = |word: i32, feature: usize| -> u8 {
        let i = AWQ_ORDER
            .iter()
            .position(|&o| o == feature % 8)
            .expect("order covers 0..8");
        ((word as u32 >> (4 * i)) & 15) as u8
    };
    let mut codes = maleki_common::alloc::zeroed_vec::<u8>(m * k, "the codes")?;
    for kk in 0..k {
        for row in 0..m {
            codes[row * k + kk] = unpack(qweight[kk * mw + row / 8], row);
        }
    }
    let mut s = vec![0f32; m * groups];
    let mut z = vec![0f32; m * groups];
    for gi in 0..groups {
        for row in 0..m {
            s[row * groups + gi] = scales[gi * m + row];
            z[row * groups + gi] = f32::from(unpack(qzeros[gi * mw + row / 8], row));
        }
    }
    PackedWeights::from_codes(
        Codebook::new(Format::Uint4)?,
        m,
        k,
        group_size,
        &codes,
        s,
        Some(z),
        None,
    )
}

/// Zero points of a MatMulNBits node.
#[derive(Debug, Clone, Copy)]
pub enum NBitsZeros<'a> {
    /// The default `2^(bits-1)`.
    Default,
    /// uint8 `(M, ceil(k_blocks * bits / 8))`, low bits first.
    Packed(&'a [u8]),
    /// float `(M, k_blocks)`.
    Float(&'a [f32]),
}

/// Loads an ONNX Runtime `MatMulNBits` weight: `b` `(M, k_blocks, block_size * bits / 8)` uint8
/// (codes along K, low bits first), `scales` `(M * k_blocks)`, zero points as [`NBitsZeros`].
/// `K` must be `k_blocks * block_size` (no padded tail block).
pub fn from_matmulnbits(
    b: &[u8],
    scales: &[f32],
    zeros: NBitsZeros<'_>,
    m: usize,
    k: usize,
    bits: u32,
    block_size: usize,
) -> Result<PackedWeights> {
    if bits != 2 && bits != 4 {
        return Err(Error::invalid(
            "bits",
            format!("MatMulNBits loader supports 2 and 4 bits, got {bits}"),
        ));
    }
    if block_size < 16 || !block_size.is_power_of_two() {
        return Err(Error::invalid(
            "block_size",
            format!("must be a power of two >= 16, got {block_size}"),
        ));
    }
    if m == 0 || k == 0 || !k.is_multiple_of(block_size) {
        return Err(Error::invalid(
            "K",
            format!("must be a positive multiple of block_size = {block_size}, got {k}"),
        ));
    }
    let kb = k / block_size;
    let blob = block_size * bits as usize / 8;
    if b.len() != m * kb * blob {
        return Err(Error::shape(
            "B",
            format!("({m}, {kb}, {blob})"),
            format!("{} bytes", b.len()),
        ));
    }
    if scales.len() != m * kb {
        return Err(Error::shape(
            "scales",
            format!("({},)", m * kb),
            format!("({},)", scales.len()),
        ));
    }
    let format = match (bits, &zeros) {
        (4, NBitsZeros::Default) => Format::Int4,
        (2, NBitsZeros::Default) => Format::Int2,
        (4, _) => Format::Uint4,
        _ => Format::Uint2,
    };
    let z: Option<Vec<f32>> = match zeros {
        NBitsZeros::Default => None,
        NBitsZeros::Float(zf) => {
            if zf.len() != m * kb {
                return Err(Error::shape(
                    "zero_points",
                    format!("({},)", m * kb),
                    format!("({},)", zf.len()),
                ));
            }
            Some(zf.to_vec())
        }
        NBitsZeros::Packed(zp) => {
            let per_row = (kb * bits as usize).div_ceil(8);
            if zp.len() != m * per_row {
                return Err(Error::shape(
                    "zero_points",
                    format!("({},)", m * per_row),
                    format!("({},)", zp.len()),
                ));
            }
            let per_byte = 8 / bits as usize;
            let mask = (1u8 << bits) - 1;
            Some(
                (0..m * kb)
                    .map(|i| {
                        let (row, blk) = (i / kb, i % kb);
                        let byte = zp[row * per_row + blk / per_byte];
                        f32::from((byte >> (bits as usize * (blk % per_byte))) & mask)
                    })
                    .collect(),
            )
        }
    };
    // The row's blobs are exactly the canonical packing of its K codes (low bits first).
    PackedWeights::from_packed(
        Codebook::new(format)?,
        m,
        k,
        block_size,
        b.to_vec(),
        scales.to_vec(),
        z,
        None,
    )
}

/// Exports `int4`/`uint4`/`int2`/`uint2` weights with integer zero points in `[0, 2^b)` to the
/// MatMulNBits layout: `(B, scales, packed zero points or None)`.
/// MatMulNBits tensors: `(B, scales, packed zero points or None)`.
pub type NBitsTensors = (Vec<u8>, Vec<f32>, Option<Vec<u8>>);

pub fn to_matmulnbits(pw: &PackedWeights) -> Result<NBitsTensors> {
    let f = pw.codebook().format();
    let bits: u32 = match f {
        Format::Int4 | Format::Uint4 => 4,
        Format::Int2 | Format::Uint2 => 2,
        _ => {
            return Err(Error::Unsupported(format!(
                "MatMulNBits holds int4/uint4/int2/uint2 weights, not {}",
                f.name()
            )))
        }
    };
    if pw.k_perm().is_some() {
        return Err(Error::Unsupported(
            "act-order weights (k_perm) have no MatMulNBits form".into(),
        ));
    }
    let g = pw.group_size();
    if g < 16 || !g.is_power_of_two() {
        return Err(Error::Unsupported(format!(
            "MatMulNBits needs a power-of-two block size >= 16, got {g}"
        )));
    }
    let (m, groups) = (pw.m(), pw.groups());
    let top = (1u32 << bits) as f32;
    let half = top / 2.0;
    // Zero points in code units: signed formats store v = q - half, so z_code = z + half.
    let signed = matches!(f, Format::Int4 | Format::Int2);
    let zcodes: Option<Vec<f32>> = match (pw.zeros(), signed) {
        (None, true) => None,
        (None, false) => Some(vec![0.0; m * groups]),
        (Some(z), true) => Some(z.iter().map(|&z| z + half).collect()),
        (Some(z), false) => Some(z.to_vec()),
    };
    let packed_z = match zcodes {
        None => None,
        Some(zc) => {
            if let Some(bad) = zc.iter().find(|&&z| z != z.round() || z < 0.0 || z >= top) {
                return Err(Error::Unsupported(format!(
                    "zero point {bad} is not an integer code in [0, {top})"
                )));
            }
            let per_byte = 8 / bits as usize;
            let per_row = (groups * bits as usize).div_ceil(8);
            let mut out = vec![0u8; m * per_row];
            for row in 0..m {
                for blk in 0..groups {
                    out[row * per_row + blk / per_byte] |=
                        (zc[row * groups + blk] as u8) << (bits as usize * (blk % per_byte));
                }
            }
            Some(out)
        }
    };
    Ok((pw.packed().to_vec(), pw.scales().to_vec(), packed_z))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_bits_crosses_words() {
        let words = [0x8000_0000u32 as i32, 0b1];
        assert_eq!(stream_bits(&words, 31, 2), 0b11);
        assert_eq!(stream_bits(&words, 30, 3), 0b110);
        assert_eq!(stream_bits(&words, 32, 4), 0b0001);
    }

    #[test]
    fn gidx_permutation_sorts_groups_stably() {
        let (g, p) = groups_from_gidx(&[1, 0, 1, 0], 4, 2).unwrap();
        assert_eq!(g, 2);
        assert_eq!(p.unwrap(), vec![1, 3, 0, 2]);
        assert!(groups_from_gidx(&[0, 0, 1, 0], 4, 2).is_err());
        assert_eq!(groups_from_gidx(&[0, 0, 1, 1], 4, 2).unwrap().1, None);
    }
}
