//! Hopper FP8 GEMM with fp32 block scales: 1×128 for A (per row, per 128 of K), 128×128 for B
//! (DeepSeek-V3), C = A·Bᵀ, run by the warp-specialized driver ([`crate::gemm::driver`]).
//! Per-tensor and per-row A scales come through it after the host expands them into this layout;
//! per-row B scales (per column of C, constant over K) are multiplied in after the K loop.
//!
//! - Load (one producer thread, per K block of 128): the A tile (`block_m` × 128 FP8, in boxes of
//!   a wave or of 64 rows), the B tile (`block_n` × 128) and the tile's A scales, and the K
//!   block's B scales by small asynchronous copies beside them ([`B_SCALE_BYTES`]). In a
//!   pair along M the two CTAs share the B tile (each loads half and multicasts it); along N the
//!   A tile (each loads every other box).
//! - Compute (consumer warpgroup `c`: 64 rows of each wave): per K block and wave, four `wgmma
//!   m64nNk32` into a scratch fragment, then promotion into the wave's fp32 sums with
//!   `scale_a[row] · scale_b` (wide tiles: two B scales, split by column). The waves share the
//!   scratch (a thread holds N/2·(waves + 1) accumulators). One-wave tiles' consumers take turns
//!   issuing ([`Turn`]); 128 × 128 and 128 × 64 tiles issue two K blocks into two scratch
//!   fragments and promote the first while the second runs; two-wave tiles' consumers run
//!   freely, each promoting while the other's batch runs. A K block's B scales are read from its
//!   stage after the wait, and the stage is released before the last promotion.
//! - Store: 16-bit output through shared boxes and TMA stores; f32 output, N % 8 ≠ 0 and split-K
//!   partials directly.

use core::marker::PhantomData;

use super::{
    B_SCALE_BYTES, BLOCK_K, BLOCK_N, Mode, ROW_BYTES, SFA_BOX, Sm90Fp8Params, Tile, WG_ROWS,
};
use crate::gemm::driver::{Ctx, GemmKernel};
use crate::gemm::epilogue::fuse;
use crate::gemm::epilogue::{self, Output, Staging, TileStore};
use crate::gemm::layout::StageLayout;
use crate::gemm::pipeline::{PipelineState, Turn};
use crate::gemm::promote::{promote, promote_split};
use crate::gemm::scheduler::{ClusterShape, MAX_CLUSTER, Schedule, WorkUnit};
use crate::params::EpilogueParams;
use crate::ptx::wgmma::{self, Descriptor, Fp8Fragment, Fp8Pair, Fragment, Swizzle};
use crate::ptx::{cp_async, global, smem, thread, tma};

/// K per `wgmma` (FP8): 32 elements = 32 bytes of a swizzled row.
const MMA_K: u32 = 32;
/// Bytes between 8-row groups of a 128-byte-swizzled tile (8 rows × 128 bytes).
const SWIZZLE_SBO: u32 = 8 * ROW_BYTES;

/// The kernel for a tile of `CONS` consumers × `WAVES` waves × `F::N` columns, element types `T`,
/// running `MODE` ([`Mode`] as u32): dense, grouped (`Sm90Fp8Params::groups`), block-sparse
/// (`Sm90Fp8Params::sparse`) or dense with the fused epilogue (`Fp8Gemm::epi`); the dense
/// kernels have no group or segment walk and no fused epilogue at all.
pub(crate) struct Fp8Gemm<const CONS: u32, const WAVES: usize, F, T, const MODE: u32> {
    pub(crate) p: Sm90Fp8Params,
    /// The fused epilogue (read by [`Mode::Fused`] kernels only).
    pub(crate) epi: EpilogueParams,
    pub(crate) types: PhantomData<(F, T)>,
}

