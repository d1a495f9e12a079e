#include "ferry/registry.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <utility>

#include "ferry/error.h"

namespace ferry {

namespace {

std::string place(const Config& node) { return node.mark().prefix(); }
std::string kind_of(const Config& node) { return node.describe(); }

std::string join(const std::vector<std::string>& names) {
  return names.empty() ? "(none)" : detail::join(names);
}

std::optional<std::int64_t> parse_int(const std::string& s) {
  std::int64_t v = 0;
  const char* end = s.data() + s.size();
  const char* begin = s.data() + (!s.empty() && s[0] == '+' ? 1 : 0);
  const auto r = std::from_chars(begin, end, v);
  if (r.ec != std::errc() || r.ptr != end || begin == end) return std::nullopt;
  return v;
}

std::optional<double> parse_float(const std::string& s) {
  double v = 0;
  const char* end = s.data() + s.size();
  const char* begin = s.data() + (!s.empty() && s[0] == '+' ? 1 : 0);
  const auto r = std::from_chars(begin, end, v);
  if (r.ec != std::errc() || r.ptr != end || begin == end || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::optional<bool> parse_bool(const std::string& s) {
  std::string lower;
  for (const char c : s) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "true" || lower == "yes" || lower == "on") return true;
  if (lower == "false" || lower == "no" || lower == "off") return false;
  return std::nullopt;
}

std::string describe_number_range(const KeySpec& key) {
  if (key.min && key.max) return detail::str(" in [", *key.min, ", ", *key.max, "]");
  if (key.min) return detail::str(" >= ", *key.min);
  if (key.max) return detail::str(" <= ", *key.max);
  return "";
}

// Checks one scalar against the key's element type; returns "" or what was expected.
std::string check_scalar(const KeySpec& key, ValueType element, const Config& value) {
  if (!value.is_scalar()) return "a scalar";
  const std::string& s = value.scalar();
  std::optional<double> number;
  switch (element) {
    case ValueType::kBool:
      return parse_bool(s) ? "" : "true or false";
    case ValueType::kInt: {
      const auto v = parse_int(s);
      if (!v) return "an integer" + describe_number_range(key);
      number = static_cast<double>(*v);
      break;
    }
    case ValueType::kFloat:
      number = parse_float(s);
      if (!number) return "a number" + describe_number_range(key);
      break;
    case ValueType::kString:
      if (!key.choices.empty() &&
          std::find(key.choices.begin(), key.choices.end(), s) == key.choices.end()) {
        return "one of " + join(key.choices);
      }
      return "";
    default:
      return "";
  }
  if ((key.min && *number < *key.min) || (key.max && *number > *key.max)) {
    return std::string(element == ValueType::kInt ? "an integer" : "a number") +
           describe_number_range(key);
  }
  return "";
}

ValueType element_of(ValueType t) {
  switch (t) {
    case ValueType::kIntList:
      return ValueType::kInt;
    case ValueType::kFloatList:
      return ValueType::kFloat;
    case ValueType::kStringList:
      return ValueType::kString;
    default:
      return t;
  }
}

bool is_list_type(ValueType t) {
  return t == ValueType::kIntList || t == ValueType::kFloatList || t == ValueType::kStringList;
}

// A registered collate function: the std::function target that carries its spec.
struct RegisteredCollate {
  CollateFn fn;
  ComponentSpec spec;
  Batch operator()(std::vector<Example> samples) const { return fn(std::move(samples)); }
};

}  // namespace

std::string_view to_string(ComponentKind kind) noexcept {
  switch (kind) {
    case ComponentKind::kDataset:
      return "dataset";
    case ComponentKind::kTransform:
      return "transform";
    case ComponentKind::kSampler:
      return "sampler";
    case ComponentKind::kCollate:
      return "collate";
  }
  return "?";
}

std::string_view to_string(ValueType type) noexcept {
  switch (type) {
    case ValueType::kBool:
      return "bool";
    case ValueType::kInt:
      return "int";
    case ValueType::kFloat:
      return "float";
    case ValueType::kString:
      return "string";
    case ValueType::kIntList:
      return "list of int";
    case ValueType::kFloatList:
      return "list of float";
    case ValueType::kStringList:
      return "list of string";
    case ValueType::kAny:
      return "any";
  }
  return "?";
}

std::optional<std::string> nearest(std::string_view word,
                                   const std::vector<std::string>& candidates) {
  std::optional<std::string> best;
  std::size_t best_distance = 0;
  for (const auto& c : candidates) {
    // Levenshtein distance, one row at a time.
    std::vector<std::size_t> row(c.size() + 1);
    for (std::size_t j = 0; j <= c.size(); ++j) row[j] = j;
    for (std::size_t i = 1; i <= word.size(); ++i) {
      std::size_t diagonal = row[0];
      row[0] = i;
      for (std::size_t j = 1; j <= c.size(); ++j) {
        const std::size_t up = row[j];
        const bool same = std::tolower(static_cast<unsigned char>(word[i - 1])) ==
                          std::tolower(static_cast<unsigned char>(c[j - 1]));
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (same ? 0 : 1)});
        diagonal = up;
      }
    }
    const std::size_t d = row[c.size()];
    if (!best || d < best_distance) {
      best = c;
      best_distance = d;
    }
  }
  if (!best || best_distance > std::max<std::size_t>(2, word.size() / 3)) return std::nullopt;
  return best;
}

