//! The FP8 kernel's operand copies (fp32 scales per 1×128 in the A role, per 128×128 tile or per
//! row in the B role, and the codes' TMA tensor maps): made once per uploaded matrix, read by the
//! FP8 family, the fold (its folded copies are such operands) and the 4-bit-weights family (W4A8
//! activations read the A-role scales).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use super::{OperandCopy, Rewrite, Upload};
use crate::buffers::{DeviceMatrix, OnFirstUse};
use crate::error::{Error, Result};
use crate::format::{ElemType, ScaleType};
use crate::matrix::MatrixDesc;
use crate::prepare::{GatherTo, Preparers, Source};
use crate::tensor_map::{BoxMaps, DataType, HostMap, LazyMap, MapLayout, Swizzle, scale_rows_map};
use blockscaled_kernels::gemm::scheduler::MAX_CLUSTER;
use blockscaled_kernels::sm90::{
    self as family, BLOCK_K, BLOCK_N, ROW_BYTES, Tile, WG_ROWS, m_pad,
};

/// Why an operand cannot go through the sm90 kernel (`None`: it can, in that role).
pub(crate) fn unsupported(desc: &MatrixDesc, as_b: bool) -> Option<String> {
    let f = &desc.format;
    if !matches!(f.elem, ElemType::E4M3 | ElemType::E5M2) {
        return Some(format!(
            "{}: the sm90 kernel takes e4m3 or e5m2 elements",
            f
        ));
    }
    if f.scale != ScaleType::F32 {
        return Some(format!("{}: the sm90 kernel takes fp32 scales", f));
    }
    if !desc.k.is_multiple_of(BLOCK_K as usize) {
        return Some(format!(
            "K = {} is not a multiple of {BLOCK_K}, which the 128-wide fp32 scale blocks of the sm90 kernel need",
            desc.k
        ));
    }
    let (br, bk) = desc.block_extent();
    if bk % BLOCK_K as usize != 0 {
        return Some(format!(
            "{}: scale blocks must span a multiple of 128 of K",
            f
        ));
    }
    if as_b && !(br % BLOCK_N as usize == 0 || br >= desc.rows || per_row(desc)) {
        return Some(format!(
            "{}: as B, scales must be constant over 128×128 tiles or per row over all of K",
            f
        ));
    }
    None
}

/// Scales per row, constant over all of K (as B: per column of C, multiplied in after the K loop).
pub(crate) fn per_row(desc: &MatrixDesc) -> bool {
    let (br, bk) = desc.block_extent();
    br == 1 && bk >= desc.k
}

/// What the kernel needs of one operand: made at upload time from the host's scales, or over
/// device buffers another family wrote ([`Sm90Operand::over`]).
pub(crate) struct Sm90Operand {
    /// The 128-byte CUtensorMaps (3-D: K, rows, L; box 128 bytes × [`BOX_ROWS`]; 128-byte
    /// swizzle), encoded at their first use: 128 rows (a wave; a 256-row A tile is two boxes); 64 (each CTA's
    /// share of a multicast B tile, 128 / MAX_CLUSTER, or one consumer's rows of a
    /// three-consumer A tile); 32 and 16 (the A tiles of swapped tiles).
    tmaps: BoxMaps,
    /// A-role scales `[l][k/128][m_pad]`, rows contiguous, zero-padded (None if not eligible as A).
    pub(crate) sfa: Option<(CudaSlice<f32>, u32)>,
    /// Their tensor map (boxes of `SFA_BOX` rows), when `sfa` is set, or over the caller's
    /// scales read in place; encoded at its first use ([`Sm90Operand::sfa_map`]).
    sfa_map: Option<LazyMap>,
    /// The A role's copy and map made at the matrix's first use as A ([`Sm90Operand::as_a`]),
    /// for the caller's read-only weights-like matrices (scales shared by several rows), which
    /// serve as B: a binding's view of them, made every call, never pays for it.
    a_later: Option<OnFirstUse<(CudaSlice<f32>, LazyMap)>>,
    /// The B role's scales (None if not eligible as B): made at the matrix's first use as B
    /// ([`Sm90Operand::as_b`]; activations quantized every step never pay for them), or given
    /// with the operand (a fold's).
    b_role: Option<OnFirstUse<BRole>>,
}

