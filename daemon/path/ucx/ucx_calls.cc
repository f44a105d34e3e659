// The active-message call channel: requests and replies between nodes (peer calls).
#include <ucp/api/ucp.h>

#include <cstring>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "daemon/common/log.h"
#include "daemon/path/ucx/ucx_transport_impl.h"

namespace gpumove {

using ucx_internal::CallReplyHeader;
using ucx_internal::CallRequestHeader;
using ucx_internal::kCallMagic;
using ucx_internal::kCallReplyAm;
using ucx_internal::kCallRequestAm;
using ucx_internal::UcxError;

void UcxTransport::Impl::FinishCall(uint64_t id, absl::Status status, std::string body) {
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

void UcxTransport::Impl::FailCalls(const std::string& peer_key, const absl::Status& status) {
  std::vector<uint64_t> ids;
  {
    absl::MutexLock lock(&calls_mu);
    for (const auto& [id, call] : calls) {
      if (peer_key.empty() || call->peer_key == peer_key) ids.push_back(id);
    }
  }
  for (uint64_t id : ids) FinishCall(id, status);
}

void UcxTransport::Impl::OnSent(void* request, ucs_status_t status, void* user_data) {
  auto* out = static_cast<Outgoing*>(user_data);
  if (status != UCS_OK && out->call_id != 0) {
    out->impl->FinishCall(out->call_id, UcxError(status, "sending a peer call"));
  }
  ucp_request_free(request);
  delete out;
}

void UcxTransport::Impl::SendAm(Peer* peer, unsigned id, std::unique_ptr<Outgoing> out) {
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

void UcxTransport::Impl::SendReply(const UcxPeer& to, uint64_t id, const absl::Status& status,
                                   std::string body) {
  // The handler vouched for `to` (an authenticated, known peer); the address is checked
  // still before an endpoint is made from it, and a bad one gets no endpoint slot.
  Peer* peer = nullptr;
  if (auto it = peers.find(to.key); it != peers.end()) {
    peer = it->second.get();
  } else if (absl::Status ok = CheckAddress(to.worker_address); !ok.ok()) {
    calls_dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  } else {
    peer = GetPeer(to.key, to.worker_address, to.error_handling);
  }
  if (peer->failed || peer->ep == nullptr) return;  // The caller times out or is forgotten.
  auto out = std::make_unique<Outgoing>();
  CallReplyHeader h{kCallMagic, static_cast<int32_t>(status.code()), id};
  out->header.assign(reinterpret_cast<const char*>(&h), sizeof(h));
  out->body = status.ok() ? std::move(body) : std::string(status.message());
  SendAm(peer, kCallReplyAm, std::move(out));
}

ucs_status_t UcxTransport::Impl::OnCallRequest(void* arg, const void* header, size_t header_length,
                                               void* data, size_t length,
                                               const ucp_am_recv_param_t* param) {
  auto* impl = static_cast<Impl*>(arg);
  // Nothing here answers or makes an endpoint: the handler decides whether the caller is
  // one to answer. What is dropped is only counted (a flood must not flood the log too).
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {  // Eager only.
    impl->calls_dropped.fetch_add(1, std::memory_order_relaxed);
    return UCS_ERR_UNSUPPORTED;
  }
  CallRequestHeader h;
  if (header_length < sizeof(h)) {
    impl->calls_dropped.fetch_add(1, std::memory_order_relaxed);
    return UCS_OK;
  }
  memcpy(&h, header, sizeof(h));
  if (h.magic != kCallMagic || h.key_length == 0 || h.key_length > kMaxUcxPeerKey ||
      h.address_length == 0 || h.address_length > kMaxUcxWorkerAddress ||
      header_length != sizeof(h) + uint64_t{h.key_length} + h.address_length ||
      impl->handler == nullptr) {
    impl->calls_dropped.fetch_add(1, std::memory_order_relaxed);
    return UCS_OK;
  }
  const char* extra = static_cast<const char*>(header) + sizeof(h);
  UcxPeer caller{std::string(extra, h.key_length),
                 std::string(extra + h.key_length, h.address_length), h.error_handling != 0};
  const uint64_t id = h.call_id;
  const absl::Time received = impl->trace_calls ? absl::Now() : absl::InfinitePast();
  impl->calls_open.fetch_add(1);
  // The reply (if the handler ever answers) goes to the caller as it claimed itself, which
  // the handler has checked by then; a call it drops is let go here.
  class Open {
   public:
    explicit Open(Impl* impl) : impl_(impl) {}
    ~Open() {
      if (!answered) impl_->calls_open.fetch_sub(1);
    }
    bool answered = false;

   private:
    Impl* const impl_;
  };
  auto open = std::make_shared<Open>(impl);
  UcxReply reply = [impl, caller, id, method = h.method, received, open](
                       const absl::Status& status, std::string body) {
    open->answered = true;
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
  impl->handler(caller, h.method, std::string(static_cast<const char*>(data), length),
                std::move(reply));
  return UCS_OK;
}

ucs_status_t UcxTransport::Impl::OnCallReply(void* arg, const void* header, size_t header_length,
                                             void* data, size_t length,
                                             const ucp_am_recv_param_t* param) {
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

uint64_t UcxTransport::calls_dropped() const {
  return impl_->calls_dropped.load(std::memory_order_relaxed);
}

absl::Status UcxTransport::Impl::CheckAddress(const std::string& address) const {
  return CheckUcxWorkerAddress(address, shape_known ? &shape : nullptr);
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

}  // namespace gpumove
