// Priority classes and fair shares (issue 56): the class of a move (TransferSpec.priority),
// tenants' weights from the operator's file, and the queue the scheduler's workers take
// ready moves from: by class first (latency, normal, bulk), then weighted fair share of
// bytes across tenants within a class (deficit round robin), with a turn for a lower
// class whose oldest move has waited past a bound. It only orders moves that are ready:
// moves over overlapping bytes still wait for each other in submission order
// (range_order.h) whatever their classes.
#ifndef GPUMOVE_DAEMON_CORE_QOS_H_
#define GPUMOVE_DAEMON_CORE_QOS_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gpumove {

// Highest first. The numbers index arrays; the public API's enum is numbered apart.
enum class Priority { kLatency = 0, kNormal = 1, kBulk = 2 };
inline constexpr int kPriorities = 3;
// "latency", "normal", "bulk".
const char* PriorityName(Priority p);
// The class named so (as PriorityName writes it); nullopt for anything else.
std::optional<Priority> ParsePriority(absl::string_view name);
// Whether class `p` is above `cap` (a higher class than the cap allows).
inline bool Above(Priority p, Priority cap) { return static_cast<int>(p) < static_cast<int>(cap); }

// The weights file: `tenant weight` lines (a comma or spaces between), weight an integer
// 1..kMaxTenantWeight; tenant `*` is every tenant not named (default 1). Blank lines and
// lines starting with '#' are skipped; INVALID_ARGUMENT naming the line otherwise (and
// past kMaxWeightedTenants lines of tenants).
inline constexpr uint32_t kMaxTenantWeight = 1000;
inline constexpr size_t kMaxWeightedTenants = 4096;
absl::StatusOr<absl::flat_hash_map<std::string, uint32_t>> ParseTenantWeights(
    absl::string_view text);

// The weights in force; thread-safe (the file is re-read on another thread).
class TenantWeights {
 public:
  void Set(absl::flat_hash_map<std::string, uint32_t> weights) ABSL_LOCKS_EXCLUDED(mu_);
  // The tenant's weight: its own, else `*`'s, else 1.
  uint32_t Of(const std::string& tenant) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, uint32_t> weights_ ABSL_GUARDED_BY(mu_);
};

struct QosOptions {
  // A lower class whose oldest ready move has waited this long gets a turn (see
  // starved_turn_every) even while higher classes have moves ready.
  absl::Duration starvation_bound = absl::Milliseconds(500);
  // Of the picks, at most one in this many is such a turn: a backlog of old bulk moves
  // takes no more than that share from latency moves.
  int starved_turn_every = 4;
  // Bytes a tenant may start per round of the deficit round robin, per unit of weight.
  uint64_t quantum = uint64_t{1} << 20;
};

// Not thread-safe: the scheduler's lock guards it. `now` is passed in (tests drive time).
template <typename T>
class QosQueue {
 public:
  // `weights` (null: every tenant weighs 1) must outlive the queue.
  explicit QosQueue(QosOptions options = {}, const TenantWeights* weights = nullptr)
      : options_(options), weights_(weights) {}

  void Push(T value, const std::string& tenant, Priority p, uint64_t bytes, absl::Time now) {
    Class& c = classes_[Index(p)];
    auto [it, fresh] = c.tenants.try_emplace(tenant);
    if (fresh) c.active.push_back(tenant);
    // Costs are capped so that deficits cannot overflow (a move of 2^50 bytes is one
    // petabyte: it waits as many rounds as that would anyway).
    it->second.items.push_back(Item{std::move(value), std::min(bytes, kMaxCost), now});
    ++c.size;
    ++size_;
  }
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  size_t size(Priority p) const { return classes_[Index(p)].size; }

  // The next move of class `p` alone (fair share among its tenants). Must not be
  // size(p) == 0.
  T PopClass(Priority p, absl::Time /*now*/) { return TakeFair(Index(p)); }

  // The next move. Must not be empty().
  T Pop(absl::Time now) {
    int top = 0;
    while (classes_[top].size == 0) ++top;  // Bounded: size_ > 0.
    ++since_starved_;
    if (since_starved_ >= std::max(1, options_.starved_turn_every)) {
      if (std::optional<int> c = Starved(top, now)) {
        since_starved_ = 0;
        return TakeOldest(*c);
      }
    }
    return TakeFair(top);
  }

