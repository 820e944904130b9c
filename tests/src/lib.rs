//! Shared test support: random inputs that exercise the scales, and element-wise comparison with
//! tolerances stated in units of the arithmetic (never a bare epsilon).

use blockscaled::{
    DeviceMatrix, Gpu, HostOutput, OperandFormat, OutType, Plan, ScaleLayout, ScaleMajor,
    ScaledMatrix, output_ulp,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The run's base seed for random inputs: `BLOCKSCALED_SEED` (decimal or 0x-hex) where set, to
/// replay a failure, else a fixed value, so that a run is repeatable. The first call installs a
/// panic hook that prints the seed and how to replay it after any failure of the process's tests.
pub fn run_seed() -> u64 {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SEED.get_or_init(|| {
        let seed = std::env::var("BLOCKSCALED_SEED")
            .ok()
            .and_then(|v| match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16).ok(),
                None => v.parse().ok(),
            })
            .unwrap_or(0x5EED_0001);
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            eprintln!("(inputs from seed {seed:#x}: replay with BLOCKSCALED_SEED={seed:#x})");
        }));
        seed
    })
}

/// Random values, never all zero: each row gets its own magnitude 2^e (e in -6..=6) so blocks see
/// different scales, elements are uniform in ±[0.05, 1) of it (no zeros), a few are exact zeros
/// and a few are 20× outliers (to make block maxima matter).
pub fn random_values(seed: u64, len: usize, row_len: usize) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(len);
    let mut mag = 1.0f32;
    for i in 0..len {
        if i % row_len.max(1) == 0 {
            mag = 2f32.powi(rng.random_range(-6..=6));
        }
        let r: f32 = rng.random_range(0.05..1.0);
        let sign = if rng.random_bool(0.5) { -1.0 } else { 1.0 };
        let v = match rng.random_range(0..100) {
            0 => 0.0,
            1 => sign * r * mag * 20.0,
            _ => sign * r * mag,
        };
        out.push(v);
    }
    out
}

/// Random weights: as [`random_values`], but with the magnitudes of a trained model's weights,
/// each row's 2^e with e in -8..=-1 (so 4-bit block scales are at most 2^0), and one row in 32
/// at 2^4 (scales of 4: the kernels' paths for large scales run in the same launch).
pub fn random_weights(seed: u64, len: usize, row_len: usize) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5745_4947_4854_5321);
    let mut v = random_values(seed, len, row_len);
    for row in v.chunks_mut(row_len.max(1)) {
        let e = if rng.random_range(0..32) == 0 {
            4
        } else {
            rng.random_range(-8..=-1)
        };
        // random_values' rows are 2^(-6..=6) times values in ±[0.05, 20): rescale the row by
        // its largest magnitude so that it ends near 2^e.
        let max = row.iter().fold(0f32, |m, x| m.max(x.abs()));
        if max > 0.0 {
            let f = 2f32.powi(e) / max;
            row.iter_mut().for_each(|x| *x *= f);
        }
    }
    v
}

/// Quantizes fresh random values into `format`.
pub fn random_matrix(
    seed: u64,
    rows: usize,
    k: usize,
    batch: usize,
    format: OperandFormat,
) -> (Vec<f32>, ScaledMatrix) {
    let v = random_values(seed, rows * k * batch, k);
    let m = ScaledMatrix::quantize(&v, rows, k, batch, format).expect("valid random matrix");
    (v, m)
}

/// Rows `r0..r1` of weights `m` in the DeepSeek layout (fp32 scales per 128×128, K-major):
/// `r0` and `r1` on 128-row scale blocks (the end may be the last row). A tensor-parallel
/// rank's share of a column split.
pub fn weight_rows(m: &ScaledMatrix, r0: usize, r1: usize) -> ScaledMatrix {
    let (k, kb) = (m.k(), m.k().div_ceil(128));
    let (b0, b1) = (r0 / 128, r1.div_ceil(128));
    let data = m.data()[r0 * k..r1 * k].to_vec();
    let scales = m.scales()[b0 * kb * 4..b1 * kb * 4].to_vec();
    let layout = ScaleLayout::packed(ScaleMajor::K, b1 - b0, kb);
    ScaledMatrix::from_parts(m.format(), r1 - r0, k, 1, data, scales, layout, 1.0)
        .expect("a slice of valid weights on scale blocks")
}

