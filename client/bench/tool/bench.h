// gpumove-bench's parts: a subcommand fills a Run with its series (gpumove and the
// baselines measured beside it) and one sample per point per round; the Run prints the
// table (medians, spread, gpumove's ratio to each baseline) and writes the JSON.
#ifndef GPUMOVE_CLIENT_BENCH_TOOL_BENCH_H_
#define GPUMOVE_CLIENT_BENCH_TOOL_BENCH_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/bench/shuffled_blocks.h"
#include "client/bench/tool/result.pb.h"
#include "client/gpumove_client.h"
#include "tests/util/daemon_process.h"
#include "tests/util/mpi_job.h"

namespace gpumove::bench {

class Run {
 public:
  Run(std::string subcommand, std::string title);
  // A run read back (compare's pooled runs): Finish recomputes its medians.
  explicit Run(bench_result::BenchRun run);

  // A series; the first that is not a baseline is gpumove's, the others' ratio is to it.
  // `compared_to`: the one baseline its ratio is to (empty: each baseline).
  void AddSeries(const std::string& name, bool baseline, const std::string& unit,
                 bool higher_is_better, const std::string& compared_to = "");
  // A series shown beside the others without a ratio (e.g. one stage of a pipeline).
  void AddContext(const std::string& name, const std::string& unit, bool higher_is_better);
  // The subcommand cannot measure here (no GPU, no CUDA-aware UCX, no numpy): why. The
  // tool prints "SKIPPED: reason", writes the run without points and exits 0.
  void Skip(const std::string& reason) { run_.set_skipped(reason); }
  bool skipped() const { return !run_.skipped().empty(); }
  void SetLabel(const std::string& label) { run_.set_label(label); }
  // One round's sample of `series` at (size, concurrency).
  void Add(const std::string& series, uint64_t size, uint32_t concurrency, double value);
  void SetFlag(const std::string& name, const std::string& value);
  void SetDaemon(const gpumove::v1::NodeInfo& info);

  // Medians and spreads computed; the table printed to stdout.
  const bench_result::BenchRun& Finish();
  // Writes the run as JSON (proto3 JSON of BenchRun).
  absl::Status WriteJson(const std::string& path) const;

 private:
  bench_result::BenchRun run_;
  // (series, size, concurrency) -> point index.
  std::map<std::tuple<std::string, uint64_t, uint32_t>, int> index_;
};

// What every subcommand gets: its daemon(s) (an existing one at --addr, or started here),
// the rounds to take in turns, and the run to fill.
struct Context {
  int rounds = 3;
  double seconds = 0.5;  // Measuring time per point and series, per round.
  std::string addr;      // An existing daemon; empty: the subcommand starts its own.
  std::vector<std::string> daemon_flags;  // More flags for the daemons started here.
  // Starts a daemon with `flags` (plus the tool's own), unless --addr names one: its
  // address then. `own` keeps a started one alive.
  absl::StatusOr<std::string> Daemon(std::vector<std::string> flags,
                                     std::vector<std::unique_ptr<DaemonProcess>>& own) const;
  // Daemon(), then a client connected to it and its info, set in `run` (SetDaemon).
  struct Connected {
    std::string address;
    std::unique_ptr<Client> client;
    v1::NodeInfo info;
  };
  absl::StatusOr<Connected> Connect(std::vector<std::string> flags,
                                    std::vector<std::unique_ptr<DaemonProcess>>& own,
                                    Run& run) const;
};

// The gRPC echo server (client/bench/echo_server.h), a child process stopped when this
// goes. It forks: start it before this process has any gRPC state.
class EchoChild {
 public:
  static absl::StatusOr<std::unique_ptr<EchoChild>> Start(bool callback = false);
  ~EchoChild();
  const std::string& address() const { return address_; }

 private:
  EchoChild(pid_t pid, std::string address) : pid_(pid), address_(std::move(address)) {}
  pid_t pid_;
  std::string address_;
};

struct Subcommand {
  const char* name;
  const char* summary;
  // Runs the sweep; flags were parsed already.
  std::function<absl::Status(const Context&, Run&)> run;
};

// A rank of an MPI job that this tool starts of itself (`gpumove-bench NAME FLAGS...` under
// the MPI launcher): not listed as a subcommand; it prints its figures for the tool that
// started the job and returns the exit status.
struct RankChild {
  const char* name;
  std::function<int()> run;
};

// The launch named `name` (tests/util/mpi_job's MpiLaunches, or "default": no launcher
// options).
absl::StatusOr<MpiLaunch> LaunchNamed(const std::string& name);
// The shell command that runs this binary as the rank child `child` in a two-rank job of
// `launch`, with `flags`.
absl::StatusOr<std::string> RankJobCommand(const MpiLaunch& launch, const std::string& child,
                                           const std::vector<std::string>& flags);

// The shapes of --vec_shapes (COUNTxBLOCK each; vectored.cc), or why they are not.
absl::StatusOr<std::vector<Shape>> VecShapes();

// Seconds per call of `op`, median over as many calls as fit in `seconds` (at least 3).
double MedianSeconds(const std::function<void()>& op, double seconds);

struct Timing {
  double wall = 0, engine = 0;  // Seconds: Submit to answer; the transfer's own start -> end.
};
// Medians of moves from `src` to `dst` with `o` for `seconds` (at least 3, after one to
// warm, at most 1000); an error if one fails.
absl::StatusOr<Timing> TimeMoves(Client& c, const v1::BufferRef& src, const v1::BufferRef& dst,
                                 const MoveOptions& o, double seconds);

// The Python that runs plot.py and the python subcommand: $GPUMOVE_PYTHON, else Debian's
// /usr/bin/python3 (with Debian's matplotlib, grpcio, numpy), else python3 on PATH.
std::string PythonInterpreter();

// Waits up to 20 s for the node `c` talks to to see `peers` peers up.
bool AwaitPeers(Client& c, size_t peers = 1);

// The daemon's UCX path reason ("" when it has no UCX path).
std::string UcxReason(const v1::NodeInfo& info);

// Why a GPU subcommand cannot run against `info`, or "" when it can: no GPU there.
std::string NoGpuReason(const v1::NodeInfo& info);
// Whether a daemon (a small one started and stopped here, or --addr's) has a GPU: "" when
// it does, else why not (`run` then has the daemon's info).
absl::StatusOr<std::string> ProbeGpus(const Context& ctx, Run& run);

// `gpumove-bench compare ...` (compare.cc): its arguments after "compare"; exit status.
int Compare(const std::vector<std::string>& args);

// The subcommands (each in its own file).
Subcommand LocalSubcommand();
Subcommand SmallSubcommand();
Subcommand NodeSubcommand();
Subcommand VectoredSubcommand();
Subcommand DirectSubcommand();
Subcommand StagedSubcommand();
Subcommand PythonSubcommand();
Subcommand GpuLocalSubcommand();
Subcommand MpiSubcommand();
Subcommand MpiDatatypeSubcommand();
Subcommand TlsSubcommand();
Subcommand QosSubcommand();
Subcommand StorageSubcommand();
RankChild MpiRawRank();
RankChild MpiDatatypeRank();

}  // namespace gpumove::bench

#endif  // GPUMOVE_CLIENT_BENCH_TOOL_BENCH_H_
