// et_trt_runner's command line: what it accepts and how it refuses.
#include <gtest/gtest.h>

#include "runner_args.h"

namespace et_trt::runner {
namespace {

std::string parse(std::vector<std::string> argv, RunnerArgs* args) { return parse_args(argv, args); }

TEST(RunnerArgs, ParsesEveryOption) {
  RunnerArgs a;
  ASSERT_EQ(parse({"m.pte", "--method", "act", "--input", "x.npy", "--input", "2=z.bin", "--shape", "2=4x8",
                   "--seed", "7", "--warmup", "0", "--iterations", "5", "--engine-cache", "/c", "--save-outputs",
                   "/o"},
                  &a),
            "");
  EXPECT_EQ(a.model, "m.pte");
  EXPECT_EQ(a.method, "act");
  EXPECT_EQ(a.input_files.at(0), "x.npy");
  EXPECT_EQ(a.input_files.at(2), "z.bin");
  EXPECT_EQ(a.shapes.at(2), (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(a.seed, 7u);
  EXPECT_EQ(a.warmup, 0);
  EXPECT_EQ(a.iterations, 5);
  EXPECT_EQ(a.engine_cache_dir, "/c");
  EXPECT_EQ(a.save_outputs_dir, "/o");
}

TEST(RunnerArgs, RefusesWithAMessage) {
  RunnerArgs a;
  EXPECT_EQ(parse({}, &a), "no model given");
  EXPECT_EQ(parse({"m.pte", "--iterations", "0"}, &(a = {})), "--iterations 0: expected an integer >= 1");
  EXPECT_EQ(parse({"m.pte", "--iterations", "5x"}, &(a = {})), "--iterations 5x: expected an integer >= 1");
  EXPECT_EQ(parse({"m.pte", "--seed", "-1"}, &(a = {})), "--seed -1: expected a non-negative integer");
  EXPECT_EQ(parse({"m.pte", "--warmup"}, &(a = {})), "option --warmup needs a value");
  EXPECT_EQ(parse({"m.pte", "--bogus", "1"}, &(a = {})), "unknown option --bogus");
  EXPECT_EQ(parse({"m.pte", "--bogus"}, &(a = {})), "unknown option --bogus");
  EXPECT_EQ(parse({"m.pte", "n.pte"}, &(a = {})), "unexpected argument 'n.pte': give one model");
  EXPECT_EQ(parse({"m.pte", "--shape", "4x8"}, &(a = {})), "--shape 4x8: write INDEX=AxBxC, e.g. 0=16x64");
  EXPECT_EQ(parse({"m.pte", "--shape", "0=4xq"}, &(a = {})), "--shape 0=4xq: write INDEX=AxBxC, e.g. 0=16x64");
  EXPECT_EQ(parse({"m.pte", "--input", "0=a.npy", "--input", "0=b.npy"}, &(a = {})),
            "--input: input 0 given twice");
}

TEST(RunnerArgs, HelpNeedsNoModel) {
  RunnerArgs a;
  EXPECT_EQ(parse({"--help"}, &a), "");
  EXPECT_TRUE(a.help);
}

}  // namespace
}  // namespace et_trt::runner
