// gpumoved: the gpumove daemon. Owns this node's buffer pools and runs transfers; see
// docs/operations.md for the flags in context (defined in daemon/app/flags.cc).
#include <signal.h>

#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "daemon/app/daemon.h"
#include "daemon/app/drain.h"
#include "daemon/app/flags.h"
#include "daemon/app/process.h"
#include "daemon/common/log.h"
#include "daemon/help.h"
#include "daemon/path/ucx/ucx_transport.h"
#include "daemon/server/service_manager.h"

int main(int argc, char** argv) {
  // First, while this is the only thread (it sets environment variables UCX reads).
  gpumove::UcxTransport::SetProcessDefaults();
  gpumove::TuneHeap();
  absl::SetProgramUsageMessage(
      "gpumove daemon: owns this node's GPU and host buffer pools and moves bytes.\n"
      "  gpumoved [--listen=127.0.0.1:7470] [--node=NAME] [--device_pool_size=1GiB] ...");
  // Help on stdout, exit 0, in groups (absl's own --help finds no flags in a file named
  // flags.cc and exits 1).
  if (const int help = gpumove::HelpAsked(argc, argv); help != 0) {
    std::cout << gpumove::DaemonHelp(gpumove::kDaemonFlagsFile, help == 2);
    return 0;
  }
  std::string folded;
  std::vector<char*> args = gpumove::FoldRepeatedListen(argc, argv, folded);
  absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  gpumove::SetLogJson(absl::GetFlag(FLAGS_log_json));
  gpumove::SetLogVerbosity(absl::GetFlag(FLAGS_v));
  // Debian's Abseil checks lock order at run time (its cycle graph showed in profiles of
  // the move path): the daemon does not pay for that.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  gpumove::RaiseOpenFileLimit();
  gpumove::WidenMpiCpuBinding(absl::GetFlag(FLAGS_keep_cpu_binding));
  // Signals go to one thread that asks for a drain; every other thread has them blocked.
  const sigset_t signals = gpumove::BlockStopSignals();

  auto options = gpumove::OptionsFromFlags(/*listen_given=*/!folded.empty());
  if (!options.ok()) {
    LOG(ERROR) << options.status().message();
    return 2;
  }
  gpumove::ServiceManager manager;  // systemd's Type=notify, when started by it.
  manager.Status("starting");
  auto daemon = gpumove::Daemon::Start(*std::move(options));
  if (!daemon.ok()) {
    LOG(ERROR) << "cannot start: " << daemon.status();
    manager.Status(absl::StrCat("cannot start: ", daemon.status().message()));
    return 1;
  }
  // Pools made, peers joined, listeners up: callers are answered from now on.
  manager.Ready(absl::StrCat("node ", (*daemon)->node(), " serving on ",
                             absl::StrJoin((*daemon)->addresses(), ", ")));
  gpumove::ServeUntilSignalled(*daemon, signals, manager, absl::GetFlag(FLAGS_drain_grace));
  daemon->reset();
  return 0;
}