bool Args::has(std::string_view key) const {
  const Config* v = config_->find(key);
  return v != nullptr && !v->is_null();
}

const Config& Args::value(std::string_view key) const {
  const Config* v = config_->find(key);
  if (v == nullptr || v->is_null()) {
    throw ConfigError(detail::str(path_, ".", key, ": no value (the type '", info_->name,
                                  "' reads it, but it is not set and has no default)"));
  }
  return *v;
}

void Args::fail(std::string_view key, const std::string& message) const {
  const Config* v = config_->find(key);
  throw ConfigError(detail::str(v != nullptr ? place(*v) : std::string(), path_,
                                key.empty() ? "" : ".", key, ": ", message));
}

template <>
std::string Args::get<std::string>(std::string_view key) const {
  return value(key).scalar();
}
template <>
bool Args::get<bool>(std::string_view key) const {
  const auto v = parse_bool(value(key).scalar());
  if (!v) fail(key, "expected true or false, found '" + value(key).scalar() + "'");
  return *v;
}
template <>
std::int64_t Args::get<std::int64_t>(std::string_view key) const {
  const auto v = parse_int(value(key).scalar());
  if (!v) fail(key, "expected an integer, found '" + value(key).scalar() + "'");
  return *v;
}
template <>
std::size_t Args::get<std::size_t>(std::string_view key) const {
  const auto v = get<std::int64_t>(key);
  if (v < 0) fail(key, detail::str("expected a non-negative integer, found ", v));
  return static_cast<std::size_t>(v);
}
template <>
double Args::get<double>(std::string_view key) const {
  const auto v = parse_float(value(key).scalar());
  if (!v) fail(key, "expected a number, found '" + value(key).scalar() + "'");
  return *v;
}
template <>
std::vector<std::int64_t> Args::get<std::vector<std::int64_t>>(std::string_view key) const {
  std::vector<std::int64_t> out;
  for (const Config& item : value(key).items()) {
    const auto v = parse_int(item.scalar());
    if (!v) fail(key, "expected a list of integers, found '" + item.scalar() + "'");
    out.push_back(*v);
  }
  return out;
}
template <>
std::vector<double> Args::get<std::vector<double>>(std::string_view key) const {
  std::vector<double> out;
  for (const Config& item : value(key).items()) {
    const auto v = parse_float(item.scalar());
    if (!v) fail(key, "expected a list of numbers, found '" + item.scalar() + "'");
    out.push_back(*v);
  }
  return out;
}
template <>
std::vector<std::string> Args::get<std::vector<std::string>>(std::string_view key) const {
  std::vector<std::string> out;
  for (const Config& item : value(key).items()) out.push_back(item.scalar());
  return out;
}

Registry& Registry::global() {
  static auto* registry = new Registry;  // leaked: usable from atexit handlers and workers
  return *registry;
}

void Registry::add(ComponentKind kind, Entry entry) {
  FERRY_CHECK(!entry.info.name.empty(), "Registry: a ", to_string(kind), " type needs a name");
  for (const auto& key : entry.info.keys) {
    FERRY_CHECK(
        key.name != "type" && !(kind == ComponentKind::kDataset && key.name == "transforms"),
        "Registry: ", to_string(kind), " '", entry.info.name, "' declares the reserved key '",
        key.name, "'");
  }
  for (const auto& key : entry.info.keys) {
    if (key.default_value.is_null() || key.type == ValueType::kAny) continue;
    std::string expected;
    if (is_list_type(key.type)) {
      if (!key.default_value.is_list()) expected = std::string(to_string(key.type));
      for (const Config& item :
           key.default_value.size() ? key.default_value.items() : std::vector<Config>{}) {
        if (expected.empty()) expected = check_scalar(key, element_of(key.type), item);
      }
    } else {
      expected = check_scalar(key, key.type, key.default_value);
    }
    FERRY_CHECK(expected.empty(), "Registry: ", to_string(kind), " '", entry.info.name,
                "': the default of key '", key.name, "' is not ", expected);
  }
  auto& table = entries_[kind];
  FERRY_CHECK(table.find(entry.info.name) == table.end(), "Registry: a ", to_string(kind),
              " type named '", entry.info.name, "' is already registered; pick another name");
  std::string name = entry.info.name;
  table.emplace(std::move(name), std::move(entry));
}

