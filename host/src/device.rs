//! The GPU side of the API: a [`Gpu`] (context, stream, kernel families), matrices on it, and
//! `gemm`.
//!
//! Every value that reaches a kernel was validated when its host-side matrix was built, and the
//! device copies keep that description next to their buffers, so a GEMM checks once that the
//! operands and the output belong to this GPU and fit each other, and validates its plan once.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaModule, CudaSlice, CudaStream, sys};

use crate::bsr::{self, BsrMatrix, DeviceBsr, SparseSide};
use crate::buffers::{DeviceMatrix, DeviceOutput, GpuId, Prepared};
use crate::error::{Error, Result, shape};
use crate::family::{Families, Gemm, Rewritten};
use crate::format::{ElemType, OperandFormat, OutType, ScaleType};
use crate::fused::{self, Epilogue, Fused, QuantOut};
use crate::grouped::{self, DeviceGroups, GroupLayout};
use crate::matrix::{GemmShape, ScaledMatrix};
use crate::plan::{self, GpuArch, Plan};
use crate::prepare::{Preparers, Source};
use crate::quantizer::TensorElement;
use crate::quantizer::{
    DeviceQuantized, DeviceTensor, QuantBufs, QuantSpec, QuantTarget, QuantizeOptions, Quantizers,
};
use crate::sm90_fp8::{Sm90Fp8, Sm90Operand};
use crate::sm90_half::Sm90Half;
use crate::sm90_mx::MxOperand;
use crate::sm90_mx_fp8::Sm90MxFp8;
use blockscaled_kernels::quantize::{InputType, ScaleSpan};

use crate::image::{self, KernelImage};

/// One GPU: a context, a stream and the loaded kernel families.
pub struct Gpu {
    /// What the buffers made here record, so that another `Gpu`'s are refused.
    id: GpuId,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    _module: Arc<CudaModule>,
    families: Families,
    quantizers: Quantizers,
    /// The kernels that prepare a device-quantized matrix for the GEMM families.
    preparers: Preparers,
    arch: GpuArch,
    /// The kernels' image: ptxas' cubin, or the PTX (JIT) where the cubin does not fit.
    image: KernelImage,
    name: String,
    sm_count: u32,
    /// A one-byte buffer that stands in a matrix for its codes while a GEMM writes them as its
    /// output (`gemm_quantized_into`), made once.
    placeholder: std::sync::Mutex<Option<CudaSlice<u8>>>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Gpu({}, {:?}, {} SMs, {} image{:?})",
            self.name, self.arch, self.sm_count, self.image, self.families
        )
    }
}

