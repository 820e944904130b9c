//! Global-memory stores under a predicate, and vector loads. PTX ISA: "Data Movement and
//! Conversion Instructions: st" with an instruction predicate (`@p st.global…`), and "ld". A
//! predicated store instead of a branch keeps code after `wgmma` non-divergent (ptxas serializes
//! wgmma around divergent paths, C7518).

use core::arch::asm;

/// `*addr = v` if `pred` (4-byte store).
/// # Safety
/// When `pred`, `addr` is a valid, 4-byte-aligned global address nobody else accesses.
#[inline(always)]
pub unsafe fn store_u32_if(addr: u64, v: u32, pred: bool) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("{{ .reg .pred p;", "setp.ne.b32 p, {c}, 0;", "@p st.global.b32 [{a}], {v}; }}",
             a = in(reg64) addr, v = in(reg32) v, c = in(reg32) pred as u32, options(nostack))
    };
}

/// `*addr = v` if `pred` (2-byte store).
/// # Safety
/// When `pred`, `addr` is a valid, 2-byte-aligned global address nobody else accesses.
#[inline(always)]
pub unsafe fn store_u16_if(addr: u64, v: u16, pred: bool) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("{{ .reg .pred p;", "setp.ne.b32 p, {c}, 0;", "@p st.global.b16 [{a}], {v}; }}",
             a = in(reg64) addr, v = in(reg16) v, c = in(reg32) pred as u32, options(nostack))
    };
}

/// `*addr = [x, y]` if `pred` (8-byte store).
/// # Safety
/// When `pred`, `addr` is a valid, 8-byte-aligned global address nobody else accesses.
#[inline(always)]
pub unsafe fn store_u32x2_if(addr: u64, x: u32, y: u32, pred: bool) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("{{ .reg .pred p;", "setp.ne.b32 p, {c}, 0;", "@p st.global.v2.b32 [{a}], {{{x}, {y}}}; }}",
             a = in(reg64) addr, x = in(reg32) x, y = in(reg32) y, c = in(reg32) pred as u32, options(nostack))
    };
}

/// `ld.global.v4.f32`: four consecutive f32 in one 16-byte load.
/// # Safety
/// `addr` is a valid, 16-byte-aligned global address of four initialized f32.
#[inline(always)]
pub unsafe fn load_f32x4(addr: u64) -> [f32; 4] {
    let (a, b, c, d): (f32, f32, f32, f32);
    // SAFETY: the caller's contract.
    unsafe {
        asm!("ld.global.v4.f32 {{{a}, {b}, {c}, {d}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
             p = in(reg64) addr, options(nostack, readonly))
    };
    [a, b, c, d]
}
