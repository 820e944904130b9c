//! Host side of the Hopper FP8 kernel (`kernels::sm90_fp8`): which operands it takes, the
//! kernel-layout scale buffers and TMA tensor maps made once per uploaded matrix, and the launch.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, sys};

use crate::error::{Error, Result, shape};
use crate::format::{ElemType, ScaleType};
use crate::matrix::{MatrixDesc, ScaledMatrix};
use blockscaled_kernels::params::sm90::{
    BLOCK_K, BLOCK_N, C_BOX_N, Fp8Types, MAX_CLUSTER, ROW_BYTES, Tile, WG_ROWS, m_pad,
};
use blockscaled_kernels::params::{OutType, SPLITK_THREADS, Sm90Fp8Params, SplitKParams};
use blockscaled_kernels::registry;
use blockscaled_kernels::scheduler::{ClusterShape, TileScheduler};

/// Why an operand cannot go through the sm90 kernel (`None`: it can, in that role).
pub(crate) fn unsupported(desc: &MatrixDesc, as_b: bool) -> Option<String> {
    let f = &desc.format;
    if !matches!(f.elem, ElemType::E4M3 | ElemType::E5M2) {
        return Some(format!(
            "{}: the sm90 kernel takes e4m3 or e5m2 elements",
            f
        ));
    }
    if f.scale != ScaleType::F32 {
        return Some(format!("{}: the sm90 kernel takes fp32 scales", f));
    }
    if !desc.k.is_multiple_of(BLOCK_K as usize) {
        return Some(format!(
            "K = {} is not a multiple of {BLOCK_K}, which the 128-wide fp32 scale blocks of the sm90 kernel need",
            desc.k
        ));
    }
    let (br, bk) = desc.block_extent();
    if bk % BLOCK_K as usize != 0 {
        return Some(format!(
            "{}: scale blocks must span a multiple of 128 of K",
            f
        ));
    }
    if as_b && !(br % BLOCK_N as usize == 0 || br >= desc.rows || per_row(desc)) {
        return Some(format!(
            "{}: as B, scales must be constant over 128×128 tiles or per row over all of K",
            f
        ));
    }
    None
}

/// Scales per row, constant over all of K (as B: per column of C, multiplied in after the K loop).
fn per_row(desc: &MatrixDesc) -> bool {
    let (br, bk) = desc.block_extent();
    br == 1 && bk >= desc.k
}

/// What the kernel needs of one uploaded matrix, made at upload time.
pub(crate) struct Sm90Operand {
    /// The 128-byte CUtensorMap (3-D: K, rows, L; box 128 × 128; 128-byte swizzle) in device memory
    /// (a 256-row A tile is two boxes).
    tmap: CudaSlice<u8>,
    /// The same with a box of 64 rows: each CTA's share of a multicast B tile (128 / MAX_CLUSTER),
    /// or one consumer's rows of a three-consumer A tile.
    tmap_share: CudaSlice<u8>,
    /// A-role scales `[l][k/128][m_pad]`, rows contiguous, zero-padded (None if not eligible as A).
    sfa: Option<(CudaSlice<f32>, u32)>,
    /// B-role scales `[l][⌈rows/128⌉][k/128]` (None if not eligible as B); all 1 when the scales
    /// are per row, which `sfb_col` then holds.
    sfb: Option<CudaSlice<f32>>,
    /// B-role per-row scales `[l][rows]`, when B is scaled per row over all of K.
    sfb_col: Option<CudaSlice<f32>>,
}

