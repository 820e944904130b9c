//! The warp-specialized persistent driver every GEMM kernel runs in (ThunderKittens' "load →
//! compute → finish" shape): one CTA per SM, warpgroup 0 the producer, warpgroups 1.. the
//! consumers. The driver owns the shared-memory layout, the stage ring and its barriers, register
//! reallocation, the cluster handshakes and the persistent loop over the [`TileScheduler`]'s
//! units; a kernel says only how to load one K block into a stage, how to compute one unit, and
//! how to store it ([`GemmKernel`]).
//!
//! Per unit, the producer thread acquires one stage per K block of the unit's range (waiting for
//! every consumer of every CTA of the cluster to have released it) and issues the kernel's copies
//! into it; each consumer warpgroup runs the kernel's mainloop over the same K blocks (waiting for
//! each stage to fill, releasing it after its last read), then its epilogue.
//!
//! Fused kernels ([`GemmKernel::FINISHERS`] > 0) split the epilogue: the consumers only stage
//! their fragments in shared memory (or the kernel's global scratch) and go on to the next
//! unit's MMAs, while warps 1.. of the producer's warpgroup (idle otherwise: one thread issues
//! the copies) finish the staged unit — α, bias, activation, quantization, stores — through the
//! [`Handoff`]. The epilogue then costs the MMAs only its staging, as long as the finishers keep
//! up with the tensor cores.

use super::launch_regs;
use super::layout::StageLayout;
use super::pipeline::{Handoff, Pipeline, PipelineState};
use super::scheduler::{ClusterShape, Schedule, TileScheduler, WorkUnit};
use crate::ptx::{smem, thread};

/// What the driver hands each role.
#[derive(Clone, Copy)]
pub struct Ctx {
    pub pipe: Pipeline,
    pub layout: StageLayout,
    pub cluster: ClusterShape,
    /// This CTA's rank in its cluster (0 without one).
    pub rank: u32,
}

/// The kernel-specific parts of a warp-specialized persistent GEMM.
pub trait GemmKernel {
    /// Consumer warpgroups (after the producer's warpgroup 0).
    const CONSUMERS: u32;
    /// Warps after the producer's in its warpgroup that finish the staged units: 0 (each
    /// consumer stores its own) or [`super::FINISHERS`]. With finishers, [`Self::epilogue`] stages the unit and its
    /// words ([`Handoff`], at [`StageLayout::handoff`]) and [`Self::finish_staged`] finishes
    /// it.
    const FINISHERS: u32 = 0;
    /// A consumer warpgroup's own state, made once after its registers are raised.
    type Consumer;
    /// One unit's result, from the mainloop to the epilogue.
    type Acc;

    /// The shared-memory layout (offsets; the driver places it).
    fn layout(&self) -> StageLayout;
    fn cluster(&self) -> ClusterShape;
    /// The units of the problem, each a cluster's tiles.
    fn schedule(&self) -> Schedule;
    /// Thread 0, once, before the block's first barrier (e.g. prefetch tensor maps).
    fn prologue(&self);

    /// Whether the producer thread copies words into each stage itself ([`Self::copy_words`],
    /// into [`StageLayout::words`]): values the consumers need per K block that are too small
    /// for a bulk copy (the FP8 kernel's B scales).
    const COPIES_WORDS: bool = false;

    /// The producer thread: issues the small asynchronous copies ([`crate::ptx::cp_async`]) of
    /// K block `kb`'s words of `own` into `dst` (the stage's words); the stage's full barrier then
    /// waits for them too.
    /// # Safety
    /// `kb` is one of `own`'s K blocks; `dst` is a free stage's words.
    #[inline(always)]
    unsafe fn copy_words(&self, _own: &WorkUnit, _kb: u32, _dst: u32) {}

    /// The producer thread: issues the copies of K block `kb` of `own` (this CTA's tile) into
    /// stage `s`, completing `layout().stage_bytes()` bytes on barrier `full` of every CTA they
    /// land in.
    /// # Safety
    /// Stage `s` is free in every CTA the copies land in.
    unsafe fn load(&self, ctx: &Ctx, own: &WorkUnit, kb: u32, s: u32, full: u32);

    /// Consumer warpgroup `c` (thread `local` of 128) before its first unit.
    fn consumer(&self, ctx: &Ctx, c: u32, local: u32) -> Self::Consumer;
    /// The K loop of one unit: consumes (waits for, reads, releases) one use of the ring per K
    /// block of `own.k_blocks()`, advancing `st` past them.
    /// # Safety
    /// `st` counts this warpgroup's uses of the ring in order.
    unsafe fn mainloop(
        &self,
        ctx: &Ctx,
        cons: &Self::Consumer,
        own: &WorkUnit,
        st: &mut PipelineState,
    ) -> Self::Acc;
    /// Stores one unit's result.
    fn epilogue(&self, ctx: &Ctx, cons: &Self::Consumer, own: &WorkUnit, acc: Self::Acc);
    /// Finishing warp `warp` (of [`Self::FINISHERS`], thread `lane`) finishes its part of unit
    /// `own`, which the consumers staged (with its words in the [`Handoff`]).
    fn finish_staged(&self, _ctx: &Ctx, _own: &WorkUnit, _warp: u32, _lane: u32) {}
    /// After the warpgroup's last unit (`st`: its uses of the ring so far).
    fn finish(&self, cons: &Self::Consumer, st: PipelineState);
}

