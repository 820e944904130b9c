//! The one error type of the public API. Every bad input is one of these, never a panic.

/// What went wrong, said so that the caller can fix it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Dimensions that do not fit together or do not fit the format, or sizes that overflow.
    #[error("shape: {0}")]
    Shape(String),
    /// A size or stride the format's packing or a kernel's access width needs to be a multiple of.
    #[error("alignment: {0}")]
    Alignment(String),
    /// A format or format combination that is not supported, or a value the format cannot hold.
    #[error("format: {0}")]
    Format(String),
    /// A block-sparse matrix's structure that is not valid BSR (row pointers, column indices).
    #[error("sparse structure: {0}")]
    Sparse(String),
    /// A kernel configuration (a [`Plan`](crate::Plan)'s fields) the kernel is not built for or
    /// that does not fit the shape.
    #[error("configuration: {0}")]
    Config(String),
    /// The GPU's architecture has no kernel for this request.
    #[error("architecture: {0}")]
    Architecture(String),
    /// No CUDA driver, or no GPU with that ordinal.
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// An operand or output that belongs to another [`Gpu`](crate::Gpu) (another device or
    /// context) than the one asked to use it.
    #[error("wrong GPU: {0}")]
    WrongGpu(String),
    /// An NCCL call failed, or NCCL is not installed (feature `nccl`).
    #[error("NCCL: {0}")]
    Collective(String),
    /// A CUDA driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
}

/// The result of every fallible call of the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn shape(msg: impl Into<String>) -> Error {
    Error::Shape(msg.into())
}

pub(crate) fn config(msg: impl Into<String>) -> Error {
    Error::Config(msg.into())
}
