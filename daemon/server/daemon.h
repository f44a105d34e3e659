// One gpumoved: GPU runtime, pools, buffer registry, engines, transfer scheduler and the
// gRPC server, started together and stopped in order.
#ifndef GPUMOVE_DAEMON_SERVER_DAEMON_H_
#define GPUMOVE_DAEMON_SERVER_DAEMON_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/cluster/cluster.h"
#include "daemon/cluster/holds.h"
#include "daemon/cluster/remote_ranges.h"
#include "daemon/core/buffer_registry.h"
#include "daemon/core/transfer_scheduler.h"
#include "daemon/gpu/gpu.h"
#include "daemon/gpu/ipc.h"
#include "daemon/memory/pool.h"
#include "daemon/path/cuda_ipc/cuda_ipc_engine.h"
#include "daemon/path/local/local_engine.h"
#include "daemon/path/mpi/mpi_engine.h"
#include "daemon/path/mpi/mpi_transport.h"
#include "daemon/path/ucx/ucx_engine.h"
#include "daemon/path/ucx/ucx_transport.h"
#include "daemon/server/buffer_service.h"
#include "daemon/server/metrics.h"
#include "daemon/server/node_service.h"
#include "daemon/server/peer_calls.h"
#include "daemon/server/peer_service.h"
#include "daemon/server/transfer_service.h"

