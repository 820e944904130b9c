//! Quantize → dequantize stays within each format's error bound; the stored layout is the
//! documented one; bad input is a typed error.

use blockscaled::{
    ElemType, Error, Recipe, ScaleBlock, ScaleLayout, ScaleMajor, ScaleType, ScaledMatrix,
};
use blockscaled_tests::{random_matrix, random_values};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The bound for one element x whose block scale (times tensor scale) is `s`: half a unit in the
/// last place of the element format at |x|/s, plus the saturation loss when |x|/s exceeds the
/// format's largest value (the MX rule lets a block maximum do so), plus 2^-21·|x| for the f32
/// division x / s done before encoding (it can move a value across a rounding boundary).
fn bound(elem: ElemType, x: f64, s: f64) -> f64 {
    if s == 0.0 {
        return 0.0; // only an all-zero block may have a zero scale, and it must decode to zeros
    }
    let v = x.abs() / s;
    let max = elem.max() as f64;
    let sat = (x.abs() - max * s).max(0.0);
    sat + (0.5 * elem.ulp(v.min(max) as f32) as f64 + v * 2f64.powi(-21)) * s
}

/// Quantizes fresh random values ([`random_values`], or [`wide_values`] when `wide`) and checks
/// them with [`check_quantized`].
fn check_round_trip(
    recipe: Recipe,
    (rows, k, batch): (usize, usize, usize),
    seed: u64,
    operand_b: bool,
    wide: bool,
) {
    let fmt = if operand_b { recipe.b() } else { recipe.a() };
    let len = batch * rows * k;
    let x = if wide {
        wide_values(seed, len, k)
    } else {
        random_values(seed, len, k)
    };
    let q = ScaledMatrix::quantize(&x, rows, k, batch, fmt).expect("finite input quantizes");
    check_quantized(recipe, &x, &q);
}

/// Every element of `q` (quantized from `x`) is within [`bound`] of its input, and every scale is
/// the one its recipe's rule gives ([`check_scales`]).
fn check_quantized(recipe: Recipe, x: &[f32], q: &ScaledMatrix) {
    let fmt = q.format();
    let (rows, k, batch) = (q.rows(), q.k(), q.batch());
    for l in 0..batch {
        for r in 0..rows {
            for kk in 0..k {
                let xv = x[(l * rows + r) * k + kk] as f64;
                let s = q.scale_value(l, r, kk);
                let got = q.value(l, r, kk);
                let err = (got - xv).abs();
                let b = bound(fmt.elem, xv, s);
                assert!(
                    err <= b && got.is_finite(),
                    "{recipe} ({fmt}) [{l},{r},{kk}]: x {xv:e} -> {got:e} (scale {s:e}), error {err:e} > bound {b:e}"
                );
            }
        }
    }
    check_scales(recipe, x, q);
}

/// The scale an fp32 ratio `amax / max` must be (see `host/src/quantize.rs`): the nearest f32
/// where that is normal, rounded up to a multiple of 2^-149 below; 1 for an all-zero block.
fn check_f32_ratio(what: &str, s: f64, amax: f64, max: f64) {
    let want = amax / max;
    let ok = if amax == 0.0 {
        s == 1.0
    } else if want >= 2f64.powi(-126) {
        (s - want).abs() <= want * 2f64.powi(-24)
    } else {
        s >= want && s - 2f64.powi(-149) < want
    };
    assert!(ok, "{what}: amax {amax:e} / {max} gave scale {s:e}");
}

