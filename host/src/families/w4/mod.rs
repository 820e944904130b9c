//! Host side of the Hopper 4-bit-weights kernel (`kernels::sm90_w4`): which operand pairs it
//! takes, its configuration, what it keeps of each uploaded matrix (the weights reordered for
//! its register fragments, tensor maps, kernel-layout scales), and the launch.

use std::sync::Arc;

pub(crate) mod heuristic;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use crate::buffers::{DeviceMatrix, DeviceOutput, OnFirstUse, Prepared};
use crate::error::{Error, Result, config};
use crate::families::fold::Sm90MxFp8;
use crate::families::operands::Sm90Operand;
use crate::families::operands::fp8::caller_a_scales;
use crate::families::operands::mx::{MxOperand, kernel_scales, kernel_scales_to, scale_format};
use crate::families::operands::{CopyKind, OperandCopy, Rewrite, Upload};
use crate::families::persistent::{self, Loader};
use crate::families::{Families, Family, Gemm, PlanConfig, Sizing, computes_transposed};
use crate::format::{ElemType, ScaleBlock, ScaleType};
use crate::grouped::DeviceGroups;
use crate::matrix::{GemmShape, MatrixDesc};
use crate::prepare::{GatherTo, Preparers};
use crate::tensor_map::{DataType, HostMap, LazyMap, Swizzle, encode, scale_rows_map};
use crate::workspace::WorkspaceSize;
use blockscaled_kernels::gemm::layout::SMEM_LIMIT;
use blockscaled_kernels::gemm::scheduler::{ClusterShape, Schedule};
use blockscaled_kernels::sm90_w4::stream::{self, W4StreamKernel, W4StreamParams};
use blockscaled_kernels::sm90_w4::{
    self as family, A8_SCALE_K, Activation, BLOCK_K, SCALE_ROWS_PAD, Sm90W4Params, W4Tile,
    WEIGHT_ROW_BYTES, WEIGHT_ROWS,
};

/// Configuration of one launch (chosen by `plan::choose`, or forced through `Gpu::gemm_with`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Sm90W4Config {
    /// Activation rows per tile: 16 or 128 ([`W4Tile::ALL`]).
    pub tile: W4Tile,
    /// Scheduler band height in 128-row weight tiles: 1 to the number of weight tiles.
    pub group_m: u32,
    /// Persistent CTAs (≥ 1; at most one per SM is launched).
    pub ctas: u32,
    /// K split into this many ranges of 64-wide K blocks (1 to ⌈K / 64⌉).
    pub split_k: u32,
    /// The stream kernel (`kernels::sm90_w4::stream`: bf16 activations, M ≤ 16) instead of the
    /// pipelined one: a grid of ⌈N / 128⌉ × `split_k` × L CTAs, two per SM, each warp streaming
    /// its weight rows straight into registers; `tile`, `group_m` and `ctas` are not used.
    pub stream: bool,
    /// W4A8 with e8m0 weight scales on FP8 tensor cores (`kernels::sm90_w4::fp8`: the codes
    /// folded into e4m3 in the pipeline, FP8 `wgmma`, sums promoted to fp32 every 128 of K):
    /// tile of 128 activation rows, K a multiple of 128. Else the weights become bf16.
    pub fp8: bool,
}

crate::config::config_fields!(Sm90W4Config {
    tile: W4Tile => with_tile,
    group_m: u32 => with_group_m,
    ctas: u32 => with_ctas,
    split_k: u32 => with_split_k,
    stream: bool => with_stream,
    fp8: bool => with_fp8,
});

/// Whether the pair can run on the FP8-MMA kernel ([`Sm90W4Config::fp8`]): weights with e8m0
/// scales, K a multiple of 128, and e4m3 activations with fp32 scales per 1×128 or e2m1 ones with
/// the weights' scales (folded per call into that form, [`fp8_folds_a`]).
pub(crate) fn fp8_takes(a: &MatrixDesc, b: &MatrixDesc) -> bool {
    scale_format(b).and_then(family::fp8::kernel).is_some()
        && b.k.is_multiple_of(family::fp8::FP8_BLOCK_K as usize)
        && (activation(a, b) == Some(Activation::E4m3Row128) || fp8_folds_a(a, b))
}

/// Whether the FP8-MMA kernel takes the pair with A folded per call (e2m1 activations with the
/// weights' e8m0 scales: the fold pre-pass writes them as e4m3 with fp32 scales per 1×128, exact
/// where each 128 of a row spans at most 2^14 and no element falls below e4m3's normal range
/// after its shift, `format::fold`); the weights stay 4-bit.
pub(crate) fn fp8_folds_a(a: &MatrixDesc, b: &MatrixDesc) -> bool {
    activation(a, b) == Some(Activation::Fp4)
        && scale_format(b).and_then(family::fp8::kernel).is_some()
        && Sm90MxFp8::folds(a)
}

/// The activations' kind for A, if the kernel takes it beside weights of scale format `b`.
fn activation(a: &MatrixDesc, b: &MatrixDesc) -> Option<Activation> {
    let f = &a.format;
    match (f.elem, f.scale, f.block) {
        (ElemType::BF16, ScaleType::F32, ScaleBlock::PerTensor) => Some(Activation::Bf16),
        (
            ElemType::E4M3,
            ScaleType::F32,
            ScaleBlock::Tile {
                rows: 1,
                k: A8_SCALE_K,
            },
        ) => Some(Activation::E4m3Row128),
        (ElemType::E2M1, _, _)
            if scale_format(a).is_some() && scale_format(a) == scale_format(b) =>
        {
            Some(Activation::Fp4)
        }
        _ => None,
    }
}

