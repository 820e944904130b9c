//! Block-sparse (BSR) operands: a matrix stored as its nonzero square blocks, in the layout of
//! torch's `to_sparse_bsr` (`crow_indices`, `col_indices`, `values` of shape nnz × bs × bs), for
//! C = A · Bᵀ with either operand sparse and the other dense.
//!
//! - [`BsrMatrix`]: the host copy, its structure validated when it is made (row pointers start
//!   at 0, never decrease and end at the stored-block count; column indices in range and strictly
//!   increasing in each block row, so no duplicates): a kernel never reads past a buffer because
//!   of a malformed structure.
//! - FP8 (e4m3) blocks of 128 × 128 with one fp32 scale per stored block: the sparsity block is
//!   the scale block (DeepSeek-V3's 128 × 128 weight blocks, pruned). The dense operand has fp32
//!   scales per 1 × 128 (or per row, or per tensor, which are special cases of it).
//! - The sparse operand's rows need not be a multiple of the block: the last block row's blocks
//!   are stored whole and their rows past the matrix are ignored. K (its columns) is a multiple
//!   of the block.
//! - The work list the kernels walk ([`work_list`]): each tile of the sparse operand's rows gets
//!   its run of stored blocks, long runs cut in parts that meet by split-K's deterministic
//!   reduction, longest first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaSlice, CudaStream};

use crate::buffers::{GpuId, Prepared};
use crate::error::{Error, Result, shape};
use crate::format::{ElemType, ScaleType};
use crate::matrix::{GemmShape, ScaledMatrix};
use blockscaled_kernels::gemm::scheduler::{Segment, Sparse};

/// Which operand of C = A · Bᵀ is block-sparse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SparseSide {
    /// A (M × K) is sparse, B (N × K) dense: torch's `bsr_dense_mm(a, bᵀ)`.
    A,
    /// B (N × K, e.g. block-pruned weights) is sparse, A (M × K, activations) dense.
    B,
}

/// The one block size of FP8 BSR matrices: the kernel's scale block.
pub const FP8_BLOCK: usize = 128;
/// The block sizes of 16-bit BSR matrices (the seed's and torch's common ones; the 16-bit
/// kernel's tiles are 64 or 128 columns wide).
pub const HALF_BLOCKS: [usize; 2] = [64, 128];

/// What every block-sparse configuration shares: `split_k`, the most parts a run of stored
/// blocks is cut into, is 1 to [`MAX_PARTS`]; the product has one batch entry.
pub(crate) fn validate_parts(split_k: u32, s: &GemmShape) -> Result<()> {
    if !(1..=MAX_PARTS).contains(&split_k) {
        return Err(Error::Config(format!(
            "split_k = {split_k}: a block-sparse GEMM cuts a run of stored blocks into 1 to \
             {MAX_PARTS} parts"
        )));
    }
    if s.l != 1 {
        return Err(shape(format!(
            "L = {}: block-sparse GEMM has one batch entry",
            s.l
        )));
    }
    Ok(())
}

/// A block-sparse matrix of `rows` × `cols` (K = `cols`): block row `r` (rows
/// `r·bs..(r+1)·bs`) stores blocks `crow[r]..crow[r+1]`; stored block `i` is block column
/// `col[i]` (K `col[i]·bs..`), its bs × bs codes at element `i·bs²..` of `values`, row-major (K
/// contiguous, as torch's `values[i]`). FP8: e4m3 codes (a byte each) of 128 × 128 blocks,
/// dequantized as `decode(code) · scales[i]`; 16-bit: bf16 values (two little-endian bytes
/// each) of 64 × 64 or 128 × 128 blocks, no scales. Missing blocks are zeros.
#[derive(Clone, Debug, PartialEq)]
pub struct BsrMatrix {
    elem: ElemType,
    rows: usize,
    cols: usize,
    block: usize,
    crow: Vec<i32>,
    col: Vec<i32>,
    values: Vec<u8>,
    scales: Vec<f32>,
}

fn structure(msg: impl Into<String>) -> Error {
    Error::Sparse(msg.into())
}

