//! W4A8 on FP8 tensor cores: e2m1 weights with e8m0 scales (per 32 or per 16) times e4m3
//! activations with fp32 scales per 1×128, by `wgmma` m64n128k32 e4m3 × e4m3 at twice bf16's rate.
//! The family's layouts and roles are [`super`]'s (Cᵀ = B·Aᵀ: the weights are `wgmma`'s A, in
//! registers; the reordered codes of [`super::weight_k`]); what differs is the stage (128 of K,
//! one activation scale block) and the conversion.
//!
//! - Weights: each consumer thread turns its codes into e4m3 bytes with one `prmt` table per
//!   row and scale block ([`fold_table`], [`fast_table`]): the code times 2^(6 − shift), where
//!   `shift` is how many binades the block's scale lies below the row's largest scale over all of
//!   K (`top`, made with the reordered weights). Every e2m1 value times 2^(6 − shift) is an e4m3
//!   value for shift ≤ 11, so the fold is exact; the row's `2^(top − 133)` is multiplied into its
//!   sums after the K loop. A block 12 or more binades below its row's top (say a block of zeros
//!   with a tiny scale) is left out of the first pass and taken in a further pass of the same
//!   stage with shifts less 12·pass ([`table`]): rare, and still exact (contributions more than
//!   2^149 below the top flush to zero, as f32's subnormals end). NaN scales make NaN bytes (e4m3
//!   `0x7F`) in the first pass.
//! - Activations: `wgmma`'s B, used as TMA loads them (128-byte swizzled, K in order). Each
//!   thread gathers the codes of its fragment's K from the stored words of two threads
//!   ([`direct_words`]: the stored order serves the bf16 paths' fragments, whose pairs are
//!   K `2t`, `2t + 1`), so nothing but the weights' registers depends on that order.
//! - Sums: each stage's four MMAs start a fresh fragment, which is added to the fp32 sums times
//!   the activation row's scale (and 2^(−12·pass)) — FP8 tensor-core accumulation within 128 of
//!   K, as the FP8 block-wise kernel's.
//!
//! The kernel body is [`kernel`] (sm_90a only).

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
pub mod kernel;

use super::{A8_SCALE_K, Activation, Sm90W4Kernel, W4Tile, WEIGHT_ROW_BYTES, WEIGHT_ROWS};
use crate::format::MxScale;
use crate::gemm::layout::{StageContents, StageLayout};
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
use crate::{entry::Of, sm90_mx::dequant::ScaleOf};

/// K per stage: one activation scale block, two 64-K chunks of the reordered weights.
pub const FP8_BLOCK_K: u32 = A8_SCALE_K;
/// The one tile: 128 activation rows (`wgmma` m64n128k32).
pub const FP8_TILE: W4Tile = W4Tile::N128;
/// Bytes of one activation row of a stage (e4m3).
pub const ACT_ROW_BYTES: u32 = FP8_BLOCK_K;
/// Binades one pass folds: shifts 0..=11 keep every e2m1 value normal in e4m3 ([`fold_table`]).
pub const PASS_BINADES: u32 = 12;
/// The e4m3 byte table of a NaN scale (every code NaN).
pub const NAN_TABLE: [u32; 2] = [0x7F7F_7F7F; 2];

/// Per stage: the activation tile (e4m3, 128-byte swizzled), the weight tile (two chunks of 128
/// rows, chunk-major), the weights' scale bytes (two planes of `64 / block` per row), the
/// activations' fp32 scales (a box of [`super::act_scale_rows`]) and the weight rows' tops (one
/// byte each, [`super::Sm90W4Params::tops`]).
pub const fn layout(scale_block: u32) -> StageLayout {
    StageLayout::fit(StageContents {
        a: FP8_TILE.n * ACT_ROW_BYTES,
        b: 2 * WEIGHT_ROWS * WEIGHT_ROW_BYTES,
        sfa: WEIGHT_ROWS * (FP8_BLOCK_K / scale_block)
            + super::act_scale_rows(FP8_TILE, Activation::E4m3Row128, scale_block) * 4
            + WEIGHT_ROWS,
        words: 0,
        out: 0,
    })
}

