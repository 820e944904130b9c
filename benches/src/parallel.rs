//! Tensor parallelism on two GPUs, timed (`blockscaled-run --tp`): a DeepSeek-FP8 MLP
//! (quantize the activations to FP8 1×128; gate and up with SwiGLU fused, bf16 out; quantize
//! that; down) on one GPU against the same layer split over two (the first GEMM by columns, the second
//! by K, its bf16 partial outputs summed by an NCCL all-reduce), at decode and prefill sizes.
//!
//! Each step is timed with CUDA events on every rank's stream (the step's time: the slowest
//! rank's), the all-reduce alone on rank 0's; medians over `iters` steps after a warm-up.

use blockscaled::kernels::params::Activation;
use blockscaled::{
    Call, DeviceMatrix, DeviceOutput, DeviceTensor, Epilogue, Gpu, InputType, OutType,
    QuantizeOptions, Ranks, RawDevice, Recipe, ScaledMatrix,
};
use blockscaled_tests::{random_matrix, random_values, weight_cols, weight_rows};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, DevicePtr};

use crate::report::{Entry, row};
use crate::timing::median;

type R<T> = Result<T, String>;

fn e(x: impl std::fmt::Display) -> String {
    x.to_string()
}

/// One rank's (or the one GPU's) layer: its input, weights, and the buffers a step reuses.
struct Mlp {
    x: DeviceTensor<'static>,
    a: DeviceMatrix<'static>,
    w1: DeviceMatrix<'static>,
    w2: DeviceMatrix<'static>,
    /// SwiGLU's bf16 output, and the same memory as the quantizer's input (declared before the
    /// buffer, which they read: dropped first).
    h16: DeviceOutput<'static>,
    h16_in: DeviceTensor<'static>,
    _h16_buf: CudaSlice<u16>,
    h: DeviceMatrix<'static>,
    c: DeviceOutput<'static>,
}

impl Mlp {
    fn new(
        g: &Gpu,
        x: &[f32],
        (m, hidden): (usize, usize),
        w1: &ScaledMatrix,
        w2: &ScaledMatrix,
    ) -> R<Mlp> {
        let fmt = Recipe::DeepSeekFp8.a();
        let t = g.upload_tensor(x, m, hidden, 1).map_err(e)?;
        let a = g.quantize(&t, fmt).map_err(e)?;
        let (w1, w2) = (g.upload(w1).map_err(e)?, g.upload(w2).map_err(e)?);
        g.prepare_weights(&w1).map_err(e)?;
        g.prepare_weights(&w2).map_err(e)?;
        let cols = w1.desc().rows / 2;
        let buf: CudaSlice<u16> = g.stream().alloc_zeros(m * cols).map_err(e)?;
        let raw = RawDevice {
            ptr: buf.device_ptr(g.stream()).0,
            len: m * cols * 2,
        };
        // SAFETY: `buf` lives in the same `Mlp`, dropped after both views, and is written only
        // by the GEMM enqueued on `g`'s stream, in order with the quantizer that reads it.
        let (h16, h16_in) = unsafe {
            (
                g.output_from_raw(raw, OutType::Bf16, (m, cols, 1))
                    .map_err(e)?,
                g.tensor_from_raw(raw, InputType::Bf16, (m, cols, 1))
                    .map_err(e)?,
            )
        };
        let h = g.quantize(&h16_in, fmt).map_err(e)?;
        let c = g.output(m, hidden, 1, OutType::Bf16).map_err(e)?;
        Ok(Mlp {
            x: t,
            a,
            w1,
            w2,
            h16,
            h16_in,
            _h16_buf: buf,
            h,
            c,
        })
    }

    /// quantize → gate/up with SwiGLU → quantize → down, enqueued on `g`'s stream.
    fn step(&mut self, g: &Gpu) -> R<()> {
        let opts = QuantizeOptions::default();
        g.quantize_into(&self.x, &mut self.a, &opts).map_err(e)?;
        let epi = Epilogue::new().activation(Activation::SwiGlu);
        g.run(&Call::new(&self.a, &self.w1).epilogue(&epi), &mut self.h16)
            .map_err(e)?;
        g.quantize_into(&self.h16_in, &mut self.h, &opts)
            .map_err(e)?;
        g.gemm(&self.h, &self.w2, &mut self.c).map_err(e)
    }
}

