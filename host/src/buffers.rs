//! Matrices and outputs on a GPU. Each records the [`Gpu`](crate::Gpu) that made it, and keeps
//! what the kernel families prepared of it in one slot, so that no family adds fields here.

use std::any::Any;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop,
    sys,
};

use crate::error::{Error, Result};
use crate::format::OutType;
pub(crate) use crate::held::Held;
use crate::matrix::MatrixDesc;
use crate::output::HostOutput;

/// Which [`Gpu`](crate::Gpu) a buffer belongs to: unique in the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GpuId(u64);

impl GpuId {
    /// A new identity, never handed out before in this process.
    pub(crate) fn next() -> GpuId {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        GpuId(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// [`Error::WrongGpu`] unless `what` (made by `owner`) belongs to this GPU.
    pub(crate) fn check(self, owner: GpuId, what: &str) -> Result<()> {
        if owner == self {
            Ok(())
        } else {
            Err(Error::WrongGpu(format!(
                "{what} was made by Gpu #{}, not by this Gpu (#{}): upload it to this one",
                owner.0, self.0
            )))
        }
    }
}

/// What kernel families prepared of one buffer at upload: at most one value per type, each
/// family looking up its own type.
#[derive(Default)]
pub(crate) struct Prepared(Vec<PreparedValue>);

/// Data a family keeps of one buffer.
pub(crate) type PreparedValue = Box<dyn Held>;

impl<T: Held> Held for OnFirstUse<T> {
    fn device_bytes(&self) -> usize {
        self.get().map_or(0, Held::device_bytes)
    }
}

impl Prepared {
    pub(crate) fn insert(&mut self, value: PreparedValue) {
        self.0.push(value);
    }

    pub(crate) fn get<T: Any>(&self) -> Option<&T> {
        self.0
            .iter()
            .find_map(|v| (v.as_ref() as &dyn Any).downcast_ref::<T>())
    }

    pub(crate) fn get_mut<T: Any>(&mut self) -> Option<&mut T> {
        self.0
            .iter_mut()
            .find_map(|v| (v.as_mut() as &mut dyn Any).downcast_mut::<T>())
    }

    /// Bytes of device memory the prepared values keep.
    pub(crate) fn device_bytes(&self) -> usize {
        self.0.iter().map(|v| v.device_bytes()).sum()
    }
}

/// A copy of a matrix that a family makes only when a GEMM first needs it: the weights' role's
/// copies (the MX family's row maxima for the fold, the 4-bit-weights family's reordered codes),
/// which an activation quantized before every GEMM never uses. Made on the GPU's stream at first
/// use (ordered after the writes it reads), kept until the matrix is rewritten in place
/// ([`Self::forget`]).
pub(crate) struct OnFirstUse<T>(OnceLock<T>);

impl<T> Default for OnFirstUse<T> {
    fn default() -> Self {
        OnFirstUse(OnceLock::new())
    }
}

impl<T> OnFirstUse<T> {
    /// The copy, made by `make` on first use. (Two threads' first uses both make it; the first
    /// to finish is kept and the other's dropped, both ordered on the one stream.)
    pub(crate) fn get_or_make(&self, make: impl FnOnce() -> Result<T>) -> Result<&T> {
        if let Some(v) = self.0.get() {
            return Ok(v);
        }
        let v = make()?;
        Ok(self.0.get_or_init(|| v))
    }

    /// A copy made already (given with the operand rather than made from the matrix).
    pub(crate) fn made(v: T) -> Self {
        OnFirstUse(OnceLock::from(v))
    }

    /// The copy, where made.
    pub(crate) fn get(&self) -> Option<&T> {
        self.0.get()
    }

    /// The copy, where made, to rewrite in place.
    pub(crate) fn get_mut(&mut self) -> Option<&mut T> {
        self.0.get_mut()
    }

    /// The matrix was rewritten: the copy is made again at its next use.
    pub(crate) fn forget(&mut self) {
        self.0 = OnceLock::new();
    }
}

/// The device memory a matrix, tensor or output lives in: a buffer this crate allocated, or the
/// caller's (a cudarc view borrowed for `'a`, or a raw address the caller vouches for). Reads and
/// writes go through cudarc's [`DevicePtr`] / [`DevicePtrMut`], so an owned buffer or a view is
/// ordered on the launch's stream after the writes cudarc knows of (its event tracking), as
/// cudarc's own launches are.
pub(crate) enum Mem<'a> {
    Owned(CudaSlice<u8>),
    /// Read-only memory this crate shares between values (a GPU's fp32 ones, the unit scales
    /// of every bf16 / fp16 view): kept alive by each value that reads it.
    Shared(Arc<CudaSlice<u8>>),
    /// The caller's memory, read only: a write is refused before it reaches a kernel
    /// ([`Mem::writable`]).
    View(CudaView<'a, u8>),
    ViewMut(CudaViewMut<'a, u8>),
    /// The caller's memory by address: `len` bytes at `ptr` in the context of `stream`, valid
    /// (and, where `writable`, writable) for as long as the value lives and until the work
    /// enqueued on it has finished: the contract of the `unsafe` constructors that make it.
    /// Ordered only by the stream the work is enqueued on.
    Raw {
        ptr: sys::CUdeviceptr,
        len: usize,
        stream: Arc<CudaStream>,
        writable: bool,
        life: PhantomData<&'a mut [u8]>,
    },
}

impl Mem<'_> {
    /// The address of the caller's read-only memory by address ([`Mem::Raw`], not writable):
    /// memory whose every use is ordered by the stream alone, which a kernel may read in place
    /// of a copy made from it (nothing rewrites it in place through this crate).
    pub(crate) fn read_only_raw(&self) -> Option<sys::CUdeviceptr> {
        match self {
            Mem::Raw {
                ptr,
                writable: false,
                ..
            } => Some(*ptr),
            _ => None,
        }
    }

    /// Whether a kernel may write this memory (every kind but a read-only view).
    pub(crate) fn writable(&self) -> bool {
        match self {
            Mem::Owned(_) | Mem::ViewMut(_) => true,
            Mem::View(_) | Mem::Shared(_) => false,
            Mem::Raw { writable, .. } => *writable,
        }
    }

    /// Whether the memory is this crate's allocation (not the caller's).
    pub(crate) fn is_owned(&self) -> bool {
        matches!(self, Mem::Owned(_))
    }

    /// The device address (for checks and tensor maps that are made once; a launch takes it
    /// through [`DevicePtr`], which orders the launch after earlier writes).
    pub(crate) fn address(&self) -> sys::CUdeviceptr {
        match self {
            Mem::Owned(s) => {
                let (p, _g) = s.device_ptr(s.stream());
                p
            }
            Mem::Shared(s) => {
                let (p, _g) = s.device_ptr(s.stream());
                p
            }
            Mem::View(v) => {
                let (p, _g) = v.device_ptr(v.stream());
                p
            }
            Mem::ViewMut(v) => {
                let (p, _g) = v.device_ptr(v.stream());
                p
            }
            Mem::Raw { ptr, .. } => *ptr,
        }
    }

    /// The memory's copy in host memory (a wait on its stream).
    pub(crate) fn to_vec(&self) -> Result<Vec<u8>> {
        let stream = self.stream().clone();
        let v = match self {
            Mem::Owned(s) => stream.clone_dtoh(s)?,
            Mem::Shared(s) => stream.clone_dtoh(&**s)?,
            Mem::View(v) => stream.clone_dtoh(v)?,
            Mem::ViewMut(v) => stream.clone_dtoh(v)?,
            Mem::Raw { ptr, len, .. } => {
                let mut out = vec![0u8; *len];
                stream.context().bind_to_thread()?;
                // SAFETY: `ptr` holds `len` readable bytes (the constructor's contract); `out`
                // is `len` bytes of host memory; the copy is synchronous on the stream below.
                unsafe {
                    cudarc::driver::result::memcpy_dtoh_async(&mut out, *ptr, stream.cu_stream())
                }?;
                out
            }
        };
        stream.synchronize()?;
        Ok(v)
    }
}

/// Writable memory borrowed for `'a` ([`Mem::reborrow_mut`]): what one launch writes, its
/// address taken with guards that live as long as the borrow.
pub(crate) enum MemMut<'a> {
    View(CudaViewMut<'a, u8>),
    /// As [`Mem::Raw`], writable.
    Raw {
        ptr: sys::CUdeviceptr,
        len: usize,
        stream: Arc<CudaStream>,
    },
}

impl<'a> MemMut<'a> {
    /// The address for `launch`'s kernel, which writes it (its guard held by the launch).
    pub(crate) fn bind(self, launch: &mut crate::launch::Launch<'a>) -> u64 {
        let stream = launch.stream();
        launch.ptr_guarded(self.into_ptr(stream))
    }

    /// The address for a kernel that writes it on `stream`, ordered after earlier reads and
    /// writes cudarc knows of; the guard records the write when dropped after the launch.
    pub(crate) fn into_ptr(self, stream: &'a CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'a>) {
        match self {
            MemMut::View(v) => v.view_ptr_mut(stream),
            MemMut::Raw { ptr, .. } => (ptr, SyncOnDrop::Record(None)),
        }
    }
}

impl<'a> From<MemMut<'a>> for Mem<'a> {
    fn from(m: MemMut<'a>) -> Self {
        match m {
            MemMut::View(v) => Mem::ViewMut(v),
            MemMut::Raw { ptr, len, stream } => Mem::Raw {
                ptr,
                len,
                stream,
                writable: true,
                life: PhantomData,
            },
        }
    }
}

impl DeviceSlice<u8> for Mem<'_> {
    fn len(&self) -> usize {
        match self {
            Mem::Owned(s) => s.len(),
            Mem::Shared(s) => s.len(),
            Mem::View(v) => v.len(),
            Mem::ViewMut(v) => v.len(),
            Mem::Raw { len, .. } => *len,
        }
    }

