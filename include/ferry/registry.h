#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "ferry/collate.h"
#include "ferry/config.h"
#include "ferry/dataset.h"
#include "ferry/sampler.h"
#include "ferry/transform.h"

namespace ferry {

/// The kinds of component the registry builds.
enum class ComponentKind { kDataset, kTransform, kSampler, kCollate };
std::string_view to_string(ComponentKind kind) noexcept;

/// The type a configuration key takes.
enum class ValueType { kBool, kInt, kFloat, kString, kIntList, kFloatList, kStringList, kAny };
std::string_view to_string(ValueType type) noexcept;

/// One key of a registered type: the validator, `ferry describe` and the factories all read it.
struct KeySpec {
  std::string name;
  ValueType type = ValueType::kString;
  bool required = false;
  Config default_value{};  // used when the key is absent; null: absent stays absent
  std::string help{};
  std::optional<double> min{};  // numbers and each list element
  std::optional<double> max{};
  std::vector<std::string> choices{};  // strings
  bool is_path = false;  // a file or folder: a YAML pipeline resolves it against the file's folder
};

/// A registered type: its name, a one-line summary and its keys.
struct TypeInfo {
  std::string name;
  std::string summary{};
  std::vector<KeySpec> keys{};
  bool builtin = false;  // registered by ferry itself (see ComponentSpec::builtin)
};

/// A resolved configuration as a factory sees it: every key validated, defaults filled in.
/// `get<T>` reads a key as int64_t, std::size_t, double, bool, std::string, or a vector of
/// int64_t, double or std::string. `fail` raises ConfigError naming the key's path and place.
class Args {
 public:
  Args(const TypeInfo& info, const Config& config, std::string path)
      : info_(&info), config_(&config), path_(std::move(path)) {}
  bool has(std::string_view key) const;  // present and not null
  template <class T>
  T get(std::string_view key) const;
  const Config& config() const noexcept { return *config_; }
  const std::string& path() const noexcept { return path_; }
  const TypeInfo& info() const noexcept { return *info_; }
  [[noreturn]] void fail(std::string_view key, const std::string& message) const;

 private:
  const Config& value(std::string_view key) const;
  const TypeInfo* info_;
  const Config* config_;
  std::string path_;
};

template <>
std::string Args::get<std::string>(std::string_view key) const;
template <>
bool Args::get<bool>(std::string_view key) const;
template <>
std::int64_t Args::get<std::int64_t>(std::string_view key) const;
template <>
std::size_t Args::get<std::size_t>(std::string_view key) const;
template <>
double Args::get<double>(std::string_view key) const;
template <>
std::vector<std::int64_t> Args::get<std::vector<std::int64_t>>(std::string_view key) const;
template <>
std::vector<double> Args::get<std::vector<double>>(std::string_view key) const;
template <>
std::vector<std::string> Args::get<std::vector<std::string>>(std::string_view key) const;

/// What a sampler factory gets besides its keys.
struct SamplerContext {
  std::size_t dataset_size = 0;
  std::uint64_t seed = 0;  // the loader's seed
};

using DatasetFactory = std::function<std::shared_ptr<Dataset>(const Args&)>;
using IterableDatasetFactory = std::function<std::shared_ptr<IterableDataset>(const Args&)>;
using TransformFactory = std::function<std::shared_ptr<Transform>(const Args&)>;
using SamplerFactory = std::function<std::shared_ptr<Sampler>(const Args&, const SamplerContext&)>;
using CollateFactory = std::function<CollateFn(const Args&)>;

using AnyDataset = std::variant<std::shared_ptr<Dataset>, std::shared_ptr<IterableDataset>>;

/// Dataset, transform, sampler and collate types by name, each with the keys it takes and a
/// factory from a configuration node `{type: NAME, key: value, ...}`. YAML pipelines build
/// from it, and a spawned worker rebuilds its dataset from it, so register your types before
/// `ferry::init(argc, argv)`: a spawned worker runs `main` up to that call.
///
///   auto& registry = ferry::Registry::global();
///   registry.add_dataset({.name = "my_dataset", .keys = {{.name = "size", .type =
///                        ferry::ValueType::kInt, .required = true}}},
///                        [](const ferry::Args& a) {
///                          return std::make_shared<MyDataset>(a.get<std::size_t>("size"));
///                        });
///   auto dataset = registry.make_dataset(ferry::Config::map({{"type", "my_dataset"},
///                                                            {"size", 100}}));
///
/// Registration is not thread-safe; building (make_*) is, once registration is done.
class Registry {
 public:
  /// The registry ferry::init and the YAML pipelines use. Empty until something registers;
  /// ferry::register_builtins adds ferry's own types.
  static Registry& global();

