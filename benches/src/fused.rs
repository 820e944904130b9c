//! Timing of the fused epilogue and of the device quantizers (CUDA events, warm-up, medians),
//! shared by the runner (`--epilogue`, `--out_quant`, `--quantize`) and `cargo bench`
//! (`BLOCKSCALED_BENCH=fused`): a GEMM with a fused epilogue beside the plain GEMM with bf16
//! output and, for a quantized output, beside the same epilogue to bf16 followed by the
//! standalone quantizer; each quantized output checked bit for bit against the quantizer of the
//! same epilogue's f32 output, each quantizer against the host's.

use blockscaled::{
    Activation, Call, DeviceTensor, Epilogue, Error, Fp8, Gpu, InputType, OperandFormat, OutType,
    Plan, QuantizeOptions, Recipe, ScaleType, ScaledMatrix,
};
use blockscaled_tests::{random_values, upload_tensor_as};

use crate::cases::L2_BYTES;
use crate::report::Entry;
use crate::timing::{rotation_count, time_on_stream};

fn err(e: Error) -> String {
    e.to_string()
}

/// A fused epilogue as the runner's `--epilogue` spells it: `alpha=X`, `beta` (β·C with β =
/// 0.5), `bias`, `residual`, and one activation (`relu`, `gelu`, `gelu-tanh`, `silu`, `swiglu`).
#[derive(Clone, Debug, PartialEq)]
pub struct EpilogueSpec {
    pub alpha: f32,
    pub beta: bool,
    pub bias: bool,
    pub residual: bool,
    pub activation: Activation,
}

impl EpilogueSpec {
    /// The spec as `--epilogue` spells it, every step named (`alpha=1,bias,silu`).
    pub fn name(&self) -> String {
        let mut spec = vec![format!("alpha={}", self.alpha)];
        spec.extend(self.beta.then(|| "beta".to_string()));
        spec.extend(self.bias.then(|| "bias".to_string()));
        spec.push(self.activation.name().to_string());
        spec.extend(self.residual.then(|| "residual".to_string()));
        spec.join(",")
    }

    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut s = EpilogueSpec {
            alpha: 1.0,
            beta: false,
            bias: false,
            residual: false,
            activation: Activation::None,
        };
        for tok in spec.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            match tok {
                "beta" => s.beta = true,
                "bias" => s.bias = true,
                "residual" => s.residual = true,
                t if t.starts_with("alpha=") => {
                    s.alpha = t[6..].parse().map_err(|_| format!("--epilogue: `{t}`"))?
                }
                t => {
                    s.activation = Activation::ALL
                        .into_iter()
                        .find(|a| a.name() == t)
                        .ok_or_else(|| format!("--epilogue: unknown step `{t}`"))?
                }
            }
        }
        Ok(s)
    }
}

/// A quantized output as `--out_quant` names it: its format and, for NVFP4, the tensor scale
/// the caller gives (the output's largest magnitude is not known before it is written).
pub fn out_quant(name: &str) -> Result<(OperandFormat, Option<f32>), String> {
    Ok(match name {
        "fp8-1x128" => (Recipe::DeepSeekFp8.a(), None),
        "mxfp8" => (Recipe::Mxfp8(Fp8::E4M3).a(), None),
        "mxfp4" => (Recipe::Mxfp4.a(), None),
        "nvfp4" => (Recipe::Nvfp4.a(), Some(0.01f32)),
        o => {
            return Err(format!(
                "--out_quant `{o}`: want fp8-1x128, mxfp8, mxfp4 or nvfp4"
            ));
        }
    })
}

/// One fused-epilogue measurement.
#[derive(Clone, Debug)]
pub struct FusedCase {
    pub recipe: Recipe,
    pub mnkl: [usize; 4],
    pub epilogue: EpilogueSpec,
    /// `--out_quant`'s name, or `None` for bf16 output.
    pub quant: Option<String>,
    pub warmup: usize,
    pub iters: usize,
    pub seed: u64,
}

/// What [`run_fused`] measured (medians in ms).
#[derive(Clone, Debug)]
pub struct FusedOutcome {
    pub plain_plan: Plan,
    pub fused_plan: Plan,
    pub flops: f64,
    /// The plain GEMM with bf16 output on its own plan.
    pub plain_ms: f64,
    /// The plain GEMM with bf16 output on the fused plan's configuration.
    pub plain_on_fused_plan_ms: f64,
    /// The fused epilogue with bf16 output.
    pub fused_bf16_ms: f64,
    /// With a quantized output: the standalone quantizer of the fused bf16 output, the GEMM
    /// with the fused quantized output, and whether that output is bit-identical to the
    /// quantizer of the same epilogue's f32 output.
    pub quantized: Option<(f64, f64, bool)>,
    /// The bytes a call with bf16 output must move at least: the operands with their scales, the
    /// epilogue's tensors, the output.
    pub min_bytes: f64,
}

