//! Host side of the Hopper FP8 kernel (`kernels::sm90`): the family's kernels on one GPU and
//! their launch (dense, grouped, fused; split K included). Its configuration and the rules it
//! obeys are in `config.rs`, the block-sparse launch in `bsr.rs`; the operand copies it reads
//! (A-role fp32 scales, B role, code maps) are the shared `operands::fp8`.

use std::sync::Arc;

pub(crate) mod heuristic;

use cudarc::driver::CudaStream;

use crate::buffers::{DeviceMatrix, DeviceOutput, PreparedValue};
use crate::error::{Error, Result, config};
use crate::families::operands::fp8::Sfb;
pub(crate) use crate::families::operands::fp8::unsupported;
use crate::families::operands::{CopyKind, Sm90Operand, Sm90Output};
use crate::families::persistent::{self, Loader};
use crate::families::{
    Families, Family, FusedNeeds, Gemm, Made, PlanConfig, Sizing, StoredBlocks, computes_transposed,
};
use crate::format::ElemType;
use crate::fused::Fused;
use crate::matrix::GemmShape;
use crate::prepare::Preparers;
use crate::workspace::WorkspaceSize;
use blockscaled_kernels::gemm::layout::out_box_n;
use blockscaled_kernels::params::SparseParams;
use blockscaled_kernels::sm90::{self as family, BLOCK_N, Mode, Sm90Fp8Params, Tile};

mod bsr;
mod config;

use bsr::Sm90Sparse;
pub use config::Sm90Config;
use config::{b_box_rows, dense_schedule};

/// One loaded kernel (its row of the family's kernel list: tile, element types, mode).
type Kernel = persistent::Kernel<family::Sm90Fp8Kernel>;

/// Whether `tile` cannot run `epi`: swapped tiles compute Cᵀ and store it transposed, without
/// the fused epilogue's row staging.
pub(crate) fn tile_refuses(tile: Tile, epi: Option<&Fused<'_>>) -> bool {
    tile.is_swapped() && epi.is_some()
}

/// The sm90 FP8 family on one GPU: a kernel per tile shape, element types and mode.
pub(crate) struct Sm90Fp8 {
    kernels: Vec<Kernel>,
    /// For the B role's scales, made at a matrix's first use as B.
    preparers: Preparers,
}

impl Family for Sm90Fp8 {
    fn prepare_weights(&self, stream: &Arc<CudaStream>, m: &DeviceMatrix<'_>) -> Result<()> {
        if let Some(op) = m.prepared.get::<Sm90Operand>() {
            Sm90Operand::as_b(m, stream, &self.preparers)?;
            // (Encoding the maps now surfaces a driver's refusal here rather than in a call.)
            op.tmap(BLOCK_N)?;
        }
        Ok(())
    }

    fn describe(&self) -> Option<String> {
        let k = self.kernels.first()?;
        Some(format!(
            "sm90 kernel: {} CTAs resident alone, {} in clusters of 2",
            k.resident(1),
            k.resident(2)
        ))
    }

    fn operand_copy(&self) -> Option<CopyKind> {
        Some(CopyKind::of::<Sm90Operand>())
    }

    fn prepare_output(&self, stream: &Arc<CudaStream>, out: &DeviceOutput<'_>) -> Made {
        let dims = (out.m, out.n, out.l);
        let maps = Sm90Output::prepare(stream, &out.buf, out.dtype, dims)?;
        Ok(maps.map(|p| Box::new(p) as PreparedValue))
    }

    fn prepare_sparse(&self, stream: &Arc<CudaStream>, blocks: StoredBlocks<'_>) -> Made {
        let copy = Sm90Sparse::prepare(stream, blocks.matrix, blocks.values)?;
        Ok(Some(Box::new(copy)))
    }
}

impl PlanConfig for Sm90Config {
    fn validate(&self, shape: &GemmShape) -> Result<()> {
        Sm90Config::validate(self, shape)
    }

    fn grouped_split(&self) -> Option<u32> {
        Some(self.split_k)
    }

    /// Split K's buffers.
    fn workspace(&self, q: &Sizing<'_>) -> Result<WorkspaceSize> {
        let schedule = dense_schedule(self, q.shape, q.groups);
        WorkspaceSize::split_k(&schedule, self.cluster, self.split_k > 1)
    }