/// Columns `k0..k1` of K of weights `m` in the DeepSeek layout, on 128-column scale blocks: a
/// tensor-parallel rank's share of a row split.
pub fn weight_cols(m: &ScaledMatrix, k0: usize, k1: usize) -> ScaledMatrix {
    let (n, k, kb) = (m.rows(), m.k(), m.k().div_ceil(128));
    let (b0, b1) = (k0 / 128, k1 / 128);
    let data = (0..n)
        .flat_map(|r| m.data()[r * k + k0..r * k + k1].to_vec())
        .collect();
    let scales = (0..n.div_ceil(128))
        .flat_map(|rb| m.scales()[(rb * kb + b0) * 4..(rb * kb + b1) * 4].to_vec())
        .collect();
    let layout = ScaleLayout::packed(ScaleMajor::K, n.div_ceil(128), b1 - b0);
    ScaledMatrix::from_parts(m.format(), n, k1 - k0, 1, data, scales, layout, 1.0)
        .expect("a slice of valid weights on scale blocks")
}

/// `m` with its scale bytes replaced by `scales` (same layout).
pub fn with_scales(m: &ScaledMatrix, scales: Vec<u8>) -> ScaledMatrix {
    with_parts(m, m.data().to_vec(), scales)
}

/// `m` with its codes and scale bytes replaced (same format, shape, layout and tensor scale).
pub fn with_parts(m: &ScaledMatrix, data: Vec<u8>, scales: Vec<u8>) -> ScaledMatrix {
    ScaledMatrix::from_desc(*m.desc(), data, scales).expect("same layout as a valid matrix")
}

/// A (`m` × `k`, format `fa`) and B (`n` × `k`, format `fb`) of fresh random values, `l` batch
/// entries, from one seed (B's derived from it).
pub fn random_pair(
    seed: u64,
    dims: (usize, usize, usize, usize),
    fa: OperandFormat,
    fb: OperandFormat,
) -> (ScaledMatrix, ScaledMatrix) {
    pair_with(seed, dims, (fa, fb), random_values)
}

/// As [`random_pair`] with B of [`random_weights`] (A's seed the same).
pub fn random_weight_pair(
    seed: u64,
    dims: (usize, usize, usize, usize),
    fa: OperandFormat,
    fb: OperandFormat,
) -> (ScaledMatrix, ScaledMatrix) {
    pair_with(seed, dims, (fa, fb), random_weights)
}

/// A of [`random_matrix`] and B quantized from `b_values(b's seed, len, k)`.
fn pair_with(
    seed: u64,
    (m, n, k, l): (usize, usize, usize, usize),
    (fa, fb): (OperandFormat, OperandFormat),
    b_values: fn(u64, usize, usize) -> Vec<f32>,
) -> (ScaledMatrix, ScaledMatrix) {
    let (_, a) = random_matrix(seed, m, k, l, fa);
    let b_seed = seed.wrapping_mul(0x2545_F491_4F6C_DD1D).wrapping_add(1);
    let v = b_values(b_seed, n * k * l, k);
    let b = ScaledMatrix::quantize(&v, n, k, l, fb).expect("valid random B");
    (a, b)
}

/// A · Bᵀ on `g` with the plan `plan` picks for the uploaded operands, into an output poisoned
/// with NaN first; the result on the host.
pub fn gemm_on(
    g: &Gpu,
    a: &ScaledMatrix,
    b: &ScaledMatrix,
    dtype: OutType,
    plan: impl FnOnce(&DeviceMatrix, &DeviceMatrix) -> Result<Plan, String>,
) -> Result<HostOutput, String> {
    let e = |x: blockscaled::Error| x.to_string();
    let (da, db) = (g.upload(a).map_err(e)?, g.upload(b).map_err(e)?);
    let plan = plan(&da, &db)?;
    let mut c = g.output(a.rows(), b.rows(), a.batch(), dtype).map_err(e)?; // NaN-poisoned
    g.gemm_with(&da, &db, &mut c, plan).map_err(e)?;
    c.to_host().map_err(e)
}

