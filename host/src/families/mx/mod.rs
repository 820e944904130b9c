//! Host side of the Hopper MX / NVFP4 kernel (`kernels::sm90_mx`): which operand pairs it takes,
//! its configuration and the rules that configuration obeys, the tensor maps and kernel-layout
//! scale bytes made once per uploaded matrix, and the launch (with the split-K reduction after it).

use crate::buffers::DeviceOutput;
use crate::error::{Error, Result, config};
pub(crate) use crate::families::operands::mx::{scale_format, unsupported};
use crate::families::operands::{CopyKind, MxOperand};
use crate::families::persistent::{self, Loader, persistent_ctas};
use crate::families::{Families, Family, FusedNeeds, Gemm, PlanConfig, Sizing};
use crate::fused::Fused;
use crate::grouped::DeviceGroups;
use crate::matrix::{GemmShape, MatrixDesc};
use crate::workspace::WorkspaceSize;
use blockscaled_kernels::gemm::scheduler::{ClusterShape, Schedule};
use blockscaled_kernels::sm90_mx::{self as family, BLOCK_K, BLOCK_M, MxTile, Sm90MxParams};

pub(crate) mod heuristic;

/// Configuration of one launch (chosen by `plan::choose`, or forced through `Gpu::gemm_with`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Sm90MxConfig {
    /// 128 × 256 or 128 × 128 ([`MxTile::ALL`]).
    pub tile: MxTile,
    /// Scheduler band height in 128-row M tiles: 1 to the number of M tiles.
    pub group_m: u32,
    /// Persistent CTAs (≥ 1; at most one per SM is launched).
    pub ctas: u32,
    /// K split into this many ranges of 64-wide K blocks (1 to ⌈K / 64⌉).
    pub split_k: u32,
}

crate::config::config_fields!(Sm90MxConfig {
    tile: MxTile => with_tile,
    group_m: u32 => with_group_m,
    ctas: u32 => with_ctas,
    split_k: u32 => with_split_k,
});

/// The schedule of a GEMM of `shape` with `cfg`: the kernel's own function.
fn dense_schedule(cfg: &Sm90MxConfig, shape: GemmShape, groups: Option<&DeviceGroups>) -> Schedule {
    let groups = DeviceGroups::unplaced_or_dense(groups);
    cfg.tile
        .schedule(shape.dims(), (cfg.split_k, cfg.group_m), groups)
}

/// Why the pair cannot go through the sm90 MX kernel (`None`: it can).
pub(crate) fn unsupported_pair(a: &MatrixDesc, b: &MatrixDesc) -> Option<String> {
    if let Some(e) = unsupported(a).or_else(|| unsupported(b)) {
        return Some(e);
    }
    let (sa, sb) = (scale_format(a), scale_format(b));
    if sa != sb || family_kernel(MxTile::N256, a, b, false).is_none() {
        return Some(format!(
            "{} · {}: the sm90 MX kernel takes FP8 pairs with e8m0 / 32 scales and e2m1 pairs \
             with the same scales on both sides",
            a.format, b.format
        ));
    }
    None
}

fn family_kernel(
    tile: MxTile,
    a: &MatrixDesc,
    b: &MatrixDesc,
    fused: bool,
) -> Option<&'static family::Sm90MxKernel> {
    family::kernel(tile, a.format.elem, b.format.elem, scale_format(a)?, fused)
}

/// One loaded kernel (its row of the family's kernel list).
type Kernel = persistent::Kernel<family::Sm90MxKernel>;

/// The sm90 MX family on one GPU.
pub(crate) struct Sm90Mx {
    kernels: Vec<Kernel>,
    sm_count: u32,
}

impl Family for Sm90Mx {
    fn operand_copy(&self) -> Option<CopyKind> {
        Some(CopyKind::of::<MxOperand>())
    }
}

impl PlanConfig for Sm90MxConfig {
    /// Checks every field against the kernel and `s` ([`Error::Config`]) and the shape against
    /// the kernel's 32-bit indexing ([`Error::Shape`]). The launch trusts what passes.
    fn validate(&self, s: &GemmShape) -> Result<()> {
        let n = self.tile.block_n;
        if !MxTile::ALL.contains(&self.tile) {
            let tiles = "128 × 256 and 128 × 128";
            return Err(config(format!(
                "tile 128 × {n}: the sm90 MX kernel has {tiles}"
            )));
        }
        let tiles = (s.m.div_ceil(BLOCK_M as usize), s.n.div_ceil(n as usize));
        let knobs = (self.group_m, self.ctas, self.split_k);
        persistent::validate_schedule(s, tiles, BLOCK_K, knobs)
    }

