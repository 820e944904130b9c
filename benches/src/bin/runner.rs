//! `blockscaled-run`: runs, checks and times block-scaled GEMMs from the command line.
//!
//! ```text
//! blockscaled-run --mnkl 2048,2048,512,1 --recipe all
//! blockscaled-run --mnkl 8192,8192,1024,1 --ab_dtype Float4E2M1FN --sf_dtype Float8E8M0FNU \
//!                 --sf_vec_size 16 --c_dtype Float16 --iterations 50 --warmup_iterations 10
//! ```
//! Flags follow the CUTLASS CuTe-DSL examples (`--mnkl`, `--mma_tiler_mn`, `--cluster_shape_mn`,
//! `--ab_dtype`, `--sf_dtype`, `--sf_vec_size`, `--c_dtype`, `--iterations`, `--warmup_iterations`,
//! `--skip_ref_check`); dashes work in place of underscores. Prints time, TFLOP/s, GB/s, the
//! fraction of the measured ceiling and the ratio to cuBLASLt timed in the same run.

use std::process::ExitCode;

use blockscaled::{
    ClusterShape, Fp8, GemmShape, Gpu, OutType, Plan, Recipe, Sm90Config, Sm90MxTile, Sm90Tile,
    Sm90W4Tile,
};
use blockscaled_benches::cases::{Case, open_peer, run_case};
use blockscaled_benches::table::print_table;
use clap::Parser;