/// Operands whose products never cancel: [`random_values`] made non-negative, then, when
/// `signed_rows`, each row (of each batch entry) given one random sign. A GEMM of a non-negative A
/// with such a B has |C| = Σ_k |a_k·b_k| in every element, so an error bound stated as a fraction
/// of Σ|a·b| is that fraction of |C| itself, and a small systematic error (a wrong scale, a weaker
/// accumulator) shows instead of hiding in the slack that random signs need.
pub fn no_cancellation_matrix(
    seed: u64,
    rows: usize,
    k: usize,
    batch: usize,
    format: OperandFormat,
    signed_rows: bool,
) -> ScaledMatrix {
    let mut v = random_values(seed, rows * k * batch, k);
    let mut rng = StdRng::seed_from_u64(seed ^ 0x9E37_79B9_7F4A_7C15);
    for row in v.chunks_mut(k) {
        let sign = if signed_rows && rng.random_bool(0.5) {
            -1.0
        } else {
            1.0
        };
        row.iter_mut().for_each(|x| *x = sign * x.abs());
    }
    ScaledMatrix::quantize(&v, rows, k, batch, format).expect("valid random matrix")
}

/// The error a kernel may make on operands that do not cancel (A ≥ 0, each row of B of one
/// sign: [`no_cancellation_matrix`]), where |C| = Σ_k |a_k·b_k| in every element: per element at
/// most `below` of it under the exact sum and `above` over it; the mean relative deviation
/// ([`mean_relative_deviation`]) within `mean`. Each family's kernels state theirs from their
/// arithmetic.
#[derive(Clone, Copy, Debug)]
pub struct NoCancellation {
    pub below: f64,
    pub above: f64,
    pub mean: (f64, f64),
}

impl NoCancellation {
    /// Hopper FP8 tensor cores with partial sums promoted to fp32 every 128 of K: truncation
    /// toward zero, [`FP8_ACCUMULATION_REL`] below and nothing but roundings (2^-16) above; the
    /// mean within 2^-9 below (truncation's spread) and 2^-16 above.
    pub const FP8: NoCancellation = NoCancellation {
        below: FP8_ACCUMULATION_REL,
        above: 1.0 / 65536.0,
        mean: (-1.0 / 512.0, 1.0 / 65536.0),
    };

    /// bf16 or fp16 tensor cores on operands exact in that type (the MX, 16-bit and
    /// 4-bit-weights kernels), K = `k`: [`bf16_mma_rel`] on either side and for the mean.
    pub fn half(k: usize) -> NoCancellation {
        let r = bf16_mma_rel(k);
        NoCancellation {
            below: r,
            above: r,
            mean: (-r, r),
        }
    }

    /// `self` scaled by `factor` ≥ 1 (an epilogue's α applied to a product, whose output adds
    /// one rounding of its own).
    pub fn scaled(self, factor: f64) -> NoCancellation {
        NoCancellation {
            below: self.below * factor,
            above: self.above * factor,
            mean: (self.mean.0 * factor, self.mean.1 * factor),
        }
    }
}

/// Checks `got` (f32 outputs of a GEMM on operands that do not cancel) against `want`, its exact
/// values, with `abs` = Σ_k |a_k·b_k| per element: every element one-sided within `bounds`
/// ([`compare_magnitudes`]; NaN and a sign flip never pass), the mean deviation within
/// `bounds.mean` — and the check itself sensitive: the same result with a planted error of
/// × 1.005 or × 0.995 must fail it. Returns the largest relative error and the mean deviation.
pub fn check_no_cancellation(
    got: &HostOutput,
    want: &HostOutput,
    abs: &[f64],
    bounds: NoCancellation,
) -> Result<(f64, f64), String> {
    if got.dtype != OutType::F32 {
        return Err("a no-cancellation check reads f32 outputs (a 16-bit rounding is 0.4%)".into());
    }
    let below: Vec<f64> = abs.iter().map(|s| s * bounds.below).collect();
    let above: Vec<f64> = abs.iter().map(|s| s * bounds.above).collect();
    let check = |o: &HostOutput| {
        compare_magnitudes(o, want, 1.0, &below, &above)?;
        let mean = mean_relative_deviation(o, want);
        let (lo, hi) = bounds.mean;
        if (lo..=hi).contains(&mean) {
            Ok(())
        } else {
            Err(format!(
                "mean deviation {mean:.3e} outside [{lo:.1e}, {hi:.1e}]"
            ))
        }
    };
    check(got)?;
    for factor in [1.005f32, 0.995] {
        let mut planted = got.clone();
        planted.values.iter_mut().for_each(|v| *v *= factor);
        if check(&planted).is_ok() {
            return Err(format!("a planted error (× {factor}) passes the check"));
        }
    }
    Ok((
        max_relative_error(got, want),
        mean_relative_deviation(got, want),
    ))
}

