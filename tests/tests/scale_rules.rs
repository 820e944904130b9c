//! The quantizers' scales against values worked out by hand from each recipe's published rule,
//! never from the quantizer's own scale function: for each case the expected stored scale (its
//! bits) and every expected dequantized value are literals, derived in the comment beside them.
//!
//! # The rules
//!
//! - **MX (e8m0 scales)**: OCP *Microscaling Formats (MX) Specification* v1.0, §6.3 "Conversion
//!   from vector of scalar floating-point to MX format", Algorithm 1: `shared_exp =
//!   floor(log2(max|V_i|)) − emax_elem`, `X = 2^shared_exp`, `P_i = quantize_to_element(V_i / X)`
//!   (round to nearest even, normal values clamped to the element maximum). `emax_elem` is 8 for
//!   E4M3, 15 for E5M2, 2 for E2M1. `shared_exp` is clamped to the E8M0 range `[−127, 127]` (the
//!   spec's E8M0 §5.4.1 range; the OCP reference code `microxcaling` clamps below at −127), so
//!   every subnormal `f32` maximum gets `2^−127`, code 0. Finite input never reaches the upper
//!   clamp: `floor(log2(f32::MAX)) − emax_elem ≤ 125`. An all-zero block has no `log2`; it gets
//!   the smallest scale, code 0 (this crate's documented choice).
//! - **fp32 scales (DeepSeek-V3 1×128 / 128×128, per tensor, per row)**: DeepSeek-V3 technical
//!   report §3.3 "fine-grained quantization" and its `inference/kernel.py` `act_quant`:
//!   `s = amax / 448` (the element maximum: 448 for E4M3, 57344 for E5M2), `q = e4m3(x / s)`. In
//!   f32 the quotient is rounded to nearest while it is a normal number; below `max · 2^−126` this
//!   crate rounds it up to a multiple of `2^−149` (never zero, and the block maximum never lands
//!   above the element maximum). An all-zero block gets `s = 1`.
//! - **NVFP4 (ue4m3 block scales + fp32 tensor scale)**: NVIDIA, "Introducing NVFP4 for efficient
//!   and accurate low-precision inference" and Transformer Engine's NVFP4 recipe: a per-tensor fp32
//!   scale that maps the tensor maximum onto `448 · 6` (the largest ue4m3 block scale times the
//!   largest e2m1 element), here stored as the decode scale `t = amax(tensor) / 2688`; a block
//!   scale `ue4m3(amax(block) / 6 / t)` rounded to nearest even; elements `e2m1(x / (scale · t))`.
//!   A non-zero block whose scale rounds to zero gets the smallest ue4m3 scale `2^−9` (code 1), an
//!   all-zero tensor `t = 1`; the subnormal rule for `t` is the fp32 one above.
//!
//! Non-finite input is an [`Error::Format`] for every recipe: an e8m0 scale of it would be NaN and
//! an fp32 or ue4m3 scale finite garbage.

use blockscaled::{Error, Fp8, OperandFormat, Recipe, ScaleType, ScaledMatrix};

/// `2^e`, exact.
fn p2(e: i32) -> f64 {
    2f64.powi(e)
}

/// The `f32` with these bits.
fn bits(b: u32) -> f32 {
    f32::from_bits(b)
}

/// One row made of blocks of `len` elements: each block's (input, expected dequantized value)
/// pairs, padded with zeros (which stay zeros under every scale).
fn row(len: usize, blocks: &[&[(f32, f64)]]) -> (Vec<f32>, Vec<f64>) {
    let mut v = Vec::new();
    let mut w = Vec::new();
    for b in blocks {
        assert!(b.len() <= len);
        for i in 0..len {
            let (x, want) = b.get(i).copied().unwrap_or((0.0, 0.0));
            v.push(x);
            w.push(want);
        }
    }
    (v, w)
}

