//! The Hopper FP8 block-scaled GEMM family: its tile shapes, its parameters and its one kernel
//! list. Host and device share this module; the kernel bodies are [`fp8`] and, for the swapped
//! decode tiles, [`fp8_swapped`] (sm_90a only).
//!
//! Hardware facts behind the numbers: a 128-byte swizzled TMA box row is 128 e4m3 = one 1×128
//! scale block of K; `wgmma` m64nNk32 gives each consumer warpgroup 64 rows, so one *wave* of the
//! consumers covers 64 rows per consumer; [`BLOCK_N`] = 128 is one 128×128 scale block of B. A
//! tile is 2 consumers × 1 or 2 waves, or 3 consumers × 1 wave, by 128 or 64 columns, or 2
//! consumers × 1 wave by 144, 160 or 192 columns (wide: across two B-scale blocks), or at
//! decode sizes 16, 32 or 64 rows by 128 columns computed swapped ([`Tile`]);
//! the stages are as many as fit the 227 KiB a block may have ([`crate::gemm::layout`]).

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
pub mod fp8;
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
pub mod fp8_swapped;

mod schedule;

use crate::format::ElemType;
use crate::format::ElemType::{E4M3, E5M2};
use crate::gemm::Mode::{Dense, Fused, FusedInRegisters, FusedInRegistersMx, Grouped, Sparse};
use crate::gemm::layout::{ScaleBox, StageContents, StageLayout, fused_out};
use crate::gemm::scheduler::MAX_CLUSTER;
use crate::kernel_info::KernelInfo;
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
use crate::ptx::wgmma::Fp8;

/// Columns of one 128×128 B-scale block, and of the widest tile.
pub const BLOCK_N: u32 = 128;
/// K of one stage: one 1×128 A-scale block.
pub const BLOCK_K: u32 = 128;
/// Rows of one consumer warpgroup per wave: the M of `wgmma` m64nNk32.
pub const WG_ROWS: u32 = crate::gemm::layout::FRAGMENT_ROWS;
/// Bytes per row of a swizzled tile (the 128-byte swizzle span).
pub const ROW_BYTES: u32 = 128;
/// Registers of one SM, shared by the block's threads after `setmaxnreg`.
pub const SM_REGISTERS: u32 = 65_536;

/// The TMA box of A's f32 scales: 128 rows from any first row (160 rows with the alignment).
pub const SFA_BOX: ScaleBox = ScaleBox {
    entry: 4,
    tile_rows: 128,
};

/// Bytes per stage of the K block's B scales, which the producer thread copies from global memory
/// beside the tiles (`ptx::cp_async`: 4 bytes each; two f32 as wide tiles straddle two
/// 128-column scale blocks), so that the consumers read them from shared memory after the
/// stage's wait instead of loading them from global memory a K block ahead (an address
/// computation and a global load per K block in the consumers' loop, where both warpgroups issue
/// every instruction, and a load's latency at the start of every unit).
pub const B_SCALE_BYTES: u32 = 8;

/// One tile shape: `consumers` warpgroups × 64 rows × `waves` of A by `block_n` columns of B;
/// or, swapped ([`Tile::swapped`]), `rows` rows of A by 128 columns of B computed as Cᵀ = B·Aᵀ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tile {
    /// Consumer warpgroups (2 or 3), each 64 rows of every wave (swapped: 64 rows of B each).
    pub consumers: u32,
    /// Waves (1 or 2): each costs a consumer thread 64 fp32 sums (plus 64 scratch shared by the
    /// waves), so 2 waves need ≈ 200 of 224 registers; 3 would not fit.
    pub waves: u32,
    /// Columns: 128 (one 128×128 B-scale block), 64 (half of one: twice the tiles where too
    /// few 128-column tiles leave SMs idle), or 144, 160, 192 ([`Tile::is_wide`]).
    pub block_n: u32,
    /// Swapped tiles: rows of A (and of C) per tile, the N of `wgmma` (16, 32 or 64); 0 for the
    /// others. At decode sizes (M ≤ 64) B, the weights, is what the SMs wait for: swapped, B is
    /// `wgmma`'s 64-row side, so a stage holds 128 rows of B (16 KiB) and only `rows` of A,
    /// instead of 64 or 128 rows of B beside 128 rows of A that are mostly past M.
    pub rows: u32,
}

