//! The fused epilogue ([`EpilogueParams`]): α, β·C, a per-column bias, an activation (SwiGLU
//! over paired columns), a residual, and output quantized into the codes and scales the next
//! GEMM reads as its A. One code path, run from [`super::epilogue::finish_unit`] by each
//! family's fused kernels (kernels of their own, [`crate::params::FusedParams`]: the plain
//! kernels carry none of this code), the steps chosen by data in the parameters, not a kernel per
//! combination.
//!
//! Two places run the steps, chosen by the kernel (the host picks it by the epilogue,
//! [`in_registers`](crate::params::in_registers)):
//! - *In the consumers' registers* ([`apply`], then the plain kernels' stores,
//!   [`quantize_fragment`] or [`quantize_fragment_mx`]): the epilogues without β·C, residual or
//!   SwiGLU, to any unquantized output, FP8 1×128 or MXFP8 (kernels of their own, v51). The
//!   kernels are the dense FP8 kernel with the steps applied to each fragment before its store
//!   (the dense layout and K loop, no finishing warps); the steps are in series with the MMAs, a
//!   few instructions a value (docs/PERF.md v48).
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

use super::epilogue::{Finish, Output, Staging, TileStore};
use super::layout::{
    FRAGMENT_ROWS, FUSED_WARP_ROWS, fused_chunk_offset, fused_lane_offset, fused_pair_offset,
    fused_warp_bytes,
};
use super::pipeline::Handoff;
use super::scheduler::WorkUnit;
use crate::format::quantize::{block_scale_of_bits, magnitude_bits};
use crate::format::{ElemType, ScaleType, f16};
use crate::params::{Activation, EpilogueParams, OutType};
use crate::ptx::wgmma::Fragment;
use crate::ptx::{bits, convert, global, math, smem, thread};
use crate::quantize::device::{Quotient, encode4};

const LOG2_E: f32 = core::f32::consts::LOG2_E;

/// Columns one pass of a warp over a staged row covers: 4 per lane.
const PASS_COLS: u32 = 128;

/// `$f::<ACT, $g…>($arg…)` with the activation `$act` ([`Activation`] as u32) as the constant
/// `ACT`: one copy of `$f` per activation, so that no value of it branches on the activation
/// (the copies' chains then interleave).
macro_rules! by_activation {
    ($act:expr, $f:ident::<$($g:tt),*>($($arg:expr),*)) => {{
        const RELU: u32 = Activation::Relu as u32;
        const ERF: u32 = Activation::GeluErf as u32;
        const TANH: u32 = Activation::GeluTanh as u32;
        const SILU: u32 = Activation::Silu as u32;
        const NONE: u32 = Activation::None as u32;
        match $act {
            RELU => $f::<RELU, $($g),*>($($arg),*),
            ERF => $f::<ERF, $($g),*>($($arg),*),
            TANH => $f::<TANH, $($g),*>($($arg),*),
            SILU => $f::<SILU, $($g),*>($($arg),*),
            _ => $f::<NONE, $($g),*>($($arg),*),
        }
    }};
}

/// 1 / (1 + e^-z).
#[inline(always)]
fn sigmoid(z: f32) -> f32 {
    math::recip_approx(1.0 + math::exp2_approx(-z * LOG2_E))
}

/// x · Φ(x), Φ from erfc by Abramowitz–Stegun 7.1.26 (no cancellation for negative x: Φ(x) is
/// the tail term itself there).
#[inline(always)]
fn gelu_erf(x: f32) -> f32 {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [
        0.254_829_6,
        -0.284_496_74,
        1.421_413_8,
        -1.453_152,
        1.061_405_4,
    ];
    let z = (x * core::f32::consts::FRAC_1_SQRT_2).abs();
    let t = math::recip_approx(math::fma(P, z, 1.0));
    let mut poly = A[4];
    for a in A[..4].iter().rev() {
        poly = math::fma(poly, t, *a);
    }
    // Half of erfc(z): the tail of the normal distribution beyond |x|.
    let tail = 0.5 * poly * t * math::exp2_approx(-z * z * LOG2_E);
    x * if x < 0.0 { tail } else { 1.0 - tail }
}

/// The activation `act` ([`Activation`] as u32) of `x`; SwiGLU's gate part is SiLU.
#[inline(always)]
pub fn activate(act: u32, x: f32) -> f32 {
    if act == Activation::Relu as u32 {
        // NaN stays NaN (the comparison is false), −0 stays −0.
        if x < 0.0 { 0.0 } else { x }
    } else if act == Activation::GeluErf as u32 {
        gelu_erf(x)
    } else if act == Activation::GeluTanh as u32 {
        // 0.5·(1 + tanh(u)) = sigmoid(2u).
        let u = 0.797_884_6 * (x + 0.044_715 * (x * x * x));
        x * sigmoid(2.0 * u)
    } else if act == Activation::Silu as u32 || act == Activation::SwiGlu as u32 {
        x * sigmoid(x)
    } else {
        x
    }
}

/// [`activate`] of four values, the activation tested once for the four (one branch per row
/// rather than per element).
#[inline(always)]
fn activate4(act: u32, x: [f32; 4]) -> [f32; 4] {
    // Each arm is `activate` with a constant, so its tests fold away.
    let (relu, erf, tanh, silu) = (
        Activation::Relu as u32,
        Activation::GeluErf as u32,
        Activation::GeluTanh as u32,
        Activation::Silu as u32,
    );
    if act == relu {
        x.map(|v| activate(relu, v))
    } else if act == erf {
        x.map(|v| activate(erf, v))
    } else if act == tanh {
        x.map(|v| activate(tanh, v))
    } else if act == silu || act == Activation::SwiGlu as u32 {
        x.map(|v| activate(silu, v))
    } else {
        x
    }
}

/// Where one warp stages its rows: [`FUSED_WARP_ROWS`](super::layout::FUSED_WARP_ROWS) rows of
/// [`fused_row_bytes`](super::layout::fused_row_bytes), in shared memory or in global memory.
#[derive(Clone, Copy)]
struct Scratch {
    addr: u64,
    shared: bool,
    block_n: u32,
}

