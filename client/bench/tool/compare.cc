// `gpumove-bench compare`: one subcommand against two gpumoved builds in turns, for a
// change's before/after figures:
//
//   gpumove-bench compare --before=OLD --after=NEW [--compare_rounds=2] [--out=DIR] \
//       SUBCOMMAND [its flags]
//
// OLD and NEW are gpumoved binaries or folders holding one. Each round runs the subcommand
// (this binary, as a child with $GPUMOVED set) once with each, the order swapped every
// round so that drift favours neither; the runs' samples are pooled per build, both tables
// printed, then after/before for every point of every series (> 1: after is better; the
// baselines' ratios show how much the machine drifted between the builds' turns). --out
// keeps before.json and after.json (the pooled runs) for `gpumove-bench plot`.
#include <google/protobuf/util/json_util.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/bench/tool/bench.h"
#include "daemon/common/bytes.h"

namespace gpumove::bench {
namespace {

struct CompareArgs {
  std::string before, after, out;
  int rounds = 2;
  std::vector<std::string> forwarded;  // The subcommand and its flags.
};

// A gpumoved binary: `path` itself, or `path`/gpumoved.
absl::StatusOr<std::string> Gpumoved(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return absl::NotFoundError(absl::StrCat("no ", path));
  const std::string bin = S_ISDIR(st.st_mode) ? path + "/gpumoved" : path;
  if (access(bin.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(bin, " is not an executable gpumoved"));
  }
  return bin;
}

absl::StatusOr<CompareArgs> ParseArgs(const std::vector<std::string>& args) {
  CompareArgs a;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    bool taken = false;
    for (auto [name, field] : {std::pair<const char*, std::string*>{"before", &a.before},
                               {"after", &a.after},
                               {"out", &a.out}}) {
      const std::string flag = absl::StrCat("--", name);
      if (absl::StartsWith(arg, flag + "=")) {
        *field = arg.substr(flag.size() + 1);
        taken = true;
      } else if (arg == flag && i + 1 < args.size()) {
        *field = args[++i];
        taken = true;
      }
    }
    std::string rounds;
    if (absl::StartsWith(arg, "--compare_rounds=")) {
      rounds = arg.substr(strlen("--compare_rounds="));
    } else if (arg == "--compare_rounds" && i + 1 < args.size()) {
      rounds = args[++i];
    }
    if (!rounds.empty()) {
      if (!absl::SimpleAtoi(rounds, &a.rounds) || a.rounds < 1 || a.rounds > 100) {
        return absl::InvalidArgumentError("--compare_rounds must be 1 to 100");
      }
      taken = true;
    }
    if (absl::StartsWith(arg, "--json")) {
      return absl::InvalidArgumentError("compare writes its JSON with --out=DIR");
    }
    if (!taken) a.forwarded.push_back(arg);
  }
  if (a.before.empty() || a.after.empty()) {
    return absl::InvalidArgumentError("compare needs --before and --after");
  }
  auto before = Gpumoved(a.before);
  if (!before.ok()) return before.status();
  auto after = Gpumoved(a.after);
  if (!after.ok()) return after.status();
  a.before = *before;
  a.after = *after;
  if (a.forwarded.empty() || absl::StartsWith(a.forwarded[0], "-")) {
    return absl::InvalidArgumentError("compare needs a subcommand after its own flags");
  }
  return a;
}

// Runs this binary with `args` and $GPUMOVED=`gpumoved`; its output passed through.
absl::Status RunChild(const std::string& gpumoved, std::vector<std::string> args) {
  char self[4096] = {};
  if (readlink("/proc/self/exe", self, sizeof(self) - 1) <= 0) {
    return absl::InternalError("cannot find this binary");
  }
  args.insert(args.begin(), self);
  std::cout.flush();
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    setenv("GPUMOVED", gpumoved.c_str(), 1);
    std::vector<char*> raw;
    for (std::string& a : args) raw.push_back(a.data());
    raw.push_back(nullptr);
    execv(raw[0], raw.data());
    _exit(127);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(
        absl::StrCat("the run with ", gpumoved, " failed (status ", status, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<bench_result::BenchRun> ReadRun(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  bench_result::BenchRun run;
  if (!in || !google::protobuf::util::JsonStringToMessage(text.str(), &run).ok()) {
    return absl::DataLossError(absl::StrCat("cannot read the run ", path));
  }
  return run;
}

// `more`'s samples added to `into`'s points (the same series, size and concurrency).
void Pool(bench_result::BenchRun& into, const bench_result::BenchRun& more) {
  for (const auto& p : more.points()) {
    bench_result::Point* same = nullptr;
    for (auto& q : *into.mutable_points()) {
      if (q.series() == p.series() && q.size() == p.size() && q.concurrency() == p.concurrency()) {
        same = &q;
      }
    }
    if (same == nullptr) {
      same = into.add_points();
      *same = p;
      same->clear_samples();
    }
    for (double v : p.samples()) same->add_samples(v);
  }
}

// after/before of each point's median, a line per (size, concurrency), a column per series.
void PrintRatios(const bench_result::BenchRun& before, const bench_result::BenchRun& after) {
  std::cout << "\nafter / before (> 1: after is better; the baselines' ratios show the "
               "machine's drift between turns)\n";
  std::string header = absl::StrFormat("%10s %5s", "size", "conc");
  for (const auto& s : after.series()) {
    header += absl::StrFormat(" %22s", s.baseline() ? "(" + s.name() + ")" : s.name());
  }
  std::cout << header << "\n";
  std::map<std::pair<uint64_t, uint32_t>, std::map<std::string, std::pair<double, double>>> rows;
  for (const auto& p : before.points())
    rows[{p.size(), p.concurrency()}][p.series()].first = p.median();
  for (const auto& p : after.points())
    rows[{p.size(), p.concurrency()}][p.series()].second = p.median();
  for (const auto& [key, cells] : rows) {
    std::string line = absl::StrFormat("%10s %5u", FormatBytes(key.first), key.second);
    for (const auto& s : after.series()) {
      auto it = cells.find(s.name());
      if (it == cells.end() || it->second.first <= 0 || it->second.second <= 0) {
        line += absl::StrFormat(" %22s", "-");
        continue;
      }
      const auto [b, a] = it->second;
      line += absl::StrFormat(" %22.3f", s.higher_is_better() ? a / b : b / a);
    }
    std::cout << line << "\n";
  }
}

}  // namespace

int Compare(const std::vector<std::string>& raw_args) {
  auto args = ParseArgs(raw_args);
  if (!args.ok()) {
    std::cerr << "gpumove-bench compare: " << args.status().message()
              << "\nusage: gpumove-bench compare --before=GPUMOVED_OR_DIR "
                 "--after=GPUMOVED_OR_DIR [--compare_rounds=N] [--out=DIR] SUBCOMMAND [flags]\n";
    return 2;
  }
  std::string dir = args->out;
  if (dir.empty()) {
    char tmp[] = "/tmp/gpumove-bench-compare.XXXXXX";
    if (mkdtemp(tmp) == nullptr) return 1;
    dir = tmp;
  } else if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    std::cerr << "cannot make " << dir << "\n";
    return 1;
  }
  std::map<std::string, std::optional<bench_result::BenchRun>> pooled;
  for (int r = 0; r < args->rounds; ++r) {
    for (int turn = 0; turn < 2; ++turn) {
      const bool after = (turn == 0) == (r % 2 == 0);
      const std::string label = after ? "after" : "before";
      const std::string json = absl::StrCat(dir, "/", label, ".", r + 1, ".json");
      std::cout << "== " << args->forwarded[0] << " with " << label << " ("
                << (after ? args->after : args->before) << "), round " << r + 1 << std::endl;
      std::vector<std::string> child = args->forwarded;
      child.push_back("--json=" + json);
      child.push_back("--label=" + label);
      if (absl::Status st = RunChild(after ? args->after : args->before, child); !st.ok()) {
        std::cerr << "gpumove-bench compare: " << st.message() << "\n";
        return 1;
      }
      auto run = ReadRun(json);
      if (!run.ok()) {
        std::cerr << run.status().message() << "\n";
        return 1;
      }
      if (!run->skipped().empty()) {
        std::cout << "SKIPPED: " << run->skipped() << "\n";
        return 0;
      }
      if (!pooled[label].has_value()) {
        pooled[label] = *run;
      } else {
        Pool(*pooled[label], *run);
      }
    }
  }
  for (const char* label : {"before", "after"}) {
    Run run(*pooled[label]);
    run.Finish();
    if (absl::Status st = run.WriteJson(absl::StrCat(dir, "/", label, ".json")); !st.ok()) {
      std::cerr << st.message() << "\n";
      return 1;
    }
  }
  PrintRatios(*pooled["before"], *pooled["after"]);
  std::cout << "pooled runs: " << dir << "/before.json, " << dir << "/after.json\n";
  return 0;
}

}  // namespace gpumove::bench
