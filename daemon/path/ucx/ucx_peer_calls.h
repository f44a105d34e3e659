// Peer calls over UCX active messages: the calls the moving side makes to the other node
// of a move (holds, acknowledgements, staging and MPI steps) carried by the daemon's UCX
// worker instead of gRPC. On this kind of machine a gRPC round trip made from inside a
// serving daemon costs 2-3x a bare echo (measured by a probe since retired: docs/performance/history.md); these calls are on
// every remote move's critical path. Same messages, same handlers, same status codes.
#ifndef GPUMOVE_DAEMON_PATH_UCX_UCX_PEER_CALLS_H_
#define GPUMOVE_DAEMON_PATH_UCX_UCX_PEER_CALLS_H_

#include <atomic>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/cluster/peer_auth.h"
#include "daemon/path/ucx/ucx_transport.h"
#include "daemon/peer/call_parse.h"
#include "daemon/peer/peer_handler.h"
#include "daemon/peer/remote_ranges.h"

namespace gpumove {

// A call message once its framing and stamp are checked: its body, and the mac its
// answer is signed with (empty without a secret).
struct CheckedUcxCall {
  std::string body;
  std::string mac;
};
// Unframes a call that names itself `caller_key` and, with `auth`, checks its stamp and
// that the stamp's node and incarnation are that key's: INVALID_ARGUMENT (framing) or
// UNAUTHENTICATED saying why not. Pure: what the fuzzer drives (tests/fuzz/ucx_call_fuzz).
absl::StatusOr<CheckedUcxCall> CheckUcxCall(PeerAuth* auth, absl::string_view caller_key,
                                            uint32_t method, const std::string& framed);

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

  // Whether `node` at `incarnation` is a peer this node met (Hello'd, up) whose UCX
  // worker address is `worker_address`.
  using KnownPeer = std::function<bool(const std::string& node, uint64_t incarnation,
                                       const std::string& worker_address)>;
  // Calls are served only for callers `known` says are peers, and answered only to the
  // address membership holds for them (checked when it was learned): anything else, and
  // with a cluster secret anything not stamped with it, is dropped unanswered, before an
  // endpoint, a queue entry or a reply is made for it. Without this, no call is served.
  // Called before Serve.
  void Admit(KnownPeer known);
  // Serves the calls that arrive with `handler` (which must stay until StopServing).
  void Serve(PeerHandler* service);
  // Calls arriving from now on are refused (UNAVAILABLE); those running finish. Idempotent.
  void StopServing();

  // Calls served since start, and calls dropped unanswered (unauthenticated, from a node
  // not met, malformed).
  uint64_t served() const { return served_; }
  uint64_t refused() const { return refused_; }

  bool Reaches(const PeerView& peer) const override;
  absl::StatusOr<std::string> Call(const PeerView& peer, PeerMethod method, std::string request,
                                   absl::Duration timeout) override;

  // How long a stamped call from a node not (yet) learned here may wait on a serving
  // thread for its Hello to land, and how many may wait at once.
  static constexpr absl::Duration kAdmitWait = absl::Seconds(1);
  static constexpr int kMaxAdmitWaiting = 2;

 private:
  // A call as the transport hands it over (on its progress thread).
  void OnCall(const UcxPeer& caller, uint32_t method, std::string framed, UcxReply reply);
  // Whether `caller` is a peer met here at the address it gives.
  bool Known(const UcxPeer& caller) const;
  // Runs an admitted call, parsed once: at once when it cannot block (or `on_worker`, on
  // a serving thread already), else on a serving thread.
  void Dispatch(uint32_t method, const std::string& body, UcxReply reply, bool on_worker)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Drops a call unanswered, counted and logged at most every 10 s.
  void Refuse(const UcxPeer& caller, absl::string_view why) ABSL_LOCKS_EXCLUDED(mu_);
  void Work();

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
  std::atomic<uint64_t> refused_{0};
  std::atomic<int> admit_waiting_{0};
  KnownPeer known_;  // Set by Admit, before Serve.
  absl::Time refusal_logged_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t refusals_unlogged_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_UCX_UCX_PEER_CALLS_H_
