#include "ferry/launch.h"

#include <charconv>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "ferry/error.h"

namespace ferry {

namespace {

struct Source {
  const char* name;
  const char* rank;
  const char* world;
  const char* local_rank;
  const char* local_world;  // null: the launcher does not say
};

// Innermost first: a launcher started by another one sees both environments.
constexpr Source kSources[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
};

std::optional<std::size_t> read(const char* name) {
  if (name == nullptr) return std::nullopt;
  const char* text = std::getenv(name);
  if (text == nullptr) return std::nullopt;
  const std::string_view view(text);
  std::size_t value = 0;
  const auto [end, ec] = std::from_chars(view.data(), view.data() + view.size(), value);
  if (view.empty() || ec != std::errc() || end != view.data() + view.size()) {
    throw ConfigError(detail::str("environment variable ", name, "='", view,
                                  "' is not a non-negative integer; fix or unset it"));
  }
  return value;
}

std::string describe(const Source& s, const LaunchInfo& info) {
  return detail::str(s.rank, "=", info.rank, " ", s.world, "=", info.world_size, " (", s.name, ")");
}

}  // namespace

std::optional<LaunchInfo> launch_info() {
  std::optional<LaunchInfo> chosen;
  const Source* chosen_source = nullptr;
  for (const Source& s : kSources) {
    const auto rank = read(s.rank);
    const auto world = read(s.world);
    if (!rank && !world) continue;
    if (!rank || !world) {
      throw ConfigError(detail::str(
          s.name, ": ", rank ? s.rank : s.world, " is set but ", rank ? s.world : s.rank,
          " is not; a launcher sets both. Unset the stray variable or set the other one"));
    }
    LaunchInfo info;
    info.rank = *rank;
    info.world_size = *world;
    info.local_rank = read(s.local_rank).value_or(0);
    info.local_world_size = read(s.local_world).value_or(1);
    info.source = s.name;
    if (info.world_size == 0 || info.rank >= info.world_size) {
      throw ConfigError(detail::str(describe(s, info), ": the rank must be below the world size"));
    }
    if (!chosen) {
      chosen = std::move(info);
      chosen_source = &s;
      continue;
    }
    // An outer launcher: the innermost one describes this process (torchrun under srun, mpirun
    // or torchrun inside an sbatch script, where Slurm's variables are the batch step's). But a
    // bare RANK and WORLD_SIZE without torchrun's LOCAL_RANK is what a shell export left behind:
    // under a real launcher that disagrees, it is an error rather than a silent wrong rank.
    const bool bare =
        chosen_source == &kSources[0] && std::getenv(kSources[0].local_rank) == nullptr;
    if (bare && (info.world_size != chosen->world_size || info.rank != chosen->rank)) {
      throw ConfigError(detail::str(
          "the launchers disagree on this process's rank: ", describe(*chosen_source, *chosen),
          " but ", describe(s, info),
          "; unset the stale variables (a RANK or WORLD_SIZE exported in the shell, say), or "
          "give rank and num_replicas explicitly"));
    }
  }
  return chosen;
}

}  // namespace ferry
