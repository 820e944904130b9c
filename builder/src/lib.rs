//! Builds the `no_std` kernel crate into one PTX module per GPU target, from a `build.rs`.
//!
//! ```no_run
//! # fn main() -> Result<(), blockscaled_builder::BuildError> {
//! use blockscaled_builder::{Arch, Builder};
//! let built = Builder::new("../kernels")
//!     .arch(Arch::Sm90a)
//!     .arch(Arch::Sm100a)
//!     .dynamic_shared("SMEM", 1024)
//!     .launch_bounds("gemm_fp8_sm90", 384, 1)
//!     .build()?;
//! # let _ = built; Ok(()) }
//! ```
//!
//! What `build` does for each target, and why:
//! 1. `cargo rustc --crate-type cdylib --target nvptx64-nvidia-cuda -Zbuild-std=core` on the kernel
//!    crate, with the cargo and rustc of [`PINNED_TOOLCHAIN`] found through rustup (whatever
//!    toolchain runs the outer build; a missing toolchain or component is an error that prints the
//!    `rustup` command to run), in its own target folder under `OUT_DIR` (sharing the outer one would wait on its lock),
//!    with the outer build's `CARGO_*` / `RUSTFLAGS` variables removed. No `rust-std` for nvptx64
//!    can be downloaded, hence `build-std`. Fat LTO leaves one LLVM bitcode object.
//! 2. rustc's linker for nvptx64 is `llvm-bitcode-linker`, a rustup component that cannot be
//!    installed here, so `-Clinker` points at a small script this crate writes. It runs the
//!    toolchain's own `llvm-link` → `opt` (internalize everything but the kernel entry points,
//!    `default<O3>`, a high unroll threshold so register arrays stay in registers) → `llc`.
//! 3. The PTX is edited in two places LLVM cannot express from Rust: a module-scope
//!    `.extern .shared` array for dynamic shared memory (Rust has no address-space statics), and
//!    per-kernel `.maxntid` / `.minnctapersm` (Rust has no launch bounds; `setmaxnreg` is ignored
//!    by ptxas without a register cap at entry, warning C7508).
//! 4. If a `ptxas` is found (`PTXAS`, the pinned install `scripts/setup.sh` makes, the `PATH`, or
//!    the pip package `nvidia-cuda-nvcc`), the PTX is assembled for its target into
//!    `<arch>.cubin` ([`PTXAS_FLAGS`]); a failure is an error carrying ptxas' message, and the `-v`
//!    resource report (registers, spills, stack, shared memory per kernel) is kept beside the PTX,
//!    headed by the ptxas version that made it. A ptxas other than [`PINNED_PTXAS_VERSION`] is a
//!    warning, or an error when ptxas is required (CI): the cubin is shipped, so its SASS must not
//!    depend on what happens to be installed.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The ptxas release that makes the shipped cubins (`scripts/setup.sh` installs exactly this one).
/// CUDA 13.0: a cubin loads on drivers of its ptxas' CUDA release or newer (r580 and later), and
/// 13.0 is the JIT compiler of the r580 drivers, so the cubin's SASS is what those drivers make of
/// the PTX.
pub const PINNED_PTXAS_VERSION: &str = "13.0.88";

/// The toolchain that compiles the kernels, named explicitly whatever toolchain runs the outer
/// build: nvptx64 needs nightly (`-Zbuild-std=core`, `asm!` for nvptx, the `ptx-kernel` ABI), and
/// one pinned nightly keeps the PTX byte-identical from build to build (CI compares it with the
/// shipped images). `rust-toolchain.toml` pins the same one for the workspace.
pub const PINNED_TOOLCHAIN: &str = "nightly-2026-05-20";

/// The components the kernel build needs from [`PINNED_TOOLCHAIN`]: `rust-src` for
/// `-Zbuild-std=core`, `llvm-tools` for `llvm-link` / `opt` / `llc`.
pub const TOOLCHAIN_COMPONENTS: &[&str] = &["rust-src", "llvm-tools"];

/// The ptxas command line besides `-arch`, the input and the output: `-O3` is ptxas' default and
/// what the driver's JIT uses for PTX (so cubin and JIT give the same SASS); `-v` for the resource
/// report; `--warn-on-spills` so a spill shows in the build log.
pub const PTXAS_FLAGS: &[&str] = &["-O3", "-v", "--warn-on-spills"];