/// Why the pair cannot go through the sm90 4-bit-weights kernel (`None`: it can).
pub(crate) fn unsupported_pair(a: &MatrixDesc, b: &MatrixDesc) -> Option<String> {
    let fb = &b.format;
    let Some(scale) = scale_format(b).filter(|_| fb.elem == ElemType::E2M1) else {
        return Some(format!(
            "{fb}: the sm90 4-bit-weights kernel takes e2m1 weights with e8m0 scales per 1×32 or \
             1×16 or ue4m3 scales per 1×16"
        ));
    };
    if !b.k.is_multiple_of(scale.block as usize) {
        return Some(format!(
            "K = {} is not a multiple of the scale block {}",
            b.k, scale.block
        ));
    }
    let Some(act) = activation(a, b) else {
        return Some(format!(
            "{}: the sm90 4-bit-weights kernel takes bf16 activations, e4m3 with fp32 scales per \
             1×128, or e2m1 with the weights' scales ({fb})",
            a.format
        ));
    };
    // TMA row strides are multiples of 16 bytes.
    let row_bytes = a.k * act.bits() as usize / 8;
    if !row_bytes.is_multiple_of(16) {
        return Some(format!(
            "{}: a row of K = {} is not a multiple of 16 bytes (TMA), so K must be a multiple of {}",
            a.format,
            a.k,
            128 / act.bits()
        ));
    }
    None
}

/// The FP8 family's A-role scales of the same matrix, where this family can read them as its
/// W4A8 activation scales: the raw fp32 scales (a tensor scale of 1, which the FP8 layout's values
/// would otherwise include), per 1×128.
fn fp8_a_role<'p>(made: &'p Prepared, d: &MatrixDesc) -> Option<(&'p CudaSlice<f32>, u32)> {
    if d.tensor_scale != 1.0 {
        return None;
    }
    let (sfa, m_pad) = made.get::<Sm90Operand>()?.sfa.as_ref()?;
    Some((sfa, *m_pad))
}

/// W4A8 activations' scales: fp32 `[l][⌈k/128⌉][rows_pad]`, zero past the rows.
fn a8_scales_to(d: &MatrixDesc) -> GatherTo {
    GatherTo {
        planes: d.k.div_ceil(A8_SCALE_K as usize),
        rows_out: d.rows.next_multiple_of(SCALE_ROWS_PAD as usize),
        per: 1,
        row_step: 1,
        k_step: A8_SCALE_K as usize,
        values: false,
    }
}

/// Where W4A8 activations' fp32 scales are, and their rows ([`W4Operand::a8_scales`]).
enum A8Scales<'p> {
    Own(&'p CudaSlice<u8>, u32),
    Fp8(&'p CudaSlice<f32>, u32),
    /// The caller's memory by address (ordered by the stream alone).
    Caller(u64, u32),
}

/// What the kernel keeps of an e2m1 matrix in the weights' role.
struct Weights {
    /// The reordered codes (`kernels::sm90_w4::stored_chunk`), and their map (boxes of one
    /// chunk of 128 rows: 8 groups × 16 rows × 32 bytes).
    data: CudaSlice<u8>,
    tmap: HostMap,
    /// e8m0 scales, where the matrix has no MX family copy (whose row tops [`row_tops`] reads):
    /// each row's largest non-NaN scale byte over all of K, `[l][rows_pad]` (the FP8-MMA
    /// kernel's fold reference).
    tops: Option<CudaSlice<u8>>,
}

impl Weights {
    /// `m`'s codes reordered for the weights' role by `kernels`: each row's 64-K chunks
    /// reordered (`weight_k`), K padded with zeros to a multiple of 64, rows stored in groups of
    /// 16 chunk by chunk (the last group padded with zero rows).
    fn make(stream: &Arc<CudaStream>, m: &DeviceMatrix, kernels: &Preparers) -> Result<Self> {
        let (rows, k, l) = (m.desc.rows, m.desc.k, m.desc.batch);
        let chunks = k.div_ceil(BLOCK_K as usize);
        let data = kernels.w4_reorder(stream, m, chunks)?;
        let (wptr, _wg) = data.device_ptr(stream);
        // [bytes of a row's chunk][rows of a group][chunks][groups of every batch entry]: a
        // tile's box is one chunk of 8 groups, 128 rows × 32 bytes in shared memory.
        let group = family::GROUP_ROWS as u64;
        let groups = (rows.div_ceil(group as usize) * l) as u64;
        let row = WEIGHT_ROW_BYTES as u64;
        let tmap = encode(
            wptr,
            DataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            &[row, group, chunks as u64, groups],
            &[row, row * group, row * group * chunks as u64],
            &[
                WEIGHT_ROW_BYTES,
                family::GROUP_ROWS,
                1,
                WEIGHT_ROWS / family::GROUP_ROWS,
            ],
            Swizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
        )?;
        drop(_wg);
        let e8m0 = scale_format(&m.desc)
            .and_then(family::fp8::kernel)
            .is_some();
        let tops = match e8m0 && m.prepared.get::<MxOperand>().is_none() {
            true => {
                let rows_pad = rows.next_multiple_of(SCALE_ROWS_PAD as usize);
                Some(kernels.row_tops(stream, m, rows_pad)?)
            }
            false => None,
        };
        Ok(Weights { data, tmap, tops })
    }
}

/// The weights' row tops for the FP8-MMA kernels: the MX family's of the same matrix where it
/// keeps its copy (made once and shared with the fold's B role; the same `[l][rows_pad]`
/// layout), else the reordered weights' own.
fn row_tops<'m>(
    stream: &Arc<CudaStream>,
    m: &'m DeviceMatrix<'m>,
    w: &'m Weights,
    kernels: &Preparers,
) -> Result<&'m CudaSlice<u8>> {
    match MxOperand::row_tops_of(m, stream, kernels) {
        Some(tops) => tops,
        None => w.tops.as_ref().ok_or_else(|| {
            Error::Format("the weights' row tops were not made (no e8m0 scales)".into())
        }),
    }
}