/// Times `case` on `gpu` (random operands and epilogue tensors from `case.seed`).
pub fn run_fused(gpu: &Gpu, case: &FusedCase) -> Result<FusedOutcome, String> {
    let [m, n, k, l] = case.mnkl;
    let (recipe, spec, seed) = (case.recipe, &case.epilogue, case.seed);
    let a = ScaledMatrix::quantize(&random_values(seed, m * k * l, k), m, k, l, recipe.a())
        .map_err(err)?;
    let b_values = random_values(seed ^ 0x9E37, n * k * l, k);
    let b = ScaledMatrix::quantize(&b_values, n, k, l, recipe.b()).map_err(err)?;
    let (da, db) = (gpu.upload(&a).map_err(err)?, gpu.upload(&b).map_err(err)?);
    let n_out = if spec.activation == Activation::SwiGlu {
        n / 2
    } else {
        n
    };
    let tensor = |rows: usize, cols: usize, batch: usize, s: u64| -> Result<DeviceTensor, String> {
        let v = random_values(seed ^ s, rows * cols * batch, cols);
        upload_tensor_as(gpu, InputType::Bf16, &v, (rows, cols, batch))
            .map(|t| t.0)
            .map_err(err)
    };
    let c_t = tensor(m, n, l, 11)?;
    let bias_t = tensor(1, n, 1, 12)?;
    let res_t = tensor(m, n_out, l, 13)?;
    let mut epi = Epilogue::new()
        .alpha(spec.alpha)
        .activation(spec.activation);
    if spec.beta {
        epi = epi.beta_c(0.5, &c_t);
    }
    if spec.bias {
        epi = epi.bias(&bias_t);
    }
    if spec.residual {
        epi = epi.residual(&res_t);
    }
    let quant = case.quant.as_deref().map(out_quant).transpose()?;
    let (wu, it) = (case.warmup, case.iters);
    let plain_plan = gpu.plan(&da, &db).map_err(err)?;
    let fused_plan = gpu
        .fused_plan(&da, &db, &epi, quant.map(|q| q.0))
        .map_err(err)?;
    let mut c = gpu.output(m, n, l, OutType::Bf16).map_err(err)?;
    let plain = time_on_stream(gpu.stream(), wu, it, |_| {
        gpu.gemm_with(&da, &db, &mut c, plain_plan)
    })
    .map_err(err)?;
    let same = time_on_stream(gpu.stream(), wu, it, |_| {
        gpu.gemm_with(&da, &db, &mut c, fused_plan)
    })
    .map_err(err)?;
    let mut o = gpu.output(m, n_out, l, OutType::Bf16).map_err(err)?;
    let fused = time_on_stream(gpu.stream(), wu, it, |_| {
        gpu.run(
            &Call::new(&da, &db).epilogue(&epi).with_plan(fused_plan),
            &mut o,
        )
    })
    .map_err(err)?;
    let quantized = match quant {
        None => None,
        Some((format, tensor_scale)) => {
            let opts = QuantizeOptions {
                tensor_scale,
                ..Default::default()
            };
            let mut f = gpu.output(m, n_out, l, OutType::F32).map_err(err)?;
            gpu.run(
                &Call::new(&da, &db).epilogue(&epi).with_plan(fused_plan),
                &mut f,
            )
            .map_err(err)?;
            let ft = gpu.output_as_tensor(f).map_err(err)?;
            let want = gpu.quantize_with(&ft, format, &opts).map_err(err)?.matrix;
            let got = gpu
                .run_quantized_new(
                    &Call::new(&da, &db).epilogue(&epi).with_plan(fused_plan),
                    format,
                    &opts,
                )
                .map_err(err)?;
            let (g, w) = (got.to_host().map_err(err)?, want.to_host().map_err(err)?);
            let same_bits = g.data() == w.data() && g.scales() == w.scales();
            // Both paths write into matrices made once (`_into`), as a serving loop does.
            let mut dst = got;
            let t = time_on_stream(gpu.stream(), wu, it, |_| {
                gpu.run_quantized(
                    &Call::new(&da, &db).epilogue(&epi).with_plan(fused_plan),
                    &mut dst,
                )
            })
            .map_err(err)?;
            // The unfused path's second half: the standalone quantizer of the bf16 output.
            let ot = gpu.output_as_tensor(o).map_err(err)?;
            let mut qdst = want;
            let q = time_on_stream(gpu.stream(), wu, it, |_| {
                gpu.quantize_into(&ot, &mut qdst, &opts)
            })
            .map_err(err)?;
            Some((q.median_ms, t.median_ms, same_bits))
        }
    };
    let epilogue_bytes = 2
        * (spec.beta as usize * m * n * l
            + spec.bias as usize * n
            + spec.residual as usize * m * n_out * l);
    let operand_bytes = a.data().len() + a.scales().len() + b.data().len() + b.scales().len();
    Ok(FusedOutcome {
        plain_plan,
        fused_plan,
        min_bytes: (operand_bytes + epilogue_bytes + 2 * m * n_out * l) as f64,
        flops: 2.0 * (m * n * k * l) as f64,
        plain_ms: plain.median_ms,
        plain_on_fused_plan_ms: same.median_ms,
        fused_bf16_ms: fused.median_ms,
        quantized,
    })
}

