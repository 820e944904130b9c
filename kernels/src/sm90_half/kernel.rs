//! Hopper 16-bit GEMM (bf16 or fp16 A and B, f32 accumulation), C = alpha · A·Bᵀ, dense or with
//! B the stored blocks of a block-sparse operand, run by the warp-specialized driver
//! ([`crate::gemm::driver`]).
//!
//! - Load (one producer thread, per stage of 64 K): the A tile in boxes of 128 rows and the B
//!   tile (`block_n` rows; in a pair along M each CTA loads half of it and multicasts it). Block-sparse: the unit's K stages are positions in its segment; a
//!   position's stored block (`position >> sub_log2`) gives the B box (its rows from the tile's
//!   first row in the block, its K part from the low bits) and, through its column index, the
//!   K of the A box.
//! - Compute (each consumer warpgroup on its own: 64 rows of each wave): per stage, four
//!   `wgmma m64nNk16` per wave straight into the unit's sums, committed as one group; the
//!   previous stage is released as soon as its group completes, so one stage's MMAs are always
//!   in flight while the next stage is waited for.
//! - Store: the sums times `alpha`; 16-bit output through shared boxes and TMA stores, f32
//!   output and split-K partials directly; with A the sparse operand the tile is Cᵀ, stored
//!   transposed.

use core::marker::PhantomData;

use super::{BLOCK_K, CONSUMERS, HalfTile, HalfType, ROW_BYTES, Sm90HalfParams, WG_ROWS};
use crate::entry::Named;
use crate::gemm::Mode;
use crate::gemm::driver::{Ctx, GemmKernel};
use crate::gemm::epilogue::fuse;
use crate::gemm::epilogue::{self, Output, Staging, TileStore};
use crate::gemm::layout::StageLayout;
use crate::gemm::pipeline::PipelineState;
use crate::gemm::scheduler::{ClusterShape, MAX_CLUSTER, Schedule, WorkUnit};
use crate::plant;
use crate::ptx::wgmma::{self, Descriptor, Fp16, Fp16Fragment, Fragment, Swizzle};
use crate::ptx::{global, thread, tma};

/// K per `wgmma` (16-bit): 16 values = 32 bytes of a swizzled row.
const MMA_K: u32 = 16;
/// Rows of one TMA box of A (a box may have at most 256 rows; 128 keeps one map for both
/// heights).
const A_BOX_ROWS: u32 = 128;

/// The `wgmma` input type named by its [`HalfType`] value `T` (`as u32`), for the kernel table
/// ([`crate::entry::Named`]).
pub(crate) struct Fp16Of<const T: u32>;

impl Named for Fp16Of<{ HalfType::Bf16 as u32 }> {
    type T = wgmma::Bf16;
}

impl Named for Fp16Of<{ HalfType::F16 as u32 }> {
    type T = wgmma::F16;
}

/// The kernel for a tile of `WAVES` waves × `F::N` columns, input type `T`, running `MODE`
/// ([`Mode`] as u32): dense or block-sparse (`Sm90HalfParams::sparse`).
pub(crate) struct HalfGemm<const WAVES: usize, F, T, const MODE: u32> {
    pub(crate) p: Sm90HalfParams,
    /// The fused epilogue (read by [`Mode::Fused`] kernels only).
    pub(crate) epi: crate::params::EpilogueParams,
    pub(crate) types: PhantomData<(F, T)>,
}

/// One consumer warpgroup's constants.
pub(crate) struct Consumer {
    /// Consumer index (which 64 rows of each wave).
    c: u32,
    /// Thread index in the warpgroup.
    local: u32,
}

impl<const WAVES: usize, F: Fp16Fragment, T: Fp16, const MODE: u32> HalfGemm<WAVES, F, T, MODE> {
    const TILE: HalfTile = HalfTile {
        waves: WAVES as u32,
        block_n: F::N,
    };
    const SPARSE: bool = MODE == Mode::Sparse as u32;
    /// Whether the tile ends in the fused epilogue (`HalfGemm::epi`).
    const FUSED: bool = MODE == Mode::Fused as u32;

    /// Where unit `own`'s tile goes: the output, the fused epilogue and its hand-over (fused
    /// kernels), the staging in shared memory (boxes for TMA stores, or the fused kernels' f32
    /// rows).
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
            epi: TileStore::fused_epi((Self::FUSED, true, false), &self.epi, &ctx.layout),
            staging: Staging {
                base: ctx.layout.out(),
                consumers: CONSUMERS,
                block_n: F::N,
                ring: tile.out_ring(),
            },
            // A sparse A: the tile is Cᵀ.
            transposed: Self::SPARSE && p.sparse.transposed != 0,
            block_m: tile.block_m(),
            wave_m: tile.wave_m(),
        }
    }
}

