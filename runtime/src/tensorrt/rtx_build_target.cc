#include "rtx_build_target.h"

#include <cstdint>

namespace et_trt::rtx {

#if NV_TENSORRT_MAJOR >= 11

using namespace nvinfer1;  // the mirror below names TensorRT's types as its headers do

// TensorRT for RTX's apiv::VBuilderConfig (see the header): TensorRT 11.1's
// virtual functions in TensorRT 11.1's order up to getL2LimitForTiling, which
// only fix the positions of the four after them. ComputeCapability is an
// int32_t enum of TensorRT for RTX. Not in an anonymous namespace: there the
// compiler may take a class nobody derives from for one whose virtual
// functions are never called, and replace the calls by aborts.
class VBuilderConfig : public apiv::VRoot {
 public:
  virtual void setAvgTimingIterations(int32_t) noexcept = 0;
  virtual int32_t getAvgTimingIterations() const noexcept = 0;
  virtual void setEngineCapability(EngineCapability) noexcept = 0;
  virtual EngineCapability getEngineCapability() const noexcept = 0;
  virtual void setFlags(BuilderFlags) noexcept = 0;
  virtual BuilderFlags getFlags() const noexcept = 0;
  virtual void clearFlag(BuilderFlag) noexcept = 0;
  virtual void setFlag(BuilderFlag) noexcept = 0;
  virtual bool getFlag(BuilderFlag) const noexcept = 0;
  virtual void setDeviceType(ILayer const*, DeviceType) noexcept = 0;
  virtual DeviceType getDeviceType(ILayer const*) const noexcept = 0;
  virtual bool isDeviceTypeSet(ILayer const*) const noexcept = 0;
  virtual void resetDeviceType(ILayer const*) noexcept = 0;
  virtual bool canRunOnDLA(ILayer const*) const noexcept = 0;
  virtual void setDLACore(int32_t) noexcept = 0;
  virtual int32_t getDLACore() const noexcept = 0;
  virtual void setDefaultDeviceType(DeviceType) noexcept = 0;
  virtual DeviceType getDefaultDeviceType() const noexcept = 0;
  virtual void reset() noexcept = 0;
  virtual void setProfileStream(cudaStream_t) noexcept = 0;
  virtual cudaStream_t getProfileStream() const noexcept = 0;
  virtual int32_t addOptimizationProfile(IOptimizationProfile const*) noexcept = 0;
  virtual int32_t getNbOptimizationProfiles() const noexcept = 0;
  virtual void setProfilingVerbosity(ProfilingVerbosity) noexcept = 0;
  virtual ProfilingVerbosity getProfilingVerbosity() const noexcept = 0;
  virtual bool setTacticSources(TacticSources) noexcept = 0;
  virtual TacticSources getTacticSources() const noexcept = 0;
  virtual ITimingCache* createTimingCache(void const*, std::size_t) const noexcept = 0;
  virtual bool setTimingCache(ITimingCache const&, bool) noexcept = 0;
  virtual ITimingCache const* getTimingCache() const noexcept = 0;
  virtual void setMemoryPoolLimit(MemoryPoolType, std::size_t) noexcept = 0;
  virtual std::size_t getMemoryPoolLimit(MemoryPoolType) const noexcept = 0;
  virtual void setPreviewFeature(PreviewFeature, bool) noexcept = 0;
  virtual bool getPreviewFeature(PreviewFeature) const noexcept = 0;
  virtual void setBuilderOptimizationLevel(int32_t) noexcept = 0;
  virtual int32_t getBuilderOptimizationLevel() const noexcept = 0;
  virtual void setHardwareCompatibilityLevel(HardwareCompatibilityLevel) noexcept = 0;
  virtual HardwareCompatibilityLevel getHardwareCompatibilityLevel() const noexcept = 0;
  virtual void setPluginsToSerialize(char const* const*, int32_t) noexcept = 0;
  virtual char const* getPluginToSerialize(int32_t) const noexcept = 0;
  virtual int32_t getNbPluginsToSerialize() const noexcept = 0;
  virtual bool setMaxAuxStreams(int32_t) noexcept = 0;
  virtual int32_t getMaxAuxStreams() const noexcept = 0;
  virtual void setProgressMonitor(IProgressMonitor*) noexcept = 0;
  virtual IProgressMonitor* getProgressMonitor() const noexcept = 0;
  virtual void setRuntimePlatform(RuntimePlatform) noexcept = 0;
  virtual RuntimePlatform getRuntimePlatform() const noexcept = 0;
  virtual void setMaxNbTactics(int32_t) noexcept = 0;
  virtual int32_t getMaxNbTactics() const noexcept = 0;
  virtual bool setTilingOptimizationLevel(TilingOptimizationLevel) noexcept = 0;
  virtual TilingOptimizationLevel getTilingOptimizationLevel() const noexcept = 0;
  virtual bool setL2LimitForTiling(int64_t) noexcept = 0;
  virtual int64_t getL2LimitForTiling() const noexcept = 0;
  // TensorRT for RTX's own.
  virtual bool setNbComputeCapabilities(int32_t) noexcept = 0;
  virtual int32_t getNbComputeCapabilities() const noexcept = 0;
  virtual bool setComputeCapability(int32_t capability, int32_t index) noexcept = 0;
  virtual int32_t getComputeCapability(int32_t index) const noexcept = 0;
};

namespace {

// IBuilderConfig's implementation pointer (a protected member), read through a
// pointer to member, which is legal where the member itself is not accessible.
struct ConfigImpl : IBuilderConfig {
  static VBuilderConfig* of(IBuilderConfig& config) {
    return reinterpret_cast<VBuilderConfig*>(config.*(&ConfigImpl::mImpl));
  }
};

}  // namespace

bool is_build_target(int compute_capability) {
  switch (compute_capability) {
    case 75: case 80: case 86: case 89: case 120: case 121: return true;
    default: return false;
  }
}

bool set_build_target(IBuilderConfig& config, int compute_capability, std::string* error) {
  const std::string target = "sm_" + std::to_string(compute_capability);
  if (!is_build_target(compute_capability)) {
    *error = "TensorRT for RTX builds ahead of time for sm_75, sm_80, sm_86, sm_89, sm_120 and sm_121, not " + target;
    return false;
  }
  VBuilderConfig* impl = ConfigImpl::of(config);
  if (!impl->setNbComputeCapabilities(1) || !impl->setComputeCapability(compute_capability, 0)) {
    *error = "TensorRT for RTX refused the build target " + target;
    return false;
  }
  if (impl->getNbComputeCapabilities() != 1 || impl->getComputeCapability(0) != compute_capability) {
    *error = "this TensorRT for RTX does not read back the build target " + target +
             ": its builder-config API is not the one et-trt mirrors (TensorRT for RTX 1.x); install TensorRT for RTX 1.x";
    return false;
  }
  return true;
}

#endif  // NV_TENSORRT_MAJOR >= 11

}  // namespace et_trt::rtx
