//! Exact dequantization of block-scaled codes to bf16, in integer and packed-bf16 operations only
//! (the conversion instructions run at a quarter of the ALU rate on sm_90).
//!
//! Why it is exact: an e4m3, e5m2 or e2m1 value times an e8m0 or ue4m3 scale has at most 4 + 4
//! significant bits, and bf16 has 8 with the exponent range of fp32, so every product is a bf16
//! unless it leaves that range (|value| ≥ 2^128, or below bf16's smallest subnormal 2^-133: only
//! with e8m0 scales within a few powers of two of 2^±127). NaN and Inf codes and NaN scales stay
//! NaN and Inf.
//!
//! How: the code's magnitude bits are shifted into the low bits of a bf16 exponent and the top
//! of its mantissa. That bf16 is the code's value × 2^-bias exactly — subnormal codes land on bf16
//! subnormals with the same mantissa — so one multiply by 2^bias and one by the scale give the
//! product, each exact. Two codes are converted per 32-bit word (a bf16x2), and the pairs are
//! taken in the order that costs fewest operations: an 8-bit unit of 16 codes comes out in K
//! order 0, 2, 1, 3, 4, 6, 5, 7, …; a 4-bit one in 0, 4, 1, 5, 2, 6, 3, 7, 8, 12, …. A and B are
//! converted with the same order when their codes have the same width, so the dot products
//! along K are those of the unpermuted operands (the kernel takes no mixed-width pairs).
//!
//! Host and device compile this module: the tests check every code and scale against
//! [`crate::format`].

/// One element type's conversion of a *unit*: 16 consecutive codes of one row.
pub trait Dequant {
    /// Bits per code (8 or 4): a unit is `2 · BITS` bytes.
    const BITS: u32;
    /// 2^bias in both halves of a bf16x2 word: the factor from the shifted form to the value.
    const BIAS_X2: u32;
    /// The unit's codes (`raw[..BITS / 2]`, little-endian words as loaded) as 8 bf16x2 words of
    /// value × 2^-bias, in the unit's K order (module doc); NaN and Inf codes are right only
    /// after [`Dequant::fix_specials`].
    fn shifted(raw: [u32; 4]) -> [u32; 8];
    /// Bit 7 of each byte of `w` whose code is NaN or Inf (8-bit types; 0 for types that have
    /// none).
    fn flags(w: u32) -> u32;
    /// Non-zero when the unit holds a NaN or Inf code.
    #[inline(always)]
    fn specials(raw: [u32; 4]) -> u32 {
        raw.iter().fold(0, |f, &w| f | Self::flags(w))
    }
    /// Makes the lanes of `shifted(raw)` that hold NaN or Inf codes NaN or Inf.
    #[inline(always)]
    fn fix_specials(out: &mut [u32; 8], raw: [u32; 4]) {
        set_special_lanes(out, raw.map(Self::flags));
    }
}

/// bf16x2 word with `bits` in both halves.
const fn x2(bits: u32) -> u32 {
    bits | bits << 16
}

/// bf16 bits of 2^e (e a normal exponent).
const fn pow2_bf16(e: i32) -> u32 {
    ((e + 127) as u32) << 7
}

/// `0x7F80` (exponent all ones) in each 16-bit lane whose flag bit (bit `at` or `at + 16` of
/// `flags`) is set: the lane's shifted form then reads as Inf (zero mantissa) or NaN.
#[inline(always)]
fn special_lanes(flags: u32, at: u32) -> u32 {
    ((flags >> at) & 0x0001_0001) * 0x7F80
}

/// Sets the exponent bits of the lanes of `out` (8-bit codes) whose code's flag (bit 7 of its
/// byte in `flags[word]`) is set.
#[inline(always)]
fn set_special_lanes(out: &mut [u32; 8], flags: [u32; 4]) {
    for (i, f) in flags.iter().enumerate() {
        out[2 * i] |= special_lanes(*f, 7);
        out[2 * i + 1] |= special_lanes(*f, 15);
    }
}

/// OFP8 E4M3 (bias 7): the 7 magnitude bits go to bits 4–10 (exponent bits 0–3, mantissa 4–6),
/// bias 7 − 127 = −120. Code 0x7F / 0xFF is NaN.
pub struct E4m3;
/// OFP8 E5M2 (bias 15): the magnitude bits go to bits 5–11, bias −112. Exponent 31 is Inf
/// (mantissa 0) or NaN.
pub struct E5m2;
/// E2M1 (bias 1): the 3 magnitude bits go to bits 6–8, bias −126. No special codes.
pub struct E2m1;

