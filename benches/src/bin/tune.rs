//! `blockscaled-tune`: tunes a model's GEMMs ahead of time and stores the fastest plans in the
//! tuner's cache, which every later process consults before the heuristic
//! (`blockscaled_benches::tune`).
//!
//! ```text
//! blockscaled-tune --preset deepseek-v3                      # its layers at the default Ms
//! blockscaled-tune --preset llama3-70b,qwen2.5-72b --m 16,128,4096 --recipe deepseek-fp8,mxfp4
//! blockscaled-tune --shapes my-model.txt --cache ./plans.json
//! blockscaled-tune --preset deepseek-v3 --grouped            # and its experts as grouped calls
//! blockscaled-tune --preset all --dry-run                    # the jobs and candidates, no GPU
//! ```

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use blockscaled::plan::cache::{PlanCache, default_path};
use blockscaled::{GpuArch, Recipe, ScaledMatrix};
use blockscaled_benches::tune::{
    DEFAULT_MS, Tuned, job_candidates, job_descs, jobs, read_shapes, remember, tune, weights,
};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Tune a model's GEMMs on this GPU and store the fastest plans in the tuner's cache"
)]
struct Args {
    /// Models whose layers to tune, comma-separated: deepseek-v3, llama3-70b, mixtral-8x7b,
    /// qwen2.5-72b, or all (default: deepseek-v3, or none where --shapes is given).
    #[arg(long)]
    preset: Option<String>,
    /// Rows (M) to tune each layer at, comma-separated.
    #[arg(long, value_delimiter = ',')]
    m: Vec<usize>,
    /// Recipes, comma-separated (deepseek-fp8, mxfp8-e4m3, mxfp4, nvfp4, w4a16-mxfp4, …).
    #[arg(long, default_value = "deepseek-fp8")]
    recipe: String,
    /// More shapes: a file of `M N K` or `label M N K` lines (`#` comments).
    #[arg(long)]
    shapes: Option<PathBuf>,
    /// The cache file (default: BLOCKSCALED_TUNE_CACHE, else the user's cache directory).
    #[arg(long)]
    cache: Option<PathBuf>,
    /// Timed launches per candidate (medians), after a warm-up.
    #[arg(long, default_value_t = 10)]
    iters: usize,
    /// The GPU's ordinal.
    #[arg(long, default_value_t = 0)]
    gpu: usize,
    /// Also append each job's candidates' times to this file, a JSON object a line (the GPU,
    /// the job, the heuristic's plan, every plan's µs; docs/tune-data's format): the data the
    /// heuristic's rules are checked against (`--regret`).
    #[arg(long)]
    timings: Option<PathBuf>,
    /// Tune nothing: read this timings file (`--timings`' output, or docs/tune-data's
    /// <gpu>.jsonl) and print, without a GPU, the heuristic's regret on each job — the
    /// time of the plan it chooses now over the fastest timed candidate.
    #[arg(long)]
    regret: Option<PathBuf>,
    /// Also tune the presets' expert layers (deepseek-v3, mixtral-8x7b) as grouped calls: 8
    /// experts, contiguous groups of 0.5–1.5 times the mean, 4096 and 16384 rows in all, and
    /// masked decode groups.
    #[arg(long)]
    grouped: bool,
    /// Tune the expert layers' grouped calls alone (no dense jobs; implies --grouped).
    #[arg(long)]
    grouped_only: bool,
    /// List the jobs and their candidates (for an H200: 132 SMs, 4.81 TB/s of DRAM) without a GPU.
    #[arg(long)]
    dry_run: bool,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Args) -> Result<(), String> {
    let recipes = args
        .recipe
        .split(',')
        .map(|r| Recipe::from_name(r.trim()).ok_or_else(|| format!("unknown recipe {r:?}")))
        .collect::<Result<Vec<_>, _>>()?;
    let presets: Vec<String> = match (&args.preset, &args.shapes) {
        (Some(p), _) => p.split(',').map(|s| s.trim().to_string()).collect(),
        (None, Some(_)) => Vec::new(),
        (None, None) => vec!["deepseek-v3".to_string()],
    };
    let extra = match &args.shapes {
        Some(p) => read_shapes(p)?,
        None => Vec::new(),
    };
    let ms = if args.m.is_empty() {
        DEFAULT_MS.to_vec()
    } else {
        args.m.clone()
    };
    if let Some(path) = &args.regret {
        return print_regrets(path);
    }
    let mut jobs = jobs(
        &presets,
        &ms,
        &recipes,
        &extra,
        args.grouped || args.grouped_only,
    )?;
    if args.grouped_only {
        jobs.retain(|j| j.groups.is_some());
    }
    if args.dry_run {
        for j in &jobs {
            let (a, b) = job_descs(j);
            let (c, _) = job_candidates(
                GpuArch::Hopper,
                blockscaled::plan::Hardware::H200,
                j,
                &a,
                &b,
            )?;
            let rows = j
                .groups
                .as_ref()
                .map_or(String::new(), |g| format!(" (rows {:?})", g.rows));
            println!("{j}{rows}: {} candidates, heuristic {:?}", c.len(), c[0]);
        }
        return Ok(());
    }
    let path = args
        .cache
        .clone()
        .or_else(default_path)
        .ok_or("no cache file: BLOCKSCALED_TUNE_CACHE is off and --cache is not given")?;
    let mut cache = PlanCache::open(&path);
    for w in cache.warnings() {
        eprintln!("warning: {w}");
    }
    let g = blockscaled::Gpu::new(args.gpu).map_err(|e| e.to_string())?;
    println!("{g:?}; cache {}", path.display());
    if let Err(why) = blockscaled_benches::ceilings::measure_at(&g, false, Some(path.clone())) {
        println!("ceilings not measured ({why})");
    }
    let start = Instant::now();
    let mut rows = Vec::new();
    let mut b: Option<ScaledMatrix> = None;
    // A progress line on a terminal, overwritten as each job's candidates are timed.
    let live = std::io::stderr().is_terminal();
    for (i, job) in jobs.iter().enumerate() {
        let same =
            |w: &ScaledMatrix| (w.rows(), w.k(), w.format()) == (job.n, job.k, job.recipe.b());
        if !b.as_ref().is_some_and(same) {
            b = Some(weights(job));
        }
        let progress = |done: usize, all: usize| {
            if live {
                eprint!(
                    "\r[{}/{}] {job}: {done}/{all} candidates",
                    i + 1,
                    jobs.len()
                );
            }
        };
        let weights = b.as_ref().expect("made above");
        let t = tune(&g, job, weights, (args.iters, 1000 + i as u64), progress)?;
        if live {
            eprint!("\r\x1b[2K");
        }
        println!(
            "[{}/{} {:.0} s] {job}: {} timed ({} refused); heuristic {:.1} µs, tuned {:.1} µs ({:.3}x) {:?}",
            i + 1,
            jobs.len(),
            start.elapsed().as_secs_f64(),
            t.all.len(),
            t.refused,
            t.heuristic.1,
            t.best.1,
            t.heuristic.1 / t.best.1,
            t.best.0
        );
        if let Some(f) = &args.timings {
            write_timings(f, &g, &t).map_err(|e| format!("{}: {e}", f.display()))?;
        }
        remember(&mut cache, &t);
        cache
            .save()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        rows.push(t);
    }
    println!(
        "\n{} jobs in {:.1} s\n\n| model | layer | recipe | M×N×K | groups | heuristic µs | tuned µs | gain |\n|---|---|---|---|---|--:|--:|--:|",
        rows.len(),
        start.elapsed().as_secs_f64()
    );
    for t in &rows {
        let j = &t.job;
        let groups = j.groups.as_ref().map_or("—".to_string(), |g| {
            format!("{} {}", g.rows.len(), g.kind())
        });
        println!(
            "| {} | {} | {} | {}×{}×{} | {groups} | {:.1} | {:.1} | {:.3} |",
            j.model,
            j.layer,
            j.recipe,
            j.m,
            j.n,
            j.k,
            t.heuristic.1,
            t.best.1,
            t.heuristic.1 / t.best.1
        );
    }
    let gains: Vec<_> = rows
        .iter()
        .filter(|t| t.heuristic.1 >= 1.03 * t.best.1)
        .collect();
    println!(
        "\n{} of {} shapes gain ≥ 3% from tuning",
        gains.len(),
        rows.len()
    );
    Ok(())
}