impl BsrMatrix {
    /// From torch's BSR tensors (`crow_indices`, `col_indices` as int64, `values` as the codes'
    /// bytes) and, for FP8, one fp32 scale per stored block (16-bit: `scales` empty). Every rule
    /// of the type's doc is checked: [`Error::Format`] for an element type or block size the
    /// kernels do not take, [`Error::Shape`] for sizes, [`Error::Sparse`] for the structure.
    #[allow(clippy::too_many_arguments)]
    pub fn from_parts(
        elem: ElemType,
        rows: usize,
        cols: usize,
        block: usize,
        crow_indices: &[i64],
        col_indices: &[i64],
        values: Vec<u8>,
        scales: Vec<f32>,
    ) -> Result<Self> {
        match elem {
            ElemType::E4M3 if block != FP8_BLOCK => {
                return Err(Error::Format(format!(
                    "FP8 BSR blocks are {FP8_BLOCK} × {FP8_BLOCK} (one fp32 scale per block, the \
                     kernel's scale block), not {block} × {block}"
                )));
            }
            ElemType::BF16 | ElemType::F16 if !HALF_BLOCKS.contains(&block) => {
                return Err(Error::Format(format!(
                    "{} BSR blocks are 64 × 64 or 128 × 128, not {block} × {block}",
                    elem.name()
                )));
            }
            ElemType::E4M3 | ElemType::BF16 | ElemType::F16 => {}
            _ => {
                return Err(Error::Format(format!(
                    "block-sparse GEMM takes e4m3, bf16 or f16 blocks, not {}",
                    elem.name()
                )));
            }
        }
        if rows == 0 || cols == 0 {
            return Err(shape(format!("empty BSR matrix {rows} × {cols}")));
        }
        // (K = 2³¹ − 1 itself is odd, so the block check below refuses it too: `>` and `>=` on
        // K give the same result.)
        if rows > i32::MAX as usize || cols > i32::MAX as usize {
            return Err(shape(format!(
                "BSR matrix {rows} × {cols}: the kernels index rows and K with 32 bits"
            )));
        }
        if !cols.is_multiple_of(block) {
            return Err(shape(format!(
                "K = {cols} is not a multiple of the block size {block}"
            )));
        }
        let (block_rows, block_cols) = (rows.div_ceil(block), cols / block);
        if crow_indices.len() != block_rows + 1 {
            return Err(structure(format!(
                "crow_indices has {} entries; {rows} rows in blocks of {block} need {}",
                crow_indices.len(),
                block_rows + 1
            )));
        }
        let nnz = col_indices.len();
        check_stage_count(nnz, stages_per_block(block, elem))?;
        if crow_indices[0] != 0 {
            return Err(structure(format!(
                "crow_indices[0] = {}, must be 0",
                crow_indices[0]
            )));
        }
        for (r, w) in crow_indices.windows(2).enumerate() {
            if w[1] < w[0] {
                return Err(structure(format!(
                    "crow_indices decreases at block row {r}: {} then {}",
                    w[0], w[1]
                )));
            }
        }
        if crow_indices[block_rows] != nnz as i64 {
            return Err(structure(format!(
                "crow_indices ends at {}, but col_indices has {nnz} stored blocks",
                crow_indices[block_rows]
            )));
        }
        for r in 0..block_rows {
            let run = &col_indices[crow_indices[r] as usize..crow_indices[r + 1] as usize];
            for (j, &c) in run.iter().enumerate() {
                if !(0..block_cols as i64).contains(&c) {
                    return Err(structure(format!(
                        "col_indices of block row {r}: {c} is outside 0..{block_cols} (K = \
                         {cols} in blocks of {block})"
                    )));
                }
                if j > 0 && c <= run[j - 1] {
                    return Err(structure(format!(
                        "col_indices of block row {r} are not strictly increasing ({} then {c}): \
                         sorted, without duplicates, as torch's to_sparse_bsr makes them",
                        run[j - 1]
                    )));
                }
            }
        }
        let block_bytes = block * block * elem.bits() as usize / 8;
        if values.len() != nnz * block_bytes {
            return Err(shape(format!(
                "values holds {} bytes; {nnz} blocks of {block} × {block} {} need {}",
                values.len(),
                elem.name(),
                nnz * block_bytes
            )));
        }
        let want = if elem == ElemType::E4M3 { nnz } else { 0 };
        if scales.len() != want {
            return Err(shape(format!(
                "{} block scales for {nnz} stored {} blocks: {want} expected (FP8: one per \
                 block; 16-bit: none)",
                scales.len(),
                elem.name()
            )));
        }
        Ok(BsrMatrix {
            elem,
            rows,
            cols,
            block,
            // In range of i32: checked above (crow values are ≤ nnz, col values < block_cols).
            crow: crow_indices.iter().map(|&v| v as i32).collect(),
            col: col_indices.iter().map(|&v| v as i32).collect(),
            values,
            scales,
        })
    }

    /// The blocks of a dense FP8 matrix with 128 × 128 fp32 scales (DeepSeek-V3's weight format,
    /// `Recipe::DeepSeekFp8.b()`) for which `keep(block_row, block_col)` holds, with their codes
    /// and scales unchanged (rows past the matrix in the last block row are stored as zeros).
    pub fn from_dense_blocks(
        m: &ScaledMatrix,
        mut keep: impl FnMut(usize, usize) -> bool,
    ) -> Result<Self> {
        let d = m.desc();
        let block = FP8_BLOCK;
        // (`from_parts` below refuses element types other than e4m3 as well, with the same error
        // kind: the first test is for the message.)
        if d.format.elem != ElemType::E4M3
            || d.format.scale != ScaleType::F32
            || d.block_extent() != (block, block)
        {
            return Err(Error::Format(format!(
                "{}: a BSR matrix is made from e4m3 with fp32 scales per {block} × {block}",
                d.format
            )));
        }
        if d.batch != 1 {
            return Err(shape(format!(
                "batch {}: a BSR matrix has one batch entry",
                d.batch
            )));
        }
        let (rows, cols) = (d.rows, d.k);
        let (block_rows, block_cols) = (rows.div_ceil(block), cols.div_ceil(block));
        let (mut crow, mut col) = (vec![0i64], Vec::new());
        let (mut values, mut scales) = (Vec::new(), Vec::new());
        for br in 0..block_rows {
            for bc in 0..block_cols {
                if !keep(br, bc) {
                    continue;
                }
                col.push(bc as i64);
                scales.push(m.scale_value(0, br * block, bc * block) as f32);
                for r in br * block..(br + 1) * block {
                    for k in bc * block..(bc + 1) * block {
                        let code = if r < rows { m.code(0, r, k) as u8 } else { 0 };
                        values.push(code);
                    }
                }
            }
            crow.push(col.len() as i64);
        }
        BsrMatrix::from_parts(
            d.format.elem,
            rows,
            cols,
            block,
            &crow,
            &col,
            values,
            scales,
        )
    }

