//! Byte permutation. PTX ISA: "Integer Arithmetic Instructions: prmt" (default mode): each of
//! the four low nibbles of the selector picks one of the eight bytes of `{b, a}` (a's byte 0 is
//! index 0); a nibble's bit 3 would replicate that byte's sign bit instead, so selectors here
//! keep it clear.

use core::arch::asm;

/// `prmt.b32 d, a, b, sel`: byte j of the result is byte `sel[4j + 2 : 4j]` of `{b, a}`.
#[inline(always)]
pub fn prmt(a: u32, b: u32, sel: u32) -> u32 {
    let d: u32;
    // SAFETY: register-only instruction.
    unsafe {
        asm!("prmt.b32 {d}, {a}, {b}, {s};", d = out(reg32) d, a = in(reg32) a, b = in(reg32) b,
             s = in(reg32) sel, options(pure, nomem, nostack))
    };
    d
}
