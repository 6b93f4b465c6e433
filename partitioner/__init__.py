"""TensorRTPartitioner: claims MoE regions and the supported ops around them."""

# ExecuTorch finds a partition's backend among the loaded BackendDetails
# subclasses by name; importing the partitioner must load EtTrtBackend.
from et_trt_backend import backend as _backend  # noqa: F401

from .errors import PartitionError
from .tensorrt_partitioner import TensorRTPartitioner

__all__ = ["PartitionError", "TensorRTPartitioner"]
