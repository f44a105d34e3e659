// One gpumoved: GPU runtime, pools, buffer registry, engines, transfer scheduler and the
// gRPC server, started together and stopped in order. Start's steps live one file per
// group of modules they make: start_pools.cc, start_paths.cc, start_cluster.cc,
// start_metrics.cc, start_services.cc and start_server.cc.
#ifndef GPUMOVE_DAEMON_APP_DAEMON_H_
#define GPUMOVE_DAEMON_APP_DAEMON_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/app/options.h"
#include "daemon/cluster/cluster.h"
#include "daemon/common/watched_files.h"
#include "daemon/core/buffer_registry.h"
#include "daemon/core/prepared_pieces.h"
#include "daemon/core/transfer_scheduler.h"
#include "daemon/gpu/gpu.h"
#include "daemon/gpu/ipc.h"
#include "daemon/gpu/own_memory.h"
#include "daemon/memory/pool.h"
#include "daemon/path/cuda_ipc/cuda_ipc_engine.h"
#include "daemon/path/cuda_ipc/cuda_ipc_tails.h"
#include "daemon/path/file/file_engine.h"
#include "daemon/path/file/file_roots.h"
#include "daemon/path/local/local_engine.h"
#include "daemon/path/mpi/mpi_engine.h"
#include "daemon/path/mpi/mpi_hello.h"
#include "daemon/path/mpi/mpi_holder.h"
#include "daemon/path/mpi/mpi_protocol.h"
#include "daemon/path/mpi/mpi_transport.h"
#include "daemon/path/ucx/stage_holder.h"
#include "daemon/path/ucx/ucx_engine.h"
#include "daemon/path/ucx/ucx_hello.h"
#include "daemon/path/ucx/ucx_peer_calls.h"
#include "daemon/path/ucx/ucx_transport.h"
#include "daemon/peer/holds.h"
#include "daemon/peer/path_calls.h"
#include "daemon/peer/peer_service.h"
#include "daemon/peer/remote_ranges.h"
#include "daemon/server/buffer_service.h"
#include "daemon/server/listeners.h"
#include "daemon/server/metrics.h"
#include "daemon/server/node_service.h"
#include "daemon/server/reflection.h"
#include "daemon/server/starting_server.h"
#include "daemon/server/tls.h"
#include "daemon/server/transfer_service.h"

namespace gpumove {

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
  // Binds the sockets and answers on them, NOT_SERVING, while the next steps run.
  absl::Status Listen(const DaemonOptions& options);
  absl::Status FindGpus(const DaemonOptions& options);
  absl::Status StartUcx(const DaemonOptions& options);  // Before the pools it allocates.
  absl::Status MakePools(const DaemonOptions& options);
  absl::Status StartUcxLanes(const DaemonOptions& options);     // The extra UCX lanes.
  absl::Status ShareDevicePools(const DaemonOptions& options);  // Over CUDA IPC.
  absl::Status MakeRegistry(const DaemonOptions& options);
  // This node's descriptor for peers: each path's part of Hello (UCX: pools registered,
  // lanes, peer calls; MPI: its rank).
  absl::Status DescribeSelf(const DaemonOptions& options);
  absl::Status JoinCluster(const DaemonOptions& options);  // Membership, remote ranges.
  absl::Status MakeEngines(const DaemonOptions& options);  // And the hold table.
  absl::Status StartMetrics(const DaemonOptions& options);
  absl::Status MakeScheduler(const DaemonOptions& options);
  absl::Status MakeServices(const DaemonOptions& options);  // Public API and peer protocol.
  absl::Status Serve(const DaemonOptions& options);         // The gRPC server.
  // The address peers use, the MPI job's other ranks, the cluster's heartbeats, health.
  absl::Status Advertise(const DaemonOptions& options);

  // Parts of the steps above, each beside its step.
  // What UCX's progress threads run first: this node's first GPU's context made current.
  std::function<void()> UcxThreadSetup() const;
  absl::Status LoadClusterSecret(const DaemonOptions& options);  // DescribeSelf's.
  absl::Status RegisterWithUcx(const DaemonOptions& options);    // DescribeSelf's.
  absl::Status MakeAuthenticator(const DaemonOptions& options);  // MakeServices'.
  void MakePeerService(const DaemonOptions& options);            // MakeServices'.
  absl::Status EnableIntrospection(const ServeOptions& serve);   // Serve's.
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TcpCredentials(
      const ServeOptions& serve);                    // Serve's.
  NodeFacts Facts(const ServeOptions& serve) const;  // Serve's.
  // Advertise's: the MPI job's node names by rank (none when not a rank); the heartbeats.
  absl::StatusOr<std::vector<std::string>> MeetMpiRanks(const std::string& advertise);
  void StartMembership(const std::vector<std::string>& mpi_nodes);

