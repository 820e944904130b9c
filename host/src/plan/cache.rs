//! The tuner's persisted cache of plans: for a call description (the GPU, the driver, this
//! crate's version, both operands' formats and scale layouts, the shape with M bucketed, the
//! groups), the plan the tuner timed fastest. One JSON file:
//!
//! ```json
//! {"format": 1, "entries": {"<key>": {"plan": "fp8 2 1 128 0 2 1 8 132 1", "us": 41.2}}}
//! ```
//!
//! A file that cannot be read as this format is a warning ([`PlanCache::warnings`]) and an empty
//! cache, never an error or a panic: the heuristic then plans every call. A key names this crate's
//! version, so entries an older version wrote are never taken. Saving writes a new file beside
//! the old one and renames it over it (atomic on one filesystem), after merging what is on disk
//! then: processes that save at once each leave a whole file, the last one's entries winning
//! where both wrote the same key.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use super::Plan;
use crate::format::OperandFormat;
use crate::matrix::{GemmShape, MatrixDesc};

/// The file format this code reads and writes.
pub const FORMAT: u64 = 1;
/// The environment variable naming the cache file (`off`: no cache).
pub const ENV_PATH: &str = "BLOCKSCALED_TUNE_CACHE";

/// Where the cache lives: [`ENV_PATH`] where set (`None` where it is `off` or empty), else
/// `$XDG_CACHE_HOME/blockscaled/plans.json` or `$HOME/.cache/blockscaled/plans.json`.
pub fn default_path() -> Option<PathBuf> {
    let var = std::env::var_os;
    path_from(var(ENV_PATH), var("XDG_CACHE_HOME"), var("HOME"))
}

/// [`default_path`] of these variables' values.
fn path_from(
    named: Option<OsString>,
    xdg: Option<OsString>,
    home: Option<OsString>,
) -> Option<PathBuf> {
    match named {
        Some(v) if v == "off" || v.is_empty() => None,
        Some(v) => Some(PathBuf::from(v)),
        None => {
            let base = xdg
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .or_else(|| home.map(|h| PathBuf::from(h).join(".cache")))?;
            Some(base.join("blockscaled").join("plans.json"))
        }
    }
}

/// The GPU and driver a plan was timed on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Machine {
    /// The GPU's name (`NVIDIA H200`).
    pub gpu: String,
    /// Its SMs.
    pub sm_count: u32,
    /// The driver's CUDA version (`cuDriverGetVersion`: 13000 for 13.0).
    pub driver: i32,
}

/// Rows of M that share a cache entry: powers of two to 256, then multiples of 256 (the tiles'
/// rows are 16 to 256).
pub fn m_bucket(m: usize) -> usize {
    if m <= 256 {
        m.max(1).next_power_of_two()
    } else {
        m.div_ceil(256) * 256
    }
}

/// The key of a call: everything a plan's speed depends on, as text (stable within one crate
/// version, which it names).
pub fn key(
    machine: &Machine,
    (a, b): (&MatrixDesc, &MatrixDesc),
    shape: &GemmShape,
    groups: Option<usize>,
) -> String {
    let fmt = |f: &OperandFormat, d: &MatrixDesc| {
        let l = &d.scale_layout;
        let major = if l.row_stride == 1 && l.row_blocks > 1 {
            "m"
        } else {
            "k"
        };
        format!("{f}/{major}")
    };
    format!(
        "{}|{}|{}|{}|{}|{}|m{}|n{}|k{}|l{}|g{}",
        machine.gpu,
        machine.sm_count,
        machine.driver,
        env!("CARGO_PKG_VERSION"),
        fmt(&a.format, a),
        fmt(&b.format, b),
        m_bucket(shape.m),
        shape.n,
        shape.k,
        shape.l,
        groups.unwrap_or(0),
    )
}

