//! [`BlockScaledLinear`]: `y = act(x · Wᵀ + bias)` with W block-scaled, as a candle module, and
//! its grouped form for mixture-of-experts layers.

use std::sync::{Arc, Mutex};

use blockscaled::{
    Call, DeviceGroups, DeviceMatrix, DeviceOutput, DeviceTensor, ElemType, Epilogue, Gpu,
    GroupLayout, InputType, MatrixDesc, QuantizeOptions, ScaleLayout, ScaleMajor, ScaleType,
};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::{CudaDevice, CudaStorage, CudaStorageSlice};
use candle_core::{
    CpuStorage, CustomOp1, CustomOp2, DType, InplaceOp2, Layout, Module, Result, Shape, Storage,
    Tensor, bail,
};

use crate::memory::{ByAddress, Bytes, OutputViews, bytes_of, new_output, out_type};
use crate::{Activation, Recipe, err, gpu_of};

/// Activation matrices quantized on the device and kept for the next call of the same shape:
/// a serving loop's few shapes (decode, prefill chunks) each quantize into memory made once.
const KEPT_ACTIVATIONS: usize = 8;

/// A linear layer `y = act(x · Wᵀ + bias)` whose weights W (`N × K`, or `E × N × K` experts)
/// are block-scaled codes and scales in candle tensors, multiplied by blockscaled's kernels.
///
/// - The weights are read where candle holds them (the layer keeps the two tensors): nothing is
///   copied; the copies a kernel reads beside them (re-laid-out scales, reordered 4-bit codes) are
///   made on the GPU once, when the layer is made.
/// - [`forward`](Self::forward) takes `x` of `(…, K)` in bf16, f16 or f32 (bf16 for the 4-bit
///   weights × bf16 recipes), quantizes it on the GPU to the recipe's activation format (into a
///   buffer the layer keeps per shape), and returns `(…, N)` in bf16 (or
///   [`with_output`](Self::with_output)'s type), `N / 2` with SwiGLU.
/// - [`forward_grouped`](Self::forward_grouped) runs a mixture-of-experts layer: each group of
///   rows times its expert, the group sizes read on the device.
/// - Every call is enqueued on the candle device's stream with no host wait: it orders with
///   candle's kernels and can be captured in a CUDA graph.
pub struct BlockScaledLinear {
    gpu: Arc<Gpu>,
    device: CudaDevice,
    recipe: Recipe,
    weights: DeviceMatrix<'static>,
    n: usize,
    k: usize,
    batch: usize,
    bias: Option<(DeviceTensor<'static>, Tensor)>,
    activation: Activation,
    output: DType,
    quantize: QuantizeOptions,
    kept: Mutex<Vec<((usize, usize), DeviceMatrix<'static>)>>,
    /// Output views and bf16 activation views by address (their tensor maps made once).
    outputs: OutputViews,
    halves: ByAddress<(usize, usize, usize), DeviceMatrix<'static>>,
    /// Quantizer inputs by address (made once: their checks ask the driver about the memory).
    inputs: ByAddress<(InputType, (usize, usize, usize)), DeviceTensor<'static>>,
    /// The candle tensors whose memory `weights` reads (after it, so it is dropped first).
    _storage: [Tensor; 2],
}

impl BlockScaledLinear {
    /// A layer over `weight`'s codes and `scale`'s scales in `recipe`'s weights format
    /// ([`Recipe::b`]), tensor scale 1. `weight` is `(N, K)` codes (`(N, K / 2)` bytes for
    /// e2m1), or `(E, N, K)` for E experts (grouped) or batch entries; `scale` holds the scales
    /// K-major, `(…, N / block rows, K / block K)` rounded up (one value per batch entry for
    /// per-tensor scales, N for per-row). See the crate doc for the dtypes each format takes.
    pub fn new(recipe: Recipe, weight: &Tensor, scale: &Tensor) -> Result<Self> {
        Self::with_tensor_scale(recipe, weight, scale, 1.0)
    }

    /// [`BlockScaledLinear::new`] with NVFP4's fp32 tensor scale of the weights (a modelopt
    /// checkpoint's `weight_scale_2`).
    pub fn with_tensor_scale(
        recipe: Recipe,
        weight: &Tensor,
        scale: &Tensor,
        tensor_scale: f32,
    ) -> Result<Self> {
        let device = weight.device().as_cuda_device()?.clone();
        if !scale.device().same_device(weight.device()) {
            bail!("the weights' codes and scales are on different devices")
        }
        let gpu = gpu_of(&device)?;
        let (weight, scale) = (weight.contiguous()?, scale.contiguous()?);
        let desc = weight_desc(recipe, &weight, &scale, tensor_scale)?;
        let weights = {
            let (w, wl) = weight.storage_and_layout();
            let (s, sl) = scale.storage_and_layout();
            let w = bytes_of(cuda(&w, "the weights")?, wl, "the weights")?;
            let s = bytes_of(cuda(&s, "the scales")?, sl, "the scales")?;
            check_dtype(&w, codes_dtypes(desc.format.elem), "the weights' codes")?;
            check_dtype(&s, scale_dtypes(desc.format.scale), "the weights' scales")?;
            exact(&w, desc.data_bytes(), "the weights' codes")?;
            exact(&s, desc.scale_bytes(), "the weights' scales")?;
            // SAFETY: the memory is the two candle tensors' storage, which the layer keeps (in
            // `_storage`) for as long as the matrix lives, in the context of `gpu` (the candle
            // device's, checked by the call); candle frees and writes it only in the order of
            // the device's one stream, which is the handle's, so after the work enqueued with it.
            let m = unsafe { gpu.matrix_from_raw(desc, w.raw, s.raw, false) }.map_err(err)?;
            gpu.prepare_weights(&m).map_err(err)?;
            m
        };
        Ok(BlockScaledLinear {
            gpu,
            device,
            recipe,
            n: desc.rows,
            k: desc.k,
            batch: desc.batch,
            weights,
            bias: None,
            activation: Activation::None,
            output: DType::BF16,
            quantize: QuantizeOptions::default(),
            kept: Mutex::new(Vec::new()),
            outputs: ByAddress::new(),
            halves: ByAddress::new(),
            inputs: ByAddress::new(),
            _storage: [weight, scale],
        })
    }

    /// With a bias per output column (`N` values of bf16, f16 or f32, on the layer's device),
    /// added in the GEMM's epilogue.
    pub fn with_bias(mut self, bias: &Tensor) -> Result<Self> {
        let bias = bias.contiguous()?;
        if bias.elem_count() != self.n {
            bail!(
                "the bias has {} values, the layer {} outputs",
                bias.elem_count(),
                self.n
            )
        }
        let t = {
            let (b, bl) = bias.storage_and_layout();
            let b = bytes_of(
                self.on_device(cuda(&b, "the bias")?, "the bias")?,
                bl,
                "the bias",
            )?;
            // SAFETY: as the weights' (`with_tensor_scale`): the layer keeps `bias`.
            unsafe {
                self.gpu
                    .tensor_from_raw(b.raw, input_type(b.dtype)?, (1, self.n, 1))
            }
            .map_err(err)?
        };
        self.bias = Some((t, bias));
        Ok(self)
    }

    /// With an activation applied in the epilogue after the bias (SwiGLU: the weights' rows
    /// interleave gate and up, and the output has `N / 2` columns; see
    /// [`blockscaled::interleave_gate_up`]).
    pub fn with_activation(mut self, activation: Activation) -> Self {
        self.activation = activation;
        self
    }

    /// With outputs of `dtype` (bf16, f16 or f32).
    pub fn with_output(mut self, dtype: DType) -> Result<Self> {
        out_type(dtype)?;
        self.output = dtype;
        Ok(self)
    }

    /// With the activations' NVFP4 tensor scale fixed (a modelopt checkpoint's `input_scale`).
    /// Without it, each NVFP4 quantization of the activations computes its own from their
    /// largest magnitude, which reads four bytes back and so waits for the stream.
    pub fn with_input_scale(mut self, scale: f32) -> Self {
        self.quantize.tensor_scale = Some(scale);
        self
    }

    /// The recipe.
    pub fn recipe(&self) -> Recipe {
        self.recipe
    }

    /// (N, K, E): outputs, inputs, and experts (or batch entries).
    pub fn dims(&self) -> (usize, usize, usize) {
        (self.n, self.k, self.batch)
    }

    /// `act(x · Wᵀ + bias)` for `x` of `(…, K)`; with E > 1 weight entries, `x` is `(E, M, K)`
    /// and entry e multiplies weights e.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.contiguous()?.apply_op1_no_bwd(&Op {
            layer: self,
            groups: None,
        })
    }

    /// [`forward`](Self::forward) into `out`, a contiguous tensor of the output's shape and dtype
    /// on the layer's device (made once, as an engine's activation buffer is): no candle
    /// allocation, and the output's tensor maps are made once for its memory.
    pub fn forward_into(&self, x: &Tensor, out: &Tensor) -> Result<()> {
        out.inplace_op2(&x.contiguous()?, &Into { layer: self })
    }

    /// The mixture-of-experts layer: each group of `x`'s rows times its expert's weights, `groups`
    /// an `I32` tensor of E values on the device (a router's output, never read by the host).
    /// - [`GroupLayout::Contiguous`]: `x` is `(R, K)`, the groups' rows stacked; `groups` holds
    ///   each group's end row; rows past the last end come out zero.
    /// - [`GroupLayout::Masked`]: `x` is `(E, capacity, K)`; `groups` holds each expert's row
    ///   count; rows at or past it come out zero.
    ///
    /// The fused epilogue (bias, activation) is not applied to grouped GEMMs: an error if set.
    pub fn forward_grouped(
        &self,
        x: &Tensor,
        groups: &Tensor,
        layout: GroupLayout,
    ) -> Result<Tensor> {
        x.contiguous()?.apply_op2_no_bwd(
            &groups.contiguous()?,
            &Op {
                layer: self,
                groups: Some(layout),
            },
        )
    }

    /// `s`, unless it is on another device than the layer's.
    fn on_device<'s>(&self, s: &'s CudaStorage, what: &str) -> Result<&'s CudaStorage> {
        if s.device.id() != self.device.id() {
            bail!("{what} is on another CUDA device than the layer's weights")
        }
        Ok(s)
    }

    /// The GEMM of `x` (under `xl`) and the weights, over `groups` where given.
    fn run(
        &self,
        x: &CudaStorage,
        xl: &Layout,
        groups: Option<(&CudaStorage, &Layout, GroupLayout)>,
        into: Option<(&CudaStorage, &Layout)>,
    ) -> Result<Option<(CudaStorage, Shape)>> {
        let gpu = &*self.gpu;
        let x = self.on_device(x, "the input")?;
        let dims = xl.shape().dims();
        let Some(&k) = dims.last() else {
            bail!("the input is a scalar, not (…, K)")
        };
        if k != self.k {
            bail!("the input has K = {k}, the weights {}", self.k)
        }
        // (batch, rows) of A, and the output's batch.
        let ((batch, rows), out_batch) = match (groups, self.batch) {
            (None, 1) => ((1, xl.shape().elem_count() / k.max(1)), 1),
            (None, e) | (Some((.., GroupLayout::Masked)), e) => match dims {
                [b, m, _] if *b == e => ((e, *m), e),
                _ => {
                    bail!("the input is {dims:?}: with {e} weight entries it must be ({e}, M, {k})")
                }
            },
            (Some(_), e) => match dims {
                [r, _] => ((1, *r), 1),
                _ => bail!(
                    "the input is {dims:?}: a contiguous grouped GEMM takes (R, {k}) over {e} experts"
                ),
            },
        };
        let n_out = if self.activation == Activation::SwiGlu {
            self.n / 2
        } else {
            self.n
        };
        let mut out_dims = dims.to_vec();
        *out_dims.last_mut().expect("not a scalar") = n_out;
        let groups = groups
            .map(|(s, l, layout)| self.groups(self.on_device(s, "the groups")?, l, layout))
            .transpose()?;
        let xb = bytes_of(x, xl, "the input")?;
        let epi = Epilogue {
            bias: self.bias.as_ref().map(|(t, _)| t),
            activation: self.activation,
            ..Epilogue::default()
        };
        let dims = (out_batch, rows, n_out);
        let into = into
            .map(|(o, ol)| -> Result<_> {
                let o = bytes_of(self.on_device(o, "the output")?, ol, "the output")?;
                if o.dtype != self.output || ol.shape().dims() != out_dims.as_slice() {
                    bail!(
                        "the output is {:?} of {:?}; this call writes {out_dims:?} of {:?}",
                        ol.shape().dims(),
                        o.dtype,
                        self.output
                    )
                }
                Ok(o.raw)
            })
            .transpose()?;
        let product = |a: &DeviceMatrix<'_>| -> Result<Option<CudaStorage>> {
            let mut call = Call::new(a, &self.weights);
            if !epi.is_plain() {
                call = call.epilogue(&epi);
            }
            if let Some(g) = &groups {
                call = call.groups(g);
            }
            let run = |c: &mut DeviceOutput<'static>| gpu.run(&call, c);
            let Some(raw) = into else {
                let zeroed = groups.is_some();
                let out = new_output(
                    gpu,
                    &self.device,
                    &self.outputs,
                    self.output,
                    dims,
                    zeroed,
                    run,
                );
                return out.map(Some);
            };
            let out = out_type(self.output)?;
            let (l, m, n) = dims;
            self.outputs.with(
                raw,
                (out, (m, n, l)),
                // SAFETY: the output tensor's storage, which candle keeps (locked for writing)
                // while this operation runs, in the device's stream order; the view is used
                // again only over the same live memory (`ByAddress`).
                || unsafe { gpu.output_from_raw(raw, out, (m, n, l)) }.map_err(err),
                |c| run(c).map_err(err),
            )?;
            Ok(None)
        };
        let out = if matches!(self.recipe.a().elem, ElemType::BF16 | ElemType::F16) {
            if xb.dtype != DType::BF16 {
                bail!(
                    "{} multiplies bf16 activations, not {:?}",
                    self.recipe,
                    xb.dtype
                )
            }
            let dims = (rows, k, batch);
            self.halves.with(
                xb.raw,
                dims,
                // SAFETY: `x`'s storage, which candle keeps (and does not write) while this
                // operation runs and frees only in the order of the device's stream, the
                // handle's; the view is used again only over the same live memory (`ByAddress`).
                || unsafe { gpu.half_from_raw(xb.raw, ElemType::BF16, dims) }.map_err(err),
                |a| product(a),
            )?
        } else {
            let input = input_type(xb.dtype)?;
            let dims = (rows, k, batch);
            let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
            let i = self.inputs.with(
                xb.raw,
                (input, dims),
                // SAFETY: `x`'s storage, which candle keeps (and does not write) while this
                // operation runs and frees only in the order of the device's stream, the
                // handle's; the tensor is used again only over the same live memory
                // (`ByAddress`).
                || unsafe { gpu.tensor_from_raw(xb.raw, input, dims) }.map_err(err),
                |t| {
                    Ok(
                        match kept.iter().position(|(shape, _)| *shape == (rows, batch)) {
                            Some(i) => {
                                gpu.quantize_into(t, &mut kept[i].1, &self.quantize)
                                    .map_err(err)?;
                                i
                            }
                            None => {
                                let q = gpu
                                    .quantize_with(t, self.recipe.a(), &self.quantize)
                                    .map_err(err)?;
                                if kept.len() == KEPT_ACTIVATIONS {
                                    kept.remove(0);
                                }
                                kept.push(((rows, batch), q.matrix));
                                kept.len() - 1
                            }
                        },
                    )
                },
            )?;
            // (Held until the GEMM is enqueued: a call on another thread quantizes into this
            // matrix only after, in stream order.)
            product(&kept[i].1)?
        };
        Ok(out.map(|o| (o, Shape::from(out_dims))))
    }

    /// The groups' values over `s` (E `I32`s), borrowed for the call.
    fn groups<'s>(
        &self,
        s: &'s CudaStorage,
        l: &Layout,
        layout: GroupLayout,
    ) -> Result<DeviceGroups<'s>> {
        let CudaStorageSlice::I32(v) = &s.slice else {
            bail!("the groups are {:?}, not I32", s.dtype())
        };
        let Some((start, end)) = l.contiguous_offsets() else {
            bail!("the groups are not contiguous")
        };
        if end - start != self.batch {
            bail!("{} group values for {} experts", end - start, self.batch)
        }
        self.gpu
            .groups_view(layout, v.slice(start..end))
            .map_err(err)
    }
}

