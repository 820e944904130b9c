//! Compiles `kernels/` to one PTX per GPU target and leaves them in OUT_DIR for `include_str!`.
//! The kernel table (names, launch bounds) comes from the kernel crate itself.

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
    // Keep the PTX and ptxas' resource report where a developer finds them:
    // target/<profile>/ptx/<arch>.{ptx,ptxas.txt}.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap());
    if let Some(profile_dir) = out.ancestors().nth(3) {
        let dir = profile_dir.join("ptx");
        let _ = std::fs::create_dir_all(&dir);
        for b in &built {
            let _ = std::fs::copy(&b.ptx, dir.join(format!("{}.ptx", b.arch.name())));
            if let Some(r) = &b.ptxas_report {
                let _ = std::fs::write(dir.join(format!("{}.ptxas.txt", b.arch.name())), r);
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
