#include "daemon/server/node_service.h"

#include <algorithm>

#include "daemon/common/cpus.h"
#include "daemon/server/convert.h"

namespace gpumove {

grpc::Status NodeServiceImpl::GetInfo(grpc::ServerContext* context, const v1::GetInfoRequest*,
                                      v1::NodeInfo* response) {
  GPUMOVE_CHECK_CALLER(caller, *auth_, context, Access::kRead, "GetInfo");
  absl::MutexLock lock(&mu_);
  response->set_node(facts_.node);
  response->set_host(facts_.host);
  response->set_version(kVersion);
  response->set_authentication(auth_->Describe());
  response->set_tls(facts_.tls);
  response->set_tls_client_certificates(facts_.tls_client_certificates);
  response->set_peer_authentication(facts_.peer_authentication);
  for (const std::string& line : facts_.gpu_nic_topology) response->add_gpu_nic_topology(line);
  response->set_cpus(static_cast<uint32_t>(AllowedCpus()));
  if (facts_.scheduler != nullptr) {
    response->set_workers(static_cast<uint32_t>(facts_.scheduler->workers()));
  }
  for (const GpuDevice& d : facts_.gpu->devices()) {
    if (std::find(facts_.served_gpus.begin(), facts_.served_gpus.end(), d.index) ==
        facts_.served_gpus.end()) {
      continue;
    }
    v1::GpuInfo* g = response->add_gpus();
    g->set_index(d.index);
    g->set_uuid(d.uuid);
    g->set_name(d.name);
    g->set_total_memory(d.total_memory);
    g->set_pci_bus_id(d.pci_bus_id);
    for (int p : d.peer_access) g->add_peer_access(p);
  }
  for (const auto& pool : facts_.pools->pools()) {
    const PoolStats s = pool->Stats();
    v1::PoolInfo* p = response->add_pools();
    p->set_kind(ToProto(s.kind));
    p->set_device(s.device);
    p->set_capacity(s.capacity);
    p->set_free(s.free);
    p->set_largest_free(s.largest_free);
    p->set_buffers(static_cast<uint32_t>(s.buffers));
    p->set_locked(s.locked);
  }
  v1::PathInfo* automatic = response->add_paths();
  automatic->set_path(v1::PATH_AUTO);
  automatic->set_available(true);
  automatic->set_reason(
      "per move, the first available of LOCAL (both ends here), CUDA_IPC (device memory of "
      "a daemon on this host), UCX, MPI that can serve it, "
      "preferring one that needs no host staging of device memory; FILE_IO for a move with "
      "a FILE buffer at one end");
  for (PathKind path :
       {PathKind::kLocal, PathKind::kCudaIpc, PathKind::kUcx, PathKind::kMpi, PathKind::kFile}) {
    v1::PathInfo* info = response->add_paths();
    info->set_path(ToProto(path));
    bool available = false;
    for (const Engine* e : facts_.engines) available |= e->path() == path;
    info->set_available(available);
    if (path == PathKind::kLocal) {
      info->set_reason(facts_.gpu->devices().empty()
                           ? "memcpy between this node's host pools"
                           : "memcpy and cudaMemcpyAsync inside this node; peer copies between "
                             "its GPUs");
    } else if (path == PathKind::kUcx) {
      info->set_reason(facts_.ucx_status);
    } else if (path == PathKind::kMpi) {
      info->set_reason(facts_.mpi_status);
    } else if (path == PathKind::kCudaIpc) {
      info->set_reason(facts_.cuda_ipc_status);
    } else if (path == PathKind::kFile) {
      info->set_reason(facts_.file_status);
    }
  }
  response->set_cuda_compiled(facts_.gpu->cuda_compiled());
  response->set_gpu_status(facts_.gpu->status());
  response->set_ucx_cuda_aware(facts_.ucx_cuda_aware);
  response->set_mpi_cuda_aware(facts_.mpi_cuda_aware);
  ToProto(facts_.start_time, response->mutable_start_time());
  response->set_active_transfers(static_cast<uint32_t>(facts_.scheduler->active()));
  for (const std::string& l : facts_.listen) response->add_listen(l);
  response->set_metrics_address(facts_.metrics_address);
  return grpc::Status::OK;
}

grpc::Status NodeServiceImpl::ListPeers(grpc::ServerContext* context, const v1::ListPeersRequest*,
                                        v1::ListPeersResponse* response) {
  GPUMOVE_CHECK_CALLER(caller, *auth_, context, Access::kRead, "ListPeers");
  Cluster* cluster = nullptr;
  {
    absl::MutexLock lock(&mu_);
    cluster = facts_.cluster;
  }
  if (cluster == nullptr) return grpc::Status::OK;
  for (const PeerView& p : cluster->List()) {
    v1::PeerInfo* info = response->add_peers();
    info->set_node(p.node);
    info->set_address(p.address);
    info->set_up(p.up);
    ToProto(p.last_seen, info->mutable_last_seen());
  }
  return grpc::Status::OK;
}

}  // namespace gpumove