    /// The blocks of `block` × `block` of a dense 16-bit matrix (`elem` bf16 or f16) of `rows` ×
    /// `cols` (`data`: the codes, row-major) for which `keep(block_row, block_col)` holds (rows
    /// past the matrix in the last block row are stored as zeros). `cols` is a multiple of the
    /// block.
    pub fn from_dense_16bit(
        elem: ElemType,
        data: &[u16],
        (rows, cols): (usize, usize),
        block: usize,
        mut keep: impl FnMut(usize, usize) -> bool,
    ) -> Result<Self> {
        if rows.checked_mul(cols) != Some(data.len()) {
            return Err(shape(format!(
                "{} values for a {rows} × {cols} matrix",
                data.len()
            )));
        }
        if block == 0 || !cols.is_multiple_of(block) {
            return Err(shape(format!(
                "K = {cols} is not a multiple of the block size {block}"
            )));
        }
        let (block_rows, block_cols) = (rows.div_ceil(block), cols / block);
        let (mut crow, mut col, mut values) = (vec![0i64], Vec::new(), Vec::new());
        for br in 0..block_rows {
            for bc in 0..block_cols {
                if !keep(br, bc) {
                    continue;
                }
                col.push(bc as i64);
                for r in br * block..(br + 1) * block {
                    for k in bc * block..(bc + 1) * block {
                        let v = if r < rows { data[r * cols + k] } else { 0 };
                        values.extend_from_slice(&v.to_le_bytes());
                    }
                }
            }
            crow.push(col.len() as i64);
        }
        if !elem.is_16bit() {
            return Err(Error::Format(format!(
                "from_dense_16bit takes bf16 or f16 codes, not {}",
                elem.name()
            )));
        }
        BsrMatrix::from_parts(elem, rows, cols, block, &crow, &col, values, Vec::new())
    }

    /// The blocks' element type.
    pub fn elem(&self) -> ElemType {
        self.elem
    }
    /// The matrix's rows.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// K.
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// The block size (rows and columns of one block).
    pub fn block(&self) -> usize {
        self.block
    }
    /// Stored blocks.
    pub fn nnz(&self) -> usize {
        self.col.len()
    }
    /// Stored blocks over all blocks.
    pub fn density(&self) -> f64 {
        let all = self.rows.div_ceil(self.block) * (self.cols / self.block);
        self.nnz() as f64 / all as f64
    }
    /// Row pointers: block row r holds stored blocks `crow[r]..crow[r + 1]`.
    pub fn crow_indices(&self) -> &[i32] {
        &self.crow
    }
    /// Each stored block's block column.
    pub fn col_indices(&self) -> &[i32] {
        &self.col
    }
    /// The stored blocks' codes, block after block, each row-major.
    pub fn values(&self) -> &[u8] {
        &self.values
    }
    /// One fp32 scale per stored block (FP8); empty for 16-bit blocks.
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }
    /// The code of element (r, k) of stored block `i`.
    fn code(&self, i: usize, r: usize, k: usize) -> u32 {
        let at = (i * self.block + r) * self.block + k;
        match self.elem {
            ElemType::BF16 | ElemType::F16 => {
                u16::from_le_bytes([self.values[2 * at], self.values[2 * at + 1]]) as u32
            }
            _ => self.values[at] as u32,
        }
    }

    /// Every value, `[rows][cols]` in float64 (missing blocks zero; exact, as each stored value
    /// is a bf16 value, or an e4m3 value times an fp32 scale).
    pub fn dequantize(&self) -> Vec<f64> {
        let (bs, cols) = (self.block, self.cols);
        let mut out = vec![0.0f64; self.rows * cols];
        for br in 0..self.crow.len() - 1 {
            for i in self.crow[br] as usize..self.crow[br + 1] as usize {
                let (c0, s) = (
                    self.col[i] as usize * bs,
                    self.scales.get(i).map_or(1.0, |&s| s as f64),
                );
                for r in 0..bs {
                    let row = br * bs + r;
                    if row >= self.rows {
                        break;
                    }
                    for k in 0..bs {
                        out[row * cols + c0 + k] = self.elem.decode(self.code(i, r, k)) as f64 * s;
                    }
                }
            }
        }
        out
    }
}

/// Segments, over all, that a tile's run is cut into at most (the configuration's `split_k`
/// for a block-sparse GEMM is at most this).
pub const MAX_PARTS: u32 = 16;

/// Fewest stored blocks per part of a cut run: each part's partial sums make a round trip
/// through the split-K workspace (64 KiB per 128 × 128 tile), worth it only against several
/// blocks of MMAs.
pub const MIN_PART_BLOCKS: usize = 4;

/// The work list of a block-sparse GEMM ([`Segment`]s, longest first) and the split-K slots
/// and counters its cut runs need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkList {
    /// The segments, longest first.
    pub segments: Vec<Segment>,
    /// Split-K slots the cut runs need.
    pub slots: u32,
    /// Arrival counters the cut runs need.
    pub counters: u32,
}

