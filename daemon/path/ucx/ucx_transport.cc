#include "daemon/path/ucx/ucx_transport.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "daemon/common/host_copy.h"
#include "daemon/common/log.h"

namespace gpumove {
namespace {

absl::Status UcxError(ucs_status_t status, absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", ucs_status_string(status)));
}

// This process's mapping that holds `address`: its bounds and its /proc/self/maps line
// (which names what backs it). False when none does.
bool FindMapping(uintptr_t address, uintptr_t* lo, uintptr_t* hi, std::string* line) {
  std::ifstream maps("/proc/self/maps");
  while (std::getline(maps, *line)) {
    if (sscanf(line->c_str(), "%lx-%lx", lo, hi) == 2 && *lo <= address && address < *hi) {
      return true;
    }
  }
  return false;
}

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

}  // namespace

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
    std::atomic<uint64_t> done{0};
    std::vector<std::pair<void*, uint64_t>> requests;
    void* flush_request = nullptr;
    bool flush_posted = false;
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

  uint64_t Generation(const std::string& key) {
    absl::MutexLock lock(&mu);
    auto it = forgotten.find(key);
    return it == forgotten.end() ? 0 : it->second;
  }

  // Peer calls made and not answered, plus those served and not yet replied to (see
  // UcxOptions::call_awake).
  std::atomic<int> calls_open{0};
  absl::Mutex calls_mu;
  absl::flat_hash_map<uint64_t, std::shared_ptr<PendingCall>> calls ABSL_GUARDED_BY(calls_mu);
  uint64_t next_call_id ABSL_GUARDED_BY(calls_mu) = 0;

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
  void Call(std::function<void()> job) {
    absl::Notification done;
    Post([&] {
      job();
      done.Notify();
    });
    done.WaitForNotification();
  }
  // The wake-up is written under the lock: the job cannot run (and a reply it sends cannot
  // let the owner destroy the transport) before the poster is done with the eventfd.
  void Post(std::function<void()> job) {
    absl::MutexLock lock(&mu);
    jobs.push_back(std::move(job));
    if (jobs_fd >= 0) {
      const uint64_t one = 1;
      (void)!write(jobs_fd, &one, sizeof(one));
    }
  }

  // Blocks until the worker or the job queue has something, or `timeout_ms` passes.
  void Sleep(int timeout_ms) {
    if (ucp_worker_arm(worker) == UCS_ERR_BUSY) return;  // Events are already pending.
    pollfd fds[2] = {{worker_fd, POLLIN, 0}, {jobs_fd, POLLIN, 0}};
    poll(fds, 2, timeout_ms);
    if (fds[1].revents & POLLIN) {
      uint64_t n = 0;
      (void)!read(jobs_fd, &n, sizeof(n));
    }
  }

  // The direct mapping of `r`'s pool, counted as in use; null when UCX cannot reach it
  // through shared memory (another host, private memory, transports without it).
  std::shared_ptr<Direct> AcquireDirect(const RemoteRange& r) {
    const std::string key = absl::StrCat(r.peer_key, std::string(1, '\0'), r.rkey);
    {
      absl::MutexLock lock(&direct_mu);
      auto it = direct.find(key);
      if (it != direct.end()) {
        if (it->second == nullptr) return nullptr;
        ++it->second->users;
        return it->second;
      }
    }
    // First move to this peer pool: unpack its key and ask UCX for a local pointer.
    std::shared_ptr<Direct> found;
    std::shared_ptr<Direct> fresh;
    const uint64_t generation = Generation(r.peer_key);
    bool inserted = false;
    Call([&] {
      Peer* peer = GetPeer(r);
      if (peer->failed || peer->ep == nullptr || peer->generation > generation) return;
      ucp_rkey_h rkey = nullptr;
      if (ucp_ep_rkey_unpack(peer->ep, r.rkey.data(), &rkey) != UCS_OK) return;
      void* local = nullptr;
      if (ucp_rkey_ptr(rkey, r.address, &local) != UCS_OK) {
        ucp_rkey_destroy(rkey);
        absl::MutexLock lock(&direct_mu);
        direct.emplace(key, nullptr);
        return;
      }
      auto d = std::make_shared<Direct>();
      d->rkey = rkey;
      d->delta = reinterpret_cast<intptr_t>(local) - static_cast<intptr_t>(r.address);
      absl::MutexLock lock(&direct_mu);
      auto [it, added] = direct.emplace(key, d);
      inserted = added;
      if (!inserted) {
        ucp_rkey_destroy(rkey);  // Another move got there first.
        d = it->second;
      }
      if (d != nullptr) ++d->users;
      if (inserted) fresh = d;
      found = d;
    });
    if (fresh != nullptr) Prefault(fresh, reinterpret_cast<char*>(r.address + fresh->delta));
    return found;
  }