impl Scratch {
    /// Warp `warp` of consumer `c`'s rows: in the fused kernel's staging in shared memory where
    /// it has one (`staging.base` set), else in the global scratch (this CTA's, consumer's and
    /// warp's part).
    #[inline(always)]
    fn of(e: &EpilogueParams, staging: Staging, c: u32, warp: u32) -> Scratch {
        let bytes = fused_warp_bytes(staging.block_n);
        let slot = c * 4 + warp;
        let (addr, shared) = if staging.base != 0 {
            ((staging.base + slot * bytes) as u64, true)
        } else {
            let slot = thread::block_x() * staging.consumers * 4 + slot;
            (e.scratch + slot as u64 * bytes as u64, false)
        };
        Scratch {
            addr,
            shared,
            block_n: staging.block_n,
        }
    }

    /// Byte offset of 16-byte chunk `q` (columns `4q..4q + 4`) of staged row `r`.
    #[inline(always)]
    fn at(self, r: u32, q: u32) -> u32 {
        fused_chunk_offset(r, q, self.block_n)
    }

    /// Reads the four f32 of chunk `q` of row `r`.
    /// # Safety
    /// The chunk is inside this warp's rows, written before a [`thread::sync_warp`].
    #[inline(always)]
    unsafe fn load4(self, r: u32, q: u32) -> [f32; 4] {
        let off = self.at(r, q);
        // SAFETY: the caller's contract.
        unsafe {
            if self.shared {
                smem::load_u32x4(self.addr as u32 + off).map(f32::from_bits)
            } else {
                global::load_f32x4(self.addr + off as u64)
            }
        }
    }
}

/// Writes one thread's whole fragment into its warp's rows: value pair `(i, i + 1)`, `i = 4g +
/// 2h`, is row `lane/4 + 8h`, columns `8g + 2·(lane % 4)` and `+ 1`. One unrolled loop per
/// memory space (an index into the fragment that is not a constant would move it to the stack).
/// # Safety
/// `s` is this warp's staging for tiles of `F::N` columns.
#[inline(always)]
unsafe fn stage<F: Fragment>(s: Scratch, lane: u32, acc: &F) {
    let acc = acc.as_ref();
    // This thread's first value's address (made from `s.addr`, which [`stage_unit`] makes anew for
    // each tile, so that none of the addresses below is computed before the persistent loop),
    // and each pair's constant offset from it.
    let first = s.addr + fused_lane_offset(lane, F::N) as u64;
    let at = |g: usize, h: usize| first + fused_pair_offset(g as u32, h as u32, F::N) as u64;
    // SAFETY: the caller's contract (row < 16, column < F::N); the rows are this warp's.
    unsafe {
        if s.shared {
            for g in 0..(F::N / 8) as usize {
                for h in 0..2 {
                    let i = 4 * g + 2 * h;
                    let a = at(g, h) as u32;
                    smem::store_u32x2(a, [acc[i].to_bits(), acc[i + 1].to_bits()]);
                }
            }
        } else {
            for g in 0..(F::N / 8) as usize {
                for h in 0..2 {
                    let i = 4 * g + 2 * h;
                    let (x, y) = (acc[i].to_bits(), acc[i + 1].to_bits());
                    global::store_u32x2_if(at(g, h), x, y, true);
                }
            }
        }
    }
}

/// Four elements `col..col + 4` of a row of `cols` elements of `ty` ([`OutType`]) at `ptr`,
/// the row starting at element `row_at`: one vector load where the row's length and `col` make
/// it aligned (`col` and the row length multiples of 4) and inside, else one load per element
/// with columns past the row clamped to its last (their values are not used).
/// # Safety
/// `ptr` holds the row, constant during the kernel; `cols` ≥ 1.
#[inline(always)]
unsafe fn load4(ptr: u64, ty: u32, row_at: u64, col: u32, cols: u32) -> [f32; 4] {
    // (SwiGLU's residual columns start at even, not only multiple-of-4, columns.)
    let vector = cols.is_multiple_of(4) && col.is_multiple_of(4) && col + 4 <= cols;
    let at = |k: u32| row_at + (col + k).min(cols - 1) as u64;
    // SAFETY (every load): the caller's contract; a vector load only where it is inside the row
    // and aligned (the row's first element and `col` are multiples of 4).
    unsafe {
        if ty == OutType::F32 as u32 {
            if vector {
                return global::load_f32x4(ptr + 4 * at(0));
            }
            return [0, 1, 2, 3].map(|k| global::load_f32_nc(ptr + 4 * at(k)));
        }
        let h: [u32; 4] = if vector {
            let [a, b] = global::load_u32x2_nc(ptr + 2 * at(0));
            [a & 0xFFFF, a >> 16, b & 0xFFFF, b >> 16]
        } else {
            [0, 1, 2, 3].map(|k| global::load_u16_nc(ptr + 2 * at(k)) as u32)
        };
        if ty == OutType::Bf16 as u32 {
            h.map(|h| f32::from_bits(h << 16))
        } else {
            h.map(|h| f16::decode(h as u16))
        }
    }
}

/// The quantized output's element and scale types.
#[inline(always)]
fn quant_types(e: &EpilogueParams) -> (ElemType, ScaleType) {
    (
        ElemType::from_u32(e.q_elem).unwrap_or(ElemType::E4M3),
        ScaleType::from_u32(e.q_scale).unwrap_or(ScaleType::F32),
    )
}

