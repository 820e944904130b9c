//! The 4-bit-weights stream: W4A16 at decode sizes (M ≤ 16 activation rows), where the product
//! is a read of the weights and nothing else counts. One warp per 16 weight rows and K range,
//! each thread loading its own fragment bytes straight from global memory into registers
//! ([`DEPTH`] chunks of 64 K ahead of the MMAs, so that every SM keeps tens of KB of weights in
//! flight), dequantizing them exactly ([`super::weight_fragments`], the pipelined kernel's) and
//! issuing `mma.sync` m16n8k16 with the activations, which each CTA stages once in shared memory.
//! No producer warp, ring or `wgmma`: at one or sixteen activation rows a tile's MMAs are a few
//! percent of the tensor cores, and what bounds the time is how many bytes each SM has in flight,
//! which a CTA-wide TMA ring of the warp-specialized driver caps at its stages and its one
//! consumer's pace.
//!
//! Layouts are the 4-bit-weights family's: the reordered codes ([`super::weight_k`], stored in
//! groups of 16 rows chunk by chunk, [`super::stored_chunk`], so that a warp's loads of one chunk
//! are 512 adjacent bytes) and the MX scale layout `[l][chunks][rows_pad][64 / block]`; the
//! activations bf16 `[l][m][k]` as the caller holds them. K is split into `split` ranges of whole
//! chunks (grid `⌈n / ROWS⌉ × split × l`); the ranges of a tile meet in a workspace, the last CTA
//! to arrive adding the partials in range order (reproducible bit for bit, as
//! [`crate::gemm::splitk`]).

use crate::format::MxScale;
use crate::kernel_info::KernelInfo;
use crate::params::SplitKParams;

/// Warps per CTA, each 16 weight rows.
pub const WARPS: u32 = 8;
/// Threads per CTA.
pub const THREADS: u32 = 32 * WARPS;
/// Weight rows (C's columns) per CTA.
pub const ROWS: u32 = 16 * WARPS;
/// Chunks of 64 K each warp has loaded ahead of its MMAs.
pub const DEPTH: usize = 6;
/// CTAs the launch bounds make fit on one SM (ptxas caps each thread at 128 registers).
pub const MIN_BLOCKS: u32 = 2;
/// Most activation rows: two `mma` n8 tiles.
pub const MAX_M: u32 = 16;
/// K of one chunk of the reordered weights.
pub const CHUNK_K: u32 = super::BLOCK_K;
/// Bytes of a weight row's chunk.
pub const CHUNK_BYTES: u32 = CHUNK_K / 2;

/// Parameters of the stream kernel (module doc for the layouts).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct W4StreamParams {
    /// Reordered e2m1 codes, `[l][⌈n / 16⌉][chunks][16][32]` bytes ([`super::stored_chunk`]).
    pub w: u64,
    /// Weight scales, `[l][chunks][rows_pad][64 / block]` bytes.
    pub sfw: u64,
    /// bf16 activations, `[l][m][k]`, 16-byte aligned.
    pub x: u64,
    /// `[l][m][n]` of `out_type`.
    pub out: u64,
    /// With `split` > 1: [`workspace`]'s partial sums and counters (zero at launch).
    pub splitk: SplitKParams,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub l: u32,
    /// `⌈k / 64⌉`.
    pub chunks: u32,
    pub rows_pad: u32,
    /// K ranges (1 to `chunks`).
    pub split: u32,
    /// [`crate::params::OutType`] as u32.
    pub out_type: u32,
    /// Multiplies every sum before the store.
    pub alpha: f32,
    pub _pad: u32,
}

/// One kernel: the weights' scale format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct W4StreamKernel {
    pub scale: MxScale,
    pub info: KernelInfo,
}

impl W4StreamKernel {
    pub const fn new(name: &'static str, scale: MxScale) -> Self {
        let mut info = KernelInfo::sm90(name, THREADS);
        info.min_blocks_per_sm = MIN_BLOCKS;
        W4StreamKernel { scale, info }
    }
}

crate::entry::kernel_table! {
    /// # Safety
    /// As [`device::stream`].
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
    unsafe extern "ptx-kernel" fn |K| {
        call(W4StreamParams) => device::stream::<
            crate::entry::Of<crate::sm90_mx::dequant::ScaleOf<{ K.scale.ty as u32 }, { K.scale.block }>>,
        >;
    }

    /// Every stream kernel (the registry's rows): one per weight scale format.
    pub const KERNELS: &[W4StreamKernel] = W4StreamKernel::new [
        call("sm90_w4_stream_bf16_e2m1_e8m0x32", MxScale::E8M0X32),
        call("sm90_w4_stream_bf16_e2m1_ue4m3x16", MxScale::UE4M3X16),
        call("sm90_w4_stream_bf16_e2m1_e8m0x16", MxScale::E8M0X16),
    ];
}

