//! Machine-readable rows: every row the runner measures, as one JSON object a line (JSON Lines).
//! `blockscaled-run --json FILE` appends them to FILE beside the printed table;
//! `blockscaled-perf-table` ([`crate::perf_md`]) turns such files into docs/PERF.md's tables.
//!
//! A record holds where and when it was measured (the GPU's name and SM count, the UTC date, the
//! crate's version), what (a kind, a name, M N K L) and the numbers the printed table shows: our
//! median time, TFLOP/s, GB/s, the fraction of the bounding ceiling (the GPU's, stored or
//! measured when the run starts: [`crate::ceilings`]), and the peer's time and ratio where one
//! was timed.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use blockscaled::{Gpu, Plan};
use serde::{Deserialize, Serialize};

use crate::table::{Bound, Row};

/// What every row of one run shares: the GPU, the date, the version.
#[derive(Clone, Debug, PartialEq)]
pub struct RunInfo {
    /// The device's name as the driver reports it (`Gpu::name`).
    pub gpu: String,
    pub sm_count: Option<u32>,
    /// UTC, YYYY-MM-DD.
    pub date: String,
    /// The benches crate's version (the workspace's: the library's too).
    pub crate_version: String,
    /// Whether every timing ran after [`crate::timing::SUSTAINED_LAUNCHES`] launches of its own
    /// (the runner's `--sustained`) rather than after a short warm-up.
    pub sustained: bool,
}

impl RunInfo {
    /// `gpu`'s name and SM count, today's UTC date, this crate's version.
    pub fn of(gpu: &Gpu) -> RunInfo {
        RunInfo::named(gpu.name(), Some(gpu.sm_count()))
    }

    /// A run on the GPU of this name (for modes that hand their handle on), dated today.
    pub fn named(gpu: &str, sm_count: Option<u32>) -> RunInfo {
        RunInfo {
            gpu: gpu.to_string(),
            sm_count,
            date: utc_date(SystemTime::now()),
            crate_version: env!("CARGO_PKG_VERSION").to_string(),
            sustained: crate::timing::sustained() > 0,
        }
    }
}

/// One measured row with what its record adds to the printed table's [`Row`].
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// The runner's mode, or for a dense GEMM the kernel family ([`dense_kind`]).
    pub kind: String,
    pub row: Row,
    /// The plan that ran, where one did.
    pub plan: Option<String>,
    /// What the columns do not say (a second comparison, a check's outcome).
    pub note: Option<String>,
}

impl Entry {
    pub fn new(kind: &str, row: Row) -> Entry {
        Entry {
            kind: kind.to_string(),
            row,
            plan: None,
            note: None,
        }
    }

    pub fn plan(self, plan: impl Into<String>) -> Entry {
        Entry {
            plan: Some(plan.into()),
            ..self
        }
    }

    pub fn note(self, note: impl Into<String>) -> Entry {
        Entry {
            note: Some(note.into()),
            ..self
        }
    }
}

/// A [`Row`] with the run's ceilings (0, none, where not measured).
/// `peer`: the peer's name and median time (ms).
pub fn row(
    name: impl Into<String>,
    shape: (usize, usize, usize, usize),
    (ms, flops, bytes): (f64, f64, f64),
    peer: Option<(&str, f64)>,
) -> Row {
    let (ceiling_tflops, ceiling_gbs) =
        crate::ceilings::get().map_or((0.0, 0.0), |c| (c.tflops, c.gbs));
    Row {
        name: name.into(),
        shape,
        ms,
        flops,
        bytes,
        peer_ms: peer.map(|p| p.1),
        peer_name: peer.map_or_else(|| "-".to_string(), |p| p.0.to_string()),
        ceiling_tflops,
        ceiling_gbs,
    }
}

/// The kind of a dense GEMM's record: its kernel family.
pub fn dense_kind(plan: &Plan) -> &'static str {
    match plan {
        Plan::Reference => "reference",
        Plan::Sm90Fp8(_) => "fp8",
        Plan::Sm90Mx(_) => "mx",
        Plan::Sm90MxFp8(_) => "fold",
        Plan::Sm90W4(_) => "w4",
        Plan::Sm90Half(_) => "16-bit",
        _ => "dense",
    }
}

/// One line of the JSON Lines file. Numbers that do not exist (no FLOPs, no peer, no ceiling
/// measured) are null.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub gpu: String,
    pub sm_count: Option<u32>,
    pub date: String,
    pub crate_version: String,
    pub kind: String,
    pub name: String,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub l: usize,
    /// Our median time, µs.
    pub us: f64,
    pub tflops: Option<f64>,
    pub gbs: Option<f64>,
    /// "compute" or "bandwidth": the ceiling the row is nearer.
    pub bound: Option<String>,
    /// Of the bounding ceiling (1.0 = at it).
    pub ceiling_fraction: Option<f64>,
    pub ceiling_tflops: Option<f64>,
    pub ceiling_gbs: Option<f64>,
    pub peer: Option<String>,
    /// The peer's median time, µs.
    pub peer_us: Option<f64>,
    /// The peer's time over ours: above 1, we are faster.
    pub peer_ratio: Option<f64>,
    pub plan: Option<String>,
    pub note: Option<String>,
    /// Timed under sustained load ([`RunInfo::sustained`]); absent (false) in rows written
    /// before the field existed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sustained: bool,
}

