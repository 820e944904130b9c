//! The Hopper MX / NVFP4 GEMM, run by the warp-specialized driver ([`crate::gemm::driver`]).
//!
//! - Load (one producer thread, per stage of 64 K): the raw A tile (128 rows) and B tile
//!   (`F::N` rows) by TMA, and their scale bytes by bulk copy.
//! - Compute (both consumer warpgroups together): convert the stage into bf16 buffer `use % 2`
//!   (each thread a fixed set of 16-code units, [`dequant::unit`]), release the stage, wait for
//!   its own MMAs of the previous stage, meet the other warpgroup (then every conversion of this
//!   stage is written and every MMA that read the other buffer has completed), and issue four
//!   `wgmma m64nNk16` on its 64 rows. The MMAs run while the next stage is converted.
//! - Store: the sums times `alpha`, directly (f32, 16-bit, or split-K partials).

use core::marker::PhantomData;

use super::dequant::{self, Dequant, ScaleDecode};
use super::{BF16_ROW_BYTES, BLOCK_K, BLOCK_M, CONSUMERS, MMA_K, MxTile, Sm90MxParams, UNIT};
use crate::gemm::barriers;
use crate::gemm::driver::{Ctx, GemmKernel};
use crate::gemm::epilogue::fuse;
use crate::gemm::epilogue::{self, Output, Staging, TileStore};
use crate::gemm::layout::{FRAGMENT_ROWS, ScaleBox, StageLayout};
use crate::gemm::pipeline::PipelineState;
use crate::gemm::scheduler::{ClusterShape, Schedule, WorkUnit};
use crate::plant;
use crate::ptx::wgmma::{self, Bf16, Descriptor, Fp16Fragment, Fragment, Swizzle};
use crate::ptx::{smem, tma};

/// Units per row of a stage.
const UNITS_PER_ROW: u32 = BLOCK_K / UNIT;
/// Consumer threads, which share the conversion.
const THREADS: u32 = 128 * CONSUMERS;
/// Most units one consumer thread converts per stage (128 + 256 rows × 4 units / 256 threads).
const MAX_ROUNDS: usize = 6;

/// The kernel for `F::N` columns, element types `EA`, `EB` (of one width) and scales `S`; with
/// `FUSED`, each tile ends in the fused epilogue (`MxGemm::epi`) instead of the plain
/// stores (a kernel of its own: the plain kernels carry none of its code).
pub(crate) struct MxGemm<F, EA, EB, S, const FUSED: bool> {
    pub(crate) p: Sm90MxParams,
    /// The fused epilogue (read by the `FUSED` kernels only).
    pub(crate) epi: crate::params::EpilogueParams,
    pub(crate) types: PhantomData<(F, EA, EB, S)>,
}

/// One consumer thread's constants.
pub(crate) struct Consumer {
    /// Consumer warpgroup (which 64 rows).
    c: u32,
    /// Thread index in the warpgroup.
    local: u32,
}

