//! # blockscaled
//!
//! Block-scaled low-precision matrix multiplication (MXFP8, MXFP4, NVFP4, DeepSeek-style FP8,
//! per-tensor and per-row FP8) on NVIDIA GPUs, with kernels written in `no_std` Rust and compiled to
//! PTX by this crate's build script.
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

pub mod config;
mod device;
mod error;
pub mod format;
pub mod image;
mod matrix;
mod output;
mod quantize;
pub mod reference;
mod sm90;

pub use config::{Plan, Sm90Config};
pub use device::{DeviceMatrix, DeviceOutput, Gpu, GpuArch};
pub use error::{Error, Result};
pub use format::{
    ElemType, Fp8, OperandFormat, OutType, Recipe, ScaleBlock, ScaleMajor, ScaleType,
};
pub use image::KernelImage;
pub use matrix::{MatrixDesc, ScaleLayout, ScaledMatrix};
pub use output::{HostOutput, output_ulp, round_output};

/// The kernel crate, for its formats and parameter structs.
pub use blockscaled_kernels as kernels;
