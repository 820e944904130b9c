//! Runs GEMMs on the GPU in four formats on fresh random data and checks every element of C
//! against the CPU reference (`blockscaled::reference`: both operands dequantized exactly,
//! products summed in float64), within the error bound of the kernel that ran.
//!
//! ```sh
//! cargo run --release --example gemm_check
//! ```
//!
//! The bound per element is `rel · Σ_k |a_k·b_k|` plus one unit in the last place of f32 and of
//! bf16 (the two roundings of the output), where `rel` is the kernel's accumulation error:
//! - FP8 tensor cores (the FP8 kernel, and MX / NVFP4 folded onto it from M = 256): 2^-7 — they add
//!   products with fewer bits than fp32 and truncate; the fold adds up to 2^-4 for NVFP4, whose
//!   e2m1 × ue4m3 products are rounded once to e4m3;
//! - bf16 tensor cores with fp32 accumulation (the exact MX kernel, the 16-bit and 4-bit-weights
//!   kernels): (K/8 + 1)·2^-23, two fp32 roundings per 16-wide step.

use blockscaled::{Fp8, Gpu, OutType, Plan, Recipe, ScaledMatrix, output_ulp, reference};
use rand::Rng;

fn main() -> std::process::ExitCode {
    match run() {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("gemm_check: some results were outside their bound");
            std::process::ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("gemm_check: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> blockscaled::Result<bool> {
    let gpu = Gpu::new(0)?;
    println!("{}, kernel image {}", gpu.name(), gpu.image());
    // M not a multiple of any tile (ragged last tile); M = 200 keeps the MX formats on the exact
    // MX kernel, M = 512 folds them onto the FP8 kernel.
    let cases = [
        (Recipe::DeepSeekFp8, 200, 384, 1024),
        (Recipe::DeepSeekFp8, 1000, 1536, 2048),
        (Recipe::Mxfp8(Fp8::E4M3), 200, 384, 1024),
        (Recipe::Mxfp4, 200, 384, 1024),
        (Recipe::Nvfp4, 200, 384, 1024),
        (Recipe::Nvfp4, 512, 768, 1024),
    ];
    let mut rng = rand::rng();
    let mut all_ok = true;
    for (recipe, m, n, k) in cases {
        // Normal values with a few 20× outliers, so the block scales differ.
        let mut values = |len: usize| -> Vec<f32> {
            (0..len)
                .map(|_| {
                    let x: f32 = rng.random_range(-1.0..1.0);
                    if rng.random_range(0..64) == 0 {
                        20.0 * x
                    } else {
                        x
                    }
                })
                .collect()
        };
        let a = ScaledMatrix::quantize(&values(m * k), m, k, 1, recipe.a())?;
        let b = ScaledMatrix::quantize(&values(n * k), n, k, 1, recipe.b())?;
        let (da, db) = (gpu.upload(&a)?, gpu.upload(&b)?);
        let plan = gpu.plan(&da, &db)?;
        let mut c = gpu.output(m, n, 1, OutType::Bf16)?;
        gpu.gemm(&da, &db, &mut c)?;
        let got = c.to_host()?;

        let (want, abs_sum) = reference::gemm_f64(&a, &b)?;
        let (kernel, rel) = match plan {
            Plan::Sm90Fp8(_) => ("sm90 FP8", 2f64.powi(-7)),
            Plan::Sm90MxFp8(_) if recipe == Recipe::Nvfp4 => {
                ("sm90 FP8 (NVFP4 folded)", 2f64.powi(-7) + 2f64.powi(-4))
            }
            Plan::Sm90MxFp8(_) => ("sm90 FP8 (folded)", 2f64.powi(-7)),
            Plan::Sm90Mx(_) => ("sm90 MX (exact)", (k as f64 / 8.0 + 1.0) * 2f64.powi(-23)),
            Plan::Sm90Half(_) | Plan::Sm90W4(_) => {
                ("sm90", (k as f64 / 8.0 + 1.0) * 2f64.powi(-23))
            }
            Plan::Reference => ("reference", (k as f64 + 3.0) * 2f64.powi(-52)),
            p => {
                println!("{p:?}: this example has no error bound for that kernel");
                return Ok(false);
            }
        };
        let (mut outside, mut worst) = (0usize, 0f64);
        for ((&g, &w), &s) in got.values.iter().zip(&want).zip(&abs_sum) {
            let mag = (g.abs() as f64).max(w.abs()) as f32;
            let bound = rel * s + output_ulp(OutType::Bf16, mag) + output_ulp(OutType::F32, mag);
            let err = (g as f64 - w).abs();
            // NaN fails: it is not `Less` or `Equal` to anything.
            if err.partial_cmp(&bound).is_none_or(|o| o.is_gt()) {
                outside += 1;
            }
            worst = worst.max(if err.is_nan() {
                f64::INFINITY
            } else {
                err / bound
            });
        }
        let ok = outside == 0;
        all_ok &= ok;
        println!(
            "{:<14} {m:>5} × {n:>5} × {k:>5}  {kernel:<24} {} of {} elements within the bound \
             (largest error {worst:.3} of it): {}",
            recipe.name(),
            got.values.len() - outside,
            got.values.len(),
            if ok { "ok" } else { "FAILED" }
        );
    }
    Ok(all_ok)
}
