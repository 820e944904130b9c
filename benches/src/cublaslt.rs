//! cuBLASLt peers for the benchmark table.
//!
//! # Conventions
//!
//! Our library's operands: A is M×K row-major (K contiguous), B is N×K
//! row-major (K contiguous), C = A·Bᵀ is M×N row-major, all with dense
//! leading dimensions (K, K, N).
//!
//! cuBLASLt is column-major, so every call computes Cᵀ (N×M column-major,
//! which is the same memory as C M×N row-major) as
//!
//! ```text
//!   D(N×M, ld=N) = op(Lt-A) · op(Lt-B)
//!   Lt-A := our B, stored K×N col-major, ld=K, transa = T  -> op(Lt-A) is N×K
//!   Lt-B := our A, stored K×M col-major, ld=K, transb = N  -> op(Lt-B) is K×M
//!   m_lt = N, n_lt = M, k_lt = K
//! ```
//!
//! This is the "TN" form that FP8 matmuls on Hopper require. Because A and B
//! swap places, every per-operand cuBLASLt attribute is swapped too: our B's
//! scale goes to `CUBLASLT_MATMUL_DESC_A_SCALE_*`, our A's scale to
//! `CUBLASLT_MATMUL_DESC_B_SCALE_*`.
//!
//! bf16 is passed as raw `u16` bit patterns and e4m3 as raw `u8` bytes (no
//! cudarc `f16` feature needed). All calls use fp32 compute
//! (`CUBLAS_COMPUTE_32F`), fp32 alpha = 1, beta = 0, and the default
//! (non-fast) FP8 accumulation mode.

use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::size_of;
use std::sync::{Arc, Mutex};

use cudarc::cublaslt::sys;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DriverError};

use sys::cublasLtMatmulDescAttributes_t as Attr;
use sys::cublasLtMatmulMatrixScale_t as ScaleMode;
use sys::cublasStatus_t as Status;
use sys::cudaDataType as Dt;

/// Workspace handed to cuBLASLt (NVIDIA's recommendation for Hopper).
pub const WORKSPACE_BYTES: usize = 32 << 20;

/// First cuBLASLt version (`cublasLtGetVersion`) with the VEC128_32F /
/// BLK128x128_32F scale modes (CUDA 12.9).
pub const BLOCKWISE_MIN_VERSION: usize = 120_900;

/// Which peer GEMM a plan is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GemmKind {
    Bf16,
    F16,
    Fp8PerTensor,
    Fp8Blockwise,
}

