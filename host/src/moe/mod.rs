//! Mixture-of-experts layers on the block-scaled kernels: the router's top-k on the GPU, the
//! tokens quantized to FP8 with fp32 scales per 1×128 and moved to their experts' rows, two
//! grouped GEMMs (gate/up, then down) with SwiGLU and the FP8 quantization between them in one
//! kernel, and each token's weighted sum of its experts' rows (`blockscaled_kernels::moe` has the
//! rules). Every count stays on the GPU: the grouped GEMMs read the groups the routing wrote, so
//! no step waits on the host and a layer can be captured in a CUDA graph.
//!
//! [`MoeLayer`] runs a layer whose experts are all on one GPU. With the `nccl` feature,
//! `ExpertParallel` splits the experts over GPUs, exchanging the tokens' codes and scales and
//! the experts' output rows with NCCL's all-to-all ([`crate::Ranks`]) in chunks of a fixed
//! capacity per peer. Both run the same kernels on the same rows, so an expert-parallel layer's
//! output equals the one-GPU layer's bit for bit where both run the grouped GEMMs on the same
//! plans (each row's products do not depend on the rows beside it).
//!
//! Weights are DeepSeek FP8 (e4m3, fp32 scales per 128×128): `w1` the experts' gate and up
//! projections interleaved row by row (`experts × 2·inter × hidden`, [`crate::interleave_gate_up`]),
//! `w2` the down projections (`experts × hidden × inter`).
//!
//! `kernels.rs` loads and launches the kernels; `local.rs` holds one GPU's share of a layer (its
//! step buffers and the phases both layers run).

pub(crate) mod kernels;
mod local;

use crate::buffers::{DeviceMatrix, DeviceOutput};
use crate::device::Gpu;
use crate::error::Result;
use crate::format::OutType;
use crate::grouped::{DeviceGroups, GroupLayout};
use crate::plan::Plan;
use crate::quantizer::DeviceTensor;
use cudarc::driver::CudaView;

#[cfg(feature = "nccl")]
pub(crate) use local::Chunks;
pub(crate) use local::Local;

pub use blockscaled_kernels::moe::Scoring;

/// A mixture-of-experts layer's dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MoeShape {
    /// The model's width: each token's features, the experts' input and output (a multiple of 128).
    pub hidden: usize,
    /// Each expert's intermediate width (a multiple of 128).
    pub inter: usize,
    /// Experts in the layer (all GPUs'), at most 1024.
    pub experts: usize,
    /// Experts each token chooses, at most 32 and at most `experts`.
    pub top_k: usize,
}

/// How a layer routes and lays out its rows.
#[derive(Clone, Copy, Debug)]
pub struct MoeOptions {
    /// The router's weights: softmax or sigmoid over the chosen logits.
    pub scoring: Scoring,
    /// The grouped GEMMs' layout: contiguous (rows packed expert after expert: prefill) or masked
    /// (a slot of `group_capacity` rows per expert: decode, a fixed shape for CUDA graphs).
    pub layout: GroupLayout,
    /// Rows a GPU sends each peer per step (expert parallelism). `None`: tokens · top_k, which
    /// drops nothing. Entries past it are dropped (they add nothing to their token's output).
    pub peer_capacity: Option<usize>,
    /// Rows per expert in the masked layout. `None`: every token once from each GPU, which drops
    /// nothing. Entries past it are dropped.
    pub group_capacity: Option<usize>,
    /// The two grouped GEMMs' plans; `None`: chosen per call ([`Gpu::grouped_plan`]).
    pub plans: Option<(Plan, Plan)>,
    /// The output's type: bf16 or f32.
    pub output: OutType,
}

impl Default for MoeOptions {
    fn default() -> Self {
        MoeOptions {
            scoring: Scoring::Softmax,
            layout: GroupLayout::Contiguous,
            peer_capacity: None,
            group_capacity: None,
            plans: None,
            output: OutType::Bf16,
        }
    }
}

/// The last step's buffers, for checks and for engines that read the routing: the router's
/// choices and weights (`[tokens][top_k]`), each entry's row (`slot`, −1 where dropped), the
/// quantized tokens, the grouped rows and groups, and the grouped GEMMs' outputs.
pub struct MoeStep<'a> {
    /// i32 `[tokens][top_k]`: each token's experts, best first.
    pub chosen: CudaView<'a, i32>,
    /// f32 `[tokens][top_k]`: their weights.
    pub weights: CudaView<'a, f32>,
    /// i32 `[tokens][top_k]`: each entry's row (in the grouped rows on one GPU, in the peer
    /// chunks under expert parallelism), −1 where dropped.
    pub slot: CudaView<'a, i32>,
    /// The tokens, quantized (FP8, fp32 scales per 1×128).
    pub tokens: &'a DeviceMatrix<'static>,
    /// The grouped GEMMs' rows of this GPU's experts.
    pub grouped: &'a DeviceMatrix<'static>,
    /// Their groups (ends or counts), written on the GPU.
    pub groups: &'a DeviceGroups<'static>,
    /// The gate/up GEMM's output (bf16, `2·inter` columns).
    pub gate_up: &'a DeviceOutput<'static>,
    /// SwiGLU of it, quantized (FP8, fp32 scales per 1×128).
    pub hidden: &'a DeviceMatrix<'static>,
    /// The down GEMM's output (bf16).
    pub down: &'a DeviceOutput<'static>,
}

/// A mixture-of-experts layer with all its experts on one GPU (module doc).
pub struct MoeLayer<'a> {
    local: Local<'a>,
}

impl std::fmt::Debug for MoeLayer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MoeLayer")
            .field("shape", &self.local.shape)
            .field("opts", &self.local.opts)
            .finish()
    }
}

impl<'a> MoeLayer<'a> {
    /// A layer over `gpu`'s experts `w1` (`experts × 2·inter × hidden`, gate and up interleaved)
    /// and `w2` (`experts × hidden × inter`), DeepSeek FP8 weights. `Error::Shape` /
    /// `Error::Format` / `Error::WrongGpu` for weights or a shape the layer cannot take.
    pub fn new(
        gpu: &'a Gpu,
        shape: MoeShape,
        w1: &'a DeviceMatrix<'a>,
        w2: &'a DeviceMatrix<'a>,
        opts: MoeOptions,
    ) -> Result<Self> {
        Ok(MoeLayer {
            local: Local::new(gpu, shape, (w1, w2), opts, 1)?,
        })
    }

    /// One step: `x` (tokens × hidden, f32 / bf16 / fp16) routed by `logits` (tokens × experts,
    /// f32) through the experts into `out` (tokens × hidden, the options' type). Asynchronous on
    /// the GPU handle's stream; allocates only at the first step of each token count.
    pub fn forward(
        &mut self,
        x: &DeviceTensor,
        logits: &DeviceTensor,
        out: &mut DeviceOutput,
    ) -> Result<()> {
        self.local.dispatch(x, logits)?;
        self.local.experts()?;
        self.local.combine(out)
    }

    /// The last step's buffers ([`MoeStep`]); `None` before the first.
    pub fn last_step(&self) -> Option<MoeStep<'_>> {
        self.local.last_step()
    }
}
