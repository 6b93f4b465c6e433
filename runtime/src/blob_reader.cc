#include "blob_reader.h"

#include <openssl/evp.h>
#include <zlib.h>

#include <cstring>
#include <iterator>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "build_options_generated.h"
#include "little_endian.h"
#include "utf8.h"

namespace et_trt {
namespace {

// zlib's crc32 takes a uInt length; feed it in chunks so any size works.
uint32_t crc32_of(const uint8_t* data, size_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (size > 0) {
    const uInt chunk = size > (1u << 30) ? (1u << 30) : static_cast<uInt>(size);
    crc = crc32(crc, data, chunk);
    data += chunk;
    size -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

bool fail(BlobError* error, std::string message, BlobError::Kind kind = BlobError::Kind::kInvalid) {
  error->kind = kind;
  error->message = std::move(message);
  return false;
}

// Every string of the blob must be UTF-8: they reach logs and ExecuTorch's log
// sinks, and the Python runtime's sink throws on anything else, which aborts
// the process. A refusal names the field, never its bytes.
bool check_strings(const blob::Blob* root, BlobError* error) {
  std::vector<std::pair<std::string, const flatbuffers::String*>> fields = {
      {"part", root->part()}, {"export_options", root->export_options()}, {"data_file", root->data_file()}};
  if (const blob::Producer* p = root->producer()) {
    for (const auto& [name, s] : {std::pair{"et_trt", p->et_trt()}, {"torch", p->torch()},
                                  {"executorch", p->executorch()}, {"triton", p->triton()},
                                  {"tensorrt", p->tensorrt()}}) {
      fields.emplace_back(std::string("producer.") + name, s);
    }
  }
  for (flatbuffers::uoffset_t i = 0; root->weights() != nullptr && i < root->weights()->size(); ++i) {
    const blob::Weight* w = root->weights()->Get(i);
    const std::string where = "weights[" + std::to_string(i) + "].";
    fields.emplace_back(where + "name", w->name());
    if (w->data()) fields.emplace_back(where + "data.key", w->data()->key());
  }
  for (const auto& [what, specs] : {std::pair{"inputs", root->inputs()}, {"outputs", root->outputs()}}) {
    for (flatbuffers::uoffset_t i = 0; specs != nullptr && i < specs->size(); ++i) {
      const std::string where = std::string(what) + "[" + std::to_string(i) + "]";
      fields.emplace_back(where + ".name", specs->Get(i)->name());
      const auto* dims = specs->Get(i)->dims();
      for (flatbuffers::uoffset_t d = 0; dims != nullptr && d < dims->size(); ++d) {
        fields.emplace_back(where + ".dims[" + std::to_string(d) + "].name", dims->Get(d)->name());
      }
    }
  }
  for (flatbuffers::uoffset_t i = 0; root->checks() != nullptr && i < root->checks()->size(); ++i) {
    const blob::Check* c = root->checks()->Get(i);
    const std::string where = "checks[" + std::to_string(i) + "].";
    fields.emplace_back(where + "message", c->message());
    if (c->output()) fields.emplace_back(where + "output.name", c->output()->name());
  }
  for (flatbuffers::uoffset_t i = 0; root->kernels() != nullptr && i < root->kernels()->size(); ++i) {
    const blob::KernelImage* k = root->kernels()->Get(i);
    const std::string where = "kernels[" + std::to_string(i) + "].";
    fields.insert(fields.end(), {{where + "kernel", k->kernel()}, {where + "variant", k->variant()},
                                 {where + "arch", k->arch()}, {where + "entry", k->entry()},
                                 {where + "ptx_version", k->ptx_version()}});
    if (k->image()) fields.emplace_back(where + "image.key", k->image()->key());
  }
  for (flatbuffers::uoffset_t i = 0; root->build_options() != nullptr && i < root->build_options()->size(); ++i) {
    const blob::BuildOption* o = root->build_options()->Get(i);
    const std::string where = "build_options[" + std::to_string(i) + "].";
    fields.emplace_back(where + "name", o->name());
    if (o->value_as_ChoiceValue()) fields.emplace_back(where + "value", o->value_as_ChoiceValue()->value());
  }
  for (flatbuffers::uoffset_t i = 0; root->engines() != nullptr && i < root->engines()->size(); ++i) {
    const blob::Engine* e = root->engines()->Get(i);
    const std::string where = "engines[" + std::to_string(i) + "].";
    fields.insert(fields.end(), {{where + "tensorrt_version", e->tensorrt_version()}, {where + "gpu_name", e->gpu_name()}});
    if (e->plan()) fields.emplace_back(where + "plan.key", e->plan()->key());
  }
  for (const auto& [where, s] : fields) {
    if (s != nullptr && !is_utf8(s->string_view())) {
      return fail(error, "blob field " + where + " is not UTF-8 text: the blob is corrupted");
    }
  }
  return true;
}

bool known_dtype(blob::DType dtype) {
  for (blob::DType d : blob::EnumValuesDType()) {
    if (d == dtype) return true;
  }
  return false;
}

// The dtypes a TensorRT network input or output may have (tensorrt_executor.cc binds them). The exporter
// writes no other: float64 is cast to float32 on ExecuTorch before and after the delegate (truncate_double).
bool bindable_dtype(blob::DType dtype) {
  return dtype != blob::DType::Float64 && dtype != blob::DType::Int16;
}

bool check_tensor_specs(const flatbuffers::Vector<flatbuffers::Offset<blob::TensorSpec>>* specs,
                        const char* what, std::set<std::string>* names, BlobError* error) {
  if (specs == nullptr) return fail(error, std::string("blob lists no ") + what);
  for (flatbuffers::uoffset_t i = 0; i < specs->size(); ++i) {
    const blob::TensorSpec* spec = specs->Get(i);
    std::ostringstream where;
    where << what << "[" << i << "]";
    if (spec->name() == nullptr || spec->name()->size() == 0) {
      return fail(error, where.str() + " has no name");
    }
    where << " '" << spec->name()->str() << "'";
    if (!names->insert(spec->name()->str()).second) {
      return fail(error, where.str() + ": tensor name used twice");
    }
    if (!known_dtype(spec->dtype())) {
      return fail(error, where.str() + ": unknown " + dtype_name(spec->dtype()));
    }
    if (!bindable_dtype(spec->dtype())) {
      return fail(error, where.str() + ": " + dtype_name(spec->dtype()) + ", which no TensorRT tensor holds; " +
                             "et-trt exports cast float64 to float32 outside the engine: re-export the .pte");
    }
    if (spec->dims() == nullptr) return fail(error, where.str() + " has no dims");
    if (spec->dims()->size() > kMaxRank) {
      return fail(error, where.str() + ": rank " + std::to_string(spec->dims()->size()) +
                             " exceeds TensorRT's maximum of " + std::to_string(kMaxRank));
    }
    for (flatbuffers::uoffset_t d = 0; d < spec->dims()->size(); ++d) {
      const blob::Dim* dim = spec->dims()->Get(d);
      const int64_t size = dim->size(), lo = dim->min(), opt = dim->opt(), hi = dim->max();
      std::ostringstream bad;
      bad << where.str() << " dim " << d << ": size " << size << ", range [" << lo << ", " << opt
          << ", " << hi << "] ";
      if (size >= 0 && !(lo == size && opt == size && hi == size)) {
        return fail(error, bad.str() + "(a static dim needs min = opt = max = size)");
      }
      if (size == -1 && !(0 <= lo && lo <= opt && opt <= hi)) {
        return fail(error, bad.str() + "(a dynamic dim needs 0 <= min <= opt <= max)");
      }
      if (size < -1) return fail(error, bad.str() + "(size must be >= 0, or -1 for dynamic)");
      if (hi > (int64_t(1) << 40)) return fail(error, bad.str() + "(max is implausibly large)");
    }
  }
  return true;
}

// Each check (table Check) names an engine output of its own, a bool scalar, and says what failed.
bool check_checks(const flatbuffers::Vector<flatbuffers::Offset<blob::Check>>* checks, std::set<std::string>* names,
                  BlobError* error) {
  for (flatbuffers::uoffset_t i = 0; checks != nullptr && i < checks->size(); ++i) {
    const blob::Check* check = checks->Get(i);
    const std::string where = "checks[" + std::to_string(i) + "]";
    if (check->output() == nullptr || check->output()->name() == nullptr || check->output()->name()->size() == 0) {
      return fail(error, where + " names no output");
    }
    const std::string name = check->output()->name()->str();
    if (!names->insert(name).second) return fail(error, where + " '" + name + "': tensor name used twice");
    if (check->output()->dtype() != blob::DType::Bool ||
        (check->output()->dims() != nullptr && check->output()->dims()->size() != 0)) {
      return fail(error, where + " '" + name + "': a check's output must be a bool scalar");
    }
    if (check->message() == nullptr || check->message()->size() == 0) {
      return fail(error, where + " '" + name + "' has no message");
    }
  }
  return true;
}

// A NamedData record: a key with our prefix, a size, a 32-byte sha256.
bool check_named_data(const blob::NamedData* data, const std::string& where, BlobError* error) {
  if (data == nullptr) return fail(error, where + " is missing");
  const std::string prefix = kNamedDataPrefix;
  if (data->key() == nullptr || data->key()->str().compare(0, prefix.size(), prefix) != 0) {
    return fail(error, where + ": key must start with \"" + prefix + "\"");
  }
  if (data->sha256() == nullptr || data->sha256()->size() != 32) return fail(error, where + ": sha256 must be 32 bytes");
  if (data->size() == 0) return fail(error, where + ": size is 0");
  return true;
}

bool check_kernels(const blob::Blob* root, BlobError* error) {
  if (root->kernels() == nullptr) return true;
  for (flatbuffers::uoffset_t i = 0; i < root->kernels()->size(); ++i) {
    const blob::KernelImage* k = root->kernels()->Get(i);
    const std::string where = "kernels[" + std::to_string(i) + "]";
    if (!check_named_data(k->image(), where + ".image", error)) return false;
    if (k->variant() == nullptr || k->variant()->size() == 0) return fail(error, where + " names no variant");
    if (k->entry() == nullptr || k->entry()->size() == 0) return fail(error, where + " has no entry symbol");
    if (k->arch() == nullptr || k->arch()->size() == 0) return fail(error, where + " names no architecture");
    if (k->format() != blob::ImageFormat::Cubin && k->format() != blob::ImageFormat::Ptx) {
      return fail(error, where + ": unknown image format " + std::to_string(int(k->format())));
    }
    if (k->dtype() != blob::DType::BFloat16 && k->dtype() != blob::DType::Float16) {
      return fail(error, where + ": kernel dtype must be bf16 or fp16, got " + dtype_name(k->dtype()));
    }
    // The MoE experts kernels' images ("moe_..."; moe_experts_launcher.h) say 0 for a block size that does not
    // apply to them (moe_route holds no rows, moe_combine no K); the grouped GEMM's use all three.
    const bool moe = k->kernel() != nullptr && k->kernel()->str().rfind("moe_", 0) == 0;
    if (moe && (k->num_warps() <= 0 || k->block_m() < 0 || k->block_n() < 0 || k->block_k() < 0)) {
      return fail(error, where + ": num_warps must be positive and block sizes must not be negative");
    }
    if (!moe && (k->num_warps() <= 0 || k->block_m() <= 0 || k->block_n() <= 0 || k->block_k() <= 0)) {
      return fail(error, where + ": num_warps and block sizes must be positive");
    }
    if (k->shared_bytes() < 0 || k->global_scratch_bytes() < 0 || k->profile_scratch_bytes() < 0) {
      return fail(error, where + ": negative shared or scratch size");
    }
    const int32_t align = k->global_scratch_align();
    if (k->global_scratch_bytes() > 0 && (align <= 0 || (align & (align - 1)) != 0)) {
      return fail(error, where + ": global_scratch_align must be a power of two");
    }
  }
  return true;
}

bool check_weights(const blob::Blob* root, BlobError* error) {
  std::set<std::string> names;
  for (flatbuffers::uoffset_t i = 0; root->weights() != nullptr && i < root->weights()->size(); ++i) {
    const blob::Weight* w = root->weights()->Get(i);
    const std::string where = "blob weights[" + std::to_string(i) + "]";
    if (w->name() == nullptr || w->name()->size() == 0) return fail(error, where + " has no name");
    if (!names.insert(w->name()->str()).second) return fail(error, where + ": initializer name used twice");
    if (!check_named_data(w->data(), where + ".data", error)) return false;
  }
  return true;
}

}  // namespace

std::string to_hex(const uint8_t* bytes, size_t size) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < size; ++i) {
    out += kHex[bytes[i] >> 4];
    out += kHex[bytes[i] & 15];
  }
  return out;
}

std::string BlobView::content_id_hex() const { return to_hex(header.content_id.data(), header.content_id.size()); }

std::string dtype_name(blob::DType dtype) {
  switch (dtype) {
    case blob::DType::UInt8: return "uint8";
    case blob::DType::Int8: return "int8";
    case blob::DType::Int16: return "int16";
    case blob::DType::Int32: return "int32";
    case blob::DType::Int64: return "int64";
    case blob::DType::Float16: return "fp16";
    case blob::DType::Float32: return "fp32";
    case blob::DType::Float64: return "fp64";
    case blob::DType::Bool: return "bool";
    case blob::DType::BFloat16: return "bf16";
  }
  return "dtype " + std::to_string(int(dtype));
}

size_t dtype_size(blob::DType dtype) {
  switch (dtype) {
    case blob::DType::UInt8: case blob::DType::Int8: case blob::DType::Bool: return 1;
    case blob::DType::Int16: case blob::DType::Float16: case blob::DType::BFloat16: return 2;
    case blob::DType::Int32: case blob::DType::Float32: return 4;
    case blob::DType::Int64: case blob::DType::Float64: return 8;
  }
  return 0;
}

bool read_blob(const void* data, size_t size, BlobView* view, BlobError* error) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  if (bytes == nullptr || size < kHeaderSize) {
    return fail(error, "blob is " + std::to_string(size) + " bytes, shorter than its " +
                           std::to_string(kHeaderSize) + "-byte header");
  }
  if (std::memcmp(bytes, kBlobMagic, sizeof(kBlobMagic)) != 0) {
    return fail(error, "blob does not start with magic \"ETTRTBLB\": not an et-trt delegate blob");
  }
  BlobHeader header;
  header.version = load_u32(bytes + 8);
  header.crc32 = load_u32(bytes + 12);
  header.payload_size = load_u64(bytes + 16);
  std::memcpy(header.content_id.data(), bytes + 24, header.content_id.size());
  if (header.version != kSchemaVersion) {
    return fail(error,
                "blob schema version " + std::to_string(header.version) + ", this runtime reads version " +
                    std::to_string(kSchemaVersion) + ": re-export the model with a matching et-trt",
                BlobError::Kind::kIncompatible);
  }
  if (header.payload_size != size - kHeaderSize) {
    return fail(error, "blob header says the payload is " + std::to_string(header.payload_size) +
                           " bytes but " + std::to_string(size - kHeaderSize) +
                           " follow the header: truncated or extended");
  }
  const uint32_t crc = crc32_of(bytes + 16, size - 16);
  if (crc != header.crc32) {
    std::ostringstream msg;
    msg << "blob checksum mismatch (crc32 stored 0x" << std::hex << header.crc32 << ", computed 0x" << crc
        << "): the blob is corrupted";
    return fail(error, msg.str());
  }
  const uint8_t* payload = bytes + kHeaderSize;
  // The content id keys the engine cache, so it must be the payload's.
  std::array<uint8_t, EVP_MAX_MD_SIZE> digest{};
  unsigned int digest_size = 0;
  if (EVP_Digest(payload, static_cast<size_t>(header.payload_size), digest.data(), &digest_size, EVP_sha256(),
                 nullptr) != 1 ||
      digest_size != header.content_id.size() ||
      std::memcmp(digest.data(), header.content_id.data(), digest_size) != 0) {
    return fail(error, "blob content id (sha256) does not match its payload: the blob is corrupted");
  }
  if (reinterpret_cast<uintptr_t>(payload) % 8 != 0) {
    return fail(error, "blob payload is not 8-byte aligned in memory (caller must align it)");
  }
  if (header.payload_size > FLATBUFFERS_MAX_BUFFER_SIZE) {
    return fail(error, "blob payload exceeds the flatbuffers limit of 2 GiB");
  }
  flatbuffers::Verifier verifier(payload, static_cast<size_t>(header.payload_size));
  if (!blob::VerifyBlobBuffer(verifier)) {
    return fail(error, "blob payload fails flatbuffers verification (schema.fbs, identifier \"ETRT\")");
  }
  const blob::Blob* root = blob::GetBlob(payload);
  if (!check_strings(root, error)) return false;

