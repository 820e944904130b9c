//! GPU tests of the Hopper 4-bit-weights kernel (`Plan::Sm90W4`): W4A16 and W4A8 with MXFP4 and
//! NVFP4 weights, and e2m1 pairs (MXFP4, NVFP4, e2m1 + e8m0 / 16); random ragged shapes, batches,
//! both tiles, split-K, every output type, NaN and Inf.
//! Run on an H100: `cargo test -p blockscaled-tests --test gpu_w4 -- --include-ignored`.
//!
//! Tolerance, derived as for the MX kernel (`gpu_mx.rs`): every weight code × scale and every
//! activation (bf16 as is; e4m3 and e2m1 codes × their block scales) is exact in bf16, the tensor
//! cores multiply exactly and add in fp32, each 16-wide K step with at most two roundings of one
//! fp32 unit of a magnitude ≤ Σ|a·b|; W4A8 adds each 64-K stage's sum times its fp32 scale with
//! one more rounding of the product and one of the sum per stage (K/64 · 2 · 2^-24 ≤ K/8 · 2^-23).
//! So |got − exact| ≤ (K/8 + 1) · 2^-23 · Σ|a·b|, plus the output rounding.

use std::sync::OnceLock;

use blockscaled::{
    ElemType, Fp4Weights, Gpu, HostOutput, OutType, Plan, Recipe, ScaledMatrix, Sm90W4Tile,
    reference, round_output,
};
use blockscaled_tests::{
    bf16_mma_rel, compare_outputs, fp8_accumulation_slack, gemm_on, random_matrix, random_pair,
    random_weight_pair, reference_output, with_parts,
};
use proptest::prelude::*;

fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| Gpu::new(0).expect("a CUDA device (these tests are ignored without one)"))
}

/// The recipes the kernel takes.
const W4_RECIPES: [Recipe; 7] = [
    Recipe::W4A16(Fp4Weights::Mxfp4),
    Recipe::W4A16(Fp4Weights::Nvfp4),
    Recipe::W4A8(Fp4Weights::Mxfp4),
    Recipe::W4A8(Fp4Weights::Nvfp4),
    Recipe::Mxfp4,
    Recipe::Nvfp4,
    Recipe::E2m1E8m0x16,
];

fn slack(k: usize, abs_sum: &[f64]) -> Vec<f64> {
    abs_sum.iter().map(|s| s * bf16_mma_rel(k)).collect()
}

/// Runs A · Bᵀ on the 4-bit-weights kernel (output poisoned first), with the tile (activation
/// rows) and split forced when given.
fn run(
    a: &ScaledMatrix,
    b: &ScaledMatrix,
    dtype: OutType,
    force: Option<(u32, u32)>,
) -> Result<HostOutput, String> {
    let g = gpu();
    let d = blockscaled::plan::sm90_w4_default(a.rows(), b.rows(), a.k(), a.batch(), g.sm_count());
    let plan = match force {
        Some((n, split_k)) => Plan::Sm90W4(d.with_tile(Sm90W4Tile { n }).with_split_k(split_k)),
        None => Plan::Sm90W4(d),
    };
    gemm_on(g, a, b, dtype, |_, _| Ok(plan))
}

#[allow(clippy::too_many_arguments)]
fn check(
    recipe: Recipe,
    m: usize,
    n: usize,
    k: usize,
    l: usize,
    dtype: OutType,
    seed: u64,
    force: Option<(u32, u32)>,
) -> Result<(), String> {
    let what = format!("sm90 W4 {force:?}");
    check_with(recipe, (m, n, k, l), dtype, seed, (&what, false), |a, b| {
        run(a, b, dtype, force)
    })
}

/// A random pair of `recipe` and `dims` through `run`, against the CPU reference within the bound
/// of [`bound_k`] (`stream`: run on the stream kernel; `what` names the kernel and its
/// configuration in a failure).
fn check_with(
    recipe: Recipe,
    (m, n, k, l): (usize, usize, usize, usize),
    dtype: OutType,
    seed: u64,
    (what, stream): (&str, bool),
    run: impl FnOnce(&ScaledMatrix, &ScaledMatrix) -> Result<HostOutput, String>,
) -> Result<(), String> {
    // Odd seeds: weights of a trained model's magnitudes (block scales at most 1, some rows'
    // 4), on which the kernels fold e2m1's bias into e8m0 scales where a warp's scales allow.
    let (a, b) = if seed % 2 == 1 {
        random_weight_pair(seed, (m, n, k, l), recipe.a(), recipe.b())
    } else {
        random_pair(seed, (m, n, k, l), recipe.a(), recipe.b())
    };
    let (want, abs) = reference_output(&a, &b, dtype)?;
    let got = run(&a, &b)?;
    compare_outputs(&got, &want, 1.0, &slack(bound_k(recipe, k, stream), &abs))
        .map_err(|e| format!("{what} {recipe} {m}x{n}x{k}x{l} {dtype:?} seed {seed}: {e}"))
}

