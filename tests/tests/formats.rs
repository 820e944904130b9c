//! Property tests of `blockscaled_kernels::format` against references computed here, in `f64`,
//! from the bit-field definitions of the specs (OCP OFP8 v1.0 §5.1/§5.2, OCP MX v1.0 §5.3.3,
//! §5.4.1, §6.3; NVIDIA NVFP4). Nothing here calls a `decode` to build its expectations.

use blockscaled_kernels::format::{ElemType, ScaleType, e2m1, e4m3, e5m2, e8m0, ue4m3};
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------------
// Reference model
// ---------------------------------------------------------------------------------------------

/// How a format uses its all-ones exponent field.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Specials {
    /// E2M1: none (every code is finite).
    None,
    /// E4M3 (FN): only `S.1111.111` is NaN; the rest of exponent 15 is normal.
    NanOnlyAllOnes,
    /// E5M2 (IEEE-like): exponent all ones is Inf (mantissa 0) or NaN.
    Ieee,
}

#[derive(Clone, Copy, Debug)]
struct Spec {
    ebits: u32,
    mbits: u32,
    bias: i32,
    specials: Specials,
    /// Largest finite value, written independently of the library.
    max: f64,
    /// Largest finite positive code.
    max_code: u8,
}

const E2M1: Spec = Spec {
    ebits: 2,
    mbits: 1,
    bias: 1,
    specials: Specials::None,
    max: 6.0,
    max_code: 0x7,
};
const E4M3: Spec = Spec {
    ebits: 4,
    mbits: 3,
    bias: 7,
    specials: Specials::NanOnlyAllOnes,
    max: 448.0,
    max_code: 0x7E,
};
const E5M2: Spec = Spec {
    ebits: 5,
    mbits: 2,
    bias: 15,
    specials: Specials::Ieee,
    max: 57344.0,
    max_code: 0x7B,
};

