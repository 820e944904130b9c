//! blockscaled-candle on a GPU: every layer kind against candle's own bf16 matmul of the
//! dequantized operands (the weights' codes and scales as given, the activations quantized on
//! the host with the recipe's activation format, which the device quantizer matches bit for
//! bit). Fresh random inputs per check, every element compared, NaN never passes.
//!
//! Tolerance, per element: the reference rounds each dequantized operand to bf16 (2⁻⁹ relative
//! each, so 2⁻⁸·S with S = Σ|a||w|), both accumulate in fp32 (the FP8 tensor cores' partial sums
//! to about 2⁻¹³ relative: within 2⁻¹²·S), and each rounds its output to bf16 (2⁻⁹ of its
//! magnitude each: 2⁻⁸·|ref| and the slack 2⁻¹⁶·S). An activation (SiLU, slope below 1.1)
//! scales that by 1.1.

use blockscaled::{ElemType, OperandFormat, ScaleLayout, ScaleMajor, ScaleType, ScaledMatrix};
use blockscaled_candle::{Activation, BlockScaledLinear, Fp4Weights, Fp8, GroupLayout, Recipe};
use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type R = candle_core::Result<()>;

fn gpu() -> Device {
    Device::new_cuda(0).expect("a CUDA device")
}

/// Every test of this binary holds it: one counts the process's device allocations, which a test
/// running beside it would change.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Random values with a magnitude per row between 2⁻⁴ and 2⁴, a few zeros and outliers.
fn values(seed: u64, rows: usize, k: usize) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(rows * k);
    for _ in 0..rows {
        let mag = 2f32.powi(rng.random_range(-4..=4));
        for _ in 0..k {
            let v: f32 = rng.random_range(-1.0..1.0) * mag;
            out.push(match rng.random_range(0..64) {
                0 => 0.0,
                1 => v * 16.0,
                _ => v,
            });
        }
    }
    out
}

/// The host-quantized weights of `recipe` (`batch × n × k`) as candle tensors (codes, scales),
/// scales K-major, e8m0 scales as U8 (candle cannot place F8E8M0 on a CUDA device).
fn weights(m: &ScaledMatrix, dev: &Device) -> candle_core::Result<(Tensor, Tensor)> {
    let d = m.desc();
    assert_eq!(
        d.scale_layout,
        ScaleLayout::packed(
            ScaleMajor::K,
            d.scale_layout.row_blocks,
            d.scale_layout.k_blocks
        )
    );
    let cols = if d.format.elem == ElemType::E2M1 {
        d.k / 2
    } else {
        d.k
    };
    let code_dt = if d.format.elem == ElemType::E4M3 {
        DType::F8E4M3
    } else {
        DType::U8
    };
    let scale_dt = match d.format.scale {
        ScaleType::F32 => DType::F32,
        ScaleType::UE4M3 => DType::F8E4M3,
        _ => DType::U8,
    };
    let batch = |v: Vec<usize>| {
        if d.batch > 1 {
            [vec![d.batch], v].concat()
        } else {
            v
        }
    };
    let (rb, kb) = (d.scale_layout.row_blocks, d.scale_layout.k_blocks);
    Ok((
        Tensor::from_raw_buffer(m.data(), code_dt, &batch(vec![d.rows, cols]), dev)?,
        Tensor::from_raw_buffer(m.scales(), scale_dt, &batch(vec![rb, kb]), dev)?,
    ))
}

fn quantized(v: &[f32], rows: usize, k: usize, batch: usize, f: OperandFormat) -> ScaledMatrix {
    ScaledMatrix::quantize(v, rows, k, batch, f).expect("quantizable")
}

/// `m`'s values as an f32 tensor of `rows·batch × k`.
fn dequantized(m: &ScaledMatrix, dev: &Device) -> candle_core::Result<Tensor> {
    let v: Vec<f32> = m.dequantize().iter().map(|&x| x as f32).collect();
    Tensor::from_vec(v, (m.batch() * m.rows(), m.k()), dev)
}

/// Fills the memory candle's pool will hand out next with NaN (so an output element the GEMM
/// leaves unwritten cannot pass for a value an earlier tensor left there).
fn poison(dev: &Device, elems: usize) -> R {
    drop(Tensor::full(f32::NAN, elems, dev)?.to_dtype(DType::BF16)?);
    drop(Tensor::full(f32::NAN, elems, dev)?);
    Ok(())
}