/// One tuned plan and its time (µs, the tuner's median).
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// The plan.
    pub plan: Plan,
    /// Its time when tuned (µs).
    pub us: f64,
}

/// The cache in memory, read from its file.
#[derive(Debug, Default)]
pub struct PlanCache {
    path: Option<PathBuf>,
    entries: BTreeMap<String, Entry>,
    warnings: Vec<String>,
}

impl PlanCache {
    /// The cache at `path` (empty where there is no file; a file it cannot read is a warning
    /// and an empty cache).
    pub fn open(path: &Path) -> PlanCache {
        let (entries, warnings) = match std::fs::read_to_string(path) {
            Ok(text) => parse(&text, path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (BTreeMap::new(), Vec::new()),
            Err(e) => (
                BTreeMap::new(),
                vec![format!(
                    "{}: not read ({e}); planning without it",
                    path.display()
                )],
            ),
        };
        PlanCache {
            path: Some(path.to_path_buf()),
            entries,
            warnings,
        }
    }

    /// The cache at [`default_path`], or none.
    pub fn open_default() -> Option<PlanCache> {
        default_path().map(|p| PlanCache::open(&p))
    }

    /// What reading the file found wrong (each line names the file).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The tuned plan of `key`.
    pub fn get(&self, key: &str) -> Option<&Entry> {
        self.entries.get(key)
    }

    /// How many plans it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds no plan.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Records the plan tuned for `key` (in memory; [`PlanCache::save`] writes it).
    pub fn insert(&mut self, key: String, entry: Entry) {
        self.entries.insert(key, entry);
    }

    /// Writes the cache to its file: what is on disk now, read again and merged under this
    /// cache's entries, into a new file renamed over the old one.
    pub fn save(&self) -> std::io::Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let mut merged = match std::fs::read_to_string(path) {
            Ok(text) => parse(&text, path).0,
            Err(_) => BTreeMap::new(),
        };
        merged.extend(self.entries.iter().map(|(k, e)| (k.clone(), e.clone())));
        let mut entries = Map::new();
        for (k, e) in &merged {
            entries.insert(k.clone(), json!({"plan": e.plan.to_text(), "us": e.us}));
        }
        let text = serde_json::to_string_pretty(&json!({"format": FORMAT, "entries": entries}))
            .map_err(std::io::Error::other)?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        // (A name of this process and moment: concurrent savers never share a temporary file.)
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let tmp = path.with_extension(format!("tmp.{}.{nanos}", std::process::id()));
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, path).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    }
}

/// The entries of a cache file's text, and what was wrong with it.
fn parse(text: &str, path: &Path) -> (BTreeMap<String, Entry>, Vec<String>) {
    let at = path.display();
    let mut entries = BTreeMap::new();
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            let w = format!("{at}: not a plan cache ({e}); planning without it");
            return (entries, vec![w]);
        }
    };
    match value.get("format").and_then(Value::as_u64) {
        Some(FORMAT) => {}
        f => {
            let w = format!("{at}: format {f:?}, not {FORMAT}; planning without it");
            return (entries, vec![w]);
        }
    }
    let Some(map) = value.get("entries").and_then(Value::as_object) else {
        return (
            entries,
            vec![format!("{at}: no entries; planning without it")],
        );
    };
    let mut bad = 0;
    for (k, v) in map {
        let plan = v
            .get("plan")
            .and_then(Value::as_str)
            .and_then(Plan::from_text);
        let us = v
            .get("us")
            .and_then(Value::as_f64)
            .filter(|u| u.is_finite());
        match (plan, us) {
            (Some(plan), Some(us)) => {
                entries.insert(k.clone(), Entry { plan, us });
            }
            _ => bad += 1,
        }
    }
    let warnings = if bad > 0 {
        vec![format!(
            "{at}: {bad} entries not read (another version's plans?); kept the rest"
        )]
    } else {
        Vec::new()
    };
    (entries, warnings)
}

#[cfg(test)]
mod tests;
