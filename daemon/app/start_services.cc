// Start's steps that make the transfer scheduler and the services on it: who may call
// (the authenticator), the public API (buffers, transfers, open-call limits) and the peer
// protocol.
#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/app/daemon.h"
#include "daemon/app/start_facts.h"
#include "daemon/common/log.h"

namespace gpumove {
namespace {

// Who may call, as the options say it, checked before anything answers: no open daemon
// beyond this host unless asked, and each kind of principal with the credentials it needs.
absl::Status CheckCallers(const ServeOptions& serve) {
  if (!ClientsNeedCredentials(serve) && !serve.allow_insecure) {
    for (const std::string& a : serve.listen) {
      if (!OnThisHostOnly(a)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "refusing to listen on ", a,
            " with no credentials (anyone who reaches it could use "
            "every buffer): give --auth_tokens or --tls_client_ca, listen on loopback, or "
            "--allow_insecure"));
      }
    }
  }
  if (!serve.client_cert_principals.empty() && serve.tls.client_ca.empty()) {
    return absl::InvalidArgumentError(
        "--client_cert_principals needs --tls_client_ca (client certificates to look up)");
  }
  if (!serve.unix_socket_principals.empty() &&
      std::none_of(serve.listen.begin(), serve.listen.end(),
                   [](const std::string& a) { return absl::StartsWith(a, "unix:"); })) {
    return absl::InvalidArgumentError(
        "--unix_socket_principals needs a unix socket to listen on (--listen=unix:/path)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Daemon::MakeScheduler(const DaemonOptions& options) {
  SchedulerOptions sched = options.scheduler;
  sched.node = node_;
  sched.quotas = quotas_.get();
  sched.notifications = notifications_.get();
  if (!options.serve.tenant_weights.empty()) {
    weights_ = std::make_unique<TenantWeights>();
    TenantWeights* weights = weights_.get();
    auto watcher = WatchedFiles::StartParsed(
        options.serve.tenant_weights, options.serve.auth_refresh, "tenant weights file",
        ParseTenantWeights, [weights](absl::flat_hash_map<std::string, uint32_t> parsed) {
          weights->Set(std::move(parsed));
        });
    if (!watcher.ok()) return watcher.status();
    weights_watcher_ = *std::move(watcher);
    sched.weights = weights_.get();
  }
  GpuRuntime* gpu = gpu_.get();
  sched.piece_hasher = [gpu](const Endpoint& e, const Segments& pieces, bool source) {
    return HashPieces(gpu, e, pieces, source);
  };
  if (!gpu->devices().empty()) {
    sched.stage_pieces = [gpu](const std::shared_ptr<const Segments>& pieces) {
      gpu->StagePieces(pieces, pieces->list.data(), pieces->list.size());
    };
  }
  if (metrics_ != nullptr) {
    Metrics* metrics = metrics_.get();
    sched.on_end = [metrics](const TransferEnd& t) { metrics->OnTransferEnd(t); };
  }
  scheduler_ = std::make_unique<TransferScheduler>(sched, registry_.get(), engines_, hasher_,
                                                   remote_ranges_.get());
  if (metrics_ != nullptr) {
    TransferScheduler* scheduler = scheduler_.get();
    metrics_->AddGauge("transfers_active", "Transfers queued or running that this node runs.",
                       [scheduler] { return static_cast<double>(scheduler->active()); });
  }
  return absl::OkStatus();
}

absl::Status Daemon::MakeServices(const DaemonOptions& options) {
  if (absl::Status st = CheckCallers(options.serve); !st.ok()) return st;
  if (absl::Status st = MakeAuthenticator(options); !st.ok()) return st;
  buffer_service_ = std::make_unique<BufferServiceImpl>(auth_.get(), registry_.get(), gpu_.get(),
                                                        node_, cluster_.get(), ipc_.get());
  buffer_service_->set_file_roots(file_roots_.get());
  prepared_ = std::make_unique<PreparedPieceLists>(node_, options.prepared);
  if (metrics_ != nullptr) {
    PreparedPieceLists* prepared = prepared_.get();
    metrics_->AddGauge("prepared_piece_lists", "Prepared piece lists kept, over every tenant.",
                       [prepared] { return static_cast<double>(prepared->lists()); });
    metrics_->AddGauge("prepared_pieces", "Pieces of the prepared piece lists kept.",
                       [prepared] { return static_cast<double>(prepared->pieces()); });
  }
  transfer_service_ = std::make_unique<TransferServiceImpl>(
      auth_.get(), scheduler_.get(), cluster_.get(), node_, notifications_.get(), prepared_.get());
  long_calls_ = std::make_unique<LongCalls>(options.call_limits);
  buffer_service_->set_long_calls(long_calls_.get());
  transfer_service_->set_long_calls(long_calls_.get());
  transfer_service_->set_buffers(registry_.get());
  if (metrics_ != nullptr) {
    LongCalls* calls = long_calls_.get();
    metrics_->AddGauge("open_calls",
                       "Streams and waits open (Read, Write, Watch, Notifications, Wait, and "
                       "Submit or Cancel with wait), served without a thread each.",
                       [calls] { return static_cast<double>(calls->open()); });
    metrics_->AddTotal("calls_refused_total",
                       "Streams and waits refused RESOURCE_EXHAUSTED at a cap "
                       "(--max_open_calls, --max_open_calls_per_principal).",
                       [calls] { return calls->refused(); });
  }
  MakePeerService(options);
  return absl::OkStatus();
}

// The public services' authenticator: open, or tokens, client certificates and unix
// socket uids as principals.
absl::Status Daemon::MakeAuthenticator(const DaemonOptions& options) {
  if (options.serve.auth_tokens.empty() && options.serve.client_cert_principals.empty() &&
      options.serve.unix_socket_principals.empty()) {
    auth_ = Authenticator::Open();
    LOG(WARNING) << "open daemon: no --auth_tokens, --client_cert_principals or "
                    "--unix_socket_principals, so every caller is anonymous and may use every "
                    "buffer";
  } else {
    AuthSources sources;
    sources.tokens = options.serve.auth_tokens;
    sources.certificates = options.serve.client_cert_principals;
    sources.unix_users = options.serve.unix_socket_principals;
    sources.refresh = options.serve.auth_refresh;
    auto auth = Authenticator::Create(sources, peer_auth_.get());
    if (!auth.ok()) return auth.status();
    auth_ = *std::move(auth);
    LOG(INFO) << "callers are checked by " << auth_->Describe();
  }
  return absl::OkStatus();
}

// The peer protocol's handler, its gRPC adapter, and the UCX one served.
void Daemon::MakePeerService(const DaemonOptions& options) {
  peer_handler_ =
      std::make_unique<PeerHandler>(cluster_.get(), holds_.get(), holders_, &path_calls_);
  const bool no_peers = ClientsNeedCredentials(options.serve) && peer_auth_ == nullptr;
  peer_service_ = std::make_unique<PeerServiceImpl>(peer_handler_.get(), peer_auth_.get(),
                                                    /*closed=*/no_peers);
  if (peer_auth_ != nullptr) {
    LOG(INFO) << "peer calls are authenticated with the cluster secret in "
              << options.cluster_secret_file;
  } else if (no_peers) {
    LOG(INFO) << "no --cluster_secret_file: this node takes no peers";
  } else {
    LOG(WARNING) << "peer calls are not authenticated (no --cluster_secret_file): any process "
                    "that reaches this port may act as a peer";
  }
  // Before the gRPC server starts: a peer that hears of us may call at once.
  if (peer_calls_ != nullptr && !no_peers) {
    peer_calls_->Serve(peer_handler_.get());
  }
}

}  // namespace gpumove
