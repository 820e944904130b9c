//! Shared memory. PTX ISA: "State Spaces: Shared", "Data Movement: ld, st",
//! "Parallel Synchronization: membar/fence (fence.proxy.async)".
//!
//! Rust has no address-space statics, so every module declares one dynamic shared array (the
//! builder writes `.extern .shared .align 1024 .b8 <DYNAMIC_SMEM_SYMBOL>[];`) and kernels carve
//! it up by offset from [`dynamic_base`].

use core::arch::asm;

/// 32-bit shared-window address of the dynamic shared memory (1024-byte aligned).
#[inline(always)]
pub fn dynamic_base() -> u32 {
    let r: u32;
    // SAFETY: takes the address of the module-scope array; reads nothing.
    unsafe {
        asm!(concat!("mov.u32 {r}, ", crate::smem_symbol!(), ";"), r = out(reg32) r,
             options(nomem, nostack))
    };
    r
}

/// `addr`, hidden from the compiler's loop-invariant code motion (an empty `asm` it cannot see
/// through, re-executed where it is written). Addresses derived from it are computed where they
/// are used: hoisted out of a loop, 64 epilogue addresses would stay live through the MMAs and
/// spill.
#[inline(always)]
pub fn opaque(addr: u32) -> u32 {
    let r: u32;
    // SAFETY: moves a register; reads nothing.
    unsafe { asm!("mov.u32 {r}, {a};", r = out(reg32) r, a = in(reg32) addr, options(nostack)) };
    r
}

/// # Safety
/// `addr` is a 4-byte-aligned address inside this block's shared memory.
#[inline(always)]
pub unsafe fn load_u32(addr: u32) -> u32 {
    let v: u32;
    // SAFETY: the caller's contract.
    unsafe {
        asm!("ld.shared.u32 {v}, [{a}];", v = out(reg32) v, a = in(reg32) addr, options(nostack, readonly))
    };
    v
}

/// # Safety
/// `addr` is a 4-byte-aligned address inside this block's shared memory, not read concurrently.
#[inline(always)]
pub unsafe fn store_u32(addr: u32, v: u32) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("st.shared.u32 [{a}], {v};", a = in(reg32) addr, v = in(reg32) v, options(nostack))
    };
}

/// `fence.proxy.async.shared::cta`: makes this thread's ordinary shared-memory writes visible to
/// the async proxy (TMA stores, wgmma operand reads). Each writing thread issues it before the
/// barrier that hands the data over.
#[inline(always)]
pub fn fence_async_proxy() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.proxy.async.shared::cta;", options(nostack)) };
}

/// One byte.
/// # Safety
/// `addr` is an address inside this block's shared memory.
#[inline(always)]
pub unsafe fn load_u8(addr: u32) -> u32 {
    let v: u32;
    // SAFETY: the caller's contract.
    unsafe {
        asm!("ld.shared.u8 {v}, [{a}];", v = out(reg32) v, a = in(reg32) addr, options(nostack, readonly))
    };
    v
}

/// 8 bytes as two words (low address first).
/// # Safety
/// `addr` is an 8-byte-aligned address inside this block's shared memory.
#[inline(always)]
pub unsafe fn load_u32x2(addr: u32) -> [u32; 2] {
    let (x, y): (u32, u32);
    // SAFETY: the caller's contract.
    unsafe {
        asm!("ld.shared.v2.u32 {{{x}, {y}}}, [{a}];", x = out(reg32) x, y = out(reg32) y,
             a = in(reg32) addr, options(nostack, readonly))
    };
    [x, y]
}

/// 16 bytes as four words (low address first).
/// # Safety
/// `addr` is a 16-byte-aligned address inside this block's shared memory.
#[inline(always)]
pub unsafe fn load_u32x4(addr: u32) -> [u32; 4] {
    let (x, y, z, w): (u32, u32, u32, u32);
    // SAFETY: the caller's contract.
    unsafe {
        asm!("ld.shared.v4.u32 {{{x}, {y}, {z}, {w}}}, [{a}];", x = out(reg32) x, y = out(reg32) y,
             z = out(reg32) z, w = out(reg32) w, a = in(reg32) addr, options(nostack, readonly))
    };
    [x, y, z, w]
}

/// 16 bytes from four words (`v[0]` at the low address).
/// # Safety
/// `addr` is a 16-byte-aligned address inside this block's shared memory, not accessed
/// concurrently.
#[inline(always)]
pub unsafe fn store_u32x4(addr: u32, v: [u32; 4]) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("st.shared.v4.u32 [{a}], {{{x}, {y}, {z}, {w}}};", a = in(reg32) addr, x = in(reg32) v[0],
             y = in(reg32) v[1], z = in(reg32) v[2], w = in(reg32) v[3], options(nostack))
    };
}

/// 8 bytes from two words (`v[0]` at the low address).
/// # Safety
/// `addr` is an 8-byte-aligned address inside this block's shared memory, not accessed
/// concurrently.
#[inline(always)]
pub unsafe fn store_u32x2(addr: u32, v: [u32; 2]) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("st.shared.v2.u32 [{a}], {{{x}, {y}}};", a = in(reg32) addr, x = in(reg32) v[0],
             y = in(reg32) v[1], options(nostack))
    };
}
