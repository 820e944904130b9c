//! The device quantizers: a bf16, fp16 or fp32 tensor `[l][rows][k]` (row-major) to the codes and
//! scales of any input format of the GEMMs, bit-identical to the host's quantizers because both run
//! the per-block rules of [`crate::format::quantize`].
//!
//! Three memory-bound SIMT kernels:
//! - [`AMAX_KERNEL`], only where a scale covers more than one 1×k block (a scale per row or per
//!   tensor, and NVFP4's tensor scale): each block reduces one row and raises the row's, the batch
//!   entry's or the tensor's maximum magnitude with `red.max` on its f32 bits (non-negative f32
//!   bits order as the values; a NaN or ±Inf is raised as the NaN `0x7FFF_FFFF`, above all of
//!   them);
//! - the quantizer proper ([`KERNELS`], one per element type, scale type and input type): each
//!   thread takes [`quantize_elems`] consecutive elements of a row (two 16-byte loads: 16 bf16 /
//!   fp16 or 8 f32, decoded at use; an 8-element group past K is masked), the lanes of one scale
//!   block (1 to 16) share its maximum by butterfly shuffles, every lane derives the same scale
//!   and encodes its elements (8 bytes of FP8 or 4 of e2m1 per store and 8-element group), and
//!   the block's first lane stores the scale: in the matrix's affine scale layout, and optionally
//!   in the 128×4 swizzled layout, the MX kernel's layout `[l][⌈k/64⌉][rows_pad][64/block]` and
//!   the FP8 kernel's A-role layout `[l][k/128][m_pad]` (a scale per row or per tensor in each
//!   K block's entry, from the row's first k/128 lanes). The
//!   grid's x covers a row's lanes, its z the batch, and rows go round its y: a thread's row,
//!   block and column come from its indices with 32-bit arithmetic, once per thread (a flat index
//!   split by 64-bit divisions cost more than the encoding). FP8 codes come from the hardware
//!   conversion, e2m1 codes from one rounding addition (`format::e2m1::encode_sat_finite`), and the
//!   quotients from each block's divisor prepared once (`Quotient`: an exact reciprocal for
//!   e8m0, `format::quantize::Reciprocal` for fp32 scales, `Reciprocal64` for NVFP4: the
//!   division's quotient without its cost).
//!
//! - the per-row quantizers ([`ROW_KERNELS`]), FP8 with one fp32 scale per row where a row's
//!   lanes fit one block: the same code with the row's maximum reduced in the block (`redux`,
//!   then a word per warp in shared memory), so the input is read once, without the maximum
//!   pass.
//!
//! A row's lanes are padded to whole scale blocks (rows of K not a multiple of the block end in
//! masked lanes), so the lanes of a block are always one aligned group of a warp.
//!
//! Non-finite input: the block (row, tensor) that holds a NaN or ±Inf gets a NaN scale (e8m0
//! `0xFF`, ue4m3 `0x7F`, fp32 NaN), so that every product with it is NaN; its element codes are
//! unspecified. (The host's quantizers reject such input with `Error::Format`.)

mod params;

pub use params::{
    InputType, QUANTIZE_MIN_BLOCKS, QUANTIZE_THREADS, QuantizeParams, ROW_SHARED_BYTES,
    ROW_THREADS_MAX, ScaleSpan, lanes, quantize_elems,
};

use crate::format::{ElemType, ScaleType};
use crate::kernel_info::KernelInfo;

/// One quantizer kernel: the element type it writes, its scale type and the input type it reads
/// (a constant of each kernel: a run-time input type cost a branch around every element's
/// decoding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantizeKernel {
    pub elem: ElemType,
    pub scale: ScaleType,
    pub input: InputType,
    pub info: KernelInfo,
}

const TARGETS: &[&str] = &["sm_90a", "sm_100a"];

impl QuantizeKernel {
    /// The row of the quantizer `name` of `elem` codes with `scale` scales from `input`.
    pub const fn new(
        name: &'static str,
        elem: ElemType,
        scale: ScaleType,
        input: InputType,
    ) -> Self {
        QuantizeKernel {
            elem,
            scale,
            input,
            info: KernelInfo {
                name,
                max_threads: Some(QUANTIZE_THREADS),
                min_blocks_per_sm: QUANTIZE_MIN_BLOCKS,
                targets: TARGETS,
            },
        }
    }

