//! The MX / NVFP4 → FP8 pre-pass: re-encodes an MXFP8 / MXFP4 / NVFP4 (or e2m1 with e8m0 per 16)
//! operand as an FP8 operand with fp32 scales per 1×128 (the A role) or per row over all of K
//! (the B role: a scale per column of C, which the FP8 kernel multiplies in after its K loop), the
//! operands the Hopper FP8 kernel ([`crate::sm90`]) takes. B is not grouped per 128 × 128 as
//! DeepSeek weights are: MX rows may differ by any power of two, and one group scale for 128 of
//! them would push the smaller rows' codes below the FP8 range. The element rules are
//! [`crate::format::fold`] (shared with the host's reference); this is the memory-bound SIMT
//! kernel that applies them.
//!
//! One block of [`FOLD_THREADS`] threads per 128 rows × 128 K of one batch entry:
//! 1. thread `t` takes row `t`'s largest non-NaN scale code: of the chunk's scale bytes (A role;
//!    from the MX kernels' scale layout, already on the device), or over all of K (B role; made
//!    at upload);
//! 2. it writes the fp32 group scale (e8m0: `2^(r − 127 − headroom)`; ue4m3:
//!    `2^(E − 5)`), times the operand's fp32 tensor scale (NVFP4; else 1);
//! 3. each half-warp converts a row with coalesced loads of 8 codes per lane (4 bytes of e2m1, 8
//!    of FP8) and 8-byte stores: e2m1 through a `prmt` byte table per scale block, FP8 four codes
//!    per integer subtraction.

use crate::format::ElemType;
use crate::format::MxScale;
use crate::kernel_info::KernelInfo;

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
    /// Scale bytes (e8m0 or ue4m3) in the MX kernels' layout `[l][k / 64][rows_pad][64 / block]`.
    pub scales: u64,
    /// Folded FP8 codes `[l][rows][k]`.
    pub dst: u64,
    /// fp32 scales: A role `[l][k / 128][m_pad]`; B role `[l][rows]`.
    pub dst_scales: u64,
    /// B role: each row's largest non-NaN scale code over all of K, `[l][rows_pad]` bytes.
    pub row_tops: u64,
    pub rows: u32,
    pub k: u32,
    /// Rows of `scales` (a multiple of 128 ≥ rows).
    pub rows_pad: u32,
    /// Rows of the A-role scale layout (≥ rows); unused for B.
    pub m_pad: u32,
    /// 0: the A role (a scale per row and 128 of K); 1: the B role (per row over all of K).
    pub b_role: u32,
    /// Multiplies every fp32 scale written: the operand's tensor scale (NVFP4), else 1.
    pub tensor_scale: f32,
}

/// One fold kernel: the element type it reads and its scale format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FoldKernel {
    pub elem: ElemType,
    pub scale: MxScale,
    pub info: KernelInfo,
}

impl FoldKernel {
    /// The row of the kernel `name` for `elem` codes with scales `scale`.
    pub const fn new(name: &'static str, elem: ElemType, scale: MxScale) -> Self {
        FoldKernel {
            elem,
            scale,
            info: KernelInfo::sm90(name, FOLD_THREADS),
        }
    }
}

crate::entry::kernel_table! {
    /// # Safety
    /// As [`device::fold`].
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
    unsafe extern "ptx-kernel" fn |K| {
        call(FoldParams) => device::fold::<
            { K.elem as u32 },
            { K.scale.block },
            { matches!(K.scale.ty, crate::format::ScaleType::UE4M3) },
        >;
    }

    /// Every fold kernel (the registry's rows).
    pub const KERNELS: &[FoldKernel] = FoldKernel::new [
        call("fold_fp8_e4m3_e8m0x32", ElemType::E4M3, MxScale::E8M0X32),
        call("fold_fp8_e5m2_e8m0x32", ElemType::E5M2, MxScale::E8M0X32),
        call("fold_fp8_e2m1_e8m0x32", ElemType::E2M1, MxScale::E8M0X32),
        call("fold_fp8_e2m1_e8m0x16", ElemType::E2M1, MxScale::E8M0X16),
        call("fold_fp8_e2m1_ue4m3x16", ElemType::E2M1, MxScale::UE4M3X16),
    ];
}

