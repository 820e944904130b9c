//! The Hopper 4-bit-weights GEMM, run by the warp-specialized driver ([`crate::gemm::driver`]);
//! it computes Cᵀ = B·Aᵀ (module doc of [`super`]).
//!
//! - Load (one producer thread, per stage of 64 K): the reordered weight tile (128 rows) and the
//!   activation tile by TMA, and the scales by bulk copy.
//! - Compute (each consumer warpgroup its 64 weight rows): dequantize this thread's fragment from
//!   the stage into registers; if the activations need converting, convert this thread's share
//!   into bf16 buffer `use % 3` and meet the other warpgroup; issue four `wgmma m64nNk16` with A
//!   from registers (converted formats: while they run, do the same for the next stage; bf16
//!   activations: two stages at a time, eight MMAs); wait for them and release the stage (W4A8:
//!   into a separate sum per 128 K, added times the activations' fp32 scales).
//! - Store: the sums times `alpha`, transposed, directly (f32, 16-bit, or split-K partials).

use core::marker::PhantomData;

use super::{
    ACT_BUFFERS, Activation, BLOCK_K, CONSUMERS, GROUP_ROWS, Sm90W4Params, WEIGHT_ROW_BYTES,
    WEIGHT_ROWS,
};
use crate::entry::Named;
use crate::gemm::barriers;
use crate::gemm::driver::{Ctx, GemmKernel};
use crate::gemm::epilogue::{self, Output};
use crate::gemm::layout::{FRAGMENT_ROWS, ScaleBox, StageLayout};
use crate::gemm::pipeline::PipelineState;
use crate::gemm::promote::promote_columns;
use crate::gemm::scheduler::{ClusterShape, Schedule, WorkUnit};
use crate::gemm::splitk;
use crate::plant;
use crate::ptx::wgmma::{self, Bf16RsFragment, Fragment};
use crate::ptx::{smem, tma};
use crate::sm90_mx::MMA_K;
use crate::sm90_mx::dequant::{self, Dequant, E2m1, E4m3, ScaleDecode};
use crate::sm90_mx::kernel::{bf16_desc, store_unit_swizzled};
use crate::sm90_mx::{BF16_ROW_BYTES, UNIT};

/// Consumer threads, which share the activations' conversion.
const THREADS: u32 = 128 * CONSUMERS;
/// Units (16 codes of one row) per activation row of a stage.
const UNITS_PER_ROW: u32 = BLOCK_K / UNIT;
/// bf16 1.0 in both halves.
const ONE_X2: u32 = 0x3F80_3F80;

/// The activations' format: how a stage's tile is loaded and turned into bf16.
pub(crate) trait Activations {
    /// The format, whose methods give the bits, whether to convert and whether to promote.
    const KIND: Activation;
    /// Scale bytes per row and stage.
    const SCALE_BYTES: u32;
    type Elem: Dequant;
    /// The TMA x coordinate of stage `kb` (elements for bf16 maps, bytes for code maps).
    fn x(kb: u32) -> i32 {
        (kb * BLOCK_K * Self::KIND.bits() / 8) as i32
    }
    /// The plane of the scale map that stage `kb`'s scales are in.
    fn scale_plane(kb: u32) -> i32 {
        kb as i32
    }
    /// The scale of unit `q` of a row whose scale bytes are at `sf`, as bf16x2.
    /// # Safety
    /// `sf` is the row's scales in a filled stage.
    unsafe fn unit_scale(sf: u32, q: u32) -> u32;
}

/// bf16 activations (W4A16).
pub(crate) struct Bf16<S>(PhantomData<S>);
/// e4m3 activations with fp32 scales per 1×128 (W4A8).
pub(crate) struct E4m3Row128<S>(PhantomData<S>);
/// e2m1 activations with the weights' scale format `S`.
pub(crate) struct Fp4<S>(PhantomData<S>);

