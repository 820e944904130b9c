//! The one launch path of every kernel: grid, block, dynamic shared memory, the cluster
//! attribute, and the guards that order the buffers a launch uses
//! on its stream, in the builder style of cudarc's `launch_builder` (which has no launch
//! attributes, hence `cuLaunchKernelEx` here).

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop, sys,
};

use crate::error::{Result, config};
use crate::tensor_map::HostMap;
use blockscaled_kernels::params::{
    EpilogueParams, FusedParams, GemmParams, MAP_BYTES, MAP_IN_PARAMS, MAP_SLOTS, Mapped,
};
use blockscaled_kernels::sm90::Sm90Fp8Params;
use blockscaled_kernels::sm90_mx::Sm90MxParams;

/// Loads kernel `name` from `module` with its dynamic shared-memory limit raised to `smem_bytes`
/// (above the default 48 KiB: every pipelined kernel needs it before its first launch).
pub(crate) fn load_kernel(
    module: &std::sync::Arc<cudarc::driver::CudaModule>,
    name: &str,
    smem_bytes: u32,
) -> Result<CudaFunction> {
    let func = module.load_function(name)?;
    set_smem_limit(&func, smem_bytes)?;
    Ok(func)
}

/// Raises `func`'s dynamic shared-memory limit to `bytes`.
pub(crate) fn set_smem_limit(func: &CudaFunction, bytes: u32) -> Result<()> {
    func.set_attribute(
        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        bytes as i32,
    )?;
    Ok(())
}

/// A kernel's single by-value parameter struct.
///
/// # Safety
/// `Self` is `#[repr(C)]`, `Copy`, holds only integers, floats and device addresses, and is the
/// struct the kernel declares as its only parameter (one source: `blockscaled_kernels::params`)
/// — wrapped in [`Mapped`] exactly when [`KernelParams::MAPPED`] (the GEMM entry points of
/// `kernel_table!`'s `plain`, `fused` and `bare` rows).
pub(crate) unsafe trait KernelParams: Copy {
    /// Whether the kernel takes `Mapped<Self>`: the launch's tensor maps, then `Self`.
    const MAPPED: bool = false;
}
// SAFETY: all are `#[repr(C)]` structs of `blockscaled_kernels::params`, the kernels' own
// parameter types, made of integers, floats and device addresses; the GEMM families' are taken
// `Mapped` by their entry points.
unsafe impl KernelParams for GemmParams {}
unsafe impl KernelParams for Sm90Fp8Params {
    const MAPPED: bool = true;
}
// SAFETY: as above (`#[repr(C)]`, seven u64 then ten 4-byte fields: no padding).
unsafe impl KernelParams for Sm90MxParams {
    const MAPPED: bool = true;
}
// SAFETY: as above.
unsafe impl KernelParams for blockscaled_kernels::sm90_w4::Sm90W4Params {
    const MAPPED: bool = true;
}
// SAFETY: as above (`#[repr(C)]`, four u64 then six u32: no padding).
unsafe impl KernelParams for blockscaled_kernels::fold::FoldParams {}
// SAFETY: as above (`#[repr(C)]`, six u64 then ten 4-byte fields: no padding).
unsafe impl KernelParams for blockscaled_kernels::sm90_w4::stream::W4StreamParams {}
// SAFETY: as above (`#[repr(C)]`, six u64, eight 4-byte fields, then two u64 and six u32: no
// padding).
unsafe impl KernelParams for blockscaled_kernels::sm90_half::Sm90HalfParams {
    const MAPPED: bool = true;
}
// SAFETY: as above (`#[repr(C)]`, eleven u64 then eight 4-byte fields: no padding).
unsafe impl KernelParams for blockscaled_kernels::quantize::QuantizeParams {}
// SAFETY: as above (`#[repr(C)]`: five u64 then twelve 4-byte fields; five u64 then six u32; two
// u64 then four u32: no padding).
unsafe impl KernelParams for blockscaled_kernels::prepare::Gather {}
unsafe impl KernelParams for blockscaled_kernels::prepare::RowTops {}
unsafe impl KernelParams for blockscaled_kernels::prepare::W4Reorder {}
// SAFETY: as above: `#[repr(C)]`, a family's parameters (8-byte aligned, so a multiple of 8
// bytes) then the epilogue's (ten u64 then twelve 4-byte fields: no padding), what the
// families' fused kernels declare.
unsafe impl<P: KernelParams> KernelParams for FusedParams<P> {
    const MAPPED: bool = P::MAPPED;
}

