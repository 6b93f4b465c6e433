// ExecuTorch glue: the et-trt delegate (kBackendId: init / execute / destroy),
// registered from a static initializer when libet_trt_runtime.so loads.
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>

#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "backend_id.h"
#include "blob_reader.h"
#include "engine.h"
#include "engine_cache.h"
#include "io_spec.h"
#include "log.h"
#include "named_data.h"
#include "program_named_data.h"

namespace et_trt {
namespace {

using executorch::aten::ScalarType;
using executorch::aten::SizesType;
using executorch::aten::Tensor;
using executorch::runtime::ArrayRef;
using executorch::runtime::Backend;
using executorch::runtime::BackendExecutionContext;
using executorch::runtime::BackendInitContext;
using executorch::runtime::BackendInterface;
using executorch::runtime::CompileSpec;
using executorch::runtime::DelegateHandle;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::FreeableBuffer;
using executorch::runtime::Result;
using executorch::runtime::Span;

// Load-time option (BackendOptions for kBackendId) naming the engine cache directory.
constexpr char kCacheDirOption[] = "engine_cache_dir";
constexpr char kDeviceOption[] = "device";

struct PartitionHandle {
  std::string part;
  PartitionIo io;
  std::unique_ptr<Engine> engine;
};

// Gives the engine ExecuTorch's output tensors, resized to the engine's shapes.
class TensorOutputs final : public OutputBuffers {
 public:
  TensorOutputs(const PartitionIo& io, Span<EValue*> outputs) : io_(io), outputs_(outputs) {}

  bool resize(size_t index, const std::vector<int64_t>& shape, void** data, size_t* nbytes,
              std::string* error) override {
    Tensor& out = outputs_[index]->toTensor();
    std::vector<SizesType> sizes(shape.begin(), shape.end());
    if (executorch::runtime::resize_tensor(out, {sizes.data(), sizes.size()}) != Error::Ok) {
      std::vector<int64_t> planned(out.sizes().begin(), out.sizes().end());
      *error = "output '" + io_.outputs[index].name + "' has shape " + shape_string(shape) +
               ", which the method's output tensor " + shape_string(planned) + " cannot take";
      return false;
    }
    *data = out.mutable_data_ptr();
    *nbytes = out.nbytes();
    return true;
  }

 private:
  const PartitionIo& io_;
  Span<EValue*> outputs_;
};

CallArg call_arg(const EValue& value) {
  if (value.isTensor()) return {CallArg::Kind::kTensor, "Tensor"};
  if (value.isInt()) return {CallArg::Kind::kInt, "Int"};
  char tag[executorch::runtime::kTagNameBufferSize];
  executorch::runtime::tag_to_string(value.tag, tag, sizeof(tag));
  return {CallArg::Kind::kOther, tag};
}

class EtTrtBackend final : public BackendInterface {
 public:
  // Always true: the delegate itself has no requirement; init reports what a
  // blob needs that is missing (TensorRT, a GPU) with a message.
  bool is_available() const override { return true; }

  Result<DelegateHandle*> init(BackendInitContext& context, FreeableBuffer* processed,
                               ArrayRef<CompileSpec>) const override {
    // The flatbuffer needs 8-byte alignment; copy only if the program did not give it.
    const void* bytes = processed->data();
    std::vector<uint64_t> aligned;
    if (reinterpret_cast<uintptr_t>(bytes) % 8 != 0) {
      aligned.resize((processed->size() + 7) / 8);
      std::memcpy(aligned.data(), bytes, processed->size());
      bytes = aligned.data();
    }
    BlobView blob;
    BlobError blob_error;
    if (!read_blob(bytes, processed->size(), &blob, &blob_error)) {
      log_error(std::string(kBackendId) + ": refusing delegate blob: " + blob_error.message);
      return blob_error.kind == BlobError::Kind::kIncompatible ? Error::DelegateInvalidCompatibility
                                                               : Error::InvalidProgram;
    }
    const std::string part = blob.root->part() ? blob.root->part()->str() : "";

    EngineOptions options;
    auto cache_dir = context.get_runtime_spec<const char*>(kCacheDirOption);
    options.cache_dir = engine_cache_dir(cache_dir.ok() ? cache_dir.get() : nullptr);
    auto device = context.get_runtime_spec<int>(kDeviceOption);
    options.device = device.ok() ? device.get() : 0;

    // The weights and engine plans, checked before anything else: a missing or
    // mismatched data file is reported on any machine, TensorRT or not.
    PartitionData data;
    std::string data_error;
    if (!fetch_named_data(*blob.root, ProgramNamedData(context.get_named_data_map()), &data, &data_error)) {
      log_error(std::string(kBackendId) + ": refusing delegate blob: " + data_error);
      return Error::InvalidExternalData;
    }

    PartitionIo io = partition_io(*blob.root);
    EngineError engine_error;
    std::unique_ptr<Engine> engine = create_engine(blob, io, data, options, &engine_error);
    if (engine == nullptr) {
      log_error(std::string(kBackendId) + ": cannot initialize part '" + part + "': " + engine_error.message);
      switch (engine_error.kind) {
        case EngineError::Kind::kUnavailable: return Error::NotSupported;
        case EngineError::Kind::kIncompatible: return Error::DelegateInvalidCompatibility;
        case EngineError::Kind::kFailed: return Error::Internal;
      }
      return Error::Internal;
    }
    // The engine holds everything it needs; the blob's memory and the named data (freed
    // with `data`) can go.
    processed->Free();
    auto* handle = new (std::nothrow) PartitionHandle{part, std::move(io), std::move(engine)};
    if (handle == nullptr) return Error::MemoryAllocationFailed;
    return handle;
  }

