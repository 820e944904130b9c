//! The choice's and the heuristics' tests.

use super::*;
use crate::families::heuristic::GROUP_ROWS;
use blockscaled_kernels::gemm::scheduler::ClusterShape;

#[test]
fn fused_epilogues_need_a_fused_kernel_that_computes_c_and_scale_blocks_inside_a_pass() {
    let big = sm90_default(4096, 7168, 2048, 1, Hardware::H100);
    let s = GemmShape {
        m: 4096,
        n: 7168,
        k: 2048,
        l: 1,
    };
    let with = |tile| Plan::Sm90Fp8(big.with_tile_for(tile, &s));
    let (e4m3, e5m2) = (ElemType::E4M3, ElemType::E5M2);
    let needs = |block_cols| FusedNeeds {
        block_cols,
        elems: (e4m3, e4m3),
        in_registers: sm90::InRegisters::No,
    };
    assert!(with(Tile::M128).check_fused(needs(0)).is_ok());
    assert!(Plan::Reference.check_fused(needs(0)).is_err());
    // Decode tiles compute Cᵀ.
    let decode = sm90_default(16, 7168, 2048, 1, Hardware::H100);
    assert!(decode.tile.is_swapped());
    assert!(Plan::Sm90Fp8(decode).check_fused(needs(0)).is_err());
    // FP8 1×128 output (128 columns) on a 128-column tile; with SwiGLU (256) refused.
    assert!(with(Tile::M128).check_fused(needs(128)).is_ok());
    assert!(with(Tile::M128).check_fused(needs(256)).is_err());
    // Tiles and types without a fused kernel: refused whatever the output. The 192-row tile
    // runs the epilogues the consumers hold in registers, and only those.
    let regs = |block_cols| FusedNeeds {
        in_registers: sm90::InRegisters::Yes,
        ..needs(block_cols)
    };
    assert!(with(Tile::M192).check_fused(needs(0)).is_err());
    assert!(with(Tile::M192).check_fused(regs(0)).is_ok());
    assert!(with(Tile::M192).check_fused(regs(128)).is_ok());
    for t in [Tile::M256, Tile::M128N64, Tile::M128N144, Tile::M128N192] {
        assert!(with(t).check_fused(needs(0)).is_err(), "{t:?}");
        assert!(with(t).check_fused(regs(0)).is_err(), "{t:?}");
    }
    let e5 = FusedNeeds {
        block_cols: 0,
        elems: (e4m3, e5m2),
        in_registers: sm90::InRegisters::No,
    };
    assert!(
        with(Tile::M192)
            .check_fused(FusedNeeds {
                in_registers: sm90::InRegisters::Yes,
                ..e5
            })
            .is_err()
    );
    assert!(with(Tile::M128).check_fused(e5).is_err());
    // MXFP8 folds to FP8 of its own element types: e4m3 fuses there, e5m2 does not.
    let folded = Plan::Sm90MxFp8(big.with_tile_for(Tile::M128, &s));
    assert!(folded.check_fused(needs(0)).is_ok());
    assert!(folded.check_fused(e5).is_err());
    let half = Sm90HalfConfig {
        tile: HalfTile::M128N256,
        ..sm90_half_default(4096, 4096, 132)
    };
    let bf16 = FusedNeeds {
        block_cols: 0,
        elems: (ElemType::BF16, ElemType::BF16),
        in_registers: sm90::InRegisters::Yes,
    };
    assert!(Plan::Sm90Half(half).check_fused(bf16).is_err());
    let half = Sm90HalfConfig {
        tile: HalfTile::M128,
        ..half
    };
    assert!(Plan::Sm90Half(half).check_fused(bf16).is_ok());
    let mx = sm90_mx_default(128, 4096, 4096, 1, 132);
    let mx = |tile| Plan::Sm90Mx(Sm90MxConfig { tile, ..mx });
    assert!(mx(MxTile::N256).check_fused(e5).is_ok());
    assert!(mx(MxTile::N128).check_fused(e5).is_err());
}

#[test]
fn fused_plans_move_to_the_tiles_and_kernels_that_fuse() {
    use crate::format::{Fp8, Recipe};
    let s = GemmShape {
        m: 4096,
        n: 7168,
        k: 2048,
        l: 1,
    };
    let desc = |r: Recipe, rows, b| MatrixDesc::of_recipe(r, rows, 2048, b);
    let fused_with = |r: Recipe, in_registers| {
        let (a, b) = (desc(r, 4096, false), desc(r, 7168, true));
        let needs = FusedNeeds {
            block_cols: 0,
            elems: (a.format.elem, b.format.elem),
            in_registers,
        };
        choose_fused(GpuArch::Hopper, Hardware::H100, &s, (&a, &b), needs)
    };
    let fused = |r: Recipe| fused_with(r, sm90::InRegisters::No);
    // DeepSeek FP8: the plain plan's tall tile moves to the fused 128 × 128 tile.
    let plain = choose_for(
        GpuArch::Hopper,
        Hardware::H100,
        &s,
        &desc(Recipe::DeepSeekFp8, 4096, false),
        &desc(Recipe::DeepSeekFp8, 7168, true),
    )
    .unwrap();
    assert!(
        plain
            .check_fused(FusedNeeds {
                block_cols: 0,
                elems: (ElemType::E4M3, ElemType::E4M3),
                in_registers: sm90::InRegisters::No,
            })
            .is_err()
    );
    assert!(matches!(fused(Recipe::DeepSeekFp8), Ok(Plan::Sm90Fp8(c)) if c.tile == Tile::M128));
    // An epilogue the consumers hold in registers moves to the 128 × 128 tile too (the plain
    // plan's 256-row tile has no such kernel).
    assert!(
        matches!(fused_with(Recipe::DeepSeekFp8, sm90::InRegisters::Yes), Ok(Plan::Sm90Fp8(c)) if c.tile == Tile::M128)
    );
    // MXFP8 e4m3 stays folded onto FP8; e5m2 moves to the exact MX kernel's fused tile.
    assert!(matches!(
        fused(Recipe::Mxfp8(Fp8::E4M3)),
        Ok(Plan::Sm90MxFp8(_))
    ));
    assert!(
        matches!(fused(Recipe::Mxfp8(Fp8::E5M2)), Ok(Plan::Sm90Mx(c)) if c.tile == MxTile::N256)
    );
    // e5m2 DeepSeek-style FP8 has no fused kernel: a typed error.
    assert!(matches!(
        fused(Recipe::Fp8PerRow(Fp8::E5M2)),
        Err(Error::Config(_))
    ));
    // Where the plain plan folds e5m2 onto FP8 (M = 256), the fused one is the MX kernel's
    // fused tile too, not its plain default.
    let small = GemmShape {
        m: 256,
        n: 512,
        k: 1024,
        l: 1,
    };
    let r = Recipe::Mxfp8(Fp8::E5M2);
    let (a, b) = (
        MatrixDesc::of_recipe(r, 256, 1024, false),
        MatrixDesc::of_recipe(r, 512, 1024, true),
    );
    let plain = choose_for(GpuArch::Hopper, Hardware::H100, &small, &a, &b).unwrap();
    assert!(matches!(plain, Plan::Sm90MxFp8(_)), "{plain:?}");
    let needs = FusedNeeds {
        block_cols: 0,
        elems: (a.format.elem, b.format.elem),
        in_registers: sm90::InRegisters::No,
    };
    assert!(matches!(
        choose_fused(GpuArch::Hopper, Hardware::H100, &small, (&a, &b), needs),
        Ok(Plan::Sm90Mx(c)) if c.tile == MxTile::N256
    ));
}

