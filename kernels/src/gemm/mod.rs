//! The parts every GEMM kernel family is built from (the CUTLASS habit: each a type with its
//! invariants), so a family's file holds only its algorithm:
//! - [`scheduler`]: the persistent tile scheduler; its [`scheduler::WorkUnit`] carries the output
//!   tile, the batch entries and the K range (split-K is a schedule, not a kernel variant);
//! - [`layout`]: the shared-memory stage layout, computed from what a stage holds;
//! - [`pipeline`]: the TMA-producer / MMA-consumer stage ring with an explicit
//!   [`pipeline::PipelineState`], and the consumers' turn-taking;
//! - [`barriers`]: the named-barrier ids, allotted in one place;
//! - [`driver`]: the warp-specialized persistent kernel every family plugs into;
//! - [`promote`]: fp32 promotion of FP8 tensor-core partial sums;
//! - [`epilogue`]: TMA stores of 16-bit output, direct stores, per-column scales;
//! - [`fuse`]: the fused epilogue (α, β·C, bias, activations, residual, quantized output);
//! - [`splitk`]: split-K's meeting of K ranges in the last CTA of each tile.
//!
//! [`scheduler`], [`layout`] and [`barriers`]' ids are plain arithmetic, built for the host too (grid and
//! shared-memory sizing); the rest is device code.

pub mod layout;
pub mod scheduler;

pub mod barriers;
#[cfg(all(
    target_arch = "nvptx64",
    any(target_feature = "sm_90a", target_feature = "sm_100a")
))]
pub mod driver;
#[cfg(all(
    target_arch = "nvptx64",
    any(target_feature = "sm_90a", target_feature = "sm_100a")
))]
pub mod epilogue;
#[cfg(all(
    target_arch = "nvptx64",
    any(target_feature = "sm_90a", target_feature = "sm_100a")
))]
pub mod fuse;
#[cfg(target_arch = "nvptx64")]
pub mod pipeline;
#[cfg(all(
    target_arch = "nvptx64",
    any(target_feature = "sm_90a", target_feature = "sm_100a")
))]
pub mod promote;
#[cfg(all(
    target_arch = "nvptx64",
    any(target_feature = "sm_90a", target_feature = "sm_100a")
))]
pub mod splitk;
