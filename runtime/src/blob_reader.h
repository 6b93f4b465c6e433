// Reads and verifies one delegate blob (layout: et_trt_backend/serialization/schema.fbs).
//
// Nothing here depends on ExecuTorch or TensorRT, so the reader is unit- and
// fuzz-tested on its own; backend.cc maps BlobError to ExecuTorch errors.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "build_options.h"
#include "schema_generated.h"

namespace et_trt {

// Must equal SCHEMA_VERSION in et_trt_backend/serialization/blob.py.
constexpr uint32_t kSchemaVersion = 4;
// Must equal NAMED_DATA_PREFIX there: every NamedData key starts with it.
constexpr char kNamedDataPrefix[] = "et_trt/";
constexpr char kBlobMagic[8] = {'E', 'T', 'T', 'R', 'T', 'B', 'L', 'B'};
constexpr size_t kHeaderSize = 56;
// TensorRT's Dims::MAX_DIMS; a higher rank cannot be bound.
constexpr size_t kMaxRank = 8;

struct BlobError {
  enum class Kind {
    kInvalid,       // corrupted or malformed: ExecuTorch's InvalidProgram
    kIncompatible,  // well-formed but written for another reader: DelegateInvalidCompatibility
  };
  Kind kind = Kind::kInvalid;
  std::string message;
};

struct BlobHeader {
  uint32_t version = 0;
  uint32_t crc32 = 0;
  uint64_t payload_size = 0;
  std::array<uint8_t, 32> content_id{};  // sha256 of the payload
};

// A verified blob. `root` points into the buffer given to read_blob, which
// must outlive the view.
struct BlobView {
  BlobHeader header;
  const blob::Blob* root = nullptr;
  BuildOptions build_options;  // root's, decoded

  std::string content_id_hex() const;
};

// Checks the header (magic, version, size, crc32), runs the flatbuffers
// Verifier over the payload, then checks what the schema cannot express
// (enum ranges, dimension ranges, required fields). Returns false and fills
// `error` on the first problem; never reads outside [data, data + size).
// The payload must be 8-byte aligned in memory (backend.cc copies otherwise).
bool read_blob(const void* data, size_t size, BlobView* view, BlobError* error);

// read_blob over an 8-byte aligned copy of `data` kept in `storage` (which
// the view then points into), for callers whose bytes may be unaligned.
bool read_blob_copy(const void* data, size_t size, std::vector<uint64_t>* storage, BlobView* view,
                    BlobError* error);

// Lowercase hex of `size` bytes.
std::string to_hex(const uint8_t* bytes, size_t size);

// Name of a blob DType ("bf16", ...), or "dtype <code>" for unknown codes.
std::string dtype_name(blob::DType dtype);
// Size in bytes of one element, 0 for an unknown code.
size_t dtype_size(blob::DType dtype);

}  // namespace et_trt
