//! Folding an MX block scale into an FP8 element: the re-encoding that lets MXFP8 and MXFP4
//! operands run on the FP8 kernel (fp32 scales per 1×128 of A, per row of B, FP8 `wgmma`).
//!
//! An MX element `x · 2^s` (e8m0 scale `s` per 32 or 16 of K) is written as `y · 2^(r − h)`, where
//! `r` is the largest scale of the group that shares one fp32 scale (a row's 128 of K for A, a
//! row's whole K for B), `h` the target's headroom ([`headroom`]) and
//! `y = x · 2^(h − (r − s))` rounded to nearest even in [`target`] ([`fold`]). The shift
//! `d = r − s ≥ 0` only lowers exponents, so nothing overflows, and an element is exact unless it
//! falls below the target's normal range:
//! - e2m1 → e4m3 (headroom 6: 6 · 2^6 = 384 ≤ 448): every code is exact for `d ≤ 14`
//!   ([`EXACT_SHIFT_E2M1`]: 0.5 · 2^(6 − 14) = 2^-9, e4m3's smallest subnormal);
//! - e4m3 → e4m3 and e5m2 → e5m2 (headroom 0): exact while `|x| · 2^-d` stays normal (≥ 2^-6 or
//!   2^-14), otherwise rounded to the subnormal grid.
//!
//! So the error of a folded element is at most half the target's smallest subnormal times the
//! group's scale: `|x·2^s − y·2^(r−h)| ≤ 2^(r−h) · 2^-10` (e4m3) or `· 2^-17` (e5m2)
//! ([`max_error_units`]). NaN elements and elements of a NaN scale (e8m0 `0xFF`, left out of `r`)
//! become NaN; e5m2 ±Inf stays ±Inf. Integer arithmetic only, so the host's reference and the
//! GPU's pre-pass are one source.
//!
//! NVFP4 (e2m1 with a ue4m3 scale per 16, not a power of two) folds too, lossily: an element
//! `x · s` becomes `y · 2^(E − 5)`, with `E` the binade of the group's largest scale
//! ([`nv_group_exp`]) and `y = x · s · 2^(5 − E)` rounded to nearest even in e4m3 ([`fold_nv`]).
//! `x · s` has up to 5 significant bits where e4m3 keeps 4, so a normal result is off by at most
//! 2^-4 of itself, and one below e4m3's normal range by at most 2^-10 of the group scale
//! ([`nv_max_error`]); NVFP4's own rounding (e2m1, 2 significant bits) is 4× coarser.

use super::ElemType;

/// The FP8 type an element type folds into: e5m2 stays e5m2 (its range), e4m3 and e2m1 go to
/// e4m3.
#[inline]
pub const fn target(elem: ElemType) -> ElemType {
    match elem {
        ElemType::E5M2 => ElemType::E5M2,
        _ => ElemType::E4M3,
    }
}

/// Exponent headroom `h`: e2m1's largest value 6 times 2^6 is 384, still below e4m3's 448, and
/// the higher the codes sit the larger the shift they survive exactly.
#[inline]
pub const fn headroom(elem: ElemType) -> i32 {
    match elem {
        ElemType::E2M1 => 6,
        _ => 0,
    }
}

/// Largest shift `d` at which every e2m1 code folds exactly into e4m3.
pub const EXACT_SHIFT_E2M1: u32 = 14;

/// The target's NaN code (`0x7F` in both e4m3 and e5m2).
pub const NAN: u32 = 0x7F;

/// Bound on a folded element's error in units of its group scale `2^(r − h)`: half the target's
/// smallest subnormal (2^-10 for e4m3, 2^-17 for e5m2).
#[inline]
pub const fn max_error_units(elem: ElemType) -> f32 {
    match target(elem) {
        ElemType::E5M2 => 1.0 / 131_072.0,
        _ => 1.0 / 1024.0,
    }
}

