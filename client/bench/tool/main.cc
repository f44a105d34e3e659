// gpumove-bench: the one benchmark tool. Each subcommand sweeps sizes or concurrency with
// its baseline measured beside it in the same run (rounds in turns), prints a table of
// medians, spread and ratios, and with --json writes the run in one schema for every
// subcommand (result.proto); `plot` draws runs (plot.py, matplotlib).
//
//   gpumove-bench local --max_size=1MiB --json=out.json
//   gpumove-bench small --max_clients=8
//   gpumove-bench plot out.json [more.json ...] -o DIR
#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "client/bench/tool/bench.h"

ABSL_FLAG(int, rounds, 3, "Rounds per point, gpumove and its baselines in turns.");
ABSL_FLAG(double, seconds, 0.5, "Seconds each series is measured per point and round.");
ABSL_FLAG(std::string, json, "", "Write the run to this file (the schema of result.proto).");
ABSL_FLAG(std::string, addr, "",
          "An existing daemon to measure (host:port or unix:PATH); empty: start one "
          "($GPUMOVED or the gpumoved built beside this tool).");

ABSL_FLAG(std::string, label, "",
          "A label for the run (compare sets before or after), printed and kept in the JSON.");
ABSL_FLAG(std::vector<std::string>, daemon_flags, {},
          "More gpumoved flags for the daemons this tool starts, comma-separated (later "
          "flags win).");

namespace gpumove::bench {
namespace {

std::vector<Subcommand> Subcommands() {
  return {LocalSubcommand(),  SmallSubcommand(),       NodeSubcommand(),     VectoredSubcommand(),
          DirectSubcommand(), StagedSubcommand(),      GpuLocalSubcommand(), PythonSubcommand(),
          MpiSubcommand(),    MpiDatatypeSubcommand(), TlsSubcommand(),      QosSubcommand(),
          StorageSubcommand()};
}

std::string Usage() {
  std::string u =
      "usage: gpumove-bench SUBCOMMAND [--rounds=N] [--seconds=S] [--json=FILE] [--addr=A] "
      "[its flags]\n       gpumove-bench plot FILE.json... -o DIR\n       gpumove-bench compare "
      "--before=GPUMOVED_OR_DIR --after=GPUMOVED_OR_DIR "
      "[--compare_rounds=N] [--out=DIR] SUBCOMMAND [its flags]\n\nsubcommands:\n";
  for (const Subcommand& s : Subcommands())
    absl::StrAppend(&u, "  ", s.name, "\t", s.summary, "\n");
  absl::StrAppend(&u,
                  "  plot\tPNG plots of bandwidth or rate against size or concurrency, "
                  "runs overlaid\n");
  return u;
}

// Runs plot.py (found beside this binary's runfiles, or $GPUMOVE_BENCH_PLOT) with `args`,
// by $GPUMOVE_PYTHON or Debian's python3.
int Plot(const std::vector<std::string>& args) {
  const std::string script = FindBuiltBinary("client/bench/tool/plot.py", "GPUMOVE_BENCH_PLOT");
  // Debian's python3 has Debian's matplotlib; another python3 first on PATH may not.
  const std::string python = PythonInterpreter();
  std::vector<std::string> argv = {python, script};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> raw;
  for (std::string& a : argv) raw.push_back(a.data());
  raw.push_back(nullptr);
  execvp(raw[0], raw.data());
  std::cerr << "gpumove-bench plot: cannot run " << python << "\n";
  return 1;
}

int Main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "plot") {
    return Plot(std::vector<std::string>(argv + 2, argv + argc));
  }
  if (argc >= 2 && std::string(argv[1]) == "compare") {
    return Compare(std::vector<std::string>(argv + 2, argv + argc));
  }
  absl::SetProgramUsageMessage(Usage());
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() != 2) {
    std::cerr << Usage();
    return 2;
  }
  const std::string name = positional[1];
  for (const RankChild& child : {MpiRawRank(), MpiDatatypeRank()}) {
    if (name == child.name) return child.run();
  }
  for (const Subcommand& s : Subcommands()) {
    if (name != s.name) continue;
    Context ctx;
    ctx.rounds = absl::GetFlag(FLAGS_rounds);
    ctx.seconds = absl::GetFlag(FLAGS_seconds);
    ctx.addr = absl::GetFlag(FLAGS_addr);
    ctx.daemon_flags = absl::GetFlag(FLAGS_daemon_flags);
    if (ctx.rounds < 1 || ctx.rounds > 1000 || !(ctx.seconds > 0) || ctx.seconds > 600) {
      std::cerr << "--rounds must be 1 to 1000 and --seconds above 0 (at most 600)\n";
      return 2;
    }
    Run run(s.name, s.summary);
    run.SetFlag("rounds", absl::StrCat(ctx.rounds));
    run.SetFlag("seconds", absl::StrCat(ctx.seconds));
    run.SetLabel(absl::GetFlag(FLAGS_label));
    if (absl::Status st = s.run(ctx, run); !st.ok()) {
      std::cerr << "gpumove-bench " << s.name << ": " << st << "\n";
      return 1;
    }
    run.Finish();
    if (const std::string json = absl::GetFlag(FLAGS_json); !json.empty()) {
      if (absl::Status st = run.WriteJson(json); !st.ok()) {
        std::cerr << st << "\n";
        return 1;
      }
      std::cout << "written: " << json << "\n";
    }
    return 0;
  }
  std::cerr << "gpumove-bench: no subcommand \"" << name << "\"\n" << Usage();
  return 2;
}

}  // namespace
}  // namespace gpumove::bench

int main(int argc, char** argv) { return gpumove::bench::Main(argc, argv); }
