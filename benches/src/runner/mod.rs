//! The runner's modes (`blockscaled-run`): the flags ([`Args`]), what they parse into, and the
//! dispatch to each mode — dense GEMMs (`dense`), the dense 16-bit GEMM (`half`), block-sparse
//! (`sparse`), grouped (`grouped`), the device quantizers and the fused epilogue (`fused`), and
//! the engine, MoE and multi-GPU tables of their own modules. Each mode prints its rows and, with
//! `--json`, appends them to a JSON Lines file ([`crate::report`]).

mod dense;
mod fused;
mod grouped;
mod half;
mod sparse;

use blockscaled::{ClusterShape, Fp8, Gpu, OutType, Recipe, Sm90MxTile, Sm90Tile, Sm90W4Tile};
use clap::Parser;

use crate::report::{Entry, JsonSink, RunInfo};

#[derive(Parser, Debug)]
#[command(version, about = "Run, check and time block-scaled GEMMs")]
pub struct Args {
    /// Problem size M,N,K,L.
    #[arg(long, default_value = "2048,2048,512,1")]
    pub mnkl: String,
    /// A recipe name (mxfp8-e4m3, mxfp8-e5m2, mxfp4, nvfp4, e2m1-e8m0x16, deepseek-fp8,
    /// fp8-e4m3-tensor, fp8-e5m2-tensor, fp8-e4m3-row, fp8-e5m2-row), `all`, or a comma list.
    /// Overridden by --ab_dtype/--sf_dtype/--sf_vec_size when those are given.
    #[arg(long, default_value = "all")]
    pub recipe: String,
    /// Element type: Float8E4M3FN, Float8E5M2, Float4E2M1FN (or e4m3, e5m2, e2m1); BFloat16 or
    /// Float16 (bf16, f16) run the dense 16-bit GEMM (no block scales; --mma_tiler_mn 128,128,
    /// 256,128, 128,64, 256,64 or 128,256) against cuBLASLt's of the same type.
    #[arg(long = "ab_dtype", alias = "ab-dtype")]
    pub ab_dtype: Option<String>,
    /// Scale type: Float8E8M0FNU, Float8E4M3FN (ue4m3), Float32 (or e8m0, ue4m3, f32).
    #[arg(long = "sf_dtype", alias = "sf-dtype")]
    pub sf_dtype: Option<String>,
    /// Elements per scale along K: 16, 32, 128; with Float32 scales 0 means per tensor, -1 per row.
    #[arg(
        long = "sf_vec_size",
        alias = "sf-vec-size",
        allow_hyphen_values = true
    )]
    pub sf_vec_size: Option<i64>,
    /// Output type: BFloat16 (default), Float16, Float32.
    #[arg(long = "c_dtype", alias = "c-dtype", default_value = "BFloat16")]
    pub c_dtype: String,
    /// Tile M,N of the sm90 kernel: 128,128, 192,128, 256,128, 128,64, wide 128,144, 128,160,
    /// 128,192, or swapped (decode sizes) 16,128, 32,128 or 64,128 (default: the heuristic's).
    #[arg(long = "mma_tiler_mn", alias = "mma-tiler-mn")]
    pub mma_tiler_mn: Option<String>,
    /// Cluster shape M,N (accepted for the fast kernels; the reference kernel runs unclustered).
    #[arg(long = "cluster_shape_mn", alias = "cluster-shape-mn")]
    pub cluster_shape_mn: Option<String>,
    #[arg(long, default_value_t = 20)]
    pub iterations: usize,
    #[arg(
        long = "warmup_iterations",
        alias = "warmup-iterations",
        default_value_t = 3
    )]
    pub warmup_iterations: usize,
    /// Sustained load: every timing (ours and the peer's) after 1,000 launches of its own
    /// instead of the warm-up, so the clocks and power draw are those of a busy GPU; --json rows
    /// are marked so, and the perf tables show them beside the burst rows. The ceilings are
    /// measured as without it.
    #[arg(long)]
    pub sustained: bool,
    /// Measure the GPU's ceilings (copy rate, cuBLASLt's best FP8 GEMM) again, and store them
    /// beside the tuner's plans, instead of reading those stored there.
    #[arg(long = "measure_ceilings", alias = "measure-ceilings")]
    pub measure_ceilings: bool,
    /// Skip the comparison with the CPU reference.
    #[arg(long = "skip_ref_check", alias = "skip-ref-check")]
    pub skip_ref_check: bool,
    /// Do not time cuBLASLt.
    #[arg(long = "no_peer", alias = "no-peer")]
    pub no_peer: bool,
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Kernel: auto (what `gemm` chooses), reference, sm90 (the Hopper FP8 kernel), sm90mx (the
    /// Hopper MX / NVFP4 kernel; --mma_tiler_mn 128,256 or 128,128), sm90mxfp8 (MX operands
    /// folded into FP8 by a pre-pass, then the sm90 kernel with its tiles), sm90w4 (the Hopper
    /// 4-bit-weights kernel, weights converted to bf16; --mma_tiler_mn 16,128 or 128,128),
    /// sm90w4fp8 (the same kernel family on FP8 tensor cores: W4A8 with e8m0 weight scales, K a
    /// multiple of 128) or sm90w4stream (its stream kernel: bf16 or e4m3 activations, M ≤ 16;
    /// --split_k); both also take e2m1 activations with the weights' e8m0 scales, folded per
    /// call.
    #[arg(long, default_value = "auto")]
    pub kernel: String,
    /// sm90 split-K: K ranges computed by separate CTAs and summed by the last of each tile (default: the
    /// heuristic's; 1 = none).
    #[arg(long = "split_k", alias = "split-k")]
    pub split_k: Option<u32>,
    /// sm90 scheduler band height in M tiles (default: the heuristic's).
    #[arg(long = "group_m", alias = "group-m")]
    pub group_m: Option<u32>,
    /// Seed of the random inputs (default: a fresh one, printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Grouped GEMM: rows per group (e.g. 80,176,128); N and K come from --mnkl (M and L are
    /// ignored). Each group multiplies its rows by its own expert (G × N × K).
    #[arg(long)]
    pub groups: Option<String>,
    /// Grouped GEMM: one of the seed's cases 1..4 (their G, M per group, N, K), or 0 for all four.
    #[arg(long = "group_case", alias = "group-case")]
    pub group_case: Option<usize>,
    /// Grouped GEMM with the masked layout (G × capacity rows, counts on the device) of this
    /// capacity; default: the contiguous layout.
    #[arg(long)]
    pub masked: Option<usize>,
    /// Grouped GEMM: fold MX / NVFP4 experts to FP8 once before timing (`Gpu::fold_to_fp8`, as
    /// at model load), so each call folds only the activations.
    #[arg(long = "fold_weights", alias = "fold-weights")]
    pub fold_weights: bool,
    /// Block-sparse GEMM with this operand sparse (a or b) (--mnkl gives M, N, K; L is 1). Timed
    /// against our dense kernel and cuBLASLt dense on the same shape. --mma_tiler_mn (FP8:
    /// 128,128 or 128,64; 16-bit: 128 or 256 rows by 128 or 64), --cluster_shape_mn 1,1 or 2,1
    /// (FP8), --split_k the most parts a long block row is cut into.
    #[arg(long)]
    pub bsr: Option<String>,
    /// Block-sparse GEMM: the blocks' type, fp8 (e4m3 128 × 128 blocks with fp32 scales, the
    /// dense operand DeepSeek-style), bf16 or f16 (both operands).
    #[arg(long = "bsr_type", alias = "bsr-type", default_value = "fp8")]
    pub bsr_type: String,
    /// Block-sparse GEMM: the block size (FP8: 128; bf16 / f16: 64 or 128).
    #[arg(long = "bsr_block", alias = "bsr-block", default_value_t = 128)]
    pub bsr_block: usize,
    /// Block-sparse GEMM: stored blocks over all blocks (0 to 1).
    #[arg(long, default_value_t = 0.1)]
    pub density: f64,
    /// Block-sparse GEMM: random, banded or block-diagonal.
    #[arg(long, default_value = "random")]
    pub pattern: String,
    /// Time the device quantizers instead of a GEMM: a tensor of --mnkl's M rows × K columns × L
    /// of this type (bf16, f16 or f32) into each --recipe's A format (NVFP4 with its tensor scale
    /// given, as a serving stack passes it), checked bit for bit against the host quantizer.
    /// Reports GB/s of bytes read + written and the fraction of the 3.0 TB/s copy ceiling.
    #[arg(long)]
    pub quantize: Option<String>,
    /// A fused epilogue, comma-separated: alpha=X, beta (β·C with β = 0.5), bias, relu, gelu,
    /// gelu-tanh, silu, swiglu, residual. Times the GEMM with it beside the plain GEMM with
    /// bf16 output (and, with --out_quant, beside the GEMM + the standalone quantizer).
    #[arg(long)]
    pub epilogue: Option<String>,
    /// The fused epilogue's output quantized: fp8-1x128, mxfp8, mxfp4 or nvfp4 (its tensor scale
    /// given).
    #[arg(long = "out_quant")]
    pub out_quant: Option<String>,
    /// Use from an engine: GEMMs on views of caller memory against crate-owned matrices (every
    /// family), quantize → GEMM on a caller's stream, and two threads on two streams.
    #[arg(long)]
    pub engine: bool,
    /// Tensor parallelism on two GPUs (NCCL): a DeepSeek-FP8 MLP on one GPU against two.
    #[arg(long)]
    pub tp: bool,
    /// Expert parallelism on two GPUs (NCCL): DeepSeek-V3- and Mixtral-like MoE layers, tokens
    /// per second on one GPU against two, with the exchanges' and the experts' times.
    #[arg(long)]
    pub ep: bool,
    /// The MoE layer on one GPU: DeepSeek-V3- and Mixtral-like layers, the step and its grouped
    /// GEMMs alone.
    #[arg(long)]
    pub moe: bool,
    /// Also append each measured row to this file as one JSON object a line (JSON Lines: GPU,
    /// date, version, kind, name, M N K L, µs, TFLOP/s, GB/s, fraction of the ceiling, peer);
    /// `blockscaled-perf-table` turns such files into docs/PERF.md.
    #[arg(long, value_name = "PATH")]
    pub json: Option<std::path::PathBuf>,
}