/// Milliseconds from an event recorded now on each of `gpus`' streams to one recorded after
/// `f`, the slowest stream's (after a wait for all).
pub(crate) fn timed(gpus: &[&Gpu], f: &mut dyn FnMut() -> R<()>) -> R<f64> {
    let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let starts = gpus
        .iter()
        .map(|g| g.stream().record_event(flags).map_err(e))
        .collect::<R<Vec<_>>>()?;
    f()?;
    let mut worst = 0f64;
    for (g, s) in gpus.iter().zip(&starts) {
        let end = g.stream().record_event(flags).map_err(e)?;
        end.synchronize().map_err(e)?;
        worst = worst.max(s.elapsed_ms(&end).map_err(e)? as f64);
    }
    Ok(worst)
}

/// The table (see the module doc): DeepSeek-V3's dense MLP (hidden 7168, intermediate 18432) at
/// 16 and 4096 tokens, and a Mixtral-sized one (4096, 14336).
pub fn run_tp(iters: usize) -> R<Vec<Entry>> {
    let mut entries = Vec::new();
    let n = cudarc::driver::CudaContext::device_count().map_err(e)?;
    if n < 2 {
        return Err(format!("--tp needs two GPUs; this machine has {n}"));
    }
    let ranks = Ranks::new(&[0, 1]).map_err(e)?;
    let world = ranks.len();
    println!(
        "tensor-parallel DeepSeek-FP8 MLP (SwiGLU fused, quantized, bf16 out), 1 GPU against {world} (medians of {iters} steps):"
    );
    for (name, hidden, inter) in [("DeepSeek-V3 dense", 7168, 18432), ("Mixtral", 4096, 14336)] {
        let recipe = Recipe::DeepSeekFp8;
        let (_, w1) = random_matrix(5, 2 * inter, hidden, 1, recipe.b());
        let (_, w2) = random_matrix(6, hidden, inter, 1, recipe.b());
        let share = inter / world;
        let shards = (0..world)
            .map(|r| {
                Ok((
                    weight_rows(&w1, 2 * share * r, 2 * share * (r + 1)),
                    weight_cols(&w2, share * r, share * (r + 1)),
                ))
            })
            .collect::<R<Vec<_>>>()?;
        for m in [16, 4096] {
            let x = random_values(7, m * hidden, hidden);
            let g0 = ranks.gpu(0);
            let mut one = Mlp::new(g0, &x, (m, hidden), &w1, &w2)?;
            let mut parts = (0..world)
                .map(|r| Mlp::new(ranks.gpu(r), &x, (m, hidden), &shards[r].0, &shards[r].1))
                .collect::<R<Vec<_>>>()?;
            let all: Vec<&Gpu> = ranks.gpus().iter().collect();
            let (mut t1, mut t2, mut tr) = (Vec::new(), Vec::new(), Vec::new());
            for i in 0..iters + 3 {
                let a = timed(&[g0], &mut || one.step(g0))?;
                let b = timed(&all, &mut || {
                    for (r, p) in parts.iter_mut().enumerate() {
                        p.step(ranks.gpu(r))?;
                    }
                    let mut outs: Vec<&mut DeviceOutput> =
                        parts.iter_mut().map(|p| &mut p.c).collect();
                    ranks.all_reduce_sum(&mut outs).map_err(e)
                })?;
                let c = timed(&all, &mut || {
                    let mut outs: Vec<&mut DeviceOutput> =
                        parts.iter_mut().map(|p| &mut p.c).collect();
                    ranks.all_reduce_sum(&mut outs).map_err(e)
                })?;
                if i >= 3 {
                    t1.push(a);
                    t2.push(b);
                    tr.push(c);
                }
            }
            let (t1, t2, tr) = (median(&mut t1), median(&mut t2), median(&mut tr));
            let flops = 2.0 * m as f64 * hidden as f64 * inter as f64 * 3.0;
            println!(
                "  {name} {m}×{hidden}, intermediate {inter}: 1 GPU {:.1} µs ({:.0} TFLOP/s); {world} GPUs {:.1} µs ({:.0} TFLOP/s, speed-up {:.2}×), of which the all-reduce alone {:.1} µs",
                t1 * 1e3,
                flops / (t1 * 1e-3) / 1e12,
                t2 * 1e3,
                flops / (t2 * 1e-3) / 1e12,
                t1 / t2,
                tr * 1e3
            );
            let r = row(
                format!("{name} MLP on {world} GPUs"),
                (m, hidden, inter, 1),
                (t2, flops, 0.0),
                Some(("1 GPU", t1)),
            );
            let note = format!("the all-reduce alone {:.1} µs", tr * 1e3);
            entries.push(Entry::new("tp", r).note(note));
        }
    }
    Ok(entries)
}