impl Tile {
    pub const fn new(consumers: u32, waves: u32, block_n: u32) -> Tile {
        Tile {
            consumers,
            waves,
            block_n,
            rows: 0,
        }
    }
    /// The swapped tile of `rows` rows of A by 128 of B: two consumers, each `wgmma`
    /// m64n`rows`k32 over its 64 rows of B (one 128×128 B-scale block for the tile).
    pub const fn swapped(rows: u32) -> Tile {
        Tile {
            consumers: 2,
            waves: 1,
            block_n: BLOCK_N,
            rows,
        }
    }
    pub const M128: Tile = Tile::new(2, 1, 128);
    pub const M256: Tile = Tile::new(2, 2, 128);
    /// Three consumers, one wave: while one promotes, the other two have batches queued (with
    /// two, only one), at L2 bytes per FLOP between the 128- and 256-row tiles.
    pub const M192: Tile = Tile::new(3, 1, 128);
    /// 128 × 64: `wgmma` m64n64k32.
    pub const M128N64: Tile = Tile::new(2, 1, 64);
    /// Wide tiles, 128 × 144, 160 or 192 (`wgmma` m64nNk32, [`Tile::is_wide`]): more columns per
    /// row of A than 128 cuts the shared-memory bytes per FLOP (B is read once per 64 rows, A
    /// once per N columns), and their widths fill the SMs' rounds where 128-column tiles leave a
    /// ragged last round (4096 × 2112: 3 rounds of 128 × 192 for 5 of 128 × 128).
    pub const M128N144: Tile = Tile::new(2, 1, 144);
    pub const M128N160: Tile = Tile::new(2, 1, 160);
    pub const M128N192: Tile = Tile::new(2, 1, 192);
    /// Swapped 16 × 128, 32 × 128 and 64 × 128 (decode sizes).
    pub const S16: Tile = Tile::swapped(16);
    pub const S32: Tile = Tile::swapped(32);
    pub const S64: Tile = Tile::swapped(64);
    pub const ALL: [Tile; 10] = [
        Tile::M128,
        Tile::M256,
        Tile::M192,
        Tile::M128N64,
        Tile::M128N144,
        Tile::M128N160,
        Tile::M128N192,
        Tile::S16,
        Tile::S32,
        Tile::S64,
    ];

    /// Whether the tile computes Cᵀ = B·Aᵀ ([`Tile::rows`]).
    pub const fn is_swapped(self) -> bool {
        self.rows != 0
    }
    /// Whether the tile is wider than one 128-column B-scale block: its columns straddle two of
    /// them (at most two: N − 128 divides 128 or N for the widths there are, so a tile starting
    /// at any multiple of N ends within the next block), and each consumer thread holds N/2 sums
    /// and one N/2 scratch.
    pub const fn is_wide(self) -> bool {
        !self.is_swapped() && self.block_n > BLOCK_N
    }
    /// Rows one wave of the consumers covers.
    pub const fn wave_m(self) -> u32 {
        WG_ROWS * self.consumers
    }
    /// Rows of A (and of C) per tile.
    pub const fn block_m(self) -> u32 {
        if self.is_swapped() {
            self.rows
        } else {
            self.wave_m() * self.waves
        }
    }
    /// How many of its waves consumer `c` computes in a tile whose first row is `first_row`,
    /// of a group whose rows end at `row_end`: those whose 64 rows of the consumer
    /// (`first_row + w · wave_m + c · 64 ..`) reach into the group. A wave wholly past it is
    /// never stored, so not computed (grouped tiles of several waves, a group's last tile).
    pub const fn live_waves(self, first_row: u32, row_end: u32, c: u32) -> u32 {
        let rows = row_end.saturating_sub(first_row + c * WG_ROWS);
        let waves = rows.div_ceil(self.wave_m());
        if waves < self.waves {
            waves
        } else {
            self.waves
        }
    }
    /// One producer warpgroup and the consumers.
    pub const fn threads(self) -> u32 {
        128 * (1 + self.consumers)
    }
    /// Register budgets after `setmaxnreg` (multiples of 8, 24..=256) within the launch's
    /// (`gemm::launch_regs`): two consumers 128·(56 + 2·224) — 128 sums + 64 scratch +
    /// addressing for the 256-row tile; wide tiles 128·(40 + 2·232) — 96 sums + 96 scratch +
    /// addressing at 192 columns; three consumers 128·(32 + 3·160) — 64 sums + 64 scratch +
    /// addressing. The consumers' budgets are the largest at which ptxas spills nothing in their
    /// K loops; the producer's warpgroup takes what they leave (its thread walks the schedule,
    /// grouped GEMM's groups included, and issues the copies).
    pub const fn producer_regs(self) -> u32 {
        crate::gemm::regs_left(self.consumers, self.consumer_regs())
    }
    pub const fn consumer_regs(self) -> u32 {
        if self.is_wide() {
            232
        } else if self.consumers == 2 {
            224
        } else {
            160
        }
    }
    /// Rows of one TMA box of A for clusters of `cluster_n` along N: a wave (128), or one
    /// consumer's 64 rows for three consumers, and for one-wave tiles shared along N (each CTA of
    /// the pair loads every other box and multicasts it). The host encodes a map for each size.
    pub const fn a_box_rows(self, cluster_n: u32) -> u32 {
        if self.is_swapped() {
            self.rows
        } else if self.consumers == 2 && (cluster_n == 1 || self.waves > 1) {
            2 * WG_ROWS
        } else {
            WG_ROWS
        }
    }
    /// The shared memory of one stage (A tile, B tile, one f32 A scale per row) and the 16-bit
    /// output tile staged for its TMA store, as many stages as fit: 5 for 128-row tiles, 3 for
    /// 256-row ones, 4 for 192-row ones, 8 for 128 × 64; swapped tiles store directly (their
    /// fragments are Cᵀ) and have 12, 10 and 9 stages of 16 KiB of B.
    pub const fn layout(self) -> StageLayout {
        StageLayout::fit(StageContents {
            a: self.block_m() * ROW_BYTES,
            b: self.block_n * ROW_BYTES,
            sfa: self.sfa_boxes() * SFA_BOX.bytes(),
            words: if self.is_swapped() { 0 } else { B_SCALE_BYTES },
            out: if self.is_swapped() {
                0
            } else {
                self.block_m() * self.block_n * 2
            },
        })
    }
    /// The layout of the tile's fused-epilogue kernel ([`Mode::Fused`]): the stages, with the
    /// fused epilogue's f32 rows and hand-over ([`fused_out`]) in place of the 16-bit output staging:
    /// 4 stages for the 128 × 128 tile.
    pub const fn fused_layout(self) -> StageLayout {
        StageLayout::fit(StageContents {
            out: fused_out(self.consumers, self.block_n),
            ..self.layout().contents
        })
    }
    /// The consumers' budget in a kernel with `finishers` finishing warps (`gemm::fuse`): 184
    /// for its one-wave tile, whose consumers then hold 64 sums and one 64-value scratch
    /// fragment (the fused kernel runs one K block at a time, not the two-fragment pairs), so
    /// that the producer's warpgroup, whose warps 1–3 finish, gets the rest (136).
    pub const fn consumer_regs_with(self, finishers: u32) -> u32 {
        if finishers > 0 && self.waves == 1 {
            184
        } else {
            self.consumer_regs()
        }
    }
    /// The producer warpgroup's budget beside [`Self::consumer_regs_with`]: with finishers, all
    /// the consumers leave ([`crate::gemm::producer_budget`]).
    pub const fn producer_regs_with(self, finishers: u32) -> u32 {
        crate::gemm::producer_budget(
            self.producer_regs(),
            self.consumers,
            self.consumer_regs_with(finishers),
            finishers,
        )
    }
    /// A-scale boxes per stage ([`SFA_BOX`]): one per 128 rows.
    pub const fn sfa_boxes(self) -> u32 {
        self.block_m().div_ceil(SFA_BOX.tile_rows)
    }
    pub const fn stages(self) -> u32 {
        self.layout().stages
    }
    pub const fn smem_bytes(self) -> u32 {
        self.layout().bytes()
    }
}

