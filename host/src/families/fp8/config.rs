//! The FP8 family's configuration, the rules it obeys for a shape, and the schedule it gives.

use crate::error::{Result, config, shape};
use crate::families::operands::fp8::BOX_ROWS;
use crate::format::ElemType;
use crate::grouped::DeviceGroups;
use crate::matrix::GemmShape;
use crate::splitk;
use blockscaled_kernels::gemm::scheduler::{ClusterShape, MAX_CLUSTER, Schedule};
use blockscaled_kernels::sm90::{self as family, BLOCK_K, Mode, Tile, WG_ROWS, m_pad};

/// Configuration of one launch (chosen by `plan::choose`, or forced through `Gpu::gemm_with`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Sm90Config {
    /// The output tile: one of [`Tile::ALL`] — 128 × 128, 192 × 128 (three consumer
    /// warpgroups), 256 × 128 (two 128-row waves per stage, a quarter fewer L2 bytes per FLOP),
    /// 128 × 144, 160 or 192 (wide: fewer shared-memory bytes per FLOP, and widths that fill
    /// rounds of SMs), 128 × 64 (twice the tiles at small M), or the swapped decode tiles.
    pub tile: Tile,
    /// CTAs per cluster: 1 × 1, 2 × 1 (a pair along M shares each B tile by TMA multicast, in
    /// halves, so not with 64-column tiles) or 1 × 2 (a pair along N shares each A tile).
    pub cluster: ClusterShape,
    /// Scheduler band height, in M units of `tile.block_m() · cluster.m` rows: 1 to the number
    /// of such units in M (L2 reuse of B tiles).
    pub group_m: u32,
    /// Persistent CTAs (≥ 1; at most as many as can be resident at once are launched).
    pub ctas: u32,
    /// K split into this many ranges, each its own CTA (1 to K / 128): when M·N has too few
    /// tiles to fill the GPU. The last CTA of each tile to finish adds the others' partial sums
    /// (kept in an f32 workspace) and stores the tile.
    pub split_k: u32,
}

crate::config::config_fields!(Sm90Config {
    tile: Tile => with_tile,
    cluster: ClusterShape => with_cluster,
    group_m: u32 => with_group_m,
    ctas: u32 => with_ctas,
    split_k: u32 => with_split_k,
});

impl Sm90Config {
    /// Checks every field against the kernel and against `s` ([`Error::Config`](crate::Error::Config)), and the shape
    /// against the kernel's 32-bit indexing ([`Error::Shape`](crate::Error::Shape)). The launch trusts what passes.
    pub(crate) fn validate(&self, s: &GemmShape) -> Result<()> {
        let Sm90Config {
            tile,
            cluster: cl,
            group_m,
            ctas,
            split_k,
        } = *self;
        if !Tile::ALL.contains(&tile) {
            return Err(config(format!(
                "tile {tile:?} ({} × {}): the sm90 kernel has tiles of {}",
                tile.block_m(),
                tile.block_n,
                Tile::ALL
                    .map(|t| format!("{} × {}", t.block_m(), t.block_n))
                    .join(", ")
            )));
        }
        if cl.m == 0 || cl.n == 0 || cl.m as u64 * cl.n as u64 > MAX_CLUSTER as u64 {
            return Err(config(format!(
                "cluster of {}×{} CTAs (M×N): the sm90 kernel takes 1×1, 2×1 or 1×2",
                cl.m, cl.n
            )));
        }
        if tile.is_swapped() && cl.size() != 1 {
            return Err(config(format!(
                "cluster of {}×{} CTAs: the swapped {} × {} tiles run alone",
                cl.m,
                cl.n,
                tile.block_m(),
                tile.block_n
            )));
        }
        // Each CTA of a pair along M loads half the B tile, in whole 8-row swizzle atoms.
        if b_box_rows(tile, cl).is_none() {
            return Err(config(format!(
                "a pair along M shares the B tile in halves of at least 64 rows: not with \
                 {}-column tiles",
                tile.block_n
            )));
        }
        if ctas == 0 {
            return Err(config("ctas = 0: a launch needs at least one CTA"));
        }
        if !s.k.is_multiple_of(BLOCK_K as usize) {
            return Err(shape(format!(
                "K = {} is not a multiple of {BLOCK_K}, which the sm90 kernel's scale blocks need",
                s.k
            )));
        }
        let k_blocks = s.k / BLOCK_K as usize;
        splitk::check_split(split_k, k_blocks, BLOCK_K, s.k)?;
        if s.m > i32::MAX as usize || s.n > i32::MAX as usize {
            return Err(shape("M and N must fit TMA's 32-bit coordinates"));
        }
        // The scheduler's units (clusters of tiles) and its u32 arithmetic: `group_m · n_units`
        // and the unit count stay below 2³² when group_m ≤ m_units and the count fits.
        let (m_units, n_units) = Sm90Config::units(tile, cl, s);
        if !(1..=m_units).contains(&(group_m as usize)) {
            let (what, len, rows) = if tile.is_swapped() {
                ("N", s.n, tile.block_n)
            } else {
                ("M", s.m, tile.block_m() * cl.m)
            };
            return Err(config(format!(
                "group_m = {group_m}: {what} = {len} has {m_units} units of {rows} rows (tile × \
                 cluster) to band",
            )));
        }
        let units = [n_units, s.l, split_k as usize]
            .iter()
            .try_fold(m_units, |acc, &x| acc.checked_mul(x));
        if units.is_none_or(|u| u > u32::MAX as usize) {
            return Err(shape(format!(
                "{m_units} × {n_units} tile units × L = {} × split {split_k}: the sm90 kernel's \
                 scheduler counts at most 2³² − 1",
                s.l
            )));
        }
        // The kernel indexes the A scales with 32 bits.
        let m_pad = m_pad(s.m as u32);
        if s.l as u128 * k_blocks as u128 * m_pad as u128 > u32::MAX as u128 {
            return Err(shape(format!(
                "L·(K/128)·M = {}·{k_blocks}·{m_pad} A scales: the sm90 kernel indexes at most 2³²",
                s.l
            )));
        }
        splitk::validate(s, split_k)
    }

