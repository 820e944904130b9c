//! docs/PERF.md from the runner's JSON Lines (`blockscaled-run --json`, [`crate::report`]): one
//! section per GPU with its measured ceilings, the runs' dates and versions, then one table per
//! kind. A case measured more than once (the same GPU, kind, name and M N K L) shows its latest
//! line, in the place of its first. A case also measured under sustained load (`--sustained`)
//! shows that time in a column beside the burst time.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::report::Record;

/// The kinds in the order their tables appear, each with the sentence under its heading; kinds
/// not listed follow in the order they first appear.
const KINDS: [(&str, &str); 14] = [
    (
        "fp8",
        "Dense GEMMs on the sm90 FP8 kernel (DeepSeek 1×128 / 128×128, per-tensor and per-row \
         FP8 scales). Peer: cuBLASLt's blockwise or per-tensor FP8 where it has one, else bf16 \
         on the dequantized operands.",
    ),
    (
        "fold",
        "MX and NVFP4 operands folded into FP8 by a pre-pass, then the FP8 kernel. Peer: \
         cuBLASLt bf16 on the dequantized operands (Hopper's cuBLASLt has no MX / NVFP4 GEMM).",
    ),
    (
        "mx",
        "Dense GEMMs on the sm90 MX kernel (MXFP8, MXFP4, NVFP4, e2m1 + e8m0 / 16). Peer: \
         cuBLASLt bf16 on the dequantized operands.",
    ),
    (
        "w4",
        "4-bit weights on the sm90 W4 kernel (W4A16, W4A8 and FP4 pairs at decode sizes). Peer: \
         cuBLASLt bf16 on the dequantized operands.",
    ),
    (
        "16-bit",
        "Dense bf16 / fp16 GEMMs on the sm90 16-bit kernel. Peer: cuBLASLt's GEMM of the same \
         type on the same codes. The compute ceiling is the FP8 one (bf16's rate is half).",
    ),
    (
        "reference",
        "The reference kernel (correctness, not speed).",
    ),
    (
        "grouped",
        "Grouped GEMM (mixture of experts): M is the rows summed over the groups, L the number \
         of groups (G experts of N × K). Peer: a loop of cuBLASLt calls, one per non-empty group.",
    ),
    (
        "bsr",
        "Block-sparse GEMM: TFLOP/s and GB/s of the stored blocks. Peer: cuBLASLt's dense GEMM \
         of the same shape (the note has our dense kernel's time and the target).",
    ),
    (
        "fused",
        "GEMMs with a fused epilogue. Peer: the plain GEMM with bf16 output, or for a quantized \
         output the fused bf16 GEMM followed by the standalone quantizer.",
    ),
    (
        "quantize",
        "Device quantizers: M rows × K columns × L of the input type into each format; GB/s of \
         bytes read and written; the copy row is this machine's own copy rate.",
    ),
    (
        "moe",
        "A MoE layer on one GPU (router, quantizers, grouped GEMMs, combine): M tokens, N the \
         hidden size, K the experts' width, L the experts; FLOPs of the experts' GEMMs.",
    ),
    (
        "engine",
        "Use from an engine: GEMMs on views of caller memory (peer: the same on crate-owned \
         matrices), quantize → GEMM on a caller's stream, two threads on two streams.",
    ),
    (
        "tp",
        "Tensor parallelism on two GPUs (NCCL): a DeepSeek-FP8 MLP. Peer: the same layer on one GPU.",
    ),
    (
        "ep",
        "Expert parallelism on two GPUs (NCCL): a MoE layer; M tokens a GPU. Peer: the layer on \
         one GPU with both GPUs' tokens.",
    ),
];

/// The records of one JSON Lines text, and a message for each line that is not a record (blank
/// lines are skipped silently). `source` names the text in the messages.
pub fn parse(text: &str, source: &str) -> (Vec<Record>, Vec<String>) {
    let (mut records, mut bad) = (Vec::new(), Vec::new());
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Record>(line) {
            Ok(r) => records.push(r),
            Err(e) => bad.push(format!("{source}:{}: not a record ({e}): skipped", i + 1)),
        }
    }
    (records, bad)
}