/// Quantizes `v` as one row in `fmt` and checks the stored scale of each block (the e8m0 or ue4m3
/// byte, or the f32 bits), the tensor scale's bits and every dequantized value.
fn check_row(fmt: OperandFormat, (v, want): (Vec<f32>, Vec<f64>), scales: &[u32], tensor: u32) {
    let q = ScaledMatrix::quantize(&v, 1, v.len(), 1, fmt).unwrap_or_else(|e| panic!("{fmt}: {e}"));
    let (_, bk) = fmt.block.extent(1, v.len());
    let stored: Vec<u32> = (0..v.len().div_ceil(bk))
        .map(|kb| {
            let i = q.scale_layout().index(0, 0, kb);
            match fmt.scale {
                ScaleType::F32 => {
                    u32::from_le_bytes(q.scales()[4 * i..4 * i + 4].try_into().unwrap())
                }
                _ => q.scales()[i] as u32,
            }
        })
        .collect();
    assert_eq!(stored, scales, "{fmt}: block scales (bits)");
    assert_eq!(
        q.tensor_scale().to_bits(),
        tensor,
        "{fmt}: tensor scale {:e}",
        q.tensor_scale()
    );
    for (k, (&x, &w)) in v.iter().zip(&want).enumerate() {
        let got = q.value(0, 0, k);
        assert!(
            got == w,
            "{fmt}: element {k}: {x:e} dequantizes to {got:e}; the rule gives {w:e}"
        );
    }
}

const ONE: u32 = 0x3F80_0000; // 1.0f32: the tensor scale of every format without one

fn mx_e4m3() -> OperandFormat {
    Recipe::Mxfp8(Fp8::E4M3).a()
}
fn mx_e5m2() -> OperandFormat {
    Recipe::Mxfp8(Fp8::E5M2).a()
}

// ---- MX: e8m0 = 2^(floor(log2 amax) − emax_elem), clamped to [2^−127, 2^127] ----

#[test]
fn e8m0_scale_of_a_power_of_two_amax_is_exact() {
    // amax 8 = 2^3. E4M3: 3 − 8 = −5, code 127 − 5 = 122, X = 2^−5: 8 → 256 (exact),
    // 3 → 96, −1 → −32, 0.3 → 9.6 → 10 (spacing 1 in [8, 16)) → 10·2^−5 = 0.3125,
    // 0.01 → 0.32 → 10·2^−5 (spacing 2^−5 in [0.25, 0.5)) → 10·2^−10.
    let e4m3: &[(f32, f64)] = &[
        (8.0, 8.0),
        (3.0, 3.0),
        (-1.0, -1.0),
        (0.3, 0.3125),
        (0.01, 10.0 * p2(-10)),
    ];
    check_row(mx_e4m3(), row(32, &[e4m3]), &[122], ONE);
    // E5M2: 3 − 15 = −12, code 115: 8 → 2^15, 3 → 1.5·2^13, 0.3 → 1228.8 → 1280 (spacing 256
    // in [1024, 2048)) → 1280·2^−12 = 0.3125.
    let e5m2: &[(f32, f64)] = &[(8.0, 8.0), (3.0, 3.0), (-1.0, -1.0), (0.3, 0.3125)];
    check_row(mx_e5m2(), row(32, &[e5m2]), &[115], ONE);
    // E2M1 (MXFP4 and the 1×16 variant): 3 − 2 = 1, code 128, X = 2: 8 → 4, 3 → 1.5,
    // −1 → −0.5, 0.3 → 0.15 → 0, 0.5 → 0.25 (tie: even 0), 5 → 2.5 (tie: even 2) → 4,
    // 7 → 3.5 (tie: even 4) → 8.
    let e2m1: &[(f32, f64)] = &[
        (8.0, 8.0),
        (3.0, 3.0),
        (-1.0, -1.0),
        (0.3, 0.0),
        (0.5, 0.0),
        (5.0, 4.0),
        (7.0, 8.0),
    ];
    check_row(Recipe::Mxfp4.a(), row(32, &[e2m1]), &[128], ONE);
    check_row(
        Recipe::E2m1E8m0x16.b(),
        row(16, &[e2m1, e2m1]),
        &[128, 128],
        ONE,
    );
}