  // Maps every page of a peer segment just attached, on a helper thread: otherwise the
  // first moves into it fault page by page, at a fraction of the speed.
  // The helper holds the mapping in use meanwhile; the destructor waits for it.
  void Prefault(const std::shared_ptr<Direct>& d, char* inside) {
    uintptr_t lo = 0, hi = 0;
    std::string line;
    if (!FindMapping(reinterpret_cast<uintptr_t>(inside), &lo, &hi, &line)) return;
    {
      absl::MutexLock lock(&direct_mu);
      ++d->users;
      ++prefaulting;
    }
    std::thread([this, d, lo, hi] {
      // Kernels before 5.14 refuse MADV_POPULATE_WRITE; the pages then fault on use.
      madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE);
      ReleaseDirect(d);
      absl::MutexLock lock(&direct_mu);
      --prefaulting;
    }).detach();
  }

  void ReleaseDirect(const std::shared_ptr<Direct>& d) {
    absl::MutexLock lock(&direct_mu);
    if (--d->users == 0 && d->dead) {
      Post([d] { ucp_rkey_destroy(d->rkey); });
    }
  }

  // On the progress thread: drops the direct mappings of a peer incarnation.
  void ForgetDirect(const std::string& peer_key) {
    const std::string prefix = absl::StrCat(peer_key, std::string(1, '\0'));
    absl::MutexLock lock(&direct_mu);
    for (auto it = direct.begin(); it != direct.end();) {
      if (!absl::StartsWith(it->first, prefix)) {
        ++it;
        continue;
      }
      if (it->second != nullptr) {
        it->second->dead = true;
        if (it->second->users == 0) ucp_rkey_destroy(it->second->rkey);
      }
      direct.erase(it++);
    }
  }

  static void OnEndpointError(void* arg, ucp_ep_h, ucs_status_t status) {
    Peer* peer = static_cast<EndpointGuard*>(arg)->peer;
    if (peer == nullptr) return;  // Closed: its moves and calls were failed then.
    peer->failed = true;
    peer->error = absl::StrCat("peer endpoint failed: ", ucs_status_string(status));
    peer->impl->FailCalls(peer->key, absl::UnavailableError(peer->error));
  }

  Peer* GetPeer(const RemoteRange& r) {
    return GetPeer(r.peer_key, r.worker_address, r.peer_error_handling);
  }
  Peer* GetPeer(const std::string& key, const std::string& worker_address, bool error_handling) {
    auto& slot = peers[key];
    if (slot == nullptr) {
      slot = std::make_unique<Peer>();
      slot->impl = this;
      slot->key = key;
      slot->generation = Generation(key);
      ucp_ep_params_t params = {};
      params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                          UCP_EP_PARAM_FIELD_ERR_HANDLER;
      params.address = reinterpret_cast<const ucp_address_t*>(worker_address.data());
      params.err_mode = error_handling ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
      guards.push_back(std::make_unique<EndpointGuard>(EndpointGuard{slot.get()}));
      slot->guard = guards.back().get();
      params.err_handler.cb = &Impl::OnEndpointError;
      params.err_handler.arg = slot->guard;
      ucs_status_t st = ucp_ep_create(worker, &params, &slot->ep);
      if (st != UCS_OK) {
        slot->ep = nullptr;
        slot->failed = true;
        slot->error = absl::StrCat("ucp_ep_create: ", ucs_status_string(st));
      }
    }
    return slot.get();
  }

  void ClosePeer(Peer* peer, const std::string& why) {
    for (auto& [bytes, rkey] : peer->rkeys) ucp_rkey_destroy(rkey);
    peer->rkeys.clear();
    if (peer->guard != nullptr) peer->guard->peer = nullptr;
    if (peer->ep != nullptr) {
      ucp_request_param_t param = {};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void* req = ucp_ep_close_nbx(peer->ep, &param);
      if (UCS_PTR_IS_PTR(req)) ucp_request_free(req);
      peer->ep = nullptr;
    }
    if (!peer->failed) {
      peer->failed = true;
      peer->error = why;
    }
  }

  void Fail(Op& op, Peer* peer, absl::Status status) {
    if (!op.status.ok()) return;
    op.status = std::move(status);
    op.failed_at = absl::Now();
    // Outstanding requests still point at local memory: force the endpoint closed so they
    // complete (with errors) before the caller may reuse it.
    if (peer != nullptr && !op.requests.empty()) ClosePeer(peer, std::string(op.status.message()));
    for (auto& [req, n] : op.requests) ucp_request_cancel(worker, req);
  }

  // A failed op whose requests UCX never completes (seen with cma to a dead process) is
  // let go after a grace period: its peer is gone, so nothing can reach the memory now.
  bool GiveUp(const Op& op) {
    if (absl::Now() - op.failed_at < absl::Seconds(1)) return false;
    LOG(WARNING) << "abandoning " << op.requests.size() << " UCX request(s) to a failed peer";
    return true;
  }

  // Collects the requests of `op` that UCX has finished.
  void ReapRequests(Op& op, Peer* peer) {
    for (auto it = op.requests.begin(); it != op.requests.end();) {
      ucs_status_t st = ucp_request_check_status(it->first);
      if (st == UCS_INPROGRESS) {
        ++it;
        continue;
      }
      ucp_request_free(it->first);
      if (st != UCS_OK) {
        Fail(op, peer, UcxError(st, op.put ? "ucp_put_nbx" : "ucp_get_nbx"));
      } else {
        op.done += it->second;
        op.last_progress = absl::Now();
      }
      it = op.requests.erase(it);
    }
  }

  // Advances one op; true when it has finished.
  bool Advance(Op& op) {
    if (!op.status.ok()) {
      // Failed (Forget, timeout, error): only its requests' ends are awaited.
      ReapRequests(op, nullptr);
      return op.requests.empty() || GiveUp(op);
    }
    Peer* peer = GetPeer(op.remote);
    if (op.generation < peer->generation) {
      Fail(op, nullptr, absl::UnavailableError("peer restarted or down during the move"));
      return op.requests.empty();
    }
    if (peer->failed && op.status.ok()) Fail(op, peer, absl::UnavailableError(peer->error));
    if (op.abandon && op.status.ok()) {
      Fail(op, peer, absl::UnavailableError("move abandoned after a timeout"));
    }
    ReapRequests(op, peer);
    if (!op.status.ok()) return op.requests.empty() || GiveUp(op);
    ucp_rkey_h rkey = nullptr;
    if (!op.flush) {
      auto found = peer->rkeys.find(op.remote.rkey);
      if (found == peer->rkeys.end()) {
        ucs_status_t st = ucp_ep_rkey_unpack(peer->ep, op.remote.rkey.data(), &rkey);
        if (st != UCS_OK) {
          Fail(op, peer, UcxError(st, "ucp_ep_rkey_unpack"));
          return op.requests.empty();
        }
        peer->rkeys.emplace(op.remote.rkey, rkey);
      } else {
        rkey = found->second;
      }
    }
    if (op.flush) {
      if (!op.flush_posted) {
        ucp_request_param_t param = {};
        void* req = ucp_ep_flush_nbx(peer->ep, &param);
        op.flush_posted = true;
        if (UCS_PTR_IS_ERR(req)) {
          Fail(op, peer, UcxError(UCS_PTR_STATUS(req), "ucp_ep_flush_nbx"));
          return true;
        }
        if (req == nullptr) return true;
        op.requests.emplace_back(req, 0);
      }
      return op.requests.empty() && op.flush_posted;
    }
    while (op.posted < op.length && op.requests.size() < static_cast<size_t>(options.window)) {
      const uint64_t n = std::min(options.chunk, op.length - op.posted);
      ucp_request_param_t param = {};
      void* req = op.put ? ucp_put_nbx(peer->ep, op.local + op.posted, n,
                                       op.remote.address + op.posted, rkey, &param)
                         : ucp_get_nbx(peer->ep, op.local + op.posted, n,
                                       op.remote.address + op.posted, rkey, &param);
      op.posted += n;
      if (req == nullptr) {
        op.done += n;
        op.last_progress = absl::Now();
      } else if (UCS_PTR_IS_ERR(req)) {
        Fail(op, peer, UcxError(UCS_PTR_STATUS(req), op.put ? "ucp_put_nbx" : "ucp_get_nbx"));
        return op.requests.empty();
      } else {
        op.requests.emplace_back(req, n);
      }
    }
    if (absl::Now() - op.last_progress > options.op_timeout) {
      Fail(op, peer,
           absl::UnavailableError(absl::StrCat("no progress from the peer for ",
                                               absl::FormatDuration(options.op_timeout))));
      return op.requests.empty();
    }
    return op.done == op.length && op.requests.empty();
  }

  // Ends a call with `status` (and `body`): the caller wakes. No-op when it has ended.
  void FinishCall(uint64_t id, absl::Status status, std::string body = {}) {
    std::shared_ptr<PendingCall> call;
    {
      absl::MutexLock lock(&calls_mu);
      auto it = calls.find(id);
      if (it == calls.end()) return;
      call = std::move(it->second);
      calls.erase(it);
    }
    call->status = std::move(status);
    call->body = std::move(body);
    if (trace_calls) call->answered = absl::Now();
    call->done.Notify();
  }

  // Fails every call waiting on `peer_key` (empty: every call).
  void FailCalls(const std::string& peer_key, const absl::Status& status) {
    std::vector<uint64_t> ids;
    {
      absl::MutexLock lock(&calls_mu);
      for (const auto& [id, call] : calls) {
        if (peer_key.empty() || call->peer_key == peer_key) ids.push_back(id);
      }
    }
    for (uint64_t id : ids) FinishCall(id, status);
  }

  static void OnSent(void* request, ucs_status_t status, void* user_data) {
    auto* out = static_cast<Outgoing*>(user_data);
    if (status != UCS_OK && out->call_id != 0) {
      out->impl->FinishCall(out->call_id, UcxError(status, "sending a peer call"));
    }
    ucp_request_free(request);
    delete out;
  }

  // On the progress thread: sends one active message to `peer`.
  void SendAm(Peer* peer, unsigned id, std::unique_ptr<Outgoing> out) {
    out->impl = this;
    ucp_request_param_t param = {};
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    // Eager: the receiver gets the whole message in its callback, no rendezvous step.
    param.flags = UCP_AM_SEND_FLAG_EAGER;
    param.cb.send = &Impl::OnSent;
    param.user_data = out.get();
    void* req = ucp_am_send_nbx(peer->ep, id, out->header.data(), out->header.size(),
                                out->body.data(), out->body.size(), &param);
    if (UCS_PTR_IS_ERR(req)) {
      if (out->call_id != 0) {
        FinishCall(out->call_id, UcxError(UCS_PTR_STATUS(req), "sending a peer call"));
      }
    } else if (req != nullptr) {
      (void)out.release();  // OnSent frees it.
    }
  }

  // On the progress thread: answers call `id` of the caller `to`.
  void SendReply(const UcxPeer& to, uint64_t id, const absl::Status& status, std::string body) {
    Peer* peer = GetPeer(to.key, to.worker_address, to.error_handling);
    if (peer->failed || peer->ep == nullptr) return;  // The caller times out or is forgotten.
    auto out = std::make_unique<Outgoing>();
    CallReplyHeader h{kCallMagic, static_cast<int32_t>(status.code()), id};
    out->header.assign(reinterpret_cast<const char*>(&h), sizeof(h));
    out->body = status.ok() ? std::move(body) : std::string(status.message());
    SendAm(peer, kCallReplyAm, std::move(out));
  }

  static ucs_status_t OnCallRequest(void* arg, const void* header, size_t header_length, void* data,
                                    size_t length, const ucp_am_recv_param_t* param) {
    auto* impl = static_cast<Impl*>(arg);
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) return UCS_ERR_UNSUPPORTED;  // Eager only.
    CallRequestHeader h;
    if (header_length < sizeof(h)) return UCS_OK;
    memcpy(&h, header, sizeof(h));
    if (h.magic != kCallMagic ||
        header_length != sizeof(h) + uint64_t{h.key_length} + h.address_length) {
      LOG(WARNING) << "dropping a malformed peer call";
      return UCS_OK;
    }
    const char* extra = static_cast<const char*>(header) + sizeof(h);
    UcxPeer caller{std::string(extra, h.key_length),
                   std::string(extra + h.key_length, h.address_length), h.error_handling != 0};
    const uint64_t id = h.call_id;
    if (impl->handler == nullptr) {
      impl->SendReply(caller, id, absl::UnavailableError("this node does not serve peer calls"),
                      {});
      return UCS_OK;
    }
    const absl::Time received = impl->trace_calls ? absl::Now() : absl::InfinitePast();
    impl->calls_open.fetch_add(1);
    UcxReply reply = [impl, caller = std::move(caller), id, method = h.method, received](
                         const absl::Status& status, std::string body) {
      const absl::Time answered = impl->trace_calls ? absl::Now() : absl::InfinitePast();
      auto send = [impl, caller, id, status, method, received, answered](std::string body) {
        impl->SendReply(caller, id, status, std::move(body));
        impl->calls_open.fetch_sub(1);
        if (impl->trace_calls) {
          VLOG(2) << "peer call " << method << " served: answered "
                  << absl::ToDoubleMicroseconds(answered - received) << " us after it came, "
                  << "reply sent " << absl::ToDoubleMicroseconds(absl::Now() - answered)
                  << " us later";
        }
      };
      if (std::this_thread::get_id() == impl->thread.get_id()) {
        send(std::move(body));  // Answered at once, on the progress thread: sent now.
        return;
      }
      impl->Post([send, body = std::move(body)]() mutable { send(std::move(body)); });
    };
    impl->handler(h.method, std::string(static_cast<const char*>(data), length), std::move(reply));
    return UCS_OK;
  }

  static ucs_status_t OnCallReply(void* arg, const void* header, size_t header_length, void* data,
                                  size_t length, const ucp_am_recv_param_t* param) {
    auto* impl = static_cast<Impl*>(arg);
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) return UCS_ERR_UNSUPPORTED;
    CallReplyHeader h;
    if (header_length != sizeof(h)) return UCS_OK;
    memcpy(&h, header, sizeof(h));
    if (h.magic != kCallMagic) return UCS_OK;
    std::string body(static_cast<const char*>(data), length);
    if (h.code == 0) {
      impl->FinishCall(h.call_id, absl::OkStatus(), std::move(body));
    } else {
      impl->FinishCall(h.call_id, absl::Status(static_cast<absl::StatusCode>(h.code), body));
    }
    return UCS_OK;
  }

  void Loop() {
    absl::Time last_activity = absl::InfinitePast();
    while (true) {
      std::deque<std::function<void()>> ready;
      bool idle = false;
      {
        absl::MutexLock lock(&mu);
        if (stop && active.empty()) return;
        idle = active.empty() && jobs.empty();
      }
      // Idle: sleep until the network or a caller has something (peers' wire-up and
      // remote-side protocol steps need this worker to progress promptly) -- unless
      // something happened within the poll window: a reply is likely on its way.
      if (idle) {
        const absl::Duration quiet = absl::Now() - last_activity;
        if (quiet >= options.poll_window &&
            (quiet >= options.call_awake || calls_open.load(std::memory_order_relaxed) == 0)) {
          naps.fetch_add(1, std::memory_order_relaxed);
          Sleep(100);
        }
      }
      {
        absl::MutexLock lock(&mu);
        ready.swap(jobs);
      }
      for (auto& job : ready) job();
      unsigned events = 0;
      for (int i = 0; i < 64; ++i) {
        const unsigned n = ucp_worker_progress(worker);
        if (n == 0) break;
        events += n;
      }
      // Busy moves are polled, but a poll that found nothing yields the CPU: on a small
      // machine the threads feeding those moves need it more than this one.
      if (events == 0 && ready.empty()) {
        std::this_thread::yield();
      } else {
        last_activity = absl::Now();
      }
      for (auto it = active.begin(); it != active.end();) {
        if (Advance(**it)) {
          (*it)->finished.Notify();
          it = active.erase(it);
        } else {
          ++it;
        }
      }
    }
  }
};

