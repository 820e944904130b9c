//! The shared memory of a pipelined GEMM, computed from what one stage holds: per stage an A tile,
//! a B tile, A's scales and the words the producer thread copies itself; once, the output tile
//! staged for its TMA store; last, the pipeline's two barriers per stage. All A tiles come first,
//! then all B tiles, the output tile, all A-scale vectors, all words and the barriers, so every
//! tile stays 1024-byte aligned (what TMA destinations and `wgmma` descriptors with 128-byte
//! swizzle need) when the tile sizes are multiples of 1024.
//!
//! Host and device use the same type: the host to size the launch's shared memory, the kernels to
//! find each stage's buffers.

/// Largest dynamic shared memory per block on sm_90 (227 KiB).
pub const SMEM_LIMIT: u32 = 232_448;
/// Bytes of barriers per stage: a full and an empty `mbarrier` of 8 bytes.
pub const BARRIER_BYTES: u32 = 16;
/// Alignment of 128-byte-swizzled tiles.
pub const SWIZZLE_ALIGN: u32 = 1024;
/// Rows of one warpgroup's `wgmma` accumulator fragment (the M of m64nNk32): what one consumer
/// warpgroup computes per wave, and the rows of one output box.
pub const FRAGMENT_ROWS: u32 = 64;
/// Columns of one output box of the TMA-store epilogue for tiles of `block_n` columns (a multiple
/// of 16): 64 16-bit values, the 128-byte swizzle span, where they divide the tile, else 32
/// (64-byte swizzle) or 16 (32-byte swizzle): a box must not reach into the next tile's columns,
/// and its row is one swizzle span. The host encodes the output's tensor map with boxes of
/// `out_box_n(block_n)` × [`FRAGMENT_ROWS`] and the swizzle of [`out_box_swizzle_bytes`].
pub const fn out_box_n(block_n: u32) -> u32 {
    if block_n.is_multiple_of(64) {
        64
    } else if block_n.is_multiple_of(32) {
        32
    } else {
        16
    }
}

/// The output boxes' row and swizzle span in bytes (16-bit values): 128, 64 or 32.
pub const fn out_box_swizzle_bytes(block_n: u32) -> u32 {
    2 * out_box_n(block_n)
}

/// Box buffers per consumer warpgroup of a ring-staged output ([`out_staging`]): two, so that one
/// box is written while the TMA store of the other reads it.
pub const OUT_RING_SLOTS: u32 = 2;

/// The output staging of a tile of `consumers` × `waves` fragments of 64 rows × `block_n` 16-bit
/// columns: (bytes, whether it is a ring). The whole tile, one box per slot, unless that is more
/// than [`OUT_RING_SLOTS`] boxes per consumer: then a ring of that many boxes per consumer, which
/// the epilogue refills as the stores drain (a 128 × 256 or 256 × 128 tile stages 32 KiB instead
/// of 64 KiB: one more 48 KiB stage of the pipeline fits).
pub const fn out_staging(consumers: u32, waves: u32, block_n: u32) -> (u32, bool) {
    let box_bytes = FRAGMENT_ROWS * out_box_swizzle_bytes(block_n);
    let boxes = waves * block_n / out_box_n(block_n);
    if boxes > OUT_RING_SLOTS {
        (consumers * OUT_RING_SLOTS * box_bytes, true)
    } else {
        (consumers * boxes * box_bytes, false)
    }
}

/// Rows a warp stages in the fused epilogue (`gemm::epilogue::fuse`): its 16 rows of a fragment, all at
/// once, so that the fragment's registers are free while the rows are finished.
pub const FUSED_WARP_ROWS: u32 = 16;

/// Bytes of one staged row of `block_n` f32 in the fused epilogue, padded by 16 bytes: the row
/// reads (512 contiguous bytes per pass) are conflict-free, and the fragment's 8-byte writes
/// (rows `lane/4` and `+ 8`, column pairs `2·(lane % 4)`) of each half-warp fall on rows 4 words
/// apart, so at most two share a bank — once per tile. 32 bytes would make the writes
/// conflict-free but cost the 16-bit 128 × 128 fused kernel one of its 5 stages.
pub const fn fused_row_bytes(block_n: u32) -> u32 {
    4 * block_n + 16
}