/// The work list for a sparse operand whose block rows hold `crow[r]..crow[r + 1]`, cut into
/// tiles of `tile_rows` rows (a tile is a block row or half of one: `block` a multiple of
/// `tile_rows`) over `rows` rows, for `m_units` units along the dense axis and `ctas` units that
/// run at once (persistent CTAs over the cluster size). A tile's run longer than the average
/// work per CTA (and at least `MIN_PART_BLOCKS` (4) per part) is cut into near-equal parts, at
/// most `max_parts`; an empty run stays one empty segment (its zero output is still written).
/// Longest first (ties: in tile order), so that the last units to start are the shortest.
/// [`Error::Sparse`] for row pointers that do not cover the rows (too few, negative or
/// decreasing), [`Error::Shape`] for a block or tile of no rows.
pub fn work_list(
    crow: &[i32],
    block: usize,
    tile_rows: usize,
    rows: usize,
    m_units: usize,
    ctas: usize,
    max_parts: u32,
) -> Result<WorkList> {
    if block == 0 || tile_rows == 0 || rows == 0 {
        return Err(shape(format!(
            "a work list of {rows} rows in tiles of {tile_rows} over blocks of {block}: all must \
             be non-zero"
        )));
    }
    let tiles = rows.div_ceil(tile_rows);
    // The last tile's block row, and the row pointer after it, must be there.
    let needed = ((tiles - 1) * tile_rows / block)
        .checked_add(2)
        .ok_or_else(|| shape("the work list's block rows overflow"))?;
    if crow.len() < needed {
        return Err(Error::Sparse(format!(
            "{} row pointers for {rows} rows in blocks of {block} ({needed} needed)",
            crow.len()
        )));
    }
    if crow[0] < 0 || crow[..needed].windows(2).any(|w| w[1] < w[0]) {
        return Err(Error::Sparse(
            "row pointers must be non-negative and non-decreasing".into(),
        ));
    }
    let run = |t: usize| {
        let br = t * tile_rows / block;
        (crow[br] as u32, crow[br + 1] as u32)
    };
    let total: usize = (0..tiles)
        .map(|t| {
            let (b, e) = run(t);
            (e - b) as usize
        })
        .sum::<usize>()
        * m_units;
    let per_cta = total.div_ceil(ctas.max(1)).max(MIN_PART_BLOCKS);
    let (mut segments, mut slots, mut counters) = (Vec::with_capacity(tiles), 0u32, 0u32);
    for t in 0..tiles {
        let (begin, end) = run(t);
        let len = (end - begin) as usize;
        let parts = len.div_ceil(per_cta).clamp(1, max_parts.max(1) as usize) as u32;
        let (slot, counter) = if parts > 1 {
            let s = (slots, counters);
            (slots, counters) = (slots + parts, counters + 1);
            s
        } else {
            (0, 0)
        };
        for p in 0..parts {
            let cut = |p: u32| begin + (p as u64 * len as u64 / parts as u64) as u32;
            segments.push(Segment {
                n: t as u32,
                begin: cut(p),
                end: cut(p + 1),
                part: p,
                parts,
                slot,
                counter,
                _pad: 0,
            });
        }
    }
    segments.sort_by_key(|s| std::cmp::Reverse(s.end - s.begin));
    Ok(WorkList {
        segments,
        slots,
        counters,
    })
}

/// A block-sparse GEMM's work list over the dense operand's `m` rows, in units of `unit` (rows
/// × columns: tile rows × the cluster by the tile's columns), made once per key on `sparse` for
/// `clusters` persistent clusters and runs cut into at most `split_k` parts.
pub(crate) fn sparse_work(
    stream: &Arc<CudaStream>,
    sparse: &DeviceBsr,
    m: usize,
    (unit_m, unit_n): (u32, u32),
    (clusters, split_k): (usize, u32),
) -> Result<Arc<DeviceWork>> {
    let m_units = m.div_ceil(unit_m as usize);
    sparse.work(stream, (unit_n as usize, m_units, clusters, split_k))
}

/// A block-sparse GEMM's schedule and its work list.
pub(crate) type SparseSchedule = (
    blockscaled_kernels::gemm::scheduler::Schedule,
    std::sync::Arc<DeviceWork>,
);

/// A [`WorkList`] on the GPU: its segments as u32 words.
pub(crate) struct DeviceWork {
    pub(crate) segments: CudaSlice<u32>,
    pub(crate) count: u32,
    pub(crate) slots: u32,
    pub(crate) counters: u32,
}

impl DeviceWork {
    /// The kernel's block-sparse parameters for it over `sparse` (its column indices bound to
    /// `launch`), with `side` sparse and blocks of 2^`sub_log2` stages of K.
    pub(crate) fn params<'a>(
        &'a self,
        launch: &mut crate::launch::Launch<'a>,
        sparse: &'a DeviceBsr,
        side: SparseSide,
        sub_log2: u32,
    ) -> blockscaled_kernels::params::SparseParams {
        blockscaled_kernels::params::SparseParams {
            segments: launch.ptr(&self.segments),
            cols: launch.ptr(&sparse.col),
            count: self.count,
            slots: self.slots,
            counters: self.counters,
            transposed: (side == SparseSide::A) as u32,
            sub_log2,
            _pad: 0,
        }
    }

    /// The scheduler's view of it (host side: grid and workspace sizing, where the segments'
    /// address is not used).
    pub(crate) fn sparse(&self) -> Sparse {
        Sparse {
            segments: 0,
            count: self.count,
            slots: self.slots,
            counters: self.counters,
        }
    }
}

/// What a work list depends on besides the structure: tile rows, dense-axis units, concurrent
/// units, most parts.
pub(crate) type WorkKey = (usize, usize, usize, u32);

