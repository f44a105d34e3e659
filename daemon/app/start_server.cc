// Start's steps that bind the sockets (answering NOT_SERVING while the daemon starts) and
// that serves the public API and the peer protocol over gRPC: reflection and
// channelz, the server's limits, TLS on the TCP ports, the listeners and NodeService's facts.
#include <grpcpp/ext/channelz_service_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/app/daemon.h"
#include "daemon/app/start_facts.h"
#include "daemon/common/log.h"
#include "daemon/common/quote.h"
#include "daemon/topology/topology.h"

namespace gpumove {
namespace {

// The server's message size, connection lifetimes and keepalives, and its threads.
absl::Status ConfigureServer(const ServeOptions& serve, grpc::ServerBuilder& builder) {
  constexpr uint64_t kMinMessage = 8 << 20, kMaxMessage = uint64_t{1} << 30;
  if (serve.max_message_size < kMinMessage || serve.max_message_size > kMaxMessage) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_message_size must be between 8MiB (a read stream's largest chunk and more) and "
        "1GiB, not ",
        serve.max_message_size));
  }
  builder.SetMaxReceiveMessageSize(static_cast<int>(serve.max_message_size));
  builder.SetMaxSendMessageSize(static_cast<int>(serve.max_message_size));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  auto ms = [](absl::Duration d) {
    return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 1, INT32_MAX));
  };
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, ms(serve.handshake_timeout));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, ms(serve.max_connection_idle));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, ms(serve.keepalive));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  // gRPC's own unless set (more waiting threads measured no faster: docs/reliability.md).
  if (serve.completion_queues > 0) {
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS,
                                serve.completion_queues);
  }
  if (serve.min_pollers > 0) {
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS,
                                serve.min_pollers);
  }
  if (serve.max_pollers > 0) {
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS,
                                serve.max_pollers);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Daemon::Listen(const DaemonOptions& options) {
  auto tcp = TcpCredentials(options.serve);
  if (!tcp.ok()) return tcp.status();
  tcp_credentials_ = *std::move(tcp);
  ListenOptions listen;
  listen.addresses = options.serve.listen;
  listen.unix_socket_mode = options.serve.unix_socket_mode;
  listen.unix_socket_group = options.serve.unix_socket_group;
  listen.unix_uids = !options.serve.unix_socket_principals.empty();
  auto listeners = Listeners::Bind(listen);
  if (!listeners.ok()) return listeners.status();
  listeners_ = *std::move(listeners);
  auto starting = StartingServer::Start(*listeners_, tcp_credentials_);
  if (!starting.ok()) return starting.status();
  starting_ = *std::move(starting);
  LOG(INFO) << "listening on " << absl::StrJoin(listeners_->bound(), ", ")
            << "; health NOT_SERVING until started";
  return absl::OkStatus();
}

absl::Status Daemon::Serve(const DaemonOptions& options) {
  grpc::EnableDefaultHealthCheckService(true);
  if (absl::Status st = EnableIntrospection(options.serve); !st.ok()) return st;
  grpc::ServerBuilder builder;
  if (absl::Status st = ConfigureServer(options.serve, builder); !st.ok()) return st;
  // The sockets move from the starting server to this one (connections wait in the
  // backlog meanwhile); the starting server's own connections reconnect here.
  listeners_->Pause();
  listeners_->Register(builder, tcp_credentials_);
  NodeFacts facts = Facts(options.serve);
  // The bound addresses are known only after BuildAndStart; the node service gets them then.
  builder.RegisterService(buffer_service_.get());
  builder.RegisterService(transfer_service_.get());
  builder.RegisterService(peer_service_.get());
  node_service_ = std::make_unique<NodeServiceImpl>(auth_.get(), facts);
  builder.RegisterService(node_service_.get());
  // Reflection, and the answer to methods the server does not have.
  if (reflection_ != nullptr) builder.RegisterCallbackGenericService(reflection_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", absl::StrJoin(options.serve.listen, ", ")));
  }
  listeners_->Start();
  starting_->Stop();
  starting_.reset();
  addresses_ = listeners_->bound();
  facts.listen = addresses_;
  if (metrics_ != nullptr) facts.metrics_address = metrics_->address();
  node_service_->UpdateFacts(facts);
  return absl::OkStatus();
}

