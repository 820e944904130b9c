//! Which kernel runs a GEMM, and with what configuration: one function, rules stated as data.
//! This file is also the list of kernel families: each has its host file (`reference_kernel`,
//! `sm90_fp8`), a [`Plan`] variant, a rule in [`choose`], and an entry in `load_families` and
//! `Plan::launch`; nothing of a family lives on [`Gpu`](crate::Gpu) or the device buffers.

use std::sync::Arc;

use cudarc::driver::{CudaModule, CudaStream};

use crate::buffers::DeviceMatrix;
use crate::error::{Error, Result, config, shape};
use crate::family::{Families, Gemm};
use crate::format::{ElemType, ScaleType};
use crate::grouped::DeviceGroups;
use crate::matrix::{GemmShape, MatrixDesc};
use crate::prepare::Preparers;
use crate::reference_kernel::{self, ReferenceKernel};
use crate::sm90_fp8::{self, Sm90Config, Sm90Fp8};
use crate::sm90_half::{self, Sm90Half, Sm90HalfConfig};
use crate::sm90_mx::{self, Sm90Mx, Sm90MxConfig};
use crate::sm90_mx_fp8::{self, Sm90MxFp8};
use crate::sm90_w4::{self, Sm90W4, Sm90W4Config};
use crate::workspace::WorkspaceSize;
use blockscaled_kernels::format::fold::target as fold_target;
use blockscaled_kernels::gemm::scheduler::{ClusterShape, MAX_CLUSTER};
use blockscaled_kernels::sm90::{self, BLOCK_K, Mode, Tile};
use blockscaled_kernels::sm90_half::{self as half, HalfTile, HalfType};
use blockscaled_kernels::sm90_mx::{self as mx, MxTile};
use blockscaled_kernels::sm90_w4::{self as w4, W4Tile};

/// Which kernels a GPU gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuArch {
    /// Compute capability 9.0 (H100, H200): the sm_90a module. Verified on an H100.
    Hopper,
    /// Compute capability 10.x: the sm_100a module. Assembled only; never run here.
    Blackwell,
}

impl GpuArch {
    /// The module's target, as the kernel registry names it (`KernelInfo::targets`).
    pub fn target(self) -> &'static str {
        match self {
            GpuArch::Hopper => "sm_90a",
            GpuArch::Blackwell => "sm_100a",
        }
    }
}

/// A kernel and its configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Plan {
    /// The SIMT reference kernel (every format; slow).
    Reference,
    /// The Hopper TMA + wgmma FP8 kernel with fp32 block scales.
    Sm90Fp8(Sm90Config),
    /// The Hopper MX / NVFP4 kernel: both operands dequantized exactly to bf16 in the pipeline,
    /// bf16 wgmma.
    Sm90Mx(Sm90MxConfig),
    /// The sm90 4-bit-weights kernel (W4A16, W4A8, and FP4 pairs at decode sizes).
    Sm90W4(Sm90W4Config),
    /// MX and NVFP4 operands (MXFP8, MXFP4, NVFP4, e2m1 with e8m0 per 16) folded by a pre-pass
    /// into FP8 operands with fp32 scales per 1×128 (A) and per row (B), then the FP8 kernel
    /// with this configuration. Lossy within a stated bound (`sm90_mx_fp8`).
    Sm90MxFp8(Sm90Config),
    /// The Hopper 16-bit kernel (bf16 or fp16 operands, both of one type, with one scale per
    /// tensor; block-sparse GEMM with bf16 or fp16 blocks).
    Sm90Half(Sm90HalfConfig),
}

impl Plan {
    /// Checks that the plan's kernel can run a GEMM of `shape` with this configuration:
    /// [`Error::Config`] for a configuration the kernel is not built for or that does not fit
    /// the shape, [`Error::Shape`] for a shape past the kernel's limits. `Gpu::gemm_with` calls
    /// it once; the launch trusts what passes.
    pub fn validate(&self, shape: &GemmShape) -> Result<()> {
        match self {
            Plan::Reference => reference_kernel::validate(shape),
            Plan::Sm90Fp8(cfg) => cfg.validate(shape),
            Plan::Sm90Mx(cfg) => cfg.validate(shape),
            Plan::Sm90W4(cfg) => cfg.validate(shape),
            Plan::Sm90MxFp8(cfg) => cfg.validate(shape),
            Plan::Sm90Half(cfg) => cfg.validate(shape),
        }
    }

    /// [`Plan::validate`] for a grouped GEMM whose C is `shape` (`crate::grouped`): the plan's
    /// family must have a grouped kernel, and K is not split (each group's tiles are whole). The
    /// most units the groups can make is checked against the scheduler's 32 bits where the grid
    /// is sized (`Schedule::units`).
    pub fn validate_grouped(&self, shape: &GemmShape) -> Result<()> {
        self.validate(shape)?;
        let split = match self {
            Plan::Sm90Fp8(cfg) => cfg.split_k,
            Plan::Sm90Mx(cfg) => cfg.split_k,
            Plan::Sm90W4(cfg) => cfg.split_k,
            Plan::Sm90MxFp8(cfg) => cfg.split_k,
            Plan::Reference | Plan::Sm90Half(_) => {
                return Err(config(format!(
                    "{self:?} has no grouped kernel: grouped GEMM runs on the sm90 FP8, MX, \
                     4-bit-weights and fold (MX → FP8) kernels"
                )));
            }
        };
        if split != 1 {
            return Err(config(format!(
                "split_k = {split}: a grouped GEMM does not split K"
            )));
        }
        Ok(())
    }

    /// Launches the plan's kernel on `families` (the plan validated for `g.shape`).
    pub(crate) fn launch(&self, families: &Families, g: Gemm<'_, '_>) -> Result<()> {
        let missing = |what: &str| Error::Architecture(format!("this GPU has no {what}"));
        match *self {
            Plan::Reference => families
                .get::<ReferenceKernel>()
                .ok_or_else(|| missing("reference kernel"))?
                .gemm(g),
            Plan::Sm90Fp8(cfg) => families
                .get::<Sm90Fp8>()
                .ok_or_else(|| missing("sm90 FP8 kernel (it needs compute capability 9.0)"))?
                .gemm(g, cfg),
            Plan::Sm90Mx(cfg) => families
                .get::<Sm90Mx>()
                .ok_or_else(|| missing("sm90 MX kernel (it needs compute capability 9.0)"))?
                .gemm(g, cfg),
            Plan::Sm90W4(cfg) => families
                .get::<Sm90W4>()
                .ok_or_else(|| {
                    missing("sm90 4-bit-weights kernel (it needs compute capability 9.0)")
                })?
                .gemm(g, cfg),
            Plan::Sm90MxFp8(cfg) => {
                let fp8 = families
                    .get::<Sm90Fp8>()
                    .ok_or_else(|| missing("sm90 FP8 kernel (it needs compute capability 9.0)"))?;
                families
                    .get::<Sm90MxFp8>()
                    .ok_or_else(|| {
                        missing("MX → FP8 fold kernel (it needs compute capability 9.0)")
                    })?
                    .gemm(g, cfg, fp8)
            }
            Plan::Sm90Half(cfg) => families
                .get::<Sm90Half>()
                .ok_or_else(|| missing("sm90 16-bit kernel (it needs compute capability 9.0)"))?
                .gemm(g, cfg),
        }
    }
}

impl Plan {
    /// The workspace a GEMM of `a` and `b` (forming `shape`, over `groups`) takes on this plan,
    /// with a fused epilogue or a quantized output where `fused`: each family's own schedule,
    /// sized ([`crate::Gpu::workspace_size`]).
    pub(crate) fn workspace(
        &self,
        families: &Families,
        (a, b): (&DeviceMatrix, &DeviceMatrix),
        shape: GemmShape,
        groups: Option<&DeviceGroups>,
        fused: bool,
    ) -> Result<WorkspaceSize> {
        match *self {
            Plan::Reference => Ok(WorkspaceSize::default()),
            Plan::Sm90Fp8(cfg) => Sm90Fp8::workspace(&cfg, shape, groups),
            Plan::Sm90Mx(cfg) => families
                .get::<Sm90Mx>()
                .ok_or_else(|| {
                    Error::Architecture(
                        "this GPU has no sm90 MX kernel (it needs compute capability 9.0)".into(),
                    )
                })?
                .workspace(&cfg, shape, groups, fused),
            Plan::Sm90W4(cfg) => Sm90W4::workspace(&cfg, shape, groups),
            Plan::Sm90MxFp8(cfg) => Sm90MxFp8::workspace(&cfg, (a, b), shape, groups),
            Plan::Sm90Half(cfg) => sm90_half::workspace(&cfg, shape),
        }
    }
}

/// What a fused epilogue needs of a plan's kernel: `block_cols`, a quantized output's scale
/// block in product columns (doubled by SwiGLU; 0: not quantized), which must lie in one warp's
/// pass over a staged row (128 columns: see `blockscaled_kernels::gemm::epilogue::fuse`) and divide the
/// tile's columns, so that no block straddles two tiles; and a fused kernel for the operands'
/// element types `elems` (A, B) on the plan's tile: one with finishing warps, or, for an
/// epilogue the consumers can run in their registers (`in_registers`), one that runs it there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FusedNeeds {
    pub block_cols: u32,
    pub elems: (ElemType, ElemType),
    pub in_registers: sm90::InRegisters,
}

