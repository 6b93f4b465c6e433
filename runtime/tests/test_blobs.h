// Helpers shared by the C++ tests: the blobs make_test_blobs.py wrote, and
// re-sealing a modified payload with a valid header.
#pragma once

#include <openssl/evp.h>
#include <zlib.h>

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "blob_reader.h"
#include "named_data.h"

namespace et_trt::testing {

// 8-byte aligned storage, as the reader requires.
struct Bytes {
  std::vector<uint64_t> storage;
  size_t size = 0;
  const uint8_t* data() const { return reinterpret_cast<const uint8_t*>(storage.data()); }
  uint8_t* data() { return reinterpret_cast<uint8_t*>(storage.data()); }
  static Bytes of(const std::vector<uint8_t>& v) {
    Bytes b;
    b.storage.resize(v.size() / 8 + 1);
    b.size = v.size();
    if (!v.empty()) std::memcpy(b.data(), v.data(), v.size());
    return b;
  }
  std::vector<uint8_t> vec() const { return std::vector<uint8_t>(data(), data() + size); }
};

inline std::string blob_dir() {
  const char* dir = std::getenv("ET_TRT_TEST_BLOBS");
  return dir ? dir : "";
}

inline std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Every file in `dir` whose name ends with `suffix` (and has more before it), sorted.
inline std::vector<std::string> files_ending(const std::string& dir, const std::string& suffix) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
        out.push_back(dir + "/" + name);
      }
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Every *.blob file in `dir`, sorted.
inline std::vector<std::string> blob_files(const std::string& dir) { return files_ending(dir, ".blob"); }

// key -> bytes of the named data make_test_blobs.py (or extract_blobs.py) wrote
// under `root` (a file per key, the key its path there); empty if none.
inline std::map<std::string, std::vector<uint8_t>> read_named_data(const std::string& root,
                                                                   const std::string& key = "") {
  std::map<std::string, std::vector<uint8_t>> out;
  const std::string path = key.empty() ? root : root + "/" + key;
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return out;
  if (!S_ISDIR(st.st_mode)) {
    out[key] = read_file(path);
    return out;
  }
  if (DIR* d = opendir(path.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      for (auto& [k, v] : read_named_data(root, key.empty() ? name : key + "/" + name)) out[k] = std::move(v);
    }
    closedir(d);
  }
  return out;
}

// fetch_named_data of `blob` from `named` (key -> bytes).
inline bool fetch_from(const blob::Blob& blob, const std::map<std::string, std::vector<uint8_t>>& named,
                       PartitionData* out, std::string* error) {
  std::vector<const char*> keys;
  std::vector<const uint8_t*> data;
  std::vector<size_t> sizes;
  for (const auto& [key, bytes] : named) {
    keys.push_back(key.c_str());
    data.push_back(bytes.data());
    sizes.push_back(bytes.size());
  }
  return fetch_named_data(blob, CallerNamedData(keys.data(), data.data(), sizes.data(), keys.size()), out, error);
}

// Where a generated flatbuffers table (which derives privately from flatbuffers::Table) stores
// `field`, or null if absent: for tests that edit a field in place.
inline const uint8_t* field_address(const void* table, flatbuffers::voffset_t field) {
  return static_cast<const flatbuffers::Table*>(table)->GetAddressOf(field);
}

// The command line of the corruption drivers: DIR [SEED] [--max-bytes N].
struct DriverArgs {
  std::string dir;
  uint64_t seed = 0;
  size_t max_bytes = SIZE_MAX;  // larger files are named and skipped
};

// False (after printing the usage) if the command line is not one.
inline bool parse_driver_args(int argc, char** argv, uint64_t default_seed, DriverArgs* args) {
  args->seed = default_seed;
  bool ok = argc >= 2;
  for (int i = 2; ok && i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--max-bytes" && i + 1 < argc) {
      args->max_bytes = std::stoull(argv[++i]);
    } else if (!arg.empty() && arg.find_first_not_of("0123456789") == std::string::npos) {
      args->seed = std::stoull(arg);
    } else {
      ok = false;
    }
  }
  if (!ok) std::fprintf(stderr, "usage: %s DIR [SEED] [--max-bytes N]\n", argv[0]);
  if (ok) args->dir = argv[1];
  return ok;
}

inline void store_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}

// Rewrites size, content id and crc32 so that only the payload's own
// structure decides whether the blob is accepted.
inline void reseal(std::vector<uint8_t>* blob) {
  if (blob->size() < kHeaderSize) return;
  const uint64_t payload = blob->size() - kHeaderSize;
  for (int i = 0; i < 8; ++i) (*blob)[16 + i] = uint8_t(payload >> (8 * i));
  unsigned int n = 0;
  EVP_Digest(blob->data() + kHeaderSize, payload, blob->data() + 24, &n, EVP_sha256(), nullptr);
  const uint32_t crc = static_cast<uint32_t>(crc32(crc32(0L, Z_NULL, 0), blob->data() + 16, uInt(blob->size() - 16)));
  store_u32(blob->data() + 12, crc);
}

inline std::string sha256_hex(const std::vector<uint8_t>& bytes) {
  uint8_t digest[32];
  unsigned int n = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &n, EVP_sha256(), nullptr);
  std::string hex;
  for (uint8_t b : digest) {
    hex += "0123456789abcdef"[b >> 4];
    hex += "0123456789abcdef"[b & 15];
  }
  return hex;
}

// A blob around `payload` with a valid header.
inline std::vector<uint8_t> seal(const uint8_t* payload, size_t size, uint32_t version = kSchemaVersion) {
  std::vector<uint8_t> blob(kHeaderSize + size);
  std::memcpy(blob.data(), kBlobMagic, 8);
  store_u32(blob.data() + 8, version);
  std::memcpy(blob.data() + kHeaderSize, payload, size);
  reseal(&blob);
  return blob;
}

}  // namespace et_trt::testing