UcxTransport::UcxTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::Create(UcxOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return UcxError(st, "ucp_config_read");
  if (!options.net_devices.empty() && std::getenv("UCX_NET_DEVICES") == nullptr) {
    st = ucp_config_modify(config, "NET_DEVICES", options.net_devices.c_str());
    if (st != UCS_OK) {
      ucp_config_release(config);
      return UcxError(st, absl::StrCat("UCX_NET_DEVICES=", options.net_devices));
    }
  }
  ucp_params_t params = {};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  st = ucp_init(&params, config, &impl->context);
  ucp_config_release(config);
  if (st != UCS_OK) return UcxError(st, "ucp_init");
  ucp_worker_params_t wparams = {};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
  st = ucp_worker_create(impl->context, &wparams, &impl->worker);
  if (st != UCS_OK) {
    ucp_cleanup(impl->context);
    return UcxError(st, "ucp_worker_create");
  }
  for (unsigned id : {kCallRequestAm, kCallReplyAm}) {
    ucp_am_handler_param_t am = {};
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                    UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    am.id = id;
    am.flags = UCP_AM_FLAG_WHOLE_MSG;
    am.cb = id == kCallRequestAm ? &Impl::OnCallRequest : &Impl::OnCallReply;
    am.arg = impl.get();
    st = ucp_worker_set_am_recv_handler(impl->worker, &am);
    if (st != UCS_OK) {
      ucp_worker_destroy(impl->worker);
      ucp_cleanup(impl->context);
      return UcxError(st, "ucp_worker_set_am_recv_handler");
    }
  }
  st = ucp_worker_get_efd(impl->worker, &impl->worker_fd);
  if (st != UCS_OK) return UcxError(st, "ucp_worker_get_efd");
  impl->jobs_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ucp_worker_attr_t wattr = {};
  wattr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
  st = ucp_worker_query(impl->worker, &wattr);
  if (st != UCS_OK) return UcxError(st, "ucp_worker_query");
  std::string address(reinterpret_cast<const char*>(wattr.address), wattr.address_length);
  ucp_worker_release_address(impl->worker, wattr.address);
  ucp_context_attr_t cattr = {};
  cattr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  const bool cuda_aware = ucp_context_query(impl->context, &cattr) == UCS_OK &&
                          (cattr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;

  impl->worker_address = address;
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->Loop(); });
  auto transport = std::unique_ptr<UcxTransport>(new UcxTransport(std::move(impl)));
  transport->worker_address_ = std::move(address);
  transport->cuda_aware_ = cuda_aware;
  return transport;
}

