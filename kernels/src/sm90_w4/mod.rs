//! The Hopper 4-bit-weights family: B (the weights, N × K) in e2m1 with e8m0 or ue4m3 block
//! scales, A (the activations, M × K) in bf16 (W4A16), in e4m3 with fp32 scales per 1×128 (W4A8),
//! or in e2m1 with the weights' scale format (MXFP4, NVFP4 and e2m1 + e8m0 / 16 at decode sizes).
//!
//! The product is computed transposed, Cᵀ = B·Aᵀ, so the weights are `wgmma`'s A operand and come
//! from registers: each consumer thread dequantizes its own fragment of 2 weight rows × 16 K
//! straight from the raw stage (exactly, as [`crate::sm90_mx::dequant`]), with no bf16 copy in
//! shared memory and no meeting of the warpgroups for it. The activations are `wgmma`'s B operand
//! (the N of the MMA: 16 or 128 rows per tile) and stay in shared memory as bf16: loaded so by TMA
//! (W4A16), or converted exactly into one of three bf16 buffers by both consumer warpgroups.
//! W4A8 multiplies in the fp32 activation scale per stage (each stage of 64 K lies in one 128-wide
//! scale block), as the FP8 kernel's promotion does. Every path is exact up to fp32 summation.
//!
//! The weights are stored for this kernel at their first use as weights: within each 64-K chunk of
//! a row the codes are reordered ([`weight_k`]) so that a thread's 16 codes are 8 adjacent bytes,
//! in the order the shift-and-mask conversion emits its bf16 pairs, and the rows are stored in
//! groups of [`GROUP_ROWS`], chunk by chunk ([`stored_chunk`]): one chunk of a group's rows is 512
//! adjacent bytes, so that the reads of a tile's chunk (a TMA box here, a warp's loads in
//! [`stream`]) are whole runs of memory, not 32-byte pieces a row apart, each its own DRAM
//! access. Host and device share this module; the kernel body is [`kernel`] (sm_90a only).

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
pub mod kernel;

pub mod fp8;
mod schedule;
pub mod stream;

use crate::format::ScaleType;
use crate::gemm::layout::{ScaleBox, StageContents, StageLayout};
use crate::kernel_info::KernelInfo;
use crate::sm90_mx::dequant::{Dequant, E2m1, mul_bf16x2};
use crate::sm90_mx::{BF16_ROW_BYTES, MxScale};
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
use crate::{entry::Of, sm90_mx::dequant::ScaleOf};
use Activation::{Bf16, E4m3Row128, Fp4};

pub use crate::sm90_mx::{BLOCK_K, SCALE_ROWS_PAD};

/// Weight rows per tile: two consumer warpgroups × the 64 rows of `wgmma`.
pub const WEIGHT_ROWS: u32 = 128;
/// Consumer warpgroups.
pub const CONSUMERS: u32 = 2;
/// Bytes of one weight row of a stage (64 e2m1 codes).
pub const WEIGHT_ROW_BYTES: u32 = BLOCK_K / 2;
/// bf16 buffers the converted activations rotate through: a buffer is rewritten three stages
/// after it was read, when every consumer thread has passed the meeting that follows its wait
/// for that stage's MMAs (with two, a fast thread could overwrite what a slow one's MMA reads).
pub const ACT_BUFFERS: u32 = 3;
/// K of one activation scale block of W4A8.
pub const A8_SCALE_K: u32 = 128;

/// Activation rows per tile (the N of the MMA).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct W4Tile {
    pub n: u32,
}

impl W4Tile {
    /// Decode: M ≤ 16 in one tile (`wgmma` m64n16k16).
    pub const N16: W4Tile = W4Tile { n: 16 };
    /// Larger M: m64n128k16.
    pub const N128: W4Tile = W4Tile { n: 128 };
    pub const ALL: [W4Tile; 2] = [W4Tile::N16, W4Tile::N128];

    pub const fn threads(self) -> u32 {
        128 * (1 + CONSUMERS)
    }
    pub const fn producer_regs(self) -> u32 {
        40
    }
    /// 128·(40 + 2·232) ≤ 65536: a consumer holds the tile's sums (`n / 2`, twice for W4A8),
    /// its 16 fragment words and the conversion.
    pub const fn consumer_regs(self) -> u32 {
        232
    }
}

/// The activations' format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Activation {
    /// bf16 (W4A16), loaded as is.
    Bf16,
    /// e4m3 with one fp32 scale per 1×128 (W4A8).
    E4m3Row128,
    /// e2m1 with the weights' scale format (both operands 4-bit).
    Fp4,
}

