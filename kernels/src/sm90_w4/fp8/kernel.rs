//! The Hopper W4A8 GEMM on FP8 tensor cores, run by the warp-specialized driver
//! ([`crate::gemm::driver`]); it computes Cᵀ = B·Aᵀ (module doc of [`super`]).
//!
//! - Load (one producer thread, per stage of 128 K): the weight tile's two reordered chunks and
//!   the activation tile by TMA, the weights' two planes of scale bytes and the tile's row tops
//!   by bulk copy, the activations' fp32 scales by TMA.
//! - Compute (each consumer warpgroup its 64 weight rows, on its own): fold this thread's weight
//!   codes into e4m3 fragments in the activations' K order ([`super::direct_words`]), issue four
//!   `wgmma m64n128k32` e4m3 with A from registers into a fresh sum; while they run, do the same
//!   for the next stage; wait, add the sum to the fp32 sums times the activation rows' scales,
//!   release the stage. After the K loop, the sums times each weight row's `2^(top − 133)`.
//! - Store: the sums times `alpha`, transposed, directly (f32, 16-bit, or split-K partials).

use core::marker::PhantomData;

use super::{ACT_ROW_BYTES, FP8_BLOCK_K, FP8_TILE, PASS_BINADES, direct_words, row_factor, table};
use crate::gemm::barriers;
use crate::gemm::driver::{Ctx, GemmKernel};
use crate::gemm::layout::{ScaleBox, StageLayout};
use crate::gemm::pipeline::PipelineState;
use crate::gemm::promote::promote_columns;
use crate::gemm::scheduler::{ClusterShape, Schedule, WorkUnit};
use crate::ptx::wgmma::{self, Descriptor, Fp8RsFragment, Fragment, Swizzle};
use crate::ptx::{smem, thread, tma};
use crate::sm90_mx::dequant::ScaleDecode;
use crate::sm90_w4::kernel::{Consumer, store_unit};
use crate::sm90_w4::{
    Activation, BLOCK_K, CONSUMERS, GROUP_ROWS, Sm90W4Params, WEIGHT_ROW_BYTES, WEIGHT_ROWS,
};

/// The sums of one tile: 64 weight rows × 128 activation rows per warpgroup.
type Acc = [f32; 64];
/// K of one `wgmma` step.
const STEP_K: u32 = 32;
/// `wgmma` steps per stage.
const STEPS: u32 = FP8_BLOCK_K / STEP_K;
/// Bytes between 8-row groups of a 128-byte-swizzled tile.
const SWIZZLE_SBO: u32 = 8 * ACT_ROW_BYTES;

/// The kernel for weight scales `S` (e8m0 per 32 or per 16).
pub(crate) struct W4Fp8Gemm<S> {
    pub(crate) p: Sm90W4Params,
    pub(crate) types: PhantomData<S>,
}

/// What one stage's MMAs take: this thread's e4m3 fragments of the first pass (K steps 0..4),
/// the passes beyond the first its own blocks need, and whether any row of its warpgroup needs
/// the general rule (then the further passes are checked).
struct Prepared {
    frags: [[u32; 4]; 4],
    rows: Rows,
    extra: u32,
    more: bool,
}

/// This thread's two weight rows of a tile: their largest non-NaN scale bytes over all of K
/// (the fold's reference: every block's shift is `top − byte ≥ 0`; copied into every stage)
/// and their table bases ([`super::row_base`]).
#[derive(Clone, Copy)]
struct Rows {
    tops: [u32; 2],
    bases: [[u32; 2]; 2],
}

/// This thread's raw bytes of a stage: `[chunk][row r, r + 8][word]` (the stored words of steps 0
/// and 1 of threads `2·(t % 2)` and `2·(t % 2) + 1`, [`direct_words`]), and each row's scale bytes
/// (NaN bytes past the stage's blocks, which no table reads and the checks skip).
type StageBytes = ([[[u32; 4]; 2]; 2], [[u32; 8]; 2]);

