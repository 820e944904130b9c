//! `#[repr(C)]` kernel parameters, shared by the host (which fills them) and the kernels (which
//! read them). Kernel parameters travel by value in the `.param` space; every struct here is
//! 8-byte aligned (rustc's nvptx64 ABI rejects by-value parameters aligned above 16 bytes).
//!
//! ## Memory layout the kernels read (the host documents and validates the same)
//! - An operand (A: M×K, B: N×K) is stored K-major: element `(l, r, k)` at element index
//!   `l·batch_stride + r·row_stride + k`. For e2m1 two elements share a byte: element index `i`
//!   is in byte `i / 2`, the even element in the low nibble (bits 0–3), the odd one in the high
//!   nibble, so `row_stride` and `batch_stride` are even.
//! - Its scales: scale `(l, rb, kb)` with `rb = r / block_rows`, `kb = k / block_k` at scale index
//!   `l·scale_batch_stride + rb·scale_row_stride + kb·scale_k_stride` (so K-major and MN-major
//!   scale tensors are both described). The dequantized value is
//!   `decode(elem) · decode(scale) · tensor_scale`.
//! - The output C (M×N) is row-major, element `(l, m, n)` at `l·out_batch_stride +
//!   m·out_row_stride + n`, of type [`OutType`].

use crate::format::{ElemType, ScaleType};
use crate::gemm::scheduler::{Groups, Sparse};

/// A grouped GEMM's groups as kernel parameters (every GEMM family takes them; all zero for a
/// dense GEMM). See [`Groups`] for the layouts and the clamping of the device values.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct GroupParams {
    /// `count` int32 values in device memory: group ends (contiguous) or row counts (masked).
    pub ptr: u64,
    pub count: u32,
    /// [`GroupMode`] as u32.
    pub mode: u32,
}

/// How the groups' rows are laid out.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum GroupMode {
    /// A dense GEMM (no groups).
    #[default]
    Dense = 0,
    /// Groups stacked in A and C (ΣM rows), with their end rows on the device.
    Contiguous = 1,
    /// Group `g` in batch entry `g` of A and C (capacity rows each), with its row count on the
    /// device.
    Masked = 2,
}

impl GroupParams {
    /// The scheduler's groups (`None`: dense) when the grouped operand has `rows` rows per batch
    /// entry and its rows run along the schedule's N (`along_n`) or M.
    #[inline(always)]
    pub const fn groups(&self, rows: u32, along_n: bool) -> Option<Groups> {
        if self.mode == GroupMode::Dense as u32 {
            None
        } else {
            Some(Groups {
                ptr: self.ptr,
                count: self.count,
                masked: self.mode == GroupMode::Masked as u32,
                rows,
                along_n,
                skew: false,
            })
        }
    }
}

/// A block-sparse GEMM's sparse operand as kernel parameters (all zero for a dense GEMM): its
/// stored blocks' K-block indices and the work list ([`Sparse`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SparseParams {
    /// `count` [`crate::gemm::scheduler::Segment`]s, longest first.
    pub segments: u64,
    /// The K block (column block) of each stored block: int32 per position, in range.
    pub cols: u64,
    pub count: u32,
    /// Split segment groups: split-K slots and counters ([`Sparse`]).
    pub slots: u32,
    pub counters: u32,
    /// 1: the sparse operand is A, the kernel's N axis is C's M (it computes Cᵀ = B·Aᵀ) and
    /// stores C transposed; 0: the sparse operand is B.
    pub transposed: u32,
    /// log2 of the stages per stored block: a stage holds 128 bytes of K (128 FP8 or 64 16-bit
    /// values), so a 128 × 128 bf16 block is two stages and the others one. The work list's
    /// positions are then stages (`position >> sub_log2` the stored block, the low bits which
    /// part of its K).
    pub sub_log2: u32,
    pub _pad: u32,
}

impl SparseParams {
    /// The scheduler's work list.
    #[inline(always)]
    pub const fn sparse(&self) -> Sparse {
        Sparse {
            segments: self.segments,
            count: self.count,
            slots: self.slots,
            counters: self.counters,
        }
    }
}

