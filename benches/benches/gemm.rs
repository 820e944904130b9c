//! `cargo bench`: our GEMM and cuBLASLt, same process, same stream, medians of CUDA-event times.
//! Without a GPU it says so and exits successfully (CI has none).
//! `BLOCKSCALED_BENCH=seed`: seed 000's shapes in every recipe, and 8192³;
//! `BLOCKSCALED_BENCH=deepseek`: the DeepSeek-V3 layer shapes in the DeepSeek recipe;
//! `BLOCKSCALED_BENCH=mx`: the MX / NVFP4 / 4-bit-weights shapes (4-bit weights at decode
//! sizes, M = 128 and 4096); `BLOCKSCALED_BENCH=decode`: M = 1, 8, 16, 32, 64 on the
//! DeepSeek-V3 (N, K) pairs; `BLOCKSCALED_BENCH=grouped`: grouped
//! GEMM (the seed's MoE cases, masked decode); `BLOCKSCALED_BENCH=bsr`: block-sparse GEMM at
//! 4096³ and 8192³, random and banded, densities 5–100 % (peers: our dense kernel and cuBLASLt
//! dense); `BLOCKSCALED_BENCH=fused`: the device quantizers (bf16 input, 4096 × 7168 and
//! 16 × 7168) and the fused epilogue (bias + SiLU to bf16 and to FP8 1×128 against the plain GEMM
//! and the GEMM + standalone quantizer) on issue 16's shapes; `all` (default): every set.
//! `BLOCKSCALED_SUSTAINED=1`: 1,000 launches of each before timing (sustained load). After the
//! table: our result against cuBLASLt's on every shape where it computes the same product; a
//! difference beyond the derived bound fails the run.

use blockscaled::{Gpu, OutType, Recipe};
use blockscaled_benches::cases::{Case, open_peer, run_case};
use blockscaled_benches::table::print_table;

/// The DeepSeek-V3 layers' (N, K) pairs.
const DEEPSEEK_NK: [(usize, usize); 6] = [
    (2112, 7168),
    (24576, 1536),
    (32768, 512),
    (7168, 16384),
    (4096, 7168),
    (7168, 2048),
];