/// A GPU target the kernels are compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Arch {
    /// Hopper with the architecture-specific features (`wgmma`, `setmaxnreg`).
    Sm90a,
    /// Blackwell datacenter with `tcgen05` (assembled only: no such GPU is lent here).
    Sm100a,
}

impl Arch {
    /// The name used by `llc -mcpu`, `ptxas -arch` and the output file names.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Sm90a => "sm_90a",
            Arch::Sm100a => "sm_100a",
        }
    }

    /// PTX ISA version requested from llc. sm_90a needs PTX 8.0; `tcgen05` needs PTX 8.6+ and
    /// llc's sm_100a support starts at 8.6; 8.8 is what was verified here. The CUDA 13.0 driver on
    /// the GPU machine JIT-compiles PTX up to 9.0.
    pub fn ptx_feature(self) -> &'static str {
        match self {
            Arch::Sm90a => "+ptx80",
            Arch::Sm100a => "+ptx88",
        }
    }
}

/// Everything that can stop a kernel build, with the tool's own message.
#[derive(Debug)]
pub enum BuildError {
    /// An environment problem (a missing variable, tool or folder).
    Environment(String),
    /// A command ran and failed; `output` holds what it printed.
    Command {
        what: String,
        output: String,
    },
    /// ptxas rejected the PTX for `arch`.
    Ptxas {
        arch: Arch,
        output: String,
    },
    /// The PTX did not have the shape this crate edits (a bug here, or a new LLVM).
    PtxEdit(String),
    Io(std::io::Error),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::Environment(s) => write!(f, "kernel build environment: {s}"),
            BuildError::Command { what, output } => write!(f, "{what} failed:\n{output}"),
            BuildError::Ptxas { arch, output } => {
                write!(f, "ptxas rejected the {} PTX:\n{output}", arch.name())
            }
            BuildError::PtxEdit(s) => write!(f, "PTX post-processing: {s}"),
            BuildError::Io(e) => write!(f, "I/O: {e}"),
        }
    }
}

impl std::error::Error for BuildError {}

impl From<std::io::Error> for BuildError {
    fn from(e: std::io::Error) -> Self {
        BuildError::Io(e)
    }
}

/// One target's result.
#[derive(Clone, Debug)]
pub struct BuiltPtx {
    pub arch: Arch,
    /// The final PTX (what the host embeds, and loads where the cubin does not fit the GPU).
    pub ptx: PathBuf,
    /// ptxas' `<arch>.cubin` of that PTX, when a ptxas was found.
    pub cubin: Option<PathBuf>,
    /// The version of the ptxas that made the cubin (`13.0.88`), when a ptxas was found.
    pub ptxas_version: Option<String>,
    /// `ptxas -v` output, when a ptxas was found.
    pub ptxas_report: Option<String>,
    /// Kernels whose ptxas report shows spills or a non-empty stack frame.
    pub spilling_kernels: Vec<Spill>,
}

/// Launch bounds of one kernel, written into the PTX as `.maxntid` / `.minnctapersm`.
#[derive(Clone, Debug)]
struct Bounds {
    max_threads: u32,
    min_blocks: u32,
    /// Targets whose module holds the kernel (empty: all).
    archs: Vec<Arch>,
}