/// Output element type.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum OutType {
    #[default]
    Bf16 = 0,
    F16 = 1,
    F32 = 2,
}

impl OutType {
    /// Bytes per element.
    pub const fn bytes(self) -> usize {
        match self {
            OutType::Bf16 | OutType::F16 => 2,
            OutType::F32 => 4,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            OutType::Bf16 => "bf16",
            OutType::F16 => "f16",
            OutType::F32 => "f32",
        }
    }

    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            0 => Some(OutType::Bf16),
            1 => Some(OutType::F16),
            2 => Some(OutType::F32),
            _ => None,
        }
    }
}

/// One block-scaled operand as a kernel sees it. Strides are in elements (data) and in scale
/// elements (scales); pointers are device addresses.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OperandParams {
    pub data: u64,
    pub scales: u64,
    pub row_stride: u64,
    pub batch_stride: u64,
    pub scale_row_stride: u64,
    pub scale_k_stride: u64,
    pub scale_batch_stride: u64,
    /// Rows of this operand (M for A, N for B).
    pub rows: u32,
    /// [`ElemType`] as u32.
    pub elem: u32,
    /// [`ScaleType`] as u32.
    pub scale_type: u32,
    /// Rows that share one scale (1, 128, or `rows` for per-tensor).
    pub block_rows: u32,
    /// K elements that share one scale (16, 32, 128, or K for per-row / per-tensor).
    pub block_k: u32,
    /// Per-tensor fp32 multiplier (NVFP4's second-level scale; 1.0 otherwise).
    pub tensor_scale: f32,
}

impl OperandParams {
    pub fn elem_type(&self) -> Option<ElemType> {
        ElemType::from_u32(self.elem)
    }
    pub fn scale_kind(&self) -> Option<ScaleType> {
        ScaleType::from_u32(self.scale_type)
    }
}

/// Parameters of one GEMM: C[l] = A[l] · B[l]ᵀ for l in 0..L.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GemmParams {
    pub a: OperandParams,
    pub b: OperandParams,
    pub out: u64,
    pub out_row_stride: u64,
    pub out_batch_stride: u64,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub l: u32,
    /// [`OutType`] as u32.
    pub out_type: u32,
    pub _pad: u32,
}

/// Reference kernel block shape: 32 threads along N (one warp reads B rows 32 apart and shares
/// each A element by broadcast), 8 warps along M.
pub const REFERENCE_BLOCK_N: u32 = 32;
pub const REFERENCE_BLOCK_M: u32 = 8;
pub const REFERENCE_BLOCK_THREADS: u32 = REFERENCE_BLOCK_N * REFERENCE_BLOCK_M;

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, size_of};

    #[test]
    fn params_have_no_implicit_padding_and_param_space_alignment() {
        assert_eq!(size_of::<OperandParams>(), 7 * 8 + 6 * 4);
        assert_eq!(
            size_of::<GemmParams>(),
            2 * size_of::<OperandParams>() + 3 * 8 + 6 * 4
        );
        assert_eq!(align_of::<GemmParams>(), 8);
        // Ten addresses and strides, then twelve 4-byte fields.
        assert_eq!(size_of::<EpilogueParams>(), 10 * 8 + 12 * 4);
        assert_eq!(align_of::<EpilogueParams>(), 8);
    }
}

/// Split-K's workspace (`gemm::splitk`), used when a GEMM splits K: the f32 partial sums of
/// every CTA tile and K range, and the u32 arrival counters (one per CTA tile and consumer
/// warpgroup), all 0 between launches; sized by `gemm::scheduler::Schedule::splitk_workspace`.
/// Both 0 without a split.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SplitKParams {
    pub ws: u64,
    pub counters: u64,
}