void UcxTransport::SetProcessDefaults() {
  // UCX's TCP transport moves 8 KiB segments by default: puts between hosts then run at a
  // fraction of the link; 512 KiB segments take them to several times that
  // (docs/performance/tuning.md). A value already in the environment wins; UCX refuses to
  // start with receive segments smaller than send segments, so one given alone sets the
  // other too.
  const char* tx = std::getenv("UCX_TCP_TX_SEG_SIZE");
  const char* rx = std::getenv("UCX_TCP_RX_SEG_SIZE");
  const std::string value = tx != nullptr ? tx : rx != nullptr ? rx : "512k";
  if (tx == nullptr) setenv("UCX_TCP_TX_SEG_SIZE", value.c_str(), 1);
  if (rx == nullptr) setenv("UCX_TCP_RX_SEG_SIZE", value.c_str(), 1);
}

UcxTransport::~UcxTransport() {
  {
    absl::MutexLock lock(&impl_->direct_mu);
    auto done = [this]() ABSL_SHARED_LOCKS_REQUIRED(impl_->direct_mu) {
      return impl_->prefaulting == 0;
    };
    impl_->direct_mu.Await(absl::Condition(&done));
  }
  impl_->Call([this] {
    impl_->handler = nullptr;
    impl_->FailCalls("", absl::UnavailableError("UCX is shutting down"));
    for (auto& [key, peer] : impl_->peers) {
      impl_->ForgetDirect(key);
      impl_->ClosePeer(peer.get(), "shutting down");
    }
  });
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->stop = true;
  }
  impl_->Post([] {});
  impl_->thread.join();
  {
    absl::MutexLock lock(&impl_->mu);
    close(impl_->jobs_fd);
    impl_->jobs_fd = -1;
  }
  for (ucp_mem_h memh : impl_->registrations) ucp_mem_unmap(impl_->context, memh);
  ucp_worker_destroy(impl_->worker);
  ucp_cleanup(impl_->context);
}

