"""blockscaled: block-scaled (DeepSeek FP8, MXFP8, MXFP4, NVFP4) GEMM on NVIDIA Hopper GPUs.

Tensors are used where they are, without copies: torch tensors (read through their own
methods; torch itself is not a dependency) or any object with ``__cuda_array_interface__``. A
call is enqueued on torch's current stream of the tensors' device (or the interface's
``stream``, or the ``stream=`` argument) and does not wait for it. Errors raise the exception
of their kind, all subclasses of ``BlockscaledError``; arguments that are not tensors of the
right dtype, shape, device or layout raise ``TypeError`` or ``ValueError`` before any GPU work.

Without a CUDA driver or GPU the package imports, and every call raises ``NoDeviceError``.
"""

from ._native import (
    AlignmentError,
    ArchitectureError,
    BlockscaledError,
    ConfigError,
    DriverError,
    FormatError,
    NoDeviceError,
    ShapeError,
    WrongGpuError,
    fp8_gemm_nt,
    version,
)

__version__ = version()

__all__ = [
    "AlignmentError",
    "ArchitectureError",
    "BlockscaledError",
    "ConfigError",
    "DriverError",
    "FormatError",
    "NoDeviceError",
    "ShapeError",
    "WrongGpuError",
    "fp8_gemm_nt",
    "version",
]
