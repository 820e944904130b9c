//! Promotion of FP8 partial sums: Hopper's FP8 tensor-core accumulation is not full fp32, so a
//! kernel accumulates each scale block's K range into a scratch fragment and adds it, scaled, into
//! fp32 sums (every 128 of K here).

use crate::plant;
use crate::ptx::wgmma::Fragment;

/// `acc += part · f`, with `f0` for the thread's first row and `f1` for its second (fragment value
/// `i` is in row `+8·((i/2)%2)`). Fused (one FFMA, not FMUL + FADD: Rust never contracts
/// `a * b + c`), because the promotion sits on each warpgroup's critical path between its MMA
/// batches.
#[inline(always)]
pub fn promote<F: Fragment>(acc: &mut F, part: &F, f0: f32, f1: f32) {
    // Every column before the split: one factor pair for the whole fragment.
    promote_split(acc, part, (f0, f1), (f0, f1), F::N);
}

/// [`promote`] for a tile whose columns straddle two B-scale blocks: columns before `split` (a
/// multiple of 8, as every wide tile's boundary is a multiple of 16) take `f` (first row, second
/// row), the others `g`. Fragment value `i` is in the 8-column group `i / 4` whatever the lane,
/// so the choice is one compare per group, not per value.
#[inline(always)]
pub fn promote_split<F: Fragment>(
    acc: &mut F,
    part: &F,
    (f0, f1): (f32, f32),
    (g0, g1): (f32, f32),
    split: u32,
) {
    let (sums, part) = (acc.as_mut(), part.as_ref());
    for q in 0..(F::N / 8) as usize {
        let (h0, h1) = if 8 * (q as u32) < split {
            (f0, f1)
        } else {
            (g0, g1)
        };
        for e in 0..4 {
            let i = 4 * q + e;
            let f = plant::PROMOTE * if e / 2 == 0 { h0 } else { h1 };
            sums[i] = core::f32::math::mul_add(part[i], f, sums[i]);
        }
    }
    // Pins the sums here: LLVM otherwise sinks them to the loop latch (their only use is the next
    // K block), past the next wave's MMAs, whose scratch then no longer fits beside them.
    acc.fence();
}

/// `acc += part · f(col)` with one factor per column (scales that vary along the fragment's N:
/// the activations' of a kernel computing Cᵀ). Fragment value `i` is in column
/// `8·(i/4) + 2·(lane%4) + i%2`, of row `+8·((i/2)%2)`; `f` is called once per column of this
/// thread (`N/4` calls). Fused, as [`promote`].
#[inline(always)]
pub fn promote_columns<F: Fragment>(acc: &mut F, part: &F, lane: u32, f: impl Fn(u32) -> f32) {
    let (sums, part) = (acc.as_mut(), part.as_ref());
    for q in 0..(F::N / 8) as usize {
        for h in 0..2 {
            let factor = plant::PROMOTE * f(8 * q as u32 + 2 * (lane % 4) + h as u32);
            for r in 0..2 {
                let i = 4 * q + 2 * r + h;
                sums[i] = core::f32::math::mul_add(part[i], factor, sums[i]);
            }
        }
    }
    acc.fence();
}
