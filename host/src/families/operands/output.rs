//! The output's TMA-store tensor maps, made once per output and read by every family whose
//! kernels store 16-bit tiles through TMA (FP8, 16-bit).

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr};

use crate::error::Result;
use crate::format::OutType;
use crate::tensor_map::{DataType, HostMap, LazyMap, Swizzle};
use blockscaled_kernels::gemm::layout::{FRAGMENT_ROWS, OUT_BOX_WIDTHS};

/// The output's TMA-store descriptors (N, M, L of 16-bit values; boxes of 64 rows × 64, 32 or 16
/// columns with the 128-, 64- or 32-byte swizzle: `gemm::layout::out_box_n` of each tile width),
/// made for 16-bit outputs with N % 8 == 0; the kernel stores the others directly (f32, or rows
/// that are not 16-byte aligned, which TMA needs). Each is encoded at its first use.
pub(crate) struct Sm90Output {
    tmaps: Vec<LazyMap>,
}

impl Sm90Output {
    /// The map whose boxes are `width` columns; `None` where there is none of that width.
    pub(crate) fn tmap(&self, width: u32) -> Result<Option<HostMap>> {
        match OUT_BOX_WIDTHS.iter().position(|&w| w == width) {
            Some(i) => self.tmaps[i].get().map(Some),
            None => Ok(None),
        }
    }
}

impl Sm90Output {
    pub(crate) fn prepare(
        stream: &Arc<CudaStream>,
        buf: &impl DevicePtr<u8>,
        dtype: OutType,
        (m, n, l): (usize, usize, usize),
    ) -> Result<Option<Self>> {
        if dtype.bytes() != 2 || !n.is_multiple_of(8) {
            return Ok(None);
        }
        let (ptr, _g) = buf.device_ptr(stream);
        let tmaps = OUT_BOX_WIDTHS
            .iter()
            .map(|&width| {
                let swizzle = match width {
                    64 => Swizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                    32 => Swizzle::CU_TENSOR_MAP_SWIZZLE_64B,
                    _ => Swizzle::CU_TENSOR_MAP_SWIZZLE_32B,
                };
                let layout = (
                    DataType::CU_TENSOR_MAP_DATA_TYPE_UINT16,
                    [n, m, l],
                    2,
                    width,
                    swizzle,
                );
                LazyMap::new(ptr, layout, FRAGMENT_ROWS)
            })
            .collect();
        Ok(Some(Sm90Output { tmaps }))
    }
}

crate::held::held!(Sm90Output: tmaps);
