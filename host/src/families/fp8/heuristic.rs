//! The FP8 family's configuration rules, fitted to sweeps, and their tuning constants: dense
//! (a cost model of tiles and rounds), decode (swapped tiles and the K split), block-sparse and
//! grouped.

use super::Sm90Config;
use crate::families::heuristic::{GROUP_ROWS, Hardware, MIN_SPLIT_K_BLOCKS, split_k};
use blockscaled_kernels::gemm::scheduler::ClusterShape;
use blockscaled_kernels::sm90::{BLOCK_K, Tile};

/// The sm90 configuration `choose` uses for an A of `m` rows and a B of `n` rows (`l` batch
/// entries) on the GPU `hw` (the runner starts from it when it forces a field).
///
/// Tile: the persistent CTAs work through the tiles in rounds of the SMs; the time is about
/// rounds × the time of one tile (`tile_cost`, in 128-row tiles). The 256-row tile does twice
/// the work with a quarter fewer L2 bytes per FLOP, so it wins unless its coarser rounds leave SMs
/// idle (small M, or few tiles); the 192-row tile sits between them and fills rounds that
/// neither does (4096 × 2112: 3 rounds of 192-row tiles for 5 of 128 or 3 of 256). Where A is one
/// 128-row tile (M ≤ `N64_MAX_M`), 128 × 64 tiles double the tiles: more SMs share B, the
/// operand that comes from DRAM, while A stays in L2. To 64 rows (from 33 with K ≥
/// `SWAPPED_64_MIN_K`) the swapped tiles (`sm90_decode_default`); from 65 to `SHARED_B_MAX_M`
/// rows with such K, swapped tiles of 16 or 32 rows where the decode model finds them faster
/// (`swapped_past_64`).
///
/// Cluster: see `cluster` (private). Split-K: see `split_k` (private). Raster band (`group_m`):
/// CTAs running together cover `group_m` M tiles × (SMs / group_m) N tiles, so both operands'
/// working sets stay in L2; a band is `GROUP_ROWS` rows of A.
pub fn sm90_default(m: usize, n: usize, k: usize, l: usize, hw: Hardware) -> Sm90Config {
    if m <= SWAPPED_MAX_M && (m <= 32 || k >= SWAPPED_64_MIN_K) {
        return sm90_decode_default(m, n, k, l, hw);
    }
    if let Some(c) = swapped_past_64(m, n, k, l, hw) {
        return c;
    }
    let rule = sm90_unswapped(m, n, k, l, hw.sm_count, true);
    if m <= N64_MAX_M {
        return narrow_or_square(rule, m, n, k, l, hw);
    }
    rule
}

/// At M ≤ `N64_MAX_M` (one row of tiles, a shape that waits on memory): `rule`'s plan where it
/// is on 128 × 64 or 128 × 128 tiles, or the other of the two with the split the streaming
/// model finds fastest, whichever that model (`unswapped_streaming`) finds faster; any other
/// plan as it is. The tile-cost rule counts rounds, not the split's shorter K ranges nor the
/// DRAM's rate: at 128 × 7168 × 16384 the 128 × 128 tiles split 2 ways ran 43.9 µs against 49.5
/// for 128 × 64 unsplit on the H200, where the H100 (slower DRAM) measured the opposite, 56.5
/// against 49.2; the model has both GPUs' order.
fn narrow_or_square(
    rule: Sm90Config,
    m: usize,
    n: usize,
    k: usize,
    l: usize,
    hw: Hardware,
) -> Sm90Config {
    let other = match rule.tile {
        Tile::M128N64 => Tile::M128,
        Tile::M128 => Tile::M128N64,
        _ => return rule,
    };
    let ours = unswapped_streaming(rule.tile, m, n, k, l).cost(rule.split_k as usize, hw);
    match unswapped_streaming(other, m, n, k, l).fastest_split(hw, |_| true) {
        Some((split, us)) if us < ours => Sm90Config {
            tile: other,
            cluster: ClusterShape::ONE,
            group_m: 1,
            ctas: rule.ctas,
            split_k: split as u32,
        },
        _ => rule,
    }
}

