//! Mixture-of-experts routing and token movement, on one GPU or between the GPUs of an
//! expert-parallel layer: the steps around the grouped GEMMs, each a small kernel whose rule is
//! written once here for the host's checks and the device.
//!
//! - [`Route`]: each token's top-k experts by its router logits (ties to the lower expert, NaN
//!   first so that it reaches the output), with softmax or sigmoid weights normalized over them.
//! - [`Rank`] then [`Offsets`]: where each (token, choice) entry goes. Entries of expert e take
//!   the rows `start[e] + rank` in token order, `rank` counting e's earlier entries; `sent[e]`
//!   of them fit the capacity. Destinations are chunks of `capacity` rows, one per peer (peer
//!   `e / per_peer`), each holding its experts' rows one expert after another (contiguous) or
//!   in slots of `capacity` rows each (masked). On one GPU the single chunk is the grouped
//!   GEMM's A, and [`Offsets`] writes its group ends or counts.
//! - [`Pack`]: copies each entry's token row (FP8 codes and fp32 scales per 1×128) to its row.
//! - [`RegroupPlan`] then [`Regroup`]: on the receiving GPU, the chunks from every peer (each
//!   sorted by expert) become the grouped GEMM's A, expert by expert, peers in rank order; and,
//!   after the GEMMs, the output rows go back into the chunks they came from (zeros for a row
//!   dropped at a full masked group).
//! - [`SwigluQuantize`]: the first GEMM's gate/up pairs (bf16) through SwiGLU, quantized to FP8
//!   with a scale per 1×128 for the second GEMM, rows past the groups skipped.
//! - [`Combine`]: each token's output, Σ_j w_j · row(slot_j) in the order of its choices (one
//!   f32 `fma` each), skipping dropped entries.
//!
//! Row indices and counts are i32 (the grouped GEMM's group values), so a layer moves fewer than
//! 2^31 rows; the host checks the sizes.

use crate::kernel_info::KernelInfo;

/// Threads per block of these kernels (the offsets kernels: up to [`MAX_EXPERTS`]).
pub const MOE_THREADS: u32 = 256;
/// The most experts (or peers × local experts) the offsets kernels take: one block, a thread each.
pub const MAX_EXPERTS: u32 = 1024;
/// Output blocks of 128 columns a warp of [`SwigluQuantize`] takes at once: their loads issued
/// together, so that a warp keeps four 512-byte reads in flight instead of waiting on each.
pub const SWIGLU_BLOCKS: u32 = 4;
/// The most experts a token chooses: a lane of the router's warp keeps each choice.
pub const MAX_TOP_K: u32 = 32;

/// How the router turns its chosen logits into weights.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scoring {
    /// Softmax over the chosen logits (Mixtral: softmax over all, renormalized over the top k).
    Softmax = 0,
    /// Each chosen logit's sigmoid, divided by their sum (DeepSeek-V3's gate without its bias).
    Sigmoid = 1,
}

/// An order-preserving key of an f32's bits: larger values larger keys, NaN the largest (a NaN
/// logit is chosen first, so its NaN weight reaches the output). Every key is at least 1.
pub const fn order_key(bits: u32) -> u32 {
    if bits & 0x7FFF_FFFF > 0x7F80_0000 {
        u32::MAX
    } else if bits & 0x8000_0000 != 0 {
        !bits
    } else {
        bits | 0x8000_0000
    }
}

/// The router: a warp per token.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// f32 `[tokens][experts]`.
    pub logits: u64,
    /// Out: i32 `[tokens][top_k]`, the chosen experts, best first.
    pub chosen: u64,
    /// Out: f32 `[tokens][top_k]`, their weights.
    pub weights: u64,
    pub tokens: u32,
    pub experts: u32,
    pub top_k: u32,
    /// [`Scoring`].
    pub scoring: u32,
}

