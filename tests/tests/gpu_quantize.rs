//! The device quantizers against the host's, bit for bit: every format they write, from f32,
//! bf16 and fp16 tensors, ragged shapes, both scale layouts (and the swizzled copy), and a GEMM
//! on a device-quantized DeepSeek A.

use blockscaled::InputType;
use blockscaled::{Fp8, Gpu, OutType, QuantizeOptions, Recipe, ScaleMajor, ScaledMatrix};
use blockscaled_tests::{random_values, upload_tensor_as};

fn formats() -> Vec<(&'static str, blockscaled::OperandFormat)> {
    vec![
        ("deepseek-a", Recipe::DeepSeekFp8.a()),
        ("fp8-row", Recipe::Fp8PerRow(Fp8::E4M3).a()),
        ("fp8-tensor-e5m2", Recipe::Fp8PerTensor(Fp8::E5M2).a()),
        ("mxfp8-e4m3", Recipe::Mxfp8(Fp8::E4M3).a()),
        ("mxfp8-e5m2", Recipe::Mxfp8(Fp8::E5M2).a()),
        ("mxfp4", Recipe::Mxfp4.a()),
        ("e2m1-e8m0x16", Recipe::E2m1E8m0x16.a()),
        ("nvfp4", Recipe::Nvfp4.a()),
    ]
}