/// An 8-bit code's shifted form: its 7 magnitude bits moved up by `SHIFT` (to bf16's exponent
/// and mantissa fields: 4 for e4m3, 5 for e5m2) and its sign to bit 15; bytes 0 and 2 in the
/// first word of each pair, bytes 1 and 3 in the second.
#[inline(always)]
fn fp8_shifted<const SHIFT: u32>(raw: [u32; 4]) -> [u32; 8] {
    let mask = x2(0x7F << SHIFT);
    let mut out = [0u32; 8];
    for (i, &w) in raw.iter().enumerate() {
        out[2 * i] = ((w << SHIFT) & mask) | ((w << 8) & 0x8000_8000);
        out[2 * i + 1] = ((w >> (8 - SHIFT)) & mask) | (w & 0x8000_8000);
    }
    out
}

impl Dequant for E4m3 {
    const BITS: u32 = 8;
    const BIAS_X2: u32 = x2(pow2_bf16(120));
    #[inline(always)]
    fn shifted(raw: [u32; 4]) -> [u32; 8] {
        fp8_shifted::<4>(raw)
    }
    /// Magnitude 0x7F: NaN.
    #[inline(always)]
    fn flags(w: u32) -> u32 {
        ((w & 0x7F7F_7F7F) + 0x0101_0101) & 0x8080_8080
    }
}

impl Dequant for E5m2 {
    const BITS: u32 = 8;
    const BIAS_X2: u32 = x2(pow2_bf16(112));
    #[inline(always)]
    fn shifted(raw: [u32; 4]) -> [u32; 8] {
        fp8_shifted::<5>(raw)
    }
    /// Exponent 31: Inf or NaN.
    #[inline(always)]
    fn flags(w: u32) -> u32 {
        ((w & 0x7C7C_7C7C) + 0x0404_0404) & 0x8080_8080
    }
}

impl Dequant for E2m1 {
    const BITS: u32 = 4;
    const BIAS_X2: u32 = x2(pow2_bf16(126));
    #[inline(always)]
    fn shifted(raw: [u32; 4]) -> [u32; 8] {
        let mut out = [0u32; 8];
        for i in 0..2 {
            let w = raw[i];
            // Nibbles (0, 4), (1, 5), (2, 6), (3, 7) of the word.
            out[4 * i] = ((w << 6) & 0x01C0_01C0) | ((w << 12) & 0x8000_8000);
            out[4 * i + 1] = ((w << 2) & 0x01C0_01C0) | ((w << 8) & 0x8000_8000);
            out[4 * i + 2] = ((w >> 2) & 0x01C0_01C0) | ((w << 4) & 0x8000_8000);
            out[4 * i + 3] = ((w >> 6) & 0x01C0_01C0) | (w & 0x8000_8000);
        }
        out
    }
    /// No special codes.
    #[inline(always)]
    fn flags(_: u32) -> u32 {
        0
    }
}

/// The conversion of the element type `E` (an [`ElemType`](crate::format::ElemType) as u32), for
/// the kernel tables ([`crate::entry::Named`]).
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
pub struct ElemOf<const E: u32>;

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
mod named {
    use super::{E2m1, E4m3, E5m2, E8m0x16, E8m0x32, ElemOf, ScaleOf, Ue4m3x16};
    use crate::entry::Named;
    use crate::format::{ElemType, ScaleType};

    impl Named for ElemOf<{ ElemType::E4M3 as u32 }> {
        type T = E4m3;
    }
    impl Named for ElemOf<{ ElemType::E5M2 as u32 }> {
        type T = E5m2;
    }
    impl Named for ElemOf<{ ElemType::E2M1 as u32 }> {
        type T = E2m1;
    }
    impl Named for ScaleOf<{ ScaleType::E8M0 as u32 }, 32> {
        type T = E8m0x32;
    }
    impl Named for ScaleOf<{ ScaleType::E8M0 as u32 }, 16> {
        type T = E8m0x16;
    }
    impl Named for ScaleOf<{ ScaleType::UE4M3 as u32 }, 16> {
        type T = Ue4m3x16;
    }
}

