// Start's steps that make this node a cluster member: its descriptor for peers (the cluster
// secret, each path's part of Hello: UCX registrations, peer calls; MPI's rank), membership and remote ranges, and what it
// advertises once serving (the MPI job's ranks, heartbeats, health, the port file).
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "daemon/app/daemon.h"
#include "daemon/app/start_facts.h"
#include "daemon/peer/kinds.h"
#include "daemon/cluster/peer_auth.h"
#include "daemon/common/log.h"
#include "daemon/path/cuda_ipc/cuda_ipc_protocol.h"
#include "daemon/path/mpi/mpi_protocol.h"
#include "daemon/path/ucx/ucx_protocol.h"
#include "daemon/path/ucx/ucx_hello.h"
#include "daemon/common/status_macros.h"
#include "daemon/path/mpi/mpi_hello.h"

namespace gpumove {
namespace {

absl::Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << contents << "\n";
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

// The address peers use: `given`, or the first bound TCP address (a wildcard one by host
// name).
std::string AdvertisedAddress(const std::string& given, const std::vector<std::string>& bound) {
  std::string advertise = given;
  if (advertise.empty()) {
    for (const std::string& a : bound) {
      if (!absl::StartsWith(a, "unix:")) {
        advertise = a;
        break;
      }
    }
    if (advertise.empty()) advertise = bound.front();
    // A wildcard listen is advertised by host name.
    for (const char* any : {"0.0.0.0:", "[::]:"}) {
      if (absl::StartsWith(advertise, any)) {
        advertise = absl::StrCat(HostName(), ":", advertise.substr(strlen(any)));
      }
    }
  }
  return advertise;
}

}  // namespace

absl::Status Daemon::DescribeSelf(const DaemonOptions& options) {
  // Who we are to peers: what every node says, then each path's own part.
  self_.set_node(node_);
  self_.set_host_id(HostId());
  self_.set_incarnation(NewIncarnation());
  self_.set_version(kVersion);
  if (absl::Status st = LoadClusterSecret(options); !st.ok()) return st;
  if (ucx_ != nullptr) GPUMOVE_RETURN_IF_ERROR(RegisterWithUcx(options));
  if (mpi_ != nullptr) {
    mpi_hello_ = std::make_unique<MpiHello>(mpi_->world().rank, mpi_->world().world_id);
  }
  // The paths this node runs, each adding its own blob to Hello (and reading peers').
  for (const PathHello* hello : std::initializer_list<const PathHello*>{ucx_hello_.get(),
                                                                        mpi_hello_.get()}) {
    if (hello == nullptr) continue;
    peer::v1::PathDetails* details = self_.add_paths();
    details->set_path(std::string(hello->path()));
    details->set_details(hello->Pack());
    path_hellos_.push_back(hello);
  }
  return absl::OkStatus();
}

// With --cluster_secret_file: peer calls signed and checked with the secret, whose files
// are re-read every serve.auth_refresh.
absl::Status Daemon::LoadClusterSecret(const DaemonOptions& options) {
  if (!options.cluster_secret_file.empty()) {
    auto secret = ReadClusterSecret(options.cluster_secret_file);
    if (!secret.ok()) return secret.status();
    peer_auth_ = std::make_shared<PeerAuth>(*std::move(secret), node_, self_.incarnation(),
                                            options.peer_clock_skew);
    std::vector<std::string> files = {options.cluster_secret_file};
    if (!options.cluster_secret_accept_file.empty()) {
      files.push_back(options.cluster_secret_accept_file);
    }
    PeerAuth* auth = peer_auth_.get();
    auto watcher = WatchedFiles::Start(
        files, options.serve.auth_refresh, "cluster secret",
        [auth, files](const std::vector<std::string>& contents) -> absl::Status {
          auto signing = ParseClusterSecret(contents[0], files[0]);
          if (!signing.ok()) return signing.status();
          std::string accepted;
          if (contents.size() > 1) {
            auto a = ParseClusterSecret(contents[1], files[1], /*may_be_empty=*/true);
            if (!a.ok()) return a.status();
            accepted = *std::move(a);
          }
          auth->SetSecrets(*std::move(signing), std::move(accepted));
          return absl::OkStatus();
        });
    if (!watcher.ok()) return watcher.status();
    secret_watcher_ = *std::move(watcher);
  } else if (!options.cluster_secret_accept_file.empty()) {
    return absl::InvalidArgumentError(
        "--cluster_secret_accept_file goes with --cluster_secret_file");
  }
  return absl::OkStatus();
}

// This node's pools registered with UCX (and each lane), its part of Hello, and the UCX
// peer calls.
absl::Status Daemon::RegisterWithUcx(const DaemonOptions& options) {
  std::vector<UcxTransport*> lanes;
  for (const auto& lane : ucx_lanes_) lanes.push_back(lane.get());
  auto hello = UcxHello::Register(*ucx_, lanes, *pools_, options.ucx.peer_calls);
  if (!hello.ok()) return hello.status();
  ucx_hello_ = *std::move(hello);
  summary_.ucx = absl::StrCat(
      "RMA put/get over UCX (UCX_TLS=", ucx_->transports(), "), ", ucx_hello_->self().pools_size(),
      " pool(s) registered, host pools in ", ucx_->allocation_kind(),
      options.ucx.transport.direct ? " (peers on this host: direct copies)" : "",
      ucx_lanes_.empty() ? ""
                         : absl::StrCat(", ", ucx_lanes_.size() + 1, " lanes over the network"),
      "; device memory: ",
      ucx_->cuda_aware() ? "direct (CUDA-aware UCX)"
                         : "staged through pinned bounce buffers (UCX is not CUDA-aware)",
      options.ucx.force_staging ? "; every range peers move here staged (--ucx_force_staging)" : "",
      options.ucx.peer_calls ? "; peer calls as UCX active messages" : "; peer calls over gRPC");
  if (options.ucx.peer_calls) {
    peer_calls_ = std::make_unique<UcxPeerCalls>(ucx_.get(), self_, /*threads=*/8,
                                                 options.ucx.peer_call_poll, peer_auth_.get());
  }
  return absl::OkStatus();
}

absl::Status Daemon::JoinCluster(const DaemonOptions& options) {
  ClusterOptions cluster_options = options.cluster;
  PeerTlsOptions peer_tls = options.peer_tls;
  if (peer_tls.ca.empty() && peer_tls.cert.empty() && !options.serve.tls.client_ca.empty()) {
    peer_tls = {options.serve.tls.client_ca, options.serve.tls.cert, options.serve.tls.key,
                options.peer_tls.server_name};
  }
  if (!peer_tls.server_name.empty() && peer_tls.ca.empty()) {
    return absl::InvalidArgumentError(
        "--peer_tls_server_name needs peers over TLS (--peer_tls_ca or --tls_client_ca)");
  }
  cluster_options.tls_server_name = peer_tls.server_name;
  auto credentials = PeerChannelCredentials(peer_tls.ca, peer_tls.cert, peer_tls.key);
  if (!credentials.ok()) return credentials.status();
  cluster_options.credentials = *credentials;
  cluster_options.auth = peer_auth_;
  if (ClientsNeedCredentials(options.serve) && peer_auth_ == nullptr &&
      !cluster_options.peers.empty()) {
    return absl::InvalidArgumentError(
        "--peers on a daemon whose clients need credentials needs --cluster_secret_file too: "
        "without it any process could act as a peer, so this node takes none");
  }
  if (!options.serve.tls.cert.empty() && peer_tls.ca.empty()) {
    LOG(WARNING) << "serving TLS but dialling peers in plaintext: give --peer_tls_ca (the CA "
                    "that signed the peers' certificates) if they serve TLS too";
  }
  // Each path reads its own part of peers' Hellos, once, when it is learned.
  cluster_options.paths = path_hellos_;
  cluster_ = std::make_unique<Cluster>(cluster_options, self_);
  if (peer_calls_ != nullptr) {
    // Peer calls over UCX are served for, and answered to, met peers only, at the address
    // membership checked when it learned them.
    Cluster* cluster = cluster_.get();
    peer_calls_->Admit([cluster](const std::string& node, uint64_t incarnation,
                                 const std::string& worker_address) {
      return cluster->Matches(node, incarnation, [&](const PeerView& peer) {
        return ServesUcxCalls(peer, worker_address);
      });
    });
  }
  // Each path's part of the hold handshake (UCX's and CUDA IPC's stateless, so shared by
  // every daemon; MPI's knows this node's rank).
  static const UcxCodec ucx_codec;
  static const CudaIpcCodec cuda_ipc_codec;
  mpi_codec_ = std::make_unique<MpiCodec>(mpi_hello_.get());
  remote_ranges_ = std::make_unique<ClusterRemoteRanges>(
      cluster_.get(), options.cluster.peer_timeout, peer_calls_.get(),
      std::vector<const PathCodec*>{&ucx_codec, &cuda_ipc_codec, mpi_codec_.get()});
  return absl::OkStatus();
}

absl::Status Daemon::Advertise(const DaemonOptions& options) {
  const std::string advertise = AdvertisedAddress(options.advertise, addresses_);
  cluster_->SetAdvertisedAddress(advertise);
  auto mpi_nodes = MeetMpiRanks(advertise);
  if (!mpi_nodes.ok()) return mpi_nodes.status();
  StartMembership(*mpi_nodes);
  // The server as a whole ("") and each public service by name, for probes that ask for
  // one (all turn NOT_SERVING together when the daemon drains).
  for (const char* service :
       {"gpumove.v1.BufferService", "gpumove.v1.TransferService", "gpumove.v1.NodeService"}) {
    server_->GetHealthCheckService()->SetServingStatus(service, true);
  }
  server_->GetHealthCheckService()->SetServingStatus(true);
  LOG(INFO) << "gpumoved " << kVersion << " serving node " << node_ << " on "
            << absl::StrJoin(addresses_, ", ");
  if (!options.serve.port_file.empty()) {
    return WriteFileAtomically(options.serve.port_file, addresses_.front());
  }
  return absl::OkStatus();
}

// As an MPI rank: every rank's name and address, gathered once; the others are our peers.
absl::StatusOr<std::vector<std::string>> Daemon::MeetMpiRanks(const std::string& advertise) {
  std::vector<std::string> mpi_nodes;
  if (mpi_ == nullptr) return mpi_nodes;
  auto all = mpi_->Allgather(absl::StrCat(node_, "\n", advertise));
  if (!all.ok()) return all.status();
  std::vector<std::string> peers;
  for (int r = 0; r < static_cast<int>(all->size()); ++r) {
    std::pair<std::string, std::string> entry = absl::StrSplit((*all)[r], '\n');
    if (r != mpi_->world().rank) {
      if (entry.first == node_) {
        return absl::InvalidArgumentError(absl::StrCat("ranks ", r, " and ", mpi_->world().rank,
                                                       " are both named ", node_,
                                                       " (use %r in --node)"));
      }
      peers.push_back(entry.second);
    }
    mpi_nodes.push_back(entry.first);
  }
  cluster_->AddPeers(peers);
  LOG(INFO) << "MPI job: " << absl::StrJoin(mpi_nodes, ", ");
  return mpi_nodes;
}

// Heartbeats start; a node seen down drops what this node keeps for it (`mpi_nodes`: each
// MPI rank's node, by rank).
void Daemon::StartMembership(const std::vector<std::string>& mpi_nodes) {
  HoldTable* holds = holds_.get();
  std::vector<UcxTransport*> ucx_transports;
  if (ucx_ != nullptr) ucx_transports.push_back(ucx_.get());
  for (const auto& lane : ucx_lanes_) ucx_transports.push_back(lane.get());
  MpiTransport* mpi_transport = mpi_.get();
  CudaIpcEngine* cuda_ipc = cuda_ipc_engine_.get();
  cluster_->Start([holds, ucx_transports, mpi_transport, mpi_nodes, cuda_ipc](
                      const std::string& node, uint64_t incarnation) {
    if (cuda_ipc != nullptr) cuda_ipc->Forget(node, incarnation);
    // Wake this node's MPI operations with that rank before dropping what they use.
    for (int r = 0; r < static_cast<int>(mpi_nodes.size()); ++r) {
      if (mpi_nodes[r] == node) mpi_transport->FailPeer(r, absl::StrCat("node ", node, " is down"));
    }
    holds->ReleaseFrom(node, incarnation);
    for (UcxTransport* t : ucx_transports) t->Forget(PeerId{node, incarnation}.Key());
  });
}

}  // namespace gpumove