/// One row's 4 staged values `v` at product columns `col..col + 4` (lane-uniform row `row` of
/// batch entry `l`): the steps up to the residual, then the store (`live`: the lane's columns
/// are inside the tile; stores are masked at N as well).
/// # Safety
/// As [`finish_staged`].
#[inline(always)]
unsafe fn finish4(
    e: &EpilogueParams,
    out: &Output,
    (l, row, col): (u32, u32, u32),
    v: [f32; 4],
    bias: Option<[f32; 4]>,
    (live, lane): (bool, u32),
) {
    let n = out.n;
    let paired = e.paired();
    let n_out = if paired { n / 2 } else { n };
    let mut t = v.map(|x| math::mul_rn(e.alpha, x));
    let row_l = l as u64 * out.m as u64 + row as u64;
    // SAFETY (the loads): the host's buffers are the product's shape (C), one row of N or L of
    // them (the bias), the output's shape (the residual).
    if e.c != 0 {
        let c = unsafe { load4(e.c, e.c_type, row_l * n as u64, col, n) };
        for k in 0..4 {
            t[k] = math::add_rn(t[k], math::mul_rn(e.beta, c[k]));
        }
    }
    if let Some(b) = bias {
        for k in 0..4 {
            t[k] = math::add_rn(t[k], b[k]);
        }
    }
    // The output's values (2 with SwiGLU: slots 2 and 3 unused) and first column.
    let (mut y, nv, ocol) = if paired {
        let silu = Activation::Silu as u32;
        (
            [
                activate(silu, t[0]) * t[1],
                activate(silu, t[2]) * t[3],
                0.0,
                0.0,
            ],
            2,
            col / 2,
        )
    } else {
        (activate4(e.activation, t), 4, col)
    };
    if e.residual != 0 {
        let r = unsafe {
            load4(
                e.residual,
                e.residual_type,
                row_l * n_out as u64,
                ocol,
                n_out,
            )
        };
        for k in 0..4 {
            y[k] = math::add_rn(y[k], r[k]);
        }
    }
    let idx = row_l * n_out as u64 + ocol as u64;
    let live = live && ocol < n_out;
    if e.quantized() {
        // SAFETY: the caller's contract.
        unsafe { quantize(e, (l, row, ocol), idx, y, (nv, n_out), (live, lane)) };
        return;
    }
    // The output's `nv` values at `idx`: one vector store where the row's length keeps it
    // aligned and it is inside the row, else one predicated store per element.
    let vector = n_out.is_multiple_of(nv) && ocol + nv <= n_out;
    let ty = out.out_type;
    // SAFETY: every store's predicate says its element is inside the L·M·N_out output (`row` <
    // the rows written: the caller's); a vector store is aligned to its size.
    unsafe {
        if ty == OutType::F32 as u32 {
            let b = y.map(f32::to_bits);
            let a = out.ptr + 4 * idx;
            global::store_u32x2_if(a, b[0], b[1], live && vector);
            global::store_u32x2_if(a + 8, b[2], b[3], live && vector && nv == 4);
            for k in 0..4 {
                global::store_u32_if(
                    a + 4 * k as u64,
                    b[k],
                    live && !vector && k < nv as usize && ocol + (k as u32) < n_out,
                );
            }
        } else {
            let h = if ty == OutType::Bf16 as u32 {
                y.map(convert::f32_to_bf16)
            } else {
                y.map(convert::f32_to_f16)
            };
            let w = [
                h[0] as u32 | (h[1] as u32) << 16,
                h[2] as u32 | (h[3] as u32) << 16,
            ];
            let a = out.ptr + 2 * idx;
            global::store_u32x2_if(a, w[0], w[1], live && vector && nv == 4);
            global::store_u32_if(a, w[0], live && vector && nv == 2);
            for k in 0..4 {
                global::store_u16_if(
                    a + 2 * k as u64,
                    h[k],
                    live && !vector && k < nv as usize && ocol + (k as u32) < n_out,
                );
            }
        }
    }
}

