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
//!
//! An operand that is FP8 with fp32 scales already is not folded: the pair may be one MX or NVFP4
//! operand with a DeepSeek-style A (1×128) or a B folded once ahead of time
//! ([`Gpu::fold_to_fp8`](crate::Gpu::fold_to_fp8): experts' weights folded at load time, so that
//! each call folds only the activations). Grouped GEMM runs here too (B: one expert per batch
//! entry), on the FP8 family's grouped kernels (e4m3 × e4m3).

use std::any::Any;
use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use crate::buffers::DeviceMatrix;
use crate::error::{Error, Result, shape};
use crate::families::operands::fp8::Sfb;
use crate::families::operands::{BRole, Sm90Operand, fp8 as sm90_fp8};
use crate::families::operands::{MxOperand, mx as sm90_mx};
use crate::families::persistent::Loader;
use crate::families::{Family, Gemm};
use crate::format::ElemType;
use crate::held::Held;
use crate::launch::Launch;
use crate::matrix::{MatrixDesc, ScaleLayout};
use crate::prepare::Preparers;
use crate::workspace::{Workspace, WorkspaceSize};
use blockscaled_kernels::fold::{
    self as family, FOLD_K, FOLD_ROWS, FOLD_SMEM, FOLD_THREADS, FoldParams,
};
use blockscaled_kernels::format::fold::target;
use blockscaled_kernels::sm90::m_pad;

/// Why `d` cannot be folded by the pre-pass (`None`: it can, in either role).
fn unfoldable(d: &MatrixDesc) -> Option<String> {
    if let Some(e) = sm90_mx::unsupported(d) {
        return Some(e);
    }
    let fmt = d.format;
    let Some(scale) = sm90_mx::scale_format(d) else {
        return Some(format!("{fmt}: no fold kernel for this scale format"));
    };
    if family::kernel(fmt.elem, scale).is_none() {
        return Some(format!(
            "{fmt}: no fold kernel for these elements and scale blocks"
        ));
    }
    if !d.k.is_multiple_of(FOLD_K as usize) {
        return Some(format!(
            "K = {} is not a multiple of {FOLD_K}, the FP8 kernel's scale groups",
            d.k
        ));
    }
    None
}

/// How one operand reaches the FP8 kernel on this path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// Already FP8 with fp32 scales the FP8 kernel takes in this role (e.g. experts folded
    /// once by [`Gpu::fold_to_fp8`](crate::Gpu::fold_to_fp8), or DeepSeek-style activations).
    Ready,
    /// Folded per call into the role's workspace.
    Fold,
}

fn route(d: &MatrixDesc, as_b: bool) -> std::result::Result<Route, String> {
    if sm90_fp8::unsupported(d, as_b).is_none() {
        return Ok(Route::Ready);
    }
    match unfoldable(d) {
        None => Ok(Route::Fold),
        Some(e) => Err(e),
    }
}

/// Why the pair cannot run on this path (`None`: it can): each operand folds or is ready for
/// the FP8 kernel in its role, and at least one folds (two ready ones are the FP8 kernel's own).
pub(crate) fn unsupported_pair(a: &MatrixDesc, b: &MatrixDesc) -> Option<String> {
    match (route(a, false), route(b, true)) {
        (Err(e), _) | (_, Err(e)) => Some(e),
        (Ok(Route::Ready), Ok(Route::Ready)) => {
            Some("both operands are FP8 with fp32 scales already: the FP8 kernel runs them".into())
        }
        _ => None,
    }
}

/// The element types the FP8 kernel sees for the pair (after folding).
pub(crate) fn kernel_types(a: &MatrixDesc, b: &MatrixDesc) -> (ElemType, ElemType) {
    (target(a.format.elem), target(b.format.elem))
}

/// One role's folded copy: the FP8 codes and the FP8 family's operand over them.
pub(crate) struct Folded {
    /// (rows, k, l) it was made for.
    dims: (usize, usize, usize),
    data: CudaSlice<u8>,
    op: Sm90Operand,
}

