//! CPU quantizers from f32 / bf16 into every format, following each recipe's published rule.
//!
//! - **e8m0 scales (MX, OCP MX v1.0 §6.3)**: shared exponent `floor(log2(amax)) − emax(elem)`;
//!   elements `encode_sat(x / 2^e)`. A block's largest element may then exceed the element's
//!   largest finite value and saturate: that is the spec's rule, and the error bound says so.
//! - **ue4m3 scales + fp32 tensor scale (NVFP4)**: `tensor_scale = amax(tensor) / (448 · 6)`; block
//!   scale `ue4m3(amax(block) / 6 / tensor_scale)` (never rounded to zero for a non-zero block);
//!   elements `e2m1(x / (scale · tensor_scale))`. An all-zero tensor gets tensor scale 1.
//! - **fp32 scales (DeepSeek, per-tensor, per-row)**: `scale = amax(block) / max(elem)`; elements
//!   `encode_sat(x / scale)`. An all-zero block gets scale 1.
//!
//! The fp32 ratios (`amax / max(elem)`, `amax / (448 · 6)`) are the nearest `f32` while that is a
//! normal number. Below `max · 2^-126` they are subnormal `f32`s with few significant bits, so
//! there they are rounded **up** to the next multiple of `2^-149`: never zero for a non-zero block,
//! and never so low that the block maximum saturates. (A block this small is still a block of
//! numbers; giving it scale 1 would flush all of it to zero.)
//!
//! Each element is divided by its scale (times the tensor scale) and the quotient rounded once to
//! f32 before encoding: one f32 division for one scale, an f64 one for NVFP4's two (no underflow
//! of their product). The per-block rules are `blockscaled_kernels::format::quantize`, which the
//! device quantizers run too.
//!
//! Encoding rounds to nearest even and saturates ([`ElemType::encode_sat`]). NaN or infinite input
//! is rejected with [`Error::Format`]: no format here can carry it through a block scale honestly.

