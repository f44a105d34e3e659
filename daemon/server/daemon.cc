#include "daemon/server/daemon.h"

#include <grpcpp/ext/channelz_service_plugin.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "daemon/common/bytes.h"
#include "daemon/common/host_copy.h"
#include "daemon/common/log.h"
#include "daemon/common/quote.h"
#include "daemon/common/thread_pool.h"
#include "daemon/path/ucx/ucx_wire_check.h"
#include "daemon/server/convert.h"

namespace gpumove {
namespace {

// Whether callers of the public services need credentials (tokens or client
// certificates): such a daemon is not open, and takes peers only with a cluster secret.
bool ClientsNeedCredentials(const ServeOptions& serve) {
  return !serve.auth_tokens.empty() || !serve.tls.client_ca.empty() ||
         !serve.unix_socket_principals.empty();
}

// Whether a --listen address is reachable from this host only (loopback, a unix socket).
bool OnThisHostOnly(const std::string& a) {
  return absl::StartsWith(a, "unix:") || absl::StartsWith(a, "127.") ||
         absl::StartsWith(a, "[::1]:") || absl::StartsWith(a, "localhost:");
}

// The network devices UCX may use (UcxOptions::net_devices) for `setting` and the
// addresses gRPC listens on.
std::string UcxNetDevices(const std::string& setting, const std::vector<std::string>& listen) {
  if (setting != "auto") return setting;
  for (const std::string& a : listen) {
    if (!OnThisHostOnly(a)) return "";
  }
  return "lo";
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

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

}  // namespace

absl::StatusOr<std::vector<int>> SelectGpus(const std::string& spec,
                                            const std::vector<GpuDevice>& devices) {
  std::vector<int> out;
  if (spec == "none") return out;
  if (spec.empty() || spec == "all") {
    for (const GpuDevice& d : devices) out.push_back(d.index);
    return out;
  }
  for (absl::string_view raw : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    const absl::string_view item = absl::StripAsciiWhitespace(raw);
    // An index, or a UUID as nvidia-smi -L prints it, whole or a prefix naming one GPU.
    std::vector<int> found;
    for (const GpuDevice& d : devices) {
      int n = 0;
      if ((absl::SimpleAtoi(item, &n) && n == d.index) ||
          (absl::StartsWith(item, "GPU-") && item.size() > 4 && absl::StartsWith(d.uuid, item))) {
        found.push_back(d.index);
      }
    }
    if (found.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--gpus: no GPU \"", item, "\" on this node (",
                                                     devices.size(), " present)"));
    }
    if (found.size() > 1) {
      return absl::InvalidArgumentError(absl::StrCat("--gpus: \"", item, "\" names ", found.size(),
                                                     " GPUs (GPU ", absl::StrJoin(found, ", GPU "),
                                                     "): give more of the UUID"));
    }
    const int index = found[0];
    if (std::find(out.begin(), out.end(), index) == out.end()) out.push_back(index);
  }
  return out;
}

