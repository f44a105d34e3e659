// Threads kept for reuse: jobs run on an idle one, or on a new one while the pool is
// below its limit (else they queue). Starting a thread, and a thread's first CUDA call,
// cost tens to hundreds of microseconds; a pool pays them once.
#ifndef GPUMOVE_DAEMON_COMMON_THREAD_POOL_H_
#define GPUMOVE_DAEMON_COMMON_THREAD_POOL_H_

#include <atomic>
#include <deque>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gpumove {

// How long an idle thread of any pool keeps looking for its next job before it sleeps
// (0: it sleeps at once). Waking a sleeping thread costs tens of microseconds on a VM, and
// a staged move hands each of its pieces to pool threads several times (its steps, the
// helpers of each host copy); figures in docs/performance/tuning.md. Set at start; a
// thread reads it each time it goes idle.
void SetPoolIdleSpin(absl::Duration spin);
absl::Duration PoolIdleSpin();

class ThreadPool {
 public:
  // `max_threads` 0: no limit, so jobs that wait for each other never wait for a thread.
  explicit ThreadPool(int max_threads) : max_threads_(max_threads) {}
  // Threads are detached and never stop: make pools that live for the process.
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Run(std::function<void()> job);
  int threads() const;

 private:
  void Loop();

  const int max_threads_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> jobs_ ABSL_GUARDED_BY(mu_);
  std::atomic<size_t> queued_{0};  // jobs_.size(), for threads looking without the lock.
  // Threads waiting for a job, looking or asleep: a job for them starts no new thread.
  int idle_ ABSL_GUARDED_BY(mu_) = 0;
  int started_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_COMMON_THREAD_POOL_H_
