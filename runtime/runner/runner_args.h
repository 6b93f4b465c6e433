// Command line of et_trt_runner.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace et_trt::runner {

struct RunnerArgs {
  std::string model;                          // .pte path
  std::string data_path;                      // the .ptd holding the program's external data, if any
  std::string method = "forward";
  std::map<size_t, std::string> input_files;  // input index -> .npy or raw file
  std::map<size_t, std::vector<int64_t>> shapes;  // input index -> shape for random/raw inputs
  uint64_t seed = 0;
  int warmup = 3;                             // untimed calls after the first
  int iterations = 10;                        // timed calls after the warm-up
  std::string engine_cache_dir;               // load-time option of the TensorRT delegate
  std::string save_outputs_dir;               // writes output_<i>.npy there
  bool help = false;
};

const char* usage();

// Empty on success, else what is wrong with the command line.
std::string parse_args(const std::vector<std::string>& argv, RunnerArgs* args);

}  // namespace et_trt::runner
