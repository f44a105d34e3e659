// ThreadSanitizer annotations for the system's uninstrumented Abseil synchronization library.
//
// Debian's libabsl_synchronization (and libabsl_status) is built without -fsanitize=thread, so its Mutex, CondVar,
// Notification and BlockingCounter are invisible to TSan: every access guarded by an absl::Mutex
// would be reported as a race. Abseil's own fix is to build it with TSan, where mutex.cc calls the
// __tsan_mutex_* hooks itself; no such build is at hand offline. Instead this file, linked into
// the test binaries of the tsan config only (--config=tsan), defines the same member functions in
// the executable. Calls from our code and from inside the shared library (which calls its own
// exported functions through the PLT) resolve here first; each wrapper tells TSan what the real
// function, found with dlsym(RTLD_NEXT), does: the annotations mutex.cc makes in a TSan build,
// including its trick for conditions evaluated inside lock and unlock (EvalConditionAnnotated).
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/base/options.h"
#include "absl/status/status.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

#define GPUMOVE_STR2(x) #x
#define GPUMOVE_STR(x) GPUMOVE_STR2(x)

// The real function `suffix` of absl's inline namespace: "_ZN4absl<len><ns><suffix>", or for a
// const member (suffix "K...") "_ZNK4absl<len><ns><suffix without K>".
template <typename Fn>
Fn Real(const char* suffix) {
  const char* ns = GPUMOVE_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const bool is_const = suffix[0] == 'K';
  std::string name = std::string(is_const ? "_ZNK" : "_ZN") + "4absl" +
                     std::to_string(std::strlen(ns)) + ns + (is_const ? suffix + 1 : suffix);
  void* f = dlsym(RTLD_NEXT, name.c_str());
  if (f == nullptr) {
    std::fprintf(stderr, "absl_sync_annotations: %s not found\n", name.c_str());
    std::abort();
  }
  return reinterpret_cast<Fn>(f);
}

// What the current thread is doing inside the library, so that Condition::Eval called there
// (by a locker for its own condition, or by an unlocker for its waiters') sees the mutex held.
struct Op {
  void* mu = nullptr;
  unsigned flags = 0;
  bool locking = false;
};
thread_local Op current;

class Scope {
 public:
  Scope(void* mu, unsigned flags, bool locking) : saved_(current) { current = {mu, flags, locking}; }
  ~Scope() { current = saved_; }

 private:
  Op saved_;
};

using absl::Condition;
using absl::CondVar;
using absl::Duration;
using absl::Mutex;
using absl::Time;

// Inside one of these wrappers, the library calls others of them (AwaitWithTimeout calls
// AwaitWithDeadline, ...): those pass straight through, the outer one annotates.
bool Nested() { return current.mu != nullptr; }

void Locked(void* mu, unsigned flags, bool ok = true) {
  __tsan_mutex_post_lock(mu, ok ? flags : flags | __tsan_mutex_try_lock_failed, 0);
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex4LockEv");
  if (Nested()) return real(this);
  __tsan_mutex_pre_lock(this, 0);
  {
    Scope s(this, 0, true);
    real(this);
  }
  Locked(this, 0);
}

void Mutex::ReaderLock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex10ReaderLockEv");
  if (Nested()) return real(this);
  __tsan_mutex_pre_lock(this, __tsan_mutex_read_lock);
  {
    Scope s(this, __tsan_mutex_read_lock, true);
    real(this);
  }
  Locked(this, __tsan_mutex_read_lock);
}

bool Mutex::TryLock() {
  static auto real = Real<bool (*)(Mutex*)>("5Mutex7TryLockEv");
  if (Nested()) return real(this);
  __tsan_mutex_pre_lock(this, __tsan_mutex_try_lock);
  bool ok;
  {
    Scope s(this, __tsan_mutex_try_lock, true);
    ok = real(this);
  }
  Locked(this, __tsan_mutex_try_lock, ok);
  return ok;
}

bool Mutex::ReaderTryLock() {
  static auto real = Real<bool (*)(Mutex*)>("5Mutex13ReaderTryLockEv");
  if (Nested()) return real(this);
  const unsigned f = __tsan_mutex_read_lock | __tsan_mutex_try_lock;
  __tsan_mutex_pre_lock(this, f);
  bool ok;
  {
    Scope s(this, f, true);
    ok = real(this);
  }
  Locked(this, f, ok);
  return ok;
}

void Mutex::Unlock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex6UnlockEv");
  if (Nested()) return real(this);
  __tsan_mutex_pre_unlock(this, 0);
  {
    Scope s(this, 0, false);
    real(this);
  }
  __tsan_mutex_post_unlock(this, 0);
}

void Mutex::ReaderUnlock() {
  static auto real = Real<void (*)(Mutex*)>("5Mutex12ReaderUnlockEv");
  if (Nested()) return real(this);
  __tsan_mutex_pre_unlock(this, __tsan_mutex_read_lock);
  {
    Scope s(this, __tsan_mutex_read_lock, false);
    real(this);
  }
  __tsan_mutex_post_unlock(this, __tsan_mutex_read_lock);
}

