#include <google/protobuf/util/json_util.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/bench/echo_server.h"
#include "client/bench/stream.h"
#include "client/bench/tool/bench.h"
#include "daemon/common/bytes.h"

namespace gpumove::bench {
namespace {

std::string GitRevision() {
  if (const char* r = std::getenv("GPUMOVE_GIT_REVISION"); r != nullptr && *r != '\0') return r;
  // `bazel run` says where the workspace is.
  const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  const std::string cmd =
      absl::StrCat("git -C '", ws != nullptr ? ws : ".", "' rev-parse --short HEAD 2>/dev/null");
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[64] = {};
    if (fgets(buf, sizeof(buf), p) != nullptr) out = buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out.empty() ? "unknown" : out;
}

std::string Human(double v) {
  return absl::StrFormat(v >= 100 ? "%.0f" : v >= 10 ? "%.1f" : "%.2f", v);
}

}  // namespace

Run::Run(std::string subcommand, std::string title) {
  run_.set_schema("gpumove-bench/1");
  run_.set_subcommand(std::move(subcommand));
  run_.set_title(std::move(title));
  run_.set_started(absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone()));
  run_.set_git_revision(GitRevision());
  auto* m = run_.mutable_machine();
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  m->set_hostname(host);
  m->set_cpus(static_cast<uint32_t>(sysconf(_SC_NPROCESSORS_ONLN)));
  m->set_memory_bytes(static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE));
  utsname u{};
  if (uname(&u) == 0) m->set_kernel(absl::StrCat(u.sysname, " ", u.release));
}

Run::Run(bench_result::BenchRun run) : run_(std::move(run)) {
  for (int i = 0; i < run_.points_size(); ++i) {
    const auto& p = run_.points(i);
    index_[std::make_tuple(p.series(), p.size(), p.concurrency())] = i;
  }
}

void Run::AddSeries(const std::string& name, bool baseline, const std::string& unit,
                    bool higher_is_better, const std::string& compared_to) {
  auto* s = run_.add_series();
  s->set_compared_to(compared_to);
  s->set_name(name);
  s->set_baseline(baseline);
  s->set_unit(unit);
  s->set_higher_is_better(higher_is_better);
}

void Run::AddContext(const std::string& name, const std::string& unit, bool higher_is_better) {
  AddSeries(name, false, unit, higher_is_better);
  run_.mutable_series(run_.series_size() - 1)->set_context(true);
}

void Run::Add(const std::string& series, uint64_t size, uint32_t concurrency, double value) {
  auto key = std::make_tuple(series, size, concurrency);
  auto it = index_.find(key);
  if (it == index_.end()) {
    auto* p = run_.add_points();
    p->set_series(series);
    p->set_size(size);
    p->set_concurrency(concurrency);
    it = index_.emplace(key, run_.points_size() - 1).first;
  }
  run_.mutable_points(it->second)->add_samples(value);
}

void Run::SetFlag(const std::string& name, const std::string& value) {
  (*run_.mutable_flags())[name] = value;
}

void Run::SetDaemon(const gpumove::v1::NodeInfo& info) {
  run_.set_gpumove_version(info.version());
  for (const auto& g : info.gpus()) run_.mutable_machine()->add_gpus(g.name());
}

