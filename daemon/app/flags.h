// gpumoved's flags (defined in flags.cc, one line each in its module's options struct) and
// the DaemonOptions they give.
#ifndef GPUMOVE_DAEMON_APP_FLAGS_H_
#define GPUMOVE_DAEMON_APP_FLAGS_H_

#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/app/options.h"

// The flags main reads itself: the process's, not the daemon's.
ABSL_DECLARE_FLAG(bool, log_json);
ABSL_DECLARE_FLAG(int, v);
ABSL_DECLARE_FLAG(bool, keep_cpu_binding);
ABSL_DECLARE_FLAG(absl::Duration, drain_grace);

namespace gpumove {

// The file the flags are defined in: DaemonHelp lists the flags of this file.
inline constexpr char kDaemonFlagsFile[] = "daemon/app/flags.cc";

// absl keeps only the last of a repeated flag; --listen may be given several times, so
// the repeats are folded into one comma list first (kept in `folded`, empty when none).
std::vector<char*> FoldRepeatedListen(int argc, char** argv, std::string& folded);

// The options the parsed flags give (`listen_given`: whether --listen was); an
// INVALID_ARGUMENT whose message names the flag for a value that makes no sense.
absl::StatusOr<DaemonOptions> OptionsFromFlags(bool listen_given);

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_APP_FLAGS_H_