/// `code` of `elem` (e2m1, e4m3 or e5m2) times `2^(headroom − shift)`, rounded to nearest even
/// in [`target`]`(elem)`; NaN and e5m2 ±Inf codes are returned unchanged (e4m3 and e5m2 are
/// their own targets). (bf16 is not an MX element type and gives 0.)
#[inline]
pub fn fold(elem: ElemType, code: u32, shift: u32) -> u32 {
    // Sign and magnitude; the magnitude as `sig · 2^exp` with an integer significand.
    let (sign, sig, exp) = match elem {
        ElemType::E2M1 => {
            let mag = code & 7;
            let (sig, exp) = if mag < 2 {
                (mag, -1)
            } else {
                (2 | (mag & 1), (mag >> 1) as i32 - 2)
            };
            ((code & 8) << 4, sig, exp)
        }
        ElemType::E4M3 => {
            let mag = code & 0x7F;
            if mag == 0x7F {
                return code & 0xFF;
            }
            let e = mag >> 3;
            let (sig, exp) = if e == 0 {
                (mag, -9)
            } else {
                (8 | (mag & 7), e as i32 - 10)
            };
            (code & 0x80, sig, exp)
        }
        ElemType::E5M2 => {
            let mag = code & 0x7F;
            if mag >= 0x7C {
                return code & 0xFF;
            }
            let e = mag >> 2;
            let (sig, exp) = if e == 0 {
                (mag, -16)
            } else {
                (4 | (mag & 3), e as i32 - 17)
            };
            (code & 0x80, sig, exp)
        }
        ElemType::BF16 | ElemType::F16 => return 0,
    };
    if sig == 0 {
        return sign;
    }
    // Target: `mbits` mantissa bits, subnormal quantum 2^qmin, exponent field = q + `field`
    // for a value n · 2^q with n in [2^mbits, 2^(mbits+1)).
    let (mbits, qmin, field) = match target(elem) {
        ElemType::E5M2 => (2i32, -16i32, 17i32),
        _ => (3, -9, 10),
    };
    let exp = exp + headroom(elem) - shift.min(255) as i32;
    // The quantum of the result: the last mantissa bit's unit at sig's binade, or the subnormal
    // quantum below the normal range.
    let top = 31 - sig.leading_zeros() as i32;
    let mut q = (exp + top - mbits).max(qmin);
    let mut n = if q <= exp {
        sig << (exp - q) as u32
    } else {
        let s = (q - exp) as u32;
        // sig < 2^4, so from 5 bits down the value is under half a quantum: 0.
        if s > 8 {
            0
        } else {
            let (n, rem, half) = (sig >> s, sig & ((1 << s) - 1), 1 << (s - 1));
            n + (rem > half || (rem == half && n & 1 == 1)) as u32
        }
    };
    // Rounding up may carry into the next binade (n = 2^(mbits+1) exactly).
    if n >= 1 << (mbits + 1) {
        n >>= 1;
        q += 1;
    }
    if n < 1 << mbits {
        sign | n
    } else {
        sign | (((q + field) as u32) << mbits) | (n - (1 << mbits))
    }
}

/// The e4m3 codes of the eight e2m1 magnitudes (codes 0–7) folded by `shift`, as the byte table
/// `prmt` indexes (magnitude j in byte j of `{[1], [0]}`). Up to shift 11 every result is normal:
/// magnitude 1 (0.5) is exponent field 12 − shift, and magnitudes 2–7 are their own bits shifted
/// into the exponent and mantissa fields (value · 2^-6 in e4m3) plus 12 − shift in the exponent.
/// Past 11, the general rule per magnitude.
#[inline]
pub fn e2m1_table(shift: u32) -> [u32; 2] {
    if shift <= 11 {
        let a = (12 - shift) << 3;
        [0x0C08_0000 + a * 0x0101_0100, 0x1C18_1410 + a * 0x0101_0101]
    } else {
        let b = |m: u32| fold(ElemType::E2M1, m, shift);
        [
            b(0) | b(1) << 8 | b(2) << 16 | b(3) << 24,
            b(4) | b(5) << 8 | b(6) << 16 | b(7) << 24,
        ]
    }
}

/// Exponent headroom of the NVFP4 fold: the largest element, 6 times a scale below `2^(E+1)`
/// (at most 1.875 · 2^E), times 2^5 is at most 360 ≤ 448.
pub const NV_HEADROOM: i32 = 5;

/// Whether a ue4m3 scale code is NaN (`0x7F`, sign bit ignored as [`super::ue4m3`] does).
#[inline]
pub const fn ue4m3_is_nan(code: u32) -> bool {
    code & 0x7F == 0x7F
}