const _: () = {
    assert!(Tile::M128.stages() == 5 && Tile::M256.stages() == 3 && Tile::M192.stages() == 4);
    assert!(Tile::M128N64.stages() == 8);
    assert!(Tile::M128N144.stages() == 5 && Tile::M128N160.stages() == 5);
    assert!(Tile::M128N192.stages() == 4);
    assert!(Tile::M128.fused_layout().stages == 4);
    assert!(Tile::S16.stages() == 12 && Tile::S32.stages() == 10 && Tile::S64.stages() == 9);
    let mut i = 0;
    while i < Tile::ALL.len() {
        let t = Tile::ALL[i];
        assert!(128 * (t.producer_regs() + t.consumers * t.consumer_regs()) <= SM_REGISTERS);
        assert!(t.consumers <= crate::gemm::barriers::MAX_CONSUMERS);
        // Whole 1024-byte blocks per stage tile (the 128-byte swizzle's alignment).
        let c = t.layout().contents;
        assert!(c.a.is_multiple_of(1024) && c.b.is_multiple_of(1024));
        i += 1;
    }
};

/// The A-scale padding (`m_pad`) for `rows` rows: whole clusters of every tile height (the rows
/// the fold pre-pass writes); a multiple of 4, so that each K block's scales are a whole number
/// of 16 bytes, as the scale map's stride must be (the map zero-fills past `m_pad`).
pub const fn m_pad(rows: u32) -> u32 {
    let mut pad = rows;
    let mut i = 0;
    while i < Tile::ALL.len() {
        let unit = Tile::ALL[i].block_m() * MAX_CLUSTER;
        if rows.next_multiple_of(unit) > pad {
            pad = rows.next_multiple_of(unit);
        }
        i += 1;
    }
    pad.next_multiple_of(4)
}

