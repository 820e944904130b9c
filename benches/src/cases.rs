//! One benchmark case, shared by the runner (`blockscaled-run`) and `cargo bench`: random inputs
//! quantized into a recipe, our `gemm` timed with CUDA events (warm-up, median, rotating input
//! sets when the inputs would sit in L2), the result checked, and the closest cuBLASLt peer timed
//! in the same process on the same stream — and its result compared with ours, element by element,
//! within the bound both computations' arithmetic allows (an independent oracle at every size).

use std::sync::Arc;

use blockscaled::kernels::format::fold;
use blockscaled::{
    DeviceMatrix, ElemType, Gpu, HostOutput, OutType, Plan, Recipe, ScaleType, ScaledMatrix,
    reference,
};
use blockscaled_tests::{
    FP8_ACCUMULATION_REL, abs_matrix, compare_outputs, fp8_accumulation_slack, random_values,
    random_weights, reference_output,
};
use cudarc::driver::CudaSlice;

use crate::cublaslt::{
    LtPeer, PeerError, blk128_index, blk128_len, blocks128, vec128_index, vec128_len,
};
use crate::table::Row;
use crate::timing::{rotation_count, time_on_stream};

/// The ceilings of the GPU in use ([`crate::ceilings`], measured when the run starts), or none
/// (0: no fraction printed) where the run did not measure them.
fn ceilings() -> (f64, f64) {
    crate::ceilings::get().map_or((0.0, 0.0), |c| (c.tflops, c.gbs))
}
/// H100 L2 size (50 MiB): inputs smaller than a few times this are rotated.
pub const L2_BYTES: usize = 50 << 20;

/// What to run.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub recipe: Recipe,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub l: usize,
    pub out: OutType,
    pub warmup: usize,
    pub iters: usize,
    pub check: bool,
    pub peer: bool,
    pub seed: u64,
    /// Force a kernel and configuration (default: what `Gpu::gemm` chooses).
    pub plan: Option<Plan>,
}

/// The result of one case.
pub struct Outcome {
    pub row: Row,
    /// The plan that ran.
    pub plan: Plan,
    /// `Some(Ok)` checked and right, `Some(Err(msg))` checked and wrong, `None` not checked.
    pub check: Option<Result<String, String>>,
    /// Why the peer has no number, when it has none.
    pub peer_note: Option<String>,
    /// Our result against the peer's, when the peer computed the same product: `Ok(summary)`
    /// within the bound, `Err(msg)` beyond it.
    pub peer_check: Option<Result<String, String>>,
}

/// Largest M·N·K·L the CPU reference is asked to check (about a second on 16 cores).
const CPU_CHECK_LIMIT: f64 = 2.0 * 8.6e9;

