//! Host side of the Hopper MX / NVFP4 kernel (`kernels::sm90_mx`): which operand pairs it takes,
//! its configuration and the rules that configuration obeys, the tensor maps and kernel-layout
//! scale bytes made once per uploaded matrix, and the launch (with the split-K reduction after it).

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr};

use crate::buffers::{DeviceMatrix, DeviceOutput, Mem, OnFirstUse, Prepared, PreparedValue};
use crate::error::{Error, Result, config, shape};
use crate::family::{Family, Gemm, Rewritten};
use crate::format::{ElemType, ScaleBlock, ScaleType};
use crate::fused::Fused;
use crate::grouped::DeviceGroups;
use crate::launch::{Launch, persistent_ctas};
use crate::matrix::{GemmShape, MatrixDesc};
use crate::prepare::{GatherTo, Preparers, Source};
use crate::splitk::{self, SplitK};
use crate::tensor_map::{DataType, Swizzle, encode_3d, encode_scale_rows};
use crate::workspace::WorkspaceSize;
use blockscaled_kernels::gemm::scheduler::{ClusterShape, Schedule};
use blockscaled_kernels::sm90_mx::{
    self as family, BLOCK_K, BLOCK_M, MxScale, MxTile, SCALE_ROWS_PAD, Sm90MxParams,
};

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
        validate_schedule(s, m_tiles, n_tiles, group_m, ctas, split_k)
    }
}

/// The rules every persistent Hopper launch of 64-wide K blocks obeys, for `m_tiles` × `n_tiles`
/// tiles banded `group_m` at a time: at least one CTA, TMA's 32-bit coordinates, a split of the K
/// blocks, the scheduler's 32-bit unit count, and the split-K workspace's size.
pub(crate) fn validate_schedule(
    s: &GemmShape,
    m_tiles: usize,
    n_tiles: usize,
    group_m: u32,
    ctas: u32,
    split_k: u32,
) -> Result<()> {
    if ctas == 0 {
        return Err(config("ctas = 0: a launch needs at least one CTA"));
    }
    if s.m > i32::MAX as usize || s.n > i32::MAX as usize || s.k > i32::MAX as usize {
        return Err(shape("M, N and K must fit TMA's 32-bit coordinates"));
    }
    let k_blocks = s.k.div_ceil(BLOCK_K as usize);
    splitk::check_split(split_k, k_blocks, BLOCK_K, s.k)?;
    if !(1..=m_tiles).contains(&(group_m as usize)) {
        return Err(config(format!(
            "group_m = {group_m}: there are {m_tiles} tiles to band"
        )));
    }
    let units = [n_tiles, s.l, split_k as usize]
        .iter()
        .try_fold(m_tiles, |acc, &x| acc.checked_mul(x));
    if units.is_none_or(|u| u > u32::MAX as usize) {
        return Err(shape(format!(
            "{m_tiles} × {n_tiles} tiles × L = {} × split {split_k}: the scheduler counts at              most 2³² − 1",
            s.l
        )));
    }
    splitk::validate(s, split_k)
}

/// The schedule of a GEMM of `shape` with `cfg` (the kernel's: units of a tile).
fn dense_schedule(cfg: &Sm90MxConfig, shape: GemmShape, groups: Option<&DeviceGroups>) -> Schedule {
    let GemmShape { m, n, k, l } = shape;
    let units = (BLOCK_M, cfg.tile.block_n);
    let k_blocks = k.div_ceil(BLOCK_K as usize);
    let groups = groups.map(|g| g.schedule(m, false));
    crate::launch::schedule(
        (m, n, l),
        k_blocks,
        units,
        (cfg.split_k, cfg.group_m),
        groups,
    )
}

/// The scale format of an operand the kernel takes (`None`: none of its kernels does).
pub(crate) fn scale_format(d: &MatrixDesc) -> Option<MxScale> {
    let f = &d.format;
    let ScaleBlock::Tile { rows: 1, k } = f.block else {
        return None;
    };
    [MxScale::E8M0X32, MxScale::E8M0X16, MxScale::UE4M3X16]
        .into_iter()
        .find(|s| s.ty == f.scale && s.block == k)
}

