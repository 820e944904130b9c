//! The FP8 family's block-sparse GEMM: the sparse operand's tensor maps, its work list's
//! schedule, and the launch (A or B sparse, e4m3 blocks of 128 × 128).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use super::config::{Sm90Config, b_box_rows};
use super::{Kernel, Sm90Fp8, unsupported};
use crate::bsr::{BsrMatrix, FP8_BLOCK, SparseSchedule, SparseSide};
use crate::buffers::{DeviceMatrix, DeviceOutput};
use crate::error::{Error, Result};
use crate::families::operands::fp8::code_layout;
use crate::families::operands::{Sm90Operand, Sm90Output};
use crate::families::persistent;
use crate::families::{BsrOperands, SparseGemm};
use crate::format::ElemType;
use crate::tensor_map::BoxMaps;
use crate::workspace::WorkspaceSize;
use blockscaled_kernels::gemm::layout::out_box_n;
use blockscaled_kernels::sm90::{self as family};
use blockscaled_kernels::sm90::{BLOCK_N, Mode, Sm90Fp8Params};

/// A block-sparse GEMM's schedule with `cfg` and its work list (made once per key on the
/// sparse operand), for a kernel with `resident` CTAs resident at once.
fn bsr_schedule(resident: u32, ops: BsrOperands, cfg: &Sm90Config) -> Result<SparseSchedule> {
    let (stream, dense, sparse) = (ops.stream, ops.dense, ops.sparse);
    let (tile, cl) = (cfg.tile, cfg.cluster);
    let clusters = (cfg.ctas.min(resident) / cl.size()).max(1) as usize;
    let (m, n, k) = (dense.desc.rows, sparse.matrix_rows, dense.desc.k);
    let units = (tile.block_m() * cl.m, tile.block_n);
    let work = crate::bsr::sparse_work(stream, sparse, m, units, (clusters, cfg.split_k))?;
    let dims = (m as u32, n as u32, k as u32, 1);
    let schedule = tile.schedule(dims, cl, (1, cfg.group_m), None, Some(work.sparse()));
    Ok((schedule, work))
}

/// What the kernel needs of a block-sparse operand: tensor maps of its stored blocks (3-D: 128
/// bytes of K, 128 rows, stored blocks; 128-byte swizzle) with boxes of 128 rows (a 128-column
/// tile) and 64 (a 64-column tile, or a CTA's half of a tile shared along M).
pub(super) struct Sm90Sparse {
    tmaps: BoxMaps,
}

impl Sm90Sparse {
    pub(super) fn prepare(
        stream: &Arc<CudaStream>,
        m: &BsrMatrix,
        values: &CudaSlice<u8>,
    ) -> Result<Self> {
        let (bs, blocks) = (FP8_BLOCK, m.nnz().max(1));
        let (ptr, _g) = values.device_ptr(stream);
        let tmaps = BoxMaps::new(ptr, code_layout([bs, bs, blocks]), [128, 64]);
        // (Encoded now: a driver's refusal surfaces at upload rather than in a call.)
        tmaps.get(128)?;
        Ok(Sm90Sparse { tmaps })
    }
}

impl Sm90Fp8 {
    /// The block-sparse kernel for `dense`'s type and `cfg`'s tile.
    fn bsr_kernel(&self, dense: &DeviceMatrix, cfg: &Sm90Config) -> Result<&Kernel> {
        let ea = dense.desc.format.elem;
        let def = family::kernel(cfg.tile, ea, ElemType::E4M3, Mode::Sparse);
        persistent::find(&self.kernels, def, || {
            Error::Format(format!(
                "block-sparse GEMM takes an e4m3 dense operand, not {}",
                ea.name()
            ))
        })
    }

    /// The workspace of a block-sparse GEMM with `cfg` (split K's buffers where the work list
    /// splits runs of blocks; the sparse operand's work list is made as the launch makes it).
    pub(crate) fn bsr_workspace(&self, ops: BsrOperands, cfg: Sm90Config) -> Result<WorkspaceSize> {
        let dense = ops.dense;
        if let Some(e) = unsupported(&dense.desc, false) {
            return Err(Error::Format(e));
        }
        let kernel = self.bsr_kernel(dense, &cfg)?;
        let resident = kernel.resident(cfg.cluster.size());
        let (schedule, work) = bsr_schedule(resident, ops, &cfg)?;
        WorkspaceSize::split_k(&schedule, cfg.cluster, work.slots > 0)
    }