/// Pins every scale of `q` to its rule, from the block maxima of the input `x` (never from the
/// quantizer's own scale function), so that a quantizer choosing any other scale — 1 everywhere,
/// one binade too large, a tensor scale of 1 — fails even where its elements would stay within
/// the error bound of the scale it chose:
/// - e8m0 (OCP MX v1.0 §6.3): `amax / scale ∈ [2^emax, 2^(emax+1))`, except at the clamp 2^-127
///   (`amax / scale < 2^(emax+1)` only); an all-zero block has 2^-127;
/// - fp32: `scale = amax / max(elem)` (nearest f32, rounded up below f32's normal range), except
///   bf16 elements, whose scale is 1;
/// - NVFP4: tensor scale `amax(tensor) / 2688` as fp32 above; block scale within half an e4m3 unit
///   (and the f32 rounding of the ratio) of `amax(block) / 6 / tensor_scale`, 2^-9 where that
///   ratio rounds to 0, 0 for an all-zero block.
fn check_scales(recipe: Recipe, x: &[f32], q: &ScaledMatrix) {
    let fmt = q.format();
    let (rows, k, batch) = (q.rows(), q.k(), q.batch());
    let (br, bk) = fmt.block.extent(rows, k);
    let t = q.tensor_scale() as f64;
    if fmt.tensor_scale {
        let amax = x.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
        check_f32_ratio(&format!("{recipe} tensor scale"), t, amax, 448.0 * 6.0);
    }
    for l in 0..batch {
        for rb in 0..rows.div_ceil(br) {
            for kb in 0..k.div_ceil(bk) {
                let mut amax = 0f64;
                for r in rb * br..((rb + 1) * br).min(rows) {
                    for kk in kb * bk..((kb + 1) * bk).min(k) {
                        amax = amax.max(x[(l * rows + r) * k + kk].abs() as f64);
                    }
                }
                let s = q.scale_value(l, rb * br, kb * bk);
                let what = format!("{recipe} ({fmt}) block [{l},{rb},{kb}]");
                let max = fmt.elem.max() as f64;
                match fmt.scale {
                    ScaleType::E8M0 => {
                        let (lo, hi) = (2f64.powi(fmt.elem.emax()), 2f64.powi(fmt.elem.emax() + 1));
                        let floor = 2f64.powi(-127);
                        let r = amax / s;
                        let ok = if amax == 0.0 {
                            s == floor
                        } else {
                            r < hi && (r >= lo || s == floor)
                        };
                        assert!(ok, "{what}: amax {amax:e} gave scale {s:e}");
                    }
                    // bf16 holds any f32 input's range: rounded as is, scale 1.
                    ScaleType::F32 if fmt.elem == ElemType::BF16 => {
                        assert!(s == 1.0, "{what}: bf16 with scale {s:e}")
                    }
                    ScaleType::F32 => check_f32_ratio(&what, s, amax, max),
                    ScaleType::UE4M3 => {
                        let (bs, r) = (s / t, amax / (max * t));
                        let ok = if amax == 0.0 {
                            bs == 0.0
                        } else if r <= 2f64.powi(-10) {
                            bs == 2f64.powi(-9)
                        } else {
                            let half = 0.5 * ElemType::E4M3.ulp(r as f32) as f64;
                            bs <= 448.0 && (bs - r).abs() <= half + r * 2f64.powi(-24)
                        };
                        assert!(
                            ok,
                            "{what}: amax {amax:e}, tensor scale {t:e}: block scale {bs:e}"
                        );
                    }
                }
            }
        }
    }
}