use crate::error::{Result, shape};
use crate::format::{ElemType, OperandFormat, ScaleMajor, ScaleType};
use crate::matrix::{MatrixDesc, ScaleLayout, ScaledMatrix};
use blockscaled_kernels::format::quantize::{block_scale, nvfp4_tensor_scale, quantize_element};
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
            // A zero tensor keeps the neutral scale.
            desc.tensor_scale = nvfp4_tensor_scale(amax, format.elem);
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
                            let q = quantize_element(elem, x, divisor);
                            let i = (r - r0) * k + k0 + j;
                            match bits {
                                4 => out[i / 2] |= ((q & 0x0F) as u8) << (4 * (i % 2)),
                                8 => out[i] = q as u8,
                                _ => {
                                    out[2 * i..2 * i + 2].copy_from_slice(&(q as u16).to_le_bytes())
                                }
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

/// K of one fp32 scale group of a folded A (the FP8 kernel's 1×128).
const FOLD_GROUP_K: usize = 128;

impl MatrixDesc {
    /// The description of this MX or NVFP4 matrix folded to FP8 ([`ScaledMatrix::fold_to_fp8`]):
    /// e4m3 (e5m2 from e5m2) with fp32 scales per 1×128 (A role) or per row (B role, `as_b`),
    /// scales packed K-major, no tensor scale (it is folded into the scales).
    /// [`Error::Format`](crate::Error::Format) for a matrix that does not fold, [`Error::Shape`](crate::Error::Shape)
    /// for K not a multiple of 128.
    pub fn folded(&self, as_b: bool) -> Result<MatrixDesc> {
        let d = self;
        let (elem, bk) = (d.format.elem, d.block_extent().1);
        let nv = d.format.scale == ScaleType::UE4M3 && elem == ElemType::E2M1 && bk == 16;
        if !(nv || d.format.scale == ScaleType::E8M0)
            || d.block_extent().0 != 1
            || !matches!(elem, ElemType::E4M3 | ElemType::E5M2 | ElemType::E2M1)
            || !FOLD_GROUP_K.is_multiple_of(bk)
        {
            return Err(d
                .format
                .error("only MX matrices (e8m0 scales per 1×32 or 1×16) and NVFP4 ones fold"));
        }
        if !d.k.is_multiple_of(FOLD_GROUP_K) {
            return Err(shape(format!("K = {} is not a multiple of 128", d.k)));
        }
        let group_k = if as_b { d.k } else { FOLD_GROUP_K };
        let format = OperandFormat {
            elem: blockscaled_kernels::format::fold::target(elem),
            scale: ScaleType::F32,
            block: if as_b {
                crate::format::ScaleBlock::PerRow
            } else {
                crate::format::ScaleBlock::Tile {
                    rows: 1,
                    k: FOLD_GROUP_K as u32,
                }
            },
            tensor_scale: false,
        };
        Ok(MatrixDesc {
            format,
            scale_layout: ScaleLayout::packed(ScaleMajor::K, d.rows, d.k / group_k),
            tensor_scale: 1.0,
            ..*d
        })
    }
}

impl ScaledMatrix {
    /// This MX or NVFP4 matrix (e4m3, e5m2 or e2m1 with e8m0 scales per 32 or 16, or e2m1 with
    /// ue4m3 scales per 16; K a multiple of 128) re-encoded as FP8 with fp32 scales, as the
    /// GPU's fold pre-pass does for the FP8 kernel: per 1×128 for the A role, per row over all
    /// of K for the B role (`as_b`). Bit-identical to the GPU's.
    /// - e8m0: each group's scale is 2^(r − 127 − h), `r` its largest non-NaN e8m0 code, and each
    ///   element is [`fold`](blockscaled_kernels::format::fold::fold)ed by `r` minus its own code:
    ///   exact except below the FP8 normal range (error ≤
    ///   [`max_error_units`](blockscaled_kernels::format::fold::max_error_units) of the group
    ///   scale).
    /// - ue4m3 (NVFP4): each group's scale is 2^(E − 5) times the tensor scale, `E` the binade of
    ///   its largest non-NaN scale, and each element is its e2m1 value times its block scale times
    ///   2^(5 − E) rounded once to e4m3
    ///   ([`fold_nv`](blockscaled_kernels::format::fold::fold_nv); error ≤
    ///   [`nv_max_error`](blockscaled_kernels::format::fold::nv_max_error)).
    ///
    /// Elements of a NaN scale become NaN.
    pub fn fold_to_fp8(&self, as_b: bool) -> Result<ScaledMatrix> {
        use blockscaled_kernels::format::fold;
        let d = *self.desc();
        let folded = d.folded(as_b)?;
        let (elem, bk) = (d.format.elem, d.block_extent().1);
        let nv = d.format.scale == ScaleType::UE4M3;
        let (rows, k, l) = (d.rows, d.k, d.batch);
        let group_k = if as_b { k } else { FOLD_GROUP_K };
        let (row_blocks, k_groups) = (rows, k / group_k);
        let (format, layout) = (folded.format, folded.scale_layout);
        // A scale code (ue4m3: sign bit cleared, as its decoder ignores it) and whether it is NaN.
        let code_of = |li: usize, r: usize, kk: usize| {
            let c = self.scales()[d.scale_layout.index(li, r, kk / bk)] as u32;
            if nv { c & 0x7F } else { c }
        };
        let is_nan = |c: u32| if nv { fold::ue4m3_is_nan(c) } else { c == 0xFF };
        let mut tops = vec![0u32; l * row_blocks * k_groups];
        for li in 0..l {
            for r in 0..rows {
                for g in 0..k_groups {
                    let t = &mut tops[(li * row_blocks + r) * k_groups + g];
                    for kk in (g * group_k..(g + 1) * group_k).step_by(bk) {
                        let s = code_of(li, r, kk);
                        if !is_nan(s) {
                            *t = (*t).max(s);
                        }
                    }
                }
            }
        }
        let mut data = vec![0u8; l * rows * k];
        for li in 0..l {
            for r in 0..rows {
                for kk in 0..k {
                    let top = tops[(li * row_blocks + r) * k_groups + kk / group_k];
                    let (s, x) = (code_of(li, r, kk), self.code(li, r, kk));
                    data[(li * rows + r) * k + kk] = if is_nan(s) {
                        fold::NAN as u8
                    } else if nv {
                        fold::fold_nv(x, fold::nv_factor(s, fold::nv_group_exp(top))) as u8
                    } else {
                        fold::fold(elem, x, top - s) as u8
                    };
                }
            }
        }
        let scales = tops
            .iter()
            .flat_map(|&t| {
                let v = if nv {
                    fold::nv_group_scale(fold::nv_group_exp(t)) * self.tensor_scale()
                } else {
                    2f64.powi(t as i32 - 127 - fold::headroom(elem)) as f32
                };
                v.to_bits().to_le_bytes()
            })
            .collect();
        ScaledMatrix::from_parts(format, rows, k, l, data, scales, layout, 1.0)
    }
}