/// Where lane `lane`'s fragment values go in its warp's staged rows: value pair `(i, i + 1)`,
/// `i = 4g + 2h` (the `wgmma` accumulator's order: row `lane/4 + 8h`, columns `8g + 2·(lane % 4)`
/// and `+ 1`), is at byte `fused_lane_offset(lane) + fused_pair_offset(g, h)`. Two parts: the
/// lane's, and a constant per pair that the stores take as an immediate.
pub const fn fused_lane_offset(lane: u32, block_n: u32) -> u32 {
    (lane / 4) * fused_row_bytes(block_n) + 8 * (lane % 4)
}

/// See [`fused_lane_offset`].
pub const fn fused_pair_offset(g: u32, h: u32, block_n: u32) -> u32 {
    8 * h * fused_row_bytes(block_n) + 32 * g
}

/// Byte offset of staged row `r`'s columns `4q..4q + 4` (what lane `q` of a row pass reads).
pub const fn fused_chunk_offset(r: u32, q: u32, block_n: u32) -> u32 {
    r * fused_row_bytes(block_n) + 16 * q
}

/// Bytes one warp stages in the fused epilogue: [`FUSED_WARP_ROWS`] rows.
pub const fn fused_warp_bytes(block_n: u32) -> u32 {
    FUSED_WARP_ROWS * fused_row_bytes(block_n)
}

/// The fused epilogue's staging of a tile of `consumers` warpgroups (four warps each) by
/// `block_n` columns: what a fused kernel's layout has in place of the output staging (or, for
/// kernels without room in shared memory, global memory per CTA: `EpilogueParams::scratch`).
pub const fn fused_staging(consumers: u32, block_n: u32) -> u32 {
    consumers * 4 * fused_warp_bytes(block_n)
}

/// Bytes at the end of a fused kernel's output region for the hand-over of staged tiles to the
/// finishing warps ([`super::pipeline::Handoff`]): its two barriers and a word per consumer warpgroup.
/// 128, so what follows (the A-scale boxes) stays aligned for its copies.
pub const HANDOFF_BYTES: u32 = 128;

/// A fused kernel's output region for a tile of `consumers` × `block_n` staged in shared memory:
/// the staging ([`fused_staging`]), then the hand-over.
pub const fn fused_out(consumers: u32, block_n: u32) -> u32 {
    fused_staging(consumers, block_n) + HANDOFF_BYTES
}

/// Every output box width [`out_box_n`] gives (the host encodes a map for each).
pub const OUT_BOX_WIDTHS: [u32; 3] = [64, 32, 16];

/// One TMA box of a tile's per-row scales (entries of `entry` bytes, one per row: an f32, or a
/// row's scale bytes of one stage), for a tile whose first row may be any row (a grouped GEMM's
/// groups start mid-tile). A tensor copy must start 16-byte aligned in global memory, so the box
/// starts at the aligned row at or below the tile's first and reaches [`ScaleBox::ALIGN`] bytes
/// further; the tile's row `r` is then entry `shift + r` of the box ([`ScaleBox::start`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScaleBox {
    /// Bytes per row.
    pub entry: u32,
    /// Rows of the tile the box serves.
    pub tile_rows: u32,
}

impl ScaleBox {
    /// The global alignment of a tensor copy's start.
    pub const ALIGN: u32 = 16;
    /// The alignment of a tensor copy's destination in shared memory.
    pub const SMEM_ALIGN: u32 = 128;

    /// Rows of the box: the tile's and the alignment's before it, rounded up to whole
    /// [`Self::SMEM_ALIGN`] bytes (so that the next box in shared memory starts aligned too, and
    /// the box delivers every byte of its slot, as the stage's barrier counts them).
    pub const fn rows(self) -> u32 {
        let bytes = (self.tile_rows + Self::ALIGN / self.entry) * self.entry;
        bytes.next_multiple_of(Self::SMEM_ALIGN) / self.entry
    }