/// `prmt.b32` (PTX ISA "Integer Arithmetic Instructions: prmt", default mode): byte j of the
/// result is byte `sel[4j + 2 : 4j]` of `{b, a}`; on the host, the same rule in Rust (tests).
#[inline(always)]
pub fn prmt(a: u32, b: u32, sel: u32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    {
        crate::ptx::bits::prmt(a, b, sel)
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        let bytes = (a as u64) | ((b as u64) << 32);
        (0..4).fold(0, |d, j| {
            let pick = (sel >> (4 * j)) & 0x7;
            d | ((((bytes >> (8 * pick)) & 0xFF) as u32) << (8 * j))
        })
    }
}

/// The bits of `a` where `mask` is set, of `b` elsewhere (`lop3`, [`crate::ptx::bits::select`]);
/// on the host, the same in Rust (tests).
#[inline(always)]
pub fn select(a: u32, b: u32, mask: u32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    {
        crate::ptx::bits::select(a, b, mask)
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        (a & mask) | (b & !mask)
    }
}

/// The e4m3 codes of the eight e2m1 magnitudes times 2^(6 − shift), for shift ≤ 11, as the byte
/// table `prmt` indexes (magnitude j in byte j of `{[1], [0]}`): magnitude 1 (0.5) gets exponent
/// field 12 − shift, magnitudes 2–7 their own bits shifted into e4m3's exponent and mantissa
/// fields plus 12 − shift in the exponent (as [`crate::format::fold::e2m1_table`]'s normal range,
/// without its general case).
#[inline(always)]
pub const fn fold_table(shift: u32) -> [u32; 2] {
    let a = (12 - shift) << 3;
    [0x0C08_0000 + a * 0x0101_0100, 0x1C18_1410 + a * 0x0101_0101]
}

/// [`fold_table`] is affine in the shift: `fold_table(r) = TABLE_K − r·TABLE_M` (each byte's
/// exponent field falls by r), so with `r = top − byte` a row's tables are one multiply-add per
/// word from [`row_base`].
pub const TABLE_M: [u32; 2] = [0x0808_0800, 0x0808_0808];
pub const TABLE_K: [u32; 2] = [0x0C08_0000 + 12 * TABLE_M[0], 0x1C18_1410 + 12 * TABLE_M[1]];

/// A row's table base for its top scale byte `top` ([`fast_table`]).
#[inline(always)]
pub const fn row_base(top: u32) -> [u32; 2] {
    [
        TABLE_K[0].wrapping_sub(top.wrapping_mul(TABLE_M[0])),
        TABLE_K[1].wrapping_sub(top.wrapping_mul(TABLE_M[1])),
    ]
}

/// [`fold_table`]`(top − byte)` for a row of base [`row_base`]`(top)`, where `top − byte` is
/// 0..=11 and no byte is NaN (a stage whose rows are all so takes this path, [`span_is_plain`]).
#[inline(always)]
pub const fn fast_table(byte: u32, base: [u32; 2]) -> [u32; 2] {
    [
        byte.wrapping_mul(TABLE_M[0]).wrapping_add(base[0]),
        byte.wrapping_mul(TABLE_M[1]).wrapping_add(base[1]),
    ]
}

/// The largest and smallest of a row's scale bytes of a stage (the first `blocks` of `bytes`).
#[inline(always)]
#[allow(clippy::needless_range_loop)] // (Index loops: unrolled, the bytes kept in registers.)
pub fn span<const B: usize>(bytes: &[u32; B], blocks: usize) -> (u32, u32) {
    let (mut hi, mut lo) = (bytes[0], bytes[0]);
    for i in 1..B {
        if i < blocks {
            hi = hi.max(bytes[i]);
            lo = lo.min(bytes[i]);
        }
    }
    (hi, lo)
}

/// Whether a row of [`span`] `(hi, lo)` folds in one pass by [`fast_table`]: no NaN scale (the
/// largest byte is not 0xFF) and every block within 11 binades of the top.
#[inline(always)]
pub const fn span_is_plain((hi, lo): (u32, u32)) -> bool {
    hi != 0xFF && hi - lo < PASS_BINADES
}

