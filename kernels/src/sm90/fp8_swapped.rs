//! The FP8 block-scaled GEMM at decode sizes, computed swapped: Cᵀ = B·Aᵀ, run by the
//! warp-specialized driver ([`crate::gemm::driver`]) on the FP8 family's parameters.
//!
//! Why: at M ≤ 64 the time is B's bytes (the weights) coming from DRAM. `wgmma`'s M is 64 rows,
//! so an unswapped tile carries 128 rows of A of which at most 64 are real, and only 64 or 128
//! rows of B per stage. Swapped, B is `wgmma`'s A operand (each consumer's 64 rows, one 128×128
//! scale block for the tile) and A is its N (16, 32 or 64 rows): a stage is 16 KiB of B and
//! 2–8 KiB of A, and 9–12 stages fit, so each SM keeps 144–192 KiB of B in flight.
//!
//! - Load (one producer thread, per K block of 128): B's 128 rows, A's `rows` rows and their
//!   1×128 scales (the same tensor maps as the unswapped kernels, A's with a box of `rows`).
//! - Compute (consumer warpgroup `c`: rows `64c..64c + 64` of the B tile): per K block four
//!   `wgmma m64nNk32` into a scratch fragment, then the promotion into fp32 sums with
//!   `scale_b · scale_a[column]` (A's scales run along the fragment's columns). Two K blocks are
//!   issued before the first is promoted, so the tensor cores work under each promotion.
//! - Store: the sums transposed, directly (f32, 16-bit, or split-K partials).

use core::marker::PhantomData;

use super::fp8::{mma_block, prefetch_maps};
use super::{BLOCK_K, BLOCK_N, SFA_BOX, Sm90Fp8Params, Tile, WG_ROWS};
use crate::gemm::driver::{Ctx, GemmKernel};
use crate::gemm::epilogue::{self, Output};
use crate::gemm::layout::StageLayout;
use crate::gemm::pipeline::PipelineState;
use crate::gemm::promote::promote_columns;
use crate::gemm::scheduler::{ClusterShape, Schedule, WorkUnit};
use crate::gemm::splitk;
use crate::ptx::wgmma::{self, Fp8Fragment, Fp8Pair};
use crate::ptx::{smem, tma};

/// The kernel for tiles of `F::N` rows of A; `T` is the `wgmma` pair (B's type, then A's).
pub(crate) struct Fp8SwappedGemm<F, T> {
    pub(crate) p: Sm90Fp8Params,
    pub(crate) types: PhantomData<(F, T)>,
}

/// One consumer thread's constants.
pub(crate) struct Consumer {
    c: u32,
    /// Thread of the warpgroup.
    local: u32,
    lane: u32,
    /// This thread's first row of the B tile (the second is 8 below): C's column.
    row: u32,
}

impl<F: Fp8Fragment, T: Fp8Pair> Fp8SwappedGemm<F, T> {
    const TILE: Tile = Tile::swapped(F::N);
}

impl<F: Fp8Fragment, T: Fp8Pair> GemmKernel for Fp8SwappedGemm<F, T> {
    const CONSUMERS: u32 = 2;
    type Consumer = Consumer;
    type Acc = F;

    #[inline(always)]
    fn layout(&self) -> StageLayout {
        Self::TILE.layout()
    }

    #[inline(always)]
    fn cluster(&self) -> ClusterShape {
        ClusterShape::ONE
    }

    /// Units are (B tile, A tile): the schedule's "M" is C's N, so that CTAs running together
    /// stream different B tiles.
    #[inline(always)]
    fn schedule(&self) -> Schedule {
        let (p, cl) = (&self.p, self.cluster());
        // (Cᵀ's axes: the schedule's M is C's N, read first.)
        let (n, m, l, k) = (p.n, p.m, p.l, p.k);
        Self::TILE.schedule((m, n, k, l), cl, (p.split_k, p.group_m), None, None)
    }

    #[inline(always)]
    fn prologue(&self) {
        // SAFETY: the maps are tensor maps (the entry's contract).
        unsafe { prefetch_maps(&self.p) }
    }

    #[inline(always)]
    unsafe fn load(&self, ctx: &Ctx, own: &WorkUnit, kb: u32, s: u32, full: u32) {
        let (p, layout) = (&self.p, &ctx.layout);
        let x = (kb * BLOCK_K) as i32;
        let (b_row, a_row) = (own.m * BLOCK_N, own.n * F::N);
        // The tile's A rows start 16-byte aligned in the scales (a multiple of 16 rows).
        let (sfa_y, _) = SFA_BOX.start(a_row);
        // SAFETY: the driver's contract (the stage is free); the boxes (128 and `F::N` rows of
        // 128 bytes, one scale box) fit the stage's buffers; TMA zero-fills rows past M or N.
        unsafe {
            tma::load_3d(layout.b(s), p.tmap_b, x, b_row as i32, own.l as i32, full);
            tma::load_3d(layout.a(s), p.tmap_a, x, a_row as i32, own.a_l as i32, full);
            let (y, l) = (sfa_y as i32, own.a_l as i32);
            tma::load_3d(layout.sfa(s), p.tmap_sfa, y, kb as i32, l, full);
        }
    }

    #[inline(always)]
    fn consumer(&self, _ctx: &Ctx, c: u32, local: u32) -> Consumer {
        Consumer {
            c,
            local,
            lane: local % 32,
            row: c * WG_ROWS + wgmma::fragment_row(local),
        }
    }

