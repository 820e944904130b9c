//! `blockscaled._native`: the Python package's compiled part. Tensors come in as they are (torch
//! tensors, read through their own methods, or any `__cuda_array_interface__` producer), are
//! wrapped as views over their device memory without a copy (the crate's raw-address
//! constructors, which check size, alignment and context), and the GEMM is enqueued on the
//! caller's stream: torch's current stream of the tensors' device, the interface's `stream`, or
//! the `stream` argument. Errors are Python exceptions carrying the crate's typed error text.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use blockscaled::{
    Activation, BsrMatrix, Call, DeviceMatrix, ElemType, Epilogue, Error, Fp8, Gpu, GroupLayout,
    InputType, MatrixDesc, OutType, QuantizeOptions, RawDevice, Recipe, ScaleLayout, SparseSide,
};
use cudarc::driver::{CudaContext, sys};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

create_exception!(
    _native,
    BlockscaledError,
    PyException,
    "An error of the blockscaled crate."
);
create_exception!(
    _native,
    ShapeError,
    BlockscaledError,
    "Shapes that do not fit (Error::Shape)."
);
create_exception!(
    _native,
    AlignmentError,
    BlockscaledError,
    "A buffer not 16-byte aligned."
);
create_exception!(
    _native,
    FormatError,
    BlockscaledError,
    "A format the call cannot take."
);
create_exception!(
    _native,
    ConfigError,
    BlockscaledError,
    "A configuration that cannot run."
);
create_exception!(
    _native,
    ArchitectureError,
    BlockscaledError,
    "A GPU without kernels."
);
create_exception!(
    _native,
    NoDeviceError,
    BlockscaledError,
    "No CUDA driver or no such GPU."
);
create_exception!(
    _native,
    WrongGpuError,
    BlockscaledError,
    "Memory of another GPU or the host."
);
create_exception!(
    _native,
    DriverError,
    BlockscaledError,
    "A CUDA driver error."
);

/// The crate's error as the Python exception of its kind, with its text.
fn py_err(e: Error) -> PyErr {
    let text = e.to_string();
    match e {
        Error::Shape(_) | Error::Sparse(_) => ShapeError::new_err(text),
        Error::Alignment(_) => AlignmentError::new_err(text),
        Error::Format(_) => FormatError::new_err(text),
        Error::Config(_) => ConfigError::new_err(text),
        Error::Architecture(_) => ArchitectureError::new_err(text),
        Error::NoDevice(_) => NoDeviceError::new_err(text),
        Error::WrongGpu(_) => WrongGpuError::new_err(text),
        Error::Driver(_) => DriverError::new_err(text),
        _ => BlockscaledError::new_err(text),
    }
}

/// Element types a tensor can hold here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dtype {
    E4m3,
    E5m2,
    F32,
    Bf16,
    F16,
    I32,
    /// MX scales: a power of two per byte (torch's `float8_e8m0fnu`).
    E8m0,
    /// Two e2m1 codes per byte, the first in the low nibble (torch's `float4_e2m1fn_x2`).
    E2m1x2,
}

impl Dtype {
    /// torch's dtype names (`str(t.dtype)`).
    fn of_torch(name: &str) -> Option<Dtype> {
        Some(match name {
            "torch.float8_e4m3fn" => Dtype::E4m3,
            "torch.float8_e5m2" => Dtype::E5m2,
            "torch.float32" => Dtype::F32,
            "torch.bfloat16" => Dtype::Bf16,
            "torch.float16" => Dtype::F16,
            "torch.int32" => Dtype::I32,
            "torch.float8_e8m0fnu" => Dtype::E8m0,
            "torch.float4_e2m1fn_x2" => Dtype::E2m1x2,
            _ => return None,
        })
    }

    /// `__cuda_array_interface__` type strings: NumPy's, so bytes (`|u1`) stand for FP8 e4m3
    /// codes (NumPy has no FP8 or bfloat16).
    fn of_typestr(s: &str) -> Option<Dtype> {
        Some(match s {
            "|u1" | "<u1" => Dtype::E4m3,
            "<f4" => Dtype::F32,
            "<f2" => Dtype::F16,
            "<i4" => Dtype::I32,
            _ => return None,
        })
    }

    /// A 16- or 32-bit float's type as the crate's tensors name it (bf16, fp16, else fp32).
    fn input(self) -> InputType {
        match self {
            Dtype::Bf16 => InputType::Bf16,
            Dtype::F16 => InputType::F16,
            _ => InputType::F32,
        }
    }

    fn bytes(self) -> usize {
        match self {
            Dtype::E4m3 | Dtype::E5m2 | Dtype::E8m0 | Dtype::E2m1x2 => 1,
            Dtype::Bf16 | Dtype::F16 => 2,
            Dtype::F32 | Dtype::I32 => 4,
        }
    }
}

/// One tensor argument: where it is and how it is laid out.
#[derive(Debug)]
struct Tensor {
    name: &'static str,
    ptr: u64,
    shape: Vec<usize>,
    /// In elements.
    strides: Vec<usize>,
    dtype: Dtype,
    /// The CUDA device's ordinal, where the producer says.
    device: Option<usize>,
    /// The producer's stream, where it says (`__cuda_array_interface__`).
    stream: Option<u64>,
}

/// What a call reads of torch, looked up once the first torch tensor arrives (torch is loaded
/// then): its tensor type, its dtypes, and the current stream's raw handle (one C call; the
/// `torch.cuda.current_stream` object costs microseconds to make).
struct TorchApi {
    tensor: Py<PyType>,
    dtypes: Vec<(Py<PyAny>, Dtype)>,
    raw_stream: Option<Py<PyAny>>,
}

static TORCH: PyOnceLock<TorchApi> = PyOnceLock::new();

impl TorchApi {
    /// torch's API, where torch is loaded (`sys.modules` holds it); `None` otherwise (nothing
    /// is imported).
    fn get(py: Python<'_>) -> PyResult<Option<&'static TorchApi>> {
        if let Some(api) = TORCH.get(py) {
            return Ok(Some(api));
        }
        let modules = py.import("sys")?.getattr("modules")?;
        let Some(torch) = modules.cast::<PyDict>()?.get_item("torch")? else {
            return Ok(None);
        };
        let api = TORCH.get_or_try_init(py, || {
            let dtypes = DTYPE_NAMES
                .iter()
                .filter_map(|(name, d)| Some((torch.getattr(*name).ok()?.unbind(), *d)))
                .collect();
            let raw_stream = torch
                .getattr("_C")
                .and_then(|c| c.getattr("_cuda_getCurrentRawStream"))
                .ok()
                .map(Bound::unbind);
            Ok::<_, PyErr>(TorchApi {
                tensor: torch.getattr("Tensor")?.cast_into::<PyType>()?.unbind(),
                dtypes,
                raw_stream,
            })
        })?;
        Ok(Some(api))
    }

    fn dtype(&self, obj: &Bound<'_, PyAny>) -> Option<Dtype> {
        self.dtypes
            .iter()
            .find(|(d, _)| d.bind(obj.py()).is(obj))
            .map(|(_, d)| *d)
    }
}

/// torch's dtypes by attribute name.
const DTYPE_NAMES: [(&str, Dtype); 8] = [
    ("float8_e4m3fn", Dtype::E4m3),
    ("float8_e5m2", Dtype::E5m2),
    ("float32", Dtype::F32),
    ("bfloat16", Dtype::Bf16),
    ("float16", Dtype::F16),
    ("int32", Dtype::I32),
    ("float8_e8m0fnu", Dtype::E8m0),
    ("float4_e2m1fn_x2", Dtype::E2m1x2),
];

impl Tensor {
    /// Reads a torch tensor (by its methods: no torch import) or a `__cuda_array_interface__`
    /// producer.
    fn of(name: &'static str, obj: &Bound<'_, PyAny>) -> PyResult<Tensor> {
        let py = obj.py();
        if let Some(api) = TorchApi::get(py)?
            && obj.is_instance(api.tensor.bind(py))?
        {
            return Tensor::of_torch(name, obj, api);
        }
        if obj.hasattr("data_ptr")? && obj.hasattr("dtype")? && obj.hasattr("stride")? {
            let dtype_name = obj.getattr("dtype")?.str()?.to_string();
            let dtype = Dtype::of_torch(&dtype_name).ok_or_else(|| {
                PyTypeError::new_err(format!(
                    "{name}: dtype {dtype_name} is not one blockscaled takes here"
                ))
            })?;
            if !obj.getattr("is_cuda")?.extract::<bool>()? {
                return Err(PyValueError::new_err(format!(
                    "{name}: a CUDA tensor is needed (this one is on {})",
                    obj.getattr("device")?.str()?
                )));
            }
            let device = obj
                .getattr("device")?
                .getattr("index")?
                .extract::<Option<usize>>()?;
            let strides: Vec<i64> = obj.call_method0("stride")?.extract()?;
            let strides = strides
                .into_iter()
                .map(|s| {
                    usize::try_from(s)
                        .map_err(|_| PyValueError::new_err(format!("{name}: negative stride {s}")))
                })
                .collect::<PyResult<_>>()?;
            return Ok(Tensor {
                name,
                ptr: obj.call_method0("data_ptr")?.extract()?,
                shape: obj.getattr("shape")?.extract()?,
                strides,
                dtype,
                device,
                stream: None,
            });
        }
        if obj.hasattr("__cuda_array_interface__")? {
            let cai = obj.getattr("__cuda_array_interface__")?;
            let cai = cai.cast::<PyDict>()?;
            let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
                cai.get_item(k)?.ok_or_else(|| {
                    PyValueError::new_err(format!("{name}: __cuda_array_interface__ has no `{k}`"))
                })
            };
            let typestr: String = get("typestr")?.extract()?;
            let dtype = Dtype::of_typestr(&typestr).ok_or_else(|| {
                PyTypeError::new_err(format!(
                    "{name}: type {typestr} is not one blockscaled takes here"
                ))
            })?;
            let shape: Vec<usize> = get("shape")?.extract()?;
            let data = get("data")?;
            let data = data.cast::<PyTuple>()?;
            let ptr: u64 = data.get_item(0)?.extract()?;
            let strides = match cai.get_item("strides")? {
                Some(s) if !s.is_none() => {
                    let bytes: Vec<usize> = s.extract()?;
                    if bytes.iter().any(|b| b % dtype.bytes() != 0) {
                        return Err(PyValueError::new_err(format!(
                            "{name}: strides {bytes:?} are not whole elements"
                        )));
                    }
                    bytes.into_iter().map(|b| b / dtype.bytes()).collect()
                }
                _ => contiguous_strides(&shape),
            };
            let stream = match cai.get_item("stream")? {
                Some(s) if !s.is_none() => Some(s.extract::<u64>()?),
                _ => None,
            };
            return Ok(Tensor {
                name,
                ptr,
                shape,
                strides,
                dtype,
                device: None,
                stream,
            });
        }
        Err(PyTypeError::new_err(format!(
            "{name}: a torch tensor or an object with __cuda_array_interface__ is needed, not {}",
            obj.get_type().name()?
        )))
    }