#[derive(Parser, Debug)]
#[command(version, about = "Run, check and time block-scaled GEMMs")]
struct Args {
    /// Problem size M,N,K,L.
    #[arg(long, default_value = "2048,2048,512,1")]
    mnkl: String,
    /// A recipe name (mxfp8-e4m3, mxfp8-e5m2, mxfp4, nvfp4, e2m1-e8m0x16, deepseek-fp8,
    /// fp8-e4m3-tensor, fp8-e5m2-tensor, fp8-e4m3-row, fp8-e5m2-row), `all`, or a comma list.
    /// Overridden by --ab_dtype/--sf_dtype/--sf_vec_size when those are given.
    #[arg(long, default_value = "all")]
    recipe: String,
    /// Element type: Float8E4M3FN, Float8E5M2, Float4E2M1FN (or e4m3, e5m2, e2m1); BFloat16 or
    /// Float16 (bf16, f16) run the dense 16-bit GEMM (no block scales; --mma_tiler_mn 128,128,
    /// 256,128, 128,64, 256,64 or 128,256) against cuBLASLt's of the same type.
    #[arg(long = "ab_dtype", alias = "ab-dtype")]
    ab_dtype: Option<String>,
    /// Scale type: Float8E8M0FNU, Float8E4M3FN (ue4m3), Float32 (or e8m0, ue4m3, f32).
    #[arg(long = "sf_dtype", alias = "sf-dtype")]
    sf_dtype: Option<String>,
    /// Elements per scale along K: 16, 32, 128; with Float32 scales 0 means per tensor, -1 per row.
    #[arg(
        long = "sf_vec_size",
        alias = "sf-vec-size",
        allow_hyphen_values = true
    )]
    sf_vec_size: Option<i64>,
    /// Output type: BFloat16 (default), Float16, Float32.
    #[arg(long = "c_dtype", alias = "c-dtype", default_value = "BFloat16")]
    c_dtype: String,
    /// Tile M,N of the sm90 kernel: 128,128, 192,128, 256,128, 128,64, wide 128,144, 128,160,
    /// 128,192, or swapped (decode sizes) 16,128, 32,128 or 64,128 (default: the heuristic's).
    #[arg(long = "mma_tiler_mn", alias = "mma-tiler-mn")]
    mma_tiler_mn: Option<String>,
    /// Cluster shape M,N (accepted for the fast kernels; the reference kernel runs unclustered).
    #[arg(long = "cluster_shape_mn", alias = "cluster-shape-mn")]
    cluster_shape_mn: Option<String>,
    #[arg(long, default_value_t = 20)]
    iterations: usize,
    #[arg(
        long = "warmup_iterations",
        alias = "warmup-iterations",
        default_value_t = 3
    )]
    warmup_iterations: usize,
    /// Skip the comparison with the CPU reference.
    #[arg(long = "skip_ref_check", alias = "skip-ref-check")]
    skip_ref_check: bool,
    /// Do not time cuBLASLt.
    #[arg(long = "no_peer", alias = "no-peer")]
    no_peer: bool,
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Kernel: auto (what `gemm` chooses), reference, sm90 (the Hopper FP8 kernel), sm90mx (the
    /// Hopper MX / NVFP4 kernel; --mma_tiler_mn 128,256 or 128,128), sm90mxfp8 (MX operands
    /// folded into FP8 by a pre-pass, then the sm90 kernel with its tiles) or sm90w4 (the Hopper
    /// 4-bit-weights kernel; --mma_tiler_mn 16,128 or 128,128).
    #[arg(long, default_value = "auto")]
    kernel: String,
    /// sm90 split-K: K ranges computed by separate CTAs and summed by the last of each tile (default: the
    /// heuristic's; 1 = none).
    #[arg(long = "split_k", alias = "split-k")]
    split_k: Option<u32>,
    /// sm90 scheduler band height in M tiles (default: the heuristic's).
    #[arg(long = "group_m", alias = "group-m")]
    group_m: Option<u32>,
    /// Seed of the random inputs (default: a fresh one, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Grouped GEMM: rows per group (e.g. 80,176,128); N and K come from --mnkl (M and L are
    /// ignored). Each group multiplies its rows by its own expert (G × N × K).
    #[arg(long)]
    groups: Option<String>,
    /// Grouped GEMM: one of the seed's cases 1..4 (their G, M per group, N, K), or 0 for all four.
    #[arg(long = "group_case", alias = "group-case")]
    group_case: Option<usize>,
    /// Grouped GEMM with the masked layout (G × capacity rows, counts on the device) of this
    /// capacity; default: the contiguous layout.
    #[arg(long)]
    masked: Option<usize>,
    /// Grouped GEMM: fold MX / NVFP4 experts to FP8 once before timing (`Gpu::fold_to_fp8`, as
    /// at model load), so each call folds only the activations.
    #[arg(long = "fold_weights", alias = "fold-weights")]
    fold_weights: bool,
    /// Block-sparse GEMM with this operand sparse (a or b) (--mnkl gives M, N, K; L is 1). Timed
    /// against our dense kernel and cuBLASLt dense on the same shape. --mma_tiler_mn (FP8:
    /// 128,128 or 128,64; 16-bit: 128 or 256 rows by 128 or 64), --cluster_shape_mn 1,1 or 2,1
    /// (FP8), --split_k the most parts a long block row is cut into.
    #[arg(long)]
    bsr: Option<String>,
    /// Block-sparse GEMM: the blocks' type, fp8 (e4m3 128 × 128 blocks with fp32 scales, the
    /// dense operand DeepSeek-style), bf16 or f16 (both operands).
    #[arg(long = "bsr_type", alias = "bsr-type", default_value = "fp8")]
    bsr_type: String,
    /// Block-sparse GEMM: the block size (FP8: 128; bf16 / f16: 64 or 128).
    #[arg(long = "bsr_block", alias = "bsr-block", default_value_t = 128)]
    bsr_block: usize,
    /// Block-sparse GEMM: stored blocks over all blocks (0 to 1).
    #[arg(long, default_value_t = 0.1)]
    density: f64,
    /// Block-sparse GEMM: random, banded or block-diagonal.
    #[arg(long, default_value = "random")]
    pattern: String,
    /// Time the device quantizers instead of a GEMM: a tensor of --mnkl's M rows × K columns × L
    /// of this type (bf16, f16 or f32) into each --recipe's A format (NVFP4 with its tensor scale
    /// given, as a serving stack passes it), checked bit for bit against the host quantizer.
    /// Reports GB/s of bytes read + written and the fraction of the 3.0 TB/s copy ceiling.
    #[arg(long)]
    quantize: Option<String>,
    /// A fused epilogue, comma-separated: alpha=X, beta (β·C with β = 0.5), bias, relu, gelu,
    /// gelu-tanh, silu, swiglu, residual. Times the GEMM with it beside the plain GEMM with
    /// bf16 output (and, with --out_quant, beside the GEMM + the standalone quantizer).
    #[arg(long)]
    epilogue: Option<String>,
    /// The fused epilogue's output quantized: fp8-1x128, mxfp8, mxfp4 or nvfp4 (its tensor scale
    /// given).
    #[arg(long = "out_quant")]
    out_quant: Option<String>,
    /// Use from an engine: GEMMs on views of caller memory against crate-owned matrices (every
    /// family), quantize → GEMM on a caller's stream, and two threads on two streams.
    #[arg(long)]
    engine: bool,
    /// Tensor parallelism on two GPUs (NCCL): a DeepSeek-FP8 MLP on one GPU against two.
    #[arg(long)]
    tp: bool,
    /// Expert parallelism on two GPUs (NCCL): DeepSeek-V3- and Mixtral-like MoE layers, tokens
    /// per second on one GPU against two, with the exchanges' and the experts' times.
    #[arg(long)]
    ep: bool,
    /// The MoE layer on one GPU: DeepSeek-V3- and Mixtral-like layers, the step and its grouped
    /// GEMMs alone.
    #[arg(long)]
    moe: bool,
}

/// The 16-bit element type `--ab_dtype` names, if it names one.
fn half_type(s: &str) -> Option<blockscaled::ElemType> {
    match s.to_ascii_lowercase().replace(['_', '-'], "").as_str() {
        "bfloat16" | "bf16" => Some(blockscaled::ElemType::BF16),
        "float16" | "f16" | "fp16" => Some(blockscaled::ElemType::F16),
        _ => None,
    }
}