#[test]
fn e8m0_scale_of_an_amax_just_below_a_power_of_two_is_one_binade_lower() {
    // next_down(8) = 8 − 2^−21 (0x40FF_FFFF): floor(log2) = 2. E4M3: code 127 + 2 − 8 = 121,
    // X = 2^−6: 512 − 2^−15 saturates to 448 → 7. E5M2: code 114, 2^16 − 2^−8 → 57344 → 7.
    // E2M1: code 127, X = 1: → 6. (The spec's rule lets a block maximum saturate.)
    let a = bits(0x40FF_FFFF);
    check_row(mx_e4m3(), row(32, &[&[(a, 7.0), (1.0, 1.0)]]), &[121], ONE);
    check_row(mx_e5m2(), row(32, &[&[(a, 7.0), (1.0, 1.0)]]), &[114], ONE);
    check_row(
        Recipe::Mxfp4.b(),
        row(32, &[&[(a, 6.0), (1.0, 1.0)]]),
        &[127],
        ONE,
    );
}

#[test]
fn e8m0_scale_of_an_amax_just_above_a_power_of_two_is_that_power_s() {
    // next_up(8) = 8 + 2^−20 (0x4100_0001): floor(log2) = 3, as for 8. E4M3: code 122,
    // 256 + 2^−15 → 256 → 8. E2M1: code 128, 4 + 2^−21 → 4 → 8.
    let a = bits(0x4100_0001);
    check_row(
        mx_e4m3(),
        row(32, &[&[(a, 8.0), (-2.0, -2.0)]]),
        &[122],
        ONE,
    );
    check_row(
        Recipe::Mxfp4.a(),
        row(32, &[&[(a, 8.0), (-2.0, -2.0)]]),
        &[128],
        ONE,
    );
}

#[test]
fn e8m0_scale_of_a_near_max_amax_stays_finite() {
    // f32::MAX = (2 − 2^−23)·2^127: floor(log2) = 127. E4M3: code 127 + 127 − 8 = 246,
    // X = 2^119: MAX → 512 − 2^−15 → 448 → 1.75·2^127; 2^120 → 2 → 2^120; 1 → 2^−119 → 0.
    // E5M2: code 239, X = 2^112: MAX → 57344 → 1.75·2^127. E2M1: code 252, X = 2^125:
    // MAX → 6 → 1.5·2^127; −2^126 → −2 → −2^126.
    let m = f32::MAX;
    let big = p2(127);
    let e4m3: &[(f32, f64)] = &[(m, 1.75 * big), (p2(120) as f32, p2(120)), (1.0, 0.0)];
    check_row(mx_e4m3(), row(32, &[e4m3]), &[246], ONE);
    check_row(mx_e5m2(), row(32, &[&[(-m, -1.75 * big)]]), &[239], ONE);
    let e2m1: &[(f32, f64)] = &[(m, 1.5 * big), (-(p2(126) as f32), -p2(126))];
    check_row(Recipe::Mxfp4.a(), row(32, &[e2m1]), &[252], ONE);
}