/// `x` where it is a finite number above zero.
fn positive(x: f64) -> Option<f64> {
    (x.is_finite() && x > 0.0).then_some(x)
}

impl Record {
    /// The record of `e` in the run `info`; `None` for a row without a time (a failed case).
    pub fn new(info: &RunInfo, e: &Entry) -> Option<Record> {
        let r = &e.row;
        let us = positive(r.ms)? * 1e3;
        let (m, n, k, l) = r.shape;
        let fraction = r
            .ceiling_fraction()
            .filter(|(f, _)| f.is_finite() && (r.flops > 0.0 || r.bytes > 0.0));
        let peer_ms = r.peer_ms.and_then(positive);
        let peer = match r.peer_name.as_str() {
            "" | "-" => None,
            p => Some(p.to_string()),
        };
        Some(Record {
            gpu: info.gpu.clone(),
            sm_count: info.sm_count,
            date: info.date.clone(),
            crate_version: info.crate_version.clone(),
            kind: e.kind.clone(),
            name: r.name.clone(),
            m,
            n,
            k,
            l,
            us,
            tflops: positive(r.flops).map(|_| r.tflops()),
            gbs: positive(r.bytes).map(|_| r.gbs()),
            bound: fraction.map(|(_, b)| match b {
                Bound::Compute => "compute".to_string(),
                Bound::Bandwidth => "bandwidth".to_string(),
            }),
            ceiling_fraction: fraction.map(|(f, _)| f),
            ceiling_tflops: positive(r.ceiling_tflops),
            ceiling_gbs: positive(r.ceiling_gbs),
            peer,
            peer_us: peer_ms.map(|p| p * 1e3),
            peer_ratio: peer_ms.map(|p| p / r.ms),
            plan: e.plan.clone(),
            note: e.note.clone(),
            sustained: info.sustained,
        })
    }

    /// The record as one line of JSON (no newline).
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).expect("a record of strings and numbers serializes")
    }
}

/// Where `--json` writes: nowhere, or a file records are appended to (created if absent).
pub struct JsonSink {
    out: Option<(File, PathBuf)>,
    info: RunInfo,
}

impl JsonSink {
    /// A sink appending to `path` (none: records are dropped), for the run `info`.
    pub fn open(path: Option<&Path>, info: RunInfo) -> Result<JsonSink, String> {
        let out = match path {
            None => None,
            Some(p) => {
                let f = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|x| format!("--json {}: {x}", p.display()))?;
                Some((f, p.to_path_buf()))
            }
        };
        Ok(JsonSink { out, info })
    }

    /// Appends one line per entry that has a time, each written through at once (a run cut short
    /// keeps what it measured).
    pub fn emit(&mut self, entries: &[Entry]) -> Result<(), String> {
        let Some((file, path)) = &mut self.out else {
            return Ok(());
        };
        for r in entries.iter().filter_map(|e| Record::new(&self.info, e)) {
            // One write per line: a run killed between two leaves no partial line.
            let line = r.to_line() + "\n";
            file.write_all(line.as_bytes())
                .and_then(|_| file.flush())
                .map_err(|x| format!("--json {}: {x}", path.display()))?;
        }
        Ok(())
    }
}