impl<S: ScaleDecode> W4Fp8Gemm<S> {
    /// Scale bytes per weight row and 64-K plane of the MX layout.
    const PER_PLANE: u32 = BLOCK_K / S::BLOCK;
    /// Scale blocks per weight row and stage.
    const BLOCKS: u32 = FP8_BLOCK_K / S::BLOCK;
    /// Where a stage's weight row tops are, after the weights' and the activations' scales.
    const TOPS: u32 = WEIGHT_ROWS * Self::BLOCKS + Self::ACT_SCALE_BOX.bytes();
    /// The TMA box of the activations' scales.
    const ACT_SCALE_BOX: ScaleBox =
        super::super::act_scale_box(FP8_TILE, Activation::E4m3Row128, S::BLOCK).unwrap();

    /// The `wgmma` descriptor of step `kk` of the activation tile at `a` (K-major, 128
    /// rows of 128 bytes, 128-byte swizzle, as TMA wrote it).
    #[inline(always)]
    fn act_desc(a: u32, kk: u32) -> Descriptor {
        Descriptor::new(a, 16, SWIZZLE_SBO, Swizzle::B128).advance(kk * STEP_K)
    }

    /// This thread's [`StageBytes`] of stage `s` (rows `row`, `row + 8`; 16 reordered bytes at
    /// `16·(lane % 2)` of each chunk).
    /// # Safety
    /// Stage `s` is filled and held.
    #[inline(always)]
    unsafe fn stage_bytes(layout: &StageLayout, s: u32, row: u32, lane: u32) -> StageBytes {
        let (tile, sf) = (layout.b(s), layout.sfa(s));
        let rows = [row, row + 8];
        let chunk = WEIGHT_ROWS * WEIGHT_ROW_BYTES;
        let mut raw = [[[0u32; 4]; 2]; 2];
        let mut bytes = [[0xFFu32; 8]; 2];
        // (Index loops over constant bounds: unrolled, the bytes kept in registers.)
        for h in 0..2 {
            for c in 0..2 {
                let at = tile + c as u32 * chunk + rows[h] * WEIGHT_ROW_BYTES + 16 * (lane % 2);
                // SAFETY: the caller's contract; rows < 128, bytes < 32 (16-byte aligned).
                raw[c][h] = unsafe { smem::load_u32x4(at) };
            }
            for b in 0..Self::BLOCKS {
                let (plane, i) = (b / Self::PER_PLANE, b % Self::PER_PLANE);
                let at = sf + plane * WEIGHT_ROWS * Self::PER_PLANE + rows[h] * Self::PER_PLANE + i;
                // SAFETY: as above; the byte lies in its plane.
                bytes[h][b as usize] = unsafe { smem::load_u8(at) };
            }
        }
        (raw, bytes)
    }

    /// The e4m3 fragments (K steps 0..4) of pass `pass` of thread `t`'s (lane % 4) [`StageBytes`],
    /// given each row's top: step `k` is words `k % 2` and `2 + k % 2` of chunk `k / 2`, whose
    /// bytes below 16 of the step take block `k` (per 32) or `2k` (per 16) and the others block
    /// `k` or `2k + 1`. `table` is [`table`] or, for plain rows, [`super::fast_table`].
    #[inline(always)]
    fn fragments_with(
        (raw, bytes): &StageBytes,
        t: u32,
        table: impl Fn(usize, u32) -> [u32; 2],
    ) -> [[u32; 4]; 4] {
        let per32 = S::BLOCK == 32;
        let mut frags = [[0u32; 4]; 4];
        for k in 0..4 {
            let mut words = [[0u32; 2]; 2];
            for h in 0..2 {
                let (first, second) = if per32 {
                    let t = table(h, bytes[h][k]);
                    (t, t)
                } else {
                    (table(h, bytes[h][2 * k]), table(h, bytes[h][2 * k + 1]))
                };
                let w = &raw[k / 2][h];
                words[h] = direct_words((w[k % 2], w[2 + k % 2]), t, first, second, per32);
            }
            frags[k] = [words[0][0], words[1][0], words[0][1], words[1][1]];
        }
        frags
    }

    /// [`Self::fragments_with`] of pass `pass` by the general rule ([`table`]). A byte above its
    /// row's top cannot occur (the tops are the bytes' maxima, remade with the scales).
    #[inline(always)]
    fn fragments(bytes: &StageBytes, t: u32, tops: [u32; 2], pass: u32) -> [[u32; 4]; 4] {
        Self::fragments_with(bytes, t, |h, b| table(b, tops[h], pass))
    }

