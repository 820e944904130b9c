//! GPU tests of block-sparse (BSR) GEMM: random patterns (empty block rows, a single block, every
//! block), either operand sparse, ragged dense and sparse extents, both block-sparse tiles, pairs
//! along M, runs cut into parts (few CTAs), every output type; fresh random inputs, outputs
//! poisoned with NaN, every element compared with the CPU reference (missing blocks zeros) within
//! the FP8 accumulation bound. Run on a machine with an H100:
//! `cargo test -p blockscaled-tests --test gpu_bsr -- --include-ignored`.

use std::sync::OnceLock;

use blockscaled::Call;
use blockscaled::{
    BsrMatrix, ClusterShape, Error, Gpu, HostOutput, OutType, Plan, Recipe, Sm90Config, Sm90Tile,
    SparseSide, reference,
};
use blockscaled_tests::{compare_outputs, fp8_accumulation_slack, random_matrix};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| Gpu::new(0).expect("a CUDA device (these tests are ignored without one)"))
}

/// Which blocks a test keeps.
#[derive(Clone, Copy, Debug)]
enum Keep {
    /// Each block with this probability (seeded), some block rows left empty.
    Random(f64),
    None,
    All,
    /// One block, at (block row, block column) modulo the extents.
    One(usize, usize),
}

/// The dense operand (DeepSeek-style 1×128 activations), the sparse one (128 × 128 blocks of a
/// random e4m3 matrix with per-block scales), both fresh from `seed`.
fn operands(
    seed: u64,
    dense_rows: usize,
    sparse_rows: usize,
    k: usize,
    keep: Keep,
) -> (blockscaled::ScaledMatrix, BsrMatrix) {
    let recipe = Recipe::DeepSeekFp8;
    let (_, dense) = random_matrix(seed, dense_rows, k, 1, recipe.a());
    let (_, full) = random_matrix(seed ^ 0xB5B5_0F0F, sparse_rows, k, 1, recipe.b());
    (dense, sparsified(&full, seed, keep))
}

/// `full`'s 128 × 128 blocks that `keep` keeps (one block row left empty where random).
fn sparsified(full: &blockscaled::ScaledMatrix, seed: u64, keep: Keep) -> BsrMatrix {
    let (brs, bcs) = (full.rows().div_ceil(128), full.k() / 128);
    let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(7919));
    let empty_row = rng.random_range(0..brs);
    BsrMatrix::from_dense_blocks(full, |br, bc| match keep {
        Keep::Random(p) => br != empty_row && rng.random_bool(p),
        Keep::None => false,
        Keep::All => true,
        Keep::One(r, c) => (br, bc) == (r % brs, c % bcs),
    })
    .expect("valid BSR")
}

/// Runs the block-sparse GEMM with `cfg` (or the chosen plan) into a NaN-poisoned output.
fn bsr_on(
    dense: &blockscaled::ScaledMatrix,
    sparse: &BsrMatrix,
    side: SparseSide,
    dtype: OutType,
    cfg: Option<Sm90Config>,
) -> Result<HostOutput, String> {
    let g = gpu();
    let e = |x: Error| x.to_string();
    let (dd, ds) = (
        g.upload(dense).map_err(e)?,
        g.upload_bsr(sparse).map_err(e)?,
    );
    let (m, n) = match side {
        SparseSide::A => (sparse.rows(), dense.rows()),
        SparseSide::B => (dense.rows(), sparse.rows()),
    };
    let mut c = g.output(m, n, 1, dtype).map_err(e)?;
    let plan = match cfg {
        Some(cfg) => Plan::Sm90Fp8(cfg),
        None => g.bsr_plan(&dd, &ds).map_err(e)?,
    };
    g.run(&Call::sparse(&dd, &ds, side).with_plan(plan), &mut c)
        .map_err(e)?;
    c.to_host().map_err(e)
}

#[allow(clippy::too_many_arguments)]
fn check(
    side: SparseSide,
    dense_rows: usize,
    sparse_rows: usize,
    k: usize,
    keep: Keep,
    dtype: OutType,
    cfg: Option<Sm90Config>,
    seed: u64,
) -> Result<(), String> {
    let (dense, sparse) = operands(seed, dense_rows, sparse_rows, k, keep);
    let (want, abs) =
        reference::bsr_gemm(&dense, &sparse, side, dtype).map_err(|e| e.to_string())?;
    let got = bsr_on(&dense, &sparse, side, dtype, cfg)?;
    compare_outputs(&got, &want, 1.0, &fp8_accumulation_slack(&abs)).map_err(|e| {
        format!(
            "{side:?} sparse, dense {dense_rows} × {k}, sparse {sparse_rows} × {k} ({} blocks), \
             {keep:?} {dtype:?} {cfg:?} seed {seed}: {e}",
            sparse.nnz()
        )
    })
}

