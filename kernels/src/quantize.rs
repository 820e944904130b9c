//! The device quantizers: a bf16, fp16 or fp32 tensor `[l][rows][k]` (row-major) to the codes and
//! scales of any input format of the GEMMs, bit-identical to the host's quantizers because both run
//! the per-block rules of [`crate::format::quantize`].
//!
//! Two memory-bound SIMT kernels:
//! - [`AMAX_KERNEL`], only where a scale covers more than one 1×k block (a scale per row or per
//!   tensor, and NVFP4's tensor scale): each block reduces one row and raises the row's, the batch
//!   entry's or the tensor's maximum magnitude with `red.max` on its f32 bits (non-negative f32
//!   bits order as the values; a NaN or ±Inf is raised as the NaN `0x7FFF_FFFF`, above all of
//!   them);
//! - the quantizer proper ([`KERNELS`], one per element type and scale type): each thread takes 8
//!   consecutive elements of a row (one or two 16-byte loads), the lanes of one scale block (2, 4
//!   or 16) share its maximum by butterfly shuffles, every lane derives the same scale and encodes
//!   its 8 elements (8 bytes of FP8 or 4 of e2m1 per store), and the block's first lane stores the
//!   scale: in the matrix's affine scale layout, and optionally in the 128×4 swizzled layout and
//!   in the FP8 kernel's A-role layout `[l][k/128][m_pad]`.
//!
//! A row's lanes are padded to whole scale blocks (rows of K not a multiple of the block end in
//! masked lanes), so the lanes of a block are always one aligned group of a warp.
//!
//! Non-finite input: the block (row, tensor) that holds a NaN or ±Inf gets a NaN scale (e8m0
//! `0xFF`, ue4m3 `0x7F`, fp32 NaN), so that every product with it is NaN; its element codes are
//! unspecified. (The host's quantizers reject such input with `Error::Format`.)

use crate::format::{ElemType, ScaleType};
use crate::registry::KernelInfo;

/// Threads per block of both kernels.
pub const QUANTIZE_THREADS: u32 = 256;
/// Elements each thread of the quantizer takes (one 16-byte load of bf16 / fp16, two of f32).
pub const ELEMS_PER_THREAD: u32 = 8;

/// The element type of the input tensor (stable values, passed to the kernels).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InputType {
    F32 = 0,
    Bf16 = 1,
    F16 = 2,
}

impl InputType {
    pub const fn bytes(self) -> usize {
        match self {
            InputType::F32 => 4,
            InputType::Bf16 | InputType::F16 => 2,
        }
    }
}

/// What one scale covers (stable values).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleSpan {
    /// 1 × `block_k` elements of a row.
    Block = 0,
    /// A whole row.
    Row = 1,
    /// A whole batch entry.
    Entry = 2,
}

/// Parameters of both kernels.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QuantizeParams {
    /// The input `[l][rows][k]`, 16-byte aligned.
    pub src: u64,
    /// Codes `[l][rows][k]` (e2m1: two per byte, the even-K element in the low nibble).
    pub dst: u64,
    /// Scales in an affine layout: scale `(l, row block, k block)` at
    /// `l·scale_stride_l + rb·scale_stride_r + kb·scale_stride_k` (in scales).
    pub scales: u64,
    pub scale_stride_l: u64,
    pub scale_stride_r: u64,
    pub scale_stride_k: u64,
    /// 0, or one-byte scales in the 128×4 swizzled layout, `swizzled_entry` bytes per batch entry.
    pub swizzled: u64,
    pub swizzled_entry: u64,
    /// 0, or fp32 scales in the FP8 kernel's A-role layout `[l][k/128][m_pad]` (1×128 blocks).
    pub sfa: u64,
    /// Maxima (f32 bits) by [`ScaleSpan`]: `[l][rows]` for rows, `[l]` for entries; NVFP4's
    /// tensor maximum at `tensor_amax`.
    pub amax: u64,
    pub tensor_amax: u64,
    pub rows: u32,
    pub k: u32,
    pub batch: u32,
    pub m_pad: u32,
    /// [`InputType`].
    pub input: u32,
    /// [`ScaleSpan`].
    pub span: u32,
    /// Elements of a 1×k block ([`ScaleSpan::Block`]): 16, 32 or 128.
    pub block_k: u32,
    /// NVFP4: the tensor scale when given (> 0); 0: computed from `tensor_amax`.
    pub tensor_scale: f32,
}

