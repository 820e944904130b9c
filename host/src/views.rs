//! Matrices, tensors, outputs and groups over the caller's device memory: what an inference engine
//! holds already (its weights in one arena, its activations and outputs in its own allocations),
//! used without a copy.
//!
//! Three ways in, each checked as the owned path is (the description validated, the memory long
//! enough for it: [`Error::Shape`]; 16-byte aligned, as TMA and the kernels' vector accesses need:
//! [`Error::Alignment`]; on this GPU's context: [`Error::WrongGpu`]):
//! - a cudarc buffer or view borrowed for `'a` ([`IntoDeviceBytes`], [`IntoDeviceBytesMut`]): safe;
//!   cudarc's event tracking orders our launches after writes it knows of on other streams;
//! - a raw device address and length (`unsafe`: the caller vouches that the memory stays valid
//!   while the value lives and the work enqueued on it runs), ordered only by the stream of the
//!   [`Gpu`] handle that made it.
//!
//! A matrix over the caller's memory is prepared for the kernels as a device-quantized one is
//! (tensor maps over its address, scale re-layouts made on the GPU: no copy back, no wait); the
//! copies only weights need are made at its first use as weights or by [`Gpu::prepare_weights`].
//! The scale values themselves are not checked (that would need a copy back): a ue4m3 scale with
//! its sign bit set reads as its magnitude, as the kernels decode it.

use std::marker::PhantomData;

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DevicePtr, DeviceSlice, sys};

use crate::buffers::{DeviceMatrix, DeviceOutput, Mem, Prepared};
use crate::device::Gpu;
use crate::error::{Error, Result, shape};
use crate::format::{ElemType, OutType};
use crate::grouped::{DeviceGroups, GroupLayout, GroupValues};
use crate::matrix::{MatrixDesc, ScaleLayout};
use crate::quantizer::DeviceTensor;
use blockscaled_kernels::quantize::InputType;

/// The alignment every caller-memory buffer needs: TMA's global addresses and the kernels' 16-byte
/// vector loads and stores.
pub const DEVICE_ALIGN: usize = 16;

/// An element type whose device memory may be read as bytes and written with any bytes: integers,
/// floats (`half`'s too), and arrays of them. Sealed.
pub trait Plain: sealed::Sealed {}

mod sealed {
    pub trait Sealed {}
}

macro_rules! plain {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Plain for $t {}
    )*};
}
plain!(
    u8,
    i8,
    u16,
    i16,
    u32,
    i32,
    u64,
    i64,
    f32,
    f64,
    half::bf16,
    half::f16
);

/// Device memory a view constructor reads: `&CudaSlice<T>`, `&CudaView<T>`, `&CudaViewMut<T>` or
/// a `CudaView<u8>`, for a [`Plain`] `T`, seen as its bytes for `'a`.
pub trait IntoDeviceBytes<'a> {
    /// The memory as bytes.
    fn into_device_bytes(self) -> CudaView<'a, u8>;
}

/// Device memory a view constructor may write: `&mut CudaSlice<T>`, `&mut CudaViewMut<T>` or a
/// `CudaViewMut<u8>`, for a [`Plain`] `T`, seen as its bytes for `'a`.
pub trait IntoDeviceBytesMut<'a> {
    /// The memory as bytes.
    fn into_device_bytes_mut(self) -> CudaViewMut<'a, u8>;
}

fn byte_len<T>(len: usize) -> usize {
    len * std::mem::size_of::<T>()
}

impl<'a, T: Plain> IntoDeviceBytes<'a> for &'a CudaSlice<T> {
    fn into_device_bytes(self) -> CudaView<'a, u8> {
        // SAFETY: the bytes of a `Plain` T are valid u8s, and the view covers the same bytes.
        unsafe { self.transmute::<u8>(byte_len::<T>(self.len())) }
            .expect("a slice's own byte length fits it")
    }
}

