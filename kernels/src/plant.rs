//! Planted errors, for showing that the tests catch a small systematic error in each place one
//! could hide (`scripts/plant-error.sh`). Each factor below is 1.0, which the compiler folds
//! away (the images are the same bit for bit), unless the kernels are built with
//! `--cfg blockscaled_plant="<site>"` (`BLOCKSCALED_PLANT=<site>` in the host's build from
//! source): then that site's is 1.005, a 0.5% error in every value it touches. Never shipped: the
//! host's build refuses to compare such images with the shipped ones.

/// The sites, as `BLOCKSCALED_PLANT` names them.
pub const SITES: [&str; 6] = ["promote", "fold", "mx", "w4", "half", "fused"];

/// 1.005 where `planted`, else 1.
const fn factor(planted: bool) -> f32 {
    if planted { 1.005 } else { 1.0 }
}

/// The FP8 kernels' promotion of partial sums into fp32 (`gemm::promote`): every FP8 family —
/// dense, grouped, block-sparse, and the fold's run on the FP8 kernel.
pub const PROMOTE: f32 = factor(cfg!(blockscaled_plant = "promote"));

/// The fold pre-pass's fp32 scales (MX and NVFP4 operands dequantized onto FP8 with one scale
/// per 1×128 or per row).
pub const FOLD: f32 = factor(cfg!(blockscaled_plant = "fold"));

/// The MX kernel's scaling of its dequantized product (α, the operands' tensor scales).
pub const MX: f32 = factor(cfg!(blockscaled_plant = "mx"));

/// The 4-bit-weights kernel's scaling of its dequantized product.
pub const W4: f32 = factor(cfg!(blockscaled_plant = "w4"));

/// The 16-bit kernel's scaling of its product (α, the operands' one scale each).
pub const HALF: f32 = factor(cfg!(blockscaled_plant = "half"));

/// The fused epilogue's α · product, in every kernel that fuses (FP8, 16-bit, MX).
pub const FUSED: f32 = factor(cfg!(blockscaled_plant = "fused"));