/// Each entry's rank among its expert's entries, and each expert's count: a block per expert.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rank {
    /// i32 `[entries]`: the chosen experts (an entry is a token's choice, `token · top_k + j`).
    pub chosen: u64,
    /// Out: i32 `[entries]` (written for entries whose expert is in range).
    pub rank: u64,
    /// Out: i32 `[experts]`.
    pub counts: u64,
    pub entries: u32,
    pub experts: u32,
}

/// The destination rows' layout: each expert's first row and how many of its rows fit (one
/// block, a thread per expert).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offsets {
    /// i32 `[experts]`, from [`Rank`].
    pub counts: u64,
    /// Out: i32 `[experts]`.
    pub start: u64,
    /// Out: i32 `[experts]`: the rows placed (the count, or what the capacity leaves).
    pub sent: u64,
    /// Out where not 0 (one chunk: `per_peer == experts`): the grouped GEMM's i32 ends
    /// (contiguous) or counts (masked).
    pub groups: u64,
    pub experts: u32,
    /// Experts per chunk (peer).
    pub per_peer: u32,
    /// Rows per chunk (contiguous), or per expert (masked).
    pub capacity: u32,
    pub masked: u32,
}

impl Offsets {
    /// Expert `e`'s first row and rows placed, from its count and the exclusive sum `before` of
    /// the counts of its chunk's earlier experts.
    pub const fn place(&self, e: u32, count: u32, before: u32) -> (u32, u32) {
        let (p, local) = (e / self.per_peer, e % self.per_peer);
        if self.masked != 0 {
            let first = (p * self.per_peer + local) * self.capacity;
            (
                first,
                if count < self.capacity {
                    count
                } else {
                    self.capacity
                },
            )
        } else {
            let room = self.capacity.saturating_sub(before);
            (
                p * self.capacity + before,
                if count < room { count } else { room },
            )
        }
    }
}

/// Where fp32 scales per 1×128 of a row set live: scale `(row, kb)` at
/// `(row / batch_rows) · batch_stride + (row % batch_rows) · row_stride + kb · k_stride` (in
/// scales): a quantizer's K- or MN-major packed layout of a batch of `batch_rows`-row entries, or
/// the FP8 kernel's A-role layout (MN-major, rows padded).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScaleRows {
    pub batch_rows: u32,
    pub row_stride: u32,
    pub k_stride: u32,
    pub batch_stride: u32,
    pub k_blocks: u32,
    /// (Explicit padding: an even number of words.)
    pub pad: u32,
}

impl ScaleRows {
    /// Row-major scales (a chunk's rows: each row's scales together).
    pub const fn rows(k_blocks: u32) -> Self {
        ScaleRows {
            batch_rows: u32::MAX,
            row_stride: k_blocks,
            k_stride: 1,
            batch_stride: 0,
            k_blocks,
            pad: 0,
        }
    }

    /// Scale `(row, kb)`'s index.
    #[inline(always)]
    pub const fn index(&self, row: u32, kb: u32) -> u64 {
        let (l, r) = (row / self.batch_rows, row % self.batch_rows);
        l as u64 * self.batch_stride as u64
            + r as u64 * self.row_stride as u64
            + kb as u64 * self.k_stride as u64
    }
}

/// Copies each entry's token row to its destination row and records the row (`slot`, −1 where
/// the capacity is full or the expert out of range): a block per entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pack {
    pub chosen: u64,
    pub rank: u64,
    pub start: u64,
    pub sent: u64,
    /// Out: i32 `[entries]`.
    pub slot: u64,
    /// `[tokens][row_bytes]` codes and their scales (`src_scale`).
    pub src_codes: u64,
    pub src_scales: u64,
    pub dst_codes: u64,
    pub dst_scales: u64,
    /// A second copy of the destination's scales where not 0 (the FP8 kernel's A-role layout,
    /// `dst_scale2`), so that the GEMM reads them with no re-layout pass.
    pub dst_scales2: u64,
    pub src_scale: ScaleRows,
    pub dst_scale: ScaleRows,
    pub dst_scale2: ScaleRows,
    pub entries: u32,
    pub top_k: u32,
    /// A multiple of 16.
    pub row_bytes: u32,
    pub experts: u32,
}