    /// A torch tensor, read with the fewest calls into torch: its dtype object compared with
    /// torch's, `get_device()` (-1: on the CPU), `stride()`, `data_ptr()` and `shape`.
    fn of_torch(name: &'static str, obj: &Bound<'_, PyAny>, api: &TorchApi) -> PyResult<Tensor> {
        let py = obj.py();
        let dtype_obj = obj.getattr(intern!(py, "dtype"))?;
        let dtype = api.dtype(&dtype_obj).ok_or_else(|| {
            PyTypeError::new_err(format!(
                "{name}: dtype {} is not one blockscaled takes here",
                dtype_obj.str().map(|s| s.to_string()).unwrap_or_default()
            ))
        })?;
        let device: i64 = obj.call_method0(intern!(py, "get_device"))?.extract()?;
        if device < 0 {
            return Err(PyValueError::new_err(format!(
                "{name}: a CUDA tensor is needed (this one is on {})",
                obj.getattr("device")?.str()?
            )));
        }
        let strides: Vec<i64> = obj.call_method0(intern!(py, "stride"))?.extract()?;
        let strides = strides
            .into_iter()
            .map(|s| {
                usize::try_from(s)
                    .map_err(|_| PyValueError::new_err(format!("{name}: negative stride {s}")))
            })
            .collect::<PyResult<_>>()?;
        Ok(Tensor {
            name,
            ptr: obj.call_method0(intern!(py, "data_ptr"))?.extract()?,
            shape: obj.getattr(intern!(py, "shape"))?.extract()?,
            strides,
            dtype,
            device: Some(device as usize),
            stream: None,
        })
    }

    /// The shape as (batch, rows, cols) for a 2-D or 3-D tensor.
    fn dims3(&self) -> PyResult<(usize, usize, usize)> {
        match self.shape[..] {
            [r, c] => Ok((1, r, c)),
            [b, r, c] => Ok((b, r, c)),
            _ => Err(PyValueError::new_err(format!(
                "{}: 2 or 3 dimensions are needed, not shape {:?}",
                self.name, self.shape
            ))),
        }
    }

    /// Requires row-major contiguity (the operands' codes and the output).
    fn contiguous(&self) -> PyResult<()> {
        if self.strides != contiguous_strides(&self.shape) {
            return Err(PyValueError::new_err(format!(
                "{}: a contiguous tensor is needed (shape {:?}, strides {:?}); call .contiguous()",
                self.name, self.shape, self.strides
            )));
        }
        Ok(())
    }

    fn need(&self, want: &[Dtype]) -> PyResult<()> {
        if want.contains(&self.dtype) {
            Ok(())
        } else {
            Err(PyTypeError::new_err(format!(
                "{}: dtype {:?} given, one of {want:?} needed",
                self.name, self.dtype
            )))
        }
    }

    /// The bytes from `ptr` up to the last element its shape and strides reach.
    fn span_bytes(&self) -> usize {
        let last: usize = self
            .shape
            .iter()
            .zip(&self.strides)
            .map(|(&d, &s)| d.saturating_sub(1).saturating_mul(s))
            .fold(0usize, |a, x| a.saturating_add(x));
        last.saturating_add(1).saturating_mul(self.dtype.bytes())
    }

    fn raw(&self) -> RawDevice {
        RawDevice {
            ptr: self.ptr as sys::CUdeviceptr,
            len: self.span_bytes(),
        }
    }

    /// A block-scale tensor's layout: (batch, row blocks, K blocks) of any strides.
    fn scale_layout(&self, batch: usize) -> PyResult<ScaleLayout> {
        let (b, rows, kb) = self.dims3()?;
        if b != batch {
            return Err(PyValueError::new_err(format!(
                "{}: {b} batch entries where the operand has {batch}",
                self.name
            )));
        }
        let n = self.strides.len();
        Ok(ScaleLayout {
            row_blocks: rows,
            k_blocks: kb,
            row_stride: self.strides[n - 2],
            k_stride: self.strides[n - 1],
            batch_stride: if n == 3 { self.strides[0] } else { rows * kb },
        })
    }
}

fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// A handle per (GPU, stream): the kernels loaded once per GPU (its primary context, the one
/// torch uses), a handle with its own workspace on each stream a call names.
struct Handles {
    base: HashMap<usize, Gpu>,
    on_stream: HashMap<(usize, u64), Gpu>,
}

static HANDLES: LazyLock<Mutex<Handles>> = LazyLock::new(|| {
    Mutex::new(Handles {
        base: HashMap::new(),
        on_stream: HashMap::new(),
    })
});