impl Activation {
    pub const fn bits(self) -> u32 {
        match self {
            Activation::Bf16 => 16,
            Activation::E4m3Row128 => 8,
            Activation::Fp4 => 4,
        }
    }
    /// Whether the consumers convert the activations into bf16 buffers.
    pub const fn converts(self) -> bool {
        !matches!(self, Activation::Bf16)
    }
    /// Whether each stage's sums are multiplied by a per-row fp32 scale (W4A8).
    pub const fn promotes(self) -> bool {
        matches!(self, Activation::E4m3Row128)
    }
    /// Scale bytes per activation row and stage (Fp4: the weights' `scale_block`).
    pub const fn scale_bytes(self, scale_block: u32) -> u32 {
        match self {
            Activation::Bf16 => 0,
            Activation::E4m3Row128 => 4,
            Activation::Fp4 => BLOCK_K / scale_block,
        }
    }
}

/// One kernel of the family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sm90W4Kernel {
    pub tile: W4Tile,
    pub act: Activation,
    /// The weights' scale format (and the activations' for [`Activation::Fp4`]).
    pub scale: MxScale,
    /// The weights converted to e4m3 for FP8 `wgmma` ([`fp8`]: W4A8 with e8m0 scales, 128-K
    /// stages) instead of to bf16.
    pub fp8: bool,
    pub info: KernelInfo,
}

impl Sm90W4Kernel {
    /// The row of the kernel `name`.
    pub const fn new(name: &'static str, tile: W4Tile, act: Activation, scale: MxScale) -> Self {
        Sm90W4Kernel {
            tile,
            act,
            scale,
            fp8: false,
            info: KernelInfo::sm90(name, tile.threads()),
        }
    }
    /// The row of the FP8-MMA kernel `name` ([`fp8`]) for weights with scales `scale`.
    pub const fn fp8(name: &'static str, scale: MxScale) -> Self {
        Sm90W4Kernel {
            tile: fp8::FP8_TILE,
            act: Activation::E4m3Row128,
            scale,
            fp8: true,
            info: KernelInfo::sm90(name, fp8::FP8_TILE.threads()),
        }
    }
    /// The register budgets after `setmaxnreg`.
    pub const fn producer_regs(&self) -> u32 {
        self.tile.producer_regs()
    }
    pub const fn consumer_regs(&self) -> u32 {
        self.tile.consumer_regs()
    }
    pub const fn layout(&self) -> StageLayout {
        if self.fp8 {
            fp8::layout(self.scale.block)
        } else {
            layout(self.tile, self.act, self.scale.block)
        }
    }
    /// K per stage (and per block of the schedule).
    pub const fn block_k(&self) -> u32 {
        if self.fp8 { fp8::FP8_BLOCK_K } else { BLOCK_K }
    }
}

/// Rows of the activations' TMA box for `tile`: the tile's rows, or more where a stage of them
/// would be under 1024 bytes (e2m1 × 16 rows: 512), so every stage's tile is whole 1024-byte
/// blocks (the bf16 buffers after the stages stay aligned for the 128-byte swizzle) and the
/// copy delivers every byte the stage's barrier expects. The kernel reads only the tile's rows.
pub const fn act_box_rows(tile: W4Tile, act: Activation) -> u32 {
    let row = BLOCK_K * act.bits() / 8;
    if tile.n * row < 1024 {
        1024 / row
    } else {
        tile.n
    }
}

/// The TMA box of the activations' scales for `tile` (entries of one row's scale bytes of a
/// stage or of a 128-K block): the tile's rows from any first row; `None` for bf16.
pub const fn act_scale_box(tile: W4Tile, act: Activation, scale_block: u32) -> Option<ScaleBox> {
    let entry = act.scale_bytes(scale_block);
    if entry == 0 {
        None
    } else {
        Some(ScaleBox {
            entry,
            tile_rows: tile.n,
        })
    }
}

/// Rows of [`act_scale_box`] (0 for bf16).
pub const fn act_scale_rows(tile: W4Tile, act: Activation, scale_block: u32) -> u32 {
    match act_scale_box(tile, act, scale_block) {
        Some(b) => b.rows(),
        None => 0,
    }
}

