//! Conversions to the output types and to FP8 codes, and from fp16 input. PTX ISA: "Data Movement and Conversion
//! Instructions: cvt" (`cvt.rn.bf16.f32` needs sm_80+, `cvt.rn.f16.f32`, `cvt…e4m3x2.f32` sm_89+). Round to nearest even, as
//! `half::bf16::from_f32` / `half::f16::from_f32` do on the host.

use core::arch::asm;

/// f32 → bf16 bits, round to nearest even (NaN stays NaN).
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    let h: u16;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvt.rn.bf16.f32 {h}, {x};", h = out(reg16) h, x = in(reg32) x, options(pure, nomem, nostack))
    };
    h
}

/// f32 → f16 bits, round to nearest even, overflow to ±inf.
#[inline(always)]
pub fn f32_to_f16(x: f32) -> u16 {
    let h: u16;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvt.rn.f16.f32 {h}, {x};", h = out(reg16) h, x = in(reg32) x, options(pure, nomem, nostack))
    };
    h
}

/// Two f32 → two bf16 in one 32-bit word, `lo` in bits 0–15 (`cvt.rn.bf16x2.f32` takes the high
/// half first). Round to nearest even.
#[inline(always)]
pub fn f32x2_to_bf16x2(lo: f32, hi: f32) -> u32 {
    let r: u32;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvt.rn.bf16x2.f32 {r}, {hi}, {lo};", r = out(reg32) r, hi = in(reg32) hi, lo = in(reg32) lo,
             options(pure, nomem, nostack))
    };
    r
}

/// Two f32 → two f16 in one 32-bit word, `lo` in bits 0–15. Round to nearest even.
#[inline(always)]
pub fn f32x2_to_f16x2(lo: f32, hi: f32) -> u32 {
    let r: u32;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvt.rn.f16x2.f32 {r}, {hi}, {lo};", r = out(reg32) r, hi = in(reg32) hi, lo = in(reg32) lo,
             options(pure, nomem, nostack))
    };
    r
}

/// Two f32 → two e4m3 codes `lo | hi << 8` (`cvt.rn.satfinite.e4m3x2.f32`, sm_89+: the first
/// source goes to the upper byte). Round to nearest even, subnormals kept, finite values above
/// 448 and ±Inf to ±448, NaN to NaN: the rule of `format::e4m3::encode_sat`.
#[inline(always)]
pub fn f32x2_to_e4m3x2(lo: f32, hi: f32) -> u32 {
    let r: u16;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvt.rn.satfinite.e4m3x2.f32 {r}, {hi}, {lo};", r = out(reg16) r, hi = in(reg32) hi, lo = in(reg32) lo,
             options(pure, nomem, nostack))
    };
    r as u32
}

/// Two f32 → two e5m2 codes `lo | hi << 8` (`cvt.rn.satfinite.e5m2x2.f32`, sm_89+: the first
/// source goes to the upper byte). Round to nearest even, subnormals kept, finite values above
/// 57344 and ±Inf to ±57344, NaN to NaN: the rule of `format::e5m2::encode_sat`.
#[inline(always)]
pub fn f32x2_to_e5m2x2(lo: f32, hi: f32) -> u32 {
    let r: u16;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvt.rn.satfinite.e5m2x2.f32 {r}, {hi}, {lo};", r = out(reg16) r, hi = in(reg32) hi, lo = in(reg32) lo,
             options(pure, nomem, nostack))
    };
    r as u32
}

/// fp16 bits → f32 (`cvt.f32.f16`): exact (every fp16, subnormals too, is an f32), ±Inf to
/// ±Inf, NaN to NaN.
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let r: f32;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvt.f32.f16 {r}, {h};", r = out(reg32) r, h = in(reg16) h,
             options(pure, nomem, nostack))
    };
    r
}

/// Two e4m3 codes `lo | hi << 8` → two fp16 in one word, `lo` in bits 0–15
/// (`cvt.rn.f16x2.e4m3x2`, sm_89+): exact, as every e4m3 value (±448 down to the subnormal
/// 2^-9, NaN) is an fp16 one.
#[inline(always)]
pub fn e4m3x2_to_f16x2(codes: u16) -> u32 {
    let r: u32;
    // SAFETY: register-only conversion.
    unsafe {
        asm!("cvt.rn.f16x2.e4m3x2 {r}, {c};", r = out(reg32) r, c = in(reg16) codes,
             options(pure, nomem, nostack))
    };
    r
}
