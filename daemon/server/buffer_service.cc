#include "daemon/server/buffer_service.h"

#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/common/quote.h"
#include "daemon/server/auth.h"
#include "daemon/server/convert.h"
#include "daemon/server/field_limits.h"
#include "daemon/server/forward.h"
#include "daemon/server/paging.h"
#include "daemon/server/read_write_reactors.h"

namespace gpumove {

absl::StatusOr<std::unique_ptr<v1::BufferService::Stub>> BufferServiceImpl::RemoteStub(
    const grpc::ServerContextBase& context, const std::string& node) {
  if (node.empty() || node == node_) return nullptr;
  return StubOn<v1::BufferService>(context, cluster_, node_, node);
}

template <typename Request, typename Response>
std::optional<grpc::Status> BufferServiceImpl::MaybeForward(
    const std::string& node,
    grpc::Status (v1::BufferService::Stub::*method)(grpc::ClientContext*, const Request&,
                                                    Response*),
    grpc::ServerContext* context, const Request& request, Response* response) {
  auto remote = RemoteStub(*context, node);
  if (!remote.ok()) return ToGrpcStatus(remote.status());
  if (*remote == nullptr) return std::nullopt;
  return ForwardUnary(**remote, method, context, auth_, *cluster_, node, request, response,
                      ForwardTimeout(cluster_));
}

grpc::Status BufferServiceImpl::Allocate(grpc::ServerContext* context,
                                         const v1::AllocateRequest* request, v1::Buffer* response) {
  GPUMOVE_CHECK_CALLER(caller, *auth_, context, Access::kChange, "Allocate");
  GPUMOVE_CHECK_FIELDS(*request);
  if (auto forwarded = MaybeForward(request->node(), &v1::BufferService::Stub::Allocate, context,
                                    *request, response)) {
    return *forwarded;
  }
  auto kind = FromProto(request->kind());
  if (!kind.ok()) return ToGrpcStatus(kind.status());
  auto ttl = FromProto(request->lease_ttl());
  if (!ttl.ok()) return ToGrpcStatus(ttl.status());
  AllocateOptions options;
  options.size = request->size();
  options.kind = *kind;
  options.device = request->device();
  options.lease_ttl = *ttl;
  options.label = request->label();
  options.owner = caller.owner();
  options.exportable = request->exportable();
  auto info = registry_->Allocate(options);
  if (!info.ok() && info.status().code() == absl::StatusCode::kResourceExhausted) {
    // In a cluster the caller may not know which node answered: name it.
    return ToGrpcStatus(
        absl::ResourceExhaustedError(absl::StrCat("node ", node_, ": ", info.status().message())));
  }
  if (!info.ok()) return ToGrpcStatus(info.status());
  ToProto(*info, node_, response);
  return grpc::Status::OK;
}

grpc::Status BufferServiceImpl::Release(grpc::ServerContext* context,
                                        const v1::ReleaseRequest* request,
                                        v1::ReleaseResponse* response) {
  GPUMOVE_CHECK_CALLER(caller, *auth_, context, Access::kChange, "Release");
  GPUMOVE_CHECK_FIELDS(*request);
  if (auto forwarded = MaybeForward(request->node(), &v1::BufferService::Stub::Release, context,
                                    *request, response)) {
    return *forwarded;
  }
  return ToGrpcStatus(registry_->Release(caller.owner(), request->buffer_id()));
}

grpc::Status BufferServiceImpl::Get(grpc::ServerContext* context,
                                    const v1::GetBufferRequest* request, v1::Buffer* response) {
  GPUMOVE_CHECK_CALLER(caller, *auth_, context, Access::kRead, "Get");
  GPUMOVE_CHECK_FIELDS(*request);
  if (auto forwarded = MaybeForward(request->node(), &v1::BufferService::Stub::Get, context,
                                    *request, response)) {
    return *forwarded;
  }

  auto info = registry_->Get(caller.owner(), request->buffer_id());
  if (!info.ok()) return ToGrpcStatus(info.status());
  ToProto(*info, node_, response);
  return grpc::Status::OK;
}

grpc::Status BufferServiceImpl::List(grpc::ServerContext* context,
                                     const v1::ListBuffersRequest* request,
                                     v1::ListBuffersResponse* response) {
  GPUMOVE_CHECK_CALLER(caller, *auth_, context, Access::kRead, "List");
  GPUMOVE_CHECK_FIELDS(*request);
  if (auto forwarded = MaybeForward(request->node(), &v1::BufferService::Stub::List, context,
                                    *request, response)) {
    return *forwarded;
  }
  auto next = FillPage(
      registry_->List(caller.owner()), request->page_token(), PageItems(request->page_size()),
      /*newest_first=*/false,
      [](const BufferInfo& b) {
        return PageKey{b.create_time, b.id};
      },
      [&](const BufferInfo& b) {
        v1::Buffer* out = response->add_buffers();
        ToProto(b, node_, out);
        return out->ByteSizeLong();
      });
  if (!next.ok()) return ToGrpcStatus(next.status());
  response->set_next_page_token(*next);
  return grpc::Status::OK;
}

grpc::Status BufferServiceImpl::RenewLease(grpc::ServerContext* context,
                                           const v1::RenewLeaseRequest* request,
                                           v1::Buffer* response) {
  GPUMOVE_CHECK_CALLER(caller, *auth_, context, Access::kChange, "RenewLease");
  GPUMOVE_CHECK_FIELDS(*request);
  if (auto forwarded = MaybeForward(request->node(), &v1::BufferService::Stub::RenewLease, context,
                                    *request, response)) {
    return *forwarded;
  }
  auto ttl = FromProto(request->lease_ttl());
  if (!ttl.ok()) return ToGrpcStatus(ttl.status());
  auto info = registry_->RenewLease(caller.owner(), request->buffer_id(), *ttl);
  if (!info.ok()) return ToGrpcStatus(info.status());
  ToProto(*info, node_, response);
  return grpc::Status::OK;
}

grpc::ServerReadReactor<v1::WriteRequest>* BufferServiceImpl::Write(
    grpc::CallbackServerContext* context, v1::WriteResponse* response) {
  return ServeWrite(this, context, response);
}

grpc::ServerWriteReactor<v1::ReadResponse>* BufferServiceImpl::Read(
    grpc::CallbackServerContext* context, const v1::ReadRequest* request) {
  return ServeRead(this, context, request);
}

}  // namespace gpumove

