// The name the delegate registers under with ExecuTorch: the backend id that
// et_trt_backend.BACKEND_ID (Python) writes into every .pte it exports. It is
// our own, not Torch-TensorRT's "TensorRTBackend", so both delegates can be
// registered in one process.
#pragma once

namespace et_trt {

inline constexpr char kBackendId[] = "EtTrtBackend";

}  // namespace et_trt
