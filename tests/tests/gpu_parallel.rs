//! Tensor parallelism over NCCL on two GPUs (feature `nccl`; `Ranks`): a DeepSeek-FP8 MLP
//! (gate and up interleaved with SwiGLU fused, its bf16 output quantized to FP8 1×128 on the
//! device, then down)
//! split across the ranks — the first GEMM by columns (each rank its share of the intermediate
//! features), the second by K, its partial products summed by an all-reduce — against the whole
//! layer on one GPU, with the same kernel configurations.
//!
//! The first GEMM's columns are the same products on either side: bitwise equal codes and
//! scales. The second differs only in where its f32 sums meet: the reference adds the K blocks
//! 0..K/128 in order; rank 0 adds the first half, rank 1 the second from zero, and the
//! all-reduce adds the two. Each f32 addition rounds by at most 2⁻²⁴ of its running magnitude,
//! at most S = Σ|h||w| (the dequantized operands' absolute products, in f64): with fewer than
//! K/128 + 2 additions apart, |difference| ≤ (K/128 + 2)·2⁻²⁴·S.

use blockscaled::kernels::params::Activation;
use blockscaled::{Call, DeviceMatrix, Epilogue, Gpu, OutType, Plan, Ranks, Recipe};
use blockscaled_tests::{random_matrix, random_values, weight_cols, weight_rows};

/// The MLP's first half: `a` times gate/up `w1` on `plan` with SwiGLU fused (bf16, `cols`
/// columns), quantized on the device to FP8 1×128 (SwiGLU's pairs make a 1×128 output block 256
/// product columns, wider than the fused quantizer's pass).
fn swiglu_quantized(
    g: &Gpu,
    a: &DeviceMatrix,
    w1: &DeviceMatrix,
    epi: &Epilogue,
    plan: Plan,
    cols: usize,
) -> DeviceMatrix<'static> {
    let mut h = g.output(a.desc().rows, cols, 1, OutType::Bf16).unwrap();
    g.run(&Call::new(a, w1).epilogue(epi).with_plan(plan), &mut h)
        .unwrap();
    let t = g.output_as_tensor(h).unwrap();
    g.quantize(&t, Recipe::DeepSeekFp8.a()).unwrap()
}

/// Ranks on GPUs 0 and 1 (a failure where the machine has fewer).
fn two_ranks() -> Ranks {
    let n_gpus = cudarc::driver::CudaContext::device_count().unwrap();
    assert!(
        n_gpus >= 2,
        "this test needs two GPUs; the machine has {n_gpus}"
    );
    Ranks::new(&[0, 1]).expect("NCCL on two GPUs")
}

/// `p` without a K split (the same accumulation order on one GPU and on the ranks).
fn unsplit(p: Plan) -> Plan {
    match p {
        Plan::Sm90Fp8(c) => Plan::Sm90Fp8(c.with_split_k(1)),
        p => panic!("DeepSeek FP8 runs on the sm90 FP8 kernel, not {p:?}"),
    }
}

