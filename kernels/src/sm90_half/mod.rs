//! The Hopper 16-bit GEMM family: bf16 or fp16 A and B (no block scales), f32 accumulation, dense
//! or with one operand block-sparse (BSR, torch's `to_sparse_bsr` layout, 64 × 64 or 128 × 128
//! blocks). Host and device share this module; the kernel body is [`kernel`] (sm_90a only).
//!
//! Hardware facts behind the numbers: a 128-byte swizzled TMA box row is 64 16-bit values, so a
//! stage holds 64 of K (four `wgmma` m64nNk16); `wgmma` gives each of the two consumer
//! warpgroups 64 rows per wave; a tile is 1 or 2 waves (128 or 256 rows) by 128 or 64 columns
//! (the sparse operand's block rows, or halves of them), or, dense only, 128 rows by 256 columns
//! (`wgmma` m64n256k16: half the MMA instructions of 256 × 128 for the same work, and 20% fewer
//! shared-memory operand bytes). Without scales there is nothing to
//! promote: the accumulators stay in the `wgmma` fragments over the whole K loop, and each
//! consumer keeps one stage's MMAs in flight while it waits for the next.

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
pub mod kernel;

mod schedule;

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
use crate::entry::Of;
use crate::gemm::Mode;
use crate::gemm::layout::{StageContents, StageLayout, fused_out, out_staging};
use crate::kernel_info::KernelInfo;

/// K per stage: one 128-byte swizzle span of 16-bit values.
pub const BLOCK_K: u32 = 64;
/// Bytes per row of a swizzled stage tile.
pub const ROW_BYTES: u32 = 128;
/// Consumer warpgroups.
pub const CONSUMERS: u32 = 2;
/// Rows of one consumer warpgroup per wave (the M of `wgmma`).
pub const WG_ROWS: u32 = crate::gemm::layout::FRAGMENT_ROWS;

/// The 16-bit input type of a kernel (both operands).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HalfType {
    Bf16 = 0,
    F16 = 1,
}

impl HalfType {
    pub const fn name(self) -> &'static str {
        match self {
            HalfType::Bf16 => "bf16",
            HalfType::F16 => "f16",
        }
    }
}

/// One tile shape: two consumers × 64 rows × `waves` by `block_n` columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HalfTile {
    /// Waves (1 or 2): each costs a consumer thread `block_n / 2` f32 sums.
    pub waves: u32,
    /// Columns: 256 (dense only), 128 or 64 (`wgmma` m64n256k16, m64n128k16, m64n64k16).
    pub block_n: u32,
}

impl HalfTile {
    pub const M128: HalfTile = HalfTile {
        waves: 1,
        block_n: 128,
    };
    pub const M256: HalfTile = HalfTile {
        waves: 2,
        block_n: 128,
    };
    pub const M128N64: HalfTile = HalfTile {
        waves: 1,
        block_n: 64,
    };
    pub const M256N64: HalfTile = HalfTile {
        waves: 2,
        block_n: 64,
    };
    pub const M128N256: HalfTile = HalfTile {
        waves: 1,
        block_n: 256,
    };
    pub const ALL: [HalfTile; 5] = [
        HalfTile::M128,
        HalfTile::M256,
        HalfTile::M128N64,
        HalfTile::M256N64,
        HalfTile::M128N256,
    ];

    /// Whether block-sparse kernels exist for the tile: its columns lie in one block row of
    /// the sparse operand (blocks of 64 or 128).
    pub const fn sparse(self) -> bool {
        self.block_n <= 128
    }

