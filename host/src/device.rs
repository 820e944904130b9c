//! The GPU side of the API: a [`Gpu`] (context, stream, kernel families), matrices on it, and
//! `gemm`.
//!
//! Every value that reaches a kernel was validated when its host-side matrix was built, and the
//! device copies keep that description next to their buffers, so a GEMM checks once that the
//! operands and the output belong to this GPU and fit each other, and validates its plan once.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaModule, CudaSlice, CudaStream, sys};

use crate::bsr::{self, BsrMatrix, DeviceBsr, SparseSide};
use crate::buffers::{DeviceMatrix, DeviceOutput, GpuId, Mem, MemMut, Prepared};
use crate::error::{Error, Result, shape};
use crate::family::{Families, Gemm, Rewritten};
use crate::format::{ElemType, OperandFormat, OutType, ScaleType};
use crate::fused::{self, Epilogue, Fused, QuantOut};
use crate::grouped::{self, DeviceGroups, GroupLayout, GroupValues};
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
use crate::workspace::{Workspace, WorkspaceSize};

/// One GPU's kernels, loaded once into a context and shared by every [`Gpu`] handle on it.
struct Device {
    /// What the buffers made here record, so that another context's are refused.
    id: GpuId,
    ctx: Arc<CudaContext>,
    _module: Arc<CudaModule>,
    families: Families,
    quantizers: Quantizers,
    /// The kernels that prepare a device-quantized matrix for the GEMM families.
    preparers: Preparers,
    /// The mixture-of-experts routing and token-movement kernels.
    moe: crate::moe::MoeKernels,
    arch: GpuArch,
    /// The kernels' image: ptxas' cubin, or the PTX (JIT) where the cubin does not fit.
    image: KernelImage,
    name: String,
    sm_count: u32,
    /// fp32 ones, the scales of every bf16 / fp16 view ([`Gpu::half_view`]): made once, grown to
    /// the most batch entries a view has had, shared (read only) by the views.
    ones: std::sync::Mutex<Option<Arc<cudarc::driver::CudaSlice<u8>>>>,
}

impl Device {
    /// At least `count` fp32 ones (in stream order on `stream` when made).
    pub(crate) fn ones(
        &self,
        stream: &Arc<CudaStream>,
        count: usize,
    ) -> Result<Arc<cudarc::driver::CudaSlice<u8>>> {
        let mut ones = crate::workspace::lock(&self.ones);
        match &*ones {
            Some(o) if o.len() >= count * 4 => Ok(o.clone()),
            _ => {
                let v: Vec<u8> = (0..count).flat_map(|_| 1f32.to_le_bytes()).collect();
                let o = Arc::new(crate::alloc::copy_of(stream, &v)?);
                *ones = Some(o.clone());
                Ok(o)
            }
        }
    }
}

impl Drop for Device {
    /// Unloading the module while its kernels run would pull their code from under them: wait
    /// for every stream of the context first (the last handle is going, so no new work is
    /// enqueued by this crate).
    fn drop(&mut self) {
        // (An error here, a context already broken, leaves nothing to wait for.)
        let _ = self.ctx.synchronize();
    }
}

/// The family (and its configuration) a block-sparse GEMM runs on.
enum SparseFamily<'f> {
    Fp8(&'f Sm90Fp8, crate::sm90_fp8::Sm90Config),
    Half(&'f Sm90Half, crate::sm90_half::Sm90HalfConfig),
}

/// One GPU, seen through one stream: the loaded kernel families (shared by every handle of the
/// same context, [`Gpu::with_stream`]), the stream every call of this handle is enqueued on, and
/// this handle's workspace (split K, the fold pre-pass), reused in the stream's order.
///
/// A `Gpu` is `Send` and `Sync`; threads that want to run at once each take a handle of their own
/// stream ([`Gpu::with_stream`]): calls on one handle share its workspace and stream, so they run
/// in the order they are enqueued.
pub struct Gpu {
    dev: Arc<Device>,
    stream: Arc<CudaStream>,
    work: Workspace,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = &self.dev;
        write!(
            f,
            "Gpu({}, {:?}, {} SMs, {} image{:?})",
            d.name, d.arch, d.sm_count, d.image, d.families
        )
    }
}