#[test]
#[ignore = "needs two CUDA devices"]
fn a_tensor_parallel_fp8_mlp_on_two_gpus_matches_one_gpu() {
    let ranks = two_ranks();
    let world = ranks.len();
    let recipe = Recipe::DeepSeekFp8;
    let fmt = recipe.a();
    for (seed, m, hidden, inter) in [(1u64, 64, 512, 1024), (2, 200, 384, 2048)] {
        let share = inter / world;
        let x = random_values(seed, m * hidden, hidden);
        // Gate and up interleaved row by row (SwiGLU pairs adjacent columns), then down.
        let (_, w1) = random_matrix(seed + 10, 2 * inter, hidden, 1, recipe.b());
        let (_, w2) = random_matrix(seed + 20, hidden, inter, 1, recipe.b());
        let epi = Epilogue::new().activation(Activation::SwiGlu);

        // The whole layer on rank 0's GPU, its plans without a K split.
        let g0: &Gpu = ranks.gpu(0);
        let a0 = g0
            .quantize(&g0.upload_tensor(&x, m, hidden, 1).unwrap(), fmt)
            .unwrap();
        let (w1_all, w2_all) = (g0.upload(&w1).unwrap(), g0.upload(&w2).unwrap());
        let plan1 = unsplit(g0.fused_plan(&a0, &w1_all, &epi, None).unwrap());
        let h_all = swiglu_quantized(g0, &a0, &w1_all, &epi, plan1, inter);
        let plan2 = unsplit(g0.plan(&h_all, &w2_all).unwrap());
        let mut c_all = g0.output(m, hidden, 1, OutType::F32).unwrap();
        g0.gemm_with(&h_all, &w2_all, &mut c_all, plan2).unwrap();
        let (h_all, c_all) = (h_all.to_host().unwrap(), c_all.to_host().unwrap());

        // Each rank: its intermediate features (gate/up rows), its share of down's K.
        let mut outs = Vec::new();
        let mut shards = Vec::new();
        for r in 0..world {
            let g = ranks.gpu(r);
            let a = g
                .quantize(&g.upload_tensor(&x, m, hidden, 1).unwrap(), fmt)
                .unwrap();
            let w1_r = g
                .upload(&weight_rows(&w1, 2 * share * r, 2 * share * (r + 1)))
                .unwrap();
            let w2_r = g
                .upload(&weight_cols(&w2, share * r, share * (r + 1)))
                .unwrap();
            let h = swiglu_quantized(g, &a, &w1_r, &epi, plan1, share);
            let mut c = g.output(m, hidden, 1, OutType::F32).unwrap();
            g.gemm_with(&h, &w2_r, &mut c, plan2).unwrap();
            shards.push(h.to_host().unwrap());
            outs.push(c);
        }
        ranks
            .all_reduce_sum(&mut outs.iter_mut().collect::<Vec<_>>())
            .unwrap();

        // The first GEMM: each rank's columns are the whole layer's, bit for bit.
        for (r, h) in shards.iter().enumerate() {
            for i in 0..m {
                for j in 0..share {
                    let (jj, what) = (share * r + j, format!("rank {r}, h[{i}][{j}]"));
                    assert_eq!(h.code(0, i, j), h_all.code(0, i, jj), "{what}: code");
                    let (s, s_all) = (h.scale_value(0, i, j), h_all.scale_value(0, i, jj));
                    assert_eq!(s.to_bits(), s_all.to_bits(), "{what}: scale");
                }
            }
        }
        // The second: every rank holds the same sum, within the bound of the whole layer's.
        let got: Vec<_> = outs.iter().map(|c| c.to_host().unwrap()).collect();
        let (hd, wd) = (h_all.dequantize(), w2.dequantize());
        let bound = ((inter / 128 + 2) as f64) * 2f64.powi(-24);
        let mut worst = 0f64;
        for i in 0..m {
            for o in 0..hidden {
                let e = i * hidden + o;
                let s: f64 = (0..inter)
                    .map(|q| (hd[i * inter + q] * wd[o * inter + q]).abs())
                    .sum();
                let (g, want) = (got[0].values[e] as f64, c_all.values[e] as f64);
                assert!(
                    want.is_finite() && g.is_finite(),
                    "c[{i}][{o}]: {g} against {want}"
                );
                for (r, other) in got.iter().enumerate().skip(1) {
                    assert_eq!(
                        other.values[e].to_bits(),
                        got[0].values[e].to_bits(),
                        "rank {r}"
                    );
                }
                let tol = bound * s;
                assert!(
                    (g - want).abs() <= tol,
                    "c[{i}][{o}]: {g} against {want} (bound {tol})"
                );
                worst = worst.max((g - want).abs() / tol.max(f64::MIN_POSITIVE));
            }
        }
        println!(
            "{m}×{hidden}, intermediate {inter} on {world} GPUs: worst {worst:.3} of the bound"
        );
    }
}

#[test]
#[ignore = "needs two CUDA devices"]
fn mismatched_outputs_are_typed_errors() {
    let ranks = two_ranks();
    let (g0, g1) = (ranks.gpu(0), ranks.gpu(1));
    let mut wrong_shape = [
        g0.output(8, 128, 1, OutType::F32).unwrap(),
        g1.output(8, 256, 1, OutType::F32).unwrap(),
    ];
    assert!(
        ranks
            .all_reduce_sum(&mut wrong_shape.iter_mut().collect::<Vec<_>>())
            .is_err()
    );
    let mut wrong_gpu = [
        g0.output(8, 128, 1, OutType::F32).unwrap(),
        g0.output(8, 128, 1, OutType::F32).unwrap(),
    ];
    assert!(
        ranks
            .all_reduce_sum(&mut wrong_gpu.iter_mut().collect::<Vec<_>>())
            .is_err()
    );
    let mut one = [g0.output(8, 128, 1, OutType::F32).unwrap()];
    assert!(
        ranks
            .all_reduce_sum(&mut one.iter_mut().collect::<Vec<_>>())
            .is_err()
    );
    assert!(Ranks::new(&[0, 0]).is_err(), "one GPU twice");
}