impl Gpu {
    /// Opens GPU `ordinal`. [`Error::NoDevice`] when there is no driver or no such GPU,
    /// [`Error::Architecture`] when it is neither Hopper nor Blackwell.
    pub fn new(ordinal: usize) -> Result<Self> {
        // SAFETY: only tries to dlopen libcuda; cudarc would panic later if it were missing.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::NoDevice(
                "the CUDA driver library (libcuda) could not be loaded".into(),
            ));
        }
        let count = CudaContext::device_count()
            .map_err(|e| Error::NoDevice(format!("cuDeviceGetCount: {e}")))?;
        if ordinal >= count.max(0) as usize {
            return Err(Error::NoDevice(format!(
                "GPU {ordinal} asked for, {count} present"
            )));
        }
        let ctx = CudaContext::new(ordinal)?;
        let (major, minor) = ctx.compute_capability()?;
        let name = ctx.name()?;
        let (arch, images) = match major {
            9 if minor == 0 => (GpuArch::Hopper, &image::SM90A),
            10 => (GpuArch::Blackwell, &image::SM100A),
            _ => {
                return Err(Error::Architecture(format!(
                    "{name} has compute capability {major}.{minor}; blockscaled has kernels for 9.0 \
                     (sm_90a, Hopper) and 10.x (sm_100a, Blackwell)"
                )));
            }
        };
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
            as u32;
        let (module, image) = image::load(&ctx, (major, minor), images)?;
        let stream = ctx.new_stream()?;
        let preparers = Preparers::load(&module, sm_count)?;
        let families = plan::load_families(&module, &stream, arch, sm_count, &preparers)?;
        let quantizers = Quantizers::load(&module, sm_count)?;
        Ok(Gpu {
            id: GpuId::next(),
            ctx,
            stream,
            _module: module,
            families,
            quantizers,
            preparers,
            arch,
            image,
            name,
            sm_count,
            placeholder: std::sync::Mutex::new(None),
        })
    }

    pub fn arch(&self) -> GpuArch {
        self.arch
    }
    /// Which image of the kernels was loaded (cubin, or the PTX as the fallback).
    pub fn image(&self) -> KernelImage {
        self.image
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }
    /// The stream every operation of this `Gpu` is ordered on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Copies a validated matrix to the GPU, with what each kernel family prepares of it.
    pub fn upload(&self, m: &ScaledMatrix) -> Result<DeviceMatrix> {
        let data = self.stream.clone_htod(m.data())?;
        // A scale buffer is never empty (every matrix has at least one block).
        let scales = self.stream.clone_htod(m.scales())?;
        let mut prepared = Prepared::default();
        for family in self.families.iter() {
            if let Some(p) =
                family.prepare_operand(&self.stream, &Source::Host(m), &data, &prepared)?
            {
                prepared.insert(p);
            }
        }
        Ok(DeviceMatrix {
            gpu: self.id,
            desc: *m.desc(),
            data,
            scales,
            prepared,
        })
    }

    /// Copies a bf16, fp16 or fp32 tensor `[batch][rows][k]` (row-major) to the GPU, as a
    /// quantizer's input. Its length must be `batch·rows·k`.
    pub fn upload_tensor<T: TensorElement>(
        &self,
        values: &[T],
        rows: usize,
        k: usize,
        batch: usize,
    ) -> Result<DeviceTensor> {
        let n = rows
            .checked_mul(k)
            .and_then(|x| x.checked_mul(batch))
            .ok_or_else(|| shape("rows × k × batch overflows"))?;
        if values.len() != n {
            return Err(shape(format!(
                "{batch}×{rows}×{k} values expected, got {}",
                values.len()
            )));
        }
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.le_bytes()).collect();
        Ok(DeviceTensor {
            gpu: self.id,
            input: T::INPUT,
            rows,
            k,
            batch,
            buf: self.stream.clone_htod(&bytes)?,
        })
    }

    /// A GEMM output as a quantizer's input (`[l][m][n]`: rows m, K n, batch l), without a copy:
    /// the next layer's activations.
    pub fn output_as_tensor(&self, c: DeviceOutput) -> Result<DeviceTensor> {
        self.id.check(c.gpu, "the output")?;
        Ok(DeviceTensor {
            gpu: self.id,
            input: match c.dtype {
                OutType::F32 => InputType::F32,
                OutType::Bf16 => InputType::Bf16,
                OutType::F16 => InputType::F16,
            },
            rows: c.m,
            k: c.n,
            batch: c.l,
            buf: c.buf,
        })
    }

    /// Quantizes `t` on the GPU into `format`, with the scale layout its users pass by default;
    /// bit-identical to [`ScaledMatrix::quantize`] on the same values. See
    /// [`quantize_with`](Self::quantize_with).
    pub fn quantize(&self, t: &DeviceTensor, format: OperandFormat) -> Result<DeviceMatrix> {
        Ok(self
            .quantize_with(t, format, &QuantizeOptions::default())?
            .matrix)
    }

    /// Quantizes `t` on the GPU: FP8 (e4m3, e5m2) with fp32 scales per 1×128 / 1×32 / 1×16, per
    /// row or per tensor, or e8m0 scales per 1×32 / 1×16 (MXFP8); e2m1 with e8m0 (MXFP4) or ue4m3
    /// scales and a tensor scale (NVFP4, computed or given). `opts` chooses the scale layout's
    /// major order, NVFP4's tensor scale, and a second copy of one-byte scales in the 128×4
    /// swizzled layout. [`Error::Format`] for another format, [`Error::Alignment`] for K not a
    /// multiple of 8. Non-finite input gives NaN scales (the host quantizer's `Error::Format`
    /// would need a wait). FP8 with fp32 scales per 1×128 (DeepSeek activations), per row or per
    /// tensor is written straight into the FP8 kernel's A-role layout too; every other copy a
    /// GEMM kernel reads of an activation (the MX kernel's scale layout, fp32 scale layouts) is
    /// made on the device from the quantizer's buffers, with no copy back. The copies only
    /// weights need (the FP8 kernel's B-role scales, each row's largest scale code for the fold,
    /// the 4-bit weights' reordered codes) are made, on the device too, when a GEMM first takes
    /// the matrix as weights: an activation quantized every step never pays for them.
    pub fn quantize_with(
        &self,
        t: &DeviceTensor,
        format: OperandFormat,
        opts: &QuantizeOptions,
    ) -> Result<DeviceQuantized> {
        self.id.check(t.gpu, "the tensor")?;
        let q = self.quantizers.quantize(&self.stream, t, format, opts)?;
        self.finish_quantized(q)
    }

    /// Quantizes `t` into `dst`, a matrix of `t`'s dimensions made by [`Gpu::quantize_with`] (or
    /// [`Gpu::gemm_quantized`]) with the same options, reusing its buffers: no allocation, and for
    /// FP8 with fp32 scales per 1×128 nothing but the kernel (its tensor maps stay valid), so a
    /// serving loop quantizes each step's activations into the same matrix. `opts` as for
    /// `quantize_with`, but no swizzled copy (`Error::Config`), and `opts.major` `None` keeps
    /// `dst`'s order. The copies the GEMM kernels read beside the codes and scales are made
    /// again on the device, in their buffers. [`Error::Shape`] or [`Error::Format`] where `dst` is not a
    /// matrix of this shape and format.
    pub fn quantize_into(
        &self,
        t: &DeviceTensor,
        dst: &mut DeviceMatrix,
        opts: &QuantizeOptions,
    ) -> Result<()> {
        self.id.check(t.gpu, "the tensor")?;
        self.id.check(dst.gpu, "the destination")?;
        if opts.swizzled_scales {
            return Err(Error::Config(
                "quantize_into writes no swizzled copy of the scales (quantize_with makes one)"
                    .into(),
            ));
        }
        let opts = QuantizeOptions {
            major: opts.major.or_else(|| major_of(&dst.desc)),
            ..*opts
        };
        let mut spec = QuantSpec::new(dst.desc.format, (t.rows, t.k, t.batch), &opts)?;
        self.check_target(&spec, &dst.desc)?;
        let (sfa, mx) = quantizer_copies(&mut dst.prepared, &spec);
        let written = Rewritten {
            sfa: sfa.is_some(),
            mx_scales: mx.is_some(),
        };
        let bufs = QuantBufs {
            data: &mut dst.data,
            scales: &mut dst.scales,
            swizzled: None,
            sfa,
            mx,
        };
        let was_finite = dst.desc.tensor_scale.is_finite();
        self.quantizers.write(&self.stream, t, &mut spec, bufs)?;
        dst.desc.tensor_scale = spec.desc.tensor_scale;
        self.after_rewrite(dst, written, was_finite)
    }

    /// `Error::Shape` / `Error::Format` unless `dst` is the matrix `spec` describes (its tensor
    /// scale aside).
    fn check_target(&self, spec: &QuantSpec, dst: &crate::MatrixDesc) -> Result<()> {
        let want = spec.desc;
        if (want.rows, want.k, want.batch) != (dst.rows, dst.k, dst.batch) {
            return Err(shape(format!(
                "the destination is {}×{}×{}, the values {}×{}×{}",
                dst.batch, dst.rows, dst.k, want.batch, want.rows, want.k
            )));
        }
        if want.format != dst.format || want.scale_layout != dst.scale_layout {
            return Err(Error::Format(format!(
                "the destination holds {:?} with scales {:?}, not the quantizer's {:?} with {:?}",
                dst.format, dst.scale_layout, want.format, want.scale_layout
            )));
        }
        Ok(())
    }

    /// A quantized matrix's buffers as a [`DeviceQuantized`], prepared for the GEMM kernels: FP8
    /// with fp32 scales per 1×128, per row or per tensor in the FP8 kernel's A-role layout the
    /// writer filled; the rest on the device ([`Gpu::prepare_on_device`]).
    fn finish_quantized(&self, q: crate::quantizer::Quantized) -> Result<DeviceQuantized> {
        let mut prepared = Prepared::default();
        if let Some(sfa) = q.sfa {
            prepared.insert(Box::new(Sm90Operand::written(
                &self.stream,
                &q.desc,
                &q.data,
                Some(sfa),
            )?));
        }
        let mut matrix = DeviceMatrix {
            gpu: self.id,
            desc: q.desc,
            data: q.data,
            scales: q.scales,
            prepared,
        };
        self.prepare_on_device(&mut matrix)?;
        Ok(DeviceQuantized {
            matrix,
            swizzled_scales: q.swizzled,
        })
    }

    /// `dst` after its codes and scales were rewritten in its buffers: each family's copies
    /// made again in place (their tensor maps stay valid; `written`: what the writer rewrote
    /// itself), or, where a family cannot or `dst` had none (a NaN tensor scale before:
    /// `was_finite` false), its preparation made anew.
    fn after_rewrite(
        &self,
        dst: &mut DeviceMatrix,
        written: Rewritten,
        was_finite: bool,
    ) -> Result<()> {
        if was_finite && dst.desc.tensor_scale.is_finite() {
            // (Field by field: the families write `dst.prepared` while reading the rest.)
            let src = Source::Device {
                desc: dst.desc,
                scales: &dst.scales,
                kernels: &self.preparers,
            };
            let mut all = true;
            for family in self.families.iter() {
                all &= family.refresh_operand(&self.stream, &src, &mut dst.prepared, written)?;
            }
            if all {
                return Ok(());
            }
        }
        dst.prepared = Prepared::default();
        self.prepare_on_device(dst)
    }

    /// `m`, a matrix written on the device, prepared for the GEMM kernels that take it from its
    /// device buffers (`crate::prepare`: no copy back, no wait), each family seeing what `m`
    /// holds already (the A-role scales the quantizer wrote in place); nothing for a NaN tensor
    /// scale (non-finite input), which no kernel takes.
    fn prepare_on_device(&self, m: &mut DeviceMatrix) -> Result<()> {
        if !m.desc.tensor_scale.is_finite() {
            return Ok(());
        }
        let src = Source::Device {
            desc: m.desc,
            scales: &m.scales,
            kernels: &self.preparers,
        };
        for family in self.families.iter() {
            if let Some(p) = family.prepare_operand(&self.stream, &src, &m.data, &m.prepared)? {
                m.prepared.insert(p);
            }
        }
        Ok(())
    }

    /// This MX or NVFP4 matrix folded to FP8 on the GPU, once, as the fold pre-pass does per
    /// call ([`ScaledMatrix::fold_to_fp8`] is the host's bit-identical version; the desc is
    /// [`MatrixDesc::folded`](crate::MatrixDesc::folded)): for the B role (`as_b`), fp32 scales
    /// per row; for the A role, per 1×128. Fold a model's weights (a MoE's experts) at load
    /// time, and [`Gpu::gemm`] and [`Gpu::grouped_gemm`] run them on the FP8 kernels without
    /// folding them again (lossy within the stated bound, as the fold path: `Plan::Sm90MxFp8`).
    /// [`Error::Format`] for a matrix that does not fold, [`Error::Architecture`] without the
    /// sm90 fold kernels.
    pub fn fold_to_fp8(&self, m: &DeviceMatrix, as_b: bool) -> Result<DeviceMatrix> {
        self.id.check(m.gpu, "the matrix")?;
        let fold = self.families.get::<Sm90MxFp8>().ok_or_else(|| {
            Error::Architecture(
                "this GPU has no fold kernels (they need compute capability 9.0)".into(),
            )
        })?;
        let (desc, data, scales, op) = fold.fold_once(&self.stream, m, as_b)?;
        let mut prepared = Prepared::default();
        prepared.insert(Box::new(op));
        Ok(DeviceMatrix {
            gpu: self.id,
            desc,
            data,
            scales,
            prepared,
        })
    }

    /// Allocates an `l` × `m` × `n` output, filled with a NaN pattern so that an element a kernel
    /// fails to write can never pass for a result.
    pub fn output(&self, m: usize, n: usize, l: usize, dtype: OutType) -> Result<DeviceOutput> {
        if m == 0 || n == 0 || l == 0 {
            return Err(shape(format!("empty output {l}×{m}×{n}")));
        }
        let bytes = m
            .checked_mul(n)
            .and_then(|x| x.checked_mul(l))
            .and_then(|x| x.checked_mul(dtype.bytes()))
            .ok_or_else(|| shape(format!("output {l}×{m}×{n} overflows")))?;
        // SAFETY: u8 has no invalid bit patterns; `poison` fills it before anyone reads it.
        let buf = unsafe { self.stream.alloc::<u8>(bytes) }?;
        let mut prepared = Prepared::default();
        for family in self.families.iter() {
            if let Some(p) = family.prepare_output(&self.stream, &buf, dtype, (m, n, l))? {
                prepared.insert(p);
            }
        }
        let mut out = DeviceOutput {
            gpu: self.id,
            dtype,
            m,
            n,
            l,
            buf,
            prepared,
        };
        out.poison()?;
        Ok(out)
    }

    /// C = A · Bᵀ for every batch entry, with the fastest kernel this GPU has for the formats.
    /// Asynchronous on [`Gpu::stream`]; [`DeviceOutput::to_host`] waits for it.
    ///
    /// The kernel and its configuration come from [`plan::choose`]; [`Gpu::plan`] tells which.
    pub fn gemm(&self, a: &DeviceMatrix, b: &DeviceMatrix, c: &mut DeviceOutput) -> Result<()> {
        let shape = self.check(a, b, c)?;
        let plan = plan::choose_for(self.arch, self.sm_count, &shape, &a.desc, &b.desc)?;
        self.run(shape, a, b, c, plan)
    }

    /// The plan [`Gpu::gemm`] would run for these operands.
    pub fn plan(&self, a: &DeviceMatrix, b: &DeviceMatrix) -> Result<Plan> {
        let shape = self.check_operands(a, b)?;
        plan::choose_for(self.arch, self.sm_count, &shape, &a.desc, &b.desc)
    }

    /// C = A · Bᵀ with a given plan (the runner's forced configurations). A plan the operands or
    /// this GPU cannot run is an error ([`Plan::validate`] says which).
    pub fn gemm_with(
        &self,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        c: &mut DeviceOutput,
        plan: Plan,
    ) -> Result<()> {
        let shape = self.check(a, b, c)?;
        self.run(shape, a, b, c, plan)
    }

    /// `c` = the epilogue `epi` of A · Bᵀ (α, β·C, bias, activation or SwiGLU, residual: see
    /// [`Epilogue`]), fused into the GEMM's kernel. `c` is the output's shape (`n / 2` columns
    /// with SwiGLU). The plan is [`Gpu::fused_plan`]'s.
    pub fn gemm_fused(
        &self,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        epi: &Epilogue<'_>,
        c: &mut DeviceOutput,
    ) -> Result<()> {
        let plan = self.fused_plan(a, b, epi, None)?;
        self.gemm_fused_with(a, b, epi, c, plan)
    }

    /// [`Gpu::gemm_fused`] with a given plan ([`Error::Config`] where its kernel cannot run the
    /// epilogue: the reference kernel; the kernels that compute Cᵀ; a tile or pair of element
    /// types without a fused kernel, see [`Gpu::fused_plan`]).
    pub fn gemm_fused_with(
        &self,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        epi: &Epilogue<'_>,
        c: &mut DeviceOutput,
        plan: Plan,
    ) -> Result<()> {
        let s = self.check_operands(a, b)?;
        epi.check(self.id, &s)?;
        self.id.check(c.gpu, "the output")?;
        let n_out = epi.out_cols(s.n);
        if (c.m, c.n, c.l) != (s.m, n_out, s.l) {
            return Err(shape(format!(
                "output is {}×{}×{} but the epilogue of A·Bᵀ is {}×{}×{}",
                c.l, c.m, c.n, s.l, s.m, n_out
            )));
        }
        plan.validate(&s)?;
        plan.check_fused(fused_needs((a, b), epi, None))?;
        let g = Gemm {
            stream: &self.stream,
            shape: s,
            a,
            b,
            c,
            groups: None,
            epi: (!epi.is_plain()).then_some(Fused { epi, quant: None }),
        };
        plan.launch(&self.families, g)
    }

    /// The epilogue `epi` of A · Bᵀ quantized into `format` by the GEMM's kernel: the next
    /// GEMM's A, without an output in memory in between or a quantizer launch. The formats:
    /// FP8 (e4m3, e5m2) with fp32 scales per 1×128 (written in the FP8 kernel's A-role layout
    /// too), MXFP8 / MXFP4 (e8m0 per 1×32 or 1×16), NVFP4 (ue4m3 per 1×16 with
    /// `opts.tensor_scale` given: the output's largest magnitude is not known before it is
    /// written). Bit-identical to [`Gpu::quantize_with`] of the same epilogue's f32 output.
    /// `opts.major` chooses the scales' order; swizzled scales are not written here.
    pub fn gemm_quantized(
        &self,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        epi: &Epilogue<'_>,
        format: OperandFormat,
        opts: &QuantizeOptions,
    ) -> Result<DeviceMatrix> {
        let plan = self.fused_plan(a, b, epi, Some(format))?;
        self.gemm_quantized_with(a, b, epi, format, opts, plan)
    }

    /// [`Gpu::gemm_quantized`] with a given plan.
    pub fn gemm_quantized_with(
        &self,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        epi: &Epilogue<'_>,
        format: OperandFormat,
        opts: &QuantizeOptions,
        plan: Plan,
    ) -> Result<DeviceMatrix> {
        let s = self.check_operands(a, b)?;
        epi.check(self.id, &s)?;
        let block = fused::quant_block(&format)? as usize;
        if opts.swizzled_scales {
            return Err(format.error(
                "a GEMM's quantized output has no swizzled copy of its scales (quantize the \
                 output with Gpu::quantize_with for one)",
            ));
        }
        if format.scale == ScaleType::UE4M3 && opts.tensor_scale.is_none() {
            return Err(Error::Config(
                "NVFP4 output needs QuantizeOptions::tensor_scale: the output's largest \
                 magnitude is not known before the GEMM writes it"
                    .into(),
            ));
        }
        let n_out = epi.out_cols(s.n);
        whole_blocks(n_out, block)?;
        plan.validate(&s)?;
        plan.check_fused(fused_needs((a, b), epi, Some(&format)))?;
        let mut t = QuantTarget::alloc(&self.stream, format, (s.m, n_out, s.l), opts)?;
        let spec = t.spec;
        let q = QuantOut {
            spec,
            scales: &mut t.scales,
            sfa: t.sfa.as_mut(),
        };
        self.launch_quantized(s, (a, b, epi, plan), &mut t.data, q)?;
        let q = crate::quantizer::Quantized {
            desc: spec.desc,
            data: t.data,
            scales: t.scales,
            sfa: t.sfa.map(|s| (s, spec.m_pad)),
            swizzled: None,
        };
        Ok(self.finish_quantized(q)?.matrix)
    }

    /// [`Gpu::gemm_quantized_with`] into `dst`, a matrix of the output's shape and format made by
    /// [`Gpu::gemm_quantized`] or [`Gpu::quantize_with`] (the same checks as
    /// [`Gpu::quantize_into`]; an NVFP4 `dst`'s tensor scale is the one the output is quantized
    /// with), reusing its buffers: for FP8 with fp32 scales per 1×128 nothing but the GEMM's
    /// launch.
    pub fn gemm_quantized_into(
        &self,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        epi: &Epilogue<'_>,
        dst: &mut DeviceMatrix,
        plan: Plan,
    ) -> Result<()> {
        let s = self.check_operands(a, b)?;
        epi.check(self.id, &s)?;
        self.id.check(dst.gpu, "the destination")?;
        let format = dst.desc.format;
        let block = fused::quant_block(&format)? as usize;
        let n_out = epi.out_cols(s.n);
        whole_blocks(n_out, block)?;
        let opts = QuantizeOptions {
            major: major_of(&dst.desc),
            tensor_scale: (format.scale == ScaleType::UE4M3).then_some(dst.desc.tensor_scale),
            swizzled_scales: false,
        };
        let spec = QuantSpec::new(format, (s.m, n_out, s.l), &opts)?;
        self.check_target(&spec, &dst.desc)?;
        plan.validate(&s)?;
        plan.check_fused(fused_needs((a, b), epi, Some(&format)))?;
        let sfa = a_role_scales(&mut dst.prepared, &spec);
        let written = Rewritten {
            sfa: sfa.is_some(),
            mx_scales: false,
        };
        let q = QuantOut {
            spec,
            scales: &mut dst.scales,
            sfa,
        };
        self.launch_quantized(s, (a, b, epi, plan), &mut dst.data, q)?;
        // (The tensor scale is the destination's own: a rewrite keeps it.)
        let finite = dst.desc.tensor_scale.is_finite();
        self.after_rewrite(dst, written, finite)
    }

    /// One launch of `plan` whose fused epilogue quantizes into `data` and `q`'s scales (checked
    /// by the caller). While it runs, `data` lends its buffer to the launch's output and holds
    /// a one-byte placeholder.
    fn launch_quantized(
        &self,
        s: GemmShape,
        (a, b, epi, plan): (&DeviceMatrix, &DeviceMatrix, &Epilogue<'_>, Plan),
        data: &mut CudaSlice<u8>,
        q: QuantOut<'_>,
    ) -> Result<()> {
        let n_out = epi.out_cols(s.n);
        let held = self
            .placeholder
            .lock()
            .map_err(|_| Error::Config("a thread panicked while holding the placeholder".into()))?
            .take();
        let placeholder = match held {
            Some(p) => p,
            None => self.stream.alloc_zeros::<u8>(1)?,
        };
        let codes = std::mem::replace(data, placeholder);
        let mut shell = fused::codes_shell(self.id, codes, (s.m, n_out, s.l));
        let g = Gemm {
            stream: &self.stream,
            shape: s,
            a,
            b,
            c: &mut shell,
            groups: None,
            epi: Some(Fused {
                epi,
                quant: Some(q),
            }),
        };
        let r = plan.launch(&self.families, g);
        let placeholder = std::mem::replace(data, shell.buf);
        if let Ok(mut slot) = self.placeholder.lock() {
            *slot = Some(placeholder);
        }
        r
    }

    /// The plan [`Gpu::gemm_fused`] (`quantized` `None`) or [`Gpu::gemm_quantized`] would run:
    /// the plain plan where its kernel has a fused variant, else the nearest that has (the FP8
    /// 128 × 128 tile, e4m3 × e4m3; the 16-bit 128 × 128 tile; the MX 256-column tile, which
    /// also takes MX / NVFP4 pairs whose FP8 fold would be e5m2).
    pub fn fused_plan(
        &self,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        epi: &Epilogue<'_>,
        quantized: Option<OperandFormat>,
    ) -> Result<Plan> {
        let s = self.check_operands(a, b)?;
        if let Some(f) = &quantized {
            fused::quant_block(f)?;
        }
        let needs = fused_needs((a, b), epi, quantized.as_ref());
        plan::choose_fused(self.arch, self.sm_count, &s, (&a.desc, &b.desc), needs)
    }

    /// C = A · Bᵀ with the SIMT reference kernel (float64 accumulation; for checking).
    pub fn reference_gemm(
        &self,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        c: &mut DeviceOutput,
    ) -> Result<()> {
        self.gemm_with(a, b, c, Plan::Reference)
    }

    /// Validates `plan` for `shape` once and launches it.
    fn run(
        &self,
        shape: GemmShape,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        c: &mut DeviceOutput,
        plan: Plan,
    ) -> Result<()> {
        plan.validate(&shape)?;
        let g = Gemm {
            stream: &self.stream,
            shape,
            a,
            b,
            c,
            groups: None,
            epi: None,
        };
        plan.launch(&self.families, g)
    }

    /// Copies a validated block-sparse matrix to the GPU, with what the kernel families prepare
    /// of it (the sm90 kernel's tensor maps of its stored blocks).
    pub fn upload_bsr(&self, m: &BsrMatrix) -> Result<DeviceBsr> {
        // A tensor map needs a nonempty tensor: a matrix with no stored blocks gets one zero
        // block (never read: no segment has a position).
        let block_bytes = m.block() * m.block() * m.elem().bits() as usize / 8;
        let (values, col) = if m.nnz() == 0 {
            (
                self.stream.alloc_zeros::<u8>(block_bytes)?,
                self.stream.alloc_zeros::<i32>(1)?,
            )
        } else {
            (
                self.stream.clone_htod(m.values())?,
                self.stream.clone_htod(m.col_indices())?,
            )
        };
        // (16-bit blocks have no scales: one unused zero keeps the buffer nonempty.)
        let scales = if m.scales().is_empty() {
            self.stream.alloc_zeros::<f32>(1)?
        } else {
            self.stream.clone_htod(m.scales())?
        };
        let mut prepared = Prepared::default();
        for family in self.families.iter() {
            if let Some(p) = family.prepare_sparse(&self.stream, m, &values)? {
                prepared.insert(p);
            }
        }
        Ok(DeviceBsr {
            gpu: self.id,
            elem: m.elem(),
            matrix_rows: m.rows(),
            cols: m.cols(),
            block: m.block(),
            nnz: m.nnz(),
            crow: m.crow_indices().to_vec(),
            _values: values,
            scales,
            col,
            prepared,
            work: Default::default(),
        })
    }

    /// Block-sparse GEMM: C = A · Bᵀ with the operand on `side` block-sparse (`sparse`, its
    /// missing blocks zeros) and `dense` the other one (FP8 with fp32 scales per 1×128, one batch
    /// entry). C is M × N: with B sparse, M = `dense`'s rows and N = `sparse`'s; with A sparse,
    /// the other way round. Time falls with the stored blocks: each output tile runs over its
    /// block row's stored blocks only (empty block rows write zeros), long runs cut into parts
    /// summed in a fixed order, so results are bitwise reproducible. Asynchronous like
    /// [`Gpu::gemm`]; the configuration comes from [`plan::choose_bsr`].
    pub fn bsr_gemm(
        &self,
        dense: &DeviceMatrix,
        sparse: &DeviceBsr,
        side: SparseSide,
        c: &mut DeviceOutput,
    ) -> Result<()> {
        let plan = self.bsr_plan(dense, sparse)?;
        self.bsr_gemm_with(dense, sparse, side, c, plan)
    }

    /// The plan [`Gpu::bsr_gemm`] would run (its shape is the kernel's: M the dense operand's
    /// rows, N the sparse operand's).
    pub fn bsr_plan(&self, dense: &DeviceMatrix, sparse: &DeviceBsr) -> Result<Plan> {
        let s = self.check_bsr(dense, sparse)?;
        plan::choose_bsr(
            self.arch,
            self.sm_count,
            &s,
            (sparse.elem, sparse.block, sparse.nnz()),
        )
    }

    /// [`Gpu::bsr_gemm`] with a given plan (`Plan::Sm90Fp8` with a block-sparse tile; the
    /// runner's forced configurations).
    pub fn bsr_gemm_with(
        &self,
        dense: &DeviceMatrix,
        sparse: &DeviceBsr,
        side: SparseSide,
        c: &mut DeviceOutput,
        plan: Plan,
    ) -> Result<()> {
        let s = self.check_bsr(dense, sparse)?;
        self.id.check(c.gpu, "the output")?;
        let (m, n) = bsr::output_dims(side, s.m, s.n);
        if (c.m, c.n, c.l) != (m, n, 1) {
            return Err(shape(format!(
                "output is {}×{}×{} but the block-sparse product is 1×{m}×{n}",
                c.l, c.m, c.n
            )));
        }
        let hopper =
            || Error::Architecture("block-sparse GEMM has Hopper (sm_90a) kernels only".into());
        match (plan, sparse.elem) {
            (Plan::Sm90Fp8(cfg), ElemType::E4M3) => {
                cfg.validate_sparse(&s)?;
                let family = self.families.get::<Sm90Fp8>().ok_or_else(hopper)?;
                family.bsr_gemm(&self.stream, dense, sparse, side, c, cfg)
            }
            (Plan::Sm90Half(cfg), ElemType::BF16 | ElemType::F16) => {
                cfg.validate_sparse(&s, sparse.block)?;
                let family = self.families.get::<Sm90Half>().ok_or_else(hopper)?;
                family.bsr_gemm(&self.stream, dense, sparse, side, c, cfg)
            }
            (plan, elem) => Err(Error::Config(format!(
                "{plan:?}: block-sparse GEMM of {} blocks runs on the sm90 {} kernel",
                elem.name(),
                if elem == ElemType::E4M3 {
                    "FP8 kernel (Plan::Sm90Fp8)"
                } else {
                    "16-bit kernel (Plan::Sm90Half)"
                }
            ))),
        }
    }

    /// The dense and sparse operands belong to this GPU and fit: the kernel's shape (M the
    /// dense operand's rows, N the sparse one's).
    fn check_bsr(&self, dense: &DeviceMatrix, sparse: &DeviceBsr) -> Result<GemmShape> {
        self.id.check(dense.gpu, "the dense operand")?;
        self.id.check(sparse.gpu, "the sparse operand")?;
        let d = &dense.desc;
        if d.k != sparse.cols || d.batch != 1 {
            return Err(shape(format!(
                "dense operand {}×{}×{} and sparse {}×{}: K must match and the batch be 1",
                d.batch, d.rows, d.k, sparse.matrix_rows, sparse.cols
            )));
        }
        Ok(GemmShape {
            m: d.rows,
            n: sparse.matrix_rows,
            k: d.k,
            l: 1,
        })
    }

    /// A contiguous grouped GEMM's groups from host values: group g ends at row `ends[g]`
    /// (non-decreasing, as torch's `offs`). [`Error::Shape`] for G = 0, a negative or a
    /// decreasing end. The module doc of `grouped` (and [`Gpu::grouped_gemm`]) has the layout.
    pub fn group_ends(&self, ends: &[i32]) -> Result<DeviceGroups> {
        self.groups(GroupLayout::Contiguous, ends)
    }

    /// A masked grouped GEMM's groups from host values: group g has `counts[g]` rows (≥ 0).
    pub fn group_counts(&self, counts: &[i32]) -> Result<DeviceGroups> {
        self.groups(GroupLayout::Masked, counts)
    }

    fn groups(&self, layout: GroupLayout, values: &[i32]) -> Result<DeviceGroups> {
        grouped::check_values(layout, values)?;
        Ok(DeviceGroups {
            gpu: self.id,
            layout,
            values: self.stream.clone_htod(values)?,
            host_top: values.iter().max().map(|&v| v as usize),
        })
    }

    /// Groups whose values the caller's kernels write on the device: `g` zeroed int32 values
    /// (every group empty until written). The GEMM kernels clamp what they find (module doc of
    /// `grouped`).
    pub fn device_groups(&self, layout: GroupLayout, g: usize) -> Result<DeviceGroups> {
        if g == 0 {
            return Err(shape("G = 0: a grouped GEMM needs at least one group"));
        }
        Ok(DeviceGroups {
            gpu: self.id,
            layout,
            values: self.stream.alloc_zeros::<i32>(g)?,
            host_top: None,
        })
    }

    /// Grouped GEMM (mixture of experts), one persistent launch over every group's tiles:
    /// - contiguous groups: A is `R × K` (all groups' rows stacked, batch 1), B is `G × N × K`
    ///   (batch entry g: group g's expert), C is `R × N`; group g is rows `ends[g−1]..ends[g]`
    ///   of A and C; rows past the last end are not written;
    /// - masked groups: A is `G × capacity × K`, C is `G × capacity × N`; group g is the first
    ///   `counts[g]` rows of batch entry g; the rest are not written.
    ///
    /// Asynchronous like [`Gpu::gemm`], and no host synchronization for the groups (they stay on
    /// the GPU). The kernel comes from [`plan::choose_grouped`]. Formats: FP8 with fp32 scales
    /// (e.g. DeepSeek's 1×128 / 128×128), MX and NVFP4 pairs, and 4-bit experts (MXFP4 /
    /// NVFP4 B) with bf16 or FP8 activations; MXFP4 experts and 4-bit experts with FP8
    /// activations are folded to FP8 per call (lossy within the fold's bound; `Plan::Sm90MxFp8`),
    /// and experts folded once by [`Gpu::fold_to_fp8`] run as FP8 experts.
    pub fn grouped_gemm(
        &self,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        groups: &DeviceGroups,
        c: &mut DeviceOutput,
    ) -> Result<()> {
        let plan = self.grouped_plan(a, b, groups)?;
        self.grouped_gemm_with(a, b, groups, c, plan)
    }

    /// The plan [`Gpu::grouped_gemm`] would run.
    pub fn grouped_plan(
        &self,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        groups: &DeviceGroups,
    ) -> Result<Plan> {
        let shape = self.check_grouped(a, b, groups)?;
        plan::choose_grouped(&plan::GroupedProblem {
            arch: self.arch,
            sm_count: self.sm_count,
            shape,
            a: &a.desc,
            b: &b.desc,
            groups: groups.count(),
        })
    }

    /// [`Gpu::grouped_gemm`] with a given plan (the runner's forced configurations).
    pub fn grouped_gemm_with(
        &self,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        groups: &DeviceGroups,
        c: &mut DeviceOutput,
        plan: Plan,
    ) -> Result<()> {
        let s = self.check_grouped(a, b, groups)?;
        self.id.check(c.gpu, "the output")?;
        if (c.m, c.n, c.l) != (s.m, s.n, s.l) {
            return Err(shape(format!(
                "output is {}×{}×{} but the grouped product is {}×{}×{}",
                c.l, c.m, c.n, s.l, s.m, s.n
            )));
        }
        plan.validate_grouped(&s)?;
        let g = Gemm {
            stream: &self.stream,
            shape: s,
            a,
            b,
            c,
            groups: Some(groups),
            epi: None,
        };
        plan.launch(&self.families, g)
    }

    /// A, B and the groups belong to this GPU and fit together.
    fn check_grouped(
        &self,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        groups: &DeviceGroups,
    ) -> Result<GemmShape> {
        self.id.check(a.gpu, "A")?;
        self.id.check(b.gpu, "B")?;
        self.id.check(groups.gpu, "the groups")?;
        grouped::grouped_shape(&a.desc, &b.desc, groups.desc())
    }

    /// A and B belong to this GPU and can be multiplied.
    fn check_operands(&self, a: &DeviceMatrix, b: &DeviceMatrix) -> Result<GemmShape> {
        self.id.check(a.gpu, "A")?;
        self.id.check(b.gpu, "B")?;
        GemmShape::of(&a.desc, &b.desc)
    }

    /// A, B and C belong to this GPU, and C is the shape of A · Bᵀ.
    fn check(&self, a: &DeviceMatrix, b: &DeviceMatrix, c: &DeviceOutput) -> Result<GemmShape> {
        let s = self.check_operands(a, b)?;
        self.id.check(c.gpu, "the output")?;
        if (c.m, c.n, c.l) != (s.m, s.n, s.l) {
            return Err(shape(format!(
                "output is {}×{}×{} but A·Bᵀ is {}×{}×{}",
                c.l, c.m, c.n, s.l, s.m, s.n
            )));
        }
        Ok(s)
    }
}

