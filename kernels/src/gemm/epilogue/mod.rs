//! Epilogue stores of `wgmma` accumulator fragments (thread t of a warpgroup, warp w = t/32,
//! lane l, holds value i at row `16w + l/4 + 8·((i/2)%2)`, column `8·(i/4) + 2·(l%4) + (i%2)`):
//! - 16-bit output through swizzled shared boxes of 64 rows × 64 columns (32 or 16 where the
//!   tile's width is not a multiple of 64: [`out_box_n`]) and TMA stores (the warpgroup goes on to
//!   its next tile while they drain; TMA clips rows past M and columns past N);
//! - direct stores with predicates (f32 output, N % 8 ≠ 0, and split-K partials into the f32
//!   workspace), also of transposed products (kernels that swap A and B);
//! - per-column scales multiplied in after the K loop, and one scale for all (`scale`).

use super::barriers::sync_consumer;
use super::layout::{FRAGMENT_ROWS, OUT_RING_SLOTS};
use super::scheduler::{ClusterShape, Schedule, WorkUnit};
use super::splitk;
use crate::params::{EpilogueParams, OutType, SplitKParams};
use crate::ptx::wgmma::{self, Fragment};
use crate::ptx::{convert, global, smem, tma};

pub mod fuse;
mod target;

pub use target::{Finish, Output, Staging, TileStore};

/// Consumer warpgroup `c` (thread `local` of 128) stores its fragments `acc` (one per wave, `wave_m`
/// rows apart) of the tile whose first row, first column and batch entry are `at`: through shared
/// memory and TMA stores when the output has a map ([`store_tma`]), else directly
/// ([`store_direct`]). A tile that crosses `out.row_end` is stored directly: a TMA box clips
/// only at the output's edges.
/// # Safety
/// As [`store_tma`] when `out.tmap` is set.
#[inline(always)]
pub unsafe fn store<const WAVES: usize, F: Fragment>(
    out: &Output,
    staging: Staging,
    c: u32,
    local: u32,
    acc: &[F; WAVES],
    at: (u32, u32, u32),
    wave_m: u32,
) {
    let (m0, n0, l) = at;
    if out.tmap != 0 && m0 + WAVES as u32 * wave_m <= out.row_end {
        // SAFETY: the caller's contract.
        unsafe { store_tma(out, staging, c, local, acc, at, wave_m) };
    } else {
        // The fragment's first row of this thread (the second is 8 below it).
        let row = c * FRAGMENT_ROWS + wgmma::fragment_row(local);
        for (w, acc) in acc.iter().enumerate() {
            store_direct(
                out,
                l,
                m0 + w as u32 * wave_m + row,
                n0 + 2 * (local % 4),
                acc,
            );
        }
    }
}

