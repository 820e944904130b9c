//! Thread, block and cluster identity; barriers.
//! PTX ISA: "Special Registers" (%tid, %ctaid, %nctaid, %cluster_ctarank) and "Parallel
//! Synchronization and Communication Instructions: bar, barrier, barrier.cluster",
//! "Miscellaneous Instructions: setmaxnreg".

use core::arch::{asm, nvptx};

#[inline(always)]
pub fn thread_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_thread_idx_x() as u32 }
}
#[inline(always)]
pub fn thread_y() -> u32 {
    // SAFETY: as above.
    unsafe { nvptx::_thread_idx_y() as u32 }
}
#[inline(always)]
pub fn block_x() -> u32 {
    // SAFETY: as above.
    unsafe { nvptx::_block_idx_x() as u32 }
}
#[inline(always)]
pub fn block_y() -> u32 {
    // SAFETY: as above.
    unsafe { nvptx::_block_idx_y() as u32 }
}
#[inline(always)]
pub fn block_z() -> u32 {
    // SAFETY: as above.
    unsafe { nvptx::_block_idx_z() as u32 }
}
#[inline(always)]
pub fn block_dim_x() -> u32 {
    // SAFETY: as above.
    unsafe { nvptx::_block_dim_x() as u32 }
}
#[inline(always)]
pub fn grid_dim_x() -> u32 {
    // SAFETY: as above.
    unsafe { nvptx::_grid_dim_x() as u32 }
}
#[inline(always)]
pub fn grid_dim_y() -> u32 {
    // SAFETY: as above.
    unsafe { nvptx::_grid_dim_y() as u32 }
}

/// `value` as lane 0 of this warp holds it (`shfl.sync.idx.b32`, PTX ISA "Data Movement and
/// Conversion Instructions: shfl.sync"). For a value that is the same in every lane (a thread's
/// warp or warpgroup index) this changes nothing but what ptxas can prove: the result of an
/// indexed shuffle from a fixed lane is warp-uniform, so branches on it are uniform and values
/// derived from it (shared-memory addresses, `wgmma` descriptors) live in uniform registers,
/// which `wgmma` reads its descriptors from, instead of being moved there (`R2UR`) before every
/// MMA. Every lane of the warp must execute it.
#[inline(always)]
pub fn warp_uniform(value: u32) -> u32 {
    let r: u32;
    // SAFETY: all 32 lanes execute it (full mask); no memory is touched.
    unsafe {
        asm!("shfl.sync.idx.b32 {r}, {v}, 0, 31, -1;", r = out(reg32) r, v = in(reg32) value,
             options(nomem, nostack))
    };
    r
}

/// The largest `value` (as an unsigned integer) over each aligned group of `lanes` lanes
/// (`lanes` a power of two ≤ 32), by `shfl.sync.bfly.b32` steps (PTX ISA "Data Movement and
/// Conversion Instructions: shfl.sync"). Every lane of the warp must execute it. The five steps
/// are unrolled, each taken where `step < lanes` (a uniform test): a loop on a run-time bound
/// would branch back after every shuffle.
#[inline(always)]
pub fn group_max_u32(value: u32, lanes: u32) -> u32 {
    let mut v = value;
    // (An index loop: an array's by-value iterator stayed a loop, the steps picked from a
    // register array by a run-time counter.)
    for i in 0..5 {
        let step = 1u32 << i;
        if step < lanes {
            let other: u32;
            // SAFETY: all 32 lanes execute it (full mask; `lanes` is the same in every lane);
            // no memory is touched.
            unsafe {
                asm!("shfl.sync.bfly.b32 {r}, {v}, {s}, 31, -1;", r = out(reg32) other,
                     v = in(reg32) v, s = in(reg32) step, options(nomem, nostack))
            };
            v = v.max(other);
        }
    }
    v
}

/// The largest of `value` over the warp's 32 lanes, in one instruction (`redux.sync.max.u32`,
/// PTX ISA "Parallel Synchronization and Communication Instructions: redux.sync", sm_80+): what
/// [`group_max_u32`]'s five shuffles give for 32 lanes.
#[inline(always)]
pub fn warp_max_u32(value: u32) -> u32 {
    let r: u32;
    // SAFETY: all 32 lanes execute it (full mask); no memory is touched.
    unsafe {
        asm!("redux.sync.max.u32 {r}, {v}, -1;", r = out(reg32) r, v = in(reg32) value,
             options(nomem, nostack))
    };
    r
}

