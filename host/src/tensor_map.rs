//! TMA tensor maps (`cuTensorMapEncodeTiled`), encoded once per uploaded matrix or output and kept
//! in device memory: a by-value kernel parameter cannot carry the 64-byte alignment TMA needs from
//! Rust.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, sys};

use crate::buffers::OnFirstUse;
use crate::error::Result;

pub(crate) use sys::CUtensorMapDataType as DataType;
pub(crate) use sys::CUtensorMapSwizzle as Swizzle;

/// Encodes a 3-D row-major tensor map (`dims` innermost first, `elem` bytes per element, dense;
/// boxes of `box_xy` × 1, `swizzle`) over device memory at `ptr` and copies it to device memory.
/// The row strides (`dims[0] · elem`) must be multiples of 16 bytes, and `ptr` 16-byte aligned.
pub(crate) fn encode_3d(
    stream: &Arc<CudaStream>,
    ptr: u64,
    dtype: DataType,
    dims: [usize; 3],
    elem: usize,
    box_xy: [u32; 2],
    swizzle: Swizzle,
) -> Result<CudaSlice<u8>> {
    let host = encode_3d_host(ptr, (dtype, dims, elem, box_xy[0], swizzle), box_xy[1])?;
    crate::alloc::copy_of(stream, &host)
}

/// [`encode_3d`]'s map of `layout` with boxes `rows` high, in host memory.
fn encode_3d_host(
    ptr: u64,
    (dtype, dims, elem, box_x, swizzle): MapLayout,
    rows: u32,
) -> Result<Vec<u8>> {
    let sizes = dims.map(|d| d as u64);
    let strides = [(dims[0] * elem) as u64, (dims[0] * dims[1] * elem) as u64];
    encode_host(ptr, dtype, &sizes, &strides, &[box_x, rows, 1], swizzle)
}

/// A tensor map over `ptr` of `sizes` (innermost first, elements), `strides` (bytes, of every
/// dimension after the first) and `boxes` (elements per dimension), no interleave, L2 promotion
/// by 256 bytes, zeros past the sizes; copied to the device.
pub(crate) fn encode(
    stream: &Arc<CudaStream>,
    ptr: u64,
    dtype: DataType,
    sizes: &[u64],
    strides: &[u64],
    boxes: &[u32],
    swizzle: Swizzle,
) -> Result<CudaSlice<u8>> {
    let bytes = encode_host(ptr, dtype, sizes, strides, boxes, swizzle)?;
    crate::alloc::copy_of(stream, &bytes)
}

/// [`encode`]'s map, in host memory (its bytes, to copy to the device where a kernel reads it).
fn encode_host(
    ptr: u64,
    dtype: DataType,
    sizes: &[u64],
    strides: &[u64],
    boxes: &[u32],
    swizzle: Swizzle,
) -> Result<Vec<u8>> {
    let rank = sizes.len();
    assert!(strides.len() + 1 == rank && boxes.len() == rank && (1..=5).contains(&rank));
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    let elem_strides = [1u32; 5];
    // SAFETY: every pointer refers to a live local array of at least the length the rank
    // implies (checked above); `ptr` is a live device allocation covering the sizes and strides
    // (the callers' contract), 256-byte aligned by cuMemAlloc.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            dtype,
            rank as u32,
            ptr as *mut std::ffi::c_void,
            sizes.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elem_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    r.result()?;
    let bytes: Vec<u8> = map.opaque.iter().flat_map(|w| w.to_le_bytes()).collect();
    Ok(bytes)
}

/// One 3-D operand's tensor maps by box height (`encode_3d` with boxes of `box_x` × each
/// height, the same layout otherwise): a kernel reads a tile's rows through the map whose boxes
/// are that many rows. Each is encoded when the operand is prepared and copied to the device at
/// its first use: a call uses one or two of the heights, and each copy is a device allocation
/// and a host-to-device copy, the larger part of a view's preparation.
pub(crate) struct BoxMaps(Vec<(u32, Vec<u8>, OnFirstUse<CudaSlice<u8>>)>);

/// What [`BoxMaps::new`] encodes: the data type, dims (innermost first), bytes per element, the
/// boxes' inner extent, and the swizzle.
pub(crate) type MapLayout = (DataType, [usize; 3], usize, u32, Swizzle);

impl BoxMaps {
    /// The maps over `ptr` of `layout` with boxes of each height of `rows`.
    pub(crate) fn new(
        ptr: u64,
        layout: MapLayout,
        rows: impl IntoIterator<Item = u32>,
    ) -> Result<Self> {
        rows.into_iter()
            .map(|r| Ok((r, encode_3d_host(ptr, layout, r)?, OnFirstUse::default())))
            .collect::<Result<_>>()
            .map(BoxMaps)
    }

    /// The map whose boxes are `rows` rows, in device memory (copied on `stream` at its first
    /// use; [`Error::Config`](crate::Error::Config) where there is none: a configuration the
    /// operand's maps were not made for).
    pub(crate) fn get(&self, stream: &Arc<CudaStream>, rows: u32) -> Result<&CudaSlice<u8>> {
        let (_, host, dev) = self.0.iter().find(|(r, ..)| *r == rows).ok_or_else(|| {
            crate::error::config(format!("no tensor map with boxes of {rows} rows"))
        })?;
        dev.get_or_make(|| crate::alloc::copy_of(stream, host))
    }
}

impl BoxMaps {
    /// Copies every map to the device now (weights, sparse matrices and workspace copies, which
    /// are prepared once so that no later GEMM on them allocates).
    pub(crate) fn make_all(&self, stream: &Arc<CudaStream>) -> Result<&Self> {
        for (r, ..) in &self.0 {
            self.get(stream, *r)?;
        }
        Ok(self)
    }
}

impl crate::held::Held for BoxMaps {
    fn device_bytes(&self) -> usize {
        self.0
            .iter()
            .filter_map(|(_, _, d)| d.get())
            .map(crate::held::Held::device_bytes)
            .sum()
    }
}

/// The tensor map of a scale buffer `[l][planes][rows_pad]` whose entries are one row's scales of
/// one plane (`elem` = 2 or 4 bytes), in boxes of `box_rows` rows of one plane, no swizzle: the
/// kernels copy a tile's scales from any first row (a grouped GEMM's groups start mid-tile; a
/// 16-byte bulk copy could not), zero past `rows_pad`. `rows_pad · elem` must be a multiple of 16
/// and `box_rows · elem` too.
pub(crate) fn encode_scale_rows(
    stream: &Arc<CudaStream>,
    ptr: u64,
    elem: usize,
    (rows_pad, planes, l): (usize, usize, usize),
    box_rows: u32,
) -> Result<CudaSlice<u8>> {
    let dtype = match elem {
        2 => DataType::CU_TENSOR_MAP_DATA_TYPE_UINT16,
        4 => DataType::CU_TENSOR_MAP_DATA_TYPE_UINT32,
        _ => {
            return Err(crate::error::Error::Format(format!(
                "scale entries of {elem} bytes: the kernels' scale maps take 2 or 4"
            )));
        }
    };
    encode_3d(
        stream,
        ptr,
        dtype,
        [rows_pad, planes, l],
        elem,
        [box_rows, 1],
        Swizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
    )
}
