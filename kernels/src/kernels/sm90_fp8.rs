//! Hopper FP8 GEMM with fp32 block scales: 1×128 for A (per row, per 128 of K), 128×128 for B
//! (DeepSeek-V3), C = A·Bᵀ. Per-tensor and per-row A scales run through it after the host expands
//! them into this layout; per-row B scales (per column of C, constant over K) are multiplied in
//! after the K loop (`sfb_col`).
//!
//! Sixteen entry points, one body: tiles (`params::sm90::Tile`) of 128 × 128 (two consumers, one
//! wave), 256 × 128 (two consumers, two waves), 192 × 128 (three consumers, one wave) and
//! 128 × 64 (`wgmma` m64n64k32: `wgmma::Fragment`), each for e4m3 / e5m2 A and B
//! (`wgmma::Fp8Pair`: the types are part of the instruction). Taller tiles move fewer L2 bytes
//! per FLOP, which is what limits the 128-row tile on large shapes; the 192-row tile fills rounds
//! of the schedule that the others leave part empty; the 64-column tile doubles the tiles where
//! M is one tile and too few 128-column tiles leave SMs idle (docs/PERF.md).
//!
//! Roles (one persistent CTA per SM, `tile.threads()` threads):
//! - warpgroup 0, one thread: the producer. For each tile of the schedule and each 128-wide K block
//!   it waits for a free stage, then TMA-loads the A tile (`block_m` × 128 FP8, in boxes of a wave
//!   or of 64 rows), the B tile (`block_n` × 128) and the tile's A scales into it.
//! - warpgroups 1.. : consumers, 64 rows of each wave each. Per K block and wave: four
//!   `wgmma m64nNk32` (N = `block_n`) into one scratch accumulator, then promotion into that
//!   wave's fp32 accumulator with `scale_a[row] · scale_b` (Hopper's FP8 tensor-core accumulation
//!   is not full fp32, so the partial sums are scaled and added in fp32 every 128 of K, with
//!   FFMA). The waves share the scratch, so a consumer thread holds N/2·(WAVES + 1)
//!   accumulators (DeepGEMM's arrangement). The consumers take turns issuing (`pipeline::Turn`, two or three parties).
//!   128-row tiles have registers for two scratch accumulators: each consumer issues two K
//!   blocks' MMAs and promotes the first while the second runs.
//!   After the last K block, 16-bit output goes through 128-byte-swizzled shared boxes and TMA
//!   stores (the warpgroup goes on to the next tile while they drain; TMA clips ragged M and N);
//!   f32 output, N % 8 ≠ 0 and split-K partials are stored directly with masks. The producer
//!   already fills the next tile's stages meanwhile.
//! - Split-K (`split_k` > 1): the schedule runs over `l · split_k` entries, each a range of K
//!   blocks of one batch entry, and writes f32 partials for `kernels::splitk` to sum.
//! - Clusters of 2 (`ClusterShape`): along M the two CTAs share the B tile (each loads half and
//!   multicasts it), along N they share the A tile (each loads every other box of it: a 128-row
//!   wave of 256-row tiles, 64 rows otherwise).
//!   Every consumer thread releases a stage to both CTAs' empty barriers.

use crate::params::sm90::{BLOCK_K, BLOCK_N, C_BOX_N, ROW_BYTES, Tile, WG_ROWS};
use crate::params::{OutType, Sm90Fp8Params};
use crate::pipeline::{Pipeline, Turn};
use crate::ptx::wgmma::{
    self, Descriptor, E4m3E4m3, E4m3E5m2, E5m2E4m3, E5m2E5m2, Fp8Pair, Fragment, Swizzle,
};
use crate::ptx::{convert, global, smem, thread, tma};
use crate::scheduler::{ClusterShape, TileScheduler};

/// K per `wgmma` (e4m3): 32 elements = 32 bytes of a swizzled row.
const MMA_K: u32 = 32;
/// Bytes between 8-row groups of a 128-byte-swizzled tile (8 rows × 128 bytes).
const SWIZZLE_SBO: u32 = 8 * ROW_BYTES;

/// Where stage `s`'s buffers are: all A tiles, then all B tiles, then the output tile, then all
/// A-scale vectors, then the pipeline's barriers. Tiles stay 1024-byte aligned (128-byte swizzle
/// needs it).
#[derive(Clone, Copy)]
struct StageLayout {
    base: u32,
    tile: Tile,
}