/// What the kernel needs of one uploaded matrix, made at upload time.
struct W4Operand {
    /// e2m1: the weights' role, made when a GEMM first takes the matrix as weights (an
    /// activation quantized every step never pays for the reorder).
    weights: Option<OnFirstUse<Weights>>,
    /// Activation maps for tiles of 16 rows (boxes of [`family::act_box_rows`]) and of 128.
    /// Every map here is encoded at its first use (a call reads one or two).
    tmap_16: LazyMap,
    tmap_128: LazyMap,
    /// e4m3 activations: the map of the FP8-MMA kernel (boxes of 128 bytes × 128 rows, 128-byte
    /// swizzle, as `wgmma` reads them).
    tmap_fp8: Option<LazyMap>,
    /// e2m1: the MX kernel-layout scale bytes (none where `mx_scales`); e4m3: fp32
    /// `[l][⌈k/128⌉][rows_pad]` (none where `fp8_scales`); bf16: none.
    scales: Option<CudaSlice<u8>>,
    rows_pad: u32,
    /// The scales' tensor maps in the activation role, for tiles of 16 and of 128 rows (boxes
    /// of [`family::act_scale_rows`]; a tile may start at any row); none for bf16.
    scale_maps: Option<[LazyMap; 2]>,
    /// W4A8 activations whose scales are the caller's, read in place (their address and
    /// values per K plane, `operands::fp8::caller_a_scales`): neither `scales` nor the FP8
    /// family's.
    caller_scales: Option<(u64, u32)>,
    /// W4A8 activations whose scale maps read the FP8 family's A-role scales of the same
    /// matrix (`Sm90Operand::sfa`, `[l][k/128][m_pad]`: this layout with `m_pad` rows) rather
    /// than `scales`. Both live in the matrix's one `Prepared`, so the buffer outlives the maps.
    fp8_scales: bool,
    /// e2m1 matrices whose scale layout is the MX family's copy of the same matrix
    /// (`MxOperand`'s: the same layout, which the device quantizers write in place) rather
    /// than `scales`: one copy made and refreshed, not two. Both live in the matrix's one
    /// `Prepared`, so the buffer outlives the maps.
    mx_scales: bool,
    /// bf16: the per-tensor scale every batch entry shares (else the kernel does not take it).
    uniform_scale: Option<f32>,
}

impl W4Operand {
    /// bf16 activations' one scale (every batch entry's).
    fn bf16_scale(&self) -> Result<f32> {
        self.uniform_scale.ok_or_else(|| {
            Error::Format(
                "bf16 activations whose batch entries have different scales: the sm90 \
                 4-bit-weights kernel takes one scale for all"
                    .into(),
            )
        })
    }

    /// W4A8 activations' fp32 scales `[l][⌈k/128⌉][rows]` and their rows: its own copy, or the
    /// FP8 family's A-role scales of the same matrix (`fp8_scales`; `prepared` and `d` are the
    /// matrix's).
    fn a8_scales<'p>(&'p self, prepared: &'p Prepared, d: &MatrixDesc) -> Result<A8Scales<'p>> {
        if let Some((ptr, pitch)) = self.caller_scales {
            return Ok(A8Scales::Caller(ptr, pitch));
        }
        match (&self.scales, self.fp8_scales) {
            (Some(s), false) => Ok(A8Scales::Own(s, self.rows_pad)),
            _ => fp8_a_role(prepared, d)
                .map(|(sfa, m_pad)| A8Scales::Fp8(sfa, m_pad))
                .ok_or_else(|| {
                    Error::Format("the activations' fp32 scales were not prepared".into())
                }),
        }
    }

    /// The scale bytes its maps read, where they are one-byte (e2m1) or its own fp32 copy: its
    /// own buffer, or the MX family's layout of the same matrix (`mx_scales`; `prepared` is the
    /// matrix's).
    fn scales_in<'p>(&'p self, prepared: &'p Prepared) -> Option<&'p CudaSlice<u8>> {
        match (&self.scales, self.mx_scales) {
            (Some(s), _) => Some(s),
            (None, true) => MxOperand::layout_scales(prepared),
            (None, false) => None,
        }
    }
}

// A folded per call ([`fp8_folds_a`]) is read through the FP8 family's maps: its 128-row code
// boxes are the kernel's activation tile, and its scale boxes the kernel's activation scale box.
const _: () = {
    let ours = family::act_scale_box(family::fp8::FP8_TILE, Activation::E4m3Row128, 32);
    let fp8 = blockscaled_kernels::sm90::SFA_BOX;
    assert!(family::fp8::FP8_TILE.n == 128 && family::fp8::FP8_BLOCK_K == 128);
    match ours {
        Some(b) => assert!(b.entry == fp8.entry && b.rows() == fp8.rows()),
        None => panic!("W4A8 activations have a scale box"),
    }
};

/// One loaded kernel.
type Kernel = persistent::Kernel<family::Sm90W4Kernel>;

/// The stream kernel's checks beside the shape's (`validate` with `stream`): at most
/// [`stream::MAX_M`] activation rows, a split of whole chunks of K, a grid within the launch
/// limits, and staged activations that fit shared memory.
fn validate_stream(split_k: u32, s: &GemmShape) -> Result<()> {
    if s.m > stream::MAX_M as usize {
        return Err(config(format!(
            "the 4-bit-weights stream kernel takes at most {} activation rows, not M = {}",
            stream::MAX_M,
            s.m
        )));
    }
    let chunks = s.k.div_ceil(stream::CHUNK_K as usize);
    crate::splitk::check_split(split_k, chunks, stream::CHUNK_K, s.k)?;
    crate::splitk::validate(s, split_k)?;
    let tiles = s.n.div_ceil(stream::ROWS as usize);
    if tiles > i32::MAX as usize || s.l > 65_535 || split_k > 65_535 || s.m == 0 {
        return Err(crate::error::shape(format!(
            "{}x{}x{}x{}: outside the stream kernel's grid ({tiles} tiles of {} rows, split              {split_k}, batch {}; at most 2³¹ − 1, 65535 and 65535)",
            s.m,
            s.n,
            s.k,
            s.l,
            stream::ROWS,
            s.l
        )));
    }
    // (The activations' format is not known here.)
    let smem = stream::smem_bytes_any(s.m as u32, chunks as u32, split_k);
    if smem > SMEM_LIMIT {
        return Err(config(format!(
            "split_k = {split_k}: a K range of {} values of {} activation rows needs {smem} bytes \
             of shared memory (at most {SMEM_LIMIT}): split K further",
            chunks.div_ceil(split_k as usize) * stream::CHUNK_K as usize,
            stream::staged_rows(s.m as u32)
        )));
    }
    Ok(())
}

