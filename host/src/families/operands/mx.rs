//! The MX kernels' operand copies (one-byte scales per 1×16 or 1×32 in the kernel layout
//! `[l][⌈k/64⌉][rows_pad][64 / block]`, its tensor map, the codes' maps, each row's largest scale):
//! made once per uploaded matrix, read by the MX family, the fold pre-pass (the scales and row
//! maxima) and the 4-bit-weights family (e2m1 scales in the same layout).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use super::{OperandCopy, Rewrite, Upload};
use crate::buffers::{DeviceMatrix, OnFirstUse, Prepared};
use crate::error::Result;
use crate::format::{ElemType, ScaleBlock, ScaleType};
use crate::matrix::MatrixDesc;
use crate::prepare::{GatherTo, Preparers, Source};
use crate::tensor_map::{BoxMaps, DataType, HostMap, LazyMap, Swizzle, scale_rows_map};
use blockscaled_kernels::sm90_mx::{self as family, BLOCK_K, MxScale, SCALE_ROWS_PAD};

/// The scale format of an operand the kernel takes (`None`: none of its kernels does).
pub(crate) fn scale_format(d: &MatrixDesc) -> Option<MxScale> {
    let f = &d.format;
    let ScaleBlock::Tile { rows: 1, k } = f.block else {
        return None;
    };
    [MxScale::E8M0X32, MxScale::E8M0X16, MxScale::UE4M3X16]
        .into_iter()
        .find(|s| s.ty == f.scale && s.block == k)
}

/// Why an operand cannot go through the sm90 MX kernel (`None`: it can, in either role).
pub(crate) fn unsupported(d: &MatrixDesc) -> Option<String> {
    let f = &d.format;
    if !matches!(f.elem, ElemType::E4M3 | ElemType::E5M2 | ElemType::E2M1)
        || !matches!(f.scale, ScaleType::E8M0 | ScaleType::UE4M3)
    {
        return Some(format!(
            "{f}: the sm90 MX kernel takes e4m3, e5m2 or e2m1 with e8m0 or ue4m3 scales"
        ));
    }
    let Some(scale) = scale_format(d) else {
        return Some(format!(
            "{f}: the sm90 MX kernel takes scales per 1×32 (e8m0) or per 1×16 (e8m0, ue4m3)"
        ));
    };
    if !d.k.is_multiple_of(scale.block as usize) {
        return Some(format!(
            "K = {} is not a multiple of the scale block {}",
            d.k, scale.block
        ));
    }
    // TMA row strides are multiples of 16 bytes.
    if !(d.k * f.elem.bits() as usize / 8).is_multiple_of(16) {
        return Some(format!(
            "{f}: a row of K = {} is not a multiple of 16 bytes (TMA), so K must be a multiple of {}",
            d.k,
            128 / f.elem.bits()
        ));
    }
    None
}

/// The scale bytes of `m` in the kernel layout `[l][⌈k/64⌉][rows_pad][64 / block]` (zero past
/// the rows and past K), and `rows_pad`.
pub(crate) fn kernel_scales(
    stream: &Arc<CudaStream>,
    m: &Source<'_>,
    scale: MxScale,
) -> Result<(CudaSlice<u8>, usize)> {
    let (to, rows_pad) = kernel_scales_to(m.desc(), scale);
    Ok((m.gather(stream, to)?, rows_pad))
}

/// [`kernel_scales`]' re-layout, and `rows_pad`.
pub(crate) fn kernel_scales_to(d: &MatrixDesc, scale: MxScale) -> (GatherTo, usize) {
    let rows_pad = d.rows.next_multiple_of(SCALE_ROWS_PAD as usize);
    let to = GatherTo {
        planes: d.k.div_ceil(BLOCK_K as usize),
        rows_out: rows_pad,
        per: (BLOCK_K / scale.block) as usize,
        row_step: 1,
        k_step: scale.block as usize,
        values: false,
    };
    (to, rows_pad)
}

/// What the kernel needs of one uploaded matrix, made at upload time.
pub(crate) struct MxOperand {
    /// CUtensorMaps (3-D: K bytes, rows, L; boxes of one stage's row bytes × 128 and × 256 rows;
    /// no swizzle), encoded at their first use.
    tmaps: BoxMaps,
    /// Scale bytes `[l][⌈k/64⌉][rows_pad][64 / block]`, zero past the rows and past K.
    pub(crate) scales: CudaSlice<u8>,
    pub(crate) rows_pad: u32,
    /// The scales' tensor map for the A role (entries of one row's `64 / block` bytes, boxes of
    /// `family::sfa_box` rows): a tile may start at any row (grouped GEMM).
    scale_map: LazyMap,
    /// Each row's largest non-NaN scale code over all of K, `[l][rows_pad]` (the fold
    /// pre-pass's B-role scale): made when the matrix is first folded as B, as only weights are
    /// (activations quantized every step never pay for it).
    row_tops: OnFirstUse<CudaSlice<u8>>,
}

