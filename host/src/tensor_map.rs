//! TMA tensor maps (`cuTensorMapEncodeTiled`), encoded on the host and carried by each launch in
//! its kernel parameter ([`crate::launch::Launch::map`], `kernels::params::Mapped`): no device
//! memory, no copy. An operand's or output's maps are encoded at their first use (a call reads
//! one or two of an operand's box heights) and kept with it.

use cudarc::driver::sys;

use crate::buffers::OnFirstUse;
use crate::error::Result;
use blockscaled_kernels::params::MAP_BYTES;

pub(crate) use sys::CUtensorMapDataType as DataType;
pub(crate) use sys::CUtensorMapSwizzle as Swizzle;

/// One encoded `CUtensorMap`: the 128 bytes a kernel's TMA instructions read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HostMap(pub(crate) [u64; MAP_BYTES / 8]);

/// A tensor map over `ptr` of `sizes` (innermost first, elements), `strides` (bytes, of every
/// dimension after the first) and `boxes` (elements per dimension), no interleave, L2 promotion
/// by 256 bytes, zeros past the sizes.
pub(crate) fn encode(
    ptr: u64,
    dtype: DataType,
    sizes: &[u64],
    strides: &[u64],
    boxes: &[u32],
    swizzle: Swizzle,
) -> Result<HostMap> {
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
    Ok(HostMap(map.opaque))
}

/// What a 3-D row-major map is made of: the data type, dims (innermost first), bytes per
/// element, the boxes' inner extent, and the swizzle.
pub(crate) type MapLayout = (DataType, [usize; 3], usize, u32, Swizzle);

/// A 3-D map encoded at its first use ([`OnFirstUse`]) and kept: [`encode`]'s arguments.
pub(crate) struct LazyMap {
    ptr: u64,
    dtype: DataType,
    sizes: [u64; 3],
    strides: [u64; 2],
    boxes: [u32; 3],
    swizzle: Swizzle,
    map: OnFirstUse<HostMap>,
}

impl LazyMap {
    /// The 3-D map of `layout` over `ptr` (dense rows) with boxes `rows` high.
    pub(crate) fn new(ptr: u64, (dtype, dims, elem, box_x, swizzle): MapLayout, rows: u32) -> Self {
        let sizes = dims.map(|d| d as u64);
        let strides = [(dims[0] * elem) as u64, (dims[0] * dims[1] * elem) as u64];
        LazyMap::strided(ptr, dtype, (sizes, strides), [box_x, rows, 1], swizzle)
    }

    /// The 3-D map over `ptr` of `sizes` (innermost first) with the byte `strides` of the outer
    /// two dimensions, in `boxes`.
    pub(crate) fn strided(
        ptr: u64,
        dtype: DataType,
        (sizes, strides): ([u64; 3], [u64; 2]),
        boxes: [u32; 3],
        swizzle: Swizzle,
    ) -> Self {
        LazyMap {
            ptr,
            dtype,
            sizes,
            strides,
            boxes,
            swizzle,
            map: OnFirstUse::default(),
        }
    }

    /// The encoded map.
    pub(crate) fn get(&self) -> Result<HostMap> {
        self.map
            .get_or_make(|| {
                let (p, d) = (self.ptr, self.dtype);
                encode(p, d, &self.sizes, &self.strides, &self.boxes, self.swizzle)
            })
            .copied()
    }
}

/// One 3-D operand's tensor maps by box height (the same layout otherwise): a kernel reads a
/// tile's rows through the map whose boxes are that many rows. Each is encoded at its first use.
pub(crate) struct BoxMaps(Vec<LazyMap>);

impl BoxMaps {
    /// The maps over `ptr` of `layout` with boxes of each height of `rows`.
    pub(crate) fn new(ptr: u64, layout: MapLayout, rows: impl IntoIterator<Item = u32>) -> Self {
        BoxMaps(
            rows.into_iter()
                .map(|r| LazyMap::new(ptr, layout, r))
                .collect(),
        )
    }

    /// The map whose boxes are `rows` rows ([`Error::Config`](crate::Error::Config) where there
    /// is none: a configuration the operand's maps were not made for).
    pub(crate) fn get(&self, rows: u32) -> Result<HostMap> {
        self.0
            .iter()
            .find(|m| m.boxes[1] == rows)
            .ok_or_else(|| {
                crate::error::config(format!("no tensor map with boxes of {rows} rows"))
            })?
            .get()
    }
}

/// The map of a scale buffer `[l][planes][rows_pad]` whose entries are one row's scales of one
/// plane (`elem` = 2 or 4 bytes), in boxes of `box_rows` rows of one plane, no swizzle: the
/// kernels copy a tile's scales from any first row (a grouped GEMM's groups start mid-tile; a
/// 16-byte bulk copy could not), zero past `rows_pad`. `rows_pad · elem` must be a multiple of 16
/// and `box_rows · elem` too. Encoded at its first use.
pub(crate) fn scale_rows_map(
    ptr: u64,
    elem: usize,
    (rows_pad, planes, l): (usize, usize, usize),
    box_rows: u32,
) -> Result<LazyMap> {
    let dtype = match elem {
        2 => DataType::CU_TENSOR_MAP_DATA_TYPE_UINT16,
        4 => DataType::CU_TENSOR_MAP_DATA_TYPE_UINT32,
        _ => {
            return Err(crate::error::Error::Format(format!(
                "scale entries of {elem} bytes: the kernels' scale maps take 2 or 4"
            )));
        }
    };
    let layout = (
        dtype,
        [rows_pad, planes, l],
        elem,
        box_rows,
        Swizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
    );
    Ok(LazyMap::new(ptr, layout, 1))
}

/// A map lives in host memory: none of its bytes are on the device.
impl crate::held::Held for LazyMap {
    fn device_bytes(&self) -> usize {
        0
    }
}

impl crate::held::Held for BoxMaps {
    fn device_bytes(&self) -> usize {
        self.0.device_bytes()
    }
}

impl<T: crate::held::Held> crate::held::Held for (T, LazyMap) {
    fn device_bytes(&self) -> usize {
        self.0.device_bytes()
    }
}