/// One scale type's conversion to a bf16x2 word (the scale in both halves).
pub trait ScaleDecode {
    /// Elements per scale along K (32 or 16).
    const BLOCK: u32;
    /// The scale byte as bf16 in both halves: exact (every e8m0 and ue4m3 value is a bf16), NaN
    /// codes as NaN.
    fn x2(byte: u32) -> u32;
    /// Whether [`Self::x2_biased`] can fold e2m1's shift bias into the scale.
    const FOLDS_BIAS: bool = false;
    /// Whether [`Self::x2_biased`]`(byte)` is exact: 2^126 times the scale is a finite bf16, or
    /// the scale is NaN.
    fn bias_exact(_byte: u32) -> bool {
        false
    }
    /// [`E2m1::BIAS_X2`] times the scale, in both halves, for a byte with [`Self::bias_exact`]:
    /// one multiply of a shifted e2m1 pair by it is the pair times its scale, rounded once from
    /// the same exact product as the two multiplies by the bias and the scale.
    fn x2_biased(byte: u32) -> u32 {
        mul_bf16x2(Self::x2(byte), E2m1::BIAS_X2)
    }
}

/// E8M0 per 32 (MX): 2^(byte − 127) is the bf16 with exponent field `byte`, except 2^-127
/// (byte 0, a bf16 subnormal) and NaN (0xFF).
pub struct E8m0x32;
/// E8M0 per 16.
pub struct E8m0x16;
/// UE4M3 per 16 (NVFP4): as E4M3 with the sign bit ignored.
pub struct Ue4m3x16;

/// The conversion of the scale format of type `TY` (a [`ScaleType`](crate::format::ScaleType) as
/// u32) per `BLOCK` elements, for the kernel tables ([`crate::entry::Named`]).
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
pub struct ScaleOf<const TY: u32, const BLOCK: u32>;

/// Without branches: a `match` here compiled to two divergent branches per scale in the
/// consumers' loop, next to `wgmma` (ncu: 4–8× the branch-resolving stalls of ue4m3 scales).
#[inline(always)]
fn e8m0_x2(byte: u32) -> u32 {
    // byte 1–254: the exponent field. 0xFF: 0x7F80 (Inf) plus the quiet bit, NaN. 0: the
    // subnormal 0x0040 = 2^-127.
    let nan = ((byte + 1) >> 8) << 6;
    let zero = (byte.wrapping_sub(1) >> 31) << 6;
    x2(byte << 7 | nan | zero)
}

/// 2^126 · 2^(byte − 127) = 2^(byte − 1) is the bf16 with exponent field byte + 126 for bytes up
/// to 128 (scales up to 2, which weights' are: their values are at most 6 times it); NaN for 0xFF.
#[inline(always)]
fn e8m0_biased_x2(byte: u32) -> u32 {
    if byte == 0xFF {
        x2(0x7FC0)
    } else {
        x2((byte + 126) << 7)
    }
}

/// `impl ScaleDecode` for an e8m0 scale per `$block`: one decode, and the bias fold for bytes up
/// to 128 and NaN.
macro_rules! e8m0_decode {
    ($t:ty, $block:literal) => {
        impl ScaleDecode for $t {
            const BLOCK: u32 = $block;
            #[inline(always)]
            fn x2(byte: u32) -> u32 {
                e8m0_x2(byte)
            }
            const FOLDS_BIAS: bool = true;
            #[inline(always)]
            fn bias_exact(byte: u32) -> bool {
                byte <= 128 || byte == 0xFF
            }
            #[inline(always)]
            fn x2_biased(byte: u32) -> u32 {
                e8m0_biased_x2(byte)
            }
        }
    };
}

e8m0_decode!(E8m0x32, 32);
e8m0_decode!(E8m0x16, 16);

impl ScaleDecode for Ue4m3x16 {
    const BLOCK: u32 = 16;
    #[inline(always)]
    fn x2(byte: u32) -> u32 {
        let mag = byte & 0x7F;
        let mut shifted = x2(mag << 4);
        if mag == 0x7F {
            shifted |= x2(0x7F80);
        }
        mul_bf16x2(shifted, E4m3::BIAS_X2)
    }
}

/// The two bf16 products of the halves of `a` and `b`, rounded to nearest even (`mul.rn.bf16x2`
/// on the GPU; the host computes it in f32, where the product of two bf16 is exact, and rounds
/// once).
#[inline(always)]
pub fn mul_bf16x2(a: u32, b: u32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    {
        crate::ptx::half::mul_bf16x2(a, b)
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        let lane = |s: u32| {
            let x =
                f32::from_bits((a >> s & 0xFFFF) << 16) * f32::from_bits((b >> s & 0xFFFF) << 16);
            bf16_rne(x) << s
        };
        lane(0) | lane(16)
    }
}

