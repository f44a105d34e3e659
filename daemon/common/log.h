// Minimal LOG/VLOG with absl log's spelling.
//
// Debian 12's Abseil (20220623) predates absl/log, so the daemon logs through this shim:
// LOG(INFO|WARNING|ERROR|FATAL) << ...; VLOG(n) << ...; one line per message on stderr,
// plain or JSON lines. Moving to absl/log later is a change of this header only.
#ifndef GPUMOVE_DAEMON_COMMON_LOG_H_
#define GPUMOVE_DAEMON_COMMON_LOG_H_

#include <sstream>

#include "absl/base/log_severity.h"

namespace gpumove {

// Process-wide settings, normally from the --log_json and --v flags.
void SetLogJson(bool json);
void SetLogVerbosity(int level);
int LogVerbosity();

namespace log_internal {

inline constexpr absl::LogSeverity kINFO = absl::LogSeverity::kInfo;
inline constexpr absl::LogSeverity kWARNING = absl::LogSeverity::kWarning;
inline constexpr absl::LogSeverity kERROR = absl::LogSeverity::kError;
inline constexpr absl::LogSeverity kFATAL = absl::LogSeverity::kFatal;

// Collects one message and writes it, whole, when destroyed; FATAL then aborts.
class LogMessage {
 public:
  LogMessage(const char* file, int line, absl::LogSeverity severity);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  const char* file_;
  int line_;
  absl::LogSeverity severity_;
  std::ostringstream stream_;
};

// Swallows a disabled VLOG's stream expression.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace log_internal
}  // namespace gpumove

#define LOG(severity)                                          \
  ::gpumove::log_internal::LogMessage(__FILE__, __LINE__,      \
                                      ::gpumove::log_internal::k##severity) \
      .stream()

#define VLOG(level)                                   \
  (::gpumove::LogVerbosity() < (level))               \
      ? (void)0                                       \
      : ::gpumove::log_internal::Voidify() &          \
            ::gpumove::log_internal::LogMessage(      \
                __FILE__, __LINE__, ::absl::LogSeverity::kInfo)  \
                .stream()

#endif  // GPUMOVE_DAEMON_COMMON_LOG_H_
