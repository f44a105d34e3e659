// The worker's progress thread: jobs posted to it, sleeping on the worker's event fd, the
// loop that progresses UCX and advances the moves in flight.
#include <poll.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <deque>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "daemon/path/ucx/ucx_transport_impl.h"

namespace gpumove {

void UcxTransport::Impl::Call(std::function<void()> job) {
  absl::Notification done;
  Post([&] {
    job();
    done.Notify();
  });
  done.WaitForNotification();
}

void UcxTransport::Impl::Post(std::function<void()> job) {
  absl::MutexLock lock(&mu);
  jobs.push_back(std::move(job));
  if (jobs_fd >= 0) {
    const uint64_t one = 1;
    (void)!write(jobs_fd, &one, sizeof(one));
  }
}

void UcxTransport::Impl::Sleep(int timeout_ms) {
  if (ucp_worker_arm(worker) == UCS_ERR_BUSY) return;  // Events are already pending.
  pollfd fds[2] = {{worker_fd, POLLIN, 0}, {jobs_fd, POLLIN, 0}};
  poll(fds, 2, timeout_ms);
  if (fds[1].revents & POLLIN) {
    uint64_t n = 0;
    (void)!read(jobs_fd, &n, sizeof(n));
  }
}

void UcxTransport::Impl::Loop() {
  absl::Time last_activity = absl::InfinitePast();
  while (true) {
    std::deque<std::function<void()>> ready;
    bool idle = false;
    {
      absl::MutexLock lock(&mu);
      if (stop && active.empty()) return;
      idle = active.empty() && jobs.empty();
    }
    // Idle: sleep until the network or a caller has something (peers' wire-up and
    // remote-side protocol steps need this worker to progress promptly) -- unless
    // something happened within the poll window: a reply is likely on its way.
    if (idle) {
      const absl::Duration quiet = absl::Now() - last_activity;
      if (quiet >= options.poll_window &&
          (quiet >= options.call_awake || calls_open.load(std::memory_order_relaxed) == 0)) {
        naps.fetch_add(1, std::memory_order_relaxed);
        Sleep(100);
      }
    }
    {
      absl::MutexLock lock(&mu);
      ready.swap(jobs);
    }
    for (auto& job : ready) job();
    unsigned events = 0;
    for (int i = 0; i < 64; ++i) {
      const unsigned n = ucp_worker_progress(worker);
      if (n == 0) break;
      events += n;
    }
    // Busy moves are polled, but a poll that found nothing yields the CPU: on a small
    // machine the threads feeding those moves need it more than this one.
    if (events == 0 && ready.empty()) {
      std::this_thread::yield();
    } else {
      last_activity = absl::Now();
    }
    for (auto it = active.begin(); it != active.end();) {
      if (Advance(**it)) {
        (*it)->finished.Notify();
        it = active.erase(it);
      } else {
        ++it;
      }
    }
  }
}

uint64_t UcxTransport::naps() const { return impl_->naps; }

}  // namespace gpumove
