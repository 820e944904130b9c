//! [`ScaledMatrix`]: block-scaled data and its scales, validated once at construction.
//!
//! ## Memory layout
//! An operand is a batch of `batch` matrices of `rows` × `k` (A: M×K, B: N×K — both K-major, the
//! "TN" layout of cuBLASLt's fp8 GEMM, torch `_scaled_mm(a, b.t())` and DeepGEMM).
//! - **Data**: element `(l, r, k)` is element number `(l·rows + r)·k + k` in the buffer. FP8
//!   elements take one byte. **e2m1 packs two elements per byte: element `2i` in the low nibble
//!   (bits 0–3), element `2i + 1` in the high nibble** — torch's `float4_e2m1fn_x2` and CUTLASS's
//!   order — so K must be even (each row starts on a byte).
//! - **Scales**: one per block (see [`crate::format::ScaleBlock`]): `row_blocks = ⌈rows /
//!   block_rows⌉`, `k_blocks = ⌈k / block_k⌉`; scale `(l, rb, kb)` is scale element number
//!   `l·batch_stride + rb·row_stride + kb·k_stride` ([`ScaleLayout`]). e8m0 and ue4m3 scales are one
//!   byte each, fp32 scales four bytes, little-endian.
//! - **Value**: `decode(element) · decode(scale) · tensor_scale` (`tensor_scale` is 1 except for NVFP4).

use crate::error::{Error, Result, shape};
use crate::format::{ElemType, OperandFormat, ScaleMajor, ScaleType};
use blockscaled_kernels::params::OperandParams;

/// Where each scale lives in the scale buffer, in scale elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ScaleLayout {
    /// Scale blocks along the rows.
    pub row_blocks: usize,
    /// Scale blocks along K.
    pub k_blocks: usize,
    /// Scale elements from one row block to the next.
    pub row_stride: usize,
    /// Scale elements from one K block to the next.
    pub k_stride: usize,
    /// Scale elements from one batch entry to the next.
    pub batch_stride: usize,
}

impl ScaleLayout {
    /// A packed layout with the given major order.
    pub fn packed(major: ScaleMajor, row_blocks: usize, k_blocks: usize) -> Self {
        let (row_stride, k_stride) = match major {
            ScaleMajor::K => (k_blocks, 1),
            ScaleMajor::Mn => (1, row_blocks),
        };
        ScaleLayout {
            row_blocks,
            k_blocks,
            row_stride,
            k_stride,
            // Saturating: a grid too large to address fails `MatrixDesc::validate` instead.
            batch_stride: row_blocks.saturating_mul(k_blocks),
        }
    }

    /// Scale elements a buffer needs for `batch` entries (largest index + 1).
    pub fn required_len(&self, batch: usize) -> Option<usize> {
        let last = (batch.checked_sub(1)?)
            .checked_mul(self.batch_stride)?
            .checked_add((self.row_blocks.checked_sub(1)?).checked_mul(self.row_stride)?)?
            .checked_add((self.k_blocks.checked_sub(1)?).checked_mul(self.k_stride)?)?;
        last.checked_add(1)
    }

    /// Index of scale (l, rb, kb).
    #[inline]
    pub fn index(&self, l: usize, rb: usize, kb: usize) -> usize {
        l * self.batch_stride + rb * self.row_stride + kb * self.k_stride
    }
}

/// Everything about a block-scaled matrix except its bytes: what a device copy keeps too.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MatrixDesc {
    /// Element and scale format.
    pub format: OperandFormat,
    /// Rows (M for A, N for B).
    pub rows: usize,
    /// Columns, the reduction dimension.
    pub k: usize,
    /// Batch entries.
    pub batch: usize,
    /// Where each scale lives in the scale buffer.
    pub scale_layout: ScaleLayout,
    /// The fp32 scale of the whole tensor (NVFP4), else 1.
    pub tensor_scale: f32,
}

/// Largest dimension the kernels index with 32-bit coordinates.
const MAX_DIM: usize = i32::MAX as usize;
/// Grid z carries the batch: at most 65535.
const MAX_BATCH: usize = 65535;

