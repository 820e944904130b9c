//! The dense mode: the plan the kernel, tile, cluster, split and band flags force (or the
//! heuristic's), then each recipe's case — checked against the CPU reference unless skipped,
//! timed against cuBLASLt — and the table of them.

use blockscaled::{GemmShape, Gpu, Plan, Sm90Config};

use super::{Args, JsonSink, Setup, mx_tile, w4_tile};
use crate::cases::{Case, open_peer, plan_name, run_case};
use crate::report::{Entry, dense_kind};
use crate::table::print_table;

/// Every recipe of `s` on its shape, one table row each.
pub(super) fn run_dense(
    args: &Args,
    gpu: &Gpu,
    s: &Setup,
    sink: &mut JsonSink,
) -> Result<bool, String> {
    let plan = match args.kernel.as_str() {
        "auto"
            if args.group_m.is_none()
                && s.cluster.is_none()
                && s.tiler.is_none()
                && args.split_k.is_none() =>
        {
            None
        }
        "auto" | "sm90" | "sm90mxfp8" => {
            let d = blockscaled::plan::sm90_default(
                s.mnkl[0],
                s.mnkl[1],
                s.mnkl[2],
                s.mnkl[3],
                gpu.hardware(),
            );
            let shape = GemmShape {
                m: s.mnkl[0],
                n: s.mnkl[1],
                k: s.mnkl[2],
                l: s.mnkl[3],
            };
            // A forced tile other than the default's runs alone unless a cluster is forced too,
            // with a band of the default's rows.
            let d = d.with_tile_for(s.tiler.unwrap_or(d.tile), &shape);
            let (tile, cluster) = (d.tile, s.cluster.unwrap_or(d.cluster));
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
                s.mnkl[0],
                s.mnkl[1],
                s.mnkl[2],
                s.mnkl[3],
                gpu.sm_count(),
            );
            let m_tiles = s.mnkl[0].div_ceil(128) as u32;
            Some(Plan::Sm90Mx(
                d.with_tile(s.tiler_mn.map(mx_tile).transpose()?.unwrap_or(d.tile))
                    .with_group_m(args.group_m.unwrap_or(d.group_m).clamp(1, m_tiles.max(1)))
                    .with_split_k(args.split_k.unwrap_or(d.split_k)),
            ))
        }
        kernel @ ("sm90w4" | "sm90w4fp8") => {
            let (m, n, k, l) = (s.mnkl[0], s.mnkl[1], s.mnkl[2], s.mnkl[3]);
            let d = match kernel {
                "sm90w4" => blockscaled::plan::sm90_w4_default(m, n, k, l, gpu.sm_count()),
                _ => blockscaled::plan::sm90_w4_fp8_default(m, n, k, l, gpu.sm_count()),
            };
            let w_tiles = n.div_ceil(128) as u32;
            Some(Plan::Sm90W4(
                d.with_tile(s.tiler_mn.map(w4_tile).transpose()?.unwrap_or(d.tile))
                    .with_group_m(args.group_m.unwrap_or(d.group_m).clamp(1, w_tiles.max(1)))
                    .with_split_k(args.split_k.unwrap_or(d.split_k)),
            ))
        }
        "sm90w4stream" => {
            let d = blockscaled::plan::sm90_w4_stream_default(
                s.mnkl[0],
                s.mnkl[1],
                s.mnkl[2],
                s.mnkl[3],
                gpu.sm_count(),
            );
            Some(Plan::Sm90W4(
                d.with_split_k(args.split_k.unwrap_or(d.split_k)),
            ))
        }
        "reference" => Some(Plan::Reference),
        k => {
            return Err(format!(
                "--kernel `{k}`: want auto, reference, sm90, sm90mx, sm90mxfp8, sm90w4, \
                 sm90w4fp8 or sm90w4stream"
            ));
        }
    };
    let peer = if args.no_peer {
        None
    } else {
        match open_peer(gpu) {
            Ok(p) => Some(p),
            Err(e) => {
                println!("cuBLASLt not available ({e}); peer column empty");
                None
            }
        }
    };
    let (mut rows, mut all_ok) = (Vec::new(), true);
    for (i, &recipe) in s.recipes.iter().enumerate() {
        let case = Case {
            recipe,
            m: s.mnkl[0],
            n: s.mnkl[1],
            k: s.mnkl[2],
            l: s.mnkl[3],
            out: s.out,
            warmup: args.warmup_iterations,
            iters: args.iterations,
            check: !args.skip_ref_check,
            peer: peer.is_some(),
            seed: s.seed.wrapping_add(i as u64),
            plan,
        };
        match run_case(gpu, peer.as_ref(), &case) {
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
                let entry = Entry::new(dense_kind(&o.plan), o.row.clone()).plan(plan_name(&o.plan));
                sink.emit(&[entry])?;
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