    fn unsupported(&self, a: &MatrixDesc, b: &MatrixDesc) -> Option<String> {
        unsupported_pair(a, b)
    }

    fn grouped_split(&self) -> Option<u32> {
        Some(self.split_k)
    }

    fn workspace(&self, q: &Sizing<'_>) -> Result<WorkspaceSize> {
        let mx = q.families.require::<Sm90Mx>(NEEDS_SM90)?;
        mx.workspace(self, q.shape, q.groups, q.fused)
    }

    fn fused_columns(&self) -> Result<u32> {
        Ok(self.tile.block_n)
    }

    fn has_fused_kernel(&self, _needs: &FusedNeeds) -> bool {
        family::KERNELS
            .iter()
            .any(|k| k.fused && k.tile == self.tile)
    }

    fn launch(&self, families: &Families, g: Gemm<'_, '_>) -> Result<()> {
        families.require::<Sm90Mx>(NEEDS_SM90)?.gemm(g, *self)
    }
}

/// What [`Families::require`] says of the MX family where the GPU's module has none.
const NEEDS_SM90: &str = "sm90 MX kernel (it needs compute capability 9.0)";

impl Sm90Mx {
    /// Loads the kernels when the module built for `target` has them.
    pub(crate) fn load(cx: &Loader) -> Result<Option<Self>> {
        let sm_count = cx.sm_count;
        Ok(cx
            .kernels(family::KERNELS, false)?
            .map(|kernels| Sm90Mx { kernels, sm_count }))
    }

    /// The persistent CTAs of a launch of `schedule`: one per SM at most (the stages fill its
    /// shared memory).
    fn ctas(&self, cfg: &Sm90MxConfig, schedule: Schedule) -> Result<u32> {
        persistent_ctas(schedule, cfg.ctas, self.sm_count, 1)
    }

    /// The workspace a GEMM of `shape` with `cfg` takes: split K's buffers, and with a fused
    /// epilogue (`fused`) the rows it stages.
    pub(crate) fn workspace(
        &self,
        cfg: &Sm90MxConfig,
        shape: GemmShape,
        groups: Option<&DeviceGroups>,
        fused: bool,
    ) -> Result<WorkspaceSize> {
        let schedule = dense_schedule(cfg, shape, groups);
        let consumers = blockscaled_kernels::sm90_mx::CONSUMERS;
        let staging = match fused {
            true => Fused::staging_bytes((self.ctas(cfg, schedule)?, consumers, cfg.tile.block_n)),
            false => 0,
        };
        Ok(WorkspaceSize {
            staging: usize::try_from(staging)
                .map_err(|_| crate::error::shape("the staging overflows"))?,
            ..WorkspaceSize::split_k(&schedule, ClusterShape::ONE, cfg.split_k > 1)?
        })
    }