impl Spec {
    fn bits(&self) -> u32 {
        1 + self.ebits + self.mbits
    }
    fn sign_bit(&self) -> u8 {
        1u8 << (self.bits() - 1)
    }
    fn n_codes(&self) -> u32 {
        1 << self.bits()
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Val {
    Finite(f64),
    Inf(bool),
    NaN,
}

/// `2^k` in f64, built from the bits.
fn p2(k: i32) -> f64 {
    assert!((-1022..=1023).contains(&k));
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// The value the spec gives to `code`, from its sign / exponent / mantissa fields.
fn spec_value(s: Spec, code: u32) -> Val {
    let sign = (code >> (s.ebits + s.mbits)) & 1;
    let exp = (code >> s.mbits) & ((1 << s.ebits) - 1);
    let man = code & ((1 << s.mbits) - 1);
    let all_ones = (1 << s.ebits) - 1;
    match s.specials {
        Specials::NanOnlyAllOnes if exp == all_ones && man == (1 << s.mbits) - 1 => {
            return Val::NaN;
        }
        Specials::Ieee if exp == all_ones => {
            return if man == 0 {
                Val::Inf(sign == 1)
            } else {
                Val::NaN
            };
        }
        _ => {}
    }
    let frac = man as f64 / p2(s.mbits as i32);
    let mag = if exp == 0 {
        // subnormal: 0.m * 2^(1 - bias)
        frac * p2(1 - s.bias)
    } else {
        (1.0 + frac) * p2(exp as i32 - s.bias)
    };
    Val::Finite(if sign == 1 { -mag } else { mag })
}

/// All finite non-negative codes with their values, increasing.
fn positive_table(s: Spec) -> Vec<(u8, f64)> {
    let mut t: Vec<(u8, f64)> = (0..s.n_codes() / 2)
        .filter_map(|c| match spec_value(s, c) {
            Val::Finite(v) => Some((c as u8, v)),
            _ => None,
        })
        .collect();
    t.sort_by(|a, b| a.1.partial_cmp(&b.1).unwrap());
    t
}

/// Reference saturating RNE encoder: brute force over every finite value; ties to the even
/// code; magnitudes above max (Inf included) give max; the sign of `x` is kept.
fn ref_encode_sat(s: Spec, x: f32) -> u8 {
    assert!(!x.is_nan());
    let sign = if x.is_sign_negative() {
        s.sign_bit()
    } else {
        0
    };
    let a = (x as f64).abs();
    if a > s.max {
        return s.max_code | sign;
    }
    let mut best: Option<(u8, f64)> = None;
    for (c, v) in positive_table(s) {
        let d = (v - a).abs();
        best = match best {
            None => Some((c, d)),
            Some((bc, bd)) if d < bd || (d == bd && c % 2 == 0 && bc % 2 == 1) => Some((c, d)),
            keep => keep,
        };
    }
    best.unwrap().0 | sign
}

fn same(a: f32, v: Val) -> bool {
    match v {
        Val::NaN => a.is_nan(),
        Val::Inf(neg) => a.is_infinite() && a.is_sign_negative() == neg,
        Val::Finite(f) => a as f64 == f && a.is_sign_negative() == f.is_sign_negative(),
    }
}

fn next_up(x: f32) -> f32 {
    x.next_up()
}
fn next_down(x: f32) -> f32 {
    x.next_down()
}

/// Finite f32 inputs: uniform in `[-1.25 max, 1.25 max]`, log-uniform across the format's range
/// and far below it (subnormal `f32`s included), exact midpoints between neighbouring values
/// (and one f32 ulp either side), and arbitrary bit patterns.
fn finite_input(s: Spec) -> impl Strategy<Value = f32> {
    let m = (s.max * 1.25) as f32;
    let t = positive_table(s);
    let mids: Vec<f32> = t
        .windows(2)
        .map(|w| ((w[0].1 + w[1].1) / 2.0) as f32)
        .collect();
    let emin = 1 - s.bias;
    let lo_exp = (emin - s.mbits as i32 - 8).max(-149);
    let hi_exp = (s.max.log2().floor() as i32) + 2;
    prop_oneof![
        (-m..m),
        (any::<bool>(), lo_exp..=hi_exp, 0u32..(1 << 23)).prop_map(|(neg, e, man)| {
            let v = if e >= -126 {
                f32::from_bits((((e + 127) as u32) << 23) | man)
            } else {
                f32::from_bits(man >> (-126 - e).min(23))
            };
            if neg { -v } else { v }
        }),
        (proptest::sample::select(mids), -1i32..=1, any::<bool>()).prop_map(|(mid, d, neg)| {
            let v = f32::from_bits((mid.to_bits() as i32 + d) as u32);
            if neg { -v } else { v }
        }),
        any::<u32>()
            .prop_map(f32::from_bits)
            .prop_filter("finite", |x| x.is_finite()),
    ]
}

// ---------------------------------------------------------------------------------------------
// Decode: every code against the spec; every non-NaN code re-encodes to itself
// ---------------------------------------------------------------------------------------------

fn check_all_codes(s: Spec, decode: fn(u8) -> f32, encode: fn(f32) -> u8) {
    for c in 0..s.n_codes() {
        let want = spec_value(s, c);
        let got = decode(c as u8);
        assert!(same(got, want), "code {c:#04x}: got {got:?}, spec {want:?}");
        if let Val::Finite(_) = want {
            assert_eq!(
                encode(got),
                c as u8,
                "code {c:#04x} ({got}) does not round-trip"
            );
        }
    }
}

#[test]
fn every_e2m1_code_decodes_to_spec_and_round_trips() {
    check_all_codes(E2M1, e2m1::decode, e2m1::encode_sat);
    // Values ±{0, 0.5, 1, 1.5, 2, 3, 4, 6} (MX §5.3.3).
    let want = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    for (c, w) in want.iter().enumerate() {
        assert_eq!(e2m1::decode(c as u8), *w);
        assert_eq!(e2m1::decode(c as u8 | 0x8), -*w);
    }
    // Only the low nibble is used.
    for b in 0..=255u8 {
        assert_eq!(e2m1::decode(b).to_bits(), e2m1::decode(b & 0xF).to_bits());
    }
}

#[test]
fn every_e4m3_code_decodes_to_spec_and_round_trips() {
    check_all_codes(E4M3, e4m3::decode, e4m3::encode_sat);
    assert_eq!(e4m3::decode(0x7E), 448.0);
    assert_eq!(e4m3::decode(0x08), 2f32.powi(-6));
    assert_eq!(e4m3::decode(0x01), 2f32.powi(-9));
    assert!(e4m3::decode(0x7F).is_nan() && e4m3::decode(0xFF).is_nan());
}

#[test]
fn every_e5m2_code_decodes_to_spec_and_finite_codes_round_trip() {
    check_all_codes(E5M2, e5m2::decode, e5m2::encode_sat);
    assert_eq!(e5m2::decode(0x7B), 57344.0);
    assert_eq!(e5m2::decode(0x7C), f32::INFINITY);
    assert_eq!(e5m2::decode(0xFC), f32::NEG_INFINITY);
    assert_eq!(e5m2::decode(0x01), 2f32.powi(-16));
    // The saturating encoder never produces Inf: decoding Inf and re-encoding gives max.
    assert_eq!(e5m2::encode_sat(e5m2::decode(0x7C)), 0x7B);
    assert_eq!(e5m2::encode_sat(e5m2::decode(0xFC)), 0xFB);
}

#[test]
fn every_e8m0_code_decodes_to_power_of_two_and_round_trips() {
    for c in 0..=254u8 {
        let want = p2(c as i32 - 127);
        let got = e8m0::decode(c);
        assert_eq!(got as f64, want, "code {c}");
        assert_eq!(e8m0::exponent(c), c as i32 - 127);
        assert_eq!(e8m0::from_exponent(e8m0::exponent(c)), c);
        // A power of two is its own floor(log2): the scale of amax = 2^(c-127) with
        // emax_elem = 0 is code c (code 0 exercises the subnormal f32 2^-127).
        assert_eq!(e8m0::mx_scale_for_amax(got, 0), c, "code {c}");
        // The exact reciprocal (the fused MXFP8 output's quotients): 1 / 2^(c-127).
        assert_eq!(e8m0::recip(c) as f64, 1.0 / want, "code {c}");
    }
    assert_eq!(
        e8m0::recip(254).to_bits(),
        1 << 22,
        "1 / 2^127 is the subnormal 2^-127"
    );
    assert!(e8m0::recip(0xFF).is_nan());
    assert_eq!(
        e8m0::decode(0).to_bits(),
        1 << 22,
        "2^-127 is the f32 subnormal 0x00400000"
    );
    assert_eq!(e8m0::decode(127), 1.0);
    assert!(e8m0::decode(0xFF).is_nan());
}

#[test]
fn every_ue4m3_code_decodes_to_spec_and_round_trips() {
    for c in 0..128u32 {
        let want = spec_value(E4M3, c);
        let got = ue4m3::decode(c as u8);
        assert!(same(got, want), "code {c:#04x}: got {got:?}, spec {want:?}");
        // Sign bit ignored.
        assert_eq!(
            ue4m3::decode(c as u8 | 0x80).to_bits(),
            got.to_bits(),
            "code {c:#04x}"
        );
        if c != 0x7F {
            assert_eq!(ue4m3::encode_sat(got), c as u8);
        }
    }
    assert!(ue4m3::decode(0x7F).is_nan());
    assert_eq!(ue4m3::decode(0x7E), 448.0);
}

// ---------------------------------------------------------------------------------------------
// Round to nearest even, by brute force and at every exact midpoint
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]

    #[test]
    fn e2m1_encode_is_nearest_ties_to_even(x in finite_input(E2M1)) {
        prop_assert_eq!(e2m1::encode_sat(x), ref_encode_sat(E2M1, x), "x = {:e}", x);
    }

    #[test]
    fn e4m3_encode_is_nearest_ties_to_even(x in finite_input(E4M3)) {
        prop_assert_eq!(e4m3::encode_sat(x), ref_encode_sat(E4M3, x), "x = {:e}", x);
    }

    #[test]
    fn e5m2_encode_is_nearest_ties_to_even(x in finite_input(E5M2)) {
        prop_assert_eq!(e5m2::encode_sat(x), ref_encode_sat(E5M2, x), "x = {:e}", x);
    }

    #[test]
    fn ue4m3_encode_is_e4m3_nearest_for_non_negative(x in finite_input(E4M3)) {
        let x = x.abs();
        prop_assert_eq!(ue4m3::encode_sat(x), ref_encode_sat(E4M3, x), "x = {:e}", x);
    }
}

/// For each pair of neighbouring non-negative values: the exact midpoint goes to the even code,
/// one f32 ulp above / below it to the upper / lower neighbour; the same for negatives.
fn check_midpoints(s: Spec, encode: fn(f32) -> u8) {
    let t = positive_table(s);
    for w in t.windows(2) {
        let ((c0, v0), (c1, v1)) = (w[0], w[1]);
        let mid = (v0 + v1) / 2.0;
        let m = mid as f32;
        assert_eq!(m as f64, mid, "midpoint must be exact in f32");
        let even = if c0 % 2 == 0 { c0 } else { c1 };
        let sb = s.sign_bit();
        assert_eq!(encode(m), even, "midpoint {mid} of {v0} and {v1}");
        assert_eq!(encode(-m), even | sb, "midpoint -{mid}");
        assert_eq!(encode(next_up(m)), c1, "just above {mid}");
        assert_eq!(encode(next_down(m)), c0, "just below {mid}");
        assert_eq!(encode(-next_up(m)), c1 | sb);
        assert_eq!(encode(-next_down(m)), c0 | sb);
        // The neighbours themselves.
        assert_eq!(encode(v0 as f32), c0);
        assert_eq!(encode(v1 as f32), c1);
    }
}

#[test]
fn every_e2m1_midpoint_rounds_to_even() {
    check_midpoints(E2M1, e2m1::encode_sat);
    // Spelled out: 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4.
    for (x, want) in [
        (0.25f32, 0.0f32),
        (0.75, 1.0),
        (1.25, 1.0),
        (1.75, 2.0),
        (2.5, 2.0),
        (3.5, 4.0),
        (5.0, 4.0),
    ] {
        assert_eq!(e2m1::decode(e2m1::encode_sat(x)), want, "x = {x}");
    }
}

#[test]
fn every_e4m3_midpoint_rounds_to_even() {
    check_midpoints(E4M3, e4m3::encode_sat);
    // 1 + 1/16 is halfway between 1 (0x38) and 1.125 (0x39): even is 0x38.
    assert_eq!(e4m3::encode_sat(1.0625), 0x38);
    // 1 + 3/16 is halfway between 1.125 and 1.25 (0x3A): even is 0x3A.
    assert_eq!(e4m3::encode_sat(1.1875), 0x3A);
    // Top binade 256..=448, spacing 32: 400 is halfway between 384 (0x7C) and 416 (0x7D),
    // 432 between 416 (0x7D) and 448 (0x7E).
    assert_eq!(e4m3::encode_sat(400.0), 0x7C);
    assert_eq!(e4m3::encode_sat(432.0), 0x7E);
}

#[test]
fn every_e5m2_midpoint_rounds_to_even() {
    check_midpoints(E5M2, e5m2::encode_sat);
    // 1.125 is halfway between 1 (0x3C) and 1.25 (0x3D): even is 0x3C.
    assert_eq!(e5m2::encode_sat(1.125), 0x3C);
    assert_eq!(e5m2::encode_sat(1.375), 0x3E);
}

#[test]
fn every_ue4m3_midpoint_rounds_to_even() {
    let t = positive_table(E4M3);
    for w in t.windows(2) {
        let ((c0, v0), (c1, v1)) = (w[0], w[1]);
        let m = ((v0 + v1) / 2.0) as f32;
        let even = if c0 % 2 == 0 { c0 } else { c1 };
        assert_eq!(ue4m3::encode_sat(m), even);
        assert_eq!(ue4m3::encode_sat(next_up(m)), c1);
        assert_eq!(ue4m3::encode_sat(next_down(m)), c0);
    }
}

/// A deterministic sweep over the f32 bit patterns (every 997th, both signs): the encoders
/// agree with the reference on ~4.3M inputs per format.
#[test]
fn encoders_match_reference_on_strided_sweep_of_all_f32() {
    let tables = [
        (E2M1, e2m1::encode_sat as fn(f32) -> u8),
        (E4M3, e4m3::encode_sat),
        (E5M2, e5m2::encode_sat),
    ];
    for (s, enc) in tables {
        // Fast reference for the sweep: binary search in the positive table, same rules.
        let t = positive_table(s);
        let sweep_ref = |x: f32| -> u8 {
            let sign = if x.is_sign_negative() {
                s.sign_bit()
            } else {
                0
            };
            let a = (x as f64).abs();
            if a > s.max {
                return s.max_code | sign;
            }
            let i = t.partition_point(|&(_, v)| v <= a); // t[i-1].1 <= a < t[i].1
            let (c0, v0) = t[i - 1];
            if i == t.len() {
                return c0 | sign;
            }
            let (c1, v1) = t[i];
            let mid = (v0 + v1) / 2.0;
            let c = if a < mid {
                c0
            } else if a > mid {
                c1
            } else if c0 % 2 == 0 {
                c0
            } else {
                c1
            };
            c | sign
        };
        let mut b: u32 = 0;
        while b < 0x7F80_0000 {
            let x = f32::from_bits(b);
            assert_eq!(enc(x), sweep_ref(x), "x = {x:e}");
            assert_eq!(enc(-x), sweep_ref(-x), "x = {:e}", -x);
            b += 997;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Saturation and NaN
// ---------------------------------------------------------------------------------------------

proptest! {
    #[test]
    fn e4m3_encode_saturates_to_448(x in prop_oneof![448.0f32..464.0, 464.0f32..f32::MAX]) {
        prop_assume!(x > 448.0);
        prop_assert_eq!(e4m3::encode_sat(x), 0x7E);
        prop_assert_eq!(e4m3::encode_sat(-x), 0xFE);
    }

    #[test]
    fn e5m2_encode_saturates_to_57344(
        x in prop_oneof![57344.0f32..61440.0, 61440.0f32..f32::MAX]
    ) {
        prop_assume!(x > 57344.0);
        prop_assert_eq!(e5m2::encode_sat(x), 0x7B);
        prop_assert_eq!(e5m2::encode_sat(-x), 0xFB);
    }

    #[test]
    fn e2m1_encode_saturates_to_6(x in prop_oneof![6.0f32..7.0, 7.0f32..f32::MAX]) {
        prop_assume!(x > 6.0);
        prop_assert_eq!(e2m1::encode_sat(x), 0x7);
        prop_assert_eq!(e2m1::encode_sat(-x), 0xF);
    }

    #[test]
    fn ue4m3_encode_saturates_to_448(x in 448.0f32..f32::MAX) {
        prop_assert_eq!(ue4m3::encode_sat(x), 0x7E);
    }

    #[test]
    fn every_nan_payload_encodes_to_the_format_nan(payload in 1u32..(1 << 23), neg in any::<bool>()) {
        let x = f32::from_bits(((neg as u32) << 31) | 0x7F80_0000 | payload);
        prop_assert!(x.is_nan());
        prop_assert_eq!(e4m3::encode_sat(x), if neg { 0xFF } else { 0x7F });
        prop_assert_eq!(e5m2::encode_sat(x), if neg { 0xFF } else { 0x7F });
        prop_assert_eq!(e2m1::encode_sat(x), 0x0);
        prop_assert_eq!(ue4m3::encode_sat(x), 0x7F);
        prop_assert_eq!(e8m0::mx_scale_for_amax(x, 8), 0xFF);
    }
}

#[test]
fn infinities_saturate_to_max_finite() {
    assert_eq!(e4m3::encode_sat(f32::INFINITY), 0x7E);
    assert_eq!(e4m3::encode_sat(f32::NEG_INFINITY), 0xFE);
    assert_eq!(e5m2::encode_sat(f32::INFINITY), 0x7B);
    assert_eq!(e5m2::encode_sat(f32::NEG_INFINITY), 0xFB);
    assert_eq!(e2m1::encode_sat(f32::INFINITY), 0x7);
    assert_eq!(e2m1::encode_sat(f32::NEG_INFINITY), 0xF);
    assert_eq!(ue4m3::encode_sat(f32::INFINITY), 0x7E);
    // The boundary cases: exactly max, the midpoint to the next (unrepresentable) value.
    assert_eq!(e4m3::encode_sat(448.0), 0x7E);
    assert_eq!(e4m3::encode_sat(464.0), 0x7E);
    assert_eq!(e4m3::encode_sat(f32::MAX), 0x7E);
    assert_eq!(e5m2::encode_sat(61440.0), 0x7B);
    assert_eq!(e2m1::encode_sat(7.0), 0x7);
}

#[test]
fn nan_encodings_follow_each_format() {
    assert_eq!(e4m3::encode_sat(f32::NAN), 0x7F);
    assert_eq!(e4m3::encode_sat(-f32::NAN), 0xFF);
    assert!(e5m2::decode(e5m2::encode_sat(f32::NAN)).is_nan());
    assert_eq!(e5m2::encode_sat(f32::NAN), 0x7F);
    assert_eq!(
        e2m1::encode_sat(f32::NAN),
        0x0,
        "E2M1 has no NaN: +0 by contract"
    );
    assert_eq!(ue4m3::encode_sat(f32::NAN), 0x7F);
    assert!(ue4m3::decode(ue4m3::encode_sat(f32::NAN)).is_nan());
}

#[test]
fn ue4m3_negative_inputs_encode_to_zero() {
    for x in [-0.0f32, -1e-30, -1.0, -448.0, -1e30, f32::NEG_INFINITY] {
        assert_eq!(ue4m3::encode_sat(x), 0, "x = {x}");
    }
}

// ---------------------------------------------------------------------------------------------
// Subnormals near zero, and the sign of zero
// ---------------------------------------------------------------------------------------------

#[test]
fn e4m3_subnormals_round_correctly_near_zero() {
    let s = 2f32.powi(-9); // smallest subnormal
    assert_eq!(e4m3::encode_sat(s / 2.0), 0x00, "2^-10 is a tie: even is 0");
    assert_eq!(e4m3::encode_sat(next_up(s / 2.0)), 0x01);
    assert_eq!(e4m3::encode_sat(next_down(s / 2.0)), 0x00);
    assert_eq!(e4m3::encode_sat(-s / 2.0), 0x80, "-2^-10 gives -0");
    assert_eq!(e4m3::encode_sat(1.5 * s), 0x02);
    assert_eq!(e4m3::encode_sat(2.5 * s), 0x02);
    assert_eq!(e4m3::encode_sat(6.5 * s), 0x06);
    assert_eq!(
        e4m3::encode_sat(7.5 * s),
        0x08,
        "into the first normal 2^-6"
    );
    assert_eq!(e4m3::encode_sat(1e-30), 0x00);
    assert_eq!(e4m3::encode_sat(f32::from_bits(1)), 0x00, "f32 subnormal");
    assert_eq!(e4m3::encode_sat(-f32::from_bits(1)), 0x80);
}

#[test]
fn e5m2_subnormals_round_correctly_near_zero() {
    let s = 2f32.powi(-16);
    assert_eq!(e5m2::encode_sat(s / 2.0), 0x00);
    assert_eq!(e5m2::encode_sat(next_up(s / 2.0)), 0x01);
    assert_eq!(e5m2::encode_sat(1.5 * s), 0x02);
    assert_eq!(
        e5m2::encode_sat(3.5 * s),
        0x04,
        "into the first normal 2^-14"
    );
    assert_eq!(e5m2::encode_sat(-s / 4.0), 0x80);
    assert_eq!(e5m2::encode_sat(f32::MIN_POSITIVE), 0x00);
}

#[test]
fn e2m1_subnormal_rounds_correctly_near_zero() {
    assert_eq!(e2m1::encode_sat(0.25), 0x0);
    assert_eq!(e2m1::encode_sat(next_up(0.25)), 0x1);
    assert_eq!(e2m1::encode_sat(-0.25), 0x8);
    assert_eq!(e2m1::encode_sat(-next_up(0.25)), 0x9);
    assert_eq!(e2m1::encode_sat(1e-40), 0x0);
}

#[test]
fn zero_keeps_its_sign() {
    assert_eq!(e4m3::encode_sat(0.0), 0x00);
    assert_eq!(e4m3::encode_sat(-0.0), 0x80);
    assert_eq!(e5m2::encode_sat(0.0), 0x00);
    assert_eq!(e5m2::encode_sat(-0.0), 0x80);
    assert_eq!(e2m1::encode_sat(0.0), 0x0);
    assert_eq!(e2m1::encode_sat(-0.0), 0x8);
    assert!(e4m3::decode(0x80).is_sign_negative() && e4m3::decode(0x80) == 0.0);
    assert!(e5m2::decode(0x80).is_sign_negative() && e5m2::decode(0x80) == 0.0);
    assert!(e2m1::decode(0x8).is_sign_negative() && e2m1::decode(0x8) == 0.0);
    assert_eq!(ue4m3::encode_sat(0.0), 0x00);
}

// ---------------------------------------------------------------------------------------------
// E8M0 and the MX shared-scale rule
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20_000))]

