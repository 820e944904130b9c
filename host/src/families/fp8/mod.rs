//! Host side of the Hopper FP8 kernel (`kernels::sm90_fp8`): which operands it takes, its
//! configuration and the rules that configuration obeys, the kernel-layout scale buffers and TMA
//! tensor maps made once per uploaded matrix and output, and the launch (with the split-K
//! reduction after it).

use std::sync::Arc;

use cudarc::driver::{CudaModule, CudaSlice, CudaStream, DevicePtr};

use crate::bsr::{BsrMatrix, DeviceBsr, DeviceWork, FP8_BLOCK, SparseSide};
use crate::buffers::{DeviceMatrix, DeviceOutput, Mem, Prepared, PreparedValue};
use crate::error::{Error, Result, config, shape};
use crate::families::operands::fp8::BOX_ROWS;
pub(crate) use crate::families::operands::fp8::unsupported;
use crate::families::operands::{Sm90Operand, Sm90Output};
use crate::families::persistent::{self, Persistent};
use crate::families::{Family, Gemm, Rewritten};
use crate::format::{ElemType, OutType};
use crate::fused::Fused;
use crate::grouped::DeviceGroups;
use crate::matrix::GemmShape;
use crate::prepare::{Preparers, Source};
use crate::splitk;
use crate::tensor_map::{DataType, Swizzle, encode_3d};
use crate::workspace::{Workspace, WorkspaceSize};
use blockscaled_kernels::gemm::layout::out_box_n;
use blockscaled_kernels::gemm::scheduler::{ClusterShape, MAX_CLUSTER, Schedule};
use blockscaled_kernels::params::SparseParams;
use blockscaled_kernels::sm90::{
    self as family, BLOCK_K, BLOCK_N, Mode, ROW_BYTES, Sm90Fp8Params, Tile, WG_ROWS, m_pad,
};

/// Configuration of one launch (chosen by `plan::choose`, or forced through `Gpu::gemm_with`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Sm90Config {
    /// The output tile: one of [`Tile::ALL`] — 128 × 128, 192 × 128 (three consumer
    /// warpgroups), 256 × 128 (two 128-row waves per stage, a quarter fewer L2 bytes per FLOP),
    /// 128 × 144, 160 or 192 (wide: fewer shared-memory bytes per FLOP, and widths that fill
    /// rounds of SMs), 128 × 64 (twice the tiles at small M), or the swapped decode tiles.
    pub tile: Tile,
    /// CTAs per cluster: 1 × 1, 2 × 1 (a pair along M shares each B tile by TMA multicast, in
    /// halves, so not with 64-column tiles) or 1 × 2 (a pair along N shares each A tile).
    pub cluster: ClusterShape,
    /// Scheduler band height, in M units of `tile.block_m() · cluster.m` rows: 1 to the number
    /// of such units in M (L2 reuse of B tiles).
    pub group_m: u32,
    /// Persistent CTAs (≥ 1; at most as many as can be resident at once are launched).
    pub ctas: u32,
    /// K split into this many ranges, each its own CTA (1 to K / 128): when M·N has too few
    /// tiles to fill the GPU. The last CTA of each tile to finish adds the others' partial sums
    /// (kept in an f32 workspace) and stores the tile.
    pub split_k: u32,
}

crate::config::config_fields!(Sm90Config {
    tile: Tile => with_tile,
    cluster: ClusterShape => with_cluster,
    group_m: u32 => with_group_m,
    ctas: u32 => with_ctas,
    split_k: u32 => with_split_k,
});