/// The quantized store of one lane's `nv` output values `y` (element `idx` of the codes, output
/// column `ocol` of row `row`): the block's largest magnitude over its lanes (`q_block / nv`
/// adjacent lanes, a whole block: N_out and the tile's columns are multiples of it), its scale
/// by the host's rule, the codes, and the scale from the block's first lane.
/// # Safety
/// As [`finish_staged`].
#[inline(always)]
unsafe fn quantize(
    e: &EpilogueParams,
    (l, row, ocol): (u32, u32, u32),
    idx: u64,
    y: [f32; 4],
    (nv, n_out): (u32, u32),
    (live, lane): (bool, u32),
) {
    let (elem, scale) = quant_types(e);
    let mut m = 0u32;
    for k in 0..4 {
        if k < nv as usize {
            m = m.max(magnitude_bits(y[k]));
        }
    }
    // (Blocks are 16, 32 or 128 columns; the bounds show the compiler that neither divisor below
    // is zero, so the kernel carries no panic path, whose call would make ptxas save every live
    // register around it.)
    let block = e.q_block.max(16);
    let lanes = (block / nv).max(1);
    let m = if lanes >= 32 {
        thread::warp_max_u32(m)
    } else {
        thread::group_max_u32(m, lanes)
    };
    let tensor_scale = if scale == ScaleType::UE4M3 {
        e.q_tensor_scale
    } else {
        1.0
    };
    let (sbits, d) = block_scale_of_bits(scale, elem, m, tensor_scale);
    // The codes packed from the low bits (the quantizer's encoding: one source).
    let w = encode4(elem, y, Quotient::new(scale, d));
    // SAFETY: the codes and scales hold the L·M·N_out output's (the host's); `live` says the
    // lane's columns are inside it, each store is aligned to its size (`ocol` a multiple of nv).
    unsafe {
        if elem == ElemType::E2M1 {
            let a = e.q_data + idx / 2;
            global::store_u16_if(a, w as u16, live && nv == 4);
            global::store_u8_if(a, w, live && nv == 2);
        } else {
            let a = e.q_data + idx;
            global::store_u32_if(a, w, live && nv == 4);
            global::store_u16_if(a, w as u16, live && nv == 2);
        }
        let first = live && (lane % lanes == 0);
        let kb = ocol / block;
        let si = scale_index(e, (l, row, kb));
        if scale == ScaleType::F32 {
            store_f32_scale(e, si, (l, row, kb), n_out, sbits, first);
        } else {
            global::store_u8_if(e.q_scales + si, sbits, first);
        }
    }
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

/// The consumers' half of the fused epilogue: consumer warpgroup `c` (thread `local` of 128)
/// writes its tile's batch entry (`out_l`; `None` where split-K leaves the tile to another CTA)
/// into its word of the hand-over and, with one, each warp its 16 rows of the fragment `acc`
/// into its staging rows, for the finishing warps ([`finish_staged`]).
/// # Safety
/// Between the hand-over's `consumer_acquire` and `consumer_commit` of this unit (the staging and
/// the word are this warpgroup's); `staging.base` is the fused kernel's staging
/// ([`fused_staging`](super::layout::fused_staging) bytes), or 0 and `e.scratch` holds this
/// grid's warps' staging; every thread of the warpgroup calls this with the same tile.
#[inline(always)]
pub unsafe fn stage_unit<const WAVES: usize, F: Fragment>(
    e: &EpilogueParams,
    staging: Staging,
    handoff: Handoff,
    (c, local): (u32, u32),
    acc: &[F; WAVES],
    out_l: Option<u32>,
) {
    // (The fused kernels' tiles have one wave, `acc[0]`: each family's list has fused kernels of
    // one-wave tiles only. The plain kernels instantiate this too, never calling it.)
    // SAFETY: the word is this warpgroup's (the caller's contract).
    if local == 0 {
        unsafe { smem::store_u32(handoff.header(c), out_l.unwrap_or(Handoff::SKIP)) };
    }
    if out_l.is_none() {
        return;
    }
    let (warp, lane) = (local / 32, local % 32);
    let s = Scratch::of(e, staging, c, warp);
    // The staging's addresses are made here, for each tile: computed once before the persistent
    // loop, the fragment's 64 or 128 store addresses were kept (and spilled) across the K loop.
    let s = Scratch {
        addr: thread::unhoisted_u64(s.addr),
        ..s
    };
    // SAFETY: the staging is this warp's (the caller's contract).
    unsafe { stage::<F>(s, lane, &acc[0]) };
}

/// The fused epilogue in the consumers' own registers ([`in_registers`](crate::params::in_registers), the
/// kernels without finishing warps): α, the bias and the activation on one thread's fragment
/// `acc` in place (batch entry `l`, the tile's first column `n0`, row length `n`, the lane's
/// pair `q = lane % 4` in each 8-column group), the steps and order of [`finish4`] (so the same
/// values), with the activation a constant of each copy (a branch per element, or per group of
/// four, kept the groups' chains apart, and the consumers — two warps a scheduler — waited on
/// each). The caller then stores the fragment as the plain kernels do, or [`quantize_fragment`].
/// # Safety
/// `e.bias`, where set, holds one row of N bf16 or f32 (or L of them).
#[inline(always)]
pub unsafe fn apply<F: Fragment>(e: &EpilogueParams, at: (u32, u32, u32), q: u32, acc: &mut F) {
    let v = acc.as_mut();
    // SAFETY: the caller's contract.
    unsafe { by_activation!(e.activation, apply_as::<F>(e, at, q, v)) }
}

/// [`apply`] with activation `ACT`: the lane's bias values loaded first (without a bias, −0,
/// which adds to every value without changing it, −0 and NaN included), then the steps on every
/// value with no branch between them.
/// # Safety
/// As [`apply`].
#[inline(always)]
unsafe fn apply_as<const ACT: u32, F: Fragment>(
    e: &EpilogueParams,
    (l, n0, n): (u32, u32, u32),
    q: u32,
    v: &mut [f32],
) {
    // The bias of the lane's column pair in each 8-column group (16 groups at most: the
    // in-register kernels' fragments are 128 columns wide).
    let mut bias = [[-0.0f32; 2]; 16];
    if e.bias != 0 {
        // SAFETY: the caller's contract.
        unsafe { load_bias::<F>(e, (l, n0, n), q, &mut bias) };
    }
    // Value `4g + k`: row `lane / 4 + 8·(k / 2)`, column `8g + 2·(lane % 4) + k % 2`.
    for g in 0..(F::N / 8).min(16) as usize {
        for k in 0..4 {
            let t = math::add_rn(math::mul_rn(e.alpha, v[4 * g + k]), bias[g][k % 2]);
            v[4 * g + k] = activate(ACT, t);
        }
    }
}

/// The bias (bf16 or f32, one row of N or L of them) of the lane's columns `n0 + 8g + 2q` and
/// `+ 1` into `bias[g]`: one load per pair where N is even (the pair is then aligned and inside
/// the row; a pair past N reads the row's last pair, whose values are not stored), else one per
/// element, clamped to the row's last.
/// # Safety
/// As [`apply`], with a bias.
#[inline(always)]
unsafe fn load_bias<F: Fragment>(
    e: &EpilogueParams,
    (l, n0, n): (u32, u32, u32),
    q: u32,
    bias: &mut [[f32; 2]; 16],
) {
    let row_at = if e.bias_batch != 0 {
        l as u64 * n as u64
    } else {
        0
    };
    let (wide, pairs, last) = (e.bias_type == OutType::F32 as u32, n % 2 == 0, n.max(1) - 1);
    let bf16 = |h: u32| f32::from_bits(h << 16);
    let cols = |g: usize| n0 + 8 * g as u32 + 2 * q;
    let groups = (F::N / 8).min(16) as usize;
    // (Index loops: unrolled, so the array stays in registers.)
    // SAFETY (every load): the caller's contract; each index is inside the row; a pair load only
    // where its first index is even (N even), so aligned to the pair. (One loop per case: the
    // loads of a loop issue together.)
    #[allow(clippy::needless_range_loop)]
    unsafe {
        match (wide, pairs) {
            (true, true) => {
                for g in 0..groups {
                    let at = row_at + cols(g).min(last - 1) as u64;
                    bias[g] = global::load_u32x2_nc(e.bias + 4 * at).map(f32::from_bits);
                }
            }
            (false, true) => {
                for g in 0..groups {
                    let at = row_at + cols(g).min(last - 1) as u64;
                    let w = global::load_u32_nc(e.bias + 2 * at);
                    bias[g] = [bf16(w & 0xFFFF), bf16(w >> 16)];
                }
            }
            (true, false) => {
                for g in 0..groups {
                    let at = |k: u32| row_at + (cols(g) + k).min(last) as u64;
                    bias[g] = [0, 1].map(|k| global::load_f32_nc(e.bias + 4 * at(k)));
                }
            }
            (false, false) => {
                for g in 0..groups {
                    let at = |k: u32| row_at + (cols(g) + k).min(last) as u64;
                    bias[g] = [0, 1].map(|k| bf16(global::load_u16_nc(e.bias + 2 * at(k)) as u32));
                }
            }
        }
    }
}

/// Bytes of one warp's rows of FP8 codes in [`quantize_fragment`]'s staging: 16 rows of 128.
pub const CODE_WARP_BYTES: u32 = FUSED_WARP_ROWS * 128;

/// The FP8 1×128 output of one warp's 16 rows of a 128-column fragment `acc` (after [`apply`];
/// rows from `row0`, columns from `n0`, batch entry `l`), in registers: each row's block maximum
/// over its four lanes (two shuffles), its scale and quotient by the host's rule (the row's first
/// lane stores the scale, and the A-role copy), the codes written into the warp's 2 KiB at
/// `stage` (16 rows of 128 bytes, 16-byte chunk `j` of row `r` at `j ^ (r % 8)`, its word `q`
/// lane `q`'s four codes of the chunk: the fragment's word stores and the row reads use every
/// bank) and copied out a row's eight chunks to eight lanes (coalesced; four byte permutes put
/// each chunk in column order). Rows at or past `out.rows()`, and tiles past N, are not written.
/// # Safety
/// `stage` is this warp's [`CODE_WARP_BYTES`] of shared memory (16-byte aligned), used by no
/// other warp; the output is FP8 with fp32 scales per 128 columns (N a multiple of 128), its
/// buffers live and of `out`'s shape; `F::N` is 128; every lane of the warp calls this with the
/// same tile.
#[inline(always)]
pub unsafe fn quantize_fragment<F: Fragment>(
    e: &EpilogueParams,
    out: &Output,
    stage: u32,
    (l, row0, n0): (u32, u32, u32),
    lane: u32,
    acc: &F,
) {
    let (v, q, n, rows) = (acc.as_ref(), lane % 4, out.n, out.rows());
    let elem = if quant_types(e).0 == ElemType::E5M2 {
        ElemType::E5M2
    } else {
        ElemType::E4M3
    };
    // Each row's largest magnitude over the lane's 32 values: one `max.NaN` of two magnitudes
    // an element (a NaN wins; ±Inf and NaN map to the NaN scale once, after the maximum over
    // the row's four lanes: the map is monotone, so it commutes with it), as a tree of 16
    // independent pairs (a chain of 32 kept the two warps of each scheduler waiting on it).
    let mut m = [0f32; 2];
    for h in 0..2 {
        let mut t = [0f32; 16];
        for g in 0..(F::N / 8).min(16) as usize {
            t[g] = math::max_abs_nan(v[4 * g + 2 * h], v[4 * g + 2 * h + 1]);
        }
        // (Index loops: a loop over an array of widths stayed rolled, `t` in local memory.)
        for level in 1..5 {
            let w = 16 >> level;
            for j in 0..w {
                t[j] = math::max_nan(t[j], t[j + w]);
            }
        }
        m[h] = t[0];
    }
    let kb = n0 / 128;
    let quot = [0, 1].map(|h: usize| {
        let mh = thread::group_max_u32(magnitude_bits(m[h]), 4);
        let (sbits, quot) = Quotient::fp8_block(elem, mh);
        let row = row0 + lane / 4 + 8 * h as u32;
        let first = q == 0 && row < rows && n0 < n;
        // SAFETY: the scales hold the L·M·(N / 128) output's (the caller's); `first` says the
        // row and the block are inside it.
        let si = scale_index(e, (l, row, kb));
        unsafe { store_f32_scale(e, si, (l, row, kb), n, sbits, first) };
        quot
    });
    // The lane's rows are `lane / 4` and `+ 8`: the same swizzle term, `lane / 4`.
    let (mine, xor) = (stage + (lane / 4) * 128, lane / 4);
    // The previous tile's copy has read the staging.
    thread::sync_warp();
    // Both rows' scales need no prescaling but where a row's largest magnitude is below 2^-76
    // or not finite (a copy of the loop without the product each element).
    // SAFETY: `mine` is this lane's rows of this warp's staging (the caller's).
    unsafe {
        if quot[0].is_unit() && quot[1].is_unit() {
            // (The element type a constant of each copy: a run-time one converted each pair to
            // both types, one under a predicate.)
            let quot = quot.map(Quotient::unit);
            if elem == ElemType::E5M2 {
                stage_codes::<F>(ElemType::E5M2, v, quot, (mine, xor), q);
            } else {
                stage_codes::<F>(ElemType::E4M3, v, quot, (mine, xor), q);
            }
        } else {
            stage_codes::<F>(elem, v, quot, (mine, xor), q);
        }
    }
    thread::sync_warp();
    // SAFETY: the caller's contract; the staging written above.
    unsafe { copy_out_codes::<false>(e, out, stage, (l, row0, n0), lane) };
}

/// The copy-out of a warp's staged codes ([`quantize_fragment`]'s layout): a row's eight 16-byte
/// chunks to eight lanes (coalesced; four byte permutes put each chunk in column order), rows at
/// or past `out.rows()` not written, nor tiles past N or, where `CHUNKS` (N a multiple of 32, not
/// of the tile's 128 columns), chunks past it.
/// # Safety
/// As [`quantize_fragment`] (N a multiple of 128, or of 32 where `CHUNKS`), the warp's staging
/// written and synchronized.
#[inline(always)]
unsafe fn copy_out_codes<const CHUNKS: bool>(
    e: &EpilogueParams,
    out: &Output,
    stage: u32,
    (l, row0, n0): (u32, u32, u32),
    lane: u32,
) {
    let (n, rows) = (out.n, out.rows());
    for t in 0..FUSED_WARP_ROWS / 4 {
        let (r, j) = (lane / 8 + 4 * t, lane % 8);
        // SAFETY: inside this warp's staging, written before the caller's `sync_warp`.
        let w = unsafe { smem::load_u32x4(stage + r * 128 + 16 * (j ^ (r % 8))) };
        // Word q holds lane q's pair of each of the chunk's two 8-column groups (low half, high
        // half): the groups' pairs in lane order are the chunk's bytes in column order.
        let w = [
            bits::prmt(w[0], w[1], 0x5410),
            bits::prmt(w[2], w[3], 0x5410),
            bits::prmt(w[0], w[1], 0x7632),
            bits::prmt(w[2], w[3], 0x7632),
        ];
        let (row, col) = (row0 + r, n0 + 16 * j);
        let at = (l as u64 * out.m as u64 + row as u64) * n as u64 + col as u64;
        let inside = if CHUNKS { col < n } else { n0 < n };
        // SAFETY: the codes hold the L·M·N output (the caller's); 16-byte aligned (N and the
        // column multiples of 16); the predicate says the row and the chunk are inside it (a
        // tile is inside N or past it whole, or with `CHUNKS` a chunk is).
        unsafe { global::store_u32x4_if(e.q_data + at, w, row < rows && inside) };
    }
}

/// [`quantize_fragment`] for MXFP8 output (`elem` codes, e8m0 scales per 32 columns): four
/// blocks a row, each its group of four 8-column groups; a block's maximum over its four lanes
/// (the lane's eight values of it, then two shuffles), its scale by the host's rule
/// (`block_scale_of_bits`, the same as the quantizer's) stored by the row's first lane, the codes
/// each one product by the scale's exact reciprocal and the hardware conversion, staged and
/// copied out as FP8 1×128's. Columns at or past N (a multiple of 32) are not written.
/// # Safety
/// As [`quantize_fragment`], with e8m0 scales per 32 columns (N a multiple of 32).
#[inline(always)]
pub unsafe fn quantize_fragment_mx<F: Fragment>(
    e: &EpilogueParams,
    out: &Output,
    stage: u32,
    (l, row0, n0): (u32, u32, u32),
    lane: u32,
    acc: &F,
) {
    let v = acc.as_ref();
    // (The element type a constant of each copy.)
    // SAFETY: the caller's contract.
    unsafe {
        if quant_types(e).0 == ElemType::E5M2 {
            mx_fragment::<F, { ElemType::E5M2 as u32 }>(e, out, stage, (l, row0, n0), lane, v)
        } else {
            mx_fragment::<F, { ElemType::E4M3 as u32 }>(e, out, stage, (l, row0, n0), lane, v)
        }
    }
}

/// [`quantize_fragment_mx`] with the element type `E` ([`ElemType`] as u32).
/// # Safety
/// As [`quantize_fragment_mx`].
#[inline(always)]
unsafe fn mx_fragment<F: Fragment, const E: u32>(
    e: &EpilogueParams,
    out: &Output,
    stage: u32,
    (l, row0, n0): (u32, u32, u32),
    lane: u32,
    v: &[f32],
) {
    let elem = if E == ElemType::E5M2 as u32 {
        ElemType::E5M2
    } else {
        ElemType::E4M3
    };
    // (The lane made here, each tile: values derived from it and hoisted out of the persistent
    // loop stay live across the K loop, and spill.)
    let lane = smem::opaque(lane);
    let (q, n, rows) = (lane % 4, out.n, out.rows());
    // Block b of row h: groups 4b..4b + 4, the lane's pair in each; its largest magnitude as a
    // tree (`max.NaN`: a NaN wins; ±Inf and NaN map to the NaN scale after the four lanes').
    let quot = [0, 1].map(|h: usize| {
        let row = row0 + lane / 4 + 8 * h as u32;
        [0, 1, 2, 3].map(|b: usize| {
            let t = [0, 1, 2, 3].map(|j: usize| {
                let g = 4 * b + j;
                math::max_abs_nan(v[4 * g + 2 * h], v[4 * g + 2 * h + 1])
            });
            let m = math::max_nan(math::max_nan(t[0], t[1]), math::max_nan(t[2], t[3]));
            let mb = thread::group_max_u32(magnitude_bits(m), 4);
            let (code, _) = block_scale_of_bits(ScaleType::E8M0, elem, mb, 1.0);
            let col = n0 + 32 * b as u32;
            let si = scale_index(e, (l, row, col / 32));
            // SAFETY: the scales hold the L·M·(N / 32) output's (the caller's); the predicate
            // says the row and the block are inside it.
            unsafe { global::store_u8_if(e.q_scales + si, code, q == 0 && row < rows && col < n) };
            Quotient::e8m0(code)
        })
    });
    let (mine, xor) = (stage + (lane / 4) * 128, lane / 4);
    // The previous tile's copy has read the staging.
    thread::sync_warp();
    for g in (0..(F::N / 8) as usize).step_by(2) {
        for h in 0..2 {
            // Groups g and g + 1 of the row: chunk g / 2, bytes 2q and 8 + 2q; block g / 4.
            let (i, j) = (4 * g + 2 * h, 4 * (g + 1) + 2 * h);
            let w = encode4(elem, [v[i], v[i + 1], v[j], v[j + 1]], quot[h][g / 4]);
            let a = mine + 8 * h as u32 * 128 + 16 * ((g as u32 / 2) ^ xor) + 4 * q;
            // SAFETY: inside this warp's staging (row < 16, chunk < 8).
            unsafe { smem::store_u32(a, w) };
        }
    }
    thread::sync_warp();
    // SAFETY: the caller's contract; the staging written above.
    unsafe { copy_out_codes::<true>(e, out, stage, (l, row0, n0), lane) };
}

/// [`quantize_fragment`]'s codes of a lane's 64 values `v` (rows `h` = 0, 1 with quotients
/// `quot[h]`) into its rows of the warp's staging (`mine`, swizzled by `xor`; `q` the lane's pair).
/// # Safety
/// `mine` is this lane's first row of its warp's staging ([`CODE_WARP_BYTES`]).
#[inline(always)]
unsafe fn stage_codes<F: Fragment>(
    elem: ElemType,
    v: &[f32],
    quot: [Quotient; 2],
    (mine, xor): (u32, u32),
    q: u32,
) {
    for g in (0..(F::N / 8) as usize).step_by(2) {
        for h in 0..2 {
            // Groups g and g + 1 of the row: chunk g / 2, bytes 2q and 8 + 2q.
            let (i, j) = (4 * g + 2 * h, 4 * (g + 1) + 2 * h);
            // The lane's four codes of the chunk as one word, word q of the staged chunk (the
            // copy-out puts the bytes in column order).
            let w = encode4(elem, [v[i], v[i + 1], v[j], v[j + 1]], quot[h]);
            let a = mine + 8 * h as u32 * 128 + 16 * ((g as u32 / 2) ^ xor) + 4 * q;
            // SAFETY: inside this warp's staging (row < 16, chunk < 8).
            unsafe { smem::store_u32(a, w) };
        }
    }
}

/// [`finish_staged`] of unit `own` of a fused kernel whose tiles go where `dst` says (its
/// `epi` set with finishing warps; nothing otherwise): the kernels' `GemmKernel::finish_staged`,
/// with the tile store their epilogue staged for.
/// # Safety
/// As [`finish_staged`].
#[inline(always)]
pub unsafe fn finish_unit_staged<F: Fragment>(
    dst: &TileStore,
    own: &WorkUnit,
    (warp, finishers): (u32, u32),
    lane: u32,
) {
    let Some((e, Finish::Staged(handoff))) = dst.epi else {
        return;
    };
    let at = (own.first_row(own.m, dst.block_m), own.n * F::N);
    // SAFETY: the caller's contract.
    unsafe {
        finish_staged::<F>(
            e,
            &dst.out,
            dst.staging,
            handoff,
            at,
            (warp, finishers),
            lane,
        )
    };
}

/// The finishing warps' half of the fused epilogue: warp `warp` of `finishers` (thread `lane`)
/// finishes rows `warp`, `warp + finishers`, … of each consumer warpgroup's staged fragment of the
/// unit whose first row and column are `(m0, n0)`, several rows at a time (independent chains: a
/// warp alone on its scheduler hides their latencies only with each other), the bias loaded once
/// per unit. The common epilogues (no C, residual or column pairs; bf16 or FP8 1×128 output) run
/// in copies of their own per activation ([`rows_fast`]), the others in one general loop of
/// [`finish4`]. Rows at or past `out.rows()` and columns past N are not written.
/// # Safety
/// After the hand-over's `finisher_wait` of this unit; `e`, `staging` as [`stage_unit`] says, for
/// tiles of `consumers` warpgroups × `F::N` columns; `e` describes live buffers of the output's
/// shape (the host's checks); every lane of the warp calls this with the same unit.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn finish_staged<F: Fragment>(
    e: &EpilogueParams,
    out: &Output,
    staging: Staging,
    handoff: Handoff,
    (m0, n0): (u32, u32),
    (warp, finishers): (u32, u32),
    lane: u32,
) {
    let rows = out.rows();
    // (At least 1 as the compiler can see.)
    let step = finishers.max(1);
    for c in 0..staging.consumers {
        // SAFETY: the consumers wrote the word before their commit (the caller's contract).
        let out_l = unsafe { smem::load_u32(handoff.header(c)) };
        if out_l == Handoff::SKIP {
            continue;
        }
        // Consumer c's warps' rows are contiguous: its row i is staged row i % 16 of warp i / 16.
        let s = Scratch::of(e, staging, c, 0);
        let bias_at = if e.bias_batch != 0 {
            out_l as u64 * out.n as u64
        } else {
            0
        };
        let first = m0 + c * FRAGMENT_ROWS;
        for p in 0..F::N.div_ceil(PASS_COLS) {
            let q = p * (PASS_COLS / 4) + lane;
            let live = 4 * q < F::N;
            let col = n0 + 4 * q;
            // (Clamped for the lanes past the tile, whose values are not stored.)
            let chunk = q.min(F::N / 4 - 1);
            // SAFETY: the bias holds one row of N (or L of them): the host's check.
            let bias =
                (e.bias != 0).then(|| unsafe { load4(e.bias, e.bias_type, bias_at, col, out.n) });
            let rows_at = Rows {
                s,
                l: out_l,
                first,
                col,
                chunk,
                live,
                lane,
                start: warp,
                step,
            };
            // The common epilogues (no C, no residual, no column pairs, whole vectors) in code
            // of their own per activation and output: no branch in their rows, so the rows
            // of an iteration interleave.
            let fast = e.c == 0 && e.residual == 0 && !e.paired() && out.n.is_multiple_of(4);
            let fp8_rows = matches!(
                quant_types(e),
                (ElemType::E4M3 | ElemType::E5M2, ScaleType::F32)
            ) && e.q_block == 128;
            let kind = if e.quantized() {
                fp8_rows.then_some(FAST_FP8_ROWS)
            } else if out.out_type == OutType::Bf16 as u32 {
                Some(FAST_BF16)
            } else {
                None
            };
            if let (true, Some(kind)) = (fast, kind) {
                // SAFETY: the caller's contract.
                unsafe {
                    if kind == FAST_BF16 {
                        rows_by_activation::<FAST_BF16>(e, out, rows_at, bias)
                    } else {
                        rows_by_activation::<FAST_FP8_ROWS>(e, out, rows_at, bias)
                    }
                }
                continue;
            }
            // One copy of the rows' code (a loop of run-time bounds).
            let mut i = thread::opaque_u32(warp);
            while i < FRAGMENT_ROWS && first + i < rows {
                let j = i + step;
                // (Warp-uniform: the shuffles of a quantized store need every lane.)
                let second = j < FRAGMENT_ROWS && first + j < rows;
                // SAFETY: chunks of consumer c's staged rows (a row past the fragment's is read
                // from its last row, not stored).
                let (v, w) =
                    unsafe { (s.load4(i, chunk), s.load4(j.min(FRAGMENT_ROWS - 1), chunk)) };
                // (A second row past the rows is finished as the first's, and not stored: its C and
                // residual reads stay inside their buffers.)
                let row_j = if second { first + j } else { first + i };
                // SAFETY: the caller's contract.
                unsafe {
                    finish4(e, out, (out_l, first + i, col), v, bias, (live, lane));
                    finish4(e, out, (out_l, row_j, col), w, bias, (live && second, lane));
                }
                i += 2 * step;
            }
        }
    }
}

