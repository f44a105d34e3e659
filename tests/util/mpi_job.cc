#include "tests/util/mpi_job.h"

#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/util/daemon_process.h"

namespace gpumove {
namespace {

bool Executable(const std::string& path) { return access(path.c_str(), X_OK) == 0; }

}  // namespace

std::string MpiFlavor() {
  const char* f = std::getenv("GPUMOVE_MPI");
  return f != nullptr && *f != '\0' ? f : "openmpi";
}

bool HydraLauncher() { return MpiFlavor() == "mpich" || MpiFlavor() == "mvapich2"; }

std::vector<MpiLaunch> MpiLaunches() {
  if (HydraLauncher()) {
    const std::string f = MpiFlavor();
    return {{f, {}, {}}, {f + "_staged", {}, {"--mpi_force_staging"}}};
  }
  return {
      {"ob1_tcp", {"--mca", "pml", "ob1", "--mca", "btl", "self,tcp"}, {}},
      // UCX's pml refuses machines without an RDMA device unless told any device will do.
      {"ucx",
       {"--mca", "pml", "ucx", "--mca", "pml_ucx_tls", "any", "--mca", "pml_ucx_devices", "any"},
       {}},
      {"ob1_shm_staged", {"--mca", "pml", "ob1", "--mca", "btl", "self,vader"},
       {"--mpi_force_staging"}},
  };
}

std::vector<std::string> MpiLauncher(int ranks) {
  if (MpiFlavor() == "mvapich2") {
    // Its Hydra mpiexec (GPUMOVE_MPIEXEC, tests/run.sh's MVAPICH2 stage). With CPU affinity
    // on it gives MPI_THREAD_SINGLE only; it dlopens librdmacm.so, which only the -dev
    // package provides (the runtime's .so.1 is named instead).
    const char* mpiexec = std::getenv("GPUMOVE_MPIEXEC");
    std::vector<std::string> args = {mpiexec != nullptr ? mpiexec : "mpiexec",
                                     "-disable-auto-cleanup", "-genv", "MV2_ENABLE_AFFINITY",
                                     "0", "-genv", "MV2_USE_THREAD_WARNING", "0"};
    const std::string rdmacm = "/usr/lib/x86_64-linux-gnu/librdmacm.so";
    if (access(rdmacm.c_str(), R_OK) != 0 && access((rdmacm + ".1").c_str(), R_OK) == 0) {
      for (std::string a : {"-genv", "MV2_LIBRDMACM_PATH"}) args.push_back(a);
      args.push_back(rdmacm + ".1");
    }
    for (std::string a : {"-n", ""}) args.push_back(a);
    args.back() = absl::StrCat(ranks);
    return args;
  }
  if (MpiFlavor() == "mpich") {
    // -disable-auto-cleanup: Hydra keeps the other ranks when one dies.
    return {Executable("/usr/bin/mpiexec.mpich") ? "/usr/bin/mpiexec.mpich" : "mpiexec",
            "-disable-auto-cleanup", "-n", absl::StrCat(ranks)};
  }
  // --enable-recovery: mpirun keeps the other ranks when one dies.
  return {Executable("/usr/bin/mpirun.openmpi") ? "/usr/bin/mpirun.openmpi" : "mpirun",
          "--allow-run-as-root", "--oversubscribe", "--enable-recovery", "-np",
          absl::StrCat(ranks)};
}

absl::StatusOr<std::unique_ptr<MpiJob>> MpiJob::Start(int ranks, const MpiLaunch& launch,
                                                      std::vector<std::string> flags) {
  auto job = std::unique_ptr<MpiJob>(new MpiJob());
  char tmpl[] = "/tmp/gpumove-mpi-XXXXXX";
  job->dir_ = mkdtemp(tmpl);
  std::vector<std::string> args = MpiLauncher(ranks);
  args.insert(args.end(), launch.mpi_args.begin(), launch.mpi_args.end());
  args.push_back(FindBuiltBinary("daemon/gpumoved", "GPUMOVED"));
  for (std::string f : {"--listen=127.0.0.1:0", "--host_pool_size=400MiB",
                        "--pinned_pool_size=64MiB", "--heartbeat=200ms", "--peer_timeout=1500ms",
                        "--mpi_chunk=1MiB"}) {
    args.push_back(f);
  }
  args.push_back("--port_file=" + job->dir_ + "/port.%r");
  args.insert(args.end(), launch.daemon_flags.begin(), launch.daemon_flags.end());
  args.insert(args.end(), flags.begin(), flags.end());
  for (std::string& f : ExtraDaemonFlags()) args.push_back(std::move(f));
  job->log_ = job->dir_ + "/job.log";
  const pid_t parent = getpid();
  job->pid_ = fork();
  if (job->pid_ < 0) return absl::InternalError("fork failed");
  if (job->pid_ == 0) {
    setpgid(0, 0);
    // A test that dies (a crash, a timeout) takes mpirun (it then stops its ranks) with it.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(125);
    if (freopen(job->log_.c_str(), "w", stdout) == nullptr) _exit(126);
    dup2(fileno(stdout), fileno(stderr));
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (int r = 0; r < ranks; ++r) {
    const std::string file = absl::StrCat(job->dir_, "/port.", r);
    std::string address;
    while (true) {
      std::ifstream in(file);
      std::getline(in, address);
      if (!address.empty()) break;
      if (absl::Now() > deadline || waitpid(job->pid_, nullptr, WNOHANG) != 0) {
        return absl::UnavailableError(
            absl::StrCat("rank ", r, " did not start; job log:\n", job->Log()));
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    auto client = Client::Connect(address);
    if (!client.ok()) return client.status();
    job->addresses_.push_back(address);
    job->clients_.push_back(*std::move(client));
  }
  return job;
}

MpiJob::~MpiJob() {
  kill(pid_, SIGTERM);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (waitpid(pid_, nullptr, WNOHANG) == 0) {
    if (absl::Now() > deadline) {
      kill(-pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  kill(-pid_, SIGKILL);  // Anything left in the group.
  // Port files and the log; GPUMOVE_KEEP_LOGS=1 keeps them (the ranks' --v logs).
  if (const char* keep = std::getenv("GPUMOVE_KEEP_LOGS"); keep == nullptr || *keep != '1') {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  } else {
    std::cerr << "MPI job log kept: " << log_ << "\n";
  }
}

std::string MpiJob::Log() const { return ReadFile(log_); }

pid_t MpiJob::RankPid(int rank) const {
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return -1;
  pid_t found = -1;
  while (dirent* e = readdir(proc)) {
    const pid_t pid = atoi(e->d_name);
    if (pid <= 0) continue;
    const std::string cmdline = ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
    const std::string argv0 = cmdline.substr(0, cmdline.find('\0'));
    if (!absl::EndsWith(argv0, "gpumoved") || !absl::StrContains(cmdline, dir_ + "/port.%r")) {
      continue;
    }
    const std::string environ = ReadFile(absl::StrCat("/proc/", pid, "/environ"));
    for (const char* var : {"OMPI_COMM_WORLD_RANK=", "PMI_RANK="}) {
      if (absl::StrContains(environ, absl::StrCat(std::string(1, '\0'), var, rank,
                                                  std::string(1, '\0')))) {
        found = pid;
      }
    }
  }
  closedir(proc);
  return found;
}

}  // namespace gpumove
