//! The MoE kernels' handles, one launch helper, and where their scales live in a matrix.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule, CudaSlice};

use crate::buffers::{DeviceMatrix, Prepared};
use crate::error::{Error, Result};
use crate::families::operands::Sm90Operand;
use crate::launch::{KernelParams, Launch};
use crate::matrix::MatrixDesc;
use blockscaled_kernels::moe::{
    self as km, Combine, Offsets, Pack, Rank, Regroup, RegroupPlan, Route, ScaleRows,
    SwigluQuantize,
};

// SAFETY: `#[repr(C)]` structs of `blockscaled_kernels::moe`, the kernels' own parameter types:
// u64 addresses first, then 4-byte fields (`ScaleRows` four u32), an even number of them, so
// no padding.
unsafe impl KernelParams for Route {}
unsafe impl KernelParams for Rank {}
unsafe impl KernelParams for Offsets {}
unsafe impl KernelParams for Pack {}
unsafe impl KernelParams for RegroupPlan {}
unsafe impl KernelParams for Regroup {}
unsafe impl KernelParams for SwigluQuantize {}
unsafe impl KernelParams for Combine {}

/// The loaded MoE kernels.
#[derive(Clone)]
pub(crate) struct MoeKernels {
    sm_count: u32,
    pub(super) route: CudaFunction,
    pub(super) rank: CudaFunction,
    pub(super) offsets: CudaFunction,
    pub(super) pack: CudaFunction,
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(super) regroup_plan: CudaFunction,
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(super) regroup: CudaFunction,
    pub(super) swiglu: CudaFunction,
    pub(super) combine: CudaFunction,
}

impl MoeKernels {
    pub(crate) fn load(module: &Arc<CudaModule>, sm_count: u32) -> Result<Self> {
        let f = |k: blockscaled_kernels::registry::KernelInfo| module.load_function(k.name);
        Ok(MoeKernels {
            sm_count,
            route: f(km::ROUTE)?,
            rank: f(km::RANK)?,
            offsets: f(km::OFFSETS)?,
            pack: f(km::PACK)?,
            regroup_plan: f(km::REGROUP_PLAN)?,
            regroup: f(km::REGROUP)?,
            swiglu: f(km::SWIGLU_QUANTIZE)?,
            combine: f(km::COMBINE)?,
        })
    }

    /// Blocks for `items` (a block each, or `per_block` each), at most eight an SM.
    pub(super) fn grid(&self, items: usize, per_block: usize) -> u32 {
        items
            .div_ceil(per_block)
            .clamp(1, 8 * self.sm_count as usize) as u32
    }
}

/// One launch of `func` with `p` (its addresses already taken: the buffers' guards live in
/// `launch`).
/// # Safety
/// `p` is `func`'s parameter struct, its addresses hold what it says for the grid and block.
pub(super) unsafe fn go<P: KernelParams>(launch: Launch<'_>, p: P) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe { launch.launch(&p) }?;
    Ok(())
}

/// fp32 scales per 1×128 of `m` (packed, one row per row block) as the kernels index them.
pub(super) fn scale_rows(m: &DeviceMatrix) -> Result<ScaleRows> {
    let (d, l) = (&m.desc, m.desc.scale_layout);
    if l.row_blocks != d.rows || l.k_blocks * 128 != d.k {
        return Err(Error::Format(format!(
            "the MoE kernels take fp32 scales per 1×128, not {l:?}"
        )));
    }
    Ok(ScaleRows {
        batch_rows: d.rows as u32,
        row_stride: l.row_stride as u32,
        k_stride: l.k_stride as u32,
        batch_stride: l.batch_stride as u32,
        k_blocks: l.k_blocks as u32,
        pad: 0,
    })
}

/// The FP8 kernel's A-role scales of a matrix of `desc` (`[l][k/128][m_pad]`, kept in its
/// `prepared` copies), and their layout, where the matrix has them: the MoE kernels write them
/// beside the packed scales, so that no re-layout pass runs before the GEMM.
fn a_role<'m>(
    prepared: &'m mut Prepared,
    desc: &MatrixDesc,
) -> Option<(&'m mut CudaSlice<f32>, ScaleRows)> {
    let (sfa, m_pad) = prepared.get_mut::<Sm90Operand>()?.sfa.as_mut()?;
    let kb = (desc.k / 128) as u32;
    let layout = ScaleRows {
        batch_rows: desc.rows as u32,
        row_stride: 1,
        k_stride: *m_pad,
        batch_stride: kb * *m_pad,
        k_blocks: kb,
        pad: 0,
    };
    Some((sfa, layout))
}

/// A-role scales' address and layout for a launch (0 where the matrix has none).
pub(super) fn a_role_ptr<'l>(
    l: &mut Launch<'l>,
    prepared: &'l mut Prepared,
    desc: &MatrixDesc,
) -> (u64, ScaleRows) {
    match a_role(prepared, desc) {
        Some((sfa, layout)) => (l.ptr_mut(sfa), layout),
        None => (0, ScaleRows::rows(0)),
    }
}

/// Whether `m` has the A-role scales [`a_role`] finds (then the MoE kernels wrote them).
pub(super) fn has_a_role(m: &DeviceMatrix) -> bool {
    m.prepared
        .get::<Sm90Operand>()
        .is_some_and(|o| o.sfa.is_some())
}

/// The error for groups over the caller's memory where the layer writes its own (never: the
/// layer makes its groups).
pub(super) fn not_owned() -> Error {
    Error::Config("the layer's groups are a view, not its own buffer".into())
}

pub(super) fn no_step() -> Error {
    Error::Config("no step has run".into())
}
