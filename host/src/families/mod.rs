//! The kernel families' host sides, one folder each (`fp8`, `half`, `mx`, `fold`, `w4`, and
//! `reference.rs`), on one skeleton:
//! - [`Family`]: what a family provides besides its launch (its operand copy, weight-role
//!   copies, output and block-sparse maps);
//! - `operands/`: the copies of a matrix or output that more than one family reads (the FP8
//!   layout, the MX scale layout, the output's TMA maps), typed, made once; a family reads
//!   another's layout from there, never through that family — no family imports another;
//! - `persistent.rs`: the loaded kernel with its resident CTAs, the kernel loader, and the
//!   shared steps of every persistent launch (grid, groups, split-K workspace);
//! - `heuristic.rs`: what the configuration rules share; each family's own rules and tuning
//!   constants are in its `heuristic.rs`, crate-private but for the configuration functions
//!   `crate::plan` re-exports.
//!
//! Each family folder holds its configuration type and the rules it obeys for a shape, its
//! kernel choice, its parameters and launch; the schedule a launch sizes its grid by is the
//! kernel crate's function for the family's tile, the one the kernel runs. [`load`] loads the
//! families a GPU's module has; `crate::plan` chooses among them.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use cudarc::driver::{CudaModule, CudaSlice, CudaStream};

use crate::bsr::{BsrMatrix, DeviceBsr};
use crate::buffers::{DeviceMatrix, DeviceOutput, Mem, Prepared, PreparedValue};
use crate::error::Result;
use crate::format::ElemType;
use crate::grouped::DeviceGroups;
use crate::matrix::{GemmShape, MatrixDesc};
use crate::prepare::Source;
use crate::workspace::WorkspaceSize;

pub(crate) mod fold;
pub(crate) mod fp8;
pub(crate) mod half;
pub(crate) mod heuristic;
pub(crate) mod mx;
pub(crate) mod operands;
pub(crate) mod persistent;
pub(crate) mod reference;
pub(crate) mod w4;

/// The copies of a rewritten matrix (by a device quantizer or a GEMM's quantized output) that its
/// writer rewrote in place beside the codes and scales, so that the families skip them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Rewritten {
    /// The FP8 kernel's A-role scales (FP8 with fp32 scales per 1×128, per row or per tensor).
    pub sfa: bool,
    /// The MX kernel's scale layout (one-byte scales per 1×16 or 1×32).
    pub mx_scales: bool,
}

/// What a family keeps beside a matrix, an output or a block-sparse matrix (`None`: nothing).
pub(crate) type Made = Result<Option<PreparedValue>>;

/// An uploaded block-sparse matrix's stored blocks (`values`: at least one block).
#[derive(Clone, Copy)]
pub(crate) struct StoredBlocks<'a> {
    pub matrix: &'a BsrMatrix,
    pub values: &'a CudaSlice<u8>,
}

/// One kernel family's host side, loaded on one GPU.
pub(crate) trait Family: Any + Send + Sync {
    /// A line for `Gpu`'s `Debug` (what was found when loading), if any.
    fn describe(&self) -> Option<String> {
        None
    }

    /// The operand copy the family makes of every uploaded matrix it can take (tensor maps,
    /// scales in its kernels' layout), if any ([`operands::OperandCopy`]).
    fn operand_copy(&self) -> Option<operands::CopyKind> {
        None
    }

    /// Makes now the copies the family makes of `m` at its first use as weights (the B role:
    /// scale re-layouts, reordered codes), so that no GEMM call makes them later; nothing where it
    /// has none for `m`.
    fn prepare_weights(&self, _stream: &Arc<CudaStream>, _m: &DeviceMatrix<'_>) -> Result<()> {
        Ok(())
    }

    /// What the family needs of an uploaded block-sparse matrix's stored blocks beside them;
    /// `None` when it runs no block-sparse GEMM.
    fn prepare_sparse(&self, _stream: &Arc<CudaStream>, _blocks: StoredBlocks<'_>) -> Made {
        Ok(None)
    }

    /// What the family needs of an output beside its buffer (its tensor maps).
    fn prepare_output(&self, _stream: &Arc<CudaStream>, _out: &DeviceOutput<'_>) -> Made {
        Ok(None)
    }
}