/// Parameters of the sm90 FP8 GEMM. Tensor maps live in device memory (64-byte aligned; see
/// `ptx::tma`); `tmap_b`'s box is BLOCK_N / `cluster_m` rows (each CTA of a cluster loads its
/// share). `tmap_sfa` maps the A scales, f32 `[l][k/128][m_pad]` (M contiguous; 3-D: m_pad,
/// k/128, l) in boxes of [`SFA_BOX`] rows: a tile's scales start at any row (a grouped GEMM's
/// groups start mid-tile). `sfb`:
/// f32 `[l][⌈n/128⌉][k/128]`. `k` is a multiple of 128.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sm90Fp8Params {
    pub tmap_a: u64,
    pub tmap_b: u64,
    /// Tensor map of the output for TMA stores (N, M, L; box 64 × 64; 128-byte swizzle), or 0:
    /// direct stores (f32 output, or N % 8 ≠ 0 so rows are not 16-byte aligned).
    pub tmap_c: u64,
    pub tmap_sfa: u64,
    pub sfb: u64,
    /// Per-column scales of C (B scaled per row, constant over K): f32 `[l][n]`, multiplied in
    /// after the K loop; 0 when B's scales are all in `sfb`.
    pub sfb_col: u64,
    pub out: u64,
    /// With `split_k` > 1, where the K ranges meet (`crate::gemm::splitk`).
    pub splitk: crate::params::SplitKParams,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub l: u32,
    /// [`crate::params::OutType`] as u32.
    pub out_type: u32,
    /// Scheduler band height in M tiles (≥ 1).
    pub group_m: u32,
    /// K blocks are split into this many ranges (≥ 1); with more than one, the last CTA of each
    /// tile to finish its range adds the others' partial sums (`splitk`) and stores C.
    pub split_k: u32,
    /// CTAs per cluster along M (1 or [`MAX_CLUSTER`]): the CTAs of a cluster compute consecutive
    /// M tiles of one N tile and multicast halves of the shared B tile.
    pub cluster_m: u32,
    /// CTAs per cluster along N (1 or [`MAX_CLUSTER`], and then `cluster_m` = 1): the CTAs compute
    /// consecutive N tiles of one M tile, and CTA `r` loads the boxes `b` of the shared A tile
    /// with `b % cluster_n == r` into both (boxes of `Tile::a_box_rows(cluster_n)` rows).
    pub cluster_n: u32,
    pub _pad: u32,
    /// Grouped GEMM (split_k = 1): A (and C) rows per group, B's batch entry per group.
    pub groups: crate::params::GroupParams,
    /// Block-sparse GEMM ([`Mode::Sparse`] kernels; split_k = 1, l = 1, no groups): `tmap_b`
    /// maps the sparse operand's stored blocks (3-D: 128 bytes of K, 128 rows, stored blocks;
    /// boxes of `block_n / cluster_m` rows), `sfb` holds one f32 scale per stored block, and a
    /// unit's K blocks are the positions of its segment.
    pub sparse: crate::params::SparseParams,
}

pub use crate::gemm::Mode;

/// One kernel of the family: its tile, its element types, whether it runs grouped GEMM, and its
/// entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sm90Fp8Kernel {
    pub tile: Tile,
    pub a: ElemType,
    pub b: ElemType,
    pub mode: Mode,
    pub info: KernelInfo,
}

impl Sm90Fp8Kernel {
    /// The kernel's shared memory: its tile's layout ([`Tile::fused_layout`] for a fused kernel).
    pub const fn layout(&self) -> StageLayout {
        match self.mode {
            Mode::Fused => self.tile.fused_layout(),
            _ => self.tile.layout(),
        }
    }
    /// The row of the kernel `name`.
    pub const fn new(name: &'static str, tile: Tile, a: ElemType, b: ElemType, mode: Mode) -> Self {
        Sm90Fp8Kernel {
            tile,
            a,
            b,
            mode,
            info: KernelInfo::sm90(name, tile.threads()),
        }
    }
    /// Whether the kernel ends in the fused epilogue (its parameter a
    /// [`crate::params::FusedParams`]).
    pub const fn fused(&self) -> bool {
        matches!(
            self.mode,
            Mode::Fused | Mode::FusedInRegisters | Mode::FusedInRegistersMx
        )
    }
    /// Its finishing warps: the fused epilogue's in [`Mode::Fused`] (`gemm::epilogue::fuse`).
    pub const fn finishers(&self) -> u32 {
        if matches!(self.mode, Mode::Fused) {
            crate::gemm::FINISHERS
        } else {
            0
        }
    }
    /// The register budgets after `setmaxnreg` ([`Tile::producer_regs_with`]).
    pub const fn producer_regs(&self) -> u32 {
        self.tile.producer_regs_with(self.finishers())
    }
    pub const fn consumer_regs(&self) -> u32 {
        self.tile.consumer_regs_with(self.finishers())
    }
}

