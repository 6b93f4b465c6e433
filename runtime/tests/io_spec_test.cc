// Run-time checks of actual inputs against a partition's IO specs.
#include <gtest/gtest.h>

#include "io_spec.h"
#include "test_blobs.h"

namespace et_trt {
namespace {

IoSpec tokens_by_16() {
  return {"obs", blob::DType::BFloat16, {{-1, "tokens", 2, 64, 512}, {16, "obs:1", 16, 16, 16}}};
}

TEST(IoSpec, AcceptsShapesInsideTheProfile) {
  EXPECT_EQ(check_tensor(tokens_by_16(), blob::DType::BFloat16, {2, 16}), "");
  EXPECT_EQ(check_tensor(tokens_by_16(), blob::DType::BFloat16, {512, 16}), "");
}

TEST(IoSpec, RefusesWrongDtypeNamingBoth) {
  const std::string e = check_tensor(tokens_by_16(), blob::DType::Float32, {8, 16});
  EXPECT_NE(e.find("input 'obs': dtype fp32 where the engine takes bf16"), std::string::npos) << e;
}

TEST(IoSpec, RefusesWrongRank) {
  const std::string e = check_tensor(tokens_by_16(), blob::DType::BFloat16, {8, 16, 1});
  EXPECT_NE(e.find("rank 3 where the engine takes rank 2"), std::string::npos) << e;
}

TEST(IoSpec, RefusesDynamicDimOutsideItsRange) {
  const std::string e = check_tensor(tokens_by_16(), blob::DType::BFloat16, {513, 16});
  EXPECT_NE(e.find("dim 0 is 513 outside the exported range [2, 512] of 'tokens'"), std::string::npos) << e;
  EXPECT_NE(e.find("shape_ranges"), std::string::npos) << e;
  EXPECT_NE(check_tensor(tokens_by_16(), blob::DType::BFloat16, {1, 16}), "");
}

TEST(IoSpec, RefusesStaticDimMismatch) {
  const std::string e = check_tensor(tokens_by_16(), blob::DType::BFloat16, {8, 15});
  EXPECT_NE(e.find("dim 1 is 15 where the engine takes exactly 16"), std::string::npos) << e;
  EXPECT_NE(e.find("expected bf16[tokens in 2..512, 16], got bf16[8, 15]"), std::string::npos) << e;
}

// A policy exported with Dim("batch", min=1) and Dim("tokens", min=1): the blob
// the partitioner wrote (make_test_blobs.py) lets batch 1 and one token in.
TEST(IoSpec, ExportedRangesStartAtOne) {
  const std::string dir = testing::blob_dir();
  ASSERT_FALSE(dir.empty()) << "ET_TRT_TEST_BLOBS is not set (ctest sets it)";
  testing::Bytes bytes = testing::Bytes::of(testing::read_file(dir + "/exported_batch1.blob"));
  BlobView view;
  BlobError error;
  ASSERT_TRUE(read_blob(bytes.data(), bytes.size, &view, &error)) << error.message;
  const PartitionIo io = partition_io(*view.root);
  ASSERT_EQ(io.inputs.size(), 1u);
  const IoSpec& x = io.inputs[0];
  ASSERT_EQ(x.dims.size(), 3u);
  EXPECT_EQ(x.dims[0].name, "batch");
  EXPECT_EQ(x.dims[1].name, "tokens");
  EXPECT_EQ(check_tensor(x, x.dtype, {1, 1, 16}), "");
  EXPECT_EQ(check_tensor(x, x.dtype, {1, 64, 16}), "");
  EXPECT_EQ(check_tensor(x, x.dtype, {8, 1, 16}), "");
  const std::string e = check_tensor(x, x.dtype, {0, 1, 16});
  EXPECT_NE(e.find("dim 0 is 0 outside the exported range [1, 8] of 'batch'"), std::string::npos) << e;
  EXPECT_NE(check_tensor(x, x.dtype, {9, 1, 16}), "");
}

// The delegate call's input arguments against the blob's inputs: Int sizes
// shared between partitions are skipped, tensors are matched in order.
std::vector<IoSpec> obs_and_state() {
  return {tokens_by_16(), {"state", blob::DType::Float32, {{8, "state:0", 8, 8, 8}}}};
}

const CallArg kTensor{CallArg::Kind::kTensor, "Tensor"};
const CallArg kInt{CallArg::Kind::kInt, "Int"};

TEST(CallInputs, TensorsOnlyMatchInOrder) {
  std::vector<size_t> tensor_args{99};  // replaced, not appended to
  std::string error;
  ASSERT_TRUE(match_call_inputs({kTensor, kTensor}, obs_and_state(), &tensor_args, &error)) << error;
  EXPECT_EQ(tensor_args, (std::vector<size_t>{0, 1}));
}

TEST(CallInputs, IntArgumentsAreSkipped) {
  std::vector<size_t> tensor_args;
  std::string error;
  ASSERT_TRUE(match_call_inputs({kInt, kTensor, kInt, kTensor, kInt}, obs_and_state(), &tensor_args, &error))
      << error;
  EXPECT_EQ(tensor_args, (std::vector<size_t>{1, 3}));
  ASSERT_TRUE(match_call_inputs({kTensor, kTensor, kInt}, obs_and_state(), &tensor_args, &error));
  EXPECT_EQ(tensor_args, (std::vector<size_t>{0, 1}));
}

TEST(CallInputs, RefusesAnotherTensorCountNamingBothCounts) {
  std::vector<size_t> tensor_args;
  std::string error;
  EXPECT_FALSE(match_call_inputs({kTensor, kInt}, obs_and_state(), &tensor_args, &error));
  EXPECT_NE(error.find("the blob has 2 inputs ('obs', 'state') but the call passes 1 tensor argument (and 1 "
                       "integer argument, skipped)"),
            std::string::npos)
      << error;
  error.clear();
  EXPECT_FALSE(match_call_inputs({kTensor, kTensor, kTensor}, obs_and_state(), &tensor_args, &error));
  EXPECT_NE(error.find("has 2 inputs ('obs', 'state') but the call passes 3 tensor arguments"),
            std::string::npos)
      << error;
  // Ints never stand in for a missing tensor.
  error.clear();
  EXPECT_FALSE(match_call_inputs({kInt, kInt}, obs_and_state(), &tensor_args, &error));
  EXPECT_NE(error.find("the call passes 0 tensor arguments (and 2 integer arguments"),
            std::string::npos)
      << error;
}

TEST(CallInputs, RefusesOtherArgumentKindsNamingThem) {
  std::vector<size_t> tensor_args;
  std::string error;
  EXPECT_FALSE(match_call_inputs({kTensor, {CallArg::Kind::kOther, "Double"}, kTensor}, obs_and_state(),
                                 &tensor_args, &error));
  EXPECT_NE(error.find("input argument 1 is a Double; the delegate takes tensors and integer sizes only"),
            std::string::npos)
      << error;
}

}  // namespace
}  // namespace et_trt
