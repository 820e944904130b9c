//! MX and NVFP4 operands on the Hopper FP8 kernel: the fold pre-pass (`kernels::fold`) re-encodes
//! A as FP8 with fp32 scales per 1×128 and B with one fp32 scale per row (each group's largest
//! scale gives its fp32 scale, times the NVFP4 tensor scale, and every element's own scale is
//! folded into its FP8 code: [`blockscaled_kernels::format::fold`]), then the sm90 FP8 family
//! runs them with FP8 `wgmma` at twice bf16's rate (B's row scales multiplied into C's columns
//! after the K loop). Lossy: FP8 tensor-core accumulation (as on DeepSeek FP8 inputs); for e8m0
//! scales, where one group's scales span more than 2^14 (e2m1) or an FP8 element falls below the
//! normal range after its shift, rounding to the FP8 subnormal grid, at most
//! `fold::max_error_units` of the group's own scale; for NVFP4, every element rounded once to
//! e4m3 (`fold::nv_max_error`: 2^-4 of itself, a quarter of NVFP4's own rounding).
//! The folded copies live in a workspace reused in stream order, like split-K's.

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaFunction, CudaModule, CudaSlice, CudaStream};

use crate::buffers::DeviceMatrix;
use crate::error::{Error, Result, shape};
use crate::family::{Family, Gemm};
use crate::launch::Launch;
use crate::matrix::{GemmShape, MatrixDesc};
use crate::sm90_fp8::{Sm90Config, Sm90Fp8, Sm90Operand};
use crate::sm90_mx::{self, MxOperand};
use blockscaled_kernels::fold::{
    self as family, FOLD_K, FOLD_ROWS, FOLD_SMEM, FOLD_THREADS, FoldParams,
};
use blockscaled_kernels::format::fold::target;
use blockscaled_kernels::sm90::m_pad;

/// Why the pair cannot run folded onto the FP8 kernel (`None`: it can).
pub(crate) fn unsupported_pair(a: &MatrixDesc, b: &MatrixDesc) -> Option<String> {
    if let Some(e) = sm90_mx::unsupported_pair(a, b) {
        return Some(e);
    }
    let fmt = a.format;
    let Some(scale) = sm90_mx::scale_format(a) else {
        return Some(format!("{fmt}: no fold kernel for this scale format"));
    };
    let (ea, eb) = (a.format.elem, b.format.elem);
    if family::kernel(ea, scale).is_none() || family::kernel(eb, scale).is_none() {
        return Some(format!(
            "{fmt}: no fold kernel for these elements and scale blocks"
        ));
    }
    if !a.k.is_multiple_of(FOLD_K as usize) {
        return Some(format!(
            "K = {} is not a multiple of {FOLD_K}, the FP8 kernel's scale groups",
            a.k
        ));
    }
    None
}

/// One role's folded copy: the FP8 codes and the FP8 family's operand over them.
struct Folded {
    /// (rows, k, l) it was made for.
    dims: (usize, usize, usize),
    data: CudaSlice<u8>,
    op: Sm90Operand,
}

/// The fold kernels and the two roles' workspaces on one GPU.
pub(crate) struct Sm90MxFp8 {
    kernels: Vec<(&'static family::FoldKernel, CudaFunction)>,
    workspace: Mutex<[Option<Folded>; 2]>,
}

impl Family for Sm90MxFp8 {}

impl Sm90MxFp8 {
    /// Loads the fold kernels when the module built for `target` has them.
    pub(crate) fn load(module: &Arc<CudaModule>, target: &str) -> Result<Option<Self>> {
        if !family::KERNELS[0].info.targets.contains(&target) {
            return Ok(None);
        }
        let kernels = family::KERNELS
            .iter()
            .map(|def| Ok((def, module.load_function(def.info.name)?)))
            .collect::<Result<_>>()?;
        Ok(Some(Sm90MxFp8 {
            kernels,
            workspace: Mutex::new([None, None]),
        }))
    }

    /// Folds A and B into the workspace, then C = A · Bᵀ on `fp8` with `cfg` (validated for
    /// `g.shape`).
    pub(crate) fn gemm(&self, g: Gemm<'_>, cfg: Sm90Config, fp8: &Sm90Fp8) -> Result<()> {
        g.dense_only("the MX → FP8 fold")?;
        let Gemm {
            stream,
            shape,
            a,
            b,
            c,
            ..
        } = g;
        if let Some(e) = unsupported_pair(&a.desc, &b.desc) {
            return Err(Error::Format(e));
        }
        let GemmShape { m, n, k, l } = shape;
        let mut ws = self.workspace.lock().unwrap_or_else(|e| e.into_inner());
        let [wa, wb] = &mut *ws;
        let fa = self.fold(stream, a, wa, (m, k, l), false)?;
        let fb = self.fold(stream, b, wb, (n, k, l), true)?;
        let types = (target(a.desc.format.elem), target(b.desc.format.elem));
        fp8.run(stream, shape, (&fa.op, &fb.op), types, c, cfg, None)
    }