/// The fold kernel for `elem` codes with scales `scale`.
pub fn kernel(elem: ElemType, scale: MxScale) -> Option<&'static FoldKernel> {
    KERNELS.iter().find(|k| k.elem == elem && k.scale == scale)
}

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
mod device {
    use super::{FOLD_K, FOLD_ROWS, FoldParams};
    use crate::format::fold::{self, NAN};
    use crate::format::{ElemType, pow2};
    use crate::ptx::{bits, convert, global, smem, thread};

    /// K of one stage of the MX kernels' scale layout.
    const SCALE_STAGE_K: u32 = 64;

    /// # Safety
    /// `p` describes live buffers: `src` of `l·rows·k` codes, `scales` of
    /// `l·(k/64)·rows_pad·(64/BLOCK)` bytes, `dst` of `l·rows·k` bytes and `dst_scales` of the
    /// role's layout; `k % 128 == 0`, `rows_pad ≥ ⌈rows/128⌉·128`; launched with
    /// `FOLD_THREADS` threads, [`super::FOLD_SMEM`] bytes of shared memory and a grid of
    /// `k/128` × `⌈rows/128⌉` × `l`. `NV`: ue4m3 scales (else e8m0).
    #[inline(always)]
    pub(crate) unsafe fn fold<const E: u32, const BLOCK: u32, const NV: bool>(p: &FoldParams) {
        let elem = match E {
            0 => ElemType::E4M3,
            1 => ElemType::E5M2,
            _ => ElemType::E2M1,
        };
        let is_nan = |s: u32| {
            if NV { fold::ue4m3_is_nan(s) } else { s == 0xFF }
        };
        let (c, rb, li) = (thread::block_x(), thread::block_y(), thread::block_z());
        let t = thread::thread_x();
        let refs = smem::dynamic_base();
        let per_stage = SCALE_STAGE_K / BLOCK;
        let stages = (p.k / SCALE_STAGE_K) as u64;
        // Scale byte `i` (of the chunk's 128 / BLOCK) of row `r` (ue4m3: sign bit cleared):
        // inside the padded layout for every r < rows_pad, zero past the rows.
        let scale = |r: u32, i: u32| -> u32 {
            let j = (2 * c + i / per_stage) as u64;
            let at = ((li as u64 * stages + j) * p.rows_pad as u64 + r as u64) * per_stage as u64
                + (i % per_stage) as u64;
            // SAFETY: the launch's contract (r < rows_pad, j < k / 64).
            let s = unsafe { *(p.scales as *const u8).add(at as usize) as u32 };
            if NV { s & 0x7F } else { s }
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
                if !is_nan(s) && s > top {
                    top = s;
                }
            }
            top
        };
        // The group's binade: e8m0 keeps its code (the shift is a difference of codes), ue4m3
        // its exponent.
        let group = if NV {
            fold::nv_group_exp(top) as u32
        } else {
            top
        };
        // SAFETY: word t of the block's FOLD_SMEM bytes, read only after the barrier.
        unsafe { smem::store_u32(refs + 4 * t, group) };
        thread::sync_block();
        // 2. The fp32 scale of the row's chunk (A) or of the row (B, once: by chunk 0's block).
        let unit = if NV {
            fold::nv_group_scale(group as i32)
        } else {
            pow2(top as i32 - 127 - fold::headroom(elem))
        };
        let v = (unit * p.tensor_scale * crate::plant::FOLD).to_bits();
        if b_role {
            let at = li as u64 * p.rows as u64 + r as u64;
            // SAFETY: inside the B-role layout when r < rows.
            unsafe { global::store_u32_if(p.dst_scales + 4 * at, v, c == 0 && r < p.rows) };
        } else {
            let at = (li as u64 * (p.k / FOLD_K) as u64 + c as u64) * p.m_pad as u64 + r as u64;
            // SAFETY: inside the A-role layout when r < rows ≤ m_pad.
            unsafe { global::store_u32_if(p.dst_scales + 4 * at, v, r < p.rows) };
        }
        // 3. The codes: two rows per warp step (lanes 0–15 and 16–31), 8 codes per lane, which
        // share one scale (blocks of 16 or 32, aligned). Each group of steps loads all its codes,
        // scale bytes and groups before it stores anything (a store could alias a later load for
        // all the compiler knows, which would serialize their latencies).
        let (warp, lane) = (t / 32, t % 32);
        let kk = 8 * (lane % 16);
        let row_of = |i: u32| 2 * (warp + 4 * i) + lane / 16;
        let row_at = |row: u32| {
            (li as u64 * p.rows as u64 + (rb * FOLD_ROWS + row) as u64) * p.k as u64
                + (c * FOLD_K) as u64
                + kk as u64
        };
        let fp4 = elem == ElemType::E2M1;
        for g in 0..STEPS / GROUP {
            // (codes, codes, scale code, group) per step.
            let mut loaded = [(0u32, 0u32, 0u32, 0u32); GROUP as usize];
            for (j, x) in loaded.iter_mut().enumerate() {
                let row = row_of(g * GROUP + j as u32);
                // SAFETY: word `row` of the shared groups (row < 128), written before the barrier.
                let group = unsafe { smem::load_u32(refs + 4 * row) };
                let s = scale(rb * FOLD_ROWS + row, kk / BLOCK);
                let (mut w0, mut w1) = (0, 0);
                if rb * FOLD_ROWS + row < p.rows {
                    let at = row_at(row);
                    // SAFETY: 4 (e2m1) or 8 (FP8) bytes of a row < rows, aligned to their size
                    // (k % 128 == 0, kk % 8 == 0).
                    unsafe {
                        if fp4 {
                            w0 = *((p.src + at / 2) as *const u32);
                        } else {
                            let v = *((p.src + at) as *const u64);
                            (w0, w1) = (v as u32, (v >> 32) as u32);
                        }
                    }
                }
                *x = (w0, w1, s, group);
            }
            for (j, &(w0, w1, s, group)) in loaded.iter().enumerate() {
                let row = row_of(g * GROUP + j as u32);
                let valid = rb * FOLD_ROWS + row < p.rows;
                let (lo, hi) = if is_nan(s) {
                    (NAN * 0x0101_0101, NAN * 0x0101_0101)
                } else if fp4 {
                    let [t0, t1] = if NV {
                        let f = fold::nv_factor(s, group as i32);
                        fold::nv_table(f, convert::f32x2_to_e4m3x2)
                    } else {
                        fold::e2m1_table(group - s)
                    };
                    let four = |x: u32| {
                        bits::prmt(t0, t1, x & 0x7777)
                            | bits::prmt(fold::E2M1_SIGN_TABLE, 0, (x >> 3) & 0x1111)
                    };
                    (four(w0), four(w0 >> 16))
                } else {
                    (
                        fold::fold8x4(elem, w0, group - s),
                        fold::fold8x4(elem, w1, group - s),
                    )
                };
                // SAFETY: 8 bytes of the same row of dst (8-byte aligned).
                unsafe { global::store_u32x2_if(p.dst + row_at(row), lo, hi, valid) };
            }
        }
    }

    /// Warp steps per block (two rows each, four warps) and how many issue their loads together.
    const STEPS: u32 = FOLD_ROWS / 8;
    const GROUP: u32 = 8;
}

const _: () = {
    // The fold's K groups are the FP8 kernel's scale blocks.
    assert!(FOLD_K == crate::sm90::BLOCK_K);
    assert!(FOLD_ROWS == FOLD_THREADS);
};

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::format;

    /// Every row's entry point is named by its element type and scale format (a table line is
    /// written by hand).
    #[test]
    fn every_kernel_is_named_by_its_formats() {
        for (i, k) in KERNELS.iter().enumerate() {
            let (ty, block) = (k.scale.ty.name(), k.scale.block);
            let want = format!("fold_fp8_{}_{ty}x{block}", k.elem.name());
            assert_eq!(k.info.name, want);
            assert_eq!(kernel(k.elem, k.scale), Some(k), "{i}");
        }
    }
}