impl<S> Activations for Bf16<S> {
    const KIND: Activation = Activation::Bf16;
    const SCALE_BYTES: u32 = 0;
    type Elem = E4m3; // not converted: any type
    fn x(kb: u32) -> i32 {
        (kb * BLOCK_K) as i32
    }
    unsafe fn unit_scale(_: u32, _: u32) -> u32 {
        ONE_X2
    }
}

impl<S> Activations for E4m3Row128<S> {
    const KIND: Activation = Activation::E4m3Row128;
    const SCALE_BYTES: u32 = 4;
    type Elem = E4m3;
    /// One fp32 scale per 128 of K: two stages per plane.
    fn scale_plane(kb: u32) -> i32 {
        (kb * BLOCK_K / super::A8_SCALE_K) as i32
    }
    /// The codes convert at scale 1; the fp32 scale is applied to the stage's sums.
    unsafe fn unit_scale(_: u32, _: u32) -> u32 {
        ONE_X2
    }
}

impl<S: ScaleDecode> Activations for Fp4<S> {
    const KIND: Activation = Activation::Fp4;
    const SCALE_BYTES: u32 = Activation::Fp4.scale_bytes(S::BLOCK);
    type Elem = E2m1;
    unsafe fn unit_scale(sf: u32, q: u32) -> u32 {
        // SAFETY: the caller's contract.
        S::x2(unsafe { smem::load_u8(sf + q * UNIT / S::BLOCK) })
    }
}

/// The activations' format named by its [`Activation`] value `A` (`as u32`) with the scale type
/// `S`, for the kernel table ([`crate::entry::Named`]).
pub(crate) struct ActOf<const A: u32, S>(PhantomData<S>);

impl<S> Named for ActOf<{ Activation::Bf16 as u32 }, S> {
    type T = Bf16<S>;
}

impl<S> Named for ActOf<{ Activation::E4m3Row128 as u32 }, S> {
    type T = E4m3Row128<S>;
}

impl<S> Named for ActOf<{ Activation::Fp4 as u32 }, S> {
    type T = Fp4<S>;
}

/// The kernel for `F::N` activation rows, activations `A` and weight scales `S`.
pub(crate) struct W4Gemm<F, A, S> {
    pub(crate) p: Sm90W4Params,
    pub(crate) types: PhantomData<(F, A, S)>,
}

/// What one use's MMAs take: the thread's weight fragments of K steps 0..4 and the address of
/// the stage's bf16 activations.
struct Prepared {
    frags: [[u32; 4]; 4],
    x: u32,
}

impl Prepared {
    /// Before the first use is prepared.
    const NONE: Prepared = Prepared {
        frags: [[0; 4]; 4],
        x: 0,
    };
}

/// One consumer thread's constants.
pub(crate) struct Consumer {
    pub(crate) c: u32,
    pub(crate) local: u32,
    /// The thread's first weight row in the tile (the second is 8 below).
    pub(crate) row: u32,
}

impl Consumer {
    /// Thread `local` of consumer warpgroup `c`.
    #[inline(always)]
    pub(crate) fn new(c: u32, local: u32) -> Self {
        let row = c * FRAGMENT_ROWS + wgmma::fragment_row(local);
        Consumer { c, local, row }
    }
}

impl<F: Bf16RsFragment, A: Activations, S: ScaleDecode> W4Gemm<F, A, S> {
    /// Scale bytes per weight row and stage.
    const W_SCALES: u32 = BLOCK_K / S::BLOCK;
    /// Bytes of one raw activation row of a stage.
    const RAW_ROW: u32 = BLOCK_K * A::KIND.bits() / 8;
    /// The TMA box of the activations' scales.
    const ACT_SCALE_BOX: Option<ScaleBox> =
        super::act_scale_box(super::W4Tile { n: F::N }, A::KIND, S::BLOCK);
    /// Whether a use is prepared while the previous use's MMAs run: for the formats converted in
    /// shared memory, whose conversion and meeting are long enough to hide them (measured: for
    /// bf16 activations the fragments' extra registers and moves cost more than they hide).
    const LOOKAHEAD: bool = A::KIND.converts();
    /// Rounds of the activations' conversion (units = rows × 4, over 256 threads).
    const ROUNDS: u32 = (F::N * UNITS_PER_ROW).div_ceil(THREADS);

