#include "daemon/common/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace gpumove {
namespace {

std::atomic<bool> g_json{false};
std::atomic<int> g_verbosity{0};

std::string JsonEscape(absl::string_view in) {
  std::string out;
  for (unsigned char c : in) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

const char* Basename(const char* path) {
  const char* slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

}  // namespace

void SetLogJson(bool json) { g_json = json; }
void SetLogVerbosity(int level) { g_verbosity = level; }
int LogVerbosity() { return g_verbosity; }

namespace log_internal {

LogMessage::LogMessage(const char* file, int line, absl::LogSeverity severity)
    : file_(Basename(file)), line_(line), severity_(severity) {}

LogMessage::~LogMessage() {
  const absl::Time now = absl::Now();
  std::string line;
  if (g_json) {
    line = absl::StrFormat(
        "{\"time\":\"%s\",\"severity\":\"%s\",\"file\":\"%s:%d\",\"tid\":%d,"
        "\"message\":\"%s\"}\n",
        absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", now, absl::UTCTimeZone()),
        absl::LogSeverityName(severity_), file_, line_, gettid(),
        JsonEscape(stream_.str()));
  } else {
    line = absl::StrFormat(
        "%c%s %d %s:%d] %s\n", absl::LogSeverityName(severity_)[0],
        absl::FormatTime("%m%d %H:%M:%E6S", now, absl::LocalTimeZone()), gettid(),
        file_, line_, stream_.str());
  }
  // One write per message keeps lines from different threads whole.
  ssize_t unused = write(STDERR_FILENO, line.data(), line.size());
  (void)unused;
  if (severity_ == absl::LogSeverity::kFatal) std::abort();
}

}  // namespace log_internal
}  // namespace gpumove