// LockWhen* acquire the mutex whatever they return.
#define GPUMOVE_LOCK_WHEN(ret, name, mangled, flags, params, args, ...) \
  ret Mutex::name params {                                              \
    static auto real = Real<ret (*)(Mutex*, const Condition&, ##__VA_ARGS__)>(mangled); \
    if (Nested()) return real args;                                     \
    __tsan_mutex_pre_lock(this, flags);                                 \
    ret r;                                                              \
    {                                                                   \
      Scope s(this, flags, true);                                       \
      r = real args;                                                    \
    }                                                                   \
    Locked(this, flags);                                                \
    return r;                                                           \
  }

void Mutex::LockWhen(const Condition& c) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>(
      "5Mutex8LockWhenERKNS0_9ConditionE");
  if (Nested()) return real(this, c);
  __tsan_mutex_pre_lock(this, 0);
  {
    Scope s(this, 0, true);
    real(this, c);
  }
  Locked(this, 0);
}

void Mutex::ReaderLockWhen(const Condition& c) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>(
      "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  if (Nested()) return real(this, c);
  __tsan_mutex_pre_lock(this, __tsan_mutex_read_lock);
  {
    Scope s(this, __tsan_mutex_read_lock, true);
    real(this, c);
  }
  Locked(this, __tsan_mutex_read_lock);
}

GPUMOVE_LOCK_WHEN(bool, LockWhenWithTimeout, "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE",
                  0, (const Condition& c, Duration d), (this, c, d), Duration)
GPUMOVE_LOCK_WHEN(bool, LockWhenWithDeadline, "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE",
                  0, (const Condition& c, Time t), (this, c, t), Time)
GPUMOVE_LOCK_WHEN(bool, ReaderLockWhenWithTimeout,
                  "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE",
                  __tsan_mutex_read_lock, (const Condition& c, Duration d), (this, c, d), Duration)
GPUMOVE_LOCK_WHEN(bool, ReaderLockWhenWithDeadline,
                  "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE",
                  __tsan_mutex_read_lock, (const Condition& c, Time t), (this, c, t), Time)
#undef GPUMOVE_LOCK_WHEN

// Await* release the mutex while waiting and hold it again on return. As in a TSan build of
// mutex.cc, the wait shows as an unlock then a lock (so what other threads did meanwhile under
// the mutex happens before what follows). A reader's Await is not told apart: the writer flags
// are used, which only makes TSan stricter.
#define GPUMOVE_AWAIT(ret, name, mangled, params, args, ...)                      \
  ret Mutex::name params {                                                        \
    static auto real = Real<ret (*)(Mutex*, const Condition&, ##__VA_ARGS__)>(mangled); \
    if (Nested()) return real args;                                     \
    __tsan_mutex_pre_unlock(this, 0);                                             \
    ret r;                                                                        \
    {                                                                             \
      Scope s(this, 0, false);                                                    \
      r = real args;                                                              \
    }                                                                             \
    __tsan_mutex_post_unlock(this, 0);                                            \
    __tsan_mutex_pre_lock(this, 0);                                               \
    Locked(this, 0);                                                              \
    return r;                                                                     \
  }

void Mutex::Await(const Condition& c) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>("5Mutex5AwaitERKNS0_9ConditionE");
  if (Nested()) return real(this, c);
  __tsan_mutex_pre_unlock(this, 0);
  {
    Scope s(this, 0, false);
    real(this, c);
  }
  __tsan_mutex_post_unlock(this, 0);
  __tsan_mutex_pre_lock(this, 0);
  Locked(this, 0);
}
GPUMOVE_AWAIT(bool, AwaitWithTimeout, "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE",
              (const Condition& c, Duration d), (this, c, d), Duration)
GPUMOVE_AWAIT(bool, AwaitWithDeadline, "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE",
              (const Condition& c, Time t), (this, c, t), Time)
#undef GPUMOVE_AWAIT

Mutex::~Mutex() {
  static auto real = Real<void (*)(Mutex*)>("5MutexD2Ev");
  real(this);
  __tsan_mutex_destroy(this, __tsan_mutex_not_static);
}

// A condition evaluated inside the library. Locking: pretend the lock is done, evaluate, and
// start locking again; unlocking: pretend the unlock is done, lock, evaluate, start unlocking
// again (mutex.cc's EvalConditionAnnotated).
bool Condition::Eval() const {
  static auto real = Real<bool (*)(const Condition*)>("K9Condition4EvalEv");
  const Op op = current;
  if (op.mu == nullptr) return real(this);
  const unsigned f = op.flags & __tsan_mutex_read_lock;
  bool r;
  if (op.locking) {
    __tsan_mutex_post_lock(op.mu, f, 0);
    r = real(this);
    __tsan_mutex_pre_unlock(op.mu, f);
    __tsan_mutex_post_unlock(op.mu, f);
    __tsan_mutex_pre_lock(op.mu, f);
  } else {
    __tsan_mutex_post_unlock(op.mu, f);
    __tsan_mutex_pre_lock(op.mu, f);
    __tsan_mutex_post_lock(op.mu, f, 0);
    r = real(this);
    __tsan_mutex_pre_unlock(op.mu, f);
  }
  return r;
}