    /// The thread's raw bytes of stage `s`: rows `row` and `row + 8`, 16 codes each (8 reordered
    /// bytes at `8·(lane % 4)`, [`super::weight_k`]), and their scale bytes, each loaded once.
    /// # Safety
    /// Stage `s` is filled and held.
    #[inline(always)]
    unsafe fn stage_bytes(
        layout: &StageLayout,
        s: u32,
        row: u32,
        lane: u32,
    ) -> ([[u32; 2]; 2], [[u32; 4]; 2]) {
        let (tile, sf) = (layout.b(s), layout.sfa(s));
        let rows = [row, row + 8];
        // SAFETY: the caller's contract; rows < 128, bytes < 32, scale bytes < W_SCALES.
        let raw =
            rows.map(|r| unsafe { smem::load_u32x2(tile + r * WEIGHT_ROW_BYTES + 8 * (lane % 4)) });
        // (Index loops over constant bounds: unrolled, the bytes kept in registers.)
        let mut bytes = [[0u32; 4]; 2];
        for h in 0..2 {
            for i in 0..Self::W_SCALES as usize {
                // SAFETY: as above.
                bytes[h][i] = unsafe { smem::load_u8(sf + rows[h] * Self::W_SCALES + i as u32) };
            }
        }
        (raw, bytes)
    }

    /// The register fragments (K steps 0..4) of `N` stages' [`Self::stage_bytes`], times their
    /// scales.
    #[inline(always)]
    fn fragments<const N: usize>(
        stages: [([[u32; 2]; 2], [[u32; 4]; 2]); N],
    ) -> [[[u32; 4]; 4]; N] {
        let byte = |c: usize, h: usize, kk: u32| stages[c].1[h][(kk * MMA_K / S::BLOCK) as usize];
        if A::KIND.converts() {
            // (Measured: with the activations' conversion beside it, the ballot and the second
            // path cost more than the multiplies they save.)
            core::array::from_fn(|c| {
                super::weight_fragments(stages[c].0, |h, kk| S::x2(byte(c, h, kk)))
            })
        } else {
            super::warp_fragments::<S, N>(stages.map(|st| st.0), byte)
        }
    }

    /// Consumer thread `g` (of 256) converts its units of stage `s`'s activation tile into the
    /// bf16 buffer at `buf`, in K order.
    /// # Safety
    /// Stage `s` is filled; nobody reads the buffer until the consumers meet again.
    #[inline(always)]
    unsafe fn convert(layout: &StageLayout, s: u32, buf: u32, g: u32, shift: u32) {
        let sf = layout.sfa(s) + WEIGHT_ROWS * Self::W_SCALES + shift * A::SCALE_BYTES;
        for round in 0..Self::ROUNDS {
            let u = g + THREADS * round;
            if u < F::N * UNITS_PER_ROW {
                let (r, q) = (u / UNITS_PER_ROW, u % UNITS_PER_ROW);
                let src = layout.a(s) + r * Self::RAW_ROW + q * UNIT * A::KIND.bits() / 8;
                // SAFETY: the caller's contract; the unit and its scale are inside the stage,
                // its row inside the buffer.
                unsafe {
                    let raw = if A::KIND.bits() == 8 {
                        smem::load_u32x4(src)
                    } else {
                        let [x, y] = smem::load_u32x2(src);
                        [x, y, 0, 0]
                    };
                    let scale = A::unit_scale(sf + r * A::SCALE_BYTES, q);
                    let out = dequant::unit::<A::Elem>(raw, scale, true);
                    let out = dequant::natural_order(A::KIND.bits(), out);
                    store_unit_swizzled(buf + r * BF16_ROW_BYTES, r, q, out);
                }
            }
        }
    }