/// Why an operand cannot go through the sm90 MX kernel (`None`: it can, in either role).
pub(crate) fn unsupported(d: &MatrixDesc) -> Option<String> {
    let f = &d.format;
    if !matches!(f.elem, ElemType::E4M3 | ElemType::E5M2 | ElemType::E2M1)
        || !matches!(f.scale, ScaleType::E8M0 | ScaleType::UE4M3)
    {
        return Some(format!(
            "{f}: the sm90 MX kernel takes e4m3, e5m2 or e2m1 with e8m0 or ue4m3 scales"
        ));
    }
    let Some(scale) = scale_format(d) else {
        return Some(format!(
            "{f}: the sm90 MX kernel takes scales per 1×32 (e8m0) or per 1×16 (e8m0, ue4m3)"
        ));
    };
    if !d.k.is_multiple_of(scale.block as usize) {
        return Some(format!(
            "K = {} is not a multiple of the scale block {}",
            d.k, scale.block
        ));
    }
    // TMA row strides are multiples of 16 bytes.
    if !(d.k * f.elem.bits() as usize / 8).is_multiple_of(16) {
        return Some(format!(
            "{f}: a row of K = {} is not a multiple of 16 bytes (TMA), so K must be a multiple of {}",
            d.k,
            128 / f.elem.bits()
        ));
    }
    None
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

/// The scale bytes of `m` in the kernel layout `[l][⌈k/64⌉][rows_pad][64 / block]` (zero past
/// the rows and past K), and `rows_pad`.
pub(crate) fn kernel_scales(
    stream: &Arc<CudaStream>,
    m: &Source<'_>,
    scale: MxScale,
) -> Result<(CudaSlice<u8>, usize)> {
    let (to, rows_pad) = kernel_scales_to(m.desc(), scale);
    Ok((m.gather(stream, to)?, rows_pad))
}

/// [`kernel_scales`]' re-layout, and `rows_pad`.
pub(crate) fn kernel_scales_to(d: &MatrixDesc, scale: MxScale) -> (GatherTo, usize) {
    let rows_pad = d.rows.next_multiple_of(SCALE_ROWS_PAD as usize);
    let to = GatherTo {
        planes: d.k.div_ceil(BLOCK_K as usize),
        rows_out: rows_pad,
        per: (BLOCK_K / scale.block) as usize,
        row_step: 1,
        k_step: scale.block as usize,
        values: false,
    };
    (to, rows_pad)
}

/// What the kernel needs of one uploaded matrix, made at upload time.
pub(crate) struct MxOperand {
    /// CUtensorMaps (3-D: K bytes, rows, L; boxes of one stage's row bytes × 128 and × 256 rows;
    /// no swizzle) in device memory.
    tmap_128: CudaSlice<u8>,
    tmap_256: CudaSlice<u8>,
    /// Scale bytes `[l][⌈k/64⌉][rows_pad][64 / block]`, zero past the rows and past K.
    scales: CudaSlice<u8>,
    rows_pad: u32,
    /// The scales' tensor map for the A role (entries of one row's `64 / block` bytes, boxes of
    /// `family::sfa_box` rows): a tile may start at any row (grouped GEMM).
    scale_map: CudaSlice<u8>,
    /// Each row's largest non-NaN scale code over all of K, `[l][rows_pad]` (the fold
    /// pre-pass's B-role scale): made when the matrix is first folded as B, as only weights are
    /// (activations quantized every step never pay for it).
    row_tops: OnFirstUse<CudaSlice<u8>>,
}

impl MxOperand {
    fn prepare(stream: &Arc<CudaStream>, m: &Source<'_>, data: &Mem<'_>) -> Result<Option<Self>> {
        let d = m.desc();
        if unsupported(d).is_some() {
            return Ok(None);
        }
        let scale = scale_format(d).expect("checked by `unsupported`");
        let (scales, rows_pad) = kernel_scales(stream, m, scale)?;
        let (rows, k, l) = (d.rows, d.k, d.batch);
        let (ptr, _g) = data.device_ptr(stream);
        let row_bytes = k * d.format.elem.bits() as usize / 8;
        let stage_bytes = BLOCK_K * d.format.elem.bits() / 8;
        let map = |box_rows: u32| {
            encode_3d(
                stream,
                ptr,
                DataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
                [row_bytes, rows, l],
                1,
                [stage_bytes, box_rows],
                Swizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
            )
        };
        let scale_map = {
            let (sp, _g) = scales.device_ptr(stream);
            let entry = (BLOCK_K / scale.block) as usize;
            let dims = (rows_pad, k.div_ceil(BLOCK_K as usize), l);
            encode_scale_rows(stream, sp, entry, dims, family::sfa_box(scale.block).rows())?
        };
        Ok(Some(MxOperand {
            tmap_128: map(128)?,
            tmap_256: map(256)?,
            scales,
            rows_pad: rows_pad as u32,
            scale_map,
            row_tops: OnFirstUse::default(),
        }))
    }

    /// Its copies for `m`, rewritten in place: the scale layout made again in the same buffer
    /// where the writer did not write it (`scales_written`), the row maxima at their next use.
    fn refresh(
        &mut self,
        stream: &Arc<CudaStream>,
        m: &Source<'_>,
        scales_written: bool,
    ) -> Result<()> {
        if !scales_written {
            let scale = scale_format(m.desc()).expect("prepared, so supported");
            m.gather_into(
                stream,
                kernel_scales_to(m.desc(), scale).0,
                &mut self.scales,
            )?;
        }
        self.row_tops.forget();
        Ok(())
    }

    /// The kernel-layout scale buffer of `prepared`'s operand, for a family whose kernels read
    /// the same layout (the 4-bit-weights family) rather than keeping a copy of their own.
    pub(crate) fn layout_scales(prepared: &Prepared) -> Option<&CudaSlice<u8>> {
        Some(&prepared.get::<MxOperand>()?.scales)
    }

    /// The kernel-layout scale buffer of `prepared`'s operand and its `rows_pad`, for a writer
    /// that rewrites it in place ([`Rewritten::mx_scales`]).
    pub(crate) fn layout_scales_mut(prepared: &mut Prepared) -> Option<(&mut CudaSlice<u8>, u32)> {
        let op = prepared.get_mut::<MxOperand>()?;
        Some((&mut op.scales, op.rows_pad))
    }

    /// The scale bytes of `m` in the kernel layout and their `rows_pad`, when `m` was prepared
    /// for this family (for the fold pre-pass).
    pub(crate) fn scales_of<'m>(m: &'m DeviceMatrix<'_>) -> Option<(&'m CudaSlice<u8>, u32)> {
        let op = m.prepared.get::<MxOperand>()?;
        Some((&op.scales, op.rows_pad))
    }

    /// Each row's largest scale code of `m` (prepared for this family) over all of K, made by
    /// `kernels` on `stream` at the first call after the matrix was made or rewritten (the fold
    /// pre-pass's B role).
    pub(crate) fn row_tops_of<'m>(
        m: &'m DeviceMatrix,
        stream: &Arc<CudaStream>,
        kernels: &Preparers,
    ) -> Option<Result<&'m CudaSlice<u8>>> {
        let op = m.prepared.get::<MxOperand>()?;
        Some(
            op.row_tops
                .get_or_make(|| kernels.row_tops(stream, m, op.rows_pad as usize)),
        )
    }

    fn tmap(&self, box_rows: u32) -> &CudaSlice<u8> {
        if box_rows == 256 {
            &self.tmap_256
        } else {
            &self.tmap_128
        }
    }
}

