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
//!   in the FP8 kernel's A-role layout `[l][k/128][m_pad]`. The grid's x covers a row's lanes,
//!   its z the batch, and rows go round its y: a thread's row, block and column come from its
//!   indices with 32-bit arithmetic (a flat index split by 64-bit divisions cost more than the
//!   encoding). FP8 codes come from the hardware conversion (`encode4`), the quotients from
//!   each block's reciprocal with one correction (`format::quantize::Reciprocal`: the
//!   division's quotient without its cost).
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
/// Blocks of the quantizer that must fit on one SM (`.minnctapersm`): ptxas keeps it within
/// 65536 / (4 · 256) = 64 registers a thread, so that 1024 threads an SM, each with the loads of
/// three rows ahead in flight, keep the memory busy.
pub const QUANTIZE_MIN_BLOCKS: u32 = 4;
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
                min_blocks_per_sm: QUANTIZE_MIN_BLOCKS,
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
pub(crate) mod device {
    use super::{
        ELEMS_PER_THREAD, NON_FINITE, QUANTIZE_THREADS, QuantizeParams, ScaleSpan, lanes,
        magnitude_bits,
    };
    use crate::format::quantize::{Divisor, Reciprocal, block_scale_of_bits, nvfp4_tensor_scale};
    use crate::format::swizzle::swizzled_128x4_index;
    use crate::format::{ElemType, ScaleType, f16};
    use crate::ptx::{convert, global, math, thread};

    /// Eight input elements from `at` (an element index, a multiple of 8).
    /// # Safety
    /// `p.src` holds element `at + 7` and is 16-byte aligned.
    #[inline(always)]
    unsafe fn load8(p: &QuantizeParams, at: u64) -> [f32; 8] {
        // SAFETY: the caller's contract.
        decode8(p, unsafe { load8_raw(p, at) })
    }

    /// [`load8`]'s bytes as loaded (f32: eight words; bf16 / fp16: the first four, two
    /// elements each), decoded later by [`decode8`]: a load in flight holds 4 registers, not 8.
    /// # Safety
    /// As [`load8`].
    #[inline(always)]
    unsafe fn load8_raw(p: &QuantizeParams, at: u64) -> [f32; 8] {
        let mut x = [0f32; 8];
        // SAFETY: the caller's contract; 8 elements are 16 (bf16 / fp16) or 32 (f32) bytes.
        unsafe {
            if p.input == 0 {
                x[..4].copy_from_slice(&global::load_f32x4(p.src + 4 * at));
                x[4..].copy_from_slice(&global::load_f32x4(p.src + 4 * at + 16));
            } else {
                x[..4].copy_from_slice(&global::load_f32x4(p.src + 2 * at));
            }
        }
        x
    }