 private:
  static constexpr uint64_t kMaxCost = uint64_t{1} << 50;
  struct Item {
    T value;
    uint64_t bytes;
    absl::Time since;
  };
  struct TenantQueue {
    std::deque<Item> items;
    int64_t deficit = 0;
    bool granted = false;  // Its quantum for this visit of the round was added.
  };
  struct Class {
    absl::flat_hash_map<std::string, TenantQueue> tenants;
    std::vector<std::string> active;  // Tenants with items, in round order.
    size_t cur = 0;                   // Whose turn in the round.
    size_t size = 0;
  };

  static int Index(Priority p) { return std::clamp(static_cast<int>(p), 0, kPriorities - 1); }
  int64_t Quantum(const std::string& tenant) const {
    const uint32_t w = weights_ != nullptr ? weights_->Of(tenant) : 1;
    return static_cast<int64_t>(options_.quantum * std::clamp<uint32_t>(w, 1, kMaxTenantWeight));
  }

  // The lower class than `top` whose oldest move has waited past the bound the longest.
  std::optional<int> Starved(int top, absl::Time now) const {
    std::optional<int> found;
    absl::Time oldest = absl::InfiniteFuture();
    for (int c = top + 1; c < kPriorities; ++c) {
      for (const auto& [tenant, q] : classes_[c].tenants) {
        const absl::Time since = q.items.front().since;
        if (now - since > options_.starvation_bound && since < oldest) {
          oldest = since;
          found = c;
        }
      }
    }
    return found;
  }

  // Class `c`'s oldest move, charged to its tenant (its deficit may go below zero: it
  // pays the turn back in the round).
  T TakeOldest(int c) {
    Class& k = classes_[c];
    size_t at = 0;
    for (size_t i = 1; i < k.active.size(); ++i) {
      if (k.tenants[k.active[i]].items.front().since <
          k.tenants[k.active[at]].items.front().since) {
        at = i;
      }
    }
    return Take(k, at);
  }

  // Deficit round robin over class `c`'s tenants.
  T TakeFair(int c) {
    Class& k = classes_[c];
    const size_t n = k.active.size();
    // Skip whole rounds in which nobody could start anything (a move much larger than
    // the quantum): each tenant needs `need / quantum` more grants; all get the fewest of
    // those less one at once, so the next pass of the round starts someone.
    int64_t rounds = INT64_MAX;
    for (size_t i = 0; i < n; ++i) {
      const TenantQueue& q = k.tenants[k.active[i]];
      const int64_t need = static_cast<int64_t>(q.items.front().bytes) - q.deficit;
      const int64_t quantum = Quantum(k.active[i]);
      rounds = std::min(rounds, need <= 0 ? 0 : (need + quantum - 1) / quantum);
    }
    if (rounds > 1) {
      for (size_t i = 0; i < n; ++i) {
        k.tenants[k.active[i]].deficit += (rounds - 1) * Quantum(k.active[i]);
      }
    }
    // After the skip, someone starts within two passes of the round.
    for (size_t step = 0; step < 2 * n + 2; ++step) {
      TenantQueue& q = k.tenants[k.active[k.cur]];
      if (!q.granted) {
        q.deficit += Quantum(k.active[k.cur]);
        q.granted = true;
      }
      if (static_cast<int64_t>(q.items.front().bytes) <= q.deficit) {
        q.deficit -= static_cast<int64_t>(q.items.front().bytes);
        return Take(k, k.cur);
      }
      q.granted = false;
      k.cur = (k.cur + 1) % n;
    }
    return Take(k, k.cur);  // Not reached; fair enough if it were.
  }

  // Takes the front of tenant `at`'s queue; a tenant left with nothing leaves the round
  // (its deficit forgotten, as deficit round robin does).
  T Take(Class& k, size_t at) {
    auto it = k.tenants.find(k.active[at]);
    T value = std::move(it->second.items.front().value);
    it->second.items.pop_front();
    --k.size;
    --size_;
    if (it->second.items.empty()) {
      k.tenants.erase(it);
      k.active.erase(k.active.begin() + static_cast<std::ptrdiff_t>(at));
      if (k.cur > at) --k.cur;
      if (k.cur >= k.active.size()) k.cur = 0;
    }
    return value;
  }

  const QosOptions options_;
  const TenantWeights* const weights_;
  std::array<Class, kPriorities> classes_;
  size_t size_ = 0;
  int since_starved_ = 0;  // Picks since the last turn of a starved class.
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_CORE_QOS_H_