void Registry::add_dataset(TypeInfo info, DatasetFactory factory) {
  FERRY_CHECK(factory != nullptr, "Registry: dataset '", info.name, "' has no factory");
  add(ComponentKind::kDataset, Entry{std::move(info), std::move(factory), {}, {}, {}, {}});
}
void Registry::add_iterable_dataset(TypeInfo info, IterableDatasetFactory factory) {
  FERRY_CHECK(factory != nullptr, "Registry: dataset '", info.name, "' has no factory");
  add(ComponentKind::kDataset, Entry{std::move(info), {}, std::move(factory), {}, {}, {}});
}
void Registry::add_transform(TypeInfo info, TransformFactory factory) {
  FERRY_CHECK(factory != nullptr, "Registry: transform '", info.name, "' has no factory");
  add(ComponentKind::kTransform, Entry{std::move(info), {}, {}, std::move(factory), {}, {}});
}
void Registry::add_sampler(TypeInfo info, SamplerFactory factory) {
  FERRY_CHECK(factory != nullptr, "Registry: sampler '", info.name, "' has no factory");
  add(ComponentKind::kSampler, Entry{std::move(info), {}, {}, {}, std::move(factory), {}});
}
void Registry::add_collate(TypeInfo info, CollateFactory factory) {
  FERRY_CHECK(factory != nullptr, "Registry: collate '", info.name, "' has no factory");
  add(ComponentKind::kCollate, Entry{std::move(info), {}, {}, {}, {}, std::move(factory)});
}

bool Registry::claim_group(std::string_view group) { return groups_.emplace(group).second; }

const TypeInfo* Registry::find(ComponentKind kind, std::string_view name) const {
  const auto table = entries_.find(kind);
  if (table == entries_.end()) return nullptr;
  const auto it = table->second.find(name);
  return it == table->second.end() ? nullptr : &it->second.info;
}

std::vector<const TypeInfo*> Registry::types(ComponentKind kind) const {
  std::vector<const TypeInfo*> out;
  const auto table = entries_.find(kind);
  if (table == entries_.end()) return out;
  for (const auto& [name, e] : table->second) out.push_back(&e.info);
  return out;
}

const Registry::Entry& Registry::entry(ComponentKind kind,
                                       const Config& node,
                                       std::string_view path) const {
  const Config* type = node.is_map() ? node.find("type") : &node;
  auto registered = [&] {  // for the error messages only
    std::vector<std::string> names;
    for (const TypeInfo* t : types(kind)) names.push_back(t->name);
    return names;
  };
  if (!node.is_map() && !node.is_scalar()) {
    throw ConfigError(detail::str(place(node), path, ": expected a ", to_string(kind),
                                  " (a map with a 'type' key, or a type name), found ",
                                  kind_of(node)));
  }
  if (type == nullptr || !type->is_scalar()) {
    throw ConfigError(detail::str(place(type != nullptr ? *type : node), path,
                                  ".type: expected the name of a registered ", to_string(kind),
                                  " type, found ", type ? kind_of(*type) : "no 'type' key",
                                  "; registered: ", join(registered())));
  }
  const auto table = entries_.find(kind);
  if (table != entries_.end()) {
    if (const auto it = table->second.find(type->scalar()); it != table->second.end()) {
      return it->second;
    }
  }
  const std::vector<std::string> names = registered();
  const auto suggestion = nearest(type->scalar(), names);
  throw ConfigError(detail::str(
      place(*type), path, node.is_map() ? ".type" : "", ": unknown ", to_string(kind), " type '",
      type->scalar(), "'", suggestion ? "; did you mean '" + *suggestion + "'?" : std::string(),
      " Registered: ", join(names),
      kind == ComponentKind::kDataset
          ? ". A program's own types must be registered (before ferry::init, under spawn)"
          : ""));
}

Config Registry::resolve(ComponentKind kind, const Config& node, std::string_view path) const {
  return resolve(entry(kind, node, path), kind, node, path);
}