pub fn run_case(gpu: &Gpu, peer: Option<&LtPeer>, c: &Case) -> Result<Outcome, String> {
    let e = |x: blockscaled::Error| x.to_string();
    let va = random_values(c.seed, c.l * c.m * c.k, c.k);
    // B is the weights: a trained model's magnitudes (which decide the 4-bit kernels' path).
    let vb = random_weights(c.seed ^ 0x5DEE_CE66_D1CE_4E5B, c.l * c.n * c.k, c.k);
    let a = ScaledMatrix::quantize(&va, c.m, c.k, c.l, c.recipe.a()).map_err(e)?;
    let b = ScaledMatrix::quantize(&vb, c.n, c.k, c.l, c.recipe.b()).map_err(e)?;
    let in_bytes = a.data().len() + a.scales().len() + b.data().len() + b.scales().len();
    let out_bytes = c.l * c.m * c.n * c.out.bytes();
    let sets = rotation_count(in_bytes + out_bytes, L2_BYTES);
    let ins: Vec<(DeviceMatrix, DeviceMatrix)> = (0..sets)
        .map(|_| Ok((gpu.upload(&a)?, gpu.upload(&b)?)))
        .collect::<Result<_, blockscaled::Error>>()
        .map_err(e)?;
    let mut outs = (0..sets)
        .map(|_| gpu.output(c.m, c.n, c.l, c.out))
        .collect::<Result<Vec<_>, _>>()
        .map_err(e)?;

    let plan = match c.plan {
        Some(p) => p,
        None => gpu.plan(&ins[0].0, &ins[0].1).map_err(e)?,
    };
    // The warm-up reaches every input set, so that what a GEMM makes at an operand's first use
    // (the FP8 B-role scales, the fold's row maxima, the 4-bit weights' reorder: a model's
    // weights get them once, at load) lands in no timed iteration.
    let t = time_on_stream(gpu.stream(), c.warmup.max(sets), c.iters, |i| {
        let s = i % sets;
        gpu.gemm_with(&ins[s].0, &ins[s].1, &mut outs[s], plan)
    })
    .map_err(e)?;

    let check = if !c.check {
        None
    } else if (c.m * c.n * c.k * c.l) as f64 > CPU_CHECK_LIMIT {
        // Not a failure: say so and leave it unchecked (the GPU tests check large shapes against
        // the GPU reference kernel).
        println!(
            "{}: {}x{}x{}x{} is too large for the CPU reference here: not checked",
            c.recipe, c.m, c.n, c.k, c.l
        );
        None
    } else {
        // A fresh, poisoned output, one more launch, every element compared.
        let mut o = gpu.output(c.m, c.n, c.l, c.out).map_err(e)?;
        gpu.gemm_with(&ins[0].0, &ins[0].1, &mut o, plan)
            .map_err(e)?;
        let got = o.to_host().map_err(e)?;
        // The fold path computes on the folded operands: its reference is theirs (the fold's own
        // error is bounded and tested element by element: `format::fold`, gpu_mx).
        // So does the 4-bit-weights kernels' path for e2m1 activations, on A folded.
        let folds_a = a.format().elem == ElemType::E2M1
            && matches!(plan, Plan::Sm90W4(cfg) if cfg.fp8 || cfg.stream);
        let (want, abs) = if let Plan::Sm90MxFp8(_) = plan {
            let (fa, fb) = (
                a.fold_to_fp8(false).map_err(e)?,
                b.fold_to_fp8(true).map_err(e)?,
            );
            reference_output(&fa, &fb, c.out)?
        } else if folds_a {
            reference_output(&a.fold_to_fp8(false).map_err(e)?, &b, c.out)?
        } else {
            reference_output(&a, &b, c.out)?
        };
        // The reference kernel differs from the CPU only by float64 summation order; tensor-core
        // kernels by FP8 accumulation (see blockscaled_tests::fp8_accumulation_slack).
        let (slack, what) = match plan {
            Plan::Reference => (
                abs.iter()
                    .map(|&s| reference::sum_error_bound(c.k, s))
                    .collect(),
                "1 ulp + float64 summation bound",
            ),
            Plan::Sm90Fp8(_) => (
                fp8_accumulation_slack(&abs),
                "1 ulp + 2^-7·Σ|ab| FP8 accumulation bound",
            ),
            Plan::Sm90MxFp8(_) => (
                fp8_accumulation_slack(&abs),
                "the CPU reference on the folded operands (bit-identical to the GPU's fold), \
                 1 ulp + 2^-7·Σ|ab| FP8 accumulation bound",
            ),
            // The codes fold into e4m3 exactly; the sums are FP8 tensor-core sums per 128 of K.
            Plan::Sm90W4(cfg) if cfg.fp8 => (
                fp8_accumulation_slack(&abs),
                "1 ulp + 2^-7·Σ|ab| FP8 accumulation bound (4-bit weights folded exactly into e4m3)",
            ),
            Plan::Sm90Mx(_) | Plan::Sm90W4(_) | Plan::Sm90Half(_) => (
                abs.iter()
                    .map(|&s| s * blockscaled_tests::bf16_mma_rel(c.k))
                    .collect(),
                "1 ulp + (K/8 + 1)·2^-23·Σ|ab| fp32 accumulation bound",
            ),
            p => return Err(format!("{p:?}: no error bound for this kernel")),
        };
        Some(compare_outputs(&got, &want, 1.0, &slack).map(|_| {
            format!(
                "all {} elements match the CPU reference ({what})",
                got.values.len()
            )
        }))
    };

    let (mut peer_ms, mut peer_name, mut peer_note, mut peer_check) =
        (None, "-".into(), None, None);
    match (peer, c.peer, c.l) {
        (Some(p), true, 1) => match time_peer(p, c, &a, &b, sets) {
            Ok(r) => {
                peer_check = Some(agree_with_peer(gpu, plan, (&a, &b), &ins[0], c, &r));
                (peer_ms, peer_name) = (Some(r.ms), r.name);
            }
            Err((name, err)) => (peer_name, peer_note) = (name, Some(err)),
        },
        (_, true, l) if l > 1 => peer_note = Some("peer timed for L = 1 only".into()),
        _ => {}
    }

    Ok(Outcome {
        row: Row {
            name: format!("{} {} ({})", plan_name(&plan), c.recipe, c.out.name()),
            shape: (c.m, c.n, c.k, c.l),
            ms: t.median_ms,
            flops: 2.0 * (c.m * c.n * c.k * c.l) as f64,
            bytes: (in_bytes + out_bytes) as f64,
            peer_ms,
            peer_name,
            ceiling_tflops: ceilings().0,
            ceiling_gbs: ceilings().1,
        },
        plan,
        check,
        peer_note,
        peer_check,
    })
}

