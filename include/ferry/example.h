#pragma once

#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <torch/types.h>

namespace ferry {

/// One field of a sample: a tensor, an integer, a real number or a string. Integers and reals
/// of any width convert implicitly, so `{"label", 3}` and `{"weight", 0.5f}` read naturally. A
/// `bool` becomes a 0-dim torch::kBool tensor, so a batch of them is a kBool mask, as PyTorch's
/// default_collate makes it (an int64 0/1 tensor would gather rows instead of masking them).
class Field {
 public:
  using Value = std::variant<torch::Tensor, std::int64_t, double, std::string>;

  Field(torch::Tensor tensor) : value_(std::move(tensor)) {}  // NOLINT: implicit by design
  template <std::integral T>
  requires(!std::same_as<T, bool>) Field(T value)
      : value_(static_cast<std::int64_t>(value)) {}                         // NOLINT
  Field(bool value) : value_(torch::scalar_tensor(value, torch::kBool)) {}  // NOLINT
  template <std::floating_point T>
  Field(T value) : value_(static_cast<double>(value)) {}         // NOLINT
  Field(std::string value) : value_(std::move(value)) {}         // NOLINT
  Field(std::string_view value) : value_(std::string(value)) {}  // NOLINT
  Field(const char* value) : value_(std::string(value)) {}       // NOLINT

  bool is_tensor() const noexcept { return value_.index() == 0; }
  bool is_int() const noexcept { return value_.index() == 1; }
  bool is_double() const noexcept { return value_.index() == 2; }
  bool is_string() const noexcept { return value_.index() == 3; }

  /// Typed access; throws `ferry::Error` naming the kind actually held.
  const torch::Tensor& tensor() const;
  /// An int, or a 0-dim integral or bool tensor (a bool field).
  std::int64_t to_int() const;
  double to_double() const;
  const std::string& str() const;

  /// "tensor", "int", "double" or "string".
  const char* kind() const noexcept;
  const Value& value() const noexcept { return value_; }

 private:
  Value value_;
};

/// One sample as named fields, in insertion order. Cheap to move; tensors are shared, not copied.
///
///   ferry::Example ex{{"image", torch::rand({3, 32, 32})}, {"label", 7}};
class Example {
 public:
  using Entry = std::pair<std::string, Field>;

  Example() = default;
  Example(std::initializer_list<Entry> fields);

  /// Adds a field, or replaces the field of that name. Returns `*this` for chaining.
  Example& set(std::string name, Field value);

  /// The field `name`; throws `ferry::Error` listing the fields present when it is missing.
  const Field& operator[](std::string_view name) const;
  const Field* find(std::string_view name) const noexcept;
  bool contains(std::string_view name) const noexcept { return find(name) != nullptr; }

  std::size_t size() const noexcept { return fields_.size(); }
  bool empty() const noexcept { return fields_.empty(); }
  auto begin() const noexcept { return fields_.begin(); }
  auto end() const noexcept { return fields_.end(); }

  /// The dataset index this sample was loaded from, set by the loader (-1 when unknown).
  std::int64_t index() const noexcept { return index_; }
  void set_index(std::int64_t index) noexcept { index_ = index; }

  /// The field names, comma-separated, for messages.
  std::string field_names() const;

 private:
  std::vector<Entry> fields_;
  std::int64_t index_ = -1;
};

}  // namespace ferry
