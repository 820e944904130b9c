//! The builder: what to build (targets, launch bounds, the shared-memory symbol) and the steps
//! of the crate's documentation run for each target.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::ptx::{Bounds, edit_ptx};
use crate::ptxas::{assemble, find_ptxas, ptxas_version, spilling_kernels};
use crate::rustc::{Toolchain, compile};
use crate::{
    Arch, BuildError, BuiltPtx, PINNED_PTXAS_VERSION, PINNED_TOOLCHAIN, PTXAS_FLAGS, nvdisasm,
};

/// The kernel-crate builder (the shape of Rust-CUDA's `cuda_builder`).
#[derive(Clone, Debug)]
pub struct Builder {
    crate_path: PathBuf,
    archs: Vec<Arch>,
    out_dir: Option<PathBuf>,
    shared: Option<(String, u32)>,
    bounds: BTreeMap<String, Bounds>,
    require_ptxas: bool,
    cfgs: Vec<String>,
}

impl Builder {
    /// `crate_path`: the kernel crate's folder (relative paths are taken from the current dir,
    /// which is the package root inside a build script).
    pub fn new(crate_path: impl AsRef<Path>) -> Self {
        Builder {
            crate_path: crate_path.as_ref().to_path_buf(),
            archs: Vec::new(),
            out_dir: None,
            shared: None,
            bounds: BTreeMap::new(),
            require_ptxas: std::env::var_os("BLOCKSCALED_REQUIRE_PTXAS").is_some(),
            cfgs: Vec::new(),
        }
    }

    /// Compiles the kernel crate with `--cfg spec` (e.g. `name="value"`) as well: a build
    /// variant the crate's code selects with `cfg!`, such as a planted error for the tests.
    pub fn cfg(mut self, spec: impl Into<String>) -> Self {
        self.cfgs.push(spec.into());
        self
    }

    /// Adds a target; each gets its own PTX.
    pub fn arch(mut self, arch: Arch) -> Self {
        if !self.archs.contains(&arch) {
            self.archs.push(arch);
        }
        self
    }