/// The activation of a fused epilogue (stable values, passed to the kernels).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Activation {
    #[default]
    None = 0,
    /// max(x, 0) (NaN stays NaN).
    Relu = 1,
    /// x · Φ(x) with the Gauss error function: `0.5·x·(1 + erf(x/√2))`.
    GeluErf = 2,
    /// The tanh approximation: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
    GeluTanh = 3,
    /// x · sigmoid(x).
    Silu = 4,
    /// Over paired columns: output column j = silu(t[2j]) · t[2j + 1], where t is the product
    /// after α, β·C and the bias. The gate and up projections' weights are interleaved row by row
    /// (B row 2j the gate's row j, 2j + 1 the up's): the output has N / 2 columns.
    SwiGlu = 5,
}

impl Activation {
    pub const ALL: [Activation; 6] = [
        Activation::None,
        Activation::Relu,
        Activation::GeluErf,
        Activation::GeluTanh,
        Activation::Silu,
        Activation::SwiGlu,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Activation::None => "none",
            Activation::Relu => "relu",
            Activation::GeluErf => "gelu",
            Activation::GeluTanh => "gelu-tanh",
            Activation::Silu => "silu",
            Activation::SwiGlu => "swiglu",
        }
    }
}

/// A GEMM's fused epilogue as kernel parameters (the families' fused kernels take them beside
/// their own: [`FusedParams`]). With `t` the product's value at (l, m, n):
///
/// `t ← α·t`, `t ← t + β·C[l][m][n]` (`c` set), `t ← t + bias[l?][n]` (`bias` set),
/// `y ← act(t)` (SwiGLU: `y[j] = silu(t[2j])·t[2j+1]`), `y ← y + R[l][m][j]` (`residual` set),
/// then `y` is stored as the output type, or quantized (`q_elem` set) into codes and scales the
/// next GEMM reads as its A. Every step is one f32 operation rounded to nearest, in this order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EpilogueParams {
    /// β·C's C: `[l][m][n]` row-major (the product's shape) of `c_type`; 0: none.
    pub c: u64,
    /// The bias: `n` values per batch entry (`bias_batch` 1) or one row for all (0), of
    /// `bias_type`; 0: none.
    pub bias: u64,
    /// The residual: `[l][m][n_out]` row-major (the output's shape) of `residual_type`; 0: none.
    pub residual: u64,
    /// Quantized output: codes `[l][m][n_out]` (e2m1 two per byte, the even column in the low
    /// nibble).
    pub q_data: u64,
    /// Its scales, `(l, m, kb)` at `l·q_stride_l + m·q_stride_r + kb·q_stride_k` (in scales).
    pub q_scales: u64,
    pub q_stride_l: u64,
    pub q_stride_r: u64,
    pub q_stride_k: u64,
    /// 0, or the fp32 scales again in the FP8 kernel's A-role layout `[l][n_out/128][q_m_pad]`.
    pub q_sfa: u64,
    /// Global memory a warp stages its rows in where the kernel's shared memory has no room
    /// ([`crate::gemm::epilogue::fuse`]): `grid ·` [`crate::gemm::layout::fused_staging`] bytes; 0 where
    /// shared memory is used.
    pub scratch: u64,
    pub alpha: f32,
    pub beta: f32,
    /// NVFP4's fp32 tensor scale (given: the output's largest magnitude is not known before it
    /// is written).
    pub q_tensor_scale: f32,
    /// [`OutType`] of `c`, of `residual`; the bias's: [`OutType::Bf16`] or [`OutType::F32`].
    pub c_type: u32,
    pub residual_type: u32,
    pub bias_type: u32,
    pub bias_batch: u32,
    /// [`Activation`] as u32.
    pub activation: u32,
    /// [`ElemType`] of the quantized output's codes as u32, [`EPI_NO_QUANT`] for none.
    pub q_elem: u32,
    /// [`ScaleType`] as u32, and the columns per scale (16, 32 or 128).
    pub q_scale: u32,
    pub q_block: u32,
    pub q_m_pad: u32,
}

/// The parameter of a family's fused-epilogue kernels: the family's own parameters `p`, as its
/// plain kernels take them, and the epilogue's. (The plain kernels' parameters carry nothing of
/// the epilogue, so their code is the same as without fused kernels in the crate.)
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FusedParams<P> {
    pub p: P,
    pub epi: EpilogueParams,
}

