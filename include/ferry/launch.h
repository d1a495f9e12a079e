#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace ferry {

/// Who this process is in a distributed job, as its launcher said.
struct LaunchInfo {
  std::size_t rank = 0;
  std::size_t world_size = 1;
  std::size_t local_rank = 0;        ///< on this machine
  std::size_t local_world_size = 1;  ///< processes on this machine, when the launcher says
  /// Where it came from: "torchrun" (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), "Open MPI"
  /// (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
  /// OMPI_COMM_WORLD_LOCAL_SIZE) or "Slurm" (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID).
  std::string source;
};

/// The rank and world size from the environment of torchrun, Open MPI (mpirun) or Slurm (srun),
/// or nullopt when none of them launched this process. When several are present, the innermost
/// launcher wins (torchrun under srun, mpirun or torchrun inside an sbatch script): torchrun,
/// then Open MPI, then Slurm. Throws `ConfigError` naming both sources when a bare `RANK` and
/// `WORLD_SIZE` (without torchrun's `LOCAL_RANK`: a stale export in a shell, say) contradict
/// another launcher, and for a value that is not a non-negative integer, a rank outside its
/// world, or a launcher's rank without its world size.
std::optional<LaunchInfo> launch_info();

}  // namespace ferry
