//! Step 4 of the build: ptxas found, its version checked against the pin, the PTX assembled into
//! a cubin, and its `-v` report read for stack frames and spills.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Arch, BuildError, PINNED_PTXAS_VERSION, PTXAS_FLAGS, Spill};

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
    if let Some(tools) = pinned_tools() {
        let p = tools
            .join(format!("cuda-nvcc-{PINNED_PTXAS_VERSION}"))
            .join("nvidia/cu13/bin/ptxas");
        if p.is_file() {
            return Some(p);
        }
    }
    if let Some(p) = on_path("ptxas") {
        return Some(p);
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

/// Where `scripts/setup.sh` installs the pinned tools: `$BLOCKSCALED_TOOLS`, else
/// `$XDG_CACHE_HOME/blockscaled`, else `~/.cache/blockscaled`.
pub(crate) fn pinned_tools() -> Option<PathBuf> {
    std::env::var_os("BLOCKSCALED_TOOLS")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("blockscaled"))
        })
        .or_else(|| {
            std::env::var_os("HOME").map(|d| PathBuf::from(d).join(".cache").join("blockscaled"))
        })
}

/// The first `exe` in a folder of the `PATH`.
pub(crate) fn on_path(exe: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(exe))
        .find(|p| p.is_file())
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
pub(crate) fn assemble(
    ptxas: &Path,
    arch: Arch,
    ptx: &Path,
    cubin: &Path,
) -> Result<String, BuildError> {
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
                in_k_loop: None,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptxas_version_is_parsed() {
        let out = "ptxas: NVIDIA (R) Ptx optimizing assembler\nCopyright (c) 2005-2025 NVIDIA Corporation\n\
                   Built on Wed_Aug_20_01:57:39_PM_PDT_2025\nCuda compilation tools, release 13.0, V13.0.88\n\
                   Build cuda_13.0.r13.0/compiler.36424714_0\n";
        assert_eq!(parse_ptxas_version(out).as_deref(), Some("13.0.88"));
        assert_eq!(parse_ptxas_version("garbage"), None);
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
            in_k_loop: None,
        };
        assert_eq!(spilling_kernels(r), vec![b]);
    }
}
