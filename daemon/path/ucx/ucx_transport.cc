// UcxTransport: making the context and worker, process-wide UCX settings, teardown.
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "daemon/path/ucx/ucx_transport_impl.h"

namespace gpumove {

using ucx_internal::kCallReplyAm;
using ucx_internal::kCallRequestAm;
using ucx_internal::UcxError;

UcxTransport::UcxTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::Create(UcxOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return UcxError(st, "ucp_config_read");
  if (!options.net_devices.empty() &&
      (options.net_devices_win || std::getenv("UCX_NET_DEVICES") == nullptr)) {
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
  // Peers' addresses are checked against this node's own packing before UCX sees them; a
  // packing the check does not know (UCX_UNIFIED_MODE, a newer UCX) leaves only the
  // format check.
  impl->shape_known = impl->shape.Learn(address).ok();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw, setup = options.thread_setup] {
    if (setup) setup();
    raw->Loop();
  });
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
  // UCX's UD transports abort the process when a UD endpoint times out (an assertion in
  // ucp_request.c, seen over Soft-RoCE with UCX 1.13: a peer gone takes this daemon with
  // it). RC or TCP serve every path where UD would: UD is left out unless the operator
  // names the transports.
  // Only where there are RDMA devices (elsewhere UD cannot run, and naming it would make
  // UCX warn that it is not available at every start).
  SetTransportDefault(HasRdmaDevices());
}

bool UcxTransport::HasRdmaDevices() {
  std::error_code ec;
  std::filesystem::directory_iterator it("/sys/class/infiniband", ec);
  return !ec && it != std::filesystem::directory_iterator();
}

void UcxTransport::SetTransportDefault(bool rdma_devices) {
  const char* tls = std::getenv("UCX_TLS");
  if (tls == nullptr || *tls == '\0') {
    if (rdma_devices) setenv("UCX_TLS", kDefaultUcxTransports, 1);
  } else if (rdma_devices && MayUseUd(tls)) {
    LOG(WARNING) << "UCX_TLS=" << tls << " lets UCX use UD (ud_verbs / ud_mlx5), whose endpoint "
                 << "timeouts abort UCX 1.13 and with it this daemon; the default leaves it out ("
                 << kDefaultUcxTransports << ")";
  }
}

bool UcxTransport::MayUseUd(absl::string_view tls) {
  if (absl::StartsWith(tls, "^")) {  // All but those named.
    for (absl::string_view t : absl::StrSplit(tls.substr(1), ',')) {
      if (t == "ud") return false;
    }
    return true;
  }
  for (absl::string_view t : absl::StrSplit(tls, ',')) {
    if (t == "all" || t == "ib" || absl::StartsWith(t, "ud")) return true;
  }
  return false;
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
  const std::string named = tls != nullptr && *tls != '\0' ? tls : "all";
  if (named == kDefaultUcxTransports) return absl::StrCat(named, ": all but UD, the default");
  return MayUseUd(named) && HasRdmaDevices()
             ? absl::StrCat(named, ", UD allowed: a UD timeout aborts UCX 1.13")
             : named;
}

}  // namespace gpumove
