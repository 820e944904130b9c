//! OFP8 E4M3 (E4M3FN): the MXFP8 element type and, unsigned, the NVFP4 block scale.
//!
//! OCP OFP8 v1.0 §5.1 "OFP8 Binary Interchange Formats": 1 sign bit, 4 exponent bits (bias 7),
//! 3 mantissa bits. Exponent field 15 holds normal values except `S.1111.111`, the only NaN
//! (`0x7F`, `0xFF`); there are no infinities. Max normal `1.75 * 2^8 = 448`, min normal `2^-6`,
//! subnormals `k * 2^-9` (`k = 1..=7`), ±0.

use super::{decode_mag, encode_sat_signed8, ulp_generic, with_sign};

/// Largest finite value, `S.1111.110 = 448`.
pub const MAX: f32 = 448.0;
/// Exponent of the largest power of two <= [`MAX`] (MX `emax_elem`).
pub const EMAX: i32 = 8;
/// Exponent of the smallest normal value (`2^-6`).
pub const EMIN: i32 = -6;
/// Explicit mantissa bits.
pub const MANTISSA_BITS: u32 = 3;
/// Storage bits of one code.
pub const BITS: u32 = 8;

/// Largest finite magnitude code (448).
const MAX_CODE: u32 = 0x7E;
/// The positive NaN code (`0xFF` is the negative one).
pub const NAN: u8 = 0x7F;

/// Exact value of `code`; `0x7F`/`0xFF` are NaN.
#[inline]
pub fn decode(code: u8) -> f32 {
    let c = code as u32;
    if c & 0x7F == 0x7F {
        return f32::NAN;
    }
    with_sign(decode_mag(c & 0x7F, MANTISSA_BITS, EMIN), c & 0x80 != 0)
}

/// Nearest E4M3 code to `x`, ties to even (one rounding from the `f32` bits), saturating.
///
/// OFP8 v1.0 §5.2 "Conversion Behavior", saturating mode (the mode MX §6.3 and NVFP4
/// quantization use): values whose rounded magnitude exceeds 448 (everything `> 448`, i.e.
/// `[464, ...)` as well as `(448, 464)`) and ±Inf give ±448 (`0x7E`/`0xFE`); NaN gives NaN with
/// the sign of `x` (`0x7F` or `0xFF`). Below the smallest subnormal `2^-9` values round to ±0 or
/// ±`2^-9` (`2^-10` exactly is a tie and gives ±0); the sign is kept, so -0.0 gives `0x80`.
#[inline]
pub fn encode_sat(x: f32) -> u8 {
    encode_sat_signed8(x, MANTISSA_BITS, EMIN, MAX_CODE, NAN)
}

/// Spacing of E4M3 values at magnitude `|v|`: `2^(max(floor(log2|v|), -6) - 3)` (so the
/// subnormal spacing `2^-9` below `2^-6`), capped at the top binade's 32 for `|v| >= 256`
/// (Inf included); NaN gives NaN.
#[inline]
pub fn ulp(v: f32) -> f32 {
    ulp_generic(v, MANTISSA_BITS, EMIN, EMAX)
}
