//! Packed bf16 arithmetic. PTX ISA: "Half Precision Floating-Point Instructions: mul"
//! (`mul.rn.bf16x2`, sm_90+): two bf16 products in one instruction, rounded to nearest even,
//! subnormals kept (bf16 has no `.ftz` form), NaN and Inf as IEEE 754 says.

use core::arch::asm;

/// The two bf16 products of the halves of `a` and `b` (bf16x2 words, low half first).
#[inline(always)]
pub fn mul_bf16x2(a: u32, b: u32) -> u32 {
    let r: u32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("mul.rn.bf16x2 {r}, {a}, {b};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b,
             options(pure, nomem, nostack))
    };
    r
}