    fn stream(&self) -> &Arc<CudaStream> {
        match self {
            Mem::Owned(s) => s.stream(),
            Mem::Shared(s) => s.stream(),
            Mem::View(v) => v.stream(),
            Mem::ViewMut(v) => v.stream(),
            Mem::Raw { stream, .. } => stream,
        }
    }
}

impl DevicePtr<u8> for Mem<'_> {
    fn device_ptr<'b>(&'b self, stream: &'b CudaStream) -> (sys::CUdeviceptr, SyncOnDrop<'b>) {
        match self {
            Mem::Owned(s) => s.device_ptr(stream),
            Mem::Shared(s) => s.device_ptr(stream),
            Mem::View(v) => v.device_ptr(stream),
            Mem::ViewMut(v) => v.device_ptr(stream),
            Mem::Raw { ptr, .. } => (*ptr, SyncOnDrop::Record(None)),
        }
    }
}

impl DevicePtrMut<u8> for Mem<'_> {
    fn device_ptr_mut<'b>(
        &'b mut self,
        stream: &'b CudaStream,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'b>) {
        match self {
            Mem::Owned(s) => s.device_ptr_mut(stream),
            Mem::ViewMut(v) => v.device_ptr_mut(stream),
            Mem::Raw { ptr, writable, .. } => {
                // Every writer checks `Mem::writable` first and returns an error.
                assert!(*writable, "a write to read-only memory was not refused");
                (*ptr, SyncOnDrop::Record(None))
            }
            Mem::View(_) | Mem::Shared(_) => {
                panic!("a write to a read-only view was not refused")
            }
        }
    }
}

