//! Use from an engine, timed (`blockscaled-run --engine`): a GEMM on views of the caller's memory
//! against the same GEMM on crate-owned matrices (every family, A/B interleaved in one run),
//! quantize → GEMM through views on a caller's stream against the allocating calls, and two
//! threads on two streams of one GPU against the sum of their kernels' times.

use std::sync::Arc;
use std::time::Instant;

use blockscaled::{
    DeviceMatrix, Fp4Weights, Fp8, Gpu, InputType, OutType, QuantizeOptions, Recipe, ScaledMatrix,
    device_allocations,
};
use blockscaled_tests::{random_matrix, random_values};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr};
use half::bf16;

use crate::report::{Entry, row};
use crate::timing::{Timing, time_on_stream};

type R<T> = Result<T, String>;

fn e(x: impl std::fmt::Display) -> String {
    x.to_string()
}

/// A matrix's codes and scales copied into caller memory (one allocation each side, the
/// matrix at a 256-byte offset, as in an arena).
struct Caller {
    data: CudaSlice<u8>,
    scales: CudaSlice<u8>,
}

impl Caller {
    fn of(stream: &Arc<CudaStream>, m: &ScaledMatrix) -> R<Caller> {
        let pad = |b: &[u8]| {
            let mut v = vec![0u8; 256];
            v.extend_from_slice(b);
            v
        };
        Ok(Caller {
            data: stream.clone_htod(&pad(m.data())).map_err(e)?,
            scales: stream.clone_htod(&pad(m.scales())).map_err(e)?,
        })
    }

    fn view<'a>(&'a self, g: &Gpu, m: &ScaledMatrix) -> R<DeviceMatrix<'a>> {
        let part = |s: &'a CudaSlice<u8>| -> CudaView<'a, u8> { s.slice(256..) };
        g.matrix_view(*m.desc(), part(&self.data), part(&self.scales))
            .map_err(e)
    }
}

fn line(what: &str, owned: &Timing, view: &Timing) {
    println!(
        "  {what:<34} owned {:>9.2} µs   views {:>9.2} µs   views / owned {:.4}",
        owned.median_ms * 1e3,
        view.median_ms * 1e3,
        view.median_ms / owned.median_ms
    );
}

/// Every family: owned against views, the same plan, interleaved rounds (the medians of each
/// round's samples, then the median over rounds).
fn views_against_owned(g: &Gpu, iters: usize) -> R<Vec<Entry>> {
    println!("GEMM on caller views against crate-owned matrices (bf16 output; median of rounds):");
    let cases = [
        (Recipe::DeepSeekFp8, (4096, 7168, 2048)),
        (Recipe::DeepSeekFp8, (16, 7168, 2048)),
        (Recipe::Mxfp8(Fp8::E4M3), (2048, 4096, 4096)),
        (Recipe::Nvfp4, (2048, 4096, 4096)),
        (Recipe::W4A8(Fp4Weights::Mxfp4), (16, 7168, 2048)),
    ];
    let mut entries = Vec::new();
    for (i, (recipe, (m, n, k))) in cases.into_iter().enumerate() {
        let (_, a) = random_matrix(900 + i as u64, m, k, 1, recipe.a());
        let (_, b) = random_matrix(950 + i as u64, n, k, 1, recipe.b());
        let (da, db) = (g.upload(&a).map_err(e)?, g.upload(&b).map_err(e)?);
        let (ca, cb) = (Caller::of(g.stream(), &a)?, Caller::of(g.stream(), &b)?);
        let (va, vb) = (ca.view(g, &a)?, cb.view(g, &b)?);
        g.prepare_weights(&db).map_err(e)?;
        g.prepare_weights(&vb).map_err(e)?;
        let mut c_own = g.output(m, n, 1, OutType::Bf16).map_err(e)?;
        let mut out: CudaSlice<u16> = g.stream().clone_htod(&vec![0u16; m * n]).map_err(e)?;
        let mut c_view = g
            .output_view(&mut out, OutType::Bf16, (m, n, 1))
            .map_err(e)?;
        let (mut own, mut view) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            let t = time_on_stream(g.stream(), 3, iters, |_| g.gemm(&da, &db, &mut c_own))
                .map_err(e)?;
            own.push(t.median_ms);
            let t = time_on_stream(g.stream(), 3, iters, |_| g.gemm(&va, &vb, &mut c_view))
                .map_err(e)?;
            view.push(t.median_ms);
        }
        let (own, view) = (
            Timing::from_samples(&mut own),
            Timing::from_samples(&mut view),
        );
        line(&format!("{recipe} {m}×{n}×{k}"), &own, &view);
        let bytes = a.data().len() + a.scales().len() + b.data().len() + b.scales().len();
        entries.push(Entry::new(
            "engine",
            row(
                format!("{recipe} GEMM on caller views"),
                (m, n, k, 1),
                (
                    view.median_ms,
                    2.0 * (m * n * k) as f64,
                    (bytes + 2 * m * n) as f64,
                ),
                Some(("crate-owned matrices", own.median_ms)),
            ),
        ));
    }
    Ok(entries)
}