impl StageLayout {
    #[inline(always)]
    fn a(self, s: u32) -> u32 {
        self.base + s * self.tile.a_bytes()
    }
    #[inline(always)]
    fn b(self, s: u32) -> u32 {
        self.base + self.tile.stages() * self.tile.a_bytes() + s * self.tile.b_bytes()
    }
    /// Output box `h` (columns 64h..64h+64) of consumer `c`'s 64 rows of wave `w`: 64 rows of
    /// 128 bytes, 128-byte swizzled, the layout the output's TMA store reads.
    #[inline(always)]
    fn c(self, w: u32, c: u32, h: u32) -> u32 {
        self.base
            + self.tile.stages() * (self.tile.a_bytes() + self.tile.b_bytes())
            + ((w * self.tile.consumers + c) * (self.tile.block_n / C_BOX_N) + h)
                * WG_ROWS
                * ROW_BYTES
    }
    #[inline(always)]
    fn sfa(self, s: u32) -> u32 {
        self.base
            + self.tile.stages() * (self.tile.a_bytes() + self.tile.b_bytes())
            + self.tile.c_bytes()
            + s * self.tile.sfa_bytes()
    }
    #[inline(always)]
    fn barriers(self) -> u32 {
        self.base + self.tile.stages() * self.tile.stage_bytes() + self.tile.c_bytes()
    }
    /// wgmma descriptor of consumer `c`'s 64 rows of wave `w` of the A tile, at K step `kk`.
    #[inline(always)]
    fn a_desc(self, s: u32, w: u32, c: u32, kk: u32) -> Descriptor {
        Descriptor::new(
            self.a(s) + (w * self.tile.wave_m() + c * WG_ROWS) * ROW_BYTES,
            16,
            SWIZZLE_SBO,
            Swizzle::B128,
        )
        .advance(kk * MMA_K)
    }
    /// wgmma descriptor of the B tile (all `block_n` rows), at K step `kk`.
    #[inline(always)]
    fn b_desc(self, s: u32, kk: u32) -> Descriptor {
        Descriptor::new(self.b(s), 16, SWIZZLE_SBO, Swizzle::B128).advance(kk * MMA_K)
    }
}