impl<'a, T: Plain> IntoDeviceBytes<'a> for &'a CudaView<'_, T> {
    fn into_device_bytes(self) -> CudaView<'a, u8> {
        // SAFETY: as above.
        unsafe { self.transmute::<u8>(byte_len::<T>(self.len())) }
            .expect("a view's own byte length fits it")
    }
}

impl<'a, T: Plain> IntoDeviceBytes<'a> for &'a CudaViewMut<'_, T> {
    fn into_device_bytes(self) -> CudaView<'a, u8> {
        // SAFETY: as above.
        unsafe { self.transmute::<u8>(byte_len::<T>(self.len())) }
            .expect("a view's own byte length fits it")
    }
}

impl<'a> IntoDeviceBytes<'a> for CudaView<'a, u8> {
    fn into_device_bytes(self) -> CudaView<'a, u8> {
        self
    }
}

impl<'a, T: Plain> IntoDeviceBytesMut<'a> for &'a mut CudaSlice<T> {
    fn into_device_bytes_mut(self) -> CudaViewMut<'a, u8> {
        let len = byte_len::<T>(self.len());
        // SAFETY: any bytes are a valid `Plain` T, and the view covers the same bytes.
        unsafe { self.transmute_mut::<u8>(len) }.expect("a slice's own byte length fits it")
    }
}

impl<'a, T: Plain> IntoDeviceBytesMut<'a> for &'a mut CudaViewMut<'_, T> {
    fn into_device_bytes_mut(self) -> CudaViewMut<'a, u8> {
        let len = byte_len::<T>(self.len());
        // SAFETY: as above.
        unsafe { self.transmute_mut::<u8>(len) }.expect("a view's own byte length fits it")
    }
}

impl<'a> IntoDeviceBytesMut<'a> for CudaViewMut<'a, u8> {
    fn into_device_bytes_mut(self) -> CudaViewMut<'a, u8> {
        self
    }
}

/// A raw device buffer the caller vouches for: `len` bytes at `ptr`.
#[derive(Clone, Copy, Debug)]
pub struct RawDevice {
    /// The device address.
    pub ptr: sys::CUdeviceptr,
    /// Bytes from `ptr` that the caller owns.
    pub len: usize,
}