/// `E`, the binade of ue4m3 code `top` (a group's largest non-NaN scale, sign bit ignored):
/// `floor(log2(value))`, or 0 for a zero scale (its group's elements are all zero, whatever
/// exponent it gets).
#[inline]
pub const fn nv_group_exp(top: u32) -> i32 {
    let mag = top & 0x7F;
    let field = (mag >> 3) as i32;
    if field != 0 {
        field - 7
    } else if mag == 0 {
        0
    } else {
        // Subnormal: mag · 2^-9 with mag < 8.
        (31 - mag.leading_zeros() as i32) - 9
    }
}

/// The fp32 scale of a group whose largest ue4m3 scale has binade `exp` ([`nv_group_exp`]):
/// `2^(exp − 5)` (exact).
#[inline]
pub const fn nv_group_scale(exp: i32) -> f32 {
    super::pow2(exp - NV_HEADROOM)
}

/// What multiplies an e2m1 value of a block with (non-NaN) ue4m3 scale `scale` in a group of
/// binade `exp`: `scale · 2^(5 − exp)`, exact in f32 (4 significant bits, exponent −17…14).
#[inline]
pub fn nv_factor(scale: u32, exp: i32) -> f32 {
    super::ue4m3::decode(scale as u8) * super::pow2(NV_HEADROOM - exp)
}

/// e2m1 `code` times `factor` ([`nv_factor`]) rounded to nearest even in e4m3 (the product is
/// exact in f32 and at most 360, so one rounding and no saturation).
#[inline]
pub fn fold_nv(code: u32, factor: f32) -> u32 {
    super::e4m3::encode_sat(super::e2m1::decode(code as u8) * factor) as u32
}

/// Largest error of a normal [`fold_nv`] result relative to itself: half an e4m3 unit in the
/// last place, 2^-4.
pub const NV_MAX_REL: f32 = 1.0 / 16.0;

/// Bound on the error of [`fold_nv`] for an element of magnitude `x` in units of its group
/// scale: [`NV_MAX_REL`] of a normal result, or 2^-10 (half e4m3's smallest subnormal) below the
/// normal range.
#[inline]
pub fn nv_max_error(x: f32) -> f32 {
    x.abs() * NV_MAX_REL + 1.0 / 1024.0
}

/// The e4m3 codes of the eight e2m1 magnitudes times `factor`, as the byte table `prmt` indexes
/// (as [`e2m1_table`]); `enc2(lo, hi)` rounds two f32 to e4m3 codes `lo | hi << 8` (the GPU's
/// `cvt.rn.satfinite.e4m3x2.f32`, the host's [`super::e4m3::encode_sat`]).
#[inline]
pub fn nv_table(factor: f32, enc2: impl Fn(f32, f32) -> u32) -> [u32; 2] {
    let p = |a: f32, b: f32| enc2(a * factor, b * factor);
    [
        p(0.0, 0.5) | p(1.0, 1.5) << 16,
        p(2.0, 3.0) | p(4.0, 6.0) << 16,
    ]
}

/// The `prmt` table of e2m1 signs: index 0 → `0x00`, index 1 → `0x80` (e4m3's sign bit).
pub const E2M1_SIGN_TABLE: u32 = 0x8000;

/// [`fold`] of an e4m3 or e5m2 code, with the common case first: a normal code whose exponent
/// field stays ≥ 1 after the shift keeps its mantissa, so its exponent field just drops by
/// `shift` (exact); everything else (specials, codes that leave the normal range) takes [`fold`].
#[inline]
pub fn fold8(elem: ElemType, code: u32, shift: u32) -> u32 {
    let (mag, mbits) = (code & 0x7F, target(elem).mantissa_bits());
    let special = match elem {
        ElemType::E5M2 => mag >= 0x7C,
        _ => mag == 0x7F,
    };
    if !special && (mag >> mbits) > shift {
        code - (shift << mbits)
    } else {
        fold(elem, code, shift)
    }
}