/// Rows [`rows_fast`] finishes per iteration.
const FAST_ROWS: usize = 4;

/// [`rows_fast`]'s output kinds: bf16, or FP8 with fp32 scales per 1×128 (DeepSeek-style
/// activations for the next GEMM).
const FAST_BF16: u32 = 0;
const FAST_FP8_ROWS: u32 = 1;

/// One finishing warp's rows of one consumer's staged fragment, for one pass of columns.
#[derive(Clone, Copy)]
struct Rows {
    s: Scratch,
    /// Batch entry, the fragment's first row, the lane's first column and staged chunk.
    l: u32,
    first: u32,
    col: u32,
    chunk: u32,
    /// The lane's columns are inside the tile.
    live: bool,
    lane: u32,
    /// The warp's first row in the fragment, and the step between its rows.
    start: u32,
    step: u32,
}

/// [`rows_fast`] for the epilogue's activation, a constant in each copy.
/// # Safety
/// As [`rows_fast`].
#[inline(always)]
unsafe fn rows_by_activation<const OUT: u32>(
    e: &EpilogueParams,
    out: &Output,
    r: Rows,
    bias: Option<[f32; 4]>,
) {
    // SAFETY: the caller's contract.
    unsafe { by_activation!(e.activation, rows_fast::<OUT>(e, out, r, bias)) }
}

