// Corruption driver for the blob reader, built with AddressSanitizer and
// UBSan: mutates every *.blob in the directory given as argv[1] thousands of
// ways across its whole length and feeds each mutant to read_blob.
//
//  raw mutants (bit flips, byte overwrites, truncation, extension, swapped
//  words and header fields) keep the original header, so every one must be
//  refused: the run fails if one is accepted.
//  resealed mutants get a fresh size, content id and crc32, so only the
//  flatbuffers Verifier and the reader's own checks stand between them and
//  the engine. Some are legitimately accepted (a flipped bit inside the ONNX
//  bytes is still a well-formed blob); each accepted one is walked field by
//  field so the sanitizers see any read the Verifier should have stopped.
//  named-data mutants: where <blob>.named/ holds the blob's named data (what
//  a .pte or .ptd gives the delegate), each entry is flipped, cut and
//  extended; fetch_named_data must refuse every one.
// Nothing may crash or trip a sanitizer (which aborts the run).
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "blob_reader.h"
#include "test_blobs.h"

namespace et_trt {
namespace {

using testing::Bytes;

bool accepted(const std::vector<uint8_t>& blob, BlobView* view) {
  static Bytes bytes;  // kept alive for the walk
  bytes = Bytes::of(blob);
  BlobError error;
  const bool ok = read_blob(bytes.data(), bytes.size, view, &error);
  if (!ok && error.message.empty()) {
    std::fprintf(stderr, "refusal without a message\n");
    std::abort();
  }
  return ok;
}

// Touches every byte the reader's users may read, so ASan checks it.
size_t walk(const BlobView& view) {
  size_t sum = 0;
  auto str = [&](const flatbuffers::String* s) {
    if (s) for (char c : *s) sum += uint8_t(c);
  };
  // Copied out in one memcpy: ASan checks the whole range at once, several
  // times faster than a loop over the bytes (megabytes of ONNX and images).
  static std::vector<uint8_t> copy;
  auto bytes = [&](const flatbuffers::Vector<uint8_t>* v) {
    if (v && v->size() > 0) copy.assign(v->data(), v->data() + v->size()), sum += copy.back();
  };
  const blob::Blob* root = view.root;
  str(root->part());
  str(root->export_options());
  str(root->data_file());
  bytes(root->onnx());
  auto named = [&](const blob::NamedData* d) { str(d->key()), bytes(d->sha256()), sum += size_t(d->size()); };
  if (const auto* p = root->producer()) {
    str(p->et_trt()), str(p->torch()), str(p->executorch()), str(p->triton()), str(p->tensorrt());
  }
  if (root->weights()) {
    for (const blob::Weight* w : *root->weights()) str(w->name()), named(w->data());
  }
  for (const auto* specs : {root->inputs(), root->outputs()}) {
    for (const blob::TensorSpec* s : *specs) {
      str(s->name());
      for (const blob::Dim* d : *s->dims()) str(d->name()), sum += size_t(d->max());
    }
  }
  if (root->kernels()) {
    for (const blob::KernelImage* k : *root->kernels()) {
      str(k->kernel()), str(k->variant()), str(k->arch()), str(k->entry()), str(k->ptx_version()), named(k->image());
    }
  }
  if (root->engines()) {
    for (const blob::Engine* e : *root->engines()) named(e->plan()), str(e->tensorrt_version()), str(e->gpu_name());
  }
  return sum;
}

struct Counts {
  size_t raw = 0, raw_accepted = 0, resealed = 0, resealed_accepted = 0;
};

void swap_words(std::vector<uint8_t>* b, size_t i, size_t j) {
  for (int k = 0; k < 4; ++k) std::swap((*b)[i + k], (*b)[j + k]);
}

Counts mutate(const std::vector<uint8_t>& original, std::mt19937_64& rng) {
  Counts c;
  BlobView view;
  const size_t n = original.size();
  auto raw = [&](const std::vector<uint8_t>& m, const char* what, size_t where) {
    ++c.raw;
    if (accepted(m, &view)) {
      ++c.raw_accepted;
      std::fprintf(stderr, "ACCEPTED raw mutant: %s at %zu\n", what, where);
    }
  };
  auto resealed = [&](std::vector<uint8_t> m) {
    testing::reseal(&m);
    ++c.resealed;
    if (accepted(m, &view)) {
      ++c.resealed_accepted;
      walk(view);
    }
  };
  auto pos = [&](size_t lo, size_t hi) { return lo + size_t(rng() % (hi - lo)); };

  // Bit flips: every bit of the header, then positions spread over the whole blob.
  for (size_t i = 0; i < kHeaderSize * 8; ++i) {
    std::vector<uint8_t> m = original;
    m[i / 8] ^= uint8_t(1u << (i % 8));
    raw(m, "header bit flip", i);
  }
  for (size_t k = 0; k < 600; ++k) {
    const size_t i = k < 300 ? k * n / 300 : pos(0, n);
    std::vector<uint8_t> m = original;
    m[i] ^= uint8_t(1u << (rng() % 8));
    raw(m, "bit flip", i);
  }
  // Random byte overwrites.
  for (size_t k = 0; k < 200; ++k) {
    std::vector<uint8_t> m = original;
    const size_t i = pos(0, n);
    const uint8_t v = uint8_t(rng());
    if (m[i] == v) continue;
    m[i] = v;
    raw(m, "byte overwrite", i);
  }
  // Truncation at every header length and spread over the payload; extension.
  for (size_t k = 0; k < 200; ++k) {
    const size_t len = k < kHeaderSize ? k : kHeaderSize + (k - kHeaderSize) * (n - kHeaderSize) / 150;
    if (len >= n) continue;
    raw(std::vector<uint8_t>(original.begin(), original.begin() + len), "truncation", len);
  }
  for (size_t extra : {1, 2, 7, 8, 64, 4096}) {
    std::vector<uint8_t> m = original;
    for (size_t k = 0; k < extra; ++k) m.push_back(uint8_t(rng()));
    raw(m, "extension", extra);
  }
  // Swapped fields: header fields with each other, and 4-byte words anywhere.
  const size_t header_fields[][2] = {{8, 12}, {12, 16}, {16, 20}, {8, 16}, {24, 40}};
  for (const auto& f : header_fields) {
    std::vector<uint8_t> m = original;
    swap_words(&m, f[0], f[1]);
    if (m != original) raw(m, "header field swap", f[0]);
  }
  for (size_t k = 0; k < 200; ++k) {
    std::vector<uint8_t> m = original;
    const size_t i = pos(0, n - 4) & ~size_t(3), j = pos(0, n - 4) & ~size_t(3);
    swap_words(&m, i, j);
    if (m != original) raw(m, "word swap", i);
  }

  // Resealed: flips, overwrites with extreme values, swaps, cuts inside the payload.
  const size_t payload = n - kHeaderSize;
  for (size_t k = 0; k < 500; ++k) {
    std::vector<uint8_t> m = original;
    const size_t i = kHeaderSize + (k < 250 ? k * payload / 250 : pos(0, payload));
    m[i] ^= uint8_t(1u << (rng() % 8));
    resealed(m);
  }
  for (size_t k = 0; k < 300; ++k) {
    std::vector<uint8_t> m = original;
    const size_t i = kHeaderSize + (pos(0, payload - 4) & ~size_t(3));
    const uint32_t values[] = {0, 1, 0x7fffffff, 0x80000000, 0xffffffff, uint32_t(payload), uint32_t(payload - 4),
                               uint32_t(rng())};
    testing::store_u32(m.data() + i, values[k % 8]);
    resealed(m);
  }
  for (size_t k = 0; k < 300; ++k) {
    std::vector<uint8_t> m = original;
    swap_words(&m, kHeaderSize + (pos(0, payload - 4) & ~size_t(3)), kHeaderSize + (pos(0, payload - 4) & ~size_t(3)));
    resealed(m);
  }
  for (size_t k = 0; k < 100; ++k) {
    const size_t len = kHeaderSize + k * payload / 100;
    resealed(std::vector<uint8_t>(original.begin(), original.begin() + len));
  }
  return c;
}

// Mutants of each named-data entry of `blob`; returns how many fetch_named_data accepted (must be none).
size_t mutate_named_data(const BlobView& view, const std::map<std::string, std::vector<uint8_t>>& named,
                         std::mt19937_64& rng, size_t* mutants) {
  size_t accepted_count = 0;
  auto check = [&](const std::map<std::string, std::vector<uint8_t>>& m, const char* what, const std::string& key) {
    ++*mutants;
    PartitionData data;
    std::string error;
    if (testing::fetch_from(*view.root, m, &data, &error)) {
      ++accepted_count;
      std::fprintf(stderr, "ACCEPTED named-data mutant: %s of %s\n", what, key.c_str());
    } else if (error.empty()) {
      std::fprintf(stderr, "refusal without a message\n");
      std::abort();
    }
  };
  for (const auto& [key, bytes] : named) {
    for (size_t k = 0; k < 64; ++k) {
      auto m = named;
      m[key][k * bytes.size() / 64] ^= uint8_t(1u << (rng() % 8));
      check(m, "bit flip", key);
    }
    for (size_t len : {size_t(0), size_t(1), bytes.size() / 2, bytes.size() - 1}) {
      auto m = named;
      m[key].resize(len);
      check(m, "truncation", key);
    }
    auto extended = named;
    extended[key].push_back(0);
    check(extended, "extension", key);
    auto missing = named;
    missing.erase(key);
    check(missing, "removal", key);
  }
  return accepted_count;
}

}  // namespace
}  // namespace et_trt

