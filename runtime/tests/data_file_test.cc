// et_trt::verify_data_file over the .ptd make_test_blobs.py writes with
// ExecuTorch's own serializer, and over damaged copies of it: among them the
// two edits that crash ExecuTorch's FlatTensorDataMap when it reads them
// unchecked (issue 34). Each refusal is one line naming the file.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "et_trt/data_file.h"
#include "flat_tensor_generated.h"
#include "little_endian.h"
#include "test_blobs.h"

namespace et_trt {
namespace {

std::string good_ptd() { return testing::blob_dir() + "/writer_mlp.ptd"; }

// `bytes` in a fresh file; removed at the end of the test.
class TempFile {
 public:
  explicit TempFile(const std::vector<uint8_t>& bytes) {
    char name[] = "/tmp/et_trt_data_file_test_XXXXXX";
    const int fd = mkstemp(name);
    EXPECT_GE(fd, 0);
    close(fd);
    path_ = name;
    std::ofstream(path_, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The one-line refusal of `bytes`.
std::string refusal(const std::vector<uint8_t>& bytes) {
  TempFile file(bytes);
  std::string error;
  EXPECT_FALSE(verify_data_file(file.path(), &error));
  EXPECT_EQ(error.rfind(file.path() + ": ", 0), 0u) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  return error;
}

size_t offset_in(const std::vector<uint8_t>& ptd, const void* p) {
  return static_cast<const uint8_t*>(p) - ptd.data();
}

TEST(DataFile, AcceptsWhatExecuTorchWrites) {
  for (const std::string name : {"writer_weights.ptd", "writer_mlp.ptd"}) {
    std::string error;
    EXPECT_TRUE(verify_data_file(testing::blob_dir() + "/" + name, &error)) << error;
    EXPECT_TRUE(error.empty());
  }
}

TEST(DataFile, RefusesAWildRootTableVtableOffset) {
  std::vector<uint8_t> ptd = testing::read_file(good_ptd());
  const uint32_t root = load_u32(ptd.data());
  testing::store_u32(ptd.data() + root, 0x7fff0000);  // the root table's soffset to its vtable
  EXPECT_NE(refusal(ptd).find("its flatbuffer (the key table, "), std::string::npos);
}

TEST(DataFile, RefusesAWildNamedDataEntryOffset) {
  std::vector<uint8_t> ptd = testing::read_file(good_ptd());
  const auto* named = flat_tensor_flatbuffer::GetFlatTensor(ptd.data())->named_data();
  const size_t first_entry = offset_in(ptd, named) + 4;  // after the vector's length
  testing::store_u32(ptd.data() + first_entry, 0x40000000);
  EXPECT_NE(refusal(ptd).find("fails the flatbuffers Verifier"), std::string::npos);
}

TEST(DataFile, RefusesTruncationsAndHeadersPastTheEnd) {
  const std::vector<uint8_t> ptd = testing::read_file(good_ptd());
  EXPECT_NE(refusal({ptd.begin(), ptd.begin() + 40}).find("40 bytes, too short for an ExecuTorch data file"),
            std::string::npos);
  EXPECT_NE(refusal({ptd.begin(), ptd.end() - 1}).find("past the file's end (" + std::to_string(ptd.size() - 1)),
            std::string::npos);
  std::vector<uint8_t> wild = ptd;
  wild[23] = 0x80;  // the flatbuffer size's top byte
  EXPECT_NE(refusal(wild).find("its header announces a flatbuffer of"), std::string::npos);
}

TEST(DataFile, RefusesAProgramAndAnythingElse) {
  EXPECT_NE(refusal(testing::read_file(testing::blob_dir() + "/cpu_mlp.pte"))
                .find("an ExecuTorch program (.pte), not a data file (.ptd)"),
            std::string::npos);
  EXPECT_NE(refusal(std::vector<uint8_t>(100, 'x')).find("no 'FT01' identifier"), std::string::npos);
}

TEST(DataFile, RefusesAKeyThatIsNotUtf8AndASegmentOutOfRange) {
  const std::vector<uint8_t> ptd = testing::read_file(good_ptd());
  const auto* root = flat_tensor_flatbuffer::GetFlatTensor(ptd.data());
  std::vector<uint8_t> bad_key = ptd;
  bad_key[offset_in(ptd, root->named_data()->Get(1)->key()->c_str()) + 3] = 0xFF;
  EXPECT_NE(refusal(bad_key).find("named data 1's key is not UTF-8 text"), std::string::npos);
  std::vector<uint8_t> bad_index = ptd;
  const uint8_t* index =
      testing::field_address(root->named_data()->Get(1), flat_tensor_flatbuffer::NamedData::VT_SEGMENT_INDEX);
  ASSERT_NE(index, nullptr);  // segment 1 (0, the default, is not stored)
  testing::store_u32(bad_index.data() + offset_in(ptd, index), 7);
  EXPECT_NE(refusal(bad_index).find("named data 1 points at segment 7 of 2"), std::string::npos);
  std::vector<uint8_t> long_segment = ptd;
  const uint8_t* size =
      testing::field_address(root->segments()->Get(1), flat_tensor_flatbuffer::DataSegment::VT_SIZE);
  ASSERT_NE(size, nullptr);
  long_segment[offset_in(ptd, size) + 4] = 1;  // 4 GiB more
  EXPECT_NE(refusal(long_segment).find("segment 1 ("), std::string::npos);
}

TEST(DataFile, NamesAFileItCannotOpen) {
  std::string error;
  EXPECT_FALSE(verify_data_file(testing::blob_dir() + "/none.ptd", &error));
  EXPECT_EQ(error, "cannot open data file " + testing::blob_dir() + "/none.ptd (No such file or directory)");
  EXPECT_FALSE(verify_data_file(testing::blob_dir(), &error));
  EXPECT_EQ(error, "cannot open data file " + testing::blob_dir() + " (not a regular file)");
  EXPECT_FALSE(verify_data_file(testing::blob_dir() + "/none.ptd"));  // the message is optional
}

}  // namespace
}  // namespace et_trt