/// Lane `lane`'s `value`, in every lane (`shfl.sync.idx.b32`, PTX ISA "Data Movement and
/// Conversion Instructions: shfl.sync"; `lane` < 32).
#[inline(always)]
pub fn shfl_idx_u32(value: u32, lane: u32) -> u32 {
    let r: u32;
    // SAFETY: all 32 lanes execute it (full mask); no memory is touched.
    unsafe {
        asm!("shfl.sync.idx.b32 {r}, {v}, {l}, 31, -1;", r = out(reg32) r, v = in(reg32) value,
             l = in(reg32) lane, options(nomem, nostack))
    };
    r
}

/// The lanes of this warp whose `pred` is true, as a mask (bit `i` lane `i`; `vote.sync.ballot.b32`,
/// PTX ISA "Parallel Synchronization and Communication Instructions: vote.sync"). Every lane of
/// the warp must execute it.
#[inline(always)]
pub fn ballot(pred: bool) -> u32 {
    let r: u32;
    // SAFETY: all 32 lanes execute it (full mask); no memory is touched.
    unsafe {
        asm!("{{ .reg .pred p;", "setp.ne.b32 p, {c}, 0;", "vote.sync.ballot.b32 {r}, p, -1; }}",
             r = out(reg32) r, c = in(reg32) pred as u32, options(nomem, nostack))
    };
    r
}

/// The smallest of `value` over the warp's 32 lanes (`redux.sync.min.u32`, PTX ISA "Parallel
/// Synchronization and Communication Instructions: redux.sync", sm_80+).
#[inline(always)]
pub fn warp_min_u32(value: u32) -> u32 {
    let r: u32;
    // SAFETY: all 32 lanes execute it (full mask); no memory is touched.
    unsafe {
        asm!("redux.sync.min.u32 {r}, {v}, -1;", r = out(reg32) r, v = in(reg32) value,
             options(nomem, nostack))
    };
    r
}

/// The sum of `value` over the warp's 32 lanes, the same in every lane: five `shfl.sync.bfly.b32`
/// steps (PTX ISA "Data Movement and Conversion Instructions: shfl.sync"), each lane adding its
/// partner's partial sum in a fixed order, so every run rounds alike.
#[inline(always)]
pub fn warp_sum_f32(value: f32) -> f32 {
    let mut v = value;
    for i in 0..5 {
        let other: u32;
        // SAFETY: all 32 lanes execute it (full mask); no memory is touched.
        unsafe {
            asm!("shfl.sync.bfly.b32 {r}, {v}, {s}, 31, -1;", r = out(reg32) other,
                 v = in(reg32) v.to_bits(), s = in(reg32) 1u32 << i, options(nomem, nostack))
        };
        // (Lanes i and i ^ s add the same two values in opposite orders: addition commutes
        // exactly, so they keep equal sums.)
        v += f32::from_bits(other);
    }
    v
}

/// `value`, unknown to the compiler (an `asm` move it cannot see through, pure: PTX ISA "mov").
/// A loop bounded by it is not unrolled: a large body stays one copy in the instruction cache.
#[inline(always)]
pub fn opaque_u32(value: u32) -> u32 {
    let r: u32;
    // SAFETY: moves a register; touches no memory.
    unsafe {
        asm!("mov.u32 {r}, {v};", r = out(reg32) r, v = in(reg32) value,
             options(pure, nomem, nostack))
    };
    r
}

/// `value`, defined anew where this runs (an `asm` move that is not pure, so the compiler neither
/// hoists it out of a loop nor merges it with another): addresses computed from it stay inside
/// the loop that uses them, instead of being computed once before the loop and kept in registers
/// (or spilled) across it.
#[inline(always)]
pub fn unhoisted_u64(value: u64) -> u64 {
    let r: u64;
    // SAFETY: moves a register; touches no memory.
    unsafe {
        asm!("mov.b64 {r}, {v};", r = out(reg64) r, v = in(reg64) value,
             options(nomem, nostack, preserves_flags))
    };
    r
}

/// `bar.warp.sync -1`: every lane of the warp, and their memory accesses before it ordered before
/// their accesses after it (PTX ISA "Parallel Synchronization and Communication Instructions:
/// bar.warp.sync"): lanes exchange data through shared or global memory with it.
#[inline(always)]
pub fn sync_warp() {
    // SAFETY: no operands; every lane executes it (full mask).
    unsafe { asm!("bar.warp.sync -1;", options(nostack)) };
}