impl Plan {
    /// [`Error::Config`] when the plan's kernel cannot run a fused epilogue that `needs` this.
    pub(crate) fn check_fused(&self, needs: FusedNeeds) -> Result<()> {
        let cols = match self {
            Plan::Reference => {
                return Err(config(
                    "the reference kernel has no fused epilogue (the sm90 kernels have)",
                ));
            }
            Plan::Sm90Fp8(c) | Plan::Sm90MxFp8(c) => {
                (!c.tile.is_swapped()).then_some(c.tile.block_n)
            }
            Plan::Sm90Half(c) => Some(c.tile.block_n),
            Plan::Sm90Mx(c) => Some(c.tile.block_n),
            Plan::Sm90W4(_) => None,
        };
        let Some(n) = cols else {
            return Err(config(format!(
                "{self:?} computes Cᵀ and stores it transposed: a fused epilogue needs a kernel \
                 that computes C"
            )));
        };
        // The fused epilogue runs in kernels of its own (the plain ones carry none of its code):
        // is there one for this tile and these types (the families' kernel lists say)?
        let (ea, eb) = needs.elems;
        let fp8 = |tile, (ea, eb)| sm90::fused_kernel(tile, ea, eb, needs.in_registers).is_some();
        let fused_kernel = match self {
            Plan::Sm90Fp8(c) => fp8(c.tile, (ea, eb)),
            // The fold's FP8 types.
            Plan::Sm90MxFp8(c) => fp8(c.tile, (fold_target(ea), fold_target(eb))),
            Plan::Sm90Half(c) => [HalfType::Bf16, HalfType::F16]
                .into_iter()
                .any(|ty| half::kernel(c.tile, ty, Mode::Fused).is_some()),
            Plan::Sm90Mx(c) => mx::KERNELS.iter().any(|k| k.fused && k.tile == c.tile),
            _ => false,
        };
        if !fused_kernel {
            return Err(config(format!(
                "{self:?}: no fused-epilogue kernel for this tile and {} · {} (they are: FP8 \
                 128 × 128 e4m3 · e4m3, and the 192-row tile for epilogues without β·C, \
                 residual or SwiGLU; the 16-bit 128 × 128 tile; the MX 256-column tile)",
                ea.name(),
                eb.name()
            )));
        }
        let b = needs.block_cols;
        if b > 128 {
            return Err(config(format!(
                "a quantized output's scale block of {b} product columns (SwiGLU doubles the \
                 output's) is wider than one warp's pass of 128 columns: SwiGLU with 1×128 \
                 output scales is not fused (quantize the SwiGLU output with Gpu::quantize_with)"
            )));
        }
        if b != 0 && n % b != 0 {
            return Err(config(format!(
                "{self:?}: a quantized output's scale block of {b} product columns must divide \
                 the tile's {n} columns"
            )));
        }
        Ok(())
    }
}

/// The MX kernel's configuration `c` on its one tile with fused kernels (256 columns).
fn mx_fused(c: Sm90MxConfig) -> Plan {
    Plan::Sm90Mx(Sm90MxConfig {
        tile: MxTile::N256,
        ..c
    })
}

/// [`choose_for`] for a GEMM with a fused epilogue that `needs` this: the usual plan where it
/// can run the epilogue, else the nearest one that can (a tile that has a fused kernel; the MX
/// kernel for FP4 pairs the 4-bit-weights kernel would take).
pub(crate) fn choose_fused(
    arch: GpuArch,
    sm_count: u32,
    shape: &GemmShape,
    (a, b): (&MatrixDesc, &MatrixDesc),
    needs: FusedNeeds,
) -> Result<Plan> {
    let plan = choose_for(arch, sm_count, shape, a, b)?;
    if plan.check_fused(needs).is_ok() {
        return Ok(plan);
    }
    let GemmShape { m, n, k, l } = *shape;
    let alt = match plan {
        // Folded MX / NVFP4 operands whose FP8 types have no fused kernel (e5m2): the exact MX
        // kernel, which fuses every pair.
        Plan::Sm90MxFp8(_)
            if sm90::kernel(
                Tile::M128,
                fold_target(a.format.elem),
                fold_target(b.format.elem),
                Mode::Fused,
            )
            .is_none() =>
        {
            mx_fused(sm90_mx_default(m, n, k, l, sm_count))
        }
        Plan::Sm90Fp8(c) | Plan::Sm90MxFp8(c) => {
            // The one fused FP8 tile.
            let cfg = c.with_tile_for(Tile::M128, shape);
            match plan {
                Plan::Sm90Fp8(_) => Plan::Sm90Fp8(cfg),
                _ => Plan::Sm90MxFp8(cfg),
            }
        }
        Plan::Sm90Half(c) => Plan::Sm90Half(Sm90HalfConfig {
            tile: HalfTile::M128,
            ..c
        }),
        Plan::Sm90Mx(c) => mx_fused(c),
        Plan::Sm90W4(_) if sm90_mx::unsupported_pair(a, b).is_none() => {
            mx_fused(sm90_mx_default(m, n, k, l, sm_count))
        }
        other => other,
    };
    alt.check_fused(needs)?;
    alt.validate(shape)?;
    Ok(alt)
}

/// Loads every kernel family the module built for `arch` contains (`preparers`: the GPU's, for
/// the families that make a matrix's weight-role copies at its first use as weights).
pub(crate) fn load_families(
    module: &Arc<CudaModule>,
    stream: &Arc<CudaStream>,
    arch: GpuArch,
    sm_count: u32,
    preparers: &Preparers,
) -> Result<Families> {
    let mut families = Families::default();
    families.add(ReferenceKernel::load(module)?);
    if let Some(f) = Sm90Fp8::load(module, stream, arch.target(), sm_count, preparers)? {
        families.add(f);
    }
    if let Some(f) = Sm90Mx::load(module, arch.target(), sm_count)? {
        families.add(f);
    }
    if let Some(f) = Sm90W4::load(module, arch.target(), sm_count, preparers)? {
        families.add(f);
    }
    if let Some(f) = Sm90MxFp8::load(module, arch.target(), preparers)? {
        families.add(f);
    }
    if let Some(f) = Sm90Half::load(module, stream, arch.target(), sm_count)? {
        families.add(f);
    }
    Ok(families)
}

/// Picks the kernel for A (M×K) · Bᵀ (N×K) on `arch` with `sm_count` SMs.
///
/// - Hopper, e4m3 or e5m2 with fp32 scales that are constant over 1×128 (A) and 128×128 (B)
///   blocks — DeepSeek, per-tensor, per-row — runs the sm90 kernel. Its 128-wide scale blocks
///   need K % 128 == 0: other K are an error rather than a silent 1000× slower path.
/// - Hopper, MXFP8 (e4m3 / e5m2, either pair), MXFP4, NVFP4 and e2m1 with e8m0 per 16 — both
///   operands of one code width and one scale format, K a multiple of the scale block and rows a
///   multiple of 16 bytes (TMA) — runs the sm90 MX kernel ([`sm90_mx_default`]), except that
///   e2m1 pairs with M ≤ [`W4_MAX_M`] run the 4-bit-weights kernel, and pairs with M ≥
///   [`FOLD_MIN_M`] and K a multiple of 128 run folded onto
///   the FP8 kernel ([`Plan::Sm90MxFp8`]: lossy, within each format's own quantization error).
/// - Hopper, bf16 × bf16 or fp16 × fp16 (one scale per tensor, K a multiple of 8) runs the sm90
///   16-bit kernel ([`sm90_half_default`]); a bf16 × fp16 pair runs the reference kernel.
/// - Hopper, 4-bit weights (e2m1 B with MX or NVFP4 scales) with bf16 activations (W4A16) or
///   e4m3 ones with fp32 scales per 1×128 (W4A8) runs the sm90 4-bit-weights kernel
///   ([`sm90_w4_default`]).
/// - Everything else runs the reference kernel.
///
/// The sm90 FP8 configuration is [`sm90_default`]'s.
pub fn choose(arch: GpuArch, sm_count: u32, a: &MatrixDesc, b: &MatrixDesc) -> Result<Plan> {
    choose_for(arch, sm_count, &GemmShape::of(a, b)?, a, b)
}

/// [`choose`] for operands already checked to form `shape`.
pub(crate) fn choose_for(
    arch: GpuArch,
    sm_count: u32,
    shape: &GemmShape,
    a: &MatrixDesc,
    b: &MatrixDesc,
) -> Result<Plan> {
    if arch != GpuArch::Hopper {
        return Ok(Plan::Reference);
    }
    let sm90_a = sm90_fp8::unsupported(a, false).is_none();
    let sm90_b = sm90_fp8::unsupported(b, true).is_none();
    let fp32_fp8 = |d: &MatrixDesc| {
        d.format.scale == ScaleType::F32 && matches!(d.format.elem, ElemType::E4M3 | ElemType::E5M2)
    };
    let GemmShape { m, n, k, l } = *shape;
    let w4 = sm90_w4::unsupported_pair(a, b).is_none();
    if sm90_a && sm90_b {
        Ok(Plan::Sm90Fp8(sm90_default(m, n, k, l, sm_count)))
    } else if sm90_half::unsupported_pair(a, b).is_none() {
        Ok(Plan::Sm90Half(sm90_half_default(m, n, sm_count)))
    } else if w4 && (a.format.elem != ElemType::E2M1 || m <= W4_MAX_M) {
        Ok(Plan::Sm90W4(sm90_w4_default(m, n, k, l, sm_count)))
    } else if sm90_mx_fp8::unsupported_pair(a, b).is_none()
        && (m >= FOLD_MIN_M || sm90_mx::unsupported_pair(a, b).is_some())
    {
        // Folded from FOLD_MIN_M rows, and at any M where the MX kernel does not take the pair
        // (one operand FP8 already, e.g. a B folded once by `Gpu::fold_to_fp8`).
        Ok(Plan::Sm90MxFp8(sm90_default(m, n, k, l, sm_count)))
    } else if sm90_mx::unsupported_pair(a, b).is_none() {
        Ok(Plan::Sm90Mx(sm90_mx_default(m, n, k, l, sm_count)))
    } else if fp32_fp8(a) && fp32_fp8(b) && !shape.k.is_multiple_of(BLOCK_K as usize) {
        Err(shape_err_k(shape.k))
    } else {
        Ok(Plan::Reference)
    }
}

