//! GEMM output in host memory, and the rounding rule that produces it.

use crate::format::OutType;

/// An output matrix `[l][m][n]` row-major, held as the f32 values of its elements (bf16 and f16
/// values are exactly representable in f32).
#[derive(Clone, Debug, PartialEq)]
pub struct HostOutput {
    /// The element type the values were decoded from.
    pub dtype: OutType,
    /// Rows.
    pub m: usize,
    /// Columns.
    pub n: usize,
    /// Batch entries.
    pub l: usize,
    /// The values, `[l][m][n]` row-major.
    pub values: Vec<f32>,
}

impl HostOutput {
    /// Decodes raw little-endian output bytes.
    pub fn from_bytes(dtype: OutType, m: usize, n: usize, l: usize, bytes: &[u8]) -> Self {
        let values = match dtype {
            OutType::Bf16 => bytes
                .chunks_exact(2)
                .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect(),
            OutType::F16 => bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect(),
            OutType::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        };
        HostOutput {
            dtype,
            m,
            n,
            l,
            values,
        }
    }

    /// Element (l, m, n).
    ///
    /// # Panics
    /// Outside the output, as slice indexing does.
    pub fn get(&self, l: usize, m: usize, n: usize) -> f32 {
        self.values[(l * self.m + m) * self.n + n]
    }
}

/// Rounds a float64 result to the output type exactly as the kernels do: to f32 (nearest even),
/// then to the output type (nearest even).
pub fn round_output(dtype: OutType, x: f64) -> f32 {
    let f = x as f32;
    match dtype {
        OutType::Bf16 => half::bf16::from_f32(f).to_f32(),
        OutType::F16 => half::f16::from_f32(f).to_f32(),
        OutType::F32 => f,
    }
}

/// The spacing of the output type's values at magnitude |x| (subnormal spacing below the
/// smallest normal). Used to state tolerances in units of the output's last place.
pub fn output_ulp(dtype: OutType, x: f32) -> f64 {
    let (mant_bits, emin) = match dtype {
        OutType::Bf16 => (7, -126),
        OutType::F16 => (10, -14),
        OutType::F32 => (23, -126),
    };
    let a = x.abs() as f64;
    let e = if a > 0.0 {
        a.log2().floor() as i32
    } else {
        emin
    };
    2f64.powi(e.max(emin) - mant_bits)
}
