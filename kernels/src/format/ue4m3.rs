//! UE4M3: E4M3 used as an unsigned scale (the NVFP4 per-16-element block scale).
//!
//! NVIDIA NVFP4 (Blackwell block-scaled MMA, cuBLASLt `CUDA_R_UE4M3` scale mode): the bit
//! layout of OFP8 E4M3 ([`super::e4m3`], bias 7, 3 mantissa bits) with the sign bit 0, values
//! `0 ..= 448`, `0x7F` is NaN. The scale is positive by construction, so the decoder **ignores
//! the sign bit** (a code `0x80 | c` decodes as `c`).

use super::e4m3;

/// Largest finite value, 448.
pub const MAX: f32 = 448.0;
/// The NaN code.
pub const NAN: u8 = 0x7F;

/// Exact value of `code & 0x7F` (sign bit ignored, treated as positive); `0x7F` is NaN.
#[inline]
pub fn decode(code: u8) -> f32 {
    e4m3::decode(code & 0x7F)
}

/// Nearest UE4M3 code to `x`, ties to even, saturating at 448 (`0x7E`; +Inf too).
///
/// Negative values and NaN are not valid scales (the host computes scales from magnitudes and
/// rejects NaN before calling): **any `x` with the sign bit set (-0.0 included) gives 0, NaN
/// gives `0x7F`**. Positive values below `2^-10` give 0 (`2^-10` is a tie and rounds to 0).
#[inline]
pub fn encode_sat(x: f32) -> u8 {
    if x.is_nan() {
        return NAN;
    }
    if x.is_sign_negative() {
        return 0;
    }
    e4m3::encode_sat(x)
}
