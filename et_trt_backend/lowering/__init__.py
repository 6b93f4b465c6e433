"""Lowering of one partition (an edge program) to TensorRT-parseable ONNX."""

from .errors import LoweringError
from .onnx_export import GroupedMMUse, LoweredPartition, has_translation, lower_to_onnx

__all__ = ["GroupedMMUse", "LoweredPartition", "LoweringError", "has_translation", "lower_to_onnx"]