impl Gpu {
    /// Opens GPU `ordinal` (its primary context, the one the CUDA runtime and frameworks such as
    /// candle and torch use) with a stream of its own. [`Error::NoDevice`] when there is no driver
    /// or no such GPU, [`Error::Architecture`] when it is neither Hopper nor Blackwell.
    pub fn new(ordinal: usize) -> Result<Self> {
        if !driver_present() {
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
        Self::from_context(CudaContext::new(ordinal)?)
    }

    /// Loads the kernels into the caller's context (a cudarc context the program already uses),
    /// with a stream of its own on it. [`Error::Architecture`] as for [`Gpu::new`].
    pub fn from_context(ctx: Arc<CudaContext>) -> Result<Self> {
        let stream = ctx.new_stream()?;
        Self::from_stream(stream)
    }

    /// Loads the kernels into the context of the caller's `stream`, and enqueues every call of
    /// this handle on that stream: an engine orders them with its own kernels (and can capture
    /// them in a CUDA graph: no call of a prepared operand allocates or waits on the host, see
    /// the module doc). [`Error::Architecture`] as for [`Gpu::new`].
    pub fn from_stream(stream: Arc<CudaStream>) -> Result<Self> {
        let ctx = stream.context().clone();
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
        let preparers = Preparers::load(&module, sm_count)?;
        let families = plan::load_families(&module, &stream, arch, sm_count, &preparers)?;
        let quantizers = Quantizers::load(&module, sm_count)?;
        let moe = crate::moe::MoeKernels::load(&module, sm_count)?;
        Ok(Gpu {
            dev: Arc::new(Device {
                id: GpuId::next(),
                ctx,
                _module: module,
                families,
                quantizers,
                preparers,
                moe,
                arch,
                image,
                name,
                sm_count,
                ones: Default::default(),
            }),
            stream,
            work: Workspace::default(),
        })
    }

    /// A handle on the same GPU (the same loaded kernels, no second load) whose calls are
    /// enqueued on `stream`, with a workspace of its own: a thread per stream runs its GEMMs
    /// concurrently with the others'. Matrices and outputs made by any handle of this GPU work
    /// with every other. [`Error::WrongGpu`] for a stream of another context.
    pub fn with_stream(&self, stream: Arc<CudaStream>) -> Result<Gpu> {
        self.same_context(stream.context(), "the stream")?;
        Ok(Gpu {
            dev: self.dev.clone(),
            stream,
            work: Workspace::default(),
        })
    }

    /// [`Error::WrongGpu`] unless `ctx` is this GPU's context (the same driver context, whichever
    /// `Arc` holds it).
    pub(crate) fn same_context(&self, ctx: &Arc<CudaContext>, what: &str) -> Result<()> {
        if ctx.cu_ctx() == self.dev.ctx.cu_ctx() {
            Ok(())
        } else {
            Err(Error::WrongGpu(format!(
                "{what} belongs to another CUDA context (GPU {}), not this Gpu's (GPU {})",
                ctx.ordinal(),
                self.dev.ctx.ordinal()
            )))
        }
    }

    /// The GPU's architecture.
    pub fn arch(&self) -> GpuArch {
        self.dev.arch
    }
    /// Which image of the kernels was loaded (cubin, or the PTX as the fallback).
    pub fn image(&self) -> KernelImage {
        self.dev.image
    }
    /// The device's name.
    pub fn name(&self) -> &str {
        &self.dev.name
    }
    /// The number of SMs.
    pub fn sm_count(&self) -> u32 {
        self.dev.sm_count
    }
    /// The stream every operation of this handle is ordered on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    /// The context the kernels are loaded into.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.dev.ctx
    }

    /// The loaded kernel families.
    pub(crate) fn families(&self) -> &Families {
        &self.dev.families
    }