/// Per stage: the activation tile (bf16 128-byte swizzled, or raw codes), the weight tile (raw,
/// reordered codes), the weights' scale bytes then the activations' scales; once, the converted
/// activation buffers.
pub const fn layout(tile: W4Tile, act: Activation, scale_block: u32) -> StageLayout {
    let act_bytes = act_box_rows(tile, act) * BLOCK_K * act.bits() / 8;
    StageLayout::fit(StageContents {
        a: act_bytes,
        b: WEIGHT_ROWS * WEIGHT_ROW_BYTES,
        sfa: WEIGHT_ROWS * (BLOCK_K / scale_block)
            + act_scale_rows(tile, act, scale_block) * act.scale_bytes(scale_block),
        words: 0,
        out: if act.converts() {
            ACT_BUFFERS * tile.n * BF16_ROW_BYTES
        } else {
            0
        },
    })
}

/// Weight rows stored together, chunk by chunk ([`stored_chunk`]): an `mma` / `wgmma` warp's rows.
pub const GROUP_ROWS: u32 = 16;

/// The byte offset of chunk `c` (of `chunks`) of row `row` of batch entry `l` in the stored
/// weights of `rows` rows per entry: `[l][group][chunk][16 rows][32]`.
#[inline(always)]
pub const fn stored_chunk(l: u32, row: u32, c: u32, rows: u32, chunks: u32) -> u64 {
    let groups = rows.div_ceil(GROUP_ROWS) as u64;
    let (group, r) = ((row / GROUP_ROWS) as u64, (row % GROUP_ROWS) as u64);
    (((l as u64 * groups + group) * chunks as u64 + c as u64) * GROUP_ROWS as u64 + r)
        * WEIGHT_ROW_BYTES as u64
}

/// The K offset (within its 64-K chunk) of the code stored at position `p` (0..64) of a weight
/// row's reordered chunk. Thread `t = lane % 4` of a warp reads positions `16t..16t + 16` (bytes
/// `8t..8t + 8`, two words); word `w`'s nibbles `j` and `j + 4` become the bf16 pair `j` of the
/// conversion, which must be the register-fragment pair it feeds: K step `kk = 2w + j/2`, columns
/// `2t + 8·(j%2)` and the next (the A fragment of `wgmma` m64nNk16, PTX ISA "Register Fragments
/// and Shared Memory Matrix Layouts"), low half from nibble `j`.
pub const fn weight_k(p: u32) -> u32 {
    let (t, w, nib) = (p / 16, (p / 8) % 2, p % 8);
    let (j, hi) = (nib % 4, nib / 4);
    16 * (2 * w + j / 2) + 8 * (j % 2) + 2 * t + hi
}

/// The A fragments of K steps 0..4 of one 64-K chunk (`wgmma` m64nNk16's per warp, which are
/// `mma` m16n8k16's) for the thread `4g + t` of a warp that holds weight rows `r` and `r + 8`:
/// `raw[h]` is row `r + 8h`'s two words at byte `8t` of the reordered chunk ([`weight_k`]),
/// `scale(h, kk)` that row's scale at K step `kk` as bf16x2. Exact, as [`crate::sm90_mx::dequant`]
/// (e2m1 × scale is a bf16 unless it leaves bf16's range). Word `j` of step `kk` is row
/// `r + 8·(j%2)`, columns `8·(j/2) + 2t` and the next: pair `2kk + j/2` of that row.
#[inline(always)]
pub fn weight_fragments(raw: [[u32; 2]; 2], scale: impl Fn(usize, u32) -> u32) -> [[u32; 4]; 4] {
    fragments(raw, |pair, h, kk| {
        mul_bf16x2(mul_bf16x2(pair, E2m1::BIAS_X2), scale(h, kk))
    })
}

/// [`weight_fragments`] with one multiply per pair: `factor(h, kk)` is the scale times e2m1's
/// shift bias ([`ScaleDecode::x2_biased`]); the same words where that factor is exact
/// ([`ScaleDecode::bias_exact`]).
#[inline(always)]
pub fn weight_fragments_biased(
    raw: [[u32; 2]; 2],
    factor: impl Fn(usize, u32) -> u32,
) -> [[u32; 4]; 4] {
    fragments(raw, |pair, h, kk| mul_bf16x2(pair, factor(h, kk)))
}

/// The fragments of [`weight_fragments`], each shifted pair of row `r + 8h` at K step `kk` made a
/// bf16 pair by `value(pair, h, kk)`.
#[inline(always)]
fn fragments(raw: [[u32; 2]; 2], value: impl Fn(u32, usize, u32) -> u32) -> [[u32; 4]; 4] {
    let mut v = [[0u32; 8]; 2];
    for h in 0..2 {
        let pairs = E2m1::shifted([raw[h][0], raw[h][1], 0, 0]);
        // (Index loops: an array's by-value iterator stays a loop, its values in local memory.)
        for kk in 0..4 {
            for i in 2 * kk..2 * kk + 2 {
                v[h][i] = value(pairs[i], h, kk as u32);
            }
        }
    }
    core::array::from_fn(|kk| {
        [
            v[0][2 * kk],
            v[1][2 * kk],
            v[0][2 * kk + 1],
            v[1][2 * kk + 1],
        ]
    })
}

