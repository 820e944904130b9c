//! Byte permutation and bit selection.
//! - PTX ISA "Integer Arithmetic Instructions: prmt" (default mode): each of the four low nibbles
//!   of the selector picks one of the eight bytes of `{b, a}` (a's byte 0 is index 0); a nibble's
//!   bit 3 would replicate that byte's sign bit instead, so selectors here keep it clear.
//! - PTX ISA "Logic and Shift Instructions: lop3": any function of three words, bit by bit, given
//!   as the truth table of the operands' patterns `0xF0`, `0xCC`, `0xAA`.

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

/// `lop3.b32` with table `0xE4`: the bits of `a` where `mask` is set, of `b` elsewhere (one
/// instruction, where LLVM's and / or / and makes two).
#[inline(always)]
pub fn select(a: u32, b: u32, mask: u32) -> u32 {
    let d: u32;
    // SAFETY: register-only instruction.
    unsafe {
        asm!("lop3.b32 {d}, {a}, {b}, {m}, 0xE4;", d = out(reg32) d, a = in(reg32) a,
             b = in(reg32) b, m = in(reg32) mask, options(pure, nomem, nostack))
    };
    d
}
