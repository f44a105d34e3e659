// `gpumove-bench python`: the Python client (client/python) moving --py_kind memory through
// the daemon, one move at a time (Submit and wait), sizes --py_min_size ... --py_max_size
// by 4, against, in the same run and in turns:
//   gpumove c++        the same moves through the C++ client (this process)
//   numpy copy         np.copyto of the same size in the Python process
//   grpc echo python   a grpcio unary call carrying the size each way to a bare C++ echo
//                      server (up to 1 MiB): what any grpcio round trip costs
// The Python side is python_driver.py, run by $GPUMOVE_PYTHON or /usr/bin/python3 with
// the client importable from --python_path (default: the client's sources with stubs
// generated here by client/python/gen_stubs.py). SKIPPED where python3 lacks grpcio or
// numpy, or the stubs cannot be generated (no protoc / grpc_python_plugin).
#include <stdlib.h>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/bench/tool/baselines.h"
#include "client/bench/tool/bench.h"
#include "daemon/common/bytes.h"

ABSL_FLAG(gpumove::ByteSize, py_min_size, gpumove::ByteSize{4096}, "python: smallest move.");
ABSL_FLAG(gpumove::ByteSize, py_max_size, gpumove::ByteSize{64ull << 20}, "python: largest move.");
ABSL_FLAG(std::string, py_kind, "host", "python: host | pinned | device (GPU 0) memory.");
ABSL_FLAG(std::string, python_path, "",
          "python: a folder from which `import gpumove` works (e.g. .gpu/python); empty: "
          "the client's sources with stubs generated into a folder of this run.");

