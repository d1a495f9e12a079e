#pragma once

// Text for signal handlers: async-signal-safe (no allocation, no locks, no stdio), so a handler
// of a crashing or timed-out process can still say what happened.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ferry::ipc {

// `v` in decimal at the end of `digits`; returns the number of digits written there.
inline std::size_t format_decimal(std::uint64_t v, char (&digits)[24]) noexcept {
  std::size_t n = 0;
  do {
    digits[sizeof digits - 1 - n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v > 0);
  return n;
}

inline void write_text(int fd, const char* text) noexcept {
  (void)!::write(fd, text, std::strlen(text));
}

inline void write_decimal(int fd, std::uint64_t v) noexcept {
  char digits[24];
  const std::size_t n = format_decimal(v, digits);
  (void)!::write(fd, digits + sizeof digits - n, n);
}

}  // namespace ferry::ipc
