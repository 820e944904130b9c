//! OFP8 E5M2: the wide-range MXFP8 element type.
//!
//! OCP OFP8 v1.0 §5.1 "OFP8 Binary Interchange Formats": 1 sign bit, 5 exponent bits (bias 15),
//! 2 mantissa bits, IEEE 754 conventions: exponent field 31 is ±Inf (`0x7C`/`0xFC`) or NaN
//! (`S.11111.{01,10,11}`). Max normal `1.75 * 2^15 = 57344`, min normal `2^-14`, subnormals
//! `k * 2^-16` (`k = 1..=3`), ±0.

use super::{decode_mag, encode_sat_signed8, ulp_generic, with_sign};

/// Largest finite value, `S.11110.11 = 57344`.
pub const MAX: f32 = 57344.0;
/// Exponent of the largest power of two <= [`MAX`] (MX `emax_elem`).
pub const EMAX: i32 = 15;
/// Exponent of the smallest normal value (`2^-14`).
pub const EMIN: i32 = -14;
/// Explicit mantissa bits.
pub const MANTISSA_BITS: u32 = 2;
/// Storage bits of one code.
pub const BITS: u32 = 8;

/// Largest finite magnitude code (57344).
const MAX_CODE: u32 = 0x7B;
/// The canonical positive NaN code produced by [`encode_sat`] (`0xFF` for a negative NaN).
pub const NAN: u8 = 0x7F;
/// Positive infinity (`0xFC` is negative infinity).
pub const INF: u8 = 0x7C;

/// Exact value of `code`: `0x7C`/`0xFC` are ±Inf, `0x7D..=0x7F`/`0xFD..=0xFF` NaN.
#[inline]
pub fn decode(code: u8) -> f32 {
    let c = code as u32;
    let mag = c & 0x7F;
    let v = if mag == INF as u32 {
        f32::INFINITY
    } else if mag > INF as u32 {
        return f32::NAN;
    } else {
        decode_mag(mag, MANTISSA_BITS, EMIN)
    };
    with_sign(v, c & 0x80 != 0)
}

/// Nearest E5M2 code to `x`, ties to even (one rounding from the `f32` bits), saturating.
///
/// OFP8 v1.0 §5.2 "Conversion Behavior", saturating mode (as MX §6.3 uses): values whose
/// rounded magnitude exceeds 57344 (everything `> 57344`) and ±Inf give ±57344
/// (`0x7B`/`0xFB`) — never ±Inf; NaN gives the canonical NaN `0x7F` with the sign of `x`
/// (`0xFF` when negative). Below the smallest subnormal `2^-16` values round to ±0 or
/// ±`2^-16` (ties to even); the sign is kept, so -0.0 gives `0x80`.
#[inline]
pub fn encode_sat(x: f32) -> u8 {
    encode_sat_signed8(x, MANTISSA_BITS, EMIN, MAX_CODE, NAN)
}

/// Spacing of E5M2 values at magnitude `|v|`: `2^(max(floor(log2|v|), -14) - 2)`, capped at the
/// top binade's 8192 for `|v| >= 32768` (Inf included); NaN gives NaN.
#[inline]
pub fn ulp(v: f32) -> f32 {
    ulp_generic(v, MANTISSA_BITS, EMIN, EMAX)
}