/// The fragments of [`weight_fragments`] of `N` chunks for a whole warp, the scale byte of chunk
/// `c`'s row `r + 8h` at K step `kk` being `byte(c, h, kk)`: with one multiply per pair
/// ([`weight_fragments_biased`]) where every lane's scales fold the bias exactly, else two.
/// Decided per warp (one ballot for all `N`), so that the branch is uniform and the chunks'
/// conversions are one block of independent work the compiler can interleave. All 32 lanes call
/// it together.
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
#[inline(always)]
pub(crate) fn warp_fragments<S: crate::sm90_mx::dequant::ScaleDecode, const N: usize>(
    raw: [[[u32; 2]; 2]; N],
    byte: impl Fn(usize, usize, u32) -> u32,
) -> [[[u32; 4]; 4]; N] {
    if S::FOLDS_BIAS {
        let mut exact = true;
        for c in 0..N {
            for h in 0..2 {
                for kk in 0..4 {
                    exact &= S::bias_exact(byte(c, h, kk));
                }
            }
        }
        if crate::ptx::thread::ballot(exact) == u32::MAX {
            return core::array::from_fn(|c| {
                weight_fragments_biased(raw[c], |h, kk| S::x2_biased(byte(c, h, kk)))
            });
        }
    }
    core::array::from_fn(|c| weight_fragments(raw[c], |h, kk| S::x2(byte(c, h, kk))))
}

/// The weights of the two K steps of 32 of one 64-K chunk as e4m3 bytes, in the register order
/// of an A fragment of `mma` m16n8k32 (rows `r`, `r + 8`, `r`, `r + 8`; the last two 16 columns
/// on), for the thread `4g + t` of a warp that holds weight rows `r` and `r + 8`, from the same
/// reordered bytes as [`weight_fragments`] (`raw[h]`: row `r + 8h`'s two words at byte `8t`):
/// step `s` is `[lo(raw[0][s]), lo(raw[1][s]), hi(raw[0][s]), hi(raw[1][s])]`, where `lo` takes a
/// word's low nibbles (codes at even positions) and `hi` its high ones, one e4m3 byte per code.
/// Each byte is the code times 2^-6 exactly: the e2m1 sign to bit 7 and its three magnitude bits
/// to bits 2–4, which makes e2m1's exponent e4m3's (bias 1 against 7) and its one mantissa bit
/// e4m3's top one, subnormal 0.5 included. Which K each byte holds is [`a8_k`]; the activations
/// are staged in that order ([`a8_stage_selector`]). No multiply: the block scales are applied
/// to each step's fp32 sums.
#[inline(always)]
pub fn weight_fragments_e4m3(raw: [[u32; 2]; 2]) -> [[u32; 4]; 2] {
    let lo = |w: u32| ((w << 2) & 0x1C1C_1C1C) | ((w << 4) & 0x8080_8080);
    let hi = |w: u32| ((w >> 2) & 0x1C1C_1C1C) | (w & 0x8080_8080);
    core::array::from_fn(|s| [lo(raw[0][s]), lo(raw[1][s]), hi(raw[0][s]), hi(raw[1][s])])
}

/// The K offset (within its 64-K chunk) of byte `i` of register `reg` (0: A's registers 0/1, the
/// fragment's columns `4t..4t + 4`; 1: registers 2/3, columns `16 + 4t..`) of K step `s` of
/// thread `t`'s [`weight_fragments_e4m3`]: the [`weight_k`] of the nibble it came from. The
/// activations' B fragment (registers 0 and 1 = the same columns) must hold the activations at
/// these K. Bytes 0 and 2 lie in the first 16 of the step's 32 K, bytes 1 and 3 in the second.
pub const fn a8_k(t: u32, s: u32, reg: u32, i: u32) -> u32 {
    weight_k(16 * t + 8 * s + 2 * i + reg)
}

/// The `prmt` selector that makes staged word `(t, reg)` of a 32-K step from the step's 32
/// activation bytes `P` (as two 16-byte halves of four words, `h0 = P[0..16]`, `h1 = P[16..32]`):
/// `prmt(h0[q], h1[q], sel)` with `q = 2·reg + t / 2` gives the bytes at [`a8_k`]`(t, s, reg, 0..4)`
/// (less 32s): `P[2t' + 8·reg]`, `P[16 + 2t' + 8·reg]`, and the next of each, `t' = t % 2` within
/// the word.
pub const fn a8_stage_selector(t: u32) -> u32 {
    if t.is_multiple_of(2) { 0x5140 } else { 0x7362 }
}

