//! Every device allocation this crate makes goes through here, so that it can be counted: an
//! engine's steady-state loop (quantize, GEMM, fused GEMM, grouped GEMM into memory made once)
//! makes none, and [`device_allocations`] lets a test or a caller check it. (`host/clippy.toml`
//! refuses cudarc's allocating calls anywhere else.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};

use crate::error::{Result, shape};

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// How many device allocations this crate has made in this process, on every GPU: uploads,
/// outputs, quantized matrices, the copies the kernel families prepare of an operand, tensor
/// maps and workspaces. A loop over memory made beforehand should leave it unchanged.
pub fn device_allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

fn counted<T>(r: std::result::Result<T, cudarc::driver::DriverError>) -> Result<T> {
    let v = r?;
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    Ok(v)
}

/// `len` zeroed `T`s on `stream`.
#[allow(clippy::disallowed_methods)]
pub(crate) fn zeros<T: DeviceRepr + ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    len: usize,
) -> Result<CudaSlice<T>> {
    counted(stream.alloc_zeros::<T>(len))
}

/// `len` uninitialized `T`s on `stream`.
///
/// # Safety
/// Every element is written before anything reads it, or `T` accepts any bit pattern.
#[allow(clippy::disallowed_methods)]
pub(crate) unsafe fn uninit<T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    len: usize,
) -> Result<CudaSlice<T>> {
    // SAFETY: the caller's contract.
    counted(unsafe { stream.alloc::<T>(len) })
}

/// A device copy of `src`, on `stream`.
#[allow(clippy::disallowed_methods)]
pub(crate) fn copy_of<T: DeviceRepr>(stream: &Arc<CudaStream>, src: &[T]) -> Result<CudaSlice<T>> {
    counted(stream.clone_htod(src))
}

/// A workspace slot, locked while one launch is enqueued (an error-free lock: a thread that
/// panicked while holding it left a buffer that is still whole).
pub(crate) fn lock<T>(slot: &Mutex<T>) -> MutexGuard<'_, T> {
    slot.lock().unwrap_or_else(|e| e.into_inner())
}

/// `slot` holding at least `len` elements: kept if large enough, else replaced by a zeroed one
/// (in stream order: earlier launches that use the old one are ordered before its free).
pub(crate) fn grown<'a, T: DeviceRepr + ValidAsZeroBits>(
    slot: &'a mut Option<CudaSlice<T>>,
    stream: &Arc<CudaStream>,
    len: u64,
) -> Result<&'a mut CudaSlice<T>> {
    let len = usize::try_from(len).map_err(|_| shape("a workspace size overflows"))?;
    Ok(match slot.take() {
        Some(w) if w.len() >= len => slot.insert(w),
        _ => slot.insert(crate::alloc::zeros::<T>(stream, len.max(1))?),
    })
}
