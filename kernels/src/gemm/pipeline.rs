//! The producer/consumer stage ring (the CUTLASS `PipelineTmaAsync` shape): `stages` buffers, each
//! guarded by a *full* barrier (the producer's expect-tx arrival plus the TMA bytes complete it)
//! and an *empty* barrier (every consumer thread of every CTA of the cluster arrives once it no
//! longer reads the stage). A [`PipelineState`] names one use of the ring: use `i` is stage
//! `i % stages` in phase `(i / stages) & 1`.
//!
//! Every consumer thread releases a stage itself, after its own last read of it, to the empty
//! barrier of every CTA of the cluster (a producer multicasts into all of them, so it may refill a
//! stage only when all are done). Each thread's reads are then ordered before the refill by its
//! own release, which compute-sanitizer's racecheck can follow; one elected thread per warp after
//! `bar.warp.sync` is ordered as well under the PTX memory model, but racecheck reports it as a
//! WAR hazard.

use super::barriers::{TURN_FIRST, WARPGROUP};
use crate::ptx::{cp_async, mbarrier, thread};

// [`Pipeline::consumer_release`] arrives on the one peer of a pair.
const _: () = assert!(super::scheduler::MAX_CLUSTER == 2);

/// One use of the ring: the producer's n-th fill, or a consumer's n-th read. It carries its
/// stage and phase and steps them by a compare and a select (the CUTLASS `PipelineState`), not
/// as `count % stages` and `count / stages`: a division by a stage count that is not a power of
/// two needs `mul.hi`, which ptxas has no uniform-register form of, so every shared-memory
/// address and `wgmma` descriptor derived from the stage would be computed per thread and moved
/// to uniform registers before each MMA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PipelineState {
    count: u32,
    stage: u32,
    phase: u32,
    stages: u32,
}

impl PipelineState {
    /// The first use of a ring of `stages` buffers.
    #[inline(always)]
    pub const fn first(stages: u32) -> Self {
        PipelineState {
            count: 0,
            stage: 0,
            phase: 0,
            stages,
        }
    }

    /// The use after this one.
    #[inline(always)]
    pub const fn next(self) -> Self {
        let wrap = self.stage + 1 == self.stages;
        PipelineState {
            count: self.count + 1,
            stage: if wrap { 0 } else { self.stage + 1 },
            phase: if wrap { self.phase ^ 1 } else { self.phase },
            stages: self.stages,
        }
    }

    /// Moves on to the next use.
    #[inline(always)]
    pub fn advance(&mut self) {
        *self = self.next();
    }

    /// How many uses came before this one.
    #[inline(always)]
    pub const fn count(self) -> u32 {
        self.count
    }

    /// The use's parity (0, 1, 0, …): which of two buffers a kernel alternates between.
    #[inline(always)]
    pub const fn parity(self) -> u32 {
        self.count & 1
    }

    /// Whether this is the very first use (nothing went through the ring before).
    #[inline(always)]
    pub const fn is_first(self) -> bool {
        self.count == 0
    }
}

#[derive(Clone, Copy)]
pub struct Pipeline {
    /// Shared address of `stages` full barriers followed by `stages` empty barriers.
    barriers: u32,
    stages: u32,
    /// CTAs per cluster that share stages by multicast (1: none).
    cluster: u32,
}

impl Pipeline {
    #[inline(always)]
    pub const fn new(barriers: u32, stages: u32, cluster: u32) -> Self {
        Pipeline {
            barriers,
            stages,
            cluster,
        }
    }

    /// The first use of this ring.
    #[inline(always)]
    pub const fn state(&self) -> PipelineState {
        PipelineState::first(self.stages)
    }

    /// The buffer index of use `st` (a state of this ring).
    #[inline(always)]
    pub const fn stage(&self, st: PipelineState) -> u32 {
        st.stage
    }

    #[inline(always)]
    const fn phase(&self, st: PipelineState) -> u32 {
        st.phase
    }