/// Parameters of the sm90 4-bit-weights GEMM. Tensor maps (device memory, 64-byte aligned), 3-D:
/// the reordered weights (bytes of K rounded up to 64, N rows, L; boxes of 32 bytes × 128 rows);
/// the activations (bf16: elements of K, M rows, L, boxes of 64 × tile rows, 128-byte swizzle;
/// codes: bytes, boxes of one stage's bytes × tile rows, no swizzle). Scales: weights (and e2m1
/// activations) as the MX family's `[l][⌈k/64⌉][rows_pad][64 / block]` bytes; W4A8 activations
/// fp32 `[l][⌈k/128⌉][rows_pad]`. The activations' scales are read through `tmap_sx` (3-D: rows_pad
/// elements of one row's scale bytes per plane, planes, l; boxes of [`act_scale_rows`] rows), so
/// that a tile's rows may start anywhere (grouped GEMM).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sm90W4Params {
    pub tmap_w: u64,
    pub tmap_x: u64,
    pub sfw: u64,
    /// 0 for bf16 activations.
    pub tmap_sx: u64,
    /// `[l][m][n]` of `out_type`.
    pub out: u64,
    /// The FP8-MMA kernels ([`fp8`]): each weight row's largest non-NaN scale byte over all of
    /// K, `[l][rows_pad_w]`; else 0.
    pub tops: u64,
    /// With `split_k` > 1, where the K ranges meet (`crate::gemm::splitk`).
    pub splitk: crate::params::SplitKParams,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub l: u32,
    pub rows_pad_w: u32,
    pub _pad: u32,
    /// [`crate::params::OutType`] as u32.
    pub out_type: u32,
    /// Scheduler band height in weight tiles.
    pub group_m: u32,
    pub split_k: u32,
    /// Multiplies every sum before the store (tensor scales).
    pub alpha: f32,
    /// Grouped GEMM (split_k = 1): activation (and C) rows per group, the weights' batch entry
    /// per group. The grouped rows are the schedule's N (the kernel computes Cᵀ).
    pub groups: crate::params::GroupParams,
}

crate::entry::kernel_table! {
    /// # Safety
    /// Launched as [`crate::gemm::driver::run`] says, with parameters made from validated
    /// operands as [`Sm90W4Params`] describes.
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
    unsafe extern "ptx-kernel" fn |K| {
        bare(Sm90W4Params) => kernel::W4Gemm<
            [f32; K.tile.n as usize / 2],
            Of<kernel::ActOf<
                { K.act as u32 },
                Of<ScaleOf<{ K.scale.ty as u32 }, { K.scale.block }>>,
            >>,
            Of<ScaleOf<{ K.scale.ty as u32 }, { K.scale.block }>>,
        >;
    }

    /// Every kernel of the family (the registry's rows): each tile × activation format × weight
    /// scale format.
    pub const KERNELS: &[Sm90W4Kernel] = Sm90W4Kernel::new [
        bare("sm90_w4_gemm_n16_bf16_e2m1_e8m0x32", W4Tile::N16, Bf16, MxScale::E8M0X32),
        bare("sm90_w4_gemm_n16_bf16_e2m1_ue4m3x16", W4Tile::N16, Bf16, MxScale::UE4M3X16),
        bare("sm90_w4_gemm_n16_bf16_e2m1_e8m0x16", W4Tile::N16, Bf16, MxScale::E8M0X16),
        bare("sm90_w4_gemm_n16_e4m3r128_e2m1_e8m0x32", W4Tile::N16, E4m3Row128, MxScale::E8M0X32),
        bare("sm90_w4_gemm_n16_e4m3r128_e2m1_ue4m3x16", W4Tile::N16, E4m3Row128, MxScale::UE4M3X16),
        bare("sm90_w4_gemm_n16_e4m3r128_e2m1_e8m0x16", W4Tile::N16, E4m3Row128, MxScale::E8M0X16),
        bare("sm90_w4_gemm_n16_e2m1_e2m1_e8m0x32", W4Tile::N16, Fp4, MxScale::E8M0X32),
        bare("sm90_w4_gemm_n16_e2m1_e2m1_ue4m3x16", W4Tile::N16, Fp4, MxScale::UE4M3X16),
        bare("sm90_w4_gemm_n16_e2m1_e2m1_e8m0x16", W4Tile::N16, Fp4, MxScale::E8M0X16),
        bare("sm90_w4_gemm_n128_bf16_e2m1_e8m0x32", W4Tile::N128, Bf16, MxScale::E8M0X32),
        bare("sm90_w4_gemm_n128_bf16_e2m1_ue4m3x16", W4Tile::N128, Bf16, MxScale::UE4M3X16),
        bare("sm90_w4_gemm_n128_bf16_e2m1_e8m0x16", W4Tile::N128, Bf16, MxScale::E8M0X16),
        bare("sm90_w4_gemm_n128_e4m3r128_e2m1_e8m0x32", W4Tile::N128, E4m3Row128, MxScale::E8M0X32),
        bare("sm90_w4_gemm_n128_e4m3r128_e2m1_ue4m3x16", W4Tile::N128, E4m3Row128, MxScale::UE4M3X16),
        bare("sm90_w4_gemm_n128_e4m3r128_e2m1_e8m0x16", W4Tile::N128, E4m3Row128, MxScale::E8M0X16),
        bare("sm90_w4_gemm_n128_e2m1_e2m1_e8m0x32", W4Tile::N128, Fp4, MxScale::E8M0X32),
        bare("sm90_w4_gemm_n128_e2m1_e2m1_ue4m3x16", W4Tile::N128, Fp4, MxScale::UE4M3X16),
        bare("sm90_w4_gemm_n128_e2m1_e2m1_e8m0x16", W4Tile::N128, Fp4, MxScale::E8M0X16),
    ];
}

