//! Host side of the Hopper MX / NVFP4 kernel (`kernels::sm90_mx`): which operand pairs it takes,
//! its configuration and the rules that configuration obeys, the tensor maps and kernel-layout
//! scale bytes made once per uploaded matrix, and the launch (with the split-K reduction after it).

use crate::buffers::DeviceOutput;
use crate::error::{Error, Result, config};
pub(crate) use crate::families::operands::mx::{scale_format, unsupported};
use crate::families::operands::{CopyKind, MxOperand};
use crate::families::persistent::{self, Loader, Persistent, persistent_ctas};
use crate::families::{Family, Gemm};
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

impl Sm90MxConfig {
    /// Checks every field against the kernel and `s` ([`Error::Config`]) and the shape against
    /// the kernel's 32-bit indexing ([`Error::Shape`]). The launch trusts what passes.
    pub fn validate(&self, s: &GemmShape) -> Result<()> {
        let Sm90MxConfig {
            tile,
            group_m,
            ctas,
            split_k,
        } = *self;
        if !MxTile::ALL.contains(&tile) {
            return Err(config(format!(
                "tile 128 × {}: the sm90 MX kernel has 128 × 256 and 128 × 128",
                tile.block_n
            )));
        }
        let m_tiles = s.m.div_ceil(BLOCK_M as usize);
        let n_tiles = s.n.div_ceil(tile.block_n as usize);
        persistent::validate_schedule(s, (m_tiles, n_tiles), BLOCK_K, (group_m, ctas, split_k))
    }
}

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
        let Gemm {
            stream,
            work,
            shape,
            a,
            b,
            c,
            groups,
            epi,
        } = g;
        let GemmShape { m, n, k, l } = shape;
        if let Some(e) = unsupported_pair(&a.desc, &b.desc) {
            return Err(Error::Format(e));
        }
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
        let Persistent {
            mut launch,
            ctas,
            groups: group_params,
            splitk,
        } = kernel.persistent(
            stream,
            &schedule,
            (cfg.ctas, ClusterShape::ONE),
            groups,
            slot.as_mut(),
        )?;
        // The MX kernel has no output staging: a fused epilogue stages its rows in global memory.
        let geometry = (ctas, blockscaled_kernels::sm90_mx::CONSUMERS, tile.block_n);
        let scratch = Fused::scratch(&epi, stream, geometry, &mut staging)?;
        let out_ptr = launch.ptr_mut(out);
        let params = Sm90MxParams {
            tmap_a: launch.ptr(ao.tmap(BLOCK_M)?),
            tmap_b: launch.ptr(bo.tmap(tile.block_n)?),
            tmap_sfa: launch.ptr(&ao.scale_map),
            sfb: launch.ptr(&bo.scales),
            out: out_ptr,
            splitk,
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
            groups: group_params,
        };
        let epi = Fused::params(epi, &mut launch, out_ptr, scratch);
        // SAFETY: `cfg` was validated for this shape (grouped: no split, `groups` holds `count`
        // int32 values on this GPU); the tensor maps cover the live data of the
        // prepared operands with boxes of the tile's rows; the scale buffers hold
        // l·⌈k/64⌉·rows_pad·(64/block) bytes with rows_pad a multiple of 256 ≥ every tile's rows;
        // the output holds l·m·n elements of `out_type` (and `splitk` is sized for the schedule);
        // the kernel is the fused one exactly when `epi` is set (its scratch sized for the grid).
        let _gemm = unsafe { launch.launch_fused(params, epi) }?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Recipe;

    fn desc(recipe: Recipe, rows: usize, k: usize, b: bool) -> MatrixDesc {
        MatrixDesc::of_recipe(recipe, rows, k, b)
    }

    #[test]
    fn every_mx_and_nvfp4_recipe_runs_on_the_kernel_and_fp32_scaled_fp8_does_not() {
        use crate::format::Fp8;
        for r in [
            Recipe::Mxfp8(Fp8::E4M3),
            Recipe::Mxfp8(Fp8::E5M2),
            Recipe::Mxfp4,
            Recipe::Nvfp4,
            Recipe::E2m1E8m0x16,
        ] {
            let (a, b) = (desc(r, 100, 256, false), desc(r, 70, 256, true));
            assert_eq!(unsupported_pair(&a, &b), None, "{r}");
        }
        let ds = Recipe::DeepSeekFp8;
        assert!(unsupported_pair(&desc(ds, 64, 256, false), &desc(ds, 64, 256, true)).is_some());
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
        for bad in [
            Sm90MxConfig {
                tile: MxTile { block_n: 64 },
                ..ok
            },
            Sm90MxConfig { group_m: 0, ..ok },
            Sm90MxConfig { group_m: 3, ..ok },
            Sm90MxConfig { ctas: 0, ..ok },
            Sm90MxConfig { split_k: 0, ..ok },
            Sm90MxConfig { split_k: 5, ..ok },
        ] {
            assert!(matches!(bad.validate(&s), Err(Error::Config(_))), "{bad:?}");
        }
    }
}
