#pragma once

// Where the worker processes run (DataLoaderOptions::worker_cpus), and whether they crowd the
// training thread.

#include <string>
#include <string_view>
#include <vector>

namespace ferry::detail {

// "2-7,10" as sorted, distinct cores; ConfigError naming worker_cpus on a malformed list or a
// core this machine does not have (`configured`: its cores, _SC_NPROCESSORS_CONF).
std::vector<int> parse_cpu_list(std::string_view text, int configured);

// The cores the calling thread may run on.
std::vector<int> thread_cpus();

// The workers' cores for `spec` ("" for none, a list, or "gpu:N"), less the training thread's
// (the calling thread's): the cores it is bound to when it is bound to fewer than `online`, else
// the core it runs on now, when another is left. ConfigError when nothing is left or "gpu:N"
// cannot be answered. `thread`, `current` and `online` default to the calling thread's view
// (tests pass their own).
struct PlacementInput {
  std::vector<int> thread;  // the training thread's allowed cores
  int current = -1;         // the core it runs on
  int online = 0;           // cores online
  int configured = 0;       // cores the machine has
};
PlacementInput this_thread_placement();
std::vector<int> resolve_worker_cpus(const std::string& spec, const PlacementInput& at);

// "0-3,8" for a sorted list of cores.
std::string format_cpu_list(const std::vector<int>& cpus);

}  // namespace ferry::detail
