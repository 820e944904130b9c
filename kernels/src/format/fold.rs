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
        ElemType::BF16 => return 0,
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
}
