#include "loader/state_json.h"

#include "core/hash.h"

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
  return detail::hex64(detail::fnv1a(data, bytes));
}

namespace {
constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
}

std::string base64_encode(const std::vector<unsigned char>& bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    const std::uint32_t chunk = (static_cast<std::uint32_t>(bytes[i]) << 16) |
                                (i + 1 < bytes.size() ? bytes[i + 1] << 8 : 0) |
                                (i + 2 < bytes.size() ? bytes[i + 2] : 0);
    out += kBase64[(chunk >> 18) & 63];
    out += kBase64[(chunk >> 12) & 63];
    out += i + 1 < bytes.size() ? kBase64[(chunk >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kBase64[chunk & 63] : '=';
  }
  return out;
}

std::optional<std::vector<unsigned char>> base64_decode(std::string_view text) {
  if (text.size() % 4 != 0) return std::nullopt;
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::vector<unsigned char> out;
  out.reserve(text.size() / 4 * 3);
  for (std::size_t i = 0; i < text.size(); i += 4) {
    std::uint32_t chunk = 0;
    int padding = 0;
    for (std::size_t k = 0; k < 4; ++k) {
      const char c = text[i + k];
      if (c == '=' && i + 4 == text.size() && k >= 2) {
        ++padding;
        chunk <<= 6;
        continue;
      }
      const int v = value(c);
      if (v < 0 || padding > 0) return std::nullopt;
      chunk = (chunk << 6) | static_cast<std::uint32_t>(v);
    }
    out.push_back(static_cast<unsigned char>(chunk >> 16));
    if (padding < 2) out.push_back(static_cast<unsigned char>(chunk >> 8));
    if (padding < 1) out.push_back(static_cast<unsigned char>(chunk));
  }
  return out;
}

}  // namespace ferry::detail::state_json