std::string UcxTransport::transports() const {
  const char* tls = std::getenv("UCX_TLS");
  return tls != nullptr && *tls != '\0' ? tls : "all";
}

absl::StatusOr<void*> UcxTransport::Allocate(uint64_t length) {
  absl::StatusOr<void*> result;
  impl_->Call([&] {
    ucp_mem_map_params_t params = {};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                        UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    params.address = nullptr;
    params.length = length;
    params.flags = UCP_MEM_MAP_ALLOCATE;
    ucp_mem_h memh = nullptr;
    ucs_status_t st = ucp_mem_map(impl_->context, &params, &memh);
    if (st != UCS_OK) {
      result = UcxError(st, "ucp_mem_map (allocate)");
      return;
    }
    ucp_mem_attr_t attr = {};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    st = ucp_mem_query(memh, &attr);
    if (st != UCS_OK || attr.length < length) {
      ucp_mem_unmap(impl_->context, memh);
      result = st != UCS_OK ? UcxError(st, "ucp_mem_query")
                            : absl::ResourceExhaustedError("UCX allocated too little");
      return;
    }
    impl_->registrations.push_back(memh);
    impl_->allocated[attr.address] = memh;
    result = attr.address;
  });
  // Fault every page in now (off the progress thread), so the first move into a buffer
  // runs at memory speed.
  if (result.ok()) memset(*result, 0, length);
  return result;
}