/// A grouped GEMM as the plan rules see it: the GPU, C's shape (`crate::grouped`), A's and B's
/// formats (B: one expert per batch entry) and the number of groups.
#[derive(Clone, Copy, Debug)]
pub struct GroupedProblem<'a> {
    /// The GPU's architecture.
    pub arch: GpuArch,
    /// Its SMs.
    pub sm_count: u32,
    /// C's rows, N, K and C's batch.
    pub shape: GemmShape,
    /// A (all groups' rows).
    pub a: &'a MatrixDesc,
    /// B (an expert per batch entry).
    pub b: &'a MatrixDesc,
    /// G, the number of groups.
    pub groups: usize,
}

/// The plan for a block-sparse GEMM ([`crate::Gpu::bsr_gemm`]) of kernel shape `s` (M the dense
/// operand's rows, N the sparse one's) with `nnz` stored blocks of `block` × `block` of type
/// `elem`: e4m3 blocks on the FP8 kernel with the tile [`sm90_bsr_default`] picks, bf16 and fp16
/// blocks on the 16-bit kernel ([`sm90_half_bsr_default`]).
pub fn choose_bsr(
    arch: GpuArch,
    sm_count: u32,
    s: &GemmShape,
    (elem, block, nnz): (ElemType, usize, usize),
) -> Result<Plan> {
    if arch != GpuArch::Hopper {
        return Err(Error::Architecture(
            "block-sparse GEMM has Hopper (sm_90a) kernels only".into(),
        ));
    }
    Ok(if elem == ElemType::E4M3 {
        Plan::Sm90Fp8(sm90_bsr_default(s.m, s.n, sm_count))
    } else {
        let runs = nnz as f64 / s.n.div_ceil(block).max(1) as f64;
        Plan::Sm90Half(sm90_half_bsr_default(s.m, block, runs, sm_count))
    })
}

/// The 16-bit block-sparse configuration for `m` dense rows, blocks of `block` rows and `runs`
/// stored blocks per block row on average: tiles as wide as a block (a tile's columns share one
/// run); 256 rows from [`HALF_M256_MIN_M`] rows when runs average at least [`HALF_M256_MIN_RUN`]
/// blocks (each stage feeds twice the MMAs), else 128 (twice the tiles to balance short runs:
/// 4096³ at 10%, 40 µs against 48; at 100%, 243 against 211; docs/PERF.md v38); runs cut into
/// up to 16 parts (`bsr::MAX_PARTS`) where they are longer than a CTA's share of the work.
pub fn sm90_half_bsr_default(m: usize, block: usize, runs: f64, sm_count: u32) -> Sm90HalfConfig {
    let tall = m >= HALF_M256_MIN_M && runs >= HALF_M256_MIN_RUN;
    let tile = match (tall, block >= 128) {
        (true, true) => HalfTile::M256,
        (false, true) => HalfTile::M128,
        (true, false) => HalfTile::M256N64,
        (false, false) => HalfTile::M128N64,
    };
    Sm90HalfConfig {
        split_k: crate::bsr::MAX_PARTS,
        ..half_config(tile, 1, m, sm_count)
    }
}

/// Fewest stored blocks per block row, on average, for the 16-bit block-sparse 256-row tiles.
pub const HALF_M256_MIN_RUN: f64 = 8.0;

/// The dense 16-bit configuration: from [`HALF_M256_MIN_M`] rows, 128 × 256 tiles in pairs along
/// M (each pair shares its 256-row B tile by multicast) where they fill at least half the SMs;
/// else 128 × 128 tiles, or 128 × 64 where 128-column tiles would leave most SMs idle. Measured
/// (v39, H100, against cuBLASLt bf16 in the same run, 4096³, 8192³ and 4096 × 7168 × 2048):
/// 128 × 256 pairs 0.98–1.02×, 256 × 128 alone 0.96–0.98×, 128 × 256 alone 0.91–0.93×, 128 × 128
/// 0.68–0.71×.
pub fn sm90_half_default(m: usize, n: usize, sm_count: u32) -> Sm90HalfConfig {
    let tiles = |t: HalfTile| m.div_ceil(t.block_m() as usize) * n.div_ceil(t.block_n as usize);
    let half_the_sms = sm_count as usize / 2;
    let (tile, cluster_m) = if m >= HALF_M256_MIN_M && tiles(HalfTile::M128N256) >= half_the_sms {
        (HalfTile::M128N256, MAX_CLUSTER)
    } else if tiles(HalfTile::M128) >= half_the_sms {
        (HalfTile::M128, 1)
    } else {
        (HalfTile::M128N64, 1)
    };
    half_config(tile, cluster_m, m, sm_count)
}

/// `tile` alone or in pairs along M (`cluster_m`), in bands of about [`GROUP_ROWS`] rows, on
/// every SM, K unsplit.
fn half_config(tile: HalfTile, cluster_m: u32, m: usize, sm_count: u32) -> Sm90HalfConfig {
    let unit = tile.block_m() * cluster_m;
    let m_units = m.div_ceil(unit as usize);
    Sm90HalfConfig {
        tile,
        cluster_m,
        group_m: m_units.clamp(1, (GROUP_ROWS / unit).max(1) as usize) as u32,
        ctas: sm_count.max(1),
        split_k: 1,
    }
}

/// Smallest M for the 16-bit kernel's 256-row units (256-row tiles, or 128 × 256 tiles in pairs).
pub const HALF_M256_MIN_M: usize = 1024;

/// The block-sparse configuration for `m` dense rows and `n` sparse rows: 128 × 64 tiles at
/// M ≤ [`N64_MAX_M`] (twice the tiles), else 128 × 128, in pairs along M (sharing each stored
/// block by multicast) from [`BSR_PAIR_MIN_M`] rows; runs cut into up to
/// 16 parts (`bsr::MAX_PARTS`) where they are longer than a CTA's share of the work.
pub fn sm90_bsr_default(m: usize, n: usize, sm_count: u32) -> Sm90Config {
    let _ = n;
    let tile = if m <= N64_MAX_M {
        Tile::M128N64
    } else {
        Tile::M128
    };
    let cluster = if m >= BSR_PAIR_MIN_M && tile == Tile::M128 {
        ClusterShape { m: 2, n: 1 }
    } else {
        ClusterShape::ONE
    };
    let m_units = m.div_ceil((tile.block_m() * cluster.m) as usize);
    Sm90Config {
        tile,
        cluster,
        group_m: m_units.clamp(1, (GROUP_ROWS / (tile.block_m() * cluster.m)) as usize) as u32,
        ctas: sm_count.max(1),
        split_k: crate::bsr::MAX_PARTS,
    }
}

/// Smallest M for block-sparse pairs along M.
pub const BSR_PAIR_MIN_M: usize = 1024;

/// The plan for a grouped GEMM ([`crate::Gpu::grouped_gemm`]):
/// - FP8 with fp32 scales: the FP8 kernel ([`sm90_grouped_default`]);
/// - MX and NVFP4 operands that fold to e4m3, with each other or with an FP8 one (experts folded
///   once by [`Gpu::fold_to_fp8`](crate::Gpu::fold_to_fp8), DeepSeek-style activations): folded
///   onto the FP8 kernel ([`Plan::Sm90MxFp8`]; lossy within the fold's bound). Experts folded
///   per call still beat the kernels that convert in their pipeline (docs/PERF.md, v33);
/// - the rest as [`choose_grouped_exact`].
pub fn choose_grouped(p: &GroupedProblem<'_>) -> Result<Plan> {
    let (a, b) = (p.a, p.b);
    let (fp8, fold) = (
        sm90_fp8::unsupported(a, false).or_else(|| sm90_fp8::unsupported(b, true)),
        sm90_mx_fp8::unsupported_pair(a, b).is_none()
            && sm90_mx_fp8::kernel_types(a, b) == (ElemType::E4M3, ElemType::E4M3)
            && fold_grouped(a, b),
    );
    if p.arch != GpuArch::Hopper || (fp8.is_some() && !fold) {
        return choose_grouped_exact(p);
    }
    let cfg = p.fp8_config();
    Ok(if fp8.is_none() {
        Plan::Sm90Fp8(cfg)
    } else {
        Plan::Sm90MxFp8(cfg)
    })
}

