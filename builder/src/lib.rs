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
//! 3. The PTX is edited in three places LLVM cannot express from Rust: a module-scope
//!    `.extern .shared` array for dynamic shared memory (Rust has no address-space statics),
//!    per-kernel `.maxntid` / `.minnctapersm` (Rust has no launch bounds; `setmaxnreg` is ignored
//!    by ptxas without a register cap at entry, warning C7508), and the entry parameter that
//!    carries the launch's tensor maps: declared 64-byte aligned (TMA's rule; rustc declares a
//!    by-value parameter at most 16-byte aligned) and named in the asm that takes its address
//!    (`mov` of the parameter, `cvta.param`: Rust's `&param` would copy it to local memory).
//! 4. If a `ptxas` is found (`PTXAS`, the pinned install `scripts/setup.sh` makes, the `PATH`, or
//!    the pip package `nvidia-cuda-nvcc`), the PTX is assembled for its target into
//!    `<arch>.cubin` ([`PTXAS_FLAGS`]); a failure is an error carrying ptxas' message, and the `-v`
//!    resource report (registers, spills, stack, shared memory per kernel) is kept beside the PTX,
//!    headed by the ptxas version that made it. A ptxas other than [`PINNED_PTXAS_VERSION`] is a
//!    warning, or an error when ptxas is required (CI): the cubin is shipped, so its SASS must not
//!    depend on what happens to be installed.
//! 5. If an `nvdisasm` is found too (`NVDISASM`, the pinned install `scripts/setup.sh` makes, the
//!    one beside ptxas, or the `PATH`), the spilling kernels' SASS is read back from the cubin and
//!    each [`Spill`] gets the local-memory accesses inside its K loop ([`LoopSpills`]): a spill
//!    there is paid once per K block, not once per tile. Without one that check alone is skipped,
//!    with a one-line note.
//!
//! The modules follow these steps: `rustc` (1, 2), `ptx` (3), `ptxas` (4), `nvdisasm` and `sass`
//! (5); `builder` runs them.

use std::fmt;
use std::path::PathBuf;

mod builder;
mod nvdisasm;
mod ptx;
mod ptxas;
mod rustc;
mod sass;

pub use builder::Builder;
pub use ptxas::{find_ptxas, ptxas_version, spilling_kernels};
pub use rustc::toolchain_install_command;

/// The ptxas release that makes the shipped cubins (`scripts/setup.sh` installs exactly this one).
/// CUDA 13.0: a cubin loads on drivers of its ptxas' CUDA release or newer (r580 and later), and
/// 13.0 is the JIT compiler of the r580 drivers, so the cubin's SASS is what those drivers make of
/// the PTX.
pub const PINNED_PTXAS_VERSION: &str = "13.0.88";

/// The nvdisasm release `scripts/setup.sh` installs to read the cubins' SASS back (step 5). It only
/// reads what the pinned ptxas made, so any release that knows the targets would do; NVIDIA
/// publishes nvdisasm as a pip package from CUDA 13.2 on (none of 13.0), and this is a 13.2 one.
pub const PINNED_NVDISASM_VERSION: &str = "13.2.86";

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

    /// PTX ISA version requested from llc. sm_90a needs PTX 8.0 and `mma` with e4m3 operands
    /// 8.4; `tcgen05` needs PTX 8.6+ and llc's sm_100a support starts at 8.6; 8.8 is what was
    /// verified here. The CUDA 13.0 driver on the GPU machine JIT-compiles PTX up to 9.0.
    pub fn ptx_feature(self) -> &'static str {
        match self {
            Arch::Sm90a => "+ptx84",
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

/// One kernel's stack frame and spills (bytes), from its ptxas report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spill {
    pub kernel: String,
    pub stack: u64,
    pub stores: u64,
    pub loads: u64,
    /// Its local-memory accesses inside its K loop, from the cubin's SASS; `None` where that was
    /// not read (no nvdisasm, or it failed: the build said why).
    pub in_k_loop: Option<LoopSpills>,
}

/// Local-memory instructions (`STL` stores, `LDL` loads: counts of instructions, not bytes) inside
/// a kernel's K loop, the innermost loop that holds its tensor-core MMAs (its nested loops, such as
/// barrier waits, included). Kernels without MMAs (the quantizers) have no K loop: zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoopSpills {
    pub stores: u64,
    pub loads: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

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

    /// The nvdisasm pin is written twice too.
    #[test]
    fn pinned_nvdisasm_matches_setup_script() {
        let setup = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/setup.sh"),
        )
        .unwrap();
        let pinned = setup
            .lines()
            .find_map(|l| l.strip_prefix("NVDISASM_VERSION="))
            .expect("scripts/setup.sh sets NVDISASM_VERSION");
        assert_eq!(pinned.trim(), PINNED_NVDISASM_VERSION);
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
}
