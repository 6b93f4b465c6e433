#include "engine_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

namespace et_trt {
namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

// Keeps letters, digits, '.', '-' and '_'; everything else becomes '_'.
std::string file_safe(const std::string& text) {
  std::string out;
  for (char c : text) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '-' || c == '_';
    out += ok ? c : '_';
  }
  return out;
}

bool make_dirs(const std::string& dir, std::string* error) {
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string prefix = dir.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      *error = "cannot create engine cache directory " + prefix + ": " + std::strerror(errno);
      return false;
    }
  }
  return true;
}

}  // namespace

std::string engine_cache_dir(const char* load_option) {
  if (load_option != nullptr && load_option[0] != '\0') return load_option;
  if (!env("ET_TRT_ENGINE_CACHE").empty()) return env("ET_TRT_ENGINE_CACHE");
  if (!env("XDG_CACHE_HOME").empty()) return env("XDG_CACHE_HOME") + "/et_trt/engines";
  if (!env("HOME").empty()) return env("HOME") + "/.cache/et_trt/engines";
  return "";
}

std::string engine_cache_key(const std::string& content_id_hex, const std::string& gpu_name,
                             int compute_capability, Provider provider, const std::string& provider_version) {
  return file_safe(content_id_hex) + "-" + file_safe(gpu_name) + "-sm" + std::to_string(compute_capability) +
         (provider == Provider::kTensorRT ? "-trt" : "-rtx") + file_safe(provider_version) + ".engine";
}

std::string runtime_cache_key(const std::string& engine_key) {
  const std::string suffix = ".engine";
  const bool has_suffix =
      engine_key.size() >= suffix.size() && engine_key.compare(engine_key.size() - suffix.size(), suffix.size(), suffix) == 0;
  return (has_suffix ? engine_key.substr(0, engine_key.size() - suffix.size()) : engine_key) + ".runtime-cache";
}

bool read_cached_engine(const std::string& dir, const std::string& key, std::vector<uint8_t>* plan) {
  if (dir.empty()) return false;
  std::ifstream in(dir + "/" + key, std::ios::binary);
  if (!in) return false;
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size <= 0) return false;
  in.seekg(0);
  plan->resize(static_cast<size_t>(size));
  return static_cast<bool>(in.read(reinterpret_cast<char*>(plan->data()), size));
}

bool write_cached_engine(const std::string& dir, const std::string& key, const void* plan, size_t size,
                         std::string* error) {
  if (dir.empty()) {
    *error = "no engine cache directory";
    return false;
  }
  if (!make_dirs(dir, error)) return false;
  const std::string path = dir + "/" + key;
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(static_cast<const char*>(plan), static_cast<std::streamsize>(size));
    if (!out.flush()) {
      *error = "cannot write " + tmp;
      std::remove(tmp.c_str());
      return false;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    *error = "cannot rename " + tmp + " to " + path + ": " + std::strerror(errno);
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

}  // namespace et_trt