/// Runs `k` on this CTA: `128 · (1 + K::CONSUMERS)` threads, `k.layout().bytes()` of dynamic
/// shared memory, a grid of whole clusters; `PREGS` / `CREGS` are the producer's and the
/// consumers' register budgets after `setmaxnreg` (const generics, as the instruction takes an
/// immediate).
/// # Safety
/// Launched as above with parameters that make `k`'s loads stay inside its buffers.
#[inline(always)]
pub unsafe fn run<K: GemmKernel, const PREGS: u32, const CREGS: u32>(k: &K) {
    let layout = k.layout().at(smem::dynamic_base());
    let cluster = k.cluster();
    // (At least 1 as the compiler can see: no panic path for the divisions by it below.)
    let size = cluster.size().max(1);
    let pipe = Pipeline::new(layout.barriers(), layout.stages, size);
    let tid = thread::thread_x();
    let rank = if size > 1 {
        thread::cluster_cta_rank()
    } else {
        0
    };
    let ctx = Ctx {
        pipe,
        layout,
        cluster,
        rank,
    };
    const {
        assert!(K::FINISHERS == 0 || K::FINISHERS == super::FINISHERS);
        let groups = 1 + K::CONSUMERS;
        assert!(PREGS + K::CONSUMERS * CREGS <= groups * launch_regs(groups));
    };
    let handoff = Handoff::new(layout.handoff());
    if tid == 0 {
        // SAFETY: the barrier memory is the layout's; the block / cluster barrier below precedes
        // every use.
        unsafe {
            if K::FINISHERS > 0 {
                handoff.init(128 * K::CONSUMERS, 32 * K::FINISHERS);
            }
            pipe.init(128 * K::CONSUMERS)
        };
        k.prologue();
    }
    // With a cluster, the peer's barriers must be initialized before we multicast into its stages
    // or arrive on its barriers.
    if size > 1 {
        thread::sync_cluster()
    } else {
        thread::sync_block()
    }
    // The schedule's unit is one cluster. Each role makes it after its `setmaxnreg` (ptxas spills
    // values live across that instruction).
    let units = || {
        TileScheduler::new(
            k.schedule(),
            thread::block_x() / size,
            thread::grid_dim_x() / size,
        )
    };
    // The role index, warp-uniform as ptxas can see it: the roles' branches are then uniform and
    // the consumers' `wgmma` descriptors are computed in uniform registers.
    let wg = thread::warp_uniform(tid / 128);
    if wg == 0 {
        thread::lower_registers::<PREGS>();
        let units = units();
        if tid == 0 {
            let mut st = pipe.state();
            for unit in units {
                let own = cluster.own(unit, rank);
                for kb in own.k_blocks() {
                    // SAFETY: the stage is free in every CTA we write into after the wait
                    // (every CTA's consumers release to our empty barrier); the words are this
                    // CTA's, their copies tracked by the phase before our own arrival; the
                    // copies deliver the stage's bytes (`GemmKernel::load`'s contract).
                    unsafe {
                        pipe.producer_wait(st);
                        if K::COPIES_WORDS {
                            k.copy_words(&own, kb, layout.words(pipe.stage(st)));
                            pipe.producer_track_copies(st);
                        }
                        let full = pipe.producer_arrive(st, layout.stage_bytes());
                        k.load(&ctx, &own, kb, pipe.stage(st), full);
                    }
                    st.advance();
                }
            }
        } else if K::FINISHERS > 0 && tid >= 32 {
            let warp = thread::warp_uniform(tid / 32 - 1);
            // SAFETY: a finishing warp, `units` the consumers' schedule.
            unsafe { finish_units(k, &ctx, handoff, units, warp, tid % 32) };
        }
    } else {
        thread::raise_registers::<CREGS>();
        let units = units();
        let cons = k.consumer(&ctx, wg - 1, tid % 128);
        let mut st = pipe.state();
        for (t, unit) in units.enumerate() {
            let own = cluster.own(unit, rank);
            // SAFETY: `st` counts this warpgroup's uses in order, as the producer counts fills.
            let acc = unsafe { k.mainloop(&ctx, &cons, &own, &mut st) };
            if K::FINISHERS > 0 {
                // SAFETY: `t` counts this warpgroup's units, as the finishers count theirs.
                unsafe { handoff.consumer_acquire(t as u32) };
            }
            k.epilogue(&ctx, &cons, &own, acc);
            if K::FINISHERS > 0 {
                // SAFETY: after the acquire of this unit; the epilogue staged it.
                unsafe { handoff.consumer_commit() };
            }
        }
        k.finish(&cons, st);
    }
    // No CTA may leave while a peer can still multicast into it or arrive on its barriers.
    if size > 1 {
        thread::sync_cluster();
    }
}

/// A finishing warp's loop (`warp` of `K::FINISHERS`, thread `lane`): each unit of `units` once
/// the consumers have staged it. Inlined in the producer's warpgroup's branch (code after the
/// roles' branches join is held by ptxas to the smallest of their budgets).
/// # Safety
/// Called by a finishing warp only, with the schedule the consumers run; `handoff` is the
/// initialized hand-over.
#[inline(always)]
unsafe fn finish_units<K: GemmKernel>(
    k: &K,
    ctx: &Ctx,
    handoff: Handoff,
    units: TileScheduler,
    warp: u32,
    lane: u32,
) {
    for (t, unit) in units.enumerate() {
        let own = ctx.cluster.own(unit, ctx.rank);
        // SAFETY: `t` counts this warp's units as the consumers count theirs (the same
        // schedule); the consumers staged unit `t` before the wait completes, and read nothing
        // of it after their commit.
        unsafe {
            handoff.finisher_wait(t as u32);
            k.finish_staged(ctx, &own, warp, lane);
            handoff.finisher_release();
        }
    }
}
