#include "daemon/server/call_limits.h"

#include "absl/strings/str_cat.h"
#include "daemon/common/quote.h"

namespace gpumove {

LongCalls::Slot::~Slot() {
  if (calls_ != nullptr) calls_->Leave(principal_);
}

absl::StatusOr<LongCalls::Slot> LongCalls::Enter(const std::string& principal) {
  absl::MutexLock lock(&mu_);
  if (open_ >= limits_.total) {
    ++refused_;
    return absl::ResourceExhaustedError(
        absl::StrCat(open_,
                     " streams and waits are open on this node, its most (--max_open_calls): close "
                     "some or try again later"));
  }
  int& mine = by_principal_[principal];
  if (mine >= limits_.per_principal) {
    ++refused_;
    return absl::ResourceExhaustedError(
        absl::StrCat(Quoted(principal), " has ", mine,
                     " streams and waits open, the most one caller may "
                     "(--max_open_calls_per_principal): close some first"));
  }
  ++mine;
  ++open_;
  return Slot(this, principal);
}

void LongCalls::Leave(const std::string& principal) {
  absl::MutexLock lock(&mu_);
  --open_;
  auto it = by_principal_.find(principal);
  if (it != by_principal_.end() && --it->second <= 0) by_principal_.erase(it);
}

int LongCalls::open() const {
  absl::MutexLock lock(&mu_);
  return open_;
}

uint64_t LongCalls::refused() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

absl::StatusOr<LongCalls::Slot> EnterIf(LongCalls* calls, bool lasts,
                                        const std::string& principal) {
  if (calls == nullptr || !lasts) return LongCalls::Slot();
  return calls->Enter(principal);
}

}  // namespace gpumove
