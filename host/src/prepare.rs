//! Where a family's preparation of an operand reads the matrix ([`Source`]): the host's copy of an
//! upload, or the device buffers a device quantizer (or a GEMM's quantized output) wrote. Both
//! run the same descriptions of each copy (`blockscaled_kernels::prepare`): the host over its
//! bytes, the device kernels over the GPU's, so a family prepares an operand with one function
//! and a device-quantized matrix never goes back to the host. The copies only weights need
//! ([`Preparers::row_tops`], [`Preparers::w4_reorder`]) are made later, from the matrix on the
//! device, uploads included.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr};

use crate::buffers::{DeviceMatrix, Mem};
use crate::error::{Result, shape};
use crate::launch::{KernelParams, Launch};
use crate::matrix::{MatrixDesc, ScaledMatrix};
use blockscaled_kernels::prepare::{
    self as kp, GATHER, Gather, PREPARE_THREADS, ROW_TOPS, RowTops, W4_REORDER, W4Reorder,
};

/// The loaded preparation kernels.
#[derive(Clone)]
pub(crate) struct Preparers {
    sm_count: u32,
    gather: CudaFunction,
    row_tops: CudaFunction,
    w4_reorder: CudaFunction,
}

impl Preparers {
    pub(crate) fn load(module: &Arc<CudaModule>, sm_count: u32) -> Result<Self> {
        Ok(Preparers {
            sm_count,
            gather: module.load_function(GATHER.name)?,
            row_tops: module.load_function(ROW_TOPS.name)?,
            w4_reorder: module.load_function(W4_REORDER.name)?,
        })
    }
}

/// A preparation kernel's parameters: where it reads and writes.
trait PrepareParams: KernelParams {
    fn at(self, src: u64, dst: u64) -> Self;
}

macro_rules! prepare_params {
    ($($t:ty),*) => {$(
        impl PrepareParams for $t {
            fn at(self, src: u64, dst: u64) -> Self {
                Self { src, dst, ..self }
            }
        }
    )*};
}
prepare_params!(Gather, RowTops, W4Reorder);

impl Preparers {
    /// One launch of `func` for `p` over `grid` blocks, reading `src` and writing `out`.
    /// # Safety
    /// `func` is `p`'s kernel, the grid is one it takes, and `src` and `out` hold what `p` says
    /// it reads and writes.
    unsafe fn launch<P: PrepareParams, S, T>(
        &self,
        stream: &Arc<CudaStream>,
        (func, grid): (&CudaFunction, (u32, u32)),
        p: P,
        src: &(impl DevicePtr<S> + ?Sized),
        out: &mut CudaSlice<T>,
    ) -> Result<()> {
        let mut launch =
            Launch::new(stream, func)
                .grid(grid.0, grid.1, 1)
                .block(PREPARE_THREADS, 1, 1);
        let p = p.at(launch.ptr(src), launch.ptr_mut(out));
        // SAFETY: the caller's contract.
        unsafe { launch.launch(&p) }?;
        Ok(())
    }

    /// A one-dimensional grid for `threads` threads in all: at most eight blocks an SM (the
    /// threads go round).
    fn grid_1d(&self, threads: u64) -> (u32, u32) {
        (kp::blocks(threads, self.sm_count * 8), 1)
    }

    /// [`Gather`]'s grid: x covers a plane's entries, y takes a plane each (about eight blocks
    /// an SM in all; the threads go round the rest).
    fn grid_gather(&self, g: &Gather) -> (u32, u32) {
        let slab = g.rows_out as u64 * g.per as u64;
        let x = kp::blocks(slab, self.sm_count * 8);
        let runs = (g.batch as u64 * g.planes as u64).clamp(1, 65535) as u32;
        (x, (self.sm_count * 8).div_ceil(x).clamp(1, runs))
    }
}

/// The destination of a scale re-layout (see [`Gather`]): `[batch][planes][rows_out][per]`,
/// entry `(l, p, r, c)` the scale of element (row `r·row_step`, column `(p·per + c)·k_step`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct GatherTo {
    pub planes: usize,
    pub rows_out: usize,
    pub per: usize,
    pub row_step: usize,
    pub k_step: usize,
    /// fp32 scales as their values ([`ScaledMatrix::scale_value`]: times the tensor scale), not
    /// their bytes.
    pub values: bool,
}

/// A matrix an operand is prepared from.
pub(crate) enum Source<'a> {
    Host(&'a ScaledMatrix),
    Device {
        desc: MatrixDesc,
        scales: &'a Mem<'a>,
        kernels: &'a Preparers,
        /// A 16-bit matrix whose scale is 1 (over the caller's memory, [`Gpu::half_view`]):
        /// what the host knows of it without reading it back.
        ///
        /// [`Gpu::half_view`]: crate::Gpu::half_view
        unit_scale: bool,
    },
}

