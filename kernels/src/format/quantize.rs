//! The quantizers' per-block rules, one source for the host's quantizers
//! (`blockscaled::ScaledMatrix::quantize`) and the device's ([`crate::quantize`]): a block's scale
//! from its largest magnitude, and an element's code from its value and the block's divisor.
//! The rules themselves (OCP MX v1.0 §6.3 for e8m0, NVFP4's two levels, `amax / max` for fp32)
//! are stated in the host's `quantize` module documentation.

use super::{ElemType, ScaleType, e4m3, e8m0, ue4m3};

/// What an element is divided by before it is encoded.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Divisor {
    /// The block is all zeros: every element encodes zero.
    Zero,
    /// An exact f32 (an e8m0 power of two or an fp32 scale): the quotient is one correctly
    /// rounded f32 division. (The f64 quotient rounded to f32 is the same number: double rounding
    /// of a quotient through 53 bits to 24 is innocuous, 53 ≥ 2·24 + 2.)
    F32(f32),
    /// NVFP4's ue4m3 block scale times the fp32 tensor scale, exact in f64 (4 + 24 significant
    /// bits): the quotient is taken in f64 and rounded once to f32, with no underflow of the
    /// product of two small scales.
    F64(f64),
}

/// The scale bits (an e8m0 or ue4m3 code, or fp32 bits) of a block whose largest magnitude is
/// `amax` (finite, ≥ 0), and what its elements are divided by.
#[inline]
pub fn block_scale(
    scale: ScaleType,
    elem: ElemType,
    amax: f32,
    tensor_scale: f32,
) -> (u32, Divisor) {
    if elem.is_16bit() {
        // bf16 and fp16 are rounded as they are, with the neutral scale (bf16 holds every f32
        // magnitude; fp16 saturates past ±65504, as its encoder documents).
        return (1f32.to_bits(), Divisor::F32(1.0));
    }
    match scale {
        ScaleType::E8M0 => {
            let code = e8m0::mx_scale_for_amax(amax, elem.emax());
            (code as u32, Divisor::F32(e8m0::decode(code)))
        }
        ScaleType::UE4M3 => {
            // A block far below the tensor's largest one can round its scale to the code 0; that
            // would flush every element of the block to zero. Its smallest non-zero scale (2^-9,
            // code 1) keeps the elements representable, each within the element format's bound.
            // The ratio is taken in f64: `amax / elem.max()` alone can underflow when the tensor
            // scale is subnormal.
            let ratio = amax as f64 / (elem.max() as f64 * tensor_scale as f64);
            let code = match ue4m3::encode_sat(ratio as f32) {
                0 if amax > 0.0 => 1,
                c => c,
            };
            let d = ue4m3::decode(code) as f64 * tensor_scale as f64;
            (
                code as u32,
                if d == 0.0 {
                    Divisor::Zero
                } else {
                    Divisor::F64(d)
                },
            )
        }
        ScaleType::F32 => {
            let s = if amax == 0.0 {
                1.0
            } else {
                ratio_scale(amax, elem.max())
            };
            (s.to_bits(), Divisor::F32(s))
        }
    }
}

/// The maximum of magnitudes' bits that stands for "NaN or ±Inf here" (above every finite
/// magnitude's bits and +Inf's).
pub const NON_FINITE: u32 = 0x7FFF_FFFF;

/// `|x|`'s bits, or [`NON_FINITE`]: non-negative f32 bits order as the values, so maxima of
/// magnitudes are integer maxima (`red.max`, shuffles).
#[inline(always)]
pub fn magnitude_bits(x: f32) -> u32 {
    let b = x.to_bits() & 0x7FFF_FFFF;
    if b >= 0x7F80_0000 { NON_FINITE } else { b }
}

/// [`block_scale`] of a block whose largest magnitude's bits are `m` (from [`magnitude_bits`]):
/// a block that holds a NaN or ±Inf, or a NaN tensor scale, gets the NaN scale (e8m0 `0xFF`,
/// ue4m3 `0x7F`, fp32 NaN) and a NaN divisor, so every product with the block is NaN.
#[inline(always)]
pub fn block_scale_of_bits(
    scale: ScaleType,
    elem: ElemType,
    m: u32,
    tensor_scale: f32,
) -> (u32, Divisor) {
    if m == NON_FINITE || tensor_scale.is_nan() {
        let nan = match scale {
            ScaleType::E8M0 => 0xFF,
            ScaleType::UE4M3 => 0x7F,
            ScaleType::F32 => f32::NAN.to_bits(),
        };
        (nan, Divisor::F32(f32::NAN))
    } else {
        block_scale(scale, elem, f32::from_bits(m), tensor_scale)
    }
}

/// NVFP4's fp32 tensor scale for a tensor whose largest magnitude is `amax`: `amax / (448 · 6)`
/// by [`ratio_scale`]'s rule, 1 for an all-zero tensor.
#[inline]
pub fn nvfp4_tensor_scale(amax: f32, elem: ElemType) -> f32 {
    if amax == 0.0 {
        1.0
    } else {
        ratio_scale(amax, e4m3::MAX * elem.max())
    }
}

/// The code of element `x` of a block with divisor `d`, rounded to nearest even and saturated.
#[inline]
pub fn quantize_element(elem: ElemType, x: f32, d: Divisor) -> u32 {
    match d {
        Divisor::Zero => elem.encode_sat(0.0),
        Divisor::F32(s) => elem.encode_sat(x / s),
        Divisor::F64(s) => elem.encode_sat((x as f64 / s) as f32),
    }
}

/// `amax / max` (both positive, finite) as an f32 scale: the nearest f32 where that is normal;
/// below f32's normal range rounded up to a multiple of 2^-149 (the subnormal spacing), so that it
/// is not zero and `amax / scale <= max` (a subnormal rounded to nearest can lose a third of the
/// value, and the block maximum would saturate by as much).
#[inline]
pub fn ratio_scale(amax: f32, max: f32) -> f32 {
    let s = amax / max;
    if s >= f32::MIN_POSITIVE {
        return s;
    }
    // amax · 2^149 is an integer below 2^23 · max (amax is a multiple of 2^-149), exact in f64, and
    // so is its quotient by max whenever that is an integer: the ceiling is exact. (`f64::ceil`
    // is not in `core`: truncation, plus one when something was cut.)
    let two_149 = f64::from_bits((1023 + 149) << 52);
    let q = amax as f64 * two_149 / max as f64;
    let t = q as u64;
    let units = if (t as f64) < q { t + 1 } else { t };
    f32::from_bits(units as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_scale_rounds_subnormal_ratios_up() {
        assert_eq!(ratio_scale(448.0, 448.0), 1.0);
        let tiny = f32::from_bits(3); // 3 · 2^-149
        assert_eq!(ratio_scale(tiny, 448.0).to_bits(), 1);
        let s = ratio_scale(f32::MIN_POSITIVE, 6.0);
        assert!(
            f32::MIN_POSITIVE / s <= 6.0 && s.to_bits() == (f32::MIN_POSITIVE.to_bits() / 6) + 1
        );
    }

    #[test]
    fn f32_quotients_equal_f64_quotients_rounded_once() {
        let mut x = 0x1234_5678u32;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let a = f32::from_bits(x & 0x7F7F_FFFF);
            let s = f32::from_bits((x.rotate_left(11) & 0x3FFF_FFFF) | 0x0080_0000);
            assert_eq!(
                (a / s).to_bits(),
                ((a as f64 / s as f64) as f32).to_bits(),
                "{a} / {s}"
            );
        }
    }
}