    /// Folds `src` into `slot` (grown when its dimensions differ) in the A role or the B role.
    fn fold<'w>(
        &self,
        stream: &Arc<CudaStream>,
        src: &DeviceMatrix,
        slot: &'w mut Option<Folded>,
        dims: (usize, usize, usize),
        as_b: bool,
    ) -> Result<&'w Folded> {
        let (rows, k, l) = dims;
        let (Some((scales, rows_pad, row_tops)), Some(scale)) =
            (MxOperand::scales_of(src), sm90_mx::scale_format(&src.desc))
        else {
            return Err(Error::Format(
                "operand was not prepared for the sm90 MX kernels".into(),
            ));
        };
        let elem = src.desc.format.elem;
        let def = family::kernel(elem, scale);
        let (_, func) = self
            .kernels
            .iter()
            .find(|(d, _)| Some(*d) == def)
            .ok_or_else(|| Error::Format(format!("no fold kernel for {}", src.desc.format)))?;
        let row_blocks = rows.div_ceil(FOLD_ROWS as usize);
        if row_blocks > u16::MAX as usize || l > u16::MAX as usize {
            return Err(shape(format!(
                "the fold pre-pass takes at most 65535 groups of 128 rows and 65535 batch \
                 entries, not {row_blocks} and {l}"
            )));
        }
        let k_chunks = k / FOLD_K as usize;
        let m_pad = m_pad(rows as u32);
        if slot.as_ref().is_none_or(|f| f.dims != dims) {
            *slot = None;
            let data = stream.alloc_zeros::<u8>(rows * k * l)?;
            let op = if as_b {
                // Per-row scales go to C's columns; the 128 × 128 block scales are all 1.
                let ones = stream.clone_htod(&vec![1f32; l * row_blocks * k_chunks])?;
                let cols = stream.alloc_zeros::<f32>(l * rows)?;
                Sm90Operand::over(stream, &data, dims, None, Some(ones), Some(cols))?
            } else {
                let sfa = stream.alloc_zeros::<f32>(l * k_chunks * m_pad as usize)?;
                Sm90Operand::over(stream, &data, dims, Some((sfa, m_pad)), None, None)?
            };
            *slot = Some(Folded { dims, data, op });
        }
        let folded = slot.as_mut().expect("filled above");
        {
            let mut launch = Launch::new(stream, func)
                .grid(k_chunks as u32, row_blocks as u32, l as u32)
                .block(FOLD_THREADS, 1, 1)
                .shared_mem(FOLD_SMEM);
            let dst_scales = match (&mut folded.op.sfa, &mut folded.op.sfb_col) {
                (Some((s, _)), _) | (None, Some(s)) => launch.ptr_mut(s),
                (None, None) => unreachable!("one role's scales"),
            };
            let params = FoldParams {
                src: launch.ptr(&src.data),
                scales: launch.ptr(scales),
                dst: launch.ptr_mut(&mut folded.data),
                dst_scales,
                row_tops: launch.ptr(row_tops),
                rows: rows as u32,
                k: k as u32,
                rows_pad,
                m_pad,
                b_role: as_b as u32,
                tensor_scale: src.desc.tensor_scale,
            };
            // SAFETY: `src` holds l·rows·k codes (its desc formed the shape) and its prepared scales
            // l·(k/64)·rows_pad·(64/block) bytes and row tops l·rows_pad bytes, with rows_pad ≥
            // ⌈rows/128⌉·128; `dst` holds
            // l·rows·k bytes and the scales the role's layout (allocated for `dims` above); k is a
            // multiple of 128 (`unsupported_pair`); the grid is k/128 × ⌈rows/128⌉ × l within
            // the launch limits.
            let _fold = unsafe { launch.launch(&params) }?;
        }
        Ok(slot.as_ref().expect("filled above"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{Fp8, Recipe};

    fn desc(recipe: Recipe, rows: usize, k: usize, b: bool) -> MatrixDesc {
        MatrixDesc::of_recipe(recipe, rows, k, b)
    }

    #[test]
    fn mx_and_nvfp4_fold_and_ragged_k_or_fp32_scales_do_not() {
        for r in [
            Recipe::Mxfp8(Fp8::E4M3),
            Recipe::Mxfp8(Fp8::E5M2),
            Recipe::Mxfp4,
            Recipe::E2m1E8m0x16,
            Recipe::Nvfp4,
        ] {
            let (a, b) = (desc(r, 100, 256, false), desc(r, 70, 256, true));
            assert_eq!(unsupported_pair(&a, &b), None, "{r}");
            let (a, b) = (desc(r, 100, 320, false), desc(r, 70, 320, true));
            assert!(unsupported_pair(&a, &b).is_some(), "{r}: K = 320");
        }
        let ds = Recipe::DeepSeekFp8;
        assert!(unsupported_pair(&desc(ds, 64, 256, false), &desc(ds, 64, 256, true)).is_some());
    }
}