/// Runs A · Bᵀ on the stream kernel (bf16 activations, M ≤ 16; output poisoned first), with the
/// split forced when given.
fn run_stream(
    a: &ScaledMatrix,
    b: &ScaledMatrix,
    dtype: OutType,
    split: Option<u32>,
) -> Result<HostOutput, String> {
    let g = gpu();
    let d = blockscaled::plan::sm90_w4_stream_default(
        a.rows(),
        b.rows(),
        a.k(),
        a.batch(),
        g.sm_count(),
    );
    let plan = Plan::Sm90W4(split.map_or(d, |s| d.with_split_k(s)));
    gemm_on(g, a, b, dtype, |_, _| Ok(plan))
}

/// The K of the error bound of `recipe` on the stream kernel (`stream`): twice K for W4A8
/// ([`check_stream`]), K otherwise.
fn bound_k(recipe: Recipe, k: usize, stream: bool) -> usize {
    if stream && matches!(recipe, Recipe::W4A8(_)) {
        2 * k
    } else {
        k
    }
}

/// [`check`] on the stream kernel. W4A8 there multiplies exact fp16 values (weight codes times
/// 2^-6, activation codes) with fp32 sums per 16-K step, then adds each scale block's sum times
/// its two scales: per 32 K, two steps of at most two roundings each, one of the scales'
/// product and one of the add, so twice the steps' count of the W4A16 bound covers it.
fn check_stream(
    recipe: Recipe,
    (m, n, k, l): (usize, usize, usize, usize),
    dtype: OutType,
    seed: u64,
    split: Option<u32>,
) -> Result<(), String> {
    let what = format!("sm90 W4 stream, split {split:?}");
    check_with(recipe, (m, n, k, l), dtype, seed, (&what, true), |a, b| {
        run_stream(a, b, dtype, split)
    })
}