/// The kernel for a tile, activation format and weight scale format.
pub fn kernel(tile: W4Tile, act: Activation, scale: MxScale) -> Option<&'static Sm90W4Kernel> {
    KERNELS
        .iter()
        .find(|k| k.tile == tile && k.act == act && k.scale == scale)
}

const _: () = {
    let mut i = 0;
    while i < KERNELS.len() {
        let k = &KERNELS[i];
        let l = k.layout();
        assert!(l.stages >= 4);
        assert!(128 * (k.tile.producer_regs() + CONSUMERS * k.tile.consumer_regs()) <= 65_536);
        assert!(l.contents.a.is_multiple_of(1024) && l.contents.b.is_multiple_of(1024));
        // Each scale copy a multiple of 16 bytes.
        assert!((WEIGHT_ROWS * BLOCK_K / k.scale.block).is_multiple_of(16));
        assert!((k.tile.n * k.act.scale_bytes(k.scale.block)).is_multiple_of(16));
        assert!(matches!(k.scale.ty, ScaleType::E8M0 | ScaleType::UE4M3));
        i += 1;
    }
};

#[cfg(test)]
mod tests {
    extern crate std;
    use std::format;

    use super::*;

    /// Every tile, activation format and weight scale format has its kernel, named by them (a
    /// table line is written by hand).
    #[test]
    fn every_combination_has_a_kernel_named_by_it() {
        let scales = [MxScale::E8M0X32, MxScale::UE4M3X16, MxScale::E8M0X16];
        let acts = [Activation::Bf16, Activation::E4m3Row128, Activation::Fp4];
        assert_eq!(KERNELS.len(), W4Tile::ALL.len() * acts.len() * scales.len());
        for t in W4Tile::ALL {
            for act in acts {
                for s in scales {
                    assert!(kernel(t, act, s).is_some(), "{t:?} {act:?} {s:?}");
                }
            }
        }
        for k in KERNELS {
            let act = match k.act {
                Activation::Bf16 => "bf16",
                Activation::E4m3Row128 => "e4m3r128",
                Activation::Fp4 => "e2m1",
            };
            let (ty, block) = (k.scale.ty.name(), k.scale.block);
            let want = format!("sm90_w4_gemm_n{}_{act}_e2m1_{ty}x{block}", k.tile.n);
            assert_eq!(k.info.name, want);
        }
    }

