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

/// The maximum-magnitude pass.
pub const AMAX_KERNEL: KernelInfo = KernelInfo {
    name: "quantize_amax",
    max_threads: Some(QUANTIZE_THREADS),
    min_blocks_per_sm: 1,
    targets: TARGETS,
};

/// The maximum pass as a one-row list (the registry gathers lists of rows with an `info`).
pub struct AmaxKernel {
    pub info: KernelInfo,
}

/// [`AMAX_KERNEL`]'s list.
pub const AMAX: &[AmaxKernel] = &[AmaxKernel { info: AMAX_KERNEL }];

macro_rules! quantize_kernels {
    ($(($name:literal, $elem:ident, $scale:ident)),*) => {
        /// Every quantizer kernel (the registry's rows): each format from each input type.
        pub const KERNELS: &[QuantizeKernel] = &[$(
            quantize_kernels!(@row concat!($name, "_from_f32"), $elem, $scale, F32),
            quantize_kernels!(@row concat!($name, "_from_bf16"), $elem, $scale, Bf16),
            quantize_kernels!(@row concat!($name, "_from_f16"), $elem, $scale, F16),
        )*];
        #[cfg(target_arch = "nvptx64")]
        mod entries {
            use super::{InputType, QuantizeParams, quantize_elems};
            use crate::format::{ElemType, ScaleType};
            $(
                quantize_kernels!(@entry concat!($name, "_from_f32"), $elem, $scale, F32, false);
                quantize_kernels!(@entry concat!($name, "_from_bf16"), $elem, $scale, Bf16, false);
                quantize_kernels!(@entry concat!($name, "_from_f16"), $elem, $scale, F16, false);
            )*
            /// # Safety
            /// As [`super::device::amax`].
            #[unsafe(export_name = "quantize_amax")]
            unsafe extern "ptx-kernel" fn amax(p: QuantizeParams) {
                // SAFETY: the launch's contract.
                unsafe { super::device::amax(&p) }
            }
        }
    };
    (@row $name:expr, $elem:ident, $scale:ident, $input:ident) => {
        QuantizeKernel {
            elem: ElemType::$elem,
            scale: ScaleType::$scale,
            input: InputType::$input,
            info: KernelInfo {
                name: $name,
                max_threads: Some(QUANTIZE_THREADS),
                min_blocks_per_sm: QUANTIZE_MIN_BLOCKS,
                targets: TARGETS,
            },
        }
    };
    // (`$rows`: a per-row kernel, `device::quantize`'s `ROWS`.)
    (@entry $name:expr, $elem:ident, $scale:ident, $input:ident, $rows:literal) => {
        const _: () = {
            /// # Safety
            /// As [`super::device::quantize`].
            #[unsafe(export_name = $name)]
            unsafe extern "ptx-kernel" fn kernel(p: QuantizeParams) {
                // SAFETY: the launch's contract (`p.input` is this kernel's input type; for a
                // per-row kernel the span a row and the block a whole row's lanes).
                unsafe {
                    super::device::quantize::<
                        { ElemType::$elem as u32 },
                        { ScaleType::$scale as u32 },
                        { InputType::$input as u32 },
                        { quantize_elems(InputType::$input) as usize },
                        $rows,
                    >(&p)
                }
            }
        };
    };
}

macro_rules! row_kernels {
    ($(($name:literal, $elem:ident, $input:ident)),*) => {
        /// Every per-row quantizer (the registry's rows): FP8 with one fp32 scale per row, a whole
        /// row in one block, its maximum reduced in shared memory (no maximum pass: the input is
        /// read once).
        pub const ROW_KERNELS: &[QuantizeKernel] = &[$(QuantizeKernel {
            elem: ElemType::$elem,
            scale: ScaleType::F32,
            input: InputType::$input,
            info: KernelInfo {
                name: $name,
                max_threads: Some(ROW_THREADS_MAX),
                min_blocks_per_sm: 1,
                targets: TARGETS,
            },
        }),*];
        #[cfg(target_arch = "nvptx64")]
        mod row_entries {
            use super::{InputType, QuantizeParams, quantize_elems};
            use crate::format::{ElemType, ScaleType};
            $(quantize_kernels!(@entry $name, $elem, F32, $input, true);)*
        }
    };
}

row_kernels! {
    ("quantize_rows_e4m3_from_f32", E4M3, F32),
    ("quantize_rows_e4m3_from_bf16", E4M3, Bf16),
    ("quantize_rows_e4m3_from_f16", E4M3, F16),
    ("quantize_rows_e5m2_from_f32", E5M2, F32),
    ("quantize_rows_e5m2_from_bf16", E5M2, Bf16),
    ("quantize_rows_e5m2_from_f16", E5M2, F16)
}

quantize_kernels! {
    ("quantize_e4m3_f32", E4M3, F32),
    ("quantize_e5m2_f32", E5M2, F32),
    ("quantize_e4m3_e8m0", E4M3, E8M0),
    ("quantize_e5m2_e8m0", E5M2, E8M0),
    ("quantize_e2m1_e8m0", E2M1, E8M0),
    ("quantize_e2m1_ue4m3", E2M1, UE4M3)
}

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