#[test]
fn tall_tiles_for_large_m_short_tiles_where_they_would_idle_sms() {
    let rows = |m, n, k| sm90_default(m, n, k, 1, Hardware::H100).tile.block_m();
    assert_eq!(rows(8192, 8192, 8192), 256);
    assert_eq!(rows(4096, 7168, 2048), 256);
    // One 256-row tile per N tile would be half empty.
    assert_eq!(rows(128, 7168, 2048), 128);
    assert_eq!(rows(200, 2112, 7168), 128);
    // 4096 × 2112: 374 tiles of 192 rows are 3 rounds (544 of 128 rows are 5; 272 of 256
    // rows 3, at 1.86 each; 352 of 128 × 192 3, at 1.55).
    assert_eq!(rows(4096, 2112, 7168), 192);
    for (m, n) in [(8192, 8192), (4096, 2112), (256, 7168)] {
        assert_eq!(
            sm90_default(m, n, 2048, 1, Hardware::H100).tile.block_n,
            128,
            "{m}×{n}"
        );
    }
    // From 257 to 512 rows, 128 × 64 tiles where they fit one round (measured on the H200, µs,
    // against the 128 × 128 tiles: 512 × 2112 × 7168 25.3 / 28.8, 512 × 576 × 7168 15.5 /
    // 17.4); not where they take a second round (512 × 4096: 256 tiles), nor at 256 rows
    // (256 × 4096 × 7168: 41.9 against 41.0 split 2).
    for (m, n, k, block_n) in [
        (256, 4096, 7168, 128),
        (257, 2112, 2048, 64),
        (512, 2112, 7168, 64),
        (512, 576, 7168, 64),
        (512, 4096, 7168, 128),
        (513, 576, 7168, 128),
    ] {
        let c = sm90_default(m, n, k, 1, Hardware::H200);
        assert_eq!(
            (c.tile.block_m(), c.tile.block_n),
            (128, block_n),
            "{m}×{n}×{k}"
        );
    }
}

/// The tile sweep (docs/perf-log): per shape, the tile the cost model picks. Each ran
/// within 2.5% of the fastest of the six tiles measured there (0.3% on average).
#[test]
fn tiles_follow_the_measured_sweep() {
    let sweep = [
        ((4096, 2112, 7168), Tile::M192),
        ((4096, 7168, 2048), Tile::M256),
        ((8192, 8192, 2048), Tile::M256),
        ((2048, 7168, 2048), Tile::M128),
        ((2048, 2112, 7168), Tile::M128N160),
        ((4096, 4096, 2048), Tile::M256),
        ((1024, 7168, 7168), Tile::M256),
        ((2048, 24576, 1536), Tile::M256),
        ((4096, 1536, 7168), Tile::M192),
        ((8192, 2112, 2048), Tile::M192),
        ((1536, 8192, 4096), Tile::M256),
        ((3072, 3072, 4096), Tile::M192),
        ((4096, 5120, 2048), Tile::M256),
        ((6144, 6144, 2048), Tile::M256),
        ((1024, 4096, 7168), Tile::M256),
        ((4096, 12288, 2048), Tile::M256),
    ];
    for ((m, n, k), tile) in sweep {
        let cfg = sm90_default(m, n, k, 1, Hardware::H100);
        assert_eq!(cfg.tile, tile, "{m}×{n}×{k}");
    }
    // Wide tiles go in pairs along N where pairing costs no round, as they were measured.
    let wide = sm90_default(2048, 2112, 7168, 1, Hardware::H100);
    assert_eq!(wide.cluster, ClusterShape { m: 1, n: 2 });
    // At M ≤ 128 (memory-bound) they are not candidates, nor for grouped GEMM (no grouped
    // wide kernels).
    for n in [2112, 7168, 24576, 32768] {
        assert!(
            !sm90_default(128, n, 2048, 1, Hardware::H100).tile.is_wide(),
            "{n}"
        );
    }
    let grouped = sm90_grouped_default(16 * 2048, 2112, 7168, 16, 2048, 132);
    assert!(!grouped.tile.is_wide(), "{grouped:?}");
    let e4m3 = blockscaled_kernels::format::ElemType::E4M3;
    assert!(
        blockscaled_kernels::sm90::kernel(
            grouped.tile,
            e4m3,
            e4m3,
            blockscaled_kernels::gemm::Mode::Grouped
        )
        .is_some()
    );
}