impl<const CONS: u32, const WAVES: usize, F: Fp8Fragment, T: Fp8Pair, const MODE: u32>
    Fp8Gemm<CONS, WAVES, F, T, MODE>
{
    const TILE: Tile = Tile::new(CONS, WAVES as u32, F::N);
    const GROUPED: bool = MODE == Mode::Grouped as u32;
    /// Block-sparse: B's tiles are the stored blocks (or halves of them for 64-column tiles) of
    /// the sparse operand, a unit's K blocks are positions in them, and each has one B scale.
    const SPARSE: bool = MODE == Mode::Sparse as u32;
    /// Whether the tile ends in the fused epilogue (`Fp8Gemm::epi`) instead of the plain
    /// stores: in finishing warps ([`Mode::Fused`]) or in the consumers' registers
    /// ([`Mode::FusedInRegisters`]).
    const FUSED: bool = MODE == Mode::Fused as u32
        || MODE == Mode::FusedInRegisters as u32
        || MODE == Mode::FusedInRegistersMx as u32;
    /// Whether the in-register epilogue's quantized output is MXFP8 ([`Mode::FusedInRegistersMx`]).
    const MX_OUT: bool = MODE == Mode::FusedInRegistersMx as u32;
    /// Whether the kernel has finishing warps: [`Mode::Fused`].
    const STAGED: bool = MODE == Mode::Fused as u32;
    /// Whether a unit may compute fewer than all its waves ([`Self::live_waves`]): grouped tiles
    /// of several waves.
    const TAILS: bool = Self::GROUPED && WAVES > 1;
}

/// One consumer warpgroup's constants.
pub(crate) struct Consumer<const CONS: u32> {
    /// The consumers issue their MMA batches in turn.
    turn: Turn<CONS>,
    /// Consumer index (which 64 rows of each wave).
    c: u32,
    /// Thread index in the warpgroup.
    local: u32,
    /// This thread's first row in each wave (the second is `row + 8`).
    row: u32,
}

