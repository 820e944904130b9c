//! The fused epilogue ([`EpilogueParams`]): α, β·C, a per-column bias, an activation (SwiGLU
//! over paired columns), a residual, and output quantized into the codes and scales the next
//! GEMM reads as its A. One code path, run from [`super::epilogue::finish_unit`] by each
//! family's fused kernels (kernels of their own, [`crate::params::FusedParams`]: the plain
//! kernels carry none of this code), the steps chosen by data in the parameters, not a kernel per
//! combination.
//!
//! The steps run on rows, not on fragments: each warp first writes its whole fragment (16 rows)
//! as f32 into its own staging rows, and then reads them back a row at a time, lane `q` holding
//! the row's columns `4q..4q + 4` of each 128. Once written, the fragment's registers are free
//! for the row code, which is one loop with constant bounds and no fragment index (one copy of
//! it, in registers); the lanes' stores of a row are contiguous (coalesced), and a scale block
//! of 16, 32 or 128 output columns is 4, 8 or 32 adjacent lanes (16 or 32 with SwiGLU), whose
//! largest magnitude is a shuffle reduction. The staging is the fused kernels' shared memory in
//! place of the output staging ([`fused_staging`](super::layout::fused_staging)), else global
//! memory the host gives ([`EpilogueParams::scratch`], L2-resident). Rows are padded by 16 bytes
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

use super::epilogue::{Output, Staging};
use super::layout::{
    FRAGMENT_ROWS, FUSED_WARP_ROWS, fused_chunk_offset, fused_lane_offset, fused_pair_offset,
    fused_warp_bytes,
};
use crate::format::quantize::{block_scale_of_bits, magnitude_bits};
use crate::format::{ElemType, ScaleType, f16};
use crate::params::{Activation, EpilogueParams, OutType};
use crate::ptx::wgmma::Fragment;
use crate::ptx::{convert, global, math, smem, thread};
use crate::quantize::device::encode4;

const LOG2_E: f32 = core::f32::consts::LOG2_E;

/// Columns one pass of a warp over a staged row covers: 4 per lane.
const PASS_COLS: u32 = 128;

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

/// Where one warp stages its rows: [`FUSED_WARP_ROWS`] rows of
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
    // This thread's first value's address (made from `s.addr`, which [`store`] makes anew for
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
/// As [`store`].
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
/// As [`store`].
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
    let m = thread::group_max_u32(m, lanes);
    let tensor_scale = if scale == ScaleType::UE4M3 {
        e.q_tensor_scale
    } else {
        1.0
    };
    let (sbits, d) = block_scale_of_bits(scale, elem, m, tensor_scale);
    // The codes packed from the low bits (the quantizer's encoding: one source).
    let w = encode4(elem, y, d);
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
        let si = l as u64 * e.q_stride_l + row as u64 * e.q_stride_r + kb as u64 * e.q_stride_k;
        if scale == ScaleType::F32 {
            global::store_u32_if(e.q_scales + 4 * si, sbits, first);
            if e.q_sfa != 0 {
                let a =
                    (l as u64 * (n_out / 128) as u64 + kb as u64) * e.q_m_pad as u64 + row as u64;
                global::store_u32_if(e.q_sfa + 4 * a, sbits, first);
            }
        } else {
            global::store_u8_if(e.q_scales + si, sbits, first);
        }
    }
}

/// The staged rows `row0..row0 + 16` of a tile whose first column is `n0`: pass by pass
/// ([`PASS_COLS`] columns), each row below the rows written through [`finish4`]. (The bias is
/// loaded for each row, from L1 after the first: held in registers across the rows, its four
/// values made ptxas spill in the FP8 kernel's K loop.)
/// # Safety
/// As [`store`]; the rows were staged in `s` and the warp synchronized since.
#[inline(always)]
unsafe fn finish_rows(
    e: &EpilogueParams,
    out: &Output,
    s: Scratch,
    (l, row0, n0): (u32, u32, u32),
    block_n: u32,
    lane: u32,
) {
    let rows = out.rows();
    for p in 0..block_n.div_ceil(PASS_COLS) {
        let q = p * (PASS_COLS / 4) + lane;
        let live = 4 * q < block_n;
        let col = n0 + 4 * q;
        // (Clamped for the lanes past the tile, whose values are not stored.)
        let chunk = q.min(block_n / 4 - 1);
        let bias_at = if e.bias_batch != 0 {
            l as u64 * out.n as u64
        } else {
            0
        };
        // One copy of the row's code (an unrolled loop would copy it sixteen times over).
        for r in 0..thread::opaque_u32(FUSED_WARP_ROWS) {
            let row = row0 + r;
            // (Warp-uniform: the shuffles of a quantized store need every lane.)
            if row >= rows {
                break;
            }
            // SAFETY: a chunk of this warp's staged rows.
            let v = unsafe { s.load4(r, chunk) };
            // SAFETY: the bias holds one row of N (or L of them): the host's check.
            let bias =
                (e.bias != 0).then(|| unsafe { load4(e.bias, e.bias_type, bias_at, col, out.n) });
            // SAFETY: the caller's contract.
            unsafe { finish4(e, out, (l, row, col), v, bias, (live, lane)) };
        }
    }
}

/// The fused epilogue of consumer warpgroup `c` (thread `local` of 128) for its fragments `acc`
/// (one per wave, `wave_m` rows apart) of the tile whose first row, first column and batch entry
/// are `at`: each warp stages its rows of a fragment and finishes them row by row. Rows at or
/// past `out.rows()` and columns past N are not written.
/// # Safety
/// `e` describes live buffers of the output's shape (the host's checks); `staging.base` is the
/// fused kernel's staging ([`fused_staging`](super::layout::fused_staging) bytes), or 0 and
/// `e.scratch` holds this grid's warps' staging; the staging is this warpgroup's and no other
/// role uses it; every thread of the warpgroup calls this with the same tile.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn store<const WAVES: usize, F: Fragment>(
    e: &EpilogueParams,
    out: &Output,
    staging: Staging,
    c: u32,
    local: u32,
    acc: &[F; WAVES],
    (m0, n0, l): (u32, u32, u32),
    wave_m: u32,
) {
    let (warp, lane) = (local / 32, local % 32);
    let s = Scratch::of(e, staging, c, warp);
    // The staging's addresses are made here, for each tile: computed once before the persistent
    // loop, the fragment's 64 or 128 store addresses were kept (and spilled) across the K loop.
    let s = Scratch {
        addr: thread::unhoisted_u64(s.addr),
        ..s
    };
    let row0 = m0 + c * FRAGMENT_ROWS + 16 * warp;
    // (The fused kernels' tiles have one wave: with two, the second fragment would be live while
    // the first is finished.)
    for (w, a) in acc.iter().enumerate() {
        // SAFETY: the staging is this warp's (the caller's contract); the rows are written after
        // every lane has read the previous wave's and read after every lane has written them.
        unsafe {
            thread::sync_warp();
            stage::<F>(s, lane, a);
            thread::sync_warp();
            finish_rows(e, out, s, (l, row0 + w as u32 * wave_m, n0), F::N, lane);
        }
    }
}