    /// Rows one wave covers.
    pub const fn wave_m(self) -> u32 {
        WG_ROWS * CONSUMERS
    }
    pub const fn block_m(self) -> u32 {
        self.wave_m() * self.waves
    }
    /// One producer warpgroup and the consumers.
    pub const fn threads(self) -> u32 {
        128 * (1 + CONSUMERS)
    }
    /// Register budgets after `setmaxnreg` for `mode`, within the 168 per thread the launch gives
    /// 384 threads (128·(P + 2·C) ≤ 384·168). A consumer holds up to 128 sums (two waves of 128
    /// columns) beside its addressing and epilogue: dense 40 + 2·232; block-sparse 24 + 2·240,
    /// as its consumers spilled at 232 (the segment's meeting) and its producer walks no bands.
    /// Both are the splits at which ptxas spills nothing in any role.
    /// Fused: 136 + 2·184, the producer's warpgroup also running the finishing warps' row code
    /// (`gemm::epilogue::fuse`); the consumers hold one wave's 64 sums.
    pub const fn producer_regs(self, mode: Mode) -> u32 {
        match mode {
            Mode::Sparse => 24,
            Mode::Fused => crate::gemm::producer_budget(40, CONSUMERS, 184, crate::gemm::FINISHERS),
            _ => 40,
        }
    }
    pub const fn consumer_regs(self, mode: Mode) -> u32 {
        match mode {
            Mode::Sparse => 240,
            Mode::Fused => 184,
            _ => 232,
        }
    }
    /// A stage (A tile, B tile: 64 of K each) and the 16-bit output staged for its TMA stores
    /// ([`out_staging`]: the whole tile, or a ring of boxes for the tiles of 64 KiB), as many
    /// stages as fit: 6 for 128 × 128, 4 for 256 × 128 and 128 × 256 (3 with the whole tile
    /// staged), 8 for 128 × 64 and 4 for 256 × 64.
    pub const fn layout(self) -> StageLayout {
        StageLayout::fit(StageContents {
            a: self.block_m() * ROW_BYTES,
            b: self.block_n * ROW_BYTES,
            sfa: 0,
            words: 0,
            out: out_staging(CONSUMERS, self.waves, self.block_n).0,
        })
    }
    /// The layout of the tile's fused-epilogue kernel ([`Mode::Fused`]): the fused epilogue's f32
    /// rows and hand-over ([`fused_out`]) in place of the output staging: 5 stages for 128 × 128.
    pub const fn fused_layout(self) -> StageLayout {
        StageLayout::fit(StageContents {
            out: fused_out(CONSUMERS, self.block_n),
            ..self.layout().contents
        })
    }
    /// Whether the output goes through a ring of boxes ([`out_staging`]).
    pub const fn out_ring(self) -> bool {
        out_staging(CONSUMERS, self.waves, self.block_n).1
    }
    pub const fn stages(self) -> u32 {
        self.layout().stages
    }
    pub const fn smem_bytes(self) -> u32 {
        self.layout().bytes()
    }
}

const _: () = {
    assert!(HalfTile::M128.stages() == 6 && HalfTile::M256.stages() == 4);
    assert!(HalfTile::M128N256.stages() == 4 && HalfTile::M128N256.out_ring());
    assert!(HalfTile::M128N64.stages() == 8 && HalfTile::M256N64.stages() == 4);
    assert!(HalfTile::M128.fused_layout().stages == 5);
    let mut i = 0;
    while i < HalfTile::ALL.len() {
        let t = HalfTile::ALL[i];
        // (The launch's 168 registers per thread: 65 536 over 384 threads, in multiples of 8.)
        let (d, sp) = (Mode::Dense, Mode::Sparse);
        assert!(128 * (t.producer_regs(d) + CONSUMERS * t.consumer_regs(d)) <= 384 * 168);
        assert!(128 * (t.producer_regs(sp) + CONSUMERS * t.consumer_regs(sp)) <= 384 * 168);
        let c = t.layout().contents;
        assert!(c.a.is_multiple_of(1024) && c.b.is_multiple_of(1024));
        i += 1;
    }
};