/// The fold kernels on one GPU (the two roles' folded copies live in the calling handle's
/// workspace).
pub(crate) struct Sm90MxFp8 {
    kernels: Vec<(&'static family::FoldKernel, CudaFunction)>,
    /// For B's row maxima, made at a matrix's first fold as B.
    preparers: Preparers,
}

impl Family for Sm90MxFp8 {
    fn prepare_weights(&self, stream: &Arc<CudaStream>, m: &DeviceMatrix<'_>) -> Result<()> {
        // (A matrix that folds as B reads each row's largest scale code.)
        if matches!(route(&m.desc, true), Ok(Route::Fold))
            && unfoldable(&m.desc).is_none()
            && let Some(tops) = MxOperand::row_tops_of(m, stream, &self.preparers)
        {
            tops?;
        }
        Ok(())
    }
}

impl Sm90MxFp8 {
    /// Loads the fold kernels when the module built for `target` has them.
    pub(crate) fn load(cx: &Loader) -> Result<Option<Self>> {
        if !family::KERNELS[0].info.targets.contains(&cx.target) {
            return Ok(None);
        }
        let kernels = family::KERNELS
            .iter()
            .map(|def| Ok((def, cx.module.load_function(def.info.name)?)))
            .collect::<Result<_>>()?;
        let preparers = cx.preparers.clone();
        Ok(Some(Sm90MxFp8 { kernels, preparers }))
    }

    /// Folds A and B into the workspace where they need it, then runs `fp8` (the FP8 kernel's
    /// launch with the plan's configuration) on the FP8 operands and their element types, with
    /// the workspace held until it is enqueued; grouped if `g.groups` (B: one expert per batch
    /// entry).
    pub(crate) fn gemm(
        &self,
        g: Gemm<'_, '_>,
        fp8: impl FnOnce(Gemm<'_, '_>, (&Sm90Operand, &Sm90Operand), (ElemType, ElemType)) -> Result<()>,
    ) -> Result<()> {
        let (a, b, stream) = (g.a, g.b, g.stream);
        if let Some(e) = unsupported_pair(&a.desc, &b.desc) {
            return Err(Error::Format(e));
        }
        let mut ws = crate::alloc::lock(&g.work.fold);
        let [wa, wb] = &mut *ws;
        let ao = self.operand(stream, a, wa, false)?;
        let bo = self.operand(stream, b, wb, true)?;
        fp8(g, (ao, bo), kernel_types(&a.desc, &b.desc))
    }

    /// Folds A (`a`, of a GEMM on `stream` in workspace `work`) into the workspace's A copy and
    /// runs `f` on its codes (`l` × `rows` × `k` e4m3, K-major) and on it as the FP8 kernel's A
    /// operand (fp32 scales `[l][k/128][m_pad]`, the layout the 4-bit-weights kernels read
    /// too), with the workspace held until `f` has enqueued its launch.
    pub(crate) fn with_folded_a<R>(
        &self,
        (stream, work): (&Arc<CudaStream>, &Workspace),
        a: &DeviceMatrix,
        f: impl FnOnce(&CudaSlice<u8>, &Sm90Operand) -> Result<R>,
    ) -> Result<R> {
        if let Some(e) = unfoldable(&a.desc) {
            return Err(Error::Format(e));
        }
        let mut ws = crate::alloc::lock(&work.fold);
        let [wa, _] = &mut *ws;
        let folded = slot_for(stream, wa, &a.desc, false)?;
        self.fold(stream, a, folded, false)?;
        f(&folded.data, &folded.op)
    }

    /// Whether the pre-pass folds `d` (in either role).
    pub(crate) fn folds(d: &MatrixDesc) -> bool {
        unfoldable(d).is_none()
    }

