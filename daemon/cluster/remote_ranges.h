// RemoteRanges over the peer service: how the scheduler holds, reaches and releases
// ranges on other nodes.
#ifndef GPUMOVE_DAEMON_CLUSTER_REMOTE_RANGES_H_
#define GPUMOVE_DAEMON_CLUSTER_REMOTE_RANGES_H_

#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "daemon/cluster/cluster.h"
#include "daemon/core/engine.h"

namespace gpumove {

class ClusterRemoteRanges : public RemoteRanges {
 public:
  // `cluster` must outlive this. RPCs to peers give up after `rpc_timeout`.
  ClusterRemoteRanges(Cluster* cluster, absl::Duration rpc_timeout);
  ~ClusterRemoteRanges() override;

  absl::StatusOr<RemoteHold> Prepare(const std::string& owner, const std::string& transfer_id,
                                     const std::string& node, const std::string& buffer_id,
                                     uint64_t offset, uint64_t length, bool write,
                                     PathKind path, bool local_device) override;
  std::vector<absl::StatusOr<RemoteHold>> PrepareMany(const std::string& owner,
                                                      const std::string& node,
                                                      const std::vector<RemoteAsk>& asks) override;
  absl::StatusOr<uint64_t> Complete(const RemoteHold& hold, const absl::Status& outcome,
                                    bool checksum) override;
  // One CompleteRemoteBatch in flight per node: a caller finding none sends its own on its
  // thread; those arriving meanwhile queue and go together, sent by the node's drainer.
  void CompleteAsync(const RemoteHold& hold, const absl::Status& outcome, bool checksum,
                     AckCallback done) override;
  void Release(const RemoteHold& hold) override;
  absl::Status StageChunk(const RemoteHold& hold, uint32_t slot, uint64_t offset,
                          uint64_t length, bool to_range) override;
  absl::Status StartMpi(const RemoteHold& hold, int tag, uint64_t chunk, bool send) override;
  absl::Status StopMpi(const RemoteHold& hold) override;

 private:
  struct PendingAck {
    RemoteHold hold;
    absl::Status outcome;
    bool checksum = false;
    AckCallback done;
  };
  // Acknowledgements to one node.
  struct Acker {
    absl::Mutex mu;
    bool busy ABSL_GUARDED_BY(mu) = false;  // A batch is being sent.
    bool drain ABSL_GUARDED_BY(mu) = false;  // The drainer owns sending what queued.
    bool stop ABSL_GUARDED_BY(mu) = false;
    std::vector<PendingAck> queue ABSL_GUARDED_BY(mu);
    std::thread drainer;
  };

  void ReleaseLoop();
  Acker* AckerFor(const std::string& node);
  void DrainLoop(const std::string& node, Acker* a);
  // One CompleteRemoteBatch for `batch` (all to `node`); runs every callback.
  void SendAcks(const std::string& node, std::vector<PendingAck>& batch);
  // A stub for the hold's node, as long as it is the incarnation the hold was made with.
  absl::StatusOr<std::unique_ptr<v1::PeerService::Stub>> StubFor(const RemoteHold& hold);

  Cluster* const cluster_;
  const absl::Duration rpc_timeout_;
  absl::Mutex mu_;
  std::deque<RemoteHold> to_release_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread releaser_;
  absl::Mutex ackers_mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Acker>> ackers_ ABSL_GUARDED_BY(ackers_mu_);
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_CLUSTER_REMOTE_RANGES_H_