#[test]
fn e8m0_scale_of_a_subnormal_amax_is_clamped_to_2_pow_minus_127() {
    // amax 2^−140 (0x0000_0200): E4M3 −140 − 8 = −148, clamped to −127: code 0; 2^−140 / 2^−127
    // = 2^−13 is below half of E4M3's smallest subnormal 2^−9, so it flushes to 0. E5M2: code 0,
    // 2^−13 is an E5M2 normal (min 2^−14): exact. E2M1: code 0, flushes.
    let t = bits(0x200);
    check_row(mx_e4m3(), row(32, &[&[(t, 0.0)]]), &[0], ONE);
    check_row(mx_e5m2(), row(32, &[&[(t, p2(-140))]]), &[0], ONE);
    check_row(Recipe::Mxfp4.a(), row(32, &[&[(-t, 0.0)]]), &[0], ONE);
    // 1e-40 is 71362·2^−149 (0x0001_16C2), floor(log2) = 16 − 149 = −133: E5M2 code 0;
    // 71362·2^−22 = 4.3556·2^−8 → 4·2^−8 (spacing 2^−8 in [2^−6, 2^−5)) → 2^−6 · 2^−127.
    check_row(mx_e5m2(), row(32, &[&[(1e-40, p2(-133))]]), &[0], ONE);
    // amax 2^−125 (normal): E2M1 −125 − 2 = −127 exactly, code 0, no clamp: 2^−125 → 4 → exact;
    // E4M3 −133 is clamped to −127: 2^−125 → 4, exact too.
    let n = p2(-125) as f32;
    check_row(Recipe::Mxfp4.a(), row(32, &[&[(n, p2(-125))]]), &[0], ONE);
    check_row(mx_e4m3(), row(32, &[&[(n, p2(-125))]]), &[0], ONE);
}

#[test]
fn e8m0_scale_of_an_all_zero_block_is_the_smallest_and_each_block_has_its_own() {
    // Block 0 all zeros (−0 included): code 0, zeros. Block 1 amax 0.75: floor(log2) = −1,
    // E4M3 code 127 − 1 − 8 = 118, X = 2^−9: 0.75 → 384 → 0.75.
    check_row(
        mx_e4m3(),
        row(32, &[&[(-0.0, 0.0)], &[(0.75, 0.75)]]),
        &[0, 118],
        ONE,
    );
}

// ---- fp32: s = amax / max(elem) ----

#[test]
fn f32_scale_maps_the_block_maximum_onto_the_element_maximum() {
    // DeepSeek A (1×128): amax 3.5 → s = 3.5 / 448 = 2^−7 (0x3C00_0000): 3.5 → 448, 1 → 128,
    // 0.3 → 38.4 → 40 (spacing 4 in [32, 64)) → 0.3125, −0.001 → −0.128 → −0.125 (spacing 2^−6 in
    // [2^−3, 2^−2)) → −2^−10. Block 1 amax 1: s = nearest f32 to 1/448 = 2^−6/7, 1/7 =
    // 0.001001…₂ rounded up at its 24th bit: 0x3B12_4925; 1/s = 448 − 9e−6 → 448 → 448·s.
    let s1 = bits(0x3B12_4925) as f64;
    let b0: &[(f32, f64)] = &[(3.5, 3.5), (1.0, 1.0), (0.3, 0.3125), (-0.001, -p2(-10))];
    let b1: &[(f32, f64)] = &[(1.0, 448.0 * s1)];
    check_row(
        Recipe::DeepSeekFp8.a(),
        row(128, &[b0, b1]),
        &[0x3C00_0000, 0x3B12_4925],
        ONE,
    );
    // Per row, E5M2: amax 56 → s = 56 / 57344 = 2^−10 (0x3A80_0000): 1 → 1024 (exact),
    // 0.3 → 307.2 → 320 (spacing 64 in [256, 512)) → 0.3125.
    check_row(
        Recipe::Fp8PerRow(Fp8::E5M2).a(),
        row(40, &[&[(56.0, 56.0), (1.0, 1.0), (0.3, 0.3125)]]),
        &[0x3A80_0000],
        ONE,
    );
}

#[test]
fn f32_scale_of_a_near_max_amax_stays_finite() {
    // f32::MAX = (2^24 − 1)·2^104 and 2^24 − 1 = 7 · 2396745: MAX / 448 = 2396745·2^98
    // (0x7B12_4924) exactly, so MAX → 448 → MAX; 2^125 → 2^27 / 2396745 ≈ 56.0 → 56 (spacing 8
    // in [32, 64)) → 56·s; 1 → ~1e−36 → 0.
    let m = f32::MAX;
    let s = bits(0x7B12_4924) as f64;
    let v: &[(f32, f64)] = &[
        (m, m as f64),
        (p2(125) as f32, 56.0 * s),
        (1.0, 0.0),
        (-m, -(m as f64)),
    ];
    check_row(
        Recipe::Fp8PerTensor(Fp8::E4M3).a(),
        row(8, &[v]),
        &[0x7B12_4924],
        ONE,
    );
    // E5M2: MAX / 57344 = 2396745·2^95 (0x7792_4924) exactly: MAX → 57344 → MAX.
    check_row(
        Recipe::Fp8PerRow(Fp8::E5M2).b(),
        row(8, &[&[(-m, -(m as f64))]]),
        &[0x7792_4924],
        ONE,
    );
}