/// The handles, whatever a panicking call left behind (a handle is valid on its own).
fn handles() -> std::sync::MutexGuard<'static, Handles> {
    HANDLES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f` with the handle of GPU `ordinal` on `stream` (0: the legacy default stream).
fn with_gpu<T>(
    ordinal: usize,
    stream: u64,
    f: impl FnOnce(&Gpu) -> Result<T, Error>,
) -> PyResult<T> {
    let mut h = handles();
    if !h.on_stream.contains_key(&(ordinal, stream)) {
        let Some(base) = h.base.get(&ordinal) else {
            return Err(NoDeviceError::new_err(format!(
                "GPU {ordinal} was not opened"
            )));
        };
        let ctx: Arc<CudaContext> = base.stream().context().clone();
        // SAFETY: `stream` is a stream of this GPU's primary context (torch's current stream of
        // the tensors' device, or the caller's), alive while the caller uses it: the handle is
        // only used inside calls that name it.
        let s = unsafe { ctx.wrap_borrowed_stream(stream as sys::CUstream) };
        let g = base.with_stream(s).map_err(py_err)?;
        h.on_stream.insert((ordinal, stream), g);
    }
    f(&h.on_stream[&(ordinal, stream)]).map_err(py_err)
}

/// torch's current stream on `device`, if torch is loaded.
fn torch_stream(py: Python<'_>, device: usize) -> PyResult<Option<u64>> {
    if let Some(TorchApi {
        raw_stream: Some(raw),
        ..
    }) = TorchApi::get(py)?
    {
        return Ok(Some(raw.bind(py).call1((device,))?.extract::<u64>()?));
    }
    let Ok(torch) = py.import("torch") else {
        return Ok(None);
    };
    let s = torch
        .getattr("cuda")?
        .call_method1("current_stream", (device,))?
        .getattr("cuda_stream")?
        .extract::<u64>()?;
    Ok(Some(s))
}

/// Opens GPU `ordinal` once (its kernels loaded into its primary context):
/// [`NoDeviceError`] without a driver or such a GPU, before anything asks torch about it.
fn open(ordinal: usize) -> PyResult<()> {
    let mut h = handles();
    if let std::collections::hash_map::Entry::Vacant(e) = h.base.entry(ordinal) {
        e.insert(Gpu::new(ordinal).map_err(py_err)?);
    }
    Ok(())
}

/// The device and stream of a call over `tensors`; the device opened.
fn placement(py: Python<'_>, tensors: &[&Tensor], stream: Option<u64>) -> PyResult<(usize, u64)> {
    let mut device = None;
    for t in tensors {
        match (device, t.device) {
            (Some(d), Some(e)) if d != e => {
                return Err(PyValueError::new_err(format!(
                    "{} is on cuda:{e}, the others on cuda:{d}",
                    t.name
                )));
            }
            (None, Some(e)) => device = Some(e),
            _ => {}
        }
    }
    let device = device.unwrap_or(0);
    open(device)?;
    let stream = match stream.or_else(|| tensors.iter().find_map(|t| t.stream)) {
        Some(s) => s,
        None if tensors.iter().any(|t| t.device.is_some()) => {
            torch_stream(py, device)?.unwrap_or(0)
        }
        None => 0,
    };
    Ok((device, stream))
}

/// `out = a · bᵀ` for DeepSeek-style FP8 operands (DeepGEMM's `fp8_gemm_nt`): `a` (M, K) or
/// (L, M, K) FP8 (e4m3 or e5m2) with `sfa` (M, K/128) fp32 scales per 1×128, `b` (N, K) or
/// (L, N, K) FP8 with `sfb` (N/128, K/128) fp32 scales per 128×128, `out` (M, N) or (L, M, N)
/// bf16, fp16 or fp32. The codes and the output are contiguous; the scales may have any strides
/// (DeepGEMM's M-major `sfa` as it is). Enqueued on `stream` (a `CUstream` as an integer), else
/// on torch's current stream of the tensors' device.
///
/// The fused epilogue (each optional, in this order): `out = act(alpha·a·bᵀ + beta·c + bias) +
/// residual`, `c` of the product's shape, `bias` (N,) or (L, 1, N), `residual` of `out`'s
/// shape, all bf16, fp16 or fp32; `activation` "relu", "gelu" (erf), "gelu_tanh", "silu" or
/// "swiglu" (column j of `out` is silu(t[2j])·t[2j+1]: N / 2 columns, B's rows interleaving the
/// gate's and the up projection's).
#[pyfunction]
#[pyo3(signature = (a, sfa, b, sfb, out, *, stream = None, alpha = 1.0, bias = None, activation = None, residual = None, c = None, beta = 1.0))]
#[allow(clippy::too_many_arguments)]
fn fp8_gemm_nt(
    py: Python<'_>,
    a: &Bound<'_, PyAny>,
    sfa: &Bound<'_, PyAny>,
    b: &Bound<'_, PyAny>,
    sfb: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    stream: Option<u64>,
    alpha: f32,
    bias: Option<&Bound<'_, PyAny>>,
    activation: Option<&str>,
    residual: Option<&Bound<'_, PyAny>>,
    c: Option<&Bound<'_, PyAny>>,
    beta: f32,
) -> PyResult<()> {
    let [a, sfa, b, sfb, out] = fp8_operands([a, sfa, b, sfb, out])?;
    let epi = EpiArgs::of(alpha, (c, beta), bias, activation, residual)?;
    let ((l, m, k), (lb, n, kb)) = (a.dims3()?, b.dims3()?);
    epi.check_out(&a, &b, &out, (l, m, n), kb == k && lb == l)?;
    let (da, db) = (
        fp8_desc(&a, &sfa, (m, k, l), false)?,
        fp8_desc(&b, &sfb, (n, k, l), true)?,
    );
    let dtype = out_type(&out);
    let mut all = vec![&a, &sfa, &b, &sfb, &out];
    all.extend(epi.tensors());
    let (device, stream) = placement(py, &all, stream)?;
    let raws = (a.raw(), sfa.raw(), b.raw(), sfb.raw(), out.raw());
    let (n_out, views) = (epi.out_cols(n), epi.views()?);
    py.detach(move || {
        with_gpu(device, stream, |g| {
            // SAFETY: the addresses and lengths are the tensors' own (their data pointers, and
            // the bytes their shapes and strides reach), alive for this call (the Python caller
            // holds them); the crate checks each against the driver's allocation and context.
            let (ma, mb, mut c) = unsafe {
                (
                    g.matrix_from_raw(da, raws.0, raws.1, false)?,
                    g.matrix_from_raw(db, raws.2, raws.3, false)?,
                    g.output_from_raw(raws.4, dtype, (m, n_out, l))?,
                )
            };
            // SAFETY: as above, the epilogue's tensors.
            unsafe { run_with(g, (&ma, &mb), &views, &mut c) }
        })
    })
}

/// The fused epilogue's arguments of a GEMM call ([`fp8_gemm_nt`]), read and checked.
struct EpiArgs {
    alpha: f32,
    c: Option<(f32, Tensor)>,
    bias: Option<Tensor>,
    activation: Activation,
    residual: Option<Tensor>,
}

/// An epilogue tensor's memory, element type and (rows, columns, batch).
type EpiView = (RawDevice, InputType, (usize, usize, usize));

/// What [`run_with`] makes the epilogue of.
#[derive(Clone, Copy)]
struct EpiViews {
    alpha: f32,
    c: Option<(f32, EpiView)>,
    bias: Option<EpiView>,
    activation: Activation,
    residual: Option<EpiView>,
}