/// The FP8 kernel's B-role scales of one operand.
pub(crate) struct BRole {
    /// `[l][⌈rows/128⌉][k/128]`; all 1 when the scales are per row, which `sfb_col` then holds.
    pub(crate) sfb: Sfb,
    /// Per-row scales `[l][rows]`, when B is scaled per row over all of K.
    pub(crate) sfb_col: Option<CudaSlice<f32>>,
}

/// Where the B role's tile scales are.
pub(crate) enum Sfb {
    /// A copy in the kernel's layout.
    Own(CudaSlice<f32>),
    /// The caller's read-only scales by address ([`Mem::read_only_raw`]), already in the
    /// kernel's layout and unscaled: read in place.
    Caller(u64),
}

impl BRole {
    /// The B role's scales of `m` (eligible as B).
    fn make(stream: &Arc<CudaStream>, m: &Source<'_>) -> Result<Self> {
        let d = *m.desc();
        let (rows, k, l) = (d.rows, d.k, d.batch);
        Ok(if column_scales(&d) {
            let nb = rows.div_ceil(BLOCK_N as usize);
            let ones = crate::alloc::copy_of(stream, &vec![1f32; l * nb * (k / BLOCK_K as usize)])?;
            BRole {
                sfb: Sfb::Own(ones),
                sfb_col: Some(m.gather(stream, scales_to(&d, Scales::Columns))?),
            }
        } else if let Some(ptr) = caller_scales(m, &d, Scales::B) {
            BRole {
                sfb: Sfb::Caller(ptr),
                sfb_col: None,
            }
        } else {
            BRole {
                sfb: Sfb::Own(m.gather(stream, scales_to(&d, Scales::B))?),
                sfb_col: None,
            }
        })
    }
}

/// The address of `m`'s scales where the kernel can read them in place as the copy `s` (A or B
/// role) would hold them: the caller's read-only memory by address ([`Mem::read_only_raw`]),
/// fp32 values the copy would not scale (tensor scale 1), in the copy's blocks and order — B:
/// `[l][⌈rows/128⌉][k/128]` dense; A: M-major, each plane's row of values 16-byte aligned
/// (the scale map's strides), which the map reads with zeros past the rows as the copy's
/// padding would give.
fn caller_scales(m: &Source<'_>, d: &MatrixDesc, s: Scales) -> Option<u64> {
    let Source::Device { scales, .. } = m else {
        return None;
    };
    let ptr = scales.read_only_raw()?;
    let (lay, kb) = (&d.scale_layout, d.k / BLOCK_K as usize);
    if d.tensor_scale != 1.0 || d.format.scale != ScaleType::F32 || lay.k_blocks != kb {
        return None;
    }
    let fits = match s {
        Scales::B => {
            let nb = d.rows.div_ceil(BLOCK_N as usize);
            d.block_extent() == (BLOCK_N as usize, BLOCK_K as usize)
                && lay.row_blocks == nb
                && (lay.k_stride, lay.row_stride) == (1, kb)
                && (d.batch == 1 || lay.batch_stride == nb * kb)
                && ptr.is_multiple_of(4)
        }
        Scales::A(_) => {
            d.block_extent() == (1, BLOCK_K as usize)
                && lay.row_blocks == d.rows
                && lay.row_stride == 1
                && lay.k_stride >= d.rows
                && (4 * lay.k_stride).is_multiple_of(16)
                && (d.batch == 1
                    || (lay.batch_stride >= lay.k_stride * kb
                        && (4 * lay.batch_stride).is_multiple_of(16)))
                && ptr.is_multiple_of(16)
        }
        Scales::Columns => false,
    };
    fits.then_some(ptr)
}

/// The caller's A-role scales read in place ([`caller_scales`]): their address and the fp32
/// values from one K plane to the next, where every batch entry follows the last densely (the
/// 4-bit-weights stream kernel's layout with that many rows a plane).
pub(crate) fn caller_a_scales(m: &Source<'_>, d: &MatrixDesc) -> Option<(u64, usize)> {
    let ptr = caller_scales(m, d, Scales::A(0))?;
    let lay = &d.scale_layout;
    let dense = d.batch == 1 || lay.batch_stride == lay.k_stride * lay.k_blocks;
    dense.then_some((ptr, lay.k_stride))
}