    /// MX v1.0 §6.3: 2^e <= amax / 2^emax_elem < 2^(e+1), exactly, unless clamped to the E8M0
    /// range 2^-127..=2^127 (emax 0 and -23 reach subnormal amax and the upper clamp).
    #[test]
    fn mx_scale_for_amax_brackets_amax(
        bits in 1u32..0x7F80_0000,
        emax in prop_oneof![Just(2i32), Just(8), Just(15), Just(0), Just(-23)],
        neg in any::<bool>(),
    ) {
        let amax = f32::from_bits(bits | ((neg as u32) << 31));
        let code = e8m0::mx_scale_for_amax(amax, emax);
        prop_assert_ne!(code, 0xFF);
        let e = e8m0::exponent(code);
        let ratio = f32::from_bits(bits) as f64 / p2(emax); // exact in f64
        if ratio >= p2(128) {
            prop_assert_eq!(e, 127, "clamped above");
        } else if ratio >= p2(-127) {
            prop_assert!(p2(e) <= ratio && ratio < p2(e + 1), "amax {:e} emax {} e {}", amax, emax, e);
        } else {
            prop_assert_eq!(e, -127, "clamped below");
        }
        prop_assert_eq!(e8m0::decode(code) as f64, p2(e));
    }
}

#[test]
fn mx_scale_for_amax_known_values() {
    // A block whose amax is the element max gets scale 1.
    assert_eq!(e8m0::mx_scale_for_amax(6.0, e2m1::EMAX), 127);
    assert_eq!(e8m0::mx_scale_for_amax(448.0, e4m3::EMAX), 127);
    assert_eq!(e8m0::mx_scale_for_amax(57344.0, e5m2::EMAX), 127);
    // amax just under 8 with E2M1: floor(log2) = 2, scale 1; amax = 8: scale 2.
    assert_eq!(e8m0::mx_scale_for_amax(next_down(8.0), 2), 127);
    assert_eq!(e8m0::mx_scale_for_amax(8.0, 2), 128);
    assert_eq!(e8m0::mx_scale_for_amax(1.0, 8), 119);
    // Largest finite f32: floor(log2) = 127.
    assert_eq!(e8m0::mx_scale_for_amax(f32::MAX, 0), 254);
    assert_eq!(e8m0::mx_scale_for_amax(f32::MAX, 2), 252);
    // Smallest f32 subnormal, 2^-149: clamped to 2^-127.
    assert_eq!(e8m0::mx_scale_for_amax(f32::from_bits(1), 2), 0);
    // Subnormal amax, exact floor(log2): 2^-127 + tiny, with emax 0 -> -127; 2^-126 -> -126.
    assert_eq!(e8m0::mx_scale_for_amax(f32::from_bits(0x0040_0001), 0), 0);
    assert_eq!(e8m0::mx_scale_for_amax(f32::from_bits(0x007F_FFFF), 0), 0);
    assert_eq!(e8m0::mx_scale_for_amax(f32::MIN_POSITIVE, 0), 1);
    assert_eq!(e8m0::mx_scale_for_amax(f32::from_bits(0x0040_0000), -1), 1);
}

