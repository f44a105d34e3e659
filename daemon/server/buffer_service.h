// gpumove.v1.BufferService over the buffer registry.
#ifndef GPUMOVE_DAEMON_SERVER_BUFFER_SERVICE_H_
#define GPUMOVE_DAEMON_SERVER_BUFFER_SERVICE_H_

#include <optional>
#include <string>

#include "daemon/cluster/cluster.h"
#include "daemon/core/buffer_registry.h"
#include "daemon/gpu/gpu.h"
#include "daemon/gpu/ipc.h"
#include "daemon/path/file/file_roots.h"
#include "daemon/server/auth.h"
#include "daemon/server/call_limits.h"
#include "proto/gpumove/v1/gpumove.grpc.pb.h"

namespace gpumove {

// Requests naming another node are forwarded to it (so one address serves a client for
// the whole cluster). Read and Write are callback reactors (read_write_reactors.h): an
// open byte stream holds no thread.
class BufferServiceImpl final
    : public v1::BufferService::WithCallbackMethod_Read<
          v1::BufferService::WithCallbackMethod_Write<v1::BufferService::Service>> {
 public:
  // `cluster` may be null: a node without peers.
  // `ipc` may be null: no CUDA IPC (Import and Export answer FAILED_PRECONDITION).
  // `auth` checks every caller (and must outlive the service).
  BufferServiceImpl(const Authenticator* auth, BufferRegistry* registry, GpuRuntime* gpu,
                    std::string node, Cluster* cluster = nullptr, IpcTable* ipc = nullptr)
      : auth_(auth),
        registry_(registry),
        gpu_(gpu),
        node_(std::move(node)),
        cluster_(cluster),
        ipc_(ipc) {}

  grpc::Status Allocate(grpc::ServerContext* context, const v1::AllocateRequest* request,
                        v1::Buffer* response) override;
  grpc::Status Release(grpc::ServerContext* context, const v1::ReleaseRequest* request,
                       v1::ReleaseResponse* response) override;
  grpc::Status Get(grpc::ServerContext* context, const v1::GetBufferRequest* request,
                   v1::Buffer* response) override;
  grpc::Status List(grpc::ServerContext* context, const v1::ListBuffersRequest* request,
                    v1::ListBuffersResponse* response) override;
  grpc::Status RenewLease(grpc::ServerContext* context, const v1::RenewLeaseRequest* request,
                          v1::Buffer* response) override;
  grpc::ServerReadReactor<v1::WriteRequest>* Write(grpc::CallbackServerContext* context,
                                                   v1::WriteResponse* response) override;
  grpc::ServerWriteReactor<v1::ReadResponse>* Read(grpc::CallbackServerContext* context,
                                                   const v1::ReadRequest* request) override;
  grpc::Status Import(grpc::ServerContext* context, const v1::ImportRequest* request,
                      v1::Buffer* response) override;
  grpc::Status Export(grpc::ServerContext* context, const v1::ExportRequest* request,
                      v1::ExportResponse* response) override;
  grpc::Status RegisterFile(grpc::ServerContext* context, const v1::RegisterFileRequest* request,
                            v1::Buffer* response) override;

  // Caps the calls that last (streams, waits); null: no caps. Set before serving.
  void set_long_calls(LongCalls* calls) { long_calls_ = calls; }
  // Where RegisterFile finds files (must outlive the service); null or empty: it answers
  // FAILED_PRECONDITION. Set before serving.
  void set_file_roots(const FileRoots* roots) { file_roots_ = roots; }

 private:
  friend class ReadReactor;
  friend class WriteReactor;

  // A stub for `node` when it is another node; null when it is this one (or empty).
  // NOT_FOUND / UNAVAILABLE for unknown or down nodes.
  absl::StatusOr<std::unique_ptr<v1::BufferService::Stub>> RemoteStub(
      const grpc::ServerContextBase& context, const std::string& node);
  // The forwarded call's status when `node` is another node (or cannot be reached);
  // nullopt when the call is this node's to serve.
  template <typename Request, typename Response>
  std::optional<grpc::Status> MaybeForward(const std::string& node,
                                           grpc::Status (v1::BufferService::Stub::*method)(
                                               grpc::ClientContext*, const Request&, Response*),
                                           grpc::ServerContext* context, const Request& request,
                                           Response* response);

  LongCalls* long_calls_ = nullptr;
  const FileRoots* file_roots_ = nullptr;
  const Authenticator* const auth_;
  BufferRegistry* const registry_;
  GpuRuntime* const gpu_;
  const std::string node_;
  Cluster* const cluster_;
  IpcTable* const ipc_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_BUFFER_SERVICE_H_