/// Consumer warpgroup `c` (thread `local` of 128) writes its fragments `acc` (one per wave) of
/// the tile whose first row is `m0` and first column `n0` (batch entry `l`) through shared
/// memory and TMA stores; waves are `wave_m` rows apart. Commits one bulk group; the caller
/// waits for it ([`drain`]) before the block exits.
/// # Safety
/// `out.tmap` maps the 16-bit output; the staging boxes are this CTA's and no other role uses
/// them; every thread of the warpgroup calls this with the same tile.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn store_tma<const WAVES: usize, F: Fragment>(
    out: &Output,
    staging: Staging,
    c: u32,
    local: u32,
    acc: &[F; WAVES],
    (m0, n0, l): (u32, u32, u32),
    wave_m: u32,
) {
    let (warp, lane) = (local / 32, local % 32);
    if local == 0 {
        // The previous tile's stores have read the boxes.
        tma::wait_read::<0>();
    }
    sync_consumer(c);
    let bf16 = out.out_type == OutType::Bf16 as u32;
    if staging.ring {
        // One conversion per path, as below.
        if bf16 {
            store_ring::<true, WAVES, F>(out, staging, c, local, acc, (m0, n0, l), wave_m);
        } else {
            store_ring::<false, WAVES, F>(out, staging, c, local, acc, (m0, n0, l), wave_m);
        }
        return;
    }
    let base = thread_base(staging, staging.box_addr(0, c, 0), local);
    for (w, acc) in acc.iter().enumerate() {
        // One conversion per path (a run-time choice per value doubles the live registers).
        if bf16 {
            stage_fragment::<true, F>(base, staging, w as u32, acc);
        } else {
            stage_fragment::<false, F>(base, staging, w as u32, acc);
        }
    }
    smem::fence_async_proxy();
    sync_consumer(c);
    if local == 0 {
        for w in 0..WAVES as u32 {
            for h in 0..staging.block_n / staging.box_n() {
                let (x, y) = (
                    n0 + h * staging.box_n(),
                    m0 + w * wave_m + c * FRAGMENT_ROWS,
                );
                // SAFETY: the boxes were written and fenced by the whole warpgroup (the barrier
                // above); the map covers the output, TMA clips rows past M and columns past N.
                unsafe {
                    tma::store_3d(
                        out.tmap,
                        x as i32,
                        y as i32,
                        l as i32,
                        staging.box_addr(w, c, h),
                    )
                };
            }
        }
        tma::commit();
    }
}

/// [`store_tma`] through consumer `c`'s ring of [`OUT_RING_SLOTS`] boxes: box by box (wave by
/// wave, left to right), each written, fenced and stored as its own bulk group; a slot is
/// rewritten once the store that last read it has (`wait_read` leaves the newer box's store in
/// flight). The caller has waited for the previous tile's stores and synchronized the warpgroup.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn store_ring<const BF16: bool, const WAVES: usize, F: Fragment>(
    out: &Output,
    staging: Staging,
    c: u32,
    local: u32,
    acc: &[F; WAVES],
    (m0, n0, l): (u32, u32, u32),
    wave_m: u32,
) {
    let box_n = staging.box_n();
    let base = thread_base(staging, staging.slot_addr(c, 0), local);
    let per_wave = F::N / box_n;
    for (w, acc) in acc.iter().enumerate() {
        for h in 0..per_wave {
            let i = w as u32 * per_wave + h;
            let slot = i % OUT_RING_SLOTS;
            if i >= OUT_RING_SLOTS {
                if local == 0 {
                    tma::wait_read::<{ OUT_RING_SLOTS - 1 }>();
                }
                sync_consumer(c);
            }
            stage_box::<BF16, F>(base + slot * staging.box_bytes(), staging, h, acc);
            smem::fence_async_proxy();
            sync_consumer(c);
            if local == 0 {
                let (x, y) = (n0 + h * box_n, m0 + w as u32 * wave_m + c * FRAGMENT_ROWS);
                // SAFETY: the box was written and fenced by the whole warpgroup (the barrier
                // above); the map covers the output, TMA clips rows past M and columns past N.
                unsafe {
                    tma::store_3d(
                        out.tmap,
                        x as i32,
                        y as i32,
                        l as i32,
                        staging.slot_addr(c, slot),
                    )
                };
                tma::commit();
            }
        }
    }
}

/// Thread `local`'s address of chunk 0 of its first row in the box at `box0`, with the swizzle's
/// XOR term added. That term, bits 7.. of the row's offset masked to the span's chunk count, is
/// the same for every row this thread writes (rows r + 16·warp + 8·h differ in bits the mask
/// drops), and it occupies the chunk bits, which the row's offset leaves 0.
#[inline(always)]
fn thread_base(staging: Staging, box0: u32, local: u32) -> u32 {
    let (warp, lane) = (local / 32, local % 32);
    let (r, span) = (16 * warp + lane / 4, staging.row_bytes());
    let xor = 16 * (((r * span) >> 7) & (span / 16 - 1));
    smem::opaque(box0 + r * span + xor + 4 * (lane % 4))
}