void UcxTransport::Free(void* base) {
  impl_->Call([&] {
    auto it = impl_->allocated.find(base);
    if (it == impl_->allocated.end()) return;
    ucp_mem_h memh = it->second;
    impl_->allocated.erase(it);
    std::erase(impl_->registrations, memh);
    ucp_mem_unmap(impl_->context, memh);
  });
}

std::string UcxTransport::allocation_kind() const {
  // UCX does not say which allocator served a ucp_mem_map; the mapping's name does:
  // "/SYSV<key>" for System V, a file under /dev/shm for POSIX shared memory.
  std::vector<uintptr_t> bases;
  impl_->Call([&] {
    for (const auto& [base, memh] : impl_->allocated) {
      bases.push_back(reinterpret_cast<uintptr_t>(base));
    }
  });
  if (bases.empty()) return "private memory";
  size_t shared = 0;
  for (uintptr_t base : bases) {
    uintptr_t lo = 0, hi = 0;
    std::string line;
    if (FindMapping(base, &lo, &hi, &line) &&
        (line.find("/SYSV") != std::string::npos || line.find("/dev/shm/") != std::string::npos)) {
      ++shared;
    }
  }
  return shared == bases.size() ? "shared memory" : "private memory";
}

absl::StatusOr<std::string> UcxTransport::Register(void* base, uint64_t length) {
  absl::StatusOr<std::string> result;
  impl_->Call([&] {
    ucs_status_t st = UCS_OK;
    ucp_mem_h memh = nullptr;
    if (auto it = impl_->allocated.find(base); it != impl_->allocated.end()) {
      memh = it->second;
    } else {
      ucp_mem_map_params_t params = {};
      params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
      params.address = base;
      params.length = length;
      st = ucp_mem_map(impl_->context, &params, &memh);
      if (st != UCS_OK) {
        result = UcxError(st, "ucp_mem_map");
        return;
      }
      impl_->registrations.push_back(memh);
    }
    void* rkey = nullptr;
    size_t size = 0;
    st = ucp_rkey_pack(impl_->context, memh, &rkey, &size);
    if (st != UCS_OK) {
      result = UcxError(st, "ucp_rkey_pack");
      return;
    }
    result = std::string(static_cast<const char*>(rkey), size);
    ucp_rkey_buffer_release(rkey);
  });
  return result;
}