/// The lines that report `o` for `case`; the second value says whether every check passed.
pub fn fused_lines(case: &FusedCase, o: &FusedOutcome) -> (Vec<String>, bool) {
    let [m, n, k, l] = case.mnkl;
    let row = |what: &str, ms: f64| {
        format!(
            "  {what:<44} {:>9.2} µs {:>7.1} TFLOP/s {:>6.3}× plain",
            ms * 1e3,
            o.flops / (ms * 1e-3) / 1e12,
            ms / o.plain_ms
        )
    };
    let mut lines = vec![
        format!(
            "fused epilogue `{}`{} on {} {l}×{m}×{n}×{k}",
            case.epilogue.name(),
            case.quant
                .as_deref()
                .map(|q| format!(" → {q}"))
                .unwrap_or_default(),
            case.recipe.name()
        ),
        format!("  plain plan {:?}", o.plain_plan),
        format!("  fused plan {:?}", o.fused_plan),
        row("plain GEMM, bf16 output", o.plain_ms),
        row(
            "plain GEMM on the fused plan, bf16",
            o.plain_on_fused_plan_ms,
        ),
        row("fused epilogue, bf16 output", o.fused_bf16_ms),
    ];
    let mut ok = true;
    if let Some((q, t, same_bits)) = o.quantized {
        let name = case.quant.as_deref().unwrap_or("");
        lines.push(row("standalone quantizer of that output (into)", q));
        lines.push(row(&format!("fused epilogue + {name} output"), t));
        let saved = o.fused_bf16_ms + q - t;
        lines.push(format!(
            "  fused quantized output saves {:.2} µs = {:.2} of the quantizer's time; {}",
            saved * 1e3,
            saved / q,
            if same_bits {
                "bit-identical to the quantizer of the fused f32 output"
            } else {
                "DIFFERS from the quantizer of the fused f32 output"
            }
        ));
        ok &= same_bits;
    }
    (lines, ok)
}

/// The records of `o` ([`crate::report`]): the plain GEMM with bf16 output (on its plan and on
/// the fused plan), the fused epilogue with bf16 output against the plain GEMM and, for a
/// quantized output, the fused quantized output against the fused bf16 GEMM followed by the
/// standalone quantizer.
pub fn fused_entries(case: &FusedCase, o: &FusedOutcome) -> Vec<Entry> {
    let [m, n, k, l] = case.mnkl;
    let (recipe, spec) = (case.recipe.name(), case.epilogue.name());
    let entry = |name: String, ms: f64, peer: Option<(&str, f64)>, plan: &Plan| {
        let row = crate::report::row(name, (m, n, k, l), (ms, o.flops, o.min_bytes), peer);
        Entry::new("fused", row).plan(crate::cases::plan_name(plan))
    };
    let plain = "plain GEMM → bf16";
    let mut out = vec![
        entry(format!("{recipe} {plain}"), o.plain_ms, None, &o.plain_plan),
        entry(
            format!("{recipe} {plain}, fused plan"),
            o.plain_on_fused_plan_ms,
            None,
            &o.fused_plan,
        ),
        entry(
            format!("{recipe} {spec} → bf16"),
            o.fused_bf16_ms,
            Some((plain, o.plain_ms)),
            &o.fused_plan,
        ),
    ];
    if let Some((q, t, same_bits)) = o.quantized {
        let name = case.quant.as_deref().unwrap_or("");
        let unfused = format!("{spec} → bf16 + quantizer");
        let e = entry(
            format!("{recipe} {spec} → {name}"),
            t,
            Some((&unfused, o.fused_bf16_ms + q)),
            &o.fused_plan,
        );
        out.push(e.note(format!(
            "standalone quantizer {:.2} µs; {}",
            q * 1e3,
            if same_bits {
                "bit-identical to the quantizer of the fused f32 output"
            } else {
                "DIFFERS from the quantizer of the fused f32 output"
            }
        )));
    }
    out
}

