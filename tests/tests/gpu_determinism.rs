//! Every family gives the same bits every time (issue 47's determinism bar): each call below runs
//! three times into outputs freshly poisoned with NaN, and every element of every run must equal
//! the first run's, bit for bit, and be finite. Split K (where the last CTA of a tile adds the
//! other ranges' partial sums in a fixed order), grouped GEMM, the fused epilogue, a quantized
//! output and the fold pre-pass included.

use blockscaled::kernels::params::Activation;
use blockscaled::{
    Call, DeviceMatrix, Epilogue, Fp4Weights, Fp8, Gpu, HostOutput, OutType, Plan, QuantizeOptions,
    Recipe, ScaleLayout, ScaleMajor, ScaledMatrix,
};
use blockscaled_tests::{random_matrix, random_values, run_seed};

fn gpu() -> Gpu {
    Gpu::new(0).expect("a CUDA device (these tests are ignored without one)")
}

/// `run` three times (each into a fresh output, poisoned with NaN); every run's bits equal the
/// first's, and every element is finite.
fn same_bits(what: &str, mut run: impl FnMut() -> HostOutput) {
    let first = run();
    assert!(
        first.values.iter().all(|v| v.is_finite()),
        "{what}: a non-finite element in the first run"
    );
    for i in 1..3 {
        let again = run();
        assert_eq!(again.values.len(), first.values.len(), "{what}: lengths");
        for (e, (a, b)) in again.values.iter().zip(&first.values).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{what}: run {i}, element {e}: {a} against {b}"
            );
        }
    }
    println!(
        "{what}: {} elements, the same bits in 3 runs",
        first.values.len()
    );
}

/// A dense call of `a` and `b` (uploaded) on `plan`, `m × n` bf16.
fn dense(
    g: &Gpu,
    what: &str,
    (a, b): (&DeviceMatrix, &DeviceMatrix),
    plan: Plan,
    (m, n): (usize, usize),
) {
    same_bits(what, || {
        let mut c = g.output(m, n, 1, OutType::Bf16).unwrap();
        g.run(&Call::new(a, b).with_plan(plan), &mut c).unwrap();
        c.to_host().unwrap()
    });
}

fn uploaded(
    g: &Gpu,
    recipe: Recipe,
    (m, n, k): (usize, usize, usize),
    seed: u64,
) -> (DeviceMatrix<'static>, DeviceMatrix<'static>) {
    let (_, a) = random_matrix(seed, m, k, 1, recipe.a());
    let (_, b) = random_matrix(seed + 1, n, k, 1, recipe.b());
    (g.upload(&a).unwrap(), g.upload(&b).unwrap())
}