    /// C = A · Bᵀ with `cfg` (validated for `g.shape`): one launch, split K included.
    pub(crate) fn gemm(&self, g: Gemm<'_, '_>, cfg: Sm90MxConfig) -> Result<()> {
        let (stream, work, shape, groups) = (g.stream, g.work, g.shape, g.groups);
        let (a, b, c, epi) = (g.a, g.b, g.c, g.epi);
        let GemmShape { m, n, k, l } = shape;
        let def = family_kernel(cfg.tile, &a.desc, &b.desc, epi.is_some());
        let kernel = persistent::find(&self.kernels, def, || {
            config(format!(
                "no sm90 MX {}kernel for {:?} (fused: the 256-column tile)",
                if epi.is_some() { "fused-epilogue " } else { "" },
                cfg.tile
            ))
        })?;
        let (Some(ao), Some(bo)) = (a.prepared.get::<MxOperand>(), b.prepared.get::<MxOperand>())
        else {
            return Err(Error::Format(
                "operands were not prepared for the sm90 MX kernel".into(),
            ));
        };
        let tile = cfg.tile;
        let mut slot = work.splitk.slot(cfg.split_k);
        let DeviceOutput {
            buf: out, dtype, ..
        } = c;
        let schedule = dense_schedule(&cfg, shape, groups);
        let mut staging = crate::alloc::lock(&work.staging);
        let grid = (cfg.ctas, ClusterShape::ONE);
        let (mut launch, run) =
            kernel.persistent(stream, &schedule, grid, groups, slot.as_mut())?;
        // The MX kernel has no output staging: a fused epilogue stages its rows in global memory.
        let geometry = (
            run.ctas,
            blockscaled_kernels::sm90_mx::CONSUMERS,
            tile.block_n,
        );
        let scratch = Fused::scratch(&epi, stream, geometry, &mut staging)?;
        let out_ptr = launch.ptr_mut(out);
        let params = Sm90MxParams {
            tmap_a: launch.map(ao.tmap(BLOCK_M)?)?,
            tmap_b: launch.map(bo.tmap(tile.block_n)?)?,
            tmap_sfa: {
                launch.ptr(&ao.scales);
                launch.map(ao.scale_map()?)?
            },
            sfb: launch.ptr(&bo.scales),
            out: out_ptr,
            splitk: run.splitk,
            m: m as u32,
            n: n as u32,
            k: k as u32,
            l: l as u32,
            rows_pad_a: ao.rows_pad,
            rows_pad_b: bo.rows_pad,
            out_type: *dtype as u32,
            group_m: cfg.group_m,
            split_k: cfg.split_k,
            alpha: a.desc.tensor_scale * b.desc.tensor_scale,
            groups: run.groups,
        };
        let epi = Fused::params(epi, &mut launch, out_ptr, scratch);
        // SAFETY: `cfg` was validated for this shape (grouped: no split, `groups` holds `count`
        // int32 values on this GPU); the tensor maps cover the live data of the
        // prepared operands with boxes of the tile's rows; the scale buffers hold
        // l·⌈k/64⌉·rows_pad·(64/block) bytes with rows_pad a multiple of 256 ≥ every tile's rows;
        // the output holds l·m·n elements of `out_type` (and `run.splitk` is sized for the schedule);
        // the kernel is the fused one exactly when `epi` is set (its scratch sized for the grid).
        let _gemm = unsafe { launch.launch_fused(params, epi) }?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::test_util::{broken_knobs, desc, takes_mx_pairs_only};
    use crate::format::Recipe;

    #[test]
    fn every_mx_and_nvfp4_recipe_runs_on_the_kernel_and_fp32_scaled_fp8_does_not() {
        use crate::format::Fp8;
        takes_mx_pairs_only(unsupported_pair);
        // Mixed widths, mixed scale formats, and e2m1 rows that are not 16-byte multiples.
        let (fp8, fp4) = (
            desc(Recipe::Mxfp8(Fp8::E4M3), 64, 256, false),
            desc(Recipe::Mxfp4, 64, 256, true),
        );
        assert!(unsupported_pair(&fp8, &fp4).is_some());
        let nv = desc(Recipe::Nvfp4, 64, 256, true);
        assert!(unsupported_pair(&desc(Recipe::Mxfp4, 64, 256, false), &nv).is_some());
        let odd = desc(Recipe::Nvfp4, 64, 272, false);
        assert!(unsupported(&odd).is_some());
    }

    #[test]
    fn configurations_the_kernel_lacks_are_config_errors() {
        let s = GemmShape {
            m: 256,
            n: 256,
            k: 256,
            l: 1,
        };
        let ok = Sm90MxConfig {
            tile: MxTile::N256,
            group_m: 2,
            ctas: 132,
            split_k: 4,
        };
        assert!(ok.validate(&s).is_ok());
        let narrow = Sm90MxConfig {
            tile: MxTile { block_n: 64 },
            ..ok
        };
        // 256 rows are 2 units of 128; K = 256 is 4 stages of 64.
        for bad in [narrow]
            .into_iter()
            .chain(broken_knobs!(ok, bands: 2, stages: 4))
        {
            assert!(matches!(bad.validate(&s), Err(Error::Config(_))), "{bad:?}");
        }
    }
}