impl Module for BlockScaledLinear {
    fn forward(&self, xs: &Tensor) -> Result<Tensor> {
        BlockScaledLinear::forward(self, xs)
    }
}

impl std::fmt::Debug for BlockScaledLinear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockScaledLinear")
            .field("recipe", &self.recipe)
            .field("n", &self.n)
            .field("k", &self.k)
            .field("batch", &self.batch)
            .field("activation", &self.activation)
            .field("output", &self.output)
            .finish()
    }
}

/// One forward call as a candle operation (no gradient).
struct Op<'l> {
    layer: &'l BlockScaledLinear,
    groups: Option<GroupLayout>,
}

const CPU: &str = "blockscaled runs on CUDA devices: move the tensors to a CUDA device";

impl CustomOp1 for Op<'_> {
    fn name(&self) -> &'static str {
        "blockscaled-linear"
    }
    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        bail!("{CPU}")
    }
    fn cuda_fwd(&self, x: &CudaStorage, xl: &Layout) -> Result<(CudaStorage, Shape)> {
        self.layer
            .run(x, xl, None, None)?
            .ok_or_else(unreachable_output)
    }
}

impl CustomOp2 for Op<'_> {
    fn name(&self) -> &'static str {
        "blockscaled-grouped-linear"
    }
    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        bail!("{CPU}")
    }
    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        xl: &Layout,
        g: &CudaStorage,
        gl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let layout = self.groups.expect("a grouped call");
        self.layer
            .run(x, xl, Some((g, gl, layout)), None)?
            .ok_or_else(unreachable_output)
    }
}