/// The dense 16-bit mode: A and B of `elem` (fresh random values), the 16-bit kernel with the
/// tile, cluster, split and band flags, its check against the CPU reference (unless skipped), and
/// its time against cuBLASLt's GEMM of the same type on the same codes (L = 1), in one run.
fn run_half(
    args: &Args,
    gpu: &Gpu,
    mnkl: &[usize],
    seed: u64,
    elem: blockscaled::ElemType,
    (tiler_mn, cluster, out): (Option<(usize, usize)>, Option<ClusterShape>, OutType),
) -> Result<bool, String> {
    use blockscaled::{OperandFormat, ScaledMatrix, Sm90HalfTile};
    use blockscaled_benches::timing::time_on_stream;
    let (m, n, k, l) = (mnkl[0], mnkl[1], mnkl[2], mnkl[3]);
    let e = |x: blockscaled::Error| x.to_string();
    let format = OperandFormat {
        elem,
        ..Recipe::W4A16(blockscaled::Fp4Weights::Nvfp4).a()
    };
    let values = |s: u64, rows: usize| blockscaled_tests::random_values(s, rows * k * l, k);
    let a = ScaledMatrix::quantize(&values(seed, m), m, k, l, format).map_err(e)?;
    let b = ScaledMatrix::quantize(&values(seed ^ 0x9E37, n), n, k, l, format).map_err(e)?;
    let (da, db) = (gpu.upload(&a).map_err(e)?, gpu.upload(&b).map_err(e)?);
    let mut c = gpu.output(m, n, l, out).map_err(e)?;
    let forced =
        tiler_mn.is_some() || cluster.is_some() || args.split_k.is_some() || args.group_m.is_some();
    let plan = match gpu.plan(&da, &db).map_err(e)? {
        Plan::Sm90Half(d) if forced => {
            let tile = match tiler_mn {
                None => d.tile,
                Some((bm, bn)) => Sm90HalfTile::ALL
                    .into_iter()
                    .find(|t| (t.block_m() as usize, t.block_n as usize) == (bm, bn))
                    .ok_or(
                        "--mma_tiler_mn: the 16-bit kernel has tiles of 128,128, 256,128, \
                            128,64, 256,64 and 128,256",
                    )?,
            };
            let cluster_m = cluster.map_or(d.cluster_m, |c| c.m);
            let units = m.div_ceil((tile.block_m() * cluster_m) as usize).max(1) as u32;
            Plan::Sm90Half(
                d.with_tile(tile)
                    .with_cluster_m(cluster_m)
                    .with_group_m(args.group_m.unwrap_or(d.group_m).clamp(1, units))
                    .with_split_k(args.split_k.unwrap_or(d.split_k)),
            )
        }
        p if forced => return Err(format!("{p:?}: the tile flags are the 16-bit kernel's")),
        p => p,
    };
    let mut ok = true;
    if !args.skip_ref_check {
        use blockscaled_tests::{bf16_mma_rel, compare_outputs};
        gpu.gemm_with(&da, &db, &mut c, plan).map_err(e)?;
        let got = c.to_host().map_err(e)?;
        let (want, _) = blockscaled::reference::gemm(&a, &b, out).map_err(e)?;
        let (_, abs) = blockscaled::reference::gemm_f64(&a, &b).map_err(e)?;
        let slack: Vec<f64> = abs.iter().map(|&s| s * bf16_mma_rel(k)).collect();
        match compare_outputs(&got, &want, 1.0, &slack) {
            Ok(()) => println!(
                "{}: check passed ({} of {} elements)",
                elem.name(),
                got.values.len(),
                got.values.len()
            ),
            Err(msg) => {
                println!("{}: CHECK FAILED: {msg}", elem.name());
                ok = false;
            }
        }
    }
    let (warm, iters) = (args.warmup_iterations, args.iterations);
    let ours = time_on_stream(gpu.stream(), warm, iters, |_| {
        gpu.gemm_with(&da, &db, &mut c, plan)
    })
    .map_err(e)?;
    let peer = if args.no_peer || l != 1 {
        None
    } else {
        let p = open_peer(gpu)?;
        let s = p.stream().clone();
        let codes = |x: &ScaledMatrix| -> Vec<u16> {
            x.data()
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
                .collect()
        };
        let pe = |x: cudarc::driver::DriverError| x.to_string();
        let (pa, pb) = (
            s.clone_htod(&codes(&a)).map_err(pe)?,
            s.clone_htod(&codes(&b)).map_err(pe)?,
        );
        let mut pc = s.alloc_zeros::<u16>(m * n).map_err(pe)?;
        let t = time_on_stream(&s, warm, iters, |_| {
            if elem == blockscaled::ElemType::BF16 {
                p.gemm_bf16(m, n, k, &pa, &pb, &mut pc)
            } else {
                p.gemm_f16(m, n, k, &pa, &pb, &mut pc)
            }
        })
        .map_err(|x| x.to_string())?;
        Some(t)
    };
    let flops = 2.0 * (m * n * k * l) as f64;
    let tf = |ms: f64| flops / (ms * 1e-3) / 1e12;
    println!(
        "{:<5} {m:>6} {n:>6} {k:>6} {l:>3}  ours {:>9.1} µs {:>6.0} TFLOP/s  cuBLASLt {}  {}",
        elem.name(),
        ours.median_ms * 1e3,
        tf(ours.median_ms),
        peer.map_or("n/a".into(), |p| format!(
            "{:>9.1} µs {:>6.0} TFLOP/s  ratio {:.3}",
            p.median_ms * 1e3,
            tf(p.median_ms),
            p.median_ms / ours.median_ms
        )),
        blockscaled_benches::cases::plan_name(&plan)
    );
    Ok(ok)
}