const bench_result::BenchRun& Run::Finish() {
  for (auto& p : *run_.mutable_points()) {
    std::vector<double> v(p.samples().begin(), p.samples().end());
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    p.set_median(n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2);
    p.set_min(v.front());
    p.set_max(v.back());
  }
  // The table: a row per (size, concurrency), a column per series (median [min-max]) and
  // each gpumove series' ratio to each baseline (> 1: gpumove better).
  std::cout << "\n"
            << run_.title() << (run_.label().empty() ? "" : " [" + run_.label() + "]") << "\n";
  if (skipped()) {
    std::cout << "SKIPPED: " << run_.skipped() << "\n";
    return run_;
  }
  std::vector<std::pair<const bench_result::Series*, const bench_result::Series*>> ratios;
  int compared = 0;
  for (const auto& m : run_.series()) {
    if (m.baseline() || m.context()) continue;
    ++compared;
    for (const auto& b : run_.series()) {
      if (b.baseline() && (m.compared_to().empty() || m.compared_to() == b.name())) {
        ratios.emplace_back(&m, &b);
      }
    }
  }
  std::string header = absl::StrFormat("%10s %5s", "size", "conc");
  for (const auto& s : run_.series()) {
    header += absl::StrFormat(" %22s", absl::StrCat(s.name(), " ", s.unit()));
  }
  std::vector<int> widths;  // Of each ratio's column: its name, at least 14.
  for (const auto& [m, b] : ratios) {
    const std::string name =
        compared == 1 || !m->compared_to().empty()
            ? "vs " + b->name()
            : absl::StrCat(m->name().substr(m->name().rfind(' ') + 1), " vs ", b->name());
    widths.push_back(std::max<int>(14, name.size()));
    header += absl::StrFormat(" %*s", widths.back(), name);
  }
  std::cout << header << "\n";
  std::set<std::pair<uint64_t, uint32_t>> rows;
  for (const auto& p : run_.points()) rows.insert({p.size(), p.concurrency()});
  auto point = [&](const std::string& series, uint64_t size,
                   uint32_t c) -> const bench_result::Point* {
    auto it = index_.find(std::make_tuple(series, size, c));
    return it == index_.end() ? nullptr : &run_.points(it->second);
  };
  for (const auto& [size, c] : rows) {
    std::string line = absl::StrFormat("%10s %5u", FormatBytes(size), c);
    for (const auto& s : run_.series()) {
      const auto* p = point(s.name(), size, c);
      line += absl::StrFormat(" %22s", p == nullptr
                                           ? "-"
                                           : absl::StrCat(Human(p->median()), " [", Human(p->min()),
                                                          "-", Human(p->max()), "]"));
    }
    for (size_t i = 0; i < ratios.size(); ++i) {
      const auto& [ms, bs] = ratios[i];
      const auto* m = point(ms->name(), size, c);
      const auto* b = point(bs->name(), size, c);
      if (m == nullptr || b == nullptr || m->median() <= 0 || b->median() <= 0) {
        line += absl::StrFormat(" %*s", widths[i], "-");
        continue;
      }
      const double ratio =
          bs->higher_is_better() ? m->median() / b->median() : b->median() / m->median();
      line += absl::StrFormat(" %*.3f", widths[i], ratio);
    }
    std::cout << line << "\n";
  }
  std::cout << "(medians of " << (run_.points_size() > 0 ? run_.points(0).samples_size() : 0)
            << " rounds taken in turns, [min-max]; vs: gpumove's figure over the baseline's, "
               "latency inverted, so > 1 means gpumove is better)\n";
  return run_;
}

absl::StatusOr<Timing> TimeMoves(Client& c, const v1::BufferRef& src, const v1::BufferRef& dst,
                                 const MoveOptions& o, double seconds) {
  std::vector<double> wall, engine;
  const absl::Time end = absl::Now() + absl::Seconds(seconds);
  for (int i = 0; i < 1001 && (wall.size() < 3 || absl::Now() < end); ++i) {
    const absl::Time t0 = absl::Now();
    auto t = c.Move(src, dst, o);
    if (!t.ok()) return t.status();
    if (t->state() != v1::SUCCEEDED) return absl::InternalError(t->error_message());
    if (i == 0) continue;  // Warm: rkeys, IPC handles, caches.
    wall.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
    engine.push_back(EngineSeconds(*t));
  }
  return Timing{Median(wall), Median(engine)};
}

std::string PythonInterpreter() {
  const char* env = std::getenv("GPUMOVE_PYTHON");
  if (env != nullptr && *env != '\0') return env;
  return access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
}

bool AwaitPeers(Client& c, size_t peers) {
  for (const absl::Time end = absl::Now() + absl::Seconds(20);;) {
    auto list = c.ListPeers();
    size_t up = 0;
    if (list.ok()) {
      for (const auto& p : *list) up += p.up() ? 1 : 0;
    }
    if (up >= peers) return true;
    if (absl::Now() > end) return false;
    absl::SleepFor(absl::Milliseconds(50));
  }
}

