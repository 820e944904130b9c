//! Fused epilogues, host side: what a GEMM does to its product before it stores it
//! ([`Epilogue`]: α, β·C, a per-column bias, an activation or SwiGLU, a residual) and where it
//! stores it (an output of bf16 / fp16 / f32, or quantized codes and scales ready to be the next
//! GEMM's A). The steps run in the kernels' one epilogue (`blockscaled_kernels::gemm::epilogue::fuse`),
//! chosen by data in the launch's parameters ([`EpilogueParams`]).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use crate::buffers::GpuId;
use crate::error::{Error, Result, shape};
use crate::format::{ElemType, OperandFormat, OutType, ScaleBlock, ScaleType};
use crate::launch::Launch;
use crate::matrix::GemmShape;
use crate::quantizer::{DeviceTensor, QuantSpec};
use blockscaled_kernels::gemm::layout::fused_staging;
pub use blockscaled_kernels::params::Activation;
use blockscaled_kernels::params::{EpilogueParams, in_registers};
use blockscaled_kernels::quantize::InputType;
use blockscaled_kernels::sm90::InRegisters;

/// What a GEMM does to its product `t = A·Bᵀ` before storing it, in this order (each step one
/// f32 operation rounded to nearest):
///
/// `t ← α·t`; `t ← t + β·C`; `t ← t + bias`; `y ← act(t)` (SwiGLU: `y[j] = silu(t[2j])·t[2j+1]`);
/// `y ← y + R`; then `y` is stored (converted to the output type, or quantized).
///
/// - C: `batch × m × n` (the product's shape); the residual R: the output's shape (`n / 2`
///   columns with SwiGLU); the bias: `1 × n` (one for every batch entry) or `batch` rows of
///   `1 × n` — all [`DeviceTensor`]s of f32, bf16 or fp16.
/// - SwiGLU pairs adjacent columns: B's rows interleave the gate and up projections, row `2j`
///   the gate's row `j` and `2j + 1` the up's ([`interleave_gate_up`] makes that order from the
///   two stacked halves, as MoE checkpoints store them).
/// - The activations run on the SFU (`ex2`, `rcp`): SiLU and GELU-tanh within a few 2^-22
///   relative of `x·sigmoid(·)` beyond their argument's rounding, GELU-erf within 1.5·10^-7·|x|
///   absolute (Abramowitz–Stegun 7.1.26 for erf).
#[derive(Clone, Copy)]
pub struct Epilogue<'a> {
    /// α, the product's factor.
    pub alpha: f32,
    /// β and C.
    pub c: Option<(f32, &'a DeviceTensor<'a>)>,
    /// A bias per output column (`[l or 1][1][n]`), added after α·A·Bᵀ + β·C.
    pub bias: Option<&'a DeviceTensor<'a>>,
    /// The activation, applied after the bias.
    pub activation: Activation,
    /// A residual added after the activation (the output's shape).
    pub residual: Option<&'a DeviceTensor<'a>>,
}

impl Default for Epilogue<'_> {
    fn default() -> Self {
        Epilogue {
            alpha: 1.0,
            c: None,
            bias: None,
            activation: Activation::None,
            residual: None,
        }
    }
}

impl<'a> Epilogue<'a> {
    /// Whether the consumers can run this epilogue, with output quantized to `quant` (its format
    /// and scale block; `None`: not quantized), in their own registers: the kernels' rule
    /// ([`blockscaled_kernels::params::in_registers`]).
    pub(crate) fn in_registers(&self, quant: Option<(OperandFormat, u32)>) -> InRegisters {
        let q = quant.map(|(f, block)| (f.elem as u32, f.scale as u32, block));
        let regs = in_registers(
            self.c.is_some(),
            self.residual.is_some(),
            self.activation as u32,
            q,
        );
        match quant {
            _ if !regs => InRegisters::No,
            // (MXFP8 output: kernels of their own.)
            Some((f, _)) if f.scale == ScaleType::E8M0 => InRegisters::Mx,
            _ => InRegisters::Yes,
        }
    }

    /// Nothing fused: the plain product.
    pub fn new() -> Self {
        Self::default()
    }
    /// With α.
    pub fn alpha(self, alpha: f32) -> Self {
        Epilogue { alpha, ..self }
    }
    /// `+ β·C`.
    pub fn beta_c(self, beta: f32, c: &'a DeviceTensor) -> Self {
        Epilogue {
            c: Some((beta, c)),
            ..self
        }
    }
    /// With a bias.
    pub fn bias(self, bias: &'a DeviceTensor) -> Self {
        Epilogue {
            bias: Some(bias),
            ..self
        }
    }
    /// With an activation.
    pub fn activation(self, activation: Activation) -> Self {
        Epilogue { activation, ..self }
    }
    /// With a residual.
    pub fn residual(self, residual: &'a DeviceTensor) -> Self {
        Epilogue {
            residual: Some(residual),
            ..self
        }
    }