/// The block-sparse mode: one case, its check against the CPU reference (unless skipped) and
/// its times against the dense peers.
fn run_bsr(
    args: &Args,
    gpu: &Gpu,
    mnkl: &[usize],
    seed: u64,
    tile: Option<Sm90Tile>,
    cluster: Option<ClusterShape>,
) -> Result<bool, String> {
    use blockscaled::SparseSide;
    use blockscaled_benches::bsr::{
        BsrCase, BsrType, Pattern, bsr_header, bsr_line, case_operands, run_bsr as run,
    };
    let side = match args.bsr.as_deref() {
        Some("a") | Some("A") => SparseSide::A,
        Some("b") | Some("B") => SparseSide::B,
        o => return Err(format!("--bsr {o:?}: want a or b (the sparse operand)")),
    };
    let pattern = Pattern::from_name(&args.pattern).ok_or_else(|| {
        format!(
            "--pattern `{}`: want random, banded or block-diagonal",
            args.pattern
        )
    })?;
    let ty = BsrType::from_name(&args.bsr_type)
        .ok_or_else(|| format!("--bsr_type `{}`: want fp8, bf16 or f16", args.bsr_type))?;
    if !(0.0..=1.0).contains(&args.density) {
        return Err(format!("--density {}: want 0 to 1", args.density));
    }
    let (m, n, k) = (mnkl[0], mnkl[1], mnkl[2]);
    let (dense_rows, sparse_rows) = match side {
        SparseSide::B => (m, n),
        SparseSide::A => (n, m),
    };
    let forced =
        tile.is_some() || cluster.is_some() || args.split_k.is_some() || args.group_m.is_some();
    let plan = match (forced, ty) {
        (false, _) => None,
        (true, BsrType::Fp8) => {
            let d = blockscaled::plan::sm90_bsr_default(dense_rows, sparse_rows, gpu.sm_count());
            let (tile, cluster) = (tile.unwrap_or(d.tile), cluster.unwrap_or(d.cluster));
            let units = dense_rows
                .div_ceil((tile.block_m() * cluster.m) as usize)
                .max(1) as u32;
            Some(Plan::Sm90Fp8(
                d.with_tile(tile)
                    .with_cluster(cluster)
                    .with_group_m(args.group_m.unwrap_or(d.group_m).clamp(1, units))
                    .with_split_k(args.split_k.unwrap_or(d.split_k)),
            ))
        }
        (true, BsrType::Bf16 | BsrType::F16) => {
            let runs = args.density * (k / args.bsr_block) as f64;
            let d = blockscaled::plan::sm90_half_bsr_default(
                dense_rows,
                args.bsr_block,
                runs,
                gpu.sm_count(),
            );
            // --mma_tiler_mn M,N: 128 or 256 rows (one or two waves) by 128 or 64 columns.
            let tile = tile.map_or(d.tile, |t| blockscaled::Sm90HalfTile {
                waves: t.block_m() / 128,
                block_n: t.block_n,
            });
            let cluster_m = cluster.map_or(d.cluster_m, |c| c.m);
            let units = dense_rows
                .div_ceil((tile.block_m() * cluster_m) as usize)
                .max(1) as u32;
            Some(Plan::Sm90Half(
                d.with_tile(tile)
                    .with_cluster_m(cluster_m)
                    .with_group_m(args.group_m.unwrap_or(d.group_m).clamp(1, units))
                    .with_split_k(args.split_k.unwrap_or(d.split_k)),
            ))
        }
    };
    let case = BsrCase {
        ty,
        block: args.bsr_block,
        m,
        n,
        k,
        density: args.density,
        pattern,
        side,
        warmup: args.warmup_iterations,
        iters: args.iterations,
        seed,
        plan,
    };
    let mut ok = true;
    if !args.skip_ref_check {
        // The check, on fresh random operands of the same pattern.
        use blockscaled_tests::{bf16_mma_rel, compare_outputs, fp8_accumulation_slack};
        let (dense, _, sparse) = case_operands(&case, seed ^ 0x51)?;
        let e = |x: blockscaled::Error| x.to_string();
        let (dd, ds) = (
            gpu.upload(&dense).map_err(e)?,
            gpu.upload_bsr(&sparse).map_err(e)?,
        );
        let mut c = gpu.output(m, n, 1, OutType::Bf16).map_err(e)?;
        let p = match plan {
            Some(p) => p,
            None => gpu.bsr_plan(&dd, &ds).map_err(e)?,
        };
        gpu.bsr_gemm_with(&dd, &ds, side, &mut c, p).map_err(e)?;
        let got = c.to_host().map_err(e)?;
        let (want, abs) =
            blockscaled::reference::bsr_gemm(&dense, &sparse, side, OutType::Bf16).map_err(e)?;
        let slack = match ty {
            BsrType::Fp8 => fp8_accumulation_slack(&abs),
            BsrType::Bf16 | BsrType::F16 => abs.iter().map(|&s| s * bf16_mma_rel(k)).collect(),
        };
        match compare_outputs(&got, &want, 1.0, &slack) {
            Ok(()) => println!(
                "bsr: check passed ({} of {} elements)",
                got.values.len(),
                got.values.len()
            ),
            Err(msg) => {
                ok = false;
                println!("bsr: CHECK FAILED: {msg}");
            }
        }
    }
    let peer = if args.no_peer {
        None
    } else {
        open_peer(gpu).ok()
    };
    let o = run(gpu, peer.as_ref(), &case)?;
    println!("{}", bsr_header());
    println!("{}", bsr_line(&case, &o));
    Ok(ok)
}