    /// Where the PTX and reports go (default: `OUT_DIR`).
    pub fn out_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.out_dir = Some(dir.as_ref().to_path_buf());
        self
    }

    /// Declares `.extern .shared .align ALIGN .b8 SYMBOL[];` in every module: the kernels take its
    /// 32-bit shared-window address with `mov.u32 %r, SYMBOL;`.
    pub fn dynamic_shared(mut self, symbol: &str, align: u32) -> Self {
        self.shared = Some((symbol.to_string(), align));
        self
    }

    /// Gives kernel `name` the directives `.maxntid max_threads, 1, 1` and
    /// `.minnctapersm min_blocks`.
    pub fn launch_bounds(self, name: &str, max_threads: u32, min_blocks: u32) -> Self {
        self.launch_bounds_on(&[], name, max_threads, min_blocks)
    }

    /// As [`launch_bounds`](Self::launch_bounds) for a kernel that only the modules of `archs`
    /// contain (empty: every module). A kernel missing from a module it should be in is an error.
    pub fn launch_bounds_on(
        mut self,
        archs: &[Arch],
        name: &str,
        max_threads: u32,
        min_blocks: u32,
    ) -> Self {
        self.bounds.insert(
            name.to_string(),
            Bounds {
                max_threads,
                min_blocks,
                archs: archs.to_vec(),
            },
        );
        self
    }

    /// Makes a missing ptxas an error instead of a warning (also set by the environment variable
    /// `BLOCKSCALED_REQUIRE_PTXAS`, which CI sets).
    pub fn require_ptxas(mut self, yes: bool) -> Self {
        self.require_ptxas = yes;
        self
    }

    /// Builds every target. Inside a build script it also prints the `rerun-if` lines.
    pub fn build(self) -> Result<Vec<BuiltPtx>, BuildError> {
        let out_dir = match &self.out_dir {
            Some(d) => d.clone(),
            None => PathBuf::from(env("OUT_DIR")?),
        };
        std::fs::create_dir_all(&out_dir)?;
        let crate_path = std::fs::canonicalize(&self.crate_path).map_err(|e| {
            BuildError::Environment(format!("kernel crate {}: {e}", self.crate_path.display()))
        })?;
        println!(
            "cargo:rerun-if-changed={}",
            crate_path.join("src").display()
        );
        println!(
            "cargo:rerun-if-changed={}",
            crate_path.join("Cargo.toml").display()
        );
        println!("cargo:rerun-if-env-changed=PTXAS");
        println!("cargo:rerun-if-env-changed=NVDISASM");
        println!("cargo:rerun-if-env-changed=BLOCKSCALED_REQUIRE_PTXAS");

        println!("cargo:rerun-if-env-changed=BLOCKSCALED_TOOLS");

        let tools = Toolchain::find(PINNED_TOOLCHAIN)?;
        let ptxas = find_ptxas();
        let ptxas_version = match &ptxas {
            Some(p) => {
                // A new ptxas at the same path (another version installed) rebuilds the cubins.
                println!("cargo:rerun-if-changed={}", p.display());
                let v = ptxas_version(p)?;
                if v != PINNED_PTXAS_VERSION {
                    let msg = format!(
                        "ptxas {v} at {} is not the pinned {PINNED_PTXAS_VERSION} \
                         (`eval \"$(scripts/setup.sh)\"` installs it and sets PTXAS): \
                         the cubins may differ from a release build's",
                        p.display()
                    );
                    if self.require_ptxas {
                        return Err(BuildError::Environment(msg));
                    }
                    println!("cargo:warning={msg}");
                }
                Some(v)
            }
            None => None,
        };
        if ptxas.is_none() {
            let msg = "no ptxas found (set PTXAS, put it on PATH, or `pip install nvidia-cuda-nvcc`): \
                       the PTX was not assembled";
            if self.require_ptxas {
                return Err(BuildError::Environment(msg.into()));
            }
            println!("cargo:warning={msg}");
        }
        // Step 5 reads the cubins, and is the only step that may be skipped where ptxas is found.
        let nvdisasm = ptxas.as_ref().and_then(|p| {
            let found = nvdisasm::find_nvdisasm(p);
            if found.is_none() {
                println!(
                    "cargo:warning=no nvdisasm found (`eval \"$(scripts/setup.sh)\"` installs it and \
                     sets NVDISASM): spills inside K loops were not looked for"
                );
            }
            found
        });

        let mut built = Vec::new();
        for &arch in &self.archs {
            let raw = compile(&tools, &crate_path, &out_dir, arch, &self.cfgs)?;
            let ptx_text = std::fs::read_to_string(&raw)?;
            let bounds: BTreeMap<String, Bounds> = self
                .bounds
                .iter()
                .filter(|(_, b)| b.archs.is_empty() || b.archs.contains(&arch))
                .map(|(k, b)| (k.clone(), b.clone()))
                .collect();
            let edited = edit_ptx(&ptx_text, self.shared.as_ref(), &bounds)?;
            let ptx = out_dir.join(format!("{}.ptx", arch.name()));
            std::fs::write(&ptx, edited)?;
            // Never leave a cubin of an older PTX behind (a build without ptxas after one with).
            let cubin = out_dir.join(format!("{}.cubin", arch.name()));
            if cubin.exists() {
                std::fs::remove_file(&cubin)?;
            }
            let (ptxas_report, spilling_kernels, cubin) = match (&ptxas, &ptxas_version) {
                (Some(p), Some(v)) => {
                    let report = assemble(p, arch, &ptx, &cubin)?;
                    let mut spills = spilling_kernels(&report);
                    if let Some(nvdisasm) = nvdisasm.as_deref().filter(|_| !spills.is_empty()) {
                        let kernels: Vec<&str> = spills.iter().map(|s| s.kernel.as_str()).collect();
                        match nvdisasm::k_loop_spills(nvdisasm, &cubin, &kernels) {
                            Ok(found) => {
                                for s in &mut spills {
                                    s.in_k_loop = found.get(&s.kernel).copied();
                                }
                            }
                            Err(e) => println!(
                                "cargo:warning={}: spills inside K loops were not looked for: {e}",
                                arch.name()
                            ),
                        }
                    }
                    let header = format!(
                        "ptxas {v} ({}) -arch={} {}\n",
                        p.display(),
                        arch.name(),
                        PTXAS_FLAGS.join(" ")
                    );
                    std::fs::write(
                        out_dir.join(format!("{}.ptxas.txt", arch.name())),
                        format!("{header}{report}"),
                    )?;
                    (Some(report), spills, Some(cubin))
                }
                _ => (None, Vec::new(), None),
            };
            built.push(BuiltPtx {
                arch,
                ptx,
                cubin,
                ptxas_version: ptxas_version.clone(),
                ptxas_report,
                spilling_kernels,
            });
        }
        Ok(built)
    }
}

fn env(name: &str) -> Result<String, BuildError> {
    std::env::var(name).map_err(|_| BuildError::Environment(format!("{name} is not set")))
}
