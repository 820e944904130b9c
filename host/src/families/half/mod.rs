//! The sm90 16-bit family's host side (`blockscaled_kernels::sm90_half`): bf16 operands (one
//! fp32 scale per tensor, multiplied into the output as `alpha`), dense GEMM and block-sparse
//! GEMM with bf16 blocks of 64 × 64 or 128 × 128.

use std::sync::Arc;

pub(crate) mod heuristic;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use crate::bsr::{BsrMatrix, SparseSchedule, SparseSide};
use crate::buffers::DeviceOutput;
use crate::error::{Error, Result, config, shape};
use crate::families::operands::{CopyKind, OperandCopy, Rewrite, Sm90Output, Upload};
use crate::families::persistent::{self, Loader};
use crate::families::{
    BsrOperands, Families, Family, FusedNeeds, Gemm, Made, PlanConfig, Sizing, SparseGemm,
    StoredBlocks,
};
use crate::format::{ElemType, ScaleBlock, ScaleType};
use crate::fused::Fused;
use crate::launch::Launch;
use crate::matrix::{GemmShape, MatrixDesc};
use crate::splitk;
use crate::tensor_map::{BoxMaps, DataType, MapLayout, Swizzle};
use crate::workspace::WorkspaceSize;
use blockscaled_kernels::gemm::Mode;
use blockscaled_kernels::gemm::layout::out_box_n;
use blockscaled_kernels::gemm::scheduler::{ClusterShape, MAX_CLUSTER, Schedule};
use blockscaled_kernels::params::SparseParams;
use blockscaled_kernels::sm90_half::{
    self as family, BLOCK_K, HalfTile, HalfType, Sm90HalfKernel, Sm90HalfParams,
};

/// A configuration of the sm90 16-bit kernel: the tile, CTAs per cluster along M (1, or 2: a
/// pair sharing the B tile by multicast), the scheduler's band height in units (tile rows × the
/// cluster), the persistent CTAs wanted (at most those resident), and the K split (dense: ranges
/// of K; block-sparse: the most parts a run of stored blocks is cut into).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Sm90HalfConfig {
    /// The tile.
    pub tile: HalfTile,
    /// CTAs per cluster along M (2: a pair shares B by multicast).
    pub cluster_m: u32,
    /// Tile rows banded together in the persistent order (L2 reuse).
    pub group_m: u32,
    /// Persistent CTAs launched.
    pub ctas: u32,
    /// K split into this many ranges (1 to ⌈K / 64⌉).
    pub split_k: u32,
}

crate::config::config_fields!(Sm90HalfConfig {
    tile: HalfTile => with_tile,
    cluster_m: u32 => with_cluster_m,
    group_m: u32 => with_group_m,
    ctas: u32 => with_ctas,
    split_k: u32 => with_split_k,
});

impl Sm90HalfConfig {
    /// `Plan::Sm90Half(self).validate(s)` for a block-sparse GEMM of kernel shape `s` (M the dense
    /// operand's rows, N the sparse operand's) with blocks of `block`: a tile no wider than a
    /// block (a tile's columns share one run of stored blocks), one batch entry, and `split_k`
    /// the most parts a run is cut into (1 to 16, `bsr::MAX_PARTS`).
    pub fn validate_sparse(&self, s: &GemmShape, block: usize) -> Result<()> {
        Sm90HalfConfig {
            split_k: 1,
            ..*self
        }
        .validate(s)?;
        if self.tile.block_n as usize > block {
            return Err(config(format!(
                "tile {} × {}: wider than the sparse operand's {block}-row blocks",
                self.tile.block_m(),
                self.tile.block_n
            )));
        }
        crate::bsr::validate_parts(self.split_k, s)
    }

    /// The cluster shape (pairs along M only).
    pub fn cluster(&self) -> ClusterShape {
        ClusterShape {
            m: self.cluster_m,
            n: 1,
        }
    }

    /// The scheduler's units for shape `s`: (along M, in tiles × the cluster; along N).
    pub fn units(&self, s: &GemmShape) -> (usize, usize) {
        (
            s.m.div_ceil((self.tile.block_m() * self.cluster_m.max(1)) as usize),
            s.n.div_ceil(self.tile.block_n as usize),
        )
    }
}

