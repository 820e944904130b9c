//! GPU tests of the Hopper MX / NVFP4 kernel (`Plan::Sm90Mx`): every recipe it takes, random
//! ragged shapes, batches, both tiles, split-K, every output type, scale layouts, NaN and Inf.
//! Run on an H100: `cargo test -p blockscaled-tests --test gpu_mx -- --include-ignored`.
//!
//! Tolerance, derived: every element × scale product is exact in bf16 (kernels' `dequant`), the
//! tensor cores multiply bf16 exactly and add in fp32; each 16-wide K step adds its products to
//! the running sum with at most two roundings of at most one fp32 unit (2^-23 relative, rounding
//! or truncating) of a magnitude ≤ Σ|a·b|. So |got − exact| ≤ (K/8 + 1) · 2^-23 · Σ|a·b|, plus the
//! output rounding (`compare_outputs`). The FP8 kernel needs 2^-7 of Σ|a·b| for its FP8
//! accumulation; this one is exact up to fp32.

use std::sync::OnceLock;

use blockscaled::{
    DeviceMatrix, ElemType, Error, Fp8, Gpu, HostOutput, OutType, Plan, Recipe, ScaledMatrix,
    Sm90MxTile, reference, round_output,
};
use blockscaled_tests::{
    NoCancellation, as_they_are, bf16_mma_rel, compare_outputs, fp8_accumulation_slack, gemm_on,
    no_cancellation_gemm, random_matrix, random_pair, random_values, reference_output, run_seed,
    with_parts, with_scales,
};
use proptest::prelude::*;

fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| Gpu::new(0).expect("a CUDA device (these tests are ignored without one)"))
}

/// The recipes the MX kernel takes.
const MX_RECIPES: [Recipe; 5] = [
    Recipe::Mxfp8(Fp8::E4M3),
    Recipe::Mxfp8(Fp8::E5M2),
    Recipe::Mxfp4,
    Recipe::Nvfp4,
    Recipe::E2m1E8m0x16,
];

/// The bound of the module doc for each element.
fn mx_slack(k: usize, abs_sum: &[f64]) -> Vec<f64> {
    abs_sum.iter().map(|s| s * bf16_mma_rel(k)).collect()
}

/// The MX plan `gemm` would run, with the tile and split forced when given.
fn mx_plan(
    a: &blockscaled::DeviceMatrix,
    b: &blockscaled::DeviceMatrix,
    force: Option<(u32, u32)>,
) -> Result<Plan, String> {
    let plan = match gpu().plan(a, b).map_err(|e| e.to_string())? {
        // e2m1 pairs at decode sizes plan the 4-bit-weights kernel, large M the fold onto the
        // FP8 kernel; these tests are the MX kernel's.
        Plan::Sm90W4(_) | Plan::Sm90MxFp8(_) => {
            let (da, db) = (a.desc(), b.desc());
            Plan::Sm90Mx(blockscaled::plan::sm90_mx_default(
                da.rows,
                db.rows,
                da.k,
                da.batch,
                gpu().sm_count(),
            ))
        }
        p => p,
    };
    match (plan, force) {
        (Plan::Sm90Mx(cfg), Some((block_n, split_k))) => Ok(Plan::Sm90Mx(
            cfg.with_tile(Sm90MxTile { block_n }).with_split_k(split_k),
        )),
        (p @ Plan::Sm90Mx(_), None) => Ok(p),
        (p, _) => Err(format!("expected the sm90 MX kernel, the plan is {p:?}")),
    }
}

/// Runs A · Bᵀ on the MX kernel (output poisoned first) and returns it.
fn run(
    a: &ScaledMatrix,
    b: &ScaledMatrix,
    dtype: OutType,
    force: Option<(u32, u32)>,
) -> Result<HostOutput, String> {
    run_with(a, b, dtype, |da, db| mx_plan(da, db, force))
}

