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
        (m, n, k, l): (u32, u32, u32, u32),
        (split_k, group_m): (u32, u32),
        groups: GroupParams,
    ) -> Schedule {
        Schedule {
            m: n,
            n: m,
            l,
            k_blocks: k.div_ceil(BLOCK_K),
            split_k,
            unit_m: WEIGHT_ROWS,
            unit_n: self.n,
            group_m,
            groups: groups.groups(m, true),
            sparse: None,
        }
    }
}