/// A block-sparse matrix on the GPU: its stored blocks, their scales and column indices, the
/// structure's row pointers (kept on the host, where the work lists are made), what the kernel
/// families prepared of it, and the work lists made so far.
pub struct DeviceBsr {
    pub(crate) gpu: GpuId,
    pub(crate) elem: ElemType,
    pub(crate) matrix_rows: usize,
    pub(crate) cols: usize,
    pub(crate) block: usize,
    pub(crate) nnz: usize,
    pub(crate) crow: Vec<i32>,
    /// Stored blocks' codes (at least one block: a tensor map needs a nonempty tensor). Held
    /// for the families' tensor maps, which point into it.
    pub(crate) _values: CudaSlice<u8>,
    /// One fp32 scale per stored block (at least one; 16-bit blocks: one unused zero).
    pub(crate) scales: CudaSlice<f32>,
    /// Block column of each stored block (at least one).
    pub(crate) col: CudaSlice<i32>,
    pub(crate) prepared: Prepared,
    pub(crate) work: Mutex<HashMap<WorkKey, Arc<DeviceWork>>>,
}

impl DeviceBsr {
    /// The matrix's rows.
    pub fn rows(&self) -> usize {
        self.matrix_rows
    }
    /// K.
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// The block size.
    pub fn block(&self) -> usize {
        self.block
    }
    /// The number of stored blocks.
    pub fn nnz(&self) -> usize {
        self.nnz
    }
    /// The blocks' element type.
    pub fn elem(&self) -> ElemType {
        self.elem
    }

    /// Pipeline stages per stored block ([`stages_per_block`]).
    pub(crate) fn stages_per_block(&self) -> u32 {
        stages_per_block(self.block, self.elem) as u32
    }

    /// The work list for `key` (made and uploaded once per key; `tile_rows` divides the block),
    /// its positions in stages.
    pub(crate) fn work(&self, stream: &Arc<CudaStream>, key: WorkKey) -> Result<Arc<DeviceWork>> {
        let mut cache = self.work.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = cache.get(&key) {
            return Ok(w.clone());
        }
        let (tile_rows, m_units, ctas, max_parts) = key;
        // Positions count stages (`SparseParams::sub_log2`): every row pointer times the
        // stages per block.
        let sub = self.stages_per_block() as i32;
        let crow: Vec<i32> = self.crow.iter().map(|&c| c * sub).collect();
        let list = work_list(
            &crow,
            self.block,
            tile_rows,
            self.matrix_rows,
            m_units,
            ctas,
            max_parts,
        )?;
        let words: Vec<u32> = list
            .segments
            .iter()
            .flat_map(|s| [s.n, s.begin, s.end, s.part, s.parts, s.slot, s.counter, 0])
            .collect();
        let w = Arc::new(DeviceWork {
            segments: crate::alloc::copy_of(stream, &words)?,
            count: list.segments.len() as u32,
            slots: list.slots,
            counters: list.counters,
        });
        // The copy completes before the list is shared: a later call of this key may run on
        // another stream (a handle per stream: `Gpu::with_stream`), which the copy's stream
        // does not order. Once per key.
        stream.synchronize()?;
        cache.insert(key, w.clone());
        Ok(w)
    }
}

/// Pipeline stages per stored block of `block` × `block` `elem` values: a stage holds 128 bytes
/// of K (128 e4m3 or 64 bf16 values), so a 128 × 128 bf16 block is 2 stages and the others 1.
pub(crate) fn stages_per_block(block: usize, elem: ElemType) -> usize {
    (block * elem.bits() as usize / 8 / 128).max(1)
}

/// `nnz` stored blocks of `stages` stages each: the kernels count stages in 32 bits.
fn check_stage_count(nnz: usize, stages: usize) -> Result<()> {
    if nnz > i32::MAX as usize / stages {
        return Err(shape(format!(
            "{nnz} stored blocks of {stages} stages: at most 2³¹ − 1 stages"
        )));
    }
    Ok(())
}

