//! The GPU side of the API: a [`Gpu`] (context, stream, kernel families), matrices on it, and
//! `gemm`.
//!
//! Every value that reaches a kernel was validated when its host-side matrix was built, and the
//! device copies keep that description next to their buffers, so a GEMM checks once that the
//! operands and the output belong to this GPU and fit each other, and validates its plan once.
//!
//! `quantize.rs` holds the device quantizers' calls and the preparation of written matrices;
//! `launches.rs` the per-kind launches (dense, fused, quantized output, block-sparse, grouped)
//! and the checks they share.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaModule, CudaStream, sys};

use crate::buffers::{DeviceMatrix, DeviceOutput, GpuId, Mem, Prepared};
use crate::error::{Error, Result, shape};
use crate::families::Families;
use crate::format::OutType;
use crate::matrix::ScaledMatrix;
use crate::plan::GpuArch;
use crate::prepare::{Preparers, Source};
use crate::quantizer::TensorElement;
use crate::quantizer::{DeviceTensor, Quantizers};
use blockscaled_kernels::quantize::InputType;

use crate::image::{self, KernelImage};
use crate::workspace::Workspace;

mod launches;
pub(crate) use launches::{DenseCall, EpilogueCall};
mod quantize;

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
    moe: crate::moe::kernels::MoeKernels,
    arch: GpuArch,
    /// The kernels' image: ptxas' cubin, or the PTX (JIT) where the cubin does not fit.
    image: KernelImage,
    name: String,
    /// Its SMs and DRAM rate: what the configuration rules read of it.
    hw: crate::plan::Hardware,
    /// fp32 ones, the scales of every bf16 / fp16 view ([`Gpu::half_view`]): made once, grown to
    /// the most batch entries a view has had, shared (read only) by the views.
    ones: std::sync::Mutex<Option<Arc<cudarc::driver::CudaSlice<u8>>>>,
    /// The tuner's plans for this GPU and driver ([`crate::plan::cache`]), read once; `None`
    /// where there is no cache or it holds none.
    tuned: Option<crate::plan::cache::TunedPlans>,
}

impl Device {
    /// At least `count` fp32 ones (in stream order on `stream` when made).
    pub(crate) fn ones(
        &self,
        stream: &Arc<CudaStream>,
        count: usize,
    ) -> Result<Arc<cudarc::driver::CudaSlice<u8>>> {
        let mut ones = crate::alloc::lock(&self.ones);
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
            "Gpu({}, {:?}, {} SMs, DRAM {:.2} TB/s, {} image{:?})",
            d.name,
            d.arch,
            d.hw.sm_count,
            d.hw.dram_bytes_per_us / 1e6,
            d.image,
            d.families
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
        let attribute = |a| ctx.attribute(a).map(|v| v.max(0) as u32);
        let hw = crate::plan::Hardware::new(
            sm_count,
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)?,
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)?,
        );
        let (module, image) = image::load(&ctx, (major, minor), images)?;
        let preparers = Preparers::load(&module, sm_count)?;
        let families =
            crate::families::load(&module, &stream, arch.target(), sm_count, &preparers)?;
        let quantizers = Quantizers::load(&module, sm_count)?;
        let moe = crate::moe::kernels::MoeKernels::load(&module, sm_count)?;
        let tuned = tuned_plans(&name, sm_count);
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
                hw,
                ones: Default::default(),
                tuned,
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
        self.dev.hw.sm_count
    }
    /// What the configuration rules know of this GPU ([`plan::choose`](crate::plan::choose)):
    /// its SMs and its DRAM's peak rate.
    pub fn hardware(&self) -> crate::plan::Hardware {
        self.dev.hw
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

    /// Makes `ws`'s fold copies for `a` and `b` where the fold family would fold them (B's only
    /// where `fold_b`).
    pub(crate) fn reserve_fold(
        &self,
        ws: &Workspace,
        (a, b): (&DeviceMatrix, &DeviceMatrix),
        fold_b: bool,
    ) -> Result<()> {
        crate::families::fold::Sm90MxFp8::reserve(&self.stream, ws, (a, b), fold_b)
    }

    /// [`Device::ones`] on this handle's stream.
    pub(crate) fn ones(&self, count: usize) -> Result<Arc<cudarc::driver::CudaSlice<u8>>> {
        self.dev.ones(&self.stream, count)
    }

    /// The identity buffers made on this GPU record.
    pub(crate) fn moe_kernels(&self) -> &crate::moe::kernels::MoeKernels {
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
        let families = &self.dev.families;
        families.prepare_operand(&self.stream, &Source::Host(m), &data, &mut prepared)?;
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

/// The tuner's cache ([`crate::plan::cache::default_path`]) for this GPU, where it holds plans;
/// what reading it found wrong is printed once (the heuristic plans every call then).
fn tuned_plans(name: &str, sm_count: u32) -> Option<crate::plan::cache::TunedPlans> {
    let cache = crate::plan::cache::PlanCache::open_default()?;
    for w in cache.warnings() {
        eprintln!("blockscaled: plan cache: {w}");
    }
    if cache.is_empty() {
        return None;
    }
    Some(crate::plan::cache::TunedPlans::new(
        machine_of(name, sm_count),
        cache,
    ))
}

/// The tuner's cache key of a GPU: its name, SMs and the driver's CUDA version.
fn machine_of(name: &str, sm_count: u32) -> crate::plan::cache::Machine {
    let mut driver = 0;
    // SAFETY: `cuDriverGetVersion` writes one int through the pointer, a live local.
    unsafe { sys::cuDriverGetVersion(&mut driver) };
    crate::plan::cache::Machine {
        gpu: name.to_string(),
        sm_count,
        driver,
    }
}

impl Gpu {
    /// This GPU as the tuner's cache names it (`plan::cache::key`): what a tuned plan's speed
    /// was measured on.
    pub fn machine(&self) -> crate::plan::cache::Machine {
        machine_of(self.name(), self.sm_count())
    }

    /// The tuned plan of a dense or grouped call of `a` and `b` (`groups`: their count) in the
    /// tuner's cache, where it has one that validates for `shape`.
    pub(crate) fn tuned_plan(
        &self,
        (a, b): (&crate::matrix::MatrixDesc, &crate::matrix::MatrixDesc),
        shape: &crate::matrix::GemmShape,
        groups: Option<usize>,
    ) -> Option<crate::plan::Plan> {
        let tuned = self.dev.tuned.as_ref()?;
        let plan = tuned.get(&crate::plan::cache::CallKey::of((a, b), shape, groups))?;
        let ok = match groups {
            Some(_) => plan.validate_grouped(shape).is_ok(),
            None => plan.validate(shape).is_ok(),
        };
        ok.then_some(plan)
    }
}
