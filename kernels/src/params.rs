//! `#[repr(C)]` kernel parameters, shared by the host (which fills them) and the kernels (which
//! read them). Kernel parameters travel by value in the `.param` space; every struct here is
//! 8-byte aligned (rustc's nvptx64 ABI rejects by-value parameters aligned above 16 bytes).
//!
//! ## Memory layout the kernels read (the host documents and validates the same)
//! - An operand (A: M×K, B: N×K) is stored K-major: element `(l, r, k)` at element index
//!   `l·batch_stride + r·row_stride + k`. For e2m1 two elements share a byte: element index `i`
//!   is in byte `i / 2`, the even element in the low nibble (bits 0–3), the odd one in the high
//!   nibble, so `row_stride` and `batch_stride` are even.
//! - Its scales: scale `(l, rb, kb)` with `rb = r / block_rows`, `kb = k / block_k` at scale index
//!   `l·scale_batch_stride + rb·scale_row_stride + kb·scale_k_stride` (so K-major and MN-major
//!   scale tensors are both described). The dequantized value is
//!   `decode(elem) · decode(scale) · tensor_scale`.
//! - The output C (M×N) is row-major, element `(l, m, n)` at `l·out_batch_stride +
//!   m·out_row_stride + n`, of type [`OutType`].

use crate::format::{ElemType, ScaleType};

/// Output element type.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum OutType {
    #[default]
    Bf16 = 0,
    F16 = 1,
    F32 = 2,
}

impl OutType {
    /// Bytes per element.
    pub const fn bytes(self) -> usize {
        match self {
            OutType::Bf16 | OutType::F16 => 2,
            OutType::F32 => 4,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            OutType::Bf16 => "bf16",
            OutType::F16 => "f16",
            OutType::F32 => "f32",
        }
    }

    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            0 => Some(OutType::Bf16),
            1 => Some(OutType::F16),
            2 => Some(OutType::F32),
            _ => None,
        }
    }
}

/// One block-scaled operand as a kernel sees it. Strides are in elements (data) and in scale
/// elements (scales); pointers are device addresses.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OperandParams {
    pub data: u64,
    pub scales: u64,
    pub row_stride: u64,
    pub batch_stride: u64,
    pub scale_row_stride: u64,
    pub scale_k_stride: u64,
    pub scale_batch_stride: u64,
    /// Rows of this operand (M for A, N for B).
    pub rows: u32,
    /// [`ElemType`] as u32.
    pub elem: u32,
    /// [`ScaleType`] as u32.
    pub scale_type: u32,
    /// Rows that share one scale (1, 128, or `rows` for per-tensor).
    pub block_rows: u32,
    /// K elements that share one scale (16, 32, 128, or K for per-row / per-tensor).
    pub block_k: u32,
    /// Per-tensor fp32 multiplier (NVFP4's second-level scale; 1.0 otherwise).
    pub tensor_scale: f32,
}

impl OperandParams {
    pub fn elem_type(&self) -> Option<ElemType> {
        ElemType::from_u32(self.elem)
    }
    pub fn scale_kind(&self) -> Option<ScaleType> {
        ScaleType::from_u32(self.scale_type)
    }
}

/// Parameters of one GEMM: C[l] = A[l] · B[l]ᵀ for l in 0..L.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GemmParams {
    pub a: OperandParams,
    pub b: OperandParams,
    pub out: u64,
    pub out_row_stride: u64,
    pub out_batch_stride: u64,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub l: u32,
    /// [`OutType`] as u32.
    pub out_type: u32,
    pub _pad: u32,
}

/// Reference kernel block shape: 32 threads along N (one warp reads B rows 32 apart and shares
/// each A element by broadcast), 8 warps along M.
pub const REFERENCE_BLOCK_N: u32 = 32;
pub const REFERENCE_BLOCK_M: u32 = 8;
pub const REFERENCE_BLOCK_THREADS: u32 = REFERENCE_BLOCK_N * REFERENCE_BLOCK_M;

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, size_of};

    #[test]
    fn params_have_no_implicit_padding_and_param_space_alignment() {
        assert_eq!(size_of::<OperandParams>(), 7 * 8 + 6 * 4);
        assert_eq!(
            size_of::<GemmParams>(),
            2 * size_of::<OperandParams>() + 3 * 8 + 6 * 4
        );
        assert_eq!(align_of::<GemmParams>(), 8);
    }
}

