//! Which kernel runs a GEMM, and with what configuration: one function, rules stated as data.
//! A family (`crate::families`) appears here as a [`Plan`] variant holding its configuration,
//! a rule in [`choose`] (asking the families which operands they take, and their configuration
//! rules for the shape), and an arm of `Plan::launch`; nothing of a family lives on
//! [`Gpu`](crate::Gpu) or the device buffers. The choice between families (the thresholds
//! below) is the plan's; each family's own rules and tuning constants are in its folder.

pub mod cache;
mod candidates;
pub use crate::families::heuristic::Hardware;
pub use candidates::{candidates, grouped_candidates};

use crate::error::{Error, Result, config, shape};
pub(crate) use crate::families::FusedNeeds;
use crate::families::fold::{self as sm90_mx_fp8, Sm90MxFp8};
use crate::families::fp8::{self as sm90_fp8, Sm90Config, Sm90Fp8};
use crate::families::half::{self as sm90_half, Sm90HalfConfig};
use crate::families::mx::{self as sm90_mx, Sm90MxConfig};
use crate::families::reference::Reference;
use crate::families::w4::{self as sm90_w4, Sm90W4Config};
use crate::families::{Families, Gemm, PlanConfig, Sizing};
use crate::format::{ElemType, ScaleType};
use crate::matrix::{GemmShape, MatrixDesc};
use crate::workspace::WorkspaceSize;
use blockscaled_kernels::format::fold::target as fold_target;
use blockscaled_kernels::sm90::{self, BLOCK_K, Mode, Tile};
use blockscaled_kernels::sm90_half::HalfTile;
use blockscaled_kernels::sm90_mx::MxTile;
use blockscaled_kernels::sm90_w4::stream;

#[cfg(test)]
mod tests;

pub use crate::families::fp8::heuristic::{
    sm90_bsr_default, sm90_decode_default, sm90_default, sm90_grouped_default,
};
pub use crate::families::half::heuristic::{sm90_half_bsr_default, sm90_half_default};
pub use crate::families::mx::heuristic::sm90_mx_default;
pub use crate::families::w4::heuristic::{
    sm90_w4_default, sm90_w4_fp8_default, sm90_w4_stream_default,
};

/// Smallest M for which MX and NVFP4 pairs run folded onto the FP8 kernel ([`Plan::Sm90MxFp8`])
/// rather than on the MX kernel: the pre-pass converts each operand once, where the MX kernel
/// converts A once per N tile and B once per M tile, and FP8 `wgmma` runs at twice bf16's rate.
/// Measured at M × 7168 × 4096 (docs/perf-log, MX operands folded, µs, fold against MX kernel): at M = 128 the MX
/// kernel wins (MXFP8 39.1 against 48.5, NVFP4 36.2 against 43.4, MXFP4 36.6 against 42.4),
/// from M = 256 the fold (MXFP8 53.2 against 61.0, NVFP4 48.5 against 55.3, MXFP4 46.9 against
/// 56.5).
pub(crate) const FOLD_MIN_M: usize = 256;

/// Largest M for which e2m1 pairs with e8m0 scales run on the 4-bit-weights kernels with A folded
/// per call (the stream kernel to 16 rows, the FP8-MMA kernel above: one 128-row activation
/// tile) rather than with both operands folded onto the FP8 kernel, which is faster from the
/// second activation tile on. Measured on the H200 at M × 7168 × 4096 (MXFP4, µs, A folded
/// against both folded against the MX kernel): 33.1 / 35.4 / 37.5 at M = 32, 33.5 / 39.4 / 38.0
/// at 128, 44.1 / 43.5 / 58.3 at 192 (docs/perf-log/w4.md).
pub(crate) const W4A4_FP8_MAX_M: usize = 128;

/// Rows from which 4-bit weights with e8m0 scales and FP8 activations (W4A8 MXFP4) run with the
/// weights folded to FP8 per call on the FP8 kernel rather than on the 4-bit-weights kernels,
/// dense or as contiguous groups of that many rows on average: past one 128-row activation tile,
/// as for e2m1 pairs ([`W4A4_FP8_MAX_M`]). Measured on the H200 (the tuner, µs, 4-bit-weights kernel against
/// folded, DeepSeek-V3 layers): W4A8 MXFP4 at 4096 rows 269.2 / 118.3 (× 7168 × 2048), 452.6 /
/// 205.6 (× 4096 × 7168), 1730.8 / 785.3 (× 7168 × 16384); grouped, 8 experts of 512 rows on
/// average 303.1 / 205.4 (× 7168 × 2048), of 2048 rows 1043.6 / 487.2; at 128 rows the kernel
/// wins (27.7 against 33.5, docs/perf-log/w4.md), and on the seed's grouped cases of about 128
/// rows a group (173.3 / 115.9 against 204.6 / 125.2 folded).
pub(crate) const W4A8_FOLD_MIN_M: usize = W4A4_FP8_MAX_M + 1;