    /// Output columns for a product of `n` columns.
    pub fn out_cols(&self, n: usize) -> usize {
        if self.activation == Activation::SwiGlu {
            n / 2
        } else {
            n
        }
    }

    /// Whether any step is asked for.
    pub fn is_plain(&self) -> bool {
        self.alpha == 1.0
            && self.c.is_none()
            && self.bias.is_none()
            && self.activation == Activation::None
            && self.residual.is_none()
    }

    /// Checks the tensors against the product's `shape` on GPU `gpu`.
    pub(crate) fn check(&self, gpu: GpuId, s: &GemmShape) -> Result<()> {
        let (m, n, l) = (s.m, s.n, s.l);
        if !self.alpha.is_finite() {
            return Err(Error::Config(format!("α = {}: must be finite", self.alpha)));
        }
        if self.activation == Activation::SwiGlu && !n.is_multiple_of(2) {
            return Err(shape(format!("SwiGLU pairs columns: N = {n} must be even")));
        }
        let dims = |t: &DeviceTensor, what: &str, want: (usize, usize, usize)| -> Result<()> {
            gpu.check(t.gpu, what)?;
            if t.dims() != want && !(what == "the bias" && t.dims() == (want.0, want.1, 1)) {
                return Err(shape(format!(
                    "{what} is {:?} (rows, columns, batch) but must be {want:?}{}",
                    t.dims(),
                    if what == "the bias" {
                        " or one row for every batch entry"
                    } else {
                        ""
                    }
                )));
            }
            Ok(())
        };
        if let Some((beta, c)) = self.c {
            if !beta.is_finite() {
                return Err(Error::Config(format!("β = {beta}: must be finite")));
            }
            dims(c, "C", (m, n, l))?;
        }
        if let Some(b) = self.bias {
            dims(b, "the bias", (1, n, l))?;
        }
        if let Some(r) = self.residual {
            dims(r, "the residual", (m, self.out_cols(n), l))?;
        }
        Ok(())
    }

    /// The kernels' parameters, the tensors' addresses taken through `launch`.
    fn params<'l>(&'l self, launch: &mut Launch<'l>) -> EpilogueParams {
        let ty = |t: &DeviceTensor| out_type(t.input_type()) as u32;
        let mut p = EpilogueParams::plain();
        if self.is_plain() {
            return p;
        }
        p.alpha = self.alpha;
        if let Some((beta, c)) = self.c {
            p.beta = beta;
            p.c = launch.ptr(&c.buf);
            p.c_type = ty(c);
        }
        if let Some(b) = self.bias {
            p.bias = launch.ptr(&b.buf);
            p.bias_type = ty(b);
            p.bias_batch = (b.dims().2 > 1) as u32;
        }
        if let Some(r) = self.residual {
            p.residual = launch.ptr(&r.buf);
            p.residual_type = ty(r);
        }
        p.activation = self.activation as u32;
        p
    }
}

fn out_type(t: InputType) -> OutType {
    match t {
        InputType::F32 => OutType::F32,
        InputType::Bf16 => OutType::Bf16,
        InputType::F16 => OutType::F16,
    }
}

/// Reorders SwiGLU weights stored as two stacked halves (`rows` rows of the gate projection, then
/// `rows` of the up projection, each `k` values) into the interleaved order the fused SwiGLU
/// reads (gate row j at 2j, up row j at 2j + 1). Any element type; `values.len()` = 2·rows·k.
pub fn interleave_gate_up<T: Copy>(values: &[T], rows: usize, k: usize) -> Result<Vec<T>> {
    if rows == 0 || k == 0 {
        return Err(shape(format!(
            "two stacked {rows} × {k} halves: rows and K must be non-zero"
        )));
    }
    let half = rows
        .checked_mul(k)
        .filter(|h| h.checked_mul(2).is_some())
        .ok_or_else(|| shape(format!("two stacked {rows} × {k} halves overflow")))?;
    if values.len() != 2 * half {
        return Err(shape(format!(
            "{} values for two stacked {rows} × {k} halves ({} expected)",
            values.len(),
            2 * half
        )));
    }
    let (gate, up) = values.split_at(half);
    Ok(gate
        .chunks(k)
        .zip(up.chunks(k))
        .flat_map(|(g, u)| g.iter().chain(u).copied())
        .collect())
}