/// One record per case (GPU, kind, name, M N K L): the latest — the later date, and of one date
/// the later line — in the place where the case first appears. A name that starts with the
/// record's plan is the case without it: a run whose plan changed replaces the older one.
pub fn latest(records: Vec<Record>) -> Vec<Record> {
    let key = |r: &Record| {
        (
            r.gpu.clone(),
            r.kind.clone(),
            case_name(r).to_string(),
            (r.m, r.n, r.k, r.l),
            r.sustained,
        )
    };
    let mut at = HashMap::new();
    let mut out: Vec<Record> = Vec::new();
    for r in records {
        match at.get(&key(&r)) {
            Some(&i) => {
                let kept: &mut Record = &mut out[i];
                if r.date >= kept.date {
                    *kept = r;
                }
            }
            None => {
                at.insert(key(&r), out.len());
                out.push(r);
            }
        }
    }
    out
}

/// The whole file: the header, then one section per GPU in the order they first appear.
pub fn render(records: &[Record]) -> String {
    let mut s = String::from(HEADER);
    if records.is_empty() {
        s.push_str("\nNo measurements yet.\n");
    }
    let mut gpus: Vec<&str> = Vec::new();
    for r in records {
        if !gpus.contains(&r.gpu.as_str()) {
            gpus.push(&r.gpu);
        }
    }
    for gpu in gpus {
        let rows: Vec<&Record> = records.iter().filter(|r| r.gpu == gpu).collect();
        section(&mut s, gpu, &rows);
    }
    s
}

const HEADER: &str = "# Performance

This file is generated: `blockscaled-perf-table` writes it from the JSON Lines that
`blockscaled-run --json FILE` appends, one object per measured row (GPU, date, version, kind,
case, M N K L, times, TFLOP/s, GB/s, fraction of the ceiling, peer). Do not edit it by hand:
measure again and regenerate it. On a GPU machine, after `scripts/stage-gpu.sh` built the staged
folder, `bash stage/perf-md.sh` runs the standard bench sets into `$OUT/perf.jsonl` and writes
`$OUT/PERF.md` (copy it here). The rows behind this file are kept in
[docs/perf-data/](perf-data/), one JSON Lines file per GPU: after a new run on one GPU, replace
its file and run `blockscaled-perf-table docs/perf-data/*.jsonl --out docs/PERF.md`. A case
measured more than once shows its latest measurement. GPUs without a file here (the H100, not
lent since the runner wrote JSON) are measured in the history — what each version changed, the
experiments, the measurements behind them — in [docs/perf-log/](perf-log/).