/// One exported kernel per tile height and pair of element types (`registry::SM90_FP8_KERNELS`
/// lists the same names).
macro_rules! entry {
    ($(#[$doc:meta])* $name:ident, $tile:expr, $types:ty) => {
        $(#[$doc])*
        /// # Safety
        /// See [`gemm`].
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: Sm90Fp8Params) {
            // SAFETY: the caller's contract.
            unsafe {
                gemm::<
                    { $tile.consumers },
                    { $tile.waves as usize },
                    { $tile.producer_regs() },
                    { $tile.consumer_regs() },
                    [f32; { ($tile.block_n / 2) as usize }],
                    $types,
                >(p)
            }
        }
    };
}

entry!(/// 128 × 128 tiles, e4m3 · e4m3: small M, and shapes with too few 256-row tiles.
    sm90_fp8_blockscaled_gemm, Tile::M128, E4m3E4m3);
entry!(/// 256 × 128 tiles, e4m3 · e4m3: large shapes.
    sm90_fp8_blockscaled_gemm_m256, Tile::M256, E4m3E4m3);
entry!(/// 192 × 128 tiles (three consumers), e4m3 · e4m3.
    sm90_fp8_blockscaled_gemm_m192, Tile::M192, E4m3E4m3);
entry!(/// 128 × 64 tiles, e4m3 · e4m3: M = 128 where 128-column tiles leave SMs idle.
    sm90_fp8_blockscaled_gemm_n64, Tile::M128N64, E4m3E4m3);
entry!(sm90_fp8_blockscaled_gemm_e5m2_e5m2, Tile::M128, E5m2E5m2);
entry!(
    sm90_fp8_blockscaled_gemm_m256_e5m2_e5m2,
    Tile::M256,
    E5m2E5m2
);
entry!(
    sm90_fp8_blockscaled_gemm_m192_e5m2_e5m2,
    Tile::M192,
    E5m2E5m2
);
entry!(
    sm90_fp8_blockscaled_gemm_n64_e5m2_e5m2,
    Tile::M128N64,
    E5m2E5m2
);
entry!(sm90_fp8_blockscaled_gemm_e4m3_e5m2, Tile::M128, E4m3E5m2);
entry!(
    sm90_fp8_blockscaled_gemm_m256_e4m3_e5m2,
    Tile::M256,
    E4m3E5m2
);
entry!(
    sm90_fp8_blockscaled_gemm_m192_e4m3_e5m2,
    Tile::M192,
    E4m3E5m2
);
entry!(
    sm90_fp8_blockscaled_gemm_n64_e4m3_e5m2,
    Tile::M128N64,
    E4m3E5m2
);
entry!(sm90_fp8_blockscaled_gemm_e5m2_e4m3, Tile::M128, E5m2E4m3);
entry!(
    sm90_fp8_blockscaled_gemm_m256_e5m2_e4m3,
    Tile::M256,
    E5m2E4m3
);
entry!(
    sm90_fp8_blockscaled_gemm_m192_e5m2_e4m3,
    Tile::M192,
    E5m2E4m3
);
entry!(
    sm90_fp8_blockscaled_gemm_n64_e5m2_e4m3,
    Tile::M128N64,
    E5m2E4m3
);

/// # Safety
/// Launched by the host with `tile.threads()` threads, `tile.smem_bytes()` of dynamic shared memory
/// (`tile` = `Tile { consumers: CONS, waves: WAVES }`, `PREGS` / `CREGS` its register budgets) and
/// parameters from validated matrices: tensor maps of A (K, M, L) and B (K, N, L) with boxes
/// 128 × `tile.a_box_rows(cluster_n)` (B: 128 / `cluster_m` rows) and 128-byte swizzle, scale
/// buffers as `Sm90Fp8Params` describes, `k % 128 == 0`, `out` sized for L·M·N elements of
/// `out_type`, and a grid of whole clusters of `cluster_m · cluster_n` ≤ 2 CTAs.
#[inline(always)]
unsafe fn gemm<
    const CONS: u32,
    const WAVES: usize,
    const PREGS: u32,
    const CREGS: u32,
    F: Fragment,
    T: Fp8Pair,
>(
    p: Sm90Fp8Params,
) {
    let tile = Tile {
        consumers: CONS,
        waves: WAVES as u32,
        block_n: F::N,
    };
    let (block_m, stages) = (tile.block_m(), tile.stages());
    let layout = StageLayout {
        base: smem::dynamic_base(),
        tile,
    };
    let shape = ClusterShape {
        m: p.cluster_m,
        n: p.cluster_n,
    };
    let cluster = shape.size();
    let pipe = Pipeline::new(layout.barriers(), stages, cluster);
    let tid = thread::thread_x();
    let wg = tid / 128;
    let rank = if cluster > 1 {
        thread::cluster_cta_rank()
    } else {
        0
    };
    if tid == 0 {
        // SAFETY: the barrier memory is ours; the block / cluster barrier below precedes every use.
        unsafe {
            pipe.init(128 * tile.consumers);
            tma::prefetch_map(p.tmap_a);
            tma::prefetch_map(p.tmap_b);
        }
    }
    // With a cluster, the peer's barriers must be initialized before we multicast into its stages
    // or arrive on its barriers.
    if cluster > 1 {
        thread::sync_cluster()
    } else {
        thread::sync_block()
    }

    let k_blocks = p.k / BLOCK_K;
    // The schedule's unit is one cluster: `cluster` consecutive M (or N) tiles. Each role makes it
    // after its `setmaxnreg` (ptxas spills values live across that instruction).
    let schedule = || {
        TileScheduler::new(
            p.m,
            p.n,
            p.l * p.split_k,
            block_m * shape.m,
            tile.block_n * shape.n,
            p.group_m,
            thread::block_x() / cluster,
            thread::grid_dim_x() / cluster,
        )
    };

    if wg == 0 {
        thread::lower_registers::<PREGS>();
        let mut tiles = schedule();
        if tid == 0 {
            let b_rows = tile.block_n / shape.m;
            let all = ((1u32 << cluster) - 1) as u16;
            let mut it = 0u32;
            while let Some(t) = tiles.next() {
                let own = shape.tile(t, rank);
                let m_tile = own.m;
                let (l, kbs) = k_range(t.l, p.split_k, k_blocks);
                for kb in kbs {
                    let s = pipe.stage(it);
                    // (The host keeps the scale count below 2³², so the index is 32-bit.)
                    let sfa = p.sfa + 4 * ((l * k_blocks + kb) * p.m_pad + m_tile * block_m) as u64;
                    // SAFETY: the stage is free in every CTA we write into after `producer_acquire`
                    // (every CTA's consumers release to our empty barrier); the boxes and the scale
                    // copy fit the stage's buffers; the maps and `sfa` (padded to whole clusters of
                    // the tallest tiles) cover these coordinates; TMA zero-fills rows past M or N.
                    unsafe {
                        pipe.producer_acquire(it);
                        let full = pipe.producer_expect(it, tile.stage_bytes());
                        let (x, l) = ((kb * BLOCK_K) as i32, l as i32);
                        let a_box = tile.a_box_rows(shape.n);
                        for w in 0..block_m / a_box {
                            let (dst, y) = (
                                layout.a(s) + w * a_box * ROW_BYTES,
                                (m_tile * block_m + w * a_box) as i32,
                            );
                            if shape.n == 1 {
                                tma::load_3d(dst, p.tmap_a, x, y, l, full);
                            } else if w % shape.n == rank {
                                // Our box (wave) of the shared A tile, into every CTA of the
                                // cluster.
                                tma::load_3d_multicast(dst, p.tmap_a, x, y, l, full, all);
                            }
                        }
                        // Along M: our share of the shared B tile, into every CTA of the cluster.
                        let share = if shape.m > 1 { rank } else { 0 };
                        let b_dst = layout.b(s) + share * b_rows * ROW_BYTES;
                        let b_y = (own.n * tile.block_n + share * b_rows) as i32;
                        if shape.m > 1 {
                            tma::load_3d_multicast(b_dst, p.tmap_b, x, b_y, l, full, all);
                        } else {
                            tma::load_3d(b_dst, p.tmap_b, x, b_y, l, full);
                        }
                        tma::load_bytes(layout.sfa(s), sfa, tile.sfa_bytes(), full);
                    }
                    it += 1;
                }
            }
        }
    } else {
        consume::<CONS, WAVES, CREGS, F, T>(
            &p,
            &pipe,
            layout,
            schedule,
            wg - 1,
            tid % 128,
            shape,
            rank,
            k_blocks,
        );
    }
    // This CTA's work is issued: a dependent launch (the split-K reduction) may start being
    // scheduled; it waits for this grid's writes itself.
    thread::launch_dependents();
    // No CTA may leave while a peer can still multicast into it or arrive on its barriers.
    if cluster > 1 {
        thread::sync_cluster();
    }
}

/// The batch entry and the K blocks of scheduled batch index `t_l`: with split-K the schedule
/// runs over `l · split` entries and entry `l·split + s` takes the `s`-th of `split` near-equal
/// ranges of K blocks (its output goes to workspace entry `t_l`).
#[inline(always)]
fn k_range(t_l: u32, split: u32, k_blocks: u32) -> (u32, core::ops::Range<u32>) {
    if split <= 1 {
        return (t_l, 0..k_blocks);
    }
    let s = t_l % split;
    (
        t_l / split,
        s * k_blocks / split..(s + 1) * k_blocks / split,
    )
}

/// The consumer warpgroups' part of the kernel.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn consume<const CONS: u32, const WAVES: usize, const CREGS: u32, F: Fragment, T: Fp8Pair>(
    p: &Sm90Fp8Params,
    pipe: &Pipeline,
    layout: StageLayout,
    schedule: impl FnOnce() -> TileScheduler,
    c: u32,
    local: u32,
    shape: ClusterShape,
    rank: u32,
    k_blocks: u32,
) {
    thread::raise_registers::<CREGS>();
    let mut tiles = schedule();
    let (warp, lane) = (local / 32, local % 32);
    // This thread's first row within each wave (accumulator fragment layout; the second is +8).
    let row = c * WG_ROWS + 16 * warp + lane / 4;
    // B-scale blocks along N (128 columns each; a 64-column tile lies inside one).
    let n_blocks = p.n.div_ceil(BLOCK_N);
    let block_n = layout.tile.block_n;
    let block_m = layout.tile.block_m();
    let consumer = Consumer::<CONS> {
        pipe: *pipe,
        layout,
        turn: Turn::new(c),
        c,
        row,
        rank,
    };
    let mut it = 0u32;
    while let Some(t) = tiles.next() {
        let own = shape.tile(t, rank);
        let m_tile = own.m;
        let (l, kbs) = k_range(t.l, p.split_k, k_blocks);
        // A cluster along N may hang past N by one tile: its output is clipped, and its B scales
        // are read from the last real tile (not past the buffer).
        let sfb_tile = (own.n * block_n / BLOCK_N).min(n_blocks - 1);
        let sfb =
            (p.sfb as *const f32).wrapping_add(((l * n_blocks + sfb_tile) * k_blocks) as usize);
        let mut acc = [F::zeros(); WAVES];
        let mut kb = kbs.start;
        while kb < kbs.end {
            // SAFETY: `it` counts this consumer's stages in order; each is waited for, used by
            // every wave and released before the next; `kb + 1` is in range for a pair.
            unsafe {
                if CONS == 2 && WAVES == 1 && kb + 1 < kbs.end {
                    consumer.k_pair::<F, T>(&mut acc[0], it, sfb.add(kb as usize));
                    (kb, it) = (kb + 2, it + 2);
                } else {
                    consumer.k_block::<WAVES, F, T>(&mut acc, it, sfb.add(kb as usize));
                    (kb, it) = (kb + 1, it + 1);
                }
            }
        }
        if p.sfb_col != 0 {
            // SAFETY: `sfb_col` holds `l · n` scales; columns are clamped to n − 1 (past N the
            // values are never stored).
            unsafe {
                scale_columns(
                    &mut acc,
                    p.sfb_col,
                    l as usize * p.n as usize,
                    own.n * block_n,
                    p.n,
                    lane,
                )
            };
        }
        let m0 = m_tile * block_m;
        if p.tmap_c != 0 {
            // Through shared memory and TMA stores: the warpgroup goes on to the next tile's MMAs
            // while the output drains (the direct stores below stall it on DRAM).
            // This warpgroup only (named barrier 1 + c; 0 is the block's, 4–6 the turns').
            let sync_wg = || match c {
                0 => thread::named_barrier::<1>(128),
                1 => thread::named_barrier::<2>(128),
                _ => thread::named_barrier::<3>(128),
            };
            if local == 0 {
                // The previous tile's stores have read the buffer.
                tma::wait_read::<0>();
            }
            sync_wg();
            let bf16 = p.out_type == OutType::Bf16 as u32;
            // This thread's first row in the boxes; 128-byte swizzle: chunk j of row r is at
            // chunk j ^ (r % 8), and r % 8 = lane / 4 for every row this thread writes.
            let r = 16 * warp + lane / 4;
            let base =
                smem::opaque(layout.c(0, c, 0) + r * ROW_BYTES + 16 * (lane / 4) + 4 * (lane % 4));
            for (w, acc) in acc.iter().enumerate() {
                // One conversion per path (a runtime choice per value doubles the live registers).
                if bf16 {
                    stage_tile::<true, F>(base, w as u32 * CONS, acc);
                } else {
                    stage_tile::<false, F>(base, w as u32 * CONS, acc);
                }
            }
            smem::fence_async_proxy();
            sync_wg();
            if local == 0 {
                for w in 0..WAVES as u32 {
                    for h in 0..block_n / C_BOX_N {
                        let wave_m = layout.tile.wave_m();
                        let (x, y) = (own.n * block_n + h * C_BOX_N, m0 + w * wave_m + c * WG_ROWS);
                        // SAFETY: the boxes were written and fenced by the whole warpgroup (the
                        // barrier above); the map covers the output, TMA clips rows past M and
                        // columns past N.
                        unsafe {
                            tma::store_3d(
                                p.tmap_c,
                                x as i32,
                                y as i32,
                                t.l as i32,
                                layout.c(w, c, h),
                            )
                        };
                    }
                }
                tma::commit();
            }
        } else {
            for (w, acc) in acc.iter().enumerate() {
                store_tile(
                    p,
                    t.l,
                    m0 + w as u32 * layout.tile.wave_m() + row,
                    own.n * block_n + 2 * (lane % 4),
                    acc,
                );
            }
        }
    }
    if WAVES == 1 && it > 0 {
        // (Both consumers ran the same tiles, so they agree on whether there was a batch.)
        consumer.turn.finish();
    }
    if p.tmap_c != 0 && local == 0 {
        // Shared memory must outlive the last stores' reads.
        tma::wait::<0>();
    }
}

