// Peer calls over UCX active messages: the calls the moving side makes to the other node
// of a move (holds, acknowledgements, staging and MPI steps) carried by the daemon's UCX
// worker instead of gRPC. On this kind of machine a gRPC round trip made from inside a
// serving daemon costs 2-3x a bare echo (client/bench/rpc_probe); these calls are on
// every remote move's critical path. Same messages, same handlers, same status codes.
#ifndef GPUMOVE_DAEMON_SERVER_PEER_CALLS_H_
#define GPUMOVE_DAEMON_SERVER_PEER_CALLS_H_

#include <atomic>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/cluster/peer_auth.h"
#include "daemon/cluster/remote_ranges.h"
#include "daemon/path/ucx/ucx_transport.h"
#include "daemon/server/peer_handler.h"

namespace gpumove {

class UcxPeerCalls : public PeerCallChannel {
 public:
  // `transport` must outlive this; `self` is this node's descriptor (node, incarnation,
  // host). Calls arriving are served by `threads` threads; after a call one of them keeps
  // looking for the next for `poll_window` before it sleeps (no wake-up for a call that
  // follows closely, as acknowledgements follow holds).
  // With `auth` (which must outlive this), calls are stamped and checked, and answers
  // signed, as over gRPC: the stamp and the answer's mac travel ahead of the bodies.
  UcxPeerCalls(UcxTransport* transport, const peer::v1::NodeDescriptor& self, int threads = 8,
               absl::Duration poll_window = absl::ZeroDuration(), PeerAuth* auth = nullptr);
  ~UcxPeerCalls() override;

  // Serves the calls that arrive with `handler` (which must stay until StopServing).
  void Serve(PeerHandler* service);
  // Calls arriving from now on are refused (UNAVAILABLE); those running finish. Idempotent.
  void StopServing();

  // Calls served since start.
  uint64_t served() const { return served_; }

  bool Reaches(const peer::v1::NodeDescriptor& peer) const override;
  absl::StatusOr<std::string> Call(const peer::v1::NodeDescriptor& peer, PeerMethod method,
                                   std::string request, absl::Duration timeout) override;

 private:
  void Work();
  // Whether `body` for `method` can be served on the transport's progress thread itself
  // (saving the hand-off to a serving thread and back): holds and acknowledgements that
  // cannot block.
  bool AtOnce(PeerHandler* service, uint32_t method, const std::string& body) const;
  // Runs one call on a serving thread.
  void Handle(uint32_t method, const std::string& body, const UcxReply& reply);

  UcxTransport* const transport_;
  const peer::v1::NodeDescriptor self_;
  PeerAuth* const auth_;
  const int threads_;
  const absl::Duration poll_window_;
  std::atomic<bool> polling_{false};  // A serving thread is polling for the next call.
  absl::Mutex mu_;
  PeerHandler* service_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> served_{0};
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_PEER_CALLS_H_