/// The quantized output formats of a fused epilogue, and their scale blocks in output columns.
pub(crate) fn quant_block(format: &OperandFormat) -> Result<u32> {
    let block = match format.block {
        ScaleBlock::Tile { rows: 1, k } => k,
        _ => 0,
    };
    let ok = matches!(
        (format.elem, format.scale, block),
        (ElemType::E4M3 | ElemType::E5M2, ScaleType::F32, 128)
            | (
                ElemType::E4M3 | ElemType::E5M2 | ElemType::E2M1,
                ScaleType::E8M0,
                16 | 32
            )
            | (ElemType::E2M1, ScaleType::UE4M3, 16)
    );
    if ok {
        Ok(block)
    } else {
        Err(format.error(
            "a GEMM's quantized output is FP8 with fp32 scales per 1×128 (DeepSeek activations), \
             MXFP8 / MXFP4 (e8m0 per 1×32 or 1×16) or NVFP4 (ue4m3 per 1×16 with a given tensor \
             scale)",
        ))
    }
}

/// A quantized output's description and scale buffers (its codes are the launch's output).
pub(crate) struct QuantOut<'a> {
    pub spec: QuantSpec,
    /// The scales' buffer, reborrowed for the launch.
    pub scales: crate::buffers::MemMut<'a>,
    /// The FP8 kernel's A-role scales, when `spec.fp8_a`.
    pub sfa: Option<&'a mut CudaSlice<f32>>,
}

/// A fused epilogue bound to one launch's output: the steps, and the quantized output's
/// buffers (the codes are the launch's output buffer).
pub(crate) struct Fused<'a> {
    pub epi: &'a Epilogue<'a>,
    pub quant: Option<QuantOut<'a>>,
}

impl<'a> Fused<'a> {
    /// Whether the consumers can run this epilogue in their own registers
    /// ([`Epilogue::in_registers`]).
    pub(crate) fn in_registers(&self) -> InRegisters {
        let quant = self
            .quant
            .as_ref()
            .map(|q| (q.spec.desc.format, q.spec.block_k));
        self.epi.in_registers(quant)
    }

    /// The global scratch a fused epilogue stages its rows in for a kernel whose shared memory
    /// has no room for them (the MX kernel: `blockscaled_kernels::gemm::epilogue::fuse`): `ctas` CTAs of
    /// `consumers` warpgroups, tiles of `block_n` columns; `None` without a fused epilogue.
    /// Uninitialized: each warp writes its rows before it reads them.
    /// In `slot` (the handle's workspace, grown on demand; the kernel reads no byte it has not
    /// written: each warp stages its rows, then reads them).
    pub(crate) fn scratch<'s>(
        fused: &Option<Fused<'_>>,
        stream: &Arc<CudaStream>,
        (ctas, consumers, block_n): (u32, u32, u32),
        slot: &'s mut Option<CudaSlice<u8>>,
    ) -> Result<Option<&'s mut CudaSlice<u8>>> {
        if fused.is_none() {
            return Ok(None);
        }
        crate::alloc::grown(
            slot,
            stream,
            Self::staging_bytes((ctas, consumers, block_n)),
        )
        .map(Some)
    }

    /// The bytes [`Fused::scratch`] takes for `ctas` CTAs of `consumers` warpgroups and tiles of
    /// `block_n` columns.
    pub(crate) fn staging_bytes((ctas, consumers, block_n): (u32, u32, u32)) -> u64 {
        ctas as u64 * fused_staging(consumers, block_n) as u64
    }

    /// The fused kernels' [`EpilogueParams`] for `fused` (`None` without: the plain kernel runs),
    /// its buffers' addresses taken through `launch`; the quantized codes are the output at
    /// `out`; `scratch` from [`Fused::scratch`].
    pub(crate) fn params(
        fused: Option<Fused<'a>>,
        launch: &mut Launch<'a>,
        out: u64,
        scratch: Option<&'a mut CudaSlice<u8>>,
    ) -> Option<EpilogueParams> {
        let f = fused?;
        let mut p = f.epi.params(launch);
        if let Some(s) = scratch {
            p.scratch = launch.ptr_mut(s);
        }
        if let Some(q) = f.quant {
            let d = q.spec.desc;
            p.q_data = out;
            p.q_elem = d.format.elem as u32;
            p.q_scale = d.format.scale as u32;
            p.q_block = q.spec.block_k;
            p.q_tensor_scale = q.spec.given.unwrap_or(1.0);
            p.q_stride_l = d.scale_layout.batch_stride as u64;
            p.q_stride_r = d.scale_layout.row_stride as u64;
            p.q_stride_k = d.scale_layout.k_stride as u64;
            p.q_m_pad = q.spec.m_pad;
            p.q_scales = q.scales.bind(launch);
            p.q_sfa = match q.sfa {
                Some(s) => launch.ptr_mut(s),
                None => 0,
            };
        }
        Some(p)
    }
}

