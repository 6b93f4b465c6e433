// Corruption driver for ExecuTorch data files (.ptd), built with
// AddressSanitizer and UBSan: mutates every *.ptd in the directory given as
// argv[1] (make_test_blobs.py writes each beside the blobs whose named data it
// holds: NAME.ptd serves NAME.blob and NAME_<i>.blob) and feeds each mutant to
// the checks a program runs before and while ExecuTorch reads it:
//
//  check_data_file (et_trt::verify_data_file) first: a refusal must be one
//  line. A mutant it accepts goes to ExecuTorch's own reader
//  (FlatTensorDataMap over the bytes, every key listed, every entry fetched
//  and copied, so ASan checks each range), then to the delegate's
//  fetch_named_data for each of the file's blobs, which must either return the
//  original bytes or refuse: no changed payload is accepted.
//
// Mutants: truncations (every length through the key table, spread over the
// data), every bit of the header, bit flips and extreme values across the key
// table, extreme header fields, payload flips, swapped segment indexes and
// segments (swapped payloads), and each blob against every other data file (a
// .ptd from another export). ExecuTorch's log goes through a sink that aborts,
// as the Python runtime's does, on a line that is not UTF-8.
#include <executorch/extension/data_loader/buffer_data_loader.h>
#include <executorch/extension/flat_tensor/flat_tensor_data_map.h>
#include <executorch/runtime/platform/platform.h>
#include <executorch/runtime/platform/runtime.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "data_file_check.h"
#include "flat_tensor_generated.h"
#include "little_endian.h"
#include "program_named_data.h"
#include "test_blobs.h"
#include "utf8.h"