/// Appends `t`'s line ([`blockscaled_benches::tune::timings_line`]) to `path`.
fn write_timings(path: &std::path::Path, g: &blockscaled::Gpu, t: &Tuned) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let line = blockscaled_benches::tune::timings_line(g.name(), g.hardware(), t);
    writeln!(f, "{line}")
}

/// `--regret`: the heuristic's regret on each job of a timings file, the worst first.
fn print_regrets(path: &std::path::Path) -> Result<(), String> {
    let timed = blockscaled_benches::tune::read_timings(path)?;
    let mut rows = blockscaled_benches::tune::regrets(&timed)?;
    rows.sort_by(|x, y| {
        let r = |r: &blockscaled_benches::tune::Regret| r.ratio().unwrap_or(f64::INFINITY);
        r(y).total_cmp(&r(x))
    });
    println!("| job | heuristic | µs | fastest | µs | regret |\n|---|---|--:|---|--:|--:|");
    let mut logs = (0.0, 0);
    for r in &rows {
        let us = r
            .heuristic_us
            .map_or("not timed".into(), |u| format!("{u:.1}"));
        let ratio = r.ratio().map_or("—".into(), |x| format!("{x:.3}"));
        if let Some(x) = r.ratio() {
            logs = (logs.0 + x.ln(), logs.1 + 1);
        }
        println!(
            "| {} | `{}` | {us} | `{}` | {:.1} | {ratio} |",
            r.job,
            r.heuristic.to_text(),
            r.best.0.to_text(),
            r.best.1
        );
    }
    println!(
        "\n{} jobs; geometric-mean regret {:.4} over the {} whose heuristic plan was timed",
        rows.len(),
        (logs.0 / logs.1.max(1) as f64).exp(),
        logs.1
    );
    Ok(())
}