/// Why `desc` cannot be an operand of the 16-bit kernel, or `None`: bf16 or fp16 with one fp32
/// scale per tensor.
pub(crate) fn unsupported(desc: &MatrixDesc) -> Option<String> {
    let f = &desc.format;
    if !f.elem.is_16bit() || (f.scale, f.block) != (ScaleType::F32, ScaleBlock::PerTensor) {
        return Some(format!(
            "{f}: the sm90 16-bit kernel takes bf16 or fp16 with one fp32 scale per tensor"
        ));
    }
    if !desc.k.is_multiple_of(8) {
        return Some(format!(
            "K = {}: 16-bit operands need K a multiple of 8 (16-byte rows for TMA)",
            desc.k
        ));
    }
    None
}

/// Why A and B cannot be the 16-bit kernel's operands, or `None`: each is one it takes, and both
/// have the same type (`wgmma` multiplies bf16 by bf16 or fp16 by fp16).
pub(crate) fn unsupported_pair(a: &MatrixDesc, b: &MatrixDesc) -> Option<String> {
    unsupported(a).or_else(|| unsupported(b)).or_else(|| {
        (a.format.elem != b.format.elem).then(|| {
            format!(
                "A is {} and B {}: the sm90 16-bit kernel multiplies two operands of one type",
                a.format.elem.name(),
                b.format.elem.name()
            )
        })
    })
}

/// The schedule of a dense GEMM of `shape` with `cfg`: the kernel's own function.
fn dense_schedule(cfg: &Sm90HalfConfig, shape: GemmShape) -> Schedule {
    let split = (cfg.split_k, cfg.group_m);
    cfg.tile
        .schedule(shape.dims(), cfg.cluster().m, split, None)
}

impl PlanConfig for Sm90HalfConfig {
    /// Checks the configuration against a dense GEMM of shape `s`: [`Error::Config`] for a tile
    /// the kernel lacks, a band outside 1..=M tiles, no CTAs or a split outside 1..=K stages;
    /// [`Error::Shape`] for K not a multiple of 8 (TMA's 16-byte rows) or sizes past the
    /// kernel's 32-bit indexing.
    fn validate(&self, s: &GemmShape) -> Result<()> {
        let tiles = HalfTile::ALL
            .map(|t| format!("{} × {}", t.block_m(), t.block_n))
            .join(", ");
        if !HalfTile::ALL.contains(&self.tile) {
            return Err(config(format!(
                "tile {:?}: the sm90 16-bit kernel has tiles of {tiles}",
                self.tile
            )));
        }
        if self.ctas == 0 {
            return Err(config("ctas = 0: a launch needs at least one CTA"));
        }
        if !(1..=MAX_CLUSTER).contains(&self.cluster_m) {
            return Err(config(format!(
                "cluster_m = {}: the sm90 16-bit kernel runs alone or in pairs along M",
                self.cluster_m
            )));
        }
        if !s.k.is_multiple_of(8) {
            return Err(shape(format!(
                "K = {}: 16-bit operands need K a multiple of 8 (16-byte rows for TMA)",
                s.k
            )));
        }
        if s.m > i32::MAX as usize || s.n > i32::MAX as usize || s.k > i32::MAX as usize {
            return Err(shape("M, N and K must fit TMA's 32-bit coordinates"));
        }
        let stages = s.k.div_ceil(BLOCK_K as usize);
        splitk::check_split(self.split_k, stages, BLOCK_K, s.k)?;
        let (m_units, n_units) = self.units(s);
        if !(1..=m_units).contains(&(self.group_m as usize)) {
            return Err(config(format!(
                "group_m = {}: M = {} has {m_units} units of {} rows (tile × cluster) to band",
                self.group_m,
                s.m,
                self.tile.block_m() * self.cluster_m
            )));
        }
        let units = [n_units, s.l, self.split_k as usize]
            .iter()
            .try_fold(m_units, |acc, &x| acc.checked_mul(x));
        if units.is_none_or(|u| u > u32::MAX as usize) {
            return Err(shape(
                "the sm90 16-bit kernel's scheduler counts at most 2³² − 1 tiles",
            ));
        }
        splitk::validate(s, self.split_k)
    }

    /// Split K's buffers (a dense GEMM's: the block-sparse one sizes its own).
    fn workspace(&self, q: &Sizing<'_>) -> Result<WorkspaceSize> {
        let schedule = dense_schedule(self, q.shape);
        WorkspaceSize::split_k(&schedule, self.cluster(), self.split_k > 1)
    }

    fn fused_columns(&self) -> Result<u32> {
        Ok(self.tile.block_n)
    }

