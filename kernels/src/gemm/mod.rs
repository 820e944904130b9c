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

/// Finishing warps of a fused kernel (`driver::GemmKernel::FINISHERS`): warps 1–3 of the
/// producer's warpgroup, whose warp 0 issues the copies.
pub const FINISHERS: u32 = 3;

/// Registers per thread of a CTA of `warpgroups` warpgroups at launch: the register file's 65 536
/// over its threads, in whole multiples of 8 (168 for 384 threads). `setmaxnreg` only moves
/// registers between the CTA's warps, so the budgets after it must add up to no more than this
/// (a `setmaxnreg.inc` beyond what the others released would wait for ever).
pub const fn launch_regs(warpgroups: u32) -> u32 {
    65_536 / (128 * warpgroups) / 8 * 8
}

/// The registers per thread that `consumers` consumer warpgroups of `consumer_regs` leave to the
/// producer's warpgroup of the launch's ([`launch_regs`]), as `setmaxnreg` takes them (a multiple
/// of 8, at most 256).
pub const fn regs_left(consumers: u32, consumer_regs: u32) -> u32 {
    let left = launch_regs(1 + consumers) * (1 + consumers) - consumers * consumer_regs;
    let left = left / 8 * 8;
    if left > 256 { 256 } else { left }
}

/// The producer warpgroup's register budget: `producer` where its warpgroup has no finishing
/// warps; with them (fused kernels, `driver::GemmKernel::FINISHERS`), every register the
/// `consumers` consumer warpgroups of `consumer_regs` leave of the launch's — the finishers' row
/// code needs more than the producer thread's address arithmetic. (A fourth warpgroup of
/// finishers was tried: 512 threads leave 128 registers per thread at launch, and ptxas then
/// kept the FP8 consumers' K loop within about 132 registers, spilling, though `setmaxnreg`
/// raised their budget to 184 or 200.)
pub const fn producer_budget(
    producer: u32,
    consumers: u32,
    consumer_regs: u32,
    finishers: u32,
) -> u32 {
    if finishers == 0 {
        producer
    } else {
        regs_left(consumers, consumer_regs)
    }
}

/// What a family's kernel runs; each a kernel of its own (a const parameter), as each walks its
/// units differently and the dense kernels have no registers to spare for the others' walks.
/// Every family names its kernels by it (a family runs some of them).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    Dense = 0,
    /// Grouped GEMM (the family's parameters' groups).
    Grouped = 1,
    /// Block-sparse GEMM, one operand in 128 × 128 blocks (the family's parameters' sparse operand).
    Sparse = 2,
    /// Dense GEMM that ends in the fused epilogue ([`crate::params::FusedParams`],
    /// [`crate::gemm::epilogue::fuse`]) in finishing warps: every epilogue.
    Fused = 3,
    /// Dense GEMM whose consumers run the fused epilogue in their own registers, then store as
    /// the dense kernels do: the epilogues [`crate::params::in_registers`]
    /// takes, on the dense kernel's layout and K loop.
    FusedInRegisters = 4,
    /// [`Mode::FusedInRegisters`] with MXFP8 output (e8m0 scales per 32 columns,
    /// [`crate::gemm::epilogue::fuse::quantize_fragment_mx`]): a kernel of its own, so that the FP8 1×128
    /// kernel's code is not the larger for it (with both outputs in one kernel its FP8 1×128
    /// output measured 3 % slower).
    FusedInRegistersMx = 5,
}

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
