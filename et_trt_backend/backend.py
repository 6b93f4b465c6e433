"""The ExecuTorch backend: preprocess turns one partition into an et-trt blob.

options (compile specs) -> ONNX (lowering) -> pre-flight check -> weights out
of the ONNX -> kernel images (for its GroupedMM and MoEExperts nodes) ->
engines (where a provider can build at export) -> one serialized blob
(serialization/blob.py), and the weights and engines as ExecuTorch named data
(serialization/external_data.py): in the .pte, or in a .ptd where the weights
carry ExecuTorch's external-constant tag.
"""

from __future__ import annotations

import copy
import logging
import time

import torch
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec

from et_trt_backend import engine_build, library_logs, preflight
from et_trt_backend.lowering import lower_to_onnx
from et_trt_backend.lowering.translations import ONNX_OPSET
from et_trt_backend.options import CompileOptions
from et_trt_backend.serialization import blob, external_data

logger = logging.getLogger(__name__)


def _kernel_images(lowered, options: CompileOptions):
    """The kernel images the partition's plugin nodes run: per GroupedMM (dtype, layout, weight format) and per
    MoEExperts (dtype, weight format), each once, for every architecture of kernel_archs."""
    if not lowered.grouped_mms and not lowered.fused_blocks:
        return [], {}
    from et_trt_backend.kernels import grouped_mm_images
    from et_trt_backend.kernels.moe_aot import moe_experts_images
    import triton

    # The SwiGLU row quantizations only where a GroupedMM of their dtype takes a gate+up output (~100 KiB an
    # architecture).
    swiglu = {use.dtype for use in lowered.grouped_mms if use.swiglu}
    images = []
    for dtype, trans_b, weight_format in dict.fromkeys(  # each (dtype, trans_b, weight format) once, in order
            (use.dtype, use.trans_b, use.weight_format) for use in lowered.grouped_mms):
        images += [image for image in grouped_mm_images(options.kernel_archs, dtype, trans_b, weight_format)
                   if dtype in swiglu or not image.variant.startswith("quantize_rows_swiglu")]
    # With expert_precision "fp8" or "int4" every fused block has weights of that format (lowering/fp8_experts.py,
    # int4_experts.py); options.py refuses "fp8" where kernel_archs holds an architecture without FP8 MMA.
    weight_format = options.expert_precision if options.expert_precision in ("fp8", "int4") else "dense"
    for dtype in dict.fromkeys(block.dtype for block in lowered.fused_blocks):
        images += moe_experts_images(options.kernel_archs, dtype, weight_format)
    return images, {"triton": triton.__version__}


class EtTrtBackend(BackendDetails):
    @classmethod
    def copy_exported_program_for_preprocess(cls, edge_program: torch.export.ExportedProgram,
                                             compile_specs: list[CompileSpec]) -> torch.export.ExportedProgram:
        """The partition's program for preprocess: its graph copied (the lowering rewrites it), its weights shared
        with the caller's program. ExecuTorch's default copies them too, which holds every weight of the partition
        twice while it exports; preprocess never writes a weight in place (passes that transform weights add new
        constants: lowering/program_weights.py; tests/test_large_weights.py checks the model is unchanged)."""
        shared = {id(t): t for t in (*edge_program.state_dict.values(), *edge_program.constants.values())
                  if isinstance(t, torch.Tensor)}
        return copy.deepcopy(edge_program, shared)

    @staticmethod
    def preprocess(edge_program: torch.export.ExportedProgram, compile_specs: list[CompileSpec]) -> PreprocessResult:
        options, part = CompileOptions.from_compile_specs(compile_specs)
        start = time.perf_counter()
        logger.info("part %r: lowering to ONNX", part)
        with library_logs.held_back():
            lowered = lower_to_onnx(edge_program, options)
        weights = lowered.weights
        preflight.enforce(lowered.onnx, options.preflight, where=f"part {part!r}")
        onnx_bytes = lowered.onnx_bytes
        tag = external_data.external_tag(edge_program, part)
        logger.info("part %r: ONNX %.1f KiB and %d weights of %.1f MiB%s, %d GroupedMM, %d MoEExperts", part,
                    len(onnx_bytes) / 1024, len(weights), sum(w.data.size for w in weights) / 2**20,
                    f" (to {tag}.ptd)" if tag else "", len(lowered.grouped_mms), len(lowered.fused_blocks))

        kernels, producer_extra = _kernel_images(lowered, options)
        contents = blob.BlobContents(
            part=part,
            inputs=lowered.inputs,
            outputs=lowered.outputs,
            options=options,
            onnx=onnx_bytes,
            kernels=kernels,
            engines=[],
            producer=blob.producer_versions(ONNX_OPSET, **producer_extra),
            weights=weights,
            data_file=f"{tag}.ptd" if tag else "",
            checks=lowered.checks,
        )
        contents.engines = engine_build.maybe_build_engines(contents, options)
        if contents.engines:
            contents.producer = blob.producer_versions(
                ONNX_OPSET, **producer_extra, tensorrt=contents.engines[0].tensorrt_version)
        data = blob.serialize(contents)
        logger.info("part %r: blob %.1f KiB in %.1f s", part, len(data) / 1024, time.perf_counter() - start)
        return PreprocessResult(processed_bytes=data, data_store_output=external_data.store_output(contents, tag))