    fn has_fused_kernel(&self, _needs: &FusedNeeds) -> bool {
        [HalfType::Bf16, HalfType::F16]
            .into_iter()
            .any(|ty| family::kernel(self.tile, ty, Mode::Fused).is_some())
    }

    fn launch(&self, families: &Families, g: Gemm<'_, '_>) -> Result<()> {
        let what = "sm90 16-bit kernel (it needs compute capability 9.0)";
        families.require::<Sm90Half>(what)?.gemm(g, *self)
    }
}

/// A block-sparse GEMM's schedule with `cfg` and its work list (made once per key on the
/// sparse operand), for a kernel with `resident` CTAs resident at once.
fn bsr_schedule(resident: u32, ops: BsrOperands, cfg: &Sm90HalfConfig) -> Result<SparseSchedule> {
    let (stream, dense, sparse) = (ops.stream, ops.dense, ops.sparse);
    let (tile, cl) = (cfg.tile, cfg.cluster());
    let clusters = (cfg.ctas.min(resident) / cl.m).max(1) as usize;
    let (m, n, k) = (dense.desc.rows, sparse.matrix_rows, dense.desc.k);
    let units = (tile.block_m() * cl.m, tile.block_n);
    let work = crate::bsr::sparse_work(stream, sparse, m, units, (clusters, cfg.split_k))?;
    let dims = (m as u32, n as u32, k as u32, 1);
    let schedule = tile.schedule(dims, cl.m, (1, cfg.group_m), Some(work.sparse()));
    Ok((schedule, work))
}

/// The kernel's input type for an element type.
fn half_type(elem: ElemType) -> Option<HalfType> {
    match elem {
        ElemType::BF16 => Some(HalfType::Bf16),
        ElemType::F16 => Some(HalfType::F16),
        _ => None,
    }
}

/// A dense operand's tensor maps (3-D: K, rows, L; 128-byte swizzle) with boxes of 64 of K by
/// [`BOX_ROWS`] rows, and its one scale (the same for every batch entry).
struct HalfOperand {
    tmaps: BoxMaps,
    scale: f32,
}

/// Box heights of the maps: A boxes of 128 rows; B boxes of a tile's 256, 128 or 64 columns, or
/// of half of them (a pair along M). A sparse operand's boxes are at most a block.
const BOX_ROWS: [u32; 4] = [256, 128, 64, 32];

impl OperandCopy for HalfOperand {
    /// Its maps are over the codes' buffer and its scale is the tensor scale, which a rewrite in
    /// place leaves as they were.
    fn refresh(&mut self, _: &Rewrite<'_>) -> Result<bool> {
        Ok(true)
    }

    fn make(up: &Upload<'_>) -> Result<Option<Self>> {
        let (stream, m, data) = (up.stream, up.matrix, up.data);
        let d = m.desc();
        if unsupported(d).is_some() {
            return Ok(None);
        }
        // (One alpha per launch: batch entries with their own scales take another kernel.)
        let Some(scale) = m.uniform_scale() else {
            return Ok(None);
        };
        let (ptr, _g) = data.device_ptr(stream);
        let layout = half_layout([d.k, d.rows, d.batch]);
        let tmaps = BoxMaps::new(ptr, layout, BOX_ROWS);
        Ok(Some(HalfOperand { tmaps, scale }))
    }
}

/// The maps' layout over 16-bit values of `dims`: boxes of 64 of K, 128-byte swizzle.
fn half_layout(dims: [usize; 3]) -> MapLayout {
    let swizzle = Swizzle::CU_TENSOR_MAP_SWIZZLE_128B;
    (
        DataType::CU_TENSOR_MAP_DATA_TYPE_UINT16,
        dims,
        2,
        BLOCK_K,
        swizzle,
    )
}

/// A block-sparse operand's stored blocks as tensor maps (3-D: K of a block, rows of a block,
/// stored blocks; 128-byte swizzle), boxes of 64 of K by [`BOX_ROWS`] rows (at most a block).
struct HalfSparse {
    tmaps: BoxMaps,
}

impl HalfSparse {
    fn prepare(stream: &Arc<CudaStream>, m: &BsrMatrix, values: &CudaSlice<u8>) -> Result<Self> {
        let (bs, blocks) = (m.block(), m.nnz().max(1));
        let (ptr, _g) = values.device_ptr(stream);
        let rows = BOX_ROWS.into_iter().filter(|&r| r as usize <= bs);
        let tmaps = BoxMaps::new(ptr, half_layout([bs, bs, blocks]), rows);
        // (Encoded now: a driver's refusal surfaces at upload rather than in a call.)
        tmaps.get(32)?;
        Ok(HalfSparse { tmaps })
    }
}