/// The streaming model of unswapped 128-row tiles at M ≤ `N64_MAX_M`: each unit streams a K
/// block of A (16 KiB) and of B (`block_n` × 128 bytes) through its pipeline at
/// `UNSWAPPED_SM_RATE`; A and B come from DRAM once; a split's partial tile is 128 × `block_n`
/// f32.
fn unswapped_streaming(tile: Tile, m: usize, n: usize, k: usize, l: usize) -> Streaming {
    let l = l.max(1);
    let block_bytes = (tile.block_m() + tile.block_n) * BLOCK_K;
    Streaming {
        tiles: m.div_ceil(tile.block_m() as usize) * n.div_ceil(tile.block_n as usize) * l,
        k_blocks: k / BLOCK_K as usize,
        unit_block_us: block_bytes as f64 / UNSWAPPED_SM_RATE,
        dram_bytes: ((m + n) * k * l) as f64,
        l2_us: 0.0,
        outputs: m * n * l,
        partial_rows: tile.block_m() * tile.block_n / 128,
    }
}

/// Bytes of A and B per µs one SM streams through a 128 × 64 or 128 × 128 tile's pipeline when
/// DRAM is not the limit: fitted to the H200's unsplit timings of both tiles at 128 × 7168 ×
/// 2048 and 16384 (one round each: 74–84 GB/s per SM once the launch's 7 µs are set apart).
pub(crate) const UNSWAPPED_SM_RATE: f64 = 80e3;

/// [`sm90_default`]'s choice among the unswapped tiles, the wide ones only if `wide` (the
/// grouped kernels have none).
pub(crate) fn sm90_unswapped(
    m: usize,
    n: usize,
    k: usize,
    l: usize,
    sm_count: u32,
    wide: bool,
) -> Sm90Config {
    let cost = |t: Tile| {
        let tiles = m.div_ceil(t.block_m() as usize) * n.div_ceil(t.block_n as usize) * l.max(1);
        let rounds = tiles.div_ceil(sm_count.max(1) as usize) as f64;
        rounds * tile_cost(t)
    };
    let mut candidates = vec![Tile::M256, Tile::M192, Tile::M128];
    let n64_tiles = m.div_ceil(128) * n.div_ceil(64) * l.max(1);
    if m <= N64_MAX_M || (N64_ROUND_M.contains(&m) && n64_tiles <= sm_count as usize) {
        candidates.push(Tile::M128N64);
    }
    if m > N64_MAX_M && wide {
        // The wide tiles' costs were measured where the tensor cores are the limit (M ≥ 1024);
        // at M ≤ 128 the shapes wait on memory and keep the rule fitted there.
        candidates.extend([Tile::M128N192, Tile::M128N160, Tile::M128N144]);
    }
    // Ties go to the earlier (taller, wider) tile: fewer L2 bytes for the same time.
    let tile = candidates.into_iter().fold(
        Tile::M256,
        |best, t| if cost(t) < cost(best) { t } else { best },
    );
    let n_tiles = n.div_ceil(tile.block_n as usize) * l.max(1);
    let m_tiles = m.div_ceil(tile.block_m() as usize);
    let tiles = m_tiles * n_tiles;
    let split_k = split_k(tiles, k / BLOCK_K as usize, sm_count, SPLIT_K_COST_BLOCKS);
    let cluster = if split_k == 1 {
        cluster(
            tile,
            m_tiles,
            n.div_ceil(tile.block_n as usize),
            l.max(1),
            sm_count,
        )
    } else {
        ClusterShape { m: 1, n: 1 }
    };
    Sm90Config {
        tile,
        cluster,
        group_m: m_tiles.clamp(1, (GROUP_ROWS / tile.block_m()) as usize) as u32,
        ctas: sm_count.max(1),
        split_k,
    }
}