std::string UcxReason(const v1::NodeInfo& info) {
  for (const auto& p : info.paths()) {
    if (p.path() == v1::UCX) return p.reason();
  }
  return "";
}

std::string NoGpuReason(const v1::NodeInfo& info) {
  if (info.gpus_size() > 0) return "";
  return absl::StrCat("the daemon has no GPU (",
                      info.gpu_status().empty() ? "none found" : info.gpu_status(), ")");
}

absl::StatusOr<std::string> ProbeGpus(const Context& ctx, Run& run) {
  std::vector<std::unique_ptr<DaemonProcess>> own;
  auto d = ctx.Connect(
      {"--node=probe", "--host_pool_size=16MiB", "--pinned_pool_size=0", "--device_pool_size=0"},
      own, run);
  if (!d.ok()) return d.status();
  return NoGpuReason(d->info);
}

absl::Status Run::WriteJson(const std::string& path) const {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(run_, &json, options).ok()) {
    return absl::InternalError("cannot write the run as JSON");
  }
  std::ofstream out(path, std::ios::trunc);
  out << json;
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::string> Context::Daemon(
    std::vector<std::string> flags, std::vector<std::unique_ptr<DaemonProcess>>& own) const {
  if (!addr.empty()) return addr;
  flags.insert(flags.end(), daemon_flags.begin(), daemon_flags.end());
  auto d = DaemonProcess::Start(std::move(flags));
  if (!d.ok()) return d.status();
  own.push_back(*std::move(d));
  return own.back()->address();
}

absl::StatusOr<Context::Connected> Context::Connect(
    std::vector<std::string> flags, std::vector<std::unique_ptr<DaemonProcess>>& own,
    Run& run) const {
  Connected c;
  auto a = Daemon(std::move(flags), own);
  if (!a.ok()) return a.status();
  c.address = *a;
  auto client = Client::Connect(c.address);
  if (!client.ok()) return client.status();
  c.client = *std::move(client);
  auto info = c.client->GetInfo();
  if (!info.ok()) return info.status();
  c.info = *std::move(info);
  run.SetDaemon(c.info);
  return c;
}

absl::StatusOr<std::unique_ptr<EchoChild>> EchoChild::Start(bool callback) {
  std::string address;
  const pid_t pid = StartEchoServer("127.0.0.1:0", &address, callback);
  if (pid < 0) return absl::InternalError("cannot start the echo server");
  return std::unique_ptr<EchoChild>(new EchoChild(pid, std::move(address)));
}

EchoChild::~EchoChild() { StopEchoServer(pid_); }

absl::StatusOr<MpiLaunch> LaunchNamed(const std::string& name) {
  if (name == "default") return MpiLaunch{"default", {}, {}};
  for (const MpiLaunch& l : MpiLaunches()) {
    if (l.name == name) return l;
  }
  return absl::InvalidArgumentError(absl::StrCat("no MPI launch ", name, " here"));
}

absl::StatusOr<std::string> RankJobCommand(const MpiLaunch& launch, const std::string& child,
                                           const std::vector<std::string>& flags) {
  char self[4096] = {};
  if (readlink("/proc/self/exe", self, sizeof(self) - 1) <= 0) {
    return absl::InternalError("cannot read /proc/self/exe");
  }
  std::vector<std::string> cmd = MpiLauncher(2);
  cmd.insert(cmd.end(), launch.mpi_args.begin(), launch.mpi_args.end());
  cmd.push_back(self);
  cmd.push_back(child);
  cmd.insert(cmd.end(), flags.begin(), flags.end());
  return absl::StrJoin(cmd, " ");
}

double MedianSeconds(const std::function<void()>& op, double seconds) {
  op();  // Warm.
  std::vector<double> v;
  const absl::Time end = absl::Now() + absl::Seconds(seconds);
  while ((v.size() < 3 || absl::Now() < end) && v.size() < 1000000) {
    const absl::Time t0 = absl::Now();
    op();
    v.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
  }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace gpumove::bench
