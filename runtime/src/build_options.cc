#include "build_options.h"


namespace et_trt {
namespace {

const char* type_name(OptionType type) {
  switch (type) {
    case OptionType::kBool:
      return "bool";
    case OptionType::kInt:
      return "int";
    case OptionType::kChoice:
      return "choice";
  }
  return "option";
}

// The entry's value as the table stores it (a choice's index), or false with `error`.
bool entry_value(const blob::BuildOption& entry, const OptionSpec& spec, const std::string& where, int64_t* value,
                 std::string* error) {
  const blob::OptionValue expected = spec.type == OptionType::kBool  ? blob::OptionValue::BoolValue
                                     : spec.type == OptionType::kInt ? blob::OptionValue::IntValue
                                                                     : blob::OptionValue::ChoiceValue;
  if (entry.value_type() != expected || entry.value() == nullptr) {
    const char* given = blob::EnumNameOptionValue(entry.value_type());
    *error = where + ": '" + spec.name + "' holds a value of type " + (given[0] != '\0' ? given : "an unknown one") +
             "; the option's type is " + type_name(spec.type);
    return false;
  }
  if (spec.type == OptionType::kBool) {
    *value = entry.value_as_BoolValue()->value() ? 1 : 0;
    return true;
  }
  if (spec.type == OptionType::kInt) {
    *value = entry.value_as_IntValue()->value();
    if (*value < spec.min || *value > spec.max) {
      *error = where + ": '" + spec.name + "' must be an integer " + std::to_string(spec.min) + "-" +
               std::to_string(spec.max) + ", got " + std::to_string(*value);
      return false;
    }
    return true;
  }
  const flatbuffers::String* name = entry.value_as_ChoiceValue()->value();
  std::string choices;
  for (size_t i = 0; i < spec.choice_count; ++i) {
    if (name != nullptr && name->str() == spec.choices[i]) {
      *value = static_cast<int64_t>(i);
      return true;
    }
    choices += std::string(i > 0 ? ", " : "") + spec.choices[i];
  }
  *error = where + ": '" + spec.name + "' must be one of " + choices + ", got '" +
           (name != nullptr ? name->str() : std::string()) + "'";
  return false;
}

}  // namespace

bool BuildOptions::decode(const BuildOptionEntries* entries, const OptionSpec* specs, size_t count,
                          std::string* error) {
  specs_ = specs;
  values_.assign(count, std::nullopt);
  for (flatbuffers::uoffset_t i = 0; entries != nullptr && i < entries->size(); ++i) {
    const blob::BuildOption& entry = *entries->Get(i);
    const std::string where = "build_options[" + std::to_string(i) + "]";
    const std::string name = entry.name() != nullptr ? entry.name()->str() : "";
    size_t index = 0;
    while (index < count && name != specs[index].name) ++index;
    if (index == count) {
      *error = where + ": '" + name + "' is not a build option of this runtime; re-export the model with the " +
               "et-trt version of this runtime";
      return false;
    }
    if (values_[index].has_value()) {
      *error = where + ": '" + name + "' is set twice";
      return false;
    }
    int64_t value = 0;
    if (!entry_value(entry, specs[index], where, &value, error)) return false;
    values_[index] = value;
  }
  for (size_t i = 0; i < count; ++i) {
    if (!values_[i].has_value() && specs[i].has_default) values_[i] = specs[i].default_value;
  }
  return true;
}

std::optional<bool> BuildOptions::get(BoolOption option) const {
  const std::optional<int64_t>& value = values_.at(option.index);
  return value.has_value() ? std::optional<bool>(*value != 0) : std::nullopt;
}

std::optional<int64_t> BuildOptions::get(IntOption option) const { return values_.at(option.index); }

std::optional<std::string_view> BuildOptions::get(ChoiceOption option) const {
  const std::optional<int64_t>& value = values_.at(option.index);
  return value.has_value() ? std::optional<std::string_view>(specs_[option.index].choices[*value]) : std::nullopt;
}

}  // namespace et_trt