/// Tile shapes and pipeline of the sm90 FP8 block-scaled GEMM (`kernels::sm90_fp8`). Hardware
/// facts behind the numbers: a 128-byte swizzled TMA box row is 128 e4m3 = one 1×128 scale block
/// of K; `wgmma` m64nNk32 gives each consumer warpgroup 64 rows, so one *wave* of the consumers
/// covers 64 rows per consumer; BLOCK_N 128 is one 128×128 scale block of B. A tile is 2
/// consumers × 1 or 2 waves, or 3 consumers × 1 wave, by 128 or 64 columns ([`sm90::Tile`]); the
/// stages are as many as fit the 227 KiB a block may have.
pub mod sm90 {
    /// Columns of one 128×128 B-scale block, and of the widest tile.
    pub const BLOCK_N: u32 = 128;
    pub const BLOCK_K: u32 = 128;
    /// Rows of one consumer warpgroup per wave: the M of `wgmma` m64nNk32.
    pub const WG_ROWS: u32 = 64;
    /// Bytes per row of a swizzled tile (the 128-byte swizzle span).
    pub const ROW_BYTES: u32 = 128;
    /// Largest dynamic shared memory per block on sm_90 (227 KiB).
    pub const SMEM_LIMIT: u32 = 232_448;
    /// Registers of one SM, shared by the block's threads after `setmaxnreg`.
    pub const SM_REGISTERS: u32 = 65_536;
    /// Most CTAs per cluster (along M or along N).
    pub const MAX_CLUSTER: u32 = 2;

    /// One tile shape: `consumers` warpgroups × 64 rows × `waves` of A by `block_n` columns of B.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct Tile {
        /// Consumer warpgroups (2 or 3), each 64 rows of every wave.
        pub consumers: u32,
        /// Waves (1 or 2): each costs a consumer thread 64 fp32 sums (plus 64 scratch shared by
        /// the waves), so 2 waves need ≈ 200 of 224 registers; 3 would not fit.
        pub waves: u32,
        /// Columns: 128 (one 128×128 B-scale block), or 64 (half of one: twice the tiles where
        /// too few 128-column tiles leave SMs idle, at M = 128).
        pub block_n: u32,
    }

    impl Tile {
        pub const fn new(consumers: u32, waves: u32, block_n: u32) -> Tile {
            Tile {
                consumers,
                waves,
                block_n,
            }
        }
        pub const M128: Tile = Tile::new(2, 1, 128);
        pub const M256: Tile = Tile::new(2, 2, 128);
        /// Three consumers, one wave: while one promotes, the other two have batches queued
        /// (with two, only one), at L2 bytes per FLOP between the 128- and 256-row tiles.
        pub const M192: Tile = Tile::new(3, 1, 128);
        /// 128 × 64: `wgmma` m64n64k32.
        pub const M128N64: Tile = Tile::new(2, 1, 64);
        pub const ALL: [Tile; 4] = [Tile::M128, Tile::M256, Tile::M192, Tile::M128N64];

        /// Rows one wave of the consumers covers.
        pub const fn wave_m(self) -> u32 {
            WG_ROWS * self.consumers
        }
        pub const fn block_m(self) -> u32 {
            self.wave_m() * self.waves
        }
        /// One producer warpgroup and the consumers.
        pub const fn threads(self) -> u32 {
            128 * (1 + self.consumers)
        }
        /// Register budgets after `setmaxnreg` (multiples of 8, 24..=256), within
        /// [`SM_REGISTERS`]: two consumers 128·(40 + 2·224) — the 256-row tile's consumers need
        /// 128 sums + 64 scratch + addressing; ptxas spent 232 or 240 on starting the next wave's
        /// MMAs earlier and then spilled the scheduler's state (24–132 bytes), at 224 it spills
        /// nothing; three consumers 128·(32 + 3·160) = all of them (64 sums + 64 scratch + addressing;
        /// the producer spilled at 24, the consumers a per-tile value at 152).
        pub const fn producer_regs(self) -> u32 {
            if self.consumers == 2 { 40 } else { 32 }
        }
        pub const fn consumer_regs(self) -> u32 {
            if self.consumers == 2 { 224 } else { 160 }
        }
        /// Rows of one TMA box of A for clusters of `cluster_n` along N: a wave (128), or one
        /// consumer's 64 rows for three consumers, and for one-wave tiles shared along N (each
        /// CTA of the pair loads every other box and multicasts it). The host encodes a map for
        /// each size.
        pub const fn a_box_rows(self, cluster_n: u32) -> u32 {
            if self.consumers == 2 && (cluster_n == 1 || self.waves > 1) {
                2 * WG_ROWS
            } else {
                WG_ROWS
            }
        }
        pub const fn a_bytes(self) -> u32 {
            self.block_m() * ROW_BYTES
        }
        /// The A scales of one stage: one f32 per row.
        pub const fn sfa_bytes(self) -> u32 {
            self.block_m() * 4
        }
        pub const fn b_bytes(self) -> u32 {
            self.block_n * ROW_BYTES
        }
        pub const fn stage_bytes(self) -> u32 {
            self.a_bytes() + self.b_bytes() + self.sfa_bytes()
        }
        /// The output tile staged for its TMA store: 16-bit values (f32 output is stored
        /// directly, without it).
        pub const fn c_bytes(self) -> u32 {
            self.block_m() * self.block_n * 2
        }
        /// As many stages as fit beside the output tile, each with its two mbarriers (full,
        /// empty: see `pipeline`): 5 of 32.5 KiB for 128-row tiles, 3 of 49 KiB for 256-row ones,
        /// 4 of 40.75 KiB for 192-row ones, 8 of 24.5 KiB for 128 × 64.
        pub const fn stages(self) -> u32 {
            (SMEM_LIMIT - self.c_bytes()) / (self.stage_bytes() + 16)
        }
        pub const fn smem_bytes(self) -> u32 {
            self.stages() * (self.stage_bytes() + 16) + self.c_bytes()
        }
    }
    const _: () = {
        assert!(Tile::M128.stages() == 5 && Tile::M256.stages() == 3 && Tile::M192.stages() == 4);
        assert!(Tile::M128N64.stages() == 8);
        let mut i = 0;
        while i < Tile::ALL.len() {
            let t = Tile::ALL[i];
            assert!(128 * (t.producer_regs() + t.consumers * t.consumer_regs()) <= SM_REGISTERS);
            i += 1;
        }
    };

    /// The A-scale padding (`m_pad`) for `rows` rows: whole clusters of every tile height, so
    /// every CTA's scale copies stay inside the buffer; a multiple of 4 (16-byte copies).
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

    /// The FP8 element types of A and B: part of the `wgmma` instruction, so one kernel each.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum Fp8Types {
        E4m3E4m3,
        E5m2E5m2,
        E4m3E5m2,
        E5m2E4m3,
    }

    impl Fp8Types {
        /// From whether A and B are e5m2 (else e4m3).
        pub const fn new(a_e5m2: bool, b_e5m2: bool) -> Self {
            match (a_e5m2, b_e5m2) {
                (false, false) => Fp8Types::E4m3E4m3,
                (true, true) => Fp8Types::E5m2E5m2,
                (false, true) => Fp8Types::E4m3E5m2,
                (true, false) => Fp8Types::E5m2E4m3,
            }
        }
    }
    /// Columns of one output box of the TMA store: 64 × 2 bytes = the 128-byte swizzle span.
    pub const C_BOX_N: u32 = 64;
}

