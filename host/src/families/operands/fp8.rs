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
use crate::tensor_map::{BoxMaps, DataType, MapLayout, Swizzle, encode_scale_rows};
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
    /// swizzle) in device memory: 128 rows (a wave; a 256-row A tile is two boxes); 64 (each CTA's
    /// share of a multicast B tile, 128 / MAX_CLUSTER, or one consumer's rows of a
    /// three-consumer A tile); 32 and 16 (the A tiles of swapped tiles).
    tmaps: BoxMaps,
    /// A-role scales `[l][k/128][m_pad]`, rows contiguous, zero-padded (None if not eligible as A).
    pub(crate) sfa: Option<(CudaSlice<f32>, u32)>,
    /// Their tensor map (boxes of `SFA_BOX` rows), when `sfa` is set.
    pub(crate) sfa_map: Option<CudaSlice<u8>>,
    /// The B role's scales (None if not eligible as B): made at the matrix's first use as B
    /// ([`Sm90Operand::as_b`]; activations quantized every step never pay for them), or given
    /// with the operand (a fold's).
    b_role: Option<OnFirstUse<BRole>>,
}

/// The FP8 kernel's B-role scales of one operand.
pub(crate) struct BRole {
    /// `[l][⌈rows/128⌉][k/128]`; all 1 when the scales are per row, which `sfb_col` then holds.
    pub(crate) sfb: CudaSlice<f32>,
    /// Per-row scales `[l][rows]`, when B is scaled per row over all of K.
    pub(crate) sfb_col: Option<CudaSlice<f32>>,
}

impl BRole {
    /// The B role's scales of `m` (eligible as B).
    fn make(stream: &Arc<CudaStream>, m: &Source<'_>) -> Result<Self> {
        let d = *m.desc();
        let (rows, k, l) = (d.rows, d.k, d.batch);
        Ok(if column_scales(&d) {
            let nb = rows.div_ceil(BLOCK_N as usize);
            BRole {
                sfb: crate::alloc::copy_of(stream, &vec![1f32; l * nb * (k / BLOCK_K as usize)])?,
                sfb_col: Some(m.gather(stream, scales_to(&d, Scales::Columns))?),
            }
        } else {
            BRole {
                sfb: m.gather(stream, scales_to(&d, Scales::B))?,
                sfb_col: None,
            }
        })
    }
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

    /// `m`'s operand (prepared for this family) with its B-role scales, made by `kernels` on
    /// `stream` at the first use as B after the matrix was made or rewritten.
    pub(crate) fn as_b<'m>(
        m: &'m DeviceMatrix,
        stream: &Arc<CudaStream>,
        kernels: &Preparers,
    ) -> Result<&'m Sm90Operand> {
        let op = m
            .prepared
            .get::<Sm90Operand>()
            .ok_or_else(|| Error::Format("operand was not prepared for the sm90 kernel".into()))?;
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
            Some((buf, m_pad)) => {
                let (ptr, _g) = buf.device_ptr(stream);
                let dims = (*m_pad as usize, k / BLOCK_K as usize, l);
                Some(encode_scale_rows(
                    stream,
                    ptr,
                    4,
                    dims,
                    family::SFA_BOX.rows(),
                )?)
            }
            None => None,
        };
        // (Row strides are multiples of 16 bytes: K % 128 == 0.)
        let (ptr, _g) = data.device_ptr(stream);
        Ok(Sm90Operand {
            tmaps: BoxMaps::new(ptr, code_layout([k, rows, l]), BOX_ROWS)?,
            sfa,
            sfa_map,
            b_role: b_role.map(OnFirstUse::made),
        })
    }
}

impl Sm90Operand {
    /// The tensor map whose boxes are `rows` rows ([`BOX_ROWS`]), in device memory (copied on
    /// `stream` at its first use).
    pub(crate) fn tmap(&self, stream: &Arc<CudaStream>, rows: u32) -> Result<&CudaSlice<u8>> {
        self.tmaps.get(stream, rows)
    }

    /// Every tensor map in device memory now (an operand prepared once: weights, a workspace's
    /// folded copy).
    pub(crate) fn make_maps(&self, stream: &Arc<CudaStream>) -> Result<()> {
        self.tmaps.make_all(stream).map(|_| ())
    }
}

/// The box heights the operands' tensor maps are made for: every `Tile::a_box_rows` and
/// [`b_box_rows`] (a tile's width, and half of it for a pair along M).
pub(crate) const BOX_ROWS: [u32; 10] = [128, 64, 32, 16, 144, 160, 192, 72, 80, 96];

/// The device bytes of the tensor maps [`Sm90Operand::over`] makes: one per box height, and one
/// over A-role scales (`a_role`).
pub(crate) fn operand_map_bytes(a_role: bool) -> usize {
    (BOX_ROWS.len() + a_role as usize) * std::mem::size_of::<cudarc::driver::sys::CUtensorMap>()
}

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
        let sfa = if as_a {
            let m_pad = m_pad(d.rows as u32);
            Some((m.gather(stream, scales_to(&d, Scales::A(m_pad)))?, m_pad))
        } else {
            None
        };
        Sm90Operand::written(stream, &d, data, sfa).map(Some)
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

crate::held::held!(Sm90Operand: tmaps, sfa, sfa_map, b_role);
crate::held::held!(BRole: sfb, sfb_col);
