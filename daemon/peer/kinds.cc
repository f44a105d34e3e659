#include "daemon/peer/kinds.h"

#include "absl/strings/str_cat.h"

namespace gpumove {

absl::StatusOr<MemoryKind> FromProto(v1::MemoryKind kind) {
  switch (kind) {
    case v1::MEMORY_KIND_UNSPECIFIED:
    case v1::HOST:
      return MemoryKind::kHost;
    case v1::PINNED_HOST:
      return MemoryKind::kPinnedHost;
    case v1::DEVICE:
      return MemoryKind::kDevice;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown memory kind ", kind));
  }
}

v1::MemoryKind ToProto(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost:
      return v1::HOST;
    case MemoryKind::kPinnedHost:
      return v1::PINNED_HOST;
    case MemoryKind::kDevice:
      return v1::DEVICE;
    case MemoryKind::kFile:
      return v1::FILE;
  }
  return v1::MEMORY_KIND_UNSPECIFIED;
}

absl::StatusOr<PathKind> FromProto(v1::Path path) {
  switch (path) {
    case v1::PATH_AUTO:
      return PathKind::kAuto;
    case v1::LOCAL:
      return PathKind::kLocal;
    case v1::CUDA_IPC:
      return PathKind::kCudaIpc;
    case v1::UCX:
      return PathKind::kUcx;
    case v1::MPI:
      return PathKind::kMpi;
    case v1::FILE_IO:
      return PathKind::kFile;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown path ", path));
  }
}

v1::Path ToProto(PathKind path) {
  switch (path) {
    case PathKind::kAuto:
      return v1::PATH_AUTO;
    case PathKind::kLocal:
      return v1::LOCAL;
    case PathKind::kCudaIpc:
      return v1::CUDA_IPC;
    case PathKind::kUcx:
      return v1::UCX;
    case PathKind::kMpi:
      return v1::MPI;
    case PathKind::kFile:
      return v1::FILE_IO;
  }
  return v1::PATH_AUTO;
}

}  // namespace gpumove