impl Sm90Operand {
    /// `None` when the matrix is not e4m3 with fp32 scales and K % 128 == 0 (it can't be either role).
    pub(crate) fn prepare(
        stream: &Arc<CudaStream>,
        m: &ScaledMatrix,
        data: &CudaSlice<u8>,
    ) -> Result<Option<Self>> {
        let d = m.desc();
        let (as_a, as_b) = (
            unsupported(d, false).is_none(),
            unsupported(d, true).is_none(),
        );
        if !as_a && !as_b {
            return Ok(None);
        }
        let (rows, k, l) = (d.rows, d.k, d.batch);
        let kb = k / BLOCK_K as usize;
        let sfa = if as_a {
            // Whole clusters of the tallest tiles: a cluster's last CTA may sit past M and still
            // loads scales.
            let m_pad = m_pad(rows as u32) as usize;
            let mut v = vec![0f32; l * kb * m_pad];
            for li in 0..l {
                for j in 0..kb {
                    for r in 0..rows {
                        v[(li * kb + j) * m_pad + r] =
                            m.scale_value(li, r, j * BLOCK_K as usize) as f32;
                    }
                }
            }
            Some((stream.clone_htod(&v)?, m_pad as u32))
        } else {
            None
        };
        // Per-row B scales (not constant over a 128-row tile) go to the epilogue's column scales.
        let (br, _) = d.block_extent();
        let columns = as_b && per_row(d) && br < rows;
        let sfb = if as_b {
            let nb = rows.div_ceil(BLOCK_N as usize);
            let mut v = vec![1f32; l * nb * kb];
            if !columns {
                for li in 0..l {
                    for b in 0..nb {
                        for j in 0..kb {
                            v[(li * nb + b) * kb + j] =
                                m.scale_value(li, b * BLOCK_N as usize, j * BLOCK_K as usize)
                                    as f32;
                        }
                    }
                }
            }
            Some(stream.clone_htod(&v)?)
        } else {
            None
        };
        let sfb_col = if columns {
            let v: Vec<f32> = (0..l)
                .flat_map(|li| (0..rows).map(move |r| (li, r)))
                .map(|(li, r)| m.scale_value(li, r, 0) as f32)
                .collect();
            Some(stream.clone_htod(&v)?)
        } else {
            None
        };
        let tmap = encode_tensor_map(stream, data, k, rows, l, Tile::M128.a_box_rows(1))?;
        let tmap_share = encode_tensor_map(stream, data, k, rows, l, WG_ROWS)?;
        Ok(Some(Sm90Operand {
            tmap,
            tmap_share,
            sfa,
            sfb,
            sfb_col,
        }))
    }
}

// `tmap_share`'s 64-row box serves both uses: a pair's half of a B tile and one consumer's A rows.
const _: () = assert!(BLOCK_N / MAX_CLUSTER == WG_ROWS);

/// Encodes the TMA descriptor of a K-major e4m3 operand (box: 128 bytes of K × `box_rows` rows,
/// 128-byte swizzle) and copies it to device memory.
fn encode_tensor_map(
    stream: &Arc<CudaStream>,
    data: &CudaSlice<u8>,
    k: usize,
    rows: usize,
    l: usize,
    box_rows: u32,
) -> Result<CudaSlice<u8>> {
    let (ptr, _g) = data.device_ptr(stream);
    // Byte strides of dims 1 and 2 (dim 0 is contiguous): multiples of 16 since K % 128 == 0.
    encode_3d(
        stream,
        ptr,
        sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
        [k, rows, l],
        1,
        [ROW_BYTES, box_rows],
    )
}

/// The output's TMA-store descriptor (N, M, L of 16-bit values; box 64 × 64, 128-byte swizzle),
/// or `None` where the kernel stores directly: f32 output, or N % 8 ≠ 0 (TMA needs 16-byte
/// row strides).
pub(crate) fn output_tensor_map(
    stream: &Arc<CudaStream>,
    buf: &CudaSlice<u8>,
    dtype: crate::OutType,
    (m, n, l): (usize, usize, usize),
) -> Result<Option<CudaSlice<u8>>> {
    if dtype.bytes() != 2 || n % 8 != 0 {
        return Ok(None);
    }
    let (ptr, _g) = buf.device_ptr(stream);
    encode_3d(
        stream,
        ptr,
        sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT16,
        [n, m, l],
        2,
        [C_BOX_N, WG_ROWS],
    )
    .map(Some)
}

/// Encodes a 3-D row-major tensor map (`dims` innermost first, `elem` bytes per element, dense;
/// boxes of `box_xy` × 1 with 128-byte swizzle) over device memory at `ptr` and copies it to device
/// memory (a by-value kernel parameter cannot carry the 64-byte alignment TMA needs from Rust).
fn encode_3d(
    stream: &Arc<CudaStream>,
    ptr: u64,
    dtype: sys::CUtensorMapDataType,
    dims: [usize; 3],
    elem: usize,
    box_xy: [u32; 2],
) -> Result<CudaSlice<u8>> {
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    let sizes = dims.map(|d| d as u64);
    let strides = [(dims[0] * elem) as u64, (dims[0] * dims[1] * elem) as u64];
    let boxes = [box_xy[0], box_xy[1], 1u32];
    let elem_strides = [1u32; 3];
    // SAFETY: every pointer refers to a live local array of the length the rank (3) implies;
    // `ptr` is a live device allocation of the dims' size, 256-byte aligned by cuMemAlloc.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            dtype,
            3,
            ptr as *mut std::ffi::c_void,
            sizes.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elem_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    r.result()?;
    let bytes: Vec<u8> = map.opaque.iter().flat_map(|w| w.to_le_bytes()).collect();
    Ok(stream.clone_htod(&bytes)?)
}

