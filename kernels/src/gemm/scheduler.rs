//! The persistent tile scheduler shared by the GEMM kernels (and by the host, which sizes grids
//! with it).
//!
//! A *work unit* is one output tile (of one cluster) and the range of K blocks that computes it.
//! CTA `first` of `stride` takes units `first, first + stride, …` of a linear order that walks the
//! output in column bands of `group_m` M tiles: inside a band M varies fastest, so CTAs that run at
//! the same time share the same few B tiles (N) and a band's A tiles, which then stay in L2. Batch
//! entries are outermost; with split-K each batch entry is `split_k` consecutive entries of the
//! order, one per K range.
//!
//! Grouped GEMM ([`Groups`]): the units are those of each group in turn, group `g`'s tiles
//! covering only its rows of the grouped operand, so an empty group has no units. The group row
//! counts live in device memory (written by the caller's kernels, no host sync): each CTA reads
//! them as it walks its units, in order.
//!
//! Block-sparse GEMM ([`Sparse`]): the sparse operand's tiles are the schedule's N axis, and each
//! has its own list of stored K blocks. The host cuts every tile's list into [`Segment`]s (a long
//! list into several parts that meet as split-K does, a short one whole, an empty one as one
//! empty segment so that its zero output is still written) and orders them longest first; the
//! units are the band-ordered grid of M tiles × segments, and a unit's `k_begin..k_end` are
//! positions in the stored blocks, not K blocks.

use core::ops::Range;

/// One unit of work: tile coordinates (in tiles, not elements), the batch entries of the operands
/// and of the output it writes, the rows of the grouped operand its group owns, and the K blocks
/// it accumulates over (block-sparse GEMM: positions in the sparse operand's stored blocks).
///
/// The *grouped axis* is the schedule's M (or its N with [`Groups::along_n`], for kernels that
/// swap A and B): tile `m` of it starts at row `row0 + m · unit rows` of the grouped operand (A)
/// and of C, and rows at or past `row_end` are not stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WorkUnit {
    pub m: u32,
    pub n: u32,
    /// Batch entry of B (grouped: the group, whose expert B is).
    pub l: u32,
    /// Batch entry of the output: `l`, or with split-K `l · split_k + s` for K range `s` (an
    /// entry of the f32 workspace that the reduction sums); grouped: 0 (contiguous) or the group
    /// (masked).
    pub out_l: u32,
    /// Batch entry of A: `l`; grouped: as `out_l`.
    pub a_l: u32,
    /// First row of the group's rows along the grouped axis (0 for dense GEMM).
    pub row0: u32,
    /// End of the group's rows (exclusive): stores stop there. `u32::MAX` for dense GEMM (the
    /// output's own extent bounds it).
    pub row_end: u32,
    /// The K blocks (of the kernel's block K) this unit accumulates: `k_begin..k_end`.
    pub k_begin: u32,
    pub k_end: u32,
    /// Block-sparse GEMM: the unit's [`Segment`] (0 otherwise).
    pub seg: u32,
}

impl WorkUnit {
    /// The K blocks this unit accumulates.
    #[inline(always)]
    pub const fn k_blocks(&self) -> Range<u32> {
        self.k_begin..self.k_end
    }

    /// The first row of tile `t` of the grouped axis, for tiles of `rows` rows.
    #[inline(always)]
    pub const fn first_row(&self, t: u32, rows: u32) -> u32 {
        self.row0 + t * rows
    }
}

