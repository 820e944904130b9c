//! The persistent tile scheduler shared by the GEMM kernels (and tested on the host).
//!
//! CTA `first` of `stride` takes tiles `first, first + stride, …` of a linear order that walks
//! the output in column bands of `group_m` M-tiles: inside a band M varies fastest, so CTAs that
//! run at the same time share the same few B tiles (N) and a band's A tiles, which then stay in L2.
//! Batches are outermost.

/// One output tile: tile coordinates (not elements) and the batch index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tile {
    pub m: u32,
    pub n: u32,
    pub l: u32,
}

/// CTAs per cluster along M and N (one of them 1). The scheduler hands out cluster-sized units
/// (`m` × `n` tiles); CTA `rank` of the cluster computes [`ClusterShape::tile`] of its unit. The
/// CTAs of a cluster along M share their B tile, along N their A tile (TMA multicast).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClusterShape {
    pub m: u32,
    pub n: u32,
}

impl ClusterShape {
    #[inline(always)]
    pub const fn size(self) -> u32 {
        self.m * self.n
    }

    /// The tile that CTA `rank` computes in the cluster's unit `unit` (ranks run along M first).
    #[inline(always)]
    pub const fn tile(self, unit: Tile, rank: u32) -> Tile {
        Tile {
            m: unit.m * self.m + rank % self.m,
            n: unit.n * self.n + rank / self.m,
            l: unit.l,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct TileScheduler {
    m_tiles: u32,
    n_tiles: u32,
    total: u32,
    group_m: u32,
    next: u32,
    stride: u32,
}

impl TileScheduler {
    /// `m`, `n`: the output's size in elements; `block_m`, `block_n`: the tile; `group_m` ≥ 1.
    /// (Eight scalars rather than a struct: the kernels pass launch parameters straight through.)
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub const fn new(
        m: u32,
        n: u32,
        l: u32,
        block_m: u32,
        block_n: u32,
        group_m: u32,
        first: u32,
        stride: u32,
    ) -> Self {
        let m_tiles = m.div_ceil(block_m);
        let n_tiles = n.div_ceil(block_n);
        let group_m = if group_m == 0 { 1 } else { group_m };
        TileScheduler {
            m_tiles,
            n_tiles,
            total: m_tiles * n_tiles * l,
            group_m,
            next: first,
            stride,
        }
    }

    /// Number of tiles of the whole problem.
    #[inline(always)]
    pub const fn total(&self) -> u32 {
        self.total
    }

    /// The tile at position `t` of the linear order.
    #[inline(always)]
    pub const fn tile(&self, t: u32) -> Tile {
        let per_batch = self.m_tiles * self.n_tiles;
        let l = t / per_batch;
        let r = t % per_batch;
        let band = r / (self.group_m * self.n_tiles);
        let first_m = band * self.group_m;
        let rows = if self.m_tiles - first_m < self.group_m {
            self.m_tiles - first_m
        } else {
            self.group_m
        };
        let in_band = r - band * self.group_m * self.n_tiles;
        Tile {
            m: first_m + in_band % rows,
            n: in_band / rows,
            l,
        }
    }
}

/// This CTA's tiles, in order.
impl Iterator for TileScheduler {
    type Item = Tile;

    #[inline(always)]
    fn next(&mut self) -> Option<Tile> {
        if self.next >= self.total {
            return None;
        }
        let t = self.tile(self.next);
        self.next += self.stride;
        Some(t)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn every_tile_is_scheduled_exactly_once_across_ctas() {
        for &(m, n, l, g, ctas) in &[
            (1000u32, 777u32, 3u32, 8u32, 132u32),
            (128, 128, 1, 1, 1),
            (8192, 8192, 1, 16, 132),
            (129, 7168, 2, 8, 7),
        ] {
            let total = TileScheduler::new(m, n, l, 128, 128, g, 0, 1).total();
            let mut seen = HashSet::new();
            for c in 0..ctas {
                for t in TileScheduler::new(m, n, l, 128, 128, g, c, ctas) {
                    assert!(t.m < m.div_ceil(128) && t.n < n.div_ceil(128) && t.l < l);
                    assert!(seen.insert(t), "{t:?} twice");
                }
            }
            assert_eq!(seen.len() as u32, total);
        }
    }

    #[test]
    fn cluster_ranks_cover_their_unit_once() {
        for shape in [
            ClusterShape { m: 2, n: 1 },
            ClusterShape { m: 1, n: 2 },
            ClusterShape { m: 1, n: 1 },
        ] {
            let unit = Tile { m: 3, n: 5, l: 1 };
            let tiles: HashSet<Tile> = (0..shape.size()).map(|r| shape.tile(unit, r)).collect();
            assert_eq!(tiles.len() as u32, shape.size());
            for t in tiles {
                assert_eq!(t.m / shape.m, unit.m);
                assert_eq!(t.n / shape.n, unit.n);
                assert_eq!(t.l, 1);
            }
        }
    }

    #[test]
    fn consecutive_tiles_of_a_band_share_their_n_tile() {
        let s = TileScheduler::new(4096, 4096, 1, 128, 128, 8, 0, 1);
        for t in 0..8 {
            assert_eq!(s.tile(t).n, 0);
            assert_eq!(s.tile(t).m, t);
        }
        assert_eq!(s.tile(8), Tile { m: 0, n: 1, l: 0 });
    }
}