impl EpiArgs {
    fn of(
        alpha: f32,
        (c, beta): (Option<&Bound<'_, PyAny>>, f32),
        bias: Option<&Bound<'_, PyAny>>,
        activation: Option<&str>,
        residual: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<EpiArgs> {
        let activation = match activation.unwrap_or("none") {
            "none" => Activation::None,
            "relu" => Activation::Relu,
            "gelu" | "gelu_erf" => Activation::GeluErf,
            "gelu_tanh" => Activation::GeluTanh,
            "silu" => Activation::Silu,
            "swiglu" => Activation::SwiGlu,
            other => {
                return Err(PyValueError::new_err(format!(
                    "activation {other:?}: one of none, relu, gelu, gelu_tanh, silu, swiglu"
                )));
            }
        };
        let tensor = |name: &'static str, obj: Option<&Bound<'_, PyAny>>| {
            obj.map(|o| {
                let t = Tensor::of(name, o)?;
                t.need(&[Dtype::Bf16, Dtype::F16, Dtype::F32])?;
                t.contiguous()?;
                Ok::<_, PyErr>(t)
            })
            .transpose()
        };
        Ok(EpiArgs {
            alpha,
            c: tensor("c", c)?.map(|t| (beta, t)),
            bias: tensor("bias", bias)?,
            activation,
            residual: tensor("residual", residual)?,
        })
    }

    /// Columns of the output for a product of `n`.
    fn out_cols(&self, n: usize) -> usize {
        if self.activation == Activation::SwiGlu {
            n / 2
        } else {
            n
        }
    }

    /// Checks that `a · bᵀ` (`k_ok`: their K and batch agree) gives `out` of (l, m, n) through
    /// the epilogue.
    fn check_out(
        &self,
        a: &Tensor,
        b: &Tensor,
        out: &Tensor,
        (l, m, n): (usize, usize, usize),
        k_ok: bool,
    ) -> PyResult<()> {
        let want = (l, m, self.out_cols(n));
        if !k_ok || out.dims3()? != want || (self.activation == Activation::SwiGlu && n % 2 != 0) {
            return Err(PyValueError::new_err(format!(
                "a {:?} · b {:?}ᵀ does not give out {:?}{}",
                a.shape,
                b.shape,
                out.shape,
                if self.activation == Activation::SwiGlu {
                    " (swiglu: N / 2 columns)"
                } else {
                    ""
                }
            )));
        }
        Ok(())
    }

    fn tensors(&self) -> impl Iterator<Item = &Tensor> {
        let c = self.c.as_ref().map(|(_, t)| t);
        c.into_iter().chain(&self.bias).chain(&self.residual)
    }

    fn views(&self) -> PyResult<EpiViews> {
        let view = |t: &Tensor| -> PyResult<EpiView> {
            // (A bias (N,) is one row.)
            let (b, r, c) = match t.shape[..] {
                [n] => (1, 1, n),
                _ => t.dims3()?,
            };
            Ok((t.raw(), t.dtype.input(), (r, c, b)))
        };
        Ok(EpiViews {
            alpha: self.alpha,
            c: self
                .c
                .as_ref()
                .map(|(beta, t)| Ok::<_, PyErr>((*beta, view(t)?)))
                .transpose()?,
            bias: self.bias.as_ref().map(view).transpose()?,
            activation: self.activation,
            residual: self.residual.as_ref().map(view).transpose()?,
        })
    }
}

/// Runs `a · bᵀ` into `out` with the epilogue of `views` (none where it is plain).
///
/// # Safety
/// The epilogue's tensors are the caller's own memory, alive for the call.
unsafe fn run_with(
    g: &Gpu,
    (a, b): (&DeviceMatrix, &DeviceMatrix),
    views: &EpiViews,
    out: &mut blockscaled::DeviceOutput,
) -> Result<(), Error> {
    // SAFETY: the caller's contract.
    let tensor = |v: &EpiView| unsafe { g.tensor_from_raw(v.0, v.1, v.2) };
    let c = views
        .c
        .map(|(beta, v)| Ok::<_, Error>((beta, tensor(&v)?)))
        .transpose()?;
    let bias = views.bias.as_ref().map(tensor).transpose()?;
    let residual = views.residual.as_ref().map(tensor).transpose()?;
    let mut epi = Epilogue::new()
        .alpha(views.alpha)
        .activation(views.activation);
    if let Some((beta, c)) = &c {
        epi = epi.beta_c(*beta, c);
    }
    if let Some(bias) = &bias {
        epi = epi.bias(bias);
    }
    if let Some(r) = &residual {
        epi = epi.residual(r);
    }
    let call = Call::new(a, b);
    if epi.is_plain() {
        g.run(&call, out)
    } else {
        g.run(&call.epilogue(&epi), out)
    }
}

/// `out = a · bᵀ` for any pair of block-scaled operands the crate takes, each given as its codes
/// and its scales in torch's dtypes, the format read from them: `float8_e4m3fn` / `float8_e5m2`
/// codes with `float8_e8m0fnu` scales per 32 (MXFP8) or fp32 ones per 1×128 (A) and 128×128 (B,
/// DeepSeek); `float4_e2m1fn_x2` codes (two per byte, K / 2 columns) with `float8_e8m0fnu`
/// scales per 32 (MXFP4) or per 16, or `float8_e4m3fn` scales per 16 with an fp32 global scale
/// (NVFP4, `a_global_scale` / `b_global_scale`); or, for A, bf16 / fp16 activations with
/// `sfa=None` (4-bit weights × 16-bit activations). Scales are (rows, K / block) — for B's
/// DeepSeek scales (N / 128, K / 128) — K-major or any strides (batched: a leading L).
/// The crate's plan picks the kernel (4-bit weights with 16-bit, FP8 or e2m1 activations run on
/// the 4-bit-weights kernels; MX / NVFP4 pairs on the MX kernel or folded onto FP8 tensor cores).
/// The fused epilogue as [`fp8_gemm_nt`]'s.
#[pyfunction]
#[pyo3(signature = (a, sfa, b, sfb, out, *, a_global_scale = 1.0, b_global_scale = 1.0, stream = None, alpha = 1.0, bias = None, activation = None, residual = None, c = None, beta = 1.0))]
#[allow(clippy::too_many_arguments)]
fn gemm_nt(
    py: Python<'_>,
    a: &Bound<'_, PyAny>,
    sfa: Option<&Bound<'_, PyAny>>,
    b: &Bound<'_, PyAny>,
    sfb: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    a_global_scale: f32,
    b_global_scale: f32,
    stream: Option<u64>,
    alpha: f32,
    bias: Option<&Bound<'_, PyAny>>,
    activation: Option<&str>,
    residual: Option<&Bound<'_, PyAny>>,
    c: Option<&Bound<'_, PyAny>>,
    beta: f32,
) -> PyResult<()> {
    let epi = EpiArgs::of(alpha, (c, beta), bias, activation, residual)?;
    let (a, b, out) = (
        Tensor::of("a", a)?,
        Tensor::of("b", b)?,
        Tensor::of("out", out)?,
    );
    let sfa = sfa.map(|s| Tensor::of("sfa", s)).transpose()?;
    let sfb = Tensor::of("sfb", sfb)?;
    out.need(&[Dtype::Bf16, Dtype::F16, Dtype::F32])?;
    for t in [&a, &b, &out] {
        t.contiguous()?;
    }
    let oa = operand_of(&a, sfa.as_ref(), false, a_global_scale)?;
    let ob = operand_of(&b, Some(&sfb), true, b_global_scale)?;
    let ((m, k, l), (n, kb, lb)) = (oa.dims(), ob.dims());
    epi.check_out(&a, &b, &out, (l, m, n), kb == k && lb == l)?;
    let dtype = out_type(&out);
    let mut all = vec![&a, &b, &sfb, &out];
    all.extend(sfa.as_ref());
    all.extend(epi.tensors());
    let (n_out, views) = (epi.out_cols(n), epi.views()?);
    let (device, stream) = placement(py, &all, stream)?;
    let raws = (
        a.raw(),
        sfa.as_ref().map(Tensor::raw),
        b.raw(),
        sfb.raw(),
        out.raw(),
    );
    py.detach(move || {
        with_gpu(device, stream, |g| {
            // SAFETY: as in `fp8_gemm_nt`: the tensors' own addresses and spans, alive for this
            // call; the crate checks each against the driver's allocation and context.
            let (ma, mb, mut c) = unsafe {
                (
                    oa.view(g, raws.0, raws.1)?,
                    ob.view(g, raws.2, Some(raws.3))?,
                    g.output_from_raw(raws.4, dtype, (m, n_out, l))?,
                )
            };
            // SAFETY: as above, the epilogue's tensors.
            unsafe { run_with(g, (&ma, &mb), &views, &mut c) }
        })
    })
}

/// One operand of [`gemm_nt`], its format read from its tensors.
#[derive(Clone, Copy)]
enum Operand {
    /// bf16 or fp16 values (`rows`, `k`, `batch`) with the scale 1.
    Half(ElemType, (usize, usize, usize)),
    /// Block-scaled codes and scales.
    Scaled(MatrixDesc),
}

impl Operand {
    /// (rows, K, batch).
    fn dims(&self) -> (usize, usize, usize) {
        match self {
            Operand::Half(_, d) => *d,
            Operand::Scaled(d) => (d.rows, d.k, d.batch),
        }
    }

    /// The view over the codes (and scales).
    ///
    /// # Safety
    /// As [`Gpu::matrix_from_raw`]: the tensors' own memory, alive for the call.
    unsafe fn view(
        &self,
        g: &Gpu,
        data: RawDevice,
        scales: Option<RawDevice>,
    ) -> Result<blockscaled::DeviceMatrix<'static>, Error> {
        match (self, scales) {
            // SAFETY: the caller's contract.
            (Operand::Half(elem, dims), _) => unsafe { g.half_from_raw(data, *elem, *dims) },
            // SAFETY: the caller's contract.
            (Operand::Scaled(d), Some(s)) => unsafe { g.matrix_from_raw(*d, data, s, false) },
            (Operand::Scaled(_), None) => {
                Err(Error::Format("block-scaled codes need scales".into()))
            }
        }
    }
}

/// A block-sparse operand's host parts: the block type (`elem`: "e4m3", "bf16" or "f16"),
/// `dims` (rows, K, block), torch's BSR indices (`crow`, `col`), the stored blocks' bytes and,
/// for e4m3 blocks, one fp32 scale per block.
type BsrParts = (
    String,
    (usize, usize, usize),
    Vec<i64>,
    Vec<i64>,
    Vec<u8>,
    Vec<f32>,
);

/// The crate's block-sparse matrix of `parts`.
fn bsr_of(parts: BsrParts) -> PyResult<BsrMatrix> {
    let (elem, (rows, cols, block), crow, col, values, scales) = parts;
    let elem = match elem.as_str() {
        "e4m3" => ElemType::E4M3,
        "bf16" => ElemType::BF16,
        "f16" => ElemType::F16,
        other => {
            return Err(PyTypeError::new_err(format!(
                "sparse blocks of {other}: e4m3 (with a scale per block), bf16 or f16"
            )));
        }
    };
    BsrMatrix::from_parts(elem, rows, cols, block, &crow, &col, values, scales).map_err(py_err)
}

/// A block-sparse operand on a GPU, uploaded once (`_bsr_prepare`: its blocks, scales and the
/// kernels' preparation of them) and taken as it is by every later `_bsr_mm` on that GPU, on
/// any stream: the sparse weights of a model, prepared at load.
#[pyclass(module = "blockscaled._native", frozen)]
struct PreparedBsr {
    device: usize,
    bsr: blockscaled::DeviceBsr,
}

#[pymethods]
impl PreparedBsr {
    /// (rows, K): the matrix's shape.
    #[getter]
    fn shape(&self) -> (usize, usize) {
        (self.bsr.rows(), self.bsr.cols())
    }

    /// The block size.
    #[getter]
    fn block(&self) -> usize {
        self.bsr.block()
    }

    /// The number of stored blocks.
    #[getter]
    fn nnz(&self) -> usize {
        self.bsr.nnz()
    }