#[test]
#[ignore = "needs a CUDA device"]
fn device_quantizers_are_bit_identical_to_the_host_ones() {
    let gpu = Gpu::new(0).expect("a GPU");
    let mut seed = 1u64;
    // (3 × 20480: a row of more lanes than one block holds, so the per-row formats take the
    // maximum pass and the general kernel; the other shapes the per-row kernel.)
    for (rows, k, batch) in [
        (200, 1024, 2),
        (16, 7168, 1),
        (37, 200, 1),
        (129, 256, 3),
        (3, 20480, 1),
    ] {
        for (name, format) in formats() {
            for input in 0..3 {
                seed += 1;
                let v = random_values(seed, rows * k * batch, k);
                // The host quantizes the values the device reads (bf16 / fp16 rounded).
                let ty = [InputType::F32, InputType::Bf16, InputType::F16][input];
                let (t, hv) = upload_tensor_as(&gpu, ty, &v, (rows, k, batch)).unwrap();
                for major in [ScaleMajor::K, ScaleMajor::Mn] {
                    let one_byte = !matches!(format.scale, blockscaled::ScaleType::F32);
                    let opts = QuantizeOptions {
                        major: Some(major),
                        tensor_scale: None,
                        swizzled_scales: one_byte,
                    };
                    let what = format!("{name} {rows}×{k}×{batch} input {input} {major:?}");
                    let want =
                        match ScaledMatrix::quantize_with_major(&hv, rows, k, batch, format, major)
                        {
                            Ok(w) => w,
                            Err(e) => panic!("{what}: host quantizer: {e}"),
                        };
                    let got = gpu
                        .quantize_with(&t, format, &opts)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    let host = got
                        .matrix
                        .to_host()
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_eq!(
                        host.tensor_scale().to_bits(),
                        want.tensor_scale().to_bits(),
                        "{what}: tensor scale"
                    );
                    assert!(host.data() == want.data(), "{what}: codes differ");
                    assert!(host.scales() == want.scales(), "{what}: scales differ");
                    if let Some(s) = got.swizzled_scales {
                        let s = gpu.stream().clone_dtoh(&s).unwrap();
                        assert!(
                            s == want.scales_swizzled_128x4().unwrap(),
                            "{what}: swizzled scales differ"
                        );
                    }
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_device_quantized_deepseek_a_runs_the_fp8_gemm_as_the_host_quantized_one() {
    let gpu = Gpu::new(0).expect("a GPU");
    let (m, n, k) = (300, 512, 1024);
    let av = random_values(77, m * k, k);
    let b = ScaledMatrix::quantize(
        &random_values(78, n * k, k),
        n,
        k,
        1,
        Recipe::DeepSeekFp8.b(),
    )
    .unwrap();
    let a_host = ScaledMatrix::quantize(&av, m, k, 1, Recipe::DeepSeekFp8.a()).unwrap();
    let t = gpu.upload_tensor(&av, m, k, 1).unwrap();
    let a_dev = gpu.quantize(&t, Recipe::DeepSeekFp8.a()).unwrap();
    let db = gpu.upload(&b).unwrap();
    let mut c1 = gpu.output(m, n, 1, OutType::Bf16).unwrap();
    let mut c2 = gpu.output(m, n, 1, OutType::Bf16).unwrap();
    gpu.gemm(&a_dev, &db, &mut c1).unwrap();
    gpu.gemm(&gpu.upload(&a_host).unwrap(), &db, &mut c2)
        .unwrap();
    let (c1, c2) = (c1.to_host().unwrap(), c2.to_host().unwrap());
    assert!(c1.values.iter().all(|v| v.is_finite()));
    assert!(
        c1.values
            .iter()
            .zip(&c2.values)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "results differ"
    );
}

/// NaN and ±Inf in the input: the block (row, tensor) that holds one gets the NaN scale (e8m0
/// 0xFF, ue4m3 0x7F, fp32 NaN), every other block is what the host quantizer writes for the
/// finite values, and the call returns (no hang). A computed NVFP4 tensor scale is NaN.
#[test]
#[ignore = "needs a CUDA device"]
fn non_finite_input_gives_nan_scales_and_leaves_other_blocks_exact() {
    use blockscaled::{ScaleBlock, ScaleType};
    let gpu = Gpu::new(0).expect("a GPU");
    let (rows, k, batch) = (67, 512, 2);
    let mut v = random_values(4242, rows * k * batch, k);
    let poison = [
        (3usize, 5usize, f32::NAN),
        (40, 300, f32::INFINITY),
        (67 + 10, 129, f32::NEG_INFINITY),
    ];
    let mut clean = v.clone();
    for &(r, c, x) in &poison {
        v[r * k + c] = x;
        clean[r * k + c] = 0.0;
    }
    let t = gpu.upload_tensor(&v, rows, k, batch).unwrap();
    for (name, format) in formats() {
        let nan_bits: &[u8] = match format.scale {
            ScaleType::E8M0 => &[0xFF],
            ScaleType::UE4M3 => &[0x7F],
            ScaleType::F32 => &[],
        };
        let got = gpu
            .quantize_with(
                &t,
                format,
                &QuantizeOptions {
                    major: Some(ScaleMajor::K),
                    ..Default::default()
                },
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = ScaledMatrix::quantize_with_major(&clean, rows, k, batch, format, ScaleMajor::K)
            .unwrap_or_else(|e| panic!("{name}: host: {e}"));
        if format.scale == ScaleType::UE4M3 {
            // A NaN anywhere makes the computed tensor scale NaN, and with it every block scale
            // (a host matrix cannot hold a NaN tensor scale: read the device's bytes).
            let ts = got.matrix.desc().tensor_scale;
            assert!(ts.is_nan(), "{name}: tensor scale {ts}");
            let s = gpu
                .stream()
                .clone_dtoh(&got.matrix.scales().unwrap())
                .unwrap();
            assert!(s.iter().all(|&b| b == 0x7F), "{name}: a scale is not NaN");
            continue;
        }
        let host = got.matrix.to_host().unwrap();
        let d = host.desc();
        let (rb, kb) = (d.scale_layout.row_blocks, d.scale_layout.k_blocks);
        let bk = k / kb;
        // Which scale slots a poisoned element falls in.
        let poisoned = |l: usize, r: usize, b: usize| {
            poison.iter().any(|&(pr, pc, _)| {
                let (pl, prr) = (pr / rows, pr % rows);
                match format.block {
                    ScaleBlock::PerTensor => pl == l,
                    ScaleBlock::PerRow => pl == l && prr == r,
                    _ => pl == l && prr == r && pc / bk == b,
                }
            })
        };
        let ssize = if format.scale == ScaleType::F32 { 4 } else { 1 };
        let lay = d.scale_layout;
        for l in 0..batch {
            for r in 0..rb {
                for b in 0..kb {
                    let at = (l * lay.batch_stride + r * lay.row_stride + b * lay.k_stride) * ssize;
                    let (g, w) = (
                        &host.scales()[at..at + ssize],
                        &want.scales()[at..at + ssize],
                    );
                    if poisoned(l, r, b) {
                        if ssize == 4 {
                            let x = f32::from_le_bytes(g.try_into().unwrap());
                            assert!(x.is_nan(), "{name}: scale ({l},{r},{b}) = {x}, want NaN");
                        } else {
                            assert_eq!(g, nan_bits, "{name}: scale ({l},{r},{b}), want NaN");
                        }
                    } else {
                        assert_eq!(g, w, "{name}: scale ({l},{r},{b}) of a finite block");
                        // The block's codes too.
                        let bits = format.elem.bits() as usize;
                        let (r0, r1) = match format.block {
                            ScaleBlock::PerTensor => (0, rows),
                            _ => (r, r + 1),
                        };
                        let (c0, c1) = match format.block {
                            ScaleBlock::Tile { .. } => (b * bk, (b + 1) * bk),
                            _ => (0, k),
                        };
                        for rr in r0..r1 {
                            let e0 = ((l * rows + rr) * k + c0) * bits / 8;
                            let e1 = ((l * rows + rr) * k + c1) * bits / 8;
                            assert!(
                                host.data()[e0..e1] == want.data()[e0..e1],
                                "{name}: codes of the finite block ({l},{rr},{b})"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// The FP8 codes (written by the hardware conversion) and the e2m1 codes (by one rounding
/// addition) at every rounding boundary, against the host's software encoders: each block's
/// largest magnitude is the format's largest value, so the scale is 1 (DeepSeek's amax / 448 and
/// MX's e8m0 2^0) and the quotients are the values themselves: every code's value, the
/// midpoints between neighbours (ties to even) and the f32 values either side of them, in the
/// subnormal range and below it, both signs, ±0. NVFP4's divisor is its largest block scale
/// (448) times the tensor scale `6 / (448 · 6)` rounded, within an ulp or two of one: its
/// quotients sit as near the same values, beside each boundary rather than on it.
#[test]
#[ignore = "needs a CUDA device"]
fn codes_match_the_host_at_every_rounding_boundary() {
    let gpu = Gpu::new(0).expect("a GPU");
    // (format, mantissa bits, exponent bias, largest code, largest value)
    let cases = [
        (
            "deepseek-a e4m3",
            Recipe::DeepSeekFp8.a(),
            3u32,
            7,
            0x7E,
            448.0f32,
        ),
        (
            "mxfp8 e4m3",
            Recipe::Mxfp8(Fp8::E4M3).a(),
            3,
            7,
            0x7E,
            448.0,
        ),
        (
            "mxfp8 e5m2",
            Recipe::Mxfp8(Fp8::E5M2).a(),
            2,
            15,
            0x7B,
            57344.0,
        ),
        (
            "fp8-row e5m2",
            Recipe::Fp8PerRow(Fp8::E5M2).a(),
            2,
            15,
            0x7B,
            57344.0,
        ),
        ("mxfp4", Recipe::Mxfp4.a(), 1, 1, 0x7, 6.0),
        ("e2m1 e8m0 / 16", Recipe::E2m1E8m0x16.a(), 1, 1, 0x7, 6.0),
        ("nvfp4", Recipe::Nvfp4.a(), 1, 1, 0x7, 6.0),
    ];
    for (name, format, mbits, bias, max_code, max) in cases {
        let value = |c: u32| -> f32 {
            let (e, f) = (c >> mbits, c & ((1 << mbits) - 1));
            if e == 0 {
                f as f32 * 2f32.powi(1 - bias - mbits as i32)
            } else {
                (1.0 + f as f32 / (1 << mbits) as f32) * 2f32.powi(e as i32 - bias)
            }
        };
        let mut probes = vec![0.0f32, 1e-30, f32::from_bits(1)];
        for c in 0..max_code {
            let (a, b) = (value(c), value(c + 1));
            let mid = (a + b) / 2.0; // exact: one more bit than the format's
            probes.extend([
                a,
                mid,
                f32::from_bits(mid.to_bits() - 1),
                f32::from_bits(mid.to_bits() + 1),
            ]);
        }
        probes.push(max);
        let mut v: Vec<f32> = probes.iter().flat_map(|&x| [x, -x]).collect();
        // Rows of 128 with the largest value first in every 16 elements (every format's block
        // is 16, 32, 128 or the row), the probes in the other 15 of each 16.
        let k = 128;
        let mut rows = Vec::new();
        while !v.is_empty() {
            let mut row = Vec::with_capacity(k);
            for _ in 0..k / 16 {
                row.push(max);
                for _ in 0..15 {
                    row.push(v.pop().unwrap_or(-0.0));
                }
            }
            rows.extend(row);
        }
        let m = rows.len() / k;
        let t = gpu.upload_tensor(&rows, m, k, 1).unwrap();
        let want = ScaledMatrix::quantize(&rows, m, k, 1, format).unwrap();
        let got = gpu.quantize(&t, format).unwrap().to_host().unwrap();
        assert!(got.scales() == want.scales(), "{name}: scales differ");
        // A byte per element, or two e2m1 codes (elements 2i, 2i + 1).
        let per = rows.len() / want.data().len();
        assert_eq!(got.data().len(), want.data().len(), "{name}: code bytes");
        let bad: Vec<_> = (0..want.data().len())
            .filter(|&i| got.data()[i] != want.data()[i])
            .map(|i| (&rows[per * i..per * (i + 1)], got.data()[i], want.data()[i]))
            .take(8)
            .collect();
        assert!(
            bad.is_empty(),
            "{name}: (values, device, host) code bytes differ: {bad:?}"
        );
    }
}

/// `quantize_into` rewrites a matrix in place with another tensor's codes and scales, equal to a
/// new quantization of that tensor; a destination of another shape or format is a typed error.
#[test]
#[ignore = "needs a CUDA device"]
fn quantize_into_rewrites_a_matrix_as_a_new_quantization() {
    let gpu = Gpu::new(0).expect("a GPU");
    let (rows, k, batch) = (300, 1024, 2);
    for (name, format) in formats() {
        let opts = QuantizeOptions::default();
        let t1 = gpu
            .upload_tensor(&random_values(5, rows * k * batch, k), rows, k, batch)
            .unwrap();
        let v2 = random_values(6, rows * k * batch, k);
        let t2 = gpu.upload_tensor(&v2, rows, k, batch).unwrap();
        let mut m = gpu.quantize_with(&t1, format, &opts).unwrap().matrix;
        gpu.quantize_into(&t2, &mut m, &opts)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = ScaledMatrix::quantize(&v2, rows, k, batch, format).unwrap();
        let got = m.to_host().unwrap();
        assert_eq!(
            got.tensor_scale().to_bits(),
            want.tensor_scale().to_bits(),
            "{name}"
        );
        assert!(got.data() == want.data(), "{name}: codes differ");
        assert!(got.scales() == want.scales(), "{name}: scales differ");
        let short = gpu
            .upload_tensor(&random_values(7, (rows - 1) * k, k), rows - 1, k, 1)
            .unwrap();
        assert!(
            matches!(
                gpu.quantize_into(&short, &mut m, &opts),
                Err(blockscaled::Error::Shape(_))
            ),
            "{name}: another shape"
        );
    }
    // A GEMM on the rewritten DeepSeek A equals one on a new quantization of the same values.
    let (m, n) = (rows, 256);
    let b = gpu
        .upload(
            &ScaledMatrix::quantize(
                &random_values(8, n * k, k),
                n,
                k,
                1,
                Recipe::DeepSeekFp8.b(),
            )
            .unwrap(),
        )
        .unwrap();
    let v = random_values(9, m * k, k);
    let t = gpu.upload_tensor(&v, m, k, 1).unwrap();
    let mut a = gpu
        .quantize(
            &gpu.upload_tensor(&random_values(10, m * k, k), m, k, 1)
                .unwrap(),
            Recipe::DeepSeekFp8.a(),
        )
        .unwrap();
    gpu.quantize_into(&t, &mut a, &QuantizeOptions::default())
        .unwrap();
    let fresh = gpu.quantize(&t, Recipe::DeepSeekFp8.a()).unwrap();
    let mut c1 = gpu.output(m, n, 1, OutType::Bf16).unwrap();
    let mut c2 = gpu.output(m, n, 1, OutType::Bf16).unwrap();
    gpu.gemm(&a, &b, &mut c1).unwrap();
    gpu.gemm(&fresh, &b, &mut c2).unwrap();
    let (c1, c2) = (c1.to_host().unwrap().values, c2.to_host().unwrap().values);
    assert!(c1.iter().all(|v| v.is_finite()));
    assert!(
        c1.iter().zip(&c2).all(|(x, y)| x.to_bits() == y.to_bits()),
        "the GEMMs differ"
    );
}

/// A GEMM on device-quantized operands — prepared for the kernels on the device, from the
/// quantizer's buffers — gives bit for bit what the same codes and scales copied to the host and
/// uploaded (prepared on the host) give: every recipe whose A the device quantizers write (B
/// too where they write it: not DeepSeek's 128 × 128 weights), at M = 300 and at decode size
/// M = 8, on the plan `gemm` chooses (the fold onto the FP8 kernel, the 4-bit-weights kernel,
/// the FP8 kernel), the MX kernel forced, and each operand folded once (`fold_to_fp8`); both as
/// new matrices and rewritten in place (`quantize_into` over a quantization of other values:
/// the copies made again in their buffers).
#[test]
#[ignore = "needs a CUDA device"]
fn device_prepared_operands_run_every_gemm_as_uploaded_ones() {
    use blockscaled::{DeviceMatrix, Plan};
    let gpu = Gpu::new(0).expect("a GPU");
    let (n, k) = (256, 512);
    let run = |a: &DeviceMatrix, b: &DeviceMatrix, plan: Plan| {
        let mut c = gpu.output(a.desc().rows, n, 1, OutType::F32).unwrap();
        gpu.gemm_with(a, b, &mut c, plan)
            .map(|()| c.to_host().unwrap().values)
    };
    let same = |what: &str, x: Vec<f32>, y: Vec<f32>| {
        assert!(x.iter().all(|v| v.is_finite()), "{what}: non-finite output");
        let bad = x
            .iter()
            .zip(&y)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(bad, 0, "{what}: {bad} of {} outputs differ", x.len());
    };
    let mut seed = 500u64;
    for recipe in Recipe::ALL {
        if matches!(recipe, Recipe::W4A16(_)) {
            continue; // bf16 activations: no quantizer writes them
        }
        for (m, rewrite) in [(300usize, false), (8, false), (300, true), (8, true)] {
            seed += 4;
            let what = format!("{recipe:?} M = {m} rewritten {rewrite}");
            let tensor = |s: u64, rows: usize| {
                gpu.upload_tensor(&random_values(s, rows * k, k), rows, k, 1)
                    .unwrap()
            };
            // A device quantization of the values of seed `s`: made so, or written into one of
            // other values.
            let quantized = |s: u64, rows: usize, format| {
                let mut q = gpu.quantize(&tensor(s + rewrite as u64 * 2, rows), format)?;
                if rewrite {
                    gpu.quantize_into(&tensor(s, rows), &mut q, &QuantizeOptions::default())?;
                }
                Ok::<_, blockscaled::Error>(q)
            };
            let a_dev = quantized(seed, m, recipe.a()).unwrap_or_else(|e| panic!("{what}: {e}"));
            let b_dev = match quantized(seed + 1, n, recipe.b()) {
                Ok(b) => b,
                Err(_) => gpu
                    .upload(
                        &ScaledMatrix::quantize(
                            &random_values(seed + 1, n * k, k),
                            n,
                            k,
                            1,
                            recipe.b(),
                        )
                        .unwrap(),
                    )
                    .unwrap(),
            };
            let a_up = gpu.upload(&a_dev.to_host().unwrap()).unwrap();
            let b_up = gpu.upload(&b_dev.to_host().unwrap()).unwrap();
            let plan = gpu.plan(&a_dev, &b_dev).unwrap();
            assert_eq!(plan, gpu.plan(&a_up, &b_up).unwrap(), "{what}");
            let mut plans = vec![plan];
            if matches!(plan, Plan::Sm90W4(_) | Plan::Sm90MxFp8(_)) {
                plans.push(Plan::Sm90Mx(blockscaled::plan::sm90_mx_default(
                    m,
                    n,
                    k,
                    1,
                    gpu.sm_count(),
                )));
            }
            for p in plans {
                let (x, y) = (run(&a_dev, &b_dev, p), run(&a_up, &b_up, p));
                match (x, y) {
                    (Ok(x), Ok(y)) => same(&format!("{what} {p:?}"), x, y),
                    (Err(e), Err(f)) => assert_eq!(e.to_string(), f.to_string(), "{what} {p:?}"),
                    (x, y) => panic!("{what} {p:?}: {:?} against {:?}", x.err(), y.err()),
                }
            }
            let folds = (
                gpu.fold_to_fp8(&a_dev, false),
                gpu.fold_to_fp8(&b_dev, true),
            );
            if let (Ok(fa), Ok(fb)) = folds {
                let ua = gpu.fold_to_fp8(&a_up, false).unwrap();
                let ub = gpu.fold_to_fp8(&b_up, true).unwrap();
                let p = gpu.plan(&fa, &fb).unwrap();
                same(
                    &format!("{what} folded, {p:?}"),
                    run(&fa, &fb, p).unwrap(),
                    run(&ua, &ub, p).unwrap(),
                );
            }
        }
    }
}

/// The copies only weights need (the FP8 kernel's B-role scales, each row's largest scale code
/// for the fold, the 4-bit weights' reordered codes) are made when a GEMM first takes the matrix
/// as weights and made again after
/// the matrix is rewritten in place: weights used (their copies made), rewritten with other
/// values by `quantize_into`, used again, give bit for bit what an upload of the new codes and
/// scales gives — on the plan `gemm` chooses (the FP8 kernel for FP8 per row and per tensor, the
/// fold onto the FP8 kernel at M = 300, the 4-bit-weights kernel at M = 8) and folded once as B
/// (`fold_to_fp8`).
#[test]
#[ignore = "needs a CUDA device"]
fn weight_copies_are_made_again_after_a_rewrite() {
    use blockscaled::DeviceMatrix;
    let gpu = Gpu::new(0).expect("a GPU");
    let (n, k) = (256, 512);
    let run = |a: &DeviceMatrix, b: &DeviceMatrix| {
        let mut c = gpu.output(a.desc().rows, n, 1, OutType::F32).unwrap();
        gpu.gemm(a, b, &mut c).map(|()| c.to_host().unwrap().values)
    };
    let tensor = |s: u64, rows: usize| {
        gpu.upload_tensor(&random_values(s, rows * k, k), rows, k, 1)
            .unwrap()
    };
    let mut seed = 900u64;
    let mut plans = Vec::new();
    for recipe in [
        Recipe::Fp8PerRow(Fp8::E4M3),
        Recipe::Fp8PerTensor(Fp8::E4M3),
        Recipe::Mxfp8(Fp8::E4M3),
        Recipe::Mxfp4,
        Recipe::E2m1E8m0x16,
        Recipe::Nvfp4,
    ] {
        for m in [300usize, 8] {
            seed += 3;
            let what = format!("{recipe:?} M = {m}");
            let a = gpu.quantize(&tensor(seed, m), recipe.a()).unwrap();
            let mut b = gpu.quantize(&tensor(seed + 1, n), recipe.b()).unwrap();
            plans.push(gpu.plan(&a, &b).unwrap());
            let before = run(&a, &b).unwrap_or_else(|e| panic!("{what}: {e}"));
            let folded_before = gpu.fold_to_fp8(&b, true).ok();
            gpu.quantize_into(&tensor(seed + 2, n), &mut b, &QuantizeOptions::default())
                .unwrap();
            let after = run(&a, &b).unwrap();
            let b_up = gpu.upload(&b.to_host().unwrap()).unwrap();
            let want = run(&a, &b_up).unwrap();
            let differ = |x: &[f32], y: &[f32]| {
                x.iter()
                    .zip(y)
                    .filter(|(p, q)| p.to_bits() != q.to_bits())
                    .count()
            };
            assert!(
                after.iter().all(|v| v.is_finite()),
                "{what}: non-finite output"
            );
            assert_eq!(
                differ(&after, &want),
                0,
                "{what}: the rewritten weights' GEMM"
            );
            // The rewrite changed the result (the check above could not pass on stale copies).
            assert!(
                differ(&before, &after) > n,
                "{what}: the rewrite changed nothing"
            );
            if let Some(fb) = folded_before {
                let fa = gpu.fold_to_fp8(&b, true).unwrap();
                let fu = gpu.fold_to_fp8(&b_up, true).unwrap();
                assert_eq!(
                    fa.to_host().unwrap().scales(),
                    fu.to_host().unwrap().scales(),
                    "{what}: folded scales"
                );
                assert_eq!(
                    fa.to_host().unwrap().data(),
                    fu.to_host().unwrap().data(),
                    "{what}: folded codes"
                );
                assert_ne!(
                    fb.to_host().unwrap().data(),
                    fa.to_host().unwrap().data(),
                    "{what}: the fold changed nothing"
                );
            }
        }
    }
    // Every lazily made copy was used.
    assert!(
        plans
            .iter()
            .any(|p| matches!(p, blockscaled::Plan::Sm90Fp8(_))),
        "{plans:?}"
    );
    assert!(
        plans
            .iter()
            .any(|p| matches!(p, blockscaled::Plan::Sm90W4(_))),
        "{plans:?}"
    );
    assert!(
        plans
            .iter()
            .any(|p| matches!(p, blockscaled::Plan::Sm90MxFp8(_))),
        "{plans:?}"
    );
}
