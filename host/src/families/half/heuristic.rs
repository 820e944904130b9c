//! The 16-bit family's configuration rules, fitted to sweeps, and their tuning constants.

use super::Sm90HalfConfig;
use crate::families::heuristic::GROUP_ROWS;
use blockscaled_kernels::gemm::scheduler::MAX_CLUSTER;
use blockscaled_kernels::sm90_half::HalfTile;

/// The dense 16-bit configuration: from `HALF_M256_MIN_M` rows, 128 × 256 tiles in pairs along
/// M (each pair shares its 256-row B tile by multicast) where they fill at least half the SMs;
/// else 128 × 128 tiles, or 128 × 64 where 128-column tiles would leave most SMs idle. Measured
/// (H100, against cuBLASLt bf16 in the same run, 4096³, 8192³ and 4096 × 7168 × 2048):
/// 128 × 256 pairs 0.98–1.02×, 256 × 128 alone 0.96–0.98×, 128 × 256 alone 0.91–0.93×, 128 × 128
/// 0.68–0.71×.
pub fn sm90_half_default(m: usize, n: usize, sm_count: u32) -> Sm90HalfConfig {
    let tiles = |t: HalfTile| m.div_ceil(t.block_m() as usize) * n.div_ceil(t.block_n as usize);
    let half_the_sms = sm_count as usize / 2;
    let (tile, cluster_m) = if m >= HALF_M256_MIN_M && tiles(HalfTile::M128N256) >= half_the_sms {
        (HalfTile::M128N256, MAX_CLUSTER)
    } else if tiles(HalfTile::M128) >= half_the_sms {
        (HalfTile::M128, 1)
    } else {
        (HalfTile::M128N64, 1)
    };
    half_config(tile, cluster_m, m, sm_count)
}

/// `tile` alone or in pairs along M (`cluster_m`), in bands of about `GROUP_ROWS` rows, on
/// every SM, K unsplit.
pub(crate) fn half_config(
    tile: HalfTile,
    cluster_m: u32,
    m: usize,
    sm_count: u32,
) -> Sm90HalfConfig {
    let unit = tile.block_m() * cluster_m;
    let m_units = m.div_ceil(unit as usize);
    Sm90HalfConfig {
        tile,
        cluster_m,
        group_m: m_units.clamp(1, (GROUP_ROWS / unit).max(1) as usize) as u32,
        ctas: sm_count.max(1),
        split_k: 1,
    }
}

/// Smallest M for the 16-bit kernel's 256-row units (256-row tiles, or 128 × 256 tiles in pairs).
pub(crate) const HALF_M256_MIN_M: usize = 1024;

/// The 16-bit block-sparse configuration for `m` dense rows, blocks of `block` rows and `runs`
/// stored blocks per block row on average: tiles as wide as a block (a tile's columns share one
/// run); 256 rows from `HALF_M256_MIN_M` rows when runs average at least `HALF_M256_MIN_RUN`
/// blocks (each stage feeds twice the MMAs), else 128 (twice the tiles to balance short runs:
/// 4096³ at 10%, 40 µs against 48; at 100%, 243 against 211; docs/perf-log, block-sparse bf16); runs cut into
/// up to 16 parts (`bsr::MAX_PARTS`) where they are longer than a CTA's share of the work.
pub fn sm90_half_bsr_default(m: usize, block: usize, runs: f64, sm_count: u32) -> Sm90HalfConfig {
    let tall = m >= HALF_M256_MIN_M && runs >= HALF_M256_MIN_RUN;
    let tile = match (tall, block >= 128) {
        (true, true) => HalfTile::M256,
        (false, true) => HalfTile::M128,
        (true, false) => HalfTile::M256N64,
        (false, false) => HalfTile::M128N64,
    };
    Sm90HalfConfig {
        split_k: crate::bsr::MAX_PARTS,
        ..half_config(tile, 1, m, sm_count)
    }
}

/// Fewest stored blocks per block row, on average, for the 16-bit block-sparse 256-row tiles.
pub(crate) const HALF_M256_MIN_RUN: f64 = 8.0;
