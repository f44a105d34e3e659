// Start's steps that make this node's memory: the GPUs served, the pools, the device pools
// shared over CUDA IPC, and the buffer registry (quotas, exportable buffers, scrubbing).
#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "daemon/app/daemon.h"
#include "daemon/app/start_facts.h"
#include "daemon/common/bytes.h"
#include "daemon/common/log.h"
#include "daemon/common/quote.h"

namespace gpumove {

absl::StatusOr<std::vector<int>> SelectGpus(const std::string& spec,
                                            const std::vector<GpuDevice>& devices) {
  std::vector<int> out;
  if (spec == "none") return out;
  if (spec.empty() || spec == "all") {
    for (const GpuDevice& d : devices) out.push_back(d.index);
    return out;
  }
  for (absl::string_view raw : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    const absl::string_view item = absl::StripAsciiWhitespace(raw);
    // An index, or a UUID as nvidia-smi -L prints it, whole or a prefix naming one GPU.
    std::vector<int> found;
    for (const GpuDevice& d : devices) {
      int n = 0;
      if ((absl::SimpleAtoi(item, &n) && n == d.index) ||
          (absl::StartsWith(item, "GPU-") && item.size() > 4 && absl::StartsWith(d.uuid, item))) {
        found.push_back(d.index);
      }
    }
    if (found.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--gpus: no GPU \"", item, "\" on this node (",
                                                     devices.size(), " present)"));
    }
    if (found.size() > 1) {
      return absl::InvalidArgumentError(absl::StrCat("--gpus: \"", item, "\" names ", found.size(),
                                                     " GPUs (GPU ", absl::StrJoin(found, ", GPU "),
                                                     "): give more of the UUID"));
    }
    const int index = found[0];
    if (std::find(out.begin(), out.end(), index) == out.end()) out.push_back(index);
  }
  return out;
}

absl::Status Daemon::FindGpus(const DaemonOptions& options) {
  node_ = options.node.empty() ? HostName() : options.node;
  gpu_ = GpuRuntime::Create();
  LOG(INFO) << "node " << node_ << ": " << gpu_->status();
  auto gpus = SelectGpus(options.gpus, gpu_->devices());
  if (!gpus.ok()) return gpus.status();
  gpus_ = *std::move(gpus);
  return absl::OkStatus();
}

absl::Status Daemon::MakePools(const DaemonOptions& options) {
  auto pools = PoolSet::Create(options.pools, gpus_, gpu_.get(), ucx_memory_.get());
  if (!pools.ok()) return pools.status();
  pools_ = *std::move(pools);
  return absl::OkStatus();  // PoolSet::Create logged each pool (and a pinned one not locked).
}

absl::Status Daemon::ShareDevicePools(const DaemonOptions& options) {
  // CUDA IPC: device pools are offered to other processes on this host (clients mapping
  // exported buffers, peer daemons moving GPU to GPU).
  ipc_ = std::make_unique<IpcTable>(gpu_.get());
  summary_.ipc = "no GPU on this node";
  if (!gpu_->devices().empty()) {
    int exported = 0;
    std::string failed;
    for (const auto& pool : pools_->pools()) {
      if (pool->kind() != MemoryKind::kDevice) continue;
      absl::Status st = ipc_->Export(pool->device(), pool->base(), pool->capacity());
      if (st.ok()) {
        ++exported;
      } else {
        LOG(WARNING) << "GPU " << pool->device() << " pool not shared over CUDA IPC: " << st;
        failed = absl::StrCat(" (", st.message(), ")");
      }
    }
    summary_.ipc = absl::StrCat("GPU to GPU with daemons on this host; ", exported,
                                " device pool(s) shared; client memory import/export", failed);
  }
  return absl::OkStatus();
}

absl::Status Daemon::MakeRegistry(const DaemonOptions& options) {
  registry_ = std::make_unique<BufferRegistry>(pools_.get(), options.default_lease);
  if (!options.serve.quotas.empty()) {
    quotas_ = std::make_unique<Quotas>();
    Quotas* quotas = quotas_.get();
    auto watcher = WatchedFiles::StartParsed(
        options.serve.quotas, options.serve.auth_refresh, "quota file", ParseQuotaFile,
        [quotas](absl::flat_hash_map<std::string, QuotaLimits> limits) {
          quotas->Set(std::move(limits));
        });
    if (!watcher.ok()) return watcher.status();
    quotas_watcher_ = *std::move(watcher);
    registry_->SetQuotas(quotas_.get());
  }
  GpuRuntime* gpu = gpu_.get();
  if (!gpu->devices().empty() && options.exportable_bytes_per_gpu > 0) {
    own_memory_ =
        std::make_unique<OwnDeviceMemory>(gpu, ipc_.get(), options.exportable_bytes_per_gpu);
    OwnDeviceMemory* own = own_memory_.get();
    registry_->SetOwnMemory([own](int device, uint64_t size) -> absl::StatusOr<OwnMemory> {
      auto a = own->Allocate(device, size);
      if (!a.ok()) return a.status();
      return OwnMemory{a->data, std::move(a->keepalive)};
    });
    absl::StrAppend(&summary_.ipc, "; exportable buffers up to ",
                    FormatBytes(options.exportable_bytes_per_gpu), " per GPU");
  }
  const std::string& scrub = options.scrub_memory;
  if (scrub != "auto" && scrub != "always" && scrub != "never") {
    return absl::InvalidArgumentError(
        absl::StrCat("--scrub_memory must be auto, always or never, not ", Quoted(scrub)));
  }
  // Where callers need credentials, pools are shared by tenants: a buffer must not show
  // what another tenant's left behind. (With none, every caller is the same principal.)
  if (scrub == "always" || (scrub == "auto" && ClientsNeedCredentials(options.serve))) {
    registry_->SetScrub([gpu](char* data, MemoryKind kind, int device, uint64_t size) {
      return gpu->Zero(kind == MemoryKind::kDevice ? device : kHostDevice, data, size);
    });
    LOG(INFO) << "pool memory is zeroed before it is handed out (--scrub_memory=" << scrub << ")";
  }
  registry_->StartLeaseReaper(absl::Milliseconds(100));
  hasher_ = [gpu](const Endpoint& e, uint64_t n) {
    return e.kind == MemoryKind::kFile ? HashFileRange(e, n) : HashRange(gpu, e, n);
  };
  return absl::OkStatus();
}

}  // namespace gpumove