/// The configurations a test picks from: both tiles, pairs along M, few CTAs (runs cut into
/// parts that meet through split-K), parts forbidden.
fn config(which: usize, dense_rows: usize) -> Sm90Config {
    let (tile, cluster, ctas, split_k) = match which {
        0 => (Sm90Tile::M128, ClusterShape::ONE, 132, 16),
        1 => (Sm90Tile::M128N64, ClusterShape::ONE, 132, 16),
        2 => (Sm90Tile::M128, ClusterShape { m: 2, n: 1 }, 132, 16),
        3 => (Sm90Tile::M128, ClusterShape::ONE, 3, 16),
        4 => (Sm90Tile::M128N64, ClusterShape::ONE, 2, 5),
        5 => (Sm90Tile::M128, ClusterShape { m: 2, n: 1 }, 4, 16),
        _ => (Sm90Tile::M128, ClusterShape::ONE, 1, 1),
    };
    let units = dense_rows.div_ceil((tile.block_m() * cluster.m) as usize) as u32;
    Sm90Config::new(
        tile,
        cluster,
        (which as u32 % 3 + 1).min(units),
        ctas,
        split_k,
    )
}

const CONFIGS: usize = 7;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    #[ignore = "needs a CUDA device"]
    fn bsr_gemm_matches_cpu_reference_on_random_patterns_and_ragged_shapes(
        side_b in any::<bool>(),
        dense_rows in 1usize..600,
        sparse_rows in 1usize..600,
        k_blocks in 1usize..7,
        density in prop_oneof![Just(0.1), Just(0.5), Just(0.9), 0.0f64..1.0],
        which in 0..CONFIGS,
        dtype_i in 0usize..3,
        seed in any::<u64>(),
    ) {
        let side = if side_b { SparseSide::B } else { SparseSide::A };
        let dtype = [OutType::Bf16, OutType::F32, OutType::F16][dtype_i];
        let cfg = config(which, dense_rows);
        let r = check(side, dense_rows, sparse_rows, 128 * k_blocks, Keep::Random(density),
            dtype, Some(cfg), seed);
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn no_blocks_a_single_block_and_every_block_give_the_reference() {
    for (i, keep) in [Keep::None, Keep::One(1, 2), Keep::One(0, 0), Keep::All]
        .into_iter()
        .enumerate()
    {
        for side in [SparseSide::A, SparseSide::B] {
            for which in 0..CONFIGS {
                let seed = 1000 + 10 * i as u64 + which as u64;
                check(
                    side,
                    300,
                    260,
                    512,
                    keep,
                    OutType::Bf16,
                    Some(config(which, 300)),
                    seed,
                )
                .unwrap();
            }
            // The chosen plan, at a size with pairs and several bands.
            check(
                side,
                1100,
                640,
                1024,
                keep,
                OutType::Bf16,
                None,
                7 + i as u64,
            )
            .unwrap();
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_long_run_cut_into_parts_is_bitwise_reproducible_and_matches_the_reference() {
    // One block row holds every block (K = 2048: 16 blocks), the others one or none: with one M
    // tile and 132 CTAs the long run is cut into parts that meet in split-K's fixed order.
    let (dense, full) = {
        let recipe = Recipe::DeepSeekFp8;
        let (_, d) = random_matrix(77, 128, 2048, 1, recipe.a());
        let (_, f) = random_matrix(78, 512, 2048, 1, recipe.b());
        (d, f)
    };
    let sparse = BsrMatrix::from_dense_blocks(&full, |br, bc| br == 2 || (br == 0 && bc == 3))
        .expect("valid BSR");
    let cfg = config(0, 128);
    let (want, abs) = reference::bsr_gemm(&dense, &sparse, SparseSide::B, OutType::F32).unwrap();
    let first = bsr_on(&dense, &sparse, SparseSide::B, OutType::F32, Some(cfg)).unwrap();
    compare_outputs(&first, &want, 1.0, &fp8_accumulation_slack(&abs)).unwrap();
    let list = blockscaled::work_list(sparse.crow_indices(), 128, 128, 512, 1, 132, 16).unwrap();
    assert!(list.segments.iter().any(|s| s.parts > 1), "{list:?}");
    for _ in 0..3 {
        let again = bsr_on(&dense, &sparse, SparseSide::B, OutType::F32, Some(cfg)).unwrap();
        let same = first
            .values
            .iter()
            .zip(&again.values)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "results differ between runs");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn every_block_stored_gives_bitwise_the_dense_kernels_result() {
    // The same products in the same K order with the same scales: the dense FP8 kernel with B's
    // 128 × 128 scales and the block-sparse one with every block stored agree bit for bit.
    let (dense, full) = {
        let recipe = Recipe::DeepSeekFp8;
        let (_, d) = random_matrix(91, 384, 1024, 1, recipe.a());
        let (_, f) = random_matrix(92, 256, 1024, 1, recipe.b());
        (d, f)
    };
    let sparse = BsrMatrix::from_dense_blocks(&full, |_, _| true).unwrap();
    let g = gpu();
    for which in [0, 2] {
        let cfg = (config(which, 384)).with_split_k(1);
        let got = bsr_on(&dense, &sparse, SparseSide::B, OutType::F32, Some(cfg)).unwrap();
        let (da, db) = (g.upload(&dense).unwrap(), g.upload(&full).unwrap());
        let mut c = g.output(384, 256, 1, OutType::F32).unwrap();
        g.gemm_with(&da, &db, &mut c, Plan::Sm90Fp8(cfg)).unwrap();
        let want = c.to_host().unwrap();
        assert!(
            got.values
                .iter()
                .zip(&want.values)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{cfg:?}"
        );
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn mismatched_shapes_and_plans_are_typed_errors() {
    let g = gpu();
    let (dense, sparse) = operands(5, 256, 256, 512, Keep::Random(0.5));
    let (dd, ds) = (g.upload(&dense).unwrap(), g.upload_bsr(&sparse).unwrap());
    // What the upload keeps of a matrix with every block stored.
    let (_, all) = operands(7, 128, 384, 512, Keep::All);
    let d_all = g.upload_bsr(&all).unwrap();
    assert_eq!(
        (
            d_all.rows(),
            d_all.cols(),
            d_all.block(),
            d_all.nnz(),
            d_all.elem()
        ),
        (384, 512, 128, 12, all.elem())
    );
    // K differs.
    let (other, _) = operands(6, 256, 256, 384, Keep::All);
    let d_other = g.upload(&other).unwrap();
    let mut c = g.output(256, 256, 1, OutType::Bf16).unwrap();
    assert!(matches!(
        g.bsr_gemm(&d_other, &ds, SparseSide::B, &mut c),
        Err(Error::Shape(_))
    ));
    // Output of the wrong shape.
    let mut wrong = g.output(256, 128, 1, OutType::Bf16).unwrap();
    assert!(matches!(
        g.bsr_gemm(&dd, &ds, SparseSide::B, &mut wrong),
        Err(Error::Shape(_))
    ));
    // Tiles without a block-sparse kernel, pairs along N, parts out of range, another family.
    let ok = config(0, 256);
    for cfg in [
        ok.with_tile(Sm90Tile::M256),
        ok.with_tile(Sm90Tile::M128N192),
        ok.with_cluster(ClusterShape { m: 1, n: 2 }),
        ok.with_split_k(0),
        ok.with_split_k(17),
        ok.with_ctas(0),
    ] {
        let r = g.run(
            &Call::sparse(&dd, &ds, SparseSide::B).with_plan(Plan::Sm90Fp8(cfg)),
            &mut c,
        );
        assert!(matches!(r, Err(Error::Config(_))), "{cfg:?}: {r:?}");
    }
    let r = g.run(
        &Call::sparse(&dd, &ds, SparseSide::B).with_plan(Plan::Reference),
        &mut c,
    );
    assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
    // The good call still works after the refusals.
    g.bsr_gemm(&dd, &ds, SparseSide::B, &mut c).unwrap();
    assert!(c.to_host().unwrap().values.iter().all(|v| v.is_finite()));
}

/// No systematic error (`blockscaled_tests::check_no_cancellation`): on operands that do not
/// cancel (DeepSeek-style dense operand, e4m3 blocks), the block-sparse FP8 kernel with either
/// operand sparse, on the chosen plan and on a configuration that cuts runs into parts (split K),
/// within the FP8 kernel's one-sided bound; each check fails a planted 0.5% error.
#[test]
#[ignore = "needs a CUDA device"]
fn block_sparse_kernel_has_no_systematic_error_on_operands_that_do_not_cancel() {
    use blockscaled_tests::{
        NoCancellation, check_no_cancellation, no_cancellation_matrix, run_seed,
    };
    let (seed, k) = (run_seed(), 1024);
    let recipe = Recipe::DeepSeekFp8;
    for (i, side) in [SparseSide::B, SparseSide::A].into_iter().enumerate() {
        for (j, cfg) in [None, Some(config(3, 300))].into_iter().enumerate() {
            let s = seed + (2 * i + j) as u64;
            let dense = no_cancellation_matrix(s, 300, k, 1, recipe.a(), false);
            let full = no_cancellation_matrix(s ^ 0xB5B5_0F0F, 520, k, 1, recipe.b(), true);
            let sparse = sparsified(&full, s, Keep::Random(0.5));
            let (want, abs) = reference::bsr_gemm(&dense, &sparse, side, OutType::F32).unwrap();
            let got = bsr_on(&dense, &sparse, side, OutType::F32, cfg).unwrap();
            let (rel, mean) = check_no_cancellation(&got, &want, &abs, NoCancellation::FP8)
                .unwrap_or_else(|e| panic!("{side:?} sparse, {cfg:?}, seed {s}: {e}"));
            eprintln!(
                "{side:?} sparse, {cfg:?}: largest relative error {rel:.2e}, mean {mean:.2e}"
            );
        }
    }
}