/// A · Bᵀ on `g` with the plan `plan` picks, on fresh operands of formats `(fa, fb)` and sizes
/// `(m, n, k, l)` that do not cancel ([`no_cancellation_matrix`]), checked with
/// [`check_no_cancellation`] against the float64 reference of the operands the kernel multiplies
/// (`kernel_operands`: the matrices themselves, or the copies a pre-pass makes of them, such as
/// the fold's). Returns the largest relative error and the mean deviation.
pub fn no_cancellation_gemm(
    g: &Gpu,
    (m, n, k, l): (usize, usize, usize, usize),
    (fa, fb): (OperandFormat, OperandFormat),
    seed: u64,
    bounds: NoCancellation,
    plan: impl FnOnce(&DeviceMatrix, &DeviceMatrix) -> Result<Plan, String>,
    kernel_operands: impl Fn(
        &ScaledMatrix,
        &ScaledMatrix,
    ) -> Result<(ScaledMatrix, ScaledMatrix), String>,
) -> Result<(f64, f64), String> {
    let a = no_cancellation_matrix(seed, m, k, l, fa, false);
    let b = no_cancellation_matrix(seed ^ 0x5851_F42D, n, k, l, fb, true);
    let (ka, kb) = kernel_operands(&a, &b)?;
    let (want, abs) = reference_output(&ka, &kb, OutType::F32)?;
    let got = gemm_on(g, &a, &b, OutType::F32, plan)?;
    check_no_cancellation(&got, &want, &abs, bounds)
        .map_err(|e| format!("{fa} · {fb} {m}x{n}x{k}x{l} seed {seed}: {e}"))
}

/// The operands as they are ([`no_cancellation_gemm`]'s `kernel_operands` for kernels that read
/// them directly).
pub fn as_they_are(
    a: &ScaledMatrix,
    b: &ScaledMatrix,
) -> Result<(ScaledMatrix, ScaledMatrix), String> {
    Ok((a.clone(), b.clone()))
}

/// The largest |got − want| / |want| over elements with want ≠ 0 (NaN or a zero/non-zero mismatch
/// gives infinity): a relative error, meaningful where nothing cancels.
pub fn max_relative_error(got: &HostOutput, want: &HostOutput) -> f64 {
    got.values
        .iter()
        .zip(&want.values)
        .map(|(&g, &w)| {
            let (g, w) = (g as f64, w as f64);
            if g.is_nan() || w.is_nan() || (w == 0.0) != (g == 0.0) {
                f64::INFINITY
            } else if w == 0.0 {
                0.0
            } else {
                ((g - w) / w).abs()
            }
        })
        .fold(0.0, f64::max)
}

/// ±inf as the signed overflow threshold of `dtype` (largest finite + half a unit in the last
/// place: values from there on round to inf), finite values unchanged.
fn finite_or_threshold(dtype: OutType, v: f32) -> f64 {
    if !v.is_infinite() {
        return v as f64;
    }
    let (max, half_ulp) = match dtype {
        OutType::F16 => (65504.0, 16.0),
        OutType::Bf16 => (half::bf16::MAX.to_f64(), 2f64.powi(127 - 8)),
        OutType::F32 => (f32::MAX as f64, 2f64.powi(127 - 24)),
    };
    (max + half_ulp).copysign(v as f64)
}

