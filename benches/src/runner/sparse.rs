//! The block-sparse mode (`--bsr a|b`): one case — the plan the tile, cluster, split and band
//! flags force, or the chosen one — checked against the CPU reference unless skipped, and timed
//! against our dense kernel and cuBLASLt's dense GEMM on the same shape.

use blockscaled::Call;
use blockscaled::{Gpu, OutType, Plan, Sm90Tile, SparseSide};

use super::{Args, JsonSink, Setup};
use crate::bsr::{
    BsrCase, BsrType, Pattern, bsr_entry, bsr_header, bsr_line, case_operands, run_bsr as run,
};
use crate::cases::open_peer;
/// The block-sparse mode: one case, its check against the CPU reference (unless skipped) and
/// its times against the dense peers.
pub(super) fn run_bsr(
    args: &Args,
    gpu: &Gpu,
    s: &Setup,
    tile: Option<Sm90Tile>,
    sink: &mut JsonSink,
) -> Result<bool, String> {
    let (mnkl, seed, cluster) = (&s.mnkl, s.seed, s.cluster);
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
        gpu.run(&Call::sparse(&dd, &ds, side).with_plan(p), &mut c)
            .map_err(e)?;
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
    sink.emit(&[bsr_entry(&case, &o)])?;
    Ok(ok)
}