/// Loads every kernel family the module built for `target` (as the registry names it) contains (`preparers`: the GPU's, for
/// the families that make a matrix's weight-role copies at its first use as weights), in the
/// order in which they prepare a matrix (a family may read the copies of those before it: the
/// 4-bit-weights family reads the FP8 and MX copies).
pub(crate) fn load(
    module: &Arc<CudaModule>,
    stream: &Arc<CudaStream>,
    target: &'static str,
    sm_count: u32,
    preparers: &crate::prepare::Preparers,
) -> Result<Families> {
    let cx = persistent::Loader {
        module,
        stream,
        target,
        sm_count,
        preparers,
    };
    let mut families = Families::default();
    families.add(reference::ReferenceKernel::load(&cx)?);
    families.add_some(fp8::Sm90Fp8::load(&cx)?);
    families.add_some(mx::Sm90Mx::load(&cx)?);
    families.add_some(w4::Sm90W4::load(&cx)?);
    families.add_some(fold::Sm90MxFp8::load(&cx)?);
    families.add_some(half::Sm90Half::load(&cx)?);
    Ok(families)
}

/// The families loaded on one GPU.
#[derive(Default)]
pub(crate) struct Families(Vec<Box<dyn Family>>);

impl Families {
    pub(crate) fn add(&mut self, family: impl Family) {
        self.0.push(Box::new(family));
    }

    fn add_some(&mut self, family: Option<impl Family>) {
        if let Some(f) = family {
            self.add(f);
        }
    }

    pub(crate) fn get<F: Family>(&self) -> Option<&F> {
        self.0
            .iter()
            .find_map(|f| (f.as_ref() as &dyn Any).downcast_ref::<F>())
    }

    /// The family `F`, or [`Error::Architecture`](crate::Error::Architecture) naming `what`
    /// where this GPU's module has none.
    pub(crate) fn require<F: Family>(&self, what: &str) -> Result<&F> {
        self.get::<F>()
            .ok_or_else(|| crate::Error::Architecture(format!("this GPU has no {what}")))
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &dyn Family> {
        self.0.iter().map(|f| f.as_ref())
    }

    /// Adds to `prepared` each family's copy of the matrix `matrix` (codes in `data`), in the
    /// families' order: a family may read the copies of those before it.
    pub(crate) fn prepare_operand(
        &self,
        stream: &Arc<CudaStream>,
        matrix: &Source<'_>,
        data: &Mem<'_>,
        prepared: &mut Prepared,
    ) -> Result<()> {
        for kind in self.iter().filter_map(|f| f.operand_copy()) {
            let up = operands::Upload {
                stream,
                matrix,
                data,
                made: prepared,
            };
            if let Some(p) = (kind.make)(&up)? {
                prepared.insert(p);
            }
        }
        Ok(())
    }

    /// Rewrites each family's copy in `prepared` for `matrix`, whose codes and scales were
    /// rewritten in place (`written`: the copies the writer rewrote itself); `false` where one
    /// cannot be (the matrix is then prepared anew).
    pub(crate) fn refresh_operand(
        &self,
        stream: &Arc<CudaStream>,
        matrix: &Source<'_>,
        prepared: &mut Prepared,
        written: Rewritten,
    ) -> Result<bool> {
        let mut all = true;
        for kind in self.iter().filter_map(|f| f.operand_copy()) {
            let re = operands::Rewrite {
                stream,
                matrix,
                written,
            };
            all &= (kind.refresh)(&re, prepared)?;
        }
        Ok(all)
    }
}

impl fmt::Debug for Families {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in self.iter().filter_map(|fam| fam.describe()) {
            write!(f, "; {line}")?;
        }
        Ok(())
    }
}

/// A family's configuration as the plan runs it (`crate::plan::Plan` holds one per variant and
/// hands each call to it): checked against a shape, sized, fitted to a fused epilogue, launched.
pub(crate) trait PlanConfig {
    /// [`Error::Config`](crate::Error::Config) for a configuration the kernel is not built for
    /// or that does not fit `shape`, [`Error::Shape`](crate::Error::Shape) for a shape past the
    /// kernel's limits. The launch trusts what passes.
    fn validate(&self, shape: &GemmShape) -> Result<()>;

