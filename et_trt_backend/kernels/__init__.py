"""The grouped-GEMM kernel: Triton source, ahead-of-time images, and the eager op.

Importing this package does not import Triton; compiling does.
"""

from et_trt_backend.kernels.aot import KernelImage, grouped_mm_images

__all__ = ["KernelImage", "grouped_mm_images"]
