// fetch_named_data over the blob the Python writer made with an external
// weight (writer_weights.blob and its named data, make_test_blobs.py): found
// and checked, or refused naming the key and the data file.
#include <gtest/gtest.h>

#include "named_data.h"
#include "test_blobs.h"

namespace et_trt {
namespace {

// The blob and its named data: key -> bytes.
struct WriterWeights {
  testing::Bytes blob;
  BlobView view;
  std::map<std::string, std::vector<uint8_t>> named;
};

WriterWeights writer_weights() {
  WriterWeights w;
  w.blob = testing::Bytes::of(testing::read_file(testing::blob_dir() + "/writer_weights.blob"));
  BlobError error;
  EXPECT_TRUE(read_blob(w.blob.data(), w.blob.size, &w.view, &error)) << error.message;
  w.named = testing::read_named_data(testing::blob_dir() + "/writer_weights.named");
  return w;
}

bool fetch(const WriterWeights& w, const std::map<std::string, std::vector<uint8_t>>& named, PartitionData* out,
           std::string* error) {
  return testing::fetch_from(*w.view.root, named, out, error);
}

TEST(NamedData, FetchesAndChecksTheWeights) {
  const WriterWeights w = writer_weights();
  ASSERT_EQ(w.named.size(), 1u);
  PartitionData data;
  std::string error;
  ASSERT_TRUE(fetch(w, w.named, &data, &error)) << error;
  ASSERT_EQ(data.weights.size(), 1u);
  EXPECT_EQ(data.weights[0].first, "w");
  EXPECT_EQ(data.weights[0].second.size, 16u * 32u * 4u);
  EXPECT_EQ(data.weights[0].second.data, w.named.begin()->second.data());  // not copied
}

TEST(NamedData, MissingDataNamesTheKeyAndTheDataFile) {
  const WriterWeights w = writer_weights();
  PartitionData data;
  std::string error;
  EXPECT_FALSE(fetch(w, {}, &data, &error));
  const std::string key = w.named.begin()->first;
  EXPECT_NE(error.find("part 'head': weight 'w' (named data " + key + ", 2048 bytes) is not in the program's named "
                       "data"), std::string::npos) << error;
  EXPECT_NE(error.find("exported to 'policy.ptd': load the program with that file"), std::string::npos) << error;
}

TEST(NamedData, DataOfAnotherExportIsSaidToBe) {
  const WriterWeights w = writer_weights();
  PartitionData data;
  std::string error;
  const std::map<std::string, std::vector<uint8_t>> other = {{"et_trt/" + std::string(64, 'e'), {1, 2, 3}}};
  EXPECT_FALSE(fetch(w, other, &data, &error));
  EXPECT_NE(error.find("The program's data holds 0 of this part's 1 named data (1 et-trt entries in all): the data "
                       "file it was loaded with is from another export, or damaged; load the program with the "
                       "'policy.ptd' exported with this .pte"),
            std::string::npos) << error;
}

TEST(NamedData, DataOfAnotherSizeOrDigestIsRefused) {
  const WriterWeights w = writer_weights();
  PartitionData data;
  std::string error;
  auto shorter = w.named;
  shorter.begin()->second.pop_back();
  EXPECT_FALSE(fetch(w, shorter, &data, &error));
  EXPECT_NE(error.find("holds 2047 bytes: 'policy.ptd' is from another export or damaged"), std::string::npos)
      << error;
  auto flipped = w.named;
  flipped.begin()->second[100] ^= 1;
  EXPECT_FALSE(fetch(w, flipped, &data, &error));
  EXPECT_NE(error.find("'policy.ptd' is corrupted or from another export"), std::string::npos) << error;
}

}  // namespace
}  // namespace et_trt