#[test]
fn f32_scale_of_an_amax_below_448_times_2_pow_minus_126_keeps_the_block() {
    // amax 448·2^−126 (0x04E0_0000): s = 2^−126 (0x0080_0000), the smallest normal: exact.
    let edge = bits(0x04E0_0000);
    check_row(
        Recipe::DeepSeekFp8.a(),
        row(128, &[&[(edge, edge as f64)]]),
        &[0x0080_0000],
        ONE,
    );
    // One f32 below (0x04DF_FFFF = (1.75 − 2^−23)·2^−118): amax / 448 = (2^23 − 4/7)·2^−149, a
    // subnormal (nearest: 2^23 − 1 units), rounded up to 2^23·2^−149 = 2^−126; amax / s =
    // 448 − 2^−15 → 448 → 448·2^−126.
    check_row(
        Recipe::DeepSeekFp8.a(),
        row(128, &[&[(bits(0x04DF_FFFF), edge as f64)]]),
        &[0x0080_0000],
        ONE,
    );
    // amax 448·2^−130 = 1.75·2^−122 (0x02E0_0000): s = 2^−130 (0x0008_0000), a subnormal, exact:
    // amax → 448; 3·2^−130 → 3; 0.3·2^−130 is 157286·2^−149 → 0.29999924 → 0.3125 (spacing 2^−5
    // in [0.25, 0.5)) → 0.3125·2^−130.
    let v: &[(f32, f64)] = &[
        (bits(0x02E0_0000), 448.0 * p2(-130)),
        ((3.0 * p2(-130)) as f32, 3.0 * p2(-130)),
        ((0.3 * p2(-130)) as f32, 0.3125 * p2(-130)),
    ];
    check_row(Recipe::DeepSeekFp8.a(), row(128, &[v]), &[0x0008_0000], ONE);
    // Per tensor E5M2, amax 57344·2^−140 = 1.75·2^−125 (0x0160_0000): s = 2^−140 (0x0000_0200).
    check_row(
        Recipe::Fp8PerTensor(Fp8::E5M2).b(),
        row(4, &[&[(bits(0x0160_0000), 57344.0 * p2(-140))]]),
        &[0x200],
        ONE,
    );
}

#[test]
fn f32_scale_of_a_subnormal_amax_is_rounded_up_to_a_multiple_of_2_pow_minus_149() {
    // 1e-40 = 71362·2^−149: amax / 448 = 159.29·2^−149, rounded up to 160·2^−149 (0xA0):
    // 71362 / 160 = 446.01 → 448 (spacing 32 in [256, 512)) → 448·160·2^−149; 2^−149 → 1/160
    // = 3.2·2^−9 → 3·2^−9 (E4M3 subnormal) → 3·2^−9·160·2^−149.
    let u = p2(-149);
    let v: &[(f32, f64)] = &[
        (1e-40, 448.0 * 160.0 * u),
        (bits(1), 3.0 * p2(-9) * 160.0 * u),
    ];
    check_row(Recipe::DeepSeekFp8.a(), row(128, &[v]), &[0xA0], ONE);
    // The smallest subnormal, 2^−149: amax / 448 rounds up to 2^−149 (0x1): 2^−149 → 1 → exact,
    // for E4M3 and E5M2 alike.
    check_row(
        Recipe::Fp8PerRow(Fp8::E4M3).a(),
        row(4, &[&[(bits(1), u), (-bits(1), -u)]]),
        &[1],
        ONE,
    );
    check_row(
        Recipe::Fp8PerTensor(Fp8::E5M2).a(),
        row(4, &[&[(bits(1), u)]]),
        &[1],
        ONE,
    );
}

