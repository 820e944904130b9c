//! Blackwell tensor-core instructions (sm_100a). PTX ISA: "TensorCore 5th Generation Family
//! Instructions" (`tcgen05.alloc`, `.dealloc`, `.relinquish_alloc_permit`, `.commit`, `.fence`,
//! `.wait`). NO BLACKWELL GPU IS LENT HERE: these are assembled by ptxas for sm_100a and never run.
//! The block-scaled MMA (`tcgen05.mma.cta_group::1.kind::mxf8f6f4 / mxf4nvf4 .block_scale`) and the
//! tensor-memory loads are added by the Blackwell kernel issue, with the kernel that uses them.

use core::arch::asm;

/// Allocates `cols` columns of tensor memory (a power of two, 32..=512) and writes the address to
/// shared memory at `dst`. Executed by one whole warp.
/// # Safety
/// `dst` is a 4-byte shared address; the warp later frees the same columns with [`dealloc`].
#[inline(always)]
pub unsafe fn alloc(dst: u32, cols: u32) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [{d}], {n};", d = in(reg32) dst, n = in(reg32) cols, options(nostack))
    };
}

/// Lets other CTAs on this SM allocate (issue after the last `alloc`).
#[inline(always)]
pub fn relinquish_alloc_permit() {
    // SAFETY: no operands; one warp executes it.
    unsafe {
        asm!(
            "tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;",
            options(nostack)
        )
    };
}

/// Frees tensor memory.
/// # Safety
/// `taddr`/`cols` are what [`alloc`] returned and no MMA or load still uses them.
#[inline(always)]
pub unsafe fn dealloc(taddr: u32, cols: u32) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("tcgen05.dealloc.cta_group::1.sync.aligned.b32 {t}, {n};", t = in(reg32) taddr, n = in(reg32) cols, options(nostack))
    };
}

/// Makes the mbarrier at `bar` track completion of this thread's prior async tcgen05 operations.
/// # Safety
/// `bar` is an initialized mbarrier.
#[inline(always)]
pub unsafe fn commit(bar: u32) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [{b}];", b = in(reg32) bar, options(nostack))
    };
}

/// Orders tcgen05 operations before a thread synchronization.
#[inline(always)]
pub fn fence_before_sync() {
    // SAFETY: no operands.
    unsafe { asm!("tcgen05.fence::before_thread_sync;", options(nostack)) };
}

/// Orders tcgen05 operations after a thread synchronization.
#[inline(always)]
pub fn fence_after_sync() {
    // SAFETY: no operands.
    unsafe { asm!("tcgen05.fence::after_thread_sync;", options(nostack)) };
}

/// Waits for this thread's outstanding `tcgen05.ld`.
#[inline(always)]
pub fn wait_loads() {
    // SAFETY: no operands.
    unsafe { asm!("tcgen05.wait::ld.sync.aligned;", options(nostack)) };
}