/// One quantizer kernel: the element type it writes and its scale type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantizeKernel {
    pub elem: ElemType,
    pub scale: ScaleType,
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
        /// Every quantizer kernel (the registry's rows).
        pub const KERNELS: &[QuantizeKernel] = &[$(QuantizeKernel {
            elem: ElemType::$elem,
            scale: ScaleType::$scale,
            info: KernelInfo {
                name: $name,
                max_threads: Some(QUANTIZE_THREADS),
                min_blocks_per_sm: 1,
                targets: TARGETS,
            },
        }),*];
        #[cfg(target_arch = "nvptx64")]
        mod entries {
            use super::QuantizeParams;
            use crate::format::{ElemType, ScaleType};
            $(const _: () = {
                /// # Safety
                /// As [`super::device::quantize`].
                #[unsafe(export_name = $name)]
                unsafe extern "ptx-kernel" fn kernel(p: QuantizeParams) {
                    // SAFETY: the launch's contract.
                    unsafe {
                        super::device::quantize::<{ ElemType::$elem as u32 }, { ScaleType::$scale as u32 }>(&p)
                    }
                }
            };)*
            /// # Safety
            /// As [`super::device::amax`].
            #[unsafe(export_name = "quantize_amax")]
            unsafe extern "ptx-kernel" fn amax(p: QuantizeParams) {
                // SAFETY: the launch's contract.
                unsafe { super::device::amax(&p) }
            }
        }
    };
}

quantize_kernels! {
    ("quantize_e4m3_f32", E4M3, F32),
    ("quantize_e5m2_f32", E5M2, F32),
    ("quantize_e4m3_e8m0", E4M3, E8M0),
    ("quantize_e5m2_e8m0", E5M2, E8M0),
    ("quantize_e2m1_e8m0", E2M1, E8M0),
    ("quantize_e2m1_ue4m3", E2M1, UE4M3)
}

/// The quantizer for `elem` codes with `scale` scales.
pub fn kernel(elem: ElemType, scale: ScaleType) -> Option<&'static QuantizeKernel> {
    KERNELS.iter().find(|k| k.elem == elem && k.scale == scale)
}

/// Lanes of one scale block, and scale blocks per row (a row's lanes: their product).
pub const fn lanes(p: &QuantizeParams) -> (u32, u32) {
    if p.span == ScaleSpan::Block as u32 {
        (p.block_k / ELEMS_PER_THREAD, p.k.div_ceil(p.block_k))
    } else {
        // One scale over the whole row (or entry): the row's lanes share no maximum.
        (1, p.k.div_ceil(ELEMS_PER_THREAD))
    }
}

pub use crate::format::quantize::{NON_FINITE, magnitude_bits};

#[cfg(target_arch = "nvptx64")]
mod device {
    use super::{
        ELEMS_PER_THREAD, NON_FINITE, QUANTIZE_THREADS, QuantizeParams, lanes, magnitude_bits,
    };
    use crate::format::quantize::{block_scale_of_bits, nvfp4_tensor_scale, quantize_element};
    use crate::format::swizzle::swizzled_128x4_index;
    use crate::format::{ElemType, ScaleType, f16};
    use crate::ptx::{global, thread};