/// The sm90 4-bit-weights family on one GPU.
pub(crate) struct Sm90W4 {
    kernels: Vec<Kernel>,
    /// The stream kernels, each with its function (shared memory raised to the limit).
    stream: Vec<(&'static W4StreamKernel, cudarc::driver::CudaFunction)>,
    /// For the weights' reorder, made at a matrix's first use as weights.
    preparers: Preparers,
}

impl Family for Sm90W4 {
    fn prepare_weights(&self, stream: &Arc<CudaStream>, m: &DeviceMatrix<'_>) -> Result<()> {
        if let Some(Some(w)) = m.prepared.get::<W4Operand>().map(|o| &o.weights) {
            w.get_or_make(|| Weights::make(stream, m, &self.preparers))?;
        }
        Ok(())
    }

    fn operand_copy(&self) -> Option<CopyKind> {
        Some(CopyKind::of::<W4Operand>())
    }
}

/// The schedule of a GEMM of `shape` with `cfg`: the kernel's own function (tiles of the
/// weights' rows, C's N, by the activations' rows, C's M).
fn dense_schedule(cfg: &Sm90W4Config, shape: GemmShape, groups: Option<&DeviceGroups>) -> Schedule {
    let groups = DeviceGroups::unplaced_or_dense(groups);
    let split = (cfg.split_k, cfg.group_m);
    cfg.tile
        .schedule_k(shape.dims(), split, groups, cfg.block_k())
}

impl Sm90W4Config {
    /// Whether its kernel reads `a` folded per call ([`fp8_folds_a`]: the FP8-MMA and the stream
    /// kernels take e2m1 activations so).
    fn folds_a(&self, a: &MatrixDesc, b: &MatrixDesc) -> bool {
        (self.fp8 || self.stream) && fp8_folds_a(a, b)
    }

    /// K per stage of the pipelined kernel it runs.
    fn block_k(&self) -> u32 {
        if self.fp8 {
            family::fp8::FP8_BLOCK_K
        } else {
            BLOCK_K
        }
    }
}

impl PlanConfig for Sm90W4Config {
    /// Checks every field against the kernel and `s` ([`Error::Config`]) and the shape against
    /// the kernel's 32-bit indexing ([`Error::Shape`]). The launch trusts what passes.
    fn validate(&self, s: &GemmShape) -> Result<()> {
        if self.stream {
            if self.fp8 {
                return Err(config("fp8 and stream: the stream kernel has no FP8 MMAs"));
            }
            return validate_stream(self.split_k, s);
        }
        if self.fp8 {
            let fp8 = family::fp8::FP8_TILE;
            if self.tile != fp8 {
                return Err(config(format!(
                    "fp8 with a tile of {} activation rows: the FP8-MMA kernel has {}",
                    self.tile.n, fp8.n
                )));
            }
            if !s.k.is_multiple_of(family::fp8::FP8_BLOCK_K as usize) {
                return Err(crate::error::shape(format!(
                    "K = {} is not a multiple of {}: the FP8-MMA 4-bit-weights kernel's stages \
                     are whole activation scale blocks",
                    s.k,
                    family::fp8::FP8_BLOCK_K
                )));
            }
        }
        // Weight rows along the band, activation rows across it.
        let rows = self.tile.n;
        if !W4Tile::ALL.contains(&self.tile) {
            let kernel = "the sm90 4-bit-weights kernel has 16 and 128";
            return Err(config(format!("tile of {rows} activation rows: {kernel}")));
        }
        let tiles = (
            s.n.div_ceil(WEIGHT_ROWS as usize),
            s.m.div_ceil(rows as usize),
        );
        let fields = (self.group_m, self.ctas, self.split_k);
        persistent::validate_schedule(s, tiles, self.block_k(), fields)
    }

    fn unsupported(&self, a: &MatrixDesc, b: &MatrixDesc) -> Option<String> {
        unsupported_pair(a, b)
    }

    fn grouped_split(&self) -> Option<u32> {
        Some(self.split_k)
    }

    /// Split K's buffers.
    fn workspace(&self, q: &Sizing<'_>) -> Result<WorkspaceSize> {
        let run = if !self.stream {
            let schedule = dense_schedule(self, q.shape, q.groups);
            WorkspaceSize::split_k(&schedule, ClusterShape::ONE, self.split_k > 1)?
        } else if self.split_k > 1 {
            let (n, l) = (q.shape.n as u32, q.shape.l as u32);
            let (floats, counters) = stream::workspace(n, l, self.split_k);
            WorkspaceSize::split(floats, counters)?
        } else {
            WorkspaceSize::default()
        };
        // And A's folded copy where the kernel reads A folded.
        if self.folds_a(&q.a.desc, &q.b.desc) {
            let fold = Sm90MxFp8::a_workspace(q.a)?.fold;
            return Ok(WorkspaceSize { fold, ..run });
        }
        Ok(run)
    }

    /// None: the kernel computes Cᵀ.
    fn fused_columns(&self) -> Result<u32> {
        Err(computes_transposed(self))
    }