DaemonOptions WithMachineDefaults(DaemonOptions o, unsigned cpus) {
  // A large machine (16 CPUs or more) has CPUs to spare for polling; on a small one a
  // thread that polls takes the CPU from the threads doing the work.
  const bool large = cpus >= 16;
  const int n = static_cast<int>(std::max(1u, cpus));
  const absl::Duration zero = absl::ZeroDuration();
  // An idle pool thread looks for its next piece this long before it sleeps.
  if (o.pool_spin < zero) o.pool_spin = large ? absl::Milliseconds(1) : zero;
  UcxOptions& ucx = o.ucx.transport;
  ucx.poll_window = std::max(ucx.poll_window, zero);
  // Threads serving peer calls poll a fifth as long on a small machine: long enough for
  // the acknowledgement of a small move to find one awake, short enough not to take the
  // CPU from a long move (TCP on 2 CPUs lost half its speed at 1 ms).
  if (o.ucx.peer_call_poll < zero) {
    o.ucx.peer_call_poll = large ? ucx.poll_window : ucx.poll_window / 5;
  }
  if (ucx.call_awake < zero) ucx.call_awake = large ? absl::Milliseconds(10) : zero;
  if (ucx.direct_threads <= 0) ucx.direct_threads = std::clamp(n / 4, 1, 8);
  // Piece copies: as many threads as LOCAL's host piece copies (the CPUs, at most 8).
  if (ucx.piece_threads <= 0) ucx.piece_threads = std::clamp(n, 1, 8);
  // Lanes carry host moves over the wire only: direct copies stay with the first.
  if (o.ucx.lanes <= 0) o.ucx.lanes = std::clamp(n / 8, 1, 4);
  if (!o.mpi.spin.has_value()) o.mpi.spin = large;
  if (o.serve.max_pollers > 0) {
    o.serve.max_pollers = std::max(o.serve.max_pollers, o.serve.min_pollers);
  }
  o.mpi.transport.spin = *o.mpi.spin;
  return o;
}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(DaemonOptions options) {
  options = WithMachineDefaults(std::move(options), std::thread::hardware_concurrency());
  std::unique_ptr<Daemon> d(new Daemon());
  SetPoolIdleSpin(options.pool_spin);
  // Each step makes one part from its options and the parts made before it.
  if (absl::Status st = d->JoinMpiJob(options); !st.ok()) return st;  // May name this node.
  for (auto step :
       {&Daemon::FindGpus, &Daemon::StartUcx, &Daemon::MakePools, &Daemon::ShareDevicePools,
        &Daemon::MakeRegistry, &Daemon::DescribeSelf, &Daemon::JoinCluster, &Daemon::MakeEngines,
        &Daemon::StartMetrics, &Daemon::MakeScheduler, &Daemon::MakeServices, &Daemon::Serve,
        &Daemon::Advertise}) {
    if (absl::Status st = (d.get()->*step)(options); !st.ok()) return st;
  }
  return d;
}

// MPI first: as a rank, the job decides our name, address and peers.
absl::Status Daemon::JoinMpiJob(DaemonOptions& options) {
  summary_.mpi = "not an MPI rank (start the daemons with mpirun, or --mpi=on)";
  const std::string& mode = options.mpi.mode;
  if (mode == "on" || (mode == "auto" && MpiTransport::LaunchedByMpi())) {
    MpiOptions mpi_options = options.mpi.transport;
    mpi_options.op_timeout = std::max(absl::Seconds(30), options.cluster.peer_timeout * 4);
    auto mpi = MpiTransport::Start(mpi_options);
    if (!mpi.ok()) {
      if (mode == "on") return mpi.status();
      summary_.mpi = absl::StrCat("MPI did not start: ", mpi.status().message());
      LOG(WARNING) << summary_.mpi;
    } else {
      mpi_ = *std::move(mpi);
      const MpiWorld& w = mpi_->world();
      const std::string rank = absl::StrCat(w.rank);
      options.node = options.node.empty() ? absl::StrCat("rank", rank)
                                          : absl::StrReplaceAll(options.node, {{"%r", rank}});
      options.serve.port_file = absl::StrReplaceAll(options.serve.port_file, {{"%r", rank}});
      if (!options.serve.listen_given) {
        options.serve.listen = {absl::StrCat("127.0.0.1:", 7470 + w.local_rank)};
      }
      summary_.mpi = absl::StrCat(
          "two-sided MPI_Isend/MPI_Irecv, rank ", w.rank, " of ", w.size, " (", w.library,
          "); device memory: ",
          !w.cuda_aware ? "staged through pinned bounce buffers (MPI is not CUDA-aware: "
          : options.mpi.engine.force_staging
              ? "staged through pinned bounce buffers (--mpi_force_staging; MPI is CUDA-aware: "
              : "direct (CUDA-aware MPI: ",
          w.cuda_awareness, ")",
          mpi_options.spin ? "; MPI thread and waiters poll (--mpi_spin)" : "");
      LOG(INFO) << "MPI rank " << w.rank << " of " << w.size << " (" << w.local_rank
                << " on this host): " << w.library << "; " << w.cuda_awareness;
    }
  } else if (mode == "off") {
    summary_.mpi = "disabled (--mpi=off)";
  }
  return absl::OkStatus();
}

absl::Status Daemon::FindGpus(const DaemonOptions& options) {
  node_ = options.node.empty() ? HostName() : options.node;
  gpu_ = GpuRuntime::Create();
  LOG(INFO) << "node " << node_ << ": " << gpu_->status();
  auto gpus = SelectGpus(options.gpus, gpu_->devices());
  if (!gpus.ok()) return gpus.status();
  gpus_ = *std::move(gpus);
  return absl::OkStatus();
}

