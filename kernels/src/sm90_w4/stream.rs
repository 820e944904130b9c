//! The 4-bit-weights stream: W4A16 and W4A8 at decode sizes (M ≤ 16 activation rows), where the
//! product is a read of the weights and nothing else counts. One warp per 16 weight rows and K
//! range, each thread loading its own fragment bytes straight from global memory into registers
//! ([`DEPTH`] chunks of 64 K ahead of the MMAs, so that every SM keeps tens of KB of weights in
//! flight), converting them and issuing `mma.sync` with the activations, which each CTA stages
//! once in shared memory. No producer warp, ring or `wgmma`: at one or sixteen activation rows a
//! tile's MMAs are a few percent of the tensor cores, and what bounds the time is how many bytes
//! each SM has in flight, which a CTA-wide TMA ring of the warp-specialized driver caps at its
//! stages and its one consumer's pace.
//!
//! - bf16 activations (W4A16): the codes become bf16 times their scales exactly
//!   ([`super::weight_fragments`], the pipelined kernel's), `mma` m16n8k16 bf16, fp32 sums.
//! - e4m3 activations with fp32 scales per 1×128 (W4A8): the codes become e4m3 bytes by shifts
//!   and masks alone ([`super::weight_fragments_e4m3`], exact), then fp16 pairs (one conversion
//!   per pair, exact), for `mma` m16n8k16 fp16 into a fresh sum per scale block (32 K, or 16),
//!   which is added to the fp32 sums times the weight scale and the activation scale. The
//!   activations are converted to fp16 once, when a CTA stages them, in the order of
//!   [`super::a8_k`]. (sm_90 has no FP8 `mma.sync` unit: ptxas lowers the e4m3 `mma` to these
//!   same conversions and fp16 MMAs, converting both operands in every warp.) Every product is
//!   exact and the sums are fp32, as W4A16's.
//!
//! Layouts are the 4-bit-weights family's: the reordered codes ([`super::weight_k`], stored in
//! groups of 16 rows chunk by chunk, [`super::stored_chunk`], so that a warp's loads of one chunk
//! are 512 adjacent bytes) and the MX scale layout `[l][chunks][rows_pad][64 / block]`; the
//! activations `[l][m][k]` as the caller holds them (W4A8 scales `[l][⌈k / 128⌉][sx_rows]`). K is
//! split into `split` ranges of whole chunks (grid `⌈n / ROWS⌉ × split × l`); the ranges of a tile
//! meet in a workspace, the last CTA to arrive adding the partials in range order (reproducible
//! bit for bit, as [`crate::gemm::splitk`]).

use super::Activation;
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
    /// Activations, `[l][m][k]` bf16 or e4m3 codes, 16-byte aligned.
    pub x: u64,
    /// W4A8: the activations' fp32 scales, `[l][⌈k / 128⌉][sx_rows]`; else 0.
    pub sx: u64,
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
    /// Multiplies every sum before the store (W4A8: times 2^6, the codes' e4m3 offset).
    pub alpha: f32,
    /// Rows of `sx` (≥ m).
    pub sx_rows: u32,
}

/// One kernel: the activations' format (bf16 or e4m3 per 1×128) and the weights' scale format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct W4StreamKernel {
    pub act: Activation,
    pub scale: MxScale,
    pub info: KernelInfo,
}

impl W4StreamKernel {
    pub const fn new(name: &'static str, act: Activation, scale: MxScale) -> Self {
        let mut info = KernelInfo::sm90(name, THREADS);
        info.min_blocks_per_sm = MIN_BLOCKS;
        W4StreamKernel { act, scale, info }
    }
}

/// Whether the stream has a kernel for activations `act`.
pub const fn takes(act: Activation) -> bool {
    matches!(act, Activation::Bf16 | Activation::E4m3Row128)
}