/// [`fold8`] of the four codes of `word` (byte `j` = code `j`) by one `shift`. When every byte
/// is a zero (±0 stays itself) or a code whose exponent field exceeds `shift`, and none is
/// special, one subtraction drops the fields of the latter (no borrow crosses a byte: each such
/// field is at least `shift + 1`); otherwise byte by byte. Zeros take the fast path because real
/// operands have many (ReLU outputs, pruned weights), and one per warp would otherwise send every
/// step of the GPU's pass down the slow one.
#[inline]
pub fn fold8x4(elem: ElemType, word: u32, shift: u32) -> u32 {
    const ONES: u32 = 0x0101_0101;
    const TOPS: u32 = 0x8080_8080;
    let mbits = target(elem).mantissa_bits();
    if shift < 128 {
        // Exponent fields (≤ 31) one per byte; + 127 − shift sets bit 7 iff field > shift, with
        // no carry out of the byte (≤ 31 + 127).
        let field_mask = if elem == ElemType::E5M2 { 0x1F } else { 0x0F };
        let fields = (word >> mbits) & (field_mask * ONES);
        let above = (fields + (0x7F - shift) * ONES) & TOPS;
        // Bit 7 set iff the byte's magnitude is not zero (≤ 0x7F + 0x7F: no carry).
        let nonzero = ((word & 0x7F7F_7F7F) + 0x7F * ONES) & TOPS;
        // A zero byte of `x`: the classic test, exact as a yes / no.
        let any_zero = |x: u32| x.wrapping_sub(ONES) & !x & TOPS != 0;
        let special = if elem == ElemType::E5M2 {
            any_zero(fields ^ (0x1F * ONES))
        } else {
            any_zero((word & 0x7F7F_7F7F) ^ (0x7F * ONES))
        };
        if nonzero & !above == 0 && !special {
            // 0xFF in each byte whose field drops, then the drop in those bytes only (no field
            // exceeds 31, so neither does a shift that drops one: clamped, it fits a byte).
            let drop = (above >> 7) * 0xFF;
            return word - (drop & ((shift.min(31) << mbits) * ONES));
        }
    }
    fold8x4_bytes(elem, word, shift)
}