/// `bar.sync 0`: every thread of the block (the `__syncthreads` of CUDA).
#[inline(always)]
pub fn sync_block() {
    // SAFETY: must be reached by all threads of the block (the caller's control flow is uniform).
    unsafe { nvptx::_syncthreads() }
}

/// `bar.sync ID, threads`: a named barrier among `threads` threads (a multiple of 32), used to
/// synchronize one role (e.g. one consumer warpgroup) without stopping the others. The ID is an
/// immediate so ptxas knows which of the 16 barriers the kernel uses.
#[inline(always)]
pub fn named_barrier<const ID: u32>(threads: u32) {
    const { assert!(ID < 16) };
    // SAFETY: exactly `threads` threads, whole warps, must reach barrier `ID`.
    unsafe { asm!("bar.sync {id}, {n};", id = const ID, n = in(reg32) threads, options(nostack)) };
}

/// `bar.red.or.pred`: a named barrier among `threads` threads that also returns whether `pred`
/// held for any of them (PTX ISA "Parallel Synchronization and Communication Instructions: bar,
/// barrier"): one thread's finding broadcast to its role without shared memory.
#[inline(always)]
pub fn named_barrier_any<const ID: u32>(threads: u32, pred: bool) -> bool {
    const { assert!(ID < 16) };
    let any: u32;
    // SAFETY: as `named_barrier`: exactly `threads` threads, whole warps, reach barrier `ID`.
    unsafe {
        asm!("{{ .reg .pred p, q;", "setp.ne.b32 p, {c}, 0;",
             "bar.red.or.pred q, {id}, {n}, p;", "selp.u32 {r}, 1, 0, q; }}",
             id = const ID, n = in(reg32) threads, c = in(reg32) pred as u32, r = out(reg32) any,
             options(nostack))
    };
    any != 0
}

/// `bar.arrive ID, threads`: counts this warp's threads at named barrier `ID` without waiting
/// (PTX ISA "Parallel Synchronization and Communication Instructions: bar, barrier"): producer side
/// of a one-way signal whose consumers `bar.sync ID, threads` with the same count.
#[inline(always)]
pub fn named_arrive<const ID: u32>(threads: u32) {
    const { assert!(ID < 16) };
    // SAFETY: as `named_barrier`: the arriving and the waiting threads together are `threads`.
    unsafe {
        asm!("bar.arrive {id}, {n};", id = const ID, n = in(reg32) threads, options(nostack))
    };
}

/// This CTA's rank in its cluster.
#[inline(always)]
pub fn cluster_cta_rank() -> u32 {
    let r: u32;
    // SAFETY: reads %cluster_ctarank (sm_90+).
    unsafe { asm!("mov.u32 {r}, %cluster_ctarank;", r = out(reg32) r, options(nomem, nostack)) };
    r
}

/// `barrier.cluster.arrive` + `wait`: every thread of every CTA in the cluster.
#[inline(always)]
pub fn sync_cluster() {
    // SAFETY: reached by all threads of all CTAs of the cluster.
    unsafe {
        asm!(
            "barrier.cluster.arrive.aligned;",
            "barrier.cluster.wait.aligned;",
            options(nostack)
        )
    };
}

/// `setmaxnreg.inc`: raise this warpgroup's register budget to `N` (24..=256, multiple of 8).
/// Takes effect only when the kernel has a register cap at entry (`.maxntid`, which the builder
/// writes from `registry::KERNELS`); ptxas warns (C7508) otherwise.
#[cfg(any(target_feature = "sm_90a", target_feature = "sm_100a"))]
#[inline(always)]
pub fn raise_registers<const N: u32>() {
    // SAFETY: executed by all threads of a warpgroup (`.sync.aligned`).
    unsafe { asm!("setmaxnreg.inc.sync.aligned.u32 {n};", n = const N, options(nostack)) };
}

/// `setmaxnreg.dec`: lower this warpgroup's register budget to `N`.
#[cfg(any(target_feature = "sm_90a", target_feature = "sm_100a"))]
#[inline(always)]
pub fn lower_registers<const N: u32>() {
    // SAFETY: executed by all threads of a warpgroup (`.sync.aligned`).
    unsafe { asm!("setmaxnreg.dec.sync.aligned.u32 {n};", n = const N, options(nostack)) };
}