namespace et_trt {
namespace {

using executorch::extension::BufferDataLoader;
using executorch::extension::FlatTensorDataMap;
using testing::Bytes;

static_assert(kDataFileSchemaVersion == FlatTensorDataMap::kMaxSupportedSchemaVersion,
              "the data file check must refuse the schema versions ExecuTorch refuses");

size_t log_lines = 0;

void log_sink(et_timestamp_t, et_pal_log_level_t, const char*, const char*, size_t, const char* message,
              size_t length) {
  ++log_lines;
  if (!is_utf8(std::string_view(message, length))) {
    std::fprintf(stderr, "ExecuTorch logged a line that is not UTF-8 (the Python runtime would abort)\n");
    std::abort();
  }
}

// A .ptd and the blobs whose named data it holds.
struct Sample {
  std::string path;
  std::vector<uint8_t> ptd;
  std::vector<Bytes> blobs;  // kept alive for the views
  std::vector<BlobView> views;
  std::map<std::string, std::vector<uint8_t>> named;  // key -> original bytes
  uint64_t flatbuffer_end = 0;
  uint64_t segment_base = 0;
};

struct Counts {
  size_t mutants = 0, refused = 0, executorch_refused = 0, accepted = 0, fetched_intact = 0, fetch_refused = 0;
};

// Every entry of the map, copied out (ASan checks the range), and each blob's named data through the delegate's
// checks: false if a changed payload got through.
bool read_through_executorch(const Sample& sample, const uint8_t* data, size_t size, Counts* c) {
  BufferDataLoader loader(data, size);
  auto map = FlatTensorDataMap::load(&loader);
  if (!map.ok()) {
    ++c->executorch_refused;
    return true;
  }
  ++c->accepted;
  static std::vector<uint8_t> copy;
  const auto* entries = flat_tensor_flatbuffer::GetFlatTensor(data)->named_data();
  const uint32_t keys = map->get_num_keys().get();
  for (uint32_t i = 0; i < keys; ++i) {
    auto key = map->get_key(i);
    if (!key.ok()) continue;
    auto found = map->get_data(key.get());
    if (found.ok() && found->size() > 0) {
      const auto* bytes = static_cast<const uint8_t*>(found->data());
      copy.assign(bytes, bytes + found->size());
    }
    // ExecuTorch dereferences the layout unchecked: it asks only for tensors a program names, which have one.
    if (entries->Get(i)->tensor_layout() != nullptr) (void)map->get_tensor_layout(key.get());
  }
  const ProgramNamedData source(&map.get());
  for (const BlobView& view : sample.views) {
    PartitionData fetched;
    std::string error;
    if (!fetch_named_data(*view.root, source, &fetched, &error)) {
      ++c->fetch_refused;
      continue;
    }
    auto intact = [&](const NamedBytes& got, const blob::NamedData* record) {
      const auto& want = sample.named.at(record->key()->str());
      return got.size == want.size() && std::memcmp(got.data, want.data(), want.size()) == 0;
    };
    const blob::Blob& root = *view.root;
    bool all_intact = true;
    for (size_t i = 0; i < fetched.weights.size(); ++i) {
      all_intact &= intact(fetched.weights[i].second, root.weights()->Get(i)->data());
    }
    for (size_t i = 0; i < fetched.kernel_images.size(); ++i) {
      all_intact &= intact(fetched.kernel_images[i], root.kernels()->Get(i)->image());
    }
    for (size_t i = 0; i < fetched.engine_plans.size(); ++i) {
      all_intact &= intact(fetched.engine_plans[i], root.engines()->Get(i)->plan());
    }
    if (!all_intact) {
      std::fprintf(stderr, "%s: the delegate accepted a changed payload\n", sample.path.c_str());
      return false;
    }
    ++c->fetched_intact;
  }
  return true;
}

// One mutant: refused in one line by the check, or read by ExecuTorch and the delegate without harm.
bool run(const Sample& sample, const uint8_t* data, size_t size, Counts* c) {
  ++c->mutants;
  std::string problem;
  if (!check_data_file(data, size, &problem)) {
    if (problem.empty() || problem.find('\n') != std::string::npos || !is_utf8(problem)) {
      std::fprintf(stderr, "a refusal that is not one line of text: '%s'\n", problem.c_str());
      std::abort();
    }
    ++c->refused;
    return true;
  }
  return read_through_executorch(sample, data, size, c);
}

// Where the flatbuffer stores each NamedData's segment_index and each DataSegment's offset and size (a field at
// its default value, 0, is not stored).
struct Fields {
  std::vector<size_t> segment_index;  // u32 each
  std::vector<size_t> segment_offset, segment_size;  // u64 each
  std::vector<uint64_t> offsets, sizes;  // each segment's values
};

Fields fields_of(const std::vector<uint8_t>& ptd) {
  Fields f;
  const auto* root = flat_tensor_flatbuffer::GetFlatTensor(ptd.data());
  auto at = [&](const void* table, flatbuffers::voffset_t field, std::vector<size_t>* out) {
    if (const uint8_t* p = testing::field_address(table, field)) out->push_back(size_t(p - ptd.data()));
  };
  for (const auto* entry : *root->named_data()) {
    at(entry, flat_tensor_flatbuffer::NamedData::VT_SEGMENT_INDEX, &f.segment_index);
  }
  for (const auto* segment : *root->segments()) {
    at(segment, flat_tensor_flatbuffer::DataSegment::VT_OFFSET, &f.segment_offset);
    at(segment, flat_tensor_flatbuffer::DataSegment::VT_SIZE, &f.segment_size);
    f.offsets.push_back(segment->offset());
    f.sizes.push_back(segment->size());
  }
  return f;
}

void store_u64(uint8_t* p, uint64_t value) {
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(value >> (8 * i));
}

bool mutate(const Sample& sample, std::mt19937_64& rng, Counts* c) {
  const size_t n = sample.ptd.size();
  const size_t table_end = static_cast<size_t>(sample.flatbuffer_end);
  Bytes work = Bytes::of(sample.ptd);
  uint8_t* data = work.data();
  bool ok = true;
  // Mutates bytes [at, at + len) of the whole file in place, runs it, restores them.
  auto in_place = [&](size_t at, size_t len, auto change) {
    std::vector<uint8_t> saved(data + at, data + at + len);
    change(data + at);
    if (std::memcmp(saved.data(), data + at, len) != 0) ok = run(sample, data, n, c) && ok;
    std::memcpy(data + at, saved.data(), len);
  };
  auto pos = [&](size_t lo, size_t hi) { return lo + size_t(rng() % (hi - lo)); };
  auto spread = [&](size_t k, size_t count, size_t lo, size_t hi) { return lo + k * (hi - lo) / count; };

  // Truncations: each its own allocation, so ASan sees a read past the new end.
  const size_t cut_count = std::min<size_t>(table_end + 8, 512);
  for (size_t k = 0; k < cut_count + 32; ++k) {
    const size_t len = k < cut_count ? spread(k, cut_count, 0, std::min(table_end + 8, n))
                                     : spread(k - cut_count, 32, table_end, n);
    const Bytes cut = Bytes::of(std::vector<uint8_t>(sample.ptd.begin(), sample.ptd.begin() + len));
    ok = run(sample, cut.data(), cut.size, c) && ok;
  }
  // Every bit of the identifier and header.
  for (size_t bit = 0; bit < 48 * 8; ++bit) {
    in_place(bit / 8, 1, [&](uint8_t* p) { *p ^= uint8_t(1u << (bit % 8)); });
  }
  // The header's four u64 fields at extreme values.
  for (size_t field = 16; field < 48; field += 8) {
    for (uint64_t value : {uint64_t(0), uint64_t(1), uint64_t(n - 1), uint64_t(n), uint64_t(n + 1), uint64_t(table_end),
                           uint64_t(1) << 63, ~uint64_t(0)}) {
      in_place(field, 8, [&](uint8_t* p) { store_u64(p, value); });
    }
  }
  // The key table: a bit flip at (up to) every byte, extreme u32 values across it.
  const size_t flips = std::min<size_t>(table_end - 48, 1500);
  for (size_t k = 0; k < flips; ++k) {
    const size_t at = spread(k, flips, 48, table_end);
    const uint8_t mask = uint8_t(1u << (rng() % 8));
    in_place(at, 1, [&](uint8_t* p) { *p ^= mask; });
  }
  const uint32_t extremes[] = {0, 1, 0x7fffffff, 0x80000000, 0xffffffff, uint32_t(n), uint32_t(table_end), 0};
  const size_t words = std::min<size_t>((table_end - 48) / 4, 200);
  for (size_t k = 0; k < words * 8; ++k) {
    const size_t at = spread(k / 8, words, 48, table_end) & ~size_t(3);
    const uint32_t value = k % 8 == 7 ? uint32_t(rng()) : extremes[k % 8];
    in_place(at, 4, [&](uint8_t* p) { testing::store_u32(p, value); });
  }
  // Payload flips: the check passes them, the content digests must not.
  for (size_t k = 0; k < 48 && sample.segment_base < n; ++k) {
    const size_t at = pos(static_cast<size_t>(sample.segment_base), n);
    in_place(at, 1, [&](uint8_t* p) { *p ^= 0x20; });
  }
  // Swapped payloads: each key pointed at other segments, each segment at other segments' bytes (up to 8 each).
  const Fields f = fields_of(sample.ptd);
  const size_t segments = f.offsets.size(), others = std::min<size_t>(segments, 8);
  for (size_t k = 0; k < others; ++k) {
    const size_t other = (k * segments / others + rng()) % segments;
    for (size_t field : f.segment_index) {
      in_place(field, 4, [&](uint8_t* p) { testing::store_u32(p, uint32_t(other)); });
    }
    for (size_t field : f.segment_offset) {
      in_place(field, 8, [&](uint8_t* p) { store_u64(p, f.offsets[other]); });
    }
    for (size_t field : f.segment_size) {
      in_place(field, 8, [&](uint8_t* p) { store_u64(p, f.sizes[other]); });
    }
  }
  return ok;
}

bool read_sample(const std::string& path, Sample* sample) {
  sample->path = path;
  sample->ptd = testing::read_file(path);
  std::string problem;
  if (!check_data_file(Bytes::of(sample->ptd).data(), sample->ptd.size(), &problem)) {
    std::fprintf(stderr, "%s: the unmodified file is refused (%s); nothing to mutate\n", path.c_str(), problem.c_str());
    return false;
  }
  sample->flatbuffer_end = load_u64(sample->ptd.data() + 24) + load_u64(sample->ptd.data() + 16);
  sample->segment_base = load_u64(sample->ptd.data() + 32);
  const std::string stem = path.substr(0, path.size() - 4);
  for (const std::string& file : testing::blob_files(stem.substr(0, stem.rfind('/')))) {
    const std::string name = file.substr(0, file.size() - 5);
    if (name != stem && name.rfind(stem + "_", 0) != 0) continue;
    sample->blobs.push_back(Bytes::of(testing::read_file(file)));
  }
  for (const Bytes& blob : sample->blobs) {
    BlobView view;
    BlobError error;
    if (!read_blob(blob.data(), blob.size, &view, &error)) {
      std::fprintf(stderr, "%s: a blob of it is refused: %s\n", path.c_str(), error.message.c_str());
      return false;
    }
    sample->views.push_back(view);
  }
  // The original bytes of every key, through ExecuTorch's reader of the unmodified file.
  static std::vector<Bytes> keep;
  keep.push_back(Bytes::of(sample->ptd));
  BufferDataLoader loader(keep.back().data(), keep.back().size);
  auto map = FlatTensorDataMap::load(&loader);
  if (!map.ok()) return false;
  for (uint32_t i = 0; i < map->get_num_keys().get(); ++i) {
    const char* key = map->get_key(i).get();
    auto found = map->get_data(key);
    const auto* bytes = static_cast<const uint8_t*>(found->data());
    sample->named[key] = std::vector<uint8_t>(bytes, bytes + found->size());
  }
  return true;
}

}  // namespace
}  // namespace et_trt