/// Parameters of the sm90 FP8 GEMM. Tensor maps live in device memory (64-byte aligned; see
/// `ptx::tma`); `tmap_b`'s box is BLOCK_N / `cluster_m` rows (each CTA of a cluster loads its
/// share). `sfa`: f32 `[l][k/128][m_pad]`, M contiguous, zero-padded to `m_pad` (a multiple of
/// [`sm90::m_pad`], so every tile's scales are one aligned copy). `sfb`: f32
/// `[l][⌈n/128⌉][k/128]`. `k` is a multiple of 128.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sm90Fp8Params {
    pub tmap_a: u64,
    pub tmap_b: u64,
    /// Tensor map of the output for TMA stores (N, M, L; box 64 × 64; 128-byte swizzle), or 0:
    /// direct stores (f32 output, or N % 8 ≠ 0 so rows are not 16-byte aligned).
    pub tmap_c: u64,
    pub sfa: u64,
    pub sfb: u64,
    /// Per-column scales of C (B scaled per row, constant over K): f32 `[l][n]`, multiplied in
    /// after the K loop; 0 when B's scales are all in `sfb`.
    pub sfb_col: u64,
    pub out: u64,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub l: u32,
    pub m_pad: u32,
    /// [`OutType`] as u32.
    pub out_type: u32,
    /// Scheduler band height in M tiles.
    pub group_m: u32,
    /// K blocks are split into this many ranges (≥ 1); with more than one, `out` is an f32
    /// workspace of `split_k · l` batch entries (entry `l·split_k + s` holds range `s`'s partial
    /// sums), which [`SplitKParams`]'s kernel reduces.
    pub split_k: u32,
    /// CTAs per cluster along M (1 or [`sm90::MAX_CLUSTER`]): the CTAs of a cluster compute
    /// consecutive M tiles of one N tile and multicast halves of the shared B tile.
    pub cluster_m: u32,
    /// CTAs per cluster along N (1 or [`sm90::MAX_CLUSTER`], and then `cluster_m` = 1): the CTAs
    /// compute consecutive N tiles of one M tile, and CTA `r` loads the boxes `b` of the shared A
    /// tile with `b % cluster_n == r` into both (boxes of `Tile::a_box_rows(cluster_n)` rows).
    pub cluster_n: u32,
}

/// Parameters of the split-K reduction: `out[l][i] = Σ_s ws[l·split + s][i]` for `i < mn`,
/// converted to `out_type` (round to nearest even), summed in the order s = 0, 1, … (deterministic).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SplitKParams {
    /// f32 partial sums, `l · split` entries of `mn` values.
    pub ws: u64,
    pub out: u64,
    /// Elements per batch entry (M·N).
    pub mn: u64,
    pub l: u32,
    pub split: u32,
    /// [`OutType`] as u32.
    pub out_type: u32,
    pub _pad: u32,
}

/// Threads per block of the split-K reduction.
pub const SPLITK_THREADS: u32 = 256;