/// How a grouped GEMM's groups are laid out, and where their row counts are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Groups {
    /// `count` int32 values in device memory: each group's end row (contiguous, as torch's
    /// `offs`) or its row count (masked).
    pub ptr: u64,
    /// Groups (≥ 1).
    pub count: u32,
    /// Masked: group `g` is batch entry `g` of A and C, `capacity = rows` rows each, of which
    /// its count are real. Contiguous: the groups' rows are stacked in one batch entry of `rows`
    /// rows, group `g` from the previous group's end to its own.
    pub masked: bool,
    /// Rows of A (contiguous) or of each batch entry of A (masked). Device values are clamped
    /// into it: an end below the previous end, or a count below 0, makes an empty group; an end
    /// or count past `rows` stops at `rows`. Nothing outside A or C is ever read or written.
    pub rows: u32,
    /// The grouped rows run along the schedule's N (kernels computing Cᵀ).
    pub along_n: bool,
    /// Skew the bands (grouped rows along M): in column `n` of a band of `rows` M tiles, the
    /// `j`-th unit is M tile `(j + n) mod rows` instead of `j`. CTAs take every `stride`-th unit,
    /// and for a group whose M tile count divides the stride (the strides of 132 SMs, 66 and
    /// 132, are multiples of 2, 3, 6 and 11) every column would give the same CTAs the same
    /// tile: all of the group's last, partial tiles to some CTAs and none to the others, whose
    /// whole tiles then set the kernel's time. Skewed, each CTA's tiles rotate through the
    /// group's. A band's columns hold the same units either way, so what the CTAs running at
    /// the same time share in L2 is unchanged.
    pub skew: bool,
}

impl Groups {
    /// Group `g`'s rows `(first, end)`, given the previous group's end (contiguous), clamped as
    /// [`Groups::rows`] says.
    /// # Safety
    /// `ptr` holds `count` int32 values and `g < count`.
    #[inline(always)]
    pub unsafe fn rows_of(&self, g: u32, prev_end: u32) -> (u32, u32) {
        // SAFETY: the caller's contract.
        let v = unsafe { *(self.ptr as *const i32).add(g as usize) };
        let v = if v < 0 { 0 } else { v as u32 };
        if self.masked {
            (0, v.min(self.rows))
        } else {
            (prev_end, v.clamp(prev_end, self.rows))
        }
    }
}

/// A block-sparse GEMM's work list: `count` [`Segment`]s in device memory, longest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sparse {
    pub segments: u64,
    pub count: u32,
    /// Segment groups that are split (the host sizes split-K's workspace with it): each
    /// [`Segment::slot`] and [`Segment::counter`] is below these.
    pub slots: u32,
    pub counters: u32,
}

/// One part of a sparse tile's K list: stored blocks `begin..end` (positions) of tile `n` of the
/// schedule's N axis. A tile whose list is split in `parts` parts has one segment per part; part
/// `p`'s partial sums go to split-K slot `slot + p` and the parts count themselves on
/// `counter` (both per M tile, see [`Schedule::meeting`]). Unsplit: `parts` 1.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Segment {
    pub n: u32,
    pub begin: u32,
    pub end: u32,
    pub part: u32,
    pub parts: u32,
    pub slot: u32,
    pub counter: u32,
    pub _pad: u32,
}

impl Sparse {
    /// Segment `i`.
    /// # Safety
    /// `segments` holds `count` segments and `i < count`.
    #[inline(always)]
    pub unsafe fn segment(&self, i: u32) -> Segment {
        // SAFETY: the caller's contract.
        unsafe { *(self.segments as *const Segment).add(i as usize) }
    }
}

/// Where a CTA tile's K ranges meet (`gemm::splitk`): `parts` ranges (1: no split), this one
/// `part`; the partial sums of range `p` in workspace slot `first + p · stride` (slots of one
/// CTA tile's values), the arrivals on counter group `counter`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meeting {
    pub parts: u32,
    pub part: u32,
    pub first: u64,
    pub stride: u64,
    pub counter: u64,
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
    /// Grouped GEMM: the groups (then `l` and `split_k` are 1, and `m` (or `n` along N) is the
    /// grouped operand's rows).
    pub groups: Option<Groups>,
    /// Block-sparse GEMM: the segments (then `l` and `split_k` are 1, `groups` is `None`, and the
    /// N axis is the sparse operand's rows, clusters along M only).
    pub sparse: Option<Sparse>,
}