/// The stream kernel for weight scales `scale`.
pub fn kernel(scale: MxScale) -> Option<&'static W4StreamKernel> {
    KERNELS.iter().find(|k| k.scale == scale)
}

/// The chunks `[c0, c1)` of K range `part` of `split` over `chunks` (every range non-empty when
/// `split ≤ chunks`; they tile `0..chunks` in order). `split · chunks` < 2³² (the host's
/// `check_split`).
pub const fn part_range(chunks: u32, split: u32, part: u32) -> (u32, u32) {
    (part * chunks / split, (part + 1) * chunks / split)
}

/// Activation rows a CTA stages: one `mma` n8 tile, or two past 8 rows.
pub const fn staged_rows(m: u32) -> u32 {
    if m > 8 { 16 } else { 8 }
}

/// Bytes between staged activation rows: the longest range's bf16 values and 16 more, so that
/// the eight rows a warp's B fragments read fall in different banks (a row of whole chunks is a
/// multiple of 128 bytes; 16 more shifts each row by four banks).
pub const fn staged_row_bytes(chunks: u32, split: u32) -> u32 {
    chunks.div_ceil(split) * CHUNK_K * 2 + 16
}

/// Dynamic shared memory of a launch.
pub const fn smem_bytes(m: u32, chunks: u32, split: u32) -> u32 {
    staged_rows(m) * staged_row_bytes(chunks, split)
}

/// Split K's workspace of a launch: (f32 partial sums, u32 counters); each CTA's threads write
/// 8 values each.
pub const fn workspace(n: u32, l: u32, split: u32) -> (u64, u64) {
    let tiles = l as u64 * n.div_ceil(ROWS) as u64;
    (tiles * split as u64 * THREADS as u64 * 8, tiles)
}

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
pub(crate) mod device {
    use super::{CHUNK_BYTES, CHUNK_K, DEPTH, ROWS, THREADS, W4StreamParams};
    use crate::gemm::epilogue::{Output, store_transposed};
    use crate::ptx::{global, mma, smem, thread};
    use crate::sm90_mx::MMA_K;
    use crate::sm90_mx::dequant::ScaleDecode;
    use crate::sm90_w4::weight_fragments;

    /// One chunk of a thread's two weight rows as loaded: their fragment bytes and scale bytes.
    #[derive(Clone, Copy, Default)]
    struct Chunk {
        w: [[u32; 2]; 2],
        s: [u32; 2],
    }

    /// # Safety
    /// `p` describes live buffers as [`W4StreamParams`] says, `1 ≤ split ≤ chunks`,
    /// `1 ≤ m ≤ MAX_M`, `k` a multiple of 8 and of the scale block; launched with [`THREADS`]
    /// threads, a grid of `⌈n / ROWS⌉ × split × l` and [`super::smem_bytes`] of dynamic shared
    /// memory; with `split > 1`, `splitk` is [`super::workspace`]'s, its counters zero.
    #[inline(always)]
    pub(crate) unsafe fn stream<S: ScaleDecode>(p: &W4StreamParams) {
        // SAFETY: the caller's contract.
        unsafe {
            if p.m > 8 {
                run::<S, 2>(p)
            } else {
                run::<S, 1>(p)
            }
        }
    }