    /// Eight input elements from `at` (an element index, a multiple of 8).
    /// # Safety
    /// `p.src` holds element `at + 7` and is 16-byte aligned.
    #[inline(always)]
    unsafe fn load8(p: &QuantizeParams, at: u64) -> [f32; 8] {
        let mut x = [0f32; 8];
        // SAFETY: the caller's contract; 8 elements are 16 (bf16 / fp16) or 32 (f32) bytes.
        unsafe {
            if p.input == 0 {
                let a = global::load_f32x4(p.src + 4 * at);
                let b = global::load_f32x4(p.src + 4 * at + 16);
                x[..4].copy_from_slice(&a);
                x[4..].copy_from_slice(&b);
            } else {
                let w = global::load_f32x4(p.src + 2 * at);
                for (i, v) in w.iter().enumerate() {
                    let bits = v.to_bits();
                    for (j, h) in [bits & 0xFFFF, bits >> 16].into_iter().enumerate() {
                        x[2 * i + j] = if p.input == 1 {
                            f32::from_bits(h << 16)
                        } else {
                            f16::decode(h as u16)
                        };
                    }
                }
            }
        }
        x
    }

    /// # Safety
    /// `p` describes live buffers (see [`QuantizeParams`]), `k % 8 == 0`, `amax` / `tensor_amax`
    /// zeroed; grid `rows` × `batch` blocks of [`QUANTIZE_THREADS`].
    #[inline(always)]
    pub(crate) unsafe fn amax(p: &QuantizeParams) {
        let (r, l, t) = (thread::block_x(), thread::block_y(), thread::thread_x());
        let row = (l as u64 * p.rows as u64 + r as u64) * p.k as u64;
        let mut m = 0u32;
        let mut e = ELEMS_PER_THREAD * t;
        while e < p.k {
            // SAFETY: elements e..e+8 of the row (k % 8 == 0).
            for x in unsafe { load8(p, row + e as u64) } {
                m = m.max(magnitude_bits(x));
            }
            e += ELEMS_PER_THREAD * QUANTIZE_THREADS;
        }
        let m = thread::group_max_u32(m, 32);
        if t % 32 == 0 {
            // SAFETY: the slots exist when their span is in use (the launch's contract).
            unsafe {
                match p.span {
                    1 => global::reduce_max_u32(
                        p.amax + 4 * (l as u64 * p.rows as u64 + r as u64),
                        m,
                    ),
                    2 => global::reduce_max_u32(p.amax + 4 * l as u64, m),
                    _ => {}
                }
                if p.tensor_amax != 0 {
                    global::reduce_max_u32(p.tensor_amax, m);
                }
            }
        }
    }