    fn fused_columns(&self) -> Result<u32> {
        match self.tile.is_swapped() {
            true => Err(computes_transposed(self)),
            false => Ok(self.tile.block_n),
        }
    }

    fn has_fused_kernel(&self, needs: &FusedNeeds) -> bool {
        let (ea, eb) = needs.elems;
        family::fused_kernel(self.tile, ea, eb, needs.in_registers).is_some()
    }

    fn launch(&self, families: &Families, g: Gemm<'_, '_>) -> Result<()> {
        families.require::<Sm90Fp8>(NEEDS_SM90)?.gemm(g, *self)
    }
}

/// What [`Families::require`] says of the FP8 family where the GPU's module has none.
pub(crate) const NEEDS_SM90: &str = "sm90 FP8 kernel (it needs compute capability 9.0)";

impl Sm90Fp8 {
    /// Loads the kernels when the module built for `target` has them.
    pub(crate) fn load(cx: &Loader) -> Result<Option<Self>> {
        let Some(kernels) = cx.kernels_of(family::LISTS.into_iter().flatten(), true)? else {
            return Ok(None);
        };
        let preparers = cx.preparers.clone();
        Ok(Some(Sm90Fp8 { kernels, preparers }))
    }

    /// C = A · Bᵀ with `cfg` (validated for `g.shape`): one launch, split K included.
    pub(crate) fn gemm(&self, g: Gemm<'_, '_>, cfg: Sm90Config) -> Result<()> {
        let (ao, bo) = operands(g.a, g.b, g.stream, &self.preparers)?;
        let types = (g.a.desc.format.elem, g.b.desc.format.elem);
        self.run(g, (ao, bo), types, cfg)
    }