    /// Waits for use `st`'s stage and makes this thread's first-pass fragments; its warpgroup
    /// `c` learns whether any of its rows needs the general rule.
    /// # Safety
    /// `st` is this warpgroup's next unwaited use.
    #[inline(always)]
    unsafe fn prepare(ctx: &Ctx, st: PipelineState, (c, lane, row): (u32, u32, u32)) -> Prepared {
        let (pipe, layout) = (&ctx.pipe, &ctx.layout);
        let s = pipe.stage(st);
        // SAFETY: the caller's contract; the stage is held until this warpgroup releases it.
        unsafe {
            pipe.consumer_wait(st);
            let bytes = Self::stage_bytes(layout, s, row, lane);
            let rows = Self::rows(layout, s, row);
            let blocks = Self::BLOCKS as usize;
            let mut plain = true;
            for h in 0..2 {
                // Within 11 binades of the row's top and no NaN (0xFF lies above any top).
                let (hi, lo) = super::span(&bytes.1[h], blocks);
                plain &= hi <= rows.tops[h] && rows.tops[h] - lo < PASS_BINADES;
            }
            // The fragments of plain rows (the common case, made while the warpgroup's other
            // threads reach the check); remade below where any of its rows is not plain.
            let (base, t) = (&rows.bases, lane % 4);
            let frags = Self::fragments_with(&bytes, t, |h, b| super::fast_table(b, base[h]));
            // Whether any row of the warpgroup (whose `wgmma` are collective) needs the general
            // rule (a NaN scale, or a block 12 or more binades below its row's top). (Through a
            // fixed lane: a value ptxas can see is warp-uniform, so the branch on it around the
            // further passes' `wgmma` is not a divergent path, which would make it serialize
            // every `wgmma` of the kernel.)
            let more = thread::warp_uniform(barriers::any_consumer(c, !plain) as u32) != 0;
            if !more {
                return Prepared {
                    frags,
                    rows,
                    extra: 0,
                    more,
                };
            }
            // (Loaded again: the first loads' registers are free across the check.)
            let bytes = Self::stage_bytes(layout, s, row, lane);
            let extra = super::extra_passes(&bytes.1[0], rows.tops[0])
                .max(super::extra_passes(&bytes.1[1], rows.tops[1]));
            Prepared {
                frags: Self::fragments(&bytes, t, rows.tops, 0),
                rows,
                extra,
                more,
            }
        }
    }

    /// Issues four MMAs of stage `s`'s activations with `frags` into a fresh `sums`, committed as
    /// one group ([`Self::settle`] waits for them).
    /// # Safety
    /// The stage is held; `frags` and `sums` are not touched until [`Self::settle`].
    #[inline(always)]
    unsafe fn issue(layout: &StageLayout, s: u32, frags: &[[u32; 4]; 4], sums: &mut Acc) {
        wgmma::fence();
        for kk in 0..STEPS {
            let desc = Self::act_desc(layout.a(s), kk);
            // SAFETY: the caller's contract.
            unsafe { sums.mma_rs_e4m3(frags[kk as usize], desc, kk != 0) };
        }
        wgmma::commit();
    }

    /// Waits for the MMAs [`Self::issue`] committed; the fences keep `sums` and `frags` in their
    /// registers until then.
    #[inline(always)]
    fn settle(frags: &mut [[u32; 4]; 4], sums: &mut Acc) {
        wgmma::wait::<0>();
        sums.fence();
        wgmma::fence_a_fragments(frags);
    }

    /// `acc += sums ·` the fp32 scale of each value's activation row (the fragment's column) ·
    /// 2^(−12·pass), read from stage `s`; the weight rows' `2^(top − 133)` is multiplied in after
    /// the K loop ([`Self::row_factors`]).
    /// # Safety
    /// Stage `s` is filled and held.
    #[inline(always)]
    unsafe fn promote(
        layout: &StageLayout,
        (s, lane, shift): (u32, u32, u32),
        (acc, sums): (&mut Acc, &Acc),
        pass: u32,
    ) {
        let sf = layout.sfa(s) + WEIGHT_ROWS * Self::BLOCKS + 4 * shift;
        let down = row_factor(6 + 127, pass);
        // SAFETY: the caller's contract; col < 128, the stage holds the box's scales.
        promote_columns(acc, sums, lane, |col| unsafe {
            let a = f32::from_bits(smem::load_u32(sf + 4 * col));
            if pass == 0 { a } else { a * down }
        });
    }