impl<'a> Mem<'a> {
    /// The same memory borrowed for one write ([`Error::Config`] for a read-only view).
    pub(crate) fn reborrow_mut(&mut self) -> Result<MemMut<'_>> {
        Ok(match self {
            Mem::Owned(s) => MemMut::View(s.slice_mut(..)),
            Mem::ViewMut(v) => MemMut::View(v.slice_mut(..)),
            Mem::Raw {
                ptr,
                len,
                stream,
                writable: true,
                ..
            } => MemMut::Raw {
                ptr: *ptr,
                len: *len,
                stream: stream.clone(),
            },
            Mem::Shared(_) => {
                return Err(Error::Config(
                    "a bf16 / fp16 view's unit scales cannot be written".into(),
                ));
            }
            Mem::View(_) | Mem::Raw { .. } => {
                return Err(Error::Config(
                    "a read-only view of the caller's memory cannot be written".into(),
                ));
            }
        })
    }

    /// The memory as a cudarc view, where it is a cudarc buffer or view (not raw memory).
    pub(crate) fn view(&self) -> Option<CudaView<'_, u8>> {
        match self {
            Mem::Owned(s) => Some(s.slice(..)),
            Mem::Shared(s) => Some(s.slice(..)),
            Mem::View(v) => Some(v.slice(..)),
            Mem::ViewMut(v) => Some(v.slice(..)),
            Mem::Raw { .. } => None,
        }
    }
}

/// The maxima a quantizer's first pass writes (per row, per batch entry, or NVFP4's tensor
/// maximum), kept with the matrix it writes so that rewriting the matrix in place allocates
/// nothing: cleared before each pass (`red.max` raises them from 0).
#[derive(Default)]
pub(crate) struct QuantScratch {
    pub amax: Option<CudaSlice<u32>>,
    pub tensor: Option<CudaSlice<u32>>,
}

