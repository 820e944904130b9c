//! Host side of the SIMT reference kernel (`reference_blockscaled_gemm`): every format and scale
//! layout, float64 accumulation; what `Gpu::reference_gemm` runs and what checks the fast kernels.

use cudarc::driver::CudaFunction;

use crate::error::{Result, config, shape};
use crate::families::persistent::Loader;
use crate::families::{Families, Family, Gemm, PlanConfig};
use crate::launch::Launch;
use crate::matrix::GemmShape;
use blockscaled_kernels::params::{GemmParams, REFERENCE_BLOCK_M, REFERENCE_BLOCK_N};
use blockscaled_kernels::registry;

/// Most blocks along a grid's y and z.
const MAX_GRID_YZ: usize = 65535;

/// The loaded reference kernel (in every module).
pub(crate) struct ReferenceKernel {
    func: CudaFunction,
}

impl Family for ReferenceKernel {}

/// The reference kernel's configuration: it has none (a thread per output element).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reference;

impl PlanConfig for Reference {
    fn validate(&self, shape: &GemmShape) -> Result<()> {
        validate(shape)
    }

    fn fused_columns(&self) -> Result<u32> {
        Err(config(
            "the reference kernel has no fused epilogue (the sm90 kernels have)",
        ))
    }

    fn launch(&self, families: &Families, g: Gemm<'_, '_>) -> Result<()> {
        families
            .require::<ReferenceKernel>("reference kernel")?
            .gemm(g)
    }
}

/// The grid is (N / 32, M / 8, L) blocks: M and L must fit its y and z.
pub(crate) fn validate(s: &GemmShape) -> Result<()> {
    if s.m.div_ceil(REFERENCE_BLOCK_M as usize) > MAX_GRID_YZ || s.l > MAX_GRID_YZ {
        return Err(shape(format!(
            "M = {} or L = {}: the reference kernel takes at most {MAX_GRID_YZ} blocks of \
             {REFERENCE_BLOCK_M} rows and {MAX_GRID_YZ} batch entries",
            s.m, s.l
        )));
    }
    Ok(())
}

impl ReferenceKernel {
    pub(crate) fn load(cx: &Loader) -> Result<Self> {
        Ok(ReferenceKernel {
            func: cx.module.load_function(registry::REFERENCE_GEMM.name)?,
        })
    }

    /// C = A · Bᵀ, one thread per element of C.
    pub(crate) fn gemm(&self, g: Gemm<'_, '_>) -> Result<()> {
        g.dense_only("the reference kernel")?;
        g.plain_only("the reference kernel")?;
        let Gemm {
            stream,
            work: _,
            shape: GemmShape { m, n, k, l },
            a,
            b,
            c,
            ..
        } = g;
        let mut launch = Launch::new(stream, &self.func)
            .grid(
                (n as u32).div_ceil(REFERENCE_BLOCK_N),
                (m as u32).div_ceil(REFERENCE_BLOCK_M),
                l as u32,
            )
            .block(REFERENCE_BLOCK_N, REFERENCE_BLOCK_M, 1);
        let a_params = a.desc.params(launch.ptr(&a.data), launch.ptr(&a.scales));
        let b_params = b.desc.params(launch.ptr(&b.data), launch.ptr(&b.scales));
        let params = GemmParams {
            a: a_params,
            b: b_params,
            out: launch.ptr_mut(&mut c.buf),
            out_row_stride: n as u64,
            out_batch_stride: (m * n) as u64,
            m: m as u32,
            n: n as u32,
            k: k as u32,
            l: l as u32,
            out_type: c.dtype as u32,
            _pad: 0,
        };
        // SAFETY: the kernel reads exactly the buffers the validated descriptors describe (sizes
        // checked when the host matrices were built, copied whole at upload) and writes l·m·n
        // elements of `c.dtype` into `c.buf` (sized by `Gpu::output` for this shape); every
        // address is one of this launch's guarded buffers.
        unsafe { launch.launch(&params) }?;
        Ok(())
    }
}
