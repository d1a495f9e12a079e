#include "ferry/example.h"

#include "ferry/error.h"

namespace ferry {

namespace {
constexpr const char* kKindNames[] = {"tensor", "int", "double", "string"};
}  // namespace

const char* Field::kind() const noexcept { return kKindNames[value_.index()]; }

const torch::Tensor& Field::tensor() const {
  if (!is_tensor()) throw Error(detail::str("field holds a ", kind(), ", not a tensor"));
  return std::get<torch::Tensor>(value_);
}

std::int64_t Field::to_int() const {
  if (is_tensor()) {
    const auto& t = std::get<torch::Tensor>(value_);
    if (t.defined() && t.dim() == 0 &&
        (t.scalar_type() == torch::kBool || c10::isIntegralType(t.scalar_type(), false))) {
      return t.item<std::int64_t>();
    }
  }
  if (!is_int()) throw Error(detail::str("field holds a ", kind(), ", not an int"));
  return std::get<std::int64_t>(value_);
}

double Field::to_double() const {
  if (is_int()) return static_cast<double>(std::get<std::int64_t>(value_));
  if (!is_double()) throw Error(detail::str("field holds a ", kind(), ", not a number"));
  return std::get<double>(value_);
}

const std::string& Field::str() const {
  if (!is_string()) throw Error(detail::str("field holds a ", kind(), ", not a string"));
  return std::get<std::string>(value_);
}

Example::Example(std::initializer_list<Entry> fields) {
  fields_.reserve(fields.size());
  for (const auto& [name, value] : fields) set(name, value);
}

Example& Example::set(std::string name, Field value) {
  for (auto& entry : fields_) {
    if (entry.first == name) {
      entry.second = std::move(value);
      return *this;
    }
  }
  fields_.emplace_back(std::move(name), std::move(value));
  return *this;
}

const Field* Example::find(std::string_view name) const noexcept {
  for (const auto& entry : fields_) {
    if (entry.first == name) return &entry.second;
  }
  return nullptr;
}

const Field& Example::operator[](std::string_view name) const {
  if (const Field* field = find(name)) return *field;
  throw Error(detail::str("sample ", index_, " has no field '", name,
                          "'; its fields are: ", field_names()));
}

std::string Example::field_names() const {
  std::string names;
  for (const auto& entry : fields_) {
    if (!names.empty()) names += ", ";
    names += entry.first;
  }
  return names.empty() ? std::string("(none)") : names;
}

}  // namespace ferry