    /// The workspace bytes of A's folded copy ([`Self::with_folded_a`]).
    pub(crate) fn a_workspace(a: &DeviceMatrix) -> Result<WorkspaceSize> {
        if let Some(e) = unfoldable(&a.desc) {
            return Err(Error::Format(e));
        }
        Ok(WorkspaceSize {
            fold: Folded::bytes(dims_of(&a.desc), false),
            ..WorkspaceSize::default()
        })
    }

    /// `src` as the FP8 kernel's operand in its role: its own prepared operand when it is FP8
    /// already, else folded into `slot` (grown when its dimensions differ).
    fn operand<'w>(
        &self,
        stream: &Arc<CudaStream>,
        src: &'w DeviceMatrix,
        slot: &'w mut Option<Box<dyn Held>>,
        as_b: bool,
    ) -> Result<&'w Sm90Operand> {
        if route(&src.desc, as_b).map_err(Error::Format)? == Route::Ready {
            return match as_b {
                true => Sm90Operand::as_b(src, stream, &self.preparers),
                false => Sm90Operand::as_a(src, stream, &self.preparers),
            };
        }
        let folded = slot_for(stream, slot, &src.desc, as_b)?;
        self.fold(stream, src, folded, as_b)?;
        Ok(&folded.op)
    }

    /// The workspace a GEMM of `a` and `b` takes beside the FP8 kernel's: the folded copies of
    /// the operands that need folding.
    pub(crate) fn workspace((a, b): (&DeviceMatrix, &DeviceMatrix)) -> Result<WorkspaceSize> {
        if let Some(e) = unsupported_pair(&a.desc, &b.desc) {
            return Err(Error::Format(e));
        }
        let mut w = WorkspaceSize::default();
        for (m, as_b) in [(a, false), (b, true)] {
            if route(&m.desc, as_b).map_err(Error::Format)? == Route::Fold {
                w.fold += Folded::bytes(dims_of(&m.desc), as_b);
            }
        }
        Ok(w)
    }

    /// Makes `ws`'s folded copies for `a` and `b` where they need folding (what a call's
    /// [`Self::gemm`] would make), B's only where `fold_b` (a plan that folds A alone,
    /// [`Self::with_folded_a`], takes none for B).
    pub(crate) fn reserve(
        stream: &Arc<CudaStream>,
        ws: &Workspace,
        (a, b): (&DeviceMatrix, &DeviceMatrix),
        fold_b: bool,
    ) -> Result<()> {
        let mut slots = crate::alloc::lock(&ws.fold);
        let [wa, wb] = &mut *slots;
        for (m, slot, as_b) in [(a, wa, false), (b, wb, true)] {
            if (!as_b || fold_b) && route(&m.desc, as_b).map_err(Error::Format)? == Route::Fold {
                slot_for(stream, slot, &m.desc, as_b)?;
            }
        }
        Ok(())
    }

    /// `src` folded once into buffers of its own (the B role: scales per row; the A role: per
    /// 1×128), for [`Gpu::fold_to_fp8`](crate::Gpu::fold_to_fp8): the folded codes, the scales
    /// in the layout of `src.desc.folded(as_b)`, and the FP8 kernel's operand.
    pub(crate) fn fold_once(
        &self,
        stream: &Arc<CudaStream>,
        src: &DeviceMatrix,
        as_b: bool,
    ) -> Result<(MatrixDesc, CudaSlice<u8>, CudaSlice<u8>, Sm90Operand)> {
        let mut desc = src.desc.folded(as_b)?;
        if let Some(e) = unfoldable(&src.desc) {
            return Err(Error::Format(e));
        }
        let dims = (desc.rows, desc.k, desc.batch);
        let mut folded = Folded::alloc(stream, dims, as_b)?;
        self.fold(stream, src, &mut folded, as_b)?;
        // The scales as the matrix's own (the reference kernel and downloads read them there):
        // per row `[l][rows]`, or the kernel's `[l][k/128][m_pad]` (row-contiguous, padded).
        let cols = folded.op.b_role().and_then(|b| b.sfb_col.as_ref());
        let (scales, bytes) = match (cols, &folded.op.sfa) {
            (Some(cols), _) if as_b => (cols, cols.len() * 4),
            (_, Some((sfa, m_pad))) if !as_b => {
                let (rows, k, l) = dims;
                let kb = k / FOLD_K as usize;
                desc.scale_layout = ScaleLayout {
                    row_blocks: rows,
                    k_blocks: kb,
                    row_stride: 1,
                    k_stride: *m_pad as usize,
                    batch_stride: kb * *m_pad as usize,
                };
                debug_assert_eq!(
                    desc.scale_layout.required_len(l).map(|x| x <= sfa.len()),
                    Some(true)
                );
                (sfa, sfa.len() * 4)
            }
            _ => unreachable!("the role's scales were allocated"),
        };
        let mut copy = crate::alloc::zeros::<u8>(stream, bytes)?;
        {
            let (src_ptr, _gs) = scales.device_ptr(stream);
            let (dst_ptr, _gd) = copy.device_ptr_mut(stream);
            // SAFETY: both allocations are live and hold `bytes` bytes (f32 → their bytes), on
            // this stream's context, which cudarc made current for the guards above.
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(
                    dst_ptr,
                    src_ptr,
                    bytes,
                    stream.cu_stream(),
                )
            }?;
        }
        let Folded { data, op, .. } = folded;
        Ok((desc, data, copy, op))
    }

    /// Runs the fold kernel of `src` into `folded` (made for `src`'s dimensions in this role).
    fn fold(
        &self,
        stream: &Arc<CudaStream>,
        src: &DeviceMatrix,
        folded: &mut Folded,
        as_b: bool,
    ) -> Result<()> {
        let (rows, k, l) = folded.dims;
        debug_assert_eq!((src.desc.rows, src.desc.k, src.desc.batch), folded.dims);
        let not_prepared =
            || Error::Format("operand was not prepared for the sm90 MX kernels".into());
        let (Some((scales, rows_pad)), Some(scale)) =
            (MxOperand::scales_of(src), sm90_mx::scale_format(&src.desc))
        else {
            return Err(not_prepared());
        };
        // The B role's scale is each row's over all of K (made at the matrix's first fold as B).
        let row_tops = if as_b {
            let tops = MxOperand::row_tops_of(src, stream, &self.preparers);
            Some(tops.ok_or_else(not_prepared)??)
        } else {
            None
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
        let mut launch = Launch::new(stream, func)
            .grid(k_chunks as u32, row_blocks as u32, l as u32)
            .block(FOLD_THREADS, 1, 1)
            .shared_mem(FOLD_SMEM);
        // (The role's one buffer: B's per-row scales, or A's per 1×128.)
        let dst_scales = if as_b {
            match folded.op.b_role_mut() {
                Some(BRole {
                    sfb_col: Some(s), ..
                }) => launch.ptr_mut(s),
                _ => unreachable!("a B-role fold has per-row scales"),
            }
        } else {
            match &mut folded.op.sfa {
                Some((s, _)) => launch.ptr_mut(s),
                None => unreachable!("an A-role fold has 1×128 scales"),
            }
        };
        let params = FoldParams {
            src: launch.ptr(&src.data),
            scales: launch.ptr(scales),
            dst: launch.ptr_mut(&mut folded.data),
            dst_scales,
            row_tops: row_tops.map_or(0, |t| launch.ptr(t)),
            rows: rows as u32,
            k: k as u32,
            rows_pad,
            m_pad,
            b_role: as_b as u32,
            tensor_scale: src.desc.tensor_scale,
        };
        // SAFETY: `src` holds l·rows·k codes (its desc formed the shape) and its prepared scales
        // l·(k/64)·rows_pad·(64/block) bytes and, in the B role (the only one that reads them),
        // row tops l·rows_pad bytes, with rows_pad ≥
        // ⌈rows/128⌉·128; `dst` holds l·rows·k bytes and the scales the role's layout
        // (`Folded::alloc` for these dims); k is a multiple of 128 (`unfoldable`); the grid is
        // k/128 × ⌈rows/128⌉ × l within the launch limits.
        let _fold = unsafe { launch.launch(&params) }?;
        Ok(())
    }
}

