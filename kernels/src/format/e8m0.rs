//! E8M0: the MX shared-scale type.
//!
//! OCP MX v1.0 §5.4.1 "E8M0": an 8-bit unsigned biased exponent, bias 127, value
//! `2^(code - 127)` for codes `0..=254` (`2^-127 ..= 2^127`); `0xFF` is NaN. No sign, no zero,
//! no infinity. Code 0, `2^-127`, is an `f32` subnormal and is decoded exactly.

use super::{floor_log2_bits, pow2};

/// The NaN code.
pub const NAN: u8 = 0xFF;
/// Bias of the exponent.
pub const BIAS: i32 = 127;
/// Smallest representable exponent (code 0).
pub const MIN_EXP: i32 = -127;
/// Largest representable exponent (code 254).
pub const MAX_EXP: i32 = 127;

/// `2^(code - 127)`, exact (code 0 gives the subnormal `f32` `2^-127`); `0xFF` gives NaN.
#[inline]
pub fn decode(code: u8) -> f32 {
    if code == NAN {
        f32::NAN
    } else {
        pow2(code as i32 - BIAS)
    }
}

/// `1 / decode(code)`, exact: `2^(127 - code)` (code 254 gives the subnormal `f32` `2^-127`);
/// `0xFF` gives NaN.
#[inline]
pub fn recip(code: u8) -> f32 {
    if code == NAN {
        f32::NAN
    } else {
        pow2(BIAS - code as i32)
    }
}

/// The code of `2^e`, with `e` clamped to `-127..=127`.
#[inline]
#[allow(clippy::manual_clamp)] // `Ord::clamp` carries an assert; this is branch-only, no panic path.
pub fn from_exponent(e: i32) -> u8 {
    let e = if e < MIN_EXP {
        MIN_EXP
    } else if e > MAX_EXP {
        MAX_EXP
    } else {
        e
    };
    (e + BIAS) as u8
}

/// The exponent `code - 127` (`0xFF`, NaN, gives 128).
#[inline]
pub fn exponent(code: u8) -> i32 {
    code as i32 - BIAS
}

/// The MX shared scale of a block whose largest magnitude is `amax`.
///
/// OCP MX v1.0 §6.3 "Conversion from vector of scalar floating-point to MX format",
/// Algorithm 1: `shared_exp = floor(log2(amax)) - emax_elem`, `X = 2^shared_exp`, where
/// `emax_elem` is the exponent of the largest power of two of the element type
/// ([`super::ElemType::emax`]: 2 for E2M1, 8 for E4M3, 15 for E5M2). `floor(log2(amax))` is taken
/// exactly from the `f32` bits (subnormal `amax` included); the sign of `amax` is ignored.
/// `shared_exp` is clamped to the E8M0 range `-127..=127`.
///
/// - `amax == 0` (an all-zero block): `log2(0)` is undefined; every scale encodes the zeros
///   exactly, so this returns the smallest scale, code 0 (`2^-127`) — the lower clamp of the rule,
///   which is where `floor(log2(amax))` tends, and never NaN (which would poison the block).
/// - NaN gives `0xFF` (NaN).
/// - ±Inf also gives `0xFF`: no finite scale makes an infinite block representable (the MX
///   reference implementation likewise turns a shared exponent above the E8M0 range into NaN).
#[inline]
pub fn mx_scale_for_amax(amax: f32, elem_emax: i32) -> u8 {
    if amax.is_nan() || amax.is_infinite() {
        return NAN;
    }
    let bits = amax.to_bits() & 0x7FFF_FFFF;
    if bits == 0 {
        return from_exponent(MIN_EXP);
    }
    // floor_log2_bits is in -149..=127; saturating_sub keeps any elem_emax from overflowing.
    from_exponent(floor_log2_bits(bits).saturating_sub(elem_emax))
}