/// Parameters of the sm90 16-bit GEMM. `tmap_a` maps A (3-D: K, M, L; 16-bit; boxes of 64 × 128
/// rows; 128-byte swizzle). `tmap_b` maps B the same way with boxes of `block_n / cluster_m`
/// rows, or, for
/// [`Mode::Sparse`] kernels, the sparse operand's stored blocks (3-D: K of a block, rows of a
/// block, stored blocks). C = `alpha` · A · Bᵀ, `[l][m][n]` of `out_type`. K is a multiple of 8
/// (16-byte rows for TMA); past K the maps zero-fill.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sm90HalfParams {
    pub tmap_a: u64,
    pub tmap_b: u64,
    /// Tensor map of the output for TMA stores (N, M, L; box 64 × 64; 128-byte swizzle), or 0:
    /// direct stores.
    pub tmap_c: u64,
    pub out: u64,
    /// With `split_k` > 1 or cut sparse runs, where the K ranges meet (`crate::gemm::splitk`).
    pub splitk: crate::params::SplitKParams,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub l: u32,
    /// [`crate::params::OutType`] as u32.
    pub out_type: u32,
    /// Scheduler band height in M tiles (≥ 1).
    pub group_m: u32,
    /// Dense: K stages are split into this many ranges (≥ 1). Sparse: 1.
    pub split_k: u32,
    /// The product's one scale (the operands' tensor scales multiplied).
    pub alpha: f32,
    /// CTAs per cluster along M (1 or [`crate::gemm::scheduler::MAX_CLUSTER`]): the pair
    /// computes consecutive M tiles of one N tile, each CTA loading half of the shared B tile
    /// (`tmap_b`'s boxes are `block_n / cluster_m` rows) and multicasting it to both.
    pub cluster_m: u32,
    pub _pad: u32,
    /// Block-sparse GEMM ([`Mode::Sparse`] kernels; l = 1): a unit's K stages are positions of
    /// its segment (`sub_log2` stages per stored block).
    pub sparse: crate::params::SparseParams,
}

/// One kernel of the family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sm90HalfKernel {
    pub tile: HalfTile,
    pub ty: HalfType,
    pub mode: Mode,
    pub info: KernelInfo,
}

impl Sm90HalfKernel {
    /// The row of the kernel `name`.
    pub const fn new(name: &'static str, tile: HalfTile, ty: HalfType, mode: Mode) -> Self {
        Sm90HalfKernel {
            tile,
            ty,
            mode,
            info: KernelInfo::sm90(name, tile.threads()),
        }
    }
    /// Whether the kernel ends in the fused epilogue.
    pub const fn fused(&self) -> bool {
        matches!(self.mode, Mode::Fused)
    }
    /// The register budgets after `setmaxnreg`.
    pub const fn producer_regs(&self) -> u32 {
        self.tile.producer_regs(self.mode)
    }
    pub const fn consumer_regs(&self) -> u32 {
        self.tile.consumer_regs(self.mode)
    }
    /// The kernel's shared memory: its tile's layout ([`HalfTile::fused_layout`] for a fused
    /// kernel).
    pub const fn layout(&self) -> StageLayout {
        match self.mode {
            Mode::Fused => self.tile.fused_layout(),
            _ => self.tile.layout(),
        }
    }
}