/// The rows of `r` without C, residual or column pairs, N a multiple of 4 (one vector per lane
/// and row), [`FAST_ROWS`] rows per iteration: α, the bias, activation `ACT`, and bf16 output or the
/// FP8 1×128 store ([`quantize_rows`]). The same steps, in the same order, as [`finish4`].
/// # Safety
/// As [`finish_staged`], for such an epilogue.
#[inline(always)]
unsafe fn rows_fast<const ACT: u32, const OUT: u32>(
    e: &EpilogueParams,
    out: &Output,
    r: Rows,
    bias: Option<[f32; 4]>,
) {
    let (rows, n) = (out.rows(), out.n);
    // The lane's four columns are inside the tile and inside N (`n % 4 == 0`: all or none).
    let r = Rows {
        live: r.live && r.col < n,
        ..r
    };
    let last = FRAGMENT_ROWS - 1;
    // The lane's element of the fragment's first row; a row is `n` further.
    let base = (r.l as u64 * out.m as u64 + r.first as u64) * n as u64 + r.col as u64;
    let apply = |v: [f32; 4]| {
        let mut t = v.map(|x| math::mul_rn(e.alpha, x));
        if let Some(b) = bias {
            for k in 0..4 {
                t[k] = math::add_rn(t[k], b[k]);
            }
        }
        t.map(|x| activate(ACT, x))
    };
    // [`FAST_ROWS`] rows per iteration (`i`, `i + step`, …), the next iteration's read from the
    // staging before this one's are finished: independent chains for a warp that is alone on
    // its scheduler, and the staging's latency behind the arithmetic.
    let inside = |i: u32| i < FRAGMENT_ROWS && r.first + i < rows;
    // SAFETY: chunks of the fragment's staged rows (indices clamped into them).
    let load = |i: u32| unsafe { r.s.load4(i.min(last), r.chunk) };
    let mut i = thread::opaque_u32(r.start);
    if !inside(i) {
        return;
    }
    let mut now = [[0f32; 4]; FAST_ROWS];
    for k in 0..FAST_ROWS {
        now[k] = load(i + k as u32 * r.step);
    }
    loop {
        let next = i + FAST_ROWS as u32 * r.step;
        let mut upcoming = [[0f32; 4]; FAST_ROWS];
        for k in 0..FAST_ROWS {
            upcoming[k] = load(next + k as u32 * r.step);
        }
        // This iteration's rows (warp-uniform: the shuffles of a quantized store need every
        // lane; a row past the fragment's is finished as row `i`, and not stored).
        let mut rows_at = [(0u32, false); FAST_ROWS];
        let mut ys = [[0f32; 4]; FAST_ROWS];
        for k in 0..FAST_ROWS {
            let row = i + k as u32 * r.step;
            let ok = k == 0 || inside(row);
            rows_at[k] = (if ok { row } else { i }, ok);
            ys[k] = apply(now[k]);
        }
        // SAFETY: the lane's four elements of each row of the output (inside it where `live`
        // and the row's `ok` say so; `n % 4 == 0`, so aligned).
        unsafe {
            if OUT == FAST_BF16 {
                for k in 0..FAST_ROWS {
                    let ((row, ok), y) = (rows_at[k], ys[k]);
                    let (a, b) = (
                        convert::f32x2_to_bf16x2(y[0], y[1]),
                        convert::f32x2_to_bf16x2(y[2], y[3]),
                    );
                    let at = base + row as u64 * n as u64;
                    global::store_u32x2_if(out.ptr + 2 * at, a, b, r.live && ok);
                }
            } else {
                quantize_rows(e, &r, (base, n), rows_at, ys);
            }
        }
        if !inside(next) {
            break;
        }
        (i, now) = (next, upcoming);
    }
}

