//! GPU tests of grouped GEMM (`Gpu::grouped_gemm`): contiguous and masked layouts, every operand
//! kind with a grouped kernel (FP8 blockwise on the FP8 kernel; MXFP8, MXFP4, NVFP4 pairs on the
//! MX kernel; MXFP4 / NVFP4 experts with FP8 or bf16 activations on the 4-bit-weights kernel),
//! random group sizes including empty groups and groups of one row, device values that need
//! clamping, against a float64 CPU reference of each group's product. Each recipe runs on the
//! plan `grouped_gemm` chooses, on the exact kernels (`plan::choose_grouped_exact`), and with its
//! experts folded to FP8 once on the device (`Gpu::fold_to_fp8`); folded plans are checked
//! against the product of the host's bit-identical folds.
//! Run on an H100: `cargo test -p blockscaled-tests --test gpu_grouped -- --include-ignored`.
//!
//! Tolerances are the dense kernels' (`gpu.rs`: FP8 accumulation, 2^-7 of Σ|a·b|; `gpu_mx.rs`,
//! `gpu_w4.rs`: bf16 products with fp32 sums, (K/8 + 1)·2^-23 of Σ|a·b|): a grouped tile is the
//! dense kernel's tile over other rows. Every row no group owns must keep the output's NaN
//! poison: it is never written.

use std::sync::OnceLock;

use blockscaled::Call;
use blockscaled::plan::{GroupedProblem, choose_grouped_exact};
use blockscaled::{
    ClusterShape, DeviceGroups, ElemType, Error, Fp4Weights, GemmShape, Gpu, GroupLayout,
    HostOutput, OutType, Plan, Recipe, ScaleType, ScaledMatrix, Sm90Tile,
};
use blockscaled_tests::{
    FP8_ACCUMULATION_REL, NoCancellation, bf16_mma_rel, check_no_cancellation, compare_outputs,
    no_cancellation_matrix, random_matrix, random_values, run_seed,
};
use proptest::prelude::*;

fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| Gpu::new(0).expect("a CUDA device (these tests are ignored without one)"))
}

/// Every operand kind with a grouped kernel.
const GROUPED_RECIPES: [Recipe; 8] = [
    Recipe::DeepSeekFp8,
    Recipe::Mxfp8(blockscaled::Fp8::E4M3),
    Recipe::Mxfp4,
    Recipe::Nvfp4,
    Recipe::W4A8(Fp4Weights::Mxfp4),
    Recipe::W4A8(Fp4Weights::Nvfp4),
    Recipe::W4A16(Fp4Weights::Mxfp4),
    Recipe::W4A16(Fp4Weights::Nvfp4),
];

/// The rows of A (and C) each group owns after the kernels' clamping (`grouped` module doc):
/// `(batch entry, first row, end row)`.
fn group_rows(layout: GroupLayout, values: &[i32], rows: usize) -> Vec<(usize, usize, usize)> {
    let mut prev = 0usize;
    values
        .iter()
        .enumerate()
        .map(|(g, &v)| {
            let v = v.max(0) as usize;
            match layout {
                GroupLayout::Masked => (g, 0, v.min(rows)),
                GroupLayout::Contiguous => {
                    let end = v.clamp(prev, rows);
                    let r = (0, prev, end);
                    prev = end;
                    r
                }
            }
        })
        .collect()
}

/// What a check compares a grouped GEMM's result with.
#[derive(Clone, Copy, Debug)]
enum Bar {
    /// Every owned element within this fraction of Σ|a·b| (random signs).
    Tolerance(f64),
    /// Operands that do not cancel: `blockscaled_tests::check_no_cancellation` with these bounds.
    NoCancellation(NoCancellation),
}