crate::entry::kernel_table! {
    /// # Safety
    /// As [`device::stream`].
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
    unsafe extern "ptx-kernel" fn |K| {
        call(W4StreamParams) => device::stream::<
            crate::entry::Of<device::ActOf<{ K.act as u32 }>>,
            crate::entry::Of<crate::sm90_mx::dequant::ScaleOf<{ K.scale.ty as u32 }, { K.scale.block }>>,
        >;
    }

    /// Every stream kernel (the registry's rows): one per activation format and weight scale
    /// format.
    pub const KERNELS: &[W4StreamKernel] = W4StreamKernel::new [
        call("sm90_w4_stream_bf16_e2m1_e8m0x32", Activation::Bf16, MxScale::E8M0X32),
        call("sm90_w4_stream_bf16_e2m1_ue4m3x16", Activation::Bf16, MxScale::UE4M3X16),
        call("sm90_w4_stream_bf16_e2m1_e8m0x16", Activation::Bf16, MxScale::E8M0X16),
        call("sm90_w4_stream_e4m3r128_e2m1_e8m0x32", Activation::E4m3Row128, MxScale::E8M0X32),
        call("sm90_w4_stream_e4m3r128_e2m1_ue4m3x16", Activation::E4m3Row128, MxScale::UE4M3X16),
        call("sm90_w4_stream_e4m3r128_e2m1_e8m0x16", Activation::E4m3Row128, MxScale::E8M0X16),
    ];
}

/// The stream kernel for activations `act` and weight scales `scale`.
pub fn kernel(act: Activation, scale: MxScale) -> Option<&'static W4StreamKernel> {
    KERNELS.iter().find(|k| k.act == act && k.scale == scale)
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

/// Bytes between staged activation rows (2-byte values: bf16, or e4m3 converted to fp16): the
/// longest range's values and 16 more, so that the rows a warp's B fragments read fall in
/// different banks. A row of whole chunks is a multiple of 128 bytes; 16 more shifts each row by
/// four banks: bf16 threads read 4 bytes (8 rows × 4 threads: 32 banks), fp16 threads 16 bytes at
/// 32t (each phase of 8 threads, 2 rows × 4, covers 32 banks).
pub const fn staged_row_bytes(chunks: u32, split: u32) -> u32 {
    chunks.div_ceil(split) * CHUNK_K * 2 + 16
}

/// W4A8: the most 128-K scale blocks one range of whole chunks touches.
pub const fn staged_scale_blocks(chunks: u32, split: u32) -> u32 {
    chunks.div_ceil(split).div_ceil(2) + 1
}

/// Dynamic shared memory of a launch: the staged rows, and for W4A8 their fp32 scales after
/// them (`[block][row]`).
pub const fn smem_bytes(act: Activation, m: u32, chunks: u32, split: u32) -> u32 {
    let rows = staged_rows(m);
    let scales = match act {
        Activation::E4m3Row128 => 4 * rows * staged_scale_blocks(chunks, split),
        _ => 0,
    };
    rows * staged_row_bytes(chunks, split) + scales
}

