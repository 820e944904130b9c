//! The MX → FP8 pre-pass: re-encodes an MXFP8 / MXFP4 (or e2m1 with e8m0 per 16) operand as an
//! FP8 operand with fp32 scales per 1×128 (the A role) or per row over all of K (the B role: a
//! scale per column of C, which the FP8 kernel multiplies in after its K loop), the operands the
//! Hopper FP8 kernel ([`crate::sm90`]) takes. B is not grouped per 128 × 128 as DeepSeek weights
//! are: MX rows may differ by any power of two, and one group scale for 128 of them would push
//! the smaller rows' codes below the FP8 range. The element rule is [`crate::format::fold`]
//! (shared with the host's reference); this is the memory-bound SIMT kernel that applies it.
//!
//! One block of [`FOLD_THREADS`] threads per 128 rows × 128 K of one batch entry:
//! 1. thread `t` takes row `t`'s largest non-NaN e8m0 code: of the chunk's scale bytes (A role;
//!    from the MX kernels' scale layout, already on the device), or over all of K (B role; made
//!    at upload);
//! 2. it writes the fp32 group scale `2^(r − 127 − headroom)` (exact: r ≤ 254, headroom ≤ 6);
//! 3. each warp converts rows with coalesced 4-byte loads (4 FP8 or 8 e2m1 codes per lane) and
//!    4- or 8-byte stores.

use crate::format::ElemType;
use crate::registry::KernelInfo;

/// Threads per block: one per row of the 128-row group.
pub const FOLD_THREADS: u32 = 128;
/// K per block: one fp32 scale group of the FP8 kernel (its `BLOCK_K`).
pub const FOLD_K: u32 = 128;
/// Rows per block.
pub const FOLD_ROWS: u32 = 128;
/// Dynamic shared memory: one u32 per row (its largest scale code).
pub const FOLD_SMEM: u32 = 4 * FOLD_ROWS;

/// Parameters of one fold launch (grid: `k / 128` × `⌈rows / 128⌉` × `l`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FoldParams {
    /// Codes `[l][rows][k]` (e2m1: two per byte, low nibble first).
    pub src: u64,
    /// e8m0 scale bytes in the MX kernels' layout `[l][k / 64][rows_pad][64 / block]`.
    pub scales: u64,
    /// Folded FP8 codes `[l][rows][k]`.
    pub dst: u64,
    /// fp32 scales: A role `[l][k / 128][m_pad]`; B role `[l][rows]`.
    pub dst_scales: u64,
    /// B role: each row's largest non-NaN e8m0 code over all of K, `[l][rows_pad]` bytes.
    pub row_tops: u64,
    pub rows: u32,
    pub k: u32,
    /// Rows of `scales` (a multiple of 128 ≥ rows).
    pub rows_pad: u32,
    /// Rows of the A-role scale layout (≥ rows); unused for B.
    pub m_pad: u32,
    /// 0: the A role (a scale per row and 128 of K); 1: the B role (per row over all of K).
    pub b_role: u32,
    pub _pad: u32,
}

/// One fold kernel: the element type it reads and its e8m0 scale block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FoldKernel {
    pub elem: ElemType,
    pub block: u32,
    pub info: KernelInfo,
}

macro_rules! fold_kernels {
    ($(($name:literal, $elem:ident, $block:literal)),*) => {
        /// Every fold kernel (the registry's rows).
        pub const KERNELS: &[FoldKernel] = &[$(FoldKernel {
            elem: ElemType::$elem,
            block: $block,
            info: KernelInfo {
                name: $name,
                max_threads: Some(FOLD_THREADS),
                min_blocks_per_sm: 1,
                targets: &["sm_90a"],
            },
        }),*];
        #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
        mod entries {
            use super::FoldParams;
            use crate::format::ElemType;
            $(const _: () = {
                /// # Safety
                /// As [`super::device::fold`].
                #[unsafe(export_name = $name)]
                unsafe extern "ptx-kernel" fn kernel(p: FoldParams) {
                    // SAFETY: the launch's contract.
                    unsafe { crate::fold::device::fold::<{ ElemType::$elem as u32 }, $block>(&p) }
                }
            };)*
        }
    };
}