std::function<void()> Daemon::UcxThreadSetup() const {
  GpuRuntime* gpu = gpu_.get();
  if (gpu == nullptr || gpus_.empty()) return nullptr;
  const int device = gpus_.front();
  return [gpu, device] {
    if (absl::Status st = gpu->UseOnThisThread(device); !st.ok()) {
      LOG(WARNING) << "UCX's thread has no CUDA context (device memory will be slow): " << st;
    }
  };
}

absl::Status Daemon::StartUcx(const DaemonOptions& options) {
  // UCX before the pools: it allocates the host pools in shared memory, so that daemons on
  // this host move between them with one memcpy.
  summary_.ucx = "disabled (--noucx)";
  if (options.ucx.enabled) {
    UcxOptions ucx_options = options.ucx.transport;
    ucx_options.net_devices = UcxNetDevices(options.ucx.net_devices, options.serve.listen);
    ucx_options.op_timeout = options.cluster.peer_timeout;
    ucx_options.thread_setup = UcxThreadSetup();
    auto ucx = UcxTransport::Create(ucx_options);
    if (!ucx.ok()) {
      summary_.ucx = absl::StrCat("UCX did not start: ", ucx.status().message());
      LOG(WARNING) << summary_.ucx;
    } else {
      ucx_ = *std::move(ucx);
      if (options.ucx.shared_pools) {
        ucx_memory_ = std::make_unique<UcxHostMemory>(ucx_.get());
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Daemon::MakePools(const DaemonOptions& options) {
  auto pools = PoolSet::Create(options.pools, gpus_, gpu_.get(), ucx_memory_.get());
  if (!pools.ok()) return pools.status();
  pools_ = *std::move(pools);
  if (ucx_ != nullptr) {
    const int lanes = options.ucx.lanes;
    UcxOptions lane_options;
    lane_options.chunk = options.ucx.transport.chunk;
    lane_options.net_devices = UcxNetDevices(options.ucx.net_devices, options.serve.listen);
    lane_options.op_timeout = options.cluster.peer_timeout;
    lane_options.direct = false;
    lane_options.poll_window = options.ucx.transport.poll_window;
    lane_options.thread_setup = UcxThreadSetup();
    for (int i = 1; i < lanes; ++i) {
      auto lane = UcxTransport::Create(lane_options);
      if (!lane.ok()) {
        LOG(WARNING) << "UCX lane " << i << " did not start: " << lane.status();
        break;
      }
      ucx_lanes_.push_back(*std::move(lane));
    }
  }
  return absl::OkStatus();  // PoolSet::Create logged each pool (and a pinned one not locked).
}

absl::Status Daemon::ShareDevicePools(const DaemonOptions& options) {
  // CUDA IPC: device pools are offered to other processes on this host (clients mapping
  // exported buffers, peer daemons moving GPU to GPU).
  ipc_ = std::make_unique<IpcTable>(gpu_.get());
  summary_.ipc = "no GPU on this node";
  if (!gpu_->devices().empty()) {
    int exported = 0;
    std::string failed;
    for (const auto& pool : pools_->pools()) {
      if (pool->kind() != MemoryKind::kDevice) continue;
      absl::Status st = ipc_->Export(pool->device(), pool->base(), pool->capacity());
      if (st.ok()) {
        ++exported;
      } else {
        LOG(WARNING) << "GPU " << pool->device() << " pool not shared over CUDA IPC: " << st;
        failed = absl::StrCat(" (", st.message(), ")");
      }
    }
    summary_.ipc = absl::StrCat("GPU to GPU with daemons on this host; ", exported,
                                " device pool(s) shared; client memory import/export", failed);
  }
  return absl::OkStatus();
}

absl::Status Daemon::MakeRegistry(const DaemonOptions& options) {
  registry_ = std::make_unique<BufferRegistry>(pools_.get(), options.default_lease);
  if (!options.serve.quotas.empty()) {
    quotas_ = std::make_unique<Quotas>();
    Quotas* quotas = quotas_.get();
    const std::string path = options.serve.quotas;
    auto watcher = WatchedFiles::Start(
        {path}, options.serve.auth_refresh, "quota file",
        [quotas, path](const std::vector<std::string>& contents) {
          auto limits = ParseQuotaFile(contents[0]);
          if (!limits.ok()) {
            return absl::InvalidArgumentError(absl::StrCat(path, ": ", limits.status().message()));
          }
          quotas->Set(*std::move(limits));
          return absl::OkStatus();
        });
    if (!watcher.ok()) return watcher.status();
    quotas_watcher_ = *std::move(watcher);
    registry_->SetQuotas(quotas_.get());
  }
  GpuRuntime* gpu = gpu_.get();
  if (!gpu->devices().empty() && options.exportable_bytes_per_gpu > 0) {
    own_memory_ =
        std::make_unique<OwnDeviceMemory>(gpu, ipc_.get(), options.exportable_bytes_per_gpu);
    OwnDeviceMemory* own = own_memory_.get();
    registry_->SetOwnMemory([own](int device, uint64_t size) -> absl::StatusOr<OwnMemory> {
      auto a = own->Allocate(device, size);
      if (!a.ok()) return a.status();
      return OwnMemory{a->data, std::move(a->keepalive)};
    });
    absl::StrAppend(&summary_.ipc, "; exportable buffers up to ",
                    FormatBytes(options.exportable_bytes_per_gpu), " per GPU");
  }
  const std::string& scrub = options.scrub_memory;
  if (scrub != "auto" && scrub != "always" && scrub != "never") {
    return absl::InvalidArgumentError(
        absl::StrCat("--scrub_memory must be auto, always or never, not ", Quoted(scrub)));
  }
  // Where callers need credentials, pools are shared by tenants: a buffer must not show
  // what another tenant's left behind. (With none, every caller is the same principal.)
  if (scrub == "always" || (scrub == "auto" && ClientsNeedCredentials(options.serve))) {
    registry_->SetScrub([gpu](char* data, MemoryKind kind, int device, uint64_t size) {
      return gpu->Zero(kind == MemoryKind::kDevice ? device : kHostDevice, data, size);
    });
    LOG(INFO) << "pool memory is zeroed before it is handed out (--scrub_memory=" << scrub << ")";
  }
  registry_->StartLeaseReaper(absl::Milliseconds(100));
  hasher_ = [gpu](const Endpoint& e, uint64_t n) { return HashRange(gpu, e, n); };
  return absl::OkStatus();
}

absl::Status Daemon::DescribeSelf(const DaemonOptions& options) {
  // Who we are to peers: UCX worker address and the pools it can reach.
  self_.set_node(node_);
  self_.set_host_id(HostId());
  self_.set_incarnation(NewIncarnation());
  self_.set_version(kVersion);
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
  self_.set_mpi_rank(-1);
  if (mpi_ != nullptr) {
    self_.set_mpi_rank(mpi_->world().rank);
    self_.set_mpi_world(mpi_->world().world_id);
  }
  if (ucx_ != nullptr) {
    {
      self_.set_ucx_worker_address(ucx_->worker_address());
      self_.set_ucx_cuda_aware(ucx_->cuda_aware());
      for (const auto& pool : pools_->pools()) {
        // Device memory is only registered with a UCX that takes it.
        if (pool->kind() == MemoryKind::kDevice && !ucx_->cuda_aware()) continue;
        auto rkey = ucx_->Register(pool->base(), pool->capacity());
        if (!rkey.ok()) return rkey.status();
        peer::v1::RegisteredPool* p = self_.add_pools();
        p->set_kind(ToProto(pool->kind()));
        p->set_device(pool->device());
        p->set_base(reinterpret_cast<uint64_t>(pool->base()));
        p->set_size(pool->capacity());
        p->set_rkey(*rkey);
      }
      // Each lane registers the same pools in its own context, in the same order.
      for (const auto& lane : ucx_lanes_) {
        peer::v1::UcxLane* l = self_.add_ucx_lanes();
        l->set_worker_address(lane->worker_address());
        for (const peer::v1::RegisteredPool& p : self_.pools()) {
          auto rkey = lane->Register(reinterpret_cast<void*>(p.base()), p.size());
          if (!rkey.ok()) return rkey.status();
          l->add_rkeys(*rkey);
        }
      }
      summary_.ucx = absl::StrCat(
          "RMA put/get over UCX (UCX_TLS=", ucx_->transports(), "), ", self_.pools_size(),
          " pool(s) registered, host pools in ", ucx_->allocation_kind(),
          options.ucx.transport.direct ? " (peers on this host: direct copies)" : "",
          ucx_lanes_.empty() ? ""
                             : absl::StrCat(", ", ucx_lanes_.size() + 1, " lanes over the network"),
          "; device memory: ",
          ucx_->cuda_aware() ? "direct (CUDA-aware UCX)"
                             : "staged through pinned bounce buffers (UCX is not CUDA-aware)",
          options.ucx.force_staging ? "; every range peers move here staged (--ucx_force_staging)"
                                    : "",
          options.ucx.peer_calls ? "; peer calls as UCX active messages"
                                 : "; peer calls over gRPC");
      if (options.ucx.peer_calls) {
        self_.set_ucx_peer_calls(true);
        peer_calls_ = std::make_unique<UcxPeerCalls>(ucx_.get(), self_, /*threads=*/8,
                                                     options.ucx.peer_call_poll, peer_auth_.get());
      }
    }
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
  if (ucx_ != nullptr) {
    // A peer's UCX addresses reach ucp_ep_create, which trusts them: checked when learned.
    auto shape = std::make_shared<UcxAddressShape>();
    absl::Status learned = shape->Learn(self_.ucx_worker_address());
    for (const peer::v1::UcxLane& lane : self_.ucx_lanes()) {
      if (learned.ok()) learned = shape->Learn(lane.worker_address());
    }
    if (learned.ok()) {
      cluster_options.check = [shape](const peer::v1::NodeDescriptor& peer) {
        return CheckUcxDescriptor(peer, *shape);
      };
    } else {
      // A packing this check does not know (UCX_UNIFIED_MODE, a newer UCX): peers' would
      // not parse either.
      LOG(WARNING) << "peers' UCX addresses go unchecked: this node's own does not parse ("
                   << learned.message() << ")";
    }
  }
  cluster_ = std::make_unique<Cluster>(cluster_options, self_);
  if (peer_calls_ != nullptr) {
    // Peer calls over UCX are served for, and answered to, met peers only, at the address
    // membership checked when it learned them.
    Cluster* cluster = cluster_.get();
    peer_calls_->Admit([cluster](const std::string& node, uint64_t incarnation,
                                 const std::string& worker_address) {
      return cluster->Matches(node, incarnation, [&](const peer::v1::NodeDescriptor& d) {
        return d.ucx_peer_calls() && d.ucx_worker_address() == worker_address;
      });
    });
  }
  // Each path's part of the hold handshake (stateless, so shared by every daemon).
  static const UcxCodec ucx_codec;
  static const CudaIpcCodec cuda_ipc_codec;
  static const MpiCodec mpi_codec;
  remote_ranges_ = std::make_unique<ClusterRemoteRanges>(
      cluster_.get(), options.cluster.peer_timeout, peer_calls_.get(),
      std::vector<const PathCodec*>{&ucx_codec, &cuda_ipc_codec, &mpi_codec});
  return absl::OkStatus();
}

absl::Status Daemon::MakeEngines(const DaemonOptions& options) {
  GpuRuntime* gpu = gpu_.get();
  local_engine_ = std::make_unique<LocalEngine>(gpu);
  engines_ = {local_engine_.get()};
  if (!gpu_->devices().empty()) {
    cuda_ipc_engine_ = std::make_unique<CudaIpcEngine>(gpu, ipc_.get(), options.cuda_ipc.fence_min);
    engines_.push_back(cuda_ipc_engine_.get());
  }
  // Each path's holding side, asked for its offer on every hold peers make here.
  cuda_ipc_holder_ = std::make_unique<CudaIpcHolder>(ipc_.get(), gpu, options.cuda_ipc.fences);
  holders_ = {cuda_ipc_holder_.get()};
  if (ucx_ != nullptr) {
    Pool* pinned = pools_->Find(MemoryKind::kPinnedHost, kHostDevice);
    UcxLaneOptions lanes;
    for (const auto& lane : ucx_lanes_) lanes.lanes.push_back(lane.get());
    lanes.min_share = options.ucx.lane_share;
    ucx_engine_ = std::make_unique<UcxEngine>(ucx_.get(), gpu, pinned, remote_ranges_.get(),
                                              options.staging, std::move(lanes));
    engines_.push_back(ucx_engine_.get());
    ucx_holder_ = std::make_unique<UcxHolder>(cluster_.get());
    // This node stages its own device ranges for peers when UCX cannot take them (every
    // range with --ucx_force_staging).
    StageHolderOptions stage;
    stage.device = !ucx_->cuda_aware();
    stage.all = options.ucx.force_staging;
    stage.gpu = gpu;
    stage.pinned = pinned;
    stage.staging = options.staging;
    stage_holder_ = std::make_unique<StageHolder>(cluster_.get(), stage);
    holders_.push_back(ucx_holder_.get());
    holders_.push_back(stage_holder_.get());
  }
  if (mpi_ != nullptr) {
    mpi_engine_ = std::make_unique<MpiEngine>(mpi_.get(), gpu,
                                              pools_->Find(MemoryKind::kPinnedHost, kHostDevice),
                                              remote_ranges_.get(), options.mpi.engine);
    engines_.push_back(mpi_engine_.get());
    mpi_holder_ = std::make_unique<MpiHolder>(cluster_.get(), mpi_engine_.get());
    holders_.push_back(mpi_holder_.get());
  }
  // Fences: CUDA IPC runners' copies, waited for with or without UCX.
  notifications_ = std::make_unique<NotificationLog>(options.notification_log);
  holds_ = std::make_unique<HoldTable>(
      registry_.get(), hasher_, FencePolicy{gpu, options.cuda_ipc.fence_quiet},
      notifications_.get(), [gpu](const Endpoint& e, const Segments& pieces) {
        return HashPieces(gpu, e, pieces, /*source=*/true);
      });
  return absl::OkStatus();
}

absl::Status Daemon::StartMetrics(const DaemonOptions& options) {
  if (!options.serve.metrics_listen.empty()) {
    auto metrics = Metrics::Start(options.serve.metrics_listen, pools_.get(), cluster_.get());
    if (!metrics.ok()) return metrics.status();
    metrics_ = *std::move(metrics);
    LOG(INFO) << "metrics on http://" << metrics_->address() << "/metrics";
    if (ucx_ != nullptr) {
      UcxTransport* ucx = ucx_.get();
      metrics_->AddTotal("ucx_direct_bytes_total",
                         "Bytes of UCX moves copied directly through shared memory with "
                         "daemons on this host.",
                         [ucx] { return ucx->direct_bytes(); });
      UcxEngine* engine = ucx_engine_.get();
      metrics_->AddTotal("ucx_lane_bytes_total",
                         "Bytes of UCX moves carried by lanes besides the first.",
                         [engine] { return engine->lane_bytes(); });
    }
    metrics_->AddTotal("host_copy_streamed_bytes_total",
                       "Bytes copied between host buffers with streaming stores (big "
                       "copies, and staged pieces' copies to and from bounce slots).",
                       [] { return StreamedCopyBytes(); });
    metrics_->AddTotal("host_copy_helper_bytes_total",
                       "Bytes of host copies split over threads that helper threads copied "
                       "(see --direct_copy_threads, --staged_copy_threads).",
                       [] { return HelperCopyBytes(); });
    GpuRuntime* gpu = gpu_.get();
    metrics_->AddTotal("gpu_pieces_copied_one_by_one_total",
                       "Pieces of vectored moves with GPU memory copied one call each, no "
                       "gather kernel reaching both ends (pageable host memory, GPUs "
                       "without peer access): slow for small pieces.",
                       [gpu] { return gpu->pieces_copied_one_by_one(); });
    StageHolder* stage = stage_holder_.get();
    metrics_->AddTotal("staging_holds_deferred_total",
                       "Ranges held for staged moves while the pinned pool had no room for "
                       "their bounce slots (taken when the move ran): a pinned pool small "
                       "for the load.",
                       [stage] { return stage != nullptr ? stage->deferred() : 0; });
    if (remote_ranges_ != nullptr) remote_ranges_->set_observer(metrics_.get());

    if (peer_calls_ != nullptr) {
      UcxPeerCalls* calls = peer_calls_.get();
      metrics_->AddTotal("ucx_peer_calls_served_total",
                         "Peer calls (holds, acknowledgements, staging and MPI steps) this "
                         "node served as UCX active messages.",
                         [calls] { return calls->served(); });
      UcxTransport* ucx = ucx_.get();
      metrics_->AddTotal("ucx_peer_calls_refused_total",
                         "Active messages on the UCX call channel dropped unanswered: not "
                         "stamped with the cluster's secret, from a node this one has not "
                         "met, or malformed. Anything above zero is a misconfigured peer or "
                         "someone probing the UCX port.",
                         [calls, ucx] { return calls->refused() + ucx->calls_dropped(); });
    }
  }
  return absl::OkStatus();
}

absl::Status Daemon::MakeScheduler(const DaemonOptions& options) {
  SchedulerOptions sched = options.scheduler;
  sched.node = node_;
  sched.quotas = quotas_.get();
  sched.notifications = notifications_.get();
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
  if (!ClientsNeedCredentials(options.serve) && !options.serve.allow_insecure) {
    for (const std::string& a : options.serve.listen) {
      if (!OnThisHostOnly(a)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "refusing to listen on ", a,
            " with no credentials (anyone who reaches it could use "
            "every buffer): give --auth_tokens or --tls_client_ca, listen on loopback, or "
            "--allow_insecure"));
      }
    }
  }
  if (!options.serve.client_cert_principals.empty() && options.serve.tls.client_ca.empty()) {
    return absl::InvalidArgumentError(
        "--client_cert_principals needs --tls_client_ca (client certificates to look up)");
  }
  if (!options.serve.unix_socket_principals.empty() &&
      std::none_of(options.serve.listen.begin(), options.serve.listen.end(),
                   [](const std::string& a) { return absl::StartsWith(a, "unix:"); })) {
    return absl::InvalidArgumentError(
        "--unix_socket_principals needs a unix socket to listen on (--listen=unix:/path)");
  }
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
  buffer_service_ = std::make_unique<BufferServiceImpl>(auth_.get(), registry_.get(), gpu_.get(),
                                                        node_, cluster_.get(), ipc_.get());
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
                       "Submit or Cancel with wait), each holding a serving thread.",
                       [calls] { return static_cast<double>(calls->open()); });
    metrics_->AddTotal("calls_refused_total",
                       "Streams and waits refused RESOURCE_EXHAUSTED at a cap "
                       "(--max_open_calls, --max_open_calls_per_principal).",
                       [calls] { return calls->refused(); });
  }
  peer_handler_ = std::make_unique<PeerHandler>(cluster_.get(), holds_.get(), holders_,
                                                stage_holder_.get(), mpi_holder_.get());
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
  return absl::OkStatus();
}

absl::Status Daemon::Serve(const DaemonOptions& options) {
  grpc::EnableDefaultHealthCheckService(true);
  const std::string& introspection = options.serve.introspection;
  if (introspection != "on" && introspection != "off" && introspection != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("--introspection must be on, off or auto, not ", Quoted(introspection)));
  }
  if (introspection == "on" ||
      (introspection == "auto" && !ClientsNeedCredentials(options.serve))) {
    // Reflection and channelz have no credentials check of their own: only where every
    // caller may do anything anyway, or where the operator asks for them.
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    grpc::channelz::experimental::InitChannelzService();
    introspection_ = true;
  }
  LOG(INFO) << "server reflection and channelz: "
            << (introspection_ ? "served" : "off (callers need credentials; --introspection=on)");
  grpc::ServerBuilder builder;
  constexpr uint64_t kMinMessage = 8 << 20, kMaxMessage = uint64_t{1} << 30;
  if (options.serve.max_message_size < kMinMessage ||
      options.serve.max_message_size > kMaxMessage) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_message_size must be between 8MiB (a read stream's largest chunk and more) and "
        "1GiB, not ",
        options.serve.max_message_size));
  }
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.serve.max_message_size));
  builder.SetMaxSendMessageSize(static_cast<int>(options.serve.max_message_size));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  auto ms = [](absl::Duration d) {
    return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 1, INT32_MAX));
  };
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             ms(options.serve.handshake_timeout));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                             ms(options.serve.max_connection_idle));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, ms(options.serve.keepalive));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  // gRPC's own unless set (more waiting threads measured no faster: docs/reliability.md).
  if (options.serve.completion_queues > 0) {
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS,
                                options.serve.completion_queues);
  }
  if (options.serve.min_pollers > 0) {
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS,
                                options.serve.min_pollers);
  }
  if (options.serve.max_pollers > 0) {
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS,
                                options.serve.max_pollers);
  }
  std::shared_ptr<grpc::ServerCredentials> tcp = grpc::InsecureServerCredentials();
  if (!options.serve.tls.cert.empty() || !options.serve.tls.key.empty() ||
      !options.serve.tls.client_ca.empty()) {
    auto tls = TlsFiles::Start(options.serve.tls);
    if (!tls.ok()) return tls.status();
    tls_ = *std::move(tls);
    tcp = tls_->credentials();
    LOG(INFO) << "TLS on the TCP ports ("
              << (options.serve.tls.client_ca.empty() ? "no client certificates"
                                                      : "client certificates required")
              << "), certificates re-read when " << options.serve.tls.cert << " changes";
  }
  ListenOptions listen;
  listen.addresses = options.serve.listen;
  listen.unix_socket_mode = options.serve.unix_socket_mode;
  listen.unix_socket_group = options.serve.unix_socket_group;
  listen.unix_uids = !options.serve.unix_socket_principals.empty();
  auto listeners = Listeners::Bind(listen);
  if (!listeners.ok()) return listeners.status();
  listeners_ = *std::move(listeners);
  listeners_->Register(builder, tcp);
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
  // The bound addresses are known only after BuildAndStart; the node service gets them then.
  builder.RegisterService(buffer_service_.get());
  builder.RegisterService(transfer_service_.get());
  builder.RegisterService(peer_service_.get());
  facts.tls = tls_ != nullptr;
  facts.tls_client_certificates = tls_ != nullptr && !options.serve.tls.client_ca.empty();
  facts.peer_authentication = peer_auth_ != nullptr                   ? "cluster secret"
                              : ClientsNeedCredentials(options.serve) ? "none"
                                                                      : "open";
  node_service_ = std::make_unique<NodeServiceImpl>(auth_.get(), facts);
  builder.RegisterService(node_service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", absl::StrJoin(options.serve.listen, ", ")));
  }
  listeners_->Start();
  addresses_ = listeners_->bound();
  facts.listen = addresses_;
  if (metrics_ != nullptr) facts.metrics_address = metrics_->address();
  node_service_->UpdateFacts(facts);
  return absl::OkStatus();
}