crate::held::held!(Folded: data, op);

/// The dimensions a folded copy of `d` is made for.
fn dims_of(d: &MatrixDesc) -> (usize, usize, usize) {
    (d.rows, d.k, d.batch)
}

/// `slot`'s folded copy for an operand `d` in its role, made anew where it holds none of `d`'s
/// dimensions. (A workspace keeps one folded copy a role; it is this family's type.)
fn slot_for<'w>(
    stream: &Arc<CudaStream>,
    slot: &'w mut Option<Box<dyn Held>>,
    d: &MatrixDesc,
    as_b: bool,
) -> Result<&'w mut Folded> {
    let dims = dims_of(d);
    let fits = |s: &Option<Box<dyn Held>>| {
        s.as_deref()
            .and_then(|f| (f as &dyn Any).downcast_ref::<Folded>())
            .is_some_and(|f| f.dims == dims)
    };
    if !fits(slot) {
        *slot = None;
        *slot = Some(Box::new(Folded::alloc(stream, dims, as_b)?));
    }
    Ok(slot
        .as_deref_mut()
        .and_then(|f| (f as &mut dyn Any).downcast_mut::<Folded>())
        .expect("filled above with a Folded"))
}

impl Folded {
    /// The device bytes [`Folded::alloc`] makes for `dims` in a role: the codes and the scales
    /// (B: the tiles' ones and the per-row scales; A: the kernel's padded 1×128 scales).
    fn bytes((rows, k, l): (usize, usize, usize), as_b: bool) -> usize {
        let k_chunks = k / FOLD_K as usize;
        let scales = match as_b {
            true => 4 * l * (rows.div_ceil(FOLD_ROWS as usize) * k_chunks + rows),
            false => 4 * l * k_chunks * m_pad(rows as u32) as usize,
        };
        rows * k * l + scales
    }

