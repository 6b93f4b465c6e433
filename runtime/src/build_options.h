// The blob's build options (schema.fbs, table BuildOption: typed name/value
// entries), decoded once and checked against the table the runtime's build
// generates from et_trt_backend/options.py (build_options_generated.h: kSpecs and
// one typed constant per option, e.g. build_option::optimization_level).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "schema_generated.h"

namespace et_trt {

enum class OptionType { kBool, kInt, kChoice };

// One build option as options.py declares it.
struct OptionSpec {
  const char* name;
  OptionType type;
  bool has_default;       // false: no entry means the builder's own default
  int64_t default_value;  // a bool's 0 or 1, an int, a choice's index
  int64_t min, max;       // the values an int may take (a bool's 0-1, a choice's indices)
  const char* const* choices;
  size_t choice_count;
};

// An option of the generated table, typed so that a lookup of the wrong type does not compile.
template <OptionType kType>
struct Option {
  size_t index;  // into the table
};
using BoolOption = Option<OptionType::kBool>;
using IntOption = Option<OptionType::kInt>;
using ChoiceOption = Option<OptionType::kChoice>;

using BuildOptionEntries = flatbuffers::Vector<flatbuffers::Offset<blob::BuildOption>>;

class BuildOptions {
 public:
  // Reads `entries` (null: none) against the table `specs`; false with `error` naming the entry where one has
  // a name the table lacks, another type than its option, a value out of its range, or is given twice.
  bool decode(const BuildOptionEntries* entries, const OptionSpec* specs, size_t count, std::string* error);

  // The blob's value, else the option's default; empty when it has neither (the builder's default applies).
  std::optional<bool> get(BoolOption option) const;
  std::optional<int64_t> get(IntOption option) const;
  std::optional<std::string_view> get(ChoiceOption option) const;

 private:
  const OptionSpec* specs_ = nullptr;
  std::vector<std::optional<int64_t>> values_;  // per spec; a choice's index
};

}  // namespace et_trt