    /// Why the family's kernels do not take A `a` with B `b` (`None`: they do); the launch
    /// refuses such a pair with [`Error::Format`](crate::Error::Format).
    fn unsupported(&self, _a: &MatrixDesc, _b: &MatrixDesc) -> Option<String> {
        None
    }

    /// Its K split where the family has grouped kernels; `None` where it has none.
    fn grouped_split(&self) -> Option<u32> {
        None
    }

    /// The workspace a GEMM takes with it.
    fn workspace(&self, _q: &Sizing<'_>) -> Result<WorkspaceSize> {
        Ok(WorkspaceSize::default())
    }

    /// The tile's columns, which a fused epilogue's quantized output blocks must divide;
    /// [`Error::Config`](crate::Error::Config) where the kernel runs no fused epilogue.
    fn fused_columns(&self) -> Result<u32>;

    /// Whether a fused kernel runs its tile for `needs` (element types, in registers or not).
    fn has_fused_kernel(&self, _needs: &FusedNeeds) -> bool {
        false
    }

    /// Launches the GEMM `g` (the configuration validated for `g.shape`).
    fn launch(&self, families: &Families, g: Gemm<'_, '_>) -> Result<()>;
}

/// What a fused epilogue needs of a plan's kernel: `block_cols`, a quantized output's scale
/// block in product columns (doubled by SwiGLU; 0: not quantized), which must lie in one warp's
/// pass over a staged row (128 columns: see `blockscaled_kernels::gemm::epilogue::fuse`) and divide the
/// tile's columns, so that no block straddles two tiles; and a fused kernel for the operands'
/// element types `elems` (A, B) on the plan's tile: one with finishing warps, or, for an
/// epilogue the consumers can run in their registers (`in_registers`), one that runs it there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FusedNeeds {
    pub block_cols: u32,
    pub elems: (ElemType, ElemType),
    pub in_registers: blockscaled_kernels::sm90::InRegisters,
}

/// [`Error::Config`](crate::Error::Config) for a fused epilogue on `cfg`'s kernel, which computes
/// Cᵀ and stores it transposed.
pub(crate) fn computes_transposed(cfg: &dyn fmt::Debug) -> crate::Error {
    crate::error::config(format!(
        "{cfg:?} computes Cᵀ and stores it transposed: a fused epilogue needs a kernel that \
         computes C"
    ))
}

/// A GEMM's operands, shape and epilogue as its workspace is sized.
pub(crate) struct Sizing<'a> {
    pub families: &'a Families,
    pub a: &'a DeviceMatrix<'a>,
    pub b: &'a DeviceMatrix<'a>,
    pub shape: GemmShape,
    pub groups: Option<&'a DeviceGroups<'a>>,
    /// With a fused epilogue or a quantized output.
    pub fused: bool,
}

/// A block-sparse GEMM's operands: `dense`, and `sparse` (its stored blocks prepared), checked to
/// belong to one GPU and to fit (the kernel's shape: M the dense operand's rows, N the sparse
/// one's).
#[derive(Clone, Copy)]
pub(crate) struct BsrOperands<'a> {
    /// The stream the GEMM runs on (and the sparse operand's work list is made on).
    pub stream: &'a Arc<CudaStream>,
    pub dense: &'a DeviceMatrix<'a>,
    pub sparse: &'a DeviceBsr,
}

/// A block-sparse GEMM as a family's launch receives it: the operands, the operand that is
/// sparse (`side`; with A the kernel computes Cᵀ and stores it transposed), and the output,
/// checked to be the product's shape.
pub(crate) struct SparseGemm<'a, 'c> {
    /// The calling handle's workspace, used in `stream`'s order.
    pub work: &'a crate::workspace::Workspace,
    pub ops: BsrOperands<'a>,
    pub side: crate::bsr::SparseSide,
    pub c: &'a mut DeviceOutput<'c>,
}