/// The A-role scale map over the copy `sfa` `[l][k/128][m_pad]`.
fn a_scale_map(
    stream: &Arc<CudaStream>,
    sfa: &CudaSlice<f32>,
    (m_pad, k, l): (u32, usize, usize),
) -> Result<LazyMap> {
    let (ptr, _g) = sfa.device_ptr(stream);
    let dims = (m_pad as usize, k / BLOCK_K as usize, l);
    scale_rows_map(ptr, 4, dims, family::SFA_BOX.rows())
}

/// The A-role scale map over the caller's scales at `ptr` ([`caller_scales`]): rows, planes of
/// K, batch entries at the caller's strides, in `SFA_BOX` boxes, zeros past the rows.
fn caller_sfa_map(ptr: u64, d: &MatrixDesc) -> LazyMap {
    let lay = &d.scale_layout;
    let kb = d.k / BLOCK_K as usize;
    let batch_stride = if d.batch == 1 {
        lay.k_stride * kb
    } else {
        lay.batch_stride
    };
    let sizes = [d.rows as u64, kb as u64, d.batch as u64];
    let strides = [4 * lay.k_stride as u64, 4 * batch_stride as u64];
    let boxes = [family::SFA_BOX.rows(), 1, 1];
    let dtype = DataType::CU_TENSOR_MAP_DATA_TYPE_UINT32;
    LazyMap::strided(
        ptr,
        dtype,
        (sizes, strides),
        boxes,
        Swizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
    )
}

impl Sm90Operand {
    /// A matrix's operand (`d`, its codes `data`) over its A-role scales `sfa` (made by
    /// [`Self::prepare`], or filled by a device writer: a quantizer, a GEMM's quantized output),
    /// with the B role made at first use where the format can take it.
    pub(crate) fn written(
        stream: &Arc<CudaStream>,
        d: &MatrixDesc,
        data: &impl DevicePtr<u8>,
        sfa: Option<(CudaSlice<f32>, u32)>,
    ) -> Result<Self> {
        let mut op = Sm90Operand::over(stream, data, (d.rows, d.k, d.batch), sfa, None)?;
        if unsupported(d, true).is_none() {
            op.b_role = Some(OnFirstUse::default());
        }
        Ok(op)
    }

    /// `m`'s operand as this family prepared it.
    fn of<'m>(m: &'m DeviceMatrix) -> Result<&'m Sm90Operand> {
        m.prepared
            .get::<Sm90Operand>()
            .ok_or_else(|| Error::Format("operand was not prepared for the sm90 kernel".into()))
    }

    /// `m`'s operand (prepared for this family) with its A-role scales, made by `kernels` on
    /// `stream` where they were left for the first use as A ([`Sm90Operand::a_later`]).
    pub(crate) fn as_a<'m>(
        m: &'m DeviceMatrix,
        stream: &Arc<CudaStream>,
        kernels: &Preparers,
    ) -> Result<&'m Sm90Operand> {
        let op = Sm90Operand::of(m)?;
        if let Some(later) = &op.a_later {
            later.get_or_make(|| {
                let d = m.desc;
                let m_pad = m_pad(d.rows as u32);
                let src = Source::of(m, kernels);
                let sfa = src.gather(stream, scales_to(&d, Scales::A(m_pad)))?;
                let map = a_scale_map(stream, &sfa, (m_pad, d.k, d.batch))?;
                Ok((sfa, map))
            })?;
        }
        Ok(op)
    }

    /// `m`'s operand (prepared for this family) with its B-role scales, made by `kernels` on
    /// `stream` at the first use as B after the matrix was made or rewritten.
    pub(crate) fn as_b<'m>(
        m: &'m DeviceMatrix,
        stream: &Arc<CudaStream>,
        kernels: &Preparers,
    ) -> Result<&'m Sm90Operand> {
        let op = Sm90Operand::of(m)?;
        if let Some(b) = &op.b_role {
            b.get_or_make(|| BRole::make(stream, &Source::of(m, kernels)))?;
        }
        Ok(op)
    }

    /// The B role's scales, where made ([`Self::as_b`]) or given.
    pub(crate) fn b_role(&self) -> Option<&BRole> {
        self.b_role.as_ref()?.get()
    }

    /// The B role's scales given with the operand, to rewrite (a fold's workspace).
    pub(crate) fn b_role_mut(&mut self) -> Option<&mut BRole> {
        self.b_role.as_mut()?.get_mut()
    }
}