    fn launch(&self, families: &Families, g: Gemm<'_, '_>) -> Result<()> {
        let what = "sm90 4-bit-weights kernel (it needs compute capability 9.0)";
        let w4 = families.require::<Sm90W4>(what)?;
        if self.folds_a(&g.a.desc, &g.b.desc) {
            let what = "MX → FP8 fold kernel (it needs compute capability 9.0)";
            let fold = families.require::<Sm90MxFp8>(what)?;
            let ctx = (g.stream, g.work);
            return fold.with_folded_a(ctx, g.a, |data, op| w4.gemm(g, *self, Some((data, op))));
        }
        w4.gemm(g, *self, None)
    }
}

impl Sm90W4 {
    /// Loads the kernels when the module built for `target` has them.
    pub(crate) fn load(cx: &Loader) -> Result<Option<Self>> {
        let rows = family::KERNELS.iter().chain(family::fp8::KERNELS);
        let Some(kernels) = cx.kernels_of(rows, false)? else {
            return Ok(None);
        };
        let preparers = cx.preparers.clone();
        let stream = stream::KERNELS
            .iter()
            .map(|k| {
                Ok((
                    k,
                    crate::launch::load_kernel(cx.module, k.info.name, SMEM_LIMIT)?,
                ))
            })
            .collect::<Result<_>>()?;
        Ok(Some(Sm90W4 {
            kernels,
            stream,
            preparers,
        }))
    }

    /// C = A · Bᵀ (computed as Cᵀ = B · Aᵀ) with `cfg` (validated for `g.shape`): one launch,
    /// split K included. `folded`: A folded to e4m3 with fp32 scales per 1×128, its codes and its
    /// FP8 operand (e2m1 activations on the FP8-MMA or the stream kernel, [`fp8_folds_a`]), which
    /// the kernel then reads in A's place.
    pub(crate) fn gemm(
        &self,
        g: Gemm<'_, '_>,
        cfg: Sm90W4Config,
        folded: Option<(&CudaSlice<u8>, &Sm90Operand)>,
    ) -> Result<()> {
        if g.epi.is_some() {
            return Err(config(
                "the 4-bit-weights kernel computes Cᵀ: it has no fused epilogue (the sm90 MX \
                 kernel has)",
            ));
        }
        let act = activation(&g.a.desc, &g.b.desc).expect("checked by `unsupported_pair`");
        let scale = scale_format(&g.b.desc).expect("checked by `unsupported_pair`");
        if cfg.stream {
            return self.stream_gemm(g, cfg, (act, scale), folded);
        }
        let (stream, work, shape, groups) = (g.stream, g.work, g.shape, g.groups);
        let (a, b, c) = (g.a, g.b, g.c);
        let GemmShape { m, n, k, l } = shape;
        if cfg.fp8 && (!fp8_takes(&a.desc, &b.desc) || (act == Activation::Fp4) != folded.is_some())
        {
            return Err(config(format!(
                "fp8: the FP8-MMA 4-bit-weights kernel takes weights with e8m0 scales and e4m3 \
                 activations with fp32 scales per 1×128 or e2m1 ones with the weights' scales, \
                 folded per call, K a multiple of 128 ({} × {})",
                a.desc.format, b.desc.format
            )));
        }
        let def = match cfg.fp8 {
            true => family::fp8::kernel(scale),
            false => family::kernel(cfg.tile, act, scale),
        };
        let kernel = persistent::find(&self.kernels, def, || {
            config(format!("no sm90 4-bit-weights kernel for {:?}", cfg.tile))
        })?;
        let (ao, bo, w, wscales) = self.prepared(stream, a, b)?;
        let tops = match cfg.fp8 {
            true => Some(row_tops(stream, b, w, &self.preparers)?),
            false => None,
        };
        let a_scale = match act {
            Activation::Bf16 => ao.bf16_scale()?,
            _ => 1.0,
        };
        let mut slot = work.splitk.slot(cfg.split_k);
        let DeviceOutput {
            buf: out, dtype, ..
        } = c;
        let schedule = dense_schedule(&cfg, shape, groups);
        let grid = (cfg.ctas, ClusterShape::ONE);
        let (mut launch, run) =
            kernel.persistent(stream, &schedule, grid, groups, slot.as_mut())?;
        // The FP8 family's A-role scales, where the maps read them (`W4Operand::fp8_scales`).
        let a8_shared = match ao.fp8_scales {
            true => Some(
                fp8_a_role(&a.prepared, &a.desc)
                    .map(|s| s.0)
                    .ok_or_else(|| {
                        Error::Format("the activations' FP8 scales were not prepared".into())
                    })?,
            ),
            false => None,
        };
        // A folded per call: its codes' map and its scales' (boxes of 128 rows, as the
        // kernel's activation tile and scale box: checked at compile time above).
        let folded = match folded {
            Some((data, op)) => {
                let (Some((sfa, _)), Some(map)) = (&op.sfa, op.sfa_map()?) else {
                    return Err(Error::Format("A's fold has no 1×128 scales".into()));
                };
                Some((data, op.tmap(family::fp8::FP8_TILE.n)?, sfa, map))
            }
            None => None,
        };
        let tmap_x = match (cfg.fp8, &ao.tmap_fp8, folded) {
            (true, _, Some((_, map, _, _))) => map,
            (true, Some(map), None) => map.get()?,
            (true, None, None) => {
                return Err(Error::Format(
                    "the activations were not prepared for FP8 MMAs".into(),
                ));
            }
            _ if cfg.tile.n == 16 => ao.tmap_16.get()?,
            _ => ao.tmap_128.get()?,
        };
        let scale_map = match &ao.scale_maps {
            Some([m16, m128]) => Some(if cfg.tile.n == 16 { m16 } else { m128 }.get()?),
            None => None,
        };
        let params = Sm90W4Params {
            tmap_w: {
                launch.ptr(&w.data);
                launch.map(w.tmap)?
            },
            tmap_x: launch.map(tmap_x)?,
            sfw: launch.ptr(wscales),
            tmap_sx: match (folded, scale_map, ao.scales_in(&a.prepared), a8_shared) {
                (Some((data, _, sfa, map)), ..) => {
                    // (The codes and scales its maps read.)
                    let _ = launch.ptr(data);
                    let _ = launch.ptr(sfa);
                    launch.map(map)?
                }
                (None, Some(map), Some(sx), _) => {
                    // The maps' buffer is read too.
                    let _ = launch.ptr(sx);
                    launch.map(map)?
                }
                (None, Some(map), None, Some(sfa)) => {
                    let _ = launch.ptr(sfa);
                    launch.map(map)?
                }
                // (The caller's scales by address: ordered by the stream alone.)
                (None, Some(map), None, None) if ao.caller_scales.is_some() => launch.map(map)?,
                _ => 0,
            },
            out: launch.ptr_mut(out),
            tops: tops.map_or(0, |t| launch.ptr(t)),
            splitk: run.splitk,
            m: m as u32,
            n: n as u32,
            k: k as u32,
            l: l as u32,
            rows_pad_w: bo.rows_pad,
            _pad: 0,
            out_type: *dtype as u32,
            group_m: cfg.group_m,
            split_k: cfg.split_k,
            // (A's fold multiplies its tensor scale into its scales.)
            alpha: a_scale
                * if folded.is_some() {
                    1.0
                } else {
                    a.desc.tensor_scale
                }
                * b.desc.tensor_scale,
            groups: run.groups,
        };
        // Keep the reordered weights alive and ordered with the launch.
        let _ = launch.ptr(&w.data);
        // SAFETY: `cfg` was validated for this shape (grouped: no split, `groups` holds `count`
        // int32 values on this GPU); the maps cover the live data of the
        // prepared operands (weights reordered with K padded to 64) with boxes of the tile's rows;
        // the scale buffers hold whole padded tiles of rows and stages of K; the output holds
        // l·m·n elements of `out_type` (and `run.splitk` is sized for the schedule).
        let _gemm = unsafe { launch.launch(&params) }?;
        Ok(())
    }
}

impl Sm90W4 {
    /// The two operands' copies for this family, and B's weights role (made at its first use as
    /// weights) with its scale bytes.
    fn prepared<'m>(
        &self,
        stream: &Arc<CudaStream>,
        a: &'m DeviceMatrix<'m>,
        b: &'m DeviceMatrix<'m>,
    ) -> Result<(&'m W4Operand, &'m W4Operand, &'m Weights, &'m CudaSlice<u8>)> {
        let (Some(ao), Some(bo)) = (a.prepared.get::<W4Operand>(), b.prepared.get::<W4Operand>())
        else {
            return Err(Error::Format(
                "operands were not prepared for the sm90 4-bit-weights kernel".into(),
            ));
        };
        let (Some(w), Some(wscales)) = (&bo.weights, bo.scales_in(&b.prepared)) else {
            return Err(Error::Format("B was not prepared as 4-bit weights".into()));
        };
        let w = w.get_or_make(|| Weights::make(stream, b, &self.preparers))?;
        Ok((ao, bo, w, wscales))
    }