/// f32 → bf16 bits, round to nearest even (NaN kept quiet).
#[cfg(not(target_arch = "nvptx64"))]
fn bf16_rne(x: f32) -> u32 {
    let b = x.to_bits();
    if x.is_nan() {
        return (b >> 16) | 0x0040;
    }
    (b + 0x7FFF + ((b >> 16) & 1)) >> 16
}

/// A unit of 16 codes with its scale: 8 bf16x2 words of code × scale, in the unit's K order;
/// `specials`: whether to make NaN and Inf codes NaN and Inf (the kernel converts without, and
/// converts again with it the rare stages whose units hold such codes, [`Dequant::specials`]).
/// Branch-free, so the compiler interleaves a thread's units: two multiplies per word, by 2^bias
/// and by the scale (one by their product would overflow bf16 for large scales).
#[inline(always)]
pub fn unit<E: Dequant>(raw: [u32; 4], scale_x2: u32, specials: bool) -> [u32; 8] {
    let mut out = E::shifted(raw);
    if specials {
        E::fix_specials(&mut out, raw);
    }
    for w in out.iter_mut() {
        *w = mul_bf16x2(mul_bf16x2(*w, E::BIAS_X2), scale_x2);
    }
    out
}

/// The words of [`unit`] re-paired into K order (word j = values 2j, 2j + 1), for a unit stored
/// next to operands that are in K order (the bf16 tiles that `wgmma` multiplies with register
/// fragments of weights, `sm90_w4`). Adjacent words hold the pairs (a, b) and (a + d, b + d)
/// (8-bit: d = 1 within 4 codes; 4-bit: d = 1 within 8 codes), so taking their low halves and
/// their high halves gives two K-order pairs.
#[inline(always)]
pub fn natural_order(bits: u32, out: [u32; 8]) -> [u32; 8] {
    let lo = |a: u32, b: u32| (a & 0xFFFF) | (b << 16);
    let hi = |a: u32, b: u32| (a >> 16) | (b & 0xFFFF_0000);
    let mut r = [0u32; 8];
    if bits == 8 {
        // Words (0,2), (1,3) → (0,1), (2,3).
        for i in 0..4 {
            r[2 * i] = lo(out[2 * i], out[2 * i + 1]);
            r[2 * i + 1] = hi(out[2 * i], out[2 * i + 1]);
        }
    } else {
        // Words (0,4), (1,5), (2,6), (3,7) → (0,1), (2,3), (4,5), (6,7).
        for i in 0..2 {
            let o = &out[4 * i..4 * i + 4];
            r[4 * i] = lo(o[0], o[1]);
            r[4 * i + 1] = lo(o[2], o[3]);
            r[4 * i + 2] = hi(o[0], o[1]);
            r[4 * i + 3] = hi(o[2], o[3]);
        }
    }
    r
}