/// Whether a grouped GEMM of a pair that can fold does: always where B is FP8 already (folded
/// once ahead of time); per call for 4-bit experts with e8m0 scales (folded exactly but for
/// subnormals) or with FP8 activations (the 4-bit-weights kernel is slower than the fold); not
/// for the rest (NVFP4 and MXFP8 pairs), whose fold per call is no faster than the MX kernel
/// (docs/PERF.md, v33).
fn fold_grouped(a: &MatrixDesc, b: &MatrixDesc) -> bool {
    let ready = |d: &MatrixDesc, as_b| sm90_fp8::unsupported(d, as_b).is_none();
    let fp4_b = b.format.elem == ElemType::E2M1;
    ready(b, true) || (fp4_b && (b.format.scale == ScaleType::E8M0 || ready(a, false)))
}

impl GroupedProblem<'_> {
    /// Rows of one group: the capacity (masked), or the mean (contiguous).
    pub fn per_group(&self) -> usize {
        let s = &self.shape;
        if s.l > 1 {
            s.m
        } else {
            s.m.div_ceil(self.groups.max(1))
        }
    }

    /// The FP8 kernel's configuration for it ([`sm90_grouped_default`]), folded or not.
    pub fn fp8_config(&self) -> Sm90Config {
        let GemmShape { m, n, k, .. } = self.shape;
        sm90_grouped_default(m, n, k, self.groups, self.per_group(), self.sm_count)
    }
}

/// The plan for a grouped GEMM that keeps every operand's values exact (no fold):
/// - FP8 with fp32 scales: the FP8 kernel ([`sm90_grouped_default`]);
/// - 4-bit experts with bf16 or FP8 activations: the 4-bit-weights kernel, 128 activation rows
///   per tile (16 where a masked group holds at most 16 rows);
/// - MX and NVFP4 pairs: the MX kernel (bf16 products, fp32 sums).
///
/// Anything else is [`Error::Config`]: there is no grouped reference kernel.
pub fn choose_grouped_exact(p: &GroupedProblem<'_>) -> Result<Plan> {
    let (a, b, sm_count) = (p.a, p.b, p.sm_count);
    if p.arch != GpuArch::Hopper {
        return Err(Error::Architecture(
            "grouped GEMM has Hopper (sm_90a) kernels only".into(),
        ));
    }
    let GemmShape { n, k, .. } = p.shape;
    let per_group = p.per_group();
    let fp8 = sm90_fp8::unsupported(a, false).or_else(|| sm90_fp8::unsupported(b, true));
    if fp8.is_none() {
        return Ok(Plan::Sm90Fp8(p.fp8_config()));
    }
    if sm90_w4::unsupported_pair(a, b).is_none() && a.format.elem != ElemType::E2M1 {
        let mut cfg = sm90_w4_default(per_group, n, k, 1, sm_count);
        cfg.split_k = 1;
        return Ok(Plan::Sm90W4(cfg));
    }
    if sm90_mx::unsupported_pair(a, b).is_none() {
        let mut cfg = sm90_mx_default(per_group, n, k, 1, sm_count);
        cfg.split_k = 1;
        cfg.group_m = 1;
        return Ok(Plan::Sm90Mx(cfg));
    }
    Err(Error::Format(format!(
        "no grouped kernel takes A {} with B {} ({})",
        a.format,
        b.format,
        fp8.unwrap_or_default()
    )))
}

/// The FP8 kernel's configuration for a grouped GEMM: `groups` groups of about `per_group` rows
/// (`rows` in all), N, K. Large groups take the dense rule for one group ([`sm90_default`],
/// without split-K: each group is a GEMM of its own size). Small groups (MoE: tens to hundreds
/// of rows) take 128 × 128 tiles, one cluster-free CTA per tile, or 128 × 64 when twice as many
/// of those still fit one round of the SMs (twice the CTAs stream the experts' weights).
pub fn sm90_grouped_default(
    rows: usize,
    n: usize,
    k: usize,
    groups: usize,
    per_group: usize,
    sm_count: u32,
) -> Sm90Config {
    if per_group >= GROUPED_DENSE_ROWS {
        let mut cfg = sm90_unswapped(per_group, n, k, 1, sm_count, false);
        cfg.split_k = 1;
        let m_units = rows.div_ceil((cfg.tile.block_m() * cfg.cluster.m) as usize);
        cfg.group_m = cfg.group_m.min(m_units.max(1) as u32);
        return cfg;
    }
    // About half a tile wasted per group where the groups' rows do not fill their last tile.
    // 128 × 64 tiles only where twice the tiles still fit in one round: otherwise the second
    // round of half tiles costs more than the idle SMs of one round of whole ones (seed case 3,
    // 120 tiles on 132 SMs: 24.3 µs at 128 × 128, 30.5 at 128 × 64; docs/PERF.md, v33).
    let m_tiles = rows.div_ceil(128) + groups / 2;
    let tile = if 2 * m_tiles * n.div_ceil(128) <= sm_count as usize {
        Tile::M128N64
    } else {
        Tile::M128
    };
    Sm90Config {
        tile,
        cluster: ClusterShape::ONE,
        group_m: 1,
        ctas: sm_count.max(1),
        split_k: 1,
    }
}

/// Rows per group from which a grouped FP8 GEMM configures as a dense one.
pub const GROUPED_DENSE_ROWS: usize = 1024;

fn shape_err_k(k: usize) -> Error {
    shape(format!(
        "K = {k} is not a multiple of 128: the Hopper FP8 kernel's 128-wide scale blocks need it \
         (Gpu::reference_gemm computes it, slowly)"
    ))
}

/// The sm90 configuration `choose` uses for an A of `m` rows and a B of `n` rows (`l` batch
/// entries) on a GPU with `sm_count` SMs (the runner starts from it when it forces a field).
///
/// Tile: the persistent CTAs work through the tiles in rounds of `sm_count`; the time is about
/// rounds × the time of one tile ([`tile_cost`], in 128-row tiles). The 256-row tile does twice
/// the work with a quarter fewer L2 bytes per FLOP, so it wins unless its coarser rounds leave SMs
/// idle (small M, or few tiles); the 192-row tile sits between them and fills rounds that
/// neither does (4096 × 2112: 3 rounds of 192-row tiles for 5 of 128 or 3 of 256). Where A is one
/// 128-row tile (M ≤ [`N64_MAX_M`]), 128 × 64 tiles double the tiles: more SMs share B, the
/// operand that comes from DRAM, while A stays in L2.
///
/// Cluster: see `cluster` (private). Split-K: see `split_k` (private). Raster band (`group_m`):
/// CTAs running together cover `group_m` M tiles × (SMs / group_m) N tiles, so both operands'
/// working sets stay in L2; a band is [`GROUP_ROWS`] rows of A.
pub fn sm90_default(m: usize, n: usize, k: usize, l: usize, sm_count: u32) -> Sm90Config {
    if m <= SWAPPED_MAX_M && (m <= 32 || k >= SWAPPED_64_MIN_K) {
        return sm90_decode_default(m, n, k, l, sm_count);
    }
    sm90_unswapped(m, n, k, l, sm_count, true)
}

/// [`sm90_default`]'s choice among the unswapped tiles, the wide ones only if `wide` (the
/// grouped kernels have none).
fn sm90_unswapped(m: usize, n: usize, k: usize, l: usize, sm_count: u32, wide: bool) -> Sm90Config {
    let cost = |t: Tile| {
        let tiles = m.div_ceil(t.block_m() as usize) * n.div_ceil(t.block_n as usize) * l.max(1);
        let rounds = tiles.div_ceil(sm_count.max(1) as usize) as f64;
        rounds * tile_cost(t)
    };
    let mut candidates = vec![Tile::M256, Tile::M192, Tile::M128];
    if m <= N64_MAX_M {
        candidates.push(Tile::M128N64);
    } else if wide {
        // The wide tiles' costs were measured where the tensor cores are the limit (M ≥ 1024);
        // at M ≤ 128 the shapes wait on memory and keep the rule fitted there.
        candidates.extend([Tile::M128N192, Tile::M128N160, Tile::M128N144]);
    }
    // Ties go to the earlier (taller, wider) tile: fewer L2 bytes for the same time.
    let tile = candidates.into_iter().fold(
        Tile::M256,
        |best, t| if cost(t) < cost(best) { t } else { best },
    );
    let n_tiles = n.div_ceil(tile.block_n as usize) * l.max(1);
    let m_tiles = m.div_ceil(tile.block_m() as usize);
    let tiles = m_tiles * n_tiles;
    let split_k = split_k(tiles, k / BLOCK_K as usize, sm_count, SPLIT_K_COST_BLOCKS);
    let cluster = if split_k == 1 {
        cluster(
            tile,
            m_tiles,
            n.div_ceil(tile.block_n as usize),
            l.max(1),
            sm_count,
        )
    } else {
        ClusterShape { m: 1, n: 1 }
    };
    Sm90Config {
        tile,
        cluster,
        group_m: m_tiles.clamp(1, (GROUP_ROWS / tile.block_m()) as usize) as u32,
        ctas: sm_count.max(1),
        split_k,
    }
}

/// Largest M for the swapped tiles ([`Tile::swapped`]): up to 64 rows, one swapped tile holds
/// all of A, so B (the weights) is read from DRAM once, in stages of 16 KiB.
pub const SWAPPED_MAX_M: usize = 64;

