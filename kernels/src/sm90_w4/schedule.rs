//! The 4-bit-weights family's schedule: one function the kernels run and the host sizes grids
//! and workspaces by, so the two cannot disagree.

use super::{BLOCK_K, W4Tile, WEIGHT_ROWS};
use crate::gemm::scheduler::Schedule;
use crate::params::GroupParams;

impl W4Tile {
    /// The schedule of a GEMM of `(m, n, k, l)` (C = A · Bᵀ, computed as Cᵀ): units are (weight
    /// tile, activation tile), so the schedule's M is C's N and its N is C's M; K in `split_k`
    /// ranges of 64-wide blocks, bands of `group_m` weight tiles, `groups` over the activations'
    /// rows (along the schedule's N).
    #[inline(always)]
    pub const fn schedule(
        self,
        dims: (u32, u32, u32, u32),
        split: (u32, u32),
        groups: GroupParams,
    ) -> Schedule {
        self.schedule_k(dims, split, groups, BLOCK_K)
    }

    /// [`Self::schedule`] with K blocks of `block_k` (the FP8-MMA kernel's 128,
    /// [`super::fp8::FP8_BLOCK_K`]).
    #[inline(always)]
    pub const fn schedule_k(
        self,
        (m, n, k, l): (u32, u32, u32, u32),
        (split_k, group_m): (u32, u32),
        groups: GroupParams,
        block_k: u32,
    ) -> Schedule {
        Schedule {
            m: n,
            n: m,
            l,
            k_blocks: k.div_ceil(block_k),
            split_k,
            unit_m: WEIGHT_ROWS,
            unit_n: self.n,
            group_m,
            groups: groups.groups(m, true),
            sparse: None,
        }
    }
}
