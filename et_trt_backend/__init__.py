"""et-trt: an ExecuTorch backend that lowers partitions to NVIDIA TensorRT."""

__version__ = "0.1.0"

# The backend id ExecuTorch records per delegate; the C++ runtime registers
# itself under the same name (runtime/src/backend_id.h). Our own: Torch-TensorRT's
# ExecuTorch runtime registers "TensorRTBackend", and one process can hold both.
BACKEND_ID = "EtTrtBackend"