/// What the flags parse into, shared by the modes.
struct Setup {
    /// M, N, K, L.
    mnkl: Vec<usize>,
    seed: u64,
    /// `--mma_tiler_mn`.
    tiler_mn: Option<(usize, usize)>,
    /// `--mma_tiler_mn` as the FP8 kernel's tile (dense FP8 kernels).
    tiler: Option<Sm90Tile>,
    cluster: Option<ClusterShape>,
    out: OutType,
    recipes: Vec<Recipe>,
}

/// The 16-bit element type `--ab_dtype` names, if it names one.
fn half_type(s: &str) -> Option<blockscaled::ElemType> {
    match s.to_ascii_lowercase().replace(['_', '-'], "").as_str() {
        "bfloat16" | "bf16" => Some(blockscaled::ElemType::BF16),
        "float16" | "f16" | "fp16" => Some(blockscaled::ElemType::F16),
        _ => None,
    }
}

/// `--mma_tiler_mn` as a tile of the sm90 FP8 kernel.
fn fp8_tile((bm, bn): (usize, usize)) -> Result<Sm90Tile, String> {
    Sm90Tile::ALL
        .into_iter()
        .find(|t| (t.block_m() as usize, t.block_n as usize) == (bm, bn))
        .ok_or_else(|| {
            "--mma_tiler_mn: the sm90 kernel has tiles of 128,128, 192,128, 256,128, 128,64, \
             128,144, 128,160, 128,192 and, swapped (M ≤ 64), 16,128, 32,128 and 64,128"
                .to_string()
        })
}

