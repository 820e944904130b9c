//! Expert parallelism on two GPUs, timed (`blockscaled-run --ep`): a MoE layer (router top-k,
//! tokens quantized to FP8 1×128, gate/up grouped GEMM, SwiGLU quantized, down grouped GEMM,
//! weighted sum) with all experts on one GPU against the layer split over two by experts
//! (`ExpertParallel`: the tokens' codes and scales and the output rows exchanged by NCCL
//! all-to-all in chunks of a fixed capacity per peer). Both process the same tokens: each rank
//! steps `tokens` of its own, the one GPU steps both ranks' together.
//!
//! Each step and each phase is timed with CUDA events on every rank's stream (a phase's time: the
//! slowest rank's), medians over `iters` steps after a warm-up. The experts' weights are one
//! random expert's codes and scales repeated on the device (the timing does not depend on the
//! values; the tests check distinct experts); the logits are fresh random values, so the
//! routing is near uniform.

use blockscaled::{
    DeviceMatrix, DeviceTensor, ExpertParallel, Gpu, GroupLayout, MatrixDesc, MoeLayer, MoeOptions,
    MoeShape, MoeStep, OutType, Plan, Ranks, Recipe, ScaledMatrix,
};
use blockscaled_tests::random_values;
use cudarc::driver::CudaSlice;

use crate::parallel::timed;
use crate::report::{Entry, row};
use crate::timing::median;

type R<T> = Result<T, String>;

fn e(x: impl std::fmt::Display) -> String {
    x.to_string()
}

/// `experts` copies of one random expert's weights (`rows × k`), on `g`: the codes and scales
/// buffers (the matrix is a view over them).
fn experts_on(
    g: &Gpu,
    one: &ScaledMatrix,
    experts: usize,
) -> R<(MatrixDesc, CudaSlice<u8>, CudaSlice<u8>)> {
    let st = g.stream();
    let (d, s) = (one.data(), one.scales());
    let mut data = st.alloc_zeros::<u8>(d.len() * experts).map_err(e)?;
    let mut scales = st.alloc_zeros::<u8>(s.len() * experts).map_err(e)?;
    let (d0, s0) = (st.clone_htod(d).map_err(e)?, st.clone_htod(s).map_err(e)?);
    for x in 0..experts {
        st.memcpy_dtod(&d0, &mut data.slice_mut(x * d.len()..(x + 1) * d.len()))
            .map_err(e)?;
        st.memcpy_dtod(&s0, &mut scales.slice_mut(x * s.len()..(x + 1) * s.len()))
            .map_err(e)?;
    }
    let desc = MatrixDesc {
        batch: experts,
        ..*one.desc()
    };
    Ok((desc, data, scales))
}

/// The layers the tables time.
const PRESETS: [(&str, MoeShape); 2] = [
    (
        "DeepSeek-V3-like",
        MoeShape {
            hidden: 7168,
            inter: 2048,
            experts: 256,
            top_k: 8,
        },
    ),
    (
        "Mixtral-like",
        MoeShape {
            hidden: 4096,
            inter: 14336,
            experts: 8,
            top_k: 2,
        },
    ),
];

/// One random expert's gate/up (`2·inter × hidden`) and down (`hidden × inter`) weights.
fn one_expert(s: MoeShape) -> R<(ScaledMatrix, ScaledMatrix)> {
    let q = |seed, rows, k| {
        let fmt = Recipe::DeepSeekFp8.b();
        ScaledMatrix::quantize(&random_values(seed, rows * k, k), rows, k, 1, fmt).map_err(e)
    };
    Ok((q(11, 2 * s.inter, s.hidden)?, q(12, s.hidden, s.inter)?))
}