Times are medians of CUDA-event timings (µs). *% of ceiling* is the larger of TFLOP/s over the
compute ceiling and GB/s over the bandwidth ceiling, both measured on that GPU (once per GPU and
driver, stored beside the tuner's plans: docs/TUNING.md), and which it was; *peer/ours* is the peer's time over ours, timed in the same run (above 1:
we are faster).
";

fn section(s: &mut String, gpu: &str, rows: &[&Record]) {
    let sms = rows.iter().find_map(|r| r.sm_count);
    let _ = write!(s, "\n## {}", cell(gpu));
    if let Some(n) = sms {
        let _ = write!(s, " ({n} SMs)");
    }
    s.push_str("\n\n");
    let dates = span(rows.iter().map(|r| r.date.as_str()));
    let mut versions: Vec<&str> = rows.iter().map(|r| r.crate_version.as_str()).collect();
    versions.sort_unstable();
    versions.dedup();
    let _ = write!(s, "Measured {dates}, blockscaled {}.", versions.join(", "));
    let last = |f: fn(&Record) -> Option<f64>| rows.iter().rev().find_map(|r| f(r));
    let range = |f: fn(&Record) -> Option<f64>| {
        let v: Vec<f64> = rows.iter().filter_map(|r| f(r)).collect();
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (lo.round() != hi.round()).then(|| format!(" (runs: {lo:.0} to {hi:.0})"))
    };
    match (last(|r| r.ceiling_gbs), last(|r| r.ceiling_tflops)) {
        (None, None) => s.push_str(" Ceilings not measured.\n"),
        (gbs, tflops) => {
            let num = |x: Option<f64>| {
                x.map_or_else(|| "not measured".to_string(), |x| format!("{x:.0}"))
            };
            let _ = writeln!(
                s,
                " Ceilings (the latest run's; measured once per GPU and driver and stored beside the tuner's plans): bandwidth {} GB/s \
                 (a 2 GiB device copy, bytes read + written){}; compute {} TFLOP/s (cuBLASLt FP8 at \
                 8192³, best of 10){}.",
                num(gbs),
                range(|r| r.ceiling_gbs).unwrap_or_default(),
                num(tflops),
                range(|r| r.ceiling_tflops).unwrap_or_default()
            );
        }
    }
    let mut kinds: Vec<&str> = KINDS
        .iter()
        .map(|(k, _)| *k)
        .filter(|k| rows.iter().any(|r| r.kind == *k))
        .collect();
    for r in rows {
        if !kinds.contains(&r.kind.as_str()) {
            kinds.push(&r.kind);
        }
    }
    for kind in kinds {
        let _ = writeln!(s, "\n### {}\n", cell(kind));
        if let Some((_, about)) = KINDS.iter().find(|(k, _)| *k == kind) {
            let _ = writeln!(s, "{about}\n");
        }
        table(s, rows.iter().copied().filter(|r| r.kind == kind));
    }
}

/// "D" or "D1 to D2" (dates as YYYY-MM-DD sort as text).
fn span<'a>(dates: impl Iterator<Item = &'a str>) -> String {
    let mut v: Vec<&str> = dates.collect();
    v.sort_unstable();
    match (v.first(), v.last()) {
        (Some(a), Some(b)) if a != b => format!("{a} to {b}"),
        (Some(a), _) => a.to_string(),
        _ => "never".to_string(),
    }
}

/// The case a record measures: its name without the plan it starts with (a run whose plan
/// changed measures the same case).
fn case_name(r: &Record) -> &str {
    let name = r.plan.as_deref().and_then(|p| r.name.strip_prefix(p));
    name.unwrap_or(&r.name).trim()
}

/// Whether `a` (burst) and `b` (sustained) are the same case (of one GPU's table).
fn same_case(a: &Record, b: &Record) -> bool {
    a.kind == b.kind && (a.m, a.n, a.k, a.l) == (b.m, b.n, b.k, b.l) && case_name(a) == case_name(b)
}

