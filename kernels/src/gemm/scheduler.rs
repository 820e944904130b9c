//! The persistent tile scheduler shared by the GEMM kernels (and by the host, which sizes grids
//! with it).
//!
//! A *work unit* is one output tile (of one cluster) and the range of K blocks that computes it.
//! CTA `first` of `stride` takes units `first, first + stride, …` of a linear order that walks the
//! output in column bands of `group_m` M tiles: inside a band M varies fastest, so CTAs that run at
//! the same time share the same few B tiles (N) and a band's A tiles, which then stay in L2. Batch
//! entries are outermost; with split-K each batch entry is `split_k` consecutive entries of the
//! order, one per K range.

use core::ops::Range;

/// One unit of work: tile coordinates (in tiles, not elements), the batch entry of the operands,
/// the batch entry of the output it writes, and the K blocks it accumulates over. The next
/// families extend it rather than the kernels: grouped GEMM adds the unit's group (its rows then
/// index that group's slice of A and C), and block-sparse GEMM reads `k_begin..k_end` as positions
/// in the tile's list of nonzero K blocks instead of K blocks themselves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WorkUnit {
    pub m: u32,
    pub n: u32,
    /// Batch entry of A and B.
    pub l: u32,
    /// Batch entry of the output: `l`, or with split-K `l · split_k + s` for K range `s` (an
    /// entry of the f32 workspace that the reduction sums).
    pub out_l: u32,
    /// The K blocks (of the kernel's block K) this unit accumulates: `k_begin..k_end`.
    pub k_begin: u32,
    pub k_end: u32,
}

impl WorkUnit {
    /// The K blocks this unit accumulates.
    #[inline(always)]
    pub const fn k_blocks(&self) -> Range<u32> {
        self.k_begin..self.k_end
    }
}

/// Most CTAs per cluster (along M or along N): the kernels share stages between the two CTAs of a
/// pair.
pub const MAX_CLUSTER: u32 = 2;

/// CTAs per cluster along M and N (one of them 1). The scheduler hands out cluster-sized units
/// (`m` × `n` tiles); CTA `rank` of the cluster computes [`ClusterShape::own`] of its unit. The
/// CTAs of a cluster along M share their B tile, along N their A tile (TMA multicast).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClusterShape {
    pub m: u32,
    pub n: u32,
}

impl ClusterShape {
    pub const ONE: ClusterShape = ClusterShape { m: 1, n: 1 };

    #[inline(always)]
    pub const fn size(self) -> u32 {
        self.m * self.n
    }

    /// The tile that CTA `rank` computes of the cluster's unit (ranks run along M first).
    #[inline(always)]
    pub const fn own(self, unit: WorkUnit, rank: u32) -> WorkUnit {
        WorkUnit {
            m: unit.m * self.m + rank % self.m,
            n: unit.n * self.n + rank / self.m,
            ..unit
        }
    }
}

/// The problem as the scheduler sees it: output size in elements, batch entries, K blocks, the
/// unit's size in elements (a cluster's tiles), the split of K and the raster band.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub m: u32,
    pub n: u32,
    pub l: u32,
    pub k_blocks: u32,
    /// K ranges per output tile (≥ 1).
    pub split_k: u32,
    pub unit_m: u32,
    pub unit_n: u32,
    /// Band height in units (≥ 1).
    pub group_m: u32,
}

