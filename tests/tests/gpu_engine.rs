//! GPU tests of use from an inference engine: operands, tensors, outputs and groups over the
//! caller's device memory (views into one arena, raw addresses), the caller's context and
//! streams, no allocation in a steady-state loop, capture in a CUDA graph (no host wait inside a
//! call), two threads on two streams, and a `Gpu` dropped while its kernels run.
//! Every result is compared bit for bit with the same call on crate-owned memory, which the
//! other GPU test binaries check against the CPU reference; every output is poisoned first.

use std::sync::{Arc, OnceLock};

use blockscaled::kernels::params::Activation;
use blockscaled::{
    BsrMatrix, Call, ClusterShape, DeviceMatrix, DeviceOutput, DeviceTensor, ElemType, Epilogue,
    Error, Fp4Weights, Fp8, Gpu, GroupLayout, HostOutput, InputType, OutType, Plan,
    QuantizeOptions, RawDevice, Recipe, ScaleLayout, ScaleMajor, ScaledMatrix, Sm90Config,
    Sm90Tile, SparseSide, Workspace, WorkspaceSize, device_allocations,
};
use blockscaled_tests::layouts::with_scale_layout;
use blockscaled_tests::{random_matrix, random_values};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, sys};
use half::bf16;

/// Every test of this binary holds it: two of them count the process's device allocations, which
/// a test running beside them would change.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| Gpu::new(0).expect("a CUDA device (these tests are ignored without one)"))
}

/// Asserts that two outputs hold the same bits in every element, and that every element is
/// finite (a NaN left by the poison never passes).
fn assert_bit_identical(got: &HostOutput, want: &HostOutput, what: &str) {
    assert_eq!(got.values.len(), want.values.len(), "{what}: lengths");
    for (i, (g, w)) in got.values.iter().zip(&want.values).enumerate() {
        assert!(
            w.is_finite(),
            "{what}: element {i} of the owned result is {w}"
        );
        assert_eq!(
            g.to_bits(),
            w.to_bits(),
            "{what}: element {i}: {g} against {w}"
        );
    }
}

/// One arena of caller memory holding several matrices' codes and scales at offsets (each a
/// multiple of 256 bytes past a 256-byte gap, as an engine's weight arena would).
struct Arena {
    buf: CudaSlice<u8>,
    /// (codes offset, codes bytes, scales offset, scales bytes) per matrix.
    at: Vec<(usize, usize, usize, usize)>,
}

impl Arena {
    /// Read-only views of `ms` (the matrices `Arena::of` was made of) by raw address, as a
    /// binding makes them.
    fn raw_views(&self, g: &Gpu, ms: &[&ScaledMatrix]) -> Vec<DeviceMatrix<'static>> {
        let (base, _g) = self.buf.device_ptr(g.stream());
        let raw = |off: usize, len: usize| RawDevice {
            ptr: base + off as u64,
            len,
        };
        ms.iter()
            .zip(&self.at)
            .map(|(m, &(d, dl, sc, sl))| {
                // SAFETY: the addresses lie in `self.buf`, which the callers keep alive past
                // the views and the work on them (synchronized before it is dropped); nothing
                // writes it.
                unsafe { g.matrix_from_raw(*m.desc(), raw(d, dl), raw(sc, sl), false) }.unwrap()
            })
            .collect()
    }

    fn of(stream: &Arc<CudaStream>, ms: &[&ScaledMatrix]) -> Arena {
        let mut at = Vec::new();
        let mut end = 256;
        for m in ms {
            let d = end;
            end = (d + m.data().len()).next_multiple_of(256) + 256;
            let s = end;
            end = (s + m.scales().len()).next_multiple_of(256) + 256;
            at.push((d, m.data().len(), s, m.scales().len()));
        }
        // Poisoned around the matrices: a read outside them would show.
        let mut host = vec![0xFFu8; end];
        for (m, &(d, dl, s, sl)) in ms.iter().zip(&at) {
            host[d..d + dl].copy_from_slice(m.data());
            host[s..s + sl].copy_from_slice(m.scales());
        }
        Arena {
            buf: stream.clone_htod(&host).unwrap(),
            at,
        }
    }

    fn view<'a>(&'a self, g: &Gpu, i: usize, m: &ScaledMatrix) -> DeviceMatrix<'a> {
        let (d, dl, s, sl) = self.at[i];
        g.matrix_view(
            *m.desc(),
            self.buf.slice(d..d + dl),
            self.buf.slice(s..s + sl),
        )
        .unwrap()
    }
}

/// C = A · Bᵀ on crate-owned buffers.
fn owned_gemm(g: &Gpu, a: &ScaledMatrix, b: &ScaledMatrix, dtype: OutType) -> (Plan, HostOutput) {
    let (da, db) = (g.upload(a).unwrap(), g.upload(b).unwrap());
    let mut c = g.output(a.rows(), b.rows(), a.batch(), dtype).unwrap();
    let plan = g.plan(&da, &db).unwrap();
    g.gemm(&da, &db, &mut c).unwrap();
    (plan, c.to_host().unwrap())
}

/// A caller's output buffer: `bytes` past a 512-byte offset in a larger allocation, poisoned.
fn caller_output(stream: &Arc<CudaStream>, bytes: usize) -> CudaSlice<u8> {
    stream.clone_htod(&vec![0xFFu8; bytes + 1024]).unwrap()
}

