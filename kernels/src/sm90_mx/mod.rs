//! The Hopper MX / NVFP4 family: both operands block-scaled (MXFP8, MXFP4, NVFP4, e2m1 with e8m0
//! per 16), dequantized exactly to bf16 inside the pipeline and multiplied by bf16 `wgmma`.
//! Hopper has no block-scaled MMA; bf16 holds every element × scale product exactly (see
//! [`dequant`]), so the result is the exact products summed in fp32, as on the FP8 kernel's
//! promotion path, with no FP8 accumulation loss. Host and device share this module; the kernel
//! body is [`kernel`] (sm_90a only).
//!
//! Per stage of [`BLOCK_K`] = 64 elements of K: the producer loads the raw A tile (128 rows),
//! the raw B tile (`block_n` rows) and both tiles' scale bytes; the two consumer warpgroups
//! convert them together into one of two bf16 buffers (128-byte swizzled, as `wgmma` reads
//! them), release the stage, and each runs its 64 rows × `block_n` MMAs on that buffer while the
//! next stage is converted into the other.

pub mod dequant;
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
pub mod kernel;

mod schedule;

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
use crate::entry::Of;
use crate::format::ElemType;
use crate::format::ElemType::{E2M1, E4M3, E5M2};
use crate::gemm::layout::{HANDOFF_BYTES, StageContents, StageLayout};
use crate::kernel_info::KernelInfo;

/// K of one stage: 64 bf16 = one 128-byte swizzled row of the converted tiles.
pub const BLOCK_K: u32 = 64;
/// Rows of the A tile: two consumer warpgroups × the 64 rows of `wgmma`.
pub const BLOCK_M: u32 = 128;
/// Consumer warpgroups.
pub const CONSUMERS: u32 = 2;
/// Codes per conversion unit (one row, 16 consecutive K): one scale covers a whole unit.
pub const UNIT: u32 = 16;
/// K per bf16 MMA step (`wgmma` m64nNk16, `mma` m16n8k16): 16 elements, 32 bytes of a
/// swizzled bf16 row.
pub const MMA_K: u32 = 16;
/// Registers a fused kernel's consumers give their finishing warps (a multiple of 8: the
/// finishers get twice it more, as there are two consumer warpgroups per producer warpgroup).
pub const FUSED_CONSUMER_GIVE: u32 = 24;
/// Bytes of one row of a converted (bf16) tile.
pub const BF16_ROW_BYTES: u32 = 2 * BLOCK_K;
/// Scale rows are padded to a multiple of this (the widest tile), so every tile's scale copy
/// stays inside the buffer.
pub const SCALE_ROWS_PAD: u32 = 256;

/// One tile shape: 128 rows × `block_n` columns (256 or 128).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MxTile {
    pub block_n: u32,
}

impl MxTile {
    /// 128 × 256: `wgmma` m64n256k16 reads 10 KiB of shared memory per 64·256·16 MACs, the
    /// fewest bytes per MAC of any bf16 shape (the 128 B/clock of shared memory also carry the
    /// conversion's reads and writes).
    pub const N256: MxTile = MxTile { block_n: 256 };
    /// 128 × 128: twice the tiles where 256-column tiles leave SMs idle.
    pub const N128: MxTile = MxTile { block_n: 128 };
    pub const ALL: [MxTile; 2] = [MxTile::N256, MxTile::N128];

    pub const fn threads(self) -> u32 {
        128 * (1 + CONSUMERS)
    }
    /// Register budgets after `setmaxnreg`: 128·(40 + 2·232) ≤ 65536; a consumer holds
    /// `block_n / 2` sums plus one unit's conversion (16 words).
    pub const fn producer_regs(self) -> u32 {
        40
    }
    pub const fn consumer_regs(self) -> u32 {
        232
    }

