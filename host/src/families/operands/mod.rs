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
    /// The copy of `m` (its codes in `data`), read from the host's copy or the device's
    /// ([`Source`]); `None` where the matrix has none. `made`: the copies made before it of the
    /// same matrix, which it may read rather than keep a layout of its own.
    fn make(
        stream: &Arc<CudaStream>,
        m: &Source<'_>,
        data: &Mem<'_>,
        made: &Prepared,
    ) -> Result<Option<Self>>;

    /// Rewrites it in its own buffers for `m`, rewritten in place (same description and
    /// buffers, so its tensor maps stay valid); `written`: the copies the writer rewrote itself.
    /// `Ok(false)` where it cannot (the matrix is then prepared anew).
    fn refresh(
        &mut self,
        stream: &Arc<CudaStream>,
        m: &Source<'_>,
        written: Rewritten,
    ) -> Result<bool>;
}

/// [`OperandCopy::make`] of one type, boxed for a [`Prepared`] slot.
type Make = fn(&Arc<CudaStream>, &Source<'_>, &Mem<'_>, &Prepared) -> Result<Option<PreparedValue>>;
/// [`OperandCopy::refresh`] of one type, in a [`Prepared`] slot.
type Refresh = fn(&Arc<CudaStream>, &Source<'_>, &mut Prepared, Rewritten) -> Result<bool>;

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
            make: |stream, m, data, made| {
                if made.get::<C>().is_some() {
                    return Ok(None);
                }
                Ok(C::make(stream, m, data, made)?.map(|c| Box::new(c) as PreparedValue))
            },
            refresh: |stream, m, prepared, written| match prepared.get_mut::<C>() {
                Some(c) => c.refresh(stream, m, written),
                None => Ok(true),
            },
        }
    }
}