/// quantize → GEMM on a caller's stream through views (no allocation), against the allocating
/// `quantize` call.
fn quantize_then_gemm(g: &Gpu, iters: usize) -> R<Vec<Entry>> {
    println!("quantize (bf16 → DeepSeek FP8 1×128) then GEMM, on a caller's stream:");
    let h = g
        .with_stream(g.context().new_stream().map_err(e)?)
        .map_err(e)?;
    let s = h.stream().clone();
    let mut entries = Vec::new();
    for (m, n, k) in [(4096, 7168, 2048), (16, 7168, 2048)] {
        let v: Vec<u16> = random_values(3, m * k, k)
            .iter()
            .map(|&x| bf16::from_f32(x).to_bits())
            .collect();
        let input: CudaSlice<u16> = s.clone_htod(&v).map_err(e)?;
        let t = h
            .tensor_view(&input, InputType::Bf16, (m, k, 1))
            .map_err(e)?;
        let recipe = Recipe::DeepSeekFp8;
        let mut a = h.quantize(&t, recipe.a()).map_err(e)?;
        let (_, b) = random_matrix(4, n, k, 1, recipe.b());
        let b = h.upload(&b).map_err(e)?;
        h.prepare_weights(&b).map_err(e)?;
        let mut c = h.output(m, n, 1, OutType::Bf16).map_err(e)?;
        let opts = QuantizeOptions::default();
        let alloc =
            time_on_stream(&s, 3, iters, |_| h.quantize(&t, recipe.a()).map(drop)).map_err(e)?;
        let into =
            time_on_stream(&s, 3, iters, |_| h.quantize_into(&t, &mut a, &opts)).map_err(e)?;
        let gemm = time_on_stream(&s, 3, iters, |_| h.gemm(&a, &b, &mut c)).map_err(e)?;
        let before = device_allocations();
        let both = time_on_stream(&s, 3, iters, |_| {
            h.quantize_into(&t, &mut a, &opts)?;
            h.gemm(&a, &b, &mut c)
        })
        .map_err(e)?;
        let allocs = device_allocations() - before;
        println!(
            "  {m}×{n}×{k}: quantize {:.2} µs (allocating), quantize_into {:.2} µs, GEMM {:.2} \
             µs, both {:.2} µs ({} device allocations in {} steps)",
            alloc.median_ms * 1e3,
            into.median_ms * 1e3,
            gemm.median_ms * 1e3,
            both.median_ms * 1e3,
            allocs,
            iters + 3
        );
        let name = format!("quantize_into + GEMM ({recipe}, a caller's stream)");
        let flops = 2.0 * (m * n * k) as f64;
        let note = format!(
            "quantize {:.2} µs (allocating), quantize_into {:.2} µs, GEMM {:.2} µs; {allocs} \
             device allocations in {} steps",
            alloc.median_ms * 1e3,
            into.median_ms * 1e3,
            gemm.median_ms * 1e3,
            iters + 3
        );
        let r = row(name, (m, n, k, 1), (both.median_ms, flops, 0.0), None);
        entries.push(Entry::new("engine", r).note(note));
    }
    Ok(entries)
}

