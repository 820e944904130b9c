//! The grouped mode (`--groups` or `--group_case`): every recipe × case, our grouped GEMM — the
//! chosen plan, the exact kernels, or the experts folded per call or once — against a loop of
//! cuBLASLt calls, one line each.

use blockscaled::{Gpu, GroupLayout, Recipe, Sm90Tile};

use super::{Args, JsonSink, Setup};
use crate::cases::open_peer;
use crate::grouped::{
    GroupedCase, GroupedRoute, SEED_CASES, grouped_entry, grouped_header, grouped_line,
    run_grouped as run,
};

/// The grouped mode: every recipe × case, ours against the cuBLASLt loop, one line each.
pub(super) fn run_grouped(
    args: &Args,
    gpu: &Gpu,
    recipes: &[Recipe],
    s: &Setup,
    fp8_tile: Option<Sm90Tile>,
    sink: &mut JsonSink,
) -> Result<bool, String> {
    let (n, k, seed) = (s.mnkl[1], s.mnkl[2], s.seed);
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
                fp8_group_m: args.group_m,
                fp8_cluster: s.cluster,
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
            sink.emit(&[grouped_entry(&c, &o)])?;
        }
    }
    Ok(true)
}