/// What a re-layout's buffer holds: bytes, or f32 (four-byte scales only).
pub(crate) trait ScaleWord: cudarc::driver::DeviceRepr + Copy + Unpin {
    fn from_le(b: &[u8]) -> Self;
}

impl ScaleWord for u8 {
    fn from_le(b: &[u8]) -> Self {
        b[0]
    }
}

impl ScaleWord for f32 {
    fn from_le(b: &[u8]) -> Self {
        f32::from_le_bytes(b.try_into().expect("4 bytes"))
    }
}

/// An uninitialized buffer of `bytes` bytes, as `T`s (every entry is written before anything
/// reads it: the preparations write whole layouts).
fn alloc<T: ScaleWord>(stream: &Arc<CudaStream>, bytes: usize) -> Result<CudaSlice<T>> {
    // SAFETY: u8 and f32 accept any bit pattern; the callers write every entry.
    unsafe { crate::alloc::uninit::<T>(stream, bytes / std::mem::size_of::<T>()) }
}

/// A typed error unless `out` holds exactly `bytes` bytes.
fn fits<T>(out: &CudaSlice<T>, bytes: usize) -> Result<()> {
    let have = out.len() * std::mem::size_of::<T>();
    if have != bytes {
        return Err(shape(format!(
            "a prepared buffer holds {have} bytes, the matrix's layout {bytes}"
        )));
    }
    Ok(())
}

fn u32_of(x: usize, what: &str) -> Result<u32> {
    u32::try_from(x)
        .map_err(|_| shape(format!("{what} ({x}) does not fit the preparation kernels")))
}

impl<'a> Source<'a> {
    /// A matrix on the GPU as a source, read with `kernels` (uploads too: their codes and scales
    /// are on the device in the matrix's layout).
    pub(crate) fn of(m: &'a DeviceMatrix, kernels: &'a Preparers) -> Self {
        Source::Device {
            desc: m.desc,
            scales: &m.scales,
            kernels,
            unit_scale: false,
        }
    }
}

impl Source<'_> {
    pub(crate) fn desc(&self) -> &MatrixDesc {
        match self {
            Source::Host(m) => m.desc(),
            Source::Device { desc, .. } => desc,
        }
    }

    /// The one scale of a matrix with a scale per tensor, where the host knows it and every
    /// batch entry has the same: an upload's, read from its bytes, or 1 for a 16-bit matrix over
    /// the caller's memory. `None` otherwise (entries with their own scales, or scales written
    /// on the device: the 16-bit kernels take the scale as a launch parameter).
    pub(crate) fn uniform_scale(&self) -> Option<f32> {
        match self {
            Source::Host(m) => {
                let s = m.scale_value(0, 0, 0) as f32;
                (1..m.batch())
                    .all(|l| (m.scale_value(l, 0, 0) as f32).to_bits() == s.to_bits())
                    .then_some(s)
            }
            Source::Device { unit_scale, .. } => unit_scale.then_some(1.0),
        }
    }

    /// The scales re-laid out as `to` says, as bytes or (four-byte scales) f32.
    pub(crate) fn gather<T: ScaleWord>(
        &self,
        stream: &Arc<CudaStream>,
        to: GatherTo,
    ) -> Result<CudaSlice<T>> {
        let g = self.gather_of::<T>(to)?;
        let mut out = alloc::<T>(stream, g.entries() as usize * g.bytes as usize)?;
        self.gather_into(stream, to, &mut out)?;
        Ok(out)
    }

    /// [`Self::gather`] into `out`, a buffer it made for a matrix of this description.
    pub(crate) fn gather_into<T: ScaleWord>(
        &self,
        stream: &Arc<CudaStream>,
        to: GatherTo,
        out: &mut CudaSlice<T>,
    ) -> Result<()> {
        let g = self.gather_of::<T>(to)?;
        fits(out, g.entries() as usize * g.bytes as usize)?;
        match self {
            Source::Host(m) => {
                let (src, b) = (m.scales(), g.bytes as usize);
                let mut v = vec![0u8; g.entries() as usize * b];
                for (o, dst) in v.chunks_exact_mut(b).enumerate() {
                    if let Some(s) = g.source(o as u64) {
                        let s = &src[b * s as usize..][..b];
                        if b == 4 && g.mul != 1.0 {
                            let x = f32::from_le_bytes(s.try_into().expect("4 bytes"));
                            dst.copy_from_slice(&(x * g.mul).to_le_bytes());
                        } else {
                            dst.copy_from_slice(s);
                        }
                    }
                }
                let v: Vec<T> = v
                    .chunks_exact(std::mem::size_of::<T>())
                    .map(T::from_le)
                    .collect();
                Ok(stream.memcpy_htod(&v, out)?)
            }
            // SAFETY: `scales` is the matrix's packed scale buffer, which holds every index the
            // layout (its desc) gives for elements inside the matrix; `out` holds `entries()`
            // entries of `bytes` (checked above), 4-byte aligned (an allocation).
            Source::Device {
                scales, kernels, ..
            } => unsafe {
                kernels.launch(
                    stream,
                    (&kernels.gather, kernels.grid_gather(&g)),
                    g,
                    *scales,
                    out,
                )
            },
        }
    }

    fn gather_of<T: ScaleWord>(&self, to: GatherTo) -> Result<Gather> {
        let d = self.desc();
        let l = &d.scale_layout;
        let (br, bk) = d.block_extent();
        let bytes = d.format.scale.bytes();
        let word = std::mem::size_of::<T>();
        if !bytes.is_multiple_of(word) {
            return Err(crate::Error::Config(format!(
                "{bytes}-byte scales do not re-lay out into {word}-byte words"
            )));
        }
        Ok(Gather {
            src: 0,
            dst: 0,
            stride_l: l.batch_stride as u64,
            stride_r: l.row_stride as u64,
            stride_k: l.k_stride as u64,
            rows: u32_of(d.rows, "rows")?,
            k: u32_of(d.k, "K")?,
            block_rows: u32_of(br, "a scale block's rows")?,
            block_k: u32_of(bk, "a scale block's K")?,
            batch: u32_of(d.batch, "the batch")?,
            planes: u32_of(to.planes, "planes")?,
            rows_out: u32_of(to.rows_out, "rows")?,
            per: u32_of(to.per, "scales per row")?,
            row_step: u32_of(to.row_step, "a row step")?,
            k_step: u32_of(to.k_step, "a K step")?,
            bytes: bytes as u32,
            mul: if to.values && bytes == 4 {
                d.tensor_scale
            } else {
                1.0
            },
        })
    }
}