/// What the peer computed: its median time, its name, its result (M×N bf16, from the same
/// quantized inputs as ours) and the bound on its error relative to Σ_k |a_k·b_k|.
struct PeerRun {
    ms: f64,
    name: String,
    result: HostOutput,
    rel_bound: f64,
}

/// Our result (one more launch into a fresh, poisoned bf16 output) against the peer's, every
/// element. Both computed the product of the same quantized inputs, each within its own bound of
/// the exact sum — ours 2^-7·Σ|ab| on FP8 tensor cores (`fp8_accumulation_slack`), a float64
/// rounding on the reference kernel; the peer's in [`PeerRun::rel_bound`] — so the two differ by
/// at most the sum of the bounds plus one bf16 unit for the two output roundings. Σ|ab| comes
/// from the GPU reference kernel on |A|·|B|ᵀ (float64 accumulation, rounded to f32: the bound is
/// widened by 2^-20 for that rounding).
fn agree_with_peer(
    gpu: &Gpu,
    plan: Plan,
    (a, b): (&ScaledMatrix, &ScaledMatrix),
    (da, db): &(DeviceMatrix, DeviceMatrix),
    c: &Case,
    peer: &PeerRun,
) -> Result<String, String> {
    let e = |x: blockscaled::Error| x.to_string();
    let mut o = gpu.output(c.m, c.n, 1, OutType::Bf16).map_err(e)?;
    gpu.gemm_with(da, db, &mut o, plan).map_err(e)?;
    let ours = o.to_host().map_err(e)?;
    let (aa, ab) = (
        gpu.upload(&abs_matrix(a)).map_err(e)?,
        gpu.upload(&abs_matrix(b)).map_err(e)?,
    );
    let mut s = gpu.output(c.m, c.n, 1, OutType::F32).map_err(e)?;
    gpu.reference_gemm(&aa, &ab, &mut s).map_err(e)?;
    let abs = s.to_host().map_err(e)?.values;
    let ours_rel = match plan {
        Plan::Reference => 0.0,
        Plan::Sm90Fp8(_) => FP8_ACCUMULATION_REL,
        // The fold keeps e8m0-scaled elements exact (but below the FP8 normal range) and rounds
        // NVFP4 ones by at most NV_MAX_REL of themselves, in both operands: their product by
        // (1 + r)² − 1 (subnormal results, which Σ|ab| does not bound, are left to the
        // element-by-element tests of `format::fold` and `fold_to_fp8`).
        Plan::Sm90MxFp8(_) => {
            let r = if a.format().scale == ScaleType::UE4M3 {
                fold::NV_MAX_REL as f64
            } else {
                0.0
            };
            FP8_ACCUMULATION_REL + (1.0 + r) * (1.0 + r) - 1.0
        }
        Plan::Sm90W4(cfg) if cfg.fp8 => FP8_ACCUMULATION_REL,
        Plan::Sm90Mx(_) | Plan::Sm90W4(_) | Plan::Sm90Half(_) => {
            blockscaled_tests::bf16_mma_rel(c.k)
        }
        p => return Err(format!("{p:?}: no error bound for this kernel")),
    };
    let rel = (ours_rel + peer.rel_bound) * (1.0 + 2f64.powi(-20));
    let slack: Vec<f64> = abs.iter().map(|&x| rel * x as f64).collect();
    // The largest difference relative to the peer's value (over elements not far below the
    // largest, where cancellation makes relative differences meaningless) and relative to Σ|ab|.
    let big = peer.result.values.iter().fold(0f32, |m, v| m.max(v.abs())) * 2f32.powi(-10);
    let (mut rel_val, mut rel_abs) = (0f64, 0f64);
    for ((&x, &y), &s) in ours.values.iter().zip(&peer.result.values).zip(&abs) {
        let d = (x as f64 - y as f64).abs();
        if y.abs() >= big && y != 0.0 {
            rel_val = rel_val.max(d / y.abs() as f64);
        }
        if s > 0.0 {
            rel_abs = rel_abs.max(d / s as f64);
        }
    }
    let summary = format!(
        "{} elements against {}: max |ours − peer| / |peer| {rel_val:.2e}, / Σ|ab| {rel_abs:.2e} \
         (bound {rel:.2e} + 1 bf16 unit)",
        ours.values.len(),
        peer.name
    );
    compare_outputs(&ours, &peer.result, 1.0, &slack)
        .map(|_| summary.clone())
        .map_err(|m| format!("{summary}: {m}"))
}