/// Compares every element. Two float64 values at most `slack[i]` apart, each rounded to f32 and
/// then to the output type (both roundings monotone, each moving a value by at most one unit in
/// the last place), end at most `slack + ulp_f32 + ulp_out` apart; `got` must be that close to
/// `want` (ulps counted at the larger magnitude of the two, `ulps` units of the output type).
/// NaN in either never passes; infinities must match exactly. Returns the worst mismatches.
pub fn compare_outputs(
    got: &HostOutput,
    want: &HostOutput,
    ulps: f64,
    slack: &[f64],
) -> Result<(), String> {
    if slack.len() != want.values.len() {
        return Err(format!(
            "{} slack values for {} elements",
            slack.len(),
            want.values.len()
        ));
    }
    if (got.m, got.n, got.l, got.dtype) != (want.m, want.n, want.l, want.dtype) {
        return Err(format!(
            "shape or type differ: {:?} vs {:?}",
            (got.m, got.n, got.l, got.dtype),
            (want.m, want.n, want.l, want.dtype)
        ));
    }
    let mut bad = Vec::new();
    let mut count = 0usize;
    for (i, (&g, &w)) in got.values.iter().zip(&want.values).enumerate() {
        let ok = if g.is_nan() || w.is_nan() {
            false
        } else if g.is_infinite() && w.is_infinite() {
            g == w
        } else {
            // An infinity means the value reached the type's overflow threshold (where rounding
            // goes to inf): compare it as that value, so an error within the bound that crosses
            // the threshold is judged like any other.
            let (g, w) = (
                finite_or_threshold(got.dtype, g),
                finite_or_threshold(got.dtype, w),
            );
            let mag = g.abs().max(w.abs()) as f32;
            let tol = ulps * output_ulp(got.dtype, mag) + output_ulp(OutType::F32, mag) + slack[i];
            (g - w).abs() <= tol
        };
        if !ok {
            count += 1;
            if bad.len() < 8 {
                let (l, rem) = (i / (got.m * got.n), i % (got.m * got.n));
                bad.push(format!(
                    "  [l {l}, m {}, n {}]: got {g:e}, want {w:e}",
                    rem / got.n,
                    rem % got.n
                ));
            }
        }
    }
    if count == 0 {
        Ok(())
    } else {
        Err(format!(
            "{count} of {} elements differ:\n{}",
            got.values.len(),
            bad.join("\n")
        ))
    }
}

/// The CPU reference of A · Bᵀ (float64, exact products) rounded to `dtype` as a kernel's output,
/// and Σ_k |a_k·b_k| per element (what the kernels' error bounds scale with).
pub fn reference_output(
    a: &ScaledMatrix,
    b: &ScaledMatrix,
    dtype: blockscaled::OutType,
) -> Result<(HostOutput, Vec<f64>), String> {
    let (c64, abs) = blockscaled::reference::gemm_f64(a, b).map_err(|e| e.to_string())?;
    let want = HostOutput {
        dtype,
        m: a.rows(),
        n: b.rows(),
        l: a.batch(),
        values: c64
            .iter()
            .map(|&x| blockscaled::round_output(dtype, x))
            .collect(),
    };
    Ok((want, abs))
}

/// The same matrix with every element and scale made non-negative (sign bits cleared), so that a
/// reference GEMM of `abs(A)·abs(B)ᵀ` gives Σ_k |a_k·b_k| per element: the quantity FP8
/// accumulation error scales with.
pub fn abs_matrix(m: &ScaledMatrix) -> ScaledMatrix {
    use blockscaled::{ElemType, ScaleType};
    let d = *m.desc();
    let data = m
        .data()
        .iter()
        .enumerate()
        .map(|(i, &b)| match d.format.elem {
            ElemType::E2M1 => b & 0x77,
            // The sign is bit 7 of a bf16's second (high) byte.
            ElemType::BF16 if i % 2 == 0 => b,
            _ => b & 0x7F,
        })
        .collect();
    let scales = match d.format.scale {
        ScaleType::F32 => m
            .scales()
            .chunks_exact(4)
            .flat_map(|c| [c[0], c[1], c[2], c[3] & 0x7F])
            .collect(),
        _ => m.scales().to_vec(),
    };
    with_parts(m, data, scales)
}

/// Hopper's FP8 tensor-core accumulation error per element, as a fraction of Σ_k |a_k·b_k|, with
/// partial sums promoted to fp32 every 128 of K: the tensor core adds products with fewer bits
/// than fp32 and truncates toward zero, so a small product next to a large one loses most of its
/// bits, and on operands that do not cancel the losses add up in one direction. Measured on the
/// H100 (2026-11-23, `sm90_kernel_has_no_systematic_error_on_operands_that_do_not_cancel`, random
/// operands with 20× outliers): up to 4.15e-3 ≈ 2^-7.9 of Σ|a·b| below the exact sum, never above
/// it. 2^-7 (7.8e-3) leaves a factor 1.9. (An earlier 2^-9, from one m64n8k32 product with random
/// signs, is exceeded on such operands.)
pub const FP8_ACCUMULATION_REL: f64 = 1.0 / 128.0;