fn table<'a>(s: &mut String, rows: impl Iterator<Item = &'a Record>) {
    let rows: Vec<&Record> = rows.collect();
    let (burst, held): (Vec<&Record>, Vec<&Record>) = rows.iter().partition(|r| !r.sustained);
    // Sustained times beside the burst ones; a case measured only under sustained load is a
    // row of its own.
    let column = !held.is_empty();
    let alone = held
        .iter()
        .filter(|h| !burst.iter().any(|b| same_case(b, h)));
    let mut lines: Vec<(&Record, Option<&Record>)> = burst
        .iter()
        .map(|b| (*b, held.iter().copied().find(|h| same_case(b, h))))
        .collect();
    lines.extend(alone.map(|h| (*h, Some(*h))));
    s.push_str(
        "| case | M N K L | ours µs | TFLOP/s | GB/s | % of ceiling (bound) | peer | peer µs | peer/ours |",
    );
    s.push_str(if column {
        " sustained µs (ours / peer) |\n"
    } else {
        "\n"
    });
    s.push_str("|---|---|--:|--:|--:|--:|---|--:|--:|");
    s.push_str(if column { "--:|\n" } else { "\n" });
    for (r, under_load) in lines {
        let dim = |x: usize| {
            if x == 0 {
                "-".to_string()
            } else {
                x.to_string()
            }
        };
        let num = |x: Option<f64>, digits: usize| {
            x.map_or_else(|| "-".to_string(), |x| format!("{x:.digits$}"))
        };
        let ceiling = match (r.ceiling_fraction, r.bound.as_deref()) {
            (Some(f), Some(b)) => format!("{:.1}% ({b})", 100.0 * f),
            (Some(f), None) => format!("{:.1}%", 100.0 * f),
            _ => "-".to_string(),
        };
        let name = if r.sustained {
            format!("{} (sustained only)", r.name)
        } else {
            r.name.clone()
        };
        let _ = write!(
            s,
            "| {} | {} {} {} {} | {} | {} | {} | {} | {} | {} | {} |",
            cell(&name),
            dim(r.m),
            dim(r.n),
            dim(r.k),
            dim(r.l),
            micros(r.us),
            num(r.tflops, 1),
            num(r.gbs, 0),
            ceiling,
            r.peer.as_deref().map_or_else(|| "-".to_string(), cell),
            r.peer_us.map_or_else(|| "-".to_string(), micros),
            r.peer_ratio
                .map_or_else(|| "-".to_string(), |x| format!("{x:.2}×")),
        );
        if column {
            let _ = write!(
                s,
                " {} |",
                under_load.map_or_else(
                    || "-".to_string(),
                    |h| format!(
                        "{} / {}",
                        micros(h.us),
                        h.peer_us.map_or_else(|| "-".to_string(), micros)
                    )
                )
            );
        }
        s.push('\n');
    }
}

/// A time in µs: two decimals below 10 µs, one above.
fn micros(us: f64) -> String {
    if us < 10.0 {
        format!("{us:.2}")
    } else {
        format!("{us:.1}")
    }
}