    /// Bytes the box delivers, and its shared memory.
    pub const fn bytes(self) -> u32 {
        self.rows() * self.entry
    }

    /// For a tile whose first row is `row0`: the box's first row (aligned) and the tile's first
    /// row within the box.
    #[inline(always)]
    pub const fn start(self, row0: u32) -> (u32, u32) {
        let shift = row0 % (Self::ALIGN / self.entry);
        (row0 - shift, shift)
    }
}

/// What one stage holds, and the output staging buffer, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StageContents {
    /// The A tile (a multiple of [`SWIZZLE_ALIGN`]).
    pub a: u32,
    /// The B tile (a multiple of [`SWIZZLE_ALIGN`]).
    pub b: u32,
    /// The tile's scales (multiples of 128: the boxes of [`ScaleBox`] and bulk copies).
    pub sfa: u32,
    /// Bytes the producer thread copies into the stage with small asynchronous copies (a multiple
    /// of 8; the FP8 kernel's B scales of the K block): the stage's full barrier waits for them,
    /// but not as bytes of its transaction count.
    pub words: u32,
    /// The output tile staged for its TMA store, or whatever else the kernel keeps once rather
    /// than per stage (`sm90_mx`: its two bf16 buffers; a fused kernel: its staging and hand-over,
    /// [`fused_out`]); a multiple of [`SWIZZLE_ALIGN`] where TMA stores read it, of 128 always, 0 for
    /// none.
    pub out: u32,
}

/// Where everything is, for as many stages as fit in [`SMEM_LIMIT`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StageLayout {
    /// Shared address of the dynamic shared memory (0 on the host: offsets).
    pub base: u32,
    pub stages: u32,
    pub contents: StageContents,
}

impl StageLayout {
    /// As many stages as fit beside the output tile, each with its two barriers.
    pub const fn fit(contents: StageContents) -> Self {
        let c = contents;
        let stage = c.a + c.b + c.sfa + c.words + BARRIER_BYTES;
        StageLayout {
            base: 0,
            stages: (SMEM_LIMIT - c.out) / stage,
            contents,
        }
    }

    /// The same layout at shared address `base`.
    #[inline(always)]
    pub const fn at(self, base: u32) -> Self {
        StageLayout { base, ..self }
    }

    /// Bytes one fill of a stage's tensor and bulk copies deliver (tiles and scales; not the
    /// words).
    #[inline(always)]
    pub const fn stage_bytes(&self) -> u32 {
        self.contents.a + self.contents.b + self.contents.sfa
    }

    /// The dynamic shared memory a launch needs.
    pub const fn bytes(&self) -> u32 {
        self.stages * (self.stage_bytes() + self.contents.words + BARRIER_BYTES) + self.contents.out
    }