impl MxOperand {
    /// The kernel-layout scale buffer of `prepared`'s operand, for a family whose kernels read
    /// the same layout (the 4-bit-weights family) rather than keeping a copy of their own.
    pub(crate) fn layout_scales(prepared: &Prepared) -> Option<&CudaSlice<u8>> {
        Some(&prepared.get::<MxOperand>()?.scales)
    }

    /// The kernel-layout scale buffer of `prepared`'s operand and its `rows_pad`, for a writer
    /// that rewrites it in place ([`Rewritten::mx_scales`]).
    pub(crate) fn layout_scales_mut(prepared: &mut Prepared) -> Option<(&mut CudaSlice<u8>, u32)> {
        let op = prepared.get_mut::<MxOperand>()?;
        Some((&mut op.scales, op.rows_pad))
    }

    /// The scale bytes of `m` in the kernel layout and their `rows_pad`, when `m` was prepared
    /// for this family (for the fold pre-pass).
    pub(crate) fn scales_of<'m>(m: &'m DeviceMatrix<'_>) -> Option<(&'m CudaSlice<u8>, u32)> {
        let op = m.prepared.get::<MxOperand>()?;
        Some((&op.scales, op.rows_pad))
    }

    /// Each row's largest scale code of `m` (prepared for this family) over all of K, made by
    /// `kernels` on `stream` at the first call after the matrix was made or rewritten (the fold
    /// pre-pass's B role).
    pub(crate) fn row_tops_of<'m>(
        m: &'m DeviceMatrix,
        stream: &Arc<CudaStream>,
        kernels: &Preparers,
    ) -> Option<Result<&'m CudaSlice<u8>>> {
        let op = m.prepared.get::<MxOperand>()?;
        Some(
            op.row_tops
                .get_or_make(|| kernels.row_tops(stream, m, op.rows_pad as usize)),
        )
    }

    pub(crate) fn tmap(&self, box_rows: u32) -> Result<HostMap> {
        self.tmaps.get(box_rows)
    }

    /// The A role's map over [`MxOperand::scales`].
    pub(crate) fn scale_map(&self) -> Result<HostMap> {
        self.scale_map.get()
    }
}

impl OperandCopy for MxOperand {
    fn make(up: &Upload<'_>) -> Result<Option<Self>> {
        let (stream, m, data) = (up.stream, up.matrix, up.data);
        let d = m.desc();
        if unsupported(d).is_some() {
            return Ok(None);
        }
        let scale = scale_format(d).expect("checked by `unsupported`");
        let (scales, rows_pad) = kernel_scales(stream, m, scale)?;
        let (rows, k, l) = (d.rows, d.k, d.batch);
        let (ptr, _g) = data.device_ptr(stream);
        let row_bytes = k * d.format.elem.bits() as usize / 8;
        let stage_bytes = BLOCK_K * d.format.elem.bits() / 8;
        let layout = (
            DataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            [row_bytes, rows, l],
            1,
            stage_bytes,
            Swizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
        );
        let scale_map = {
            let (sp, _g) = scales.device_ptr(stream);
            let entry = (BLOCK_K / scale.block) as usize;
            let dims = (rows_pad, k.div_ceil(BLOCK_K as usize), l);
            scale_rows_map(sp, entry, dims, family::sfa_box(scale.block).rows())?
        };
        Ok(Some(MxOperand {
            tmaps: BoxMaps::new(ptr, layout, [128, 256]),
            scales,
            rows_pad: rows_pad as u32,
            scale_map,
            row_tops: OnFirstUse::default(),
        }))
    }

    /// Its copies for `m`, rewritten in place: the scale layout made again in the same buffer
    /// where the writer did not write it ([`Rewritten::mx_scales`]), the row maxima at their
    /// next use.
    fn refresh(&mut self, re: &Rewrite<'_>) -> Result<bool> {
        let (stream, m) = (re.stream, re.matrix);
        let written = re.written;
        if !written.mx_scales {
            let scale = scale_format(m.desc()).expect("prepared, so supported");
            m.gather_into(
                stream,
                kernel_scales_to(m.desc(), scale).0,
                &mut self.scales,
            )?;
        }
        self.row_tops.forget();
        Ok(true)
    }
}

crate::held::held!(MxOperand: scales, row_tops);
