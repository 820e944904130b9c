//! # blockscaled
//!
//! Block-scaled low-precision matrix multiplication (MXFP8, MXFP4, NVFP4, DeepSeek-style FP8,
//! per-tensor and per-row FP8) on NVIDIA GPUs, with kernels written in `no_std` Rust
//! (`blockscaled-kernels`). The package ships them compiled (PTX and cubins for sm_90a and
//! sm_100a, [`image`]), so a dependent project builds on stable Rust with no CUDA toolkit;
//! `BLOCKSCALED_BUILD_KERNELS=1` builds them from the repository's sources instead. Runnable:
//! `examples/quickstart.rs` (this snippet) and `examples/gemm_check.rs` (GEMMs checked against the
//! CPU reference).
//!
//! ```no_run
//! use blockscaled::{Gpu, OutType, Recipe, ScaledMatrix};
//! # fn main() -> blockscaled::Result<()> {
//! let (m, n, k) = (256, 512, 1024);
//! let a_f32: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
//! let b_f32: Vec<f32> = (0..n * k).map(|i| ((i * 104729) % 1000) as f32 / 500.0 - 1.0).collect();
//! let recipe = Recipe::DeepSeekFp8;
//! let a = ScaledMatrix::quantize(&a_f32, m, k, 1, recipe.a())?;
//! let b = ScaledMatrix::quantize(&b_f32, n, k, 1, recipe.b())?;
//! let gpu = Gpu::new(0)?;
//! let (da, db) = (gpu.upload(&a)?, gpu.upload(&b)?);
//! let mut c = gpu.output(m, n, 1, OutType::Bf16)?;
//! gpu.gemm(&da, &db, &mut c)?;
//! let c = c.to_host()?; // C = A · Bᵀ, bf16 values as f32
//! # let _ = c; Ok(()) }
//! ```
//!
//! Layouts are documented on [`ScaledMatrix`] (data, packing, scales) and [`HostOutput`] (C).
//!
//! An engine's own memory and streams: [`Gpu::from_stream`], [`Gpu::with_stream`], the view
//! constructors ([`Gpu::matrix_view`], [`Gpu::tensor_view`], [`Gpu::output_view`], …) and one call
//! description, [`Call`], run by [`Gpu::run`] (the guide: `docs/ENGINE.md`).
//!
//! Modules: `error`; `format`; `matrix`, `quantize`, `output`, `bsr` (block-sparse operands),
//! [`reference`](mod@reference) (CPU); [`image`] (the kernels' cubin or PTX); `alloc` (every
//! device allocation, counted); `buffers` (device matrices and outputs over owned or caller
//! memory), `grouped` (a grouped GEMM's groups); `launch` (the one launch path); `families` (one
//! folder per kernel family on one skeleton: the `Family` trait, the shared operand copies, the
//! persistent launch; docs/ARCHITECTURE.md); `config` (what every configuration type provides),
//! `splitk`, `tensor_map`, `workspace`; [`plan`] (the choice of kernel); `device` ([`Gpu`]),
//! `views` (its constructors over caller memory), `call` ([`Call`] and the per-kind methods over
//! it).

#![warn(missing_docs)]

mod alloc;
mod bsr;
mod buffers;
mod call;
mod config;
mod device;
mod error;
mod families;
pub mod format;
mod fused;
mod grouped;
mod held;
pub mod image;
mod launch;
mod matrix;
mod moe;
mod output;
#[cfg(feature = "nccl")]
mod parallel;
pub mod plan;
mod prepare;
mod quantize;
mod quantizer;
pub mod reference;
mod splitk;
pub mod swizzle;
mod tensor_map;
mod views;
mod workspace;

pub use alloc::device_allocations;
pub use blockscaled_kernels::quantize::InputType;
pub use bsr::{BsrMatrix, DeviceBsr, SparseSide, WorkList, work_list};
pub use buffers::{DeviceMatrix, DeviceOutput};
pub use call::Call;
pub use device::Gpu;
pub use error::{Error, Result};
pub use families::fp8::Sm90Config;
pub use families::half::Sm90HalfConfig;
pub use families::mx::Sm90MxConfig;
pub use families::w4::Sm90W4Config;
pub use format::{
    ElemType, Fp4Weights, Fp8, OperandFormat, OutType, Recipe, ScaleBlock, ScaleMajor, ScaleType,
};
pub use fused::{Activation, Epilogue, interleave_gate_up};
pub use grouped::{DeviceGroups, GroupLayout};
pub use image::KernelImage;
pub use matrix::{GemmShape, MatrixDesc, ScaleLayout, ScaledMatrix};
pub use moe::{MoeLayer, MoeOptions, MoeShape, MoeStep, Scoring};
pub use output::{HostOutput, output_ulp, round_output};
#[cfg(feature = "nccl")]
pub use parallel::{ExpertParallel, Ranks};
pub use plan::{GpuArch, Plan};
pub use quantizer::{DeviceQuantized, DeviceTensor, QuantizeOptions, TensorElement};
pub use views::{DEVICE_ALIGN, IntoDeviceBytes, IntoDeviceBytesMut, Plain, RawDevice};
pub use workspace::{Workspace, WorkspaceSize};

pub use blockscaled_kernels::gemm::scheduler::ClusterShape;
/// The kernel crate's types that [`Sm90Config`] holds: the tile shape and the cluster shape.
pub use blockscaled_kernels::sm90::Tile as Sm90Tile;
/// The tile shapes of the sm90 16-bit kernel ([`Sm90HalfConfig`]).
pub use blockscaled_kernels::sm90_half::HalfTile as Sm90HalfTile;
/// The tile shapes of the sm90 MX kernel ([`Sm90MxConfig`]).
pub use blockscaled_kernels::sm90_mx::MxTile as Sm90MxTile;
/// The tile shapes of the sm90 4-bit-weights kernel ([`Sm90W4Config`]): activation rows per tile.
pub use blockscaled_kernels::sm90_w4::W4Tile as Sm90W4Tile;

/// The kernel crate, for its formats and parameter structs.
pub use blockscaled_kernels as kernels;