    /// The CUDA device it lives on.
    #[getter]
    fn device(&self) -> usize {
        self.device
    }

    fn __repr__(&self) -> String {
        format!(
            "PreparedBsr({} × {}, blocks of {}, {} stored, cuda:{})",
            self.bsr.rows(),
            self.bsr.cols(),
            self.bsr.block(),
            self.bsr.nnz(),
            self.device
        )
    }
}

/// Uploads the block-sparse operand of `parts` to GPU `device` once, on `stream` (else torch's
/// current stream there), and waits for the copies: the result is ready on any stream.
#[pyfunction]
#[pyo3(signature = (parts, device, *, stream = None))]
fn _bsr_prepare(
    py: Python<'_>,
    parts: BsrParts,
    device: usize,
    stream: Option<u64>,
) -> PyResult<PreparedBsr> {
    let m = bsr_of(parts)?;
    open(device)?;
    let stream = match stream {
        Some(s) => s,
        None => torch_stream(py, device)?.unwrap_or(0),
    };
    let bsr = py.detach(move || {
        with_gpu(device, stream, |g| {
            let d = g.upload_bsr(&m)?;
            g.stream().synchronize()?;
            Ok(d)
        })
    })?;
    Ok(PreparedBsr { device, bsr })
}

/// `_bsr_mm`'s sparse operand.
enum Sparse {
    /// Uploaded once, used as it is.
    Prepared(Py<PreparedBsr>),
    /// Read on the host, uploaded for the call.
    Host(BsrMatrix),
}

/// `out = a · bᵀ` with one operand block-sparse (`side` "a" or "b"): `sparse` a
/// [`PreparedBsr`] on the call's GPU, used as it is, or its host parts ([`BsrParts`]), read on
/// the host and uploaded for this call; the other operand `dense` (with `dense_scales` for FP8:
/// DeepSeek's layouts, or bf16 / fp16 without) and `out` on the GPU, used where they are. The
/// package's `bsr_mm` passes a torch `sparse_bsr` tensor so.
#[pyfunction]
#[pyo3(signature = (side, sparse, dense, dense_scales, out, *, stream = None))]
fn _bsr_mm(
    py: Python<'_>,
    side: &str,
    sparse: &Bound<'_, PyAny>,
    dense: &Bound<'_, PyAny>,
    dense_scales: Option<&Bound<'_, PyAny>>,
    out: &Bound<'_, PyAny>,
    stream: Option<u64>,
) -> PyResult<()> {
    let side = match side {
        "a" => SparseSide::A,
        "b" => SparseSide::B,
        other => {
            return Err(PyValueError::new_err(format!(
                "side {other:?}: \"a\" or \"b\""
            )));
        }
    };
    // The sparse operand: prepared on a GPU, or host parts to upload for this call.
    let sparse = match sparse.cast::<PreparedBsr>() {
        Ok(p) => Sparse::Prepared(p.clone().unbind()),
        Err(_) => Sparse::Host(bsr_of(sparse.extract::<BsrParts>()?)?),
    };
    let (rows, cols) = match &sparse {
        Sparse::Prepared(p) => p.get().shape(),
        Sparse::Host(m) => (m.rows(), m.cols()),
    };
    let d = Tensor::of("dense", dense)?;
    d.contiguous()?;
    let ds = dense_scales
        .map(|s| Tensor::of("dense_scales", s))
        .transpose()?;
    let o = Tensor::of("out", out)?;
    o.need(&[Dtype::Bf16, Dtype::F16, Dtype::F32])?;
    o.contiguous()?;
    // The dense operand takes the other role: B where A is sparse.
    let op = match d.dtype {
        Dtype::Bf16 | Dtype::F16 if ds.is_none() => {
            let (batch, r, c) = d.dims3()?;
            let e = if d.dtype == Dtype::Bf16 {
                ElemType::BF16
            } else {
                ElemType::F16
            };
            Operand::Half(e, (r, c, batch))
        }
        _ => operand_of(&d, ds.as_ref(), side == SparseSide::A, 1.0)?,
    };
    let (dense_rows, k, batch) = op.dims();
    let (m, n) = match side {
        SparseSide::A => (rows, dense_rows),
        SparseSide::B => (dense_rows, rows),
    };
    if k != cols || batch != 1 || o.dims3()? != (1, m, n) {
        return Err(PyValueError::new_err(format!(
            "the sparse {rows} × {cols} and dense {:?} operands do not give out {:?} (K must \
             match, one batch entry)",
            d.shape, o.shape
        )));
    }
    let mut all = vec![&d, &o];
    all.extend(ds.as_ref());
    let (device, stream) = placement(py, &all, stream)?;
    if let Sparse::Prepared(p) = &sparse
        && p.get().device != device
    {
        return Err(WrongGpuError::new_err(format!(
            "the sparse operand was prepared on cuda:{}, the tensors are on cuda:{device}",
            p.get().device
        )));
    }
    let (draw, sraw, oraw) = (d.raw(), ds.as_ref().map(Tensor::raw), o.raw());
    let dtype = out_type(&o);
    py.detach(move || {
        with_gpu(device, stream, |g| {
            let uploaded;
            let sparse = match &sparse {
                Sparse::Prepared(p) => &p.get().bsr,
                Sparse::Host(m) => {
                    uploaded = g.upload_bsr(m)?;
                    &uploaded
                }
            };
            // SAFETY: the dense operand's and the output's tensors, alive for this call (the
            // Python caller holds them); the crate checks each against the driver's allocation.
            let (dense, mut c) = unsafe {
                (
                    op.view(g, draw, sraw)?,
                    g.output_from_raw(oraw, dtype, (m, n, 1))?,
                )
            };
            g.bsr_gemm(&dense, sparse, side, &mut c)
        })
    })
}

/// The format of operand `t` with scales `s` (`as_b`: B's role), read from their dtypes and
/// shapes ([`gemm_nt`]); `global`: NVFP4's fp32 tensor scale.
fn operand_of(t: &Tensor, s: Option<&Tensor>, as_b: bool, global: f32) -> PyResult<Operand> {
    let (batch, rows, cols) = t.dims3()?;
    let s = match (t.dtype, s) {
        (Dtype::Bf16 | Dtype::F16, None) if !as_b => {
            let elem = if t.dtype == Dtype::Bf16 {
                ElemType::BF16
            } else {
                ElemType::F16
            };
            return Ok(Operand::Half(elem, (rows, cols, batch)));
        }
        (Dtype::Bf16 | Dtype::F16, _) => {
            return Err(PyTypeError::new_err(format!(
                "{}: 16-bit values are taken as A (activations) with sfa=None",
                t.name
            )));
        }
        (_, None) => {
            return Err(PyValueError::new_err(format!(
                "{}: block-scaled codes need their scales",
                t.name
            )));
        }
        (_, Some(s)) => s,
    };
    let k = if t.dtype == Dtype::E2m1x2 {
        2 * cols
    } else {
        cols
    };
    let (_, _, kb) = s.dims3()?;
    let per = k.checked_div(kb).filter(|p| p * kb == k).unwrap_or(0);
    let fp8 = |e: Dtype| {
        if e == Dtype::E5m2 {
            Fp8::E5M2
        } else {
            Fp8::E4M3
        }
    };
    let recipe = match (t.dtype, s.dtype, per) {
        (Dtype::E4m3 | Dtype::E5m2, Dtype::F32, _) => {
            return Ok(Operand::Scaled(fp8_desc(t, s, (rows, k, batch), as_b)?));
        }
        (Dtype::E4m3 | Dtype::E5m2, Dtype::E8m0, 32) => Recipe::Mxfp8(fp8(t.dtype)),
        (Dtype::E2m1x2, Dtype::E8m0, 32) => Recipe::Mxfp4,
        (Dtype::E2m1x2, Dtype::E8m0, 16) => Recipe::E2m1E8m0x16,
        (Dtype::E2m1x2, Dtype::E4m3, 16) => Recipe::Nvfp4,
        (e, se, _) => {
            return Err(PyTypeError::new_err(format!(
                "{}: {e:?} codes with {se:?} scales of shape {:?} (one per {per} of K = {k}): \
                 want FP8 with e8m0 per 32 or fp32 (1×128 / 128×128), or e2m1 (two per byte) \
                 with e8m0 per 32 or 16 or e4m3 per 16",
                t.name, s.shape
            )));
        }
    };
    let format = if as_b { recipe.b() } else { recipe.a() };
    Ok(Operand::Scaled(MatrixDesc {
        format,
        rows,
        k,
        batch,
        scale_layout: s.scale_layout(batch)?,
        tensor_scale: if recipe == Recipe::Nvfp4 { global } else { 1.0 },
    }))
}

/// The description of an FP8 operand `t` (DeepSeek-style: A's scales `s` per 1×128, B's per
/// 128×128, `as_b`) of `rows` × `k` × `batch`.
fn fp8_desc(
    t: &Tensor,
    s: &Tensor,
    (rows, k, batch): (usize, usize, usize),
    as_b: bool,
) -> PyResult<MatrixDesc> {
    let recipe = Recipe::DeepSeekFp8;
    let mut format = if as_b { recipe.b() } else { recipe.a() };
    format.elem = if t.dtype == Dtype::E5m2 {
        ElemType::E5M2
    } else {
        ElemType::E4M3
    };
    Ok(MatrixDesc {
        format,
        rows,
        k,
        batch,
        scale_layout: s.scale_layout(batch)?,
        tensor_scale: 1.0,
    })
}

/// The output type of `out` (bf16, fp16 or fp32, checked before).
fn out_type(out: &Tensor) -> OutType {
    match out.dtype {
        Dtype::F16 => OutType::F16,
        Dtype::F32 => OutType::F32,
        _ => OutType::Bf16,
    }
}

/// The tensors of an FP8 call (`a`, `sfa`, `b`, `sfb`, `out`), read and checked: FP8 codes,
/// fp32 scales, a 16- or 32-bit output, the codes and the output contiguous.
fn fp8_operands(objs: [&Bound<'_, PyAny>; 5]) -> PyResult<[Tensor; 5]> {
    let [a, sfa, b, sfb, out] = objs;
    let (a, sfa) = (Tensor::of("a", a)?, Tensor::of("sfa", sfa)?);
    let (b, sfb) = (Tensor::of("b", b)?, Tensor::of("sfb", sfb)?);
    let out = Tensor::of("out", out)?;
    let fp8 = [Dtype::E4m3, Dtype::E5m2];
    a.need(&fp8)?;
    b.need(&fp8)?;
    sfa.need(&[Dtype::F32])?;
    sfb.need(&[Dtype::F32])?;
    out.need(&[Dtype::Bf16, Dtype::F16, Dtype::F32])?;
    for t in [&a, &b, &out] {
        t.contiguous()?;
    }
    Ok([a, sfa, b, sfb, out])
}

/// A grouped call's int32 groups (`name`: `offs` or `masked_m`), read and checked.
fn group_values(name: &'static str, obj: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    let t = Tensor::of(name, obj)?;
    t.need(&[Dtype::I32])?;
    t.contiguous()?;
    Ok(t)
}

/// Runs the grouped GEMM of the checked tensors on `device`'s handle on `stream`: A of
/// `a_dims` (rows, K, batch), B of `b_dims` (N, K, G), the output `c_dims` (rows, N, batch).
#[allow(clippy::too_many_arguments)]
fn run_grouped(
    py: Python<'_>,
    (device, stream): (usize, u64),
    (da, db): (MatrixDesc, MatrixDesc),
    tensors: [&Tensor; 6],
    layout: GroupLayout,
    dtype: OutType,
    c_dims: (usize, usize, usize),
) -> PyResult<()> {
    let [a, sfa, b, sfb, out, groups] = tensors;
    let ops = (Operand::Scaled(da), Operand::Scaled(db));
    let raws = [a, b, sfb, out, groups].map(Tensor::raw);
    run_grouped_ops(
        py,
        (device, stream),
        ops,
        (raws, Some(sfa.raw())),
        layout,
        (dtype, c_dims),
    )
}

/// [`run_grouped`] for operands of any format ([`Operand`]): `raws` are A's codes, B's codes, B's
/// scales, the output and the groups, then A's scales where A has them.
fn run_grouped_ops(
    py: Python<'_>,
    (device, stream): (usize, u64),
    (oa, ob): (Operand, Operand),
    ([a, b, sfb, out, groups], sfa): ([RawDevice; 5], Option<RawDevice>),
    layout: GroupLayout,
    (dtype, c_dims): (OutType, (usize, usize, usize)),
) -> PyResult<()> {
    py.detach(move || {
        with_gpu(device, stream, |g| {
            // SAFETY: the addresses and lengths are the tensors' own (their data pointers, and
            // the bytes their shapes and strides reach), alive for this call (the Python caller
            // holds them); the crate checks each against the driver's allocation and context.
            let (ma, mb, groups, mut c) = unsafe {
                (
                    oa.view(g, a, sfa)?,
                    ob.view(g, b, Some(sfb))?,
                    g.groups_from_raw(layout, groups)?,
                    g.output_from_raw(out, dtype, c_dims)?,
                )
            };
            g.grouped_gemm(&ma, &mb, &groups, &mut c)
        })
    })
}

/// Grouped `out = a · bᵀ` for operands of any block-scaled format ([`gemm_nt`]'s, read from the
/// dtypes), over groups of consecutive rows: `a` (R, K′) with `sfa` (or bf16 / fp16 with
/// `sfa=None`), `b` (G, N, K′) experts with `sfb` (G, N, K / block) — DeepSeek: (G, N/128,
/// K/128) — `out` (R, N), `offs` (G,) int32 on the GPU, each group's end row (torch
/// `_grouped_mm`'s). Rows past the last end are not written.
#[pyfunction]
#[pyo3(signature = (a, sfa, b, sfb, out, offs, *, a_global_scale = 1.0, b_global_scale = 1.0, stream = None))]
#[allow(clippy::too_many_arguments)]
fn m_grouped_gemm_nt_contiguous(
    py: Python<'_>,
    a: &Bound<'_, PyAny>,
    sfa: Option<&Bound<'_, PyAny>>,
    b: &Bound<'_, PyAny>,
    sfb: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    offs: &Bound<'_, PyAny>,
    a_global_scale: f32,
    b_global_scale: f32,
    stream: Option<u64>,
) -> PyResult<()> {
    let t = GroupedTensors::of([a, b, sfb, out], sfa, ("offs", offs))?;
    let (oa, ob) = t.operands((a_global_scale, b_global_scale))?;
    let ((r, k, la), (n, kb, g)) = (oa.dims(), ob.dims());
    let (lo, ro, no) = t.out.dims3()?;
    if t.a.shape.len() != 2 || t.b.shape.len() != 3 || t.out.shape.len() != 2 || la != 1 {
        return Err(PyValueError::new_err(format!(
            "a (R, K), b (G, N, K) and out (R, N) are needed: a {:?}, b {:?}, out {:?}",
            t.a.shape, t.b.shape, t.out.shape
        )));
    }
    if kb != k || (lo, ro, no) != (1, r, n) || t.groups.shape != [g] {
        return Err(PyValueError::new_err(format!(
            "a {:?} · b {:?}ᵀ does not give out {:?} over offs {:?} (one end per expert)",
            t.a.shape, t.b.shape, t.out.shape, t.groups.shape
        )));
    }
    t.run(py, stream, (oa, ob), GroupLayout::Contiguous, (r, n, 1))
}

/// Grouped `out[g] = a[g] · b[g]ᵀ` on each group's first `masked_m[g]` rows, for operands of any
/// block-scaled format ([`gemm_nt`]'s): `a` (G, C, K′) with `sfa` (G, C, K / block) (or bf16 /
/// fp16 with `sfa=None`), `b` (G, N, K′) with `sfb`, `out` (G, C, N), `masked_m` (G,) int32 on
/// the GPU. Rows at or past a group's count are not written.
#[pyfunction]
#[pyo3(signature = (a, sfa, b, sfb, out, masked_m, expected_m = None, *, a_global_scale = 1.0, b_global_scale = 1.0, stream = None))]
#[allow(clippy::too_many_arguments)]
fn m_grouped_gemm_nt_masked(
    py: Python<'_>,
    a: &Bound<'_, PyAny>,
    sfa: Option<&Bound<'_, PyAny>>,
    b: &Bound<'_, PyAny>,
    sfb: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    masked_m: &Bound<'_, PyAny>,
    expected_m: Option<usize>,
    a_global_scale: f32,
    b_global_scale: f32,
    stream: Option<u64>,
) -> PyResult<()> {
    let _ = expected_m;
    let t = GroupedTensors::of([a, b, sfb, out], sfa, ("masked_m", masked_m))?;
    let (oa, ob) = t.operands((a_global_scale, b_global_scale))?;
    let ((cap, k, ga), (n, kb, g)) = (oa.dims(), ob.dims());
    if t.a.shape.len() != 3 || t.b.shape.len() != 3 || t.out.shape.len() != 3 {
        return Err(PyValueError::new_err(format!(
            "a (G, C, K), b (G, N, K) and out (G, C, N) are needed: a {:?}, b {:?}, out {:?}",
            t.a.shape, t.b.shape, t.out.shape
        )));
    }
    if kb != k || ga != g || t.out.dims3()? != (g, cap, n) || t.groups.shape != [g] {
        return Err(PyValueError::new_err(format!(
            "a {:?} · b {:?}ᵀ does not give out {:?} over masked_m {:?} (one count per expert)",
            t.a.shape, t.b.shape, t.out.shape, t.groups.shape
        )));
    }
    t.run(py, stream, (oa, ob), GroupLayout::Masked, (cap, n, g))
}

/// A generic grouped call's tensors, read and checked.
struct GroupedTensors {
    a: Tensor,
    sfa: Option<Tensor>,
    b: Tensor,
    sfb: Tensor,
    out: Tensor,
    groups: Tensor,
}

impl GroupedTensors {
    fn of(
        [a, b, sfb, out]: [&Bound<'_, PyAny>; 4],
        sfa: Option<&Bound<'_, PyAny>>,
        (groups_name, groups): (&'static str, &Bound<'_, PyAny>),
    ) -> PyResult<GroupedTensors> {
        let t = GroupedTensors {
            a: Tensor::of("a", a)?,
            sfa: sfa.map(|s| Tensor::of("sfa", s)).transpose()?,
            b: Tensor::of("b", b)?,
            sfb: Tensor::of("sfb", sfb)?,
            out: Tensor::of("out", out)?,
            groups: group_values(groups_name, groups)?,
        };
        t.out.need(&[Dtype::Bf16, Dtype::F16, Dtype::F32])?;
        for x in [&t.a, &t.b, &t.out] {
            x.contiguous()?;
        }
        Ok(t)
    }

    /// A's and B's formats ([`operand_of`]).
    fn operands(&self, (ga, gb): (f32, f32)) -> PyResult<(Operand, Operand)> {
        Ok((
            operand_of(&self.a, self.sfa.as_ref(), false, ga)?,
            operand_of(&self.b, Some(&self.sfb), true, gb)?,
        ))
    }

    fn run(
        &self,
        py: Python<'_>,
        stream: Option<u64>,
        ops: (Operand, Operand),
        layout: GroupLayout,
        c_dims: (usize, usize, usize),
    ) -> PyResult<()> {
        let mut all = vec![&self.a, &self.b, &self.sfb, &self.out, &self.groups];
        all.extend(self.sfa.as_ref());
        let place = placement(py, &all, stream)?;
        let raws = [&self.a, &self.b, &self.sfb, &self.out, &self.groups].map(Tensor::raw);
        let sfa = self.sfa.as_ref().map(Tensor::raw);
        let dtype = out_type(&self.out);
        run_grouped_ops(py, place, ops, (raws, sfa), layout, (dtype, c_dims))
    }
}

/// Grouped `out = a · bᵀ` over groups of consecutive rows (mixture of experts, prefill):
/// DeepGEMM's `m_grouped_fp8_gemm_nt_contiguous` with torch `_grouped_mm`'s `offs`. `a` (R, K)
/// FP8 with `sfa` (R, K/128) fp32 per 1×128 (any strides), `b` (G, N, K) FP8 — expert g is
/// `b[g]` — with `sfb` (G, N/128, K/128) fp32 per 128×128, `out` (R, N) bf16, fp16 or fp32, and
/// `offs` (G,) int32 on the GPU: group g is rows `offs[g-1]..offs[g]` (`offs[-1]` = 0), ends
/// not decreasing. Rows past `offs[G-1]` are not written. The ends stay on the GPU (no
/// synchronization); values the host cannot see are clamped by the kernel (an end below the
/// one before is an empty group, one past R stops at R).
#[pyfunction]
#[pyo3(signature = (a, sfa, b, sfb, out, offs, *, stream = None))]
#[allow(clippy::too_many_arguments)]
fn m_grouped_fp8_gemm_nt_contiguous(
    py: Python<'_>,
    a: &Bound<'_, PyAny>,
    sfa: &Bound<'_, PyAny>,
    b: &Bound<'_, PyAny>,
    sfb: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    offs: &Bound<'_, PyAny>,
    stream: Option<u64>,
) -> PyResult<()> {
    let [a, sfa, b, sfb, out] = fp8_operands([a, sfa, b, sfb, out])?;
    let offs = group_values("offs", offs)?;
    let (la, r, k) = a.dims3()?;
    let (g, n, kb) = b.dims3()?;
    let (lo, ro, no) = out.dims3()?;
    if a.shape.len() != 2 || b.shape.len() != 3 || out.shape.len() != 2 || la != 1 || lo != 1 {
        return Err(PyValueError::new_err(format!(
            "a (R, K), b (G, N, K) and out (R, N) are needed: a {:?}, b {:?}, out {:?}",
            a.shape, b.shape, out.shape
        )));
    }
    if kb != k || (ro, no) != (r, n) || offs.shape != [g] {
        return Err(PyValueError::new_err(format!(
            "a {:?} · b {:?}ᵀ does not give out {:?} over offs {:?} (one end per expert)",
            a.shape, b.shape, out.shape, offs.shape
        )));
    }
    let (da, db) = (
        fp8_desc(&a, &sfa, (r, k, 1), false)?,
        fp8_desc(&b, &sfb, (n, k, g), true)?,
    );
    let dtype = out_type(&out);
    let place = placement(py, &[&a, &sfa, &b, &sfb, &out, &offs], stream)?;
    let tensors = [&a, &sfa, &b, &sfb, &out, &offs];
    run_grouped(
        py,
        place,
        (da, db),
        tensors,
        GroupLayout::Contiguous,
        dtype,
        (r, n, 1),
    )
}

/// Grouped `out[g] = a[g] · b[g]ᵀ` on each group's first `masked_m[g]` rows (mixture of experts,
/// decode): DeepGEMM's `m_grouped_fp8_gemm_nt_masked`. `a` (G, C, K) FP8 with `sfa` (G, C, K/128)
/// fp32 per 1×128 (any strides), `b` (G, N, K) FP8 with `sfb` (G, N/128, K/128), `out` (G, C, N),
/// `masked_m` (G,) int32 on the GPU: the rows of each group (a router's counts). Rows at or past
/// a group's count are not written. `expected_m` (DeepGEMM's hint of the typical count) is
/// accepted and not needed: the plan follows the capacity C, and the counts stay on the GPU.
#[pyfunction]
#[pyo3(signature = (a, sfa, b, sfb, out, masked_m, expected_m = None, *, stream = None))]
#[allow(clippy::too_many_arguments)]
fn m_grouped_fp8_gemm_nt_masked(
    py: Python<'_>,
    a: &Bound<'_, PyAny>,
    sfa: &Bound<'_, PyAny>,
    b: &Bound<'_, PyAny>,
    sfb: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    masked_m: &Bound<'_, PyAny>,
    expected_m: Option<usize>,
    stream: Option<u64>,
) -> PyResult<()> {
    let _ = expected_m;
    let [a, sfa, b, sfb, out] = fp8_operands([a, sfa, b, sfb, out])?;
    let counts = group_values("masked_m", masked_m)?;
    let (ga, cap, k) = a.dims3()?;
    let (g, n, kb) = b.dims3()?;
    let (go, co, no) = out.dims3()?;
    if a.shape.len() != 3 || b.shape.len() != 3 || out.shape.len() != 3 {
        return Err(PyValueError::new_err(format!(
            "a (G, C, K), b (G, N, K) and out (G, C, N) are needed: a {:?}, b {:?}, out {:?}",
            a.shape, b.shape, out.shape
        )));
    }
    if kb != k || ga != g || (go, co, no) != (g, cap, n) || counts.shape != [g] {
        return Err(PyValueError::new_err(format!(
            "a {:?} · b {:?}ᵀ does not give out {:?} over masked_m {:?} (one count per expert)",
            a.shape, b.shape, out.shape, counts.shape
        )));
    }
    let (da, db) = (
        fp8_desc(&a, &sfa, (cap, k, g), false)?,
        fp8_desc(&b, &sfb, (n, k, g), true)?,
    );
    let dtype = out_type(&out);
    let place = placement(py, &[&a, &sfa, &b, &sfb, &out, &counts], stream)?;
    let tensors = [&a, &sfa, &b, &sfb, &out, &counts];
    run_grouped(
        py,
        place,
        (da, db),
        tensors,
        GroupLayout::Masked,
        dtype,
        (cap, n, g),
    )
}

/// DeepSeek-style FP8 quantization of activations, as SGLang and vLLM name it
/// (`per_token_group_quant_fp8` with groups of 128): `x` (M, K) or (L, M, K) bf16, fp16 or fp32
/// into `out` of its shape, e4m3, and `scales` (M, K/128) fp32, one per row and 128 columns
/// (`amax / 448`); `scales` row-major, or column-major (strides (1, M)) as DeepGEMM reads them.
/// The codes are those of the crate's quantizer (bit for bit the host reference); enqueued on the
/// caller's stream. The tensors are given (the package's Python wrapper allocates them).
#[pyfunction]
#[pyo3(signature = (x, out, scales, *, stream = None))]
fn per_token_group_quant_fp8_into(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    scales: &Bound<'_, PyAny>,
    stream: Option<u64>,
) -> PyResult<()> {
    let tensors = quantizer_tensors([x, out, scales])?;
    quantize_fp8(py, tensors, (Recipe::DeepSeekFp8, Dtype::F32), stream)
}

/// MXFP8 quantization (OCP MX: a power-of-two scale per 32 elements of a row): `x` (M, K) or
/// (L, M, K) bf16, fp16 or fp32 into `out` of its shape, e4m3 or e5m2 (its dtype says which), and
/// `scales` (M, K/32) `float8_e8m0fnu`, K-major (the un-swizzled layout). The codes are those of
/// the crate's quantizer, enqueued on the caller's stream.
#[pyfunction]
#[pyo3(signature = (x, out, scales, *, stream = None))]
fn quantize_mxfp8_into(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    scales: &Bound<'_, PyAny>,
    stream: Option<u64>,
) -> PyResult<()> {
    let tensors = quantizer_tensors([x, out, scales])?;
    let fp8 = if tensors[1].dtype == Dtype::E5m2 {
        Fp8::E5M2
    } else {
        Fp8::E4M3
    };
    quantize_fp8(py, tensors, (Recipe::Mxfp8(fp8), Dtype::E8m0), stream)
}

/// 4-bit codes (OCP MX and NVIDIA's NVFP4) of `x` (M, K) or (L, M, K) bf16, fp16 or fp32 into
/// `out` (…, K/2) `float4_e2m1fn_x2` (two codes a byte, the first in the low nibble) and
/// `scales` (…, M, K/block): `float8_e8m0fnu` per 32 (MXFP4) or per 16, or `float8_e4m3fn` per 16
/// (NVFP4, with an fp32 global scale: `global_scale`, or computed from the tensor's largest
/// magnitude when `None`, which reads one value back and so waits for the stream), any strides.
/// Returns the global scale (1 for the MX formats).
#[pyfunction]
#[pyo3(signature = (x, out, scales, *, global_scale = None, stream = None))]
fn quantize_fp4_into(
    py: Python<'_>,
    x: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    scales: &Bound<'_, PyAny>,
    global_scale: Option<f32>,
    stream: Option<u64>,
) -> PyResult<f32> {
    let [x, out, scales] = quantizer_tensors([x, out, scales])?;
    x.need(&[Dtype::Bf16, Dtype::F16, Dtype::F32])?;
    out.need(&[Dtype::E2m1x2])?;
    scales.need(&[Dtype::E8m0, Dtype::E4m3])?;
    for t in [&x, &out] {
        t.contiguous()?;
    }
    let (_, _, k) = x.dims3()?;
    let mut half = x.shape.clone();
    if let Some(last) = half.last_mut() {
        *last /= 2;
    }
    if !k.is_multiple_of(2) || out.shape != half {
        return Err(PyValueError::new_err(format!(
            "out {:?} is not x's shape {:?} with K halved (two codes a byte)",
            out.shape, x.shape
        )));
    }
    let (_, _, kb) = scales.dims3()?;
    let per = k.checked_div(kb).filter(|p| p * kb == k).unwrap_or(0);
    let recipe = match (scales.dtype, per) {
        (Dtype::E8m0, 32) => Recipe::Mxfp4,
        (Dtype::E8m0, 16) => Recipe::E2m1E8m0x16,
        (Dtype::E4m3, 16) => Recipe::Nvfp4,
        (d, _) => {
            return Err(PyValueError::new_err(format!(
                "scales {:?} of {d:?}: one per 32 or 16 of K = {k} in e8m0, or per 16 in e4m3 \
                 (NVFP4), is needed",
                scales.shape
            )));
        }
    };
    if recipe != Recipe::Nvfp4 && global_scale.is_some() {
        return Err(PyValueError::new_err(
            "global_scale is NVFP4's (e4m3 scales per 16)",
        ));
    }
    let opts = QuantizeOptions {
        tensor_scale: global_scale,
        ..QuantizeOptions::default()
    };
    run_quantizer(py, [&x, &out, &scales], recipe.a(), opts, stream)
}

/// A quantizer call's `x`, `out` and `scales`, read.
fn quantizer_tensors(objs: [&Bound<'_, PyAny>; 3]) -> PyResult<[Tensor; 3]> {
    let [x, out, scales] = objs;
    Ok([
        Tensor::of("x", x)?,
        Tensor::of("out", out)?,
        Tensor::of("scales", scales)?,
    ])
}

/// Quantizes `x` into `out` (FP8 codes of the format's element type) and `scales` (of dtype
/// `scale`) in the A format of `recipe`, on the crate's device quantizer.
fn quantize_fp8(
    py: Python<'_>,
    [x, out, scales]: [Tensor; 3],
    (recipe, scale): (Recipe, Dtype),
    stream: Option<u64>,
) -> PyResult<()> {
    let format = recipe.a();
    let code = if format.elem == ElemType::E5M2 {
        Dtype::E5m2
    } else {
        Dtype::E4m3
    };
    x.need(&[Dtype::Bf16, Dtype::F16, Dtype::F32])?;
    out.need(&[code])?;
    scales.need(&[scale])?;
    for t in [&x, &out] {
        t.contiguous()?;
    }
    let (_, m, k) = x.dims3()?;
    if out.shape != x.shape {
        return Err(PyValueError::new_err(format!(
            "out {:?} is not of x's shape {:?}",
            out.shape, x.shape
        )));
    }
    let (_, group) = format.block.extent(m, k);
    if !k.is_multiple_of(group) {
        return Err(PyValueError::new_err(format!(
            "x: K = {k} is not a multiple of the group size {group}"
        )));
    }
    run_quantizer(
        py,
        [&x, &out, &scales],
        format,
        QuantizeOptions::default(),
        stream,
    )?;
    Ok(())
}

/// Quantizes the checked `x` (…, M, K) into `out` and `scales` of `format` with `opts`, on the
/// caller's stream; returns the tensor scale the quantizer used (1 but for NVFP4).
fn run_quantizer(
    py: Python<'_>,
    [x, out, scales]: [&Tensor; 3],
    format: blockscaled::OperandFormat,
    opts: QuantizeOptions,
    stream: Option<u64>,
) -> PyResult<f32> {
    let (l, m, k) = x.dims3()?;
    let input = x.dtype.input();
    let desc = MatrixDesc {
        format,
        rows: m,
        k,
        batch: l,
        scale_layout: scales.scale_layout(l)?,
        tensor_scale: 1.0,
    };
    let place = placement(py, &[x, out, scales], stream)?;
    let (raw_x, raw_out, raw_scales) = (x.raw(), out.raw(), scales.raw());
    py.detach(move || {
        with_gpu(place.0, place.1, |g| {
            // SAFETY: the addresses and lengths are the tensors' own, alive for this call (the
            // Python caller holds them), `out` and `scales` writable (torch tensors); the crate
            // checks each against the driver's allocation and context.
            let (t, mut q) = unsafe {
                (
                    g.tensor_from_raw(raw_x, input, (m, k, l))?,
                    g.matrix_from_raw(desc, raw_out, raw_scales, true)?,
                )
            };
            g.quantize_into(&t, &mut q, &opts)?;
            Ok(q.desc().tensor_scale)
        })
    })
}

/// The crate's version.
#[pyfunction]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_function(wrap_pyfunction!(fp8_gemm_nt, m)?)?;
    m.add_function(wrap_pyfunction!(gemm_nt, m)?)?;
    m.add_function(wrap_pyfunction!(_bsr_mm, m)?)?;
    m.add_function(wrap_pyfunction!(_bsr_prepare, m)?)?;
    m.add_class::<PreparedBsr>()?;
    m.add_function(wrap_pyfunction!(m_grouped_fp8_gemm_nt_contiguous, m)?)?;
    m.add_function(wrap_pyfunction!(m_grouped_fp8_gemm_nt_masked, m)?)?;
    m.add_function(wrap_pyfunction!(m_grouped_gemm_nt_contiguous, m)?)?;
    m.add_function(wrap_pyfunction!(m_grouped_gemm_nt_masked, m)?)?;
    m.add_function(wrap_pyfunction!(per_token_group_quant_fp8_into, m)?)?;
    m.add_function(wrap_pyfunction!(quantize_mxfp8_into, m)?)?;
    m.add_function(wrap_pyfunction!(quantize_fp4_into, m)?)?;
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add("BlockscaledError", py.get_type::<BlockscaledError>())?;
    m.add("ShapeError", py.get_type::<ShapeError>())?;
    m.add("AlignmentError", py.get_type::<AlignmentError>())?;
    m.add("FormatError", py.get_type::<FormatError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("ArchitectureError", py.get_type::<ArchitectureError>())?;
    m.add("NoDeviceError", py.get_type::<NoDeviceError>())?;
    m.add("WrongGpuError", py.get_type::<WrongGpuError>())?;
    m.add("DriverError", py.get_type::<DriverError>())?;
    Ok(())
}
