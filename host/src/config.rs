//! Which kernel runs a GEMM, and with what configuration: one function, rules stated as data.

use crate::device::GpuArch;
use crate::error::{Result, shape};
use crate::format::ScaleType;
use crate::matrix::MatrixDesc;
pub use crate::sm90::Sm90Config;
use blockscaled_kernels::params::sm90::Tile;

/// A kernel and its configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// The SIMT reference kernel (every format; slow).
    Reference,
    /// The Hopper TMA + wgmma FP8 kernel with fp32 block scales.
    Sm90Fp8(Sm90Config),
}

/// Picks the kernel for A (M×K) · Bᵀ (N×K) on `arch` with `sm_count` SMs.
///
/// - Hopper, e4m3 with fp32 scales that are constant over 1×128 (A) and 128×128 (B) blocks —
///   DeepSeek, per-tensor, per-row A — runs the sm90 kernel. Its 128-wide scale blocks need
///   K % 128 == 0: other K are an error rather than a silent 1000× slower path.
/// - Everything else runs the reference kernel for now (MX / NVFP4 fast kernels: later issues).
///
/// Cluster: 256- and 192-row tiles go in pairs along N (`cluster_n` = 2: the pair shares the A
/// tile, the larger operand, by TMA multicast, halving its L2 reads) whenever pairing costs no
/// extra round of tiles (a pair whose second tile is past N still takes a slot); 128-row tiles
/// run alone (measured faster). Pairs along M (`cluster_m` = 2, sharing B) are available through
/// [`Sm90Config`]. See `cluster` (private).
///
/// Raster band (`group_m`): CTAs running together cover `group_m` M tiles × (SMs / group_m) N
/// tiles, so both operands' working sets stay in L2.
pub fn choose(arch: GpuArch, sm_count: u32, a: &MatrixDesc, b: &MatrixDesc) -> Result<Plan> {
    if arch != GpuArch::Hopper {
        return Ok(Plan::Reference);
    }
    let fp32_scaled = a.format.scale == ScaleType::F32 && b.format.scale == ScaleType::F32;
    let a_no = crate::sm90::unsupported(a, false);
    let b_no = crate::sm90::unsupported(b, true);
    match (a_no, b_no) {
        (None, None) => Ok(Plan::Sm90Fp8(sm90_default(
            a.rows, b.rows, a.k, a.batch, sm_count,
        ))),
        _ if fp32_scaled
            && !a.k.is_multiple_of(128)
            && matches!(a.format.elem, crate::ElemType::E4M3 | crate::ElemType::E5M2) =>
        {
            Err(shape(format!(
                "K = {} is not a multiple of 128: the Hopper FP8 kernel's 128-wide scale blocks need it \
             (Gpu::reference_gemm computes it, slowly)",
                a.k
            )))
        }
        _ => Ok(Plan::Reference),
    }
}

/// The sm90 configuration `choose` uses for an A of `m` rows and a B of `n` rows (`l` batch
/// entries) on a GPU with `sm_count` SMs (the runner starts from it when it forces a field).
///
/// Tile: the persistent CTAs work through the tiles in rounds of `sm_count`; the time is about
/// rounds × the time of one tile ([`tile_cost`], in 128-row tiles). The 256-row tile does twice
/// the work with a quarter fewer L2 bytes per FLOP, so it wins unless its coarser rounds leave SMs
/// idle (small M, or few tiles); the 192-row tile sits between them and fills rounds that
/// neither does (4096 × 2112: 3 rounds of 192-row tiles for 5 of 128 or 3 of 256). Where A is one
/// 128-row tile (M ≤ [`N64_MAX_M`]), 128 × 64 tiles double the tiles: more SMs share B, the
/// operand that comes from DRAM, while A stays in L2.
pub fn sm90_default(m: usize, n: usize, k: usize, l: usize, sm_count: u32) -> Sm90Config {
    let cost = |t: Tile| {
        let tiles = m.div_ceil(t.block_m() as usize) * n.div_ceil(t.block_n as usize) * l.max(1);
        let rounds = tiles.div_ceil(sm_count.max(1) as usize) as f64;
        rounds * tile_cost(t)
    };
    let mut candidates = vec![Tile::M256, Tile::M192, Tile::M128];
    if m <= N64_MAX_M {
        candidates.push(Tile::M128N64);
    }
    // Ties go to the earlier (taller, wider) tile: fewer L2 bytes for the same time.
    let tile = candidates.into_iter().fold(
        Tile::M256,
        |best, t| if cost(t) < cost(best) { t } else { best },
    );
    let n_tiles = n.div_ceil(tile.block_n as usize) * l.max(1);
    let m_tiles = m.div_ceil(tile.block_m() as usize) as u32;
    let tiles = m_tiles as usize * n_tiles;
    let split_k = split_k(tiles, k, sm_count);
    let (cluster_m, cluster_n) = if split_k == 1 {
        cluster(
            tile,
            m_tiles as usize,
            n.div_ceil(tile.block_n as usize),
            l.max(1),
            sm_count,
        )
    } else {
        (1, 1)
    };
    Sm90Config {
        block_m: tile.block_m(),
        block_n: tile.block_n,
        // Bands of 2048 rows of A (16 × 128 or 8 × 256).
        group_m: m_tiles.clamp(1, GROUP_ROWS / tile.block_m()),
        ctas: sm_count,
        cluster_m,
        cluster_n,
        split_k,
    }
}

