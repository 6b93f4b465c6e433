// The program's named data (the .pte's data segment, or the .ptd it was loaded
// with) as a NamedDataSource: ExecuTorch's NamedDataMap, for the delegate's
// init (backend.cc) and the .ptd corruption test.
#pragma once

#include <executorch/runtime/core/named_data_map.h>

#include <memory>
#include <string>
#include <vector>

#include "named_data.h"

namespace et_trt {

class ProgramNamedData final : public NamedDataSource {
 public:
  explicit ProgramNamedData(const executorch::runtime::NamedDataMap* map) : map_(map) {}

  bool get(const std::string& key, NamedBytes* out, std::string* error) const override {
    if (map_ == nullptr) {
      *error = "the program was loaded without named data";
      return false;
    }
    auto found = map_->get_data(key.c_str());
    if (!found.ok()) {
      *error = std::string("NamedDataMap: ") + executorch::runtime::to_string(found.error());
      return false;
    }
    auto buffer = std::make_shared<executorch::runtime::FreeableBuffer>(std::move(found.get()));
    out->data = buffer->data();
    out->size = buffer->size();
    out->owner = buffer;
    return true;
  }

  std::vector<std::string> keys() const override {
    std::vector<std::string> out;
    const auto count = map_ == nullptr ? executorch::runtime::Result<uint32_t>(0u) : map_->get_num_keys();
    for (uint32_t i = 0; count.ok() && i < count.get(); ++i) {
      const auto key = map_->get_key(i);
      if (key.ok()) out.emplace_back(key.get());
    }
    return out;
  }

 private:
  const executorch::runtime::NamedDataMap* map_;
};

}  // namespace et_trt
