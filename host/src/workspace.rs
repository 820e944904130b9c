//! A [`Gpu`](crate::Gpu) handle's workspace: the memory a GEMM uses beside its operands and output
//! (split K's partial sums and counters, the fold pre-pass's FP8 copies), grown on demand and then
//! reused in the order of the handle's one stream. Each handle has its own, so calls on different streams never wait on each other's
//! locks or memory.

use std::any::Any;
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};

use crate::error::{Result, shape};

use crate::splitk::SplitK;

/// One handle's workspace (see the module doc).
#[derive(Default)]
pub(crate) struct Workspace {
    pub splitk: SplitK,
    /// The fold pre-pass's copies of A and B (the fold family's type, which it alone reads).
    pub fold: Mutex<[Option<Box<dyn Any + Send + Sync>>; 2]>,
    /// The rows a fused epilogue stages in global memory where the kernel's shared memory has no
    /// room for them (the MX kernel).
    pub staging: Mutex<Option<CudaSlice<u8>>>,
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