/// [`smem_bytes`] of whichever activation format needs more: for checks made before the format
/// is known (a configuration's validation, the split heuristic).
pub const fn smem_bytes_any(m: u32, chunks: u32, split: u32) -> u32 {
    let (a, b) = (
        smem_bytes(Activation::Bf16, m, chunks, split),
        smem_bytes(Activation::E4m3Row128, m, chunks, split),
    );
    if a > b { a } else { b }
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
    use crate::entry::Named;
    use crate::gemm::epilogue::{Output, store_transposed};
    use crate::ptx::bits::prmt;
    use crate::ptx::convert::e4m3x2_to_f16x2;
    use crate::ptx::{global, mma, smem, thread};
    use crate::sm90_mx::MMA_K;
    use crate::sm90_mx::dequant::ScaleDecode;
    use crate::sm90_w4::GROUP_ROWS;
    use crate::sm90_w4::{
        A8_SCALE_K, Activation, a8_stage_selector, warp_fragments, weight_fragments_e4m3,
    };

    /// One chunk of a thread's two weight rows as loaded: their fragment bytes and scale bytes.
    #[derive(Clone, Copy, Default)]
    pub(crate) struct Chunk {
        w: [[u32; 2]; 2],
        s: [u32; 2],
    }

    /// A thread's sums: per n8 tile of activation rows and parity of the K step (two chains of
    /// dependent MMAs or adds per tile, not one, so that each waits for half as many), the
    /// `mma` C fragment.
    pub(crate) type Sums = [[[f32; 4]; 2]; 2];

    /// Where a CTA's staged activations are: row `r` at `xs + r · stride`, chunks from `c0`;
    /// W4A8 scales at `scales` (`[block − first block][row]` f32, `rows` per block).
    #[derive(Clone, Copy)]
    pub(crate) struct Staged {
        xs: u32,
        stride: u32,
        c0: u32,
        scales: u32,
        rows: u32,
    }

    /// The activations' format: how a CTA stages them and how a warp multiplies a chunk.
    pub(crate) trait StreamAct {
        /// Copies activation rows `0..st.rows` (zeros past `m`) of chunks `c0..c1` into shared
        /// memory, with the 256 threads of the CTA (`tid`).
        /// # Safety
        /// As [`stream`]; the staged bytes ([`super::smem_bytes`]) are this CTA's.
        unsafe fn stage<S: ScaleDecode>(p: &W4StreamParams, st: &Staged, c1: u32, tid: u32);
        /// Adds chunk `at`'s products of this thread's two weight rows (`chunk = (cur, at)`) with
        /// the staged rows to `acc`; `lane = (g, t)` = (lane / 4, lane % 4).
        /// # Safety
        /// Chunk `at` of the range is staged.
        unsafe fn chunk<S: ScaleDecode, const NT: usize>(
            acc: &mut Sums,
            chunk: (&Chunk, u32),
            st: &Staged,
            lane: (u32, u32),
        );
    }

    /// bf16 activations (W4A16).
    pub(crate) struct Bf16;
    /// e4m3 activations with fp32 scales per 1×128 (W4A8).
    pub(crate) struct E4m3Row128;

    /// The activations' format named by its [`Activation`] value `A` (`as u32`), for the kernel
    /// table ([`crate::entry::Named`]).
    pub(crate) struct ActOf<const A: u32>;

    impl Named for ActOf<{ Activation::Bf16 as u32 }> {
        type T = Bf16;
    }

    impl Named for ActOf<{ Activation::E4m3Row128 as u32 }> {
        type T = E4m3Row128;
    }

    /// # Safety
    /// `p` describes live buffers as [`W4StreamParams`] says, `1 ≤ split ≤ chunks`,
    /// `1 ≤ m ≤ MAX_M`, `k` a multiple of 8 (bf16) or 16 (e4m3) and of the scale block; launched
    /// with [`THREADS`] threads, a grid of `⌈n / ROWS⌉ × split × l` and [`super::smem_bytes`]
    /// of dynamic shared memory; with `split > 1`, `splitk` is [`super::workspace`]'s, its
    /// counters zero.
    #[inline(always)]
    pub(crate) unsafe fn stream<A: StreamAct, S: ScaleDecode>(p: &W4StreamParams) {
        // SAFETY: the caller's contract.
        unsafe {
            if p.m > 8 {
                run::<A, S, 2>(p)
            } else {
                run::<A, S, 1>(p)
            }
        }
    }

    /// [`stream`] with `NT` `mma` n8 tiles of activation rows.
    #[inline(always)]
    unsafe fn run<A: StreamAct, S: ScaleDecode, const NT: usize>(p: &W4StreamParams) {
        let (tile, part, l) = (thread::block_x(), thread::block_y(), thread::block_z());
        let tid = thread::thread_x();
        let warp = thread::warp_uniform(tid / 32);
        let (g, t) = ((tid % 32) / 4, tid % 4);
        // (At least 1 as the compiler can see: no panic path for the divisions by it.)
        let split = p.split.max(1);
        let (c0, c1) = super::part_range(p.chunks, split, part);
        let rows_staged = 8 * NT as u32;
        let stride = super::staged_row_bytes(p.chunks, split);
        let xs = smem::dynamic_base();
        let st = Staged {
            xs,
            stride,
            c0,
            scales: xs + rows_staged * stride,
            rows: rows_staged,
        };
        let w_scales = CHUNK_K / S::BLOCK;
        // This thread's two weight rows (clamped inside the matrix: rows past N are read but
        // never stored).
        let first = tile * ROWS + 16 * warp + g;
        // Its stored group of 16 rows (the last group that exists where the tile runs past N:
        // rows past N are read but never stored), in which rows g and g + 8 are 8 rows apart.
        let group = ((tile * ROWS) / GROUP_ROWS + warp).min(p.n.div_ceil(GROUP_ROWS) - 1);
        let row = group * GROUP_ROWS + g;
        // Where row g's next chunk to load is: the stored codes (`stored_chunk`: a group's
        // chunks 512 bytes apart) and its scale bytes (one chunk's scales `rows_pad` rows
        // apart); row g + 8's are a fixed offset on, so each load takes it as an immediate.
        let w_step = (GROUP_ROWS * CHUNK_BYTES) as u64;
        let s_step = p.rows_pad as u64 * w_scales as u64;
        let mut w_at = p.w + super::super::stored_chunk(l, row, c0, p.n, p.chunks) + 8 * t as u64;
        let mut s_at = p.sfw
            + ((l as u64 * p.chunks as u64 + c0 as u64) * p.rows_pad as u64 + row as u64)
                * w_scales as u64;
        let mut load_next = || -> Chunk {
            let mut ch = Chunk::default();
            for h in 0..2usize {
                let (w, s) = (
                    w_at + (h as u32 * 8 * CHUNK_BYTES) as u64,
                    s_at + (h as u32 * 8 * w_scales) as u64,
                );
                // SAFETY: rows g and g + 8 of a stored group (whole, padded with zero rows) and
                // chunks < c1 ≤ chunks (the callers load chunks c0, c0 + 1, … below c1 only):
                // inside the stored codes (8-byte aligned) and the scale layout (rows_pad ≥ the
                // groups' rows; aligned to its `w_scales` bytes).
                unsafe {
                    ch.w[h] = global::load_u32x2_stream(w);
                    ch.s[h] = if w_scales == 2 {
                        global::load_u16_nc(s) as u32
                    } else {
                        global::load_u32_nc(s)
                    };
                }
            }
            w_at += w_step;
            s_at += s_step;
            ch
        };
        // The first chunks' loads go out before the activations are staged.
        let mut ahead = [Chunk::default(); DEPTH];
        for i in 0..DEPTH {
            if c0 + (i as u32) < c1 {
                ahead[i] = load_next();
            }
        }
        // SAFETY: the staged rows (and scales) fit the launch's shared memory (`smem_bytes`).
        unsafe { A::stage::<S>(p, &st, c1, tid) };
        thread::sync_block();

        // (Index loops over arrays of constant size, which the compiler unrolls and keeps in
        // registers.)
        let mut acc: Sums = [[[0f32; 4]; 2]; 2];
        let mut c = c0;
        while c < c1 {
            for i in 0..DEPTH {
                let cur = ahead[i];
                let at = c + i as u32;
                if at < c1 {
                    // SAFETY: chunk `at` of this range is staged.
                    unsafe { A::chunk::<S, NT>(&mut acc, (&cur, at), &st, (g, t)) };
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

    impl StreamAct for Bf16 {
        /// In 16-byte units of 8 values, shared over the CTA's threads.
        #[inline(always)]
        unsafe fn stage<S: ScaleDecode>(p: &W4StreamParams, st: &Staged, c1: u32, tid: u32) {
            let per_row = ((c1 - st.c0) * CHUNK_K / 8).max(1);
            strided(st.rows * per_row, tid, |u| {
                let (r, q) = (u / per_row, u % per_row);
                let kx = st.c0 * CHUNK_K + 8 * q;
                let v = if r < p.m && kx < p.k {
                    let at = p.x + 2 * (row_start(p, r) + kx as u64);
                    // SAFETY: 8 bf16 of row r < m from column kx < k (k % 8 == 0), 16-byte
                    // aligned.
                    unsafe { global::load_f32x4(at) }.map(f32::to_bits)
                } else {
                    [0; 4]
                };
                // SAFETY: the caller's contract.
                unsafe { smem::store_u32x4(st.xs + r * st.stride + 16 * q, v) };
            });
        }

        /// The chunk's bf16 fragments (codes times scales, exact) into `mma` m16n8k16.
        #[inline(always)]
        unsafe fn chunk<S: ScaleDecode, const NT: usize>(
            acc: &mut Sums,
            (cur, at): (&Chunk, u32),
            st: &Staged,
            (g, t): (u32, u32),
        ) {
            let [frags] = warp_fragments::<S, 1>([cur.w], |_, h, kk| {
                (cur.s[h] >> (8 * (kk * MMA_K / S::BLOCK))) & 0xFF
            });
            for kk in 0..4 {
                let col = (at - st.c0) * CHUNK_K + kk as u32 * MMA_K + 2 * t;
                for j in 0..NT {
                    let x = st.xs + (8 * j as u32 + g) * st.stride + 2 * col;
                    // SAFETY: staged row 8j + g, columns col and col + 8 of this range.
                    let b = unsafe { [smem::load_u32(x), smem::load_u32(x + 16)] };
                    mma::m16n8k16_bf16(&mut acc[j][kk % 2], frags[kk], b);
                }
            }
        }
    }

    impl StreamAct for E4m3Row128 {
        /// One chunk of one row per unit: its 64 codes loaded as four 16-byte words, converted
        /// to fp16 (exact) and stored in the order the fragments read them (thread t's 32
        /// bytes at 32t, [`e4m3_b_words`]); then the rows' scales of the 128-K blocks the range
        /// touches.
        #[inline(always)]
        unsafe fn stage<S: ScaleDecode>(p: &W4StreamParams, st: &Staged, c1: u32, tid: u32) {
            let per_row = c1 - st.c0;
            strided(st.rows * per_row, tid, |u| {
                let (r, q) = (u / per_row, u % per_row);
                let k0 = (st.c0 + q) * CHUNK_K;
                let row = p.x + row_start(p, r);
                // The chunk's four 16-byte words (zeros past K: k is a multiple of 16).
                let word = |i: u32| -> [u32; 4] {
                    if r < p.m && k0 + 16 * i < p.k {
                        // SAFETY: 16 codes of row r < m from column k0 + 16i < k, 16-byte
                        // aligned (k % 16 == 0).
                        unsafe { global::load_f32x4(row + (k0 + 16 * i) as u64) }.map(f32::to_bits)
                    } else {
                        [0; 4]
                    }
                };
                let v = [word(0), word(1), word(2), word(3)];
                for tt in 0..4u32 {
                    for s in 0..2usize {
                        // Thread tt's e4m3 words of step s (registers 0 and 1), from the step's
                        // 16-byte halves 2s and 2s + 1.
                        let w = |reg: u32| {
                            let qq = (2 * reg + tt / 2) as usize;
                            prmt(v[2 * s][qq], v[2 * s + 1][qq], a8_stage_selector(tt))
                        };
                        let out = e4m3_b_words::<S>([w(0), w(1)]);
                        let at = st.xs + r * st.stride + q * 2 * CHUNK_K + 32 * tt + 16 * s as u32;
                        // SAFETY: the caller's contract; row r < rows, chunk q of the range.
                        unsafe { smem::store_u32x4(at, out) };
                    }
                }
            });
            let (b0, b1) = (st.c0 / 2, (c1 - 1) / 2 + 1);
            strided(st.rows * (b1 - b0), tid, |u| {
                let (b, r) = (b0 + u / st.rows, u % st.rows);
                let v = if r < p.m {
                    let blocks = p.k.div_ceil(A8_SCALE_K) as u64;
                    let at = p.sx
                        + 4 * ((thread::block_z() as u64 * blocks + b as u64) * p.sx_rows as u64
                            + r as u64);
                    // SAFETY: row r < m ≤ sx_rows of block b < ⌈k / 128⌉.
                    unsafe { global::load_f32_nc(at) }
                } else {
                    0.0
                };
                // SAFETY: the caller's contract (`staged_scale_blocks` blocks of `rows`).
                unsafe { smem::store_u32(st.scales + 4 * u, v.to_bits()) };
            });
        }

        /// Per step of 32 K (two a chunk): two fp16 `mma` m16n8k16 of the weights' e4m3 bytes
        /// converted to fp16 (exact) with the staged activations, into a fresh sum per scale
        /// block (the step's, or each of its two 16-K blocks, one `mma` each), added times the
        /// weight row's scale and the activation row's.
        #[inline(always)]
        unsafe fn chunk<S: ScaleDecode, const NT: usize>(
            acc: &mut Sums,
            (cur, at): (&Chunk, u32),
            st: &Staged,
            (g, t): (u32, u32),
        ) {
            let sw = |h: usize, block: u32| {
                f32::from_bits(S::x2((cur.s[h] >> (8 * block)) & 0xFF) << 16)
            };
            // Per step, the A fragments of its two MMAs.
            let frags = weight_fragments_e4m3(cur.w).map(|f| {
                let f = f.map(split_order::<S>);
                [
                    f.map(|w| e4m3x2_to_f16x2(w as u16)),
                    f.map(|w| e4m3x2_to_f16x2((w >> 16) as u16)),
                ]
            });
            let blk = (at / 2 - st.c0 / 2) * st.rows;
            for j in 0..NT {
                let row = 8 * j as u32;
                let x = st.xs + (row + g) * st.stride + (at - st.c0) * 2 * CHUNK_K + 32 * t;
                // SAFETY: chunk at of staged row row + g; scales of rows row + 2t, + 1.
                let (xw, sa) = unsafe {
                    (
                        [smem::load_u32x4(x), smem::load_u32x4(x + 16)],
                        smem::load_u32x2(st.scales + 4 * (blk + row + 2 * t)),
                    )
                };
                let sa = sa.map(f32::from_bits);
                let mut add = |s: usize, block: u32, d: [f32; 4]| {
                    let (s0, s1) = (sw(0, block), sw(1, block));
                    let sc = [s0 * sa[0], s0 * sa[1], s1 * sa[0], s1 * sa[1]];
                    for e in 0..4 {
                        acc[j][s][e] = core::f32::math::mul_add(d[e], sc[e], acc[j][s][e]);
                    }
                };
                for s in 0..2usize {
                    let b = [[xw[s][0], xw[s][1]], [xw[s][2], xw[s][3]]];
                    if S::BLOCK == 32 {
                        let mut d = [0f32; 4];
                        mma::m16n8k16_f16(&mut d, frags[s][0], b[0]);
                        mma::m16n8k16_f16(&mut d, frags[s][1], b[1]);
                        add(s, s as u32, d);
                    } else {
                        for h in 0..2usize {
                            let mut d = [0f32; 4];
                            mma::m16n8k16_f16(&mut d, frags[s][h], b[h]);
                            add(s, 2 * s as u32 + h as u32, d);
                        }
                    }
                }
            }
        }
    }

    /// A word of 4 e4m3 bytes (K in the order of [`crate::sm90_w4::a8_k`]: bytes 0 and 2 in the
    /// step's first 16 K, 1 and 3 in its second) reordered so that its low half and its high
    /// half each become one fp16 pair of an `mma` m16n8k16: for 16-K scale blocks, a block per
    /// half (bytes 0, 2 | 1, 3); for 32-K blocks, as it is.
    #[inline(always)]
    fn split_order<S: ScaleDecode>(w: u32) -> u32 {
        if S::BLOCK == 32 {
            w
        } else {
            prmt(w, 0, 0x3120)
        }
    }

    /// Thread t's four staged fp16 words of one step from its e4m3 words of registers 0 and 1
    /// ([`split_order`] each): the B fragments of the step's first `mma` (both low halves), then
    /// of its second (both high halves).
    #[inline(always)]
    fn e4m3_b_words<S: ScaleDecode>(w: [u32; 2]) -> [u32; 4] {
        let w = w.map(split_order::<S>);
        [
            e4m3x2_to_f16x2(w[0] as u16),
            e4m3x2_to_f16x2(w[1] as u16),
            e4m3x2_to_f16x2((w[0] >> 16) as u16),
            e4m3x2_to_f16x2((w[1] >> 16) as u16),
        ]
    }

    /// `f(u)` for the units `u < count` that are thread `tid`'s of the CTA's: `tid`, then every
    /// [`THREADS`]th.
    #[inline(always)]
    fn strided(count: u32, tid: u32, mut f: impl FnMut(u32)) {
        let mut u = tid;
        while u < count {
            f(u);
            u += THREADS;
        }
    }

    /// The offset in elements of activation row `r` of this CTA's batch entry.
    #[inline(always)]
    fn row_start(p: &W4StreamParams, r: u32) -> u64 {
        (thread::block_z() as u64 * p.m as u64 + r as u64) * p.k as u64
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
        for (chunks, split) in [(64, 7), (112, 9), (1, 1), (256, 4), (63, 2)] {
            let words = staged_row_bytes(chunks, split) / 4;
            // bf16: rows g = 0..8, word t = 0..4 of a B fragment: 32 distinct banks.
            let mut banks: [bool; 32] = [false; 32];
            for g in 0..8 {
                for t in 0..4 {
                    banks[((g * words + t) % 32) as usize] = true;
                }
            }
            assert!(banks.iter().all(|&b| b), "{chunks} / {split}");
            // W4A8's fp16: each shared-memory phase of 16-byte reads (lanes 8p..8p + 8: rows
            // 2p, 2p + 1, t = 0..4, at 32t and 32t + 16) covers 32 distinct banks.
            for second in 0..2 {
                for phase in 0..4 {
                    let mut banks: [bool; 32] = [false; 32];
                    for lane in 8 * phase..8 * phase + 8 {
                        let (g, t) = (lane / 4, lane % 4);
                        for w in 0..4 {
                            banks[((g * words + 8 * t + 4 * second + w) % 32) as usize] = true;
                        }
                    }
                    assert!(banks.iter().all(|&b| b), "{chunks} / {split}");
                }
            }
        }
        for act in [Activation::Bf16, Activation::E4m3Row128] {
            assert!(smem_bytes(act, 16, 64, 1) <= crate::gemm::layout::SMEM_LIMIT);
        }
    }

    /// The scale blocks staged cover every range's: chunks c0..c1 touch blocks c0/2..=(c1−1)/2.
    #[test]
    fn every_range_touches_at_most_the_staged_scale_blocks() {
        for chunks in 1..100 {
            for split in 1..=chunks.min(20) {
                for part in 0..split {
                    let (c0, c1) = part_range(chunks, split, part);
                    assert!((c1 - 1) / 2 - c0 / 2 < staged_scale_blocks(chunks, split));
                }
            }
        }
    }

    #[test]
    fn every_activation_and_scale_format_has_its_stream_kernel() {
        for act in [Activation::Bf16, Activation::E4m3Row128] {
            assert!(takes(act));
            let name = match act {
                Activation::Bf16 => "bf16",
                _ => "e4m3r128",
            };
            for s in [MxScale::E8M0X32, MxScale::UE4M3X16, MxScale::E8M0X16] {
                let k = kernel(act, s).unwrap();
                assert_eq!(
                    k.info.name,
                    std::format!("sm90_w4_stream_{name}_e2m1_{}x{}", s.ty.name(), s.block)
                );
                assert_eq!(k.info.min_blocks_per_sm, MIN_BLOCKS);
            }
        }
        assert!(!takes(Activation::Fp4));
        assert_eq!(KERNELS.len(), 6);
    }
}