impl<const CONS: u32, const WAVES: usize, F: Fp8Fragment, T: Fp8Pair, const MODE: u32> GemmKernel
    for Fp8Gemm<CONS, WAVES, F, T, MODE>
{
    const CONSUMERS: u32 = CONS;
    /// The fused kernels' epilogue runs in three finishing warps (`gemm::epilogue::fuse`).
    const FINISHERS: u32 = if Self::STAGED {
        crate::gemm::FINISHERS
    } else {
        0
    };
    /// The K block's B scales ([`B_SCALE_BYTES`]).
    const COPIES_WORDS: bool = true;
    type Consumer = Consumer<CONS>;
    type Acc = [F; WAVES];

    #[inline(always)]
    fn layout(&self) -> StageLayout {
        if Self::STAGED {
            Self::TILE.fused_layout()
        } else {
            Self::TILE.layout()
        }
    }

    #[inline(always)]
    fn cluster(&self) -> ClusterShape {
        // (The host passes 1 or MAX_CLUSTER; the clamp shows the compiler that no division by
        // the cluster's sizes can be by zero, so no kernel carries a panic path for it.)
        ClusterShape {
            m: self.p.cluster_m.clamp(1, MAX_CLUSTER),
            n: self.p.cluster_n.clamp(1, MAX_CLUSTER),
        }
    }

    #[inline(always)]
    fn schedule(&self) -> Schedule {
        // (The parameters are read in the order of `Schedule`'s fields; any order is correct.)
        let (p, cl) = (&self.p, self.cluster());
        let (m, n, l, k) = (p.m, p.n, p.l, p.k);
        Self::TILE.schedule(
            (m, n, k, l),
            cl,
            (p.split_k, p.group_m),
            if Self::GROUPED { Some(p.groups) } else { None },
            if Self::SPARSE {
                Some(p.sparse.sparse())
            } else {
                None
            },
        )
    }

    #[inline(always)]
    unsafe fn copy_words(&self, own: &WorkUnit, kb: u32, dst: u32) {
        const { assert!(Self::TILE.layout().contents.words == B_SCALE_BYTES) };
        let at = self.b_scales(own).at(kb);
        // SAFETY: `kb` is one of the unit's K blocks (or, sparse, stored blocks), whose scales
        // `BScales` keeps inside the buffer; `dst` holds two words.
        unsafe {
            cp_async::copy_4(dst, at.first as u64);
            if F::N > BLOCK_N {
                cp_async::copy_4(dst + 4, at.second as u64);
            }
        }
    }

    #[inline(always)]
    fn prologue(&self) {
        // SAFETY: the maps are tensor maps (the entry's contract).
        unsafe { prefetch_maps(&self.p) }
    }

    #[inline(always)]
    unsafe fn load(&self, ctx: &Ctx, own: &WorkUnit, kb: u32, s: u32, full: u32) {
        let (p, tile, cl, layout) = (&self.p, Self::TILE, self.cluster(), &ctx.layout);
        let all = ((1u32 << cl.size()) - 1) as u16;
        // Sparse: `kb` is a stored block, whose K block is its column.
        let k_block = if Self::SPARSE {
            // SAFETY: `cols` holds a column in range for every stored block (the entry's
            // contract), and the unit's positions are stored blocks.
            unsafe { global::load_u32_nc(p.sparse.cols + 4 * kb as u64) }
        } else {
            kb
        };
        let x = (k_block * BLOCK_K) as i32;
        let (a_l, l) = (own.a_l as i32, own.l as i32);
        let row0 = own.first_row(own.m, tile.block_m());
        // SAFETY: the driver's contract (the stage is free); the boxes fit the stage's buffers;
        // the maps cover the operands and their scales; TMA zero-fills rows past M or N.
        unsafe {
            let a_box = tile.a_box_rows(cl.n);
            for w in 0..tile.block_m() / a_box {
                let (dst, y) = (
                    layout.a(s) + w * a_box * ROW_BYTES,
                    (row0 + w * a_box) as i32,
                );
                if cl.n == 1 {
                    tma::load_3d(dst, p.tmap_a, x, y, a_l, full);
                } else if w % cl.n == ctx.rank {
                    // Our box of the shared A tile, into every CTA of the cluster.
                    tma::load_3d_multicast(dst, p.tmap_a, x, y, a_l, full, all);
                }
            }
            // Along M: our share of the shared B tile, into every CTA of the cluster.
            let b_rows = F::N / cl.m;
            let share = if cl.m > 1 { ctx.rank } else { 0 };
            let b_dst = layout.b(s) + share * b_rows * ROW_BYTES;
            let b_y = (own.n * F::N + share * b_rows) as i32;
            // Sparse: stored block `kb`, from the tile's first row in its block.
            let (b_x, b_y, b_z) = if Self::SPARSE {
                (0, b_y % BLOCK_N as i32, kb as i32)
            } else {
                (x, b_y, l)
            };
            if cl.m > 1 {
                tma::load_3d_multicast(b_dst, p.tmap_b, b_x, b_y, b_z, full, all);
            } else {
                tma::load_3d(b_dst, p.tmap_b, b_x, b_y, b_z, full);
            }
            // The tile's A scales: a box per 128 rows, from the aligned row at or below.
            for b in 0..tile.sfa_boxes() {
                let (y, _) = SFA_BOX.start(row0 + b * SFA_BOX.tile_rows);
                let dst = layout.sfa(s) + b * SFA_BOX.bytes();
                tma::load_3d(dst, p.tmap_sfa, y as i32, k_block as i32, a_l, full);
            }
        }
    }

    #[inline(always)]
    fn consumer(&self, _ctx: &Ctx, c: u32, local: u32) -> Consumer<CONS> {
        Consumer {
            turn: Turn::new(c),
            c,
            local,
            // The accumulator fragment's first row of this thread within each wave.
            row: c * WG_ROWS + wgmma::fragment_row(local),
        }
    }

    #[inline(always)]
    unsafe fn mainloop(
        &self,
        ctx: &Ctx,
        cons: &Consumer<CONS>,
        own: &WorkUnit,
        st: &mut PipelineState,
    ) -> [F; WAVES] {
        // Wide tiles: where the tile's columns move to the second B-scale block.
        let split = self.b_scales(own).split;
        // Where the tile's first row sits in its scale boxes (dense tiles start aligned).
        let shift = if Self::GROUPED {
            SFA_BOX.start(own.first_row(own.m, Self::TILE.block_m())).1
        } else {
            0
        };
        let mut acc = [F::zeros(); WAVES];
        let live = Self::live_waves(own, cons.c);
        let (mut kb, end) = (own.k_begin, own.k_end);
        if Self::SPARSE && kb >= end {
            // An empty block row of the sparse operand: its output is zero.
            return acc;
        }
        // SAFETY (every call below): `st` counts this warpgroup's uses in order; each is waited
        // for, used by every wave and released before the next; `kb + 1 < end` for a pair.
        // (Not in the kernel with finishing warps: its consumers leave the registers of the
        // second scratch fragment to them, `Tile::consumer_regs_with`.)
        if CONS == 2 && WAVES == 1 && F::N <= BLOCK_N && !Self::STAGED {
            while kb < end {
                unsafe {
                    if kb + 1 < end {
                        self.k_pair(ctx, cons, &mut acc[0], *st, shift);
                        (kb, *st) = (kb + 2, st.next().next());
                    } else {
                        let scales = (split, shift);
                        self.k_block::<false>(ctx, cons, &mut acc, *st, scales, false, false);
                        (kb, *st) = (kb + 1, st.next());
                    }
                }
            }
            return acc;
        }
        // One K block at a time, its stage tested before the previous block's last promotion
        // (`ready`).
        let mut ready = false;
        let scales = (split, shift);
        if WAVES > 1 && st.is_first() && kb < end {
            // The very first batch staggers the consumers (below).
            let more = kb + 1 < end;
            ready = unsafe {
                if Self::TAILS && live < WAVES as u32 {
                    self.k_block_tail::<true>(ctx, cons, &mut acc, *st, scales, live)
                } else {
                    self.k_block::<true>(ctx, cons, &mut acc, *st, scales, ready, more)
                }
            };
            (kb, *st) = (kb + 1, st.next());
        }
        while kb < end {
            let more = kb + 1 < end;
            ready = unsafe {
                if Self::TAILS && live < WAVES as u32 {
                    self.k_block_tail::<false>(ctx, cons, &mut acc, *st, scales, live)
                } else {
                    self.k_block::<false>(ctx, cons, &mut acc, *st, scales, ready, more)
                }
            };
            (kb, *st) = (kb + 1, st.next());
        }
        acc
    }

    #[inline(always)]
    fn epilogue(&self, ctx: &Ctx, cons: &Consumer<CONS>, own: &WorkUnit, mut acc: [F; WAVES]) {
        let p = &self.p;
        if p.sfb_col != 0 {
            // SAFETY: `sfb_col` holds `l · n` scales; columns are clamped to n − 1 (past N the
            // values are never stored).
            let batch = own.l as usize * p.n as usize;
            let lane = cons.local % 32;
            unsafe { epilogue::scale_columns(&mut acc, p.sfb_col, batch, own.n * F::N, p.n, lane) };
        }
        let dst = self.tile_store(ctx, own);
        let who = (cons.c, CONS, cons.local);
        // SAFETY: the host sizes `splitk` for this schedule and cluster (the entry's contract);
        // the tile is CONS · WAVES fragments of 64 rows; `tmap_c`, when set, maps the 16-bit
        // output; the staging boxes are this warpgroup's.
        unsafe {
            epilogue::finish_unit(
                &p.splitk,
                &self.schedule(),
                self.cluster(),
                own,
                who,
                &mut acc,
                &dst,
            )
        };
    }

    #[inline(always)]
    fn finish_staged(&self, ctx: &Ctx, own: &WorkUnit, warp: u32, lane: u32) {
        let who = (warp, Self::FINISHERS);
        // SAFETY: the driver's hand-over (the unit is staged); the entry's contract for the
        // epilogue's buffers.
        unsafe { fuse::finish_unit_staged::<F>(&self.tile_store(ctx, own), own, who, lane) };
    }

    #[inline(always)]
    fn finish(&self, cons: &Consumer<CONS>, st: PipelineState) {
        if WAVES == 1 && !st.is_first() {
            // (All consumers ran the same units, so they agree on whether there was a batch.)
            cons.turn.finish();
        }
        if self.p.tmap_c != 0 {
            epilogue::drain(cons.local);
        }
    }
}

