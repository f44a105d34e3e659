// Private to the UCX transport: its state, and the parts of it that each of its files works
// on — ucx_transport.cc (context, worker, teardown), ucx_worker.cc (the progress thread and
// its jobs), ucx_endpoints.cc (endpoints and remote keys per peer), ucx_rma.cc (put/get),
// ucx_direct.cc (same-host direct copies), ucx_calls.cc (the active-message call channel),
// ucx_memory.cc (allocation and registration). Members without a lock are the progress
// thread's own.
#ifndef GPUMOVE_DAEMON_PATH_UCX_UCX_TRANSPORT_IMPL_H_
#define GPUMOVE_DAEMON_PATH_UCX_UCX_TRANSPORT_IMPL_H_

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "daemon/common/log.h"
#include "daemon/path/ucx/ucx_transport.h"
#include "daemon/path/ucx/ucx_wire_check.h"

namespace gpumove {
namespace ucx_internal {

inline absl::Status UcxError(ucs_status_t status, absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", ucs_status_string(status)));
}

// This process's mapping that holds `address`: its bounds and its /proc/self/maps line
// (which names what backs it). False when none does.
bool FindMapping(uintptr_t address, uintptr_t* lo, uintptr_t* hi, std::string* line);

// Active message ids and headers of the call channel (ServeCalls / Call). Both ends are
// gpumoved builds of one cluster; the magic catches anything else.
constexpr unsigned kCallRequestAm = 0x6d01;
constexpr unsigned kCallReplyAm = 0x6d02;
constexpr uint32_t kCallMagic = 0x67706d31;  // "gpm1"

struct CallRequestHeader {
  uint32_t magic;
  uint32_t method;
  uint64_t call_id;
  uint32_t key_length;      // The caller's peer key follows the header,
  uint32_t address_length;  // then its worker address.
  uint8_t error_handling;
};

struct CallReplyHeader {
  uint32_t magic;
  int32_t code;  // absl::StatusCode; the body is the message when not OK.
  uint64_t call_id;
};

}  // namespace ucx_internal

struct UcxTransport::Impl {
  struct Peer;
  // What an endpoint's error handler gets: UCX may report an error on an endpoint after
  // it was closed (seen with TCP: the socket's failure found by the next progress), when
  // its Peer may be gone. Closing detaches the Peer; guards live as long as the worker.
  struct EndpointGuard {
    Peer* peer = nullptr;  // Null once the endpoint was closed.
  };
  // One endpoint per peer incarnation, with its unpacked remote keys.
  struct Peer {
    Impl* impl = nullptr;
    EndpointGuard* guard = nullptr;
    std::string key;
    uint64_t generation = 0;  // How often its key had been forgotten when it was made.
    ucp_ep_h ep = nullptr;
    bool failed = false;
    std::string error;
    absl::flat_hash_map<std::string, ucp_rkey_h> rkeys;
  };

  // One slice of a move (or a flush), run by the progress thread.
  struct Op {
    uint64_t generation = 0;  // Of the peer key when the move began.
    bool put = true;
    bool flush = false;
    RemoteRange remote;
    char* local = nullptr;
    uint64_t length = 0;
    uint64_t posted = 0;
    // A vectored op: pieces [piece, piece_end) of this list (local and remote addresses
    // are then the bases the pieces' offsets count from); the posting cursor.
    const Segment* pieces = nullptr;
    size_t piece = 0, piece_end = 0;
    uint64_t in_piece = 0;
    std::atomic<uint64_t> done{0};
    std::vector<std::pair<void*, uint64_t>> requests;
    void* flush_request = nullptr;
    bool flush_posted = false;
    // The last op of a put: once its puts are posted it posts the flush too (after which
    // the bytes are visible at the peer) and ends when all of them completed — one
    // hand-off to the progress thread and back instead of two.
    bool flush_after = false;
    absl::Status status;
    absl::Time failed_at = absl::InfiniteFuture();
    absl::Time last_progress;
    std::atomic<bool> abandon{false};  // Set by a caller that timed out.
    absl::Notification finished;
  };

  // A peer pool that UCX reaches through shared memory (ucp_rkey_ptr works): moves into
  // or out of it are plain copies on the caller's thread, through this process's mapping
  // of the peer's segment. The rkey (and so the mapping) lives while copies use it.
  struct Direct {
    ucp_rkey_h rkey = nullptr;
    intptr_t delta = 0;  // Local address minus remote address.
    int users = 0;       // Guarded by direct_mu.
    bool dead = false;   // Forgotten; destroyed by its last user. Guarded by direct_mu.
  };

  // A call waiting for its reply.
  struct PendingCall {
    std::string peer_key;
    absl::Status status;
    std::string body;
    absl::Notification done;
    // With --v=2: when the progress thread sent the request and when the reply came.
    absl::Time sent, answered;
  };
  // An active message in flight: its buffers live until UCX is done with them.
  struct Outgoing {
    Impl* impl = nullptr;
    std::string header;
    std::string body;
    uint64_t call_id = 0;  // A request's call, failed if the send fails; 0 for a reply.
  };

  UcxOptions options;
  const bool trace_calls = LogVerbosity() >= 2;  // Peer call timings in the log.
  std::string worker_address;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  int worker_fd = -1;  // Readable when the worker has events (UCP_FEATURE_WAKEUP).
  int jobs_fd = -1;    // eventfd written when a job is posted.
  std::thread thread;

  absl::Mutex mu;
  std::deque<std::function<void()>> jobs ABSL_GUARDED_BY(mu);
  bool stop ABSL_GUARDED_BY(mu) = false;
  absl::Mutex direct_mu;
  // By peer key + '\0' + packed rkey; null: that pool is not reachable directly.
  absl::flat_hash_map<std::string, std::shared_ptr<Direct>> direct ABSL_GUARDED_BY(direct_mu);
  std::atomic<uint64_t> direct_bytes{0};
  std::atomic<uint64_t> naps{0};
  int prefaulting ABSL_GUARDED_BY(direct_mu) = 0;  // Prefault helpers still running.