absl::Status UcxTransport::Rma(bool put, const RemoteRange& remote, void* local, uint64_t length,
                               const std::function<bool(uint64_t)>& progress) {
  if (impl_->options.direct) {
    if (std::shared_ptr<Impl::Direct> d = impl_->AcquireDirect(remote); d != nullptr) {
      absl::Status st = CopyDirect(put, remote, reinterpret_cast<char*>(remote.address + d->delta),
                                   static_cast<char*>(local), length, progress);
      impl_->ReleaseDirect(d);
      return st;
    }
  }
  // The move is cut into slices that the caller waits for one at a time (with the next
  // already posted), so progress, rate limits and cancel act between slices.
  const uint64_t slice =
      std::max<uint64_t>(impl_->options.chunk * impl_->options.window / 2, impl_->options.chunk);
  const uint64_t generation = impl_->Generation(remote.peer_key);
  auto start = [&](uint64_t offset, bool flush) {
    auto op = std::make_shared<Impl::Op>();
    op->generation = generation;
    op->put = put;
    op->flush = flush;
    op->remote = remote;
    op->remote.address += offset;
    op->local = static_cast<char*>(local) + offset;
    op->length = flush ? 0 : std::min(slice, length - offset);
    op->last_progress = absl::Now();
    impl_->Post([this, op] { impl_->active.push_back(op); });
    return op;
  };
  auto wait = [&](Impl::Op& op) -> absl::Status {
    // The progress thread enforces op_timeout; this bound only guards against a stuck
    // thread, with room for it to fail the op first.
    if (!op.finished.WaitForNotificationWithTimeout(impl_->options.op_timeout + absl::Seconds(5))) {
      op.abandon = true;
      op.finished.WaitForNotification();
    }
    return op.status;
  };
  uint64_t done = 0;
  std::shared_ptr<Impl::Op> current = start(0, false);
  bool stopped = false;
  while (current != nullptr) {
    const uint64_t next_offset = done + current->length;
    std::shared_ptr<Impl::Op> next;
    if (next_offset < length && !stopped) next = start(next_offset, false);
    absl::Status st = wait(*current);
    if (!st.ok()) {
      if (next != nullptr) wait(*next).IgnoreError();
      return st;
    }
    done = next_offset;
    if (progress && !progress(done) && done < length) stopped = true;
    if (stopped && next != nullptr) {
      if (absl::Status n = wait(*next); !n.ok()) return n;
      done += next->length;
      next = nullptr;
    }
    current = next;
  }
  if (put) {
    // Puts complete locally before they land; the flush makes them visible remotely.
    auto flush = start(0, true);
    if (absl::Status st = wait(*flush); !st.ok()) return st;
  }
  if (stopped && done < length) return absl::CancelledError("cancelled");
  return absl::OkStatus();
}

int DirectCopyThreads(const UcxOptions& options, const RemoteRange& remote) {
  const int direct = std::max(1, options.direct_threads);
  if (!remote.staged) return direct;
  if (options.staged_threads > 0) return options.staged_threads;
  return std::max(1, remote.bounce ? direct / 2 : direct / 4);
}

absl::Status UcxTransport::CopyDirect(bool put, const RemoteRange& remote, char* mapped,
                                      char* local, uint64_t length,
                                      const std::function<bool(uint64_t)>& progress) {
  // Slices of at least 16 MiB per copying thread (big enough for streaming stores):
  // progress, rate limits and cancel act between them. The peer sees the bytes once the
  // copy returns (HostCopy fences its streaming stores).
  const uint64_t generation = impl_->Generation(remote.peer_key);
  const int threads = DirectCopyThreads(impl_->options, remote);
  const uint64_t slice = std::max<uint64_t>(impl_->options.chunk, 16 << 20) * threads;
  const uint64_t streaming_min = remote.bounce ? kBounceStreamingMin : kStreamingCopyMin;
  uint64_t done = 0;
  while (done < length) {
    const uint64_t n = std::min(slice, length - done);
    if (put) {
      ParallelHostCopy(mapped + done, local + done, n, threads, streaming_min);
    } else {
      ParallelHostCopy(local + done, mapped + done, n, threads, streaming_min);
    }
    done += n;
    impl_->direct_bytes += n;
    if (impl_->Generation(remote.peer_key) != generation) {
      return absl::UnavailableError("peer restarted or down during the move");
    }
    if (progress && !progress(done) && done < length) return absl::CancelledError("cancelled");
  }
  return absl::OkStatus();
}

bool UcxTransport::Direct(const RemoteRange& remote) {
  if (!impl_->options.direct) return false;
  std::shared_ptr<Impl::Direct> d = impl_->AcquireDirect(remote);
  if (d == nullptr) return false;
  impl_->ReleaseDirect(d);
  return true;
}

