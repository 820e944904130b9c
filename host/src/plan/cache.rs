//! The tuner's persisted cache of plans: for a call description (the GPU, the driver, this
//! crate's version, both operands' formats and scale layouts, the shape with M bucketed, the
//! groups), the plan the tuner timed fastest. One JSON file:
//!
//! ```json
//! {"format": 1, "entries": {"<key>": {"plan": "fp8 2 1 128 0 2 1 8 132 1", "us": 41.2}},
//!  "ceilings": {"NVIDIA H200|132|13000": {"tflops": 1453.0, "gbs": 4120.0}}}
//! ```
//!
//! Beside the plans it keeps each GPU's measured ceilings ([`Ceilings`]: the copy rate and the
//! peer's best GEMM rate, measured once per GPU and driver by the bench runner and the tuner),
//! which the runners' "fraction of the ceiling" is taken of.
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

/// What a plan's speed depends on in a call, besides the machine: both operands' formats and
/// scale major orders, the shape with M bucketed ([`m_bucket`]), and the groups. Cheap to make
/// and to hash (a call's lookup in [`TunedPlans`]); [`CallKey::text`] is the cache file's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CallKey {
    a: (OperandFormat, bool),
    b: (OperandFormat, bool),
    m_bucket: usize,
    n: usize,
    k: usize,
    l: usize,
    groups: usize,
}

impl CallKey {
    /// The key of a call of `a` and `b` of `shape` (`groups`: a grouped call's count).
    pub fn of(
        (a, b): (&MatrixDesc, &MatrixDesc),
        shape: &GemmShape,
        groups: Option<usize>,
    ) -> CallKey {
        // M-major scales (a column of scale blocks is contiguous) or K-major.
        let m_major =
            |d: &MatrixDesc| d.scale_layout.row_stride == 1 && d.scale_layout.row_blocks > 1;
        CallKey {
            a: (a.format, m_major(a)),
            b: (b.format, m_major(b)),
            m_bucket: m_bucket(shape.m),
            n: shape.n,
            k: shape.k,
            l: shape.l,
            groups: groups.unwrap_or(0),
        }
    }

    /// The cache file's key of this call on `machine` with this crate's version.
    pub fn text(&self, machine: &Machine) -> String {
        let fmt = |(f, m_major): (OperandFormat, bool)| {
            format!("{f}/{}", if m_major { "m" } else { "k" })
        };
        format!(
            "{}|{}|{}|{}|{}|{}|m{}|n{}|k{}|l{}|g{}",
            machine.gpu,
            machine.sm_count,
            machine.driver,
            env!("CARGO_PKG_VERSION"),
            fmt(self.a),
            fmt(self.b),
            self.m_bucket,
            self.n,
            self.k,
            self.l,
            self.groups,
        )
    }
}

/// The key of a call: everything a plan's speed depends on, as text (stable within one crate
/// version, which it names): [`CallKey::text`] of [`CallKey::of`].
pub fn key(
    machine: &Machine,
    descs: (&MatrixDesc, &MatrixDesc),
    shape: &GemmShape,
    groups: Option<usize>,
) -> String {
    CallKey::of(descs, shape, groups).text(machine)
}

/// A GPU's tuned plans, as a call looks them up: the cache read once, and each call key's
/// answer kept after its first lookup, so a later call of the same key costs a hash of a few
/// numbers, not the text key's formatting (the target: no measurable host time).
#[derive(Debug)]
pub struct TunedPlans {
    machine: Machine,
    cache: PlanCache,
    seen: std::sync::Mutex<std::collections::HashMap<CallKey, Option<Plan>>>,
}

impl TunedPlans {
    /// Keys remembered at most (then forgotten all at once): far more than a model's shapes.
    const SEEN_MAX: usize = 4096;

    /// `cache`'s plans for `machine`.
    pub fn new(machine: Machine, cache: PlanCache) -> TunedPlans {
        TunedPlans {
            machine,
            cache,
            seen: Default::default(),
        }
    }

    /// The tuned plan of `key`, if the cache has one.
    pub fn get(&self, key: &CallKey) -> Option<Plan> {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = seen.get(key) {
            return *p;
        }
        let plan = self.cache.get(&key.text(&self.machine)).map(|e| e.plan);
        if seen.len() >= Self::SEEN_MAX {
            seen.clear();
        }
        seen.insert(*key, plan);
        plan
    }
}

/// The key of a GPU's ceilings: its name, SMs and driver (not this crate's version: they are
/// the machine's).
pub fn machine_key(machine: &Machine) -> String {
    format!("{}|{}|{}", machine.gpu, machine.sm_count, machine.driver)
}