/// What `epi` with a quantized output of `format` (if any) needs of a plan.
fn fused_needs(
    (a, b): (&DeviceMatrix, &DeviceMatrix),
    epi: &Epilogue<'_>,
    format: Option<&OperandFormat>,
) -> plan::FusedNeeds {
    let paired = epi.activation == crate::fused::Activation::SwiGlu;
    let block = format.map_or(0, |f| fused::quant_block(f).unwrap_or(0));
    plan::FusedNeeds {
        block_cols: block * if paired { 2 } else { 1 },
        elems: (a.desc.format.elem, b.desc.format.elem),
        in_registers: epi.in_registers(format.map(|f| (*f, block))),
    }
}

/// The major order of `d`'s scales where they are packed (the quantizers' layouts); `None`
/// otherwise (the check that follows then names the difference).
fn major_of(d: &crate::MatrixDesc) -> Option<crate::format::ScaleMajor> {
    use crate::format::ScaleMajor;
    use crate::matrix::ScaleLayout;
    let l = d.scale_layout;
    [ScaleMajor::K, ScaleMajor::Mn]
        .into_iter()
        .find(|&m| ScaleLayout::packed(m, l.row_blocks, l.k_blocks) == l)
}

/// `Error::Alignment` unless a quantized output's `n_out` columns are whole scale blocks of
/// `block`: a block is quantized by the lanes that hold it.
fn whole_blocks(n_out: usize, block: usize) -> Result<()> {
    if n_out.is_multiple_of(block) {
        Ok(())
    } else {
        Err(Error::Alignment(format!(
            "a quantized output's columns must be a multiple of its scale block ({block}), not \
             {n_out}: a block is quantized by the lanes that hold it"
        )))
    }
}