/// The kernel-crate builder (the shape of Rust-CUDA's `cuda_builder`).
#[derive(Clone, Debug)]
pub struct Builder {
    crate_path: PathBuf,
    archs: Vec<Arch>,
    out_dir: Option<PathBuf>,
    shared: Option<(String, u32)>,
    bounds: BTreeMap<String, Bounds>,
    require_ptxas: bool,
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
        }
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

        let mut built = Vec::new();
        for &arch in &self.archs {
            let raw = self.compile(&tools, &crate_path, &out_dir, arch)?;
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
                    let spills = spilling_kernels(&report);
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

    /// Steps 1 and 2: the nested cargo build with the linker script; returns the raw PTX path.
    fn compile(
        &self,
        tools: &Toolchain,
        crate_path: &Path,
        out_dir: &Path,
        arch: Arch,
    ) -> Result<PathBuf, BuildError> {
        let target_dir = out_dir.join(format!("kernels-{}", arch.name()));
        std::fs::create_dir_all(&target_dir)?;
        let linker = target_dir.join("ptx-link.sh");
        std::fs::write(&linker, link_script(tools, arch))?;
        make_executable(&linker)?;

        let mut cmd = Command::new(&tools.cargo);
        // A clean environment: the outer build's variables would leak its target, flags and
        // profile into the nested build.
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            let drop = (k.starts_with("CARGO_") && k != "CARGO_HOME")
                || matches!(
                    &*k,
                    "RUSTFLAGS"
                        | "RUSTDOCFLAGS"
                        | "RUSTC_WRAPPER"
                        | "RUSTC_WORKSPACE_WRAPPER"
                        | "CARGO"
                        | "TARGET"
                        | "HOST"
                        | "OUT_DIR"
                        | "PROFILE"
                        | "OPT_LEVEL"
                        | "DEBUG"
                        | "NUM_JOBS"
                );
            if drop {
                cmd.env_remove(&*k);
            }
        }
        let flags = [
            format!("-Clinker={}", linker.display()),
            format!("-Ctarget-cpu={}", arch.name()),
        ];
        cmd.env("CARGO_ENCODED_RUSTFLAGS", flags.join("\u{1f}"))
            .env("RUSTC", &tools.rustc)
            // Any rustup proxy the nested build reaches resolves to the pinned toolchain, not to
            // the outer build's (`cargo +stable` sets RUSTUP_TOOLCHAIN for its children).
            .env("RUSTUP_TOOLCHAIN", PINNED_TOOLCHAIN)
            // The kernel profile, whatever the workspace's release profile says for host code.
            .env("CARGO_PROFILE_RELEASE_LTO", "fat")
            .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
            .env("CARGO_PROFILE_RELEASE_PANIC", "abort")
            .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "3")
            .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
            .env("CARGO_PROFILE_RELEASE_STRIP", "false")
            .env("CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS", "false")
            .env("CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS", "false")
            .arg("rustc")
            .arg("--release")
            .arg("--lib")
            .arg("--crate-type")
            .arg("cdylib")
            .arg("--target")
            .arg("nvptx64-nvidia-cuda")
            .arg("-Zbuild-std=core")
            .arg("--manifest-path")
            .arg(crate_path.join("Cargo.toml"))
            .arg("--target-dir")
            .arg(&target_dir);
        run(&mut cmd, &format!("kernel build for {}", arch.name()))?;

        let release = target_dir.join("nvptx64-nvidia-cuda").join("release");
        let stem = crate_name(crate_path)?.replace('-', "_");
        let ptx = release.join(format!("{stem}.ptx"));
        if ptx.exists() {
            return Ok(ptx);
        }
        // rustc names a cdylib for nvptx64 `<crate>.ptx`; accept any single .ptx in case it changes.
        let mut found = std::fs::read_dir(&release)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "ptx"));
        found.next().ok_or_else(|| {
            BuildError::Environment(format!("no PTX produced in {}", release.display()))
        })
    }
}

/// The toolchain pieces: the pinned toolchain's cargo and rustc, and the LLVM tools shipped in its
/// sysroot (`llvm-tools`).
struct Toolchain {
    cargo: PathBuf,
    rustc: PathBuf,
    llvm_bin: PathBuf,
}

