//! The quantizers' device code: the maximum pass, the quantizer proper, and the per-element
//! encoding ([`Quotient`], [`encode4`]) that the fused epilogues and the MoE kernels share.

use super::params::lanes_of;
use super::{InputType, NON_FINITE, QUANTIZE_THREADS, QuantizeParams, ScaleSpan, quantize_elems};
use crate::format::quantize::{
    Divisor, Reciprocal, Reciprocal64, block_scale_of_bits, fp8_ratio_scale, max_magnitude_bits,
    nvfp4_tensor_scale,
};
use crate::format::swizzle::swizzled_128x4_index;
use crate::format::{ElemType, ScaleType, e2m1};
use crate::ptx::{convert, global, math, smem, thread};

/// One lane's words of a row as loaded: two 16-byte loads (8 f32, or 16 bf16 / fp16 two to
/// a word), decoded by [`decode`] when used: a load in flight holds 8 registers whatever the
/// input type.
type Raw = [u32; 8];

/// The words of elements `at..` ([`Raw`]) of input type `I`, each 16-byte half where `live`
/// says (zeros elsewhere).
/// # Safety
/// `p.src` is 16-byte aligned, `at` a multiple of 8, and holds each live half's elements.
#[inline(always)]
unsafe fn load_raw<const I: u32>(p: &QuantizeParams, at: u64, live: [bool; 2]) -> Raw {
    let bytes = InputType::of(I).bytes() as u64;
    let mut w = [0u32; 8];
    for h in 0..2 {
        if live[h] {
            // SAFETY: the caller's contract: 16 bytes of live elements, 16-byte aligned
            // (`at` a multiple of 8 elements of at least 2 bytes).
            let q = unsafe { global::load_f32x4(p.src + bytes * at + 16 * h as u64) };
            for i in 0..4 {
                w[4 * h + i] = q[i].to_bits();
            }
        }
    }
    w
}

/// The `N` elements (8 for f32, 16 for bf16 / fp16) of [`load_raw`]'s words.
#[inline(always)]
fn decode<const I: u32, const N: usize>(w: Raw) -> [f32; N] {
    let mut x = [0f32; N];
    // (Index loops: an array's by-value iterator kept these loops rolled, and the values
    // in a register array indexed by a run-time counter.)
    for i in 0..N {
        x[i] = match InputType::of(I) {
            InputType::F32 => f32::from_bits(w[i]),
            // A bf16 is the top half of its f32.
            InputType::Bf16 => f32::from_bits(if i % 2 == 0 {
                w[i / 2] << 16
            } else {
                w[i / 2] & 0xFFFF_0000
            }),
            InputType::F16 => convert::f16_to_f32((w[i / 2] >> (16 * (i % 2))) as u16),
        };
    }
    x
}

/// # Safety
/// `p` describes live buffers (see [`QuantizeParams`]), `k % 8 == 0`, `amax` / `tensor_amax`
/// zeroed; grid `rows` × `batch` blocks of [`QUANTIZE_THREADS`], [`super::ROW_SHARED_BYTES`]
/// of dynamic shared memory.
#[inline(always)]
pub(crate) unsafe fn amax(p: &QuantizeParams) {
    // SAFETY: the caller's contract, for the input type the parameters name.
    unsafe {
        match InputType::of(p.input) {
            InputType::F32 => amax_of::<{ InputType::F32 as u32 }>(p),
            InputType::Bf16 => amax_of::<{ InputType::Bf16 as u32 }>(p),
            InputType::F16 => amax_of::<{ InputType::F16 as u32 }>(p),
        }
    }
}