/// The copies only weights need, made on the device from a matrix's own codes and scales (an
/// upload's are on the device too) when a GEMM first takes it as weights (`OnFirstUse`).
impl Preparers {
    /// Each row's largest one-byte scale code other than NaN of `m`, `[batch][rows_pad]`
    /// ([`RowTops`]): a warp per row.
    pub(crate) fn row_tops(
        &self,
        stream: &Arc<CudaStream>,
        m: &DeviceMatrix,
        rows_pad: usize,
    ) -> Result<CudaSlice<u8>> {
        let d = &m.desc;
        let l = &d.scale_layout;
        let t = RowTops {
            src: 0,
            dst: 0,
            stride_l: l.batch_stride as u64,
            stride_r: l.row_stride as u64,
            stride_k: l.k_stride as u64,
            rows: u32_of(d.rows, "rows")?,
            k_blocks: u32_of(l.k_blocks, "K blocks")?,
            batch: u32_of(d.batch, "the batch")?,
            rows_pad: u32_of(rows_pad, "rows")?,
            nv: (d.format.scale == crate::format::ScaleType::UE4M3) as u32,
            pad: 0,
        };
        let mut out = alloc::<u8>(stream, t.entries() as usize)?;
        // SAFETY: `m.scales` holds the one-byte scale of every (l, row, K block) of its layout;
        // `out` `entries()` bytes.
        unsafe {
            self.launch(
                stream,
                (&self.row_tops, self.grid_1d(32 * t.entries())),
                t,
                &m.scales,
                &mut out,
            )
        }?;
        Ok(out)
    }

    /// `m`'s e2m1 codes reordered for the 4-bit-weights kernel ([`W4Reorder`]), K in `chunks` of
    /// 64.
    pub(crate) fn w4_reorder(
        &self,
        stream: &Arc<CudaStream>,
        m: &DeviceMatrix,
        chunks: usize,
    ) -> Result<CudaSlice<u8>> {
        let d = &m.desc;
        let w = W4Reorder {
            src: 0,
            dst: 0,
            rows: u32_of(d.rows, "rows")?,
            k: u32_of(d.k, "K")?,
            batch: u32_of(d.batch, "the batch")?,
            chunks: u32_of(chunks, "K chunks")?,
        };
        let mut out = alloc::<u8>(stream, 32 * w.entries() as usize)?;
        // SAFETY: `m.data` holds the matrix's batch · rows · k / 2 code bytes (e2m1, its desc; K
        // a multiple of 32: the W4 family's condition), 16-byte aligned (an allocation; rows of
        // whole 16 bytes); `out` `32 · entries()` bytes.
        unsafe {
            self.launch(
                stream,
                (&self.w4_reorder, self.grid_1d(w.entries())),
                w,
                &m.data,
                &mut out,
            )
        }?;
        Ok(out)
    }
}