namespace gpumove::bench {
namespace {

std::string Quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// A folder from which the Python client imports (see --python_path), or why there is none.
absl::StatusOr<std::string> PythonPath(const std::string& python, std::string* why) {
  if (std::string p = absl::GetFlag(FLAGS_python_path); !p.empty()) return p;
  const std::string gen = FindBuiltBinary("client/python/gen_stubs.py", "GPUMOVE_GEN_STUBS");
  const std::string proto = FindBuiltBinary("proto/gpumove/v1/gpumove.proto", "GPUMOVE_PROTO");
  const std::string client = gen.substr(0, gen.rfind('/'));
  const std::string proto_root =
      proto.substr(0, proto.size() - strlen("/gpumove/v1/gpumove.proto"));
  char dir[] = "/tmp/gpumove-bench-py.XXXXXX";
  if (mkdtemp(dir) == nullptr) return absl::InternalError("mkdtemp");
  const std::string out = Capture(absl::StrCat(
      "cp -rL ", Quoted(client + "/gpumove"), " ", Quoted(dir), "/ && rm -rf ", Quoted(dir),
      "/gpumove/v1 && GPUMOVE_PROTO_DIR=", Quoted(proto_root), " ", Quoted(python), " ",
      Quoted(gen), " ", Quoted(dir), " >/dev/null 2>&1 && echo ok"));
  if (out.find("ok") == std::string::npos) {
    *why =
        "the Python client's stubs cannot be generated here (protoc and grpc_python_plugin: "
        "Debian's protobuf-compiler, protobuf-compiler-grpc), or its sources are missing";
  }
  return std::string(dir);
}

// One run of python_driver.py: its samples added to `run`; "" or why it skipped.
absl::StatusOr<std::string> PythonRound(Run& run, const std::string& command, int round) {
  const std::string out = Capture(absl::StrCat(command, " --round=", round, " 2>&1; echo rc=$?"));
  std::string skipped, failure;
  int lines = 0;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    if (absl::StartsWith(line, "SKIPPED: ")) skipped = std::string(line.substr(9));
    std::vector<std::string> f = absl::StrSplit(line, '\t');
    uint64_t size = 0;
    double v = 0;
    if (f.size() == 3 && absl::SimpleAtoi(f[1], &size) && absl::SimpleAtod(f[2], &v)) {
      run.Add(f[0], size, 1, v);
      ++lines;
    } else if (!absl::StartsWith(line, "rc=") && failure.size() < 2000) {
      absl::StrAppend(&failure, line, "\n");
    }
  }
  if (!skipped.empty()) return skipped;
  if (out.find("rc=0") == std::string::npos || lines == 0) {
    return absl::InternalError(absl::StrCat("python_driver.py failed:\n", failure));
  }
  return std::string();
}

absl::Status RunPython(const Context& ctx, Run& run) {
  const uint64_t min_size = absl::GetFlag(FLAGS_py_min_size).bytes;
  const uint64_t max_size = absl::GetFlag(FLAGS_py_max_size).bytes;
  const std::string kind = absl::GetFlag(FLAGS_py_kind);
  if (min_size == 0 || min_size > max_size || max_size > (4ull << 30)) {
    return absl::InvalidArgumentError("--py_min_size must be > 0, at most --py_max_size (4 GiB)");
  }
  if (kind != "host" && kind != "pinned" && kind != "device") {
    return absl::InvalidArgumentError("--py_kind must be host, pinned or device");
  }
  run.SetFlag("py_min_size", FormatBytes(min_size));
  run.SetFlag("py_max_size", FormatBytes(max_size));
  run.SetFlag("py_kind", kind);
  const std::string python = PythonInterpreter();
  std::string why;
  auto path = PythonPath(python, &why);
  if (!path.ok()) return path.status();
  struct Remove {  // The folder generated here, when it was.
    std::string dir;
    ~Remove() {
      if (!dir.empty()) Capture(absl::StrCat("rm -rf ", Quoted(dir)));
    }
  } remove{absl::GetFlag(FLAGS_python_path).empty() ? *path : ""};
  if (!why.empty()) return run.Skip(why), absl::OkStatus();
  run.SetFlag("python", python);
  auto echo = EchoChild::Start();  // Before this process has any gRPC state.
  if (!echo.ok()) return echo.status();
  const uint64_t room = 2 * max_size + (64 << 20);
  std::vector<std::unique_ptr<DaemonProcess>> own;
  std::vector<std::string> flags = {"--node=bench", absl::StrCat("--host_pool_size=", 2 * room)};
  if (kind == "pinned") flags.push_back(absl::StrCat("--pinned_pool_size=", 2 * room));
  if (kind == "device") flags.push_back(absl::StrCat("--device_pool_size=", 2 * room));
  auto d = ctx.Connect(flags, own, run);
  if (!d.ok()) return d.status();
  Client* client = d->client.get();
  if (kind == "device" && !NoGpuReason(d->info).empty()) {
    return run.Skip(absl::StrCat("--py_kind=device: ", NoGpuReason(d->info))), absl::OkStatus();
  }
  const v1::MemoryKind k = kind == "device"   ? v1::DEVICE
                           : kind == "pinned" ? v1::PINNED_HOST
                                              : v1::HOST;
  auto src = client->Allocate(max_size, k);
  auto dst = client->Allocate(max_size, k);
  if (!src.ok() || !dst.ok()) return src.ok() ? dst.status() : src.status();
  std::vector<uint64_t> sizes;
  for (uint64_t s = min_size; s <= max_size; s *= 4) {
    sizes.push_back(s);
    if (s > max_size / 4) break;
  }
  const std::string driver =
      FindBuiltBinary("client/bench/tool/python_driver.py", "GPUMOVE_BENCH_PYTHON_DRIVER");
  const std::string command = absl::StrCat(
      "PYTHONPATH=", Quoted(*path), " timeout 600 ", Quoted(python), " ", Quoted(driver),
      " --addr=", Quoted(d->address), " --echo=", Quoted((*echo)->address()),
      " --sizes=", absl::StrJoin(sizes, ","), " --seconds=", ctx.seconds, " --kind=", kind);
  run.AddSeries("gpumove python", false, "GB/s", true);
  run.AddSeries("gpumove c++", true, "GB/s", true);
  run.AddSeries("numpy copy", true, "GB/s", true);
  run.AddSeries("grpc echo python", true, "GB/s", true);
  for (int r = 0; r < ctx.rounds; ++r) {
    auto cpp = [&]() -> absl::Status {
      for (uint64_t size : sizes) {
        auto t =
            TimeMoves(*client, Ref(src->id(), 0, size), Ref(dst->id()), MoveOptions{}, ctx.seconds);
        if (!t.ok()) return t.status();
        run.Add("gpumove c++", size, 1, size / t->wall / 1e9);
      }
      return absl::OkStatus();
    };
    if (r % 2 == 1) {
      if (absl::Status st = cpp(); !st.ok()) return st;
    }
    auto skipped = PythonRound(run, command, r);
    if (!skipped.ok()) return skipped.status();
    if (!skipped->empty()) return run.Skip(*skipped), absl::OkStatus();
    if (r % 2 == 0) {
      if (absl::Status st = cpp(); !st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

}  // namespace

Subcommand PythonSubcommand() {
  return {"python",
          "moves through the Python client against the C++ client, a numpy copy and a "
          "grpcio echo",
          RunPython};
}

}  // namespace gpumove::bench
