// What the device checks' C entries (launch_check.cc, moe_plugin_check.cc) share: a blob and its named data,
// as a caller hands them over, verified by the runtime's blob reader and their kernel images registered as init
// registers them; errors copied into the caller's buffer.
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "blob_reader.h"
#include "kernel_images.h"
#include "named_data.h"

namespace et_trt::tools {

inline void copy_error(const std::string& message, char* error, size_t error_size) {
  if (error != nullptr && error_size > 0) std::snprintf(error, error_size, "%s", message.c_str());
}

// The registered kernel images of `blob_bytes` with its named data as `count` (key, bytes, size) entries;
// nullptr, the reason in `error`, where the blob or its named data is refused.
inline std::shared_ptr<const KernelPack> register_blob_images(const uint8_t* blob_bytes, size_t size,
                                                              const char* const* keys, const uint8_t* const* data,
                                                              const size_t* sizes, size_t count, char* error,
                                                              size_t error_size) {
  std::vector<uint64_t> aligned;
  BlobView view;
  BlobError blob_error;
  if (!read_blob_copy(blob_bytes, size, &aligned, &view, &blob_error)) {
    copy_error("blob refused: " + blob_error.message, error, error_size);
    return nullptr;
  }
  PartitionData named;
  std::string message;
  if (!fetch_named_data(*view.root, CallerNamedData(keys, data, sizes, count), &named, &message)) {
    copy_error(message, error, error_size);
    return nullptr;
  }
  return register_kernel_images(*view.root, named.kernel_images);
}

}  // namespace et_trt::tools