    /// Waits for use `st`'s stage and makes what its MMAs take: this thread's weight fragments
    /// and the address of the bf16 activations (the stage's tile, or buffer `use % 3` after
    /// this thread's share is converted into it and the consumers have met).
    /// # Safety
    /// `st` is this warpgroup's next unwaited use; for a converting format, buffer `use % 3` is
    /// read by no MMA in flight in either consumer.
    #[inline(always)]
    unsafe fn prepare(
        ctx: &Ctx,
        st: PipelineState,
        g: u32,
        lane: u32,
        row: u32,
        shift: u32,
    ) -> Prepared {
        let (pipe, layout) = (&ctx.pipe, &ctx.layout);
        let s = pipe.stage(st);
        // SAFETY: the caller's contract.
        unsafe {
            pipe.consumer_wait(st);
            let [frags] = Self::fragments([Self::stage_bytes(layout, s, row, lane)]);
            let x = if A::KIND.converts() {
                let buf = layout.out() + (st.count() % ACT_BUFFERS) * F::N * BF16_ROW_BYTES;
                Self::convert(layout, s, buf, g, shift);
                smem::fence_async_proxy();
                barriers::sync_consumers();
                buf
            } else {
                layout.a(s)
            };
            Prepared { frags, x }
        }
    }

    /// `acc += tmp ·` the fp32 scale of each value's activation row (the fragment's column),
    /// read from stage `s`.
    /// # Safety
    /// Stage `s` is filled and held.
    #[inline(always)]
    unsafe fn promote(layout: &StageLayout, s: u32, lane: u32, shift: u32, acc: &mut F, tmp: &F) {
        let sf = layout.sfa(s) + WEIGHT_ROWS * Self::W_SCALES + 4 * shift;
        // SAFETY: the caller's contract; col < N, the stage holds N scales.
        promote_columns(acc, tmp, lane, |col| unsafe {
            f32::from_bits(smem::load_u32(sf + 4 * col))
        });
    }
}

impl<F: Bf16RsFragment, A: Activations, S: ScaleDecode> GemmKernel for W4Gemm<F, A, S> {
    const CONSUMERS: u32 = CONSUMERS;
    type Consumer = Consumer;
    type Acc = F;

    #[inline(always)]
    fn layout(&self) -> StageLayout {
        super::layout(super::W4Tile { n: F::N }, A::KIND, S::BLOCK)
    }

    #[inline(always)]
    fn cluster(&self) -> ClusterShape {
        ClusterShape { m: 1, n: 1 }
    }

    /// Units are (weight tile, activation tile): the schedule's "M" is C's N.
    #[inline(always)]
    fn schedule(&self) -> Schedule {
        let p = &self.p;
        let (n, m, l, k) = (p.n, p.m, p.l, p.k);
        let tile = super::W4Tile { n: F::N };
        tile.schedule((m, n, k, l), (p.split_k, p.group_m), p.groups)
    }

    #[inline(always)]
    fn prologue(&self) {
        // SAFETY: the maps are tensor maps (the entry's contract).
        unsafe {
            tma::prefetch_map(self.p.tmap_w);
            tma::prefetch_map(self.p.tmap_x);
            if A::SCALE_BYTES != 0 {
                tma::prefetch_map(self.p.tmap_sx);
            }
        }
    }