impl Sm90Config {
    /// Checks every field against the kernel and against `s` ([`Error::Config`]), and the shape
    /// against the kernel's 32-bit indexing ([`Error::Shape`]). The launch trusts what passes.
    pub fn validate(&self, s: &GemmShape) -> Result<()> {
        let Sm90Config {
            tile,
            cluster: cl,
            group_m,
            ctas,
            split_k,
        } = *self;
        if !Tile::ALL.contains(&tile) {
            return Err(config(format!(
                "tile {tile:?} ({} × {}): the sm90 kernel has tiles of {}",
                tile.block_m(),
                tile.block_n,
                Tile::ALL
                    .map(|t| format!("{} × {}", t.block_m(), t.block_n))
                    .join(", ")
            )));
        }
        if cl.m == 0 || cl.n == 0 || cl.m as u64 * cl.n as u64 > MAX_CLUSTER as u64 {
            return Err(config(format!(
                "cluster of {}×{} CTAs (M×N): the sm90 kernel takes 1×1, 2×1 or 1×2",
                cl.m, cl.n
            )));
        }
        if tile.is_swapped() && cl.size() != 1 {
            return Err(config(format!(
                "cluster of {}×{} CTAs: the swapped {} × {} tiles run alone",
                cl.m,
                cl.n,
                tile.block_m(),
                tile.block_n
            )));
        }
        // Each CTA of a pair along M loads half the B tile, in whole 8-row swizzle atoms.
        if b_box_rows(tile, cl).is_none() {
            return Err(config(format!(
                "a pair along M shares the B tile in halves of at least 64 rows: not with \
                 {}-column tiles",
                tile.block_n
            )));
        }
        if ctas == 0 {
            return Err(config("ctas = 0: a launch needs at least one CTA"));
        }
        if !s.k.is_multiple_of(BLOCK_K as usize) {
            return Err(shape(format!(
                "K = {} is not a multiple of {BLOCK_K}, which the sm90 kernel's scale blocks need",
                s.k
            )));
        }
        let k_blocks = s.k / BLOCK_K as usize;
        splitk::check_split(split_k, k_blocks, BLOCK_K, s.k)?;
        if s.m > i32::MAX as usize || s.n > i32::MAX as usize {
            return Err(shape("M and N must fit TMA's 32-bit coordinates"));
        }
        // The scheduler's units (clusters of tiles) and its u32 arithmetic: `group_m · n_units`
        // and the unit count stay below 2³² when group_m ≤ m_units and the count fits.
        let (m_units, n_units) = Sm90Config::units(tile, cl, s);
        if !(1..=m_units).contains(&(group_m as usize)) {
            let (what, len, rows) = if tile.is_swapped() {
                ("N", s.n, tile.block_n)
            } else {
                ("M", s.m, tile.block_m() * cl.m)
            };
            return Err(config(format!(
                "group_m = {group_m}: {what} = {len} has {m_units} units of {rows} rows (tile × \
                 cluster) to band",
            )));
        }
        let units = [n_units, s.l, split_k as usize]
            .iter()
            .try_fold(m_units, |acc, &x| acc.checked_mul(x));
        if units.is_none_or(|u| u > u32::MAX as usize) {
            return Err(shape(format!(
                "{m_units} × {n_units} tile units × L = {} × split {split_k}: the sm90 kernel's \
                 scheduler counts at most 2³² − 1",
                s.l
            )));
        }
        // The kernel indexes the A scales with 32 bits.
        let m_pad = m_pad(s.m as u32);
        if s.l as u128 * k_blocks as u128 * m_pad as u128 > u32::MAX as u128 {
            return Err(shape(format!(
                "L·(K/128)·M = {}·{k_blocks}·{m_pad} A scales: the sm90 kernel indexes at most 2³²",
                s.l
            )));
        }
        splitk::validate(s, split_k)
    }

    /// The scheduler's units of `tile` × `cl` for shape `s`: (along its banded axis, along the
    /// other). The banded axis is M (A's tiles), or N (B's tiles) for swapped tiles, whose
    /// schedule runs over Cᵀ; `group_m` counts units of the first.
    pub fn units(tile: Tile, cl: ClusterShape, s: &GemmShape) -> (usize, usize) {
        let m_units = s.m.div_ceil((tile.block_m() * cl.m) as usize);
        let n_units = s.n.div_ceil((tile.block_n * cl.n) as usize);
        if tile.is_swapped() {
            (n_units, m_units)
        } else {
            (m_units, n_units)
        }
    }

    /// [`Sm90Config::validate`] for a block-sparse GEMM whose kernel shape is `s` (M: the dense
    /// operand's rows, N: the sparse operand's): a tile with a block-sparse kernel (at most one
    /// 128-row block wide: a tile's columns share one run of stored blocks), clusters along M
    /// only (a pair along N would need two runs), and `split_k` the most parts a run is cut into
    /// (1 to 16, `bsr::MAX_PARTS`).
    pub fn validate_sparse(&self, s: &GemmShape) -> Result<()> {
        Sm90Config {
            split_k: 1,
            ..*self
        }
        .validate(s)?;
        if family::kernel(self.tile, ElemType::E4M3, ElemType::E4M3, Mode::Sparse).is_none() {
            return Err(config(format!(
                "tile {} × {}: block-sparse GEMM runs tiles of 128 × 128 and 128 × 64",
                self.tile.block_m(),
                self.tile.block_n
            )));
        }
        if self.cluster.n != 1 {
            return Err(config(format!(
                "cluster of {}×{} CTAs: block-sparse GEMM pairs CTAs along M only (each N tile \
                 has its own run of stored blocks)",
                self.cluster.m, self.cluster.n
            )));
        }
        crate::bsr::validate_parts(self.split_k, s)
    }

