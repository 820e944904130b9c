//! The producer/consumer stage ring (the CUTLASS `PipelineTmaAsync` shape): `STAGES` buffers, each
//! guarded by a *full* barrier (the producer's expect-tx arrival plus the TMA bytes complete it)
//! and an *empty* barrier (every consumer thread arrives once it no longer reads the stage: each
//! thread's own reads are then ordered before the refill by its own release, which is what
//! compute-sanitizer's racecheck can follow — one elected lane per warp after `bar.warp.sync` is
//! ordered too, but racecheck reported it as a WAR hazard).
//! Iteration `it` uses stage `it % STAGES` in phase `(it / STAGES) & 1`: the explicit phase state.
//!
//! Every consumer thread releases a stage itself after its own last read of it, to the empty
//! barrier of every CTA of the cluster (a producer multicasts into all of them, so it may refill a
//! stage only when all are done): each thread's reads are then ordered before the refill by its own
//! release, which compute-sanitizer's racecheck follows. (One elected thread per warp after
//! `bar.warp.sync`, or per warpgroup after a named barrier, is ordered as well under the PTX memory
//! model, but racecheck reports it as a WAR hazard, and it measured no faster on the H100.)

use crate::ptx::{mbarrier, thread};

// `consumer_release` arrives on the one peer of a pair.
const _: () = assert!(crate::params::sm90::MAX_CLUSTER <= 2);

#[derive(Clone, Copy)]
pub struct Pipeline {
    /// Shared address of `STAGES` full barriers followed by `STAGES` empty barriers.
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

    #[inline(always)]
    pub const fn stage(&self, it: u32) -> u32 {
        it % self.stages
    }

    #[inline(always)]
    const fn phase(&self, it: u32) -> u32 {
        (it / self.stages) & 1
    }

    #[inline(always)]
    pub const fn full(&self, it: u32) -> u32 {
        self.barriers + 8 * self.stage(it)
    }

    #[inline(always)]
    const fn empty(&self, it: u32) -> u32 {
        self.barriers + 8 * (self.stages + self.stage(it))
    }

    /// One thread, before any use: one producer arrival per fill; per release, one arrival from
    /// each of `consumer_threads` consumer threads of every CTA of the cluster.
    /// # Safety
    /// The barrier memory belongs to this pipeline; a block barrier follows before first use.
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

    /// Producer: waits until the stage of iteration `it` is free (a fresh ring is free: waiting on
    /// the parity before the first phase returns at once).
    /// # Safety
    /// Initialized pipeline; `it` counts the producer's fills in order.
    #[inline(always)]
    pub unsafe fn producer_acquire(&self, it: u32) {
        // SAFETY: the caller's contract.
        unsafe { mbarrier::wait(self.empty(it), self.phase(it) ^ 1) };
    }

    /// Producer: announces the bytes the copies into this stage will deliver; returns the full
    /// barrier for the copies to complete on.
    /// # Safety
    /// After `producer_acquire(it)`.
    #[inline(always)]
    pub unsafe fn producer_expect(&self, it: u32, bytes: u32) -> u32 {
        let bar = self.full(it);
        // SAFETY: the caller's contract.
        unsafe { mbarrier::arrive_expect_tx(bar, bytes) };
        bar
    }

    /// Consumer: waits until the stage of iteration `it` is filled.
    /// # Safety
    /// Initialized pipeline; `it` counts this consumer's uses in order.
    #[inline(always)]
    pub unsafe fn consumer_wait(&self, it: u32) {
        // SAFETY: the caller's contract.
        unsafe { mbarrier::wait(self.full(it), self.phase(it)) };
    }

    /// Consumer: this thread releases the stage to both CTAs of the pair (every consumer thread
    /// calls it once per stage); `rank` is this CTA's rank in the cluster (of at most 2).
    /// # Safety
    /// After `consumer_wait(it)` and this thread's last read of the stage.
    #[inline(always)]
    pub unsafe fn consumer_release(&self, it: u32, rank: u32) {
        // SAFETY: the caller's contract; every CTA of the cluster has the same barrier layout.
        unsafe {
            mbarrier::arrive(self.empty(it));
            if self.cluster > 1 {
                // Clusters are pairs (`params::sm90::MAX_CLUSTER`): the peer is `rank ^ 1`. (A
                // loop over a run-time cluster size was unrolled into ~40 predicated instructions
                // per K block.)
                mbarrier::arrive_cluster(self.empty(it), rank ^ 1);
            }
        }
    }
}

/// Strict rotation of the consumer warpgroups' MMA batches (CUTLASS's ordered sequence barrier):
/// warpgroup 0 issues a batch, then 1, (then 2,) then 0, … Why: the consumers wait on the same
/// full barrier, so unordered they issue together, the tensor cores interleave the batches, all
/// finish at the end and all promote at once while the tensor cores idle. In turn, the others'
/// batches run while one warpgroup promotes its previous one. (The 256-row kernel orders only its
/// very first batch with it: a one-time stagger.)
/// Named barrier `TURN_FIRST_ID + p` is where party `p` waits for party `p − 1`'s pass: 128 arriving +
/// 128 waiting threads. (0 is the block's barrier, 1–3 the consumers' epilogue barriers.)
/// `PARTIES`: the consumer warpgroups taking turns, 2 or 3 (a constant, so each party's
/// barrier choice compiles to one uniform branch).
#[derive(Clone, Copy)]
pub struct Turn<const PARTIES: u32> {
    /// This warpgroup's index among the parties (0 goes first).
    party: u32,
}

/// The first named barrier of the turns.
pub const TURN_FIRST_ID: u32 = 4;

impl<const PARTIES: u32> Turn<PARTIES> {
    const THREADS: u32 = 256;

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
        // The immediate IDs keep ptxas's barrier accounting exact.
        if self.party == 0 {
            thread::named_arrive::<{ TURN_FIRST_ID + 1 }>(Self::THREADS)
        } else if PARTIES == 2 || self.party == 2 {
            thread::named_arrive::<TURN_FIRST_ID>(Self::THREADS)
        } else {
            thread::named_arrive::<{ TURN_FIRST_ID + 2 }>(Self::THREADS)
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
            thread::named_barrier::<TURN_FIRST_ID>(Self::THREADS)
        } else if PARTIES == 2 || party == 1 {
            thread::named_barrier::<{ TURN_FIRST_ID + 1 }>(Self::THREADS)
        } else {
            thread::named_barrier::<{ TURN_FIRST_ID + 2 }>(Self::THREADS)
        }
    }
}