impl<F: Fp16Fragment, EA: Dequant, EB: Dequant, S: ScaleDecode, const FUSED: bool>
    MxGemm<F, EA, EB, S, FUSED>
{
    const TILE: MxTile = MxTile { block_n: F::N };
    /// Where unit `own`'s tile goes: no TMA-store staging (its shared memory holds the bf16
    /// buffers), so direct stores, and the fused epilogue's rows in the global scratch (its
    /// hand-over in shared memory).
    #[inline(always)]
    fn tile_store(&self, ctx: &Ctx, own: &WorkUnit) -> TileStore<'_> {
        let p = &self.p;
        TileStore {
            out: Output::direct(p.out, (p.m, p.n), p.out_type, own.row_end),
            epi: TileStore::fused_epi((FUSED, true, false), &self.epi, &ctx.layout),
            staging: Staging {
                base: 0,
                consumers: CONSUMERS,
                block_n: F::N,
                ring: false,
            },
            transposed: false,
            block_m: BLOCK_M,
            wave_m: BLOCK_M,
        }
    }
    /// Bytes of one raw row of a stage.
    const RAW_ROW: u32 = BLOCK_K * EA::BITS / 8;
    /// Scale bytes per row of a stage.
    const SCALES_PER_ROW: u32 = BLOCK_K / S::BLOCK;
    /// The TMA box of A's scales (from any first row).
    const SFA_BOX: ScaleBox = super::sfa_box(S::BLOCK);
    /// Rounds of the conversion: each converts 256 units = 64 rows.
    const ROUNDS: u32 = (BLOCK_M + F::N) * UNITS_PER_ROW / THREADS;
    const A_ROUNDS: u32 = BLOCK_M * UNITS_PER_ROW / THREADS;
    const _SAME_WIDTH: () = assert!(EA::BITS == EB::BITS && Self::ROUNDS as usize <= MAX_ROUNDS);

    /// Consumer thread `g` (of 256) converts its units of stage `s` into converted buffer `buf`:
    /// first every unit's loads (a unit's store could alias a later unit's load for all the
    /// compiler knows, so loads interleaved with stores would wait out each other's latency),
    /// then each unit's conversion and stores.
    /// # Safety
    /// Stage `s` is filled; nobody reads buffer `buf` until the consumers meet again.
    #[inline(always)]
    unsafe fn convert(layout: &StageLayout, s: u32, buf: u32, g: u32, shift: u32) {
        let conv = layout.out() + buf * Self::TILE.converted_bytes();
        let mut words = [[0u32; 4]; MAX_ROUNDS];
        let mut scales = [0u32; MAX_ROUNDS];
        for round in 0..Self::ROUNDS as usize {
            // SAFETY: the caller's contract.
            (words[round], scales[round]) = unsafe { Self::load_unit(layout, s, g, round, shift) };
        }
        let mut specials = 0;
        for round in 0..Self::ROUNDS as usize {
            specials |= if round < Self::A_ROUNDS as usize {
                EA::specials(words[round])
            } else {
                EB::specials(words[round])
            };
            // SAFETY: the caller's contract.
            unsafe { Self::store_unit(conv, g, round, words[round], scales[round], false) };
        }
        // NaN or Inf codes among this thread's units (rare): convert them all again, exactly,
        // from the stage (still held: keeping the codes in registers would spill).
        if specials != 0 {
            for round in 0..Self::ROUNDS as usize {
                // SAFETY: the caller's contract.
                unsafe {
                    let (w, sc) = Self::load_unit(layout, s, g, round, shift);
                    Self::store_unit(conv, g, round, w, sc, true);
                }
            }
        }
    }

    /// The codes (16, in 4 or 2 words) and the scale byte of unit `g + 256 · round` of stage `s`.
    /// # Safety
    /// Stage `s` is filled and held.
    #[inline(always)]
    unsafe fn load_unit(
        layout: &StageLayout,
        s: u32,
        g: u32,
        round: usize,
        shift: u32,
    ) -> ([u32; 4], u32) {
        let (r, q, is_a) = Self::unit_of(g, round as u32);
        // A's row r is entry `shift + r` of its scale box; B's scales follow the box.
        let (raw, sf) = if is_a {
            (layout.a(s), layout.sfa(s) + shift * Self::SCALES_PER_ROW)
        } else {
            (layout.b(s), layout.sfa(s) + Self::SFA_BOX.bytes())
        };
        let src = raw + r * Self::RAW_ROW + q * UNIT * EA::BITS / 8;
        // SAFETY: the caller's contract; `src` (16- or 8-byte aligned) and the scale byte are
        // inside the stage's tiles and scales.
        unsafe {
            let words = if EA::BITS == 8 {
                smem::load_u32x4(src)
            } else {
                let [x, y] = smem::load_u32x2(src);
                [x, y, 0, 0]
            };
            (
                words,
                smem::load_u8(sf + r * Self::SCALES_PER_ROW + q * UNIT / S::BLOCK),
            )
        }
    }

    /// Converts unit `g + 256 · round` from its codes and scale byte and stores it into the
    /// converted buffer at `conv`.
    /// # Safety
    /// As [`Self::convert`].
    #[inline(always)]
    unsafe fn store_unit(
        conv: u32,
        g: u32,
        round: usize,
        words: [u32; 4],
        scale: u32,
        specials: bool,
    ) {
        let (r, q, is_a) = Self::unit_of(g, round as u32);
        let scale = S::x2(scale);
        let out = if is_a {
            dequant::unit::<EA>(words, scale, specials)
        } else {
            dequant::unit::<EB>(words, scale, specials)
        };
        let dst = if is_a {
            conv
        } else {
            conv + BLOCK_M * BF16_ROW_BYTES
        };
        // SAFETY: the caller's contract; the unit's row is inside the buffer's tile.
        unsafe { store_unit_swizzled(dst + r * BF16_ROW_BYTES, r, q, out) };
    }

    /// Unit `g + 256 · round` of a stage: its row in its tile, its quarter of the row, and
    /// whether it is of A (the first 128 rows) or of B.
    #[inline(always)]
    fn unit_of(g: u32, round: u32) -> (u32, u32, bool) {
        let u = g + THREADS * round;
        let (row, q) = (u / UNITS_PER_ROW, u % UNITS_PER_ROW);
        let is_a = round < Self::A_ROUNDS;
        (if is_a { row } else { row - BLOCK_M }, q, is_a)
    }
}