    /// [`stream`] with `NT` `mma` n8 tiles of activation rows.
    #[inline(always)]
    unsafe fn run<S: ScaleDecode, const NT: usize>(p: &W4StreamParams) {
        let (tile, part, l) = (thread::block_x(), thread::block_y(), thread::block_z());
        let tid = thread::thread_x();
        let warp = thread::warp_uniform(tid / 32);
        let (g, t) = ((tid % 32) / 4, tid % 4);
        // (At least 1 as the compiler can see: no panic path for the divisions by it.)
        let split = p.split.max(1);
        let (c0, c1) = super::part_range(p.chunks, split, part);
        let stride = super::staged_row_bytes(p.chunks, split);
        let w_scales = CHUNK_K / S::BLOCK;
        // This thread's two weight rows (clamped inside the matrix: rows past N are read but
        // never stored).
        let first = tile * ROWS + 16 * warp + g;
        let rows = [first, first + 8].map(|r| r.min(p.n - 1));
        // Where each row's next chunk to load is: the stored codes (`stored_chunk`: a row's
        // chunks one row group apart) and its scale bytes (one chunk's scales `rows_pad` rows
        // apart). The loads go out in chunk order, each advancing its row's two addresses.
        let w_step = (super::super::GROUP_ROWS * CHUNK_BYTES) as u64;
        let s_step = p.rows_pad as u64 * w_scales as u64;
        let mut w_at =
            rows.map(|r| p.w + super::super::stored_chunk(l, r, c0, p.n, p.chunks) + 8 * t as u64);
        let mut s_at = rows.map(|r| {
            p.sfw
                + ((l as u64 * p.chunks as u64 + c0 as u64) * p.rows_pad as u64 + r as u64)
                    * w_scales as u64
        });
        let mut load_next = || -> Chunk {
            let mut ch = Chunk::default();
            for h in 0..2 {
                // SAFETY: the addresses stay on rows `rows[h]` < n and chunks < c1 ≤ chunks
                // (the callers load chunks c0, c0 + 1, … below c1 only): inside the stored codes
                // (8-byte aligned) and the scale layout (aligned to its `w_scales` bytes).
                unsafe {
                    ch.w[h] = global::load_u32x2_stream(w_at[h]);
                    ch.s[h] = if w_scales == 2 {
                        global::load_u16_nc(s_at[h]) as u32
                    } else {
                        global::load_u32_nc(s_at[h])
                    };
                }
                w_at[h] += w_step;
                s_at[h] += s_step;
            }
            ch
        };
        // The first chunks' loads go out before the activations are staged.
        let mut ahead = [Chunk::default(); DEPTH];
        for i in 0..DEPTH {
            if c0 + (i as u32) < c1 {
                ahead[i] = load_next();
            }
        }
        let xs = smem::dynamic_base();
        // SAFETY: the staged rows fit the launch's shared memory (`smem_bytes`); the source
        // elements are inside the activations (rows < m, k < K, 16-byte units as K % 8 == 0).
        unsafe { stage_activations(p, xs, (c0, c1), stride, 8 * NT as u32, tid) };
        thread::sync_block();

        // (Index loops over arrays of constant size, which the compiler unrolls and keeps in
        // registers.)
        // Sums per n8 tile and parity of the K step: two chains of dependent MMAs per tile,
        // not one, so that each waits for half as many.
        let mut acc = [[[0f32; 4]; 2]; 2];
        let mut c = c0;
        while c < c1 {
            for i in 0..DEPTH {
                let cur = ahead[i];
                let at = c + i as u32;
                if at < c1 {
                    let frags = weight_fragments(cur.w, |h, kk| {
                        S::x2((cur.s[h] >> (8 * (kk * MMA_K / S::BLOCK))) & 0xFF)
                    });
                    for kk in 0..4 {
                        let col = (at - c0) * CHUNK_K + kk as u32 * MMA_K + 2 * t;
                        for j in 0..NT {
                            let x = xs + (8 * j as u32 + g) * stride + 2 * col;
                            // SAFETY: staged row 8j + g, columns col and col + 8 of this range.
                            let b = unsafe { [smem::load_u32(x), smem::load_u32(x + 16)] };
                            mma::m16n8k16_bf16(&mut acc[j][kk % 2], frags[kk], b);
                        }
                    }
                }
                // Into the registers `cur` held: chunk at + DEPTH is loaded while the next
                // DEPTH − 1 are computed.
                if at + (DEPTH as u32) < c1 {
                    ahead[i] = load_next();
                }
            }
            c += DEPTH as u32;
        }
        let mut acc: [f32; 8] =
            core::array::from_fn(|i| acc[i / 4][0][i % 4] + acc[i / 4][1][i % 4]);

        // SAFETY: the caller's contract for the workspace.
        if p.split > 1 && !unsafe { meet(p, &mut acc, (tile, part, l), tid) } {
            return;
        }
        if p.alpha != 1.0 {
            for v in acc.iter_mut() {
                *v *= p.alpha;
            }
        }
        let out = Output::direct(p.out, (p.m, p.n), p.out_type, p.m);
        store_transposed(&out, l, first, 2 * t, &acc);
    }