    #[test]
    fn the_weight_order_is_a_permutation_that_feeds_each_fragment_word_its_columns() {
        let mut seen = [false; 64];
        for p in 0..64 {
            seen[weight_k(p) as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
        // Thread t, word w, pair j: nibble j (low half) and j + 4 (high half) are K columns
        // 2t + 8·(j%2) (+1) of K step 2w + j/2: the fragment's words 0/1 (j even) and 2/3.
        for t in 0..4 {
            for w in 0..2 {
                for j in 0..4 {
                    let lo = weight_k(16 * t + 8 * w + j);
                    let hi = weight_k(16 * t + 8 * w + j + 4);
                    let kk = 2 * w + j / 2;
                    assert_eq!(lo, 16 * kk + 2 * t + 8 * (j % 2));
                    assert_eq!(hi, lo + 1);
                }
            }
        }
    }

    /// Each fragment word of a thread's two reordered rows is the mma A fragment's: word j of
    /// K step kk holds row 8·(j%2)'s codes at columns 16kk + 8·(j/2) + 2t (low half) and the next,
    /// times that row's scale, exactly (e2m1 times a power of two is a bf16).
    #[test]
    fn weight_fragments_are_the_mma_a_fragments_of_the_reordered_rows() {
        use crate::format::{bf16, e2m1};
        let mut seed = 0x9E37_79B9u32;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        };
        for _ in 0..50 {
            // Two rows of 64 codes (K order), each row's reordered chunk, a scale per K step.
            let codes: [[u8; 64]; 2] =
                core::array::from_fn(|_| core::array::from_fn(|_| (next() % 16) as u8));
            let exps: [[i32; 4]; 2] =
                core::array::from_fn(|_| core::array::from_fn(|_| (next() % 9) as i32 - 4));
            let chunk = |h: usize| -> [u8; 32] {
                core::array::from_fn(|b| {
                    let code = |p: u32| codes[h][weight_k(p) as usize];
                    e2m1::pack(code(2 * b as u32), code(2 * b as u32 + 1))
                })
            };
            let rows = [chunk(0), chunk(1)];
            let scale_bits = |e: i32| ((e + 127) as u32) << 7;
            for t in 0..4usize {
                let word = |h: usize, w: usize| {
                    u32::from_le_bytes(
                        rows[h][8 * t + 4 * w..8 * t + 4 * w + 4]
                            .try_into()
                            .unwrap(),
                    )
                };
                let raw = [[word(0, 0), word(0, 1)], [word(1, 0), word(1, 1)]];
                let frags = weight_fragments(raw, |h, kk| {
                    let b = scale_bits(exps[h][kk as usize]);
                    b | b << 16
                });
                for (kk, words) in frags.iter().enumerate() {
                    for (j, word) in words.iter().enumerate() {
                        let h = j % 2;
                        let col = 16 * kk + 8 * (j / 2) + 2 * t;
                        for (half, c) in [col, col + 1].into_iter().enumerate() {
                            let got = bf16::decode((word >> (16 * half)) as u16);
                            let want = e2m1::decode(codes[h][c]) * (exps[h][kk] as f32).exp2();
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "t {t} kk {kk} word {j} half {half}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Each e4m3 byte of a thread's fragments is the code at its [`a8_k`] times 2^-6, exactly
    /// (every code, both signs, the subnormal 0.5); the K of a step's bytes are the step's 32,
    /// each once per thread and register pair, bytes 0 and 2 in its first 16.
    /// With e2m1's bias folded into the scale (one multiply per pair), the fragments are
    /// bit-for-bit those of two multiplies for every code and every e8m0 byte the fold takes
    /// (scales up to 2, and NaN), and the fold refuses every other byte.
    #[test]
    fn folding_the_bias_into_e8m0_scales_changes_no_fragment_bit() {
        use crate::sm90_mx::dequant::{E8m0x16, E8m0x32, ScaleDecode};
        // Every code in every nibble of both rows' words.
        let raw: [[u32; 2]; 2] = [[0x7654_3210, 0xFEDC_BA98], [0x89AB_CDEF, 0x0123_4567]];
        let mut folded = 0;
        for byte in 0..256u32 {
            assert_eq!(E8m0x32::bias_exact(byte), E8m0x16::bias_exact(byte));
            if !E8m0x32::bias_exact(byte) {
                assert!((129..255).contains(&byte), "byte {byte} refused");
                continue;
            }
            folded += 1;
            // Each row and step its own byte: byte, and a neighbour that the fold also takes.
            let at = |h: usize, kk: u32| {
                let b = (byte + h as u32 + kk) % 129;
                if byte == 0xFF { byte } else { b }
            };
            let two = weight_fragments(raw, |h, kk| E8m0x32::x2(at(h, kk)));
            let one = weight_fragments_biased(raw, |h, kk| E8m0x32::x2_biased(at(h, kk)));
            for (kk, (a, b)) in two.iter().zip(&one).enumerate() {
                for j in 0..4 {
                    let nan = |w: u32, s: u32| (w >> s) & 0x7FFF > 0x7F80;
                    for s in [0, 16] {
                        if nan(a[j], s) {
                            assert!(nan(b[j], s), "byte {byte} kk {kk} word {j}: NaN lost");
                        } else {
                            assert_eq!(
                                (a[j] >> s) & 0xFFFF,
                                (b[j] >> s) & 0xFFFF,
                                "byte {byte} kk {kk} word {j} half {s}"
                            );
                        }
                    }
                }
            }
        }
        assert_eq!(folded, 130);
    }

    #[test]
    fn e4m3_fragments_are_the_codes_at_their_k_times_a_power_of_two() {
        use crate::format::{e2m1, e4m3};
        for rep in 0..40u32 {
            let codes: [[u8; 64]; 2] = core::array::from_fn(|h| {
                core::array::from_fn(|c| ((c as u32 * 7 + h as u32 * 3 + rep * 5) % 16) as u8)
            });
            let chunk = |h: usize| -> [u8; 32] {
                core::array::from_fn(|b| {
                    let code = |p: u32| codes[h][weight_k(p) as usize];
                    e2m1::pack(code(2 * b as u32), code(2 * b as u32 + 1))
                })
            };
            let rows = [chunk(0), chunk(1)];
            for t in 0..4u32 {
                let word = |h: usize, w: usize| {
                    let at = 8 * t as usize + 4 * w;
                    u32::from_le_bytes(rows[h][at..at + 4].try_into().unwrap())
                };
                let raw = [[word(0, 0), word(0, 1)], [word(1, 0), word(1, 1)]];
                let frags = weight_fragments_e4m3(raw);
                for s in 0..2u32 {
                    let mut seen = [0u32; 32];
                    for (r, w) in frags[s as usize].iter().enumerate() {
                        let (h, reg) = (r % 2, r as u32 / 2);
                        for i in 0..4u32 {
                            let k = a8_k(t, s, reg, i);
                            assert!(k / 32 == s && (k % 32 < 16) == (i % 2 == 0));
                            seen[(k % 32) as usize] += 1;
                            let got = e4m3::decode((w >> (8 * i)) as u8);
                            let want = e2m1::decode(codes[h][k as usize]) / 64.0;
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "t {t} s {s} reg {r} byte {i}"
                            );
                        }
                    }
                    // Two rows × 8 K per thread and step: K 2t, 2t + 1 of each quarter.
                    for (k, n) in seen.iter().enumerate() {
                        assert_eq!(
                            *n,
                            if (k % 8) / 2 == t as usize { 2 } else { 0 },
                            "t {t} K {k}"
                        );
                    }
                }
            }
        }
    }

    /// The staging selectors put each activation byte where [`a8_k`] says the fragment reads it.
    #[test]
    fn staged_activation_words_hold_the_k_of_the_weight_bytes() {
        let prmt = |a: u32, b: u32, sel: u32| -> u32 {
            let bytes = (a as u64) | ((b as u64) << 32);
            (0..4).fold(0, |d, j| {
                let pick = (sel >> (4 * j)) & 0x7;
                d | ((((bytes >> (8 * pick)) & 0xFF) as u32) << (8 * j))
            })
        };
        // Activation byte at K k of a step is k + 1 (distinct, never 0).
        let p: [u8; 32] = core::array::from_fn(|k| k as u8 + 1);
        let words = |half: usize| -> [u32; 4] {
            core::array::from_fn(|q| {
                u32::from_le_bytes(
                    p[16 * half + 4 * q..16 * half + 4 * q + 4]
                        .try_into()
                        .unwrap(),
                )
            })
        };
        let (h0, h1) = (words(0), words(1));
        for t in 0..4u32 {
            for reg in 0..2u32 {
                let q = (2 * reg + t / 2) as usize;
                let w = prmt(h0[q], h1[q], a8_stage_selector(t));
                for i in 0..4u32 {
                    let k = a8_k(t, 0, reg, i);
                    assert_eq!((w >> (8 * i)) & 0xFF, k + 1, "t {t} reg {reg} byte {i}");
                }
            }
        }
    }

    #[test]
    fn every_kernel_has_a_unique_name_and_a_layout_that_fits() {
        for (i, k) in KERNELS.iter().enumerate() {
            assert!(KERNELS[i + 1..].iter().all(|o| o.info.name != k.info.name));
            let l = k.layout();
            assert!(
                l.bytes() <= crate::gemm::layout::SMEM_LIMIT,
                "{}",
                k.info.name
            );
            // A consumer holds two stages at once (two at a time, or one prepared ahead), and
            // the producer must have one more to fill meanwhile.
            assert!(l.stages >= 3, "{}: {} stages", k.info.name, l.stages);
        }
        assert_eq!(
            kernel(W4Tile::N16, Activation::Bf16, MxScale::UE4M3X16).map(|k| k.info.name),
            Some("sm90_w4_gemm_n16_bf16_e2m1_ue4m3x16")
        );
    }
}
