"""TensorRTPartitioner: claims MoE regions and the supported ops around them."""

from .tensorrt_partitioner import PartitionError, TensorRTPartitioner

__all__ = ["PartitionError", "TensorRTPartitioner"]