fn main() {
    // cargo passes `--bench`; nothing else is understood.
    let gpu = match Gpu::new(0) {
        Ok(g) => g,
        Err(e) => {
            println!("benchmarks skipped: {e}");
            return;
        }
    };
    if let Err(why) = blockscaled_benches::ceilings::measure(&gpu, false) {
        println!("ceilings not measured ({why}): no fraction of the ceiling in the tables");
    }
    let peer = open_peer(&gpu)
        .map_err(|e| println!("cuBLASLt unavailable: {e}"))
        .ok();
    let which = std::env::var("BLOCKSCALED_BENCH").unwrap_or_else(|_| "all".into());
    let mut shapes: Vec<(Recipe, [usize; 4])> = Vec::new();
    if which == "seed" || which == "all" {
        for r in Recipe::ALL {
            shapes.push((r, [2048, 2048, 512, 1]));
        }
        shapes.push((Recipe::DeepSeekFp8, [8192, 8192, 1024, 1]));
        shapes.push((Recipe::DeepSeekFp8, [8192, 8192, 8192, 1]));
    }
    if which == "mx" || which == "all" {
        // Issue targets: 8192³ and M = 4096 in every both-scaled format; decode with 4-bit
        // weights (bf16, FP8 and FP4 activations).
        let both = [
            Recipe::Mxfp8(blockscaled::Fp8::E4M3),
            Recipe::Mxfp8(blockscaled::Fp8::E5M2),
            Recipe::Mxfp4,
            Recipe::Nvfp4,
            Recipe::E2m1E8m0x16,
        ];
        for r in both {
            shapes.push((r, [8192, 8192, 8192, 1]));
            for (n, k) in [(7168, 2048), (2112, 7168), (24576, 1536)] {
                shapes.push((r, [4096, n, k, 1]));
            }
        }
        for r in [
            Recipe::Mxfp4,
            Recipe::Nvfp4,
            Recipe::W4A16(blockscaled::Fp4Weights::Mxfp4),
            Recipe::W4A16(blockscaled::Fp4Weights::Nvfp4),
            Recipe::W4A8(blockscaled::Fp4Weights::Mxfp4),
            Recipe::W4A8(blockscaled::Fp4Weights::Nvfp4),
        ] {
            for m in [1, 16, 128] {
                for (n, k) in [(7168, 4096), (4096, 7168), (14336, 4096)] {
                    shapes.push((r, [m, n, k, 1]));
                }
            }
        }
        // 4-bit weights at prefill sizes (W4A8 against the FP8 block-wise kernel's 4096 × 7168
        // × 2048 of the `deepseek` set).
        for r in [
            Recipe::W4A16(blockscaled::Fp4Weights::Mxfp4),
            Recipe::W4A8(blockscaled::Fp4Weights::Mxfp4),
            Recipe::W4A8(blockscaled::Fp4Weights::Nvfp4),
        ] {
            shapes.push((r, [4096, 7168, 2048, 1]));
        }
    }
    if which == "decode" || which == "all" {
        // Decode-sized M on the DeepSeek-V3 (N, K) pairs: the weights dominate the bytes.
        for m in [1, 8, 16, 32, 64] {
            for (n, k) in DEEPSEEK_NK {
                shapes.push((Recipe::DeepSeekFp8, [m, n, k, 1]));
            }
        }
    }
    if which == "deepseek" || which == "all" {
        for m in [128, 4096] {
            for (n, k) in DEEPSEEK_NK {
                shapes.push((Recipe::DeepSeekFp8, [m, n, k, 1]));
            }
        }
    }
    // Sustained load: 1,000 back-to-back launches of each (ours and the peer) before timing,
    // so the power-capped board reaches its steady clocks.
    let sustained = std::env::var("BLOCKSCALED_SUSTAINED").is_ok_and(|v| v == "1");
    let warmup = 2;
    if sustained {
        blockscaled_benches::timing::set_sustained(blockscaled_benches::timing::SUSTAINED_LAUNCHES);
        println!(
            "sustained load: {} launches before every timing, ours and the peer",
            blockscaled_benches::timing::SUSTAINED_LAUNCHES
        );
    }
    let (mut rows, mut agreement, mut mismatch) = (Vec::new(), Vec::new(), false);
    for (i, (recipe, [m, n, k, l])) in shapes.into_iter().enumerate() {
        let case = Case {
            recipe,
            m,
            n,
            k,
            l,
            out: OutType::Bf16,
            warmup,
            iters: 10,
            check: false,
            peer: true,
            seed: 1000 + i as u64,
            plan: None,
        };
        match run_case(&gpu, peer.as_ref(), &case) {
            Ok(o) => {
                let name = format!("{recipe} {m}x{n}x{k}x{l}");
                match o.peer_check {
                    Some(Ok(msg)) => agreement.push(format!("{name}: {msg}")),
                    Some(Err(msg)) => {
                        mismatch = true;
                        agreement.push(format!("{name}: PEER MISMATCH: {msg}"));
                    }
                    None => {}
                }
                rows.push(o.row)
            }
            Err(e) => println!("{recipe} {m}x{n}x{k}x{l}: {e}"),
        }
    }
    print_table(&rows);
    if which == "grouped" || which == "all" {
        use blockscaled_benches::grouped::{
            bench_cases, grouped_header, grouped_line, run_grouped,
        };
        println!("\ngrouped GEMM (peer: a loop of cuBLASLt calls, one per group):");
        println!("{}", grouped_header());
        for c in bench_cases() {
            match run_grouped(&gpu, peer.as_ref(), &c) {
                Ok(o) => println!("{}", grouped_line(&c, &o)),
                Err(e) => println!("{} {:?} {:?}: {e}", c.recipe, c.layout, c.sizes),
            }
        }
    }
    if which == "bsr" || which == "all" {
        use blockscaled_benches::bsr::{bench_cases, bsr_header, bsr_line, run_bsr};
        println!(
            "\nblock-sparse GEMM (B sparse unless said; target ≤ 1.2 × density × dense + 3 µs):"
        );
        println!("{}", bsr_header());
        for c in bench_cases(warmup.max(3), 10) {
            match run_bsr(&gpu, peer.as_ref(), &c) {
                Ok(o) => println!("{}", bsr_line(&c, &o)),
                Err(e) => println!(
                    "{:?} {}x{}x{} {}: {e}",
                    c.side,
                    c.m,
                    c.n,
                    c.k,
                    c.pattern.name()
                ),
            }
        }
    }
    if which == "fused" || which == "all" {
        mismatch |= !bench_fused(&gpu, warmup.max(3));
    }
    // Every shape where cuBLASLt computed the same product: its result against ours.
    println!("\nagreement with the peer (same quantized inputs):");
    for line in &agreement {
        println!("  {line}");
    }
    if mismatch {
        std::process::exit(1);
    }
}