/// Errors of the cuBLASLt peer. [`PeerError::is_unavailable`] tells "this
/// cuBLASLt cannot do it" (print n/a) apart from real failures.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("libcublasLt could not be loaded (is its directory in LD_LIBRARY_PATH?)")]
    LibraryMissing,
    #[error("CUDA driver error: {0}")]
    Driver(#[from] DriverError),
    #[error("{call} failed with {status:?}")]
    Cublas { call: &'static str, status: Status },
    #[error("cuBLASLt {version} does not support {what}")]
    Unsupported { what: &'static str, version: usize },
    #[error("cuBLASLt {version} has no algorithm for {kind:?} m={m} n={n} k={k} ({status:?})")]
    NoAlgorithm {
        kind: GemmKind,
        m: usize,
        n: usize,
        k: usize,
        version: usize,
        status: Status,
    },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl PeerError {
    /// True when the library simply cannot run this problem (missing library,
    /// missing scale mode, no algorithm for the shape): report "n/a".
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            PeerError::LibraryMissing
                | PeerError::Unsupported { .. }
                | PeerError::NoAlgorithm { .. }
        )
    }
}

pub type Result<T, E = PeerError> = std::result::Result<T, E>;

fn check(call: &'static str, status: Status) -> Result<()> {
    match status {
        Status::CUBLAS_STATUS_SUCCESS => Ok(()),
        status => Err(PeerError::Cublas { call, status }),
    }
}

/// Number of 128-wide blocks covering `x`.
pub fn blocks128(x: usize) -> usize {
    x.div_ceil(128)
}

/// Layout of our A's 1×128 scales for [`LtPeer::gemm_fp8_blockwise`]
/// (cuBLASLt `VEC128_32F` on its B operand): `ceil(K/128)` groups of `M`
/// floats; the scale of `A[m][kb*128 .. kb*128+128]` is at `kb*M + m`
/// (M index contiguous, "M-major"). Returns the index.
pub fn vec128_index(m_idx: usize, kb: usize, m: usize) -> usize {
    kb * m + m_idx
}

/// Number of floats of our A's 1×128 scale tensor: `ceil(K/128) * M`.
pub fn vec128_len(m: usize, k: usize) -> usize {
    blocks128(k) * m
}

/// Row pitch of our B's 128×128 scale tensor: `ceil(K/128)` rounded up to a
/// multiple of 4 (cuBLASLt pads the K-block dimension of BLK128x128 scales).
pub fn blk128_ld(k: usize) -> usize {
    blocks128(k).next_multiple_of(4)
}

/// Layout of our B's 128×128 scales for [`LtPeer::gemm_fp8_blockwise`]
/// (cuBLASLt `BLK128x128_32F` on its A operand): `ceil(N/128)` rows of
/// [`blk128_ld`]`(K)` floats, K-block index contiguous; the scale of
/// `B[nb*128.., kb*128..]` is at `nb*blk128_ld(K) + kb`. Padding entries
/// (`kb >= ceil(K/128)`) are never read for their value. Returns the index.
pub fn blk128_index(nb: usize, kb: usize, k: usize) -> usize {
    nb * blk128_ld(k) + kb
}

/// Number of floats of our B's 128×128 scale tensor:
/// `ceil(N/128) * blk128_ld(K)`.
pub fn blk128_len(n: usize, k: usize) -> usize {
    blocks128(n) * blk128_ld(k)
}

/// Owned cuBLASLt descriptors plus the algorithm chosen for them.
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

// SAFETY: the descriptors are host-side heap objects owned exclusively by the
// Plan; cuBLASLt does not tie them to a thread. Plans live inside LtPeer's
// mutex, so they are never used from two threads at once.
unsafe impl Send for Plan {}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each pointer was created by the matching *Create call (or is
        // null, which the destroy functions accept) and is destroyed once.
        unsafe {
            let _ = sys::cublasLtMatrixLayoutDestroy(self.d);
            let _ = sys::cublasLtMatrixLayoutDestroy(self.b);
            let _ = sys::cublasLtMatrixLayoutDestroy(self.a);
            let _ = sys::cublasLtMatmulDescDestroy(self.desc);
        }
    }
}

struct Inner {
    workspace: CudaSlice<u8>,
    plans: HashMap<(GemmKind, usize, usize, usize), Plan>,
}

/// cuBLASLt handle + 32 MiB workspace bound to one stream, with a per-shape
/// cache of descriptors and heuristic-chosen algorithms (so timing loops do
/// not re-query the heuristic).
pub struct LtPeer {
    stream: Arc<CudaStream>,
    handle: sys::cublasLtHandle_t,
    version: usize,
    inner: Mutex<Inner>,
}

// SAFETY: the handle is only used in `new`, `drop` and inside `gemm`, which
// holds `inner`'s lock for the whole call, so no two threads use the handle or
// a plan concurrently. cuBLASLt handles are not bound to a host thread.
unsafe impl Send for LtPeer {}
unsafe impl Sync for LtPeer {}

impl Drop for LtPeer {
    fn drop(&mut self) {
        // Descriptors first, then the handle (plans do not reference it, but
        // keep the natural order). The workspace is freed by CudaSlice's drop
        // after the stream has been synchronised here, so no matmul that uses
        // it is still in flight.
        let _ = self.stream.synchronize();
        if let Ok(mut inner) = self.inner.lock() {
            inner.plans.clear();
        }
        let _ = self.stream.context().bind_to_thread();
        // SAFETY: handle came from cublasLtCreate and is destroyed once.
        unsafe {
            let _ = sys::cublasLtDestroy(self.handle);
        }
    }
}

