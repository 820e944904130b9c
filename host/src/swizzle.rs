//! The 128×4 swizzled scale layout of cuBLAS's block-scaled GEMMs, CUTLASS's SM100 block-scaled
//! kernels and torch's `to_blocked` (what `torch._scaled_mm` takes for MXFP8 / MXFP4 / NVFP4):
//! the `(rows, K/block)` scale grid of one batch entry, padded to whole tiles of 128 rows × 4
//! K blocks, tiles in row-major order (row tiles outer), each tile of 512 scales stored as
//! 32 × 4 × 4: scale `(r, c)` of a tile at `(r % 32)·16 + (r / 32)·4 + c`. Batch entries follow
//! each other, each padded to whole tiles. Not affine in `(r, c)`, so not a [`ScaleLayout`]: a
//! matrix given this way is re-laid out into the packed K-major layout on construction, and
//! [`ScaledMatrix::scales_swizzled_128x4`] writes it back out.

use crate::error::{Result, shape};
use crate::format::{OperandFormat, ScaleBlock, ScaleMajor, ScaleType};
use crate::matrix::{ScaleLayout, ScaledMatrix};

pub use blockscaled_kernels::format::swizzle::{swizzled_128x4_index, swizzled_128x4_len};

/// The scale grid of an operand: (row blocks, K blocks).
fn grid(format: &OperandFormat, rows: usize, k: usize) -> (usize, usize) {
    let (br, bk) = format.block.extent(rows, k);
    (rows.div_ceil(br.max(1)), k.div_ceil(bk.max(1)))
}

/// The swizzled layout holds one-byte scales of row-wise blocks (MX, NVFP4): others are
/// [`crate::Error::Format`].
fn check_format(format: &OperandFormat) -> Result<()> {
    let one_byte = matches!(format.scale, ScaleType::E8M0 | ScaleType::UE4M3);
    let row_wise = matches!(format.block, ScaleBlock::Tile { rows: 1, .. });
    if one_byte && row_wise {
        Ok(())
    } else {
        Err(format.error(
            "the 128×4 swizzled scale layout holds one-byte scales of 1×k blocks (MX, NVFP4)",
        ))
    }
}

impl ScaledMatrix {
    /// As [`ScaledMatrix::from_parts`], with the scales in the 128×4 swizzled layout (see the
    /// module doc): `scales` holds `batch` entries of whole tiles; padding scales are not read.
    /// The matrix keeps them in the packed K-major layout.
    pub fn from_parts_swizzled_128x4(
        format: OperandFormat,
        rows: usize,
        k: usize,
        batch: usize,
        data: Vec<u8>,
        scales: Vec<u8>,
        tensor_scale: f32,
    ) -> Result<Self> {
        check_format(&format)?;
        format.validate()?;
        let (rb, kb) = grid(&format, rows, k);
        let per = swizzled_128x4_len(rb, kb)
            .ok_or_else(|| shape(format!("{rb}×{kb} scales overflow")))?;
        let need = per
            .checked_mul(batch)
            .ok_or_else(|| shape(format!("{batch} × {per} scales overflow")))?;
        if scales.len() != need {
            return Err(shape(format!(
                "{format}: {batch} batch entries of {rb}×{kb} scales take {need} bytes in the \
                 128×4 swizzled layout (whole tiles), got {}",
                scales.len()
            )));
        }
        let layout = ScaleLayout::packed(ScaleMajor::K, rb, kb);
        let mut packed = vec![0u8; rb * kb * batch];
        for l in 0..batch {
            for r in 0..rb {
                for c in 0..kb {
                    packed[layout.index(l, r, c)] =
                        scales[l * per + swizzled_128x4_index(r, c, kb)];
                }
            }
        }
        ScaledMatrix::from_parts(format, rows, k, batch, data, packed, layout, tensor_scale)
    }

    /// The scales in the 128×4 swizzled layout (padding scales 0), for the libraries that take
    /// it; [`crate::Error::Format`] for formats it does not hold.
    pub fn scales_swizzled_128x4(&self) -> Result<Vec<u8>> {
        let d = self.desc();
        check_format(&d.format)?;
        let (rb, kb) = (d.scale_layout.row_blocks, d.scale_layout.k_blocks);
        let per = swizzled_128x4_len(rb, kb)
            .ok_or_else(|| shape(format!("{rb}×{kb} scales overflow")))?;
        let mut out = vec![0u8; per * d.batch];
        for l in 0..d.batch {
            for r in 0..rb {
                for c in 0..kb {
                    out[l * per + swizzled_128x4_index(r, c, kb)] =
                        self.scales()[d.scale_layout.index(l, r, c)];
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// torch's `to_blocked`, step by step: pad to (128·R, 4·C), view (R, 128, C, 4), permute to
    /// (R, C, 128, 4), reshape (R·C, 4, 32, 4), transpose the middle two to (R·C, 32, 4, 4),
    /// flatten. Row `r` of a tile is `4·32` split as (r / 32, r % 32).
    fn to_blocked_index(r: usize, c: usize, cols: usize) -> usize {
        let (big_r, big_c) = (r / 128, c / 4);
        let (rr, cc) = (r % 128, c % 4);
        let tile = big_r * cols.div_ceil(4) + big_c;
        let (i, j) = (rr / 32, rr % 32); // (4, 32) of the reshape
        // After the transpose the order is (tile, j, i, cc).
        ((tile * 32 + j) * 4 + i) * 4 + cc
    }

    #[test]
    fn swizzled_index_is_torchs_to_blocked() {
        for (rows, cols) in [(1, 1), (128, 4), (129, 5), (300, 9), (37, 130)] {
            let mut seen = std::collections::HashSet::new();
            for r in 0..rows {
                for c in 0..cols {
                    let i = swizzled_128x4_index(r, c, cols);
                    assert_eq!(
                        i,
                        to_blocked_index(r, c, cols),
                        "({r}, {c}) of {rows}×{cols}"
                    );
                    assert!(i < swizzled_128x4_len(rows, cols).unwrap());
                    assert!(seen.insert(i));
                }
            }
        }
        // Hand-checked: row 33, column 1 of the first tile: 1·16 + 1·4 + 1.
        assert_eq!(swizzled_128x4_index(33, 1, 4), 21);
        // Row 0 of the second row tile with 5 columns (2 column tiles): tile 2.
        assert_eq!(swizzled_128x4_index(128, 0, 5), 2 * 512);
    }
}
