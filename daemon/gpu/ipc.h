// CUDA IPC bookkeeping for one daemon: the device pools it exports to other processes on
// this host, and the allocations of other processes it has mapped (client memory lent
// to it, a peer daemon's pool). A handle is opened once and shared; it is closed when
// the last holder lets go.
#ifndef GPUMOVE_DAEMON_GPU_IPC_H_
#define GPUMOVE_DAEMON_GPU_IPC_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/gpu/gpu.h"

namespace gpumove {

class IpcTable {
 public:
  // `gpu` must outlive the table and every mapping it hands out.
  explicit IpcTable(GpuRuntime* gpu) : gpu_(gpu) {}

  // Another process's allocation, mapped here.
  struct Mapping {
    std::string handle;
    int device = 0;
    char* base = nullptr;
    uint64_t size = 0;
  };
  // Maps `handle` on `device`, or shares the mapping already open. INVALID_ARGUMENT for a
  // handle the driver refuses; FAILED_PRECONDITION without a GPU.
  absl::StatusOr<std::shared_ptr<const Mapping>> Open(int device, const std::string& handle);

  // What a handle opens, and so who may have it. A device pool holds every tenant's
  // buffers: its handle goes only to peer daemons (authenticated members of the cluster).
  // An allocation of one buffer of its own (Allocate with exportable) may go to that
  // buffer's owner.
  enum class Scope { kPool, kOneBuffer };

  // Offers our allocation [base, base+size) on `device` to other processes on this host.
  absl::Status Export(int device, char* base, uint64_t size, Scope scope = Scope::kPool);
  // Stops offering the allocation at `base` (before it is freed).
  void Unexport(const char* base);

  // How another process on this host reaches [ptr, ptr+length): the handle of the
  // allocation holding it (one we export, or one we mapped) and the offset in it.
  struct Ref {
    std::string handle;
    uint64_t offset = 0;
    // One of our device pools (Scope::kPool): never for a client.
    bool pool = false;
  };
  std::optional<Ref> Find(const char* ptr, uint64_t length) const;

  size_t open_count() const;

 private:
  GpuRuntime* const gpu_;
  mutable absl::Mutex mu_;
  struct Exported {
    Mapping mapping;
    Scope scope;
  };
  std::vector<Exported> exports_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::weak_ptr<const Mapping>> open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_GPU_IPC_H_