fold_kernels! {
    ("fold_fp8_e4m3_e8m0x32", E4M3, 32),
    ("fold_fp8_e5m2_e8m0x32", E5M2, 32),
    ("fold_fp8_e2m1_e8m0x32", E2M1, 32),
    ("fold_fp8_e2m1_e8m0x16", E2M1, 16)
}

/// The fold kernel for `elem` codes with e8m0 scales per `block`.
pub fn kernel(elem: ElemType, block: u32) -> Option<&'static FoldKernel> {
    KERNELS.iter().find(|k| k.elem == elem && k.block == block)
}

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
mod device {
    use super::{FOLD_K, FOLD_ROWS, FoldParams};
    use crate::format::fold::{self, NAN};
    use crate::format::{ElemType, pow2};
    use crate::ptx::{bits, global, smem, thread};

    /// K of one stage of the MX kernels' scale layout.
    const SCALE_STAGE_K: u32 = 64;
    /// The e8m0 NaN code.
    const SCALE_NAN: u32 = 0xFF;

    /// # Safety
    /// `p` describes live buffers: `src` of `l·rows·k` codes, `scales` of
    /// `l·(k/64)·rows_pad·(64/BLOCK)` bytes, `dst` of `l·rows·k` bytes and `dst_scales` of the
    /// role's layout; `k % 128 == 0`, `rows_pad ≥ ⌈rows/128⌉·128`; launched with
    /// `FOLD_THREADS` threads, [`super::FOLD_SMEM`] bytes of shared memory and a grid of
    /// `k/128` × `⌈rows/128⌉` × `l`.
    #[inline(always)]
    pub(crate) unsafe fn fold<const E: u32, const BLOCK: u32>(p: &FoldParams) {
        let elem = match E {
            0 => ElemType::E4M3,
            1 => ElemType::E5M2,
            _ => ElemType::E2M1,
        };
        let (c, rb, li) = (thread::block_x(), thread::block_y(), thread::block_z());
        let t = thread::thread_x();
        let refs = smem::dynamic_base();
        let per_stage = SCALE_STAGE_K / BLOCK;
        let stages = (p.k / SCALE_STAGE_K) as u64;
        // Scale byte `i` (of the chunk's 128 / BLOCK) of row `r`: inside the padded layout for
        // every r < rows_pad, zero past the rows.
        let scale = |r: u32, i: u32| -> u32 {
            let j = (2 * c + i / per_stage) as u64;
            let at = ((li as u64 * stages + j) * p.rows_pad as u64 + r as u64) * per_stage as u64
                + (i % per_stage) as u64;
            // SAFETY: the launch's contract (r < rows_pad, j < k / 64).
            unsafe { *(p.scales as *const u8).add(at as usize) as u32 }
        };
        // 1. The row's largest non-NaN scale code (zero rows past the end do not raise it).
        let r = rb * FOLD_ROWS + t;
        let b_role = p.b_role != 0;
        let top = if b_role {
            // SAFETY: r < rows_pad bytes of batch entry li (the launch's contract).
            unsafe {
                *(p.row_tops as *const u8).add(li as usize * p.rows_pad as usize + r as usize)
                    as u32
            }
        } else {
            let mut top = 0;
            for i in 0..FOLD_K / BLOCK {
                let s = scale(r, i);
                if s != SCALE_NAN && s > top {
                    top = s;
                }
            }
            top
        };
        // SAFETY: word t of the block's FOLD_SMEM bytes, read only after the barrier.
        unsafe { smem::store_u32(refs + 4 * t, top) };
        thread::sync_block();
        // 2. The fp32 scale of the row's chunk (A) or of the row (B, once: by chunk 0's block).
        let v = pow2(top as i32 - 127 - fold::headroom(elem)).to_bits();
        if b_role {
            let at = li as u64 * p.rows as u64 + r as u64;
            // SAFETY: inside the B-role layout when r < rows.
            unsafe { global::store_u32_if(p.dst_scales + 4 * at, v, c == 0 && r < p.rows) };
        } else {
            let at = (li as u64 * (p.k / FOLD_K) as u64 + c as u64) * p.m_pad as u64 + r as u64;
            // SAFETY: inside the A-role layout when r < rows ≤ m_pad.
            unsafe { global::store_u32_if(p.dst_scales + 4 * at, v, r < p.rows) };
        }
        // 3. The codes. A lane's 4 or 8 codes share one scale (blocks of 16 or 32, aligned), so
        // one shift from it and its row's largest code; None for a NaN scale. Each group of
        // steps loads all its words before it stores any (a store could alias a later load for
        // all the compiler knows, which would serialize their latencies).
        let shift = |row: u32, kk: u32| -> Option<u32> {
            // SAFETY: word `row` of the shared refs (row < 128), written before the barrier.
            let top = unsafe { smem::load_u32(refs + 4 * row) };
            let s = scale(rb * FOLD_ROWS + row, kk / BLOCK);
            (s != SCALE_NAN).then(|| top - s)
        };
        let (warp, lane) = (t / 32, t % 32);
        let row_at = |row: u32| {
            (li as u64 * p.rows as u64 + (rb * FOLD_ROWS + row) as u64) * p.k as u64
                + (c * FOLD_K) as u64
        };
        // e2m1: two rows per warp step (lanes 0–15 and 16–31), 8 codes (4 bytes) per lane; FP8:
        // one row per step, 4 codes per lane.
        let fp4 = elem == ElemType::E2M1;
        let (rows_per_step, kk) = if fp4 {
            (2, 8 * (lane % 16))
        } else {
            (1, 4 * lane)
        };
        let row_of = |i: u32| rows_per_step * (warp + 4 * i) + if fp4 { lane / 16 } else { 0 };
        let steps = FOLD_ROWS / (4 * rows_per_step);
        for g in 0..steps / GROUP {
            let mut words = [0u32; GROUP as usize];
            for (j, w) in words.iter_mut().enumerate() {
                let row = row_of(g * GROUP + j as u32);
                if rb * FOLD_ROWS + row < p.rows {
                    let at = row_at(row) + kk as u64;
                    let src = if fp4 { p.src + at / 2 } else { p.src + at };
                    // SAFETY: 4 bytes of a row < rows (4-byte aligned: k % 128 == 0).
                    *w = unsafe { *(src as *const u32) };
                }
            }
            for (j, &w) in words.iter().enumerate() {
                let row = row_of(g * GROUP + j as u32);
                let valid = rb * FOLD_ROWS + row < p.rows;
                let at = row_at(row) + kk as u64;
                let d = shift(row, kk);
                if fp4 {
                    let (lo, hi) = match d {
                        Some(d) => {
                            let [t0, t1] = fold::e2m1_table(d);
                            let four = |x: u32| {
                                bits::prmt(t0, t1, x & 0x7777)
                                    | bits::prmt(fold::E2M1_SIGN_TABLE, 0, (x >> 3) & 0x1111)
                            };
                            (four(w), four(w >> 16))
                        }
                        None => (NAN * 0x0101_0101, NAN * 0x0101_0101),
                    };
                    // SAFETY: 8 bytes of the same row of dst (8-byte aligned).
                    unsafe { global::store_u32x2_if(p.dst + at, lo, hi, valid) };
                } else {
                    let out = match d {
                        Some(d) => {
                            let b = |j: u32| fold::fold8(elem, (w >> (8 * j)) & 0xFF, d) << (8 * j);
                            b(0) | b(1) | b(2) | b(3)
                        }
                        None => NAN * 0x0101_0101,
                    };
                    // SAFETY: 4 bytes of the same row of dst.
                    unsafe { global::store_u32_if(p.dst + at, out, valid) };
                }
            }
        }
    }

    /// Warp steps whose loads are issued together.
    const GROUP: u32 = 8;
}

const _: () = {
    // The fold's K groups are the FP8 kernel's scale blocks.
    assert!(FOLD_K == crate::sm90::BLOCK_K);
    assert!(FOLD_ROWS == FOLD_THREADS);
};
