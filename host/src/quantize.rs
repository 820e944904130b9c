//! CPU quantizers from f32 / bf16 into every format, following each recipe's published rule.
//!
//! - **e8m0 scales (MX, OCP MX v1.0 §6.3)**: shared exponent `floor(log2(amax)) − emax(elem)`;
//!   elements `encode_sat(x / 2^e)`. A block's largest element may then exceed the element's
//!   largest finite value and saturate: that is the spec's rule, and the error bound says so.
//! - **ue4m3 scales + fp32 tensor scale (NVFP4)**: `tensor_scale = amax(tensor) / (448 · 6)`; block
//!   scale `ue4m3(amax(block) / 6 / tensor_scale)` (never rounded to zero for a non-zero block);
//!   elements `e2m1(x / (scale · tensor_scale))`.
//! - **fp32 scales (DeepSeek, per-tensor, per-row)**: `scale = amax(block) / max(elem)`; elements
//!   `encode_sat(x / scale)`. An all-zero block gets scale 1.
//!
//! Encoding rounds to nearest even and saturates ([`ElemType::encode_sat`]). NaN or infinite input
//! is rejected with [`Error::Format`]: no format here can carry it through a block scale honestly.

use crate::error::{Result, shape};
use crate::format::{ElemType, OperandFormat, ScaleMajor, ScaleType};
use crate::matrix::{MatrixDesc, ScaleLayout, ScaledMatrix};
use blockscaled_kernels::format::{e4m3, e8m0, ue4m3};
use rayon::prelude::*;

impl ScaledMatrix {
    /// Quantizes `values` (`[batch][rows][k]`, row-major) with the scale layout this format's users
    /// pass by default ([`ScaleMajor::default_for`]).
    pub fn quantize(
        values: &[f32],
        rows: usize,
        k: usize,
        batch: usize,
        format: OperandFormat,
    ) -> Result<Self> {
        Self::quantize_with_major(
            values,
            rows,
            k,
            batch,
            format,
            ScaleMajor::default_for(&format),
        )
    }

    /// As [`quantize`](Self::quantize) from bf16 input.
    pub fn quantize_bf16(
        values: &[half::bf16],
        rows: usize,
        k: usize,
        batch: usize,
        format: OperandFormat,
    ) -> Result<Self> {
        let f: Vec<f32> = values.iter().map(|v| v.to_f32()).collect();
        Self::quantize(&f, rows, k, batch, format)
    }

    /// Quantizes with an explicit scale-tensor major order.
    pub fn quantize_with_major(
        values: &[f32],
        rows: usize,
        k: usize,
        batch: usize,
        format: OperandFormat,
        major: ScaleMajor,
    ) -> Result<Self> {
        format.validate()?;
        let (br, bk) = format.block.extent(rows, k);
        let layout = ScaleLayout::packed(major, rows.div_ceil(br.max(1)), k.div_ceil(bk.max(1)));
        let tensor_scale = 1.0f32;
        let mut desc = MatrixDesc {
            format,
            rows,
            k,
            batch,
            scale_layout: layout,
            tensor_scale,
        };
        let (data_bytes, scale_bytes) = desc.validate()?;
        if values.len() != batch * rows * k {
            return Err(shape(format!(
                "{batch}×{rows}×{k} values expected, got {}",
                values.len()
            )));
        }
        if let Some(bad) = values.iter().find(|v| !v.is_finite()) {
            return Err(format.error(format!("cannot quantize non-finite input {bad}")));
        }
        if format.tensor_scale {
            let amax = values
                .par_iter()
                .fold(|| 0.0f32, |m, v| m.max(v.abs()))
                .reduce(|| 0.0, f32::max);
            let t = amax / (e4m3::MAX * format.elem.max());
            // A zero tensor, or one so small that the ratio underflows, keeps the neutral scale.
            desc.tensor_scale = if t.is_normal() { t } else { 1.0 };
        }

        let elem = format.elem;
        let bits = elem.bits() as usize;
        let sbytes = format.scale.bytes();
        let mut data = vec![0u8; data_bytes];
        let mut scales = vec![0u8; scale_bytes];
        let rows_per_chunk = br.min(rows);
        let chunk_bytes = rows_per_chunk * k * bits / 8;

        // Each chunk is one row block of one batch entry: its elements are contiguous, its scales
        // are returned as (index, bits) and written afterwards (they may interleave in MN-major).
        let batch_bytes = rows * k * bits / 8;
        let chunk_scales: Vec<Vec<(usize, u32)>> = data
            .par_chunks_mut(batch_bytes)
            .enumerate()
            .flat_map(|(l, entry)| {
                entry
                    .par_chunks_mut(chunk_bytes)
                    .enumerate()
                    .map(move |(rb, out)| (l, rb, out))
            })
            .map(|(l, rb, out)| {
                let r0 = rb * br;
                let r1 = (r0 + br).min(rows);
                let mut sc = Vec::with_capacity(layout.k_blocks);
                for kb in 0..layout.k_blocks {
                    let (k0, k1) = (kb * bk, ((kb + 1) * bk).min(k));
                    let row = |r: usize| &values[(l * rows + r) * k + k0..(l * rows + r) * k + k1];
                    let amax = (r0..r1).flat_map(row).fold(0.0f32, |m, v| m.max(v.abs()));
                    let (sbits, divisor) = block_scale(format.scale, elem, amax, desc.tensor_scale);
                    sc.push((layout.index(l, rb, kb), sbits));
                    for r in r0..r1 {
                        for (j, &x) in row(r).iter().enumerate() {
                            let q = if divisor == 0.0 {
                                elem.encode_sat(0.0)
                            } else {
                                elem.encode_sat(x / divisor)
                            };
                            let i = (r - r0) * k + k0 + j;
                            if bits == 4 {
                                out[i / 2] |= (q & 0x0F) << (4 * (i % 2));
                            } else {
                                out[i] = q;
                            }
                        }
                    }
                }
                sc
            })
            .collect();
        for (idx, sbits) in chunk_scales.into_iter().flatten() {
            scales[idx * sbytes..(idx + 1) * sbytes]
                .copy_from_slice(&sbits.to_le_bytes()[..sbytes]);
        }
        Ok(ScaledMatrix::from_validated(desc, data, scales))
    }
}

/// The scale code for a block whose largest magnitude is `amax`, and the f32 divisor applied to
/// its elements before encoding (0: the block is all zeros and encodes to zeros).
fn block_scale(scale: ScaleType, elem: ElemType, amax: f32, tensor_scale: f32) -> (u32, f32) {
    match scale {
        ScaleType::E8M0 => {
            let code = e8m0::mx_scale_for_amax(amax, elem.emax());
            (code as u32, e8m0::decode(code))
        }
        ScaleType::UE4M3 => {
            // A block far below the tensor's largest one can round its scale to the code 0; that
            // would flush every element of the block to zero. Its smallest non-zero scale (2^-9,
            // code 1) keeps the elements representable, each within the element format's bound.
            let code = match ue4m3::encode_sat(amax / elem.max() / tensor_scale) {
                0 if amax > 0.0 => 1,
                c => c,
            };
            (code as u32, ue4m3::decode(code) * tensor_scale)
        }
        ScaleType::F32 => {
            let s = amax / elem.max();
            let s = if s.is_normal() { s } else { 1.0 };
            (s.to_bits(), s)
        }
    }
}