    /// This thread's [`Rows`], from the tops stage `s` holds.
    /// # Safety
    /// Stage `s` is filled and held.
    #[inline(always)]
    unsafe fn rows(layout: &StageLayout, s: u32, row: u32) -> Rows {
        let at = layout.sfa(s) + Self::TOPS;
        // SAFETY: the caller's contract; rows < 128.
        let tops = [row, row + 8].map(|r| unsafe { smem::load_u8(at + r) });
        Rows {
            tops,
            bases: tops.map(super::row_base),
        }
    }

    /// `acc` times each value's weight row factor `2^(top − 133)` (the tables' 2^6 and e8m0's
    /// bias), exact in f32 ([`row_factor`]).
    #[inline(always)]
    fn row_factors(acc: &mut Acc, rows: &Rows) {
        let f = [row_factor(rows.tops[0], 0), row_factor(rows.tops[1], 0)];
        for (i, v) in acc.iter_mut().enumerate() {
            *v *= f[(i / 2) % 2];
        }
    }

    /// One stage of the K loop: issues use `st`'s MMAs with `cur`, prepares the next use while
    /// they run (where `left` uses follow), adds the stage's sums (and any further passes) to
    /// `acc`, releases the stage and advances `st`. Returns the next use's preparation.
    /// # Safety
    /// `cur` is use `st`'s preparation ([`Self::prepare`]), and `st` this warpgroup's next
    /// unreleased use. Its MMAs read `cur.frags` until the wait, whose fence keeps them unshared
    /// with the next use's fragments, made meanwhile; that use is waited for in `prepare` and
    /// held with this one (the ring has more than two stages). Every thread of the warpgroup
    /// makes the same barrier calls in the same order (`more` and each pass's `any_consumer`
    /// are the same for all of them).
    #[inline(always)]
    unsafe fn step(
        ctx: &Ctx,
        (st, (c, lane, row), shift): (&mut PipelineState, (u32, u32, u32), u32),
        cur: &mut Prepared,
        left: u32,
        (acc, sums): (&mut Acc, &mut Acc),
    ) -> Option<Prepared> {
        let (pipe, layout) = (&ctx.pipe, &ctx.layout);
        let s = pipe.stage(*st);
        // SAFETY: the caller's contract.
        unsafe {
            Self::issue(layout, s, &cur.frags, sums);
            let next = (left > 0).then(|| Self::prepare(ctx, st.next(), (c, lane, row)));
            Self::settle(&mut cur.frags, sums);
            let at = (s, lane, shift);
            Self::promote(layout, at, (&mut *acc, &*sums), 0);
            if cur.more {
                // Blocks 12 or more binades below their row's top: one more pass per 12.
                let mut pass = 1;
                while thread::warp_uniform(barriers::any_consumer(c, cur.extra >= pass) as u32) != 0
                {
                    let bytes = Self::stage_bytes(layout, s, row, lane);
                    let mut frags = Self::fragments(&bytes, lane % 4, cur.rows.tops, pass);
                    Self::issue(layout, s, &frags, sums);
                    Self::settle(&mut frags, sums);
                    Self::promote(layout, at, (&mut *acc, &*sums), pass);
                    pass += 1;
                }
            }
            pipe.consumer_release(*st, ctx.rank);
            st.advance();
            next
        }
    }
}

impl<S: ScaleDecode> GemmKernel for W4Fp8Gemm<S> {
    const CONSUMERS: u32 = CONSUMERS;
    type Consumer = Consumer;
    type Acc = Acc;

    #[inline(always)]
    fn layout(&self) -> StageLayout {
        super::layout(S::BLOCK)
    }

    #[inline(always)]
    fn cluster(&self) -> ClusterShape {
        ClusterShape { m: 1, n: 1 }
    }

    /// Units are (weight tile, activation tile): the schedule's "M" is C's N; K blocks of 128.
    #[inline(always)]
    fn schedule(&self) -> Schedule {
        let p = &self.p;
        let (n, m, l, k) = (p.n, p.m, p.l, p.k);
        FP8_TILE.schedule_k((m, n, k, l), (p.split_k, p.group_m), p.groups, FP8_BLOCK_K)
    }