impl MatrixDesc {
    /// (rows per scale block, K per scale block).
    pub fn block_extent(&self) -> (usize, usize) {
        self.format.block.extent(self.rows, self.k)
    }

    /// Bytes of element data; `None` when the size overflows `usize` (which [`validate`]
    /// rejects).
    ///
    /// [`validate`]: MatrixDesc::validate
    pub fn data_bytes(&self) -> Option<usize> {
        let bits = self
            .batch
            .checked_mul(self.rows)?
            .checked_mul(self.k)?
            .checked_mul(self.format.elem.bits() as usize)?;
        Some(bits / 8)
    }

    /// Bytes of the scale buffer (up to the last scale the layout reaches); `None` when the size
    /// overflows `usize` (which [`validate`] rejects).
    ///
    /// [`validate`]: MatrixDesc::validate
    pub fn scale_bytes(&self) -> Option<usize> {
        self.scale_layout
            .required_len(self.batch)?
            .checked_mul(self.format.scale.bytes())
    }

    /// Checks every rule of the module doc; the kernels trust what passes. Returns the bytes of
    /// element data and of the scale buffer.
    pub fn validate(&self) -> Result<(usize, usize)> {
        self.format.validate()?;
        let (r, k, l) = (self.rows, self.k, self.batch);
        if r == 0 || k == 0 || l == 0 {
            return Err(shape(format!("empty matrix: rows {r}, k {k}, batch {l}")));
        }
        if r > MAX_DIM || k > MAX_DIM {
            return Err(shape(format!("rows {r} or k {k} above {MAX_DIM}")));
        }
        if l > MAX_BATCH {
            return Err(shape(format!("batch {l} above {MAX_BATCH}")));
        }
        if self.format.elem == ElemType::E2M1 && k % 2 != 0 {
            return Err(Error::Alignment(format!(
                "e2m1 packs two elements per byte along K, so K must be even (K = {k})"
            )));
        }
        let data_bytes = self
            .data_bytes()
            .ok_or_else(|| shape(format!("{l}×{r}×{k} elements overflow")))?;
        let (br, bk) = self.block_extent();
        let want = (r.div_ceil(br), k.div_ceil(bk));
        let got = (self.scale_layout.row_blocks, self.scale_layout.k_blocks);
        if want != got {
            return Err(shape(format!(
                "{}: a {r}×{k} matrix has {}×{} scale blocks, the scale layout says {}×{}",
                self.format, want.0, want.1, got.0, got.1
            )));
        }
        let scale_bytes = self.scale_bytes().ok_or_else(|| {
            shape(format!(
                "{}: the scale layout's strides {:?} reach past the addressable bytes",
                self.format, self.scale_layout
            ))
        })?;
        if !(self.tensor_scale.is_finite() && self.tensor_scale > 0.0) {
            return Err(self.format.error(format!(
                "tensor scale must be finite and positive, got {}",
                self.tensor_scale
            )));
        }
        if !self.format.tensor_scale && self.tensor_scale != 1.0 {
            return Err(self
                .format
                .error("this format has no tensor scale (it must be 1)"));
        }
        Ok((data_bytes, scale_bytes))
    }

    /// Kernel parameters for this matrix at the given device addresses.
    pub(crate) fn params(&self, data: u64, scales: u64) -> OperandParams {
        let (br, bk) = self.block_extent();
        OperandParams {
            data,
            scales,
            row_stride: self.k as u64,
            batch_stride: (self.rows * self.k) as u64,
            scale_row_stride: self.scale_layout.row_stride as u64,
            scale_k_stride: self.scale_layout.k_stride as u64,
            scale_batch_stride: self.scale_layout.batch_stride as u64,
            rows: self.rows as u32,
            elem: self.format.elem as u32,
            scale_type: self.format.scale as u32,
            block_rows: br as u32,
            block_k: bk as u32,
            tensor_scale: self.tensor_scale,
        }
    }
}

