//! Chooses the kernel images `src/image.rs` embeds: the PTX and cubins shipped in `kernel-images/`,
//! or, with `BLOCKSCALED_BUILD_KERNELS=1`, a build of `kernels/` from source.
//!
//! **Shipped (the default):** nothing is compiled and no tool is run, so a dependent project builds
//! on stable Rust with no nightly, llvm-tools, ptxas or CUDA installation. `kernel-images/` holds
//! `sm_90a.{ptx,cubin}`, `sm_100a.{ptx,cubin}` and `MANIFEST` (the toolchain and ptxas that made
//! them); `scripts/update-images.sh` writes them from a build from source.
//!
//! **From source** (set automatically inside this repository by `.cargo/config.toml`): compiles
//! `kernels/` to one PTX per GPU target with the pinned nightly (`blockscaled_builder::
//! PINNED_TOOLCHAIN`, found through rustup whatever toolchain runs this build) and assembles each
//! with the pinned ptxas (an empty cubin without one: the host then loads the PTX). The kernel
//! table (names, launch bounds) comes from the kernel crate itself. The result is compared with the
//! shipped images: a difference is a warning, or an error with `BLOCKSCALED_CHECK_IMAGES=1` (CI),
//! so the images in the package can never drift from the sources.
//!
//! **A planted error** (`BLOCKSCALED_PLANT=<site>`, from source only; `scripts/plant-error.sh`):
//! the kernels built with `--cfg blockscaled_plant="<site>"`, which makes that site's values 0.5%
//! off (`blockscaled_kernels::plant`), to show that the tests fail. Not compared with the shipped
//! images (it differs from them by design) and never written over them.

use std::path::{Path, PathBuf};
use std::process::exit;

use blockscaled_builder::{Arch, Builder, BuiltPtx, PINNED_PTXAS_VERSION, PINNED_TOOLCHAIN};
use blockscaled_kernels::{plant, registry};

/// The targets and the files of one image set.
const ARCHS: [Arch; 2] = [Arch::Sm90a, Arch::Sm100a];
const MANIFEST: &str = "MANIFEST";
/// The kernels whose stack frames and spills are known and accepted, beside the shipped images.
const KNOWN_SPILLS: &str = "KNOWN-SPILLS";

fn main() {
    println!("cargo:rerun-if-env-changed=BLOCKSCALED_BUILD_KERNELS");
    println!("cargo:rerun-if-env-changed=BLOCKSCALED_KERNELS_DIR");
    println!("cargo:rerun-if-env-changed=BLOCKSCALED_CHECK_IMAGES");
    println!("cargo:rerun-if-env-changed=BLOCKSCALED_PLANT");
    let plant = match std::env::var("BLOCKSCALED_PLANT").as_deref() {
        Err(_) | Ok("") => None,
        Ok(site) if plant::SITES.contains(&site) => Some(site.to_string()),
        Ok(other) => fail(&format!(
            "BLOCKSCALED_PLANT={other}: the sites are {}",
            plant::SITES.join(", ")
        )),
    };
    let package = PathBuf::from(env("CARGO_MANIFEST_DIR"));
    let shipped = package.join("kernel-images");
    let dir = match std::env::var("BLOCKSCALED_BUILD_KERNELS").as_deref() {
        Err(_) | Ok("") | Ok("0") if plant.is_some() => fail(
            "BLOCKSCALED_PLANT builds the kernels from source: set BLOCKSCALED_BUILD_KERNELS=1",
        ),
        Err(_) | Ok("") | Ok("0") => use_shipped(&shipped),
        Ok("1") => build_from_source(&package, &shipped, plant.as_deref()),
        Ok(other) => fail(&format!(
            "BLOCKSCALED_BUILD_KERNELS={other}: want 1 (build the kernels from source) or 0 / unset \
             (use the shipped images)"
        )),
    };
    let manifest = read(&dir.join(MANIFEST));
    let ptxas = manifest_field(&manifest, "ptxas").unwrap_or("none");
    println!("cargo:rustc-env=BLOCKSCALED_IMAGE_DIR={}", dir.display());
    println!("cargo:rustc-env=BLOCKSCALED_PTXAS_VERSION={ptxas}");
}

/// The shipped images, checked to be whole (the cubins included: a release always has them).
fn use_shipped(shipped: &Path) -> PathBuf {
    println!("cargo:rerun-if-changed={}", shipped.display());
    for file in image_files() {
        let path = shipped.join(&file);
        match std::fs::metadata(&path) {
            Ok(m) if m.len() > 0 => {}
            _ => fail(&format!(
                "the shipped kernel image {} is missing or empty; restore it (`git checkout \
                 host/kernel-images`), or build the kernels from source with \
                 BLOCKSCALED_BUILD_KERNELS=1 (needs rustup and {PINNED_TOOLCHAIN})",
                path.display()
            )),
        }
    }
    shipped.to_path_buf()
}