    /// This handle's own workspace (the one a call without [`crate::Call::workspace`] uses).
    pub(crate) fn handle_workspace(&self) -> &Workspace {
        &self.work
    }

    /// Makes `ws`'s fold copies for `a` and `b` where the fold family would fold them.
    pub(crate) fn reserve_fold(
        &self,
        ws: &Workspace,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
    ) -> Result<()> {
        crate::sm90_mx_fp8::Sm90MxFp8::reserve(&self.stream, ws, (a, b))
    }

    /// [`Device::ones`] on this handle's stream.
    pub(crate) fn ones(&self, count: usize) -> Result<Arc<cudarc::driver::CudaSlice<u8>>> {
        self.dev.ones(&self.stream, count)
    }

    /// The identity buffers made on this GPU record.
    pub(crate) fn moe_kernels(&self) -> &crate::moe::MoeKernels {
        &self.dev.moe
    }

    pub(crate) fn id(&self) -> GpuId {
        self.dev.id
    }

    /// Copies a validated matrix to the GPU, with what each kernel family prepares of it.
    pub fn upload(&self, m: &ScaledMatrix) -> Result<DeviceMatrix<'static>> {
        let data = Mem::Owned(crate::alloc::copy_of(&self.stream, m.data())?);
        // A scale buffer is never empty (every matrix has at least one block).
        let scales = Mem::Owned(crate::alloc::copy_of(&self.stream, m.scales())?);
        let mut prepared = Prepared::default();
        for family in self.dev.families.iter() {
            if let Some(p) =
                family.prepare_operand(&self.stream, &Source::Host(m), &data, &prepared)?
            {
                prepared.insert(p);
            }
        }
        Ok(DeviceMatrix {
            gpu: self.dev.id,
            desc: *m.desc(),
            data,
            scales,
            prepared,
            scratch: Default::default(),
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
    ) -> Result<DeviceTensor<'static>> {
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
            gpu: self.dev.id,
            input: T::INPUT,
            rows,
            k,
            batch,
            buf: Mem::Owned(crate::alloc::copy_of(&self.stream, &bytes)?),
        })
    }

    /// A GEMM output as a quantizer's input (`[l][m][n]`: rows m, K n, batch l), without a copy:
    /// the next layer's activations.
    pub fn output_as_tensor<'a>(&self, c: DeviceOutput<'a>) -> Result<DeviceTensor<'a>> {
        self.dev.id.check(c.gpu, "the output")?;
        Ok(DeviceTensor {
            gpu: self.dev.id,
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
    pub fn quantize(
        &self,
        t: &DeviceTensor,
        format: OperandFormat,
    ) -> Result<DeviceMatrix<'static>> {
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
        self.dev.id.check(t.gpu, "the tensor")?;
        let (q, scratch) = self
            .dev
            .quantizers
            .quantize(&self.stream, t, format, opts)?;
        let mut q = self.finish_quantized(q)?;
        q.matrix.scratch = scratch;
        Ok(q)
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
        self.dev.id.check(t.gpu, "the tensor")?;
        self.dev.id.check(dst.gpu, "the destination")?;
        writable(dst)?;
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
        self.dev
            .quantizers
            .write(&self.stream, t, &mut spec, bufs, &mut dst.scratch)?;
        dst.desc.tensor_scale = spec.desc.tensor_scale;
        self.after_rewrite(dst, written, was_finite)
    }

    /// A matrix of `format` and `dims` (rows, K, batch) for this crate's own device writers to
    /// fill (the MoE kernels' grouped rows): codes and scales uninitialized, prepared as a
    /// quantizer's output is. Each write is followed by [`Self::rewritten`].
    pub(crate) fn blank_matrix(
        &self,
        format: OperandFormat,
        dims: (usize, usize, usize),
    ) -> Result<DeviceMatrix<'static>> {
        let t = crate::quantizer::QuantTarget::alloc(
            &self.stream,
            format,
            dims,
            &QuantizeOptions::default(),
        )?;
        let m_pad = t.spec.m_pad;
        let q = crate::quantizer::Quantized {
            desc: t.spec.desc,
            data: t.data,
            scales: t.scales,
            sfa: t.sfa.map(|s| (s, m_pad)),
            swizzled: t.swizzled,
        };
        Ok(self.finish_quantized(q)?.matrix)
    }

    /// The copies the GEMM kernels read beside `m`'s codes and packed scales, made again on the
    /// device after a kernel of this crate rewrote them in place (the FP8 kernel's A-role
    /// scales too where `sfa`: those are not made again).
    pub(crate) fn rewritten(&self, m: &mut DeviceMatrix, sfa: bool) -> Result<()> {
        let written = Rewritten {
            sfa,
            mx_scales: false,
        };
        self.after_rewrite(m, written, true)
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
            gpu: self.dev.id,
            desc: q.desc,
            data: Mem::Owned(q.data),
            scales: Mem::Owned(q.scales),
            prepared,
            scratch: Default::default(),
        };
        self.prepare_on_device(&mut matrix, false)?;
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
                kernels: &self.dev.preparers,
                unit_scale: false,
            };
            let mut all = true;
            for family in self.dev.families.iter() {
                all &= family.refresh_operand(&self.stream, &src, &mut dst.prepared, written)?;
            }
            if all {
                return Ok(());
            }
        }
        dst.prepared = Prepared::default();
        self.prepare_on_device(dst, false)
    }

    /// `m`, a matrix written on the device, prepared for the GEMM kernels that take it from its
    /// device buffers (`crate::prepare`: no copy back, no wait), each family seeing what `m`
    /// holds already (the A-role scales the quantizer wrote in place); nothing for a NaN tensor
    /// scale (non-finite input), which no kernel takes. Matrices over the caller's memory are
    /// prepared so too (`unit_scale`: a 16-bit one whose scale is 1, known to the host).
    pub(crate) fn prepare_on_device(&self, m: &mut DeviceMatrix, unit_scale: bool) -> Result<()> {
        if !m.desc.tensor_scale.is_finite() {
            return Ok(());
        }
        let src = Source::Device {
            desc: m.desc,
            scales: &m.scales,
            kernels: &self.dev.preparers,
            unit_scale,
        };
        for family in self.dev.families.iter() {
            if let Some(p) = family.prepare_operand(&self.stream, &src, &m.data, &m.prepared)? {
                m.prepared.insert(p);
            }
        }
        Ok(())
    }

    /// What the families prepare of an output (its tensor maps).
    pub(crate) fn prepare_output(&self, out: &mut DeviceOutput<'_>) -> Result<()> {
        for family in self.dev.families.iter() {
            if let Some(p) =
                family.prepare_output(&self.stream, &out.buf, out.dtype, (out.m, out.n, out.l))?
            {
                out.prepared.insert(p);
            }
        }
        Ok(())
    }

    /// Makes now every copy a GEMM makes of `m` at its first use as weights (B): the FP8 kernel's
    /// B-role scales, each row's largest scale code for the fold, the 4-bit weights' reordered
    /// codes. Call it once when the model's weights are loaded (over the caller's memory too):
    /// then no GEMM on them allocates or launches anything but itself. The copies live with `m`
    /// ([`DeviceMatrix::prepared_bytes`] says how much memory they take).
    pub fn prepare_weights(&self, m: &DeviceMatrix<'_>) -> Result<()> {
        self.dev.id.check(m.gpu, "the matrix")?;
        for family in self.dev.families.iter() {
            family.prepare_weights(&self.stream, m)?;
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
    pub fn fold_to_fp8(&self, m: &DeviceMatrix, as_b: bool) -> Result<DeviceMatrix<'static>> {
        self.dev.id.check(m.gpu, "the matrix")?;
        let fold = self.dev.families.get::<Sm90MxFp8>().ok_or_else(|| {
            Error::Architecture(
                "this GPU has no fold kernels (they need compute capability 9.0)".into(),
            )
        })?;
        let (desc, data, scales, op) = fold.fold_once(&self.stream, m, as_b)?;
        let mut prepared = Prepared::default();
        prepared.insert(Box::new(op));
        Ok(DeviceMatrix {
            gpu: self.dev.id,
            desc,
            data: Mem::Owned(data),
            scales: Mem::Owned(scales),
            prepared,
            scratch: Default::default(),
        })
    }

    /// Allocates an `l` × `m` × `n` output, filled with a NaN pattern so that an element a kernel
    /// fails to write can never pass for a result.
    pub fn output(
        &self,
        m: usize,
        n: usize,
        l: usize,
        dtype: OutType,
    ) -> Result<DeviceOutput<'static>> {
        let bytes = crate::buffers::output_bytes(dtype, (m, n, l))?;
        // SAFETY: u8 has no invalid bit patterns; `poison` fills it before anyone reads it.
        let buf = Mem::Owned(unsafe { crate::alloc::uninit::<u8>(&self.stream, bytes) }?);
        let mut out = self.output_over(buf, dtype, (m, n, l))?;
        out.poison()?;
        Ok(out)
    }

    /// [`Gpu::gemm_fused`] with a given plan ([`Error::Config`] where its kernel cannot run the
    /// epilogue: the reference kernel; the kernels that compute Cᵀ; a tile or pair of element
    /// types without a fused kernel, see [`Gpu::fused_plan`]).
    pub(crate) fn fused_on(
        &self,
        work: &Workspace,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        epi: &Epilogue<'_>,
        c: &mut DeviceOutput,
        plan: Plan,
    ) -> Result<()> {
        let s = self.check_operands(a, b)?;
        epi.check(self.dev.id, &s)?;
        self.dev.id.check(c.gpu, "the output")?;
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
            work,
            shape: s,
            a,
            b,
            c,
            groups: None,
            epi: (!epi.is_plain()).then_some(Fused { epi, quant: None }),
        };
        plan.launch(&self.dev.families, g)
    }

    /// [`Gpu::gemm_quantized`] with a given plan.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn quantized_new_on(
        &self,
        work: &Workspace,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        epi: &Epilogue<'_>,
        format: OperandFormat,
        opts: &QuantizeOptions,
        plan: Plan,
    ) -> Result<DeviceMatrix<'static>> {
        let s = self.check_operands(a, b)?;
        epi.check(self.dev.id, &s)?;
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
        let mut codes = Mem::ViewMut(t.data.slice_mut(..));
        let q = QuantOut {
            spec,
            scales: MemMut::View(t.scales.slice_mut(..)),
            sfa: t.sfa.as_mut(),
        };
        self.launch_quantized(work, s, (a, b, epi, plan), &mut codes, q)?;
        drop(codes);
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
    pub(crate) fn quantized_into_on(
        &self,
        work: &Workspace,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        epi: &Epilogue<'_>,
        dst: &mut DeviceMatrix,
        plan: Plan,
    ) -> Result<()> {
        let s = self.check_operands(a, b)?;
        epi.check(self.dev.id, &s)?;
        self.dev.id.check(dst.gpu, "the destination")?;
        writable(dst)?;
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
            scales: dst.scales.reborrow_mut()?,
            sfa,
        };
        self.launch_quantized(work, s, (a, b, epi, plan), &mut dst.data, q)?;
        // (The tensor scale is the destination's own: a rewrite keeps it.)
        let finite = dst.desc.tensor_scale.is_finite();
        self.after_rewrite(dst, written, finite)
    }

    /// One launch of `plan` whose fused epilogue quantizes into `data` and `q`'s scales (checked
    /// by the caller): `data` is the launch's output, reborrowed.
    fn launch_quantized(
        &self,
        work: &Workspace,
        s: GemmShape,
        (a, b, epi, plan): (&DeviceMatrix, &DeviceMatrix, &Epilogue<'_>, Plan),
        data: &mut Mem<'_>,
        q: QuantOut<'_>,
    ) -> Result<()> {
        let n_out = epi.out_cols(s.n);
        let codes = data.reborrow_mut()?.into();
        let mut shell = fused::codes_shell(self.dev.id, codes, (s.m, n_out, s.l));
        let g = Gemm {
            stream: &self.stream,
            work,
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
        plan.launch(&self.dev.families, g)
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
        plan::choose_fused(
            self.dev.arch,
            self.dev.sm_count,
            &s,
            (&a.desc, &b.desc),
            needs,
        )
    }

    /// The plan a dense GEMM of `a` and `b` runs by default.
    pub(crate) fn dense_plan(&self, a: &DeviceMatrix, b: &DeviceMatrix) -> Result<Plan> {
        let shape = self.check_operands(a, b)?;
        plan::choose_for(self.dev.arch, self.dev.sm_count, &shape, &a.desc, &b.desc)
    }

    /// The plan a block-sparse GEMM runs by default (its shape is the kernel's: M the dense
    /// operand's rows, N the sparse operand's).
    pub(crate) fn sparse_plan(&self, dense: &DeviceMatrix, sparse: &DeviceBsr) -> Result<Plan> {
        let s = self.check_bsr(dense, sparse)?;
        plan::choose_bsr(
            self.dev.arch,
            self.dev.sm_count,
            &s,
            (sparse.elem, sparse.block, sparse.nnz()),
        )
    }

    /// The plan a grouped GEMM runs by default.
    pub(crate) fn grouped_plan_of(
        &self,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        groups: &DeviceGroups,
    ) -> Result<Plan> {
        let shape = self.check_grouped(a, b, groups)?;
        plan::choose_grouped(&plan::GroupedProblem {
            arch: self.dev.arch,
            sm_count: self.dev.sm_count,
            shape,
            a: &a.desc,
            b: &b.desc,
            groups: groups.count(),
        })
    }

    /// Checks A, B and C, validates `plan` for their shape and launches it.
    pub(crate) fn dense_on(
        &self,
        work: &Workspace,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        c: &mut DeviceOutput,
        plan: Plan,
    ) -> Result<()> {
        let shape = self.check(a, b, c)?;
        plan.validate(&shape)?;
        let g = Gemm {
            stream: &self.stream,
            work,
            shape,
            a,
            b,
            c,
            groups: None,
            epi: None,
        };
        plan.launch(&self.dev.families, g)
    }

    /// Copies a validated block-sparse matrix to the GPU, with what the kernel families prepare
    /// of it (the sm90 kernel's tensor maps of its stored blocks).
    pub fn upload_bsr(&self, m: &BsrMatrix) -> Result<DeviceBsr> {
        // A tensor map needs a nonempty tensor: a matrix with no stored blocks gets one zero
        // block (never read: no segment has a position).
        let block_bytes = m.block() * m.block() * m.elem().bits() as usize / 8;
        let (values, col) = if m.nnz() == 0 {
            (
                crate::alloc::zeros::<u8>(&self.stream, block_bytes)?,
                crate::alloc::zeros::<i32>(&self.stream, 1)?,
            )
        } else {
            (
                crate::alloc::copy_of(&self.stream, m.values())?,
                crate::alloc::copy_of(&self.stream, m.col_indices())?,
            )
        };
        // (16-bit blocks have no scales: one unused zero keeps the buffer nonempty.)
        let scales = if m.scales().is_empty() {
            crate::alloc::zeros::<f32>(&self.stream, 1)?
        } else {
            crate::alloc::copy_of(&self.stream, m.scales())?
        };
        let mut prepared = Prepared::default();
        for family in self.dev.families.iter() {
            if let Some(p) = family.prepare_sparse(&self.stream, m, &values)? {
                prepared.insert(p);
            }
        }
        Ok(DeviceBsr {
            gpu: self.dev.id,
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

    /// [`Gpu::bsr_gemm`] with a given plan (`Plan::Sm90Fp8` with a block-sparse tile; the
    /// runner's forced configurations).
    pub(crate) fn sparse_on(
        &self,
        work: &Workspace,
        dense: &DeviceMatrix,
        sparse: &DeviceBsr,
        side: SparseSide,
        c: &mut DeviceOutput,
        plan: Plan,
    ) -> Result<()> {
        let s = self.check_bsr(dense, sparse)?;
        self.dev.id.check(c.gpu, "the output")?;
        let (m, n) = bsr::output_dims(side, s.m, s.n);
        if (c.m, c.n, c.l) != (m, n, 1) {
            return Err(shape(format!(
                "output is {}×{}×{} but the block-sparse product is 1×{m}×{n}",
                c.l, c.m, c.n
            )));
        }
        match self.sparse_family(plan, sparse, &s)? {
            SparseFamily::Fp8(f, cfg) => {
                f.bsr_gemm((&self.stream, work), dense, sparse, side, c, cfg)
            }
            SparseFamily::Half(f, cfg) => {
                f.bsr_gemm((&self.stream, work), dense, sparse, side, c, cfg)
            }
        }
    }

    /// The workspace a block-sparse call on `plan` takes ([`Gpu::workspace_size`]).
    pub(crate) fn sparse_workspace(
        &self,
        dense: &DeviceMatrix,
        sparse: &DeviceBsr,
        plan: Plan,
    ) -> Result<WorkspaceSize> {
        let s = self.check_bsr(dense, sparse)?;
        match self.sparse_family(plan, sparse, &s)? {
            SparseFamily::Fp8(f, cfg) => f.bsr_workspace(&self.stream, dense, sparse, cfg),
            SparseFamily::Half(f, cfg) => f.bsr_workspace(&self.stream, dense, sparse, cfg),
        }
    }

    /// The block-sparse family `plan` runs on for `sparse`'s blocks, its configuration validated
    /// for `s`.
    fn sparse_family(
        &self,
        plan: Plan,
        sparse: &DeviceBsr,
        s: &GemmShape,
    ) -> Result<SparseFamily<'_>> {
        let hopper =
            || Error::Architecture("block-sparse GEMM has Hopper (sm_90a) kernels only".into());
        match (plan, sparse.elem) {
            (Plan::Sm90Fp8(cfg), ElemType::E4M3) => {
                cfg.validate_sparse(s)?;
                let family = self.dev.families.get::<Sm90Fp8>().ok_or_else(hopper)?;
                Ok(SparseFamily::Fp8(family, cfg))
            }
            (Plan::Sm90Half(cfg), ElemType::BF16 | ElemType::F16) => {
                cfg.validate_sparse(s, sparse.block)?;
                let family = self.dev.families.get::<Sm90Half>().ok_or_else(hopper)?;
                Ok(SparseFamily::Half(family, cfg))
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
        self.dev.id.check(dense.gpu, "the dense operand")?;
        self.dev.id.check(sparse.gpu, "the sparse operand")?;
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
    pub fn group_ends(&self, ends: &[i32]) -> Result<DeviceGroups<'static>> {
        self.groups(GroupLayout::Contiguous, ends)
    }

    /// A masked grouped GEMM's groups from host values: group g has `counts[g]` rows (≥ 0).
    pub fn group_counts(&self, counts: &[i32]) -> Result<DeviceGroups<'static>> {
        self.groups(GroupLayout::Masked, counts)
    }

    fn groups(&self, layout: GroupLayout, values: &[i32]) -> Result<DeviceGroups<'static>> {
        grouped::check_values(layout, values)?;
        Ok(DeviceGroups {
            gpu: self.dev.id,
            layout,
            values: GroupValues::Owned(crate::alloc::copy_of(&self.stream, values)?),
            host_top: values.iter().max().map(|&v| v as usize),
        })
    }

    /// Groups whose values the caller's kernels write on the device: `g` zeroed int32 values
    /// (every group empty until written). The GEMM kernels clamp what they find (module doc of
    /// `grouped`).
    pub fn device_groups(&self, layout: GroupLayout, g: usize) -> Result<DeviceGroups<'static>> {
        if g == 0 {
            return Err(shape("G = 0: a grouped GEMM needs at least one group"));
        }
        Ok(DeviceGroups {
            gpu: self.dev.id,
            layout,
            values: GroupValues::Owned(crate::alloc::zeros::<i32>(&self.stream, g)?),
            host_top: None,
        })
    }

    /// [`Gpu::grouped_gemm`] with a given plan (the runner's forced configurations).
    pub(crate) fn grouped_on(
        &self,
        work: &Workspace,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        groups: &DeviceGroups,
        c: &mut DeviceOutput,
        plan: Plan,
    ) -> Result<()> {
        let s = self.check_grouped(a, b, groups)?;
        self.dev.id.check(c.gpu, "the output")?;
        if (c.m, c.n, c.l) != (s.m, s.n, s.l) {
            return Err(shape(format!(
                "output is {}×{}×{} but the grouped product is {}×{}×{}",
                c.l, c.m, c.n, s.l, s.m, s.n
            )));
        }
        plan.validate_grouped(&s)?;
        let g = Gemm {
            stream: &self.stream,
            work,
            shape: s,
            a,
            b,
            c,
            groups: Some(groups),
            epi: None,
        };
        plan.launch(&self.dev.families, g)
    }

    /// A, B and the groups belong to this GPU and fit together.
    pub(crate) fn check_grouped(
        &self,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        groups: &DeviceGroups,
    ) -> Result<GemmShape> {
        self.dev.id.check(a.gpu, "A")?;
        self.dev.id.check(b.gpu, "B")?;
        self.dev.id.check(groups.gpu, "the groups")?;
        grouped::grouped_shape(&a.desc, &b.desc, groups.desc())
    }

    /// A and B belong to this GPU and can be multiplied.
    pub(crate) fn check_operands(&self, a: &DeviceMatrix, b: &DeviceMatrix) -> Result<GemmShape> {
        self.dev.id.check(a.gpu, "A")?;
        self.dev.id.check(b.gpu, "B")?;
        GemmShape::of(&a.desc, &b.desc)
    }

    /// A, B and C belong to this GPU, and C is the shape of A · Bᵀ.
    fn check(&self, a: &DeviceMatrix, b: &DeviceMatrix, c: &DeviceOutput) -> Result<GemmShape> {
        let s = self.check_operands(a, b)?;
        self.dev.id.check(c.gpu, "the output")?;
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

/// [`Error::Config`] unless `dst`'s codes and scales may be written (a read-only view may not).
fn writable(dst: &DeviceMatrix) -> Result<()> {
    if dst.data.writable() && dst.scales.writable() {
        Ok(())
    } else {
        Err(Error::Config(
            "the destination is a read-only view of the caller's memory (make it with \
             Gpu::matrix_view_mut to write it)"
                .into(),
        ))
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

/// Whether the CUDA driver library can be loaded (cudarc would panic at its first call
/// otherwise, where it loads the library at run time).
fn driver_present() -> bool {
    library_loads(&["libcuda.so.1", "libcuda.so", "nvcuda.dll"])
}

/// Whether one of `names` (a library's file names) can be loaded.
fn library_loads(names: &[&str]) -> bool {
    names.iter().any(|name| {
        // SAFETY: loading a CUDA library runs its initializers, which have no preconditions; the
        // handle is dropped at once.
        unsafe { libloading::Library::new(*name) }.is_ok()
    })
}

/// `Err` naming `what` unless one of `names` can be loaded (cudarc loads a library at its first
/// call and panics where it is missing).
#[cfg(feature = "nccl")]
pub(crate) fn library_present(names: &[&str], what: &str) -> std::result::Result<(), String> {
    match library_loads(names) {
        true => Ok(()),
        false => Err(format!(
            "the {what} library ({}, …) is not on the library path",
            names
                .iter()
                .take(2)
                .copied()
                .collect::<Vec<_>>()
                .join(" or ")
        )),
    }
}
