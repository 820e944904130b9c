//! Kernel images: the module `Gpu::new` loads.
//!
//! The images are the ones shipped in `kernel-images/` (so a dependent project builds on stable
//! Rust with no toolchain for the GPU), or a build of `kernels/` from source with
//! `BLOCKSCALED_BUILD_KERNELS=1`, as inside this repository; `build.rs` chooses, and CI checks
//! that the two are byte-identical.
//!
//! Each GPU target is embedded twice: as the PTX, which the driver compiles when
//! the module is loaded (JIT), and as the cubin that the pinned ptxas made of that same PTX at build
//! time (`blockscaled_builder::PINNED_PTXAS_VERSION`, flags `blockscaled_builder::PTXAS_FLAGS`).
//! The cubin is loaded when the GPU's compute capability is the one it was assembled for (an
//! `sm_90a` cubin runs on 9.0 only, an `sm_100a` cubin on 10.0 only): no JIT at start-up, and
//! the same machine code under every driver. A cubin needs a driver of its ptxas' CUDA release or
//! newer (13.0: r580 and later); on an older driver, or any GPU the cubin does not fit, loading it
//! fails with one of [`FALLBACK_ERRORS`] and the PTX is loaded instead.
//!
//! `BLOCKSCALED_KERNEL_IMAGE=ptx` (or `cubin`) forces one image, to compare them; unset or `auto`
//! is the choice above.

use std::sync::Arc;

use cudarc::driver::sys::cudaError_enum as CuErr;
use cudarc::driver::{CudaContext, CudaModule, DriverError};
use cudarc::nvrtc::Ptx;

use crate::error::{Error, Result};

/// Which image of the kernels a [`Gpu`](crate::Gpu) runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelImage {
    /// The ptxas-built cubin (no JIT).
    Cubin,
    /// The PTX, compiled by the driver at load.
    Ptx,
}

impl std::fmt::Display for KernelImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KernelImage::Cubin => "cubin",
            KernelImage::Ptx => "ptx",
        })
    }
}

/// The release of the ptxas that made the embedded cubins (`"none"`: built without ptxas, PTX
/// only).
pub const PTXAS_VERSION: &str = env!("BLOCKSCALED_PTXAS_VERSION");

/// One target's two images.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TargetImages {
    /// The compute capability the cubin runs on.
    pub cc: (i32, i32),
    pub ptx: &'static str,
    /// Empty when the build had no ptxas.
    pub cubin: &'static [u8],
}

pub(crate) const SM90A: TargetImages = TargetImages {
    cc: (9, 0),
    ptx: include_str!(concat!(env!("BLOCKSCALED_IMAGE_DIR"), "/sm_90a.ptx")),
    cubin: include_bytes!(concat!(env!("BLOCKSCALED_IMAGE_DIR"), "/sm_90a.cubin")),
};

pub(crate) const SM100A: TargetImages = TargetImages {
    cc: (10, 0),
    ptx: include_str!(concat!(env!("BLOCKSCALED_IMAGE_DIR"), "/sm_100a.ptx")),
    cubin: include_bytes!(concat!(env!("BLOCKSCALED_IMAGE_DIR"), "/sm_100a.cubin")),
};

/// The errors of loading a cubin that mean "this driver or GPU cannot run it" (a cubin for another
/// GPU, or of a newer CUDA release than the driver's): the PTX is loaded instead. Any other error
/// (out of memory, a broken context) is returned.
pub const FALLBACK_ERRORS: [CuErr; 5] = [
    CuErr::CUDA_ERROR_NO_BINARY_FOR_GPU,
    CuErr::CUDA_ERROR_INVALID_IMAGE,
    CuErr::CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
    CuErr::CUDA_ERROR_INVALID_SOURCE,
    CuErr::CUDA_ERROR_NOT_SUPPORTED,
];

/// What `BLOCKSCALED_KERNEL_IMAGE` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Choice {
    Auto,
    Force(KernelImage),
}

fn choice(value: Option<&str>) -> Result<Choice> {
    match value.map(str::trim) {
        None | Some("") | Some("auto") => Ok(Choice::Auto),
        Some("cubin") => Ok(Choice::Force(KernelImage::Cubin)),
        Some("ptx") => Ok(Choice::Force(KernelImage::Ptx)),
        Some(other) => Err(Error::Architecture(format!(
            "BLOCKSCALED_KERNEL_IMAGE={other}: want auto, cubin or ptx"
        ))),
    }
}