impl Schedule {
    /// Units of the whole problem (host: grid sizing), or with groups the most there can be (the
    /// counts are on the device). `None` if the count does not fit u32.
    pub const fn units(&self) -> Option<u64> {
        let (m_tiles, n_tiles) = (
            self.m.div_ceil(self.unit_m) as u64,
            self.n.div_ceil(self.unit_n) as u64,
        );
        let total = match self.groups {
            None if self.sparse.is_some() => match self.sparse {
                Some(sp) => m_tiles * sp.count as u64,
                None => 0,
            },
            None => m_tiles * n_tiles * self.l as u64 * self.split_k as u64,
            Some(g) => {
                // Contiguous: each group's rows may start mid-tile (one more tile each); masked:
                // every group may be full.
                let (grouped, other) = if g.along_n {
                    (n_tiles, m_tiles)
                } else {
                    (m_tiles, n_tiles)
                };
                let grouped = if g.masked {
                    grouped * g.count as u64
                } else {
                    grouped + g.count as u64
                };
                grouped * other
            }
        };
        if total > u32::MAX as u64 {
            None
        } else {
            Some(total)
        }
    }
}

impl Schedule {
    /// Split-K's workspace for this dense schedule run in clusters of `cluster`: f32 partial sums
    /// (each CTA tile's values once per K range) and u32 counters (one per CTA tile and consumer
    /// warpgroup; see `gemm::splitk`). `None` if a count overflows (or the schedule is grouped).
    pub const fn splitk_workspace(&self, cluster: ClusterShape) -> Option<(u64, u64)> {
        let cta_m_tiles = self.m.div_ceil(self.unit_m) as u64 * cluster.m as u64;
        let tile = (self.unit_m as u64 * self.unit_n as u64) / cluster.size() as u64;
        match (self.groups, self.sparse, self.units()) {
            (None, Some(sp), Some(_)) => Some((
                sp.slots as u64 * cta_m_tiles * tile,
                sp.counters as u64 * cta_m_tiles * super::barriers::MAX_CONSUMERS as u64,
            )),
            (None, None, Some(units)) => {
                let floats = units * self.unit_m as u64 * self.unit_n as u64;
                let tiles = units / self.split_k as u64 * cluster.size() as u64;
                Some((floats, tiles * super::barriers::MAX_CONSUMERS as u64))
            }
            _ => None,
        }
    }

    /// The index of CTA tile `own` (as [`ClusterShape::own`] made it from a unit of this dense
    /// schedule) among the problem's CTA tiles, K ranges not counted: batch entry, then M tile,
    /// then N tile.
    #[inline(always)]
    pub const fn cta_tile(&self, own: &WorkUnit, cluster: ClusterShape) -> u32 {
        let m_tiles = self.m.div_ceil(self.unit_m) * cluster.m;
        let n_tiles = self.n.div_ceil(self.unit_n) * cluster.n;
        (own.l * m_tiles + own.m) * n_tiles + own.n
    }

    /// Where CTA tile `own`'s K ranges meet: dense, range `out_l mod split_k` of the tile's
    /// `split_k`, in slots `cta_tile · split_k + s`; sparse, its segment's part, in slots
    /// `(slot + part) · M tiles + m` and counter group `counter · M tiles + m`.
    /// # Safety
    /// For a sparse schedule, `own` is a unit of it (its `seg` a segment there is).
    #[inline(always)]
    pub unsafe fn meeting(&self, own: &WorkUnit, cluster: ClusterShape) -> Meeting {
        match self.sparse {
            // No segment is cut: no split, and no load.
            Some(sp) if sp.slots == 0 => Meeting {
                parts: 1,
                part: 0,
                first: 0,
                stride: 0,
                counter: 0,
            },
            Some(sp) => {
                // SAFETY: the caller's contract.
                let seg = unsafe { sp.segment(own.seg) };
                let m_tiles = (tiles(self.m, self.unit_m) * cluster.m) as u64;
                Meeting {
                    parts: seg.parts,
                    part: seg.part,
                    first: seg.slot as u64 * m_tiles + own.m as u64,
                    stride: m_tiles,
                    counter: seg.counter as u64 * m_tiles + own.m as u64,
                }
            }
            None => {
                let split = self.split_k;
                let tile = self.cta_tile(own, cluster) as u64;
                Meeting {
                    parts: split,
                    part: own.out_l - own.l * split,
                    first: tile * split as u64,
                    stride: 1,
                    counter: tile,
                }
            }
        }
    }
}