    #[inline(always)]
    unsafe fn load(&self, ctx: &Ctx, own: &WorkUnit, kb: u32, s: u32, full: u32) {
        let (p, layout) = (&self.p, &ctx.layout);
        let (n0, m0, l) = (own.m * WEIGHT_ROWS, own.first_row(own.n, F::N), own.l);
        let stages = p.k.div_ceil(BLOCK_K) as u64;
        let w_scales = p.sfw
            + ((l as u64 * stages + kb as u64) * p.rows_pad_w as u64 + n0 as u64)
                * Self::W_SCALES as u64;
        // The stored weights' groups of 16 rows (`super::stored_chunk`): 8 of them, chunk kb.
        let group = (l * p.n.div_ceil(GROUP_ROWS) + n0 / GROUP_ROWS) as i32;
        // SAFETY: the driver's contract (the stage is free); the maps cover the operands (TMA
        // zero-fills rows past M and elements past K; past N the rows are the stored padding or
        // the next batch entry's, whose sums are never stored); the scale buffers are padded to
        // whole tiles of rows and stages of K.
        unsafe {
            tma::load_4d(layout.b(s), p.tmap_w, [0, 0, kb as i32, group], full);
            let a_l = own.a_l as i32;
            tma::load_3d(layout.a(s), p.tmap_x, A::x(kb), m0 as i32, a_l, full);
            tma::load_bytes(layout.sfa(s), w_scales, WEIGHT_ROWS * Self::W_SCALES, full);
            if A::SCALE_BYTES != 0 {
                let dst = layout.sfa(s) + WEIGHT_ROWS * Self::W_SCALES;
                let y = match Self::ACT_SCALE_BOX {
                    Some(b) => b.start(m0).0,
                    None => m0,
                };
                tma::load_3d(dst, p.tmap_sx, y as i32, A::scale_plane(kb), a_l, full);
            }
        }
    }

    #[inline(always)]
    fn consumer(&self, _ctx: &Ctx, c: u32, local: u32) -> Consumer {
        Consumer::new(c, local)
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
        let (g, lane) = (cons.c * 128 + cons.local, cons.local % 32);
        // Where the tile's first activation row sits in its scale box.
        let shift = match Self::ACT_SCALE_BOX {
            Some(b) => b.start(own.first_row(own.n, F::N)).1,
            None => 0,
        };
        let mut acc = F::zeros();
        // W4A8: the sums of the current 128-K block of activation scales (two stages).
        let mut tmp = F::zeros();
        let ks = own.k_blocks();
        if ks.is_empty() {
            return acc;
        }
        let mut first = ks.start;
        if !Self::LOOKAHEAD && !A::KIND.promotes() {
            // Two stages at a time: their fragments are one block of independent work, which
            // the compiler interleaves (a stage alone is a chain of dependent conversions that
            // two consumer warps per scheduler cannot hide).
            while first + 1 < ks.end {
                let (st0, st1) = (*st, st.next());
                let (s0, s1) = (pipe.stage(st0), pipe.stage(st1));
                // SAFETY: uses `st0` and `st1` are this warpgroup's next two (both consumers
                // make the same uses), held together (the ring has more than two stages) from
                // their waits to their releases after their MMAs completed; the fence after the
                // wait keeps the fragments' registers until then.
                unsafe {
                    pipe.consumer_wait(st0);
                    pipe.consumer_wait(st1);
                    let b0 = Self::stage_bytes(layout, s0, cons.row, lane);
                    let b1 = Self::stage_bytes(layout, s1, cons.row, lane);
                    let [mut f0, mut f1] = Self::fragments([b0, b1]);
                    wgmma::fence();
                    for kk in 0..4 {
                        let fresh = first == ks.start && kk == 0;
                        acc.mma_rs_bf16(f0[kk], bf16_desc(layout.a(s0), 0, kk as u32), !fresh);
                    }
                    for kk in 0..4 {
                        acc.mma_rs_bf16(f1[kk], bf16_desc(layout.a(s1), 0, kk as u32), true);
                    }
                    wgmma::commit();
                    wgmma::wait::<0>();
                    acc.fence();
                    wgmma::fence_a_fragments(&mut f0);
                    wgmma::fence_a_fragments(&mut f1);
                    pipe.consumer_release(st0, ctx.rank);
                    pipe.consumer_release(st1, ctx.rank);
                }
                st.advance();
                st.advance();
                first += 2;
            }
        }
        let mut cur = Prepared::NONE;
        if Self::LOOKAHEAD && first < ks.end {
            // SAFETY: `st` is this warpgroup's next use (both consumers make the same uses).
            cur = unsafe { Self::prepare(ctx, *st, g, lane, cons.row, shift) };
        }
        for kb in first..ks.end {
            let s = pipe.stage(*st);
            let next_st = st.next();
            // Whether this stage starts a sum, and whether the sum is complete after it.
            let (fresh, done) = if A::KIND.promotes() {
                (
                    kb == ks.start || kb % 2 == 0,
                    kb % 2 == 1 || kb + 1 == ks.end,
                )
            } else {
                (kb == ks.start, false)
            };
            // SAFETY: use `st` is held and prepared (`cur`) before its MMAs. They read
            // `cur.frags` from registers until the wait, which the fence after it keeps unshared
            // with the next use's fragments, made meanwhile with lookahead; that next use is
            // waited for in `prepare` and held with this one (the ring has more than two
            // stages). Buffer `use % 3` was last read by the MMAs of use − 3, which every
            // consumer waited for before the meeting of use − 2's preparation (made during
            // use − 3's MMAs with lookahead), which this thread passed before preparing this use.
            unsafe {
                if !Self::LOOKAHEAD {
                    cur = Self::prepare(ctx, *st, g, lane, cons.row, shift);
                }
                wgmma::fence();
                let sums = if A::KIND.promotes() {
                    &mut tmp
                } else {
                    &mut acc
                };
                for kk in 0..4 {
                    let desc = bf16_desc(cur.x, 0, kk as u32);
                    sums.mma_rs_bf16(cur.frags[kk], desc, !(fresh && kk == 0));
                }
                wgmma::commit();
                let next = (Self::LOOKAHEAD && kb + 1 < ks.end)
                    .then(|| Self::prepare(ctx, next_st, g, lane, cons.row, shift));
                wgmma::wait::<0>();
                sums.fence();
                wgmma::fence_a_fragments(&mut cur.frags);
                if done {
                    Self::promote(layout, s, lane, shift, &mut acc, &tmp);
                }
                pipe.consumer_release(*st, ctx.rank);
                if let Some(next) = next {
                    cur = next;
                }
            }
            st.advance();
        }
        acc
    }

