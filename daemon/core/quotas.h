// Per-tenant quotas: bytes of each pool kind a tenant's buffers may hold on this node, and
// transfers it may have queued or running here. Past a limit, RESOURCE_EXHAUSTED saying
// which. Owners are tenants (the registry's and scheduler's owner); administrators
// (kAnyOwner) have none.
#ifndef GPUMOVE_DAEMON_CORE_QUOTAS_H_
#define GPUMOVE_DAEMON_CORE_QUOTAS_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "daemon/memory/pool.h"

namespace gpumove {

struct QuotaLimits {
  // By MemoryKind (host, pinned, device); unset: no limit.
  std::array<std::optional<uint64_t>, 3> bytes;
  std::optional<uint64_t> transfers;
};

// The lines of a quota file: `tenant,host,pinned,device,transfers`, sizes as ParseBytes
// reads them, `-` for no limit; tenant `*` is every tenant not named. Blank lines and
// lines starting with '#' are skipped; INVALID_ARGUMENT naming the line otherwise.
absl::StatusOr<absl::flat_hash_map<std::string, QuotaLimits>> ParseQuotaFile(
    absl::string_view text);

class Quotas {
 public:
  // Replaces the limits (what is in use stays counted; a tenant already past a new limit
  // gets nothing more until it is under it).
  void Set(absl::flat_hash_map<std::string, QuotaLimits> limits);

  // Counts `bytes` of `kind` for `owner`, or RESOURCE_EXHAUSTED when that would pass its
  // limit (nothing counted). Uncharge gives them back.
  absl::Status Charge(const std::string& owner, MemoryKind kind, uint64_t bytes);
  void Uncharge(const std::string& owner, MemoryKind kind, uint64_t bytes);
  // The limit on `owner`'s transfers in flight; unset: none.
  std::optional<uint64_t> TransferLimit(const std::string& owner) const;

  uint64_t used(const std::string& owner, MemoryKind kind) const;

 private:
  const QuotaLimits* LimitsLocked(const std::string& owner) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, QuotaLimits> limits_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::array<uint64_t, 3>> used_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_CORE_QUOTAS_H_
