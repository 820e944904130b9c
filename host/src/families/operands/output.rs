//! The output's TMA-store tensor maps, made once per output and read by every family whose
//! kernels store 16-bit tiles through TMA (FP8, 16-bit).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use crate::error::Result;
use crate::format::OutType;
use crate::tensor_map::{DataType, Swizzle, encode_3d};
use blockscaled_kernels::gemm::layout::{FRAGMENT_ROWS, OUT_BOX_WIDTHS};

/// The output's TMA-store descriptors (N, M, L of 16-bit values; boxes of 64 rows × 64, 32 or 16
/// columns with the 128-, 64- or 32-byte swizzle: `gemm::layout::out_box_n` of each tile width),
/// made for 16-bit outputs with N % 8 == 0; the kernel stores the others directly (f32, or rows
/// that are not 16-byte aligned, which TMA needs).
pub(crate) struct Sm90Output {
    tmaps: [CudaSlice<u8>; OUT_BOX_WIDTHS.len()],
}

impl Sm90Output {
    /// The map whose boxes are `width` columns.
    pub(crate) fn tmap(&self, width: u32) -> Option<&CudaSlice<u8>> {
        let i = OUT_BOX_WIDTHS.iter().position(|&w| w == width)?;
        Some(&self.tmaps[i])
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
        let mut tmaps = Vec::with_capacity(OUT_BOX_WIDTHS.len());
        for width in OUT_BOX_WIDTHS {
            let swizzle = match width {
                64 => Swizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                32 => Swizzle::CU_TENSOR_MAP_SWIZZLE_64B,
                _ => Swizzle::CU_TENSOR_MAP_SWIZZLE_32B,
            };
            tmaps.push(encode_3d(
                stream,
                ptr,
                DataType::CU_TENSOR_MAP_DATA_TYPE_UINT16,
                [n, m, l],
                2,
                [width, FRAGMENT_ROWS],
                swizzle,
            )?);
        }
        Ok(Some(Sm90Output {
            tmaps: tmaps.try_into().expect("one map per box width"),
        }))
    }
}

crate::held::held!(Sm90Output: tmaps);