/// One GEMM as a family's launch receives it: operands and output checked to belong to the GPU
/// of `stream` and to form `shape`, and the plan validated for `shape`. A grouped GEMM
/// (`groups`) has `shape` = C's rows, N, K and C's batch, and B has one batch entry per group
/// (`crate::grouped`); a family without grouped kernels refuses it.
pub(crate) struct Gemm<'a, 'c> {
    pub stream: &'a Arc<CudaStream>,
    /// The calling handle's workspace, used in `stream`'s order.
    pub work: &'a crate::workspace::Workspace,
    pub shape: GemmShape,
    pub a: &'a DeviceMatrix<'a>,
    pub b: &'a DeviceMatrix<'a>,
    pub c: &'a mut DeviceOutput<'c>,
    pub groups: Option<&'a DeviceGroups<'a>>,
    /// The fused epilogue, if any (its output shape was checked against `c`).
    pub epi: Option<crate::fused::Fused<'a>>,
}

impl Gemm<'_, '_> {
    /// [`Error::Config`](crate::Error::Config) for a fused epilogue on `family`, which has none.
    pub(crate) fn plain_only(&self, family: &str) -> Result<()> {
        match self.epi {
            Some(_) => Err(crate::error::config(format!(
                "{family} has no fused epilogue (fused: the sm90 FP8, 16-bit and MX kernels)"
            ))),
            None => Ok(()),
        }
    }

    /// [`Error::Config`](crate::Error::Config) for a grouped GEMM on `family`, which has none.
    pub(crate) fn dense_only(&self, family: &str) -> Result<()> {
        match self.groups {
            Some(_) => Err(crate::error::config(format!(
                "{family} has no grouped GEMM (grouped: the sm90 FP8, MX, 4-bit-weights and \
                 fold kernels)"
            ))),
            None => Ok(()),
        }
    }
}

/// What the families' unit tests share.
#[cfg(test)]
pub(crate) mod test_util {
    use crate::format::{Fp8, Recipe};
    use crate::matrix::{GemmShape, MatrixDesc};

    /// A family's `unsupported_pair`.
    type PairCheck = fn(&MatrixDesc, &MatrixDesc) -> Option<String>;

    /// The recipes with one-byte scales per 16 or 32 elements (MX and NVFP4).
    pub(crate) const MX_RECIPES: [Recipe; 5] = [
        Recipe::Mxfp8(Fp8::E4M3),
        Recipe::Mxfp8(Fp8::E5M2),
        Recipe::Mxfp4,
        Recipe::Nvfp4,
        Recipe::E2m1E8m0x16,
    ];

    /// The GEMM shape `m` × `n` × `k`, batch `l`.
    pub(crate) fn shape(m: usize, n: usize, k: usize, l: usize) -> GemmShape {
        GemmShape { m, n, k, l }
    }

    /// `ok` (a configuration with `group_m`, `ctas` and `split_k` and their `with_*` methods)
    /// with each of those knobs out of range for a shape of `bands` band units and `stages`
    /// stages of K: no band, a band past M, no CTAs, no split, a split past K.
    macro_rules! broken_knobs {
        ($ok:expr, bands: $bands:expr, stages: $stages:expr) => {
            [
                $ok.with_group_m(0),
                $ok.with_group_m($bands + 1),
                $ok.with_ctas(0),
                $ok.with_split_k(0),
                $ok.with_split_k($stages + 1),
            ]
        };
    }
    pub(crate) use broken_knobs;

    /// Asserts that a family's `unsupported_pair` takes every MX and NVFP4 pair with K = 256 and
    /// no pair of FP8 with fp32 scales.
    pub(crate) fn takes_mx_pairs_only(unsupported_pair: PairCheck) {
        for r in MX_RECIPES {
            let (a, b) = (desc(r, 100, 256, false), desc(r, 70, 256, true));
            assert_eq!(unsupported_pair(&a, &b), None, "{r}");
        }
        let ds = Recipe::DeepSeekFp8;
        assert!(unsupported_pair(&desc(ds, 64, 256, false), &desc(ds, 64, 256, true)).is_some());
    }

    /// A matrix of `recipe`, `rows` × `k`, in the B role where `b`.
    pub(crate) fn desc(recipe: Recipe, rows: usize, k: usize, b: bool) -> MatrixDesc {
        MatrixDesc::of_recipe(recipe, rows, k, b)
    }
}
