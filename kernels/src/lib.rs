//! Device side of `blockscaled`, and the definitions both sides share.
//!
//! This crate is compiled twice from one source:
//! - for `nvptx64-nvidia-cuda` (by `blockscaled-builder`, once per GPU target), where it holds the
//!   kernel entry points and the PTX instruction wrappers ([`ptx`]);
//! - for the host, as an ordinary `no_std` library, where the host crate uses the `#[repr(C)]`
//!   parameter structs ([`params`], [`sm90::Sm90Fp8Params`]), the bit-exact formats ([`format`]),
//!   the kernel table ([`registry`]), the tile shapes and the scheduler — so the two sides can
//!   never disagree on a layout, a rounding rule or a grid.
//!
//! Layout: [`gemm`] holds the parts every GEMM family shares (scheduler, stage layout, pipeline,
//! named barriers, the warp-specialized driver, promotion, epilogue stores, split-K reduction);
//! each family is one module ([`sm90`]: Hopper FP8 with fp32 block scales; [`sm90_mx`]: Hopper MX /
//! NVFP4, dequantized exactly to bf16; [`fold`]: the pre-pass that re-encodes MX operands for the
//! FP8 kernel; [`sm90_half`]: Hopper bf16 / fp16, dense and block-sparse; [`sm90_w4`]: Hopper 4-bit
//! weights dequantized into
//! registers, with bf16, FP8 or FP4 activations; [`reference`]: the SIMT
//! reference for every format); [`quantize`] holds the device quantizers and [`prepare`] the
//! copies of a quantized matrix the families read beside it (scale layouts, 4-bit weights
//! reordered), described once for the host's and the device's preparation. Each family declares
//! its kernels in one table ([`entry`]), from which come both its list of kernels and, on the
//! GPU, their entry points.
#![no_std]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, asm_experimental_arch, stdarch_nvptx, core_float_math)
)]

pub mod entry;
pub mod fold;
pub mod format;
pub mod gemm;
pub mod kernel_info;
pub mod moe;
pub mod params;
pub mod plant;
pub mod prepare;
pub mod quantize;
pub mod registry;
pub mod sm90;
pub mod sm90_half;
pub mod sm90_mx;
pub mod sm90_w4;

#[cfg(target_arch = "nvptx64")]
pub mod ptx;

#[cfg(target_arch = "nvptx64")]
pub mod reference;

/// A panic on the GPU (only reachable through a bug: kernels index with checked bounds only where
/// the host could not validate) traps, which the host sees as a launch failure.
#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: `trap` aborts the kernel, which is what a panic must do.
    unsafe { core::arch::nvptx::trap() }
}