Config Registry::resolve(const Entry& e,
                         ComponentKind kind,
                         const Config& node,
                         std::string_view path) const {
  std::vector<std::string> ignore{"type"};
  if (kind == ComponentKind::kDataset) ignore.push_back("transforms");
  const Config keys = check_keys(e.info, node.is_map() ? node : Config(), path,
                                 detail::str(to_string(kind), " '", e.info.name, "'"), ignore);
  Config out = Config::map({{"type", e.info.name}});
  out.set_mark(node.mark());
  for (const auto& [key, value] : keys.entries()) out.set(key, value);
  return out;
}

Config check_keys(const TypeInfo& info,
                  const Config& node,
                  std::string_view path,
                  std::string_view what,
                  const std::vector<std::string>& ignore) {
  Config out = Config::map();
  out.set_mark(node.mark());
  if (!node.is_map() && !node.is_null()) {
    throw ConfigError(detail::str(place(node), path, path.empty() ? "" : ": ",
                                  "expected a map (the keys of ", what, "), found ",
                                  kind_of(node)));
  }
  std::vector<std::string> key_names;
  for (const auto& k : info.keys) key_names.push_back(k.name);
  if (node.is_map()) {
    for (const auto& [key, value] : node.entries()) {
      if (std::find(ignore.begin(), ignore.end(), key) != ignore.end()) continue;
      if (std::find(key_names.begin(), key_names.end(), key) != key_names.end()) continue;
      const auto suggestion = nearest(key, key_names);
      throw ConfigError(
          detail::str(place(value), path, path.empty() ? "" : ".", key, ": unknown key for ", what,
                      suggestion ? "; did you mean '" + *suggestion + "'?" : std::string(),
                      " Keys: ", join(key_names)));
    }
  }
  const std::string prefix = path.empty() ? std::string() : std::string(path) + ".";
  for (const KeySpec& key : info.keys) {
    const Config* value = node.is_map() ? node.find(key.name) : nullptr;
    if (value == nullptr || value->is_null()) {
      if (key.required) {
        throw ConfigError(detail::str(place(node), prefix, key.name, ": missing; ", what,
                                      " needs it (", to_string(key.type),
                                      key.help.empty() ? "" : ": ", key.help, ")"));
      }
      if (!key.default_value.is_null()) out.set(key.name, key.default_value);
      continue;
    }
    std::string expected;
    if (key.type == ValueType::kAny) {
      // anything goes
    } else if (is_list_type(key.type)) {
      if (!value->is_list()) {
        // One value stands for a list of one (torchvision's `size=224` for `size=[224]`).
        expected = check_scalar(key, element_of(key.type), *value);
        if (expected.empty()) {
          Config list = Config::list({*value});
          list.set_mark(value->mark());
          out.set(key.name, std::move(list));
          continue;
        }
        expected = std::string(to_string(key.type)) + " (or one " +
                   std::string(to_string(element_of(key.type))) + ")";
      } else {
        for (const Config& item : value->items()) {
          expected = check_scalar(key, element_of(key.type), item);
          if (!expected.empty()) {
            throw ConfigError(detail::str(place(item), prefix, key.name,
                                          ": expected each element to be ", expected, ", found ",
                                          kind_of(item)));
          }
        }
      }
    } else {
      expected = check_scalar(key, key.type, *value);
    }
    if (!expected.empty()) {
      throw ConfigError(detail::str(place(*value), prefix, key.name, ": expected ", expected,
                                    ", found ", kind_of(*value)));
    }
    out.set(key.name, *value);
  }
  return out;
}

namespace {

// Runs a factory; errors that are not ferry's own get the path and type attached.
template <class F>
auto build(F&& factory, const TypeInfo& info, std::string_view kind, std::string_view path)
    -> decltype(factory()) {
  try {
    return factory();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw ConfigError(
        detail::str(path, ": building ", kind, " '", info.name, "' failed: ", e.what()));
  }
}

}  // namespace

