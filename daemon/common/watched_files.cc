#include "daemon/common/watched_files.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "daemon/common/log.h"
#include "daemon/common/status_macros.h"

namespace gpumove {

absl::StatusOr<std::string> ReadWholeFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read the ", what, " ", path));
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

absl::StatusOr<std::unique_ptr<WatchedFiles>> WatchedFiles::Start(std::vector<std::string> paths,
                                                                  absl::Duration refresh,
                                                                  std::string what, Apply apply) {
  std::unique_ptr<WatchedFiles> w(new WatchedFiles());
  w->paths_ = std::move(paths);
  w->refresh_ = refresh;
  w->what_ = std::move(what);
  w->apply_ = std::move(apply);
  if (auto first = w->Refresh(); !first.ok()) return first.status();
  WatchedFiles* self = w.get();
  w->thread_ = std::thread([self] { self->Loop(); });
  return w;
}

WatchedFiles::~WatchedFiles() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<bool> WatchedFiles::Refresh() {
  std::vector<std::string> contents;
  for (const std::string& path : paths_) {
    auto c = ReadWholeFile(path, "file");
    if (!c.ok()) return c.status();
    contents.push_back(*std::move(c));
  }
  if (contents == seen_) return false;
  // Looked at once: a refused change is not refused again every refresh.
  seen_ = contents;
  GPUMOVE_RETURN_IF_ERROR(apply_(contents));
  return true;
}

void WatchedFiles::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto stopping = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), refresh_)) return;
    }
    auto changed = Refresh();
    if (!changed.ok()) {
      // Once per reason: a file that stays unreadable is not logged every refresh.
      if (changed.status().message() != last_error_) {
        last_error_ = std::string(changed.status().message());
        LOG(ERROR) << what_ << " refused, the ones before kept: " << last_error_;
      }
    } else if (*changed) {
      last_error_.clear();
      LOG(INFO) << what_ << " reloaded from " << paths_.front();
    }
  }
}

}  // namespace gpumove
