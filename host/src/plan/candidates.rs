//! The plans a tuner times for a dense GEMM (`blockscaled-tune`, whose fastest goes to
//! [`super::cache`]): the heuristic's first, then the configurations of every family that takes
//! the pair, varied along what their speed depends on — tile, cluster, split K, scheduler band,
//! and for 4-bit weights the kernel (stream, FP8 MMAs, bf16 MMAs) — each validated for the shape.
//! A candidate may still be refused at launch by a rule the shape alone does not show (a
//! kernel's formats): the tuner skips those.

use super::{GpuArch, GroupedProblem, Hardware, Plan, choose_for};
use crate::error::Result;
use crate::families::fold as sm90_mx_fp8;
use crate::families::fp8::{self as sm90_fp8, Sm90Config};
use crate::families::half::{self as sm90_half, Sm90HalfConfig};
use crate::families::mx::{self as sm90_mx, Sm90MxConfig};
use crate::families::w4::{self as sm90_w4, Sm90W4Config};
use crate::format::ScaleType;
use crate::matrix::{GemmShape, MatrixDesc};
use blockscaled_kernels::gemm::scheduler::ClusterShape;
use blockscaled_kernels::sm90::{BLOCK_K, Tile};
use blockscaled_kernels::sm90_half::HalfTile;
use blockscaled_kernels::sm90_mx::MxTile;
use blockscaled_kernels::sm90_w4::W4Tile;

/// K split into this many ranges (each at most K / 128).
const SPLITS: [u32; 4] = [1, 2, 4, 8];

/// The clusters of the FP8 kernel: alone, a pair along M (B multicast), a pair along N.
const CLUSTERS: [ClusterShape; 3] = [
    ClusterShape::ONE,
    ClusterShape { m: 2, n: 1 },
    ClusterShape { m: 1, n: 2 },
];

/// The plans to time for `a · bᵀ` on a GPU of `arch` with the facts `hw`: the heuristic's plan
/// first, then every other candidate that validates for the shape, each once.
pub fn candidates(
    arch: GpuArch,
    hw: Hardware,
    a: &MatrixDesc,
    b: &MatrixDesc,
) -> Result<Vec<Plan>> {
    let shape = GemmShape::of(a, b)?;
    let first = choose_for(arch, hw, &shape, a, b)?;
    if arch != GpuArch::Hopper {
        return Ok(vec![first]);
    }
    let GemmShape { m, n, k, l } = shape;
    let base = super::sm90_default(m, n, k, l, hw);
    let lossy = matches!(first, Plan::Sm90MxFp8(_));
    let more = variants(&shape, m, (a, b), base, hw.sm_count, (true, lossy));
    Ok(distinct(first, more, |p| p.validate(&shape).is_ok()))
}

/// The plans to time for the grouped GEMM `p`: the heuristic's plan first
/// ([`super::choose_grouped`]), then the exact one ([`super::choose_grouped_exact`]), then every
/// family's configurations with the rows of one group (tiles, clusters, band; K is never split
/// in a grouped GEMM), each that validates for a grouped GEMM of the shape, once.
pub fn grouped_candidates(p: &GroupedProblem<'_>) -> Result<Vec<Plan>> {
    let first = super::choose_grouped(p)?;
    if p.arch != GpuArch::Hopper {
        return Ok(vec![first]);
    }
    let mut more: Vec<Plan> = super::choose_grouped_exact(p).into_iter().collect();
    let rows = p.per_group();
    let lossy = matches!(first, Plan::Sm90MxFp8(_));
    more.extend(variants(
        &p.shape,
        rows,
        (p.a, p.b),
        p.fp8_config(),
        p.hw.sm_count,
        (false, lossy),
    ));
    Ok(distinct(first, more, |x| {
        x.validate_grouped(&p.shape).is_ok()
    }))
}

/// `first`, then each plan of `more` that `valid` takes and is not there yet.
fn distinct(first: Plan, more: Vec<Plan>, valid: impl Fn(&Plan) -> bool) -> Vec<Plan> {
    let mut seen = Vec::with_capacity(more.len() + 1);
    seen.push(first);
    for p in more {
        if !seen.contains(&p) && valid(&p) {
            seen.push(p);
        }
    }
    seen
}