// Server reflection (daemon/server/reflection.h) and channelz, as --introspection says.
absl::Status Daemon::EnableIntrospection(const ServeOptions& serve) {
  const std::string& introspection = serve.introspection;
  if (introspection != "on" && introspection != "off" && introspection != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("--introspection must be on, off or auto, not ", Quoted(introspection)));
  }
  if (introspection != "off") {
    // Reflection describes the public API only, to callers who may read it.
    auto reflection = Reflection::Make(
        {"gpumove.v1.BufferService", "gpumove.v1.TransferService", "gpumove.v1.NodeService",
         "grpc.reflection.v1.ServerReflection"},
        [auth = auth_.get()](grpc::CallbackServerContext* context) {
          auto caller = auth->Check(context, Access::kRead, "ServerReflection");
          return caller.ok() ? grpc::Status::OK : ToGrpcStatus(caller.status());
        });
    if (!reflection.ok()) return reflection.status();
    reflection_ = *std::move(reflection);
  }
  if (introspection == "on" || (introspection == "auto" && !ClientsNeedCredentials(serve))) {
    // Channelz has no credentials check of its own (and lists every client's address):
    // only where every caller may do anything anyway, or where the operator asks for it.
    grpc::channelz::experimental::InitChannelzService();
    channelz_ = true;
  }
  LOG(INFO) << "server reflection: "
            << (reflection_ == nullptr ? "off"
                : ClientsNeedCredentials(serve) ? "served to callers with credentials"
                                                : "served")
            << "; channelz: "
            << (channelz_ ? "served" : "off (callers need credentials; --introspection=on)");
  return absl::OkStatus();
}

// The TCP ports' credentials: TLS when a certificate or client CA is given, else none.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Daemon::TcpCredentials(
    const ServeOptions& serve) {
  std::shared_ptr<grpc::ServerCredentials> tcp = grpc::InsecureServerCredentials();
  if (!serve.tls.cert.empty() || !serve.tls.key.empty() || !serve.tls.client_ca.empty()) {
    auto tls = TlsFiles::Start(serve.tls);
    if (!tls.ok()) return tls.status();
    tls_ = *std::move(tls);
    tcp = tls_->credentials();
    LOG(INFO) << "TLS on the TCP ports ("
              << (serve.tls.client_ca.empty() ? "no client certificates"
                                              : "client certificates required")
              << "), certificates re-read when " << serve.tls.cert << " changes";
  }
  return tcp;
}

// What NodeService tells of this node, but for the addresses bound (known once serving).
NodeFacts Daemon::Facts(const ServeOptions& serve) const {
  NodeFacts facts{node_,
                  HostName(),
                  {},
                  absl::Now(),
                  gpu_.get(),
                  pools_.get(),
                  scheduler_.get(),
                  engines_,
                  cluster_.get(),
                  summary_.ucx,
                  ucx_ != nullptr && ucx_->cuda_aware(),
                  {},
                  summary_.mpi,
                  mpi_ != nullptr && mpi_->world().cuda_aware,
                  summary_.ipc,
                  gpus_};
  facts.tls = tls_ != nullptr;
  facts.file_status = summary_.file;
  facts.tls_client_certificates = tls_ != nullptr && !serve.tls.client_ca.empty();
  if (auto topology = ReadTopology("/sys"); topology.ok()) {
    facts.gpu_nic_topology = DescribeTopology(*topology);
    facts.gpu_nic_topology.push_back(
        GpuDirectRdmaReadiness(*topology, ucx_ != nullptr && ucx_->cuda_aware()));
  } else {
    facts.gpu_nic_topology = {absl::StrCat("no GPU-NIC map: ", topology.status().message())};
  }
  facts.peer_authentication = peer_auth_ != nullptr           ? "cluster secret"
                              : ClientsNeedCredentials(serve) ? "none"
                                                              : "open";
  return facts;
}

}  // namespace gpumove
