//! FP4 E2M1: the MX / NVFP4 4-bit element type.
//!
//! OCP MX v1.0 §5.3.3 "FP4": 1 sign bit, 2 exponent bits (bias 1), 1 mantissa bit; no
//! infinities, no NaN. Magnitudes `{0, 0.5, 1, 1.5, 2, 3, 4, 6}` for codes `0..=7`; bit 3 is
//! the sign (so `0x8` is -0). Codes are packed two per byte, element `2i` in the low nibble
//! (bits 0–3), element `2i+1` in the high nibble (bits 4–7), as CUDA `__nv_fp4x2_e2m1`,
//! PyTorch `torch.float4_e2m1fn_x2` and CUTLASS `float_e2m1_t` arrays store them.

use super::{decode_mag, ulp_generic, with_sign};

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
#[cfg(test)]
const MAX_CODE: u32 = 0x7;

/// Exact value of the code in the low 4 bits of `code` (the high bits are ignored).
#[inline]
pub fn decode(code: u8) -> f32 {
    let c = (code & 0xF) as u32;
    with_sign(decode_mag(c & 0x7, MANTISSA_BITS, EMIN), c & 0x8 != 0)
}

/// The rounding boundaries of the magnitudes: the midpoints between neighbouring ones, and
/// whether a tie there goes up (to the even code above) or down.
pub const BOUNDS: [(f32, bool); 7] = [
    (0.25, false),
    (0.75, true),
    (1.25, false),
    (1.75, true),
    (2.5, false),
    (3.5, true),
    (5.0, false),
];

/// Nearest E2M1 code to `x`, ties to even (one rounding from the `f32` bits), saturating.
///
/// MX v1.0 §6.3 quantizes elements with round-to-nearest-even and clamps normal values to the
/// element maximum: `|x| > 6` (and ±Inf) gives ±6. Magnitudes below 0.25 give ±0, exactly 0.25
/// gives ±0 (tie to even), and the sign of `x` is kept (so -0.0 and tiny negatives give `0x8`).
/// E2M1 has no NaN: **NaN gives `0x0` (+0)**; the host quantizer rejects NaN before calling.
/// The result is in the low nibble.
///
/// The magnitude code is the number of [`BOUNDS`] `|x|` is past (`>=` where the tie goes up,
/// `>` where not): 0.25 → 0, 0.75 → 1, 1.25 → 1, 1.75 → 2, 2.5 → 2, 3.5 → 4, 5 → 4 (ties to
/// even), and past 5 it saturates at 6; NaN is past none. Seven comparisons and no branch (the
/// device quantizers' rule until v50, about 28 instructions an element there; they now take
/// [`encode_sat_finite`]). Equal to the general rounding from the bits (`rne_mag_code`, the
/// rule of the other formats) on every f32 (the test below; once, by hand, all 2^32 bit
/// patterns).
#[inline]
pub fn encode_sat(x: f32) -> u8 {
    let above = |a: f32, bound: f32, up: bool| {
        ((if up { a >= bound } else { a > bound }) as u32).wrapping_neg()
    };
    let a = f32::from_bits(x.to_bits() & 0x7FFF_FFFF);
    let mut past = 0u32;
    // (An index loop: an array's by-value iterator stayed a loop on the device, the table in
    // local memory.)
    #[allow(clippy::needless_range_loop)]
    for i in 0..BOUNDS.len() {
        past = past.wrapping_add(above(a, BOUNDS[i].0, BOUNDS[i].1));
    }
    // The sign bit, except for NaN (`a <= Inf` is false only there).
    let sign = if above(f32::INFINITY, a, true) != 0 {
        (x.to_bits() >> 31) << 3
    } else {
        0
    };
    (past.wrapping_neg() | sign) as u8
}