absl::Status Daemon::Advertise(const DaemonOptions& options) {
  std::string advertise = options.advertise;
  if (advertise.empty()) {
    for (const std::string& a : addresses_) {
      if (!absl::StartsWith(a, "unix:")) {
        advertise = a;
        break;
      }
    }
    if (advertise.empty()) advertise = addresses_.front();
    // A wildcard listen is advertised by host name.
    for (const char* any : {"0.0.0.0:", "[::]:"}) {
      if (absl::StartsWith(advertise, any)) {
        advertise = absl::StrCat(HostName(), ":", advertise.substr(strlen(any)));
      }
    }
  }
  cluster_->SetAdvertisedAddress(advertise);
  // As an MPI rank: every rank's name and address, gathered once; the others are our peers.
  std::vector<std::string> mpi_nodes;
  if (mpi_ != nullptr) {
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
  }
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

Daemon::~Daemon() {
  // The metrics' refresher reads the scheduler, which goes first.
  if (metrics_ != nullptr) metrics_->StopRefreshing();
  // Peer calls stop before the services they run on go.
  if (peer_calls_ != nullptr) peer_calls_->StopServing();
  if (listeners_ != nullptr) listeners_->Stop();
  if (server_ != nullptr) {
    scheduler_->CancelAll();
    notifications_->Stop();
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
  }
  // metrics_ goes before remote_ranges_, whose retries may still call peers.
  if (remote_ranges_ != nullptr) remote_ranges_->set_observer(nullptr);
}

void Daemon::Shutdown(absl::Duration grace) {
  LOG(INFO) << "draining: refusing new transfers; " << scheduler_->active()
            << " queued or running get " << absl::FormatDuration(grace) << " to finish";
  server_->GetHealthCheckService()->SetServingStatus(false);
  scheduler_->StopAccepting();
  if (!scheduler_->Drain(absl::Now() + grace)) {
    LOG(WARNING) << "drain grace ran out; cancelling " << scheduler_->active() << " transfer(s)";
    scheduler_->CancelAll();
    scheduler_->Drain(absl::Now() + absl::Seconds(10));
  }
  // Let Wait/Watch callers see the final states before their streams are cut.
  notifications_->Stop();
  listeners_->Stop();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  LOG(INFO) << "stopped";
}

void Daemon::CancelAll() { scheduler_->CancelAll(); }

void Daemon::Wait() { server_->Wait(); }

std::shared_ptr<grpc::Channel> Daemon::InProcessChannel() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  return server_->InProcessChannel(args);
}

}  // namespace gpumove