/// FP8 1×128 output of one iteration's rows (of `r`'s pass, the row's 128 columns one block:
/// the warp's 32 lanes × 4; `rows[k]`: the row in the fragment and whether it is stored; `ys[k]`
/// the lane's four values): each row's block maximum by one `redux`, the rows' scales and
/// reciprocals derived at once — lane `k` for row `k` — and handed to every lane by shuffles,
/// then each row's codes, and from lane 0 its scale (and the A-role copy). The same codes and
/// scales as [`quantize`], with the scale work once per warp and row instead of in every lane.
/// # Safety
/// As [`rows_fast`]; the output is FP8 with fp32 scales per 128 columns; `base` is the lane's
/// element of the fragment's first row, `n` the row length (a multiple of 128).
#[inline(always)]
unsafe fn quantize_rows(
    e: &EpilogueParams,
    r: &Rows,
    (base, n): (u64, u32),
    rows: [(u32, bool); FAST_ROWS],
    ys: [[f32; 4]; FAST_ROWS],
) {
    const { assert!(FAST_ROWS <= 32) };
    let elem = if quant_types(e).0 == ElemType::E5M2 {
        ElemType::E5M2
    } else {
        ElemType::E4M3
    };
    let mut maxima = [0u32; FAST_ROWS];
    for k in 0..FAST_ROWS {
        let mut m = 0u32;
        for x in 0..4 {
            m = m.max(magnitude_bits(ys[k][x]));
        }
        maxima[k] = thread::warp_max_u32(m);
    }
    // Lane k derives row k's scale (the other lanes row 0's, unused).
    let mut mine = maxima[0];
    for k in 1..FAST_ROWS {
        if r.lane == k as u32 {
            mine = maxima[k];
        }
    }
    let (sbits, d) = block_scale_of_bits(ScaleType::F32, elem, mine, 1.0);
    let q = Quotient::new(ScaleType::F32, d);
    let kb = r.col / 128;
    for k in 0..FAST_ROWS {
        let (qk, sk) = (q.from_lane(k as u32), thread::shfl_idx_u32(sbits, k as u32));
        let w = encode4(elem, ys[k], qk);
        let (row, ok) = rows[k];
        let live = r.live && ok;
        let row_l = r.first + row;
        let first = live && r.lane == 0;
        // SAFETY: the codes and scales hold the L·M·N output's (the host's); `live` says the
        // lane's columns and the row are inside it; the stores are aligned to their sizes.
        unsafe {
            global::store_u32_if(e.q_data + base + row as u64 * n as u64, w, live);
            let si = scale_index(e, (r.l, row_l, kb));
            store_f32_scale(e, si, (r.l, row_l, kb), n, sk, first);
        }
    }
}
