// Path MPI's part of a node's Hello, sent by a node that is a rank of an MPI job: its rank
// and the job's id, packed as an MpiDetails blob (mpi_hello.proto); a peer's blob checked
// once when its Hello is accepted and kept as that peer incarnation's MpiView. Path MPI
// is offered between ranks of one job only.
#ifndef GPUMOVE_DAEMON_PATH_MPI_HELLO_H_
#define GPUMOVE_DAEMON_PATH_MPI_HELLO_H_

#include <cstdint>
#include <memory>
#include <string>

#include "daemon/cluster/cluster.h"
#include "daemon/cluster/path_hello.h"

namespace gpumove {

inline constexpr char kMpiHelloPath[] = "mpi";

// A node's place in its MPI job.
struct MpiView : PathView {
  int rank = -1;
  uint64_t world = 0;  // Nonzero.
};

// `peer`'s place in its MPI job; null when it is no rank (or this node is none).
inline const MpiView* MpiViewOf(const PeerView& peer) {
  return peer.path<MpiView>(kMpiHelloPath);
}

class MpiHello : public PathHello {
 public:
  // This node is rank `rank` of the job `world` (nonzero).
  MpiHello(int rank, uint64_t world);

  absl::string_view path() const override { return kMpiHelloPath; }
  std::string Pack() const override;
  // INVALID_ARGUMENT unless a rank of at least 0 in a job whose id is nonzero.
  absl::StatusOr<std::shared_ptr<const PathView>> Read(absl::string_view blob) const override;

  const MpiView& self() const { return self_; }
  // Whether `peer` is a rank of this node's job.
  bool SameJob(const PeerView& peer) const {
    const MpiView* view = MpiViewOf(peer);
    return view != nullptr && view->world == self_.world;
  }

 private:
  MpiView self_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_MPI_HELLO_H_