    /// Copies activation rows `0..rows` (zeros past `m`) of chunks `c0..c1` into shared memory
    /// at `xs`, row `r` at `r · stride`, in 16-byte units shared over the CTA's threads.
    /// # Safety
    /// As [`stream`]; `rows · stride` bytes at `xs` are this CTA's.
    #[inline(always)]
    unsafe fn stage_activations(
        p: &W4StreamParams,
        xs: u32,
        (c0, c1): (u32, u32),
        stride: u32,
        rows: u32,
        tid: u32,
    ) {
        let per_row = ((c1 - c0) * CHUNK_K / 8).max(1);
        let mut u = tid;
        while u < rows * per_row {
            let (r, q) = (u / per_row, u % per_row);
            let kx = c0 * CHUNK_K + 8 * q;
            let v = if r < p.m && kx < p.k {
                let at = p.x
                    + 2 * ((thread::block_z() as u64 * p.m as u64 + r as u64) * p.k as u64
                        + kx as u64);
                // SAFETY: 8 bf16 of row r < m from column kx < k (k % 8 == 0), 16-byte aligned.
                unsafe { global::load_f32x4(at) }.map(f32::to_bits)
            } else {
                [0; 4]
            };
            // SAFETY: the caller's contract.
            unsafe { smem::store_u32x4(xs + r * stride + 16 * q, v) };
            u += THREADS;
        }
    }

    /// The K ranges of this CTA's tile meet: each thread's partial sums go to the workspace, and
    /// the CTA that arrives last adds all ranges' in range order into `acc` and returns true.
    /// # Safety
    /// As [`stream`] with `split > 1`; every thread of the CTA calls it once.
    #[inline(always)]
    unsafe fn meet(
        p: &W4StreamParams,
        acc: &mut [f32; 8],
        (tile, part, l): (u32, u32, u32),
        tid: u32,
    ) -> bool {
        let slot = l as u64 * p.n.div_ceil(ROWS) as u64 + tile as u64;
        let at = |s: u32| {
            p.splitk.ws + ((slot * p.split as u64 + s as u64) * THREADS as u64 + tid as u64) * 32
        };
        // SAFETY (stores and loads): each range's 8 values of this thread lie inside the
        // workspace (`workspace`), 16-byte aligned; a partial read here was written before its
        // CTA's release, which the acquire below orders before these loads.
        unsafe {
            global::store_f32x4(at(part), [acc[0], acc[1], acc[2], acc[3]]);
            global::store_f32x4(at(part) + 16, [acc[4], acc[5], acc[6], acc[7]]);
        }
        thread::sync_block();
        let counter = p.splitk.counters + 4 * slot;
        let mut last = false;
        if tid == 0 {
            global::fence_acq_rel_gpu();
            // SAFETY: one counter per tile inside the workspace's counters.
            unsafe {
                last = global::atomic_add_u32(counter, 1) == p.split - 1;
                if last {
                    // Every range has arrived: nobody else touches the counter in this launch.
                    global::store_relaxed_u32(counter, 0);
                }
            }
            global::fence_acq_rel_gpu();
        }
        if !thread::named_barrier_any::<1>(THREADS, last) {
            return false;
        }
        *acc = [0.0; 8];
        for s in 0..p.split {
            // SAFETY: as above.
            let (lo, hi) = unsafe {
                (
                    global::load_f32x4_l2(at(s)),
                    global::load_f32x4_l2(at(s) + 16),
                )
            };
            for i in 0..4 {
                acc[i] += lo[i];
                acc[4 + i] += hi[i];
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;

    #[test]
    fn the_k_ranges_tile_the_chunks_in_order_and_none_is_empty() {
        for chunks in 1..200 {
            for split in 1..=chunks.min(40) {
                let mut next = 0;
                for part in 0..split {
                    let (c0, c1) = part_range(chunks, split, part);
                    assert_eq!(c0, next);
                    assert!(c1 > c0 && c1 - c0 <= chunks.div_ceil(split));
                    next = c1;
                }
                assert_eq!(next, chunks);
            }
        }
    }

    #[test]
    fn staged_rows_fall_in_distinct_banks_and_the_launch_fits() {
        for (chunks, split) in [(64, 7), (112, 9), (1, 1), (256, 4)] {
            let words = staged_row_bytes(chunks, split) / 4;
            // Rows g = 0..8, word t = 0..4 of a B fragment: 32 distinct banks.
            let mut banks: [bool; 32] = [false; 32];
            for g in 0..8 {
                for t in 0..4 {
                    banks[((g * words + t) % 32) as usize] = true;
                }
            }
            assert!(banks.iter().all(|&b| b), "{chunks} / {split}");
        }
        assert!(smem_bytes(16, 64, 1) <= crate::gemm::layout::SMEM_LIMIT);
    }

    #[test]
    fn every_scale_format_has_its_stream_kernel() {
        for s in [MxScale::E8M0X32, MxScale::UE4M3X16, MxScale::E8M0X16] {
            let k = kernel(s).unwrap();
            assert_eq!(
                k.info.name,
                std::format!("sm90_w4_stream_bf16_e2m1_{}x{}", s.ty.name(), s.block)
            );
            assert_eq!(k.info.min_blocks_per_sm, MIN_BLOCKS);
        }
    }
}
