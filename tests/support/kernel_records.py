"""Kernel image records of made-up bytes, for blobs that TensorRT builds but no GPU runs."""

from __future__ import annotations

from et_trt_backend.serialization.kernel_image import KernelImage, kernel_name
from et_trt_backend.serialization.named_data import NamedData


def image_record(variant: str, dtype: str, trans_b: bool, weight_format: str) -> KernelImage:
    """A kernel image record for sm_89. The build reads only its dtype, layout and weight format, and hashes its
    bytes (kernel_images_id); no kernel runs here."""
    return KernelImage(kernel=kernel_name(variant, trans_b, weight_format), variant=variant, trans_b=trans_b,
                       arch="sm_89",
                       format="cubin", image=NamedData.of(f"{variant} {dtype} {weight_format} image".encode()),
                       entry=variant, dtype=dtype, num_warps=4, shared_bytes=0, global_scratch_bytes=0,
                       global_scratch_align=1, profile_scratch_bytes=0, block_m=64, block_n=64, block_k=64,
                       persistent=variant != "quantize_rows", ptx_version="8.4", weight_format=weight_format)


def fp8_image_records(dtype: str = "bf16") -> list[KernelImage]:
    """An FP8 blob's images: the GEMM and the row quantization its launcher needs."""
    return [image_record(variant, dtype, True, "fp8") for variant in ("any", "quantize_rows")]
