// gpumove.v1.NodeService: what this node has (GPUs, pools, paths) and whom it knows.
#ifndef GPUMOVE_DAEMON_SERVER_NODE_SERVICE_H_
#define GPUMOVE_DAEMON_SERVER_NODE_SERVICE_H_

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/cluster/cluster.h"
#include "daemon/core/engine.h"
#include "daemon/core/transfer_scheduler.h"
#include "daemon/gpu/gpu.h"
#include "daemon/memory/pool.h"
#include "daemon/server/auth.h"
#include "proto/gpumove/v1/gpumove.grpc.pb.h"

namespace gpumove {

inline constexpr char kVersion[] = "0.1.0";

struct NodeFacts {
  std::string node;
  std::string host;
  std::vector<std::string> listen;
  absl::Time start_time;
  GpuRuntime* gpu = nullptr;
  PoolSet* pools = nullptr;
  TransferScheduler* scheduler = nullptr;
  std::vector<Engine*> engines;
  Cluster* cluster = nullptr;  // Null: no peers.
  // Why UCX is or is not there, and whether it takes device memory.
  std::string ucx_status;
  bool ucx_cuda_aware = false;
  std::string metrics_address;
  // Why MPI is or is not there, and whether it takes device memory.
  std::string mpi_status;
  bool mpi_cuda_aware = false;
  std::string cuda_ipc_status;
  // The GPUs this daemon serves (--gpus): the only ones GetInfo lists.
  std::vector<int> served_gpus;
  bool tls = false;
  bool tls_client_certificates = false;
  std::string peer_authentication;  // NodeInfo.peer_authentication
  std::vector<std::string> gpu_nic_topology;  // NodeInfo.gpu_nic_topology
  std::string file_status;                    // Path FILE_IO: its engine and roots.
};

class NodeServiceImpl final : public v1::NodeService::Service {
 public:
  // `auth` checks every caller (and must outlive the service).
  NodeServiceImpl(const Authenticator* auth, NodeFacts facts)
      : auth_(auth), facts_(std::move(facts)) {}
  // Called once, before the server serves, with the bound addresses filled in.
  void UpdateFacts(NodeFacts facts) {
    absl::MutexLock lock(&mu_);
    facts_ = std::move(facts);
  }

  grpc::Status GetInfo(grpc::ServerContext* context, const v1::GetInfoRequest* request,
                       v1::NodeInfo* response) override;
  grpc::Status ListPeers(grpc::ServerContext* context, const v1::ListPeersRequest* request,
                         v1::ListPeersResponse* response) override;

 private:
  const Authenticator* const auth_;
  absl::Mutex mu_;
  NodeFacts facts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_NODE_SERVICE_H_
