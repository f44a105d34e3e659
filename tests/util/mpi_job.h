// Starts gpumoved as an MPI job (Open MPI's mpirun or MPICH's mpiexec, as GPUMOVE_MPI
// says) for tests and benchmarks, and stops it with SIGTERM (the launcher forwards it; the
// ranks drain and exit).
#ifndef GPUMOVE_TESTS_UTIL_MPI_JOB_H_
#define GPUMOVE_TESTS_UTIL_MPI_JOB_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/gpumove_client.h"

namespace gpumove {

// "openmpi" (default), "mpich" or "mvapich2", from $GPUMOVE_MPI.
std::string MpiFlavor();
// Whether the flavour's launcher is Hydra's mpiexec (MPICH, MVAPICH2), whose options
// differ from Open MPI's mpirun.
bool HydraLauncher();

// One way to launch a job.
struct MpiLaunch {
  std::string name;
  std::vector<std::string> mpi_args;      // For the launcher.
  std::vector<std::string> daemon_flags;  // For every rank.
};

// The launches the MPI tests run for the flavour: Open MPI with ob1/tcp, with its UCX
// pml, and ob1/shared memory with every side staged; MPICH and MVAPICH2 plain and staged.
std::vector<MpiLaunch> MpiLaunches();

// The launcher and its arguments for `ranks` ranks (root-safe, oversubscribed).
std::vector<std::string> MpiLauncher(int ranks);

class MpiJob {
 public:
  // Starts `ranks` gpumoved ranks on loopback (port 0, small pools, fast heartbeats, 1 MiB
  // MPI messages) plus the launch's and then `flags` (later flags win); returns once every
  // rank serves.
  static absl::StatusOr<std::unique_ptr<MpiJob>> Start(int ranks, const MpiLaunch& launch,
                                                       std::vector<std::string> flags = {});
  ~MpiJob();

  Client& client(int rank) { return *clients_[rank]; }
  const std::string& address(int rank) const { return addresses_[rank]; }
  int size() const { return static_cast<int>(clients_.size()); }
  std::string Log() const;
  // The process of `rank` (-1 if not found).
  pid_t RankPid(int rank) const;

 private:
  MpiJob() = default;
  pid_t pid_ = -1;
  std::string dir_;
  std::string log_;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<Client>> clients_;
};

}  // namespace gpumove

#endif  // GPUMOVE_TESTS_UTIL_MPI_JOB_H_
