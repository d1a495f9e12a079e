#pragma once

// FNV-1a (64-bit): short, stable fingerprints of bytes (configurations, index lists, file
// layouts) for names and checks, never for security.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace ferry::detail {

inline constexpr std::uint64_t kFnvOffset = 14695981039346656037ull;
inline constexpr std::uint64_t kFnvPrime = 1099511628211ull;

// Continues the hash `h` over `bytes` bytes at `data` (start with kFnvOffset).
inline std::uint64_t fnv1a(const void* data, std::size_t bytes, std::uint64_t h = kFnvOffset) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * kFnvPrime;
  return h;
}
inline std::uint64_t fnv1a(std::string_view text, std::uint64_t h = kFnvOffset) {
  return fnv1a(text.data(), text.size(), h);
}

// 16 lowercase hex digits.
inline std::string hex64(std::uint64_t v) {
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(v));
  return out;
}

}  // namespace ferry::detail