/// The quantized output's codes as an output buffer the families write through (a shell whose
/// `buf` is the codes; `n` the output's columns).
pub(crate) fn codes_shell(
    gpu: GpuId,
    data: crate::buffers::Mem<'_>,
    (m, n, l): (usize, usize, usize),
) -> crate::buffers::DeviceOutput<'_> {
    crate::buffers::DeviceOutput {
        gpu,
        dtype: OutType::Bf16,
        m,
        n,
        l,
        buf: data,
        prepared: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the host knows of an epilogue without a device: its steps, whether it is plain, its
    /// output's columns, where the kernels run it, and the staging its rows take.
    #[test]
    fn an_epilogues_steps_decide_its_columns_and_where_it_runs() {
        use crate::format::{Fp8, Recipe};
        assert!(Epilogue::new().is_plain());
        assert!(
            Epilogue::new()
                .alpha(1.0)
                .activation(Activation::None)
                .is_plain()
        );
        let alpha = Epilogue::new().alpha(2.0);
        assert!(!alpha.is_plain() && alpha.alpha == 2.0);
        let silu = Epilogue::new().activation(Activation::Silu);
        assert!(!silu.is_plain() && silu.activation == Activation::Silu);
        let swiglu = Epilogue::new().activation(Activation::SwiGlu);
        assert_eq!((silu.out_cols(512), swiglu.out_cols(512)), (512, 256));
        // In registers: not SwiGLU; quantized to FP8 1×128 (the same kernels) or MXFP8 (kernels
        // of their own); other outputs go to the finishing warps.
        let (fp8, mx) = (Recipe::DeepSeekFp8.a(), Recipe::Mxfp8(Fp8::E4M3).a());
        assert_eq!(silu.in_registers(None), InRegisters::Yes);
        assert_eq!(swiglu.in_registers(None), InRegisters::No);
        assert_eq!(silu.in_registers(Some((fp8, 128))), InRegisters::Yes);
        assert_eq!(silu.in_registers(Some((mx, 32))), InRegisters::Mx);
        assert_eq!(
            silu.in_registers(Some((Recipe::Nvfp4.a(), 16))),
            InRegisters::No
        );
        // Staging: every CTA's rows, the same per CTA.
        let one = Fused::staging_bytes((1, 2, 256));
        assert!(one > 0);
        assert_eq!(Fused::staging_bytes((132, 2, 256)), 132 * one);
        assert_eq!(
            [InputType::F32, InputType::Bf16, InputType::F16].map(out_type),
            [OutType::F32, OutType::Bf16, OutType::F16]
        );
    }

    #[test]
    fn empty_or_overflowing_halves_are_shape_errors_not_panics() {
        let v = [1.0f32; 4];
        // (No values for no rows or no K is still refused, not an empty reordering.)
        assert!(matches!(
            interleave_gate_up::<f32>(&[], 2, 0),
            Err(Error::Shape(_))
        ));
        assert!(matches!(
            interleave_gate_up::<f32>(&[], 0, 2),
            Err(Error::Shape(_))
        ));
        for (rows, k) in [(2, 0), (0, 2), (usize::MAX / 2, 3), (3, usize::MAX)] {
            assert!(
                matches!(interleave_gate_up(&v, rows, k), Err(Error::Shape(_))),
                "{rows} × {k}"
            );
        }
    }

    #[test]
    fn gate_and_up_rows_interleave_and_wrong_lengths_are_shape_errors() {
        // Two stacked halves of 2 rows × 3: gate rows 0, 1 then up rows 0, 1.
        let v: Vec<u32> = (0..12).collect();
        let got = interleave_gate_up(&v, 2, 3).unwrap();
        assert_eq!(got, vec![0, 1, 2, 6, 7, 8, 3, 4, 5, 9, 10, 11]);
        assert!(matches!(
            interleave_gate_up(&v, 3, 3),
            Err(crate::Error::Shape(_))
        ));
    }

    #[test]
    fn quantized_outputs_are_the_formats_a_next_gemm_reads() {
        use crate::{Fp8, Recipe};
        assert_eq!(quant_block(&Recipe::DeepSeekFp8.a()).unwrap(), 128);
        assert_eq!(quant_block(&Recipe::Mxfp8(Fp8::E4M3).a()).unwrap(), 32);
        assert_eq!(quant_block(&Recipe::Nvfp4.a()).unwrap(), 16);
        // 128×128 weight blocks are not an activation format.
        assert!(quant_block(&Recipe::DeepSeekFp8.b()).is_err());
    }
}