/// The copies among a matrix's prepared data that the device quantizer rewrites itself, where
/// `spec`'s format has one: the FP8 kernel's A-role scales (FP8 with fp32 scales per 1×128, per
/// row or per tensor, [`a_role_scales`]) or
/// the MX kernel's scale layout and its `rows_pad` (one-byte scales per 1×16 or 1×32).
#[allow(clippy::type_complexity)]
fn quantizer_copies<'a>(
    prepared: &'a mut Prepared,
    spec: &QuantSpec,
) -> (
    Option<&'a mut CudaSlice<f32>>,
    Option<(&'a mut CudaSlice<u8>, u32)>,
) {
    if spec.fp8_a {
        (a_role_scales(prepared, spec), None)
    } else if spec.span == ScaleSpan::Block && matches!(spec.block_k, 16 | 32) {
        (None, MxOperand::layout_scales_mut(prepared))
    } else {
        (None, None)
    }
}

/// The FP8 kernel's A-role scale copy among a matrix's prepared data, where `spec`'s format has
/// one (FP8 with fp32 scales per 1×128, per row or per tensor): a rewrite of the matrix writes
/// it in place.
fn a_role_scales<'a>(
    prepared: &'a mut Prepared,
    spec: &QuantSpec,
) -> Option<&'a mut CudaSlice<f32>> {
    match prepared.get_mut::<Sm90Operand>() {
        Some(op) if spec.fp8_a => op.sfa.as_mut().map(|s| &mut s.0),
        _ => None,
    }
}