/// Values across the whole f32 range: each row gets its own magnitude 2^e, e uniform in
/// -149..=127 (subnormal rows, rows whose fp32 scale is subnormal, rows near f32::MAX), elements
/// ±[0.05, 1) of it, the first of each row exactly ±2^e (so no row is all zero), a few exact zeros
/// and a few ±1.99·2^e (f32::MAX where that overflows).
fn wide_values(seed: u64, len: usize, row_len: usize) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut mag = 1.0f32;
    (0..len)
        .map(|i| {
            let sign = if rng.random_bool(0.5) { -1.0 } else { 1.0 };
            if i % row_len == 0 {
                mag = 2f64.powi(rng.random_range(-149..=127)) as f32;
                return sign * mag;
            }
            match rng.random_range(0..100) {
                0 => 0.0,
                1 => sign * (mag * 1.99).min(f32::MAX),
                _ => sign * mag * rng.random_range(0.05f32..1.0),
            }
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Half of the cases draw values across the whole f32 range (subnormal blocks, blocks whose
    /// fp32 scale is subnormal, blocks near f32::MAX), where a scale rule's edge cases live.
    #[test]
    fn quantize_dequantize_error_is_within_the_format_bound_and_scales_follow_their_rule(
        recipe_i in 0..Recipe::ALL.len(),
        rows in 1usize..300,
        k2 in 1usize..200,
        batch in 1usize..3,
        seed in any::<u64>(),
        operand_b in any::<bool>(),
        wide in any::<bool>(),
    ) {
        let k = 2 * k2; // e2m1 needs even K; odd K is covered for fp8 below
        check_round_trip(Recipe::ALL[recipe_i], (rows, k, batch), seed, operand_b, wide);
    }

    #[test]
    fn fp8_recipes_accept_odd_k(rows in 1usize..64, k in 1usize..300, seed in any::<u64>()) {
        let k = k | 1;
        for r in [Recipe::DeepSeekFp8, Recipe::Mxfp8(blockscaled::Fp8::E5M2), Recipe::Fp8PerRow(blockscaled::Fp8::E4M3)] {
            check_round_trip(r, (rows, k, 1), seed, true, false);
        }
    }

    #[test]
    fn e2m1_elements_are_packed_low_nibble_first(rows in 1usize..20, k2 in 1usize..40, seed in any::<u64>()) {
        let k = 2 * k2;
        let (_, q) = random_matrix(seed, rows, k, 1, Recipe::Mxfp4.a());
        prop_assert_eq!(q.data().len(), rows * k / 2);
        for r in 0..rows {
            for kk in 0..k {
                let byte = q.data()[(r * k + kk) / 2];
                let nib = if kk % 2 == 0 { byte & 0xF } else { byte >> 4 };
                prop_assert_eq!(q.code(0, r, kk), nib as u32);
            }
        }
    }

    #[test]
    fn mn_major_and_k_major_scales_hold_the_same_values(rows in 1usize..300, kb in 1usize..6, seed in any::<u64>()) {
        let k = kb * 128;
        let v = random_values(seed, rows * k, k);
        let fmt = Recipe::DeepSeekFp8.a();
        let a = ScaledMatrix::quantize_with_major(&v, rows, k, 1, fmt, ScaleMajor::K).unwrap();
        let b = ScaledMatrix::quantize_with_major(&v, rows, k, 1, fmt, ScaleMajor::Mn).unwrap();
        prop_assert_eq!(a.data(), b.data());
        for r in 0..rows {
            for j in 0..kb {
                prop_assert_eq!(a.scale_value(0, r, j * 128), b.scale_value(0, r, j * 128));
                // MN-major: the row blocks of one K block are adjacent.
                let idx = j * rows + r;
                let bits = u32::from_le_bytes(b.scales()[4 * idx..4 * idx + 4].try_into().unwrap());
                prop_assert_eq!(f32::from_bits(bits) as f64, b.scale_value(0, r, j * 128));
            }
        }
    }
}

#[test]
fn mx_scale_is_the_power_of_two_of_the_block_maximum_over_the_element_emax() {
    // One block of 32 with maximum 3.0: floor(log2 3) = 1, e4m3 emax 8 → scale 2^-7.
    let mut v = vec![0.5f32; 32];
    v[7] = -3.0;
    let q =
        ScaledMatrix::quantize(&v, 1, 32, 1, Recipe::Mxfp8(blockscaled::Fp8::E4M3).a()).unwrap();
    assert_eq!(q.scales(), &[127 - 7]);
    assert_eq!(q.value(0, 0, 7), -3.0);
}

#[test]
fn nvfp4_uses_a_tensor_scale_of_amax_over_448_times_6() {
    let v = random_values(7, 4 * 64, 64);
    let amax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    let q = ScaledMatrix::quantize(&v, 4, 64, 1, Recipe::Nvfp4.a()).unwrap();
    assert_eq!(q.tensor_scale(), amax / (448.0 * 6.0));
    assert!(q.scales().iter().all(|&b| b & 0x80 == 0));
}

#[test]
fn nvfp4_blocks_far_below_the_tensor_maximum_keep_a_non_zero_scale() {
    // Found by CI's proptest: with a tensor maximum of 1280 the tensor scale is ~0.476, and a
    // block of maximum 2.5e-3 wants a block scale of ~8.7e-4, below ue4m3's smallest subnormal
    // (2^-9); rounding it to zero flushed the whole block. Its elements must survive.
    let mut v = random_values(11, 2 * 32, 32);
    v[..32]
        .iter_mut()
        .for_each(|x| *x = x.signum() * 1280.0 * x.abs().clamp(0.5, 1.0));
    v[32..]
        .iter_mut()
        .for_each(|x| *x = x.signum() * 2.5e-3 * x.abs().clamp(0.5, 1.0));
    v[0] = 1280.0;
    v[32] = 2.5e-3;
    let q = ScaledMatrix::quantize(&v, 2, 32, 1, Recipe::Nvfp4.a()).unwrap();
    for kk in 0..32 {
        let (x, s) = (v[32 + kk] as f64, q.scale_value(0, 1, kk));
        assert!(s > 0.0, "block scale flushed to zero");
        let err = (q.value(0, 1, kk) - x).abs();
        assert!(
            err <= bound(ElemType::E2M1, x, s),
            "x {x:e} -> {} (scale {s:e})",
            q.value(0, 1, kk)
        );
    }
}

#[test]
fn all_zero_blocks_quantize_to_zeros_with_a_finite_scale() {
    for r in Recipe::ALL {
        let v = vec![0.0f32; 2 * 256];
        let q = ScaledMatrix::quantize(&v, 2, 256, 1, r.b()).unwrap();
        for kk in 0..256 {
            assert_eq!(q.value(0, 1, kk), 0.0, "{r}");
            assert!(q.scale_value(0, 1, kk).is_finite(), "{r}");
        }
    }
}

#[test]
fn non_finite_input_is_a_format_error() {
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut v = vec![1.0f32; 64];
        v[5] = bad;
        let e = ScaledMatrix::quantize(&v, 1, 64, 1, Recipe::Mxfp8(blockscaled::Fp8::E4M3).a())
            .unwrap_err();
        assert!(matches!(e, Error::Format(_)), "{e}");
    }
}

#[test]
fn odd_k_for_e2m1_is_an_alignment_error() {
    let e = ScaledMatrix::quantize(&[1.0; 33], 1, 33, 1, Recipe::Mxfp4.a()).unwrap_err();
    assert!(matches!(e, Error::Alignment(_)), "{e}");
}

#[test]
fn wrong_value_count_and_empty_shapes_are_shape_errors() {
    let f = Recipe::DeepSeekFp8.a();
    assert!(matches!(
        ScaledMatrix::quantize(&[1.0; 10], 2, 6, 1, f),
        Err(Error::Shape(_))
    ));
    assert!(matches!(
        ScaledMatrix::quantize(&[], 0, 6, 1, f),
        Err(Error::Shape(_))
    ));
    assert!(matches!(
        ScaledMatrix::quantize(&[], 2, 0, 1, f),
        Err(Error::Shape(_))
    ));
}

#[test]
fn unsupported_format_combinations_are_format_errors() {
    let mut f = Recipe::Mxfp4.a();
    f.scale = ScaleType::F32;
    assert!(matches!(
        ScaledMatrix::quantize(&[1.0; 32], 1, 32, 1, f),
        Err(Error::Format(_))
    ));
    let mut f = Recipe::Mxfp8(blockscaled::Fp8::E4M3).a();
    f.scale = ScaleType::UE4M3;
    assert!(matches!(
        ScaledMatrix::quantize(&[1.0; 32], 1, 32, 1, f),
        Err(Error::Format(_))
    ));
    let mut f = Recipe::DeepSeekFp8.a();
    f.block = ScaleBlock::Tile { rows: 1, k: 0 };
    assert!(matches!(
        ScaledMatrix::quantize(&[1.0; 32], 1, 32, 1, f),
        Err(Error::Format(_))
    ));
}

#[test]
fn from_parts_rejects_short_buffers_wrong_scale_grids_and_bad_scales() {
    let f = Recipe::Mxfp8(blockscaled::Fp8::E4M3).a();
    let layout = ScaleLayout::packed(ScaleMajor::K, 2, 2);
    let ok = ScaledMatrix::from_parts(f, 2, 64, 1, vec![0x38; 128], vec![127; 4], layout, 1.0);
    assert!(ok.is_ok());
    let short = ScaledMatrix::from_parts(f, 2, 64, 1, vec![0x38; 127], vec![127; 4], layout, 1.0);
    assert!(matches!(short, Err(Error::Shape(_))));
    let few_scales =
        ScaledMatrix::from_parts(f, 2, 64, 1, vec![0x38; 128], vec![127; 3], layout, 1.0);
    assert!(matches!(few_scales, Err(Error::Shape(_))));
    let grid = ScaledMatrix::from_parts(
        f,
        2,
        64,
        1,
        vec![0x38; 128],
        vec![127; 4],
        ScaleLayout::packed(ScaleMajor::K, 2, 1),
        1.0,
    );
    assert!(matches!(grid, Err(Error::Shape(_))));
    let ts = ScaledMatrix::from_parts(f, 2, 64, 1, vec![0x38; 128], vec![127; 4], layout, 2.0);
    assert!(matches!(ts, Err(Error::Format(_))));
    let nv = Recipe::Nvfp4.a();
    let l4 = ScaleLayout::packed(ScaleMajor::K, 1, 2);
    let signed = ScaledMatrix::from_parts(nv, 1, 32, 1, vec![0x11; 16], vec![0x38, 0xB8], l4, 0.5);
    assert!(matches!(signed, Err(Error::Format(_))));
    let nan_ts =
        ScaledMatrix::from_parts(nv, 1, 32, 1, vec![0x11; 16], vec![0x38, 0x38], l4, f32::NAN);
    assert!(matches!(nan_ts, Err(Error::Format(_))));
}

/// Strides whose scale-buffer size in bytes overflows `usize` are a shape error: a wrapped size
/// would let a short buffer pass and every scale read would land outside it.
#[test]
fn scale_layouts_whose_byte_size_overflows_are_shape_errors() {
    // DeepSeek A (fp32 scales per 1×128): 2 × 1 scale blocks. Row stride 2⁶² + 1 makes the
    // layout reach 2⁶² + 2 scales, 2⁶⁴ + 8 bytes: 8 bytes once wrapped.
    let f = Recipe::DeepSeekFp8.a();
    let layout = ScaleLayout {
        row_blocks: 2,
        k_blocks: 1,
        row_stride: (1 << 62) + 1,
        k_stride: 1,
        batch_stride: 0,
    };
    let r = ScaledMatrix::from_parts(f, 2, 128, 1, vec![0x38; 256], vec![0; 8], layout, 1.0);
    assert!(matches!(r, Err(Error::Shape(_))), "{r:?}");
}

/// Element counts whose size in bytes overflows `usize` are a shape error, not a wrapped size
/// that an empty buffer matches.
#[test]
fn data_sizes_that_overflow_are_shape_errors() {
    // 4 × 2³⁰ × 2³⁰ one-byte elements: 2⁶² elements fit usize, 2⁶⁵ bits do not. Scale strides of
    // 0 keep the scale buffer at one byte.
    let f = Recipe::Mxfp8(blockscaled::Fp8::E4M3).a();
    let layout = ScaleLayout {
        row_blocks: 1 << 30,
        k_blocks: 1 << 25,
        row_stride: 0,
        k_stride: 0,
        batch_stride: 0,
    };
    let r = ScaledMatrix::from_parts(f, 1 << 30, 1 << 30, 4, vec![], vec![127], layout, 1.0);
    assert!(matches!(r, Err(Error::Shape(_))), "{r:?}");
}

/// `fold_to_fp8` (the host's copy of the GPU's MX / NVFP4 → FP8 pre-pass): FP8 with fp32 scales
/// per 1×128 (A role) or per row (B role); every MX value within half the target's smallest
/// subnormal of its group scale (`format::fold::max_error_units`), every NVFP4 value within
/// `format::fold::nv_max_error`; NaN scales give NaN; e2m1 rows with e8m0 scales spanning less
/// than 2^14 (these random rows: 2^5 at most) fold exactly.
#[test]
fn folding_mx_into_fp8_keeps_every_value_within_its_bound() {
    use blockscaled::kernels::format::fold;
    for (i, r) in [
        Recipe::Mxfp8(blockscaled::Fp8::E4M3),
        Recipe::Mxfp8(blockscaled::Fp8::E5M2),
        Recipe::Mxfp4,
        Recipe::E2m1E8m0x16,
        Recipe::Nvfp4,
    ]
    .into_iter()
    .enumerate()
    {
        for as_b in [false, true] {
            let fmt = if as_b { r.b() } else { r.a() };
            let (_, mut m) = random_matrix(70 + i as u64, 300, 512, 2, fmt);
            // One NaN scale.
            let d = *m.desc();
            let mut scales = m.scales().to_vec();
            let nv = fmt.scale == ScaleType::UE4M3;
            scales[d.scale_layout.index(1, 77, 3)] = if nv { 0x7F } else { 0xFF };
            m = blockscaled_tests::with_scales(&m, scales);
            let f = m.fold_to_fp8(as_b).unwrap();
            assert_eq!(f.format().elem, fold::target(fmt.elem));
            assert_eq!(f.format().scale, ScaleType::F32);
            let block = if as_b {
                ScaleBlock::PerRow
            } else {
                ScaleBlock::Tile { rows: 1, k: 128 }
            };
            assert_eq!(f.format().block, block);
            let (mut exact, mut nan) = (0usize, 0usize);
            for l in 0..2 {
                for row in 0..300 {
                    for k in 0..512 {
                        let (x, y) = (m.value(l, row, k), f.value(l, row, k));
                        if x.is_nan() {
                            assert!(y.is_nan(), "{r} {l},{row},{k}");
                            nan += 1;
                            continue;
                        }
                        let unit = f.scale_value(l, row, k);
                        let err = (x - y).abs();
                        let bound = if nv {
                            fold::nv_max_error((x / unit) as f32) as f64
                        } else {
                            fold::max_error_units(fmt.elem) as f64
                        };
                        assert!(
                            err <= bound * unit * (1.0 + 1e-6),
                            "{r} as_b {as_b} ({l},{row},{k}): {x} folded to {y}"
                        );
                        exact += (err == 0.0) as usize;
                    }
                }
            }
            // The NaN scale's block (32 or 16 elements) and nothing else.
            assert_eq!(nan, d.block_extent().1, "{r}");
            if fmt.elem == ElemType::E2M1 && !nv {
                assert_eq!(exact + nan, 2 * 300 * 512, "{r}: e2m1 rows fold exactly");
            }
        }
    }
    // fp32 scales and K not a multiple of 128 do not fold.
    let (_, ds) = random_matrix(1, 16, 256, 1, Recipe::DeepSeekFp8.a());
    assert!(matches!(ds.fold_to_fp8(false), Err(Error::Format(_))));
    let (_, odd) = random_matrix(1, 16, 96, 1, Recipe::Mxfp4.a());
    assert!(matches!(odd.fold_to_fp8(false), Err(Error::Shape(_))));
}

/// bf16 and fp16 operands are the input rounded once to nearest even, scale 1: every code equals
/// the `half` crate's conversion, except that fp16 saturates at ±65504 where IEEE rounding gives
/// ±Inf, on values from fp16's subnormals to past its range.
#[test]
fn sixteen_bit_operands_are_the_input_rounded_to_nearest_even() {
    let (rows, k) = (37, 96);
    let v = wide_values(11, rows * k, k)
        .into_iter()
        .zip(random_values(12, rows * k, k))
        // Half of the rows scaled into fp16's range and past it (2^-30 .. 2^20).
        .enumerate()
        .map(|(i, (w, r))| {
            if (i / k) % 2 == 0 {
                r * 2f32.powi((i / k) as i32 - 18)
            } else {
                w
            }
        })
        .collect::<Vec<f32>>();
    for elem in [ElemType::BF16, ElemType::F16] {
        let format = blockscaled::OperandFormat {
            elem,
            scale: ScaleType::F32,
            block: ScaleBlock::PerTensor,
            tensor_scale: false,
        };
        let q = ScaledMatrix::quantize(&v, rows, k, 1, format).unwrap();
        assert_eq!(q.scale_value(0, 0, 0), 1.0);
        for (i, &x) in v.iter().enumerate() {
            let code = u16::from_le_bytes([q.data()[2 * i], q.data()[2 * i + 1]]);
            let want = match elem {
                ElemType::BF16 => {
                    let b = half::bf16::from_f32(x);
                    if b.is_infinite() {
                        (b.to_bits() & 0x8000) | 0x7F7F
                    } else {
                        b.to_bits()
                    }
                }
                _ => {
                    let h = half::f16::from_f32(x);
                    if h.is_infinite() {
                        (h.to_bits() & 0x8000) | 0x7BFF
                    } else {
                        h.to_bits()
                    }
                }
            };
            assert_eq!(code, want, "{} of {x:e} (element {i})", elem.name());
        }
    }
    // A bf16 or fp16 operand with block scales is a typed error.
    let bad = blockscaled::OperandFormat {
        elem: ElemType::F16,
        scale: ScaleType::E8M0,
        block: ScaleBlock::PerTensor,
        tensor_scale: false,
    };
    assert!(matches!(
        ScaledMatrix::quantize(&v, rows, k, 1, bad),
        Err(Error::Format(_))
    ));
}