fn dims_i64(x: usize, what: &str) -> Result<i64> {
    i64::try_from(x).map_err(|_| PeerError::InvalidArgument(format!("{what}={x} too large")))
}

fn need(len: usize, want: usize, what: &str) -> Result<()> {
    if len < want {
        return Err(PeerError::InvalidArgument(format!(
            "{what} has {len} elements, needs at least {want}"
        )));
    }
    Ok(())
}

/// Sets a descriptor attribute from a plain value.
///
/// SAFETY (caller): `desc` is a live matmul descriptor and `T` is the type
/// cuBLASLt documents for `attr` (int32 for TRANSA/TRANSB/scale modes, a
/// device pointer for the scale pointers).
unsafe fn set_attr<T>(desc: sys::cublasLtMatmulDesc_t, attr: Attr, value: &T) -> Status {
    unsafe {
        sys::cublasLtMatmulDescSetAttribute(
            desc,
            attr,
            value as *const T as *const c_void,
            size_of::<T>(),
        )
    }
}

/// Sets (Lt A, Lt B) scale pointers on a descriptor.
///
/// SAFETY (caller): `desc` is a live matmul descriptor; the pointers refer to
/// device buffers that stay alive until every matmul using `desc` with them
/// has completed.
unsafe fn set_scale_ptrs(
    desc: sys::cublasLtMatmulDesc_t,
    (lt_a, lt_b): (CUdeviceptr, CUdeviceptr),
) -> Result<()> {
    unsafe {
        check(
            "cublasLtMatmulDescSetAttribute(A_SCALE_POINTER)",
            set_attr(desc, Attr::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &lt_a),
        )?;
        check(
            "cublasLtMatmulDescSetAttribute(B_SCALE_POINTER)",
            set_attr(desc, Attr::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &lt_b),
        )
    }
}

impl LtPeer {
    /// Creates a handle and a 32 MiB workspace on `stream`.
    pub fn new(stream: Arc<CudaStream>) -> Result<Self> {
        // SAFETY: only tries to dlopen the library; no other effect.
        if !unsafe { sys::is_culib_present() } {
            return Err(PeerError::LibraryMissing);
        }
        stream.context().bind_to_thread()?;
        let workspace = stream.alloc_zeros::<u8>(WORKSPACE_BYTES)?;
        let mut handle: sys::cublasLtHandle_t = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer; the CUDA context is current.
        check("cublasLtCreate", unsafe {
            sys::cublasLtCreate(&mut handle)
        })?;
        // SAFETY: no preconditions.
        let version = unsafe { sys::cublasLtGetVersion() };
        Ok(LtPeer {
            stream,
            handle,
            version,
            inner: Mutex::new(Inner {
                workspace,
                plans: HashMap::new(),
            }),
        })
    }