/// Where code `j` of a unit (K position `j` of 16) lands among the unit's 16 bf16 values.
pub const fn unit_position(bits: u32, j: u32) -> u32 {
    if bits == 8 {
        // Word j/4, bytes (0, 2) then (1, 3).
        let (w, b) = (j / 4, j % 4);
        4 * w + 2 * (b % 2) + b / 2
    } else {
        // Word j/8, nibbles (0, 4), (1, 5), (2, 6), (3, 7).
        let (w, n) = (j / 8, j % 8);
        8 * w + 2 * (n % 4) + n / 4
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::format::{ElemType, ScaleType};
    use std::vec::Vec;

    fn bf16_value(bits: u32) -> f32 {
        f32::from_bits((bits & 0xFFFF) << 16)
    }

    /// Every code of `elem` at every K position of a unit, times `scale`, against the format's
    /// decode: bit-equal values (NaN for NaN).
    fn check_elem<E: Dequant>(elem: ElemType, scales: &[(u32, f32)], decode_scale: fn(u32) -> u32) {
        let per_byte = if E::BITS == 8 { 1 } else { 2 };
        for &(sbyte, svalue) in scales {
            let sx2 = decode_scale(sbyte);
            assert!(
                bf16_value(sx2) == svalue || (svalue.is_nan() && bf16_value(sx2).is_nan()),
                "scale {sbyte:#x}"
            );
            for code in 0..(1u32 << E::BITS) {
                for j in 0..16 {
                    // The unit: code at position j, the other codes distinct fillers.
                    let mut bytes = [0u8; 16];
                    let put = |bytes: &mut [u8; 16], pos: usize, c: u32| {
                        if per_byte == 1 {
                            bytes[pos] = c as u8;
                        } else {
                            bytes[pos / 2] |= (c as u8) << (4 * (pos % 2));
                        }
                    };
                    for o in 0..16 {
                        let filler = (o as u32 * 5 + 1) % (1 << E::BITS);
                        put(&mut bytes, o, if o == j as usize { code } else { filler });
                    }
                    let raw: [u32; 4] = core::array::from_fn(|w| {
                        u32::from_le_bytes(bytes[4 * w..4 * w + 4].try_into().unwrap())
                    });
                    let out = unit::<E>(raw, sx2, E::specials(raw) != 0);
                    if E::specials(raw) == 0 {
                        assert_eq!(out, unit::<E>(raw, sx2, true));
                    }
                    let p = unit_position(E::BITS, j);
                    let got = bf16_value(out[p as usize / 2] >> (16 * (p % 2)));
                    let want = elem.decode(code) * svalue;
                    assert!(
                        got == want || (got.is_nan() && want.is_nan()),
                        "{elem:?} code {code:#x} at {j} scale {sbyte:#x}: got {got:e}, want {want:e}"
                    );
                }
            }
        }
    }

    fn e8m0_scales() -> Vec<(u32, f32)> {
        // Every exponent whose products stay inside bf16's range for every element (the
        // extremes are checked below), and NaN.
        let mut v: Vec<(u32, f32)> = (20..=230)
            .map(|b| (b, ScaleType::E8M0.decode_bits(b)))
            .collect();
        v.push((0xFF, f32::NAN));
        v
    }

    #[test]
    fn every_fp8_and_fp4_code_times_every_e8m0_scale_is_exact() {
        check_elem::<E4m3>(ElemType::E4M3, &e8m0_scales(), E8m0x32::x2);
        check_elem::<E5m2>(ElemType::E5M2, &e8m0_scales(), E8m0x32::x2);
        check_elem::<E2m1>(ElemType::E2M1, &e8m0_scales(), E8m0x16::x2);
    }

    #[test]
    fn every_fp4_code_times_every_ue4m3_scale_is_exact() {
        let scales: Vec<(u32, f32)> = (0..0x80)
            .map(|b| (b, ScaleType::UE4M3.decode_bits(b)))
            .collect();
        check_elem::<E2m1>(ElemType::E2M1, &scales, Ue4m3x16::x2);
    }

    #[test]
    fn extreme_e8m0_scales_are_exact_for_the_values_bf16_holds() {
        // 2^-127 (a bf16 subnormal) and 2^127 decode exactly; small codes times 2^127 and
        // large ones times 2^-127 stay exact where bf16 holds the product.
        assert_eq!(bf16_value(E8m0x32::x2(0)), 2f32.powi(-127));
        assert_eq!(bf16_value(E8m0x32::x2(254)), 2f32.powi(127));
        let one_e4m3 = 0x38; // 1.0
        let out = unit::<E4m3>([one_e4m3, 0, 0, 0], E8m0x32::x2(254), false);
        assert_eq!(bf16_value(out[0]), 2f32.powi(127));
        let out = unit::<E4m3>([one_e4m3, 0, 0, 0], E8m0x32::x2(0), false);
        assert_eq!(bf16_value(out[0]), 2f32.powi(-127));
    }

    #[test]
    fn natural_order_puts_every_code_at_its_k_position() {
        for bits in [8u32, 4] {
            // Value j of the unit's output (position unit_position(j)) tagged with j.
            let mut out = [0u32; 8];
            for j in 0..16 {
                let p = unit_position(bits, j);
                out[p as usize / 2] |= j << (16 * (p % 2));
            }
            let r = natural_order(bits, out);
            for j in 0..16u32 {
                assert_eq!(
                    (r[j as usize / 2] >> (16 * (j % 2))) & 0xFFFF,
                    j,
                    "{bits} bits"
                );
            }
        }
    }

    #[test]
    fn unit_positions_are_a_permutation_and_equal_for_equal_widths() {
        for bits in [8, 4] {
            let mut seen = [false; 16];
            for j in 0..16 {
                seen[unit_position(bits, j) as usize] = true;
            }
            assert!(seen.iter().all(|&s| s));
        }
    }
}