#[test]
#[ignore = "needs two CUDA devices"]
fn all_to_all_moves_each_chunk_to_its_peer() {
    let ranks = two_ranks();
    let world = ranks.len();
    let chunk = 3 * 1024 + 16;
    // Byte i of the chunk rank r sends to rank p: distinct per (r, p, i).
    let byte = |r: usize, p: usize, i: usize| ((r * 131 + p * 71 + i * 7 + i / 251) % 251) as u8;
    let mut send = Vec::new();
    let mut recv = Vec::new();
    for r in 0..world {
        let s = ranks.gpu(r).stream();
        let bytes: Vec<u8> = (0..world)
            .flat_map(|p| (0..chunk).map(move |i| byte(r, p, i)))
            .collect();
        send.push(s.clone_htod(&bytes).unwrap());
        // (Poisoned: 0xFF is no byte of the pattern's range.)
        recv.push(s.clone_htod(&vec![0xFFu8; world * chunk]).unwrap());
    }
    let views: Vec<_> = send.iter().map(|b| b.slice(..)).collect();
    let mut sinks: Vec<_> = recv.iter_mut().map(|b| b.slice_mut(..)).collect();
    ranks.all_to_all(&views, &mut sinks).unwrap();
    drop(sinks);
    for (p, buf) in recv.iter().enumerate() {
        let got = ranks.gpu(p).stream().clone_dtoh(buf).unwrap();
        for r in 0..world {
            for i in 0..chunk {
                assert_eq!(
                    got[r * chunk + i],
                    byte(r, p, i),
                    "rank {p}, chunk from {r}, byte {i}"
                );
            }
        }
    }
    // Unequal or indivisible buffers are typed errors.
    let odd: Vec<_> = send.iter().map(|b| b.slice(..world * chunk - 1)).collect();
    let mut sinks: Vec<_> = recv
        .iter_mut()
        .map(|b| b.slice_mut(..world * chunk - 1))
        .collect();
    assert!(
        ranks.all_to_all(&odd, &mut sinks).is_err(),
        "an indivisible length"
    );
    let mut one: Vec<_> = recv.iter_mut().take(1).map(|b| b.slice_mut(..)).collect();
    assert!(
        ranks.all_to_all(&views, &mut one).is_err(),
        "one receive buffer for two ranks"
    );
}