/// Builds the kernels into `OUT_DIR/kernel-images`, writes their manifest, compares the set with the
/// shipped one, and keeps a copy with ptxas' resource report in `target/<profile>/ptx/`.
fn build_from_source(package: &Path, shipped: &Path, plant: Option<&str>) -> PathBuf {
    let kernels = match std::env::var_os("BLOCKSCALED_KERNELS_DIR") {
        Some(d) => PathBuf::from(d),
        None => package.join("../kernels"),
    };
    if !kernels.join("Cargo.toml").is_file() {
        fail(&format!(
            "BLOCKSCALED_BUILD_KERNELS=1 builds the kernels from the repository's kernels/ folder, \
             which is not at {} (a packaged blockscaled has none): set BLOCKSCALED_KERNELS_DIR to \
             a checkout's kernels/, or unset BLOCKSCALED_BUILD_KERNELS to use the shipped images",
            kernels.display()
        ));
    }
    let out = PathBuf::from(env("OUT_DIR")).join("kernel-images");
    let mut builder = Builder::new(&kernels)
        .out_dir(&out)
        .dynamic_shared(registry::DYNAMIC_SMEM_SYMBOL, registry::DYNAMIC_SMEM_ALIGN);
    for &arch in &ARCHS {
        builder = builder.arch(arch);
    }
    if let Some(site) = plant {
        builder = builder.cfg(format!("blockscaled_plant=\"{site}\""));
    }
    for k in registry::KERNELS {
        if let Some(t) = k.max_threads {
            let archs: Vec<Arch> = ARCHS
                .into_iter()
                .filter(|a| k.targets.contains(&a.name()))
                .collect();
            builder = builder.launch_bounds_on(&archs, k.name, t, k.min_blocks_per_sm);
        }
    }
    let built = builder
        .build()
        .unwrap_or_else(|e| fail(&format!("building the GPU kernels from source failed: {e}")));
    for b in &built {
        if b.cubin.is_none() {
            // `include_bytes!` needs the file; empty means "no cubin: load the PTX".
            write(&out.join(format!("{}.cubin", b.arch.name())), b"");
        }
    }
    write(&out.join(MANIFEST), manifest(&out, &built).as_bytes());
    if let Some(site) = plant {
        println!(
            "cargo:warning=kernels built with a planted error at `{site}` (BLOCKSCALED_PLANT): for \
             the tests' sensitivity check only"
        );
        return out;
    }
    compare_with_shipped(&out, shipped);
    keep_for_developers(&out, &built);
    report_spills(&built, shipped);
    out
}

/// The kernels' stack frames and spills: those `KNOWN-SPILLS` (beside the shipped images) accepts,
/// at most its bytes and K-loop accesses, in one line; any other, more bytes than listed, or local
/// memory in a K loop that it does not accept, a warning of its own.
fn report_spills(built: &[BuiltPtx], shipped: &Path) {
    let list = shipped.join(KNOWN_SPILLS);
    println!("cargo:rerun-if-changed={}", list.display());
    let known: Vec<Known> = std::fs::read_to_string(&list)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .filter_map(Known::parse)
        .collect();
    let (mut within, mut unchecked) = (0, 0);
    for b in built {
        let arch = b.arch.name();
        for s in &b.spilling_kernels {
            let listed = known
                .iter()
                .find(|k| k.arch == arch && k.kernel == s.kernel);
            let mut fine = true;
            match listed {
                Some(k) if s.stack <= k.stack && s.stores <= k.stores => {}
                Some(k) => {
                    fine = false;
                    println!(
                        "cargo:warning={arch}: kernel {} now has a {}-byte stack frame and {} bytes of spill stores, more than the {} and {} {KNOWN_SPILLS} accepts (target/*/ptx/{arch}.ptxas.txt)",
                        s.kernel, s.stack, s.stores, k.stack, k.stores
                    )
                }
                None => {
                    fine = false;
                    println!(
                        "cargo:warning={arch}: kernel {} spills: a {}-byte stack frame, {} bytes of spill stores (target/*/ptx/{arch}.ptxas.txt); not in {KNOWN_SPILLS}",
                        s.kernel, s.stack, s.stores
                    )
                }
            }
            let accepted = listed.map_or(0, |k| k.k_loop);
            match s.in_k_loop {
                Some(l) if l.stores + l.loads > accepted => {
                    fine = false;
                    println!(
                        "cargo:warning={arch}: kernel {} accesses local memory inside its K loop: {} stores (STL) and {} loads (LDL) in the loop around its MMAs, paid every K block; {KNOWN_SPILLS} accepts {accepted} (`nvdisasm -c target/*/ptx/{arch}.cubin`)",
                        s.kernel, l.stores, l.loads
                    )
                }
                Some(_) => {}
                None => unchecked += 1,
            }
            if fine {
                within += 1;
            }
        }
    }
    if within > 0 {
        let (what, note) = if unchecked == 0 {
            ("stack frames, spills and K-loop accesses", "")
        } else {
            ("stack frames and spills", "; K loops not read")
        };
        println!(
            "cargo:warning={within} kernels have the {what} {KNOWN_SPILLS} accepts (host/kernel-images/{KNOWN_SPILLS}{note})"
        );
    }
}