/// A GPU's measured ceilings: what a "fraction of the ceiling" is taken of.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ceilings {
    /// The peer's best GEMM rate (cuBLASLt's FP8 GEMM), TFLOP/s.
    pub tflops: f64,
    /// A device copy's bytes read and written per second, GB/s.
    pub gbs: f64,
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
    contents: Contents,
    warnings: Vec<String>,
}

/// What a cache file holds.
#[derive(Debug, Default)]
struct Contents {
    entries: BTreeMap<String, Entry>,
    ceilings: BTreeMap<String, Ceilings>,
}

impl PlanCache {
    /// The cache at `path` (empty where there is no file; a file it cannot read is a warning
    /// and an empty cache).
    pub fn open(path: &Path) -> PlanCache {
        let (contents, warnings) = match std::fs::read_to_string(path) {
            Ok(text) => parse(&text, path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (Contents::default(), Vec::new()),
            Err(e) => (
                Contents::default(),
                vec![format!(
                    "{}: not read ({e}); planning without it",
                    path.display()
                )],
            ),
        };
        PlanCache {
            path: Some(path.to_path_buf()),
            contents,
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
        self.contents.entries.get(key)
    }

    /// How many plans it holds.
    pub fn len(&self) -> usize {
        self.contents.entries.len()
    }

    /// Whether it holds no plan.
    pub fn is_empty(&self) -> bool {
        self.contents.entries.is_empty()
    }

    /// Records the plan tuned for `key` (in memory; [`PlanCache::save`] writes it).
    pub fn insert(&mut self, key: String, entry: Entry) {
        self.contents.entries.insert(key, entry);
    }

    /// The ceilings stored for `machine`.
    pub fn ceilings(&self, machine: &Machine) -> Option<Ceilings> {
        self.contents.ceilings.get(&machine_key(machine)).copied()
    }

    /// Records `machine`'s measured ceilings (in memory; [`PlanCache::save`] writes them).
    pub fn set_ceilings(&mut self, machine: &Machine, c: Ceilings) {
        self.contents.ceilings.insert(machine_key(machine), c);
    }

    /// Writes the cache to its file: what is on disk now, read again and merged under this
    /// cache's entries and ceilings, into a new file renamed over the old one.
    pub fn save(&self) -> std::io::Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let mut merged = match std::fs::read_to_string(path) {
            Ok(text) => parse(&text, path).0,
            Err(_) => Contents::default(),
        };
        merged.entries.extend(
            self.contents
                .entries
                .iter()
                .map(|(k, e)| (k.clone(), e.clone())),
        );
        merged.ceilings.extend(self.contents.ceilings.clone());
        let mut entries = Map::new();
        for (k, e) in &merged.entries {
            entries.insert(k.clone(), json!({"plan": e.plan.to_text(), "us": e.us}));
        }
        let mut ceilings = Map::new();
        for (k, c) in &merged.ceilings {
            ceilings.insert(k.clone(), json!({"tflops": c.tflops, "gbs": c.gbs}));
        }
        let file = json!({"format": FORMAT, "entries": entries, "ceilings": ceilings});
        let text = serde_json::to_string_pretty(&file).map_err(std::io::Error::other)?;
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

/// The entries and ceilings of a cache file's text, and what was wrong with it.
fn parse(text: &str, path: &Path) -> (Contents, Vec<String>) {
    let at = path.display();
    let mut out = Contents::default();
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            let w = format!("{at}: not a plan cache ({e}); planning without it");
            return (out, vec![w]);
        }
    };
    match value.get("format").and_then(Value::as_u64) {
        Some(FORMAT) => {}
        f => {
            let w = format!("{at}: format {f:?}, not {FORMAT}; planning without it");
            return (out, vec![w]);
        }
    }
    let Some(map) = value.get("entries").and_then(Value::as_object) else {
        return (out, vec![format!("{at}: no entries; planning without it")]);
    };
    let mut warnings = Vec::new();
    // Ceilings: optional (files of plans alone have none); a bad one is left out.
    let rate = |v: &Value, name: &str| {
        v.get(name)
            .and_then(Value::as_f64)
            .filter(|x| x.is_finite() && *x > 0.0)
    };
    if let Some(cs) = value.get("ceilings").and_then(Value::as_object) {
        for (k, v) in cs {
            match (rate(v, "tflops"), rate(v, "gbs")) {
                (Some(tflops), Some(gbs)) => {
                    out.ceilings.insert(k.clone(), Ceilings { tflops, gbs });
                }
                _ => warnings.push(format!("{at}: the ceilings of {k} not read; left out")),
            }
        }
    }
    let entries = &mut out.entries;
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
    if bad > 0 {
        warnings.push(format!(
            "{at}: {bad} entries not read (another version's plans?); kept the rest"
        ));
    }
    (out, warnings)
}

#[cfg(test)]
mod tests;