impl Toolchain {
    /// Finds toolchain `name` through rustup, whatever toolchain runs the outer build (a stable
    /// `cargo build` of a dependent project included), and checks its two components.
    fn find(name: &str) -> Result<Self, BuildError> {
        let cargo = rustup_which(name, "cargo")?;
        let rustc = rustup_which(name, "rustc")?;
        let sysroot =
            PathBuf::from(output_of(Command::new(&rustc).args(["--print", "sysroot"]))?.trim());
        let host = output_of(Command::new(&rustc).arg("-vV"))?
            .lines()
            .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
            .ok_or_else(|| {
                BuildError::Environment(format!("`{} -vV` names no host", rustc.display()))
            })?;
        let llvm_bin = sysroot.join("lib/rustlib").join(host).join("bin");
        let rust_src = sysroot.join("lib/rustlib/src/rust/library/core/Cargo.toml");
        let mut missing = Vec::new();
        if !rust_src.is_file() {
            missing.push("rust-src");
        }
        if ["llvm-link", "opt", "llc"]
            .iter()
            .any(|t| !llvm_bin.join(t).is_file())
        {
            missing.push("llvm-tools");
        }
        if !missing.is_empty() {
            return Err(BuildError::Environment(format!(
                "the kernel toolchain {name} lacks {}: run\n\n    rustup component add --toolchain {name} {}\n",
                missing.join(" and "),
                missing.join(" ")
            )));
        }
        Ok(Toolchain {
            cargo,
            rustc,
            llvm_bin,
        })
    }
}

/// The command that installs the pinned kernel toolchain with what the kernel build needs.
pub fn toolchain_install_command() -> String {
    install_command(PINNED_TOOLCHAIN)
}

fn install_command(name: &str) -> String {
    format!(
        "rustup toolchain install {name} --profile minimal --component {}",
        TOOLCHAIN_COMPONENTS.join(",")
    )
}

/// `rustup which --toolchain NAME TOOL`, never installing anything (a build script that downloads
/// a toolchain would surprise); a missing rustup or toolchain is an error with the command to run.
fn rustup_which(name: &str, tool: &str) -> Result<PathBuf, BuildError> {
    let out = Command::new("rustup")
        .args(["which", "--toolchain", name, tool])
        .env("RUSTUP_AUTO_INSTALL", "0")
        .env_remove("RUSTUP_TOOLCHAIN")
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            return Err(BuildError::Environment(format!(
                "building the kernels from source needs rustup and the toolchain {name} \
                 (running `rustup`: {e}); install rustup (https://rustup.rs), then run\n\n    {}\n",
                install_command(name)
            )));
        }
    };
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !out.status.success() || !path.is_file() {
        return Err(BuildError::Environment(format!(
            "the kernels are compiled with the pinned toolchain {name}, which is not installed \
             (rustup: {}); run\n\n    {}\n",
            String::from_utf8_lossy(&out.stderr).trim(),
            install_command(name)
        )));
    }
    Ok(path)
}

