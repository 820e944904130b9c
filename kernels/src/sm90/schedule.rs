//! The FP8 family's schedule: one function the kernels run and the host sizes grids and
//! workspaces by, so the two cannot disagree.

use super::{BLOCK_K, Tile};
use crate::gemm::scheduler::{ClusterShape, Groups, Schedule, Sparse};
use crate::params::GroupParams;

impl Tile {
    /// The schedule of a GEMM of `(m, n, k, l)` on this tile in clusters of `cl`, with K in
    /// `split_k` ranges and bands of `group_m` units: units are clusters of tiles; a swapped
    /// tile schedules Cᵀ (units of B tiles × A tiles, so that CTAs running together stream
    /// different B tiles). `groups`: a grouped GEMM's groups over C's rows (`None` for a kernel
    /// without groups, known at compile time there); `sparse`: a block-sparse GEMM's work list.
    #[inline(always)]
    pub const fn schedule(
        self,
        (m, n, k, l): (u32, u32, u32, u32),
        cl: ClusterShape,
        (split_k, group_m): (u32, u32),
        groups: Option<GroupParams>,
        sparse: Option<Sparse>,
    ) -> Schedule {
        let (unit_m, unit_n) = (self.block_m() * cl.m, self.block_n * cl.n);
        let (m_axis, n_axis, unit_m, unit_n) = if self.is_swapped() {
            (n, m, unit_n, unit_m)
        } else {
            (m, n, unit_m, unit_n)
        };
        Schedule {
            m: m_axis,
            n: n_axis,
            l,
            k_blocks: k / BLOCK_K,
            split_k,
            unit_m,
            unit_n,
            group_m,
            groups: match groups {
                // The two-wave tiles compute only the waves a group reaches (`Tile::live_waves`):
                // their groups' tiles differ in cost, which skewed bands spread over the CTAs.
                Some(g) => match g.groups(m, false) {
                    Some(gs) => Some(Groups {
                        skew: self.waves > 1,
                        ..gs
                    }),
                    None => None,
                },
                None => None,
            },
            sparse,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::GroupMode;

    const DIMS: (u32, u32, u32, u32) = (1000, 3000, 4096, 2);

    #[test]
    fn tiles_schedule_c_in_clusters_of_tiles_and_swapped_tiles_schedule_c_transposed() {
        let pair = ClusterShape { m: 2, n: 1 };
        let s = Tile::M128.schedule(DIMS, pair, (3, 4), None, None);
        assert_eq!((s.m, s.n, s.l, s.k_blocks), (1000, 3000, 2, 32));
        assert_eq!((s.unit_m, s.unit_n, s.split_k, s.group_m), (256, 128, 3, 4));
        let s = Tile::S16.schedule(DIMS, ClusterShape::ONE, (1, 1), None, None);
        assert_eq!((s.m, s.n, s.unit_m, s.unit_n), (3000, 1000, 128, 16));
        assert!(s.groups.is_none() && s.sparse.is_none());
    }

    #[test]
    fn groups_are_read_only_where_given_and_not_dense() {
        let dense = GroupParams::default();
        let s = Tile::M128.schedule(DIMS, ClusterShape::ONE, (1, 1), Some(dense), None);
        assert!(s.groups.is_none());
        let masked = GroupParams {
            ptr: 0,
            count: 8,
            mode: GroupMode::Masked as u32,
        };
        let s = Tile::M128.schedule(DIMS, ClusterShape::ONE, (1, 1), Some(masked), None);
        let g = s.groups.expect("grouped");
        assert!(g.masked && !g.along_n && g.rows == 1000 && g.count == 8);
        assert!(!g.skew);
        let s = Tile::M256.schedule(DIMS, ClusterShape::ONE, (1, 1), Some(masked), None);
        assert!(s.groups.expect("grouped").skew);
        let w4 = crate::sm90_w4::W4Tile::N16.schedule(DIMS, (1, 1), masked);
        let g = w4.groups.expect("grouped");
        assert_eq!((w4.m, w4.n, w4.unit_m, w4.unit_n), (3000, 1000, 128, 16));
        assert!(g.along_n && g.rows == 1000);
    }
}