impl Gpu {
    /// A matrix over the caller's codes and scales (read only: a GEMM operand). `desc` says the
    /// format, shape, scale layout and tensor scale, with the rules of
    /// [`ScaledMatrix::from_parts`](crate::ScaledMatrix::from_parts); each buffer may be longer
    /// than the matrix (an offset view into an arena). For bf16 / fp16 matrices, see
    /// [`Gpu::half_view`].
    pub fn matrix_view<'a>(
        &self,
        desc: MatrixDesc,
        data: impl IntoDeviceBytes<'a>,
        scales: impl IntoDeviceBytes<'a>,
    ) -> Result<DeviceMatrix<'a>> {
        let data = Mem::View(data.into_device_bytes());
        let scales = Mem::View(scales.into_device_bytes());
        self.matrix_over(desc, data, scales, false)
    }

    /// [`Gpu::matrix_view`] over memory this crate may write: the destination of
    /// [`Gpu::quantize_into`] and [`Gpu::run_quantized`] in the caller's memory (an
    /// engine's activation buffer, quantized in place every step).
    pub fn matrix_view_mut<'a>(
        &self,
        desc: MatrixDesc,
        data: impl IntoDeviceBytesMut<'a>,
        scales: impl IntoDeviceBytesMut<'a>,
    ) -> Result<DeviceMatrix<'a>> {
        let data = Mem::ViewMut(data.into_device_bytes_mut());
        let scales = Mem::ViewMut(scales.into_device_bytes_mut());
        self.matrix_over(desc, data, scales, false)
    }

    /// [`Gpu::matrix_view_mut`] over raw device memory (`writable`: whether this crate may write
    /// it, as a quantizer's destination).
    ///
    /// # Safety
    /// `data` and `scales` are device memory of this GPU's context, valid for reads (and, where
    /// `writable`, writes) of their `len` bytes for as long as the returned matrix lives and until
    /// the work enqueued with it has finished, and nothing else writes them while that work runs
    /// unless ordered by this handle's stream. The lengths are checked against the allocations the
    /// driver knows of where it can tell.
    pub unsafe fn matrix_from_raw(
        &self,
        desc: MatrixDesc,
        data: RawDevice,
        scales: RawDevice,
        writable: bool,
    ) -> Result<DeviceMatrix<'static>> {
        let data = self.raw(data, writable, "the codes")?;
        let scales = self.raw(scales, writable, "the scales")?;
        self.matrix_over(desc, data, scales, false)
    }

    /// A bf16 or fp16 matrix `[batch][rows][k]` over the caller's memory, with the scale 1: the
    /// 16-bit kernel's operands and the 4-bit-weights kernel's bf16 activations (W4A16), as a
    /// framework holds them. Its scales (`batch` fp32 ones) are this crate's, one buffer made
    /// once and shared by every such view of the GPU; making a view allocates only the kernels'
    /// tensor maps over `data` (made once per view: keep a view where the memory stays).
    pub fn half_view<'a>(
        &self,
        data: impl IntoDeviceBytes<'a>,
        elem: ElemType,
        dims: (usize, usize, usize),
    ) -> Result<DeviceMatrix<'a>> {
        self.half_over(Mem::View(data.into_device_bytes()), elem, dims)
    }

    fn half_over<'a>(
        &self,
        data: Mem<'a>,
        elem: ElemType,
        (rows, k, batch): (usize, usize, usize),
    ) -> Result<DeviceMatrix<'a>> {
        if !matches!(elem, ElemType::BF16 | ElemType::F16) {
            return Err(Error::Format(format!(
                "half_view takes bf16 or fp16, not {} (block-scaled formats: matrix_view)",
                elem.name()
            )));
        }
        let format = crate::format::OperandFormat {
            elem,
            scale: crate::format::ScaleType::F32,
            block: crate::format::ScaleBlock::PerTensor,
            tensor_scale: false,
        };
        // (A scale per tensor: one per batch entry.)
        let desc = MatrixDesc {
            format,
            rows,
            k,
            batch,
            scale_layout: ScaleLayout::packed(crate::format::ScaleMajor::K, 1, 1),
            tensor_scale: 1.0,
        };
        // (The GPU's shared ones.)
        let scales = Mem::Shared(self.ones(batch.max(1))?);
        self.matrix_over(desc, data, scales, true)
    }

    /// [`Gpu::half_view`] over raw device memory.
    ///
    /// # Safety
    /// As [`Gpu::matrix_from_raw`], read only.
    pub unsafe fn half_from_raw(
        &self,
        data: RawDevice,
        elem: ElemType,
        dims: (usize, usize, usize),
    ) -> Result<DeviceMatrix<'static>> {
        let mem = self.raw(data, false, "the matrix")?;
        self.half_over(mem, elem, dims)
    }

    /// The matrix `desc` over `data` and `scales` (checked), prepared on the device.
    fn matrix_over<'a>(
        &self,
        desc: MatrixDesc,
        data: Mem<'a>,
        scales: Mem<'a>,
        unit_scale: bool,
    ) -> Result<DeviceMatrix<'a>> {
        let (data_bytes, scale_bytes) = desc.validate()?;
        self.fits(&data, data_bytes, "the codes")?;
        self.fits(&scales, scale_bytes, "the scales")?;
        let mut m = DeviceMatrix {
            gpu: self.id(),
            desc,
            data,
            scales,
            prepared: Prepared::default(),
            scratch: Default::default(),
        };
        self.prepare_on_device(&mut m, unit_scale)?;
        Ok(m)
    }

    /// A bf16, fp16 or fp32 tensor `[batch][rows][k]` over the caller's memory: a quantizer's
    /// input, or a fused epilogue's bias, residual or β·C.
    pub fn tensor_view<'a>(
        &self,
        data: impl IntoDeviceBytes<'a>,
        input: InputType,
        dims: (usize, usize, usize),
    ) -> Result<DeviceTensor<'a>> {
        self.tensor_over(Mem::View(data.into_device_bytes()), input, dims)
    }

    /// [`Gpu::tensor_view`] over raw device memory.
    ///
    /// # Safety
    /// As [`Gpu::matrix_from_raw`], read only.
    pub unsafe fn tensor_from_raw(
        &self,
        data: RawDevice,
        input: InputType,
        dims: (usize, usize, usize),
    ) -> Result<DeviceTensor<'static>> {
        let mem = self.raw(data, false, "the tensor")?;
        self.tensor_over(mem, input, dims)
    }

    fn tensor_over<'a>(
        &self,
        buf: Mem<'a>,
        input: InputType,
        (rows, k, batch): (usize, usize, usize),
    ) -> Result<DeviceTensor<'a>> {
        let bytes = rows
            .checked_mul(k)
            .and_then(|x| x.checked_mul(batch))
            .and_then(|x| x.checked_mul(input.bytes()))
            .ok_or_else(|| shape("rows × k × batch overflows"))?;
        if bytes == 0 {
            return Err(shape(format!("empty tensor {batch}×{rows}×{k}")));
        }
        self.fits(&buf, bytes, "the tensor")?;
        Ok(DeviceTensor {
            gpu: self.id(),
            input,
            rows,
            k,
            batch,
            buf,
        })
    }

    /// A GEMM output `[l][m][n]` of `dtype` over the caller's memory (not poisoned: the caller's
    /// bytes stay until a GEMM writes them; [`DeviceOutput::poison`] fills them with NaN).
    pub fn output_view<'a>(
        &self,
        buf: impl IntoDeviceBytesMut<'a>,
        dtype: OutType,
        dims: (usize, usize, usize),
    ) -> Result<DeviceOutput<'a>> {
        self.output_over(Mem::ViewMut(buf.into_device_bytes_mut()), dtype, dims)
    }

    /// [`Gpu::output_view`] over raw device memory.
    ///
    /// # Safety
    /// As [`Gpu::matrix_from_raw`], writable.
    pub unsafe fn output_from_raw(
        &self,
        buf: RawDevice,
        dtype: OutType,
        dims: (usize, usize, usize),
    ) -> Result<DeviceOutput<'static>> {
        let mem = self.raw(buf, true, "the output")?;
        self.output_over(mem, dtype, dims)
    }

    /// A grouped GEMM's groups over the caller's int32 values (a router's ends or counts where
    /// its kernel wrote them): read on the device and clamped by the kernels, as
    /// [`Gpu::device_groups`]' are.
    pub fn groups_view<'a>(
        &self,
        layout: GroupLayout,
        values: CudaView<'a, i32>,
    ) -> Result<DeviceGroups<'a>> {
        if values.is_empty() {
            return Err(shape("G = 0: a grouped GEMM needs at least one group"));
        }
        self.same_context(values.stream().context(), "the groups")?;
        let ptr = {
            let (ptr, _g) = values.device_ptr(values.stream());
            ptr
        };
        aligned(ptr, 4, "the groups")?;
        Ok(DeviceGroups {
            gpu: self.id(),
            layout,
            values: GroupValues::View(values),
            host_top: None,
        })
    }

    /// [`Gpu::groups_view`] over raw device memory: `buf.len / 4` int32 values (ends or counts
    /// as `layout` says), as a framework's tensor gives them (torch's `offs`, DeepGEMM's
    /// `masked_m`).
    ///
    /// # Safety
    /// As [`Gpu::matrix_from_raw`], read only: `buf` is `buf.len` bytes of this GPU's memory,
    /// valid until the work enqueued on them has finished.
    pub unsafe fn groups_from_raw(
        &self,
        layout: GroupLayout,
        buf: RawDevice,
    ) -> Result<DeviceGroups<'static>> {
        if buf.len == 0 || !buf.len.is_multiple_of(4) {
            return Err(shape(format!(
                "the groups: {} bytes are not a whole number of int32 values (at least one)",
                buf.len
            )));
        }
        aligned(buf.ptr, 4, "the groups")?;
        let mem = self.raw(buf, false, "the groups")?;
        Ok(DeviceGroups {
            gpu: self.id(),
            layout,
            values: GroupValues::Raw(mem),
            host_top: None,
        })
    }

    /// `mem` as a checked raw buffer: on this GPU, within its allocation where the driver knows
    /// it.
    fn raw(&self, r: RawDevice, writable: bool, what: &str) -> Result<Mem<'static>> {
        if r.ptr == 0 {
            return Err(shape(format!("{what}: a null device address")));
        }
        self.context().bind_to_thread()?;
        let ordinal = pointer_attribute::<i32>(
            r.ptr,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        );
        match ordinal {
            Some(o) if o as usize != self.context().ordinal() => {
                return Err(Error::WrongGpu(format!(
                    "{what} is memory of GPU {o}, not of this Gpu's GPU {}",
                    self.context().ordinal()
                )));
            }
            Some(_) => {}
            None => {
                return Err(Error::WrongGpu(format!(
                    "{what} at {:#x} is not device memory the driver knows",
                    r.ptr
                )));
            }
        }
        let start = pointer_attribute::<sys::CUdeviceptr>(
            r.ptr,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        );
        let size = pointer_attribute::<usize>(
            r.ptr,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        );
        if let (Some(start), Some(size)) = (start, size) {
            let end = (r.ptr - start) as usize + r.len;
            if end > size {
                return Err(shape(format!(
                    "{what}: {} bytes at offset {} run past its allocation of {size} bytes",
                    r.len,
                    r.ptr - start
                )));
            }
        }
        Ok(Mem::Raw {
            ptr: r.ptr,
            len: r.len,
            stream: self.stream().clone(),
            writable,
            life: PhantomData,
        })
    }

    /// `Error::Shape` unless `mem` holds `bytes`, `Error::Alignment` unless it starts on a
    /// 16-byte boundary, `Error::WrongGpu` unless it is of this GPU's context.
    fn fits(&self, mem: &Mem<'_>, bytes: usize, what: &str) -> Result<()> {
        self.same_context(mem.stream().context(), what)?;
        if mem.len() < bytes {
            return Err(shape(format!(
                "{what}: {bytes} bytes needed, the memory holds {}",
                mem.len()
            )));
        }
        aligned(mem.address(), DEVICE_ALIGN as u64, what)
    }

    /// An output over `buf` (checked to hold it), prepared for the kernels.
    pub(crate) fn output_over<'a>(
        &self,
        buf: Mem<'a>,
        dtype: OutType,
        (m, n, l): (usize, usize, usize),
    ) -> Result<DeviceOutput<'a>> {
        let bytes = crate::buffers::output_bytes(dtype, (m, n, l))?;
        self.fits(&buf, bytes, "the output")?;
        let mut out = DeviceOutput {
            gpu: self.id(),
            dtype,
            m,
            n,
            l,
            buf,
            prepared: Prepared::default(),
        };
        self.prepare_output(&mut out)?;
        Ok(out)
    }
}

/// `Error::Alignment` unless `ptr` is a multiple of `align`.
fn aligned(ptr: u64, align: u64, what: &str) -> Result<()> {
    if ptr.is_multiple_of(align) {
        Ok(())
    } else {
        Err(Error::Alignment(format!(
            "{what} starts at {ptr:#x}, not a multiple of {align} bytes (TMA and the kernels' \
             vector accesses need it)"
        )))
    }
}

/// A pointer attribute of `ptr`, `None` where the driver has none for it (memory it does not
/// know, or an attribute that kind of memory lacks).
fn pointer_attribute<T: Default>(
    ptr: sys::CUdeviceptr,
    attr: sys::CUpointer_attribute,
) -> Option<T> {
    let mut value = T::default();
    // SAFETY: `value` is a live T of the attribute's size (i32 for the ordinal, a CUdeviceptr for
    // the range start, a size_t for the range size); the driver only writes it.
    let r = unsafe { sys::cuPointerGetAttribute((&mut value as *mut T).cast(), attr, ptr) };
    (r == sys::CUresult::CUDA_SUCCESS).then_some(value)
}