// BLOB_DIR [SEED] [--max-bytes N]: blobs of more than N bytes are named and
// skipped (emulated runs, where each mutant's crc32 and sha256 cost tens of
// times what they cost natively).
int main(int argc, char** argv) {
  et_trt::testing::DriverArgs args;
  if (!et_trt::testing::parse_driver_args(argc, argv, 20261129, &args)) return 2;
  std::mt19937_64 rng(args.seed);
  const std::vector<std::string> files = et_trt::testing::blob_files(args.dir);
  if (files.empty()) {
    std::fprintf(stderr, "no *.blob files in %s\n", argv[1]);
    return 2;
  }
  bool ok = true;
  size_t mutated = 0;
  for (const std::string& file : files) {
    const std::vector<uint8_t> blob = et_trt::testing::read_file(file);
    if (blob.size() > args.max_bytes) {
      std::printf("%s (%zu bytes): skipped, over --max-bytes %zu\n", file.c_str(), blob.size(), args.max_bytes);
      continue;
    }
    et_trt::BlobView view;
    if (!et_trt::accepted(blob, &view)) {
      std::fprintf(stderr, "%s: the unmodified blob is refused; nothing to mutate\n", file.c_str());
      ok = false;
      continue;
    }
    const et_trt::Counts c = et_trt::mutate(blob, rng);
    std::printf("%s (%zu bytes): %zu raw mutants, %zu accepted; %zu resealed mutants, %zu accepted and walked\n",
                file.c_str(), blob.size(), c.raw, c.raw_accepted, c.resealed, c.resealed_accepted);
    if (c.raw_accepted != 0 || c.raw < 1000) ok = false;
    const auto named = et_trt::testing::read_named_data(file.substr(0, file.size() - 5) + ".named");
    if (!named.empty() && et_trt::accepted(blob, &view)) {  // the view again: mutate() reused its storage
      size_t mutants = 0;
      const size_t named_accepted = et_trt::mutate_named_data(view, named, rng, &mutants);
      std::printf("%s: %zu named-data mutants of %zu entries, %zu accepted\n", file.c_str(), mutants, named.size(),
                  named_accepted);
      if (named_accepted != 0) ok = false;
    }
    ++mutated;
  }
  if (mutated == 0) {
    std::fprintf(stderr, "no blob of %s was mutated\n", argv[1]);
    return 1;
  }
  return ok ? 0 : 1;
}