  if (root->producer() == nullptr) return fail(error, "blob lacks its producer record");
  std::set<std::string> names;
  if (!check_tensor_specs(root->inputs(), "inputs", &names, error)) return false;
  if (!check_tensor_specs(root->outputs(), "outputs", &names, error)) return false;
  if (root->outputs()->size() == 0) return fail(error, "blob lists no outputs");
  if (!check_checks(root->checks(), &names, error)) return false;
  BuildOptions build_options;
  std::string message;
  if (!build_options.decode(root->build_options(), build_option::kSpecs, std::size(build_option::kSpecs),
                                  &message)) {
    return fail(error, "blob " + message);
  }
  const bool has_engines = root->engines() != nullptr && root->engines()->size() > 0;
  if (has_engines) {
    for (flatbuffers::uoffset_t i = 0; i < root->engines()->size(); ++i) {
      const blob::Engine* engine = root->engines()->Get(i);
      const std::string where = "blob engines[" + std::to_string(i) + "]";
      if (blob::EnumNameProvider(engine->provider())[0] == '\0') {
        return fail(error, where + ": unknown provider " + std::to_string(int(engine->provider())));
      }
      if (!check_named_data(engine->plan(), where + ".plan", error)) return false;
      if (engine->tensorrt_version() == nullptr || engine->tensorrt_version()->size() == 0) {
        return fail(error, where + " lacks its provider's version");
      }
    }
  }
  if ((root->onnx() == nullptr || root->onnx()->size() == 0) && !has_engines) {
    return fail(error, "blob has neither an ONNX model nor an engine: nothing to run");
  }
  if (!check_kernels(root, error)) return false;
  if (!check_weights(root, error)) return false;

  view->header = header;
  view->root = root;
  view->build_options = std::move(build_options);
  return true;
}

bool read_blob_copy(const void* data, size_t size, std::vector<uint64_t>* storage, BlobView* view,
                    BlobError* error) {
  if (data == nullptr) return read_blob(nullptr, size, view, error);
  storage->assign(size / 8 + 1, 0);
  if (size > 0) std::memcpy(storage->data(), data, size);
  return read_blob(storage->data(), size, view, error);
}

}  // namespace et_trt