namespace gpumove {

grpc::Status BufferServiceImpl::Import(grpc::ServerContext* context,
                                       const v1::ImportRequest* request, v1::Buffer* response) {
  GPUMOVE_CHECK_CALLER(caller, *auth_, context, Access::kChange, "Import");
  GPUMOVE_CHECK_FIELDS(*request);
  if (auto forwarded = MaybeForward(request->node(), &v1::BufferService::Stub::Import, context,
                                    *request, response)) {
    return *forwarded;
  }
  if (ipc_ == nullptr || gpu_->devices().empty()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("node ", node_, " has no GPU to import memory on"));
  }
  int device = -1;
  for (const GpuDevice& d : gpu_->devices()) {
    if (d.uuid == request->device_uuid()) device = d.index;
  }
  if (device < 0) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("no GPU ", Quoted(request->device_uuid()), " on node ", node_));
  }
  if (request->size() == 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "size must be greater than 0");
  }
  auto ttl = FromProto(request->lease_ttl());
  if (!ttl.ok()) return ToGrpcStatus(ttl.status());
  auto mapping = ipc_->Open(device, request->cuda_ipc_handle());
  if (!mapping.ok()) return ToGrpcStatus(mapping.status());
  const uint64_t size = (*mapping)->size;
  if (request->offset() > size || request->size() > size - request->offset()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("offset ", request->offset(), " + size ", request->size(),
                                     " runs past the allocation (", size, " bytes)"));
  }
  AdoptOptions options;
  options.data = (*mapping)->base + request->offset();
  options.size = request->size();
  options.kind = MemoryKind::kDevice;
  options.device = device;
  options.keepalive = *mapping;
  options.lease_ttl = *ttl;
  options.label = request->label();
  options.owner = caller.owner();
  options.owner_pid = request->owner_pid();
  auto info = registry_->Adopt(std::move(options));
  if (!info.ok()) return ToGrpcStatus(info.status());
  ToProto(*info, node_, response);
  return grpc::Status::OK;
}