    #[inline(always)]
    pub const fn a(&self, s: u32) -> u32 {
        self.base + s * self.contents.a
    }
    #[inline(always)]
    pub const fn b(&self, s: u32) -> u32 {
        self.base + self.stages * self.contents.a + s * self.contents.b
    }
    /// The output staging tile.
    #[inline(always)]
    pub const fn out(&self) -> u32 {
        self.base + self.stages * (self.contents.a + self.contents.b)
    }
    #[inline(always)]
    pub const fn sfa(&self, s: u32) -> u32 {
        self.out() + self.contents.out + s * self.contents.sfa
    }
    /// Stage `s`'s words ([`StageContents::words`]).
    #[inline(always)]
    pub const fn words(&self, s: u32) -> u32 {
        self.sfa(0) + self.stages * self.contents.sfa + s * self.contents.words
    }
    /// A fused kernel's hand-over ([`HANDOFF_BYTES`] at the end of the output region).
    #[inline(always)]
    pub const fn handoff(&self) -> u32 {
        self.out() + self.contents.out - HANDOFF_BYTES
    }
    /// The pipeline's barriers (`stages` full, then `stages` empty).
    #[inline(always)]
    pub const fn barriers(&self) -> u32 {
        self.base + self.stages * (self.stage_bytes() + self.contents.words) + self.contents.out
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn fused_staging_puts_every_fragment_value_at_its_row_and_column_without_bank_conflicts() {
        for n in [64u32, 128, 256] {
            const SLOTS: usize = (fused_warp_bytes(256) / 4) as usize;
            // Each f32 slot of the warp's rows: which (row, column) was written there, once.
            let mut slot: [Option<(u32, u32)>; SLOTS] = [None; SLOTS];
            let slots = (fused_warp_bytes(n) / 4) as usize;
            for lane in 0..32 {
                for g in 0..n / 8 {
                    for h in 0..2 {
                        let at = fused_lane_offset(lane, n) + fused_pair_offset(g, h, n);
                        assert_eq!(at % 8, 0, "8-byte stores are aligned");
                        for e in 0..2 {
                            let (row, col) = (lane / 4 + 8 * h, 8 * g + 2 * (lane % 4) + e);
                            let s = (at / 4 + e) as usize;
                            assert!(s < slots && slot[s].is_none(), "n {n} lane {lane}");
                            slot[s] = Some((row, col));
                        }
                    }
                }
            }
            // A row pass reads back every row's columns in order.
            for r in 0..FUSED_WARP_ROWS {
                for q in 0..n / 4 {
                    let at = fused_chunk_offset(r, q, n);
                    assert_eq!(at % 16, 0, "16-byte loads are aligned");
                    for k in 0..4 {
                        assert_eq!(slot[(at / 4 + k) as usize], Some((r, 4 * q + k)));
                    }
                }
            }
            // Each half-warp's 8-byte stores of one pair: at most two on a bank.
            for g in 0..n / 8 {
                for h in 0..2 {
                    for half in 0..2 {
                        let mut banks = [0u32; 32];
                        for lane in 16 * half..16 * half + 16 {
                            let w = (fused_lane_offset(lane, n) + fused_pair_offset(g, h, n)) / 4;
                            banks[(w % 32) as usize] += 1;
                            banks[((w + 1) % 32) as usize] += 1;
                        }
                        assert!(banks.iter().all(|&b| b <= 2), "n {n}: {banks:?}");
                    }
                }
            }
        }
    }

    use super::*;

    #[test]
    fn scale_boxes_start_aligned_and_cover_the_tile_from_any_first_row() {
        for entry in [2u32, 4] {
            for tile_rows in [16u32, 64, 128] {
                let b = ScaleBox { entry, tile_rows };
                assert_eq!(b.bytes() % ScaleBox::SMEM_ALIGN, 0);
                assert!(b.rows() <= 256);
                for row0 in 0..40 {
                    let (first, shift) = b.start(row0);
                    assert_eq!((first * entry) % ScaleBox::ALIGN, 0);
                    assert_eq!(first + shift, row0);
                    assert!(shift + tile_rows <= b.rows());
                }
            }
        }
    }

    #[test]
    fn buffers_are_disjoint_aligned_and_inside_the_limit() {
        let c = StageContents {
            a: 128 * 128,
            b: 128 * 128,
            sfa: 512,
            words: 8,
            out: 128 * 128 * 2,
        };
        let l = StageLayout::fit(c);
        assert_eq!(l.stages, 5);
        assert!(l.bytes() <= SMEM_LIMIT);
        let last = l.stages - 1;
        assert!(l.a(last) + c.a <= l.b(0) && l.b(last) + c.b <= l.out());
        assert!(l.out() + c.out <= l.sfa(0) && l.sfa(last) + c.sfa <= l.words(0));
        assert!(l.words(last) + c.words <= l.barriers() && l.barriers().is_multiple_of(8));
        assert_eq!(l.barriers() + l.stages * BARRIER_BYTES, l.bytes());
        for s in 0..l.stages {
            assert_eq!(l.a(s) % SWIZZLE_ALIGN, 0);
            assert_eq!(l.b(s) % SWIZZLE_ALIGN, 0);
        }
        assert_eq!(l.out() % SWIZZLE_ALIGN, 0);
    }
}