  Error execute(BackendExecutionContext&, DelegateHandle* opaque, Span<EValue*> args) const override {
    auto* handle = static_cast<PartitionHandle*>(opaque);
    const PartitionIo& io = handle->io;
    // ExecuTorch passes the call's inputs (tensors, and Int sizes shared with
    // other partitions), then its outputs.
    if (args.size() < io.outputs.size()) {
      log_error(std::string(kBackendId) + ": part '" + handle->part + "' has " + std::to_string(io.outputs.size()) +
                " outputs, called with " + std::to_string(args.size()) + " values");
      return Error::InvalidArgument;
    }
    const size_t num_input_args = args.size() - io.outputs.size();
    std::vector<CallArg> call_args;
    for (size_t i = 0; i < num_input_args; ++i) call_args.push_back(call_arg(*args[i]));
    std::vector<size_t> tensor_args;
    std::string mismatch;
    if (!match_call_inputs(call_args, io.inputs, &tensor_args, &mismatch)) {
      log_error(std::string(kBackendId) + ": part '" + handle->part + "': " + mismatch);
      return Error::InvalidArgument;
    }
    std::vector<InputTensor> inputs;
    for (size_t i = 0; i < io.inputs.size(); ++i) {
      const Tensor& t = args[tensor_args[i]]->toTensor();
      std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
      const std::string problem = check_tensor(io.inputs[i], static_cast<blob::DType>(t.scalar_type()), shape);
      if (!problem.empty()) {
        log_error(std::string(kBackendId) + ": part '" + handle->part + "': " + problem);
        return Error::InvalidArgument;
      }
      // TensorRT binds dense row-major memory.
      if (!executorch::runtime::tensor_is_contiguous(t)) {
        log_error(std::string(kBackendId) + ": part '" + handle->part + "': input '" + io.inputs[i].name +
                  "' is not contiguous (row-major); make it contiguous before the call");
        return Error::InvalidArgument;
      }
      inputs.push_back({t.const_data_ptr(), t.nbytes(), std::move(shape)});
    }
    for (size_t i = 0; i < io.outputs.size(); ++i) {
      EValue* out = args[num_input_args + i];
      if (!out->isTensor() || static_cast<blob::DType>(out->toTensor().scalar_type()) != io.outputs[i].dtype) {
        log_error(std::string(kBackendId) + ": output " + std::to_string(i) + " ('" + io.outputs[i].name +
                  "') must be a " + dtype_name(io.outputs[i].dtype) + " tensor");
        return Error::InvalidArgument;
      }
    }
    TensorOutputs outputs(io, Span<EValue*>(args.data() + num_input_args, io.outputs.size()));
    std::string error;
    bool invalid_input = false;
    if (!handle->engine->execute(inputs, outputs, &error, &invalid_input)) {
      log_error(std::string(kBackendId) + ": part '" + handle->part + "': " + error);
      return invalid_input ? Error::InvalidArgument : Error::Internal;
    }
    return Error::Ok;
  }

  void destroy(DelegateHandle* opaque) const override { delete static_cast<PartitionHandle*>(opaque); }
};

EtTrtBackend backend_instance;
const Error registered = executorch::runtime::register_backend(Backend{kBackendId, &backend_instance});

}  // namespace
}  // namespace et_trt
