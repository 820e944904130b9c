//! Warp-level MMA (PTX ISA "Warp Level Matrix Multiply-Accumulate Instructions: mma"): one warp's
//! synchronous tile product from register fragments, for kernels whose tiles are too small for
//! `wgmma`'s 64-row warpgroup tiles (a weight stream at decode sizes).

use core::arch::asm;

/// One `mma.sync.aligned.m16n8k16.row.col.f32.<ty>.<ty>.f32` wrapper per 16-bit operand type:
/// the same fragments and body, the type in the instruction's name.
macro_rules! m16n8k16 {
    ($(#[$doc:meta])* $name:ident, $ty:literal) => {
        $(#[$doc])*
        #[inline(always)]
        pub fn $name(acc: &mut [f32; 4], a: [u32; 4], b: [u32; 2]) {
            let [d0, d1, d2, d3] = acc;
            // SAFETY: registers only; every lane of the warp executes it (the kernels call it in
            // warp-uniform control flow, as `.aligned` requires).
            unsafe {
                asm!(
                    concat!(
                        "mma.sync.aligned.m16n8k16.row.col.f32.", $ty, ".", $ty, ".f32 ",
                        "{{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, ",
                        "{{{d0}, {d1}, {d2}, {d3}}};"
                    ),
                    d0 = inout(reg32) *d0, d1 = inout(reg32) *d1, d2 = inout(reg32) *d2,
                    d3 = inout(reg32) *d3, a0 = in(reg32) a[0], a1 = in(reg32) a[1],
                    a2 = in(reg32) a[2], a3 = in(reg32) a[3], b0 = in(reg32) b[0],
                    b1 = in(reg32) b[1], options(nostack, pure, nomem)
                )
            };
        }
    };
}

m16n8k16! {
    /// `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`: `acc += A·B` for a 16 × 16 bf16 A
    /// (row-major) and a 16 × 8 bf16 B (column-major), in the fragments of PTX ISA "Matrix
    /// Fragments for mma.m16n8k16 with floating point type". With `g = lane / 4`, `t = lane % 4`:
    /// `a` holds A's (row g, columns 2t, 2t+1), (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..),
    /// low half first; `b` holds B's (rows 2t, 2t+1, column g) and (rows 2t + 8.., column g);
    /// `acc` C's (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1). These are also the A fragment
    /// and the per-warp C fragment of `wgmma` m64nNk16 (`crate::ptx::wgmma`), 16 rows per warp.
    m16n8k16_bf16, "bf16"
}

m16n8k16! {
    /// `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`: [`m16n8k16_bf16`] with fp16 operands
    /// (the same fragments). The 4-bit weights' W4A8 stream converts its e4m3 operands to fp16
    /// (exact) for it: on sm_90, which has no FP8 `mma.sync` unit, ptxas lowers the e4m3 form to
    /// the same conversions and two of these, then adds the accumulator input with one more add
    /// per value.
    m16n8k16_f16, "f16"
}