/// A CTA's walk through the units (the consumers hold it across their mainloop, where every
/// register counts: a dense schedule keeps the tile counts, a grouped one its cursor).
#[derive(Clone, Copy, Debug)]
pub struct TileScheduler {
    s: Schedule,
    m_tiles: u32,
    n_tiles: u32,
    total: u32,
    group_m: u32,
    next: u32,
    stride: u32,
    /// Grouped: the group the walk is in and its rows.
    group: GroupCursor,
}

/// Where a CTA's walk through the groups stands (its units come in increasing order, so the
/// groups are read once each).
#[derive(Clone, Copy, Debug)]
struct GroupCursor {
    /// One past the group (0: before the first).
    g: u32,
    row0: u32,
    row_end: u32,
    /// Position of the group's first unit in the linear order.
    base: u32,
}

impl TileScheduler {
    /// CTA (or cluster) `first` of `stride`. The host keeps the unit count below 2³²
    /// ([`Schedule::units`]) and `group_m`, `split_k` ≥ 1.
    #[inline(always)]
    pub const fn new(s: Schedule, first: u32, stride: u32) -> Self {
        let m_tiles = tiles(s.m, s.unit_m);
        // Sparse: the band-ordered grid is M tiles × segments (no units without segments; the
        // divisor is kept nonzero where the compiler can see it).
        let (n_tiles, total) = match s.sparse {
            Some(sp) => (if sp.count == 0 { 1 } else { sp.count }, m_tiles * sp.count),
            None => {
                let n_tiles = tiles(s.n, s.unit_n);
                (n_tiles, m_tiles * n_tiles * (s.l * s.split_k))
            }
        };
        TileScheduler {
            s,
            m_tiles,
            n_tiles,
            total,
            group_m: if s.group_m == 0 { 1 } else { s.group_m },
            next: first,
            stride,
            group: GroupCursor {
                g: 0,
                row0: 0,
                row_end: 0,
                base: 0,
            },
        }
    }

    /// Number of units of a dense problem.
    #[inline(always)]
    pub const fn total(&self) -> u32 {
        self.total
    }

    /// Where position `r` of a band-ordered grid of `m_tiles` × `n_tiles` lies: its band's first
    /// M tile, the band's M tiles (`group_m`, or fewer in the last band) and its position in
    /// the band.
    #[inline(always)]
    const fn band_of(&self, r: u32, m_tiles: u32, n_tiles: u32) -> (u32, u32, u32) {
        let group_m = self.group_m;
        // (Divisors are nonzero for every position of a unit; `checked_*` keeps a panic path,
        // which would make ptxas ignore `setmaxnreg`, out of the kernels where the compiler
        // cannot see that.)
        let band = or_zero(r.checked_div(group_m * n_tiles));
        let first_m = band * group_m;
        let rows = if m_tiles - first_m < group_m {
            m_tiles - first_m
        } else {
            group_m
        };
        (first_m, rows, r - band * group_m * n_tiles)
    }

    /// The unit at position `r` of a band-ordered grid of `m_tiles` × `n_tiles`: bands of
    /// `group_m` M tiles, M fastest inside a band.
    #[inline(always)]
    const fn banded(&self, r: u32, m_tiles: u32, n_tiles: u32) -> (u32, u32) {
        let (first_m, rows, in_band) = self.band_of(r, m_tiles, n_tiles);
        (
            first_m + or_zero(in_band.checked_rem(rows)),
            or_zero(in_band.checked_div(rows)),
        )
    }

