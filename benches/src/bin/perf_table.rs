//! `blockscaled-perf-table`: docs/PERF.md from the runner's JSON Lines.
//!
//! ```text
//! blockscaled-perf-table runs/*.jsonl > docs/PERF.md
//! blockscaled-perf-table perf.jsonl --out docs/PERF.md
//! ```
//! One section per GPU (its measured ceilings, the runs' dates and versions), one table per kind;
//! a case measured more than once shows its latest line (`blockscaled_benches::perf_md`).

use std::path::PathBuf;
use std::process::ExitCode;

use blockscaled_benches::perf_md::{latest, parse, render};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Write docs/PERF.md's tables from `blockscaled-run --json` files"
)]
struct Args {
    /// JSON Lines files of `blockscaled-run --json`, oldest first (of one date, a later line
    /// replaces an earlier one of the same case).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Write the markdown here instead of to stdout.
    #[arg(long)]
    out: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut records = Vec::new();
    for f in &args.files {
        let text = match std::fs::read_to_string(f) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("error: {}: {e}", f.display());
                return ExitCode::from(2);
            }
        };
        let (mut r, bad) = parse(&text, &f.display().to_string());
        for b in bad {
            eprintln!("warning: {b}");
        }
        records.append(&mut r);
    }
    let md = render(&latest(records));
    match &args.out {
        None => print!("{md}"),
        Some(p) => {
            if let Err(e) = std::fs::write(p, md) {
                eprintln!("error: {}: {e}", p.display());
                return ExitCode::from(2);
            }
        }
    }
    ExitCode::SUCCESS
}