/// Every element of `got` within the module doc's tolerance of `a · wᵀ` (`a`, `w`: f32 tensors
/// of the dequantized operands), after `bias` and `act` where given.
fn check(what: &str, got: &Tensor, a: &Tensor, w: &Tensor, bias: Option<&Tensor>, silu: bool) -> R {
    let bf = |t: &Tensor| t.to_dtype(DType::BF16);
    let mut reference = bf(a)?.matmul(&bf(w)?.t()?)?.to_dtype(DType::F32)?;
    let s = a.abs()?.matmul(&w.abs()?.t()?)?;
    if let Some(b) = bias {
        reference = reference.broadcast_add(&b.to_dtype(DType::F32)?)?;
    }
    let slope = if silu {
        reference = reference.silu()?;
        1.1
    } else {
        1.0
    };
    let got = got.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    let want = reference.flatten_all()?.to_vec1::<f32>()?;
    let s = s.flatten_all()?.to_vec1::<f32>()?;
    assert_eq!(got.len(), want.len(), "{what}: element count");
    let mut worst = 0f32;
    for (i, ((&g, &r), &s)) in got.iter().zip(&want).zip(&s).enumerate() {
        let tol = slope
            * ((2f32.powi(-8) + 2f32.powi(-12) + 2f32.powi(-16)) * s + 2f32.powi(-8) * r.abs());
        let err = (g - r).abs();
        assert!(
            err <= tol,
            "{what}: element {i}: {g} against {r} (tolerance {tol})"
        );
        worst = worst.max(err / tol.max(f32::MIN_POSITIVE));
    }
    println!(
        "{what}: {} elements, worst error {worst:.3} of the tolerance",
        got.len()
    );
    Ok(())
}