/// Writes the values of box `h` of one thread's fragment (columns `h·W..(h + 1)·W`) as 16-bit
/// values into the box at `base` (the thread's address of chunk 0 of its first row, with the
/// swizzle's XOR term, as in [`stage_fragment`]).
#[inline(always)]
fn stage_box<const BF16: bool, F: Fragment>(base: u32, staging: Staging, h: u32, acc: &F) {
    let (box_n, span) = (staging.box_n(), staging.row_bytes());
    let acc = acc.as_ref();
    for jj in 0..box_n / 4 {
        let j = h * (box_n / 4) + jj;
        let i = 2 * j as usize;
        let chunk = jj / 2;
        let addr = (base ^ (16 * chunk)) + 8 * (j % 2) * span;
        let pair = if BF16 {
            convert::f32x2_to_bf16x2(acc[i], acc[i + 1])
        } else {
            convert::f32x2_to_f16x2(acc[i], acc[i + 1])
        };
        // SAFETY: inside this warpgroup's slot (row < 64, chunk < W / 8, lane % 4 < 4).
        unsafe { smem::store_u32(addr, pair) };
    }
}

/// After a warpgroup's last [`store_tma`]: shared memory must outlive the stores' reads.
#[inline(always)]
pub fn drain(local: u32) {
    if local == 0 {
        tma::wait::<0>();
    }
}

/// Writes one thread's fragment of wave `w` as 16-bit values into its warpgroup's boxes (a wave's
/// boxes follow every consumer's boxes of the waves before it). `base` is the thread's address of
/// chunk 0 of its first row in wave 0's first box, with the swizzle's XOR term added (in the
/// chunk bits, which nothing else sets): chunk `j` is then at `base ^ 16·j`. The swizzle is what
/// the TMA store reads, and it spreads a warp's 8 rows over all 32 banks.
#[inline(always)]
fn stage_fragment<const BF16: bool, F: Fragment>(base: u32, staging: Staging, w: u32, acc: &F) {
    let (box_n, span) = (staging.box_n(), staging.row_bytes());
    let wave = w * staging.consumers * (F::N / box_n) * staging.box_bytes();
    let acc = acc.as_ref();
    for j in 0..F::N / 4 {
        let i = 2 * j as usize;
        // Pair j is in the 8-column group j / 2 (row + 8 for odd j): its box and 16-byte chunk.
        let (h, chunk) = ((j / 2) / (box_n / 8), (j / 2) % (box_n / 8));
        let addr = (base ^ (16 * chunk)) + wave + h * staging.box_bytes() + 8 * (j % 2) * span;
        let pair = if BF16 {
            convert::f32x2_to_bf16x2(acc[i], acc[i + 1])
        } else {
            convert::f32x2_to_f16x2(acc[i], acc[i + 1])
        };
        // SAFETY: inside this warpgroup's boxes (row < 64, chunk < 8, lane % 4 < 4).
        unsafe { smem::store_u32(addr, pair) };
    }
}

/// Writes one thread's fragment directly: value `i` at row `row0 + 8·((i/2)%2)`, column
/// `col0 + 8·(i/4) + (i%2)` of batch entry `l`. Adjacent column pairs go out as one 4-byte
/// (16-bit types) or 8-byte (f32) store when N is even (then the pair is aligned), else as two
/// stores; elements past M or N are masked by predicates, not branches (see `ptx::global`).
/// In chunks of [`CHUNK`] values (64 columns): a loop over all 128 values of a 256-column
/// fragment is not unrolled, and the fragment would move to the stack.
#[inline(always)]
pub fn store_direct<F: Fragment>(out: &Output, l: u32, row0: u32, col0: u32, acc: &F) {
    let (chunks, rest) = acc.as_ref().as_chunks::<CHUNK>();
    for (c, chunk) in chunks.iter().enumerate() {
        store_chunk(out, l, row0, col0 + 64 * c as u32, chunk);
    }
    // Fragments whose width is not a multiple of 64 (the wide tiles of 144 and 160 columns).
    store_chunk(out, l, row0, col0 + 64 * chunks.len() as u32, rest);
}

