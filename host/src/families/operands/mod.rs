//! The copies of an uploaded matrix or output that more than one family reads, as typed values
//! in the matrix's [`Prepared`](crate::buffers::Prepared) slot: each is made by the family that
//! owns it at upload (or rewritten by a device writer, [`Rewritten`](super::Rewritten)), and a
//! family that reads another's layout asks for it here by type, never through that family.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::buffers::{Held, Mem, Prepared, PreparedValue};
use crate::error::Result;
use crate::families::Rewritten;
use crate::prepare::Source;

pub(crate) mod fp8;
pub(crate) mod mx;
pub(crate) mod output;

pub(crate) use fp8::{BRole, Sm90Operand};
pub(crate) use mx::MxOperand;
pub(crate) use output::Sm90Output;

/// A copy a family keeps of each uploaded matrix it can take, beside the matrix's codes and
/// scales, in the matrix's [`Prepared`] slot.
pub(crate) trait OperandCopy: Held + Sized {
    /// The copy of the uploaded matrix; `None` where the matrix has none.
    fn make(up: &Upload<'_>) -> Result<Option<Self>>;

    /// Rewrites it in its own buffers for `m`, rewritten in place (same description and
    /// buffers, so its tensor maps stay valid); `written`: the copies the writer rewrote itself.
    /// `Ok(false)` where it cannot (the matrix is then prepared anew).
    fn refresh(&mut self, re: &Rewrite<'_>) -> Result<bool>;
}

/// A matrix as its copies are made: at upload, or when a device writer made it.
#[derive(Clone, Copy)]
pub(crate) struct Upload<'a> {
    pub stream: &'a Arc<CudaStream>,
    /// The matrix, read from the host's copy or the device's ([`Source`]).
    pub matrix: &'a Source<'a>,
    /// Its codes.
    pub data: &'a Mem<'a>,
    /// The copies made before this one of the same matrix, which it may read rather than keep a
    /// layout of its own.
    pub made: &'a Prepared,
}

/// A matrix whose codes and scales a device writer rewrote in place (same description and
/// buffers).
#[derive(Clone, Copy)]
pub(crate) struct Rewrite<'a> {
    pub stream: &'a Arc<CudaStream>,
    pub matrix: &'a Source<'a>,
    /// The copies the writer rewrote itself.
    pub written: Rewritten,
}

/// [`OperandCopy::make`] of one type, boxed for a [`Prepared`] slot.
type Make = fn(&Upload<'_>) -> Result<Option<PreparedValue>>;
/// [`OperandCopy::refresh`] of one type, in a [`Prepared`] slot.
type Refresh = fn(&Rewrite<'_>, &mut Prepared) -> Result<bool>;

/// An [`OperandCopy`] type's two operations, as a family names its copy
/// ([`Family::operand_copy`](super::Family::operand_copy)).
#[derive(Clone, Copy)]
pub(crate) struct CopyKind {
    /// [`OperandCopy::make`], nothing where `made` holds the copy already (a device writer's).
    pub(crate) make: Make,
    /// [`OperandCopy::refresh`] of the copy in a `Prepared`, `true` where it holds none.
    pub(crate) refresh: Refresh,
}

impl CopyKind {
    pub(crate) fn of<C: OperandCopy>() -> CopyKind {
        CopyKind {
            make: |up| {
                if up.made.get::<C>().is_some() {
                    return Ok(None);
                }
                Ok(C::make(up)?.map(|c| Box::new(c) as PreparedValue))
            },
            refresh: |re, prepared| match prepared.get_mut::<C>() {
                Some(c) => c.refresh(re),
                None => Ok(true),
            },
        }
    }
}
