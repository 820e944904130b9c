//! blockscaled's block-scaled GEMMs as [candle](https://docs.rs/candle-core) operations on CUDA
//! tensors: DeepSeek-style FP8 linear layers (1×128 activation scales, 128×128 weight scales),
//! MXFP8 / MXFP4 / NVFP4 layers with both operands block-scaled, 4-bit weights times bf16 or FP8
//! activations, per-tensor and per-row FP8, each with a fused bias and activation, and grouped
//! GEMM for mixture-of-experts layers whose group sizes a router wrote on the device.
//!
//! A [`BlockScaledLinear`] reads its weights where candle holds them (a safetensors checkpoint's
//! codes and scales, loaded as candle tensors): no copy, no re-layout on the host. Each forward
//! call reads the activations in place, quantizes them on the GPU into a buffer the layer keeps,
//! and writes a new candle tensor, all on the candle device's stream with no host wait.
//!
//! ```no_run
//! use blockscaled_candle::{BlockScaledLinear, Recipe};
//! use candle_core::{DType, Device, Tensor};
//!
//! # fn main() -> candle_core::Result<()> {
//! let dev = Device::new_cuda(0)?;
//! // A DeepSeek-V3 style FP8 weight (N × K, e4m3) and its fp32 scales per 128 × 128 block,
//! // as a checkpoint's `weight` and `weight_scale_inv` load.
//! # let codes = vec![0x38u8; 7168 * 2048]; // (e4m3 1.0)
//! let w = Tensor::from_raw_buffer(&codes, DType::F8E4M3, &[7168, 2048], &dev)?;
//! let s = Tensor::ones((56, 16), DType::F32, &dev)?;
//! let layer = BlockScaledLinear::new(Recipe::DeepSeekFp8, &w, &s)?;
//! let x = Tensor::ones((16, 2048), DType::BF16, &dev)?;
//! let y = x.apply(&layer)?; // 16 × 7168 bf16
//! # Ok(()) }
//! ```
//!
//! Formats in candle's dtypes: e4m3 codes as `F8E4M3` or `U8`; e5m2 codes as `U8`; e2m1 codes
//! packed two per byte (element `2i` in the low nibble) as `U8` of K / 2 columns, as checkpoints
//! store them (candle's `F4` has no byte size, so it cannot say how many codes a buffer holds);
//! e8m0 scales as `U8` (or `F8E8M0`, which candle cannot place on a CUDA device yet); NVFP4's
//! ue4m3 scales as `F8E4M3` or `U8`; fp32 scales as `F32`. Scales are K-major: `[batch][row block][K block]`, the layout checkpoints use.

#![warn(missing_docs)]

mod linear;
mod memory;

pub use blockscaled::{Activation, Fp4Weights, Fp8, GroupLayout, Recipe};
pub use linear::BlockScaledLinear;

use std::sync::{Arc, Mutex};

use blockscaled::Gpu;
use candle_core::cuda_backend::{CudaDevice, DeviceId};

/// The blockscaled handle of a candle CUDA device: the kernels loaded once per device, every
/// call enqueued on the device's stream (so candle's own kernels and ours run in one order).
pub fn gpu_of(device: &CudaDevice) -> candle_core::Result<Arc<Gpu>> {
    static HANDLES: Mutex<Vec<(DeviceId, Arc<Gpu>)>> = Mutex::new(Vec::new());
    let mut handles = HANDLES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, gpu)) = handles.iter().find(|(id, _)| *id == device.id()) {
        return Ok(gpu.clone());
    }
    let gpu = Arc::new(Gpu::from_stream(device.cuda_stream()).map_err(err)?);
    handles.push((device.id(), gpu.clone()));
    Ok(gpu)
}

/// A blockscaled error as candle's (its message kept).
pub(crate) fn err(e: blockscaled::Error) -> candle_core::Error {
    candle_core::Error::wrap(e)
}