impl<const CONS: u32, const WAVES: usize, F: Fp8Fragment, T: Fp8Pair, const MODE: u32>
    Fp8Gemm<CONS, WAVES, F, T, MODE>
{
    /// Where unit `own`'s tile goes: the output, the fused epilogue and its hand-over (fused
    /// kernels), the staging in shared memory (16-bit boxes for TMA stores, or the fused kernels'
    /// f32 rows).
    #[inline(always)]
    fn tile_store(&self, ctx: &Ctx, own: &WorkUnit) -> TileStore<'_> {
        let (p, tile) = (&self.p, Self::TILE);
        TileStore {
            out: Output {
                ptr: p.out,
                tmap: p.tmap_c,
                m: p.m,
                n: p.n,
                out_type: p.out_type,
                row_end: own.row_end,
            },
            epi: TileStore::fused_epi(
                (Self::FUSED, Self::STAGED, Self::MX_OUT),
                &self.epi,
                &ctx.layout,
            ),
            staging: Staging {
                base: ctx.layout.out(),
                consumers: CONS,
                block_n: F::N,
                ring: false,
            },
            // A sparse A: the tile is Cᵀ.
            transposed: Self::SPARSE && p.sparse.transposed != 0,
            block_m: tile.block_m(),
            wave_m: tile.wave_m(),
        }
    }

    /// Waits for use `st`; for each wave issues its four `wgmma` into the scratch fragment, waits
    /// for them and promotes the partial sums into the wave's sums with `scale_b` (`.1`: the next
    /// B-scale block's, for the columns from `split` on in wide tiles); releases the stage.
    /// One-wave tiles' consumers take their turns on every batch. Two-wave tiles' consumers run
    /// freely: a consumer promotes one wave while the other consumer's batch runs; only the very
    /// first batch is ordered (`STAGGER`: consumer 1 waits for consumer 0's), a one-time offset
    /// that keeps their promotions apart (a turn on every batch measured
    /// slower).
    /// `(split, shift)`: the wide tiles' column split (the K block's B scales are in its stage)
    /// and the tile's first row in its A-scale boxes. `ready`: use `st` was found filled already; `more`:
    /// another K block of this unit follows. Returns whether the next use was found filled
    /// (tested before the last promotion, so that the barrier's latency hides behind it).
    /// # Safety
    /// `st` is this warpgroup's next use; `ready` only if `consumer_test(st)` returned true.
    #[inline(always)]
    unsafe fn k_block<const STAGGER: bool>(
        &self,
        ctx: &Ctx,
        cons: &Consumer<CONS>,
        acc: &mut [F; WAVES],
        st: PipelineState,
        (split, shift): (u32, u32),
        ready: bool,
        more: bool,
    ) -> bool {
        let s = ctx.pipe.stage(st);
        let mut next_ready = false;
        // SAFETY: the caller's contract; the stage (tiles and scales) is filled after
        // `consumer_wait` (or a successful `consumer_test`); rows < block_m.
        unsafe {
            if !ready {
                ctx.pipe.consumer_wait(st);
            }
            let scale_b = Self::b_scale(&ctx.layout, s);
            for (w, acc) in acc.iter_mut().enumerate() {
                let w = w as u32;
                let stagger = STAGGER && w == 0;
                if WAVES == 1 || (stagger && cons.c == 1) {
                    cons.turn.wait(st.is_first());
                }
                let mut part = Self::issue(&ctx.layout, cons.c, s, w);
                if WAVES == 1 || (stagger && cons.c == 0) {
                    cons.turn.pass();
                }
                let (sa0, sa1) = Self::scales(&ctx.layout, cons.row, s, w, shift);
                wgmma::wait::<0>();
                part.fence();
                if w + 1 == WAVES as u32 {
                    // This thread has read the stage (its MMAs completed, its scales loaded):
                    // release it before the last promotion, so the producer refills it sooner.
                    ctx.pipe.consumer_release(st, ctx.rank);
                    // Two-wave tiles only: with one wave the consumers take turns, and the test
                    // measured slower there.
                    next_ready = WAVES > 1 && more && ctx.pipe.consumer_test(st.next());
                }
                Self::promote_wave(acc, &part, (sa0, sa1), scale_b, split);
            }
        }
        next_ready
    }

    /// [`Self::k_block`] of a two-wave unit in which this consumer computes only its first
    /// `live` waves, 0 or 1 ([`Self::live_waves`]): it waits for the stage, computes the live
    /// wave, keeps the staggered first batch's turn, and releases the stage. Returns false (the
    /// next use is waited for).
    /// # Safety
    /// As [`Self::k_block`].
    #[inline(always)]
    unsafe fn k_block_tail<const STAGGER: bool>(
        &self,
        ctx: &Ctx,
        cons: &Consumer<CONS>,
        acc: &mut [F; WAVES],
        st: PipelineState,
        (split, shift): (u32, u32),
        live: u32,
    ) -> bool {
        let s = ctx.pipe.stage(st);
        // SAFETY: the caller's contract; the stage is read only after `consumer_wait` and
        // released after the live wave's MMAs completed and its scales were loaded.
        unsafe {
            ctx.pipe.consumer_wait(st);
            if STAGGER && cons.c == 1 {
                cons.turn.wait(st.is_first());
            }
            if live > 0 {
                let mut part = Self::issue(&ctx.layout, cons.c, s, 0);
                if STAGGER && cons.c == 0 {
                    cons.turn.pass();
                }
                let (sa0, sa1) = Self::scales(&ctx.layout, cons.row, s, 0, shift);
                let scale_b = Self::b_scale(&ctx.layout, s);
                wgmma::wait::<0>();
                part.fence();
                ctx.pipe.consumer_release(st, ctx.rank);
                Self::promote_wave(&mut acc[0], &part, (sa0, sa1), scale_b, split);
            } else {
                // (A CTA of a pair along M whose tile lies wholly past its group: consumer 1
                // still waits for this turn on the very first batch.)
                if STAGGER && cons.c == 0 {
                    cons.turn.pass();
                }
                ctx.pipe.consumer_release(st, ctx.rank);
            }
        }
        false
    }

    /// Adds one wave's scratch `part` into its sums `acc`, scaled by this thread's two rows' A
    /// scales `(sa0, sa1)` times the K block's B scale (wide tiles: `scale_b.1` for the columns
    /// from `split` on, which are in the next B-scale block).
    #[inline(always)]
    fn promote_wave(
        acc: &mut F,
        part: &F,
        (sa0, sa1): (f32, f32),
        scale_b: (f32, f32),
        split: u32,
    ) {
        let f = (sa0 * scale_b.0, sa1 * scale_b.0);
        if F::N > BLOCK_N {
            let g = (sa0 * scale_b.1, sa1 * scale_b.1);
            promote_split(acc, part, f, g, split);
        } else {
            promote(acc, part, f.0, f.1);
        }
    }

    /// How many of its waves consumer `c` computes in unit `own`: all of them, except in a
    /// grouped tile of several waves that hangs past its group's last row (a group's last tile,
    /// as its rows are rarely a multiple of the tile's), where a wave whose 64 rows of this
    /// consumer all lie past the group is not computed ([`Tile::live_waves`]): its share of
    /// the tensor cores goes to the other consumer.
    #[inline(always)]
    fn live_waves(own: &WorkUnit, c: u32) -> u32 {
        if Self::TAILS {
            let first = own.first_row(own.m, Self::TILE.block_m());
            Self::TILE.live_waves(first, own.row_end, c)
        } else {
            WAVES as u32
        }
    }

    /// 128-row tiles, two K blocks at once: issues use `st`'s four MMAs into one scratch fragment
    /// and the next use's into a second, then promotes the first while the second runs, and the
    /// second while the other consumer's MMAs run. (One K block at a time, the tensor cores wait
    /// for every promotion of both consumers; a third scratch does not fit.)
    /// # Safety
    /// As [`Self::k_block`], for uses `st` and `st.next()`.
    #[inline(always)]
    unsafe fn k_pair(
        &self,
        ctx: &Ctx,
        cons: &Consumer<CONS>,
        acc: &mut F,
        st: PipelineState,
        shift: u32,
    ) {
        let (pipe, layout) = (&ctx.pipe, &ctx.layout);
        let (st1, c) = (st.next(), cons.c);
        let (s0, s1) = (pipe.stage(st), pipe.stage(st1));
        // SAFETY: the caller's contract; each stage is read only after its `consumer_wait` and
        // released after its MMAs completed and its scales were loaded.
        unsafe {
            pipe.consumer_wait(st);
            cons.turn.wait(st.is_first());
            let mut part0 = Self::issue(layout, c, s0, 0);
            pipe.consumer_wait(st1);
            let mut part1 = Self::issue(layout, c, s1, 0);
            cons.turn.pass();
            // (Tiles of at most 128 columns: one B scale per K block.)
            let (sb0, sb1) = (Self::b_scale(layout, s0).0, Self::b_scale(layout, s1).0);
            let (a00, a01) = Self::scales(layout, cons.row, s0, 0, shift);
            let (a10, a11) = Self::scales(layout, cons.row, s1, 0, shift);
            let (f00, f01, f10, f11) = (a00 * sb0, a01 * sb0, a10 * sb1, a11 * sb1);
            wgmma::wait::<1>();
            part0.fence();
            pipe.consumer_release(st, ctx.rank);
            promote(acc, &part0, f00, f01);
            wgmma::wait::<0>();
            part1.fence();
            pipe.consumer_release(st1, ctx.rank);
            promote(acc, &part1, f10, f11);
        }
    }

    /// Where the unit's B scales are in global memory (the producer's [`Self::copy_words`]; the
    /// consumers take only the wide tiles' column split from it).
    #[inline(always)]
    fn b_scales(&self, own: &WorkUnit) -> BScales {
        if Self::SPARSE {
            BScales::per_block(&self.p)
        } else {
            BScales::of(&self.p, own, F::N)
        }
    }

    /// Stage `s`'s K block's B scales ([`B_SCALE_BYTES`]: the first block's, and the second's for
    /// the columns from the split on in wide tiles; the first twice in the others).
    /// # Safety
    /// Stage `s` is filled.
    #[inline(always)]
    unsafe fn b_scale(layout: &StageLayout, s: u32) -> (f32, f32) {
        // SAFETY: the caller's contract (the stage's phase waited for the producer's copies).
        unsafe {
            if F::N > BLOCK_N {
                let [first, second] = smem::load_u32x2(layout.words(s));
                (f32::from_bits(first), f32::from_bits(second))
            } else {
                let first = f32::from_bits(smem::load_u32(layout.words(s)));
                (first, first)
            }
        }
    }

    /// The four `wgmma m64nNk32` of consumer `c`'s rows of stage `s`, wave `w`, into a fresh
    /// scratch fragment, committed as one group.
    /// # Safety
    /// Stage `s` is filled (its full barrier waited for).
    #[inline(always)]
    unsafe fn issue(layout: &StageLayout, c: u32, s: u32, w: u32) -> F {
        let a_row = w * Self::TILE.wave_m() + c * WG_ROWS;
        // SAFETY: the caller's contract.
        unsafe { mma_block::<F, T>(layout.a(s), a_row, layout.b(s)) }
    }

    /// This thread's two rows' A scales for stage `s`, wave `w`. Tile row `r` is entry
    /// `shift + r % 128` of box `r / 128` ([`SFA_BOX`]; a thread's rows `r`, `r + 8` have
    /// `r % 16 < 8`, so both lie in one box).
    /// # Safety
    /// Stage `s` is filled.
    #[inline(always)]
    unsafe fn scales(layout: &StageLayout, row: u32, s: u32, w: u32, shift: u32) -> (f32, f32) {
        let r = w * Self::TILE.wave_m() + row;
        let at = layout.sfa(s)
            + (r / SFA_BOX.tile_rows) * SFA_BOX.bytes()
            + 4 * (shift + r % SFA_BOX.tile_rows);
        // SAFETY: the caller's contract; rows < block_m, inside the stage's boxes.
        unsafe {
            (
                f32::from_bits(smem::load_u32(at)),
                f32::from_bits(smem::load_u32(at + 4 * 8)),
            )
        }
    }
}

