// A few threads for the parts of calls that may block for a while and must not run on
// gRPC's callback threads: a Submit's accept (it may run small moves inline, or wait for
// other nodes to hold their ranges) and a Cancel (it may let go of other nodes' holds).
// Bounded: calls beyond its threads queue, so no caller gets a thread of its own.
#ifndef GPUMOVE_DAEMON_SERVER_CALL_POOL_H_
#define GPUMOVE_DAEMON_SERVER_CALL_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gpumove {

class CallPool {
 public:
  // The process's pool: 2 threads a CPU, at least 8 (started on first use, never
  // stopped: its tasks hold what they need).
  static CallPool& Shared();

  explicit CallPool(int threads);
  ~CallPool();
  CallPool(const CallPool&) = delete;
  CallPool& operator=(const CallPool&) = delete;

  void Run(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_CALL_POOL_H_
