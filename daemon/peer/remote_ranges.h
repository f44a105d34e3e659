// RemoteRanges over the peer service: how the scheduler holds, reaches and releases
// ranges on other nodes.
#ifndef GPUMOVE_DAEMON_PEER_REMOTE_RANGES_H_
#define GPUMOVE_DAEMON_PEER_REMOTE_RANGES_H_

#include <atomic>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "daemon/cluster/cluster.h"
#include "daemon/core/engine.h"
#include "daemon/peer/path_codec.h"

namespace gpumove {

// Items in one PrepareRemoteBatch / CompleteRemoteBatch: what a node serves, and so what
// the moving side sends in one call.
inline constexpr size_t kMaxPeerBatch = 4096;

// The PeerService calls the moving side makes, by number, for channels other than gRPC
// and for the cluster stamp.
enum class PeerMethod : uint32_t {
  kPrepareRemoteBatch = 1,
  kCompleteRemoteBatch = 2,
  kPathCall = 3,  // A path's own call, by path and method name (path_calls.h).
};

// A faster way than gRPC to make those calls (UCX active messages): the same serialized
// request and response messages, the same handlers, the same status codes.
class PeerCallChannel {
 public:
  virtual ~PeerCallChannel() = default;
  // Whether `peer` (and this node) serve calls this way.
  virtual bool Reaches(const PeerView& peer) const = 0;
  // The serialized response, or the handler's error; UNAVAILABLE when the peer cannot be
  // reached or does not answer within `timeout`.
  virtual absl::StatusOr<std::string> Call(const PeerView& peer, PeerMethod method,
                                           std::string request, absl::Duration timeout) = 0;
};

// The name of a peer method in metrics and logs ("prepare_remote_batch", ...).
const char* PeerMethodName(PeerMethod method);

// Told of every peer call this node makes (for metrics): its name (PeerMethodName, or a
// path call's method name), how long it took, over which channel ("ucx" active messages
// or "grpc"), and its outcome. Called on the calling thread; must be cheap and
// thread-safe.
class PeerCallObserver {
 public:
  virtual ~PeerCallObserver() = default;
  virtual void OnPeerCall(absl::string_view method, const char* channel, absl::Duration took,
                          const absl::Status& outcome) = 0;
};

class ClusterRemoteRanges : public RemoteRanges {
 public:
  // `cluster` (and `channel` and `codecs`) must outlive this. Calls to peers give up after
  // `rpc_timeout`. Peers `channel` reaches are called through it, the others over gRPC.
  // `codecs`: one per path this node runs, which write the paths' asks and read their
  // offers.
  ClusterRemoteRanges(Cluster* cluster, absl::Duration rpc_timeout,
                      PeerCallChannel* channel = nullptr,
                      std::vector<const PathCodec*> codecs = {});
  ~ClusterRemoteRanges() override;

  absl::StatusOr<RemoteHold> Prepare(const std::string& owner, const std::string& transfer_id,
                                     const std::string& node, const std::string& buffer_id,
                                     uint64_t offset, uint64_t length, bool write, PathKind path,
                                     bool local_device) override;
  std::vector<absl::StatusOr<RemoteHold>> PrepareMany(const std::string& owner,
                                                      const std::string& node,
                                                      const std::vector<RemoteAsk>& asks) override;
  absl::StatusOr<uint64_t> Complete(const RemoteHold& hold, const absl::Status& outcome,
                                    bool checksum, const AckTail& tail) override;
  // One CompleteRemoteBatch in flight per node: a caller finding none sends its own on its
  // thread; those arriving meanwhile queue and go together, sent by the node's drainer.
  // A caller that is busy (more moves waiting) always hands its acknowledgement over.
  void CompleteAsync(const RemoteHold& hold, const absl::Status& outcome, bool checksum,
                     const AckTail& tail, bool caller_busy, AckCallback done) override;
  void Release(const RemoteHold& hold) override;
  // Holds waiting to be told again that their move ended (for tests and metrics).
  size_t lingering() ABSL_LOCKS_EXCLUDED(mu_);
  // Calls `path`'s own `method` (registered on the hold's node: path_calls.h) for the
  // hold, as long as the node is the incarnation the hold was made with: `request` is the
  // path's message (its transfer id the hold's), `response` is parsed from the answer.
  // For the paths' own steps during a move (staging, MPI halves).
  absl::Status CallPath(const RemoteHold& hold, absl::string_view path, absl::string_view method,
                        const google::protobuf::Message& request,
                        google::protobuf::Message* response);
  // Who is told of each call from now on (null: nobody); must outlive this.
  void set_observer(PeerCallObserver* observer) { observer_.store(observer); }

