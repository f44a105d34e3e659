#include "daemon/core/prepared_pieces.h"

#include <algorithm>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "daemon/common/quote.h"
#include "daemon/core/buffer_registry.h"

namespace gpumove {

absl::StatusOr<PreparedList> PreparedPieceLists::Add(const std::string& owner,
                                                     const Segments& pieces, std::string label) {
  const uint64_t n = pieces.list.size();
  {
    absl::MutexLock lock(&mu_);
    auto found = usage_.find(owner);
    const Usage u = found == usage_.end() ? Usage{} : found->second;
    if (u.lists + 1 > limits_.lists_per_owner) {
      return absl::ResourceExhaustedError(
          absl::StrCat("this tenant keeps ", u.lists, " prepared piece lists already, at most ",
                       limits_.lists_per_owner, " (--max_prepared_lists); release some"));
    }
    if (n > limits_.pieces_per_owner || u.pieces > limits_.pieces_per_owner - n) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "this tenant keeps ", u.pieces, " prepared pieces already; ", n, " more would pass ",
          limits_.pieces_per_owner, " (--max_prepared_pieces); release some"));
    }
  }
  // The rebased form is made here, once, rather than by every move that names the list.
  auto kept = std::make_shared<Segments>(pieces);
  kept->rebased = nullptr;
  kept->serial = NextListSerial();
  if (kept->src_lo != 0 || kept->dst_lo != 0) kept->rebased = Rebased(*kept);
  PreparedList list;
  thread_local absl::BitGen rng;
  list.id = absl::StrFormat("p-%016x.%s", absl::Uniform<uint64_t>(rng), node_);
  list.owner = owner;
  list.label = std::move(label);
  list.created = absl::Now();
  list.pieces = std::move(kept);
  absl::MutexLock lock(&mu_);
  Usage& u = usage_[owner];  // Checked again: another Add may have come in between.
  if (u.lists + 1 > limits_.lists_per_owner || n > limits_.pieces_per_owner ||
      u.pieces > limits_.pieces_per_owner - n) {
    return absl::ResourceExhaustedError(
        "this tenant's prepared piece lists reached --max_prepared_lists or "
        "--max_prepared_pieces; release some");
  }
  if (!lists_.emplace(list.id, list).second) {
    return absl::AbortedError("a prepared list id came twice; prepare it again");
  }
  ++u.lists;
  u.pieces += n;
  return list;
}

absl::StatusOr<PreparedList> PreparedPieceLists::Find(const std::string& owner,
                                                      const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = lists_.find(id);
  if (it == lists_.end() || !OwnerSees(owner, it->second.owner)) {
    return absl::NotFoundError(absl::StrCat("no prepared piece list ", Quoted(id)));
  }
  return it->second;
}

absl::Status PreparedPieceLists::Remove(const std::string& owner, const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = lists_.find(id);
  if (it == lists_.end() || !OwnerSees(owner, it->second.owner)) {
    return absl::NotFoundError(absl::StrCat("no prepared piece list ", Quoted(id)));
  }
  Usage& u = usage_[it->second.owner];
  --u.lists;
  u.pieces -= it->second.pieces->list.size();
  if (u.lists == 0) usage_.erase(it->second.owner);
  lists_.erase(it);
  return absl::OkStatus();
}

std::vector<PreparedList> PreparedPieceLists::List(const std::string& owner) const {
  std::vector<PreparedList> out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, list] : lists_) {
      if (OwnerSees(owner, list.owner)) out.push_back(list);
    }
  }
  std::sort(out.begin(), out.end(), [](const PreparedList& a, const PreparedList& b) {
    return a.created != b.created ? a.created < b.created : a.id < b.id;
  });
  return out;
}

size_t PreparedPieceLists::lists() const {
  absl::MutexLock lock(&mu_);
  return lists_.size();
}

uint64_t PreparedPieceLists::pieces() const {
  absl::MutexLock lock(&mu_);
  uint64_t n = 0;
  for (const auto& [owner, u] : usage_) n += u.pieces;
  return n;
}

}  // namespace gpumove