/// Largest M for which the swapped tiles ([`Tile::swapped`]) are the rule: up to 64 rows, one
/// swapped tile holds all of A, so B (the weights) is read from DRAM once, in stages of 16 KiB
/// (past it, only where `swapped_past_64` finds them faster).
pub(crate) const SWAPPED_MAX_M: usize = 64;

/// Smallest K for which 33 to 64 rows take the 64-row swapped tile: with less K there are
/// many tiles per SM and the swapped tile's heavier MMA work per byte of B (m64n64 for every
/// 64 rows of B) costs more than the unswapped tiles' half-empty A. Where that turns depends
/// on how fast B streams: at M = 64 (docs/perf-log, decode-sized M, µs swapped against
/// unswapped), on the H100 K = 512, 1536 and 2048 took 15.2 / 23.7 / 13.7 against
/// 14.0 / 23.1 / 13.2, and K = 7168 and 16384 15.7 / 20.7 / 50.8 against 16.6 / 23.6 / 66.7;
/// on the H200 (faster HBM) K = 512 13.6 against 12.9, but K = 1536 and 2048 20.4 / 12.3
/// against 23.8 / 13.3. The H200's gains at 1536 and 2048 outweigh the H100's losses there.
pub(crate) const SWAPPED_64_MIN_K: usize = 1024;

/// The sm90 configuration at decode sizes (M ≤ `SWAPPED_MAX_M`): of the swapped tiles, the one
/// and the K split the decode model (`swapped_streaming`) finds fastest: the tile of the fewest rows
/// that holds M, with any split, or a narrower one whose A tiles share each B tile
/// (`Sharing::OneRound`).
pub fn sm90_decode_default(m: usize, n: usize, k: usize, l: usize, hw: Hardware) -> Sm90Config {
    let holds = [Tile::S16, Tile::S32, Tile::S64]
        .into_iter()
        .find(|t| m <= t.block_m() as usize)
        .unwrap_or(Tile::S64);
    // With any split there is always one (split 1).
    let mut best = fastest_split(holds, m, n, k, l, hw, Sharing::Any).unwrap_or(Swapped {
        tile: holds,
        split: 1,
        us: f64::INFINITY,
    });
    // Ties go to the tile that holds M: fewer L2 bytes for the same time.
    for narrower in [Tile::S16, Tile::S32] {
        if narrower.block_m() < holds.block_m() {
            let shared = fastest_split(narrower, m, n, k, l, hw, Sharing::OneRound);
            if let Some(p) = shared.filter(|p| p.us < best.us) {
                best = p;
            }
        }
    }
    best.config(n, hw)
}

/// From 65 to `SHARED_B_MAX_M` rows with K ≥ `SWAPPED_64_MIN_K`: a swapped plan of 16 or 32 rows whose A tiles share each B
/// tile (`Sharing::OneRound`) where the decode model finds it faster than the 128 × 64 tiles;
/// `None` where it does not. The model has no term for the 128 × 64 tiles: it stands in the
/// 64-row swapped tile over two A tiles, with any split (as many tiles, and as many bytes of B
/// per tile). On the H200 the two ran within 3% of each other at 128 × 576 × 7168, splits 1–8,
/// and the 128 × 64 tiles up to 13% faster elsewhere (128 × 4096 × 7168 split 2;
/// docs/tune-data/h200.jsonl), so the stand-in errs toward the swapped plans. With it the
/// heuristic took the fastest timed plan on 10 of the 12 shapes of 96 and 128 rows there (at
/// 128 × 576 × 7168 32 rows split 6, 5% slower than split 4; at 128 × 4608 × 7168 the 128 × 64
/// tiles, 7.6% slower than 128 × 128 split 2).
fn swapped_past_64(m: usize, n: usize, k: usize, l: usize, hw: Hardware) -> Option<Sm90Config> {
    if m > SHARED_B_MAX_M || k < SWAPPED_64_MIN_K {
        return None;
    }
    let unswapped = fastest_split(Tile::S64, m, n, k, l, hw, Sharing::Any)?;
    [Tile::S16, Tile::S32]
        .into_iter()
        .filter_map(|t| fastest_split(t, m, n, k, l, hw, Sharing::OneRound))
        .filter(|p| p.us < unswapped.us)
        .min_by(|a, b| a.us.total_cmp(&b.us))
        .map(|p| p.config(n, hw))
}

