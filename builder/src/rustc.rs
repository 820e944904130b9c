//! Steps 1 and 2 of the build: the kernel crate compiled by the pinned nightly's cargo into LLVM
//! bitcode, and linked into PTX by the toolchain's own LLVM tools through a linker script.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Arch, BuildError, PINNED_TOOLCHAIN, TOOLCHAIN_COMPONENTS};

/// Steps 1 and 2: the nested cargo build with the linker script; returns the raw PTX path.
pub(crate) fn compile(
    tools: &Toolchain,
    crate_path: &Path,
    out_dir: &Path,
    arch: Arch,
    cfgs: &[String],
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
    let mut flags = vec![
        format!("-Clinker={}", linker.display()),
        format!("-Ctarget-cpu={}", arch.name()),
    ];
    for c in cfgs {
        flags.extend(["--cfg".to_string(), c.clone()]);
    }
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
    found
        .next()
        .ok_or_else(|| BuildError::Environment(format!("no PTX produced in {}", release.display())))
}

/// The toolchain pieces: the pinned toolchain's cargo and rustc, and the LLVM tools shipped in its
/// sysroot (`llvm-tools`).
pub(crate) struct Toolchain {
    cargo: PathBuf,
    rustc: PathBuf,
    llvm_bin: PathBuf,
}

impl Toolchain {
    /// Finds toolchain `name` through rustup, whatever toolchain runs the outer build (a stable
    /// `cargo build` of a dependent project included), and checks its two components.
    pub(crate) fn find(name: &str) -> Result<Self, BuildError> {
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
}