/// Stores a converted unit (16 bf16 values of row `r`, quarter `q` of the row's 64 K) into its
/// row at `row_addr` of a 128-byte-swizzled bf16 tile: the unit's 32 bytes are chunks 2q and
/// 2q + 1 of the row, at chunk `j ^ (r % 8)` (the swizzle `wgmma` reads).
/// # Safety
/// The row's 128 bytes are shared memory this thread may write.
#[inline(always)]
pub(crate) unsafe fn store_unit_swizzled(row_addr: u32, r: u32, q: u32, out: [u32; 8]) {
    let sw = r % 8;
    // SAFETY: the caller's contract; both chunks are inside the row.
    unsafe {
        smem::store_u32x4(
            row_addr + 16 * ((2 * q) ^ sw),
            [out[0], out[1], out[2], out[3]],
        );
        smem::store_u32x4(
            row_addr + 16 * ((2 * q + 1) ^ sw),
            [out[4], out[5], out[6], out[7]],
        );
    }
}

/// Descriptor of rows `row..` of a 128-byte-swizzled, K-major bf16 tile at `tile` (rows of 64
/// values), K step `kk` of 16.
#[inline(always)]
pub(crate) fn bf16_desc(tile: u32, row: u32, kk: u32) -> Descriptor {
    Descriptor::new(
        tile + row * BF16_ROW_BYTES,
        16,
        8 * BF16_ROW_BYTES,
        Swizzle::B128,
    )
    .advance(kk * MMA_K * 2)
}