/// Largest M for which [`sm90_default`] weighs swapped tiles against the unswapped ones
/// (`swapped_past_64`): past it A's tiles are too many to share each B tile in one round.
pub(crate) const SHARED_B_MAX_M: usize = 128;

/// A swapped tile, its K split and the decode model's time for them (µs).
#[derive(Clone, Copy, Debug)]
struct Swapped {
    tile: Tile,
    split: u32,
    us: f64,
}

impl Swapped {
    fn config(self, n: usize, hw: Hardware) -> Sm90Config {
        let b_tiles = n.div_ceil(self.tile.block_n as usize);
        Sm90Config {
            tile: self.tile,
            cluster: ClusterShape::ONE,
            // Bands run over B's tiles (the swapped schedule's M); with one A tile they do not
            // matter, and a band of 2048 rows of B is the dense rule's.
            group_m: b_tiles.clamp(1, (GROUP_ROWS / self.tile.block_n) as usize) as u32,
            ctas: hw.sm_count.max(1),
            split_k: self.split,
        }
    }
}

/// Which splits a swapped tile may take when M spans several of its A tiles.
#[derive(Clone, Copy, PartialEq)]
enum Sharing {
    /// Any split (one A tile, or the model of the 128 × 64 tiles).
    Any,
    /// The A tiles of each B tile read it from L2 after the first brought it from DRAM: only
    /// where all the units run in one round of the SMs (a later round's units find their B
    /// evicted or read it again: measured 1.4× slower, 64 × 576 × 7168 on 16-row tiles split 7
    /// against 4) and B fits in the L2 (`L2_BYTES`): past it the A tiles' reads drift apart and
    /// B comes from DRAM more than once (64 × 7168 × 16384, B 117 MB: the 32-row tiles unsplit
    /// ran 13 µs over the model on the H200, where the other plans of the shape ran 5–8 over).
    OneRound,
}

/// L2 bytes of the H100 and H200 (50 MB).
pub(crate) const L2_BYTES: usize = 50 << 20;

/// The split of K for `tile` that the decode model (`swapped_streaming`) finds fastest, among
/// those `Streaming::fastest_split` weighs that meet `sharing`'s condition; `None` where none
/// does.
fn fastest_split(
    tile: Tile,
    m: usize,
    n: usize,
    k: usize,
    l: usize,
    hw: Hardware,
    sharing: Sharing,
) -> Option<Swapped> {
    let b_tiles = n.div_ceil(tile.block_n as usize) * l.max(1);
    let a_tiles = m.div_ceil(tile.block_m() as usize).max(1);
    if sharing == Sharing::OneRound && (a_tiles == 1 || n * k * l.max(1) > L2_BYTES) {
        return None;
    }
    let one_round = |s: usize| b_tiles * a_tiles * s <= hw.sm_count as usize;
    let model = swapped_streaming(
        tile,
        b_tiles,
        a_tiles,
        k / BLOCK_K as usize,
        m * n * l.max(1),
    );
    let (split, us) = model.fastest_split(hw, |s| sharing == Sharing::Any || one_round(s))?;
    Some(Swapped {
        tile,
        split: split as u32,
        us,
    })
}