    /// The scheduler's units of `tile` × `cl` for shape `s`: (along its banded axis, along the
    /// other). The banded axis is M (A's tiles), or N (B's tiles) for swapped tiles, whose
    /// schedule runs over Cᵀ; `group_m` counts units of the first.
    pub fn units(tile: Tile, cl: ClusterShape, s: &GemmShape) -> (usize, usize) {
        let m_units = s.m.div_ceil((tile.block_m() * cl.m) as usize);
        let n_units = s.n.div_ceil((tile.block_n * cl.n) as usize);
        if tile.is_swapped() {
            (n_units, m_units)
        } else {
            (m_units, n_units)
        }
    }

    /// `Plan::Sm90Fp8(self).validate(s)` for a block-sparse GEMM whose kernel shape is `s` (M: the dense
    /// operand's rows, N: the sparse operand's): a tile with a block-sparse kernel (at most one
    /// 128-row block wide: a tile's columns share one run of stored blocks), clusters along M
    /// only (a pair along N would need two runs), and `split_k` the most parts a run is cut into
    /// (1 to 16, `bsr::MAX_PARTS`).
    pub fn validate_sparse(&self, s: &GemmShape) -> Result<()> {
        Sm90Config {
            split_k: 1,
            ..*self
        }
        .validate(s)?;
        if family::kernel(self.tile, ElemType::E4M3, ElemType::E4M3, Mode::Sparse).is_none() {
            return Err(config(format!(
                "tile {} × {}: block-sparse GEMM runs tiles of 128 × 128 and 128 × 64",
                self.tile.block_m(),
                self.tile.block_n
            )));
        }
        if self.cluster.n != 1 {
            return Err(config(format!(
                "cluster of {}×{} CTAs: block-sparse GEMM pairs CTAs along M only (each N tile \
                 has its own run of stored blocks)",
                self.cluster.m, self.cluster.n
            )));
        }
        crate::bsr::validate_parts(self.split_k, s)
    }

    /// This configuration with `tile` in place of its own: the cluster kept if the tile is the
    /// same (else alone: the pairing was chosen for the other tile), and a band of about the same
    /// rows, within the new tile's units.
    pub fn with_tile_for(self, tile: Tile, s: &GemmShape) -> Sm90Config {
        let cluster = if tile == self.tile {
            self.cluster
        } else {
            ClusterShape::ONE
        };
        let (units, _) = Sm90Config::units(tile, cluster, s);
        let (old, new) = (band_rows(self.tile), band_rows(tile));
        Sm90Config {
            tile,
            cluster,
            group_m: ((self.group_m as u64 * old as u64 / new as u64) as usize)
                .clamp(1, units.max(1)) as u32,
            ..self
        }
    }
}

/// Rows of the banded axis per tile (swapped: B's 128).
fn band_rows(tile: Tile) -> u32 {
    if tile.is_swapped() {
        tile.block_n
    } else {
        tile.block_m()
    }
}

