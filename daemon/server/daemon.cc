#include "daemon/server/daemon.h"

#include <grpcpp/ext/channelz_service_plugin.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "daemon/common/log.h"

namespace gpumove {
namespace {

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << contents << "\n";
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<int>> SelectGpus(const std::string& spec,
                                            const std::vector<GpuDevice>& devices) {
  std::vector<int> out;
  if (spec == "none") return out;
  if (spec.empty() || spec == "all") {
    for (const GpuDevice& d : devices) out.push_back(d.index);
    return out;
  }
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    int index = -1;
    for (const GpuDevice& d : devices) {
      int n = 0;
      if ((absl::SimpleAtoi(item, &n) && n == d.index) ||
          (absl::StartsWith(item, "GPU-") && absl::StartsWith(d.uuid, item))) {
        index = d.index;
      }
    }
    if (index < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--gpus: no GPU \"", item, "\" on this node (", devices.size(), " present)"));
    }
    if (std::find(out.begin(), out.end(), index) == out.end()) out.push_back(index);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(DaemonOptions options) {
  std::unique_ptr<Daemon> d(new Daemon());
  d->node_ = options.node.empty() ? HostName() : options.node;
  d->gpu_ = GpuRuntime::Create();
  LOG(INFO) << "node " << d->node_ << ": " << d->gpu_->status();
  auto gpus = SelectGpus(options.gpus, d->gpu_->devices());
  if (!gpus.ok()) return gpus.status();
  auto pools = PoolSet::Create(options.pools, *gpus, d->gpu_.get());
  if (!pools.ok()) return pools.status();
  d->pools_ = *std::move(pools);
  for (const auto& pool : d->pools_->pools()) {
    const PoolStats s = pool->Stats();
    LOG(INFO) << "pool " << MemoryKindName(s.kind)
              << (s.device >= 0 ? absl::StrCat(" GPU ", s.device) : "") << ": " << s.capacity
              << " bytes" << (s.kind == MemoryKind::kPinnedHost && !s.locked ? " (not locked)" : "");
  }
  d->registry_ = std::make_unique<BufferRegistry>(d->pools_.get(), options.default_lease);
  d->registry_->StartLeaseReaper(absl::Milliseconds(100));
  d->local_engine_ = std::make_unique<LocalEngine>(d->gpu_.get());
  std::vector<Engine*> engines = {d->local_engine_.get()};
  SchedulerOptions sched;
  sched.node = d->node_;
  sched.workers = options.copy_threads;
  sched.max_active = options.max_active;
  sched.rate_limit = options.rate_limit;
  sched.inline_max_bytes = options.inline_max_bytes;
  GpuRuntime* gpu = d->gpu_.get();
  d->scheduler_ = std::make_unique<TransferScheduler>(
      sched, d->registry_.get(), engines,
      [gpu](const Endpoint& e, uint64_t n) { return HashRange(gpu, e, n); });
  d->buffer_service_ = std::make_unique<BufferServiceImpl>(d->registry_.get(), gpu, d->node_);
  d->transfer_service_ = std::make_unique<TransferServiceImpl>(d->scheduler_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::channelz::experimental::InitChannelzService();
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.SetMaxSendMessageSize(64 << 20);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  std::vector<std::unique_ptr<int>> ports;
  for (const std::string& address : options.listen) {
    ports.push_back(std::make_unique<int>(0));
    builder.AddListeningPort(address, grpc::InsecureServerCredentials(), ports.back().get());
  }
  NodeFacts facts{d->node_, HostName(), {}, absl::Now(), gpu, d->pools_.get(),
                  d->scheduler_.get(), engines};
  // The bound addresses are known only after BuildAndStart; the node service gets them then.
  builder.RegisterService(d->buffer_service_.get());
  builder.RegisterService(d->transfer_service_.get());
  d->node_service_ = std::make_unique<NodeServiceImpl>(facts);
  builder.RegisterService(d->node_service_.get());
  d->server_ = builder.BuildAndStart();
  if (d->server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ",
                                               absl::StrJoin(options.listen, ", ")));
  }
  for (size_t i = 0; i < options.listen.size(); ++i) {
    const std::string& address = options.listen[i];
    if (absl::StartsWith(address, "unix:")) {
      d->addresses_.push_back(address);
      continue;
    }
    if (*ports[i] == 0) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", address));
    }
    const size_t colon = address.rfind(':');
    d->addresses_.push_back(absl::StrCat(address.substr(0, colon), ":", *ports[i]));
  }
  facts.listen = d->addresses_;
  d->node_service_->UpdateFacts(facts);
  d->server_->GetHealthCheckService()->SetServingStatus(true);
  LOG(INFO) << "gpumoved " << kVersion << " serving node " << d->node_ << " on "
            << absl::StrJoin(d->addresses_, ", ");
  if (!options.port_file.empty()) {
    if (auto st = WriteFileAtomically(options.port_file, d->addresses_.front()); !st.ok()) {
      return st;
    }
  }
  return d;
}

Daemon::~Daemon() {
  if (server_ != nullptr) {
    scheduler_->CancelAll();
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
  }
}

void Daemon::Shutdown(absl::Duration grace) {
  LOG(INFO) << "draining: refusing new transfers; " << scheduler_->active()
            << " queued or running get " << absl::FormatDuration(grace) << " to finish";
  server_->GetHealthCheckService()->SetServingStatus(false);
  scheduler_->StopAccepting();
  if (!scheduler_->Drain(absl::Now() + grace)) {
    LOG(WARNING) << "drain grace ran out; cancelling " << scheduler_->active() << " transfer(s)";
    scheduler_->CancelAll();
    scheduler_->Drain(absl::Now() + absl::Seconds(10));
  }
  // Let Wait/Watch callers see the final states before their streams are cut.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  LOG(INFO) << "stopped";
}

void Daemon::CancelAll() { scheduler_->CancelAll(); }

void Daemon::Wait() { server_->Wait(); }

}  // namespace gpumove
