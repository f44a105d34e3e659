#include "daemon/path/ucx/ucx_shares.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <optional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace gpumove {
namespace {

struct Share {
  uint64_t offset = 0;
  uint64_t length = 0;
  size_t lane = 0;
  std::atomic<uint64_t> done{0};
  absl::Status status;
};

// The lanes of one move: which failed, how many shares each runs now.
class LaneBook {
 public:
  LaneBook(const ShareLanes& lanes, const std::function<bool(size_t)>& may_take)
      : lanes_(lanes), may_take_(may_take) {
    for (size_t l : lanes.use) ++running_[l];
  }

  // `lane` failed under a share of `bytes`: the lane the share goes to next, if any (none
  // unless `another`).
  std::optional<size_t> MoveOff(size_t lane, const absl::Status& why, uint64_t bytes,
                                bool another) {
    absl::MutexLock lock(&mu_);
    if (std::find(failed_.begin(), failed_.end(), lane) == failed_.end()) {
      failed_.push_back(lane);
      why_.push_back(why);
    }
    --running_[lane];
    if (!another) return std::nullopt;
    auto usable = [this](size_t l) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return std::find(failed_.begin(), failed_.end(), l) == failed_.end();
    };
    // The lane running the fewest shares, a spare first on a tie.
    std::optional<size_t> next;
    for (const std::vector<size_t>* list : {&lanes_.spare, &lanes_.use}) {
      for (size_t l : *list) {
        if (usable(l) && (!next || running_[l] < running_[*next]) &&
            (!may_take_ || may_take_(l))) {
          next = l;
        }
      }
    }
    if (next) {
      ++running_[*next];
      resent_ += bytes;
    }
    return next;
  }

  void Ended(size_t lane) {
    absl::MutexLock lock(&mu_);
    --running_[lane];
  }

  void Fill(SharesOutcome& out) {
    absl::MutexLock lock(&mu_);
    out.failed = failed_;
    out.why = why_;
    out.resent = resent_;
  }

 private:
  const ShareLanes& lanes_;
  const std::function<bool(size_t)>& may_take_;
  absl::Mutex mu_;
  std::vector<size_t> failed_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> why_ ABSL_GUARDED_BY(mu_);
  std::map<size_t, int> running_ ABSL_GUARDED_BY(mu_);
  uint64_t resent_ ABSL_GUARDED_BY(mu_) = 0;
};

// Runs `s` on its lane, and again on another while its lanes fault. Each try is on a lane
// that had not failed when it was chosen, and each fault marks the lane failed: at most
// one try a lane (`lanes`, the bound kept besides).
void RunShare(Share& s, LaneBook& book, size_t lanes, const ShareRma& rma,
              const std::function<bool(uint64_t)>& on_progress) {
  for (size_t tries = 0;; ++tries) {
    s.done = 0;
    s.status = rma(s.lane, s.offset, s.length, on_progress);
    if (s.status.ok() || !LaneFault(s.status)) break;
    std::optional<size_t> next = book.MoveOff(s.lane, s.status, s.length, tries + 1 < lanes);
    if (!next) return;  // No lane left: the share fails with its lane's error.
    s.lane = *next;
  }
  book.Ended(s.lane);
}

}  // namespace

bool LaneFault(const absl::Status& st) { return absl::IsUnavailable(st); }

SharesOutcome RunShares(uint64_t length, const ShareLanes& lanes, const ShareRma& rma,
                        const std::function<bool(uint64_t)>& progress,
                        absl::Duration report_every,
                        const std::function<bool(size_t)>& may_take) {
  const size_t shares = std::max<size_t>(lanes.use.size(), 1);
  const size_t tries = lanes.use.size() + lanes.spare.size();
  std::vector<Share> share(shares);
  const uint64_t each = (length / shares + 4095) & ~uint64_t{4095};
  for (size_t i = 0; i < shares; ++i) {
    share[i].lane = lanes.use.empty() ? 0 : lanes.use[i];
    share[i].offset = std::min<uint64_t>(i * each, length);
    share[i].length =
        i + 1 == shares ? length - share[i].offset : std::min(each, length - share[i].offset);
  }
  LaneBook book(lanes, may_take);
  SharesOutcome out;
  if (shares == 1) {
    // One share on this thread: its progress is the move's (never going back on a retry).
    uint64_t high = 0;
    RunShare(share[0], book, tries, rma, [&](uint64_t done) {
      high = std::max(high, done);
      return progress(high);
    });
  } else {
    std::atomic<bool> stop{false};
    std::atomic<size_t> running{shares};
    absl::Notification finished;
    std::vector<std::thread> threads;
    threads.reserve(shares);
    for (size_t i = 0; i < shares; ++i) {
      threads.emplace_back([&, i] {
        Share& s = share[i];
        RunShare(s, book, tries, rma, [&s, &stop](uint64_t done) {
          s.done = done;
          return !stop.load();
        });
        if (!s.status.ok()) stop = true;  // Its lanes are all gone, or it was cancelled.
        if (running.fetch_sub(1) == 1) finished.Notify();
      });
    }
    uint64_t high = 0;
    auto report = [&] {
      uint64_t done = 0;
      for (const Share& s : share) done += s.done.load();
      high = std::max(high, done);
      if (!progress(high)) stop = true;
    };
    while (!finished.WaitForNotificationWithTimeout(report_every)) report();
    for (std::thread& t : threads) t.join();
    bool failed = false;
    for (const Share& s : share) failed |= !s.status.ok();
    if (!failed) report();
  }
  book.Fill(out);
  absl::Status cancelled;
  for (const Share& s : share) {
    if (s.status.ok()) {
      out.carried.emplace_back(s.lane, s.length);
    } else if (absl::IsCancelled(s.status)) {
      cancelled = s.status;
    } else if (out.status.ok()) {
      out.status = s.status;  // The others stopped because of it.
    }
  }
  if (out.status.ok()) out.status = cancelled;
  return out;
}

}  // namespace gpumove