/// Rows of each CTA's box of the B tile: the tile's columns shared among a cluster's CTAs along
/// M, which the host has tensor maps for ([`BOX_ROWS`]: 64 rows or more); `None` otherwise.
pub(super) fn b_box_rows(tile: Tile, cl: ClusterShape) -> Option<u32> {
    let rows = tile.block_n / cl.m.max(1);
    (tile.block_n.is_multiple_of(cl.m.max(1)) && rows >= WG_ROWS && BOX_ROWS.contains(&rows))
        .then_some(rows)
}

/// The schedule of a dense or grouped GEMM of `shape` with `cfg`: the kernel's own function.
pub(super) fn dense_schedule(
    cfg: &Sm90Config,
    shape: GemmShape,
    groups: Option<&DeviceGroups>,
) -> Schedule {
    let split = (cfg.split_k, cfg.group_m);
    let groups = groups.map(DeviceGroups::unplaced);
    cfg.tile
        .schedule(shape.dims(), cfg.cluster, split, groups, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::families::test_util::shape;
    use crate::plan::Hardware;
    use crate::plan::sm90_default;

    /// 128-row tiles alone, one band, 132 CTAs, K in `split_k` ranges.
    fn m128(split_k: u32) -> Sm90Config {
        Sm90Config {
            tile: Tile::M128,
            cluster: ClusterShape { m: 1, n: 1 },
            group_m: 1,
            ctas: 132,
            split_k,
        }
    }

    #[test]
    fn the_chosen_configurations_validate() {
        for (m, n, k, l) in [
            (1, 1, 128, 1),
            (128, 7168, 2048, 1),
            (128, 2112, 7168, 1),
            (300, 300, 768, 2),
            (4096, 2112, 7168, 1),
            (8192, 8192, 8192, 1),
            (2048, 4224, 7168, 1),
        ] {
            let s = shape(m, n, k, l);
            let cfg = sm90_default(m, n, k, l, Hardware::H100);
            assert!(cfg.validate(&s).is_ok(), "{s:?}: {cfg:?}");
        }
    }

    #[test]
    fn bands_outside_1_to_the_m_units_are_config_errors() {
        // 256 rows of 128-row tiles: 2 units; 2 N tiles, so 2³¹ · 2 wraps a u32 to 0.
        let s = shape(256, 256, 256, 1);
        let cfg = m128(1);
        for group_m in [0, 3, 1 << 31, u32::MAX] {
            let r = Sm90Config { group_m, ..cfg }.validate(&s);
            assert!(
                matches!(r, Err(Error::Config(_))),
                "group_m {group_m}: {r:?}"
            );
        }
        for group_m in [1, 2] {
            assert!(Sm90Config { group_m, ..cfg }.validate(&s).is_ok());
        }
        // Pairs along M halve the units.
        let pairs = Sm90Config {
            cluster: ClusterShape { m: 2, n: 1 },
            group_m: 2,
            ..cfg
        };
        assert!(matches!(pairs.validate(&s), Err(Error::Config(_))));
    }

    #[test]
    fn tiles_clusters_ctas_and_splits_the_kernel_lacks_are_config_errors() {
        let s = shape(256, 256, 256, 1);
        let ok = m128(2);
        assert!(ok.validate(&s).is_ok());
        let bad = [
            Sm90Config {
                tile: Tile::new(5, 1, 128),
                ..ok
            },
            Sm90Config {
                tile: Tile::new(2, 1, 96),
                ..ok
            },
            Sm90Config {
                cluster: ClusterShape { m: 0, n: 1 },
                ..ok
            },
            Sm90Config {
                cluster: ClusterShape { m: 2, n: 2 },
                ..ok
            },
            Sm90Config {
                cluster: ClusterShape {
                    m: u32::MAX,
                    n: u32::MAX,
                },
                ..ok
            },
            Sm90Config {
                tile: Tile::M128N64,
                cluster: ClusterShape { m: 2, n: 1 },
                ..ok
            },
            Sm90Config { ctas: 0, ..ok },
            Sm90Config { split_k: 0, ..ok },
            Sm90Config { split_k: 3, ..ok },
        ];
        for cfg in bad {
            assert!(matches!(cfg.validate(&s), Err(Error::Config(_))), "{cfg:?}");
        }
        // K not a multiple of 128, and A scales past 32-bit indexing, are shape errors.
        assert!(matches!(
            ok.validate(&shape(256, 256, 200, 1)),
            Err(Error::Shape(_))
        ));
        let huge = shape(1 << 30, 256, 128 * 64, 1);
        assert!(matches!(m128(1).validate(&huge), Err(Error::Shape(_))));
    }
}