 private:
  struct PendingAck {
    RemoteHold hold;
    absl::Status outcome;
    bool checksum = false;
    AckTail tail;
    AckCallback done;
  };
  // Acknowledgements to one node.
  struct Acker {
    absl::Mutex mu;
    bool busy ABSL_GUARDED_BY(mu) = false;   // A batch is being sent.
    bool drain ABSL_GUARDED_BY(mu) = false;  // The drainer owns sending what queued.
    bool stop ABSL_GUARDED_BY(mu) = false;
    std::vector<PendingAck> queue ABSL_GUARDED_BY(mu);
    std::thread drainer;
  };

  // A hold whose end could not be told to its node (down, stopped or cut off then): told
  // again, with backoff, until the node answers, restarts (its holds went with it) or
  // kLingerFor passes. Otherwise a node that came back would keep the range held forever.
  struct Lingering {
    RemoteHold hold;
    absl::Time due, since;
    absl::Duration backoff;
  };
  static constexpr absl::Duration kLingerFor = absl::Minutes(10);
  void Linger(const RemoteHold& hold, const absl::Status& why);
  // Complete without lingering.
  absl::StatusOr<uint64_t> CompleteOnce(const RemoteHold& hold, const absl::Status& outcome,
                                        bool checksum, const AckTail& tail);
  // Whether a failed call to a hold's node may have left the hold there.
  static bool MayStillHold(const absl::Status& st);
  void ReleaseLoop();
  // Tells one lingering hold's node again; true when it is over (told, or gone).
  bool RetryLingering(Lingering& l);
  Acker* AckerFor(const std::string& node);
  void DrainLoop(const std::string& node, Acker* a);
  // One CompleteRemoteBatch for `batch` (all to `node`); runs every callback.
  void SendAcks(const std::string& node, std::vector<PendingAck>& batch);
  // The hold made for `ask` on `node` (`peer`): the common fields, and every path's offer.
  absl::StatusOr<RemoteHold> HoldFrom(const std::string& node, const PeerView& peer,
                                      const peer::v1::NodeDescriptor& self, const RemoteAsk& ask,
                                      const peer::v1::PrepareRemoteResponse& response) const;
  // The hold's node, as long as it is the incarnation the hold was made with.
  absl::StatusOr<PeerView> PeerFor(const RemoteHold& hold);
  // Calls `method` on `peer` through the fast channel when it reaches the peer, else `rpc`;
  // the peer has the call timeout and `more` to answer.
  template <class Request, class Response>
  absl::Status Invoke(const PeerView& peer, PeerMethod method, const Request& request,
                      Response* response,
                      grpc::Status (peer::v1::PeerService::Stub::*rpc)(grpc::ClientContext*,
                                                                       const Request&, Response*),
                      absl::Duration more = absl::ZeroDuration()) {
    return Call(
        peer, method, PeerMethodName(method), request, response,
        [&](peer::v1::PeerService::Stub& stub, grpc::ClientContext* context) {
          return (stub.*rpc)(context, request, response);
        },
        more);
  }
  // Invoke's body, for any message types; `name` is the call's in metrics.
  absl::Status Call(
      const PeerView& peer, PeerMethod method, absl::string_view name,
      const google::protobuf::Message& request, google::protobuf::Message* response,
      absl::FunctionRef<grpc::Status(peer::v1::PeerService::Stub&, grpc::ClientContext*)> rpc,
      absl::Duration more = absl::ZeroDuration());

  // Call's body, untimed.
  absl::Status CallUntimed(
      const PeerView& peer, PeerMethod method, const google::protobuf::Message& request,
      google::protobuf::Message* response, bool fast,
      absl::FunctionRef<grpc::Status(peer::v1::PeerService::Stub&, grpc::ClientContext*)> rpc,
      absl::Duration timeout);

  std::atomic<PeerCallObserver*> observer_{nullptr};
  Cluster* const cluster_;
  const absl::Duration rpc_timeout_;
  PeerCallChannel* const channel_;
  const std::vector<const PathCodec*> codecs_;
  absl::Mutex mu_;
  std::deque<RemoteHold> to_release_ ABSL_GUARDED_BY(mu_);
  std::vector<Lingering> lingering_ ABSL_GUARDED_BY(mu_);
  bool lingered_ ABSL_GUARDED_BY(mu_) = false;  // lingering_ grew since the loop looked.
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread releaser_;
  absl::Mutex ackers_mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Acker>> ackers_ ABSL_GUARDED_BY(ackers_mu_);
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PEER_REMOTE_RANGES_H_
