//! The README's snippet, whole: quantize two matrices to DeepSeek-style FP8, multiply them on the
//! GPU, read C back. Without a GPU (or without the CUDA driver) it prints the `NoDevice` error and
//! exits with status 1.
//!
//! ```sh
//! cargo run --release --example quickstart
//! ```

use blockscaled::{Gpu, OutType, Recipe, ScaledMatrix};

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("quickstart: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> blockscaled::Result<()> {
    let (m, n, k) = (256, 512, 1024);
    // Any f32 data; these are smooth so the printout is easy to read.
    let a_f32: Vec<f32> = (0..m * k)
        .map(|i| ((i % 97) as f32 - 48.0) / 48.0)
        .collect();
    let b_f32: Vec<f32> = (0..n * k)
        .map(|i| ((i % 89) as f32 - 44.0) / 44.0)
        .collect();

    let recipe = Recipe::DeepSeekFp8; // e4m3, fp32 scales per 1×128 (A) and 128×128 (B)
    let a = ScaledMatrix::quantize(&a_f32, m, k, 1, recipe.a())?;
    let b = ScaledMatrix::quantize(&b_f32, n, k, 1, recipe.b())?;

    let gpu = Gpu::new(0)?; // Error::NoDevice without a GPU, Error::Architecture if not Hopper
    let (da, db) = (gpu.upload(&a)?, gpu.upload(&b)?);
    let mut c = gpu.output(m, n, 1, OutType::Bf16)?; // poisoned with NaN until written
    gpu.gemm(&da, &db, &mut c)?; // C = A · Bᵀ; Error::Shape if they don't fit
    let c = c.to_host()?;

    println!(
        "{} ({} SMs), kernel image {}, plan {:?}",
        gpu.name(),
        gpu.sm_count(),
        gpu.image(),
        gpu.plan(&da, &db)?
    );
    println!("C is {m} × {n} bf16; C[0][0..4] = {:?}", &c.values[..4]);
    Ok(())
}