/// The loaded sm90 kernels, one per tile shape, each with how many of its CTAs can be resident at
/// once for each cluster size (index: cluster − 1). Clusters must fit in one GPC, so fewer pairs
/// than SMs / 2 may fit; a persistent grid larger than that would run its last clusters as a
/// second wave (measured: 2–3× slower).
pub(crate) struct Sm90Kernels {
    kernels: Vec<(Tile, Fp8Types, CudaFunction, [u32; MAX_CLUSTER as usize])>,
}

impl Sm90Kernels {
    pub(crate) fn load(
        module: &Arc<cudarc::driver::CudaModule>,
        stream: &CudaStream,
        sm_count: u32,
    ) -> Result<Self> {
        let mut kernels = Vec::new();
        for (tile, types, info) in registry::SM90_FP8_KERNELS {
            let f = module.load_function(info.name)?;
            let resident = configure(&f, stream, sm_count, tile)?;
            kernels.push((tile, types, f, resident));
        }
        Ok(Sm90Kernels { kernels })
    }

    /// CTAs resident at once for the 128-row kernel, alone and in clusters of 2 (for `Debug`).
    pub(crate) fn resident(&self) -> [u32; MAX_CLUSTER as usize] {
        self.kernels[0].3
    }

    fn get(
        &self,
        block_m: u32,
        block_n: u32,
        types: Fp8Types,
    ) -> Result<(&Tile, &CudaFunction, &[u32; MAX_CLUSTER as usize])> {
        self.kernels
            .iter()
            .find(|(t, ty, _, _)| t.block_m() == block_m && t.block_n == block_n && *ty == types)
            .map(|(t, _, f, r)| (t, f, r))
            .ok_or_else(|| {
                Error::Format(format!(
                    "tile of {block_m} × {block_n}: the sm90 kernel has tiles of {}",
                    Tile::ALL
                        .map(|t| format!("{} × {}", t.block_m(), t.block_n))
                        .join(", ")
                ))
            })
    }
}

/// Raises the kernel's dynamic shared-memory limit (above the default 48 KiB) and returns how many
/// CTAs can be resident at once for each cluster size.
fn configure(
    f: &CudaFunction,
    stream: &CudaStream,
    sm_count: u32,
    tile: Tile,
) -> Result<[u32; MAX_CLUSTER as usize]> {
    // SAFETY: a valid function handle and a documented attribute.
    unsafe {
        sys::cuFuncSetAttribute(
            f.cu_function(),
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            tile.smem_bytes() as i32,
        )
    }
    .result()?;
    let mut resident = [sm_count; MAX_CLUSTER as usize];
    for cluster in 2..=MAX_CLUSTER {
        let mut attr = cluster_attribute(cluster);
        let cfg = launch_config(sm_count / cluster * cluster, tile, stream, &mut attr);
        let mut clusters = 0i32;
        // SAFETY: valid function, a config whose attribute pointer outlives the call.
        unsafe { sys::cuOccupancyMaxActiveClusters(&mut clusters, f.cu_function(), &cfg) }
            .result()?;
        resident[cluster as usize - 1] = (clusters.max(0) as u32 * cluster).min(sm_count);
    }
    Ok(resident)
}

/// The kernel's launch: `ctas` blocks of the tile's threads with the tile's shared memory, and the
/// cluster attribute `attr` (which must outlive the config's use).
fn launch_config(
    ctas: u32,
    tile: Tile,
    stream: &CudaStream,
    attr: &mut sys::CUlaunchAttribute,
) -> sys::CUlaunchConfig {
    sys::CUlaunchConfig {
        gridDimX: ctas,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: tile.threads(),
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: tile.smem_bytes(),
        hStream: stream.cu_stream(),
        attrs: attr,
        numAttrs: 1,
    }
}

/// A launch attribute with its value zeroed (the caller sets the field `id` uses).
fn launch_attribute(id: sys::CUlaunchAttributeID) -> sys::CUlaunchAttribute {
    sys::CUlaunchAttribute {
        id,
        pad: [0; 4],
        value: sys::CUlaunchAttributeValue { pad: [0; 64] },
    }
}

fn cluster_attribute(cluster: u32) -> sys::CUlaunchAttribute {
    let mut attr =
        launch_attribute(sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION);
    attr.value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 {
        x: cluster,
        y: 1,
        z: 1,
    };
    attr
}