/// `--mma_tiler_mn` as a tile of the sm90 MX kernel.
fn mx_tile((bm, bn): (usize, usize)) -> Result<Sm90MxTile, String> {
    Sm90MxTile::ALL
        .into_iter()
        .find(|t| (128, t.block_n as usize) == (bm, bn))
        .ok_or_else(|| {
            "--mma_tiler_mn: the sm90mx kernel has tiles of 128,256 and 128,128".to_string()
        })
}

/// `--mma_tiler_mn` as a tile of the sm90 4-bit-weights kernel.
fn w4_tile((bm, bn): (usize, usize)) -> Result<Sm90W4Tile, String> {
    Sm90W4Tile::ALL
        .into_iter()
        .find(|t| (t.n as usize, 128) == (bm, bn))
        .ok_or_else(|| {
            "--mma_tiler_mn: the sm90w4 kernel has tiles of 16,128 and 128,128 (M rows, N rows)"
                .to_string()
        })
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

/// Runs what `args` ask: `Ok(true)` when every check passed, `Ok(false)` when one failed, `Err`
/// when the run could not be made.
pub fn run(args: &Args) -> Result<bool, String> {
    let mnkl = parse_list(&args.mnkl, 4, "mnkl")?;
    let tiler_mn = match &args.mma_tiler_mn {
        None => None,
        Some(t) => match parse_list(t, 2, "mma_tiler_mn")?.as_slice() {
            &[bm, bn] => Some((bm, bn)),
            _ => unreachable!("parse_list returns two values"),
        },
    };
    let half = args.ab_dtype.as_deref().and_then(half_type);
    let tiler = match (args.kernel.as_str(), tiler_mn) {
        _ if half.is_some() => None,
        ("sm90mx" | "sm90w4" | "sm90w4fp8" | "sm90w4stream", _) | (_, None) => None,
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
    if let Some(why) = crate::timing::profiler_attached() {
        println!("CUDA tool attached ({why}): timed without the stream gate");
    }
    if !args.tp
        && !args.ep
        && let Err(why) = crate::ceilings::measure(&gpu, args.measure_ceilings)
    {
        println!("ceilings not measured ({why}): no fraction of the ceiling in the tables");
    }
    if args.sustained {
        crate::timing::set_sustained(crate::timing::SUSTAINED_LAUNCHES);
        println!(
            "sustained load: {} launches before every timing",
            crate::timing::SUSTAINED_LAUNCHES
        );
    }
    let mut sink = JsonSink::open(args.json.as_deref(), RunInfo::of(&gpu))?;
    let setup = Setup {
        mnkl,
        seed,
        tiler_mn,
        tiler,
        cluster,
        out,
        recipes,
    };
    dispatch(args, gpu, &setup, half, &mut sink)
}

/// The mode `args` name, on `gpu`, its rows appended to `sink` as they are measured: whether
/// every check passed.
fn dispatch(
    args: &Args,
    gpu: Gpu,
    s: &Setup,
    half: Option<blockscaled::ElemType>,
    sink: &mut JsonSink,
) -> Result<bool, String> {
    let iters = args.iterations;
    let table: fn(Vec<Entry>, &mut JsonSink) -> Result<bool, String> = |rows, sink| {
        sink.emit(&rows)?;
        Ok(true)
    };
    if args.engine {
        return table(crate::engine::run_engine(&gpu, iters)?, sink);
    }
    if args.moe {
        return table(crate::expert_parallel::run_moe(&gpu, iters)?, sink);
    }
    if args.ep {
        drop(gpu);
        return table(crate::expert_parallel::run_ep(iters)?, sink);
    }
    if args.tp {
        drop(gpu);
        return table(crate::parallel::run_tp(iters)?, sink);
    }
    if let Some(input) = &args.quantize {
        return fused::run_quantize(args, &gpu, s, input, sink);
    }
    if args.epilogue.is_some() || args.out_quant.is_some() {
        return fused::run_fused(args, &gpu, s, sink);
    }
    if let Some(elem) = half {
        return half::run_half(args, &gpu, s, elem, sink);
    }
    if args.bsr.is_some() {
        let tile = s.tiler_mn.map(fp8_tile).transpose()?;
        return sparse::run_bsr(args, &gpu, s, tile, sink);
    }
    if args.groups.is_some() || args.group_case.is_some() {
        let recipes = if args.recipe == "all" && args.ab_dtype.is_none() {
            vec![Recipe::DeepSeekFp8]
        } else {
            s.recipes.clone()
        };
        let tile = s.tiler_mn.map(fp8_tile).transpose()?;
        return grouped::run_grouped(args, &gpu, &recipes, s, tile, sink);
    }
    dense::run_dense(args, &gpu, s, sink)
}