/// The decode model of `b_tiles` × `a_tiles` swapped tiles over `k_blocks` K blocks (`outputs`
/// = M·N·L values), a GEMM that waits on B's bytes ([`Streaming`]): each unit streams 16 KiB
/// of B per K block through its pipeline at `decode_sm_rate`; B comes from DRAM once whatever
/// the A tiles (they read it together), and every unit reads its B tile from L2
/// (`DECODE_L2_BYTES_PER_US`); a split's partial tiles are the tile's rows × 128 whatever M is.
///
/// Checked against a sweep of splits 1–8 on the decode set (docs/perf-log, decode-sized M) and
/// the tuner's timings of every tile and split on the H200 (docs/tune-data/h200.jsonl).
fn swapped_streaming(
    tile: Tile,
    b_tiles: usize,
    a_tiles: usize,
    k_blocks: usize,
    outputs: usize,
) -> Streaming {
    let block = (tile.block_n * BLOCK_K) as f64;
    let b_bytes = (b_tiles.max(1) * k_blocks) as f64 * block;
    Streaming {
        tiles: b_tiles.max(1) * a_tiles,
        k_blocks,
        unit_block_us: block / decode_sm_rate(tile),
        dram_bytes: b_bytes,
        l2_us: b_bytes * a_tiles as f64 / DECODE_L2_BYTES_PER_US,
        outputs,
        partial_rows: tile.block_m(),
    }
}

/// A GEMM that streams its operands through persistent CTAs, K split `s` ways, as the decode
/// model (`swapped_streaming`) and `narrow_or_square` (`unswapped_streaming`) price it (µs, launch costs left out):
///
/// `t(s) = Σ over rounds r of smax(dram_r, unit, l2_r)
///        + [s > 1] · (REDUCE + partials / HBM + (s − 1) · PARTIAL · partial_rows / 64)`
///
/// - units = `tiles · s`, taken by the persistent CTAs in rounds of the SMs; `dram_r` is round
///   `r`'s share of `dram_bytes` at `HBM`, so a last round of few units is limited by what one
///   SM streams, not by DRAM; `l2_r` its share of `l2_us`;
/// - `unit`: one unit's time alone, `⌈k_blocks / s⌉ · unit_block_us`; `HBM`: the rate the
///   operands stream from DRAM, `DECODE_DRAM_FRACTION` of the GPU's peak;
/// - `smax(x, y, z) = (x⁸ + y⁸ + z⁸)^⅛`: the largest, plus a little where the limits meet
///   (measured: at M = 64, 7168 × 16384 unsplit, the DRAM and SM limits alone each predict 42 µs
///   of streaming, 44 ran);
/// - the split's cost: the K ranges' meeting in the last CTA of each tile, a chain of L2 round
///   trips after the last range's K loop (`DECODE_REDUCE_US`), the f32 partials written and
///   read back, `2 · 4 · s · outputs` bytes, and that CTA's reading and adding the other
///   ranges' partial tiles one after another (`DECODE_PARTIAL_US` each per 64 of its rows).
struct Streaming {
    tiles: usize,
    k_blocks: usize,
    unit_block_us: f64,
    dram_bytes: f64,
    l2_us: f64,
    outputs: usize,
    partial_rows: u32,
}

impl Streaming {
    /// The split of K, 1..=16 with at least `MIN_SPLIT_K_BLOCKS` K blocks each and `allowed`,
    /// that `cost` finds fastest (ties to the smaller), with its time; `None` where none is
    /// allowed.
    fn fastest_split(&self, hw: Hardware, allowed: impl Fn(usize) -> bool) -> Option<(usize, f64)> {
        let most = (self.k_blocks / MIN_SPLIT_K_BLOCKS).clamp(1, 16);
        (1..=most)
            .filter(|&s| allowed(s))
            .map(|s| (s, self.cost(s, hw)))
            .fold(None, |best, x| match best {
                Some(b) if b.1 <= x.1 => Some(b),
                _ => Some(x),
            })
    }