/// [`amax`] of input type `I` (8 elements a step: one 16-byte load, or two of f32).
/// # Safety
/// As [`amax`], `I == p.input`.
#[inline(always)]
unsafe fn amax_of<const I: u32>(p: &QuantizeParams) {
    let (r, l, t) = (thread::block_x(), thread::block_y(), thread::thread_x());
    let row = (l as u64 * p.rows as u64 + r as u64) * p.k as u64;
    // Two 16-byte loads a step (8 f32, or 16 bf16 / fp16: the quantizer's step), both in
    // flight at once; a 16-bit row's last half-step masked (k % 8 == 0).
    let per = quantize_elems(InputType::of(I));
    let mut m = 0u32;
    let mut e = per * t;
    while e < p.k {
        let live = [true, I == InputType::F32 as u32 || e + 8 < p.k];
        // SAFETY: elements e..e+8 of the row, and e+8..e+16 where `live` (k % 8 == 0).
        let w = unsafe { load_raw::<I>(p, row + e as u64, live) };
        m = m.max(if I == InputType::F32 as u32 {
            max_magnitude_bits(&decode::<I, 8>(w))
        } else {
            max_magnitude_bits(&decode::<I, 16>(w))
        });
        e += per * QUANTIZE_THREADS;
    }
    // The block's maximum first, then one reduction into memory a block: a reduction from
    // every warp made 8 × rows `red.max` on the tensor's one word, which the L2 serializes
    // (about 50 µs of the per-tensor call at 4096 × 7168, where the reads take 15).
    // SAFETY: 8 warps, the launch's shared memory (the caller's contract).
    let m = unsafe { block_max(m, QUANTIZE_THREADS) };
    if t == 0 {
        // SAFETY: the slots exist when their span is in use (the launch's contract).
        unsafe {
            match p.span {
                1 => global::reduce_max_u32(p.amax + 4 * (l as u64 * p.rows as u64 + r as u64), m),
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
/// `quantize_element` takes it, correctly rounded, without a division per element:
/// - an e8m0 scale (a power of two): its reciprocal is exact, so `x · (1/d)` is the exact
///   quotient rounded once: one product;
/// - an fp32 scale: [`Reciprocal`] (a product and two `fma`, the same quotient wherever it
///   can reach a code);
/// - NVFP4's two-level divisor (f64): [`Reciprocal64`], the same step in f64, then rounded
///   to f32 (a division in f64 per element took NVFP4's quantizer to 20 % of the copy
///   ceiling).
#[derive(Clone, Copy)]
pub(crate) struct Quotient {
    /// The kind of scale (a constant where the caller's is: the other kinds' code is left
    /// out, and no element branches on the kind).
    scale: ScaleType,
    /// An all-zero NVFP4 block ([`Divisor::Zero`]): every quotient is 0 (a select, not a
    /// branch per element).
    zero: bool,
    /// NVFP4's divisor (1 where `zero`).
    wide: Reciprocal64,
    /// An fp32 scale's divisor; an e8m0 scale's, whose `r` is exactly `1/d`.
    rec: Reciprocal,
    /// `rec.k` is 1, as the compiler sees it ([`Self::unit`]): [`encode4`]'s FP8 codes skip
    /// the prescaling product (an instruction an element).
    unit: bool,
}

impl Quotient {
    /// The quotient by divisor `d` of a block whose scale is of type `scale`.
    #[inline(always)]
    pub(crate) fn new(scale: ScaleType, d: Divisor) -> Self {
        let (zero, s) = match d {
            Divisor::Zero => (true, 1.0),
            Divisor::F32(s) => (false, s as f64),
            // (Only NVFP4's divisors are f64.)
            Divisor::F64(s) => (false, s),
        };
        let rec = match scale {
            // A power of two 2^e, e in -127..=127: 2^-e is an f32 (2^-127 a subnormal one),
            // and `rcp.rn` gives it exactly; NaN stays NaN.
            ScaleType::E8M0 => Reciprocal {
                k: 1.0,
                s: s as f32,
                r: math::recip_rn(s as f32),
            },
            ScaleType::F32 => Reciprocal::new(s as f32, math::recip_rn),
            ScaleType::UE4M3 => Reciprocal {
                k: 1.0,
                s: 1.0,
                r: 1.0,
            },
        };
        let wide = if scale == ScaleType::UE4M3 {
            Reciprocal64::new(s, math::recip_rn_f64)
        } else {
            Reciprocal64 { s: 1.0, r: 1.0 }
        };
        Quotient {
            scale,
            zero,
            wide,
            rec,
            unit: false,
        }
    }

    /// The quotient of a block whose e8m0 scale is `code`: [`Self::new`]'s for
    /// `Divisor::F32(e8m0::decode(code))`, with the exact reciprocal made from the code
    /// (`e8m0::recip`) instead of `rcp.rn` (the fused epilogue's MXFP8 output takes eight a
    /// lane and tile).
    #[inline(always)]
    pub(crate) fn e8m0(code: u32) -> Self {
        let r = crate::format::e8m0::recip(code as u8);
        Quotient {
            scale: ScaleType::E8M0,
            zero: false,
            wide: Reciprocal64 { s: 1.0, r: 1.0 },
            rec: Reciprocal {
                k: 1.0,
                s: crate::format::e8m0::decode(code as u8),
                r,
            },
            unit: false,
        }
    }

    /// The fp32 scale (its bits) and the quotient of an FP8 block (e4m3 or e5m2) whose
    /// largest magnitude's bits are `m` ([`magnitude_bits`](crate::format::quantize::magnitude_bits)): [`block_scale_of_bits`]'s, with
    /// the scale's division by the element type's maximum as [`fp8_ratio_scale`] (the same
    /// value, without the division's instructions and slow-path call).
    #[inline(always)]
    pub(crate) fn fp8_block(elem: ElemType, m: u32) -> (u32, Self) {
        // (`block_scale`'s rules: NaN or ±Inf in the block, the NaN scale; an all-zero
        // block, scale 1.)
        let s = if m == NON_FINITE {
            f32::NAN
        } else if m == 0 {
            1.0
        } else {
            fp8_ratio_scale(f32::from_bits(m), elem, math::mul_rn, math::fma)
        };
        (s.to_bits(), Quotient::new(ScaleType::F32, Divisor::F32(s)))
    }

    /// Whether this fp32 scale's quotients need no prescaling (`rec.k` is 1: every scale
    /// between 2^-85 and 2^120, every FP8 block whose largest magnitude is above 2^-76) and
    /// the scale is not NaN (a block with NaN or ±Inf, whose codes all take the general
    /// path's NaN).
    #[inline(always)]
    pub(crate) fn is_unit(&self) -> bool {
        self.scale == ScaleType::F32 && self.rec.k == 1.0 && !self.rec.s.is_nan()
    }

    /// This quotient, known to the compiler to need no prescaling (only where
    /// [`Self::is_unit`]).
    #[inline(always)]
    pub(crate) fn unit(self) -> Self {
        Quotient { unit: true, ..self }
    }

    /// Whether the divisor is NaN (every quotient is then NaN; no other block has one).
    #[inline(always)]
    fn is_nan(&self) -> bool {
        if self.scale == ScaleType::UE4M3 {
            self.wide.s.is_nan()
        } else {
            self.rec.s.is_nan()
        }
    }

    /// Lane `lane`'s quotient of an fp32 scale, in every lane (shuffles: every lane of the
    /// warp calls it).
    #[inline(always)]
    pub(crate) fn from_lane(self, lane: u32) -> Self {
        let f = |x: f32| f32::from_bits(thread::shfl_idx_u32(x.to_bits(), lane));
        Quotient {
            scale: ScaleType::F32,
            zero: thread::shfl_idx_u32(self.zero as u32, lane) != 0,
            wide: self.wide,
            rec: Reciprocal {
                k: f(self.rec.k),
                s: f(self.rec.s),
                r: f(self.rec.r),
            },
            unit: false,
        }
    }

    #[inline(always)]
    fn of_elem(self, x: f32) -> f32 {
        let q = match self.scale {
            ScaleType::UE4M3 => self.wide.quotient(x, math::mul_rn_f64, math::fma_f64),
            ScaleType::E8M0 => math::mul_rn(x, self.rec.r),
            ScaleType::F32 => self.rec.quotient(x, math::mul_rn, math::fma),
        };
        if self.zero { 0.0 } else { q }
    }
}

/// The largest `m` over the block's threads, in every thread: each warp's by `redux.sync`,
/// then the warps' through shared memory (a word each). Every thread of the block calls it
/// (two `bar.sync`: the second keeps the next call's stores behind this call's loads).
/// # Safety
/// The block has `lanes.div_ceil(32)` ≤ 32 warps and [`super::ROW_SHARED_BYTES`] of dynamic
/// shared memory.
#[inline(always)]
unsafe fn block_max(m: u32, lanes: u32) -> u32 {
    let (warp, lane) = (thread::thread_x() / 32, thread::thread_x() % 32);
    let base = smem::dynamic_base();
    let w = thread::warp_max_u32(m);
    // SAFETY: slot `warp` < 32 of the block's shared words (the caller's contract).
    unsafe {
        if lane == 0 {
            smem::store_u32(base + 4 * warp, w);
        }
        thread::sync_block();
        let mine = if lane < lanes.div_ceil(32) {
            smem::load_u32(base + 4 * lane)
        } else {
            0
        };
        thread::sync_block();
        thread::warp_max_u32(mine)
    }
}

/// The codes of four elements of one block with divisor `d` ([`Quotient::new`]), packed from the low bits (8
/// bits each, or 4 for e2m1): `format::quantize::quantize_element` of each, with the FP8
/// encodings in hardware (`cvt.rn.satfinite.{e4m3,e5m2}x2.f32`, the rule of their software
/// encoders: round to nearest even, saturating, subnormals kept) and e2m1's by one rounding
/// addition (`format::e2m1::encode_sat_finite`).
#[inline(always)]
pub(crate) fn encode4(elem: ElemType, x: [f32; 4], d: Quotient) -> u32 {
    if d.unit && matches!(elem, ElemType::E4M3 | ElemType::E5M2) {
        // The negated quotients (no negation an element), their codes' sign bits flipped
        // back four at once: the conversions saturate symmetrically and round to nearest
        // even, so the code of −q is q's with its sign bit flipped (NaN takes the other
        // path: `Quotient::is_unit`).
        let n = x.map(|v| d.rec.neg_quotient_unit(v, math::mul_rn, math::fma));
        let codes = if elem == ElemType::E4M3 {
            convert::f32x2_to_e4m3x2(n[0], n[1]) | convert::f32x2_to_e4m3x2(n[2], n[3]) << 16
        } else {
            convert::f32x2_to_e5m2x2(n[0], n[1]) | convert::f32x2_to_e5m2x2(n[2], n[3]) << 16
        };
        return codes ^ 0x8080_8080;
    }
    let q = x.map(|v| d.of_elem(v));
    match elem {
        ElemType::E4M3 => {
            convert::f32x2_to_e4m3x2(q[0], q[1]) | convert::f32x2_to_e4m3x2(q[2], q[3]) << 16
        }
        ElemType::E5M2 => {
            convert::f32x2_to_e5m2x2(q[0], q[1]) | convert::f32x2_to_e5m2x2(q[2], q[3]) << 16
        }
        ElemType::E2M1 => {
            let c = q.map(|v| e2m1::encode_sat_finite(v, math::min_abs, math::add_rn));
            // A NaN quotient comes only from a NaN scale (a block with NaN or ±Inf, or a NaN
            // tensor scale), whose quotients are all NaN: their codes are +0, as
            // `encode_sat` gives NaN.
            if d.is_nan() {
                0
            } else {
                c[0] | c[1] << 4 | c[2] << 8 | c[3] << 12
            }
        }
        _ => {
            let c = q.map(|v| elem.encode_sat(v) & 0xF);
            c[0] | c[1] << 4 | c[2] << 8 | c[3] << 12
        }
    }
}

/// # Safety
/// `p` describes live buffers (see [`QuantizeParams`]), `k % 8 == 0`, `p.input == I` and
/// `N` its [`super::quantize_elems`], the maxima written by [`amax`] where the span or NVFP4
/// needs them; a grid of [`QUANTIZE_THREADS`]-thread blocks, x: at least ⌈row lanes /
/// [`QUANTIZE_THREADS`]⌉ ([`super::lanes`]), y: any (rows are strided by it; rows + y <
/// 2^32), z: the batch.
///
/// `ROWS` (the per-row quantizers): the span is a row, the grid's x one block of the row's
/// lanes rounded up to whole warps (at most [`super::ROW_THREADS_MAX`]),
/// [`super::ROW_SHARED_BYTES`] of dynamic shared memory; the row maximum is reduced in the block, no maximum pass.
#[inline(always)]
pub(crate) unsafe fn quantize<
    const E: u32,
    const S: u32,
    const I: u32,
    const N: usize,
    const ROWS: bool,
>(
    p: &QuantizeParams,
) {
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
    let n = N as u32;
    let (per_block, blocks) = lanes_of(p, n);
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
    // warp, so a scale block's lanes, 1, 2, 4, 8 or 16 aligned ones, are in one warp); the
    // batch entry is z, rows go round y. Everything but the row is fixed for the thread, and
    // worked out here once (a remainder by the run-time lanes a block, left in the row's
    // code, cost 20 instructions a row).
    let v = if ROWS {
        thread::thread_x()
    } else {
        thread::block_x() * QUANTIZE_THREADS + thread::thread_x()
    };
    let l = thread::block_z();
    // (Whole warps stay in the loop: the shuffles need every lane.)
    if v - thread::thread_x() % 32 >= row_lanes {
        return;
    }
    let lane_live = v < row_lanes;
    let block_span = p.span == ScaleSpan::Block as u32;
    let (kb, e0) = if block_span {
        let kb = v / per_block;
        (kb, kb * p.block_k + (v - kb * per_block) * n)
    } else {
        (0, v * n)
    };
    // The lane's 8-element groups inside the row (K % 8 == 0: a group is whole or out):
    // f32 has one (both 16-byte loads), bf16 / fp16 two (one load each).
    let group = |g: u32| lane_live && e0 + 8 * g < p.k;
    let loads = if N == 8 {
        [group(0), group(0)]
    } else {
        [group(0), group(1)]
    };
    // The block's first lane stores its scale (per row: the row's first lane; per entry:
    // the entry's first lane, in its first row).
    let first = group(0)
        && match p.span {
            0 => v % per_block == 0,
            _ => v == 0,
        };
    // The block's slot in the MX kernel's layout, but for the row: plane `kb / per`, entry
    // `kb % per` (`per` 2 or 4).
    let mx_per = p.mx_per.max(1);
    let mx_plane =
        (l as u64 * p.k.div_ceil(64) as u64 + (kb / mx_per) as u64) * p.mx_rows_pad as u64;
    let entry = l as u64 * p.rows as u64;
    let row_at = |r: u32| (entry + r as u64) * p.k as u64 + e0 as u64;
    // The row of visit `i` (< rows): from the first, or from the last (`p.reverse`).
    let row_of = |i: u32| if p.reverse != 0 { p.rows - 1 - i } else { i };
    let load = |i: u32| {
        // SAFETY: the live groups' elements of row `row_of(i)` < rows exist (the launch's
        // contract).
        if i < p.rows {
            unsafe { load_raw::<I>(p, row_at(row_of(i)), loads) }
        } else {
            [0; 8]
        }
    };
    // One row's quantization: codes, and the scale from the block's first lane.
    // SAFETY (the caller's, per row): `r < rows`; `x` its lane's elements.
    let row = |r: u32, x: [f32; N]| {
        let at = row_at(r);
        let m = match p.span {
            0 => thread::group_max_u32(max_magnitude_bits(&x), per_block),
            // SAFETY: the block's shared memory holds a word per warp (the launch's).
            1 if ROWS => unsafe { block_max(max_magnitude_bits(&x), row_lanes) },
            // SAFETY: written by the maximum pass for this span.
            1 => unsafe { global::load_u32_nc(p.amax + 4 * (entry + r as u64)) },
            _ => unsafe { global::load_u32_nc(p.amax + 4 * l as u64) },
        };
        let (sbits, d) = block_scale_of_bits(scale, elem, m, tensor_scale);
        let d = Quotient::new(scale, d);
        for g in 0..N / 8 {
            let lo = encode4(
                elem,
                [x[8 * g], x[8 * g + 1], x[8 * g + 2], x[8 * g + 3]],
                d,
            );
            let hi = encode4(
                elem,
                [x[8 * g + 4], x[8 * g + 5], x[8 * g + 6], x[8 * g + 7]],
                d,
            );
            let a = at + 8 * g as u64;
            let live = group(g as u32);
            // SAFETY: bytes of elements a..a+8 of dst (8-byte aligned, 4 for e2m1) when live.
            unsafe {
                if elem == ElemType::E2M1 {
                    global::store_u32_if(p.dst + a / 2, lo | hi << 16, live);
                } else {
                    global::store_u32x2_if(p.dst + a, lo, hi, live);
                }
            }
        }
        // A scale per entry has one row block; the others one per row.
        let (rb, first) = if p.span == 2 {
            (0, first && r == 0)
        } else {
            (r, first)
        };
        let si = l as u64 * p.scale_stride_l
            + rb as u64 * p.scale_stride_r
            + kb as u64 * p.scale_stride_k;
        // SAFETY: the scale slots of the layouts the launch passed.
        unsafe {
            if scale == ScaleType::F32 {
                global::store_u32_if(p.scales + 4 * si, sbits, first);
                if p.sfa != 0 {
                    // A 1×128 block's scale from its first lane; a row's or an entry's (the
                    // same for every 128 of K) into each K block's entry of the row, from the
                    // row's lanes 0..k/128, one each.
                    let (akb, put) = if block_span {
                        (kb, first)
                    } else {
                        (v, lane_live && v < p.k / 128)
                    };
                    let a =
                        (l as u64 * (p.k / 128) as u64 + akb as u64) * p.m_pad as u64 + r as u64;
                    global::store_u32_if(p.sfa + 4 * a, sbits, put);
                }
            } else {
                global::store_u8_if(p.scales + si, sbits, first);
                if p.mx != 0 {
                    let a = (mx_plane + r as u64) * mx_per as u64 + (kb % mx_per) as u64;
                    global::store_u8_if(p.mx + a, sbits, first);
                }
                if p.swizzled != 0 {
                    let a = l as u64 * p.swizzled_entry
                        + swizzled_128x4_index(r as usize, kb as usize, blocks as usize) as u64;
                    global::store_u8_if(p.swizzled + a, sbits, first);
                }
            }
        }
    };
    // Each thread goes round several rows (the grid's y is a few waves of blocks), the
    // loads of the next rows issued before this row's arithmetic (raw words: 8 registers a
    // row): three rows of 8 f32, two of 16 bf16 / fp16 (64 bytes a thread in flight; a
    // third row and the 16 decoded values spilled at 64 registers). ncu on 8 elements a
    // thread and one row ahead: a third of the warps' samples waited at the first use of a
    // load, DRAM 24 % busy. (One call of `row`: a closure called twice was outlined, its
    // arrays in local memory.)
    let stride = thread::grid_dim_y();
    let mut i = thread::block_y();
    let three = N == 8;
    let mut ahead = [
        load(i),
        load(i + stride),
        if three { load(i + 2 * stride) } else { [0; 8] },
    ];
    while i < p.rows {
        let now = ahead[0];
        ahead = if three {
            [ahead[1], ahead[2], load(i + 3 * stride)]
        } else {
            [ahead[1], load(i + 2 * stride), [0; 8]]
        };
        row(row_of(i), decode::<I, N>(now));
        i += stride;
    }
}
