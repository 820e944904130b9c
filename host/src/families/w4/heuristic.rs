//! The 4-bit-weights family's configuration rule and its tuning constant.

use super::Sm90W4Config;
use crate::families::heuristic::{GROUP_ROWS, split_k};
use blockscaled_kernels::sm90_w4::{self as w4, W4Tile};

/// The sm90 4-bit-weights configuration: 16 activation rows per tile when M fits one (decode),
/// else 128; K split where the tiles leave most SMs idle.
pub fn sm90_w4_default(m: usize, n: usize, k: usize, l: usize, sm_count: u32) -> Sm90W4Config {
    let tile = if m <= 16 { W4Tile::N16 } else { W4Tile::N128 };
    let weight_tiles = n.div_ceil(w4::WEIGHT_ROWS as usize);
    let tiles = weight_tiles * m.div_ceil(tile.n as usize) * l.max(1);
    Sm90W4Config {
        tile,
        group_m: weight_tiles.clamp(1, (GROUP_ROWS / w4::WEIGHT_ROWS) as usize) as u32,
        ctas: sm_count.max(1),
        split_k: split_k(
            tiles,
            k.div_ceil(w4::BLOCK_K as usize),
            sm_count,
            W4_SPLIT_K_COST_BLOCKS,
        ),
    }
}

/// Split-K's cost for the 4-bit-weights kernel, in K blocks (see [`split_k`]).
pub(crate) const W4_SPLIT_K_COST_BLOCKS: usize = 8;