/// Configuration of one launch (chosen by `config::choose`, or forced by the caller).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sm90Config {
    /// Rows of the output tile: 128, 192 (three consumer warpgroups) or 256 (two 128-row waves per
    /// stage, a quarter fewer L2 bytes per FLOP).
    pub block_m: u32,
    /// Columns of the output tile: 128, or 64 with 128 rows (twice the tiles at small M).
    pub block_n: u32,
    /// Scheduler band height in M tiles (L2 reuse of B tiles).
    pub group_m: u32,
    /// Persistent CTAs (at most one per SM).
    pub ctas: u32,
    /// CTAs per cluster along M (1 or 2): a cluster's CTAs share each B tile by TMA multicast.
    pub cluster_m: u32,
    /// CTAs per cluster along N (1 or 2; 2 only with `cluster_m` = 1): a cluster's CTAs share
    /// each A tile by TMA multicast (each loads every other box of it).
    pub cluster_n: u32,
    /// K split into this many ranges, each its own CTA (≥ 1, at most K / 128): when M·N has too
    /// few tiles to fill the GPU. The partial sums go through an f32 workspace and a reduction
    /// kernel.
    pub split_k: u32,
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn launch(
    stream: &Arc<CudaStream>,
    kernels: &Sm90Kernels,
    a: &Sm90Operand,
    b: &Sm90Operand,
    (m, n, k, l): (usize, usize, usize, usize),
    out: &mut CudaSlice<u8>,
    out_tmap: Option<&CudaSlice<u8>>,
    out_type: u32,
    types: Fp8Types,
    cfg: Sm90Config,
    splitk: Option<(&mut CudaSlice<f32>, &CudaFunction)>,
) -> Result<()> {
    let (tile, f, resident) = kernels.get(cfg.block_m, cfg.block_n, types)?;
    let k_blocks = (k / BLOCK_K as usize) as u32;
    if !(1..=k_blocks.max(1)).contains(&cfg.split_k) {
        return Err(Error::Format(format!(
            "split-K of {}: K = {k} has {k_blocks} blocks of 128 to split",
            cfg.split_k
        )));
    }
    let (Some((sfa, m_pad)), Some(sfb)) = (&a.sfa, &b.sfb) else {
        return Err(Error::Format(
            "operands not prepared for the sm90 kernel in these roles".into(),
        ));
    };
    let cl = ClusterShape {
        m: cfg.cluster_m,
        n: cfg.cluster_n,
    };
    let cluster = cl.size();
    if cl.m == 0 || cl.n == 0 || cluster > MAX_CLUSTER {
        return Err(Error::Format(format!(
            "cluster of {}×{} CTAs (M×N): the sm90 kernel takes 1×1, 2×1 or 1×2",
            cl.m, cl.n
        )));
    }
    // A in boxes of a wave (128 rows) or of 64 rows (`Tile::a_box_rows`).
    let (tmap_a, _g1) = if tile.a_box_rows(cl.n) == WG_ROWS {
        a.tmap_share.device_ptr(stream)
    } else {
        a.tmap.device_ptr(stream)
    };
    // B in boxes of block_n / cluster_m rows: 128 or 64 (each CTA's share of a pair along M).
    let (tmap_b, _g2) = match tile.block_n / cl.m {
        128 => b.tmap.device_ptr(stream),
        64 => b.tmap_share.device_ptr(stream),
        _ => {
            return Err(Error::Format(format!(
                "a pair along M shares the B tile in halves: not with {}-column tiles",
                tile.block_n
            )));
        }
    };
    let (sfa, _g3) = sfa.device_ptr(stream);
    let (sfb, _g4) = sfb.device_ptr(stream);
    let (sfb_col, _g8) = match &b.sfb_col {
        Some(c) => {
            let (p, g) = c.device_ptr(stream);
            (p, Some(g))
        }
        None => (0, None),
    };
    let (out, _g5) = out.device_ptr_mut(stream);
    let (tmap_c, _g6) = match out_tmap {
        Some(t) if cfg.split_k == 1 => {
            let (p, g) = t.device_ptr(stream);
            (p, Some(g))
        }
        _ => (0, None),
    };
    // With split-K the GEMM writes f32 partials into the workspace; the reduction writes `out`.
    let (ws_buf, reduce) = match splitk {
        Some((w, f)) => (Some(w), Some(f)),
        None => (None, None),
    };
    let (ws, _g7) = match (cfg.split_k, ws_buf.as_ref()) {
        (1, _) => (None, None),
        (split, Some(ws)) => {
            if ws.len() < split as usize * l * m * n {
                return Err(Error::Format("split-K workspace too small".into()));
            }
            if l > 65535 {
                return Err(shape(format!(
                    "split-K takes at most 65535 batch entries, not {l}"
                )));
            }
            let (p, g) = ws.device_ptr(stream);
            (Some(p), Some(g))
        }
        (_, None) => return Err(Error::Format("split-K needs a workspace".into())),
    };
    if m > i32::MAX as usize || n > i32::MAX as usize {
        return Err(shape("M and N must fit TMA's 32-bit coordinates"));
    }
    // The kernel indexes the A scales with 32 bits.
    if l as u64 * k_blocks as u64 * *m_pad as u64 > u32::MAX as u64 {
        return Err(shape(format!(
            "L·(K/128)·M = {l}·{k_blocks}·{m_pad} A scales: the sm90 kernel indexes at most 2³²"
        )));
    }
    let mut p = Sm90Fp8Params {
        tmap_a,
        tmap_b,
        tmap_c,
        sfa,
        sfb,
        sfb_col,
        out: ws.unwrap_or(out),
        m: m as u32,
        n: n as u32,
        k: k as u32,
        l: l as u32,
        m_pad: *m_pad,
        out_type: if ws.is_some() {
            OutType::F32 as u32
        } else {
            out_type
        },
        group_m: cfg.group_m.max(1),
        split_k: cfg.split_k,
        cluster_m: cl.m,
        cluster_n: cl.n,
    };
    // Units of work are clusters of tiles; whole clusters of CTAs, at most one CTA per unit tile.
    let units = TileScheduler::new(
        m as u32,
        n as u32,
        (l * cfg.split_k as usize) as u32,
        tile.block_m() * cl.m,
        tile.block_n * cl.n,
        1,
        0,
        1,
    )
    .total();
    // Never more CTAs than can be resident at once in clusters of this size (no second wave).
    let ctas = (cfg.ctas.min(resident[cluster as usize - 1]) / cluster * cluster)
        .clamp(cluster, units * cluster);
    let mut attr = cluster_attribute(cluster);
    let launch = launch_config(ctas, *tile, stream, &mut attr);
    let mut args = [&mut p as *mut Sm90Fp8Params as *mut std::ffi::c_void];
    stream.context().bind_to_thread()?;
    // SAFETY: the parameters come from validated, prepared operands (tensor maps over the live
    // data buffers, scale buffers of the documented sizes, A scales padded to whole clusters), the
    // output holds l·m·n elements of `out_type`, `args` points at one live `Sm90Fp8Params` (the
    // kernel's single parameter), the grid is a whole number of clusters, and the guards above
    // order the buffers' use on this stream.
    unsafe {
        sys::cuLaunchKernelEx(
            &launch,
            f.cu_function(),
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()?;
    if let (Some(ws), Some(reduce)) = (ws, reduce) {
        let p = SplitKParams {
            ws,
            out,
            mn: (m * n) as u64,
            l: l as u32,
            split: cfg.split_k,
            out_type,
            _pad: 0,
        };
        // Enough blocks to cover m·n (four elements per thread), at most four per SM (the kernel
        // strides over the rest).
        let blocks = ((m * n).div_ceil(4 * SPLITK_THREADS as usize) as u32).min(4 * resident[0]);
        let mut args = [&p as *const SplitKParams as *mut std::ffi::c_void];
        // Programmatic dependent launch: the reduction is scheduled while the GEMM's last CTAs
        // finish (they signal `griddepcontrol.launch_dependents`) instead of after a full
        // launch gap; it waits for the GEMM's writes with `griddepcontrol.wait`.
        let mut attr = launch_attribute(
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        );
        attr.value.programmaticStreamSerializationAllowed = 1;
        let launch = sys::CUlaunchConfig {
            gridDimX: blocks,
            gridDimY: l as u32,
            gridDimZ: 1,
            blockDimX: SPLITK_THREADS,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            hStream: stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: `ws` holds split·l·m·n f32 (checked above) written by the launch before it on
        // this stream (the kernel waits for it: `griddepcontrol.wait`); `out` holds l·m·n values
        // of `out_type`; the grid covers m·n (x, strided) and l (y ≤ 65535, checked above);
        // `attr` outlives the call.
        unsafe {
            sys::cuLaunchKernelEx(
                &launch,
                reduce.cu_function(),
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()?;
    }
    Ok(())
}