impl<F: Fp16Fragment, EA: Dequant, EB: Dequant, S: ScaleDecode, const FUSED: bool> GemmKernel
    for MxGemm<F, EA, EB, S, FUSED>
{
    const CONSUMERS: u32 = CONSUMERS;
    /// The fused kernels' epilogue runs in three finishing warps (`gemm::epilogue::fuse`).
    const FINISHERS: u32 = if FUSED { crate::gemm::FINISHERS } else { 0 };
    type Consumer = Consumer;
    type Acc = F;

    #[inline(always)]
    fn layout(&self) -> StageLayout {
        Self::TILE.layout(EA::BITS, S::BLOCK, FUSED)
    }

    #[inline(always)]
    fn cluster(&self) -> ClusterShape {
        ClusterShape { m: 1, n: 1 }
    }

    #[inline(always)]
    fn schedule(&self) -> Schedule {
        let p = &self.p;
        let (m, n, l, k) = (p.m, p.n, p.l, p.k);
        let tile = MxTile { block_n: F::N };
        tile.schedule((m, n, k, l), (p.split_k, p.group_m), p.groups)
    }

    #[inline(always)]
    fn prologue(&self) {
        // SAFETY: the maps are tensor maps (the entry's contract).
        unsafe {
            tma::prefetch_map(self.p.tmap_a);
            tma::prefetch_map(self.p.tmap_b);
            tma::prefetch_map(self.p.tmap_sfa);
        }
    }

    #[inline(always)]
    unsafe fn load(&self, ctx: &Ctx, own: &WorkUnit, kb: u32, s: u32, full: u32) {
        let (p, layout) = (&self.p, &ctx.layout);
        let x = (kb * Self::RAW_ROW) as i32;
        let (a_l, l) = (own.a_l as i32, own.l as i32);
        let k_blocks = p.k.div_ceil(BLOCK_K) as u64;
        let spr = Self::SCALES_PER_ROW;
        let (m0, n0) = (own.first_row(own.m, BLOCK_M), own.n * F::N);
        let stage_b = own.l as u64 * k_blocks + kb as u64;
        let sfb = p.sfb + (stage_b * p.rows_pad_b as u64 + n0 as u64) * spr as u64;
        // SAFETY: the driver's contract (the stage is free); the maps cover the operands and A's
        // scales (TMA zero-fills rows past M or N and bytes past K); B's scale buffer is padded
        // to whole tiles of rows and stages of K.
        unsafe {
            tma::load_3d(layout.a(s), p.tmap_a, x, m0 as i32, a_l, full);
            tma::load_3d(layout.b(s), p.tmap_b, x, n0 as i32, l, full);
            let (y, _) = Self::SFA_BOX.start(m0);
            tma::load_3d(layout.sfa(s), p.tmap_sfa, y as i32, kb as i32, a_l, full);
            tma::load_bytes(layout.sfa(s) + Self::SFA_BOX.bytes(), sfb, F::N * spr, full);
        }
    }

    #[inline(always)]
    fn consumer(&self, _ctx: &Ctx, c: u32, local: u32) -> Consumer {
        let () = Self::_SAME_WIDTH;
        Consumer { c, local }
    }

    #[inline(always)]
    unsafe fn mainloop(
        &self,
        ctx: &Ctx,
        cons: &Consumer,
        own: &WorkUnit,
        st: &mut PipelineState,
    ) -> F {
        let (pipe, layout) = (&ctx.pipe, &ctx.layout);
        let g = cons.c * 128 + cons.local;
        let (_, shift) = Self::SFA_BOX.start(own.first_row(own.m, BLOCK_M));
        let mut acc = F::zeros();
        for kb in own.k_blocks() {
            let (s, buf) = (pipe.stage(*st), st.parity());
            // SAFETY: `st` counts this warpgroup's uses in order (both consumers make the same
            // uses); the stage is read after `consumer_wait` and released after the last read;
            // buffer `buf` was last read by the MMAs of use `st − 2`, which every consumer waited
            // for before the meeting of use `st − 1`.
            unsafe {
                pipe.consumer_wait(*st);
                Self::convert(layout, s, buf, g, shift);
                pipe.consumer_release(*st, ctx.rank);
                smem::fence_async_proxy();
                wgmma::wait::<0>();
                acc.fence();
                barriers::sync_consumers();
                let conv = layout.out() + buf * Self::TILE.converted_bytes();
                let b = conv + BLOCK_M * BF16_ROW_BYTES;
                wgmma::fence();
                for kk in 0..BLOCK_K / MMA_K {
                    acc.mma16::<Bf16>(
                        bf16_desc(conv, cons.c * FRAGMENT_ROWS, kk),
                        bf16_desc(b, 0, kk),
                        kb != own.k_begin || kk > 0,
                    );
                }
                wgmma::commit();
            }
            st.advance();
        }
        wgmma::wait::<0>();
        acc.fence();
        acc
    }

    #[inline(always)]
    fn epilogue(&self, ctx: &Ctx, cons: &Consumer, own: &WorkUnit, mut acc: F) {
        let p = &self.p;
        if p.alpha * plant::MX != 1.0 {
            epilogue::scale(&mut acc, p.alpha * plant::MX);
        }
        let dst = self.tile_store(ctx, own);
        let (who, acc) = (
            (cons.c, CONSUMERS, cons.local),
            core::array::from_mut(&mut acc),
        );
        // SAFETY: the host sizes `splitk` for this schedule (the entry's contract); the tile is
        // CONSUMERS fragments of 64 rows; `out.tmap` is 0, so nothing is staged.
        unsafe {
            epilogue::finish_unit(
                &p.splitk,
                &self.schedule(),
                self.cluster(),
                own,
                who,
                acc,
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
    fn finish(&self, _cons: &Consumer, _st: PipelineState) {}
}
