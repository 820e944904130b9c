//! `blockscaled-run`: runs, checks and times block-scaled GEMMs from the command line.
//!
//! ```text
//! blockscaled-run --mnkl 2048,2048,512,1 --recipe all
//! blockscaled-run --mnkl 8192,8192,1024,1 --ab_dtype Float4E2M1FN --sf_dtype Float8E8M0FNU \
//!                 --sf_vec_size 16 --c_dtype Float16 --iterations 50 --warmup_iterations 10
//! blockscaled-run --mnkl 4096,7168,2048,1 --recipe deepseek-fp8 --json runs.jsonl
//! ```
//! Flags follow the CUTLASS CuTe-DSL examples (`--mnkl`, `--mma_tiler_mn`, `--cluster_shape_mn`,
//! `--ab_dtype`, `--sf_dtype`, `--sf_vec_size`, `--c_dtype`, `--iterations`, `--warmup_iterations`,
//! `--skip_ref_check`); dashes work in place of underscores. Prints time, TFLOP/s, GB/s, the
//! fraction of the measured ceiling and the ratio to cuBLASLt timed in the same run; with
//! `--json PATH`, also appends each measured row to PATH as a line of JSON. The modes live in
//! `blockscaled_benches::runner`.

use std::process::ExitCode;

use blockscaled_benches::runner::{Args, run};
use clap::Parser;

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
