//! The quantizers' per-block rules, one source for the host's quantizers
//! (`blockscaled::ScaledMatrix::quantize`) and the device's ([`crate::quantize`]): a block's scale
//! from its largest magnitude, and an element's code from its value and the block's divisor.
//! The rules themselves (OCP MX v1.0 §6.3 for e8m0, NVFP4's two levels, `amax / max` for fp32)
//! are stated in the host's `quantize` module documentation.

use super::{ElemType, ScaleType, e4m3, e5m2, e8m0, ue4m3};

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

/// The largest [`magnitude_bits`] of `xs`: the largest of the bits with the sign cleared, mapped
/// once (the map to [`NON_FINITE`] is monotone, so it commutes with the maximum: an instruction
/// an element less than mapping each).
#[inline(always)]
pub fn max_magnitude_bits(xs: &[f32]) -> u32 {
    let mut m = 0;
    // (An index loop: it unrolls over a fixed-size array on the device, where an iterator over
    // an array kept some loops rolled.)
    #[allow(clippy::needless_range_loop)]
    for i in 0..xs.len() {
        m = m.max(xs[i].to_bits() & 0x7FFF_FFFF);
    }
    if m >= 0x7F80_0000 { NON_FINITE } else { m }
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

/// [`ratio_scale`] of an FP8 block's largest magnitude `amax` (finite, positive) by the element
/// type's largest value (448 or 57344), without a division where the scale is a normal f32
/// (`amax ≥ max · 2^-126`): [`Reciprocal`]'s product and two `fma` by the constant `1 / max`
/// (the device's fused FP8 output: a division is about twenty instructions and its slow-path
/// call, in series with the row's codes). Both maxima are 7 · 2^k, so every remainder of a normal
/// quotient is a multiple of 2^-149 · 2^6 (representable): the result is the division's, checked
/// for every such `amax` of both types (all 4.06 · 10^9 patterns, once by hand; a test samples
/// them). Below that, and for other element types, the division of [`ratio_scale`].
#[inline(always)]
pub fn fp8_ratio_scale(
    amax: f32,
    elem: ElemType,
    mul: impl Fn(f32, f32) -> f32,
    fma: impl Fn(f32, f32, f32) -> f32,
) -> f32 {
    const R4: f32 = 1.0 / e4m3::MAX;
    const R5: f32 = 1.0 / e5m2::MAX;
    let rec = match elem {
        ElemType::E4M3 => Reciprocal {
            k: 1.0,
            s: e4m3::MAX,
            r: R4,
        },
        ElemType::E5M2 => Reciprocal {
            k: 1.0,
            s: e5m2::MAX,
            r: R5,
        },
        _ => return ratio_scale(amax, elem.max()),
    };
    if amax >= rec.s * f32::MIN_POSITIVE {
        rec.quotient_unit(amax, mul, fma)
    } else {
        ratio_scale(amax, rec.s)
    }
}

/// A block's f32 divisor `s`, prepared so that each element's quotient `x / s` costs a product
/// and two fused multiply-adds instead of a division (the device quantizers' and the fused
/// output's [`Divisor::F32`] quotients): with `r` the correctly rounded `1/s`, `q = x·r` is
/// within an ulp of `x / s`, the remainder `x − q·s` is exact in one `fma`, and `q + rem·r`
/// rounds to the correctly rounded quotient (Markstein's theorem: Muller et al., *Handbook of
/// Floating-Point Arithmetic*, §5.? "Newton–Raphson-based division with an FMA", for `r`
/// within half an ulp of `1/s` and `q` within an ulp of `x / s`, without underflow or overflow).
/// The theorem's conditions are kept by a power-of-two prescaling `k` of both operands (exact):
/// `s·k` is in [2^-85, 2^120], so `r` is normal, and the remainder of every quotient of
/// magnitude ≥ 2^-18 is a multiple of at least 2^-149 (representable: no underflow). Smaller
/// quotients may be off by an ulp, which no code sees: they round to ±0 in every element type
/// (the smallest nonzero FP8 magnitude is 2^-16; FP4's blocks divide by e8m0 powers of two,
/// where `r` is exact and so is every quotient). The operations are the caller's (the device's
/// `mul.rn` / `fma.rn` / `rcp.rn`; the host's, to test it): one rounding each.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reciprocal {
    /// The prescaling of both operands (1, 2^64 or 2^-64).
    pub k: f32,
    /// `s · k`.
    pub s: f32,
    /// `1 / (s · k)`, correctly rounded.
    pub r: f32,
}

impl Reciprocal {
    /// The divisor `s` (positive, or NaN: every quotient is then NaN), `recip` the correctly
    /// rounded reciprocal.
    #[inline(always)]
    pub fn new(s: f32, recip: impl Fn(f32) -> f32) -> Self {
        const LOW: f32 = f32::from_bits((127 - 85) << 23);
        const HIGH: f32 = f32::from_bits((127 + 120) << 23);
        let k = if s < LOW {
            f32::from_bits((127 + 64) << 23)
        } else if s > HIGH {
            f32::from_bits((127 - 64) << 23)
        } else {
            1.0
        };
        let s = s * k;
        Reciprocal { k, s, r: recip(s) }
    }

