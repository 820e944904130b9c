//! The kernels this crate exports, with what the builder must write into the PTX for each.
//! `host/build.rs` passes this table to `blockscaled-builder`; the host looks kernels up by the
//! same names, so a renamed kernel fails at build time, not at launch.

use crate::params::sm90::{Fp8Types, Tile};

/// One kernel entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelInfo {
    /// The exported (unmangled) symbol.
    pub name: &'static str,
    /// Threads per block the kernel is written for: becomes `.maxntid N, 1, 1`, the register cap
    /// ptxas needs before it honours `setmaxnreg`. `None`: no bound (any block size).
    pub max_threads: Option<u32>,
    /// `.minnctapersm`: blocks that must fit on one SM.
    pub min_blocks_per_sm: u32,
    /// The GPU targets whose module contains this kernel (`llc -mcpu` names).
    pub targets: &'static [&'static str],
}

const ALL_TARGETS: &[&str] = &["sm_90a", "sm_100a"];

/// The SIMT reference GEMM: every format and scale layout, float64 accumulation.
pub const REFERENCE_GEMM: KernelInfo = KernelInfo {
    name: "reference_blockscaled_gemm",
    max_threads: Some(crate::params::REFERENCE_BLOCK_THREADS),
    min_blocks_per_sm: 1,
    targets: ALL_TARGETS,
};

/// The Hopper FP8 GEMM with fp32 block scales (1×128 A, 128×128 B): TMA, mbarrier ring,
/// wgmma consumer warpgroups, persistent; `tile`'s shape, one kernel per pair of element types.
const fn sm90(name: &'static str, tile: Tile) -> KernelInfo {
    KernelInfo {
        name,
        max_threads: Some(tile.threads()),
        min_blocks_per_sm: 1,
        // wgmma exists on sm_90a only.
        targets: &["sm_90a"],
    }
}

/// The sm90 FP8 kernels by tile shape and element types (one body, `kernels::sm90_fp8`).
pub const SM90_FP8_KERNELS: [(Tile, Fp8Types, KernelInfo); 16] = {
    use Fp8Types::*;
    const fn k(tile: Tile, types: Fp8Types, name: &'static str) -> (Tile, Fp8Types, KernelInfo) {
        (tile, types, sm90(name, tile))
    }
    [
        k(Tile::M128, E4m3E4m3, "sm90_fp8_blockscaled_gemm"),
        k(Tile::M256, E4m3E4m3, "sm90_fp8_blockscaled_gemm_m256"),
        k(Tile::M192, E4m3E4m3, "sm90_fp8_blockscaled_gemm_m192"),
        k(Tile::M128, E5m2E5m2, "sm90_fp8_blockscaled_gemm_e5m2_e5m2"),
        k(
            Tile::M256,
            E5m2E5m2,
            "sm90_fp8_blockscaled_gemm_m256_e5m2_e5m2",
        ),
        k(
            Tile::M192,
            E5m2E5m2,
            "sm90_fp8_blockscaled_gemm_m192_e5m2_e5m2",
        ),
        k(Tile::M128, E4m3E5m2, "sm90_fp8_blockscaled_gemm_e4m3_e5m2"),
        k(
            Tile::M256,
            E4m3E5m2,
            "sm90_fp8_blockscaled_gemm_m256_e4m3_e5m2",
        ),
        k(
            Tile::M192,
            E4m3E5m2,
            "sm90_fp8_blockscaled_gemm_m192_e4m3_e5m2",
        ),
        k(Tile::M128, E5m2E4m3, "sm90_fp8_blockscaled_gemm_e5m2_e4m3"),
        k(
            Tile::M256,
            E5m2E4m3,
            "sm90_fp8_blockscaled_gemm_m256_e5m2_e4m3",
        ),
        k(
            Tile::M192,
            E5m2E4m3,
            "sm90_fp8_blockscaled_gemm_m192_e5m2_e4m3",
        ),
        k(Tile::M128N64, E4m3E4m3, "sm90_fp8_blockscaled_gemm_n64"),
        k(
            Tile::M128N64,
            E5m2E5m2,
            "sm90_fp8_blockscaled_gemm_n64_e5m2_e5m2",
        ),
        k(
            Tile::M128N64,
            E4m3E5m2,
            "sm90_fp8_blockscaled_gemm_n64_e4m3_e5m2",
        ),
        k(
            Tile::M128N64,
            E5m2E4m3,
            "sm90_fp8_blockscaled_gemm_n64_e5m2_e4m3",
        ),
    ]
};

/// The split-K reduction (f32 partials → output type).
pub const SPLITK_REDUCE: KernelInfo = KernelInfo {
    name: "splitk_reduce",
    max_threads: Some(crate::params::SPLITK_THREADS),
    min_blocks_per_sm: 1,
    targets: ALL_TARGETS,
};

/// Every kernel, for the builder.
pub const KERNELS: &[KernelInfo] = &{
    let mut all = [REFERENCE_GEMM; 2 + SM90_FP8_KERNELS.len()];
    all[1] = SPLITK_REDUCE;
    let mut i = 0;
    while i < SM90_FP8_KERNELS.len() {
        all[2 + i] = SM90_FP8_KERNELS[i].2;
        i += 1;
    }
    all
};

/// The dynamic shared-memory array's name as a literal, so `asm!` templates can `concat!` it.
#[macro_export]
macro_rules! smem_symbol {
    () => {
        "blockscaled_dynamic_smem"
    };
}

/// The name of the dynamic shared-memory array every module declares (see `ptx::smem`).
pub const DYNAMIC_SMEM_SYMBOL: &str = smem_symbol!();
/// Its alignment: TMA destinations with 128-byte swizzle need 1024-byte-aligned tiles.
pub const DYNAMIC_SMEM_ALIGN: u32 = 1024;