/// The table of a block with scale byte `byte` in a row whose largest non-NaN scale byte of the
/// stage is `top`, in pass `pass`: NaN bytes in pass 0 for a NaN scale; the fold of its shift
/// less 12·pass where that is 0..=11; zeros (the block belongs to another pass) otherwise.
#[inline(always)]
pub const fn table(byte: u32, top: u32, pass: u32) -> [u32; 2] {
    if byte == 0xFF {
        if pass == 0 { NAN_TABLE } else { [0, 0] }
    } else {
        let rel = (top - byte).wrapping_sub(PASS_BINADES * pass);
        if rel < PASS_BINADES {
            fold_table(rel)
        } else {
            [0, 0]
        }
    }
}

/// The passes beyond the first that a row's blocks need: `max (top − byte) / 12` over its
/// non-NaN bytes, `top` being the row's largest non-NaN byte.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
pub fn extra_passes<const B: usize>(bytes: &[u32; B], top: u32) -> u32 {
    // (Index loop over a constant bound: unrolled, the bytes kept in registers.)
    let mut extra = 0;
    for i in 0..B {
        if bytes[i] != 0xFF {
            extra = extra.max(top.saturating_sub(bytes[i]) / PASS_BINADES);
        }
    }
    extra
}

/// The weight row's factor in pass `pass`: `2^(top − 127 − 6 − 12·pass)` (the table's 2^6 out),
/// exact in f32 down to its subnormals, 0 below them.
#[inline(always)]
pub fn row_factor(top: u32, pass: u32) -> f32 {
    let e = top as i32 - 6 - (PASS_BINADES * pass) as i32;
    if e >= 1 {
        f32::from_bits((e as u32) << 23)
    } else if e > -23 {
        f32::from_bits(1 << (22 + e))
    } else {
        0.0
    }
}

/// The e4m3 bytes of a word `x` of eight codes: the word of nibbles 0–3 and that of nibbles 4–7
/// ([`direct_words`] gathers `x` so that bytes 0 and 1 of each are K below 16 of a step). Bytes
/// 0 and 1 of each take table `first`, bytes 2 and 3 table `second` (the same for scales per
/// 32). Magnitudes through the table; signs by bytes: nibble `2b`'s sign (bit 3 of byte b) is
/// bit 7 of byte b of `x << 4`, nibble `2b + 1`'s is bit 7 of byte b of `x`, so one `prmt` of `x`
/// and `x << 4` with a constant selector puts every sign at bit 7 of its output byte.
#[inline(always)]
pub fn fragment_words(x: u32, first: [u32; 2], second: [u32; 2], same: bool) -> [u32; 2] {
    let mag = x & 0x7777_7777;
    let up = x << 4;
    let word = |m: u32, sel: u32| {
        let lo = prmt(first[0], first[1], m);
        let v = if same {
            lo
        } else {
            prmt(lo, prmt(second[0], second[1], m), 0x7610)
        };
        v | (prmt(x, up, sel) & 0x8080_8080)
    };
    // Output byte j of nibbles 0–3: x<<4's byte j/2 (j even) or x's (j odd); of nibbles 4–7 the
    // same from bytes 2 and 3.
    [word(mag, 0x1504), word(mag >> 16, 0x3726)]
}

/// The two e4m3 fragment words of one weight row's 32-K step for thread `t` (lane % 4) of a
/// warp, with the activations in their own K order (`wgmma`'s A fragment of m64nNk32 e4m3, PTX
/// ISA "Register Fragments and Shared Memory Matrix Layouts": register 0 holds K `4t..4t + 4`,
/// register 1 K `16 + 4t..`). The stored order ([`super::weight_k`]) puts K `8j + 2t'` and the
/// next in nibbles `j` and `j + 4` of thread `t'`'s word, so thread `t`'s eight codes lie in the
/// words `x` and `y` of threads `2·(t % 2)` and `2·(t % 2) + 1`: nibbles `t / 2 + {0, 2, 4, 6}` of
/// each. They are gathered into one word (those of `x` at even nibbles, of `y` at odd ones),
/// folded by [`fragment_words`] (K 4t, 4t + 2, 16 + 4t, 16 + 4t + 2 of the gathered word's low
/// half; the next K in its high half), and interleaved by two byte permutes.
#[inline(always)]
pub fn direct_words(
    (x, y): (u32, u32),
    t: u32,
    first: [u32; 2],
    second: [u32; 2],
    same: bool,
) -> [u32; 2] {
    let a = 4 * (t / 2);
    let m = select(x >> a, y << (4 - a), 0x0F0F_0F0F);
    let [p, q] = fragment_words(m, first, second, same);
    [prmt(p, q, 0x5140), prmt(p, q, 0x7362)]
}