/// A layer of `recipe` over random `n × k` weights, checked at each M in `ms` (bf16 in, bf16
/// out), twice per M (the second call quantizes into the kept activation matrix).
fn dense(recipe: Recipe, (n, k): (usize, usize), ms: &[usize], seed: u64) -> R {
    let dev = gpu();
    let w = quantized(&values(seed, n, k), n, k, 1, recipe.b());
    let (codes, scales) = weights(&w, &dev)?;
    let layer = BlockScaledLinear::with_tensor_scale(recipe, &codes, &scales, w.tensor_scale())?;
    let wd = dequantized(&w, &dev)?;
    for (i, &m) in ms.iter().enumerate() {
        for round in 0..2u64 {
            let xs = values(seed + 100 + 10 * i as u64 + round, m, k);
            let xb: Vec<half::bf16> = xs.iter().map(|&v| half::bf16::from_f32(v)).collect();
            let x = Tensor::from_vec(xb.clone(), (m, k), &dev)?;
            let xf: Vec<f32> = xb.iter().map(|v| v.to_f32()).collect();
            let a = if recipe.a().elem == ElemType::BF16 {
                Tensor::from_vec(xf, (m, k), &dev)?
            } else {
                dequantized(&quantized(&xf, m, k, 1, recipe.a()), &dev)?
            };
            poison(&dev, m * n)?;
            let y = layer.forward(&x)?;
            assert_eq!(y.dims(), &[m, n]);
            assert_eq!(y.dtype(), DType::BF16);
            check(
                &format!("{recipe} {m}×{n}×{k} (call {round})"),
                &y,
                &a,
                &wd,
                None,
                false,
            )?;
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA device"]
fn deepseek_fp8_linear_matches_candle_bf16_matmul() -> R {
    let _serial = serial();
    dense(Recipe::DeepSeekFp8, (384, 512), &[1, 16, 200], 1)?;
    // Ragged N and K blocks (the last 128 × 128 weight block partial).
    dense(Recipe::DeepSeekFp8, (320, 384), &[33], 2)
}

#[test]
#[ignore = "needs a CUDA device"]
fn mx_and_nvfp4_linears_match_candle_bf16_matmul() -> R {
    let _serial = serial();
    dense(Recipe::Mxfp8(Fp8::E4M3), (256, 512), &[7, 128], 3)?;
    dense(Recipe::Mxfp4, (256, 512), &[64], 4)?;
    // NVFP4 with the activations' tensor scale computed on the device.
    dense(Recipe::Nvfp4, (256, 512), &[40], 5)
}

#[test]
#[ignore = "needs a CUDA device"]
fn four_bit_weights_with_bf16_and_fp8_activations_match_candle() -> R {
    let _serial = serial();
    dense(Recipe::W4A16(Fp4Weights::Mxfp4), (256, 512), &[16, 100], 6)?;
    dense(Recipe::W4A16(Fp4Weights::Nvfp4), (256, 512), &[8], 7)?;
    dense(Recipe::W4A8(Fp4Weights::Mxfp4), (256, 512), &[16], 8)?;
    dense(Recipe::W4A8(Fp4Weights::Nvfp4), (256, 512), &[3], 9)
}

#[test]
#[ignore = "needs a CUDA device"]
fn fused_bias_and_silu_with_f32_output_match_candle() -> R {
    let _serial = serial();
    let dev = gpu();
    let (m, n, k) = (48, 256, 512);
    let recipe = Recipe::DeepSeekFp8;
    let w = quantized(&values(11, n, k), n, k, 1, recipe.b());
    let (codes, scales) = weights(&w, &dev)?;
    let bias = Tensor::from_vec(values(12, 1, n), n, &dev)?.to_dtype(DType::BF16)?;
    let layer = BlockScaledLinear::new(recipe, &codes, &scales)?
        .with_bias(&bias)?
        .with_activation(Activation::Silu)
        .with_output(DType::F32)?;
    let x = Tensor::from_vec(values(13, m, k), (2, m / 2, k), &dev)?;
    let xs = x.flatten_all()?.to_vec1::<f32>()?;
    let a = dequantized(&quantized(&xs, m, k, 1, recipe.a()), &dev)?;
    poison(&dev, m * n)?;
    let y = x.apply(&layer)?; // (as a candle Module)
    assert_eq!((y.dims(), y.dtype()), (&[2, m / 2, n][..], DType::F32));
    check(
        "fused bias + SiLU, f32 out",
        &y,
        &a,
        &dequantized(&w, &dev)?,
        Some(&bias),
        true,
    )
}

/// The reference of a grouped layer: each group's rows (`rows[g]` of `a`, f32 dequantized)
/// times its expert; rows outside every group zero.
#[test]
#[ignore = "needs a CUDA device"]
fn grouped_moe_with_device_counts_matches_candle_per_expert() -> R {
    let _serial = serial();
    let dev = gpu();
    let (e, n, k) = (3, 256, 384);
    let recipe = Recipe::DeepSeekFp8;
    let w = quantized(&values(21, e * n, k), n, k, e, recipe.b());
    let (codes, scales) = weights(&w, &dev)?;
    let layer = BlockScaledLinear::new(recipe, &codes, &scales)?;
    assert_eq!(layer.dims(), (n, k, e));
    let wd = dequantized(&w, &dev)?.reshape((e, n, k))?;
    // Contiguous: ends on the device (a router's cumulative counts), an empty group, and rows
    // past the last end.
    let r = 50;
    let ends = Tensor::from_vec(vec![5i32, 5, 42], e, &dev)?;
    let xs = values(22, r, k);
    let x = Tensor::from_vec(xs.clone(), (r, k), &dev)?;
    let a = dequantized(&quantized(&xs, r, k, 1, recipe.a()), &dev)?;
    poison(&dev, r * n)?;
    let y = layer.forward_grouped(&x, &ends, GroupLayout::Contiguous)?;
    assert_eq!(y.dims(), &[r, n]);
    let mut start = 0;
    for (g, end) in [5usize, 5, 42].into_iter().enumerate() {
        if end > start {
            let got = y.narrow(0, start, end - start)?;
            let ag = a.narrow(0, start, end - start)?;
            check(
                &format!("contiguous group {g}"),
                &got,
                &ag,
                &wd.get(g)?,
                None,
                false,
            )?;
        }
        start = end;
    }
    let rest = y
        .narrow(0, 42, r - 42)?
        .to_dtype(DType::F32)?
        .abs()?
        .max_all()?
        .to_scalar::<f32>()?;
    assert_eq!(rest, 0.0, "rows past the last end are zero");
    // Masked: (E, capacity, K), a count per expert.
    let cap = 40;
    let counts = Tensor::from_vec(vec![3i32, 40, 0], e, &dev)?;
    let xs = values(23, e * cap, k);
    let x = Tensor::from_vec(xs.clone(), (e, cap, k), &dev)?;
    let a = dequantized(&quantized(&xs, cap, k, e, recipe.a()), &dev)?.reshape((e, cap, k))?;
    poison(&dev, e * cap * n)?;
    let y = layer.forward_grouped(&x, &counts, GroupLayout::Masked)?;
    assert_eq!(y.dims(), &[e, cap, n]);
    for (g, count) in [3usize, 40, 0].into_iter().enumerate() {
        let yg = y.get(g)?;
        if count > 0 {
            let got = yg.narrow(0, 0, count)?;
            check(
                &format!("masked expert {g}"),
                &got,
                &a.get(g)?.narrow(0, 0, count)?,
                &wd.get(g)?,
                None,
                false,
            )?;
        }
        if count < cap {
            let rest = yg
                .narrow(0, count, cap - count)?
                .to_dtype(DType::F32)?
                .abs()?
                .max_all()?;
            assert_eq!(
                rest.to_scalar::<f32>()?,
                0.0,
                "expert {g}'s rows past its count are zero"
            );
        }
    }
    Ok(())
}

/// The device address of a contiguous bf16 CUDA tensor.
fn address(t: &Tensor) -> u64 {
    use candle_core::cuda_backend::CudaStorageSlice;
    use candle_core::cuda_backend::cudarc::driver::DevicePtr;
    let (s, l) = t.storage_and_layout();
    let candle_core::Storage::Cuda(s) = &*s else {
        panic!("not on the GPU")
    };
    let CudaStorageSlice::BF16(v) = &s.slice else {
        panic!("not bf16")
    };
    let (p, _sync) = v.device_ptr(v.stream());
    p + 2 * l.start_offset() as u64
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_steady_state_forward_allocates_only_maps_over_memory_it_has_not_seen() -> R {
    let _serial = serial();
    // A forward call writes a new candle tensor, whose address the GEMM's tensor maps encode
    // (with bf16 activations, the input's too). The layer keeps the views it made by address,
    // and candle's allocator hands a loop's same-sized tensors the same memory again: a forward
    // over memory seen before allocates nothing of blockscaled's; over new memory, exactly the
    // maps an output view (and a bf16 view) makes. The activations' quantized matrix is kept.
    let dev = gpu();
    let cuda = dev.as_cuda_device()?;
    let g = blockscaled_candle::gpu_of(cuda)?;
    let (m, n, k) = (16, 256, 512);
    let count = blockscaled::device_allocations;
    let wrap = candle_core::Error::wrap;
    let mut out = cuda.alloc_zeros::<half::bf16>(m * n)?;
    let before = count();
    drop(
        g.output_view(&mut out, blockscaled::OutType::Bf16, (m, n, 1))
            .map_err(wrap)?,
    );
    let out_maps = count() - before;
    let x16 = cuda.alloc_zeros::<half::bf16>(m * k)?;
    // (The first bf16 view of a GPU makes the unit scales every such view shares.)
    drop(g.half_view(&x16, ElemType::BF16, (m, k, 1)).map_err(wrap)?);
    let before = count();
    drop(g.half_view(&x16, ElemType::BF16, (m, k, 1)).map_err(wrap)?);
    let in_maps = count() - before;
    println!("an output view makes {out_maps} allocations, a bf16 view {in_maps}");
    for recipe in [
        Recipe::DeepSeekFp8,
        Recipe::W4A16(Fp4Weights::Mxfp4),
        Recipe::Mxfp4,
    ] {
        let w = quantized(&values(31, n, k), n, k, 1, recipe.b());
        let (codes, scales) = weights(&w, &dev)?;
        let layer = BlockScaledLinear::new(recipe, &codes, &scales)?;
        let x0 = Tensor::from_vec(values(32, m, k), (m, k), &dev)?.to_dtype(DType::BF16)?;
        let (mut outs, mut ins) = (
            std::collections::HashSet::new(),
            std::collections::HashSet::new(),
        );
        let y = layer.forward(&x0)?;
        outs.insert(address(&y));
        ins.insert(address(&x0));
        drop(y);
        let mut hits = 0;
        for i in 0..6 {
            // (A new candle tensor each step, as a model's activations are.)
            let x = (&x0 * (0.5 + i as f64))?;
            let before = count();
            let y = layer.forward(&x)?;
            let made = count() - before;
            let (new_out, new_in) = (outs.insert(address(&y)), ins.insert(address(&x)));
            let bf16_in = recipe.a().elem == ElemType::BF16;
            let want = new_out as u64 * out_maps + (bf16_in && new_in) as u64 * in_maps;
            assert_eq!(
                made, want,
                "{recipe} step {i}: new output {new_out}, new input {new_in}"
            );
            hits += (!new_out) as usize;
        }
        println!("{recipe}: the output's memory was seen before in {hits} of 6 steps");
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA device"]
fn bad_inputs_get_errors_not_panics() -> R {
    let _serial = serial();
    let dev = gpu();
    let (n, k) = (256, 512);
    let recipe = Recipe::DeepSeekFp8;
    let w = quantized(&values(41, n, k), n, k, 1, recipe.b());
    let (codes, scales) = weights(&w, &dev)?;
    let cpu = Device::Cpu;
    let bad = |r: candle_core::Result<BlockScaledLinear>, what: &str| match r {
        Err(e) => println!("{what}: {e}"),
        Ok(_) => panic!("{what}: accepted"),
    };
    bad(
        BlockScaledLinear::new(recipe, &codes.to_device(&cpu)?, &scales),
        "weights on the CPU",
    );
    bad(
        BlockScaledLinear::new(recipe, &codes, &scales.t()?),
        "scales (K, N)",
    );
    bad(
        BlockScaledLinear::new(recipe, &codes, &scales.to_dtype(DType::BF16)?),
        "bf16 scales",
    );
    bad(
        BlockScaledLinear::new(Recipe::Mxfp4, &codes, &scales),
        "FP8 codes as MXFP4",
    );
    let layer = BlockScaledLinear::new(recipe, &codes, &scales)?;
    let x = Tensor::zeros((4, k + 128), DType::BF16, &dev)?;
    assert!(layer.forward(&x).is_err(), "wrong K");
    assert!(
        layer
            .forward(&Tensor::zeros((4, k), DType::BF16, &cpu)?)
            .is_err(),
        "CPU input"
    );
    assert!(
        layer
            .forward(&Tensor::zeros((4, k), DType::U8, &dev)?)
            .is_err(),
        "U8 input"
    );
    let x = Tensor::zeros((4, k), DType::BF16, &dev)?;
    let two = Tensor::from_vec(vec![1i32, 4], 2, &dev)?;
    assert!(
        layer
            .forward_grouped(&x, &two, GroupLayout::Contiguous)
            .is_err(),
        "2 groups, 1 expert"
    );
    let f = Tensor::from_vec(vec![4f32], 1, &dev)?;
    assert!(
        layer
            .forward_grouped(&x, &f, GroupLayout::Contiguous)
            .is_err(),
        "f32 groups"
    );
    Ok(())
}

#[test]
#[ignore = "needs a CUDA device"]
fn forward_into_an_existing_tensor_writes_what_forward_returns() -> R {
    let _serial = serial();
    let dev = gpu();
    let (m, n, k) = (40, 256, 512);
    for recipe in [Recipe::DeepSeekFp8, Recipe::W4A16(Fp4Weights::Nvfp4)] {
        let w = quantized(&values(51, n, k), n, k, 1, recipe.b());
        let (codes, scales) = weights(&w, &dev)?;
        let layer =
            BlockScaledLinear::with_tensor_scale(recipe, &codes, &scales, w.tensor_scale())?;
        let out = Tensor::full(f32::NAN, (m, n), &dev)?.to_dtype(DType::BF16)?;
        for step in 0..3u64 {
            let x =
                Tensor::from_vec(values(52 + step, m, k), (m, k), &dev)?.to_dtype(DType::BF16)?;
            layer.forward_into(&x, &out)?;
            let want = layer
                .forward(&x)?
                .to_dtype(DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            let got = out.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    w.is_finite() && g.to_bits() == w.to_bits(),
                    "{recipe} step {step}: element {i}: {g} against {w}"
                );
            }
        }
        let x = Tensor::zeros((m, k), DType::BF16, &dev)?;
        let wrong_shape = Tensor::zeros((m, n + 1), DType::BF16, &dev)?;
        assert!(
            layer.forward_into(&x, &wrong_shape).is_err(),
            "{recipe}: an output of the wrong shape"
        );
        let wrong_type = Tensor::zeros((m, n), DType::F32, &dev)?;
        assert!(
            layer.forward_into(&x, &wrong_type).is_err(),
            "{recipe}: an output of the wrong dtype"
        );
        let on_cpu = Tensor::zeros((m, n), DType::BF16, &Device::Cpu)?;
        assert!(
            layer.forward_into(&x, &on_cpu).is_err(),
            "{recipe}: an output on the CPU"
        );
    }
    Ok(())
}