/// Multiplies each accumulator by its column's scale `cols[batch + col]` (B scaled per row,
/// constant over K, so it factors out of the sum): value `i` is in column
/// `n0 + 8·(i/4) + 2·(lane%4) + i%2`.
/// # Safety
/// `cols` holds at least `batch + n` f32; `n` ≥ 1.
#[inline(always)]
unsafe fn scale_columns<const WAVES: usize, F: Fragment>(
    acc: &mut [F; WAVES],
    cols: u64,
    batch: usize,
    n0: u32,
    n: u32,
    lane: u32,
) {
    let cols = (cols as *const f32).wrapping_add(batch);
    for j in 0..F::N / 4 {
        let col = n0 + 8 * (j / 2) + 2 * (lane % 4);
        // SAFETY: the caller's contract; both columns are clamped into [0, n).
        let (s0, s1) = unsafe {
            (
                *cols.add(col.min(n - 1) as usize),
                *cols.add((col + 1).min(n - 1) as usize),
            )
        };
        for acc in acc.iter_mut() {
            let acc = acc.as_mut();
            acc[2 * j as usize] *= s0;
            acc[2 * j as usize + 1] *= s1;
        }
    }
}

/// Writes one thread's accumulators as 16-bit values into its warpgroup's output boxes of a wave
/// whose first boxes follow `consumers` consumers' boxes (N / 64 each): value `i` at row
/// `16·warp + lane/4 + 8·((i/2)%2)`, column `8·(i/4) + 2·(lane%4) + i%2`.
/// `base` is the thread's address of chunk 0 of its first row in wave 0's first box, with the
/// swizzle term `16·(lane/4)` added (bits 4–6 of the address, which nothing else sets): chunk `j`
/// is then at `base ^ 16·j`. The 128-byte swizzle is what the TMA store reads, and it spreads a
/// warp's 8 rows over all 32 banks (no conflicts).
#[inline(always)]
fn stage_tile<const BF16: bool, F: Fragment>(base: u32, consumers: u32, acc: &F) {
    // A wave's boxes follow the consumers' boxes of the waves before it.
    let wave = consumers * (F::N / C_BOX_N) * WG_ROWS * ROW_BYTES;
    let acc = acc.as_ref();
    for j in 0..F::N / 4 {
        let i = 2 * j as usize;
        let chunk = (j / 2) % 8; // 16-byte chunk of the 128-byte box row
        let h = j / 16; // which 64-column box
        let addr = (base ^ (16 * chunk)) + wave + h * WG_ROWS * ROW_BYTES + 8 * (j % 2) * ROW_BYTES;
        let pair = if BF16 {
            convert::f32x2_to_bf16x2(acc[i], acc[i + 1])
        } else {
            convert::f32x2_to_f16x2(acc[i], acc[i + 1])
        };
        // SAFETY: inside this warpgroup's boxes (row < 64, chunk < 8, lane % 4 < 4).
        unsafe { smem::store_u32(addr, pair) };
    }
}