/// The weight-only recipes the stream kernel takes.
const STREAM_RECIPES: [Recipe; 4] = [
    Recipe::W4A16(Fp4Weights::Mxfp4),
    Recipe::W4A16(Fp4Weights::Nvfp4),
    Recipe::W4A8(Fp4Weights::Mxfp4),
    Recipe::W4A8(Fp4Weights::Nvfp4),
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    #[ignore = "needs a CUDA device"]
    fn w4_stream_kernel_matches_cpu_reference_on_random_ragged_shapes(
        which in 0usize..4,
        m in 1usize..=16,
        n in 1usize..600,
        k32 in 1usize..40,
        l in 1usize..3,
        out_i in 0usize..3,
        split in 1u32..7,
        seed in any::<u64>(),
    ) {
        let dtype = [OutType::Bf16, OutType::F16, OutType::F32][out_i];
        // K a multiple of 32, often not of the 64 of a chunk (its second half zeros), nor of the
        // 128 of a W4A8 activation scale block.
        let k = 32 * k32;
        let split = split.min(k.div_ceil(64) as u32);
        check_stream(STREAM_RECIPES[which], (m, n, k, l), dtype, seed, Some(split))
            .map_err(TestCaseError::fail)?;
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn w4_stream_kernel_matches_cpu_reference_at_decode_sizes_and_repeats_bit_for_bit() {
    for (i, r) in STREAM_RECIPES.into_iter().enumerate() {
        for (m, n, k, l) in [(1, 4096, 2048, 1), (16, 2048, 4096, 1), (9, 1000, 1056, 2)] {
            let seed = 0x5EED + i as u64 * 1_000_003 + blockscaled_tests::run_seed();
            check_stream(r, (m, n, k, l), OutType::Bf16, seed, None).unwrap();
        }
        // A split's partial sums are added in range order, whichever CTA arrives last.
        let (a, b) = random_pair(77 + i as u64, (3, 1500, 4096, 1), r.a(), r.b());
        let first = run_stream(&a, &b, OutType::F32, Some(7)).unwrap();
        for _ in 0..3 {
            let again = run_stream(&a, &b, OutType::F32, Some(7)).unwrap();
            let same = first
                .values
                .iter()
                .zip(&again.values)
                .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                same,
                "{r}: a split of 7 gave different sums on a second run"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn the_stream_kernel_refuses_what_it_cannot_run() {
    let g = gpu();
    let r = Recipe::W4A16(Fp4Weights::Mxfp4);
    let (a17, b) = random_pair(3, (17, 256, 256, 1), r.a(), r.b());
    let d = blockscaled::plan::sm90_w4_stream_default(16, 256, 256, 1, g.sm_count());
    let e = gemm_on(g, &a17, &b, OutType::Bf16, |_, _| Ok(Plan::Sm90W4(d))).unwrap_err();
    assert!(e.contains("at most 16 activation rows"), "{e}");
    let (a, b) = random_pair(4, (4, 256, 256, 1), r.a(), r.b());
    let e = gemm_on(g, &a, &b, OutType::Bf16, |_, _| {
        Ok(Plan::Sm90W4(d.with_split_k(5)))
    })
    .unwrap_err();
    assert!(e.contains("split_k = 5"), "{e}");
    // e2m1 activations with ue4m3 scales (which do not fold exactly) are the pipelined
    // kernel's; with e8m0 ones they are folded per call ([`W4A4_RECIPES`]).
    let r4 = Recipe::Nvfp4;
    let (a4, b4) = random_pair(5, (4, 256, 256, 1), r4.a(), r4.b());
    let e = gemm_on(g, &a4, &b4, OutType::Bf16, |_, _| Ok(Plan::Sm90W4(d))).unwrap_err();
    assert!(e.contains("bf16 or e4m3"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    #[ignore = "needs a CUDA device"]
    fn w4_kernel_matches_cpu_reference_on_random_ragged_shapes(
        which in 0usize..7,
        m in 1usize..300,
        n in 1usize..600,
        k32 in 1usize..20,
        l in 1usize..4,
        out_i in 0usize..3,
        tile in 0usize..2,
        split in 1u32..5,
        seed in any::<u64>(),
    ) {
        let recipe = W4_RECIPES[which];
        let dtype = [OutType::Bf16, OutType::F16, OutType::F32][out_i];
        // K a multiple of 32 (MX blocks, 16-byte rows), often not of 64 or of W4A8's 128.
        let k = 32 * k32;
        let split = split.min(k.div_ceil(64) as u32);
        check(recipe, m, n, k, l, dtype, seed, Some(([16, 128][tile], split)))
            .map_err(TestCaseError::fail)?;
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn w4_kernel_matches_cpu_reference_on_decode_and_larger_shapes() {
    for (i, r) in W4_RECIPES.into_iter().enumerate() {
        for (m, n, k, l) in [
            (1, 4096, 2048, 1),
            (16, 2048, 4096, 1),
            (100, 1000, 1056, 2),
        ] {
            let seed = 0xBEEF + i as u64 * 1_000_003 + blockscaled_tests::run_seed();
            check(r, m, n, k, l, OutType::Bf16, seed, None).unwrap();
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn weight_only_recipes_and_small_fp4_pairs_plan_the_w4_kernel() {
    let g = gpu();
    let up = |r: Recipe, rows, k, as_b| uploaded(g, r, (rows, k), as_b);
    for r in W4_RECIPES {
        let plan = g
            .plan(&up(r, 16, 256, false), &up(r, 512, 256, true))
            .unwrap();
        // bf16 and e4m3 activations stream the weights, and e2m1 ones with e8m0 scales folded
        // per call; the rest (NVFP4 pairs) take the pipelined 16-row tile.
        let stream = STREAM_RECIPES.contains(&r) || W4A4_RECIPES.contains(&r);
        assert!(
            matches!(plan, Plan::Sm90W4(c) if c.tile.n == 16 && c.stream == stream),
            "{r}: {plan:?}"
        );
    }
    for r in [
        Recipe::W4A16(Fp4Weights::Nvfp4),
        Recipe::W4A8(Fp4Weights::Nvfp4),
    ] {
        let plan = g
            .plan(&up(r, 1000, 256, false), &up(r, 512, 256, true))
            .unwrap();
        assert!(
            matches!(plan, Plan::Sm90W4(c) if c.tile.n == 128),
            "{r}: {plan:?}"
        );
    }
    // W4A8 with e8m0 weight scales: its FP8 MMAs for one activation tile, then the weights
    // folded per call (exactly) onto the FP8 kernel.
    let r = Recipe::W4A8(Fp4Weights::Mxfp4);
    let plan = |m| {
        g.plan(&up(r, m, 256, false), &up(r, 512, 256, true))
            .unwrap()
    };
    assert!(
        matches!(plan(128), Plan::Sm90W4(c) if c.fp8 && c.tile.n == 128),
        "{:?}",
        plan(128)
    );
    assert!(matches!(plan(129), Plan::Sm90MxFp8(_)), "{:?}", plan(129));
    // Larger M FP4 pairs leave this kernel: they fold onto the FP8 kernel; up to 128 rows those
    // with e8m0 scales run on its FP8 MMAs with A folded.
    let plan = |r: Recipe, m| {
        g.plan(&up(r, m, 256, false), &up(r, 512, 256, true))
            .unwrap()
    };
    assert!(matches!(plan(Recipe::Mxfp4, 1000), Plan::Sm90MxFp8(_)));
    assert!(matches!(plan(Recipe::Nvfp4, 1000), Plan::Sm90MxFp8(_)));
    for r in W4A4_RECIPES {
        let p = plan(r, 128);
        assert!(matches!(p, Plan::Sm90W4(c) if c.fp8), "{r}: {p:?}");
        let p = plan(r, 129);
        assert!(matches!(p, Plan::Sm90MxFp8(_)), "{r}: {p:?}");
    }
}

/// The FP4 pairs with e8m0 scales, whose activations the FP8-MMA and stream kernels take folded
/// per call (e4m3 with fp32 scales per 1×128; the weights stay 4-bit).
const W4A4_RECIPES: [Recipe; 2] = [Recipe::Mxfp4, Recipe::E2m1E8m0x16];

/// A random pair of `recipe` (one of [`W4A4_RECIPES`]) through the FP8-MMA kernel, or the stream
/// kernel (`stream`, M ≤ 16), with A folded per call, against the CPU reference on the host's
/// fold of A (bit-identical to the device's; exact where a row's 128 span at most 2^14). The
/// weights are exact in both; the FP8-MMA kernel's error is its FP8 tensor-core sums
/// ([`check_fp8`]), the stream kernel's W4A8's ([`check_stream`]).
fn check_w4a4(
    recipe: Recipe,
    (m, n, k, l): (usize, usize, usize, usize),
    dtype: OutType,
    seed: u64,
    (stream, split): (bool, Option<u32>),
) -> Result<(), String> {
    let (a, b) = if seed % 2 == 1 {
        random_weight_pair(seed, (m, n, k, l), recipe.a(), recipe.b())
    } else {
        random_pair(seed, (m, n, k, l), recipe.a(), recipe.b())
    };
    let fa = a.fold_to_fp8(false).map_err(|e| e.to_string())?;
    let (want, abs) = reference_output(&fa, &b, dtype)?;
    let (got, tol) = if stream {
        let tol = slack(2 * k, &abs);
        (run_stream(&a, &b, dtype, split)?, tol)
    } else {
        (run_fp8(&a, &b, dtype, split)?, fp8_accumulation_slack(&abs))
    };
    compare_outputs(&got, &want, 1.0, &tol).map_err(|e| {
        format!(
            "sm90 W4 A folded, stream {stream} split {split:?}, {recipe} {m}x{n}x{k}x{l} \
             {dtype:?} seed {seed}: {e}"
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    #[ignore = "needs a CUDA device"]
    fn w4a4_with_e8m0_scales_on_fp8_mmas_and_the_stream_kernel_matches_cpu_reference(
        which in 0usize..2,
        m in 1usize..300,
        n in 1usize..600,
        k128 in 1usize..12,
        l in 1usize..3,
        out_i in 0usize..3,
        split in 1u32..5,
        seed in any::<u64>(),
    ) {
        let dtype = [OutType::Bf16, OutType::F16, OutType::F32][out_i];
        let k = 128 * k128;
        // Decode sizes on the stream kernel (its splits range over 64-K chunks), the rest on FP8
        // MMAs (splits of 128-K stages).
        let stream = m <= 16 && seed % 3 != 0;
        let split = split.min(if stream { 2 * k128 } else { k128 } as u32);
        check_w4a4(W4A4_RECIPES[which], (m, n, k, l), dtype, seed, (stream, Some(split)))
            .map_err(TestCaseError::fail)?;
    }
}

/// A random `rows` × `k` matrix of `r`'s A or (`as_b`) B format, on the GPU.
fn uploaded(
    g: &Gpu,
    r: Recipe,
    (rows, k): (usize, usize),
    as_b: bool,
) -> blockscaled::DeviceMatrix<'_> {
    let (_, m) = random_matrix(5, rows, k, 1, if as_b { r.b() } else { r.a() });
    g.upload(&m).unwrap()
}

/// A copy of `m` with one value changed through `edit(data, scales, element index)`.
fn edited(m: &ScaledMatrix, edit: impl Fn(&mut Vec<u8>, &mut Vec<u8>)) -> ScaledMatrix {
    let (mut data, mut scales) = (m.data().to_vec(), m.scales().to_vec());
    edit(&mut data, &mut scales);
    with_parts(m, data, scales)
}

/// Which kernel a NaN check runs, and the K of its error bound.
#[derive(Clone, Copy)]
enum On {
    Pipelined(usize),
    Stream(usize),
    Fp8,
    /// e2m1 activations folded per call onto the stream kernel (W4A8's bound of K) or the
    /// FP8-MMA one (`None`); the reference multiplies the host's fold of A.
    FoldedA(Option<usize>),
}

/// Column `col` (when `by_col`) or row `row` of C is NaN; every other element matches the CPU
/// reference within the bound of the kernel it ran on.
fn check_nan_line(a: &ScaledMatrix, b: &ScaledMatrix, line: usize, by_col: bool, on: On) {
    let (m, n) = (a.rows(), b.rows());
    let got = match on {
        On::Stream(_) => run_stream(a, b, OutType::F32, None),
        On::Pipelined(_) => run(a, b, OutType::F32, None),
        On::Fp8 | On::FoldedA(None) => run_fp8(a, b, OutType::F32, None),
        On::FoldedA(Some(_)) => run_stream(a, b, OutType::F32, None),
    }
    .unwrap();
    let (c64, abs) = match on {
        On::FoldedA(_) => reference::gemm_f64(&a.fold_to_fp8(false).unwrap(), b).unwrap(),
        _ => reference::gemm_f64(a, b).unwrap(),
    };
    for (i, &g) in got.values.iter().enumerate() {
        let (r, c) = (i / n, i % n);
        if (by_col && c == line) || (!by_col && r == line) {
            assert!(g.is_nan(), "element ({r}, {c}): got {g}, want NaN");
        } else {
            let w = round_output(OutType::F32, c64[i]);
            let tol = match on {
                On::Pipelined(k) | On::Stream(k) => slack(k, &abs[i..i + 1])[0],
                On::FoldedA(Some(k)) => slack(2 * k, &abs[i..i + 1])[0],
                On::Fp8 | On::FoldedA(None) => fp8_accumulation_slack(&abs[i..i + 1])[0],
            } + blockscaled::output_ulp(OutType::F32, w.abs().max(g.abs()));
            assert!(
                (g as f64 - w as f64).abs() <= tol,
                "element ({r}, {c}): got {g}, want {w}"
            );
        }
    }
    let _ = m;
}

#[test]
#[ignore = "needs a CUDA device"]
fn nan_weight_scales_and_nan_activations_give_nan_columns_and_rows() {
    let runs = W4_RECIPES.into_iter().map(|r| (r, 20, false));
    for (r, m, stream) in runs.chain(STREAM_RECIPES.into_iter().map(|r| (r, 13, true))) {
        let (n, k) = (300, 256);
        let (_, a) = random_matrix(31, m, k, 1, r.a());
        let (_, b) = random_matrix(32, n, k, 1, r.b());
        // A NaN weight scale (e8m0 0xFF, ue4m3 0x7F) of row 201 makes column 201 of C NaN.
        let nv = r.b().scale == blockscaled::ScaleType::UE4M3;
        let b_nan = edited(&b, |_, s| {
            let d = b.desc();
            let (br, bk) = d.block_extent();
            s[d.scale_layout.index(0, 201 / br, 100 / bk)] = if nv { 0x7F } else { 0xFF };
        });
        let bound = match stream {
            true => On::Stream(bound_k(r, k, true)),
            false => On::Pipelined(k),
        };
        check_nan_line(&a, &b_nan, 201, true, bound);
        // A NaN activation (bf16 0x7FC0, e4m3 0x7F; e2m1 has none: a NaN scale) makes row 7 NaN.
        let a_nan = edited(&a, |d, s| {
            let i = 7 * k + 150;
            match r.a().elem {
                ElemType::BF16 => d[2 * i..2 * i + 2].copy_from_slice(&0x7FC0u16.to_le_bytes()),
                ElemType::E4M3 => d[i] = 0x7F,
                _ => {
                    let ad = a.desc();
                    let (br, bk) = ad.block_extent();
                    s[ad.scale_layout.index(0, 7 / br, 150 / bk)] = if nv { 0x7F } else { 0xFF };
                }
            }
        });
        check_nan_line(&a_nan, &b, 7, false, bound);
    }
}

/// No systematic error (`blockscaled_tests::check_no_cancellation`): on operands that do not
/// cancel, every recipe the 4-bit-weights kernel takes, at a decode size and a 128-row one, within
/// the bf16 tensor cores' bound on either side (weights and activations are exact in bf16); each
/// check fails a planted 0.5% error.
#[test]
#[ignore = "needs a CUDA device"]
fn w4_kernel_has_no_systematic_error_on_operands_that_do_not_cancel() {
    use blockscaled_tests::{NoCancellation, as_they_are, no_cancellation_gemm, run_seed};
    let (g, seed, k) = (gpu(), run_seed(), 1024);
    // The pipelined kernel at M = 16 and 128, then the stream kernel at 1 and 16.
    let pipelined = W4_RECIPES
        .into_iter()
        .flat_map(|r| [(r, 16, false), (r, 128, false)]);
    let streamed = STREAM_RECIPES
        .into_iter()
        .flat_map(|r| [(r, 1, true), (r, 16, true)]);
    for (i, (r, m, stream)) in pipelined.chain(streamed).enumerate() {
        let plan = |da: &blockscaled::DeviceMatrix, db: &blockscaled::DeviceMatrix| {
            let (a, b) = (da.desc(), db.desc());
            let cfg = if stream {
                blockscaled::plan::sm90_w4_stream_default(a.rows, b.rows, k, 2, g.sm_count())
            } else {
                blockscaled::plan::sm90_w4_default(a.rows, b.rows, k, 2, g.sm_count())
            };
            Ok(Plan::Sm90W4(cfg))
        };
        let (rel, mean) = no_cancellation_gemm(
            g,
            (m, 264 + 8 * i, k, 2),
            (r.a(), r.b()),
            seed + i as u64,
            NoCancellation::half(bound_k(r, k, stream)),
            plan,
            as_they_are,
        )
        .unwrap_or_else(|e| panic!("4-bit weights, {r}, M = {m}, stream {stream}: {e}"));
        eprintln!(
            "4-bit weights, {r}, M = {m}, stream {stream}: largest relative error {rel:.2e}, \
             mean {mean:.2e}"
        );
    }
}

/// The FP8-MMA kernel's pairs (`Sm90W4Config::fp8`): A as W4A8's (e4m3, fp32 scales per 1×128),
/// B as the second recipe's (e2m1 with e8m0 scales per 32, or per 16).
const FP8_PAIRS: [(Recipe, Recipe); 2] = [
    (
        Recipe::W4A8(Fp4Weights::Mxfp4),
        Recipe::W4A8(Fp4Weights::Mxfp4),
    ),
    (Recipe::W4A8(Fp4Weights::Mxfp4), Recipe::E2m1E8m0x16),
];

/// Runs A · Bᵀ on the FP8-MMA kernel (output poisoned first), with the split forced when given.
fn run_fp8(
    a: &ScaledMatrix,
    b: &ScaledMatrix,
    dtype: OutType,
    split: Option<u32>,
) -> Result<HostOutput, String> {
    let g = gpu();
    let (m, n, k, l) = (a.rows(), b.rows(), a.k(), a.batch());
    let d = blockscaled::plan::sm90_w4_fp8_default(m, n, k, l, g.sm_count());
    let plan = Plan::Sm90W4(split.map_or(d, |s| d.with_split_k(s)));
    gemm_on(g, a, b, dtype, |_, _| Ok(plan))
}

/// A random pair of FP8 pair `which` through the FP8-MMA kernel against the CPU reference. Tolerance:
/// every weight value is folded into e4m3 exactly and every activation is its e4m3 code, so the
/// products are exact and the only error is the FP8 tensor cores' accumulation within each
/// 128-K stage ([`fp8_accumulation_slack`], as the FP8 block-wise kernel's), then fp32.
fn check_fp8(
    which: usize,
    (m, n, k, l): (usize, usize, usize, usize),
    dtype: OutType,
    seed: u64,
    split: Option<u32>,
) -> Result<(), String> {
    let (ra, rb) = FP8_PAIRS[which];
    let (a, b) = if seed % 2 == 1 {
        random_weight_pair(seed, (m, n, k, l), ra.a(), rb.b())
    } else {
        random_pair(seed, (m, n, k, l), ra.a(), rb.b())
    };
    let (want, abs) = reference_output(&a, &b, dtype)?;
    let got = run_fp8(&a, &b, dtype, split)?;
    compare_outputs(&got, &want, 1.0, &fp8_accumulation_slack(&abs)).map_err(|e| {
        format!(
            "sm90 W4 fp8, split {split:?}, {ra} × {rb} {m}x{n}x{k}x{l} {dtype:?} seed {seed}: {e}"
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    #[ignore = "needs a CUDA device"]
    fn w4_fp8_kernel_matches_cpu_reference_on_random_ragged_shapes(
        which in 0usize..2,
        m in 1usize..300,
        n in 1usize..600,
        k128 in 1usize..12,
        l in 1usize..4,
        out_i in 0usize..3,
        split in 1u32..5,
        seed in any::<u64>(),
    ) {
        let dtype = [OutType::Bf16, OutType::F16, OutType::F32][out_i];
        let k = 128 * k128;
        check_fp8(which, (m, n, k, l), dtype, seed, Some(split.min(k128 as u32)))
            .map_err(TestCaseError::fail)?;
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn w4a8_with_e8m0_scales_plans_fp8_mmas_and_refuses_what_they_cannot_run() {
    let g = gpu();
    let up = |r: Recipe, rows, k, as_b| uploaded(g, r, (rows, k), as_b);
    let (mx, nv) = (
        Recipe::W4A8(Fp4Weights::Mxfp4),
        Recipe::W4A8(Fp4Weights::Nvfp4),
    );
    // (One activation tile: past it the weights fold onto the FP8 kernel.)
    let plan = g
        .plan(&up(mx, 128, 256, false), &up(mx, 512, 256, true))
        .unwrap();
    assert!(
        matches!(plan, Plan::Sm90W4(c) if c.fp8 && c.tile.n == 128),
        "{plan:?}"
    );
    // ue4m3 scales do not fold; K = 96 is no whole stage: the bf16 path.
    let plan = g
        .plan(&up(nv, 200, 256, false), &up(nv, 512, 256, true))
        .unwrap();
    assert!(matches!(plan, Plan::Sm90W4(c) if !c.fp8), "{plan:?}");
    let plan = g
        .plan(&up(mx, 200, 96, false), &up(mx, 512, 96, true))
        .unwrap();
    assert!(matches!(plan, Plan::Sm90W4(c) if !c.fp8), "{plan:?}");
    // Forced onto pairs and shapes it does not take: typed errors.
    let d = blockscaled::plan::sm90_w4_fp8_default(200, 512, 256, 1, g.sm_count());
    let (a, b) = random_pair(6, (200, 512, 256, 1), nv.a(), nv.b());
    let e = gemm_on(g, &a, &b, OutType::Bf16, |_, _| Ok(Plan::Sm90W4(d))).unwrap_err();
    assert!(e.contains("e8m0"), "{e}");
    let (a, b) = random_pair(7, (200, 512, 96, 1), mx.a(), mx.b());
    let e = gemm_on(g, &a, &b, OutType::Bf16, |_, _| Ok(Plan::Sm90W4(d))).unwrap_err();
    assert!(e.contains("multiple of 128"), "{e}");
    let (a, b) = random_pair(8, (200, 512, 256, 1), mx.a(), mx.b());
    let e = gemm_on(g, &a, &b, OutType::Bf16, |_, _| {
        Ok(Plan::Sm90W4(d.with_tile(Sm90W4Tile::N16)))
    })
    .unwrap_err();
    assert!(e.contains("tile of 16"), "{e}");
}

/// Rows whose 128-K blocks each hold one block of zeros with a scale 13, 25 or 40 binades above
/// the rest: the rest lie one, two or three passes below the first (their row's top is the zero
/// block's scale), so their columns of C come from the further passes alone, and must match.
#[test]
#[ignore = "needs a CUDA device"]
fn fp8_w4a8_takes_blocks_far_below_their_rows_top_in_further_passes() {
    for (which, (ra, rb)) in FP8_PAIRS.into_iter().enumerate() {
        let (m, n, k) = (40, 300, 512);
        let seed = 0xFA55 + which as u64 + blockscaled_tests::run_seed();
        let (a, b) = random_pair(seed, (m, n, k, 1), ra.a(), rb.b());
        let d = b.desc();
        let (_, bk) = d.block_extent();
        let b = edited(&b, |data, scales| {
            for r in (0..n).step_by(3) {
                let up = [13u8, 25, 40][r % 3];
                for block in (0..k).step_by(128) {
                    // The block's first scale block: zero codes, its scale far above the others'.
                    let top = (0..128 / bk)
                        .map(|i| scales[d.scale_layout.index(0, r, (block + i * bk) / bk)])
                        .max()
                        .unwrap();
                    scales[d.scale_layout.index(0, r, block / bk)] = top + up;
                    let at = (r * k + block) / 2;
                    data[at..at + bk / 2].fill(0);
                }
            }
        });
        let (want, abs) = reference_output(&a, &b, OutType::F32).unwrap();
        let got = run_fp8(&a, &b, OutType::F32, None).unwrap();
        compare_outputs(&got, &want, 1.0, &fp8_accumulation_slack(&abs))
            .unwrap_or_else(|e| panic!("{rb}: {e}"));
        // The edited columns are not zero: the further passes were taken.
        let live = (0..m).any(|i| got.values[i * n + 3] != 0.0);
        assert!(live, "{rb}: column 3 is all zeros");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn fp8_w4a8_nan_weight_scales_and_nan_activations_give_nan_columns_and_rows() {
    for (ra, rb) in FP8_PAIRS {
        let (m, n, k) = (20, 300, 256);
        let (_, a) = random_matrix(41, m, k, 1, ra.a());
        let (_, b) = random_matrix(42, n, k, 1, rb.b());
        let b_nan = edited(&b, |_, s| {
            let d = b.desc();
            let (br, bk) = d.block_extent();
            s[d.scale_layout.index(0, 201 / br, 100 / bk)] = 0xFF;
        });
        check_nan_line(&a, &b_nan, 201, true, On::Fp8);
        let a_nan = edited(&a, |d, _| d[7 * k + 150] = 0x7F);
        check_nan_line(&a_nan, &b, 7, false, On::Fp8);
    }
}

/// e2m1 activations folded per call (stream kernel at 13 rows, FP8 MMAs at 40): a NaN weight
/// scale makes its column of C NaN, a NaN activation scale (whose block the fold makes NaN) its
/// row; every other element matches.
#[test]
#[ignore = "needs a CUDA device"]
fn w4a4_nan_weight_and_activation_scales_give_nan_columns_and_rows() {
    for r in W4A4_RECIPES {
        for (m, on) in [(13, On::FoldedA(Some(256))), (40, On::FoldedA(None))] {
            let (n, k) = (300, 256);
            let (_, a) = random_matrix(51, m, k, 1, r.a());
            let (_, b) = random_matrix(52, n, k, 1, r.b());
            let nan_scale = |mat: &ScaledMatrix, row: usize, col: usize| {
                edited(mat, |_, s| {
                    let d = mat.desc();
                    let (br, bk) = d.block_extent();
                    s[d.scale_layout.index(0, row / br, col / bk)] = 0xFF;
                })
            };
            check_nan_line(&a, &nan_scale(&b, 201, 100), 201, true, on);
            check_nan_line(&nan_scale(&a, 7, 150), &b, 7, false, on);
        }
    }
}

/// No systematic error on the FP8-MMA kernel: within the FP8 tensor cores' bound
/// ([`blockscaled_tests::NoCancellation::FP8`]); each check fails a planted 0.5% error.
#[test]
#[ignore = "needs a CUDA device"]
fn fp8_w4a8_has_no_systematic_error_on_operands_that_do_not_cancel() {
    use blockscaled_tests::{NoCancellation, as_they_are, no_cancellation_gemm, run_seed};
    let (g, seed, k) = (gpu(), run_seed(), 1024);
    for (i, (ra, rb)) in FP8_PAIRS.into_iter().enumerate() {
        let plan = |da: &blockscaled::DeviceMatrix, db: &blockscaled::DeviceMatrix| {
            let (a, b) = (da.desc(), db.desc());
            let cfg = blockscaled::plan::sm90_w4_fp8_default(a.rows, b.rows, k, 2, g.sm_count());
            Ok(Plan::Sm90W4(cfg))
        };
        let (rel, mean) = no_cancellation_gemm(
            g,
            (200, 264 + 8 * i, k, 2),
            (ra.a(), rb.b()),
            seed + i as u64,
            NoCancellation::FP8,
            plan,
            as_they_are,
        )
        .unwrap_or_else(|e| panic!("4-bit weights on FP8 MMAs, {rb}: {e}"));
        eprintln!(
            "4-bit weights on FP8 MMAs, {rb}: largest relative error {rel:.2e}, mean {mean:.2e}"
        );
    }
}
