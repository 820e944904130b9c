//! The 128×4 swizzled scale layout of cuBLAS's block-scaled GEMMs, CUTLASS's SM100 block-scaled
//! kernels and torch's `to_blocked`: the `(rows, K/block)` scale grid of one batch entry, padded to
//! whole tiles of 128 rows × 4 K blocks, tiles in row-major order (row tiles outer), each tile of
//! 512 scales stored as 32 × 4 × 4: scale `(r, c)` of a tile at `(r % 32)·16 + (r / 32)·4 + c`.
//! One source for the host (`blockscaled::swizzle`) and the device quantizers.

/// Rows of one swizzled tile.
pub const TILE_ROWS: usize = 128;
/// K blocks of one swizzled tile.
pub const TILE_COLS: usize = 4;
/// Scales of one swizzled tile.
pub const TILE: usize = TILE_ROWS * TILE_COLS;

/// Scale elements of one batch entry of a `row_blocks` × `k_blocks` grid in the swizzled layout
/// (whole tiles), or `None` on overflow.
#[inline]
pub fn swizzled_128x4_len(row_blocks: usize, k_blocks: usize) -> Option<usize> {
    row_blocks
        .div_ceil(TILE_ROWS)
        .checked_mul(k_blocks.div_ceil(TILE_COLS))?
        .checked_mul(TILE)
}

/// Where scale `(r, c)` of a grid with `k_blocks` columns sits in one batch entry's swizzled
/// buffer.
#[inline]
pub fn swizzled_128x4_index(r: usize, c: usize, k_blocks: usize) -> usize {
    let tile = (r / TILE_ROWS) * k_blocks.div_ceil(TILE_COLS) + c / TILE_COLS;
    let (rr, cc) = (r % TILE_ROWS, c % TILE_COLS);
    tile * TILE + (rr % 32) * 16 + (rr / 32) * 4 + cc
}