    /// `x / s` correctly rounded (for quotients of magnitude ≥ 2^-18: see the type), by `mul` and
    /// `fma` (each rounded once to nearest even).
    #[inline(always)]
    pub fn quotient(
        self,
        x: f32,
        mul: impl Fn(f32, f32) -> f32,
        fma: impl Fn(f32, f32, f32) -> f32,
    ) -> f32 {
        self.quotient_unit(mul(x, self.k), mul, fma)
    }

    /// [`Self::quotient`] of the prescaled element `y = x·k` (`x` itself where `k` is 1: one
    /// product less).
    #[inline(always)]
    pub fn quotient_unit(
        self,
        y: f32,
        mul: impl Fn(f32, f32) -> f32,
        fma: impl Fn(f32, f32, f32) -> f32,
    ) -> f32 {
        let q = mul(y, self.r);
        // The remainder negated, `q·s − y` (exact in one `fma`), and the step `q − that·r`: the
        // same value as `q + (y − q·s)·r`, rounded once. Negated, its zeros keep `x`'s sign with
        // no instruction an element to restore it (the negations are operand modifiers): for
        // `y = ±0` (`x` zero, or a prescaled `x` that underflowed) `q` is `±0`, the remainder
        // `±0·s + ∓0 = +0`, and `−(+0)·r + ±0 = ±0`; `y − q·s` would give `+0` for `−0`.
        let rem = fma(q, self.s, -y);
        fma(-rem, self.r, q)
    }

    /// `−(y / s)`, [`Self::quotient_unit`] negated, with no negation an element (`−r` is the
    /// block's, once): `n = y·(−r)` is `−q` exactly, `y + n·s` the remainder `y − q·s` (exact),
    /// and `n + rem·(−r)` the negated step, rounded once (rounding to nearest is symmetric). Its
    /// zeros are those of `−(y / s)`: for `y = ±0`, `n = ∓0`, the remainder `+0`, and `−0 + ∓0 =
    /// ∓0`. For codes whose sign is one bit (FP8: the caller flips it back, a bit of each byte
    /// of four codes), where [`Self::quotient_unit`] negates `y` once an element for its
    /// remainder.
    #[inline(always)]
    pub fn neg_quotient_unit(
        self,
        y: f32,
        mul: impl Fn(f32, f32) -> f32,
        fma: impl Fn(f32, f32, f32) -> f32,
    ) -> f32 {
        let n = mul(y, -self.r);
        let rem = fma(n, self.s, y);
        fma(rem, -self.r, n)
    }
}

/// NVFP4's f64 divisor ([`Divisor::F64`]: a ue4m3 scale times the fp32 tensor scale), prepared
/// so that each element's quotient costs a product and two `fma` in f64 instead of a division:
/// the same Markstein step as [`Reciprocal`], in f64, where every operand stays normal (`s` is in
/// [2^-158, 2^137], `|x|` in [2^-149, 2^128] or zero: the quotient, the remainder and `1/s` are far
/// inside f64's range), so the f64 quotient is the correctly rounded `x / s` for every `x` and
/// rounding it to f32 gives the host's `(x as f64 / s) as f32`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reciprocal64 {
    /// The divisor.
    pub s: f64,
    /// `1 / s`, correctly rounded.
    pub r: f64,
}

impl Reciprocal64 {
    /// The divisor `s` (positive), `recip` the correctly rounded reciprocal.
    #[inline(always)]
    pub fn new(s: f64, recip: impl Fn(f64) -> f64) -> Self {
        Reciprocal64 { s, r: recip(s) }
    }