    #[inline(always)]
    unsafe fn mainloop(
        &self,
        ctx: &Ctx,
        cons: &Consumer,
        own: &WorkUnit,
        st: &mut PipelineState,
    ) -> F {
        let p = &self.p;
        let (n_blocks, k_blocks) = (p.n.div_ceil(BLOCK_N), p.k / BLOCK_K);
        // The B tile is one 128-row scale block: one B scale per K block.
        let sfb =
            (p.sfb as *const f32).wrapping_add(((own.l * n_blocks + own.m) * k_blocks) as usize);
        let mut acc = F::zeros();
        let mut kb = own.k_begin;
        // Two K blocks are issued before the first is promoted, so the tensor cores work under
        // that promotion. (Rolling — each block issued before the previous one is promoted,
        // unrolled by two — measured 5–20% slower.)
        // SAFETY (each block): `st` counts this warpgroup's uses in order; a stage is read after
        // its `consumer_wait` (in `issue`) and released after its MMAs completed and its scales
        // were read; `kb` (and `kb + 1` for a pair) < k_end ≤ k_blocks, inside `sfb`'s row.
        while kb + 1 < own.k_end {
            unsafe {
                let (st0, st1) = (*st, st.next());
                let (sb0, sb1) = (*sfb.add(kb as usize), *sfb.add(kb as usize + 1));
                let mut part0 = self.issue(ctx, cons, st0);
                let mut part1 = self.issue(ctx, cons, st1);
                wgmma::wait::<1>();
                part0.fence();
                self.promote(ctx, cons, st0, &mut acc, &part0, sb0);
                wgmma::wait::<0>();
                part1.fence();
                self.promote(ctx, cons, st1, &mut acc, &part1, sb1);
            }
            (kb, *st) = (kb + 2, st.next().next());
        }
        if kb < own.k_end {
            unsafe {
                let sb = *sfb.add(kb as usize);
                let mut part = self.issue(ctx, cons, *st);
                wgmma::wait::<0>();
                part.fence();
                self.promote(ctx, cons, *st, &mut acc, &part, sb);
            }
            *st = st.next();
        }
        acc
    }

    #[inline(always)]
    fn epilogue(&self, _ctx: &Ctx, cons: &Consumer, own: &WorkUnit, mut acc: F) {
        let p = &self.p;
        let n0 = own.m * BLOCK_N + cons.row;
        if p.sfb_col != 0 {
            // B scaled per row (C's columns): the thread's two rows, clamped to n − 1 (past N
            // nothing is stored).
            let cols = (p.sfb_col as *const f32).wrapping_add((own.l * p.n) as usize);
            // SAFETY: `sfb_col` holds `l · n` scales and both indices are < n.
            let (s0, s1) = unsafe {
                (
                    *cols.add(n0.min(p.n - 1) as usize),
                    *cols.add((n0 + 8).min(p.n - 1) as usize),
                )
            };
            for (i, v) in acc.as_mut().iter_mut().enumerate() {
                *v *= if (i / 2) % 2 == 0 { s0 } else { s1 };
            }
        }
        let (who, acc) = ((cons.c, 2, cons.local), core::array::from_mut(&mut acc));
        // SAFETY: the host sizes `splitk` for this schedule (the entry's contract); the tile is
        // two fragments of 64 rows.
        let meet = unsafe {
            splitk::meet(
                &p.splitk,
                &self.schedule(),
                ClusterShape::ONE,
                own,
                who,
                acc,
            )
        };
        let Some(out_l) = meet else { return };
        let out = Output::direct(p.out, (p.m, p.n), p.out_type, own.row_end);
        let m0 = own.n * F::N + 2 * (cons.lane % 4);
        epilogue::store_transposed(&out, out_l, n0, m0, &acc[0]);
    }

    #[inline(always)]
    fn finish(&self, _cons: &Consumer, _st: PipelineState) {}
}

impl<F: Fp8Fragment, T: Fp8Pair> Fp8SwappedGemm<F, T> {
    /// Waits for use `st` and issues consumer `c`'s four `wgmma m64nNk32` of it (its 64 rows of
    /// the B tile × the A tile) into a fresh scratch fragment, committed as one group.
    /// # Safety
    /// `st` is this warpgroup's next use not yet waited for.
    #[inline(always)]
    unsafe fn issue(&self, ctx: &Ctx, cons: &Consumer, st: PipelineState) -> F {
        let (layout, s) = (&ctx.layout, ctx.pipe.stage(st));
        // SAFETY: the caller's contract; the stage is filled after the wait. The B tile is
        // `wgmma`'s A: this consumer's 64 of its rows.
        unsafe {
            ctx.pipe.consumer_wait(st);
            mma_block::<F, T>(layout.b(s), cons.c * WG_ROWS, layout.a(s))
        }
    }

    /// `acc += part · scale_b · scale_a[column]` with use `st`'s A scales, then releases the
    /// stage. A tile's first row is aligned, so column `j` is entry `j` of the scale box.
    /// # Safety
    /// Use `st`'s MMAs (which read `part`) completed; the stage is held.
    #[inline(always)]
    unsafe fn promote(
        &self,
        ctx: &Ctx,
        cons: &Consumer,
        st: PipelineState,
        acc: &mut F,
        part: &F,
        scale_b: f32,
    ) {
        let sfa = ctx.layout.sfa(ctx.pipe.stage(st));
        promote_columns(acc, part, cons.lane, |col| {
            // SAFETY: the caller's contract; col < F::N ≤ the box's rows.
            scale_b * f32::from_bits(unsafe { smem::load_u32(sfa + 4 * col) })
        });
        // SAFETY: the caller's contract: this thread has read the stage.
        unsafe { ctx.pipe.consumer_release(st, ctx.rank) };
    }
}