crate::entry::kernel_table! {
    /// # Safety
    /// Launched as [`crate::gemm::driver::run`] says, with parameters made from validated
    /// operands as [`super::Sm90W4Params`] describes (the activation map: boxes of 128 bytes ×
    /// 128 rows, 128-byte swizzle; K a multiple of 128).
    #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
    unsafe extern "ptx-kernel" fn |K| {
        bare(super::Sm90W4Params) => kernel::W4Fp8Gemm<
            Of<ScaleOf<{ K.scale.ty as u32 }, { K.scale.block }>>,
        >;
    }

    /// The FP8-MMA kernels (the registry's rows): e8m0 scales per 32 and per 16.
    pub const KERNELS: &[Sm90W4Kernel] = Sm90W4Kernel::fp8 [
        bare("sm90_w4_fp8_gemm_n128_e4m3r128_e2m1_e8m0x32", MxScale::E8M0X32),
        bare("sm90_w4_fp8_gemm_n128_e4m3r128_e2m1_e8m0x16", MxScale::E8M0X16),
    ];
}

/// The FP8-MMA kernel for weights of scale format `scale` (e8m0 only: a ue4m3 scale is no power
/// of two, so no shift folds it).
pub fn kernel(scale: MxScale) -> Option<&'static Sm90W4Kernel> {
    KERNELS.iter().find(|k| k.scale == scale)
}