    /// The shared memory for codes of `bits` bits with one scale byte per `scale_block`
    /// elements: per stage the raw A and B tiles and their scales; once, the two bf16 buffers
    /// (in the layout's output region), and for a `fused` kernel after them the hand-over to its
    /// finishing warps (it stages its rows in global memory).
    pub const fn layout(self, bits: u32, scale_block: u32, fused: bool) -> StageLayout {
        let raw_row = BLOCK_K * bits / 8;
        let scales_per_row = BLOCK_K / scale_block;
        StageLayout::fit(StageContents {
            a: BLOCK_M * raw_row,
            b: self.block_n * raw_row,
            sfa: sfa_box(scale_block).bytes() + self.block_n * scales_per_row,
            words: 0,
            out: 2 * self.converted_bytes() + if fused { HANDOFF_BYTES } else { 0 },
        })
    }

    /// Bytes of one converted buffer: the A tile then the B tile, bf16.
    pub const fn converted_bytes(self) -> u32 {
        (BLOCK_M + self.block_n) * BF16_ROW_BYTES
    }
}

/// The TMA box of A's scale bytes for scale blocks of `scale_block` (entries of one row's
/// `64 / scale_block` bytes): a tile of [`BLOCK_M`] rows from any first row.
pub const fn sfa_box(scale_block: u32) -> crate::gemm::layout::ScaleBox {
    crate::gemm::layout::ScaleBox {
        entry: BLOCK_K / scale_block,
        tile_rows: BLOCK_M,
    }
}

/// Parameters of the sm90 MX GEMM. Tensor maps (device memory, 64-byte aligned): 3-D over
/// (K bytes, rows, L), boxes of `BLOCK_K · bits / 8` bytes × 128 rows (A) or `block_n` rows (B),
/// no swizzle. Scales: bytes `[l][⌈k/64⌉][rows_pad][64 / block]` (the scale bytes of one row and
/// one stage adjacent), zero past the rows and past K.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sm90MxParams {
    pub tmap_a: u64,
    pub tmap_b: u64,
    /// A's scale bytes as a tensor map (3-D: rows_pad_a elements of `64 / block` bytes, ⌈k/64⌉,
    /// l; boxes of [`sfa_box`] rows): a tile's scales may start at any row (grouped GEMM).
    pub tmap_sfa: u64,
    pub sfb: u64,
    /// `[l][m][n]` of `out_type`.
    pub out: u64,
    /// With `split_k` > 1, where the K ranges meet (`crate::gemm::splitk`).
    pub splitk: crate::params::SplitKParams,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub l: u32,
    /// Rows of the scale buffers (multiples of [`SCALE_ROWS_PAD`]).
    pub rows_pad_a: u32,
    pub rows_pad_b: u32,
    /// [`crate::params::OutType`] as u32.
    pub out_type: u32,
    pub group_m: u32,
    pub split_k: u32,
    /// Multiplies every sum before the store: the product of the operands' fp32 tensor scales
    /// (NVFP4), else 1.
    pub alpha: f32,
    /// Grouped GEMM (split_k = 1): A (and C) rows per group, B's batch entry per group.
    pub groups: crate::params::GroupParams,
}

pub use crate::format::MxScale;

/// One kernel of the family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sm90MxKernel {
    pub tile: MxTile,
    pub a: ElemType,
    pub b: ElemType,
    pub scale: MxScale,
    /// Whether each tile ends in the fused epilogue (its parameter a
    /// [`crate::params::FusedParams`]).
    pub fused: bool,
    pub info: KernelInfo,
}

impl Sm90MxKernel {
    /// The row of the kernel `name`.
    pub const fn new(
        name: &'static str,
        tile: MxTile,
        a: ElemType,
        b: ElemType,
        scale: MxScale,
        fused: bool,
    ) -> Self {
        Sm90MxKernel {
            tile,
            a,
            b,
            scale,
            fused,
            info: KernelInfo::sm90(name, tile.threads()),
        }
    }
    /// Whether the kernel ends in the fused epilogue.
    pub const fn fused(&self) -> bool {
        self.fused
    }
    /// The register budgets after `setmaxnreg`: the fused kernels' finishing warps are the
    /// producer warpgroup's ([`crate::gemm::producer_budget`]).
    pub const fn producer_regs(&self) -> u32 {
        let finishers = if self.fused {
            crate::gemm::FINISHERS
        } else {
            0
        };
        crate::gemm::producer_budget(
            self.tile.producer_regs(),
            CONSUMERS,
            self.consumer_regs(),
            finishers,
        )
    }
    /// The consumers' budget: the tile's, less [`FUSED_CONSUMER_GIVE`] in a fused kernel, whose
    /// finishing warps' row code (the general epilogue: C, residual, SwiGLU pairs, every output
    /// type) spills kilobytes in the 40 registers the tile's consumers leave them.
    pub const fn consumer_regs(&self) -> u32 {
        if self.fused {
            self.tile.consumer_regs() - FUSED_CONSUMER_GIVE
        } else {
            self.tile.consumer_regs()
        }
    }
    pub const fn layout(&self) -> StageLayout {
        self.tile
            .layout(self.a.bits(), self.scale.block, self.fused)
    }
}