impl Schedule {
    /// Units of the whole problem (host: grid sizing). `None` if the count does not fit u32.
    pub const fn units(&self) -> Option<u64> {
        let per_l = self.m.div_ceil(self.unit_m) as u64 * self.n.div_ceil(self.unit_n) as u64;
        let total = per_l * self.l as u64 * self.split_k as u64;
        if total > u32::MAX as u64 {
            None
        } else {
            Some(total)
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct TileScheduler {
    m_tiles: u32,
    n_tiles: u32,
    total: u32,
    group_m: u32,
    split_k: u32,
    k_blocks: u32,
    next: u32,
    stride: u32,
}

impl TileScheduler {
    /// CTA (or cluster) `first` of `stride`. The host keeps the unit count below 2³²
    /// ([`Schedule::units`]) and `group_m`, `split_k` ≥ 1.
    #[inline(always)]
    pub const fn new(s: Schedule, first: u32, stride: u32) -> Self {
        let m_tiles = s.m.div_ceil(s.unit_m);
        let n_tiles = s.n.div_ceil(s.unit_n);
        let group_m = if s.group_m == 0 { 1 } else { s.group_m };
        TileScheduler {
            m_tiles,
            n_tiles,
            total: m_tiles * n_tiles * (s.l * s.split_k),
            group_m,
            split_k: s.split_k,
            k_blocks: s.k_blocks,
            next: first,
            stride,
        }
    }

    /// Number of units of the whole problem.
    #[inline(always)]
    pub const fn total(&self) -> u32 {
        self.total
    }

    /// The unit at position `t` of the linear order.
    #[inline(always)]
    pub const fn unit(&self, t: u32) -> WorkUnit {
        let per_batch = self.m_tiles * self.n_tiles;
        let out_l = t / per_batch;
        let r = t % per_batch;
        let band = r / (self.group_m * self.n_tiles);
        let first_m = band * self.group_m;
        let rows = if self.m_tiles - first_m < self.group_m {
            self.m_tiles - first_m
        } else {
            self.group_m
        };
        let in_band = r - band * self.group_m * self.n_tiles;
        // Entry `l·split + s` of the order takes the `s`-th of `split` near-equal K ranges.
        let (l, k_begin, k_end) = if self.split_k <= 1 {
            (out_l, 0, self.k_blocks)
        } else {
            let s = out_l % self.split_k;
            (
                out_l / self.split_k,
                s * self.k_blocks / self.split_k,
                (s + 1) * self.k_blocks / self.split_k,
            )
        };
        WorkUnit {
            m: first_m + in_band % rows,
            n: in_band / rows,
            l,
            out_l,
            k_begin,
            k_end,
        }
    }
}

/// This CTA's units, in order.
impl Iterator for TileScheduler {
    type Item = WorkUnit;

    #[inline(always)]
    fn next(&mut self) -> Option<WorkUnit> {
        if self.next >= self.total {
            return None;
        }
        let t = self.unit(self.next);
        self.next += self.stride;
        Some(t)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::collections::{HashMap, HashSet};
    use std::vec::Vec;

    fn schedule(m: u32, n: u32, l: u32, k_blocks: u32, split_k: u32, group_m: u32) -> Schedule {
        Schedule {
            m,
            n,
            l,
            k_blocks,
            split_k,
            unit_m: 128,
            unit_n: 128,
            group_m,
        }
    }

    #[test]
    fn every_tile_and_k_block_is_scheduled_exactly_once_across_ctas() {
        for &(m, n, l, kb, split, g, ctas) in &[
            (1000u32, 777u32, 3u32, 8u32, 1u32, 8u32, 132u32),
            (128, 128, 1, 1, 1, 1, 1),
            (8192, 8192, 1, 64, 1, 16, 132),
            (129, 7168, 2, 56, 4, 8, 7),
            (128, 2112, 1, 7, 3, 1, 132),
        ] {
            let s = schedule(m, n, l, kb, split, g);
            let total = TileScheduler::new(s, 0, 1).total();
            assert_eq!(Some(total as u64), s.units());
            let mut seen = HashSet::new();
            let mut k_of: HashMap<(u32, u32, u32), Vec<u32>> = HashMap::new();
            for c in 0..ctas {
                for u in TileScheduler::new(s, c, ctas) {
                    assert!(u.m < m.div_ceil(128) && u.n < n.div_ceil(128) && u.l < l);
                    assert_eq!(u.out_l / split, u.l);
                    assert!(seen.insert((u.m, u.n, u.out_l)), "{u:?} twice");
                    k_of.entry((u.m, u.n, u.l))
                        .or_default()
                        .extend(u.k_blocks());
                }
            }
            assert_eq!(seen.len() as u32, total);
            // The K ranges of one output tile cover every K block once.
            for ks in k_of.values_mut() {
                ks.sort();
                assert_eq!(*ks, (0..kb).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn cluster_ranks_cover_their_unit_once() {
        for shape in [
            ClusterShape { m: 2, n: 1 },
            ClusterShape { m: 1, n: 2 },
            ClusterShape::ONE,
        ] {
            let unit = WorkUnit {
                m: 3,
                n: 5,
                l: 1,
                out_l: 1,
                k_begin: 2,
                k_end: 9,
            };
            let tiles: HashSet<WorkUnit> = (0..shape.size()).map(|r| shape.own(unit, r)).collect();
            assert_eq!(tiles.len() as u32, shape.size());
            for t in tiles {
                assert_eq!(t.m / shape.m, unit.m);
                assert_eq!(t.n / shape.n, unit.n);
                assert_eq!((t.l, t.out_l, t.k_blocks()), (1, 1, 2..9));
            }
        }
    }

    #[test]
    fn consecutive_tiles_of_a_band_share_their_n_tile() {
        let s = TileScheduler::new(schedule(4096, 4096, 1, 4, 1, 8), 0, 1);
        for t in 0..8 {
            assert_eq!(s.unit(t).n, 0);
            assert_eq!(s.unit(t).m, t);
        }
        assert_eq!((s.unit(8).m, s.unit(8).n), (0, 1));
    }
}
