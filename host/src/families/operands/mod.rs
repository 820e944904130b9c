//! The copies of an uploaded matrix or output that more than one family reads, as typed values
//! in the matrix's [`Prepared`](crate::buffers::Prepared) slot: each is made by the family that
//! owns it at upload (or rewritten by a device writer, [`Rewritten`](super::Rewritten)), and a
//! family that reads another's layout asks for it here by type, never through that family.

pub(crate) mod fp8;
pub(crate) mod mx;
pub(crate) mod output;

pub(crate) use fp8::{BRole, Sm90Operand};
pub(crate) use mx::MxOperand;
pub(crate) use output::Sm90Output;
