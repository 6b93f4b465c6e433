"""TensorRTPartitioner: claims MoE regions and the supported ops around them.

Also the `et-trt` command (cli.py) and export() (export.py), which use both this package and
et_trt_backend. TensorRTPartitioner is imported on first use (it imports torch and ExecuTorch), so that
the command starts without them.
"""

from .errors import PartitionError


def __getattr__(name: str):
    if name == "TensorRTPartitioner":
        from .tensorrt_partitioner import TensorRTPartitioner

        return TensorRTPartitioner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["PartitionError", "TensorRTPartitioner"]