grpc::Status BufferServiceImpl::Export(grpc::ServerContext* context,
                                       const v1::ExportRequest* request,
                                       v1::ExportResponse* response) {
  GPUMOVE_CHECK_CALLER(caller, *auth_, context, Access::kChange, "Export");
  GPUMOVE_CHECK_FIELDS(*request);
  if (auto forwarded = MaybeForward(request->node(), &v1::BufferService::Stub::Export, context,
                                    *request, response)) {
    return *forwarded;
  }
  auto use = registry_->Acquire(caller.owner(), request->buffer_id(), 0, 0);
  if (!use.ok()) return ToGrpcStatus(use.status());
  if (use->kind() != MemoryKind::kDevice) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("buffer ", Quoted(request->buffer_id()),
                                     " is not device memory; only DEVICE buffers export"));
  }
  auto ref = ipc_ != nullptr ? ipc_->Find(use->data(), use->length()) : std::nullopt;
  if (ref.has_value() && ref->pool) {
    // The handle would map the whole pool: every tenant's buffers in it.
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("buffer ", Quoted(request->buffer_id()),
                     " lies in the device pool that all of this node's buffers share; only "
                     "a buffer allocated with exportable (gpumovectl alloc --exportable, "
                     "allocate(..., exportable=True)) has a CUDA IPC handle of its own"));
  }
  if (!ref.has_value()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this buffer's memory cannot be shared over CUDA IPC");
  }
  response->set_cuda_ipc_handle(ref->handle);
  response->set_offset(ref->offset);
  response->set_size(use->length());
  response->set_device(use->device());
  for (const GpuDevice& d : gpu_->devices()) {
    if (d.index == use->device()) response->set_device_uuid(d.uuid);
  }
  return grpc::Status::OK;
}

grpc::Status BufferServiceImpl::RegisterFile(grpc::ServerContext* context,
                                             const v1::RegisterFileRequest* request,
                                             v1::Buffer* response) {
  GPUMOVE_CHECK_CALLER(caller, *auth_, context, Access::kChange, "RegisterFile");
  GPUMOVE_CHECK_FIELDS(*request);
  if (auto forwarded = MaybeForward(request->node(), &v1::BufferService::Stub::RegisterFile,
                                    context, *request, response)) {
    return *forwarded;
  }
  if (file_roots_ == nullptr || file_roots_->empty()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("node ", node_, " has no file roots (gpumoved --file_roots)"));
  }
  // Before anything is opened or created.
  auto ttl = FromProto(request->lease_ttl());
  if (!ttl.ok()) return ToGrpcStatus(ttl.status());
  if (*ttl < absl::ZeroDuration()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "lease_ttl must not be negative");
  }
  FileRequest file;
  file.root = request->root();
  file.path = request->path();
  // A daemon with principals keeps each tenant's files beneath <root>/<tenant>/ (made by
  // the operator); an admin, who manages every tenant's, and the open daemon's one tenant
  // resolve from the root itself. An absolute path goes as it is: the roots refuse it.
  if (!auth_->open() && caller.role != Role::kAdmin && !absl::StartsWith(file.path, "/")) {
    const std::string& t = caller.tenant;
    if (t.empty() || t == "." || t == ".." || t.size() > 255 ||
        t.find_first_of(std::string("/\0", 2)) != std::string::npos) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          absl::StrCat("tenant ", Quoted(t.substr(0, 64)),
                                       " cannot name a directory beneath a file root"));
    }
    file.path = absl::StrCat(t, "/", file.path);
  }
  file.offset = request->offset();
  file.length = request->length();
  file.writable = request->writable();
  file.create = request->create();
  auto region = file_roots_->Open(file);
  if (!region.ok()) return ToGrpcStatus(region.status());
  FileBufferOptions options;
  options.file = *std::move(region);
  options.lease_ttl = *ttl;
  options.label = request->label();
  options.owner = caller.owner();
  auto info = registry_->AdoptFile(std::move(options));
  if (!info.ok()) return ToGrpcStatus(info.status());
  ToProto(*info, node_, response);
  return grpc::Status::OK;
}

}  // namespace gpumove
