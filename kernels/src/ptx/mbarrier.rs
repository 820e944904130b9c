//! Transaction barriers in shared memory.
//! PTX ISA: "Parallel Synchronization and Communication Instructions: mbarrier"
//! (`mbarrier.init`, `mbarrier.arrive`, `mbarrier.arrive.expect_tx`, `mbarrier.try_wait.parity`)
//! and "membar/fence" (`fence.mbarrier_init`).
//!
//! Operand rules: the barrier is a `.b64` at an 8-byte-aligned shared address; `try_wait.parity`
//! waits for the phase whose parity is given to complete (phases alternate 0, 1, 0, …).

use core::arch::asm;

/// # Safety
/// `bar` is an 8-byte-aligned shared address owned by this barrier; no thread uses it yet.
#[inline(always)]
pub unsafe fn init(bar: u32, arrivals: u32) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("mbarrier.init.shared::cta.b64 [{b}], {n};", b = in(reg32) bar, n = in(reg32) arrivals, options(nostack))
    };
}

/// Makes initialized barriers visible to the cluster and the async proxy (TMA); issue once after
/// the inits, before the block (or cluster) barrier that precedes first use.
#[inline(always)]
pub fn fence_init() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.mbarrier_init.release.cluster;", options(nostack)) };
}

/// One arrival.
/// # Safety
/// `bar` is an initialized barrier.
#[inline(always)]
pub unsafe fn arrive(bar: u32) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("mbarrier.arrive.shared::cta.b64 _, [{b}];", b = in(reg32) bar, options(nostack))
    };
}

/// One arrival that also expects `bytes` of asynchronous transactions (TMA) on this phase.
/// # Safety
/// `bar` is an initialized barrier.
#[inline(always)]
pub unsafe fn arrive_expect_tx(bar: u32, bytes: u32) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("mbarrier.arrive.expect_tx.shared::cta.b64 _, [{b}], {n};", b = in(reg32) bar,
             n = in(reg32) bytes, options(nostack))
    };
}

/// Arrival on the barrier at the same offset in CTA `cta` of the cluster (`mapa` + remote arrive),
/// used by consumers to release a stage that a multicast TMA of another CTA fills. Default
/// semantics (release at CTA scope), as CUTLASS's cluster barrier uses: `.release.cluster` makes
/// every arriving thread execute a cluster-wide memory fence, which stalls every release.
/// The releasing thread's reads of the stage have completed (their
/// values are consumed) before it arrives.
/// # Safety
/// `bar` is an initialized barrier in every CTA of the cluster; `cta` < cluster size.
#[inline(always)]
pub unsafe fn arrive_cluster(bar: u32, cta: u32) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("{{ .reg .b32 remote;",
             "mapa.shared::cluster.u32 remote, {b}, {c};",
             "mbarrier.arrive.shared::cluster.b64 _, [remote]; }}",
             b = in(reg32) bar, c = in(reg32) cta, options(nostack))
    };
}

/// One test of phase `parity` of `bar` by the `mbarrier` instruction `$op` (`try_wait` or
/// `test_wait`), as a bool.
macro_rules! parity_test {
    ($op:literal, $bar:expr, $parity:expr) => {{
        let done: u32;
        // SAFETY: the caller's contract (an initialized barrier).
        unsafe {
            asm!("{{ .reg .pred p;",
                 concat!("mbarrier.", $op, ".parity.shared::cta.b64 p, [{b}], {ph};"),
                 "selp.u32 {d}, 1, 0, p; }}",
                 b = in(reg32) $bar, ph = in(reg32) $parity, d = out(reg32) done,
                 options(nostack))
        };
        done != 0
    }};
}

/// One non-blocking test of phase `parity`; true when that phase has completed.
/// # Safety
/// `bar` is an initialized barrier.
#[inline(always)]
pub unsafe fn try_wait(bar: u32, parity: u32) -> bool {
    parity_test!("try_wait", bar, parity)
}

/// One test of phase `parity` that never suspends the thread (`mbarrier.test_wait`, where
/// `try_wait` may wait a while in hardware before it answers): true when that phase has
/// completed, with the same acquire semantics as a completed wait.
/// # Safety
/// `bar` is an initialized barrier.
#[inline(always)]
pub unsafe fn test_wait(bar: u32, parity: u32) -> bool {
    parity_test!("test_wait", bar, parity)
}

/// Blocks until phase `parity` of `bar` has completed. (A Rust loop rather than a PTX label, so the
/// idiom can be inlined many times into one function.)
/// # Safety
/// `bar` is an initialized barrier whose phase will complete (or this spins forever).
#[inline(always)]
pub unsafe fn wait(bar: u32, parity: u32) {
    // SAFETY: the caller's contract.
    while !unsafe { try_wait(bar, parity) } {}
}
