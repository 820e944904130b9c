//! The ceilings every "fraction of the ceiling" is taken of, measured on the GPU in use when a
//! run starts (a table from another GPU read against H100 constants misstates it: an H200's
//! bandwidth is 1.6× an H100's):
//! - bandwidth: a 2 GiB device-to-device copy, bytes read + written;
//! - compute: the best of cuBLASLt's FP8 GEMM at 8192³ (per-tensor scales, random codes), the
//!   fastest FP8 GEMM the peer has. FP4 formats run on FP8 tensor cores on Hopper: one compute ceiling.
//!
//! They are measured once per GPU and driver and stored beside the tuner's plans
//! (`blockscaled::plan::cache`, the file `BLOCKSCALED_TUNE_CACHE` names or the user's cache
//! directory's): [`measure`] reads them from there where they are, and measures and stores them
//! where not (or where asked to measure again); it sets them once for the process, and [`get`]
//! reads them (`None` before).

use std::path::PathBuf;
use std::sync::OnceLock;

use blockscaled::Gpu;
pub use blockscaled::plan::cache::Ceilings;
use blockscaled::plan::cache::{PlanCache, default_path};
use cudarc::driver::CudaSlice;

use crate::cublaslt::LtPeer;
use crate::timing::time_on_stream;

static MEASURED: OnceLock<Ceilings> = OnceLock::new();

/// The ceilings [`measure`] set for this process, if it ran.
pub fn get() -> Option<Ceilings> {
    MEASURED.get().copied()
}

/// Sets `gpu`'s ceilings for this process (once: later calls return the first) and prints them:
/// those stored for this GPU and driver beside the tuner's plans, else (or where `fresh`)
/// measured now and stored there (a cache that cannot be written is a printed warning; the
/// ceilings still hold for the process).
pub fn measure(gpu: &Gpu, fresh: bool) -> Result<Ceilings, String> {
    measure_at(gpu, fresh, default_path())
}

/// [`measure`] with the plans' file at `path` (none: measured, not stored).
pub fn measure_at(gpu: &Gpu, fresh: bool, path: Option<PathBuf>) -> Result<Ceilings, String> {
    if let Some(c) = get() {
        return Ok(c);
    }
    let machine = gpu.machine();
    let mut cache = path.map(|p| (PlanCache::open(&p), p));
    if !fresh
        && let Some((stored, path)) = &cache
        && let Some(c) = stored.ceilings(&machine)
    {
        println!(
            "ceilings on {}: {:.0} GB/s, {:.0} TFLOP/s (stored in {}; --measure_ceilings measures them again)",
            gpu.name(),
            c.gbs,
            c.tflops,
            path.display()
        );
        return Ok(*MEASURED.get_or_init(|| c));
    }
    let c = measure_now(gpu)?;
    if let Some((stored, path)) = &mut cache {
        stored.set_ceilings(&machine, c);
        match stored.save() {
            Ok(()) => println!("ceilings stored in {}", path.display()),
            Err(e) => println!("ceilings not stored ({}: {e})", path.display()),
        }
    }
    Ok(*MEASURED.get_or_init(|| c))
}

/// Measures `gpu`'s ceilings now, and prints them.
fn measure_now(gpu: &Gpu) -> Result<Ceilings, String> {
    let e = |x: cudarc::driver::DriverError| x.to_string();
    let s = gpu.stream();
    // Bandwidth: 2 GiB copied, read + written.
    let bytes = 2usize << 30;
    let src: CudaSlice<u8> = s.alloc_zeros(bytes).map_err(e)?;
    let mut dst: CudaSlice<u8> = s.alloc_zeros(bytes).map_err(e)?;
    let copy = time_on_stream(s, 2, 10, |_| s.memcpy_dtod(&src, &mut dst)).map_err(e)?;
    drop((src, dst));
    let gbs = 2.0 * bytes as f64 / (copy.min_ms * 1e-3) / 1e9;
    // Compute: cuBLASLt FP8 at 8192³, its best time, on random e4m3 codes (bit 3 cleared: no
    // NaN code; constant inputs would let the tensor cores run cooler and faster than real
    // data does) and unit scales.
    let n = 8192;
    let peer = LtPeer::new(s.clone()).map_err(|x| x.to_string())?;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let codes: Vec<u8> = (0..n * n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8 & 0xF7
        })
        .collect();
    let ones: CudaSlice<u8> = s.clone_htod(&codes).map_err(e)?;
    let unit: CudaSlice<f32> = s.clone_htod(&[1.0f32]).map_err(e)?;
    let mut c: CudaSlice<u16> = s.alloc_zeros(n * n).map_err(e)?;
    let gemm = time_on_stream(s, 3, 10, |_| {
        peer.gemm_fp8_per_tensor(n, n, n, &ones, &unit, &ones, &unit, &mut c)
    })
    .map_err(|x| x.to_string())?;
    let tflops = 2.0 * (n as f64).powi(3) / (gemm.min_ms * 1e-3) / 1e12;
    println!(
        "ceilings on {}: {gbs:.0} GB/s (2 GiB device copy), {tflops:.0} TFLOP/s (cuBLASLt FP8 8192³, best of 10)",
        gpu.name()
    );
    Ok(Ceilings { tflops, gbs })
}