  // Times each peer key was forgotten: a move that began before a Forget must not carry
  // on over the endpoint made after it.
  absl::flat_hash_map<std::string, uint64_t> forgotten ABSL_GUARDED_BY(mu);
  // Peers with an endpoint made and not failed (Connected): a failover moves a share only
  // to a lane already connected, as UCX 1.13's TCP connect can block the progress thread
  // for minutes toward an unreachable host.
  absl::flat_hash_set<std::string> connected ABSL_GUARDED_BY(mu);
  // Each peer's route (Route), read by moves without a trip to the progress thread.
  absl::Mutex routes_mu;
  absl::flat_hash_map<std::string, UcxRoute> routes ABSL_GUARDED_BY(routes_mu);

  uint64_t Generation(const std::string& key);

  // Peer calls made and not answered, plus those served and not yet replied to (see
  // UcxOptions::call_awake).
  std::atomic<int> calls_open{0};
  absl::Mutex calls_mu;
  absl::flat_hash_map<uint64_t, std::shared_ptr<PendingCall>> calls ABSL_GUARDED_BY(calls_mu);
  uint64_t next_call_id ABSL_GUARDED_BY(calls_mu) = 0;

  std::atomic<uint64_t> calls_dropped{0};
  // The entries this node's own worker address has: a peer's address is checked against
  // them before ucp_ep_create sees it (ucx_wire_check.h). Set at Create.
  UcxAddressShape shape;
  bool shape_known = false;
  // OK when `address` may be handed to ucp_ep_create.
  absl::Status CheckAddress(const std::string& address) const;

  // Owned by the progress thread.
  std::string self_key;
  UcxCallHandler handler;
  absl::flat_hash_map<std::string, std::unique_ptr<Peer>> peers;
  std::vector<std::shared_ptr<Op>> active;
  std::vector<ucp_mem_h> registrations;
  std::vector<std::unique_ptr<EndpointGuard>> guards;
  // Memory UCX allocated (Allocate), by base address; also in `registrations`.
  absl::flat_hash_map<void*, ucp_mem_h> allocated;

  // Runs `job` on the progress thread and waits for it.
  void Call(std::function<void()> job);
  // The wake-up is written under the lock: the job cannot run (and a reply it sends cannot
  // let the owner destroy the transport) before the poster is done with the eventfd.
  void Post(std::function<void()> job);

  // Blocks until the worker or the job queue has something, or `timeout_ms` passes.
  void Sleep(int timeout_ms);

  // The direct mapping of `r`'s pool, counted as in use; null when UCX cannot reach it
  // through shared memory (another host, private memory, transports without it).
  std::shared_ptr<Direct> AcquireDirect(const RemoteRange& r);

  // Maps every page of a peer segment just attached, on a helper thread: otherwise the
  // first moves into it fault page by page, at a fraction of the speed.
  // The helper holds the mapping in use meanwhile; the destructor waits for it.
  void Prefault(const std::shared_ptr<Direct>& d, char* inside);

  void ReleaseDirect(const std::shared_ptr<Direct>& d);

  // On the progress thread: drops the direct mappings of a peer incarnation.
  void ForgetDirect(const std::string& peer_key);

  static void OnEndpointError(void* arg, ucp_ep_h, ucs_status_t status);

  Peer* GetPeer(const RemoteRange& r);
  Peer* GetPeer(const std::string& key, const std::string& worker_address, bool error_handling);

  void ClosePeer(Peer* peer, const std::string& why);

  void Fail(Op& op, Peer* peer, absl::Status status);

  // A failed op whose requests UCX never completes (seen with cma to a dead process) is
  // let go after a grace period: its peer is gone, so nothing can reach the memory now.
  bool GiveUp(const Op& op);

  // Collects the requests of `op` that UCX has finished.
  void ReapRequests(Op& op, Peer* peer);

  // Advances one op; true when it has finished.
  bool Advance(Op& op);
  // Runs a move as ops posted one after another, the next posted while the caller waits
  // for the current: `next(prev)` makes the op after `prev` (null: the first), null when
  // none is left. Progress (bytes of `total`) after each op; puts end with a flush made
  // for the peer's `generation` when the move began (a restart since fails it).
  absl::Status RunOps(bool put, const RemoteRange& remote, uint64_t generation, uint64_t total,
                      const std::function<std::shared_ptr<Op>(const Op* prev)>& next,
                      const std::function<bool(uint64_t)>& progress);

  // Ends a call with `status` (and `body`): the caller wakes. No-op when it has ended.
  void FinishCall(uint64_t id, absl::Status status, std::string body = {});

  // Fails every call waiting on `peer_key` (empty: every call).
  void FailCalls(const std::string& peer_key, const absl::Status& status);

  static void OnSent(void* request, ucs_status_t status, void* user_data);

  // On the progress thread: sends one active message to `peer`.
  void SendAm(Peer* peer, unsigned id, std::unique_ptr<Outgoing> out);

  // On the progress thread: answers call `id` of the caller `to`.
  void SendReply(const UcxPeer& to, uint64_t id, const absl::Status& status, std::string body);

  static ucs_status_t OnCallRequest(void* arg, const void* header, size_t header_length, void* data,
                                    size_t length, const ucp_am_recv_param_t* param);

  static ucs_status_t OnCallReply(void* arg, const void* header, size_t header_length, void* data,
                                  size_t length, const ucp_am_recv_param_t* param);

  void Loop();
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_PATH_UCX_UCX_TRANSPORT_IMPL_H_