/// Smallest K for which 33 to 64 rows take the 64-row swapped tile: with less K there are
/// many tiles per SM and the swapped tile's heavier MMA work per byte of B (m64n64 for every
/// 64 rows of B) costs more than the unswapped tiles' half-empty A; measured at M = 64
/// (docs/PERF.md, v34, µs swapped against unswapped): K = 512, 1536 and 2048 15.2 / 23.7 / 13.7
/// against 14.0 / 23.1 / 13.2; K = 7168 and 16384 15.7 / 20.7 / 50.8 against 16.6 / 23.6 / 66.7.
pub const SWAPPED_64_MIN_K: usize = 4096;

/// The sm90 configuration at decode sizes (M ≤ [`SWAPPED_MAX_M`]): the swapped tile of the
/// fewest rows that holds M (16, 32 or 64), and K split by [`decode_split`].
pub fn sm90_decode_default(m: usize, n: usize, k: usize, l: usize, sm_count: u32) -> Sm90Config {
    let tile = [Tile::S16, Tile::S32, Tile::S64]
        .into_iter()
        .find(|t| m <= t.block_m() as usize)
        .unwrap_or(Tile::S64);
    let b_tiles = n.div_ceil(tile.block_n as usize);
    let tiles = b_tiles * m.div_ceil(tile.block_m() as usize) * l.max(1);
    Sm90Config {
        tile,
        cluster: ClusterShape::ONE,
        // Bands run over B's tiles (the swapped schedule's M); with one A tile they do not
        // matter, and a band of 2048 rows of B is the dense rule's.
        group_m: b_tiles.clamp(1, (GROUP_ROWS / tile.block_n) as usize) as u32,
        ctas: sm_count.max(1),
        split_k: decode_split(
            tile,
            tiles,
            k / BLOCK_K as usize,
            m * n * l.max(1),
            sm_count,
        ),
    }
}

/// The split of K for `tiles` swapped tiles of `k_blocks` K blocks (`outputs` = M·N·L values),
/// from a cost model of a GEMM that waits on B's bytes (µs, constant launch costs left out):
///
/// `t(s) = Σ over rounds r of smax(bytes_r / HBM, unit / SM) + [s > 1] · (REDUCE + partials / HBM)`
///
/// - units = `tiles · s`, taken by the persistent CTAs in rounds of `sm_count`; `bytes_r` is
///   round `r`'s share of B (16 KiB per K block of a unit: A comes from L2), so a last round of
///   few units is limited by what one SM streams, not by DRAM;
/// - `unit`: one unit's bytes, `⌈k_blocks / s⌉ · 16 KiB`; `SM`: the bytes per µs one SM's
///   pipeline streams through the tile ([`decode_sm_rate`]);
/// - `smax(x, y) = (x⁸ + y⁸)^⅛`: the larger, plus a little where the two limits meet (measured:
///   at M = 64, 7168 × 16384 unsplit, each limit alone predicts 42 µs of streaming, 44 ran);
/// - the split's cost: the K ranges' meeting in the last CTA of each tile, a chain of L2 round
///   trips after the last range's K loop ([`DECODE_REDUCE_US`]), and the f32 partials written
///   and read back, `2 · 4 · s · outputs` bytes.
///
/// Splits range over 1..=16 with at least `MIN_SPLIT_K_BLOCKS` K blocks each; ties go to the
/// smaller split. Checked against a sweep of splits 1–8 on the decode set (docs/PERF.md, v34).
pub fn decode_split(
    tile: Tile,
    tiles: usize,
    k_blocks: usize,
    outputs: usize,
    sm_count: u32,
) -> u32 {
    let sms = sm_count.max(1) as usize;
    let block = (tile.block_n * BLOCK_K) as f64;
    let smax = |x: f64, y: f64| (x.powi(8) + y.powi(8)).powf(0.125);
    let cost = |s: usize| {
        let units = tiles.max(1) * s;
        let unit = k_blocks.div_ceil(s) as f64 * block / decode_sm_rate(tile);
        let all = (tiles.max(1) * k_blocks) as f64 * block / DECODE_HBM_BYTES_PER_US;
        let mut t = 0.0;
        for r in 0..units.div_ceil(sms) {
            let in_round = (units - r * sms).min(sms);
            t += smax(all * in_round as f64 / units as f64, unit);
        }
        if s > 1 {
            t += DECODE_REDUCE_US + (8 * s * outputs) as f64 / DECODE_HBM_BYTES_PER_US;
        }
        t
    };
    let most = (k_blocks / MIN_SPLIT_K_BLOCKS).clamp(1, 16);
    (1..=most).fold(1, |best, s| if cost(s) < cost(best) { s } else { best }) as u32
}

/// DRAM bytes per µs that a swapped-tile GEMM streams B at (fitted to the decode sweep on the
/// H100: 93% of its 3.0 TB/s copy ceiling once the launch's constant costs are set apart).
pub const DECODE_HBM_BYTES_PER_US: f64 = 2.78e6;

/// Bytes of B per µs one SM streams through a swapped tile's pipeline when DRAM is not the limit
/// (fitted to the unsplit shapes with fewer tiles than SMs): the wider the tile, the more MMA
/// work per byte.
pub fn decode_sm_rate(tile: Tile) -> f64 {
    match tile.block_m() {
        16 => 86e3,
        32 => 68e3,
        _ => 50e3,
    }
}

/// What a split adds after the K loop, µs: fitted to the v34 sweep, when a reduction kernel
/// followed the GEMM; the v35 sweep, with the partials summed by the last CTA of each tile,
/// measured the same within ±5% (docs/PERF.md, v35).
pub const DECODE_REDUCE_US: f64 = 2.2;

/// CTAs per cluster: 256- and 192-row tiles and the wide tiles go in pairs along N (the pair
/// shares the A tile by TMA multicast, halving its L2 reads) when the tiles fill at least one round
/// and pairing them (units of two tiles on half as many pairs of SMs) takes no more rounds (a
/// pair whose second tile is past N still takes a slot). Pairs along M (sharing B) and 128 × 128
/// tiles in pairs measured slower (docs/PERF.md, v9–v10, v20): they run alone. (The wide tiles'
/// costs were measured in pairs along N; 128 × 192 alone was within 1–3% of its pairs, v36.)
fn cluster(tile: Tile, m_tiles: usize, n_tiles: usize, l: usize, sm_count: u32) -> ClusterShape {
    let alone = ClusterShape { m: 1, n: 1 };
    let sms = sm_count.max(2) as usize;
    let tiles = m_tiles * n_tiles * l;
    if tiles < sms {
        return alone;
    }
    let rounds = tiles.div_ceil(sms);
    let pair_rounds =
        |cm: usize, cn: usize| (m_tiles.div_ceil(cm) * n_tiles.div_ceil(cn) * l).div_ceil(sms / 2);
    if (tile.block_m() > 128 || tile.is_wide()) && pair_rounds(1, 2) <= rounds {
        ClusterShape { m: 1, n: 2 }
    } else {
        alone
    }
}

/// The sm90 MX configuration `choose` uses (the runner starts from it when it forces a field).
///
/// Tile: rounds × the time of one tile, as for [`sm90_default`]: a 128 × 256 tile costs
/// [`MX_N256_COST`] 128 × 128 tiles. Split-K where the tiles fill less than half the SMs (small
/// M: decode), with the split's cost in 64-wide K blocks. Band: [`GROUP_ROWS`] rows of A.
pub fn sm90_mx_default(m: usize, n: usize, k: usize, l: usize, sm_count: u32) -> Sm90MxConfig {
    let tiles =
        |t: MxTile| m.div_ceil(mx::BLOCK_M as usize) * n.div_ceil(t.block_n as usize) * l.max(1);
    let cost = |t: MxTile| {
        let rounds = tiles(t).div_ceil(sm_count.max(1) as usize) as f64;
        rounds * if t == MxTile::N256 { MX_N256_COST } else { 1.0 }
    };
    let tile = if cost(MxTile::N256) <= cost(MxTile::N128) {
        MxTile::N256
    } else {
        MxTile::N128
    };
    let k_blocks = k.div_ceil(mx::BLOCK_K as usize);
    let m_tiles = m.div_ceil(mx::BLOCK_M as usize);
    Sm90MxConfig {
        tile,
        group_m: m_tiles.clamp(1, (GROUP_ROWS / mx::BLOCK_M) as usize) as u32,
        ctas: sm_count.max(1),
        split_k: split_k(tiles(tile), k_blocks, sm_count, MX_SPLIT_K_COST_BLOCKS),
    }
}

/// Time of a 128 × 256 MX tile in 128 × 128 tiles: twice the MACs, read with fewer shared-memory
/// bytes per MAC (a first estimate; docs/PERF.md, v24).
pub const MX_N256_COST: f64 = 1.8;

/// Smallest M for which MX and NVFP4 pairs run folded onto the FP8 kernel ([`Plan::Sm90MxFp8`])
/// rather than on the MX kernel: the pre-pass converts each operand once, where the MX kernel
/// converts A once per N tile and B once per M tile, and FP8 `wgmma` runs at twice bf16's rate.
/// Measured at M × 7168 × 4096 (docs/PERF.md, v30, µs, fold against MX kernel): at M = 128 the MX
/// kernel wins (MXFP8 39.1 against 48.5, NVFP4 36.2 against 43.4, MXFP4 36.6 against 42.4),
/// from M = 256 the fold (MXFP8 53.2 against 61.0, NVFP4 48.5 against 55.3, MXFP4 46.9 against
/// 56.5).
pub const FOLD_MIN_M: usize = 256;