    /// [`Sm90W4::gemm`] on the stream kernel (`cfg.stream`, validated for `g.shape`): one launch
    /// of ⌈N / 128⌉ × `split_k` × L CTAs.
    fn stream_gemm(
        &self,
        g: Gemm<'_, '_>,
        cfg: Sm90W4Config,
        (act, scale): (Activation, blockscaled_kernels::format::MxScale),
        folded: Option<(&CudaSlice<u8>, &Sm90Operand)>,
    ) -> Result<()> {
        let (stream, work, shape) = (g.stream, g.work, g.shape);
        let (a, b, c) = (g.a, g.b, g.c);
        let GemmShape { m, n, k, l } = shape;
        // A folded per call reads as e4m3 activations with fp32 scales per 1×128.
        let act = if folded.is_some() {
            Activation::E4m3Row128
        } else {
            act
        };
        if !stream::takes(act) || g.groups.is_some() {
            return Err(config(
                "the 4-bit-weights stream kernel takes bf16 or e4m3 (1×128 scales) activations \
                 in a dense GEMM",
            ));
        }
        let Some((_, func)) = self
            .stream
            .iter()
            .find(|(d, _)| d.act == act && d.scale == scale)
        else {
            return Err(config(format!(
                "no 4-bit-weights stream kernel for {act:?} activations and {scale:?}"
            )));
        };
        let (ao, bo, w, wscales) = self.prepared(stream, a, b)?;
        // bf16: the activations' one scale; e4m3: their fp32 scales per 1×128 (own copy, the
        // FP8 family's, or A's fold's, with its rows), and 2^6 for the weight codes' e4m3
        // offset; A's tensor scale (which a fold multiplies into its scales).
        let (a_scale, sx) = match (act, folded) {
            (_, Some((_, op))) => match &op.sfa {
                Some((sfa, m_pad)) => (64.0, Some(A8Scales::Fp8(sfa, *m_pad))),
                None => return Err(Error::Format("A's fold has no 1×128 scales".into())),
            },
            (Activation::Bf16, None) => (ao.bf16_scale()? * a.desc.tensor_scale, None),
            (_, None) => (
                64.0 * a.desc.tensor_scale,
                Some(ao.a8_scales(&a.prepared, &a.desc)?),
            ),
        };
        let (m, n, k, l) = (m as u32, n as u32, k as u32, l as u32);
        let chunks = k.div_ceil(stream::CHUNK_K);
        let split = cfg.split_k;
        let mut slot = work.splitk.slot(split);
        let DeviceOutput {
            buf: out, dtype, ..
        } = c;
        let mut launch = crate::launch::Launch::new(stream, func)
            .grid(n.div_ceil(stream::ROWS), split, l)
            .block(stream::THREADS, 1, 1)
            .shared_mem(stream::smem_bytes(act, m, chunks, split));
        let sizes = stream::workspace(n, l, split);
        let splitk =
            crate::splitk::SplitK::params_sized(&mut launch, slot.as_mut(), stream, sizes)?;
        let (sx, sx_rows) = match sx {
            Some(A8Scales::Own(buf, rows)) => (launch.ptr(buf), rows),
            Some(A8Scales::Fp8(buf, rows)) => (launch.ptr(buf), rows),
            Some(A8Scales::Caller(ptr, rows)) => (ptr, rows),
            None => (0, 0),
        };
        let params = W4StreamParams {
            w: launch.ptr(&w.data),
            sfw: launch.ptr(wscales),
            x: match folded {
                Some((data, _)) => launch.ptr(data),
                None => launch.ptr(&a.data),
            },
            sx,
            out: launch.ptr_mut(out),
            splitk,
            m,
            n,
            k,
            l,
            chunks,
            rows_pad: bo.rows_pad,
            split,
            out_type: *dtype as u32,
            alpha: a_scale * b.desc.tensor_scale,
            sx_rows,
        };
        // SAFETY: `cfg` was validated for this shape (M ≤ 16, 1 ≤ split ≤ chunks, the grid and
        // shared memory within limits); the reordered weights hold l·n rows of `chunks · 32`
        // bytes and their scales the MX layout of `rows_pad` rows; the activations are l·m·k
        // bf16 values or e4m3 codes (A's, with tensor maps made over them, or A's fold's, an
        // allocation of its own) at a 16-byte-aligned address with rows of a multiple of 16
        // bytes (`unsupported_pair`; a fold's K is a multiple of 128), e4m3's scales fp32
        // `[l][⌈k/128⌉][sx_rows ≥ m]`; the output holds l·m·n elements of `out_type`; the
        // workspace is sized by `stream::workspace` with its counters zero.
        let _gemm = unsafe { launch.launch(&params) }?;
        Ok(())
    }
}