/// One line of `KNOWN-SPILLS`: `target kernel stack-bytes spill-store-bytes [k-loop=N]`.
struct Known {
    arch: String,
    kernel: String,
    stack: u64,
    stores: u64,
    /// Local-memory instructions (STL + LDL) accepted inside the K loop; 0 when not given.
    k_loop: u64,
}

impl Known {
    fn parse(line: &str) -> Option<Known> {
        let f: Vec<&str> = line.split_whitespace().collect();
        let k_loop = match f.get(4) {
            Some(field) => field.strip_prefix("k-loop=")?.parse().ok()?,
            None => 0,
        };
        Some(Known {
            arch: f.first()?.to_string(),
            kernel: f.get(1)?.to_string(),
            stack: f.get(2)?.parse().ok()?,
            stores: f.get(3)?.parse().ok()?,
            k_loop,
        })
    }
}

/// What made the images, and their sizes: the shipped `MANIFEST` is this text, so a new toolchain
/// or ptxas shows as drift too.
fn manifest(dir: &Path, built: &[BuiltPtx]) -> String {
    let ptxas = built.iter().find_map(|b| b.ptxas_version.clone());
    let mut text = format!(
        "# blockscaled kernel images, built from kernels/ by scripts/update-images.sh; CI rebuilds them\n\
         # and fails on any difference. The cubins load on drivers of CUDA 13.0 (r580) or newer;\n\
         # the PTX (JIT-compiled at load) on older ones.\n\
         toolchain {PINNED_TOOLCHAIN}\n\
         ptxas {} {}\n",
        ptxas.as_deref().unwrap_or("none"),
        blockscaled_builder::PTXAS_FLAGS.join(" ")
    );
    for file in image_files() {
        let len = std::fs::metadata(dir.join(&file)).map_or(0, |m| m.len());
        text.push_str(&format!("{file} {len} bytes\n"));
    }
    text
}

fn compare_with_shipped(built: &Path, shipped: &Path) {
    println!("cargo:rerun-if-changed={}", shipped.display());
    let mut files = image_files();
    files.push(MANIFEST.to_string());
    let differ: Vec<String> = files
        .into_iter()
        .filter(|f| std::fs::read(built.join(f)).ok() != std::fs::read(shipped.join(f)).ok())
        .collect();
    if differ.is_empty() {
        return;
    }
    let msg = format!(
        "the shipped kernel images differ from this build of the sources in {} (the pinned \
         toolchain is {PINNED_TOOLCHAIN}, the pinned ptxas {PINNED_PTXAS_VERSION}): run \
         scripts/update-images.sh and commit host/kernel-images",
        differ.join(", ")
    );
    if std::env::var_os("BLOCKSCALED_CHECK_IMAGES").is_some_and(|v| v == "1") {
        fail(&msg);
    }
    println!("cargo:warning={msg}");
}

/// `target/<profile>/ptx/<arch>.{ptx,cubin,ptxas.txt}` and `MANIFEST`, where a developer (and
/// `scripts/update-images.sh`) finds them.
fn keep_for_developers(out: &Path, built: &[BuiltPtx]) {
    let Some(profile_dir) = PathBuf::from(env("OUT_DIR"))
        .ancestors()
        .nth(3)
        .map(Path::to_path_buf)
    else {
        return;
    };
    let dir = profile_dir.join("ptx");
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        fail(&format!("creating {}: {e}", dir.display()));
    }
    let mut files = image_files();
    files.push(MANIFEST.to_string());
    for b in built {
        if b.ptxas_report.is_some() {
            files.push(format!("{}.ptxas.txt", b.arch.name()));
        }
    }
    for f in files {
        if let Err(e) = std::fs::copy(out.join(&f), dir.join(&f)) {
            fail(&format!("copying {f} to {}: {e}", dir.display()));
        }
    }
}

fn image_files() -> Vec<String> {
    ARCHS
        .iter()
        .flat_map(|a| [format!("{}.ptx", a.name()), format!("{}.cubin", a.name())])
        .collect()
}

fn manifest_field<'a>(manifest: &'a str, key: &str) -> Option<&'a str> {
    manifest
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
        .and_then(|rest| rest.split_whitespace().next())
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| fail(&format!("{name} is not set")))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| fail(&format!("{}: {e}", path.display())))
}

fn write(path: &Path, bytes: &[u8]) {
    if let Err(e) = std::fs::write(path, bytes) {
        fail(&format!("writing {}: {e}", path.display()));
    }
}

/// Stops the build with `msg` alone in cargo's report (not a panic's backtrace noise).
fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    exit(1)
}