#[test]
fn mx_scale_for_amax_of_zero_is_smallest_scale() {
    assert_eq!(e8m0::mx_scale_for_amax(0.0, 2), 0);
    assert_eq!(e8m0::mx_scale_for_amax(-0.0, 8), 0);
    assert_eq!(e8m0::decode(0) as f64, p2(-127));
}

#[test]
fn mx_scale_for_amax_of_nan_or_inf_is_nan() {
    assert_eq!(e8m0::mx_scale_for_amax(f32::NAN, 2), 0xFF);
    assert_eq!(e8m0::mx_scale_for_amax(f32::INFINITY, 2), 0xFF);
    assert_eq!(e8m0::mx_scale_for_amax(f32::NEG_INFINITY, 2), 0xFF);
}

#[test]
fn e8m0_from_exponent_clamps_to_range() {
    assert_eq!(e8m0::from_exponent(-127), 0);
    assert_eq!(e8m0::from_exponent(-128), 0);
    assert_eq!(e8m0::from_exponent(i32::MIN), 0);
    assert_eq!(e8m0::from_exponent(0), 127);
    assert_eq!(e8m0::from_exponent(127), 254);
    assert_eq!(e8m0::from_exponent(128), 254, "never the NaN code");
    assert_eq!(e8m0::from_exponent(i32::MAX), 254);
}