crate::entry::kernel_table! {
    /// # Safety
    /// Launched as [`crate::gemm::driver::run`] says for the tile, with parameters made from
    /// validated operands as [`Sm90Fp8Params`] describes (`k % 128 == 0`, `out` sized for the
    /// output or the split-K workspace; swapped tiles: `tmap_a`'s box `Tile::rows` rows, `tmap_c`
    /// 0, no groups; fused: the epilogue's buffers as [`crate::params::EpilogueParams`]
    /// describes).
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
    unsafe extern "ptx-kernel" fn |K| {
        gemm(Sm90Fp8Params) => fp8::Fp8Gemm<
            { K.tile.consumers },
            { K.tile.waves as usize },
            [f32; K.tile.block_n as usize / 2],
            Fp8<{ K.a as u32 }, { K.b as u32 }>,
            { K.mode as u32 },
        >;
        // The `wgmma` pair of a swapped tile is B's type, then A's.
        bare(Sm90Fp8Params) => fp8_swapped::Fp8SwappedGemm<
            [f32; K.tile.rows as usize / 2],
            Fp8<{ K.b as u32 }, { K.a as u32 }>,
        >;
    }

    /// Every dense kernel (the registry's rows): every tile × every pair of FP8 element types,
    /// each pair part of the `wgmma` instruction and so a kernel of its own.
    pub const KERNELS: &[Sm90Fp8Kernel] = Sm90Fp8Kernel::new [
        plain("sm90_fp8_blockscaled_gemm", Tile::M128, E4M3, E4M3, Dense),
        plain("sm90_fp8_blockscaled_gemm_e5m2_e5m2", Tile::M128, E5M2, E5M2, Dense),
        plain("sm90_fp8_blockscaled_gemm_e4m3_e5m2", Tile::M128, E4M3, E5M2, Dense),
        plain("sm90_fp8_blockscaled_gemm_e5m2_e4m3", Tile::M128, E5M2, E4M3, Dense),
        plain("sm90_fp8_blockscaled_gemm_m256", Tile::M256, E4M3, E4M3, Dense),
        plain("sm90_fp8_blockscaled_gemm_m256_e5m2_e5m2", Tile::M256, E5M2, E5M2, Dense),
        plain("sm90_fp8_blockscaled_gemm_m256_e4m3_e5m2", Tile::M256, E4M3, E5M2, Dense),
        plain("sm90_fp8_blockscaled_gemm_m256_e5m2_e4m3", Tile::M256, E5M2, E4M3, Dense),
        plain("sm90_fp8_blockscaled_gemm_m192", Tile::M192, E4M3, E4M3, Dense),
        plain("sm90_fp8_blockscaled_gemm_m192_e5m2_e5m2", Tile::M192, E5M2, E5M2, Dense),
        plain("sm90_fp8_blockscaled_gemm_m192_e4m3_e5m2", Tile::M192, E4M3, E5M2, Dense),
        plain("sm90_fp8_blockscaled_gemm_m192_e5m2_e4m3", Tile::M192, E5M2, E4M3, Dense),
        plain("sm90_fp8_blockscaled_gemm_n64", Tile::M128N64, E4M3, E4M3, Dense),
        plain("sm90_fp8_blockscaled_gemm_n64_e5m2_e5m2", Tile::M128N64, E5M2, E5M2, Dense),
        plain("sm90_fp8_blockscaled_gemm_n64_e4m3_e5m2", Tile::M128N64, E4M3, E5M2, Dense),
        plain("sm90_fp8_blockscaled_gemm_n64_e5m2_e4m3", Tile::M128N64, E5M2, E4M3, Dense),
        plain("sm90_fp8_blockscaled_gemm_n144", Tile::M128N144, E4M3, E4M3, Dense),
        plain("sm90_fp8_blockscaled_gemm_n144_e5m2_e5m2", Tile::M128N144, E5M2, E5M2, Dense),
        plain("sm90_fp8_blockscaled_gemm_n144_e4m3_e5m2", Tile::M128N144, E4M3, E5M2, Dense),
        plain("sm90_fp8_blockscaled_gemm_n144_e5m2_e4m3", Tile::M128N144, E5M2, E4M3, Dense),
        plain("sm90_fp8_blockscaled_gemm_n160", Tile::M128N160, E4M3, E4M3, Dense),
        plain("sm90_fp8_blockscaled_gemm_n160_e5m2_e5m2", Tile::M128N160, E5M2, E5M2, Dense),
        plain("sm90_fp8_blockscaled_gemm_n160_e4m3_e5m2", Tile::M128N160, E4M3, E5M2, Dense),
        plain("sm90_fp8_blockscaled_gemm_n160_e5m2_e4m3", Tile::M128N160, E5M2, E4M3, Dense),
        plain("sm90_fp8_blockscaled_gemm_n192", Tile::M128N192, E4M3, E4M3, Dense),
        plain("sm90_fp8_blockscaled_gemm_n192_e5m2_e5m2", Tile::M128N192, E5M2, E5M2, Dense),
        plain("sm90_fp8_blockscaled_gemm_n192_e4m3_e5m2", Tile::M128N192, E4M3, E5M2, Dense),
        plain("sm90_fp8_blockscaled_gemm_n192_e5m2_e4m3", Tile::M128N192, E5M2, E4M3, Dense),
        bare("sm90_fp8_blockscaled_gemm_s16", Tile::S16, E4M3, E4M3, Dense),
        bare("sm90_fp8_blockscaled_gemm_s16_e5m2_e5m2", Tile::S16, E5M2, E5M2, Dense),
        bare("sm90_fp8_blockscaled_gemm_s16_e4m3_e5m2", Tile::S16, E4M3, E5M2, Dense),
        bare("sm90_fp8_blockscaled_gemm_s16_e5m2_e4m3", Tile::S16, E5M2, E4M3, Dense),
        bare("sm90_fp8_blockscaled_gemm_s32", Tile::S32, E4M3, E4M3, Dense),
        bare("sm90_fp8_blockscaled_gemm_s32_e5m2_e5m2", Tile::S32, E5M2, E5M2, Dense),
        bare("sm90_fp8_blockscaled_gemm_s32_e4m3_e5m2", Tile::S32, E4M3, E5M2, Dense),
        bare("sm90_fp8_blockscaled_gemm_s32_e5m2_e4m3", Tile::S32, E5M2, E4M3, Dense),
        bare("sm90_fp8_blockscaled_gemm_s64", Tile::S64, E4M3, E4M3, Dense),
        bare("sm90_fp8_blockscaled_gemm_s64_e5m2_e5m2", Tile::S64, E5M2, E5M2, Dense),
        bare("sm90_fp8_blockscaled_gemm_s64_e4m3_e5m2", Tile::S64, E4M3, E5M2, Dense),
        bare("sm90_fp8_blockscaled_gemm_s64_e5m2_e4m3", Tile::S64, E5M2, E4M3, Dense),
    ];

    /// The grouped-GEMM kernels: the tiles its plan picks from (not the swapped or wide ones),
    /// e4m3 × e4m3.
    pub const GROUPED_KERNELS: &[Sm90Fp8Kernel] = Sm90Fp8Kernel::new [
        plain("sm90_fp8_blockscaled_grouped_gemm", Tile::M128, E4M3, E4M3, Grouped),
        plain("sm90_fp8_blockscaled_grouped_gemm_m256", Tile::M256, E4M3, E4M3, Grouped),
        plain("sm90_fp8_blockscaled_grouped_gemm_m192", Tile::M192, E4M3, E4M3, Grouped),
        plain("sm90_fp8_blockscaled_grouped_gemm_n64", Tile::M128N64, E4M3, E4M3, Grouped),
    ];

    /// The block-sparse kernels: tiles no wider than one 128-row block of the sparse operand (a
    /// tile's columns share one list of stored blocks), e4m3 × e4m3 (DeepSeek-style weights,
    /// pruned in 128 × 128 blocks, each block its own scale). Not the 256-row tile: with the
    /// segment walk its consumers spill (2.6 KiB at 224 registers), so tall M runs 128-row tiles
    /// in pairs along M.
    pub const SPARSE_KERNELS: &[Sm90Fp8Kernel] = Sm90Fp8Kernel::new [
        plain("sm90_fp8_blockscaled_bsr_gemm", Tile::M128, E4M3, E4M3, Sparse),
        plain("sm90_fp8_blockscaled_bsr_gemm_n64", Tile::M128N64, E4M3, E4M3, Sparse),
    ];

    /// The fused-epilogue kernels (`gemm::epilogue::fuse`): the 128 × 128 tile, its f32 rows
    /// staged in shared memory ([`Tile::fused_layout`]); one wave (with two, the second wave's
    /// fragment would be live while the first is finished); e4m3 × e4m3, what DeepSeek-style
    /// inference and the MX / NVFP4 operands folded onto FP8 run. Kernels of their own: in the
    /// dense kernels the epilogue's code made ptxas spill in the K loop.
    pub const FUSED_KERNELS: &[Sm90Fp8Kernel] = Sm90Fp8Kernel::new [
        fused("sm90_fp8_blockscaled_fused_gemm", Tile::M128, E4M3, E4M3, Fused),
    ];

    /// The fused epilogue in the consumers' registers (`gemm::epilogue::fuse::apply`): the
    /// epilogues without β·C, residual or SwiGLU, to any unquantized output or FP8 1×128 (MXFP8:
    /// [`FUSED_IN_REGISTERS_MX_KERNELS`]) — the dense kernel's layout, K loop and stores, with
    /// the steps applied to the fragments before them. One-wave tiles of 128 columns (a
    /// quantized output's 1×128 block is one tile's row): 128 and 192 rows. Not the 256-row
    /// tile: its consumers' two waves of sums and the epilogue spill in its K loop (about 900
    /// bytes).
    pub const FUSED_IN_REGISTERS_KERNELS: &[Sm90Fp8Kernel] = Sm90Fp8Kernel::new [
        fused("sm90_fp8_blockscaled_fused_regs_gemm", Tile::M128, E4M3, E4M3, FusedInRegisters),
        fused("sm90_fp8_blockscaled_fused_regs_gemm_m192", Tile::M192, E4M3, E4M3, FusedInRegisters),
    ];

    /// The same with MXFP8 output (`gemm::epilogue::fuse::quantize_fragment_mx`).
    pub const FUSED_IN_REGISTERS_MX_KERNELS: &[Sm90Fp8Kernel] = Sm90Fp8Kernel::new [
        fused("sm90_fp8_blockscaled_fused_regs_mx_gemm", Tile::M128, E4M3, E4M3, FusedInRegistersMx),
        fused("sm90_fp8_blockscaled_fused_regs_mx_gemm_m192", Tile::M192, E4M3, E4M3, FusedInRegistersMx),
    ];
}