/// Loads `images` into `ctx` (the GPU of compute capability `cc`): the cubin where it fits,
/// else the PTX. Returns the module and which image it is.
pub(crate) fn load(
    ctx: &Arc<CudaContext>,
    cc: (i32, i32),
    images: &TargetImages,
) -> Result<(Arc<CudaModule>, KernelImage)> {
    let env = std::env::var("BLOCKSCALED_KERNEL_IMAGE").ok();
    let cubin_fits = !images.cubin.is_empty() && cc == images.cc;
    match choice(env.as_deref())? {
        Choice::Force(KernelImage::Ptx) => load_ptx(ctx, images),
        Choice::Force(KernelImage::Cubin) if !cubin_fits => Err(Error::Architecture(format!(
            "BLOCKSCALED_KERNEL_IMAGE=cubin, but there is no cubin for compute capability \
             {}.{} (cubin for {}.{}, {} bytes; ptxas {PTXAS_VERSION})",
            cc.0,
            cc.1,
            images.cc.0,
            images.cc.1,
            images.cubin.len()
        ))),
        Choice::Force(KernelImage::Cubin) => Ok((load_cubin(ctx, images)?, KernelImage::Cubin)),
        Choice::Auto if !cubin_fits => load_ptx(ctx, images),
        Choice::Auto => match load_cubin(ctx, images) {
            Ok(m) => Ok((m, KernelImage::Cubin)),
            Err(e) if FALLBACK_ERRORS.contains(&e.0) => load_ptx(ctx, images),
            Err(e) => Err(e.into()),
        },
    }
}

fn load_cubin(
    ctx: &Arc<CudaContext>,
    images: &TargetImages,
) -> std::result::Result<Arc<CudaModule>, DriverError> {
    // A copy: `include_bytes!` data is only byte-aligned, the allocator's is 16-byte aligned (the
    // ELF loader reads 8-byte fields in place).
    ctx.load_module(Ptx::from_binary(images.cubin.to_vec()))
}

fn load_ptx(
    ctx: &Arc<CudaContext>,
    images: &TargetImages,
) -> Result<(Arc<CudaModule>, KernelImage)> {
    Ok((
        ctx.load_module(Ptx::from_src(images.ptx))?,
        KernelImage::Ptx,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choice_parses_the_override() {
        assert_eq!(choice(None).unwrap(), Choice::Auto);
        assert_eq!(choice(Some("auto")).unwrap(), Choice::Auto);
        assert_eq!(
            choice(Some("cubin")).unwrap(),
            Choice::Force(KernelImage::Cubin)
        );
        assert_eq!(
            choice(Some("ptx")).unwrap(),
            Choice::Force(KernelImage::Ptx)
        );
        assert!(matches!(choice(Some("sass")), Err(Error::Architecture(_))));
    }

    /// Every kernel the host can launch is an entry point of the module of each target the
    /// registry lists it for: the shipped images and the kernel table agree.
    #[test]
    fn every_registered_kernel_is_in_its_images() {
        use blockscaled_kernels::registry::KERNELS;
        for (t, arch) in [(SM90A, "sm_90a"), (SM100A, "sm_100a")] {
            let entries: Vec<&str> = t
                .ptx
                .lines()
                .filter_map(|l| l.trim_start().strip_prefix(".visible .entry "))
                .filter_map(|l| l.split('(').next())
                .collect();
            for k in KERNELS.iter().filter(|k| k.targets.contains(&arch)) {
                assert!(
                    entries.contains(&k.name),
                    "{} is not in the {arch} PTX",
                    k.name
                );
            }
            assert!(t.ptx.contains(&format!(".target {arch}")), "{arch}");
        }
    }

    /// A build with ptxas (CI's) embeds an ELF cubin for each target next to the PTX.
    #[test]
    fn cubins_are_embedded_when_ptxas_ran() {
        for t in [SM90A, SM100A] {
            assert!(t.ptx.contains(".entry "));
            if PTXAS_VERSION != "none" {
                assert!(t.cubin.starts_with(b"\x7fELF"), "cubin for {:?}", t.cc);
            }
        }
    }
}
