// The CPUs a daemon runs on. MPI launchers bind each rank to one core by default
// (Open MPI's mpirun does for two ranks or fewer: `--bind-to core`), which suits a
// compute rank and starves a daemon: its gRPC, worker, MPI and copy threads would all
// share that core. The daemon widens its binding at start when an MPI launcher set it.
#ifndef GPUMOVE_DAEMON_COMMON_CPUS_H_
#define GPUMOVE_DAEMON_COMMON_CPUS_H_

#include "absl/status/statusor.h"

namespace gpumove {

// How many CPUs the calling thread may run on (threads it starts inherit this).
int AllowedCpus();

// Lets the calling thread run on every CPU the machine and its cpuset allow; call it
// before starting threads so that all inherit it. Returns AllowedCpus() afterwards.
absl::StatusOr<int> AllowAllCpus();

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_COMMON_CPUS_H_