/// The sizes of C = A · Bᵀ: A is `l` × `m` × `k`, B is `l` × `n` × `k`, C is `l` × `m` × `n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmShape {
    /// Rows of A and C.
    pub m: usize,
    /// Rows of B, columns of C.
    pub n: usize,
    /// The reduction dimension.
    pub k: usize,
    /// Batch entries.
    pub l: usize,
}

impl GemmShape {
    /// `(m, n, k, l)` as the kernels' 32-bit parameters (a validated plan's shape fits them).
    pub(crate) fn dims(&self) -> (u32, u32, u32, u32) {
        (self.m as u32, self.n as u32, self.k as u32, self.l as u32)
    }

    /// The product's shape, if A and B have the same K and batch ([`Error::Shape`] otherwise).
    pub fn of(a: &MatrixDesc, b: &MatrixDesc) -> Result<GemmShape> {
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
        Ok(GemmShape {
            m: a.rows,
            n: b.rows,
            k: a.k,
            l: a.batch,
        })
    }
}

impl MatrixDesc {
    /// A `batch` × `rows` × `k` matrix of `format` with its scales packed in the format's
    /// default major order ([`ScaleMajor::default_for`]) and a tensor scale of 1: what a
    /// recipe's operand is described as without its bytes (a tuner's shapes).
    pub fn packed(format: OperandFormat, rows: usize, k: usize, batch: usize) -> Self {
        let (br, bk) = format.block.extent(rows, k);
        let scale_layout = ScaleLayout::packed(
            ScaleMajor::default_for(&format),
            rows.div_ceil(br.max(1)),
            k.div_ceil(bk.max(1)),
        );
        MatrixDesc {
            format,
            rows,
            k,
            batch,
            scale_layout,
            tensor_scale: 1.0,
        }
    }
}

#[cfg(test)]
impl MatrixDesc {
    /// One batch entry of `recipe`'s A (or, `as_b`, B) operand, `rows` × `k`, scales packed in
    /// the format's default major order (unit tests of the families' operand rules).
    pub(crate) fn of_recipe(
        recipe: crate::format::Recipe,
        rows: usize,
        k: usize,
        as_b: bool,
    ) -> Self {
        let format = if as_b { recipe.b() } else { recipe.a() };
        MatrixDesc::packed(format, rows, k, 1)
    }
}

/// A block-scaled matrix in host memory (see the module doc for the layout).
#[derive(Clone, Debug, PartialEq)]
pub struct ScaledMatrix {
    desc: MatrixDesc,
    data: Vec<u8>,
    scales: Vec<u8>,
}

impl ScaledMatrix {
    /// Wraps existing bytes (e.g. from torch or DeepGEMM) after checking that they are complete
    /// and consistent with the format.
    #[allow(clippy::too_many_arguments)]
    pub fn from_parts(
        format: OperandFormat,
        rows: usize,
        k: usize,
        batch: usize,
        data: Vec<u8>,
        scales: Vec<u8>,
        scale_layout: ScaleLayout,
        tensor_scale: f32,
    ) -> Result<Self> {
        let desc = MatrixDesc {
            format,
            rows,
            k,
            batch,
            scale_layout,
            tensor_scale,
        };
        Self::from_desc(desc, data, scales)
    }

    /// [`ScaledMatrix::from_parts`] with the format, shape, scale layout and tensor scale of
    /// `desc` (another matrix's, or a device matrix's): the same checks.
    pub fn from_desc(desc: MatrixDesc, data: Vec<u8>, scales: Vec<u8>) -> Result<Self> {
        let MatrixDesc {
            format,
            rows,
            k,
            batch,
            ..
        } = desc;
        let (data_bytes, scale_bytes) = desc.validate()?;
        if data.len() != data_bytes {
            return Err(shape(format!(
                "{format}: {batch}×{rows}×{k} elements take {data_bytes} bytes, got {}",
                data.len()
            )));
        }
        if scales.len() < scale_bytes {
            return Err(shape(format!(
                "{format}: the scale layout reaches {scale_bytes} bytes, got {}",
                scales.len()
            )));
        }
        if format.scale == ScaleType::UE4M3
            && let Some(b) = scales.iter().find(|&&b| b & 0x80 != 0)
        {
            return Err(format.error(format!("ue4m3 scale byte {b:#04x} has the sign bit set")));
        }
        Ok(ScaledMatrix { desc, data, scales })
    }