/// The fp32 scale copies of the FP8 kernel's operands.
#[derive(Clone, Copy)]
enum Scales {
    /// A role, `[l][k/128][m_pad]`, zero in the padding rows (whole clusters of the tallest
    /// tiles: a cluster's last CTA may sit past M and still loads scales).
    A(u32),
    /// B role, `[l][⌈rows/128⌉][k/128]`: each 128 × 128 tile's scale (its first row's).
    B,
    /// B role per row (not constant over a 128-row tile: the epilogue's column scales),
    /// `[l][rows]`.
    Columns,
}

/// The re-layout of `d`'s scale values (times the tensor scale) into `s`.
fn scales_to(d: &MatrixDesc, s: Scales) -> GatherTo {
    let kb = d.k / BLOCK_K as usize;
    let (planes, rows_out, per, row_step) = match s {
        Scales::A(m_pad) => (kb, m_pad as usize, 1, 1),
        Scales::B => (1, d.rows.div_ceil(BLOCK_N as usize), kb, BLOCK_N as usize),
        Scales::Columns => (1, d.rows, 1, 1),
    };
    GatherTo {
        planes,
        rows_out,
        per,
        row_step,
        k_step: BLOCK_K as usize,
        values: true,
    }
}

/// Whether `d`'s B-role scales are per row (the epilogue's column scales; the tiles' all 1).
pub(crate) fn column_scales(d: &MatrixDesc) -> bool {
    unsupported(d, true).is_none() && per_row(d) && d.block_extent().0 < d.rows
}

impl Sm90Operand {
    /// The operand `data` (`l` × `rows` × `k` FP8 codes, K-major) with scales already in the
    /// kernel's layouts: A-role `sfa` `[l][k/128][m_pad]`, or B-role `sfb`
    /// `[l][⌈rows/128⌉][k/128]` (per 128 × 128) and optionally `sfb_col` `[l][rows]` (per row)
    /// ([`BRole`]), with their tensor maps.
    pub(crate) fn over(
        stream: &Arc<CudaStream>,
        data: &impl DevicePtr<u8>,
        (rows, k, l): (usize, usize, usize),
        sfa: Option<(CudaSlice<f32>, u32)>,
        b_role: Option<BRole>,
    ) -> Result<Self> {
        let sfa_map = match &sfa {
            Some((buf, m_pad)) => Some(a_scale_map(stream, buf, (*m_pad, k, l))?),
            None => None,
        };
        // (Row strides are multiples of 16 bytes: K % 128 == 0.)
        let (ptr, _g) = data.device_ptr(stream);
        Ok(Sm90Operand {
            tmaps: BoxMaps::new(ptr, code_layout([k, rows, l]), BOX_ROWS),
            sfa,
            sfa_map,
            a_later: None,
            b_role: b_role.map(OnFirstUse::made),
        })
    }
}

impl Sm90Operand {
    /// The tensor map whose boxes are `rows` rows ([`BOX_ROWS`]).
    pub(crate) fn tmap(&self, rows: u32) -> Result<HostMap> {
        self.tmaps.get(rows)
    }

    /// The A-role scales' tensor map, where the operand has A-role scales (made, where left for
    /// the first use as A, by [`Sm90Operand::as_a`]).
    pub(crate) fn sfa_map(&self) -> Result<Option<HostMap>> {
        let later = self.a_later.as_ref().and_then(|l| l.get()).map(|(_, m)| m);
        self.sfa_map
            .as_ref()
            .or(later)
            .map(LazyMap::get)
            .transpose()
    }
}

/// The box heights the operands' tensor maps are made for: every `Tile::a_box_rows` and
/// [`b_box_rows`] (a tile's width, and half of it for a pair along M).
pub(crate) const BOX_ROWS: [u32; 10] = [128, 64, 32, 16, 144, 160, 192, 72, 80, 96];

