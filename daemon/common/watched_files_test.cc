// Files re-read while the daemon runs: applied at start, again when they change, and a
// refused change leaves what was applied before.
#include "daemon/common/watched_files.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace gpumove {
namespace {

void Put(const std::string& path, const std::string& text) {
  std::ofstream(path + ".new") << text;
  std::rename((path + ".new").c_str(), path.c_str());
}

TEST(WatchedFiles, AppliesChangesAndKeepsTheLastGoodOnRefusal) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/watched.", getpid());
  Put(path, "one");
  absl::Mutex mu;
  std::vector<std::string> applied;
  auto apply = [&](const std::vector<std::string>& contents) {
    if (contents[0] == "bad") return absl::InvalidArgumentError("bad contents");
    absl::MutexLock lock(&mu);
    applied.push_back(contents[0]);
    return absl::OkStatus();
  };
  auto w = WatchedFiles::Start({path}, absl::Milliseconds(20), "test file", apply);
  ASSERT_TRUE(w.ok()) << w.status();
  auto seen = [&](size_t n) {
    for (absl::Time end = absl::Now() + absl::Seconds(5); absl::Now() < end;) {
      {
        absl::MutexLock lock(&mu);
        if (applied.size() >= n) return true;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  };
  ASSERT_TRUE(seen(1));
  Put(path, "two");
  ASSERT_TRUE(seen(2));
  Put(path, "bad");
  absl::SleepFor(absl::Milliseconds(200));
  Put(path, "three");
  ASSERT_TRUE(seen(3));
  w->reset();
  EXPECT_EQ(applied, (std::vector<std::string>{"one", "two", "three"}));

  // Refused or unreadable at start: no watcher.
  Put(path, "bad");
  EXPECT_EQ(WatchedFiles::Start({path}, absl::Seconds(1), "test file", apply).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(WatchedFiles::Start({path + ".missing"}, absl::Seconds(1), "test file", apply).ok());
  std::remove(path.c_str());
}

}  // namespace
}  // namespace gpumove