  // What Start's steps hand on: the GPUs used, the engines, how ranges are hashed, this
  // node's descriptor, and one line per data plane for Info.
  std::vector<int> gpus_;
  std::vector<Engine*> engines_;
  RangeHasher hasher_;
  peer::v1::NodeDescriptor self_;
  // Each path's part of Hello (those this node runs): its blob in self_, and what it reads
  // of peers'.
  std::unique_ptr<UcxHello> ucx_hello_;
  std::unique_ptr<MpiHello> mpi_hello_;
  std::vector<const PathHello*> path_hellos_;
  struct {
    std::string mpi, ucx, ipc, file;
  } summary_;

  std::string node_;
  std::vector<std::string> addresses_;
  // Before what stamps or checks peer calls with it (the cluster holds it too).
  std::shared_ptr<PeerAuth> peer_auth_;
  std::unique_ptr<WatchedFiles> secret_watcher_;  // Gives peer_auth_ changed secrets.
  std::unique_ptr<GpuRuntime> gpu_;
  // Before pools_: host pools may live in memory UCX allocated.
  std::unique_ptr<UcxTransport> ucx_;
  std::unique_ptr<UcxHostMemory> ucx_memory_;
  std::unique_ptr<PoolSet> pools_;
  // UCX lanes besides ucx_ (lane 1 first); after pools_: they register its memory.
  std::vector<std::unique_ptr<UcxTransport>> ucx_lanes_;
  std::vector<std::string> ucx_rails_;  // The devices of lanes 1.. (--ucx_rails), or none.
  // Before registry_: imported buffers hold mappings from it.
  std::unique_ptr<IpcTable> ipc_;
  std::unique_ptr<OwnDeviceMemory> own_memory_;  // Exportable buffers'; outlives registry_.
  // Before registry_ and the scheduler, which count against them; the watcher re-reads
  // the quota file.
  std::unique_ptr<Quotas> quotas_;
  std::unique_ptr<WatchedFiles> quotas_watcher_;
  std::unique_ptr<BufferRegistry> registry_;
  // Before holds_: MPI halves of held ranges use them.
  std::unique_ptr<MpiTransport> mpi_;
  std::unique_ptr<MpiEngine> mpi_engine_;
  // Before holds_ and the scheduler, which publish to it.
  std::unique_ptr<NotificationLog> notifications_;
  std::unique_ptr<PreparedPieceLists> prepared_;
  std::unique_ptr<HoldTable> holds_;
  // The paths' holding sides (those this node runs), for the peer handler.
  std::unique_ptr<CudaIpcHolder> cuda_ipc_holder_;
  std::unique_ptr<IpcTailReader> cuda_ipc_tails_;
  std::unique_ptr<UcxHolder> ucx_holder_;
  std::unique_ptr<StageHolder> stage_holder_;
  std::unique_ptr<MpiHolder> mpi_holder_;
  std::vector<PathHolder*> holders_;
  // The paths' own peer calls, registered by the paths whose holders this node runs.
  PathCalls path_calls_;
  std::unique_ptr<UcxEngine> ucx_engine_;
  std::unique_ptr<LocalEngine> local_engine_;
  // Path FILE_IO: the roots FILE buffers are registered under, and its engine.
  std::unique_ptr<FileRoots> file_roots_;
  std::unique_ptr<FileEngine> file_engine_;
  std::unique_ptr<CudaIpcEngine> cuda_ipc_engine_;
  std::unique_ptr<Cluster> cluster_;
  // Before remote_ranges_, which calls peers through it.
  std::unique_ptr<UcxPeerCalls> peer_calls_;
  std::unique_ptr<MpiCodec> mpi_codec_;  // Before remote_ranges_, which reads offers with it.
  std::unique_ptr<ClusterRemoteRanges> remote_ranges_;
  std::unique_ptr<Metrics> metrics_;
  // Before scheduler_, which reads them; the watcher re-reads the weights file.
  std::unique_ptr<TenantWeights> weights_;
  std::unique_ptr<WatchedFiles> weights_watcher_;
  std::unique_ptr<TransferScheduler> scheduler_;
  std::unique_ptr<Authenticator> auth_;  // Before the services that check with it.
  std::unique_ptr<BufferServiceImpl> buffer_service_;
  std::unique_ptr<TransferServiceImpl> transfer_service_;
  std::unique_ptr<Reflection> reflection_;  // Null: not served.
  bool channelz_ = false;                    // Served.
  std::unique_ptr<LongCalls> long_calls_;
  std::unique_ptr<NodeServiceImpl> node_service_;
  // The peer protocol, and its gRPC adapter (the UCX one is peer_calls_).
  std::unique_ptr<PeerHandler> peer_handler_;
  std::unique_ptr<PeerServiceImpl> peer_service_;
  std::unique_ptr<TlsFiles> tls_;         // Before server_: its ports use the credentials.
  std::unique_ptr<Listeners> listeners_;  // Stopped before server_ shuts down.
  std::shared_ptr<grpc::ServerCredentials> tcp_credentials_;  // The TCP sockets'.
  std::unique_ptr<StartingServer> starting_;  // Until server_ takes the sockets over.
  std::unique_ptr<grpc::Server> server_;
};

// Resolves a --gpus value against the devices present: indexes to use.
absl::StatusOr<std::vector<int>> SelectGpus(const std::string& spec,
                                            const std::vector<GpuDevice>& devices);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_APP_DAEMON_H_