    /// `cublasLtGetVersion()`, e.g. 130000 for 13.0.0.
    pub fn version(&self) -> usize {
        self.version
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Whether this cuBLASLt is new enough to know the blockwise scale modes
    /// (the GPU may still have no kernel for them: see `NoAlgorithm`).
    pub fn has_blockwise_modes(&self) -> bool {
        self.version >= BLOCKWISE_MIN_VERSION
    }

    /// C (M×N row-major bf16) = A (M×K row-major bf16) · Bᵀ (B: N×K row-major
    /// bf16). Buffers hold bf16 bit patterns. fp32 accumulation.
    pub fn gemm_bf16(
        &self,
        m: usize,
        n: usize,
        k: usize,
        a: &CudaSlice<u16>,
        b: &CudaSlice<u16>,
        c: &mut CudaSlice<u16>,
    ) -> Result<()> {
        self.gemm_16bit(GemmKind::Bf16, (m, n, k), a, b, c)
    }

    /// As [`gemm_bf16`](Self::gemm_bf16) with fp16 A, B and C (fp16 bit patterns; fp32
    /// accumulation).
    pub fn gemm_f16(
        &self,
        m: usize,
        n: usize,
        k: usize,
        a: &CudaSlice<u16>,
        b: &CudaSlice<u16>,
        c: &mut CudaSlice<u16>,
    ) -> Result<()> {
        self.gemm_16bit(GemmKind::F16, (m, n, k), a, b, c)
    }

    /// The 16-bit GEMMs after checking the buffers' lengths.
    fn gemm_16bit(
        &self,
        kind: GemmKind,
        (m, n, k): (usize, usize, usize),
        a: &CudaSlice<u16>,
        b: &CudaSlice<u16>,
        c: &mut CudaSlice<u16>,
    ) -> Result<()> {
        need(a.len(), m * k, "A")?;
        need(b.len(), n * k, "B")?;
        need(c.len(), m * n, "C")?;
        self.gemm(kind, m, n, k, a, b, c, None)
    }

    /// FP8 with per-tensor scales: C (M×N row-major bf16) =
    /// `sa * sb * A · Bᵀ`, A M×K row-major e4m3, B N×K row-major e4m3,
    /// `a_scale` / `b_scale` device buffers whose element 0 is the fp32 scale
    /// of A / B (cuBLASLt `SCALAR_32F`, set through
    /// `CUBLASLT_MATMUL_DESC_{B,A}_SCALE_POINTER` respectively, see the module
    /// doc for the swap). Requires K and N to be multiples of 16.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_fp8_per_tensor(
        &self,
        m: usize,
        n: usize,
        k: usize,
        a: &CudaSlice<u8>,
        a_scale: &CudaSlice<f32>,
        b: &CudaSlice<u8>,
        b_scale: &CudaSlice<f32>,
        c: &mut CudaSlice<u16>,
    ) -> Result<()> {
        need(a.len(), m * k, "A")?;
        need(b.len(), n * k, "B")?;
        need(c.len(), m * n, "C")?;
        need(a_scale.len(), 1, "A scale")?;
        need(b_scale.len(), 1, "B scale")?;
        self.gemm(
            GemmKind::Fp8PerTensor,
            m,
            n,
            k,
            a,
            b,
            c,
            Some((a_scale, b_scale)),
        )
    }