/// A grouped GEMM's result against the CPU reference: every owned row within the bar, every
/// other row still NaN.
fn check_result(
    got: &HostOutput,
    a: &ScaledMatrix,
    b: &ScaledMatrix,
    owned: &[(usize, usize, usize)],
    bar: Bar,
) -> Result<(), String> {
    let (k, n, rows) = (a.k(), b.rows(), a.rows());
    let (av, bv) = (a.dequantize(), b.dequantize());
    let mut written = vec![false; got.values.len()];
    let (mut got_rows, mut want_rows, mut abs_sums) = (Vec::new(), Vec::new(), Vec::new());
    for (g, &(l, r0, r1)) in owned.iter().enumerate() {
        for r in r0..r1 {
            let arow = &av[(l * rows + r) * k..][..k];
            for c in 0..n {
                let brow = &bv[(g * n + c) * k..][..k];
                let (sum, abs) = arow.iter().zip(brow).fold((0f64, 0f64), |(s, t), (x, y)| {
                    (s + x * y, t + (x * y).abs())
                });
                let i = (l * rows + r) * n + c;
                written[i] = true;
                got_rows.push(got.values[i]);
                want_rows.push(blockscaled::round_output(got.dtype, sum));
                abs_sums.push(abs);
            }
        }
    }
    let as_output = |values: Vec<f32>| HostOutput {
        dtype: got.dtype,
        m: values.len(),
        n: 1,
        l: 1,
        values,
    };
    let count = abs_sums.len();
    let (got_rows, want_rows) = (as_output(got_rows), as_output(want_rows));
    match bar {
        Bar::Tolerance(rel) => {
            let slack: Vec<f64> = abs_sums.iter().map(|s| s * rel).collect();
            compare_outputs(&got_rows, &want_rows, 1.0, &slack)
        }
        Bar::NoCancellation(bounds) => {
            check_no_cancellation(&got_rows, &want_rows, &abs_sums, bounds).map(|_| ())
        }
    }
    .map_err(|e| format!("{count} owned elements: {e}"))?;
    let stray = written
        .iter()
        .zip(&got.values)
        .filter(|(w, v)| !**w && !v.is_nan())
        .count();
    if stray > 0 {
        return Err(format!(
            "{stray} elements of rows no group owns were written"
        ));
    }
    Ok(())
}

/// The tolerance of `recipe`'s grouped kernel, as a fraction of Σ|a·b|.
fn rel(recipe: Recipe, k: usize) -> f64 {
    match recipe {
        Recipe::DeepSeekFp8 => FP8_ACCUMULATION_REL,
        _ => bf16_mma_rel(k),
    }
}

/// The bar of `recipe`'s grouped kernel (`folded`: run on the FP8 kernel) with operands that do
/// not cancel, or with random ones.
fn bar(recipe: Recipe, k: usize, fp8_sums: bool, no_cancel: bool) -> Bar {
    let fp8 = fp8_sums || recipe == Recipe::DeepSeekFp8;
    match (no_cancel, fp8) {
        (false, true) => Bar::Tolerance(FP8_ACCUMULATION_REL),
        (false, false) => Bar::Tolerance(rel(recipe, k)),
        (true, true) => Bar::NoCancellation(NoCancellation::FP8),
        (true, false) => Bar::NoCancellation(NoCancellation::half(k)),
    }
}

/// Whether `recipe`'s experts can be folded ahead of time and then run: MX or NVFP4 experts
/// with activations that are FP8 or fold (bf16 activations have no FP8 kernel).
fn prefolds(recipe: Recipe) -> bool {
    recipe.b().scale != ScaleType::F32 && recipe.a().elem != ElemType::BF16
}

/// Which plan a check runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum How {
    /// `Gpu::grouped_gemm`'s own choice.
    Chosen,
    /// The exact kernels' (`plan::choose_grouped_exact`: no fold).
    Exact,
    /// B folded once on the device (`Gpu::fold_to_fp8`), then `Gpu::grouped_gemm`'s choice.
    Prefolded,
    /// The FP8 kernel with `Gpu::grouped_gemm`'s configuration but this tile and cluster, in
    /// bands of one cluster's rows.
    Forced(Sm90Tile, ClusterShape),
}

/// Runs one grouped GEMM of `recipe` with fresh random operands: G = `values.len()` experts of
/// N × K, A with `rows` rows (per batch entry when masked), the groups from `values` (uploaded
/// as host values when they are valid ones, else written as device values and clamped there).
/// Where the plan folds (per call, or B ahead of time), the reference multiplies the host's
/// bit-identical folds (`ScaledMatrix::fold_to_fp8`) with the FP8 kernel's tolerance.
#[allow(clippy::too_many_arguments)]
fn check(
    recipe: Recipe,
    how: How,
    layout: GroupLayout,
    values: &[i32],
    rows: usize,
    n: usize,
    k: usize,
    dtype: OutType,
    seed: u64,
) -> Result<Plan, String> {
    let shape = (rows, n, k);
    check_on(recipe, how, layout, values, shape, dtype, seed, false)
}

