//! The consumers' half of the staged epilogue, and the steps the finishing warps apply to a row's staged values.

use super::activation::{activate, activate4};
use super::{quant_types, scale_index, store_f32_scale};
use crate::format::quantize::{block_scale_of_bits, magnitude_bits};
use crate::format::{ElemType, ScaleType, f16};
use crate::gemm::epilogue::target::{Output, Staging};
use crate::gemm::layout::{
    fused_chunk_offset, fused_lane_offset, fused_pair_offset, fused_warp_bytes,
};
use crate::gemm::pipeline::Handoff;
use crate::params::{Activation, EpilogueParams, OutType};
use crate::plant;
use crate::ptx::wgmma::Fragment;
use crate::ptx::{convert, global, math, smem, thread};
use crate::quantize::device::{Quotient, encode4};

/// Where one warp stages its rows: [`FUSED_WARP_ROWS`](crate::gemm::layout::FUSED_WARP_ROWS) rows of
/// [`fused_row_bytes`](crate::gemm::layout::fused_row_bytes), in shared memory or in global memory.
#[derive(Clone, Copy)]
pub(super) struct Scratch {
    addr: u64,
    shared: bool,
    block_n: u32,
}

impl Scratch {
    /// Warp `warp` of consumer `c`'s rows: in the fused kernel's staging in shared memory where
    /// it has one (`staging.base` set), else in the global scratch (this CTA's, consumer's and
    /// warp's part).
    #[inline(always)]
    pub(super) fn of(e: &EpilogueParams, staging: Staging, c: u32, warp: u32) -> Scratch {
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
    pub(super) fn at(self, r: u32, q: u32) -> u32 {
        fused_chunk_offset(r, q, self.block_n)
    }

    /// Reads the four f32 of chunk `q` of row `r`.
    /// # Safety
    /// The chunk is inside this warp's rows, written before a [`thread::sync_warp`].
    #[inline(always)]
    pub(super) unsafe fn load4(self, r: u32, q: u32) -> [f32; 4] {
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
pub(super) unsafe fn stage<F: Fragment>(s: Scratch, lane: u32, acc: &F) {
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
pub(super) unsafe fn load4(ptr: u64, ty: u32, row_at: u64, col: u32, cols: u32) -> [f32; 4] {
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

/// One row's 4 staged values `v` at product columns `col..col + 4` (lane-uniform row `row` of
/// batch entry `l`): the steps up to the residual, then the store (`live`: the lane's columns
/// are inside the tile; stores are masked at N as well).
/// # Safety
/// As [`finish_staged`].
#[inline(always)]
pub(super) unsafe fn finish4(
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
    let mut t = v.map(|x| math::mul_rn(e.alpha * plant::FUSED, x));
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
pub(super) unsafe fn quantize(
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
