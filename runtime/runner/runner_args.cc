#include "runner_args.h"

#include <cerrno>
#include <cstdlib>
#include <set>

namespace et_trt::runner {
namespace {

bool parse_int(const std::string& text, long long lo, long long hi, long long* value) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *value = v;
  return true;
}

// "16x64" -> {16, 64}; "" (a scalar) -> {}.
bool parse_shape(const std::string& text, std::vector<int64_t>* shape) {
  shape->clear();
  if (text.empty() || text == "scalar") return true;
  size_t start = 0;
  while (true) {
    const size_t x = text.find('x', start);
    long long dim;
    if (!parse_int(text.substr(start, x == std::string::npos ? std::string::npos : x - start), 0, 1LL << 40, &dim)) {
      return false;
    }
    shape->push_back(dim);
    if (x == std::string::npos) return true;
    start = x + 1;
  }
}

// "INDEX=VALUE" for --input/--shape; a bare VALUE means the next unset index.
bool split_indexed(const std::string& text, size_t next_index, size_t* index, std::string* value) {
  const size_t eq = text.find('=');
  long long i;
  if (eq != std::string::npos && parse_int(text.substr(0, eq), 0, 1 << 20, &i)) {
    *index = static_cast<size_t>(i);
    *value = text.substr(eq + 1);
    return true;
  }
  *index = next_index;
  *value = text;
  return eq == std::string::npos;
}

}  // namespace

const char* usage() {
  return "usage: et_trt_runner MODEL.pte [options]\n"
         "  --data-path FILE.ptd    the program's data file (weights exported with --external-data)\n"
         "  --method NAME           method to run (default forward)\n"
         "  --input [I=]FILE        input I from a .npy file, or raw bytes in the method's dtype\n"
         "                          (repeat; without I=, inputs are taken in order)\n"
         "  --shape I=AxBxC         shape of random or raw input I (default: the method's planned shape)\n"
         "  --seed N                seed of random inputs (default 0); inputs without --input are random\n"
         "  --warmup N              untimed calls after the first (default 3)\n"
         "  --iterations N          timed calls after those: median, p99 (default 10); the first\n"
         "                          call is timed apart\n"
         "  --engine-cache DIR      where the TensorRT delegate keeps engines it builds\n"
         "                          (default $ET_TRT_ENGINE_CACHE, else ~/.cache/et_trt/engines)\n"
         "  --save-outputs DIR      write each output as DIR/output_<i>.npy\n";
}

std::string parse_args(const std::vector<std::string>& argv, RunnerArgs* args) {
  size_t next_input = 0;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      args->help = true;
      return "";
    }
    if (arg.rfind("--", 0) != 0) {
      if (!args->model.empty()) return "unexpected argument '" + arg + "': give one model";
      args->model = arg;
      continue;
    }
    static const std::set<std::string> kOptions = {"--data-path", "--method",     "--input",        "--shape",
                                                   "--seed",      "--warmup",     "--iterations",   "--engine-cache",
                                                   "--save-outputs"};
    if (!kOptions.count(arg)) return "unknown option " + arg;
    if (i + 1 >= argv.size()) return "option " + arg + " needs a value";
    const std::string& value = argv[++i];
    long long n;
    if (arg == "--data-path") {
      args->data_path = value;
    } else if (arg == "--method") {
      args->method = value;
    } else if (arg == "--input") {
      size_t index;
      std::string path;
      if (!split_indexed(value, next_input, &index, &path) || path.empty()) {
        return "--input " + value + ": write FILE or INDEX=FILE";
      }
      if (args->input_files.count(index)) return "--input: input " + std::to_string(index) + " given twice";
      args->input_files[index] = path;
      next_input = index + 1;
    } else if (arg == "--shape") {
      size_t index;
      std::string text;
      std::vector<int64_t> shape;
      if (value.find('=') == std::string::npos || !split_indexed(value, 0, &index, &text) ||
          !parse_shape(text, &shape)) {
        return "--shape " + value + ": write INDEX=AxBxC, e.g. 0=16x64";
      }
      args->shapes[index] = shape;
    } else if (arg == "--seed") {
      if (!parse_int(value, 0, 1LL << 62, &n)) return "--seed " + value + ": expected a non-negative integer";
      args->seed = static_cast<uint64_t>(n);
    } else if (arg == "--warmup") {
      if (!parse_int(value, 0, 1000000, &n)) return "--warmup " + value + ": expected an integer >= 0";
      args->warmup = static_cast<int>(n);
    } else if (arg == "--iterations") {
      if (!parse_int(value, 1, 100000000, &n)) return "--iterations " + value + ": expected an integer >= 1";
      args->iterations = static_cast<int>(n);
    } else if (arg == "--engine-cache") {
      args->engine_cache_dir = value;
    } else if (arg == "--save-outputs") {
      args->save_outputs_dir = value;
    }
  }
  if (args->model.empty()) return "no model given";
  return "";
}

}  // namespace et_trt::runner