/// The grouped mode: every recipe × case, ours against the cuBLASLt loop, one line each.
fn run_grouped(
    args: &Args,
    gpu: &Gpu,
    recipes: &[Recipe],
    (n, k): (usize, usize),
    seed: u64,
    fp8_tile: Option<Sm90Tile>,
) -> Result<bool, String> {
    use blockscaled::GroupLayout;
    use blockscaled_benches::grouped::{
        GroupedCase, GroupedRoute, SEED_CASES, grouped_header, grouped_line, run_grouped as run,
    };
    // Grouped mode's --kernel: auto (the chosen plan), exact (the kernels that do not fold) or
    // sm90mxfp8 (fold per call).
    let route = match (args.kernel.as_str(), args.fold_weights) {
        ("auto", false) => GroupedRoute::Chosen,
        ("auto", true) => GroupedRoute::FoldedOnce,
        ("exact", false) => GroupedRoute::Exact,
        ("sm90mxfp8", false) => GroupedRoute::Fold,
        (k, f) => {
            return Err(format!(
                "grouped mode takes --kernel auto, exact or sm90mxfp8 (without --fold_weights), \
                 not {k}{}",
                if f { " with --fold_weights" } else { "" }
            ));
        }
    };
    let cases: Vec<(Vec<usize>, usize, usize)> = match (&args.groups, args.group_case) {
        (Some(g), _) => {
            let sizes: Result<Vec<usize>, _> = g.split(',').map(|x| x.trim().parse()).collect();
            vec![(
                sizes.map_err(|_| format!("--groups wants integers, got `{g}`"))?,
                n,
                k,
            )]
        }
        (None, Some(0)) => SEED_CASES
            .iter()
            .map(|(m, n, k)| (m.to_vec(), *n, *k))
            .collect(),
        (None, Some(i @ 1..=4)) => {
            let (m, n, k) = SEED_CASES[i - 1];
            vec![(m.to_vec(), n, k)]
        }
        (None, Some(i)) => {
            return Err(format!(
                "--group_case {i}: the seed has cases 1..4 (0: all)"
            ));
        }
        (None, None) => unreachable!("grouped mode needs --groups or --group_case"),
    };
    let peer = if args.no_peer {
        None
    } else {
        open_peer(gpu)
            .map_err(|e| println!("cuBLASLt unavailable: {e}"))
            .ok()
    };
    println!("{}", grouped_header());
    for &recipe in recipes {
        for (sizes, n, k) in &cases {
            let (layout, capacity) = match args.masked {
                Some(cap) => (GroupLayout::Masked, cap),
                None => (GroupLayout::Contiguous, 0),
            };
            let c = GroupedCase {
                recipe,
                layout,
                sizes: sizes.clone(),
                capacity,
                n: *n,
                k: *k,
                warmup: args.warmup_iterations,
                iters: args.iterations,
                seed,
                route,
                fp8_tile,
            };
            // Folding takes MX and NVFP4 experts; FP8 ones run as they are.
            let c = if route == GroupedRoute::FoldedOnce
                && recipe.b().scale == blockscaled::ScaleType::F32
            {
                GroupedCase {
                    route: GroupedRoute::Chosen,
                    ..c
                }
            } else {
                c
            };
            let o = run(gpu, peer.as_ref(), &c)?;
            println!("{}", grouped_line(&c, &o));
        }
    }
    Ok(true)
}

fn parse_list(s: &str, n: usize, what: &str) -> Result<Vec<usize>, String> {
    let v: Result<Vec<usize>, _> = s.split(',').map(|x| x.trim().parse::<usize>()).collect();
    match v {
        Ok(v) if v.len() == n => Ok(v),
        _ => Err(format!(
            "--{what} wants {n} comma-separated integers, got `{s}`"
        )),
    }
}