/// One consumer warpgroup's view of the pipeline.
struct Consumer<const CONS: u32> {
    pipe: Pipeline,
    layout: StageLayout,
    /// The two consumers issue their MMA batches in turn.
    turn: Turn<CONS>,
    /// Consumer index (which 64 rows of each wave).
    c: u32,
    /// This thread's first row in each wave (the second is `row + 8`).
    row: u32,
    /// This CTA's rank in its cluster.
    rank: u32,
}

impl<const CONS: u32> Consumer<CONS> {
    /// Waits for stage `it`; for each wave issues its four `wgmma` into the scratch accumulator,
    /// waits for them and promotes the partial sums into the wave's accumulator; releases the stage.
    /// With two waves there are no registers for a second scratch, but ptxas starts wave 1's MMAs
    /// under wave 0's promotion by itself; 128-row tiles use [`Consumer::k_pair`] instead where
    /// two K blocks remain.
    /// # Safety
    /// Stages are used in order; `sfb` points at this K block's B scale.
    #[inline(always)]
    unsafe fn k_block<const WAVES: usize, F: Fragment, T: Fp8Pair>(
        &self,
        acc: &mut [F; WAVES],
        it: u32,
        sfb: *const f32,
    ) {
        let s = self.pipe.stage(it);
        // SAFETY: the caller's contract; the stage (tiles and scales) is filled after
        // `consumer_wait`; rows < block_m.
        unsafe {
            // A global load whose latency hides behind the wait and the first MMAs.
            let scale_b = *sfb;
            self.pipe.consumer_wait(it);
            for (w, acc) in acc.iter_mut().enumerate() {
                let w = w as u32;
                // One-wave tiles: the consumers' batches rotate (+6% at 8192³). Not with two
                // waves: there ptxas already starts wave 1's MMAs under wave 0's promotion, and
                // the turn's barrier between them made it 2–3% slower (docs/PERF.md, v9).
                // 256-row tiles: only the very first batch is ordered (consumer 1 waits for
                // consumer 0's), a one-time stagger that keeps their promotions apart (+1%).
                let stagger = WAVES > 1 && it == 0 && w == 0;
                if WAVES == 1 || (stagger && self.c == 1) {
                    self.turn.wait(it == 0);
                }
                let mut part = self.issue::<F, T>(s, w);
                if WAVES == 1 || (stagger && self.c == 0) {
                    self.turn.pass();
                }
                let (f0, f1) = self.scales(s, w, scale_b);
                wgmma::wait::<0>();
                part.fence();
                promote(acc, &part, f0, f1);
            }
            // This thread has read the stage (its MMAs completed, its scales loaded): release it.
            // (ptxas hoists the arrival above the last wave's promotion, which reads registers only.)
            self.pipe.consumer_release(it, self.rank);
        }
    }

