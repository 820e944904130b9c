//! GPU tests: the reference kernel against the CPU reference, every recipe, random shapes
//! (ragged ones included), every output type, outputs poisoned before each launch.
//! Run on a machine with an H100: `cargo test -p blockscaled-tests --test gpu -- --include-ignored`
//! (or the staged binary, see README).

use std::sync::OnceLock;

use blockscaled::{
    ClusterShape, Error, Fp8, GemmShape, Gpu, OutType, Plan, Recipe, Sm90Config, Sm90Tile,
    reference,
};
use blockscaled_tests::{
    NoCancellation, abs_matrix, as_they_are, compare_outputs, fp8_accumulation_slack, gemm_on,
    no_cancellation_gemm, random_matrix, random_pair, reference_output,
};
use proptest::prelude::*;

fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| Gpu::new(0).expect("a CUDA device (these tests are ignored without one)"))
}

/// GPU reference vs CPU reference: both accumulate exact products in float64, in different orders,
/// so before rounding they differ by at most `reference::sum_error_bound` (which matters only for
/// near-cancelling sums); both round the same way (f64 → f32 → output, nearest even).
fn check(
    recipe: Recipe,
    m: usize,
    n: usize,
    k: usize,
    l: usize,
    dtype: OutType,
    seed: u64,
) -> Result<(), String> {
    let g = gpu();
    let (_, a) = random_matrix(seed, m, k, l, recipe.a());
    let (_, b) = random_matrix(seed.wrapping_mul(31).wrapping_add(7), n, k, l, recipe.b());
    let (want, slack) = reference::gemm(&a, &b, dtype).map_err(|e| e.to_string())?;
    let (da, db) = (
        g.upload(&a).map_err(|e| e.to_string())?,
        g.upload(&b).map_err(|e| e.to_string())?,
    );
    let mut c = g.output(m, n, l, dtype).map_err(|e| e.to_string())?; // poisoned with NaN
    g.reference_gemm(&da, &db, &mut c)
        .map_err(|e| e.to_string())?;
    let got = c.to_host().map_err(|e| e.to_string())?;
    compare_outputs(&got, &want, 1.0, &slack)
        .map_err(|e| format!("{recipe} {m}x{n}x{k}x{l} {dtype:?} seed {seed}: {e}"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    #[ignore = "needs a CUDA device"]
    fn gpu_reference_matches_cpu_reference_on_random_shapes(
        recipe_i in 0..Recipe::ALL.len(),
        m in 1usize..300,
        n in 1usize..300,
        k in 1usize..800,
        l in 1usize..9,
        out_i in 0usize..3,
        seed in any::<u64>(),
    ) {
        let dtype = [OutType::Bf16, OutType::F16, OutType::F32][out_i];
        let recipe = Recipe::ALL[recipe_i];
        // Odd K for the FP8 formats; e2m1 packs two elements per byte along K, so K is even there.
        let e2m1 = [recipe.a(), recipe.b()].iter().any(|f| f.elem == blockscaled::ElemType::E2M1);
        let k = if e2m1 { k.next_multiple_of(2) } else { k };
        check(recipe, m, n, k, l, dtype, seed).map_err(TestCaseError::fail)?;
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn gpu_reference_matches_cpu_reference_for_every_recipe_on_a_ragged_larger_shape() {
    for (i, r) in Recipe::ALL.into_iter().enumerate() {
        check(
            r,
            1000,
            777,
            1040,
            1,
            OutType::Bf16,
            0xC0FFEE + i as u64 * 1_000_003 + blockscaled_tests::run_seed(),
        )
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
    let (da, db, dbok) = (
        g.upload(&a).unwrap(),
        g.upload(&b).unwrap(),
        g.upload(&b_ok).unwrap(),
    );
    let mut c = g.output(64, 32, 1, OutType::Bf16).unwrap();
    assert!(matches!(g.gemm(&da, &db, &mut c), Err(Error::Shape(_))));
    let mut wrong = g.output(64, 33, 1, OutType::Bf16).unwrap();
    assert!(matches!(
        g.gemm(&da, &dbok, &mut wrong),
        Err(Error::Shape(_))
    ));
    assert!(g.gemm(&da, &dbok, &mut c).is_ok());
    assert!(matches!(
        g.output(0, 3, 1, OutType::F32),
        Err(Error::Shape(_))
    ));
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
        Err(e) => assert!(
            matches!(e, Error::NoDevice(_)),
            "expected NoDevice, got {e}"
        ),
    }
}

/// A and B in one recipe's formats, or A in the first recipe's A format and B in the second's B
/// format (e4m3 · e5m2 and the reverse).
trait Recipes {
    fn pair(self) -> (Recipe, Recipe);
}

impl Recipes for Recipe {
    fn pair(self) -> (Recipe, Recipe) {
        (self, self)
    }
}

impl Recipes for (Recipe, Recipe) {
    fn pair(self) -> (Recipe, Recipe) {
        self
    }
}

/// A forced configuration: ((block_m, block_n), (cluster_m, cluster_n), split_k).
type Force = ((u32, u32), (u32, u32), u32);

/// The sm90 tile of `block_m` × `block_n`.
fn sm90_tile(block_m: u32, block_n: u32) -> Sm90Tile {
    Sm90Tile::ALL
        .into_iter()
        .find(|t| (t.block_m(), t.block_n) == (block_m, block_n))
        .unwrap_or_else(|| panic!("no sm90 tile of {block_m} × {block_n}"))
}

/// The sm90 plan `gemm` would run for these operands, with `force`'s tile, cluster and split in
/// place of the chosen ones (the default band, within the forced tile's units).
fn sm90_plan(
    da: &blockscaled::DeviceMatrix,
    db: &blockscaled::DeviceMatrix,
    force: Option<Force>,
) -> Result<Plan, String> {
    let shape = GemmShape::of(da.desc(), db.desc()).map_err(|e| e.to_string())?;
    match (gpu().plan(da, db).map_err(|e| e.to_string())?, force) {
        (Plan::Sm90Fp8(cfg), Some(((block_m, block_n), (cluster_m, cluster_n), split_k))) => {
            let cfg = cfg.with_tile_for(sm90_tile(block_m, block_n), &shape);
            let cluster = ClusterShape {
                m: cluster_m,
                n: cluster_n,
            };
            let units = Sm90Config::units(cfg.tile, cluster, &shape).0 as u32;
            Ok(Plan::Sm90Fp8(
                cfg.with_cluster(cluster)
                    .with_group_m(cfg.group_m.min(units))
                    .with_split_k(split_k),
            ))
        }
        (p @ Plan::Sm90Fp8(_), None) => Ok(p),
        (p, _) => Err(format!("expected the sm90 kernel, the plan is {p:?}")),
    }
}

/// The Hopper FP8 kernel against the CPU reference (float64), every element, with the FP8
/// accumulation tolerance of `fp8_accumulation_slack` plus one unit of the output type.
#[allow(clippy::too_many_arguments)]
fn check_sm90(
    recipes: impl Recipes,
    m: usize,
    n: usize,
    k: usize,
    l: usize,
    dtype: OutType,
    seed: u64,
    force: Option<Force>,
) -> Result<(), String> {
    let (ra, rb) = recipes.pair();
    let recipe = if ra == rb {
        ra.to_string()
    } else {
        format!("{ra} · {rb}")
    };
    let g = gpu();
    let (a, b) = random_pair(seed, (m, n, k, l), ra.a(), rb.b());
    let (want, abs) = reference_output(&a, &b, dtype)?;
    let got = gemm_on(g, &a, &b, dtype, |da, db| {
        sm90_plan(da, db, force).map_err(|e| format!("{recipe}: {e}"))
    })?;
    compare_outputs(&got, &want, 1.0, &fp8_accumulation_slack(&abs))
        .map_err(|e| format!("sm90 {recipe} {m}x{n}x{k}x{l} {dtype:?} seed {seed}: {e}"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    #[ignore = "needs a CUDA device"]
    fn sm90_kernel_matches_cpu_reference_on_random_ragged_shapes(
        which in 0usize..7,
        m in 1usize..400,
        n in 1usize..400,
        kb in 1usize..9,
        l in 1usize..9,
        out_i in 0usize..3,
        cluster in 0u32..3,
        tile in 0usize..10,
        split in 1u32..5,
        n_mult_8 in any::<bool>(),
        seed in any::<u64>(),
    ) {
        // N % 8 == 0 with 16-bit output goes through the TMA-store epilogue, else direct stores.
        let n = if n_mult_8 { n.next_multiple_of(8) } else { n };
        // DeepSeek, per-tensor e4m3, per-tensor e5m2, the two mixes, per-row e4m3 and e5m2 (B per
        // row: per-column scales in the epilogue).
        let (e4, e5) = (Recipe::Fp8PerTensor(Fp8::E4M3), Recipe::Fp8PerTensor(Fp8::E5M2));
        let (r4, r5) = (Recipe::Fp8PerRow(Fp8::E4M3), Recipe::Fp8PerRow(Fp8::E5M2));
        let recipes = [
            (Recipe::DeepSeekFp8, Recipe::DeepSeekFp8),
            (e4, e4),
            (e5, e5),
            (e4, e5),
            (e5, e4),
            (r4, r4),
            (r5, r5),
        ][which];
        let dtype = [OutType::Bf16, OutType::F16, OutType::F32][out_i];
        let tile = [
            (128, 128),
            (192, 128),
            (256, 128),
            (128, 64),
            (16, 128),
            (32, 128),
            (64, 128),
            (128, 144),
            (128, 160),
            (128, 192),
        ][tile];
        // None, along M, or along N (64-column tiles: no pairs along M, which share B in halves;
        // swapped tiles run alone).
        let cluster = match [(1, 1), (2, 1), (1, 2)][cluster as usize] {
            _ if tile.0 < 128 => (1, 1),
            (2, 1) if tile.1 == 64 => (1, 2),
            c => c,
        };
        // Split-K (f32 workspace and reduction) with up to as many ranges as K blocks.
        let split = split.min(kb as u32);
        check_sm90(recipes, m, n, 128 * kb, l, dtype, seed, Some((tile, cluster, split)))
            .map_err(TestCaseError::fail)?;
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn sm90_kernel_matches_cpu_reference_on_larger_ragged_shapes() {
    let seed = blockscaled_tests::run_seed();
    // Every tile and cluster, unsplit (split-K comes below).
    for force in SM90_FORCES.into_iter().filter(|f| f.2 == 1) {
        check_sm90(
            Recipe::DeepSeekFp8,
            1111,
            2000,
            2048,
            1,
            OutType::Bf16,
            seed,
            Some(force),
        )
        .unwrap();
        check_sm90(
            Recipe::DeepSeekFp8,
            300,
            7168,
            512,
            2,
            OutType::F32,
            seed + 1,
            Some(force),
        )
        .unwrap();
    }
    // f16 through the TMA-store epilogue with ragged M and a partial last 64-column box.
    for force in [
        ((128, 128), (1, 1), 1),
        ((192, 128), (2, 1), 1),
        ((256, 128), (2, 1), 1),
        ((256, 128), (1, 2), 1),
        ((128, 64), (1, 1), 1),
        ((32, 128), (1, 1), 1),
    ] {
        check_sm90(
            Recipe::DeepSeekFp8,
            333,
            1000,
            384,
            2,
            OutType::F16,
            seed + 2,
            Some(force),
        )
        .unwrap();
    }
    // Split-K (f32 workspace + reduction) in every output type, uneven ranges (K blocks not a
    // multiple of the split), with clusters, and the heuristic's own choice at M = 128.
    for (m, n, kb, l, dtype, force) in [
        (100, 300, 10, 2, OutType::Bf16, ((128, 128), (1, 1), 3)),
        (77, 136, 5, 1, OutType::F32, ((256, 128), (2, 1), 5)),
        (130, 1000, 9, 1, OutType::F16, ((128, 128), (2, 1), 4)),
        (200, 520, 7, 1, OutType::Bf16, ((192, 128), (2, 1), 3)),
        (128, 1000, 16, 1, OutType::Bf16, ((128, 128), (1, 2), 2)),
        (128, 1000, 9, 1, OutType::F32, ((128, 64), (1, 1), 2)),
        // 64-column tiles in pairs along N, 3 N tiles: the second pair's second CTA is past N.
        (100, 150, 3, 1, OutType::Bf16, ((128, 64), (1, 2), 1)),
        // M·N odd: the reduction's element-by-element path (else it reads float4s).
        (77, 135, 5, 2, OutType::F16, ((128, 128), (1, 1), 2)),
        // Along N with an odd number of N tiles: the last pair's second CTA is past N.
        (300, 300, 6, 2, OutType::Bf16, ((256, 128), (1, 2), 3)),
        (257, 1100, 4, 1, OutType::Bf16, ((256, 128), (1, 2), 1)),
        // Swapped tiles: split with uneven ranges, M·N odd, several A tiles.
        (9, 300, 10, 2, OutType::Bf16, ((16, 128), (1, 1), 3)),
        (33, 135, 5, 1, OutType::F16, ((64, 128), (1, 1), 2)),
        (100, 520, 7, 1, OutType::F32, ((32, 128), (1, 1), 4)),
    ] {
        check_sm90(
            Recipe::DeepSeekFp8,
            m,
            n,
            128 * kb,
            l,
            dtype,
            seed + 3,
            Some(force),
        )
        .unwrap();
    }
    // e5m2 and per-column scales on the larger shapes: pairs along N, split-K (the column scales
    // multiply each partial sum), f32 output with N odd, and e5m2 A with DeepSeek's e4m3 B.
    check_sm90(
        Recipe::Fp8PerRow(Fp8::E5M2),
        300,
        1000,
        1024,
        2,
        OutType::Bf16,
        seed + 5,
        Some(((256, 128), (1, 2), 1)),
    )
    .unwrap();
    check_sm90(
        Recipe::Fp8PerRow(Fp8::E4M3),
        130,
        777,
        1280,
        1,
        OutType::F32,
        seed + 6,
        Some(((128, 128), (1, 1), 3)),
    )
    .unwrap();
    check_sm90(
        (Recipe::Fp8PerTensor(Fp8::E5M2), Recipe::DeepSeekFp8),
        1000,
        520,
        2048,
        1,
        OutType::F16,
        seed + 7,
        Some(((256, 128), (2, 1), 1)),
    )
    .unwrap();
    let g = gpu();
    let (da, db) = (
        g.upload(&random_matrix(seed, 128, 7168, 1, Recipe::DeepSeekFp8.a()).1)
            .unwrap(),
        g.upload(&random_matrix(seed, 2112, 7168, 1, Recipe::DeepSeekFp8.b()).1)
            .unwrap(),
    );
    assert!(matches!(g.plan(&da, &db).unwrap(), Plan::Sm90Fp8(c) if c.split_k > 1));
    check_sm90(
        Recipe::DeepSeekFp8,
        128,
        2112,
        7168,
        1,
        OutType::Bf16,
        seed + 4,
        None,
    )
    .unwrap();
    // What `gemm` chooses by itself.
    check_sm90(
        Recipe::DeepSeekFp8,
        2048,
        2048,
        1024,
        1,
        OutType::Bf16,
        seed + 2,
        None,
    )
    .unwrap();
}

/// Decode sizes: what `gemm` chooses by itself at M ≤ 64 (the swapped tiles, split-K as the
/// plan decides; from 33 rows only with K ≥ 1024) and past 64 rows where swapped tiles share B
/// (128 × 576 × 7168) on DeepSeek-V3's shapes and ragged ones, every recipe of the sm90 kernel.
#[test]
#[ignore = "needs a CUDA device"]
fn sm90_decode_sizes_take_swapped_tiles_and_match_cpu_reference() {
    let seed = blockscaled_tests::run_seed();
    let g = gpu();
    let (e4, e5) = (
        Recipe::Fp8PerTensor(Fp8::E4M3),
        Recipe::Fp8PerTensor(Fp8::E5M2),
    );
    let r5 = Recipe::Fp8PerRow(Fp8::E5M2);
    for (i, (m, n, k, l, dtype)) in [
        (1, 7168, 16384, 1, OutType::Bf16),
        (16, 2112, 7168, 1, OutType::Bf16),
        (8, 4096, 7168, 1, OutType::F16),
        (32, 7168, 2048, 1, OutType::Bf16),
        (64, 24576, 1536, 1, OutType::Bf16),
        (17, 1000, 1280, 3, OutType::F32),
        (63, 777, 640, 2, OutType::Bf16),
        (48, 1000, 4096, 2, OutType::Bf16),
        (64, 576, 7168, 1, OutType::Bf16),
        (128, 576, 7168, 1, OutType::Bf16),
        (100, 500, 2048, 1, OutType::F16),
    ]
    .into_iter()
    .enumerate()
    {
        let (_, a) = random_matrix(seed + i as u64, m, k, l, Recipe::DeepSeekFp8.a());
        let (_, b) = random_matrix(seed ^ i as u64, n, k, l, Recipe::DeepSeekFp8.b());
        let (da, db) = (g.upload(&a).unwrap(), g.upload(&b).unwrap());
        let plan = g.plan(&da, &db).unwrap();
        // (The decode rule: swapped tiles to 32 rows, and to 64 rows from K = 1024; a tile of
        // fewer rows than M only with its units in one round of the SMs.)
        // Past 64 rows either, as the model weighs them (swapped at 128 × 576 × 7168).
        let swapped = match m {
            ..=64 => Some(m <= 32 || k >= 1024),
            _ => (n == 576).then_some(true),
        };
        let sms = g.sm_count() as usize;
        assert!(
            matches!(plan, Plan::Sm90Fp8(c)
                if swapped.is_none_or(|s| c.tile.is_swapped() == s)
                    && (!c.tile.is_swapped()
                        || c.tile.block_m() as usize >= m
                        || m.div_ceil(c.tile.block_m() as usize) * n.div_ceil(128) * l
                            * c.split_k as usize
                            <= sms)),
            "{m}×{n}×{k}: {plan:?}"
        );
        check_sm90(
            Recipe::DeepSeekFp8,
            m,
            n,
            k,
            l,
            dtype,
            seed + i as u64,
            None,
        )
        .unwrap();
    }
    for (i, recipes) in [(e5, e5), (e4, e5), (e5, e4), (r5, r5)]
        .into_iter()
        .enumerate()
    {
        check_sm90(
            recipes,
            5 + 20 * i,
            1000,
            1024,
            2,
            OutType::Bf16,
            seed + 9,
            None,
        )
        .unwrap();
    }
}

/// Large shapes against the GPU reference kernel; Σ|a·b| comes from the reference kernel run on
/// the sign-cleared operands.
#[test]
#[ignore = "needs a CUDA device"]
fn sm90_kernel_matches_gpu_reference_on_large_shapes() {
    let g = gpu();
    for (i, &(m, n, k)) in [
        (4096usize, 7168usize, 2048usize),
        (8192, 8192, 1024),
        (4095, 2112, 7168),
    ]
    .iter()
    .enumerate()
    {
        let seed = 77 + i as u64 + blockscaled_tests::run_seed();
        let r = Recipe::DeepSeekFp8;
        let (_, a) = random_matrix(seed, m, k, 1, r.a());
        let (_, b) = random_matrix(seed ^ 0xABCDEF, n, k, 1, r.b());
        let run =
            |a: &blockscaled::ScaledMatrix, b: &blockscaled::ScaledMatrix, reference: bool| {
                let (da, db) = (g.upload(a).unwrap(), g.upload(b).unwrap());
                let mut c = g.output(m, n, 1, OutType::F32).unwrap();
                if reference {
                    g.reference_gemm(&da, &db, &mut c).unwrap()
                } else {
                    g.gemm(&da, &db, &mut c).unwrap()
                }
                c.to_host().unwrap()
            };
        let want = run(&a, &b, true);
        let abs = run(&abs_matrix(&a), &abs_matrix(&b), true);
        let got = run(&a, &b, false);
        let abs: Vec<f64> = abs.values.iter().map(|&v| v as f64).collect();
        compare_outputs(&got, &want, 1.0, &fp8_accumulation_slack(&abs))
            .unwrap_or_else(|e| panic!("{m}x{n}x{k}: {e}"));
        let worst = got
            .values
            .iter()
            .zip(&want.values)
            .zip(&abs)
            .map(|((g, w), s)| ((g - w).abs() as f64) / s.max(1e-30))
            .fold(0.0, f64::max);
        eprintln!(
            "sm90 {m}x{n}x{k}: max |err| / Σ|ab| = {worst:.3e} (tolerance {:.3e})",
            blockscaled_tests::FP8_ACCUMULATION_REL
        );
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn plans_follow_the_formats_and_k_not_multiple_of_128_is_an_error() {
    let g = gpu();
    let up = |r: Recipe, rows, k, as_b: bool| {
        let (_, m) = random_matrix(5, rows, k, 1, if as_b { r.b() } else { r.a() });
        g.upload(&m).unwrap()
    };
    let ds = Recipe::DeepSeekFp8;
    assert!(matches!(
        g.plan(&up(ds, 64, 256, false), &up(ds, 64, 256, true))
            .unwrap(),
        Plan::Sm90Fp8(_)
    ));
    let mx = Recipe::Mxfp8(Fp8::E4M3);
    assert!(matches!(
        g.plan(&up(mx, 64, 256, false), &up(mx, 64, 256, true))
            .unwrap(),
        Plan::Sm90Mx(_)
    ));
    // DeepSeek scales with K = 320: a clear error from gemm(), the reference kernel still works.
    let (a, b) = (up(ds, 64, 320, false), up(ds, 64, 320, true));
    assert!(matches!(g.plan(&a, &b), Err(Error::Shape(_))));
    let mut c = g.output(64, 64, 1, OutType::Bf16).unwrap();
    assert!(matches!(g.gemm(&a, &b, &mut c), Err(Error::Shape(_))));
    assert!(g.reference_gemm(&a, &b, &mut c).is_ok());
    // Per-row B scales (per column of C) run on the sm90 kernel, e4m3 and e5m2.
    for fp8 in [Fp8::E4M3, Fp8::E5M2] {
        let pr = Recipe::Fp8PerRow(fp8);
        let (a, b) = (up(pr, 64, 256, false), up(pr, 64, 256, true));
        assert!(matches!(g.plan(&a, &b).unwrap(), Plan::Sm90Fp8(_)));
    }
    // B with scales per row per 128 of K (DeepSeek's A layout) is neither: the reference kernel
    // runs it, and forcing the sm90 kernel is a format error.
    let (a, b) = (
        up(ds, 64, 256, false),
        g.upload(&random_matrix(6, 64, 256, 1, ds.a()).1).unwrap(),
    );
    let forced = Sm90Config::new(
        Sm90Tile::M128,
        ClusterShape { m: 1, n: 1 },
        1,
        g.sm_count(),
        1,
    );
    assert!(matches!(
        g.gemm_with(&a, &b, &mut c, Plan::Sm90Fp8(forced)),
        Err(Error::Format(_))
    ));
    assert_eq!(g.plan(&a, &b).unwrap(), Plan::Reference);
    // A tile the kernel is not built for (320 rows: five consumers) is a configuration error.
    let ds = Recipe::DeepSeekFp8;
    let (a, b) = (up(ds, 64, 256, false), up(ds, 64, 256, true));
    let tile = forced.with_tile(Sm90Tile::new(5, 1, 128));
    assert!(matches!(
        g.gemm_with(&a, &b, &mut c, Plan::Sm90Fp8(tile)),
        Err(Error::Config(_))
    ));
    // No clusters larger than 2, none of 0, no pairs along M of 64-column tiles (B would be
    // shared in 32-row halves), no CTAs, and no more K ranges than K blocks.
    for (tile, (m, n), ctas, split_k) in [
        (Sm90Tile::M256, (2, 2), 1, 1),
        (Sm90Tile::M256, (1, 3), 1, 1),
        (Sm90Tile::M256, (0, 1), 1, 1),
        (Sm90Tile::M128N64, (2, 1), 1, 1),
        (Sm90Tile::M128, (1, 1), 0, 1),
        (Sm90Tile::M128, (1, 1), 1, 0),
        (Sm90Tile::M128, (1, 1), 1, 3),
    ] {
        let bad = forced
            .with_tile(tile)
            .with_cluster(ClusterShape { m, n })
            .with_ctas(ctas)
            .with_split_k(split_k);
        assert!(matches!(
            g.gemm_with(&a, &b, &mut c, Plan::Sm90Fp8(bad)),
            Err(Error::Config(_))
        ));
    }
}

/// A scheduler band (`group_m`) of 2³¹ M tiles over 2 N tiles wraps the kernel's 32-bit
/// `group_m · n_tiles` to 0; 0 itself, and bands past M, are configuration errors too.
#[test]
#[ignore = "needs a CUDA device"]
fn group_m_that_does_not_fit_the_shape_is_a_config_error() {
    let g = gpu();
    let ds = Recipe::DeepSeekFp8;
    let a = g.upload(&random_matrix(8, 256, 256, 1, ds.a()).1).unwrap();
    let b = g.upload(&random_matrix(9, 256, 256, 1, ds.b()).1).unwrap();
    let mut c = g.output(256, 256, 1, OutType::Bf16).unwrap();
    let Plan::Sm90Fp8(cfg) = g.plan(&a, &b).unwrap() else {
        panic!("256×256×256 DeepSeek runs on the sm90 kernel")
    };
    assert_eq!(cfg.cluster.m, 1);
    let m_units = 256u32.div_ceil(cfg.tile.block_m());
    for group_m in [1 << 31, u32::MAX, 0, m_units + 1] {
        let r = g.gemm_with(&a, &b, &mut c, Plan::Sm90Fp8(cfg.with_group_m(group_m)));
        assert!(
            matches!(r, Err(Error::Config(_))),
            "group_m {group_m}: {r:?}"
        );
    }
    // The output was never written: still the poison pattern.
    assert!(c.to_host().unwrap().values.iter().all(|v| v.is_nan()));
    // Every band height from 1 to M's units runs.
    for group_m in 1..=m_units {
        let r = g.gemm_with(&a, &b, &mut c, Plan::Sm90Fp8(cfg.with_group_m(group_m)));
        assert!(r.is_ok(), "group_m {group_m}: {r:?}");
    }
    assert!(c.to_host().unwrap().values.iter().all(|v| v.is_finite()));
}

/// Two `Gpu`s on the same device: operands and outputs of one are rejected by the other.
#[test]
#[ignore = "needs a CUDA device"]
fn operands_and_outputs_of_another_gpu_are_rejected() {
    let (g1, g2) = (Gpu::new(0).unwrap(), Gpu::new(0).unwrap());
    let ds = Recipe::DeepSeekFp8;
    let (_, a) = random_matrix(10, 128, 256, 1, ds.a());
    let (_, b) = random_matrix(11, 128, 256, 1, ds.b());
    let (a1, b1, b2) = (
        g1.upload(&a).unwrap(),
        g1.upload(&b).unwrap(),
        g2.upload(&b).unwrap(),
    );
    let mut c1 = g1.output(128, 128, 1, OutType::Bf16).unwrap();
    let mut c2 = g2.output(128, 128, 1, OutType::Bf16).unwrap();
    let wrong = |r: blockscaled::Result<()>| assert!(matches!(r, Err(Error::WrongGpu(_))), "{r:?}");
    // Operands of g1 on g2; an output of g2 on g1; one operand of each.
    wrong(g2.gemm(&a1, &b1, &mut c2));
    wrong(g1.gemm(&a1, &b1, &mut c2));
    wrong(g1.gemm(&a1, &b2, &mut c1));
    wrong(g2.reference_gemm(&a1, &b1, &mut c2));
    let plan = g1.plan(&a1, &b1).unwrap();
    wrong(g2.gemm_with(&a1, &b1, &mut c2, plan));
    assert!(matches!(g2.plan(&a1, &b1), Err(Error::WrongGpu(_))));
    // Nothing was written; each GPU's own buffers still work.
    assert!(c2.to_host().unwrap().values.iter().all(|v| v.is_nan()));
    g1.gemm(&a1, &b1, &mut c1).unwrap();
    assert!(c1.to_host().unwrap().values.iter().all(|v| v.is_finite()));
}

/// Every entry point that takes device data refuses data of another context with
/// `Error::WrongGpu`: here a second, non-primary context on the same GPU, whose buffers the
/// first context's kernels would fault on (each context maps only its own), so a missing check
/// shows as a crash rather than passing quietly. Operands, outputs, epilogue tensors, groups,
/// block-sparse matrices, quantizer inputs and destinations, the fold, weight preparation, views
/// of the caller's memory, streams and workspaces; nothing is written, and each context's own
/// calls still run.
#[test]
#[ignore = "needs a CUDA device"]
fn every_entry_point_rejects_device_data_of_another_context() {
    use blockscaled::{
        BsrMatrix, Call, Epilogue, InputType, QuantizeOptions, SparseSide, Workspace,
    };
    let g1 = gpu();
    let ctx2 = cudarc::driver::CudaContext::new_non_primary(0, 0).unwrap();
    let g2 = Gpu::from_context(ctx2).unwrap();
    let (m, n, k) = (128, 256, 256);
    let ds = Recipe::DeepSeekFp8;
    let (_, a) = random_matrix(20, m, k, 1, ds.a());
    let (_, b) = random_matrix(21, n, k, 1, ds.b());
    let (_, experts) = random_matrix(22, n, k, 2, ds.b());
    let (_, mx) = random_matrix(23, n, k, 1, Recipe::Mxfp8(Fp8::E4M3).b());
    let (a1, b1, e1, mx1) = (
        g1.upload(&a).unwrap(),
        g1.upload(&b).unwrap(),
        g1.upload(&experts).unwrap(),
        g1.upload(&mx).unwrap(),
    );
    let (a2, b2) = (g2.upload(&a).unwrap(), g2.upload(&b).unwrap());
    let mut c1 = g1.output(m, n, 1, OutType::F32).unwrap();
    let mut c2 = g2.output(m, n, 1, OutType::F32).unwrap();
    let wrong = |what: &str, r: blockscaled::Result<()>| {
        assert!(matches!(r, Err(Error::WrongGpu(_))), "{what}: {r:?}")
    };
    // Operands and outputs.
    wrong("operands", g2.gemm(&a1, &b1, &mut c2));
    wrong("output", g1.gemm(&a1, &b1, &mut c1_of(&g2, m, n)));
    wrong("one operand of each", g1.gemm(&a1, &b2, &mut c1));
    wrong("reference", g2.reference_gemm(&a1, &b1, &mut c2));
    wrong("plan", g2.plan(&a1, &b1).map(|_| ()));
    // Epilogue tensors.
    let bias2 = g2.upload_tensor(&vec![1f32; n], 1, n, 1).unwrap();
    let epi = Epilogue::new().bias(&bias2);
    wrong("bias", g1.run(&Call::new(&a1, &b1).epilogue(&epi), &mut c1));
    let opts = QuantizeOptions::default();
    let q = g1.run_quantized_new(&Call::new(&a1, &b1).epilogue(&epi), ds.a(), &opts);
    wrong("bias, quantized output", q.map(|_| ()));
    // Groups and experts.
    let groups2 = g2.group_ends(&[64, 128]).unwrap();
    wrong("groups", g1.grouped_gemm(&a1, &e1, &groups2, &mut c1));
    // Block-sparse.
    let bsr = BsrMatrix::from_dense_blocks(&b, |_, _| true).unwrap();
    let s2 = g2.upload_bsr(&bsr).unwrap();
    wrong("sparse", g1.bsr_gemm(&a1, &s2, SparseSide::B, &mut c1));
    // Quantizers, the fold, weight preparation.
    let vals: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
    let (t1, t2) = (
        g1.upload_tensor(&vals, m, k, 1).unwrap(),
        g2.upload_tensor(&vals, m, k, 1).unwrap(),
    );
    wrong(
        "quantizer input",
        g1.quantize_with(&t2, ds.a(), &opts).map(|_| ()),
    );
    let mut q1 = g1.quantize_with(&t1, ds.a(), &opts).unwrap().matrix;
    wrong(
        "quantizer destination",
        g2.quantize_into(&t2, &mut q1, &opts),
    );
    wrong("fold", g2.fold_to_fp8(&mx1, true).map(|_| ()));
    wrong("weights", g2.prepare_weights(&b1));
    wrong(
        "output as tensor",
        g1.output_as_tensor(c1_of(&g2, m, n)).map(|_| ()),
    );
    // Views of memory of the other context, its stream, a workspace bound to it.
    let data2 = g2.stream().clone_htod(a.data()).unwrap();
    let scales2 = g2.stream().clone_htod(a.scales()).unwrap();
    wrong(
        "view",
        g1.matrix_view(*a.desc(), &data2, &scales2).map(|_| ()),
    );
    wrong(
        "tensor view",
        g1.tensor_view(&data2, InputType::Bf16, (m, k / 2, 1))
            .map(|_| ()),
    );
    wrong("stream", g1.with_stream(g2.stream().clone()).map(|_| ()));
    let ws = Workspace::new();
    g2.run(&Call::new(&a2, &b2).workspace(&ws), &mut c2)
        .unwrap();
    wrong(
        "workspace",
        g1.run(&Call::new(&a1, &b1).workspace(&ws), &mut c1),
    );
    // Nothing of g1's was written; each context's own calls run.
    assert!(c1.to_host().unwrap().values.iter().all(|v| v.is_nan()));
    g1.gemm(&a1, &b1, &mut c1).unwrap();
    assert!(c1.to_host().unwrap().values.iter().all(|v| v.is_finite()));
    assert!(c2.to_host().unwrap().values.iter().all(|v| v.is_finite()));
}

/// A fresh output of `g`.
fn c1_of(g: &Gpu, m: usize, n: usize) -> blockscaled::DeviceOutput<'static> {
    g.output(m, n, 1, OutType::F32).unwrap()
}

/// Every tile × cluster of the sm90 kernel, alone and in pairs, with and without split-K.
const SM90_FORCES: [Force; 26] = [
    ((128, 128), (1, 1), 1),
    ((128, 128), (2, 1), 1),
    ((128, 128), (1, 2), 1),
    ((192, 128), (1, 1), 1),
    ((192, 128), (2, 1), 1),
    ((192, 128), (1, 2), 1),
    ((256, 128), (1, 1), 1),
    ((256, 128), (2, 1), 1),
    ((256, 128), (1, 2), 1),
    ((128, 64), (1, 1), 1),
    ((128, 64), (1, 2), 1),
    ((128, 144), (1, 1), 1),
    ((128, 144), (2, 1), 1),
    ((128, 160), (1, 1), 1),
    ((128, 160), (1, 2), 1),
    ((128, 192), (1, 1), 1),
    ((128, 192), (2, 1), 1),
    ((128, 128), (1, 1), 3),
    ((128, 160), (1, 1), 3),
    ((256, 128), (1, 2), 3),
    ((128, 64), (1, 1), 4),
    ((16, 128), (1, 1), 1),
    ((32, 128), (1, 1), 1),
    ((64, 128), (1, 1), 1),
    ((16, 128), (1, 1), 3),
    ((64, 128), (1, 1), 2),
];

/// Which kernel a check runs.
#[derive(Clone, Copy, Debug)]
enum Kernel {
    Reference,
    Sm90(Force),
}

/// A check that sees small systematic errors: A ≥ 0 and each row of B of one sign
/// (`no_cancellation_matrix`), so |C| = Σ|a·b| and the allowed error is a fraction of |C|
/// itself (with random signs Σ|a·b| is about √K·|C|: 2^-7·√K ≈ 66% of |C| at K = 7168, enough
/// to hide a wrong scale). On the sm90 kernel the error has a direction: the tensor core truncates
/// its partial sums toward zero, so |C| may come out up to `FP8_ACCUMULATION_REL`·|C| small but
/// above |C| only by the fp32 roundings of the promotions (K/128 FFMAs, 2^-24 each; 2^-16 of |C|
/// allowed), and truncation varies from element to element, so the mean deviation stays within
/// 2^-9 (a wrong scale or tensor scale moves every element, and the mean with them); the
/// reference kernel's float64 sums are within `sum_error_bound` either way. f32 output, so its
/// rounding (2^-24) hides nothing. Every element is compared; then the check proves its own
/// sensitivity: the same GPU output with a planted 0.5% error, up (× 1.005) and down (× 0.995),
/// must fail it. Returns the largest relative error and the mean deviation.
fn check_no_cancellation(
    recipes: impl Recipes,
    shape: (usize, usize, usize, usize),
    kernel: Kernel,
    seed: u64,
) -> Result<(f64, f64), String> {
    let (ra, rb) = recipes.pair();
    let k = shape.2;
    let (bounds, plan) = match kernel {
        // Float64 sums: the sum's own rounding on either side, the f32 output's in the mean.
        Kernel::Reference => {
            let r = blockscaled::reference::sum_error_bound(k, 1.0);
            let bounds = NoCancellation {
                below: r,
                above: r,
                mean: (-(2f64.powi(-20)), 2f64.powi(-16)),
            };
            (bounds, None)
        }
        Kernel::Sm90(force) => (NoCancellation::FP8, Some(force)),
    };
    no_cancellation_gemm(
        gpu(),
        shape,
        (ra.a(), rb.b()),
        seed,
        bounds,
        |da, db| match plan {
            Some(force) => sm90_plan(da, db, Some(force)),
            None => Ok(Plan::Reference),
        },
        as_they_are,
    )
    .map_err(|x| format!("{ra} · {rb} {kernel:?}: {x}"))
}

#[test]
#[ignore = "needs a CUDA device"]
fn sm90_kernel_has_no_systematic_error_on_operands_that_do_not_cancel() {
    let seed = blockscaled_tests::run_seed();
    let (e4, e5) = (
        Recipe::Fp8PerTensor(Fp8::E4M3),
        Recipe::Fp8PerTensor(Fp8::E5M2),
    );
    let (r4, r5) = (Recipe::Fp8PerRow(Fp8::E4M3), Recipe::Fp8PerRow(Fp8::E5M2));
    let (mut worst, mut mean) = (0f64, 0f64);
    for (i, force) in SM90_FORCES.into_iter().enumerate() {
        for (j, recipes) in [
            (Recipe::DeepSeekFp8, Recipe::DeepSeekFp8),
            (e4, e5),
            (e5, e4),
            (r4, r4),
            (r5, r5),
        ]
        .into_iter()
        .enumerate()
        {
            let shape = (300, 520, 128 * (6 + j), 1 + i % 2);
            let (rel, m) =
                check_no_cancellation(recipes, shape, Kernel::Sm90(force), seed + i as u64)
                    .unwrap();
            worst = worst.max(rel);
            mean = mean.min(m);
        }
    }
    // Allowed: FP8_ACCUMULATION_REL = 2^-7 = 7.8e-3 of |C| below, 2^-16 above; mean within 2^-9.
    eprintln!(
        "sm90, no cancellation: largest relative error {worst:.3e}, most negative mean {mean:.3e}"
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn reference_kernel_has_no_systematic_error_on_operands_that_do_not_cancel() {
    let seed = blockscaled_tests::run_seed();
    let mut worst = 0f64;
    for (i, r) in Recipe::ALL.into_iter().enumerate() {
        let (rel, _) =
            check_no_cancellation(r, (200, 136, 1024, 2), Kernel::Reference, seed + i as u64)
                .unwrap();
        worst = worst.max(rel);
    }
    eprintln!("reference kernel, no cancellation: largest relative error {worst:.3e}");
}

/// Split-K's workspace is reused from call to call: split GEMMs whose tile counts grow and
/// shrink (so each launch finds memory that launches of other sizes used) all match the CPU
/// reference, every element, on unswapped and swapped tiles.
#[test]
#[ignore = "needs a CUDA device"]
fn split_k_workspace_reused_across_shapes_keeps_every_result_right() {
    let seed = blockscaled_tests::run_seed();
    let runs: [(usize, usize, usize, Force); 6] = [
        (128, 256, 1024, ((128, 64), (1, 1), 4)),
        (300, 1000, 1024, ((128, 128), (1, 1), 3)),
        (16, 4096, 2048, ((16, 128), (1, 1), 4)),
        (128, 256, 1024, ((128, 64), (1, 1), 2)),
        (64, 7168, 1024, ((64, 128), (1, 1), 8)),
        (300, 1000, 1024, ((128, 128), (1, 1), 2)),
    ];
    for (i, (m, n, k, force)) in runs.into_iter().enumerate() {
        let r = Recipe::DeepSeekFp8;
        check_sm90(r, m, n, k, 1, OutType::Bf16, seed + i as u64, Some(force)).unwrap();
    }
}

/// Determinism, as promised (no atomics; split-K sums its partials in a fixed order): the same
/// inputs and plan give bitwise-identical outputs, run after run, for every tile, cluster and
/// split, and for the reference kernel.
#[test]
#[ignore = "needs a CUDA device"]
fn every_kernel_and_configuration_gives_bitwise_identical_outputs_across_runs() {
    let g = gpu();
    let seed = blockscaled_tests::run_seed();
    let (m, n, k, l) = (333, 520, 1152, 2);
    let (_, a) = random_matrix(seed, m, k, l, Recipe::DeepSeekFp8.a());
    let (_, b) = random_matrix(seed ^ 0x1234_5678, n, k, l, Recipe::DeepSeekFp8.b());
    let (da, db) = (g.upload(&a).unwrap(), g.upload(&b).unwrap());
    let bits = |plan: Option<Plan>, dtype: OutType| {
        let mut c = g.output(m, n, l, dtype).unwrap();
        match plan {
            Some(p) => g.gemm_with(&da, &db, &mut c, p).unwrap(),
            None => g.reference_gemm(&da, &db, &mut c).unwrap(),
        }
        let v = c.to_host().unwrap().values;
        assert!(
            v.iter().all(|x| !x.is_nan()),
            "{plan:?}: unwritten elements"
        );
        v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>()
    };
    let plans = std::iter::once(None)
        .chain(SM90_FORCES.map(|f| Some(sm90_plan(&da, &db, Some(f)).unwrap())));
    for plan in plans {
        for dtype in [OutType::F32, OutType::Bf16] {
            let first = bits(plan, dtype);
            for run in 1..3 {
                assert!(
                    bits(plan, dtype) == first,
                    "{plan:?} {dtype:?}: run {run} differs from run 0"
                );
            }
        }
    }
}

/// Scale layouts reach the kernels intact: the same values with their scales in other layouts —
/// packed K- or MN-major, padded with poisoned gaps (NaN codes that must never be read), the batch
/// index innermost, random affine layouts — give bitwise-identical results to the quantizer's own
/// layout, for every recipe, on the kernel `gemm` chooses (the sm90 kernel re-lays scales out at
/// upload, the reference kernel reads them in place) and on the reference kernel.
#[test]
#[ignore = "needs a CUDA device"]
fn every_scale_layout_gives_the_same_result_on_every_kernel() {
    use blockscaled_tests::layouts::{layout_variants, random_layout};
    let g = gpu();
    let seed = blockscaled_tests::run_seed();
    let (m, n, k, l) = (200, 136, 512, 2);
    for (i, r) in Recipe::ALL.into_iter().enumerate() {
        let s = seed + 100 * i as u64;
        let (_, a) = random_matrix(s, m, k, l, r.a());
        let (_, b) = random_matrix(s ^ 0xFACE, n, k, l, r.b());
        let run =
            |a: &blockscaled::ScaledMatrix, b: &blockscaled::ScaledMatrix, reference: bool| {
                let (da, db) = (g.upload(a).unwrap(), g.upload(b).unwrap());
                let mut c = g.output(m, n, l, OutType::F32).unwrap();
                if reference {
                    g.reference_gemm(&da, &db, &mut c).unwrap();
                } else {
                    g.gemm(&da, &db, &mut c).unwrap();
                }
                let v = c.to_host().unwrap().values;
                assert!(v.iter().all(|x| !x.is_nan()), "{r}: NaN in the result");
                v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>()
            };
        let mut variants: Vec<(String, _, _)> = layout_variants(&a)
            .into_iter()
            .zip(layout_variants(&b))
            .map(|((name, va), (_, vb))| (name.to_string(), va, vb))
            .collect();
        for j in 0..3 {
            let t = s + 7 * j;
            variants.push((
                format!("random layouts {t}"),
                random_layout(&a, t),
                random_layout(&b, t ^ 1),
            ));
        }
        for reference in [false, true] {
            let want = run(&a, &b, reference);
            for (name, va, vb) in &variants {
                assert!(
                    run(va, vb, reference) == want,
                    "{r}: scales {name} (reference kernel: {reference}) change the result"
                );
            }
        }
    }
}
