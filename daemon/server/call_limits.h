// Caps on the calls that last — streams (Read, Write, Watch, Notifications) and waits
// (Wait, Submit and Cancel with wait): they are served without a thread each (callback
// reactors), but each keeps memory, a timer and listeners while it is open, so without a
// cap one principal's thousands of open streams would crowd out every other caller. A call
// past a cap is RESOURCE_EXHAUSTED at once, saying which cap, and changes nothing.
#ifndef GPUMOVE_DAEMON_SERVER_CALL_LIMITS_H_
#define GPUMOVE_DAEMON_SERVER_CALL_LIMITS_H_

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace gpumove {

struct CallLimits {
  int total = 2048;         // Lasting calls open at once, all callers together.
  int per_principal = 512;  // ... by one principal (an open daemon's callers are one).
};

class LongCalls {
 public:
  explicit LongCalls(CallLimits limits) : limits_(limits) {}
  LongCalls(const LongCalls&) = delete;
  LongCalls& operator=(const LongCalls&) = delete;

  // One lasting call, counted while it lives.
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& o) noexcept : calls_(o.calls_), principal_(std::move(o.principal_)) {
      o.calls_ = nullptr;
    }
    Slot& operator=(Slot&& o) noexcept {
      if (this != &o) {
        Slot gone(std::move(*this));
        calls_ = o.calls_;
        principal_ = std::move(o.principal_);
        o.calls_ = nullptr;
      }
      return *this;
    }
    ~Slot();

   private:
    friend class LongCalls;
    Slot(LongCalls* calls, std::string principal)
        : calls_(calls), principal_(std::move(principal)) {}
    LongCalls* calls_ = nullptr;
    std::string principal_;
  };

  // A slot for a call of `principal`; RESOURCE_EXHAUSTED when a cap is reached.
  absl::StatusOr<Slot> Enter(const std::string& principal) ABSL_LOCKS_EXCLUDED(mu_);
  int open() const ABSL_LOCKS_EXCLUDED(mu_);
  // Calls refused since start.
  uint64_t refused() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Leave(const std::string& principal) ABSL_LOCKS_EXCLUDED(mu_);

  const CallLimits limits_;
  mutable absl::Mutex mu_;
  int open_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, int> by_principal_ ABSL_GUARDED_BY(mu_);
};

// A slot for `principal` from `calls` when it is set and the call `lasts`; an empty slot
// (nothing counted) otherwise.
absl::StatusOr<LongCalls::Slot> EnterIf(LongCalls* calls, bool lasts, const std::string& principal);

// In a service method: keeps a slot for the caller to the end of the scope, or returns
// RESOURCE_EXHAUSTED from the method.
#define GPUMOVE_ENTER_LONG_CALL(calls, lasts, caller)                  \
  auto long_call_slot = EnterIf((calls), (lasts), (caller).principal); \
  if (!long_call_slot.ok()) return ToGrpcStatus(long_call_slot.status())

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_CALL_LIMITS_H_