/// One launch of `func` on `stream`: its configuration and the buffers it uses. Each buffer's
/// device address is taken through [`Launch::ptr`] / [`Launch::ptr_mut`], whose guards live until
/// the launch is enqueued, so the stream orders the launch after earlier writes (and later work
/// after it) as cudarc's own launches do.
pub(crate) struct Launch<'a> {
    stream: &'a CudaStream,
    func: &'a CudaFunction,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    shared_mem: u32,
    /// CTAs per cluster along x (the attribute is set when `Some`, 1 included).
    cluster: Option<u32>,
    guards: Vec<SyncOnDrop<'a>>,
    /// The tensor maps the kernel reads, carried in its parameter ([`Launch::map`]).
    maps: [HostMap; MAP_SLOTS],
    mapped: usize,
}

impl<'a> Launch<'a> {
    pub(crate) fn new(stream: &'a CudaStream, func: &'a CudaFunction) -> Self {
        Launch {
            stream,
            func,
            grid: (1, 1, 1),
            block: (1, 1, 1),
            shared_mem: 0,
            cluster: None,
            guards: Vec::new(),
            maps: [HostMap([0; MAP_BYTES / 8]); MAP_SLOTS],
            mapped: 0,
        }
    }

    /// A persistent GEMM kernel's launch: `ctas` blocks of `threads` with `smem` bytes of dynamic
    /// shared memory, in clusters of `cluster` along x (the attribute is set for 1 too).
    pub(crate) fn persistent(
        stream: &'a CudaStream,
        func: &'a CudaFunction,
        ctas: u32,
        threads: u32,
        smem: u32,
        cluster: u32,
    ) -> Self {
        Launch::new(stream, func)
            .grid(ctas, 1, 1)
            .block(threads, 1, 1)
            .shared_mem(smem)
            .cluster(cluster)
    }

    pub(crate) fn grid(mut self, x: u32, y: u32, z: u32) -> Self {
        self.grid = (x, y, z);
        self
    }

    pub(crate) fn block(mut self, x: u32, y: u32, z: u32) -> Self {
        self.block = (x, y, z);
        self
    }

    /// Dynamic shared memory per block, in bytes.
    pub(crate) fn shared_mem(mut self, bytes: u32) -> Self {
        self.shared_mem = bytes;
        self
    }

    /// Clusters of `ctas` blocks along x (the grid must be a whole number of them).
    pub(crate) fn cluster(mut self, ctas: u32) -> Self {
        self.cluster = Some(ctas);
        self
    }

    /// The device address of a buffer the kernel reads.
    pub(crate) fn ptr<T>(&mut self, buf: &'a (impl DevicePtr<T> + ?Sized)) -> u64 {
        let (p, g) = buf.device_ptr(self.stream);
        self.guards.push(g);
        p
    }

    /// The value of a map field of the parameters for `map`, which the launch carries in the
    /// kernel's parameter (`MAP_IN_PARAMS` | its offset there; the kernel's TMA instructions
    /// read it in place): nothing is allocated or copied. [`Error::Config`] past the
    /// [`MAP_SLOTS`] a launch carries.
    pub(crate) fn map(&mut self, map: HostMap) -> Result<u64> {
        let slot = self.mapped;
        if slot == MAP_SLOTS {
            return Err(config(format!(
                "a launch carries at most {MAP_SLOTS} tensor maps"
            )));
        }
        self.maps[slot] = map;
        self.mapped += 1;
        Ok(MAP_IN_PARAMS | (slot * MAP_BYTES) as u64)
    }

    /// [`Launch::map`], or 0 (the kernels' "absent") for `None`.
    pub(crate) fn opt_map(&mut self, map: Option<HostMap>) -> Result<u64> {
        map.map_or(Ok(0), |m| self.map(m))
    }

    /// The device address of a buffer the kernel writes.
    pub(crate) fn ptr_mut<T>(&mut self, buf: &'a mut (impl DevicePtrMut<T> + ?Sized)) -> u64 {
        let (p, g) = buf.device_ptr_mut(self.stream);
        self.guards.push(g);
        p
    }

    /// The device address of memory borrowed for this launch's write, with its guard (made for
    /// this launch's stream) held until the launch is enqueued.
    pub(crate) fn ptr_guarded(&mut self, (p, g): (u64, SyncOnDrop<'a>)) -> u64 {
        self.guards.push(g);
        p
    }

    /// The stream the launch is enqueued on.
    pub(crate) fn stream(&self) -> &'a CudaStream {
        self.stream
    }

    /// [`Launch::ptr`], or 0 (the kernels' "absent") for `None`.
    pub(crate) fn opt_ptr<T>(&mut self, buf: Option<&'a CudaSlice<T>>) -> u64 {
        buf.map_or(0, |b| self.ptr(b))
    }

