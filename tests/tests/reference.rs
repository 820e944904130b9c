//! The CPU reference GEMM agrees with a naive float64 computation written independently here
//! (straight from the codes and scales, no dequantized buffers, no threads), on random shapes
//! including M, N, K that are not multiples of 16, 32 or 128.

use blockscaled::{Error, OutType, Recipe, ScaledMatrix, reference, round_output};
use blockscaled_kernels::format::{ElemType, ScaleType};
use blockscaled_tests::{compare_outputs, random_matrix};
use proptest::prelude::*;

/// Element (l, r, k) of a matrix computed from first principles: the documented byte layout and
/// the documented scale index, decoded with the format module.
fn naive_value(q: &ScaledMatrix, l: usize, r: usize, k: usize) -> f64 {
    let d = q.desc();
    let i = (l * d.rows + r) * d.k + k;
    let code = match d.format.elem {
        ElemType::E2M1 => (q.data()[i / 2] >> (4 * (i % 2))) & 0xF,
        _ => q.data()[i],
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

    #[test]
    fn cpu_reference_matches_naive_float64_dot_products(
        recipe_i in 0..Recipe::ALL.len(),
        m in 1usize..70,
        n in 1usize..70,
        k2 in 1usize..170,
        l in 1usize..3,
        seed in any::<u64>(),
        out_i in 0usize..3,
    ) {
        let recipe = Recipe::ALL[recipe_i];
        let k = 2 * k2;
        let dtype = [OutType::Bf16, OutType::F16, OutType::F32][out_i];
        let (_, a) = random_matrix(seed, m, k, l, recipe.a());
        let (_, b) = random_matrix(seed ^ 0x9E37_79B9_7F4A_7C15, n, k, l, recipe.b());
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
            return Err(TestCaseError::fail(format!("{recipe} {m}x{n}x{k}x{l} {dtype:?}: {e}")));
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