/// Largest M for which e2m1 pairs run the 4-bit-weights kernel rather than the MX kernel
/// (measured, docs/PERF.md v27: faster at M ≤ 16, slower at M = 128).
pub const W4_MAX_M: usize = 16;
/// Split-K's cost for the 4-bit-weights kernel, in K blocks (see [`split_k`]).
const W4_SPLIT_K_COST_BLOCKS: usize = 8;

/// The sm90 4-bit-weights configuration: 16 activation rows per tile when M fits one (decode),
/// else 128; K split where the tiles leave most SMs idle.
pub fn sm90_w4_default(m: usize, n: usize, k: usize, l: usize, sm_count: u32) -> Sm90W4Config {
    let tile = if m <= 16 { W4Tile::N16 } else { W4Tile::N128 };
    let weight_tiles = n.div_ceil(w4::WEIGHT_ROWS as usize);
    let tiles = weight_tiles * m.div_ceil(tile.n as usize) * l.max(1);
    Sm90W4Config {
        tile,
        group_m: weight_tiles.clamp(1, (GROUP_ROWS / w4::WEIGHT_ROWS) as usize) as u32,
        ctas: sm_count.max(1),
        split_k: split_k(
            tiles,
            k.div_ceil(w4::BLOCK_K as usize),
            sm_count,
            W4_SPLIT_K_COST_BLOCKS,
        ),
    }
}
/// What a split costs the MX kernel, in 64-wide K blocks of one tile (the FP8
/// kernel's 10 blocks of 128).
const MX_SPLIT_K_COST_BLOCKS: usize = 20;

/// Split-K when the tiles fill less than half the SMs: as many K ranges as keep every CTA busy
/// without a second round, each at least [`MIN_SPLIT_K_BLOCKS`] K blocks long, and only when the
/// shorter K loop saves more than the split costs (`cost_blocks`).
fn split_k(tiles: usize, k_blocks: usize, sm_count: u32, cost_blocks: usize) -> u32 {
    if 2 * tiles > sm_count as usize {
        return 1;
    }
    let split = (sm_count as usize / tiles.max(1))
        .min(k_blocks / MIN_SPLIT_K_BLOCKS)
        .max(1);
    if k_blocks.div_ceil(split) + cost_blocks < k_blocks {
        split as u32
    } else {
        1
    }
}

/// Shortest K range of a split, in blocks of 128.
const MIN_SPLIT_K_BLOCKS: usize = 4;
/// What the f32 workspace round trip and the partials' sum cost, in K blocks of one 128×128
/// tile (docs/PERF.md, v8, v14–v15; unchanged by v35's sum in the last CTA, which measured the
/// same or faster at M = 128).
const SPLIT_K_COST_BLOCKS: usize = 10;

/// Time of one tile in units of a 128 × 128 tile's, measured on the H100 with every SM busy
/// (8192 × 8192 × 2048, each tile alone or in its pairs; docs/PERF.md, v36): 256 × 128 1.86,
/// 192 × 128 1.50, 128 × 192 1.55, 128 × 160 1.41, 128 × 144 1.42 (the narrower wide tiles do
/// less work per shared-memory byte of their epilogue boxes and per MMA: per FLOP 0.89 and 0.79 of
/// a 128 × 128 tile, where 256 × 128 does 1.07); 128 × 64 0.6 (v22: the cost that reproduces
/// every measured choice at M = 128, where these shapes wait on memory, not on the tensor cores).
/// With rounds × these costs, the choice on a sweep of 16 shapes (M 1024–8192, N 1536–24576,
/// K 1536–7168) ran within 2.5% of the fastest tile on every shape, 0.3% on average (v36).
pub fn tile_cost(t: Tile) -> f64 {
    match (t.block_m(), t.block_n) {
        (256, _) => 1.86,
        (192, _) => 1.5,
        (_, 192) => 1.55,
        (_, 160) => 1.41,
        (_, 144) => 1.42,
        (_, 64) => 0.6,
        _ => 1.0,
    }
}

/// Largest M for 128 × 64 tiles: they read A once per 64 columns instead of 128, which only
/// pays where A is a single tile that stays in L2 and B (from DRAM) is what the SMs wait for.
pub const N64_MAX_M: usize = 128;