    /// 128-row tiles, two K blocks at once: issues stage `it`'s four MMAs into one scratch
    /// accumulator and stage `it + 1`'s into a second, then promotes the first while the second
    /// runs, and the second while the other consumer's MMAs run. (One K block at a time, the
    /// tensor cores wait for every promotion of both consumers; a third scratch does not fit.)
    /// # Safety
    /// As [`Consumer::k_block`], for stages `it` and `it + 1`; `sfb` points at the first's B scale.
    #[inline(always)]
    unsafe fn k_pair<F: Fragment, T: Fp8Pair>(&self, acc: &mut F, it: u32, sfb: *const f32) {
        let (s0, s1) = (self.pipe.stage(it), self.pipe.stage(it + 1));
        // SAFETY: the caller's contract; each stage is read only after its `consumer_wait` and
        // released after its MMAs completed and its scales were loaded.
        unsafe {
            let (sb0, sb1) = (*sfb, *sfb.add(1));
            self.pipe.consumer_wait(it);
            self.turn.wait(it == 0);
            let mut part0 = self.issue::<F, T>(s0, 0);
            self.pipe.consumer_wait(it + 1);
            let mut part1 = self.issue::<F, T>(s1, 0);
            self.turn.pass();
            let (f00, f01) = self.scales(s0, 0, sb0);
            let (f10, f11) = self.scales(s1, 0, sb1);
            wgmma::wait::<1>();
            part0.fence();
            self.pipe.consumer_release(it, self.rank);
            promote(acc, &part0, f00, f01);
            wgmma::wait::<0>();
            part1.fence();
            self.pipe.consumer_release(it + 1, self.rank);
            promote(acc, &part1, f10, f11);
        }
    }

