// The delegate as ExecuTorch calls it: registration, and the error each
// refusal returns (blob problems, missing TensorRT).
#include <executorch/runtime/backend/interface.h>
#include <gtest/gtest.h>

#include "backend_id.h"
#include "test_blobs.h"

namespace et_trt {
namespace {

using executorch::runtime::BackendInitContext;
using executorch::runtime::BackendInterface;
using executorch::runtime::Error;
using executorch::runtime::FreeableBuffer;

Error init_error(const std::vector<uint8_t>& blob, size_t misalign = 0) {
  BackendInterface* backend = executorch::runtime::get_backend_class(kBackendId);
  EXPECT_NE(backend, nullptr) << kBackendId << " is not registered";
  if (backend == nullptr) return Error::Ok;
  std::vector<uint64_t> storage(blob.size() / 8 + 2);
  uint8_t* data = reinterpret_cast<uint8_t*>(storage.data()) + misalign;
  std::memcpy(data, blob.data(), blob.size());
  FreeableBuffer processed(data, blob.size(), nullptr);
  BackendInitContext context(nullptr);
  auto handle = backend->init(context, &processed, {});
  EXPECT_FALSE(handle.ok()) << "init accepted a blob it cannot run here";
  if (handle.ok()) backend->destroy(handle.get());
  return handle.error();
}

std::vector<uint8_t> writer_blob() {
  return testing::read_file(testing::blob_dir() + "/writer_dynamic.blob");
}

TEST(Backend, IsRegisteredAndAvailable) {
  BackendInterface* backend = executorch::runtime::get_backend_class(kBackendId);
  ASSERT_NE(backend, nullptr);
  EXPECT_TRUE(backend->is_available());
}

TEST(Backend, AValidBlobReachesTheEngineWhichReportsTensorRTMissing) {
  const std::vector<uint8_t> blob = writer_blob();
  ASSERT_FALSE(blob.empty());
  EXPECT_EQ(init_error(blob), Error::NotSupported);
  EXPECT_EQ(init_error(blob, 4), Error::NotSupported);  // misaligned: copied, then read
}

TEST(Backend, CorruptBlobIsInvalidProgram) {
  std::vector<uint8_t> blob = writer_blob();
  blob[blob.size() / 2] ^= 0x04;
  EXPECT_EQ(init_error(blob), Error::InvalidProgram);
  EXPECT_EQ(init_error(std::vector<uint8_t>(blob.begin(), blob.begin() + 30)), Error::InvalidProgram);
}

TEST(Backend, OtherSchemaVersionIsDelegateInvalidCompatibility) {
  std::vector<uint8_t> blob = writer_blob();
  testing::store_u32(blob.data() + 8, kSchemaVersion + 1);
  EXPECT_EQ(init_error(blob), Error::DelegateInvalidCompatibility);
}

}  // namespace
}  // namespace et_trt