/// Every family's configurations for a GEMM of `shape` whose tiles see `rows` rows of A (a
/// group's, in a grouped GEMM), from the FP8 kernel's `fp8_base` and each family's defaults,
/// with K split (where `split`) into 1, 2, 4, 8 and each default's own split, its half and
/// double. The fold onto the FP8 kernel only where it is exact for the pair (no ue4m3 scales:
/// an NVFP4 value folded to e4m3 rounds) or `lossy` (the heuristic's plan folds already): a
/// tuned plan never trades the heuristic's numbers for speed.
fn variants(
    shape: &GemmShape,
    rows: usize,
    (a, b): (&MatrixDesc, &MatrixDesc),
    fp8_base: Sm90Config,
    sm_count: u32,
    (split, lossy): (bool, bool),
) -> Vec<Plan> {
    let GemmShape { n, k, l, .. } = *shape;
    let m = rows;
    let k_blocks = (k / BLOCK_K as usize).max(1) as u32;
    // The fixed splits, and the default's own with its halves and doubles.
    let splits = |own: u32| {
        if !split {
            return vec![1];
        }
        let mut s: Vec<u32> = SPLITS.to_vec();
        s.extend([own, own.div_ceil(2), own * 2]);
        s.sort_unstable();
        s.dedup();
        s.retain(|&x| x >= 1 && x <= k_blocks);
        s
    };
    let mut plans = Vec::new();
    let fp8 = sm90_fp8::unsupported(a, false).is_none() && sm90_fp8::unsupported(b, true).is_none();
    let rounds = |d: &MatrixDesc| d.format.scale == ScaleType::UE4M3;
    let fold =
        sm90_mx_fp8::unsupported_pair(a, b).is_none() && (lossy || !(rounds(a) || rounds(b)));
    if fp8 || fold {
        let base = fp8_base;
        for tile in Tile::ALL {
            for cluster in CLUSTERS {
                for split_k in splits(base.split_k) {
                    for group_m in [base.group_m, 1] {
                        let c = Sm90Config {
                            tile,
                            cluster,
                            group_m,
                            ctas: base.ctas,
                            split_k,
                        };
                        if fp8 {
                            plans.push(Plan::Sm90Fp8(c));
                        }
                        if fold {
                            plans.push(Plan::Sm90MxFp8(c));
                        }
                    }
                }
            }
        }
    }
    if sm90_mx::unsupported_pair(a, b).is_none() {
        let base = super::sm90_mx_default(m, n, k, l, sm_count);
        let group_ms = if split {
            vec![base.group_m]
        } else {
            vec![base.group_m, 1]
        };
        for tile in MxTile::ALL {
            for split_k in splits(base.split_k) {
                for &group_m in &group_ms {
                    plans.push(Plan::Sm90Mx(Sm90MxConfig {
                        tile,
                        split_k,
                        group_m,
                        ..base
                    }));
                }
            }
        }
    }
    if sm90_w4::unsupported_pair(a, b).is_none() {
        let bases = [
            super::sm90_w4_default(m, n, k, l, sm_count),
            super::sm90_w4_fp8_default(m, n, k, l, sm_count),
            super::sm90_w4_stream_default(m, n, k, l, sm_count),
        ];
        for base in bases {
            for tile in W4Tile::ALL {
                for split_k in splits(base.split_k) {
                    plans.push(Plan::Sm90W4(Sm90W4Config {
                        tile: if base.fp8 || base.stream {
                            base.tile
                        } else {
                            tile
                        },
                        split_k,
                        ..base
                    }));
                }
            }
        }
    }
    if sm90_half::unsupported_pair(a, b).is_none() {
        let base = super::sm90_half_default(m, n, sm_count);
        for tile in HalfTile::ALL {
            for cluster_m in [1, 2] {
                for split_k in splits(base.split_k) {
                    plans.push(Plan::Sm90Half(Sm90HalfConfig {
                        tile,
                        cluster_m,
                        split_k,
                        ..base
                    }));
                }
            }
        }
    }
    plans
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{Fp4Weights, Fp8, Recipe};

    fn desc(r: Recipe, rows: usize, k: usize, b: bool) -> MatrixDesc {
        MatrixDesc::of_recipe(r, rows, k, b)
    }

    #[test]
    fn the_heuristic_comes_first_then_distinct_plans_that_validate() {
        let cases = [
            (Recipe::DeepSeekFp8, 16, 7168, 2048),
            (Recipe::DeepSeekFp8, 128, 7168, 2048),
            (Recipe::DeepSeekFp8, 4096, 7168, 2048),
            (Recipe::Mxfp8(Fp8::E4M3), 2048, 4096, 4096),
            (Recipe::Mxfp4, 128, 7168, 4096),
            (Recipe::Nvfp4, 4096, 4096, 4096),
            (Recipe::W4A16(Fp4Weights::Mxfp4), 1, 14336, 4096),
            (Recipe::W4A8(Fp4Weights::Mxfp4), 64, 7168, 2048),
            (Recipe::W4A8(Fp4Weights::Nvfp4), 4096, 7168, 2048),
        ];
        for (r, m, n, k) in cases {
            let (a, b) = (desc(r, m, k, false), desc(r, n, k, true));
            let plans = candidates(GpuArch::Hopper, Hardware::H100, &a, &b).unwrap();
            let shape = GemmShape::of(&a, &b).unwrap();
            assert_eq!(
                plans[0],
                super::super::choose(GpuArch::Hopper, Hardware::H100, &a, &b).unwrap()
            );
            assert!(
                plans.len() > 1,
                "{r} {m}x{n}x{k}: nothing to compare the heuristic with"
            );
            assert!(
                plans.len() <= 400,
                "{r} {m}x{n}x{k}: {} candidates",
                plans.len()
            );
            for (i, p) in plans.iter().enumerate() {
                assert!(p.validate(&shape).is_ok(), "{r}: {p:?} does not validate");
                assert!(!plans[..i].contains(p), "{r}: {p:?} twice");
            }
        }
        // NVFP4 weights whose heuristic plan is exact get no (rounding) fold to time; pairs the
        // heuristic folds keep theirs.
        let of = |r, m, n, k| {
            candidates(
                GpuArch::Hopper,
                Hardware::H100,
                &desc(r, m, k, false),
                &desc(r, n, k, true),
            )
            .unwrap()
        };
        let r = Recipe::W4A8(Fp4Weights::Nvfp4);
        let plans = of(r, 4096, 7168, 2048);
        assert!(
            !plans.iter().any(|p| matches!(p, Plan::Sm90MxFp8(_))),
            "{r}"
        );
        let r = Recipe::Nvfp4;
        let plans = of(r, 4096, 4096, 4096);
        assert!(
            matches!(plans[0], Plan::Sm90MxFp8(_)) && plans.len() > 4,
            "{r}"
        );
        // bf16 × bf16 on the 16-bit kernel.
        let r = Recipe::DeepSeekFp8;
        let mut a = desc(r, 4096, 4096, false);
        let mut b = desc(r, 4096, 4096, true);
        let half = crate::format::OperandFormat {
            elem: crate::format::ElemType::BF16,
            scale: crate::format::ScaleType::F32,
            block: crate::format::ScaleBlock::PerTensor,
            tensor_scale: false,
        };
        a.format = half;
        b.format = half;
        a.scale_layout = crate::matrix::ScaleLayout::packed(crate::format::ScaleMajor::K, 1, 1);
        b.scale_layout = a.scale_layout;
        let plans = candidates(GpuArch::Hopper, Hardware::H100, &a, &b).unwrap();
        assert!(matches!(plans[0], Plan::Sm90Half(_)) && plans.len() > 4);
    }

    #[test]
    fn grouped_candidates_start_with_the_heuristic_and_never_split_k() {
        let cases = [
            (Recipe::DeepSeekFp8, 8, 4096, 4096, 7168, 1),
            (Recipe::DeepSeekFp8, 32, 256, 7168, 2048, 32),
            (Recipe::Nvfp4, 8, 2048, 4096, 4096, 1),
            (Recipe::W4A8(Fp4Weights::Mxfp4), 8, 1024, 4096, 7168, 1),
            (Recipe::Mxfp4, 8, 64, 4096, 7168, 8),
        ];
        for (r, groups, m, n, k, l) in cases {
            let a = MatrixDesc {
                batch: l,
                ..desc(r, m, k, false)
            };
            let b = MatrixDesc {
                batch: groups,
                ..desc(r, n, k, true)
            };
            let shape = GemmShape { m, n, k, l };
            let p = GroupedProblem {
                arch: GpuArch::Hopper,
                hw: Hardware::H100,
                shape,
                a: &a,
                b: &b,
                groups,
            };
            let plans = grouped_candidates(&p).unwrap();
            assert_eq!(plans[0], super::super::choose_grouped(&p).unwrap());
            assert!(
                plans.contains(&super::super::choose_grouped_exact(&p).unwrap()),
                "{r}: the exact plan is a candidate"
            );
            assert!(plans.len() > 4, "{r} G{groups}: {} candidates", plans.len());
            for (i, x) in plans.iter().enumerate() {
                assert!(
                    x.validate_grouped(&shape).is_ok(),
                    "{r}: {x:?} does not validate for a grouped GEMM"
                );
                assert!(!plans[..i].contains(x), "{r}: {x:?} twice");
            }
        }
    }

    #[test]
    fn other_gpus_get_the_heuristic_alone() {
        let r = Recipe::DeepSeekFp8;
        let (a, b) = (desc(r, 256, 512, false), desc(r, 256, 512, true));
        let plans = candidates(GpuArch::Blackwell, Hardware::with_sms(148), &a, &b).unwrap();
        assert_eq!(plans, vec![Plan::Reference]);
    }
}
