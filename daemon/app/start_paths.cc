// Start's steps that make the paths: the MPI job joined, UCX and its lanes started, and
// the engines (moving sides) and holders (holding sides) of LOCAL, FILE_IO, CUDA_IPC, UCX and
// MPI.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "daemon/app/daemon.h"
#include "daemon/app/start_facts.h"
#include "daemon/common/log.h"
#include "daemon/common/quote.h"
#include "daemon/common/status_macros.h"
#include "daemon/path/mpi/mpi_calls.h"
#include "daemon/path/ucx/stage_calls.h"
#include "daemon/path/ucx/ucx_rails.h"

namespace gpumove {

// MPI first: as a rank, the job decides our name, address and peers.
absl::Status Daemon::JoinMpiJob(DaemonOptions& options) {
  summary_.mpi = "not an MPI rank (start the daemons with mpirun, or --mpi=on)";
  const std::string& mode = options.mpi.mode;
  if (mode == "on" || (mode == "auto" && MpiTransport::LaunchedByMpi())) {
    MpiOptions mpi_options = options.mpi.transport;
    mpi_options.op_timeout = std::max(absl::Seconds(30), options.cluster.peer_timeout * 4);
    auto mpi = MpiTransport::Start(mpi_options);
    if (!mpi.ok()) {
      if (mode == "on") return mpi.status();
      summary_.mpi = absl::StrCat("MPI did not start: ", mpi.status().message());
      LOG(WARNING) << summary_.mpi;
    } else {
      mpi_ = *std::move(mpi);
      const MpiWorld& w = mpi_->world();
      const std::string rank = absl::StrCat(w.rank);
      options.node = options.node.empty() ? absl::StrCat("rank", rank)
                                          : absl::StrReplaceAll(options.node, {{"%r", rank}});
      options.serve.port_file = absl::StrReplaceAll(options.serve.port_file, {{"%r", rank}});
      if (!options.serve.listen_given) {
        options.serve.listen = {absl::StrCat("127.0.0.1:", 7470 + w.local_rank)};
      }
      summary_.mpi = absl::StrCat(
          "two-sided MPI_Isend/MPI_Irecv, rank ", w.rank, " of ", w.size, " (", w.library,
          "); device memory: ",
          !w.cuda_aware ? "staged through pinned bounce buffers (MPI is not CUDA-aware: "
          : options.mpi.engine.force_staging
              ? "staged through pinned bounce buffers (--mpi_force_staging; MPI is CUDA-aware: "
              : "direct (CUDA-aware MPI: ",
          w.cuda_awareness, ")",
          mpi_options.spin ? "; MPI thread and waiters poll (--mpi_spin)" : "");
      LOG(INFO) << "MPI rank " << w.rank << " of " << w.size << " (" << w.local_rank
                << " on this host): " << w.library << "; " << w.cuda_awareness;
    }
  } else if (mode == "off") {
    summary_.mpi = "disabled (--mpi=off)";
  }
  return absl::OkStatus();
}

std::function<void()> Daemon::UcxThreadSetup() const {
  GpuRuntime* gpu = gpu_.get();
  if (gpu == nullptr || gpus_.empty()) return nullptr;
  const int device = gpus_.front();
  return [gpu, device] {
    if (absl::Status st = gpu->UseOnThisThread(device); !st.ok()) {
      LOG(WARNING) << "UCX's thread has no CUDA context (device memory will be slow): " << st;
    }
  };
}

absl::Status Daemon::StartUcx(const DaemonOptions& options) {
  // UCX before the pools: it allocates the host pools in shared memory, so that daemons on
  // this host move between them with one memcpy.
  summary_.ucx = "disabled (--noucx)";
  if (options.ucx.enabled) {
    UcxOptions ucx_options = options.ucx.transport;
    ucx_options.net_devices = UcxNetDevices(options.ucx.net_devices, options.serve.listen);
    ucx_options.op_timeout = options.cluster.peer_timeout;
    ucx_options.thread_setup = UcxThreadSetup();
    auto ucx = UcxTransport::Create(ucx_options);
    if (!ucx.ok()) {
      summary_.ucx = absl::StrCat("UCX did not start: ", ucx.status().message());
      LOG(WARNING) << summary_.ucx;
    } else {
      ucx_ = *std::move(ucx);
      if (options.ucx.shared_pools) {
        ucx_memory_ = std::make_unique<UcxHostMemory>(ucx_.get());
      }
    }
  }
  return absl::OkStatus();
}

// The UCX lanes besides the first transport (lane 1 first), made after the pools: one a
// rail with --ucx_rails, else --ucx_lanes of them on the first transport's devices.
absl::Status Daemon::StartUcxLanes(const DaemonOptions& options) {
  if (ucx_ == nullptr) return absl::OkStatus();
  auto rails = ParseUcxRails(options.ucx.rails);
  if (!rails.ok()) return rails.status();
  UcxOptions lane_options;
  lane_options.chunk = options.ucx.transport.chunk;
  lane_options.net_devices = UcxNetDevices(options.ucx.net_devices, options.serve.listen);
  lane_options.op_timeout = options.cluster.peer_timeout;
  lane_options.direct = false;
  lane_options.poll_window = options.ucx.transport.poll_window;
  lane_options.thread_setup = UcxThreadSetup();
  const int lanes = rails->empty() ? options.ucx.lanes : static_cast<int>(rails->size()) + 1;
  for (int i = 1; i < lanes; ++i) {
    if (!rails->empty()) {
      lane_options.net_devices = RailNetDevices((*rails)[i - 1]);
      lane_options.net_devices_win = true;
    }
    auto lane = UcxTransport::Create(lane_options);
    if (!lane.ok()) {
      if (!rails->empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "--ucx_rails: the lane of rail ", (*rails)[i - 1], " did not start: ",
            lane.status().message()));
      }
      LOG(WARNING) << "UCX lane " << i << " did not start: " << lane.status();
      break;
    }
    ucx_lanes_.push_back(*std::move(lane));
  }
  ucx_rails_ = *std::move(rails);
  if (!ucx_rails_.empty()) {
    LOG(INFO) << "UCX rails: " << absl::StrJoin(ucx_rails_, ", ")
              << " (lanes 1 to " << ucx_rails_.size()
              << "; the first transport is their spare)";
  }
  return absl::OkStatus();
}

