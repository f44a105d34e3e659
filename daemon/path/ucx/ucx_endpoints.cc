// Endpoints, one per peer incarnation, with their unpacked remote keys; forgetting a peer.
#include <ucp/api/ucp.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/path/ucx/ucx_transport_impl.h"

namespace gpumove {

uint64_t UcxTransport::Impl::Generation(const std::string& key) {
  absl::MutexLock lock(&mu);
  auto it = forgotten.find(key);
  return it == forgotten.end() ? 0 : it->second;
}

void UcxTransport::Impl::OnEndpointError(void* arg, ucp_ep_h, ucs_status_t status) {
  Peer* peer = static_cast<EndpointGuard*>(arg)->peer;
  if (peer == nullptr) return;  // Closed: its moves and calls were failed then.
  {
    absl::MutexLock lock(&peer->impl->mu);
    peer->impl->connected.erase(peer->key);
  }
  peer->failed = true;
  peer->error = absl::StrCat("peer endpoint failed: ", ucs_status_string(status));
  peer->impl->FailCalls(peer->key, absl::UnavailableError(peer->error));
}

UcxTransport::Impl::Peer* UcxTransport::Impl::GetPeer(const RemoteRange& r) {
  return GetPeer(r.peer_key, r.worker_address, r.peer_error_handling);
}

UcxTransport::Impl::Peer* UcxTransport::Impl::GetPeer(const std::string& key,
                                                      const std::string& worker_address,
                                                      bool error_handling) {
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
    // ucp_ep_create trusts the address (a malformed one aborts the process): checked here
    // too, whoever learned it.
    if (absl::Status ok = CheckAddress(worker_address); !ok.ok()) {
      slot->failed = true;
      slot->error = absl::StrCat("peer ", key, " has no usable UCX address: ", ok.message());
      return slot.get();
    }
    ucs_status_t st = ucp_ep_create(worker, &params, &slot->ep);
    if (st != UCS_OK) {
      slot->ep = nullptr;
      slot->failed = true;
      slot->error = absl::StrCat("ucp_ep_create: ", ucs_status_string(st));
    } else {
      absl::MutexLock lock(&mu);
      connected.insert(key);
    }
  }
  return slot.get();
}

void UcxTransport::Impl::ClosePeer(Peer* peer, const std::string& why) {
  {
    absl::MutexLock lock(&mu);
    connected.erase(peer->key);
  }
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

absl::StatusOr<UcxRoute> UcxTransport::Route(const RemoteRange& remote) {
  {
    absl::MutexLock lock(&impl_->routes_mu);
    auto it = impl_->routes.find(remote.peer_key);
    if (it != impl_->routes.end()) return it->second;
  }
  absl::StatusOr<UcxRoute> out = absl::UnavailableError("no endpoint");
  impl_->Call([&] {
    Impl::Peer* peer = impl_->GetPeer(remote);
    if (peer->failed || peer->ep == nullptr) {
      out = absl::UnavailableError(peer->error);
      return;
    }
    char* text = nullptr;
    size_t size = 0;
    FILE* f = open_memstream(&text, &size);
    if (f == nullptr) {
      out = absl::InternalError("open_memstream failed");
      return;
    }
    ucp_ep_print_info(peer->ep, f);
    fclose(f);
    out = ParseUcxRoute(absl::string_view(text, size));
    free(text);
    absl::MutexLock lock(&impl_->routes_mu);
    impl_->routes[remote.peer_key] = *out;
  });
  return out;
}

uint64_t UcxTransport::Generation(const std::string& peer_key) const {
  return impl_->Generation(peer_key);
}

bool UcxTransport::Connected(const std::string& peer_key) const {
  absl::MutexLock lock(&impl_->mu);
  return impl_->connected.contains(peer_key);
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
    {
      absl::MutexLock lock(&impl_->routes_mu);
      impl_->routes.erase(peer_key);
    }
    impl_->ForgetDirect(peer_key);
    absl::MutexLock lock(&impl_->mu);
    ++impl_->forgotten[peer_key];
  });
}

}  // namespace gpumove