/// Largest M for which e2m1 pairs run the 4-bit-weights kernel rather than the MX kernel
/// (measured, docs/perf-log, the 4-bit-weights kernel: faster at M ≤ 16, slower at M = 128).
pub(crate) const W4_MAX_M: usize = 16;

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
    /// The plan as one line of text: its family's name and its configuration's fields as
    /// numbers, in their order (`"fp8 2 1 128 0 2 1 8 132 1"`); what the tuner's cache stores.
    pub fn to_text(&self) -> String {
        use crate::config::Words;
        let mut words = Vec::new();
        let name = match self {
            Plan::Reference => "reference",
            Plan::Sm90Fp8(c) => {
                c.put(&mut words);
                "fp8"
            }
            Plan::Sm90Mx(c) => {
                c.put(&mut words);
                "mx"
            }
            Plan::Sm90W4(c) => {
                c.put(&mut words);
                "w4"
            }
            Plan::Sm90MxFp8(c) => {
                c.put(&mut words);
                "fold"
            }
            Plan::Sm90Half(c) => {
                c.put(&mut words);
                "half"
            }
        };
        words
            .iter()
            .fold(name.to_string(), |t, w| format!("{t} {w}"))
    }

    /// The plan [`Plan::to_text`] wrote, or `None` where `text` is not one (an unknown family,
    /// a field count or value of another version). Whether it can run a shape is
    /// [`Plan::validate`]'s.
    pub fn from_text(text: &str) -> Option<Plan> {
        use crate::config::Words;
        let mut parts = text.split_ascii_whitespace();
        let name = parts.next()?;
        let words: Vec<u32> = parts.map(|w| w.parse().ok()).collect::<Option<_>>()?;
        let mut it = words.into_iter();
        let plan = match name {
            "reference" => Plan::Reference,
            "fp8" => Plan::Sm90Fp8(Sm90Config::take(&mut it)?),
            "mx" => Plan::Sm90Mx(Sm90MxConfig::take(&mut it)?),
            "w4" => Plan::Sm90W4(Sm90W4Config::take(&mut it)?),
            "fold" => Plan::Sm90MxFp8(Sm90Config::take(&mut it)?),
            "half" => Plan::Sm90Half(Sm90HalfConfig::take(&mut it)?),
            _ => return None,
        };
        // Every word read, none left over.
        it.next().is_none().then_some(plan)
    }

    /// The plan's configuration as its family runs it ([`PlanConfig`]), handed to `f`: the one
    /// place that tells the variants apart for validation, sizing, fused epilogues and launch.
    fn with_config<R>(&self, f: impl FnOnce(&dyn PlanConfig) -> R) -> R {
        match *self {
            Plan::Reference => f(&Reference),
            Plan::Sm90Fp8(c) => f(&c),
            Plan::Sm90Mx(c) => f(&c),
            Plan::Sm90W4(c) => f(&c),
            Plan::Sm90MxFp8(c) => f(&Folded(c)),
            Plan::Sm90Half(c) => f(&c),
        }
    }

    /// Checks that the plan's kernel can run a GEMM of `shape` with this configuration:
    /// [`Error::Config`] for a configuration the kernel is not built for or that does not fit
    /// the shape, [`Error::Shape`] for a shape past the kernel's limits. `Gpu::gemm_with` calls
    /// it once; the launch trusts what passes.
    pub fn validate(&self, shape: &GemmShape) -> Result<()> {
        self.with_config(|c| c.validate(shape))
    }

    /// [`Plan::validate`] for a grouped GEMM whose C is `shape` (`crate::grouped`): the plan's
    /// family must have a grouped kernel, and K is not split (each group's tiles are whole). The
    /// most units the groups can make is checked against the scheduler's 32 bits where the grid
    /// is sized (`Schedule::units`).
    pub fn validate_grouped(&self, shape: &GemmShape) -> Result<()> {
        self.validate(shape)?;
        match self.with_config(|c| c.grouped_split()) {
            None => Err(config(format!(
                "{self:?} has no grouped kernel: grouped GEMM runs on the sm90 FP8, MX, \
                 4-bit-weights and fold (MX → FP8) kernels"
            ))),
            Some(1) => Ok(()),
            Some(split) => Err(config(format!(
                "split_k = {split}: a grouped GEMM does not split K"
            ))),
        }
    }

    /// Launches the plan's kernel on `families` (the plan validated for `g.shape`). (What it does
    /// is on the device: every GPU test, whose outputs are poisoned first, checks it.)
    pub(crate) fn launch(&self, families: &Families, g: Gemm<'_, '_>) -> Result<()> {
        self.with_config(|c| match c.unsupported(&g.a.desc, &g.b.desc) {
            Some(e) => Err(Error::Format(e)),
            None => c.launch(families, g),
        })
    }

    /// The workspace a GEMM takes on this plan (`q`: its operands, shape, groups, and whether
    /// it has a fused epilogue or a quantized output): each family's own schedule, sized
    /// ([`crate::Gpu::workspace_size`]). (Sized from device operands: gpu_engine's
    /// `a_reserved_workspace_is_the_size_queried_and_a_call_in_it_allocates_nothing` checks it for
    /// split K, the fold and a fused epilogue's staging.)
    pub(crate) fn workspace(&self, q: &Sizing<'_>) -> Result<WorkspaceSize> {
        self.with_config(|c| c.workspace(q))
    }

    /// [`Error::Config`] when the plan's kernel cannot run a fused epilogue that `needs` this.
    pub(crate) fn check_fused(&self, needs: FusedNeeds) -> Result<()> {
        // The fused epilogue runs in kernels of its own (the plain ones carry none of its code):
        // is there one for this tile and these types (the families' kernel lists say)?
        let (n, fused_kernel) =
            self.with_config(|c| Ok::<_, Error>((c.fused_columns()?, c.has_fused_kernel(&needs))))?;
        let (ea, eb) = needs.elems;
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

/// MX and NVFP4 operands folded onto the FP8 kernel ([`Plan::Sm90MxFp8`]): the FP8
/// configuration, run by the fold family on the FP8 family's launch (the plan joins the two, so
/// that neither imports the other).
#[derive(Clone, Copy, Debug)]
struct Folded(Sm90Config);

impl PlanConfig for Folded {
    fn validate(&self, shape: &GemmShape) -> Result<()> {
        self.0.validate(shape)
    }

    fn grouped_split(&self) -> Option<u32> {
        Some(self.0.split_k)
    }

    /// The folded copies' and the FP8 launch's.
    fn workspace(&self, q: &Sizing<'_>) -> Result<WorkspaceSize> {
        let fold = Sm90MxFp8::workspace((q.a, q.b))?;
        let run = PlanConfig::workspace(&self.0, q)?;
        Ok(WorkspaceSize {
            fold: fold.fold,
            ..run
        })
    }

    fn fused_columns(&self) -> Result<u32> {
        self.0.fused_columns()
    }

    /// The FP8 kernel's, for the types the operands fold to.
    fn has_fused_kernel(&self, needs: &FusedNeeds) -> bool {
        let (ea, eb) = needs.elems;
        let elems = (fold_target(ea), fold_target(eb));
        self.0.has_fused_kernel(&FusedNeeds { elems, ..*needs })
    }

    fn launch(&self, families: &Families, g: Gemm<'_, '_>) -> Result<()> {
        let fp8 = families.require::<Sm90Fp8>(sm90_fp8::NEEDS_SM90)?;
        let what = "MX → FP8 fold kernel (it needs compute capability 9.0)";
        let cfg = self.0;
        families
            .require::<Sm90MxFp8>(what)?
            .gemm(g, |g, ops, types| fp8.run(g, ops, types, cfg))
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
    hw: Hardware,
    shape: &GemmShape,
    (a, b): (&MatrixDesc, &MatrixDesc),
    needs: FusedNeeds,
) -> Result<Plan> {
    let plan = choose_for(arch, hw, shape, a, b)?;
    let sm_count = hw.sm_count;
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

/// Picks the kernel for A (M×K) · Bᵀ (N×K) on `arch`, a GPU with the facts `hw`.
///
/// - Hopper, e4m3 or e5m2 with fp32 scales that are constant over 1×128 (A) and 128×128 (B)
///   blocks — DeepSeek, per-tensor, per-row — runs the sm90 kernel. Its 128-wide scale blocks
///   need K % 128 == 0: other K are an error rather than a silent 1000× slower path.
/// - Hopper, MXFP8 (e4m3 / e5m2, either pair), MXFP4, NVFP4 and e2m1 with e8m0 per 16 — both
///   operands of one code width and one scale format, K a multiple of the scale block and rows a
///   multiple of 16 bytes (TMA) — runs the sm90 MX kernel ([`sm90_mx_default`]), except that
///   e2m1 pairs with e8m0 scales and K a multiple of 128 run the 4-bit-weights kernels with A
///   folded per call to M ≤ `W4A4_FP8_MAX_M` (the stream kernel to 16 rows, the FP8-MMA kernel
///   above) and fold both operands above it, other e2m1 pairs with M ≤ `W4_MAX_M` run the
///   4-bit-weights kernel, and pairs with M ≥ `FOLD_MIN_M` and K a multiple of 128 run folded
///   onto the FP8 kernel
///   ([`Plan::Sm90MxFp8`]: lossy, within each format's own quantization error; A's fold alone
///   is exact but where a row's 128 span more than 2^14 or an element falls below e4m3's normal
///   range after its shift).
/// - Hopper, bf16 × bf16 or fp16 × fp16 (one scale per tensor, K a multiple of 8) runs the sm90
///   16-bit kernel ([`sm90_half_default`]); a bf16 × fp16 pair runs the reference kernel.
/// - Hopper, 4-bit weights (e2m1 B with MX or NVFP4 scales) with bf16 activations (W4A16) or
///   e4m3 ones with fp32 scales per 1×128 (W4A8) runs the sm90 4-bit-weights kernel
///   ([`sm90_w4_default`]); W4A16 and W4A8 with M ≤ 16 run its stream kernel
///   ([`sm90_w4_stream_default`]); W4A8 with e8m0 weight scales and K a multiple of 128 above
///   that runs on FP8 tensor cores ([`sm90_w4_fp8_default`]).
/// - Everything else runs the reference kernel.
///
/// The sm90 FP8 configuration is [`sm90_default`]'s.
pub fn choose(arch: GpuArch, hw: Hardware, a: &MatrixDesc, b: &MatrixDesc) -> Result<Plan> {
    choose_for(arch, hw, &GemmShape::of(a, b)?, a, b)
}

/// [`choose`] for operands already checked to form `shape`.
pub(crate) fn choose_for(
    arch: GpuArch,
    hw: Hardware,
    shape: &GemmShape,
    a: &MatrixDesc,
    b: &MatrixDesc,
) -> Result<Plan> {
    if arch != GpuArch::Hopper {
        return Ok(Plan::Reference);
    }
    let sm_count = hw.sm_count;
    let sm90_a = sm90_fp8::unsupported(a, false).is_none();
    let sm90_b = sm90_fp8::unsupported(b, true).is_none();
    let fp32_fp8 = |d: &MatrixDesc| {
        d.format.scale == ScaleType::F32 && matches!(d.format.elem, ElemType::E4M3 | ElemType::E5M2)
    };
    let GemmShape { m, n, k, l } = *shape;
    let w4 = sm90_w4::unsupported_pair(a, b).is_none();
    // e2m1 activations with the weights' e8m0 scales: folded per call, the weights as they are.
    let w4a4 = w4 && sm90_w4::fp8_folds_a(a, b);
    let folds = sm90_mx_fp8::unsupported_pair(a, b).is_none();
    if sm90_a && sm90_b {
        Ok(Plan::Sm90Fp8(sm90_default(m, n, k, l, hw)))
    } else if sm90_half::unsupported_pair(a, b).is_none() {
        Ok(Plan::Sm90Half(sm90_half_default(m, n, sm_count)))
    } else if w4 && sm90_w4::fp8_takes(a, b) && folds && m >= W4A8_FOLD_MIN_M {
        // FP8 activations past one activation tile: the 4-bit weights with e8m0 scales folded
        // to FP8 per call (exactly; N·K bytes written, about 5 µs at 7168 × 4096) and the FP8
        // kernel, as for e2m1 pairs past `W4A4_FP8_MAX_M` (measured: `W4A8_FOLD_MIN_M`).
        // NVFP4 weights stay on the 4-bit-weights kernel: their fold to e4m3 rounds (a code
        // times an e4m3 scale needs more than e4m3's 3 mantissa bits).
        Ok(Plan::Sm90MxFp8(sm90_default(m, n, k, l, hw)))
    } else if w4 && m <= stream::MAX_M as usize && (a.format.elem != ElemType::E2M1 || w4a4) {
        Ok(Plan::Sm90W4(sm90_w4_stream_default(m, n, k, l, sm_count)))
    } else if w4 && sm90_w4::fp8_takes(a, b) && (!w4a4 || m <= W4A4_FP8_MAX_M) {
        Ok(Plan::Sm90W4(sm90_w4_fp8_default(m, n, k, l, sm_count)))
    } else if w4 && (a.format.elem != ElemType::E2M1 || m <= W4_MAX_M) {
        Ok(Plan::Sm90W4(sm90_w4_default(m, n, k, l, sm_count)))
    } else if folds && (m >= FOLD_MIN_M || w4a4 || sm90_mx::unsupported_pair(a, b).is_some()) {
        // Folded from FOLD_MIN_M rows (past W4A4_FP8_MAX_M for e2m1 pairs with e8m0 scales), and
        // at any M where the MX kernel does not take the pair (one operand FP8 already, e.g. a B
        // folded once by `Gpu::fold_to_fp8`).
        Ok(Plan::Sm90MxFp8(sm90_default(m, n, k, l, hw)))
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
    /// Its SMs and DRAM rate.
    pub hw: Hardware,
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

/// The plan for a grouped GEMM ([`crate::Gpu::grouped_gemm`]):
/// - FP8 with fp32 scales: the FP8 kernel ([`sm90_grouped_default`]);
/// - MX and NVFP4 operands that fold to e4m3, with each other or with an FP8 one (experts folded
///   once by [`Gpu::fold_to_fp8`](crate::Gpu::fold_to_fp8), DeepSeek-style activations): folded
///   onto the FP8 kernel ([`Plan::Sm90MxFp8`]; lossy within the fold's bound). Experts folded
///   per call still beat the kernels that convert in their pipeline (docs/perf-log, grouped GEMM);
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
    // Contiguous groups of more rows than one activation tile on average fold (as dense calls
    // do); masked groups hold at most their capacity, decode's few rows, and stay.
    let small = p.shape.l > 1 || p.per_group() < W4A8_FOLD_MIN_M;
    if let Some(plan) = w4_fp8_exact(p).or_else(|| w4a4_fp8(p)).filter(|_| small) {
        return Ok(plan);
    }
    let cfg = p.fp8_config();
    Ok(if fp8.is_none() {
        Plan::Sm90Fp8(cfg)
    } else {
        Plan::Sm90MxFp8(cfg)
    })
}

/// The exact plan of `p` where it is the 4-bit-weights kernel on FP8 tensor cores (W4A8 experts
/// with e8m0 scales): it takes them as they are, where folding them per call writes a G·N·K-byte
/// FP8 copy each call, and is faster on the seed's larger cases, within 4% on the smaller ones
/// (docs/perf-log/w4.md).
fn w4_fp8_exact(p: &GroupedProblem<'_>) -> Option<Plan> {
    match choose_grouped_exact(p) {
        Ok(Plan::Sm90W4(cfg)) if cfg.fp8 => Some(Plan::Sm90W4(cfg)),
        _ => None,
    }
}

/// The plan of `p` where it is 4-bit experts with e2m1 activations of the same e8m0 scales: the
/// 4-bit-weights kernel on FP8 tensor cores with the activations folded per call (M·K bytes) and
/// the experts as they are, where folding both writes a G·N·K-byte copy of the experts each call
/// (docs/perf-log/w4.md).
fn w4a4_fp8(p: &GroupedProblem<'_>) -> Option<Plan> {
    let (a, b) = (p.a, p.b);
    if sm90_w4::unsupported_pair(a, b).is_some() || !sm90_w4::fp8_folds_a(a, b) {
        return None;
    }
    let GemmShape { n, k, .. } = p.shape;
    let mut cfg = sm90_w4_fp8_default(p.per_group(), n, k, 1, p.hw.sm_count);
    cfg.split_k = 1;
    Some(Plan::Sm90W4(cfg))
}

/// Whether a grouped GEMM of a pair that can fold does (where [`w4_fp8_exact`] gives no plan):
/// always where B is FP8 already (folded once ahead of time); per call for 4-bit experts with
/// e8m0 scales (folded exactly but for subnormals) or with FP8 activations (the 4-bit-weights
/// kernel's bf16 path is slower than the fold); not for the rest (NVFP4 and MXFP8 pairs), whose
/// fold per call is no faster than the MX kernel (docs/perf-log, grouped GEMM).
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
        sm90_grouped_default(m, n, k, self.groups, self.per_group(), self.hw.sm_count)
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
    let (a, b, sm_count) = (p.a, p.b, p.hw.sm_count);
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
        if cfg.tile == blockscaled_kernels::sm90_w4::fp8::FP8_TILE && sm90_w4::fp8_takes(a, b) {
            cfg = sm90_w4_fp8_default(per_group, n, k, 1, sm_count);
        }
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

fn shape_err_k(k: usize) -> Error {
    shape(format!(
        "K = {k} is not a multiple of 128: the Hopper FP8 kernel's 128-wide scale blocks need it \
         (Gpu::reference_gemm computes it, slowly)"
    ))
}
