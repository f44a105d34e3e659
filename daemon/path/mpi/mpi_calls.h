// Path MPI's own peer calls on the holding side, registered as path calls: the runner's
// start of this node's half of a held range's move, and its stop.
#ifndef GPUMOVE_DAEMON_PATH_MPI_MPI_CALLS_H_
#define GPUMOVE_DAEMON_PATH_MPI_MPI_CALLS_H_

#include "daemon/path/mpi/mpi_holder.h"
#include "daemon/peer/holds.h"
#include "daemon/peer/path_calls.h"

namespace gpumove {

// Registers "mpi" "start_mpi" and "stop_mpi", served by `holder` over `holds` (both must
// outlive the calls' serving).
absl::Status RegisterMpiCalls(MpiHolder* holder, const HoldTable* holds, PathCalls* calls);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_MPI_MPI_CALLS_H_
