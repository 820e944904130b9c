//! Which kernel runs a GEMM, and with what configuration: one function, rules stated as data.

use crate::device::GpuArch;
use crate::error::{Result, shape};
use crate::format::ScaleType;
use crate::matrix::MatrixDesc;
pub use crate::sm90::Sm90Config;
use blockscaled_kernels::params::sm90::BLOCK_M;

/// A kernel and its configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// The SIMT reference kernel (every format; slow).
    Reference,
    /// The Hopper TMA + wgmma FP8 kernel with fp32 block scales.
    Sm90Fp8(Sm90Config),
}

/// Picks the kernel for A (M×K) · Bᵀ (N×K) on `arch` with `sm_count` SMs.
///
/// - Hopper, e4m3 with fp32 scales that are constant over 1×128 (A) and 128×128 (B) blocks —
///   DeepSeek, per-tensor, per-row A — runs the sm90 kernel. Its 128-wide scale blocks need
///   K % 128 == 0: other K are an error rather than a silent 1000× slower path.
/// - Everything else runs the reference kernel for now (MX / NVFP4 fast kernels: later issues).
///
/// Cluster (`cluster_m`): 1; clusters of 2 along M (B tiles multicast, each CTA loads half) are
/// available through [`Sm90Config`] and measured slower for now.
///
/// Raster band (`group_m`): CTAs running together cover `group_m` M tiles × (SMs / group_m) N
/// tiles, so both operands' working sets stay in L2; 8 keeps a band's A tiles (8 × 128 × K bytes)
/// small next to the 50 MB L2 for K up to 16k.
pub fn choose(arch: GpuArch, sm_count: u32, a: &MatrixDesc, b: &MatrixDesc) -> Result<Plan> {
    if arch != GpuArch::Hopper {
        return Ok(Plan::Reference);
    }
    let fp32_scaled = a.format.scale == ScaleType::F32 && b.format.scale == ScaleType::F32;
    let a_no = crate::sm90::unsupported(a, false);
    let b_no = crate::sm90::unsupported(b, true);
    match (a_no, b_no) {
        (None, None) => Ok(Plan::Sm90Fp8(sm90_default(a.rows, sm_count))),
        _ if fp32_scaled && a.k % 128 != 0 && a.format.elem == crate::ElemType::E4M3 => {
            Err(shape(format!(
                "K = {} is not a multiple of 128: the Hopper FP8 kernel's 128-wide scale blocks need it \
             (Gpu::reference_gemm computes it, slowly)",
                a.k
            )))
        }
        _ => Ok(Plan::Reference),
    }
}

/// The sm90 configuration `choose` uses for an A of `m` rows on a GPU with `sm_count` SMs (the
/// runner starts from it when it forces a field).
pub fn sm90_default(m: usize, sm_count: u32) -> Sm90Config {
    let m_tiles = m.div_ceil(BLOCK_M as usize) as u32;
    // Cluster 2 (B multicast) is correct but measured slower than 1 on every DeepSeek shape (H100,
    // 2026-11-22: 8192³ 868 vs 899 TFLOP/s): L2 bandwidth of B is not what limits this kernel yet
    // (docs/PERF.md, v3), so a cluster is opt-in.
    Sm90Config {
        group_m: m_tiles.clamp(1, 8),
        ctas: sm_count,
        cluster_m: 1,
    }
}