    fn cost(&self, s: usize, hw: Hardware) -> f64 {
        let sms = hw.sm_count.max(1) as usize;
        let hbm = DECODE_DRAM_FRACTION * hw.dram_bytes_per_us;
        let smax = |x: f64, y: f64, z: f64| (x.powi(8) + y.powi(8) + z.powi(8)).powf(0.125);
        let units = self.tiles.max(1) * s;
        let unit = self.k_blocks.div_ceil(s) as f64 * self.unit_block_us;
        let dram = self.dram_bytes / hbm;
        let mut t = 0.0;
        for r in 0..units.div_ceil(sms) {
            let share = (units - r * sms).min(sms) as f64 / units as f64;
            t += smax(dram * share, unit, self.l2_us * share);
        }
        if s > 1 {
            t += DECODE_REDUCE_US
                + (8 * s * self.outputs) as f64 / hbm
                + (s - 1) as f64 * DECODE_PARTIAL_US * self.partial_rows as f64 / 64.0;
        }
        t
    }
}

/// The rate at which the SMs together read B's tiles from L2 in a swapped-tile GEMM, bytes per
/// µs: what makes A tiles sharing each B tile (`Sharing::OneRound`) cost more than their
/// units' count alone. Fitted to the H200's timings of every swapped tile and split
/// (docs/tune-data/h200.jsonl, 43 FP8 shapes of 16 to 128 rows): with 7 TB/s the heuristic's
/// geometric-mean regret there is 1.014 (its plan's time over the fastest of every family's);
/// with 6 and 8 TB/s 1.016 and 1.019, without the term 1.027 (16-row tiles at 64 × 4096 ×
/// 7168, 20.2 µs against 18.6), each over those of its plans that were timed.
pub(crate) const DECODE_L2_BYTES_PER_US: f64 = 7e6;

/// The fraction of the DRAM's peak rate at which a swapped-tile GEMM streams B: fitted to the
/// decode sweep on the H100 (2.78 MB/µs of its 3.35: 93% of its 3.0 TB/s copy ceiling once the
/// launch's constant costs are set apart). Checked on the H200 (4.81 MB/µs peak) against the
/// tuner's timings of every split (docs/tune-data): with the same fraction of its peak the
/// model's split ran within 1% of the fastest timed one on the 14 DeepSeek-V3 shapes at M = 16
/// and 64 (with `DECODE_PARTIAL_US`), where the H100's rate left 16 × 4096 × 7168 unsplit, 15%
/// slower than split 2.
pub(crate) const DECODE_DRAM_FRACTION: f64 = 0.83;

/// Bytes of B per µs one SM streams through a swapped tile's pipeline when DRAM is not the limit
/// (fitted to the unsplit shapes with fewer tiles than SMs): the wider the tile, the more MMA
/// work per byte.
pub(crate) fn decode_sm_rate(tile: Tile) -> f64 {
    match tile.block_m() {
        16 => 86e3,
        32 => 68e3,
        _ => 50e3,
    }
}

/// What a split adds after the K loop, µs: fitted to the decode sweep (docs/perf-log, decode-sized
/// M); with the partials summed by the last CTA of each tile, as now, a second sweep measured the
/// same within ±5%.
pub(crate) const DECODE_REDUCE_US: f64 = 2.2;

/// What the last CTA of a swapped tile spends per other K range's partial, per 64 rows of the
/// tile, µs: a 32 KiB f32 tile read from L2 and added, one after another. Fitted to the H200's
/// timings of every split (docs/tune-data/h200.jsonl): with it the model's split runs within 1%
/// of the fastest timed one on all 14 DeepSeek-V3 shapes at M = 16 and 64 (without it
/// 64 × 576 × 7168 split 14 ways on the 64-row tile, 14.1 µs against 13.0 at 8); the H100
/// sweep's choices stay within its measured bests.
pub(crate) const DECODE_PARTIAL_US: f64 = 0.2;