/// Runs A · Bᵀ with the plan `plan` gives for the uploaded operands (output poisoned first).
fn run_with(
    a: &ScaledMatrix,
    b: &ScaledMatrix,
    dtype: OutType,
    plan: impl FnOnce(&DeviceMatrix, &DeviceMatrix) -> Result<Plan, String>,
) -> Result<HostOutput, String> {
    gemm_on(gpu(), a, b, dtype, plan)
}

/// The MX kernel against the CPU reference (float64), every element.
#[allow(clippy::too_many_arguments)]
fn check_mx(
    recipe: Recipe,
    m: usize,
    n: usize,
    k: usize,
    l: usize,
    dtype: OutType,
    seed: u64,
    force: Option<(u32, u32)>,
) -> Result<(), String> {
    let (a, b) = random_pair(seed, (m, n, k, l), recipe.a(), recipe.b());
    let (want, abs) = reference_output(&a, &b, dtype)?;
    let got = run(&a, &b, dtype, force)?;
    compare_outputs(&got, &want, 1.0, &mx_slack(k, &abs)).map_err(|e| {
        format!("sm90 MX {recipe} {m}x{n}x{k}x{l} {dtype:?} {force:?} seed {seed}: {e}")
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    #[ignore = "needs a CUDA device"]
    fn mx_kernel_matches_cpu_reference_on_random_ragged_shapes(
        which in 0usize..5,
        m in 1usize..400,
        n in 1usize..600,
        k32 in 1usize..20,
        l in 1usize..5,
        out_i in 0usize..3,
        tile in 0usize..2,
        split in 1u32..5,
        seed in any::<u64>(),
    ) {
        let recipe = MX_RECIPES[which];
        let dtype = [OutType::Bf16, OutType::F16, OutType::F32][out_i];
        // K a multiple of 32 (MX blocks; 16-byte e2m1 rows), often not of the kernel's 64.
        let k = 32 * k32;
        let split = split.min(k.div_ceil(64) as u32);
        check_mx(recipe, m, n, k, l, dtype, seed, Some(([256, 128][tile], split)))
            .map_err(TestCaseError::fail)?;
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn mx_kernel_matches_cpu_reference_for_every_recipe_on_larger_ragged_shapes() {
    for (i, r) in MX_RECIPES.into_iter().enumerate() {
        for (m, n, k, l) in [(520, 777, 1056, 1), (129, 300, 4096, 2), (1, 7168, 512, 1)] {
            let seed = 0xC0FFEE + i as u64 * 1_000_003 + blockscaled_tests::run_seed();
            check_mx(r, m, n, k, l, OutType::Bf16, seed, None).unwrap();
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn mx_recipes_plan_the_mx_kernel_nvfp4_with_odd_16_byte_rows_falls_back_and_mixed_widths_fold() {
    let g = gpu();
    let up = |r: Recipe, rows, k, as_b: bool| {
        let (_, m) = random_matrix(5, rows, k, 1, if as_b { r.b() } else { r.a() });
        g.upload(&m).unwrap()
    };
    for r in MX_RECIPES {
        // Below 256 rows (the plan's fold threshold): the MX kernel; from it, the pair folds
        // onto the FP8 kernel. e2m1 pairs with e8m0 scales run on the 4-bit-weights kernel's
        // FP8 MMAs with A folded up to their own threshold (gpu_w4), then fold.
        let w4a4 = r.a().elem == ElemType::E2M1 && r.a().scale == blockscaled::ScaleType::E8M0;
        let min = if w4a4 { 1025 } else { 256 };
        let (small, large) = (
            g.plan(&up(r, min - 1, 256, false), &up(r, 64, 256, true))
                .unwrap(),
            g.plan(&up(r, min, 256, false), &up(r, 64, 256, true))
                .unwrap(),
        );
        if !w4a4 {
            assert!(matches!(small, Plan::Sm90Mx(_)), "{r}: {small:?}");
        }
        assert!(matches!(large, Plan::Sm90MxFp8(_)), "{r}: {large:?}");
    }
    // NVFP4 with K = 272: e2m1 rows of 136 bytes are not 16-byte multiples (TMA), so the
    // reference kernel runs it; forcing the MX kernel is a format error.
    let nv = Recipe::Nvfp4;
    let (a, b) = (up(nv, 64, 272, false), up(nv, 64, 272, true));
    assert_eq!(g.plan(&a, &b).unwrap(), Plan::Reference);
    let mut c = g.output(64, 64, 1, OutType::Bf16).unwrap();
    let forced = Plan::Sm90Mx(blockscaled::plan::sm90_mx_default(
        64,
        64,
        272,
        1,
        g.sm_count(),
    ));
    assert!(matches!(
        g.gemm_with(&a, &b, &mut c, forced),
        Err(Error::Format(_))
    ));
    // Mixed widths (MXFP8 · MXFP4) are not a pair the MX kernel takes: at any M they fold (each
    // operand folds on its own), and the result is the folded operands' product.
    let (_, ha) = random_matrix(6, 64, 256, 1, Recipe::Mxfp8(Fp8::E4M3).a());
    let (_, hb) = random_matrix(7, 96, 256, 1, Recipe::Mxfp4.b());
    let (a, b) = (g.upload(&ha).unwrap(), g.upload(&hb).unwrap());
    assert!(matches!(g.plan(&a, &b).unwrap(), Plan::Sm90MxFp8(_)));
    let mut c = g.output(64, 96, 1, OutType::F32).unwrap();
    g.gemm(&a, &b, &mut c).unwrap();
    let (fa, fb) = (
        ha.fold_to_fp8(false).unwrap(),
        hb.fold_to_fp8(true).unwrap(),
    );
    let (want, abs) = reference_output(&fa, &fb, OutType::F32).unwrap();
    compare_outputs(
        &c.to_host().unwrap(),
        &want,
        1.0,
        &fp8_accumulation_slack(&abs),
    )
    .unwrap_or_else(|e| panic!("mxfp8 · mxfp4 folded: {e}"));
}

/// A copy of `m` with element (l, r, k)'s code replaced (e2m1: the nibble).
fn with_code(m: &ScaledMatrix, (l, r, k): (usize, usize, usize), code: u8) -> ScaledMatrix {
    let d = *m.desc();
    let mut data = m.data().to_vec();
    let i = (l * d.rows + r) * d.k + k;
    if d.format.elem == ElemType::E2M1 {
        let sh = 4 * (i % 2);
        data[i / 2] = (data[i / 2] & !(0xF << sh)) | (code << sh);
    } else {
        data[i] = code;
    }
    with_parts(m, data, m.scales().to_vec())
}

/// A copy of `m` with the scale of element (l, r, k) replaced.
fn with_scale(m: &ScaledMatrix, (l, r, k): (usize, usize, usize), byte: u8) -> ScaledMatrix {
    let d = *m.desc();
    let mut scales = m.scales().to_vec();
    let (br, bk) = d.block_extent();
    scales[d.scale_layout.index(l, r / br, k / bk)] = byte;
    with_scales(m, scales)
}

/// Row `row` of batch entry 0's output (where the special value is planted) is `want` (NaN: any
/// NaN; ±Inf exactly); every other element, that row of the other entries included, matches the
/// CPU reference.
fn check_special_row(a: &ScaledMatrix, b: &ScaledMatrix, row: usize, want: f32) {
    let (m, n, k) = (a.rows(), b.rows(), a.k());
    let got = run(a, b, OutType::F32, None).unwrap();
    let (c64, abs) = reference::gemm_f64(a, b).unwrap();
    for (i, &g) in got.values.iter().enumerate() {
        let r = (i / n) % m;
        // (The special value is planted in batch entry 0; the same row of the other entries is
        // an ordinary row.)
        if r == row && i / (m * n) == 0 {
            let ok = if want.is_nan() { g.is_nan() } else { g == want };
            assert!(ok, "element {i}: got {g}, want {want}");
        } else {
            let w = round_output(OutType::F32, c64[i]);
            let tol = mx_slack(k, &abs[i..i + 1])[0]
                + blockscaled::output_ulp(OutType::F32, w.abs().max(g.abs()));
            assert!(
                (g as f64 - w as f64).abs() <= tol,
                "element {i}: got {g}, want {w}"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn nan_scales_and_nan_or_inf_codes_give_nan_or_inf_rows() {
    let (m, n, k) = (130, 260, 256);
    for r in MX_RECIPES {
        let (_, a) = random_matrix(11, m, k, 1, r.a());
        let (_, b) = random_matrix(12, n, k, 1, r.b());
        // A NaN scale (e8m0 0xFF, ue4m3 0x7F) makes its row of C NaN.
        let nan_scale = if r == Recipe::Nvfp4 { 0x7F } else { 0xFF };
        check_special_row(&with_scale(&a, (0, 77, 40), nan_scale), &b, 77, f32::NAN);
        match r.a().elem {
            // A NaN code (e4m3 0x7F, e5m2 0x7F) makes its row NaN.
            ElemType::E4M3 | ElemType::E5M2 => {
                check_special_row(&with_code(&a, (0, 3, 200), 0x7F), &b, 3, f32::NAN);
            }
            _ => {}
        }
        if r.a().elem == ElemType::E5M2 {
            // +Inf in A times a B column of positive values: +Inf in the whole row.
            let b_pos = ScaledMatrix::from_parts(
                b.format(),
                n,
                k,
                1,
                b.data().iter().map(|&c| c & 0x7F).collect(),
                b.scales().to_vec(),
                *b.scale_layout(),
                b.tensor_scale(),
            )
            .unwrap();
            let a_inf = with_code(&a, (0, 129, 5), 0x7C);
            // Make the row's other products finite and B's column 5 non-zero: every B code
            // at K = 5 set to 1.0 (e5m2 0x3C).
            let mut data = b_pos.data().to_vec();
            for row in 0..n {
                data[row * k + 5] = 0x3C;
            }
            let b_one = ScaledMatrix::from_parts(
                b.format(),
                n,
                k,
                1,
                data,
                b.scales().to_vec(),
                *b.scale_layout(),
                b.tensor_scale(),
            )
            .unwrap();
            check_special_row(&a_inf, &b_one, 129, f32::INFINITY);
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn swizzled_and_unswizzled_scales_give_bitwise_identical_results() {
    let (m, n, k, l) = (200, 300, 512, 2);
    for r in MX_RECIPES {
        let (_, a) = random_matrix(21, m, k, l, r.a());
        let (_, b) = random_matrix(22, n, k, l, r.b());
        let sw = |x: &ScaledMatrix| {
            ScaledMatrix::from_parts_swizzled_128x4(
                x.format(),
                x.rows(),
                x.k(),
                x.batch(),
                x.data().to_vec(),
                x.scales_swizzled_128x4().unwrap(),
                x.tensor_scale(),
            )
            .unwrap()
        };
        let plain = run(&a, &b, OutType::Bf16, None).unwrap();
        let swizzled = run(&sw(&a), &sw(&b), OutType::Bf16, None).unwrap();
        assert!(
            plain
                .values
                .iter()
                .zip(&swizzled.values)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "{r}"
        );
        // And twice in a row: the same bits.
        let again = run(&a, &b, OutType::Bf16, None).unwrap();
        assert!(
            plain
                .values
                .iter()
                .zip(&again.values)
                .all(|(x, y)| x.to_bits() == y.to_bits())
        );
    }
}

/// The recipes that fold onto the FP8 kernel.
const FOLD_RECIPES: [Recipe; 5] = [
    Recipe::Mxfp8(Fp8::E4M3),
    Recipe::Mxfp8(Fp8::E5M2),
    Recipe::Mxfp4,
    Recipe::E2m1E8m0x16,
    Recipe::Nvfp4,
];

/// The fold plan (the FP8 kernel's default configuration), whatever M is.
fn fold_plan(da: &DeviceMatrix, db: &DeviceMatrix) -> Result<Plan, String> {
    let (a, b) = (da.desc(), db.desc());
    Ok(Plan::Sm90MxFp8(blockscaled::plan::sm90_default(
        a.rows,
        b.rows,
        a.k,
        a.batch,
        gpu().hardware(),
    )))
}

/// `m` with every scale byte replaced by a random code and about 1 in 500 by NaN: e8m0 codes in
/// 100..=154 (shifts up to 54 within a group, far past e2m1's exact 14, so the fold rounds);
/// ue4m3 codes over 2^-9…2^7 (subnormal scales included), NaN as 0x7F.
fn wide_scales(m: &ScaledMatrix, seed: u64) -> ScaledMatrix {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let nv = m.format().scale == blockscaled::ScaleType::UE4M3;
    let scales = m
        .scales()
        .iter()
        .map(|_| {
            if rng.random_range(0..500) == 0 {
                if nv { 0x7F } else { 0xFF }
            } else if nv {
                rng.random_range(0x01..=0x70u8)
            } else {
                rng.random_range(100..=154u8)
            }
        })
        .collect();
    with_scales(m, scales)
}

/// The L × K × K identity in format `f`, every one exact: quantized, and for NVFP4 (whose
/// quantizer would give 6 × 448 × 1/2688, not 1) re-coded as e2m1 1.0 (code 2) times ue4m3 1.0
/// (0x38) with tensor scale 1.
fn identity(k: usize, l: usize, f: blockscaled::OperandFormat) -> ScaledMatrix {
    let v: Vec<f32> = (0..l * k * k)
        .map(|j| if (j / k) % k == j % k { 1.0 } else { 0.0 })
        .collect();
    let m = ScaledMatrix::quantize(&v, k, k, l, f).unwrap();
    if f.scale != blockscaled::ScaleType::UE4M3 {
        return m;
    }
    let d = *m.desc();
    let nib = |x: u8| if x != 0 { 2 } else { 0 };
    let data = m
        .data()
        .iter()
        .map(|&b| nib(b & 0xF) | nib(b >> 4) << 4)
        .collect();
    let scales = vec![0x38; m.scales().len()];
    let one =
        ScaledMatrix::from_parts(d.format, k, k, l, data, scales, d.scale_layout, 1.0).unwrap();
    assert!((0..k).all(|i| one.value(l - 1, i, i) == 1.0 && one.value(0, i, (i + 1) % k) == 0.0));
    one
}

/// A · Bᵀ on the fold path with one operand the K × K identity (its ones exact: [`identity`])
/// copies the other operand's folded values into C (one non-zero product per element, times the
/// group scales: exact for power-of-two scales, one f32 rounding of the exact value for NVFP4's
/// tensor scale; NaN × 0 gives NaN): so C shows every element the GPU's fold wrote, in both
/// roles, and it must equal the host's `fold_to_fp8` (rounded once to f32) bit for bit.
#[test]
#[ignore = "needs a CUDA device"]
fn the_gpu_fold_equals_the_host_fold_for_every_element_in_both_roles() {
    let (rows, k, l) = (200, 512, 2);
    for (i, r) in FOLD_RECIPES.into_iter().enumerate() {
        let seed = 0xF01D + i as u64;
        let ident = |f| identity(k, l, f);
        for as_b in [false, true] {
            let other = if as_b { r.b() } else { r.a() };
            let (_, x) = random_matrix(seed, rows, k, l, other);
            let x = wide_scales(&x, seed + 7);
            let (a, b) = if as_b {
                (ident(r.a()), x.clone())
            } else {
                (x.clone(), ident(r.b()))
            };
            let (fa, fb) = (a.fold_to_fp8(false).unwrap(), b.fold_to_fp8(true).unwrap());
            let (want, _) = reference::gemm_f64(&fa, &fb).unwrap();
            let got = run_with(&a, &b, OutType::F32, fold_plan).unwrap();
            let (mut nan, mut bad) = (0, Vec::new());
            for (j, (&g, &w)) in got.values.iter().zip(&want).enumerate() {
                if w.is_nan() {
                    nan += 1;
                    if !g.is_nan() {
                        bad.push(format!("element {j}: got {g}, want NaN"));
                    }
                } else if g != w as f32 {
                    bad.push(format!("element {j}: got {g}, want {w}"));
                }
            }
            assert!(
                bad.is_empty(),
                "{r} as_b {as_b}: {} differ: {:?}",
                bad.len(),
                &bad[..bad.len().min(8)]
            );
            // The NaN scales reached C, and most elements did not.
            assert!(
                nan > 0 && nan < got.values.len() / 2,
                "{r} as_b {as_b}: {nan} NaN"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// The fold path against the CPU reference on the folded operands (what the FP8 kernel
    /// multiplies: the previous test shows the GPU's fold is the host's), within the FP8
    /// kernel's accumulation bound, on random ragged shapes, batches and output types.
    #[test]
    #[ignore = "needs a CUDA device"]
    fn fold_path_matches_the_cpu_reference_on_random_ragged_shapes(
        which in 0usize..4,
        m in 1usize..400,
        n in 1usize..600,
        k128 in 1usize..9,
        l in 1usize..4,
        out_i in 0usize..3,
        seed in any::<u64>(),
    ) {
        let recipe = FOLD_RECIPES[which];
        let dtype = [OutType::Bf16, OutType::F16, OutType::F32][out_i];
        let k = 128 * k128;
        let (_, a) = random_matrix(seed, m, k, l, recipe.a());
        let (_, b) = random_matrix(seed ^ 0x5EED, n, k, l, recipe.b());
        let (fa, fb) = (a.fold_to_fp8(false).unwrap(), b.fold_to_fp8(true).unwrap());
        let (want, abs) = reference_output(&fa, &fb, dtype).map_err(TestCaseError::fail)?;
        let got = run_with(&a, &b, dtype, fold_plan).map_err(TestCaseError::fail)?;
        compare_outputs(&got, &want, 1.0, &fp8_accumulation_slack(&abs)).map_err(|e| {
            TestCaseError::fail(format!("fold {recipe} {m}x{n}x{k}x{l} {dtype:?}: {e}"))
        })?;
    }
}

/// What the fold path costs in accuracy, against what the format itself costs, per element of C
/// in units of Σ_k|a_k·b_k| (so a small column counts as much as a large one): on random inputs
/// (per-row magnitudes 2^-6…2^6, 1% outliers), the fold path's error (against the exact product
/// of the quantized operands) and the format's quantization error (exact product of the quantized
/// operands against the product of the unquantized inputs), largest and RMS over C. For every
/// format `choose` folds (at large M) the fold's largest error stays below the format's largest
/// and its RMS below half the format's RMS; for e8m0 scales (elements folded exactly but for
/// subnormals) even the fold's largest error stays below the format's RMS.
#[test]
#[ignore = "needs a CUDA device"]
fn fold_path_error_is_below_the_formats_own_quantization_error() {
    use rayon::prelude::*;
    let (m, n, k) = (256, 256, 4096);
    for (i, r) in FOLD_RECIPES.into_iter().enumerate() {
        let (va, vb) = (
            random_values(41 + i as u64, m * k, k),
            random_values(97 + i as u64, n * k, k),
        );
        let a = ScaledMatrix::quantize(&va, m, k, 1, r.a()).unwrap();
        let b = ScaledMatrix::quantize(&vb, n, k, 1, r.b()).unwrap();
        let (exact, abs) = reference::gemm_f64(&a, &b).unwrap();
        let unq: Vec<f64> = (0..m * n)
            .into_par_iter()
            .map(|j| {
                let (x, y) = (&va[(j / n) * k..][..k], &vb[(j % n) * k..][..k]);
                x.iter().zip(y).map(|(&p, &q)| p as f64 * q as f64).sum()
            })
            .collect();
        let got = run_with(&a, &b, OutType::F32, fold_plan).unwrap();
        let mx = run(&a, &b, OutType::F32, None).unwrap();
        let rel = |x: f64, y: f64, s: f64| if s > 0.0 { (x - y).abs() / s } else { 0.0 };
        // (largest, RMS) of the per-element errors of `v` against `want`; NaN counts as infinite.
        let stats = |v: &mut dyn Iterator<Item = f64>, want: &[f64]| {
            let (mut max, mut sq) = (0.0f64, 0.0f64);
            for ((x, &w), &s) in v.zip(want).zip(&abs) {
                let e = rel(x, w, s);
                max = if e.is_nan() {
                    f64::INFINITY
                } else {
                    max.max(e)
                };
                sq += e * e;
            }
            (max, (sq / (m * n) as f64).sqrt())
        };
        let path = stats(&mut got.values.iter().map(|&g| g as f64), &exact);
        let exact_path = stats(&mut mx.values.iter().map(|&g| g as f64), &exact);
        let quant = stats(&mut exact.iter().copied(), &unq);
        println!(
            "{r}: per element / Σ|ab| (max, RMS): fold path ({:.2e}, {:.2e}), exact (MX kernel) \
             path ({:.2e}, {:.2e}), quantization ({:.2e}, {:.2e}); fold / quantization: max \
             {:.2}, RMS {:.2}",
            path.0,
            path.1,
            exact_path.0,
            exact_path.1,
            quant.0,
            quant.1,
            path.0 / quant.0,
            path.1 / quant.1
        );
        assert!(path.0 < quant.0 && path.1 < quant.1 / 2.0, "{r}");
        if r.a().scale == blockscaled::ScaleType::E8M0 {
            assert!(path.0 < quant.1, "{r}");
        }
    }
}

/// No systematic error (the bar every family is held to, `check_no_cancellation`): on operands
/// that do not cancel, the MX kernel on every recipe within the bf16 tensor cores' bound of the
/// module doc on either side, and the fold path (the MX → FP8 pre-pass, then the FP8 kernel)
/// within the FP8 kernel's one-sided bound of the host's bit-identical folds; each check fails
/// a planted 0.5% error.
#[test]
#[ignore = "needs a CUDA device"]
fn mx_kernel_and_fold_path_have_no_systematic_error_on_operands_that_do_not_cancel() {
    let seed = run_seed();
    let k = 1024;
    for (i, r) in MX_RECIPES.into_iter().enumerate() {
        let shape = (200 + 17 * i, 264, k, 2);
        let plan = |da: &DeviceMatrix, db: &DeviceMatrix| mx_plan(da, db, None);
        let (rel, mean) = no_cancellation_gemm(
            gpu(),
            shape,
            (r.a(), r.b()),
            seed + i as u64,
            NoCancellation::half(k),
            plan,
            as_they_are,
        )
        .unwrap_or_else(|e| panic!("MX kernel, {r}: {e}"));
        eprintln!("MX kernel, {r}: largest relative error {rel:.2e}, mean {mean:.2e}");
    }
    for (i, r) in FOLD_RECIPES.into_iter().enumerate() {
        let folds = |a: &ScaledMatrix, b: &ScaledMatrix| {
            let e = |x: Error| x.to_string();
            Ok((
                a.fold_to_fp8(false).map_err(e)?,
                b.fold_to_fp8(true).map_err(e)?,
            ))
        };
        let (rel, mean) = no_cancellation_gemm(
            gpu(),
            (300, 264 + 8 * i, k, 2),
            (r.a(), r.b()),
            seed + 10 + i as u64,
            NoCancellation::FP8,
            fold_plan,
            folds,
        )
        .unwrap_or_else(|e| panic!("fold path, {r}: {e}"));
        eprintln!("fold path, {r}: largest relative error {rel:.2e}, mean {mean:.2e}");
    }
}