/// The error of a GEMM whose operands are exact in bf16 and multiplied by bf16 tensor cores with
/// fp32 accumulation (the sm90 MX kernel), as a fraction of Σ_k |a_k·b_k|: each 16-wide K step
/// adds its exact products to the running sum with at most two roundings (or truncations) of one
/// fp32 unit, 2^-23, of a magnitude ≤ Σ|a·b|: (K/8 + 1) · 2^-23.
pub fn bf16_mma_rel(k: usize) -> f64 {
    (k as f64 / 8.0 + 1.0) * 2f64.powi(-23)
}

/// The mean of (|got| − |want|) / |want| over elements with want ≠ 0: the systematic part of an
/// error (a wrong scale shifts every element; accumulation truncation varies per element).
pub fn mean_relative_deviation(got: &HostOutput, want: &HostOutput) -> f64 {
    let (mut sum, mut count) = (0f64, 0usize);
    for (&g, &w) in got.values.iter().zip(&want.values) {
        if w != 0.0 {
            sum += (g.abs() as f64 - w.abs() as f64) / w.abs() as f64;
            count += 1;
        }
    }
    if count == 0 { 0.0 } else { sum / count as f64 }
}

/// Tolerance of a GEMM computed with Hopper FP8 tensor cores, per element, given Σ_k |a_k·b_k|
/// ([`FP8_ACCUMULATION_REL`] of it). The output rounding is added by `compare_outputs`.
pub fn fp8_accumulation_slack(abs_sum: &[f64]) -> Vec<f64> {
    abs_sum.iter().map(|s| s * FP8_ACCUMULATION_REL).collect()
}