    /// The row of the per-row quantizer `name` of `elem` codes from `input` (a whole row's lanes
    /// in one block).
    pub const fn per_row(name: &'static str, elem: ElemType, input: InputType) -> Self {
        QuantizeKernel {
            elem,
            scale: ScaleType::F32,
            input,
            info: KernelInfo {
                name,
                max_threads: Some(ROW_THREADS_MAX),
                min_blocks_per_sm: 1,
                targets: TARGETS,
            },
        }
    }
}

/// The maximum pass as a one-row list (the registry gathers lists of rows with an `info`).
pub struct AmaxKernel {
    pub info: KernelInfo,
}

impl AmaxKernel {
    /// The row of the maximum pass `name`.
    pub const fn new(name: &'static str) -> Self {
        AmaxKernel {
            info: KernelInfo {
                name,
                max_threads: Some(QUANTIZE_THREADS),
                min_blocks_per_sm: 1,
                targets: TARGETS,
            },
        }
    }
}

crate::entry::kernel_table! {
    /// # Safety
    /// As [`device::quantize`] (`p.input` is this kernel's input type).
    #[cfg(target_arch = "nvptx64")]
    unsafe extern "ptx-kernel" fn |K| {
        call(QuantizeParams) => device::quantize::<
            { K.elem as u32 },
            { K.scale as u32 },
            { K.input as u32 },
            { quantize_elems(K.input) as usize },
            false,
        >;
    }

    /// Every quantizer kernel (the registry's rows): each format from each input type.
    pub const KERNELS: &[QuantizeKernel] = QuantizeKernel::new [
        call("quantize_e4m3_f32_from_f32", ElemType::E4M3, ScaleType::F32, InputType::F32),
        call("quantize_e4m3_f32_from_bf16", ElemType::E4M3, ScaleType::F32, InputType::Bf16),
        call("quantize_e4m3_f32_from_f16", ElemType::E4M3, ScaleType::F32, InputType::F16),
        call("quantize_e5m2_f32_from_f32", ElemType::E5M2, ScaleType::F32, InputType::F32),
        call("quantize_e5m2_f32_from_bf16", ElemType::E5M2, ScaleType::F32, InputType::Bf16),
        call("quantize_e5m2_f32_from_f16", ElemType::E5M2, ScaleType::F32, InputType::F16),
        call("quantize_e4m3_e8m0_from_f32", ElemType::E4M3, ScaleType::E8M0, InputType::F32),
        call("quantize_e4m3_e8m0_from_bf16", ElemType::E4M3, ScaleType::E8M0, InputType::Bf16),
        call("quantize_e4m3_e8m0_from_f16", ElemType::E4M3, ScaleType::E8M0, InputType::F16),
        call("quantize_e5m2_e8m0_from_f32", ElemType::E5M2, ScaleType::E8M0, InputType::F32),
        call("quantize_e5m2_e8m0_from_bf16", ElemType::E5M2, ScaleType::E8M0, InputType::Bf16),
        call("quantize_e5m2_e8m0_from_f16", ElemType::E5M2, ScaleType::E8M0, InputType::F16),
        call("quantize_e2m1_e8m0_from_f32", ElemType::E2M1, ScaleType::E8M0, InputType::F32),
        call("quantize_e2m1_e8m0_from_bf16", ElemType::E2M1, ScaleType::E8M0, InputType::Bf16),
        call("quantize_e2m1_e8m0_from_f16", ElemType::E2M1, ScaleType::E8M0, InputType::F16),
        call("quantize_e2m1_ue4m3_from_f32", ElemType::E2M1, ScaleType::UE4M3, InputType::F32),
        call("quantize_e2m1_ue4m3_from_bf16", ElemType::E2M1, ScaleType::UE4M3, InputType::Bf16),
        call("quantize_e2m1_ue4m3_from_f16", ElemType::E2M1, ScaleType::UE4M3, InputType::F16),
    ];
}