/// The receiving side's layout: per (peer, local expert), where its rows start in the peer's
/// chunk and in the grouped A, and the grouped GEMM's ends or counts (one block, a thread per
/// pair).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegroupPlan {
    /// i32 `[world][per_peer]`: the rows each peer sent of each local expert.
    pub sent: u64,
    /// Out: i32 `[world][per_peer]`.
    pub src_start: u64,
    /// Out: i32 `[world][per_peer]`.
    pub dst_start: u64,
    /// Out: i32 `[per_peer]`.
    pub groups: u64,
    pub world: u32,
    pub per_peer: u32,
    /// Rows per expert where masked; 0 for contiguous.
    pub group_capacity: u32,
    pub pad: u32,
}

/// Moves rows between the peers' chunks and the grouped rows ([`RegroupPlan`]'s layout): a
/// block per chunk row.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Regroup {
    pub sent: u64,
    pub src_start: u64,
    pub dst_start: u64,
    pub chunk_rows: u64,
    /// 0: rows without scales.
    pub chunk_scales: u64,
    pub group_rows: u64,
    pub group_scales: u64,
    /// As [`Pack::dst_scales2`].
    pub group_scales2: u64,
    pub chunk_scale: ScaleRows,
    pub group_scale: ScaleRows,
    pub group_scale2: ScaleRows,
    pub world: u32,
    pub per_peer: u32,
    /// Rows per chunk.
    pub capacity: u32,
    pub group_capacity: u32,
    /// A multiple of 16.
    pub row_bytes: u32,
    /// 1: chunks to grouped rows; 0: grouped rows back to the chunks.
    pub to_groups: u32,
}

/// SwiGLU of gate/up pairs, quantized to FP8 e4m3 with a scale per 1×128: a warp per row and
/// 128 output columns.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwigluQuantize {
    /// bf16 `[rows][2 · cols]`, gate and up interleaved (column 2j the gate's j).
    pub src: u64,
    /// Out: `[rows][cols]` codes.
    pub codes: u64,
    /// Out: scales as `scale` says.
    pub scales: u64,
    /// As [`Pack::dst_scales2`].
    pub scales2: u64,
    /// i32 ends (contiguous) or counts (masked) of the rows to quantize.
    pub groups: u64,
    pub scale: ScaleRows,
    pub scale2: ScaleRows,
    pub rows: u32,
    /// A multiple of 128.
    pub cols: u32,
    pub group_count: u32,
    /// Rows per group where masked; 0 for contiguous.
    pub group_capacity: u32,
}

/// Each token's weighted sum of its experts' rows: a block per token.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Combine {
    /// bf16 `[·][hidden]`, indexed by slot.
    pub rows: u64,
    pub slot: u64,
    pub weights: u64,
    /// Out: `[tokens][hidden]` bf16, or f32 where `out_f32`.
    pub out: u64,
    pub tokens: u32,
    pub top_k: u32,
    /// A multiple of 8.
    pub hidden: u32,
    pub out_f32: u32,
}

/// Whether row `r` of a grouped GEMM's rows is in a group: below the last end (contiguous), or
/// below its group's count (masked, `group_capacity` rows a group); values read by `read`.
#[inline(always)]
pub fn row_in_groups(
    r: u32,
    (count, group_capacity): (u32, u32),
    read: impl Fn(u32) -> i32,
) -> bool {
    match r.checked_div(group_capacity) {
        None => (r as i64) < read(count - 1) as i64,
        Some(g) => g < count && ((r % group_capacity) as i64) < read(g) as i64,
    }
}

const fn info(name: &'static str, threads: u32) -> KernelInfo {
    KernelInfo {
        name,
        max_threads: Some(threads),
        min_blocks_per_sm: 1,
        targets: &["sm_90a", "sm_100a"],
    }
}