/// One-sided comparison for results whose error has a known direction: every element must have
/// the sign of `want` (or be zero with it) and a magnitude in `[|want| − below[i], |want| +
/// above[i]]`, widened by one unit of f32 and `ulps` units of the output type on each side for
/// the roundings. NaN never passes. Returns the worst mismatches.
pub fn compare_magnitudes(
    got: &HostOutput,
    want: &HostOutput,
    ulps: f64,
    below: &[f64],
    above: &[f64],
) -> Result<(), String> {
    if (got.m, got.n, got.l, got.dtype) != (want.m, want.n, want.l, want.dtype)
        || below.len() != want.values.len()
        || above.len() != want.values.len()
    {
        return Err("shapes, types or bound lengths differ".into());
    }
    let mut bad = Vec::new();
    let mut count = 0usize;
    for (i, (&g, &w)) in got.values.iter().zip(&want.values).enumerate() {
        let (gm, wm) = (g.abs() as f64, w.abs() as f64);
        let round = ulps * output_ulp(got.dtype, g.abs().max(w.abs()))
            + output_ulp(OutType::F32, g.abs().max(w.abs()));
        let same_sign = g == 0.0 || w == 0.0 || (g > 0.0) == (w > 0.0);
        let ok = !g.is_nan()
            && !w.is_nan()
            && same_sign
            && gm >= wm - below[i] - round
            && gm <= wm + above[i] + round;
        if !ok {
            count += 1;
            if bad.len() < 8 {
                bad.push(format!("  [{i}]: got {g:e}, want {w:e}"));
            }
        }
    }
    if count == 0 {
        Ok(())
    } else {
        Err(format!(
            "{count} of {} elements outside [−below, +above]:\n{}",
            got.values.len(),
            bad.join("\n")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(dtype: OutType, v: &[f32]) -> HostOutput {
        HostOutput {
            dtype,
            m: 1,
            n: v.len(),
            l: 1,
            values: v.to_vec(),
        }
    }

    #[test]
    fn nan_never_passes_even_against_nan() {
        let z = [0.0];
        assert!(
            compare_outputs(
                &out(OutType::F32, &[f32::NAN]),
                &out(OutType::F32, &[f32::NAN]),
                1.0,
                &z
            )
            .is_err()
        );
        assert!(
            compare_outputs(
                &out(OutType::Bf16, &[f32::NAN]),
                &out(OutType::Bf16, &[1.0]),
                1e9,
                &[1e9]
            )
            .is_err()
        );
    }

    #[test]
    fn the_no_cancellation_check_passes_exact_values_and_fails_a_half_percent_error_or_nan() {
        let want = out(OutType::F32, &[100.0, -50.0, 3.0]);
        let abs = [100.0, 50.0, 3.0];
        for bounds in [NoCancellation::FP8, NoCancellation::half(1024)] {
            assert!(check_no_cancellation(&want, &want, &abs, bounds).is_ok());
            for f in [1.005f32, 0.995] {
                let mut off = want.clone();
                off.values.iter_mut().for_each(|v| *v *= f);
                assert!(check_no_cancellation(&off, &want, &abs, bounds).is_err());
            }
            let nan = out(OutType::F32, &[f32::NAN, -50.0, 3.0]);
            assert!(check_no_cancellation(&nan, &want, &abs, bounds).is_err());
        }
        // (Half a 16-bit unit is 0.4%: such outputs would hide the planted error.)
        let bf16 = out(OutType::Bf16, &[100.0, -50.0, 3.0]);
        assert!(check_no_cancellation(&bf16, &bf16, &abs, NoCancellation::FP8).is_err());
    }

    #[test]
    fn magnitude_checks_are_one_sided_and_never_pass_nan_or_a_sign_flip() {
        let want = out(OutType::F32, &[100.0, -100.0]);
        let (below, above) = ([1.0, 1.0], [0.01, 0.01]);
        let check =
            |v: &[f32]| compare_magnitudes(&out(OutType::F32, v), &want, 1.0, &below, &above);
        assert!(check(&[99.5, -99.5]).is_ok());
        assert!(check(&[100.5, -100.0]).is_err());
        assert!(check(&[98.5, -100.0]).is_err());
        assert!(check(&[99.5, 99.5]).is_err());
        assert!(check(&[f32::NAN, -100.0]).is_err());
    }

    #[test]
    fn an_error_of_two_ulps_fails_and_one_ulp_passes() {
        let one_ulp = 1.0 + 2f32.powi(-7);
        let two_ulps = 1.0 + 2.0 * 2f32.powi(-7);
        assert!(
            compare_outputs(
                &out(OutType::Bf16, &[one_ulp]),
                &out(OutType::Bf16, &[1.0]),
                1.0,
                &[0.0]
            )
            .is_ok()
        );
        assert!(
            compare_outputs(
                &out(OutType::Bf16, &[two_ulps]),
                &out(OutType::Bf16, &[1.0]),
                1.0,
                &[0.0]
            )
            .is_err()
        );
    }

    #[test]
    fn infinity_is_compared_as_the_overflow_threshold() {
        // 65504 is f16's largest value; inf stands for >= 65520: 16 apart, within 1 ulp (32).
        assert!(
            compare_outputs(
                &out(OutType::F16, &[f32::INFINITY]),
                &out(OutType::F16, &[65504.0]),
                1.0,
                &[0.0]
            )
            .is_ok()
        );
        assert!(
            compare_outputs(
                &out(OutType::F16, &[f32::INFINITY]),
                &out(OutType::F16, &[60000.0]),
                1.0,
                &[0.0]
            )
            .is_err()
        );
        assert!(
            compare_outputs(
                &out(OutType::F16, &[f32::NEG_INFINITY]),
                &out(OutType::F16, &[65504.0]),
                1.0,
                &[0.0]
            )
            .is_err()
        );
    }
}
pub mod layouts;

/// `values` uploaded as a `batch × rows × k` tensor of `input`, and the values the GPU then holds
/// (rounded to bf16 / fp16: what a host quantizer must be given to agree with the device's).
pub fn upload_tensor_as(
    gpu: &Gpu,
    input: blockscaled::InputType,
    values: &[f32],
    (rows, k, batch): (usize, usize, usize),
) -> blockscaled::Result<(blockscaled::DeviceTensor<'static>, Vec<f32>)> {
    use blockscaled::InputType;
    Ok(match input {
        InputType::F32 => (gpu.upload_tensor(values, rows, k, batch)?, values.to_vec()),
        InputType::Bf16 => {
            let h: Vec<half::bf16> = values.iter().map(|&x| half::bf16::from_f32(x)).collect();
            let held = h.iter().map(|x| x.to_f32()).collect();
            (gpu.upload_tensor(&h, rows, k, batch)?, held)
        }
        InputType::F16 => {
            let h: Vec<half::f16> = values.iter().map(|&x| half::f16::from_f32(x)).collect();
            let held = h.iter().map(|x| x.to_f32()).collect();
            (gpu.upload_tensor(&h, rows, k, batch)?, held)
        }
    })
}
pub mod moe;