AnyDataset Registry::make_any_dataset(const Config& node,
                                      std::string_view path,
                                      std::string_view transforms_path) const {
  const Entry& e = entry(ComponentKind::kDataset, node, path);
  Config resolved = resolve(e, ComponentKind::kDataset, node, path);
  bool builtin = e.info.builtin;
  // The transforms first: a bad transform is reported before the dataset opens its files.
  TransformList transforms;
  Config resolved_transforms = Config::list();
  if (const Config* list = node.is_map() ? node.find("transforms") : nullptr;
      list != nullptr && !list->is_null()) {
    const std::string where =
        transforms_path.empty() ? std::string(path) + ".transforms" : std::string(transforms_path);
    if (!list->is_list()) {
      throw ConfigError(detail::str(place(*list), where, ": expected a list of transforms, found ",
                                    kind_of(*list)));
    }
    for (std::size_t i = 0; i < list->items().size(); ++i) {
      auto t = make_transform(list->items()[i], detail::str(where, "[", i, "]"));
      builtin = builtin && t->spec()->builtin;
      resolved_transforms.push_back(t->spec()->config);
      transforms.push_back(std::move(t));
    }
  }
  const Args args(e.info, resolved, std::string(path));
  AnyDataset out;
  if (e.dataset) {
    std::shared_ptr<Dataset> d = build([&] { return e.dataset(args); }, e.info, "dataset", path);
    FERRY_CHECK(d != nullptr, path, ": the factory of dataset '", e.info.name, "' returned null");
    if (!transforms.empty()) d = apply_transforms(std::move(d), transforms);
    out = std::move(d);
  } else {
    std::shared_ptr<IterableDataset> d =
        build([&] { return e.iterable(args); }, e.info, "dataset", path);
    FERRY_CHECK(d != nullptr, path, ": the factory of dataset '", e.info.name, "' returned null");
    if (!transforms.empty()) {
      d = std::make_shared<TransformedIterableDataset>(std::move(d), transforms);
    }
    out = std::move(d);
  }
  if (!transforms.empty()) resolved.set("transforms", std::move(resolved_transforms));
  ComponentSpec spec{resolved, resolved.hash(), builtin};
  std::visit(
      [&](auto& d) {
        // A factory that hands out one shared object would have its spec overwritten by the
        // next configuration, and a spawned worker would rebuild the wrong dataset.
        FERRY_CHECK(d->spec() == nullptr, path, ": the factory of dataset '", e.info.name,
                    "' returned an object the registry already built; return a new object");
        d->set_spec(std::move(spec));
      },
      out);
  return out;
}

std::shared_ptr<Dataset> Registry::make_dataset(const Config& node, std::string_view path) const {
  AnyDataset any = make_any_dataset(node, path);
  if (auto* map = std::get_if<std::shared_ptr<Dataset>>(&any)) return std::move(*map);
  throw ConfigError(detail::str(place(node), path, ": dataset type '",
                                std::get<1>(any)->spec()->config.find("type")->scalar(),
                                "' is an iterable dataset; a map-style dataset is needed here"));
}

std::shared_ptr<Transform> Registry::make_transform(const Config& node,
                                                    std::string_view path) const {
  const Entry& e = entry(ComponentKind::kTransform, node, path);
  Config resolved = resolve(e, ComponentKind::kTransform, node, path);
  const Args args(e.info, resolved, std::string(path));
  auto t = build([&] { return e.transform(args); }, e.info, "transform", path);
  FERRY_CHECK(t != nullptr, path, ": the factory of transform '", e.info.name, "' returned null");
  const std::uint64_t hash = resolved.hash();
  t->set_spec(ComponentSpec{std::move(resolved), hash, e.info.builtin});
  return t;
}

std::shared_ptr<Sampler> Registry::make_sampler(const Config& node,
                                                const SamplerContext& context,
                                                std::string_view path) const {
  const Entry& e = entry(ComponentKind::kSampler, node, path);
  const Config resolved = resolve(e, ComponentKind::kSampler, node, path);
  const Args args(e.info, resolved, std::string(path));
  auto s = build([&] { return e.sampler(args, context); }, e.info, "sampler", path);
  FERRY_CHECK(s != nullptr, path, ": the factory of sampler '", e.info.name, "' returned null");
  return s;
}

CollateFn Registry::make_collate(const Config& node, std::string_view path) const {
  const Entry& e = entry(ComponentKind::kCollate, node, path);
  Config resolved = resolve(e, ComponentKind::kCollate, node, path);
  const Args args(e.info, resolved, std::string(path));
  CollateFn fn = build([&] { return e.collate(args); }, e.info, "collate", path);
  FERRY_CHECK(fn != nullptr, path, ": the factory of collate '", e.info.name, "' returned null");
  const std::uint64_t hash = resolved.hash();
  return RegisteredCollate{std::move(fn), ComponentSpec{std::move(resolved), hash, e.info.builtin}};
}

const ComponentSpec* collate_spec(const CollateFn& collate_fn) noexcept {
  const auto* registered = collate_fn.target<RegisteredCollate>();
  return registered != nullptr ? &registered->spec : nullptr;
}

}  // namespace ferry