    /// This configuration with `tile` in place of its own: the cluster kept if the tile is the
    /// same (else alone: the pairing was chosen for the other tile), and a band of about the same
    /// rows, within the new tile's units.
    pub fn with_tile_for(self, tile: Tile, s: &GemmShape) -> Sm90Config {
        let cluster = if tile == self.tile {
            self.cluster
        } else {
            ClusterShape::ONE
        };
        let (units, _) = Sm90Config::units(tile, cluster, s);
        let (old, new) = (band_rows(self.tile), band_rows(tile));
        Sm90Config {
            tile,
            cluster,
            group_m: ((self.group_m as u64 * old as u64 / new as u64) as usize)
                .clamp(1, units.max(1)) as u32,
            ..self
        }
    }
}

/// Rows of the banded axis per tile (swapped: B's 128).
fn band_rows(tile: Tile) -> u32 {
    if tile.is_swapped() {
        tile.block_n
    } else {
        tile.block_m()
    }
}

/// Rows of each CTA's box of the B tile: the tile's columns shared among a cluster's CTAs along
/// M, which the host has tensor maps for ([`BOX_ROWS`]: 64 rows or more); `None` otherwise.
fn b_box_rows(tile: Tile, cl: ClusterShape) -> Option<u32> {
    let rows = tile.block_n / cl.m.max(1);
    (tile.block_n.is_multiple_of(cl.m.max(1)) && rows >= WG_ROWS && BOX_ROWS.contains(&rows))
        .then_some(rows)
}

/// The schedule of a dense or grouped GEMM of `shape` with `cfg`, as the kernel's `schedule`
/// computes it: units of work are clusters of tiles, and swapped tiles schedule Cᵀ.
fn dense_schedule(cfg: &Sm90Config, shape: GemmShape, groups: Option<&DeviceGroups>) -> Schedule {
    let GemmShape { m, n, k, l } = shape;
    let (tile, cl) = (cfg.tile, cfg.cluster);
    let units = (tile.block_m() * cl.m, tile.block_n * cl.n);
    let ((sm, sn), (unit_m, unit_n)) = match tile.is_swapped() {
        true => ((n, m), (units.1, units.0)),
        false => ((m, n), units),
    };
    let groups = groups.map(|g| g.schedule(m, false));
    let split = (cfg.split_k, cfg.group_m);
    crate::launch::schedule(
        (sm, sn, l),
        k / BLOCK_K as usize,
        (unit_m, unit_n),
        split,
        groups,
    )
}

/// A block-sparse GEMM's schedule with `cfg` and its work list (made once per key on the
/// sparse operand), for a kernel with `resident` CTAs resident at once.
fn bsr_schedule(
    stream: &Arc<CudaStream>,
    resident: u32,
    dense: &DeviceMatrix,
    sparse: &DeviceBsr,
    cfg: &Sm90Config,
) -> Result<(Schedule, Arc<DeviceWork>)> {
    let (tile, cl) = (cfg.tile, cfg.cluster);
    let clusters = (cfg.ctas.min(resident) / cl.size()).max(1) as usize;
    let (m, k) = (dense.desc.rows, dense.desc.k);
    let units = (tile.block_m() * cl.m, tile.block_n);
    let sizes = (m, k / BLOCK_K as usize);
    crate::bsr::sparse_schedule(
        stream,
        sparse,
        sizes,
        units,
        cfg.group_m,
        (clusters, cfg.split_k),
    )
}

/// One loaded kernel (its row of the family's kernel list: tile, element types, mode).
type Kernel = persistent::Kernel<family::Sm90Fp8Kernel>;

