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
    for (rows, k, batch) in [(200, 1024, 2), (16, 7168, 1), (37, 200, 1), (129, 256, 3)] {
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
            let s = gpu.stream().clone_dtoh(got.matrix.scales()).unwrap();
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
