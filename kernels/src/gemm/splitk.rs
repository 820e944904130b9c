//! Split-K without a second kernel. When a tile's K blocks are split over `split` work units
//! (the scheduler's `WorkUnit::k_begin..k_end`; which range a unit is and where the ranges meet
//! is [`Schedule::meeting`]: dense `out_l = l·split + s`, block-sparse its segment), each unit's consumer
//! warpgroups write their f32 partial sums to the workspace in the fragments' own layout
//! (16-byte stores, a warpgroup's 128 threads side by side) and count themselves in their tile's
//! counter; the warpgroup that arrives last adds the `split` partials in the order s = 0, 1, …
//! (the same sums whichever CTA arrives last: results are reproducible bit for bit), resets the
//! counter for the next launch and stores C through the kernel's normal epilogue.
//!
//! The hand-over is the release / acquire pattern of the PTX memory model ("Memory Consistency
//! Model"): every thread's partial stores, a barrier of the warpgroup, then one thread's
//! `fence.acq_rel.gpu` and counter increment (a release covering what the barrier ordered before
//! it); the last arriver's fence after its increment is the acquire, and the barrier that
//! broadcasts the finding orders the warpgroup's loads after it. Nobody waits for anybody: a
//! CTA that is not last goes on to its next unit.

use super::barriers::{MAX_CONSUMERS, any_consumer, sync_consumer};
use super::scheduler::{ClusterShape, Schedule, WorkUnit};
use crate::params::SplitKParams;
use crate::ptx::global;
use crate::ptx::wgmma::Fragment;

/// Threads of a consumer warpgroup, each holding its share of a fragment.
const THREADS: u64 = 128;

/// Consumer warpgroup `c` of `consumers` (thread `local`) meets the other K ranges of its tile
/// `own` with its fragments `acc` (one per wave). Returns the batch entry of C to store the
/// tile into when this warpgroup holds the sum in `acc` (always without a split), `None` when
/// another CTA will store it.
/// # Safety
/// `own` is a unit of `sched` ([`Schedule::meeting`]'s contract). With a split: `p` is this
/// launch's workspace, sized by
/// [`Schedule::splitk_workspace`] for `sched` and `cluster`, with every counter 0 at launch; the
/// CTA tile is `consumers · W` fragments of 64 rows (`unit_m · unit_n / cluster.size()` values);
/// every thread of the warpgroup calls this with the same `own`, once per unit.
#[inline(always)]
pub unsafe fn meet<const W: usize, F: Fragment>(
    p: &SplitKParams,
    sched: &Schedule,
    cluster: ClusterShape,
    own: &WorkUnit,
    (c, consumers, local): (u32, u32, u32),
    acc: &mut [F; W],
) -> Option<u32> {
    // SAFETY: the caller's contract.
    let meeting = unsafe { sched.meeting(own, cluster) };
    let (split, s) = (meeting.parts, meeting.part);
    if split <= 1 {
        return Some(own.out_l);
    }
    // A fragment is 64 × N values, N / 2 per thread: N / 8 chunks of four, each chunk of the
    // warpgroup's 128 threads 2 KiB of consecutive memory.
    let chunk_bytes = 16 * THREADS;
    let frag_bytes = (F::N / 8) as u64 * chunk_bytes;
    let tile_bytes = (consumers as u64) * (W as u64) * frag_bytes;
    let mine = p.ws + (c as u64 * W as u64) * frag_bytes + 16 * local as u64;
    let part = |t: u32| mine + (meeting.first + t as u64 * meeting.stride) * tile_bytes;
    // SAFETY (stores and loads): the workspace holds `split` tiles of `tile_bytes` per CTA tile
    // (the caller's contract); thread `local`'s chunk `j` of fragment `w` is inside its
    // warpgroup's share, 16-byte aligned; the partial of range `t` was written by its unit
    // before its release (below), which the acquire orders before these loads (this thread's
    // own stores are ordered before its loads of the same addresses).
    for (w, f) in acc.iter().enumerate() {
        for (j, q) in f.as_ref().as_chunks::<4>().0.iter().enumerate() {
            let at = part(s) + w as u64 * frag_bytes + j as u64 * chunk_bytes;
            unsafe { global::store_f32x4(at, *q) };
        }
    }
    sync_consumer(c);
    let counter = p.counters + 4 * (meeting.counter * MAX_CONSUMERS as u64 + c as u64);
    let mut last = false;
    if local == 0 {
        global::fence_acq_rel_gpu();
        // SAFETY: one counter per CTA tile and consumer, inside the workspace's counters.
        unsafe {
            last = global::atomic_add_u32(counter, 1) == split - 1;
            if last {
                // Every range has arrived: nobody else touches the counter in this launch.
                global::store_relaxed_u32(counter, 0);
            }
        }
        global::fence_acq_rel_gpu();
    }
    if !any_consumer(c, last) {
        return None;
    }
    // The sum is rebuilt in `acc` from the workspace, this range's partial included (re-read,
    // not taken from the registers: a separate sum beside the 256-row tile's 128 sums would not
    // fit in the register file), so that it is the same whichever range arrives last.
    for f in acc.iter_mut() {
        *f = F::zeros();
    }
    for t in 0..split {
        for (w, f) in acc.iter_mut().enumerate() {
            for (j, q) in f.as_mut().as_chunks_mut::<4>().0.iter_mut().enumerate() {
                let at = part(t) + w as u64 * frag_bytes + j as u64 * chunk_bytes;
                let v = unsafe { global::load_f32x4_l2(at) };
                for e in 0..4 {
                    q[e] += v[e];
                }
            }
        }
    }
    Some(own.l)
}