// ---------------------------------------------------------------------------------------------
// Packing
// ---------------------------------------------------------------------------------------------

#[test]
fn e2m1_pack_unpack_round_trips_for_every_byte_low_nibble_first() {
    for b in 0..=255u8 {
        let (lo, hi) = e2m1::unpack(b);
        assert_eq!(lo, b & 0x0F, "element 2i is the low nibble");
        assert_eq!(hi, b >> 4, "element 2i+1 is the high nibble");
        assert_eq!(e2m1::pack(lo, hi), b);
    }
    for lo in 0..16u8 {
        for hi in 0..16u8 {
            assert_eq!(e2m1::unpack(e2m1::pack(lo, hi)), (lo, hi));
        }
    }
    // 1.0 (0x2) then -6.0 (0xF): byte 0xF2.
    assert_eq!(
        e2m1::pack(e2m1::encode_sat(1.0), e2m1::encode_sat(-6.0)),
        0xF2
    );
    // High bits of the arguments are ignored.
    assert_eq!(e2m1::pack(0xF3, 0xA4), 0x43);
}

// ---------------------------------------------------------------------------------------------
// ulp
// ---------------------------------------------------------------------------------------------

fn check_ulp(s: Spec, decode: fn(u8) -> f32, ulp: fn(f32) -> f32) {
    let emin = 1 - s.bias;
    for c in 0..s.max_code {
        let v = decode(c);
        let gap = decode(c + 1) - v;
        assert_eq!(gap, ulp(v), "code {c:#04x} ({v})");
        assert_eq!(ulp(-v), ulp(v));
    }
    // Below the smallest normal: the subnormal spacing 2^(emin - m), also for values
    // between the codes.
    let sub = p2(emin - s.mbits as i32) as f32;
    assert_eq!(ulp(0.0), sub);
    assert_eq!(ulp(1e-30), sub);
    assert_eq!(ulp(f32::from_bits(1)), sub);
    assert_eq!(ulp(next_down(p2(emin) as f32)), sub);
    // The top binade's spacing at and beyond max.
    let top = decode(s.max_code) - decode(s.max_code - 1);
    assert_eq!(ulp(s.max as f32), top);
    assert_eq!(ulp(f32::INFINITY), top);
    assert!(ulp(f32::NAN).is_nan());
}

