//! The fused epilogue on the GPU: every activation, α, β·C, bias (f32 and bf16, per batch entry
//! or shared), residual and output type against the host's steps on the same GEMM's plain f32
//! product (bit for bit where the steps are single roundings, within the SFU's error for the
//! activations), on ragged shapes and every kernel family that fuses; and quantized output bit
//! for bit against the device quantizer of the same epilogue's f32 output.

use blockscaled::{
    Activation, Call, DeviceTensor, Epilogue, Fp8, Gpu, InputType, OperandFormat, OutType,
    QuantizeOptions, Recipe, ScaledMatrix,
};
use blockscaled_tests::{random_pair, random_values, upload_tensor_as};

/// The recipes whose GEMMs fuse (FP8 DeepSeek, MXFP8, NVFP4, MXFP4: the FP8 and MX kernels).
fn recipes() -> Vec<(&'static str, Recipe)> {
    vec![
        ("deepseek", Recipe::DeepSeekFp8),
        ("mxfp8", Recipe::Mxfp8(Fp8::E4M3)),
        ("nvfp4", Recipe::Nvfp4),
        ("mxfp4", Recipe::Mxfp4),
    ]
}

/// Host activation in f64 of an f32 argument.
fn act(a: Activation, x: f32) -> f64 {
    let x64 = x as f64;
    let sigmoid = |z: f64| 1.0 / (1.0 + (-z).exp());
    match a {
        Activation::None => x64,
        Activation::Relu => {
            if x < 0.0 {
                0.0
            } else {
                x64
            }
        }
        Activation::GeluErf => 0.5 * x64 * (1.0 + libm::erf(x64 / std::f64::consts::SQRT_2)),
        Activation::GeluTanh => {
            let u = (2.0 / std::f64::consts::PI).sqrt() * (x64 + 0.044715 * x64 * x64 * x64);
            0.5 * x64 * (1.0 + u.tanh())
        }
        Activation::Silu | Activation::SwiGlu => x64 * sigmoid(x64),
    }
}

/// What the device holds of an uploaded tensor (its values as f32).
struct Held {
    t: DeviceTensor<'static>,
    v: Vec<f32>,
}

fn held(gpu: &Gpu, seed: u64, ty: InputType, (rows, k, batch): (usize, usize, usize)) -> Held {
    let v = random_values(seed, rows * k * batch, k);
    let (t, v) = upload_tensor_as(gpu, ty, &v, (rows, k, batch)).unwrap();
    Held { t, v }
}

/// Asserts that two quantized matrices hold the same codes and the same scales, bit for bit.
fn assert_same_quantized(got: &ScaledMatrix, want: &ScaledMatrix, what: &str) {
    assert!(got.data() == want.data(), "{what}: codes differ");
    assert!(got.scales() == want.scales(), "{what}: scales differ");
}

/// Rounds `x` to `dtype` as the kernels' stores do (round to nearest even).
fn round_to(dtype: OutType, x: f32) -> f32 {
    match dtype {
        OutType::F32 => x,
        OutType::Bf16 => half::bf16::from_f32(x).to_f32(),
        OutType::F16 => half::f16::from_f32(x).to_f32(),
    }
}