fn recipe_from_dtypes(ab: &str, sf: Option<&str>, vec: Option<i64>) -> Result<Recipe, String> {
    let norm = |s: &str| s.to_ascii_lowercase().replace(['_', '-'], "");
    let ab = norm(ab);
    let sf = sf.map(norm).unwrap_or_else(|| "float8e8m0fnu".into());
    let elem = match ab.as_str() {
        "float8e4m3fn" | "e4m3" => "e4m3",
        "float8e5m2" | "e5m2" => "e5m2",
        "float4e2m1fn" | "e2m1" => "e2m1",
        other => {
            return Err(format!(
                "--ab_dtype `{other}`: want Float8E4M3FN, Float8E5M2 or Float4E2M1FN"
            ));
        }
    };
    let scale = match sf.as_str() {
        "float8e8m0fnu" | "e8m0" => "e8m0",
        "float8e4m3fn" | "ue4m3" | "e4m3" => "ue4m3",
        "float32" | "f32" => "f32",
        other => {
            return Err(format!(
                "--sf_dtype `{other}`: want Float8E8M0FNU, Float8E4M3FN or Float32"
            ));
        }
    };
    let fp8 = |e: &str| if e == "e5m2" { Fp8::E5M2 } else { Fp8::E4M3 };
    let r = match (elem, scale, vec) {
        ("e4m3" | "e5m2", "e8m0", None | Some(32)) => Recipe::Mxfp8(fp8(elem)),
        ("e2m1", "e8m0", None | Some(32)) => Recipe::Mxfp4,
        ("e2m1", "e8m0", Some(16)) => Recipe::E2m1E8m0x16,
        ("e2m1", "ue4m3", None | Some(16)) => Recipe::Nvfp4,
        ("e4m3", "f32", None | Some(128)) => Recipe::DeepSeekFp8,
        ("e4m3" | "e5m2", "f32", Some(0)) => Recipe::Fp8PerTensor(fp8(elem)),
        ("e4m3" | "e5m2", "f32", Some(-1)) => Recipe::Fp8PerRow(fp8(elem)),
        _ => {
            return Err(format!(
                "no recipe has {elem} elements with {scale} scales per {vec:?}: see --help for the combinations"
            ));
        }
    };
    Ok(r)
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &Args) -> Result<bool, String> {
    let mnkl = parse_list(&args.mnkl, 4, "mnkl")?;
    let tiler_mn = match &args.mma_tiler_mn {
        None => None,
        Some(t) => match parse_list(t, 2, "mma_tiler_mn")?.as_slice() {
            &[bm, bn] => Some((bm, bn)),
            _ => unreachable!("parse_list returns two values"),
        },
    };
    let fp8_tile = |(bm, bn): (usize, usize)| {
        Sm90Tile::ALL
            .into_iter()
            .find(|t| (t.block_m() as usize, t.block_n as usize) == (bm, bn))
            .ok_or_else(|| {
                "--mma_tiler_mn: the sm90 kernel has tiles of 128,128, 192,128, 256,128, 128,64, \
                 128,144, 128,160, 128,192 and, swapped (M ≤ 64), 16,128, 32,128 and 64,128"
                    .to_string()
            })
    };
    let mx_tile = |(bm, bn): (usize, usize)| {
        Sm90MxTile::ALL
            .into_iter()
            .find(|t| (128, t.block_n as usize) == (bm, bn))
            .ok_or_else(|| {
                "--mma_tiler_mn: the sm90mx kernel has tiles of 128,256 and 128,128".to_string()
            })
    };
    let w4_tile = |(bm, bn): (usize, usize)| {
        Sm90W4Tile::ALL
            .into_iter()
            .find(|t| (t.n as usize, 128) == (bm, bn))
            .ok_or_else(|| {
                "--mma_tiler_mn: the sm90w4 kernel has tiles of 16,128 and 128,128 (M rows, N rows)"
                    .to_string()
            })
    };
    let half = args.ab_dtype.as_deref().and_then(half_type);
    let tiler = match (args.kernel.as_str(), tiler_mn) {
        _ if half.is_some() => None,
        ("sm90mx" | "sm90w4", _) | (_, None) => None,
        (_, Some(t)) => Some(fp8_tile(t)?),
    };
    let cluster = match &args.cluster_shape_mn {
        None => None,
        Some(c) => match parse_list(c, 2, "cluster_shape_mn")?.as_slice() {
            [cm @ (1 | 2), 1] => Some(ClusterShape { m: *cm as u32, n: 1 }),
            [1, 2] => Some(ClusterShape { m: 1, n: 2 }),
            _ => return Err("--cluster_shape_mn: the sm90 kernel takes 1,1, 2,1 (pairs along M share B by multicast) or 1,2 (pairs along N share A)".into()),
        },
    };
    let out = match args
        .c_dtype
        .to_ascii_lowercase()
        .replace(['_', '-'], "")
        .as_str()
    {
        "bfloat16" | "bf16" => OutType::Bf16,
        "float16" | "f16" | "fp16" => OutType::F16,
        "float32" | "f32" | "fp32" => OutType::F32,
        o => {
            return Err(format!(
                "--c_dtype `{o}`: want BFloat16, Float16 or Float32"
            ));
        }
    };
    let recipes: Vec<Recipe> = if half.is_some() {
        Vec::new()
    } else if let Some(ab) = &args.ab_dtype {
        vec![recipe_from_dtypes(
            ab,
            args.sf_dtype.as_deref(),
            args.sf_vec_size,
        )?]
    } else if args.recipe == "all" {
        Recipe::ALL.to_vec()
    } else {
        args.recipe
            .split(',')
            .map(|n| {
                Recipe::from_name(n.trim())
                    .ok_or_else(|| format!("unknown recipe `{n}` (see --help)"))
            })
            .collect::<Result<_, _>>()?
    };
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    // Start-up cost: context, module load (a cubin, or the driver's JIT of the PTX; the JIT's
    // cache in ~/.nv/ComputeCache hides it unless CUDA_CACHE_DISABLE=1), kernel set-up.
    let t0 = std::time::Instant::now();
    let gpu = Gpu::new(args.device).map_err(|e| e.to_string())?;
    println!(
        "Gpu::new: {:.1} ms (image: {}, ptxas {})",
        t0.elapsed().as_secs_f64() * 1e3,
        gpu.image(),
        blockscaled::image::PTXAS_VERSION
    );
    println!("{gpu:?}; seed {seed}");
    if let Some(why) = blockscaled_benches::timing::profiler_attached() {
        println!("CUDA tool attached ({why}): timed without the stream gate");
    }
    if !args.tp
        && !args.ep
        && let Err(why) = blockscaled_benches::ceilings::measure(&gpu)
    {
        println!("ceilings not measured ({why}): no fraction of the ceiling in the tables");
    }
    if args.engine {
        blockscaled_benches::engine::run_engine(&gpu, args.iterations)?;
        return Ok(true);
    }
    if args.moe {
        blockscaled_benches::expert_parallel::run_moe(&gpu, args.iterations)?;
        return Ok(true);
    }
    if args.ep {
        drop(gpu);
        blockscaled_benches::expert_parallel::run_ep(args.iterations)?;
        return Ok(true);
    }
    if args.tp {
        drop(gpu);
        blockscaled_benches::parallel::run_tp(args.iterations)?;
        return Ok(true);
    }
    if let Some(input) = &args.quantize {
        return run_quantize(args, &gpu, &mnkl, seed, input, &recipes);
    }
    if args.epilogue.is_some() || args.out_quant.is_some() {
        return run_fused(args, &gpu, &mnkl, seed, recipes.first().copied());
    }
    if let Some(elem) = half {
        return run_half(args, &gpu, &mnkl, seed, elem, (tiler_mn, cluster, out));
    }
    if args.bsr.is_some() {
        let tile = tiler_mn.map(fp8_tile).transpose()?;
        return run_bsr(args, &gpu, &mnkl, seed, tile, cluster);
    }
    if args.groups.is_some() || args.group_case.is_some() {
        let recipes = if args.recipe == "all" && args.ab_dtype.is_none() {
            vec![Recipe::DeepSeekFp8]
        } else {
            recipes
        };
        let tile = tiler_mn.map(fp8_tile).transpose()?;
        return run_grouped(args, &gpu, &recipes, (mnkl[1], mnkl[2]), seed, tile);
    }
    let plan = match args.kernel.as_str() {
        "auto"
            if args.group_m.is_none()
                && cluster.is_none()
                && tiler.is_none()
                && args.split_k.is_none() =>
        {
            None
        }
        "auto" | "sm90" | "sm90mxfp8" => {
            let d =
                blockscaled::plan::sm90_default(mnkl[0], mnkl[1], mnkl[2], mnkl[3], gpu.sm_count());
            let shape = GemmShape {
                m: mnkl[0],
                n: mnkl[1],
                k: mnkl[2],
                l: mnkl[3],
            };
            // A forced tile other than the default's runs alone unless a cluster is forced too,
            // with a band of the default's rows.
            let d = d.with_tile_for(tiler.unwrap_or(d.tile), &shape);
            let (tile, cluster) = (d.tile, cluster.unwrap_or(d.cluster));
            let group_m = args.group_m.unwrap_or(
                d.group_m
                    .min(Sm90Config::units(tile, cluster, &shape).0.max(1) as u32),
            );
            Some((if args.kernel == "sm90mxfp8" {
                Plan::Sm90MxFp8
            } else {
                Plan::Sm90Fp8
            })(
                d.with_tile(tile)
                    .with_cluster(cluster)
                    .with_group_m(group_m)
                    .with_split_k(args.split_k.unwrap_or(d.split_k)),
            ))
        }
        "sm90mx" => {
            let d = blockscaled::plan::sm90_mx_default(
                mnkl[0],
                mnkl[1],
                mnkl[2],
                mnkl[3],
                gpu.sm_count(),
            );
            let m_tiles = mnkl[0].div_ceil(128) as u32;
            Some(Plan::Sm90Mx(
                d.with_tile(tiler_mn.map(mx_tile).transpose()?.unwrap_or(d.tile))
                    .with_group_m(args.group_m.unwrap_or(d.group_m).clamp(1, m_tiles.max(1)))
                    .with_split_k(args.split_k.unwrap_or(d.split_k)),
            ))
        }
        "sm90w4" => {
            let d = blockscaled::plan::sm90_w4_default(
                mnkl[0],
                mnkl[1],
                mnkl[2],
                mnkl[3],
                gpu.sm_count(),
            );
            let w_tiles = mnkl[1].div_ceil(128) as u32;
            Some(Plan::Sm90W4(
                d.with_tile(tiler_mn.map(w4_tile).transpose()?.unwrap_or(d.tile))
                    .with_group_m(args.group_m.unwrap_or(d.group_m).clamp(1, w_tiles.max(1)))
                    .with_split_k(args.split_k.unwrap_or(d.split_k)),
            ))
        }
        "reference" => Some(Plan::Reference),
        k => {
            return Err(format!(
                "--kernel `{k}`: want auto, reference, sm90, sm90mx, sm90mxfp8 or sm90w4"
            ));
        }
    };
    let peer = if args.no_peer {
        None
    } else {
        match open_peer(&gpu) {
            Ok(p) => Some(p),
            Err(e) => {
                println!("cuBLASLt not available ({e}); peer column empty");
                None
            }
        }
    };
    let (mut rows, mut all_ok) = (Vec::new(), true);
    for (i, &recipe) in recipes.iter().enumerate() {
        let case = Case {
            recipe,
            m: mnkl[0],
            n: mnkl[1],
            k: mnkl[2],
            l: mnkl[3],
            out,
            warmup: args.warmup_iterations,
            iters: args.iterations,
            check: !args.skip_ref_check,
            peer: peer.is_some(),
            seed: seed.wrapping_add(i as u64),
            plan,
        };
        match run_case(&gpu, peer.as_ref(), &case) {
            Ok(o) => {
                match &o.check {
                    Some(Ok(msg)) => println!("{recipe}: check passed: {msg}"),
                    Some(Err(msg)) => {
                        all_ok = false;
                        println!("{recipe}: CHECK FAILED: {msg}");
                    }
                    None => println!("{recipe}: not checked (--skip_ref_check)"),
                }
                if let Some(n) = &o.peer_note {
                    println!("{recipe}: peer: {n}");
                }
                match &o.peer_check {
                    Some(Ok(msg)) => println!("{recipe}: agrees with the peer: {msg}"),
                    Some(Err(msg)) => {
                        all_ok = false;
                        println!("{recipe}: PEER MISMATCH: {msg}");
                    }
                    None => {}
                }
                rows.push(o.row);
            }
            Err(e) => {
                all_ok = false;
                println!("{recipe}: error: {e}");
            }
        }
    }
    print_table(&rows);
    Ok(all_ok)
}