crate::entry::kernel_table! {
    /// # Safety
    /// Launched as [`crate::gemm::driver::run`] says, with parameters made from validated
    /// operands as [`Sm90MxParams`] describes (fused: the epilogue's buffers and scratch as
    /// [`crate::params::EpilogueParams`] describes).
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
    unsafe extern "ptx-kernel" fn |K| {
        gemm(Sm90MxParams) => kernel::MxGemm<
            [f32; K.tile.block_n as usize / 2],
            Of<dequant::ElemOf<{ K.a as u32 }>>,
            Of<dequant::ElemOf<{ K.b as u32 }>>,
            Of<dequant::ScaleOf<{ K.scale.ty as u32 }, { K.scale.block }>>,
            { K.fused },
        >;
    }

    /// Every kernel of the family (the registry's rows): tiles × (A, B, scale) combinations.
    /// The fused-epilogue kernels (`gemm::epilogue::fuse`) are on the 256-column tile: the MX
    /// kernel has no output staging (its shared memory holds the converted bf16 buffers), so a
    /// warp stages its rows in a global scratch the host gives (`EpilogueParams::scratch`,
    /// L2-resident).
    pub const KERNELS: &[Sm90MxKernel] = Sm90MxKernel::new [
        plain("sm90_mx_gemm_n256_e4m3_e4m3_e8m0x32", MxTile::N256, E4M3, E4M3, MxScale::E8M0X32, false),
        plain("sm90_mx_gemm_n256_e5m2_e5m2_e8m0x32", MxTile::N256, E5M2, E5M2, MxScale::E8M0X32, false),
        plain("sm90_mx_gemm_n256_e4m3_e5m2_e8m0x32", MxTile::N256, E4M3, E5M2, MxScale::E8M0X32, false),
        plain("sm90_mx_gemm_n256_e5m2_e4m3_e8m0x32", MxTile::N256, E5M2, E4M3, MxScale::E8M0X32, false),
        plain("sm90_mx_gemm_n256_e2m1_e2m1_e8m0x32", MxTile::N256, E2M1, E2M1, MxScale::E8M0X32, false),
        plain("sm90_mx_gemm_n256_e2m1_e2m1_ue4m3x16", MxTile::N256, E2M1, E2M1, MxScale::UE4M3X16, false),
        plain("sm90_mx_gemm_n256_e2m1_e2m1_e8m0x16", MxTile::N256, E2M1, E2M1, MxScale::E8M0X16, false),
        plain("sm90_mx_gemm_n128_e4m3_e4m3_e8m0x32", MxTile::N128, E4M3, E4M3, MxScale::E8M0X32, false),
        plain("sm90_mx_gemm_n128_e5m2_e5m2_e8m0x32", MxTile::N128, E5M2, E5M2, MxScale::E8M0X32, false),
        plain("sm90_mx_gemm_n128_e4m3_e5m2_e8m0x32", MxTile::N128, E4M3, E5M2, MxScale::E8M0X32, false),
        plain("sm90_mx_gemm_n128_e5m2_e4m3_e8m0x32", MxTile::N128, E5M2, E4M3, MxScale::E8M0X32, false),
        plain("sm90_mx_gemm_n128_e2m1_e2m1_e8m0x32", MxTile::N128, E2M1, E2M1, MxScale::E8M0X32, false),
        plain("sm90_mx_gemm_n128_e2m1_e2m1_ue4m3x16", MxTile::N128, E2M1, E2M1, MxScale::UE4M3X16, false),
        plain("sm90_mx_gemm_n128_e2m1_e2m1_e8m0x16", MxTile::N128, E2M1, E2M1, MxScale::E8M0X16, false),
        fused("sm90_mx_fused_gemm_n256_e4m3_e4m3_e8m0x32", MxTile::N256, E4M3, E4M3, MxScale::E8M0X32, true),
        fused("sm90_mx_fused_gemm_n256_e5m2_e5m2_e8m0x32", MxTile::N256, E5M2, E5M2, MxScale::E8M0X32, true),
        fused("sm90_mx_fused_gemm_n256_e4m3_e5m2_e8m0x32", MxTile::N256, E4M3, E5M2, MxScale::E8M0X32, true),
        fused("sm90_mx_fused_gemm_n256_e5m2_e4m3_e8m0x32", MxTile::N256, E5M2, E4M3, MxScale::E8M0X32, true),
        fused("sm90_mx_fused_gemm_n256_e2m1_e2m1_e8m0x32", MxTile::N256, E2M1, E2M1, MxScale::E8M0X32, true),
        fused("sm90_mx_fused_gemm_n256_e2m1_e2m1_ue4m3x16", MxTile::N256, E2M1, E2M1, MxScale::UE4M3X16, true),
        fused("sm90_mx_fused_gemm_n256_e2m1_e2m1_e8m0x16", MxTile::N256, E2M1, E2M1, MxScale::E8M0X16, true),
    ];
}