    #[inline(always)]
    const fn full(&self, st: PipelineState) -> u32 {
        self.barriers + 8 * self.stage(st)
    }

    #[inline(always)]
    const fn empty(&self, st: PipelineState) -> u32 {
        self.barriers + 8 * (self.stages + self.stage(st))
    }

    /// One thread, before any use: one producer arrival per fill; per release, one arrival from
    /// each of `consumer_threads` consumer threads of every CTA of the cluster.
    /// # Safety
    /// The barrier memory belongs to this pipeline; a block (or cluster) barrier follows before
    /// first use.
    #[inline(always)]
    pub unsafe fn init(&self, consumer_threads: u32) {
        for s in 0..self.stages {
            // SAFETY: the caller's contract.
            unsafe {
                mbarrier::init(self.barriers + 8 * s, 1);
                mbarrier::init(
                    self.barriers + 8 * (self.stages + s),
                    consumer_threads * self.cluster,
                );
            }
        }
        mbarrier::fence_init();
    }

    /// Producer: waits until the stage of use `st` is free (a fresh ring is free: waiting on the
    /// parity before the first phase returns at once), then announces the `bytes` the copies into
    /// it will deliver; returns the full barrier for the copies to complete on.
    /// # Safety
    /// Initialized pipeline; `st` counts the producer's fills in order; the copies that follow
    /// deliver exactly `bytes` to this CTA's full barrier.
    #[inline(always)]
    pub unsafe fn producer_acquire(&self, st: PipelineState, bytes: u32) -> u32 {
        // SAFETY: the caller's contract.
        unsafe {
            self.producer_wait(st);
            self.producer_arrive(st, bytes)
        }
    }

    /// Producer: waits until the stage of use `st` is free ([`Self::producer_acquire`]'s first
    /// half: the producer thread's own small copies into the stage go between the two).
    /// # Safety
    /// Initialized pipeline; `st` counts the producer's fills in order.
    #[inline(always)]
    pub unsafe fn producer_wait(&self, st: PipelineState) {
        // SAFETY: the caller's contract.
        unsafe { mbarrier::wait(self.empty(st), self.phase(st) ^ 1) };
    }

    /// Producer: the stage of use `st` is filled only when this thread's small copies into it
    /// ([`cp_async::copy_4`]) have landed as well.
    /// # Safety
    /// After [`Self::producer_wait`] of the same use and before [`Self::producer_arrive`].
    #[inline(always)]
    pub unsafe fn producer_track_copies(&self, st: PipelineState) {
        // SAFETY: the caller's contract (the producer's own arrival on the phase is to come).
        unsafe { cp_async::arrive_on(self.full(st)) };
    }

    /// Producer: announces the `bytes` the copies into the stage of use `st` will deliver, and
    /// returns its full barrier.
    /// # Safety
    /// After [`Self::producer_wait`] of the same use; the copies that follow deliver exactly
    /// `bytes` to this CTA's full barrier.
    #[inline(always)]
    pub unsafe fn producer_arrive(&self, st: PipelineState, bytes: u32) -> u32 {
        let bar = self.full(st);
        // SAFETY: the caller's contract.
        unsafe { mbarrier::arrive_expect_tx(bar, bytes) };
        bar
    }

    /// Consumer: waits until the stage of use `st` is filled.
    /// # Safety
    /// Initialized pipeline; `st` counts this consumer's uses in order.
    #[inline(always)]
    pub unsafe fn consumer_wait(&self, st: PipelineState) {
        // SAFETY: the caller's contract.
        unsafe { mbarrier::wait(self.full(st), self.phase(st)) };
    }

