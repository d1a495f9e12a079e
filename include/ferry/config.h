#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ferry {

/// Where a configuration value came from ("train.yaml:3:7"); empty for values built in code.
struct ConfigMark {
  std::string file;
  std::size_t line = 0;  // 1-based; 0: unknown
  std::size_t column = 0;
  bool known() const noexcept { return line > 0; }
  std::string str() const;     // "file:line:column", or "" when unknown
  std::string prefix() const;  // str() and ": ", or "" when unknown: the start of a message
};

/// A plain configuration tree: null, a scalar (kept as text, read with the type the schema
/// asks for), a list, or a map that keeps its keys in order. It is what a YAML file parses to
/// and what a spawned worker receives to rebuild a dataset, as canonical text (`to_text`).
///
///   ferry::Config node = ferry::Config::map({{"type", "synthetic"}, {"size", 1000}});
class Config {
 public:
  enum class Kind : std::uint8_t { kNull, kScalar, kList, kMap };
  using Entry = std::pair<std::string, Config>;

  Config() = default;  // null
  Config(std::string scalar) : kind_(Kind::kScalar), scalar_(std::move(scalar)) {}
  Config(const char* scalar) : Config(std::string(scalar)) {}
  Config(bool value) : Config(std::string(value ? "true" : "false")) {}
  template <std::integral T>
  requires(!std::same_as<T, bool> && !std::same_as<T, char>) Config(T value)
      : Config(std::to_string(value)) {}
  template <std::floating_point T>
  Config(T value) : Config(format_double(static_cast<double>(value))) {}

  static Config list(std::vector<Config> items = {});
  static Config map(std::vector<Entry> entries = {});

  Kind kind() const noexcept { return kind_; }
  bool is_null() const noexcept { return kind_ == Kind::kNull; }
  bool is_scalar() const noexcept { return kind_ == Kind::kScalar; }
  bool is_list() const noexcept { return kind_ == Kind::kList; }
  bool is_map() const noexcept { return kind_ == Kind::kMap; }

  /// The scalar's text; throws ConfigError for another kind.
  const std::string& scalar() const;
  /// A list's items; throws ConfigError for another kind.
  const std::vector<Config>& items() const;
  /// A map's entries in order; throws ConfigError for another kind.
  const std::vector<Entry>& entries() const;
  std::size_t size() const noexcept;

  /// A map's value for `key`, or null when absent (or when this is not a map).
  const Config* find(std::string_view key) const noexcept;
  /// Sets `key` of a map (a null Config becomes an empty map first): replaces, or appends.
  Config& set(std::string key, Config value);
  bool erase(std::string_view key);
  /// Appends to a list (a null Config becomes an empty list first).
  void push_back(Config item);

  /// What an error message says was found: "'text'" for a scalar, "a list", "a map", or
  /// "nothing (null)".
  std::string describe() const;

  const ConfigMark& mark() const noexcept { return mark_; }
  void set_mark(ConfigMark mark) { mark_ = std::move(mark); }

  /// Canonical one-line text: JSON with every scalar a string, keys in order. parse_text()
  /// reads it back; equal trees give equal text, so hash() identifies a configuration.
  std::string to_text() const;
  static Config parse_text(std::string_view text);
  std::uint64_t hash() const;  // FNV-1a of to_text()

  friend bool operator==(const Config& a, const Config& b);  // ignores marks

 private:
  static std::string format_double(double value);
  Kind kind_ = Kind::kNull;
  std::string scalar_;
  std::vector<Config> items_;
  std::vector<Entry> entries_;
  ConfigMark mark_;
};

/// How the registry built a component: its resolved configuration (type, every key with its
/// default filled in) and that configuration's hash. A spawned worker rebuilds the component
/// from it and checks that its own resolved configuration has the same hash.
struct ComponentSpec {
  Config config;
  std::uint64_t hash = 0;
  bool builtin = false;  // only built-in types: the ferry-worker program can rebuild it
};

/// "0x" followed by 16 hex digits.
std::string hash_string(std::uint64_t hash);

}  // namespace ferry
