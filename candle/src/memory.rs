//! Candle's CUDA storage as blockscaled's memory: the device bytes a tensor's layout covers, and
//! new candle storage for a GEMM's output.

use blockscaled::{DeviceOutput, Gpu, OutType, RawDevice};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, DevicePtr, DeviceRepr, ValidAsZeroBits,
};
use candle_core::cuda_backend::{CudaDevice, CudaStorage, CudaStorageSlice};
use candle_core::{DType, Layout, Result, bail};
use half::{bf16, f16};

use crate::err;

/// The device bytes that a contiguous `layout` of `storage` covers, and their dtype.
pub(crate) struct Bytes {
    pub raw: RawDevice,
    pub dtype: DType,
}

/// The bytes of `storage` under `layout`; an error naming `what` unless the layout is contiguous
/// and of whole bytes.
pub(crate) fn bytes_of(storage: &CudaStorage, layout: &Layout, what: &str) -> Result<Bytes> {
    let Some((start, end)) = layout.contiguous_offsets() else {
        bail!("{what} is not contiguous (call .contiguous() first)")
    };
    fn span<T>(s: &CudaSlice<T>, start: usize, end: usize) -> RawDevice {
        let size = std::mem::size_of::<T>();
        // (On the slice's own stream, which is candle's and the handle's: no event to wait on.)
        let (ptr, _sync) = s.device_ptr(s.stream());
        RawDevice {
            ptr: ptr + (start * size) as u64,
            len: (end - start) * size,
        }
    }
    use CudaStorageSlice as S;
    let raw = match &storage.slice {
        S::U8(s) | S::F8E8M0(s) => span(s, start, end),
        S::U32(s) => span(s, start, end),
        S::I16(s) => span(s, start, end),
        S::I32(s) => span(s, start, end),
        S::I64(s) => span(s, start, end),
        S::BF16(s) => span(s, start, end),
        S::F16(s) => span(s, start, end),
        S::F32(s) => span(s, start, end),
        S::F64(s) => span(s, start, end),
        S::F8E4M3(s) => span(s, start, end),
        S::F4(_) | S::F6E2M3(_) | S::F6E3M2(_) => bail!(
            "{what} is {:?}: candle gives its sub-byte types no byte size; pass packed codes as U8",
            storage.dtype()
        ),
    };
    Ok(Bytes {
        raw,
        dtype: storage.dtype(),
    })
}

/// The output element types a GEMM writes, as candle's.
pub(crate) fn out_type(dtype: DType) -> Result<OutType> {
    Ok(match dtype {
        DType::BF16 => OutType::Bf16,
        DType::F16 => OutType::F16,
        DType::F32 => OutType::F32,
        _ => bail!("blockscaled writes bf16, f16 or f32 outputs, not {dtype:?}"),
    })
}

/// Values made over device memory at an address (an output's or an activation's tensor maps
/// encode it), kept for the next call whose memory lies at the same address with the same
/// shape: candle's stream-ordered allocator hands a loop's same-sized tensors the same memory
/// again, so a steady forward loop makes them once. A value is used only while the live tensor
/// it is looked up for occupies exactly its memory; between uses it is not touched.
pub(crate) struct ByAddress<K, V> {
    kept: std::sync::Mutex<Vec<Kept<K, V>>>,
}

/// A kept value: (address, bytes, key) and the value.
type Kept<K, V> = ((u64, usize, K), V);

/// Output views by address, output type and (m, n, l).
pub(crate) type OutputViews = ByAddress<(OutType, (usize, usize, usize)), DeviceOutput<'static>>;

/// Values kept per cache (the least recently used is dropped past it).
const KEPT: usize = 8;

impl<K: PartialEq + Copy, V> ByAddress<K, V> {
    pub(crate) fn new() -> Self {
        ByAddress {
            kept: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// `use_it` on the value kept for `raw` and `key`, made by `make` where none is.
    pub(crate) fn with<T>(
        &self,
        raw: RawDevice,
        key: K,
        make: impl FnOnce() -> Result<V>,
        use_it: impl FnOnce(&mut V) -> Result<T>,
    ) -> Result<T> {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let id = (raw.ptr, raw.len, key);
        let i = match kept.iter().position(|(k, _)| *k == id) {
            Some(i) => {
                let v = kept.remove(i);
                kept.push(v);
                kept.len() - 1
            }
            None => {
                if kept.len() == KEPT {
                    kept.remove(0);
                }
                kept.push((id, make()?));
                kept.len() - 1
            }
        };
        use_it(&mut kept[i].1)
    }
}

/// A new candle storage of `dims` (l, m, n) elements of `dtype`, zeroed where `zeroed` (a
/// grouped GEMM leaves rows past its groups unwritten), handed to `write` as a GEMM output (an
/// output view over it, kept in `views` by address).
pub(crate) fn new_output(
    gpu: &Gpu,
    device: &CudaDevice,
    views: &OutputViews,
    dtype: DType,
    dims: (usize, usize, usize),
    zeroed: bool,
    write: impl FnOnce(&mut DeviceOutput<'static>) -> blockscaled::Result<()>,
) -> Result<CudaStorage> {
    fn make<T: DeviceRepr + ValidAsZeroBits>(
        gpu: &Gpu,
        device: &CudaDevice,
        views: &OutputViews,
        out: OutType,
        (l, m, n): (usize, usize, usize),
        zeroed: bool,
        write: impl FnOnce(&mut DeviceOutput<'static>) -> blockscaled::Result<()>,
    ) -> Result<CudaSlice<T>> {
        let len = m * n * l;
        let buf = if zeroed {
            device.alloc_zeros::<T>(len)?
        } else {
            // SAFETY: uninitialized device memory is only ever written by the GEMM before candle
            // reads it (a dense GEMM writes every element of its output).
            unsafe { device.alloc::<T>(len)? }
        };
        let raw = {
            let (ptr, _sync) = buf.device_ptr(buf.stream());
            RawDevice {
                ptr,
                len: len * std::mem::size_of::<T>(),
            }
        };
        let dims = (m, n, l);
        views.with(
            raw,
            (out, dims),
            // SAFETY: `buf` is a live allocation of this device's context, exactly `raw`, which
            // nothing but the GEMM enqueued below writes until it is handed to candle (in the
            // device's stream order); the view is used again only over the same live memory
            // (`ByAddress`).
            || unsafe { gpu.output_from_raw(raw, out, dims) }.map_err(err),
            |c| write(c).map_err(err),
        )?;
        Ok(buf)
    }
    let out = out_type(dtype)?;
    let d = device.clone();
    Ok(match out {
        OutType::Bf16 => CudaStorage::wrap_cuda_slice(
            make::<bf16>(gpu, device, views, out, dims, zeroed, write)?,
            d,
        ),
        OutType::F16 => CudaStorage::wrap_cuda_slice(
            make::<f16>(gpu, device, views, out, dims, zeroed, write)?,
            d,
        ),
        _ => CudaStorage::wrap_cuda_slice(
            make::<f32>(gpu, device, views, out, dims, zeroed, write)?,
            d,
        ),
    })
}
