#include "daemon/core/buffer_registry.h"

#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/common/log.h"
#include "daemon/common/quote.h"
#include "daemon/core/range.h"

namespace gpumove {
namespace {

// Start time of a process (field 22 of /proc/PID/stat), 0 when there is no such process.
// A pid reused by a new process has another start time.
uint64_t ProcessStart(int pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), {});
  const size_t close = stat.rfind(')');  // The name may hold spaces and parentheses.
  if (close == std::string::npos) return 0;
  std::vector<std::string> fields = absl::StrSplit(stat.substr(close + 2), ' ');
  uint64_t start = 0;
  // Fields after the name start at field 3 (state); field 22 is index 19.
  if (fields.size() < 20 || !absl::SimpleAtoi(fields[19], &start)) return 0;
  return start;
}

}  // namespace

BufferUse& BufferUse::operator=(BufferUse&& other) noexcept {
  if (this != &other) {
    Reset();
    registry_ = other.registry_;
    entry_ = std::move(other.entry_);
    data_ = other.data_;
    offset_ = other.offset_;
    length_ = other.length_;
    ending_ = other.ending_;
    other.registry_ = nullptr;
    other.entry_ = nullptr;
    other.ending_ = false;
  }
  return *this;
}

void BufferUse::Reset() {
  if (entry_ == nullptr) return;
  registry_->EndUse(static_cast<BufferRegistry::Entry*>(entry_.get()), ending_);
  entry_.reset();
  registry_ = nullptr;
  ending_ = false;
}

void BufferUse::MarkEnding() {
  if (entry_ == nullptr || ending_) return;
  registry_->MarkEnding(static_cast<BufferRegistry::Entry*>(entry_.get()));
  ending_ = true;
}

MemoryKind BufferUse::kind() const {
  return static_cast<BufferRegistry::Entry*>(entry_.get())->info.kind;
}
bool BufferUse::outside_pools() const {
  const auto& info = static_cast<BufferRegistry::Entry*>(entry_.get())->info;
  return info.imported || info.exportable;
}
int BufferUse::device() const {
  return static_cast<BufferRegistry::Entry*>(entry_.get())->info.device;
}
const std::string& BufferUse::buffer_id() const {
  return static_cast<BufferRegistry::Entry*>(entry_.get())->info.id;
}
const FileRegion* BufferUse::file() const {
  return static_cast<BufferRegistry::Entry*>(entry_.get())->info.file.get();
}

BufferRegistry::BufferRegistry(PoolSet* pools, absl::Duration default_lease)
    : pools_(pools), default_lease_(default_lease) {}

BufferRegistry::~BufferRegistry() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (reaper_.joinable()) reaper_.join();
  absl::MutexLock lock(&mu_);
  for (auto& [id, entry] : buffers_) Free(*entry);
}

absl::StatusOr<BufferInfo> BufferRegistry::Allocate(const AllocateOptions& options) {
  if (options.size == 0) return absl::InvalidArgumentError("size must be greater than 0");
  if (options.lease_ttl < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("lease_ttl must not be negative");
  }
  if (options.kind == MemoryKind::kDevice && options.device < 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad GPU index ", options.device));
  }
  if (options.exportable) return AllocateOwn(options);
  Pool* pool = pools_->Find(options.kind, options.device);
  if (pool == nullptr) {
    if (options.kind == MemoryKind::kDevice) {
      bool any_device = false;
      for (const auto& p : pools_->pools()) any_device |= p->kind() == MemoryKind::kDevice;
      if (any_device) {
        return absl::InvalidArgumentError(
            absl::StrCat("no DEVICE pool for GPU ", options.device, " on this node"));
      }
      return absl::FailedPreconditionError("this node has no GPU pools (host memory only)");
    }
    return absl::FailedPreconditionError(
        absl::StrCat("this node has no ", MemoryKindName(options.kind), " pool"));
  }
  if (quotas_ != nullptr) {
    if (absl::Status st = quotas_->Charge(options.owner, options.kind, options.size); !st.ok()) {
      return st;
    }
  }
  auto ptr = pool->Allocate(options.size);
  absl::Status st = ptr.status();
  if (st.ok() && scrub_) {
    st = scrub_(*ptr, options.kind, pool->device(), options.size);
    if (!st.ok()) pool->Free(*ptr);
  }
  if (!st.ok()) {
    if (quotas_ != nullptr) quotas_->Uncharge(options.owner, options.kind, options.size);
    return st;
  }

  auto entry = std::make_shared<Entry>();
  entry->pool = pool;
  entry->quotas = quotas_;
  entry->ptr = *ptr;
  BufferInfo& info = entry->info;
  info.size = options.size;
  info.kind = options.kind;
  info.device = pool->device();
  info.owner = options.owner;
  info.label = options.label;
  return Insert(std::move(entry), options.lease_ttl);
}