/// The device quantizers and the fused epilogue (issue 16's targets); false if a check failed.
fn bench_fused(gpu: &Gpu, warmup: usize) -> bool {
    use blockscaled::{Fp8, InputType};
    use blockscaled_benches::fused::{
        EpilogueSpec, FusedCase, fused_lines, quantizer_lines, run_fused, run_quantizers,
    };
    let mut ok = true;
    let formats = [
        Recipe::DeepSeekFp8,
        Recipe::Mxfp8(Fp8::E4M3),
        Recipe::Mxfp4,
        Recipe::Nvfp4,
    ];
    for rows in [4096, 16] {
        println!("\ndevice quantizers, {rows} × 7168 bf16 (target ≥ 0.8 of the copy ceiling):");
        match run_quantizers(
            gpu,
            (rows, 7168, 1),
            InputType::Bf16,
            &formats,
            (warmup, 20, 7),
        ) {
            Ok(r) => {
                let (lines, good) = quantizer_lines(&r);
                lines.iter().for_each(|l| println!("{l}"));
                ok &= good;
            }
            Err(e) => println!("{e}"),
        }
    }
    println!("\nfused epilogue (target: bias + SiLU + FP8 1×128 ≤ 1.05 × plain bf16):");
    let bias_silu = EpilogueSpec::parse("bias,silu").expect("a valid spec");
    let cases = [
        (Recipe::DeepSeekFp8, [4096, 7168, 2048, 1], None),
        (
            Recipe::DeepSeekFp8,
            [4096, 7168, 2048, 1],
            Some("fp8-1x128"),
        ),
        // (4096×2112×7168 cannot take FP8 1×128 output: 2112 columns are not whole blocks of
        // 128, a typed error.)
        (Recipe::DeepSeekFp8, [4096, 2112, 7168, 1], None),
        (
            Recipe::Mxfp8(Fp8::E4M3),
            [4096, 7168, 2048, 1],
            Some("mxfp8"),
        ),
    ];
    for (i, (recipe, mnkl, quant)) in cases.into_iter().enumerate() {
        let case = FusedCase {
            recipe,
            mnkl,
            epilogue: bias_silu.clone(),
            quant: quant.map(str::to_string),
            warmup,
            iters: 20,
            seed: 1600 + i as u64,
        };
        match run_fused(gpu, &case) {
            Ok(o) => {
                let (lines, good) = fused_lines(&case, &o);
                lines.iter().for_each(|l| println!("{l}"));
                ok &= good;
            }
            Err(e) => println!("{recipe} {mnkl:?}: {e}"),
        }
    }
    ok
}
