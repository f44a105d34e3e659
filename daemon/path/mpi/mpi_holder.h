// The holding side of path MPI: this node's half of a two-sided move that another rank
// runs, started with the hold (a push that asked for it) or when the runner says
// (StartMpi), and waited for before the hold ends.
#ifndef GPUMOVE_DAEMON_PATH_MPI_HOLDER_H_
#define GPUMOVE_DAEMON_PATH_MPI_HOLDER_H_

#include <list>
#include <memory>
#include <optional>

#include "absl/synchronization/mutex.h"
#include "daemon/cluster/cluster.h"
#include "daemon/path/mpi/mpi_engine.h"
#include "daemon/path/mpi/mpi_hello.h"
#include "daemon/peer/holds.h"
#include "daemon/peer/path_holder.h"

namespace gpumove {

// A hold's MPI half, once started. Ending the hold stops it (unless the runner says the
// move succeeded) and waits for it.
class MpiPart : public HoldPart {
 public:
  explicit MpiPart(absl::Duration wait) : wait_(wait) {}
  absl::Status End(bool runner_ok) override;
  bool EndBlocks() const override;

 private:
  friend class MpiHolder;
  const absl::Duration wait_;
  mutable absl::Mutex mu_;
  std::unique_ptr<PassiveHalf> half_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

class MpiHolder : public PathHolder {
 public:
  // `cluster` (who the runner is), `self` (this node's place in its MPI job) and `engine`
  // must outlive this. A half still running when its hold ends is given `half_wait` to
  // finish.
  MpiHolder(const Cluster* cluster, const MpiHello* self, MpiEngine* engine,
            absl::Duration half_wait = absl::Seconds(2))
      : cluster_(cluster), self_(self), engine_(engine), half_wait_(half_wait) {}

  // A push that asked (PrepareRemoteRequest.mpi) starts its receiving half now, as
  // StartMpi would, unless this node stages the range: a staged half holds bounce buffers
  // while it waits, and many holds of one Submit would take them all while the runner
  // sends to one of them at a time (the runner then sends StartMpi when the move runs).
  absl::StatusOr<std::unique_ptr<HoldPart>> Offer(
      const HoldContext& context, const BufferUse& range,
      peer::v1::PrepareRemoteResponse* response) override;
  bool OfferBlocks(const peer::v1::PrepareRemoteRequest& request) const override {
    return request.mpi().tag() != 0;
  }
  // Starts the half of `from_node`'s held range (returns once its receives are posted).
  // NOT_FOUND: no such hold; ALREADY_EXISTS: started already; FAILED_PRECONDITION: the
  // runner is not that rank of this node's MPI job.
  absl::Status Start(const HoldTable& holds, const std::string& from_node,
                     const peer::v1::StartMpiRequest& request);
  // The sending half stops after its chunks in flight. NOT_FOUND: no such hold or half.
  absl::Status Stop(const HoldTable& holds, const std::string& from_node,
                    const peer::v1::StopMpiRequest& request);

 private:
  // `patient`: receives posted with the hold may wait a while for the runner to send.
  // `known`: the half's pieces, kept from an earlier move of its list; `keep`: where its
  // list, once read, is kept for later moves (empty: not kept).
  absl::Status StartOn(MpiPart& part, const BufferUse& range, const std::string& from_node,
                       const peer::v1::StartMpiRequest& request, bool patient,
                       const MpiEngine::KnownPieces* known = nullptr, std::string keep = "");

  // Vectored halves' piece lists kept for later moves of the same list (MpiAsk.list_key),
  // by runner node, incarnation, key and direction; the least recently used go past
  // kKeptLists lists or kKeptListBytes of pieces.
  std::optional<MpiEngine::KnownPieces> FindList(const std::string& key);
  void KeepList(const std::string& key, const MpiEngine::KnownPieces& list);
  static constexpr size_t kKeptLists = 256;
  static constexpr uint64_t kKeptListBytes = uint64_t{64} << 20;
  absl::Mutex lists_mu_;
  std::list<std::pair<std::string, MpiEngine::KnownPieces>> lists_ ABSL_GUARDED_BY(lists_mu_);

  const Cluster* const cluster_;
  const MpiHello* const self_;
  MpiEngine* const engine_;
  const absl::Duration half_wait_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_MPI_HOLDER_H_