    #[inline(always)]
    fn epilogue(&self, _ctx: &Ctx, cons: &Consumer, own: &WorkUnit, acc: F) {
        let who = (cons.c, cons.local, cons.row);
        store_unit(&self.p, &self.schedule(), who, (own, F::N), acc);
    }

    #[inline(always)]
    fn finish(&self, _cons: &Consumer, _st: PipelineState) {}
}

/// Stores consumer thread `(c, local, row)`'s sums of unit `own` (tiles of `tile_n` activation
/// rows; `row` the thread's first weight row in the tile): times `alpha`, through split-K's
/// meeting, transposed into C. Both kernels of the family store so.
#[inline(always)]
pub(crate) fn store_unit<F: Fragment>(
    p: &Sm90W4Params,
    schedule: &Schedule,
    (c, local, row): (u32, u32, u32),
    (own, tile_n): (&WorkUnit, u32),
    mut acc: F,
) {
    if p.alpha * plant::W4 != 1.0 {
        epilogue::scale(&mut acc, p.alpha * plant::W4);
    }
    let (who, acc) = ((c, CONSUMERS, local), core::array::from_mut(&mut acc));
    // SAFETY: the host sizes `splitk` for this schedule (the entry's contract); the tile is
    // CONSUMERS fragments of 64 weight rows.
    let one = ClusterShape { m: 1, n: 1 };
    let meet = unsafe { splitk::meet(&p.splitk, schedule, one, own, who, acc) };
    let Some(out_l) = meet else { return };
    let out = Output::direct(p.out, (p.m, p.n), p.out_type, own.row_end);
    let n0 = own.m * WEIGHT_ROWS + row;
    let m0 = own.first_row(own.n, tile_n) + 2 * (local % 4);
    epilogue::store_transposed(&out, out_l, n0, m0, &acc[0]);
}