/// A command's stdout, or its failure as an error.
fn output_of(cmd: &mut Command) -> Result<String, BuildError> {
    let out = cmd.output()?;
    if !out.status.success() {
        return Err(BuildError::Command {
            what: format!("{cmd:?}"),
            output: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The linker rustc calls for nvptx64: it receives `--export-symbol K …  <crate>.o  *.rlib  -o
/// out.ptx` (the llvm-bitcode-linker interface). The `.o` is LLVM bitcode holding the whole crate
/// after fat LTO; `core` is inside it. Rlibs (compiler_builtins) are not linked: NVPTX lowers the
/// memory intrinsics itself, and any other missing symbol makes llc or ptxas fail loudly.
fn link_script(tools: &Toolchain, arch: Arch) -> String {
    let bin = tools.llvm_bin.display();
    format!(
        r#"#!/bin/sh
# Written by blockscaled-builder: LLVM bitcode -> PTX for {arch}.
set -e
objs=""; exports=""; out=""; prev=""
for a in "$@"; do
  case "$prev" in
    -o) out="$a" ;;
    --export-symbol) exports="$exports,$a" ;;
  esac
  case "$a" in *.o) objs="$objs $a" ;; esac
  prev="$a"
done
[ -n "$out" ] || {{ echo "ptx-link: no -o in: $*" >&2; exit 1; }}
[ -n "$objs" ] || {{ echo "ptx-link: no bitcode objects in: $*" >&2; exit 1; }}
"{bin}/llvm-link" $objs -o "$out.linked.bc"
"{bin}/opt" --internalize-public-api-list="${{exports#,}}" -passes='internalize,default<O3>' \
  -unroll-threshold=4000 "$out.linked.bc" -o "$out.opt.bc"
"{bin}/llc" -O3 -mcpu={arch} -mattr={ptx} "$out.opt.bc" -o "$out"
"#,
        arch = arch.name(),
        ptx = arch.ptx_feature(),
    )
}

/// Step 3: the shared-memory declaration and the launch bounds.
fn edit_ptx(
    ptx: &str,
    shared: Option<&(String, u32)>,
    bounds: &BTreeMap<String, Bounds>,
) -> Result<String, BuildError> {
    let mut out = String::with_capacity(ptx.len() + 256);
    let mut pending_entry: Option<String> = None;
    let mut seen_address_size = false;
    let mut seen_bounds = 0usize;
    for line in ptx.lines() {
        let t = line.trim_start();
        // The performance directives go between the parameter list and the body's `{`.
        if t == "{"
            && let Some(name) = pending_entry.take()
            && let Some(b) = bounds.get(&name)
        {
            out.push_str(&format!(".maxntid {}, 1, 1\n", b.max_threads));
            out.push_str(&format!(".minnctapersm {}\n", b.min_blocks));
            seen_bounds += 1;
        }
        if let Some(rest) = t
            .strip_prefix(".visible .entry ")
            .or_else(|| t.strip_prefix(".entry "))
        {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$')
                .collect();
            pending_entry = Some(name);
        }
        out.push_str(line);
        out.push('\n');
        if t.starts_with(".address_size") {
            seen_address_size = true;
            if let Some((sym, align)) = shared {
                out.push_str(&format!("\n// dynamic shared memory (blockscaled-builder)\n.extern .shared .align {align} .b8 {sym}[];\n"));
            }
        }
    }
    if shared.is_some() && !seen_address_size {
        return Err(BuildError::PtxEdit(
            "no .address_size line to place .extern .shared after".into(),
        ));
    }
    if seen_bounds != bounds.len() {
        let present: Vec<&String> = bounds
            .keys()
            .filter(|k| ptx.contains(&format!(".entry {k}(")))
            .collect();
        return Err(BuildError::PtxEdit(format!(
            "launch bounds were given for {:?} but only {:?} are entries of this PTX",
            bounds.keys().collect::<Vec<_>>(),
            present
        )));
    }
    Ok(out)
}

/// `PTXAS`, then the pinned install of `scripts/setup.sh`
/// (`$BLOCKSCALED_TOOLS` or `~/.cache/blockscaled`, `cuda-nvcc-<PINNED_PTXAS_VERSION>/`), then the
/// PATH, then the pip package `nvidia-cuda-nvcc` (site-packages/nvidia/cu13/bin).
pub fn find_ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PTXAS") {
        let p = PathBuf::from(p);
        if p.exists() {
            return Some(p);
        }
    }
    let tools = std::env::var_os("BLOCKSCALED_TOOLS")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("blockscaled"))
        })
        .or_else(|| {
            std::env::var_os("HOME").map(|d| PathBuf::from(d).join(".cache").join("blockscaled"))
        });
    if let Some(tools) = tools {
        let p = tools
            .join(format!("cuda-nvcc-{PINNED_PTXAS_VERSION}"))
            .join("nvidia/cu13/bin/ptxas");
        if p.is_file() {
            return Some(p);
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("ptxas");
            if p.is_file() {
                return Some(p);
            }
        }
    }
    for py in ["python3", "python"] {
        let out = Command::new(py)
            .args([
                "-c",
                "import importlib.util as u; s = u.find_spec('nvidia'); \
                 print('\\n'.join(s.submodule_search_locations) if s else '')",
            ])
            .output();
        let Ok(out) = out else { continue };
        for dir in String::from_utf8_lossy(&out.stdout).lines() {
            for sub in ["cu13/bin/ptxas", "cuda_nvcc/bin/ptxas", "cu12/bin/ptxas"] {
                let p = Path::new(dir.trim()).join(sub);
                if p.is_file() {
                    return Some(p);
                }
            }
        }
    }
    None
}

/// The version `ptxas --version` reports (`Cuda compilation tools, release 13.0, V13.0.88`).
pub fn ptxas_version(ptxas: &Path) -> Result<String, BuildError> {
    let out = Command::new(ptxas).arg("--version").output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse_ptxas_version(&text).ok_or_else(|| BuildError::Command {
        what: format!("{} --version", ptxas.display()),
        output: format!("{text}{}", String::from_utf8_lossy(&out.stderr)),
    })
}

