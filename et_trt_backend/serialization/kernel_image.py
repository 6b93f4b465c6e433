"""The kernel-image record: one compiled grouped-GEMM kernel as the blob holds it (table KernelImage in
schema.fbs). kernels/aot.py (Triton) and kernels/sm90.py (nvcc) make them, kernels/images.py caches them,
serialization/blob.py writes and reads them; neither Triton nor nvcc is needed to read one."""

from __future__ import annotations

import dataclasses

from et_trt_backend.serialization import schema_generated as fb
from et_trt_backend.serialization.schema_fields import schema_fields

# The fields of table KernelImage in schema.fbs (their one definition), in its order, in snake_case.
SCHEMA_NAMES: dict[str, str] = schema_fields(fb.KernelImageT)

# weight_format, waits_for_prior_grid and y_in_dtype were appended to the schema with defaults (Dense, false, false)
# so that older blobs read; records made without them take the same defaults.
WEIGHT_FORMATS = ("dense", "fp8", "int4")
_DEFAULTS = {"weight_format": (str, "dense"), "waits_for_prior_grid": (bool, False), "y_in_dtype": (bool, False)}
KernelImage = dataclasses.make_dataclass(
    "KernelImage",
    [(name, _DEFAULTS[name][0], dataclasses.field(default=_DEFAULTS[name][1])) if name in _DEFAULTS else name
     for name in SCHEMA_NAMES],
    frozen=True)
KernelImage.__module__ = __name__
KernelImage.__doc__ = """One compiled kernel: the fields of table KernelImage in schema.fbs, in snake_case.

Strings as str; `format` is "cubin" | "ptx", `dtype` "bf16" | "fp16" and `weight_format` "dense" | "fp8" | "int4"
(serialization/blob.py maps them to the schema's enums; an fp8 or int4 image's dtype is its activations' and
output's); `image` is a NamedData holding the cubin or PTX bytes where they are known. `kernel` is
kernel_name(variant, trans_b); `variant` is the launcher's choice among a blob's images
(runtime/kernels/grouped_mm_launcher.h). `waits_for_prior_grid`: the kernel touches nothing but its weights before it
waits for the grid before it in the stream, so the launcher may start it early (programmatic dependent launch).
`y_in_dtype`: a MoE down writes its rows y in `dtype`, a MoE combine reads them so (else float32).
"""


def kernel_name(variant: str, trans_b: bool, weight_format: str = "dense") -> str:
    """The kernel's name in logs and inspect: variant, layout, and "fp8" or "int4" for those weights."""
    quantized = f"{weight_format}_" if weight_format != "dense" else ""
    return f"grouped_mm_{variant}_{quantized}{'nk' if trans_b else 'kn'}"
