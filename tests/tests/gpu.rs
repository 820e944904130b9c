//! GPU tests: the reference kernel against the CPU reference, every recipe, random shapes
//! (ragged ones included), every output type, outputs poisoned before each launch.
//! Run on a machine with an H100: `cargo test -p blockscaled-tests --test gpu -- --include-ignored`
//! (or the staged binary, see README).

use std::sync::OnceLock;

use blockscaled::{reference, Error, Gpu, OutType, Recipe};
use blockscaled_tests::{compare_outputs, random_matrix};
use proptest::prelude::*;

fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| Gpu::new(0).expect("a CUDA device (these tests are ignored without one)"))
}

/// GPU reference vs CPU reference: both accumulate exact products in float64, in different orders,
/// so before rounding they differ by at most `reference::sum_error_bound` (which matters only for
/// near-cancelling sums); both round the same way (f64 → f32 → output, nearest even).
fn check(recipe: Recipe, m: usize, n: usize, k: usize, l: usize, dtype: OutType, seed: u64) -> Result<(), String> {
    let g = gpu();
    let (_, a) = random_matrix(seed, m, k, l, recipe.a());
    let (_, b) = random_matrix(seed.wrapping_mul(31).wrapping_add(7), n, k, l, recipe.b());
    let (want, slack) = reference::gemm(&a, &b, dtype).map_err(|e| e.to_string())?;
    let (da, db) = (g.upload(&a).map_err(|e| e.to_string())?, g.upload(&b).map_err(|e| e.to_string())?);
    let mut c = g.output(m, n, l, dtype).map_err(|e| e.to_string())?; // poisoned with NaN
    g.reference_gemm(&da, &db, &mut c).map_err(|e| e.to_string())?;
    let got = c.to_host().map_err(|e| e.to_string())?;
    compare_outputs(&got, &want, 1.0, &slack).map_err(|e| format!("{recipe} {m}x{n}x{k}x{l} {dtype:?} seed {seed}: {e}"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_reference_matches_cpu_reference_on_random_shapes(
        recipe_i in 0..Recipe::ALL.len(),
        m in 1usize..300,
        n in 1usize..300,
        k2 in 1usize..400,
        l in 1usize..4,
        out_i in 0usize..3,
        seed in any::<u64>(),
    ) {
        let dtype = [OutType::Bf16, OutType::F16, OutType::F32][out_i];
        check(Recipe::ALL[recipe_i], m, n, 2 * k2, l, dtype, seed).map_err(TestCaseError::fail)?;
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn gpu_reference_matches_cpu_reference_for_every_recipe_on_a_ragged_larger_shape() {
    for (i, r) in Recipe::ALL.into_iter().enumerate() {
        check(r, 1000, 777, 1040, 1, OutType::Bf16, 0xC0FFEE + i as u64 * 1_000_003 + std::process::id() as u64)
            .unwrap();
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn fresh_outputs_are_poisoned_with_nan() {
    let g = gpu();
    for dtype in [OutType::Bf16, OutType::F16, OutType::F32] {
        let c = g.output(37, 41, 2, dtype).unwrap().to_host().unwrap();
        assert!(c.values.iter().all(|v| v.is_nan()), "{dtype:?}");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn mismatched_operands_and_outputs_are_shape_errors() {
    let g = gpu();
    let r = Recipe::Mxfp8(blockscaled::Fp8::E4M3);
    let (_, a) = random_matrix(1, 64, 128, 1, r.a());
    let (_, b) = random_matrix(2, 32, 96, 1, r.b());
    let (_, b_ok) = random_matrix(3, 32, 128, 1, r.b());
    let (da, db, dbok) = (g.upload(&a).unwrap(), g.upload(&b).unwrap(), g.upload(&b_ok).unwrap());
    let mut c = g.output(64, 32, 1, OutType::Bf16).unwrap();
    assert!(matches!(g.gemm(&da, &db, &mut c), Err(Error::Shape(_))));
    let mut wrong = g.output(64, 33, 1, OutType::Bf16).unwrap();
    assert!(matches!(g.gemm(&da, &dbok, &mut wrong), Err(Error::Shape(_))));
    assert!(g.gemm(&da, &dbok, &mut c).is_ok());
    assert!(matches!(g.output(0, 3, 1, OutType::F32), Err(Error::Shape(_))));
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_missing_gpu_ordinal_is_a_no_device_error() {
    let _ = gpu();
    assert!(matches!(Gpu::new(1000), Err(Error::NoDevice(_))));
}

/// Runs everywhere: without a driver (CI) opening a GPU is a typed error, not a panic.
#[test]
fn opening_a_gpu_without_one_is_a_no_device_error() {
    match Gpu::new(0) {
        Ok(g) => eprintln!("a GPU is present: {g:?}"),
        Err(e) => assert!(matches!(e, Error::NoDevice(_)), "expected NoDevice, got {e}"),
    }
}