// CondVar waits release the mutex and take it again.
#define GPUMOVE_WAIT(ret, name, mangled, params, args, ...)                        \
  ret CondVar::name params {                                                       \
    static auto real = Real<ret (*)(CondVar*, Mutex*, ##__VA_ARGS__)>(mangled);    \
    if (Nested()) return real args;                                     \
    __tsan_mutex_pre_unlock(mu, 0);                                                \
    ret r;                                                                         \
    {                                                                              \
      Scope s(mu, 0, false);                                                       \
      r = real args;                                                               \
    }                                                                              \
    __tsan_mutex_post_unlock(mu, 0);                                               \
    __tsan_mutex_pre_lock(mu, 0);                                                  \
    Locked(mu, 0);                                                                 \
    return r;                                                                      \
  }

void CondVar::Wait(Mutex* mu) {
  static auto real = Real<void (*)(CondVar*, Mutex*)>("7CondVar4WaitEPNS0_5MutexE");
  if (Nested()) return real(this, mu);
  __tsan_mutex_pre_unlock(mu, 0);
  {
    Scope s(mu, 0, false);
    real(this, mu);
  }
  __tsan_mutex_post_unlock(mu, 0);
  __tsan_mutex_pre_lock(mu, 0);
  Locked(mu, 0);
}
GPUMOVE_WAIT(bool, WaitWithTimeout, "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE",
             (Mutex * mu, Duration d), (this, mu, d), Duration)
GPUMOVE_WAIT(bool, WaitWithDeadline, "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE",
             (Mutex * mu, Time t), (this, mu, t), Time)
#undef GPUMOVE_WAIT

// Notification and BlockingCounter publish through an atomic inside the library (not seen by
// TSan): a release on notify/decrement, an acquire once the wait has seen it.
void Notification::Notify() {
  static auto real = Real<void (*)(Notification*)>("12Notification6NotifyEv");
  __tsan_release(this);
  real(this);
}

void Notification::WaitForNotification() const {
  static auto real = Real<void (*)(const Notification*)>("K12Notification19WaitForNotificationEv");
  real(this);
  __tsan_acquire(const_cast<Notification*>(this));
}

bool Notification::WaitForNotificationWithTimeout(Duration d) const {
  static auto real = Real<bool (*)(const Notification*, Duration)>(
      "K12Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  bool r = real(this, d);
  if (r) __tsan_acquire(const_cast<Notification*>(this));
  return r;
}

bool Notification::WaitForNotificationWithDeadline(Time t) const {
  static auto real = Real<bool (*)(const Notification*, Time)>(
      "K12Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  bool r = real(this, t);
  if (r) __tsan_acquire(const_cast<Notification*>(this));
  return r;
}

bool BlockingCounter::DecrementCount() {
  static auto real = Real<bool (*)(BlockingCounter*)>("15BlockingCounter14DecrementCountEv");
  __tsan_release(this);
  return real(this);
}

void BlockingCounter::Wait() {
  static auto real = Real<void (*)(BlockingCounter*)>("15BlockingCounter4WaitEv");
  real(this);
  __tsan_acquire(this);
}

// A non-inlined Status shares a reference-counted rep; the count drops inside the library, so
// the copy that frees the rep would seem to race with other copies' reads of the message. As for
// any reference count: a release before the decrement, an acquire before the possible free (made
// on every drop, which may order a little more than the real count does, never less).
void Status::UnrefNonInlined(uintptr_t rep) {
  static auto real = Real<void (*)(uintptr_t)>("6Status15UnrefNonInlinedEm");
  void* p = reinterpret_cast<void*>(rep - 1);
  __tsan_release(p);
  __tsan_acquire(p);
  real(rep);
}

ABSL_NAMESPACE_END
}  // namespace absl

// gRPC (and its gpr) from Debian is not instrumented either, and it synchronizes with its own
// atomics and reference counts: a race TSan reports with a gRPC frame in either stack is
// unreliable (its channels' refcounts drop inside the library). Those only are suppressed; our
// code's use of gRPC is covered by the ASan+UBSan pass and gRPC's own TSan-tested releases.
// Statuses gRPC hands between its threads (uninstrumented, so the hand-over is invisible) are
// read inside libabsl_status, where TSan sees only the intercepted calls (a memcmp of a
// message): those calls made from that library are ignored (called_from_lib), as TSan's own
// documentation does for uninstrumented libraries; its functions' other accesses are not seen
// anyway. Seen once in twelve runs of //daemon/cluster:cluster_test (gRPC's event_engine
// thread reading a status the heartbeat thread made). The same for upb, the protobuf runtime
// inside gRPC: a memcpy called from libupb.so on gRPC's default executor, of bytes an
// absl::Cord allocated on gRPC's timer thread handed over through gRPC's own atomics (CI's
// TSan stage, //daemon/server:starting_server_test, once).
extern "C" const char* __tsan_default_suppressions() {
  return "race:libgrpc.so\n"
         "race:libgpr.so\n"
         "race:libgrpc++.so\n"
         "called_from_lib:libabsl_status.so\n"
         "called_from_lib:libupb.so\n";
}