/// Every list of the family's kernels, one per [`Mode`].
pub const LISTS: [&[Sm90Fp8Kernel]; 6] = [
    KERNELS,
    GROUPED_KERNELS,
    SPARSE_KERNELS,
    FUSED_KERNELS,
    FUSED_IN_REGISTERS_KERNELS,
    FUSED_IN_REGISTERS_MX_KERNELS,
];

/// The kernel for a tile, a pair of element types and a mode (swapped tiles: dense).
pub fn kernel(tile: Tile, a: ElemType, b: ElemType, mode: Mode) -> Option<&'static Sm90Fp8Kernel> {
    let list = match mode {
        Mode::Dense => KERNELS,
        Mode::Grouped => GROUPED_KERNELS,
        Mode::Sparse => SPARSE_KERNELS,
        Mode::Fused => FUSED_KERNELS,
        Mode::FusedInRegisters => FUSED_IN_REGISTERS_KERNELS,
        Mode::FusedInRegistersMx => FUSED_IN_REGISTERS_MX_KERNELS,
    };
    list.iter().find(|k| k.tile == tile && k.a == a && k.b == b)
}

/// Where the consumers can run a fused epilogue ([`crate::params::in_registers`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InRegisters {
    /// Not there: the kernel with finishing warps.
    No,
    /// In their registers, output unquantized or FP8 1×128.
    Yes,
    /// In their registers, MXFP8 output.
    Mx,
}