/// `--quantize`: the device quantizers timed (CUDA events, warm-up, medians, inputs rotated past
/// L2) and checked against the host's.
fn run_quantize(
    args: &Args,
    gpu: &Gpu,
    mnkl: &[usize],
    seed: u64,
    input: &str,
    recipes: &[Recipe],
) -> Result<bool, String> {
    use blockscaled_benches::fused::{quantizer_lines, run_quantizers};
    let (rows, k, l) = (mnkl[0], mnkl[2], mnkl[3]);
    let ty = match input {
        "bf16" => blockscaled::InputType::Bf16,
        "f16" => blockscaled::InputType::F16,
        "f32" => blockscaled::InputType::F32,
        o => return Err(format!("--quantize `{o}`: want bf16, f16 or f32")),
    };
    println!("quantize {l}×{rows}×{k} {input}");
    let timing = (args.warmup_iterations, args.iterations, seed);
    let rows = run_quantizers(gpu, (rows, k, l), ty, recipes, timing)?;
    let (lines, ok) = quantizer_lines(&rows);
    for line in lines {
        println!("{line}");
    }
    Ok(ok)
}

/// `--epilogue` / `--out_quant`: the GEMM with a fused epilogue timed beside the plain GEMM with
/// bf16 output and, for a quantized output, beside the same epilogue to bf16 followed by the
/// device quantizer (CUDA events, warm-up, medians); a quantized output is checked bit for bit
/// against the quantizer of the same epilogue's f32 output.
fn run_fused(
    args: &Args,
    gpu: &Gpu,
    mnkl: &[usize],
    seed: u64,
    recipe: Option<Recipe>,
) -> Result<bool, String> {
    use blockscaled_benches::fused::{EpilogueSpec, FusedCase, fused_lines};
    let case = FusedCase {
        recipe: recipe.ok_or("--epilogue: name one --recipe")?,
        mnkl: [mnkl[0], mnkl[1], mnkl[2], mnkl[3]],
        epilogue: EpilogueSpec::parse(args.epilogue.as_deref().unwrap_or(""))?,
        quant: args.out_quant.clone(),
        warmup: args.warmup_iterations,
        iters: args.iterations,
        seed,
    };
    let o = blockscaled_benches::fused::run_fused(gpu, &case)?;
    let (lines, ok) = fused_lines(&case, &o);
    for line in lines {
        println!("{line}");
    }
    Ok(ok)
}