    /// FP8 with DeepSeek-style block scales: C (M×N row-major bf16) where
    /// `C[m][n] = Σ_k A[m][k]·sa[m][k/128] · B[n][k]·sb[n/128][k/128]`.
    ///
    /// * `a`: M×K row-major e4m3. `a_scales`: 1×128 scales of A (cuBLASLt
    ///   `VEC128_32F`, on its B operand). Shape ceil(K/128) × M with the **M
    ///   index contiguous**: scale of `A[m][kb*128..]` at `kb*M + m`
    ///   ([`vec128_index`]); length ≥ [`vec128_len`]`(M, K)`.
    /// * `b`: N×K row-major e4m3. `b_scales`: 128×128 scales of B (cuBLASLt
    ///   `BLK128x128_32F`, on its A operand). Shape ceil(N/128) × ld with the
    ///   **K-block index contiguous** and ld = ceil(K/128) rounded up to a
    ///   multiple of 4: scale of block (nb, kb) at `nb*ld + kb`
    ///   ([`blk128_index`]); length ≥ [`blk128_len`]`(N, K)`.
    ///
    /// Sources for these layouts: NVIDIA CUDALibrarySamples
    /// `cuBLASLt/LtBlk128x128Fp8Matmul` (TN call, scale sizes in `helpers.h`:
    /// VEC128 = ceil(inner/128)·outer, BLK128x128 =
    /// roundup(ceil(inner/128), 4)·ceil(outer/128), inner = K) and PyTorch
    /// `ScaledBlas.cpp` (`is_blockwise_1x128_scaling`: scale (rows, K/128)
    /// with strides (1, rows); `is_blockwise_128x128_scaling`: scale
    /// (rows/128, K/128) with strides (roundup(K/128, 4), 1)), which drives
    /// cuBLASLt with the same operand swap as here (weights 128×128 on Lt A,
    /// activations 1×128 on Lt B). Verified numerically only by
    /// `tests/peer_gpu.rs`: passes on an H100 with
    /// cuBLASLt 13.1 (`cublasLtGetVersion() = 130100`), including ragged M/N
    /// and a padded K-block pitch.
    ///
    /// Returns [`PeerError::Unsupported`] if this cuBLASLt predates the modes
    /// and [`PeerError::NoAlgorithm`] if the GPU/shape has no kernel
    /// (e.g. not Hopper).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_fp8_blockwise(
        &self,
        m: usize,
        n: usize,
        k: usize,
        a: &CudaSlice<u8>,
        a_scales: &CudaSlice<f32>,
        b: &CudaSlice<u8>,
        b_scales: &CudaSlice<f32>,
        c: &mut CudaSlice<u16>,
    ) -> Result<()> {
        need(a.len(), m * k, "A")?;
        need(b.len(), n * k, "B")?;
        need(c.len(), m * n, "C")?;
        need(a_scales.len(), vec128_len(m, k), "A scales (VEC128)")?;
        need(b_scales.len(), blk128_len(n, k), "B scales (BLK128x128)")?;
        if !self.has_blockwise_modes() {
            return Err(PeerError::Unsupported {
                what: "blockwise FP8 scale modes (needs >= 12.9)",
                version: self.version,
            });
        }
        self.gemm(
            GemmKind::Fp8Blockwise,
            m,
            n,
            k,
            a,
            b,
            c,
            Some((a_scales, b_scales)),
        )
    }

    /// Builds descriptors and queries the heuristic for one problem.
    ///
    /// `lt_scales` = (Lt A scale pointer, Lt B scale pointer) are set before
    /// the heuristic query: cuBLASLt validates them for block scale modes.
    fn make_plan(
        &self,
        kind: GemmKind,
        m: usize,
        n: usize,
        k: usize,
        lt_scales: Option<(CUdeviceptr, CUdeviceptr)>,
    ) -> Result<Plan> {
        dims_i64(m, "m")?;
        let (ni, ki) = (dims_i64(n, "n")?, dims_i64(k, "k")?);
        let (ab_type, cd_type) = match kind {
            GemmKind::Bf16 => (Dt::CUDA_R_16BF, Dt::CUDA_R_16BF),
            GemmKind::F16 => (Dt::CUDA_R_16F, Dt::CUDA_R_16F),
            GemmKind::Fp8PerTensor | GemmKind::Fp8Blockwise => {
                (Dt::CUDA_R_8F_E4M3, Dt::CUDA_R_16BF)
            }
        };
        // Plan's Drop destroys whatever was created if a step below fails.
        let mut p = Plan {
            desc: std::ptr::null_mut(),
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
            // SAFETY: cublasLtMatmulAlgo_t is plain data (an array of u64).
            algo: unsafe { std::mem::zeroed() },
        };
        // SAFETY: every out-pointer is a valid field of `p`; objects created
        // here are destroyed by Plan's Drop if a later step fails.
        unsafe {
            check(
                "cublasLtMatmulDescCreate",
                sys::cublasLtMatmulDescCreate(
                    &mut p.desc,
                    sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    Dt::CUDA_R_32F,
                ),
            )?;
            let op_t: i32 = 1; // CUBLAS_OP_T
            let op_n: i32 = 0; // CUBLAS_OP_N
            check(
                "cublasLtMatmulDescSetAttribute(TRANSA)",
                set_attr(p.desc, Attr::CUBLASLT_MATMUL_DESC_TRANSA, &op_t),
            )?;
            check(
                "cublasLtMatmulDescSetAttribute(TRANSB)",
                set_attr(p.desc, Attr::CUBLASLT_MATMUL_DESC_TRANSB, &op_n),
            )?;
            if kind == GemmKind::Fp8Blockwise {
                // Lt A = our B (weights, 128x128); Lt B = our A (1x128).
                let a_mode = ScaleMode::CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F as i32;
                let b_mode = ScaleMode::CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F as i32;
                let sa = set_attr(p.desc, Attr::CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode);
                let sb = set_attr(p.desc, Attr::CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode);
                if sa != Status::CUBLAS_STATUS_SUCCESS || sb != Status::CUBLAS_STATUS_SUCCESS {
                    return Err(PeerError::Unsupported {
                        what: "VEC128_32F / BLK128x128_32F scale modes",
                        version: self.version,
                    });
                }
            }
            if let Some(ptrs) = lt_scales {
                set_scale_ptrs(p.desc, ptrs)?;
            }
            // Lt A: K x N col-major (our B), Lt B: K x M col-major (our A),
            // D: N x M col-major (our C). u64 casts: dims are < i64::MAX.
            check(
                "cublasLtMatrixLayoutCreate(A)",
                sys::cublasLtMatrixLayoutCreate(&mut p.a, ab_type, k as u64, n as u64, ki),
            )?;
            check(
                "cublasLtMatrixLayoutCreate(B)",
                sys::cublasLtMatrixLayoutCreate(&mut p.b, ab_type, k as u64, m as u64, ki),
            )?;
            check(
                "cublasLtMatrixLayoutCreate(D)",
                sys::cublasLtMatrixLayoutCreate(&mut p.d, cd_type, n as u64, m as u64, ni),
            )?;

            let mut pref: sys::cublasLtMatmulPreference_t = std::ptr::null_mut();
            check(
                "cublasLtMatmulPreferenceCreate",
                sys::cublasLtMatmulPreferenceCreate(&mut pref),
            )?;
            let ws: u64 = WORKSPACE_BYTES as u64;
            let st = sys::cublasLtMatmulPreferenceSetAttribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const u64 as *const c_void,
                size_of::<u64>(),
            );
            if st != Status::CUBLAS_STATUS_SUCCESS {
                let _ = sys::cublasLtMatmulPreferenceDestroy(pref);
                return Err(PeerError::Cublas {
                    call: "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)",
                    status: st,
                });
            }
            let mut result: sys::cublasLtMatmulHeuristicResult_t = std::mem::zeroed();
            let mut count: i32 = 0;
            // C and D share one layout (C is not read: beta = 0).
            let st = sys::cublasLtMatmulAlgoGetHeuristic(
                self.handle,
                p.desc,
                p.a,
                p.b,
                p.d,
                p.d,
                pref,
                1,
                &mut result,
                &mut count,
            );
            let _ = sys::cublasLtMatmulPreferenceDestroy(pref);
            let no_algo = |status| PeerError::NoAlgorithm {
                kind,
                m,
                n,
                k,
                version: self.version,
                status,
            };
            match st {
                Status::CUBLAS_STATUS_SUCCESS => {}
                Status::CUBLAS_STATUS_NOT_SUPPORTED | Status::CUBLAS_STATUS_INVALID_VALUE => {
                    return Err(no_algo(st));
                }
                st => {
                    return Err(PeerError::Cublas {
                        call: "cublasLtMatmulAlgoGetHeuristic",
                        status: st,
                    });
                }
            }
            if count < 1 {
                return Err(no_algo(Status::CUBLAS_STATUS_NOT_SUPPORTED));
            }
            if result.state != Status::CUBLAS_STATUS_SUCCESS {
                return Err(no_algo(result.state));
            }
            if result.workspaceSize > WORKSPACE_BYTES {
                return Err(no_algo(Status::CUBLAS_STATUS_NOT_SUPPORTED));
            }
            p.algo = result.algo;
        }
        Ok(p)
    }

    #[allow(clippy::too_many_arguments)]
    fn gemm<T>(
        &self,
        kind: GemmKind,
        m: usize,
        n: usize,
        k: usize,
        a: &CudaSlice<T>,
        b: &CudaSlice<T>,
        c: &mut CudaSlice<u16>,
        scales: Option<(&CudaSlice<f32>, &CudaSlice<f32>)>,
    ) -> Result<()> {
        if m == 0 || n == 0 || k == 0 {
            return Err(PeerError::InvalidArgument(format!(
                "empty problem m={m} n={n} k={k}"
            )));
        }
        self.stream.context().bind_to_thread()?;
        let mut guard = self
            .inner
            .lock()
            .map_err(|_| PeerError::InvalidArgument("LtPeer mutex poisoned".into()))?;
        let inner = &mut *guard;
        let stream = &*self.stream;
        let (a_ptr, _ra) = a.device_ptr(stream);
        let (b_ptr, _rb) = b.device_ptr(stream);
        // Scale pointers in cuBLASLt's operand order: our B's scales belong to
        // Lt A, our A's to Lt B. The guards stay alive until after the launch.
        let mut scale_guards = Vec::new();
        let lt_scales = scales.map(|(sa, sb)| {
            let (sa_ptr, ga) = sa.device_ptr(stream);
            let (sb_ptr, gb) = sb.device_ptr(stream);
            scale_guards.push(ga);
            scale_guards.push(gb);
            (sb_ptr, sa_ptr)
        });

        let key = (kind, m, n, k);
        let plan: &Plan = match inner.plans.entry(key) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(self.make_plan(kind, m, n, k, lt_scales)?)
            }
        };
        if let Some(ptrs) = lt_scales {
            // SAFETY: plan.desc is live (we hold the lock); the buffers
            // outlive the enqueued matmul (the caller's borrows outlive this
            // call and cudarc records read events on them via the guards).
            unsafe { set_scale_ptrs(plan.desc, ptrs)? };
        }
        let (c_ptr, _rc) = c.device_ptr_mut(stream);
        let (ws_ptr, _rw) = inner.workspace.device_ptr_mut(stream);
        let alpha: f32 = 1.0;
        let beta: f32 = 0.0;
        // SAFETY: handle and plan descriptors are live (we hold the lock);
        // the lengths of A, B, C (and scales) were checked against m, n, k by
        // the public callers, matching the layouts in `make_plan`; alpha/beta
        // are host f32 (default host pointer mode, scale type 32F); the
        // workspace has WORKSPACE_BYTES bytes and the algorithm needs no more
        // (checked in make_plan); the cast between cudarc's driver and
        // cuBLASLt stream types is between two views of the same CUstream.
        let st = unsafe {
            sys::cublasLtMatmul(
                self.handle,
                plan.desc,
                &alpha as *const f32 as *const c_void,
                dptr(b_ptr),
                plan.a,
                dptr(a_ptr),
                plan.b,
                &beta as *const f32 as *const c_void,
                c_ptr as *const c_void,
                plan.d,
                c_ptr as *mut c_void,
                plan.d,
                &plan.algo,
                ws_ptr as *mut c_void,
                WORKSPACE_BYTES,
                stream.cu_stream() as sys::cudaStream_t,
            )
        };
        drop(scale_guards);
        check("cublasLtMatmul", st)
    }
}

/// Device pointer as the `const void*` cuBLASLt expects.
fn dptr(p: CUdeviceptr) -> *const c_void {
    p as *const c_void
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_layouts() {
        // K = 384 -> 3 K-blocks, padded to 4 for BLK128x128.
        assert_eq!(blocks128(384), 3);
        assert_eq!(blocks128(385), 4);
        assert_eq!(blk128_ld(384), 4);
        assert_eq!(blk128_ld(512), 4);
        assert_eq!(blk128_ld(640), 8);
        assert_eq!(blk128_len(320, 384), 3 * 4);
        assert_eq!(blk128_index(2, 1, 384), 9);
        assert_eq!(vec128_len(200, 384), 600);
        assert_eq!(vec128_index(5, 2, 200), 405);
        assert!(PeerError::LibraryMissing.is_unavailable());
        assert!(!PeerError::InvalidArgument("x".into()).is_unavailable());
        let e = PeerError::Cublas {
            call: "cublasLtMatmul",
            status: Status::CUBLAS_STATUS_EXECUTION_FAILED,
        };
        assert!(e.to_string().contains("cublasLtMatmul"));
        assert!(e.to_string().contains("EXECUTION_FAILED"));
    }
}
