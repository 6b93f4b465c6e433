// et_trt_runner: runs a .pte through ExecuTorch's Module API, with the
// TensorRT delegate linked in. Prints output summaries and a table of the
// per-call latency (the first call apart from the rest).
#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor_ptr.h>
#include <executorch/runtime/backend/options.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <vector>

#include "backend_id.h"
#include "et_trt/data_file.h"
#include "host_tensor.h"
#include "latency_stats.h"
#include "runner_args.h"

using executorch::extension::Module;
using executorch::extension::TensorPtr;
using executorch::runtime::BackendOptions;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::LoadBackendOptionsMap;
using executorch::runtime::Tag;
using et_trt::runner::HostTensor;

namespace {

int fail(const std::string& message) {
  std::fprintf(stderr, "et_trt_runner: %s\n", message.c_str());
  return 1;
}

std::string error_text(Error e) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "error 0x%x", unsigned(e));
  return std::string(buf) + " (" + executorch::runtime::to_string(e) + ")";
}

}  // namespace

int main(int argc, char** argv) {
  et_trt::runner::RunnerArgs args;
  const std::string problem = et_trt::runner::parse_args(std::vector<std::string>(argv + 1, argv + argc), &args);
  if (args.help) {
    std::fputs(et_trt::runner::usage(), stdout);
    return 0;
  }
  if (!problem.empty()) return fail(problem + "\n" + et_trt::runner::usage());
  if (!std::ifstream(args.model)) return fail("cannot open model " + args.model);
  // ExecuTorch reads a .ptd without verifying it (include/et_trt/data_file.h): check it first.
  std::string data_problem;
  if (!args.data_path.empty() && !et_trt::verify_data_file(args.data_path, &data_problem)) return fail(data_problem);

  Module module = args.data_path.empty() ? Module(args.model, Module::LoadMode::Mmap)
                                         : Module(args.model, args.data_path, Module::LoadMode::Mmap);
  LoadBackendOptionsMap load_options;
  BackendOptions<2> trt_options;
  if (!args.engine_cache_dir.empty()) {
    if (args.engine_cache_dir.size() >= executorch::runtime::kMaxOptionValueLength) {
      return fail("--engine-cache path is too long for a backend option");
    }
    (void)trt_options.set_option("engine_cache_dir", args.engine_cache_dir.c_str());
  }
  (void)load_options.set_options(et_trt::kBackendId, trt_options.view());
  // Full flatbuffer verification: a damaged file is refused instead of read out of bounds.
  Error err = module.load(load_options, executorch::runtime::Program::Verification::InternalConsistency);
  if (err == Error::InvalidProgram || err == Error::InvalidArgument) {
    return fail(args.model + " is not a valid ExecuTorch program (truncated or corrupted? " + error_text(err) +
                "; the log above says what is wrong)");
  }
  if (err != Error::Ok) {
    return fail("cannot load program " + args.model +
                (args.data_path.empty() ? "" : " with data file " + args.data_path) + ": " + error_text(err));
  }

  auto names = module.method_names();
  if (!names.ok()) return fail("cannot list methods: " + error_text(names.error()));
  if (!names->count(args.method)) {
    std::string known;
    for (const auto& n : *names) known += (known.empty() ? "" : ", ") + n;
    return fail("no method '" + args.method + "' in " + args.model + " (it has: " + known + ")");
  }
  auto meta = module.method_meta(args.method);
  if (!meta.ok()) return fail("cannot read method meta: " + error_text(meta.error()));

  for (const auto& [index, file] : args.input_files) {
    if (index >= meta->num_inputs()) {
      return fail("--input " + std::to_string(index) + "=" + file + ": method '" + args.method + "' has " +
                  std::to_string(meta->num_inputs()) + " inputs");
    }
  }
  std::vector<HostTensor> host_inputs;
  std::vector<TensorPtr> tensors;
  std::vector<EValue> inputs;
  for (size_t i = 0; i < meta->num_inputs(); ++i) {
    auto tag = meta->input_tag(i);
    if (!tag.ok() || *tag != Tag::Tensor) {
      return fail("input " + std::to_string(i) + " is not a tensor; the runner feeds tensors only");
    }
    auto info = meta->input_tensor_meta(i);
    if (!info.ok()) return fail("cannot read input " + std::to_string(i) + " meta");
    std::vector<int64_t> shape(info->sizes().begin(), info->sizes().end());
    if (args.shapes.count(i)) shape = args.shapes[i];
    if (et_trt::runner::element_size(info->scalar_type()) == 0) {
      return fail("input " + std::to_string(i) + " has a dtype the runner cannot feed");
    }
    HostTensor t;
    if (args.input_files.count(i)) {
      const std::string p = et_trt::runner::load_input(args.input_files[i], i, info->scalar_type(), shape, &t);
      if (!p.empty()) return fail(p);
    } else {
      t = et_trt::runner::random_tensor(info->scalar_type(), shape, args.seed + i);
    }
    std::printf("input %zu: %s\n", i, et_trt::runner::summarize(t).c_str());
    host_inputs.push_back(std::move(t));
  }
  for (HostTensor& t : host_inputs) {
    std::vector<executorch::aten::SizesType> sizes(t.shape.begin(), t.shape.end());
    tensors.push_back(executorch::extension::make_tensor_ptr(sizes, t.data.data(), t.dtype));
    inputs.emplace_back(tensors.back());
  }

  err = module.load_method(args.method, nullptr, nullptr, &load_options);
  if (err != Error::Ok) {
    return fail("cannot load method '" + args.method + "': " + error_text(err) +
                " (the log above says why)");
  }

  // The first call, timed apart; then args.warmup untimed calls; then the timed ones.
  double first_call_ms = 0;
  std::vector<double> timed_ms;
  std::vector<EValue> outputs;
  for (int i = 0; i < 1 + args.warmup + args.iterations; ++i) {
    const auto start = std::chrono::steady_clock::now();
    auto result = module.execute(args.method, inputs);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (!result.ok()) return fail("call " + std::to_string(i + 1) + " failed: " + error_text(result.error()));
    if (i == 0) first_call_ms = ms;
    if (i > args.warmup) timed_ms.push_back(ms);
    outputs = std::move(*result);
  }

  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].isTensor()) {
      std::printf("output %zu: not a tensor\n", i);
      continue;
    }
    const auto& t = outputs[i].toTensor();
    HostTensor host{t.scalar_type(), std::vector<int64_t>(t.sizes().begin(), t.sizes().end()),
                    std::vector<uint8_t>(t.const_data_ptr<uint8_t>(), t.const_data_ptr<uint8_t>() + t.nbytes())};
    std::printf("output %zu: %s\n", i, et_trt::runner::summarize(host).c_str());
    if (!args.save_outputs_dir.empty()) {
      const std::string path = args.save_outputs_dir + "/output_" + std::to_string(i) + ".npy";
      const std::vector<uint8_t> npy = et_trt::runner::to_npy(host);
      std::ofstream out(path, std::ios::binary);
      if (!out.write(reinterpret_cast<const char*>(npy.data()), npy.size())) return fail("cannot write " + path);
    }
  }
  std::fputs(et_trt::runner::latency_table(first_call_ms, args.warmup,
                                          et_trt::runner::summarize_latencies(timed_ms)).c_str(), stdout);
  return 0;
}