/// The closest cuBLASLt operation: blockwise FP8 for DeepSeek, per-tensor FP8 for per-tensor e4m3,
/// bf16 on the dequantized inputs for everything else (Hopper's cuBLASLt has no MX / NVFP4 GEMM).
///
/// The peer rotates among `sets` copies of its inputs and outputs, as our kernel does (the same
/// count), so neither side reads operands left in L2 by the previous iteration.
fn time_peer(
    p: &LtPeer,
    c: &Case,
    a: &ScaledMatrix,
    b: &ScaledMatrix,
    sets: usize,
) -> Result<PeerRun, (String, String)> {
    let s = p.stream().clone();
    let (m, n, k) = (c.m, c.n, c.k);
    let fmt_err = |name: &str, x: PeerError| (name.to_string(), x.to_string());
    let drv = |name: &str, x: cudarc::driver::DriverError| (name.to_string(), x.to_string());
    let up = |name: &str, v: &[u8]| copies(&s, v, sets).map_err(|x| drv(name, x));
    let up_f32 = |name: &str, v: &[f32]| copies(&s, v, sets).map_err(|x| drv(name, x));
    let mut out: Vec<CudaSlice<u16>> = (0..sets)
        .map(|_| s.alloc_zeros(m * n).map_err(|x| drv("cuBLASLt", x)))
        .collect::<Result<_, _>>()?;
    // (As ours: a warm-up that reaches every set.)
    let (warm, iters) = (c.warmup.max(sets), c.iters);
    // The peer's result (every set computed the same product) as a host M×N bf16 output.
    let result = |out: &CudaSlice<u16>, name: &str| -> Result<HostOutput, (String, String)> {
        let bits = s.clone_dtoh(out).map_err(|x| drv(name, x))?;
        s.synchronize().map_err(|x| drv(name, x))?;
        let bytes: Vec<u8> = bits.iter().flat_map(|v| v.to_le_bytes()).collect();
        Ok(HostOutput::from_bytes(OutType::Bf16, m, n, 1, &bytes))
    };
    // FP8 accumulation on tensor cores, promoted to fp32 (cuBLASLt's default, no fast
    // accumulation): the bound assumed for ours.
    let fp8_rel = FP8_ACCUMULATION_REL;
    match c.recipe {
        Recipe::DeepSeekFp8 if k % 128 == 0 => {
            let name = "cuBLASLt fp8 1x128/128x128";
            let mut sa = vec![0f32; vec128_len(m, k)];
            for mi in 0..m {
                for kb in 0..k / 128 {
                    sa[vec128_index(mi, kb, m)] = a.scale_value(0, mi, kb * 128) as f32;
                }
            }
            let mut sb = vec![1e6f32; blk128_len(n, k)];
            for nb in 0..blocks128(n) {
                for kb in 0..k / 128 {
                    sb[blk128_index(nb, kb, k)] = b.scale_value(0, nb * 128, kb * 128) as f32;
                }
            }
            let (da, db) = (up(name, a.data())?, up(name, b.data())?);
            let (dsa, dsb) = (up_f32(name, &sa)?, up_f32(name, &sb)?);
            let t = time_on_stream(&s, warm, iters, |i| {
                let r = i % sets;
                p.gemm_fp8_blockwise(m, n, k, &da[r], &dsa[r], &db[r], &dsb[r], &mut out[r])
            })
            .map_err(|x| fmt_err(name, x))?;
            Ok(PeerRun {
                ms: t.median_ms,
                name: name.into(),
                result: result(&out[0], name)?,
                rel_bound: fp8_rel,
            })
        }
        Recipe::Fp8PerTensor(blockscaled::Fp8::E4M3) => {
            let name = "cuBLASLt fp8 per-tensor";
            let (da, db) = (up(name, a.data())?, up(name, b.data())?);
            let dsa = up_f32(name, &[a.scale_value(0, 0, 0) as f32])?;
            let dsb = up_f32(name, &[b.scale_value(0, 0, 0) as f32])?;
            let t = time_on_stream(&s, warm, iters, |i| {
                let r = i % sets;
                p.gemm_fp8_per_tensor(m, n, k, &da[r], &dsa[r], &db[r], &dsb[r], &mut out[r])
            })
            .map_err(|x| fmt_err(name, x))?;
            Ok(PeerRun {
                ms: t.median_ms,
                name: name.into(),
                result: result(&out[0], name)?,
                rel_bound: fp8_rel,
            })
        }
        _ => {
            let name = "cuBLASLt bf16";
            let to_bf16 = |v: Vec<f64>| {
                v.into_iter()
                    .map(|x| half::bf16::from_f64(x).to_bits())
                    .collect::<Vec<u16>>()
            };
            let (ha, hb) = (to_bf16(a.dequantize()), to_bf16(b.dequantize()));
            let (da, db) = (
                copies(&s, &ha, sets).map_err(|x| drv(name, x))?,
                copies(&s, &hb, sets).map_err(|x| drv(name, x))?,
            );
            let t = time_on_stream(&s, warm, iters, |i| {
                let r = i % sets;
                p.gemm_bf16(m, n, k, &da[r], &db[r], &mut out[r])
            })
            .map_err(|x| fmt_err(name, x))?;
            // Each dequantized input rounded to bf16 (relative 2^-8), so each product within
            // 2^-7 + 2^-16 of ours; then fp32 accumulation of K terms (K·2^-24).
            let rel_bound = 2f64.powi(-7) + 2f64.powi(-16) + k as f64 * 2f64.powi(-24);
            Ok(PeerRun {
                ms: t.median_ms,
                name: name.into(),
                result: result(&out[0], name)?,
                rel_bound,
            })
        }
    }
}