    /// # Safety
    /// `p` describes live buffers (see [`QuantizeParams`]), `k % 8 == 0`, the maxima written by
    /// [`amax`] where the span or NVFP4 needs them; any grid of [`QUANTIZE_THREADS`]-thread blocks.
    #[inline(always)]
    pub(crate) unsafe fn quantize<const E: u32, const S: u32>(p: &QuantizeParams) {
        let elem = match E {
            0 => ElemType::E4M3,
            1 => ElemType::E5M2,
            _ => ElemType::E2M1,
        };
        let scale = match S {
            0 => ScaleType::E8M0,
            1 => ScaleType::UE4M3,
            _ => ScaleType::F32,
        };
        let (per_block, blocks) = lanes(p);
        let row_lanes = per_block * blocks;
        let total = p.batch as u64 * p.rows as u64 * row_lanes as u64;
        let tensor_scale = if scale == ScaleType::UE4M3 {
            if p.tensor_scale > 0.0 {
                p.tensor_scale
            } else {
                // SAFETY: written by the maximum pass (the launch's contract).
                let m = unsafe { global::load_u32_nc(p.tensor_amax) };
                if m == NON_FINITE {
                    f32::NAN
                } else {
                    nvfp4_tensor_scale(f32::from_bits(m), elem)
                }
            }
        } else {
            1.0
        };
        let stride = thread::grid_dim_x() as u64 * QUANTIZE_THREADS as u64;
        let mut base =
            thread::block_x() as u64 * QUANTIZE_THREADS as u64 + (thread::thread_x() & !31) as u64;
        let lane = thread::thread_x() % 32;
        // Whole warps go round together (the shuffles need every lane); lanes past the end mask.
        while base < total {
            let i = base + lane as u64;
            let live = i < total;
            let lr = i / row_lanes as u64;
            let v = (i % row_lanes as u64) as u32;
            let (l, r) = ((lr / p.rows as u64) as u32, (lr % p.rows as u64) as u32);
            let (kb, e0) = if p.span == 0 {
                (
                    v / per_block,
                    v / per_block * p.block_k + v % per_block * ELEMS_PER_THREAD,
                )
            } else {
                (0, v * ELEMS_PER_THREAD)
            };
            let valid = live && e0 < p.k;
            let at = (l as u64 * p.rows as u64 + r as u64) * p.k as u64 + e0 as u64;
            // SAFETY: elements at..at+8 exist when valid.
            let x = if valid {
                unsafe { load8(p, at) }
            } else {
                [0f32; 8]
            };
            let m = match p.span {
                0 => thread::group_max_u32(
                    x.iter().fold(0, |m, &v| m.max(magnitude_bits(v))),
                    per_block,
                ),
                // SAFETY: written by the maximum pass for this span.
                1 => unsafe {
                    global::load_u32_nc(p.amax + 4 * (l as u64 * p.rows as u64 + r as u64))
                },
                _ => unsafe { global::load_u32_nc(p.amax + 4 * l as u64) },
            };
            let (sbits, d) = block_scale_of_bits(scale, elem, m, tensor_scale);
            let mut codes = [0u32; 8];
            for (c, &xv) in codes.iter_mut().zip(&x) {
                *c = quantize_element(elem, xv, d);
            }
            // SAFETY: bytes of element at..at+8 of dst (8-byte aligned, 4 for e2m1) when valid.
            unsafe {
                if elem == ElemType::E2M1 {
                    let mut w = 0u32;
                    for (j, c) in codes.iter().enumerate() {
                        w |= (c & 0xF) << (4 * j);
                    }
                    global::store_u32_if(p.dst + at / 2, w, valid);
                } else {
                    let pack = |c: &[u32]| c[0] | c[1] << 8 | c[2] << 16 | c[3] << 24;
                    global::store_u32x2_if(p.dst + at, pack(&codes[..4]), pack(&codes[4..]), valid);
                }
            }
            // The block's first lane stores its scale (per row: the row's first lane; per entry:
            // the entry's first lane).
            let first = live
                && match p.span {
                    0 => v % per_block == 0 && e0 < p.k,
                    1 => v == 0,
                    _ => v == 0 && r == 0,
                };
            // A scale per entry has one row block; the others one per row.
            let rb = if p.span == 2 { 0 } else { r };
            let si = l as u64 * p.scale_stride_l
                + rb as u64 * p.scale_stride_r
                + kb as u64 * p.scale_stride_k;
            // SAFETY: the scale slots of the layouts the launch passed.
            unsafe {
                if scale == ScaleType::F32 {
                    global::store_u32_if(p.scales + 4 * si, sbits, first);
                    if p.sfa != 0 {
                        let a =
                            (l as u64 * (p.k / 128) as u64 + kb as u64) * p.m_pad as u64 + r as u64;
                        global::store_u32_if(p.sfa + 4 * a, sbits, first);
                    }
                } else {
                    global::store_u8_if(p.scales + si, sbits, first);
                    if p.swizzled != 0 {
                        let a = l as u64 * p.swizzled_entry
                            + swizzled_128x4_index(r as usize, kb as usize, blocks as usize) as u64;
                        global::store_u8_if(p.swizzled + a, sbits, first);
                    }
                }
            }
            base += stride;
        }
    }
}