/// An expert-parallel MoE layer (`ExpertParallel`) on two GPUs against the same layer with all
/// experts on one GPU (`MoeLayer`) over both ranks' tokens, the grouped GEMMs on the same plans:
/// each entry's rows are the same products wherever its expert runs, and each token's sum takes
/// its choices in the same order, so the outputs are equal bit for bit. Contiguous and masked
/// groups, softmax and sigmoid weights, the two ranks routing different (fresh random) tokens;
/// a second step with new tokens reuses the buffers.
#[test]
#[ignore = "needs two CUDA devices"]
fn an_expert_parallel_moe_layer_on_two_gpus_equals_one_gpu() {
    use blockscaled::Scoring;
    use blockscaled::{ExpertParallel, GroupLayout, MoeLayer, MoeOptions, MoeShape, ScaledMatrix};
    let ranks = two_ranks();
    let world = ranks.len();
    let fmt = Recipe::DeepSeekFp8.b();
    let seed = blockscaled_tests::run_seed();
    let cases = [
        (
            48,
            (256, 256, 8, 2),
            GroupLayout::Contiguous,
            Scoring::Softmax,
        ),
        (33, (384, 128, 16, 4), GroupLayout::Masked, Scoring::Sigmoid),
        (
            160,
            (256, 256, 64, 8),
            GroupLayout::Contiguous,
            Scoring::Sigmoid,
        ),
    ];
    for (n, &(tokens, (hidden, inter, experts, top_k), layout, scoring)) in cases.iter().enumerate()
    {
        let shape = MoeShape {
            hidden,
            inter,
            experts,
            top_k,
        };
        let at = seed.wrapping_add(1000 + 100 * n as u64);
        let local = experts / world;
        let v1 = random_values(at + 1, experts * 2 * inter * hidden, hidden);
        let v2 = random_values(at + 2, experts * hidden * inter, inter);
        // Quantized per 128×128 block of each expert: a rank's share quantizes alike.
        let q = |v: &[f32], rows, k, batch| ScaledMatrix::quantize(v, rows, k, batch, fmt).unwrap();
        let g0 = ranks.gpu(0);
        let (w1_all, w2_all) = (
            g0.upload(&q(&v1, 2 * inter, hidden, experts)).unwrap(),
            g0.upload(&q(&v2, hidden, inter, experts)).unwrap(),
        );
        let shares: Vec<_> = (0..world)
            .map(|r| {
                let g = ranks.gpu(r);
                let (s1, s2) = (2 * inter * hidden * local, hidden * inter * local);
                (
                    g.upload(&q(&v1[r * s1..][..s1], 2 * inter, hidden, local))
                        .unwrap(),
                    g.upload(&q(&v2[r * s2..][..s2], hidden, inter, local))
                        .unwrap(),
                )
            })
            .collect();
        let experts_of: Vec<_> = shares.iter().map(|(a, b)| (a, b)).collect();
        let opts = MoeOptions {
            scoring,
            layout,
            ..MoeOptions::default()
        };
        // The plans rank 0 would choose, then both sides on them.
        let mut ep = ExpertParallel::new(&ranks, shape, &experts_of, opts).unwrap();
        let step = |ep: &mut ExpertParallel, salt: u64| {
            let xs: Vec<_> = (0..world)
                .map(|r| random_values(at + salt + 10 * r as u64, tokens * hidden, hidden))
                .collect();
            let ls: Vec<_> = (0..world)
                .map(|r| random_values(at + salt + 10 * r as u64 + 5, tokens * experts, experts))
                .collect();
            let xt: Vec<_> = (0..world)
                .map(|r| {
                    ranks
                        .gpu(r)
                        .upload_tensor(&xs[r], tokens, hidden, 1)
                        .unwrap()
                })
                .collect();
            let lt: Vec<_> = (0..world)
                .map(|r| {
                    ranks
                        .gpu(r)
                        .upload_tensor(&ls[r], tokens, experts, 1)
                        .unwrap()
                })
                .collect();
            let mut outs: Vec<_> = (0..world)
                .map(|r| {
                    ranks
                        .gpu(r)
                        .output(tokens, hidden, 1, OutType::Bf16)
                        .unwrap()
                })
                .collect();
            ep.forward(
                &xt.iter().collect::<Vec<_>>(),
                &lt.iter().collect::<Vec<_>>(),
                &mut outs.iter_mut().collect::<Vec<_>>(),
            )
            .unwrap();
            let got: Vec<_> = outs.iter().map(|o| o.to_host().unwrap()).collect();
            (xs.concat(), ls.concat(), got)
        };
        step(&mut ep, 20);
        let plans = {
            let s = ep.last_step(0).unwrap();
            let (w1, w2) = experts_of[0];
            (
                g0.grouped_plan(s.grouped, w1, s.groups).unwrap(),
                g0.grouped_plan(s.hidden, w2, s.groups).unwrap(),
            )
        };
        let opts = MoeOptions {
            plans: Some(plans),
            ..opts
        };
        let mut ep = ExpertParallel::new(&ranks, shape, &experts_of, opts).unwrap();
        let mut one = MoeLayer::new(g0, shape, &w1_all, &w2_all, opts).unwrap();
        for salt in [30, 40] {
            let (x, logits, got) = step(&mut ep, salt);
            let xt = g0.upload_tensor(&x, world * tokens, hidden, 1).unwrap();
            let lt = g0
                .upload_tensor(&logits, world * tokens, experts, 1)
                .unwrap();
            let mut out = g0.output(world * tokens, hidden, 1, OutType::Bf16).unwrap();
            one.forward(&xt, &lt, &mut out).unwrap();
            let want = out.to_host().unwrap();
            let mut dropped = 0;
            for (r, got) in got.iter().enumerate() {
                let slots = ranks
                    .gpu(r)
                    .stream()
                    .clone_dtoh(&ep.last_step(r).unwrap().slot)
                    .unwrap();
                dropped += slots.iter().filter(|&&s| s < 0).count();
                for (i, v) in got.values.iter().enumerate() {
                    let w = want.values[r * tokens * hidden + i];
                    assert!(
                        v.to_bits() == w.to_bits() && !v.is_nan(),
                        "case {n}, rank {r}, output {i}: {v:e} on two GPUs, {w:e} on one"
                    );
                }
            }
            assert_eq!(dropped, 0, "case {n}: the default capacities drop nothing");
        }
        println!(
            "case {n}: {tokens} tokens a rank, {experts} experts top-{top_k}, {layout:?}: equal"
        );
    }
}