/// The shape of C for a dense operand of `dense_rows` × K and a sparse one of `sparse_rows` ×
/// K on `side`: (M, N).
pub(crate) fn output_dims(
    side: SparseSide,
    dense_rows: usize,
    sparse_rows: usize,
) -> (usize, usize) {
    match side {
        SparseSide::A => (sparse_rows, dense_rows),
        SparseSide::B => (dense_rows, sparse_rows),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_lists_of_bad_row_pointers_or_empty_tiles_are_typed_errors_not_panics() {
        let crow = [0, 2, 5, 5, 9];
        assert!(work_list(&crow, 128, 128, 512, 1, 132, 16).is_ok());
        assert!(matches!(
            work_list(&crow, 128, 0, 512, 1, 132, 16),
            Err(Error::Shape(_))
        ));
        assert!(matches!(
            work_list(&crow, 0, 128, 512, 1, 132, 16),
            Err(Error::Shape(_))
        ));
        // Five block rows need six pointers.
        assert!(matches!(
            work_list(&crow, 128, 128, 640, 1, 132, 16),
            Err(Error::Sparse(_))
        ));
        assert!(matches!(
            work_list(&[0, 3, 2, 4, 5], 128, 128, 512, 1, 132, 16),
            Err(Error::Sparse(_))
        ));
        assert!(matches!(
            work_list(&[-1, 3, 4, 4, 5], 128, 128, 512, 1, 132, 16),
            Err(Error::Sparse(_))
        ));
    }

    #[test]
    fn a_dense_matrix_whose_size_overflows_is_a_shape_error() {
        let r = BsrMatrix::from_dense_16bit(
            ElemType::BF16,
            &[0u16; 4],
            (usize::MAX / 2, 4),
            2,
            |_, _| true,
        );
        assert!(matches!(r, Err(Error::Shape(_))));
    }

    fn parts(crow: &[i64], col: &[i64], rows: usize, cols: usize) -> Result<BsrMatrix> {
        let nnz = col.len();
        BsrMatrix::from_parts(
            ElemType::E4M3,
            rows,
            cols,
            128,
            crow,
            col,
            vec![0x38; nnz * 128 * 128],
            vec![1.0; nnz],
        )
    }

    #[test]
    fn malformed_structures_are_sparse_errors_and_good_ones_pass() {
        assert!(parts(&[0, 2, 2, 3], &[0, 3, 1], 384, 512).is_ok());
        // Ragged rows: 300 rows are 3 block rows.
        assert!(parts(&[0, 1, 1, 2], &[0, 1], 300, 256).is_ok());
        let bad: [(&[i64], &[i64]); 7] = [
            // Wrong length of crow.
            (&[0, 1], &[0]),
            // Not starting at 0.
            (&[1, 1, 2, 3], &[0, 1, 2]),
            // Decreasing.
            (&[0, 2, 1, 3], &[0, 1, 2]),
            // Ending before nnz.
            (&[0, 1, 1, 1], &[0, 1]),
            // Column out of range (K = 512: 4 block columns), negative.
            (&[0, 1, 1, 1], &[4]),
            (&[0, 1, 1, 1], &[-1]),
            // Duplicate in a row.
            (&[0, 2, 2, 2], &[1, 1]),
        ];
        for (crow, col) in bad {
            let r = parts(crow, col, 384, 512);
            assert!(
                matches!(r, Err(Error::Sparse(_))),
                "{crow:?} {col:?}: {r:?}"
            );
        }
        // Unsorted row.
        assert!(matches!(
            parts(&[0, 2, 2, 2], &[3, 1], 384, 512),
            Err(Error::Sparse(_))
        ));
        // Sizes: values, scales, K not a multiple of the block; other blocks and types.
        let one = |values: usize, scales: usize, block: usize, elem: ElemType, cols: usize| {
            BsrMatrix::from_parts(
                elem,
                128,
                cols,
                block,
                &[0, 1],
                &[0],
                vec![0; values],
                vec![1.0; scales],
            )
        };
        let e4m3 = ElemType::E4M3;
        assert!(one(128 * 128, 1, 128, e4m3, 256).is_ok());
        assert!(matches!(one(100, 1, 128, e4m3, 256), Err(Error::Shape(_))));
        assert!(matches!(
            one(128 * 128, 2, 128, e4m3, 256),
            Err(Error::Shape(_))
        ));
        assert!(matches!(
            one(128 * 128, 1, 128, e4m3, 200),
            Err(Error::Shape(_))
        ));
        assert!(matches!(
            one(64 * 64, 1, 64, e4m3, 256),
            Err(Error::Format(_))
        ));
        assert!(matches!(
            one(128 * 128, 1, 128, ElemType::E5M2, 256),
            Err(Error::Format(_))
        ));
    }

    #[test]
    fn work_lists_cover_every_stored_block_of_every_tile_once_longest_first() {
        // Block rows of 0, 9, 1, 40 and 3 blocks (K = 64 blocks).
        let crow = [0, 0, 9, 10, 50, 53];
        for (tile_rows, m_units, ctas, max_parts) in [
            (128, 1, 132, 16),
            (128, 32, 132, 16),
            (64, 4, 8, 3),
            (128, 1, 1, 16),
            (128, 2, 132, 1),
        ] {
            let w = work_list(&crow, 128, tile_rows, 5 * 128, m_units, ctas, max_parts).unwrap();
            let tiles = 5 * 128 / tile_rows;
            let mut covered = vec![Vec::new(); tiles];
            let mut slots = std::collections::HashSet::new();
            for s in &w.segments {
                let br = s.n as usize * tile_rows / 128;
                assert!(
                    s.begin <= s.end && s.end <= crow[br + 1] as u32 && s.begin >= crow[br] as u32
                );
                covered[s.n as usize].extend(s.begin..s.end);
                assert!(s.part < s.parts && s.parts <= max_parts);
                if s.parts > 1 {
                    assert!(s.slot + s.parts <= w.slots && s.counter < w.counters);
                    assert!(slots.insert(s.slot + s.part), "{s:?}");
                    assert!((s.end - s.begin) as usize >= MIN_PART_BLOCKS - 1);
                }
            }
            for (t, c) in covered.iter().enumerate() {
                let br = t * tile_rows / 128;
                assert_eq!(
                    *c,
                    (crow[br] as u32..crow[br + 1] as u32).collect::<Vec<_>>()
                );
            }
            // Every tile has at least one segment (empty tiles too).
            for t in 0..tiles as u32 {
                assert!(w.segments.iter().any(|s| s.n == t));
            }
            let lens: Vec<u32> = w.segments.iter().map(|s| s.end - s.begin).collect();
            assert!(lens.windows(2).all(|p| p[0] >= p[1]), "{lens:?}");
        }
        // One CTA's worth of units: the 40-block run is cut; with many M units it is not.
        let few = work_list(&crow, 128, 128, 640, 1, 132, 16).unwrap();
        assert!(few.segments.iter().any(|s| s.parts > 1));
        let many = work_list(&crow, 128, 128, 640, 256, 132, 16).unwrap();
        assert!(many.segments.iter().all(|s| s.parts == 1));
    }

    #[test]
    fn dequantized_values_are_the_stored_blocks_and_zeros_elsewhere() {
        // e4m3 0x38 = 1.0; block (1, 2) scaled by 0.5, block (0, 0) by 2.
        let mut values = vec![0x38u8; 2 * 128 * 128];
        values[5] = 0x40; // 2.0 at row 0, column 5 of block (0, 0)
        let m = BsrMatrix::from_parts(
            ElemType::E4M3,
            200,
            384,
            128,
            &[0, 1, 2],
            &[0, 2],
            values,
            vec![2.0, 0.5],
        )
        .unwrap();
        let d = m.dequantize();
        assert_eq!(d[5], 4.0);
        assert_eq!(d[4], 2.0);
        assert_eq!(d[130], 0.0);
        assert_eq!(d[150 * 384 + 256], 0.5);
        assert_eq!(d[199 * 384 + 383], 0.5);
        assert_eq!(d[150 * 384 + 10], 0.0);
        assert!((m.density() - 2.0 / 6.0).abs() < 1e-12);
        // fp16 blocks of 64 from a dense 100 × 128 matrix (0x3C00 = 1.0, 0xC000 = −2.0), keeping
        // block (0, 1) and (1, 0): rows past 100 are zeros, the codes decode as fp16.
        let mut dense = vec![0x3C00u16; 100 * 128];
        dense[70 * 128 + 3] = 0xC000;
        let h = BsrMatrix::from_dense_16bit(ElemType::F16, &dense, (100, 128), 64, |r, c| r != c)
            .unwrap();
        assert_eq!(
            (h.nnz(), h.crow_indices(), h.col_indices()),
            (2, &[0, 1, 2][..], &[1, 0][..])
        );
        let d = h.dequantize();
        assert_eq!(
            (d[0], d[64], d[70 * 128 + 3], d[70 * 128 + 64]),
            (0.0, 1.0, -2.0, 0.0)
        );
        assert!(
            BsrMatrix::from_dense_16bit(ElemType::E4M3, &dense, (100, 128), 64, |_, _| true)
                .is_err()
        );
    }

    /// Blocks cut from a dense DeepSeek-style B (fp32 scale per 128 × 128) are its codes and
    /// scales where kept and zeros elsewhere, rows past the matrix stored as zero codes; formats
    /// with other scale blocks and batches are refused.
    #[test]
    fn blocks_cut_from_a_dense_matrix_are_its_values_where_kept() {
        use crate::format::{Fp8, Recipe};
        let (rows, cols) = (200, 384);
        // Each block its own magnitude, so each its own scale.
        let vals: Vec<f32> = (0..rows * cols)
            .map(|i| {
                let (r, k) = (i / cols, i % cols);
                let block = 1.0 + 2.0 * (r / 128) as f32 + 0.5 * (k / 128) as f32;
                block * ((i * 37 % 101) as f32 - 50.0) / 7.0
            })
            .collect();
        let m = ScaledMatrix::quantize(&vals, rows, cols, 1, Recipe::DeepSeekFp8.b()).unwrap();
        let keep = |br: usize, bc: usize| (br + bc).is_multiple_of(2);
        let b = BsrMatrix::from_dense_blocks(&m, keep).unwrap();
        assert_eq!(
            (b.rows(), b.cols(), b.block(), b.nnz()),
            (rows, cols, 128, 3)
        );
        assert_eq!(
            (b.crow_indices(), b.col_indices()),
            (&[0, 2, 3][..], &[0, 2, 1][..])
        );
        let scale = |r, k| m.scale_value(0, r, k) as f32;
        assert_eq!(b.scales(), &[scale(0, 0), scale(0, 256), scale(128, 128)]);
        assert_eq!(b.values().len(), 3 * 128 * 128);
        // Block (1, 1): rows 128..200 hold codes, rows 200..256 (72.. of the block) zeros.
        let last = &b.values()[2 * 128 * 128..];
        assert_eq!(last[5], m.code(0, 128, 128 + 5) as u8);
        assert!(last[72 * 128..].iter().all(|&c| c == 0));
        let (dm, db) = (m.dequantize(), b.dequantize());
        for r in 0..rows {
            for k in 0..cols {
                let want = if keep(r / 128, k / 128) {
                    dm[r * cols + k]
                } else {
                    0.0
                };
                assert_eq!(db[r * cols + k], want, "({r}, {k})");
            }
        }
        for r in [
            Recipe::Mxfp8(Fp8::E4M3),
            Recipe::Fp8PerTensor(Fp8::E4M3),
            Recipe::Fp8PerRow(Fp8::E4M3),
        ] {
            let x = ScaledMatrix::quantize(&vals, rows, cols, 1, r.b()).unwrap();
            let e = BsrMatrix::from_dense_blocks(&x, |_, _| true);
            assert!(matches!(e, Err(Error::Format(_))), "{r}: {e:?}");
        }
        let a = ScaledMatrix::quantize(&vals, rows, cols, 1, Recipe::DeepSeekFp8.a()).unwrap();
        let e = BsrMatrix::from_dense_blocks(&a, |_, _| true);
        assert!(matches!(e, Err(Error::Format(_))), "1×128 blocks: {e:?}");
        // e5m2 with the same scale blocks: not e4m3.
        let e5m2 = crate::format::OperandFormat {
            elem: ElemType::E5M2,
            ..Recipe::DeepSeekFp8.b()
        };
        let x = ScaledMatrix::quantize(&vals, rows, cols, 1, e5m2).unwrap();
        let e = BsrMatrix::from_dense_blocks(&x, |_, _| true);
        assert!(matches!(e, Err(Error::Format(_))), "e5m2: {e:?}");
        let two = ScaledMatrix::quantize(&vals, 100, cols, 2, Recipe::DeepSeekFp8.b()).unwrap();
        let e = BsrMatrix::from_dense_blocks(&two, |_, _| true);
        assert!(matches!(e, Err(Error::Shape(_))), "batch 2: {e:?}");
    }

    /// `from_parts`' checks in their order: block sizes per type, empty sides, 32-bit sides (the
    /// largest one passes that check and fails the next, its row pointers).
    #[test]
    fn parts_are_checked_for_block_size_emptiness_and_32_bit_sides() {
        let half = |block: usize| {
            BsrMatrix::from_parts(
                ElemType::BF16,
                128,
                128,
                block,
                &[0, 0],
                &[],
                vec![],
                vec![],
            )
        };
        assert!(matches!(half(32), Err(Error::Format(_))));
        assert!(half(64).is_err() && !matches!(half(64), Err(Error::Format(_))));
        let sized = |rows: usize, cols: usize| {
            BsrMatrix::from_parts(
                ElemType::E4M3,
                rows,
                cols,
                128,
                &[0, 0],
                &[],
                vec![],
                vec![],
            )
        };
        assert!(matches!(sized(0, 128), Err(Error::Shape(_))));
        assert!(matches!(sized(128, 0), Err(Error::Shape(_))));
        let big = i32::MAX as usize;
        assert!(matches!(sized(big + 1, 128), Err(Error::Shape(_))));
        assert!(matches!(sized(big, 128), Err(Error::Sparse(_))));
        assert!(matches!(sized(128, big + 1), Err(Error::Shape(_))));
        // The widest K that passes: a matrix with no stored blocks. (K = 2³¹ − 1 itself is odd,
        // never a multiple of a block: `>` against `>=` there cannot change the result.)
        assert!(sized(128, big - 127).is_ok());
    }

    /// Stages per stored block from its bytes of K, and the 32-bit count of stages checked at
    /// its edge (a matrix that reaches it would not fit in memory, so only the rule is tested).
    #[test]
    fn stored_blocks_count_128_byte_stages_in_32_bits() {
        assert_eq!(stages_per_block(128, ElemType::E4M3), 1);
        assert_eq!(stages_per_block(128, ElemType::BF16), 2);
        assert_eq!(stages_per_block(64, ElemType::F16), 1);
        assert_eq!(stages_per_block(256, ElemType::BF16), 4);
        let max = i32::MAX as usize;
        assert!(check_stage_count(max, 1).is_ok());
        assert!(matches!(
            check_stage_count(max + 1, 1),
            Err(Error::Shape(_))
        ));
        assert!(check_stage_count(max / 2, 2).is_ok());
        assert!(matches!(
            check_stage_count(max / 2 + 1, 2),
            Err(Error::Shape(_))
        ));
    }

    /// A dense matrix of another format is refused by `from_dense_blocks` itself, with a message
    /// that names what a BSR matrix is made from (not `from_parts`' element-type message).
    #[test]
    fn blocks_are_cut_only_from_deepseek_style_weights() {
        use crate::format::{Fp8, Recipe};
        let vals: Vec<f32> = (0..128 * 256).map(|i| (i % 13) as f32 - 6.0).collect();
        let mut e5m2 = Recipe::DeepSeekFp8.b();
        e5m2.elem = ElemType::E5M2;
        for f in [e5m2, Recipe::Mxfp8(Fp8::E4M3).b()] {
            let m = ScaledMatrix::quantize(&vals, 128, 256, 1, f).unwrap();
            let e = BsrMatrix::from_dense_blocks(&m, |_, _| true);
            assert!(
                matches!(&e, Err(Error::Format(s)) if s.contains("made from e4m3")),
                "{f}: {e:?}"
            );
        }
    }

    /// C's shape from the operands': the sparse operand's rows are C's rows when it is A.
    #[test]
    fn the_output_is_the_products_shape_on_either_side() {
        assert_eq!(output_dims(SparseSide::A, 300, 520), (520, 300));
        assert_eq!(output_dims(SparseSide::B, 300, 520), (300, 520));
    }

    /// A work list needs the row pointers up to the last tile's block row, no more; tiles whose
    /// runs are not cut take no split-K slot or counter.
    #[test]
    fn work_lists_need_the_row_pointers_they_read_and_uncut_runs_take_no_slots() {
        let w = work_list(&[0, 1, 2, 3], 128, 128, 300, 1, 132, 16).unwrap();
        assert_eq!((w.segments.len(), w.slots, w.counters), (3, 0, 0));
        assert!(
            w.segments
                .iter()
                .all(|s| (s.parts, s.slot, s.counter) == (1, 0, 0))
        );
        // A part is the stored blocks over the CTAs: 53 blocks over 10 CTAs, 6 each, cut the
        // 40-block run into 7.
        let w = work_list(&[0, 0, 9, 10, 50, 53], 128, 128, 640, 1, 10, 16).unwrap();
        let long = w.segments.iter().find(|s| s.n == 3).unwrap();
        assert_eq!(long.parts, 7);
        // 16-bit blocks of no size, or not dividing K: shape errors, not a division by zero.
        let codes = vec![0u16; 128 * 128];
        for block in [0, 96] {
            let e =
                BsrMatrix::from_dense_16bit(ElemType::BF16, &codes, (128, 128), block, |_, _| true);
            assert!(matches!(e, Err(Error::Shape(_))), "block {block}: {e:?}");
        }
    }
}
