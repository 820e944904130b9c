//! A mixture-of-experts layer split over two GPUs by experts (`ExpertParallel`, feature `nccl`),
//! against the same layer with every expert on one GPU (`MoeLayer`). Where both run their grouped
//! GEMMs on the same plans (`MoeOptions::plans`, as the GPU test does) the outputs are equal bit
//! for bit; here each layer chooses its own, so outputs may differ by the order in which a plan
//! sums (a unit of bf16 at most is expected). Run with `cargo run --release -p blockscaled --features nccl --example expert_parallel`
//! on a machine with two GPUs and NCCL (`libnccl.so` on the library path; keep
//! `NCCL_NVLS_ENABLE=0` on shared machines).

use blockscaled::{
    ExpertParallel, Gpu, MoeLayer, MoeOptions, MoeShape, OutType, Ranks, Recipe, ScaledMatrix,
};
use rand::{Rng, SeedableRng, rngs::StdRng};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let shape = MoeShape {
        hidden: 1024,
        inter: 512,
        experts: 16,
        top_k: 4,
    };
    let (tokens, world) = (64, 2);
    let local = shape.experts / world;
    let mut rng = StdRng::seed_from_u64(7);
    let mut values =
        |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0..1.0)).collect() };
    let (h, i, e) = (shape.hidden, shape.inter, shape.experts);
    let (v1, v2) = (values(e * 2 * i * h), values(e * h * i));
    let weights = |v: &[f32], rows, k, batch| {
        ScaledMatrix::quantize(v, rows, k, batch, Recipe::DeepSeekFp8.b())
    };

    // Rank r holds experts r·E/W ..: its share of both weight tensors, on its GPU.
    let ranks = Ranks::new(&[0, 1])?;
    let (s1, s2) = (local * 2 * i * h, local * h * i);
    let mut shares = Vec::new();
    for r in 0..world {
        let g = ranks.gpu(r);
        shares.push((
            g.upload(&weights(&v1[r * s1..][..s1], 2 * i, h, local)?)?,
            g.upload(&weights(&v2[r * s2..][..s2], h, i, local)?)?,
        ));
    }
    let experts: Vec<_> = shares.iter().map(|(a, b)| (a, b)).collect();
    let mut ep = ExpertParallel::new(&ranks, shape, &experts, MoeOptions::default())?;

    // Each rank's tokens and router logits; one step.
    let (x, logits) = (values(world * tokens * h), values(world * tokens * e));
    let (mut xs, mut ls, mut outs) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..world {
        let g = ranks.gpu(r);
        xs.push(g.upload_tensor(&x[r * tokens * h..][..tokens * h], tokens, h, 1)?);
        ls.push(g.upload_tensor(&logits[r * tokens * e..][..tokens * e], tokens, e, 1)?);
        outs.push(g.output(tokens, h, 1, OutType::Bf16)?);
    }
    let (xr, lr): (Vec<_>, Vec<_>) = (xs.iter().collect(), ls.iter().collect());
    ep.forward(&xr, &lr, &mut outs.iter_mut().collect::<Vec<_>>())?;

    // The whole layer on GPU 0 over both ranks' tokens.
    let g: &Gpu = ranks.gpu(0);
    let (w1, w2) = (
        g.upload(&weights(&v1, 2 * i, h, e)?)?,
        g.upload(&weights(&v2, h, i, e)?)?,
    );
    let mut one = MoeLayer::new(g, shape, &w1, &w2, MoeOptions::default())?;
    let mut out = g.output(world * tokens, h, 1, OutType::Bf16)?;
    let (xt, lt) = (
        g.upload_tensor(&x, world * tokens, h, 1)?,
        g.upload_tensor(&logits, world * tokens, e, 1)?,
    );
    one.forward(&xt, &lt, &mut out)?;
    let want = out.to_host()?;
    let (mut differ, mut worst) = (0, 0f32);
    for (r, o) in outs.iter().enumerate() {
        let got = o.to_host()?;
        let theirs = &want.values[r * tokens * h..][..tokens * h];
        for (a, b) in got.values.iter().zip(theirs) {
            differ += (a.to_bits() != b.to_bits()) as usize;
            worst = worst.max((a - b).abs() / b.abs().max(f32::MIN_POSITIVE));
        }
    }
    println!(
        "{} experts top-{} over {world} GPUs, {tokens} tokens each: \
         {differ} of {} outputs differ from one GPU's (largest relative difference {worst:e})",
        e,
        shape.top_k,
        world * tokens * h
    );
    Ok(())
}
