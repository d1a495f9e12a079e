#include "ipc/cgroup.h"

#include <charconv>
#include <fstream>
#include <sstream>
#include <string_view>
#include <vector>

namespace ferry::ipc {

namespace {

std::optional<std::uint64_t> parse_number(std::string_view text) {
  std::uint64_t value = 0;
  const auto* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr == text.data()) return std::nullopt;
  return value;
}

std::vector<std::string> split(const std::string& line, char separator) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(line);
  while (std::getline(in, part, separator)) parts.push_back(part);
  return parts;
}

// Where the cgroup file system holding `wanted` is mounted, and the cgroup path at its root.
struct Mount {
  std::string root;
  std::string point;
};

std::optional<Mount> find_mount(bool v2) {
  std::ifstream mountinfo("/proc/self/mountinfo");
  std::string line;
  while (std::getline(mountinfo, line)) {
    // id parent major:minor root mount-point options [optional...] - fstype source super-options
    const auto dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    const auto fields = split(line.substr(0, dash), ' ');
    const auto tail = split(line.substr(dash + 3), ' ');
    if (fields.size() < 5 || tail.size() < 3) continue;
    if (v2 ? tail[0] != "cgroup2" : tail[0] != "cgroup") continue;
    if (!v2) {
      bool memory = false;
      for (const auto& option : split(tail[2], ',')) memory = memory || option == "memory";
      if (!memory) continue;
    }
    return Mount{fields[3], fields[4]};
  }
  return std::nullopt;
}

std::optional<MemoryCgroup> resolve(bool v2, const std::string& path) {
  const auto mount = find_mount(v2);
  if (!mount) return std::nullopt;
  std::string relative = path;
  if (mount->root != "/") {
    const bool inside =
        relative.rfind(mount->root, 0) == 0 &&
        (relative.size() == mount->root.size() || relative[mount->root.size()] == '/');
    if (!inside) return std::nullopt;  // outside this mount's view
    relative = relative.substr(mount->root.size());
    if (relative.empty()) relative = "/";
  }
  std::string directory = mount->point + (relative == "/" ? "" : relative);
  MemoryCgroup cgroup(std::move(directory), v2);
  if (!std::ifstream(cgroup.events_file())) return std::nullopt;
  return cgroup;
}

std::optional<std::string> read_first_line(const std::string& file) {
  std::ifstream in(file);
  std::string line;
  if (!std::getline(in, line)) return std::nullopt;
  return line;
}

}  // namespace

std::optional<MemoryCgroup> MemoryCgroup::of_self() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  std::optional<std::string> v1_path;
  std::optional<std::string> v2_path;
  while (std::getline(in, line)) {
    // hierarchy-id:controllers:path; v2's is "0::/path".
    const auto first = line.find(':');
    const auto second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    if (controllers.empty()) {
      v2_path = path;
      continue;
    }
    for (const auto& c : split(controllers, ',')) {
      if (c == "memory") v1_path = path;
    }
  }
  // A v1 memory controller, where one is mounted, is the one that limits memory.
  if (v1_path) {
    if (auto cgroup = resolve(false, *v1_path)) return cgroup;
  }
  if (v2_path) return resolve(true, *v2_path);
  return std::nullopt;
}

std::string MemoryCgroup::events_file() const {
  return dir_ + (v2_ ? "/memory.events" : "/memory.oom_control");
}

std::optional<std::uint64_t> MemoryCgroup::oom_kills() const {
  std::ifstream in(events_file());
  std::string key;
  std::string value;
  while (in >> key >> value) {
    if (key == "oom_kill") return parse_number(value);
  }
  return std::nullopt;
}

std::optional<std::uint64_t> MemoryCgroup::limit_bytes() const {
  const auto line = read_first_line(dir_ + (v2_ ? "/memory.max" : "/memory.limit_in_bytes"));
  if (!line || *line == "max") return std::nullopt;
  const auto bytes = parse_number(*line);
  // v1 says "unlimited" with a number near 2^63, rounded down to a page.
  if (!bytes || *bytes >= (std::uint64_t{1} << 62)) return std::nullopt;
  return bytes;
}

}  // namespace ferry::ipc