/// CTAs per cluster: 256- and 192-row tiles and the wide tiles go in pairs along N (the pair
/// shares the A tile by TMA multicast, halving its L2 reads) when the tiles fill at least one round
/// and pairing them (units of two tiles on half as many pairs of SMs) takes no more rounds (a
/// pair whose second tile is past N still takes a slot). Pairs along M (sharing B) and 128 × 128
/// tiles in pairs measured slower (docs/perf-log, the sm90 FP8 kernel): they run alone. (The wide
/// tiles' costs were measured in pairs along N; 128 × 192 alone was within 1–3% of its pairs.)
pub(crate) fn cluster(
    tile: Tile,
    m_tiles: usize,
    n_tiles: usize,
    l: usize,
    sm_count: u32,
) -> ClusterShape {
    let alone = ClusterShape { m: 1, n: 1 };
    let sms = sm_count.max(2) as usize;
    let tiles = m_tiles * n_tiles * l;
    if tiles < sms {
        return alone;
    }
    let rounds = tiles.div_ceil(sms);
    let pair_rounds =
        |cm: usize, cn: usize| (m_tiles.div_ceil(cm) * n_tiles.div_ceil(cn) * l).div_ceil(sms / 2);
    if (tile.block_m() > 128 || tile.is_wide()) && pair_rounds(1, 2) <= rounds {
        ClusterShape { m: 1, n: 2 }
    } else {
        alone
    }
}

/// What the f32 workspace round trip and the partials' sum cost, in K blocks of one 128×128
/// tile (docs/perf-log, the sm90 FP8 kernel; summing the partials in the last CTA of each tile
/// measured the same or faster at M = 128).
pub(crate) const SPLIT_K_COST_BLOCKS: usize = 10;

/// Time of one tile in units of a 128 × 128 tile's, measured on the H100 with every SM busy
/// (8192 × 8192 × 2048, each tile alone or in its pairs; docs/perf-log, the tile sweep): 256 × 128 1.86,
/// 192 × 128 1.50, 128 × 192 1.55, 128 × 160 1.41, 128 × 144 1.42 (the narrower wide tiles do
/// less work per shared-memory byte of their epilogue boxes and per MMA: per FLOP 0.89 and 0.79 of
/// a 128 × 128 tile, where 256 × 128 does 1.07); 128 × 64 0.6 (the cost that reproduces
/// every measured choice at M = 128, where these shapes wait on memory, not on the tensor cores).
/// With rounds × these costs, the choice on a sweep of 16 shapes (M 1024–8192, N 1536–24576,
/// K 1536–7168) ran within 2.5% of the fastest tile on every shape, 0.3% on average.
pub(crate) fn tile_cost(t: Tile) -> f64 {
    match (t.block_m(), t.block_n) {
        (256, _) => 1.86,
        (192, _) => 1.5,
        (_, 192) => 1.55,
        (_, 160) => 1.41,
        (_, 144) => 1.42,
        (_, 64) => 0.6,
        _ => 1.0,
    }
}

/// Largest M for 128 × 64 tiles: they read A once per 64 columns instead of 128, which only
/// pays where A is a single tile that stays in L2 and B (from DRAM) is what the SMs wait for.
pub(crate) const N64_MAX_M: usize = 128;

/// The Ms past [`N64_MAX_M`] for which 128 × 64 tiles are a candidate (at their cost) where
/// they fit one round of the SMs: with so few tiles the shape waits on B's bytes, and twice the
/// CTAs stream them while A (at most 512 × K) stays in L2. Measured on the H200 (the tuner, µs,
/// 128 × 64 against the 128 × 128 tiles, docs/tune-data/h200.jsonl): 512 × 2112 × 7168 25.3
/// against 28.8, 512 × 576 × 7168 15.5 against 17.4; at 256 rows, where the 128 × 128 tiles
/// split K 2 ways to fill the SMs, 41.9 against 41.0 (folded W4A8, 256 × 4096 × 7168).
pub(crate) const N64_ROUND_M: std::ops::RangeInclusive<usize> = 257..=512;