const _: () = {
    let mut i = 0;
    while i < KERNELS.len() {
        let l = KERNELS[i].layout();
        assert!(l.stages >= 4);
        assert!(l.contents.a.is_multiple_of(1024) && l.contents.b.is_multiple_of(1024));
        i += 1;
    }
};

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use crate::format::{e2m1, e4m3, fold};
    use crate::sm90_w4::weight_k;

    #[test]
    fn the_fold_table_is_the_general_rule_in_its_range() {
        for shift in 0..PASS_BINADES {
            assert_eq!(fold_table(shift), fold::e2m1_table(shift), "shift {shift}");
            for (m, b) in (0..8).map(|m| (m, prmt(fold_table(shift)[0], fold_table(shift)[1], m))) {
                let want = e2m1::decode(m as u8) * ((6 - shift as i32) as f32).exp2();
                assert_eq!(e4m3::decode(b as u8), want, "shift {shift} magnitude {m}");
            }
        }
    }

    /// Every code of every nibble, through the tables of every pass: each value lands in exactly
    /// one pass (NaN in the first), exactly, and the row factor restores its scale.
    #[test]
    fn every_code_and_scale_folds_exactly_in_one_pass() {
        let x = 0xFEDC_BA98u32;
        let y = 0x7654_3210u32;
        for top in [0u32, 1, 20, 127, 140, 254] {
            for byte in (0..=top).chain([0xFF]) {
                let extra = extra_passes(&[top, byte], top);
                let mut seen = [[0u32; 8]; 2];
                for pass in 0..=extra + 1 {
                    let t = table(byte, top, pass);
                    for (wi, w) in [x, y].into_iter().enumerate() {
                        let [lo, hi] = fragment_words(w, t, t, true);
                        for (i, v) in [lo, hi].into_iter().enumerate() {
                            for b in 0..4 {
                                let code = (w >> (4 * (4 * i + b))) & 0xF;
                                let got = e4m3::decode((v >> (8 * b)) as u8);
                                let want_val = e2m1::decode(code as u8) as f64
                                    * ((byte as i32 - 127) as f64).exp2();
                                if byte == 0xFF {
                                    if pass == 0 {
                                        assert!(got.is_nan());
                                    } else {
                                        assert_eq!(got, 0.0);
                                    }
                                    continue;
                                }
                                if got != 0.0 {
                                    seen[wi][4 * i + b] += 1;
                                    let f = row_factor(top, pass) as f64;
                                    assert_eq!(
                                        got as f64 * f,
                                        want_val,
                                        "top {top} byte {byte} pass {pass} code {code}"
                                    );
                                } else {
                                    assert!(
                                        code & 7 == 0 || (top - byte) / PASS_BINADES != pass,
                                        "top {top} byte {byte} pass {pass} code {code} lost"
                                    );
                                }
                            }
                        }
                    }
                }
                if byte != 0xFF {
                    for (wi, w) in [x, y].into_iter().enumerate() {
                        for (n, &times) in seen[wi].iter().enumerate() {
                            let code = (w >> (4 * n)) & 0xF;
                            assert_eq!(times, u32::from(code & 7 != 0), "top {top} byte {byte}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn scales_per_16_take_their_own_table_for_each_half_of_the_step() {
        let (a, b) = (fold_table(0), fold_table(3));
        let x = 0x2222_2222u32; // magnitude 2 (1.0) everywhere
        for v in fragment_words(x, a, b, false) {
            assert_eq!(e4m3::decode(v as u8), 64.0);
            assert_eq!(e4m3::decode((v >> 8) as u8), 64.0);
            assert_eq!(e4m3::decode((v >> 16) as u8), 8.0);
            assert_eq!(e4m3::decode((v >> 24) as u8), 8.0);
        }
    }

    /// Each byte of [`direct_words`] is the code the stored order ([`weight_k`]) keeps at the K of
    /// its fragment position (register r, byte i of thread t: K `16r + 4t + i`), for each of a
    /// step's 32 K, with per-16 tables telling the halves apart.
    #[test]
    fn direct_words_put_each_code_at_its_own_k() {
        // A row's 64-K chunk of codes: the code of K k is magnitude k % 7 + 1 with k's sign bit.
        let code = |k: u32| (k % 7 + 1) | ((k / 7) % 2) << 3;
        let mut stored = [0u32; 8]; // words [t][s] of the stored chunk, as threads read them
        for p in 0..64 {
            stored[(p / 8) as usize] |= code(weight_k(p)) << (4 * (p % 8));
        }
        let (first, second) = (fold_table(0), fold_table(1));
        for s in 0..2u32 {
            for t in 0..4u32 {
                let t0 = 2 * (t % 2);
                let (x, y) = (
                    stored[(2 * t0 + s) as usize],
                    stored[(2 * t0 + 2 + s) as usize],
                );
                for (same, second) in [(true, first), (false, second)] {
                    let regs = direct_words((x, y), t, first, second, same);
                    for r in 0..2u32 {
                        for i in 0..4u32 {
                            let k = 32 * s + 16 * r + 4 * t + i;
                            let c = code(k);
                            let shift = if r == 1 && !same { 1 } else { 0 };
                            let want = e2m1::decode(c as u8) * ((6 - shift) as f32).exp2();
                            let got = e4m3::decode((regs[r as usize] >> (8 * i)) as u8);
                            assert_eq!(got, want, "s {s} t {t} reg {r} byte {i} same {same}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_fast_tables_are_the_fold_tables_of_their_shift() {
        for top in 0..255u32 {
            for byte in top.saturating_sub(PASS_BINADES - 1)..=top {
                assert_eq!(fast_table(byte, row_base(top)), fold_table(top - byte));
                assert_eq!(fast_table(byte, row_base(top)), table(byte, top, 0));
            }
        }
        assert_eq!(span(&[3, 9, 0xFF, 1], 2), (9, 3));
        assert!(span_is_plain((20, 9)) && !span_is_plain((21, 9)) && !span_is_plain((0xFF, 9)));
    }

    #[test]
    fn row_factors_are_powers_of_two_into_the_subnormals() {
        assert_eq!(row_factor(133, 0), 1.0);
        assert_eq!(row_factor(127, 0), 2f32.powi(-6));
        assert_eq!(row_factor(133, 1), 2f32.powi(-12));
        assert_eq!(row_factor(0, 0), (-133f64).exp2() as f32);
        assert_eq!(row_factor(0, 2), 0.0);
        assert_eq!(row_factor(254, 0), 2f32.powi(121));
    }

    #[test]
    fn the_fp8_kernels_are_named_by_their_scales_and_fit() {
        for k in KERNELS {
            assert!(k.fp8 && k.tile == FP8_TILE && k.act == Activation::E4m3Row128);
            let name = std::format!(
                "sm90_w4_fp8_gemm_n128_e4m3r128_e2m1_{}x{}",
                k.scale.ty.name(),
                k.scale.block
            );
            assert_eq!(k.info.name, name);
            assert!(k.layout().bytes() <= crate::gemm::layout::SMEM_LIMIT);
        }
        assert!(kernel(MxScale::UE4M3X16).is_none());
    }
}