/// CTAs per cluster along M and N: for 256- and 192-row tiles a pair along N (it shares A, 2 or
/// 1.5 times B's bytes) when the tiles fill at least one round and pairing them (units of two
/// tiles on half as many pairs of SMs) takes no more rounds. Measured on the H100 (docs/PERF.md, v9–v10): 8192³ with
/// 256-row tiles 961 µs alone, 930 paired along M, 927 along N; 4096×7168×2048 even. 128-row
/// tiles (two K blocks in flight per consumer, v10) ran 1–4% slower paired along M than alone
/// (8192³ 1077 vs 1060 µs, 4096×2112×7168 151 vs 145) and along N (v20: 128×7168×2048 16.0 vs
/// 14.6 µs, 128×24576×1536 24.9 vs 23.6, 8192³ 1097), so they stay alone. 192-row tiles (v20):
/// along N 4096×2112×7168 120.3 µs against 123.4 alone, 8192³ 933 against 952–987; along M
/// slower (1027, 125.5).
fn cluster(tile: Tile, m_tiles: usize, n_tiles: usize, l: usize, sm_count: u32) -> (u32, u32) {
    let sms = sm_count.max(2) as usize;
    let tiles = m_tiles * n_tiles * l;
    if tiles < sms {
        return (1, 1);
    }
    let rounds = tiles.div_ceil(sms);
    let pair_rounds =
        |cm: usize, cn: usize| (m_tiles.div_ceil(cm) * n_tiles.div_ceil(cn) * l).div_ceil(sms / 2);
    if tile.block_m() > 128 && pair_rounds(1, 2) <= rounds {
        (1, 2)
    } else {
        (1, 1)
    }
}

/// Split-K when the tiles fill less than half the SMs: as many K ranges as keep every CTA busy
/// without a second round, each at least [`MIN_SPLIT_K_BLOCKS`] K blocks long, and only when the
/// shorter K loop saves more than the reduction costs ([`SPLIT_K_COST_BLOCKS`]).
fn split_k(tiles: usize, k: usize, sm_count: u32) -> u32 {
    let k_blocks = k / 128;
    if 2 * tiles > sm_count as usize {
        return 1;
    }
    let split = (sm_count as usize / tiles.max(1))
        .min(k_blocks / MIN_SPLIT_K_BLOCKS)
        .max(1);
    if k_blocks.div_ceil(split) + SPLIT_K_COST_BLOCKS < k_blocks {
        split as u32
    } else {
        1
    }
}

/// Shortest K range of a split, in blocks of 128.
const MIN_SPLIT_K_BLOCKS: usize = 4;
/// The f32 workspace round trip and the reduction launch, in K blocks of one 128×128 tile
/// (≈ 0.7 µs each at M = 128): measured on the H100, 128×7168×2048 split 2 took 20.7 µs against
/// 16.3 µs unsplit (16 K blocks), 128×2112×7168 split 7 took 20.2 µs against 39.1 (56 blocks).
const SPLIT_K_COST_BLOCKS: usize = 10;

/// Time of one tile in units of a 128-row tile's, measured on the H100:
/// - 256 rows: 1.74 (v9, same run, both tiles alone: 8192³ 16 rounds of 256-row tiles 960.6 µs,
///   32 rounds of 128-row tiles 1102.8 µs; 1.74 at 4096×7168×2048, 7 rounds 112.0 µs against
///   14 rounds 129.1 µs).
/// - 192 rows: 1.4 (v20, same run: 8192³ 21 rounds alone 986.8 µs against 32 rounds of 128-row
///   tiles in pairs 1091 µs; 4096×2112×7168 3 rounds 123.1 µs against 5 rounds 143.5 µs).
/// - 128 × 64: 0.6 (v22, M = 128, same run, one round each unless said: 128×7168×2048 12.7 µs
///   against 14.7; 128×7168×16384 49.2 against 62.7; 128×24576×1536 3 rounds 22.2 against 2
///   rounds 23.3; 128×32768×512 4 rounds 15.9 against 2 rounds 15.2). Per round the half tile
///   took 0.64–0.86 of a full one's time (these shapes wait on memory, not on the tensor
///   cores); 0.6 is the cost that reproduces every measured choice.
pub fn tile_cost(t: Tile) -> f64 {
    match (t.block_m(), t.block_n) {
        (256, _) => 1.75,
        (192, _) => 1.4,
        (_, 64) => 0.6,
        _ => 1.0,
    }
}

