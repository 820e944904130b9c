//! FP4 E2M1: the MX / NVFP4 4-bit element type.
//!
//! OCP MX v1.0 §5.3.3 "FP4": 1 sign bit, 2 exponent bits (bias 1), 1 mantissa bit; no
//! infinities, no NaN. Magnitudes `{0, 0.5, 1, 1.5, 2, 3, 4, 6}` for codes `0..=7`; bit 3 is
//! the sign (so `0x8` is -0). Codes are packed two per byte, element `2i` in the low nibble
//! (bits 0–3), element `2i+1` in the high nibble (bits 4–7), as CUDA `__nv_fp4x2_e2m1`,
//! PyTorch `torch.float4_e2m1fn_x2` and CUTLASS `float_e2m1_t` arrays store them.

use super::{decode_mag, rne_mag_code, ulp_generic, with_sign};

/// Largest finite value, `1.5 * 2^2`.
pub const MAX: f32 = 6.0;
/// Exponent of the largest power of two <= [`MAX`] (MX `emax_elem`).
pub const EMAX: i32 = 2;
/// Exponent of the smallest normal value (1.0).
pub const EMIN: i32 = 0;
/// Explicit mantissa bits.
pub const MANTISSA_BITS: u32 = 1;
/// Storage bits of one code.
pub const BITS: u32 = 4;

/// Largest finite magnitude code (6.0).
const MAX_CODE: u32 = 0x7;

/// Exact value of the code in the low 4 bits of `code` (the high bits are ignored).
#[inline]
pub fn decode(code: u8) -> f32 {
    let c = (code & 0xF) as u32;
    with_sign(decode_mag(c & 0x7, MANTISSA_BITS, EMIN), c & 0x8 != 0)
}

/// Nearest E2M1 code to `x`, ties to even (one rounding from the `f32` bits), saturating.
///
/// MX v1.0 §6.3 quantizes elements with round-to-nearest-even and clamps normal values to the
/// element maximum: `|x| > 6` (and ±Inf) gives ±6. Magnitudes below 0.25 give ±0, exactly 0.25
/// gives ±0 (tie to even), and the sign of `x` is kept (so -0.0 and tiny negatives give `0x8`).
/// E2M1 has no NaN: **NaN gives `0x0` (+0)**; the host quantizer rejects NaN before calling.
/// The result is in the low nibble.
#[inline]
pub fn encode_sat(x: f32) -> u8 {
    if x.is_nan() {
        return 0;
    }
    let bits = x.to_bits();
    let q = rne_mag_code(bits & 0x7FFF_FFFF, MANTISSA_BITS, EMIN);
    let q = if q > MAX_CODE { MAX_CODE } else { q };
    (q | ((bits >> 31) << 3)) as u8
}

/// Spacing of E2M1 values at magnitude `|v|`: 0.5 below 2, 1 in `[2, 4)`, 2 from 4 up
/// (Inf included); NaN gives NaN.
#[inline]
pub fn ulp(v: f32) -> f32 {
    ulp_generic(v, MANTISSA_BITS, EMIN, EMAX)
}

/// Pack two codes into one byte: `lo` (element `2i`) in bits 0–3, `hi` (element `2i+1`) in
/// bits 4–7. Only the low 4 bits of each argument are used.
#[inline]
pub fn pack(lo: u8, hi: u8) -> u8 {
    (lo & 0xF) | ((hi & 0xF) << 4)
}

/// Split a byte into `(lo, hi)`: element `2i` from bits 0–3, element `2i+1` from bits 4–7.
#[inline]
pub fn unpack(byte: u8) -> (u8, u8) {
    (byte & 0xF, byte >> 4)
}