crate::entry::kernel_table! {
    /// # Safety
    /// Launched as [`crate::gemm::driver::run`] says for the tile, with parameters made from
    /// validated operands as [`Sm90HalfParams`] describes (`out` sized for the output, `splitk`
    /// for the schedule; sparse: every segment's positions are stored blocks of its tile's
    /// block row and `cols` their in-range K blocks; fused: the epilogue's buffers as
    /// [`crate::params::EpilogueParams`] describes).
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
    unsafe extern "ptx-kernel" fn |K| {
        gemm(Sm90HalfParams) => kernel::HalfGemm<
            { K.tile.waves as usize },
            [f32; K.tile.block_n as usize / 2],
            Of<kernel::Fp16Of<{ K.ty as u32 }>>,
            { K.mode as u32 },
        >;
    }

    /// Every kernel of the family (the registry's rows): every tile × type, dense and, where the
    /// tile has them, block-sparse ([`HalfTile::sparse`]); the fused epilogue
    /// (`gemm::epilogue::fuse`) on the 128 × 128 tile (one wave: see the FP8 family's fused
    /// list).
    pub const KERNELS: &[Sm90HalfKernel] = Sm90HalfKernel::new [
        plain("sm90_bf16_gemm", HalfTile::M128, HalfType::Bf16, Mode::Dense),
        plain("sm90_bf16_bsr_gemm", HalfTile::M128, HalfType::Bf16, Mode::Sparse),
        plain("sm90_f16_gemm", HalfTile::M128, HalfType::F16, Mode::Dense),
        plain("sm90_f16_bsr_gemm", HalfTile::M128, HalfType::F16, Mode::Sparse),
        plain("sm90_bf16_gemm_m256", HalfTile::M256, HalfType::Bf16, Mode::Dense),
        plain("sm90_bf16_bsr_gemm_m256", HalfTile::M256, HalfType::Bf16, Mode::Sparse),
        plain("sm90_f16_gemm_m256", HalfTile::M256, HalfType::F16, Mode::Dense),
        plain("sm90_f16_bsr_gemm_m256", HalfTile::M256, HalfType::F16, Mode::Sparse),
        plain("sm90_bf16_gemm_n64", HalfTile::M128N64, HalfType::Bf16, Mode::Dense),
        plain("sm90_bf16_bsr_gemm_n64", HalfTile::M128N64, HalfType::Bf16, Mode::Sparse),
        plain("sm90_f16_gemm_n64", HalfTile::M128N64, HalfType::F16, Mode::Dense),
        plain("sm90_f16_bsr_gemm_n64", HalfTile::M128N64, HalfType::F16, Mode::Sparse),
        plain("sm90_bf16_gemm_m256_n64", HalfTile::M256N64, HalfType::Bf16, Mode::Dense),
        plain("sm90_bf16_bsr_gemm_m256_n64", HalfTile::M256N64, HalfType::Bf16, Mode::Sparse),
        plain("sm90_f16_gemm_m256_n64", HalfTile::M256N64, HalfType::F16, Mode::Dense),
        plain("sm90_f16_bsr_gemm_m256_n64", HalfTile::M256N64, HalfType::F16, Mode::Sparse),
        plain("sm90_bf16_gemm_n256", HalfTile::M128N256, HalfType::Bf16, Mode::Dense),
        plain("sm90_f16_gemm_n256", HalfTile::M128N256, HalfType::F16, Mode::Dense),
        fused("sm90_bf16_fused_gemm", HalfTile::M128, HalfType::Bf16, Mode::Fused),
        fused("sm90_f16_fused_gemm", HalfTile::M128, HalfType::F16, Mode::Fused),
    ];
}

/// The kernel for a tile, a type and a mode (dense, sparse or fused).
pub fn kernel(tile: HalfTile, ty: HalfType, mode: Mode) -> Option<&'static Sm90HalfKernel> {
    KERNELS
        .iter()
        .find(|k| k.tile == tile && k.ty == ty && k.mode == mode)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::format;
    use std::string::String;

    use super::*;

    /// Every row's entry point is named by its type, mode and tile (a table line is written by
    /// hand).
    #[test]
    fn every_kernel_is_named_by_its_type_mode_and_tile() {
        for k in KERNELS {
            let mode = match k.mode {
                Mode::Sparse => "_bsr",
                Mode::Fused => "_fused",
                _ => "",
            };
            let t = k.tile;
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
            let want = format!("sm90_{}{mode}_gemm{m}{n}", k.ty.name());
            assert_eq!(k.info.name, want);
        }
    }

    #[test]
    fn every_tile_type_and_mode_has_one_kernel_with_a_unique_name() {
        for t in HalfTile::ALL {
            for ty in [HalfType::Bf16, HalfType::F16] {
                for mode in [Mode::Dense, Mode::Sparse, Mode::Fused] {
                    let k = kernel(t, ty, mode);
                    let want = match mode {
                        Mode::Dense => true,
                        Mode::Sparse => t.sparse(),
                        _ => t == HalfTile::M128,
                    };
                    assert_eq!(k.is_some(), want, "{t:?} {mode:?}");
                    if let Some(k) = k {
                        assert_eq!(k.info.max_threads, Some(t.threads()));
                    }
                }
                assert!(kernel(t, ty, Mode::Grouped).is_none());
            }
        }
        let sparse = HalfTile::ALL.iter().filter(|t| t.sparse()).count();
        assert_eq!(KERNELS.len(), HalfTile::ALL.len() * 2 + sparse * 2 + 2);
        for (i, k) in KERNELS.iter().enumerate() {
            assert!(KERNELS[i + 1..].iter().all(|o| o.info.name != k.info.name));
        }
        assert_eq!(
            kernel(HalfTile::M256N64, HalfType::F16, Mode::Sparse).map(|k| k.info.name),
            Some("sm90_f16_bsr_gemm_m256_n64")
        );
    }
}