#[test]
#[ignore = "needs a CUDA device"]
fn raw_views_read_scales_in_place_where_their_layout_is_the_kernels() {
    // Read-only raw views, as a binding makes every call: A's scales M-major (DeepGEMM's,
    // planes 16-byte aligned, padded past M) are mapped in place, B's 128 × 128 tiles in the
    // kernel's order are read in place, and a weights-like matrix as A gets its A-role copy at
    // its first use as A. Each gives the crate-owned upload's result bit for bit.
    let _serial = serial();
    let g = gpu();
    let recipe = Recipe::DeepSeekFp8;
    for (i, &(m, n, k, l)) in [(20, 256, 512, 1), (128, 384, 1024, 2), (1, 128, 256, 1)]
        .iter()
        .enumerate()
    {
        let (_, a) = random_matrix(40 + i as u64, m, k, l, recipe.a());
        let (_, b) = random_matrix(50 + i as u64, n, k, l, recipe.b());
        let kb = k / 128;
        let pitch = m.next_multiple_of(4) + 4 * (i % 2);
        let mn_major = ScaleLayout {
            row_blocks: m,
            k_blocks: kb,
            row_stride: 1,
            k_stride: pitch,
            batch_stride: pitch * kb + 4,
        };
        let a_mn = with_scale_layout(&a, mn_major, 0);
        let (_, want) = owned_gemm(g, &a, &b, OutType::F32);
        // B as A (its scales per 128 × 128), A's rows as B: the weights-like A role.
        let (_, b_first) = random_matrix(60 + i as u64, n, k, l, recipe.b());
        let (_, want_bb) = owned_gemm(g, &b_first, &b, OutType::F32);
        let ms = [&a_mn, &b, &b_first];
        let arena = Arena::of(g.stream(), &ms);
        let [va, vb, vbb]: [DeviceMatrix; 3] = arena.raw_views(g, &ms).try_into().unwrap();
        let mut c = g.output(m, n, l, OutType::F32).unwrap();
        c.poison().unwrap();
        g.gemm(&va, &vb, &mut c).unwrap();
        let what = format!("{m}×{n}×{k}×{l}, A's scales M-major at pitch {pitch}");
        assert_bit_identical(&c.to_host().unwrap(), &want, &what);
        let mut c = g.output(n, n, l, OutType::F32).unwrap();
        c.poison().unwrap();
        g.gemm(&vbb, &vb, &mut c).unwrap();
        let what = format!("{n}×{n}×{k}×{l}, a weights-like matrix as A");
        assert_bit_identical(&c.to_host().unwrap(), &want_bb, &what);
    }
    // The 4-bit-weights kernels' e4m3 activations (W4A8): the stream kernel (M ≤ 16) and the
    // FP8-MMA kernel read M-major scales in place where each batch entry follows the last
    // densely, else from their own copy (the last case's padded batch stride).
    let recipe = Recipe::W4A8(Fp4Weights::Mxfp4);
    for (i, &(m, n, k, l, gap)) in [
        (16, 256, 512, 1, 0),
        (64, 256, 512, 1, 0),
        (5, 128, 256, 2, 0),
        (5, 128, 256, 2, 4),
    ]
    .iter()
    .enumerate()
    {
        let (_, a) = random_matrix(70 + i as u64, m, k, l, recipe.a());
        let (_, b) = random_matrix(80 + i as u64, n, k, l, recipe.b());
        let (kb, pitch) = (k / 128, m.next_multiple_of(4) + 4);
        let a_mn = with_scale_layout(
            &a,
            ScaleLayout {
                row_blocks: m,
                k_blocks: kb,
                row_stride: 1,
                k_stride: pitch,
                batch_stride: pitch * kb + gap,
            },
            0,
        );
        let (plan, want) = owned_gemm(g, &a, &b, OutType::F32);
        let arena = Arena::of(g.stream(), &[&a_mn, &b]);
        let views = arena.raw_views(g, &[&a_mn, &b]);
        let mut c = g.output(m, n, l, OutType::F32).unwrap();
        c.poison().unwrap();
        g.gemm(&views[0], &views[1], &mut c).unwrap();
        let what = format!("W4A8 {m}×{n}×{k}×{l} ({plan:?}), A's scales M-major, gap {gap}");
        assert_bit_identical(&c.to_host().unwrap(), &want, &what);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn views_of_an_arena_give_bit_identical_results_on_every_family() {
    let _serial = serial();
    let g = gpu();
    let cases = [
        (Recipe::DeepSeekFp8, 200, 384, 1024, "sm90 FP8"),
        (
            Recipe::Fp8PerRow(Fp8::E4M3),
            256,
            256,
            512,
            "sm90 FP8, per row",
        ),
        (Recipe::Mxfp8(Fp8::E4M3), 200, 384, 1024, "sm90 MX"),
        (Recipe::Nvfp4, 512, 768, 1024, "fold onto FP8"),
        (Recipe::Mxfp4, 16, 512, 1024, "4-bit weights, e2m1 both"),
        (
            Recipe::W4A8(Fp4Weights::Nvfp4),
            8,
            512,
            1024,
            "4-bit weights, FP8 activations",
        ),
    ];
    for (i, &(recipe, m, n, k, what)) in cases.iter().enumerate() {
        let seed = 1000 + i as u64;
        let (_, a) = random_matrix(seed, m, k, 1, recipe.a());
        let (_, b) = random_matrix(seed + 1, n, k, 1, recipe.b());
        let (plan, want) = owned_gemm(g, &a, &b, OutType::Bf16);
        let arena = Arena::of(g.stream(), &[&a, &b]);
        let (va, vb) = (arena.view(g, 0, &a), arena.view(g, 1, &b));
        assert!(va.is_borrowed());
        assert_eq!(g.plan(&va, &vb).unwrap(), plan, "{what}: the same plan");
        let mut out = caller_output(g.stream(), m * n * 2);
        let mut c = g
            .output_view(
                out.slice_mut(512..512 + m * n * 2),
                OutType::Bf16,
                (m, n, 1),
            )
            .unwrap();
        g.gemm(&va, &vb, &mut c).unwrap();
        assert_bit_identical(&c.to_host().unwrap(), &want, what);
        // Weights prepared up front: the next GEMM on them allocates nothing.
        g.prepare_weights(&vb).unwrap();
        let before = device_allocations();
        g.gemm(&va, &vb, &mut c).unwrap();
        assert_eq!(
            device_allocations(),
            before,
            "{what}: a GEMM on prepared views allocates"
        );
        assert_bit_identical(&c.to_host().unwrap(), &want, what);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn raw_addresses_run_as_views_do_and_bad_ones_are_typed_errors() {
    let _serial = serial();
    let g = gpu();
    let (m, n, k) = (128, 256, 512);
    let recipe = Recipe::DeepSeekFp8;
    let (_, a) = random_matrix(7, m, k, 1, recipe.a());
    let (_, b) = random_matrix(8, n, k, 1, recipe.b());
    let (_, want) = owned_gemm(g, &a, &b, OutType::F32);
    let arena = Arena::of(g.stream(), &[&a, &b]);
    let base = {
        let (p, _g) = arena.buf.device_ptr(g.stream());
        p
    };
    let raw = |off: usize, len: usize| RawDevice {
        ptr: base + off as u64,
        len,
    };
    let (ad, adl, asc, asl) = arena.at[0];
    let (bd, bdl, bsc, bsl) = arena.at[1];
    // SAFETY: every address lies in `arena.buf`, which outlives the matrices; nothing else
    // writes it.
    let (ra, rb) = unsafe {
        (
            g.matrix_from_raw(*a.desc(), raw(ad, adl), raw(asc, asl), false)
                .unwrap(),
            g.matrix_from_raw(*b.desc(), raw(bd, bdl), raw(bsc, bsl), false)
                .unwrap(),
        )
    };
    let out = caller_output(g.stream(), m * n * 4);
    let out_ptr = {
        let (p, _g) = out.device_ptr(g.stream());
        p
    };
    // SAFETY: `out` outlives `c` and the work on it (synchronized by `to_host`).
    let mut c = unsafe {
        g.output_from_raw(
            RawDevice {
                ptr: out_ptr + 512,
                len: m * n * 4,
            },
            OutType::F32,
            (m, n, 1),
        )
    }
    .unwrap();
    g.gemm(&ra, &rb, &mut c).unwrap();
    assert_bit_identical(&c.to_host().unwrap(), &want, "raw addresses");

    // Past the allocation, not device memory, misaligned, too short, read-only as a destination.
    let end = arena.buf.len();
    // SAFETY: each call is refused before any use of the address.
    unsafe {
        let r = g.matrix_from_raw(*a.desc(), raw(end - 16, adl), raw(asc, asl), false);
        assert!(
            matches!(r, Err(Error::Shape(_))),
            "past the allocation: {r:?}"
        );
        let host = [0u8; 64];
        let r = g.tensor_from_raw(
            RawDevice {
                ptr: host.as_ptr() as u64,
                len: 64,
            },
            InputType::Bf16,
            (1, 32, 1),
        );
        assert!(matches!(r, Err(Error::WrongGpu(_))), "host memory: {r:?}");
    }
    let r = g.matrix_view(
        *a.desc(),
        arena.buf.slice(ad + 8..ad + 8 + adl),
        arena.buf.slice(asc..asc + asl),
    );
    assert!(matches!(r, Err(Error::Alignment(_))), "misaligned: {r:?}");
    let r = g.matrix_view(
        *a.desc(),
        arena.buf.slice(ad..ad + adl - 1),
        arena.buf.slice(asc..asc + asl),
    );
    assert!(matches!(r, Err(Error::Shape(_))), "one byte short: {r:?}");
    let t = g.upload_tensor(&vec![bf16::ONE; m * k], m, k, 1).unwrap();
    let mut read_only = arena.view(g, 0, &a);
    let r = g.quantize_into(&t, &mut read_only, &QuantizeOptions::default());
    assert!(
        matches!(r, Err(Error::Config(_))),
        "a read-only destination: {r:?}"
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_bf16_view_runs_the_4_bit_weights_kernel_as_an_upload_does() {
    let _serial = serial();
    let g = gpu();
    let (m, n, k) = (8, 512, 1024);
    let recipe = Recipe::W4A16(Fp4Weights::Mxfp4);
    let bits: Vec<u16> = random_values(21, m * k, k)
        .iter()
        .map(|&v| bf16::from_f32(v).to_bits())
        .collect();
    let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    let a = ScaledMatrix::from_parts(
        recipe.a(),
        m,
        k,
        1,
        bytes,
        1f32.to_le_bytes().to_vec(),
        ScaleLayout::packed(ScaleMajor::K, 1, 1),
        1.0,
    )
    .unwrap();
    let (_, b) = random_matrix(22, n, k, 1, recipe.b());
    let (plan, want) = owned_gemm(g, &a, &b, OutType::Bf16);
    assert!(matches!(plan, Plan::Sm90W4(_)), "{plan:?}");
    let act: CudaSlice<u16> = g.stream().clone_htod(&bits).unwrap();
    let va = g.half_view(&act, ElemType::BF16, (m, k, 1)).unwrap();
    let vb = g.upload(&b).unwrap();
    assert_eq!(g.plan(&va, &vb).unwrap(), plan);
    let mut c = g.output(m, n, 1, OutType::Bf16).unwrap();
    g.gemm(&va, &vb, &mut c).unwrap();
    assert_bit_identical(&c.to_host().unwrap(), &want, "W4A16 over a bf16 view");
}

/// An engine's step over memory made once: quantize the activations (in the caller's buffer)
/// into their matrix (DeepSeek FP8 from bf16, per-tensor FP8 and NVFP4 with a given tensor
/// scale), then a GEMM, a GEMM with split K, a fused GEMM (bias + SiLU), an NVFP4 GEMM folded onto
/// FP8, a per-tensor FP8 GEMM, and a grouped GEMM whose groups live in the caller's memory.
struct Step {
    /// Over `input` (raw: declared first, so dropped before it).
    t: DeviceTensor<'static>,
    input: CudaSlice<u16>,
    a: DeviceMatrix<'static>,
    a_tensor: DeviceMatrix<'static>,
    a_nv: DeviceMatrix<'static>,
    b: DeviceMatrix<'static>,
    b_nv: DeviceMatrix<'static>,
    experts: DeviceMatrix<'static>,
    bias: DeviceTensor<'static>,
    outs: Vec<DeviceOutput<'static>>,
    split: Plan,
}

const STEP: (usize, usize, usize) = (256, 512, 1024);
const NV_SCALE: f32 = 1.0 / 64.0;

fn nv_opts() -> QuantizeOptions {
    QuantizeOptions {
        tensor_scale: Some(NV_SCALE),
        ..QuantizeOptions::default()
    }
}

fn bf16_bits(seed: u64) -> Vec<u16> {
    let (m, _, k) = STEP;
    random_values(seed, m * k, k)
        .iter()
        .map(|&x| bf16::from_f32(x).to_bits())
        .collect()
}

impl Step {
    /// The weights from `seed`, the activations from `input_seed`.
    fn new(g: &Gpu, seed: u64, input_seed: u64) -> Step {
        let (m, n, k) = STEP;
        let input = g.stream().clone_htod(&bf16_bits(input_seed)).unwrap();
        let ptr = {
            let (p, _g) = input.device_ptr(g.stream());
            p
        };
        // SAFETY: `input` lives in the same `Step`, dropped after `t`, and is written only on
        // `g`'s stream (`set_input`), in order with the work that reads it.
        let t = unsafe {
            g.tensor_from_raw(
                RawDevice {
                    ptr,
                    len: m * k * 2,
                },
                InputType::Bf16,
                (m, k, 1),
            )
        }
        .unwrap();
        let a = g.quantize(&t, Recipe::DeepSeekFp8.a()).unwrap();
        let a_tensor = g.quantize(&t, Recipe::Fp8PerTensor(Fp8::E4M3).a()).unwrap();
        let a_nv = g
            .quantize_with(&t, Recipe::Nvfp4.a(), &nv_opts())
            .unwrap()
            .matrix;
        let (_, b) = random_matrix(seed + 1, n, k, 1, Recipe::DeepSeekFp8.b());
        let (_, b_nv) = random_matrix(seed + 2, n, k, 1, Recipe::Nvfp4.b());
        let (_, experts) = random_matrix(seed + 3, n, k, 4, Recipe::DeepSeekFp8.b());
        let (b, b_nv, experts) = (
            g.upload(&b).unwrap(),
            g.upload(&b_nv).unwrap(),
            g.upload(&experts).unwrap(),
        );
        for w in [&b, &b_nv, &experts] {
            g.prepare_weights(w).unwrap();
        }
        let bias_v: Vec<f32> = random_values(seed + 4, n, n);
        let bias = g.upload_tensor(&bias_v, 1, n, 1).unwrap();
        let outs = (0..6)
            .map(|_| g.output(m, n, 1, OutType::Bf16).unwrap())
            .collect();
        let split = match g.plan(&a, &b).unwrap() {
            Plan::Sm90Fp8(cfg) => Plan::Sm90Fp8(cfg.with_split_k(2)),
            p => panic!("DeepSeek FP8 should run on the sm90 FP8 kernel, not {p:?}"),
        };
        Step {
            t,
            input,
            a,
            a_tensor,
            a_nv,
            b,
            b_nv,
            experts,
            bias,
            outs,
            split,
        }
    }

    /// New activations in the caller's buffer (on `g`'s stream).
    fn set_input(&mut self, g: &Gpu, bits: &[u16]) {
        g.stream().memcpy_htod(bits, &mut self.input).unwrap();
    }

    /// One step on `g`'s stream, the groups' ends in `groups` (caller memory).
    fn run(&mut self, g: &Gpu, groups: &CudaSlice<i32>) {
        let opts = QuantizeOptions::default();
        g.quantize_into(&self.t, &mut self.a, &opts).unwrap();
        g.quantize_into(&self.t, &mut self.a_tensor, &opts).unwrap();
        g.quantize_into(&self.t, &mut self.a_nv, &nv_opts())
            .unwrap();
        let [c0, c1, c2, c3, c4, c5] = &mut self.outs[..] else {
            unreachable!("six outputs")
        };
        g.gemm(&self.a, &self.b, c0).unwrap();
        g.gemm_with(&self.a, &self.b, c1, self.split).unwrap();
        let epi = Epilogue::new()
            .bias(&self.bias)
            .activation(Activation::Silu);
        g.gemm_fused(&self.a, &self.b, &epi, c2).unwrap();
        g.gemm(&self.a_nv, &self.b_nv, c3).unwrap();
        g.gemm(&self.a_tensor, &self.b, c4).unwrap();
        let groups = g
            .groups_view(GroupLayout::Contiguous, groups.slice(..))
            .unwrap();
        g.grouped_gemm(&self.a, &self.experts, &groups, c5).unwrap();
    }

    fn results(&self) -> Vec<HostOutput> {
        self.outs.iter().map(|c| c.to_host().unwrap()).collect()
    }
}

fn assert_same_results(got: &[HostOutput], want: &[HostOutput], what: &str) {
    let names = [
        "gemm",
        "split K",
        "fused",
        "NVFP4 folded",
        "per tensor",
        "grouped",
    ];
    for ((g, w), name) in got.iter().zip(want).zip(names) {
        // (The grouped output's rows past the last end stay poisoned: its ends cover every row.)
        assert_bit_identical(g, w, &format!("{what}: {name}"));
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_steady_state_loop_allocates_nothing_after_its_first_step() {
    let _serial = serial();
    let g = gpu();
    let mut step = Step::new(g, 40, 41);
    let groups = g.stream().clone_htod(&[64i32, 100, 200, 256]).unwrap();
    step.run(g, &groups);
    let first = step.results();
    let before = device_allocations();
    for _ in 0..3 {
        step.run(g, &groups);
    }
    let after = device_allocations();
    assert_eq!(
        after,
        before,
        "{} device allocations in three steady steps",
        after - before
    );
    assert_same_results(&step.results(), &first, "a repeated step");
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_step_captured_in_a_cuda_graph_replays_on_new_inputs() {
    let _serial = serial();
    // A context without cudarc's event tracking (as candle makes one): one stream orders it all.
    let ctx = CudaContext::new(0).unwrap();
    // SAFETY: every buffer of this test is used on the one stream of `g` alone.
    unsafe { ctx.disable_event_tracking() };
    let g = Gpu::from_context(ctx).unwrap();
    let groups = g.stream().clone_htod(&[64i32, 100, 200, 256]).unwrap();
    let mut step = Step::new(&g, 50, 51);
    step.run(&g, &groups); // the first step makes what it makes
    g.stream()
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    step.run(&g, &groups);
    let graph = g
        .stream()
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .unwrap()
        .expect("a captured graph");
    // New activations in the same buffer, then the graph: the same as an eager step on them.
    let fresh = bf16_bits(52);
    let mut eager = Step::new(&g, 50, 52);
    eager.run(&g, &groups);
    let want = eager.results();
    for c in &mut step.outs {
        c.poison().unwrap();
    }
    step.set_input(&g, &fresh);
    graph.launch().unwrap();
    assert_same_results(&step.results(), &want, "the graph's replay");
}

#[test]
#[ignore = "needs a CUDA device"]
fn two_threads_on_two_streams_get_what_one_thread_gets() {
    let _serial = serial();
    let g = gpu();
    let groups = g.stream().clone_htod(&[64i32, 100, 200, 256]).unwrap();
    let want: Vec<Vec<HostOutput>> = (0..2)
        .map(|i| {
            let mut s = Step::new(g, 60 + 10 * i, 61 + 10 * i);
            s.run(g, &groups);
            s.results()
        })
        .collect();
    let got: Vec<Vec<HostOutput>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|i| {
                let groups = &groups;
                scope.spawn(move || {
                    let h = g.with_stream(g.context().new_stream().unwrap()).unwrap();
                    let mut s = Step::new(&h, 60 + 10 * i, 61 + 10 * i);
                    for _ in 0..5 {
                        s.run(&h, groups);
                    }
                    s.results()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_same_results(g, w, &format!("thread {i}"));
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_gpu_dropped_while_its_kernels_run_leaves_their_results_whole() {
    let _serial = serial();
    let (m, n, k) = (2048, 4096, 16384);
    let recipe = Recipe::DeepSeekFp8;
    let (_, a) = random_matrix(70, m, k, 1, recipe.a());
    let (_, b) = random_matrix(71, n, k, 1, recipe.b());
    let (_, want) = owned_gemm(gpu(), &a, &b, OutType::Bf16);
    let local = Gpu::new(0).unwrap();
    let (da, db) = (local.upload(&a).unwrap(), local.upload(&b).unwrap());
    local.stream().synchronize().unwrap();
    let mut c = local.output(m, n, 1, OutType::Bf16).unwrap();
    for _ in 0..4 {
        local.gemm(&da, &db, &mut c).unwrap();
    }
    drop(local); // its module goes while four GEMMs are queued
    assert_bit_identical(&c.to_host().unwrap(), &want, "after the Gpu was dropped");
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_stream_of_another_cudarc_handle_of_the_same_context_is_accepted() {
    let _serial = serial();
    let g = gpu();
    // The primary context again (another cudarc handle of it): the same GPU, accepted.
    let same = CudaContext::new(0).unwrap();
    assert!(g.with_stream(same.new_stream().unwrap()).is_ok());
}

#[test]
#[ignore = "needs a CUDA device"]
fn one_call_description_plans_and_runs_every_kind_and_refuses_what_none_runs() {
    let _serial = serial();
    let g = gpu();
    let (m, n, k) = (256, 256, 512);
    let recipe = Recipe::DeepSeekFp8;
    let (_, a) = random_matrix(80, m, k, 1, recipe.a());
    let (_, b) = random_matrix(81, n, k, 1, recipe.b());
    let (_, experts) = random_matrix(82, n, k, 2, recipe.b());
    let (da, db, de) = (
        g.upload(&a).unwrap(),
        g.upload(&b).unwrap(),
        g.upload(&experts).unwrap(),
    );
    let bias_v = random_values(83, n, n);
    let bias = g.upload_tensor(&bias_v, 1, n, 1).unwrap();
    let epi = Epilogue::new().bias(&bias).activation(Activation::Relu);
    let groups = g.group_ends(&[100, 256]).unwrap();
    let sparse = blockscaled::BsrMatrix::from_dense_blocks(&b, |r, c| (r + c) % 2 == 0).unwrap();
    let sparse = g.upload_bsr(&sparse).unwrap();

    // Each kind: the call and the per-kind method give the same plan and the same bits.
    let run = |call: Call<'_>| {
        let mut c = g.output(m, n, 1, OutType::Bf16).unwrap();
        g.run(&call, &mut c).unwrap();
        (g.plan_call(&call).unwrap(), c.to_host().unwrap())
    };
    let by_method = |f: &dyn Fn(&mut DeviceOutput<'static>)| {
        let mut c = g.output(m, n, 1, OutType::Bf16).unwrap();
        f(&mut c);
        c.to_host().unwrap()
    };
    let (p, got) = run(Call::new(&da, &db));
    assert_eq!(p, g.plan(&da, &db).unwrap());
    let want = by_method(&|c| g.gemm(&da, &db, c).unwrap());
    assert_bit_identical(&got, &want, "dense");
    let (p, got) = run(Call::new(&da, &db).epilogue(&epi));
    assert_eq!(p, g.fused_plan(&da, &db, &epi, None).unwrap());
    let want = by_method(&|c| g.gemm_fused(&da, &db, &epi, c).unwrap());
    assert_bit_identical(&got, &want, "fused");
    let (p, got) = run(Call::new(&da, &de).groups(&groups));
    assert_eq!(p, g.grouped_plan(&da, &de, &groups).unwrap());
    let want = by_method(&|c| g.grouped_gemm(&da, &de, &groups, c).unwrap());
    assert_bit_identical(&got, &want, "grouped");
    let (p, got) = run(Call::sparse(&da, &sparse, blockscaled::SparseSide::B));
    assert_eq!(p, g.bsr_plan(&da, &sparse).unwrap());
    let want = by_method(&|c| {
        g.bsr_gemm(&da, &sparse, blockscaled::SparseSide::B, c)
            .unwrap()
    });
    assert_bit_identical(&got, &want, "block-sparse");

    // What no kernel runs: a typed error before any launch.
    let mut c = g.output(m, n, 1, OutType::Bf16).unwrap();
    for (call, what) in [
        (
            Call::new(&da, &de).groups(&groups).epilogue(&epi),
            "groups + epilogue",
        ),
        (
            Call::sparse(&da, &sparse, blockscaled::SparseSide::B).epilogue(&epi),
            "block-sparse + epilogue",
        ),
        (
            Call::sparse(&da, &sparse, blockscaled::SparseSide::B).groups(&groups),
            "block-sparse + groups",
        ),
    ] {
        let r = g.run(&call, &mut c);
        assert!(matches!(r, Err(Error::Config(_))), "{what}: {r:?}");
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_bf16_view_made_every_step_matches_the_owned_matrix() {
    let _serial = serial();
    let g = gpu();
    // W4A16: an engine's bf16 activations, viewed afresh each step (a framework's tensor moves
    // from step to step), times prepared MXFP4 weights; the views share the GPU's unit scales.
    let (m, n, k) = (16, 256, 512);
    let recipe = Recipe::W4A16(Fp4Weights::Mxfp4);
    let (_, w) = random_matrix(81, n, k, 1, recipe.b());
    let w = g.upload(&w).unwrap();
    g.prepare_weights(&w).unwrap();
    let bits: Vec<u16> = random_values(82, m * k, k)
        .iter()
        .map(|&x| bf16::from_f32(x).to_bits())
        .collect();
    let x: CudaSlice<u16> = g.stream().clone_htod(&bits).unwrap();
    // The owned path: the same bf16 values with an explicit scale of 1.
    let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    let layout = ScaleLayout::packed(ScaleMajor::K, 1, 1);
    let one = 1f32.to_le_bytes().to_vec();
    let owned = ScaledMatrix::from_parts(recipe.a(), m, k, 1, bytes, one, layout, 1.0).unwrap();
    let owned = g.upload(&owned).unwrap();
    let mut c = g.output(m, n, 1, OutType::Bf16).unwrap();
    g.gemm(&owned, &w, &mut c).unwrap();
    let want = c.to_host().unwrap();
    for step in 0..3 {
        c.poison().unwrap();
        let a = g.half_view(&x, ElemType::BF16, (m, k, 1)).unwrap();
        g.gemm(&a, &w, &mut c).unwrap();
        let what = format!("step {step}: a bf16 view against the owned matrix");
        assert_bit_identical(&c.to_host().unwrap(), &want, &what);
    }
}

/// Runs `call` (C of `rows` × `n`) in the handle's workspace, then in a new workspace reserved
/// for it: the reserve is the size queried, which `expected` accepts, the run in it allocates
/// nothing, and its result is bit-identical.
fn reserved_call_allocates_nothing(
    g: &Gpu,
    name: &str,
    call: &Call,
    (rows, n): (usize, usize),
    expected: impl Fn(&WorkspaceSize) -> bool,
) {
    let mut want = g.output(rows, n, 1, OutType::Bf16).unwrap();
    g.run(call, &mut want).unwrap(); // (in the handle's workspace)
    let ws = Workspace::new();
    let need = g.workspace_size(call, None).unwrap();
    assert!(expected(&need), "{name}: {need:?}");
    g.reserve(&ws, call, None).unwrap();
    assert_eq!(
        ws.bytes(),
        need.total(),
        "{name}: reserved against queried ({need:?})"
    );
    let mut got = g.output(rows, n, 1, OutType::Bf16).unwrap();
    let before = device_allocations();
    g.run(&call.workspace(&ws), &mut got).unwrap();
    assert_eq!(
        device_allocations(),
        before,
        "{name}: allocated in a reserved workspace"
    );
    assert_bit_identical(
        &got.to_host().unwrap(),
        &want.to_host().unwrap(),
        &format!("{name}: the call's workspace against the handle's"),
    );
    println!("{name}: {need:?}");
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_reserved_workspace_is_the_size_queried_and_a_call_in_it_allocates_nothing() {
    let _serial = serial();
    let g = gpu();
    let step = Step::new(g, 90, 91);
    let (m, n, k) = STEP;
    let groups = g.stream().clone_htod(&[64i32, 100, 200, 256]).unwrap();
    let groups = g
        .groups_view(GroupLayout::Contiguous, groups.slice(..))
        .unwrap();
    let epi = Epilogue::new()
        .bias(&step.bias)
        .activation(Activation::Silu);
    // MXFP8 (e5m2: no fused FP8 kernel to fold to) with a fused epilogue: the MX kernel, which
    // stages its rows in the workspace.
    let mx = Recipe::Mxfp8(Fp8::E5M2);
    let a_mx = g.quantize(&step.t, mx.a()).unwrap();
    let (_, b_mx) = random_matrix(92, n, k, 1, mx.b());
    let b_mx = g.upload(&b_mx).unwrap();
    g.prepare_weights(&b_mx).unwrap();
    type Expect = fn(&WorkspaceSize) -> bool;
    let calls: [(&str, Call, Expect); 6] = [
        ("plain", Call::new(&step.a, &step.b), |_| true),
        (
            "split K",
            Call::new(&step.a, &step.b).with_plan(step.split),
            |w| w.split_k > 0,
        ),
        (
            "fused FP8",
            Call::new(&step.a, &step.b).epilogue(&epi),
            |_| true,
        ),
        ("NVFP4 folded", Call::new(&step.a_nv, &step.b_nv), |w| {
            w.fold > 0
        }),
        (
            "grouped",
            Call::new(&step.a, &step.experts).groups(&groups),
            |_| true,
        ),
        ("fused MXFP8", Call::new(&a_mx, &b_mx).epilogue(&epi), |w| {
            w.staging > 0
        }),
    ];
    for (name, call, expected) in calls {
        reserved_call_allocates_nothing(g, name, &call, (m, n), expected);
    }
    // MXFP4 at 100 rows: A folded per call onto the 4-bit-weights kernel's FP8 MMAs, the weights
    // as they are: the workspace holds A's fold (M·K codes and their scales), not B's.
    let r4 = Recipe::Mxfp4;
    let (_, a4) = random_matrix(93, 100, k, 1, r4.a());
    let (_, b4) = random_matrix(94, n, k, 1, r4.b());
    let (a4, b4) = (g.upload(&a4).unwrap(), g.upload(&b4).unwrap());
    let plan = g.plan(&a4, &b4).unwrap();
    assert!(matches!(plan, Plan::Sm90W4(c) if c.fp8), "{plan:?}");
    let fold = |w: &WorkspaceSize| w.fold >= 100 * k && w.fold < 100 * k + n * k;
    reserved_call_allocates_nothing(g, "A folded", &Call::new(&a4, &b4), (100, n), fold);
    // A quantized output (FP8 codes with scales per 1×128) from the MX kernel's fused epilogue.
    let q = Recipe::DeepSeekFp8.a();
    let call = Call::new(&a_mx, &b_mx).epilogue(&epi);
    let opts = QuantizeOptions::default();
    let mut want = g.run_quantized_new(&call, q, &opts).unwrap();
    let mut got = g.run_quantized_new(&call, q, &opts).unwrap();
    g.run_quantized(&call, &mut want).unwrap();
    let ws = Workspace::new();
    let need = g.workspace_size(&call, Some(q)).unwrap();
    assert!(need.staging > 0, "quantized: {need:?}");
    g.reserve(&ws, &call, Some(q)).unwrap();
    assert_eq!(ws.bytes(), need.total(), "quantized: {need:?}");
    let before = device_allocations();
    g.run_quantized(&call.workspace(&ws), &mut got).unwrap();
    assert_eq!(
        device_allocations(),
        before,
        "quantized: allocated in a reserved workspace"
    );
    let (got, want) = (got.to_host().unwrap(), want.to_host().unwrap());
    assert_eq!(got.data(), want.data(), "quantized codes");
    assert_eq!(got.scales(), want.scales(), "quantized scales");
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_block_sparse_call_in_a_reserved_workspace_allocates_nothing() {
    let _serial = serial();
    let g = gpu();
    // One block row holds every block, the others one or none: with one M tile the long run is
    // cut into parts that meet in split K's workspace.
    let recipe = Recipe::DeepSeekFp8;
    let (_, dense) = random_matrix(95, 128, 2048, 1, recipe.a());
    let (_, full) = random_matrix(96, 512, 2048, 1, recipe.b());
    let sparse = BsrMatrix::from_dense_blocks(&full, |br, bc| br == 2 || (br == 0 && bc == 3))
        .expect("valid BSR");
    let (dd, ds) = (g.upload(&dense).unwrap(), g.upload_bsr(&sparse).unwrap());
    // (128-row tiles, 132 CTAs, runs cut into at most 16 parts.)
    let cfg = Sm90Config::new(Sm90Tile::M128, ClusterShape::ONE, 1, 132, 16);
    let plan = Plan::Sm90Fp8(cfg);
    let call = Call::sparse(&dd, &ds, SparseSide::B).with_plan(plan);
    let mut want = g.output(128, 512, 1, OutType::F32).unwrap();
    g.run(&call, &mut want).unwrap();
    let need = g.workspace_size(&call, None).unwrap();
    assert!(need.split_k > 0, "{need:?}");
    let ws = Workspace::new();
    g.reserve(&ws, &call, None).unwrap();
    assert_eq!(ws.bytes(), need.total(), "{need:?}");
    let mut got = g.output(128, 512, 1, OutType::F32).unwrap();
    let before = device_allocations();
    g.run(&call.workspace(&ws), &mut got).unwrap();
    assert_eq!(
        device_allocations(),
        before,
        "allocated in a reserved workspace"
    );
    let (got, want) = (got.to_host().unwrap(), want.to_host().unwrap());
    assert_bit_identical(&got, &want, "the call's workspace against the handle's");
}

#[test]
#[ignore = "needs a CUDA device"]
fn groups_by_address_are_the_groups_of_a_view_and_bad_addresses_are_refused() {
    // A framework's int32 tensor (torch's `offs`) by address: the same grouped GEMM, bit for bit,
    // as over a view of the same values; addresses that cannot be int32 values are errors.
    let _serial = serial();
    let g = gpu();
    let step = Step::new(g, 93, 94);
    let (m, n, _) = STEP;
    let ends: CudaSlice<i32> = g.stream().clone_htod(&[64i32, 100, 200, 256]).unwrap();
    let view = g
        .groups_view(GroupLayout::Contiguous, ends.slice(..))
        .unwrap();
    let mut want = g.output(m, n, 1, OutType::Bf16).unwrap();
    g.grouped_gemm(&step.a, &step.experts, &view, &mut want)
        .unwrap();
    let ptr = {
        let (p, _sync) = ends.device_ptr(g.stream());
        p
    };
    // SAFETY: `ends` holds 16 bytes of this GPU's memory and outlives the calls below (the
    // results are read back, so the work has finished, before it drops).
    let groups =
        unsafe { g.groups_from_raw(GroupLayout::Contiguous, RawDevice { ptr, len: 16 }) }.unwrap();
    assert!(groups.values().is_none(), "the caller's memory by address");
    assert_eq!(groups.count(), 4);
    let mut got = g.output(m, n, 1, OutType::Bf16).unwrap();
    got.poison().unwrap();
    g.grouped_gemm(&step.a, &step.experts, &groups, &mut got)
        .unwrap();
    assert_bit_identical(
        &got.to_host().unwrap(),
        &want.to_host().unwrap(),
        "groups by address against the same groups in a view",
    );
    let bad = [
        ("6 bytes", RawDevice { ptr, len: 6 }),
        ("no bytes", RawDevice { ptr, len: 0 }),
        (
            "2 bytes off",
            RawDevice {
                ptr: ptr + 2,
                len: 8,
            },
        ),
        ("null", RawDevice { ptr: 0, len: 4 }),
    ];
    for (what, buf) in bad {
        // SAFETY: refused before any use (the test's point); `ends` is live.
        match unsafe { g.groups_from_raw(GroupLayout::Masked, buf) } {
            Err(Error::Shape(_) | Error::Alignment(_)) => {}
            other => panic!("{what}: {other:?}"),
        }
    }
}
