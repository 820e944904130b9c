//! Compiles `kernels/` to one PTX per GPU target, and ptxas' cubin of it, and leaves them in
//! OUT_DIR for `include_str!` / `include_bytes!` (`src/image.rs`). Without a ptxas the cubin is an
//! empty file and the host loads the PTX. The kernel table (names, launch bounds) comes from the
//! kernel crate itself.

use blockscaled_builder::{Arch, Builder};
use blockscaled_kernels::registry;

fn main() {
    let mut builder = Builder::new("../kernels")
        .arch(Arch::Sm90a)
        .arch(Arch::Sm100a)
        .dynamic_shared(registry::DYNAMIC_SMEM_SYMBOL, registry::DYNAMIC_SMEM_ALIGN);
    for k in registry::KERNELS {
        if let Some(t) = k.max_threads {
            let archs: Vec<Arch> = [Arch::Sm90a, Arch::Sm100a]
                .into_iter()
                .filter(|a| k.targets.contains(&a.name()))
                .collect();
            builder = builder.launch_bounds_on(&archs, k.name, t, k.min_blocks_per_sm);
        }
    }
    let built = match builder.build() {
        Ok(b) => b,
        Err(e) => {
            // The whole message (ptxas' or rustc's) belongs in the build log.
            eprintln!("{e}");
            panic!("building the GPU kernels failed: {e}");
        }
    };
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap());
    for b in &built {
        if b.cubin.is_none() {
            // `include_bytes!` needs the file; empty means "no cubin: load the PTX".
            let empty = out.join(format!("{}.cubin", b.arch.name()));
            if let Err(e) = std::fs::write(&empty, []) {
                panic!("writing {}: {e}", empty.display());
            }
        }
    }
    // Which ptxas made the cubins, for `KernelImage`'s report ("none": PTX only).
    let version = built.iter().find_map(|b| b.ptxas_version.clone());
    println!(
        "cargo:rustc-env=BLOCKSCALED_PTXAS_VERSION={}",
        version.as_deref().unwrap_or("none")
    );
    // Keep the PTX, the cubin and ptxas' resource report where a developer finds them:
    // target/<profile>/ptx/<arch>.{ptx,cubin,ptxas.txt}.
    if let Some(profile_dir) = out.ancestors().nth(3) {
        let dir = profile_dir.join("ptx");
        let _ = std::fs::create_dir_all(&dir);
        for b in &built {
            let name = b.arch.name();
            let _ = std::fs::copy(&b.ptx, dir.join(format!("{name}.ptx")));
            let cubin = dir.join(format!("{name}.cubin"));
            match &b.cubin {
                Some(c) => {
                    let _ = std::fs::copy(c, &cubin);
                }
                None => {
                    let _ = std::fs::remove_file(&cubin);
                }
            }
            let report = out.join(format!("{name}.ptxas.txt"));
            if b.ptxas_report.is_some() {
                let _ = std::fs::copy(&report, dir.join(format!("{name}.ptxas.txt")));
            }
        }
    }
    for b in &built {
        for k in &b.spilling_kernels {
            println!(
                "cargo:warning={}: kernel {k} spills or uses a stack frame (see target/*/ptx/{}.ptxas.txt)",
                b.arch.name(),
                b.arch.name()
            );
        }
    }
}
