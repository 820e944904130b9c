//! The GPU side of the API: a [`Gpu`] (context, stream, kernels), matrices on it, and `gemm`.
//!
//! Every value that reaches a kernel was validated when its host-side matrix was built, and the
//! device copies keep that description next to their buffers, so a launch only has to check that
//! the operands fit each other and the output.

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    DeviceRepr, LaunchConfig, PushKernelArg, sys,
};

use crate::config::{self, Plan};
use crate::error::{Error, Result, shape};
use crate::format::{ElemType, OutType};
use crate::matrix::{MatrixDesc, ScaledMatrix};
use crate::output::HostOutput;
use crate::reference::check_operands;
use crate::sm90::{self, Sm90Operand};
use blockscaled_kernels::params::sm90::Fp8Types;
use blockscaled_kernels::params::{GemmParams, REFERENCE_BLOCK_M, REFERENCE_BLOCK_N};
use blockscaled_kernels::registry;

use crate::image::{self, KernelImage};

/// Kernel parameters passed by value. The newtype carries cudarc's marker for a foreign struct.
#[repr(transparent)]
struct KernelParam<T>(T);
// SAFETY: `GemmParams` is `#[repr(C)]`, `Copy`, holds only integers, floats and device addresses,
// and the kernel declares the identical struct (one source: `blockscaled_kernels::params`).
unsafe impl DeviceRepr for KernelParam<GemmParams> {}

/// Which kernels a GPU gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuArch {
    /// Compute capability 9.0 (H100, H200): the sm_90a module. Verified on an H100.
    Hopper,
    /// Compute capability 10.x: the sm_100a module. Assembled only; never run here.
    Blackwell,
}

