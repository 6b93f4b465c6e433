"""TensorRT's limits that more than one part of et-trt respects: the one definition of each.

The op support rules (what the partitioner claims), the lowering's rewrites
(what they turn a sort into) and the pre-flight rules (what the ONNX may hold)
all check against these. The module imports nothing, so any of them may
import it. The C++ runtime keeps its own MAX_RANK (kMaxRank in
runtime/src/blob_reader.h), where it refuses a blob's tensor specs.
"""

# The largest tensor rank (nvinfer1::Dims::MAX_DIMS).
MAX_RANK = 8

# The largest K of ITopKLayer. K must also be static, so a sort becomes one
# TopK only when its axis is static and at most this long.
TOPK_MAX_K = 3840