impl<const WAVES: usize, F: Fp16Fragment, T: Fp16, const MODE: u32> GemmKernel
    for HalfGemm<WAVES, F, T, MODE>
{
    const CONSUMERS: u32 = CONSUMERS;
    /// The fused kernels' epilogue runs in three finishing warps (`gemm::epilogue::fuse`).
    const FINISHERS: u32 = if MODE == Mode::Fused as u32 {
        crate::gemm::FINISHERS
    } else {
        0
    };
    type Consumer = Consumer;
    type Acc = [F; WAVES];

    #[inline(always)]
    fn layout(&self) -> StageLayout {
        if Self::FUSED {
            Self::TILE.fused_layout()
        } else {
            Self::TILE.layout()
        }
    }

    #[inline(always)]
    fn cluster(&self) -> ClusterShape {
        // (The host passes 1 or MAX_CLUSTER; the clamp shows the compiler that no division by
        // the cluster's size can be by zero.)
        ClusterShape {
            m: self.p.cluster_m.clamp(1, MAX_CLUSTER),
            n: 1,
        }
    }

    #[inline(always)]
    fn schedule(&self) -> Schedule {
        let p = &self.p;
        // (The parameters are read in the order of `Schedule`'s fields; any order is correct.)
        let (m, n, l, k, split_k) = (p.m, p.n, p.l, p.k, p.split_k);
        let cluster_m = self.cluster().m;
        let group_m = p.group_m;
        let sparse = if Self::SPARSE {
            Some(p.sparse.sparse())
        } else {
            None
        };
        Self::TILE.schedule((m, n, k, l), cluster_m, (split_k, group_m), sparse)
    }

    #[inline(always)]
    fn prologue(&self) {
        // SAFETY: the maps are tensor maps (the entry's contract).
        unsafe {
            tma::prefetch_map(self.p.tmap_a);
            tma::prefetch_map(self.p.tmap_b);
        }
    }

    #[inline(always)]
    unsafe fn load(&self, ctx: &Ctx, own: &WorkUnit, kb: u32, s: u32, full: u32) {
        let (p, tile, layout) = (&self.p, Self::TILE, &ctx.layout);
        let row0 = own.first_row(own.m, tile.block_m());
        let b_row = own.n * F::N;
        // Sparse: `kb` is a stage of a stored block; its K stage in A follows from the block's
        // column.
        let (k_stage, b) = if Self::SPARSE {
            let sub = p.sparse.sub_log2;
            let (block, part) = (kb >> sub, kb & ((1 << sub) - 1));
            // SAFETY: `cols` holds a column in range for every stored block (the entry's
            // contract), and the unit's positions are stages of stored blocks.
            let col = unsafe { global::load_u32_nc(p.sparse.cols + 4 * block as u64) };
            // Tile `n`'s rows start at `b_row` modulo the block's rows (square blocks: as many
            // as its K, 64 per stage).
            let bs_rows = BLOCK_K << sub;
            (
                (col << sub) | part,
                (
                    (part * BLOCK_K) as i32,
                    (b_row % bs_rows) as i32,
                    block as i32,
                ),
            )
        } else {
            (kb, ((kb * BLOCK_K) as i32, b_row as i32, own.l as i32))
        };
        let x = (k_stage * BLOCK_K) as i32;
        // A pair along M shares the B tile: each CTA loads its half into both.
        let cl = self.cluster();
        let (b_rows, share) = (F::N / cl.m, if cl.m > 1 { ctx.rank } else { 0 });
        let (b_dst, b_y) = (
            layout.b(s) + share * b_rows * ROW_BYTES,
            b.1 + (share * b_rows) as i32,
        );
        // SAFETY: the driver's contract (the stage is free in every CTA of the cluster); the
        // boxes fit the stage's buffers; the maps cover the operands (TMA zero-fills rows past M
        // or N and values past K).
        unsafe {
            for w in 0..tile.block_m() / A_BOX_ROWS {
                let dst = layout.a(s) + w * A_BOX_ROWS * ROW_BYTES;
                let y = (row0 + w * A_BOX_ROWS) as i32;
                tma::load_3d(dst, p.tmap_a, x, y, own.a_l as i32, full);
            }
            if cl.m > 1 {
                let all = ((1u32 << cl.size()) - 1) as u16;
                tma::load_3d_multicast(b_dst, p.tmap_b, b.0, b_y, b.2, full, all);
            } else {
                tma::load_3d(b_dst, p.tmap_b, b.0, b_y, b.2, full);
            }
        }
    }

    #[inline(always)]
    fn consumer(&self, _ctx: &Ctx, c: u32, local: u32) -> Consumer {
        Consumer { c, local }
    }

    #[inline(always)]
    unsafe fn mainloop(
        &self,
        ctx: &Ctx,
        cons: &Consumer,
        own: &WorkUnit,
        st: &mut PipelineState,
    ) -> [F; WAVES] {
        let (pipe, layout) = (&ctx.pipe, &ctx.layout);
        let mut acc = [F::zeros(); WAVES];
        // The use whose MMAs are in flight, released once they complete.
        let mut held: Option<PipelineState> = None;
        for _ in own.k_blocks() {
            let s = pipe.stage(*st);
            // SAFETY: `st` counts this warpgroup's uses in order; the stage is read after
            // `consumer_wait` and released after the MMAs that read it completed (`wait::<1>`
            // leaves only this stage's group in flight).
            unsafe {
                pipe.consumer_wait(*st);
                Self::issue(layout, cons.c, s, &mut acc);
                wgmma::wait::<1>();
                if let Some(h) = held {
                    pipe.consumer_release(h, ctx.rank);
                }
            }
            held = Some(*st);
            st.advance();
        }
        wgmma::wait::<0>();
        for a in acc.iter_mut() {
            a.fence();
        }
        if let Some(h) = held {
            // SAFETY: its MMAs completed (the wait above).
            unsafe { pipe.consumer_release(h, ctx.rank) };
        }
        acc
    }

    #[inline(always)]
    fn epilogue(&self, ctx: &Ctx, cons: &Consumer, own: &WorkUnit, mut acc: [F; WAVES]) {
        let p = &self.p;
        if p.alpha * plant::HALF != 1.0 {
            for a in acc.iter_mut() {
                epilogue::scale(a, p.alpha * plant::HALF);
            }
        }
        let dst = self.tile_store(ctx, own);
        let who = (cons.c, CONSUMERS, cons.local);
        // SAFETY: the host sizes `splitk` for this schedule (the entry's contract); the tile is
        // CONSUMERS · WAVES fragments of 64 rows; `tmap_c`, when set, maps the 16-bit output; the
        // staging boxes are this warpgroup's.
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
    fn finish(&self, cons: &Consumer, _st: PipelineState) {
        if self.p.tmap_c != 0 {
            epilogue::drain(cons.local);
        }
    }
}

impl<const WAVES: usize, F: Fp16Fragment, T: Fp16, const MODE: u32> HalfGemm<WAVES, F, T, MODE> {
    /// Consumer `c`'s MMAs of stage `s`: per wave, four `wgmma m64nNk16` of its 64 rows into the
    /// wave's sums, all committed as one group.
    /// # Safety
    /// Stage `s` is filled (its full barrier waited for).
    #[inline(always)]
    unsafe fn issue(layout: &StageLayout, c: u32, s: u32, acc: &mut [F; WAVES]) {
        // The tiles' addresses as warp-uniform values: the descriptors are then computed in
        // uniform registers, which `wgmma` reads them from.
        let (a, b) = (
            thread::warp_uniform(layout.a(s) + c * WG_ROWS * ROW_BYTES),
            thread::warp_uniform(layout.b(s)),
        );
        wgmma::fence();
        for (w, acc) in acc.iter_mut().enumerate() {
            let a = a + w as u32 * Self::TILE.wave_m() * ROW_BYTES;
            for kk in 0..BLOCK_K / MMA_K {
                // SAFETY: the caller's contract; both tiles hold these rows.
                unsafe { acc.mma16::<T>(swizzled(a, kk), swizzled(b, kk), true) };
            }
        }
        wgmma::commit();
    }
}

/// The `wgmma` descriptor of a K-major, 128-byte-swizzled tile whose first row is at `rows` (as
/// TMA wrote it; a multiple of 8 rows into its tile), at K step `kk` (16 values, 32 bytes each).
#[inline(always)]
fn swizzled(rows: u32, kk: u32) -> Descriptor {
    Descriptor::new(rows, 16, 8 * ROW_BYTES, Swizzle::B128).advance(kk * MMA_K * 2)
}