crate::entry::kernel_table! {
    /// # Safety
    /// As [`device::quantize`] for a per-row kernel (`p.input` is this kernel's input type, the
    /// span a row and the block a whole row's lanes).
    #[cfg(target_arch = "nvptx64")]
    unsafe extern "ptx-kernel" fn |K| {
        call(QuantizeParams) => device::quantize::<
            { K.elem as u32 },
            { K.scale as u32 },
            { K.input as u32 },
            { quantize_elems(K.input) as usize },
            true,
        >;
    }

    /// Every per-row quantizer (the registry's rows): FP8 with one fp32 scale per row, a whole
    /// row in one block, its maximum reduced in shared memory (no maximum pass: the input is
    /// read once).
    pub const ROW_KERNELS: &[QuantizeKernel] = QuantizeKernel::per_row [
        call("quantize_rows_e4m3_from_f32", ElemType::E4M3, InputType::F32),
        call("quantize_rows_e4m3_from_bf16", ElemType::E4M3, InputType::Bf16),
        call("quantize_rows_e4m3_from_f16", ElemType::E4M3, InputType::F16),
        call("quantize_rows_e5m2_from_f32", ElemType::E5M2, InputType::F32),
        call("quantize_rows_e5m2_from_bf16", ElemType::E5M2, InputType::Bf16),
        call("quantize_rows_e5m2_from_f16", ElemType::E5M2, InputType::F16),
    ];
}

crate::entry::kernel_table! {
    /// # Safety
    /// As [`device::amax`].
    #[cfg(target_arch = "nvptx64")]
    unsafe extern "ptx-kernel" fn |K| {
        call(QuantizeParams) => device::amax;
    }

    /// The maximum pass's list.
    pub const AMAX: &[AmaxKernel] = AmaxKernel::new [call("quantize_amax")];
}

/// The maximum-magnitude pass.
pub const AMAX_KERNEL: KernelInfo = AMAX[0].info;

/// The quantizer for `elem` codes with `scale` scales from `input`.
pub fn kernel(
    elem: ElemType,
    scale: ScaleType,
    input: InputType,
) -> Option<&'static QuantizeKernel> {
    KERNELS
        .iter()
        .find(|k| k.elem == elem && k.scale == scale && k.input == input)
}

pub use crate::format::quantize::{NON_FINITE, magnitude_bits};

#[cfg(target_arch = "nvptx64")]
pub(crate) mod device;

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::format;

    fn input_name(input: InputType) -> &'static str {
        match input {
            InputType::F32 => "f32",
            InputType::Bf16 => "bf16",
            InputType::F16 => "f16",
        }
    }

    /// Every format has a quantizer from every input type, and the FP8 formats per-row ones,
    /// each named by them (a table line is written by hand).
    #[test]
    fn every_format_and_input_has_a_kernel_named_by_them() {
        let inputs = [InputType::F32, InputType::Bf16, InputType::F16];
        for (i, k) in KERNELS.iter().enumerate() {
            let (e, s) = (k.elem.name(), k.scale.name());
            let want = format!("quantize_{e}_{s}_from_{}", input_name(k.input));
            assert_eq!(k.info.name, want);
            assert_eq!(kernel(k.elem, k.scale, k.input), Some(k), "{i}");
            if i % inputs.len() == 0 {
                for input in inputs {
                    assert!(kernel(k.elem, k.scale, input).is_some(), "{want} {input:?}");
                }
            }
        }
        assert_eq!(ROW_KERNELS.len(), 2 * inputs.len());
        for k in ROW_KERNELS {
            let want = format!(
                "quantize_rows_{}_from_{}",
                k.elem.name(),
                input_name(k.input)
            );
            assert_eq!(k.info.name, want);
            assert_eq!(k.scale, ScaleType::F32);
            assert!(
                ROW_KERNELS
                    .iter()
                    .filter(|o| o.elem == k.elem && o.input == k.input)
                    .count()
                    == 1
            );
        }
        assert_eq!(AMAX_KERNEL.name, "quantize_amax");
    }
}