#[test]
fn ulp_equals_gap_to_next_code_for_every_e2m1_code() {
    check_ulp(E2M1, e2m1::decode, e2m1::ulp);
}

#[test]
fn ulp_equals_gap_to_next_code_for_every_e4m3_code() {
    check_ulp(E4M3, e4m3::decode, e4m3::ulp);
}

#[test]
fn ulp_equals_gap_to_next_code_for_every_e5m2_code() {
    check_ulp(E5M2, e5m2::decode, e5m2::ulp);
}

proptest! {
    /// The rounding error of encode_sat is at most half an ulp inside the finite range.
    #[test]
    fn e4m3_rounding_error_is_at_most_half_ulp(x in -448.0f32..448.0) {
        let q = e4m3::decode(e4m3::encode_sat(x));
        prop_assert!(((q - x).abs() as f64) <= e4m3::ulp(x) as f64 / 2.0);
    }
}

// ---------------------------------------------------------------------------------------------
// Constants and the ElemType / ScaleType enums
// ---------------------------------------------------------------------------------------------

#[test]
fn constants_match_the_specs() {
    assert_eq!((e2m1::MAX, e2m1::EMAX, e2m1::EMIN), (6.0, 2, 0));
    assert_eq!((e2m1::MANTISSA_BITS, e2m1::BITS), (1, 4));
    assert_eq!((e4m3::MAX, e4m3::EMAX, e4m3::EMIN), (448.0, 8, -6));
    assert_eq!((e4m3::MANTISSA_BITS, e4m3::BITS), (3, 8));
    assert_eq!((e5m2::MAX, e5m2::EMAX, e5m2::EMIN), (57344.0, 15, -14));
    assert_eq!((e5m2::MANTISSA_BITS, e5m2::BITS), (2, 8));
    for (max, emax) in [(E2M1.max, 2), (E4M3.max, 8), (E5M2.max, 15)] {
        assert!(p2(emax) <= max && max < p2(emax + 1));
    }
}