namespace gpumove {

struct DaemonOptions {
  // "host:port" (port 0 picks a free one) or "unix:/path".
  std::vector<std::string> listen = {"127.0.0.1:7470"};
  std::string node;  // Empty: the host name.
  PoolSizes pools;
  // "all", "none", or a comma list of GPU indexes and/or UUIDs.
  std::string gpus = "all";
  absl::Duration default_lease = absl::ZeroDuration();
  int copy_threads = 4;
  size_t max_active = 4096;
  uint64_t rate_limit = 0;
  uint64_t inline_max_bytes = 64 << 10;
  // When set, the first bound address is written here once the server is up.
  std::string port_file;
  // Cluster: peers to join (host:port or DNS name:port), the address to advertise to them
  // (default: the first bound TCP address), heartbeat and failure detection.
  std::vector<std::string> peers;
  std::string advertise;
  absl::Duration heartbeat = absl::Milliseconds(500);
  absl::Duration peer_timeout = absl::Seconds(3);
  // Longest a call forwarded to another node takes when it does not wait for a transfer.
  absl::Duration forward_timeout = absl::Seconds(10);
  // UCX_NET_DEVICES; "auto": "lo" when every --listen address is on this host (loopback
  // or a unix socket), so UCX listens where gRPC does; else UCX's default, every device.
  std::string ucx_net_devices = "auto";
  // The UCX engine (node-to-node moves). Without it a node still joins a cluster and
  // routes requests.
  bool ucx = true;
  // Stage every range peers move to or from this node, not only device memory (exercises
  // the staging protocol on machines without GPUs).
  bool ucx_force_staging = false;
  bool cuda_ipc_fences = true;  // Peers' CUDA IPC copies may end behind a fence we wait for.
  // Our CUDA IPC moves of this many bytes or more may end behind a fence.
  uint64_t cuda_ipc_fence_min = CudaIpcEngine::kDefaultMinFenced;
  // Bytes/s; see FencePolicy::quiet_rate.
  uint64_t cuda_ipc_fence_quiet = 1000ull * 1000 * 1000 * 1000;
  // Bounce buffers of staged UCX moves (this node's own and those it holds for peers).
  StagingOptions staging;
  uint64_t ucx_chunk = 4 << 20;
  // Host pools in memory UCX allocates (shared with daemons on this host when UCX has a
  // shared-memory allocator), not in private anonymous memory.
  bool ucx_shared_pools = true;
  // Moves with peer pools UCX maps through shared memory are copies on the worker thread.
  bool ucx_direct = true;
  // The moving side's calls to peers (holds, acknowledgements, staging and MPI steps) as
  // UCX active messages where both nodes have UCX, not gRPC.
  bool ucx_peer_calls = true;
  // UCX's progress thread polls this long after activity before sleeping, and peer
  // callers wait this long for a reply before blocking (UcxOptions::poll_window); 1 ms was
  // best even on 2 CPUs (docs/performance/tuning.md).
  absl::Duration ucx_poll_window = absl::Milliseconds(1);
  // How long a thread serving peer calls polls for the next one after serving; negative:
  // ucx_poll_window with 16 CPUs or more, a fifth of it below.
  absl::Duration peer_call_poll = absl::Milliseconds(-1);
  // UcxOptions::call_awake; negative: 10 ms with 16 CPUs or more, 0 below.
  absl::Duration peer_call_awake = absl::Milliseconds(-1);
  // SetPoolIdleSpin, for the whole process; negative: 1 ms with 16 CPUs or more, 0 below.
  absl::Duration pool_spin = absl::Milliseconds(-1);
  // Threads one such copy is split over; 0: a quarter of the CPUs, at most 8.
  int direct_copy_threads = 0;
  // The same for such a copy in a staged move (beside its GPU copies); 0: a quarter of
  // direct_copy_threads, at least 1.
  int staged_copy_threads = 0;
  // UCX lanes (each its own context, worker, connections and progress thread) that host
  // moves over the wire are split over; 0: one per 8 CPUs, 1 to 4.
  int ucx_lanes = 0;
  uint64_t ucx_lane_share = 512 << 10;  // Smallest share of a split move.
  // Prometheus /metrics on this host:port (port 0 picks one); empty: off.
  std::string metrics_listen;
  // MPI: "auto" (when an MPI launcher started us), "on" (fail without it) or "off". As
  // a rank, the node is named rank<N> unless `node` is given ("%r" in `node` and
  // `port_file` becomes the rank), peers are the other ranks, and without
  // `listen_given` it listens on 127.0.0.1:(7470 + rank on this host).
  std::string mpi = "auto";
  uint64_t mpi_chunk = 4 << 20;
  // The MPI thread polls this long after activity before it naps (MpiOptions).
  absl::Duration mpi_poll_window = absl::Milliseconds(2);
  // MpiOptions::spin; unset: on with 16 CPUs or more.
  std::optional<bool> mpi_spin;
  bool mpi_force_staging = false;
  bool listen_given = true;
};

// `options` with every machine-dependent default made this machine's (`cpus` CPUs): the
// negative durations and 0 counts above that say "depends on the machine". The one place
// where the number of CPUs picks a default.
DaemonOptions WithMachineDefaults(DaemonOptions options, unsigned cpus);

class Daemon {
 public:
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(DaemonOptions options);
  ~Daemon();

  // Addresses actually bound (port 0 resolved).
  const std::vector<std::string>& addresses() const { return addresses_; }
  const std::string& node() const { return node_; }
  // A channel to this daemon's services inside the process (no socket): for in-process
  // drivers such as the service fuzzer.
  std::shared_ptr<grpc::Channel> InProcessChannel();

  // Drains: health NOT_SERVING and new Submits refused at once; queued and running
  // transfers get until `grace` to finish, then the rest are cancelled; then the server
  // stops. Safe to call once.
  void Shutdown(absl::Duration grace);
  // Cancels every transfer now (a second signal during a drain).
  void CancelAll();
  // Blocks until the server has stopped.
  void Wait();

 private:
  Daemon() = default;

