//! What every family's configuration rules share: the scheduler band and the split-K rule.

/// Split-K when the tiles fill less than half the SMs: as many K ranges as keep every CTA busy
/// without a second round, each at least `MIN_SPLIT_K_BLOCKS` K blocks long, and only when the
/// shorter K loop saves more than the split costs (`cost_blocks`).
pub(crate) fn split_k(tiles: usize, k_blocks: usize, sm_count: u32, cost_blocks: usize) -> u32 {
    // (Stated for the reader: past half the SMs `sm_count / tiles` is 1 below as well, so a
    // change to this test's arithmetic that moves only tiles above half cannot change the result.)
    if 2 * tiles > sm_count as usize {
        return 1;
    }
    let split = (sm_count as usize / tiles.max(1))
        .min(k_blocks / MIN_SPLIT_K_BLOCKS)
        .max(1);
    if k_blocks.div_ceil(split) + cost_blocks < k_blocks {
        split as u32
    } else {
        1
    }
}

/// Shortest K range of a split, in blocks of 128.
pub(crate) const MIN_SPLIT_K_BLOCKS: usize = 4;

/// Rows of A in one scheduler band: a band's A tiles (2048 × K bytes) stay small next to the
/// 50 MB L2 for K up to 16k (the band sweep: docs/perf-log, the sm90 FP8 kernel).
pub(crate) const GROUP_ROWS: u32 = 2048;