/// Where a tile's B scales are: the 128-column scale block its first column is in, the next one
/// (wide tiles straddle two), each a row of `k / 128` f32, and the tile's first column of the
/// second block. A pair along N may hang past N by one tile: its output is clipped, and its B
/// scales are read from the last real block (never past the buffer).
#[derive(Clone, Copy)]
pub(crate) struct BScales {
    first: *const f32,
    second: *const f32,
    /// Columns of the tile in the first block (a multiple of 16, in 16..=128).
    split: u32,
}

impl BScales {
    /// Block-sparse: one scale per stored block, indexed by position (`at` then takes a unit's
    /// positions).
    #[inline(always)]
    fn per_block(p: &Sm90Fp8Params) -> BScales {
        let base = p.sfb as *const f32;
        BScales {
            first: base,
            second: base,
            split: BLOCK_N,
        }
    }

    #[inline(always)]
    fn of(p: &Sm90Fp8Params, own: &WorkUnit, block_n: u32) -> BScales {
        let (n_blocks, k_blocks) = (p.n.div_ceil(BLOCK_N), p.k / BLOCK_K);
        let col = own.n * block_n;
        let block = (col / BLOCK_N).min(n_blocks - 1);
        let row = |b: u32| {
            (p.sfb as *const f32).wrapping_add(((own.l * n_blocks + b) * k_blocks) as usize)
        };
        BScales {
            first: row(block),
            second: row((block + 1).min(n_blocks - 1)),
            split: BLOCK_N - col % BLOCK_N,
        }
    }