    /// [`Self::banded`] with each band column's M tiles rotated by the column's index
    /// ([`Groups::skew`]).
    #[inline(always)]
    const fn banded_skewed(&self, r: u32, m_tiles: u32, n_tiles: u32) -> (u32, u32) {
        let (first_m, rows, in_band) = self.band_of(r, m_tiles, n_tiles);
        let col = or_zero(in_band.checked_div(rows));
        let j = in_band - col * rows;
        (first_m + or_zero((j + col).checked_rem(rows)), col)
    }

    /// The unit at position `t` of a dense problem's linear order.
    #[inline(always)]
    pub const fn unit(&self, t: u32) -> WorkUnit {
        let (m_tiles, n_tiles) = (self.m_tiles, self.n_tiles);
        let per_batch = m_tiles * n_tiles;
        let out_l = t / per_batch;
        let (m, n) = self.banded(t % per_batch, m_tiles, n_tiles);
        let (split, k_blocks) = (self.s.split_k, self.s.k_blocks);
        // Entry `l·split + s` of the order takes the `s`-th of `split` near-equal K ranges.
        let (l, k_begin, k_end) = if split <= 1 {
            (out_l, 0, k_blocks)
        } else {
            let s = out_l % split;
            (
                out_l / split,
                s * k_blocks / split,
                (s + 1) * k_blocks / split,
            )
        };
        WorkUnit {
            m,
            n,
            l,
            out_l,
            a_l: l,
            row0: 0,
            row_end: u32::MAX,
            k_begin,
            k_end,
            seg: 0,
        }
    }

    /// The sparse unit at position `t`: the unit of the band-ordered M tiles × segments grid,
    /// with its segment's tile and stored blocks. (Loading the segment one unit ahead measured
    /// no faster.)
    /// # Safety
    /// `t` < the total; `sp` is the schedule's.
    #[inline(always)]
    unsafe fn sparse_unit(&self, t: u32, sp: Sparse) -> WorkUnit {
        let (m, i) = self.banded(t, self.m_tiles, self.n_tiles);
        // SAFETY: the caller's contract (`i` < count).
        let seg = unsafe { sp.segment(i) };
        WorkUnit {
            m,
            n: seg.n,
            l: 0,
            out_l: 0,
            a_l: 0,
            row0: 0,
            row_end: u32::MAX,
            k_begin: seg.begin,
            k_end: seg.end,
            seg: i,
        }
    }

    /// Tiles of the grouped axis (for rows `row0..row_end`) and of the other axis.
    #[inline(always)]
    const fn group_tiles(&self, gs: Groups, row0: u32, row_end: u32) -> (u32, u32) {
        if gs.along_n {
            ((row_end - row0).div_ceil(self.s.unit_n), self.m_tiles)
        } else {
            ((row_end - row0).div_ceil(self.s.unit_m), self.n_tiles)
        }
    }

    /// The grouped unit at position `self.next`, moving the cursor over the groups before it;
    /// `None` past the last group.
    #[inline(always)]
    fn grouped_unit(&mut self, gs: Groups) -> Option<WorkUnit> {
        let mut c = self.group;
        let (mut tiles, mut other) = self.group_tiles(gs, c.row0, c.row_end);
        while self.next >= c.base + tiles * other {
            if c.g >= gs.count {
                self.group = c;
                return None;
            }
            c.base += tiles * other;
            // SAFETY: `g < count` and the host passes `count` values at `ptr` (Groups' contract).
            (c.row0, c.row_end) = unsafe { gs.rows_of(c.g, c.row_end) };
            c.g += 1;
            (tiles, other) = self.group_tiles(gs, c.row0, c.row_end);
        }
        self.group = c;
        let (m_tiles, n_tiles) = if gs.along_n {
            (other, tiles)
        } else {
            (tiles, other)
        };
        let (m, n) = if gs.skew {
            self.banded_skewed(self.next - c.base, m_tiles, n_tiles)
        } else {
            self.banded(self.next - c.base, m_tiles, n_tiles)
        };
        let g = c.g - 1;
        let a_l = if gs.masked { g } else { 0 };
        Some(WorkUnit {
            m,
            n,
            l: g,
            out_l: a_l,
            a_l,
            row0: c.row0,
            row_end: c.row_end,
            k_begin: 0,
            k_end: self.s.k_blocks,
            seg: 0,
        })
    }
}