    /// Consumer: whether the stage of use `st` is filled, without waiting: a consumer tests its
    /// next stage before the promotion that ends its current one, so the barrier's latency hides
    /// behind the promotion, and waits ([`Self::consumer_wait`]) only if it was not yet filled.
    /// True has the acquire semantics of a completed wait.
    /// # Safety
    /// Initialized pipeline; `st` is this consumer's next use after the current one.
    #[inline(always)]
    pub unsafe fn consumer_test(&self, st: PipelineState) -> bool {
        // SAFETY: the caller's contract.
        unsafe { mbarrier::test_wait(self.full(st), self.phase(st)) }
    }

    /// Consumer: this thread releases the stage to every CTA of the cluster (every consumer thread
    /// calls it once per use); `rank` is this CTA's rank in the cluster.
    /// # Safety
    /// After `consumer_wait(st)` and this thread's last read of the stage.
    #[inline(always)]
    pub unsafe fn consumer_release(&self, st: PipelineState, rank: u32) {
        // SAFETY: the caller's contract; every CTA of the cluster has the same barrier layout.
        unsafe {
            mbarrier::arrive(self.empty(st));
            if self.cluster > 1 {
                // Clusters are pairs (`scheduler::MAX_CLUSTER`): the peer is `rank ^ 1`. (A loop over a
                // run-time cluster size is unrolled by ptxas into predicated arrivals on every
                // K block.)
                mbarrier::arrive_cluster(self.empty(st), rank ^ 1);
            }
        }
    }
}

/// Strict rotation of the consumer warpgroups' MMA batches (CUTLASS's ordered sequence barrier):
/// warpgroup 0 issues a batch, then 1, (then 2,) then 0, … Why: the consumers wait on the same
/// full barrier, so unordered they issue together, the tensor cores interleave the batches, all
/// finish at the end and all promote at once while the tensor cores idle. In turn, the others'
/// batches run while one warpgroup promotes its previous one.
/// Named barrier `TURN_FIRST + p` is where party `p` waits for party `p − 1`'s pass: 128 arriving +
/// 128 waiting threads. `PARTIES`: the consumer warpgroups taking turns, 2 or 3 (a constant, so
/// each party's barrier choice compiles to one uniform branch).
#[derive(Clone, Copy)]
pub struct Turn<const PARTIES: u32> {
    /// This warpgroup's index among the parties (0 goes first).
    party: u32,
}

impl<const PARTIES: u32> Turn<PARTIES> {
    const THREADS: u32 = 2 * WARPGROUP;

    #[inline(always)]
    pub const fn new(party: u32) -> Self {
        const { assert!(PARTIES == 2 || PARTIES == 3) };
        Turn { party }
    }

    /// Waits until the previous party has issued its batch before ours (`first`: warpgroup 0's
    /// very first batch, which waits for nothing).
    #[inline(always)]
    pub fn wait(&self, first: bool) {
        if !(self.party == 0 && first) {
            Self::sync(self.party);
        }
    }

    /// Our batch is issued: the next party's turn.
    #[inline(always)]
    pub fn pass(&self) {
        // The immediate ids keep ptxas's barrier accounting exact.
        if self.party == 0 {
            thread::named_arrive::<{ TURN_FIRST + 1 }>(Self::THREADS)
        } else if PARTIES == 2 || self.party == 2 {
            thread::named_arrive::<TURN_FIRST>(Self::THREADS)
        } else {
            thread::named_arrive::<{ TURN_FIRST + 2 }>(Self::THREADS)
        }
    }

    /// After the last batch: warpgroup 0 takes the pass that the last party gave after its last
    /// batch, so no barrier is left half-arrived when the block exits.
    #[inline(always)]
    pub fn finish(&self) {
        if self.party == 0 {
            Self::sync(0);
        }
    }

    #[inline(always)]
    fn sync(party: u32) {
        if party == 0 {
            thread::named_barrier::<TURN_FIRST>(Self::THREADS)
        } else if PARTIES == 2 || party == 1 {
            thread::named_barrier::<{ TURN_FIRST + 1 }>(Self::THREADS)
        } else {
            thread::named_barrier::<{ TURN_FIRST + 2 }>(Self::THREADS)
        }
    }
}