// The 64-row box serves both: a pair's half of a B tile and one consumer's A rows.
const _: () = assert!(BLOCK_N / MAX_CLUSTER == WG_ROWS);
/// Whether the operands have a tensor map with boxes of `rows` rows. (Only the compile-time check
/// below calls it, which the dead-code lint of the crate's oldest supported Rust does not count.)
#[allow(dead_code)]
const fn has_box(rows: u32) -> bool {
    let mut j = 0;
    while j < BOX_ROWS.len() {
        if BOX_ROWS[j] == rows {
            return true;
        }
        j += 1;
    }
    false
}
const _: () = {
    let mut i = 0;
    while i < Tile::ALL.len() {
        let t = Tile::ALL[i];
        assert!(has_box(t.a_box_rows(1)) && has_box(t.a_box_rows(MAX_CLUSTER)));
        if !t.is_swapped() {
            assert!(has_box(t.block_n) || t.block_n == 64);
            assert!(t.block_n < 128 || has_box(t.block_n / MAX_CLUSTER));
        }
        i += 1;
    }
};

/// FP8 codes of `dims` (K, rows, batch) as the kernels' maps read them: bytes, boxes of
/// [`ROW_BYTES`] of K (one 128-byte swizzle row).
pub(crate) fn code_layout(dims: [usize; 3]) -> MapLayout {
    let swizzle = Swizzle::CU_TENSOR_MAP_SWIZZLE_128B;
    (
        DataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
        dims,
        1,
        ROW_BYTES,
        swizzle,
    )
}

impl OperandCopy for Sm90Operand {
    /// `None` when the matrix can take neither role.
    fn make(up: &Upload<'_>) -> Result<Option<Self>> {
        let (stream, m, data) = (up.stream, up.matrix, up.data);
        let d = *m.desc();
        let (as_a, as_b) = (
            unsupported(&d, false).is_none(),
            unsupported(&d, true).is_none(),
        );
        if !as_a && !as_b {
            return Ok(None);
        }
        let m_pad = m_pad(d.rows as u32);
        let caller = as_a
            .then(|| caller_scales(m, &d, Scales::A(m_pad)))
            .flatten();
        // The caller's weights-like matrices (scales shared by rows) leave the A role for a
        // first use as A: a binding makes their view every call, as B.
        let later = as_a && caller.is_none() && d.block_extent().0 > 1;
        let later =
            later && matches!(m, Source::Device { scales, .. } if scales.read_only_raw().is_some());
        let sfa = match (as_a, caller, later) {
            (true, None, false) => {
                Some((m.gather(stream, scales_to(&d, Scales::A(m_pad)))?, m_pad))
            }
            _ => None,
        };
        let mut op = Sm90Operand::written(stream, &d, data, sfa)?;
        if later {
            op.a_later = Some(OnFirstUse::default());
        }
        if let Some(ptr) = caller {
            // (No copy: the map reads the caller's scales; `sfa` stays empty, so the families
            // that read the copy itself make their own.)
            op.sfa_map = Some(caller_sfa_map(ptr, &d));
        }
        Ok(Some(op))
    }

    /// Its scale copies for `m` (rewritten in place): the A role's made again in the same buffer
    /// where the writer did not rewrite them ([`Rewritten::sfa`]), the B role's at its next use.
    fn refresh(&mut self, re: &Rewrite<'_>) -> Result<bool> {
        let (stream, m) = (re.stream, re.matrix);
        let written = re.written;
        let d = *m.desc();
        if let Some((sfa, m_pad)) = &mut self.sfa
            && !written.sfa
        {
            m.gather_into(stream, scales_to(&d, Scales::A(*m_pad)), sfa)?;
        }
        if let Some(b) = &mut self.b_role {
            b.forget();
        }
        Ok(true)
    }
}

crate::held::held!(Sm90Operand: sfa, a_later, b_role);
crate::held::held!(BRole: sfb, sfb_col);

impl crate::held::Held for Sfb {
    fn device_bytes(&self) -> usize {
        match self {
            Sfb::Own(s) => crate::held::Held::device_bytes(s),
            Sfb::Caller(_) => 0,
        }
    }
}