pub const ROUTE: KernelInfo = info("moe_route", MOE_THREADS);
pub const RANK: KernelInfo = info("moe_rank", MOE_THREADS);
pub const OFFSETS: KernelInfo = info("moe_offsets", MAX_EXPERTS);
pub const PACK: KernelInfo = info("moe_pack", MOE_THREADS);
pub const REGROUP_PLAN: KernelInfo = info("moe_regroup_plan", MAX_EXPERTS);
pub const REGROUP: KernelInfo = info("moe_regroup", MOE_THREADS);
pub const SWIGLU_QUANTIZE: KernelInfo = info("moe_swiglu_quantize", MOE_THREADS);
pub const COMBINE: KernelInfo = info("moe_combine", MOE_THREADS);

/// One MoE kernel (the registry's rows).
pub struct MoeKernel {
    pub info: KernelInfo,
}

pub const KERNELS: &[MoeKernel] = &[
    MoeKernel { info: ROUTE },
    MoeKernel { info: RANK },
    MoeKernel { info: OFFSETS },
    MoeKernel { info: PACK },
    MoeKernel { info: REGROUP_PLAN },
    MoeKernel { info: REGROUP },
    MoeKernel {
        info: SWIGLU_QUANTIZE,
    },
    MoeKernel { info: COMBINE },
];

#[cfg(target_arch = "nvptx64")]
mod entries;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_keys_order_as_the_values_with_nan_first() {
        let xs = [
            f32::NEG_INFINITY,
            -3.5,
            -f32::MIN_POSITIVE,
            -0.0,
            0.0,
            f32::from_bits(1),
            1.0,
            f32::MAX,
            f32::INFINITY,
        ];
        for w in xs.windows(2) {
            assert!(
                order_key(w[0].to_bits()) < order_key(w[1].to_bits()),
                "{w:?}"
            );
        }
        assert!(order_key(f32::NEG_INFINITY.to_bits()) >= 1);
        assert_eq!(order_key(f32::NAN.to_bits()), u32::MAX);
        assert_eq!(order_key((-f32::NAN).to_bits()), u32::MAX);
    }

    #[test]
    fn offsets_place_rows_by_chunk_and_clamp_to_the_capacity() {
        let o = Offsets {
            counts: 0,
            start: 0,
            sent: 0,
            groups: 0,
            experts: 4,
            per_peer: 2,
            capacity: 5,
            masked: 0,
        };
        // Peer 1's second expert after its first's 3 rows: 2 of its 4 fit.
        assert_eq!(o.place(3, 4, 3), (8, 2));
        assert_eq!(o.place(2, 3, 0), (5, 3));
        assert_eq!(o.place(1, 9, 7), (7, 0));
        let m = Offsets { masked: 1, ..o };
        assert_eq!(m.place(3, 7, 0), (15, 5));
        assert_eq!(m.place(0, 2, 0), (0, 2));
    }

    #[test]
    fn scale_rows_index_k_and_mn_major_batches() {
        let k = ScaleRows::rows(3);
        assert_eq!(k.index(2, 1), 7);
        let mn = ScaleRows {
            batch_rows: 4,
            row_stride: 1,
            k_stride: 4,
            batch_stride: 12,
            k_blocks: 3,
            pad: 0,
        };
        // Entry 1 of 4-row entries, row 1, K block 2: 12 + 1 + 8.
        assert_eq!(mn.index(5, 2), 21);
    }

    #[test]
    fn rows_are_in_groups_by_ends_or_counts() {
        let ends = [2, 2, 5];
        let r = |g: u32| ends[g as usize];
        assert!(row_in_groups(4, (3, 0), r));
        assert!(!row_in_groups(5, (3, 0), r));
        let counts = [1, 0, 3];
        let c = |g: u32| counts[g as usize];
        assert!(row_in_groups(0, (3, 4), c));
        assert!(!row_in_groups(1, (3, 4), c));
        assert!(!row_in_groups(4, (3, 4), c));
        assert!(row_in_groups(10, (3, 4), c));
        assert!(!row_in_groups(12, (3, 4), c));
    }
}
