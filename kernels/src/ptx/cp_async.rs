//! Small asynchronous copies from global to shared memory, tracked by an `mbarrier`.
//! PTX ISA: "Data Movement and Conversion Instructions: cp.async", "cp.async.mbarrier.arrive".
//!
//! For values too small for a bulk copy (which needs 16-byte aligned sources and sizes): a
//! thread issues the copies, then has the barrier's current phase wait for them
//! ([`arrive_on`]), so whoever waits for that phase sees the copied bytes, and the thread itself
//! never waits for the load.

use core::arch::asm;

/// Copies 4 bytes from global to shared memory, asynchronously (`cp.async.ca`, 4-byte size).
/// # Safety
/// `dst` (shared) and `src` (global) are 4-byte aligned and valid; nothing reads `dst` before an
/// [`arrive_on`] after this copy has completed its barrier phase.
#[inline(always)]
pub unsafe fn copy_4(dst: u32, src: u64) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("cp.async.ca.shared.global [{d}], [{s}], 4;", d = in(reg32) dst, s = in(reg64) src,
             options(nostack))
    };
}

/// Makes barrier `bar`'s current phase also wait for every [`copy_4`] this thread issued before
/// (an arrival that the copies' completion triggers; without `.noinc` the barrier's pending
/// count is raised by one first, so the phase's expected arrivals are unchanged).
/// # Safety
/// `bar` is an initialized barrier whose current phase has not completed, and one of this
/// thread's own arrivals on it is still to come (so the phase cannot complete before this).
#[inline(always)]
pub unsafe fn arrive_on(bar: u32) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("cp.async.mbarrier.arrive.shared.b64 [{b}];", b = in(reg32) bar, options(nostack))
    };
}
