#include "daemon/cluster/holds.h"

#include "absl/strings/str_cat.h"
#include "daemon/common/log.h"

namespace gpumove {

absl::StatusOr<BufferUse*> HoldTable::Hold(const std::string& from_node, uint64_t from_incarnation,
                                           const std::string& transfer_id, const std::string& owner,
                                           const std::string& buffer_id, uint64_t offset,
                                           uint64_t length) {
  auto use = registry_->Acquire(owner, buffer_id, offset, length);
  if (!use.ok()) return use.status();
  const std::string key = absl::StrCat(from_node, "\n", transfer_id);
  absl::MutexLock lock(&mu_);
  auto& slot = holds_[key];
  if (slot != nullptr) {
    return absl::AlreadyExistsError(
        absl::StrCat("transfer ", transfer_id, " already holds a range"));
  }
  slot = std::make_unique<Entry>();
  slot->incarnation = from_incarnation;
  slot->use = *std::move(use);
  return &slot->use;
}

absl::StatusOr<uint64_t> HoldTable::Complete(const std::string& from_node,
                                             const std::string& transfer_id, bool checksum) {
  std::unique_ptr<Entry> entry;
  {
    absl::MutexLock lock(&mu_);
    auto it = holds_.find(absl::StrCat(from_node, "\n", transfer_id));
    if (it == holds_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no hold for transfer ", transfer_id, " from ", from_node));
    }
    entry = std::move(it->second);
    holds_.erase(it);
  }
  if (!checksum) return 0;
  const BufferUse& u = entry->use;
  return hasher_(Endpoint{u.data(), u.kind(), u.device()}, u.length());
}

int HoldTable::ReleaseFrom(const std::string& node, uint64_t incarnation) {
  std::vector<std::unique_ptr<Entry>> dropped;
  {
    absl::MutexLock lock(&mu_);
    const std::string prefix = absl::StrCat(node, "\n");
    for (auto it = holds_.begin(); it != holds_.end();) {
      if (it->first.rfind(prefix, 0) == 0 && it->second->incarnation == incarnation) {
        dropped.push_back(std::move(it->second));
        holds_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  if (!dropped.empty()) {
    LOG(WARNING) << "released " << dropped.size() << " range(s) held for moves run by " << node;
  }
  return static_cast<int>(dropped.size());
}

size_t HoldTable::size() const {
  absl::MutexLock lock(&mu_);
  return holds_.size();
}

}  // namespace gpumove