/// [`check`] with operands that do not cancel (`no_cancel`: A ≥ 0, each row of each expert of
/// one sign) held to `check_no_cancellation`'s bar, or random ones held to the tolerance.
#[allow(clippy::too_many_arguments)]
fn check_on(
    recipe: Recipe,
    how: How,
    layout: GroupLayout,
    values: &[i32],
    (rows, n, k): (usize, usize, usize),
    dtype: OutType,
    seed: u64,
    no_cancel: bool,
) -> Result<Plan, String> {
    let g = gpu();
    let what = format!(
        "{recipe} {how:?} {layout:?} groups {values:?} rows {rows} N {n} K {k} {dtype:?} seed {seed}"
    );
    let e = |x: Error| format!("{what}: {x}");
    let count = values.len();
    let a_batch = if layout == GroupLayout::Masked {
        count
    } else {
        1
    };
    let (a, b) = if no_cancel {
        (
            no_cancellation_matrix(seed, rows, k, a_batch, recipe.a(), false),
            no_cancellation_matrix(seed ^ 0x9E37_79B9_7F4A_7C15, n, k, count, recipe.b(), true),
        )
    } else {
        (
            random_matrix(seed, rows, k, a_batch, recipe.a()).1,
            random_matrix(seed ^ 0x9E37_79B9_7F4A_7C15, n, k, count, recipe.b()).1,
        )
    };
    let (da, mut db) = (g.upload(&a).map_err(e)?, g.upload(&b).map_err(e)?);
    if how == How::Prefolded {
        db = g.fold_to_fp8(&db, true).map_err(e)?;
    }
    let groups = upload_groups(g, layout, values).map_err(e)?;
    let mut c = g.output(rows, n, a_batch, dtype).map_err(e)?; // NaN-poisoned
    let plan = match how {
        How::Exact => {
            let shape = GemmShape {
                m: rows,
                n,
                k,
                l: a_batch,
            };
            choose_grouped_exact(&GroupedProblem {
                arch: g.arch(),
                hw: g.hardware(),
                shape,
                a: da.desc(),
                b: db.desc(),
                groups: count,
            })
            .map_err(e)?
        }
        How::Chosen | How::Prefolded => g.grouped_plan(&da, &db, &groups).map_err(e)?,
        How::Forced(tile, cluster) => match g.grouped_plan(&da, &db, &groups).map_err(e)? {
            Plan::Sm90Fp8(cfg) => {
                Plan::Sm90Fp8(cfg.with_tile(tile).with_cluster(cluster).with_group_m(1))
            }
            other => return Err(format!("{what}: not the FP8 kernel's plan: {other:?}")),
        },
    };
    g.run(&Call::new(&da, &db).groups(&groups).with_plan(plan), &mut c)
        .map_err(e)?;
    let got = c.to_host().map_err(e)?;
    let owned = group_rows(layout, values, rows);
    let folded = how == How::Prefolded || matches!(plan, Plan::Sm90MxFp8(_));
    let result = if folded {
        // A folds when it is MX or NVFP4; FP8 with fp32 scales is used as it is.
        let fa = match a.desc().format.scale {
            ScaleType::F32 => a.clone(),
            _ => a.fold_to_fp8(false).map_err(e)?,
        };
        let fb = b.fold_to_fp8(true).map_err(e)?;
        check_result(&got, &fa, &fb, &owned, bar(recipe, k, true, no_cancel))
    } else {
        // The 4-bit-weights kernel on FP8 MMAs: exact weights, FP8 tensor-core sums; e2m1
        // activations folded per call (the host's fold is bit-identical).
        let fp8_sums = matches!(plan, Plan::Sm90W4(c) if c.fp8);
        let fa = match a.desc().format.elem {
            ElemType::E2M1 if fp8_sums => a.fold_to_fp8(false).map_err(e)?,
            _ => a.clone(),
        };
        check_result(&got, &fa, &b, &owned, bar(recipe, k, fp8_sums, no_cancel))
    };
    result.map_err(|err| format!("{what} ({plan:?}): {err}"))?;
    Ok(plan)
}

/// Host values when they pass the host's checks, else the same values written on the device
/// (as a router's kernel would), which the kernels clamp.
fn upload_groups(
    g: &Gpu,
    layout: GroupLayout,
    values: &[i32],
) -> blockscaled::Result<DeviceGroups<'static>> {
    let host = match layout {
        GroupLayout::Contiguous => g.group_ends(values),
        GroupLayout::Masked => g.group_counts(values),
    };
    match host {
        Ok(groups) => Ok(groups),
        Err(_) => {
            let mut groups = g.device_groups(layout, values.len())?;
            let mut view = groups.values_mut().expect("the crate's own buffer");
            g.stream().memcpy_htod(values, &mut view)?;
            Ok(groups)
        }
    }
}

