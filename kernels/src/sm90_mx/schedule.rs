//! The MX family's schedule: one function the kernels run and the host sizes grids and
//! workspaces by, so the two cannot disagree.

use super::{BLOCK_K, BLOCK_M, MxTile};
use crate::gemm::scheduler::Schedule;
use crate::params::GroupParams;

impl MxTile {
    /// The schedule of a GEMM of `(m, n, k, l)` on this tile, with K in `split_k` ranges of
    /// 64-wide blocks (the last one partial) and bands of `group_m` tiles; `groups` over C's
    /// rows (dense when their mode is).
    #[inline(always)]
    pub const fn schedule(
        self,
        (m, n, k, l): (u32, u32, u32, u32),
        (split_k, group_m): (u32, u32),
        groups: GroupParams,
    ) -> Schedule {
        Schedule {
            m,
            n,
            l,
            k_blocks: k.div_ceil(BLOCK_K),
            split_k,
            unit_m: BLOCK_M,
            unit_n: self.block_n,
            group_m,
            groups: groups.groups(m, false),
            sparse: None,
        }
    }
}