/// `sets` device copies of one host buffer (inputs rotated like ours, so neither side reads
/// operands left in L2 by the previous iteration).
fn copies<T: cudarc::driver::DeviceRepr>(
    s: &Arc<cudarc::driver::CudaStream>,
    v: &[T],
    sets: usize,
) -> Result<Vec<CudaSlice<T>>, cudarc::driver::DriverError> {
    (0..sets).map(|_| s.clone_htod(v)).collect()
}

/// Short kernel name for tables.
pub fn plan_name(p: &Plan) -> String {
    match p {
        Plan::Reference => "ref".into(),
        Plan::Sm90Half(c) => {
            let split = if c.split_k > 1 {
                format!("s{}", c.split_k)
            } else {
                String::new()
            };
            let pair = if c.cluster_m > 1 { "c2" } else { "" };
            format!("half-{}x{}{pair}{split}", c.tile.block_m(), c.tile.block_n)
        }
        Plan::Sm90MxFp8(c) => format!("fold+{}", plan_name(&Plan::Sm90Fp8(*c))),
        Plan::Sm90Mx(c) => {
            let split = if c.split_k > 1 {
                format!("s{}", c.split_k)
            } else {
                String::new()
            };
            format!("mx128x{}{split}", c.tile.block_n)
        }
        Plan::Sm90W4(c) => {
            let split = if c.split_k > 1 {
                format!("s{}", c.split_k)
            } else {
                String::new()
            };
            if c.stream {
                format!("w4stream{split}")
            } else if c.fp8 {
                format!("w4fp8x{}{split}", c.tile.n)
            } else {
                format!("w4x{}{split}", c.tile.n)
            }
        }
        Plan::Sm90Fp8(c) => {
            // c2: pair along M; cn2: pair along N.
            let cluster = if c.cluster.n > 1 {
                format!("cn{}", c.cluster.n)
            } else {
                format!("c{}", c.cluster.m)
            };
            let split = if c.split_k > 1 {
                format!("s{}", c.split_k)
            } else {
                String::new()
            };
            let n = if c.tile.block_n == 128 {
                String::new()
            } else {
                format!("n{}", c.tile.block_n)
            };
            format!(
                "sm90/m{}{n}g{}{cluster}{split}",
                c.tile.block_m(),
                c.group_m
            )
        }
        p => format!("{p:?}"),
    }
}

/// Opens the peer on the GPU's stream, or says why not.
pub fn open_peer(gpu: &Gpu) -> Result<LtPeer, String> {
    LtPeer::new(Arc::clone(gpu.stream())).map_err(|e| e.to_string())
}