#[test]
fn f32_scale_of_an_all_zero_block_is_one() {
    check_row(
        Recipe::DeepSeekFp8.a(),
        // Block 1: 0.5 / 448 = 2^−7/7, 0x3A92_4925 (1/7 rounded up, as for 1/448 above); 0.5 / s
        // = 448 − 9e−6 → 448 → 448·s.
        row(
            128,
            &[
                &[(0.0, 0.0), (-0.0, 0.0)],
                &[(0.5, 448.0 * bits(0x3A92_4925) as f64)],
            ],
        ),
        &[ONE, 0x3A92_4925],
        ONE,
    );
}

// ---- NVFP4: t = amax(tensor) / 2688, block scale ue4m3(amax(block) / 6 / t) ----

#[test]
fn nvfp4_scales_follow_the_two_level_rule() {
    // Tensor amax 2688 → t = 1. Block 0 amax 2688: 2688 / 6 = 448, code 0x7E; 2688 → 6,
    // 1344 → 3, −448 → −1, 100 → 0.22 → 0. Block 1 amax 1.5: 0.25 = 2^−2, code 0x28 (exponent
    // field 5); 1.5 → 6, 0.75 → 3, 0.1 → 0.4 → 0.5 → 0.125, −0.2 → −0.8 → −1 → −0.25.
    // Block 2 amax 7.8: 1.3 → 1.25 (spacing 1/8 in [1, 2)), code 0x3A; 7.8 → 6.24 → 6 → 7.5
    // (saturates), 5 → 4 → 5, 2 → 1.6 → 1.5 → 1.875.
    let b0: &[(f32, f64)] = &[
        (2688.0, 2688.0),
        (1344.0, 1344.0),
        (-448.0, -448.0),
        (100.0, 0.0),
    ];
    let b1: &[(f32, f64)] = &[(1.5, 1.5), (0.75, 0.75), (0.1, 0.125), (-0.2, -0.25)];
    let b2: &[(f32, f64)] = &[(7.8, 7.5), (5.0, 5.0), (2.0, 1.875)];
    check_row(
        Recipe::Nvfp4.a(),
        row(16, &[b0, b1, b2]),
        &[0x7E, 0x28, 0x3A],
        ONE,
    );
}

#[test]
fn nvfp4_block_far_below_the_tensor_maximum_gets_the_smallest_ue4m3_scale() {
    // t = 1 (block 0 amax 2688). Block 1 amax 0.003: 0.0005 is below 2^−10, half of ue4m3's
    // smallest subnormal, so it rounds to 0 and becomes code 1 (2^−9): 0.003 → 1.536 → 1.5 →
    // 1.5·2^−9, 0.001 → 0.512 → 0.5 → 2^−10. Block 2 amax 6·2^−8: 2^−8 = 2·2^−9, the ue4m3
    // subnormal code 2; 6·2^−8 → 6, exact.
    let b1: &[(f32, f64)] = &[(0.003, 1.5 * p2(-9)), (0.001, p2(-10))];
    let b2: &[(f32, f64)] = &[((6.0 * p2(-8)) as f32, 6.0 * p2(-8))];
    check_row(
        Recipe::Nvfp4.b(),
        row(16, &[&[(2688.0, 2688.0)], b1, b2]),
        &[0x7E, 1, 2],
        ONE,
    );
}