/// The into-form's output where a new one was wanted (not reached: `run` makes one without
/// `into`).
fn unreachable_output() -> candle_core::Error {
    candle_core::Error::Msg("no output was made".into())
}

/// `act(x · Wᵀ + bias)` written into an existing tensor (candle's in-place operation on it).
struct Into<'l> {
    layer: &'l BlockScaledLinear,
}

impl InplaceOp2 for Into<'_> {
    fn name(&self) -> &'static str {
        "blockscaled-linear-into"
    }
    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<()> {
        bail!("{CPU}")
    }
    fn cuda_fwd(
        &self,
        out: &mut CudaStorage,
        ol: &Layout,
        x: &CudaStorage,
        xl: &Layout,
    ) -> Result<()> {
        self.layer.run(x, xl, None, Some((out, ol)))?;
        Ok(())
    }
}

/// `s` as CUDA storage, or an error naming `what`.
fn cuda<'s>(s: &'s Storage, what: &str) -> Result<&'s CudaStorage> {
    match s {
        Storage::Cuda(s) => Ok(s),
        _ => bail!("{what} is not on a CUDA device"),
    }
}

fn input_type(dtype: DType) -> Result<InputType> {
    Ok(match dtype {
        DType::BF16 => InputType::Bf16,
        DType::F16 => InputType::F16,
        DType::F32 => InputType::F32,
        _ => bail!("activations are bf16, f16 or f32, not {dtype:?}"),
    })
}