/// The sm90 FP8 family on one GPU: a kernel per tile shape and element types, and the split-K
/// Whether `tile` cannot run `epi`: swapped tiles compute Cᵀ and store it transposed, without
/// the fused epilogue's row staging.
pub(crate) fn tile_refuses(tile: Tile, epi: Option<&Fused<'_>>) -> bool {
    tile.is_swapped() && epi.is_some()
}

/// workspace (grown on demand, reused in stream order).
pub(crate) struct Sm90Fp8 {
    kernels: Vec<Kernel>,
    /// For the B role's scales, made at a matrix's first use as B.
    preparers: Preparers,
}

impl Family for Sm90Fp8 {
    fn prepare_weights(&self, stream: &Arc<CudaStream>, m: &DeviceMatrix<'_>) -> Result<()> {
        if m.prepared.get::<Sm90Operand>().is_some() {
            Sm90Operand::as_b(m, stream, &self.preparers)?;
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

    fn prepare_operand(
        &self,
        stream: &Arc<CudaStream>,
        matrix: &Source<'_>,
        data: &Mem<'_>,
        made: &Prepared,
    ) -> Result<Option<PreparedValue>> {
        // (Already made by the writer: the device quantizers' A-role scales, written in place.)
        if made.get::<Sm90Operand>().is_some() {
            return Ok(None);
        }
        Ok(Sm90Operand::prepare(stream, matrix, data)?.map(|p| Box::new(p) as PreparedValue))
    }

    fn refresh_operand(
        &self,
        stream: &Arc<CudaStream>,
        matrix: &Source<'_>,
        prepared: &mut Prepared,
        written: Rewritten,
    ) -> Result<bool> {
        if let Some(op) = prepared.get_mut::<Sm90Operand>() {
            op.refresh(stream, matrix, written.sfa)?;
        }
        Ok(true)
    }

    fn prepare_output(
        &self,
        stream: &Arc<CudaStream>,
        buf: &Mem<'_>,
        dtype: OutType,
        dims: (usize, usize, usize),
    ) -> Result<Option<PreparedValue>> {
        Ok(Sm90Output::prepare(stream, buf, dtype, dims)?.map(|p| Box::new(p) as PreparedValue))
    }

    fn prepare_sparse(
        &self,
        stream: &Arc<CudaStream>,
        matrix: &BsrMatrix,
        values: &CudaSlice<u8>,
    ) -> Result<Option<PreparedValue>> {
        Ok(Some(Box::new(Sm90Sparse::prepare(stream, matrix, values)?)))
    }
}

/// What the kernel needs of a block-sparse operand: tensor maps of its stored blocks (3-D: 128
/// bytes of K, 128 rows, stored blocks; 128-byte swizzle) with boxes of 128 rows (a 128-column
/// tile) and 64 (a 64-column tile, or a CTA's half of a tile shared along M).
struct Sm90Sparse {
    tmaps: [CudaSlice<u8>; 2],
}

impl Sm90Sparse {
    const BOX_ROWS: [u32; 2] = [128, 64];

    fn prepare(stream: &Arc<CudaStream>, m: &BsrMatrix, values: &CudaSlice<u8>) -> Result<Self> {
        let blocks = m.nnz().max(1);
        let bs = FP8_BLOCK;
        let (ptr, _g) = values.device_ptr(stream);
        let map = |rows: u32| {
            encode_3d(
                stream,
                ptr,
                DataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
                [bs, bs, blocks],
                1,
                [ROW_BYTES, rows],
                Swizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            )
        };
        Ok(Sm90Sparse {
            tmaps: [map(Self::BOX_ROWS[0])?, map(Self::BOX_ROWS[1])?],
        })
    }

    fn tmap(&self, rows: u32) -> Result<&CudaSlice<u8>> {
        Self::BOX_ROWS
            .iter()
            .position(|&r| r == rows)
            .map(|i| &self.tmaps[i])
            .ok_or_else(|| {
                config(format!(
                    "no block-sparse tensor map with boxes of {rows} rows"
                ))
            })
    }
}

impl Sm90Fp8 {
    /// Loads the kernels when the module built for `target` has them.
    pub(crate) fn load(
        module: &Arc<CudaModule>,
        stream: &Arc<CudaStream>,
        target: &str,
        sm_count: u32,
        preparers: &Preparers,
    ) -> Result<Option<Self>> {
        if !family::KERNELS[0].info.targets.contains(&target) {
            return Ok(None);
        }
        let mut kernels = Vec::new();
        for def in family::LISTS.into_iter().flatten() {
            let shape = (def.tile.threads(), def.layout().bytes());
            kernels.push(Kernel::load(
                module,
                stream,
                (def, def.info.name),
                shape,
                sm_count,
                true,
            )?);
        }
        Ok(Some(Sm90Fp8 {
            kernels,
            preparers: preparers.clone(),
        }))
    }

    /// The workspace a GEMM of `shape` with `cfg` takes (split K's buffers).
    pub(crate) fn workspace(
        cfg: &Sm90Config,
        shape: GemmShape,
        groups: Option<&DeviceGroups>,
    ) -> Result<WorkspaceSize> {
        let schedule = dense_schedule(cfg, shape, groups);
        splitk::bytes(&schedule, cfg.cluster, cfg.split_k > 1)
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
        let Gemm {
            stream,
            work,
            shape,
            c,
            groups,
            epi,
            ..
        } = g;
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
        let (Some(sfa_map), Some(b_role)) = (&ao.sfa_map, bo.b_role()) else {
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
        let Persistent {
            mut launch,
            groups: group_params,
            splitk,
            ..
        } = kernel.persistent(stream, &schedule, (cfg.ctas, cl), groups, slot.as_mut())?;
        // A in boxes of `Tile::a_box_rows`; B in boxes of block_n / cluster_m rows (each CTA's
        // share of a pair along M; validated).
        let tmap_a = launch.ptr(ao.tmap(tile.a_box_rows(cl.n))?);
        let tmap_b = launch.ptr(bo.tmap(b_box_rows(tile, cl).unwrap_or(BLOCK_N))?);
        // Swapped tiles hold Cᵀ fragments: stored directly; so do the finishing warps of a fused
        // epilogue, and a quantized output is codes (the consumers' 16-bit stores of a fused
        // epilogue in registers go through the map, as the dense kernel's).
        let quantized = epi.as_ref().is_some_and(|f| f.quant.is_some());
        let tmap_c = if tile.is_swapped() || mode == Mode::Fused || quantized {
            0
        } else {
            launch.opt_ptr(
                out_prepared
                    .get::<Sm90Output>()
                    .and_then(|o| o.tmap(out_box_n(tile.block_n))),
            )
        };
        let out_ptr = launch.ptr_mut(out);
        let params = Sm90Fp8Params {
            tmap_a,
            tmap_b,
            tmap_c,
            tmap_sfa: launch.ptr(sfa_map),
            sfb: launch.ptr(&b_role.sfb),
            sfb_col: launch.opt_ptr(b_role.sfb_col.as_ref()),
            out: out_ptr,
            splitk,
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
            groups: group_params,
            sparse: SparseParams::default(),
        };
        // (The fused kernel stages its rows in shared memory, `Tile::fused_layout`: no scratch.)
        let epi = Fused::params(epi, &mut launch, out_ptr, None);
        // SAFETY: `cfg` was validated for this shape (tile, cluster, band, split and the 32-bit
        // indexing; grouped: no split, and `groups` holds `count` int32 values on this GPU); the tensor maps cover the live data buffers of the prepared operands, the
        // scale buffers have the documented sizes (A scales padded to whole clusters), the output
        // holds l·m·n elements of `out_type`, `splitk` is sized for the schedule, and the grid is
        // a whole number of clusters; the kernel is the fused one exactly when `epi` is set,
        // whose buffers `Epilogue::check` and the output check sized for the product.
        let _gemm = unsafe { launch.launch_fused(params, epi) }?;
        Ok(())
    }
}

impl Sm90Fp8 {
    /// The block-sparse kernel for `dense`'s type and `cfg`'s tile.
    fn bsr_kernel(&self, dense: &DeviceMatrix, cfg: &Sm90Config) -> Result<&Kernel> {
        let ea = dense.desc.format.elem;
        let def = family::kernel(cfg.tile, ea, ElemType::E4M3, Mode::Sparse);
        self.kernels
            .iter()
            .find(|kr| Some(kr.def) == def)
            .ok_or_else(|| {
                Error::Format(format!(
                    "block-sparse GEMM takes an e4m3 dense operand, not {}",
                    ea.name()
                ))
            })
    }

    /// The workspace of a block-sparse GEMM with `cfg` (split K's buffers where the work list
    /// splits runs of blocks; the sparse operand's work list is made as the launch makes it).
    pub(crate) fn bsr_workspace(
        &self,
        stream: &Arc<CudaStream>,
        dense: &DeviceMatrix,
        sparse: &DeviceBsr,
        cfg: Sm90Config,
    ) -> Result<WorkspaceSize> {
        if let Some(e) = unsupported(&dense.desc, false) {
            return Err(Error::Format(e));
        }
        let kernel = self.bsr_kernel(dense, &cfg)?;
        let resident = kernel.resident(cfg.cluster.size());
        let (schedule, work) = bsr_schedule(stream, resident, dense, sparse, &cfg)?;
        splitk::bytes(&schedule, cfg.cluster, work.slots > 0)
    }

    /// C = A · Bᵀ with one operand block-sparse (`side`) and `dense` the other, on the
    /// block-sparse kernel with `cfg` (validated for the kernel's shape: M the dense operand's
    /// rows, N the sparse operand's). C is `c`; with A sparse the kernel computes Cᵀ and stores
    /// it transposed.
    pub(crate) fn bsr_gemm(
        &self,
        (stream, ws): (&Arc<CudaStream>, &Workspace),
        dense: &DeviceMatrix,
        sparse: &DeviceBsr,
        side: SparseSide,
        c: &mut DeviceOutput,
        cfg: Sm90Config,
    ) -> Result<()> {
        if let Some(e) = unsupported(&dense.desc, false) {
            return Err(Error::Format(e));
        }
        let kernel = self.bsr_kernel(dense, &cfg)?;
        let (Some(ao), Some(bo)) = (
            dense.prepared.get::<Sm90Operand>(),
            sparse.prepared.get::<Sm90Sparse>(),
        ) else {
            return Err(Error::Format(
                "operands not prepared for the sm90 block-sparse kernel".into(),
            ));
        };
        let Some(sfa_map) = &ao.sfa_map else {
            return Err(Error::Format(
                "the dense operand of a block-sparse GEMM needs fp32 scales per 1×128 (or per row \
                 or tensor)"
                    .into(),
            ));
        };
        let (tile, cl) = (cfg.tile, cfg.cluster);
        let (m, n, k) = (dense.desc.rows, sparse.matrix_rows, dense.desc.k);
        let resident = kernel.resident(cl.size());
        let (schedule, work) = bsr_schedule(stream, resident, dense, sparse, &cfg)?;
        let mut slot = ws.splitk.slot(if work.slots > 0 { 2 } else { 1 });
        let DeviceOutput {
            buf: out,
            prepared: out_prepared,
            dtype,
            ..
        } = c;
        let Persistent {
            mut launch, splitk, ..
        } = kernel.persistent(stream, &schedule, (cfg.ctas, cl), None, slot.as_mut())?;
        let b_rows = b_box_rows(tile, cl).unwrap_or(BLOCK_N);
        // With A sparse the tile is Cᵀ: stored directly.
        let tmap_c = match side {
            SparseSide::A => 0,
            SparseSide::B => launch.opt_ptr(
                out_prepared
                    .get::<Sm90Output>()
                    .and_then(|o| o.tmap(out_box_n(tile.block_n))),
            ),
        };
        let params = Sm90Fp8Params {
            tmap_a: launch.ptr(ao.tmap(tile.a_box_rows(1))?),
            tmap_b: launch.ptr(bo.tmap(b_rows)?),
            tmap_c,
            tmap_sfa: launch.ptr(sfa_map),
            sfb: launch.ptr(&sparse.scales),
            sfb_col: 0,
            out: launch.ptr_mut(out),
            splitk,
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
            sparse: SparseParams {
                segments: launch.ptr(&work.segments),
                cols: launch.ptr(&sparse.col),
                count: work.count,
                slots: work.slots,
                counters: work.counters,
                transposed: (side == SparseSide::A) as u32,
                // (FP8 blocks are 128 × 128 e4m3: one stage of K each.)
                sub_log2: 0,
                _pad: 0,
            },
        };
        // SAFETY: `cfg` was validated for the kernel's shape (`validate_sparse`: a block-sparse
        // tile, pairs along M only, 32-bit indexing); the dense operand's maps and A-role scales
        // cover its live buffers; the sparse operand's map covers its stored blocks (at least
        // one), `sfb` holds a scale and `cols` an in-range column for each, and every segment's
        // positions are stored blocks of its tile's block row (`work_list` over the validated
        // structure); the output holds m·n elements of `out_type` (C or, transposed, its
        // product's shape); `splitk` is sized for the schedule's slots and counters; the grid is
        // a whole number of clusters.
        let _gemm = unsafe { launch.launch(&params) }?;
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
    let ao = a
        .prepared
        .get::<Sm90Operand>()
        .ok_or_else(|| Error::Format("operands were not prepared for the sm90 kernel".into()))?;
    Ok((ao, Sm90Operand::as_b(b, stream, kernels)?))
}

crate::buffers::held!(Sm90Sparse: tmaps);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::sm90_default;

    fn shape(m: usize, n: usize, k: usize, l: usize) -> GemmShape {
        GemmShape { m, n, k, l }
    }

    /// 128-row tiles alone, one band, 132 CTAs, K in `split_k` ranges.
    fn m128(split_k: u32) -> Sm90Config {
        Sm90Config {
            tile: Tile::M128,
            cluster: ClusterShape { m: 1, n: 1 },
            group_m: 1,
            ctas: 132,
            split_k,
        }
    }

    #[test]
    fn the_chosen_configurations_validate() {
        for (m, n, k, l) in [
            (1, 1, 128, 1),
            (128, 7168, 2048, 1),
            (128, 2112, 7168, 1),
            (300, 300, 768, 2),
            (4096, 2112, 7168, 1),
            (8192, 8192, 8192, 1),
            (2048, 4224, 7168, 1),
        ] {
            let s = shape(m, n, k, l);
            let cfg = sm90_default(m, n, k, l, 132);
            assert!(cfg.validate(&s).is_ok(), "{s:?}: {cfg:?}");
        }
    }

    #[test]
    fn bands_outside_1_to_the_m_units_are_config_errors() {
        // 256 rows of 128-row tiles: 2 units; 2 N tiles, so 2³¹ · 2 wraps a u32 to 0.
        let s = shape(256, 256, 256, 1);
        let cfg = m128(1);
        for group_m in [0, 3, 1 << 31, u32::MAX] {
            let r = Sm90Config { group_m, ..cfg }.validate(&s);
            assert!(
                matches!(r, Err(Error::Config(_))),
                "group_m {group_m}: {r:?}"
            );
        }
        for group_m in [1, 2] {
            assert!(Sm90Config { group_m, ..cfg }.validate(&s).is_ok());
        }
        // Pairs along M halve the units.
        let pairs = Sm90Config {
            cluster: ClusterShape { m: 2, n: 1 },
            group_m: 2,
            ..cfg
        };
        assert!(matches!(pairs.validate(&s), Err(Error::Config(_))));
    }

    #[test]
    fn tiles_clusters_ctas_and_splits_the_kernel_lacks_are_config_errors() {
        let s = shape(256, 256, 256, 1);
        let ok = m128(2);
        assert!(ok.validate(&s).is_ok());
        let bad = [
            Sm90Config {
                tile: Tile::new(5, 1, 128),
                ..ok
            },
            Sm90Config {
                tile: Tile::new(2, 1, 96),
                ..ok
            },
            Sm90Config {
                cluster: ClusterShape { m: 0, n: 1 },
                ..ok
            },
            Sm90Config {
                cluster: ClusterShape { m: 2, n: 2 },
                ..ok
            },
            Sm90Config {
                cluster: ClusterShape {
                    m: u32::MAX,
                    n: u32::MAX,
                },
                ..ok
            },
            Sm90Config {
                tile: Tile::M128N64,
                cluster: ClusterShape { m: 2, n: 1 },
                ..ok
            },
            Sm90Config { ctas: 0, ..ok },
            Sm90Config { split_k: 0, ..ok },
            Sm90Config { split_k: 3, ..ok },
        ];
        for cfg in bad {
            assert!(matches!(cfg.validate(&s), Err(Error::Config(_))), "{cfg:?}");
        }
        // K not a multiple of 128, and A scales past 32-bit indexing, are shape errors.
        assert!(matches!(
            ok.validate(&shape(256, 256, 200, 1)),
            Err(Error::Shape(_))
        ));
        let huge = shape(1 << 30, 256, 128 * 64, 1);
        assert!(matches!(m128(1).validate(&huge), Err(Error::Shape(_))));
    }
}