/// The layer on one GPU alone (`blockscaled-run --moe`): each preset at 256 and 8192 tokens, the
/// step and its grouped GEMMs alone (a run a kernel profiler can attach to: no NCCL).
pub fn run_moe(g: &Gpu, iters: usize) -> R<Vec<Entry>> {
    let mut entries = Vec::new();
    println!(
        "MoE layer on one GPU (DeepSeek FP8 experts, SwiGLU, bf16 out; medians of {iters} steps):"
    );
    for (name, shape) in PRESETS {
        let MoeShape {
            hidden,
            inter,
            experts,
            top_k,
        } = shape;
        let (one1, one2) = one_expert(shape)?;
        let (d1, c1, s1) = experts_on(g, &one1, experts)?;
        let (d2, c2, s2) = experts_on(g, &one2, experts)?;
        let (w1, w2) = (
            g.matrix_view(d1, &c1, &s1).map_err(e)?,
            g.matrix_view(d2, &c2, &s2).map_err(e)?,
        );
        g.prepare_weights(&w1).map_err(e)?;
        g.prepare_weights(&w2).map_err(e)?;
        for tokens in [256usize, 8192] {
            let mut layer = MoeLayer::new(g, shape, &w1, &w2, MoeOptions::default()).map_err(e)?;
            let x = g
                .upload_tensor(
                    &random_values(40, tokens * hidden, hidden),
                    tokens,
                    hidden,
                    1,
                )
                .map_err(e)?;
            let l = g
                .upload_tensor(
                    &random_values(41, tokens * experts, experts),
                    tokens,
                    experts,
                    1,
                )
                .map_err(e)?;
            let mut out = g.output(tokens, hidden, 1, OutType::Bf16).map_err(e)?;
            let mut t = Vec::new();
            for _ in 0..iters + 3 {
                t.push(timed(&[g], &mut || {
                    layer.forward(&x, &l, &mut out).map_err(e)
                })?);
            }
            let step = median(&mut t[3..].to_vec());
            let gemms = gemms_alone(g, &layer.last_step().ok_or("no step")?, (&w1, &w2), iters)?;
            let flops = tokens as f64 * top_k as f64 * 6.0 * hidden as f64 * inter as f64;
            println!(
                "  {name}, {tokens} tokens: {:.1} µs ({:.0} ktok/s, {:.0} TFLOP/s), of which the grouped GEMMs alone {:.1} µs ({:.0} TFLOP/s)",
                step * 1e3,
                tokens as f64 / step,
                flops / (step * 1e-3) / 1e12,
                gemms * 1e3,
                flops / (gemms * 1e-3) / 1e12
            );
            let shape = (tokens, hidden, inter, experts);
            let r = row(
                format!("{name} layer step"),
                shape,
                (step, flops, 0.0),
                None,
            );
            entries.push(Entry::new("moe", r));
            let r = row(
                format!("{name} grouped GEMMs alone"),
                shape,
                (gemms, flops, 0.0),
                None,
            );
            entries.push(Entry::new("moe", r));
        }
    }
    Ok(entries)
}

/// The grouped GEMMs alone on a step's rows, into outputs of their own (medians, ms).
fn gemms_alone(
    g: &Gpu,
    s: &MoeStep,
    (w1, w2): (&DeviceMatrix, &DeviceMatrix),
    iters: usize,
) -> R<f64> {
    let o = |d: (usize, usize, usize)| g.output(d.0, d.1, d.2, OutType::Bf16).map_err(e);
    let (mut o1, mut o2) = (o(s.gate_up.dims())?, o(s.down.dims())?);
    let mut v = Vec::new();
    for _ in 0..iters + 3 {
        v.push(timed(&[g], &mut || {
            g.grouped_gemm(s.grouped, w1, s.groups, &mut o1)
                .map_err(e)?;
            g.grouped_gemm(s.hidden, w2, s.groups, &mut o2).map_err(e)
        })?);
    }
    Ok(median(&mut v[3..].to_vec()))
}

