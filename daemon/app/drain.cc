// The signal thread and the drain of drain.h.
#include "daemon/app/drain.h"

#include <pthread.h>

#include <thread>

#include "absl/synchronization/notification.h"
#include "daemon/common/log.h"

namespace gpumove {

sigset_t BlockStopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return signals;
}

void ServeUntilSignalled(std::unique_ptr<Daemon>& daemon, const sigset_t& signals,
                         ServiceManager& manager, absl::Duration grace) {
  absl::Notification stop;
  std::thread signal_thread([&stop, &daemon, signals] {
    int sig = 0;
    sigwait(&signals, &sig);
    LOG(INFO) << "signal " << sig << ": draining (a second signal cancels running transfers)";
    stop.Notify();
    sigwait(&signals, &sig);
    LOG(WARNING) << "second signal " << sig << ": cancelling every transfer";
    daemon->CancelAll();
  });
  signal_thread.detach();
  stop.WaitForNotification();
  manager.Stopping("draining: refusing new transfers");
  daemon->Shutdown(grace);
  daemon->Wait();
}

}  // namespace gpumove