/// [`encode_sat`] of every `x` but NaN (the code in the low nibble), by one rounding addition
/// instead of seven comparisons: the device quantizers' and quantized outputs' e2m1 rule (Hopper
/// has no e2m1 conversion instruction; the comparisons took about 28 instructions an element,
/// this about 9 with the packing).
///
/// `|x|` saturated at 6 (`min_abs(x, 6)`: ±Inf too) lies in one of three ranges of E2M1's
/// magnitudes, spaced 0.5 below 2, 1 in [2, 4) and 2 from 4. Adding `M = 2^(22 + j)` (range
/// `j`, from the exponent of `|x|`), whose ulp is that spacing, rounds `|x|` to it once, to
/// nearest even; E2M1's even codes are the multiples of twice the spacing, as are f32's even
/// significands there, so the ties go as [`BOUNDS`] says. The constant added is `M` plus `2j`
/// ulps (an even number of them: the rounding and its ties are `M`'s), so the sum's bits less
/// `M`'s are `|x|` in units of the spacing plus `2j`: the magnitude code itself (0.5 → 1, 2 → 4,
/// 3 → 5, 4 → 6, 6 → 7; a value rounding up to the next range's first magnitude lands on its
/// code). The code is at most 7 and `M`'s low 23 bits are zero, so it is the sum's low three
/// bits (v50 subtracted `M` and added `2j` an element instead). The sign bit is `x`'s.
/// `min_abs` and `add` are the caller's (the device's `min.f32` of an `abs.f32` operand, and
/// `add.rn.f32`; the host's, to test it): each must return `min(|x|, 6)` and the sum rounded
/// once to nearest even. A NaN `x` gives a code of no use: the device quantizers see NaN
/// quotients only in a block whose scale is NaN, all of whose codes they set to +0
/// (`encode_sat`'s NaN). Equal to `encode_sat` on every other f32 (the tests below: sampled, and
/// all 2^32 bit patterns by hand).
#[inline(always)]
pub fn encode_sat_finite(
    x: f32,
    min_abs: impl Fn(f32, f32) -> f32,
    add: impl Fn(f32, f32) -> f32,
) -> u32 {
    let a = min_abs(x, MAX);
    // The biased exponent, 127 at most below 2 (range 0), 128 in [2, 4), 129 from 4 (|x| ≤ 6).
    let e = (a.to_bits() >> 23).max(127);
    let t = add(a, f32::from_bits(((e + 22) << 23) + 2 * (e - 127)));
    (t.to_bits() & 7) | (x.to_bits() >> 28 & 8)
}

/// [`encode_sat`] by the general rounding from the bits (`rne_mag_code`): what the comparisons
/// are tested against.
#[cfg(test)]
fn encode_sat_by_rounding(x: f32) -> u8 {
    if x.is_nan() {
        return 0;
    }
    let bits = x.to_bits();
    let q = super::rne_mag_code(bits & 0x7FFF_FFFF, MANTISSA_BITS, EMIN);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// [`encode_sat_finite`] with the host's operations.
    fn by_addition(x: f32) -> u8 {
        encode_sat_finite(x, |a, b| a.abs().min(b), |a, b| a + b) as u8
    }

    /// `check` of every 4099th bit pattern (both signs, every exponent), and of 4096 patterns
    /// on each side of each of `values` (both signs).
    fn sampled(values: &[f32], check: impl Fn(f32)) {
        let mut bits = 0u32;
        loop {
            check(f32::from_bits(bits));
            match bits.checked_add(4099) {
                Some(b) => bits = b,
                None => break,
            }
        }
        for v in values {
            for sign in [0, 0x8000_0000u32] {
                let b = v.to_bits() | sign;
                for d in 0..4096u32 {
                    check(f32::from_bits(b.wrapping_add(d)));
                    check(f32::from_bits(b.wrapping_sub(d)));
                }
            }
        }
    }

    /// Every boundary and code value.
    const VALUES: [f32; 15] = [
        0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0,
    ];

    #[test]
    fn the_rounding_addition_equals_the_comparisons_on_every_number() {
        // (Sampled, and around 7 and Inf too; all 2^32 patterns in the ignored test below.)
        let check = |x: f32| {
            if !x.is_nan() {
                assert_eq!(by_addition(x), encode_sat(x), "{x:e} ({:#x})", x.to_bits());
            }
        };
        sampled(&VALUES, check);
        sampled(&[7.0, f32::INFINITY], check);
    }

    /// All 2^32 bit patterns but NaN (about 20 s in a release build): run by hand with
    /// `--ignored`.
    #[test]
    #[ignore = "exhaustive: run by hand"]
    fn the_rounding_addition_equals_the_comparisons_everywhere() {
        for bits in 0..=u32::MAX {
            let x = f32::from_bits(bits);
            if !x.is_nan() {
                assert_eq!(by_addition(x), encode_sat(x), "{x:e} ({bits:#x})");
            }
        }
    }

    #[test]
    fn comparisons_equal_the_rounding_from_the_bits() {
        sampled(&VALUES, |x| {
            assert_eq!(
                encode_sat(x),
                encode_sat_by_rounding(x),
                "{x:e} ({:#x})",
                x.to_bits()
            );
        });
        for x in [
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::NAN,
            -f32::NAN,
        ] {
            assert_eq!(encode_sat(x), encode_sat_by_rounding(x), "{x:e}");
        }
    }

    /// All 2^32 bit patterns (minutes in a debug build): run by hand with `--ignored`.
    #[test]
    #[ignore = "exhaustive: run by hand"]
    fn comparisons_equal_the_rounding_from_the_bits_everywhere() {
        for bits in 0..=u32::MAX {
            let x = f32::from_bits(bits);
            assert_eq!(
                encode_sat(x),
                encode_sat_by_rounding(x),
                "{x:e} ({bits:#x})"
            );
        }
    }
}
