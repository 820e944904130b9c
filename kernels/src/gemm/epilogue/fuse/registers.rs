//! The fused epilogue in the consumers' registers, and the fragment quantizers (FP8 1×128, MXFP8).

use super::activation::activate;
use super::{quant_types, scale_index, store_f32_scale};
use crate::format::quantize::{block_scale_of_bits, magnitude_bits};
use crate::format::{ElemType, ScaleType};
use crate::gemm::epilogue::target::Output;
use crate::gemm::layout::FUSED_WARP_ROWS;
use crate::params::{EpilogueParams, OutType};
use crate::plant;
use crate::ptx::wgmma::Fragment;
use crate::ptx::{bits, global, math, smem, thread};
use crate::quantize::device::{Quotient, encode4};

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
pub(super) unsafe fn apply_as<const ACT: u32, F: Fragment>(
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
            let product = math::mul_rn(e.alpha * plant::FUSED, v[4 * g + k]);
            let t = math::add_rn(product, bias[g][k % 2]);
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
pub(super) unsafe fn load_bias<F: Fragment>(
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
pub(super) unsafe fn copy_out_codes<const CHUNKS: bool>(
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
pub(super) unsafe fn mx_fragment<F: Fragment, const E: u32>(
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
pub(super) unsafe fn stage_codes<F: Fragment>(
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
