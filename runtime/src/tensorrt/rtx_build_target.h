// TensorRT for RTX's ahead-of-time target: the compute capability an engine
// is built for with no GPU present (IBuilderConfig::setNbComputeCapabilities,
// setComputeCapability), the one builder-config API TensorRT does not have.
//
// TensorRT for RTX ships no C++ headers; its apiv::VBuilderConfig is TensorRT
// 11.1's up to getL2LimitForTiling, then setNbComputeCapabilities,
// getNbComputeCapabilities, setComputeCapability and getComputeCapability
// (NVIDIA's TensorRT for RTX 1.3-1.6 headers, NvInferImpl.h; Apache-2.0), which
// rtx_build_target.cc mirrors. Each target set is read back, so a library
// whose layout differs is refused instead of misconfigured. Compiled against
// TensorRT 11 headers only (the interfaces TensorRT for RTX 1.x keeps).
#pragma once

#include <NvInfer.h>

#include <string>

namespace et_trt::rtx {

#if NV_TENSORRT_MAJOR >= 11

// The compute capabilities TensorRT for RTX 1.x builds for ahead of time
// (major * 10 + minor; its ComputeCapability enum's values).
bool is_build_target(int compute_capability);

// Makes `config` build for `compute_capability` only; false and *error if
// TensorRT for RTX refuses it or does not read it back.
bool set_build_target(nvinfer1::IBuilderConfig& config, int compute_capability, std::string* error);

#endif  // NV_TENSORRT_MAJOR >= 11

}  // namespace et_trt::rtx