/// Random group sizes in 0..=`max`, with empty groups and one-row groups common.
fn sizes(seed: u64, count: usize, max: usize) -> Vec<usize> {
    random_values(seed, count, count)
        .iter()
        .enumerate()
        .map(|(i, v)| match (seed as usize + i) % 5 {
            0 => 0,
            1 => 1,
            _ => ((v.abs() * 1e4) as usize) % (max + 1),
        })
        .collect()
}

/// Contiguous ends of `sizes`.
fn ends(sizes: &[usize]) -> Vec<i32> {
    sizes
        .iter()
        .scan(0usize, |acc, s| {
            *acc += s;
            Some(*acc as i32)
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    #[ignore = "needs a CUDA device"]
    fn grouped_gemm_matches_cpu_reference_on_random_groups(
        which in 0usize..8,
        masked in any::<bool>(),
        count in 1usize..7,
        max in 1usize..300,
        tail in 0usize..40,
        n in 1usize..400,
        k128 in 1usize..5,
        out_i in 0usize..3,
        how_i in 0usize..3,
        seed in any::<u64>(),
    ) {
        let recipe = GROUPED_RECIPES[which];
        let how = match how_i {
            1 => How::Exact,
            2 if prefolds(recipe) => How::Prefolded,
            _ => How::Chosen,
        };
        let dtype = [OutType::Bf16, OutType::F16, OutType::F32][out_i];
        let k = 128 * k128;
        let s = sizes(seed, count, max);
        let (layout, values, rows) = if masked {
            let values: Vec<i32> = s.iter().map(|&x| x as i32).collect();
            // Capacity at least 1, groups up to it (the rest of each batch entry unowned).
            (GroupLayout::Masked, values, max + tail)
        } else {
            let values = ends(&s);
            let rows = (*values.last().unwrap() as usize + tail).max(1);
            (GroupLayout::Contiguous, values, rows)
        };
        check(recipe, how, layout, &values, rows, n, k, dtype, seed).map_err(TestCaseError::fail)?;
    }
}

/// The FP8 kernel's two-wave (256-row) grouped tiles, alone and in pairs along either axis,
/// on both layouts: a group's last tile computes only the waves its rows reach (each
/// consumer's 64 rows of a wave past the group are skipped), so the groups end in every 64-row
/// band of a tile (1–64, 65–128, 129–192, 193–256 rows into it), with an empty group, a group of
/// one row and groups of several tiles; K of 3 blocks (the first, staggered batch and the
/// steady state). Every owned row is checked, every other row keeps its poison.
#[test]
#[ignore = "needs a CUDA device"]
fn grouped_256_row_tiles_compute_only_the_rows_each_group_reaches() {
    let sizes = [700usize, 0, 1, 64, 65, 128, 129, 192, 193, 256, 300, 511];
    let mut seed = 4800u64;
    for cluster in [(1, 1), (2, 1), (1, 2)] {
        let how = How::Forced(
            Sm90Tile::M256,
            ClusterShape {
                m: cluster.0,
                n: cluster.1,
            },
        );
        for layout in [GroupLayout::Contiguous, GroupLayout::Masked] {
            seed += 1;
            let (values, rows) = match layout {
                GroupLayout::Masked => (sizes.iter().map(|&x| x as i32).collect(), 720),
                GroupLayout::Contiguous => {
                    let values = ends(&sizes);
                    let rows = *values.last().unwrap() as usize + 37;
                    (values, rows)
                }
            };
            let plan = check(
                Recipe::DeepSeekFp8,
                how,
                layout,
                &values,
                rows,
                328,
                384,
                OutType::Bf16,
                seed,
            )
            .unwrap();
            assert!(
                matches!(plan, Plan::Sm90Fp8(c) if c.tile == Sm90Tile::M256),
                "{plan:?}"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn grouped_gemm_runs_the_seed_cases_and_decode_counts_on_every_operand_kind() {
    // The seed's cases 3 and 4 (small enough for the CPU reference), and masked decode counts.
    let cases: [(GroupLayout, Vec<i32>, usize, usize, usize); 3] = [
        (GroupLayout::Contiguous, ends(&[192, 320]), 512, 3072, 512),
        (GroupLayout::Contiguous, ends(&[128, 384]), 512, 1024, 1536),
        (
            GroupLayout::Masked,
            vec![3, 0, 17, 1, 64, 0, 9, 2],
            64,
            512,
            1024,
        ),
    ];
    // Every plan each recipe can take: the chosen one, the exact kernels', and experts folded
    // ahead of time (MX and NVFP4 experts).
    for (i, recipe) in GROUPED_RECIPES.into_iter().enumerate() {
        for how in [How::Chosen, How::Exact, How::Prefolded] {
            if how == How::Prefolded && !prefolds(recipe) {
                continue;
            }
            for (j, (layout, values, rows, n, k)) in cases.iter().enumerate() {
                let seed = 0xC0DE + (i * 7 + j) as u64 + blockscaled_tests::run_seed();
                check(
                    recipe,
                    how,
                    *layout,
                    values,
                    *rows,
                    *n,
                    *k,
                    OutType::Bf16,
                    seed,
                )
                .unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }
}

/// No systematic error (`blockscaled_tests::check_no_cancellation`): on operands that do not
/// cancel, every recipe on every plan it can take (chosen, exact, experts folded ahead of time),
/// contiguous and masked, within its kernel's bound (the FP8 kernel's one-sided one where it
/// runs FP8 or folded operands, the bf16 tensor cores' otherwise); each check fails a planted
/// 0.5% error.
#[test]
#[ignore = "needs a CUDA device"]
fn grouped_gemm_has_no_systematic_error_on_operands_that_do_not_cancel() {
    let cases: [(GroupLayout, Vec<i32>, usize); 2] = [
        (GroupLayout::Contiguous, ends(&[192, 0, 17, 303]), 512),
        (GroupLayout::Masked, vec![3, 0, 64, 17], 64),
    ];
    let (n, k) = (520, 1024);
    for (i, recipe) in GROUPED_RECIPES.into_iter().enumerate() {
        for how in [How::Chosen, How::Exact, How::Prefolded] {
            if how == How::Prefolded && !prefolds(recipe) {
                continue;
            }
            for (j, (layout, values, rows)) in cases.iter().enumerate() {
                let seed = run_seed() + (i * 7 + j) as u64;
                let shape = (*rows, n, k);
                let plan = check_on(
                    recipe,
                    how,
                    *layout,
                    values,
                    shape,
                    OutType::F32,
                    seed,
                    true,
                )
                .unwrap_or_else(|e| panic!("{e}"));
                eprintln!("{recipe} {how:?} {layout:?}: {plan:?}");
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn device_values_past_the_rows_or_out_of_order_are_clamped_never_out_of_bounds() {
    // Ends that decrease, one past the rows, a negative one; counts above the capacity and
    // below zero: written on the device.
    let contiguous = (GroupLayout::Contiguous, &[100, 40, 7000, -5, 260][..], 260);
    let masked = (GroupLayout::Masked, &[500, -1, 3, 64][..], 64);
    let ds = Recipe::DeepSeekFp8;
    for (seed, (recipe, how, (layout, values, rows))) in [
        (ds, How::Chosen, contiguous),
        (ds, How::Chosen, masked),
        (Recipe::W4A8(Fp4Weights::Mxfp4), How::Exact, masked),
        (Recipe::Nvfp4, How::Exact, masked),
        (Recipe::Mxfp4, How::Chosen, masked),
    ]
    .into_iter()
    .enumerate()
    {
        check(
            recipe,
            how,
            layout,
            values,
            rows,
            256,
            256,
            OutType::Bf16,
            7 + seed as u64,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn grouped_inputs_the_host_can_see_are_typed_errors() {
    let g = gpu();
    let recipe = Recipe::DeepSeekFp8;
    assert!(matches!(g.group_ends(&[]), Err(Error::Shape(_))));
    assert!(matches!(g.group_ends(&[5, 3]), Err(Error::Shape(_))));
    // What a good one reports of itself.
    let three = g.group_ends(&[3, 5, 9]).unwrap();
    let shown = format!("{three:?}");
    assert!(
        shown.contains("Contiguous") && shown.contains("count: 3") && shown.contains("Some(9)"),
        "{shown}"
    );
    assert!(matches!(g.group_counts(&[-1]), Err(Error::Shape(_))));
    assert!(matches!(
        g.device_groups(GroupLayout::Masked, 0),
        Err(Error::Shape(_))
    ));
    let (_, a) = random_matrix(1, 100, 256, 1, recipe.a());
    let (_, b) = random_matrix(2, 128, 256, 3, recipe.b());
    let (da, db) = (g.upload(&a).unwrap(), g.upload(&b).unwrap());
    let mut c = g.output(100, 128, 1, OutType::Bf16).unwrap();
    // Ends past A's rows; the wrong number of groups for B's experts; a masked layout with a
    // stacked A; the wrong output.
    let past = g.group_ends(&[10, 50, 101]).unwrap();
    assert!(matches!(
        g.grouped_gemm(&da, &db, &past, &mut c),
        Err(Error::Shape(_))
    ));
    let two = g.group_ends(&[10, 50]).unwrap();
    assert!(matches!(
        g.grouped_gemm(&da, &db, &two, &mut c),
        Err(Error::Shape(_))
    ));
    let masked = g.group_counts(&[1, 2, 3]).unwrap();
    assert!(matches!(
        g.grouped_gemm(&da, &db, &masked, &mut c),
        Err(Error::Shape(_))
    ));
    let ok = g.group_ends(&[10, 50, 100]).unwrap();
    let mut wrong = g.output(100, 64, 1, OutType::Bf16).unwrap();
    assert!(matches!(
        g.grouped_gemm(&da, &db, &ok, &mut wrong),
        Err(Error::Shape(_))
    ));
    // Plans without a grouped kernel, and split K.
    assert!(matches!(
        g.run(
            &Call::new(&da, &db).groups(&ok).with_plan(Plan::Reference),
            &mut c
        ),
        Err(Error::Config(_))
    ));
    let Plan::Sm90Fp8(cfg) = g.grouped_plan(&da, &db, &ok).unwrap() else {
        panic!("FP8 experts run on the FP8 kernel");
    };
    let split = Plan::Sm90Fp8(cfg.with_split_k(2));
    assert!(matches!(
        g.run(&Call::new(&da, &db).groups(&ok).with_plan(split), &mut c),
        Err(Error::Config(_))
    ));
    g.grouped_gemm(&da, &db, &ok, &mut c).unwrap();
    // Folding takes MX and NVFP4 matrices only.
    assert!(matches!(g.fold_to_fp8(&db, true), Err(Error::Format(_))));
}

#[test]
#[ignore = "needs a CUDA device"]
fn weights_folded_once_run_dense_gemm_too() {
    // Small M, where the MX kernel would run the unfolded pair: with B folded ahead of time the
    // pair is the fold path's (A folded per call).
    let g = gpu();
    for (i, recipe) in [
        Recipe::Mxfp4,
        Recipe::Nvfp4,
        Recipe::W4A8(Fp4Weights::Mxfp4),
    ]
    .into_iter()
    .enumerate()
    {
        let seed = 0xF01D + i as u64 + blockscaled_tests::run_seed();
        let (m, n, k) = (40, 320, 512);
        let (_, a) = random_matrix(seed, m, k, 1, recipe.a());
        let (_, b) = random_matrix(seed ^ 5, n, k, 1, recipe.b());
        let (da, db) = (g.upload(&a).unwrap(), g.upload(&b).unwrap());
        let fb = g.fold_to_fp8(&db, true).unwrap();
        assert_eq!(*fb.desc(), b.desc().folded(true).unwrap());
        let mut c = g.output(m, n, 1, OutType::F32).unwrap();
        g.gemm(&da, &fb, &mut c).unwrap();
        let plan = g.plan(&da, &fb).unwrap();
        assert!(
            matches!(plan, Plan::Sm90MxFp8(_) | Plan::Sm90Fp8(_)),
            "{recipe}: {plan:?}"
        );
        let fa = match a.desc().format.scale {
            ScaleType::F32 => a.clone(),
            _ => a.fold_to_fp8(false).unwrap(),
        };
        let owned = [(0, 0, m)];
        // One group of every row: the dense product.
        let fb_host = b.fold_to_fp8(true).unwrap();
        check_result(
            &c.to_host().unwrap(),
            &fa,
            &fb_host,
            &owned,
            Bar::Tolerance(FP8_ACCUMULATION_REL),
        )
        .unwrap_or_else(|e| panic!("{recipe} ({plan:?}): {e}"));
    }
}
