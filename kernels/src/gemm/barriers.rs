//! The named barriers (`bar.sync id, threads`; 16 per CTA, PTX ISA "Parallel Synchronization and
//! Communication Instructions: bar, barrier") every GEMM kernel uses, allotted in one place so no
//! two roles share an id.
//! - 0: the whole block (`bar.sync 0` is `__syncthreads`).
//! - 1 + c: consumer warpgroup `c`'s own barrier (its epilogue's hand-over to the TMA store, and
//!   split-K's meeting of K ranges).
//! - [`TURN_FIRST`] + p: the consumers' turn-taking ([`super::pipeline::Turn`], party `p`).
//! - [`CONSUMERS_ALL`]: every consumer thread of two consumer warpgroups (kernels whose
//!   consumers share a buffer they fill together, `sm90_mx`).

/// Consumer warpgroups that have an id of their own (ids 1–3).
pub const MAX_CONSUMERS: u32 = 3;
/// The first id of the consumers' turns (3 ids: 4–6).
pub const TURN_FIRST: u32 = 1 + MAX_CONSUMERS;
/// The id of the two consumer warpgroups' meeting.
pub const CONSUMERS_ALL: u32 = TURN_FIRST + MAX_CONSUMERS;
const _: () = assert!(CONSUMERS_ALL < 16);

/// Threads of one warpgroup.
pub const WARPGROUP: u32 = 128;

/// Synchronizes the 128 threads of consumer warpgroup `c` (< [`MAX_CONSUMERS`]) only. The ids
/// are immediates, so ptxas's barrier accounting stays exact.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn sync_consumer(c: u32) {
    use crate::ptx::thread;
    match c {
        0 => thread::named_barrier::<1>(WARPGROUP),
        1 => thread::named_barrier::<2>(WARPGROUP),
        _ => thread::named_barrier::<3>(WARPGROUP),
    }
}

/// [`sync_consumer`] that also tells every thread of warpgroup `c` whether `pred` held for any
/// of them.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn any_consumer(c: u32, pred: bool) -> bool {
    use crate::ptx::thread;
    match c {
        0 => thread::named_barrier_any::<1>(WARPGROUP, pred),
        1 => thread::named_barrier_any::<2>(WARPGROUP, pred),
        _ => thread::named_barrier_any::<3>(WARPGROUP, pred),
    }
}

/// [`sync_consumers`] that also tells every consumer thread whether `pred` held for any of them.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn any_consumers(pred: bool) -> bool {
    crate::ptx::thread::named_barrier_any::<CONSUMERS_ALL>(2 * WARPGROUP, pred)
}

/// Synchronizes the 256 threads of consumer warpgroups 0 and 1.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn sync_consumers() {
    crate::ptx::thread::named_barrier::<CONSUMERS_ALL>(2 * WARPGROUP);
}
