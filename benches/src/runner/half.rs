//! The dense 16-bit mode (`--ab_dtype BFloat16` or `Float16`): no block scales, the sm90 16-bit
//! kernel against cuBLASLt's GEMM of the same type.

use blockscaled::{
    ElemType, Fp4Weights, Gpu, OperandFormat, Plan, Recipe, ScaledMatrix, Sm90HalfTile,
};

use super::{Args, JsonSink, Setup};
use crate::cases::{open_peer, plan_name};
use crate::report::{self, Entry};
use crate::timing::time_on_stream;

/// The dense 16-bit mode: A and B of `elem` (fresh random values), the 16-bit kernel with the
/// tile, cluster, split and band flags, its check against the CPU reference (unless skipped), and
/// its time against cuBLASLt's GEMM of the same type on the same codes (L = 1), in one run.
pub(super) fn run_half(
    args: &Args,
    gpu: &Gpu,
    s: &Setup,
    elem: ElemType,
    sink: &mut JsonSink,
) -> Result<bool, String> {
    let (tiler_mn, cluster, out, seed) = (s.tiler_mn, s.cluster, s.out, s.seed);
    let (m, n, k, l) = (s.mnkl[0], s.mnkl[1], s.mnkl[2], s.mnkl[3]);
    let e = |x: blockscaled::Error| x.to_string();
    let format = OperandFormat {
        elem,
        ..Recipe::W4A16(Fp4Weights::Nvfp4).a()
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
    let peer_name = if elem == ElemType::BF16 {
        "cuBLASLt bf16"
    } else {
        "cuBLASLt f16"
    };
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
            if elem == ElemType::BF16 {
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
        plan_name(&plan)
    );
    let bytes = (2 * (m + n) * k * l + m * n * l * out.bytes()) as f64;
    let row = report::row(
        format!("{} {} ({})", plan_name(&plan), elem.name(), out.name()),
        (m, n, k, l),
        (ours.median_ms, flops, bytes),
        peer.map(|p| (peer_name, p.median_ms)),
    );
    sink.emit(&[Entry::new("16-bit", row).plan(plan_name(&plan))])?;
    Ok(ok)
}
