// Starts a real gpumoved in a child process for tests and benchmarks, on a free port,
// and stops it. Its log goes to a file that failing tests print.
#ifndef GPUMOVE_TESTS_UTIL_DAEMON_PROCESS_H_
#define GPUMOVE_TESTS_UTIL_DAEMON_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gpumove {

// Flags for every daemon a test or benchmark starts, from GPUMOVED_EXTRA_FLAGS
// (space-separated, e.g. --v=1 when digging).
std::vector<std::string> ExtraDaemonFlags();

// Path of a binary built by this workspace ("daemon/gpumoved"): from $GPUMOVED-style
// override `env_override` if set, else the runfiles of the running test or binary, else
// bazel-bin.
std::string FindBuiltBinary(const std::string& workspace_path, const char* env_override);

// The whole file (empty when it cannot be read).
std::string ReadFile(const std::string& path);

// GET http://address/metrics (a daemon's --metrics_listen) with a plain socket: the whole
// HTTP response, empty when it cannot connect.
std::string FetchMetrics(const std::string& address);
// The value of the unlabelled metric gpumoved_<name> at `address`; -1 when it is not
// served.
double MetricValue(const std::string& address, const std::string& name);

class DaemonProcess {
 public:
  // Starts gpumoved with `flags` plus --listen (127.0.0.1:0 unless flags give one) and a
  // port file; returns once it serves.
  static absl::StatusOr<std::unique_ptr<DaemonProcess>> Start(std::vector<std::string> flags);
  ~DaemonProcess();

  const std::string& address() const { return address_; }
  pid_t pid() const { return pid_; }
  void Signal(int sig) const;
  // Exit code once it exits, DEADLINE_EXCEEDED if it runs past `timeout`.
  absl::StatusOr<int> WaitExit(absl::Duration timeout);
  std::string Log() const;

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  std::string address_;
  std::string dir_;
};

}  // namespace gpumove

#endif  // GPUMOVE_TESTS_UTIL_DAEMON_PROCESS_H_
