//! The CPU reference GEMM: dequantize both operands to float64, accumulate in float64.
//! `C[l][m][n] = Σ_k A[l][m][k] · B[l][n][k]`. Threads over rows of C (rayon).

use crate::bsr::{BsrMatrix, SparseSide, output_dims};
use crate::error::Result;
use crate::format::OutType;
use crate::matrix::{GemmShape, ScaledMatrix};
use crate::output::{HostOutput, round_output};
use rayon::prelude::*;

/// The float64 product, `[l][m][n]`, with Σ_k |A·B| per element (what bounds the rounding error
/// of any float64 evaluation of the sum: see [`sum_error_bound`]).
pub fn gemm_f64(a: &ScaledMatrix, b: &ScaledMatrix) -> Result<(Vec<f64>, Vec<f64>)> {
    let GemmShape { m, n, k, l } = GemmShape::of(a.desc(), b.desc())?;
    Ok(product(&a.dequantize(), &b.dequantize(), (m, n, k, l)))
}

/// [`gemm_f64`] of dequantized operands `[l][m][k]` and `[l][n][k]`.
fn product(
    da: &[f64],
    db: &[f64],
    (m, n, k, l): (usize, usize, usize, usize),
) -> (Vec<f64>, Vec<f64>) {
    let mut c = vec![(0.0f64, 0.0f64); l * m * n];
    c.par_chunks_mut(n).enumerate().for_each(|(lm, row)| {
        let (li, mi) = (lm / m, lm % m);
        let arow = &da[(li * m + mi) * k..(li * m + mi + 1) * k];
        for (ni, out) in row.iter_mut().enumerate() {
            let brow = &db[(li * n + ni) * k..(li * n + ni + 1) * k];
            *out = arow.iter().zip(brow).fold((0.0, 0.0), |(s, sa), (x, y)| {
                (s + x * y, sa + (x * y).abs())
            });
        }
    });
    c.into_iter().unzip()
}

/// The block-sparse product C = A · Bᵀ with `sparse` on `side` (its missing blocks zeros) and
/// `dense` the other operand (one batch entry), rounded to `dtype`, with Σ_k |a_k·b_k| per
/// element (what the kernels' error bounds scale with; [`sum_error_bound`] of it bounds two
/// float64 evaluations' difference).
pub fn bsr_gemm(
    dense: &ScaledMatrix,
    sparse: &BsrMatrix,
    side: SparseSide,
    dtype: OutType,
) -> Result<(HostOutput, Vec<f64>)> {
    let k = dense.k();
    if sparse.cols() != k || dense.batch() != 1 {
        return Err(crate::error::shape(format!(
            "dense operand {}×{}×{k} and sparse {}×{}: K must match, batch 1",
            dense.batch(),
            dense.rows(),
            sparse.rows(),
            sparse.cols()
        )));
    }
    let (dd, ds) = (dense.dequantize(), sparse.dequantize());
    let (m, n) = output_dims(side, dense.rows(), sparse.rows());
    let (c, abs) = match side {
        SparseSide::A => product(&ds, &dd, (m, n, k, 1)),
        SparseSide::B => product(&dd, &ds, (m, n, k, 1)),
    };
    let out = HostOutput {
        dtype,
        m,
        n,
        l: 1,
        values: c.iter().map(|&x| round_output(dtype, x)).collect(),
    };
    Ok((out, abs))
}

/// How far two float64 evaluations of the same K-term dot product can be apart: each is within
/// γ·Σ|a·b| of the exact sum with γ = (K + 3)·2^-53 (K − 1 additions, one product rounding, up to
/// two scale multiplications), so together 2γ·Σ|a·b|. Near-cancelling sums need this slack.
pub fn sum_error_bound(k: usize, abs_sum: f64) -> f64 {
    2.0 * (k as f64 + 3.0) * 2f64.powi(-53) * abs_sum
}

/// The reference result rounded to `dtype` as the kernels round, and per element the slack
/// ([`sum_error_bound`]) a float64 computation of the same product may differ by before rounding.
pub fn gemm(a: &ScaledMatrix, b: &ScaledMatrix, dtype: OutType) -> Result<(HostOutput, Vec<f64>)> {
    let (c, abs) = gemm_f64(a, b)?;
    let (m, n, l, k) = (a.rows(), b.rows(), a.batch(), a.k());
    let out = HostOutput {
        dtype,
        m,
        n,
        l,
        values: c.iter().map(|&x| round_output(dtype, x)).collect(),
    };
    Ok((
        out,
        abs.into_iter().map(|s| sum_error_bound(k, s)).collect(),
    ))
}