#[test]
#[ignore = "needs a CUDA device"]
fn every_family_gives_the_same_bits_every_time() {
    let g = gpu();
    let seed = run_seed();

    // FP8 (DeepSeek), split K in 4.
    let (a, b) = uploaded(&g, Recipe::DeepSeekFp8, (128, 1024, 4096), seed);
    let plan = match g.plan(&a, &b).unwrap() {
        Plan::Sm90Fp8(c) => Plan::Sm90Fp8(c.with_split_k(4)),
        p => panic!("{p:?}"),
    };
    dense(&g, "FP8 split K 4", (&a, &b), plan, (128, 1024));

    // The exact MX kernel (NVFP4 below the fold's 256 rows), split K in 2.
    let (a, b) = uploaded(&g, Recipe::Nvfp4, (128, 512, 2048), seed + 10);
    let plan = match g.plan(&a, &b).unwrap() {
        Plan::Sm90Mx(c) => Plan::Sm90Mx(c.with_split_k(2)),
        p => panic!("NVFP4 at 128 rows runs on the MX kernel, not {p:?}"),
    };
    dense(&g, "MX split K 2", (&a, &b), plan, (128, 512));

    // MXFP4 at 128 rows: A folded per call, the weights on the 4-bit-weights kernel's FP8 MMAs,
    // split K in 2.
    let (a, b) = uploaded(&g, Recipe::Mxfp4, (128, 512, 2048), seed + 15);
    let plan = match g.plan(&a, &b).unwrap() {
        Plan::Sm90W4(c) if c.fp8 => Plan::Sm90W4(c.with_split_k(2)),
        p => panic!("MXFP4 at 128 rows runs on the FP8-MMA 4-bit-weights kernel, not {p:?}"),
    };
    dense(
        &g,
        "4-bit weights, A folded, split K 2",
        (&a, &b),
        plan,
        (128, 512),
    );

    // 4-bit weights × bf16 at decode size, split K in 2.
    let (a, b) = uploaded(
        &g,
        Recipe::W4A16(Fp4Weights::Mxfp4),
        (16, 1024, 4096),
        seed + 20,
    );
    let plan = match g.plan(&a, &b).unwrap() {
        Plan::Sm90W4(c) => Plan::Sm90W4(c.with_split_k(2)),
        p => panic!("W4A16 at 16 rows runs on the 4-bit-weights kernel, not {p:?}"),
    };
    dense(&g, "4-bit weights split K 2", (&a, &b), plan, (16, 1024));

    // bf16 × bf16 (one scale per tensor), split K in 4.
    let half = |rows: usize, k: usize, s: u64| {
        let bits: Vec<u8> = random_values(s, rows * k, k)
            .iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_bits().to_le_bytes())
            .collect();
        let one = 1f32.to_le_bytes().to_vec();
        let layout = ScaleLayout::packed(ScaleMajor::K, 1, 1);
        let fmt = Recipe::W4A16(Fp4Weights::Mxfp4).a();
        let m = ScaledMatrix::from_parts(fmt, rows, k, 1, bits, one, layout, 1.0).unwrap();
        g.upload(&m).unwrap()
    };
    let (a, b) = (half(128, 4096, seed + 30), half(512, 4096, seed + 31));
    let plan = match g.plan(&a, &b).unwrap() {
        Plan::Sm90Half(c) => Plan::Sm90Half(c.with_split_k(4)),
        p => panic!("bf16 runs on the 16-bit kernel, not {p:?}"),
    };
    dense(&g, "16-bit split K 4", (&a, &b), plan, (128, 512));

    // NVFP4 folded onto FP8 (256 rows and more).
    let (a, b) = uploaded(&g, Recipe::Nvfp4, (256, 512, 1024), seed + 40);
    let plan = g.plan(&a, &b).unwrap();
    assert!(matches!(plan, Plan::Sm90MxFp8(_)), "{plan:?}");
    dense(&g, "NVFP4 folded", (&a, &b), plan, (256, 512));

    // MXFP8 e5m2 with a fused epilogue (the MX kernel's staging) and FP8 with bias + SiLU.
    let bias_v = random_values(seed + 50, 512, 512);
    let bias = g.upload_tensor(&bias_v, 1, 512, 1).unwrap();
    let epi = Epilogue::new().bias(&bias).activation(Activation::Silu);
    for (what, recipe) in [
        ("fused MXFP8 e5m2", Recipe::Mxfp8(Fp8::E5M2)),
        ("fused FP8", Recipe::DeepSeekFp8),
    ] {
        let (a, b) = uploaded(&g, recipe, (256, 512, 1024), seed + 60);
        same_bits(what, || {
            let mut c = g.output(256, 512, 1, OutType::Bf16).unwrap();
            g.run(&Call::new(&a, &b).epilogue(&epi), &mut c).unwrap();
            c.to_host().unwrap()
        });
        // The same epilogue quantized to FP8 1×128 (codes and scales, as the next GEMM's A).
        let format = Recipe::DeepSeekFp8.a();
        let opts = QuantizeOptions::default();
        let call = Call::new(&a, &b).epilogue(&epi);
        let first = g
            .run_quantized_new(&call, format, &opts)
            .unwrap()
            .to_host()
            .unwrap();
        for i in 1..3 {
            let again = g
                .run_quantized_new(&call, format, &opts)
                .unwrap()
                .to_host()
                .unwrap();
            assert_eq!(
                again.data(),
                first.data(),
                "{what} quantized, run {i}: codes"
            );
            assert_eq!(
                again.scales(),
                first.scales(),
                "{what} quantized, run {i}: scales"
            );
        }
    }

    // Grouped (contiguous ends on the device), DeepSeek FP8 over 4 experts.
    let (_, a) = random_matrix(seed + 70, 300, 1024, 1, Recipe::DeepSeekFp8.a());
    let (_, b) = random_matrix(seed + 71, 512, 1024, 4, Recipe::DeepSeekFp8.b());
    let (a, b) = (g.upload(&a).unwrap(), g.upload(&b).unwrap());
    let groups = g.group_ends(&[40, 40, 200, 300]).unwrap();
    same_bits("grouped", || {
        let mut c = g.output(300, 512, 1, OutType::Bf16).unwrap();
        g.run(&Call::new(&a, &b).groups(&groups), &mut c).unwrap();
        c.to_host().unwrap()
    });
}