    /// The block-sparse GEMM `g` (e4m3 blocks) with `cfg` validated for the kernel's shape.
    pub(crate) fn bsr_gemm(&self, g: SparseGemm<'_, '_>, cfg: Sm90Config) -> Result<()> {
        let (ws, side, c) = (g.work, g.side, g.c);
        let (stream, dense, sparse) = (g.ops.stream, g.ops.dense, g.ops.sparse);
        if let Some(e) = unsupported(&dense.desc, false) {
            return Err(Error::Format(e));
        }
        let kernel = self.bsr_kernel(dense, &cfg)?;
        let ao = Sm90Operand::as_a(dense, stream, &self.preparers)?;
        let Some(bo) = sparse.prepared.get::<Sm90Sparse>() else {
            return Err(Error::Format(
                "operands not prepared for the sm90 block-sparse kernel".into(),
            ));
        };
        let Some(sfa_map) = ao.sfa_map()? else {
            return Err(Error::Format(
                "the dense operand of a block-sparse GEMM needs fp32 scales per 1×128 (or per row \
                 or tensor)"
                    .into(),
            ));
        };
        let (tile, cl) = (cfg.tile, cfg.cluster);
        let (m, n, k) = (dense.desc.rows, sparse.matrix_rows, dense.desc.k);
        let resident = kernel.resident(cl.size());
        let (schedule, work) = bsr_schedule(resident, g.ops, &cfg)?;
        let mut slot = ws.splitk.slot(if work.slots > 0 { 2 } else { 1 });
        let DeviceOutput {
            buf: out,
            prepared: out_prepared,
            dtype,
            ..
        } = c;
        let (mut launch, run) =
            kernel.persistent(stream, &schedule, (cfg.ctas, cl), None, slot.as_mut())?;
        let b_rows = b_box_rows(tile, cl).unwrap_or(BLOCK_N);
        // With A sparse the tile is Cᵀ: stored directly.
        let tmap_c = match side {
            SparseSide::A => 0,
            SparseSide::B => match out_prepared.get::<Sm90Output>() {
                Some(o) => launch.opt_map(o.tmap(out_box_n(tile.block_n))?)?,
                None => 0,
            },
        };
        let params = Sm90Fp8Params {
            tmap_a: launch.map(ao.tmap(tile.a_box_rows(1))?)?,
            tmap_b: launch.map(bo.tmaps.get(b_rows)?)?,
            tmap_c,
            tmap_sfa: launch.map(sfa_map)?,
            sfb: launch.ptr(&sparse.scales),
            sfb_col: 0,
            out: launch.ptr_mut(out),
            splitk: run.splitk,
            m: m as u32,
            n: n as u32,
            k: k as u32,
            l: 1,
            out_type: *dtype as u32,
            group_m: cfg.group_m,
            split_k: 1,
            cluster_m: cl.m,
            cluster_n: 1,
            _pad: 0,
            groups: Default::default(),
            // (FP8 blocks are 128 × 128 e4m3: one stage of K each.)
            sparse: work.params(&mut launch, sparse, side, 0),
        };
        // SAFETY: `cfg` was validated for the kernel's shape (`validate_sparse`: a block-sparse
        // tile, pairs along M only, 32-bit indexing); the dense operand's maps and A-role scales
        // cover its live buffers; the sparse operand's map covers its stored blocks (at least
        // one), `sfb` holds a scale and `cols` an in-range column for each, and every segment's
        // positions are stored blocks of its tile's block row (`work_list` over the validated
        // structure); the output holds m·n elements of `out_type` (C or, transposed, its
        // product's shape); `run.splitk` is sized for the schedule's slots and counters; the grid is
        // a whole number of clusters.
        let _gemm = unsafe { launch.launch(&params) }?;
        Ok(())
    }
}

crate::held::held!(Sm90Sparse: tmaps);
