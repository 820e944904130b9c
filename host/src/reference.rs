//! The CPU reference GEMM: dequantize both operands to float64, accumulate in float64.
//! C[l][m][n] = Σ_k A[l][m][k] · B[l][n][k]. Threads over rows of C (rayon).

use crate::error::{Result, shape};
use crate::format::OutType;
use crate::matrix::ScaledMatrix;
use crate::output::{HostOutput, round_output};
use rayon::prelude::*;

/// Checks that A (M×K) and B (N×K) can be multiplied; returns (M, N, K, L).
pub fn check_operands(
    a: &crate::MatrixDesc,
    b: &crate::MatrixDesc,
) -> Result<(usize, usize, usize, usize)> {
    if a.k != b.k {
        return Err(shape(format!(
            "A is {}×{} but B is {}×{}: K differs",
            a.rows, a.k, b.rows, b.k
        )));
    }
    if a.batch != b.batch {
        return Err(shape(format!(
            "A has batch {} but B has batch {}",
            a.batch, b.batch
        )));
    }
    Ok((a.rows, b.rows, a.k, a.batch))
}

/// The exact-as-float64 product, `[l][m][n]`.
pub fn gemm_f64(a: &ScaledMatrix, b: &ScaledMatrix) -> Result<Vec<f64>> {
    let (m, n, k, l) = check_operands(a.desc(), b.desc())?;
    let (da, db) = (a.dequantize(), b.dequantize());
    let mut c = vec![0.0f64; l * m * n];
    c.par_chunks_mut(n).enumerate().for_each(|(lm, row)| {
        let (li, mi) = (lm / m, lm % m);
        let arow = &da[(li * m + mi) * k..(li * m + mi + 1) * k];
        for (ni, out) in row.iter_mut().enumerate() {
            let brow = &db[(li * n + ni) * k..(li * n + ni + 1) * k];
            *out = arow.iter().zip(brow).map(|(x, y)| x * y).sum();
        }
    });
    Ok(c)
}

/// The reference result rounded to `dtype` as the kernels round.
pub fn gemm(a: &ScaledMatrix, b: &ScaledMatrix, dtype: OutType) -> Result<HostOutput> {
    let c = gemm_f64(a, b)?;
    let (m, n, l) = (a.rows(), b.rows(), a.batch());
    Ok(HostOutput {
        dtype,
        m,
        n,
        l,
        values: c.iter().map(|&x| round_output(dtype, x)).collect(),
    })
}