/// A loaded kernel (its row of the family's kernel list).
type Kernel = persistent::Kernel<Sm90HalfKernel>;

/// The family on one GPU.
pub(crate) struct Sm90Half {
    kernels: Vec<Kernel>,
}

impl Family for Sm90Half {
    fn operand_copy(&self) -> Option<CopyKind> {
        Some(CopyKind::of::<HalfOperand>())
    }

    fn prepare_sparse(&self, stream: &Arc<CudaStream>, blocks: StoredBlocks<'_>) -> Made {
        if half_type(blocks.matrix.elem()).is_none() {
            return Ok(None);
        }
        let copy = HalfSparse::prepare(stream, blocks.matrix, blocks.values)?;
        Ok(Some(Box::new(copy)))
    }
}

impl Sm90Half {
    /// Loads the kernels when the module built for `target` has them.
    pub(crate) fn load(cx: &Loader) -> Result<Option<Self>> {
        // One CTA per SM (the tile's shared memory allows no second); pairs as the driver finds
        // room for them.
        Ok(cx
            .kernels(family::KERNELS, true)?
            .map(|kernels| Sm90Half { kernels }))
    }

    fn kernel(&self, tile: HalfTile, ty: HalfType, mode: Mode) -> Result<&Kernel> {
        let def = family::kernel(tile, ty, mode);
        persistent::find(&self.kernels, def, || {
            config(format!(
                "no sm90 16-bit {} {mode:?} kernel for tile {} × {}",
                ty.name(),
                tile.block_m(),
                tile.block_n
            ))
        })
    }

    /// C = alpha · A · Bᵀ with `cfg` (validated for `g.shape`): one launch, split K included.
    pub(crate) fn gemm(&self, g: Gemm<'_, '_>, cfg: Sm90HalfConfig) -> Result<()> {
        g.dense_only("the sm90 16-bit kernel")?;
        let (stream, work, shape) = (g.stream, g.work, g.shape);
        let (a, b, c, epi) = (g.a, g.b, g.c, g.epi);
        let (Some(ao), Some(bo)) = (
            a.prepared.get::<HalfOperand>(),
            b.prepared.get::<HalfOperand>(),
        ) else {
            let why = unsupported_pair(&a.desc, &b.desc);
            return Err(Error::Format(why.unwrap_or_else(|| {
                "operands not prepared for the sm90 16-bit kernel (batch entries with different \
                 scales)"
                    .into()
            })));
        };
        if let Some(why) = unsupported_pair(&a.desc, &b.desc) {
            return Err(Error::Format(why));
        }
        let ty = half_type(a.desc.format.elem).expect("prepared operands are 16-bit");
        let mode = if epi.is_some() {
            Mode::Fused
        } else {
            Mode::Dense
        };
        let kernel = self.kernel(cfg.tile, ty, mode)?;
        let GemmShape { m, n, k, l } = shape;
        let (tile, cl) = (cfg.tile, cfg.cluster());
        let schedule = dense_schedule(&cfg, shape);
        let mut slot = work.splitk.slot(cfg.split_k);
        let (mut launch, run) =
            kernel.persistent(stream, &schedule, (cfg.ctas, cl), None, slot.as_mut())?;
        let (tmap_a, tmap_b) = (
            launch.map(ao.tmaps.get(128)?)?,
            launch.map(bo.tmaps.get(tile.block_n / cl.m)?)?,
        );
        // A fused epilogue stores directly: no output map.
        let staged = epi.is_none();
        let params = output_params(&mut launch, c, tile, staged, (tmap_a, tmap_b, run.splitk))?;
        // (The fused kernels stage their rows in shared memory, `HalfTile::fused_layout`.)
        let epi = Fused::params(epi, &mut launch, params.out, None);
        let params = Sm90HalfParams {
            m: m as u32,
            n: n as u32,
            k: k as u32,
            l: l as u32,
            group_m: cfg.group_m,
            split_k: cfg.split_k,
            alpha: ao.scale * bo.scale,
            cluster_m: cl.m,
            sparse: SparseParams::default(),
            ..params
        };
        // SAFETY: `cfg` was validated for this shape (tile, band, split, 32-bit coordinates);
        // the maps cover the operands' live data (K, rows, L); the output holds l·m·n elements
        // of `out_type` and its map (if any) covers them; `run.splitk` is sized for the schedule;
        // the kernel is the fused one exactly when `epi` is set.
        let _gemm = unsafe { launch.launch_fused(params, epi) }?;
        Ok(())
    }