impl QuantScratch {
    /// `slot` holding at least `len` zeros (grown as a workspace is, cleared each time); `None`
    /// for none.
    pub(crate) fn zeroed<'s>(
        slot: &'s mut Option<CudaSlice<u32>>,
        stream: &Arc<CudaStream>,
        len: usize,
    ) -> Result<Option<&'s mut CudaSlice<u32>>> {
        if len == 0 {
            return Ok(None);
        }
        let s = crate::alloc::grown(slot, stream, len as u64)?;
        stream.memset_zeros(s)?;
        Ok(Some(s))
    }
}

crate::held::held!(QuantScratch: amax, tensor);

/// A block-scaled matrix on the GPU: in buffers this crate allocated ([`Gpu::upload`],
/// the quantizers: `DeviceMatrix<'static>`), or over the caller's device memory for `'a`
/// ([`Gpu::matrix_view`], [`Gpu::matrix_view_mut`], [`Gpu::matrix_from_raw`]).
///
/// [`Gpu::upload`]: crate::Gpu::upload
/// [`Gpu::matrix_view`]: crate::Gpu::matrix_view
/// [`Gpu::matrix_view_mut`]: crate::Gpu::matrix_view_mut
/// [`Gpu::matrix_from_raw`]: crate::Gpu::matrix_from_raw
pub struct DeviceMatrix<'a> {
    pub(crate) gpu: GpuId,
    pub(crate) desc: MatrixDesc,
    pub(crate) data: Mem<'a>,
    pub(crate) scales: Mem<'a>,
    pub(crate) prepared: Prepared,
    /// The quantizer's maxima, where a quantizer wrote the matrix.
    pub(crate) scratch: QuantScratch,
}

impl DeviceMatrix<'_> {
    /// The matrix's format, shape, scale layout and tensor scale.
    pub fn desc(&self) -> &MatrixDesc {
        &self.desc
    }

    /// Waits for the stream and copies the matrix back (codes and scales in its layout), checked
    /// as [`ScaledMatrix::from_parts`](crate::ScaledMatrix::from_parts) checks any matrix.
    pub fn to_host(&self) -> Result<crate::ScaledMatrix> {
        let (data_bytes, scale_bytes) = self.desc.validate()?;
        let mut data = self.data.to_vec()?;
        let mut scales = self.scales.to_vec()?;
        // (The caller's memory may be longer than the matrix.)
        data.truncate(data_bytes);
        scales.truncate(scale_bytes);
        crate::ScaledMatrix::from_desc(self.desc, data, scales)
    }

    /// The codes on the GPU (`[batch][rows][k]`, e2m1 two per byte), for a caller's own kernels;
    /// `None` for a matrix over raw device memory (whose address the caller has).
    pub fn data(&self) -> Option<CudaView<'_, u8>> {
        self.data.view()
    }

    /// The scales on the GPU, in [`MatrixDesc::scale_layout`](crate::MatrixDesc); `None` for a
    /// matrix over raw device memory.
    pub fn scales(&self) -> Option<CudaView<'_, u8>> {
        self.scales.view()
    }

    /// Bytes of device memory the copies prepared beside the codes and scales take (tensor maps,
    /// scale re-layouts, the weights' copies once made: [`Gpu::prepare_weights`]), with the
    /// quantizer's scratch: what keeping this matrix costs beyond its own buffers.
    ///
    /// [`Gpu::prepare_weights`]: crate::Gpu::prepare_weights
    pub fn prepared_bytes(&self) -> usize {
        self.prepared.device_bytes() + self.scratch.device_bytes()
    }

    /// Whether the codes and scales live in the caller's memory (a view or raw memory).
    pub fn is_borrowed(&self) -> bool {
        !self.data.is_owned()
    }
}

impl std::fmt::Debug for Mem<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            Mem::Owned(_) => "owned",
            Mem::Shared(_) => "owned, shared",
            Mem::View(_) => "caller's, read only",
            Mem::ViewMut(_) => "caller's",
            Mem::Raw { .. } => "caller's, raw",
        };
        write!(f, "{} bytes at {:#x} ({kind})", self.len(), self.address())
    }
}

impl std::fmt::Debug for DeviceMatrix<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceMatrix")
            .field("desc", &self.desc)
            .field("data", &self.data)
            .field("scales", &self.scales)
            .finish()
    }
}

impl std::fmt::Debug for DeviceOutput<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dims = (self.m, self.n, self.l);
        debug_buffer(f, "DeviceOutput", ("dtype", &self.dtype), dims, &self.buf)
    }
}

