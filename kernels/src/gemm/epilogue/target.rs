//! Where a tile's results go: the output, its TMA staging, and a CTA's tile store (with the
//! fused epilogue and where it runs), seen by the stores and the fused epilogue alike.

use crate::gemm::layout::{
    FRAGMENT_ROWS, OUT_RING_SLOTS, StageLayout, out_box_n, out_box_swizzle_bytes,
};
use crate::gemm::pipeline::Handoff;
use crate::params::EpilogueParams;

/// The output as the epilogue writes it: `[l][m][n]` row-major of `out_type` at `ptr`, and its TMA
/// map (0: direct stores).
#[derive(Clone, Copy)]
pub struct Output {
    pub ptr: u64,
    pub tmap: u64,
    pub m: u32,
    pub n: u32,
    /// [`OutType`](crate::params::OutType) as u32.
    pub out_type: u32,
    /// Rows at or past this one are not written (a group's end in grouped GEMM, whose next rows
    /// belong to another group or must keep their contents); `u32::MAX`: every row below `m`.
    pub row_end: u32,
}

impl Output {
    /// C at `ptr`, `m` × `n` per batch entry of `out_type` (`OutType` as u32), stored directly (no
    /// tensor map), rows from `row_end` on left alone.
    #[inline(always)]
    pub const fn direct(ptr: u64, (m, n): (u32, u32), out_type: u32, row_end: u32) -> Self {
        Output {
            ptr,
            tmap: 0,
            m,
            n,
            out_type,
            row_end,
        }
    }

    /// Rows of a batch entry that may be written.
    #[inline(always)]
    pub const fn rows(&self) -> u32 {
        if self.row_end < self.m {
            self.row_end
        } else {
            self.m
        }
    }
}

/// The shared boxes the TMA-store path stages a tile in: per wave, per consumer, `block_n / W`
/// boxes of 64 rows × W 16-bit values (W = [`out_box_n`]`(block_n)`), each row one swizzle span
/// of 2W bytes, swizzled as TMA reads it: the 16-byte chunk bits of an address are XORed with
/// the bits above the span's 128 bytes (chunk j of row r at j ^ (r % 8) for W = 64, j ^ (r/2 % 4)
/// for 32, j ^ (r/4 % 2) for 16). The base is 1024-byte aligned, and so is every box. With
/// `ring` ([`out_staging`] says when) each consumer has [`OUT_RING_SLOTS`] boxes instead, reused
/// in turn.
#[derive(Clone, Copy)]
pub struct Staging {
    pub base: u32,
    pub consumers: u32,
    pub block_n: u32,
    pub ring: bool,
}

impl Staging {
    /// Columns of one box.
    #[inline(always)]
    pub const fn box_n(self) -> u32 {
        out_box_n(self.block_n)
    }
    /// Bytes of one box row: the swizzle span.
    #[inline(always)]
    pub const fn row_bytes(self) -> u32 {
        out_box_swizzle_bytes(self.block_n)
    }
    /// Bytes of one box.
    #[inline(always)]
    pub const fn box_bytes(self) -> u32 {
        FRAGMENT_ROWS * self.row_bytes()
    }
    /// Box `h` (columns `h·W..(h + 1)·W`) of consumer `c`'s rows of wave `w` (whole-tile
    /// staging).
    #[inline(always)]
    pub const fn box_addr(self, w: u32, c: u32, h: u32) -> u32 {
        self.base
            + ((w * self.consumers + c) * (self.block_n / self.box_n()) + h) * self.box_bytes()
    }
    /// Slot `s` of consumer `c`'s ring.
    #[inline(always)]
    pub const fn slot_addr(self, c: u32, s: u32) -> u32 {
        self.base + (c * OUT_RING_SLOTS + s) * self.box_bytes()
    }
}

/// Where a CTA's tiles go: the output (`out.row_end` set per unit), the fused epilogue, its TMA
/// staging, whether the tiles are Cᵀ (a block-sparse GEMM whose sparse operand is A: stored
/// directly, transposed into C's shape), and the tile's rows and wave height.
#[derive(Clone, Copy)]
pub struct TileStore<'a> {
    pub out: Output,
    /// The fused epilogue and where it runs: `Some` only in a family's fused kernels (a constant
    /// of the kernel, so the plain kernels carry none of its code: in the same kernel, its
    /// registers made ptxas spill in the FP8 K loop, docs/perf-log, fused epilogue). The host launches a
    /// fused kernel only with an active epilogue and never with Cᵀ tiles.
    pub epi: Option<(&'a EpilogueParams, Finish)>,
    pub staging: Staging,
    pub transposed: bool,
    pub block_m: u32,
    pub wave_m: u32,
}

/// Where a fused kernel's epilogue runs.
#[derive(Clone, Copy)]
pub enum Finish {
    /// In the kernel's finishing warps: the unit is staged for them ([`super::fuse::stage_unit`]) and
    /// handed over.
    Staged(Handoff),
    /// In the consumers' registers ([`super::fuse::apply`]; epilogues that
    /// [`in_registers`](crate::params::in_registers) takes), then stored as the plain kernels
    /// store, or quantized through the output staging: FP8 1×128 codes
    /// ([`super::fuse::quantize_fragment`]), or MXFP8 where `mx` ([`super::fuse::quantize_fragment_mx`]; a
    /// constant of the kernel).
    InRegisters { mx: bool },
}

impl<'a> TileStore<'a> {
    /// [`TileStore::epi`] of a family's kernel: in its fused kernels (`fused`, a constant of the
    /// kernel) the epilogue `epi`, finished by the finishing warps through the hand-over at
    /// `layout`'s place where the kernel has them (`finishers`, a constant too), else in the
    /// consumers' registers (with MXFP8 output where `mx`, a constant too); none in the plain
    /// kernels.
    #[inline(always)]
    pub fn fused_epi(
        (fused, finishers, mx): (bool, bool, bool),
        epi: &'a EpilogueParams,
        layout: &StageLayout,
    ) -> Option<(&'a EpilogueParams, Finish)> {
        match (fused, finishers) {
            (false, _) => None,
            (true, true) => Some((epi, Finish::Staged(Handoff::new(layout.handoff())))),
            (true, false) => Some((epi, Finish::InRegisters { mx })),
        }
    }
}