  /// Adds a type; throws ConfigError if the name is taken for that kind.
  void add_dataset(TypeInfo info, DatasetFactory factory);
  void add_iterable_dataset(TypeInfo info, IterableDatasetFactory factory);
  void add_transform(TypeInfo info, TransformFactory factory);
  void add_sampler(TypeInfo info, SamplerFactory factory);
  void add_collate(TypeInfo info, CollateFactory factory);

  /// True the first time it is called with `group` (for idempotent registration functions).
  bool claim_group(std::string_view group);

  const TypeInfo* find(ComponentKind kind, std::string_view name) const;
  std::vector<const TypeInfo*> types(ComponentKind kind) const;  // sorted by name

  /// Checks `node` (`{type: NAME, ...}`) against the type's keys and returns it with every
  /// default filled in, keys in the type's order. Throws ConfigError naming `path`, the key,
  /// what was expected and what was found, with "did you mean" for unknown names.
  Config resolve(ComponentKind kind, const Config& node, std::string_view path) const;

  /// Builds a dataset. `node` may also hold `transforms: [{type: ..., ...}, ...]`, applied to
  /// each sample in order; they are built (and their errors reported, under `transforms_path`,
  /// by default `path.transforms`) before the dataset opens its files. The result records its
  /// ComponentSpec (see Dataset::spec()).
  AnyDataset make_any_dataset(const Config& node,
                              std::string_view path = "dataset",
                              std::string_view transforms_path = {}) const;
  std::shared_ptr<Dataset> make_dataset(const Config& node,
                                        std::string_view path = "dataset") const;
  std::shared_ptr<Transform> make_transform(const Config& node,
                                            std::string_view path = "transform") const;
  std::shared_ptr<Sampler> make_sampler(const Config& node,
                                        const SamplerContext& context,
                                        std::string_view path = "sampler") const;
  /// The returned function carries its ComponentSpec, so it can travel to spawned workers.
  CollateFn make_collate(const Config& node, std::string_view path = "collate") const;

 private:
  struct Entry {
    TypeInfo info;
    DatasetFactory dataset;
    IterableDatasetFactory iterable;
    TransformFactory transform;
    SamplerFactory sampler;
    CollateFactory collate;
  };
  const Entry& entry(ComponentKind kind, const Config& node, std::string_view path) const;
  Config resolve(const Entry& e,
                 ComponentKind kind,
                 const Config& node,
                 std::string_view path) const;
  void add(ComponentKind kind, Entry entry);
  std::map<ComponentKind, std::map<std::string, Entry, std::less<>>> entries_;
  std::set<std::string, std::less<>> groups_;
};

/// Checks the keys of `node` (a map; null for none) against `info.keys`: an unknown key (with
/// "did you mean"), a missing required key, a wrong type, a value out of range or not among the
/// choices each throw ConfigError naming the place, `path.key`, what was expected and what was
/// found. Returns the keys in `info`'s order with defaults filled in. `what` names the section
/// in messages ("dataset 'image_folder'", "loader"); keys in `ignore` are passed over. The
/// registry checks every component with it; a YAML pipeline checks its other sections too.
Config check_keys(const TypeInfo& info,
                  const Config& node,
                  std::string_view path,
                  std::string_view what,
                  const std::vector<std::string>& ignore = {});

/// Registers ferry's core types (the `synthetic` dataset, the token datasets of ferry/tokens.h,
/// the samplers, the `default`, `pad` and `pack` collates); idempotent. ferry::register_builtins
/// (ferry/init.h) adds every component that was built.
void register_core_types(Registry& registry);

/// The spec of a collate function made by Registry::make_collate, or null.
const ComponentSpec* collate_spec(const CollateFn& collate_fn) noexcept;

/// The closest of `candidates` to `word` by edit distance, if close enough to suggest.
std::optional<std::string> nearest(std::string_view word,
                                   const std::vector<std::string>& candidates);

}  // namespace ferry
