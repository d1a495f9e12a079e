#include "loader/state_json.h"

#include <cstdio>

namespace ferry::detail::state_json {

namespace {

std::string field(std::string_view path, const char* name) {
  return path.empty() ? std::string(name) : detail::str(path, ".", name);
}

template <class T>
const char* kind_name() {
  if constexpr (std::is_same_v<T, bool>) return "true or false";
  if constexpr (std::is_same_v<T, std::string>) return "a string";
  if constexpr (std::is_same_v<T, Json>) return "a JSON value";
  return "a non-negative integer";
}

}  // namespace

Json parse_object(std::string_view text, std::string_view what) {
  Json json;
  try {
    json = Json::parse(text.begin(), text.end());
  } catch (const Json::parse_error& e) {
    throw ConfigError(detail::str(what, " is not valid JSON (cut short or edited?): ", e.what()));
  }
  if (!json.is_object()) {
    throw ConfigError(detail::str(what, " is JSON but not an object: ", json.dump().substr(0, 80)));
  }
  return json;
}

template <class T>
T get(const Json& object, std::string_view path, const char* name) {
  const auto it = object.find(name);
  if (it == object.end()) {
    throw ConfigError(detail::str("'", field(path, name), "' is missing"));
  }
  const Json& value = *it;
  bool ok = false;
  if constexpr (std::is_same_v<T, bool>) {
    ok = value.is_boolean();
  } else if constexpr (std::is_same_v<T, std::string>) {
    ok = value.is_string();
  } else if constexpr (std::is_same_v<T, Json>) {
    ok = true;
  } else {
    ok =
        value.is_number_unsigned() || (value.is_number_integer() && value.get<std::int64_t>() >= 0);
  }
  if (!ok) {
    throw ConfigError(detail::str("'", field(path, name), "' is ", value.dump().substr(0, 80),
                                  ", not ", kind_name<T>()));
  }
  return value.get<T>();
}

template std::uint64_t get<std::uint64_t>(const Json&, std::string_view, const char*);
template bool get<bool>(const Json&, std::string_view, const char*);
template std::string get<std::string>(const Json&, std::string_view, const char*);
template Json get<Json>(const Json&, std::string_view, const char*);

std::string fingerprint(const void* data, std::size_t bytes) {
  std::uint64_t h = 14695981039346656037ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

}  // namespace ferry::detail::state_json