/// Fragment values per chunk of [`store_direct`] and [`scale`]: 64 columns.
const CHUNK: usize = 32;

/// [`store_direct`] of up to [`CHUNK`] values of a fragment, a multiple of 4 (columns from
/// `col0`, 8 per 4 values).
#[inline(always)]
fn store_chunk(out: &Output, l: u32, row0: u32, col0: u32, acc: &[f32]) {
    let out_type = out.out_type;
    let pairs = out.n % 2 == 0;
    let bytes = if out_type == OutType::F32 as u32 {
        4u64
    } else {
        2
    };
    for j in 0..acc.len() / 2 {
        let i = 2 * j;
        let row = row0 + 8 * ((i / 2) % 2) as u32;
        let col = col0 + 8 * (i / 4) as u32;
        let rows = out.rows();
        let (in0, in1) = (row < rows && col < out.n, row < rows && col + 1 < out.n);
        let idx = (l as u64 * out.m as u64 + row as u64) * out.n as u64 + col as u64;
        let addr = out.ptr + idx * bytes;
        let (v0, v1) = (acc[i], acc[i + 1]);
        // SAFETY: each store's predicate says its element is inside the L·M·N output; a pair store
        // is used only when N is even, so `idx` is even and the address is aligned to the pair.
        unsafe {
            if out_type == OutType::F32 as u32 {
                global::store_u32x2_if(addr, v0.to_bits(), v1.to_bits(), pairs && in1);
                global::store_u32_if(addr, v0.to_bits(), !pairs && in0);
                global::store_u32_if(addr + 4, v1.to_bits(), !pairs && in1);
            } else {
                let bf16 = out_type == OutType::Bf16 as u32;
                let cvt = |v| {
                    if bf16 {
                        convert::f32_to_bf16(v)
                    } else {
                        convert::f32_to_f16(v)
                    }
                };
                let (h0, h1) = (cvt(v0), cvt(v1));
                global::store_u32_if(addr, h0 as u32 | (h1 as u32) << 16, pairs && in1);
                global::store_u16_if(addr, h0, !pairs && in0);
                global::store_u16_if(addr + 2, h1, !pairs && in1);
            }
        }
    }
}

/// Consumer warpgroup `c` (thread `local` of 128) stores its fragments `acc` (one per wave,
/// `wave_m` rows apart) of a tile of Cᵀ whose first row (a column of C) is `n0` and first column
/// (a row of C) is `m0`, directly and transposed into `out` (C's shape): the kernels that
/// compute Cᵀ because their sparse operand is A.
#[inline(always)]
pub fn store_transposed_tile<const WAVES: usize, F: Fragment>(
    out: &Output,
    l: u32,
    (c, local): (u32, u32),
    acc: &[F; WAVES],
    (n0, m0): (u32, u32),
    wave_m: u32,
) {
    let row = c * FRAGMENT_ROWS + wgmma::fragment_row(local);
    for (w, acc) in acc.iter().enumerate() {
        store_transposed(
            out,
            l,
            n0 + w as u32 * wave_m + row,
            m0 + 2 * (local % 4),
            acc,
        );
    }
}