    /// The scales of K block `kb`.
    #[inline(always)]
    fn at(self, kb: u32) -> BScales {
        BScales {
            first: self.first.wrapping_add(kb as usize),
            second: self.second.wrapping_add(kb as usize),
            ..self
        }
    }

    /// The two blocks' scales (the second only for tiles wider than one block).
    /// # Safety
    /// Both pointers are inside the B-scale buffer (as `of` and `at` keep them for K blocks of
    /// the problem).
    #[inline(always)]
    unsafe fn load(self, block_n: u32) -> (f32, f32) {
        // SAFETY: the caller's contract (the B scales are read-only during the kernel).
        unsafe {
            let first = global::load_f32_nc(self.first as u64);
            let second = if block_n > BLOCK_N {
                global::load_f32_nc(self.second as u64)
            } else {
                first
            };
            (first, second)
        }
    }
}

/// One K block (128) of `wgmma m64nNk32`: rows `a_row..a_row + 64` of the 128-byte-swizzled
/// tile at `a` (`wgmma`'s A) times the `F::N` rows of the tile at `b`, into a fresh fragment, the
/// four MMAs committed as one group. The swapped kernel passes the B tile as `a`.
/// # Safety
/// Both tiles are filled (their stage's full barrier waited for) and hold those rows.
#[inline(always)]
pub(super) unsafe fn mma_block<F: Fp8Fragment, T: Fp8Pair>(a: u32, a_row: u32, b: u32) -> F {
    // For batches of 128 columns or more, the tiles' addresses as warp-uniform values: the
    // descriptors are then computed in uniform registers, which `wgmma` reads them from, instead
    // of moved there one by one (`R2UR`) before every batch. Narrower batches (128 × 64 and the
    // swapped decode tiles) are short enough that the shuffles' own latency measured slower.
    let a = a + a_row * ROW_BYTES;
    let (a, b) = if F::N >= 128 {
        (thread::warp_uniform(a), thread::warp_uniform(b))
    } else {
        (a, b)
    };
    wgmma::fence();
    // SAFETY: the caller's contract.
    unsafe {
        let mut part = F::first::<T>(swizzled(a, 0), swizzled(b, 0));
        for kk in 1..BLOCK_K / MMA_K {
            part.acc::<T>(swizzled(a, kk), swizzled(b, kk));
        }
        wgmma::commit();
        part
    }
}

/// Prefetches the tensor maps of A, B and A's scales (thread 0, before the first copy).
/// # Safety
/// The three maps are tensor maps in global memory (the entry's contract).
#[inline(always)]
pub(super) unsafe fn prefetch_maps(p: &Sm90Fp8Params) {
    // SAFETY: the caller's contract.
    unsafe {
        tma::prefetch_map(p.tmap_a);
        tma::prefetch_map(p.tmap_b);
        tma::prefetch_map(p.tmap_sfa);
    }
}

/// The `wgmma` descriptor of a K-major, 128-byte-swizzled tile whose first row is at `rows` (as
/// TMA wrote it with 128-byte rows; a multiple of 8 rows into its tile), at K step `kk` (32 bytes
/// each).
#[inline(always)]
fn swizzled(rows: u32, kk: u32) -> Descriptor {
    Descriptor::new(rows, 16, SWIZZLE_SBO, Swizzle::B128).advance(kk * MMA_K)
}