fn parse_ptxas_version(text: &str) -> Option<String> {
    let v = text.lines().rev().find_map(|l| {
        l.split_whitespace()
            .find_map(|w| w.strip_prefix('V'))
            .filter(|v| {
                v.split('.')
                    .all(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            })
    })?;
    Some(v.to_string())
}

/// Step 4: assemble `ptx` into `cubin`; returns the `-v` report (which ptxas prints on stderr).
fn assemble(ptxas: &Path, arch: Arch, ptx: &Path, cubin: &Path) -> Result<String, BuildError> {
    let out = Command::new(ptxas)
        .arg(format!("-arch={}", arch.name()))
        .args(PTXAS_FLAGS)
        .arg(ptx)
        .arg("-o")
        .arg(cubin)
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        return Err(BuildError::Ptxas { arch, output: text });
    }
    Ok(text)
}

/// Kernels whose report line says `N bytes stack frame, S bytes spill stores` with N or S > 0.
pub fn spilling_kernels(report: &str) -> Vec<Spill> {
    let mut current = String::new();
    let mut bad: Vec<Spill> = Vec::new();
    for line in report.lines() {
        if let Some(i) = line.find("Compiling entry function '") {
            let rest = &line[i + "Compiling entry function '".len()..];
            current = rest.split('\'').next().unwrap_or("").to_string();
        }
        if line.contains("bytes stack frame") {
            let nums: Vec<u64> = line
                .split(|c: char| !c.is_ascii_digit())
                .filter(|s| !s.is_empty())
                .filter_map(|s| s.parse().ok())
                .collect();
            // "N bytes stack frame, S bytes spill stores, L bytes spill loads"
            let (stack, stores, loads) = (nums.first(), nums.get(1), nums.get(2));
            let n = |x: Option<&u64>| x.copied().unwrap_or(0);
            let spill = Spill {
                kernel: current.clone(),
                stack: n(stack),
                stores: n(stores),
                loads: n(loads),
            };
            if spill.stack + spill.stores + spill.loads > 0
                && !bad.iter().any(|b| b.kernel == current)
            {
                bad.push(spill);
            }
        }
    }
    bad
}

/// One kernel's stack frame and spills (bytes), from its ptxas report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spill {
    pub kernel: String,
    pub stack: u64,
    pub stores: u64,
    pub loads: u64,
}

fn crate_name(crate_path: &Path) -> Result<String, BuildError> {
    let toml = std::fs::read_to_string(crate_path.join("Cargo.toml"))?;
    toml.lines()
        .find_map(|l| {
            let l = l.trim();
            let v = l
                .strip_prefix("name")?
                .trim_start()
                .strip_prefix('=')?
                .trim();
            Some(v.trim_matches('"').to_string())
        })
        .ok_or_else(|| BuildError::Environment("kernel crate's Cargo.toml has no name".into()))
}

fn env(name: &str) -> Result<String, BuildError> {
    std::env::var(name).map_err(|_| BuildError::Environment(format!("{name} is not set")))
}

fn run(cmd: &mut Command, what: &str) -> Result<(), BuildError> {
    let out = cmd.output()?;
    if out.status.success() {
        return Ok(());
    }
    Err(BuildError::Command {
        what: what.to_string(),
        output: format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    })
}

#[cfg(unix)]
fn make_executable(p: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut perm = std::fs::metadata(p)?.permissions();
    perm.set_mode(0o755);
    std::fs::set_permissions(p, perm)
}