/// The end of a unit for consumer warpgroup `c` of `consumers` (thread `local`): its fragments
/// `acc` meet the unit's other K ranges ([`splitk::meet`]); the warpgroup that holds the sum
/// then stores it as `dst` says ([`store`], or [`store_transposed_tile`] for Cᵀ); with a fused
/// epilogue every warpgroup stages its part for the finishing warps ([`fuse::stage_unit`]).
/// # Safety
/// As [`splitk::meet`] for `sk`, `sched`, `cluster`, `own` and the warpgroup; as [`store_tma`]
/// when `dst.out.tmap` is set and the tile is not transposed; as [`fuse::stage_unit`] when
/// `dst.epi` is set.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn finish_unit<const WAVES: usize, F: Fragment>(
    sk: &SplitKParams,
    sched: &Schedule,
    cluster: ClusterShape,
    own: &WorkUnit,
    (c, consumers, local): (u32, u32, u32),
    acc: &mut [F; WAVES],
    dst: &TileStore,
) {
    // SAFETY: the caller's contract.
    let meet = unsafe { splitk::meet(sk, sched, cluster, own, (c, consumers, local), acc) };
    if let Some((epi, Finish::Staged(handoff))) = dst.epi {
        // SAFETY: the caller's contract (the hand-over is between this unit's acquire and
        // commit).
        unsafe { fuse::stage_unit(epi, dst.staging, handoff, (c, local), acc, meet) };
        return;
    }
    let Some(out_l) = meet else { return };
    if let Some((epi, Finish::InRegisters { mx })) = dst.epi {
        // SAFETY: the caller's contract.
        unsafe { finish_in_registers(epi, dst, own, (c, local), acc, (out_l, mx)) };
        return;
    }
    if dst.transposed {
        // The tile's rows are columns of C.
        let out = Output {
            tmap: 0,
            m: dst.out.n,
            n: dst.out.m,
            row_end: u32::MAX,
            ..dst.out
        };
        let at = (own.m * dst.block_m, own.n * F::N);
        store_transposed_tile(&out, out_l, (c, local), acc, at, dst.wave_m);
        return;
    }
    let at = (own.first_row(own.m, dst.block_m), own.n * F::N, out_l);
    // SAFETY: the caller's contract.
    unsafe { store(&dst.out, dst.staging, c, local, acc, at, dst.wave_m) };
}

/// [`finish_unit`]'s fused epilogue in the consumers' registers ([`Finish::InRegisters`]): each
/// wave's fragment through [`fuse::apply`], then stored as the plain kernels store ([`store`]),
/// or as FP8 1×128 or MXFP8 codes through each warp's part of the output staging
/// ([`fuse::quantize_fragment`], [`fuse::quantize_fragment_mx`]).
/// # Safety
/// As [`store`] for `dst`; `epi` is an epilogue [`in_registers`](crate::params::in_registers) takes, its
/// buffers of the output's shape (MXFP8 where `mx`, FP8 1×128 otherwise, when quantized); the
/// staging holds [`fuse::CODE_WARP_BYTES`] per warp of every wave and consumer; tiles of 128
/// columns for a quantized output.
#[inline(always)]
unsafe fn finish_in_registers<const WAVES: usize, F: Fragment>(
    epi: &EpilogueParams,
    dst: &TileStore,
    own: &WorkUnit,
    (c, local): (u32, u32),
    acc: &mut [F; WAVES],
    (l, mx): (u32, bool),
) {
    let (m0, n0) = (own.first_row(own.m, dst.block_m), own.n * F::N);
    let lane = local % 32;
    for acc in acc.iter_mut() {
        // SAFETY: the caller's contract (the bias).
        unsafe { fuse::apply(epi, (l, n0, dst.out.n), lane % 4, acc) };
    }
    if !epi.quantized() {
        // SAFETY: the caller's contract.
        unsafe {
            store(
                &dst.out,
                dst.staging,
                c,
                local,
                acc,
                (m0, n0, l),
                dst.wave_m,
            )
        };
        return;
    }
    if F::N != 128 {
        // (No kernel of other widths runs a quantized output in registers: the host launches
        // these kernels on 128-column tiles only. The test keeps the code out of the others.)
        return;
    }
    let warp = local / 32;
    for (w, acc) in acc.iter().enumerate() {
        let slot = (w as u32 * dst.staging.consumers + c) * 4 + warp;
        // (Made for each tile: a staging address computed before the persistent loop is kept,
        // and spilled, across the K loop.)
        let stage = smem::opaque(dst.staging.base + slot * fuse::CODE_WARP_BYTES);
        let row0 = m0 + w as u32 * dst.wave_m + c * FRAGMENT_ROWS + 16 * warp;
        let at = (l, row0, n0);
        // SAFETY: the caller's contract; the warp's staging is its own.
        unsafe {
            if mx {
                fuse::quantize_fragment_mx(epi, &dst.out, stage, at, lane, acc)
            } else {
                fuse::quantize_fragment(epi, &dst.out, stage, at, lane, acc)
            }
        };
    }
}

