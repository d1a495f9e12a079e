#include "ferry/batch.h"

#include "ferry/error.h"

namespace ferry {

const Batch::Value* Batch::find(std::string_view name) const noexcept {
  for (std::size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == name) return &values_[i];
  }
  return nullptr;
}

std::string Batch::field_names() const {
  std::string names;
  for (const auto& name : names_) {
    if (!names.empty()) names += ", ";
    names += name;
  }
  return names.empty() ? std::string("(none)") : names;
}

const torch::Tensor& Batch::operator[](std::string_view name) const {
  const Value* value = find(name);
  if (value == nullptr) {
    throw Error(detail::str("batch has no field '", name, "'; its fields are: ", field_names()));
  }
  if (const auto* tensor = std::get_if<torch::Tensor>(value)) return *tensor;
  throw Error(detail::str("batch field '", name,
                          "' holds strings, not a tensor; read it with batch.strings(\"", name,
                          "\")"));
}

const std::vector<std::string>& Batch::strings(std::string_view name) const {
  const Value* value = find(name);
  if (value == nullptr) {
    throw Error(detail::str("batch has no field '", name, "'; its fields are: ", field_names()));
  }
  if (const auto* list = std::get_if<std::vector<std::string>>(value)) return *list;
  throw Error(detail::str("batch field '", name,
                          "' is a tensor, not strings; read it with batch[\"", name, "\"]"));
}

bool Batch::is_tensor(std::string_view name) const {
  const Value* value = find(name);
  return value != nullptr && std::holds_alternative<torch::Tensor>(*value);
}

Batch& Batch::set(std::string name, Value value) {
  for (std::size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == name) {
      values_[i] = std::move(value);
      return *this;
    }
  }
  names_.push_back(std::move(name));
  values_.push_back(std::move(value));
  return *this;
}

template <class F>
Batch Batch::map_tensors(F&& f) const {
  Batch out = *this;
  for (auto& value : out.values_) {
    if (auto* tensor = std::get_if<torch::Tensor>(&value)) *tensor = f(*tensor);
  }
  return out;
}

Batch Batch::to(const torch::Device& device, bool non_blocking) const {
  return map_tensors([&](const torch::Tensor& t) { return t.to(device, non_blocking); });
}

Batch Batch::pin_memory() const {
  // Only CPU tensors can be pinned; a field already on a device stays as it is.
  return map_tensors(
      [](const torch::Tensor& t) { return !t.is_cpu() || t.is_pinned() ? t : t.pin_memory(); });
}

}  // namespace ferry
