"""The grouped-GEMM kernel: Triton source, ahead-of-time images, launcher binding, eager op.

Importing this package imports neither Triton nor torch; compiling imports
Triton, and `et_trt_backend.kernels.op` registers torch.ops.et_trt.grouped_mm.
"""

from et_trt_backend.kernels.aot import grouped_mm_images

__all__ = ["grouped_mm_images"]