/// Writes one thread's fragment of a transposed product (the MMA computed Cᵀ: its rows are
/// columns of C): value `i` at column `n0 + 8·((i/2)%2)`, row `m0 + 8·(i/4) + (i%2)` of C's batch
/// entry `l`, one element per store (lanes with consecutive `l/4` write consecutive columns);
/// elements past M or N are masked by predicates. For fragments of up to 64 values (a loop the
/// compiler unrolls).
#[inline(always)]
pub fn store_transposed<F: Fragment>(out: &Output, l: u32, n0: u32, m0: u32, acc: &F) {
    let acc = acc.as_ref();
    for i in 0..(F::N / 2) as usize {
        let n = n0 + 8 * ((i / 2) % 2) as u32;
        let m = m0 + 8 * (i / 4) as u32 + (i % 2) as u32;
        let inside = m < out.rows() && n < out.n;
        let idx = (l as u64 * out.m as u64 + m as u64) * out.n as u64 + n as u64;
        // SAFETY: the predicate says the element is inside the L·M·N output.
        unsafe {
            if out.out_type == OutType::F32 as u32 {
                global::store_u32_if(out.ptr + 4 * idx, acc[i].to_bits(), inside);
            } else {
                let h = if out.out_type == OutType::Bf16 as u32 {
                    convert::f32_to_bf16(acc[i])
                } else {
                    convert::f32_to_f16(acc[i])
                };
                global::store_u16_if(out.ptr + 2 * idx, h, inside);
            }
        }
    }
}

/// Multiplies every value of `acc` by `alpha` (in chunks, as [`store_direct`]).
#[inline(always)]
pub fn scale<F: Fragment>(acc: &mut F, alpha: f32) {
    let (chunks, rest) = acc.as_mut().as_chunks_mut::<CHUNK>();
    for chunk in chunks {
        for v in chunk.iter_mut() {
            *v *= alpha;
        }
    }
    // Fragments narrower than a chunk (m64n16: 8 values).
    for v in rest.iter_mut() {
        *v *= alpha;
    }
}

/// Multiplies each accumulator by its column's scale `cols[batch + col]` (B scaled per row,
/// constant over K, so it factors out of the sum): value `i` is in column
/// `n0 + 8·(i/4) + 2·(lane%4) + i%2`.
/// # Safety
/// `cols` holds at least `batch + n` f32; `n` ≥ 1.
#[inline(always)]
pub unsafe fn scale_columns<const WAVES: usize, F: Fragment>(
    acc: &mut [F; WAVES],
    cols: u64,
    batch: usize,
    n0: u32,
    n: u32,
    lane: u32,
) {
    let cols = (cols as *const f32).wrapping_add(batch);
    for j in 0..F::N / 4 {
        let col = n0 + 8 * (j / 2) + 2 * (lane % 4);
        // SAFETY: the caller's contract; both columns are clamped into [0, n).
        let (s0, s1) = unsafe {
            (
                *cols.add(col.min(n - 1) as usize),
                *cols.add((col + 1).min(n - 1) as usize),
            )
        };
        for acc in acc.iter_mut() {
            let acc = acc.as_mut();
            acc[2 * j as usize] *= s0;
            acc[2 * j as usize + 1] *= s1;
        }
    }
}