  // The steps of Start, in order: each makes one part of the daemon from its options and
  // the parts made before it.
  absl::Status JoinMpiJob(DaemonOptions& options);  // As a rank: names, address, peers.
  absl::Status FindGpus(const DaemonOptions& options);
  absl::Status StartUcx(const DaemonOptions& options);          // Before the pools it allocates.
  absl::Status MakePools(const DaemonOptions& options);         // And the extra UCX lanes.
  absl::Status ShareDevicePools(const DaemonOptions& options);  // Over CUDA IPC.
  absl::Status MakeRegistry(const DaemonOptions& options);
  // This node's descriptor for peers (pools registered with UCX, lanes, peer calls).
  absl::Status DescribeSelf(const DaemonOptions& options);
  absl::Status JoinCluster(const DaemonOptions& options);  // Membership, remote ranges.
  absl::Status MakeEngines(const DaemonOptions& options);  // And the hold table.
  absl::Status StartMetrics(const DaemonOptions& options);
  absl::Status MakeScheduler(const DaemonOptions& options);
  absl::Status MakeServices(const DaemonOptions& options);  // Public API and peer protocol.
  absl::Status Serve(const DaemonOptions& options);         // The gRPC server.
  // The address peers use, the MPI job's other ranks, the cluster's heartbeats, health.
  absl::Status Advertise(const DaemonOptions& options);

  // What Start's steps hand on: the GPUs used, the engines, how ranges are hashed, this
  // node's descriptor, and one line per data plane for Info.
  std::vector<int> gpus_;
  std::vector<Engine*> engines_;
  RangeHasher hasher_;
  peer::v1::NodeDescriptor self_;
  struct {
    std::string mpi, ucx, ipc;
  } summary_;

  std::string node_;
  std::vector<std::string> addresses_;
  std::unique_ptr<GpuRuntime> gpu_;
  // Before pools_: host pools may live in memory UCX allocated.
  std::unique_ptr<UcxTransport> ucx_;
  std::unique_ptr<UcxHostMemory> ucx_memory_;
  std::unique_ptr<PoolSet> pools_;
  // UCX lanes besides ucx_ (lane 1 first); after pools_: they register its memory.
  std::vector<std::unique_ptr<UcxTransport>> ucx_lanes_;
  // Before registry_: imported buffers hold mappings from it.
  std::unique_ptr<IpcTable> ipc_;
  std::unique_ptr<BufferRegistry> registry_;
  // Before holds_: MPI halves of held ranges use them.
  std::unique_ptr<MpiTransport> mpi_;
  std::unique_ptr<MpiEngine> mpi_engine_;
  std::unique_ptr<HoldTable> holds_;
  // The paths' holding sides (those this node runs), for the peer handler.
  std::unique_ptr<CudaIpcHolder> cuda_ipc_holder_;
  std::unique_ptr<UcxHolder> ucx_holder_;
  std::unique_ptr<StageHolder> stage_holder_;
  std::unique_ptr<MpiHolder> mpi_holder_;
  std::vector<PathHolder*> holders_;
  std::unique_ptr<UcxEngine> ucx_engine_;
  std::unique_ptr<LocalEngine> local_engine_;
  std::unique_ptr<CudaIpcEngine> cuda_ipc_engine_;
  std::unique_ptr<Cluster> cluster_;
  // Before remote_ranges_, which calls peers through it.
  std::unique_ptr<UcxPeerCalls> peer_calls_;
  std::unique_ptr<ClusterRemoteRanges> remote_ranges_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<TransferScheduler> scheduler_;
  std::unique_ptr<BufferServiceImpl> buffer_service_;
  std::unique_ptr<TransferServiceImpl> transfer_service_;
  std::unique_ptr<NodeServiceImpl> node_service_;
  // The peer protocol, and its gRPC adapter (the UCX one is peer_calls_).
  std::unique_ptr<PeerHandler> peer_handler_;
  std::unique_ptr<PeerServiceImpl> peer_service_;
  std::unique_ptr<grpc::Server> server_;
};

// Resolves a --gpus value against the devices present: indexes to use.
absl::StatusOr<std::vector<int>> SelectGpus(const std::string& spec,
                                            const std::vector<GpuDevice>& devices);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_DAEMON_H_
