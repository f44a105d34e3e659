#include "daemon/gpu/ipc.h"

namespace gpumove {
namespace {

bool Holds(const IpcTable::Mapping& m, const char* ptr, uint64_t length) {
  return ptr >= m.base && length <= m.size && static_cast<uint64_t>(ptr - m.base) <= m.size - length;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const IpcTable::Mapping>> IpcTable::Open(
    int device, const std::string& handle) {
  absl::MutexLock lock(&mu_);
  if (auto it = open_.find(handle); it != open_.end()) {
    if (auto live = it->second.lock()) return live;
  }
  auto mapped = gpu_->IpcOpen(device, handle);
  if (!mapped.ok()) return mapped.status();
  auto* m = new Mapping{handle, device, mapped->base, mapped->size};
  GpuRuntime* gpu = gpu_;
  std::shared_ptr<const Mapping> shared(m, [this, gpu](const Mapping* m) {
    {
      absl::MutexLock lock(&mu_);
      auto it = open_.find(m->handle);
      if (it != open_.end() && it->second.expired()) open_.erase(it);
    }
    gpu->IpcClose(m->device, m->base);
    delete m;
  });
  open_[handle] = shared;
  return shared;
}

absl::Status IpcTable::Export(int device, char* base, uint64_t size, Scope scope) {
  auto handle = gpu_->IpcExport(device, base);
  if (!handle.ok()) return handle.status();
  absl::MutexLock lock(&mu_);
  exports_.push_back(Exported{Mapping{*handle, device, base, size}, scope});
  return absl::OkStatus();
}

void IpcTable::Unexport(const char* base) {
  absl::MutexLock lock(&mu_);
  std::erase_if(exports_, [base](const Exported& e) { return e.mapping.base == base; });
}

std::optional<IpcTable::Ref> IpcTable::Find(const char* ptr, uint64_t length) const {
  // Strong references taken under the lock are dropped after it: the last one closes the
  // mapping, which takes the lock.
  std::vector<std::shared_ptr<const Mapping>> seen;
  absl::MutexLock lock(&mu_);
  for (const Exported& e : exports_) {
    const Mapping& m = e.mapping;
    if (Holds(m, ptr, length)) {
      return Ref{m.handle, static_cast<uint64_t>(ptr - m.base), e.scope == Scope::kPool};
    }
  }
  for (const auto& [handle, weak] : open_) {
    seen.push_back(weak.lock());
    const Mapping* m = seen.back().get();
    if (m != nullptr && Holds(*m, ptr, length)) {
      return Ref{m->handle, static_cast<uint64_t>(ptr - m->base)};
    }
  }
  return std::nullopt;
}

size_t IpcTable::open_count() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [handle, weak] : open_) n += !weak.expired();
  return n;
}

}  // namespace gpumove
