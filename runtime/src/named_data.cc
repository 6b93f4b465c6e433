#include "named_data.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "blob_reader.h"

namespace et_trt {
namespace {

// Every key of named data the blob names.
std::vector<std::string> blob_keys(const blob::Blob& blob) {
  std::vector<std::string> keys;
  for (flatbuffers::uoffset_t i = 0; blob.weights() != nullptr && i < blob.weights()->size(); ++i) {
    keys.push_back(blob.weights()->Get(i)->data()->key()->str());
  }
  for (flatbuffers::uoffset_t i = 0; blob.kernels() != nullptr && i < blob.kernels()->size(); ++i) {
    keys.push_back(blob.kernels()->Get(i)->image()->key()->str());
  }
  for (flatbuffers::uoffset_t i = 0; blob.engines() != nullptr && i < blob.engines()->size(); ++i) {
    keys.push_back(blob.engines()->Get(i)->plan()->key()->str());
  }
  return keys;
}

// Why a key the blob names is not in `source`, told from what the source holds instead.
std::string why_missing(const blob::Blob& blob, const NamedDataSource& source, const std::string& data_file) {
  if (data_file.empty()) return "The blob says the .pte holds it: the .pte is damaged or was rewritten; export it again";
  const std::string how = "(et_trt_runner --data-path " + data_file +
                          ", Module(pte, ptd), or Runtime.load_program(pte, data_path=...))";
  const std::vector<std::string> held = source.keys();
  const std::set<std::string> held_set(held.begin(), held.end());
  const std::vector<std::string> wanted = blob_keys(blob);
  const size_t present = std::count_if(wanted.begin(), wanted.end(), [&](const auto& k) { return held_set.count(k); });
  const size_t ours = std::count_if(held.begin(), held.end(), [](const std::string& k) {
    return k.rfind(kNamedDataPrefix, 0) == 0;
  });
  if (ours > 0) {  // kernel images are keyed by content: another export may share some of them
    return "The program's data holds " + std::to_string(present) + " of this part's " +
           std::to_string(wanted.size()) + " named data (" + std::to_string(ours) + " et-trt entries in all): the " +
           "data file it was loaded with is from another export, or damaged; load the program with the '" +
           data_file + "' exported with this .pte " + how;
  }
  return "It was exported to '" + data_file + "': load the program with that file " + how;
}

bool fetch(const blob::Blob& blob, const blob::NamedData& record, const std::string& what,
           const NamedDataSource& source, NamedBytes* out, std::string* error) {
  const std::string part = blob.part() ? blob.part()->str() : "";
  const std::string key = record.key()->str();
  const std::string data_file = blob.data_file() ? blob.data_file()->str() : "";
  const std::string named = "part '" + part + "': " + what + " (named data " + key + ", " +
                            std::to_string(record.size()) + " bytes)";
  std::string reason;
  if (!source.get(key, out, &reason)) {
    *error = named + " is not in the program's named data (" + reason + "). " + why_missing(blob, source, data_file);
    return false;
  }
  if (out->size != record.size()) {
    *error = named + ": the program's data holds " + std::to_string(out->size) + " bytes: " +
             (data_file.empty() ? "the .pte is damaged" : "'" + data_file + "' is from another export or damaged");
    return false;
  }
  uint8_t digest[EVP_MAX_MD_SIZE];
  unsigned int digest_size = 0;
  if (EVP_Digest(out->data, out->size, digest, &digest_size, EVP_sha256(), nullptr) != 1 ||
      digest_size != record.sha256()->size() || std::memcmp(digest, record.sha256()->data(), digest_size) != 0) {
    *error = named + ": its sha256 is " + to_hex(digest, 8) + "..., the blob's " +
             to_hex(record.sha256()->data(), 8) + "...: " +
             (data_file.empty() ? "the .pte is corrupted" : "'" + data_file + "' is corrupted or from another export");
    return false;
  }
  return true;
}

}  // namespace

CallerNamedData::CallerNamedData(const char* const* keys, const uint8_t* const* data, const size_t* sizes,
                                 size_t count) {
  for (size_t i = 0; i < count; ++i) entries_[keys[i]] = {data[i], sizes[i], nullptr};
}

std::vector<std::string> CallerNamedData::keys() const {
  std::vector<std::string> out;
  for (const auto& entry : entries_) out.push_back(entry.first);
  return out;
}

bool CallerNamedData::get(const std::string& key, NamedBytes* out, std::string* error) const {
  const auto found = entries_.find(key);
  if (found == entries_.end()) {
    *error = "the caller did not pass it";
    return false;
  }
  *out = found->second;
  return true;
}

bool fetch_named_data(const blob::Blob& blob, const NamedDataSource& source, PartitionData* out, std::string* error) {
  PartitionData data;
  const auto* weights = blob.weights();
  for (flatbuffers::uoffset_t i = 0; weights != nullptr && i < weights->size(); ++i) {
    const blob::Weight* w = weights->Get(i);
    NamedBytes bytes;
    if (!fetch(blob, *w->data(), "weight '" + w->name()->str() + "'", source, &bytes, error)) return false;
    data.weights.emplace_back(w->name()->str(), std::move(bytes));
  }
  const auto* kernels = blob.kernels();
  for (flatbuffers::uoffset_t i = 0; kernels != nullptr && i < kernels->size(); ++i) {
    NamedBytes bytes;
    if (!fetch(blob, *kernels->Get(i)->image(), "kernel image " + std::to_string(i), source, &bytes, error)) {
      return false;
    }
    data.kernel_images.push_back(std::move(bytes));
  }
  const auto* engines = blob.engines();
  for (flatbuffers::uoffset_t i = 0; engines != nullptr && i < engines->size(); ++i) {
    NamedBytes bytes;
    if (!fetch(blob, *engines->Get(i)->plan(), "engine " + std::to_string(i), source, &bytes, error)) return false;
    data.engine_plans.push_back(std::move(bytes));
  }
  *out = std::move(data);
  return true;
}

}  // namespace et_trt
