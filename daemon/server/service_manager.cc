#include "daemon/server/service_manager.h"

#include <systemd/sd-daemon.h>

#include "absl/strings/str_cat.h"
#include "daemon/common/log.h"

namespace gpumove {
namespace {

void Notify(const std::string& state) {
  const int r = sd_notify(/*unset_environment=*/0, state.c_str());
  if (r < 0) LOG(WARNING) << "sd_notify(" << state << "): error " << -r;
}

std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n') c = ' ';
  }
  return s;
}

}  // namespace

ServiceManager::ServiceManager() {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(/*unset_environment=*/0, &usec) > 0 && usec > 0) {
    watchdog_ = absl::Microseconds(usec);
    pinger_ = std::thread([this] {
      absl::MutexLock lock(&mu_);
      while (!stop_) {
        Notify("WATCHDOG=1");
        mu_.AwaitWithTimeout(absl::Condition(&stop_), watchdog_ / 2);
      }
    });
    LOG(INFO) << "watchdog pings every " << absl::FormatDuration(watchdog_ / 2);
  }
}

ServiceManager::~ServiceManager() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (pinger_.joinable()) pinger_.join();
}

void ServiceManager::Ready(const std::string& status) {
  Notify(absl::StrCat("READY=1\nSTATUS=", OneLine(status)));
}

void ServiceManager::Stopping(const std::string& status) {
  Notify(absl::StrCat("STOPPING=1\nSTATUS=", OneLine(status)));
}

void ServiceManager::Status(const std::string& status) {
  Notify(absl::StrCat("STATUS=", OneLine(status)));
}

}  // namespace gpumove