/// The UTC date of `t`, YYYY-MM-DD (1970-01-01 for a time before the epoch).
pub fn utc_date(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The proleptic Gregorian date of day `z` after 1970-01-01 (H. Hinnant's `civil_from_days`:
/// eras of 400 years, years starting on 1 March so that the leap day is the year's last).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn info() -> RunInfo {
        RunInfo {
            gpu: "NVIDIA H200".into(),
            sm_count: Some(132),
            date: "2026-11-28".into(),
            crate_version: "0.1.0".into(),
            sustained: false,
        }
    }

    fn sample(peer: Option<(&str, f64)>) -> Row {
        let n = 4096usize;
        Row {
            ceiling_tflops: 1000.0,
            ceiling_gbs: 4000.0,
            ..row(
                "sm90/m128g8c1 deepseek-fp8 (bf16)",
                (n, n, n, 1),
                (0.2, 2.0 * (n * n * n) as f64, 3.0 * (n * n) as f64),
                peer,
            )
        }
    }

    #[test]
    fn dates_are_utc_calendar_days() {
        let day = |s: u64| utc_date(UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(day(0), "1970-01-01");
        assert_eq!(day(86_399), "1970-01-01");
        assert_eq!(day(951_782_400), "2000-02-29");
        assert_eq!(day(1_709_164_800), "2024-02-29");
        assert_eq!(day(1_767_225_600), "2026-01-01");
        assert_eq!(day(1_795_824_000 + 3_600), "2026-11-28");
        assert_eq!(day(4_102_444_800), "2100-01-01");
        // Every day of 1970..2100 follows the one before it.
        let mut prev = civil_from_days(0);
        for z in 1..47_482 {
            let (y, m, d) = civil_from_days(z);
            let next_month = if prev.1 == 12 {
                (prev.0 + 1, 1, 1)
            } else {
                (prev.0, prev.1 + 1, 1)
            };
            assert!(
                (y, m, d) == (prev.0, prev.1, prev.2 + 1) || (y, m, d) == next_month,
                "day {z}: {prev:?} then {:?}",
                (y, m, d)
            );
            assert!(d <= 31 && (m != 2 || d <= 29));
            prev = (y, m, d);
        }
        assert_eq!(prev, (2099, 12, 31));
    }

    #[test]
    fn records_carry_the_rows_numbers() {
        let e = Entry::new("fp8", sample(Some(("cuBLASLt fp8 1x128/128x128", 0.25))))
            .plan("sm90/m128g8c1");
        let r = Record::new(&info(), &e).unwrap();
        assert_eq!((r.m, r.n, r.k, r.l), (4096, 4096, 4096, 1));
        assert!((r.us - 200.0).abs() < 1e-9);
        assert!((r.tflops.unwrap() - e.row.tflops()).abs() < 1e-9);
        assert!((r.gbs.unwrap() - e.row.gbs()).abs() < 1e-9);
        assert_eq!(r.bound.as_deref(), Some("compute"));
        assert!((r.ceiling_fraction.unwrap() - e.row.tflops() / 1000.0).abs() < 1e-12);
        assert_eq!(r.peer.as_deref(), Some("cuBLASLt fp8 1x128/128x128"));
        assert!((r.peer_us.unwrap() - 250.0).abs() < 1e-9);
        assert!((r.peer_ratio.unwrap() - 1.25).abs() < 1e-12);
        assert_eq!(r.plan.as_deref(), Some("sm90/m128g8c1"));
        // One line that reads back as the same record.
        let line = r.to_line();
        assert!(!line.contains('\n'));
        assert!(line.starts_with("{\"gpu\":\"NVIDIA H200\",\"sm_count\":132,\"date\":"));
        assert_eq!(serde_json::from_str::<Record>(&line).unwrap(), r);
    }

    #[test]
    fn missing_numbers_are_null_and_failed_rows_are_dropped() {
        let mut no_peer = sample(None);
        no_peer.ceiling_tflops = 0.0;
        no_peer.ceiling_gbs = 0.0;
        no_peer.flops = 0.0;
        let r = Record::new(&info(), &Entry::new("quantize", no_peer.clone())).unwrap();
        assert_eq!((&r.peer, r.peer_us, r.peer_ratio), (&None, None, None));
        assert_eq!(
            (r.tflops, &r.bound, r.ceiling_fraction),
            (None, &None, None)
        );
        assert_eq!((r.ceiling_tflops, r.ceiling_gbs), (None, None));
        let line = r.to_line();
        assert!(line.contains("\"peer_us\":null"), "{line}");
        assert!(line.contains("\"tflops\":null"), "{line}");
        // A quantizer's row (bytes, no FLOPs) is bandwidth bound.
        no_peer.ceiling_gbs = 4000.0;
        let q = Record::new(&info(), &Entry::new("quantize", no_peer.clone())).unwrap();
        assert_eq!(q.bound.as_deref(), Some("bandwidth"));
        no_peer.ms = f64::NAN;
        assert_eq!(Record::new(&info(), &Entry::new("quantize", no_peer)), None);
        // Names with quotes, backslashes and control characters stay one valid line.
        let mut odd = sample(None);
        odd.name = "a \"b\" \\ c\td\n→".into();
        let r = Record::new(&info(), &Entry::new("fp8", odd)).unwrap();
        let line = r.to_line();
        assert!(!line.contains('\n'));
        assert_eq!(serde_json::from_str::<Record>(&line).unwrap().name, r.name);
    }

    #[test]
    fn the_sink_appends_one_line_per_timed_entry() {
        let path =
            std::env::temp_dir().join(format!("blockscaled-report-{}.jsonl", std::process::id()));
        let _ = std::fs::remove_file(&path);
        for _ in 0..2 {
            let mut s = JsonSink::open(Some(&path), info()).unwrap();
            let mut failed = sample(None);
            failed.ms = f64::NAN;
            s.emit(&[Entry::new("fp8", sample(None)), Entry::new("fp8", failed)])
                .unwrap();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(text.lines().count(), 2, "{text}");
        let mut none = JsonSink::open(None, info()).unwrap();
        none.emit(&[Entry::new("fp8", sample(None))]).unwrap();
    }
}
