//! The quantizers' parameters and the layout arithmetic the host's launches and the device
//! kernels share: threads and elements a lane, the input and span encodings, and a row's lanes.

/// Threads per block of both kernels.
pub const QUANTIZE_THREADS: u32 = 256;
/// Blocks of the quantizer that must fit on one SM (`.minnctapersm`): ptxas keeps it within
/// 65536 / (4 · 256) = 64 registers a thread, so that 1024 threads an SM, each with the loads of
/// three rows ahead in flight, keep the memory busy.
pub const QUANTIZE_MIN_BLOCKS: u32 = 4;
/// Elements each thread of the quantizer takes from a row: two 16-byte loads either way (16 bf16
/// / fp16, 8 f32). The quantizer's cost is per element and per row (the block maximum's shuffles,
/// the scale, its reciprocal, the stores' addresses: about a hundred instructions a row), not
/// per byte: ncu on 8 elements a thread showed bf16 as slow as f32, about 39 instructions an
/// element; 16 halve the per-row part for 16-bit input.
pub const fn quantize_elems(input: InputType) -> u32 {
    match input {
        InputType::F32 => 8,
        InputType::Bf16 | InputType::F16 => 16,
    }
}

/// Threads a block of the per-row quantizers may have ([`super::ROW_KERNELS`]): a whole row's lanes.
pub const ROW_THREADS_MAX: u32 = 1024;
/// Dynamic shared memory of a per-row quantizer's block: a word per warp for the row maximum.
pub const ROW_SHARED_BYTES: u32 = 4 * ROW_THREADS_MAX / 32;

/// The element type of the input tensor (stable values, passed to the kernels).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InputType {
    F32 = 0,
    Bf16 = 1,
    F16 = 2,
}

impl InputType {
    /// The type of [`QuantizeParams::input`]'s value (F32 for anything unknown).
    pub const fn of(v: u32) -> Self {
        match v {
            1 => InputType::Bf16,
            2 => InputType::F16,
            _ => InputType::F32,
        }
    }

    pub const fn bytes(self) -> usize {
        match self {
            InputType::F32 => 4,
            InputType::Bf16 | InputType::F16 => 2,
        }
    }
}

/// What one scale covers (stable values).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleSpan {
    /// 1 × `block_k` elements of a row.
    Block = 0,
    /// A whole row.
    Row = 1,
    /// A whole batch entry.
    Entry = 2,
}

/// Parameters of both kernels.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QuantizeParams {
    /// The input `[l][rows][k]`, 16-byte aligned.
    pub src: u64,
    /// Codes `[l][rows][k]` (e2m1: two per byte, the even-K element in the low nibble).
    pub dst: u64,
    /// Scales in an affine layout: scale `(l, row block, k block)` at
    /// `l·scale_stride_l + rb·scale_stride_r + kb·scale_stride_k` (in scales).
    pub scales: u64,
    pub scale_stride_l: u64,
    pub scale_stride_r: u64,
    pub scale_stride_k: u64,
    /// 0, or one-byte scales in the 128×4 swizzled layout, `swizzled_entry` bytes per batch entry.
    pub swizzled: u64,
    pub swizzled_entry: u64,
    /// 0, or fp32 scales in the FP8 kernel's A-role layout `[l][k/128][m_pad]` (1×128 blocks, or
    /// a row's or an entry's scale in each of its K blocks' entries; K a multiple of 128).
    pub sfa: u64,
    /// Maxima (f32 bits) by [`ScaleSpan`]: `[l][rows]` for rows, `[l]` for entries; NVFP4's
    /// tensor maximum at `tensor_amax`.
    pub amax: u64,
    pub tensor_amax: u64,
    pub rows: u32,
    pub k: u32,
    pub batch: u32,
    pub m_pad: u32,
    /// [`InputType`].
    pub input: u32,
    /// [`ScaleSpan`].
    pub span: u32,
    /// Elements of a 1×k block ([`ScaleSpan::Block`]): 16, 32 or 128.
    pub block_k: u32,
    /// NVFP4: the tensor scale when given (> 0); 0: computed from `tensor_amax`.
    pub tensor_scale: f32,
    /// 0, or one-byte scales also in the MX kernel's layout `[l][⌈k/64⌉][mx_rows_pad][mx_per]`
    /// (1×16 or 1×32 blocks, `mx_per = 64 / block_k`): the copy that kernel reads, written here
    /// instead of by a re-layout afterwards (whose zeros past the rows and K the buffer keeps).
    pub mx: u64,
    pub mx_rows_pad: u32,
    pub mx_per: u32,
    /// Non-zero: rows are visited from the last (after a maximum pass, which read them from the
    /// first: the rows it read last are the ones still in L2).
    pub reverse: u32,
    pub _pad: u32,
}

/// Lanes of one scale block, and scale blocks per row (a row's lanes: their product), for the
/// quantizer of `p.input` ([`quantize_elems`] elements a lane).
pub const fn lanes(p: &QuantizeParams) -> (u32, u32) {
    lanes_of(p, quantize_elems(InputType::of(p.input)))
}

/// [`lanes`] with `n` elements a lane.
pub(super) const fn lanes_of(p: &QuantizeParams, n: u32) -> (u32, u32) {
    if p.span == ScaleSpan::Block as u32 {
        // (A block of 16 elements and 16 elements a lane: one lane a block.)
        let per = p.block_k / n;
        (if per == 0 { 1 } else { per }, p.k.div_ceil(p.block_k))
    } else {
        // One scale over the whole row (or entry): the row's lanes share no maximum.
        (1, p.k.div_ceil(n))
    }
}
