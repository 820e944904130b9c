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
    /// The kernel's shared memory: its tile's layout ([`HalfTile::fused_layout`] for a fused
    /// kernel).
    pub const fn layout(&self) -> StageLayout {
        match self.mode {
            Mode::Fused => self.tile.fused_layout(),
            _ => self.tile.layout(),
        }
    }
}

/// One exported kernel: `$name` its entry point, `$tile` a [`HalfTile`] constant, `$ty` the
/// `wgmma` input type (`Bf16` or `F16`), `$mode` a [`Mode`] variant; it takes `$arg: $param`
/// (the family's parameters, or for a fused kernel those and the epilogue's), from which the
/// kernel's fields `$field…` are made.
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
macro_rules! export {
    ($name:expr, $tile:ident, $ty:ident, $mode:ident, $arg:ident: $param:ty => { $($field:tt)* }) => {
        const _: () = {
            /// # Safety
            /// Launched as [`crate::gemm::driver::run`] says for the tile, with parameters made
            /// from validated operands as [`Sm90HalfParams`] describes (`out` sized for the
            /// output, `splitk` for the schedule; sparse: every segment's positions are stored
            /// blocks of its tile's block row and `cols` their in-range K blocks; fused: the
            /// epilogue's buffers as [`crate::params::EpilogueParams`] describes).
            #[unsafe(export_name = $name)]
            unsafe extern "ptx-kernel" fn kernel($arg: $param) {
                use $crate::sm90_half::HalfTile;
                let k = $crate::sm90_half::kernel::HalfGemm::<
                    { HalfTile::$tile.waves as usize },
                    [f32; { (HalfTile::$tile.block_n / 2) as usize }],
                    $crate::ptx::wgmma::$ty,
                    { $crate::gemm::Mode::$mode as u32 },
                > {
                    $($field)*
                    types: core::marker::PhantomData,
                };
                // SAFETY: the caller's contract.
                unsafe {
                    $crate::gemm::driver::run::<
                        _,
                        { HalfTile::$tile.producer_regs($crate::gemm::Mode::$mode) },
                        { HalfTile::$tile.consumer_regs($crate::gemm::Mode::$mode) },
                    >(&k)
                }
            }
        };
    };
}

/// [`export`] of a kernel taking the family's parameters (dense, sparse) or, fused, those and the
/// epilogue's ([`crate::params::FusedParams`]).
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
macro_rules! entry {
    ($name:expr, $tile:ident, $ty:ident, Fused) => {
        export!($name, $tile, $ty, Fused,
            q: $crate::params::FusedParams<$crate::sm90_half::Sm90HalfParams> =>
                { p: q.p, epi: q.epi, });
    };
    ($name:expr, $tile:ident, $ty:ident, $mode:ident) => {
        export!($name, $tile, $ty, $mode,
            p: $crate::sm90_half::Sm90HalfParams =>
                { p, epi: $crate::params::EpilogueParams::plain(), });
    };
}

/// The kernel list, written once: every tile × type × mode (dense-only tiles: dense; fused tiles:
/// dense and fused too); the entry point is `sm90_<type>_gemm` (dense), `sm90_<type>_bsr_gemm`
/// (block-sparse) or `sm90_<type>_fused_gemm` (the fused epilogue) followed by the tile's suffix.
macro_rules! kernel_list {
    ($(($tile:ident, $tn:literal)),*; dense only: $(($dtile:ident, $dtn:literal)),*;
     fused: $(($ftile:ident, $ftn:literal)),*) => {
        /// Every kernel of the family (the registry's rows).
        pub const KERNELS: &[Sm90HalfKernel] = &[
            $(kernel_list!(@row $tile, Bf16, Dense, concat!("sm90_bf16_gemm", $tn)),
              kernel_list!(@row $tile, Bf16, Sparse, concat!("sm90_bf16_bsr_gemm", $tn)),
              kernel_list!(@row $tile, F16, Dense, concat!("sm90_f16_gemm", $tn)),
              kernel_list!(@row $tile, F16, Sparse, concat!("sm90_f16_bsr_gemm", $tn)),)*
            $(kernel_list!(@row $dtile, Bf16, Dense, concat!("sm90_bf16_gemm", $dtn)),
              kernel_list!(@row $dtile, F16, Dense, concat!("sm90_f16_gemm", $dtn)),)*
            $(kernel_list!(@row $ftile, Bf16, Fused, concat!("sm90_bf16_fused_gemm", $ftn)),
              kernel_list!(@row $ftile, F16, Fused, concat!("sm90_f16_fused_gemm", $ftn)),)*
        ];
        #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
        const _: () = {
            $(entry!(concat!("sm90_bf16_gemm", $tn), $tile, Bf16, Dense);
              entry!(concat!("sm90_bf16_bsr_gemm", $tn), $tile, Bf16, Sparse);
              entry!(concat!("sm90_f16_gemm", $tn), $tile, F16, Dense);
              entry!(concat!("sm90_f16_bsr_gemm", $tn), $tile, F16, Sparse);)*
            $(entry!(concat!("sm90_bf16_gemm", $dtn), $dtile, Bf16, Dense);
              entry!(concat!("sm90_f16_gemm", $dtn), $dtile, F16, Dense);)*
            $(entry!(concat!("sm90_bf16_fused_gemm", $ftn), $ftile, Bf16, Fused);
              entry!(concat!("sm90_f16_fused_gemm", $ftn), $ftile, F16, Fused);)*
        };
    };
    (@row $tile:ident, $ty:ident, $mode:ident, $name:expr) => {
        Sm90HalfKernel {
            tile: HalfTile::$tile,
            ty: HalfType::$ty,
            mode: Mode::$mode,
            info: KernelInfo {
                name: $name,
                max_threads: Some(HalfTile::$tile.threads()),
                min_blocks_per_sm: 1,
                // wgmma exists on sm_90a only.
                targets: &["sm_90a"],
            },
        }
    };
}

// Fused (`gemm::epilogue::fuse`): the 128 × 128 tile (one wave: see the FP8 family's fused list).
kernel_list!(
    (M128, ""),
    (M256, "_m256"),
    (M128N64, "_n64"),
    (M256N64, "_m256_n64");
    dense only: (M128N256, "_n256");
    fused: (M128, "")
);

/// The kernel for a tile, a type and a mode (dense, sparse or fused).
pub fn kernel(tile: HalfTile, ty: HalfType, mode: Mode) -> Option<&'static Sm90HalfKernel> {
    KERNELS
        .iter()
        .find(|k| k.tile == tile && k.ty == ty && k.mode == mode)
}

#[cfg(test)]
mod tests {
    use super::*;

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