absl::StatusOr<BufferInfo> BufferRegistry::AllocateOwn(const AllocateOptions& options) {
  if (options.kind != MemoryKind::kDevice) {
    return absl::InvalidArgumentError(
        absl::StrCat("only DEVICE buffers can be exportable, not ", MemoryKindName(options.kind)));
  }
  if (!own_memory_) {
    return absl::FailedPreconditionError("this node has no GPU to allocate exportable memory on");
  }
  if (quotas_ != nullptr) {
    if (absl::Status st = quotas_->Charge(options.owner, options.kind, options.size); !st.ok()) {
      return st;
    }
  }
  auto own = own_memory_(options.device, options.size);
  if (!own.ok()) {
    if (quotas_ != nullptr) quotas_->Uncharge(options.owner, options.kind, options.size);
    return own.status();
  }
  auto entry = std::make_shared<Entry>();
  entry->quotas = quotas_;
  entry->ptr = own->data;
  entry->keepalive = std::move(own->keepalive);
  BufferInfo& info = entry->info;
  info.size = options.size;
  info.kind = MemoryKind::kDevice;
  info.device = options.device;
  info.owner = options.owner;
  info.label = options.label;
  info.exportable = true;
  return Insert(std::move(entry), options.lease_ttl);
}

BufferInfo BufferRegistry::Insert(std::shared_ptr<Entry> entry, absl::Duration lease_ttl) {
  BufferInfo& info = entry->info;
  info.create_time = absl::Now();
  info.lease_ttl = lease_ttl > absl::ZeroDuration() ? lease_ttl : default_lease_;
  if (info.lease_ttl > absl::ZeroDuration()) {
    info.lease_expire_time = info.create_time + info.lease_ttl;
  }
  absl::MutexLock lock(&mu_);
  do {
    info.id = absl::StrFormat("b-%016x", absl::Uniform<uint64_t>(rng_));
  } while (buffers_.contains(info.id));
  buffers_.emplace(info.id, entry);
  return info;
}

void BufferRegistry::Free(Entry& entry) {
  if (entry.pool != nullptr) {
    entry.pool->Free(entry.ptr);
    entry.pool = nullptr;
  }
  if (entry.quotas != nullptr) {
    entry.quotas->Uncharge(entry.info.owner, entry.info.kind, entry.info.size);
    entry.quotas = nullptr;
  }
  entry.keepalive.reset();
  entry.info.file.reset();  // Closes a FILE buffer's file.
}

absl::StatusOr<BufferInfo> BufferRegistry::Adopt(AdoptOptions options) {
  if (options.data == nullptr || options.size == 0) {
    return absl::InvalidArgumentError("adopted memory needs an address and a size");
  }
  if (options.lease_ttl < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("lease_ttl must not be negative");
  }
  auto entry = std::make_shared<Entry>();
  if (options.owner_pid != 0) {
    entry->owner_start = ProcessStart(options.owner_pid);
    if (options.owner_pid < 0 || entry->owner_start == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "process ", options.owner_pid, " is not visible to the daemon (another PID namespace?)"));
    }
  }
  entry->ptr = options.data;
  entry->keepalive = std::move(options.keepalive);
  BufferInfo& info = entry->info;
  info.size = options.size;
  info.kind = options.kind;
  info.device = options.device;
  info.owner = options.owner;
  info.label = options.label;
  info.imported = true;
  info.owner_pid = options.owner_pid;
  return Insert(std::move(entry), options.lease_ttl);
}

absl::StatusOr<BufferInfo> BufferRegistry::AdoptFile(FileBufferOptions options) {
  if (options.file == nullptr || options.file->length() == 0) {
    return absl::InvalidArgumentError("a file buffer needs a file region of at least one byte");
  }
  if (options.lease_ttl < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("lease_ttl must not be negative");
  }
  auto entry = std::make_shared<Entry>();
  BufferInfo& info = entry->info;
  info.size = options.file->length();
  info.kind = MemoryKind::kFile;
  info.device = kHostDevice;
  info.owner = options.owner;
  info.label = options.label;
  info.file = std::move(options.file);
  return Insert(std::move(entry), options.lease_ttl);
}

std::shared_ptr<BufferRegistry::Entry> BufferRegistry::FindLocked(const std::string& owner,
                                                                  const std::string& id) const {
  auto it = buffers_.find(id);
  // Another tenant's buffer is reported as missing, so ids leak nothing.
  if (it == buffers_.end() || !OwnerSees(owner, it->second->info.owner)) return nullptr;
  return it->second;
}

absl::Status BufferRegistry::Release(const std::string& owner, const std::string& id,
                                     absl::Duration ending_wait) {
  std::shared_ptr<Entry> entry;
  {
    absl::MutexLock lock(&mu_);
    entry = FindLocked(owner, id);
    if (entry == nullptr) return absl::NotFoundError(absl::StrCat("no buffer ", Quoted(id)));
    // Uses that are all ending (a peer's last copy, already seen through by the move's
    // runner) end within moments: a client told the move is done may release at once.
    const Entry* e = entry.get();
    auto settled = [e]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return e->info.active_uses == 0 || e->info.active_uses > e->ending_uses;
    };
    if (!settled()) {
      mu_.AwaitWithTimeout(absl::Condition(&settled), ending_wait);
      if (FindLocked(owner, id) != entry) {
        return absl::NotFoundError(absl::StrCat("no buffer ", Quoted(id)));  // Released meanwhile.
      }
    }
    if (entry->info.active_uses > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "buffer ", id, " is in use by ", entry->info.active_uses, " transfer(s) or stream(s)"));
    }
    buffers_.erase(id);
  }
  Free(*entry);
  return absl::OkStatus();
}

