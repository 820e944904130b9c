//! Matrices and outputs on a GPU. Each records the [`Gpu`](crate::Gpu) that made it, and keeps
//! what the kernel families prepared of it in one slot, so that no family adds fields here.

use std::any::Any;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::{CudaSlice, DevicePtrMut};

use crate::error::{Error, Result};
use crate::format::OutType;
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
pub(crate) type PreparedValue = Box<dyn Any + Send + Sync>;

impl Prepared {
    pub(crate) fn insert(&mut self, value: PreparedValue) {
        self.0.push(value);
    }

    pub(crate) fn get<T: Any>(&self) -> Option<&T> {
        self.0.iter().find_map(|v| v.downcast_ref::<T>())
    }

    pub(crate) fn get_mut<T: Any>(&mut self) -> Option<&mut T> {
        self.0.iter_mut().find_map(|v| v.downcast_mut::<T>())
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

/// A block-scaled matrix on the GPU.
pub struct DeviceMatrix {
    pub(crate) gpu: GpuId,
    pub(crate) desc: MatrixDesc,
    pub(crate) data: CudaSlice<u8>,
    pub(crate) scales: CudaSlice<u8>,
    pub(crate) prepared: Prepared,
}

impl DeviceMatrix {
    pub fn desc(&self) -> &MatrixDesc {
        &self.desc
    }

    /// Waits for the stream and copies the matrix back (codes and scales in its layout), checked
    /// as [`ScaledMatrix::from_parts`](crate::ScaledMatrix::from_parts) checks any matrix.
    pub fn to_host(&self) -> Result<crate::ScaledMatrix> {
        let stream = self.data.stream();
        let data = stream.clone_dtoh(&self.data)?;
        let scales = stream.clone_dtoh(&self.scales)?;
        stream.synchronize()?;
        crate::ScaledMatrix::from_desc(self.desc, data, scales)
    }

    /// The codes on the GPU (`[batch][rows][k]`, e2m1 two per byte), for a caller's own kernels.
    pub fn data(&self) -> &CudaSlice<u8> {
        &self.data
    }

    /// The scales on the GPU, in [`MatrixDesc::scale_layout`](crate::MatrixDesc).
    pub fn scales(&self) -> &CudaSlice<u8> {
        &self.scales
    }
}

/// A GEMM output on the GPU (`[l][m][n]` row-major).
pub struct DeviceOutput {
    pub(crate) gpu: GpuId,
    pub(crate) dtype: OutType,
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) l: usize,
    pub(crate) buf: CudaSlice<u8>,
    pub(crate) prepared: Prepared,
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
        p.insert(Box::new(7u32));
        p.insert(Box::new("sm90"));
        assert_eq!(p.get::<u32>(), Some(&7));
        assert_eq!(p.get::<&str>(), Some(&"sm90"));
        assert_eq!(p.get::<u64>(), None);
    }
}