uint64_t UcxTransport::direct_bytes() const { return impl_->direct_bytes; }
uint64_t UcxTransport::naps() const { return impl_->naps; }

absl::Status UcxTransport::Put(const RemoteRange& remote, const void* local, uint64_t length,
                               const std::function<bool(uint64_t)>& progress) {
  return Rma(true, remote, const_cast<void*>(local), length, progress);
}

absl::Status UcxTransport::Get(const RemoteRange& remote, void* local, uint64_t length,
                               const std::function<bool(uint64_t)>& progress) {
  return Rma(false, remote, local, length, progress);
}

void UcxTransport::ServeCalls(const std::string& self_key, UcxCallHandler handler) {
  impl_->Call([&] {
    impl_->self_key = self_key;
    impl_->handler = std::move(handler);
  });
}

absl::StatusOr<std::string> UcxTransport::Call(const UcxPeer& peer, uint32_t method,
                                               std::string body, absl::Duration timeout) {
  const absl::Time t0 = absl::Now();
  auto call = std::make_shared<Impl::PendingCall>();
  call->peer_key = peer.key;
  impl_->calls_open.fetch_add(1);
  absl::Cleanup closed = [this] { impl_->calls_open.fetch_sub(1); };
  uint64_t id = 0;
  {
    absl::MutexLock lock(&impl_->calls_mu);
    id = ++impl_->next_call_id;
    impl_->calls.emplace(id, call);
  }
  impl_->Post([impl = impl_.get(), peer, method, id, body = std::move(body)]() mutable {
    Impl::Peer* p = impl->GetPeer(peer.key, peer.worker_address, peer.error_handling);
    if (p->failed || p->ep == nullptr) {
      impl->FinishCall(id, absl::UnavailableError(p->error));
      return;
    }
    if (impl->self_key.empty()) {
      impl->FinishCall(id, absl::FailedPreconditionError("peer calls are not set up here"));
      return;
    }
    CallRequestHeader h{};
    h.magic = kCallMagic;
    h.method = method;
    h.call_id = id;
    h.key_length = static_cast<uint32_t>(impl->self_key.size());
    h.address_length = static_cast<uint32_t>(impl->worker_address.size());
    h.error_handling = peer.error_handling ? 1 : 0;
    auto out = std::make_unique<Impl::Outgoing>();
    out->call_id = id;
    out->header.assign(reinterpret_cast<const char*>(&h), sizeof(h));
    out->header += impl->self_key;
    out->header += impl->worker_address;
    out->body = std::move(body);
    impl->SendAm(p, kCallRequestAm, std::move(out));
    if (impl->trace_calls) {
      absl::MutexLock lock(&impl->calls_mu);
      auto it = impl->calls.find(id);
      if (it != impl->calls.end()) it->second->sent = absl::Now();
    }
  });
  // Poll for the answer before blocking (see UcxOptions::poll_window and call_awake).
  for (const absl::Time spin_until =
           absl::Now() + std::max(impl_->options.poll_window, impl_->options.call_awake);
       !call->done.HasBeenNotified() && absl::Now() < spin_until;) {
    std::this_thread::yield();
  }
  if (!call->done.WaitForNotificationWithTimeout(timeout)) {
    {
      absl::MutexLock lock(&impl_->calls_mu);
      if (impl_->calls.erase(id) == 1) {
        return absl::UnavailableError(absl::StrCat("no answer from peer ", peer.key, " within ",
                                                   absl::FormatDuration(timeout)));
      }
    }
    call->done.WaitForNotification();  // Its reply is being delivered right now.
  }
  if (impl_->trace_calls && call->sent != absl::Time()) {
    VLOG(2) << "peer call " << method << " to " << peer.key << ": sent "
            << absl::ToDoubleMicroseconds(call->sent - t0) << " us, answered "
            << absl::ToDoubleMicroseconds(call->answered - t0) << " us, caller back "
            << absl::ToDoubleMicroseconds(absl::Now() - t0) << " us after the call";
  }
  if (!call->status.ok()) return call->status;
  return std::move(call->body);
}

void UcxTransport::Forget(const std::string& peer_key) {
  impl_->FailCalls(peer_key, absl::UnavailableError("peer restarted or down"));
  impl_->Call([&] {
    auto it = impl_->peers.find(peer_key);
    if (it == impl_->peers.end()) return;
    // Its moves in flight fail; a later move (the peer came back) gets a new endpoint.
    for (auto& op : impl_->active) {
      if (op->remote.peer_key == peer_key) {
        impl_->Fail(*op, it->second.get(), absl::UnavailableError("peer restarted or down"));
      }
    }
    impl_->ClosePeer(it->second.get(), "peer restarted or down");
    impl_->peers.erase(it);
    impl_->ForgetDirect(peer_key);
    absl::MutexLock lock(&impl_->mu);
    ++impl_->forgotten[peer_key];
  });
}

}  // namespace gpumove