    /// The four `wgmma m64nNk32` of stage `s`, wave `w`, into a fresh scratch accumulator,
    /// committed as one group.
    /// # Safety
    /// Stage `s` is filled (its full barrier waited for).
    #[inline(always)]
    unsafe fn issue<F: Fragment, T: Fp8Pair>(&self, s: u32, w: u32) -> F {
        wgmma::fence();
        // SAFETY: the caller's contract.
        unsafe {
            let mut part = F::first::<T>(
                self.layout.a_desc(s, w, self.c, 0),
                self.layout.b_desc(s, 0),
            );
            for kk in 1..BLOCK_K / MMA_K {
                part.acc::<T>(
                    self.layout.a_desc(s, w, self.c, kk),
                    self.layout.b_desc(s, kk),
                );
            }
            wgmma::commit();
            part
        }
    }

    /// This thread's two promotion factors for stage `s`, wave `w`: its rows' A scales ×
    /// `scale_b`.
    /// # Safety
    /// Stage `s` is filled.
    #[inline(always)]
    unsafe fn scales(&self, s: u32, w: u32, scale_b: f32) -> (f32, f32) {
        let (sfa, r) = (self.layout.sfa(s), w * self.layout.tile.wave_m() + self.row);
        // SAFETY: the caller's contract; rows < block_m.
        let (sa0, sa1) = unsafe {
            (
                f32::from_bits(smem::load_u32(sfa + 4 * r)),
                f32::from_bits(smem::load_u32(sfa + 4 * (r + 8))),
            )
        };
        (sa0 * scale_b, sa1 * scale_b)
    }
}
/// Promotion: `acc += part · f`, with `f0` for the thread's first row and `f1` for its second
/// (fragment value `i` is in row `+8·((i/2)%2)`). Fused (one FFMA, not FMUL + FADD: Rust never
/// contracts `a * b + c`; the promotion sits on each warpgroup's critical path between its MMA
/// batches).
#[inline(always)]
fn promote<F: Fragment>(acc: &mut F, part: &F, f0: f32, f1: f32) {
    let (sums, part) = (acc.as_mut(), part.as_ref());
    for i in 0..(F::N / 2) as usize {
        let f = if (i / 2) % 2 == 0 { f0 } else { f1 };
        sums[i] = core::f32::math::mul_add(part[i], f, sums[i]);
    }
    // Pins the sums here: LLVM otherwise sinks them to the loop latch (their only use is the
    // next K block), past the next wave's MMAs, and that wave's scratch then no longer fits
    // beside them (ptxas spilled 144 bytes).
    acc.fence();
}