/// [`fold8x4`]'s rare case, byte by byte: out of line, so that the common case stays small enough
/// for the GPU's fold loop to unroll (and keep its loaded words in registers).
#[cold]
#[inline(never)]
fn fold8x4_bytes(elem: ElemType, word: u32, shift: u32) -> u32 {
    let b = |j: u32| fold8(elem, (word >> (8 * j)) & 0xFF, shift) << (8 * j);
    b(0) | b(1) | b(2) | b(3)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shortcuts the GPU's pre-pass takes agree with [`fold`] everywhere.
    #[test]
    fn the_e2m1_table_and_the_fp8_shortcut_equal_the_general_rule() {
        for shift in 0..=255u32 {
            let t = e2m1_table(shift);
            for m in 0..8u32 {
                let byte = (t[m as usize / 4] >> (8 * (m % 4))) & 0xFF;
                assert_eq!(
                    byte,
                    fold(ElemType::E2M1, m, shift),
                    "magnitude {m} shift {shift}"
                );
                // The sign: fold of the negative code is the magnitude's byte with bit 7 set.
                assert_eq!(byte | 0x80, fold(ElemType::E2M1, m | 8, shift));
            }
            for elem in [ElemType::E4M3, ElemType::E5M2] {
                for code in 0..256 {
                    assert_eq!(
                        fold8(elem, code, shift),
                        fold(elem, code, shift),
                        "{elem:?} {code:#x} {shift}"
                    );
                }
            }
        }
    }

    /// Every code of every MX element type at every shift (0 to 255) equals the exact product
    /// rounded once by the target's own encoder (round to nearest even), bit for bit (up to the
    /// sign of NaN), and the error bound holds; e2m1 is exact up to `EXACT_SHIFT_E2M1`.
    #[test]
    fn every_code_at_every_shift_is_the_exact_value_rounded_to_nearest_even() {
        for elem in [ElemType::E2M1, ElemType::E4M3, ElemType::E5M2] {
            let codes = if elem == ElemType::E2M1 { 16 } else { 256 };
            let t = target(elem);
            for code in 0..codes {
                let x = elem.decode(code) as f64;
                for shift in 0..=255u32 {
                    let got = fold(elem, code, shift);
                    let scale = 2f64.powi(headroom(elem) - shift as i32);
                    if x.is_nan() {
                        assert!(t.decode(got).is_nan(), "{elem:?} {code:#x}");
                        continue;
                    }
                    if x.is_infinite() {
                        assert_eq!(got, code, "{elem:?} {code:#x}");
                        continue;
                    }
                    // x · 2^(h − d) as f32: exact, or an f32 rounding far below the target's
                    // subnormal half-quantum (which rounds to the same code).
                    let want = t.encode_sat((x * scale) as f32);
                    assert_eq!(got, want, "{elem:?} code {code:#x} shift {shift}");
                    let y = t.decode(got) as f64;
                    let err = (y - x * scale).abs();
                    assert!(
                        err <= max_error_units(elem) as f64,
                        "{elem:?} {code:#x} {shift}"
                    );
                    if elem == ElemType::E2M1 && shift <= EXACT_SHIFT_E2M1 {
                        assert_eq!(y, x * scale, "{code:#x} {shift}");
                    }
                    if shift == 0 {
                        assert_eq!(y, x * scale, "{elem:?} {code:#x}: no shift is exact");
                    }
                }
            }
        }
    }

    /// The four-code fold equals [`fold8`] per byte: every code in every byte position with
    /// random neighbours, at every shift.
    #[test]
    fn the_four_code_fold_equals_the_per_code_rule() {
        let mut x = 0x9E37_79B9u32;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        for elem in [ElemType::E4M3, ElemType::E5M2] {
            for shift in 0..=255u32 {
                for code in 0..256u32 {
                    for pos in 0..4 {
                        // Neighbours near the top of the range take the fast path when `code`
                        // does; random ones exercise both.
                        let near = 0x7070_7070 & !(0xFF << (8 * pos));
                        let zeros = rnd() & 0x8000_8000 | 0x0070_0070;
                        for rest in [rnd(), near, rnd() & 0x7F7F_7F7F, zeros, rnd() & 0x80FF_80FF] {
                            let w = rest & !(0xFF << (8 * pos)) | code << (8 * pos);
                            let want = (0..4)
                                .map(|j| fold8(elem, (w >> (8 * j)) & 0xFF, shift) << (8 * j))
                                .fold(0, |a, b| a | b);
                            assert_eq!(fold8x4(elem, w, shift), want, "{elem:?} {w:#x} {shift}");
                        }
                    }
                }
            }
        }
    }

    /// The NVFP4 fold: the prmt table equals [`fold_nv`] for every scale code and every group
    /// binade; every result is within [`nv_max_error`] of the exact value; nothing saturates.
    #[test]
    fn the_nvfp4_fold_rounds_once_within_its_bound() {
        use crate::format::{e2m1, e4m3, ue4m3};
        let host = |a: f32, b: f32| e4m3::encode_sat(a) as u32 | (e4m3::encode_sat(b) as u32) << 8;
        for top in 0..0x7Fu32 {
            let exp = nv_group_exp(top);
            if top > 0 {
                let v = ue4m3::decode(top as u8) as f64;
                assert!(2f64.powi(exp) <= v && v < 2f64.powi(exp + 1), "{top:#x}");
            }
            for scale in 0..=top {
                let f = nv_factor(scale, exp);
                let t = nv_table(f, host);
                for code in 0..16u32 {
                    let got = fold_nv(code, f);
                    if code < 8 {
                        assert_eq!((t[code as usize / 4] >> (8 * (code % 4))) & 0xFF, got);
                    } else {
                        assert_eq!(fold_nv(code & 7, f) | 0x80, got, "sign of {code:#x}");
                    }
                    let exact = e2m1::decode(code as u8) as f64 * ue4m3::decode(scale as u8) as f64;
                    let y = e4m3::decode(got as u8) as f64 * nv_group_scale(exp) as f64;
                    let x_units = exact / nv_group_scale(exp) as f64;
                    assert!(x_units.abs() <= 360.0, "{top:#x} {scale:#x} {code:#x}");
                    let err = (y - exact).abs() / nv_group_scale(exp) as f64;
                    assert!(
                        err <= nv_max_error(x_units as f32) as f64,
                        "{top:#x} {scale:#x} {code:#x}: {exact} folded to {y}"
                    );
                    if scale == top && top & 7 == 0 {
                        // A power-of-two scale at the top of its group: every code is exact.
                        assert_eq!(y, exact, "{top:#x} {code:#x}");
                    }
                }
            }
        }
        // The sign bit of a scale is ignored; NaN is 0x7F with or without it.
        assert_eq!(nv_group_exp(0x80 | 0x38), nv_group_exp(0x38));
        assert!(ue4m3_is_nan(0x7F) && ue4m3_is_nan(0xFF) && !ue4m3_is_nan(0x7E));
    }
}