#[test]
fn elem_type_dispatches_to_its_module() {
    let all = [
        (
            ElemType::E4M3,
            0u32,
            "e4m3",
            e4m3::decode as fn(u8) -> f32,
            E4M3,
        ),
        (ElemType::E5M2, 1, "e5m2", e5m2::decode, E5M2),
        (ElemType::E2M1, 2, "e2m1", e2m1::decode, E2M1),
    ];
    for (t, v, name, dec, s) in all {
        assert_eq!(t as u32, v);
        assert_eq!(ElemType::from_u32(v), Some(t));
        assert_eq!(t.name(), name);
        assert_eq!(t.bits(), s.bits());
        assert_eq!(t.max() as f64, s.max);
        assert_eq!(t.emax(), ((s.max.log2()).floor()) as i32);
        // The smallest normal exponent is 1 − bias (exponent field 1).
        assert_eq!(t.emin(), 1 - s.bias, "{name}");
        assert_eq!(t.mantissa_bits(), s.mbits, "{name}");
        for c in 0..=255u8 {
            assert_eq!(t.decode(c as u32).to_bits(), dec(c).to_bits());
            let x = f32::from_bits(0x3F80_0000u32.wrapping_add((c as u32) << 19));
            assert_eq!(t.encode_sat(x), ref_encode_sat(s, x) as u32);
            assert_eq!(t.ulp(x).to_bits(), {
                match t {
                    ElemType::E4M3 => e4m3::ulp(x),
                    ElemType::E5M2 => e5m2::ulp(x),
                    ElemType::E2M1 => e2m1::ulp(x),
                    ElemType::BF16 | ElemType::F16 => unreachable!("not in the list"),
                }
                .to_bits()
            });
        }
    }
    // bf16: the upper half of an f32.
    let t = ElemType::BF16;
    assert_eq!(
        (t as u32, ElemType::from_u32(3), t.name(), t.bits()),
        (3, Some(t), "bf16", 16)
    );
    assert_eq!((t.emax(), t.emin(), t.mantissa_bits()), (127, -126, 7));
    assert_eq!(t.max(), f32::from_bits(0x7F7F_0000));
    for c in (0..=0xFFFFu32).step_by(97) {
        let v = f32::from_bits(c << 16);
        assert!(t.decode(c).to_bits() == v.to_bits() || v.is_nan());
        if v.is_finite() {
            assert_eq!(t.encode_sat(v), c);
        }
    }
    // fp16: IEEE binary16, checked against the `half` crate (every code decoded; f32 values of
    // every binade, halfway cases included, rounded as `half` rounds, except that values past
    // 65504 saturate where IEEE rounding gives Inf).
    let t = ElemType::F16;
    assert_eq!(
        (t as u32, ElemType::from_u32(4), t.name(), t.bits()),
        (4, Some(t), "f16", 16)
    );
    assert_eq!((t.emax(), t.emin(), t.mantissa_bits()), (15, -14, 10));
    assert_eq!(t.max(), 65504.0);
    for c in 0..=0xFFFFu32 {
        let want = half::f16::from_bits(c as u16).to_f32();
        let got = t.decode(c);
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "{c:#x}"
        );
    }
    for bits in (0..=0xFFFF_FFFFu32)
        .step_by(4099)
        .chain((0..=0xFFFFu32).map(|c| {
            // Halfway between fp16 neighbours, in every binade from 1 up to past the largest.
            0x3F80_0000 + (c << 12) + 0x1000
        }))
    {
        let x = f32::from_bits(bits);
        let want = half::f16::from_f32(x);
        let got = t.encode_sat(x);
        if x.is_nan() {
            assert!(t.decode(got).is_nan());
        } else if want.is_infinite() {
            assert_eq!(got, if x > 0.0 { 0x7BFF } else { 0xFBFF }, "{x}");
        } else {
            assert_eq!(got, want.to_bits() as u32, "{x} ({bits:#x})");
        }
    }
    assert_eq!(ElemType::from_u32(5), None);
}