/// Rows of A in one scheduler band: a band's A tiles (2048 × K bytes) stay small next to the
/// 50 MB L2 for K up to 16k (the band sweep: docs/PERF.md, v15).
pub const GROUP_ROWS: u32 = 2048;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fused_epilogues_need_a_fused_kernel_that_computes_c_and_scale_blocks_inside_a_pass() {
        let big = sm90_default(4096, 7168, 2048, 1, 132);
        let s = GemmShape {
            m: 4096,
            n: 7168,
            k: 2048,
            l: 1,
        };
        let with = |tile| Plan::Sm90Fp8(big.with_tile_for(tile, &s));
        let (e4m3, e5m2) = (ElemType::E4M3, ElemType::E5M2);
        let needs = |block_cols| FusedNeeds {
            block_cols,
            elems: (e4m3, e4m3),
            in_registers: sm90::InRegisters::No,
        };
        assert!(with(Tile::M128).check_fused(needs(0)).is_ok());
        assert!(Plan::Reference.check_fused(needs(0)).is_err());
        // Decode tiles compute Cᵀ.
        let decode = sm90_default(16, 7168, 2048, 1, 132);
        assert!(decode.tile.is_swapped());
        assert!(Plan::Sm90Fp8(decode).check_fused(needs(0)).is_err());
        // FP8 1×128 output (128 columns) on a 128-column tile; with SwiGLU (256) refused.
        assert!(with(Tile::M128).check_fused(needs(128)).is_ok());
        assert!(with(Tile::M128).check_fused(needs(256)).is_err());
        // Tiles and types without a fused kernel: refused whatever the output. The 192-row tile
        // runs the epilogues the consumers hold in registers, and only those.
        let regs = |block_cols| FusedNeeds {
            in_registers: sm90::InRegisters::Yes,
            ..needs(block_cols)
        };
        assert!(with(Tile::M192).check_fused(needs(0)).is_err());
        assert!(with(Tile::M192).check_fused(regs(0)).is_ok());
        assert!(with(Tile::M192).check_fused(regs(128)).is_ok());
        for t in [Tile::M256, Tile::M128N64, Tile::M128N144, Tile::M128N192] {
            assert!(with(t).check_fused(needs(0)).is_err(), "{t:?}");
            assert!(with(t).check_fused(regs(0)).is_err(), "{t:?}");
        }
        let e5 = FusedNeeds {
            block_cols: 0,
            elems: (e4m3, e5m2),
            in_registers: sm90::InRegisters::No,
        };
        assert!(
            with(Tile::M192)
                .check_fused(FusedNeeds {
                    in_registers: sm90::InRegisters::Yes,
                    ..e5
                })
                .is_err()
        );
        assert!(with(Tile::M128).check_fused(e5).is_err());
        // MXFP8 folds to FP8 of its own element types: e4m3 fuses there, e5m2 does not.
        let folded = Plan::Sm90MxFp8(big.with_tile_for(Tile::M128, &s));
        assert!(folded.check_fused(needs(0)).is_ok());
        assert!(folded.check_fused(e5).is_err());
        let half = Sm90HalfConfig {
            tile: HalfTile::M128N256,
            ..sm90_half_default(4096, 4096, 132)
        };
        let bf16 = FusedNeeds {
            block_cols: 0,
            elems: (ElemType::BF16, ElemType::BF16),
            in_registers: sm90::InRegisters::Yes,
        };
        assert!(Plan::Sm90Half(half).check_fused(bf16).is_err());
        let half = Sm90HalfConfig {
            tile: HalfTile::M128,
            ..half
        };
        assert!(Plan::Sm90Half(half).check_fused(bf16).is_ok());
        let mx = sm90_mx_default(128, 4096, 4096, 1, 132);
        let mx = |tile| Plan::Sm90Mx(Sm90MxConfig { tile, ..mx });
        assert!(mx(MxTile::N256).check_fused(e5).is_ok());
        assert!(mx(MxTile::N128).check_fused(e5).is_err());
    }

    #[test]
    fn fused_plans_move_to_the_tiles_and_kernels_that_fuse() {
        use crate::format::{Fp8, Recipe};
        let h100 = 132;
        let s = GemmShape {
            m: 4096,
            n: 7168,
            k: 2048,
            l: 1,
        };
        let desc = |r: Recipe, rows, b| MatrixDesc::of_recipe(r, rows, 2048, b);
        let fused_with = |r: Recipe, in_registers| {
            let (a, b) = (desc(r, 4096, false), desc(r, 7168, true));
            let needs = FusedNeeds {
                block_cols: 0,
                elems: (a.format.elem, b.format.elem),
                in_registers,
            };
            choose_fused(GpuArch::Hopper, h100, &s, (&a, &b), needs)
        };
        let fused = |r: Recipe| fused_with(r, sm90::InRegisters::No);
        // DeepSeek FP8: the plain plan's tall tile moves to the fused 128 × 128 tile.
        let plain = choose_for(
            GpuArch::Hopper,
            h100,
            &s,
            &desc(Recipe::DeepSeekFp8, 4096, false),
            &desc(Recipe::DeepSeekFp8, 7168, true),
        )
        .unwrap();
        assert!(
            plain
                .check_fused(FusedNeeds {
                    block_cols: 0,
                    elems: (ElemType::E4M3, ElemType::E4M3),
                    in_registers: sm90::InRegisters::No,
                })
                .is_err()
        );
        assert!(matches!(fused(Recipe::DeepSeekFp8), Ok(Plan::Sm90Fp8(c)) if c.tile == Tile::M128));
        // An epilogue the consumers hold in registers moves to the 128 × 128 tile too (the plain
        // plan's 256-row tile has no such kernel).
        assert!(
            matches!(fused_with(Recipe::DeepSeekFp8, sm90::InRegisters::Yes), Ok(Plan::Sm90Fp8(c)) if c.tile == Tile::M128)
        );
        // MXFP8 e4m3 stays folded onto FP8; e5m2 moves to the exact MX kernel's fused tile.
        assert!(matches!(
            fused(Recipe::Mxfp8(Fp8::E4M3)),
            Ok(Plan::Sm90MxFp8(_))
        ));
        assert!(
            matches!(fused(Recipe::Mxfp8(Fp8::E5M2)), Ok(Plan::Sm90Mx(c)) if c.tile == MxTile::N256)
        );
        // e5m2 DeepSeek-style FP8 has no fused kernel: a typed error.
        assert!(matches!(
            fused(Recipe::Fp8PerRow(Fp8::E5M2)),
            Err(Error::Config(_))
        ));
        // Where the plain plan folds e5m2 onto FP8 (M = 256), the fused one is the MX kernel's
        // fused tile too, not its plain default.
        let small = GemmShape {
            m: 256,
            n: 512,
            k: 1024,
            l: 1,
        };
        let r = Recipe::Mxfp8(Fp8::E5M2);
        let (a, b) = (
            MatrixDesc::of_recipe(r, 256, 1024, false),
            MatrixDesc::of_recipe(r, 512, 1024, true),
        );
        let plain = choose_for(GpuArch::Hopper, h100, &small, &a, &b).unwrap();
        assert!(matches!(plain, Plan::Sm90MxFp8(_)), "{plain:?}");
        let needs = FusedNeeds {
            block_cols: 0,
            elems: (a.format.elem, b.format.elem),
            in_registers: sm90::InRegisters::No,
        };
        assert!(matches!(
            choose_fused(GpuArch::Hopper, h100, &small, (&a, &b), needs),
            Ok(Plan::Sm90Mx(c)) if c.tile == MxTile::N256
        ));
    }

    #[test]
    fn tall_tiles_for_large_m_short_tiles_where_they_would_idle_sms() {
        let h100 = 132;
        assert_eq!(sm90_default(8192, 8192, 8192, 1, h100).tile.block_m(), 256);
        assert_eq!(sm90_default(4096, 7168, 2048, 1, h100).tile.block_m(), 256);
        // One 256-row tile per N tile would be half empty.
        assert_eq!(sm90_default(128, 7168, 2048, 1, h100).tile.block_m(), 128);
        assert_eq!(sm90_default(200, 2112, 7168, 1, h100).tile.block_m(), 128);
        // 4096 × 2112: 374 tiles of 192 rows are 3 rounds (544 of 128 rows are 5; 272 of 256
        // rows 3, at 1.86 each; 352 of 128 × 192 3, at 1.55).
        assert_eq!(sm90_default(4096, 2112, 7168, 1, h100).tile.block_m(), 192);
        for (m, n) in [(8192, 8192), (4096, 2112), (200, 2112), (256, 7168)] {
            assert_eq!(
                sm90_default(m, n, 2048, 1, h100).tile.block_n,
                128,
                "{m}×{n}"
            );
        }
    }

    /// The v36 tile sweep (docs/PERF.md): per shape, the tile the cost model picks. Each ran
    /// within 2.5% of the fastest of the six tiles measured there (0.3% on average).
    #[test]
    fn tiles_follow_the_measured_sweep() {
        let sweep = [
            ((4096, 2112, 7168), Tile::M192),
            ((4096, 7168, 2048), Tile::M256),
            ((8192, 8192, 2048), Tile::M256),
            ((2048, 7168, 2048), Tile::M128),
            ((2048, 2112, 7168), Tile::M128N160),
            ((4096, 4096, 2048), Tile::M256),
            ((1024, 7168, 7168), Tile::M256),
            ((2048, 24576, 1536), Tile::M256),
            ((4096, 1536, 7168), Tile::M192),
            ((8192, 2112, 2048), Tile::M192),
            ((1536, 8192, 4096), Tile::M256),
            ((3072, 3072, 4096), Tile::M192),
            ((4096, 5120, 2048), Tile::M256),
            ((6144, 6144, 2048), Tile::M256),
            ((1024, 4096, 7168), Tile::M256),
            ((4096, 12288, 2048), Tile::M256),
        ];
        for ((m, n, k), tile) in sweep {
            let cfg = sm90_default(m, n, k, 1, 132);
            assert_eq!(cfg.tile, tile, "{m}×{n}×{k}");
        }
        // Wide tiles go in pairs along N where pairing costs no round, as they were measured.
        let wide = sm90_default(2048, 2112, 7168, 1, 132);
        assert_eq!(wide.cluster, ClusterShape { m: 1, n: 2 });
        // At M ≤ 128 (memory-bound) they are not candidates, nor for grouped GEMM (no grouped
        // wide kernels).
        for n in [2112, 7168, 24576, 32768] {
            assert!(!sm90_default(128, n, 2048, 1, 132).tile.is_wide(), "{n}");
        }
        let grouped = sm90_grouped_default(16 * 2048, 2112, 7168, 16, 2048, 132);
        assert!(!grouped.tile.is_wide(), "{grouped:?}");
        let e4m3 = blockscaled_kernels::format::ElemType::E4M3;
        assert!(
            blockscaled_kernels::sm90::kernel(
                grouped.tile,
                e4m3,
                e4m3,
                blockscaled_kernels::gemm::Mode::Grouped
            )
            .is_some()
        );
    }

    #[test]
    fn narrow_tiles_only_for_one_row_of_tiles_that_leaves_sms_idle() {
        let h100 = 132;
        let tile = |m, n, k| {
            let c = sm90_default(m, n, k, 1, h100);
            (c.tile.block_m(), c.tile.block_n)
        };
        // 56 tiles of 128 columns on 132 SMs: 112 of 64.
        assert_eq!(tile(128, 7168, 2048), (128, 64));
        // 2 rounds of 192 tiles against 3 rounds of 384 half tiles.
        assert_eq!(tile(128, 24576, 1536), (128, 64));
        // 256 tiles are 2 rounds; 512 half tiles 4.
        assert_eq!(tile(128, 32768, 512), (128, 128));
        // Never with more than one row of tiles (A is read once per 64 columns).
        assert_eq!(tile(129, 7168, 2048).1, 128);
        for (m, n, l) in [(1, 1, 1), (8192, 8192, 1), (128, 2112, 3)] {
            let c = sm90_default(m, n, 1024, l, h100);
            assert!(
                c.group_m >= 1 && c.group_m * c.tile.block_m() <= GROUP_ROWS.max(c.tile.block_m())
            );
            assert_eq!(c.ctas, h100);
        }
    }

    #[test]
    fn pairs_only_where_they_cost_no_extra_round() {
        let h100 = 132;
        let cl = |m, n, k| {
            let c = sm90_default(m, n, k, 1, h100);
            (c.cluster.m, c.cluster.n)
        };
        // 256-row tiles, even tile counts: pairs along N (share A).
        assert_eq!(cl(8192, 8192, 8192), (1, 2));
        assert_eq!(cl(4096, 7168, 2048), (1, 2));
        // 192-row tiles pair along N too (22 × 9 pairs fill 3 rounds, as 374 tiles do alone);
        // 128-row tiles run alone.
        assert_eq!(cl(4096, 2112, 7168), (1, 2));
        assert_eq!(cl(128, 24576, 1536), (1, 1));
        // 256-row tiles with an odd number of N tiles where pairing adds a round: alone. (4224
        // columns: 33 N tiles; 2048 rows: 8 M tiles; 264 tiles = 2 rounds, 8 × 17 = 136 pairs on
        // 66 pair slots = 3 rounds.)
        assert_eq!(sm90_default(2048, 4224, 7168, 1, h100).tile.block_m(), 256);
        assert_eq!(cl(2048, 4224, 7168), (1, 1));
        // Fewer tiles than SMs, or split-K: alone.
        assert_eq!(cl(256, 1024, 1024), (1, 1));
        assert_eq!(cl(128, 2112, 7168), (1, 1));
        for (m, n) in [(1, 1), (8192, 8192), (4096, 2112), (100, 100_000)] {
            let (a, b) = cl(m, n, 1024);
            assert!(a * b <= 2 && a >= 1 && b >= 1);
        }
    }

    #[test]
    fn split_k_only_where_tiles_leave_most_sms_idle() {
        let h100 = 132;
        // 33 tiles of 128 × 64 × 4 ranges of 14 K blocks = 132 CTAs.
        assert_eq!(sm90_default(128, 2112, 7168, 1, h100).split_k, 4);
        // 64 tiles × 2 = 128 CTAs.
        assert_eq!(sm90_default(128, 4096, 7168, 1, h100).split_k, 2);
        // 384 tiles fill the GPU; 1024 tiles too.
        assert_eq!(sm90_default(128, 24576, 1536, 1, h100).split_k, 1);
        assert_eq!(sm90_default(4096, 4096, 7168, 1, h100).split_k, 1);
        // Too little K to split: 512 = 4 blocks is one range of 4; at K = 2048 (16 blocks) two
        // ranges of 8 save less than the split costs (docs/PERF.md, v8).
        assert_eq!(sm90_default(128, 128, 512, 1, h100).split_k, 1);
        assert_eq!(sm90_default(128, 7168, 2048, 1, h100).split_k, 1);
        // 112 tiles of 128 × 64: no split (at 128 columns, 56 tiles took 2).
        assert_eq!(sm90_default(128, 7168, 16384, 1, h100).split_k, 1);
        assert_eq!(sm90_default(128, 7168, 16384, 1, h100).tile.block_n, 64);
        for (m, n, k) in [(1, 1, 128), (64, 64, 128 * 300), (128, 2112, 7168)] {
            let c = sm90_default(m, n, k, 1, h100);
            assert!(c.split_k >= 1 && c.split_k as usize <= k / 128);
        }
    }

    #[test]
    fn decode_sizes_take_the_swapped_tile_that_holds_m_and_split_as_measured() {
        let h100 = 132;
        for (m, rows) in [(1, 16), (16, 16), (17, 32), (32, 32), (33, 64), (64, 64)] {
            let c = sm90_default(m, 7168, 16384, 1, h100);
            assert_eq!(
                (c.tile, c.cluster),
                (Tile::swapped(rows), ClusterShape::ONE)
            );
            assert!(
                c.validate(&GemmShape {
                    m,
                    n: 7168,
                    k: 16384,
                    l: 1
                })
                .is_ok()
            );
        }
        assert!(!sm90_default(65, 7168, 2048, 1, h100).tile.is_swapped());
        // 33 to 64 rows: swapped only from K = 4096.
        assert!(!sm90_default(64, 7168, 2048, 1, h100).tile.is_swapped());
        assert!(sm90_default(64, 7168, 4096, 1, h100).tile.is_swapped());
        let split = |m, n, k| sm90_default(m, n, k, 1, h100).split_k;
        // The decode sweep (docs/PERF.md, v34): the splits measured within 7% of the fastest
        // (and the untimed ones between two such).
        for (m, n, k, best) in [
            (16, 7168, 16384, &[1, 2, 3, 4][..]),
            (16, 2112, 7168, &[3, 4, 5, 6, 7][..]),
            (16, 24576, 1536, &[1][..]),
            (16, 32768, 512, &[1][..]),
            (16, 4096, 7168, &[1, 3, 4][..]),
            (16, 7168, 2048, &[1][..]),
            (64, 7168, 16384, &[1, 2][..]),
            (64, 2112, 7168, &[3, 4, 5, 6][..]),
            (64, 4096, 7168, &[2, 3, 4][..]),
        ] {
            let s = split(m, n, k);
            assert!(
                best.contains(&s),
                "{m}×{n}×{k}: split {s}, measured best {best:?}"
            );
        }
    }

    #[test]
    fn sixteen_bit_pairs_of_one_type_run_the_16_bit_kernel_and_mixed_ones_the_reference() {
        use crate::format::{Fp4Weights, Recipe};
        let desc = |elem: ElemType, rows: usize, k: usize| {
            let mut d = MatrixDesc::of_recipe(Recipe::W4A16(Fp4Weights::Nvfp4), rows, k, false);
            d.format.elem = elem;
            d
        };
        let (bf, hf) = (ElemType::BF16, ElemType::F16);
        for (ta, tb, half) in [
            (bf, bf, true),
            (hf, hf, true),
            (bf, hf, false),
            (hf, bf, false),
        ] {
            let (a, b) = (desc(ta, 1000, 4096), desc(tb, 3000, 4096));
            let p = choose(GpuArch::Hopper, 132, &a, &b).unwrap();
            assert_eq!(
                matches!(p, Plan::Sm90Half(_)),
                half,
                "{ta:?} × {tb:?}: {p:?}"
            );
            if !half {
                assert_eq!(p, Plan::Reference, "{ta:?} × {tb:?}");
            }
        }
        // Large shapes: 128 × 256 tiles in pairs; few tiles: 256 × 128 alone, then 128 × 128.
        let big = sm90_half_default(4096, 4096, 132);
        assert_eq!(
            (big.tile, big.cluster_m, big.group_m),
            (HalfTile::M128N256, 2, 8)
        );
        assert_eq!(sm90_half_default(2048, 2048, 132).tile, HalfTile::M128N256);
        assert_eq!(sm90_half_default(512, 4096, 132).tile, HalfTile::M128);
        assert_eq!(sm90_half_default(256, 512, 132).tile, HalfTile::M128N64);
        // K not a multiple of 8 (TMA's 16-byte rows): the reference kernel.
        let (a, b) = (desc(hf, 64, 100), desc(hf, 64, 100));
        assert_eq!(
            choose(GpuArch::Hopper, 132, &a, &b).unwrap(),
            Plan::Reference
        );
    }

    #[test]
    fn grouped_plans_fold_what_folds_to_e4m3_and_keep_the_rest_exact() {
        use crate::format::{Fp4Weights, Fp8, Recipe};
        let descs = |r: Recipe| {
            let (a, mut b) = (
                MatrixDesc::of_recipe(r, 1024, 7168, false),
                MatrixDesc::of_recipe(r, 4096, 7168, true),
            );
            b.batch = 8;
            (a, b)
        };
        let kind = |p: Result<Plan>| match p.unwrap() {
            Plan::Sm90Fp8(_) => "fp8",
            Plan::Sm90MxFp8(_) => "fold",
            Plan::Sm90Mx(_) => "mx",
            Plan::Sm90W4(_) => "w4",
            Plan::Reference => "ref",
            Plan::Sm90Half(_) => "half",
        };
        let hopper = GpuArch::Hopper;
        fn problem<'a>(arch: GpuArch, a: &'a MatrixDesc, b: &'a MatrixDesc) -> GroupedProblem<'a> {
            let shape = GemmShape {
                m: 1024,
                n: 4096,
                k: 7168,
                l: 1,
            };
            GroupedProblem {
                arch,
                sm_count: 132,
                shape,
                a,
                b,
                groups: 8,
            }
        }
        for (r, chosen, exact) in [
            (Recipe::DeepSeekFp8, "fp8", "fp8"),
            (Recipe::Mxfp4, "fold", "mx"),
            (Recipe::Nvfp4, "mx", "mx"),
            (Recipe::Mxfp8(Fp8::E4M3), "mx", "mx"),
            (Recipe::W4A8(Fp4Weights::Nvfp4), "fold", "w4"),
            // e5m2 folds to e5m2, which has no grouped FP8 kernel.
            (Recipe::Mxfp8(Fp8::E5M2), "mx", "mx"),
            (Recipe::W4A8(Fp4Weights::Mxfp4), "fold", "w4"),
            (Recipe::W4A16(Fp4Weights::Nvfp4), "w4", "w4"),
        ] {
            let (a, b) = descs(r);
            let p = problem(hopper, &a, &b);
            assert_eq!(kind(choose_grouped(&p)), chosen, "{r}");
            assert_eq!(kind(choose_grouped_exact(&p)), exact, "{r}");
        }
        // Experts folded once: MX and NVFP4 activations fold per call, FP8 ones run as they are.
        for (r, chosen) in [
            (Recipe::Mxfp4, "fold"),
            (Recipe::Nvfp4, "fold"),
            (Recipe::W4A8(Fp4Weights::Nvfp4), "fp8"),
        ] {
            let (a, b) = descs(r);
            let b = b.folded(true).unwrap();
            assert_eq!(
                kind(choose_grouped(&problem(hopper, &a, &b))),
                chosen,
                "{r}"
            );
        }
        let (a, b) = descs(Recipe::Mxfp4);
        let bw = choose_grouped(&problem(GpuArch::Blackwell, &a, &b));
        assert!(matches!(bw, Err(Error::Architecture(_))));
    }

    #[test]
    fn grouped_tiles_are_narrow_only_where_twice_the_tiles_fit_one_round() {
        let h100 = 132;
        let tile = |rows, n, groups, per| sm90_grouped_default(rows, n, 7168, groups, per, h100);
        // Seed case 3 (2 groups, 512 rows, N 3072): 5 × 24 = 120 tiles, one round at 128 columns.
        assert_eq!(tile(512, 3072, 2, 256).tile, Tile::M128);
        // Seed case 1 (8 groups, 1024 rows, N 4096): 12 × 32 tiles.
        assert_eq!(tile(1024, 4096, 8, 128).tile, Tile::M128);
        // One group of 100 rows, N 4096: 32 tiles, 64 half tiles fit one round.
        assert_eq!(tile(100, 4096, 1, 100).tile, Tile::M128N64);
        // Large groups take the dense rule, without split-K.
        let large = tile(32768, 4096, 4, 8192);
        assert_eq!((large.tile.block_m(), large.split_k), (256, 1));
    }
}
