//! The device quantizers (`--quantize`) and the fused epilogue (`--epilogue`, `--out_quant`).

use blockscaled::{Gpu, InputType};

use super::{Args, JsonSink, Setup};
use crate::fused::{
    EpilogueSpec, FusedCase, fused_entries, fused_lines, quantizer_entries, quantizer_lines,
    run_quantizers,
};

/// `--quantize`: the device quantizers timed (CUDA events, warm-up, medians, inputs rotated past
/// L2) and checked against the host's.
pub(super) fn run_quantize(
    args: &Args,
    gpu: &Gpu,
    s: &Setup,
    input: &str,
    sink: &mut JsonSink,
) -> Result<bool, String> {
    let (rows, k, l) = (s.mnkl[0], s.mnkl[2], s.mnkl[3]);
    let ty = match input {
        "bf16" => InputType::Bf16,
        "f16" => InputType::F16,
        "f32" => InputType::F32,
        o => return Err(format!("--quantize `{o}`: want bf16, f16 or f32")),
    };
    println!("quantize {l}×{rows}×{k} {input}");
    let timing = (args.warmup_iterations, args.iterations, s.seed);
    let measured = run_quantizers(gpu, (rows, k, l), ty, &s.recipes, timing)?;
    let (lines, ok) = quantizer_lines(&measured);
    for line in lines {
        println!("{line}");
    }
    sink.emit(&quantizer_entries(&measured, (rows, k, l), input))?;
    Ok(ok)
}

/// `--epilogue` / `--out_quant`: the GEMM with a fused epilogue timed beside the plain GEMM with
/// bf16 output and, for a quantized output, beside the same epilogue to bf16 followed by the
/// device quantizer (CUDA events, warm-up, medians); a quantized output is checked bit for bit
/// against the quantizer of the same epilogue's f32 output.
pub(super) fn run_fused(
    args: &Args,
    gpu: &Gpu,
    s: &Setup,
    sink: &mut JsonSink,
) -> Result<bool, String> {
    let m = &s.mnkl;
    let case = FusedCase {
        recipe: s
            .recipes
            .first()
            .copied()
            .ok_or("--epilogue: name one --recipe")?,
        mnkl: [m[0], m[1], m[2], m[3]],
        epilogue: EpilogueSpec::parse(args.epilogue.as_deref().unwrap_or(""))?,
        quant: args.out_quant.clone(),
        warmup: args.warmup_iterations,
        iters: args.iterations,
        seed: s.seed,
    };
    let o = crate::fused::run_fused(gpu, &case)?;
    let (lines, ok) = fused_lines(&case, &o);
    for line in lines {
        println!("{line}");
    }
    sink.emit(&fused_entries(&case, &o))?;
    Ok(ok)
}
