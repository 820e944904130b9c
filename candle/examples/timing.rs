//! The candle layer against the raw call it wraps, on one GPU: a DeepSeek FP8 linear (bf16
//! activations quantized on the device, then the GEMM, bf16 out) at 4096 × 7168 × 2048 and
//! 16 × 7168 × 2048, as `layer.forward(&x)` and as `quantize_into` + `gemm` on views of the same
//! candle memory. Each reading is CUDA events around a run of calls enqueued back to back (what
//! an engine's stream sees: the kernels, plus the host's launch path where it is the longer),
//! in seven interleaved rounds; the medians are printed.
//!
//! `cargo run --release -p blockscaled-candle --example timing`

use blockscaled::{MatrixDesc, OutType, QuantizeOptions, Recipe, ScaleLayout, ScaleMajor};
use blockscaled_candle::{BlockScaledLinear, gpu_of};
use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags;
use candle_core::{DType, Device, Storage, Tensor};

const CALLS: usize = 50;
const ROUNDS: usize = 7;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dev = Device::new_cuda(0)?;
    let cuda = dev.as_cuda_device()?;
    let gpu = gpu_of(cuda)?;
    let stream = cuda.cuda_stream();
    println!(
        "{} — candle's layer against the raw call (µs per call, median of {ROUNDS} rounds of {CALLS})",
        gpu.name()
    );
    for (m, n, k) in [(4096, 7168, 2048), (16, 7168, 2048)] {
        let recipe = Recipe::DeepSeekFp8;
        // Weights: e4m3 codes of magnitude below 2 (no NaN code), fp32 scales near 1/100;
        // activations: bf16 in [-1, 1). (Made on the host: a few MiB.)
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let codes: Vec<u8> = (0..n * k)
            .map(|_| (next() % 0x40) as u8 | ((next() % 2) as u8) << 7)
            .collect();
        let w = Tensor::from_raw_buffer(&codes, DType::F8E4M3, &[n, k], &dev)?;
        let sb: Vec<f32> = (0..n.div_ceil(128) * k.div_ceil(128))
            .map(|_| 0.005 + (next() % 1000) as f32 * 1e-5)
            .collect();
        let s = Tensor::from_vec(sb, (n.div_ceil(128), k.div_ceil(128)), &dev)?;
        let xv: Vec<half::bf16> = (0..m * k)
            .map(|_| half::bf16::from_f32((next() % 2000) as f32 / 1000.0 - 1.0))
            .collect();
        let x = Tensor::from_vec(xv, (m, k), &dev)?;
        let layer = BlockScaledLinear::new(recipe, &w, &s)?;
        // The raw call over the same memory: a view of x, a kept quantized matrix, an output.
        let (xs, _) = x.storage_and_layout();
        let Storage::Cuda(xs) = &*xs else {
            unreachable!("on the GPU")
        };
        let CudaStorageSlice::BF16(xv) = &xs.slice else {
            unreachable!("bf16")
        };
        let t = gpu.tensor_view(xv, blockscaled::InputType::Bf16, (m, k, 1))?;
        let mut a = gpu.quantize(&t, recipe.a())?;
        let (ws, _) = w.storage_and_layout();
        let (ss, _) = s.storage_and_layout();
        let (Storage::Cuda(ws), Storage::Cuda(ss)) = (&*ws, &*ss) else {
            unreachable!()
        };
        let (CudaStorageSlice::F8E4M3(wv), CudaStorageSlice::F32(sv)) = (&ws.slice, &ss.slice)
        else {
            unreachable!()
        };
        let bytes = wv.len();
        // SAFETY: e4m3 codes are bytes; the view lives within `w`'s storage guard.
        let wv = unsafe { wv.transmute::<u8>(bytes) }.expect("the codes' bytes");
        let desc = MatrixDesc {
            format: recipe.b(),
            rows: n,
            k,
            batch: 1,
            scale_layout: ScaleLayout::packed(ScaleMajor::K, n.div_ceil(128), k.div_ceil(128)),
            tensor_scale: 1.0,
        };
        let b = gpu.matrix_view(desc, wv, sv)?;
        gpu.prepare_weights(&b)?;
        let mut c = gpu.output(m, n, 1, OutType::Bf16)?;
        let opts = QuantizeOptions::default();
        let time = |f: &mut dyn FnMut() -> Result<(), Box<dyn std::error::Error>>| -> Result<f64, Box<dyn std::error::Error>> {
            let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            for _ in 0..CALLS {
                f()?;
            }
            let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            end.synchronize()?;
            Ok(start.elapsed_ms(&end)? as f64 * 1e3 / CALLS as f64)
        };
        let (mut layer_us, mut raw_us, mut op_us) = (Vec::new(), Vec::new(), Vec::new());
        let mut into_us = Vec::new();
        let y = Tensor::zeros((m, n), DType::BF16, &dev)?;
        for round in 0..=ROUNDS {
            let l = time(&mut || {
                layer.forward(&x)?;
                Ok(())
            })?;
            let r = time(&mut || {
                gpu.quantize_into(&t, &mut a, &opts)?;
                gpu.gemm(&a, &b, &mut c)?;
                Ok(())
            })?;
            let i = time(&mut || {
                layer.forward_into(&x, &y)?;
                Ok(())
            })?;
            // candle's own cost of one operation that makes a tensor (a copy of the output's
            // size): the floor of any candle op's launch path.
            let y = layer.forward(&x)?;
            let o = time(&mut || {
                y.affine(1.0, 0.0)?;
                Ok(())
            })?;
            if round > 0 {
                // (Round 0 warms up.)
                layer_us.push(l);
                raw_us.push(r);
                op_us.push(o);
                into_us.push(i);
            }
        }
        let (l, r, o) = (median(layer_us), median(raw_us), median(op_us));
        let i = median(into_us);
        let tflops = 2.0 * (m * n * k) as f64 / (r * 1e-6) / 1e12;
        println!(
            "  {m}×{n}×{k}: raw quantize_into + gemm {r:.2} µs ({tflops:.0} TFLOP/s); candle layer {l:.2} µs ({:.4} of raw); forward_into {i:.2} µs ({:.4} of raw); candle's affine of the output {o:.2} µs",
            l / r,
            i / r
        );
    }
    Ok(())
}
