#include "ferry/error.h"

namespace ferry::detail {

std::string join(const std::vector<std::string>& items, std::string_view separator) {
  std::string out;
  for (const auto& item : items) {
    if (!out.empty()) out += separator;
    out += item;
  }
  return out;
}

void assert_fail(const char* condition, const char* file, int line, const std::string& message) {
  throw std::logic_error(str("ferry internal error: ", condition, " failed at ", file, ":", line,
                             message.empty() ? "" : ": ", message,
                             " (this is a bug in ferry; please report it with this message)"));
}

}  // namespace ferry::detail
