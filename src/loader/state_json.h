#pragma once

// Reading and checking the JSON of a loader checkpoint (DataLoader::state()). Every error is a
// ferry::ConfigError that names the field by its path ("sampler.seed"), so the loader can add
// where the text came from.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "ferry/error.h"

namespace ferry::detail::state_json {

using Json = nlohmann::json;

// Parses `text` as a JSON object; `what` names it in the error ("the sampler's state").
Json parse_object(std::string_view text, std::string_view what);

// `object[name]`, which must be there and be a `T` (an unsigned integer, a bool, a string, an
// object or array as Json). `path` is the field's path for errors ("sampler").
template <class T>
T get(const Json& object, std::string_view path, const char* name);

// Field `name` of `saved` must equal `now`: the argument the state was saved with and the one
// this loader or sampler has. `fix` says what to change ("pass seed = 42 to the sampler").
template <class T>
void expect(const Json& saved, std::string_view path, const char* name, const T& now) {
  const T then = get<T>(saved, path, name);
  if (then != now) {
    throw ConfigError(detail::str("'", path, path.empty() ? "" : ".", name,
                                  "': the state was saved with ", Json(then).dump(),
                                  ", but this loader has ", Json(now).dump(),
                                  "; resume with the same value, or start the epoch afresh"));
  }
}

// A short fingerprint of bytes (FNV-1a, hex), for lists too long to keep in a state (the
// weights of a WeightedRandomSampler, the indices of a SubsetRandomSampler).
std::string fingerprint(const void* data, std::size_t bytes);

// Base64 (RFC 4648, with padding), for binary state such as a generator's.
std::string base64_encode(const std::vector<unsigned char>& bytes);
// nullopt if `text` is not base64.
std::optional<std::vector<unsigned char>> base64_decode(std::string_view text);

}  // namespace ferry::detail::state_json