/// The output's relative rounding (half an ulp) and its absolute rounding among subnormals (half
/// the subnormal spacing: fp16's 2^-24; bf16's and f32's are below every value here).
fn out_eps(dtype: OutType) -> (f64, f64) {
    match dtype {
        OutType::F32 => (2f64.powi(-24), 2f64.powi(-150)),
        OutType::Bf16 => (2f64.powi(-8), 2f64.powi(-134)),
        OutType::F16 => (2f64.powi(-11), 2f64.powi(-25)),
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn fused_epilogues_match_the_host_steps_on_the_plain_product() {
    let gpu = Gpu::new(0).expect("a GPU");
    let mut seed = 900u64;
    for (rname, recipe) in recipes() {
        // Ragged M and N, two batch entries; N even (SwiGLU pairs columns).
        for (m, n, k, l) in [(200usize, 392usize, 512usize, 2usize), (77, 136, 256, 1)] {
            seed += 10;
            let (a, b) = random_pair(seed, (m, n, k, l), recipe.a(), recipe.b());
            let (da, db) = (gpu.upload(&a).unwrap(), gpu.upload(&b).unwrap());
            let c = held(&gpu, seed + 1, InputType::Bf16, (m, n, l));
            let bias32 = held(&gpu, seed + 2, InputType::F32, (1, n, l));
            let bias16 = held(&gpu, seed + 3, InputType::Bf16, (1, n, 1));
            let res = held(&gpu, seed + 4, InputType::F16, (m, n, l));
            let res_half = held(&gpu, seed + 5, InputType::F32, (m, n / 2, l));
            for activation in Activation::ALL {
                let paired = activation == Activation::SwiGlu;
                let n_out = if paired { n / 2 } else { n };
                let residual = if paired { &res_half } else { &res };
                // Three option sets: α alone; α, β·C, a per-batch f32 bias and the residual; a
                // shared bf16 bias.
                let sets: [(f32, bool, u8, bool); 3] = [
                    (0.75, false, 0, false),
                    (1.5, true, 1, true),
                    (1.0, false, 2, false),
                ];
                for (alpha, with_c, bias, with_r) in sets {
                    let mut epi = Epilogue::new().alpha(alpha).activation(activation);
                    if with_c {
                        epi = epi.beta_c(-0.5, &c.t);
                    }
                    epi = match bias {
                        1 => epi.bias(&bias32.t),
                        2 => epi.bias(&bias16.t),
                        _ => epi,
                    };
                    if with_r {
                        epi = epi.residual(&residual.t);
                    }
                    let plan = gpu.fused_plan(&da, &db, &epi, None).unwrap();
                    // The plain product on the same plan: the fused kernel's t, bit for bit.
                    let mut p = gpu.output(m, n, l, OutType::F32).unwrap();
                    gpu.gemm_with(&da, &db, &mut p, plan).unwrap();
                    let t = p.to_host().unwrap().values;
                    for dtype in [OutType::Bf16, OutType::F16, OutType::F32] {
                        let what = format!(
                            "{rname} {m}×{n}×{k}×{l} {activation:?} α {alpha} C {with_c} bias \
                             {bias} residual {with_r} {dtype:?} on {plan:?}"
                        );
                        let mut out = gpu.output(m, n_out, l, dtype).unwrap(); // NaN-poisoned
                        gpu.run(
                            &Call::new(&da, &db).epilogue(&epi).with_plan(plan),
                            &mut out,
                        )
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                        let got = out.to_host().unwrap().values;
                        let mut worst = 0f64;
                        for ll in 0..l {
                            for r in 0..m {
                                let pre = |col: usize| {
                                    let i = (ll * m + r) * n + col;
                                    let mut x = alpha * t[i];
                                    if with_c {
                                        x += -0.5f32 * c.v[i];
                                    }
                                    match bias {
                                        1 => x += bias32.v[ll * n + col],
                                        2 => x += bias16.v[col],
                                        _ => {}
                                    }
                                    x
                                };
                                for j in 0..n_out {
                                    let (y, arg) = if paired {
                                        let (g, u) = (pre(2 * j), pre(2 * j + 1));
                                        (act(Activation::Silu, g) * u as f64, g.abs() + u.abs())
                                    } else {
                                        let x = pre(j);
                                        (act(activation, x), x.abs())
                                    };
                                    let oi = (ll * m + r) * n_out + j;
                                    let exact =
                                        matches!(activation, Activation::None | Activation::Relu);
                                    let mut y32 = y as f32;
                                    if with_r {
                                        y32 += residual.v[oi];
                                    }
                                    let g = got[oi];
                                    if exact {
                                        let want = round_to(dtype, y32);
                                        assert!(
                                            g.to_bits() == want.to_bits()
                                                || (g.is_nan() && want.is_nan()),
                                            "{what}: ({ll}, {r}, {j}) = {g}, host {want}"
                                        );
                                        continue;
                                    }
                                    // The SFU's ex2 / rcp (a few 2^-22 relative), A–S erf
                                    // (1.5e-7 absolute in erf), and the output's rounding.
                                    let resid = if with_r {
                                        residual.v[oi].abs() as f64
                                    } else {
                                        0.0
                                    };
                                    let (rel, sub) = out_eps(dtype);
                                    let tol = (rel + 2f64.powi(-19)) * (y32.abs() as f64 + resid)
                                        + 2f64.powi(-20) * arg as f64 * (1.0 + arg as f64)
                                        + sub;
                                    let rounded = round_to(dtype, y32);
                                    if rounded.is_infinite() {
                                        // Past the output type's range: its rounding (fp16's
                                        // ±Inf), or its largest value where the error bound
                                        // straddles the overflow threshold.
                                        assert!(
                                            g == rounded || g.abs() == 65504.0,
                                            "{what}: ({ll}, {r}, {j}) = {g}, host {y32}"
                                        );
                                        continue;
                                    }
                                    let err = (g as f64 - y32 as f64).abs();
                                    assert!(
                                        g.is_finite() && err <= tol,
                                        "{what}: ({ll}, {r}, {j}) = {g}, host {y32} (tolerance {tol:e})"
                                    );
                                    worst = worst.max(err / tol);
                                }
                            }
                        }
                        assert!(worst <= 1.0, "{what}");
                    }
                }
            }
        }
    }
}

/// Quantized output: the fused kernel's codes and scales equal the device quantizer's of the
/// same epilogue's f32 output, bit for bit; a fused FP8 1×128 output runs the next FP8 GEMM as
/// that quantizer's does.
#[test]
#[ignore = "needs a CUDA device"]
fn quantized_output_is_the_quantizer_of_the_fused_f32_output() {
    let gpu = Gpu::new(0).expect("a GPU");
    let outs: Vec<(&str, OperandFormat, Option<f32>)> = vec![
        ("fp8-1x128", Recipe::DeepSeekFp8.a(), None),
        ("mxfp8", Recipe::Mxfp8(Fp8::E4M3).a(), None),
        ("mxfp4", Recipe::Mxfp4.a(), None),
        ("nvfp4", Recipe::Nvfp4.a(), Some(0.01)),
    ];
    let mut seed = 5000u64;
    for (rname, recipe) in recipes() {
        for (m, n, k, l) in [(200usize, 512usize, 512usize, 2usize), (64, 256, 256, 1)] {
            seed += 10;
            let (a, b) = random_pair(seed, (m, n, k, l), recipe.a(), recipe.b());
            let (da, db) = (gpu.upload(&a).unwrap(), gpu.upload(&b).unwrap());
            let bias = held(&gpu, seed + 1, InputType::Bf16, (1, n, 1));
            for activation in [Activation::Silu, Activation::SwiGlu, Activation::GeluTanh] {
                let epi = Epilogue::new()
                    .alpha(2.0)
                    .bias(&bias.t)
                    .activation(activation);
                let n_out = if activation == Activation::SwiGlu {
                    n / 2
                } else {
                    n
                };
                for (qname, format, ts) in &outs {
                    let what = format!("{rname} {m}×{n}×{k}×{l} {activation:?} → {qname}");
                    let opts = QuantizeOptions {
                        major: None,
                        tensor_scale: *ts,
                        swizzled_scales: false,
                    };
                    let plan = match gpu.fused_plan(&da, &db, &epi, Some(*format)) {
                        Ok(p) => p,
                        Err(e) => {
                            // SwiGLU with 1×128 scales is refused (a typed error, said in docs).
                            assert!(
                                activation == Activation::SwiGlu && *qname == "fp8-1x128",
                                "{what}: {e}"
                            );
                            continue;
                        }
                    };
                    let mut f = gpu.output(m, n_out, l, OutType::F32).unwrap();
                    gpu.run(&Call::new(&da, &db).epilogue(&epi).with_plan(plan), &mut f)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    let ft = gpu.output_as_tensor(f).unwrap();
                    let want = gpu.quantize_with(&ft, *format, &opts).unwrap();
                    let got = gpu
                        .run_quantized_new(
                            &Call::new(&da, &db).epilogue(&epi).with_plan(plan),
                            *format,
                            &opts,
                        )
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    let (g, w) = (got.to_host().unwrap(), want.matrix.to_host().unwrap());
                    assert_same_quantized(&g, &w, &format!("{what} on {plan:?}"));
                    // Into a matrix that held other values (another tensor's quantization):
                    // the same codes and scales.
                    let mut reused = gpu.quantize_with(&ft, *format, &opts).unwrap().matrix;
                    let other = held(&gpu, seed + 3, InputType::F32, (m, n_out, l));
                    gpu.quantize_into(&other.t, &mut reused, &opts).unwrap();
                    gpu.run_quantized(
                        &Call::new(&da, &db).epilogue(&epi).with_plan(plan),
                        &mut reused,
                    )
                    .unwrap_or_else(|e| panic!("{what}: into: {e}"));
                    let r = reused.to_host().unwrap();
                    assert_same_quantized(&r, &w, &format!("{what} on {plan:?}: into"));
                    if *qname == "fp8-1x128" {
                        // The next GEMM on the fused output (its A-role scale copy included).
                        let b2 = random_pair(
                            seed + 7,
                            (8, 256, n_out, l),
                            recipe.a(),
                            Recipe::DeepSeekFp8.b(),
                        )
                        .1;
                        let db2 = gpu.upload(&b2).unwrap();
                        let mut c1 = gpu.output(m, 256, l, OutType::Bf16).unwrap();
                        let mut c2 = gpu.output(m, 256, l, OutType::Bf16).unwrap();
                        gpu.gemm(&got, &db2, &mut c1).unwrap();
                        gpu.gemm(&want.matrix, &db2, &mut c2).unwrap();
                        let (c1, c2) = (c1.to_host().unwrap().values, c2.to_host().unwrap().values);
                        assert!(c1.iter().all(|v| v.is_finite()), "{what}: next GEMM");
                        assert!(
                            c1.iter().zip(&c2).all(|(x, y)| x.to_bits() == y.to_bits()),
                            "{what}: the next GEMM differs"
                        );
                    }
                }
            }
        }
    }
}

/// Every configuration a fused kernel runs in: the FP8 128 × 128 tile alone, in pairs along M
/// and along N, and with K split in two and three ranges (the fused epilogue runs after the
/// ranges meet), and the FP8 192-row tile alone and in pairs; the 16-bit 128 × 128 tile (bf16
/// and fp16); MXFP8 folded onto the FP8 fused tile (the MX 256-column fused tile runs in the
/// tests above, at M < 256). Each against the host's steps on the plain product of the same
/// plan, bit for bit (α, a per-batch f32 bias, ReLU, with and without a residual — the finishing
/// warps, and the consumers' registers —, bf16 and f32 output: single roundings), on a ragged
/// shape; on the FP8 plans also FP8 1×128 output against the quantizer of the f32 output.
#[test]
#[ignore = "needs a CUDA device"]
fn every_fused_configuration_matches_the_host_steps_bit_for_bit() {
    use blockscaled::{ClusterShape, ElemType, Fp4Weights, Plan, Sm90Tile};
    let gpu = Gpu::new(0).expect("a GPU");
    let (m, n, k, l) = (328usize, 392usize, 1024usize, 2usize);
    let half = |elem| OperandFormat {
        elem,
        ..Recipe::W4A16(Fp4Weights::Nvfp4).a()
    };
    let cases: Vec<(&str, OperandFormat, OperandFormat)> = vec![
        ("deepseek", Recipe::DeepSeekFp8.a(), Recipe::DeepSeekFp8.b()),
        ("bf16", half(ElemType::BF16), half(ElemType::BF16)),
        ("f16", half(ElemType::F16), half(ElemType::F16)),
        (
            "mxfp8",
            Recipe::Mxfp8(Fp8::E4M3).a(),
            Recipe::Mxfp8(Fp8::E4M3).b(),
        ),
    ];
    let mut seed = 7100u64;
    for (name, fa, fb) in cases {
        seed += 10;
        let (a, b) = random_pair(seed, (m, n, k, l), fa, fb);
        let (da, db) = (gpu.upload(&a).unwrap(), gpu.upload(&b).unwrap());
        let bias = held(&gpu, seed + 1, InputType::F32, (1, n, l));
        let res = held(&gpu, seed + 2, InputType::Bf16, (m, n, l));
        let in_regs = Epilogue::new()
            .alpha(1.25)
            .bias(&bias.t)
            .activation(Activation::Relu);
        let epi = in_regs.residual(&res.t);
        let base = gpu.fused_plan(&da, &db, &epi, None).unwrap();
        let mut plans = vec![base];
        if let Plan::Sm90Fp8(c) = base {
            assert_eq!(c.tile, Sm90Tile::M128, "{name}: {base:?}");
            for (cluster, split_k) in [
                (ClusterShape { m: 2, n: 1 }, 1),
                (ClusterShape { m: 1, n: 2 }, 1),
                (ClusterShape::ONE, 2),
                (ClusterShape::ONE, 3),
            ] {
                plans.push(Plan::Sm90Fp8(
                    c.with_cluster(cluster)
                        .with_split_k(split_k)
                        .with_group_m(1),
                ));
            }
            // The 192-row tile runs the epilogues without a residual (in registers), alone
            // and in pairs along N.
            for cluster in [ClusterShape::ONE, ClusterShape { m: 1, n: 2 }] {
                plans.push(Plan::Sm90Fp8(
                    c.with_tile(Sm90Tile::M192)
                        .with_cluster(cluster)
                        .with_group_m(1),
                ));
            }
        }
        for plan in plans {
            let mut p = gpu.output(m, n, l, OutType::F32).unwrap();
            gpu.gemm_with(&da, &db, &mut p, plan).unwrap();
            let t = p.to_host().unwrap().values;
            // With the residual (the finishing warps), and without it (the FP8 family runs that
            // in the consumers' registers); bf16 output through the TMA stores, f32 directly.
            for (e, with_r, dtype) in [
                (&epi, true, OutType::Bf16),
                (&in_regs, false, OutType::Bf16),
                (&in_regs, false, OutType::F32),
            ] {
                if with_r && matches!(plan, Plan::Sm90Fp8(c) if c.tile == Sm90Tile::M192) {
                    // (A typed error: no kernel with finishing warps for that tile.)
                    let mut out = gpu.output(m, n, l, dtype).unwrap();
                    assert!(
                        gpu.run(&Call::new(&da, &db).epilogue(e).with_plan(plan), &mut out)
                            .is_err()
                    );
                    continue;
                }
                let mut out = gpu.output(m, n, l, dtype).unwrap(); // NaN-poisoned
                gpu.run(&Call::new(&da, &db).epilogue(e).with_plan(plan), &mut out)
                    .unwrap_or_else(|e| panic!("{name} on {plan:?}: {e}"));
                let got = out.to_host().unwrap().values;
                for ll in 0..l {
                    for r in 0..m {
                        for j in 0..n {
                            let i = (ll * m + r) * n + j;
                            let x = 1.25f32 * t[i] + bias.v[ll * n + j];
                            let mut y = if x < 0.0 { 0.0 } else { x };
                            if with_r {
                                y += res.v[i];
                            }
                            let want = round_to(dtype, y);
                            assert!(
                                got[i].to_bits() == want.to_bits(),
                                "{name} residual {with_r} {dtype:?} on {plan:?}: ({ll}, {r}, \
                                 {j}) = {}, host {want}",
                                got[i]
                            );
                        }
                    }
                }
            }
            // Quantized output in each configuration, against the quantizer of the same
            // epilogue's f32 output: FP8 1×128 (N a whole number of blocks: 384 columns) and
            // MXFP8 (e8m0 per 32: 352 columns, the last tile's 96 columns inside N and 32 past
            // it), both in the consumers' registers.
            let outs = [
                (Recipe::DeepSeekFp8.a(), 384),
                (Recipe::Mxfp8(Fp8::E4M3).a(), 352),
            ];
            for (format, cols) in outs {
                if !matches!(plan, Plan::Sm90Fp8(_)) {
                    break;
                }
                let (da2, db2) = {
                    let (a2, b2) = random_pair(seed + 5, (m, cols, k, l), fa, fb);
                    (gpu.upload(&a2).unwrap(), gpu.upload(&b2).unwrap())
                };
                let bias2 = held(&gpu, seed + 6, InputType::Bf16, (1, cols, 1));
                let e = Epilogue::new()
                    .alpha(0.5)
                    .bias(&bias2.t)
                    .activation(Activation::Silu);
                let opts = QuantizeOptions::default();
                let what = format!("{name} → {} × {cols} on {plan:?}", format.scale.name());
                let mut f = gpu.output(m, cols, l, OutType::F32).unwrap();
                gpu.run(&Call::new(&da2, &db2).epilogue(&e).with_plan(plan), &mut f)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                let want = gpu
                    .quantize_with(&gpu.output_as_tensor(f).unwrap(), format, &opts)
                    .unwrap();
                let got = gpu
                    .run_quantized_new(
                        &Call::new(&da2, &db2).epilogue(&e).with_plan(plan),
                        format,
                        &opts,
                    )
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                let (g, w) = (got.to_host().unwrap(), want.matrix.to_host().unwrap());
                assert_same_quantized(&g, &w, &what);
            }
        }
    }
}

/// No systematic error in the fused kernels' products (`blockscaled_tests::check_no_cancellation`):
/// on operands that do not cancel, α · A·Bᵀ + bias (f32 output; each column's bias of its B
/// row's sign, so nothing cancels) on the plan `fused_plan` picks for every fusing recipe, at
/// 128 rows (the MX kernel for MX and NVFP4 pairs) and 300 (their fold onto the FP8 kernel),
/// within that kernel's bound of α·Σ|a·b| against the float64 reference of the operands it
/// multiplies (the host's bit-identical folds where it folds); each check fails a planted 0.5%
/// error.
#[test]
#[ignore = "needs a CUDA device"]
fn fused_kernels_have_no_systematic_error_on_operands_that_do_not_cancel() {
    use blockscaled::{Plan, reference};
    use blockscaled_tests::{
        NoCancellation, check_no_cancellation, no_cancellation_matrix, run_seed,
    };
    let gpu = Gpu::new(0).expect("a GPU");
    let (n, k, l, alpha) = (264usize, 1024usize, 2usize, 1.25f32);
    for (i, (rname, recipe)) in recipes().into_iter().enumerate() {
        for m in [128usize, 300] {
            let seed = run_seed() + (2 * i) as u64 + (m / 300) as u64;
            let a = no_cancellation_matrix(seed, m, k, l, recipe.a(), false);
            let b = no_cancellation_matrix(seed ^ 0x5851_F42D, n, k, l, recipe.b(), true);
            // Each column's bias: B's row sign times a random magnitude.
            let bv = b.dequantize();
            let mags = random_values(seed + 1, n * l, n);
            let bias: Vec<f32> = (0..n * l)
                .map(|j| {
                    let row = &bv[j * k..][..k];
                    let sign = row
                        .iter()
                        .find(|x| **x != 0.0)
                        .map_or(1.0, |x| x.signum() as f32);
                    sign * mags[j].abs()
                })
                .collect();
            let (bias_t, bias) = upload_tensor_as(&gpu, InputType::F32, &bias, (1, n, l)).unwrap();
            let epi = Epilogue::new().alpha(alpha).bias(&bias_t);
            let (da, db) = (gpu.upload(&a).unwrap(), gpu.upload(&b).unwrap());
            let plan = gpu.fused_plan(&da, &db, &epi, None).unwrap();
            let mut c = gpu.output(m, n, l, OutType::F32).unwrap(); // NaN-poisoned
            gpu.run(&Call::new(&da, &db).epilogue(&epi).with_plan(plan), &mut c)
                .unwrap();
            let got = c.to_host().unwrap();
            let (ka, kb, bounds) = match plan {
                Plan::Sm90MxFp8(_) => (
                    a.fold_to_fp8(false).unwrap(),
                    b.fold_to_fp8(true).unwrap(),
                    NoCancellation::FP8,
                ),
                Plan::Sm90Mx(_) => (a.clone(), b.clone(), NoCancellation::half(k)),
                _ => (a.clone(), b.clone(), NoCancellation::FP8),
            };
            let (c64, abs) = reference::gemm_f64(&ka, &kb).unwrap();
            let mut want = got.clone();
            for (i, w) in want.values.iter_mut().enumerate() {
                let (ll, col) = (i / (m * n), i % n);
                *w = (alpha as f64 * c64[i] + bias[ll * n + col] as f64) as f32;
            }
            let abs: Vec<f64> = abs.iter().map(|s| s * alpha as f64).collect();
            let (rel, mean) = check_no_cancellation(&got, &want, &abs, bounds)
                .unwrap_or_else(|e| panic!("{rname} M = {m} on {plan:?}, seed {seed}: {e}"));
            eprintln!(
                "{rname} M = {m} on {plan:?}: largest relative error {rel:.2e}, mean {mean:.2e}"
            );
        }
    }
}

/// Epilogue tensors that do not fit the product, a SwiGLU over an odd N and non-finite α or β
/// are typed errors that launch nothing (the NaN-poisoned output stays poisoned); a bias of one
/// batch entry is shared, but C and the residual need every entry.
#[test]
#[ignore = "needs a CUDA device"]
fn epilogues_that_do_not_fit_the_product_are_typed_errors() {
    use blockscaled::Error;
    let gpu = Gpu::new(0).expect("a GPU");
    let recipe = Recipe::DeepSeekFp8;
    let (m, n, k, l) = (200usize, 392usize, 512usize, 2usize);
    let (a, b) = random_pair(7100, (m, n, k, l), recipe.a(), recipe.b());
    let (da, db) = (gpu.upload(&a).unwrap(), gpu.upload(&b).unwrap());
    let t = |seed, ty, dims| held(&gpu, seed, ty, dims);
    let bias_short = t(7101, InputType::F32, (1, n - 8, l));
    let bias_shared = t(7102, InputType::F32, (1, n, 1));
    let c_one_entry = t(7103, InputType::Bf16, (m, n, 1));
    let c_tall = t(7104, InputType::Bf16, (m + 1, n, l));
    let residual_narrow = t(7105, InputType::Bf16, (m, n - 2, l));
    let c = t(7106, InputType::Bf16, (m, n, l));
    let refused = |epi: &Epilogue, n_out: usize, what: &str| -> Error {
        let mut out = gpu.output(m, n_out, l, OutType::Bf16).unwrap(); // NaN-poisoned
        let e = gpu
            .run(&Call::new(&da, &db).epilogue(epi), &mut out)
            .err()
            .unwrap_or_else(|| panic!("{what}: accepted"));
        let v = out.to_host().unwrap().values;
        assert!(
            v.iter().all(|x| x.is_nan()),
            "{what}: the output was written"
        );
        e
    };
    let e = refused(&Epilogue::new().bias(&bias_short.t), n, "a short bias");
    assert!(matches!(e, Error::Shape(_)), "a short bias: {e}");
    let e = refused(
        &Epilogue::new().beta_c(1.0, &c_one_entry.t),
        n,
        "C of one batch entry",
    );
    assert!(matches!(e, Error::Shape(_)), "C of one batch entry: {e}");
    let e = refused(
        &Epilogue::new().beta_c(1.0, &c_tall.t),
        n,
        "C one row too many",
    );
    assert!(matches!(e, Error::Shape(_)), "C one row too many: {e}");
    let e = refused(
        &Epilogue::new().residual(&residual_narrow.t),
        n,
        "a narrow residual",
    );
    assert!(matches!(e, Error::Shape(_)), "a narrow residual: {e}");
    let e = refused(&Epilogue::new().alpha(f32::NAN), n, "α = NaN");
    assert!(matches!(e, Error::Config(_)), "α = NaN: {e}");
    let e = refused(&Epilogue::new().beta_c(f32::INFINITY, &c.t), n, "β = ∞");
    assert!(matches!(e, Error::Config(_)), "β = ∞: {e}");
    // The shared bias runs.
    let mut out = gpu.output(m, n, l, OutType::Bf16).unwrap();
    gpu.run(
        &Call::new(&da, &db).epilogue(&Epilogue::new().bias(&bias_shared.t)),
        &mut out,
    )
    .unwrap();
    // SwiGLU over an odd N.
    let odd = n - 1;
    let (a3, b3) = random_pair(7110, (m, odd, k, l), recipe.a(), recipe.b());
    let (da3, db3) = (gpu.upload(&a3).unwrap(), gpu.upload(&b3).unwrap());
    let mut out = gpu.output(m, odd / 2, l, OutType::Bf16).unwrap();
    let swiglu = Epilogue::new().activation(Activation::SwiGlu);
    let e = gpu
        .run(&Call::new(&da3, &db3).epilogue(&swiglu), &mut out)
        .expect_err("SwiGLU over an odd N");
    assert!(
        matches!(&e, Error::Shape(s) if s.contains("SwiGLU")),
        "SwiGLU over an odd N: {e}"
    );
}
