//! The 4-bit-weights family's configuration rule and its tuning constant.

use super::Sm90W4Config;
use crate::families::heuristic::{GROUP_ROWS, split_k};
use blockscaled_kernels::gemm::layout::SMEM_LIMIT;
use blockscaled_kernels::sm90_w4::{self as w4, W4Tile, stream};

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
        stream: false,
        fp8: false,
    }
}

/// [`sm90_w4_default`] on the FP8-MMA kernel (W4A8 with e8m0 weight scales, K a multiple of
/// 128): 128 activation rows per tile, K split over blocks of 128.
pub fn sm90_w4_fp8_default(m: usize, n: usize, k: usize, l: usize, sm_count: u32) -> Sm90W4Config {
    let tile = w4::fp8::FP8_TILE;
    let base = sm90_w4_default(m.max(tile.n as usize), n, k, l, sm_count);
    let weight_tiles = n.div_ceil(w4::WEIGHT_ROWS as usize);
    let tiles = weight_tiles * m.div_ceil(tile.n as usize) * l.max(1);
    let blocks = k.div_ceil(w4::fp8::FP8_BLOCK_K as usize);
    Sm90W4Config {
        tile,
        // (The split's cost in these blocks: each is two of the bf16 path's.)
        split_k: split_k(tiles, blocks, sm_count, W4_SPLIT_K_COST_BLOCKS / 2),
        fp8: true,
        ..base
    }
}

/// The stream kernel's configuration (bf16 or e4m3 activations, M ≤ 16): K split into the fewest ranges
/// that give about 1.6 CTAs per SM (⌈N / 128⌉ · L per range). Each SM then keeps its two CTAs'
/// loads in flight for most of the launch, while fewer, longer ranges write fewer partial sums and
/// stage the activations fewer times; where the waves come out even matters less than either (the
/// splits measured fastest on decode shapes are in docs/perf-log/w4.md). Each range keeps at
/// least [`stream::DEPTH`] chunks where K has them, and its staged activations fit two CTAs'
/// shared memory.
pub fn sm90_w4_stream_default(
    m: usize,
    n: usize,
    k: usize,
    l: usize,
    sm_count: u32,
) -> Sm90W4Config {
    let tiles = (n.div_ceil(stream::ROWS as usize) * l.max(1)) as u64;
    let chunks = k.div_ceil(stream::CHUNK_K as usize).max(1) as u32;
    let want = (sm_count.max(1) as u64 * 8).div_ceil(5);
    let longest = (chunks / stream::DEPTH as u32).max(1);
    let mut split = (want.div_ceil(tiles) as u32).clamp(1, longest);
    let fits =
        |s: u32| stream::smem_bytes_any(m as u32, chunks, s) <= SMEM_LIMIT / stream::MIN_BLOCKS;
    while split < chunks && !fits(split) {
        split += 1;
    }
    Sm90W4Config {
        tile: W4Tile::N16,
        group_m: 1,
        ctas: sm_count.max(1),
        split_k: split,
        stream: true,
        fp8: false,
    }
}

/// Split-K's cost for the 4-bit-weights kernel, in K blocks (see [`split_k`]).
pub(crate) const W4_SPLIT_K_COST_BLOCKS: usize = 8;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::PlanConfig;
    use crate::matrix::GemmShape;

    #[test]
    fn the_stream_split_is_the_fewest_ranges_for_1_6_ctas_per_sm_and_always_valid() {
        for ((m, n, k), want) in [
            ((1, 14336, 4096), 2),
            ((1, 7168, 4096), 4),
            ((1, 4096, 7168), 7),
            ((16, 7168, 2048), 4),
        ] {
            assert_eq!(
                sm90_w4_stream_default(m, n, k, 1, 132).split_k,
                want,
                "{m}x{n}x{k}"
            );
        }
        for m in [1, 8, 9, 16] {
            for n in [1, 100, 4096, 65_536] {
                for k in [32, 96, 4096, 65_536] {
                    for sms in [1, 78, 132] {
                        let cfg = sm90_w4_stream_default(m, n, k, 2, sms);
                        let s = GemmShape { m, n, k, l: 2 };
                        assert!(cfg.stream && cfg.validate(&s).is_ok(), "{s:?} {cfg:?}");
                    }
                }
            }
        }
    }
}