/// Writes one thread's 64 accumulators: value `i` at row `row0 + 8·((i/2)%2)`, column
/// `col0 + 8·(i/4) + (i%2)`. Adjacent column pairs go out as one 4-byte (16-bit types) or 8-byte
/// (f32) store when N is even (then the pair is aligned), else as two stores; elements past M or N
/// are masked by predicates, not branches (see `ptx::global`).
#[inline(always)]
fn store_tile<F: Fragment>(p: &Sm90Fp8Params, l: u32, row0: u32, col0: u32, acc: &F) {
    let out_type = p.out_type;
    let pairs = p.n % 2 == 0;
    let bytes = if out_type == OutType::F32 as u32 {
        4u64
    } else {
        2
    };
    let acc = acc.as_ref();
    for j in 0..F::N / 4 {
        let i = (2 * j) as usize;
        let row = row0 + 8 * ((i / 2) % 2) as u32;
        let col = col0 + 8 * (i / 4) as u32;
        let (in0, in1) = (row < p.m && col < p.n, row < p.m && col + 1 < p.n);
        let idx = (l as u64 * p.m as u64 + row as u64) * p.n as u64 + col as u64;
        let addr = p.out + idx * bytes;
        let (v0, v1) = (acc[i], acc[i + 1]);
        // SAFETY: each store's predicate says its element is inside the L·M·N output; a pair store
        // is used only when N is even, so `idx` is even and the address is aligned to the pair.
        unsafe {
            if out_type == OutType::F32 as u32 {
                global::store_u32x2_if(addr, v0.to_bits(), v1.to_bits(), pairs && in1);
                global::store_u32_if(addr, v0.to_bits(), !pairs && in0);
                global::store_u32_if(addr + 4, v1.to_bits(), !pairs && in1);
            } else {
                let bf16 = out_type == OutType::Bf16 as u32;
                let cvt = |v| {
                    if bf16 {
                        convert::f32_to_bf16(v)
                    } else {
                        convert::f32_to_f16(v)
                    }
                };
                let (h0, h1) = (cvt(v0), cvt(v1));
                global::store_u32_if(addr, h0 as u32 | (h1 as u32) << 16, pairs && in1);
                global::store_u16_if(addr, h0, !pairs && in0);
                global::store_u16_if(addr + 2, h1, !pairs && in1);
            }
        }
    }
}
