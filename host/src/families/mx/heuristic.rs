//! The MX family's configuration rule, fitted to sweeps, and its tuning constants.

use super::Sm90MxConfig;
use crate::families::heuristic::{GROUP_ROWS, split_k};
use blockscaled_kernels::sm90::BLOCK_K;
use blockscaled_kernels::sm90_mx::{self as mx, MxTile};

/// The sm90 MX configuration `choose` uses (the runner starts from it when it forces a field).
///
/// Tile: rounds × the time of one tile, as for [`sm90_default`](crate::plan::sm90_default): a 128 × 256 tile costs
/// `MX_N256_COST` 128 × 128 tiles. Split-K where the tiles fill less than half the SMs (small
/// M: decode), with the split's cost in 64-wide K blocks. Band: `GROUP_ROWS` rows of A.
pub fn sm90_mx_default(m: usize, n: usize, k: usize, l: usize, sm_count: u32) -> Sm90MxConfig {
    let tiles =
        |t: MxTile| m.div_ceil(mx::BLOCK_M as usize) * n.div_ceil(t.block_n as usize) * l.max(1);
    let cost = |t: MxTile| {
        let rounds = tiles(t).div_ceil(sm_count.max(1) as usize) as f64;
        rounds * if t == MxTile::N256 { MX_N256_COST } else { 1.0 }
    };
    let tile = if cost(MxTile::N256) <= cost(MxTile::N128) {
        MxTile::N256
    } else {
        MxTile::N128
    };
    // The split rule counts K in blocks of 128 (its shortest range, `MIN_SPLIT_K_BLOCKS`, is
    // in those): the kernel's 64-wide blocks in pairs, the split's cost with them.
    let per = (BLOCK_K / mx::BLOCK_K) as usize;
    let k_blocks = k.div_ceil(mx::BLOCK_K as usize).div_ceil(per);
    let m_tiles = m.div_ceil(mx::BLOCK_M as usize);
    Sm90MxConfig {
        tile,
        group_m: m_tiles.clamp(1, (GROUP_ROWS / mx::BLOCK_M) as usize) as u32,
        ctas: sm_count.max(1),
        split_k: split_k(
            tiles(tile),
            k_blocks,
            sm_count,
            MX_SPLIT_K_COST_BLOCKS / per,
        ),
    }
}

/// Time of a 128 × 256 MX tile in 128 × 128 tiles: twice the MACs, read with fewer shared-memory
/// bytes per MAC (a first estimate; docs/perf-log, the sm90 MX kernel).
pub(crate) const MX_N256_COST: f64 = 1.8;

/// What a split costs the MX kernel, in 64-wide K blocks of one tile. Measured on the H200 (the
/// tuner's timings, docs/tune-data/h200.jsonl): MXFP8 16 × 7168 × 2048 (56 tiles, 32
/// blocks) ran 26.2 µs split in 2 against 33.9 unsplit, so a split of 2 pays from 16 + 12 < 32
/// blocks; none of the other timed MX shapes moves between 20 and 4. Each range is at least
/// `MIN_SPLIT_K_BLOCKS` blocks of 128: MXFP8 16 × 576 × 7168 (5 tiles) ran 24.3 µs split in 13,
/// 28.6 in 26 (ranges of 4 blocks of 64).
pub(crate) const MX_SPLIT_K_COST_BLOCKS: usize = 12;
