// Files a daemon re-reads while it runs (certificates, tokens): looked at every so often,
// handed on when they changed, and kept as they were when what they now say is refused.
#ifndef GPUMOVE_DAEMON_COMMON_WATCHED_FILES_H_
#define GPUMOVE_DAEMON_COMMON_WATCHED_FILES_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gpumove {

// The whole of `path`; INVALID_ARGUMENT naming `what` when it cannot be read.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path, absl::string_view what);

class WatchedFiles {
 public:
  // Gets the contents of `paths` (in order), one per path.
  using Apply = std::function<absl::Status(const std::vector<std::string>& contents)>;

  // Reads `paths` and applies them now (Start returns a read error or apply's refusal),
  // then every `refresh` again when any changed. A later refusal (or a file that cannot be
  // read) is logged as "<what> refused, the ones before kept: why"; what was applied last
  // stays in force.
  static absl::StatusOr<std::unique_ptr<WatchedFiles>> Start(std::vector<std::string> paths,
                                                             absl::Duration refresh,
                                                             std::string what, Apply apply);
  ~WatchedFiles();
  WatchedFiles(const WatchedFiles&) = delete;
  WatchedFiles& operator=(const WatchedFiles&) = delete;

  // Start for one file whose contents `parse` reads (a StatusOr of what it says) and
  // `apply` takes; a refusal of parse's names the file.
  template <typename Parse, typename ApplyParsed>
  static absl::StatusOr<std::unique_ptr<WatchedFiles>> StartParsed(const std::string& path,
                                                                   absl::Duration refresh,
                                                                   std::string what, Parse parse,
                                                                   ApplyParsed apply) {
    return Start({path}, refresh, std::move(what),
                 [path, parse, apply](const std::vector<std::string>& contents) -> absl::Status {
                   auto parsed = parse(contents[0]);
                   if (!parsed.ok()) {
                     return absl::InvalidArgumentError(
                         absl::StrCat(path, ": ", parsed.status().message()));
                   }
                   apply(*std::move(parsed));
                   return absl::OkStatus();
                 });
  }

 private:
  WatchedFiles() = default;
  // Reads the files; applies them when they changed. Whether they did.
  absl::StatusOr<bool> Refresh();
  void Loop();

  std::vector<std::string> paths_;
  absl::Duration refresh_;
  std::string what_;
  Apply apply_;
  std::vector<std::string> seen_;  // The contents last looked at.
  std::string last_error_;         // The refusal last logged.
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace gpumove

#endif  // GPUMOVE_DAEMON_COMMON_WATCHED_FILES_H_