impl OperandCopy for W4Operand {
    fn make(up: &Upload<'_>) -> Result<Option<Self>> {
        let (stream, m, data) = (up.stream, up.matrix, up.data);
        let made = up.made;
        let d = *m.desc();
        let f = &d.format;
        let (rows, k, l) = (d.rows, d.k, d.batch);
        let rows_pad = rows.next_multiple_of(SCALE_ROWS_PAD as usize);
        let (ptr, _g) = data.device_ptr(stream);
        let bits = f.elem.bits() as usize;
        if !(k * bits / 8).is_multiple_of(16) {
            return Ok(None);
        }
        let code_map = |box_rows: u32| {
            let none = Swizzle::CU_TENSOR_MAP_SWIZZLE_NONE;
            let dims = [k * bits / 8, rows, l];
            let layout = (
                DataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
                dims,
                1,
                BLOCK_K * bits as u32 / 8,
                none,
            );
            LazyMap::new(ptr, layout, box_rows)
        };
        let (mut weights, mut scales, mut uniform_scale) = (None, None, None);
        let (mut fp8_scales, mut mx_scales, mut caller_scales) = (false, false, None);
        // The activation role's scale maps: entries of `entry` bytes, `rows` per plane, `planes`
        // per batch entry.
        let scale_maps = |sp: u64, act: Activation, block: u32, (rows, planes): (usize, usize)| {
            let entry = act.scale_bytes(block) as usize;
            let map = |tile| {
                let box_rows = family::act_scale_rows(tile, act, block);
                scale_rows_map(sp, entry, (rows, planes, l), box_rows)
            };
            Ok::<_, crate::Error>([map(W4Tile::N16)?, map(W4Tile::N128)?])
        };
        let (mut maps, mut tmap_fp8) = (None, None);
        let (tmap_16, tmap_128) = match (f.elem, f.scale, f.block) {
            (ElemType::E2M1, _, _) => {
                let Some(scale) = scale_format(&d) else {
                    return Ok(None);
                };
                // The MX family's copy of this layout where the matrix has one (read it, no copy
                // of our own), else our own.
                let sp = match MxOperand::layout_scales(made) {
                    Some(buf) => {
                        mx_scales = true;
                        buf.device_ptr(stream).0
                    }
                    None => {
                        let buf = scales.insert(kernel_scales(stream, m, scale)?.0);
                        buf.device_ptr(stream).0
                    }
                };
                let stages = k.div_ceil(BLOCK_K as usize);
                maps = Some(scale_maps(
                    sp,
                    Activation::Fp4,
                    scale.block,
                    (rows_pad, stages),
                )?);
                weights = Some(OnFirstUse::default());
                let rows16 = family::act_box_rows(W4Tile::N16, Activation::Fp4);
                (code_map(rows16), code_map(128))
            }
            (
                ElemType::E4M3,
                ScaleType::F32,
                ScaleBlock::Tile {
                    rows: 1,
                    k: A8_SCALE_K,
                },
            ) => {
                // fp32 `[l][⌈k/128⌉][rows_pad]`, zero past the rows.
                let chunks = k.div_ceil(A8_SCALE_K as usize);
                let act = Activation::E4m3Row128;
                match (fp8_a_role(made, &d), caller_a_scales(m, &d)) {
                    // The FP8 family's A-role scales are this layout with `m_pad` rows (what
                    // the device quantizers write in place): read them, no copy of our own.
                    (Some((sfa, m_pad)), _) => {
                        let (sp, _g) = sfa.device_ptr(stream);
                        maps = Some(scale_maps(sp, act, 0, (m_pad as usize, chunks))?);
                        fp8_scales = true;
                    }
                    // The caller's read-only scales where they are this layout (M-major, planes
                    // 16-byte aligned): maps over them with zeros past the rows, no copy.
                    (None, Some((sp, pitch))) => {
                        let map = |tile| {
                            let box_rows = family::act_scale_rows(tile, act, 0);
                            let sizes = [rows as u64, chunks as u64, l as u64];
                            let plane = 4 * pitch as u64;
                            let strides = [plane, plane * chunks as u64];
                            let dtype = DataType::CU_TENSOR_MAP_DATA_TYPE_UINT32;
                            let none = Swizzle::CU_TENSOR_MAP_SWIZZLE_NONE;
                            LazyMap::strided(sp, dtype, (sizes, strides), [box_rows, 1, 1], none)
                        };
                        maps = Some([map(W4Tile::N16), map(W4Tile::N128)]);
                        caller_scales = Some((sp, pitch as u32));
                    }
                    (None, None) => {
                        let buf = m.gather(stream, a8_scales_to(&d))?;
                        let (sp, _g) = buf.device_ptr(stream);
                        maps = Some(scale_maps(sp, act, 0, (rows_pad, chunks))?);
                        drop(_g);
                        scales = Some(buf);
                    }
                }
                let fp8 = family::fp8::FP8_BLOCK_K;
                let swizzle = Swizzle::CU_TENSOR_MAP_SWIZZLE_128B;
                let layout = (
                    DataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
                    [k, rows, l],
                    1,
                    fp8,
                    swizzle,
                );
                tmap_fp8 = Some(LazyMap::new(ptr, layout, family::fp8::FP8_TILE.n));
                (code_map(16), code_map(128))
            }
            (ElemType::BF16, ScaleType::F32, ScaleBlock::PerTensor) => {
                let Some(s) = m.uniform_scale() else {
                    return Ok(None);
                };
                uniform_scale = Some(s / d.tensor_scale);
                let map = |box_rows: u32| {
                    let swizzle = Swizzle::CU_TENSOR_MAP_SWIZZLE_128B;
                    let bf16 = DataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
                    LazyMap::new(ptr, (bf16, [k, rows, l], 2, BLOCK_K, swizzle), box_rows)
                };
                (map(16), map(128))
            }
            _ => return Ok(None),
        };
        Ok(Some(W4Operand {
            caller_scales,
            fp8_scales,
            mx_scales,
            weights,
            tmap_16,
            tmap_128,
            tmap_fp8,
            scales,
            rows_pad: rows_pad as u32,
            scale_maps: maps,
            uniform_scale,
        }))
    }