/// The kernel for a tile, element types and scale format, plain or `fused`.
pub fn kernel(
    tile: MxTile,
    a: ElemType,
    b: ElemType,
    scale: MxScale,
    fused: bool,
) -> Option<&'static Sm90MxKernel> {
    KERNELS
        .iter()
        .find(|k| k.tile == tile && k.a == a && k.b == b && k.scale == scale && k.fused == fused)
}

const _: () = {
    let mut i = 0;
    while i < KERNELS.len() {
        let k = &KERNELS[i];
        let l = k.layout();
        assert!(l.stages >= 3);
        assert!(128 * (k.tile.producer_regs() + CONSUMERS * k.tile.consumer_regs()) <= 65_536);
        // Raw tiles and converted buffers 1024-byte aligned (TMA, 128-byte swizzle).
        assert!(l.contents.a.is_multiple_of(1024) && l.contents.b.is_multiple_of(1024));
        // Each scale copy a multiple of 16 bytes.
        assert!((BLOCK_M * BLOCK_K / k.scale.block).is_multiple_of(16));
        i += 1;
    }
};

#[cfg(test)]
mod tests {
    extern crate std;
    use std::format;

    use super::*;

    /// Every row's entry point is named by its tile, types and scale format (a table line is
    /// written by hand).
    #[test]
    fn every_kernel_is_named_by_its_tile_types_and_scale() {
        for k in KERNELS {
            let fused = if k.fused { "_fused" } else { "" };
            let want = format!(
                "sm90_mx{fused}_gemm_n{}_{}_{}_{}x{}",
                k.tile.block_n,
                k.a.name(),
                k.b.name(),
                k.scale.ty.name(),
                k.scale.block
            );
            assert_eq!(k.info.name, want);
        }
    }

    #[test]
    fn every_kernel_has_a_unique_name_and_a_layout_that_fits() {
        for (i, k) in KERNELS.iter().enumerate() {
            assert!(KERNELS[i + 1..].iter().all(|o| o.info.name != k.info.name));
            let l = k.layout();
            assert!(l.bytes() <= crate::gemm::layout::SMEM_LIMIT);
            assert!(l.stages >= 3, "{}: {} stages", k.info.name, l.stages);
        }
        assert_eq!(
            kernel(
                MxTile::N256,
                ElemType::E2M1,
                ElemType::E2M1,
                MxScale::UE4M3X16,
                false
            )
            .map(|k| k.info.name),
            Some("sm90_mx_gemm_n256_e2m1_e2m1_ue4m3x16")
        );
        // Fused: the 256-column tile, every combination.
        for k in KERNELS.iter().filter(|k| !k.fused) {
            let fused = kernel(k.tile, k.a, k.b, k.scale, true);
            assert_eq!(fused.is_some(), k.tile == MxTile::N256, "{}", k.info.name);
        }
    }
}