/// Tiles of `size` covering `len` (0 for an empty size, which no host passes: no panic path).
#[inline(always)]
const fn tiles(len: u32, size: u32) -> u32 {
    if size == 0 { 0 } else { len.div_ceil(size) }
}

/// `v`, or 0 for `None`.
#[inline(always)]
const fn or_zero(v: Option<u32>) -> u32 {
    match v {
        Some(v) => v,
        None => 0,
    }
}

/// This CTA's units, in order.
impl Iterator for TileScheduler {
    type Item = WorkUnit;

    #[inline(always)]
    fn next(&mut self) -> Option<WorkUnit> {
        let unit = match (self.s.groups, self.s.sparse) {
            (None, _) if self.next >= self.total() => return None,
            // SAFETY: `next` < the total, the segments are the schedule's (Sparse's contract).
            (None, Some(sp)) => unsafe { self.sparse_unit(self.next, sp) },
            (None, None) => self.unit(self.next),
            (Some(gs), _) => self.grouped_unit(gs)?,
        };
        self.next += self.stride;
        Some(unit)
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
            groups: None,
            sparse: None,
        }
    }

    #[test]
    fn splitk_gives_every_cta_tile_its_own_slot_once_per_k_range() {
        let (one, pair_m, pair_n) = (
            ClusterShape::ONE,
            ClusterShape { m: 2, n: 1 },
            ClusterShape { m: 1, n: 2 },
        );
        for &(m, n, l, kb, split, cl) in &[
            (129u32, 7168u32, 2u32, 56u32, 4u32, one),
            (300, 1000, 3, 9, 2, pair_m),
            (300, 1000, 1, 9, 3, pair_n),
            (16, 2112, 1, 56, 7, one),
        ] {
            let mut s = schedule(m, n, l, kb, split, 4);
            // Units are clusters of 128 × 128 tiles.
            (s.unit_m, s.unit_n) = (128 * cl.m, 128 * cl.n);
            let (floats, counters) = s.splitk_workspace(cl).unwrap();
            let tiles = counters / crate::gemm::barriers::MAX_CONSUMERS as u64;
            let mut ranges: HashMap<u32, HashSet<u32>> = HashMap::new();
            for u in TileScheduler::new(s, 0, 1) {
                for rank in 0..cl.size() {
                    let t = s.cta_tile(&cl.own(u, rank), cl);
                    assert!((t as u64) < tiles, "{t} of {tiles}");
                    assert!(ranges.entry(t).or_default().insert(u.out_l % split));
                }
            }
            assert_eq!(ranges.len() as u64, tiles);
            assert!(ranges.values().all(|r| r.len() == split as usize));
            assert_eq!(floats, tiles * split as u64 * 128 * 128);
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
                a_l: 1,
                row0: 7,
                row_end: 300,
                k_begin: 2,
                k_end: 9,
                seg: 0,
            };
            let tiles: HashSet<WorkUnit> = (0..shape.size()).map(|r| shape.own(unit, r)).collect();
            assert_eq!(tiles.len() as u32, shape.size());
            for t in tiles {
                assert_eq!(t.m / shape.m, unit.m);
                assert_eq!(t.n / shape.n, unit.n);
                assert_eq!((t.l, t.out_l, t.k_blocks()), (1, 1, 2..9));
                assert_eq!((t.a_l, t.row0, t.row_end), (1, 7, 300));
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

    /// Every CTA's grouped units, for `values` (ends or counts) of a grouped schedule.
    fn grouped_units(
        values: &[i32],
        (masked, along_n, skew): (bool, bool, bool),
        rows: u32,
        ctas: u32,
    ) -> Vec<WorkUnit> {
        let groups = Groups {
            ptr: values.as_ptr() as u64,
            count: values.len() as u32,
            masked,
            rows,
            along_n,
            skew,
        };
        let (m, n) = if along_n { (512, rows) } else { (rows, 512) };
        let s = Schedule {
            groups: Some(groups),
            ..schedule(m, n, 1, 5, 1, 2)
        };
        let bound = s.units().unwrap();
        let units: Vec<WorkUnit> = (0..ctas)
            .flat_map(|c| TileScheduler::new(s, c, ctas))
            .collect();
        assert!(
            units.len() as u64 <= bound,
            "{} units, bound {bound}",
            units.len()
        );
        units
    }

    /// The rows each group owns after clamping, as the documentation of [`Groups::rows`] says.
    fn clamped(values: &[i32], masked: bool, rows: u32) -> Vec<(u32, u32)> {
        let mut prev = 0u32;
        values
            .iter()
            .map(|&v| {
                let v = v.max(0) as u32;
                if masked {
                    (0, v.min(rows))
                } else {
                    let r = (prev, v.clamp(prev, rows));
                    prev = r.1;
                    r
                }
            })
            .collect()
    }

    #[test]
    fn grouped_units_cover_each_groups_rows_once_and_empty_groups_have_none() {
        let cases: &[(&[i32], bool, u32)] = &[
            // Contiguous ends with empty groups, a 1-row group and ragged ends.
            (&[0, 80, 256, 256, 257, 600, 1000], false, 1000),
            // Decreasing ends and ends past the rows are clamped.
            (&[300, 200, 5000, -4, 999], false, 700),
            // Masked counts: zero, one, full, above capacity, negative.
            (&[0, 1, 256, 300, -7, 129], true, 256),
        ];
        for &(values, masked, rows) in cases {
            for (along_n, skew) in [(false, false), (true, false), (false, true), (true, true)] {
                for ctas in [1, 3, 132] {
                    let layout = (masked, along_n, skew);
                    let units = grouped_units(values, layout, rows, ctas);
                    let want = clamped(values, masked, rows);
                    // Per group: the rows its tiles start at cover [first, end) in tiles of 128,
                    // each (tile, other-axis tile) once.
                    let mut seen = HashSet::new();
                    for u in &units {
                        let g = u.l as usize;
                        assert_eq!((u.row0, u.row_end), want[g], "{values:?} {u:?}");
                        assert_eq!(u.a_l, if masked { u.l } else { 0 });
                        assert_eq!(u.out_l, u.a_l);
                        assert_eq!(u.k_blocks(), 0..5);
                        let (t, other) = if along_n { (u.n, u.m) } else { (u.m, u.n) };
                        assert!(u.first_row(t, 128) < u.row_end, "{u:?}");
                        assert!(other < 4);
                        assert!(seen.insert((g, t, other)), "{u:?} twice");
                    }
                    let expect: usize = want
                        .iter()
                        .map(|&(a, b)| (b - a).div_ceil(128) as usize * 4)
                        .sum();
                    assert_eq!(seen.len(), expect, "{values:?} masked {masked}");
                }
            }
        }
    }

    #[test]
    fn sparse_units_cover_every_m_tile_of_every_segment_once() {
        // Segments of tiles 0..4 (tile 2 cut in two parts), longest first.
        let seg = |n, begin, end, part, parts| Segment {
            n,
            begin,
            end,
            part,
            parts,
            slot: 0,
            counter: 0,
            _pad: 0,
        };
        let segments = [
            seg(2, 10, 16, 0, 2),
            seg(2, 16, 22, 1, 2),
            seg(0, 0, 5, 0, 1),
            seg(3, 22, 24, 0, 1),
            seg(1, 5, 5, 0, 1),
        ];
        let sparse = Sparse {
            segments: segments.as_ptr() as u64,
            count: segments.len() as u32,
            slots: 2,
            counters: 1,
        };
        for (m, group_m, ctas) in [(1000u32, 3u32, 7u32), (128, 1, 132), (5000, 8, 1)] {
            let s = Schedule {
                sparse: Some(sparse),
                ..schedule(m, 512, 1, 4, 1, group_m)
            };
            let total = s.units().unwrap();
            assert_eq!(total, m.div_ceil(128) as u64 * segments.len() as u64);
            let mut seen = HashSet::new();
            for c in 0..ctas {
                for u in TileScheduler::new(s, c, ctas) {
                    let g = segments[u.seg as usize];
                    assert_eq!((u.n, u.k_begin, u.k_end), (g.n, g.begin, g.end), "{u:?}");
                    assert!(seen.insert((u.m, u.seg)), "{u:?} twice");
                    // SAFETY: `u` is a unit of `s`.
                    let meeting = unsafe { s.meeting(&u, ClusterShape::ONE) };
                    assert_eq!((meeting.part, meeting.parts), (g.part, g.parts));
                }
            }
            assert_eq!(seen.len() as u64, total);
        }
    }

    #[test]
    fn groups_without_rows_have_no_units() {
        let values = [0i32, 0, 0];
        for skew in [false, true] {
            assert!(grouped_units(&values, (false, false, skew), 128, 4).is_empty());
            assert!(grouped_units(&values, (true, true, skew), 128, 4).is_empty());
        }
    }

    #[test]
    fn skewed_bands_spread_a_groups_last_tiles_over_the_ctas_with_the_same_units_per_window() {
        // Groups of 3 tiles of 128 rows (two whole, a partial last), 66 tile columns, 66 CTAs
        // (a multiple of 3): in group order a third of the CTAs get every last tile.
        let ends: [i32; 4] = [300, 600, 900, 1200];
        let walks = |skew: bool, ctas: u32| -> Vec<Vec<WorkUnit>> {
            let groups = Groups {
                ptr: ends.as_ptr() as u64,
                count: 4,
                masked: false,
                rows: 1200,
                along_n: false,
                skew,
            };
            let s = Schedule {
                groups: Some(groups),
                ..schedule(1200, 66 * 128, 1, 5, 1, 8)
            };
            (0..ctas)
                .map(|c| TileScheduler::new(s, c, ctas).collect())
                .collect()
        };
        let last = |u: &WorkUnit| u.first_row(u.m, 128) + 128 >= u.row_end;
        for skew in [false, true] {
            let counts: Vec<usize> = walks(skew, 66)
                .iter()
                .map(|us| us.iter().filter(|u| last(u)).count())
                .collect();
            let (least, most) = (counts.iter().min(), counts.iter().max());
            if skew {
                assert!(most.unwrap() - least.unwrap() <= 1, "{counts:?}");
            } else {
                // 4 groups × 66 last tiles, all on the 22 CTAs 2 mod 3.
                assert_eq!((least, most), (Some(&0), Some(&12)), "{counts:?}");
            }
        }
        // One CTA walks the whole order: each window of 66 units (a round of 66 CTAs) holds the
        // same units skewed or not.
        let (plain, skewed) = (walks(false, 1).remove(0), walks(true, 1).remove(0));
        let sorted = |us: &[WorkUnit]| {
            let mut v: Vec<(u32, u32, u32)> = us.iter().map(|u| (u.l, u.n, u.m)).collect();
            v.sort();
            v
        };
        assert_eq!(plain.len(), skewed.len());
        for (a, b) in plain.chunks(66).zip(skewed.chunks(66)) {
            assert_eq!(sorted(a), sorted(b));
        }
    }
}
