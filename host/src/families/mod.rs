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

use crate::bsr::BsrMatrix;
use crate::buffers::{DeviceMatrix, DeviceOutput, Mem, Prepared, PreparedValue};
use crate::error::Result;
use crate::format::OutType;
use crate::grouped::DeviceGroups;
use crate::matrix::GemmShape;
use crate::prepare::Source;

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

    /// What the family needs of an uploaded block-sparse matrix's stored blocks (`values`, at
    /// least one block) beside them; `None` when it runs no block-sparse GEMM.
    fn prepare_sparse(
        &self,
        _stream: &Arc<CudaStream>,
        _matrix: &BsrMatrix,
        _values: &CudaSlice<u8>,
    ) -> Result<Option<PreparedValue>> {
        Ok(None)
    }

    /// What the family needs of an output `l` × `m` × `n` of `dtype` in `buf`.
    fn prepare_output(
        &self,
        _stream: &Arc<CudaStream>,
        _buf: &Mem<'_>,
        _dtype: OutType,
        _dims: (usize, usize, usize),
    ) -> Result<Option<PreparedValue>> {
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
            if let Some(p) = (kind.make)(stream, matrix, data, prepared)? {
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
            all &= (kind.refresh)(stream, matrix, prepared, written)?;
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