/// Tensor maps one GEMM launch can carry in its parameter ([`Mapped`]): A's, B's, the
/// output's and A's scales'.
pub const MAP_SLOTS: usize = 4;

/// Bytes of one `CUtensorMap`.
pub const MAP_BYTES: usize = 128;

/// The tag of a map field: `MAP_IN_PARAMS` | the map's byte offset in the launch's
/// [`Mapped::maps`] (so that a present map is never 0, the kernels' "absent").
pub const MAP_IN_PARAMS: u64 = 1 << 63;

/// The parameter of every GEMM kernel (the TMA kernels): the launch's tensor maps, then the
/// family's parameters `p`. TMA reads a map from the kernel's parameter space where it is
/// 64-byte aligned; rustc's nvptx64 ABI declares by-value parameters at most 16-byte aligned, so
/// the kernel build rewrites this parameter's alignment to 64 in the PTX (`blockscaled-builder`),
/// and the maps come first so that each starts 64-byte aligned too. A map field of `p` holds
/// [`MAP_IN_PARAMS`] | the map's byte offset here (`ptx::tma` resolves it), or 0 where absent.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mapped<P> {
    pub maps: [[u64; MAP_BYTES / 8]; MAP_SLOTS],
    pub p: P,
}

/// [`EpilogueParams::q_elem`] of an epilogue without quantized output.
pub const EPI_NO_QUANT: u32 = u32::MAX;

impl EpilogueParams {
    /// The plain store: nothing fused.
    pub const fn plain() -> Self {
        EpilogueParams {
            c: 0,
            bias: 0,
            residual: 0,
            q_data: 0,
            q_scales: 0,
            q_stride_l: 0,
            q_stride_r: 0,
            q_stride_k: 0,
            q_sfa: 0,
            scratch: 0,
            alpha: 1.0,
            beta: 0.0,
            q_tensor_scale: 1.0,
            c_type: 0,
            residual_type: 0,
            bias_type: 0,
            bias_batch: 0,
            activation: 0,
            q_elem: EPI_NO_QUANT,
            q_scale: 0,
            q_block: 0,
            q_m_pad: 0,
        }
    }

    /// Whether the output is quantized.
    #[inline(always)]
    pub const fn quantized(&self) -> bool {
        self.q_elem != EPI_NO_QUANT
    }

    /// Whether pairs of product columns make one output column (SwiGLU).
    #[inline(always)]
    pub const fn paired(&self) -> bool {
        self.activation == Activation::SwiGlu as u32
    }
}

/// Whether an epilogue with these steps runs in the consumers' own registers, on each thread's
/// fragment (`gemm::fuse::apply`), then stored as the plain kernels store or quantized
/// (`gemm::fuse::quantize_fragment`): no β·C, no residual, no SwiGLU (its column pairs halve the
/// output, which then leaves a block across two tiles), and any unquantized output, FP8 with
/// fp32 scales per 128 columns or MXFP8 (e8m0 scales per 32) (`quant`:
/// [`ElemType`](crate::format::ElemType), [`ScaleType`](crate::format::ScaleType) as u32 and the
/// block; a 128-column tile then holds one or four blocks per row, each in four lanes). The host
/// chooses the kernel by it; one rule for both.
pub const fn in_registers(
    c: bool,
    residual: bool,
    activation: u32,
    quant: Option<(u32, u32, u32)>,
) -> bool {
    let fp8 = crate::format::ElemType::E4M3 as u32;
    let fp8_wide = crate::format::ElemType::E5M2 as u32;
    let quant_ok = match quant {
        None => true,
        Some((elem, scale, block)) => {
            (elem == fp8 || elem == fp8_wide)
                && ((scale == crate::format::ScaleType::F32 as u32 && block == 128)
                    || (scale == crate::format::ScaleType::E8M0 as u32 && block == 32))
        }
    };
    !c && !residual && activation != Activation::SwiGlu as u32 && quant_ok
}
