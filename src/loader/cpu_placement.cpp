#include "loader/cpu_placement.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <iterator>

#include "ferry/error.h"

#include "device/nvml.h"

namespace ferry::detail {

std::vector<int> parse_cpu_list(std::string_view text, int configured) {
  const auto bad = [&](const std::string& why) {
    return ConfigError(str("worker_cpus \"", text, "\": ", why,
                           "; expected cores and ranges such as \"2-7,10\", or \"gpu:N\" for the "
                           "cores local to GPU N"));
  };
  std::vector<int> out;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string_view item = text.substr(at, comma - at);
    if (item.empty()) throw bad("an empty item");
    const std::size_t dash = item.find('-');
    int first = 0;
    int last = 0;
    const auto number = [&](std::string_view digits, int& value) {
      const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
      if (ec != std::errc() || end != digits.data() + digits.size() || digits.empty() || value < 0)
        throw bad(str("\"", item, "\" is not a core number or a range"));
    };
    number(item.substr(0, dash), first);
    last = first;
    if (dash != std::string_view::npos) number(item.substr(dash + 1), last);
    if (last < first) throw bad(str("the range \"", item, "\" runs backwards"));
    if (last >= configured || last >= CPU_SETSIZE) {
      throw bad(str("core ", last, " does not exist (this machine has cores 0-",
                    std::max(0, configured - 1), ")"));
    }
    for (int c = first; c <= last; ++c) out.push_back(c);
    at = comma + 1;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<int> thread_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.push_back(c);
  }
  return out;
}

PlacementInput this_thread_placement() {
  PlacementInput in;
  in.thread = thread_cpus();
  in.current = ::sched_getcpu();
  in.online = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  in.configured = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_CONF)));
  return in;
}

std::vector<int> resolve_worker_cpus(const std::string& spec, const PlacementInput& at) {
  if (spec.empty()) return {};
  std::vector<int> cpus;
  if (spec.rfind("gpu:", 0) == 0) {
    int gpu = -1;
    const std::string_view digits = std::string_view(spec).substr(4);
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), gpu);
    if (ec != std::errc() || end != digits.data() + digits.size() || gpu < 0) {
      throw ConfigError(str("worker_cpus \"", spec, "\": expected gpu:N with N a GPU's index"));
    }
    std::string why;
    cpus = device::gpu_local_cpus(gpu, why);
    if (cpus.empty()) {
      throw ConfigError(str("worker_cpus \"", spec, "\": the cores local to GPU ", gpu,
                            " are unknown: ", why, "; give the cores as a list instead (\"2-7\")"));
    }
  } else {
    cpus = parse_cpu_list(spec, at.configured);
  }
  // The training thread's cores stay free for it.
  const bool bound = !at.thread.empty() && static_cast<int>(at.thread.size()) < at.online;
  std::vector<int> keep;
  if (bound) {
    keep = at.thread;
  } else if (at.current >= 0 && cpus.size() > 1) {
    keep = {at.current};
  }
  std::vector<int> left;
  std::set_difference(cpus.begin(), cpus.end(), keep.begin(), keep.end(), std::back_inserter(left));
  if (left.empty()) {
    throw ConfigError(str("worker_cpus \"", spec,
                          "\" leaves the workers no core: ", format_cpu_list(cpus),
                          " are all the training thread's (", format_cpu_list(keep),
                          "); list other cores, or bind the training thread elsewhere"));
  }
  return left;
}

std::string format_cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace ferry::detail