/// One loaded kernel.
struct Kernel {
    def: &'static family::Sm90MxKernel,
    func: CudaFunction,
}

/// The sm90 MX family on one GPU.
pub(crate) struct Sm90Mx {
    kernels: Vec<Kernel>,
    sm_count: u32,
}

impl Family for Sm90Mx {
    fn prepare_operand(
        &self,
        stream: &Arc<CudaStream>,
        matrix: &Source<'_>,
        data: &Mem<'_>,
        _made: &Prepared,
    ) -> Result<Option<PreparedValue>> {
        Ok(MxOperand::prepare(stream, matrix, data)?.map(|p| Box::new(p) as PreparedValue))
    }

    fn refresh_operand(
        &self,
        stream: &Arc<CudaStream>,
        matrix: &Source<'_>,
        prepared: &mut Prepared,
        written: Rewritten,
    ) -> Result<bool> {
        if let Some(op) = prepared.get_mut::<MxOperand>() {
            op.refresh(stream, matrix, written.mx_scales)?;
        }
        Ok(true)
    }
}

impl Sm90Mx {
    /// Loads the kernels when the module built for `target` has them.
    pub(crate) fn load(
        module: &Arc<CudaModule>,
        target: &str,
        sm_count: u32,
    ) -> Result<Option<Self>> {
        if !family::KERNELS[0].info.targets.contains(&target) {
            return Ok(None);
        }
        let mut kernels = Vec::new();
        for def in family::KERNELS {
            let func = crate::launch::load_kernel(module, def.info.name, def.layout().bytes())?;
            kernels.push(Kernel { def, func });
        }
        Ok(Some(Sm90Mx { kernels, sm_count }))
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
            ..splitk::bytes(&schedule, ClusterShape::ONE, cfg.split_k > 1)?
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
        let kernel = self
            .kernels
            .iter()
            .find(|kr| Some(kr.def) == def)
            .ok_or_else(|| {
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
        let ctas = self.ctas(&cfg, schedule)?;
        let smem = kernel.def.layout().bytes();
        // The MX kernel has no output staging: a fused epilogue stages its rows in global memory.
        let geometry = (ctas, blockscaled_kernels::sm90_mx::CONSUMERS, tile.block_n);
        let mut staging = crate::workspace::lock(&work.staging);
        let scratch = Fused::scratch(&epi, stream, geometry, &mut staging)?;
        let mut launch = Launch::persistent(stream, &kernel.func, ctas, tile.threads(), smem, 1);
        let group_params = DeviceGroups::params(groups, &mut launch);
        let splitk = SplitK::params(
            &mut launch,
            slot.as_mut(),
            stream,
            &schedule,
            ClusterShape::ONE,
        )?;
        let out_ptr = launch.ptr_mut(out);
        let params = Sm90MxParams {
            tmap_a: launch.ptr(ao.tmap(BLOCK_M)),
            tmap_b: launch.ptr(bo.tmap(tile.block_n)),
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

crate::buffers::held!(MxOperand: tmap_128, tmap_256, scales, scale_map, row_tops);

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