/// The table (module doc), and its rows ([`crate::report`]): the layer on two GPUs, plain, as two
/// micro-batches, and with the GEMMs on fewer CTAs, each against the one GPU.
pub fn run_ep(iters: usize) -> R<Vec<Entry>> {
    let mut entries = Vec::new();
    let n = cudarc::driver::CudaContext::device_count().map_err(e)?;
    if n < 2 {
        return Err(format!("--ep needs two GPUs; this machine has {n}"));
    }
    let ranks = Ranks::new(&[0, 1]).map_err(e)?;
    let world = ranks.len();
    println!(
        "expert-parallel MoE layer (DeepSeek FP8 experts, SwiGLU, bf16 out), 1 GPU against {world} (medians of {iters} steps; tokens per GPU):"
    );
    for (name, shape) in PRESETS {
        let MoeShape {
            hidden,
            inter,
            experts,
            top_k,
        } = shape;
        let (one1, one2) = one_expert(shape)?;
        let g0 = ranks.gpu(0);
        let local = experts / world;
        let (d1, c1, s1) = experts_on(g0, &one1, experts)?;
        let (d2, c2, s2) = experts_on(g0, &one2, experts)?;
        let w1_all = g0.matrix_view(d1, &c1, &s1).map_err(e)?;
        let w2_all = g0.matrix_view(d2, &c2, &s2).map_err(e)?;
        let mut bufs = Vec::new();
        for r in 0..world {
            let g = ranks.gpu(r);
            bufs.push((experts_on(g, &one1, local)?, experts_on(g, &one2, local)?));
        }
        let shares = bufs
            .iter()
            .enumerate()
            .map(|(r, ((d1, c1, s1), (d2, c2, s2)))| {
                let g = ranks.gpu(r);
                Ok((
                    g.matrix_view(*d1, c1, s1).map_err(e)?,
                    g.matrix_view(*d2, c2, s2).map_err(e)?,
                ))
            })
            .collect::<R<Vec<(DeviceMatrix, DeviceMatrix)>>>()?;
        for m in [&w1_all, &w2_all] {
            g0.prepare_weights(m).map_err(e)?;
        }
        for (r, (a, b)) in shares.iter().enumerate() {
            ranks.gpu(r).prepare_weights(a).map_err(e)?;
            ranks.gpu(r).prepare_weights(b).map_err(e)?;
        }
        let experts_of: Vec<_> = shares.iter().map(|(a, b)| (a, b)).collect();
        for tokens in [128usize, 4096] {
            let opts = MoeOptions {
                peer_capacity: Some(capacity(tokens, top_k, world)),
                layout: GroupLayout::Contiguous,
                ..MoeOptions::default()
            };
            let mut ep = ExpertParallel::new(&ranks, shape, &experts_of, opts).map_err(e)?;
            let mut one = MoeLayer::new(g0, shape, &w1_all, &w2_all, opts).map_err(e)?;
            let tensor = |g: &Gpu, seed, rows, k| -> R<DeviceTensor<'static>> {
                g.upload_tensor(&random_values(seed, rows * k, k), rows, k, 1)
                    .map_err(e)
            };
            let (mut xs, mut ls, mut outs) = (Vec::new(), Vec::new(), Vec::new());
            for r in 0..world {
                let g = ranks.gpu(r);
                xs.push(tensor(g, 20 + r as u64, tokens, hidden)?);
                ls.push(tensor(g, 30 + r as u64, tokens, experts)?);
                outs.push(g.output(tokens, hidden, 1, OutType::Bf16).map_err(e)?);
            }
            let x1 = tensor(g0, 40, world * tokens, hidden)?;
            let l1 = tensor(g0, 41, world * tokens, experts)?;
            let mut out1 = g0
                .output(world * tokens, hidden, 1, OutType::Bf16)
                .map_err(e)?;
            let all: Vec<&Gpu> = ranks.gpus().iter().collect();
            let (xr, lr): (Vec<_>, Vec<_>) = (xs.iter().collect(), ls.iter().collect());
            let mut t = vec![Vec::new(); 7];
            for i in 0..iters + 3 {
                let single = timed(&[g0], &mut || one.forward(&x1, &l1, &mut out1).map_err(e))?;
                let whole = timed(&all, &mut || {
                    let mut o: Vec<_> = outs.iter_mut().collect();
                    ep.forward(&xr, &lr, &mut o).map_err(e)
                })?;
                let p0 = timed(&all, &mut || ep.dispatch(&xr, &lr).map_err(e))?;
                let p1 = timed(&all, &mut || ep.send_tokens().map_err(e))?;
                let p2 = timed(&all, &mut || ep.compute().map_err(e))?;
                let p3 = timed(&all, &mut || ep.send_rows().map_err(e))?;
                let p4 = timed(&all, &mut || {
                    let mut o: Vec<_> = outs.iter_mut().collect();
                    ep.combine(&mut o).map_err(e)
                })?;
                if i >= 3 {
                    for (v, x) in t.iter_mut().zip([single, whole, p0, p1, p2, p3, p4]) {
                        v.push(x);
                    }
                }
            }
            let [single, whole, p0, p1, p2, p3, p4] = std::array::from_fn(|i| median(&mut t[i]));
            let mut dropped = 0;
            for r in 0..world {
                let s = ep.last_step(r).ok_or("no step")?;
                let slots = ranks.gpu(r).stream().clone_dtoh(&s.slot).map_err(e)?;
                dropped += slots.iter().filter(|&&x| x < 0).count();
            }
            // The grouped GEMMs alone on the last step's rows (the one GPU's; rank 0's), into
            // outputs of their own, and the tokens' quantization alone.
            let g_one = gemms_alone(
                g0,
                &one.last_step().ok_or("no step")?,
                (&w1_all, &w2_all),
                iters,
            )?;
            let g_ep = gemms_alone(g0, &ep.last_step(0).ok_or("no step")?, experts_of[0], iters)?;
            let all_tokens = (world * tokens) as f64;
            let flops = all_tokens * top_k as f64 * 2.0 * 3.0 * hidden as f64 * inter as f64;
            let comm = p1 + p3;
            let piped = pipelined(&ranks, shape, &experts_of, tokens, (iters, 0))?;
            let reserved = pipelined(&ranks, shape, &experts_of, tokens, (iters, 16))?;
            println!(
                "  {name} ({experts} experts, top-{top_k}, hidden {hidden}, width {inter}), {tokens} tokens a GPU: 1 GPU {:.1} µs ({:.0} ktok/s, {:.0} TFLOP/s; grouped GEMMs alone {:.1} µs); {world} GPUs {:.1} µs ({:.0} ktok/s, {:.2}×): route+pack {:.1}, send tokens {:.1}, experts {:.1} (rank 0's grouped GEMMs alone {:.1}), send rows {:.1}, combine {:.1} µs, exchanges {:.0}% of the step; two micro-batches on two streams {:.1} µs ({:.2}× one GPU; {:.0}% of the exchanges hidden), with the GEMMs on 16 fewer CTAs {:.1} µs ({:.2}×; {:.0}%); {dropped} entries dropped",
                single * 1e3,
                all_tokens / single,
                flops / (single * 1e-3) / 1e12,
                g_one * 1e3,
                whole * 1e3,
                all_tokens / whole,
                single / whole,
                p0 * 1e3,
                p1 * 1e3,
                p2 * 1e3,
                g_ep * 1e3,
                p3 * 1e3,
                p4 * 1e3,
                100.0 * comm / whole,
                piped * 1e3,
                single / piped,
                100.0 * (whole - piped) / comm,
                reserved * 1e3,
                single / reserved,
                100.0 * (whole - reserved) / comm,
            );
            let shape = (tokens, hidden, inter, experts);
            let one = format!("1 GPU, {} tokens", world * tokens);
            let note = format!(
                "route+pack {:.1}, send tokens {:.1}, experts {:.1}, send rows {:.1}, combine \
                 {:.1} µs; {dropped} entries dropped",
                p0 * 1e3,
                p1 * 1e3,
                p2 * 1e3,
                p3 * 1e3,
                p4 * 1e3
            );
            for (what, ms) in [
                ("", whole),
                (", two micro-batches", piped),
                (", two micro-batches, GEMMs on 16 fewer CTAs", reserved),
            ] {
                let name = format!("{name} on {world} GPUs{what}");
                let r = row(name, shape, (ms, flops, 0.0), Some((&one, single)));
                entries.push(Entry::new("ep", r).note(note.clone()));
            }
        }
    }
    Ok(entries)
}