#[test]
fn narrow_tiles_only_for_one_row_of_tiles_that_leaves_sms_idle() {
    let h100 = 132;
    let tile = |m, n, k| {
        let c = sm90_default(m, n, k, 1, Hardware::H100);
        (c.tile.block_m(), c.tile.block_n)
    };
    // 56 tiles of 128 columns on 132 SMs: 112 of 64.
    assert_eq!(tile(128, 7168, 2048), (128, 64));
    // 2 rounds of 192 tiles against 3 rounds of 384 half tiles.
    assert_eq!(tile(128, 24576, 1536), (128, 64));
    // 256 tiles are 2 rounds; 512 half tiles 4.
    assert_eq!(tile(128, 32768, 512), (128, 128));
    // Never with more than one row of tiles (A is read once per 64 columns).
    assert_eq!(tile(129, 7168, 2048).1, 128);
    // The streaming model weighs the split 128 × 128 tiles against them by the DRAM's rate: at
    // 128 × 7168 × 16384 the H200 ran 128 × 128 split 2 in 43.9 µs against 49.5 for 128 × 64
    // unsplit, the H100 56.5 against 49.2; at 128 × 4608 × 7168 the H200 23.7 (split 2) against
    // 25.5 (docs/tune-data/h200.jsonl, docs/perf-log).
    let plan = |m, n, k, hw| {
        let c = sm90_default(m, n, k, 1, hw);
        (c.tile, c.split_k)
    };
    assert_eq!(plan(128, 7168, 16384, Hardware::H200), (Tile::M128, 2));
    assert_eq!(plan(128, 7168, 16384, Hardware::H100), (Tile::M128N64, 1));
    assert_eq!(plan(128, 4608, 7168, Hardware::H200).0, Tile::M128);
    // Where the 128 × 64 tiles measured fastest on the H200, they stay.
    for (n, k, split) in [(2112, 7168, 4), (4096, 7168, 2), (7168, 2048, 1)] {
        assert_eq!(
            plan(128, n, k, Hardware::H200),
            (Tile::M128N64, split),
            "{n}×{k}"
        );
    }
    for (m, n, l) in [(1, 1, 1), (8192, 8192, 1), (128, 2112, 3)] {
        let c = sm90_default(m, n, 1024, l, Hardware::H100);
        assert!(c.group_m >= 1 && c.group_m * c.tile.block_m() <= GROUP_ROWS.max(c.tile.block_m()));
        assert_eq!(c.ctas, h100);
    }
}

#[test]
fn pairs_only_where_they_cost_no_extra_round() {
    let cl = |m, n, k| {
        let c = sm90_default(m, n, k, 1, Hardware::H100);
        (c.cluster.m, c.cluster.n)
    };
    // 256-row tiles, even tile counts: pairs along N (share A).
    assert_eq!(cl(8192, 8192, 8192), (1, 2));
    assert_eq!(cl(4096, 7168, 2048), (1, 2));
    // 192-row tiles pair along N too (22 × 9 pairs fill 3 rounds, as 374 tiles do alone);
    // 128-row tiles run alone.
    assert_eq!(cl(4096, 2112, 7168), (1, 2));
    assert_eq!(cl(128, 24576, 1536), (1, 1));
    // 256-row tiles with an odd number of N tiles where pairing adds a round: alone. (4224
    // columns: 33 N tiles; 2048 rows: 8 M tiles; 264 tiles = 2 rounds, 8 × 17 = 136 pairs on
    // 66 pair slots = 3 rounds.)
    assert_eq!(
        sm90_default(2048, 4224, 7168, 1, Hardware::H100)
            .tile
            .block_m(),
        256
    );
    assert_eq!(cl(2048, 4224, 7168), (1, 1));
    // Fewer tiles than SMs, or split-K: alone.
    assert_eq!(cl(256, 1024, 1024), (1, 1));
    assert_eq!(cl(128, 2112, 7168), (1, 1));
    for (m, n) in [(1, 1), (8192, 8192), (4096, 2112), (100, 100_000)] {
        let (a, b) = cl(m, n, 1024);
        assert!(a * b <= 2 && a >= 1 && b >= 1);
    }
}

#[test]
fn split_k_only_where_tiles_leave_most_sms_idle() {
    // 33 tiles of 128 × 64 × 4 ranges of 14 K blocks = 132 CTAs.
    assert_eq!(sm90_default(128, 2112, 7168, 1, Hardware::H100).split_k, 4);
    // 64 tiles × 2 = 128 CTAs.
    assert_eq!(sm90_default(128, 4096, 7168, 1, Hardware::H100).split_k, 2);
    // 384 tiles fill the GPU; 1024 tiles too.
    assert_eq!(sm90_default(128, 24576, 1536, 1, Hardware::H100).split_k, 1);
    assert_eq!(sm90_default(4096, 4096, 7168, 1, Hardware::H100).split_k, 1);
    // Too little K to split: 512 = 4 blocks is one range of 4; at K = 2048 (16 blocks) two
    // ranges of 8 save less than the split costs (docs/perf-log, the sm90 FP8 kernel's split K).
    assert_eq!(sm90_default(128, 128, 512, 1, Hardware::H100).split_k, 1);
    assert_eq!(sm90_default(128, 7168, 2048, 1, Hardware::H100).split_k, 1);
    // 112 tiles of 128 × 64: no split (at 128 columns, 56 tiles took 2).
    assert_eq!(sm90_default(128, 7168, 16384, 1, Hardware::H100).split_k, 1);
    assert_eq!(
        sm90_default(128, 7168, 16384, 1, Hardware::H100)
            .tile
            .block_n,
        64
    );
    for (m, n, k) in [(1, 1, 128), (64, 64, 128 * 300), (128, 2112, 7168)] {
        let c = sm90_default(m, n, k, 1, Hardware::H100);
        assert!(c.split_k >= 1 && c.split_k as usize <= k / 128);
    }
}

