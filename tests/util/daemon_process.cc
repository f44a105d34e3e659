#include "tests/util/daemon_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace gpumove {
namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

}  // namespace

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string FindBuiltBinary(const std::string& workspace_path, const char* env_override) {
  if (const char* env = std::getenv(env_override); env != nullptr && *env != '\0') return env;
  std::vector<std::string> candidates;
  if (const char* srcdir = std::getenv("TEST_SRCDIR")) {
    candidates.push_back(absl::StrCat(srcdir, "/gpumove/", workspace_path));
  }
  if (const char* runfiles = std::getenv("RUNFILES_DIR")) {
    candidates.push_back(absl::StrCat(runfiles, "/gpumove/", workspace_path));
  }
  char self[4096] = {};
  if (readlink("/proc/self/exe", self, sizeof(self) - 1) > 0) {
    candidates.push_back(absl::StrCat(self, ".runfiles/gpumove/", workspace_path));
    // Next to the running binary's package, for copies outside Bazel (e.g. .gpu/bin/).
    std::string dir(self);
    dir = dir.substr(0, dir.rfind('/'));
    const std::string base = workspace_path.substr(workspace_path.rfind('/') + 1);
    candidates.push_back(absl::StrCat(dir, "/", base));
  }
  candidates.push_back(absl::StrCat("bazel-bin/", workspace_path));
  for (const std::string& c : candidates) {
    if (Exists(c)) return c;
  }
  return candidates.back();
}

std::vector<std::string> ExtraDaemonFlags() {
  std::vector<std::string> flags;
  if (const char* extra = std::getenv("GPUMOVED_EXTRA_FLAGS")) {
    for (absl::string_view f : absl::StrSplit(extra, ' ', absl::SkipEmpty())) {
      flags.emplace_back(f);
    }
  }
  return flags;
}

absl::StatusOr<std::unique_ptr<DaemonProcess>> DaemonProcess::Start(std::vector<std::string> flags) {
  auto d = std::unique_ptr<DaemonProcess>(new DaemonProcess());
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string templ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/gpumoved.XXXXXX");
  if (mkdtemp(templ.data()) == nullptr) return absl::InternalError("mkdtemp failed");
  d->dir_ = templ;
  const std::string port_file = d->dir_ + "/address";
  bool has_listen = false, has_host_pool = false, has_pinned_pool = false;
  for (const std::string& f : flags) {
    has_listen |= absl::StartsWith(f, "--listen");
    has_host_pool |= absl::StartsWith(f, "--host_pool_size");
    has_pinned_pool |= absl::StartsWith(f, "--pinned_pool_size");
  }
  if (!has_listen) flags.push_back("--listen=127.0.0.1:0");
  // Pools are faulted in at start: the defaults (1 GiB + 256 MiB) cost a daemon about 4 s
  // of CPU on the CI machine, these about 1 s. A test that needs more says so.
  if (!has_host_pool) flags.push_back("--host_pool_size=256MiB");
  if (!has_pinned_pool) flags.push_back("--pinned_pool_size=64MiB");
  flags.push_back("--port_file=" + port_file);
  for (std::string& f : ExtraDaemonFlags()) flags.push_back(std::move(f));
  const std::string binary = FindBuiltBinary("daemon/gpumoved", "GPUMOVED");
  std::vector<std::string> argv_storage = {binary};
  argv_storage.insert(argv_storage.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (auto& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string log = d->dir_ + "/gpumoved.log";

  const pid_t parent = getpid();

  d->pid_ = fork();
  if (d->pid_ < 0) return absl::InternalError("fork failed");
  if (d->pid_ == 0) {
    // A test that dies (a crash, a timeout) takes the daemon with it.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(125);
    if (freopen(log.c_str(), "w", stderr) == nullptr) _exit(126);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    int status = 0;
    if (waitpid(d->pid_, &status, WNOHANG) == d->pid_) {
      d->exited_ = true;
      return absl::InternalError(absl::StrCat("gpumoved (", binary, ") exited at start:\n", d->Log()));
    }
    if (Exists(port_file)) {
      d->address_ = std::string(absl::StripTrailingAsciiWhitespace(ReadFile(port_file)));
      return d;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError(absl::StrCat("gpumoved did not start:\n", d->Log()));
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0 && !exited_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

void DaemonProcess::Signal(int sig) const { kill(pid_, sig); }

absl::StatusOr<int> DaemonProcess::WaitExit(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      return 128 + WTERMSIG(status);
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError("gpumoved is still running");
}

std::string DaemonProcess::Log() const { return ReadFile(dir_ + "/gpumoved.log"); }

std::string FetchMetrics(const std::string& address) {
  const size_t colon = address.rfind(':');
  sockaddr_in sa = {};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    close(fd);
    return "";
  }
  const std::string request = "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n";
  (void)!write(fd, request.data(), request.size());
  std::string body;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) body.append(buf, n);
  close(fd);
  return body;
}

double MetricValue(const std::string& address, const std::string& name) {
  const std::string m = FetchMetrics(address);
  const std::string key = "\ngpumoved_" + name + " ";
  const size_t at = m.find(key);
  return at == std::string::npos ? -1 : std::stod(m.substr(at + key.size()));
}

}  // namespace gpumove