/// The fused-epilogue kernel for a tile and a pair of element types: the one that runs the
/// epilogue in the consumers' registers where the epilogue allows it (`regs`) and the tile has
/// one, else the one with finishing warps (`None`: neither; the mode the host launches and the
/// plans it accepts both come from here).
pub fn fused_kernel(
    tile: Tile,
    a: ElemType,
    b: ElemType,
    regs: InRegisters,
) -> Option<&'static Sm90Fp8Kernel> {
    let in_regs = match regs {
        InRegisters::No => None,
        InRegisters::Yes => kernel(tile, a, b, Mode::FusedInRegisters),
        InRegisters::Mx => kernel(tile, a, b, Mode::FusedInRegistersMx),
    };
    in_regs.or_else(|| kernel(tile, a, b, Mode::Fused))
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::format;
    use std::string::String;

    use super::*;

    /// A consumer computes wave `w` of a tile exactly when its 64 rows of it start inside the
    /// group: every offset of the group's end in the two-wave tile, and the one-wave tiles.
    #[test]
    fn a_consumer_computes_the_waves_whose_rows_start_inside_the_group() {
        for tile in [Tile::M256, Tile::M192, Tile::M128] {
            for first in [0u32, 300, 4096] {
                for rows in 0..=tile.block_m() + 70 {
                    let end = first + rows;
                    for c in 0..tile.consumers {
                        let want = (0..tile.waves)
                            .filter(|w| first + w * tile.wave_m() + c * WG_ROWS < end)
                            .count() as u32;
                        assert_eq!(
                            tile.live_waves(first, end, c),
                            want,
                            "{tile:?} rows {rows} consumer {c}"
                        );
                    }
                }
            }
            // A group that ended before the tile (a tile of a pair along M past its group).
            assert_eq!(tile.live_waves(512, 300, 0), 0);
        }
        // The two-wave tile's bands: 1–64 rows, 65–128, 129–192, 193–256.
        let t = Tile::M256;
        let at = |rows| (t.live_waves(0, rows, 0), t.live_waves(0, rows, 1));
        assert_eq!(
            [at(1), at(64), at(65), at(128)],
            [(1, 0), (1, 0), (1, 1), (1, 1)]
        );
        assert_eq!(
            [at(129), at(192), at(193), at(256)],
            [(2, 1), (2, 1), (2, 2), (2, 2)]
        );
    }

    /// Every row's entry point is named by its mode, tile and element types, as the host and
    /// the builder expect (a table line is written by hand).
    #[test]
    fn every_kernel_is_named_by_its_mode_tile_and_types() {
        for k in LISTS.concat() {
            let mode = match k.mode {
                Mode::Dense => "",
                Mode::Grouped => "_grouped",
                Mode::Sparse => "_bsr",
                Mode::Fused => "_fused",
                Mode::FusedInRegisters => "_fused_regs",
                Mode::FusedInRegistersMx => "_fused_regs_mx",
            };
            let t = k.tile;
            let tile = if t.is_swapped() {
                format!("_s{}", t.rows)
            } else {
                let m = if t.block_m() == 128 {
                    String::new()
                } else {
                    format!("_m{}", t.block_m())
                };
                let n = if t.block_n == 128 {
                    String::new()
                } else {
                    format!("_n{}", t.block_n)
                };
                m + &n
            };
            let types = if (k.a, k.b) == (E4M3, E4M3) {
                String::new()
            } else {
                format!("_{}_{}", k.a.name(), k.b.name())
            };
            let want = format!("sm90_fp8_blockscaled{mode}_gemm{tile}{types}");
            assert_eq!(k.info.name, want);
        }
    }

    #[test]
    fn every_tile_has_a_kernel_for_every_fp8_pair_with_a_unique_name() {
        let fp8 = [ElemType::E4M3, ElemType::E5M2];
        for t in Tile::ALL {
            for a in fp8 {
                for b in fp8 {
                    assert!(kernel(t, a, b, Mode::Dense).is_some(), "{t:?} {a:?} {b:?}");
                }
            }
        }
        assert_eq!(KERNELS.len(), Tile::ALL.len() * 4);
        let e4m3 = ElemType::E4M3;
        for t in Tile::ALL {
            let grouped = kernel(t, e4m3, e4m3, Mode::Grouped);
            // Grouped GEMM runs the tiles its plan picks from (not the swapped or wide ones).
            if t.is_swapped() || t.is_wide() {
                assert!(grouped.is_none(), "{t:?}");
            } else {
                assert!(grouped.is_some_and(|k| k.mode == Mode::Grouped), "{t:?}");
            }
            // Block-sparse tiles are at most one 128-row block of the sparse operand wide.
            let sparse = kernel(t, e4m3, e4m3, Mode::Sparse);
            assert_eq!(
                sparse.is_some(),
                [Tile::M128, Tile::M128N64].contains(&t),
                "{t:?}"
            );
            assert!(sparse.is_none_or(|k| k.mode == Mode::Sparse && t.block_n <= BLOCK_N));
            // Fused: the 128 × 128 tile.
            let fused = kernel(t, e4m3, e4m3, Mode::Fused);
            assert_eq!(fused.is_some(), t == Tile::M128, "{t:?}");
            assert!(fused.is_none_or(|k| k.mode == Mode::Fused));
            let regs = kernel(t, e4m3, e4m3, Mode::FusedInRegisters);
            let wide = [Tile::M128, Tile::M192].contains(&t);
            assert_eq!(regs.is_some(), wide, "{t:?}");
            assert!(regs.is_none_or(|k| k.mode == Mode::FusedInRegisters));
            // The fused kernel chosen: in registers where the epilogue allows and the tile has
            // one, else the one with finishing warps.
            let mode = |regs| fused_kernel(t, e4m3, e4m3, regs).map(|k| k.mode);
            assert_eq!(
                mode(InRegisters::Yes),
                regs.map(|k| k.mode).or(fused.map(|k| k.mode))
            );
            assert_eq!(mode(InRegisters::No), fused.map(|k| k.mode));
            let mx = kernel(t, e4m3, e4m3, Mode::FusedInRegistersMx);
            assert_eq!(mx.is_some(), wide, "{t:?}");
            assert_eq!(
                mode(InRegisters::Mx),
                mx.map(|k| k.mode).or(fused.map(|k| k.mode))
            );
        }
        let all = LISTS.concat();
        for (i, k) in all.iter().enumerate() {
            assert!(all[i + 1..].iter().all(|o| o.info.name != k.info.name));
            assert_eq!(k.info.max_threads, Some(k.tile.threads()));
        }
        assert_eq!(
            kernel(Tile::M256, ElemType::E5M2, ElemType::E4M3, Mode::Dense).map(|k| k.info.name),
            Some("sm90_fp8_blockscaled_gemm_m256_e5m2_e4m3")
        );
        assert_eq!(
            kernel(Tile::S16, ElemType::E4M3, ElemType::E4M3, Mode::Dense).map(|k| k.info.name),
            Some("sm90_fp8_blockscaled_gemm_s16")
        );
    }
}