/// One device quantizer's measurement: its median time, its bytes read and written, and how it
/// compares with the host quantizer (`Ok` with "bit-identical", or what differs).
#[derive(Clone, Debug)]
pub struct QuantizerRow {
    pub name: String,
    /// `Gpu::quantize_into` a matrix made once (what a serving loop calls).
    pub ms: f64,
    /// `Gpu::quantize_with` (a new matrix each call: allocation, tensor maps, and for the formats
    /// prepared through the host, a round trip).
    pub call_ms: f64,
    pub bytes: usize,
    pub check: Result<String, String>,
}

impl QuantizerRow {
    pub fn gbs(&self) -> f64 {
        self.bytes as f64 / (self.ms * 1e-3) / 1e9
    }
}

/// The device quantizers of `recipes`' A formats on a `batch × rows × k` tensor of `input`
/// values (inputs rotated past L2), each checked against the host quantizer; a format the device
/// quantizers do not take is a row whose check is the error.
pub fn run_quantizers(
    gpu: &Gpu,
    (rows, k, batch): (usize, usize, usize),
    input: InputType,
    recipes: &[Recipe],
    (warmup, iters, seed): (usize, usize, u64),
) -> Result<Vec<QuantizerRow>, String> {
    let v = random_values(seed, rows * k * batch, k);
    let in_bytes = input.bytes() * rows * k * batch;
    let sets = rotation_count(in_bytes, L2_BYTES);
    let mut tensors = Vec::with_capacity(sets);
    let mut first_values = Vec::new();
    for i in 0..sets {
        let vals: Vec<f32> = v.iter().map(|&x| x * (1.0 + i as f32 / 64.0)).collect();
        let (t, hv) = upload_tensor_as(gpu, input, &vals, (rows, k, batch)).map_err(err)?;
        if i == 0 {
            first_values = hv;
        }
        tensors.push(t);
    }
    let mut out = Vec::new();
    for r in recipes {
        let format = r.a();
        let host = ScaledMatrix::quantize(&first_values, rows, k, batch, format);
        let opts = QuantizeOptions {
            tensor_scale: if format.scale == ScaleType::UE4M3 {
                Some(host.as_ref().map(|h| h.tensor_scale()).unwrap_or(1.0))
            } else {
                None
            },
            ..Default::default()
        };
        let got = match gpu.quantize_with(&tensors[0], format, &opts) {
            Ok(q) => q.matrix,
            Err(e) => {
                out.push(QuantizerRow {
                    name: r.name().to_string(),
                    ms: f64::NAN,
                    call_ms: f64::NAN,
                    bytes: 0,
                    check: Err(e.to_string()),
                });
                continue;
            }
        };
        let check = match (&host, got.to_host()) {
            (Ok(h), Ok(g)) if h.data() == g.data() && h.scales() == g.scales() => {
                Ok("bit-identical".to_string())
            }
            (Ok(_), Ok(_)) => Err("DIFFERS from the host quantizer".to_string()),
            (Err(x), _) => Ok(format!("host: {x}")),
            (_, Err(x)) => Err(x.to_string()),
        };
        let (data_bytes, scale_bytes) = got.desc().validate().map_err(err)?;
        let call = time_on_stream(gpu.stream(), warmup, iters, |i| {
            gpu.quantize_with(&tensors[i % sets], format, &opts)
                .map(|_| ())
        })
        .map_err(err)?;
        let mut dst = got;
        let t = time_on_stream(gpu.stream(), warmup, iters, |i| {
            gpu.quantize_into(&tensors[i % sets], &mut dst, &opts)
        })
        .map_err(err)?;
        out.push(QuantizerRow {
            name: r.name().to_string(),
            ms: t.median_ms,
            call_ms: call.median_ms,
            bytes: in_bytes + data_bytes + scale_bytes,
            check,
        });
    }
    out.push(copy_row(gpu, in_bytes, sets, (warmup, iters))?);
    Ok(out)
}