absl::Status Daemon::MakeEngines(const DaemonOptions& options) {
  GpuRuntime* gpu = gpu_.get();
  local_engine_ = std::make_unique<LocalEngine>(gpu);
  engines_ = {local_engine_.get()};
  // FILE_IO: only moves with a FILE buffer at one end reach it (and no other engine).
  auto roots = FileRoots::Create(options.file.roots);
  if (!roots.ok()) return roots.status();
  file_roots_ = *std::move(roots);
  file_engine_ = std::make_unique<FileEngine>(options.file.engine);
  engines_.push_back(file_engine_.get());
  summary_.file = absl::StrCat(
      "host memory <-> files on this node: ", file_engine_->Describe(), "; roots: ",
      file_roots_->empty() ? "none (--file_roots)" : absl::StrJoin(file_roots_->Describe(), ", "),
      file_roots_->empty()          ? ""
      : file_roots_->uses_openat2() ? " (openat2)"
                                    : " (O_NOFOLLOW)");
  LOG(INFO) << "path FILE_IO: " << summary_.file;
  if (!gpu_->devices().empty()) {
    cuda_ipc_engine_ = std::make_unique<CudaIpcEngine>(gpu, ipc_.get(), options.cuda_ipc.fence_min);
    engines_.push_back(cuda_ipc_engine_.get());
  }
  // Each path's holding side, asked for its offer on every hold peers make here.
  cuda_ipc_holder_ = std::make_unique<CudaIpcHolder>(ipc_.get(), gpu, options.cuda_ipc.fences);
  holders_ = {cuda_ipc_holder_.get()};
  if (ucx_ != nullptr) {
    Pool* pinned = pools_->Find(MemoryKind::kPinnedHost, kHostDevice);
    UcxLaneOptions lanes;
    for (const auto& lane : ucx_lanes_) lanes.lanes.push_back(lane.get());
    lanes.min_share = options.ucx.lane_share;
    lanes.rails = !ucx_rails_.empty();
    ucx_engine_ = std::make_unique<UcxEngine>(ucx_.get(), gpu, pinned, remote_ranges_.get(),
                                              options.staging, std::move(lanes));
    const std::string& require = options.ucx.require;
    if (!require.empty() && require != "rdma" && require != "tcp") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--ucx_require=", Quoted(require), ": rdma, tcp, or empty (any transport)"));
    }
    ucx_engine_->set_require(require);
    engines_.push_back(ucx_engine_.get());
    ucx_holder_ = std::make_unique<UcxHolder>(&ucx_hello_->self());
    // This node stages its own device ranges for peers when UCX cannot take them (every
    // range with --ucx_force_staging).
    StageHolderOptions stage;
    stage.device = !ucx_->cuda_aware();
    stage.all = options.ucx.force_staging;
    stage.gpu = gpu;
    stage.pinned = pinned;
    stage.staging = options.staging;
    stage_holder_ = std::make_unique<StageHolder>(&ucx_hello_->self(), stage);
    holders_.push_back(ucx_holder_.get());
    holders_.push_back(stage_holder_.get());
  }
  if (mpi_ != nullptr) {
    mpi_engine_ = std::make_unique<MpiEngine>(mpi_.get(), gpu,
                                              pools_->Find(MemoryKind::kPinnedHost, kHostDevice),
                                              remote_ranges_.get(), options.mpi.engine);
    engines_.push_back(mpi_engine_.get());
    mpi_holder_ = std::make_unique<MpiHolder>(cluster_.get(), mpi_hello_.get(), mpi_engine_.get());
    holders_.push_back(mpi_holder_.get());
  }
  // Tails: CUDA IPC runners' copies, seen land here with or without UCX.
  cuda_ipc_tails_ = std::make_unique<IpcTailReader>(gpu, options.cuda_ipc.fence_quiet);
  notifications_ = std::make_unique<NotificationLog>(options.notification_log);
  holds_ = std::make_unique<HoldTable>(
      registry_.get(), hasher_, cuda_ipc_tails_.get(),
      notifications_.get(), [gpu](const Endpoint& e, const Segments& pieces) {
        return HashPieces(gpu, e, pieces, /*source=*/true);
      });
  // Each path's own peer calls, served by its holder.
  if (stage_holder_ != nullptr) {
    GPUMOVE_RETURN_IF_ERROR(RegisterStageCalls(stage_holder_.get(), holds_.get(), &path_calls_));
  }
  if (mpi_holder_ != nullptr) {
    GPUMOVE_RETURN_IF_ERROR(RegisterMpiCalls(mpi_holder_.get(), holds_.get(), &path_calls_));
  }
  return absl::OkStatus();
}

}  // namespace gpumove