/// Text safe in a table cell or a heading: no column breaks, line breaks or HTML.
fn cell(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('|', "\\|")
        .replace('<', "&lt;")
        .replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Entry, Record, RunInfo, row};

    fn info(gpu: &str, date: &str) -> RunInfo {
        RunInfo {
            gpu: gpu.into(),
            sm_count: Some(132),
            date: date.into(),
            crate_version: "0.1.0".into(),
            sustained: false,
        }
    }

    fn rec(info: &RunInfo, kind: &str, name: &str, us: f64, peer_us: Option<f64>) -> Record {
        let n = 4096usize;
        let mut r = row(
            name,
            (n, n, 1024, 1),
            (us * 1e-3, 2.0 * (n * n * 1024) as f64, 3.0 * (n * n) as f64),
            peer_us.map(|p| ("cuBLASLt bf16", p * 1e-3)),
        );
        (r.ceiling_tflops, r.ceiling_gbs) = (1200.0, 4300.0);
        Record::new(info, &Entry::new(kind, r)).unwrap()
    }

    /// A small sample as JSON Lines: two GPUs, three kinds, one case measured twice.
    fn sample() -> String {
        let (h200, h100, h200_later) = (
            info("NVIDIA H200", "2026-11-28"),
            info("NVIDIA H100 80GB HBM3", "2026-11-22"),
            info("NVIDIA H200", "2026-11-29"),
        );
        let mut quant = rec(&h200, "quantize", "deepseek-fp8 from bf16", 9.5, None);
        quant.n = 0;
        let lines = [
            rec(
                &h200,
                "grouped",
                "deepseek-fp8 Contiguous G8",
                120.0,
                Some(150.0),
            ),
            rec(
                &h200,
                "fp8",
                "sm90/m128g8c1 deepseek-fp8 (bf16)",
                50.0,
                Some(60.0),
            ),
            rec(
                &h100,
                "fp8",
                "sm90/m128g8c1 deepseek-fp8 (bf16)",
                70.0,
                None,
            ),
            quant,
            rec(
                &h200_later,
                "fp8",
                "sm90/m128g8c1 deepseek-fp8 (bf16)",
                45.0,
                Some(60.0),
            ),
            rec(&h200, "my|kind", "odd | name", 1.0, None),
        ];
        let mut text: String = lines.iter().map(|r| r.to_line() + "\n").collect();
        text.push('\n');
        text
    }

    #[test]
    fn the_latest_line_of_a_case_is_kept() {
        let (records, bad) = parse(&sample(), "sample");
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(records.len(), 6);
        let kept = latest(records);
        assert_eq!(kept.len(), 5);
        let h200_fp8: Vec<&Record> = kept
            .iter()
            .filter(|r| r.gpu == "NVIDIA H200" && r.kind == "fp8")
            .collect();
        assert_eq!(h200_fp8.len(), 1);
        assert!((h200_fp8[0].us - 45.0).abs() < 1e-9);
        assert_eq!(h200_fp8[0].date, "2026-11-29");
        // In the place where the case first appeared.
        assert_eq!(kept[1].kind, "fp8");
        // An older date read later does not replace a newer one.
        let mut old = kept[1].clone();
        old.date = "2026-01-01".into();
        old.us = 1.0;
        let again = latest(vec![kept[1].clone(), old]);
        assert!((again[0].us - 45.0).abs() < 1e-9);
        // A later run of the case on another plan replaces it; another shape does not.
        let mut replanned = kept[1].clone();
        replanned.plan = Some("sm90/m64g16c1".into());
        replanned.name = "sm90/m64g16c1 deepseek-fp8 (bf16)".into();
        replanned.date = "2026-12-01".into();
        let mut other = replanned.clone();
        other.m += 1;
        let mut first = kept[1].clone();
        first.plan = Some("sm90/m128g8c1".into());
        let three = latest(vec![first, replanned, other]);
        assert_eq!(three.len(), 2);
        assert_eq!(three[0].name, "sm90/m64g16c1 deepseek-fp8 (bf16)");
    }

    #[test]
    fn sustained_times_sit_beside_the_burst_times_of_the_same_case() {
        let burst = info("NVIDIA H200", "2026-11-29");
        let held = RunInfo {
            sustained: true,
            ..burst.clone()
        };
        let name = "sm90/m128g8c1 deepseek-fp8 (bf16)";
        let mut only_held = rec(
            &held,
            "fp8",
            "sm90/m128g8c1 fp8-e4m3-row (bf16)",
            80.0,
            None,
        );
        only_held.m = 2048;
        let lines = [
            rec(&burst, "fp8", name, 50.0, Some(60.0)),
            rec(&held, "fp8", name, 53.25, Some(61.5)),
            only_held,
            rec(&burst, "grouped", "deepseek-fp8 Contiguous G8", 100.0, None),
        ];
        let text: String = lines.iter().map(|r| r.to_line() + "\n").collect();
        // The flag is written only where set, and rows without it read as burst rows.
        assert_eq!(text.matches("\"sustained\":true").count(), 2, "{text}");
        assert!(!text.contains("\"sustained\":false"), "{text}");
        let kept = latest(parse(&text, "t").0);
        assert_eq!(
            kept.len(),
            4,
            "a sustained row does not replace the burst one"
        );
        let md = render(&kept);
        let fp8: Vec<&str> = md.lines().filter(|l| l.starts_with("| sm90/")).collect();
        assert_eq!(fp8.len(), 2, "{md}");
        assert!(
            fp8[0].starts_with(&format!("| {name} | 4096 4096 1024 1 | 50.0 |")),
            "{md}"
        );
        assert!(fp8[0].ends_with("| 53.2 / 61.5 |"), "{}", fp8[0]);
        assert!(
            fp8[1].contains("(sustained only) | 2048 4096 1024 1 | 80.0 |"),
            "{}",
            fp8[1]
        );
        assert!(fp8[1].ends_with("| 80.0 / - |"), "{}", fp8[1]);
        // The column only in the tables that have sustained rows.
        assert_eq!(
            md.matches("peer/ours | sustained µs (ours / peer) |")
                .count(),
            1
        );
        let grouped = md
            .lines()
            .find(|l| l.starts_with("| deepseek-fp8"))
            .unwrap();
        assert!(grouped.ends_with("| - | - | - |"), "{grouped}");
    }

    #[test]
    fn lines_that_are_not_records_are_reported() {
        let text = format!("{}{{\"gpu\": \"x\"\nnot json\n", sample());
        let (records, bad) = parse(&text, "runs.jsonl");
        assert_eq!(records.len(), 6);
        assert_eq!(bad.len(), 2, "{bad:?}");
        assert!(bad[0].starts_with("runs.jsonl:8:"), "{bad:?}");
    }

    #[test]
    fn markdown_has_a_section_per_gpu_and_a_table_per_kind() {
        let md = render(&latest(parse(&sample(), "sample").0));
        assert!(md.starts_with("# Performance\n"));
        assert!(md.contains("blockscaled-run --json"), "{md}");
        assert!(md.contains("docs/perf-log/"), "{md}");
        assert!(md.contains("bash stage/perf-md.sh"), "{md}");
        let h200 = md
            .find("\n## NVIDIA H200 (132 SMs)\n")
            .expect("H200 section");
        let h100 = md
            .find("\n## NVIDIA H100 80GB HBM3 (132 SMs)\n")
            .expect("H100 section");
        assert!(h200 < h100);
        let (h200_md, h100_md) = (&md[h200..h100], &md[h100..]);
        assert!(h200_md.contains("Measured 2026-11-28 to 2026-11-29, blockscaled 0.1.0."));
        assert!(h200_md.contains("bandwidth 4300 GB/s"), "{h200_md}");
        assert!(h200_md.contains("compute 1200 TFLOP/s"), "{h200_md}");
        // The known kinds in their order, then the others; descriptions under the headings.
        let at = |s: &str| {
            h200_md
                .find(s)
                .unwrap_or_else(|| panic!("{s} in {h200_md}"))
        };
        assert!(at("### fp8\n") < at("### grouped\n"));
        assert!(at("### grouped\n") < at("### quantize\n"));
        assert!(at("### quantize\n") < at("### my\\|kind\n"));
        assert!(h200_md.contains("### grouped\n\nGrouped GEMM"));
        // The table: header, alignment, one row per case.
        let header = "| case | M N K L | ours µs | TFLOP/s | GB/s | % of ceiling (bound) | peer | \
                      peer µs | peer/ours |";
        assert_eq!(md.matches(header).count(), 5, "{md}");
        let fp8 = h200_md
            .lines()
            .find(|l| l.starts_with("| sm90/m128g8c1"))
            .unwrap();
        let tf = 2.0 * 4096.0 * 4096.0 * 1024.0 / 45e-6 / 1e12;
        assert_eq!(
            fp8,
            format!(
                "| sm90/m128g8c1 deepseek-fp8 (bf16) | 4096 4096 1024 1 | 45.0 | {tf:.1} | {:.0} | \
                 {:.1}% (compute) | cuBLASLt bf16 | 60.0 | 1.33× |",
                3.0 * 4096.0 * 4096.0 / 45e-6 / 1e9,
                100.0 * tf / 1200.0
            )
        );
        assert_eq!(h200_md.matches("| sm90/m128g8c1").count(), 1);
        // No peer, no N, small times, escaped text.
        assert!(
            h200_md.contains("| deepseek-fp8 from bf16 | 4096 - 1024 1 | 9.50 |"),
            "{h200_md}"
        );
        assert!(
            h200_md.contains("| odd \\| name | 4096 4096 1024 1 | 1.00 |"),
            "{h200_md}"
        );
        assert!(
            h100_md.contains("| 70.0 |") && h100_md.contains("| - | - | - |"),
            "{h100_md}"
        );
        assert!(render(&[]).contains("No measurements yet."));
    }
}
