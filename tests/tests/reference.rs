//! The CPU reference GEMM agrees with a naive float64 computation written independently here
//! (straight from the codes and scales, no dequantized buffers, no threads), on random shapes
//! including M, N, K that are not multiples of 16, 32 or 128, odd K for FP8, batches of up to 8
//! and scales in random strided, padded or MN-major layouts.

use blockscaled::{Error, OutType, Recipe, ScaleMajor, ScaledMatrix, reference, round_output};
use blockscaled_kernels::format::{ElemType, ScaleType};
use blockscaled_tests::layouts::random_layout;
use blockscaled_tests::{compare_outputs, random_matrix};
use proptest::prelude::*;

/// Element (l, r, k) of a matrix computed from first principles: the documented byte layout and
/// the documented scale index, decoded with the format module.
fn naive_value(q: &ScaledMatrix, l: usize, r: usize, k: usize) -> f64 {
    let d = q.desc();
    let i = (l * d.rows + r) * d.k + k;
    let code = match d.format.elem {
        ElemType::E2M1 => ((q.data()[i / 2] >> (4 * (i % 2))) & 0xF) as u32,
        ElemType::BF16 | ElemType::F16 => {
            u16::from_le_bytes([q.data()[2 * i], q.data()[2 * i + 1]]) as u32
        }
        _ => q.data()[i] as u32,
    };
    let (br, bk) = d.block_extent();
    let si = l * d.scale_layout.batch_stride
        + (r / br) * d.scale_layout.row_stride
        + (k / bk) * d.scale_layout.k_stride;
    let scale = match d.format.scale {
        ScaleType::F32 => f32::from_le_bytes(q.scales()[4 * si..4 * si + 4].try_into().unwrap()),
        s => s.decode_bits(q.scales()[si] as u32),
    };
    d.format.elem.decode(code) as f64 * scale as f64 * d.tensor_scale as f64
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// Any K for FP8 (odd included; e2m1 rounds it up to even), L from 1 to 8, ragged M and N, and
    /// A's and B's scales each in the default or a random layout (any nesting order, strides and
    /// gaps): the naive sum reads them through the documented index.
    #[test]
    fn cpu_reference_matches_naive_float64_dot_products(
        recipe_i in 0..Recipe::ALL.len(),
        m in 1usize..50,
        n in 1usize..50,
        k in 1usize..300,
        l in 1usize..=8,
        seed in any::<u64>(),
        out_i in 0usize..3,
        layouts in (any::<bool>(), any::<bool>(), any::<u64>()),
    ) {
        let recipe = Recipe::ALL[recipe_i];
        let e2m1 = recipe.a().elem == ElemType::E2M1 || recipe.b().elem == ElemType::E2M1;
        let k = if e2m1 { k + k % 2 } else { k };
        let dtype = [OutType::Bf16, OutType::F16, OutType::F32][out_i];
        let (_, a) = random_matrix(seed, m, k, l, recipe.a());
        let (_, b) = random_matrix(seed ^ 0x9E37_79B9_7F4A_7C15, n, k, l, recipe.b());
        let (relay_a, relay_b, layout_seed) = layouts;
        let a = if relay_a { random_layout(&a, layout_seed) } else { a };
        let b = if relay_b { random_layout(&b, !layout_seed) } else { b };
        let (got, _) = reference::gemm(&a, &b, dtype).unwrap();
        let mut want = got.clone();
        let mut slack = vec![0.0f64; got.values.len()];
        for li in 0..l {
            for mi in 0..m {
                for ni in 0..n {
                    let (mut s, mut sa) = (0.0f64, 0.0f64);
                    for kk in 0..k {
                        let p = naive_value(&a, li, mi, kk) * naive_value(&b, li, ni, kk);
                        s += p;
                        sa += p.abs();
                    }
                    want.values[(li * m + mi) * n + ni] = round_output(dtype, s);
                    slack[(li * m + mi) * n + ni] = reference::sum_error_bound(k, sa);
                }
            }
        }
        // Both are float64 sums of the same exact products in different orders, rounded the same
        // way: see `compare_outputs` and `reference::sum_error_bound` for the tolerance.
        if let Err(e) = compare_outputs(&got, &want, 1.0, &slack) {
            return Err(TestCaseError::fail(format!(
                "{recipe} {m}x{n}x{k}x{l} {dtype:?}, A {:?}, B {:?}: {e}",
                a.scale_layout(),
                b.scale_layout()
            )));
        }
    }

    /// e2m1 packs two elements per byte along K: an odd K is an alignment error, whether the
    /// matrix is quantized or wrapped from bytes (with a data length rounded either way).
    #[test]
    fn e2m1_with_odd_k_is_an_alignment_error(
        recipe in prop::sample::select(
            Recipe::ALL.into_iter().filter(|r| r.a().elem == ElemType::E2M1).collect::<Vec<_>>()
        ),
        rows in 1usize..40,
        k_half in 0usize..150,
        l in 1usize..=8,
        seed in any::<u64>(),
        mn_major in any::<bool>(),
    ) {
        let k = 2 * k_half + 1;
        for format in [recipe.a(), recipe.b()] {
            let v = blockscaled_tests::random_values(seed, rows * k * l, k);
            let major = if mn_major { ScaleMajor::Mn } else { ScaleMajor::K };
            let q = ScaledMatrix::quantize_with_major(&v, rows, k, l, format, major);
            prop_assert!(matches!(q, Err(Error::Alignment(_))), "{format} {rows}x{k}x{l}: {:?}", q.map(|_| ()));
            let (br, bk) = format.block.extent(rows, k);
            let layout = blockscaled::ScaleLayout::packed(major, rows.div_ceil(br), k.div_ceil(bk));
            for data_len in [(l * rows * k) / 2, (l * rows * k).div_ceil(2)] {
                let p = ScaledMatrix::from_parts(
                    format,
                    rows,
                    k,
                    l,
                    vec![0x35; data_len],
                    vec![0x38; layout.required_len(l).unwrap()],
                    layout,
                    1.0,
                );
                prop_assert!(matches!(p, Err(Error::Alignment(_))), "{format} {rows}x{k}x{l}: {:?}", p.map(|_| ()));
            }
        }
    }
}

#[test]
fn reference_rejects_mismatched_k_and_batch() {
    let f = Recipe::DeepSeekFp8;
    let (_, a) = random_matrix(1, 4, 256, 1, f.a());
    let (_, b) = random_matrix(2, 4, 384, 1, f.b());
    assert!(matches!(
        reference::gemm(&a, &b, OutType::Bf16),
        Err(Error::Shape(_))
    ));
    let (_, b2) = random_matrix(3, 4, 256, 2, f.b());
    assert!(matches!(
        reference::gemm(&a, &b2, OutType::Bf16),
        Err(Error::Shape(_))
    ));
}

#[test]
fn reference_result_is_not_trivially_zero_or_nan() {
    let r = Recipe::Nvfp4;
    let (_, a) = random_matrix(11, 33, 96, 1, r.a());
    let (_, b) = random_matrix(12, 17, 96, 1, r.b());
    let (c, _) = reference::gemm(&a, &b, OutType::F32).unwrap();
    assert!(c.values.iter().all(|v| v.is_finite()));
    assert!(c.values.iter().filter(|v| **v != 0.0).count() > c.values.len() / 2);
}
