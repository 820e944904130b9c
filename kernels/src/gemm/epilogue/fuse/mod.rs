//! The fused epilogue ([`EpilogueParams`]): α, β·C, a per-column bias, an activation (SwiGLU
//! over paired columns), a residual, and output quantized into the codes and scales the next
//! GEMM reads as its A. One code path, run from [`super::finish_unit`] by each
//! family's fused kernels (kernels of their own, [`crate::params::FusedParams`]: the plain
//! kernels carry none of this code), the steps chosen by data in the parameters, not a kernel per
//! combination.
//!
//! Two places run the steps, chosen by the kernel (the host picks it by the epilogue,
//! [`in_registers`](crate::params::in_registers)):
//! - *In the consumers' registers* ([`apply`], then the plain kernels' stores,
//!   [`quantize_fragment`] or [`quantize_fragment_mx`]): the epilogues without β·C, residual or
//!   SwiGLU, to any unquantized output, FP8 1×128 or MXFP8 (kernels of their own). The
//!   kernels are the dense FP8 kernel with the steps applied to each fragment before its store
//!   (the dense layout and K loop, no finishing warps); the steps are in series with the MMAs, a
//!   few instructions a value (docs/perf-log, fused epilogue).
//! - *In finishing warps*, every other epilogue (and every epilogue of the 16-bit and MX
//!   families), on rows, not on fragments: each consumer warp writes
//! its whole fragment (16 rows) as f32 into its staging rows ([`stage_unit`]) and goes on to the
//! next unit's MMAs, while the kernel's finishing warps (the driver's
//! [`FINISHERS`](super::driver::GemmKernel::FINISHERS), handed the unit through
//! [`Handoff`]) read the rows back several at a time, lane `q` holding a row's columns `4q..4q + 4`
//! of each 128 ([`finish_staged`]): the epilogue overlaps the tensor cores' work instead of
//! following it. The row code is one loop of run-time bounds (one copy of it); the lanes'
//! stores of a row are contiguous (coalesced), and a scale block of 16, 32 or 128 output columns
//! is 4, 8 or 32 adjacent lanes (16 or 32 with SwiGLU), whose largest magnitude is a shuffle
//! reduction. The staging is the fused kernels' shared memory in place of the output staging
//! ([`fused_out`](super::layout::fused_out)), else global memory the host gives
//! ([`EpilogueParams::scratch`], L2-resident). Rows are padded by 16 bytes
//! ([`fused_row_bytes`](super::layout::fused_row_bytes)): the row reads use every bank, the
//! fragment's writes at most two per bank (`gemm::layout`'s offsets, tested on the host).
//!
//! The activations use the SFU's `ex2` and `rcp` (`ptx::math`): SiLU and GELU-tanh are
//! `x·sigmoid(·)` with a relative error of a few 2^-22 beyond the argument's rounding, GELU-erf
//! is Abramowitz–Stegun 7.1.26 (absolute error of `erf` ≤ 1.5·10^-7). The other steps are single
//! f32 operations rounded to nearest (`mul.rn`, `add.rn`: never contracted), so a host doing them
//! in the same order agrees bit for bit; quantization runs the host quantizers' rules
//! (`format::quantize`), so quantized output equals the device quantizer applied to the same
//! epilogue's f32 output.
//!
//! The parts: `activation.rs` (the activations' arithmetic), `stage.rs` (the consumers' staging
//! of a unit and the row steps the finishing warps apply), `registers.rs` (the steps in the
//! consumers' registers and the fragment quantizers), `finish.rs` (the finishing warps' loop).

use crate::format::{ElemType, ScaleType};
use crate::params::EpilogueParams;
use crate::ptx::global;

const LOG2_E: f32 = core::f32::consts::LOG2_E;

/// Columns one pass of a warp over a staged row covers: 4 per lane.
const PASS_COLS: u32 = 128;

/// `$f::<ACT, $g…>($arg…)` with the activation `$act` ([`Activation`] as u32) as the constant
/// `ACT`: one copy of `$f` per activation, so that no value of it branches on the activation
/// (the copies' chains then interleave).
macro_rules! by_activation {
    ($act:expr, $f:ident::<$($g:tt),*>($($arg:expr),*)) => {{
        const RELU: u32 = $crate::params::Activation::Relu as u32;
        const ERF: u32 = $crate::params::Activation::GeluErf as u32;
        const TANH: u32 = $crate::params::Activation::GeluTanh as u32;
        const SILU: u32 = $crate::params::Activation::Silu as u32;
        const NONE: u32 = $crate::params::Activation::None as u32;
        match $act {
            RELU => $f::<RELU, $($g),*>($($arg),*),
            ERF => $f::<ERF, $($g),*>($($arg),*),
            TANH => $f::<TANH, $($g),*>($($arg),*),
            SILU => $f::<SILU, $($g),*>($($arg),*),
            _ => $f::<NONE, $($g),*>($($arg),*),
        }
    }};
}

mod activation;
mod finish;
mod registers;
mod stage;

pub use activation::activate;
pub use finish::{finish_staged, finish_unit_staged};
pub use registers::{CODE_WARP_BYTES, apply, quantize_fragment, quantize_fragment_mx};
pub use stage::stage_unit;

/// The quantized output's element and scale types.
#[inline(always)]
fn quant_types(e: &EpilogueParams) -> (ElemType, ScaleType) {
    (
        ElemType::from_u32(e.q_elem).unwrap_or(ElemType::E4M3),
        ScaleType::from_u32(e.q_scale).unwrap_or(ScaleType::F32),
    )
}

/// Index of the scale of row `row`, block `kb` of batch entry `l` in the quantized output's
/// scales (its strides).
#[inline(always)]
fn scale_index(e: &EpilogueParams, (l, row, kb): (u32, u32, u32)) -> u64 {
    l as u64 * e.q_stride_l + row as u64 * e.q_stride_r + kb as u64 * e.q_stride_k
}

/// Stores the fp32 scale `bits` of row `row`, block `kb` of batch entry `l` (rows of `n_out`
/// columns, blocks of 128; `si` its [`scale_index`]) where `pred`: into the output's scales, and
/// into the FP8 kernel's A-role copy `[l][n_out / 128][q_m_pad]` where there is one.
/// # Safety
/// Where `pred`, the scales (and the copy) hold that row's and block's (the host's sizes).
#[inline(always)]
unsafe fn store_f32_scale(
    e: &EpilogueParams,
    si: u64,
    (l, row, kb): (u32, u32, u32),
    n_out: u32,
    bits: u32,
    pred: bool,
) {
    // SAFETY: the caller's contract.
    unsafe {
        global::store_u32_if(e.q_scales + 4 * si, bits, pred);
        if e.q_sfa != 0 {
            let a = (l as u64 * (n_out / 128) as u64 + kb as u64) * e.q_m_pad as u64 + row as u64;
            global::store_u32_if(e.q_sfa + 4 * a, bits, pred);
        }
    }
}