    fn refresh(&mut self, re: &Rewrite<'_>) -> Result<bool> {
        let (stream, m) = (re.stream, re.matrix);
        let op = self;
        let d = *m.desc();
        let mx_scales = op.mx_scales;
        match (d.format.elem, &mut op.scales) {
            // (Reading the MX family's scale layout, which it or the writer refreshed.)
            (ElemType::E2M1, scales) if scales.is_some() || mx_scales => {
                if let Some(scales) = scales {
                    let scale = scale_format(&d).expect("prepared, so supported");
                    m.gather_into(stream, kernel_scales_to(&d, scale).0, scales)?;
                }
                if let Some(w) = &mut op.weights {
                    w.forget();
                }
                Ok(true)
            }
            (ElemType::E4M3, Some(scales)) => {
                m.gather_into(stream, a8_scales_to(&d), scales)?;
                Ok(true)
            }
            // (Reading the FP8 family's A-role scales, which it or the writer refreshed.)
            (ElemType::E4M3, None) if op.fp8_scales => Ok(true),
            // bf16: a per-tensor scale read on the host (uploads only).
            _ => Ok(false),
        }
    }
}

crate::held::held!(W4Operand: weights, scales);
crate::held::held!(Weights: data, tops);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::test_util::desc;
    use crate::format::{Fp4Weights, Recipe};
    use crate::matrix::ScaledMatrix;
    use blockscaled_kernels::sm90_w4::{stored_chunk, weight_k};

    #[test]
    fn weight_only_and_fp4_pairs_run_on_the_kernel_and_others_do_not() {
        for w in [Fp4Weights::Mxfp4, Fp4Weights::Nvfp4] {
            for r in [Recipe::W4A16(w), Recipe::W4A8(w)] {
                assert_eq!(
                    unsupported_pair(&desc(r, 3, 256, false), &desc(r, 70, 256, true)),
                    None,
                    "{r}"
                );
            }
        }
        for r in [Recipe::Mxfp4, Recipe::Nvfp4, Recipe::E2m1E8m0x16] {
            assert_eq!(
                unsupported_pair(&desc(r, 1, 256, false), &desc(r, 9, 256, true)),
                None
            );
        }
        let mx8 = Recipe::Mxfp8(crate::format::Fp8::E4M3);
        assert!(unsupported_pair(&desc(mx8, 1, 256, false), &desc(mx8, 9, 256, true)).is_some());
        // Mixed scale formats; bf16 rows that are not 16-byte multiples.
        let (mx, nv) = (
            desc(Recipe::Mxfp4, 4, 256, false),
            desc(Recipe::Nvfp4, 4, 256, true),
        );
        assert!(unsupported_pair(&mx, &nv).is_some());
        let w4a16 = Recipe::W4A16(Fp4Weights::Mxfp4);
        assert!(
            unsupported_pair(&desc(w4a16, 4, 100, false), &desc(w4a16, 4, 100, true)).is_some()
        );
    }

    #[test]
    fn reordered_weights_put_each_code_where_weight_k_says() {
        // Two batch entries of 19 rows: a whole group and a padded one each.
        let (rows, k, l) = (19, 96, 2);
        let v: Vec<f32> = (0..l * rows * k)
            .map(|i| ((i * 7) % 13) as f32 - 6.0)
            .collect();
        let m = ScaledMatrix::quantize(&v, rows, k, l, Recipe::Mxfp4.b()).unwrap();
        let chunks = 2;
        let w = blockscaled_kernels::prepare::W4Reorder {
            src: 0,
            dst: 0,
            rows: rows as u32,
            k: k as u32,
            batch: l as u32,
            chunks,
        };
        let mut out = Vec::new();
        for q in 0..w.entries() {
            out.extend(w.chunk_of(m.data(), q).iter().flat_map(|x| x.to_le_bytes()));
        }
        assert_eq!(out.len(), l * 32 * 32 * chunks as usize);
        for b in 0..l {
            for r in 0..32 {
                for c in 0..chunks {
                    let at = stored_chunk(b as u32, r, c, rows as u32, chunks) as usize;
                    for p in 0..64 {
                        let code = (out[at + p / 2] >> (4 * (p % 2))) & 0xF;
                        let kk = c as usize * 64 + weight_k(p as u32) as usize;
                        let live = (r as usize) < rows && kk < k;
                        let want = if live {
                            m.code(b, r as usize, kk) as u8
                        } else {
                            0
                        };
                        assert_eq!(code, want, "entry {b} row {r} chunk {c} position {p}");
                    }
                }
            }
        }
    }
}