    /// The driver's description of this launch; `attrs` holds its attributes for as long as the
    /// result is used.
    fn config(&self, attrs: &mut Vec<sys::CUlaunchAttribute>) -> sys::CUlaunchConfig {
        attrs.clear();
        if let Some(x) = self.cluster {
            let mut a = attribute(sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION);
            a.value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 { x, y: 1, z: 1 };
            attrs.push(a);
        }
        sys::CUlaunchConfig {
            gridDimX: self.grid.0,
            gridDimY: self.grid.1,
            gridDimZ: self.grid.2,
            blockDimX: self.block.0,
            blockDimY: self.block.1,
            blockDimZ: self.block.2,
            sharedMemBytes: self.shared_mem,
            hStream: self.stream.cu_stream(),
            attrs: if attrs.is_empty() {
                std::ptr::null_mut()
            } else {
                attrs.as_mut_ptr()
            },
            numAttrs: attrs.len() as u32,
        }
    }

    /// How many clusters of this launch's configuration can be resident at once.
    pub(crate) fn max_active_clusters(&self) -> Result<u32> {
        let mut attrs = Vec::with_capacity(1);
        let cfg = self.config(&mut attrs);
        let mut clusters = 0i32;
        self.stream.context().bind_to_thread()?;
        // SAFETY: a live function handle, and a config whose attribute array (`attrs`) outlives
        // the call.
        unsafe { sys::cuOccupancyMaxActiveClusters(&mut clusters, self.func.cu_function(), &cfg) }
            .result()?;
        Ok(clusters.max(0) as u32)
    }

    /// [`Launch::launch`] of a family's plain kernel with its parameters `p`, or, with a fused
    /// epilogue `epi`, of the family's fused kernel with [`FusedParams`].
    ///
    /// # Safety
    /// As [`Launch::launch`] for `p` and, when set, `epi` (its addresses from this launch too),
    /// and `func` the fused kernel exactly when `epi` is set.
    pub(crate) unsafe fn launch_fused<P: KernelParams>(
        self,
        p: P,
        epi: Option<EpilogueParams>,
    ) -> Result<Enqueued<'a>> {
        // SAFETY: the caller's contract.
        unsafe {
            match epi {
                Some(epi) => self.launch(&FusedParams { p, epi }),
                None => self.launch(&p),
            }
        }
    }

    /// Enqueues the kernel with `params` as its single parameter. The buffers' guards come back:
    /// dropping them records the buffers' use on the stream (cudarc's events).
    ///
    /// # Safety
    /// `P` is the parameter struct `func` declares; every address in `params` comes from this
    /// launch's [`Launch::ptr`] / [`Launch::ptr_mut`] (or is 0 where the kernel reads it as
    /// absent) or points into such a buffer, every map field from [`Launch::map`] over such a
    /// buffer, and the kernel reads and writes inside those buffers for this grid and these
    /// parameters.
    pub(crate) unsafe fn launch<P: KernelParams>(self, params: &P) -> Result<Enqueued<'a>> {
        let mut attrs = Vec::with_capacity(1);
        let cfg = self.config(&mut attrs);
        let mapped = Mapped {
            maps: self.maps.map(|m| m.0),
            p: *params,
        };
        if !P::MAPPED && self.mapped > 0 {
            return Err(config("a kernel that takes no tensor maps was given some"));
        }
        let arg = match P::MAPPED {
            true => &mapped as *const Mapped<P> as *mut std::ffi::c_void,
            false => params as *const P as *mut std::ffi::c_void,
        };
        let mut args = [arg];
        self.stream.context().bind_to_thread()?;
        // SAFETY: `args` points at one live `P`, or `Mapped<P>` where the kernel takes that (the
        // caller's contract, and `KernelParams`'s), its single parameter; `cfg`'s attributes live in `attrs` until the call
        // returns; the buffers stay alive and ordered on this stream by `self.guards`, dropped
        // only after the launch is enqueued.
        unsafe {
            sys::cuLaunchKernelEx(
                &cfg,
                self.func.cu_function(),
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()?;
        Ok(Enqueued(self.guards))
    }
}

/// The guards of an enqueued launch's buffers (see [`Launch::launch`]).
pub(crate) struct Enqueued<'a>(#[allow(dead_code)] Vec<SyncOnDrop<'a>>);

/// A launch attribute with its value zeroed (the caller sets the field `id` uses).
fn attribute(id: sys::CUlaunchAttributeID) -> sys::CUlaunchAttribute {
    sys::CUlaunchAttribute {
        id,
        pad: [0; 4],
        value: sys::CUlaunchAttributeValue { pad: [0; 64] },
    }
}
