//! The finishing warps' half of the staged epilogue: rows read back from the staging, the steps applied, stored or quantized.

use super::activation::activate;
use super::stage::{Scratch, finish4, load4};
use super::{PASS_COLS, quant_types, scale_index, store_f32_scale};
use crate::format::quantize::{block_scale_of_bits, magnitude_bits};
use crate::format::{ElemType, ScaleType};
use crate::gemm::epilogue::target::{Finish, Output, Staging, TileStore};
use crate::gemm::layout::FRAGMENT_ROWS;
use crate::gemm::pipeline::Handoff;
use crate::gemm::scheduler::WorkUnit;
use crate::params::{EpilogueParams, OutType};
use crate::plant;
use crate::ptx::wgmma::Fragment;
use crate::ptx::{convert, global, math, smem, thread};
use crate::quantize::device::{Quotient, encode4};

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
pub(super) const FAST_ROWS: usize = 4;

/// [`rows_fast`]'s output kinds: bf16, or FP8 with fp32 scales per 1×128 (DeepSeek-style
/// activations for the next GEMM).
pub(super) const FAST_BF16: u32 = 0;
pub(super) const FAST_FP8_ROWS: u32 = 1;

/// One finishing warp's rows of one consumer's staged fragment, for one pass of columns.
#[derive(Clone, Copy)]
pub(super) struct Rows {
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
pub(super) unsafe fn rows_by_activation<const OUT: u32>(
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
pub(super) unsafe fn rows_fast<const ACT: u32, const OUT: u32>(
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
        let mut t = v.map(|x| math::mul_rn(e.alpha * plant::FUSED, x));
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
pub(super) unsafe fn quantize_rows(
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