    /// Buffers for an `l` × `rows` × `k` operand folded in one role, with the FP8 kernel's
    /// operand over them.
    fn alloc(stream: &Arc<CudaStream>, dims: (usize, usize, usize), as_b: bool) -> Result<Self> {
        let (rows, k, l) = dims;
        let k_chunks = k / FOLD_K as usize;
        let data = crate::alloc::zeros::<u8>(stream, rows * k * l)?;
        let op = if as_b {
            // Per-row scales go to C's columns; the 128 × 128 block scales are all 1.
            let row_blocks = rows.div_ceil(FOLD_ROWS as usize);
            let ones = crate::alloc::copy_of(stream, &vec![1f32; l * row_blocks * k_chunks])?;
            let cols = crate::alloc::zeros::<f32>(stream, l * rows)?;
            let b_role = BRole {
                sfb: Sfb::Own(ones),
                sfb_col: Some(cols),
            };
            Sm90Operand::over(stream, &data, dims, None, Some(b_role))?
        } else {
            let m_pad = m_pad(rows as u32);
            let sfa = crate::alloc::zeros::<f32>(stream, l * k_chunks * m_pad as usize)?;
            Sm90Operand::over(stream, &data, dims, Some((sfa, m_pad)), None)?
        };
        Ok(Folded { dims, data, op })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::test_util::{MX_RECIPES, desc, takes_mx_pairs_only};

    #[test]
    fn mx_and_nvfp4_fold_and_ragged_k_or_fp32_scales_do_not() {
        takes_mx_pairs_only(unsupported_pair);
        // K a multiple of 128, the FP8 kernel's scale block.
        for r in MX_RECIPES {
            let (a, b) = (desc(r, 100, 320, false), desc(r, 70, 320, true));
            assert!(unsupported_pair(&a, &b).is_some(), "{r}: K = 320");
        }
    }
}
