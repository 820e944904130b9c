//! The 16-bit family's schedule: one function the kernels run and the host sizes grids and
//! workspaces by, so the two cannot disagree.

use super::{BLOCK_K, HalfTile};
use crate::gemm::scheduler::{Schedule, Sparse};

impl HalfTile {
    /// The schedule of a GEMM of `(m, n, k, l)` on this tile in clusters of `cluster_m` along
    /// M: units of the tile's rows × the cluster by its columns, K in `split_k` ranges of 64-wide
    /// blocks, bands of `group_m` units; `sparse`: a block-sparse GEMM's work list.
    #[inline(always)]
    pub const fn schedule(
        self,
        (m, n, k, l): (u32, u32, u32, u32),
        cluster_m: u32,
        (split_k, group_m): (u32, u32),
        sparse: Option<Sparse>,
    ) -> Schedule {
        Schedule {
            m,
            n,
            l,
            k_blocks: k.div_ceil(BLOCK_K),
            split_k,
            unit_m: self.block_m() * cluster_m,
            unit_n: self.block_n,
            group_m,
            groups: None,
            sparse,
        }
    }
}