/// A device buffer's `Debug`: its type's name, its element type (`kind`: the field's name and
/// value), its dims, and the buffer (its address and length, not its contents).
pub(crate) fn debug_buffer(
    f: &mut std::fmt::Formatter<'_>,
    name: &str,
    (kind, value): (&str, &dyn std::fmt::Debug),
    dims: (usize, usize, usize),
    buf: &Mem<'_>,
) -> std::fmt::Result {
    f.debug_struct(name)
        .field(kind, value)
        .field("dims", &dims)
        .field("buf", buf)
        .finish()
}

/// Bytes of an `l` × `m` × `n` output of `dtype`: `Error::Shape` when empty or past `usize`.
pub(crate) fn output_bytes(dtype: OutType, (m, n, l): (usize, usize, usize)) -> Result<usize> {
    if m == 0 || n == 0 || l == 0 {
        return Err(crate::error::shape(format!("empty output {l}×{m}×{n}")));
    }
    m.checked_mul(n)
        .and_then(|x| x.checked_mul(l))
        .and_then(|x| x.checked_mul(dtype.bytes()))
        .ok_or_else(|| crate::error::shape(format!("output {l}×{m}×{n} overflows")))
}

/// A GEMM output on the GPU (`[l][m][n]` row-major): allocated by [`Gpu::output`]
/// (`DeviceOutput<'static>`) or over the caller's memory ([`Gpu::output_view`],
/// [`Gpu::output_from_raw`]).
///
/// [`Gpu::output`]: crate::Gpu::output
/// [`Gpu::output_view`]: crate::Gpu::output_view
/// [`Gpu::output_from_raw`]: crate::Gpu::output_from_raw
pub struct DeviceOutput<'a> {
    pub(crate) gpu: GpuId,
    pub(crate) dtype: OutType,
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) l: usize,
    pub(crate) buf: Mem<'a>,
    pub(crate) prepared: Prepared,
}

impl DeviceOutput<'_> {
    /// The element type.
    pub fn dtype(&self) -> OutType {
        self.dtype
    }
    /// (m, n, l).
    pub fn dims(&self) -> (usize, usize, usize) {
        (self.m, self.n, self.l)
    }

    /// The output's bytes: l·m·n elements of [`DeviceOutput::dtype`].
    pub(crate) fn bytes(&self) -> usize {
        self.m * self.n * self.l * self.dtype.bytes()
    }

    /// Fills every byte with 0xFF: a NaN in bf16, f16 and f32.
    pub fn poison(&mut self) -> Result<()> {
        let len = self.bytes();
        let stream = self.buf.stream().clone();
        // A raw driver call: make the context current on this thread as cudarc's own calls do.
        stream.context().bind_to_thread()?;
        let (ptr, _g) = self.buf.device_ptr_mut(&stream);
        // SAFETY: `ptr` covers at least `len` writable bytes (an allocation of this size, or
        // the caller's memory checked to be as long by its constructor); u8 accepts any pattern.
        unsafe { cudarc::driver::result::memset_d8_async(ptr, 0xFF, len, stream.cu_stream()) }?;
        Ok(())
    }

    /// Waits for the stream and copies the result back.
    pub fn to_host(&self) -> Result<HostOutput> {
        let mut bytes = self.buf.to_vec()?;
        bytes.truncate(self.bytes());
        Ok(HostOutput::from_bytes(
            self.dtype, self.m, self.n, self.l, &bytes,
        ))
    }

    /// The output on the GPU, for a caller's own kernels; `None` over raw device memory.
    pub fn data(&self) -> Option<CudaView<'_, u8>> {
        self.buf.view()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_gpu_identity_is_new_and_another_gpus_buffers_are_wrong_gpu_errors() {
        let (a, b) = (GpuId::next(), GpuId::next());
        assert_ne!(a, b);
        assert!(a.check(a, "A").is_ok());
        assert!(matches!(a.check(b, "A"), Err(Error::WrongGpu(_))));
    }

    #[test]
    fn prepared_data_is_found_by_its_type() {
        let mut p = Prepared::default();
        struct A(u32);
        struct B(&'static str);
        impl Held for A {
            fn device_bytes(&self) -> usize {
                4
            }
        }
        impl Held for B {
            fn device_bytes(&self) -> usize {
                16
            }
        }
        p.insert(Box::new(A(7)));
        p.insert(Box::new(B("sm90")));
        assert_eq!(p.get::<A>().map(|a| a.0), Some(7));
        assert_eq!(p.get::<B>().map(|b| b.0), Some("sm90"));
        assert!(p.get::<u64>().is_none());
        assert_eq!(p.device_bytes(), 20);
    }
}