/// Two threads, each with its own handle and stream, each running `steps` small GEMMs; the wall
/// time of both together against the sum of each alone (each alone is its kernels' time: one
/// stream, nothing else running).
fn two_streams(g: &Gpu, steps: usize) -> R<Vec<Entry>> {
    println!("two threads on two streams of one GPU, {steps} GEMMs each (16×7168×2048 FP8):");
    let (m, n, k) = (16, 7168, 2048);
    let recipe = Recipe::DeepSeekFp8;
    let handles: Vec<Gpu> = (0..2)
        .map(|_| {
            g.with_stream(g.context().new_stream().map_err(e)?)
                .map_err(e)
        })
        .collect::<R<_>>()?;
    struct Work {
        a: DeviceMatrix<'static>,
        b: DeviceMatrix<'static>,
        c: blockscaled::DeviceOutput<'static>,
    }
    let mut work: Vec<Work> = handles
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let (_, a) = random_matrix(10 + i as u64, m, k, 1, recipe.a());
            let (_, b) = random_matrix(20 + i as u64, n, k, 1, recipe.b());
            let (a, b) = (h.upload(&a).map_err(e)?, h.upload(&b).map_err(e)?);
            h.prepare_weights(&b).map_err(e)?;
            let c = h.output(m, n, 1, OutType::Bf16).map_err(e)?;
            h.stream().synchronize().map_err(e)?;
            Ok(Work { a, b, c })
        })
        .collect::<R<_>>()?;
    let run = |h: &Gpu, w: &mut Work| -> R<f64> {
        let t0 = Instant::now();
        for _ in 0..steps {
            h.gemm(&w.a, &w.b, &mut w.c).map_err(e)?;
        }
        h.stream().synchronize().map_err(e)?;
        Ok(t0.elapsed().as_secs_f64() * 1e3)
    };
    // Warm-up, then each alone, then both at once (median of five rounds each).
    for (h, w) in handles.iter().zip(work.iter_mut()) {
        run(h, w)?;
    }
    let (mut alone, mut together) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let mut sum = 0.0;
        for (h, w) in handles.iter().zip(work.iter_mut()) {
            sum += run(h, w)?;
        }
        alone.push(sum);
        let t0 = Instant::now();
        std::thread::scope(|scope| -> R<()> {
            let joins: Vec<_> = handles
                .iter()
                .zip(work.iter_mut())
                .map(|(h, w)| scope.spawn(move || run(h, w)))
                .collect();
            for j in joins {
                j.join().map_err(|_| "a thread panicked".to_string())??;
            }
            Ok(())
        })?;
        together.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    let (alone, together) = (
        Timing::from_samples(&mut alone),
        Timing::from_samples(&mut together),
    );
    println!(
        "  each alone, summed {:.3} ms; both at once {:.3} ms: together / sum {:.3}",
        alone.median_ms,
        together.median_ms,
        together.median_ms / alone.median_ms
    );
    let r = row(
        format!("two threads on two streams, {steps} GEMMs each ({recipe})"),
        (m, n, k, 1),
        (together.median_ms, 4.0 * (steps * m * n * k) as f64, 0.0),
        Some(("each alone, summed", alone.median_ms)),
    );
    Ok(vec![Entry::new("engine", r)])
}

