"""Lowering of one partition (an edge program) to TensorRT-parseable ONNX."""

from .errors import LoweringError
from .onnx_export import GroupedMMUse, LoweredPartition, lower_to_onnx

__all__ = ["GroupedMMUse", "LoweredPartition", "LoweringError", "lower_to_onnx"]