    /// The eight elements of [`load8_raw`]'s words.
    #[inline(always)]
    fn decode8(p: &QuantizeParams, w: [f32; 8]) -> [f32; 8] {
        if p.input == 0 {
            return w;
        }
        let mut x = [0f32; 8];
        // (Index loops: an array's by-value iterator kept these loops rolled, and the eight
        // values in a register array indexed by a run-time counter.)
        for i in 0..8 {
            let h = (w[i / 2].to_bits() >> (16 * (i % 2))) & 0xFFFF;
            x[i] = if p.input == 1 {
                f32::from_bits(h << 16)
            } else {
                f16::decode(h as u16)
            };
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
            let x = unsafe { load8(p, row + e as u64) };
            // (By reference: an array's by-value iterator stays a rolled loop.)
            m = x.iter().fold(m, |m, &v| m.max(magnitude_bits(v)));
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

    /// A block's divisor, prepared once for its elements' quotients: `x / d` as the host's
    /// `quantize_element` takes it, correctly rounded. An f32 divisor through its reciprocal
    /// ([`Reciprocal`]: a product and two `fma` per element instead of a division, the same
    /// quotient wherever it can reach a code); NVFP4's two-level divisor in f64, rounded once.
    #[derive(Clone, Copy)]
    pub(crate) struct Quotient {
        zero: bool,
        wide: Option<f64>,
        rec: Reciprocal,
    }

    impl Quotient {
        #[inline(always)]
        pub(crate) fn of(d: Divisor) -> Self {
            let (zero, wide, s) = match d {
                Divisor::Zero => (true, None, 1.0),
                Divisor::F32(s) => (false, None, s),
                Divisor::F64(s) => (false, Some(s), 1.0),
            };
            Quotient {
                zero,
                wide,
                rec: Reciprocal::new(s, math::recip_rn),
            }
        }

        /// [`Self::of`] of a divisor known to be [`Divisor::Zero`] or [`Divisor::F32`] (an
        /// fp32 or e8m0 scale): no code for the f64 quotient.
        #[inline(always)]
        pub(crate) fn of_f32(d: Divisor) -> Self {
            let (zero, s) = match d {
                Divisor::F32(s) => (false, s),
                Divisor::Zero => (true, 1.0),
                Divisor::F64(_) => (false, f32::NAN),
            };
            Quotient {
                zero,
                wide: None,
                rec: Reciprocal::new(s, math::recip_rn),
            }
        }

        /// Lane `lane`'s [`Self::of_f32`] quotient, in every lane (shuffles: every lane of the
        /// warp calls it).
        #[inline(always)]
        pub(crate) fn from_lane(self, lane: u32) -> Self {
            let f = |x: f32| f32::from_bits(thread::shfl_idx_u32(x.to_bits(), lane));
            Quotient {
                zero: thread::shfl_idx_u32(self.zero as u32, lane) != 0,
                wide: None,
                rec: Reciprocal {
                    k: f(self.rec.k),
                    s: f(self.rec.s),
                    r: f(self.rec.r),
                },
            }
        }

        #[inline(always)]
        fn of_elem(self, x: f32) -> f32 {
            if let Some(s) = self.wide {
                (x as f64 / s) as f32
            } else if self.zero {
                0.0
            } else {
                self.rec.quotient(x, math::mul_rn, math::fma)
            }
        }
    }

    /// The codes of four elements of one block with divisor `d` ([`Quotient::of`]), packed from the low bits (8
    /// bits each, or 4 for e2m1): `format::quantize::quantize_element` of each, with the FP8
    /// encodings in hardware (`cvt.rn.satfinite.{e4m3,e5m2}x2.f32`, the rule of their software
    /// encoders: round to nearest even, saturating, subnormals kept).
    #[inline(always)]
    pub(crate) fn encode4(elem: ElemType, x: [f32; 4], d: Quotient) -> u32 {
        let q = x.map(|v| d.of_elem(v));
        match elem {
            ElemType::E4M3 => {
                convert::f32x2_to_e4m3x2(q[0], q[1]) | convert::f32x2_to_e4m3x2(q[2], q[3]) << 16
            }
            ElemType::E5M2 => {
                convert::f32x2_to_e5m2x2(q[0], q[1]) | convert::f32x2_to_e5m2x2(q[2], q[3]) << 16
            }
            _ => {
                let c = q.map(|v| elem.encode_sat(v) & 0xF);
                c[0] | c[1] << 4 | c[2] << 8 | c[3] << 12
            }
        }
    }

    /// # Safety
    /// `p` describes live buffers (see [`QuantizeParams`]), `k % 8 == 0`, the maxima written by
    /// [`amax`] where the span or NVFP4 needs them; a grid of [`QUANTIZE_THREADS`]-thread blocks,
    /// x: at least ⌈row lanes / [`QUANTIZE_THREADS`]⌉ ([`lanes`]), y: any (rows are strided by
    /// it; rows + y < 2^32), z: the batch.
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
        // This thread's lane of a row: x blocks cover a row's lanes (a block starts at a whole
        // warp, so a scale block's lanes, 2, 4 or 16 aligned ones, are in one warp); the batch
        // entry is z, rows go round y. No division by a run-time value but the one below.
        let v = thread::block_x() * QUANTIZE_THREADS + thread::thread_x();
        let l = thread::block_z();
        // (Whole warps stay in the loop: the shuffles need every lane.)
        if v - thread::thread_x() % 32 >= row_lanes {
            return;
        }
        let lane_live = v < row_lanes;
        let (kb, e0) = if p.span == ScaleSpan::Block as u32 {
            let kb = v / per_block.max(1);
            (kb, kb * p.block_k + (v - kb * per_block) * ELEMS_PER_THREAD)
        } else {
            (0, v * ELEMS_PER_THREAD)
        };
        let valid = lane_live && e0 < p.k;
        let row_at = |r: u32| (l as u64 * p.rows as u64 + r as u64) * p.k as u64 + e0 as u64;
        // SAFETY: elements at..at+8 of row r exist when valid and r < rows.
        let load = |r: u32| {
            if valid && r < p.rows {
                unsafe { load8_raw(p, row_at(r)) }
            } else {
                [0f32; 8]
            }
        };
        // One row's quantization: codes, and the scale from the block's first lane.
        // SAFETY (the caller's, per row): `r < rows`; `x` its lane's eight elements.
        let row = |r: u32, x: [f32; 8]| {
            let lr = l as u64 * p.rows as u64 + r as u64;
            let at = row_at(r);
            let m = match p.span {
                0 => thread::group_max_u32(
                    x.iter().fold(0, |m, &v| m.max(magnitude_bits(v))),
                    per_block,
                ),
                // SAFETY: written by the maximum pass for this span.
                1 => unsafe { global::load_u32_nc(p.amax + 4 * lr) },
                _ => unsafe { global::load_u32_nc(p.amax + 4 * l as u64) },
            };
            let (sbits, d) = block_scale_of_bits(scale, elem, m, tensor_scale);
            let d = Quotient::of(d);
            let lo = encode4(elem, [x[0], x[1], x[2], x[3]], d);
            let hi = encode4(elem, [x[4], x[5], x[6], x[7]], d);
            // SAFETY: bytes of element at..at+8 of dst (8-byte aligned, 4 for e2m1) when valid.
            unsafe {
                if elem == ElemType::E2M1 {
                    global::store_u32_if(p.dst + at / 2, lo | hi << 16, valid);
                } else {
                    global::store_u32x2_if(p.dst + at, lo, hi, valid);
                }
            }
            // The block's first lane stores its scale (per row: the row's first lane; per entry:
            // the entry's first lane).
            let first = lane_live
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
        };
        // Each thread goes round several rows (the grid's y is a few waves of blocks), the
        // loads of the next three rows issued before this row's arithmetic (raw words: 4
        // registers each for 16-bit input). ncu showed one row ahead too few: a third of the
        // warps' samples waited at the first use of a load, DRAM 24 % busy. (One call of `row`:
        // a closure called twice was outlined, its arrays in local memory.)
        let stride = thread::grid_dim_y();
        let mut r = thread::block_y();
        let mut ahead = [load(r), load(r + stride), load(r + 2 * stride)];
        while r < p.rows {
            let now = ahead[0];
            ahead = [ahead[1], ahead[2], load(r + 3 * stride)];
            row(r, decode8(p, now));
            r += stride;
        }
    }
}