#[test]
fn decode_sizes_take_the_swapped_tile_that_holds_m_and_split_as_measured() {
    let swapped = |m, n, k, hw| sm90_default(m, n, k, 1, hw).tile.is_swapped();
    for (m, rows) in [(1, 16), (16, 16), (17, 32), (32, 32), (33, 64), (64, 64)] {
        let c = sm90_default(m, 7168, 16384, 1, Hardware::H100);
        assert_eq!(
            (c.tile, c.cluster),
            (Tile::swapped(rows), ClusterShape::ONE)
        );
        assert!(
            c.validate(&GemmShape {
                m,
                n: 7168,
                k: 16384,
                l: 1
            })
            .is_ok()
        );
    }
    assert!(!swapped(65, 7168, 2048, Hardware::H100));
    // 33 to 64 rows: swapped only from K = 1024.
    assert!(!swapped(64, 32768, 512, Hardware::H100));
    assert!(swapped(64, 24576, 1024, Hardware::H100));
    assert!(swapped(64, 7168, 2048, Hardware::H100));
    let plan = |m, n, k, hw| {
        let c = sm90_default(m, n, k, 1, hw);
        (c.tile.rows, c.split_k)
    };
    // The decode sweep (docs/perf-log, decode-sized M; the tile that holds M): the splits
    // measured within 7% of the fastest (and the untimed ones between two such).
    for (m, n, k, rows, best) in [
        (16, 7168, 16384, 16, &[1, 2, 3, 4][..]),
        (16, 2112, 7168, 16, &[3, 4, 5, 6, 7][..]),
        (16, 24576, 1536, 16, &[1][..]),
        (16, 32768, 512, 16, &[1][..]),
        (16, 4096, 7168, 16, &[1, 3, 4][..]),
        (16, 7168, 2048, 16, &[1][..]),
        (64, 7168, 16384, 64, &[1, 2][..]),
    ] {
        let (r, s) = plan(m, n, k, Hardware::H100);
        assert!(
            r == rows && best.contains(&s),
            "{m}×{n}×{k}: {r} rows split {s}, measured best {rows} rows split {best:?}"
        );
    }
    // Where B fits in the L2, the model has A tiles share B tiles on the H100 as on the H200
    // (its DRAM is slower, so more often: a prediction, not measured there).
    for (m, n, k) in [(64, 2112, 7168), (64, 4096, 7168), (64, 7168, 2048)] {
        assert_eq!(plan(m, n, k, Hardware::H100).0, 32, "{m}×{n}×{k}");
    }
    // The H200 (docs/tune-data/h200.jsonl, every tile and split timed by the tuner; a shape's
    // latest run): the plans within 5% of the fastest swapped one, as (rows, splits) (and the
    // untimed splits between two such).
    type Plans<'a> = &'a [(u32, &'a [u32])];
    let h200: [(usize, usize, usize, Plans); 24] = [
        (16, 576, 7168, &[(16, &[6, 7, 8, 9, 10, 11, 12])]),
        (16, 2112, 7168, &[(16, &[4])]),
        (16, 4096, 7168, &[(16, &[2, 3, 4]), (32, &[2, 3, 4])]),
        (16, 7168, 2048, &[(16, &[1]), (32, &[1])]),
        (16, 7168, 16384, &[(16, &[1, 2]), (32, &[1, 2])]),
        (16, 24576, 1536, &[(16, &[1]), (32, &[1])]),
        (16, 32768, 512, &[(16, &[1]), (32, &[1])]),
        (32, 576, 7168, &[(16, &[8])]),
        (32, 1536, 7168, &[(16, &[4]), (32, &[4, 5, 6, 7, 8])]),
        (32, 2112, 7168, &[(16, &[2]), (32, &[4])]),
        (32, 4096, 7168, &[(32, &[2, 3, 4])]),
        (32, 7168, 2048, &[(32, &[1])]),
        (48, 576, 7168, &[(16, &[4, 5, 6, 7, 8])]),
        (48, 1536, 7168, &[(16, &[2]), (32, &[4])]),
        (48, 2112, 7168, &[(16, &[2]), (32, &[3])]),
        (48, 4096, 7168, &[(16, &[1]), (32, &[2]), (64, &[2, 3, 4])]),
        (48, 4608, 7168, &[(16, &[1]), (32, &[1]), (64, &[2, 3])]),
        (48, 7168, 2048, &[(32, &[1])]),
        (64, 1536, 7168, &[(16, &[2]), (32, &[4])]),
        (64, 2112, 7168, &[(32, &[2, 3])]),
        (64, 4096, 7168, &[(32, &[1, 2]), (64, &[2, 3, 4])]),
        (64, 4608, 7168, &[(32, &[1]), (64, &[2, 3])]),
        (64, 7168, 2048, &[(32, &[1]), (64, &[1])]),
        (64, 7168, 16384, &[(64, &[2])]),
    ];
    // Where it misses by more, within 10% (the model's two best plans within 2% of each
    // other): 64 × 576 × 7168 on 32 rows split 8, 11.1 µs against 10.2 on 16 rows split 4 (10.6
    // and 10.3 in an earlier run); 32 × 4608 × 7168 on 16 rows unsplit, 18.7 against 17.5 on
    // 32 rows split 2.
    let within_10: [(usize, usize, usize, Plans); 2] = [
        (64, 576, 7168, &[(16, &[4]), (32, &[4, 5, 6, 7, 8])]),
        (32, 4608, 7168, &[(16, &[1]), (32, &[2])]),
    ];
    let tables = h200
        .iter()
        .map(|t| (t, 5))
        .chain(within_10.iter().map(|t| (t, 10)));
    for (&(m, n, k, best), within) in tables {
        let (r, s) = plan(m, n, k, Hardware::H200);
        assert!(
            best.iter()
                .any(|&(rows, splits)| rows == r && splits.contains(&s)),
            "H200 {m}×{n}×{k}: {r} rows split {s}, measured within {within}%: {best:?}"
        );
    }
    // Past 64 rows, A tiles sharing B only where the model has them beat the 128 × 64 tiles:
    // at 128 × 576 × 7168 (32 rows split 4: 11.5 µs against 12.9 for 128 × 64 split 7 or 8), not
    // at 128 × 2112 × 7168 (14.7 for 128 × 64 split 4, 18.7 the fastest swapped), nor past
    // 128 rows or below K = 1024.
    assert_eq!(plan(128, 576, 7168, Hardware::H200).0, 32);
    assert_eq!(
        sm90_default(128, 2112, 7168, 1, Hardware::H200).tile,
        Tile::M128N64
    );
    assert!(!swapped(129, 576, 7168, Hardware::H200));
    assert!(!swapped(128, 576, 512, Hardware::H200));
    // Sharing never takes a second round, nor a B past the L2.
    for (m, n, k, l) in [
        (64, 576, 7168, 1),
        (128, 4096, 7168, 1),
        (48, 1000, 4096, 2),
    ] {
        let c = sm90_default(m, n, k, l, Hardware::H200);
        if c.tile.is_swapped() && (c.tile.rows as usize) < m {
            let tiles = m.div_ceil(c.tile.rows as usize) * n.div_ceil(128) * l;
            assert!(tiles * c.split_k as usize <= 132, "{m}×{n}×{k}×{l}: {c:?}");
        }
    }
    assert_eq!(plan(64, 7168, 16384, Hardware::H100).0, 64);
}

#[test]
fn sixteen_bit_pairs_of_one_type_run_the_16_bit_kernel_and_mixed_ones_the_reference() {
    use crate::format::{Fp4Weights, Recipe};
    let desc = |elem: ElemType, rows: usize, k: usize| {
        let mut d = MatrixDesc::of_recipe(Recipe::W4A16(Fp4Weights::Nvfp4), rows, k, false);
        d.format.elem = elem;
        d
    };
    let (bf, hf) = (ElemType::BF16, ElemType::F16);
    for (ta, tb, half) in [
        (bf, bf, true),
        (hf, hf, true),
        (bf, hf, false),
        (hf, bf, false),
    ] {
        let (a, b) = (desc(ta, 1000, 4096), desc(tb, 3000, 4096));
        let p = choose(GpuArch::Hopper, Hardware::H100, &a, &b).unwrap();
        assert_eq!(
            matches!(p, Plan::Sm90Half(_)),
            half,
            "{ta:?} × {tb:?}: {p:?}"
        );
        if !half {
            assert_eq!(p, Plan::Reference, "{ta:?} × {tb:?}");
        }
    }
    // Large shapes: 128 × 256 tiles in pairs; few tiles: 256 × 128 alone, then 128 × 128.
    let big = sm90_half_default(4096, 4096, 132);
    assert_eq!(
        (big.tile, big.cluster_m, big.group_m),
        (HalfTile::M128N256, 2, 8)
    );
    assert_eq!(sm90_half_default(2048, 2048, 132).tile, HalfTile::M128N256);
    assert_eq!(sm90_half_default(512, 4096, 132).tile, HalfTile::M128);
    assert_eq!(sm90_half_default(256, 512, 132).tile, HalfTile::M128N64);
    // K not a multiple of 8 (TMA's 16-byte rows): the reference kernel.
    let (a, b) = (desc(hf, 64, 100), desc(hf, 64, 100));
    assert_eq!(
        choose(GpuArch::Hopper, Hardware::H100, &a, &b).unwrap(),
        Plan::Reference
    );
}

#[test]
fn grouped_plans_fold_what_folds_to_e4m3_and_keep_the_rest_exact() {
    use crate::format::{Fp4Weights, Fp8, Recipe};
    let descs = |r: Recipe| {
        let (a, mut b) = (
            MatrixDesc::of_recipe(r, 1024, 7168, false),
            MatrixDesc::of_recipe(r, 4096, 7168, true),
        );
        b.batch = 8;
        (a, b)
    };
    let kind = |p: Result<Plan>| match p.unwrap() {
        Plan::Sm90Fp8(_) => "fp8",
        Plan::Sm90MxFp8(_) => "fold",
        Plan::Sm90Mx(_) => "mx",
        Plan::Sm90W4(_) => "w4",
        Plan::Reference => "ref",
        Plan::Sm90Half(_) => "half",
    };
    let hopper = GpuArch::Hopper;
    fn problem<'a>(arch: GpuArch, a: &'a MatrixDesc, b: &'a MatrixDesc) -> GroupedProblem<'a> {
        let shape = GemmShape {
            m: 1024,
            n: 4096,
            k: 7168,
            l: 1,
        };
        GroupedProblem {
            arch,
            hw: Hardware::H100,
            shape,
            a,
            b,
            groups: 8,
        }
    }
    for (r, chosen, exact) in [
        (Recipe::DeepSeekFp8, "fp8", "fp8"),
        // e2m1 activations with e8m0 scales fold per call, the experts stay 4-bit.
        (Recipe::Mxfp4, "w4", "mx"),
        (Recipe::Nvfp4, "mx", "mx"),
        (Recipe::Mxfp8(Fp8::E4M3), "mx", "mx"),
        (Recipe::W4A8(Fp4Weights::Nvfp4), "fold", "w4"),
        // e5m2 folds to e5m2, which has no grouped FP8 kernel.
        (Recipe::Mxfp8(Fp8::E5M2), "mx", "mx"),
        // The FP8-MMA 4-bit-weights kernel takes e8m0 experts as they are.
        (Recipe::W4A8(Fp4Weights::Mxfp4), "w4", "w4"),
        (Recipe::W4A16(Fp4Weights::Nvfp4), "w4", "w4"),
    ] {
        let (a, b) = descs(r);
        let p = problem(hopper, &a, &b);
        assert_eq!(kind(choose_grouped(&p)), chosen, "{r}");
        assert_eq!(kind(choose_grouped_exact(&p)), exact, "{r}");
    }
    // Experts folded once: MX and NVFP4 activations fold per call, FP8 ones run as they are.
    for (r, chosen) in [
        (Recipe::Mxfp4, "fold"),
        (Recipe::Nvfp4, "fold"),
        (Recipe::W4A8(Fp4Weights::Nvfp4), "fp8"),
    ] {
        let (a, b) = descs(r);
        let b = b.folded(true).unwrap();
        assert_eq!(
            kind(choose_grouped(&problem(hopper, &a, &b))),
            chosen,
            "{r}"
        );
    }
    // Contiguous groups of more than one activation tile's rows on average fold W4A8 and e2m1
    // pairs' experts too; masked ones (rows up to their capacity) stay on the kernel.
    for r in [Recipe::W4A8(Fp4Weights::Mxfp4), Recipe::Mxfp4] {
        let (_, b) = descs(r);
        let rows = 8 * super::W4A8_FOLD_MIN_M;
        let a = MatrixDesc::of_recipe(r, rows, 7168, false);
        let mut p = problem(hopper, &a, &b);
        p.shape.m = rows;
        assert_eq!(kind(choose_grouped(&p)), "fold", "{r}: contiguous");
        p.shape.m -= 8;
        assert_eq!(kind(choose_grouped(&p)), "w4", "{r}: one tile a group");
        let masked = MatrixDesc {
            batch: 8,
            ..MatrixDesc::of_recipe(r, 256, 7168, false)
        };
        let mut p = problem(hopper, &masked, &b);
        p.shape = GemmShape {
            m: 256,
            l: 8,
            ..p.shape
        };
        assert_eq!(kind(choose_grouped(&p)), "w4", "{r}: masked");
    }
    let (a, b) = descs(Recipe::Mxfp4);
    let bw = choose_grouped(&problem(GpuArch::Blackwell, &a, &b));
    assert!(matches!(bw, Err(Error::Architecture(_))));
}

#[test]
fn grouped_tiles_are_narrow_only_where_twice_the_tiles_fit_one_round() {
    let h100 = 132;
    let tile = |rows, n, groups, per| sm90_grouped_default(rows, n, 7168, groups, per, h100);
    // Seed case 3 (2 groups, 512 rows, N 3072): 5 × 24 = 120 tiles, one round at 128 columns.
    assert_eq!(tile(512, 3072, 2, 256).tile, Tile::M128);
    // Seed case 1 (8 groups, 1024 rows, N 4096): 12 × 32 tiles.
    assert_eq!(tile(1024, 4096, 8, 128).tile, Tile::M128);
    // One group of 100 rows, N 4096: 32 tiles, 64 half tiles fit one round.
    assert_eq!(tile(100, 4096, 1, 100).tile, Tile::M128N64);
    // Large groups take the dense rule, without split-K.
    let large = tile(32768, 4096, 4, 8192);
    assert_eq!((large.tile.block_m(), large.split_k), (256, 1));
}

#[test]
fn grouped_prefill_takes_the_dense_rule_for_all_its_rows() {
    let h200 = 132;
    // Mixtral-like prefill: 8 experts, 4096 tokens (a mean of 512 a group), N 14336, K 4096: the
    // dense rule's 256-row tiles in pairs along N, in bands, one K range.
    let pairs_n = ClusterShape { m: 1, n: 2 };
    let g = sm90_grouped_default(4096, 14336, 4096, 8, 512, h200);
    assert_eq!(
        (g.tile, g.cluster, g.split_k),
        (Tile::M256, pairs_n, 1),
        "{g:?}"
    );
    assert!(g.group_m > 1, "{g:?}");
    // Masked: 8 batch entries of 512 rows each are the same rows.
    let masked = sm90_grouped_default(512, 14336, 4096, 8, 512, h200);
    assert_eq!((masked.tile, masked.cluster), (Tile::M256, pairs_n));
    // Bands never taller than the grouped operand.
    assert!(masked.group_m as usize * 512 <= 512 * 2, "{masked:?}");
    // Below the threshold: 128-row tiles, one CTA each, no bands.
    let small = sm90_grouped_default(8 * 511, 14336, 4096, 8, 511, h200);
    assert_eq!(
        (small.tile, small.cluster, small.group_m),
        (Tile::M128, ClusterShape::ONE, 1)
    );
}

/// The choice's ladder, rung by rung, on Hopper and on an architecture with only the reference
/// kernel: each pair on the family that takes it, the thresholds on their right side, ragged K
/// of FP8 with fp32 scales an error, and everything else the reference kernel.
#[test]
fn each_pair_runs_on_the_family_that_takes_it_and_the_rest_on_the_reference() {
    use crate::format::{Fp4Weights, Fp8, Recipe};
    let pair = |r: Recipe, m: usize, k: usize| {
        (
            MatrixDesc::of_recipe(r, m, k, false),
            MatrixDesc::of_recipe(r, 512, k, true),
        )
    };
    let plan = |(a, b): (MatrixDesc, MatrixDesc)| choose(GpuArch::Hopper, Hardware::H100, &a, &b);
    let ds = Recipe::DeepSeekFp8;
    assert!(matches!(plan(pair(ds, 256, 512)), Ok(Plan::Sm90Fp8(_))));
    let (a, b) = pair(ds, 256, 512);
    assert_eq!(
        choose(GpuArch::Blackwell, Hardware::with_sms(148), &a, &b).unwrap(),
        Plan::Reference
    );
    assert_eq!(
        (GpuArch::Hopper.target(), GpuArch::Blackwell.target()),
        ("sm_90a", "sm_100a")
    );
    // FP8 with fp32 scales and K not a multiple of 128: an error, not the slow kernel.
    for r in [ds, Recipe::Fp8PerTensor(Fp8::E4M3)] {
        assert!(
            matches!(plan(pair(r, 64, 200)), Err(Error::Shape(_))),
            "{r}"
        );
    }
    // ...but only when both are: an FP8 A with a bf16 B, or MXFP8 with K = 200 (no MX block
    // multiple either), run the reference kernel.
    let (a, _) = pair(ds, 64, 200);
    let (_, b16) = pair(Recipe::W4A16(Fp4Weights::Mxfp4), 64, 200);
    let mut bf16_b = b16;
    bf16_b.format = Recipe::W4A16(Fp4Weights::Mxfp4).a();
    assert_eq!(
        choose(GpuArch::Hopper, Hardware::H100, &a, &bf16_b).unwrap(),
        Plan::Reference
    );
    assert_eq!(
        plan(pair(Recipe::Mxfp8(Fp8::E4M3), 64, 200)).unwrap(),
        Plan::Reference
    );
    // An FP8 A with an MXFP8 B: not the FP8 kernel (B is not FP8 with fp32 scales); folded.
    let (a, _) = pair(ds, 64, 512);
    let (_, b) = pair(Recipe::Mxfp8(Fp8::E4M3), 64, 512);
    let p = choose(GpuArch::Hopper, Hardware::H100, &a, &b).unwrap();
    assert!(matches!(p, Plan::Sm90MxFp8(_)), "{p:?}");
    // 4-bit weights: bf16 activations at any M; NVFP4 pairs up to W4_MAX_M = 16 rows, then the
    // MX kernel, then the fold from FOLD_MIN_M = 256; pairs with e8m0 scales on the 4-bit-weights
    // kernels with A folded (the stream kernel to 16 rows, the FP8-MMA one above) to
    // W4A4_FP8_MAX_M rows, then the fold.
    let w4a16 = Recipe::W4A16(Fp4Weights::Mxfp4);
    assert!(matches!(plan(pair(w4a16, 256, 512)), Ok(Plan::Sm90W4(_))));
    let kinds = |r, ms: [usize; 4]| -> Vec<&str> {
        ms.map(|m| match plan(pair(r, m, 512)).unwrap() {
            Plan::Sm90W4(c) if c.stream => "stream",
            Plan::Sm90W4(c) if c.fp8 => "w4fp8",
            Plan::Sm90W4(_) => "w4",
            Plan::Sm90Mx(_) => "mx",
            Plan::Sm90MxFp8(_) => "fold",
            _ => "other",
        })
        .into()
    };
    assert_eq!(
        kinds(Recipe::Nvfp4, [16, 17, 255, 256]),
        ["w4", "mx", "mx", "fold"]
    );
    let top = super::W4A4_FP8_MAX_M;
    for r in [Recipe::Mxfp4, Recipe::E2m1E8m0x16] {
        let got = kinds(r, [16, 17, top, top + 1]);
        assert_eq!(got, ["stream", "w4fp8", "w4fp8", "fold"], "{r}");
    }
    // FP8 activations (W4A8): the 4-bit-weights kernels through one activation tile, then
    // weights with e8m0 scales folded per call (exactly) onto the FP8 kernel; NVFP4 weights,
    // whose fold rounds, stay.
    let from = super::W4A8_FOLD_MIN_M;
    assert_eq!(
        kinds(Recipe::W4A8(Fp4Weights::Mxfp4), [16, 17, from - 1, from]),
        ["stream", "w4fp8", "w4fp8", "fold"]
    );
    assert_eq!(
        kinds(Recipe::W4A8(Fp4Weights::Nvfp4), [16, 17, from, 4096]),
        ["stream", "w4", "w4", "w4"]
    );
}

/// `Plan::validate` and `validate_grouped` go to the plan's own configuration: a configuration
/// the kernel lacks is refused through the plan for every family, the fold's included; grouped
/// GEMM refuses the families without grouped kernels and a split K, naming which.
#[test]
fn a_plan_validates_through_its_familys_configuration() {
    let s = GemmShape {
        m: 300,
        n: 520,
        k: 1024,
        l: 1,
    };
    let fp8 = sm90_default(s.m, s.n, s.k, s.l, Hardware::H100);
    for p in [
        Plan::Sm90Fp8(fp8.with_ctas(0)),
        Plan::Sm90MxFp8(fp8.with_ctas(0)),
        Plan::Sm90Mx(sm90_mx_default(s.m, s.n, s.k, s.l, 132).with_ctas(0)),
        Plan::Sm90W4(sm90_w4_default(s.m, s.n, s.k, s.l, 132).with_ctas(0)),
        Plan::Sm90Half(sm90_half_default(s.m, s.n, 132).with_ctas(0)),
    ] {
        assert!(matches!(p.validate(&s), Err(Error::Config(_))), "{p:?}");
        assert!(p.validate_grouped(&s).is_err(), "{p:?}");
    }
    let huge = GemmShape { m: 1 << 30, ..s };
    assert!(matches!(
        Plan::Reference.validate(&huge),
        Err(Error::Shape(_))
    ));
    assert!(Plan::Reference.validate(&s).is_ok());
    for p in [Plan::Sm90Fp8(fp8), Plan::Sm90MxFp8(fp8)] {
        let one = |c: Sm90Config| match p {
            Plan::Sm90Fp8(_) => Plan::Sm90Fp8(c),
            _ => Plan::Sm90MxFp8(c),
        };
        assert!(
            one(fp8.with_split_k(1)).validate_grouped(&s).is_ok(),
            "{p:?}"
        );
        let split = one(fp8.with_split_k(2)).validate_grouped(&s);
        assert!(
            matches!(&split, Err(Error::Config(m)) if m.contains("split_k")),
            "{split:?}"
        );
    }
    for p in [
        Plan::Reference,
        Plan::Sm90Half(sm90_half_default(s.m, s.n, 132)),
    ] {
        let r = p.validate_grouped(&s);
        assert!(
            matches!(&r, Err(Error::Config(m)) if m.contains("no grouped kernel")),
            "{r:?}"
        );
    }
}

/// The fold's fused epilogue is the FP8 kernel's on the types the operands fold to (NVFP4's
/// e2m1 folds to e4m3, which fuses), on a tile that computes C (the swapped ones are refused as
/// computing Cᵀ); FP4 pairs at decode size move from the 4-bit-weights kernel to the MX one
/// where they fuse, bf16 activations with 4-bit weights have no fused kernel, and a 16-bit plan
/// moves to its fused 128 × 128 tile.
#[test]
fn fused_plans_take_the_folds_types_and_the_kernels_that_fuse() {
    use crate::format::{Fp4Weights, Recipe};
    let needs = |elems, block_cols| FusedNeeds {
        block_cols,
        elems,
        in_registers: sm90::InRegisters::No,
    };
    let s = GemmShape {
        m: 4096,
        n: 7168,
        k: 2048,
        l: 1,
    };
    let cfg = sm90_default(s.m, s.n, s.k, s.l, Hardware::H100).with_tile_for(Tile::M128, &s);
    let fp4 = (ElemType::E2M1, ElemType::E2M1);
    assert!(Plan::Sm90MxFp8(cfg).check_fused(needs(fp4, 128)).is_ok());
    let swapped = sm90_default(16, 7168, 2048, 1, Hardware::H100);
    let r = Plan::Sm90MxFp8(swapped).check_fused(needs(fp4, 0));
    assert!(
        matches!(&r, Err(Error::Config(m)) if m.contains("Cᵀ")),
        "{r:?}"
    );
    let fused = |r: Recipe, m: usize| {
        let (a, b) = (
            MatrixDesc::of_recipe(r, m, 2048, false),
            MatrixDesc::of_recipe(r, 512, 2048, true),
        );
        let elems = (a.format.elem, b.format.elem);
        let shape = GemmShape {
            m,
            n: 512,
            k: 2048,
            l: 1,
        };
        choose_fused(
            GpuArch::Hopper,
            Hardware::H100,
            &shape,
            (&a, &b),
            needs(elems, 0),
        )
    };
    assert!(matches!(fused(Recipe::Mxfp4, 16), Ok(Plan::Sm90Mx(_))));
    assert!(fused(Recipe::W4A16(Fp4Weights::Mxfp4), 16).is_err());
    let half = Recipe::W4A16(Fp4Weights::Mxfp4).a();
    let (a, b) = (
        MatrixDesc {
            format: half,
            ..MatrixDesc::of_recipe(Recipe::Mxfp4, 4096, 4096, false)
        },
        MatrixDesc {
            format: half,
            ..MatrixDesc::of_recipe(Recipe::Mxfp4, 4096, 4096, true)
        },
    );
    let shape = GemmShape {
        m: 4096,
        n: 4096,
        k: 4096,
        l: 1,
    };
    assert_ne!(sm90_half_default(4096, 4096, 132).tile, HalfTile::M128);
    let elems = (ElemType::BF16, ElemType::BF16);
    match choose_fused(
        GpuArch::Hopper,
        Hardware::H100,
        &shape,
        (&a, &b),
        needs(elems, 0),
    ) {
        Ok(Plan::Sm90Half(c)) => assert_eq!(c.tile, HalfTile::M128),
        other => panic!("{other:?}"),
    }
}

/// Block-sparse plans: Hopper only; e4m3 blocks on the FP8 kernel, 16-bit ones on the 16-bit
/// kernel with 256-row tiles where M is large and the block rows hold enough stored blocks on
/// average (stored blocks over block columns), 128-row tiles otherwise.
#[test]
fn block_sparse_plans_follow_the_blocks_type_and_their_runs() {
    let s = GemmShape {
        m: 8192,
        n: 1024,
        k: 4096,
        l: 1,
    };
    assert!(choose_bsr(GpuArch::Blackwell, 148, &s, (ElemType::E4M3, 128, 64)).is_err());
    assert!(matches!(
        choose_bsr(GpuArch::Hopper, 132, &s, (ElemType::E4M3, 128, 64)),
        Ok(Plan::Sm90Fp8(_))
    ));
    let half = |nnz| match choose_bsr(GpuArch::Hopper, 132, &s, (ElemType::BF16, 128, nnz)) {
        Ok(Plan::Sm90Half(c)) => c.tile,
        other => panic!("{other:?}"),
    };
    // 1024 columns are 8 blocks of 128: 64 stored blocks are 8 per block row, 8 are 1.
    assert_eq!(half(64), HalfTile::M256);
    assert_eq!(half(8), HalfTile::M128);
}

/// Rows per group as the grouped rules see them: the capacity of masked groups, the mean of
/// contiguous ones (rounded up).
#[test]
fn a_groups_rows_are_the_capacity_or_the_mean() {
    use crate::format::Recipe;
    let (a, b) = (
        MatrixDesc::of_recipe(Recipe::DeepSeekFp8, 64, 512, false),
        MatrixDesc::of_recipe(Recipe::DeepSeekFp8, 512, 512, true),
    );
    let problem = |m, l, groups| GroupedProblem {
        arch: GpuArch::Hopper,
        hw: Hardware::H100,
        shape: GemmShape {
            m,
            n: 512,
            k: 512,
            l,
        },
        a: &a,
        b: &b,
        groups,
    };
    assert_eq!(problem(64, 4, 4).per_group(), 64);
    assert_eq!(problem(1000, 1, 8).per_group(), 125);
    assert_eq!(problem(1001, 1, 8).per_group(), 126);
}

/// The shared split-K rule: no split once the tiles fill half the SMs; else as many ranges as
/// fill the SMs, at least `MIN_SPLIT_K_BLOCKS` blocks each, and only where the shorter loop
/// saves more than the split costs.
#[test]
fn split_k_fills_idle_sms_only_where_it_pays() {
    use crate::families::heuristic::split_k;
    // 66 tiles on 132 SMs: exactly half, so split in 2 (64 blocks: 32 each).
    assert_eq!(split_k(66, 64, 132, 0), 2);
    assert_eq!(split_k(67, 64, 132, 0), 1);
    // Ranges of at least 4 blocks: 16 blocks allow 4 ranges, not 132.
    assert_eq!(split_k(1, 16, 132, 0), 4);
    // The split must save more than it costs: 32 + 32 blocks is no saving over 64.
    assert_eq!(split_k(66, 64, 132, 32), 1);
    assert_eq!(split_k(66, 64, 132, 31), 2);
}

/// Whatever the streaming model chooses (swapped tiles of any rows, shared B tiles, 128 × 128
/// against 128 × 64, any split) is a configuration the kernel accepts for the shape, on either
/// GPU's DRAM rate and any SM count.
#[test]
fn every_small_m_choice_is_a_valid_configuration() {
    for hw in [Hardware::H100, Hardware::H200, Hardware::with_sms(78)] {
        for m in [
            1, 2, 15, 16, 17, 31, 33, 48, 63, 64, 65, 80, 96, 100, 127, 128, 129,
        ] {
            for n in [1, 100, 576, 1000, 2112, 4608, 7168, 24576] {
                for k in [128, 512, 1024, 2048, 7168, 16384] {
                    for l in [1, 3] {
                        let c = sm90_default(m, n, k, l, hw);
                        let s = GemmShape { m, n, k, l };
                        assert!(c.validate(&s).is_ok(), "{s:?} {hw:?}: {c:?}");
                        assert!(
                            c.split_k >= 1 && c.split_k as usize <= k / 128,
                            "{s:?}: {c:?}"
                        );
                    }
                }
            }
        }
    }
}