    /// [`Self::gemm`] on prepared operands `ao`, `bo` of element types `(ea, eb)` standing for
    /// `g`'s A and B (A scales per 1×128, B scales per 128×128 or per row: a fold's copies).
    pub(crate) fn run(
        &self,
        g: Gemm<'_, '_>,
        (ao, bo): (&Sm90Operand, &Sm90Operand),
        (ea, eb): (ElemType, ElemType),
        cfg: Sm90Config,
    ) -> Result<()> {
        let (stream, work, shape, groups) = (g.stream, g.work, g.shape, g.groups);
        let (c, epi) = (g.c, g.epi);
        let GemmShape { m, n, k, l } = shape;
        if tile_refuses(cfg.tile, epi.as_ref()) {
            return Err(config(format!(
                "{:?} computes Cᵀ: it has no fused epilogue (the tiles of 128 rows or more have)",
                cfg.tile
            )));
        }
        let mode = match (groups.is_some(), epi.is_some()) {
            (true, true) => {
                return Err(config(
                    "grouped GEMM has no fused epilogue (the dense sm90 kernels have)",
                ));
            }
            (true, false) => Mode::Grouped,
            // The epilogues the consumers can run in their registers take that kernel where
            // the tile has one (the dense kernel's layout and K loop); the others the kernel
            // with finishing warps.
            (false, true) => {
                let regs = epi
                    .as_ref()
                    .map_or(family::InRegisters::No, Fused::in_registers);
                family::fused_kernel(cfg.tile, ea, eb, regs).map_or(Mode::Fused, |k| k.mode)
            }
            (false, false) => Mode::Dense,
        };
        let def = family::kernel(cfg.tile, ea, eb, mode);
        let kernel = persistent::find(&self.kernels, def, || {
            let what = match mode {
                Mode::Grouped => "grouped ",
                Mode::Fused | Mode::FusedInRegisters | Mode::FusedInRegistersMx => {
                    "fused-epilogue "
                }
                _ => "",
            };
            config(format!(
                "no sm90 {what}kernel for {:?}, {} · {}{}",
                cfg.tile,
                ea.name(),
                eb.name(),
                if mode == Mode::Fused {
                    " (fused: e4m3 · e4m3 on the 128 × 128 tile; without β·C, residual or \
                         SwiGLU also the 192-row tile)"
                } else {
                    ""
                }
            ))
        })?;
        let (Some(sfa_map), Some(b_role)) = (ao.sfa_map()?, bo.b_role()) else {
            return Err(Error::Format(
                "operands not prepared for the sm90 kernel in these roles".into(),
            ));
        };
        let (tile, cl) = (cfg.tile, cfg.cluster);
        // With split-K the last CTA of each tile to finish adds the other K ranges' partial sums
        // (kept in the workspace) and stores C as without a split.
        let mut slot = work.splitk.slot(cfg.split_k);
        let DeviceOutput {
            buf: out,
            prepared: out_prepared,
            dtype,
            ..
        } = c;
        let schedule = dense_schedule(&cfg, shape, groups);
        let (mut launch, run) =
            kernel.persistent(stream, &schedule, (cfg.ctas, cl), groups, slot.as_mut())?;
        // A in boxes of `Tile::a_box_rows`; B in boxes of block_n / cluster_m rows (each CTA's
        // share of a pair along M; validated).
        let tmap_a = launch.map(ao.tmap(tile.a_box_rows(cl.n))?)?;
        let tmap_b = launch.map(bo.tmap(b_box_rows(tile, cl).unwrap_or(BLOCK_N))?)?;
        // Swapped tiles hold Cᵀ fragments: stored directly; so do the finishing warps of a fused
        // epilogue, and a quantized output is codes (the consumers' 16-bit stores of a fused
        // epilogue in registers go through the map, as the dense kernel's).
        let quantized = epi.as_ref().is_some_and(|f| f.quant.is_some());
        let tmap_c = if tile.is_swapped() || mode == Mode::Fused || quantized {
            0
        } else {
            match out_prepared.get::<Sm90Output>() {
                Some(o) => launch.opt_map(o.tmap(out_box_n(tile.block_n))?)?,
                None => 0,
            }
        };
        let out_ptr = launch.ptr_mut(out);
        let params = Sm90Fp8Params {
            tmap_a,
            tmap_b,
            tmap_c,
            tmap_sfa: launch.map(sfa_map)?,
            sfb: match &b_role.sfb {
                Sfb::Own(s) => launch.ptr(s),
                // (The caller's memory by address: ordered by the stream alone.)
                Sfb::Caller(p) => *p,
            },
            sfb_col: launch.opt_ptr(b_role.sfb_col.as_ref()),
            out: out_ptr,
            splitk: run.splitk,
            m: m as u32,
            n: n as u32,
            k: k as u32,
            l: l as u32,
            out_type: *dtype as u32,
            group_m: cfg.group_m,
            split_k: cfg.split_k,
            cluster_m: cl.m,
            cluster_n: cl.n,
            _pad: 0,
            groups: run.groups,
            sparse: SparseParams::default(),
        };
        // (The fused kernel stages its rows in shared memory, `Tile::fused_layout`: no scratch.)
        let epi = Fused::params(epi, &mut launch, out_ptr, None);
        // SAFETY: `cfg` was validated for this shape (tile, cluster, band, split and the 32-bit
        // indexing; grouped: no split, and `groups` holds `count` int32 values on this GPU); the tensor maps cover the live data buffers of the prepared operands, the
        // scale buffers have the documented sizes (A scales padded to whole clusters), the output
        // holds l·m·n elements of `out_type`, `run.splitk` is sized for the schedule, and the grid is
        // a whole number of clusters; the kernel is the fused one exactly when `epi` is set,
        // whose buffers `Epilogue::check` and the output check sized for the product.
        let _gemm = unsafe { launch.launch_fused(params, epi) }?;
        Ok(())
    }
}

/// The operands' prepared data ([`Error::Format`] when they cannot take the A and B roles).
fn operands<'a>(
    a: &'a DeviceMatrix,
    b: &'a DeviceMatrix,
    stream: &Arc<CudaStream>,
    kernels: &Preparers,
) -> Result<(&'a Sm90Operand, &'a Sm90Operand)> {
    if let Some(e) = unsupported(&a.desc, false).or_else(|| unsupported(&b.desc, true)) {
        return Err(Error::Format(e));
    }
    let ao = Sm90Operand::as_a(a, stream, kernels)?;
    Ok((ao, Sm90Operand::as_b(b, stream, kernels)?))
}