/// The block-sparse configuration for `m` dense rows and `n` sparse rows: 128 × 64 tiles at
/// M ≤ `N64_MAX_M` (twice the tiles), else 128 × 128, in pairs along M (sharing each stored
/// block by multicast) from `BSR_PAIR_MIN_M` rows; runs cut into up to
/// 16 parts (`bsr::MAX_PARTS`) where they are longer than a CTA's share of the work.
pub fn sm90_bsr_default(m: usize, n: usize, sm_count: u32) -> Sm90Config {
    let _ = n;
    let tile = if m <= N64_MAX_M {
        Tile::M128N64
    } else {
        Tile::M128
    };
    let cluster = if m >= BSR_PAIR_MIN_M && tile == Tile::M128 {
        ClusterShape { m: 2, n: 1 }
    } else {
        ClusterShape::ONE
    };
    let m_units = m.div_ceil((tile.block_m() * cluster.m) as usize);
    Sm90Config {
        tile,
        cluster,
        group_m: m_units.clamp(1, (GROUP_ROWS / (tile.block_m() * cluster.m)) as usize) as u32,
        ctas: sm_count.max(1),
        split_k: crate::bsr::MAX_PARTS,
    }
}

/// Smallest M for block-sparse pairs along M.
pub(crate) const BSR_PAIR_MIN_M: usize = 1024;

/// The FP8 kernel's configuration for a grouped GEMM: `groups` groups of about `per_group` rows
/// (`rows` in all), N, K. Groups of 512 rows or more (a mean) take the dense rule for
/// all their rows together ([`sm90_default`], without split-K): the groups' tiles fill the
/// SMs together, and each group's last tile skips the waves (64 rows of a consumer) that lie
/// wholly past the group's rows (the kernel's `live_waves`), so a 256-row tile on an uneven
/// group computes its rows rounded up to 64, not to 256. Small groups (MoE: tens to hundreds of rows) take 128 × 128 tiles, one cluster-free
/// CTA per tile, or 128 × 64 when twice as many of those still fit one round of the SMs (twice
/// the CTAs stream the experts' weights).
pub fn sm90_grouped_default(
    rows: usize,
    n: usize,
    k: usize,
    groups: usize,
    per_group: usize,
    sm_count: u32,
) -> Sm90Config {
    if per_group >= GROUPED_BAND_ROWS {
        // Masked groups are batch entries of `rows` (their capacity) each.
        let all = rows.max(groups * per_group);
        let mut cfg = sm90_unswapped(all, n, k, 1, sm_count, false);
        cfg.split_k = 1;
        let m_units = rows.div_ceil((cfg.tile.block_m() * cfg.cluster.m) as usize);
        cfg.group_m = cfg.group_m.min(m_units.max(1) as u32);
        return cfg;
    }
    // About half a tile wasted per group where the groups' rows do not fill their last tile.
    // 128 × 64 tiles only where twice the tiles still fit in one round: otherwise the second
    // round of half tiles costs more than the idle SMs of one round of whole ones (seed case 3,
    // 120 tiles on 132 SMs: 24.3 µs at 128 × 128, 30.5 at 128 × 64; docs/perf-log, grouped GEMM).
    let m_tiles = rows.div_ceil(128) + groups / 2;
    let tile = if 2 * m_tiles * n.div_ceil(128) <= sm_count as usize {
        Tile::M128N64
    } else {
        Tile::M128
    };
    Sm90Config {
        tile,
        cluster: ClusterShape::ONE,
        group_m: 1,
        ctas: sm_count.max(1),
        split_k: 1,
    }
}

/// Mean rows per group from which a grouped FP8 GEMM takes the dense rule for all its rows (its
/// tiles, clusters and bands of M tiles: a group of several M tiles then reads its expert's B
/// about once); a group of one or two 128-row tiles gains nothing from bands and can lose
/// (docs/perf-log, grouped prefill: the measurements).
pub(crate) const GROUPED_BAND_ROWS: usize = 512;
