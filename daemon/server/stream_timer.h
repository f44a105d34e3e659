// One thread that runs the short steps of the streams and waits served without a thread
// of their own (gRPC callback reactors): progress intervals, deadlines, periodic checks,
// and the wake-ups that scheduler and notification listeners post from under their locks.
// Its tasks must not block: they take a reactor's lock, look at a snapshot, start a write.
#ifndef GPUMOVE_DAEMON_SERVER_STREAM_TIMER_H_
#define GPUMOVE_DAEMON_SERVER_STREAM_TIMER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gpumove {

class StreamTimer {
 public:
  // The process's timer (started on first use, never stopped: its tasks hold only weak
  // references to what they wake).
  static StreamTimer& Shared();

  StreamTimer();
  ~StreamTimer();
  StreamTimer(const StreamTimer&) = delete;
  StreamTimer& operator=(const StreamTimer&) = delete;

  // Runs `task` on the timer's thread at `when` (at once when past). Returns an id for
  // Cancel.
  uint64_t At(absl::Time when, std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t Post(std::function<void()> task) { return At(absl::InfinitePast(), std::move(task)); }
  // The task of `id` will not start (one running or done already is left as it is).
  void Cancel(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  size_t pending() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop();

  mutable absl::Mutex mu_;
  absl::CondVar wake_;
  std::map<std::pair<absl::Time, uint64_t>, std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, absl::Time> when_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_STREAM_TIMER_H_
