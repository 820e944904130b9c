//! Floating-point arithmetic the epilogue's activations are built from. PTX ISA "Floating-Point
//! Instructions": `ex2` and `rcp` (`.approx.ftz.f32`: the SFU's fast forms; subnormal inputs and
//! results flush to zero, ex2's relative error is at most 2^-22 and rcp's 1 ulp), and `fma`
//! (`fma.rn.f32`: one rounding of `a·b + c`); `rcp.rn`, `mul.rn` and `add.rn` where a result must
//! be the correctly rounded one; their f64 forms for NVFP4's two-level divisor.

use core::arch::asm;

/// 2^x (`ex2.approx.ftz.f32`): +Inf above 128, +0 below −126, NaN stays NaN.
#[inline(always)]
pub fn exp2_approx(x: f32) -> f32 {
    let r: f32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("ex2.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x,
             options(pure, nomem, nostack))
    };
    r
}

/// 1/x (`rcp.approx.ftz.f32`): 1/±Inf = ±0, 1/±0 = ±Inf.
#[inline(always)]
pub fn recip_approx(x: f32) -> f32 {
    let r: f32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("rcp.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x,
             options(pure, nomem, nostack))
    };
    r
}

/// a·b + c rounded once to nearest even (`fma.rn.f32`).
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    let r: f32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("fma.rn.f32 {r}, {a}, {b}, {c};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b,
             c = in(reg32) c, options(pure, nomem, nostack))
    };
    r
}

/// a·b rounded to nearest even (`mul.rn.f32`: the rounding modifier keeps ptxas from contracting
/// it with an add into an `fma`, so a host doing the same two operations agrees bit for bit).
#[inline(always)]
pub fn mul_rn(a: f32, b: f32) -> f32 {
    let r: f32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("mul.rn.f32 {r}, {a}, {b};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b,
             options(pure, nomem, nostack))
    };
    r
}

/// a + b rounded to nearest even (`add.rn.f32`, not contracted: see [`mul_rn`]).
#[inline(always)]
pub fn add_rn(a: f32, b: f32) -> f32 {
    let r: f32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("add.rn.f32 {r}, {a}, {b};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b,
             options(pure, nomem, nostack))
    };
    r
}

/// The larger of `a` and `b`, NaN where either is (`max.NaN.f32`, sm_80: `max.f32` would drop
/// a NaN).
#[inline(always)]
pub fn max_nan(a: f32, b: f32) -> f32 {
    let r: f32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("max.NaN.f32 {r}, {a}, {b};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b,
             options(pure, nomem, nostack))
    };
    r
}

/// The larger of `|a|` and `|b|`, NaN where either is: [`max_nan`] of `abs.f32` operands, which
/// ptxas folds into the one instruction (Rust's `f32::abs` becomes an `and` of the bits, which
/// it does not).
#[inline(always)]
pub fn max_abs_nan(a: f32, b: f32) -> f32 {
    let r: f32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("{{ .reg .f32 x, y; abs.f32 x, {a}; abs.f32 y, {b}; max.NaN.f32 {r}, x, y; }}",
             r = out(reg32) r, a = in(reg32) a, b = in(reg32) b, options(pure, nomem, nostack))
    };
    r
}

/// The smaller of `|a|` and `b`, `b` where `a` is NaN (`min.f32` of an `abs.f32` operand, which
/// ptxas folds into one `FMNMX`).
#[inline(always)]
pub fn min_abs(a: f32, b: f32) -> f32 {
    let r: f32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("{{ .reg .f32 x; abs.f32 x, {a}; min.f32 {r}, x, {b}; }}",
             r = out(reg32) r, a = in(reg32) a, b = in(reg32) b, options(pure, nomem, nostack))
    };
    r
}

/// 1/x correctly rounded to nearest even (`rcp.rn.f32`: subnormals kept; several instructions,
/// for a value used many times, such as a block's divisor).
#[inline(always)]
pub fn recip_rn(x: f32) -> f32 {
    let r: f32;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("rcp.rn.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x,
             options(pure, nomem, nostack))
    };
    r
}

/// a·b rounded to nearest even in f64 (`mul.rn.f64`).
#[inline(always)]
pub fn mul_rn_f64(a: f64, b: f64) -> f64 {
    let r: f64;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("mul.rn.f64 {r}, {a}, {b};", r = out(reg64) r, a = in(reg64) a, b = in(reg64) b,
             options(pure, nomem, nostack))
    };
    r
}

/// a·b + c rounded once to nearest even in f64 (`fma.rn.f64`).
#[inline(always)]
pub fn fma_f64(a: f64, b: f64, c: f64) -> f64 {
    let r: f64;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("fma.rn.f64 {r}, {a}, {b}, {c};", r = out(reg64) r, a = in(reg64) a, b = in(reg64) b,
             c = in(reg64) c, options(pure, nomem, nostack))
    };
    r
}

/// 1/x correctly rounded to nearest even in f64 (`rcp.rn.f64`: several instructions, for a
/// value used many times).
#[inline(always)]
pub fn recip_rn_f64(x: f64) -> f64 {
    let r: f64;
    // SAFETY: register-only arithmetic.
    unsafe {
        asm!("rcp.rn.f64 {r}, {x};", r = out(reg64) r, x = in(reg64) x,
             options(pure, nomem, nostack))
    };
    r
}