/// Largest M for 128 × 64 tiles: they read A once per 64 columns instead of 128, which only
/// pays where A is a single tile that stays in L2 and B (from DRAM) is what the SMs wait for.
pub const N64_MAX_M: usize = 128;

/// Rows of A in one scheduler band: a band's A tiles (2048 × K bytes) stay small next to the
/// 50 MB L2 for K up to 16k. Measured on the H100 (v14, 256-row tiles in pairs, same run): bands
/// of 512 / 1024 / 2048 / 4096 rows took 950 / 932 / 929 / 934 µs at 8192³ and 294 / 285 / 281 /
/// 279 µs at 4096×24576×1536; 128-row tiles were flat from 1024 to 2048 rows (v1).
const GROUP_ROWS: u32 = 2048;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tall_tiles_for_large_m_short_tiles_where_they_would_idle_sms() {
        let h100 = 132;
        assert_eq!(sm90_default(8192, 8192, 8192, 1, h100).block_m, 256);
        assert_eq!(sm90_default(4096, 7168, 2048, 1, h100).block_m, 256);
        // One 256-row tile per N tile would be half empty.
        assert_eq!(sm90_default(128, 7168, 2048, 1, h100).block_m, 128);
        assert_eq!(sm90_default(200, 2112, 7168, 1, h100).block_m, 128);
        // 4096 × 2112: 374 tiles of 192 rows are 3 rounds (544 of 128 rows are 5; 272 of 256
        // rows 3, at 1.75 each).
        assert_eq!(sm90_default(4096, 2112, 7168, 1, h100).block_m, 192);
        for (m, n) in [(8192, 8192), (4096, 2112), (200, 2112), (256, 7168)] {
            assert_eq!(sm90_default(m, n, 2048, 1, h100).block_n, 128, "{m}×{n}");
        }
    }

    #[test]
    fn narrow_tiles_only_for_one_row_of_tiles_that_leaves_sms_idle() {
        let h100 = 132;
        let tile = |m, n, k| {
            let c = sm90_default(m, n, k, 1, h100);
            (c.block_m, c.block_n)
        };
        // 56 tiles of 128 columns on 132 SMs: 112 of 64.
        assert_eq!(tile(128, 7168, 2048), (128, 64));
        // 2 rounds of 192 tiles against 3 rounds of 384 half tiles.
        assert_eq!(tile(128, 24576, 1536), (128, 64));
        // 256 tiles are 2 rounds; 512 half tiles 4.
        assert_eq!(tile(128, 32768, 512), (128, 128));
        // Never with more than one row of tiles (A is read once per 64 columns).
        assert_eq!(tile(129, 7168, 2048).1, 128);
        for (m, n, l) in [(1, 1, 1), (8192, 8192, 1), (128, 2112, 3)] {
            let c = sm90_default(m, n, 1024, l, h100);
            assert!(c.group_m >= 1 && c.group_m * c.block_m <= GROUP_ROWS.max(c.block_m));
            assert_eq!(c.ctas, h100);
        }
    }

    #[test]
    fn pairs_only_where_they_cost_no_extra_round() {
        let h100 = 132;
        let cl = |m, n, k| {
            let c = sm90_default(m, n, k, 1, h100);
            (c.cluster_m, c.cluster_n)
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
        assert_eq!(sm90_default(2048, 4224, 7168, 1, h100).block_m, 256);
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
        let h100 = 132;
        // 33 tiles of 128 × 64 × 4 ranges of 14 K blocks = 132 CTAs.
        assert_eq!(sm90_default(128, 2112, 7168, 1, h100).split_k, 4);
        // 64 tiles × 2 = 128 CTAs.
        assert_eq!(sm90_default(128, 4096, 7168, 1, h100).split_k, 2);
        // 384 tiles fill the GPU; 1024 tiles too.
        assert_eq!(sm90_default(128, 24576, 1536, 1, h100).split_k, 1);
        assert_eq!(sm90_default(4096, 4096, 7168, 1, h100).split_k, 1);
        // Too little K to split: 512 = 4 blocks is one range of 4; at K = 2048 (16 blocks) two
        // ranges of 8 save less than the reduction costs (measured slower).
        assert_eq!(sm90_default(128, 128, 512, 1, h100).split_k, 1);
        assert_eq!(sm90_default(128, 7168, 2048, 1, h100).split_k, 1);
        // 112 tiles of 128 × 64: no split (at 128 columns, 56 tiles took 2).
        assert_eq!(sm90_default(128, 7168, 16384, 1, h100).split_k, 1);
        assert_eq!(sm90_default(128, 7168, 16384, 1, h100).block_n, 64);
        for (m, n, k) in [(1, 1, 128), (64, 64, 128 * 300), (128, 2112, 7168)] {
            let c = sm90_default(m, n, k, 1, h100);
            assert!(c.split_k >= 1 && c.split_k as usize <= k / 128);
        }
    }
}