/// The machine's own copy rate beside the quantizers: a device-to-device copy of the input's
/// bytes (read and written once: twice the input's bytes of traffic), from the same number of
/// rotated buffers, timed the same way. The quantizers read the input and write about half of it
/// (FP8) or a quarter (FP4); the copy says what the memory gives a kernel of this size on this
/// machine, the fixed 3.0 TB/s what the targets ask.
fn copy_row(
    gpu: &Gpu,
    in_bytes: usize,
    sets: usize,
    (warmup, iters): (usize, usize),
) -> Result<QuantizerRow, String> {
    let stream = gpu.stream();
    let derr = |e: cudarc::driver::DriverError| e.to_string();
    let srcs = (0..sets)
        .map(|_| stream.alloc_zeros::<u8>(in_bytes))
        .collect::<Result<Vec<_>, _>>()
        .map_err(derr)?;
    let mut dst = stream.alloc_zeros::<u8>(in_bytes).map_err(derr)?;
    let t = time_on_stream(stream, warmup, iters, |i| {
        stream.memcpy_dtod(&srcs[i % sets], &mut dst)
    })
    .map_err(derr)?;
    Ok(QuantizerRow {
        name: "copy (d2d)".to_string(),
        ms: t.median_ms,
        call_ms: f64::NAN,
        bytes: 2 * in_bytes,
        check: Ok("the input's bytes copied: this machine's copy rate".to_string()),
    })
}

/// The header and lines of a quantizer table; the second value says whether every check passed.
pub fn quantizer_lines(rows: &[QuantizerRow]) -> (Vec<String>, bool) {
    let mut lines = vec![format!(
        "{:<16} {:>9} {:>7} {:>11} {:>10}  check",
        "format", "into µs", "GB/s", "of 3.0 TB/s", "call µs"
    )];
    let mut ok = true;
    for r in rows {
        let check = match &r.check {
            Ok(s) => s.clone(),
            Err(s) => {
                ok = false;
                s.clone()
            }
        };
        if r.ms.is_nan() {
            lines.push(format!("{:<16} {check}", r.name));
            continue;
        }
        let call = if r.call_ms.is_nan() {
            "—".to_string()
        } else {
            format!("{:.2}", r.call_ms * 1e3)
        };
        lines.push(format!(
            "{:<16} {:>9.2} {:>7.0} {:>11.2} {:>10}  {check}",
            r.name,
            r.ms * 1e3,
            r.gbs(),
            r.gbs() / crate::ceilings::get().map_or(f64::NAN, |c| c.gbs),
            call
        ));
    }
    (lines, ok)
}

/// The records of a quantizer table ([`crate::report`]): `(rows, k, batch)` of `input` values
/// into each format (N is none: 0), the bytes read and written, no FLOPs; the check and the
/// allocating call's time in the note. Formats the device quantizers do not take have no row.
pub fn quantizer_entries(
    rows: &[QuantizerRow],
    (m, k, l): (usize, usize, usize),
    input: &str,
) -> Vec<Entry> {
    rows.iter()
        .filter(|r| r.ms.is_finite())
        .map(|r| {
            let row = crate::report::row(
                format!("{} from {input}", r.name),
                (m, 0, k, l),
                (r.ms, 0.0, r.bytes as f64),
                None,
            );
            let check = match &r.check {
                Ok(s) | Err(s) => s.clone(),
            };
            let note = if r.call_ms.is_nan() {
                check
            } else {
                format!("{check}; allocating call {:.2} µs", r.call_ms * 1e3)
            };
            Entry::new("quantize", row).note(note)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epilogue_specs_and_output_formats_parse_or_say_what_is_wrong() {
        let s = EpilogueSpec::parse("alpha=2,bias,silu,residual").unwrap();
        assert_eq!(
            s,
            EpilogueSpec {
                alpha: 2.0,
                beta: false,
                bias: true,
                residual: true,
                activation: Activation::Silu
            }
        );
        assert_eq!(
            EpilogueSpec::parse("").unwrap().activation,
            Activation::None
        );
        assert!(
            EpilogueSpec::parse("bias,tanh")
                .unwrap_err()
                .contains("tanh")
        );
        assert!(EpilogueSpec::parse("alpha=x").is_err());
        assert_eq!(s.name(), "alpha=2,bias,silu,residual");
        assert_eq!(
            EpilogueSpec::parse("beta").unwrap().name(),
            "alpha=1,beta,none"
        );
        assert_eq!(out_quant("nvfp4").unwrap().1, Some(0.01));
        assert!(out_quant("fp8").unwrap_err().contains("fp8-1x128"));
    }
}