/// The candle dtypes that hold codes of `elem`.
fn codes_dtypes(elem: ElemType) -> &'static [DType] {
    match elem {
        ElemType::E4M3 => &[DType::F8E4M3, DType::U8],
        _ => &[DType::U8],
    }
}

/// The candle dtypes that hold scales of `scale`.
fn scale_dtypes(scale: ScaleType) -> &'static [DType] {
    match scale {
        ScaleType::F32 => &[DType::F32],
        ScaleType::E8M0 => &[DType::F8E8M0, DType::U8],
        _ => &[DType::F8E4M3, DType::U8],
    }
}

fn check_dtype(b: &Bytes, allowed: &[DType], what: &str) -> Result<()> {
    if !allowed.contains(&b.dtype) {
        bail!("{what} are {:?}; this format takes {allowed:?}", b.dtype)
    }
    Ok(())
}

fn exact(b: &Bytes, need: Option<usize>, what: &str) -> Result<()> {
    match need {
        Some(n) if n == b.raw.len => Ok(()),
        Some(n) => bail!("{what} hold {} bytes, the shape needs {n}", b.raw.len),
        None => bail!("{what}: the shape's size overflows"),
    }
}

/// The weights' description: `recipe`'s B format over `weight`'s shape, K-major scales.
fn weight_desc(
    recipe: Recipe,
    weight: &Tensor,
    scale: &Tensor,
    tensor_scale: f32,
) -> Result<MatrixDesc> {
    let format = recipe.b();
    let (batch, rows, cols) = match weight.dims() {
        [n, k] => (1, *n, *k),
        [e, n, k] => (*e, *n, *k),
        d => bail!("the weights are {d:?}: (N, K) or (E, N, K)"),
    };
    let k = if format.elem == ElemType::E2M1 {
        2 * cols
    } else {
        cols
    };
    let (br, bk) = format.block.extent(rows, k);
    let (rb, kb) = (rows.div_ceil(br), k.div_ceil(bk));
    let sd = scale.dims();
    if sd.len() >= 2 && sd[sd.len() - 2..] != [rb, kb] {
        bail!(
            "the scales are {sd:?}; {recipe}'s weights of {rows} × {k} take (…, {rb}, {kb}), K-major"
        )
    }
    Ok(MatrixDesc {
        format,
        rows,
        k,
        batch,
        scale_layout: ScaleLayout::packed(ScaleMajor::K, rb, kb),
        tensor_scale,
    })
}