absl::StatusOr<BufferInfo> BufferRegistry::Get(const std::string& owner,
                                               const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto entry = FindLocked(owner, id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("no buffer ", Quoted(id)));
  return entry->info;
}

std::vector<BufferInfo> BufferRegistry::List(const std::string& owner) const {
  std::vector<BufferInfo> out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, entry] : buffers_) {
      if (OwnerSees(owner, entry->info.owner)) out.push_back(entry->info);
    }
  }
  std::sort(out.begin(), out.end(), [](const BufferInfo& a, const BufferInfo& b) {
    return std::tie(a.create_time, a.id) < std::tie(b.create_time, b.id);
  });
  return out;
}

absl::StatusOr<BufferInfo> BufferRegistry::RenewLease(const std::string& owner,
                                                      const std::string& id,
                                                      absl::Duration ttl) {
  if (ttl < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("lease_ttl must not be negative");
  }
  absl::MutexLock lock(&mu_);
  auto entry = FindLocked(owner, id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("no buffer ", Quoted(id)));
  BufferInfo& info = entry->info;
  if (!info.lease_expire_time.has_value() && ttl == absl::ZeroDuration()) {
    return absl::FailedPreconditionError(
        absl::StrCat("buffer ", Quoted(id), " has no lease; give a lease_ttl to start one"));
  }
  if (ttl > absl::ZeroDuration()) info.lease_ttl = ttl;
  info.lease_expire_time = absl::Now() + info.lease_ttl;
  return info;
}

absl::StatusOr<BufferUse> BufferRegistry::Acquire(const std::string& owner, const std::string& id,
                                                  uint64_t offset, uint64_t length, bool files) {
  absl::MutexLock lock(&mu_);
  auto entry = FindLocked(owner, id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("no buffer ", Quoted(id)));
  if (entry->info.kind == MemoryKind::kFile && !files) {
    return absl::FailedPreconditionError(
        absl::StrCat("buffer ", Quoted(id),
                     " is a file: it moves only in transfers on its own node (path FILE_IO)"));
  }
  auto resolved = ResolveRange(entry->info.size, offset, length);
  if (!resolved.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("buffer ", Quoted(id), ": ", resolved.status().message()));
  }
  ++entry->info.active_uses;
  BufferUse use;
  use.registry_ = this;
  use.entry_ = entry;
  use.data_ = entry->ptr != nullptr ? entry->ptr + offset : nullptr;  // Null: a file.
  use.offset_ = offset;
  use.length_ = *resolved;
  return use;
}

void BufferRegistry::MarkEnding(Entry* entry) {
  absl::MutexLock lock(&mu_);
  ++entry->ending_uses;
}

void BufferRegistry::EndUse(Entry* entry, bool ending) {
  bool free_now = false;
  {
    absl::MutexLock lock(&mu_);
    --entry->info.active_uses;
    if (ending) --entry->ending_uses;
    free_now = entry->doomed && entry->info.active_uses == 0;
    if (free_now) entry->doomed = false;
  }
  if (free_now) {
    LOG(INFO) << "buffer " << entry->info.id << " freed after its last use (lease expired)";
    Free(*entry);
  }
}

int BufferRegistry::ExpireLeases(absl::Time now) {
  std::vector<std::shared_ptr<Entry>> to_free;
  int expired = 0;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = buffers_.begin(); it != buffers_.end();) {
      const BufferInfo& info = it->second->info;
      const bool leased_out = info.lease_expire_time.has_value() && *info.lease_expire_time <= now;
      const bool orphaned =
          info.owner_pid > 0 && ProcessStart(info.owner_pid) != it->second->owner_start;
      if (!leased_out && !orphaned) {
        ++it;
        continue;
      }
      ++expired;
      LOG(INFO) << "buffer " << info.id
                << (orphaned ? absl::StrCat(": owner process ", info.owner_pid, " exited")
                             : std::string(" lease expired"))
                << (info.active_uses > 0 ? "; freed when its transfers end" : "; freed");
      if (info.active_uses > 0) {
        it->second->doomed = true;
      } else {
        to_free.push_back(it->second);
      }
      buffers_.erase(it++);
    }
  }
  for (auto& entry : to_free) Free(*entry);
  return expired;
}

void BufferRegistry::StartLeaseReaper(absl::Duration period) {
  reaper_ = std::thread([this, period] {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        auto stopped = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_; };
        mu_.AwaitWithTimeout(absl::Condition(&stopped), period);
        if (stop_) return;
      }
      ExpireLeases(absl::Now());
    }
  });
}

size_t BufferRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return buffers_.size();
}

}  // namespace gpumove
