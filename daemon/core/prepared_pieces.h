// Prepared piece lists: vectored moves' piece lists kept by a node for moves that name
// them again and again (a KV cache's block layout, moved layer by layer and request by
// request). A list is checked and expanded once (MakeSegments / ExpandBlocks), kept with
// its rebased form, and handed to each move that names it by id: such a Submit carries an
// id instead of a list of up to ~1 MB and skips parsing and checking it. Lists belong to
// a tenant (another tenant's id is NOT_FOUND, as if it did not exist); each tenant may
// keep a bounded number of lists and pieces. A released list stays alive for the moves
// that hold it until they end.
#ifndef GPUMOVE_DAEMON_CORE_PREPARED_PIECES_H_
#define GPUMOVE_DAEMON_CORE_PREPARED_PIECES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/core/segments.h"

namespace gpumove {

struct PreparedList {
  std::string id;     // "p-<hex>.<node>"
  std::string owner;  // The tenant it belongs to.
  std::string label;
  absl::Time created;
  std::shared_ptr<const Segments> pieces;  // With `rebased` set when its offsets need it.
};

class PreparedPieceLists {
 public:
  struct Limits {
    size_t lists_per_owner = 4096;
    uint64_t pieces_per_owner = uint64_t{1} << 22;
  };
  PreparedPieceLists(std::string node, Limits limits) : node_(std::move(node)), limits_(limits) {}

  // Keeps `pieces` (checked already) for `owner`. RESOURCE_EXHAUSTED past the owner's
  // limits.
  absl::StatusOr<PreparedList> Add(const std::string& owner, const Segments& pieces,
                                   std::string label);
  // The list `id` as `owner` sees it (an admin, kAnyOwner, sees every tenant's):
  // NOT_FOUND otherwise.
  absl::StatusOr<PreparedList> Find(const std::string& owner, const std::string& id) const;
  // NOT_FOUND as Find.
  absl::Status Remove(const std::string& owner, const std::string& id);
  // The lists `owner` sees, oldest first.
  std::vector<PreparedList> List(const std::string& owner) const;
  // Lists and pieces kept, over every tenant.
  size_t lists() const;
  uint64_t pieces() const;

  const Limits& limits() const { return limits_; }

 private:
  struct Usage {
    size_t lists = 0;
    uint64_t pieces = 0;
  };
  const std::string node_;
  const Limits limits_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, PreparedList> lists_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Usage> usage_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_CORE_PREPARED_PIECES_H_
