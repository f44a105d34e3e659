// Tells a service manager how the daemon is doing, in systemd's notify protocol
// (sd_notify to $NOTIFY_SOCKET): READY=1 once it serves, STATUS= lines, STOPPING=1 when it
// drains, and WATCHDOG=1 every half of the unit's WatchdogSec while the process lives.
// Without $NOTIFY_SOCKET (not started by systemd with Type=notify) every call does nothing.
//
//   ServiceManager manager;                 // Starts the watchdog pings if asked for.
//   manager.Ready("serving on 127.0.0.1:7470");
//   manager.Stopping("draining 3 transfers");
#ifndef GPUMOVE_DAEMON_SERVER_SERVICE_MANAGER_H_
#define GPUMOVE_DAEMON_SERVER_SERVICE_MANAGER_H_

#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gpumove {

class ServiceManager {
 public:
  ServiceManager();
  ~ServiceManager();
  ServiceManager(const ServiceManager&) = delete;
  ServiceManager& operator=(const ServiceManager&) = delete;

  void Ready(const std::string& status);
  void Stopping(const std::string& status);
  void Status(const std::string& status);
  // The watchdog interval the manager asked for (zero: none).
  absl::Duration watchdog() const { return watchdog_; }

 private:
  absl::Duration watchdog_ = absl::ZeroDuration();
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread pinger_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_SERVER_SERVICE_MANAGER_H_