    #[inline(always)]
    fn prologue(&self) {
        // SAFETY: the maps are tensor maps (the entry's contract).
        unsafe {
            tma::prefetch_map(self.p.tmap_w);
            tma::prefetch_map(self.p.tmap_x);
            tma::prefetch_map(self.p.tmap_sx);
        }
    }

    #[inline(always)]
    unsafe fn load(&self, ctx: &Ctx, own: &WorkUnit, kb: u32, s: u32, full: u32) {
        let (p, layout) = (&self.p, &ctx.layout);
        let (n0, m0, l) = (own.m * WEIGHT_ROWS, own.first_row(own.n, FP8_TILE.n), own.l);
        let chunks = p.k.div_ceil(BLOCK_K);
        // The stored weights' groups of 16 rows (`super::super::stored_chunk`): 8 of them.
        let group = (l * p.n.div_ceil(GROUP_ROWS) + n0 / GROUP_ROWS) as i32;
        let a_l = own.a_l as i32;
        // SAFETY: the driver's contract (the stage is free); the maps cover the operands (TMA
        // zero-fills rows past M; past N the rows are the stored padding or the next batch
        // entry's, whose sums are never stored); K is a multiple of 128 (the host's check), so
        // both chunks and both scale planes of every stage exist; the scale buffers are padded
        // to whole tiles of rows.
        unsafe {
            for c in 0..2 {
                let dst = layout.b(s) + c * WEIGHT_ROWS * WEIGHT_ROW_BYTES;
                tma::load_4d(dst, p.tmap_w, [0, 0, (2 * kb + c) as i32, group], full);
                let plane = (l * chunks + 2 * kb + c) as u64;
                let src =
                    p.sfw + (plane * p.rows_pad_w as u64 + n0 as u64) * Self::PER_PLANE as u64;
                let dst = layout.sfa(s) + c * WEIGHT_ROWS * Self::PER_PLANE;
                tma::load_bytes(dst, src, WEIGHT_ROWS * Self::PER_PLANE, full);
            }
            let x = (kb * FP8_BLOCK_K) as i32;
            tma::load_3d(layout.a(s), p.tmap_x, x, m0 as i32, a_l, full);
            let dst = layout.sfa(s) + WEIGHT_ROWS * Self::BLOCKS;
            let y = Self::ACT_SCALE_BOX.start(m0).0 as i32;
            tma::load_3d(dst, p.tmap_sx, y, kb as i32, a_l, full);
            let tops = p.tops + (l * p.rows_pad_w + n0) as u64;
            tma::load_bytes(layout.sfa(s) + Self::TOPS, tops, WEIGHT_ROWS, full);
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
    ) -> Acc {
        let (c, lane, row) = (cons.c, cons.local % 32, cons.row);
        // Where the tile's first activation row sits in its scale box.
        let shift = Self::ACT_SCALE_BOX
            .start(own.first_row(own.n, FP8_TILE.n))
            .1;
        let mut acc = Acc::zeros();
        let mut sums = Acc::zeros();
        let ks = own.k_blocks();
        if ks.is_empty() {
            return acc;
        }
        let who = (c, lane, row);
        let mut left = ks.len() as u32;
        // SAFETY: `st` is this warpgroup's next use.
        let mut a = unsafe { Self::prepare(ctx, *st, who) };
        let rows = a.rows;
        // Two stages a turn, the second's fragments made into the first's registers' place, so
        // that no turn ends by moving fragments from one set of registers to the other.
        // SAFETY: `a` is `st`'s preparation, and each step's result the next use's
        // ([`Self::step`]'s contract).
        unsafe {
            loop {
                left -= 1;
                let Some(mut b) =
                    Self::step(ctx, (st, who, shift), &mut a, left, (&mut acc, &mut sums))
                else {
                    break;
                };
                left -= 1;
                let Some(next) =
                    Self::step(ctx, (st, who, shift), &mut b, left, (&mut acc, &mut sums))
                else {
                    break;
                };
                a = next;
            }
        }
        Self::row_factors(&mut acc, &rows);
        acc
    }

    #[inline(always)]
    fn epilogue(&self, _ctx: &Ctx, cons: &Consumer, own: &WorkUnit, acc: Acc) {
        let who = (cons.c, cons.local, cons.row);
        store_unit(&self.p, &self.schedule(), who, (own, FP8_TILE.n), acc);
    }

    #[inline(always)]
    fn finish(&self, _cons: &Consumer, _st: PipelineState) {}
}
