#include "io_spec.h"

#include <sstream>

namespace et_trt {
namespace {

std::vector<IoSpec> copy_specs(const flatbuffers::Vector<flatbuffers::Offset<blob::TensorSpec>>& specs) {
  std::vector<IoSpec> out;
  for (const blob::TensorSpec* spec : specs) {
    IoSpec io{spec->name()->str(), spec->dtype(), {}};
    for (const blob::Dim* d : *spec->dims()) {
      io.dims.push_back({d->size(), d->name() ? d->name()->str() : "", d->min(), d->opt(), d->max()});
    }
    out.push_back(std::move(io));
  }
  return out;
}

// "1 input", "2 inputs".
std::string counted(size_t n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

}  // namespace

PartitionIo partition_io(const blob::Blob& blob) {
  PartitionIo io{copy_specs(*blob.inputs()), copy_specs(*blob.outputs()), {}};
  if (blob.checks() != nullptr) {
    for (const blob::Check* check : *blob.checks()) {
      io.checks.push_back({check->output()->name()->str(), check->message()->str()});
    }
  }
  return io;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

std::string spec_string(const IoSpec& spec) {
  std::ostringstream out;
  out << dtype_name(spec.dtype) << "[";
  for (size_t i = 0; i < spec.dims.size(); ++i) {
    const DimRange& d = spec.dims[i];
    out << (i ? ", " : "");
    if (d.size >= 0) {
      out << d.size;
    } else {
      out << (d.name.empty() ? "?" : d.name) << " in " << d.min << ".." << d.max;
    }
  }
  out << "]";
  return out.str();
}

std::string check_tensor(const IoSpec& spec, blob::DType dtype, const std::vector<int64_t>& shape) {
  const std::string expected = "; expected " + spec_string(spec) + ", got " + dtype_name(dtype) +
                               shape_string(shape);
  if (dtype != spec.dtype) {
    return "input '" + spec.name + "': dtype " + dtype_name(dtype) + " where the engine takes " +
           dtype_name(spec.dtype) + expected;
  }
  if (shape.size() != spec.dims.size()) {
    return "input '" + spec.name + "': rank " + std::to_string(shape.size()) + " where the engine takes rank " +
           std::to_string(spec.dims.size()) + expected;
  }
  for (size_t i = 0; i < shape.size(); ++i) {
    const DimRange& d = spec.dims[i];
    if (shape[i] < d.min || shape[i] > d.max) {
      std::ostringstream msg;
      msg << "input '" << spec.name << "': dim " << i << " is " << shape[i];
      if (d.size >= 0) {
        msg << " where the engine takes exactly " << d.size;
      } else {
        msg << " outside the exported range [" << d.min << ", " << d.max << "]"
            << (d.name.empty() ? "" : " of '" + d.name + "'")
            << " (widen it with the recipe's shape_ranges and re-export)";
      }
      return msg.str() + expected;
    }
  }
  return "";
}

bool match_call_inputs(const std::vector<CallArg>& args, const std::vector<IoSpec>& inputs,
                       std::vector<size_t>* tensor_args, std::string* error) {
  tensor_args->clear();
  size_t ints = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    switch (args[i].kind) {
      case CallArg::Kind::kTensor: tensor_args->push_back(i); break;
      case CallArg::Kind::kInt: ++ints; break;
      case CallArg::Kind::kOther:
        *error = "input argument " + std::to_string(i) + " is a " + args[i].type +
                 "; the delegate takes tensors and integer sizes only (re-export with this runtime's lowering)";
        return false;
    }
  }
  if (tensor_args->size() != inputs.size()) {
    std::string names;
    for (const IoSpec& spec : inputs) names += (names.empty() ? "'" : ", '") + spec.name + "'";
    *error = "the blob has " + counted(inputs.size(), "input") + " (" + (names.empty() ? "none" : names) +
             ") but the call passes " + counted(tensor_args->size(), "tensor argument") + " (and " +
             counted(ints, "integer argument") + ", skipped); the .pte does not match its delegate " +
             "blob (re-export it)";
    return false;
  }
  return true;
}

}  // namespace et_trt