    /// The workspace of a block-sparse GEMM with `cfg` (split K's buffers where the work list
    /// splits runs of blocks; the sparse operand's work list is made as the launch makes it).
    pub(crate) fn bsr_workspace(
        &self,
        ops: BsrOperands,
        cfg: Sm90HalfConfig,
    ) -> Result<WorkspaceSize> {
        let dense = ops.dense;
        let ty = half_type(dense.desc.format.elem).ok_or_else(|| {
            Error::Format(unsupported(&dense.desc).unwrap_or_else(|| "not 16-bit".into()))
        })?;
        let kernel = self.kernel(cfg.tile, ty, Mode::Sparse)?;
        let cl = cfg.cluster();
        let resident = kernel.resident(cl.m);
        let (schedule, work) = bsr_schedule(resident, ops, &cfg)?;
        WorkspaceSize::split_k(&schedule, cl, work.slots > 0)
    }

    /// The block-sparse GEMM `g` (bf16 or fp16 blocks, C = alpha · A · Bᵀ) with `cfg` validated
    /// for the kernel's shape.
    pub(crate) fn bsr_gemm(&self, g: SparseGemm<'_, '_>, cfg: Sm90HalfConfig) -> Result<()> {
        let (ws, side, c) = (g.work, g.side, g.c);
        let (stream, dense, sparse) = (g.ops.stream, g.ops.dense, g.ops.sparse);
        let (Some(ao), Some(bo)) = (
            dense.prepared.get::<HalfOperand>(),
            sparse.prepared.get::<HalfSparse>(),
        ) else {
            let why = unsupported(&dense.desc);
            return Err(Error::Format(why.unwrap_or_else(|| {
                "operands not prepared for the sm90 16-bit block-sparse kernel".into()
            })));
        };
        let (ty, ts) = (
            half_type(dense.desc.format.elem).expect("prepared operands are 16-bit"),
            half_type(sparse.elem),
        );
        if Some(ty) != ts {
            return Err(Error::Format(format!(
                "dense {} and sparse {} operands: a 16-bit block-sparse GEMM takes one type",
                dense.desc.format.elem.name(),
                sparse.elem.name()
            )));
        }
        let kernel = self.kernel(cfg.tile, ty, Mode::Sparse)?;
        let (tile, cl) = (cfg.tile, cfg.cluster());
        let (m, n, k) = (dense.desc.rows, sparse.matrix_rows, dense.desc.k);
        let resident = kernel.resident(cl.m);
        let (schedule, work) = bsr_schedule(resident, g.ops, &cfg)?;
        let mut slot = ws.splitk.slot(if work.slots > 0 { 2 } else { 1 });
        let (mut launch, run) =
            kernel.persistent(stream, &schedule, (cfg.ctas, cl), None, slot.as_mut())?;
        let (tmap_a, tmap_b) = (
            launch.map(ao.tmaps.get(128)?)?,
            launch.map(bo.tmaps.get(tile.block_n / cl.m)?)?,
        );
        // With A sparse the tile is Cᵀ: stored directly.
        let params = output_params(
            &mut launch,
            c,
            tile,
            side == SparseSide::B,
            (tmap_a, tmap_b, run.splitk),
        )?;
        let params = Sm90HalfParams {
            m: m as u32,
            n: n as u32,
            k: k as u32,
            l: 1,
            group_m: cfg.group_m,
            split_k: 1,
            alpha: ao.scale,
            cluster_m: cl.m,
            sparse: work.params(
                &mut launch,
                sparse,
                side,
                sparse.stages_per_block().trailing_zeros(),
            ),
            ..params
        };
        // SAFETY: `cfg` was validated for the kernel's shape (`validate_sparse`: a tile no wider
        // than a block, 32-bit coordinates); the dense operand's map covers its live data; the
        // sparse operand's map covers its stored blocks (at least one) and `cols` holds an
        // in-range column for each; every segment's positions are stages of stored blocks of its
        // tile's block row (`work_list` over the validated structure, in stages); the output
        // holds m·n elements of `out_type` (C or, transposed, its product's shape); `run.splitk` is
        // sized for the schedule's slots and counters.
        let _gemm = unsafe { launch.launch(&params) }?;
        Ok(())
    }
}