#[cfg(not(unix))]
fn make_executable(_: &Path) -> std::io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTX: &str = "//\n.version 8.0\n.target sm_90a\n.address_size 64\n\n\
        .visible .entry k1(\n\t.param .u64 k1_param_0\n)\n{\n\tret;\n}\n\
        .visible .entry k2(\n)\n{\n\tret;\n}\n";

    #[test]
    fn shared_declaration_follows_address_size() {
        let out = edit_ptx(PTX, Some(&("SMEM".into(), 1024)), &BTreeMap::new()).unwrap();
        let a = out.find(".address_size 64").unwrap();
        let s = out.find(".extern .shared .align 1024 .b8 SMEM[];").unwrap();
        assert!(s > a && s < out.find(".entry k1").unwrap());
    }

    #[test]
    fn launch_bounds_go_between_params_and_body_of_named_kernel_only() {
        let mut b = BTreeMap::new();
        b.insert(
            "k2".to_string(),
            Bounds {
                max_threads: 384,
                min_blocks: 1,
                archs: vec![],
            },
        );
        let out = edit_ptx(PTX, None, &b).unwrap();
        let k2 = out.find(".entry k2(").unwrap();
        let m = out.find(".maxntid 384, 1, 1\n.minnctapersm 1\n{").unwrap();
        assert!(m > k2);
        assert_eq!(out.matches(".maxntid").count(), 1);
    }

    #[test]
    fn bounds_for_a_missing_kernel_are_an_error() {
        let mut b = BTreeMap::new();
        b.insert(
            "nope".to_string(),
            Bounds {
                max_threads: 128,
                min_blocks: 1,
                archs: vec![],
            },
        );
        assert!(matches!(
            edit_ptx(PTX, None, &b),
            Err(BuildError::PtxEdit(_))
        ));
    }

    #[test]
    fn ptxas_version_is_parsed() {
        let out = "ptxas: NVIDIA (R) Ptx optimizing assembler\nCopyright (c) 2005-2025 NVIDIA Corporation\n\
                   Built on Wed_Aug_20_01:57:39_PM_PDT_2025\nCuda compilation tools, release 13.0, V13.0.88\n\
                   Build cuda_13.0.r13.0/compiler.36424714_0\n";
        assert_eq!(parse_ptxas_version(out).as_deref(), Some("13.0.88"));
        assert_eq!(parse_ptxas_version("garbage"), None);
    }

    /// The pin is written twice (here for the check, in setup.sh for the install): one value.
    #[test]
    fn pinned_version_matches_setup_script() {
        let setup = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/setup.sh"),
        )
        .unwrap();
        let pinned = setup
            .lines()
            .find_map(|l| l.strip_prefix("PTXAS_VERSION="))
            .expect("scripts/setup.sh sets PTXAS_VERSION");
        assert_eq!(pinned.trim(), PINNED_PTXAS_VERSION);
    }

    /// The kernel toolchain and the workspace's `rust-toolchain.toml` name one nightly.
    #[test]
    fn pinned_toolchain_matches_rust_toolchain_toml() {
        let toml = Path::new(env!("CARGO_MANIFEST_DIR")).join("../rust-toolchain.toml");
        let text = std::fs::read_to_string(toml).unwrap();
        let channel = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("channel"))
            .and_then(|v| v.trim().strip_prefix('='))
            .expect("rust-toolchain.toml names a channel");
        assert_eq!(channel.trim().trim_matches('"'), PINNED_TOOLCHAIN);
        for c in TOOLCHAIN_COMPONENTS {
            assert!(
                text.contains(&format!("\"{c}\"")),
                "rust-toolchain.toml lacks {c}"
            );
        }
    }

    /// A toolchain that is not installed is an error that prints the exact rustup command.
    #[test]
    fn missing_toolchain_names_the_rustup_command() {
        let Err(BuildError::Environment(msg)) = Toolchain::find("nightly-1999-01-01") else {
            panic!("a toolchain from 1999 was found");
        };
        assert!(msg.contains("nightly-1999-01-01"), "{msg}");
        assert!(
            msg.contains("rustup toolchain install nightly-1999-01-01 --profile minimal --component rust-src,llvm-tools"),
            "{msg}"
        );
        assert!(
            toolchain_install_command()
                .starts_with(&format!("rustup toolchain install {PINNED_TOOLCHAIN} "))
        );
    }

    #[test]
    fn spill_report_is_parsed_per_kernel() {
        let r = "ptxas info    : Compiling entry function 'a' for 'sm_90a'\n\
                 ptxas info    : Function properties for a\n    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
                 ptxas info    : Compiling entry function 'b' for 'sm_90a'\n\
                 ptxas info    : Function properties for b\n    16 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n";
        let b = Spill {
            kernel: "b".into(),
            stack: 16,
            stores: 8,
            loads: 8,
        };
        assert_eq!(spilling_kernels(r), vec![b]);
    }
}