/// Host time per call of a GEMM whose views are made from raw device addresses every call, as
/// a binding does (DeepSeek FP8 16 × 7168 × 2048, DeepGEMM's layouts: A's scales M-major, B's
/// per 128 × 128), and of each part: the mean over `calls` calls enqueued without waiting (the
/// kernels are shorter than the host's work, so the queue never fills), after a warm-up.
fn host_cost(g: &Gpu, calls: usize) -> R<Vec<Entry>> {
    let (m, n, k) = (16usize, 7168usize, 2048usize);
    println!(
        "host time per call, views from raw addresses ({m}×{n}×{k} DeepSeek FP8, DeepGEMM's layouts):"
    );
    let recipe = Recipe::DeepSeekFp8;
    let s = g.stream().clone();
    let (_, a) = random_matrix(31, m, k, 1, recipe.a());
    let (_, b) = random_matrix(32, n, k, 1, recipe.b());
    // A's scales M-major (k/128 planes of m), as DeepGEMM's quantizer writes them.
    let a = blockscaled_tests::layouts::mn_major(&a);
    let (da, db) = (*a.desc(), *b.desc());
    let ad: CudaSlice<u8> = s.clone_htod(a.data()).map_err(e)?;
    let asf: CudaSlice<u8> = s.clone_htod(a.scales()).map_err(e)?;
    let bd: CudaSlice<u8> = s.clone_htod(b.data()).map_err(e)?;
    let bsf: CudaSlice<u8> = s.clone_htod(b.scales()).map_err(e)?;
    let out: CudaSlice<u16> = s.clone_htod(&vec![0u16; m * n]).map_err(e)?;
    let raw = |p: u64, len: usize| blockscaled::RawDevice { ptr: p, len };
    let ptr = |x: &CudaSlice<u8>| x.device_ptr(&s).0;
    let (ra, rsa) = (raw(ptr(&ad), ad.len()), raw(ptr(&asf), asf.len()));
    let (rb, rsb) = (raw(ptr(&bd), bd.len()), raw(ptr(&bsf), bsf.len()));
    let ro = raw(out.device_ptr(&s).0, 2 * out.len());
    // SAFETY: every address is a live allocation above, of the length given, alive until the
    // stream is synchronized at the end of this function.
    let view_a = || unsafe { g.matrix_from_raw(da, ra, rsa, false) }.map_err(e);
    let view_b = || unsafe { g.matrix_from_raw(db, rb, rsb, false) }.map_err(e);
    let view_c = || unsafe { g.output_from_raw(ro, OutType::Bf16, (m, n, 1)) }.map_err(e);
    let (va, vb) = (view_a()?, view_b()?);
    let mut vc = view_c()?;
    let time = |what: &str, f: &mut dyn FnMut() -> R<()>| -> R<(f64, f64)> {
        for _ in 0..20 {
            f()?;
        }
        s.synchronize().map_err(e)?;
        let before = device_allocations();
        let t0 = Instant::now();
        for _ in 0..calls {
            f()?;
        }
        let us = t0.elapsed().as_secs_f64() * 1e6 / calls as f64;
        let allocs = (device_allocations() - before) as f64 / calls as f64;
        s.synchronize().map_err(e)?;
        println!("  {what:<44} {us:>8.2} µs   {allocs:.1} device allocations a call");
        Ok((us, allocs))
    };
    let (kept, _) = time("gemm on views kept", &mut || {
        g.gemm(&va, &vb, &mut vc).map_err(e)
    })?;
    time(
        "the call's plan (tuner's cache, else heuristic)",
        &mut || g.plan(&va, &vb).map(drop).map_err(e),
    )?;
    time("A view (matrix_from_raw, dropped)", &mut || {
        view_a().map(drop)
    })?;
    time("B view (matrix_from_raw, dropped)", &mut || {
        view_b().map(drop)
    })?;
    time("output view (output_from_raw, dropped)", &mut || {
        view_c().map(drop)
    })?;
    time("A view + gemm (B and output kept)", &mut || {
        let a = view_a()?;
        g.gemm(&a, &vb, &mut vc).map_err(e)
    })?;
    time("B view + gemm (A and output kept)", &mut || {
        let b = view_b()?;
        g.gemm(&va, &b, &mut vc).map_err(e)
    })?;
    let (all, allocs) = time("every view + gemm (a binding's call)", &mut || {
        let (a, b, mut c) = (view_a()?, view_b()?, view_c()?);
        g.gemm(&a, &b, &mut c).map_err(e)
    })?;
    drop((va, vb, vc));
    s.synchronize().map_err(e)?;
    let note = format!(
        "host µs per call: {all:.2} with every view made from raw addresses ({allocs:.1} device \
         allocations a call), {kept:.2} on views kept"
    );
    let r = row(
        format!("{recipe} GEMM, views from raw addresses every call (host time)"),
        (m, n, k, 1),
        (all * 1e-3, 2.0 * (m * n * k) as f64, 0.0),
        Some(("views kept (host time)", kept * 1e-3)),
    );
    Ok(vec![Entry::new("engine", r).note(note)])
}

/// The whole `--engine` report, and its rows ([`crate::report`]).
pub fn run_engine(g: &Gpu, iters: usize) -> R<Vec<Entry>> {
    let mut entries = host_cost(g, 300)?;
    entries.extend(views_against_owned(g, iters)?);
    entries.extend(quantize_then_gemm(g, iters)?);
    entries.extend(two_streams(g, 200)?);
    Ok(entries)
}
