#!/usr/bin/env bash
# Checks that blockscaled behaves as a dependency. (1) It builds with the oldest Rust its
# Cargo.toml declares (`rust-version`). (2) It builds in the dependency graph of a candle program: a throwaway project that depends
# on blockscaled with its default features off, beside cudarc with candle-core 0.11's own features
# (`cuda-version-from-build-system`, `dynamic-linking`, `f16`, `f8`, cuBLAS, cuRAND), so that
# cudarc is built once with the dependent's choices (its CUDA version from nvcc, libcuda linked
# at build time) and blockscaled must compile against that. `cargo check`, so nothing links
# libcuda here; cudarc's build script runs `nvcc --version`: the pip package's nvcc that setup.sh
# installs beside ptxas. Stable Rust, the shipped kernel images.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
eval "$(scripts/setup.sh)"
nvcc_dir=$(dirname "$PTXAS")

msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
rustup toolchain install "$msrv" --profile minimal >/dev/null 2>&1
BLOCKSCALED_BUILD_KERNELS=0 CARGO_TARGET_DIR=target/msrv cargo "+$msrv" check --quiet -p blockscaled
echo "check-as-dependency: blockscaled builds with Rust $msrv (its rust-version)"

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/src"
cat > "$dir/Cargo.toml" <<TOML
[package]
name = "engine-graph"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
blockscaled = { path = "$root/host", default-features = false }
cudarc = { version = "0.19.10", default-features = false, features = ["std", "cublas", "cublaslt", "curand", "driver", "nvrtc", "f16", "f8", "cuda-version-from-build-system", "dynamic-linking"] }
half = "2"

[workspace]
TOML
cat > "$dir/src/main.rs" <<'RS'
//! blockscaled on a stream and over memory of the dependent's own cudarc.
use std::sync::Arc;

use blockscaled::{Gpu, InputType, OutType};
use cudarc::driver::{CudaSlice, CudaStream};

fn step(stream: Arc<CudaStream>, x: &CudaSlice<half::bf16>, y: &mut CudaSlice<half::bf16>) -> blockscaled::Result<()> {
    let gpu = Gpu::from_stream(stream)?;
    let t = gpu.tensor_view(x, InputType::Bf16, (16, 128, 1))?;
    let a = gpu.quantize(&t, blockscaled::Recipe::DeepSeekFp8.a())?;
    let mut c = gpu.output_view(y, OutType::Bf16, (16, 16, 1))?;
    let b = gpu.quantize(&t, blockscaled::Recipe::DeepSeekFp8.a())?;
    gpu.gemm(&a, &b, &mut c)
}

fn main() {
    let _ = step;
}
RS
PATH="$nvcc_dir:$PATH" BLOCKSCALED_BUILD_KERNELS=0 CARGO_TARGET_DIR="${BLOCKSCALED_GRAPH_TARGET:-$dir/target}" \
  cargo +stable check --quiet --manifest-path "$dir/Cargo.toml"
echo "check-as-dependency: blockscaled builds against cudarc with candle's features (default features off)"
