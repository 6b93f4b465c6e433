// The blob's named data: the partition's weights and embedded engine plans,
// which ExecuTorch keeps outside the blob (in the .pte's data segment or a
// .ptd file; schema.fbs, table NamedData). Fetched at init and checked
// against the blob's sizes and sha256 digests before anything uses them.
//
// No ExecuTorch here: the delegate fetches from the init context's
// NamedDataMap (backend.cc), the C entry for export-time builds from arrays
// the caller passes (c_api.cc).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "schema_generated.h"

namespace et_trt {

// Bytes owned elsewhere, kept alive by `owner` (may be null where the caller
// keeps them alive).
struct NamedBytes {
  const void* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> owner;
};

// Where named data comes from.
class NamedDataSource {
 public:
  virtual ~NamedDataSource() = default;
  // The bytes stored under `key`; false with *error (the source's reason) if it has none.
  virtual bool get(const std::string& key, NamedBytes* out, std::string* error) const = 0;
  // Every key it holds (to tell a data file of another export from a missing one).
  virtual std::vector<std::string> keys() const = 0;
};

// Named data a C caller passes as `count` (key, bytes, size) arrays, for the
// C entry points (export-time builds, the plugin library, the launch check);
// the caller keeps the bytes alive.
class CallerNamedData final : public NamedDataSource {
 public:
  CallerNamedData(const char* const* keys, const uint8_t* const* data, const size_t* sizes, size_t count);
  bool get(const std::string& key, NamedBytes* out, std::string* error) const override;
  std::vector<std::string> keys() const override;

 private:
  std::unordered_map<std::string, NamedBytes> entries_;
};

// A blob's named data, fetched and checked.
struct PartitionData {
  std::vector<std::pair<std::string, NamedBytes>> weights;  // ONNX initializer name, its bytes (blob order)
  std::vector<NamedBytes> kernel_images;                     // one per blob kernel image, in order
  std::vector<NamedBytes> engine_plans;                      // one per blob engine, in order
};

// Fetches every weight, kernel image and engine plan the blob names from `source` and checks
// each one's size and sha256. False with *error naming the part, the key and
// the data file the blob says holds it, and why it is missing: the program was
// loaded without it, or with a data file of another export (its et-trt keys
// are none of this blob's), or one that lacks some of them; or saying the data
// does not match (corrupted, or from another export).
bool fetch_named_data(const blob::Blob& blob, const NamedDataSource& source, PartitionData* out, std::string* error);

}  // namespace et_trt