    /// `x / s` correctly rounded in f64, then rounded to f32, by `mul` and `fma` (each rounded
    /// once to nearest even); the sign is `x`'s (a zero `x` gives a zero of its sign, as the
    /// division does).
    #[inline(always)]
    pub fn quotient(
        self,
        x: f32,
        mul: impl Fn(f64, f64) -> f64,
        fma: impl Fn(f64, f64, f64) -> f64,
    ) -> f32 {
        let y = x as f64;
        let q = mul(y, self.r);
        let rem = fma(q, -self.s, y);
        let q = fma(rem, self.r, q) as f32;
        f32::from_bits(q.to_bits() & 0x7FFF_FFFF | x.to_bits() & 0x8000_0000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host's quotient by [`Reciprocal`] (`f32::mul_add` is one rounding, as `fma.rn`); for
    /// divisors that need no prescaling, checks that the negated form is its negation.
    fn by_reciprocal(x: f32, s: f32) -> f32 {
        let rec = Reciprocal::new(s, |s| 1.0 / s);
        let q = rec.quotient(x, |a, b| a * b, f32::mul_add);
        if rec.k == 1.0 {
            let n = rec.neg_quotient_unit(x, |a, b| a * b, f32::mul_add);
            assert!(
                n.to_bits() == (-q).to_bits() || (n.is_nan() && q.is_nan()),
                "−({x:e} / {s:e}): {n:e}, not −{q:e}"
            );
        }
        q
    }

    #[test]
    fn reciprocal_quotients_are_the_division_wherever_a_code_can_see_them() {
        let mut z = 0x9E37_79B9u32;
        let mut next = || {
            z ^= z << 13;
            z ^= z >> 17;
            z ^= z << 5;
            z
        };
        // Divisors over the whole positive range (subnormal ones too, as `ratio_scale` makes for
        // tiny blocks), powers of two, and all-ones significands; for each, elements of every
        // exponent up to the block's maximum (448·s, the largest FP8 divisor ratio being 57344).
        let mut check = |s: f32| {
            for _ in 0..400 {
                let bits = next();
                // |x| ≤ 57344·s (the block's maximum), any sign.
                let x = f32::from_bits(bits & 0x807F_FFFF | (bits >> 8 & 0xFF) << 23);
                if !x.is_finite() || (x.abs() as f64) > 57344.0 * s as f64 {
                    continue;
                }
                let (want, got) = (x / s, by_reciprocal(x, s));
                if want.abs() >= f32::from_bits((127 - 18) << 23) {
                    assert_eq!(got.to_bits(), want.to_bits(), "{x:e} / {s:e}");
                } else {
                    assert!(
                        got.abs() < f32::from_bits((127 - 17) << 23),
                        "{x:e} / {s:e}"
                    );
                    assert_eq!(
                        got.is_sign_negative(),
                        want.is_sign_negative(),
                        "{x:e} / {s:e}"
                    );
                }
            }
        };
        for s in [
            f32::from_bits(1),
            f32::MIN_POSITIVE,
            1.0,
            448.0,
            f32::MAX / 57344.0,
        ] {
            check(s);
        }
        for e in 1..254u32 {
            check(f32::from_bits(e << 23));
            check(f32::from_bits(e << 23 | 0x7F_FFFF));
        }
        let mut w = 0x2545_F491u32;
        for _ in 0..2000 {
            w = w.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            check(f32::from_bits(w % 0x7F00_0000 + 1));
        }
        assert!(by_reciprocal(1.0, f32::NAN).is_nan());
        // Zeros, and quotients that underflow (prescaled or not), keep the element's sign.
        for s in [
            f32::from_bits(1),
            1e-30,
            1.0,
            448.0,
            1e30,
            f32::MAX / 57344.0,
        ] {
            for x in [0.0f32, f32::from_bits(1), 1e-40, 1e-30] {
                for x in [x, -x] {
                    let got = by_reciprocal(x, s);
                    assert_eq!(
                        got.is_sign_negative(),
                        x.is_sign_negative(),
                        "{x:e} / {s:e}"
                    );
                }
            }
        }
    }

    #[test]
    fn f64_reciprocal_quotients_are_the_division() {
        let mut z = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            z ^= z << 13;
            z ^= z >> 7;
            z ^= z << 17;
            z
        };
        // Every ue4m3 scale (codes 1..=126) times tensor scales over the whole f32 range, and
        // elements of every exponent and sign (zeros and subnormals too).
        for code in 1..=126u8 {
            let c = super::ue4m3::decode(code) as f64;
            for _ in 0..60 {
                let t = f32::from_bits((next() as u32) % 0x7F00_0000 + 1) as f64;
                let rec = Reciprocal64::new(c * t, |s| 1.0 / s);
                for _ in 0..50 {
                    let x = f32::from_bits(next() as u32);
                    if !x.is_finite() {
                        continue;
                    }
                    let want = (x as f64 / (c * t)) as f32;
                    let got = rec.quotient(x, |a, b| a * b, f64::mul_add);
                    assert_eq!(got.to_bits(), want.to_bits(), "{x:e} / ({c} · {t:e})");
                }
                for x in [0.0f32, -0.0, f32::from_bits(1), -f32::from_bits(1)] {
                    let want = (x as f64 / (c * t)) as f32;
                    let got = rec.quotient(x, |a, b| a * b, f64::mul_add);
                    assert_eq!(got.to_bits(), want.to_bits(), "{x:e} / ({c} · {t:e})");
                }
            }
        }
    }

    #[test]
    fn fp8_ratio_scales_are_the_division() {
        let fast = |a: f32, elem| fp8_ratio_scale(a, elem, |a, b| a * b, f32::mul_add);
        for elem in [ElemType::E4M3, ElemType::E5M2] {
            let max = elem.max();
            // Every 4099th pattern of the finite positive range, and runs around the fast
            // path's threshold and the binades' ends.
            let check = |bits: u32| {
                let a = f32::from_bits(bits);
                assert_eq!(
                    fast(a, elem).to_bits(),
                    ratio_scale(a, max).to_bits(),
                    "{a:e}"
                );
            };
            for bits in (1..0x7F80_0000u32).step_by(4099) {
                check(bits);
            }
            let edge = (max * f32::MIN_POSITIVE).to_bits();
            for bits in edge - 2000..edge + 2000 {
                check(bits);
            }
            for e in 1..255u32 {
                for d in 0..64 {
                    check((e << 23) + d);
                    check((e << 23) - 1 - d);
                }
            }
        }
    }

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