    pub(crate) fn from_validated(desc: MatrixDesc, data: Vec<u8>, scales: Vec<u8>) -> Self {
        debug_assert_eq!(desc.validate().ok().map(|v| v.0), Some(data.len()));
        ScaledMatrix { desc, data, scales }
    }

    /// Format, shape, scale layout and tensor scale.
    pub fn desc(&self) -> &MatrixDesc {
        &self.desc
    }
    /// The format.
    pub fn format(&self) -> OperandFormat {
        self.desc.format
    }
    /// Rows.
    pub fn rows(&self) -> usize {
        self.desc.rows
    }
    /// Columns (K).
    pub fn k(&self) -> usize {
        self.desc.k
    }
    /// Batch entries.
    pub fn batch(&self) -> usize {
        self.desc.batch
    }
    /// The tensor scale (1 where the format has none).
    pub fn tensor_scale(&self) -> f32 {
        self.desc.tensor_scale
    }
    /// The codes (`[batch][rows][k]`, e2m1 two per byte, low nibble first).
    pub fn data(&self) -> &[u8] {
        &self.data
    }
    /// The scale bytes, in [`ScaledMatrix::scale_layout`].
    pub fn scales(&self) -> &[u8] {
        &self.scales
    }
    /// Where each scale lives.
    pub fn scale_layout(&self) -> &ScaleLayout {
        &self.desc.scale_layout
    }

    /// The element code at (l, r, k) (for e2m1 the nibble, for bf16 the 16 bits).
    pub fn code(&self, l: usize, r: usize, k: usize) -> u32 {
        let i = (l * self.desc.rows + r) * self.desc.k + k;
        match self.desc.format.elem {
            ElemType::E2M1 => {
                let byte = self.data[i / 2];
                (if i.is_multiple_of(2) {
                    byte & 0x0F
                } else {
                    byte >> 4
                }) as u32
            }
            ElemType::BF16 | ElemType::F16 => {
                u16::from_le_bytes([self.data[2 * i], self.data[2 * i + 1]]) as u32
            }
            _ => self.data[i] as u32,
        }
    }

    /// The decoded scale (times the tensor scale) that applies to element (l, r, k).
    pub fn scale_value(&self, l: usize, r: usize, k: usize) -> f64 {
        let (br, bk) = self.desc.block_extent();
        let s = self.desc.scale_layout.index(l, r / br, k / bk);
        let st = self.desc.format.scale;
        let bits = match st.bytes() {
            1 => self.scales[s] as u32,
            _ => u32::from_le_bytes(self.scales[4 * s..4 * s + 4].try_into().expect("4 bytes")),
        };
        st.decode_bits(bits) as f64 * self.desc.tensor_scale as f64
    }

    /// The dequantized value of element (l, r, k).
    pub fn value(&self, l: usize, r: usize, k: usize) -> f64 {
        self.desc.format.elem.decode(self.code(l, r, k)) as f64 * self.scale_value(l, r, k)
    }

    /// All values, `[batch][rows][k]`, in float64 (exact: every product of an element and its
    /// scales is representable).
    pub fn dequantize(&self) -> Vec<f64> {
        use rayon::prelude::*;
        let (rows, k) = (self.desc.rows, self.desc.k);
        let mut out = vec![0.0f64; self.desc.batch * rows * k];
        out.par_chunks_mut(k).enumerate().for_each(|(lr, row)| {
            let (l, r) = (lr / rows, lr % rows);
            for (kk, v) in row.iter_mut().enumerate() {
                *v = self.value(l, r, kk);
            }
        });
        out
    }
}