/// The hand-over of finished tiles from the consumer warpgroups to the finishing warps (fused
/// kernels, [`super::driver::GemmKernel::FINISHERS`]): a one-slot ring. The consumers of a unit
/// wait until the finishers have read the previous unit's staging (*free*), stage their
/// fragments and a word each ([`Handoff::header`]: the batch entry to store into, or
/// [`Handoff::SKIP`] where split-K leaves the tile to another CTA), and arrive (*staged*); the
/// finishers wait for that, finish the rows from the staging and arrive on *free*. So one
/// unit's epilogue runs while the consumers compute the next unit's MMAs (CUTLASS's ping-pong
/// overlaps the same way with a warpgroup per tile; here the accumulators of the FP8 kernel's
/// promotion leave no room for a second tile per warpgroup). Every thread arrives itself: its
/// own accesses are then ordered before the other side's by its release (as the stage ring's
/// releases, for racecheck's sake). Unit `t` of a role is phase `t` of each barrier.
#[derive(Clone, Copy)]
pub struct Handoff {
    /// Shared address of [`crate::gemm::layout::HANDOFF_BYTES`]: *staged*, *free*, the words.
    at: u32,
}

impl Handoff {
    /// The header word of a consumer warpgroup whose tile another CTA stores (split-K).
    pub const SKIP: u32 = u32::MAX;

    #[inline(always)]
    pub const fn new(at: u32) -> Self {
        Handoff { at }
    }

    #[inline(always)]
    const fn staged(&self) -> u32 {
        self.at
    }

    #[inline(always)]
    const fn free(&self) -> u32 {
        self.at + 8
    }

    /// Consumer warpgroup `c`'s word: its tile's batch entry, or [`Self::SKIP`].
    #[inline(always)]
    pub const fn header(&self, c: u32) -> u32 {
        self.at + 16 + 4 * c
    }

    /// One thread, before any use (and before the pipeline's `init`, whose fence covers these).
    /// # Safety
    /// The memory is the layout's hand-over; a block barrier follows before first use.
    #[inline(always)]
    pub unsafe fn init(&self, consumer_threads: u32, finisher_threads: u32) {
        // SAFETY: the caller's contract.
        unsafe {
            mbarrier::init(self.staged(), consumer_threads);
            mbarrier::init(self.free(), finisher_threads);
        }
    }

    /// Consumer: waits until the staging is free for unit `t` (the finishers are done with unit
    /// `t − 1`; unit 0 waits for nothing: the parity before the first phase).
    /// # Safety
    /// Initialized; `t` counts this warpgroup's units.
    #[inline(always)]
    pub unsafe fn consumer_acquire(&self, t: u32) {
        // SAFETY: the caller's contract.
        unsafe { mbarrier::wait(self.free(), (t & 1) ^ 1) };
    }

    /// Consumer: this thread's staging and words of the unit are written.
    /// # Safety
    /// After [`Self::consumer_acquire`] of the same unit.
    #[inline(always)]
    pub unsafe fn consumer_commit(&self) {
        // SAFETY: the caller's contract.
        unsafe { mbarrier::arrive(self.staged()) };
    }

    /// Finisher: waits until every consumer has staged unit `t`.
    /// # Safety
    /// Initialized; `t` counts this warp's units.
    #[inline(always)]
    pub unsafe fn finisher_wait(&self, t: u32) {
        // SAFETY: the caller's contract.
        unsafe { mbarrier::wait(self.staged(), t & 1) };
    }

    /// Finisher: this thread has read the staging and the words of its unit.
    /// # Safety
    /// After [`Self::finisher_wait`] of the same unit.
    #[inline(always)]
    pub unsafe fn finisher_release(&self) {
        // SAFETY: the caller's contract.
        unsafe { mbarrier::arrive(self.free()) };
    }
}