#[test]
fn nvfp4_tensor_scale_of_a_tiny_tensor_is_its_amax_over_2688_not_one() {
    // amax 2688·2^−140 = 21·2^−133 (0x0015_0000): t = 2^−140 (0x0000_0200), a subnormal, exact;
    // block scale 448 (0x7E): amax → 6 → amax, 448·2^−140 → 1 → exact.
    let v: &[(f32, f64)] = &[
        (bits(0x0015_0000), 2688.0 * p2(-140)),
        ((448.0 * p2(-140)) as f32, 448.0 * p2(-140)),
    ];
    check_row(Recipe::Nvfp4.a(), row(16, &[v]), &[0x7E], 0x200);
    // amax 2^−149: 2^−149 / 2688 rounds up to t = 2^−149 (0x1); block ratio 1/6 → 11·2^−6
    // (spacing 2^−6 in [2^−3, 2^−2)) = 0.171875, code 0x23 (exponent field 4, mantissa 3);
    // 2^−149 / (0.171875·2^−149) = 5.82 → 6 → 6·0.171875·2^−149.
    check_row(
        Recipe::Nvfp4.a(),
        row(16, &[&[(bits(1), 6.0 * 0.171875 * p2(-149))]]),
        &[0x23],
        1,
    );
}

#[test]
fn nvfp4_tensor_scale_of_a_near_max_tensor_stays_finite() {
    // MAX / 2688 = (2^24 − 1) / 21 · 2^97 = 798915·2^97 (0x79C3_0C30) exactly; block ratio 448
    // (0x7E): MAX → 6 → MAX; 2^127 → 3.0000002 → 3 → MAX / 2; −1 → 0.
    let m = f32::MAX;
    let v: &[(f32, f64)] = &[(m, m as f64), (p2(127) as f32, m as f64 / 2.0), (-1.0, 0.0)];
    check_row(Recipe::Nvfp4.b(), row(16, &[v]), &[0x7E], 0x79C3_0C30);
}

#[test]
fn nvfp4_all_zero_tensor_has_tensor_scale_one_and_zero_block_scales() {
    check_row(
        Recipe::Nvfp4.a(),
        row(16, &[&[(0.0, 0.0)], &[(-0.0, 0.0)]]),
        &[0, 0],
        ONE,
    );
}

#[test]
fn non_finite_input_is_a_format_error_for_every_recipe() {
    for r in Recipe::ALL {
        for bad in [f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for fmt in [r.a(), r.b()] {
                let mut v = vec![1.0f32; 2 * 256];
                v[300] = bad;
                let e = ScaledMatrix::quantize(&v, 2, 256, 1, fmt)
                    .expect_err(&format!("{fmt}: {bad} was quantized"));
                assert!(matches!(e, Error::Format(_)), "{fmt}: {bad}: {e}");
            }
        }
    }
}

// Mutation run (cargo-mutants 27.1.0, 2026-11-23) over `host/src/quantize.rs` (tests: quantize,
// scale_rules) and `kernels/src/format/*.rs` (tests: formats): 394 mutants, 370 caught, 5 unviable
// (`Ok(Default::default())` / `Some(Default::default())` of types without a default), none timed
// out; of the 19 missed (all in `kernels/src/format`), `ElemType::emin` and
// `ElemType::mantissa_bits` replaced by a constant (5) are now caught by
// `elem_type_dispatches_to_its_module`, and the other 14 are equivalent:
// - `|` → `^` where the two operands have no bit in common, so both give the same word:
//   `encode_sat_signed8` (`nan | sign`, `q | sign`: code ≤ 0x7F, sign 0x80), `rne_mag_code`
//   (`frac | 0x0080_0000`, frac < 2^23), `decode_mag` (exponent field | fraction), `with_sign`
//   (every caller passes a value with the sign bit clear), `e2m1::encode_sat` (`q | sign << 3`,
//   q ≤ 7), `e2m1::pack` (two masked nibbles);
// - `>` → `>=` or `<` → `<=` in a clamp whose bound is the value it clamps to, so the equal case
//   gives the same result either way: `encode_sat_signed8` and `e2m1::encode_sat` (`q > max_code`),
//   `ulp_generic` (`e < emin`, `e > emax`), `e8m0::from_exponent` (`e < MIN_EXP`, `e > MAX_EXP`);
// - `e5m2::decode`'s `mag > INF` → `mag >= INF`: `mag == INF` took the branch before.