/// A peer capacity a quarter above an even share of `tokens · top_k` entries over `world` GPUs,
/// in whole 128-row blocks: random routing's spread at these sizes is a few percent (drops are
/// counted).
fn capacity(tokens: usize, top_k: usize, world: usize) -> usize {
    let even = (tokens * top_k).div_ceil(world);
    (even + even / 4).next_multiple_of(128)
}

/// The expert-parallel step as two micro-batches of half the tokens on two streams a GPU (a
/// second set of handles and communicators): one micro-batch's exchanges may run while the
/// other's GEMMs do, the grouped GEMMs on `reserve` fewer persistent CTAs than their plans
/// (SMs left to NCCL's kernels). Milliseconds, the median step (from the first stream's start,
/// the second stream made to wait for it, to the later stream's end).
fn pipelined(
    ranks: &Ranks,
    shape: MoeShape,
    experts_of: &[(&DeviceMatrix, &DeviceMatrix)],
    tokens: usize,
    (iters, reserve): (usize, u32),
) -> R<f64> {
    let world = ranks.len();
    let half = tokens / 2;
    let second = ranks
        .gpus()
        .iter()
        .map(|g| {
            g.with_stream(g.context().new_stream().map_err(e)?)
                .map_err(e)
        })
        .collect::<R<Vec<_>>>()?;
    let ranks2 = Ranks::from_gpus(second).map_err(e)?;
    let mut inputs = Vec::new();
    for (lane, rs) in [ranks, &ranks2].iter().enumerate() {
        let (mut xs, mut ls, mut outs) = (Vec::new(), Vec::new(), Vec::new());
        for (r, g) in rs.gpus().iter().enumerate() {
            let seed = 50 + 10 * lane as u64 + r as u64;
            let (h, x) = (shape.hidden, shape.experts);
            xs.push(
                g.upload_tensor(&random_values(seed, half * h, h), half, h, 1)
                    .map_err(e)?,
            );
            ls.push(
                g.upload_tensor(&random_values(seed + 5, half * x, x), half, x, 1)
                    .map_err(e)?,
            );
            outs.push(g.output(half, h, 1, OutType::Bf16).map_err(e)?);
        }
        inputs.push((xs, ls, outs));
    }
    let mut opts = MoeOptions {
        peer_capacity: Some(capacity(half, shape.top_k, world)),
        ..MoeOptions::default()
    };
    if reserve > 0 {
        // The plans a first step chooses, on fewer CTAs.
        let mut probe = ExpertParallel::new(ranks, shape, experts_of, opts).map_err(e)?;
        let (xs, ls, outs) = &mut inputs[0];
        probe
            .forward(
                &refs(xs),
                &refs(ls),
                &mut outs.iter_mut().collect::<Vec<_>>(),
            )
            .map_err(e)?;
        let s = probe.last_step(0).ok_or("no step")?;
        let g = ranks.gpu(0);
        let fewer = |p: Plan| match p {
            Plan::Sm90Fp8(mut c) => {
                c.ctas = c.ctas.min(g.sm_count()).saturating_sub(reserve).max(2);
                Plan::Sm90Fp8(c)
            }
            p => p,
        };
        let (w1, w2) = experts_of[0];
        opts.plans = Some((
            fewer(g.grouped_plan(s.grouped, w1, s.groups).map_err(e)?),
            fewer(g.grouped_plan(s.hidden, w2, s.groups).map_err(e)?),
        ));
    }
    let mut lanes = [
        ExpertParallel::new(ranks, shape, experts_of, opts).map_err(e)?,
        ExpertParallel::new(&ranks2, shape, experts_of, opts).map_err(e)?,
    ];
    let all: Vec<&Gpu> = ranks.gpus().iter().chain(ranks2.gpus()).collect();
    let mut t = Vec::new();
    for i in 0..iters + 3 {
        for (g1, g2) in ranks.gpus().iter().zip(ranks2.gpus()) {
            let ev = g1.stream().record_event(None).map_err(e)?;
            g2.stream().wait(&ev).map_err(e)?;
        }
        let ms = timed(&all, &mut || {
            let [a, b] = &mut lanes;
            let [(xa, la, oa), (xb, lb, ob)] = &mut inputs[..] else {
                return Err("two lanes".into());
            };
            a.dispatch(&refs(xa), &refs(la)).map_err(e)?;
            a.send_tokens().map_err(e)?;
            b.dispatch(&refs(xb), &refs(lb)).map_err(e)?;
            a.compute().map_err(e)?;
            b.send_tokens().map_err(e)?;
            a.send_rows().map_err(e)?;
            b.compute().map_err(e)?;
            a.combine(&mut oa.iter_mut().collect::<Vec<_>>())
                .map_err(e)?;
            b.send_rows().map_err(e)?;
            b.combine(&mut ob.iter_mut().collect::<Vec<_>>()).map_err(e)
        })?;
        if i >= 3 {
            t.push(ms);
        }
    }
    Ok(median(&mut t))
}

/// References to each of `v`.
fn refs<T>(v: &[T]) -> Vec<&T> {
    v.iter().collect()
}