// DIR [SEED] [--max-bytes N]: data files of more than N bytes are named and skipped (CI mutates the small ones;
// the example's, megabytes of weights, in the documented full run).
int main(int argc, char** argv) {
  et_trt::testing::DriverArgs args;
  if (!et_trt::testing::parse_driver_args(argc, argv, 20261207, &args)) return 2;
  executorch::runtime::runtime_init();
  executorch::runtime::register_pal(executorch::runtime::PalImpl::create(et_trt::log_sink, __FILE__));
  std::mt19937_64 rng(args.seed);
  std::vector<et_trt::Sample> samples;
  bool ok = true;
  for (const std::string& path : et_trt::testing::files_ending(args.dir, ".ptd")) {
    et_trt::Sample sample;
    const size_t size = et_trt::testing::read_file(path).size();
    if (size > args.max_bytes) {
      std::printf("%s (%zu bytes): skipped, over --max-bytes %zu\n", path.c_str(), size, args.max_bytes);
    } else if (!et_trt::read_sample(path, &sample)) {
      ok = false;
    } else {
      samples.push_back(std::move(sample));
    }
  }
  if (samples.empty()) {
    std::fprintf(stderr, "no *.ptd of %s was mutated\n", args.dir.c_str());
    return 1;
  }
  for (const et_trt::Sample& sample : samples) {
    et_trt::Counts c;
    ok = et_trt::mutate(sample, rng, &c) && ok;
    // ExecuTorch refusing what the check passed would be reported as the program's fault, not the file's.
    ok = ok && c.executorch_refused == 0;
    std::printf("%s (%zu bytes, %zu keys, %zu blobs): %zu ptd mutants, %zu refused by the check in one line, "
                "%zu refused by ExecuTorch, %zu read by ExecuTorch: %zu blob fetches intact, %zu refused by the "
                "delegate; 0 crashes\n", sample.path.c_str(), sample.ptd.size(), sample.named.size(),
                sample.views.size(), c.mutants, c.refused, c.executorch_refused, c.accepted, c.fetched_intact,
                c.fetch_refused);
  }
  // A .ptd from another export: each file's blobs against every other file.
  size_t foreign = 0, foreign_accepted = 0;
  for (const et_trt::Sample& data : samples) {
    for (const et_trt::Sample& other : samples) {
      if (&data == &other) continue;
      et_trt::Sample mixed = other;
      mixed.path = data.path;
      mixed.named = data.named;
      et_trt::Counts c;
      const et_trt::testing::Bytes bytes = et_trt::testing::Bytes::of(data.ptd);
      ok = et_trt::run(mixed, bytes.data(), bytes.size, &c) && ok;
      foreign += other.views.size();
      foreign_accepted += c.fetched_intact;
      if (c.fetched_intact != 0) std::fprintf(stderr, "%s's blobs accepted %s\n", other.path.c_str(), data.path.c_str());
    }
  }
  ok = ok && foreign_accepted == 0;
  std::printf("%zu blobs against a .ptd of another export: %zu accepted\n", foreign, foreign_accepted);
  std::printf("ExecuTorch logged %zu lines, all UTF-8\n", et_trt::log_lines);
  return ok ? 0 : 1;
}