/// One GPU: a context, a stream and the loaded kernels.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    _module: Arc<CudaModule>,
    reference: CudaFunction,
    /// The split-K reduction, and its f32 workspace (grown on demand, reused in stream order).
    splitk: CudaFunction,
    splitk_ws: std::sync::Mutex<Option<CudaSlice<f32>>>,
    /// The Hopper FP8 kernels (sm_90a module only).
    sm90_fp8: Option<sm90::Sm90Kernels>,
    arch: GpuArch,
    /// The kernels' image: ptxas' cubin, or the PTX (JIT) where the cubin does not fit.
    image: KernelImage,
    name: String,
    sm_count: u32,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Gpu({}, {:?}, {} SMs, {} image",
            self.name, self.arch, self.sm_count, self.image
        )?;
        if let Some(k) = &self.sm90_fp8 {
            let r = k.resident();
            write!(
                f,
                "; sm90 kernel: {} CTAs resident alone, {} in clusters of 2",
                r[0], r[1]
            )?;
        }
        write!(f, ")")
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
        let reference = module.load_function(registry::REFERENCE_GEMM.name)?;
        let splitk = module.load_function(registry::SPLITK_REDUCE.name)?;
        let stream = ctx.new_stream()?;
        let sm90_fp8 = match arch {
            GpuArch::Hopper => Some(sm90::Sm90Kernels::load(&module, &stream, sm_count)?),
            GpuArch::Blackwell => None,
        };
        Ok(Gpu {
            ctx,
            stream,
            _module: module,
            reference,
            splitk,
            splitk_ws: std::sync::Mutex::new(None),
            sm90_fp8,
            arch,
            image,
            name,
            sm_count,
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

    /// Copies a validated matrix to the GPU.
    pub fn upload(&self, m: &ScaledMatrix) -> Result<DeviceMatrix> {
        let data = self.stream.clone_htod(m.data())?;
        // A scale buffer is never empty (every matrix has at least one block).
        let scales = self.stream.clone_htod(m.scales())?;
        let sm90 = match self.arch {
            GpuArch::Hopper => Sm90Operand::prepare(&self.stream, m, &data)?,
            GpuArch::Blackwell => None,
        };
        Ok(DeviceMatrix {
            desc: *m.desc(),
            data,
            scales,
            sm90,
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
        let sm90_tmap = match self.arch {
            GpuArch::Hopper => sm90::output_tensor_map(&self.stream, &buf, dtype, (m, n, l))?,
            GpuArch::Blackwell => None,
        };
        let mut out = DeviceOutput {
            dtype,
            m,
            n,
            l,
            buf,
            sm90_tmap,
        };
        out.poison()?;
        Ok(out)
    }

    /// C = A · Bᵀ for every batch entry, with the fastest kernel this GPU has for the formats.
    /// Asynchronous on [`Gpu::stream`]; [`DeviceOutput::to_host`] waits for it.
    ///
    /// The kernel and its configuration come from [`config::choose`]; [`Gpu::plan`] tells which.
    pub fn gemm(&self, a: &DeviceMatrix, b: &DeviceMatrix, c: &mut DeviceOutput) -> Result<()> {
        let plan = self.plan(a, b)?;
        self.gemm_with(a, b, c, plan)
    }

    /// The plan [`Gpu::gemm`] would run for these operands.
    pub fn plan(&self, a: &DeviceMatrix, b: &DeviceMatrix) -> Result<Plan> {
        check_operands(&a.desc, &b.desc)?;
        config::choose(self.arch, self.sm_count, &a.desc, &b.desc)
    }

    /// C = A · Bᵀ with a given plan (the runner's forced configurations). A plan the operands or
    /// this GPU cannot run is an error.
    pub fn gemm_with(
        &self,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        c: &mut DeviceOutput,
        plan: Plan,
    ) -> Result<()> {
        let dims = self.check_output(a, b, c)?;
        match plan {
            Plan::Reference => self.reference_gemm(a, b, c),
            Plan::Sm90Fp8(cfg) => {
                let kernels = self.sm90_fp8.as_ref().ok_or_else(|| {
                    Error::Architecture(format!(
                        "{}: the sm90 FP8 kernel needs compute capability 9.0",
                        self.name
                    ))
                })?;
                if let Some(e) =
                    sm90::unsupported(&a.desc, false).or_else(|| sm90::unsupported(&b.desc, true))
                {
                    return Err(Error::Format(e));
                }
                // Eligible matrices were prepared at upload (on this Hopper GPU).
                let (Some(ao), Some(bo)) = (a.sm90.as_ref(), b.sm90.as_ref()) else {
                    return Err(Error::Format(
                        "operands were not prepared for the sm90 kernel".into(),
                    ));
                };
                let mut ws_guard = None;
                if cfg.split_k > 1 {
                    let (m, n, _, l) = dims;
                    let need = (cfg.split_k as usize)
                        .checked_mul(l * m * n)
                        .ok_or_else(|| shape("split-K workspace size overflows"))?;
                    let mut ws = self.splitk_ws.lock().unwrap_or_else(|e| e.into_inner());
                    if ws.as_ref().is_none_or(|w| w.len() < need) {
                        // Replaced in stream order: earlier launches that use the old one are
                        // ordered before its free.
                        *ws = Some(self.stream.alloc_zeros::<f32>(need)?);
                    }
                    ws_guard = Some(ws);
                }
                let splitk = ws_guard
                    .as_mut()
                    .and_then(|g| g.as_mut())
                    .map(|w| (w, &self.splitk));
                sm90::launch(
                    &self.stream,
                    kernels,
                    ao,
                    bo,
                    dims,
                    &mut c.buf,
                    c.sm90_tmap.as_ref(),
                    c.dtype as u32,
                    Fp8Types::new(
                        a.desc.format.elem == ElemType::E5M2,
                        b.desc.format.elem == ElemType::E5M2,
                    ),
                    cfg,
                    splitk,
                )
            }
        }
    }

    fn check_output(
        &self,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        c: &DeviceOutput,
    ) -> Result<(usize, usize, usize, usize)> {
        let (m, n, k, l) = check_operands(&a.desc, &b.desc)?;
        if (c.m, c.n, c.l) != (m, n, l) {
            return Err(shape(format!(
                "output is {}×{}×{} but A·Bᵀ is {l}×{m}×{n}",
                c.l, c.m, c.n
            )));
        }
        Ok((m, n, k, l))
    }

    /// C = A · Bᵀ with the SIMT reference kernel (float64 accumulation; for checking).
    pub fn reference_gemm(
        &self,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        c: &mut DeviceOutput,
    ) -> Result<()> {
        let (m, n, k, l) = self.check_output(a, b, c)?;
        let stream = &self.stream;
        let (a_data, _g1) = a.data.device_ptr(stream);
        let (a_scales, _g2) = a.scales.device_ptr(stream);
        let (b_data, _g3) = b.data.device_ptr(stream);
        let (b_scales, _g4) = b.scales.device_ptr(stream);
        let (out, _g5) = c.buf.device_ptr_mut(stream);
        let params = KernelParam(GemmParams {
            a: a.desc.params(a_data, a_scales),
            b: b.desc.params(b_data, b_scales),
            out,
            out_row_stride: n as u64,
            out_batch_stride: (m * n) as u64,
            m: m as u32,
            n: n as u32,
            k: k as u32,
            l: l as u32,
            out_type: c.dtype as u32,
            _pad: 0,
        });
        let cfg = LaunchConfig {
            grid_dim: (
                (n as u32).div_ceil(REFERENCE_BLOCK_N),
                (m as u32).div_ceil(REFERENCE_BLOCK_M),
                l as u32,
            ),
            block_dim: (REFERENCE_BLOCK_N, REFERENCE_BLOCK_M, 1),
            shared_mem_bytes: 0,
        };
        if cfg.grid_dim.1 > 65535 {
            return Err(shape(format!(
                "M = {m} needs more than 65535 blocks of {REFERENCE_BLOCK_M} rows"
            )));
        }
        let mut launch = stream.launch_builder(&self.reference);
        launch.arg(&params);
        // SAFETY: the kernel reads exactly the buffers described by the validated descriptors
        // (sizes checked at upload), writes l·m·n elements of `c.dtype` into `c.buf` (sized by
        // `output`), and the buffers outlive the launch because the guards above record their use
        // on this stream before being dropped.
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }
}

/// A block-scaled matrix on the GPU.
pub struct DeviceMatrix {
    desc: MatrixDesc,
    data: CudaSlice<u8>,
    scales: CudaSlice<u8>,
    /// Tensor map and kernel-layout scales for the Hopper FP8 kernel, when the format fits it.
    sm90: Option<Sm90Operand>,
}

impl DeviceMatrix {
    pub fn desc(&self) -> &MatrixDesc {
        &self.desc
    }
}

/// A GEMM output on the GPU (`[l][m][n]` row-major).
pub struct DeviceOutput {
    pub(crate) dtype: OutType,
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) l: usize,
    pub(crate) buf: CudaSlice<u8>,
    /// The sm90 kernel's TMA-store descriptor of `buf` (Hopper, 16-bit output, N % 8 == 0).
    pub(crate) sm90_tmap: Option<CudaSlice<u8>>,
}

impl DeviceOutput {
    pub fn dtype(&self) -> OutType {
        self.dtype
    }
    pub fn dims(&self) -> (usize, usize, usize) {
        (self.m, self.n, self.l)
    }

    /// Fills every byte with 0xFF: a NaN in bf16, f16 and f32.
    pub fn poison(&mut self) -> Result<()> {
        let len = self.buf.len();
        let stream = self.buf.stream().clone();
        // A raw driver call: make the context current on this thread as cudarc's own calls do.
        stream.context().bind_to_thread()?;
        let (ptr, _g) = self.buf.device_ptr_mut(&stream);
        // SAFETY: `ptr` covers `len` bytes of this live allocation; u8 accepts any pattern.
        unsafe { cudarc::driver::result::memset_d8_async(ptr, 0xFF, len, stream.cu_stream()) }?;
        Ok(())
    }

    /// Waits for the stream and copies the result back.
    pub fn to_host(&self) -> Result<HostOutput> {
        let stream = self.buf.stream();
        let bytes = stream.clone_dtoh(&self.buf)?;
        stream.synchronize()?;
        Ok(HostOutput::from_bytes(
            self.dtype, self.m, self.n, self.l, &bytes,
        ))
    }
}
