//! bfloat16: the unscaled 16-bit operand of W4A16 (activations in bf16, 4-bit weights).
//!
//! The upper half of an IEEE 754 binary32: 1 sign bit, 8 exponent bits (bias 127), 7 mantissa
//! bits. Max finite `(2 − 2^-7)·2^127`, min normal `2^-126`, subnormals `k·2^-133`; ±Inf and NaN as
//! in f32. A code is 16 bits, stored little-endian.

use super::ulp_generic;

/// Largest finite value, `0x7F7F`.
pub const MAX: f32 = f32::from_bits(0x7F7F_0000);
/// Exponent of the largest power of two <= [`MAX`].
pub const EMAX: i32 = 127;
/// Exponent of the smallest normal value.
pub const EMIN: i32 = -126;
/// Explicit mantissa bits.
pub const MANTISSA_BITS: u32 = 7;
/// Storage bits of one code.
pub const BITS: u32 = 16;

/// Exact value of `code` (Inf and NaN included).
#[inline]
pub fn decode(code: u16) -> f32 {
    f32::from_bits((code as u32) << 16)
}

/// Nearest bf16 to `x`, ties to even, saturating like the other encoders: finite values that
/// round past [`MAX`] and ±Inf give ±MAX; NaN gives a quiet NaN with the sign of `x`.
#[inline]
pub fn encode_sat(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x0040) as u16;
    }
    let r = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
    if r & 0x7F80 == 0x7F80 {
        // Rounded (or was) past the top binade: ±MAX.
        (r & 0x8000) | 0x7F7F
    } else {
        r
    }
}

/// Spacing of bf16 values at magnitude `|v|`; NaN gives NaN.
#[inline]
pub fn ulp(v: f32) -> f32 {
    ulp_generic(v, MANTISSA_BITS, EMIN, EMAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_finite_code_and_rounds_to_nearest_even() {
        for c in 0..=u16::MAX {
            let v = decode(c);
            if v.is_finite() {
                assert_eq!(encode_sat(v).to_be_bytes(), c.to_be_bytes(), "{c:#x}");
            }
        }
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
        assert_eq!(encode_sat(1.0 + 2f32.powi(-8)), 0x3F80);
        assert_eq!(encode_sat(1.0 + 3.0 * 2f32.powi(-8)), 0x3F82);
        assert_eq!(encode_sat(f32::INFINITY), 0x7F7F);
        assert_eq!(encode_sat(-f32::MAX), 0xFF7F);
        assert!(decode(encode_sat(f32::NAN)).is_nan());
    }
}