/// The parameters every launch shares: the operand maps and split-K workspace given, the output
/// (with its TMA-store map when `staged` and the output has one) and its type; the shape and
/// mode are filled in by the caller.
fn output_params<'a>(
    launch: &mut Launch<'a>,
    c: &'a mut DeviceOutput,
    tile: HalfTile,
    staged: bool,
    (tmap_a, tmap_b, splitk): (u64, u64, blockscaled_kernels::params::SplitKParams),
) -> Result<Sm90HalfParams> {
    let DeviceOutput {
        buf: out,
        prepared,
        dtype,
        ..
    } = c;
    let tmap_c = match prepared.get::<Sm90Output>() {
        Some(o) if staged => launch.opt_map(o.tmap(out_box_n(tile.block_n))?)?,
        _ => 0,
    };
    Ok(Sm90HalfParams {
        tmap_a,
        tmap_b,
        tmap_c,
        out: launch.ptr_mut(out),
        splitk,
        m: 0,
        n: 0,
        k: 0,
        l: 0,
        out_type: *dtype as u32,
        group_m: 1,
        split_k: 1,
        alpha: 1.0,
        cluster_m: 1,
        _pad: 0,
        sparse: SparseParams::default(),
    })
}

crate::held::held!(HalfOperand: tmaps);
crate::held::held!(HalfSparse: tmaps);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::test_util::{broken_knobs, shape as s};

    fn cfg(tile: HalfTile) -> Sm90HalfConfig {
        Sm90HalfConfig {
            tile,
            cluster_m: 1,
            group_m: 1,
            ctas: 132,
            split_k: 1,
        }
    }

    #[test]
    fn a_split_whose_ranges_overflow_32_bits_is_a_config_error() {
        // K = 2²³ is 2¹⁷ stages of 64: split into 2¹⁶ ranges, the scheduler's s·stages / split
        // would pass 2³² and skip K blocks.
        let big = s(128, 128, 1 << 23, 1);
        let split = |split_k| Sm90HalfConfig {
            split_k,
            ..cfg(HalfTile::M128)
        };
        assert!(split(1 << 14).validate(&big).is_ok());
        for bad in [1 << 15, 1 << 16] {
            assert!(matches!(split(bad).validate(&big), Err(Error::Config(_))));
        }
        assert!(matches!(
            split((1 << 17) + 1).validate(&big),
            Err(Error::Config(_))
        ));
    }

    #[test]
    fn configurations_the_kernel_lacks_are_typed_errors() {
        let ok = cfg(HalfTile::M128);
        assert!(ok.validate(&s(300, 200, 72, 2)).is_ok());
        for bad in [
            Sm90HalfConfig {
                tile: HalfTile {
                    waves: 3,
                    block_n: 128,
                },
                ..ok
            },
            Sm90HalfConfig { cluster_m: 0, ..ok },
            Sm90HalfConfig { cluster_m: 3, ..ok },
            // Pairs: 300 rows are 2 units of 256.
            Sm90HalfConfig {
                cluster_m: 2,
                group_m: 3,
                ..ok
            },
        ]
        .into_iter()
        // 300 rows are 3 units of 128; K = 72 is 2 stages of 64.
        .chain(broken_knobs!(ok, bands: 3, stages: 2))
        {
            assert!(
                matches!(bad.validate(&s(300, 200, 72, 2)), Err(Error::Config(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            ok.validate(&s(300, 200, 70, 1)),
            Err(Error::Shape(_))
        ));
        // Sparse: tiles no wider than the block, parts 1..=MAX_PARTS, one batch entry.
        let sp = Sm90HalfConfig { split_k: 4, ..ok };
        assert!(sp.validate_sparse(&s(300, 256, 256, 1), 128).is_ok());
        assert!(matches!(
            sp.validate_sparse(&s(300, 256, 256, 1), 64),
            Err(Error::Config(_))
        ));
        let n64 = Sm90HalfConfig {
            tile: HalfTile::M128N64,
            ..sp
        };
        assert!(n64.validate_sparse(&s(300, 256, 256, 1), 64).is_ok());
        for bad in [0, crate::bsr::MAX_PARTS + 1] {
            let c = Sm90HalfConfig { split_k: bad, ..sp };
            assert!(matches!(
                c.validate_sparse(&s(300, 256, 256, 1), 128),
                Err(Error::Config(_))
            ));
        }
        assert!(matches!(
            sp.validate_sparse(&s(300, 256, 256, 2), 128),
            Err(Error::Shape(_))
        ));
    }
}