#[test]
fn scale_type_dispatches_to_its_module() {
    assert_eq!(
        (
            ScaleType::E8M0 as u32,
            ScaleType::UE4M3 as u32,
            ScaleType::F32 as u32
        ),
        (0, 1, 2)
    );
    assert_eq!(
        (
            ScaleType::E8M0.bytes(),
            ScaleType::UE4M3.bytes(),
            ScaleType::F32.bytes()
        ),
        (1, 1, 4)
    );
    for (t, name) in [
        (ScaleType::E8M0, "e8m0"),
        (ScaleType::UE4M3, "ue4m3"),
        (ScaleType::F32, "f32"),
    ] {
        assert_eq!(ScaleType::from_u32(t as u32), Some(t));
        assert_eq!(t.name(), name);
    }
    assert_eq!(ScaleType::from_u32(3), None);
    for c in 0..=255u32 {
        assert_eq!(
            ScaleType::E8M0.decode_bits(c).to_bits(),
            e8m0::decode(c as u8).to_bits()
        );
        assert_eq!(
            ScaleType::UE4M3.decode_bits(c).to_bits(),
            ue4m3::decode(c as u8).to_bits()
        );
    }
    for b in [0u32, 0x3F80_0000, 0xC2C8_0000, 1, 0x7F80_0000] {
        assert_eq!(ScaleType::F32.decode_bits(b).to_bits(), b);
    }
}
