//! IEEE 754 binary16 (fp16): the other unscaled 16-bit operand type of the 16-bit GEMMs.
//!
//! 1 sign bit, 5 exponent bits (bias 15), 10 mantissa bits. Max finite `65504`, min normal
//! `2^-14`, subnormals `k·2^-24`; exponent field 31 is ±Inf (`0x7C00`/`0xFC00`) or NaN. A code is
//! 16 bits, stored little-endian. The exponent range is E5M2's, so the generic binary-format
//! helpers of this module decode and round it.

use super::{decode_mag, rne_mag_code, ulp_generic, with_sign};

/// Largest finite value, `0x7BFF`.
pub const MAX: f32 = 65504.0;
/// Exponent of the largest power of two <= [`MAX`].
pub const EMAX: i32 = 15;
/// Exponent of the smallest normal value.
pub const EMIN: i32 = -14;
/// Explicit mantissa bits.
pub const MANTISSA_BITS: u32 = 10;
/// Storage bits of one code.
pub const BITS: u32 = 16;

/// Largest finite magnitude code.
const MAX_CODE: u32 = 0x7BFF;
/// Positive infinity.
const INF: u32 = 0x7C00;

/// Exact value of `code` (Inf and NaN included).
#[inline]
pub fn decode(code: u16) -> f32 {
    let c = code as u32;
    let mag = c & 0x7FFF;
    let v = if mag == INF {
        f32::INFINITY
    } else if mag > INF {
        return f32::NAN;
    } else {
        decode_mag(mag, MANTISSA_BITS, EMIN)
    };
    with_sign(v, c & 0x8000 != 0)
}

/// Nearest fp16 to `x`, ties to even (one rounding from the `f32` bits), saturating like the
/// other encoders: finite values that round past [`MAX`] and ±Inf give ±MAX; NaN gives the quiet
/// NaN `0x7E00` with the sign of `x`.
#[inline]
pub fn encode_sat(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    if x.is_nan() {
        return sign | 0x7E00;
    }
    let q = rne_mag_code(bits & 0x7FFF_FFFF, MANTISSA_BITS, EMIN);
    (if q > MAX_CODE { MAX_CODE } else { q }) as u16 | sign
}

/// Spacing of fp16 values at magnitude `|v|`; NaN gives NaN.
#[inline]
pub fn ulp(v: f32) -> f32 {
    ulp_generic(v, MANTISSA_BITS, EMIN, EMAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_finite_code_and_rounds_to_nearest_even_with_saturation() {
        for c in 0..=u16::MAX {
            let v = decode(c);
            if v.is_finite() {
                assert_eq!(encode_sat(v), c, "{c:#x}");
            } else if c & 0x7FFF == 0x7C00 {
                assert_eq!(
                    v,
                    if c & 0x8000 == 0 {
                        f32::INFINITY
                    } else {
                        f32::NEG_INFINITY
                    }
                );
            } else {
                assert!(v.is_nan(), "{c:#x}");
            }
        }
        assert_eq!(decode(0x0001), 2f32.powi(-24));
        assert_eq!(decode(0x0400), 2f32.powi(-14));
        assert_eq!(decode(0x3C00), 1.0);
        assert_eq!(decode(0x7BFF), MAX);
        // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0).
        assert_eq!(encode_sat(1.0 + 2f32.powi(-11)), 0x3C00);
        assert_eq!(encode_sat(1.0 + 3.0 * 2f32.powi(-11)), 0x3C02);
        // Half the smallest subnormal ties to 0; just above it rounds up.
        assert_eq!(encode_sat(2f32.powi(-25)), 0);
        assert_eq!(encode_sat(2f32.powi(-25) * 1.5), 1);
        // Past the top: saturate (IEEE would give Inf from 65520 up).
        assert_eq!(encode_sat(65519.0), 0x7BFF);
        assert_eq!(encode_sat(70000.0), 0x7BFF);
        assert_eq!(encode_sat(f32::INFINITY), 0x7BFF);
        assert_eq!(encode_sat(f32::NEG_INFINITY), 0xFBFF);
        assert_eq!(encode_sat(-0.0), 0x8000);
        assert!(decode(encode_sat(f32::NAN)).is_nan());
        assert_eq!(ulp(1.0), 2f32.powi(-10));
        assert_eq!(ulp(1e-6), 2f32.powi(-24));
    }
}
